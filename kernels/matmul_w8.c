/* matmul_w8.c - y = x . W^T with int8 pack-quantized weights (W8A16) on the
 * CPU, fp32 accumulation; layout: quant/layout.h.
 *
 * One sum per output element, whatever M, the thread split or the code path
 * (batched decode needs a row's bits not to depend on the other rows of the
 * call: runner/batch.h; kernels/matmul.c does the same for bf16). With
 * q[k] = code - 128 as float (exact) and s_g the scale of group g:
 *   for each group g in order, from A = 0 (8 lanes) and t = 0:
 *     A = A + x[k..k+7] * q[k..k+7] over the group's whole 8-blocks in order,
 *     t = t + x[k] * q[k] over its last (< 8) elements in order;
 *   then T = T + A * s_g (8 lanes) and u = u + t * s_g, from T = 0, u = 0;
 *   y[m, n] = hsum8(T) + u, hsum8 the fixed pairwise tree of matmul.c.
 * Every product and sum is rounded on its own: no fused multiply-add
 * anywhere (the build is ISO C, -std=c11, in which GCC contracts nothing,
 * and the AVX2 code calls mul and add), so the AVX2 path and the generic
 * one give the same bits too, on one machine or across machines.
 *
 * Threads split the weight rows (tiles of TILE_ROWS); an output element is
 * always summed by one thread, whole. Two schedules of that one sum:
 *   - M <= STREAM_M (decode, memory-bound): codes streamed from the weight,
 *     four rows at a time, widened to float in registers (AVX2: one
 *     instruction per 8 codes), the x rows run against each quad;
 *   - larger M (prefill): each thread widens a tile of rows to float q once
 *     into its scratch, then a 2x4 register block of (x rows, W rows) runs
 *     over it, the scales applied per group as above. */
#include "kernels/ops.h"
#include "alloc.h"
#include "quant/layout.h"
#include "sfw.h"
#include "thread.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"

#define TILE_ROWS 16 /* weight rows per work item (a multiple of 4) */
#define BLOCK_M 64   /* x rows kept hot while a widened tile is used */
#define STREAM_M 4   /* at most this many x rows: the streaming schedule */

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SFW_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define SFW_CLONES
#endif

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13);
	} else if (exp != 0) {
		u = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		u = sign;
	} else {
		int e = -1;
		do {
			e++;
			man <<= 1;
		} while (!(man & 0x400));
		u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline float scale_at(const void *s, enum sfw_op_dtype sdt, size_t i)
{
	switch (sdt) {
	case SFW_OP_BF16:
		return sfw_op_bf16(((const uint16_t *)s)[i]);
	case SFW_OP_F16:
		return f16_to_f32(((const uint16_t *)s)[i]);
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

/* The group loop bounds: group g spans [k0, k1), whole 8-blocks up to k8. */
static inline void group_span(int g, int span, int K, int *k0, int *k8, int *k1)
{
	*k0 = g * span;
	*k1 = *k0 + span < K ? *k0 + span : K;
	*k8 = *k0 + ((*k1 - *k0) & ~7);
}

/* A[r] = sum over the 8-blocks of [k0, k8) of x * q(c[r]), r < 4: the
 * group's lane sums (the header's A), codes widened in registers. */
typedef void (*dot4_fn)(v8 *A, const float *x, const uint8_t *const *c, int k0, int k8);

SFW_CLONES
static void dot4(v8 *A, const float *x, const uint8_t *const *c, int k0, int k8)
{
	v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
	for (int k = k0; k < k8; k += 8) {
		v8 p = ld8(x + k);
		a0 += p * widen8(c[0] + k), a1 += p * widen8(c[1] + k), a2 += p * widen8(c[2] + k),
			a3 += p * widen8(c[3] + k);
	}
	A[0] = a0, A[1] = a1, A[2] = a2, A[3] = a3;
}

/* o[k] = q(c[k]) for k < K. */
typedef void (*widen_fn)(float *o, const uint8_t *c, int K);

SFW_CLONES
static void widen_row(float *o, const uint8_t *c, int K)
{
	for (int k = 0; k < K; k++)
		o[k] = (float)sfw_ql_q(c[k]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* GCC widens uint8 vectors element by element; AVX2 does it in one
 * instruction (zero-extend, convert, subtract the bias: exact). The sums are
 * dot4's, written with separate multiply and add. */
__attribute__((target("avx2"))) static inline __m256 widen8_avx2(const uint8_t *p)
{
	__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
	return _mm256_sub_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps((float)SFW_QL_BIAS));
}

__attribute__((target("avx2"))) static void dot4_avx2(v8 *A, const float *x, const uint8_t *const *c, int k0, int k8)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	const uint8_t *c0 = c[0], *c1 = c[1], *c2 = c[2], *c3 = c[3];
	for (int k = k0; k < k8; k += 8) {
		__m256 p = _mm256_loadu_ps(x + k);
		a0 = _mm256_add_ps(a0, _mm256_mul_ps(p, widen8_avx2(c0 + k)));
		a1 = _mm256_add_ps(a1, _mm256_mul_ps(p, widen8_avx2(c1 + k)));
		a2 = _mm256_add_ps(a2, _mm256_mul_ps(p, widen8_avx2(c2 + k)));
		a3 = _mm256_add_ps(a3, _mm256_mul_ps(p, widen8_avx2(c3 + k)));
	}
	A[0] = (v8)a0, A[1] = (v8)a1, A[2] = (v8)a2, A[3] = (v8)a3;
}

__attribute__((target("avx2"))) static void widen_row_avx2(float *o, const uint8_t *c, int K)
{
	int k = 0;
	for (; k + 8 <= K; k += 8)
		_mm256_storeu_ps(o + k, widen8_avx2(c + k));
	for (; k < K; k++)
		o[k] = (float)sfw_ql_q(c[k]);
}
#endif

/* Tests: this thread's calls take the generic path even where AVX2 is. */
static _Thread_local int force_generic;
void sfwi_op_matmul_w8_generic(int on)
{
	force_generic = on;
}

struct w8_job {
	float *y;
	const float *x;
	const uint8_t *codes;
	const void *scales;
	enum sfw_op_dtype sdt;
	int group, M, N, K, G;
	size_t rb;	/* bytes per code row */
	dot4_fn dot4;	/* streaming: the group's lane sums */
	widen_fn widen; /* tiles: a row of codes to float q */
	float *scratch; /* tiles: per thread TILE_ROWS * (K + G) floats */
};

/* Streaming: weight rows [n0, n1) against every x row, four rows at a time
 * (a short last quad repeats its last row and keeps only the rows it has). */
static void stream_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	(void)tid;
	int K = j->K, G = j->G, span = j->group;
	int n0 = (int)b * TILE_ROWS, n1 = (int)e * TILE_ROWS < j->N ? (int)e * TILE_ROWS : j->N;
	for (int n = n0; n < n1; n += 4) {
		int nr = n1 - n < 4 ? n1 - n : 4;
		const uint8_t *c[4];
		size_t row[4];
		for (int r = 0; r < 4; r++) {
			row[r] = (size_t)n + (size_t)(r < nr ? r : nr - 1);
			c[r] = j->codes + row[r] * j->rb;
		}
		for (int m = 0; m < j->M; m++) {
			const float *x = j->x + (size_t)m * K;
			v8 T[4] = {{0}, {0}, {0}, {0}};
			float u[4] = {0, 0, 0, 0};
			for (int g = 0; g < G; g++) {
				int k0, k8, k1;
				group_span(g, span, K, &k0, &k8, &k1);
				v8 A[4];
				j->dot4(A, x, c, k0, k8);
				for (int r = 0; r < 4; r++) {
					float s = scale_at(j->scales, j->sdt, row[r] * (size_t)G + (size_t)g), t = 0;
					for (int k = k8; k < k1; k++)
						t += x[k] * (float)sfw_ql_q(c[r][k]);
					T[r] += A[r] * s;
					u[r] += t * s;
				}
			}
			for (int r = 0; r < nr; r++)
				j->y[(size_t)m * j->N + (size_t)n + (size_t)r] = hsum8(T[r]) + u[r];
		}
	}
}

/* y[m, n0 + i] for m in [m0, m1), i < nb, from the widened tile w [nq, K]
 * (nq = nb rounded up to 4, the extra rows zero) and its scales sc [nq, G]:
 * 2 x 4 blocks, an odd last x row paired with itself and stored once. */
SFW_CLONES
static void tile_kernel(float *y, int N, const float *x, int m0, int m1, const float *w, const float *sc, int nb,
			int K, int G, int span)
{
	for (int m = m0; m < m1; m += 2) {
		const float *x0 = x + (size_t)m * K, *x1 = m + 1 < m1 ? x0 + K : x0;
		for (int i = 0; i < nb; i += 4) {
			const float *w0 = w + (size_t)i * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
			const float *s = sc + (size_t)i * G;
			v8 T[8] = {{0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
			float u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
			for (int g = 0; g < G; g++) {
				int k0, k8, k1;
				group_span(g, span, K, &k0, &k8, &k1);
				v8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
				for (int k = k0; k < k8; k += 8) {
					v8 p = ld8(x0 + k), q = ld8(x1 + k);
					v8 b0 = ld8(w0 + k), b1 = ld8(w1 + k), b2 = ld8(w2 + k), b3 = ld8(w3 + k);
					a00 += p * b0, a01 += p * b1, a02 += p * b2, a03 += p * b3;
					a10 += q * b0, a11 += q * b1, a12 += q * b2, a13 += q * b3;
				}
				float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
				for (int k = k8; k < k1; k++) {
					t[0] += x0[k] * w0[k], t[1] += x0[k] * w1[k], t[2] += x0[k] * w2[k], t[3] += x0[k] * w3[k];
					t[4] += x1[k] * w0[k], t[5] += x1[k] * w1[k], t[6] += x1[k] * w2[k], t[7] += x1[k] * w3[k];
				}
				float s0 = s[g], s1 = s[G + g], s2 = s[2 * G + g], s3 = s[3 * G + g];
				T[0] += a00 * s0, T[1] += a01 * s1, T[2] += a02 * s2, T[3] += a03 * s3;
				T[4] += a10 * s0, T[5] += a11 * s1, T[6] += a12 * s2, T[7] += a13 * s3;
				u[0] += t[0] * s0, u[1] += t[1] * s1, u[2] += t[2] * s2, u[3] += t[3] * s3;
				u[4] += t[4] * s0, u[5] += t[5] * s1, u[6] += t[6] * s2, u[7] += t[7] * s3;
			}
			int nr = nb - i < 4 ? nb - i : 4;
			for (int r = 0; r < nr; r++) {
				y[(size_t)m * N + (size_t)i + (size_t)r] = hsum8(T[r]) + u[r];
				if (m + 1 < m1)
					y[(size_t)(m + 1) * N + (size_t)i + (size_t)r] = hsum8(T[4 + r]) + u[4 + r];
			}
		}
	}
}

static void tiles_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	int K = j->K, G = j->G;
	float *w = j->scratch + (size_t)tid * TILE_ROWS * ((size_t)K + (size_t)G), *sc = w + (size_t)TILE_ROWS * K;
	for (size_t t = b; t < e; t++) {
		int n0 = (int)t * TILE_ROWS, nb = j->N - n0 < TILE_ROWS ? j->N - n0 : TILE_ROWS, nq = (nb + 3) & ~3;
		for (int i = 0; i < nb; i++) {
			size_t n = (size_t)n0 + (size_t)i;
			j->widen(w + (size_t)i * K, j->codes + n * j->rb, K);
			for (int g = 0; g < G; g++)
				sc[(size_t)i * G + (size_t)g] = scale_at(j->scales, j->sdt, n * (size_t)G + (size_t)g);
		}
		memset(w + (size_t)nb * K, 0, (size_t)(nq - nb) * K * sizeof(float));
		memset(sc + (size_t)nb * G, 0, (size_t)(nq - nb) * G * sizeof(float));
		for (int m0 = 0; m0 < j->M; m0 += BLOCK_M) {
			int m1 = m0 + BLOCK_M < j->M ? m0 + BLOCK_M : j->M;
			tile_kernel(j->y + n0, j->N, j->x, m0, m1, w, sc, nb, K, G, j->group);
		}
	}
}

void sfw_op_matmul_w8_cpu(float *y, const float *x, const uint8_t *codes, const void *scales, enum sfw_op_dtype sdt,
			  int group, int M, int N, int K)
{
	if (M <= 0 || N <= 0)
		return;
	if (group <= 0 || group > K)
		group = K; /* per-channel */
	struct w8_job j = {y, x, codes, scales, sdt, group, M, N, K, 0, 0, dot4, widen_row, NULL};
	j.G = (int)sfw_ql_ngroups(K, group < K ? group : 0);
	j.rb = (size_t)sfw_ql_row_bytes(K);
#ifdef HAVE_AVX2_PATH
	if (!force_generic && __builtin_cpu_supports("avx2"))
		j.dot4 = dot4_avx2, j.widen = widen_row_avx2;
#endif
	size_t ntiles = ((size_t)N + TILE_ROWS - 1) / TILE_ROWS;
	int nt = sfw_ops_cpu_threads();
	if ((size_t)nt > ntiles)
		nt = (int)ntiles;
	if ((double)M * N * K < 1 << 16)
		nt = 1;
	if (M <= STREAM_M) {
		size_t grain = ntiles / ((size_t)nt * 4);
		sfwi_ops_cpu_for(nt, ntiles, grain < 1 ? 1 : grain, stream_fn, &j);
		return;
	}
	j.scratch = sfw_malloc((size_t)nt * TILE_ROWS * ((size_t)K + (size_t)j.G) * sizeof(float));
	if (!j.scratch) {
		sfwi_ops_cpu_fail();
		return;
	}
	size_t grain = ntiles / ((size_t)nt * 8);
	sfwi_ops_cpu_for(nt, ntiles, grain < 1 ? 1 : grain, tiles_fn, &j);
	sfw_free(j.scratch);
}

void sfw_op_matmul_silu_w8_cpu(float *y, const float *x, const uint8_t *codes, const void *scales,
			       enum sfw_op_dtype sdt, int group, int N, int K)
{
	if (N <= 0)
		return;
	float *gu = sfw_malloc((size_t)2 * N * sizeof(float));
	if (!gu) {
		sfwi_ops_cpu_fail(); /* output undefined, the flag raised (ops.h) */
		return;
	}
	sfw_op_matmul_w8_cpu(gu, x, codes, scales, sdt, group, 1, 2 * N, K);
	sfw_op_silu_mul_cpu(y, gu, gu + N, (size_t)N);
	sfw_free(gu);
}
