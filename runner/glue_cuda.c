/* glue_cuda.c - the CUDA backend's ops (runner/backend_cuda.h): each member
 * of struct sfw_backend onto its kernels (kernels/ops_cuda.h), bf16
 * activations, on the backend's one stream. */
#include "runner/backend_cuda.h"
#include "alloc.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cu_embed(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids, int T,
		     float scale)
{
	IMPL(be)->prof_decode = T <= SFW_CUDA_SEQS_MAX; /* a decode step: one row, or one per sequence */
	PROF(P_EMBED, sfw_op_embed_cuda(x, E->dev, E->dtype, ids, T, (int)E->cols, scale, SFW_DTYPE_BF16, S(be)));
}

static void cu_rmsnorm(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int rows, int n,
		       float eps)
{
	PROF(P_RMSNORM, sfw_op_rmsnorm_cuda(y, x, w->dev, w->dtype, rows, n, eps, SFW_DTYPE_BF16, S(be)));
}

static void cu_add_scaled(struct sfw_backend *be, void *x, const void *b, size_t n, float scale)
{
	PROF(P_ADD, sfw_op_add_scaled_cuda(x, b, n, scale, SFW_DTYPE_BF16, S(be)));
}

static void cu_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			   const struct sfw_bweight *w, int rows, int n, float eps)
{
	struct sfw_norm_shape sh = {rows, n, eps, w->dtype};
	PROF(P_ADDNORM, sfw_op_add_rmsnorm_cuda(y, x, b, scale, w->dev, &sh, SFW_DTYPE_BF16, S(be)));
}

static void cu_rmsnorm_gate(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w,
			    const void *z, int rows, int n, float eps)
{
	struct sfw_norm_shape sh = {rows, n, eps, w->dtype};
	PROF(P_NORMGATE, sfw_op_rmsnorm_gate_cuda(y, x, w->dev, z, &sh, SFW_DTYPE_BF16, S(be)));
}

/* Where an op of a context's rows finds their first position: the
 * recording's slot while its step is recorded (written before each
 * replay), else device memory holding pos (written when it changes). A
 * step of many sequences being recorded has no slot for a single op's
 * host position: that recording is dropped (rec_fail). */
static const int64_t *at(struct sfw_backend *be, int64_t pos)
{
	struct cu_be *b = IMPL(be);
	if (b->rec)
		return b->rec_pos;
	if (b->rec_seqs) {
		b->rec_fail = 1;
		return S(be)->pos;
	}
	return sfw_cuda_ctx_pos(S(be), pos);
}

/* One kernel when both norms are there; else the four calls. */
static void cu_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			    const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			    int64_t pos0, float theta)
{
	if (!qw || !kw) {
		sfwi_compose_qk_norm_rope(be, q, k, qw, kw, T, nhq, nhk, hd, eps, rope, pos0, theta);
		return;
	}
	struct sfw_qk_shape sh = {T, nhq, nhk, hd, eps, rope, pos0, theta, qw->dtype, kw->dtype};
	struct sfw_cuda_rowref rr = {.pos = at(be, pos0)};
	PROF(P_QKNORM, sfw_cuda_qk_norm_rope(q, k, qw->dev, kw->dev, &sh, &rr, SFW_DTYPE_BF16, S(be)));
}

static int cu_sample(struct sfw_backend *be, int32_t *out, const float *logits, int V, int n,
		     const struct sfw_op_sample_params *const *p, const double *u)
{
	PROF(P_SAMPLE, sfw_cuda_sample_rows(out, logits, V, n, p, u, S(be)));
	return 1;
}

static void cu_silu_mul(struct sfw_backend *be, void *y, const void *g, const void *u, size_t n)
{
	PROF(P_SILU, sfw_op_silu_mul_cuda(y, g, u, n, SFW_DTYPE_BF16, S(be)));
}

static void cu_sigmoid_mul(struct sfw_backend *be, void *y, const void *x, const void *g, size_t n)
{
	PROF(P_SIGMOID, sfw_op_sigmoid_mul_cuda(y, x, g, n, SFW_DTYPE_BF16, S(be)));
}

static void cu_rope(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0, float theta)
{
	struct sfw_cuda_rowref rr = {.pos = at(be, pos0)};
	PROF(P_ROPE, sfw_cuda_rope_neox(x, T, nh, hd, theta, &rr, SFW_DTYPE_BF16, S(be)));
}

/* An int8 weight's device copy as the kernels take it. */
static struct sfw_w8 w8_of(const struct sfw_bweight *w)
{
	struct sfw_w8 w8 = {w->dev, w->scales_dev, w->scale_dtype, w->group};
	return w8;
}

static void cu_matmul(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M)
{
	struct sfw_w8 w8 = w8_of(w);
	struct sfw_gemm_shape sh = {M, (int)w->rows, (int)w->cols, 0, 0};
	if (w->dtype == SFW_DTYPE_W8)
		PROF(M <= SFW_CUDA_GEMV_MAX_M ? P_MATMUL_DEC : P_MATMUL_PRE,
		     sfw_op_matmul_w8_cuda(y, x, &w8, &sh, SFW_DTYPE_BF16, S(be)));
	else
		PROF(M <= SFW_CUDA_GEMV_MAX_M ? P_MATMUL_DEC : P_MATMUL_PRE,
		     sfw_op_matmul_cuda(y, x, w->dev, w->dtype, M, (int)w->rows, (int)w->cols, SFW_DTYPE_BF16, S(be)));
}

/* One row over a merged group: one GEMV over the merged matrix
 * (docs/performance.md §5.7), whose output row is the parts' side by side. */
static void cu_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M)
{
	if (M == 1 && g->merged.rows)
		cu_matmul(be, y, x, &g->merged, 1);
	else
		sfwi_compose_matmul_group(be, y, x, g, M);
}

/* One row over a merged gate|up: int8 weights take a GEMV with the SwiGLU
 * in its epilogue (one launch less per layer, bit-equal to the GEMV and
 * silu_mul it replaces); bf16 one GEMV, then silu_mul. 3 to 64 rows of int8
 * weights: the tensor-core GEMM with the SwiGLU in its epilogue. */
static void cu_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu, int M)
{
	const struct sfw_bweight *w = &gu->merged;
	int N = (int)gu->part[0]->rows;
	int done = 0;
	struct sfw_w8 w8 = w8_of(w);
	struct sfw_gemm_shape sh = {M, N, (int)w->cols, 0, 0};
	if (M > 1 && w->rows && w->dtype == SFW_DTYPE_W8 && w->rows == (int64_t)2 * N)
		PROF(M <= 8 ? P_MATMUL_DEC : P_MATMUL_PRE,
		     done = sfw_op_swiglu_w8_cuda(y, x, &w8, &sh, S(be)));
	if (done)
		return;
	if (M != 1 || !w->rows) {
		sfwi_compose_swiglu(be, y, tmp, x, gu, M);
		return;
	}
	if (w->dtype == SFW_DTYPE_W8 && w->rows == (int64_t)2 * N)
		PROF(P_MATMUL_DEC, done = sfw_op_matmul_silu_w8_cuda(y, x, &w8, N, (int)w->cols, S(be)));
	if (!done) {
		cu_matmul(be, tmp, x, w, 1);
		cu_silu_mul(be, y, tmp, (char *)tmp + (size_t)N * 2, (size_t)N);
	}
}

static void cu_logits(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
		      float in_scale)
{
	struct sfw_w8 w8 = w8_of(w);
	struct sfw_gemm_shape sh = {M, (int)w->rows, (int)w->cols, 0, 0};
	if (w->dtype == SFW_DTYPE_W8)
		PROF(P_LOGITS, sfw_op_logits_w8_cuda(y, x, &w8, &sh, in_scale, SFW_DTYPE_BF16, S(be)));
	else
		PROF(P_LOGITS,
		     sfw_op_logits_cuda(y, x, w->dev, w->dtype, &sh, in_scale, SFW_DTYPE_BF16, S(be)));
}

/* While a context's step is recorded (b->rec) the ops of its cache plan
 * for lengths up to rec_bound (the lengths move after each launch:
 * sfwi_cu_cache_advance). */
static void cu_kv_append(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k, const void *v, int T)
{
	struct cu_be *b = IMPL(be);
	struct cu_layer *l = &c->L[layer];
	struct sfw_cuda_rowref rr = {.pos = at(be, l->len)};
	struct sfw_cuda_kv kv = {l->k, l->v, &c->pg, c->d.kv8};
	SFW_ASSERT(l->sparse && (b->rec ? T == 1 : l->len + T <= l->cap));
	PROF(P_KV, sfw_cuda_kv_write(&kv, k, v, c->d.nkv, c->d.hd, T, &rr, SFW_DTYPE_BF16, S(be)));
	if (!b->rec)
		l->len += T;
}

static void cu_attn_dense(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer, int T,
			  int nh, float scale)
{
	struct cu_be *b = IMPL(be);
	struct cu_layer *l = &c->L[layer];
	struct sfw_cuda_kv kv = {l->k, l->v, &c->pg, c->d.kv8};
	struct sfw_cuda_rowref rr = {.pos = at(be, l->len - T)};
	/* (recording: the bound) */
	int64_t pos0 = b->rec ? b->rec_bound - 1 : l->len - T;
	struct sfw_attn_shape sh = {T, nh, c->d.nkv, c->d.hd, pos0, scale, 0, 0};
	SFW_ASSERT(!b->rec || T == 1);
	PROF(P_DENSE, sfw_cuda_attn_dense(o, q, &kv, &sh, &rr, SFW_DTYPE_BF16, S(be)));
}

static enum sfw_status cu_compress(struct sfw_backend *be, struct sfw_bcache *c, int layer, struct sfw_err *err)
{
	(void)err;
	struct cu_be *b = IMPL(be);
	struct cu_layer *l = &c->L[layer];
	const struct sfw_cache_desc *d = &c->d;
	struct sfw_cuda_kv kv = {l->k, l->v, &c->pg, c->d.kv8};
	struct sfw_sel_shape sh = {.T = 1, .nkv = d->nkv, .hd = d->hd, .ksize = d->ksize, .stride = d->stride};
	if (b->rec) { /* the chunks the step's token completes */
		struct sfw_cuda_rowref rr = {.pos = b->rec_pos};
		sfw_cuda_compress(l->c1, l->c2, &kv, &sh, &rr, SFW_DTYPE_BF16, S(be));
		return SFW_OK;
	}
	/* the tokens since the compressed keys were made: from the first
	 * length whose chunk counts of both levels are n1 and n2 (they are
	 * those of the length last compressed) to len */
	int64_t p = sfw_len_of_counts(l->n1, l->n2, 0, d->ksize, d->stride, 0, 2, 0);
	int64_t t1 = sfw_nchunks(l->len, d->ksize, d->stride), t2 = sfw_nchunks(l->len, 4 * d->ksize, 4 * d->stride);
	SFW_ASSERT(p >= 0 && p <= l->len && t1 <= l->cap1 && t2 <= l->cap2);
	if (p == l->len)
		return SFW_OK;
	SFW_ASSERT(l->len - p <= INT32_MAX);
	sh.T = (int)(l->len - p);
	struct sfw_cuda_rowref rr = {.pos = at(be, p)};
	PROF(P_COMPRESS, sfw_cuda_compress(l->c1, l->c2, &kv, &sh, &rr, SFW_DTYPE_BF16, S(be)));
	l->n1 = t1, l->n2 = t2;
	return SFW_OK;
}

/* Where a recorded step's selection ops find c's row when the replay runs
 * (struct sfw_cuda_rowref): the one-sequence recording's rec_pos (its
 * caches are the recording's own), or the slots of c's row in a
 * many-sequence recording's step table and pointer table, so the recording
 * serves whatever sequence sits in that row then. 0 when nothing records. */
static int rec_row(struct sfw_backend *be, const struct sfw_bcache *c, int layer, struct sfw_cuda_rowref *rr)
{
	struct cu_be *b = IMPL(be);
	memset(rr, 0, sizeof(*rr));
	rr->len = 1; /* a decode row: the cache holds its token */
	if (b->rec) {
		rr->pos = b->rec_pos;
		return 1;
	}
	if (!b->rec_seqs)
		return 0;
	for (int i = 0; i < b->rec_n; i++)
		if (b->rec_caches[i] == c) {
			void *const *e = b->rec_ptr + (size_t)layer * SFW_CUDA_LN * b->rec_rows + i;
			rr->pos = &b->rec_tab->pos[i];
			rr->k = e + SFW_CUDA_LK * b->rec_rows, rr->v = e + SFW_CUDA_LV * b->rec_rows;
			rr->c1 = e + SFW_CUDA_LC1 * b->rec_rows, rr->c2 = e + SFW_CUDA_LC2 * b->rec_rows;
			rr->tab = &b->rec_tab->tab[i];
			return 1;
		}
	SFW_ASSERT(!"a recorded step's sequence");
	return 0;
}

/* A recorded row's selection: one row at *rr->pos, lengths up to rec_bound. */
static enum sfw_status select_recorded(struct sfw_backend *be, int32_t *idx, const void *q, const struct sfw_bcache *c,
				       const struct cu_layer *l, int nh, const struct sfw_sparse_params *sp,
				       const struct sfw_cuda_rowref *rr, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	int nkv = c->d.nkv, hd = c->d.hd, k = sp->k;
	int64_t bound = b->rec_bound, nb = (bound + sp->block - 1) / sp->block;
	int64_t n1 = sfw_nchunks(bound, sp->ksize, sp->stride), n2 = sfw_nchunks(bound, 4 * sp->ksize, 4 * sp->stride);
	size_t sc, po;
	SFW_ASSERT(sp->T == 1);
	enum sfw_status s = sfwi_cu_sel_room(be, sfwi_cu_sel_plan_row(&c->d, bound, k, &sc, &po), err);
	if (s != SFW_OK)
		return s;
	float *scores = b->sel; /* (the plan's pooled array after it is the unrecorded path's) */
	struct sfw_sel_shape sh = {.T = 1, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = 0, .ksize = sp->ksize,
				   .stride = sp->stride, .block = sp->block, .init_blocks = sp->init_blocks,
				   .local_blocks = sp->local_blocks, .scale = sp->scale, .n1 = n1, .n2 = n2,
				   .nblocks = nb, .topk = k};
	sfw_cuda_stage1(scores, q, l->c1, l->c2, &sh, &c->pg, rr, SFW_DTYPE_BF16, S(be));
	/* top-k pools the blocks itself (split over parts of 1,024 blocks past
	 * one part) */
	sfw_cuda_pool_topk(idx, scores, &sh, rr, S(be));
	return SFW_OK;
}

static enum sfw_status cu_sparse_select(struct sfw_backend *be, int32_t *idx, const void *q, struct sfw_bcache *c,
					int layer, int nh, const struct sfw_sparse_params *sp, float *pooled_last,
					struct sfw_err *err)
{
	struct cu_layer *l = &c->L[layer];
	int nkv = c->d.nkv, hd = c->d.hd, k = sp->k;
	struct sfw_cuda_rowref rr;
	if (rec_row(be, c, layer, &rr)) /* (no taps while recording: pooled_last is NULL) */
		return select_recorded(be, idx, q, c, l, nh, sp, &rr, err);
	if (sp->T <= 0) /* (no rows: nothing to batch) */
		return SFW_OK;
	int64_t n1 = l->n1, nb = sp->nblocks;
	struct sfw_sel_shape sh = {.T = sp->T, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = sp->pos0,
				   .ksize = sp->ksize, .stride = sp->stride, .block = sp->block,
				   .init_blocks = sp->init_blocks, .local_blocks = sp->local_blocks,
				   .scale = sp->scale, .n1 = n1, .n2 = l->n2, .nblocks = nb,
				   .topk = k};
	/* Row batches within select_bytes(): pooled [nkv, rb, nb] and top-k
	 * [nkv, rb, k], and unless stage 1 pools as it scores
	 * (sfw_cuda_stage1_pool) the scores [nkv, rb, n1]. The pooling form's
	 * batches are whole waves of its launch where more than one batch is
	 * needed, and each must be one it takes (its last, the smallest, too);
	 * the others are of equal size. */
	int fused = 0, rb = 0;
	for (int f = 1; f >= 0 && !fused; f--) {
		size_t per_row = (size_t)nkv * ((f ? 0 : (size_t)(n1 ? n1 : 1)) + (size_t)nb + (size_t)k) * 4;
		int64_t cap = (int64_t)(IMPL(be)->select_bytes / per_row);
		cap = cap < 1 ? 1 : cap > sp->T ? sp->T : cap;
		int nbatch = (int)((sp->T + cap - 1) / cap);
		rb = (int)((sp->T + nbatch - 1) / nbatch);
		if (!f)
			break;
		sh.T = sp->T;
		int wave = sfw_cuda_stage1_pools(&sh, SFW_DTYPE_BF16, S(be));
		if (wave <= 0)
			continue;
		if (cap < sp->T && cap >= wave) { /* whole waves, if the pooling form takes the last batch */
			int rw = (int)(cap / wave * wave);
			sh.T = sp->T - (sp->T - 1) / rw * rw;
			if (sfw_cuda_stage1_pools(&sh, SFW_DTYPE_BF16, S(be)) > 0)
				rb = rw;
		}
		sh.T = sp->T - (sp->T - 1) / rb * rb; /* the last batch, the smallest */
		fused = sfw_cuda_stage1_pools(&sh, SFW_DTYPE_BF16, S(be)) > 0;
	}
	size_t sc_bytes = fused ? 0 : sfw_cuda_arena_round((size_t)nkv * rb * (size_t)(n1 ? n1 : 1) * 4);
	size_t po_bytes = sfw_cuda_arena_round((size_t)nkv * rb * (size_t)nb * 4);
	size_t tk_bytes = (size_t)nkv * rb * k * 4;
	enum sfw_status s = sfwi_cu_sel_room(be, sc_bytes + po_bytes + tk_bytes, err);
	if (s != SFW_OK)
		return s;
	float *scores = IMPL(be)->sel;
	float *pooled = (float *)((char *)IMPL(be)->sel + sc_bytes);
	int32_t *tk = (int32_t *)((char *)IMPL(be)->sel + sc_bytes + po_bytes);
	size_t qrow = (size_t)nh * hd * 2;
	sfwi_cu_prof_begin(be);
	for (int r0 = 0; r0 < sp->T; r0 += rb) {
		int n = sp->T - r0 < rb ? sp->T - r0 : rb;
		int32_t *dst = n == sp->T ? idx : tk;
		sh.T = n, sh.pos0 = sp->pos0 + r0;
		/* rows r0 .. of the call's T; the counts are the cache's (len = T) */
		struct sfw_cuda_rowref rr = {.pos = at(be, sp->pos0)};
		rr.off = r0, rr.len = sp->T;
		const void *qr = (const char *)q + (size_t)r0 * qrow;
		if (fused) {
			int ran = sfw_cuda_stage1_pool(pooled, qr, l->c1, l->c2, &sh, &c->pg, &rr, SFW_DTYPE_BF16, S(be));
			SFW_ASSERT(ran);
			sfw_cuda_topk_blocks(dst, pooled, &sh, &rr, SFW_DTYPE_BF16, S(be));
		} else {
			sfw_cuda_stage1(scores, qr, l->c1, l->c2, &sh, &c->pg, &rr, SFW_DTYPE_BF16, S(be));
			if (!pooled_last && sfw_cuda_pool_topk_fits(&sh, S(be))) {
				sfw_cuda_pool_topk(dst, scores, &sh, &rr, S(be));
			} else {
				sfw_cuda_pool_blocks(pooled, scores, &sh, &rr, SFW_DTYPE_BF16, S(be));
				sfw_cuda_topk_blocks(dst, pooled, &sh, &rr, SFW_DTYPE_BF16, S(be));
			}
		}
		if (dst != idx)
			for (int g = 0; g < nkv; g++)
				sfw_cuda_d2d(idx + ((size_t)g * sp->T + r0) * k, tk + (size_t)g * n * k,
					     (size_t)n * k * sizeof(int32_t), IMPL(be)->stream);
		if (pooled_last && r0 + n == sp->T) {
			for (int g = 0; g < nkv; g++)
				sfw_cuda_d2h(pooled_last + (size_t)g * nb, pooled + ((size_t)g * n + (n - 1)) * nb,
					     (size_t)nb * sizeof(float), IMPL(be)->stream);
			sfw_cuda_sync(IMPL(be)->stream);
		}
	}
	sfwi_cu_prof_end(be, P_SELECT);
	return SFW_OK;
}

static void cu_attn_sparse(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
			   const int32_t *idx, int nh, const struct sfw_sparse_params *sp)
{
	struct cu_layer *l = &c->L[layer];
	struct sfw_cuda_rowref rr;
	int rec = rec_row(be, c, layer, &rr);
	if (!rec)
		rr.pos = at(be, sp->pos0);
	struct sfw_cuda_kv kv = {l->k, l->v, &c->pg, c->d.kv8};
	/* (recording: the bound of the positions the replays may give) */
	struct sfw_attn_shape sh = {sp->T, nh, c->d.nkv, c->d.hd, rec ? IMPL(be)->rec_bound - 1 : sp->pos0, sp->scale,
				    sp->k, sp->block};
	SFW_ASSERT(!rec || sp->T == 1);
	PROF(P_SPARSE, sfw_cuda_attn_sparse(o, q, &kv, idx, &sh, &rr, SFW_DTYPE_BF16, S(be)));
}

static void cu_gla(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v, struct sfw_bcache *c,
		   int layer, const float *decay, int T, int nh, int hd, float scale)
{
	float *st = c->L[layer].state;
	struct sfw_gla_shape sh = {T, nh, hd, scale, 64};
	if (T >= 64)
		PROF(P_GLA_CHUNK, sfw_op_gla_chunked_cuda(o, q, k, v, st, decay, &sh, SFW_DTYPE_BF16, S(be)));
	else
		PROF(P_GLA_REC, sfw_op_gla_recurrent_cuda(o, q, k, v, st, decay, &sh, SFW_DTYPE_BF16, S(be)));
}

/* ---- a batched decode step's per-sequence ops (backend.h *_seqs) ----
 * The sequences with one row (decode rows) in one launch (kernels/ops_cuda.h,
 * struct sfw_cuda_seqs), when there are at least two of them; the others
 * (prefill chunks of a mixed step), and every sequence while recording a
 * step, one by one (runner/backend_compose.c). The launch reads its rows
 * from device tables: a recording's (written before each replay), or
 * unrecorded the table this split makes, written before the op (seqs_put). */
struct seqs_split {
	struct sfw_cuda_seqs t;           /* the ones one launch serves */
	/* unrecorded: their rows, and the op's np pointers of each (columns
	 * t.pf[0 .. np) of the pointer table) */
	struct sfw_cuda_steptab tab;
	void *p[3][SFW_CUDA_SEQS_MAX];
	int np;
	const struct sfw_bseq *one[SFW_CUDA_SEQS_MAX];
	struct sfw_bseq rest[SFW_BSEQ_MAX]; /* the others */
	int nrest;
};

/* Splits s[0..ns): returns how many one launch serves (0: none, and then
 * rest is all of s); ok(i) may hold a decode row back. */
static int seqs_split(struct sfw_backend *be, const struct sfw_bseq *s, int ns, struct seqs_split *sp,
		      int (*ok)(const struct sfw_bseq *q, int layer), int layer)
{
	struct cu_be *b = IMPL(be);
	int n = 0;
	sp->nrest = 0;
	sp->np = 0;
	sp->t.layer = layer;
	sp->t.pf[0] = sp->t.pf[1] = sp->t.pf[2] = 0;
	SFW_ASSERT(ns >= 0 && ns <= SFW_BSEQ_MAX);
	sp->t.kv8 = ns > 0 && s[0].cache->d.kv8; /* one batch: one model, one cache kind */
	if (b->rec_seqs) {
		/* recording many sequences (cu_step_seqs made sure each of these
		 * qualifies): the bucket's rows, their sequences read from rec_tab
		 * when the replay runs; the bound sizes the launch */
		sp->t.st = b->rec_tab, sp->t.sp = b->rec_ptr;
		sp->t.n = b->rec_rows;
		sp->t.maxpos = b->rec_bound - 1;
		return b->rec_rows;
	}
	sp->t.st = NULL, sp->t.sp = NULL;
	sp->t.maxpos = 0;
	sp->tab.shift = 0;
	for (int i = 0; i < ns; i++) {
		if (!b->rec && s[i].R == 1 && n < SFW_CUDA_SEQS_MAX && (!ok || ok(&s[i], layer))) {
			const struct sfw_bcache *c = s[i].cache;
			sp->one[n] = &s[i];
			sp->tab.pos[n] = s[i].pos0;
			sp->tab.row[n] = s[i].row0;
			sp->tab.tab[n] = c->pg.tab; /* one pool per batch: one shift */
			if (c->pg.tab) {
				SFW_ASSERT(sp->tab.shift == 0 || sp->tab.shift == c->pg.shift);
				sp->tab.shift = c->pg.shift;
			}
			sp->t.maxpos = s[i].pos0 > sp->t.maxpos ? s[i].pos0 : sp->t.maxpos;
			n++;
		} else {
			sp->rest[sp->nrest++] = s[i];
		}
	}
	if (n < 2) { /* one row alone takes the single-sequence ops */
		sp->nrest = ns;
		memcpy(sp->rest, s, (size_t)ns * sizeof(*s));
		return 0;
	}
	sp->t.n = sp->tab.n = n;
	return n;
}

/* Before an unrecorded launch: its table of rows and its pointers to the
 * device (one copy, staged before it returns and ordered after the launches
 * before it, which read the previous table), as a recording's are laid out
 * (layer 0 of a one-layer pointer table). A recording's launch reads the
 * recording's own tables: nothing to write. */
static void seqs_put(struct sfw_backend *be, struct seqs_split *sp)
{
	struct cu_be *b = IMPL(be);
	if (sp->t.st)
		return;
	union {
		struct sfw_cuda_steptab t;
		unsigned char bytes[SFWI_CU_SEQTAB_BYTES];
	} h;
	int n = sp->t.n;
	h.t = sp->tab;
	void **ptr = (void **)(h.bytes + sizeof(struct sfw_cuda_steptab));
	size_t used = 0; /* the columns up to the last one the op reads */
	for (int j = 0; j < sp->np; j++)
		used = (size_t)(sp->t.pf[j] + 1) * n > used ? (size_t)(sp->t.pf[j] + 1) * n : used;
	memset(ptr, 0, used * sizeof(void *));
	for (int j = 0; j < sp->np; j++)
		for (int i = 0; i < n; i++)
			ptr[(size_t)sp->t.pf[j] * n + i] = sp->p[j][i];
	sfw_cuda_h2d(b->seqtab, h.bytes, sizeof(struct sfw_cuda_steptab) + used * sizeof(void *), b->stream);
	sp->t.st = b->seqtab;
	sp->t.sp = (void *const *)((char *)b->seqtab + sizeof(struct sfw_cuda_steptab));
	sp->t.layer = 0;
}

static void cu_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				 const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk, int hd,
				 float eps, int rope, float theta)
{
	struct seqs_split sp;
	if (qw && kw && seqs_split(be, s, ns, &sp, NULL, 0)) {
		struct sfw_qk_shape sh = {sp.t.n, nhq, nhk, hd, eps, rope, 0, theta, qw->dtype, kw->dtype};
		seqs_put(be, &sp);
		PROF(P_QKNORM,
		     sfw_cuda_qk_norm_rope_seqs(q, k, qw->dev, kw->dev, &sp.t, &sh, SFW_DTYPE_BF16, S(be)));
	} else {
		sp.nrest = ns, memcpy(sp.rest, s, (size_t)ns * sizeof(*s));
		IMPL(be)->rec_fail |= IMPL(be)->rec_seqs; /* the single ops take host positions (at) */
	}
	if (sp.nrest)
		sfwi_compose_qk_norm_rope_seqs(be, q, k, qw, kw, sp.rest, sp.nrest, nhq, nhk, hd, eps, rope, theta);
}

static void cu_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		sp.t.pf[0] = SFW_CUDA_LSTATE, sp.np = 1;
		for (int i = 0; !sp.t.st && i < sp.t.n; i++)
			sp.p[0][i] = sp.one[i]->cache->L[layer].state;
		struct sfw_gla_shape sh = {sp.t.n, nh, hd, scale, 0};
		seqs_put(be, &sp);
		PROF(P_GLA_REC, sfw_cuda_gla_seqs(o, q, k, v, &sp.t, decay, &sh, SFW_DTYPE_BF16, S(be)));
	}
	if (sp.nrest)
		sfwi_compose_gla_seqs(be, o, q, k, v, sp.rest, sp.nrest, layer, decay, nh, hd, scale);
}

static void cu_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
			      const void *v, int kvd)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		sp.t.pf[0] = SFW_CUDA_LK, sp.t.pf[1] = SFW_CUDA_LV, sp.np = 2;
		SFW_ASSERT(s[0].cache->d.nkv * s[0].cache->d.hd == kvd);
		/* recording: sfwi_cu_cache_advance after each replay */
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			struct cu_layer *l = &sp.one[i]->cache->L[layer];
			SFW_ASSERT(l->sparse);
			sp.p[0][i] = l->k, sp.p[1][i] = l->v;
			SFW_ASSERT(l->len == sp.one[i]->pos0 && l->len + 1 <= l->cap);
			l->len++;
		}
		seqs_put(be, &sp);
		PROF(P_KV, sfw_cuda_kv_append_seqs(&sp.t, k, v, s[0].cache->d.nkv, s[0].cache->d.hd, SFW_DTYPE_BF16, S(be)));
	}
	if (sp.nrest)
		sfwi_compose_kv_append_seqs(be, sp.rest, sp.nrest, layer, k, v, kvd);
}

/* One token completes at most one chunk per level, from keys made up to
 * the token before it (its K appended: len = pos0 + 1). */
static int compress_current(const struct sfw_bseq *q, int layer)
{
	const struct cu_layer *l = &q->cache->L[layer];
	const struct sfw_cache_desc *d = &q->cache->d;
	return l->len == q->pos0 + 1 && l->n1 == sfw_nchunks(l->len - 1, d->ksize, d->stride) &&
	       l->n2 == sfw_nchunks(l->len - 1, 4 * d->ksize, 4 * d->stride);
}

static enum sfw_status cu_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer,
					struct sfw_err *err)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, compress_current, layer)) {
		const struct sfw_cache_desc *d = &s[0].cache->d; /* one batch: one shape */
		sp.t.pf[0] = SFW_CUDA_LC1, sp.t.pf[1] = SFW_CUDA_LC2, sp.t.pf[2] = SFW_CUDA_LK, sp.np = 3;
		/* recording: every cache current, with room for rec_bound (bstep_current) */
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			struct cu_layer *l = &sp.one[i]->cache->L[layer];
			sp.p[0][i] = l->c1, sp.p[1][i] = l->c2, sp.p[2][i] = l->k;
			int64_t t1 = sfw_nchunks(l->len, d->ksize, d->stride), t2 = sfw_nchunks(l->len, 4 * d->ksize, 4 * d->stride);
			SFW_ASSERT(t1 <= l->cap1 && t2 <= l->cap2);
			l->n1 = t1, l->n2 = t2;
		}
		seqs_put(be, &sp);
		PROF(P_COMPRESS, sfw_cuda_compress_seqs(&sp.t, d->nkv, d->hd, d->ksize, d->stride, SFW_DTYPE_BF16, S(be)));
	}
	return sp.nrest ? sfwi_compose_compress_seqs(be, sp.rest, sp.nrest, layer, err) : SFW_OK;
}

static void cu_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
			       int layer, int nh, int hd, float scale)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		/* recording: the rows in selection mode have NULL here (their own ops attend) */
		sp.t.pf[0] = SFW_CUDA_LAK, sp.t.pf[1] = SFW_CUDA_LAV, sp.np = 2;
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			const struct cu_layer *l = &sp.one[i]->cache->L[layer];
			SFW_ASSERT(l->len == sp.one[i]->pos0 + 1);
			sp.p[0][i] = l->k, sp.p[1][i] = l->v;
		}
		struct sfw_attn_shape sh = {sp.t.n, nh, s[0].cache->d.nkv, hd, 0, scale, 0, 0};
		seqs_put(be, &sp);
		PROF(P_DENSE, sfw_cuda_attn_dense_seqs(o, q, &sp.t, &sh, SFW_DTYPE_BF16, S(be)));
	}
	if (sp.nrest)
		sfwi_compose_attn_dense_seqs(be, o, q, sp.rest, sp.nrest, layer, nh, hd, scale);
}

static enum sfw_status cu_op(struct sfw_backend *be, const struct sfw_op *o, struct sfw_err *err)
{
	if (IMPL(be)->skip) { /* a replayed step: the op is in its recording (capture_cuda.c) */
		/* the caches' own ops (views, resets, copies) come between steps */
		SFW_ASSERT(o->kind != SFW_OP_CACHE_VIEW && o->kind != SFW_OP_CACHE_RESET &&
			   o->kind != SFW_OP_CACHE_COPY);
		return SFW_OK;
	}
	switch (o->kind) {
	case SFW_OP_EMBED:
		cu_embed(be, o->embed.x, o->embed.E, o->embed.ids, o->embed.T, o->embed.scale);
		break;
	case SFW_OP_RMSNORM:
		cu_rmsnorm(be, o->norm.y, o->norm.x, o->norm.w, o->norm.rows, o->norm.n, o->norm.eps);
		break;
	case SFW_OP_ADD_RMSNORM:
		cu_add_rmsnorm(be, o->norm.y, o->norm.x, o->norm.b, o->norm.scale, o->norm.w, o->norm.rows, o->norm.n,
			       o->norm.eps);
		break;
	case SFW_OP_RMSNORM_GATE:
		cu_rmsnorm_gate(be, o->norm.y, o->norm.x, o->norm.w, o->norm.z, o->norm.rows, o->norm.n, o->norm.eps);
		break;
	case SFW_OP_ADD_SCALED:
		cu_add_scaled(be, o->ew.y, o->ew.b, o->ew.n, o->ew.scale);
		break;
	case SFW_OP_SILU_MUL:
		cu_silu_mul(be, o->ew.y, o->ew.a, o->ew.b, o->ew.n);
		break;
	case SFW_OP_SIGMOID_MUL:
		cu_sigmoid_mul(be, o->ew.y, o->ew.a, o->ew.b, o->ew.n);
		break;
	case SFW_OP_ROPE:
		cu_rope(be, o->rope.x, o->rope.T, o->rope.nh, o->rope.hd, o->rope.pos0, o->rope.theta);
		break;
	case SFW_OP_MATMUL:
		cu_matmul(be, o->mm.y, o->mm.x, o->mm.w, o->mm.M);
		break;
	case SFW_OP_MATMUL_GROUP:
		cu_matmul_group(be, o->mm.y, o->mm.x, o->mm.g, o->mm.M);
		break;
	case SFW_OP_SWIGLU:
		cu_swiglu(be, o->mm.y, o->mm.tmp, o->mm.x, o->mm.g, o->mm.M);
		break;
	case SFW_OP_LOGITS:
		cu_logits(be, o->mm.y, o->mm.x, o->mm.w, o->mm.M, o->mm.scale);
		break;
	case SFW_OP_QK_NORM_ROPE:
		cu_qk_norm_rope(be, o->qk.q, o->qk.k, o->qk.qw, o->qk.kw, o->qk.T, o->qk.nhq, o->qk.nhk, o->qk.hd,
				o->qk.eps, o->qk.rope, o->qk.pos0, o->qk.theta);
		break;
	case SFW_OP_KV_APPEND:
		cu_kv_append(be, o->cache.c, o->cache.layer, o->cache.k, o->cache.v, o->cache.T);
		break;
	case SFW_OP_ATTN_DENSE:
		cu_attn_dense(be, o->cache.o, o->cache.q, o->cache.c, o->cache.layer, o->cache.T, o->cache.nh,
			      o->cache.scale);
		break;
	case SFW_OP_COMPRESS:
		return cu_compress(be, o->cache.c, o->cache.layer, err);
	case SFW_OP_SPARSE_SELECT:
		return cu_sparse_select(be, o->cache.idx, o->cache.q, o->cache.c, o->cache.layer, o->cache.nh,
					o->cache.sp, o->cache.pooled_last, err);
	case SFW_OP_ATTN_SPARSE:
		cu_attn_sparse(be, o->cache.o, o->cache.q, o->cache.c, o->cache.layer, o->cache.idx, o->cache.nh,
			       o->cache.sp);
		break;
	case SFW_OP_GLA:
		cu_gla(be, o->cache.o, o->cache.q, o->cache.k, o->cache.v, o->cache.c, o->cache.layer, o->cache.decay,
		       o->cache.T, o->cache.nh, o->cache.hd, o->cache.scale);
		break;
	case SFW_OP_QK_NORM_ROPE_SEQS:
		cu_qk_norm_rope_seqs(be, o->qk.q, o->qk.k, o->qk.qw, o->qk.kw, o->qk.s, o->qk.ns, o->qk.nhq, o->qk.nhk,
				     o->qk.hd, o->qk.eps, o->qk.rope, o->qk.theta);
		break;
	case SFW_OP_GLA_SEQS:
		cu_gla_seqs(be, o->seqs.o, o->seqs.q, o->seqs.k, o->seqs.v, o->seqs.s, o->seqs.ns, o->seqs.layer,
			    o->seqs.decay, o->seqs.nh, o->seqs.hd, o->seqs.scale);
		break;
	case SFW_OP_KV_APPEND_SEQS:
		cu_kv_append_seqs(be, o->seqs.s, o->seqs.ns, o->seqs.layer, o->seqs.k, o->seqs.v, o->seqs.kvd);
		break;
	case SFW_OP_COMPRESS_SEQS:
		return cu_compress_seqs(be, o->seqs.s, o->seqs.ns, o->seqs.layer, err);
	case SFW_OP_ATTN_DENSE_SEQS:
		cu_attn_dense_seqs(be, o->seqs.o, o->seqs.q, o->seqs.s, o->seqs.ns, o->seqs.layer, o->seqs.nh, o->seqs.hd,
				   o->seqs.scale);
		break;
	case SFW_OP_SAMPLE:
		cu_sample(be, o->sample.out, o->sample.logits, o->sample.V, o->sample.n, o->sample.p, o->sample.u);
		break;
	case SFW_OP_CACHE_COPY:
		return sfwi_cu_cache_copy(be, o->copy.dst, o->copy.src, err);
	case SFW_OP_CACHE_VIEW:
		return sfwi_cu_cache_view(o->view.c, o->view.layer, o->view.set, o->view.out, err);
	case SFW_OP_CACHE_RESET:
		sfwi_cu_cache_reset(be, o->reset.c);
		break;
	default:
		return sfw_fail(err, SFW_E_UNSUPPORTED, "the cuda backend has no op %d", (int)o->kind);
	}
	return SFW_OK;
}

void sfwi_cu_ops(struct sfw_backend *be)
{
	be->op = cu_op;
}
