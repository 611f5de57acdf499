/* matmul_w8.c - y = x . W^T with int8 pack-quantized weights (W8A16) on the
 * CPU, fp32 accumulation; layout: num/w8_layout.h.
 *
 * One sum per output element, whatever M, the thread split or the code path
 * (batched decode needs a row's bits not to depend on the other rows of the
 * call: runner/batch.h; kernels/matmul.c does the same for bf16). With
 * w[k] = (float)(code - 128) * scale (the layout's dequantization, one
 * rounding) and K8 = K rounded down to 8:
 *   a0 = the sum over the even 8-blocks of [0, K8) (k = 0, 16, 32, ...),
 *   a1 = over the odd ones (k = 8, 24, ...), each lane-wise from 0 in
 *        ascending order, a = a + x[k..k+7] * w[k..k+7];
 *   y  = hsum8(a0 + a1), then y = y + x[k] * w[k] for k in [K8, K) in order;
 * hsum8 is the fixed pairwise tree of matmul.c. Every product and sum is
 * rounded on its own: no fused multiply-add in the sums (the build is ISO C,
 * -std=c11, in which GCC contracts nothing, and the AVX2 code calls mul and
 * add; its one fma forms w exactly), so the AVX2 path and the generic one
 * give the same bits too, on one machine or across machines
 * (tests/test_quant.c checks both on every machine that has AVX2).
 *
 * Threads split the weight rows (tiles of TILE_ROWS); an output element is
 * always summed by one thread, whole. Two schedules of that one sum:
 *   - M <= STREAM_M (decode, memory-bound): one weight row at a time, its
 *     codes streamed in order and dequantized in registers (AVX2: one
 *     instruction widens 8 codes), the chains a0 and a1 interleaved: one
 *     sequential stream per thread is what the hardware prefetcher keeps up
 *     with (four rows at once ran at half the speed);
 *   - larger M (prefill), or a group size that is not a multiple of 16:
 *     each thread dequantizes a tile of rows into its scratch once, then a
 *     2x4 register block of (x rows, W rows) runs over it, a0 over the even
 *     blocks, then a1 over the odd ones (two independent sums: which is
 *     formed first does not matter). */
#include "kernels/ops.h"
#include "alloc.h"
#include "num/w8_layout.h"
#include "sfw.h"
#include "simd.h"
#include "thread.h"

#include <string.h>

#define TILE_ROWS 16 /* weight rows per work item (a multiple of 4) */
#define BLOCK_M 64   /* x rows kept hot while a widened tile is used */
#define STREAM_M 4   /* at most this many x rows: the streaming schedule */

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));

static inline float scale_at(const void *s, enum sfw_dtype sdt, size_t i)
{
	switch (sdt) {
	case SFW_DTYPE_BF16:
		return sfw_bf16_to_f32(((const uint16_t *)s)[i]);
	case SFW_DTYPE_F16:
		return sfw_f16_to_f32(((const uint16_t *)s)[i]);
	default:
		return ((const float *)s)[i];
	}
}

static inline v8 widen8(const uint8_t *p)
{
	v8b b;
	memcpy(&b, p, 8);
	v8i i = __builtin_convertvector(b, v8i) - SFW_QL_BIAS;
	return __builtin_convertvector(i, v8);
}

static inline float hsum8(v8 v)
{
	return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline v8 ld8(const float *p)
{
	v8 v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* Rows [n0, n1) of W against x row m: y[m, n] = the header's sum (group g
 * spans [g * span, (g + 1) * span), span a multiple of 16 unless G = 1). */
struct w8_job;
typedef void (*rows_fn)(const struct w8_job *j, int m, int n0, int n1);
/* o[k] = w[k] for k < K (one row; scales s[s0 + k / span]). */
typedef void (*dequant_fn)(float *o, const uint8_t *c, const void *s, enum sfw_dtype sdt, size_t s0, int K,
			   int span);

struct w8_job {
	float *y;
	const float *x;
	const uint8_t *codes;
	const void *scales;
	enum sfw_dtype sdt;
	int group, M, N, K, G;
	size_t rb;	    /* bytes per code row */
	rows_fn rows;	    /* streaming: rows' sums */
	dequant_fn dequant; /* tiles: one row of w */
	float *scratch;	    /* tiles: per thread TILE_ROWS * K floats */
};

SFW_CLONES
static void rows_dot(const struct w8_job *j, int m, int n0, int n1)
{
	int K = j->K, G = j->G, span = j->group, K8 = K & ~7;
	const float *x = j->x + (size_t)m * K;
	for (int n = n0; n < n1; n++) {
		const uint8_t *c = j->codes + (size_t)n * j->rb;
		size_t s0 = (size_t)n * (size_t)G;
		v8 a0 = {0}, a1 = {0};
		int k = 0;
		for (int g = 0; g < G; g++) {
			int k1 = (g + 1) * span < K8 ? (g + 1) * span : K8;
			float sc = scale_at(j->scales, j->sdt, s0 + (size_t)g);
			for (; k + 16 <= k1; k += 16) {
				a0 += ld8(x + k) * (widen8(c + k) * sc);
				a1 += ld8(x + k + 8) * (widen8(c + k + 8) * sc);
			}
			if (k < k1) /* an odd count of 8-blocks (the last group only) */
				a0 += ld8(x + k) * (widen8(c + k) * sc), k += 8;
		}
		float y = hsum8(a0 + a1);
		for (k = K8; k < K; k++)
			y += x[k] *
			     ((float)sfw_ql_q(c[k]) * scale_at(j->scales, j->sdt, s0 + (size_t)(k / span)));
		j->y[(size_t)m * j->N + (size_t)n] = y;
	}
}

SFW_CLONES
static void dequant_row(float *o, const uint8_t *c, const void *s, enum sfw_dtype sdt, size_t s0, int K,
			int span)
{
	for (int k0 = 0, g = 0; k0 < K; k0 += span, g++) {
		int k1 = k0 + span < K ? k0 + span : K;
		float sc = scale_at(s, sdt, s0 + (size_t)g);
		for (int k = k0; k < k1; k++)
			o[k] = (float)sfw_ql_q(c[k]) * sc;
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* GCC widens uint8 vectors element by element; AVX2 does it in one
 * instruction. w = (b - 128) * s is formed as fma(b, s, -128 s): -128 s is
 * exact and the fma rounds the exact (b - 128) s once, so it is the same
 * float as the generic path's product (scales below 2^120, as every real
 * one), in one instruction. rows_dot_avx2 and dequant_row_avx2 are
 * rows_dot and dequant_row operation for operation otherwise. */
struct scale8 {
	__m256 s, bias; /* s and -128 s */
};

__attribute__((target("avx2,fma"))) static inline struct scale8 scale8_avx2(float s)
{
	struct scale8 r = {_mm256_set1_ps(s), _mm256_set1_ps(s * -(float)SFW_QL_BIAS)};
	return r;
}

__attribute__((target("avx2,fma"))) static inline __m256 dequant8_avx2(const uint8_t *p, struct scale8 sc)
{
	__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
	return _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), sc.s, sc.bias);
}

__attribute__((target("avx2,fma"))) static void rows_dot_avx2(const struct w8_job *j, int m, int n0, int n1)
{
	int K = j->K, G = j->G, span = j->group, K8 = K & ~7;
	const float *x = j->x + (size_t)m * K;
	for (int n = n0; n < n1; n++) {
		const uint8_t *c = j->codes + (size_t)n * j->rb;
		size_t s0 = (size_t)n * (size_t)G;
		__m256 a0 = _mm256_setzero_ps(), a1 = a0;
		int k = 0;
		for (int g = 0; g < G; g++) {
			int k1 = (g + 1) * span < K8 ? (g + 1) * span : K8;
			struct scale8 sc = scale8_avx2(scale_at(j->scales, j->sdt, s0 + (size_t)g));
			for (; k + 16 <= k1; k += 16) {
				a0 = _mm256_add_ps(
				    a0, _mm256_mul_ps(_mm256_loadu_ps(x + k), dequant8_avx2(c + k, sc)));
				a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(x + k + 8),
								     dequant8_avx2(c + k + 8, sc)));
			}
			if (k < k1)
				a0 = _mm256_add_ps(
				    a0, _mm256_mul_ps(_mm256_loadu_ps(x + k), dequant8_avx2(c + k, sc))),
				k += 8;
		}
		float y = hsum8((v8)_mm256_add_ps(a0, a1));
		for (k = K8; k < K; k++)
			y += x[k] *
			     ((float)sfw_ql_q(c[k]) * scale_at(j->scales, j->sdt, s0 + (size_t)(k / span)));
		j->y[(size_t)m * j->N + (size_t)n] = y;
	}
}

__attribute__((target("avx2,fma"))) static void
dequant_row_avx2(float *o, const uint8_t *c, const void *s, enum sfw_dtype sdt, size_t s0, int K, int span)
{
	for (int k0 = 0, g = 0; k0 < K; k0 += span, g++) {
		int k1 = k0 + span < K ? k0 + span : K, k = k0;
		float scf = scale_at(s, sdt, s0 + (size_t)g);
		struct scale8 sc = scale8_avx2(scf);
		for (; k + 8 <= k1; k += 8)
			_mm256_storeu_ps(o + k, dequant8_avx2(c + k, sc));
		for (; k < k1; k++)
			o[k] = (float)sfw_ql_q(c[k]) * scf;
	}
}
#endif

/* Streaming: tiles [b, e) of weight rows, each against every x row. */
static void stream_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	(void)tid;
	for (size_t t = b; t < e; t++) {
		int n0 = (int)t * TILE_ROWS, n1 = n0 + TILE_ROWS < j->N ? n0 + TILE_ROWS : j->N;
		for (int m = 0; m < j->M; m++)
			j->rows(j, m, n0, n1);
	}
}

/* One chain (a0: k from K0 = 0, a1: from K0 = 8) of the 2 x 4 block of x
 * rows x0, x1 and tile rows w0.. w0 + 3K: the 8-blocks k0, k0 + 16, ... < K8. */
static inline void block_chain(v8 *a, const float *x0, const float *x1, const float *w0, int K, int k, int K8)
{
	const float *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
	v8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
	for (; k + 8 <= K8; k += 16) {
		v8 p = ld8(x0 + k), q = ld8(x1 + k);
		v8 b0 = ld8(w0 + k), b1 = ld8(w1 + k), b2 = ld8(w2 + k), b3 = ld8(w3 + k);
		a00 += p * b0, a01 += p * b1, a02 += p * b2, a03 += p * b3;
		a10 += q * b0, a11 += q * b1, a12 += q * b2, a13 += q * b3;
	}
	a[0] = a00, a[1] = a01, a[2] = a02, a[3] = a03, a[4] = a10, a[5] = a11, a[6] = a12, a[7] = a13;
}

/* y[m, i] for m in [m0, m1), i < nb, from the dequantized tile w [nq, K]
 * (nq = nb rounded up to 4, the extra rows zero): 2 x 4 blocks, an odd last
 * x row paired with itself and stored once. */
SFW_CLONES
static void tile_kernel(float *y, int N, const float *x, int m0, int m1, const float *w, int nb, int K)
{
	int K8 = K & ~7;
	for (int m = m0; m < m1; m += 2) {
		const float *x0 = x + (size_t)m * K, *x1 = m + 1 < m1 ? x0 + K : x0;
		for (int i = 0; i < nb; i += 4) {
			const float *w0 = w + (size_t)i * K;
			v8 a0[8], a1[8];
			block_chain(a0, x0, x1, w0, K, 0, K8);
			block_chain(a1, x0, x1, w0, K, 8, K8);
			int nr = nb - i < 4 ? nb - i : 4;
			for (int e = 0; e < 8; e++) {
				if ((e & 3) >= nr || (e >= 4 && m + 1 >= m1))
					continue;
				const float *xe = e < 4 ? x0 : x1, *we = w0 + (size_t)(e & 3) * K;
				float s = hsum8(a0[e] + a1[e]);
				for (int k = K8; k < K; k++)
					s += xe[k] * we[k];
				y[(size_t)(m + (e >> 2)) * N + (size_t)i + (size_t)(e & 3)] = s;
			}
		}
	}
}

static void tiles_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	int K = j->K;
	float *w = j->scratch + (size_t)tid * TILE_ROWS * K;
	for (size_t t = b; t < e; t++) {
		int n0 = (int)t * TILE_ROWS, nb = j->N - n0 < TILE_ROWS ? j->N - n0 : TILE_ROWS,
		    nq = (nb + 3) & ~3;
		for (int i = 0; i < nb; i++) {
			size_t n = (size_t)n0 + (size_t)i;
			j->dequant(w + (size_t)i * K, j->codes + n * j->rb, j->scales, j->sdt,
				   n * (size_t)j->G, K, j->group);
		}
		memset(w + (size_t)nb * K, 0, (size_t)(nq - nb) * K * sizeof(float));
		for (int m0 = 0; m0 < j->M; m0 += BLOCK_M) {
			int m1 = m0 + BLOCK_M < j->M ? m0 + BLOCK_M : j->M;
			tile_kernel(j->y + n0, j->N, j->x, m0, m1, w, nb, K);
		}
	}
}

void sfw_op_matmul_w8_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	int group = w->group, M = sh->M, N = sh->N, K = sh->K;
	if (M <= 0 || N <= 0)
		return;
	if (group <= 0 || group > K)
		group = K; /* per-channel */
	struct w8_job j = {y, x, codes, scales, sdt, group, M, N, K, 0, 0, rows_dot, dequant_row, NULL};
	j.G = (int)sfw_ql_ngroups(K, group < K ? group : 0);
	j.rb = (size_t)sfw_ql_row_bytes(K);
#ifdef HAVE_AVX2_PATH
	if (!sfwi_ops_cpu_w8_generic(ex) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		j.rows = rows_dot_avx2, j.dequant = dequant_row_avx2;
#endif
	size_t ntiles = ((size_t)N + TILE_ROWS - 1) / TILE_ROWS;
	int nt = sfw_ops_cpu_threads(ex);
	if ((size_t)nt > ntiles)
		nt = (int)ntiles;
	if ((double)M * N * K < 1 << 16)
		nt = 1;
	if (M <= STREAM_M && (group % 16 == 0 || j.G == 1)) {
		size_t grain = ntiles / ((size_t)nt * 4);
		sfwi_ops_cpu_for(ex, nt, ntiles, grain < 1 ? 1 : grain, stream_fn, &j);
		return;
	}
	j.scratch = sfw_malloc((size_t)nt * TILE_ROWS * (size_t)K * sizeof(float));
	if (!j.scratch) {
		sfwi_ops_cpu_fail(ex);
		return;
	}
	size_t grain = ntiles / ((size_t)nt * 8);
	sfwi_ops_cpu_for(ex, nt, ntiles, grain < 1 ? 1 : grain, tiles_fn, &j);
	sfw_free(j.scratch);
}

void sfw_op_matmul_silu_w8_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const struct sfw_w8 *w, int N, int K)
{
	struct sfw_gemm_shape gsh = {1, 2 * N, K, 0, 0};
	if (N <= 0)
		return;
	float *gu = sfw_malloc((size_t)2 * N * sizeof(float));
	if (!gu) {
		sfwi_ops_cpu_fail(ex); /* output undefined, the flag raised (ops.h) */
		return;
	}
	sfw_op_matmul_w8_cpu(ex, gu, x, w, &gsh);
	sfw_op_silu_mul_cpu(y, gu, gu + N, (size_t)N);
	sfw_free(gu);
}
