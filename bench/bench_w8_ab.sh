#!/usr/bin/env bash
# bench_w8_ab.sh - before/after speed of the CPU int8 matmul (sfw_op_matmul_w8_cpu) in one run:
# bench/bench_w8.c is compiled twice with the same flags, against BEFORE's kernel and core
# libraries (a build directory of another tree, e.g. main's) and against this tree's $BUILD, and
# the two run in turn (A B B A ...) ROUNDS times. Per shape it prints the best and the median of
# the rounds' per-call times and the after/before speed ratio of each (> 1: after is faster).
#   BEFORE=/path/to/main/build [ROUNDS=8] bash bench/bench_w8_ab.sh [bench_w8 options]
# With MODEL=DIR (an int8 model, e.g. `salafw mkmodel --preset small --w8 -o DIR`) it then runs
# `salafw bench DIR --prompt $PROMPT --gen $GEN` (default 256, 64) of both trees in turn the same
# way (BEFORE/salafw against $BUILD/salafw) and prints prefill and decode tokens/s.
# Not part of `make bench` (it needs a second tree); bench_w8 itself is.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
: "${BEFORE:?set BEFORE to a build directory of the tree to compare with (libsfw_kernels.a, libsfw_core.a)}"
ROUNDS=${ROUNDS:-8}
D=$(mktemp -d "${TMPDIR:-/tmp}/salafw-w8ab.XXXXXX")
trap 'rm -rf "$D"' EXIT
for side in before after; do
	lib=$BEFORE
	[ "$side" = after ] && lib=$BUILD
	libs="$lib/libsfw_kernels.a"
	[ -e "$lib/libsfw_num.a" ] && libs="$libs $lib/libsfw_num.a" # trees before num/ have none
	# shellcheck disable=SC2086
	${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -I. -Icore -pthread bench/bench_w8.c $libs "$lib/libsfw_core.a" -lm \
		-o "$D/$side" || { echo "bench_w8_ab: cannot build the $side binary"; exit 1; }
done
echo "== bench_w8_ab: $ROUNDS rounds, before = $BEFORE, after = $BUILD, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
	for side in $order; do
		"$D/$side" "$@" | sed -n "s/^w8 \([^ ]*\) group [^:]*: \([0-9.]*\) ms.*/$side \1 \2/p"
	done
done >"$D/times"
awk '
function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
{ k = $1 SUBSEP $2; n[k]++; v[k, n[k]] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 } }
END {
	printf "%-16s %21s %21s %15s\n", "shape MxNxK", "before best / median", "after best / median", "speed ratio"
	for (s = 1; s <= ns; s++) {
		sh = order[s]
		for (side = 0; side < 2; side++) {
			nm = side ? "after" : "before"; k = nm SUBSEP sh; m = n[k]
			for (i = 1; i <= m; i++) a[i] = v[k, i]
			sort(a, m); best[side] = a[1]; med[side] = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
		}
		printf "%-16s %9.3f / %7.3f ms %9.3f / %7.3f ms   %5.2f / %5.2f\n", sh, best[0], med[0], best[1], med[1],
		       best[0] / best[1], med[0] / med[1]
	}
}' "$D/times"

[ -n "${MODEL:-}" ] || exit 0
for r in $(seq 1 "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
	for side in $order; do
		bin=$BUILD/salafw
		[ "$side" = before ] && bin=$BEFORE/salafw
		SALAFW_DEVICE=cpu "$bin" bench "$MODEL" --prompt "${PROMPT:-256}" --gen "${GEN:-64}" --no-verify 2>/dev/null |
			sed -n "s/^prefill: \([0-9.]*\) tok.*/$side prefill \1/p; s/^decode: \([0-9.]*\) tok.*/$side decode \1/p"
	done
done >"$D/e2e"
awk '
function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] < a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
{ k = $1 SUBSEP $2; n[k]++; v[k, n[k]] = $3 }
END {
	printf "%-8s %23s %23s %15s\n", "salafw", "before best / median", "after best / median", "speed ratio"
	split("prefill decode", what, " ")
	for (w = 1; w <= 2; w++) {
		for (side = 0; side < 2; side++) {
			nm = side ? "after" : "before"; k = nm SUBSEP what[w]; m = n[k]
			for (i = 1; i <= m; i++) a[i] = v[k, i]
			sort(a, m); best[side] = a[1]; med[side] = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
		}
		printf "%-8s %7.1f / %6.1f tok/s %7.1f / %6.1f tok/s   %5.2f / %5.2f\n", what[w], best[0], med[0], best[1], med[1],
		       best[1] / best[0], med[1] / med[0]
	}
}' "$D/e2e"
