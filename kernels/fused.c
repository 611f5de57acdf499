/* fused.c - CPU twins of the fused ops (kernels/fused.cu): each is the
 * composition of the unfused CPU ops, so a backend that fuses must give
 * what the unfused sequence gives (style.md §13.10). */
#include "kernels/ops.h"

void sfw_op_add_rmsnorm_cpu(float *y, float *x, const float *b, float scale, const void *w, enum sfw_op_dtype wdt,
			    int rows, int n, float eps)
{
	sfw_op_add_scaled_cpu(x, b, (size_t)rows * (size_t)n, scale);
	sfw_op_rmsnorm_cpu(y, x, w, wdt, rows, n, eps);
}
