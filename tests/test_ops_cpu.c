/* modules: kernels num core */
/* test_ops_cpu.c - each CPU op of kernels/ops.h against direct mathematics
 * (double-precision formulas written out here), plus hand-made cases for
 * compression, pooling and top-k ties. Tolerances: fp32 ops on O(1) data
 * accumulate ~1e-6 relative rounding per add; the bounds below are 1e-5
 * relative (1e-4 for the long GLA recurrences), far under any logic error. */
#include "alloc.h"
#include "check.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567;
static double urand(void) /* [-1, 1) */
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}
static void fill(float *x, size_t n, double s)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(urand() * s);
}
static double maxrel(const float *a, const double *b, size_t n)
{
	double m = 0, s = 1e-30;
	for (size_t i = 0; i < n; i++)
		if (fabs(b[i]) > s)
			s = fabs(b[i]);
	for (size_t i = 0; i < n; i++)
		if (fabs(a[i] - b[i]) > m)
			m = fabs(a[i] - b[i]);
	return m / s;
}

static void test_rmsnorm(void)
{
	enum { R = 5, N = 96 };
	float x[R * N], y[R * N];
	uint16_t w[N];
	double ref[R * N];
	fill(x, R * N, 3);
	for (int i = 0; i < N; i++)
		w[i] = sfw_f32_to_bf16((float)(1 + 0.1 * urand()));
	for (int r = 0; r < R; r++) {
		double ss = 0;
		for (int i = 0; i < N; i++)
			ss += (double)x[r * N + i] * x[r * N + i];
		double inv = 1 / sqrt(ss / N + 1e-6);
		for (int i = 0; i < N; i++)
			ref[r * N + i] = x[r * N + i] * inv * sfw_bf16_to_f32(w[i]);
	}
	sfw_op_rmsnorm_cpu(NULL, y, x, w, SFW_DTYPE_BF16, R, N, 1e-6f);
	CHECK(maxrel(y, ref, R * N) < 1e-5, "rmsnorm: rel err %.3g", maxrel(y, ref, R * N));
	sfw_op_rmsnorm_cpu(NULL, x, x, w, SFW_DTYPE_BF16, R, N, 1e-6f); /* in place */
	CHECK(memcmp(x, y, sizeof(y)) == 0, "rmsnorm in place equals out of place");
}

static void test_rope(void)
{
	enum { T = 6, NH = 3, HD = 32 };
	float x[T * NH * HD], x0[T * NH * HD];
	double ref[T * NH * HD];
	fill(x, T * NH * HD, 1);
	memcpy(x0, x, sizeof(x));
	int64_t pos0 = 1000;
	for (int t = 0; t < T; t++)
		for (int h = 0; h < NH; h++)
			for (int m = 0; m < HD / 2; m++) {
				/* rotate the pair (x_m, x_{m+HD/2}) by angle p * theta^(-2m/HD) */
				double a = (double)(pos0 + t) * pow(10000.0, -2.0 * m / HD);
				const float *v = x0 + (t * NH + h) * HD;
				ref[(t * NH + h) * HD + m] = v[m] * cos(a) - v[m + HD / 2] * sin(a);
				ref[(t * NH + h) * HD + m + HD / 2] = v[m + HD / 2] * cos(a) + v[m] * sin(a);
			}
	sfw_op_rope_neox_cpu(x, T, NH, HD, pos0, 10000.0f);
	/* angles up to ~1000 rad lose ~1000 * 2^-24 in float32 (as the reference) */
	CHECK(maxrel(x, ref, T * NH * HD) < 2e-4, "rope: rel err %.3g", maxrel(x, ref, T * NH * HD));
	memcpy(x, x0, sizeof(x));
	sfw_op_rope_neox_cpu(x, 1, NH, HD, 0, 10000.0f);
	CHECK(memcmp(x, x0, NH * HD * sizeof(float)) == 0, "rope at position 0 is the identity");
}

static void test_matmul(void)
{
	const int shapes[][3] = {{1, 37, 129}, {7, 53, 64}, {66, 129, 200}, {3, 16, 8}};
	for (int threads = 1; threads <= 3; threads += 2) {
		struct sfw_ops_cpu *ex = NULL;
		CHECK(sfw_ops_cpu_new(threads, &ex, NULL) == SFW_OK, "executor of %d threads", threads);
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
			float *x = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K);
			float *y = malloc(sizeof(float) * M * N), *y2 = malloc(sizeof(float) * M * N);
			uint16_t *wb = malloc(2 * (size_t)N * K);
			double *ref = malloc(sizeof(double) * M * N), *ref2 = malloc(sizeof(double) * M * N);
			fill(x, (size_t)M * K, 1);
			fill(wf, (size_t)N * K, 0.1);
			for (int i = 0; i < N * K; i++)
				wb[i] = sfw_f32_to_bf16(wf[i]);
			for (int m = 0; m < M; m++)
				for (int n = 0; n < N; n++) {
					double a = 0, b = 0;
					for (int k = 0; k < K; k++) {
						a += (double)x[m * K + k] * sfw_bf16_to_f32(wb[n * K + k]);
						b += (double)x[m * K + k] * wf[n * K + k];
					}
					ref[m * N + n] = a, ref2[m * N + n] = b * 0.25;
				}
			sfw_op_matmul_cpu(ex, y, x, wb, SFW_DTYPE_BF16, M, N, K);
			CHECK(maxrel(y, ref, (size_t)M * N) < 1e-5, "matmul bf16 %dx%dx%d threads %d: rel err %.3g", M, N,
			      K, threads, maxrel(y, ref, (size_t)M * N));
			struct sfw_gemm_shape gsh = {M, N, K, 0, 0};
			sfw_op_logits_cpu(ex, y2, x, wf, SFW_DTYPE_F32, &gsh, 0.25f);
			CHECK(maxrel(y2, ref2, (size_t)M * N) < 1e-5, "logits f32 %dx%dx%d: rel err %.3g", M, N, K,
			      maxrel(y2, ref2, (size_t)M * N));
			free(x), free(wf), free(y), free(y2), free(wb), free(ref), free(ref2);
		}
		sfw_ops_cpu_free(ex);
	}
}

static void test_elementwise(void)
{
	enum { N = 100 };
	float a[N], b[N], y[N], x[N];
	double r[N];
	fill(a, N, 6), fill(b, N, 2);
	sfw_op_silu_mul_cpu(y, a, b, N);
	for (int i = 0; i < N; i++)
		r[i] = a[i] / (1 + exp(-(double)a[i])) * b[i];
	CHECK(maxrel(y, r, N) < 1e-6, "silu_mul");
	sfw_op_sigmoid_mul_cpu(y, b, a, N);
	for (int i = 0; i < N; i++)
		r[i] = b[i] / (1 + exp(-(double)a[i]));
	CHECK(maxrel(y, r, N) < 1e-6, "sigmoid_mul");
	memcpy(x, a, sizeof(x));
	sfw_op_add_scaled_cpu(x, b, N, 0.7f);
	for (int i = 0; i < N; i++)
		r[i] = a[i] + 0.7 * b[i];
	CHECK(maxrel(x, r, N) < 1e-6, "add_scaled");
	uint16_t E[4 * 8];
	for (int i = 0; i < 32; i++)
		E[i] = sfw_f32_to_bf16((float)i);
	int32_t ids[2] = {3, 1};
	sfw_op_embed_cpu(y, E, SFW_DTYPE_BF16, ids, 2, 8, 12.0f);
	CHECK(y[0] == 24 * 12.0f && y[7] == 31 * 12.0f && y[8] == 8 * 12.0f, "embed picks rows and scales");
}

/* naive softmax attention in double over an explicit key mask */
static void naive_attn(double *o, const float *q, const float *kc, const float *vc, int T, int nh, int nkv, int hd,
		       int64_t pos0, float scale, const int32_t *idx, int k, int block)
{
	int group = nh / nkv;
	for (int r = 0; r < T; r++)
		for (int h = 0; h < nh; h++) {
			int g = h / group;
			int64_t p = pos0 + r;
			double mx = -1e300, sum = 0, *out = o + ((size_t)r * nh + h) * hd;
			double *s = malloc(sizeof(double) * (size_t)(p + 1));
			char *use = calloc((size_t)p + 1, 1);
			for (int64_t t = 0; t <= p; t++)
				use[t] = idx == NULL;
			if (idx)
				for (int j = 0; j < k; j++) {
					int32_t b = idx[((size_t)g * T + r) * k + j];
					for (int64_t t = (int64_t)b * block; b >= 0 && t < (int64_t)(b + 1) * block && t <= p; t++)
						use[t] = 1;
				}
			for (int64_t t = 0; t <= p; t++) {
				if (!use[t])
					continue;
				double d = 0;
				for (int c = 0; c < hd; c++)
					d += (double)q[((size_t)r * nh + h) * hd + c] * kc[((size_t)t * nkv + g) * hd + c];
				s[t] = d * scale;
				if (s[t] > mx)
					mx = s[t];
			}
			memset(out, 0, sizeof(double) * hd);
			for (int64_t t = 0; t <= p; t++) {
				if (!use[t])
					continue;
				double w = exp(s[t] - mx);
				sum += w;
				for (int c = 0; c < hd; c++)
					out[c] += w * vc[((size_t)t * nkv + g) * hd + c];
			}
			for (int c = 0; c < hd; c++)
				out[c] /= sum;
			free(s), free(use);
		}
}

static void test_attention(void)
{
	enum { T = 20, NH = 4, NKV = 2, HD = 16, P0 = 180, BLOCK = 64 };
	int L = P0 + T;
	float *q = malloc(sizeof(float) * T * NH * HD), *kc = malloc(sizeof(float) * L * NKV * HD);
	float *vc = malloc(sizeof(float) * L * NKV * HD), *o = malloc(sizeof(float) * T * NH * HD);
	float *o2 = malloc(sizeof(float) * T * NH * HD);
	double *ref = malloc(sizeof(double) * T * NH * HD);
	fill(q, T * NH * HD, 2), fill(kc, (size_t)L * NKV * HD, 2), fill(vc, (size_t)L * NKV * HD, 1);
	float scale = 1 / sqrtf(HD);
	struct sfw_attn_shape sh = {T, NH, NKV, HD, P0, scale, 4, BLOCK};
	sfw_op_attn_dense_cpu(NULL, o, q, kc, vc, &sh);
	naive_attn(ref, q, kc, vc, T, NH, NKV, HD, P0, scale, NULL, 0, 0);
	CHECK(maxrel(o, ref, T * NH * HD) < 1e-5, "dense attention: rel err %.3g", maxrel(o, ref, T * NH * HD));
	/* every block selected == dense */
	int32_t all[NKV * T * 4], some[NKV * T * 4];
	for (int i = 0; i < NKV * T; i++) {
		for (int j = 0; j < 4; j++)
			all[i * 4 + j] = j;
		some[i * 4 + 0] = 0, some[i * 4 + 1] = (i % 2) ? 1 : 2, some[i * 4 + 2] = 3, some[i * 4 + 3] = -1;
	}
	sfw_op_attn_sparse_cpu(NULL, o2, q, kc, vc, all, &sh);
	CHECK(maxrel(o2, ref, T * NH * HD) < 1e-5, "sparse attention with all blocks == dense");
	sfw_op_attn_sparse_cpu(NULL, o2, q, kc, vc, some, &sh);
	naive_attn(ref, q, kc, vc, T, NH, NKV, HD, P0, scale, some, 4, BLOCK);
	CHECK(maxrel(o2, ref, T * NH * HD) < 1e-5, "block-sparse attention vs masked softmax: rel err %.3g",
	      maxrel(o2, ref, T * NH * HD));
	free(q), free(kc), free(vc), free(o), free(o2), free(ref);
}

static void test_gla(void)
{
	enum { T = 200, NH = 3, HD = 16 };
	size_t n = (size_t)T * NH * HD;
	float *q = malloc(4 * n), *k = malloc(4 * n), *v = malloc(4 * n), *o1 = malloc(4 * n), *o2 = malloc(4 * n);
	float *o3 = malloc(4 * n);
	float S1[NH * HD * HD] = {0}, S2[NH * HD * HD] = {0}, S3[NH * HD * HD] = {0};
	double *ref = malloc(8 * n);
	float decay[NH] = {0.5f, 0.125f, 0.0078125f};
	fill(q, n, 1), fill(k, n, 1), fill(v, n, 1);
	float s = 0.25f;
	/* o_t = s * sum_{r<=t} gamma^(t-r) (q_t . k_r) v_r */
	for (int h = 0; h < NH; h++)
		for (int t = 0; t < T; t++)
			for (int c = 0; c < HD; c++) {
				double acc = 0;
				for (int r = 0; r <= t; r++) {
					double d = 0;
					for (int a = 0; a < HD; a++)
						d += (double)q[(t * NH + h) * HD + a] * k[(r * NH + h) * HD + a];
					acc += exp(-(double)decay[h] * (t - r)) * d * v[(r * NH + h) * HD + c];
				}
				ref[(t * NH + h) * HD + c] = s * acc;
			}
	struct sfw_gla_shape sh = {T, NH, HD, s, 64}, pre = {130, NH, HD, s, 64}, one = {1, NH, HD, s, 64};
	sfw_op_gla_recurrent_cpu(NULL, o1, q, k, v, S1, decay, &sh);
	sfw_op_gla_chunked_cpu(NULL, o2, q, k, v, S2, decay, &sh);
	CHECK(maxrel(o1, ref, n) < 1e-4, "gla recurrent vs formula: rel err %.3g", maxrel(o1, ref, n));
	CHECK(maxrel(o2, ref, n) < 1e-4, "gla chunked vs formula: rel err %.3g", maxrel(o2, ref, n));
	double sd[NH * HD * HD];
	for (int i = 0; i < NH * HD * HD; i++)
		sd[i] = S1[i];
	CHECK(maxrel(S2, sd, NH * HD * HD) < 1e-4, "gla chunked final state == recurrent");
	/* a prefix chunked, the rest recurrent token by token: the state carries */
	sfw_op_gla_chunked_cpu(NULL, o3, q, k, v, S3, decay, &pre);
	for (int t = 130; t < T; t++)
		sfw_op_gla_recurrent_cpu(NULL, o3 + (size_t)t * NH * HD, q + (size_t)t * NH * HD,
					 k + (size_t)t * NH * HD, v + (size_t)t * NH * HD, S3, decay, &one);
	CHECK(maxrel(o3, ref, n) < 1e-4, "gla chunked prefix + recurrent decode: rel err %.3g", maxrel(o3, ref, n));
	free(q), free(k), free(v), free(o1), free(o2), free(o3), free(ref);
}

static void test_compress(void)
{
	enum { L = 300, NKV = 2, HD = 2 };
	float *k = malloc(sizeof(float) * L * NKV * HD), c[32 * NKV * HD];
	for (int t = 0; t < L; t++)
		for (int i = 0; i < NKV * HD; i++)
			k[t * NKV * HD + i] = (float)t * (i + 1);
	/* level 1: n1 = (300-32)/16+1 = 17 chunks; chunk j = mean of t in [16j, 16j+31] = 16j + 15.5 */
	struct sfw_sel_shape sh = {.nkv = NKV, .hd = HD, .ksize = 32, .stride = 16};
	sfw_op_compress_cpu(c, k, 1, 0, 10, &sh, NULL);
	sfw_op_compress_cpu(c, k, 1, 10, 17, &sh, NULL); /* incremental */
	int ok = 1;
	for (int j = 0; j < 17; j++)
		for (int i = 0; i < NKV * HD; i++)
			ok &= fabsf(c[j * NKV * HD + i] - (16.0f * j + 15.5f) * (i + 1)) < 1e-3f;
	CHECK(ok, "level-1 compression means (incremental)");
	/* level 2: chunk j = mean of [64j, 64j+127] = 64j + 63.5 */
	sfw_op_compress_cpu(c, k, 2, 0, 3, &sh, NULL);
	ok = 1;
	for (int j = 0; j < 3; j++)
		ok &= fabsf(c[j * NKV * HD] - (64.0f * j + 63.5f)) < 1e-3f;
	CHECK(ok, "level-2 compression means");
	free(k);
}

/* The chunk counts of a cache length (sfw_nchunks) and the least length
 * with given counts (sfw_len_of_counts), against counting chunks and blocks
 * one by one: every length up to 3,000 at the model's sizes and at odd
 * ones, and count triples that no length has. */
static void test_counts(void)
{
	static const int sizes[][3] = {{32, 16, 64}, {5, 3, 7}, {8, 8, 8}};
	enum { MAXLEN = 3000 };
	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		int ks = sizes[z][0], st = sizes[z][1], blk = sizes[z][2];
		int counts_ok = 1, inverse_ok = 1, none_ok = 1;
		static int64_t c1[MAXLEN + 1], c2[MAXLEN + 1], cb[MAXLEN + 1];
		for (int64_t len = 0; len <= MAXLEN; len++) {
			int64_t n1 = 0, n2 = 0, nb = 0;
			for (int64_t j = 0; j * st + ks <= len; j++) /* chunk j: tokens j st .. j st + ks - 1 */
				n1++;
			for (int64_t j = 0; j * 4 * st + 4 * ks <= len; j++)
				n2++;
			for (int64_t b = 0; b * blk < len; b++)
				nb++;
			c1[len] = n1, c2[len] = n2, cb[len] = nb;
			counts_ok &= sfw_nchunks(len, ks, st) == n1 && sfw_nchunks(len, 4 * ks, 4 * st) == n2;
		}
		for (int64_t len = 0; len <= MAXLEN; len++) {
			/* the least length with len's counts: the first one scanning up */
			int64_t least[4] = {-1, -1, -1, -1}; /* levels 1; 1, 2; 1 + blocks; blocks */
			for (int64_t m = 0; m <= len; m++) {
				if (least[0] < 0 && c1[m] == c1[len])
					least[0] = m;
				if (least[1] < 0 && c1[m] == c1[len] && c2[m] == c2[len])
					least[1] = m;
				if (least[2] < 0 && c1[m] == c1[len] && cb[m] == cb[len])
					least[2] = m;
				if (least[3] < 0 && cb[m] == cb[len])
					least[3] = m;
			}
			inverse_ok &= sfw_len_of_counts(c1[len], 0, 0, ks, st, blk, 1, 0) == least[0] &&
				      sfw_len_of_counts(c1[len], c2[len], 0, ks, st, blk, 2, 0) == least[1] &&
				      sfw_len_of_counts(c1[len], 0, cb[len], ks, st, blk, 1, 1) == least[2] &&
				      sfw_len_of_counts(0, 0, cb[len], ks, st, blk, 0, 1) == least[3];
		}
		/* triples no length has: -1 exactly when the scan finds none */
		for (int64_t n1 = 0; n1 < 40; n1++)
			for (int64_t n2 = 0; n2 < 12; n2++) {
				int64_t first = -1;
				for (int64_t m = 0; m <= MAXLEN && first < 0; m++)
					if (c1[m] == n1 && c2[m] == n2)
						first = m;
				none_ok &= sfw_len_of_counts(n1, n2, 0, ks, st, blk, 2, 0) == first;
			}
		none_ok &= sfw_len_of_counts(-1, 0, 0, ks, st, blk, 1, 0) == -1 &&
			   sfw_len_of_counts(0, 0, -1, ks, st, blk, 0, 1) == -1;
		CHECK(counts_ok, "chunk counts (ksize %d, stride %d) of every length up to %d, as counted", ks, st, MAXLEN);
		CHECK(inverse_ok, "least length with a length's counts (ksize %d, stride %d, block %d), as scanned", ks, st,
		      blk);
		CHECK(none_ok, "counts no length has (ksize %d, stride %d): -1, as scanned", ks, st);
	}
}

/* Compressed keys paged into KV blocks (sfw_ckey_row): each chunk in the
 * block of its last token, no two chunks in one row; compression into a
 * permuted block table and stage 1 read through it give bit for bit what
 * the contiguous arrays give. */
static void test_ckey_pages(void)
{
	enum { L = 300, NB = 5, NKV = 2, HD = 8, T = 300, NH = 4 };
	const int shift = 6, B = 64, ksize = 32, stride = 16;
	const int32_t tab[NB] = {3, 0, 4, 1, 2};
	int64_t per = sfw_ckey_rows_per_block(shift, stride), n1 = (L - ksize) / stride + 1,
		n2 = (L - 4 * ksize) / (4 * stride) + 1;
	CHECK(per == B / stride + B / (4 * stride) && sfw_ckey_rows_per_block(5, 16) == 0 &&
		      sfw_ckey_rows_per_block(7, 16) == 10,
	      "rows per block: both levels' chunks ending in a block (%lld), 0 where a block is not 4 strides",
	      (long long)per);
	/* every chunk in the block holding its last token, each row used once */
	int used[NB * 16] = {0}, where_ok = 1, once = 1;
	for (int lv = 1; lv <= 2; lv++)
		for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++) {
			int64_t last = lv == 1 ? j * stride + ksize - 1 : j * 4 * stride + 4 * ksize - 1;
			int64_t r = sfw_ckey_row(tab, shift, ksize, stride, lv, j) + (lv == 2 ? B / stride : 0);
			where_ok &= r / per == tab[last / B];
			once &= r >= 0 && r < NB * per && used[r]++ == 0;
		}
	CHECK(where_ok && once, "paged compressed keys: each chunk in its last token's block, one row each");
	float *k = malloc(sizeof(float) * L * NKV * HD), *c1 = malloc(sizeof(float) * n1 * NKV * HD),
	      *c2 = malloc(sizeof(float) * n2 * NKV * HD), *pool = calloc((size_t)NB * per * NKV * HD, sizeof(float));
	float *q = malloc(sizeof(float) * T * NH * HD), *sa = malloc(sizeof(float) * NKV * T * n1),
	      *sb = malloc(sizeof(float) * NKV * T * n1);
	fill(k, (size_t)L * NKV * HD, 1), fill(q, (size_t)T * NH * HD, 2);
	struct sfw_sel_shape sh = {.T = T, .nh = NH, .nkv = NKV, .hd = HD, .pos0 = 0, .ksize = ksize,
				   .stride = stride, .scale = 1 / sqrtf(HD), .n1 = n1, .n2 = n2};
	struct sfw_pages pg = {tab, shift};
	float *p1 = pool, *p2 = pool + (size_t)(B / stride) * NKV * HD;
	sfw_op_compress_cpu(c1, k, 1, 0, n1, &sh, NULL), sfw_op_compress_cpu(c2, k, 2, 0, n2, &sh, NULL);
	sfw_op_compress_cpu(p1, k, 1, 0, 7, &sh, &pg), sfw_op_compress_cpu(p1, k, 1, 7, n1, &sh, &pg);
	sfw_op_compress_cpu(p2, k, 2, 0, n2, &sh, &pg);
	int same = 1;
	for (int lv = 1; lv <= 2; lv++)
		for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++)
			same &= !memcmp((lv == 1 ? p1 : p2) + sfw_ckey_row(tab, shift, ksize, stride, lv, j) * NKV * HD,
					(lv == 1 ? c1 : c2) + j * NKV * HD, sizeof(float) * NKV * HD);
	CHECK(same, "paged compression (incremental) = contiguous, bit for bit");
	sfw_op_stage1_cpu(NULL, sa, q, c1, c2, &sh, NULL);
	sfw_op_stage1_cpu(NULL, sb, q, p1, p2, &sh, &pg);
	CHECK(!memcmp(sa, sb, sizeof(float) * NKV * T * n1), "stage 1 over paged compressed keys = contiguous, bit for bit");
	free(k), free(c1), free(c2), free(pool), free(q), free(sa), free(sb);
}

static void test_stage1(void)
{
	/* nkv 2, group 2, hd 8, prompt of 300 rows at pos0 0 (only some rows checked) */
	enum { T = 300, NH = 4, NKV = 2, HD = 8, N1 = 17, N2 = 3 };
	float *q = malloc(sizeof(float) * T * NH * HD), c1[N1 * NKV * HD], c2[N2 * NKV * HD];
	float *sc = malloc(sizeof(float) * NKV * T * N1);
	fill(q, (size_t)T * NH * HD, 2), fill(c1, N1 * NKV * HD, 2), fill(c2, N2 * NKV * HD, 2);
	float scale = 1 / sqrtf(HD);
	struct sfw_sel_shape sh = {.T = T, .nh = NH, .nkv = NKV, .hd = HD, .pos0 = 0, .ksize = 32,
				   .stride = 16, .scale = scale, .n1 = N1, .n2 = N2};
	sfw_op_stage1_cpu(NULL, sc, q, c1, c2, &sh, NULL);
	int rows[] = {0, 31, 126, 127, 128, 191, 200, 299};
	double worst = 0;
	int vis_ok = 1;
	for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
		int r = rows[ri];
		for (int g = 0; g < NKV; g++) {
			for (int j = 0; j < N1; j++) {
				int visible = 16 * j + 31 <= r;
				double want = 0;
				for (int h = g * 2; h < g * 2 + 2 && visible; h++) {
					double lse = 0, mx = -1e300;
					int any = 0;
					for (int j2 = 0; j2 < N2; j2++)
						if (64 * j2 + 127 <= r) {
							double d = 0;
							for (int a = 0; a < HD; a++)
								d += (double)q[(r * NH + h) * HD + a] * c2[(j2 * NKV + g) * HD + a];
							d *= scale;
							lse += exp(d), any = 1;
							if (d > mx)
								mx = d;
						}
					double L2 = any ? log(lse) : -INFINITY;
					double d = 0;
					for (int a = 0; a < HD; a++)
						d += (double)q[(r * NH + h) * HD + a] * c1[(j * NKV + g) * HD + a];
					want += exp(d * scale - L2);
				}
				float got = sc[((size_t)g * T + r) * N1 + j];
				if (!visible)
					vis_ok &= got == 0;
				else if (isinf(want))
					vis_ok &= isinf(got);
				else if (fabs(got - want) / (fabs(want) + 1e-30) > worst)
					worst = fabs(got - want) / (fabs(want) + 1e-30);
			}
		}
	}
	CHECK(vis_ok, "stage 1: invisible chunks score 0, no level-2 chunk gives +inf");
	CHECK(worst < 1e-5, "stage 1 vs formula: rel err %.3g", worst);
	free(q), free(sc);
}

/* Top-k of one row (one group) at position p over nb blocks of 64. */
static void topk_row(int32_t *idx, const float *pooled, int64_t nb, int64_t p, int k)
{
	struct sfw_sel_shape sh = {.T = 1, .nkv = 1, .pos0 = p, .block = 64, .nblocks = nb, .topk = k};
	sfw_op_topk_blocks_cpu(NULL, idx, pooled, &sh);
}

static void test_pool_topk(void)
{
	/* one group, one row at position 640 (qb = 10), 11 blocks, level-1 chunks
	 * n1 = 39 (16j+31 <= 640). local_blocks 2 -> blocks 8, 9, 10 forced; block 0 forced. */
	enum { N1 = 39, NB = 12 };
	float s[N1], pooled[NB];
	for (int j = 0; j < N1; j++)
		s[j] = 0.01f * j;
	s[11] = 5.0f; /* chunk 11 = tokens 176..207: overlaps blocks 2 (4b+3) and 3 (4b-1) -> tie */
	s[22] = 3.0f; /* chunk 22: block 5 (4*5+2) only */
	struct sfw_sel_shape sh = {.T = 1, .nkv = 1, .pos0 = 640, .ksize = 32, .stride = 16, .block = 64,
				   .init_blocks = 1, .local_blocks = 2, .n1 = N1, .nblocks = NB};
	sfw_op_pool_blocks_cpu(pooled, s, &sh);
	CHECK(isinf(pooled[0]) && isinf(pooled[8]) && isinf(pooled[9]) && isinf(pooled[10]) && pooled[0] > 0,
	      "pool: init and local blocks forced to +inf");
	CHECK(pooled[2] == 5.0f && pooled[3] == 5.0f && pooled[5] == 3.0f, "pool: max over the overlapping chunks");
	CHECK(pooled[1] == s[7] && pooled[4] == s[19], "pool: window [4b-1, 4b+3]");
	CHECK(pooled[11] == -INFINITY || pooled[11] == s[38], "pool: block past the chunks");
	CHECK(isinf(pooled[11]) && pooled[11] < 0, "pool: no overlapping chunk -> -inf");

	/* top-k 6: 4 forced + the two best: blocks 2 and 3 tie at 5.0, block 5 is 3.0 -> {2, 3} win.
	 * top-k 5: 4 forced + one of the tie -> the lower index (2). */
	int32_t idx[8];
	topk_row(idx, pooled, NB, 640, 6);
	CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 3 && idx[3] == 8 && idx[4] == 9 && idx[5] == 10,
	      "topk: forced + best, ascending (%d %d %d %d %d %d)", idx[0], idx[1], idx[2], idx[3], idx[4], idx[5]);
	topk_row(idx, pooled, NB, 640, 5);
	CHECK(idx[1] == 2 && idx[2] == 8, "topk: a tie at the k-th rank goes to the lower block index");
	/* ties among plain values too */
	float flat[6] = {1, 1, 1, 1, 1, 1};
	topk_row(idx, flat, 6, 6 * 64 - 1, 3);
	CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2, "topk: all equal -> lowest indices");
	/* future blocks -> -1 after sorting; k > nblocks pads with -1 */
	float fut[4] = {INFINITY, 0.5f, 0.0f, -INFINITY}; /* row at position 70: qb = 1 */
	topk_row(idx, fut, 4, 70, 6);
	CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == -1 && idx[3] == -1 && idx[4] == -1 && idx[5] == -1,
	      "topk: future blocks and padding are -1 (%d %d %d %d %d %d)", idx[0], idx[1], idx[2], idx[3], idx[4],
	      idx[5]);
}

/* Batched decode (runner/batch.h) needs a row of x to get the same bits
 * whatever the other rows of the call: every M (the GEMV below 3 rows, the
 * blocked GEMM above, odd and even row counts) against M = 1, bit for bit,
 * with bf16 and f32 weights and a K that leaves a scalar tail. */
static void test_matmul_rows(void)
{
	enum { N = 45, K = 203, MMAX = 67 };
	float *x = malloc(sizeof(float) * MMAX * K), *wf = malloc(sizeof(float) * N * K);
	float *y = malloc(sizeof(float) * MMAX * N), *y1 = malloc(sizeof(float) * N);
	uint16_t *wb = malloc(2 * (size_t)N * K);
	fill(x, (size_t)MMAX * K, 1);
	fill(wf, (size_t)N * K, 0.1);
	for (int i = 0; i < N * K; i++)
		wb[i] = sfw_f32_to_bf16(wf[i]);
	struct sfw_ops_cpu *ex = NULL;
	CHECK(sfw_ops_cpu_new(3, &ex, NULL) == SFW_OK, "executor of 3 threads");
	const int Ms[] = {1, 2, 3, 4, 5, 8, 9, 16, 33, 64, 67};
	for (int d = 0; d < 2; d++) {
		const void *w = d ? (const void *)wf : (const void *)wb;
		enum sfw_dtype dt = d ? SFW_DTYPE_F32 : SFW_DTYPE_BF16;
		for (size_t s = 0; s < sizeof(Ms) / sizeof(Ms[0]); s++) {
			int M = Ms[s], bad = 0;
			sfw_op_matmul_cpu(ex, y, x, w, dt, M, N, K);
			for (int m = 0; m < M; m++) {
				sfw_op_matmul_cpu(ex, y1, x + (size_t)m * K, w, dt, 1, N, K);
				bad += memcmp(y1, y + (size_t)m * N, sizeof(float) * N) != 0;
			}
			CHECK(bad == 0, "matmul %s M=%d: %d rows differ from the same row alone", d ? "f32" : "bf16", M,
			      bad);
		}
	}
	sfw_ops_cpu_free(ex);
	free(x), free(wf), free(y), free(y1), free(wb);
}

/* The executor passed explicitly (kernels/ops.h): the ranges of a job run
 * with its job view, so an op or a parallel-for inside a job runs inline on
 * that range's thread (on ex itself it would wait for the pool its own job
 * holds) and a failure there reaches ex's flag; NULL runs serially and has
 * no flag (sfw_op_sample_cpu says -1). */
struct nest_job {
	struct sfw_ops_cpu *ex; /* the job view */
	const float *x;
	const uint16_t *w;
	float *y; /* [items, M, N] */
	int M, N, K, fail_at;
};

static void nest_items(void *ctx, size_t b, size_t e, int tid)
{
	const struct nest_job *j = ctx;
	(void)tid;
	for (size_t i = b; i < e; i++) {
		sfw_op_matmul_cpu(j->ex, j->y + i * (size_t)j->M * j->N, j->x, j->w, SFW_DTYPE_BF16, j->M,
				  j->N, j->K);
		if ((int)i == j->fail_at)
			sfwi_ops_cpu_fail(j->ex);
	}
}

static void test_executor(void)
{
	enum { M = 5, N = 64, K = 256, ITEMS = 6 }; /* M*N*K > 2^16: each product would use the threads */
	float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * ITEMS * M * N);
	float *ref = malloc(sizeof(float) * M * N);
	uint16_t *w = malloc(2 * (size_t)N * K);
	fill(x, (size_t)M * K, 1);
	for (int i = 0; i < N * K; i++)
		w[i] = sfw_f32_to_bf16((float)(urand() * 0.1));
	sfw_op_matmul_cpu(NULL, ref, x, w, SFW_DTYPE_BF16, M, N, K);
	struct sfw_ops_cpu *ex = NULL;
	CHECK(sfw_ops_cpu_new(3, &ex, NULL) == SFW_OK, "executor of 3 threads");
	struct sfw_ops_cpu *view = sfwi_ops_cpu_job(ex);
	CHECK(sfw_ops_cpu_threads(ex) == 3 && sfw_ops_cpu_threads(view) == 1 &&
		  sfw_ops_cpu_threads(NULL) == 1 && sfwi_ops_cpu_job(NULL) == NULL &&
		  sfwi_ops_cpu_job(view) == view,
	      "threads: 3 for the executor, 1 for its job view and for NULL");
	for (int fail = 0; fail < 2; fail++) {
		struct nest_job j = {view, x, w, y, M, N, K, fail ? 4 : -1};
		memset(y, 0, sizeof(float) * ITEMS * M * N);
		sfwi_ops_cpu_for(ex, 3, ITEMS, 1, nest_items,
				 &j); /* would hang if the nested products waited */
		int bad = 0;
		for (int i = 0; i < ITEMS; i++)
			bad += memcmp(y + (size_t)i * M * N, ref, sizeof(float) * M * N) != 0;
		CHECK(bad == 0,
		      "products inside a job (inline on the job view): %d of %d differ from the serial one",
		      bad, ITEMS);
		int f = sfw_ops_cpu_take_failure(ex);
		CHECK(f == fail && !sfw_ops_cpu_take_failure(ex),
		      "a failure inside a job %s the executor's flag (taken: %d), and the take clears it",
		      fail ? "raises" : "leaves alone", f);
	}
	sfwi_op_matmul_w8_generic(ex, 1);
	CHECK(sfwi_ops_cpu_w8_generic(ex) && sfwi_ops_cpu_w8_generic(view) && !sfwi_ops_cpu_w8_generic(NULL),
	      "the generic int8 path: an option of the executor, its job view's too, off for NULL");
	sfwi_op_matmul_w8_generic(ex, 0);
	CHECK(!sfw_ops_cpu_take_failure(NULL), "NULL has no flag: take_failure gives 0");
	/* the sampler's op without scratch: -1, and the flag when there is one */
	enum { V = 300 };
	float lg[V];
	fill(lg, V, 3);
	struct sfw_sample_adj adj = {7, 1, 1, 0.5f};
	struct sfw_op_sample_params sp = {
	    .temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .adj = &adj, .n_adj = 1};
	int32_t ok = sfw_op_sample_cpu(NULL, lg, V, &sp, 0.4);
	sfw_alloc_fail_after(1);
	int32_t a = sfw_op_sample_cpu(NULL, lg, V, &sp, 0.4);
	sfw_alloc_fail_after(1);
	int32_t b = sfw_op_sample_cpu(ex, lg, V, &sp, 0.4);
	sfw_alloc_fail_after(0);
	CHECK(ok >= 0 && ok < V && a == -1 && b == -1 && sfw_ops_cpu_take_failure(ex) == 1,
	      "sample without scratch: -1 (ids %d %d), the executor's flag raised", a, b);
	CHECK(sfw_op_sample_cpu(ex, lg, V, &sp, 0.4) == ok && !sfw_ops_cpu_take_failure(ex),
	      "sample with an executor: the same id as with NULL (%d), no flag", ok);
	sfw_ops_cpu_free(ex);
	free(x), free(y), free(ref), free(w);
}

int main(void)
{
	test_rmsnorm();
	test_rope();
	test_matmul();
	test_matmul_rows();
	test_executor();
	test_elementwise();
	test_attention();
	test_gla();
	test_compress();
	test_counts();
	test_stage1();
	test_ckey_pages();
	test_pool_topk();
	return CHECK_REPORT("test_ops_cpu");
}
