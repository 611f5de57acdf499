/* ctxstate.c - a context's state to and from bytes (runner/runner.h,
 * sfw_ctx_state_save / sfw_ctx_state_load; the format: runner/ctxstate.h):
 * the caches through the backend's cache views (SFW_OP_CACHE_VIEW) and its
 * transfers, then the position, the selection notes and the last row's
 * logits, which sfw_ctx_next_from_last chooses from. */
#include "runner/ctx.h"
#include "runner/ctxstate.h"
#include "alloc.h"
#include "checked.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define XFER (4u << 20) /* bytes per host staging copy */

/* What a state of c's model and parameters has in its header, and the
 * layer kinds (sparse[n_layers], sfw_free). */
static enum sfw_status state_want(const struct sfw_ctx *c, const uint8_t binding[32],
				  struct sfwi_state_hdr *h, uint8_t **sparse, struct sfw_err *err)
{
	const struct sfw_config *cf = &c->m->cfg;
	const struct sfw_backend *be = c->m->be;
	memset(h, 0, sizeof(*h));
	memcpy(h->binding, binding, 32);
	size_t bl = strlen(be->name);
	memcpy(h->backend, be->name, bl < sizeof(h->backend) ? bl : sizeof(h->backend) - 1);
	h->act_size = (uint32_t)sfw_be_act_size(be);
	h->act_dtype = (uint32_t)be->act;
	h->n_layers = (uint32_t)cf->num_hidden_layers;
	h->nkv = (uint32_t)cf->num_key_value_heads, h->hd = (uint32_t)cf->head_dim;
	h->lnh = (uint32_t)cf->lightning_nh, h->lhd = (uint32_t)cf->lightning_head_dim;
	h->ksize = (uint32_t)cf->sparse_kernel_size, h->stride = (uint32_t)cf->sparse_kernel_stride;
	h->block = (uint32_t)cf->sparse_block_size, h->sel_k = (uint32_t)cf->sparse_k;
	h->vocab = (uint32_t)cf->vocab_size;
	h->dense_as_sparse = c->p.dense_as_sparse != 0;
	h->kv = c->m->kv_cache != SFW_KV_CACHE_FP8 ? SFWI_STATE_KV_ACT
		: sfwi_kv8_layout(c->m)		   ? SFWI_STATE_KV_FP8
						   : SFWI_STATE_KV_ROUNDED;
	h->chunk_rows = (uint32_t)c->cap_rows;
	*sparse = sfw_malloc(h->n_layers ? h->n_layers : 1);
	if (!*sparse)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (uint32_t i = 0; i < h->n_layers; i++)
		(*sparse)[i] = cf->mixer[i] == SFW_MIXER_SPARSE;
	sfwi_sum(*sparse, h->n_layers, h->kinds_sum);
	return SFW_OK;
}

/* The backend address a section's bytes live at (caches: through the
 * layer's view), or NULL for the notes, which the host keeps. */
static enum sfw_status sec_base(struct sfw_ctx *c, const struct sfwi_sec_desc *d, void **base,
				struct sfw_err *err)
{
	*base = NULL;
	if (d->kind == SFWI_SEC_NOTES)
		return SFW_OK;
	if (d->kind == SFWI_SEC_LOGITS) {
		*base = c->logits_dev + (size_t)(c->last_row > 0 ? c->last_row : 0) * c->m->cfg.vocab_size;
		return SFW_OK;
	}
	struct sfw_cache_view v;
	enum sfw_status s = sfw_be_cache_view(c->m->be, c->cache, d->layer, NULL, &v, err);
	if (s != SFW_OK)
		return s;
	if (d->kind != SFWI_SEC_STATE && !v.k) /* its counts only: the K/V are in pool blocks */
		return sfw_fail(err, SFW_E_UNSUPPORTED, "a paged KV cache has no view");
	void *const p[] = {v.k, v.v, v.c1, v.c2, v.state};
	const int64_t room[] = {v.cap, v.cap, v.cap1, v.cap2, 1};
	*base = p[d->kind];
	if (!*base || (d->kind != SFWI_SEC_STATE && (int64_t)d->rows > room[d->kind]))
		return sfw_fail(err, SFW_E_INVAL, "layer %d's cache has no room for its state", d->layer);
	return SFW_OK;
}

/* The selection notes as the file holds them: per sparse layer its mode
 * and the blocks of the last row. */
static void notes_get(struct sfw_ctx *c, int32_t *out)
{
	const struct sfw_config *cf = &c->m->cfg;
	size_t nsel = (size_t)cf->num_key_value_heads * cf->sparse_k;
	for (int li = 0; li < cf->num_hidden_layers; li++) {
		if (cf->mixer[li] != SFW_MIXER_SPARSE)
			continue;
		*out = sfw_ctx_last_blocks(c, li, out + 1);
		out += 1 + nsel;
	}
}

static void notes_put(struct sfw_ctx *c, const int32_t *in)
{
	const struct sfw_config *cf = &c->m->cfg;
	size_t nsel = (size_t)cf->num_key_value_heads * cf->sparse_k;
	for (int li = 0; li < cf->num_hidden_layers; li++) {
		if (cf->mixer[li] != SFW_MIXER_SPARSE)
			continue;
		c->last_state[li] = in[0];
		c->last_fresh[li] = 0;
		memcpy(c->last_blocks + (size_t)li * nsel, in + 1, nsel * sizeof(int32_t));
		in += 1 + nsel;
	}
}

/* An fp8 K or V section's piece (n bytes at off): the rows past the
 * state's n_tokens in its last group of 32 zeroed (the cache's bytes there
 * were never written). */
static void kv8_zero_tail(const struct sfwi_state_hdr *h, uint64_t off, unsigned char *buf, size_t n)
{
	uint64_t P = h->n_tokens, r0 = P % 32;
	if (r0 == 0)
		return;
	uint64_t gb = 32 * (uint64_t)h->nkv * (h->hd + 4ull), cb = 32 * (uint64_t)h->nkv * h->hd, g0 = P / 32 * gb;
	const uint64_t span[2][2] = {{g0 + r0 * h->nkv * h->hd, g0 + cb}, {g0 + cb + r0 * h->nkv * 4, g0 + gb}};
	for (int k = 0; k < 2; k++) {
		uint64_t a = span[k][0] > off ? span[k][0] : off, b = span[k][1] < off + n ? span[k][1] : off + n;
		if (a < b)
			memset(buf + (a - off), 0, (size_t)(b - a));
	}
}

/* The payload of c's state: each section from backend memory (or the
 * host's notes) through buf to wr, and into its sum. */
static enum sfw_status write_payload(struct sfw_ctx *c, const struct sfwi_state_hdr *h, const uint8_t *sparse,
				     unsigned char *buf, sfw_state_write_fn wr, void *user, struct sfwi_sum *sum,
				     struct sfw_err *err)
{
	struct sfw_backend *be = c->m->be;
	struct sfwi_sec_desc d;
	enum sfw_status s = SFW_OK;
	for (int i = 0; s == SFW_OK && sfwi_state_section(h, sparse, i, &d); i++) {
		void *base;
		if ((s = sec_base(c, &d, &base, err)) != SFW_OK)
			return s;
		if (d.kind >= SFWI_SEC_K && d.kind <= SFWI_SEC_C2) { /* the counts the format implies */
			int64_t n[3];
			sfw_be_cache_ncompressed(be, c->cache, d.layer, n);
			int64_t have = d.kind <= SFWI_SEC_V ? sfw_be_cache_len(be, c->cache, d.layer)
							    : n[d.kind - SFWI_SEC_C1];
			if (have != (int64_t)d.rows)
				return sfw_fail(err, SFW_E_INVAL,
						"layer %d's cache holds %lld rows where its state has %llu",
						d.layer, (long long)have, (unsigned long long)d.rows);
		}
		int32_t *notes = NULL;
		if (d.kind == SFWI_SEC_NOTES) {
			if (!(notes = sfw_malloc((size_t)d.bytes)))
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
			notes_get(c, notes);
		}
		for (uint64_t off = 0; s == SFW_OK && off < d.bytes; off += XFER) {
			size_t n = d.bytes - off < XFER ? (size_t)(d.bytes - off) : XFER;
			if (notes)
				memcpy(buf, (char *)notes + off, n);
			else
				sfw_be_to_host(be, buf, (char *)base + off, n);
			if (d.elem == 1)
				kv8_zero_tail(h, off, buf, n);
			sfwi_sum_update(sum, buf, n);
			s = wr(user, buf, n, err);
		}
		sfw_free(notes);
	}
	return s;
}

enum sfw_status sfw_ctx_state_save(struct sfw_ctx *c, const uint8_t binding[32], const int32_t *ids, size_t n,
				   sfw_state_write_fn wr, void *user, struct sfw_err *err)
{
	if (!c->cache)
		return sfw_fail(err, SFW_E_INVAL, "a batch's workspace holds no sequence");
	if (c->broken)
		return sfw_fail(err, SFW_E_INVAL,
				"the context is inconsistent after a failed call; reset it");
	if (n == 0 || (int64_t)n != c->pos)
		return sfw_fail(err, SFW_E_INVAL, "%zu token ids for a context that holds %lld", n,
				(long long)c->pos);
	struct sfwi_state_hdr h;
	uint8_t *sparse = NULL;
	unsigned char hb[SFWI_STATE_HDR], tail[SFWI_SUM];
	enum sfw_status s = state_want(c, binding, &h, &sparse, err);
	if (s != SFW_OK)
		return s;
	h.n_tokens = n;
	sfwi_sum(ids, n * sizeof(int32_t), h.ids_sum);
	h.flags = c->last_row >= 0 ? SFWI_STATE_LOGITS : 0;
	unsigned char *buf = sfw_malloc(XFER);
	struct sfwi_sum sum;
	sfwi_sum_init(&sum);
	if (!buf)
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (s == SFW_OK && (s = sfwi_state_payload_bytes(&h, sparse, &h.payload_bytes, err)) == SFW_OK) {
		sfwi_state_hdr_encode(&h, hb);
		if ((s = wr(user, hb, sizeof(hb), err)) == SFW_OK &&
		    (s = wr(user, ids, n * sizeof(int32_t), err)) == SFW_OK &&
		    (s = write_payload(c, &h, sparse, buf, wr, user, &sum, err)) == SFW_OK) {
			sfwi_sum_final(&sum, tail);
			s = wr(user, tail, sizeof(tail), err);
		}
	}
	sfw_free(buf);
	sfw_free(sparse);
	return s;
}

/* ---- load ------------------------------------------------------------------ */

struct load_sink {
	struct sfw_ctx *c;
	int reserved;
	int64_t counts[3]; /* the sparse layers' tokens and compressed keys */
	int32_t *notes;
};

static enum sfw_status load_piece(void *user, const struct sfwi_state_hdr *h, const struct sfwi_sec_desc *d,
				  uint64_t off, const void *p, size_t n, struct sfw_err *err)
{
	struct load_sink *ls = user;
	struct sfw_ctx *c = ls->c;
	struct sfw_backend *be = c->m->be;
	enum sfw_status s;
	if (!ls->reserved) { /* room for the tokens (bounded by the prompt) */
		if ((s = be->cache_reserve(be, c->cache, (int64_t)h->n_tokens, err)) != SFW_OK)
			return s;
		ls->reserved = 1;
	}
	if (d->kind == SFWI_SEC_NOTES) {
		if (!ls->notes && !(ls->notes = sfw_malloc((size_t)d->bytes)))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		memcpy((char *)ls->notes + off, p, n);
		return SFW_OK;
	}
	if (d->kind == SFWI_SEC_K)
		ls->counts[0] = (int64_t)d->rows;
	else if (d->kind == SFWI_SEC_C1 || d->kind == SFWI_SEC_C2)
		ls->counts[d->kind - SFWI_SEC_C1 + 1] = (int64_t)d->rows;
	void *base;
	if ((s = sec_base(c, d, &base, err)) != SFW_OK)
		return s;
	sfw_be_from_host(be, (char *)base + off, p, n);
	return SFW_OK;
}

/* After the payload: every sparse layer's counts, the notes, the logits'
 * row and the position. */
static enum sfw_status load_finish(struct sfw_ctx *c, const struct load_sink *ls, int64_t P, int logits,
				   struct sfw_err *err)
{
	const struct sfw_config *cf = &c->m->cfg;
	struct sfw_cache_view v;
	for (int li = 0; li < cf->num_hidden_layers; li++) {
		if (cf->mixer[li] != SFW_MIXER_SPARSE)
			continue;
		enum sfw_status s = sfw_be_cache_view(c->m->be, c->cache, li, ls->counts, &v, err);
		if (s != SFW_OK)
			return s;
	}
	if (ls->notes)
		notes_put(c, ls->notes);
	c->last_row = logits ? 0 : -1;
	c->pos = P;
	sfw_be_wait(c->m->be);
	return SFW_OK;
}

enum sfw_status sfw_ctx_state_load(struct sfw_ctx *c, const uint8_t binding[32], const int32_t *prompt,
				   size_t n_prompt, sfw_state_read_fn rd, void *user, int64_t *n_loaded,
				   struct sfw_err *err)
{
	*n_loaded = 0;
	if (!c->cache)
		return sfw_fail(err, SFW_E_INVAL, "a batch's workspace holds no sequence");
	sfw_ctx_reset(c);
	sfwi_step_free(c->m->be, c->step); /* recorded over the sequence it held */
	c->step = NULL;
	struct sfwi_state_hdr want, got;
	uint8_t *sparse = NULL;
	struct load_sink ls = {c, 0, {0, 0, 0}, NULL};
	int64_t P = 0;
	enum sfw_status s = state_want(c, binding, &want, &sparse, err);
	if (s == SFW_OK)
		s = sfwi_state_read(&want, sparse, prompt, n_prompt, rd, user, load_piece, &ls, &got, &P,
				    err);
	if (s == SFW_OK && P > 0)
		s = load_finish(c, &ls, P, (got.flags & SFWI_STATE_LOGITS) != 0, err);
	if (s != SFW_OK || P == 0)
		sfw_ctx_reset(c);
	else
		*n_loaded = P;
	sfw_free(ls.notes);
	sfw_free(sparse);
	return s;
}

/* ---- the last row's logits -------------------------------------------------- */

enum sfw_status sfw_ctx_next_from_last(struct sfw_ctx *c, const struct sfw_op_sample_params *sp, double u,
				       int32_t *next, struct sfw_err *err)
{
	if (!sp || !next || !(u >= 0 && u < 1) || !(sp->temperature >= 0) || !isfinite(sp->temperature) ||
	    sp->top_k < 0 || !(sp->top_p > 0 && sp->top_p <= 1))
		return sfw_fail(err, SFW_E_INVAL, "invalid sampling parameters");
	if (c->broken || c->last_row < 0)
		return sfw_fail(err, SFW_E_INVAL, "the context has no logits of a last row");
	struct sfw_backend *be = c->m->be;
	int V = c->m->cfg.vocab_size;
	const float *row = c->logits_dev + (size_t)c->last_row * V;
	const struct sfw_op_sample_params *sps[1] = {sp};
	double us[1] = {u};
	int32_t id = -1;
	/* where sfwi_forward chooses: on the backend, the host finishing
	 * what it leaves (-1) */
	if (sfw_be_sample(be, c->next_dev, row, V, 1, sps, us))
		sfw_be_to_host(be, &id, c->next_dev, sizeof(id));
	if (id < 0) {
		if (!c->host_logits && !(c->host_logits = sfw_malloc((size_t)V * sizeof(float))))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		sfw_be_to_host(be, c->host_logits, row, (size_t)V * sizeof(float));
		id = sfw_op_sample_cpu(NULL, c->host_logits, V, sp, u); /* -1: no scratch */
	}
	*next = id;
	enum sfw_status s = sfwi_take_failure(be, err);
	return s == SFW_OK && id < 0 ? sfw_fail(err, SFW_E_NOMEM, "out of memory for sampling") : s;
}

enum sfw_status sfw_ctx_last_logits(struct sfw_ctx *c, float *out, struct sfw_err *err)
{
	if (c->broken || c->last_row < 0)
		return sfw_fail(err, SFW_E_INVAL, "the context has no logits of a last row");
	int V = c->m->cfg.vocab_size;
	sfw_be_to_host(c->m->be, out, c->logits_dev + (size_t)c->last_row * V, (size_t)V * sizeof(float));
	return SFW_OK;
}
