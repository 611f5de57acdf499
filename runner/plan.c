/* plan.c - see runner/plan.h: the device memory a context or a batch
 * needs, from the shapes alone, and the check that admits or refuses it. */
#include "runner/plan.h"
#include "num/w8_layout.h"
#include "runner/model.h"

#include <string.h>

#ifdef SFW_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif

double sfw_plan_linear_params(const struct sfw_config *c)
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

void sfw_plan_config(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	memset(p, 0, sizeof(*p));
	double V = c->vocab_size, D = c->hidden_size;
	p->weights = 2 * (sfw_plan_linear_params(c) + 2 * V * D + norm_params(c));
	plan_rest(c, max_ctx, chunk, p);
}

/* One [N, K] linear as int8: codes (rows padded to 4 bytes) + BF16 scales. */
static double w8_linear(double N, int64_t K, int group)
{
	return N * (double)sfw_ql_row_bytes(K) + N * (double)sfw_ql_ngroups(K, group) * 2;
}

void sfw_plan_config_w8(const struct sfw_config *c, int64_t max_ctx, int chunk, int group, struct sfw_mem_plan *p)
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

void sfw_plan_model(const struct sfw_model *m, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	double all, step;
	memset(p, 0, sizeof(*p));
	sfwi_model_weight_bytes(m, &all, &step);
	p->weights = all;
	p->kv8 = sfwi_kv8_layout(m); /* (the CPU keeps fp8 values in float) */
	plan_rest(&m->cfg, max_ctx, chunk, p);
}

/* Compressed-key rows per block of a paged cache (both levels,
 * kernels/ops.h; 0 where the blocks cannot be paged). */
static double ckey_rows_per_block(const struct sfw_config *c)
{
	int blk = c->sparse_block_size > 0 ? c->sparse_block_size : 64;
	int stride = c->sparse_kernel_stride > 0 ? c->sparse_kernel_stride : 16;
	return blk & (blk - 1) ? 0 : (double)sfw_ckey_rows_per_block(sfw_log2i(blk), stride);
}

static void state_parts(const struct sfw_config *c, double act, int kv8, int64_t max_ctx, int64_t tokens, int paged,
			double *per_token, double *kv, double *compressed, double *lightning);

void sfw_plan_seqs(const struct sfw_config *c, int seqs, int64_t pool_tokens, struct sfw_mem_plan *p)
{
	if (seqs < 1)
		seqs = 1;
	/* per sequence: its caches as one context of the plan's length has them */
	p->kv *= seqs, p->compressed *= seqs, p->lightning *= seqs;
	if (pool_tokens > 0) { /* the pool bounds the KV of all of them, its blocks hold the compressed keys */
		double per, states;
		state_parts(c, 2, p->kv8, 0, pool_tokens, 1, &per, &p->kv, &p->compressed, &states);
	}
	/* the step's float logits: a row per sequence (the plan has one) */
	p->activations += (double)(seqs - 1) * c->vocab_size * 4;
	p->total = p->weights + p->kv + p->compressed + p->lightning + p->activations + p->scratch;
	p->seqs = seqs;
}

void sfw_plan_batch(const struct sfw_model *m, int seqs, int64_t max_ctx, int64_t pool_tokens,
			      int step_rows, struct sfw_mem_plan *p)
{
	sfw_plan_model(m, max_ctx, step_rows, p);
	sfw_plan_seqs(&m->cfg, seqs, pool_tokens, p);
}

void sfw_plan_print(FILE *f, const char *who, const struct sfw_mem_plan *p, int64_t n_ctx, int chunk)
{
	const double G = 1073741824.0;
	if (p->seqs > 1 && p->parked > 0)
		fprintf(f, "%s: device memory plan for %d sequences of up to %lld tokens each and %d prefix-cache "
			   "entries:\n",
			who, p->seqs - p->parked, (long long)n_ctx, p->parked);
	else if (p->seqs > 1)
		fprintf(f, "%s: device memory plan for %d sequences of up to %lld tokens each:\n", who,
			p->seqs, (long long)n_ctx);
	else
		fprintf(f, "%s: device memory plan for %lld tokens:\n", who, (long long)n_ctx);
	fprintf(f,
		"  weights            %8.2f GiB\n"
		"  KV cache           %8.2f GiB (%.0f B/token%s)\n"
		"  compressed keys    %8.2f GiB\n"
		"  lightning states   %8.2f GiB\n"
		"  activations        %8.2f GiB (%d-row pieces)\n"
		"  scratch            %8.2f GiB (op scratch, cuBLASLt workspace, block selection)\n"
		"  total              %8.2f GiB\n",
		p->weights / G, p->kv / G, p->kv_per_token, p->kv8 ? ", fp8" : "", p->compressed / G, p->lightning / G,
		p->activations / G, chunk, p->scratch / G, p->total / G);
}

enum sfw_status sfw_plan_fit(const struct sfw_mem_plan *p, int64_t n_ctx, double free_bytes, struct sfw_err *err)
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
				p->seqs - p->parked, (long long)n_ctx, (long long)(fit / 64) * 64, need / G, p->weights / G,
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
	return sfw_plan_fit(p, n_ctx, (double)fr, err);
#else
	(void)m, (void)p, (void)n_ctx, (void)err;
	return SFW_OK;
#endif
}

enum sfw_status sfw_plan_check(const struct sfw_model *m, int64_t n_ctx, int chunk, struct sfw_mem_plan *out,
				    struct sfw_err *err)
{
	struct sfw_mem_plan p;
	sfw_plan_model(m, n_ctx, chunk > 0 ? chunk : 256, &p);
	if (out)
		*out = p;
	return fit_device(m, &p, n_ctx, err);
}

enum sfw_status sfw_plan_check_batch(const struct sfw_model *m, int seqs, int parked, int64_t max_ctx,
					  int64_t pool_tokens, int step_rows, struct sfw_mem_plan *out, struct sfw_err *err)
{
	struct sfw_mem_plan p;
	sfw_plan_batch(m, seqs, max_ctx, pool_tokens, step_rows, &p);
	p.parked = parked > 0 && parked < seqs ? parked : 0;
	if (out)
		*out = p;
	return fit_device(m, &p, max_ctx, err);
}

/* One sequence's caches with act-byte activations: per token of K/V
 * (*per_token: act bytes an element, or with kv8 a byte and a float32
 * scale per head, kernels/ops.h), its K/V for `tokens` tokens in whole
 * blocks (*kv), both
 * levels of compressed keys (*compressed: paged, those of its blocks;
 * else for max_ctx, rounded to blocks, as a cache of its own makes them)
 * and the fp32 Lightning states (*lightning). */
static void state_parts(const struct sfw_config *c, double act, int kv8, int64_t max_ctx, int64_t tokens, int paged,
			double *per_token, double *kv, double *compressed, double *lightning)
{
	double kvd = (double)c->num_key_value_heads * c->head_dim, lhd = c->lightning_head_dim;
	int ns = 0, nl = 0;
	for (int i = 0; i < c->num_hidden_layers; i++)
		c->mixer[i] == SFW_MIXER_SPARSE ? ns++ : nl++;
	int64_t blk = c->sparse_block_size > 0 ? c->sparse_block_size : 64;
	int64_t cap = (max_ctx + blk - 1) / blk * blk;
	*per_token = kv8 ? ns * 2 * (double)c->num_key_value_heads * (c->head_dim + 4) : ns * 2 * kvd * act;
	*kv = *per_token * (double)((tokens + blk - 1) / blk * blk);
	double st = c->sparse_kernel_stride > 0 ? c->sparse_kernel_stride : 16;
	if (paged)
		*compressed = ns * (double)((tokens + blk - 1) / blk) * ckey_rows_per_block(c) * kvd * act;
	else
		*compressed = ns * ((double)(cap / (int64_t)st + 1) + (double)(cap / (int64_t)(4 * st) + 1)) * kvd * act;
	*lightning = nl * (double)c->lightning_nh * lhd * lhd * 4;
}

int64_t sfw_plan_seq_bytes(const struct sfw_config *c, int act_size, int kv8, int64_t max_ctx, int64_t tokens,
			   int paged)
{
	double per, kv, compressed, lightning;
	state_parts(c, act_size, kv8, max_ctx, tokens, paged, &per, &kv, &compressed, &lightning);
	return (int64_t)(kv + compressed + lightning);
}

static void plan_rest(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p)
{
	double D = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
	double hd = c->head_dim, nkv = c->num_key_value_heads;
	double qd = (double)c->num_attention_heads * hd, kvd = nkv * hd;
	double ld = (double)c->lightning_nh * c->lightning_head_dim;
	state_parts(c, 2, p->kv8, max_ctx, max_ctx, 0, &p->kv_per_token, &p->kv, &p->compressed, &p->lightning);
	double R = chunk > 0 ? chunk : 256;
	double wq = qd > ld ? qd : ld, wk = kvd > ld ? kvd : ld;
	/* a context's buffers (runner/ctx.c ctx_create): x, u, out [R, D];
	 * the projection group's outputs [R, 2 wq + 2 wk]; the attention
	 * output [R, wq]; the MLP rows [R, I] and their gate | up [R, 2 I];
	 * then 4-byte ones: token ids [R], top-k indices [nkv, R, k], float32
	 * logits [V], the last selection [L, nkv, k] and the sampled id (16) */
	p->activations = R * (3 * D + 3 * wq + 2 * wk + 3 * I) * 2 + R * 4 + nkv * R * c->sparse_k * 4 + V * 4 +
			 (double)c->num_hidden_layers * nkv * c->sparse_k * 4 + 16;
	/* the op scratch (SFW_CUDA_SCRATCH_MIN), the cuBLASLt workspace, the int8
	 * GEMM's split-K workspace (SFW_CUDA_W8WS_BYTES, kernels/ops_cuda.h) and,
	 * past the dense length, the block-selection scratch */
	p->scratch = (double)((size_t)64 << 20) + (double)((size_t)32 << 20) + (double)((size_t)20 << 20) +
		     (max_ctx >= c->sparse_dense_len ? (double)((size_t)256 << 20) : 0);
	p->total = p->weights + p->kv + p->compressed + p->lightning + p->activations + p->scratch;
}

void sfw_plan_kv8(const struct sfw_config *c, int64_t max_ctx, struct sfw_mem_plan *p)
{
	double states;
	p->kv8 = 1;
	state_parts(c, 2, 1, max_ctx, max_ctx, 0, &p->kv_per_token, &p->kv, &p->compressed, &states);
	p->total = p->weights + p->kv + p->compressed + p->lightning + p->activations + p->scratch;
}
