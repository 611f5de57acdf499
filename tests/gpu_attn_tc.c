/* modules: kernels num core */
/* The tensor-core attention and stage-1 kernels (kernels/attn_tc*.cu) and the
 * CUDA-core ones they replace, both against the CPU twins (the law) on random
 * bf16 inputs, at many shapes: head dim 32/64/128, 4 and 16 heads per KV
 * group, T from 1 to 300, lengths crossing block and chunk boundaries, -1
 * entries anywhere in the block lists, unsorted lists, future blocks, the
 * diagonal block, rows with no level-2 chunk (infinite scores). The path is
 * chosen through SALAFW_CUDA_ATTN / SALAFW_CUDA_STAGE1 = simt | tc; the
 * default (unset) is checked to pick tensor cores for prefill-sized calls and
 * the CUDA-core kernels for small ones (bit-identical outputs).
 * Then both paths are timed on realistic prefill shapes (8192 query rows at
 * 128K context, 32 heads, 2 KV heads, 96 selected blocks) and compared with
 * each other there (the CPU would take minutes).
 *   gpu_attn_tc            everything
 *   gpu_attn_tc check      the CPU comparisons only
 *   gpu_attn_tc bench      the timings only */
#include "check.h"
#include "lib/compare.h"
#include "lib/gpu_mem.h"

#include "lib/rng.h"

#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void *g_s;
static struct sfw_cuda_ctx *g_cx; /* on g_s: what the ops run with */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t urand64(void)
{
	return sfwt_next(&rng);
}
static float urand(void)
{
	return sfwt_urand(&rng);
}

/* n random bf16 values: bits for the device, their floats for the CPU. */
static float *randbf(size_t n, float scale, uint16_t **bits)
{
	float *f = malloc((n ? n : 1) * sizeof(float));
	uint16_t *b = malloc((n ? n : 1) * 2);
	for (size_t i = 0; i < n; i++) {
		b[i] = sfw_f32_to_bf16(urand() * scale);
		f[i] = sfw_bf16_to_f32(b[i]);
	}
	*bits = b;
	return f;
}

static void *dalloc(size_t bytes)
{
	return sfwt_dalloc(bytes, g_s);
}

static void *up(const void *h, size_t bytes)
{
	return sfwt_up(h, bytes, g_s);
}

static float *down_bf(const void *d, size_t n)
{
	uint16_t *b = malloc((n ? n : 1) * 2);
	float *f = malloc((n ? n : 1) * 4);
	sfw_cuda_d2h(b, d, n * 2, g_s);
	sfw_cuda_sync(g_s);
	for (size_t i = 0; i < n; i++)
		f[i] = sfw_bf16_to_f32(b[i]);
	free(b);
	return f;
}

static float *down_f32(const void *d, size_t n)
{
	float *h = malloc((n ? n : 1) * 4);
	sfw_cuda_d2h(h, d, n * 4, g_s);
	sfw_cuda_sync(g_s);
	return h;
}

/* "simt", "tc", or NULL (the default, auto) for both choices */
static void set_mode(const char *m)
{
	g_cx->attn = g_cx->stage1 = !m ? 0 : !strcmp(m, "simt") ? 1 : 2;
}

/* NMSE and max|diff| against ref; equal infinities are skipped, any other
 * non-finite mismatch fails. Returns the NMSE. */
static double cmp(const char *path, const char *what, const float *got, const float *ref, size_t n,
		  double tol_nmse, double tol_maxrel)
{
	struct cmp_stats c = cmp_stats(got, ref, n);
	double nmse = c.nmse, maxd = c.maxd, maxr = c.maxr;
	size_t bad = c.bad, first_bad = c.first_bad;
	printf("  %-4s %-58s NMSE %.2e  max|diff| %.2e  max|ref| %.2e\n", path, what, nmse, maxd, maxr);
	CHECK(bad == 0, "%s [%s]: %zu non-finite mismatches (first at %zu: got %g, ref %g)", what, path, bad,
	      first_bad, bad ? got[first_bad] : 0.0, bad ? ref[first_bad] : 0.0);
	CHECK(nmse <= tol_nmse, "%s [%s]: NMSE %.3e > %.1e", what, path, nmse, tol_nmse);
	CHECK(maxd <= tol_maxrel * (maxr > 0 ? maxr : 1), "%s [%s]: max|diff| %.3e > %.1e x %.3e", what, path,
	      maxd, tol_maxrel, maxr);
	return nmse;
}

/* bf16 outputs: one rounding of the output, P rounded to bf16 (tensor
 * cores), fp32 accumulation in another order. */
#define TOL_NMSE 3e-5
#define TOL_MAXREL 1.6e-2

/* A selection the way the engine makes one (CPU pool + top-k on random
 * scores), then disturbed: `holes` = every ~7th entry set to -1, `mess` =
 * some rows reversed (unsorted) and given a future block in a -1 slot. */
static int32_t *make_idx(int nkv, int T, int64_t pos0, int k, int block, int holes, int mess)
{
	int64_t L = pos0 + T, nblocks = (L + block - 1) / block;
	int64_t n1 = L >= 32 ? (L - 32) / 16 + 1 : 0;
	float *sc = malloc(((size_t)nkv * T * (n1 ? n1 : 1)) * 4);
	for (size_t i = 0; i < (size_t)nkv * T * n1; i++)
		sc[i] = urand() + 1.0f;
	float *pooled = malloc((size_t)nkv * T * nblocks * 4);
	struct sfw_sel_shape sh = {.T = T, .nkv = nkv, .pos0 = pos0, .ksize = 32, .stride = 16,
				   .block = block, .init_blocks = 1, .local_blocks = 32, .n1 = n1,
				   .nblocks = nblocks, .topk = k};
	sfw_op_pool_blocks_cpu(pooled, sc, &sh);
	int32_t *idx = malloc((size_t)nkv * T * k * 4);
	sfw_op_topk_blocks_cpu(NULL, idx, pooled, &sh);
	for (size_t row = 0; row < (size_t)nkv * T; row++) {
		int32_t *s = idx + row * k;
		if (holes)
			for (int i = 0; i < k; i++)
				if (urand64() % 7 == 0)
					s[i] = -1;
		if (mess && row % 3 == 1) {
			for (int i = 0; i < k / 2; i++) {
				int32_t t = s[i];
				s[i] = s[k - 1 - i], s[k - 1 - i] = t;
			}
			int64_t p = pos0 + (int64_t)(row % T), qb = p / block;
			for (int i = 0; i < k; i++)
				if (s[i] < 0) {
					s[i] = (int32_t)(qb + 1 +
							 (int64_t)(urand64() %
								   3)); /* past p: contributes nothing */
					break;
				}
		}
	}
	free(sc), free(pooled);
	return idx;
}

/* A paged copy of a [L, row] bf16 cache (kernels/ops_cuda.h, struct
 * sfw_pages): block b at place t[b] of a pool of 2 nb blocks, the
 * other blocks NaN. */
static void *paged_copy(const uint16_t *h, int64_t L, int row, const int32_t *t)
{
	int64_t nb = (L + 63) / 64;
	uint16_t *d = dalloc((size_t)2 * nb * 64 * row * 2);
	for (int64_t b = 0; b < nb; b++) {
		int64_t n = L - b * 64 < 64 ? L - b * 64 : 64;
		sfw_cuda_h2d(d + (size_t)t[b] * 64 * row, h + (size_t)b * 64 * row, (size_t)n * row * 2, g_s);
	}
	sfw_cuda_sync(g_s);
	return d;
}

static void t_attn(int sparse, int T, int64_t L, int nh, int nkv, int hd, int holes, int mess)
{
	int64_t pos0 = L - T;
	size_t nq = (size_t)T * nh * hd, nc = (size_t)L * nkv * hd;
	uint16_t *qb, *kb, *vb;
	float *q = randbf(nq, 1.0f, &qb), *kc = randbf(nc, 1.0f, &kb), *vc = randbf(nc, 1.0f, &vb);
	float *ref = malloc(nq * 4), scale = 1.0f / sqrtf((float)hd);
	int k = 96, block = 64;
	int32_t *idx = sparse ? make_idx(nkv, T, pos0, k, block, holes, mess) : NULL;
	struct sfw_attn_shape sh = {T, nh, nkv, hd, pos0, scale, k, block};
	if (sparse)
		sfw_op_attn_sparse_cpu(NULL, ref, q, kc, vc, idx, &sh);
	else
		sfw_op_attn_dense_cpu(NULL, ref, q, kc, vc, &sh);
	void *dq = up(qb, nq * 2), *dk = up(kb, nc * 2), *dv = up(vb, nc * 2);
	void *didx = sparse ? up(idx, (size_t)nkv * T * k * 4) : NULL;
	char name[128];
	snprintf(name, sizeof(name), "attn_%s T=%d L=%lld nh=%d nkv=%d hd=%d%s%s",
		 sparse ? "sparse" : "dense", T, (long long)L, nh, nkv, hd, holes ? " -1s" : "",
		 mess ? " unsorted+future" : "");
	/* the same cache paged: 64-token blocks shuffled in a pool */
	int32_t *tab = sfwt_block_table((L + 63) / 64, &rng);
	void *pk = paged_copy(kb, L, nkv * hd, tab), *pv = paged_copy(vb, L, nkv * hd, tab);
	int32_t *dtab = up(tab, (size_t)(L + 63) / 64 * sizeof(int32_t));
	struct sfw_pages pg = {dtab, 6};
	struct sfw_cuda_kv kv = {pk, pv, &pg, 0};
	free(tab);
	const char *modes[3] = {"simt", "tc", NULL};
	float *got[3];
	for (int m = 0; m < 3; m++) {
		set_mode(modes[m]);
		void *dout = dalloc(nq * 2);
		if (sparse)
			sfw_op_attn_sparse_cuda(dout, dq, dk, dv, didx, &sh, SFW_DTYPE_BF16, g_cx);
		else
			sfw_op_attn_dense_cuda(dout, dq, dk, dv, &sh, SFW_DTYPE_BF16, g_cx);
		got[m] = down_bf(dout, nq);
		if (m < 2)
			cmp(modes[m], name, got[m], ref, nq, TOL_NMSE, TOL_MAXREL);
		/* paged: the same kernels on the shuffled blocks, bit for bit */
		struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, sh.pos0)};
		if (sparse)
			sfw_cuda_attn_sparse(dout, dq, &kv, didx, &sh, &rr, SFW_DTYPE_BF16, g_cx);
		else
			sfw_cuda_attn_dense(dout, dq, &kv, &sh, &rr, SFW_DTYPE_BF16, g_cx);
		float *gp = down_bf(dout, nq);
		CHECK(memcmp(gp, got[m], nq * 4) == 0, "%s [%s]: paged cache = contiguous, bit for bit", name,
		      modes[m] ? modes[m] : "default");
		free(gp);
		sfw_cuda_free(dout);
	}
	sfw_cuda_free(pk), sfw_cuda_free(pv), sfw_cuda_free(dtab);
	/* the default: tensor cores from T >= 128 (attn_tc.cu), bit for bit */
	int want = T >= 128 ? 1 : 0;
	CHECK(memcmp(got[2], got[want], nq * 4) == 0, "%s: the default path is not the %s kernel", name,
	      modes[want]);
	set_mode(NULL);
	for (int m = 0; m < 3; m++)
		free(got[m]);
	free(q), free(kc), free(vc), free(qb), free(kb), free(vb), free(ref), free(idx);
	sfw_cuda_free(dq), sfw_cuda_free(dk), sfw_cuda_free(dv), sfw_cuda_free(didx);
}

static void t_stage1(int T, int64_t L, int nh, int nkv, int hd)
{
	int64_t pos0 = L - T;
	int64_t n1 = L >= 32 ? (L - 32) / 16 + 1 : 0, n2 = L >= 128 ? (L - 128) / 64 + 1 : 0;
	size_t nq = (size_t)T * nh * hd, ns = (size_t)nkv * T * n1;
	uint16_t *qb, *c1b, *c2b;
	float *q = randbf(nq, 1.0f, &qb), *c1 = randbf((size_t)n1 * nkv * hd, 1.0f, &c1b);
	float *c2 = randbf((size_t)(n2 ? n2 : 1) * nkv * hd, 1.0f, &c2b);
	float *ref = malloc(ns * 4), scale = 1.0f / sqrtf((float)hd);
	struct sfw_sel_shape sh = {.T = T, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = pos0, .ksize = 32,
				   .stride = 16, .scale = scale, .n1 = n1, .n2 = n2};
	sfw_op_stage1_cpu(NULL, ref, q, c1, c2, &sh, NULL);
	void *dq = up(qb, nq * 2), *d1 = up(c1b, (size_t)n1 * nkv * hd * 2);
	void *d2 = up(c2b, (size_t)(n2 ? n2 : 1) * nkv * hd * 2);
	char name[128];
	snprintf(name, sizeof(name), "stage1 T=%d L=%lld nh=%d nkv=%d hd=%d (n1=%lld n2=%lld)", T,
		 (long long)L, nh, nkv, hd, (long long)n1, (long long)n2);
	const char *modes[3] = {"simt", "tc", NULL};
	float *got[3];
	for (int m = 0; m < 3; m++) {
		set_mode(modes[m]);
		void *ds = dalloc(ns * 4);
		sfw_op_stage1_cuda(ds, dq, d1, d2, &sh, NULL, SFW_DTYPE_BF16, g_cx);
		got[m] = down_f32(ds, ns);
		sfw_cuda_free(ds);
		if (m < 2)
			cmp(modes[m], name, got[m], ref, ns, TOL_NMSE, TOL_MAXREL);
	}
	int want = T >= 64 || T <= 16 ? 1 : 0; /* attn_tc_stage1.cu: prefill-sized calls and decode rows */
	CHECK(memcmp(got[2], got[want], ns * 4) == 0, "%s: the default path is not the %s kernel", name,
	      modes[want]);
	set_mode(NULL);
	for (int m = 0; m < 3; m++)
		free(got[m]);
	free(q), free(c1), free(c2), free(qb), free(c1b), free(c2b), free(ref);
	sfw_cuda_free(dq), sfw_cuda_free(d1), sfw_cuda_free(d2);
}

static void checks(void)
{
	printf("attention: CUDA-core (simt) and tensor-core (tc) kernels vs the CPU twin, bf16\n");
	/* G = 16, hd 128 (the real model) */
	t_attn(1, 1, 20000, 32, 2, 128, 0, 0);
	t_attn(1, 5, 4100, 32, 2, 128, 1, 0);
	t_attn(1, 64, 13000, 32, 2, 128, 0, 1);
	t_attn(1, 299, 9000, 32, 2, 128, 1, 1);
	t_attn(1, 300, 2000, 32, 2, 128, 0, 0); /* L < 96 blocks: -1 tails from top-k */
	/* G = 4, hd 32 (the tiny test models), and G = 16 with hd 64 */
	t_attn(1, 1, 5000, 8, 2, 32, 0, 0);
	t_attn(1, 77, 1500, 8, 2, 32, 1, 1);
	t_attn(1, 300, 7000, 8, 2, 32, 1, 0);
	t_attn(1, 130, 3000, 16, 1, 64, 0, 1);
	/* dense */
	t_attn(0, 1, 7000, 32, 2, 128, 0, 0);
	t_attn(0, 45, 300, 32, 2, 128, 0, 0);
	t_attn(0, 299, 1000, 32, 2, 128, 0, 0);
	t_attn(0, 200, 200, 8, 2, 32, 0, 0);
	t_attn(0, 3, 64, 8, 2, 32, 0, 0);
	t_attn(0, 130, 129, 8, 2, 32, 0, 0);
	t_attn(0, 257, 4000, 16, 1, 64, 0, 0);
	printf("stage 1: CUDA-core (simt) and tensor-core (tc) kernels vs the CPU twin, bf16\n");
	t_stage1(1, 100000, 32, 2, 128);
	t_stage1(40, 9000, 32, 2, 128);
	t_stage1(299, 20000, 32, 2, 128);
	t_stage1(150, 1500, 8, 2, 32);
	t_stage1(100, 100, 8, 2, 32); /* no level-2 chunk: infinite scores */
	t_stage1(300, 300, 8, 2, 32); /* rows before and after the first level-2 chunk */
	t_stage1(77, 5000, 16, 1, 64);
	t_stage1(9, 1111, 32, 2, 128);
	/* decode rows (T <= 16: the split over the keys), and the first row count past them */
	t_stage1(1, 131072, 32, 2, 128);
	t_stage1(1, 100, 8, 2, 32);  /* no level-2 chunk */
	t_stage1(1, 129, 8, 2, 32);  /* one level-2 chunk */
	t_stage1(3, 700, 16, 1, 64); /* rows of different visibility */
	t_stage1(16, 50000, 32, 2, 128);
	t_stage1(17, 3000, 32, 2, 128);
}

/* ---- timings on realistic prefill shapes ---- */

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* The shape of a real selection: block 0, the 33 local blocks, and 62 more
 * past blocks, ascending, -1 past the end. `share` rows in a row share their
 * 62 picks (1: every row draws its own: the worst case for the tensor-core
 * kernel's block sharing between neighbouring rows). */
static int32_t *bench_idx(int nkv, int T, int64_t pos0, int k, int share)
{
	int32_t *idx = malloc((size_t)nkv * T * k * 4);
	int32_t picks[64];
	for (int g = 0; g < nkv; g++)
		for (int r = 0; r < T; r++) {
			int64_t qb = (pos0 + r) / 64;
			int32_t *s = idx + ((size_t)g * T + r) * k;
			int n = 0;
			s[n++] = 0;
			for (int64_t b = qb - 32 < 1 ? 1 : qb - 32; b <= qb; b++)
				s[n++] = (int32_t)b;
			int64_t lo = 1, hi = qb - 33; /* [lo, hi]: the blocks top-k ranks */
			if (r % share == 0)
				for (int i = 0; i < 62; i++)
					picks[i] = hi >= lo
						       ? (int32_t)(lo + (int64_t)(urand64() %
										  (uint64_t)(hi - lo + 1)))
						       : -1;
			for (int i = 0; i < 62 && n < k; i++) {
				int dup = picks[i] < 0;
				for (int j = 0; j < n && !dup; j++)
					dup = s[j] == picks[i];
				if (!dup)
					s[n++] = picks[i];
			}
			qsort(s, (size_t)n, sizeof(int32_t), cmp_i32);
			for (int i = n; i < k; i++)
				s[i] = -1;
		}
	return idx;
}

static float time_ms(void (*fn)(void *), void *ctx, int reps)
{
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	float best[9];
	fn(ctx); /* warm-up */
	for (int i = 0; i < reps; i++) {
		sfw_cuda_event_record(e0, g_s);
		fn(ctx);
		sfw_cuda_event_record(e1, g_s);
		best[i] = sfw_cuda_event_ms(e0, e1);
	}
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
	for (int i = 1; i < reps; i++) /* median */
		for (int j = i; j > 0 && best[j] < best[j - 1]; j--) {
			float t = best[j];
			best[j] = best[j - 1], best[j - 1] = t;
		}
	return best[reps / 2];
}

struct bench_attn {
	void *o, *q, *k, *v, *idx;
	int T, nh, nkv, hd, kk;
	int64_t pos0;
};
static void run_attn(void *ctx)
{
	struct bench_attn *b = ctx;
	float scale = 1.0f / sqrtf((float)b->hd);
	struct sfw_attn_shape sh = {b->T, b->nh, b->nkv, b->hd, b->pos0, scale, b->kk, 64};
	if (b->idx)
		sfw_op_attn_sparse_cuda(b->o, b->q, b->k, b->v, b->idx, &sh, SFW_DTYPE_BF16, g_cx);
	else
		sfw_op_attn_dense_cuda(b->o, b->q, b->k, b->v, &sh, SFW_DTYPE_BF16, g_cx);
}

static void bench_attn(int sparse, int T, int64_t L, int share)
{
	int nh = 32, nkv = 2, hd = 128, k = 96;
	int64_t pos0 = L - T;
	size_t nq = (size_t)T * nh * hd, nc = (size_t)L * nkv * hd;
	struct bench_attn b = {NULL, dalloc(nq * 2), dalloc(nc * 2), dalloc(nc * 2), NULL, T, nh, nkv, hd, k,
			       pos0};
	sfw_cuda_fill_bf16(b.q, nq, 1, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.k, nc, 2, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.v, nc, 3, 1.0f, g_s);
	double keys = 0; /* visible keys summed over rows (FLOPs = 4 hd nh keys) */
	int32_t *idx = NULL;
	if (sparse) {
		idx = bench_idx(nkv, T, pos0, k, share);
		b.idx = up(idx, (size_t)nkv * T * k * 4);
		for (int r = 0; r < T; r++)
			for (int i = 0; i < k; i++) {
				int32_t bl = idx[(size_t)r * k + i]; /* group 0 */
				if (bl >= 0)
					keys += (double)((int64_t)bl * 64 + 63 <= pos0 + r
							     ? 64
							     : pos0 + r - (int64_t)bl * 64 + 1);
			}
	} else {
		for (int r = 0; r < T; r++)
			keys += (double)(pos0 + r + 1);
	}
	double flop = 4.0 * hd * nh * keys;
	float ms[2];
	float *out[2];
	const char *modes[2] = {"simt", "tc"};
	for (int m = 0; m < 2; m++) {
		set_mode(modes[m]);
		b.o = dalloc(nq * 2);
		ms[m] = time_ms(run_attn, &b, 5);
		out[m] = down_bf(b.o, nq);
		sfw_cuda_free(b.o);
	}
	set_mode(NULL);
	char name[128];
	if (sparse)
		snprintf(name, sizeof(name),
			 "attn_sparse T=%d L=%lld nh=32 nkv=2 hd=128 k=96, picks shared by %d row%s", T,
			 (long long)L, share, share > 1 ? "s" : "");
	else
		snprintf(name, sizeof(name), "attn_dense T=%d L=%lld nh=32 nkv=2 hd=128", T, (long long)L);
	printf("  %s\n    simt %8.3f ms (%6.1f TFLOP/s)   tc %8.3f ms (%6.1f TFLOP/s)   speed-up %.2fx\n",
	       name, ms[0], flop / ms[0] * 1e-9, ms[1], flop / ms[1] * 1e-9, ms[0] / ms[1]);
	cmp("tc", "  ... tc against simt on that shape", out[1], out[0], nq, TOL_NMSE, TOL_MAXREL);
	free(out[0]), free(out[1]), free(idx);
	sfw_cuda_free(b.q), sfw_cuda_free(b.k), sfw_cuda_free(b.v), sfw_cuda_free(b.idx);
}

struct bench_s1 {
	void *s, *q, *c1, *c2;
	int64_t n1, n2, pos0;
	int T;
	const struct sfw_pages *pg; /* paged compressed keys, or NULL */
};
static void run_s1(void *ctx)
{
	struct bench_s1 *b = ctx;
	struct sfw_sel_shape sh = {.T = b->T, .nh = 32, .nkv = 2, .hd = 128, .pos0 = b->pos0, .ksize = 32,
				   .stride = 16, .scale = 1.0f / sqrtf(128.0f), .n1 = b->n1, .n2 = b->n2};
	sfw_op_stage1_cuda(b->s, b->q, b->c1, b->c2, &sh, b->pg, SFW_DTYPE_BF16, g_cx);
}

/* The same keys paged into KV blocks (kernels/ops.h sfw_ckey_row) through
 * a shuffled table: *dtab the device table, returns the pool (level 1 at
 * it, level 2 at it + 4 rows). */
static void *paged_ckeys(const void *c1, int64_t n1, const void *c2, int64_t n2, int64_t L, int32_t **dtab)
{
	int64_t nb = (L + 63) / 64, per = sfw_ckey_rows_per_block(6, 16), row = 256;
	int32_t *t = sfwt_block_table(nb, &rng);
	uint16_t *h1 = malloc((size_t)n1 * row * 2), *h2 = malloc((size_t)n2 * row * 2);
	uint16_t *pool = calloc((size_t)(2 * nb * per * row), 2);
	sfw_cuda_d2h(h1, c1, (size_t)n1 * row * 2, g_s), sfw_cuda_d2h(h2, c2, (size_t)n2 * row * 2, g_s);
	sfw_cuda_sync(g_s);
	for (int lv = 1; lv <= 2; lv++)
		for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++)
			memcpy(pool + (size_t)(sfw_ckey_row(t, 6, 32, 16, lv, j) + (lv == 2 ? 4 : 0)) * row,
			       (lv == 1 ? h1 : h2) + (size_t)j * row, (size_t)row * 2);
	void *d = up(pool, (size_t)(2 * nb * per * row) * 2);
	*dtab = up(t, (size_t)nb * sizeof(int32_t));
	free(t), free(h1), free(h2), free(pool);
	return d;
}

static void bench_stage1(int T, int64_t L)
{
	int64_t n1 = (L - 32) / 16 + 1, n2 = (L - 128) / 64 + 1, pos0 = L - T;
	size_t nq = (size_t)T * 32 * 128, ns = (size_t)2 * T * n1;
	struct bench_s1 b = {NULL,
			     dalloc(nq * 2),
			     dalloc((size_t)n1 * 2 * 128 * 2),
			     dalloc((size_t)n2 * 2 * 128 * 2),
			     n1,
			     n2,
			     pos0,
			     T,
			     NULL};
	sfw_cuda_fill_bf16(b.q, nq, 4, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.c1, (size_t)n1 * 256, 5, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.c2, (size_t)n2 * 256, 6, 1.0f, g_s);
	double flop = 0; /* 2 FLOP x 128 x 32 heads per visible chunk of either level */
	for (int r = 0; r < T; r++) {
		int64_t p = pos0 + r, v1 = (p - 31) / 16 + 1, v2 = p >= 127 ? (p - 127) / 64 + 1 : 0;
		flop += 2.0 * 128 * 32 * (double)((v1 < n1 ? v1 : n1) + (v2 < n2 ? v2 : n2));
	}
	float ms[2];
	float *out[2];
	const char *modes[2] = {"simt", "tc"};
	for (int m = 0; m < 2; m++) {
		set_mode(modes[m]);
		b.s = dalloc(ns * 4);
		ms[m] = time_ms(run_s1, &b, 5);
		out[m] = down_f32(b.s, ns);
		sfw_cuda_free(b.s);
	}
	/* tc over the same keys paged into KV blocks (a serving batch's layout) */
	int32_t *dtab = NULL;
	void *pool = paged_ckeys(b.c1, n1, b.c2, n2, L, &dtab);
	struct sfw_pages pg = {dtab, 6};
	struct bench_s1 bp = b;
	bp.c1 = pool, bp.c2 = (char *)pool + 4 * 256 * 2, bp.pg = &pg, bp.s = dalloc(ns * 4);
	float msp = time_ms(run_s1, &bp, 5);
	float *outp = down_f32(bp.s, ns);
	set_mode(NULL);
	printf("  stage1 T=%d L=%lld nh=32 nkv=2 hd=128 (n1=%lld n2=%lld)\n    simt %8.3f ms (%6.1f TFLOP/s) "
	       "  tc %8.3f ms "
	       "(%6.1f TFLOP/s)   speed-up %.2fx\n    tc, keys paged in KV blocks %8.3f ms (%.3f of contiguous)\n",
	       T, (long long)L, (long long)n1, (long long)n2, ms[0], flop / ms[0] * 1e-9, ms[1],
	       flop / ms[1] * 1e-9, ms[0] / ms[1], msp, msp / ms[1]);
	cmp("tc", "  ... tc against simt on that shape", out[1], out[0], ns, TOL_NMSE, TOL_MAXREL);
	CHECK(!memcmp(outp, out[1], ns * 4), "  ... tc over paged keys = tc over contiguous ones, bit for bit");
	free(out[0]), free(out[1]), free(outp);
	sfw_cuda_free(b.q), sfw_cuda_free(b.c1), sfw_cuda_free(b.c2), sfw_cuda_free(bp.s), sfw_cuda_free(pool),
		sfw_cuda_free(dtab);
}

static void benches(void)
{
	printf("timings (median of 5, event-timed, bf16; FLOP/s counts visible keys only)\n");
	bench_attn(1, 8192, 131072, 1);
	bench_attn(1, 8192, 131072, 64);
	bench_attn(1, 8192, 32768, 1);
	bench_attn(0, 8192, 8192, 1);
	bench_stage1(8192, 131072);
	bench_stage1(3200, 131072); /* the rows per batch the engine uses at 128K */
	bench_stage1(8192, 32768);
	bench_stage1(1, 131072); /* a decode row */
	bench_stage1(1, 1048576);
}

int main(int argc, char **argv)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_attn_tc");
	}
	if (sfw_cuda_stream_new(&g_s, &err) != SFW_OK || sfw_cuda_ctx_new(g_s, &g_cx, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_attn_tc");
	}
	printf("tensor-core vs CUDA-core attention and stage 1 on %s (sm_%d%d)\n", info.name, info.cc_major,
	       info.cc_minor);
	const char *what = argc > 1 ? argv[1] : "all";
	if (strcmp(what, "bench") != 0)
		checks();
	if (strcmp(what, "check") != 0)
		benches();
	sfw_cuda_ctx_free(g_cx);
	size_t live;
	sfw_cuda_mem_stats(&live, NULL, NULL);
	CHECK(live == 0, "device bytes still allocated after the tests: %zu", live);
	sfw_cuda_stream_free(g_s);
	return CHECK_REPORT("gpu_attn_tc");
}
