/* matmul.c - y = x . W^T on the CPU, W bf16 or f32 [N, K], fp32 accumulation.
 *
 * Threads split the output columns (weight rows) into tiles of TILE_N; each
 * thread converts its tile of W to float once into a private scratch and
 * then runs every row of x against it with a 2x4 register block. The inner
 * loops use 8-wide vectors, built for AVX2 as well where the CPU has it
 * (SFW_CLONES, core/simd.h: the same bits either way). */
#include "kernels/ops.h"
#include "alloc.h"
#include "sfw.h"
#include "simd.h"
#include "thread.h"

#include <string.h>

#define TILE_N 16
#define BLOCK_M 64 /* rows of x kept hot while a W tile is used */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 ld8(const float *p)
{
	v8 v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline float hsum8(v8 v)
{
	return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* y[m, n] for m in [m0, m1), n in [0, nb): x rows of length K, w rows of length K (float). */
SFW_CLONES
static void block_kernel(float *y, size_t ldy, const float *x, size_t m0, size_t m1, const float *w, int nb,
			 int K)
{
	int K8 = K & ~7;
	size_t m = m0;
	for (; m + 2 <= m1; m += 2) {
		const float *x0 = x + m * (size_t)K, *x1 = x0 + K;
		int n = 0;
		for (; n + 4 <= nb; n += 4) {
			const float *w0 = w + (size_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
			v8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
			for (int k = 0; k < K8; k += 8) {
				v8 p = ld8(x0 + k), q = ld8(x1 + k);
				v8 b0 = ld8(w0 + k), b1 = ld8(w1 + k), b2 = ld8(w2 + k), b3 = ld8(w3 + k);
				a00 += p * b0, a01 += p * b1, a02 += p * b2, a03 += p * b3;
				a10 += q * b0, a11 += q * b1, a12 += q * b2, a13 += q * b3;
			}
			float s[8] = {hsum8(a00), hsum8(a01), hsum8(a02), hsum8(a03),
				      hsum8(a10), hsum8(a11), hsum8(a12), hsum8(a13)};
			for (int k = K8; k < K; k++) {
				s[0] += x0[k] * w0[k], s[1] += x0[k] * w1[k], s[2] += x0[k] * w2[k], s[3] += x0[k] * w3[k];
				s[4] += x1[k] * w0[k], s[5] += x1[k] * w1[k], s[6] += x1[k] * w2[k], s[7] += x1[k] * w3[k];
			}
			memcpy(y + m * ldy + n, s, 4 * sizeof(float));
			memcpy(y + (m + 1) * ldy + n, s + 4, 4 * sizeof(float));
		}
		for (; n < nb; n++) {
			const float *w0 = w + (size_t)n * K;
			v8 a0 = {0}, a1 = {0};
			for (int k = 0; k < K8; k += 8) {
				v8 b = ld8(w0 + k);
				a0 += ld8(x0 + k) * b, a1 += ld8(x1 + k) * b;
			}
			float s0 = hsum8(a0), s1 = hsum8(a1);
			for (int k = K8; k < K; k++)
				s0 += x0[k] * w0[k], s1 += x1[k] * w0[k];
			y[m * ldy + n] = s0;
			y[(m + 1) * ldy + n] = s1;
		}
	}
	for (; m < m1; m++) {
		const float *x0 = x + m * (size_t)K;
		int n = 0;
		for (; n + 4 <= nb; n += 4) {
			const float *w0 = w + (size_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
			v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
			for (int k = 0; k < K8; k += 8) {
				v8 p = ld8(x0 + k);
				a0 += p * ld8(w0 + k), a1 += p * ld8(w1 + k), a2 += p * ld8(w2 + k), a3 += p * ld8(w3 + k);
			}
			float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
			for (int k = K8; k < K; k++)
				s[0] += x0[k] * w0[k], s[1] += x0[k] * w1[k], s[2] += x0[k] * w2[k], s[3] += x0[k] * w3[k];
			memcpy(y + m * ldy + n, s, sizeof(s));
		}
		for (; n < nb; n++) {
			const float *w0 = w + (size_t)n * K;
			v8 a = {0};
			for (int k = 0; k < K8; k += 8)
				a += ld8(x0 + k) * ld8(w0 + k);
			float s0 = hsum8(a);
			for (int k = K8; k < K; k++)
				s0 += x0[k] * w0[k];
			y[m * ldy + n] = s0;
		}
	}
}

SFW_CLONES
static void convert_bf16(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)src[i] << 16;
		memcpy(dst + i, &u, 4);
	}
}

typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

static inline v8 bf16x8(const uint16_t *p)
{
	v8h h;
	memcpy(&h, p, 16);
	v8u u = __builtin_convertvector(h, v8u) << 16;
	v8 f;
	memcpy(&f, &u, 32);
	return f;
}

/* Decode GEMV: y[n] = x . W[n] reading bf16 directly (no scratch), 4 rows at
 * a time. Each output is summed exactly as block_kernel sums it (one 8-wide
 * accumulator over k, hsum8, then the scalar tail in order), so a row of x
 * gets the same bits from either path: a row's result never depends on how
 * many rows share the call (batched decode, runner/batch.h). */
SFW_CLONES
static void gemv_bf16_rows(float *y, const float *x, const uint16_t *w, int n0, int n1, int K)
{
	int K8 = K & ~7;
	int n = n0;
	for (; n + 4 <= n1; n += 4) {
		const uint16_t *w0 = w + (size_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
		v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
		for (int k = 0; k < K8; k += 8) {
			v8 p = ld8(x + k);
			a0 += p * bf16x8(w0 + k), a1 += p * bf16x8(w1 + k), a2 += p * bf16x8(w2 + k),
				a3 += p * bf16x8(w3 + k);
		}
		float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
		for (int k = K8; k < K; k++) {
			float xk = x[k];
			s[0] += xk * sfw_bf16_to_f32(w0[k]), s[1] += xk * sfw_bf16_to_f32(w1[k]), s[2] += xk * sfw_bf16_to_f32(w2[k]),
				s[3] += xk * sfw_bf16_to_f32(w3[k]);
		}
		memcpy(y + n, s, sizeof(s));
	}
	for (; n < n1; n++) {
		const uint16_t *wr = w + (size_t)n * K;
		v8 a = {0};
		for (int k = 0; k < K8; k += 8)
			a += ld8(x + k) * bf16x8(wr + k);
		float s = hsum8(a);
		for (int k = K8; k < K; k++)
			s += x[k] * sfw_bf16_to_f32(wr[k]);
		y[n] = s;
	}
}

struct gemv_job {
	float *y;
	const float *x;
	const uint16_t *w;
	int M, N, K;
};

static void gemv_tiles(void *ctx, size_t b, size_t e, int tid)
{
	const struct gemv_job *j = ctx;
	(void)tid;
	int n0 = (int)b * TILE_N, n1 = (int)e * TILE_N < j->N ? (int)e * TILE_N : j->N;
	for (int m = 0; m < j->M; m++)
		gemv_bf16_rows(j->y + (size_t)m * j->N, j->x + (size_t)m * j->K, j->w, n0, n1, j->K);
}

struct mm_job {
	float *y;
	const float *x;
	const void *w;
	enum sfw_dtype wdt;
	int M, N, K;
	float **scratch; /* per thread TILE_N * K floats (bf16 weights only) */
};

static void mm_tiles(void *ctx, size_t b, size_t e, int tid)
{
	const struct mm_job *j = ctx;
	for (size_t t = b; t < e; t++) {
		int n0 = (int)t * TILE_N;
		int nb = j->N - n0 < TILE_N ? j->N - n0 : TILE_N;
		const float *wt;
		if (j->wdt == SFW_DTYPE_BF16) {
			convert_bf16(j->scratch[tid], (const uint16_t *)j->w + (size_t)n0 * j->K, (size_t)nb * j->K);
			wt = j->scratch[tid];
		} else {
			wt = (const float *)j->w + (size_t)n0 * j->K;
		}
		for (int m0 = 0; m0 < j->M; m0 += BLOCK_M) {
			int m1 = m0 + BLOCK_M < j->M ? m0 + BLOCK_M : j->M;
			block_kernel(j->y + n0, (size_t)j->N, j->x, (size_t)m0, (size_t)m1, wt, nb, j->K);
		}
	}
}

void sfw_op_matmul_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
		       int M, int N, int K)
{
	if (M <= 0 || N <= 0)
		return;
	size_t ntiles = ((size_t)N + TILE_N - 1) / TILE_N;
	int nt = sfw_ops_cpu_threads(ex);
	if ((size_t)nt > ntiles)
		nt = (int)ntiles;
	/* Tiny products are not worth waking threads for. */
	if ((double)M * N * K < 1 << 16)
		nt = 1;
	if (wdt == SFW_DTYPE_BF16 && M <= 2) {
		/* memory-bound: stream the bf16 weights once, no conversion scratch */
		struct gemv_job g = {y, x, w, M, N, K};
		size_t grain = ntiles / ((size_t)nt * 4);
		sfwi_ops_cpu_for(ex, nt, ntiles, grain < 1 ? 1 : grain, gemv_tiles, &g);
		return;
	}
	float *scr_ptrs[256];
	float *block = NULL;
	if (wdt == SFW_DTYPE_BF16) {
		block = sfw_malloc((size_t)nt * TILE_N * (size_t)K * sizeof(float) + 64);
		if (!block) {
			sfwi_ops_cpu_fail(ex);
			return;
		}
		for (int i = 0; i < nt; i++)
			scr_ptrs[i] = block + (size_t)i * TILE_N * K;
	}
	struct mm_job j = {y, x, w, wdt, M, N, K, scr_ptrs};
	size_t grain = ntiles / ((size_t)nt * 8);
	if (grain < 1)
		grain = 1;
	sfwi_ops_cpu_for(ex, nt, ntiles, grain, mm_tiles, &j);
	sfw_free(block);
}

void sfw_op_logits_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
		       const struct sfw_gemm_shape *sh, float in_scale)
{
	int M = sh->M, N = sh->N, K = sh->K;
	float *xs = sfw_malloc((size_t)M * K * sizeof(float));
	if (!xs) {
		sfwi_ops_cpu_fail(ex);
		return;
	}
	for (size_t i = 0; i < (size_t)M * K; i++)
		xs[i] = x[i] * in_scale;
	sfw_op_matmul_cpu(ex, y, xs, w, wdt, M, N, K);
	sfw_free(xs);
}
