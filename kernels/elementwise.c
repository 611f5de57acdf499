/* elementwise.c - CPU twins of the elementwise ops, the norms, RoPE, and the
 * CPU ops' executor (kernels/ops.h). */
#include "kernels/ops.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <stdatomic.h>

#include "alloc.h"

/* An executor is ex[0] of a pair: ex[1] is its job view, the executor the
 * ranges of its jobs run with (no pool: a parallel-for there runs inline;
 * the same flag and options, through root). */
struct sfw_ops_cpu {
	struct sfw_pool *pool;    /* NULL in the job view */
	struct sfw_ops_cpu *root; /* the executor whose flag and options these are */
	struct sfw_ops_cpu *job;  /* the job view */
	atomic_int failed;        /* root's */
	int generic_w8;           /* root's: sfwi_op_matmul_w8_generic */
};

enum sfw_status sfw_ops_cpu_new(int nthreads, struct sfw_ops_cpu **out, struct sfw_err *err)
{
	struct sfw_ops_cpu *ex = sfw_calloc(2, sizeof(*ex));
	if (!ex)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the CPU executor");
	enum sfw_status s = sfw_pool_new(nthreads, &ex->pool, err);
	if (s != SFW_OK) {
		sfw_free(ex);
		return s;
	}
	atomic_init(&ex[0].failed, 0);
	atomic_init(&ex[1].failed, 0);
	ex[0].root = ex[1].root = ex;
	ex[0].job = ex[1].job = &ex[1];
	*out = ex;
	return SFW_OK;
}

void sfw_ops_cpu_free(struct sfw_ops_cpu *ex)
{
	if (!ex)
		return;
	SFW_ASSERT(ex->root == ex); /* not a job view */
	sfw_pool_free(ex->pool);
	sfw_free(ex);
}

int sfw_ops_cpu_threads(const struct sfw_ops_cpu *ex)
{
	return ex && ex->pool ? sfw_pool_threads(ex->pool) : 1;
}

struct sfw_ops_cpu *sfwi_ops_cpu_job(struct sfw_ops_cpu *ex)
{
	return ex ? ex->job : NULL;
}

void sfwi_ops_cpu_fail(struct sfw_ops_cpu *ex)
{
	if (!ex) /* ops.h: a failure with no executor to report it to */
		sfw_assert_fail("a CPU op out of scratch memory, called without an executor (kernels/ops.h)",
				__FILE__, __LINE__);
	atomic_store(&ex->root->failed, 1);
}

int sfw_ops_cpu_take_failure(struct sfw_ops_cpu *ex)
{
	return ex ? atomic_exchange(&ex->root->failed, 0) : 0;
}

void sfwi_op_matmul_w8_generic(struct sfw_ops_cpu *ex, int on)
{
	ex->root->generic_w8 = on;
}

int sfwi_ops_cpu_w8_generic(const struct sfw_ops_cpu *ex)
{
	return ex && ex->root->generic_w8;
}

void sfwi_ops_cpu_for(struct sfw_ops_cpu *ex, int nthreads, size_t n, size_t grain, sfw_range_fn fn,
		      void *ctx)
{
	if (!ex || !ex->pool || nthreads <= 1) {
		if (grain == 0)
			grain = 1;
		for (size_t b = 0; b < n; b += grain)
			fn(ctx, b, b + grain < n ? b + grain : n, 0);
		return;
	}
	sfw_pool_for(ex->pool, nthreads, n, grain, fn, ctx);
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

void sfw_op_rmsnorm_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
			int rows, int n, float eps)
{
	struct norm_job j = {y, x, w, wdt, n, eps};
	size_t grain = (size_t)(rows * (size_t)n > 65536 ? 16 : rows);
	if (grain == 0)
		grain = 1;
	sfwi_ops_cpu_for(ex, grain >= (size_t)rows ? 1 : sfw_ops_cpu_threads(ex), (size_t)rows, grain,
			 norm_rows, &j);
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
