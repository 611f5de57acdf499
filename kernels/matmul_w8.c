/* matmul_w8.c - y = x . W^T with int8 pack-quantized weights (W8A16) on the
 * CPU, fp32 accumulation; layout: num/w8_layout.h.
 *
 * Decode (M <= 4) is memory-bound: threads split the weight rows, each row's
 * bytes are read once, widened to float 8 at a time and accumulated per
 * group, then multiplied by the group scale (one multiply per group per row,
 * no zero point). Prefill dequantizes a slab of rows into float scratch and
 * runs the float GEMM of kernels/matmul.c on it, so the int8 path inherits
 * its blocking; the dequantization is O(N K) against O(M N K). */
#include "kernels/ops.h"
#include "alloc.h"
#include "num/w8_layout.h"
#include "sfw.h"
#include "thread.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"

#define TILE_ROWS 16
#define SLAB_BYTES (16u << 20) /* float scratch per prefill slab */

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SFW_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define SFW_CLONES
#endif

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

struct w8_job {
	float *y;
	const float *x;
	const uint8_t *codes;
	const void *scales;
	enum sfw_dtype sdt;
	int group, M, N, K;
	int avx2;    /* decode: the AVX2 path is usable */
	float *slab; /* prefill: dequantized rows */
	int n0;      /* prefill: first row of the slab */
};

/* Decode: rows [n0, n1) for every x row (M <= 4), codes widened once. */
SFW_CLONES
static void gemv_rows(const struct w8_job *j, int n0, int n1)
{
	int K = j->K, M = j->M, span = j->group;
	size_t rb = (size_t)sfw_ql_row_bytes(K), G = (size_t)sfw_ql_ngroups(K, span < K ? span : 0);
	for (int n = n0; n < n1; n++) {
		const uint8_t *c = j->codes + (size_t)n * rb;
		float out[4] = {0, 0, 0, 0};
		for (size_t g = 0; g < G; g++) {
			int k0 = (int)g * span, k1 = k0 + span < K ? k0 + span : K, k = k0;
			v8 a[4] = {{0}, {0}, {0}, {0}};
			for (; k + 8 <= k1; k += 8) {
				v8 f = widen8(c + k);
				for (int m = 0; m < M; m++)
					a[m] += ld8(j->x + (size_t)m * K + k) * f;
			}
			float sc = scale_at(j->scales, j->sdt, (size_t)n * G + g);
			for (int m = 0; m < M; m++) {
				float s = hsum8(a[m]);
				for (int kk = k; kk < k1; kk++)
					s += j->x[(size_t)m * K + kk] * (float)sfw_ql_q(c[kk]);
				out[m] += s * sc;
			}
		}
		for (int m = 0; m < M; m++)
			j->y[(size_t)m * j->N + n] = out[m];
	}
}

/* Decode with one x row: two rows of W at a time, 16 codes per step, the
 * group scale applied once per group to a vector accumulator. */
SFW_CLONES
static void gemv1_rows(const struct w8_job *j, int n0, int n1)
{
	int K = j->K, span = j->group;
	size_t rb = (size_t)sfw_ql_row_bytes(K), G = (size_t)sfw_ql_ngroups(K, span < K ? span : 0);
	const float *x = j->x;
	for (int n = n0; n < n1; n++) {
		const uint8_t *c = j->codes + (size_t)n * rb;
		v8 tot = {0};
		float tail = 0;
		for (size_t g = 0; g < G; g++) {
			int k0 = (int)g * span, k1 = k0 + span < K ? k0 + span : K, k = k0;
			v8 a0 = {0}, a1 = {0};
			for (; k + 16 <= k1; k += 16) {
				a0 += ld8(x + k) * widen8(c + k);
				a1 += ld8(x + k + 8) * widen8(c + k + 8);
			}
			for (; k + 8 <= k1; k += 8)
				a0 += ld8(x + k) * widen8(c + k);
			float sc = scale_at(j->scales, j->sdt, (size_t)n * G + g), t = 0;
			for (; k < k1; k++)
				t += x[k] * (float)sfw_ql_q(c[k]);
			tot += (a0 + a1) * sc;
			tail += t * sc;
		}
		j->y[n] = hsum8(tot) + tail;
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* GCC widens uint8 vectors element by element; AVX2 does it in one
 * instruction: b ^ 0x80 is q as int8, then sign-extend and convert. */
__attribute__((target("avx2,fma"))) static void gemv1_rows_avx2(const struct w8_job *j, int n0, int n1)
{
	int K = j->K, span = j->group;
	size_t rb = (size_t)sfw_ql_row_bytes(K), G = (size_t)sfw_ql_ngroups(K, span < K ? span : 0);
	const float *x = j->x;
	const __m128i flip = _mm_set1_epi8((char)0x80);
	for (int n = n0; n < n1; n++) {
		const uint8_t *c = j->codes + (size_t)n * rb;
		__m256 tot = _mm256_setzero_ps();
		float tail = 0;
		for (size_t g = 0; g < G; g++) {
			int k0 = (int)g * span, k1 = k0 + span < K ? k0 + span : K, k = k0;
			__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
			for (; k + 16 <= k1; k += 16) {
				__m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(c + k)), flip);
				__m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
				__m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
				a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), f0, a0);
				a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), f1, a1);
			}
			for (; k + 8 <= k1; k += 8) {
				__m128i b = _mm_xor_si128(_mm_loadl_epi64((const __m128i *)(c + k)), flip);
				a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), a0);
			}
			float sc = scale_at(j->scales, j->sdt, (size_t)n * G + g), t = 0;
			for (; k < k1; k++)
				t += x[k] * (float)sfw_ql_q(c[k]);
			tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(sc), tot);
			tail += t * sc;
		}
		__m128 h = _mm_add_ps(_mm256_castps256_ps128(tot), _mm256_extractf128_ps(tot, 1));
		h = _mm_add_ps(h, _mm_movehl_ps(h, h));
		h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
		j->y[n] = _mm_cvtss_f32(h) + tail;
	}
}
#endif

static void gemv_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	(void)tid;
	int n0 = (int)b * TILE_ROWS, n1 = (int)e * TILE_ROWS < j->N ? (int)e * TILE_ROWS : j->N;
#ifdef HAVE_AVX2_PATH
	if (j->M == 1 && j->avx2) {
		gemv1_rows_avx2(j, n0, n1);
		return;
	}
#endif
	if (j->M == 1)
		gemv1_rows(j, n0, n1);
	else
		gemv_rows(j, n0, n1);
}

/* Prefill: dequantize rows [n0 + b, n0 + e) of the slab. */
SFW_CLONES
static void dequant_fn(void *ctx, size_t b, size_t e, int tid)
{
	const struct w8_job *j = ctx;
	(void)tid;
	int K = j->K, span = j->group;
	size_t rb = (size_t)sfw_ql_row_bytes(K), G = (size_t)sfw_ql_ngroups(K, span < K ? span : 0);
	for (size_t r = b; r < e; r++) {
		size_t n = (size_t)j->n0 + r;
		const uint8_t *c = j->codes + n * rb;
		float *o = j->slab + r * (size_t)K;
		for (size_t g = 0; g < G; g++) {
			int k0 = (int)g * span, k1 = k0 + span < K ? k0 + span : K;
			float sc = scale_at(j->scales, j->sdt, n * G + g);
			for (int k = k0; k < k1; k++)
				o[k] = (float)sfw_ql_q(c[k]) * sc;
		}
	}
}

void sfw_op_matmul_w8_cpu(float *y, const float *x, const uint8_t *codes, const void *scales, enum sfw_dtype sdt,
			  int group, int M, int N, int K)
{
	if (M <= 0 || N <= 0)
		return;
	if (group <= 0 || group > K)
		group = K; /* per-channel */
	int nt = sfw_ops_cpu_threads();
	struct w8_job j = {y, x, codes, scales, sdt, group, M, N, K, 0, NULL, 0};
#ifdef HAVE_AVX2_PATH
	j.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
	if (M <= 4) {
		size_t ntiles = ((size_t)N + TILE_ROWS - 1) / TILE_ROWS;
		if ((size_t)nt > ntiles)
			nt = (int)ntiles;
		if ((double)M * N * K < 1 << 16)
			nt = 1;
		size_t grain = ntiles / ((size_t)nt * 4);
		sfwi_ops_cpu_for(nt, ntiles, grain < 1 ? 1 : grain, gemv_fn, &j);
		return;
	}
	int slab_rows = (int)(SLAB_BYTES / ((size_t)K * sizeof(float)));
	slab_rows = slab_rows < TILE_ROWS ? TILE_ROWS : slab_rows / TILE_ROWS * TILE_ROWS;
	if (slab_rows > N)
		slab_rows = N;
	j.slab = sfw_malloc((size_t)slab_rows * K * sizeof(float));
	float *tmp = sfw_malloc((size_t)M * slab_rows * sizeof(float));
	if (!j.slab || !tmp) {
		sfw_free(j.slab), sfw_free(tmp);
		sfwi_ops_cpu_fail();
		return;
	}
	for (int n0 = 0; n0 < N; n0 += slab_rows) {
		int nb = N - n0 < slab_rows ? N - n0 : slab_rows;
		j.n0 = n0;
		sfwi_ops_cpu_for(nt, (size_t)nb, 4, dequant_fn, &j);
		sfw_op_matmul_cpu(tmp, x, j.slab, SFW_DTYPE_F32, M, nb, K);
		for (int m = 0; m < M; m++)
			memcpy(y + (size_t)m * N + n0, tmp + (size_t)m * nb, (size_t)nb * sizeof(float));
	}
	sfw_free(j.slab);
	sfw_free(tmp);
}

void sfw_op_matmul_silu_w8_cpu(float *y, const float *x, const uint8_t *codes, const void *scales,
			       enum sfw_dtype sdt, int group, int N, int K)
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
