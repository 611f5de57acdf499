/* modules: quant runner formats kernels num fetch verify core */
/* gpu_batch.c - batched decode (runner/batch.h) on the CUDA backend against
 * the same sequences run alone, each on a CUDA context of its own fed the
 * same calls (prompt chunks, then the alone run's greedy chain as the fed
 * tokens, so both sides see the same inputs every step).
 *
 * Not bit-identical on CUDA, and this test says so: a batched step runs the
 * projections over B rows (the GEMV for M <= 8, cuBLASLt above, separate
 * q/k/v matrices instead of the merged one), the alone run its merged GEMV
 * and its whole-step graph; the rows differ in bf16 summation order only.
 * The bound is gpu_decode's for summation-order changes: logits within
 * 1.5e-2 (bf16 logits of the tiny models are O(1)), greedy tokens equal up
 * to near ties (top two within 2e-2).
 *
 * Cases on the golden tiny models: B = 1, 8, 64, sequences of different
 * lengths (past tiny-sparse's dense_len 512: the InfLLM-v2 path), one prompt
 * chunk per step mixed into the others' decode rows; and the pool refusing a
 * step (nothing moves, the others continue). The batch's caches are paged
 * (one KV pool, a block table per sequence: kernels/ops_cuda.h), the alone
 * runs' contiguous, so the comparison also holds the paged kernels to the
 * contiguous ones. Steps whose rows are all dense-mode decode rows replay
 * the recording of their batch-size bucket (be->step_seqs: 2 .. 64 rows,
 * made after two direct steps, for any sequences): on tiny-dense the test
 * asks that some did, and in a run where sequences join and leave, that
 * some replays had padding rows and some came right after the set changed
 * with no new recording; on tiny-sparse, that some replays had rows in
 * selection mode, and, where every row selects blocks and sequences join
 * and leave, that a recording served other sequences than it was made
 * for without a new recording. Forks (sfw_batch_seq_fork, the caches
 * copied device to device) against the same sequence run alone, paged and
 * with caches of their own.
 *   gpu_batch            (SALAFW_GOLDEN names the golden folder) */
#include "check.h"

#include "kernels/ops_cuda.h"
#include "runner/backend.h"
#include "runner/batch.h"
#include "runner/model.h"
#include "runner/runner.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 24
#define CHUNK 200

struct sq {
	int len, ncalls, call, off, slot;
	int32_t *ids;   /* prompt, then the fed chain [len + STEPS] */
	float *ref;     /* [ncalls, V] alone */
	double maxd, maxref;
	int argmax_diff, near_ties;
};

static int32_t argmax(const float *l, int V)
{
	int32_t b = 0;
	for (int i = 1; i < V; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

static int call_n(const struct sq *q)
{
	return q->off < q->len ? (q->len - q->off < CHUNK ? q->len - q->off : CHUNK) : 1;
}

/* The prompt and the alone run (chunks of CHUNK, then STEPS greedy steps). */
static int sq_alone(struct sfw_model *m, struct sq *q, int len, uint32_t seed)
{
	int V = sfw_model_config(m)->vocab_size;
	memset(q, 0, sizeof(*q));
	q->len = len;
	q->ncalls = (len + CHUNK - 1) / CHUNK + STEPS;
	q->ids = malloc(sizeof(int32_t) * (size_t)(len + STEPS));
	q->ref = malloc(sizeof(float) * (size_t)q->ncalls * V);
	if (!q->ids || !q->ref)
		return -1;
	q->ids[0] = 1;
	for (int i = 1; i < len; i++) {
		seed = seed * 1664525u + 1013904223u;
		q->ids[i] = (int32_t)(3 + (seed >> 8) % (uint32_t)(V - 11));
	}
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	cp.prefill_chunk = 256;
	struct sfw_ctx *c = NULL;
	struct sfw_err err = {0};
	enum sfw_status s = sfw_ctx_new(m, &cp, &c, &err);
	for (int call = 0, off = 0; s == SFW_OK && call < q->ncalls; call++) {
		int n = off < len ? (len - off < CHUNK ? len - off : CHUNK) : 1;
		s = sfw_ctx_prefill(c, q->ids + off, (size_t)n, q->ref + (size_t)call * V, &err);
		off += n;
		if (off >= len && off < len + STEPS)
			q->ids[off] = argmax(q->ref + (size_t)call * V, V);
	}
	CHECK(s == SFW_OK, "alone (%d tokens): %s", len, err.msg);
	sfw_ctx_free(c);
	return s == SFW_OK ? 0 : -1;
}

static void sq_compare(struct sq *q, const float *x, int V)
{
	const float *y = q->ref + (size_t)q->call * V;
	if (!x) {
		q->maxd = INFINITY;
		return;
	}
	for (int v = 0; v < V; v++) {
		double d = fabs((double)x[v] - y[v]);
		q->maxd = isnan(d) ? INFINITY : d > q->maxd ? d : q->maxd;
		q->maxref = fabs(y[v]) > q->maxref ? fabs(y[v]) : q->maxref;
	}
	int a = argmax(x, V), b = argmax(y, V);
	if (a != b) {
		if (fabs((double)y[a] - y[b]) > 2e-2)
			q->argmax_diff++;
		else
			q->near_ties++;
	}
}

/* 1 when the two steps' sequences differ (as sets of slots). */
static int set_changed(struct sq *const *a, int na, struct sq *const *b, int nb)
{
	if (na != nb)
		return 1;
	for (int i = 0; i < na; i++) {
		int found = 0;
		for (int j = 0; j < nb && !found; j++)
			found = a[i] == b[j];
		if (!found)
			return 1;
	}
	return 0;
}

/* What a case asks of the recorded steps (want): some steps of decode
 * rows replayed their bucket's recording; some of those had padding rows
 * (a count of sequences not a power of two); some came right after the set
 * changed (a join or a leave) without a new recording; some had rows in
 * selection mode; and (W_SEL_OTHERS) some with rows in selection mode
 * replayed a recording made for other sequences, without recording again. */
enum { W_REPLAY = 1, W_PAD = 2, W_CHANGED = 4, W_SPARSE = 8, W_SEL_OTHERS = 16 };

/* The batch-size bucket of n decode rows (capture_cuda.c's rule when the
 * step's rows allow 64): 0 for 2 rows, 1 for 4, .. 5 for 64. */
static int bucket_index(int n)
{
	int i = 0;
	for (int rows = 2; rows < n; rows *= 2)
		i++;
	return i;
}

/* B sequences of lens[i] prompt tokens; sequence i joins at step join[i]
 * (NULL: all at once) and leaves after its last call. */
static void batch_case(struct sfw_model *m, const char *what, int B, const int *lens, const int *join, int want)
{
	int64_t dense_len = sfw_model_config(m)->sparse_dense_len;
	int V = sfw_model_config(m)->vocab_size;
	struct sq *qs = calloc((size_t)B, sizeof(*qs));
	int ok = qs != NULL;
	for (int i = 0; ok && i < B; i++)
		ok = sq_alone(m, &qs[i], lens[i], 777u + (uint32_t)i) == 0;
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = B, bp.pool_tokens = 1 << 20, bp.max_ctx = 4096, bp.max_step_rows = CHUNK + B;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	if (ok && sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "%s: batch: %s", what, err.msg);
		ok = 0;
	}
	CHECK(!ok || sfw_batch_paged(b), "%s: the batch's KV caches are paged", what);
	for (int i = 0; ok && i < B; i++)
		ok = sfw_batch_seq_open(b, &qs[i].slot, &err) == SFW_OK;
	int64_t rp0 = sfwi_cuda_seqs_replays(m->be);
	int mixed = 0, steps = 0, pad_replays = 0, changed_replays = 0, sparse_replays = 0, nprev = 0, sel_others = 0;
	struct sfw_batch_item it[SFW_BATCH_MAX_SEQS];
	struct sq *own[SFW_BATCH_MAX_SEQS], *prev[SFW_BATCH_MAX_SEQS];
	/* per bucket: the sequences of the step that made its recording */
	static struct sq *recset[6][SFW_BATCH_MAX_SEQS];
	int nrecset[6] = {0};
	while (ok) {
		int n = 0, pre = 0, dec = 0, waiting = 0;
		for (int i = 0; i < B; i++) {
			struct sq *q = &qs[i];
			if (join && steps < join[i]) {
				waiting = 1;
				continue;
			}
			if (q->call == q->ncalls || (q->off < q->len && pre))
				continue;
			pre += q->off < q->len, dec += q->off >= q->len;
			it[n] = (struct sfw_batch_item){q->slot, q->ids + q->off, call_n(q), 1, NULL, 0};
			own[n++] = q;
		}
		if (!n && !waiting)
			break;
		if (!n) { /* nobody in until the next join */
			steps++;
			continue;
		}
		int64_t rp = sfwi_cuda_seqs_replays(m->be), rc = sfwi_cuda_recordings(m->be);
		int nsel = 0; /* rows in selection mode (the engine's rule: the call's end past dense_len) */
		for (int i = 0; i < n; i++)
			nsel += own[i]->off + it[i].n >= dense_len;
		if (sfw_batch_step(b, it, n, &err) != SFW_OK) {
			CHECK(0, "%s: step %d: %s", what, steps, err.msg);
			ok = 0;
			break;
		}
		int bi = bucket_index(n), recorded = sfwi_cuda_recordings(m->be) > rc;
		if (sfwi_cuda_seqs_replays(m->be) > rp) {
			pad_replays += (n & (n - 1)) != 0;
			changed_replays += set_changed(own, n, prev, nprev) && !recorded;
			sparse_replays += nsel > 0;
			sel_others += nsel > 0 && !recorded && set_changed(own, n, recset[bi], nrecset[bi]);
			if (recorded)
				memcpy(recset[bi], own, (size_t)n * sizeof(*own)), nrecset[bi] = n;
		}
		memcpy(prev, own, (size_t)n * sizeof(*own));
		nprev = n;
		steps++, mixed += pre && dec;
		for (int i = 0; i < n; i++) {
			sq_compare(own[i], sfw_batch_logits(b, i), V);
			own[i]->off += it[i].n;
			own[i]->call++;
		}
	}
	double maxd = 0, maxref = 0;
	int ad = 0, nt = 0;
	for (int i = 0; qs && i < B; i++) {
		maxd = qs[i].maxd > maxd ? qs[i].maxd : maxd;
		maxref = qs[i].maxref > maxref ? qs[i].maxref : maxref;
		ad += qs[i].argmax_diff, nt += qs[i].near_ties;
	}
	int64_t replays = sfwi_cuda_seqs_replays(m->be) - rp0;
	printf("  %s: %d steps (%d mixed, %lld replayed: %d with padding rows, %d just after a join or leave, %d with "
	       "rows selecting blocks, %d of those for other sequences than recorded), max |dlogit| %.3g (max |logit| "
	       "%.3g), argmax differs %d (near ties %d)\n",
	       what, steps, mixed, (long long)replays, pad_replays, changed_replays, sparse_replays, sel_others, maxd,
	       maxref, ad, nt);
	/* stretches of dense decode rows replay their bucket's recording
	 * (be->step_seqs), and the logits above hold for them too */
	CHECK(!(want & W_REPLAY) || replays > 0, "%s: steps of decode rows replayed a recording (%lld)", what,
	      (long long)replays);
	CHECK(!(want & W_PAD) || pad_replays > 0, "%s: a bucket replayed with padding rows (%d steps)", what,
	      pad_replays);
	CHECK(!(want & W_CHANGED) || changed_replays > 0,
	      "%s: a bucket's recording replayed for a set of sequences that just changed (%d steps)", what,
	      changed_replays);
	CHECK(!(want & W_SPARSE) || sparse_replays > 0, "%s: a recording replayed with rows selecting blocks (%d steps)",
	      what, sparse_replays);
	CHECK(!(want & W_SEL_OTHERS) || sel_others > 0,
	      "%s: a recording with rows selecting blocks replayed for other sequences than it was made for, "
	      "recording nothing new (%d steps)",
	      what, sel_others);
	CHECK(ok, "%s: every step ran", what);
	CHECK(maxd <= 1.5e-2 * (maxref > 1 ? maxref : 1), "%s: logits within 1.5e-2 of the runs alone (max diff %g)",
	      what, maxd);
	CHECK(ad == 0, "%s: greedy tokens equal up to near ties (%d differ)", what, ad);
	CHECK(B == 1 || mixed > 0, "%s: prefill chunks ran beside decode rows (%d steps)", what, mixed);
	sfw_batch_free(b);
	for (int i = 0; qs && i < B; i++)
		free(qs[i].ids), free(qs[i].ref);
	free(qs);
}

/* 4 blocks: A holds 3, B's second block is refused and nothing moves; A
 * decodes on; after A closes B's step goes through; D, opened in A's slot
 * on a block A wrote, gives the logits B gave for the same 64-token
 * prompt. */
static void pool_case(struct sfw_model *m)
{
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 2, bp.pool_tokens = 4 * 64, bp.max_ctx = 4096;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	if (sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		CHECK(0, "pool: %s", err.msg);
		return;
	}
	CHECK(sfw_batch_paged(b) && sfw_batch_blocks_total(b) == 4, "pool: one paged pool of 4 blocks");
	int a, c;
	int32_t ids[192];
	for (int i = 0; i < 192; i++)
		ids[i] = 3 + i;
	CHECK(sfw_batch_seq_open(b, &a, &err) == SFW_OK && sfw_batch_seq_open(b, &c, &err) == SFW_OK, "two sequences");
	struct sfw_batch_item it[2] = {{a, ids, 150, 1, NULL, 0}, {c, ids, 64, 1, NULL, 0}};
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_OK, "3 + 1 blocks: %s", err.msg);
	int V = sfw_model_config(m)->vocab_size;
	float *la = malloc((size_t)V * sizeof(float));
	const float *l0 = sfw_batch_logits(b, 1);
	if (la && l0)
		memcpy(la, l0, (size_t)V * sizeof(float));
	it[0] = (struct sfw_batch_item){a, ids, 1, 1, NULL, 0};
	it[1] = (struct sfw_batch_item){c, ids, 1, 1, NULL, 0};
	CHECK(sfw_batch_step(b, it, 2, &err) == SFW_E_NOSPACE && strstr(err.msg, "KV pool full: 4 of 4 blocks in use"),
	      "the fifth block refused: %s", err.msg);
	CHECK(sfw_batch_seq_pos(b, a) == 150 && sfw_batch_seq_pos(b, c) == 64, "nothing moved");
	CHECK(sfw_batch_step(b, it, 1, &err) == SFW_OK && sfw_batch_logits(b, 0), "A decodes on: %s", err.msg);
	sfw_batch_seq_close(b, a);
	CHECK(sfw_batch_step(b, it + 1, 1, &err) == SFW_OK && sfw_batch_seq_pos(b, c) == 65,
	      "B after A's blocks came back: %s", err.msg);
	int d = -1;
	CHECK(sfw_batch_seq_open(b, &d, &err) == SFW_OK && d == a, "D opens in A's slot: %s", err.msg);
	struct sfw_batch_item di = {d, ids, 64, 1, NULL, 0};
	const float *ld = NULL;
	CHECK(sfw_batch_step(b, &di, 1, &err) == SFW_OK && (ld = sfw_batch_logits(b, 0)) != NULL,
	      "D's 64 tokens on a reused block: %s", err.msg);
	double maxd = 0, maxref = 1;
	for (int v = 0; la && l0 && ld && v < V; v++) {
		maxd = fmax(maxd, fabs((double)ld[v] - la[v]));
		maxref = fmax(maxref, fabs((double)la[v]));
	}
	CHECK(la && l0 && ld && maxd <= 1.5e-2 * maxref, "D's logits = B's for the same prompt (max diff %g)", maxd);
	free(la);
	sfw_batch_free(b);
}

/* The next token chosen on the device (sfw_batch_item.sample): 8
 * sequences, each with one of four samplers, 16 steps; every choice equals
 * the host twin sfw_op_sample_cpu on the same step's logits (the device
 * sampler's meaning, bit for bit: gpu_backend_ops), and a second batch fed
 * the same ids without host logits makes the same choices. */
static void sample_case(struct sfw_model *m)
{
	int V = sfw_model_config(m)->vocab_size;
	static const struct sfw_op_sample_params sp[4] = {
	    {.temperature = 0, .top_k = 0, .top_p = 1, .greedy = 1},
	    {.temperature = 0.8f, .top_k = 0, .top_p = 1, .greedy = 0},
	    {.temperature = 0.7f, .top_k = 40, .top_p = 1, .greedy = 0},
	    {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .greedy = 0}};
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 8, bp.max_ctx = 1024;
	struct sfw_batch *b[2] = {NULL, NULL};
	struct sfw_err err = {0};
	int seq[2][8], ok = 1;
	for (int k = 0; k < 2; k++) {
		ok &= sfw_batch_new(m, &bp, &b[k], &err) == SFW_OK;
		for (int i = 0; ok && i < 8; i++)
			ok &= sfw_batch_seq_open(b[k], &seq[k][i], &err) == SFW_OK;
	}
	CHECK(ok, "sample: two batches of 8: %s", err.msg);
	int32_t prompt[8][40], cur[8];
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 40; j++)
			prompt[i][j] = 2 + (31 * i + 7 * j) % (V - 2);
	int agree = 0, same = 0, total = 0;
	uint32_t x = 12345;
	for (int step = 0; ok && step < 16; step++) {
		struct sfw_batch_item it[2][8];
		for (int i = 0; i < 8; i++) {
			x = x * 1664525u + 1013904223u;
			double u = (double)(x >> 8) / 16777216.0;
			for (int k = 0; k < 2; k++)
				it[k][i] = (struct sfw_batch_item){seq[k][i], step ? &cur[i] : prompt[i], step ? 1 : 10 + 3 * i,
								    k == 0, &sp[i % 4], u};
		}
		for (int k = 0; k < 2 && ok; k++)
			ok = sfw_batch_step(b[k], it[k], 8, &err) == SFW_OK;
		for (int i = 0; ok && i < 8; i++) {
			const float *l = sfw_batch_logits(b[0], i);
			int32_t id = sfw_batch_next(b[0], i);
			agree += l && id == sfw_op_sample_cpu(NULL, l, V, &sp[i % 4], it[0][i].u);
			same += id == sfw_batch_next(b[1], i) && !sfw_batch_logits(b[1], i);
			total++;
			cur[i] = id;
		}
	}
	CHECK(ok, "sample: every step ran: %s", err.msg);
	CHECK(total == 128 && agree == total, "sample: %d of %d device choices equal the host twin's", agree, total);
	CHECK(same == total, "sample: without host logits the same %d of %d choices", same, total);
	sfw_batch_free(b[0]);
	sfw_batch_free(b[1]);
}

/* The CUDA backend's capabilities less paging (the batch then keeps
 * caches of their own, as for shapes the pool cannot take). */
static int (*real_supports)(const struct sfw_backend *, enum sfw_opk, enum sfw_dtype);
static int no_pool(const struct sfw_backend *be, enum sfw_opk op, enum sfw_dtype dt)
{
	return op != SFW_OP_POOL && real_supports(be, op, dt);
}

/* Forks (sfw_batch_seq_fork: paged, the whole blocks shared and the
 * partial last one copied device to device; else the cache copied) against
 * the run alone: S, a 600-token prompt in chunks of CHUNK then STEPS steps
 * fed the alone run's greedy chain, is forked once after 400 tokens (F0
 * prefills the last chunk itself) and twice after its whole prompt (F1, F2,
 * taken in selection mode on tiny-sparse: the last call ended past
 * dense_len 512). Every call of the forks, and of S after being forked,
 * gives the logits of the run alone within the bound above, and the same
 * greedy tokens up to near ties; every block comes back at the end. */
static void fork_case(struct sfw_model *m, const char *what)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sq S, F[3];
	if (sq_alone(m, &S, 600, 4242u) != 0)
		return;
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = 4, bp.pool_tokens = 1 << 16, bp.max_ctx = 4096, bp.max_step_rows = 2 * CHUNK + 4;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	int ok = sfw_batch_new(m, &bp, &b, &err) == SFW_OK && sfw_batch_seq_open(b, &S.slot, &err) == SFW_OK;
	CHECK(ok, "%s: batch: %s", what, err.msg);
	struct sq *all[4] = {&S, &F[0], &F[1], &F[2]};
	int live = 1, steps = 0;
	while (ok) {
		if ((S.off == 400 && live == 1) || (S.off == S.len && live < 4)) { /* F0, then F1 and F2 */
			for (int k = live; ok && k < (S.off == 400 ? 2 : 4); k++, live++) {
				struct sq *f = all[k];
				*f = S; /* the same prompt, chain and reference; its own counters */
				f->maxd = f->maxref = 0, f->argmax_diff = f->near_ties = 0;
				/* paged: S's whole blocks shared, one taken for its partial last */
				int64_t used = sfw_batch_blocks_used(b),
					more = sfw_batch_paged(b) ? S.off % 64 != 0 : (S.off + 63) / 64;
				ok = sfw_batch_seq_fork(b, S.slot, &f->slot, &err) == SFW_OK &&
				     sfw_batch_seq_pos(b, f->slot) == S.off;
				CHECK(ok, "%s: fork %d of S at %d tokens: %s", what, k - 1, S.off, err.msg);
				CHECK(!ok || sfw_batch_blocks_used(b) == used + more,
				      "%s: fork %d takes %lld blocks (%lld -> %lld, paged %d)", what, k - 1, (long long)more,
				      (long long)used, (long long)sfw_batch_blocks_used(b), sfw_batch_paged(b));
			}
		}
		struct sfw_batch_item it[4];
		struct sq *own[4];
		int n = 0;
		for (int k = 0; ok && k < live; k++)
			if (all[k]->call < all[k]->ncalls) {
				it[n] = (struct sfw_batch_item){all[k]->slot, all[k]->ids + all[k]->off, call_n(all[k]), 1, NULL, 0};
				own[n++] = all[k];
			}
		if (!ok || !n)
			break;
		if (sfw_batch_step(b, it, n, &err) != SFW_OK) {
			CHECK(0, "%s: step %d: %s", what, steps, err.msg);
			ok = 0;
			break;
		}
		steps++;
		for (int i = 0; i < n; i++) {
			sq_compare(own[i], sfw_batch_logits(b, i), V);
			own[i]->off += it[i].n;
			own[i]->call++;
		}
	}
	CHECK(ok && live == 4, "%s: S forked three times, every step ran (%d steps)", what, steps);
	for (int k = 0; ok && k < 4; k++) {
		struct sq *q = all[k];
		printf("  %s: %s max |dlogit| %.3g (max |logit| %.3g), argmax differs %d (near ties %d)\n", what,
		       k ? "fork" : "source", q->maxd, q->maxref, q->argmax_diff, q->near_ties);
		CHECK(q->call == q->ncalls && q->maxd <= 1.5e-2 * (q->maxref > 1 ? q->maxref : 1),
		      "%s: %s%d's logits within 1.5e-2 of the run alone (max diff %g)", what, k ? "F" : "S", k ? k - 1 : 0,
		      q->maxd);
		CHECK(q->argmax_diff == 0, "%s: %s%d's greedy tokens equal up to near ties (%d differ)", what, k ? "F" : "S",
		      k ? k - 1 : 0, q->argmax_diff);
		sfw_batch_seq_close(b, q->slot);
	}
	CHECK(!b || sfw_batch_blocks_used(b) == 0, "%s: every block back at the end", what);
	sfw_batch_free(b);
	free(S.ids), free(S.ref);
}

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "no GPU: %s", err.msg);
		return CHECK_REPORT("gpu_batch");
	}
	const char *g = check_golden_dir();
	if (!g)
		return CHECK_REPORT("gpu_batch");
	const char *cases[] = {"tiny-sparse", "tiny-dense"};
	int lens[64];
	for (int i = 0; i < 64; i++)
		lens[i] = 1 + (i * 97) % 700;
	for (int k = 0; k < 2; k++) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/%s", g, cases[k]);
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CUDA;
		struct sfw_model *m = NULL;
		if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK) {
			CHECK(0, "%s: %s", dir, err.msg);
			continue;
		}
		printf("%s:\n", cases[k]);
		int l1[1] = {600};
		batch_case(m, "B=1", 1, l1, NULL, 0);
		/* tiny-dense: every row dense, recorded for any sequences;
		 * tiny-sparse's rows past 512 select blocks, recorded per set */
		batch_case(m, "B=8", 8, lens, NULL, k == 1 ? W_REPLAY : 0);
		batch_case(m, "B=64", 64, lens, NULL, k == 1 ? W_REPLAY : 0);
		/* joins and leaves: 3 sequences (bucket 4, one padding row), 3
		 * more from step 10 (bucket 8), then they leave one by one; on
		 * tiny-sparse (dense_len 512) half of them select blocks */
		static const int jd[6] = {20, 30, 40, 20, 30, 40}, jsp[6] = {600, 30, 560, 20, 700, 40};
		static const int js[6] = {0, 0, 0, 10, 10, 12};
		batch_case(m, "join/leave", 6, k == 1 ? jd : jsp, js,
			   k == 1 ? W_REPLAY | W_PAD | W_CHANGED : W_REPLAY | W_PAD | W_SPARSE);
		fork_case(m, "fork");
		if (k == 0) {
			/* every row in selection mode (past dense_len 512): three
			 * sequences decode together (bucket 4, recorded), leave,
			 * and two that joined later decode beside the last of
			 * them in the same rows: the recording serves them */
			static const int sl[5] = {560, 600, 640, 580, 620}, sj[5] = {0, 0, 0, 30, 30};
			batch_case(m, "selection join/leave", 5, sl, sj, W_REPLAY | W_SPARSE | W_SEL_OTHERS);
			pool_case(m);
			sample_case(m);
			real_supports = m->be->supports_op;
			m->be->supports_op = no_pool;
			fork_case(m, "fork, caches per sequence");
			m->be->supports_op = real_supports;
		}
		sfw_model_free(m);
	}
	/* --kv-cache fp8 (tiny-sparse): batched, recorded, joined, forked and
	 * paged sequences against the same sequences alone, all with the fp8
	 * cache (the *_seqs kernels and the pool's fp8 blocks) */
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/tiny-sparse", g);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CUDA;
	mp.kv_cache = SFW_KV_CACHE_FP8;
	struct sfw_model *m = NULL;
	if (sfw_model_load(dir, &mp, &m, &err) == SFW_OK) {
		printf("tiny-sparse, --kv-cache fp8:\n");
		batch_case(m, "fp8 B=8", 8, lens, NULL, 0);
		static const int sl[5] = {560, 600, 640, 580, 620}, sj[5] = {0, 0, 0, 30, 30};
		batch_case(m, "fp8 selection join/leave", 5, sl, sj, W_REPLAY | W_SPARSE | W_SEL_OTHERS);
		pool_case(m);
		fork_case(m, "fp8 fork");
		sfw_model_free(m);
	} else {
		CHECK(0, "%s with --kv-cache fp8: %s", dir, err.msg);
	}
	return CHECK_REPORT("gpu_batch");
}
