#!/usr/bin/env bash
# gpu_cli.sh - the device memory plan of the commands on CUDA (issue 9 §3):
# `run`, `bench` and `serve --device cuda` print the plan at start, and
# refuse with its numbers and exit 5 a context that cannot fit, in the same
# words; a context they name as fitting is accepted, and bench's measured
# peak stays within the plan; and the host holds no second copy of the
# weights (peak RSS); run --prompt-cache saves and loads on CUDA. Needs the GPU machine (scripts/gpu-run.sh
# tests runs it with salafw on PATH); makes its own tiny model.
set -u
T=$(mktemp -d /tmp/gpu_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
M=$T/tiny
salafw mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || { fail "mkmodel --preset tiny"; M=; }

# the plan's lines sum to its total (each printed to 2 decimals)
plan_sums() {
	python3 - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
v = {k: float(x) for k, x in re.findall(r"^  (weights|KV cache|compressed keys|lightning states|activations|scratch|total) +([0-9.]+) GiB", t, re.M)}
parts = ["weights", "KV cache", "compressed keys", "lightning states", "activations", "scratch"]
ok = len(v) == 7 and abs(sum(v[p] for p in parts) - v["total"]) <= 0.035
print("ok" if ok else "bad %r" % v)
EOF
}

# run --prompt-cache on CUDA (runner/ctxstate.c through the device's
# transfers): the first run saves FILE, the second loads it, prefills
# nothing and prints the uncached text; a prompt that extends it loads the
# cached tokens and prefills the rest
if [ -n "$M" ]; then
	P="Once upon a time there was a little fox who lived in the forest"
	Q="$P and every morning it ran to the river to drink"
	prun() { salafw run "$M" --no-verify --device cuda --raw --temp 0 -n 12 "$@"; }
	plainP=$(prun -p "$P" 2>/dev/null)
	prun -p "$P" --prompt-cache "$T/pc.bin" >"$T/pc1.out" 2>"$T/pc1.err"
	prun -p "$P" --prompt-cache "$T/pc.bin" >"$T/pc2.out" 2>"$T/pc2.err"
	[ -n "$plainP" ] && [ "$(cat "$T/pc1.out")" = "$plainP" ] && grep -q "prompt cache: saved" "$T/pc1.err" &&
		pass "run --prompt-cache --device cuda: the first run saves FILE and prints the uncached text" ||
		fail "prompt cache, first run: '$(cat "$T/pc1.out")' vs '$plainP': $(head -c 300 "$T/pc1.err")"
	[ "$(cat "$T/pc2.out")" = "$plainP" ] && grep -q "prompt cache: loaded" "$T/pc2.err" &&
		grep -q "prefill 0 tokens" "$T/pc2.err" &&
		pass "run --prompt-cache --device cuda: the second run loads FILE, prefills nothing, prints the same text" ||
		fail "prompt cache, second run: '$(cat "$T/pc2.out")' vs '$plainP': $(head -c 300 "$T/pc2.err")"
	prun -p "$Q" --prompt-cache "$T/pc.bin" >"$T/pc3.out" 2>"$T/pc3.err"
	grep -q "prompt cache: loaded 26 of" "$T/pc3.err" && [ -s "$T/pc3.out" ] &&
		pass "run --prompt-cache --device cuda: an extended prompt loads the cached 26 tokens" ||
		fail "prompt cache, extension: $(head -c 300 "$T/pc3.err")"
fi

if [ -n "$M" ]; then
	# run: the plan at start, then the reply
	salafw run "$M" --no-verify --device cuda -p "Hello" -n 4 >"$T/run.out" 2>"$T/run.err"
	rc=$?
	[ $rc = 0 ] && grep -q "device memory plan for [0-9]* tokens:" "$T/run.err" &&
		pass "run --device cuda prints the plan at start" || fail "run plan (exit $rc): $(head -c 400 "$T/run.err")"
	[ "$(plan_sums "$T/run.err")" = ok ] && pass "run: the plan's lines sum to its total" ||
		fail "run plan sums: $(plan_sums "$T/run.err")"
	# run: a context past the device refused, exit 5, the numbers and a largest context named
	salafw run "$M" --no-verify --device cuda -p "Hello" -n 4 --max-context 1073741824 >/dev/null 2>"$T/big.err"
	rc=$?
	fit=$(sed -n 's/.*does not fit the GPU (at most about \([0-9]*\) do).*/\1/p' "$T/big.err" | head -n 1)
	[ $rc = 5 ] && [ -n "$fit" ] && grep -q "GiB are free" "$T/big.err" &&
		pass "run --max-context 2^30 refused with exit 5 and the numbers (at most about $fit)" ||
		fail "run refusal (exit $rc): $(head -c 400 "$T/big.err")"
	# a context of a quarter of the named one is accepted (no minutes of allocation: capped at 4M)
	if [ -n "$fit" ]; then
		q=$((fit / 4 / 64 * 64))
		[ $q -gt 4194304 ] && q=4194304
		salafw run "$M" --no-verify --device cuda -p "Hello" -n 2 --max-context $q >/dev/null 2>"$T/q.err" &&
			pass "run --max-context $q (under the named largest) runs" ||
			fail "run --max-context $q: $(head -c 400 "$T/q.err")"
	fi
	# bench: the plan at start, and its peak within 10 % + 32 MiB of the plan's total
	salafw bench "$M" --no-verify --device cuda --prompt 200 --gen 4 >"$T/bench.out" 2>"$T/bench.err"
	rc=$?
	r=$(python3 - "$T/bench.err" "$T/bench.out" <<'EOF'
import re, sys
e, o = open(sys.argv[1]).read(), open(sys.argv[2]).read()
t = re.search(r"^  total +([0-9.]+) GiB", e, re.M)
p = re.search(r"peak device memory: ([0-9.]+) GiB \(salafw allocations\)", o)
if not t or not p:
    print("missing"); sys.exit()
tot, peak = float(t.group(1)), float(p.group(1))
print("ok %.2f %.2f" % (tot, peak) if abs(peak - tot) <= 0.1 * tot + 32 / 1024 + 0.01 else "off %.2f %.2f" % (tot, peak))
EOF
)
	[ $rc = 0 ] && grep -q "device memory plan for 204 tokens:" "$T/bench.err" && [ "${r%% *}" = ok ] &&
		pass "bench prints the plan for 204 tokens; plan vs peak GiB: ${r#ok }" ||
		fail "bench plan (exit $rc, $r): $(head -c 400 "$T/bench.err")"
	salafw bench "$M" --no-verify --device cuda --prompt 64 --gen 2 --max-context 1073741824 >/dev/null 2>"$T/bbig.err"
	rc=$?
	[ $rc = 5 ] && grep -q "does not fit the GPU (at most about [0-9]* do)" "$T/bbig.err" &&
		pass "bench --max-context 2^30 refused the same way (exit 5)" ||
		fail "bench refusal (exit $rc): $(head -c 400 "$T/bbig.err")"
	# serve: 64 sequences of 2^30 refused before it listens, with a context per sequence named
	salafw serve "$M" --no-verify --device cuda --port 18181 --max-running 64 --max-context 1073741824 \
		>/dev/null 2>"$T/sbig.err" &
	sp=$!
	( sleep 120; kill $sp 2>/dev/null ) &
	wd=$!
	wait $sp
	rc=$?
	kill $wd 2>/dev/null
	each=$(sed -n 's/.*64 sequences of 1073741824 tokens do not fit the GPU (at most about \([0-9]*\) tokens each).*/\1/p' \
		"$T/sbig.err" | head -n 1)
	[ $rc = 5 ] && [ -n "$each" ] && grep -q "device memory plan for 64 sequences of up to 1073741824 tokens each:" "$T/sbig.err" &&
		pass "serve: 64 x 2^30 refused with exit 5, the plan and at most about $each tokens each" ||
		fail "serve refusal (exit $rc): $(head -c 500 "$T/sbig.err")"
	# serve: a plan that fits, printed, then the server answers and stops on SIGTERM with 0
	salafw serve "$M" --no-verify --device cuda --port 18181 --max-running 4 --max-context 4096 2>"$T/serve.err" &
	sp=$!
	up=0
	for _ in $(seq 240); do
		python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:18181/health", timeout=2)' \
			2>/dev/null && { up=1; break; }
		kill -0 $sp 2>/dev/null || break
		sleep 0.5
	done
	kill -TERM $sp 2>/dev/null
	wait $sp
	rc=$?
	[ $up = 1 ] && [ $rc = 0 ] && grep -q "device memory plan for 4 sequences of up to 4096 tokens each and [0-9]* prefix-cache entries:" "$T/serve.err" &&
		[ "$(plan_sums "$T/serve.err")" = ok ] &&
		pass "serve prints the plan of 4 x 4096 and the prefix-cache entries at start, serves, stops with 0" ||
		fail "serve plan (up $up, exit $rc): $(head -c 500 "$T/serve.err")"
fi
# host memory (issue 9 §4): a CUDA process keeps no second copy of the
# weights on the host; each tensor's pages of the map are dropped once
# uploaded, so its peak RSS stays under half the shards' bytes (it held them
# all before). The wide4 models of gpu_wide when gpu-run.sh made them.
W=${GPU_WIDE_MODEL:-}
if [ -z "$W" ] || [ ! -e "$W/config.json" ]; then
	W=$T/wide4
	salafw mkmodel --preset wide4 -o "$W" >/dev/null 2>&1 || { fail "mkmodel --preset wide4"; W=; }
fi
if [ -n "$W" ] && [ -x /usr/bin/time ]; then
	for d in "$W" "$W-int8"; do
		[ -e "$d/config.json" ] || continue
		bytes=$(cat "$d"/*.safetensors | wc -c)
		/usr/bin/time -v salafw bench "$d" --no-verify --device cuda --prompt 64 --gen 2 >/dev/null 2>"$T/rss.err"
		rc=$?
		kb=$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9]*\).*/\1/p' "$T/rss.err")
		[ $rc = 0 ] && [ -n "$kb" ] && [ $((kb * 1024)) -lt $((bytes / 2)) ] &&
			pass "bench --device cuda $(basename "$d"): peak RSS $((kb / 1024)) MiB for $((bytes >> 20)) MiB of shards" ||
			fail "bench $(basename "$d") host memory (exit $rc): peak RSS ${kb:-?} kB for $bytes bytes of shards"
	done
fi
echo "gpu_cli.sh: $passed passed, $failed failed"
[ $failed = 0 ]
