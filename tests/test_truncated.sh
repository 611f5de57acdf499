#!/usr/bin/env bash
# test_truncated.sh - a weight file truncated in place while `run` or `serve`
# has it mapped (another program's doing: truncate(1)). The read past the
# new end would raise SIGBUS and kill the process (exit 135); the fault
# guard (core/mapguard.c) turns it into an error naming the file: `run -i`
# ends its chat with exit 5, `serve` answers the request (and every later
# one) with 500 and that message and keeps answering /health. The shard is
# truncated between two turns of `run -i` (its turns come through a fifo)
# and between two requests of `serve`, so the timing is fixed. A SIGBUS
# someone sends is not a fault of a map: it still ends the server.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
# Under SAN=1 the write shim (LD_PRELOAD) comes before the ASan runtime, and a
# SIGBUS must reach the engine's guard and then the default action, not ASan's handler.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:handle_sigbus=0"
T=$(scratch)
S=$SALAFW
wait_for() { for _ in $(seq 400); do "$@" && return 0; sleep 0.05; done; return 1; }
shard=model-00001-of-00002.safetensors

# ---- run -i: the second turn, after the truncation ------------------------------
"$S" mkmodel --preset tiny -o "$T/m" >/dev/null 2>&1 || fail "mkmodel tiny"
mkfifo "$T/in"
"$S" run "$T/m" --no-verify -i -n 4 --greedy --device cpu -t 1 < "$T/in" > "$T/run.out" 2> "$T/run.err" &
pid=$!
PIDS+=("$pid")
exec 3>"$T/in"
echo "hello" >&3
wait_for grep -q "generated" "$T/run.err" || fail "run -i: no first reply ($(head -c 300 "$T/run.err"))"
truncate -s 1000000 "$T/m/$shard"
echo "again" >&3
exec 3>&-
wait "$pid"
rc=$?
[ $rc = 5 ] && pass "run -i: a shard truncated while mapped is exit 5, not SIGBUS" ||
	fail "run -i: exit $rc, want 5 ($(tail -c 300 "$T/run.err"))"
check "run -i: the message names the file" grep -q "'$T/m/$shard' was truncated while mapped" "$T/run.err"

# ---- serve: the request fails, the server stays ---------------------------------
rm -rf "$T/m"
"$S" mkmodel --preset tiny -o "$T/m" >/dev/null 2>&1 || fail "mkmodel tiny"
"$S" serve "$T/m" --no-verify --device cpu -t 1 --port 0 2> "$T/sv.err" &
pid=$!
PIDS+=("$pid")
PORT=
wait_for grep -q "on http://127.0.0.1:[0-9]*/v1" "$T/sv.err" &&
	PORT=$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$T/sv.err")
[ -n "$PORT" ] || fail "serve did not start: $(head -c 300 "$T/sv.err")"
U=http://127.0.0.1:${PORT:-9}
req() { curl -s -m 60 -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d '{"model": "m", "prompt": "hello", "max_tokens": 4, "temperature": 0}' "$U/v1/completions"; }
code=$(req)
[ "$code" = 200 ] && pass "serve: a request before the truncation" || fail "serve: first request $code $(head -c 300 "$T/body")"
truncate -s 1000000 "$T/m/$shard"
code=$(req)
[ "$code" = 500 ] && grep -q "was truncated while mapped" "$T/body" && grep -q "$shard" "$T/body" &&
	pass "serve: the request after it is 500 naming the file" ||
	fail "serve: request after truncation: $code $(head -c 300 "$T/body")"
check "serve: still running" kill -0 "$pid"
check "serve: /health answers" bash -c "curl -sf -m 10 '$U/health' | grep -q ok"
code=$(req)
[ "$code" = 500 ] && grep -q "was truncated while mapped" "$T/body" &&
	pass "serve: a later request fails the same way" || fail "serve: later request: $code $(head -c 300 "$T/body")"
check "serve: the log names the file" grep -q "$shard' was truncated while mapped" "$T/sv.err"
# a SIGBUS sent to the process is no fault of a map: it ends the server as before
kill -BUS "$pid" 2>/dev/null
wait "$pid"
rc=$?
[ $rc = 135 ] && pass "serve: a sent SIGBUS still ends it (exit 135)" || fail "serve: sent SIGBUS: exit $rc"
check_report test_truncated
