/* backend_compose.c - the fused members of struct sfw_backend as the
 * compositions of its unfused ops (runner/backend.h). A backend without a
 * fused kernel fills its member with these, so forward.c calls every op
 * the same way on every backend (docs/style.md §13.10). */
#include "runner/backend.h"

#include <stddef.h>

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
