#!/usr/bin/env bash
# bench_cpu.sh - CPU engine speed on the `small` preset of mkmodel (hidden
# 1024, 8 layers, vocab 16384): prefill and decode tokens/s, and the bf16
# GEMM's GFLOP/s with all threads against one thread. Informational.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SALAFW=${SALAFW:-$PWD/$BUILD/salafw}
D=$(mktemp -d "${TMPDIR:-/tmp}/salafw-bench.XXXXXX")
trap 'rm -rf "$D"' EXIT
echo "== bench_cpu: small preset, $(nproc) CPUs"
"$SALAFW" mkmodel --preset small --seed 1 -o "$D/small" >/dev/null || { echo "mkmodel small failed"; exit 1; }
SALAFW_DEVICE=cpu "$SALAFW" bench "$D/small" --prompt "${BENCH_PROMPT:-512}" --gen "${BENCH_GEN:-32}" --no-verify 2>/dev/null
# batched decode (runner/batch.h): aggregate tok/s at B = 1, 8, 32 (64-token contexts: the CPU
# prefill of 32 sequences dominates the wall time otherwise)
"$BUILD/bench/bench_batch" "$D/small" --device cpu --batch 1,8,32 --ctx 64 --gen "${BENCH_BATCH_GEN:-8}"
# prefill-sized (256 rows) and decode-sized (1 row) products of the small MLP
"$SALAFW" bench --gemm 256x2816x1024
"$SALAFW" bench --gemm 1x2816x1024
