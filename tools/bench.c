/* bench.c - see tools/tools.h. The measuring loop that bench/bench_gpu.c started
 * with, moved here so `salafw bench` and bench_gpu print the same figures. */
#include "tools/tools.h"
#include "alloc.h"
#include "kernels/ops.h"
#include "log.h"
#include "num/w8_layout.h"
#include "runner/generate.h"
#include "runner/model.h"
#include "thread.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SFW_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif


static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The generation callback: the time each token was made. */
struct stamps {
	double *t;
	int64_t n, cap;
};

static int stamp(void *user, const struct sfw_gen_token *tk)
{
	struct stamps *s = user;
	if (tk->id >= 0 && s->n < s->cap)
		s->t[s->n++] = sfw_now_s();
	return 0;
}

#ifdef SFW_HAVE_CUDA
static int is_cuda(const struct sfw_model *m)
{
	return strcmp(sfw_model_device_name(m), "cuda") == 0;
}
#endif

void sfw_bench_shape(const struct sfw_bench_params *p, int64_t *n_ctx, int64_t *chunk)
{
	int64_t c = p->prefill_chunk ? p->prefill_chunk : 8192;
	int64_t need = (p->prompt + 63) / 64 * 64; /* more rows than the prompt buy nothing */
	*chunk = c > need ? need : c;
	*n_ctx = p->n_ctx > p->prompt + p->gen ? p->n_ctx : p->prompt + p->gen;
}

enum sfw_status sfw_bench_run(struct sfw_model *m, const struct sfw_bench_params *p, struct sfw_bench_result *r,
			      struct sfw_err *err)
{
	const struct sfw_config *cf = sfw_model_config(m);
	memset(r, 0, sizeof(*r));
	if (p->prompt < 1 || p->prompt > INT32_MAX / 2 || p->gen < 0 || p->gen > INT32_MAX / 2 || p->n_ctx < 0 ||
	    p->prefill_chunk < 0 || p->prefill_chunk > (1 << 20))
		return sfw_fail(err, SFW_E_INVAL, "invalid benchmark parameters");
	int64_t chunk;
	sfw_bench_shape(p, &r->n_ctx, &chunk);
	r->chunk = chunk;
	double lp = sfw_plan_linear_params(cf), wall;
	sfwi_model_weight_bytes(m, &wall, &r->weight_bytes); /* int8: codes + scales */
	r->linear_flops = 2 * lp;
	int32_t *ids = sfw_malloc((size_t)p->prompt * sizeof(int32_t));
	double *st = sfw_malloc((size_t)(p->gen + 1) * sizeof(double));
	struct sfw_ctx *ctx = NULL;
	enum sfw_status s = SFW_OK;
	if (!ids || !st) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto done;
	}
	/* a fixed LCG: the speed does not depend on the ids, reproducibility does */
	uint32_t x = 12345;
	ids[0] = cf->bos_token_id;
	for (int64_t i = 1; i < p->prompt; i++) {
		x = x * 1664525u + 1013904223u;
		ids[i] = (int32_t)(3 + (x >> 8) % (uint32_t)(cf->vocab_size - 3));
	}
#ifdef SFW_HAVE_CUDA
	if (is_cuda(m))
		sfw_cuda_mem_reset_peak();
#endif
	if ((s = sfw_plan_check(m, r->n_ctx, (int)chunk, NULL, err)) != SFW_OK)
		goto done;
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = r->n_ctx;
	xp.prefill_chunk = (int)chunk;
	xp.dense_as_sparse = p->dense_as_sparse;
	if ((s = sfw_ctx_new(m, &xp, &ctx, err)) != SFW_OK)
		goto done;
	/* greedy generation of gen + 1 tokens = gen one-token steps; where the
	 * backend samples (CUDA) only the id comes back */
	struct sfw_op_sample_params gp = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .greedy = 1};
	struct sfw_sampler smp;
	if ((s = sfw_sampler_init(&smp, &gp, 0, cf->vocab_size, err)) != SFW_OK)
		goto done;
	struct sfw_eos_set none = {0};
	struct sfw_gen_params g = sfw_gen_default_params();
	g.ids = ids;
	g.n_ids = (size_t)p->prompt;
	g.max_tokens = p->gen + 1;
	g.eos = &none;
	struct stamps sts = {st, 0, p->gen + 1};
	struct sfw_gen_stats gs;
	s = sfw_generate(ctx, NULL, &smp, &g, stamp, &sts, &gs, err);
	sfw_sampler_release(&smp);
	if (s != SFW_OK)
		goto done;
	r->ttft_s = gs.prefill_s;
	r->prefill_tps = (double)p->prompt / (r->ttft_s > 0 ? r->ttft_s : 1e-9);
	r->decode_s = gs.decode_s;
	/* step i: from token i to token i + 1 */
	for (int64_t i = 0; i + 1 < sts.n; i++)
		st[i] = st[i + 1] - st[i];
	if (p->gen > 0 && sts.n == p->gen + 1) {
		r->decode_tps = (double)p->gen / (r->decode_s > 0 ? r->decode_s : 1e-9);
		qsort(st, (size_t)p->gen, sizeof(double), cmp_d);
		r->decode_median_s = st[p->gen / 2];
	}
#ifdef SFW_HAVE_CUDA
	if (is_cuda(m)) {
		size_t live, peak, used;
		sfw_cuda_mem_stats(&live, &peak, &used);
		r->device_mem = 1;
		r->peak_bytes = (double)peak;
		r->driver_bytes = (double)used;
	}
#endif
done:
	sfw_ctx_free(ctx);
	sfw_free(ids);
	sfw_free(st);
	return s;
}

enum sfw_status sfw_bench_limits(double *copy_gbps, double *gemm_tflops, struct sfw_err *err)
{
	*copy_gbps = *gemm_tflops = 0;
#ifdef SFW_HAVE_CUDA
	enum sfw_status s = sfw_cuda_measure_copy((size_t)2 << 30, copy_gbps, err);
	if (s == SFW_OK)
		s = sfw_cuda_measure_gemm(8192, gemm_tflops, err);
	return s;
#else
	return sfw_fail(err, SFW_E_UNSUPPORTED, "this build has no CUDA support: no device limits to measure");
#endif
}


/* GFLOP/s of the CPU bf16 GEMM on an executor of `threads` threads; 0 when
 * the executor cannot start (err says why). */
static double gemm_gflops(int M, int N, int K, int threads, const float *x, const uint16_t *w, float *y,
			  struct sfw_err *err)
{
	struct sfw_ops_cpu *ex;
	if (sfw_ops_cpu_new(threads, &ex, err) != SFW_OK)
		return 0;
	sfw_op_matmul_cpu(ex, y, x, w, SFW_DTYPE_BF16, M, N, K); /* warm-up */
	int reps = 0;
	double t0 = sfw_now_s(), t;
	do {
		sfw_op_matmul_cpu(ex, y, x, w, SFW_DTYPE_BF16, M, N, K);
		reps++;
	} while ((t = sfw_now_s() - t0) < 0.5);
	sfw_ops_cpu_free(ex);
	return 2.0 * M * N * K * reps / t / 1e9;
}

enum sfw_status sfw_bench_cpu_gemm(int M, int N, int K, int threads, double *all, double *one, int *nthreads,
				   struct sfw_err *err)
{
	*all = *one = 0;
	*nthreads = threads > 0 ? threads : sfw_default_threads();
	if (M < 1 || N < 1 || K < 1 || M > 65536 || N > 262144 || K > 65536)
		return sfw_fail(err, SFW_E_INVAL, "GEMM shape %dx%dx%d outside 1..65536 x 1..262144 x 1..65536", M, N, K);
	float *x = sfw_malloc((size_t)M * K * sizeof(float)), *y = sfw_malloc((size_t)M * N * sizeof(float));
	uint16_t *w = sfw_malloc((size_t)N * K * sizeof(uint16_t));
	enum sfw_status s = SFW_OK;
	if (!x || !y || !w) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for a %dx%dx%d GEMM", M, N, K);
		goto done;
	}
	for (size_t i = 0; i < (size_t)M * K; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	for (size_t i = 0; i < (size_t)N * K; i++)
		w[i] = (uint16_t)(0x3c00 + (i * 40503u) % 512); /* bf16 values around 0.01 */
	*all = gemm_gflops(M, N, K, *nthreads, x, w, y, err);
	*one = *all ? gemm_gflops(M, N, K, 1, x, w, y, err) : 0;
	if (!*one)
		s = err->code; /* the executor could not start */
done:
	sfw_free(x), sfw_free(y), sfw_free(w);
	return s;
}
