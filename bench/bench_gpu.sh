#!/usr/bin/env bash
# bench_gpu.sh - the CUDA benchmarks (bench/bench_gpu.c) where a GPU answers;
# elsewhere (CI, the build machine) it says so and succeeds. On the lent GPU
# machine use scripts/gpu-run.sh bench, which also writes the full-size model.
# Usage: bench/bench_gpu.sh MODEL_DIR [--runs P:G[@CTX],...] [--chunk C]
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "bench_gpu: no GPU here; skipped"
	exit 0
fi
if [ ! -x "$BUILD/bench/bench_gpu" ] || [ $# -lt 1 ]; then
	echo "bench_gpu: needs a CUDA build ($BUILD/bench/bench_gpu) and a MODEL_DIR; skipped"
	exit 0
fi
exec "$BUILD/bench/bench_gpu" "$@"
