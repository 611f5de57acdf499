/* linear_w8_mma.h - the int8 (W8A16) GEMM on tensor cores
 * (kernels/linear_w8_mma.cu), CUDA builds only; a part of the kernels
 * module's CUDA interface (kernels/ops_cuda.h), kept in its own header until
 * the engine calls it.
 *
 * Y [M, N] bf16 (row stride ldy) = X [M, K] bf16 (row stride ldx) · Wᵀ
 * (struct sfw_gemm_shape, kernels/ops.h), W the int8 layout of
 * num/w8_layout.h read in place (struct sfw_w8: codes [N, K] bytes, scales
 * [N, G] BF16/F16/F32, group 32, 64, 128, any multiple of 16, or <= 0 / K
 * for per channel): the weights uploaded for the GEMV serve as they are,
 * there is no repack. Meaning: sfw_op_matmul_w8_cpu (kernels/matmul_w8.c),
 * with each w = (b - 128) · scale (float32) rounded to bf16 once before the
 * tensor cores, fp32 accumulation, y rounded to bf16.
 *
 * silu = 1: W is the merged gate|up [2N, K] and Y [M, N] = silu(g) · u (g and
 * u rounded to bf16 first, as the decode GEMV's fused SiLU does).
 *
 * Calls with few tiles (small M, narrow N) split K over blocks; they need a
 * workspace of sfw_cuda_w8mma_ws_bytes(M, N, K, silu) bytes (0: none),
 * 256-byte aligned, zeroed once when allocated (the kernel leaves it zeroed;
 * one call at a time per workspace: calls on one stream share one). With a
 * smaller workspace the call splits less, with none it runs unsplit
 * (correct, slower at small M).
 *
 * sms: the device's multiprocessors (struct sfw_cuda_ctx's), which size the
 * split; 0 asks the runtime (a query per call: tests and benchmarks).
 *
 * sfw_cuda_gemm_w8_mma returns 1 when it launched, 0 when the call is not
 * one it takes (sfw_cuda_w8mma_ok: K and group multiples of 16, X and codes
 * 16-byte aligned, ldx a multiple of 8; the caller then keeps its old path).
 * Any M >= 1 is taken. Where it wins (H200, bench/RESULTS.md, group 128,
 * bench_w8gemm --sweep): the int8 GEMV stays faster at M <= 2; from M = 3
 * to 64 this kernel beats the GEMV and the dequantize-then-cuBLASLt path on
 * every shape of the model; from M = 128 the dequantize path is faster.
 * Against the bf16 cuBLASLt GEMM on the same shape it is faster to M = 16
 * on every shape (1.1-2.4x), to 32 on gate|up and K/V, and 0.5-0.9x of it
 * on 4096 x 4096 and down from 24 rows. */
#ifndef SFW_KERNELS_LINEAR_W8_MMA_H
#define SFW_KERNELS_LINEAR_W8_MMA_H

#include "kernels/ops.h" /* enum sfw_dtype */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int sfw_cuda_w8mma_ok(const void *X, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh);
size_t sfw_cuda_w8mma_ws_bytes(int M, int N, int K, int silu, int sms);
int sfw_cuda_gemm_w8_mma(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
			 const struct sfw_gemm_shape *sh, int silu, void *ws, size_t ws_bytes, void *stream,
			 int sms);

/* The kernel's tile configurations, for the sweep that chooses among them
 * (bench_w8gemm --sweep) and the test that checks each: cfg 0 ..
 * sfw_cuda_w8mma_ncfg() - 1, named by sfw_cuda_w8mma_cfg_name ("t4w2 1x4
 * s4 b1 fill": activation tiles of 8 rows and weight tiles of 16 rows per
 * warp, warps in M x N, stages, blocks per multiprocessor the registers are
 * held to, and the split of K sized to fill the device with blocks or to
 * put one on each multiprocessor); cfg -1 is the one the calls above take
 * for M. A configuration that
 * cannot do the call (sfw_cuda_w8mma_cfg_takes 0: the SiLU epilogue needs
 * an even number of weight tiles) returns 0 and needs no workspace. The
 * _cfg call asks the runtime for the multiprocessors (sms 0 above). */
int sfw_cuda_w8mma_ncfg(void);
const char *sfw_cuda_w8mma_cfg_name(int cfg);
int sfw_cuda_w8mma_cfg_takes(int cfg, int silu);
size_t sfw_cuda_w8mma_ws_bytes_cfg(int M, int N, int K, int silu, int sms, int cfg);
int sfw_cuda_gemm_w8_mma_cfg(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
			     const struct sfw_gemm_shape *sh, int silu, void *ws, size_t ws_bytes, void *stream,
			     int cfg);

#ifdef __cplusplus
}
#endif

#endif
