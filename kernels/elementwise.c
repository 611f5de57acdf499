/* elementwise.c - CPU twins of the elementwise ops, the norms, RoPE, and the
 * process-wide thread count of the CPU ops (kernels/ops.h). */
#include "kernels/ops.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <stdatomic.h>

static atomic_int g_threads;

void sfw_ops_cpu_set_threads(int n)
{
	/* per-thread scratch (matmul, attention) is sized for 256 threads */
	atomic_store(&g_threads, n > 256 ? 256 : n > 0 ? n : 0);
}

static atomic_int g_failed;

void sfwi_ops_cpu_fail(void)
{
	atomic_store(&g_failed, 1);
}

int sfw_ops_cpu_take_failure(void)
{
	return atomic_exchange(&g_failed, 0);
}

int sfw_ops_cpu_threads(void)
{
	int n = atomic_load(&g_threads);
	return n > 0 ? n : sfw_default_threads();
}

void sfw_op_embed_cpu(float *x, const void *E, enum sfw_op_dtype edt, const int32_t *ids, int T, int D,
		      float scale)
{
	for (int t = 0; t < T; t++) {
		size_t base = (size_t)ids[t] * (size_t)D;
		for (int i = 0; i < D; i++)
			x[(size_t)t * D + i] = sfw_op_wget(E, edt, base + i) * scale;
	}
}

struct norm_job {
	float *y;
	const float *x;
	const void *w;
	enum sfw_op_dtype wdt;
	int n;
	float eps;
};

static void norm_rows(void *ctx, size_t b, size_t e, int tid)
{
	const struct norm_job *j = ctx;
	(void)tid;
	for (size_t r = b; r < e; r++) {
		const float *x = j->x + r * (size_t)j->n;
		float *y = j->y + r * (size_t)j->n;
		double ss = 0; /* double: the mean of squares is the one long sum here */
		for (int i = 0; i < j->n; i++)
			ss += (double)x[i] * x[i];
		float inv = 1.0f / sqrtf((float)(ss / j->n) + j->eps);
		for (int i = 0; i < j->n; i++)
			y[i] = x[i] * inv * sfw_op_wget(j->w, j->wdt, (size_t)i);
	}
}

void sfw_op_rmsnorm_cpu(float *y, const float *x, const void *w, enum sfw_op_dtype wdt, int rows, int n,
			float eps)
{
	struct norm_job j = {y, x, w, wdt, n, eps};
	size_t grain = (size_t)(rows * (size_t)n > 65536 ? 16 : rows);
	if (grain == 0)
		grain = 1;
	sfw_parallel_for(grain >= (size_t)rows ? 1 : sfw_ops_cpu_threads(), (size_t)rows, grain, norm_rows, &j);
}

void sfw_op_add_scaled_cpu(float *x, const float *b, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] += scale * b[i];
}

void sfw_op_silu_mul_cpu(float *y, const float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];
		y[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

void sfw_op_sigmoid_mul_cpu(float *y, const float *x, const float *gate, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}

void sfw_op_rope_neox_cpu(float *x, int T, int nh, int hd, int64_t pos0, float theta)
{
	int half = hd / 2;
	float inv[512];
	SFW_ASSERT(half <= 512 && hd == 2 * half); /* the config bounds head_dim */
	/* As torch: inv_freq = 1 / theta ** (arange(0, hd, 2).float() / hd), in float32. */
	for (int m = 0; m < half; m++)
		inv[m] = 1.0f / powf(theta, (float)(2 * m) / (float)hd);
	for (int t = 0; t < T; t++) {
		float p = (float)(pos0 + t);
		float c[512], s[512];
		for (int m = 0; m < half; m++) {
			float a = p * inv[m];
			c[m] = cosf(a);
			s[m] = sinf(a);
		}
		for (int h = 0; h < nh; h++) {
			float *v = x + ((size_t)t * nh + h) * hd;
			for (int m = 0; m < half; m++) {
				float a = v[m], b = v[m + half];
				v[m] = a * c[m] - b * s[m];
				v[m + half] = b * c[m] + a * s[m];
			}
		}
	}
}
