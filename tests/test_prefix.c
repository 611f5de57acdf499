/* modules: quant runner formats kernels num fetch verify core */
/* test_prefix.c - the prefix cache (runner/prefix.h) on the CPU, golden
 * tiny-sparse model (dense_len 512: past it the InfLLM-v2 selection runs):
 *   - exactness: a sequence opened from an entry made after a 600-token
 *     prompt (three calls of 200), then fed 40 more tokens and 6 greedy
 *     steps, gives every logit bit for bit as a sequence fed the same calls
 *     from the start; so does a second one from the same entry, and two
 *     from it stepped together in one batch;
 *   - a state kept in the middle of a prompt (after 400 of 600 tokens):
 *     the sequence it was kept from goes on unchanged, and one opened from
 *     it computes every logit as fed from the start;
 *   - matching: the longest entry that is a proper prefix is taken; a
 *     prompt equal to an entry, or diverging inside it, starts empty;
 *   - eviction: least recently used first (a match counts as a use) under
 *     the byte budget and the entry count; a state over the budget alone is
 *     refused; entries give up their slots and KV blocks when the batch
 *     needs them (sfw_prefix_open evicts rather than fail);
 *   - the counters (lookups, hits, cached tokens, entries, bytes, puts,
 *     evictions) say what happened;
 *   - sharing (paged): an entry made from a sequence opened from another
 *     shares its whole blocks and counts only what it adds; the bytes
 *     counted equal the pool's blocks in use (the backend's count of
 *     holders), and an eviction hands the shared blocks to the entry left. */
#include "check.h"
#include "lib/golden.h"
#include "runner/batch.h"
#include "runner/model.h"
#include "runner/prefix.h"
#include "runner/runner.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int V;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void rand_ids(int32_t *ids, int n)
{
	for (int i = 0; i < n; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (int32_t)(3 + (rng >> 33) % (uint64_t)(V - 11));
	}
}

static int32_t argmax(const float *l)
{
	int32_t b = 0;
	for (int i = 1; i < V; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* Feeds ids[from, to) to seq in calls of chunk tokens; the last call's
 * logits to out (may be NULL). */
static int feed(struct sfw_batch *b, int seq, const int32_t *ids, int from, int to, int chunk, float *out)
{
	struct sfw_err err = {0};
	for (int off = from; off < to; off += chunk) {
		int n = to - off < chunk ? to - off : chunk;
		struct sfw_batch_item it = {seq, ids + off, n, off + n == to && out, NULL, 0};
		if (sfw_batch_step(b, &it, 1, &err) != SFW_OK) {
			CHECK(0, "step at %d: %s", off, err.msg);
			return 0;
		}
		if (off + n == to && out)
			memcpy(out, sfw_batch_logits(b, 0), (size_t)V * sizeof(float));
	}
	return 1;
}

/* The logits of `steps` greedy decode steps after seq's last logits l
 * (overwritten), into out [steps, V]. */
static int greedy(struct sfw_batch *b, int seq, float *l, int steps, float *out)
{
	for (int i = 0; i < steps; i++) {
		int32_t id = argmax(l);
		if (!feed(b, seq, &id, 0, 1, 1, l))
			return 0;
		memcpy(out + (size_t)i * V, l, (size_t)V * sizeof(float));
	}
	return 1;
}

static struct sfw_batch *batch(struct sfw_model *m, int seqs, int64_t pool)
{
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = seqs, bp.pool_tokens = pool, bp.max_ctx = 2048;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_batch_new(m, &bp, &b, &err) == SFW_OK, "batch: %s", err.msg);
	return b;
}

static struct sfw_prefix *cache(struct sfw_batch *b, int64_t budget, int entries)
{
	struct sfw_prefix_params pp = {budget, entries, 0};
	struct sfw_prefix *pc = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_prefix_new(b, &pp, &pc, &err) == SFW_OK, "prefix cache: %s", err.msg);
	return pc;
}

#define STEPS 6
enum { P = 600, Q = 40 };

static void test_exact(struct sfw_model *m)
{
	struct sfw_batch *b = batch(m, 6, 16384);
	struct sfw_prefix *pc = b ? cache(b, (int64_t)1 << 40, 8) : NULL;
	int32_t ids[P + Q];
	rand_ids(ids, P + Q);
	float *l = malloc((size_t)V * 4), *ref = malloc((size_t)V * (STEPS + 1) * 4), *got = malloc((size_t)V * (STEPS + 1) * 4);
	struct sfw_err err = {0};
	int r = -1, a = -1, s1 = -1, s2 = -1;
	int64_t hit = -1;
	if (!pc || !l || !ref || !got)
		goto out;
	/* the reference: the same calls from the start */
	CHECK(sfw_batch_seq_open(b, &r, &err) == SFW_OK, "open: %s", err.msg);
	if (!feed(b, r, ids, 0, P, 200, NULL) || !feed(b, r, ids, P, P + Q, Q, ref) ||
	    !greedy(b, r, memcpy(l, ref, (size_t)V * 4), STEPS, ref + V))
		goto out;
	sfw_batch_seq_close(b, r);
	/* the prompt prefilled once and kept */
	CHECK(sfw_prefix_open(pc, ids, P, &a, &hit, &err) == SFW_OK && hit == 0, "a first prompt matches nothing (%lld)",
	      (long long)hit);
	if (a < 0 || !feed(b, a, ids, 0, P, 200, NULL))
		goto out;
	CHECK(sfw_prefix_put(pc, a, ids, P, &err) == SFW_OK, "put after the prompt: %s", err.msg);
	sfw_batch_seq_close(b, a);
	for (int k = 0; k < 2; k++) {
		int *s = k ? &s2 : &s1;
		CHECK(sfw_prefix_open(pc, ids, P + Q, s, &hit, &err) == SFW_OK && hit == P && sfw_batch_seq_pos(b, *s) == P,
		      "open %d of the longer prompt: the entry's %d tokens (hit %lld, pos %lld)", k, P, (long long)hit,
		      (long long)sfw_batch_seq_pos(b, *s));
		if (*s < 0 || !feed(b, *s, ids, P, P + Q, Q, got) || !greedy(b, *s, memcpy(l, got, (size_t)V * 4), STEPS, got + V))
			goto out;
		CHECK(!memcmp(got, ref, (size_t)V * (STEPS + 1) * 4),
		      "from the entry (%d): every logit of the rest of the prompt and %d greedy steps as fed from the start", k,
		      STEPS);
		sfw_batch_seq_close(b, *s);
	}
	/* two sequences from the entry in the same steps (a batch): each as the reference */
	int t[2] = {-1, -1};
	float *lt = malloc((size_t)V * 2 * 4);
	for (int k = 0; k < 2; k++)
		CHECK(sfw_prefix_open(pc, ids, P + Q, &t[k], &hit, &err) == SFW_OK && hit == P, "open %d for the batch", k);
	int same = lt != NULL && t[0] >= 0 && t[1] >= 0;
	for (int step = 0; same && step <= STEPS; step++) {
		struct sfw_batch_item it[2];
		int32_t next[2];
		for (int k = 0; k < 2; k++) {
			next[k] = step ? argmax(lt + (size_t)k * V) : 0;
			it[k] = (struct sfw_batch_item){t[k], step ? &next[k] : ids + P, step ? 1 : Q, 1, NULL, 0};
		}
		if (sfw_batch_step(b, it, 2, &err) != SFW_OK) {
			CHECK(0, "batch step %d: %s", step, err.msg);
			same = 0;
			break;
		}
		for (int k = 0; k < 2; k++) {
			memcpy(lt + (size_t)k * V, sfw_batch_logits(b, k), (size_t)V * 4);
			same &= !memcmp(lt + (size_t)k * V, ref + (size_t)step * V, (size_t)V * 4);
		}
	}
	CHECK(same, "two sequences from the entry stepped together: every logit as the reference");
	free(lt);
	sfw_batch_seq_close(b, t[0]), sfw_batch_seq_close(b, t[1]);
	/* a prompt equal to the entry, or diverging inside it: empty */
	int e = -1;
	CHECK(sfw_prefix_open(pc, ids, P, &e, &hit, &err) == SFW_OK && hit == 0 && sfw_batch_seq_pos(b, e) == 0,
	      "a prompt equal to the entry starts empty (its last logits are prefilled)");
	sfw_batch_seq_close(b, e);
	int32_t other[P + Q];
	memcpy(other, ids, sizeof(other));
	other[300] ^= 1;
	CHECK(sfw_prefix_open(pc, other, P + Q, &e, &hit, &err) == SFW_OK && hit == 0, "a prompt diverging at 300 starts empty");
	sfw_batch_seq_close(b, e);
	struct sfw_prefix_stats st;
	sfw_prefix_stats(pc, &st);
	CHECK(st.lookups == 7 && st.hits == 4 && st.cached_tokens == 4 * P && st.entries == 1 && st.puts == 1 &&
		      st.evictions == 0 && st.bytes == sfw_batch_seq_bytes(b, P),
	      "counters: lookups %lld hits %lld cached %lld entries %lld puts %lld evictions %lld bytes %lld",
	      (long long)st.lookups, (long long)st.hits, (long long)st.cached_tokens, (long long)st.entries,
	      (long long)st.puts, (long long)st.evictions, (long long)st.bytes);
out:
	free(l), free(ref), free(got);
	sfw_prefix_free(pc);
	sfw_batch_free(b);
}

/* A snapshot in the middle of a long prompt: a is fed the 600-token
 * prompt in calls of 200 and put after 400 (selection mode from 512 on),
 * then goes on; its logits at 600 are the reference's (the put changed
 * nothing of it), and a sequence opened from the entry at 400, fed the
 * same calls from there, gives the reference's logits and greedy steps
 * bit for bit (the entry shares a's whole blocks, which a no longer
 * writes, and holds its own copy of the partial one a wrote on). */
static void test_mid(struct sfw_model *m)
{
	enum { MID = 400 };
	struct sfw_batch *b = batch(m, 6, 16384);
	struct sfw_prefix *pc = b ? cache(b, (int64_t)1 << 40, 8) : NULL;
	int32_t ids[P + Q];
	rand_ids(ids, P + Q);
	size_t LB = (size_t)V * 4;
	float *l = malloc(LB), *ref = malloc(LB * (STEPS + 2)), *got = malloc(LB * (STEPS + 2));
	struct sfw_err err = {0};
	int r = -1, a = -1, s = -1;
	int64_t hit = -1;
	if (!pc || !l || !ref || !got)
		goto out;
	/* the reference: its logits at 600 in ref, then the rest as test_exact */
	CHECK(sfw_batch_seq_open(b, &r, &err) == SFW_OK, "open: %s", err.msg);
	if (!feed(b, r, ids, 0, P, 200, ref) || !feed(b, r, ids, P, P + Q, Q, ref + V) ||
	    !greedy(b, r, memcpy(l, ref + V, LB), STEPS, ref + 2 * V))
		goto out;
	sfw_batch_seq_close(b, r);
	CHECK(sfw_prefix_open(pc, ids, P, &a, &hit, &err) == SFW_OK && hit == 0, "a: a new prompt");
	if (a < 0 || !feed(b, a, ids, 0, MID, 200, NULL))
		goto out;
	CHECK(sfw_prefix_put(pc, a, ids, MID, &err) == SFW_OK, "put in the middle of the prompt: %s", err.msg);
	if (!feed(b, a, ids, MID, P, 200, got))
		goto out;
	CHECK(!memcmp(got, ref, LB), "a, going on after the put: its logits at %d are the reference's", P);
	sfw_batch_seq_close(b, a);
	CHECK(sfw_prefix_open(pc, ids, P + Q, &s, &hit, &err) == SFW_OK && hit == MID,
	      "a longer prompt opens from the state at %d (hit %lld)", MID, (long long)hit);
	if (s < 0 || !feed(b, s, ids, MID, P, 200, got) || !feed(b, s, ids, P, P + Q, Q, got + V) ||
	    !greedy(b, s, memcpy(l, got + V, LB), STEPS, got + 2 * V))
		goto out;
	CHECK(!memcmp(got, ref, LB * (STEPS + 2)),
	      "from the state at %d: the logits at %d, the rest of the prompt and %d greedy steps as fed from the start",
	      MID, P, STEPS);
	sfw_batch_seq_close(b, s);
out:
	free(l), free(ref), free(got);
	sfw_prefix_free(pc);
	sfw_batch_free(b);
}

/* Three prompts of 128 tokens (two blocks), each put; opens of each one
 * plus a token say which are still held. */
static int held(struct sfw_prefix *pc, struct sfw_batch *b, int32_t (*ids)[129], int i)
{
	struct sfw_err err = {0};
	int s = -1;
	int64_t hit = 0;
	if (sfw_prefix_open(pc, ids[i], 129, &s, &hit, &err) != SFW_OK)
		return -1;
	sfw_batch_seq_close(b, s);
	return hit == 128;
}

static int put_one(struct sfw_prefix *pc, struct sfw_batch *b, const int32_t *ids, struct sfw_err *err)
{
	int s = -1;
	int64_t hit = 0;
	enum sfw_status st = sfw_prefix_open(pc, ids, 128, &s, &hit, err);
	if (st == SFW_OK && feed(b, s, ids, 0, 128, 128, NULL))
		st = sfw_prefix_put(pc, s, ids, 128, err);
	sfw_batch_seq_close(b, s);
	return st == SFW_OK;
}

static void test_evict(struct sfw_model *m)
{
	int32_t ids[3][129];
	for (int i = 0; i < 3; i++)
		rand_ids(ids[i], 129);
	struct sfw_err err = {0};
	struct sfw_prefix_stats st;
	/* the budget: two such states */
	struct sfw_batch *b = batch(m, 8, 8192);
	if (!b)
		return;
	int64_t one = sfw_batch_seq_bytes(b, 128);
	struct sfw_prefix *pc = cache(b, 2 * one, 8);
	if (!pc) {
		sfw_batch_free(b);
		return;
	}
	CHECK(put_one(pc, b, ids[0], &err) && put_one(pc, b, ids[1], &err), "two puts: %s", err.msg);
	CHECK(held(pc, b, ids, 0) == 1, "the first is matched (and so most recently used)");
	CHECK(put_one(pc, b, ids[2], &err), "a third put: %s", err.msg);
	CHECK(held(pc, b, ids, 0) == 1 && held(pc, b, ids, 1) == 0 && held(pc, b, ids, 2) == 1,
	      "over the budget the least recently used (the second) went");
	sfw_prefix_stats(pc, &st);
	CHECK(st.entries == 2 && st.evictions == 1 && st.bytes == 2 * one, "entries %lld evictions %lld bytes %lld",
	      (long long)st.entries, (long long)st.evictions, (long long)st.bytes);
	/* a state over the budget alone: refused, nothing changed */
	int s = -1;
	int64_t hit = 0;
	struct sfw_prefix *tiny = cache(b, one - 1, 8);
	if (tiny && sfw_prefix_open(tiny, ids[0], 128, &s, &hit, &err) == SFW_OK && feed(b, s, ids[0], 0, 128, 128, NULL)) {
		CHECK(sfw_prefix_put(tiny, s, ids[0], 128, &err) == SFW_E_NOSPACE && strstr(err.msg, "over the prefix cache"),
		      "a state over the budget alone is refused: %s", err.msg);
		sfw_prefix_stats(tiny, &st);
		CHECK(st.entries == 0 && st.bytes == 0, "and nothing is kept");
		sfw_batch_seq_close(b, s);
	}
	sfw_prefix_free(tiny);
	sfw_prefix_free(pc);
	/* the count: one entry at most */
	pc = cache(b, (int64_t)1 << 40, 1);
	CHECK(pc && put_one(pc, b, ids[0], &err) && put_one(pc, b, ids[1], &err), "puts: %s", err.msg);
	CHECK(pc && held(pc, b, ids, 0) == 0 && held(pc, b, ids, 1) == 1, "one entry at most: the newest");
	sfw_prefix_free(pc);
	sfw_batch_free(b);
	/* the batch's needs first: 3 slots and a pool of 6 blocks. Two
	 * entries hold two slots and 4 blocks; a sequence of 4 blocks beside a
	 * third slot's open sequence makes them go */
	b = batch(m, 3, 6 * 64);
	pc = b ? cache(b, (int64_t)1 << 40, 8) : NULL;
	if (!pc) {
		sfw_batch_free(b);
		return;
	}
	CHECK(put_one(pc, b, ids[0], &err) && put_one(pc, b, ids[1], &err), "two entries: %s", err.msg);
	int x = -1, y = -1;
	CHECK(sfw_prefix_open(pc, ids[2], 129, &x, &hit, &err) == SFW_OK && hit == 0, "a third sequence (the last slot)");
	CHECK(sfw_prefix_open(pc, ids[2], 129, &y, &hit, &err) == SFW_OK && y >= 0,
	      "a fourth one: an entry gave up its slot (%s)", err.msg);
	sfw_prefix_stats(pc, &st);
	CHECK(st.entries == 1 && st.evictions == 1, "one entry left (%lld), one evicted (%lld)", (long long)st.entries,
	      (long long)st.evictions);
	sfw_batch_seq_close(b, y);
	CHECK(feed(b, x, ids[2], 0, 128, 128, NULL), "x prefills 2 blocks");
	int z = -1;
	/* a fork of the remaining entry needs 2 more blocks: 2 + 2 + 2 = 6, fits */
	CHECK(sfw_prefix_open(pc, ids[1], 129, &z, &hit, &err) == SFW_OK && hit == 128, "the entry's fork fits");
	sfw_batch_seq_close(b, z);
	sfw_batch_seq_close(b, x);
	sfw_prefix_free(pc);
	sfw_batch_free(b);
}

/* Paged, entries share blocks by reference: E1 holds a 300-token prompt A
 * (5 blocks, prefilled in 2 calls); B, A and 100 more, opens from E1 (sharing its 4 whole
 * blocks), prefills the rest and is put as E2, which shares those 4 and
 * B's own 2 whole ones and copies its partial last. The cache counts each
 * block once, what the pool's holders say (the backend counts them): with
 * B closed, 8 blocks for both entries, so a budget of 2 states and 8
 * blocks keeps both (copies would need 12). A prompt extending B from E2
 * gives the logits of the same calls from the start bit for bit. Evicting
 * E1 leaves its 4 blocks to E2, which now counts all its 7. */
static void test_shared(struct sfw_model *m)
{
	enum { A = 300, B = 400 };
	int32_t ids[B + 1];
	rand_ids(ids, B + 1);
	struct sfw_err err = {0};
	struct sfw_prefix_stats st;
	struct sfw_batch *b = batch(m, 8, 64 * 64);
	CHECK(!b || sfw_batch_paged(b), "tiny-sparse's KV blocks are paged on the CPU");
	if (!b || !sfw_batch_paged(b)) {
		sfw_batch_free(b);
		return;
	}
	int64_t fixed = sfw_batch_seq_bytes(b, 0), bb = sfw_batch_seq_bytes(b, 1) - fixed;
	/* paged, the compressed keys live in the blocks (shared with them):
	 * a state's fixed part is its Lightning states alone, a block's bytes
	 * its K/V and compressed keys (from the config, fp32 on the CPU) */
	const struct sfw_config *cf = sfw_model_config(m);
	int64_t ns = 0, nl = 0, kvd = (int64_t)cf->num_key_value_heads * cf->head_dim, blk = cf->sparse_block_size,
		st1 = cf->sparse_kernel_stride;
	for (int i = 0; i < cf->num_hidden_layers; i++)
		cf->mixer[i] == SFW_MIXER_SPARSE ? ns++ : nl++;
	CHECK(fixed == nl * cf->lightning_nh * cf->lightning_head_dim * cf->lightning_head_dim * 4 &&
		      bb == ns * (2 * blk + blk / st1 + blk / (4 * st1)) * kvd * 4,
	      "paged: no compressed keys outside the blocks (fixed %lld, block %lld bytes)", (long long)fixed,
	      (long long)bb);
	struct sfw_prefix *pc = cache(b, 2 * fixed + 8 * bb, 8);
	int s = -1, t = -1;
	int64_t hit = -1;
	int ok = pc && sfw_prefix_open(pc, ids, A, &s, &hit, &err) == SFW_OK && hit == 0 && feed(b, s, ids, 0, A, 150, NULL) &&
		 sfw_prefix_put(pc, s, ids, A, &err) == SFW_OK;
	sfw_batch_seq_close(b, s);
	if (pc)
		sfw_prefix_stats(pc, &st);
	CHECK(ok && sfw_batch_blocks_used(b) == 5 && st.bytes == fixed + 5 * bb,
	      "E1: 5 blocks in the pool, counted once (%lld bytes): %s", ok ? (long long)st.bytes : -1LL, err.msg);
	ok = ok && sfw_prefix_open(pc, ids, B, &s, &hit, &err) == SFW_OK && hit == A;
	CHECK(ok && sfw_batch_blocks_used(b) == 6, "B opens from E1: its 4 whole blocks shared, 1 copied (%lld in use)",
	      (long long)sfw_batch_blocks_used(b));
	ok = ok && feed(b, s, ids, A, B, 100, NULL) && sfw_prefix_put(pc, s, ids, B, &err) == SFW_OK;
	sfw_batch_seq_close(b, s);
	if (pc)
		sfw_prefix_stats(pc, &st);
	CHECK(ok && st.entries == 2 && st.evictions == 0 && sfw_batch_blocks_used(b) == 8 &&
		  st.bytes == 2 * fixed + sfw_batch_blocks_used(b) * bb,
	      "E2 put, B closed: both entries kept in 2 states and 8 blocks, the pool's count (%lld blocks, %lld bytes): %s",
	      (long long)sfw_batch_blocks_used(b), ok ? (long long)st.bytes : -1LL, err.msg);
	/* B and one token from E2 against the same calls from the start */
	float *l1 = malloc((size_t)V * sizeof(float)), *l2 = malloc((size_t)V * sizeof(float));
	ok = ok && l1 && l2 && sfw_prefix_open(pc, ids, B + 1, &s, &hit, &err) == SFW_OK && hit == B &&
	     feed(b, s, ids, B, B + 1, 1, l1) && sfw_batch_seq_open(b, &t, &err) == SFW_OK &&
	     feed(b, t, ids, 0, A, 150, NULL) && feed(b, t, ids, A, B, 100, NULL) && feed(b, t, ids, B, B + 1, 1, l2);
	CHECK(ok && !memcmp(l1, l2, (size_t)V * sizeof(float)),
	      "a prompt extending B, from E2 (blocks of E1, B and its own): the logits of the calls from the start, bit for bit: %s",
	      err.msg);
	free(l1), free(l2);
	sfw_batch_seq_close(b, s);
	sfw_batch_seq_close(b, t);
	ok = ok && sfw_prefix_evict(pc);
	if (pc)
		sfw_prefix_stats(pc, &st);
	CHECK(ok && st.entries == 1 && sfw_batch_blocks_used(b) == 7 && st.bytes == fixed + 7 * bb,
	      "E1 (least recently used) evicted: E2 keeps its 4 blocks and counts its 7 (%lld in use, %lld bytes)",
	      (long long)sfw_batch_blocks_used(b), ok ? (long long)st.bytes : -1LL);
	ok = ok && sfw_prefix_evict(pc);
	if (pc)
		sfw_prefix_stats(pc, &st);
	CHECK(ok && st.entries == 0 && st.bytes == 0 && sfw_batch_blocks_used(b) == 0, "E2 evicted: every block back");
	sfw_prefix_free(pc);
	sfw_batch_free(b);
}

int main(void)
{
	struct sfw_model *m = check_golden_model("tiny-sparse", 2);
	if (!m)
		return CHECK_REPORT("test_prefix");
	V = sfw_model_config(m)->vocab_size;
	CHECK(sfw_model_config(m)->sparse_dense_len < P, "the prompt is past dense_len: the selection runs");
	test_exact(m);
	test_mid(m);
	test_evict(m);
	test_shared(m);
	sfw_model_free(m);
	return CHECK_REPORT("test_prefix");
}
