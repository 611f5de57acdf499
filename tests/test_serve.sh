#!/usr/bin/env bash
# test_serve.sh - salafw serve end to end on a generated tiny model, signed and
# verified as tests/test_run.sh does: the gate; the real `openai` client
# (tests/serve_client.py: completions and chat, streamed and not, equal to
# `salafw run`; 64 concurrent streams; clients that go away; model ids,
# vLLM's extra fields, logprobs against `salafw score`, penalties, n, tools,
# /tokenize); every error answer with curl; HEAD, CORS and the request log
# with curl; n choices sharing one prefill (/metrics), and prefilling their
# own when the batch has no sequence left to fork into; the prefix cache
# (cached tokens in usage, /metrics and the log, equal to no cache in the
# same calls, the budget); API keys; the queue
# limit; SIGTERM finishing a stream; the README's curl examples.
. tests/lib.sh
S=$(scratch)
VENV=${SALAFW_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/salafw/venv}
PIDS=
stop_all() { for p in $PIDS; do kill "$p" 2>/dev/null; done; }
trap 'stop_all; _scratch_cleanup' EXIT

if ! "$VENV/bin/python3" -c 'import openai' >/dev/null 2>&1; then
	python3 -m venv "$VENV" >/dev/null 2>&1 && "$VENV/bin/pip" install -q --disable-pip-version-check openai >/dev/null 2>&1
fi
"$VENV/bin/python3" -c 'import openai' >/dev/null 2>&1 || { fail "the openai client in $VENV (scripts/setup.sh)"; check_report test_serve.sh; exit 1; }

# a tiny model, signed with a local key and verified (its name is the model id)
export SALAFW_STATE_DIR=$S/state
M=$S/tiny-sala
$SALAFW mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || fail "mkmodel tiny"
cp -r "$M" "$S/unsigned"
mkdir -p "$M/.salafw"
check "keygen" $SALAFW keygen --pubkey-out "$S/k.pub" -s "$S/k.key"
check "manifest" $SALAFW manifest "$M" --repo test/tiny-sala --revision 0123456789abcdef0123456789abcdef01234567 \
	-P "$S/k.pub" -o "$M/.salafw/manifest.json"
check "sign" $SALAFW sign -s "$S/k.key" "$M/.salafw/manifest.json"
check "verify records the state" $SALAFW verify "$M" -P "$S/k.pub"

# the gate and the options: run's messages and exit codes
check_err "serve refuses a directory without a signed manifest" 1 "refusing to run unverified" \
	$SALAFW serve "$S/unsigned" --port 0
check_err "serve with the pinned key only refuses a foreign signature" 3 "refusing" $SALAFW serve "$M" --port 0
check_err "--api-key with --api-key-file" 2 "not both" $SALAFW serve "$M" --api-key a --api-key-file /dev/null
check_err "--max-running 65" 2 "max-running" $SALAFW serve "$M" --max-running 65
check_err "--api-key-file missing" 5 "api-key-file" $SALAFW serve "$M" --pubkey "$S/k.pub" --api-key-file "$S/none"

# start NAME ARGS...: a server on a free port; sets PORT and PID
start() {
	local name=$1
	shift
	$SALAFW serve "$M" --pubkey "$S/k.pub" --port 0 "$@" 2>"$S/$name.log" &
	PID=$!
	PIDS="$PIDS $PID"
	PORT=
	for _ in $(seq 200); do
		PORT=$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$S/$name.log")
		[ -n "$PORT" ] && break
		sleep 0.05
	done
	[ -n "$PORT" ] || fail "server $name did not start: $(head -c 300 "$S/$name.log")"
}
# metric NAME: its value on $U
metric() { curl -s "$U/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

start main --max-context 1024
MAIN_PID=$PID
U=http://127.0.0.1:$PORT
check "health" bash -c "curl -sf $U/health | grep -q ok"
grep -q "serving 'test/tiny-sala' on http://127.0.0.1:$PORT/v1 \[cpu\]" "$S/main.log" && pass "startup line (the manifest's repo id)" ||
	fail "startup line: $(cat "$S/main.log")"

# the openai client
RUN=$(printf '["%s", "run", "%s", "--pubkey", "%s"]' "$SALAFW" "$M" "$S/k.pub")
timeout 300 "$VENV/bin/python3" tests/serve_client.py "$U/v1" test/tiny-sala tiny-sala "$RUN" >"$S/client.out" 2>&1
while read -r w rest; do
	case $w in PASS) pass "openai: $rest" ;; FAIL) fail "openai: $rest" ;; esac
done <"$S/client.out"
grep -q '^PASS' "$S/client.out" || fail "serve_client.py printed nothing: $(tail -c 500 "$S/client.out")"

# errors, with curl: status, and an OpenAI error object naming the field
# err DESCR STATUS PARAM CURL-ARGS...
err() {
	local d=$1 want=$2 param=$3
	shift 3
	local got
	got=$(curl -s -o "$S/body" -w '%{http_code}' "$@")
	if [ "$got" = "$want" ] && python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert isinstance(e["message"], str) and e["message"] and isinstance(e["type"], str)
assert (e["param"] or "") == sys.argv[2], e["param"]' "$S/body" "$param" 2>/dev/null; then
		pass "$d"
	else
		fail "$d (HTTP $got want $want, param $param: $(head -c 300 "$S/body"))"
	fi
}
J=(-H 'Content-Type: application/json')
C=$U/v1/completions
err "malformed JSON: 400" 400 "" "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x",}' "$C"
err "duplicate key: 400" 400 "" "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "prompt": "y"}' "$C"
err "not an object: 400" 400 "" "${J[@]}" -d '[1, 2]' "$C"
err "wrong type: 400 max_tokens" 400 max_tokens "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "max_tokens": "ten"}' "$C"
err "temperature out of range: 400" 400 temperature "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "temperature": 7}' "$C"
err "stop of a number: 400" 400 stop "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "stop": 3}' "$C"
err "unknown model: 404" 404 model "${J[@]}" -d '{"model": "gpt-4", "prompt": "x"}' "$C"
err "no model: 400" 400 model "${J[@]}" -d '{"prompt": "x"}' "$C"
err "logprobs 21: 400" 400 logprobs "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "logprobs": 21}' "$C"
err "n = 9: 400" 400 n "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "n": 9}' "$C"
err "echo true: 400" 400 echo "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "echo": true}' "$C"
err "logit_bias of no token: 400" 400 logit_bias "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "logit_bias": {"x1": 5}}' "$C"
err "logit_bias over 100: 400" 400 logit_bias "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "logit_bias": {"5": 101}}' "$C"
err "min_p 2: 400" 400 min_p "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "min_p": 2}' "$C"
err "repetition_penalty 0: 400" 400 repetition_penalty "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "repetition_penalty": 0}' "$C"
CH=$U/v1/chat/completions
err "chat: top_logprobs without logprobs: 400" 400 top_logprobs "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}' "$CH"
err "chat: reasoning_effort set: 400" 400 reasoning_effort "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high"}' "$CH"
err "chat: an image part: 400" 400 messages "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}' "$CH"
err "chat: user content null: 400" 400 messages "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": null}]}' "$CH"
err "chat: bad tools: 400" 400 tools "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}' "$CH"
err "chat: tool_choice required without tools: 400" 400 tool_choice "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}' "$CH"
err "models/{id} unknown: 404" 404 model "$U/v1/models/gpt-4"
err "tokenize: neither prompt nor messages: 400" 400 prompt "${J[@]}" -d '{"model": "tiny-sala"}' "$U/tokenize"
err "detokenize: an id past the vocabulary: 400" 400 tokens "${J[@]}" -d '{"tokens": [1, 99999999]}' "$U/detokenize"
# unknown fields are ignored (vLLM's habit) and logged once per name
for _ in 1 2; do
	code=$(curl -s -o "$S/body" -w '%{http_code}' "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "max_tokens": 1, "frobnicate": 1, "presence_penalty": 0.5}' "$C")
done
[ "$code" = 200 ] && grep -q '"choices"' "$S/body" && pass "an unknown field is ignored (200)" || fail "unknown field: HTTP $code $(head -c 200 "$S/body")"
[ "$(grep -c "ignoring the request field 'frobnicate'" "$S/main.log")" = 1 ] && pass "the unknown field is logged once" ||
	fail "unknown field log: $(grep -c frobnicate "$S/main.log") lines"
err "token id past the vocabulary: 400" 400 prompt "${J[@]}" -d '{"model": "tiny-sala", "prompt": [1, 99999999]}' "$C"
err "chat: bad role: 400" 400 messages "${J[@]}" -d '{"model": "tiny-sala", "messages": [{"role": "root", "content": "x"}]}' "$U/v1/chat/completions"
err "chat: no messages: 400" 400 messages "${J[@]}" -d '{"model": "tiny-sala"}' "$U/v1/chat/completions"
python3 -c 'import json; print(json.dumps({"model": "tiny-sala", "prompt": "lorem ipsum dolor " * 800}))' >"$S/long.json"
err "prompt longer than the context: 400" 400 prompt "${J[@]}" --data-binary @"$S/long.json" "$C"
head -c $((5 << 20)) /dev/zero | tr '\0' ' ' >"$S/big.json"
err "a 5 MiB body (over what the context can use): 413" 413 "" "${J[@]}" --data-binary @"$S/big.json" "$C"
err "a 5 MiB body without a length (chunked): 413" 413 "" "${J[@]}" -H 'Transfer-Encoding: chunked' \
	--data-binary @"$S/big.json" "$C"
err "unknown path: 404" 404 "" "$U/v1/engines"
err "GET on completions: 405" 405 "" "$C"
code=$(curl -s -o /dev/null -w '%{http_code}' -I "$C")
[ "$code" = 405 ] && pass "HEAD on completions: 405" || fail "HEAD on completions: $code"

# HEAD where GET is: the GET's status and headers, no body
for path in /health /v1/models /v1/models/test/tiny-sala /metrics; do
	hdr=$(curl -s -I "$U$path")
	echo "$hdr" | head -n 1 | grep -q '^HTTP/1.1 200' && [ "$(curl -s -I "$U$path" -o /dev/null -w '%{size_download}')" = 0 ] &&
		pass "HEAD $path: 200, no body" || fail "HEAD $path: $(echo "$hdr" | head -n 1)"
done
# CORS is off: no Access-Control-Allow-Origin for any page; a preflight gets 204 without it
hdr=$(curl -s -D - -o /dev/null -H 'Origin: http://evil.example' "$U/v1/models")
! echo "$hdr" | grep -qi '^Access-Control-Allow-Origin' && pass "CORS off by default: no Allow-Origin" || fail "CORS off: $hdr"
hdr=$(curl -s -D - -o /dev/null -X OPTIONS -H 'Origin: http://evil.example' -H 'Access-Control-Request-Method: POST' "$C")
echo "$hdr" | head -n 1 | grep -q '^HTTP/1.1 204' && ! echo "$hdr" | grep -qi '^Access-Control-Allow' &&
	pass "CORS off: a preflight is answered 204 without allowing" || fail "preflight with CORS off: $hdr"
# one log line per request: id, endpoint, status, tokens, TTFT, duration
id=$(curl -s "${J[@]}" -d '{"model": "tiny-sala", "prompt": "log me", "max_tokens": 3, "ignore_eos": true}' "$C" |
	python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 50); do grep -q "serve: $id " "$S/main.log" && break; sleep 0.05; done
grep -qE "serve: $id POST /v1/completions 200 prompt_tokens=[0-9]+ output_tokens=3 cached_tokens=0 ttft=[0-9.]+s time=[0-9.]+s" "$S/main.log" &&
	[ "$(grep -c "serve: $id " "$S/main.log")" = 1 ] && pass "the request log line" || fail "log line of $id: $(grep "$id" "$S/main.log")"
grep -qE "serve: - GET /v1/models/\{id\} 404 " "$S/main.log" && grep -qE "serve: - OPTIONS /v1/completions 204 " "$S/main.log" &&
	pass "every request has a line, errors and preflights too" || fail "log lines: $(grep 'serve: ' "$S/main.log" | tail -n 5)"
code=$(curl -s -o /dev/null -w '%{http_code}' "${J[@]}" -d '{"model": "tiny-sala", "prompt": "still here", "max_tokens": 2}' "$C")
[ "$code" = 200 ] && pass "the server answers after the bad requests" || fail "after the bad requests: HTTP $code"
# n_once WHAT BODY FORKS PREFILLS: the n = 3 request BODY on $U answers three
# choices 0..2 of one greedy text, FORKS of them forked, its prompt
# prefilled PREFILLS times (salafw_prompt_tokens_prefilled_total)
n_once() {
	local p0 f0 p1 f1
	p0=$(metric salafw_prompt_tokens_prefilled_total) f0=$(metric salafw_choice_forks_total)
	curl -s -m 60 "${J[@]}" -d "$2" "$U/v1/completions" >"$S/n3.json"
	p1=$(metric salafw_prompt_tokens_prefilled_total) f1=$(metric salafw_choice_forks_total)
	if python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
p0, p1, f0, f1, forks, times = map(int, sys.argv[2:])
c = sorted(r["choices"], key=lambda c: c["index"])
assert [x["index"] for x in c] == [0, 1, 2] and len({x["text"] for x in c}) == 1, c
assert p1 - p0 == times * r["usage"]["prompt_tokens"], (p0, p1, r["usage"])
assert f1 - f0 == forks, (f0, f1)' "$S/n3.json" "${p0:--1}" "${p1:--1}" "${f0:--1}" "${f1:--1}" "$3" "$4" 2>"$S/n3.err"; then
		pass "$1"
	else
		fail "$1: $(tail -c 300 "$S/n3.err") $(head -c 300 "$S/n3.json")"
	fi
}
n_once "n = 3: one prefill of the prompt, two forks" \
	'{"model": "tiny-sala", "prompt": "the choices share one prefill", "max_tokens": 6, "n": 3, "temperature": 0}' 2 1
metric 'salafw_requests_total{endpoint="/v1/completions",code="400"}' | grep -qE '^[1-9][0-9]*$' &&
	pass "metrics count the 400s" || fail "metrics count the 400s"
# the engine's time: inside the steps, and its own work around them (positive, and the steps
# more than the rest here: a tiny model's steps on the CPU are far longer than its streaming)
st=$(metric salafw_engine_step_seconds_total) ht=$(metric salafw_engine_host_seconds_total)
python3 -c 'import sys; s, h = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if s > 0 and 0 < h < s else 1)' \
	"${st:-0}" "${ht:-0}" && pass "metrics: engine step ${st} s, host ${ht} s" ||
	fail "engine time metrics: step '${st}' host '${ht}'"
ds=$(metric salafw_engine_decode_steps_total) dr=$(metric salafw_engine_decode_rows_total)
dt=$(metric salafw_engine_decode_seconds_total) sn=$(metric salafw_engine_steps_total)
gt=$(metric salafw_generation_tokens_total)
python3 -c 'import sys; ds, dr, dt, sn, gt, st, ht = map(float, sys.argv[1:]); sys.exit(0 if 0 < ds <= sn and ds <= dr <= 64 * ds and dr <= gt + sn and 0 < dt <= st + ht + 1e-6 else 1)' \
	"${ds:-0}" "${dr:-0}" "${dt:-0}" "${sn:-0}" "${gt:-0}" "${st:-0}" "${ht:-0}" &&
	pass "metrics: $ds decode-only steps of $sn, $dr rows (of $gt tokens), $dt s" ||
	fail "decode metrics: steps $ds/$sn rows $dr/$gt seconds $dt"

# the README's curl examples, as written but for the port
sed -n '/^## Serving/,/^## /p' README.md | awk '/^```sh/{f=1; next} /^```/{f=0} f' |
	sed -n '/^curl/,/[^\\]$/p' >"$S/readme.sh"
n=0
while IFS= read -r line; do
	cmd=$line
	while [ "${cmd%\\}" != "$cmd" ] && IFS= read -r more; do cmd="${cmd%\\}$more"; done
	n=$((n + 1))
	out=$(bash -c "${cmd//127.0.0.1:8080/127.0.0.1:$PORT}" 2>&1)
	if [ $? = 0 ] && echo "$out" | grep -qE '"(choices|data)"|^data: \[DONE\]' && ! echo "$out" | grep -q '"error"'; then
		pass "README example $n"
	else fail "README example $n: $cmd: $(echo "$out" | head -c 300)"; fi
done <"$S/readme.sh"
[ "$n" -ge 4 ] && pass "README has $n curl examples" || fail "README curl examples: found $n"

# API keys, the queue limit, SIGTERM: a second server
printf 'sekrit-key\n' >"$S/key"
start keyed --api-key-file "$S/key" --max-running 1 --max-queue 1 --quiet
U=http://127.0.0.1:$PORT
C=$U/v1/completions
BODY='{"model": "tiny-sala", "prompt": "x", "max_tokens": 2}'
err "no API key: 401" 401 "" "${J[@]}" -d "$BODY" "$C"
err "a wrong API key: 401" 401 "" "${J[@]}" -H 'Authorization: Bearer sekrit-kez' -d "$BODY" "$C"
err "a key prefix: 401" 401 "" "${J[@]}" -H 'Authorization: Bearer sekrit' -d "$BODY" "$C"
err "models without the key: 401" 401 "" "$U/v1/models"
A=(-H 'Authorization: Bearer sekrit-key')
code=$(curl -s -o /dev/null -w '%{http_code}' "${J[@]}" "${A[@]}" -d "$BODY" "$C")
[ "$code" = 200 ] && pass "the right API key: 200" || fail "the right API key: HTTP $code"
check "health needs no key" bash -c "curl -sf $U/health | grep -q ok"
# one running, one queued, the third is refused with Retry-After
LONG='{"model": "tiny-sala", "prompt": "x", "max_tokens": 4000, "stream": true, "ignore_eos": true}'
curl -sN "${J[@]}" "${A[@]}" -d "$LONG" "$C" >/dev/null &
c1=$!
for _ in $(seq 100); do [ "$(metric salafw_running)" = 1 ] && break; sleep 0.05; done
curl -sN "${J[@]}" "${A[@]}" -d "$LONG" "$C" >/dev/null &
c2=$!
for _ in $(seq 100); do [ "$(metric salafw_queue_depth)" = 1 ] && break; sleep 0.05; done
hdr=$(curl -s -D - -o "$S/body" "${J[@]}" "${A[@]}" -d "$BODY" "$C")
echo "$hdr" | grep -q '^HTTP/1.1 429' && echo "$hdr" | grep -qi '^Retry-After: 1' && grep -q '"error"' "$S/body" &&
	pass "queue full: 429 with Retry-After" || fail "queue full: $(echo "$hdr" | head -n 1) $(head -c 200 "$S/body")"
kill $c1 $c2 2>/dev/null
wait $c1 $c2 2>/dev/null
for _ in $(seq 100); do [ "$(metric salafw_running)" = 0 ] && [ "$(metric salafw_queue_depth)" = 0 ] && break; sleep 0.05; done
[ "$(metric salafw_running)" = 0 ] && pass "the killed clients' sequences are freed" || fail "running after the kills: $(metric salafw_running)"
# SIGTERM mid-stream: the stream still ends with [DONE], the server exits 0
curl -sN "${J[@]}" "${A[@]}" -d '{"model": "tiny-sala", "prompt": "x", "max_tokens": 400, "stream": true, "ignore_eos": true}' \
	"$C" >"$S/term.out" &
c3=$!
for _ in $(seq 100); do grep -q '^data: {' "$S/term.out" && break; sleep 0.02; done
kill -TERM "$PID"
sleep 0.2
code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$U/health") # the listener stays open while draining
[ "$code" = 503 ] && kill -0 "$PID" 2>/dev/null && pass "SIGTERM: /health answers 503 while the stream finishes" ||
	fail "SIGTERM: /health while draining: HTTP $code"
wait $c3
wait "$PID"
rc=$?
[ "$rc" = 0 ] && pass "SIGTERM: exit 0" || fail "SIGTERM: exit $rc"
grep -v '^$' "$S/term.out" | tail -n 1 | grep -q '^data: \[DONE\]' && grep -q '"finish_reason":"length"' "$S/term.out" &&
	[ "$(grep -c '^data: {' "$S/term.out")" -ge 2 ] && pass "SIGTERM: the running stream finishes" ||
	fail "SIGTERM: the stream: $(tail -c 300 "$S/term.out")"
grep -q "finishing the accepted requests" "$S/keyed.log" && pass "SIGTERM: says so" || fail "SIGTERM: log $(tail -c 300 "$S/keyed.log")"
! grep -q "serve: .* /v1/completions" "$S/keyed.log" && pass "--quiet: no request lines" || fail "--quiet: $(grep 'serve: ' "$S/keyed.log" | head -n 3)"

# names and CORS: --served-model-name (repeatable) and --allowed-origins
start cors --served-model-name alpha --served-model-name beta/b --allowed-origins 'http://a.example, http://b.example:8000'
U=http://127.0.0.1:$PORT
ids=$(curl -s "$U/v1/models" | python3 -c 'import json, sys; print(",".join(m["id"] for m in json.load(sys.stdin)["data"]))')
[ "$ids" = alpha,beta/b ] && pass "--served-model-name: the ids listed" || fail "--served-model-name: $ids"
code=$(curl -s -o /dev/null -w '%{http_code}' "${J[@]}" -d '{"model": "beta/b", "prompt": "x", "max_tokens": 1}' "$U/v1/completions")
code2=$(curl -s -o /dev/null -w '%{http_code}' "${J[@]}" -d '{"model": "tiny-sala", "prompt": "x", "max_tokens": 1}' "$U/v1/completions")
[ "$code" = 200 ] && [ "$code2" = 404 ] && pass "--served-model-name: those ids only" || fail "names: $code $code2"
hdr=$(curl -s -D - -o /dev/null -H 'Origin: http://b.example:8000' "$U/v1/models")
echo "$hdr" | grep -qi '^Access-Control-Allow-Origin: http://b.example:8000' && echo "$hdr" | grep -qi '^Vary: Origin' &&
	pass "CORS: an allowed origin may read" || fail "CORS allowed: $hdr"
hdr=$(curl -s -D - -o /dev/null -H 'Origin: http://c.example' "$U/v1/models")
! echo "$hdr" | grep -qi '^Access-Control-Allow-Origin' && pass "CORS: another origin may not" || fail "CORS other: $hdr"
hdr=$(curl -s -D - -o /dev/null -X OPTIONS -H 'Origin: http://a.example' -H 'Access-Control-Request-Method: POST' \
	-H 'Access-Control-Request-Headers: authorization, content-type' "$U/v1/chat/completions")
echo "$hdr" | head -n 1 | grep -q '^HTTP/1.1 204' && echo "$hdr" | grep -qi '^Access-Control-Allow-Origin: http://a.example' &&
	echo "$hdr" | grep -qi '^Access-Control-Allow-Methods: .*POST' && echo "$hdr" | grep -qi '^Access-Control-Allow-Headers: .*Authorization' &&
	pass "CORS: the preflight allows POST with Authorization" || fail "preflight: $hdr"
out=$(curl -sN -H 'Origin: http://a.example' "${J[@]}" -D - -d '{"model": "alpha", "prompt": "x", "max_tokens": 2, "stream": true}' "$U/v1/completions")
echo "$out" | grep -qi '^Access-Control-Allow-Origin: http://a.example' && echo "$out" | grep -q '^data: \[DONE\]' &&
	pass "CORS: a stream carries the header" || fail "CORS stream: $(echo "$out" | head -c 300)"
kill -TERM "$PID"
wait "$PID"
! curl -s -m 2 "$U/health" >/dev/null 2>&1 && pass "SIGTERM: no longer listening" || fail "SIGTERM: still listening"

# a batch of 2 sequences: the third choice finds none to fork into, waits and
# prefills the prompt itself (the request is answered all the same)
start nfork --max-running 2 --quiet
U=http://127.0.0.1:$PORT
n_once "n = 3 with 2 sequences: one fork, the third choice prefills its own" \
	'{"model": "tiny-sala", "prompt": "no room to fork", "max_tokens": 6, "n": 3, "temperature": 0, "ignore_eos": true}' 1 2
kill -TERM "$PID"
for _ in $(seq 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
! kill -0 "$PID" 2>/dev/null && pass "that server exits on SIGTERM" || fail "the --max-running 2 server still runs after SIGTERM"

# the prefix cache (runner/prefix.h): prompts of token ids, --prefill-chunk
# 128. A (256 ids: two full calls) is kept after its prefill, and after its
# reply (its 7 tokens fed); B = A + 64 ids forks A's state and prefills
# only its 64: usage and the log say 256 cached, /metrics a hit. C, A's
# prompt and reply (the ids return_tokens_as_token_ids names) and 64 more,
# starts from the state at the reply's end: 263 cached. Against a server without the cache, where B is
# prefilled in the same calls ([0,128), [128,256), [256,320)), B's greedy
# tokens and their log-probabilities are the same to the last digit; a
# budget under one state keeps nothing.
pc_ids() { python3 -c "import random,sys; r=random.Random(int(sys.argv[1])); print(','.join(str(r.randrange(3, 250)) for _ in range(int(sys.argv[2]))))" "$@"; }
PA=$(pc_ids 11 256)
PB="$PA,$(pc_ids 12 64)"
pc_req() { # URL IDS -> the response
	curl -s -H 'Content-Type: application/json' "$1/v1/completions" \
		-d "{\"model\": \"tiny-sala\", \"prompt\": [$2], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 2}"
}
pc_field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
start pcache --prefill-chunk 128
UP=http://127.0.0.1:$PORT PPID_=$PID
grep -q "prefix cache: up to .* GiB of prompt states in 8 entries" "$S/pcache.log" &&
	pass "serve prints the prefix cache's budget at start" || fail "no prefix cache line: $(head -c 300 "$S/pcache.log")"
ra=$(curl -s -H 'Content-Type: application/json' "$UP/v1/completions" \
	-d "{\"model\": \"tiny-sala\", \"prompt\": [$PA], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}")
rb=$(pc_req "$UP" "$PB")
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$ra")" = 0 ] &&
	pass "prefix cache: the first prompt has 0 cached tokens" || fail "prefix cache: A: $ra"
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rb")" = 256 ] &&
	pass "prefix cache: a prompt that extends it has its 256 tokens cached (usage)" || fail "prefix cache: B: $rb"
U=$UP
[ "$(metric salafw_prefix_cache_hits_total)" = 1 ] && [ "$(metric salafw_prefix_cache_cached_tokens_total)" = 256 ] &&
	[ "$(metric salafw_prefix_cache_lookups_total)" = 2 ] && [ "$(metric salafw_prefix_cache_entries)" = 4 ] &&
	[ "$(metric salafw_prompt_tokens_prefilled_total)" = 320 ] &&
	pass "prefix cache: /metrics: 2 lookups, 1 hit of 256 tokens, 4 entries (prompts' and replies' ends), 256 + 64 tokens prefilled" ||
	fail "prefix cache metrics: $(curl -s "$U/metrics" | grep -E 'prefix_cache|prefilled')"
grep -q "prompt_tokens=320 output_tokens=8 cached_tokens=256" "$S/pcache.log" &&
	pass "prefix cache: the request log names the cached tokens" || fail "prefix cache: log: $(grep 'cached_tokens' "$S/pcache.log" | tail -2)"
rn=$(curl -s -H 'Content-Type: application/json' "$UP/v1/completions" \
	-d "{\"model\": \"tiny-sala\", \"prompt\": [$PB], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"n\": 2}")
tb=$(pc_field 'd["choices"][0]["text"]' <<<"$rb")
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rn")" = 256 ] &&
	[ "$(pc_field '[c["text"] for c in d["choices"]]' <<<"$rn")" = "$(python3 -c "import sys; print([sys.argv[1]] * 2)" "$tb")" ] &&
	pass "prefix cache: n = 2 from the cache: 256 cached, both choices the n = 1 text" || fail "prefix cache, n = 2: $rn"
ta=$(pc_field '",".join(t.split(":")[1] for t in d["choices"][0]["logprobs"]["tokens"][:7])' <<<"$ra")
rc=$(pc_req "$UP" "$PA,$ta,$(pc_ids 15 64)")
[ "$(pc_field 'len(d["choices"][0]["logprobs"]["tokens"])' <<<"$ra")" = 8 ] &&
	[ "$(pc_field 'all(t.startswith("token_id:") for t in d["choices"][0]["logprobs"]["tokens"])' <<<"$ra")" = True ] &&
	[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rc")" = 263 ] &&
	pass "prefix cache: a prompt that goes on from A's reply (return_tokens_as_token_ids) starts at the reply's end: 263 cached" ||
	fail "prefix cache, from a reply: A $ra; C $rc"
start pcoff --prefill-chunk 128 --prefix-cache 0
grep -q "prefix cache: off" "$S/pcoff.log" && pass "--prefix-cache 0: off" || fail "--prefix-cache 0: $(head -c 300 "$S/pcoff.log")"
rb0=$(pc_req "http://127.0.0.1:$PORT" "$PB")
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rb0")" = 0 ] &&
	[ -n "$(pc_field 'd["choices"][0]["logprobs"]["token_logprobs"]' <<<"$rb")" ] &&
	[ "$(pc_field 'd["choices"][0]["logprobs"]' <<<"$rb")" = "$(pc_field 'd["choices"][0]["logprobs"]' <<<"$rb0")" ] &&
	pass "prefix cache: B from the cache = B prefilled from the start in the same calls (tokens and log-probabilities)" ||
	fail "prefix cache: cached '$(pc_field 'd["choices"][0]["logprobs"]' <<<"$rb")' vs uncached '$(pc_field 'd["choices"][0]["logprobs"]' <<<"$rb0")'"
kill -TERM "$PID"
# a long prompt's state on the way (--prefix-every 256): a 600-id prompt
# kept at 256, 512, its end and its reply's end; one that leaves it at 400
# starts from the state at 256 (and is kept at its own end and its reply's:
# 6 states)
start pcevery --prefill-chunk 128 --prefix-every 256
U=http://127.0.0.1:$PORT
PE="$PA,$(pc_ids 13 344)"
pc_req "$U" "$PE" >/dev/null
PD="$(cut -d, -f1-400 <<<"$PE"),$(pc_ids 14 64)"
rd=$(pc_req "$U" "$PD")
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rd")" = 256 ] &&
	[ "$(metric salafw_prefix_cache_entries)" = 6 ] &&
	pass "prefix cache: a prompt's state kept each 256 tokens of its prefill; one that leaves it at 400 starts at 256" ||
	fail "prefix cache, --prefix-every: $rd; entries $(metric salafw_prefix_cache_entries)"
kill -TERM "$PID"
start pctiny --prefill-chunk 128 --prefix-cache 0.000001
U=http://127.0.0.1:$PORT
pc_req "$U" "$PA" >/dev/null
rb1=$(pc_req "$U" "$PB")
[ "$(pc_field 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$rb1")" = 0 ] && [ "$(metric salafw_prefix_cache_entries)" = 0 ] &&
	pass "prefix cache: a budget under one state keeps nothing" || fail "prefix cache, tiny budget: $rb1"
kill -TERM "$PID" "$PPID_"

# the first server too ends cleanly after all of the above (no leak or
# sanitizer report under make SAN=1), and nothing in the logs is raw request text
kill -TERM "$MAIN_PID"
wait "$MAIN_PID"
rc=$?
[ "$rc" = 0 ] && pass "the main server exits 0 on SIGTERM" || fail "main server: exit $rc: $(tail -c 400 "$S/main.log")"
! grep -qE 'AddressSanitizer|runtime error|LeakSanitizer' "$S"/*.log && pass "no sanitizer reports" ||
	fail "sanitizer: $(grep -hE -A5 'AddressSanitizer|runtime error|LeakSanitizer' "$S"/*.log | head -c 600)"
! grep -qE 'gpt-4|lorem|log me' "$S"/*.log && pass "request text is not logged (field names only)" || fail "the log holds request text"

check_report test_serve.sh
