/* batch_shim.c - TEMPORARY: runner/batch.h over one sfw_ctx per sequence,
 * stepped one after another, until branch batch lands. */
#include "runner/batch.h"
#include "alloc.h"

#include <string.h>

#define SHIM_MAX 64

struct sfw_batch {
	struct sfw_model *m;
	struct sfw_batch_params p;
	struct sfw_ctx *ctx[SHIM_MAX];
	int open[SHIM_MAX];
	float *logits; /* [max_seqs * 16 items?] */
	int cap;
	int vocab;
};

struct sfw_batch_params sfw_batch_default_params(void)
{
	struct sfw_batch_params p = {16, 1 << 16, 4096};
	return p;
}

enum sfw_status sfw_batch_new(struct sfw_model *m, const struct sfw_batch_params *p, struct sfw_batch **out,
			      struct sfw_err *err)
{
	if (p->max_seqs < 1 || p->max_seqs > SHIM_MAX)
		return sfw_fail(err, SFW_E_INVAL, "max_seqs %d", p->max_seqs);
	struct sfw_batch *b = sfw_calloc(1, sizeof(*b));
	if (!b)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	b->m = m;
	b->p = *p;
	b->vocab = sfw_model_config(m)->vocab_size;
	b->cap = SHIM_MAX * 4;
	b->logits = sfw_malloc((size_t)b->cap * b->vocab * sizeof(float));
	if (!b->logits) {
		sfw_free(b);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	*out = b;
	return SFW_OK;
}

void sfw_batch_free(struct sfw_batch *b)
{
	if (!b)
		return;
	for (int i = 0; i < SHIM_MAX; i++)
		sfw_ctx_free(b->ctx[i]);
	sfw_free(b->logits);
	sfw_free(b);
}

enum sfw_status sfw_batch_seq_open(struct sfw_batch *b, int *seq, struct sfw_err *err)
{
	for (int i = 0; i < b->p.max_seqs; i++)
		if (!b->open[i]) {
			if (!b->ctx[i]) {
				struct sfw_ctx_params xp = sfw_ctx_default_params();
				enum sfw_status s = sfw_ctx_new(b->m, &xp, &b->ctx[i], err);
				if (s != SFW_OK)
					return s;
			}
			sfw_ctx_reset(b->ctx[i]);
			b->open[i] = 1;
			*seq = i;
			return SFW_OK;
		}
	return sfw_fail(err, SFW_E_RANGE, "all %d sequences are in use", b->p.max_seqs);
}

void sfw_batch_seq_close(struct sfw_batch *b, int seq)
{
	if (seq >= 0 && seq < SHIM_MAX && b->open[seq]) {
		b->open[seq] = 0;
		sfw_ctx_reset(b->ctx[seq]);
	}
}

int64_t sfw_batch_seq_pos(const struct sfw_batch *b, int seq)
{
	return b->open[seq] ? sfw_ctx_pos(b->ctx[seq]) : 0;
}

enum sfw_status sfw_batch_step(struct sfw_batch *b, const struct sfw_batch_item *it, int n, struct sfw_err *err)
{
	if (n > b->cap)
		return sfw_fail(err, SFW_E_RANGE, "%d items", n);
	int64_t used = 0;
	for (int i = 0; i < b->p.max_seqs; i++)
		if (b->open[i])
			used += sfw_ctx_pos(b->ctx[i]);
	for (int i = 0; i < n; i++)
		used += it[i].n;
	if (used > b->p.pool_tokens)
		return sfw_fail(err, SFW_E_RANGE, "the KV pool of %lld tokens is full", (long long)b->p.pool_tokens);
	for (int i = 0; i < n; i++) {
		if (it[i].seq < 0 || it[i].seq >= SHIM_MAX || !b->open[it[i].seq])
			return sfw_fail(err, SFW_E_INVAL, "sequence %d is not open", it[i].seq);
		if (sfw_ctx_pos(b->ctx[it[i].seq]) + it[i].n > b->p.max_ctx)
			return sfw_fail(err, SFW_E_RANGE, "sequence %d past max_ctx", it[i].seq);
	}
	for (int i = 0; i < n; i++) {
		enum sfw_status s = sfw_ctx_prefill(b->ctx[it[i].seq], it[i].ids, (size_t)it[i].n,
						    it[i].want_logits ? b->logits + (size_t)i * b->vocab : NULL, err);
		if (s != SFW_OK)
			return s;
	}
	return SFW_OK;
}

const float *sfw_batch_logits(const struct sfw_batch *b, int item)
{
	return b->logits + (size_t)item * b->vocab;
}
