/* prefix.h - a prefix cache over a batch (runner/batch.h): never read the
 * same prompt twice.
 *
 * An entry is a snapshot of a sequence's state: a fork of it
 * (sfw_batch_seq_fork: on a paged batch its whole KV blocks, with the
 * compressed keys they hold, shared by reference and the partial last
 * block copied, else every block and the compressed keys copied; every
 * Lightning layer's recurrent state copied, in backend memory) that no
 * step touches, with the token ids that made
 * it. A new sequence whose
 * tokens start with an entry's tokens (and go on past them: at least one
 * token is left to prefill, whose logits choose the next token) opens as a
 * fork of the longest such entry and prefills only the rest. A hybrid model
 * needs the Lightning state at the match point, not only the KV blocks:
 * entries hold both, so a match is always at an entry's whole length.
 *
 * Exactness: a sequence opened from an entry holds what the entry's
 * sequence held when it was put, bit for bit on the CPU backend, so it
 * computes exactly what that sequence would have computed fed the same
 * calls (tests/test_prefix.c). A prompt prefilled in different calls can
 * differ in the last bits (each prefill call makes its own InfLLM-v2
 * dense/sparse decision and Lightning chunking, runner/batch.h), as it does
 * without the cache.
 *
 * Memory: an entry holds a batch sequence (a slot) and KV blocks of the
 * pool; sfw_batch_seq_bytes counts a state against the budget, less the
 * whole blocks it shares with the entry it came from (the entry its
 * sequence was opened from, or the last one put of that sequence): a chain
 * of prompts that extend each other counts each block once, as the pool
 * does. An eviction hands the shared blocks to the entries that share them
 * (they count them from then on). Entries are evicted least recently used
 * (a put or a match makes an entry the most recent) to stay within the
 * budget and the entry count, and on demand (sfw_prefix_evict) when the
 * batch needs their slots or blocks.
 *
 * Used by one thread at a time, as its batch. */
#ifndef SFW_PREFIX_H
#define SFW_PREFIX_H

#include "runner/batch.h"
#include "sfw.h"

#include <stdint.h>

struct sfw_prefix;

struct sfw_prefix_params {
	int64_t budget_bytes; /* sfw_batch_seq_bytes of the entries together, at most */
	int max_entries;      /* at most; each takes a sequence slot of the batch */
	int64_t min_tokens;   /* sfw_prefix_put keeps no shorter state (0: any) */
};

SFW_MUST_CHECK enum sfw_status sfw_prefix_new(struct sfw_batch *b, const struct sfw_prefix_params *p,
					      struct sfw_prefix **out, struct sfw_err *err);
/* Closes the entries' sequences. NULL is a no-op. */
void sfw_prefix_free(struct sfw_prefix *pc);

/* Opens a sequence for a prompt ids[0..n): a fork of the longest entry
 * whose tokens are ids[0..k) with k < n (*hit = k: the sequence is at
 * position k), or a new empty sequence (*hit = 0) when no entry matches or
 * the fork cannot be made even after evicting other entries. Errors as
 * sfw_batch_seq_open's (SFW_E_RANGE "all N sequences in use" once no entry
 * is left to evict). */
SFW_MUST_CHECK enum sfw_status sfw_prefix_open(struct sfw_prefix *pc, const int32_t *ids, int64_t n, int *seq,
					       int64_t *hit, struct sfw_err *err);

/* Keeps the state of open sequence seq, whose tokens are ids[0..n) (n =
 * its position), as an entry; then evicts the least recently used others
 * while the entries exceed the budget or the count. An entry of the same
 * tokens is refreshed instead. SFW_OK when kept (or n < min_tokens: nothing
 * to do); when the state alone is over the budget, or no slot or blocks are
 * left even with every other entry evicted, nothing is kept and the
 * failure says why (the caller may go on without it). */
SFW_MUST_CHECK enum sfw_status sfw_prefix_put(struct sfw_prefix *pc, int seq, const int32_t *ids, int64_t n,
					      struct sfw_err *err);

/* Evicts the least recently used entry: 1 when there was one. */
int sfw_prefix_evict(struct sfw_prefix *pc);

struct sfw_prefix_stats {
	int64_t entries, bytes;  /* now */
	int64_t lookups, hits;   /* sfw_prefix_open calls, and those that forked an entry */
	int64_t cached_tokens;   /* the hits' tokens together */
	int64_t puts, evictions; /* entries made; entries evicted (budget, count, or asked) */
};
void sfw_prefix_stats(const struct sfw_prefix *pc, struct sfw_prefix_stats *out);

#endif
