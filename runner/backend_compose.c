/* backend_compose.c - the fused members of struct sfw_backend that no
 * kernel twin composes (runner/backend.h): projection groups, SwiGLU over a
 * group, q/k norms and RoPE for a backend whose fused kernel does not take
 * the shape, and the per-sequence ops one sequence at a time. A backend
 * without the fused kernel fills its member with these, so forward.c calls
 * every op the same way on every backend (docs/style.md §13.10); the
 * compositions of the fused kernels themselves (add + norm, norm + gate,
 * q/k norm + RoPE) are their C twins, kernels/fused.c. */
#include "runner/backend.h"

#include <stddef.h>
#include <string.h>

void sfwi_compose_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M)
{
	size_t off = 0;
	for (int i = 0; i < g->n; i++) {
		be->matmul(be, (char *)y + off * be->act_size, x, g->part[i], M);
		off += (size_t)M * (size_t)g->part[i]->rows;
	}
}

void sfwi_compose_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu,
			 int M)
{
	size_t n = (size_t)M * (size_t)gu->part[0]->rows;
	be->matmul_group(be, tmp, x, gu, M);
	be->silu_mul(be, y, tmp, (char *)tmp + n * be->act_size, n);
}

void sfwi_compose_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			       const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			       int64_t pos0, float theta)
{
	if (qw)
		be->rmsnorm(be, q, q, qw, T * nhq, hd, eps);
	if (kw)
		be->rmsnorm(be, k, k, kw, T * nhk, hd, eps);
	if (rope) {
		be->rope_neox(be, q, T, nhq, hd, pos0, theta);
		be->rope_neox(be, k, T, nhk, hd, pos0, theta);
	}
}

int sfwi_weight_dtype_ok(enum sfw_bop op, enum sfw_dtype dt)
{
	switch (op) {
	case SFW_BOP_MATMUL:
	case SFW_BOP_LOGITS:
		return dt == SFW_DTYPE_BF16 || dt == SFW_DTYPE_F32 || dt == SFW_DTYPE_W8;
	case SFW_BOP_EMBED:
	case SFW_BOP_NORM:
		return dt == SFW_DTYPE_BF16 || dt == SFW_DTYPE_F32;
	case SFW_BOP_POOL:
	case SFW_BOP_RECORD:
		break;
	}
	return 0;
}

enum sfw_status sfwi_step_direct(struct sfw_backend *be, void **rec, struct sfw_bcache *c, int64_t pos, int sparse,
				 sfw_step_fn fn, void *arg, int *replayed, struct sfw_err *err)
{
	(void)be, (void)rec, (void)c, (void)pos, (void)sparse;
	*replayed = 0;
	return fn(arg, err);
}

void sfwi_step_free_none(struct sfw_backend *be, void *rec)
{
	(void)be, (void)rec;
}

enum sfw_status sfwi_step_seqs_direct(struct sfw_backend *be, void **rec, struct sfw_bcache *const *caches,
				      const int64_t *pos, const int *sparse, int n, int max_rows, sfw_rows_fn fn,
				      void *arg, int *replayed, struct sfw_err *err)
{
	(void)be, (void)rec, (void)caches, (void)pos, (void)sparse, (void)max_rows;
	*replayed = 0;
	return fn(arg, n, err);
}

enum sfw_status sfwi_step_record_none(struct sfw_backend *be, void **rec, struct sfw_bcache *c, int64_t pos,
				      int sparse, sfw_step_fn fn, void *arg, struct sfw_err *err)
{
	(void)be, (void)rec, (void)c, (void)pos, (void)sparse, (void)fn, (void)arg, (void)err;
	return SFW_OK;
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
	enum sfw_status s = be->merge(be, g->part, g->n, &merged, err);
	if (s == SFW_OK)
		sfwi_group_view(g);
	return s;
}

/* ---- the per-sequence ops, sequence by sequence ------------------------------ */

/* Row r of a step buffer of rows w elements wide. */
static void *row_at(const struct sfw_backend *be, const void *buf, int r, size_t w)
{
	return (char *)buf + (size_t)r * w * be->act_size;
}

void sfwi_compose_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				    const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk,
				    int hd, float eps, int rope, float theta)
{
	for (int i = 0; i < ns; i++)
		be->qk_norm_rope(be, row_at(be, q, s[i].row0, (size_t)nhq * hd), row_at(be, k, s[i].row0, (size_t)nhk * hd),
				 qw, kw, s[i].R, nhq, nhk, hd, eps, rope, s[i].pos0, theta);
}

void sfwi_compose_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			   const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale)
{
	size_t w = (size_t)nh * hd;
	for (int i = 0; i < ns; i++)
		be->gla(be, row_at(be, o, s[i].row0, w), row_at(be, q, s[i].row0, w), row_at(be, k, s[i].row0, w),
			row_at(be, v, s[i].row0, w), s[i].cache, layer, decay, s[i].R, nh, hd, scale);
}

void sfwi_compose_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
				 const void *v, int kvd)
{
	for (int i = 0; i < ns; i++)
		be->kv_append(be, s[i].cache, layer, row_at(be, k, s[i].row0, (size_t)kvd),
			      row_at(be, v, s[i].row0, (size_t)kvd), s[i].R);
}

enum sfw_status sfwi_compose_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer,
					   struct sfw_err *err)
{
	enum sfw_status st = SFW_OK;
	for (int i = 0; i < ns && st == SFW_OK; i++)
		st = be->compress(be, s[i].cache, layer, err);
	return st;
}

void sfwi_compose_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
				  int layer, int nh, int hd, float scale)
{
	size_t w = (size_t)nh * hd;
	for (int i = 0; i < ns; i++)
		be->attn_dense(be, row_at(be, o, s[i].row0, w), row_at(be, q, s[i].row0, w), s[i].cache, layer, s[i].R,
			       nh, scale);
}
