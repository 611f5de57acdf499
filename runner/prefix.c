/* prefix.c - the prefix cache (runner/prefix.h): entries are forks of
 * sequences that no step touches, found by their token ids. */
#include "runner/prefix.h"
#include "alloc.h"

#include <string.h>

/* Whole KV blocks shared with another entry (paged batches: forks share
 * them by reference, runner/batch.h): an entry counts only the bytes it
 * adds, so a chain of prompts that extend each other costs its tokens
 * once. */
struct link {
	uint64_t parent; /* the entry (uid()) whose first `shared` blocks these are; 0 none */
	int64_t shared;
};

struct entry {
	int seq;      /* the batch sequence holding the state */
	int32_t *ids; /* [n] */
	int64_t n, bytes;
	uint64_t used; /* the use clock when last put or matched */
	struct link lk;
};

/* What an open sequence shares with an entry: the one it was forked from
 * (sfw_prefix_open), then the last entry made of it (sfw_prefix_put);
 * valid while the sequence's serial is `serial`. */
struct origin {
	uint64_t serial;
	struct link lk;
};

struct sfw_prefix {
	struct sfw_batch *b;
	struct sfw_prefix_params p;
	struct entry e[SFW_BATCH_MAX_SEQS];
	struct origin from[SFW_BATCH_MAX_SEQS];
	int n;
	int64_t block_bytes; /* one KV block's, when the batch is paged; 0: nothing is shared */
	uint64_t clock;
	struct sfw_prefix_stats st;
};

enum sfw_status sfw_prefix_new(struct sfw_batch *b, const struct sfw_prefix_params *p, struct sfw_prefix **out,
			       struct sfw_err *err)
{
	*out = NULL;
	if (p->budget_bytes < 0 || p->max_entries < 0 || p->max_entries > SFW_BATCH_MAX_SEQS || p->min_tokens < 0)
		return sfw_fail(err, SFW_E_INVAL, "prefix cache: budget, entries (0..%d) or minimum out of range",
				SFW_BATCH_MAX_SEQS);
	struct sfw_prefix *pc = sfw_calloc(1, sizeof(*pc));
	if (!pc)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the prefix cache");
	pc->b = b, pc->p = *p;
	if (sfw_batch_paged(b)) /* a token more than a whole block: one block more */
		pc->block_bytes = sfw_batch_seq_bytes(b, 1) - sfw_batch_seq_bytes(b, 0);
	*out = pc;
	return SFW_OK;
}

/* An entry's name in links: its sequence's serial (the entry holds the
 * sequence open). */
static uint64_t uid(const struct sfw_prefix *pc, int i)
{
	return sfw_batch_seq_serial(pc->b, pc->e[i].seq);
}

static int alive(const struct sfw_prefix *pc, uint64_t id)
{
	for (int i = 0; id && i < pc->n; i++)
		if (uid(pc, i) == id)
			return 1;
	return 0;
}

/* Entry gone (named id, its own link dl): a link to it now reaches its parent,
 * through the blocks both shared; what the link's holder adds grows by the
 * rest (returned, in blocks). */
static int64_t relink(struct link *lk, uint64_t id, const struct link *dl)
{
	if (lk->parent != id)
		return 0;
	int64_t shared = dl->parent ? (lk->shared < dl->shared ? lk->shared : dl->shared) : 0, more = lk->shared - shared;
	lk->parent = dl->parent, lk->shared = shared;
	return more;
}

static void drop(struct sfw_prefix *pc, int i)
{
	struct entry e = pc->e[i];
	uint64_t gone = uid(pc, i);
	sfw_batch_seq_close(pc->b, e.seq);
	sfw_free(e.ids);
	pc->st.bytes -= e.bytes;
	pc->e[i] = pc->e[--pc->n];
	for (int j = 0; j < pc->n; j++) {
		int64_t more = relink(&pc->e[j].lk, gone, &e.lk) * pc->block_bytes;
		pc->e[j].bytes += more, pc->st.bytes += more;
	}
	for (int s = 0; s < SFW_BATCH_MAX_SEQS; s++)
		relink(&pc->from[s].lk, gone, &e.lk);
}

void sfw_prefix_free(struct sfw_prefix *pc)
{
	if (!pc)
		return;
	while (pc->n > 0)
		drop(pc, pc->n - 1);
	sfw_free(pc);
}

/* The link of open sequence seq to an entry ({0, 0}: none known). */
static struct link link_of(const struct sfw_prefix *pc, int seq)
{
	struct link none = {0, 0};
	const struct origin *o = &pc->from[seq];
	if (!pc->block_bytes || o->serial != sfw_batch_seq_serial(pc->b, seq) || !alive(pc, o->lk.parent))
		return none;
	return o->lk;
}

static void set_origin(struct sfw_prefix *pc, int seq, uint64_t parent, int64_t tokens)
{
	pc->from[seq] = (struct origin){sfw_batch_seq_serial(pc->b, seq), {parent, tokens / sfw_batch_block(pc->b)}};
}

/* Evicts the least recently used entry other than the one on sequence
 * keep (-1: none kept): 1 when there was one. */
static int evict_other(struct sfw_prefix *pc, int keep)
{
	int lru = -1;
	for (int i = 0; i < pc->n; i++)
		if (pc->e[i].seq != keep && (lru < 0 || pc->e[i].used < pc->e[lru].used))
			lru = i;
	if (lru < 0)
		return 0;
	drop(pc, lru);
	pc->st.evictions++;
	return 1;
}

int sfw_prefix_evict(struct sfw_prefix *pc)
{
	return evict_other(pc, -1);
}

/* The entry holding exactly ids[0..n), or with longest 1: the longest whose
 * tokens are a proper prefix of ids[0..n); -1 none. */
static int find(const struct sfw_prefix *pc, const int32_t *ids, int64_t n, int longest)
{
	int best = -1;
	for (int i = 0; i < pc->n; i++) {
		const struct entry *e = &pc->e[i];
		if (longest ? e->n >= n || (best >= 0 && e->n <= pc->e[best].n) : e->n != n)
			continue;
		if (!memcmp(e->ids, ids, (size_t)e->n * sizeof(int32_t)))
			best = i;
	}
	return best;
}

static int for_room(enum sfw_status s)
{
	return s == SFW_E_RANGE || s == SFW_E_NOSPACE; /* no slot, or no blocks */
}

enum sfw_status sfw_prefix_open(struct sfw_prefix *pc, const int32_t *ids, int64_t n, int *seq, int64_t *hit,
				struct sfw_err *err)
{
	*seq = -1, *hit = 0;
	pc->st.lookups++;
	int i = find(pc, ids, n, 1);
	while (i >= 0) {
		struct sfw_err fe = {0};
		int src = pc->e[i].seq;
		enum sfw_status s = sfw_batch_seq_fork(pc->b, src, seq, &fe);
		if (s == SFW_OK) {
			pc->e[i].used = ++pc->clock;
			*hit = pc->e[i].n;
			pc->st.hits++, pc->st.cached_tokens += *hit;
			set_origin(pc, *seq, uid(pc, i), *hit);
			return SFW_OK;
		}
		if (!for_room(s) || !evict_other(pc, src))
			break; /* a plain sequence, then */
		i = find(pc, ids, n, 1); /* (the entries moved) */
	}
	for (;;) {
		enum sfw_status s = sfw_batch_seq_open(pc->b, seq, err);
		if (s == SFW_OK)
			set_origin(pc, *seq, 0, 0);
		if (s == SFW_OK || !for_room(s) || !sfw_prefix_evict(pc))
			return s;
	}
}

static enum sfw_status over_budget(const struct sfw_prefix *pc, int64_t n, int64_t bytes, struct sfw_err *err)
{
	return sfw_fail(err, SFW_E_NOSPACE, "a state of %lld tokens (%.1f MiB) is over the prefix cache (%.1f MiB)",
			(long long)n, (double)bytes / (1 << 20), (double)pc->p.budget_bytes / (1 << 20));
}

enum sfw_status sfw_prefix_put(struct sfw_prefix *pc, int seq, const int32_t *ids, int64_t n, struct sfw_err *err)
{
	if (n < pc->p.min_tokens || n <= 0 || pc->p.max_entries == 0)
		return SFW_OK;
	if (sfw_batch_seq_pos(pc->b, seq) != n)
		return sfw_fail(err, SFW_E_INVAL, "prefix cache: sequence %d is not at position %lld", seq, (long long)n);
	int i = find(pc, ids, n, 0);
	if (i >= 0) {
		pc->e[i].used = ++pc->clock;
		return SFW_OK;
	}
	int64_t full = sfw_batch_seq_bytes(pc->b, n);
	struct link lk = link_of(pc, seq);
	if (full - lk.shared * pc->block_bytes > pc->p.budget_bytes)
		return over_budget(pc, n, full - lk.shared * pc->block_bytes, err);
	int32_t *copy = sfw_malloc((size_t)n * sizeof(int32_t));
	if (!copy)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the prefix cache");
	memcpy(copy, ids, (size_t)n * sizeof(int32_t));
	/* the fork first (a slot and blocks: the least recently used entries
	 * make room), then the entry count and the budget with it in */
	int dst;
	enum sfw_status s;
	while ((s = sfw_batch_seq_fork(pc->b, seq, &dst, err)) != SFW_OK && for_room(s) && sfw_prefix_evict(pc))
		;
	if (s != SFW_OK) {
		sfw_free(copy);
		return s;
	}
	lk = link_of(pc, seq); /* (its parent may have made room) */
	struct entry *e = &pc->e[pc->n++];
	*e = (struct entry){dst, copy, n, full - lk.shared * pc->block_bytes, ++pc->clock, lk};
	pc->st.bytes += e->bytes, pc->st.puts++;
	set_origin(pc, seq, uid(pc, pc->n - 1), n); /* the sequence's later states share this one's blocks */
	while ((pc->n > pc->p.max_entries || pc->st.bytes > pc->p.budget_bytes) && evict_other(pc, dst))
		;
	if (pc->st.bytes > pc->p.budget_bytes) { /* alone, and over it: not kept */
		int64_t bytes = pc->st.bytes;
		drop(pc, 0);
		return over_budget(pc, n, bytes, err);
	}
	return SFW_OK;
}

void sfw_prefix_stats(const struct sfw_prefix *pc, struct sfw_prefix_stats *out)
{
	*out = pc->st;
	out->entries = pc->n;
}
