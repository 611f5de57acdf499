/* fused.c - CPU twins of the fused ops (kernels/fused.cu): each is the
 * composition of the unfused CPU ops, so a backend that fuses must give
 * what the unfused sequence gives (docs/style.md §13.10). */
#include "kernels/ops.h"

void sfw_op_add_rmsnorm_cpu(struct sfw_ops_cpu *ex, float *y, float *x, const float *b, float scale, const void *w,
			    const struct sfw_norm_shape *sh)
{
	int rows = sh->rows, n = sh->n;
	float eps = sh->eps;
	enum sfw_dtype wdt = sh->wdt;
	sfw_op_add_scaled_cpu(x, b, (size_t)rows * (size_t)n, scale);
	sfw_op_rmsnorm_cpu(ex, y, x, w, wdt, rows, n, eps);
}

void sfw_op_rmsnorm_gate_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, const float *z,
			     const struct sfw_norm_shape *sh)
{
	int rows = sh->rows, n = sh->n;
	float eps = sh->eps;
	enum sfw_dtype wdt = sh->wdt;
	sfw_op_rmsnorm_cpu(ex, y, x, w, wdt, rows, n, eps);
	sfw_op_sigmoid_mul_cpu(y, y, z, (size_t)rows * (size_t)n);
}

/* No rounding between the steps: the CPU backend's activations are fp32. */
void sfw_op_qk_norm_rope_cpu(struct sfw_ops_cpu *ex, float *q, float *k, const void *qw, const void *kw,
			     const struct sfw_qk_shape *sh)
{
	int T = sh->T, nhq = sh->nhq, nhk = sh->nhk, hd = sh->hd, rope = sh->rope;
	enum sfw_dtype qwdt = sh->qwdt, kwdt = sh->kwdt;
	float eps = sh->eps, theta = sh->theta;
	int64_t pos0 = sh->pos0;
	if (qw)
		sfw_op_rmsnorm_cpu(ex, q, q, qw, qwdt, T * nhq, hd, eps);
	if (kw)
		sfw_op_rmsnorm_cpu(ex, k, k, kw, kwdt, T * nhk, hd, eps);
	if (rope) {
		sfw_op_rope_neox_cpu(q, T, nhq, hd, pos0, theta);
		sfw_op_rope_neox_cpu(k, T, nhk, hd, pos0, theta);
	}
}
