#!/usr/bin/env bash
# make bench: runs every bench/bench_*.sh and every built bench binary. Each
# prints its figures as ratios against a limit or a peer measured in the same
# run; copy the lines you want to keep into bench/RESULTS.md with the command.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
rc=0
for b in bench/bench_*.sh; do
	[ -e "$b" ] || continue
	echo "== $b"
	bash "$b" || rc=1
done
for b in "$BUILD"/bench/*; do
	[ -x "$b" ] && [ -f "$b" ] || continue
	case "$b" in *.o|*.d|*/bench_gpu) continue ;; esac # bench_gpu needs a model: bench/bench_gpu.sh runs it
	echo "== $b"
	"$b" || rc=1
done
exit $rc
