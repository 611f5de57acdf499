/* ctx.c - a context's life (runner/ctx.h): its step buffers in backend
 * memory sized for one piece of prefill_chunk rows, its own caches (none for
 * a batch's workspace: runner/batch.c gives the caches per step), the
 * selection notes, and the buffers taps need. */
#include "runner/ctx.h"
#include "alloc.h"

#include <string.h>

struct sfw_ctx_params sfw_ctx_default_params(void)
{
	struct sfw_ctx_params p = {0, 256, 0};
	return p;
}

static int maxi(int a, int b)
{
	return a > b ? a : b;
}

static void ctx_buffers_free(struct sfw_ctx *c)
{
	struct sfw_backend *be = c->m->be;
	void *bufs[] = {c->x,	   c->u,	  c->out,     c->proj,	   c->a,	 c->mg,	    c->gu,
			c->ids_dev, c->idx_dev, c->logits_dev, c->last_dev, c->next_dev};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			be->free(be, bufs[i]);
}

void sfw_ctx_free(struct sfw_ctx *c)
{
	if (!c)
		return;
	sfwi_step_free(c->m->be, c->step);
	ctx_buffers_free(c);
	if (c->cache)
		c->m->be->cache_free(c->m->be, c->cache);
	sfw_free(c->host);
	sfw_free(c->host_idx);
	sfw_free(c->host_pool);
	sfw_free(c->last_blocks);
	sfw_free(c->last_state);
	sfw_free(c->last_fresh);
	sfw_free(c->host_logits);
	sfw_free(c);
}

static void last_selection_clear(struct sfw_ctx *c)
{
	const struct sfw_config *cf = &c->m->cfg;
	size_t nsel = (size_t)cf->num_key_value_heads * cf->sparse_k;
	for (int i = 0; i < cf->num_hidden_layers; i++) {
		c->last_state[i] = cf->mixer[i] == SFW_MIXER_SPARSE ? 0 : -1;
		c->last_fresh[i] = 0;
	}
	for (size_t i = 0; i < (size_t)cf->num_hidden_layers * nsel; i++)
		c->last_blocks[i] = -1;
}

void sfwi_cache_desc(const struct sfw_model *m, struct sfw_bpool *pool, int64_t max_tokens, struct sfw_cache_desc *d)
{
	const struct sfw_config *cf = &m->cfg;
	memset(d, 0, sizeof(*d));
	d->n_layers = cf->num_hidden_layers;
	d->mixer = cf->mixer;
	d->nkv = cf->num_key_value_heads;
	d->hd = cf->head_dim;
	d->lnh = cf->lightning_nh;
	d->lhd = cf->lightning_head_dim;
	d->ksize = cf->sparse_kernel_size;
	d->stride = cf->sparse_kernel_stride;
	d->block = cf->sparse_block_size;
	d->sel_k = cf->sparse_k;
	d->kv8 = m->kv_cache == SFW_KV_CACHE_FP8;
	d->pool = pool;
	d->max_tokens = max_tokens;
}

enum sfw_status sfwi_cache_new(struct sfw_model *m, struct sfw_bpool *pool, int64_t max_tokens,
			       struct sfw_bcache **out, struct sfw_err *err)
{
	struct sfw_cache_desc d;
	sfwi_cache_desc(m, pool, max_tokens, &d);
	return m->be->cache_new(m->be, &d, out, err);
}

/* A context with buffers for p->prefill_chunk rows and logits for
 * logit_rows rows; own_cache = 0 makes a workspace without a sequence of
 * its own (a batch's: runner/batch.c gives the caches per step). */
static enum sfw_status ctx_create(struct sfw_model *m, const struct sfw_ctx_params *p, int own_cache,
				  int logit_rows, struct sfw_ctx **out, struct sfw_err *err)
{
	*out = NULL;
	const struct sfw_config *cf = &m->cfg;
	struct sfw_backend *be = m->be;
	struct sfw_ctx *c = sfw_calloc(1, sizeof(*c));
	if (!c)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	c->m = m;
	c->p = *p;
	if (p->n_ctx < 0 || p->prefill_chunk < 0 || p->prefill_chunk > (1 << 20)) {
		sfw_free(c);
		return sfw_fail(err, SFW_E_INVAL, "invalid context parameters");
	}
	int chunk = p->prefill_chunk ? p->prefill_chunk : 256;
	chunk = (chunk + 63) / 64 * 64;
	c->cap_rows = chunk;
	size_t R = (size_t)chunk, D = (size_t)cf->hidden_size, I = (size_t)cf->intermediate_size;
	size_t qd = (size_t)cf->num_attention_heads * cf->head_dim, kvd = (size_t)cf->num_key_value_heads * cf->head_dim;
	size_t ld = (size_t)cf->lightning_nh * cf->lightning_head_dim;
	size_t wq = qd > ld ? qd : ld, wk = kvd > ld ? kvd : ld, as = sfw_be_act_size(be);
	int nkv = cf->num_key_value_heads, k = cf->sparse_k, L = cf->num_hidden_layers;
	c->x = be->alloc(be, R * D * as);
	c->u = be->alloc(be, R * D * as);
	c->out = be->alloc(be, R * D * as);
	c->proj = be->alloc(be, R * (2 * wq + 2 * wk) * as); /* q | k | v | o_gate or z */
	c->a = be->alloc(be, R * wq * as);
	c->mg = be->alloc(be, R * I * as);
	c->gu = be->alloc(be, 2 * R * I * as);
	c->ids_dev = be->alloc(be, R * sizeof(int32_t));
	c->idx_dev = be->alloc(be, (size_t)nkv * R * (size_t)k * sizeof(int32_t));
	c->logits_dev = be->alloc(be, (size_t)logit_rows * cf->vocab_size * sizeof(float));
	c->logits_rows = logit_rows;
	c->next_dev = be->alloc(be, (size_t)maxi(16, logit_rows * (int)sizeof(int32_t))); /* a batch's: one id per row */
	c->last_dev = be->alloc(be, (size_t)L * nkv * k * sizeof(int32_t));
	c->last_fresh = sfw_calloc((size_t)L, sizeof(int));
	c->last_blocks = sfw_malloc((size_t)L * nkv * k * sizeof(int32_t));
	c->last_state = sfw_malloc((size_t)L * sizeof(int));
	enum sfw_status s = SFW_OK;
	if (!c->x || !c->u || !c->out || !c->proj || !c->a || !c->mg || !c->gu || !c->ids_dev || !c->idx_dev ||
	    !c->logits_dev || !c->next_dev || !c->last_dev || !c->last_fresh || !c->last_blocks || !c->last_state)
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the context buffers");
	/* a batch's workspace: every row of ids_dev a token id from the start
	 * (a recorded step's padding rows embed whatever ids their rows hold:
	 * be->step of several sequences) */
	int32_t *zero = s == SFW_OK && !own_cache ? sfw_calloc(R, sizeof(int32_t)) : NULL;
	if (s == SFW_OK && !own_cache && !zero)
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the context buffers");
	if (zero)
		sfw_be_from_host(be, c->ids_dev, zero, R * sizeof(int32_t));
	sfw_free(zero);
	if (s == SFW_OK && own_cache)
		s = sfwi_cache_new(m, NULL, 0, &c->cache, err);
	if (s == SFW_OK && own_cache && p->n_ctx > 0)
		s = be->cache_reserve(be, c->cache, p->n_ctx, err);
	if (s != SFW_OK) {
		sfw_ctx_free(c);
		return s;
	}
	last_selection_clear(c);
	c->last_row = -1;
	*out = c;
	return SFW_OK;
}

enum sfw_status sfw_ctx_new(struct sfw_model *m, const struct sfw_ctx_params *p, struct sfw_ctx **out,
			    struct sfw_err *err)
{
	struct sfw_ctx_params dp = sfw_ctx_default_params();
	return ctx_create(m, p ? p : &dp, 1, 1, out, err);
}

enum sfw_status sfwi_ctx_workspace(struct sfw_model *m, int rows, int logit_rows, struct sfw_ctx **out,
				   struct sfw_err *err)
{
	struct sfw_ctx_params p = sfw_ctx_default_params();
	if (rows < 1 || rows > (1 << 20) || logit_rows < 1 || logit_rows > rows) {
		*out = NULL;
		return sfw_fail(err, SFW_E_INVAL, "invalid batch workspace (%d rows, %d logit rows)", rows, logit_rows);
	}
	p.prefill_chunk = rows;
	return ctx_create(m, &p, 0, logit_rows, out, err);
}

void sfw_ctx_reset(struct sfw_ctx *c)
{
	sfw_be_cache_reset(c->m->be, c->cache);
	c->pos = 0;
	c->broken = 0;
	c->last_row = -1;
	last_selection_clear(c);
}

int64_t sfw_ctx_pos(const struct sfw_ctx *c)
{
	return c->pos;
}

struct sfw_model *sfw_ctx_model(const struct sfw_ctx *c)
{
	return c->m;
}

int64_t sfwi_ctx_step_replays(const struct sfw_ctx *c)
{
	return c->step_replays;
}

void sfw_ctx_set_tap(struct sfw_ctx *c, sfw_tap_fn fn, void *user)
{
	c->tap = fn;
	c->tap_user = user;
}

void sfw_ctx_set_tap_linear_inputs(struct sfw_ctx *c, int on)
{
	c->tap_lin = on != 0;
}

int sfw_ctx_last_blocks(const struct sfw_ctx *c, int layer, int32_t *out)
{
	const struct sfw_config *cf = &c->m->cfg;
	if (layer < 0 || layer >= cf->num_hidden_layers || c->last_state[layer] < 0)
		return -1;
	size_t n = (size_t)cf->num_key_value_heads * cf->sparse_k;
	if (c->last_fresh[layer]) {
		struct sfw_backend *be = c->m->be;
		sfw_be_to_host(be, c->last_blocks + (size_t)layer * n, c->last_dev + (size_t)layer * n,
			    n * sizeof(int32_t));
		c->last_fresh[layer] = 0;
	}
	memcpy(out, c->last_blocks + (size_t)layer * n, n * sizeof(int32_t));
	return c->last_state[layer];
}

/* Taps need host staging and full-width logits; sized lazily on first use. */
enum sfw_status sfwi_ctx_tap_buffers(struct sfw_ctx *c, struct sfw_err *err)
{
	const struct sfw_config *cf = &c->m->cfg;
	struct sfw_backend *be = c->m->be;
	size_t R = (size_t)c->cap_rows;
	if (!c->host) {
		size_t w = (size_t)maxi(cf->hidden_size, cf->vocab_size);
		/* linear-input taps: the MLP and attention widths too */
		w = (size_t)maxi((int)w, maxi(cf->intermediate_size, cf->num_attention_heads * cf->head_dim));
		w = (size_t)maxi((int)w, cf->lightning_nh * cf->lightning_head_dim);
		c->host = sfw_malloc(R * w * sizeof(float));
		c->host_idx = sfw_malloc((size_t)cf->num_key_value_heads * R * cf->sparse_k * sizeof(int32_t));
		if (!c->host || !c->host_idx)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for tap buffers");
	}
	if (c->logits_rows < c->cap_rows) {
		float *l = be->alloc(be, R * (size_t)cf->vocab_size * sizeof(float));
		if (!l)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for all-row logits");
		be->free(be, c->logits_dev);
		c->logits_dev = l;
		c->last_row = -1;
		c->logits_rows = c->cap_rows;
		sfwi_step_free(be, c->step); /* it wrote the old buffer */
		c->step = NULL;
	}
	return SFW_OK;
}

