/* awq_cuda.h - the AWQ scale search's kernels (kernels/awq.cu; CUDA=1
 * builds), for quant/awq_cuda.c and tests/gpu_awq.c.
 *
 * Each launcher means its C twin bit for bit: the same IEEE products,
 * quotients and sums in the same order (explicit round-to-nearest
 * intrinsics, so nothing is contracted into an FMA), which makes every
 * loss of the GPU search equal to the CPU search's. The twins live with
 * the search (quant/quant_int.h: sfwi_awq_fake_rows, sfwi_awq_duo_sums,
 * sfwi_awq_sqerr_rows) or are the CPU ops (sfw_op_matmul_cpu with F32
 * weights, sfw_op_wget). Every pointer is device memory; matrices are
 * row-major; stream is a cudaStream_t. */
#ifndef SFW_AWQ_CUDA_H
#define SFW_AWQ_CUDA_H

#include "kernels/ops.h"

#include <stddef.h>
#include <stdint.h>

/* W[i] = w[i] as float for i < n (w bf16 bits or f32): sfw_op_wget. */
void sfw_cuda_awq_to_f32(float *W, const void *w, enum sfw_dtype wdt, size_t n, void *stream);

/* The duo statistic's sums over W [N, K] in groups of span columns:
 * gmax [N, ceil(K/span)] each row's group max |w|, then wm[k] = the sum
 * over rows r in order of |W[r, k]| / its group max (0 where that is 0).
 * Twin: sfwi_awq_duo_sums. */
void sfw_cuda_awq_duo(float *wm, float *gmax, const float *W, int N, int K, int span, void *stream);

/* Wq = Q(W diag s) diag(s)^-1 row by row, Q the int8 fake quantizer of
 * quant/w8_ref.c with `group` (> 0: that many columns; <= 0: per row).
 * *bad_row = the first row of W diag s holding a non-finite value, or
 * SFW_CUDA_AWQ_NO_BAD (that row's Wq is then unset). Twin: sfwi_awq_fake_rows. */
#define SFW_CUDA_AWQ_NO_BAD 0x7f7f7f7f
void sfw_cuda_awq_fake(float *Wq, int *bad_row, const float *W, const float *s, int N, int K, int group,
		       void *stream);

/* Y [M, N] = X [M, K] . W [N, K]^T in float32, summed as sfw_op_matmul_cpu
 * sums with F32 weights: eight lane sums over k = 8i + lane in i order,
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), then the K % 8 tail in
 * order. Twin: sfw_op_matmul_cpu(Y, X, W, SFW_DTYPE_F32, M, N, K). */
void sfw_cuda_awq_matmul(float *Y, const float *X, const float *W, int M, int N, int K, void *stream);

/* part[r] = the sum over n in order of (double(A[r, n]) - B[r, n])^2, in
 * double, for r < R (A, B [R, N]). Twin: sfwi_awq_sqerr_rows. */
void sfw_cuda_awq_sqerr_rows(double *part, const float *A, const float *B, int R, int N, void *stream);

#endif
