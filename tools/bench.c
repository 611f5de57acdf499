/* bench.c - see tools/tools.h. The measuring loop that bench/bench_gpu.c started
 * with, moved here so `salafw bench` and bench_gpu print the same figures. */
#include "tools/tools.h"
#include "alloc.h"
#include "kernels/ops.h"
#include "log.h"
#include "num/w8_layout.h"
#include "runner/generate.h"
#include "runner/model.h"

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

double sfw_bench_linear_params(const struct sfw_config *c)
{
	double D = c->hidden_size, I = c->intermediate_size, p = 0;
	double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
	double ld = (double)c->lightning_nh * c->lightning_head_dim;
	for (int i = 0; i < c->num_hidden_layers; i++) {
		p += 3 * D * I;
		if (c->mixer[i] == SFW_MIXER_SPARSE)
			p += qd * D + 2 * kvd * D + D * qd + (c->attn_use_output_gate ? qd * D : 0);
		else
			p += 4 * ld * D + (c->use_output_gate ? ld * D : 0);
	}
	return p;
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
	double lp = sfw_bench_linear_params(cf), wall;
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
	if ((s = sfw_bench_mem_check(m, r->n_ctx, (int)chunk, NULL, err)) != SFW_OK)
		goto done;
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = r->n_ctx;
	xp.prefill_chunk = (int)chunk;
	xp.dense_as_sparse = p->dense_as_sparse;
	if ((s = sfw_ctx_new(m, &xp, &ctx, err)) != SFW_OK)
		goto done;
	/* greedy generation of gen + 1 tokens = gen one-token steps; where the
	 * backend samples (CUDA) only the id comes back, else (backend option
	 * no_sample) the logits come to the host for the argmax */
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

static void plan_rest(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p);

/* Bytes of the norm weights (bf16). */
static double norm_params(const struct sfw_config *c)
{
	double D = c->hidden_size, ld = (double)c->lightning_nh * c->lightning_head_dim, lhd = c->lightning_head_dim;
	int nl = 0;
	for (int i = 0; i < c->num_hidden_layers; i++)
		nl += c->mixer[i] != SFW_MIXER_SPARSE;
	return c->num_hidden_layers * 2 * D + D + nl * ((c->qk_norm ? 2 * lhd : 0) + (c->use_output_norm ? ld : 0));
}

void sfw_bench_mem_plan(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	memset(p, 0, sizeof(*p));
	double V = c->vocab_size, D = c->hidden_size;
	p->weights = 2 * (sfw_bench_linear_params(c) + 2 * V * D + norm_params(c));
	plan_rest(c, max_ctx, chunk, p);
}

/* One [N, K] linear as int8: codes (rows padded to 4 bytes) + BF16 scales. */
static double w8_linear(double N, int64_t K, int group)
{
	return N * (double)sfw_ql_row_bytes(K) + N * (double)sfw_ql_ngroups(K, group) * 2;
}

void sfw_bench_mem_plan_w8(const struct sfw_config *c, int64_t max_ctx, int chunk, int group, struct sfw_mem_plan *p)
{
	memset(p, 0, sizeof(*p));
	int64_t D = c->hidden_size, I = c->intermediate_size;
	double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
	double ld = (double)c->lightning_nh * c->lightning_head_dim, w = 0;
	for (int i = 0; i < c->num_hidden_layers; i++) {
		w += 2 * w8_linear((double)I, D, group) + w8_linear((double)D, I, group);
		if (c->mixer[i] == SFW_MIXER_SPARSE)
			w += w8_linear(qd + 2 * kvd + (c->attn_use_output_gate ? qd : 0), D, group) +
			     w8_linear((double)D, (int64_t)qd, group);
		else
			w += w8_linear(3 * ld + (c->use_output_gate ? ld : 0), D, group) + w8_linear((double)D, (int64_t)ld, group);
	}
	p->weights = w + 2 * (2 * (double)c->vocab_size * (double)D + norm_params(c));
	plan_rest(c, max_ctx, chunk, p);
}

void sfw_bench_mem_plan_model(const struct sfw_model *m, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	double all, step;
	memset(p, 0, sizeof(*p));
	sfwi_model_weight_bytes(m, &all, &step);
	p->weights = all;
	plan_rest(&m->cfg, max_ctx, chunk, p);
}

void sfw_bench_mem_plan_seqs(const struct sfw_config *c, int seqs, int64_t pool_tokens, struct sfw_mem_plan *p)
{
	if (seqs < 1)
		seqs = 1;
	/* per sequence: its caches as one context of the plan's length has them */
	p->kv *= seqs, p->compressed *= seqs, p->lightning *= seqs;
	if (pool_tokens > 0) /* the pool bounds the KV of all of them */
		p->kv = p->kv_per_token * (double)((pool_tokens + 63) / 64 * 64);
	/* the step's float logits: a row per sequence (the plan has one) */
	p->activations += (double)(seqs - 1) * c->vocab_size * 4;
	p->total = p->weights + p->kv + p->compressed + p->lightning + p->activations + p->scratch;
	p->seqs = seqs;
}

void sfw_bench_mem_plan_batch(const struct sfw_model *m, int seqs, int64_t max_ctx, int64_t pool_tokens,
			      int step_rows, struct sfw_mem_plan *p)
{
	sfw_bench_mem_plan_model(m, max_ctx, step_rows, p);
	sfw_bench_mem_plan_seqs(&m->cfg, seqs, pool_tokens, p);
}

void sfw_bench_mem_print(FILE *f, const char *who, const struct sfw_mem_plan *p, int64_t n_ctx, int chunk)
{
	const double G = 1073741824.0;
	if (p->seqs > 1)
		fprintf(f, "%s: device memory plan for %d sequences of up to %lld tokens each:\n", who,
			p->seqs, (long long)n_ctx);
	else
		fprintf(f, "%s: device memory plan for %lld tokens:\n", who, (long long)n_ctx);
	fprintf(f,
		"  weights            %8.2f GiB\n"
		"  KV cache           %8.2f GiB (%.0f B/token)\n"
		"  compressed keys    %8.2f GiB\n"
		"  lightning states   %8.2f GiB\n"
		"  activations        %8.2f GiB (%d-row pieces)\n"
		"  scratch            %8.2f GiB (op scratch, cuBLASLt workspace, block selection)\n"
		"  total              %8.2f GiB\n",
		p->weights / G, p->kv / G, p->kv_per_token, p->compressed / G, p->lightning / G,
		p->activations / G, chunk, p->scratch / G, p->total / G);
}

enum sfw_status sfw_bench_mem_fit(const struct sfw_mem_plan *p, int64_t n_ctx, double free_bytes, struct sfw_err *err)
{
	/* the weights are resident already: the context needs the rest */
	double need = p->total - p->weights, G = 1073741824.0;
	if (need <= free_bytes)
		return SFW_OK;
	/* what does not grow with the context (as planned for this one: a long
	 * one has the block-selection scratch), and the cache bytes per token */
	double fixed = need - p->kv - p->compressed, per = (p->kv + p->compressed) / (double)(n_ctx > 0 ? n_ctx : 1);
	double fit = per > 0 && free_bytes > fixed ? (free_bytes - fixed) / per : 0;
	if (fit > 1e15)
		fit = 1e15;
	if (p->seqs > 1) /* per: a token more for every sequence, so fit is a context each */
		return sfw_fail(err, SFW_E_NOMEM,
				"%d sequences of %lld tokens do not fit the GPU (at most about %lld tokens each): they "
				"need %.2f GiB beyond %.2f GiB of weights (KV %.2f, compressed keys %.2f, activations "
				"%.2f, scratch and states %.2f GiB); %.2f GiB are free",
				p->seqs, (long long)n_ctx, (long long)(fit / 64) * 64, need / G, p->weights / G,
				p->kv / G, p->compressed / G, p->activations / G, (p->scratch + p->lightning) / G,
				free_bytes / G);
	/* the largest context first: the message must fit struct sfw_err */
	return sfw_fail(err, SFW_E_NOMEM,
			"a context of %lld tokens does not fit the GPU (at most about %lld do): it needs %.2f GiB "
			"beyond the %.2f GiB of weights (KV %.2f, compressed keys %.2f, activations %.2f, scratch and "
			"states %.2f GiB); %.2f GiB are free",
			(long long)n_ctx, (long long)(fit / 64) * 64, need / G, p->weights / G, p->kv / G,
			p->compressed / G, p->activations / G, (p->scratch + p->lightning) / G, free_bytes / G);
}

/* p against the device's free memory, on the CUDA backend (the weights are
 * placed already); SFW_OK elsewhere. */
static enum sfw_status fit_device(const struct sfw_model *m, const struct sfw_mem_plan *p, int64_t n_ctx,
				  struct sfw_err *err)
{
#ifdef SFW_HAVE_CUDA
	if (strcmp(sfw_model_device_name(m), "cuda") != 0)
		return SFW_OK;
	size_t fr = 0, tot = 0;
	sfw_cuda_mem_info(&fr, &tot);
	return sfw_bench_mem_fit(p, n_ctx, (double)fr, err);
#else
	(void)m, (void)p, (void)n_ctx, (void)err;
	return SFW_OK;
#endif
}

enum sfw_status sfw_bench_mem_check(const struct sfw_model *m, int64_t n_ctx, int chunk, struct sfw_mem_plan *out,
				    struct sfw_err *err)
{
	struct sfw_mem_plan p;
	sfw_bench_mem_plan_model(m, n_ctx, chunk > 0 ? chunk : 256, &p);
	if (out)
		*out = p;
	return fit_device(m, &p, n_ctx, err);
}

enum sfw_status sfw_bench_mem_check_batch(const struct sfw_model *m, int seqs, int64_t max_ctx, int64_t pool_tokens,
					  int step_rows, struct sfw_mem_plan *out, struct sfw_err *err)
{
	struct sfw_mem_plan p;
	sfw_bench_mem_plan_batch(m, seqs, max_ctx, pool_tokens, step_rows, &p);
	if (out)
		*out = p;
	return fit_device(m, &p, max_ctx, err);
}

static void plan_rest(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	double D = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
	double hd = c->head_dim, nkv = c->num_key_value_heads;
	double qd = (double)c->num_attention_heads * hd, kvd = nkv * hd;
	double ld = (double)c->lightning_nh * c->lightning_head_dim, lhd = c->lightning_head_dim;
	int ns = 0, nl = 0;
	for (int i = 0; i < c->num_hidden_layers; i++)
		c->mixer[i] == SFW_MIXER_SPARSE ? ns++ : nl++;
	int64_t blk = c->sparse_block_size > 0 ? c->sparse_block_size : 64;
	int64_t cap = (max_ctx + blk - 1) / blk * blk;
	p->kv_per_token = ns * 2 * kvd * 2;
	p->kv = p->kv_per_token * (double)cap;
	double st = c->sparse_kernel_stride > 0 ? c->sparse_kernel_stride : 16;
	p->compressed = ns * ((double)(cap / (int64_t)st + 1) + (double)(cap / (int64_t)(4 * st) + 1)) * kvd * 2;
	p->lightning = nl * (double)c->lightning_nh * lhd * lhd * 4;
	double R = chunk > 0 ? chunk : 256;
	double wq = qd > ld ? qd : ld, wk = kvd > ld ? kvd : ld;
	/* a context's buffers (runner/forward.c ctx_create): x, u, out [R, D];
	 * the projection group's outputs [R, 2 wq + 2 wk]; the attention
	 * output [R, wq]; the MLP rows [R, I] and their gate | up [R, 2 I];
	 * then 4-byte ones: token ids [R], top-k indices [nkv, R, k], float32
	 * logits [V], the last selection [L, nkv, k] and the sampled id (16) */
	p->activations = R * (3 * D + 3 * wq + 2 * wk + 3 * I) * 2 + R * 4 + nkv * R * c->sparse_k * 4 + V * 4 +
			 (double)c->num_hidden_layers * nkv * c->sparse_k * 4 + 16;
	p->scratch = (double)((size_t)64 << 20) + (double)((size_t)32 << 20) +
		     (max_ctx >= c->sparse_dense_len ? (double)((size_t)256 << 20) : 0);
	p->total = p->weights + p->kv + p->compressed + p->lightning + p->activations + p->scratch;
}
