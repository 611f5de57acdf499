/* elementwise.c - CPU twins of the elementwise ops, the norms, RoPE, and the
 * CPU ops' executor (kernels/ops.h). */
#include "kernels/ops.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <stdatomic.h>

#include "alloc.h"

struct sfw_ops_cpu {
	struct sfw_pool *pool;
	atomic_int failed;
};

/* The executor bound to this thread, and the flag failures go to when none is. */
static _Thread_local struct sfw_ops_cpu *t_bound;
static _Thread_local int t_failed;
static _Thread_local int t_in_job; /* inside a parallel-for: a nested one runs inline */

enum sfw_status sfw_ops_cpu_new(int nthreads, struct sfw_ops_cpu **out, struct sfw_err *err)
{
	struct sfw_ops_cpu *ex = sfw_calloc(1, sizeof(*ex));
	if (!ex)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the CPU executor");
	enum sfw_status s = sfw_pool_new(nthreads, &ex->pool, err);
	if (s != SFW_OK) {
		sfw_free(ex);
		return s;
	}
	atomic_init(&ex->failed, 0);
	*out = ex;
	return SFW_OK;
}

void sfw_ops_cpu_free(struct sfw_ops_cpu *ex)
{
	if (!ex)
		return;
	sfw_pool_free(ex->pool);
	sfw_free(ex);
}

struct sfw_ops_cpu *sfw_ops_cpu_bind(struct sfw_ops_cpu *ex)
{
	struct sfw_ops_cpu *prev = t_bound;
	t_bound = ex;
	return prev;
}

int sfw_ops_cpu_threads(void)
{
	return t_bound ? sfw_pool_threads(t_bound->pool) : 1;
}

void sfwi_ops_cpu_fail(void)
{
	if (t_bound)
		atomic_store(&t_bound->failed, 1);
	else
		t_failed = 1;
}

int sfw_ops_cpu_take_failure(struct sfw_ops_cpu *ex)
{
	if (ex)
		return atomic_exchange(&ex->failed, 0);
	int f = t_failed;
	t_failed = 0;
	return f;
}

struct bound_job {
	struct sfw_ops_cpu *ex;
	sfw_range_fn fn;
	void *ctx;
};

/* A pool worker runs the range with the caller's executor bound. */
static void bound_range(void *ctx, size_t b, size_t e, int tid)
{
	const struct bound_job *j = ctx;
	struct sfw_ops_cpu *prev = sfw_ops_cpu_bind(j->ex);
	int in = t_in_job;
	t_in_job = 1;
	j->fn(j->ctx, b, e, tid);
	t_in_job = in;
	sfw_ops_cpu_bind(prev);
}

void sfwi_ops_cpu_for(int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx)
{
	struct sfw_ops_cpu *ex = t_bound;
	if (!ex || nthreads <= 1 || t_in_job) {
		if (grain == 0)
			grain = 1;
		for (size_t b = 0; b < n; b += grain)
			fn(ctx, b, b + grain < n ? b + grain : n, 0);
		return;
	}
	struct bound_job j = {ex, fn, ctx};
	sfw_pool_for(ex->pool, nthreads, n, grain, bound_range, &j);
}

void sfw_op_embed_cpu(float *x, const void *E, enum sfw_dtype edt, const int32_t *ids, int T, int D,
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
	enum sfw_dtype wdt;
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

void sfw_op_rmsnorm_cpu(float *y, const float *x, const void *w, enum sfw_dtype wdt, int rows, int n,
			float eps)
{
	struct norm_job j = {y, x, w, wdt, n, eps};
	size_t grain = (size_t)(rows * (size_t)n > 65536 ? 16 : rows);
	if (grain == 0)
		grain = 1;
	sfwi_ops_cpu_for(grain >= (size_t)rows ? 1 : sfw_ops_cpu_threads(), (size_t)rows, grain, norm_rows, &j);
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
