#!/usr/bin/env bash
# wide-ref.sh - run HERE: the CPU side of tests/gpu_wide.c. Makes the wide4
# model (salafw mkmodel --preset wide4: the real widths, 4 layers S L L S;
# deterministic, so the GPU machine's copy is byte-identical) and its int8
# copy (salafw quant --method rtn --group 128), runs the CPU engine on the
# 12,288-token prompt + 8 greedy steps of tests/wide_ref.h and writes
# tests/data/gpu_wide/wide4-{bf16,int8}.ref (committed, ~840 KB each) and the
# sha256 of the shards they were made from (wide4-{bf16,int8}.sha256);
# scripts/device-prep.sh packs them, gpu-run.sh tests passes them to gpu_wide.
# Remake them when the CPU engine's numbers or the preset change.
#
# Measured on the build machine (2 cores shared with 6 other helpers' jobs,
# load 9-14; 2026-12-01): mkmodel --preset wide4 67 s, quant --method rtn
# --group 128 56 s; the bf16 reference 4727 s wall (79 min; the 12,287-token CPU
# prefill is ~27 TFLOP of GEMM, ~35 CPU-minutes here on 2 threads), so a busy
# 2-core machine takes about an hour per model. The int8 one did not fit
# the day's slot here: `bash scripts/gpu-run.sh wide-ref int8` (after
# scripts/device-prep.sh, which packs test_wide) does the same work on the
# GPU machine's 16 cores and leaves wide4-int8.{ref,sha256} in $OUT/gpu_wide.
#
# Usage: scripts/wide-ref.sh [bf16] [int8]    (default both)
#   WIDE_MODEL=DIR (default /tmp/sala-wide4; the int8 copy goes to DIR-int8)
set -euo pipefail
cd "$(dirname "$0")/.."
M=${WIDE_MODEL:-/tmp/sala-wide4}
BUILD=${BUILD:-build}
make BUILD="$BUILD" -j2 "$BUILD/salafw" "$BUILD/tests/test_wide" >/dev/null
mkdir -p tests/data/gpu_wide
t() { date +%s; }
if [ ! -e "$M/config.json" ]; then
	s=$(t)
	"$BUILD/salafw" mkmodel --preset wide4 -o "$M"
	echo "wide-ref: mkmodel --preset wide4: $(($(t) - s)) s"
fi
for k in ${*:-bf16 int8}; do
	dir=$M
	if [ "$k" = int8 ]; then
		dir=$M-int8
		if [ ! -e "$dir/config.json" ]; then
			s=$(t)
			"$BUILD/salafw" quant "$M" -o "$dir" --method rtn --group 128 --no-verify
			echo "wide-ref: quant --method rtn --group 128: $(($(t) - s)) s"
		fi
	fi
	# the shards the reference is made from: gpu-run.sh checks its copies
	(cd "$dir" && sha256sum model-*.safetensors) >"tests/data/gpu_wide/wide4-$k.sha256"
	s=$(t)
	"$BUILD/tests/test_wide" --write-ref "$k" "$dir" "tests/data/gpu_wide/wide4-$k.ref"
	echo "wide-ref: $k reference: $(($(t) - s)) s"
done
