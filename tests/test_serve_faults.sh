#!/usr/bin/env bash
# test_serve_faults.sh - salafw serve under faults (issue 27, items 1-7), on a
# tiny model from `salafw mkmodel`, with curl and tests/serve_faults.py's raw
# sockets (loopback only; every client and wait is bounded):
#   SIGTERM while non-streamed requests run (each reply arrives, exit 0); a
#   second signal and --drain-timeout (the accepted requests end with 503 or
#   an error event, exit 128 + signal; n = 3 requests too, their choices forks
#   or waiting for one); the drain answers 503, the listener
#   stays open; slow headers and bodies closed after --receive-timeout; a
#   coding other than chunked refused (501); the per-address limit; /health
#   and /metrics answer beside 200 crowding connections; bodies over what the
#   context can use refused before any tokenizing (413 / 400, the server's
#   peak RSS checked); top_p 1e-300 and other out-of-range values are 400 with
#   `param`; an escaped NUL is 400; a client that half-closes gets its reply, one
#   that goes away frees its sequence.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
S=$(scratch)
PY=tests/serve_faults.py
export SALAFW_STATE_DIR=$S/state
M=$S/tiny
$SALAFW mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || fail "mkmodel tiny"
J=(-H 'Content-Type: application/json')

# start NAME ARGS...: a server on a free port (the gate is test_serve.sh's);
# sets PID, PORT and U, or fails
start() {
	local name=$1
	shift
	$SALAFW serve "$M" --no-verify --port 0 "$@" 2>"$S/$name.log" &
	PID=$!
	PIDS+=("$PID")
	PORT=
	for _ in $(seq 200); do
		PORT=$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$S/$name.log" 2>/dev/null)
		[ -n "$PORT" ] && break
		kill -0 "$PID" 2>/dev/null || break
		sleep 0.05
	done
	U=http://127.0.0.1:$PORT
	[ -n "$PORT" ] || fail "server $name did not start: $(head -c 300 "$S/$name.log")"
}
# waitexit PID SECS: RC is its exit code, or "running" after SECS seconds
waitexit() {
	local i
	RC=running
	for ((i = 0; i < $2 * 20; i++)); do
		if ! kill -0 "$1" 2>/dev/null; then
			wait "$1"
			RC=$?
			return
		fi
		sleep 0.05
	done
}
metric() { curl -s -m 2 "$U/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
# until_metric NAME VALUE: waits (5 s at most) for a metric's value
until_metric() { for _ in $(seq 250); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.02; done; return 1; }
# is_error FILE PARAM [CODE]: FILE is an OpenAI error object naming PARAM ("" for none)
is_error() {
	python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert isinstance(e["message"], str) and e["message"] and isinstance(e["type"], str)
assert (e["param"] or "") == sys.argv[2], e["param"]
assert len(sys.argv) < 4 or e["code"] == sys.argv[3], e["code"]' "$@" 2>/dev/null
}
# status DESCR WANT PARAM CURL-ARGS...: the HTTP status and, for an error, the param
status() {
	local d=$1 want=$2 param=$3
	shift 3
	local got
	got=$(curl -s -m 20 -o "$S/body" -w '%{http_code}' "${J[@]}" "$@")
	if [ "$got" = "$want" ] && { [ "$want" = 200 ] || is_error "$S/body" "$param"; }; then
		pass "$d"
	else
		fail "$d (HTTP $got want $want, param '$param': $(head -c 300 "$S/body"))"
	fi
}
# completed FILE N: FILE is a completion of N tokens
completed() {
	python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
assert o["choices"][0]["finish_reason"] == "length" and o["usage"]["completion_tokens"] == int(sys.argv[2])' \
		"$1" "$2" 2>/dev/null
}
# stream_aborted FILE: some tokens, then an error event, then [DONE]
stream_aborted() {
	grep -q '^data: {"id"' "$1" && grep -q '^data: {"error":' "$1" &&
		[ "$(grep -v '^$' "$1" | tail -n 1)" = "data: [DONE]" ]
}
LONG='"model": "tiny", "prompt": "x", "max_tokens": 4000, "ignore_eos": true'

# ---- 1. SIGTERM while a non-streamed request runs: its reply is sent (the
# request counts until libmicrohttpd has sent it), then exit 0. The old
# counter dropped when the reply was queued: the daemon stopped before the
# write in about half the trials, so eight servers at once
term_trial() {
	local t=$1 port= pid cp
	$SALAFW serve "$M" --no-verify --port 0 --max-context 1024 2>"$S/term$t.log" &
	pid=$!
	for _ in $(seq 200); do
		port=$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$S/term$t.log" 2>/dev/null)
		[ -n "$port" ] && break
		sleep 0.05
	done
	curl -s -m 30 -o "$S/term$t.body" -w '%{http_code}' "${J[@]}" \
		-d '{"model": "tiny", "prompt": "x", "max_tokens": 200, "ignore_eos": true}' \
		"http://127.0.0.1:$port/v1/completions" >"$S/term$t.code" &
	cp=$!
	for _ in $(seq 250); do
		[ "$(curl -s -m 2 "http://127.0.0.1:$port/metrics" | awk '$1 == "salafw_running" { print $2 }')" = 1 ] && break
		sleep 0.02
	done
	kill -TERM "$pid"
	wait "$cp"
	waitexit "$pid" 20
	echo "$RC" >"$S/term$t.rc"
}
for t in 1 2 3 4 5 6 7 8; do term_trial $t & done
wait
ok=0 rcs=
for t in 1 2 3 4 5 6 7 8; do
	[ "$(cat "$S/term$t.code")" = 200 ] && completed "$S/term$t.body" 200 && ok=$((ok + 1))
	rcs="$rcs$(cat "$S/term$t.rc") "
done
[ "$ok" = 8 ] && pass "SIGTERM during a non-streamed request: 8 of 8 replies arrive whole" ||
	fail "SIGTERM during a non-streamed request: $ok of 8 replies (HTTP $(cat "$S"/term*.code | tr '\n' ' '))"
[ "$rcs" = "0 0 0 0 0 0 0 0 " ] && pass "SIGTERM during a non-streamed request: exit 0 (8 servers)" ||
	fail "SIGTERM during a non-streamed request: exits $rcs"

# ---- 2 and 3. The drain answers 503 on an open listener; a second signal ends
# the accepted requests (503, an error event), exit 128 + 15
start abort --max-context 4096
curl -sN -m 30 "${J[@]}" -d "{$LONG, \"stream\": true}" "$U/v1/completions" >"$S/ab.stream" &
c1=$!
curl -s -m 30 -o "$S/ab.body" -w '%{http_code}' "${J[@]}" -d "{$LONG}" "$U/v1/completions" >"$S/ab.code" &
c2=$!
until_metric salafw_running 2 || fail "abort: the two requests did not start"
kill -TERM "$PID"
for _ in $(seq 100); do grep -q "finishing the accepted" "$S/abort.log" && break; sleep 0.02; done
code=$(curl -s -m 3 -o "$S/h.body" -w '%{http_code}' "$U/health")
[ "$code" = 503 ] && grep -q 'shutting down' "$S/h.body" && pass "draining: /health answers 503 (the listener stays open)" ||
	fail "draining: /health: HTTP $code (curl exit $?)"
code=$(curl -s -m 3 -o "$S/n.body" -w '%{http_code}' "${J[@]}" -d '{"model": "tiny", "prompt": "x"}' "$U/v1/completions")
[ "$code" = 503 ] && is_error "$S/n.body" "" && pass "draining: a new request gets 503 with an error object" ||
	fail "draining: a new request: HTTP $code $(head -c 200 "$S/n.body")"
python3 -c 'import json; print(json.dumps({"model": "tiny", "prompt": "lorem ipsum " * 16000}))' >"$S/d.json"
code=$(curl -s -m 5 -o "$S/n.body" -w '%{http_code}' "${J[@]}" -H 'Expect:' --data-binary @"$S/d.json" "$U/v1/completions")
[ "$code" = 503 ] && is_error "$S/n.body" "" && pass "draining: a 190 KB body sent at once gets its 503 (read, not reset)" ||
	fail "draining: a 190 KB body: HTTP $code $(head -c 200 "$S/n.body")"
kill -0 "$PID" 2>/dev/null && [ "$(grep -c '^data: {"id"' "$S/ab.stream")" -ge 1 ] && pass "draining: the stream goes on" ||
	fail "draining: the server or the stream stopped before the second signal"
kill -TERM "$PID"
waitexit "$PID" 8
rc=$RC
wait $c1 $c2
[ "$rc" = 143 ] && pass "a second SIGTERM: exit 143" || fail "a second SIGTERM: exit $rc"
stream_aborted "$S/ab.stream" && pass "a second SIGTERM: the stream ends with an error event and [DONE]" ||
	fail "a second SIGTERM: the stream: $(tail -c 300 "$S/ab.stream")"
[ "$(cat "$S/ab.code")" = 503 ] && is_error "$S/ab.body" "" && pass "a second SIGTERM: the waiting request gets 503" ||
	fail "a second SIGTERM: the waiting request: HTTP $(cat "$S/ab.code") $(head -c 200 "$S/ab.body")"
grep -q "a second signal (SIGTERM): ended 2 unfinished requests" "$S/abort.log" && pass "a second SIGTERM: says so" ||
	fail "a second SIGTERM: log $(tail -c 300 "$S/abort.log")"

# n = 3 under a second signal: a stream whose choices are a lead and two forks
# of its sequence, and a waiting request whose lead runs while its other two
# choices wait (the batch's 4 sequences are taken: they prefill their own);
# every choice ends, the stream with an error event, the request with 503
start abortn --max-context 4096 --max-running 4
curl -sN -m 30 "${J[@]}" -d "{$LONG, \"stream\": true, \"n\": 3}" "$U/v1/completions" >"$S/abn.stream" &
c1=$!
until_metric salafw_choice_forks_total 2 || fail "abort, n = 3: the stream's other choices were not forked"
curl -s -m 30 -o "$S/abn.body" -w '%{http_code}' "${J[@]}" -d "{$LONG, \"n\": 3}" "$U/v1/completions" >"$S/abn.code" &
c2=$!
until_metric salafw_running 4 && until_metric salafw_queue_depth 2 ||
	fail "abort, n = 3: the second request's lead did not run beside two waiting choices"
kill -TERM "$PID"
for _ in $(seq 100); do grep -q "finishing the accepted" "$S/abortn.log" && break; sleep 0.02; done
kill -TERM "$PID"
waitexit "$PID" 8
rc=$RC
wait $c1 $c2
[ "$rc" = 143 ] && stream_aborted "$S/abn.stream" && [ "$(cat "$S/abn.code")" = 503 ] && is_error "$S/abn.body" "" &&
	pass "a second SIGTERM ends n = 3 requests: forks and choices waiting for one" ||
	fail "a second SIGTERM, n = 3: exit $rc, HTTP $(cat "$S/abn.code"), stream $(tail -c 200 "$S/abn.stream")"

# --drain-timeout: the same end once it has passed (here after SIGINT: 130)
start dtimeout --max-context 4096 --drain-timeout 1
curl -sN -m 30 "${J[@]}" -d "{$LONG, \"stream\": true}" "$U/v1/chat/completions" >/dev/null &
curl -sN -m 30 "${J[@]}" -d "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 4000, \"ignore_eos\": true, \"stream\": true}" \
	"$U/v1/chat/completions" >"$S/dt.stream" &
c1=$!
until_metric salafw_running 1 || fail "drain-timeout: the stream did not start"
kill -INT "$PID"
waitexit "$PID" 10
rc=$RC
wait $c1
[ "$rc" = 130 ] && grep -q -- "--drain-timeout: ended 1 unfinished request" "$S/dtimeout.log" &&
	pass "--drain-timeout 1 after SIGINT: the stream is ended, exit 130" ||
	fail "--drain-timeout: exit $rc: $(tail -c 300 "$S/dtimeout.log")"
stream_aborted "$S/dt.stream" && pass "--drain-timeout: the chat stream ends with an error event and [DONE]" ||
	fail "--drain-timeout: the stream: $(tail -c 300 "$S/dt.stream")"

# ---- 4. Slow clients: --receive-timeout, a coding other than chunked
start faults --max-context 256 --max-running 2 --max-queue 2
FPORT=$PORT FU=$U FPID=$PID
[ "$(timeout 10 python3 "$PY" te "$PORT")" = 501 ] && pass "Transfer-Encoding: gzip, chunked: 501 at once" ||
	fail "Transfer-Encoding: gzip, chunked: no 501"
start slow --receive-timeout 2
python3 "$PY" slow "$PORT" headers 127.0.0.3 >"$S/slow.h" &
s1=$!
python3 "$PY" slow "$PORT" body 127.0.0.4 >"$S/slow.b" &
s2=$!
wait $s1 $s2
for k in h b; do
	t=$(cat "$S/slow.$k")
	python3 -c 'import sys; sys.exit(0 if 1.5 <= float(sys.argv[1]) <= 5 else 1)' "$t" 2>/dev/null &&
		pass "--receive-timeout 2: a slow $([ $k = h ] && echo header || echo body) is closed (${t} s)" ||
		fail "--receive-timeout 2: a slow $([ $k = h ] && echo header || echo body): $t"
done
code=$(curl -s -m 3 -o /dev/null -w '%{http_code}' "$U/health")
[ "$code" = 200 ] && pass "the server answers after the slow clients" || fail "after the slow clients: HTTP $code"

# the per-address limit (default 128) and the reserve: a server whose old
# connection limit was max-queue + max-running + 64
start crowd --max-queue 2 --max-running 1
closed=$(timeout 20 python3 "$PY" perip "$PORT" 132 127.0.0.60)
[ "$closed" = "128 129 130 131" ] && pass "the 129th connection of one address is closed (--conns-per-ip 128)" ||
	fail "per-address limit: the server closed connections '$closed'"
rm -f "$S/ready" "$S/ready.stop"
timeout 40 python3 "$PY" crowd "$PORT" 200 20 30 "$S/ready" >"$S/crowd.out" &
cw=$!
for _ in $(seq 300); do [ -s "$S/ready" ] && break; sleep 0.02; done
ok=0
for _ in 1 2; do
	curl -sf -m 2 "$U/health" | grep -q ok && ok=1 && break
	sleep 0.2
done
[ "$ok" = 1 ] && pass "/health answers beside 200 connections sending half a request" ||
	fail "/health beside 200 slow connections: no answer"
curl -sf -m 2 "$U/metrics" | grep -q '^salafw_running' && pass "/metrics answers beside them" ||
	fail "/metrics beside 200 slow connections: no answer"
code=$(curl -s -m 10 -o "$S/c.body" -w '%{http_code}' "${J[@]}" -d '{"model": "tiny", "prompt": "x", "max_tokens": 4}' "$U/v1/completions")
[ "$code" = 200 ] && pass "a completion is served beside them" || fail "a completion beside 200 slow connections: HTTP $code"
touch "$S/ready.stop"
wait $cw
n=$(cat "$S/crowd.out")
[ "${n:-0}" -ge 72 ] && pass "the longest-waiting of them are closed ($n of 200; 128 may wait)" ||
	fail "crowding connections closed: '$n'"

# a client that goes away while its non-streamed request runs frees its
# sequence (the server's 102 probe meets a closed socket)
before=$(metric salafw_requests_cancelled_total)
curl -s -m 30 -o /dev/null "${J[@]}" -d "{$LONG}" "$U/v1/completions" &
c1=$!
until_metric salafw_running 1 || fail "gone client: the request did not start"
kill $c1
wait $c1 2>/dev/null
until_metric salafw_running 0 && [ "$(metric salafw_requests_cancelled_total)" = $((${before:-0} + 1)) ] &&
	pass "a non-streamed client that goes away frees its sequence" ||
	fail "gone client: running $(metric salafw_running), cancelled $(metric salafw_requests_cancelled_total)"

# ---- 5. Large bodies: refused before tokenizing, the server's memory flat
U=$FU
PORT=$FPORT
python3 -c '
import json
print(json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "lorem ipsum " * 90000}]}))' >"$S/big.json"
spid=$FPID
hwm() { awk '/^VmHWM/ { print $2 }' "/proc/$spid/status"; }
h0=$(hwm)
for i in 1 2 3; do
	curl -s -m 30 -o "$S/big.$i" -w '%{http_code}\n' "${J[@]}" --data-binary @"$S/big.json" "$U/v1/chat/completions" >"$S/big.$i.code" &
	cps[$i]=$!
done
wait "${cps[1]}" "${cps[2]}" "${cps[3]}"
h1=$(hwm)
[ "$(cat "$S"/big.*.code | sort -u)" = 413 ] && is_error "$S/big.1" "" &&
	pass "a 1 MiB chat body at --max-context 256: 413" || fail "1 MiB body: HTTP $(cat "$S"/big.*.code | tr '\n' ' ')"
[ $((h1 - h0)) -lt 65536 ] && pass "three 1 MiB bodies at once: peak RSS $((h0 / 1024)) -> $((h1 / 1024)) MiB" ||
	fail "three 1 MiB bodies: peak RSS $((h0 / 1024)) -> $((h1 / 1024)) MiB"
python3 -c 'import json; print(json.dumps({"model": "tiny", "prompt": "lorem ipsum " * 8000}))' >"$S/mid.json"
status "a 96 KB prompt at --max-context 256: 400 context_length_exceeded, untokenized" 400 prompt --data-binary @"$S/mid.json" "$U/v1/completions"
is_error "$S/body" prompt context_length_exceeded && grep -q 'bytes' "$S/body" && pass "  ... its code and message" ||
	fail "96 KB prompt: $(head -c 300 "$S/body")"
python3 -c 'import json; print(json.dumps({"model": "tiny", "prompt": "lorem ipsum " * 300}))' >"$S/tok.json"
status "a 3.6 KB prompt over 256 tokens: 400 after tokenizing" 400 prompt --data-binary @"$S/tok.json" "$U/v1/completions"
is_error "$S/body" prompt context_length_exceeded && grep -q 'tokens' "$S/body" && pass "  ... its code and message" ||
	fail "3.6 KB prompt: $(head -c 300 "$S/body")"
[ "$(hwm)" -lt $((h0 + 65536)) ] && pass "peak RSS after them: $(($(hwm) / 1024)) MiB" || fail "peak RSS after the prompts: $(($(hwm) / 1024)) MiB"

# ---- 6. Client values out of range: 400 naming the field
C=$U/v1/completions
B='"model": "tiny", "max_tokens": 2'
P="$B, \"prompt\": \"x\""
status "top_p 1e-300 (0 as a float): 400" 400 top_p -d "{$P, \"top_p\": 1e-300}" "$C"
status "top_p 1e-46: 400" 400 top_p -d "{$P, \"top_p\": 1e-46}" "$C"
status "top_p 1e-30: 200" 200 "" -d "{$P, \"top_p\": 1e-30}" "$C"
status "temperature 1e-300: 200 (greedy)" 200 "" -d "{$P, \"temperature\": 1e-300}" "$C"
status "temperature -0.5: 400" 400 temperature -d "{$P, \"temperature\": -0.5}" "$C"
status "top_k -2: 400" 400 top_k -d "{$P, \"top_k\": -2}" "$C"
status "max_tokens 0: 400" 400 max_tokens -d '{"model": "tiny", "prompt": "x", "max_tokens": 0}' "$C"
status "seed 1.5: 400" 400 seed -d "{$P, \"seed\": 1.5}" "$C"
status "an empty stop string: 400" 400 stop -d "{$P, \"stop\": [\"\"]}" "$C"

# ---- 7. An escaped NUL is refused; a half-closed client gets its reply
status "prompt with \\u0000: 400" 400 prompt -d "{$B, \"prompt\": \"ab\\u0000cd\"}" "$C"
status "chat content with \\u0000: 400" 400 messages \
	-d '{"model": "tiny", "messages": [{"role": "user", "content": "a\u0000"}]}' "$U/v1/chat/completions"
status "stop with \\u0000: 400" 400 stop -d "{$P, \"stop\": \"a\\u0000\"}" "$C"
status "an escaped backslash before u0000: 200" 200 "" -d "{$B, \"prompt\": \"ab\\\\u0000cd\"}" "$C"
out=$(timeout 40 python3 "$PY" halfclose "$PORT" /v1/completions '{"model": "tiny", "prompt": "x", "max_tokens": 8, "ignore_eos": true}')
[ "$(echo "$out" | head -n 1)" = 200 ] && echo "$out" | tail -n +2 >"$S/hc.json" && completed "$S/hc.json" 8 &&
	pass "a client that half-closes after its request gets its reply" || fail "half-close: $(echo "$out" | head -c 300)"
out=$(timeout 40 python3 "$PY" halfclose "$PORT" /v1/chat/completions \
	'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8, "ignore_eos": true, "stream": true}')
[ "$(echo "$out" | head -n 1)" = 200 ] && echo "$out" | grep -q '"finish_reason":"length"' &&
	[ "$(echo "$out" | grep -v '^$' | tail -n 1)" = "data: [DONE]" ] &&
	pass "a half-closed stream gets every event and [DONE]" || fail "half-closed stream: $(echo "$out" | tail -c 300)"

# every server ends cleanly (the faults server after all of the above)
kill -TERM "$spid"
waitexit "$spid" 10
rc=$RC
[ "$rc" = 0 ] && pass "the faults server exits 0 on SIGTERM" || fail "faults server: exit $rc"
! grep -qE 'AddressSanitizer|runtime error|LeakSanitizer' "$S"/*.log && pass "no sanitizer reports" ||
	fail "sanitizer: $(grep -hE -A5 'AddressSanitizer|runtime error|LeakSanitizer' "$S"/*.log | head -c 600)"

check_report test_serve_faults.sh
