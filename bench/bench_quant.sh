#!/usr/bin/env bash
# bench_quant.sh - salafw quant on the `small` preset of mkmodel (hidden 1024,
# 8 layers, vocab 16384; bf16, two shards): quantization seconds and MB/s of
# input (RTN, and AWQ with a short calibration), then CPU decode tokens/s of
# the bf16 model against its int8 copy, as a ratio. Informational.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SALAFW=${SALAFW:-$PWD/$BUILD/salafw}
D=$(mktemp -d "${TMPDIR:-/tmp}/salafw-bench.XXXXXX")
trap 'rm -rf "$D"' EXIT
echo "== bench_quant: small preset, $(nproc) CPUs"
"$SALAFW" mkmodel --preset small --seed 1 -o "$D/small" >/dev/null || { echo "mkmodel small failed"; exit 1; }
mb=$(du -sm --apparent-size "$D/small" | cut -f1)
for m in rtn awq; do
	extra=
	[ $m = awq ] && extra="--samples ${BENCH_AWQ_SAMPLES:-4} --seq-len ${BENCH_AWQ_SEQ:-256}"
	t0=$(date +%s.%N)
	"$SALAFW" quant "$D/small" -o "$D/q-$m" --method $m --group 128 $extra --no-verify -q ||
		{ echo "quant --method $m failed"; exit 1; }
	t1=$(date +%s.%N)
	awk -v m=$m -v a="$t0" -v b="$t1" -v mb="$mb" \
		'BEGIN { s = b - a; printf "quant %s g128: %.2f s, %.1f MB/s of bf16 input (%d MB)\n", m, s, mb / s, mb }'
done
rate() { # decode tok/s of a model directory
	SALAFW_DEVICE=cpu "$SALAFW" bench "$1" --prompt "${BENCH_PROMPT:-128}" --gen "${BENCH_GEN:-32}" --no-verify \
		2>/dev/null | sed -nE 's/^decode: ([0-9.]+) tok\/s.*/\1/p'
}
bf=$(rate "$D/small")
i8=$(rate "$D/q-rtn")
awk -v a="$bf" -v b="$i8" 'BEGIN { if (a > 0 && b > 0) printf "cpu decode: bf16 %.1f tok/s, int8 %.1f tok/s, int8/bf16 = %.2fx\n", a, b, b / a;
	else print "cpu decode: measurement failed" }'
