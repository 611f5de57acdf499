#!/usr/bin/env bash
# gpu-run.sh - run THERE (the GPU machine, from the repo root, after
# scripts/device-prep.sh here and `carry` of .devlib): unpacks
# .devlib/bundle.tar.xz into $DEV (default /tmp/salafw-dev) and runs from it.
#   bash scripts/gpu-run.sh tests            every .devlib/bin/gpu_* test (gpu_wide: makes
#                                            /tmp/sala-wide4 and its int8 quant first, once)
#   bash scripts/gpu-run.sh test NAME [args] one test
#   bash scripts/gpu-run.sh bench [--runs P:G,...]  mkmodel --preset full + bench_gpu
#   bash scripts/gpu-run.sh bench-w8 [--runs P:G,...] [--group G]  bf16 and int8 full-size models, bench_gpu on each
#   bash scripts/gpu-run.sh batch [G]          mkmodel --preset full + bench_batch: B = 1 .. 64 at 1K and 1K-32K
#   bash scripts/gpu-run.sh decode-ab [P [G]]  salafw bench, recorded decode steps vs SALAFW_CUDA_NOGRAPH
#   bash scripts/gpu-run.sh env-ab [--w8] [--rounds R] P G 'VAR=V' ...  salafw bench once per
#                                            environment setting, interleaved R times
#   bash scripts/gpu-run.sh profile [P [G]]    device time per op (SALAFW_CUDA_PROFILE), prefill and decode
#   bash scripts/gpu-run.sh quant-time [quant options]  mkmodel --preset full, then
#                                            salafw quant --device cuda under /usr/bin/time -v (wall, peak RSS)
#   bash scripts/gpu-run.sh serve-bench [C]  mkmodel --preset full, salafw serve --device cuda, bench/bench_serve.py,
#                                            then bench_batch --serve (the same workload, no HTTP)
#   bash scripts/gpu-run.sh wide-ref [bf16] [int8]  gpu_wide's CPU references, made here
#   bash scripts/gpu-run.sh trace [--w8] P G  kernel timeline of salafw bench (CUPTI): the last decode
#                                            steps' kernels, in-graph durations and idle time (bench/trace_step.py)
#   bash scripts/gpu-run.sh before-after [what]  the same benchmarks with this tree's build and an older one
#                                            (.devlib-before, scripts/device-prep.sh --before REV), interleaved:
#                                            what = bench (salafw bench bf16 + int8 at 1K, 32K, 128K), batch
#                                            (bench_batch B = 1..64 at 1K), serve (serve-bench at 32), attn
#                                            (bench_attn: a 32K, a 128K and a 1M prefill chunk's attention ops, and a
#                                            decode row's at 1K, 128K, 256K, 512K and 1M), prefill (bench_gpu bf16 at
#                                            32K and 128K), long (bench_gpu bf16, a 1M-token
#                                            prompt and 64 decode steps); default
#                                            bench batch serve
#   bash scripts/gpu-run.sh ncu-attn [L [ROWS]]  Nsight Compute on bench_attn's stage 1, sparse attention and Lightning kernels
#                                            at context L (default 131072) for a chunk of ROWS (8192), and on a
#                                            1M decode row's stage 1: speed of light, memory, occupancy, warp stalls
#   bash scripts/gpu-run.sh w8-vs-bf16 [G]   bf16 and int8 g128 full-size models in one call: batched decode
#                                            (bench_batch B = 1..64 at 1K and 1K-32K), bench_gpu prefill and
#                                            decode at 1K/32K/128K, and serving at concurrency 32
#   bash scripts/gpu-run.sh prefix-ttft [N [on]]  mkmodel --preset full, salafw serve, bench/bench_prefix.py: TTFT of an
#                                            N-id prompt (default 131072) and of two that extend it, and an 8-turn
#                                            conversation; prefix cache on, off (on: on only, no conversation)
#   bash scripts/gpu-run.sh prompt-cache [W]  mkmodel --preset full, then salafw run with a prompt of W random words
#                                            (default 117000, ~131K tokens): without the cache, saving it, loading it
#   bash scripts/gpu-run.sh kv-cache [P]     the fp8 KV cache against bf16's in one call: bench_gpu on the bf16
#                                            model at 1K/32K/128K with --kv-cache bf16, then fp8; then the int8
#                                            g128 model with --kv-cache fp8 --chunk 2048 at P tokens (default
#                                            1048576): TTFT, decode and the peak against the plan and 14.9 GiB
#   bash scripts/gpu-run.sh variants [CTX [ROWS]]  bench_attn of this build and of each variant that
#                                            device-prep.sh --variant made (.devlib-x), in turn, this build
#                                            first and last: a prefill chunk of ROWS (8192) at CTX (131072,1048576)
#   bash scripts/gpu-run.sh shell 'CMD'      any command with the environment set ($BIN: this build's binaries)
# Logs go to $OUT (the folder that comes back) or .devout. The device tool
# brings back at most 8 files: when a mode leaves more, they are packed on
# exit into $OUT/logs.tar.gz (tar xzf it here), with what an earlier mode of
# the same call packed there (a later file of the same name wins).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
pack_logs() {
	local n
	n=$(find "$OUT" -type f ! -name logs.tar.gz | wc -l)
	[ "$n" -gt 7 ] || return 0
	(cd "$OUT" && { [ ! -f logs.tar.gz ] || tar xzf logs.tar.gz --skip-old-files; } &&
		find . -type f ! -name logs.tar.gz -print0 | tar czf logs.tar.gz.new --null -T - &&
		mv logs.tar.gz.new logs.tar.gz &&
		find . -mindepth 1 ! -name logs.tar.gz -delete)
}
trap pack_logs EXIT
cudalib=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
	[ -e "$d/libcublasLt.so.13" ] && cudalib="$cudalib:$d"
done
if [ -z "$cudalib" ]; then
	d=$(dirname "$(find / -name 'libcublasLt.so.13' -not -path '/proc/*' 2>/dev/null | head -n 1)")
	[ -n "$d" ] && cudalib=":$d"
	d=$(dirname "$(find / -name 'libcudart.so.13' -not -path '/proc/*' 2>/dev/null | head -n 1)")
	[ -n "$d" ] && cudalib="$cudalib:$d"
fi
DEV=${DEV:-/tmp/salafw-dev}
if [ -f .devlib/bundle.tar.xz ]; then
	rm -rf "$DEV" && mkdir -p "$DEV"
	python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .devlib/bundle.tar.xz "$DEV" ||
		{ echo "gpu-run: cannot unpack the bundle" >&2; exit 5; }
fi
export LD_LIBRARY_PATH="$DEV/lib$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SALAFW_GOLDEN=${SALAFW_GOLDEN:-$DEV/gold}
export PATH="$DEV/bin:$PATH"
BIN=$DEV/bin
mode=${1:-tests}
shift || true
# gpu_wide's models (tests/gpu_wide.c): mkmodel --preset wide4 and its RTN
# int8 quant, made once on this machine's disk; their shards must be
# byte-identical to those scripts/wide-ref.sh made the CPU references from
W=${GPU_WIDE_MODEL:-/tmp/sala-wide4}
export GPU_WIDE_MODEL=$W GPU_WIDE_REFS=${GPU_WIDE_REFS:-$DEV/gpu_wide}
wide_make() {
	local start=$(date +%s) made=0
	if [ ! -e "$W/config.json" ]; then
		"$BIN/salafw" mkmodel --preset wide4 -o "$W" 2>&1 | tail -n 2
		made=1
	fi
	if [ ! -e "$W-int8/config.json" ]; then
		"$BIN/salafw" quant "$W" -o "$W-int8" --method rtn --group 128 --no-verify 2>&1 | tail -n 2
		made=1
	fi
	[ $made = 1 ] && echo "gpu_wide: mkmodel --preset wide4 + quant --method rtn --group 128: $(($(date +%s) - start)) s"
	return 0
}
wide_models() {
	local k d sums rc=0
	wide_make
	for k in bf16 int8; do
		d=$W
		[ $k = int8 ] && d=$W-int8
		sums=$GPU_WIDE_REFS/wide4-$k.sha256
		if [ ! -f "$sums" ]; then
			echo "FAIL gpu_wide: no $k CPU reference ($sums: scripts/wide-ref.sh, or gpu-run.sh wide-ref $k, makes it)"
			rc=1
		elif (cd "$d" && sha256sum --quiet -c "$sums"); then
			echo "gpu_wide: $d: shards byte-identical to the $k reference's (sha256sum -c)"
		else
			echo "FAIL gpu_wide: $d differs from the model the $k CPU reference was made from (scripts/wide-ref.sh remakes it)"
			rc=1
		fi
	done
	return $rc
}
# full_models BF16_DIR INT8_DIR: the full-size random models of the
# comparisons (mkmodel --preset full, and --w8 --group 128), made once
full_models() {
	local d start
	for d in "$@"; do
		[ -e "$d/config.json" ] && continue
		start=$(date +%s)
		# (with the tokenizer: serve needs it)
		if [ "$d" = "${2:-}" ]; then
			"$BIN/salafw" mkmodel --preset full --w8 --group 128 -o "$d" 2>&1 | tail -n 2 | tee -a "$OUT/mkmodel.log"
		else
			"$BIN/salafw" mkmodel --preset full -o "$d" 2>&1 | tail -n 2 | tee -a "$OUT/mkmodel.log"
		fi
		echo "mkmodel $d: $(($(date +%s) - start)) s" | tee -a "$OUT/mkmodel.log"
	done
}
# serve_bench BINDIR MODEL CONC TAG [SERVE OPTIONS]: `salafw serve` of BINDIR
# on MODEL (--max-running 32 --max-context 2048, then the options given)
# under bench/bench_serve.py (1K-token prompts, 256 out) at concurrency CONC
# (a list: 1,8,32); its log, JSON and /metrics go to $OUT/serve-TAG.*
serve_bench() {
	local b=$1 m=$2 c=$3 tag=$4 port=${SALAFW_SERVE_PORT:-18080} spid up=0 rc
	shift 4
	LD_LIBRARY_PATH="$(dirname "$b")/lib$cudalib" "$b/salafw" serve "$m" --no-verify --device cuda --port "$port" \
		--max-running 32 --max-context 2048 "$@" 2>"$OUT/serve-$tag.log" &
	spid=$!
	for _ in $(seq 600); do
		if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
			"http://127.0.0.1:$port/health" 2>/dev/null; then up=1; break; fi
		kill -0 $spid 2>/dev/null || break
		sleep 0.5
	done
	if [ $up != 1 ]; then
		echo "serve_bench: the server did not come up:"; tail -n 20 "$OUT/serve-$tag.log"
		kill $spid 2>/dev/null
		return 1
	fi
	# the model id: the one /v1/models lists first (the directory's name on older builds)
	local id
	id=$(python3 -c 'import sys, json, urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1]))["data"][0]["id"])' \
		"http://127.0.0.1:$port/v1/models" 2>/dev/null || basename "$m")
	python3 bench/bench_serve.py --url "http://127.0.0.1:$port/v1" --model "$id" \
		--concurrency "$c" --prompt-tokens 1024 --gen 256 --json "$OUT/serve-$tag.json" 2>&1 |
		tee -a "$OUT/serve-bench.log"
	rc=${PIPESTATUS[0]}
	python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
		"http://127.0.0.1:$port/metrics" >"$OUT/serve-$tag.metrics" 2>/dev/null
	kill -TERM $spid
	wait $spid || rc=1
	return $rc
}
case $mode in
tests)
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
	wide_make # gpu_wide's models, which gpu_cli.sh uses as well
	passed=0 failed=0
	for t in $BIN/gpu_*; do
		n=$(basename "$t")
		start=$(date +%s)
		if [ "$n" = gpu_long ] && ls "$SALAFW_GOLDEN"/long-*.ref >/dev/null 2>&1; then
			# the longest prompt whose CPU side scripts/long-ref.sh made ahead
			tok=$(ls "$SALAFW_GOLDEN"/long-*.ref | sed 's/.*long-//; s/\.ref$//' | sort -n | tail -n 1)
			ref=$SALAFW_GOLDEN/long-$tok.ref
			GPU_LONG_TOKENS=$tok GPU_LONG_REF=$ref "$t" >"$OUT/$n.log" 2>&1
		elif [ "$n" = gpu_wide ]; then
			wide_models | tee "$OUT/wide-models.log"
			[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
			"$t" >"$OUT/$n.log" 2>&1
		else
			"$t" >"$OUT/$n.log" 2>&1
		fi
		rc=$?
		s=$(grep -E "^$n: [0-9]+ passed, [0-9]+ failed$" "$OUT/$n.log" | tail -n 1)
		[ -z "$s" ] && s="$n: 0 passed, 1 failed" && echo "$n crashed (exit $rc):" && tail -n 20 "$OUT/$n.log"
		grep -E '^FAIL' "$OUT/$n.log" | head -n 20
		echo "$s ($(($(date +%s) - start))s)"
		p=$(echo "$s" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
		f=$(echo "$s" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
		[ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
		passed=$((passed + p)) failed=$((failed + f))
	done
	echo "$passed passed, $failed failed"
	[ "$failed" = 0 ]
	;;
test)
	n=$1
	shift
	[ "$n" = gpu_wide ] && { wide_models || true; }
	"$BIN/$n" "$@" 2>&1 | tee "$OUT/$n.log"
	exit "${PIPESTATUS[0]}"
	;;
bench)
	# bash scripts/gpu-run.sh bench [bench_gpu options]: mkmodel --preset full
	# on this machine's disk (once), then bench/bench_gpu.c
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		start=$(date +%s)
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 3 | tee "$OUT/mkmodel.log"
		echo "mkmodel: $(($(date +%s) - start)) s"
	fi
	"$BIN/bench_gpu" "$M" "$@" 2>&1 | tee -a "$OUT/bench.log"
	exit "${PIPESTATUS[0]}"
	;;
bench-w8)
	# bash scripts/gpu-run.sh bench-w8 [--runs ...] [--group G]: the bf16 model
	# (mkmodel --preset full) and an int8 one written directly in the layout
	# (mkmodel --preset full --w8 --group G, default 128), then bench_gpu on
	# each with the same runs, in this one call (limits measured by each)
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	Q=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	runs="1024:128,32768:16,131072:32" group=128
	while [ $# -gt 0 ]; do
		case $1 in
		--runs) runs=$2; shift 2 ;;
		--group) group=$2; shift 2 ;;
		*) echo "bench-w8: unknown option $1" >&2; exit 2 ;;
		esac
	done
	for d in "$M" "$Q"; do
		[ -e "$d/config.json" ] && continue
		start=$(date +%s)
		if [ "$d" = "$Q" ]; then
			"$BIN/salafw" mkmodel --preset full --w8 --group "$group" --no-tokenizer -o "$d" 2>&1 | tail -n 2 | tee -a "$OUT/mkmodel.log"
		else
			"$BIN/salafw" mkmodel --preset full --no-tokenizer -o "$d" 2>&1 | tail -n 2 | tee -a "$OUT/mkmodel.log"
		fi
		echo "mkmodel $d: $(($(date +%s) - start)) s" | tee -a "$OUT/mkmodel.log"
	done
	rc=0
	for d in "$M" "$Q"; do
		echo "== bench_gpu $d --runs $runs" | tee -a "$OUT/bench-w8.log"
		"$BIN/bench_gpu" "$d" --runs "$runs" 2>&1 | grep -v uploaded | tee -a "$OUT/bench-w8.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	exit $rc
	;;
kv-cache)
	# bash scripts/gpu-run.sh kv-cache [P]: --kv-cache bf16 vs fp8 on the same
	# model in one call, then int8 + fp8 at P tokens in 2048-row pieces
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	Q=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	P=${1:-1048576}
	full_models "$M" "$Q"
	rc=0
	for kv in bf16 fp8; do
		echo "== bench_gpu $M --kv-cache $kv" | tee -a "$OUT/kv-cache.log"
		"$BIN/bench_gpu" "$M" --runs 1024:128,32768:32,131072:32 --kv-cache $kv 2>&1 | grep -v uploaded |
			tee -a "$OUT/kv-cache.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	echo "== bench_gpu $Q --kv-cache fp8 --chunk 2048 --runs $P:64" | tee -a "$OUT/kv-cache.log"
	"$BIN/bench_gpu" "$Q" --runs "$P:64" --chunk 2048 --kv-cache fp8 2>&1 | grep -v uploaded | tee -a "$OUT/kv-cache.log"
	[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	grep -E 'RUN   peak' "$OUT/kv-cache.log" | tail -n 1 |
		awk '{ if ($5 + 0 <= 14.9) print "int8 + fp8 peak " $5 " GiB <= 14.9 GiB: OK"; else { print "int8 + fp8 peak " $5 " GiB > 14.9 GiB"; exit 1 } }' |
		tee -a "$OUT/kv-cache.log"
	[ "${PIPESTATUS[1]}" = 0 ] || rc=1
	exit $rc
	;;
batch)
	# bash scripts/gpu-run.sh batch [GEN]: aggregate decode throughput of
	# batched decode (bench/bench_batch.c) on the full-size model, every
	# sequence at 1K context, then mixed lengths 1K-32K (geometric spread)
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 3 | tee "$OUT/mkmodel.log"
	fi
	G=${1:-32}
	rc=0
	for ctx in 1024 1024-32768; do
		"$BIN/bench_batch" "$M" --device cuda --batch 1,2,4,8,16,32,64 --ctx "$ctx" --gen "$G" --chunk 8192 2>&1 |
			tee -a "$OUT/batch.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	exit $rc
	;;
serve-bench)
	# bash scripts/gpu-run.sh serve-bench [CONCURRENCY]: salafw serve on the
	# full-size model (--device cuda, unsigned: --no-verify), loaded through
	# HTTP by bench/bench_serve.py (asyncio + aiohttp, the image has it):
	# 1K-token prompts, 256 output tokens, concurrency 1, 8 and 32
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 3 | tee "$OUT/mkmodel.log"
	fi
	CONC=${1:-1,8,32}
	# SERVE_ARGS: more serve options (e.g. --prefill-chunk N for an A/B)
	# shellcheck disable=SC2086
	serve_bench "$BIN" "$M" "$CONC" http ${SERVE_ARGS:-}
	rc=$?
	cat "$OUT/serve-http.log" # the server's own lines
	# the engine's peer (bench_batch --serve): the same workload in process,
	# no HTTP; per concurrency C, bench_serve.py's request count max(8, 4C),
	# R = C up to the server's --max-running, serve's prefill chunk
	chunk=$(printf '%s\n' "${SERVE_ARGS:-}" | sed -nE 's/.*--prefill-chunk[= ]+([0-9]+).*/\1/p')
	maxrun=$(printf '%s\n' "${SERVE_ARGS:-}" | sed -nE 's/.*--max-running[= ]+([0-9]+).*/\1/p')
	for c in ${CONC//,/ }; do
		n=$((4 * c > 8 ? 4 * c : 8))
		r=$((c < ${maxrun:-32} ? c : ${maxrun:-32}))
		"$BIN/bench_batch" "$M" --device cuda --serve "$n:1024:256" --batch "$r" --chunk "${chunk:-512}" 2>&1 |
			tee -a "$OUT/serve-bench.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	exit $rc
	;;
decode-ab)
	# bash scripts/gpu-run.sh decode-ab [PROMPT [GEN]]: `salafw bench` on the
	# full-size model with recorded decode steps, then launched op by op
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 3 | tee "$OUT/mkmodel.log"
	fi
	P=${1:-1024} G=${2:-128}
	for sw in "" SALAFW_CUDA_NOGRAPH; do
		echo "== switches: ${sw:-none (recorded steps)}" | tee -a "$OUT/decode-ab.log"
		env $(for v in $sw; do printf '%s=1 ' "$v"; done) "$BIN/salafw" bench "$M" --prompt "$P" --gen "$G" \
			--no-verify 2>&1 | tee -a "$OUT/decode-ab.log"
	done
	;;
env-ab)
	# bash scripts/gpu-run.sh env-ab [--w8] [--rounds R] P G 'VAR=V ...' ...: `salafw
	# bench --prompt P --gen G` on the full-size model (--w8: its int8 g128
	# twin, written directly in the layout) once per setting (one argument
	# each, "" for none), the settings interleaved R times (default 2), so
	# drift shows as a spread and not as a difference
	w8=0 rounds=2
	while [ $# -gt 0 ]; do
		case $1 in
		--w8) w8=1; shift ;;
		--rounds) rounds=$2; shift 2 ;;
		*) break ;;
		esac
	done
	[ $# -ge 3 ] || { echo "env-ab: want P G and one or more settings" >&2; exit 2; }
	P=$1 G=$2
	shift 2
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	[ $w8 = 1 ] && M=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	if [ ! -e "$M/config.json" ]; then
		start=$(date +%s)
		"$BIN/salafw" mkmodel --preset full $([ $w8 = 1 ] && echo --w8 --group 128) --no-tokenizer -o "$M" 2>&1 |
			tail -n 2 | tee -a "$OUT/mkmodel.log"
		echo "mkmodel $M: $(($(date +%s) - start)) s" | tee -a "$OUT/mkmodel.log"
	fi
	rc=0
	for r in $(seq "$rounds"); do
		for sw in "$@"; do
			echo "== round $r: $M P $P G $G: ${sw:-(defaults)}" | tee -a "$OUT/env-ab.log"
			env $sw "$BIN/salafw" bench "$M" --prompt "$P" --gen "$G" --no-verify 2>&1 |
				grep -E '^(decode|prefill|salafw:)' | tee -a "$OUT/env-ab.log"
			[ "${PIPESTATUS[0]}" = 0 ] || rc=1
		done
	done
	exit $rc
	;;
profile)
	# bash scripts/gpu-run.sh profile [PROMPT [GEN]]: device time per op,
	# prefill and decode apart (the host waits after each op: shares, not speed)
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 3 | tee "$OUT/mkmodel.log"
	fi
	P=${1:-1024} G=${2:-32}
	# the variable reaches the engine through the command line (cli_model_params), not bench_gpu
	SALAFW_CUDA_PROFILE=1 "$BIN/salafw" bench "$M" --prompt "$P" --gen "$G" --no-verify 2>&1 | grep -v 'uploaded' |
		tee -a "$OUT/profile.log"
	exit "${PIPESTATUS[0]}"
	;;
quant-time)
	# bash scripts/gpu-run.sh quant-time [quant options]: the full-size bf16
	# model (once), then `salafw quant` with the default AWQ calibration, the
	# calibration forward and the scale search on CUDA (issue 23 §4: <= 3 min
	# wall, peak RSS <= 4 GiB; `--samples 128` runs the 128 x 512 tokens of
	# the earlier measurements); progress lines and the time report go to
	# $OUT/quant-time.log
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full -o "$M" 2>&1 | tail -n 2 | tee -a "$OUT/mkmodel.log"
	fi
	rm -rf /tmp/sala-full-awq
	TIME=/usr/bin/time
	[ -x $TIME ] || TIME=
	# the peak so far every 10 s (time -v reports only at the end: a run cut
	# short by the device's time limit still says what it held)
	(start=$(date +%s)
	while sleep 10; do
		p=$(pgrep -x salafw | head -n 1)
		[ -n "$p" ] && awk -v t=$(($(date +%s) - start)) '/^(VmHWM|VmRSS)/ { o = o " " $1 " " $2 " kB" }
			END { print t " s:" o }' "/proc/$p/status" 2>/dev/null
	done) >"$OUT/quant-rss.log" &
	rss=$!
	${TIME:+$TIME -v} "$BIN/salafw" quant "$M" -o /tmp/sala-full-awq --device cuda --no-verify --no-sign "$@" \
		2>&1 | tee "$OUT/quant-time.log" | grep -vE '^\s+(Page|Volun|Invol|Swaps|File sys|Socket|Signals|Average|Exit|Minor)'
	rc=${PIPESTATUS[0]}
	kill $rss 2>/dev/null
	exit "$rc"
	;;
wide-ref)
	# bash scripts/gpu-run.sh wide-ref [bf16] [int8]: scripts/wide-ref.sh's
	# work (gpu_wide's CPU references) on this machine's cores, for when the
	# build machine is too busy: wide4-K.ref and wide4-K.sha256 go to
	# $OUT/gpu_wide, to be committed in tests/data/gpu_wide
	wide_make
	mkdir -p "$OUT/gpu_wide"
	for k in ${*:-bf16 int8}; do
		d=$W
		[ "$k" = int8 ] && d=$W-int8
		(cd "$d" && sha256sum model-*.safetensors) >"$OUT/gpu_wide/wide4-$k.sha256"
		start=$(date +%s)
		"$BIN/test_wide" --write-ref "$k" "$d" "$OUT/gpu_wide/wide4-$k.ref" 2>&1 | tee -a "$OUT/wide-ref.log"
		echo "wide-ref: $k reference: $(($(date +%s) - start)) s" | tee -a "$OUT/wide-ref.log"
	done
	;;
trace)
	# bash scripts/gpu-run.sh trace [--w8] P G: the kernel timeline of `salafw
	# bench --prompt P --gen G` through CUPTI (bench/cupti/trace.c, graph nodes
	# one by one), then bench/trace_step.py: the last decode steps' kernels
	# with their in-graph durations and the time no kernel ran
	w8=0
	[ "${1:-}" = --w8 ] && w8=1 && shift
	P=${1:-1024} G=${2:-16}
	LIBT=$DEV/cupti/libsfw_cupti_trace.so
	[ -f "$LIBT" ] || { echo "trace: no $LIBT (scripts/device-prep.sh builds it)" >&2; exit 1; }
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	[ $w8 = 1 ] && M=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	if [ ! -e "$M/config.json" ]; then
		"$BIN/salafw" mkmodel --preset full $([ $w8 = 1 ] && echo --w8 --group 128) --no-tokenizer -o "$M" 2>&1 |
			tail -n 2 | tee -a "$OUT/mkmodel.log"
	fi
	t=/tmp/salafw-trace-$P.txt
	CUDA_INJECTION64_PATH=$LIBT SALAFW_CUPTI_OUT=$t "$BIN/salafw" bench "$M" --prompt "$P" --gen "$G" --no-verify 2>&1 |
		grep -E '^(decode|prefill|cupti)' | tee "$OUT/trace-$P.txt"
	python3 bench/trace_step.py "$t" 5 | tee -a "$OUT/trace-$P.txt"
	[ "${PIPESTATUS[0]}" = 0 ]
	;;
before-after)
	# bash scripts/gpu-run.sh before-after [bench|batch|serve ...]: each
	# benchmark run by this tree's build ($BIN) and by an older build
	# (.devlib-before/bundle.tar.xz, unpacked into $DEV-before), one after the
	# other and in alternating order per round, on the same models (made once
	# by this build's mkmodel), so a difference is the code and not the drift

	# ab_bench_gpu BIN TAG MODEL RUNS: one build's bench_gpu, logged
	ab_bench_gpu() {
		echo "== $2: bench_gpu $3 --runs $4" | tee -a "$OUT/before-after.log"
		LD_LIBRARY_PATH="$(dirname "$1")/lib$cudalib" "$1/bench_gpu" "$3" --runs "$4" 2>&1 |
			grep -v uploaded | tee -a "$OUT/before-after.log"
		[ "${PIPESTATUS[0]}" = 0 ]
	}
	[ -f .devlib-before/bundle.tar.xz ] || { echo "before-after: no .devlib-before (scripts/device-prep.sh --before REV)" >&2; exit 2; }
	OLD=$DEV-before
	rm -rf "$OLD" && mkdir -p "$OLD"
	python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .devlib-before/bundle.tar.xz "$OLD" ||
		{ echo "before-after: cannot unpack .devlib-before" >&2; exit 5; }
	what=${*:-bench batch serve}
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	Q=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	# (attn needs no model, long only the bf16 one)
	case " $what " in
	*" bench "* | *" batch "* | *" serve "*) full_models "$M" "$Q" ;;
	*" long "* | *" prefill "*) full_models "$M" ;;
	esac
	rc=0
	round=0
	for w in $what; do
		round=$((round + 1))
		order="$BIN $OLD/bin"
		[ $((round % 2)) = 0 ] && order="$OLD/bin $BIN"
		for b in $order; do
			tag=now
			[ "$b" = "$OLD/bin" ] && tag=before
			case $w in
			bench)
				for d in "$M" "$Q"; do
					ab_bench_gpu "$b" "$tag" "$d" 1024:128,32768:32,131072:32 || rc=1
				done ;;
			prefill) ab_bench_gpu "$b" "$tag" "$M" 32768:8,131072:8 || rc=1 ;;
			long) ab_bench_gpu "$b" "$tag" "$M" 1048576:64 || rc=1 ;;
			batch)
				echo "== $tag: bench_batch $M --batch 1,2,4,8,16,32,64 --ctx 1024 --gen 32" | tee -a "$OUT/before-after.log"
				LD_LIBRARY_PATH="$(dirname "$b")/lib$cudalib" "$b/bench_batch" "$M" --device cuda --batch 1,2,4,8,16,32,64 \
					--ctx 1024 --gen 32 --chunk 8192 2>&1 | tee -a "$OUT/before-after.log"
				[ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
			serve)
				echo "== $tag: serve $M, 32 concurrent, 1K prompt, 256 out" | tee -a "$OUT/before-after.log"
				serve_bench "$b" "$M" 32 "$tag" || rc=1 ;;
			attn)
				if [ ! -x "$b/bench_attn" ]; then
					echo "== $tag: no bench_attn in this build (skipped)" | tee -a "$OUT/before-after.log"
					continue
				fi
				# a prefill chunk at 32K, 128K and 1M, then a decode row at 1K .. 1M
				for a in "--ctx 32768,131072,1048576 --rows 8192" "--ctx 1024,131072,262144,524288,1048576 --rows 1"; do
					echo "== $tag: bench_attn $a" | tee -a "$OUT/before-after.log"
					# shellcheck disable=SC2086 # $a: the options, split on purpose
					LD_LIBRARY_PATH="$(dirname "$b")/lib$cudalib" "$b/bench_attn" $a 2>&1 |
						tee -a "$OUT/before-after.log"
					[ "${PIPESTATUS[0]}" = 0 ] || rc=1
				done ;;
			*) echo "before-after: unknown benchmark $w" >&2; exit 2 ;;
			esac
		done
	done
	exit $rc
	;;
ncu-attn)
	# bash scripts/gpu-run.sh ncu-attn [L [ROWS]]: one instance of each
	# kernel under Nsight Compute (clocks left alone, METHOD.md), from
	# bench_attn's third call of the op (after its warm-up): a prefill chunk
	# of ROWS (default 8192) at context L (default 131072): stage 1 and the
	# sparse attention, and Lightning's chunked prefill over the chunk's rows;
	# then a decode row at 1M: stage 1's two passes
	L=${1:-131072} R=${2:-8192}
	NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
	[ -n "$NCU" ] || { echo "ncu-attn: no ncu on this machine" >&2; exit 1; }
	rc=0
	# gla_: Lightning's chunked prefill (one launch a call) from the op's
	# second call
	for job in "stage1_tc_kernel 2 1 $L $R" "attn_tc_kernel 2 1 $L $R" "gla_ 1 1 $L $R" \
		"stage1_dec 4 2 1048576 1"; do
		# shellcheck disable=SC2086 # $job: the fields, split on purpose
		set -- $job
		echo "== ncu $1 (skip $2, count $3), bench_attn --ctx $4 --rows $5" | tee -a "$OUT/ncu-attn.log"
		"$NCU" --clock-control none -k "regex:$1" --launch-skip "$2" --launch-count "$3" --section SpeedOfLight \
			--section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
			--section LaunchStats --section WarpStateStats --section SchedulerStats \
			"$BIN/bench_attn" --ctx "$4" --rows "$5" 2>&1 | tee -a "$OUT/ncu-attn.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	exit $rc
	;;
w8-vs-bf16)
	# bash scripts/gpu-run.sh w8-vs-bf16 [G]: issue 23's comparison in one
	# call: the bf16 full-size model and its int8 g128 twin (written directly
	# in the layout), batched decode at 1K and 1K-32K, prefill and decode at
	# 1K/32K/128K, and serving at concurrency 32; bf16 and int8 alternate
	M=${SALAFW_BENCH_MODEL:-/tmp/sala-full}
	Q=${SALAFW_BENCH_MODEL_W8:-/tmp/sala-full-w8}
	G=${1:-32}
	full_models "$M" "$Q"
	rc=0
	for ctx in 1024 1024-32768; do
		for d in "$M" "$Q"; do
			echo "== bench_batch $d --batch 1,2,4,8,16,32,64 --ctx $ctx --gen $G" | tee -a "$OUT/w8-vs-bf16.log"
			"$BIN/bench_batch" "$d" --device cuda --batch 1,2,4,8,16,32,64 --ctx "$ctx" --gen "$G" --chunk 8192 2>&1 |
				tee -a "$OUT/w8-vs-bf16.log"
			[ "${PIPESTATUS[0]}" = 0 ] || rc=1
		done
	done
	for d in "$M" "$Q"; do
		echo "== bench_gpu $d --runs 1024:128,32768:32,131072:32" | tee -a "$OUT/w8-vs-bf16.log"
		"$BIN/bench_gpu" "$d" --runs 1024:128,32768:32,131072:32 2>&1 | grep -v uploaded | tee -a "$OUT/w8-vs-bf16.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	done
	for d in "$M" "$Q"; do
		echo "== serve $d, 32 concurrent, 1K prompt, 256 out" | tee -a "$OUT/w8-vs-bf16.log"
		serve_bench "$BIN" "$d" 32 "$(basename "$d")" || rc=1
	done
	exit $rc
	;;
prefix-ttft)
	# bash scripts/gpu-run.sh prefix-ttft [TOKENS [on]]: salafw serve on the
	# full-size model, then bench/bench_prefix.py: TTFT of a TOKENS-id prompt
	# (default 131072), of it + 64 ids and of it + 64 other ids (issue 25: the
	# second and third from the prefix cache), and of an 8-turn conversation
	# from a 32K-id start (each turn + its 256-token reply + 512 ids); then
	# the same with --prefix-cache 0. With `on`: the cache on only, no
	# conversation (1M tokens: the first prompt is the uncached figure)
	M=/tmp/sala-full
	full_models "$M"
	N=${1:-131072}
	for pc in "" $([ "${2:-}" = on ] || echo 0); do
		echo "== --prefix-cache ${pc:-default}" | tee -a "$OUT/prefix-ttft.log"
		"$BIN/salafw" serve "$M" --no-verify --device cuda --port 18081 \
			--max-running 4 --max-context $((N + 256)) $([ -n "$pc" ] && echo --prefix-cache "$pc") \
			2>"$OUT/serve-prefix${pc}.log" &
		spid=$!
		for _ in $(seq 600); do
			python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
				http://127.0.0.1:18081/health 2>/dev/null && break
			kill -0 $spid 2>/dev/null || break
			sleep 0.5
		done
		grep "prefix cache" "$OUT/serve-prefix${pc}.log" | tee -a "$OUT/prefix-ttft.log"
		id=$(python3 -c 'import sys, json, urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1]))["data"][0]["id"])' \
			http://127.0.0.1:18081/v1/models 2>/dev/null)
		python3 bench/bench_prefix.py --url http://127.0.0.1:18081/v1 --model "$id" --prefix "$N" 2>&1 |
			tee -a "$OUT/prefix-ttft.log"
		[ "${2:-}" = on ] ||
			python3 bench/bench_prefix.py --url http://127.0.0.1:18081/v1 --model "$id" --prefix 32768 --turns 8 2>&1 |
			tee -a "$OUT/prefix-ttft.log"
		kill -TERM $spid
		wait $spid
	done
	;;
prompt-cache)
	# bash scripts/gpu-run.sh prompt-cache [WORDS]: `salafw run --prompt-cache`
	# on the full-size model with a prompt of WORDS random words (default
	# 117000, about 131K tokens of the full preset's tokenizer: 80000 made
	# 89,642): a run without the cache, the first run with
	# it (prefills, saves FILE), the second (loads FILE): wall times, the
	# stats and prompt-cache lines, FILE's size (issue 25 §3)
	M=/tmp/sala-full
	full_models "$M"
	W=${1:-117000}
	python3 - "$W" /tmp/pc-prompt.txt <<'EOF'
import random, sys
r = random.Random(7)
words = ("the of and to in is was for on that with as by at from his it an were are which this be or has had "
         "river forest city light water stone house road paper music garden winter summer morning evening").split()
open(sys.argv[2], "w").write(" ".join(r.choice(words) for _ in range(int(sys.argv[1]))) + "\n")
EOF
	rm -f /tmp/pc.bin
	for tag in "no cache" "first, saves" "second, loads"; do
		opt=$([ "$tag" = "no cache" ] || echo "--prompt-cache /tmp/pc.bin")
		echo "== $tag" | tee -a "$OUT/prompt-cache.log"
		start=$(date +%s.%N)
		"$BIN/salafw" run "$M" --no-verify --device cuda --raw --temp 0 -n 8 -f /tmp/pc-prompt.txt \
			--max-context $((W * 3)) $opt 2>&1 >/dev/null | grep -E "prompt cache|prefill .* tokens" |
			tee -a "$OUT/prompt-cache.log"
		echo "wall $(python3 -c "print(round($(date +%s.%N) - $start, 3))") s" | tee -a "$OUT/prompt-cache.log"
	done
	ls -l /tmp/pc.bin | tee -a "$OUT/prompt-cache.log"
	;;
variants)
	# bash scripts/gpu-run.sh variants [CTX [ROWS]]: the same source compiled
	# with other -D flags (device-prep.sh --variant), timed beside this build;
	# each build's "bits:" lines (the ops' results hashed) are compared with
	# this build's, so a variant that computes other bits says so
	C=${1:-131072,1048576} R=${2:-8192}
	ls .devlib-x/bench_attn_*.xz >/dev/null 2>&1 || { echo "variants: no .devlib-x (scripts/device-prep.sh --variant NAME FLAGS)" >&2; exit 2; }
	rm -rf "$DEV-x" && mkdir -p "$DEV-x"
	rc=0
	names=now
	for f in .devlib-x/bench_attn_*.xz; do
		n=${f#.devlib-x/bench_attn_} n=${n%.xz}
		if ! xz -dc "$f" >"$DEV-x/bench_attn_$n" || ! chmod +x "$DEV-x/bench_attn_$n"; then
			echo "variants: cannot unpack $f" >&2
			exit 5
		fi
		names="$names $n"
	done
	first=1
	for n in $names now; do
		b=$BIN/bench_attn flags="(this build)"
		if [ "$n" != now ]; then
			b=$DEV-x/bench_attn_$n flags=$(cat ".devlib-x/$n.flags" 2>/dev/null)
		fi
		echo "== $n $flags: bench_attn --ctx $C --rows $R" | tee -a "$OUT/variants.log"
		"$b" --ctx "$C" --rows "$R" 2>&1 | tee "$DEV-x/$n.out" | tee -a "$OUT/variants.log"
		[ "${PIPESTATUS[0]}" = 0 ] || rc=1
		# the bits each op made (bench_attn's "bits:" lines), against this build's first run
		grep '^    bits:' "$DEV-x/$n.out" >"$DEV-x/$n.bits"
		if [ "$first" = 1 ]; then
			cp "$DEV-x/$n.bits" "$DEV-x/ref.bits"
			first=0
		elif [ ! -s "$DEV-x/$n.bits" ]; then
			echo "== $n: no bits lines (an older bench_attn)" | tee -a "$OUT/variants.log"
		elif cmp -s "$DEV-x/$n.bits" "$DEV-x/ref.bits"; then
			echo "== $n: the same bits as this build" | tee -a "$OUT/variants.log"
		else
			echo "== $n: bits differ from this build's (an op's result changed):" | tee -a "$OUT/variants.log"
			diff "$DEV-x/ref.bits" "$DEV-x/$n.bits" | tee -a "$OUT/variants.log"
		fi
	done
	exit $rc
	;;
shell)
	# the command sees this script's environment, and $BIN, $DEV and $OUT
	BIN=$BIN DEV=$DEV OUT=$OUT bash -c "$1"
	;;
*)
	echo "usage: $0 tests | test NAME [args] | bench [args] | bench-w8 [args] | batch [G] | decode-ab [P [G]] | env-ab [--w8] P G SETTING... | profile [P [G]] | quant-time [args] | serve-bench [C] | wide-ref [K] | trace [--w8] P G | before-after [bench|batch|serve|attn|prefill|long ...] | ncu-attn [L [ROWS]] | w8-vs-bf16 [G] | prefix-ttft [N [on]] | prompt-cache [WORDS] | variants [CTX [ROWS]] | shell CMD" >&2
	exit 2
	;;
esac
