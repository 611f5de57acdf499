/* backend_compose.c - the fused members of struct sfw_backend as the
 * compositions of its unfused ops (runner/backend.h). A backend without a
 * fused kernel fills its member with these, so forward.c calls every op
 * the same way on every backend (docs/style.md §13.10). */
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

void sfwi_compose_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			      const struct sfw_bweight *w, int rows, int n, float eps)
{
	be->add_scaled(be, x, b, (size_t)rows * (size_t)n, scale);
	be->rmsnorm(be, y, x, w, rows, n, eps);
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
