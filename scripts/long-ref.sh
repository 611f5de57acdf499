#!/usr/bin/env bash
# long-ref.sh - run HERE: the CPU side of tests/gpu_long.c for a long prompt
# (default 262144 tokens, the issue's 256K test), written to
# tests/data/gpu_long/long-N.ref (committed: ~21 KB) so the GPU machine only
# runs the CUDA side (scripts/device-prep.sh packs it; gpu-run.sh tests passes
# it to gpu_long). Remake it when the CPU engine's numbers change.
# Usage: scripts/long-ref.sh [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-262144}
BUILD=${BUILD:-build-cuda}
make CUDA=1 CUDA_ARCH="${CUDA_ARCH:-sm_90}" BUILD="$BUILD" -j2 "$BUILD/tests/gpu_long" >/dev/null
mkdir -p tests/data/gpu_long
GPU_LONG_TOKENS=$N GPU_LONG_WRITE_REF=tests/data/gpu_long/long-$N.ref "$BUILD/tests/gpu_long"
