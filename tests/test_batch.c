/* modules: quant runner formats kernels num fetch verify core */
/* test_batch.c - batched decode (runner/batch.h) on the CPU against the same
 * sequences run alone, each on a context of its own (runner/runner.h) fed the
 * same calls: every logit bit for bit and the greedy tokens, on the golden
 * tiny models (../shared/golden):
 *   - B = 1, 2, 5, 16 sequences of different lengths (short, past one 64-token
 *     block, past tiny-sparse's dense_len 512 so the InfLLM-v2 path runs),
 *     prompts prefilled in chunks, one chunk per step, mixed into the other
 *     sequences' decode rows;
 *   - joining and leaving in the middle of a run: more sequences than slots,
 *     each closed when done and its slot reused by a later one;
 *   - the KV pool: a step that needs more blocks than are free fails with
 *     SFW_E_NOSPACE "KV pool full" and changes nothing; the other sequences
 *     go on with the right logits; the failed one goes on once a closed
 *     sequence has given its blocks back;
 *   - 64 sequences decoding in one step;
 *   - forks (sfw_batch_seq_fork): a sequence forked mid-prompt and after it
 *     (in selection mode: past dense_len, or dense_as_sparse), the forks fed
 *     its tokens or tokens of their own, each bit for bit as its run alone,
 *     the source too; refusals (not open, no slot, no blocks, no cache copy)
 *     change nothing;
 *   - refusals: an unknown or repeated sequence, a bad id, a step over
 *     max_ctx, all slots in use;
 *   - both KV modes: paged (the CPU backend's pool, its blocks mapped into
 *     each sequence's range: the join/leave run reuses every block many
 *     times through a pool just big enough) and, with the backend's pool_new
 *     taken away, per-sequence caches under the same budget (CUDA's mode:
 *     a closed sequence's cache parked and reused by its slot's next one,
 *     freed first when a step needs its blocks);
 *   - an int8 (W8A16) model, tiny-sparse quantized here (RTN, group 128 and
 *     per channel): B = 1, 3, 8 and join/leave, bit for bit as alone (the
 *     int8 linears sum a row the same way whatever M, kernels/matmul_w8.c). */
#include "check.h"
#include "lib/golden.h"
#include "lib/rng.h"
#include "alloc.h"
#include "runner/batch.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;
static int32_t rand_id(int V)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (int32_t)(3 + (rng_state >> 33) % (uint64_t)(V - 11));
}

static int32_t argmax(const float *l, int V)
{
	int32_t b = 0;
	for (int i = 1; i < V; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* One sequence of a schedule: a prompt prefilled in chunks, then greedy
 * decode steps; the calls in order are chunk 0..C-1, then steps. */
struct sq {
	int len, chunk, steps;
	int32_t *prompt;
	int ncalls;
	float *ref;       /* [ncalls, V]: logits alone */
	int32_t *ref_tok; /* [steps]: the greedy chain alone (fed tokens) */
	/* batch run */
	int slot, call, off, done, started;
	int64_t pos;
	int32_t next;
	int bad_logits, bad_tok;
};

static int call_n(const struct sq *q, int call, int off)
{
	(void)call;
	if (off < q->len)
		return q->len - off < q->chunk ? q->len - off : q->chunk;
	return 1;
}

static int sq_init(struct sq *q, int len, int chunk, int steps, int V, uint64_t seed)
{
	memset(q, 0, sizeof(*q));
	q->len = len, q->chunk = chunk, q->steps = steps;
	q->ncalls = (len + chunk - 1) / chunk + steps;
	q->prompt = malloc(sizeof(int32_t) * (size_t)len);
	q->ref = malloc(sizeof(float) * (size_t)q->ncalls * V);
	q->ref_tok = malloc(sizeof(int32_t) * (size_t)(steps ? steps : 1));
	if (!q->prompt || !q->ref || !q->ref_tok)
		return -1;
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	q->prompt[0] = 1;
	for (int i = 1; i < len; i++)
		q->prompt[i] = rand_id(V);
	q->slot = -1;
	return 0;
}

static void sq_free(struct sq *q)
{
	free(q->prompt), free(q->ref), free(q->ref_tok);
}

/* 1: the runs alone (and the fork tests' batches) use InfLLM-v2 at every
 * length (dense_as_sparse) */
static int alone_sparse;

/* The sequence alone on a fresh context: the same calls, logits kept. */
static int sq_alone(struct sfw_model *m, struct sq *q)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	cp.prefill_chunk = 256;
	cp.dense_as_sparse = alone_sparse;
	struct sfw_ctx *c = NULL;
	struct sfw_err err = {0};
	if (sfw_ctx_new(m, &cp, &c, &err) != SFW_OK) {
		CHECK(0, "context: %s", err.msg);
		return -1;
	}
	int off = 0, call = 0;
	for (; off < q->len; call++) {
		int n = call_n(q, call, off);
		if (sfw_ctx_prefill(c, q->prompt + off, (size_t)n, q->ref + (size_t)call * V, &err) != SFW_OK) {
			CHECK(0, "alone prefill: %s", err.msg);
			sfw_ctx_free(c);
			return -1;
		}
		off += n;
	}
	for (int s = 0; s < q->steps; s++, call++) {
		q->ref_tok[s] = argmax(q->ref + (size_t)(call - 1) * V, V);
		if (sfw_ctx_decode(c, q->ref_tok[s], q->ref + (size_t)call * V, &err) != SFW_OK) {
			CHECK(0, "alone decode: %s", err.msg);
			sfw_ctx_free(c);
			return -1;
		}
	}
	sfw_ctx_free(c);
	return 0;
}

/* The item for q's next call (its chunk or its greedy token). */
static void sq_item(struct sq *q, struct sfw_batch_item *it)
{
	it->seq = q->slot;
	it->want_logits = 1;
	it->sample = NULL, it->u = 0;
	if (q->off < q->len) {
		it->ids = q->prompt + q->off;
		it->n = call_n(q, q->call, q->off);
	} else {
		it->ids = &q->next;
		it->n = 1;
	}
}

/* After a step: compare its logits with the run alone, choose the next token. */
static void sq_after(struct sq *q, const struct sfw_batch_item *it, const float *logits, int V)
{
	if (!logits || memcmp(logits, q->ref + (size_t)q->call * V, sizeof(float) * (size_t)V) != 0)
		q->bad_logits++;
	if (q->off >= q->len) {
		int s = q->call - (q->ncalls - q->steps);
		if (q->next != q->ref_tok[s])
			q->bad_tok++;
	}
	if (q->off < q->len)
		q->off += it->n;
	q->pos += it->n;
	q->call++;
	if (logits)
		q->next = argmax(logits, V);
	if (q->call == q->ncalls)
		q->done = 1;
}

struct sched_stats {
	int steps, mixed, max_items, reused, failed;
};

/* Runs nq sequences through a batch of max_seqs slots: sequence i becomes
 * ready at step i * gap; a ready sequence gets a slot when one is free; each
 * step carries every open sequence that is decoding plus at most `prefills`
 * prefill chunks; a finished sequence is closed at once. */
static void run_schedule(struct sfw_model *m, struct sq *qs, int nq, int max_seqs, int gap, int prefills,
			 int64_t pool_tokens, struct sched_stats *st)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = max_seqs;
	bp.pool_tokens = pool_tokens;
	bp.max_ctx = 4096;
	bp.max_step_rows = prefills * 256 + max_seqs;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	memset(st, 0, sizeof(*st));
	if (sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "batch: %s", err.msg);
		return;
	}
	CHECK(sfw_batch_paged(b) == m->be->supports_op(m->be, SFW_OP_POOL, SFW_DTYPE_F32), "paged KV exactly when the backend has a pool");
	int used_slot[SFW_BATCH_MAX_SEQS] = {0};
	struct sfw_batch_item items[SFW_BATCH_MAX_SEQS];
	struct sq *owner[SFW_BATCH_MAX_SEQS];
	for (int step = 0; step < 100000; step++) {
		int left = 0;
		for (int i = 0; i < nq; i++) {
			struct sq *q = &qs[i];
			left += !q->done;
			if (!q->started && !q->done && step >= i * gap) {
				int slot;
				if (sfw_batch_seq_open(b, &slot, &err) != SFW_OK)
					continue; /* all in use: waits */
				CHECK(sfw_batch_seq_pos(b, slot) == 0, "a new sequence starts empty");
				st->reused += used_slot[slot]++ > 0;
				q->slot = slot, q->started = 1;
			}
		}
		if (!left)
			break;
		int n = 0, prefill = 0, decode = 0;
		for (int i = 0; i < nq; i++) {
			struct sq *q = &qs[i];
			if (!q->started || q->done)
				continue;
			int pre = q->off < q->len;
			if (pre && prefill == prefills)
				continue;
			prefill += pre, decode += !pre;
			sq_item(q, &items[n]);
			owner[n++] = q;
		}
		if (!n)
			continue;
		if (sfw_batch_step(b, items, n, &err) != SFW_OK) {
			CHECK(0, "step %d (%d items): %s", step, n, err.msg);
			st->failed++;
			break;
		}
		st->steps++;
		st->mixed += prefill && decode;
		st->max_items = n > st->max_items ? n : st->max_items;
		for (int i = 0; i < n; i++) {
			struct sq *q = owner[i];
			CHECK(sfw_batch_seq_pos(b, q->slot) == q->pos + items[i].n, "position after a step");
			sq_after(q, &items[i], sfw_batch_logits(b, i), V);
			if (q->done) {
				sfw_batch_seq_close(b, q->slot);
				CHECK(sfw_batch_seq_pos(b, q->slot) == -1, "a closed sequence has no position");
			}
		}
	}
	CHECK(sfw_batch_blocks_used(b) == 0, "every block back in the pool at the end (%lld)",
	      (long long)sfw_batch_blocks_used(b));
	sfw_batch_free(b);
}

/* Counts the caches the backend makes (per-sequence mode: a closed
 * sequence's cache is parked and reused, not made again). */
static enum sfw_status (*real_cache_new)(struct sfw_backend *, const struct sfw_cache_desc *, struct sfw_bcache **,
					 struct sfw_err *);
static int n_cache_new, sched_caches; /* all; those the last check_sched's batch made */
static enum sfw_status counting_cache_new(struct sfw_backend *be, const struct sfw_cache_desc *d,
					  struct sfw_bcache **out, struct sfw_err *err)
{
	n_cache_new++;
	return real_cache_new(be, d, out, err);
}

static void check_sched(struct sfw_model *m, const char *what, const int *lens, const int *chunks, int nq,
			int steps, int max_seqs, int gap, int prefills, int expect_reuse, int64_t pool_tokens)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sq *qs = calloc((size_t)nq, sizeof(*qs));
	int ok = qs != NULL;
	for (int i = 0; ok && i < nq; i++)
		ok = sq_init(&qs[i], lens[i], chunks[i % 3], steps, V, (uint64_t)i + 77) == 0 && sq_alone(m, &qs[i]) == 0;
	CHECK(ok, "%s: references alone", what);
	if (ok) {
		struct sched_stats st;
		int before = n_cache_new;
		run_schedule(m, qs, nq, max_seqs, gap, prefills, pool_tokens, &st);
		sched_caches = n_cache_new - before;
		int bl = 0, bt = 0, done = 0;
		for (int i = 0; i < nq; i++)
			bl += qs[i].bad_logits, bt += qs[i].bad_tok, done += qs[i].done;
		CHECK(done == nq && !st.failed, "%s: every sequence ran to the end (%d of %d)", what, done, nq);
		CHECK(bl == 0, "%s: logits bit-identical to the runs alone (%d calls differ)", what, bl);
		CHECK(bt == 0, "%s: greedy tokens identical (%d differ)", what, bt);
		CHECK(nq == 1 || prefills > 1 || st.mixed > 0, "%s: some step mixed a prefill chunk with decode rows (%d)", what, st.mixed);
		CHECK(st.max_items == (nq < max_seqs ? nq : max_seqs) || gap > 0,
		      "%s: a step carried every sequence (%d)", what, st.max_items);
		CHECK(!expect_reuse || st.reused > 0, "%s: closed slots reused by later sequences (%d)", what, st.reused);
		printf("  %s: %d sequences, %d steps, %d mixed, at most %d items\n", what, nq, st.steps, st.mixed,
		       st.max_items);
	}
	for (int i = 0; qs && i < nq; i++)
		sq_free(&qs[i]);
	free(qs);
}

static void test_sizes(struct sfw_model *m)
{
	static const int chunks[3] = {64, 100, 256};
	static const int lens[16] = {5, 700, 130, 64, 1, 33, 520, 90, 200, 17, 65, 300, 8, 129, 45, 600};
	/* enough decode steps that the first sequence still decodes when the
	 * last one's prompt is in (one prefill chunk per step) */
	int64_t big = 1 << 14;
	check_sched(m, "B=1", lens + 1, chunks + 1, 1, 6, 1, 0, 1, 0, big);
	check_sched(m, "B=2", lens, chunks, 2, 12, 2, 0, 1, 0, big);
	check_sched(m, "B=5", lens + 2, chunks, 5, 16, 5, 0, 1, 0, big);
	check_sched(m, "B=16", lens, chunks, 16, 48, 16, 0, 1, 0, big);
	/* join and leave: 9 sequences through 4 slots, arriving one by one; the
	 * pool holds 4 of the longest (520 + 12 tokens: 9 blocks), so blocks
	 * freed by one sequence serve the next */
	check_sched(m, "join/leave", lens + 3, chunks, 9, 12, 4, 3, 1, 1, 4 * 9 * 64);
}

/* 64 sequences at once: 64 prompts of one chunk each in the first step,
 * then every decode step one row each. */
static void test_64(struct sfw_model *m)
{
	static const int chunks[3] = {64, 64, 64};
	int lens[64];
	for (int i = 0; i < 64; i++)
		lens[i] = 1 + (i * 37) % 64;
	check_sched(m, "B=64", lens, chunks, 64, 4, 64, 0, 64, 0, 64 * 2 * 64);
}

static int step1(struct sfw_batch *b, int seq, const int32_t *ids, int n, struct sfw_err *err)
{
	struct sfw_batch_item it = {seq, ids, n, 1, NULL, 0};
	return sfw_batch_step(b, &it, 1, err) == SFW_OK;
}

/* A pool of 6 blocks: A takes 3, B takes 2; B's chunk that needs 2 more is
 * refused (nothing moves), A goes on decoding exactly as alone; once A is
 * closed, B's chunk goes through and B continues exactly as alone. */
static void test_pool(struct sfw_model *m)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sq A, B;
	/* A: a 150-token prompt (3 blocks) and 20 steps; B: 300 in chunks of 100, 10 steps */
	if (sq_init(&A, 150, 150, 20, V, 5) || sq_init(&B, 300, 100, 10, V, 6) || sq_alone(m, &A) || sq_alone(m, &B)) {
		CHECK(0, "pool: references");
		return;
	}
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 2, bp.pool_tokens = 6 * 64 + 10, bp.max_ctx = 4096;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_batch_new(m, &bp, &b, &err) == SFW_OK, "pool batch: %s", err.msg);
	if (!b)
		return;
	CHECK(sfw_batch_paged(b) == m->be->supports_op(m->be, SFW_OP_POOL, SFW_DTYPE_F32), "pool test: paged as the backend allows");
	CHECK(sfw_batch_blocks_total(b) == 6, "a pool of %lld tokens is 6 blocks", (long long)bp.pool_tokens);
	CHECK(sfw_batch_seq_open(b, &A.slot, &err) == SFW_OK && sfw_batch_seq_open(b, &B.slot, &err) == SFW_OK,
	      "two sequences");
	int extra = -1;
	CHECK(sfw_batch_seq_open(b, &extra, &err) == SFW_E_RANGE && strstr(err.msg, "all 2 sequences in use"),
	      "a third is refused: %s", err.msg);
	struct sfw_batch_item it[2];
	/* A's prompt (3 blocks) with B's first chunk (2 blocks) */
	sq_item(&A, &it[0]);
	sq_item(&B, &it[1]);
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_OK, "A's prompt and B's first chunk: %s", err.msg);
	sq_after(&A, &it[0], sfw_batch_logits(b, 0), V);
	sq_after(&B, &it[1], sfw_batch_logits(b, 1), V);
	CHECK(sfw_batch_blocks_used(b) == 5, "5 blocks in use (%lld)", (long long)sfw_batch_blocks_used(b));
	/* B's second chunk (tokens 100..199: blocks 2 and 3) needs 2, 1 is free */
	int refused = 0;
	for (int s = 0; s < A.steps; s++) {
		sq_item(&A, &it[0]);
		sq_item(&B, &it[1]);
		enum sfw_status st = sfw_batch_step(b, it, 2, &err);
		if (s == 0) {
			CHECK(st == SFW_E_NOSPACE && strstr(err.msg, "KV pool full: 5 of 6 blocks in use"),
			      "B's chunk refused: %s", err.msg);
			CHECK(sfw_batch_seq_pos(b, A.slot) == 150 && sfw_batch_seq_pos(b, B.slot) == 100,
			      "a refused step moved nothing");
			CHECK(sfw_batch_logits(b, 0) == NULL, "no logits after a refused step");
		}
		refused += st == SFW_E_NOSPACE;
		/* A alone in the step: its decode row fits in its 3rd block */
		CHECK(sfw_batch_step(b, it, 1, &err) == SFW_OK, "A decodes while B waits: %s", err.msg);
		sq_after(&A, &it[0], sfw_batch_logits(b, 0), V);
	}
	CHECK(refused == A.steps, "B refused while A holds its blocks (%d of %d)", refused, A.steps);
	CHECK(A.done && A.bad_logits == 0 && A.bad_tok == 0, "A bit-identical to alone beside the full pool (%d, %d)",
	      A.bad_logits, A.bad_tok);
	sfw_batch_seq_close(b, A.slot);
	CHECK(sfw_batch_blocks_used(b) == 2, "A's blocks back at once (%lld in use)", (long long)sfw_batch_blocks_used(b));
	while (!B.done) {
		sq_item(&B, &it[0]);
		if (!step1(b, B.slot, it[0].ids, it[0].n, &err)) {
			CHECK(0, "B after A closed: %s", err.msg);
			break;
		}
		sq_after(&B, &it[0], sfw_batch_logits(b, 0), V);
	}
	CHECK(B.done && B.bad_logits == 0 && B.bad_tok == 0, "B bit-identical to alone after the refusals (%d, %d)",
	      B.bad_logits, B.bad_tok);
	/* B now holds 5 blocks (310 tokens): a new sequence gets A's slot and
	 * one block; a second block is refused */
	int c;
	CHECK(sfw_batch_seq_open(b, &c, &err) == SFW_OK && sfw_batch_seq_pos(b, c) == 0, "a new sequence in A's slot");
	int32_t ids[70];
	for (int i = 0; i < 70; i++)
		ids[i] = 5 + i;
	CHECK(step1(b, c, ids, 64, &err), "its first block: %s", err.msg);
	CHECK(!step1(b, c, ids, 1, &err) && strstr(err.msg, "KV pool full: 6 of 6 blocks in use"),
	      "the pool is full again: %s", err.msg);
	sfw_batch_free(b);
	sq_free(&A), sq_free(&B);
}

static void test_refusals(struct sfw_model *m)
{
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 3, bp.max_ctx = 100;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	bp.max_seqs = 65;
	CHECK(sfw_batch_new(m, &bp, &b, &err) == SFW_E_INVAL && !b, "65 sequences refused: %s", err.msg);
	bp.max_seqs = 3;
	if (sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "batch: %s", err.msg);
		return;
	}
	int s0, s1;
	CHECK(sfw_batch_seq_open(b, &s0, &err) == SFW_OK && sfw_batch_seq_open(b, &s1, &err) == SFW_OK, "open");
	int32_t ids[120] = {1};
	struct sfw_batch_item it[2] = {{s0, ids, 1, 1, NULL, 0}, {s0, ids, 1, 1, NULL, 0}};
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_E_INVAL && strstr(err.msg, "twice"), "a repeated sequence: %s",
	      err.msg);
	it[1].seq = 2;
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_E_INVAL && strstr(err.msg, "not open"), "a closed slot: %s",
	      err.msg);
	it[1].seq = s1;
	ids[0] = sfw_model_config(m)->vocab_size;
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_E_INVAL && strstr(err.msg, "outside the vocabulary"), "a bad id: %s",
	      err.msg);
	ids[0] = 1;
	it[1].n = 101;
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_E_RANGE && strstr(err.msg, "exceed its context"),
	      "past max_ctx: %s", err.msg);
	CHECK(sfw_batch_seq_pos(b, s0) == 0 && sfw_batch_seq_pos(b, s1) == 0, "refusals moved nothing");
	it[1].n = 100;
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_OK, "then the step runs: %s", err.msg);
	CHECK(sfw_batch_seq_pos(b, s0) == 1 && sfw_batch_seq_pos(b, s1) == 100, "positions 1 and 100");
	CHECK(sfw_batch_logits(b, 0) && sfw_batch_logits(b, 1) && !sfw_batch_logits(b, 2), "logits per item");
	sfw_batch_free(b);
}

/* The next token chosen in the step (sfw_batch_item.sample): three
 * sequences with three samplers; in one batch every step also brings the
 * logits to the host, in a second batch fed the same ids none does. Each
 * choice equals sfw_op_sample_cpu on the logits of the first batch, and the
 * second batch chooses the same tokens without them. Bad parameters are
 * refused before anything moves. */
static void test_sample(struct sfw_model *m)
{
	int V = sfw_model_config(m)->vocab_size;
	static const struct sfw_op_sample_params sp[3] = {
	    {.temperature = 0, .top_k = 0, .top_p = 1, .greedy = 1},
	    {.temperature = 0.8f, .top_k = 40, .top_p = 1, .greedy = 0},
	    {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .greedy = 0}};
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 3, bp.max_ctx = 512;
	struct sfw_batch *b[2] = {NULL, NULL};
	struct sfw_err err = {0};
	int seq[2][3], ok = 1;
	for (int k = 0; k < 2; k++) {
		ok &= sfw_batch_new(m, &bp, &b[k], &err) == SFW_OK;
		for (int i = 0; ok && i < 3; i++)
			ok &= sfw_batch_seq_open(b[k], &seq[k][i], &err) == SFW_OK;
	}
	CHECK(ok, "sample: two batches of three: %s", err.msg);
	int32_t prompt[3][20], cur[3][20];
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 20; j++)
			prompt[i][j] = 2 + (17 * i + 5 * j) % (V - 2);
	int agree = 0, total = 0, same = 0, nolog = 0;
	uint64_t rng = 99;
	for (int step = 0; ok && step < 12; step++) {
		struct sfw_batch_item it[2][3];
		for (int i = 0; i < 3; i++) {
			double u = sfwt_unit(&rng);
			for (int k = 0; k < 2; k++)
				it[k][i] = (struct sfw_batch_item){seq[k][i], step ? cur[i] : prompt[i], step ? 1 : 20,
								    k == 0, &sp[i], u};
		}
		for (int k = 0; k < 2 && ok; k++)
			ok = sfw_batch_step(b[k], it[k], 3, &err) == SFW_OK;
		if (!ok)
			break;
		for (int i = 0; i < 3; i++) {
			const float *l = sfw_batch_logits(b[0], i);
			int32_t id = sfw_batch_next(b[0], i), id2 = sfw_batch_next(b[1], i);
			agree += l && id == sfw_op_sample_cpu(NULL, l, V, &sp[i], it[0][i].u);
			same += id == id2;
			nolog += sfw_batch_logits(b[1], i) == NULL;
			total++;
			cur[i][0] = id;
		}
	}
	CHECK(ok, "sample: every step ran: %s", err.msg);
	CHECK(total == 36 && agree == total, "sample: %d of %d choices equal sfw_op_sample_cpu on the step's logits",
	      agree, total);
	CHECK(same == total && nolog == total, "sample: without host logits the same %d of %d choices (%d without logits)",
	      same, total, nolog);
	if (ok) {
		struct sfw_op_sample_params bad = {
		    .temperature = 0.8f, .top_k = 0, .top_p = 1.5f, .greedy = 0};
		struct sfw_batch_item it = {seq[1][0], cur[0], 1, 0, &bad, 0.5};
		int64_t pos = sfw_batch_seq_pos(b[1], seq[1][0]);
		CHECK(sfw_batch_step(b[1], &it, 1, &err) == SFW_E_INVAL && strstr(err.msg, "sampling") &&
			  sfw_batch_seq_pos(b[1], seq[1][0]) == pos,
		      "top_p 1.5 refused, nothing moved: %s", err.msg);
		it.sample = &sp[1], it.u = 1.0;
		CHECK(sfw_batch_step(b[1], &it, 1, &err) == SFW_E_INVAL, "u = 1 refused: %s", err.msg);
		it.sample = NULL;
		CHECK(sfw_batch_step(b[1], &it, 1, &err) == SFW_OK && sfw_batch_next(b[1], 0) == -1 &&
			  !sfw_batch_logits(b[1], 0),
		      "neither logits nor a choice asked: none given: %s", err.msg);
	}
	sfw_batch_free(b[0]);
	sfw_batch_free(b[1]);
}

/* int8 weights: decode rows batched 3 and 8 at a time take other M than the
 * same rows alone (M = 1), and a prefill chunk shares its call with decode
 * rows; the logits must not change by a bit. */
static void test_w8(const char *golden)
{
	char tmpl[4096], in[4200], out[4200];
	const char *td = getenv("TMPDIR");
	snprintf(tmpl, sizeof(tmpl), "%s/sfw-batch-w8.XXXXXX", td && *td ? td : "/tmp");
	const char *tmp = mkdtemp(tmpl);
	CHECK(tmp != NULL, "a scratch directory");
	if (!tmp)
		return;
	static const int groups[2] = {128, SFW_QL_GROUP_CHANNEL};
	for (int gi = 0; gi < 2; gi++) {
		snprintf(in, sizeof(in), "%s/tiny-sparse", golden);
		snprintf(out, sizeof(out), "%s/q%d", tmp, gi);
		struct sfw_quant_params qp = sfw_quant_default_params();
		qp.method = SFW_QUANT_RTN;
		qp.group_size = groups[gi];
		qp.threads = 2;
		struct sfw_err err = {0};
		if (sfw_quant_run(in, out, &qp, &err) != SFW_OK) {
			CHECK(0, "quantize tiny-sparse: %s", err.msg);
			continue;
		}
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		mp.threads = 2;
		struct sfw_model *m = NULL;
		if (sfw_model_load(out, &mp, &m, &err) != SFW_OK) {
			CHECK(0, "int8 tiny-sparse: %s", err.msg);
			continue;
		}
		printf("tiny-sparse int8 (RTN, group %s):\n", gi ? "channel" : "128");
		static const int chunks[3] = {64, 100, 256};
		static const int lens[9] = {5, 700, 130, 64, 1, 33, 520, 90, 17};
		int64_t big = 1 << 14;
		check_sched(m, "int8 B=1", lens + 1, chunks + 1, 1, 6, 1, 0, 1, 0, big);
		check_sched(m, "int8 B=3", lens, chunks, 3, 12, 3, 0, 1, 0, big);
		check_sched(m, "int8 B=8", lens, chunks, 8, 24, 8, 0, 1, 0, big);
		check_sched(m, "int8 join/leave", lens + 1, chunks, 8, 12, 3, 3, 1, 1, 3 * 12 * 64);
		sfw_model_free(m);
	}
	char cmd[4300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("warning: could not remove %s\n", tmp);
}

/* The CPU backend's capabilities less paging: what a backend without a
 * pool declares. */
static int (*real_supports)(const struct sfw_backend *, enum sfw_opk, enum sfw_dtype);
static int no_pool(const struct sfw_backend *be, enum sfw_opk op, enum sfw_dtype dt)
{
	return op != SFW_OP_POOL && real_supports(be, op, dt);
}

/* ... and less the cache copy (whatever the backend's table is now). */
static int (*copy_supports)(const struct sfw_backend *, enum sfw_opk, enum sfw_dtype);
static int no_copy(const struct sfw_backend *be, enum sfw_opk op, enum sfw_dtype dt)
{
	return op != SFW_OP_CACHE_COPY && copy_supports(be, op, dt);
}

/* f is a fork of q: q's calls so far are f's (the same prompt up to q's
 * position), and f goes on from there. */
static void sq_take_state(struct sq *f, const struct sq *q)
{
	f->call = q->call, f->off = q->off, f->pos = q->pos, f->next = q->next, f->started = 1;
}

/* One step of every open, unfinished sequence of qs (its next call), then
 * the comparison with its run alone: the items stepped, or -1. */
static int step_all(struct sfw_batch *b, struct sq *const *qs, int n, int V, struct sfw_err *err)
{
	struct sfw_batch_item it[8];
	struct sq *own[8];
	int k = 0;
	for (int i = 0; i < n && k < 8; i++)
		if (qs[i]->slot >= 0 && !qs[i]->done) {
			sq_item(qs[i], &it[k]);
			own[k++] = qs[i];
		}
	if (k && sfw_batch_step(b, it, k, err) != SFW_OK)
		return -1;
	for (int i = 0; i < k; i++) {
		CHECK(sfw_batch_seq_pos(b, own[i]->slot) == own[i]->pos + it[i].n, "position after a step");
		sq_after(own[i], &it[i], sfw_batch_logits(b, i), V);
	}
	return k;
}

/* Forks (sfw_batch_seq_fork) against runs alone: S, a 650-token prompt in
 * chunks of 100 then 8 greedy steps, is forked twice after 600 tokens (past
 * tiny-sparse's dense_len 512, or with dense_as_sparse: its last call
 * selected blocks) and once after its whole prompt. F0 goes on with S's
 * last 50 tokens, F1 with 50 others, F2 decodes beside S: every call of
 * each, and of S after being forked, gives the logits of its own run alone
 * (the same calls from the start) bit for bit, and the same greedy tokens.
 * F0 and F2 are S's run (the same calls): they take its reference. */
static void test_fork(struct sfw_model *m, const char *what)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sq S, F[3];
	int ok = sq_init(&S, 650, 100, 8, V, 41) == 0;
	for (int i = 0; i < 3; i++)
		ok = sq_init(&F[i], 650, 100, 8, V, i == 1 ? 42 : 41) == 0 && ok;
	if (ok)
		memcpy(F[1].prompt, S.prompt, 600 * sizeof(int32_t)); /* the same 600 tokens, then its own 50 */
	ok = ok && sq_alone(m, &S) == 0 && sq_alone(m, &F[1]) == 0;
	for (int i = 0; ok && i < 3; i += 2) {
		memcpy(F[i].ref, S.ref, sizeof(float) * (size_t)S.ncalls * V);
		memcpy(F[i].ref_tok, S.ref_tok, sizeof(int32_t) * (size_t)S.steps);
	}
	CHECK(ok, "%s: references alone", what);
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 4, bp.pool_tokens = 1 << 14, bp.max_ctx = 4096, bp.max_step_rows = 4 * 100 + 4;
	bp.dense_as_sparse = alone_sparse;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	if (ok && sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "%s: batch: %s", what, err.msg);
		ok = 0;
	}
	if (ok) {
		ok = sfw_batch_seq_open(b, &S.slot, &err) == SFW_OK;
		S.started = 1;
	}
	struct sq *all[4] = {&S, &F[0], &F[1], &F[2]};
	while (ok && S.off < 600)
		ok = step_all(b, all, 4, V, &err) == 1;
	int64_t used = ok ? sfw_batch_blocks_used(b) : 0;
	for (int i = 0; ok && i < 2; i++) {
		ok = sfw_batch_seq_fork(b, S.slot, &F[i].slot, &err) == SFW_OK;
		sq_take_state(&F[i], &S);
	}
	CHECK(ok && F[0].slot >= 0 && F[1].slot >= 0 && F[0].slot != F[1].slot && F[0].slot != S.slot &&
		  sfw_batch_seq_pos(b, F[0].slot) == 600 && sfw_batch_seq_pos(b, F[1].slot) == 600 &&
		  sfw_batch_seq_pos(b, S.slot) == 600,
	      "%s: two forks of S after 600 tokens, each at 600 in a slot of its own: %s", what, err.msg);
	/* paged: each shares S's 9 whole blocks and takes one for the 10th,
	 * partial, which S goes on writing */
	int64_t per = ok && sfw_batch_paged(b) ? 1 : 10;
	CHECK(!ok || sfw_batch_blocks_used(b) == used + 2 * per, "%s: each fork takes %lld blocks (%lld -> %lld)", what,
	      (long long)per, (long long)used, (long long)(ok ? sfw_batch_blocks_used(b) : 0));
	if (ok && (alone_sparse || sfw_model_config(m)->sparse_dense_len <= 600))
		printf("  %s: forked in selection mode (the last call's end past dense_len)\n", what);
	while (ok && S.off < S.len)
		ok = step_all(b, all, 4, V, &err) == 3;
	if (ok) {
		ok = sfw_batch_seq_fork(b, S.slot, &F[2].slot, &err) == SFW_OK;
		sq_take_state(&F[2], &S);
		CHECK(ok && sfw_batch_seq_pos(b, F[2].slot) == 650, "%s: a third fork after the whole prompt: %s", what,
		      err.msg);
	}
	int r = 1;
	while (ok && (r = step_all(b, all, 4, V, &err)) > 0)
		;
	CHECK(ok && r == 0, "%s: every step ran: %s", what, err.msg);
	for (int i = 0; i < 4; i++) {
		struct sq *q = all[i];
		CHECK(q->done && q->bad_logits == 0 && q->bad_tok == 0,
		      "%s: %s bit-identical to its run alone (%d calls, %d tokens differ)", what,
		      i == 0 ? "S, forked three times," : i == 1 ? "F0 (S's tokens)" : i == 2 ? "F1 (tokens of its own)" : "F2",
		      q->bad_logits, q->bad_tok);
		if (b && q->slot >= 0)
			sfw_batch_seq_close(b, q->slot);
	}
	CHECK(!b || sfw_batch_blocks_used(b) == 0, "%s: every block back at the end", what);
	sfw_batch_free(b);
	sq_free(&S);
	for (int i = 0; i < 3; i++)
		sq_free(&F[i]);
}

/* a and f (a fork of a, or a of f) fed one same token in one step: the
 * same logits, bit for bit. */
static int step_twins(struct sfw_batch *b, int a, int f, int V, struct sfw_err *err)
{
	int32_t tok = 7;
	struct sfw_batch_item it[2] = {{a, &tok, 1, 1, NULL, 0}, {f, &tok, 1, 1, NULL, 0}};
	if (sfw_batch_step(b, it, 2, err) != SFW_OK)
		return 0;
	const float *la = sfw_batch_logits(b, 0), *lf = sfw_batch_logits(b, 1);
	if (!la || !lf || memcmp(la, lf, (size_t)V * sizeof(float)) != 0)
		return sfw_fail(err, SFW_E_INVAL, "the logits differ") == SFW_OK;
	return 1;
}

/* Paged, after test_fork_refusals: a (151 tokens, 3 blocks) and f its
 * fork, stepped together once, hold 4 blocks: a's 2 whole ones shared.
 * Closing a keeps them for f, which goes on as a sequence fed the same
 * tokens alone does; a fork at a block boundary takes no block; every block
 * is back once the last holder closes. */
static void test_fork_shared(struct sfw_batch *b, int a, int f, const int32_t *ids, int V, const char *what)
{
	struct sfw_err err = {0};
	CHECK(sfw_batch_blocks_used(b) == 4, "%s: paged: a and its fork hold 4 blocks, 2 shared (%lld)", what,
	      (long long)sfw_batch_blocks_used(b));
	sfw_batch_seq_close(b, a);
	CHECK(sfw_batch_blocks_used(b) == 3, "%s: paged: a closed, its fork keeps the 2 shared blocks and its own (%lld)",
	      what, (long long)sfw_batch_blocks_used(b));
	/* g: f's 152 tokens (a's 150, 7, 7) again, alone; f and g fed one same
	 * token: the same logits */
	int g = -1, h = -1;
	int32_t seven = 7;
	struct sfw_batch_item it[2] = {{0, ids, 150, 0, NULL, 0}, {0, &seven, 1, 0, NULL, 0}};
	int ok = sfw_batch_seq_open(b, &g, &err) == SFW_OK;
	it[0].seq = it[1].seq = g;
	ok = ok && sfw_batch_step(b, it, 1, &err) == SFW_OK && sfw_batch_step(b, it + 1, 1, &err) == SFW_OK &&
	     sfw_batch_step(b, it + 1, 1, &err) == SFW_OK;
	CHECK(ok && step_twins(b, f, g, V, &err), "%s: paged: the fork of a closed sequence computes as a run alone: %s",
	      what, err.msg);
	sfw_batch_seq_close(b, g);
	sfw_batch_seq_close(b, f);
	/* at 128 tokens a fork takes no block */
	int32_t ids128[128];
	for (int i = 0; i < 128; i++)
		ids128[i] = ids[i];
	ok = sfw_batch_seq_open(b, &g, &err) == SFW_OK;
	struct sfw_batch_item pre = {g, ids128, 128, 0, NULL, 0};
	ok = ok && sfw_batch_step(b, &pre, 1, &err) == SFW_OK;
	int64_t before = sfw_batch_blocks_used(b);
	ok = ok && sfw_batch_seq_fork(b, g, &h, &err) == SFW_OK;
	CHECK(ok && sfw_batch_blocks_used(b) == before, "%s: paged: a fork at a block boundary takes no block (%lld -> %lld): %s",
	      what, (long long)before, (long long)sfw_batch_blocks_used(b), err.msg);
	CHECK(ok && step_twins(b, g, h, V, &err), "%s: paged: and each then writes a block of its own: %s", what, err.msg);
	CHECK(sfw_batch_blocks_used(b) == before + 2, "%s: paged: one new block each (%lld)", what,
	      (long long)sfw_batch_blocks_used(b));
	sfw_batch_seq_close(b, g);
	sfw_batch_seq_close(b, h);
	CHECK(sfw_batch_blocks_used(b) == 0, "%s: paged: every block back once its last holder closed (%lld)", what,
	      (long long)sfw_batch_blocks_used(b));
}

/* What a fork refuses, all or nothing: a sequence not open, no free slot
 * (SFW_E_RANGE, as sfw_batch_seq_open), too few free blocks (SFW_E_NOSPACE,
 * as a step), a backend without the cache copy (SFW_E_UNSUPPORTED). A pool
 * of 6 blocks, 3 slots; a parked cache's blocks go to a fork that needs
 * them (caches of their own), as to a step. Paged, a fork shares its
 * source's whole blocks and needs one for the partial last block (none at
 * a block boundary), and a shared block stays while any sequence holds
 * it. */
static void test_fork_refusals(struct sfw_model *m, const char *what)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 3, bp.pool_tokens = 6 * 64 + 10, bp.max_ctx = 4096, bp.max_step_rows = 300;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	if (sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "%s: batch: %s", what, err.msg);
		return;
	}
	static const int bad[4] = {0, -1, 3, SFW_BATCH_MAX_SEQS};
	for (int i = 0; i < 4; i++) {
		int d = 9;
		CHECK(sfw_batch_seq_fork(b, bad[i], &d, &err) == SFW_E_INVAL && d == -1 && strstr(err.msg, "not open"),
		      "%s: fork of sequence %d (not open) refused: %s", what, bad[i], err.msg);
	}
	int32_t ids[150];
	for (int i = 0; i < 150; i++)
		ids[i] = 3 + (i * 7) % 1000;
	/* a and y 3 blocks each; x and y closed: their caches parked (caches of
	 * their own: y's 3 blocks count until a fork needs them) */
	int a, x, y, f1 = -1, f2;
	int ok = sfw_batch_seq_open(b, &a, &err) == SFW_OK && sfw_batch_seq_open(b, &x, &err) == SFW_OK &&
		 sfw_batch_seq_open(b, &y, &err) == SFW_OK;
	struct sfw_batch_item it[2] = {{a, ids, 150, 0, NULL, 0}, {y, ids, 150, 0, NULL, 0}};
	ok = ok && sfw_batch_step(b, it, 2, &err) == SFW_OK;
	CHECK(ok, "%s: a and y prefilled: %s", what, err.msg);
	if (!ok) {
		sfw_batch_free(b);
		return;
	}
	int paged = sfw_batch_paged(b);
	int64_t u1 = paged ? 4 : 6; /* blocks in use with a and its fork */
	sfw_batch_seq_close(b, x);
	if (paged) { /* y's blocks back at its close: the fork's one block is refused while y runs */
		f2 = 9;
		CHECK(sfw_batch_seq_fork(b, a, &f2, &err) == SFW_E_NOSPACE && f2 == -1 &&
			  strstr(err.msg, "KV pool full: 6 of 6 blocks in use"),
		      "%s: paged: a fork needs a block for a's partial last one, refused when none is free: %s", what,
		      err.msg);
	}
	sfw_batch_seq_close(b, y);
	CHECK(sfw_batch_seq_fork(b, a, &f1, &err) == SFW_OK && f1 == x && sfw_batch_seq_pos(b, f1) == 150 &&
		  sfw_batch_blocks_used(b) == u1,
	      "%s: a's fork in the first free slot, at 150, %lld blocks in use (%lld): %s", what, (long long)u1,
	      (long long)sfw_batch_blocks_used(b), err.msg);
	if (!paged) {
		f2 = 9;
		CHECK(sfw_batch_seq_fork(b, a, &f2, &err) == SFW_E_NOSPACE && f2 == -1 &&
			  strstr(err.msg, "KV pool full: 6 of 6 blocks in use"),
		      "%s: a fork the pool has no blocks for refused: %s", what, err.msg);
	}
	CHECK(sfw_batch_seq_pos(b, y) == -1 && sfw_batch_blocks_used(b) == u1 && sfw_batch_seq_pos(b, a) == 150 &&
		  sfw_batch_seq_pos(b, f1) == 150,
	      "%s: the refused fork changed nothing", what);
	int c;
	CHECK(sfw_batch_seq_open(b, &c, &err) == SFW_OK, "%s: a third sequence: %s", what, err.msg);
	f2 = 9;
	CHECK(sfw_batch_seq_fork(b, a, &f2, &err) == SFW_E_RANGE && f2 == -1 && strstr(err.msg, "all 3 sequences in use"),
	      "%s: a fork with every slot in use refused as an open is: %s", what, err.msg);
	CHECK(sfw_batch_seq_fork(b, c, &f2, &err) == SFW_E_RANGE && f2 == -1,
	      "%s: an empty sequence's fork, no slot free, refused: %s", what, err.msg);
	CHECK(sfw_batch_blocks_used(b) == u1 && sfw_batch_seq_pos(b, c) == 0, "%s: nothing changed", what);
	sfw_batch_seq_close(b, c);
	CHECK(sfw_batch_seq_fork(b, c, &f2, &err) == SFW_E_INVAL && f2 == -1 && strstr(err.msg, "not open"),
	      "%s: a closed sequence's fork refused: %s", what, err.msg);
	CHECK(step_twins(b, a, f1, V, &err), "%s: a and its fork, fed one token, give the same logits: %s", what, err.msg);
	/* without the backend's cache copy */
	copy_supports = m->be->supports_op;
	m->be->supports_op = no_copy;
	sfw_batch_seq_close(b, f1);
	f2 = 9;
	CHECK(sfw_batch_seq_fork(b, a, &f2, &err) == SFW_E_UNSUPPORTED && f2 == -1 && strstr(err.msg, "copy"),
	      "%s: no fork on a backend without the cache copy: %s", what, err.msg);
	m->be->supports_op = copy_supports;
	CHECK(sfw_batch_blocks_used(b) == 3 && sfw_batch_seq_pos(b, f1) == -1, "%s: nothing changed", what);
	/* the closed fork's slot (its cache parked, caches of their own) for a new one */
	CHECK(sfw_batch_seq_fork(b, a, &f2, &err) == SFW_OK && f2 == f1 && sfw_batch_blocks_used(b) == u1,
	      "%s: a fork again once blocks came back: %s", what, err.msg);
	CHECK(step_twins(b, f2, a, V, &err), "%s: and it goes on as a does: %s", what, err.msg);
	if (paged)
		test_fork_shared(b, a, f2, ids, V, what);
	sfw_batch_free(b);
}

int main(void)
{
	const char *models[] = {"tiny-sparse", "tiny-dense"};
	for (int i = 0; i < 2; i++) {
		struct sfw_model *m = check_golden_model(models[i], 2);
		if (!m)
			continue;
		printf("%s:\n", models[i]);
		test_sizes(m);
		test_fork(m, "fork");
		test_fork_refusals(m, "fork refusals");
		if (i == 1) { /* selection at every length: the forks' caches in selection mode */
			alone_sparse = 1;
			test_fork(m, "fork, dense_as_sparse");
			alone_sparse = 0;
		}
		if (i == 0) {
			test_64(m);
			test_pool(m);
			test_refusals(m);
			test_sample(m);
			/* the other KV mode: per-sequence caches under the budget */
			struct sfw_backend *be = m->be;
			real_supports = be->supports_op;
			CHECK(real_supports(be, SFW_OP_POOL, SFW_DTYPE_F32), "the CPU backend pages the KV cache");
			be->supports_op = no_pool;
			printf("%s, KV caches per sequence:\n", models[i]);
			static const int chunks[3] = {64, 100, 256};
			static const int lens[9] = {64, 1, 33, 520, 90, 200, 17, 65, 300};
			real_cache_new = be->cache_new;
			be->cache_new = counting_cache_new;
			check_sched(m, "join/leave", lens, chunks, 9, 12, 4, 3, 1, 1, 4 * 9 * 64);
			CHECK(sched_caches == 4, "join/leave: 9 sequences through 4 slots made 4 caches, not one each (%d)",
			      sched_caches);
			test_pool(m);
			test_fork(m, "fork, caches per sequence");
			test_fork_refusals(m, "fork refusals, caches per sequence");
			be->cache_new = real_cache_new;
			be->supports_op = real_supports;
		}
		sfw_model_free(m);
	}
	const char *g = check_golden_dir();
	if (g)
		test_w8(g);
	return CHECK_REPORT("test_batch");
}
