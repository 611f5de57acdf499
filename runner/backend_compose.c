/* backend_compose.c - the fused members of struct sfw_backend that no
 * kernel twin composes (runner/backend.h): projection groups, SwiGLU over a
 * group, q/k norms and RoPE for a backend whose fused kernel does not take
 * the shape, and the per-sequence ops one sequence at a time. A backend
 * without the fused kernel fills its member with these, so forward.c calls
 * every op the same way on every backend (docs/style.md §13.10); the
 * compositions of the fused kernels themselves (add + norm, norm + gate,
 * q/k norm + RoPE) are their C twins, kernels/fused.c. */
#include "runner/backend.h"
#include "log.h"

#include <stddef.h>
#include <string.h>

void sfwi_compose_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M)
{
	size_t off = 0;
	for (int i = 0; i < g->n; i++) {
		sfw_be_matmul(be, (char *)y + off * sfw_be_act_size(be), x, g->part[i], M);
		off += (size_t)M * (size_t)g->part[i]->rows;
	}
}

void sfwi_compose_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu,
			 int M)
{
	size_t n = (size_t)M * (size_t)gu->part[0]->rows;
	sfw_be_matmul_group(be, tmp, x, gu, M);
	sfw_be_silu_mul(be, y, tmp, (char *)tmp + n * sfw_be_act_size(be), n);
}

void sfwi_compose_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			       const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			       int64_t pos0, float theta)
{
	if (qw)
		sfw_be_rmsnorm(be, q, q, qw, T * nhq, hd, eps);
	if (kw)
		sfw_be_rmsnorm(be, k, k, kw, T * nhk, hd, eps);
	if (rope) {
		sfw_be_rope_neox(be, q, T, nhq, hd, pos0, theta);
		sfw_be_rope_neox(be, k, T, nhk, hd, pos0, theta);
	}
}

int sfwi_weight_dtype_ok(enum sfw_opk op, enum sfw_dtype dt)
{
	switch (op) {
	case SFW_OP_MATMUL:
	case SFW_OP_MATMUL_GROUP:
	case SFW_OP_SWIGLU:
	case SFW_OP_LOGITS:
		return dt == SFW_DTYPE_BF16 || dt == SFW_DTYPE_F32 || dt == SFW_DTYPE_W8;
	case SFW_OP_EMBED:
	case SFW_OP_RMSNORM:
	case SFW_OP_ADD_RMSNORM:
	case SFW_OP_RMSNORM_GATE:
	case SFW_OP_QK_NORM_ROPE:
	case SFW_OP_QK_NORM_ROPE_SEQS:
		return dt == SFW_DTYPE_BF16 || dt == SFW_DTYPE_F32;
	default:
		return 1;
	}
}

/* ---- the one place that stands in for what a backend does not have ------- */

/* The weight dtype an op is asked about (supports_op). */
static enum sfw_dtype op_dtype(const struct sfw_op *op)
{
	const struct sfw_bweight *w = NULL;
	switch (op->kind) {
	case SFW_OP_MATMUL:
	case SFW_OP_LOGITS:
		w = op->mm.w;
		break;
	case SFW_OP_MATMUL_GROUP:
	case SFW_OP_SWIGLU:
		w = op->mm.g->part[0];
		break;
	case SFW_OP_QK_NORM_ROPE:
	case SFW_OP_QK_NORM_ROPE_SEQS:
		w = op->qk.qw ? op->qk.qw : op->qk.kw;
		break;
	default:
		break;
	}
	return w ? w->dtype : SFW_DTYPE_F32;
}

/* An op the backend does not take, as the unfused ops it is made of. */
static enum sfw_status compose(struct sfw_backend *be, const struct sfw_op *op, struct sfw_err *err)
{
	const struct sfw_op *o = op;
	switch (op->kind) {
	case SFW_OP_MATMUL_GROUP:
		sfwi_compose_matmul_group(be, o->mm.y, o->mm.x, o->mm.g, o->mm.M);
		return SFW_OK;
	case SFW_OP_SWIGLU:
		sfwi_compose_swiglu(be, o->mm.y, o->mm.tmp, o->mm.x, o->mm.g, o->mm.M);
		return SFW_OK;
	case SFW_OP_QK_NORM_ROPE:
		sfwi_compose_qk_norm_rope(be, o->qk.q, o->qk.k, o->qk.qw, o->qk.kw, o->qk.T, o->qk.nhq, o->qk.nhk,
					  o->qk.hd, o->qk.eps, o->qk.rope, o->qk.pos0, o->qk.theta);
		return SFW_OK;
	case SFW_OP_QK_NORM_ROPE_SEQS:
		sfwi_compose_qk_norm_rope_seqs(be, o->qk.q, o->qk.k, o->qk.qw, o->qk.kw, o->qk.s, o->qk.ns, o->qk.nhq,
					       o->qk.nhk, o->qk.hd, o->qk.eps, o->qk.rope, o->qk.theta);
		return SFW_OK;
	case SFW_OP_GLA_SEQS:
		sfwi_compose_gla_seqs(be, o->seqs.o, o->seqs.q, o->seqs.k, o->seqs.v, o->seqs.s, o->seqs.ns,
				      o->seqs.layer, o->seqs.decay, o->seqs.nh, o->seqs.hd, o->seqs.scale);
		return SFW_OK;
	case SFW_OP_KV_APPEND_SEQS:
		sfwi_compose_kv_append_seqs(be, o->seqs.s, o->seqs.ns, o->seqs.layer, o->seqs.k, o->seqs.v, o->seqs.kvd);
		return SFW_OK;
	case SFW_OP_COMPRESS_SEQS:
		return sfwi_compose_compress_seqs(be, o->seqs.s, o->seqs.ns, o->seqs.layer, err);
	case SFW_OP_ATTN_DENSE_SEQS:
		sfwi_compose_attn_dense_seqs(be, o->seqs.o, o->seqs.q, o->seqs.s, o->seqs.ns, o->seqs.layer, o->seqs.nh,
					     o->seqs.hd, o->seqs.scale);
		return SFW_OK;
	default:
		return sfw_fail(err, SFW_E_UNSUPPORTED, "the %s backend has no op %d and it has no composition", be->name,
				(int)op->kind);
	}
}

enum sfw_status sfwi_op(struct sfw_backend *be, const struct sfw_op *op, struct sfw_err *err)
{
	switch (op->kind) {
	case SFW_OP_MATMUL_GROUP:
	case SFW_OP_SWIGLU:
	case SFW_OP_QK_NORM_ROPE:
	case SFW_OP_QK_NORM_ROPE_SEQS:
	case SFW_OP_GLA_SEQS:
	case SFW_OP_KV_APPEND_SEQS:
	case SFW_OP_COMPRESS_SEQS:
	case SFW_OP_ATTN_DENSE_SEQS: /* the composable ops: the backend's, when it takes them */
		if (!be->supports_op(be, op->kind, op_dtype(op)))
			return compose(be, op, err);
		break;
	default:
		break;
	}
	return be->op(be, op, err);
}

enum sfw_status sfwi_step(struct sfw_backend *be, struct sfw_step *st, struct sfw_err *err)
{
	st->replayed = 0;
	if (be->step)
		return be->step(be, st, err);
	return st->record_only ? SFW_OK : st->fn(st->arg, st->n, err);
}

void sfwi_step_free(struct sfw_backend *be, void *rec)
{
	if (be->step_free && rec)
		be->step_free(be, rec);
}

enum sfw_status sfwi_load(struct sfw_backend *be, int end, struct sfw_err *err)
{
	return be->load ? be->load(be, end, err) : SFW_OK;
}

enum sfw_status sfwi_take_failure(struct sfw_backend *be, struct sfw_err *err)
{
	return be->sync(be, 0, err);
}

void sfw_be_wait(struct sfw_backend *be)
{
	struct sfw_err e = {0};
	if (be->sync(be, 1, &e) != SFW_OK)
		sfw_log(SFW_LOG_DEBUG, "%s (an op's failure, found waiting)", e.msg);
}

/* ---- projection groups ------------------------------------------------------ */

/* The merged matrix that g's parts form when the backend placed them as
 * consecutive row ranges (be->merge): g->merged is its view (rows 0 when
 * they are separate). */
void sfwi_group_view(struct sfw_bgroup *g)
{
	const struct sfw_bweight *p0 = g->part[0];
	int w8 = p0->dtype == SFW_DTYPE_W8;
	memset(&g->merged, 0, sizeof(g->merged));
	if (!p0->dev || (p0->dtype != SFW_DTYPE_BF16 && !w8))
		return;
	/* bytes per row: bf16, or int8 codes plus (separately) scales */
	size_t rb = w8 ? sfw_bweight_w8_code_row(p0) : (size_t)p0->cols * 2;
	size_t sb = w8 ? sfw_bweight_w8_scale_row(p0) : 0;
	int64_t rows = 0;
	for (int i = 0; i < g->n; i++) {
		const struct sfw_bweight *w = g->part[i];
		if (!w->dev || w->dtype != p0->dtype || w->cols != p0->cols ||
		    (const char *)w->dev != (const char *)p0->dev + (size_t)rows * rb)
			return;
		if (w8 && (w->group != p0->group || w->scale_dtype != p0->scale_dtype || !w->scales_dev ||
			   (const char *)w->scales_dev != (const char *)p0->scales_dev + (size_t)rows * sb))
			return;
		rows += w->rows;
	}
	struct sfw_bweight *o = &g->merged;
	o->name = "merged";
	o->dev = p0->dev;
	o->dtype = p0->dtype;
	o->rows = rows;
	o->cols = p0->cols;
	if (w8) {
		o->scales_dev = p0->scales_dev;
		o->scale_dtype = p0->scale_dtype;
		o->group = p0->group;
	}
}

enum sfw_status sfwi_group_bind(struct sfw_backend *be, struct sfw_bgroup *g, struct sfw_err *err)
{
	int merged = 0;
	enum sfw_status s = be->merge ? be->merge(be, g->part, g->n, &merged, err) : SFW_OK;
	if (s == SFW_OK)
		sfwi_group_view(g);
	return s;
}

/* ---- the per-sequence ops, sequence by sequence ------------------------------ */

/* Row r of a step buffer of rows w elements wide. */
static void *row_at(const struct sfw_backend *be, const void *buf, int r, size_t w)
{
	return (char *)buf + (size_t)r * w * sfw_be_act_size(be);
}

void sfwi_compose_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				    const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk,
				    int hd, float eps, int rope, float theta)
{
	for (int i = 0; i < ns; i++)
		sfw_be_qk_norm_rope(be, row_at(be, q, s[i].row0, (size_t)nhq * hd), row_at(be, k, s[i].row0, (size_t)nhk * hd),
				 qw, kw, s[i].R, nhq, nhk, hd, eps, rope, s[i].pos0, theta);
}

void sfwi_compose_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			   const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale)
{
	size_t w = (size_t)nh * hd;
	for (int i = 0; i < ns; i++)
		sfw_be_gla(be, row_at(be, o, s[i].row0, w), row_at(be, q, s[i].row0, w), row_at(be, k, s[i].row0, w),
			row_at(be, v, s[i].row0, w), s[i].cache, layer, decay, s[i].R, nh, hd, scale);
}

void sfwi_compose_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
				 const void *v, int kvd)
{
	for (int i = 0; i < ns; i++)
		sfw_be_kv_append(be, s[i].cache, layer, row_at(be, k, s[i].row0, (size_t)kvd),
			      row_at(be, v, s[i].row0, (size_t)kvd), s[i].R);
}

enum sfw_status sfwi_compose_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer,
					   struct sfw_err *err)
{
	enum sfw_status st = SFW_OK;
	for (int i = 0; i < ns && st == SFW_OK; i++)
		st = sfw_be_compress(be, s[i].cache, layer, err);
	return st;
}

void sfwi_compose_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
				  int layer, int nh, int hd, float scale)
{
	size_t w = (size_t)nh * hd;
	for (int i = 0; i < ns; i++)
		sfw_be_attn_dense(be, row_at(be, o, s[i].row0, w), row_at(be, q, s[i].row0, w), s[i].cache, layer, s[i].R,
			       nh, scale);
}
