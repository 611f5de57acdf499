#!/usr/bin/env bash
# The main job on the embedded default: make a tiny random-weight SALA model,
# publish it as a signed manifest on a loopback nginx mirror, then `get` it
# from there, `verify` it offline, `run` it, `quant` it to int8 (AWQ, signed
# with the user's own key in the same step) and run the quantized model. Everything lives in a temp
# directory that is removed at the end (KEEP=1 keeps it).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SALAFW=$PWD/$BUILD/salafw
[ -x "$SALAFW" ] || { echo "demo: build first (make)"; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/salafw-demo.XXXXXX")
NGINX_PID=
SERVE_PID=
cleanup() {
	[ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
	[ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null || true
	[ "${KEEP:-0}" = 1 ] && echo "demo: kept $W" || rm -rf "$W"
}
trap cleanup EXIT
export SALAFW_STATE_DIR=$W/state
export XDG_CONFIG_HOME=$W/config # the user's own signing key lives here (salafw quant makes it)
REPO=salafw/tiny-sala
step() { printf '\n== %s\n' "$*"; }

step "publisher: make a tiny random-weight model"
"$SALAFW" mkmodel --preset tiny --seed 7 -o "$W/publish/model"
REV=$(cat "$W"/publish/model/config.json | sha1sum | cut -c1-40)

step "publisher: key pair, manifest, signature"
"$SALAFW" keygen --pubkey-out "$W/demo.pub" -s "$W/demo.key"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$W/www/manifests/salafw" "$W/www/files"
cp -r "$W/publish/model/." "$W/www/files/"
"$SALAFW" manifest "$W/publish/model" --repo "$REPO" --revision "$REV" \
	--source "http:http://127.0.0.1:$PORT/files/" -o "$W/www/manifests/$REPO.json"
"$SALAFW" sign -s "$W/demo.key" "$W/www/manifests/$REPO.json"

step "mirror: nginx on 127.0.0.1:$PORT"
# nginx workers drop root privileges: the served tree must be world-readable.
chmod 755 "$W"
chmod -R a+rX "$W/www"
mkdir -p "$W/nginx/logs"
cat >"$W/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $W/nginx/nginx.pid;
error_log $W/nginx/logs/error.log;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path $W/nginx/tmp;
	proxy_temp_path $W/nginx/tmp;
	fastcgi_temp_path $W/nginx/tmp;
	uwsgi_temp_path $W/nginx/tmp;
	scgi_temp_path $W/nginx/tmp;
	types { application/octet-stream safetensors; application/json json; }
	server { listen 127.0.0.1:$PORT; root $W/www; }
}
CONF
mkdir -p "$W/nginx/tmp"
# /usr/sbin is not on a non-root user's PATH on Debian
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
"$NGINX" -p "$W/nginx" -c "$W/nginx/nginx.conf" -e "$W/nginx/logs/error.log" &
NGINX_PID=$!
up=0
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/manifests/$REPO.json" >/dev/null && up=1 && break; sleep 0.1; done
if [ $up = 0 ]; then
	echo "demo: the loopback nginx mirror did not start ($W/nginx/logs/error.log):" >&2
	tail -n 5 "$W/nginx/logs/error.log" >&2 2>/dev/null
	exit 5
fi

step "user: salafw get $REPO@$REV"
"$SALAFW" get "$REPO@$REV" -d "$W/model" --endpoint "http://127.0.0.1:$PORT" --pubkey "$W/demo.pub"

step "user: salafw verify (offline, signed manifest kept by get)"
"$SALAFW" verify "$W/model" --pubkey "$W/demo.pub"

step "user: salafw run (bf16 weights, CPU reference engine)"
"$SALAFW" run "$W/model" --device cpu -p "The signed weights" -n 24 --seed 1 --pubkey "$W/demo.pub"

step "user: salafw serve (OpenAI-compatible API on loopback), one completion with curl, SIGTERM"
SPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SALAFW" serve "$W/model" --device cpu --port "$SPORT" --pubkey "$W/demo.pub" &
SERVE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SPORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$SPORT/v1/completions" -H 'Content-Type: application/json' \
	-d '{"model": "model", "prompt": "The signed weights", "max_tokens": 16, "seed": 1}'
echo
kill -TERM "$SERVE_PID"
wait "$SERVE_PID"
SERVE_PID=

step "user: salafw quant (AWQ int8, compressed-tensors pack-quantized), signed in the same step"
# The int8 checkpoint is a new artifact: the publisher's signature covers the
# bf16 files only. quant records its lineage (the verified parent, method,
# parameters) in OUT/.salafw/manifest.json and signs it with the user's own
# key (made on first use, kept apart from the publisher's), so the derived
# model runs verified with no key to pass.
"$SALAFW" quant "$W/model" -o "$W/model-w8" --method awq --group 128 --samples 4 --seq-len 128 \
	--pubkey "$W/demo.pub"

step "user: salafw verify / run the quantized model (trusted as your own derived model)"
"$SALAFW" verify "$W/model-w8" | grep -v '^ok '
"$SALAFW" run "$W/model-w8" --device cpu -p "The signed weights" -n 24 --seed 1
echo
echo "demo: ok"
