/* batch.c - batched decode over one forward path (runner/batch.h).
 *
 * A batch owns a workspace context (step buffers for max_step_rows rows,
 * logits for max_seqs rows: sfwi_ctx_workspace) and one backend cache per
 * open sequence. A step checks everything that can refuse it (items, ids,
 * lengths, the pool, cache room) before the first op runs, then hands the
 * rows to sfwi_forward as one part per sequence.
 *
 * The block count: a sequence holds the blocks its cache has reserved
 * (room, in tokens, block-granular; a reserve never shrinks), so the
 * accounting is exact in both modes, paged (the backend's pool) or not.
 *
 * A closed sequence's cache is kept, parked in the slot, and reset for the
 * slot's next sequence: opening and closing a sequence then allocates and
 * frees nothing on the device (a server opens one per request; each
 * allocation, growth and free of a cache waited for the device). Paged, its
 * blocks go back to the pool when it closes. Caches of their own keep their
 * room while parked; it counts against the budget like an open one's, and
 * a step that needs those blocks frees the parked caches first. */
#include "runner/batch.h"
#include "alloc.h"
#include "log.h"
#include "runner/model.h"
#include "runner/plan.h"

#include <math.h>
#include <string.h>

_Static_assert(SFW_BATCH_MAX_SEQS <= SFW_BSEQ_MAX, "a step's sequences fit the backend's *_seqs calls");

struct bseq {
	struct sfw_bcache *cache; /* NULL: none (the slot is free) */
	int open;                 /* 0 with a cache: parked, free for the next sequence */
	int64_t pos;
	int64_t room;  /* tokens its cache has reserved */
	int broken; /* a step failed half-way */
	int stamp;  /* the step that last named it (duplicate check) */
	void *rec;  /* the backend's state for its decode steps alone (be->step's state) */
	uint64_t serial; /* sfw_batch_seq_serial */
};

struct sfw_batch {
	struct sfw_model *m;
	struct sfw_batch_params p;
	struct sfw_ctx *ws;
	struct sfw_bpool *pool; /* the backend's paged KV pool; NULL: caches of their own */
	struct bseq seq[SFW_BATCH_MAX_SEQS];
	int block;              /* tokens per KV block (sparse_block_size) */
	int64_t pool_blocks;
	int stamp;
	uint64_t opened;        /* sequences opened or forked so far (their serials) */
	/* per step */
	struct sfwi_part parts[SFW_BATCH_MAX_SEQS];
	int32_t *ids;           /* [max_step_rows] */
	struct sfwi_pick pick[SFW_BATCH_MAX_SEQS];
	int32_t next[SFW_BATCH_MAX_SEQS];   /* per logits row: the chosen token, -1 none */
	int item_logit[SFW_BATCH_MAX_SEQS]; /* item -> logits row, -1 none */
	int n_items;
	float *logits;          /* [max_seqs, vocab] host */
	void *brec;             /* the backend's state for decode steps of several sequences (be->step's state) */
};

struct sfw_batch_params sfw_batch_default_params(void)
{
	struct sfw_batch_params p = {16, 65536, 8192, 0, 0};
	return p;
}

static int64_t blocks_for(const struct sfw_batch *b, int64_t tokens)
{
	return (tokens + b->block - 1) / b->block;
}

/* Blocks the open sequences hold, and with parked 1 those the parked caches
 * do. Paged: the pool's count (a block that forks share counts once; a
 * parked cache holds none). */
static int64_t blocks_held(const struct sfw_batch *b, int parked)
{
	if (b->pool)
		return b->m->be->pool_used(b->m->be, b->pool);
	int64_t used = 0;
	for (int i = 0; i < b->p.max_seqs; i++)
		if (b->seq[i].cache && (b->seq[i].open || parked))
			used += blocks_for(b, b->seq[i].room);
	return used;
}

int64_t sfw_batch_blocks_used(const struct sfw_batch *b)
{
	return blocks_held(b, 0);
}

static void slot_free(struct sfw_batch *b, struct bseq *q)
{
	/* the recordings of steps of several sequences (brec) name no cache:
	 * they outlive this one */
	sfwi_step_free(b->m->be, q->rec);
	b->m->be->cache_free(b->m->be, q->cache);
	memset(q, 0, sizeof(*q));
}

int sfw_batch_paged(const struct sfw_batch *b)
{
	return b->pool != NULL;
}

int sfw_batch_block(const struct sfw_batch *b)
{
	return b->block;
}

int64_t sfw_batch_blocks_total(const struct sfw_batch *b)
{
	return b->pool_blocks;
}

enum sfw_status sfw_batch_new(struct sfw_model *m, const struct sfw_batch_params *p, struct sfw_batch **out,
			      struct sfw_err *err)
{
	struct sfw_batch_params dp = sfw_batch_default_params();
	if (!p)
		p = &dp;
	*out = NULL;
	const struct sfw_config *cf = sfw_model_config(m);
	if (p->max_seqs < 1 || p->max_seqs > SFW_BATCH_MAX_SEQS)
		return sfw_fail(err, SFW_E_INVAL, "a batch holds 1 to %d sequences, not %d", SFW_BATCH_MAX_SEQS,
				p->max_seqs);
	if (p->pool_tokens < cf->sparse_block_size || p->pool_tokens > ((int64_t)1 << 40))
		return sfw_fail(err, SFW_E_INVAL, "invalid KV pool size (%lld tokens; at least one block of %d)",
				(long long)p->pool_tokens, cf->sparse_block_size);
	if (p->max_ctx < 1 || p->max_ctx > (int64_t)INT32_MAX)
		return sfw_fail(err, SFW_E_INVAL, "invalid per-sequence context (%lld tokens)", (long long)p->max_ctx);
	if (p->max_step_rows < 0 || p->max_step_rows > (1 << 16))
		return sfw_fail(err, SFW_E_INVAL, "invalid step size (%d rows)", p->max_step_rows);
	struct sfw_batch *b = sfw_calloc(1, sizeof(*b));
	if (!b)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	b->m = m;
	b->p = *p;
	if (!b->p.max_step_rows)
		b->p.max_step_rows = p->max_seqs + 256;
	if (b->p.max_step_rows < b->p.max_seqs)
		b->p.max_step_rows = b->p.max_seqs; /* room for one decode row each */
	b->block = cf->sparse_block_size;
	b->pool_blocks = p->pool_tokens / b->block;
	enum sfw_status s = SFW_OK;
	struct sfw_backend *be = m->be;
	if (be->supports_op(be, SFW_OP_POOL, SFW_DTYPE_F32)) {
		struct sfw_cache_desc d;
		struct sfw_err pe = {0};
		sfwi_cache_desc(m, NULL, 0, &d);
		s = be->pool_new(be, &d, b->pool_blocks, &b->pool, &pe);
		if (s == SFW_E_UNSUPPORTED) { /* per-sequence caches under the same budget */
			sfw_log(SFW_LOG_DEBUG, "%s: %s; KV caches per sequence", be->name, pe.msg);
			b->pool = NULL;
			s = SFW_OK;
		} else if (s != SFW_OK && err) {
			*err = pe;
		}
	}
	if (s == SFW_OK)
		s = sfwi_ctx_workspace(m, b->p.max_step_rows, b->p.max_seqs, &b->ws, err);
	if (s == SFW_OK) {
		b->ids = sfw_malloc((size_t)b->p.max_step_rows * sizeof(int32_t));
		b->logits = sfw_malloc((size_t)b->p.max_seqs * cf->vocab_size * sizeof(float));
		if (!b->ids || !b->logits)
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the batch buffers");
	}
	if (s != SFW_OK) {
		sfw_batch_free(b);
		return s;
	}
	*out = b;
	return SFW_OK;
}

void sfw_batch_free(struct sfw_batch *b)
{
	if (!b)
		return;
	for (int i = 0; i < SFW_BATCH_MAX_SEQS; i++)
		if (b->seq[i].cache)
			slot_free(b, &b->seq[i]);
	sfwi_step_free(b->m->be, b->brec);
	sfw_ctx_free(b->ws);
	if (b->pool)
		b->m->be->pool_free(b->m->be, b->pool);
	sfw_free(b->ids);
	sfw_free(b->logits);
	sfw_free(b);
}

enum sfw_status sfw_batch_seq_open(struct sfw_batch *b, int *seq, struct sfw_err *err)
{
	*seq = -1;
	for (int i = 0; i < b->p.max_seqs; i++) {
		struct bseq *q = &b->seq[i];
		if (q->open)
			continue;
		if (q->cache) { /* parked: emptied, its room kept */
			sfw_be_cache_reset(b->m->be, q->cache);
		} else {
			enum sfw_status s = sfwi_cache_new(b->m, b->pool, b->p.max_ctx, &q->cache, err);
			if (s != SFW_OK) {
				q->cache = NULL;
				return s;
			}
			q->room = 0;
		}
		q->open = 1, q->pos = 0, q->broken = 0, q->stamp = 0, q->serial = ++b->opened;
		*seq = i;
		return SFW_OK;
	}
	return sfw_fail(err, SFW_E_RANGE, "all %d sequences in use", b->p.max_seqs);
}

/* The slot a fork of src takes (the first free one, -1 none) and the
 * blocks it will hold, after making room: a parked cache of its own whose
 * room the pool cannot take beside the open sequences is freed (a new one
 * is made), then the other parked caches while the budget needs their
 * blocks (as a step does). */
static int fork_slot(struct sfw_batch *b, int64_t want, int64_t *hold)
{
	int slot = -1;
	for (int i = 0; i < b->p.max_seqs && slot < 0; i++)
		if (!b->seq[i].open)
			slot = i;
	if (slot < 0)
		return -1;
	struct bseq *q = &b->seq[slot];
	int64_t used = sfw_batch_blocks_used(b);
	if (q->cache && used + blocks_for(b, q->room) > b->pool_blocks)
		slot_free(b, q);
	int64_t have = q->cache ? blocks_for(b, q->room) : 0;
	int64_t extra = want > have ? want - have : 0;
	for (int i = b->p.max_seqs - 1; i >= 0 && blocks_held(b, 1) + extra > b->pool_blocks; i--)
		if (i != slot && b->seq[i].cache && !b->seq[i].open)
			slot_free(b, &b->seq[i]);
	*hold = want > have ? want : have;
	return slot;
}

enum sfw_status sfw_batch_seq_fork(struct sfw_batch *b, int src, int *dst, struct sfw_err *err)
{
	*dst = -1;
	if (src < 0 || src >= b->p.max_seqs || !b->seq[src].open)
		return sfw_fail(err, SFW_E_INVAL, "sequence %d is not open", src);
	struct bseq *from = &b->seq[src];
	if (from->broken)
		return sfw_fail(err, SFW_E_INVAL, "sequence %d is inconsistent after a failed step; close it", src);
	struct sfw_backend *be = b->m->be;
	if (!be->supports_op(be, SFW_OP_CACHE_COPY, SFW_DTYPE_F32))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "the %s backend cannot copy a sequence's caches: no fork",
				be->name);
	/* paged: the fork shares src's whole blocks and takes one for the
	 * partial last block; else a copy of them all */
	int64_t want = b->pool ? from->pos % b->block != 0 : blocks_for(b, from->pos), hold = 0;
	int slot = fork_slot(b, want, &hold);
	if (slot < 0)
		return sfw_fail(err, SFW_E_RANGE, "all %d sequences in use", b->p.max_seqs);
	int64_t used = sfw_batch_blocks_used(b);
	if (used + hold > b->pool_blocks)
		return sfw_fail(err, SFW_E_NOSPACE, "KV pool full: %lld of %lld blocks in use (the fork needs %lld more)",
				(long long)used, (long long)b->pool_blocks, (long long)hold);
	struct bseq *q = &b->seq[slot];
	enum sfw_status s = SFW_OK;
	if (q->cache) { /* parked: emptied, its room kept */
		sfw_be_cache_reset(be, q->cache);
	} else {
		s = sfwi_cache_new(b->m, b->pool, b->p.max_ctx, &q->cache, err);
		if (s != SFW_OK) {
			q->cache = NULL;
			return s;
		}
		q->room = 0;
	}
	if (!b->pool) /* paged: the copy takes (and shares) the blocks */
		s = be->cache_reserve(be, q->cache, from->pos, err);
	if (s == SFW_OK)
		s = sfw_be_cache_copy(be, q->cache, from->cache, err);
	if (s != SFW_OK) { /* the slot as it was, free; the cache and its blocks let go */
		slot_free(b, q);
		return s;
	}
	if (from->pos > q->room) /* whole blocks: what the cache now holds */
		q->room = blocks_for(b, from->pos) * b->block;
	q->open = 1, q->pos = from->pos, q->broken = 0, q->stamp = 0, q->serial = ++b->opened;
	*dst = slot;
	return SFW_OK;
}

void sfw_batch_seq_close(struct sfw_batch *b, int seq)
{
	if (!b || seq < 0 || seq >= SFW_BATCH_MAX_SEQS || !b->seq[seq].open)
		return;
	struct bseq *q = &b->seq[seq];
	if (q->broken) {
		slot_free(b, q);
		return;
	}
	sfwi_step_free(b->m->be, q->rec); /* recorded over this sequence's lengths */
	q->rec = NULL;
	if (b->pool) { /* paged: the blocks go back to the pool now; the cache is parked without them */
		sfw_be_cache_reset(b->m->be, q->cache);
		q->room = 0;
	}
	q->open = 0, q->pos = 0, q->stamp = 0;
}

int64_t sfw_seq_state_bytes(const struct sfw_model *m, int64_t max_ctx, int64_t tokens, int paged)
{
	return sfw_plan_seq_bytes(&m->cfg, (int)sfw_be_act_size(m->be), sfwi_kv8_layout(m), max_ctx, tokens, paged);
}

int64_t sfw_batch_seq_bytes(const struct sfw_batch *b, int64_t tokens)
{
	return sfw_seq_state_bytes(b->m, b->p.max_ctx, tokens, b->pool != NULL);
}

uint64_t sfw_batch_seq_serial(const struct sfw_batch *b, int seq)
{
	if (seq < 0 || seq >= b->p.max_seqs || !b->seq[seq].open)
		return 0;
	return b->seq[seq].serial;
}

int64_t sfw_batch_seq_pos(const struct sfw_batch *b, int seq)
{
	if (seq < 0 || seq >= b->p.max_seqs || !b->seq[seq].open)
		return -1;
	return b->seq[seq].pos;
}

const float *sfw_batch_logits(const struct sfw_batch *b, int item)
{
	if (item < 0 || item >= b->n_items || b->item_logit[item] < 0 || !b->pick[b->item_logit[item]].host)
		return NULL;
	return b->logits + (size_t)b->item_logit[item] * sfw_model_config(b->m)->vocab_size;
}

int32_t sfw_batch_next(const struct sfw_batch *b, int item)
{
	if (item < 0 || item >= b->n_items || b->item_logit[item] < 0)
		return -1;
	return b->next[b->item_logit[item]];
}

/* Everything that can refuse the step, before anything runs. */
static enum sfw_status step_check(struct sfw_batch *b, const struct sfw_batch_item *it, int n, int *rows,
				  struct sfw_err *err)
{
	const struct sfw_config *cf = sfw_model_config(b->m);
	if (!it || n < 1 || n > b->p.max_seqs)
		return sfw_fail(err, SFW_E_INVAL, "a step takes 1 to %d items, not %d", b->p.max_seqs, n);
	if (++b->stamp <= 0) { /* wrapped: restart the stamps */
		for (int i = 0; i < SFW_BATCH_MAX_SEQS; i++)
			b->seq[i].stamp = 0;
		b->stamp = 1;
	}
	int64_t total = 0, need = 0;
	for (int i = 0; i < n; i++) {
		int sq = it[i].seq;
		if (sq < 0 || sq >= b->p.max_seqs || !b->seq[sq].open)
			return sfw_fail(err, SFW_E_INVAL, "item %d: sequence %d is not open", i, sq);
		struct bseq *q = &b->seq[sq];
		if (q->stamp == b->stamp)
			return sfw_fail(err, SFW_E_INVAL, "item %d: sequence %d appears twice in one step", i, sq);
		q->stamp = b->stamp;
		if (q->broken)
			return sfw_fail(err, SFW_E_INVAL, "sequence %d is inconsistent after a failed step; close it", sq);
		if (it[i].n < 1 || !it[i].ids)
			return sfw_fail(err, SFW_E_INVAL, "item %d: no tokens", i);
		const struct sfw_op_sample_params *sp = it[i].sample;
		if (sp && (!(it[i].u >= 0 && it[i].u < 1) || !(sp->temperature >= 0) || !isfinite(sp->temperature) ||
			   sp->top_k < 0 || !(sp->top_p > 0 && sp->top_p <= 1)))
			return sfw_fail(err, SFW_E_INVAL, "item %d: invalid sampling parameters", i);
		for (int j = 0; j < it[i].n; j++)
			if (it[i].ids[j] < 0 || it[i].ids[j] >= cf->vocab_size)
				return sfw_fail(err, SFW_E_INVAL,
						"item %d: token id %d at index %d is outside the vocabulary (0..%d)", i,
						(int)it[i].ids[j], j, cf->vocab_size - 1);
		if (q->pos + it[i].n > b->p.max_ctx)
			return sfw_fail(err, SFW_E_RANGE, "sequence %d: %lld + %d tokens exceed its context of %lld", sq,
					(long long)q->pos, it[i].n, (long long)b->p.max_ctx);
		total += it[i].n;
		int64_t more = blocks_for(b, q->pos + it[i].n) - blocks_for(b, q->room);
		need += more > 0 ? more : 0;
	}
	if (total > b->p.max_step_rows)
		return sfw_fail(err, SFW_E_RANGE, "a step of %lld rows exceeds the batch's %d", (long long)total,
				b->p.max_step_rows);
	/* the parked caches' blocks first, when the step needs them */
	for (int i = b->p.max_seqs - 1; i >= 0 && blocks_held(b, 1) + need > b->pool_blocks; i--)
		if (b->seq[i].cache && !b->seq[i].open)
			slot_free(b, &b->seq[i]);
	int64_t used = sfw_batch_blocks_used(b);
	if (used + need > b->pool_blocks)
		return sfw_fail(err, SFW_E_NOSPACE, "KV pool full: %lld of %lld blocks in use (the step needs %lld more)",
				(long long)used, (long long)b->pool_blocks, (long long)need);
	/* room in each cache (grows, never changes what is there) */
	struct sfw_backend *be = b->m->be;
	for (int i = 0; i < n; i++) {
		struct bseq *q = &b->seq[it[i].seq];
		enum sfw_status s = be->cache_reserve(be, q->cache, q->pos + it[i].n, err);
		if (s != SFW_OK)
			return s;
		if (q->pos + it[i].n > q->room) /* whole blocks: what the cache now holds */
			q->room = blocks_for(b, q->pos + it[i].n) * b->block;
	}
	*rows = (int)total;
	return SFW_OK;
}

enum sfw_status sfw_batch_step(struct sfw_batch *b, const struct sfw_batch_item *it, int n, struct sfw_err *err)
{
	const struct sfw_config *cf = sfw_model_config(b->m);
	int rows = 0, nl = 0;
	b->n_items = 0;
	enum sfw_status s = step_check(b, it, n, &rows, err);
	if (s != SFW_OK)
		return s;
	int r = 0;
	for (int i = 0; i < n; i++) {
		struct bseq *q = &b->seq[it[i].seq];
		int64_t end = q->pos + it[i].n;
		struct sfwi_part *p = &b->parts[i];
		p->cache = q->cache;
		p->pos0 = q->pos;
		p->row0 = r;
		p->R = it[i].n;
		p->sparse = b->p.dense_as_sparse || end >= cf->sparse_dense_len;
		p->nblocks = (end + cf->sparse_block_size - 1) / cf->sparse_block_size;
		p->last_piece = 1;
		memcpy(b->ids + r, it[i].ids, (size_t)it[i].n * sizeof(int32_t));
		r += it[i].n;
		b->item_logit[i] = -1;
		if (it[i].want_logits || it[i].sample) {
			b->item_logit[i] = nl;
			b->pick[nl++] = (struct sfwi_pick){r - 1, it[i].want_logits != 0, it[i].sample, it[i].u};
		}
	}
	/* one sequence's step may replay its own recording (the batch-size-1
	 * bucket), a step of several the batch's recording for its bucket
	 * (sfwi_forward decides when the rows allow it) */
	void **rec = n == 1 ? &b->seq[it[0].seq].rec : NULL;
	s = sfwi_forward(b->ws, b->ids, rows, b->parts, n, b->pick, nl, b->logits, b->next, rec, &b->brec, err);
	for (int i = 0; i < n; i++) {
		struct bseq *q = &b->seq[it[i].seq];
		if (s == SFW_OK)
			q->pos += it[i].n;
		else
			q->broken = 1; /* some layers ran its rows, others not */
	}
	if (s == SFW_OK)
		b->n_items = n;
	return s;
}
