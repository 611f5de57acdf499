/* awq_cuda.c - the AWQ search's GPU side (CUDA=1 builds; quant_int.h): one
 * smoothing group at a time on the current device, from the balance
 * weights' device copies (struct sfw_bweight.dev, as the model's backend
 * uploaded them: the bytes of the file, bf16 or f32) and the cached input
 * rows the calibration kept on the host. The arithmetic is kernels/awq.cu's,
 * bit for bit the CPU search's (awq.c), so the losses, and with them the
 * chosen alpha and scales, are the same.
 *
 * The seam to the engine is that one field: the weights are read where the
 * backend put them, on a stream of our own, after the backend's sync; no
 * other engine state is touched. Device memory: W and Wq [N, K] float, X
 * [R, K], Y and Yq [R, N] and small vectors, grown to the largest group
 * (about 1.1 GiB for the full model's gate|up with 256 rows). */
#include "quant/quant_int.h"
#include "alloc.h"
#include "kernels/awq_cuda.h"
#include "kernels/ops_cuda.h"
#include "runner/backend.h"

#include <string.h>

struct dbuf {
	void *p;
	size_t cap;
};

struct sfwi_awq_dev {
	void *stream;
	struct dbuf W, Wq, X, Y, Yq, gmax, wm, s, part, bad;
	int64_t N;
	int K, R;
};

/* At least bytes in b (its contents are not kept). */
static enum sfw_status need(struct dbuf *b, size_t bytes, struct sfw_err *err)
{
	if (bytes <= b->cap)
		return SFW_OK;
	sfw_cuda_free(b->p);
	b->p = NULL;
	b->cap = 0;
	enum sfw_status s = sfw_cuda_malloc(&b->p, bytes, "the AWQ search", err);
	if (s == SFW_OK)
		b->cap = bytes;
	return s;
}

enum sfw_status sfwi_awq_dev_new(struct sfwi_awq_dev **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfwi_awq_dev *d = sfw_calloc(1, sizeof(*d));
	if (!d)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status s = sfw_cuda_stream_new(&d->stream, err);
	if (s != SFW_OK) {
		sfw_free(d);
		return s;
	}
	*out = d;
	return SFW_OK;
}

void sfwi_awq_dev_free(struct sfwi_awq_dev *d)
{
	if (!d)
		return;
	sfw_cuda_sync(d->stream);
	struct dbuf *b[] = {&d->W, &d->Wq, &d->X, &d->Y, &d->Yq, &d->gmax, &d->wm, &d->s, &d->part, &d->bad};
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
		sfw_cuda_free(b[i]->p);
	sfw_cuda_stream_free(d->stream);
	sfw_free(d);
}

enum sfw_status sfwi_awq_dev_begin(struct sfwi_awq_dev *d, const struct sfwi_awq_group *g, int span, float *wm,
				   struct sfw_err *err)
{
	int64_t N = 0;
	for (int i = 0; i < g->n; i++)
		N += g->w[i]->rows;
	size_t K = (size_t)g->K, R = (size_t)g->R, G = (K + (size_t)span - 1) / (size_t)span;
	enum sfw_status s;
	if ((s = need(&d->W, (size_t)N * K * 4, err)) != SFW_OK || (s = need(&d->Wq, (size_t)N * K * 4, err)) != SFW_OK ||
	    (s = need(&d->X, R * K * 4, err)) != SFW_OK || (s = need(&d->Y, R * (size_t)N * 4, err)) != SFW_OK ||
	    (s = need(&d->Yq, R * (size_t)N * 4, err)) != SFW_OK || (s = need(&d->gmax, (size_t)N * G * 4, err)) != SFW_OK ||
	    (s = need(&d->wm, K * 4, err)) != SFW_OK || (s = need(&d->s, K * 4, err)) != SFW_OK ||
	    (s = need(&d->part, R * 8, err)) != SFW_OK || (s = need(&d->bad, sizeof(int), err)) != SFW_OK)
		return s;
	d->N = N, d->K = g->K, d->R = g->R;
	size_t r0 = 0;
	for (int i = 0; i < g->n; i++) { /* the parts stacked as one [N, K] */
		const struct sfw_bweight *w = g->w[i];
		sfw_cuda_awq_to_f32((float *)d->W.p + r0 * K, w->dev, w->dtype, (size_t)w->rows * K, d->stream);
		r0 += (size_t)w->rows;
	}
	sfw_cuda_h2d(d->X.p, g->X, R * K * 4, d->stream);
	sfw_cuda_awq_duo(d->wm.p, d->gmax.p, d->W.p, (int)N, g->K, span, d->stream);
	sfw_cuda_awq_matmul(d->Y.p, d->X.p, d->W.p, g->R, (int)N, g->K, d->stream);
	sfw_cuda_d2h(wm, d->wm.p, K * 4, d->stream);
	sfw_cuda_sync(d->stream);
	return SFW_OK;
}

enum sfw_status sfwi_awq_dev_loss(struct sfwi_awq_dev *d, const float *s, int group, double *part, int64_t *bad_row,
				  struct sfw_err *err)
{
	(void)err;
	size_t K = (size_t)d->K;
	int bad = SFW_CUDA_AWQ_NO_BAD;
	sfw_cuda_h2d(d->s.p, s, K * 4, d->stream);
	sfw_cuda_awq_fake(d->Wq.p, d->bad.p, d->W.p, d->s.p, (int)d->N, d->K, group, d->stream);
	sfw_cuda_awq_matmul(d->Yq.p, d->X.p, d->Wq.p, d->R, (int)d->N, d->K, d->stream);
	sfw_cuda_awq_sqerr_rows(d->part.p, d->Yq.p, d->Y.p, d->R, (int)d->N, d->stream);
	sfw_cuda_d2h(&bad, d->bad.p, sizeof(int), d->stream);
	sfw_cuda_d2h(part, d->part.p, (size_t)d->R * 8, d->stream);
	sfw_cuda_sync(d->stream);
	*bad_row = bad == SFW_CUDA_AWQ_NO_BAD ? -1 : (int64_t)bad;
	return SFW_OK;
}
