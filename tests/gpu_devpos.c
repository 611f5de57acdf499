/* modules: runner formats kernels num core */
/* gpu_devpos.c - the ops of a recorded decode step (kernels/ops_cuda.h,
 * the sfw_cuda_* entries with a struct sfw_cuda_rowref) inside a real CUDA graph: recorded once for a
 * length bound, replayed at many positions with only the device-side
 * position changed. Each replay is compared with
 *   - the CPU twins (kernels/ops.h) on the same bf16 data: the appended K/V
 *     row, the compressed keys, the attention outputs (dense, and sparse over
 *     the blocks the GPU selected);
 *   - the same ops called at each position anew, with exact counts and the
 *     caches as arguments (the sfw_op_*_cuda twins, T = 1, whose position
 *     the host writes at each call: sfw_cuda_ctx_pos): stage-1 scores,
 *     pooled scores, selected blocks, attention.
 * Between steps the compressed keys catch up over the tokens the step
 * skipped: sfw_cuda_compress with T > 1 tokens from a host-written
 * position.
 * Positions cross every boundary that changes the lengths: chunk ends of
 * both compression levels, block ends, the first position with a level-2
 * chunk, and the bound itself. Every shape runs twice: with contiguous K/V
 * caches, and paged (kernels/ops_cuda.h, struct sfw_pages: the cache's
 * 64-token blocks at shuffled places of a pool twice its size whose other
 * blocks are NaN), the CPU twins reading the same tokens as one array.
 * Stage 1 and sparse attention read their caches' pointers and block table
 * from slots in device memory (struct sfw_cuda_rowref), as in a recorded
 * step of many sequences. */
#include "check.h"
#include "lib/compare.h"
#include "lib/rng.h"

#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static float urand(void)
{
	return sfwt_urand(&rng);
}

static int64_t nch(int64_t len, int ks, int st)
{
	return len < ks ? 0 : (len - ks) / st + 1;
}

/* bf16 device copy of n random values; *host gets their float values. */
static uint16_t *dev_rand(size_t n, float scale, float **host)
{
	uint16_t *h = malloc(n * 2), *d = NULL;
	*host = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		h[i] = sfw_f32_to_bf16(urand() * scale);
		(*host)[i] = sfw_bf16_to_f32(h[i]);
	}
	struct sfw_err e;
	if (sfw_cuda_malloc((void **)&d, n * 2, "test", &e) == SFW_OK)
		sfw_cuda_h2d(d, h, n * 2, NULL);
	free(h);
	return d;
}

static void *dev_alloc(size_t n)
{
	void *p = NULL;
	struct sfw_err e;
	if (sfw_cuda_malloc(&p, n ? n : 16, "test", &e) != SFW_OK)
		return NULL;
	sfw_cuda_memset(p, 0xff, n ? n : 16, NULL); /* poisoned: unwritten values show */
	return p;
}

static float *bf16_to_host(const void *d, size_t n, void *s)
{
	uint16_t *h = malloc(n * 2);
	float *f = malloc(n * sizeof(float));
	sfw_cuda_d2h(h, d, n * 2, s);
	sfw_cuda_sync(s);
	for (size_t i = 0; i < n; i++)
		f[i] = sfw_bf16_to_f32(h[i]);
	free(h);
	return f;
}

struct shape {
	int nh, nkv, hd, ksize, stride, block, k, init_blocks, local_blocks;
	int64_t bound;
};

/* A paged copy of the [cap, row] bf16 cache d (cap a whole number of
 * blk-token blocks): block b at place tab[b] of a pool of 2 cap / blk
 * blocks (the others poisoned). */
static void *paged_copy(const void *d, int64_t cap, int blk, size_t row, const int32_t *tab)
{
	void *pool = dev_alloc((size_t)2 * cap * row * 2);
	if (pool)
		for (int64_t b = 0; b < cap / blk; b++)
			sfw_cuda_d2d((char *)pool + (size_t)tab[b] * blk * row * 2, (const char *)d + (size_t)b * blk * row * 2,
				     (size_t)blk * row * 2, NULL);
	return pool;
}

static void run_case(const struct shape *sh, const int64_t *pos, int npos, int paged)
{
	const int nh = sh->nh, nkv = sh->nkv, hd = sh->hd, ks = sh->ksize, st = sh->stride, blk = sh->block, k = sh->k;
	const int64_t bound = sh->bound, cap = (bound + blk - 1) / blk * blk;
	const size_t row = (size_t)nkv * hd;
	const float scale = 1.0f / sqrtf((float)hd);
	printf("shape nh %d nkv %d hd %d, bound %lld, %s caches:\n", nh, nkv, hd, (long long)bound,
	       paged ? "paged" : "contiguous");
	void *s = NULL;
	struct sfw_cuda_ctx *cx = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_cuda_stream_new(&s, &err) == SFW_OK && sfw_cuda_ctx_new(s, &cx, &err) == SFW_OK, "stream: %s",
	      err.msg);
	if (!cx)
		return;
	cx->fixed = 1; /* nothing allocates inside a recording */
	float *K, *Vh, *q, *kn, *vn;
	uint16_t *dK = dev_rand((size_t)cap * row, 1.0f, &K), *dV = dev_rand((size_t)cap * row, 1.0f, &Vh);
	uint16_t *dq = dev_rand((size_t)nh * hd, 1.0f, &q);
	uint16_t *dkn = dev_rand(row, 1.0f, &kn), *dvn = dev_rand(row, 1.0f, &vn);
	int64_t cap1 = cap / st + 1, cap2 = cap / (4 * st) + 1, n1b = nch(bound, ks, st), nbb = (bound + blk - 1) / blk;
	void *dc1 = dev_alloc((size_t)cap1 * row * 2), *dc2 = dev_alloc((size_t)cap2 * row * 2);
	float *dsc = dev_alloc((size_t)nkv * (n1b ? n1b : 1) * 4), *dpo = dev_alloc((size_t)nkv * nbb * 4);
	int32_t *didx = dev_alloc((size_t)nkv * k * 4), *didx2 = dev_alloc((size_t)nkv * k * 4);
	void *dos = dev_alloc((size_t)nh * hd * 2), *dod = dev_alloc((size_t)nh * hd * 2);
	/* the host-position twins' outputs */
	float *rsc = dev_alloc((size_t)nkv * (n1b ? n1b : 1) * 4), *rpo = dev_alloc((size_t)nkv * nbb * 4);
	int32_t *ridx = dev_alloc((size_t)nkv * k * 4);
	void *ros = dev_alloc((size_t)nh * hd * 2), *rod = dev_alloc((size_t)nh * hd * 2);
	int64_t *dpos = dev_alloc(sizeof(int64_t));
	/* paged: the K/V caches become pools, tab the block table */
	int shift = 0;
	while ((1 << shift) < blk)
		shift++;
	int64_t nb = cap / blk;
	int32_t *tab = malloc((size_t)2 * nb * sizeof(int32_t)), *dtab = NULL;
	sfwt_iota_shuffle(tab, 2 * nb, &rng);
	struct sfw_pages pgs = {NULL, shift};
	const struct sfw_pages *pg = NULL;
	int64_t ckr = sfw_ckey_rows_per_block(shift, st); /* paged: the compressed keys' rows per block */
	if (paged && dK && dV && (1 << shift) == blk && ckr > 0) {
		void *pk = paged_copy(dK, cap, blk, row, tab), *pv = paged_copy(dV, cap, blk, row, tab);
		dtab = dev_alloc((size_t)nb * sizeof(int32_t));
		if (dtab)
			sfw_cuda_h2d(dtab, tab, (size_t)nb * sizeof(int32_t), NULL);
		sfw_cuda_sync(NULL);
		sfw_cuda_free(dK), sfw_cuda_free(dV);
		dK = pk, dV = pv;
		pgs.tab = dtab, pg = &pgs;
		/* the compressed keys in the pool's 2 nb blocks, by the same table */
		sfw_cuda_free(dc1), sfw_cuda_free(dc2);
		dc1 = dev_alloc((size_t)2 * nb * ckr * row * 2), dc2 = NULL;
		if (dc1)
			dc2 = (char *)dc1 + (size_t)(blk / st) * row * 2;
	}
	sfw_cuda_sync(NULL); /* the uploads and poisoning ran on the default stream */
	if (!dK || !dV || !dq || !dkn || !dvn || !dc1 || !dc2 || !dsc || !dpo || !didx || !didx2 || !dos || !dod ||
	    !rsc || !rpo || !ridx || !ros || !rod || !dpos || (paged && !pg)) {
		CHECK(0, "device buffers");
		return;
	}
	/* stage 1 and sparse attention find their caches through slots in
	 * device memory (struct sfw_cuda_rowref, as a recorded step of many
	 * sequences does): their pointer arguments are NULL, so a kernel that
	 * ignored the slots would read nothing that holds the caches */
	void **dslot = dev_alloc(5 * sizeof(void *));
	if (!dslot) {
		CHECK(0, "device buffers");
		return;
	}
	void *slot[5] = {dK, dV, dc1, dc2, pg ? (void *)pg->tab : NULL};
	sfw_cuda_h2d(dslot, slot, sizeof(slot), NULL);
	sfw_cuda_sync(NULL);
	const struct sfw_cuda_rowref rr = {dpos, dslot, dslot + 1, dslot + 2, dslot + 3, (const int32_t *const *)(dslot + 4),
					   0, 1};
	const struct sfw_pages pgn = {NULL, shift}; /* the table from its slot, the block size from here */
	/* the recording: what one sparse layer of a decode step does */
	sfw_cuda_graph_begin(s);
	const struct sfw_cuda_rowref rp = {.pos = dpos, .len = 1}; /* the position alone */
	struct sfw_sel_shape bsh = {1, nh, nkv, hd, 0, ks, st, blk, sh->init_blocks, sh->local_blocks, scale,
				    n1b, nch(bound, 4 * ks, 4 * st), nbb, k};
	struct sfw_cuda_kv kv = {dK, dV, pg, 0}, kvn = {NULL, NULL, &pgn, 0};
	struct sfw_attn_shape bsp = {1, nh, nkv, hd, 0, scale, k, blk},
			      bde = {1, nh, nkv, hd, bound - 1, scale, 0, 0};
	sfw_cuda_kv_write(&kv, dkn, dvn, nkv, hd, 1, &rp, SFW_DTYPE_BF16, cx);
	sfw_cuda_compress(dc1, dc2, &kv, &bsh, &rp, SFW_DTYPE_BF16, cx);
	sfw_cuda_stage1(dsc, dq, NULL, NULL, &bsh, &pgn, &rr, SFW_DTYPE_BF16, cx);
	sfw_cuda_pool_blocks(dpo, dsc, &bsh, &rp, SFW_DTYPE_BF16, cx);
	sfw_cuda_topk_blocks(didx, dpo, &bsh, &rp, SFW_DTYPE_BF16, cx);
	sfw_cuda_pool_topk(didx2, dsc, &bsh, &rp, cx);
	sfw_cuda_attn_sparse(dos, dq, &kvn, didx, &bsp, &rr, SFW_DTYPE_BF16, cx);
	sfw_cuda_attn_dense(dod, dq, &kv, &bde, &rp, SFW_DTYPE_BF16, cx);
	void *g = NULL;
	enum sfw_status gs = sfw_cuda_graph_end(s, &g, &err);
	CHECK(gs == SFW_OK && g, "record the step: %s", err.msg);
	if (gs != SFW_OK)
		return;
	float *c1 = calloc((size_t)cap1 * row, sizeof(float)), *c2 = calloc((size_t)cap2 * row, sizeof(float));
	float *o_cpu = malloc((size_t)nh * hd * sizeof(float));
	int64_t made = 0; /* the tokens the device's compressed keys cover */
	for (int pi = 0; pi < npos; pi++) {
		int64_t p = pos[pi], len = p + 1;
		if (p >= bound)
			continue;
		/* the compressed keys current before the step (as forward.c's
		 * catch-up makes them), K row p replaced by the new token */
		if (p > made) {
			struct sfw_sel_shape csh = bsh;
			csh.T = (int)(p - made);
			struct sfw_cuda_rowref rc = {.pos = sfw_cuda_ctx_pos(cx, made)};
			sfw_cuda_compress(dc1, dc2, &kv, &csh, &rc, SFW_DTYPE_BF16, cx);
		}
		memcpy(K + (size_t)p * row, kn, row * sizeof(float));
		memcpy(Vh + (size_t)p * row, vn, row * sizeof(float));
		sfw_cuda_h2d(dpos, &p, sizeof(p), s);
		sfw_cuda_graph_launch(g, s);
		sfw_cuda_sync(s);
		int64_t n1 = nch(len, ks, st), n2 = nch(len, 4 * ks, 4 * st), nb = (len + blk - 1) / blk;
		made = len;
		/* appended row */
		int64_t prow = pg ? (int64_t)tab[p / blk] * blk + p % blk : p; /* where token p lives */
		float *krow = bf16_to_host((uint16_t *)dK + (size_t)prow * row, row, s);
		float *vrow = bf16_to_host((uint16_t *)dV + (size_t)prow * row, row, s);
		CHECK(!memcmp(krow, kn, row * 4) && !memcmp(vrow, vn, row * 4), "p %lld: K/V row appended at p", (long long)p);
		free(krow), free(vrow);
		/* compressed keys against the CPU twin (rounded to bf16 as stored) */
		sfw_op_compress_cpu(c1, K, 1, 0, n1, &bsh, NULL);
		sfw_op_compress_cpu(c2, K, 2, 0, n2, &bsh, NULL);
		for (size_t i = 0; i < (size_t)n1 * row; i++)
			c1[i] = sfw_bf16_to_f32(sfw_f32_to_bf16(c1[i]));
		for (size_t i = 0; i < (size_t)n2 * row; i++)
			c2[i] = sfw_bf16_to_f32(sfw_f32_to_bf16(c2[i]));
		float *g1, *g2;
		if (pg) { /* gathered from the blocks (kernels/ops.h sfw_ckey_row) */
			float *all = bf16_to_host(dc1, (size_t)2 * (cap / blk) * ckr * row, s); /* the whole pool */
			g1 = malloc(((size_t)n1 + 1) * row * 4), g2 = malloc(((size_t)n2 + 1) * row * 4);
			for (int lv = 1; lv <= 2; lv++)
				for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++)
					memcpy((lv == 1 ? g1 : g2) + (size_t)j * row,
					       all + (size_t)(sfw_ckey_row(tab, shift, ks, st, lv, j) +
							      (lv == 2 ? blk / st : 0)) * row,
					       row * 4);
			free(all);
		} else {
			g1 = bf16_to_host(dc1, (size_t)n1 * row, s), g2 = bf16_to_host(dc2, (size_t)n2 * row, s);
		}
		struct cmp_stats a1 = cmp_stats(g1, c1, (size_t)n1 * row), a2 = cmp_stats(g2, c2, (size_t)n2 * row);
		CHECK(a1.bad == 0 && a2.bad == 0 && a1.maxd <= 1e-2 * (a1.maxr + 1e-30) && a2.maxd <= 1e-2 * (a2.maxr + 1e-30),
		      "p %lld: compressed keys (%lld, %lld) = CPU twin (max diff %g, %g)", (long long)p, (long long)n1,
		      (long long)n2, a1.maxd, a2.maxd);
		free(g1), free(g2);
		/* the host-position twins on the same cache */
		struct sfw_sel_shape rsh = {1, nh, nkv, hd, p, ks, st, blk, sh->init_blocks, sh->local_blocks,
					    scale, n1, n2, nb, k};
		struct sfw_attn_shape ash = {1, nh, nkv, hd, p, scale, k, blk};
		sfw_op_stage1_cuda(rsc, dq, dc1, dc2, &rsh, pg, SFW_DTYPE_BF16, cx);
		sfw_op_pool_blocks_cuda(rpo, rsc, &rsh, SFW_DTYPE_BF16, cx);
		sfw_op_topk_blocks_cuda(ridx, rpo, &rsh, SFW_DTYPE_BF16, cx);
		struct sfw_cuda_rowref rh = {.pos = sfw_cuda_ctx_pos(cx, p)};
		sfw_cuda_attn_sparse(ros, dq, &kv, didx, &ash, &rh, SFW_DTYPE_BF16, cx);
		sfw_cuda_attn_dense(rod, dq, &kv, &ash, &rh, SFW_DTYPE_BF16, cx);
		sfw_cuda_sync(s);
		size_t nsc = (size_t)nkv * n1, npo = (size_t)nkv * nb;
		float *gs1 = malloc((nsc ? nsc : 1) * 4), *rs1 = malloc((nsc ? nsc : 1) * 4);
		float *gpo = malloc(npo * 4), *rpoh = malloc(npo * 4);
		int32_t *gi = malloc((size_t)nkv * k * 4), *ri = malloc((size_t)nkv * k * 4);
		sfw_cuda_d2h(gs1, dsc, nsc * 4, s), sfw_cuda_d2h(rs1, rsc, nsc * 4, s);
		sfw_cuda_d2h(gpo, dpo, npo * 4, s), sfw_cuda_d2h(rpoh, rpo, npo * 4, s);
		sfw_cuda_d2h(gi, didx, (size_t)nkv * k * 4, s), sfw_cuda_d2h(ri, ridx, (size_t)nkv * k * 4, s);
		sfw_cuda_sync(s);
		struct cmp_stats ss = cmp_stats(gs1, rs1, nsc), sp = cmp_stats(gpo, rpoh, npo);
		/* split counts planned for the bound may differ from the host
		 * call's: the level-2 sums then differ in order, and a bf16 score
		 * by one rounding step at most */
		CHECK(ss.bad == 0 && ss.maxd <= 8e-3 * (ss.maxr + 1e-30), "p %lld: stage-1 scores [%d, %lld] (max diff %g of %g)",
		      (long long)p, nkv, (long long)n1, ss.maxd, ss.maxr);
		CHECK(sp.bad == 0 && sp.maxd <= 8e-3 * (sp.maxr + 1e-30), "p %lld: pooled scores [%d, %lld] (max diff %g)",
		      (long long)p, nkv, (long long)nb, sp.maxd);
		int idiff = 0;
		for (int i = 0; i < nkv * k; i++)
			idiff += gi[i] != ri[i];
		/* equal scores select equal blocks; scores one rounding apart may
		 * swap a near tie or two */
		CHECK(idiff == 0 || (ss.maxd > 0 && idiff <= 4),
		      "p %lld: selected blocks equal the host-position twin's (%d differ)", (long long)p, idiff);
		/* pooling inside top-k (the recorded step's form) against the
		 * recorded pool + top-k pair on the same scores: equal */
		int32_t *gi2 = malloc((size_t)nkv * k * 4);
		sfw_cuda_d2h(gi2, didx2, (size_t)nkv * k * 4, s);
		sfw_cuda_sync(s);
		CHECK(!memcmp(gi2, gi, (size_t)nkv * k * 4), "p %lld: pool + top-k in one launch = the pair",
		      (long long)p);
		free(gi2);
		/* attention: against the host-position twin and the CPU twin */
		float *os = bf16_to_host(dos, (size_t)nh * hd, s), *od = bf16_to_host(dod, (size_t)nh * hd, s);
		float *rs = bf16_to_host(ros, (size_t)nh * hd, s), *rd = bf16_to_host(rod, (size_t)nh * hd, s);
		struct cmp_stats e1 = cmp_stats(os, rs, (size_t)nh * hd), e2 = cmp_stats(od, rd, (size_t)nh * hd);
		CHECK(e1.bad == 0 && e1.maxd == 0, "p %lld: sparse attention = host-position twin (max diff %g)",
		      (long long)p, e1.maxd);
		CHECK(e2.bad == 0 && e2.nmse <= 1e-5, "p %lld: dense attention = host-position twin (nmse %.2g)",
		      (long long)p, e2.nmse);
		sfw_op_attn_sparse_cpu(NULL, o_cpu, q, K, Vh, gi, &ash);
		struct cmp_stats c3 = cmp_stats(os, o_cpu, (size_t)nh * hd);
		sfw_op_attn_dense_cpu(NULL, o_cpu, q, K, Vh, &ash);
		struct cmp_stats c4 = cmp_stats(od, o_cpu, (size_t)nh * hd);
		CHECK(c3.bad == 0 && c3.nmse <= 1e-4 && c4.bad == 0 && c4.nmse <= 1e-4,
		      "p %lld: attention = CPU twin (sparse nmse %.2g, dense nmse %.2g)", (long long)p, c3.nmse, c4.nmse);
		free(gs1), free(rs1), free(gpo), free(rpoh), free(gi), free(ri), free(os), free(od), free(rs), free(rd);
	}
	sfw_cuda_graph_free(g);
	void *bufs[] = {dK, dV, dq, dkn, dvn, dc1, pg ? NULL : dc2, dsc, dpo, didx, didx2, dos, dod, rsc, rpo, ridx, ros, rod,
			dpos, dtab};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		sfw_cuda_free(bufs[i]);
	free(K), free(Vh), free(q), free(kn), free(vn), free(c1), free(c2), free(o_cpu), free(tab);
	sfw_cuda_ctx_free(cx);
	sfw_cuda_stream_free(s);
}

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "no GPU: %s", err.msg);
		return CHECK_REPORT("gpu_devpos");
	}
	/* positions: chunk ends of both levels (ksize 32 / stride 16, 128 / 64),
	 * block ends, the first level-2 chunk, the bound */
	const int64_t pos[] = {0, 1, 30, 31, 32, 47, 63, 64, 126, 127, 128, 191, 500, 1023, 1024, 2047, 3001, 4094, 4095};
	struct shape real = {32, 2, 128, 32, 16, 64, 96, 1, 32, 4096}; /* the model's sparse layers */
	struct shape small = {8, 2, 64, 32, 16, 64, 16, 1, 2, 2048};
	/* a bound far above the positions: split counts planned for 64K keys */
	const int64_t far[] = {100, 5000, 20000, 65535};
	struct shape big = {32, 2, 128, 32, 16, 64, 96, 1, 32, 65536};
	for (int paged = 0; paged < 2; paged++) {
		run_case(&real, pos, (int)(sizeof(pos) / sizeof(pos[0])), paged);
		run_case(&small, pos, (int)(sizeof(pos) / sizeof(pos[0])), paged);
		run_case(&big, far, 4, paged);
	}
	return CHECK_REPORT("gpu_devpos");
}
