/* forward.c - the one MiniCPM-SALA forward pass (docs/model-spec.md §2), written
 * against struct sfw_backend, and the calls of runner/runner.h that run it
 * (sfw_ctx_prefill, sfw_ctx_decode*; a context's life is runner/ctx.c).
 *
 * The pass reads as the spec does, one backend call per op (forward_rows,
 * layer_step and the two mixers): embedding, then per layer the mixer
 * (sparse attention or Lightning), residual + norm, the SwiGLU MLP,
 * residual + the next norm, and the logits. What makes it fast is not here:
 * projection groups are formed when the model is bound (runner/model.c),
 * fused ops are always called (a backend without the kernel composes them,
 * runner/backend_compose.c), and each step's ops are bracketed by the
 * backend's step begin and end (be->step), around which a backend may
 * record and replay them (CUDA graphs: runner/capture_cuda.c); the pass
 * writes no host state that a replay would have to redo and knows nothing
 * of recording.
 *
 * A call (sfw_ctx_prefill / sfw_ctx_decode) is cut into pieces of at most
 * prefill_chunk rows; each piece runs through all layers, appending to the
 * caches, so memory follows the piece size, not the prompt. The sparse
 * layers' dense/sparse decision and the block count are fixed per call from
 * the total length at the end of the call, as the reference decides them.
 *
 * The rows of a step belong to one or more sequences (struct sfwi_part,
 * runner/model.h): norms and every linear run once over all rows, then per
 * part the attention, compression, block selection and Lightning state
 * against that part's cache. There is one step function (forward_step,
 * sfwi_forward): a batch's step (runner/batch.c) is one part per sequence
 * on a workspace context without a cache of its own, a context's call is
 * one part on its own cache (a batch of one), and every next token is
 * chosen there. Tapped calls (score, AWQ calibration) run the same step
 * with every tensor reported (their choices made on the host from the
 * reported logits, sfw_op_sample_cpu, the device sampler's C twin). */
#include "runner/ctx.h"
#include "alloc.h"
#include "file.h"
#include "log.h"
#include "runner/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void emit(struct sfw_ctx *c, const char *name, int layer, int64_t row0, int rows, int cols, int nkv,
		 int is_int, const void *data)
{
	struct sfw_tap t = {name, layer, row0, rows, cols, nkv, is_int, data};
	c->tap(c->tap_user, &t);
}

static void emit_act(struct sfw_ctx *c, const char *name, int layer, int64_t row0, int rows, const void *buf,
		     int cols)
{
	struct sfw_backend *be = c->m->be;
	sfw_be_to_host_f32(be, c->host, buf, 0, (size_t)rows * cols);
	emit(c, name, layer, row0, rows, cols, 0, 0, c->host);
}

static void *row_ptr(const struct sfw_ctx *c, void *buf, size_t elems)
{
	return (char *)buf + elems * sfw_be_act_size(c->m->be);
}

struct call {
	const char *phase;
	/* sfw_ctx_prefill_next, sfw_ctx_decode_next: choose the next token
	 * where the logits are */
	const struct sfw_op_sample_params *sp;
	double u;
	int32_t *next;
};

/* A sequence's rows of a step buffer: row r of buf (rows of width w). */
static void *rows_at(const struct sfw_ctx *c, void *buf, int r, size_t w)
{
	return row_ptr(c, buf, (size_t)r * w);
}

/* A sparse sequence's part of a sparse layer: InfLLM-v2 selection and
 * sparse attention over its own cache (its K/V already appended and
 * compressed), and what the context notes of its own sequence. q is the
 * step's query buffer; the part's rows start at p->row0. */
static enum sfw_status sparse_attend(struct sfw_ctx *c, int li, const struct sfwi_part *p, const struct call *cl,
				     void *q_all, struct sfw_err *err)
{
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	int nh = cf->num_attention_heads, nkv = cf->num_key_value_heads, hd = cf->head_dim;
	float scale = 1.0f / sqrtf((float)hd);
	enum sfw_status s;
	int R = p->R, own = p->cache == c->cache; /* the context's own sequence: notes and taps */
	int64_t pos0 = p->pos0;
	size_t qd = (size_t)nh * hd;
	void *q = rows_at(c, q_all, p->row0, qd), *a = rows_at(c, c->a, p->row0, qd);
	size_t nsel = (size_t)nkv * cf->sparse_k;
	struct sfw_sparse_params sp = {pos0,
				       R,
				       p->nblocks,
				       cf->sparse_k,
				       cf->sparse_init_blocks,
				       cf->sparse_local_blocks,
				       cf->sparse_kernel_size,
				       cf->sparse_kernel_stride,
				       cf->sparse_block_size,
				       scale};
	float *pool_last = NULL;
	if (own && c->tap && p->last_piece) {
		int64_t need = (int64_t)nkv * p->nblocks;
		if (need > c->host_pool_cap) {
			float *np = sfw_realloc(c->host_pool, (size_t)need * sizeof(float));
			if (!np)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
			c->host_pool = np;
			c->host_pool_cap = need;
		}
		pool_last = c->host_pool;
	}
	if ((s = sfw_be_sparse_select(be, c->idx_dev, q, p->cache, li, nh, &sp, pool_last, err)) != SFW_OK)
		return s;
	sfw_be_attn_sparse(be, a, q, p->cache, li, c->idx_dev, nh, &sp);
	if (!own || !(c->tap || p->last_piece))
		return SFW_OK;
	size_t n = (size_t)nkv * R * cf->sparse_k;
	int32_t *hi = c->host_idx;
	int32_t *lastbuf = c->last_blocks + (size_t)li * nsel;
	if (c->tap) {
		sfw_be_to_host(be, hi, c->idx_dev, n * sizeof(int32_t));
		char name[96];
		snprintf(name, sizeof(name), "sparse.layer.%d.%s.topk_idx", li, cl->phase);
		emit(c, name, li, pos0, R, cf->sparse_k, nkv, 1, hi);
	}
	if (p->last_piece) {
		int32_t *lastdev = c->last_dev + (size_t)li * nsel;
		for (int h = 0; h < nkv; h++) {
			size_t off = ((size_t)h * R + (R - 1)) * cf->sparse_k;
			size_t kb = (size_t)cf->sparse_k * sizeof(int32_t);
			if (c->tap)
				memcpy(lastbuf + (size_t)h * cf->sparse_k, hi + off, kb);
			else /* stays in backend memory until asked */
				sfw_be_copy(be, lastdev + (size_t)h * cf->sparse_k, c->idx_dev + off, kb);
		}
	}
	if (c->tap && p->last_piece) {
		char name[96];
		snprintf(name, sizeof(name), "sparse.layer.%d.%s.block_score", li, cl->phase);
		emit(c, name, li, pos0 + R - 1, 1, (int)p->nblocks, nkv, 0, pool_last);
		int64_t nc[2];
		int32_t nc32[2];
		sfw_be_cache_ncompressed(be, p->cache, li, nc);
		nc32[0] = (int32_t)nc[0], nc32[1] = (int32_t)nc[1];
		snprintf(name, sizeof(name), "sparse.layer.%d.%s.n_compressed", li, cl->phase);
		emit(c, name, li, pos0 + R - 1, 1, 2, 0, 1, nc32);
	}
	return SFW_OK;
}

/* Where a projection group's part i begins in c->proj for R rows. */
static void *proj_part(const struct sfw_ctx *c, const struct sfw_bgroup *g, int i, int R)
{
	size_t off = 0;
	for (int j = 0; j < i; j++)
		off += (size_t)R * (size_t)g->part[j]->rows;
	return row_ptr(c, c->proj, off);
}

/* A sparse layer's mixer over the step's R rows: the projections once over
 * all rows; per sequence (bs: the parts as the backend takes them) the K/V
 * append and compression, then dense attention for the sequences in dense
 * mode, selection + sparse attention for the others; the output gate and
 * o_proj. */
static enum sfw_status sparse_mixer(struct sfw_ctx *c, int li, int R, const struct sfwi_part *parts,
				    const struct sfw_bseq *bs, int np, const struct call *cl, struct sfw_err *err)
{
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	struct sfwi_layer *L = &m->layers[li];
	int nh = cf->num_attention_heads, hd = cf->head_dim, kvd = cf->num_key_value_heads * cf->head_dim;
	enum sfw_status s;
	sfw_be_matmul_group(be, c->proj, c->u, &L->proj, R);
	void *q = proj_part(c, &L->proj, 0, R), *k = proj_part(c, &L->proj, 1, R), *v = proj_part(c, &L->proj, 2, R);
	sfw_be_kv_append_seqs(be, bs, np, li, k, v, kvd);
	/* the compressed keys follow the cache in both modes: a recorded
	 * step's compress starts from current keys, and the switch to
	 * selection finds them made */
	if ((s = sfw_be_compress_seqs(be, bs, np, li, err)) != SFW_OK)
		return s;
	struct sfw_bseq dense[SFW_BSEQ_MAX];
	int nd = 0;
	for (int i = 0; i < np; i++)
		if (!parts[i].sparse)
			dense[nd++] = bs[i];
	if (nd)
		sfw_be_attn_dense_seqs(be, c->a, q, dense, nd, li, nh, hd, 1.0f / sqrtf((float)hd));
	for (int i = 0; i < np; i++)
		if (parts[i].sparse && (s = sparse_attend(c, li, &parts[i], cl, q, err)) != SFW_OK)
			return s;
	if (L->o_gate.host)
		sfw_be_sigmoid_mul(be, c->a, c->a, proj_part(c, &L->proj, 3, R), (size_t)R * nh * hd);
	if (c->tap && c->tap_lin) {
		char name[64];
		snprintf(name, sizeof(name), "%s.layer.%d.o_in", cl->phase, li);
		emit_act(c, name, li, parts[0].pos0, R, c->a, nh * hd);
	}
	sfw_be_matmul(be, c->out, c->a, &L->o, R);
	return SFW_OK;
}

/* A lightning layer's mixer: projections once over all rows; per sequence
 * the q/k norms and RoPE at its own positions and GLA against its own
 * state; the output norm and gate, o_proj. */
static void lightning_mixer(struct sfw_ctx *c, int li, int R, const struct sfwi_part *parts,
			    const struct sfw_bseq *bs, int np, const char *phase)
{
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	struct sfwi_layer *L = &m->layers[li];
	int nh = cf->lightning_nh, hd = cf->lightning_head_dim;
	sfw_be_matmul_group(be, c->proj, c->u, &L->proj, R);
	void *q = proj_part(c, &L->proj, 0, R), *k = proj_part(c, &L->proj, 1, R), *v = proj_part(c, &L->proj, 2, R);
	sfw_be_qk_norm_rope_seqs(be, q, k, L->q_norm.host ? &L->q_norm : NULL, L->k_norm.host ? &L->k_norm : NULL, bs, np,
			      nh, nh, hd, (float)cf->rms_norm_eps, cf->lightning_use_rope, (float)cf->rope_theta);
	sfw_be_gla_seqs(be, c->a, q, k, v, bs, np, li, m->decay, nh, hd, 1.0f / sqrtf((float)hd));
	if (L->o_norm.host && L->z.host)
		sfw_be_rmsnorm_gate(be, c->a, c->a, &L->o_norm, proj_part(c, &L->proj, 3, R), R, nh * hd,
				 (float)cf->rms_norm_eps);
	else if (L->o_norm.host)
		sfw_be_rmsnorm(be, c->a, c->a, &L->o_norm, R, nh * hd, (float)cf->rms_norm_eps);
	else if (L->z.host)
		sfw_be_sigmoid_mul(be, c->a, c->a, proj_part(c, &L->proj, 3, R), (size_t)R * nh * hd);
	if (c->tap && c->tap_lin) {
		char name[64];
		snprintf(name, sizeof(name), "%s.layer.%d.o_in", phase, li);
		emit_act(c, name, li, parts[0].pos0, R, c->a, nh * hd);
	}
	sfw_be_matmul(be, c->out, c->a, &L->o, R);
}

/* One layer for the step's rows; c->u holds the layer's input norm of the
 * residual stream c->x on entry, and the next norm (the next layer's input
 * norm, or the final norm) on return. */
static enum sfw_status layer_step(struct sfw_ctx *c, int li, int R, const struct sfwi_part *parts,
				  const struct sfw_bseq *bs, int np, const struct call *cl, struct sfw_err *err)
{
	int64_t pos0 = parts[0].pos0; /* taps: one part */
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	struct sfwi_layer *L = &m->layers[li];
	int D = cf->hidden_size, I = cf->intermediate_size;
	float eps = (float)cf->rms_norm_eps, rs = (float)cf->residual_scale;
	char name[64];
	enum sfw_status s;
	if (c->tap && c->tap_lin) {
		snprintf(name, sizeof(name), "%s.layer.%d.attn_in", cl->phase, li);
		emit_act(c, name, li, pos0, R, c->u, D);
	}
	if (L->kind == SFW_MIXER_SPARSE) {
		if ((s = sparse_mixer(c, li, R, parts, bs, np, cl, err)) != SFW_OK)
			return s;
	} else {
		lightning_mixer(c, li, R, parts, bs, np, cl->phase);
	}
	sfw_be_add_rmsnorm(be, c->u, c->x, c->out, rs, &L->post_norm, R, D, eps);
	if (c->tap && c->tap_lin) {
		snprintf(name, sizeof(name), "%s.layer.%d.mlp_in", cl->phase, li);
		emit_act(c, name, li, pos0, R, c->u, D);
	}
	sfw_be_swiglu(be, c->mg, c->gu, c->u, &L->gu, R);
	if (c->tap && c->tap_lin) {
		snprintf(name, sizeof(name), "%s.layer.%d.down_in", cl->phase, li);
		emit_act(c, name, li, pos0, R, c->mg, I);
	}
	sfw_be_matmul(be, c->out, c->mg, &L->down, R);
	const struct sfw_bweight *next = li + 1 < cf->num_hidden_layers ? &m->layers[li + 1].in_norm : &m->norm;
	sfw_be_add_rmsnorm(be, c->u, c->x, c->out, rs, next, R, D, eps);
	if (c->tap) {
		snprintf(name, sizeof(name), "%s.layer.%d.out", cl->phase, li);
		emit_act(c, name, li, pos0, R, c->x, D);
	}
	return SFW_OK;
}

/* The forward pass proper over the step's R rows (ids already in
 * c->ids_dev): embedding, every layer, leaving the final norm in c->u. The
 * rows belong to np sequences (parts, in row order). */
static enum sfw_status forward_rows(struct sfw_ctx *c, int R, const struct sfwi_part *parts, int np,
				    const struct call *cl, struct sfw_err *err)
{
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	int D = cf->hidden_size;
	char name[64];
	enum sfw_status s;
	sfw_be_embed(be, c->x, &m->embed, c->ids_dev, R, (float)cf->scale_emb);
	if (c->tap) {
		snprintf(name, sizeof(name), "%s.embed", cl->phase);
		emit_act(c, name, -1, parts[0].pos0, R, c->x, D);
	}
	const struct sfw_bweight *first = cf->num_hidden_layers ? &m->layers[0].in_norm : &m->norm;
	sfw_be_rmsnorm(be, c->u, c->x, first, R, D, (float)cf->rms_norm_eps);
	SFW_ASSERT(np >= 1 && np <= SFW_BSEQ_MAX);
	struct sfw_bseq bs[SFW_BSEQ_MAX]; /* the parts as the backend's *_seqs ops take them */
	for (int i = 0; i < np; i++)
		bs[i] = (struct sfw_bseq){parts[i].cache, parts[i].pos0, parts[i].row0, parts[i].R};
	for (int li = 0; li < cf->num_hidden_layers; li++)
		if ((s = layer_step(c, li, R, parts, bs, np, cl, err)) != SFW_OK)
			return s;
	return SFW_OK;
}

/* The selection notes of a context's call that ends with a part in mode
 * `sparse` (sfw_ctx_last_blocks): each sparse layer selected blocks or not;
 * the blocks of the last row are in last_dev (untapped: the pass copied them
 * there, directly or in a recorded step) or already in last_blocks (tapped).
 * Written by the caller after the call, never by the pass, so a recorded
 * step's replay and a recording made ahead need no host-side bookkeeping. */
static void call_notes(struct sfw_ctx *c, int sparse)
{
	struct sfw_model *m = c->m;
	const struct sfw_config *cf = &m->cfg;
	size_t nsel = (size_t)cf->num_key_value_heads * cf->sparse_k;
	for (int li = 0; li < cf->num_hidden_layers; li++) {
		if (m->layers[li].kind != SFW_MIXER_SPARSE)
			continue;
		c->last_state[li] = sparse;
		c->last_fresh[li] = sparse && !c->tap;
		if (!sparse)
			for (size_t i = 0; i < nsel; i++)
				c->last_blocks[(size_t)li * nsel + i] = -1;
	}
}

/* The context's own sequence as a call ending at length end sees it: the
 * sparse layers' mode and block count are fixed for the call from that
 * length, as the reference decides them (positions and rows: the caller's). */
static struct sfwi_part call_part(const struct sfw_ctx *c, int64_t end)
{
	const struct sfw_config *cf = &c->m->cfg;
	struct sfwi_part p = {.cache = c->cache};
	p.sparse = c->p.dense_as_sparse || end >= cf->sparse_dense_len;
	p.nblocks = (end + cf->sparse_block_size - 1) / cf->sparse_block_size;
	return p;
}

/* One piece of a context's call: its rows are part p of the context's own
 * sequence, a batch of one, run by the step function (forward_step: a
 * one-row piece that ends the call is a decode step the backend may
 * replay, and the next token is chosen there as for any batch row; tapped,
 * every tensor is reported on the way). */
static enum sfw_status forward_step(struct sfw_ctx *ws, const int32_t *ids, int R, const struct sfwi_part *parts,
				    int np, const struct sfwi_pick *pick, int nl, float *logits, int32_t *next,
				    void **rec, void **brec, const struct call *cl, struct sfw_err *err);

static enum sfw_status piece(struct sfw_ctx *c, const int32_t *ids, const struct sfwi_part *p,
			     const struct call *cl, float *logits, struct sfw_err *err)
{
	int V = c->m->cfg.vocab_size, R = p->R;
	/* the last row's logits: wanted, or a choice made from them, or a
	 * decode step (whose recording makes them anyway) */
	int nl = p->last_piece && (logits || cl->next || R == 1);
	struct sfwi_pick pick = {R - 1, logits != NULL, cl->sp, cl->u};
	float *host = logits;
	if (nl && !host && !(host = c->host_logits) && !(host = c->host_logits = sfw_malloc((size_t)V * sizeof(float))))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	int32_t none;
	return forward_step(c, ids, R, p, 1, &pick, nl, host, cl->next ? cl->next : &none, &c->step, NULL, cl, err);
}

/* The failure an op could not return itself, taken (cleared) either way;
 * s when s already failed. */
static enum sfw_status op_failure(struct sfw_backend *be, enum sfw_status s, struct sfw_err *err)
{
	struct sfw_err fe = {0};
	enum sfw_status fs = sfwi_take_failure(be, &fe);
	if (s == SFW_OK && fs != SFW_OK) {
		s = fs;
		if (err)
			*err = fe;
	}
	/* a mapped weight file truncated under us read as zeros (core/file.h) */
	return s == SFW_OK ? sfw_map_check(err) : s;
}

static enum sfw_status run_call(struct sfw_ctx *c, const int32_t *ids, size_t n, float *logits,
			       const struct sfw_op_sample_params *sp, double u, int32_t *next, struct sfw_err *err);

enum sfw_status sfw_ctx_prefill(struct sfw_ctx *c, const int32_t *ids, size_t n, float *logits,
				struct sfw_err *err)
{
	return run_call(c, ids, n, logits, NULL, 0, NULL, err);
}

enum sfw_status sfw_ctx_prefill_next(struct sfw_ctx *c, const int32_t *ids, size_t n,
				     const struct sfw_op_sample_params *sp, double u, int32_t *next, struct sfw_err *err)
{
	if (!sp || !next || !(u >= 0 && u < 1) || !(sp->temperature >= 0) || !isfinite(sp->temperature) ||
	    sp->top_k < 0 || !(sp->top_p > 0 && sp->top_p <= 1))
		return sfw_fail(err, SFW_E_INVAL, "invalid sampling parameters");
	return run_call(c, ids, n, NULL, sp, u, next, err);
}

enum sfw_status sfw_ctx_decode_next(struct sfw_ctx *c, int32_t id, const struct sfw_op_sample_params *sp, double u,
				    int32_t *next, struct sfw_err *err)
{
	return sfw_ctx_prefill_next(c, &id, 1, sp, u, next, err);
}

static enum sfw_status run_call(struct sfw_ctx *c, const int32_t *ids, size_t n, float *logits,
			       const struct sfw_op_sample_params *sp, double u, int32_t *next, struct sfw_err *err)
{
	const struct sfw_config *cf = &c->m->cfg;
	struct sfw_backend *be = c->m->be;
	enum sfw_status s;
	if (c->broken)
		return sfw_fail(err, SFW_E_INVAL, "the context is inconsistent after a failed call; reset it");
	struct sfw_err stale = {0}; /* a stale flag belongs to a call that already failed */
	if (sfwi_take_failure(be, &stale) != SFW_OK)
		sfw_log(SFW_LOG_DEBUG, "%s (left by an earlier failed call)", stale.msg);
	if ((s = sfw_map_check(err)) != SFW_OK)
		return s;
	if (n == 0)
		return sfw_fail(err, SFW_E_INVAL, "no tokens to process");
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= cf->vocab_size)
			return sfw_fail(err, SFW_E_INVAL, "token id %d at index %zu is outside the vocabulary (0..%d)",
					(int)ids[i], i, cf->vocab_size - 1);
	if (n > (size_t)INT32_MAX || c->pos + (int64_t)n > (int64_t)INT32_MAX)
		return sfw_fail(err, SFW_E_RANGE, "sequence too long");
	if (c->tap && (s = sfwi_ctx_tap_buffers(c, err)) != SFW_OK)
		return s;
	int64_t end = c->pos + (int64_t)n;
	if ((s = be->cache_reserve(be, c->cache, end, err)) != SFW_OK)
		return s;
	struct call cl;
	cl.sp = sp, cl.u = u, cl.next = next;
	cl.phase = n > 1 ? "prefill" : "decode";
	struct sfwi_part p = call_part(c, end);
	c->last_row = -1;
	for (size_t off = 0; off < n; off += (size_t)c->cap_rows) {
		int R = (int)(n - off < (size_t)c->cap_rows ? n - off : (size_t)c->cap_rows);
		p.pos0 = c->pos, p.R = R;
		p.last_piece = off + (size_t)R == n;
		s = op_failure(be, piece(c, ids + off, &p, &cl, logits, err), err);
		if (s != SFW_OK) {
			c->broken = 1; /* some layers ran this piece, others not */
			return s;
		}
		c->pos += R;
		/* where the last row's logits are (piece): every row's when
		 * tapped, else row 0 when the call wanted them */
		if (p.last_piece)
			c->last_row = c->tap ? R - 1 : logits || next || R == 1 ? 0 : -1;
	}
	sfw_be_wait(be);
	return SFW_OK;
}

enum sfw_status sfw_ctx_decode(struct sfw_ctx *c, int32_t id, float *logits, struct sfw_err *err)
{
	return sfw_ctx_prefill(c, &id, 1, logits, err);
}

/* ---- the batch's step (runner/batch.c) -------------------------------------- */

/* A step's ops: the pass over the rows, then one lm_head product into
 * logits_dev over the wanted rows: straight from u when they are rows 0 ..
 * R-1 in order (a step of decode rows) or one row, else first copied side
 * by side into out (free by then). rows > R: the backend asked for a step
 * of R decode rows padded to `rows` (be->step): the pass and the logits
 * over all the rows. */
struct rows_arg {
	struct sfw_ctx *ws;
	int R;
	const struct sfwi_part *parts;
	int np;
	const struct sfwi_pick *pick;
	int nl;
	const struct call *cl;
};

static enum sfw_status rows_ops(const struct rows_arg *a, int rows, struct sfw_err *err)
{
	struct sfw_ctx *ws = a->ws;
	struct sfw_model *m = ws->m;
	struct sfw_backend *be = m->be;
	int D = m->cfg.hidden_size;
	int in_order = a->nl == a->R;
	for (int i = 0; in_order && i < a->nl; i++)
		in_order = a->pick[i].row == i;
	SFW_ASSERT(rows == a->R || (rows > a->R && rows <= ws->cap_rows && rows <= ws->logits_rows && in_order));
	enum sfw_status s = forward_rows(ws, rows, a->parts, a->np, a->cl, err);
	if (s != SFW_OK)
		return s;
	if (ws->tap) { /* every row's final norm and logits reported, the logits left in host */
		char name[64];
		int V = m->cfg.vocab_size;
		int64_t pos0 = a->parts[0].pos0;
		snprintf(name, sizeof(name), "%s.final_norm", a->cl->phase);
		emit_act(ws, name, -1, pos0, rows, ws->u, D);
		sfw_be_logits(be, ws->logits_dev, ws->u, &m->lm_head, rows, (float)(1.0 / m->cfg.logit_divisor));
		sfw_be_to_host(be, ws->host, ws->logits_dev, (size_t)rows * V * sizeof(float));
		snprintf(name, sizeof(name), "%s.logits", a->cl->phase);
		emit(ws, name, -1, pos0, rows, V, 0, 0, ws->host);
		return SFW_OK;
	}
	if (a->nl == 0)
		return s;
	if (in_order) {
		sfw_be_logits(be, ws->logits_dev, ws->u, &m->lm_head, rows, (float)(1.0 / m->cfg.logit_divisor));
		return SFW_OK;
	}
	if (a->nl == 1) { /* one row (a prompt's last): its logits straight from u */
		sfw_be_logits(be, ws->logits_dev, rows_at(ws, ws->u, a->pick[0].row, (size_t)D), &m->lm_head, 1,
			      (float)(1.0 / m->cfg.logit_divisor));
		return SFW_OK;
	}
	for (int i = 0; i < a->nl; i++)
		sfw_be_copy(be, rows_at(ws, ws->out, i, (size_t)D), rows_at(ws, ws->u, a->pick[i].row, (size_t)D),
			 (size_t)D * sfw_be_act_size(be));
	sfw_be_logits(be, ws->logits_dev, ws->out, &m->lm_head, a->nl, (float)(1.0 / m->cfg.logit_divisor));
	return SFW_OK;
}

enum sfw_status sfwi_forward(struct sfw_ctx *ws, const int32_t *ids, int R, const struct sfwi_part *parts, int np,
			     const struct sfwi_pick *pick, int nl, float *logits, int32_t *next, void **rec,
			     void **brec, struct sfw_err *err)
{
	struct call cl = {"decode", NULL, 0, NULL};
	return forward_step(ws, ids, R, parts, np, pick, nl, logits, next, rec, brec, &cl, err);
}

/* The step function (sfwi_forward); cl names the phase for taps. */
static enum sfw_status forward_step(struct sfw_ctx *ws, const int32_t *ids, int R, const struct sfwi_part *parts,
				    int np, const struct sfwi_pick *pick, int nl, float *logits, int32_t *next,
				    void **rec, void **brec, const struct call *cl, struct sfw_err *err)
{
	struct sfw_model *m = ws->m;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	int V = cf->vocab_size;
	SFW_ASSERT(R >= 1 && R <= ws->cap_rows && nl <= ws->logits_rows);
	SFW_ASSERT(!ws->tap || np == 1); /* taps: a context's own call */
	struct sfw_err stale = {0};
	if (sfwi_take_failure(be, &stale) != SFW_OK)
		sfw_log(SFW_LOG_DEBUG, "%s (left by an earlier failed call)", stale.msg);
	enum sfw_status s = sfw_map_check(err);
	if (s != SFW_OK)
		return s;
	sfw_be_from_host(be, ws->ids_dev, ids, (size_t)R * sizeof(int32_t));
	/* every row a decode row whose logits are wanted in row order: a step
	 * the backend may record and replay (be->step; one sequence's in *rec,
	 * several sequences' in *brec) */
	int decode = R == np && nl == np && !ws->tap;
	for (int i = 0; decode && i < np; i++)
		decode = parts[i].R == 1 && pick[i].row == i;
	struct sfw_bcache *caches[SFW_BSEQ_MAX];
	int64_t pos[SFW_BSEQ_MAX];
	int sparse[SFW_BSEQ_MAX];
	for (int i = 0; i < np; i++)
		caches[i] = parts[i].cache, pos[i] = parts[i].pos0, sparse[i] = parts[i].sparse;
	struct sfw_step st = {np == 1 ? rec : brec, caches, pos, sparse, np, decode && (np == 1 ? rec : brec) != NULL,
			      ws->cap_rows < ws->logits_rows ? ws->cap_rows : ws->logits_rows, R, 0, 0, 0};
	struct rows_arg a = {ws, R, parts, np, pick, nl, cl};
	do {
		st.rows = R;
		if ((s = sfwi_step(be, &st, 0, err)) != SFW_OK)
			return s;
		s = rows_ops(&a, st.rows, err);
		st.failed = s != SFW_OK;
		enum sfw_status se = sfwi_step(be, &st, 1, err);
		if ((s = op_failure(be, s != SFW_OK ? s : se, err)) != SFW_OK)
			return s;
	} while (st.again);
	ws->step_replays += st.replayed; /* for tests */
	if (np == 1 && parts[0].cache == ws->cache && parts[0].last_piece)
		call_notes(ws, parts[0].sparse); /* a context's own call */
	if (nl == 0)
		return SFW_OK;
	if (ws->tap) { /* the logits are on the host already: the choices there */
		for (int i = 0; i < nl; i++) {
			const float *row = ws->host + (size_t)pick[i].row * V;
			if (pick[i].host)
				memcpy(logits + (size_t)i * V, row, (size_t)V * sizeof(float));
			next[i] = pick[i].sp ? sfw_op_sample_cpu(NULL, row, V, pick[i].sp, pick[i].u) : -1;
			if (pick[i].sp && next[i] < 0) /* no scratch (kernels/ops.h) */
				return sfw_fail(err, SFW_E_NOMEM, "out of memory for sampling");
		}
		return SFW_OK;
	}
	/* the choices on the backend (one id each back; one call for all the
	 * rows), the logits on the host only where asked or where the backend
	 * left the choice to it */
	SFW_ASSERT(nl <= SFW_BSEQ_MAX);
	int sampled = 0, all_host = 1, on_be[SFW_BSEQ_MAX], nomem = 0;
	const struct sfw_op_sample_params *sps[SFW_BSEQ_MAX];
	double us[SFW_BSEQ_MAX];
	for (int i = 0; i < nl; i++) {
		all_host &= pick[i].host;
		sps[i] = pick[i].sp, us[i] = pick[i].u;
		sampled |= pick[i].sp != NULL;
	}
	int taken = sampled && sfw_be_sample(be, ws->next_dev, ws->logits_dev, V, nl, sps, us);
	sampled = taken;
	for (int i = 0; i < nl; i++)
		on_be[i] = taken && pick[i].sp;
	if (sampled)
		sfw_be_to_host(be, next, ws->next_dev, (size_t)nl * sizeof(int32_t));
	if (all_host)
		sfw_be_to_host(be, logits, ws->logits_dev, (size_t)nl * V * sizeof(float));
	for (int i = 0; i < nl; i++) {
		float *row = logits + (size_t)i * V;
		if (!on_be[i])
			next[i] = -1;
		int host_choice = pick[i].sp && next[i] < 0;
		if (!all_host && (pick[i].host || host_choice))
			sfw_be_to_host(be, row, ws->logits_dev + (size_t)i * V, (size_t)V * sizeof(float));
		if (host_choice) {
			next[i] = sfw_op_sample_cpu(NULL, row, V, pick[i].sp, pick[i].u);
			nomem |= next[i] < 0; /* no scratch (kernels/ops.h) */
		}
	}
	return op_failure(be, nomem ? sfw_fail(err, SFW_E_NOMEM, "out of memory for sampling") : SFW_OK, err);
}
