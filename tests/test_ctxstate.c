/* modules: tools quant runner formats kernels num fetch verify core */
/* test_ctxstate.c - a context's state saved and loaded (runner/runner.h,
 * sfw_ctx_state_save / sfw_ctx_state_load; format runner/ctxstate.h), on a
 * tiny mkmodel model (golden tiny-sparse's shapes: 6 layers S L L S L S,
 * dense_len 512).
 *
 * The oracle is the same context prefilled from scratch in the SAME calls:
 * context A prefills the prefix P as one call (sfw_ctx_prefill_next, as
 * `run` does) and saves; then the rest S as a second call and a few greedy
 * decode steps. Context B loads the saved state and makes the same second
 * call and steps. A call's InfLLM-v2 dense/sparse decision (and block count)
 * is made per call from the length at its end, and a call's rows are cut
 * into prefill pieces from its first row, so a state is only comparable with
 * a context that took its tokens in the same calls: P+S as one call is a
 * different computation, not an oracle. B must give A's logits, choices and
 * selection notes bit for bit:
 *   - P = 600 > dense_len: the prefix call's sparse layers are in selection
 *     mode (and its 600 rows take three pieces of 256);
 *   - P = 100, dense; P = 300 then a single token; P = 150 with
 *     dense_as_sparse (selection at every length).
 * Then the misfits: a prompt that is not an extension (nothing loaded, SFW_OK),
 * another binding, other context parameters, every truncation, a flipped
 * byte in each part, a trailing byte, a non-finite value under a valid
 * checksum: each an error, the context reset and, prefilled from scratch
 * after a failed load that had written into its caches, equal to a fresh
 * one. Then the same with --kv-cache fp8 (the CPU: float caches rounded as
 * fp8; CUDA: the fp8 layout, its last group's unused rows zeroed): the
 * same calls bit for bit, a state of the other K/V kind refused, and on
 * CUDA a NaN code or a negative scale under a valid checksum refused.
 * tests/gpu_ctxstate.c runs the same on the CUDA backend. */
#include "check.h"
#include "alloc.h"
#include "kernels/ops.h"
#include "runner/ctxstate.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <stdlib.h>
#include <string.h>

#ifndef CS_CUDA
#define CS_NAME "test_ctxstate"
#define CS_DEVICE SFW_DEVICE_CPU
#endif

#define NTOK 700
#define STEPS 4

struct mem {
	unsigned char *p;
	size_t n, cap, at;
};

static enum sfw_status mem_write(void *user, const void *p, size_t n, struct sfw_err *err)
{
	struct mem *m = user;
	if (m->n + n > m->cap) {
		size_t cap = (m->n + n) * 2;
		unsigned char *q = realloc(m->p, cap);
		if (!q)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		m->p = q, m->cap = cap;
	}
	memcpy(m->p + m->n, p, n);
	m->n += n;
	return SFW_OK;
}

static enum sfw_status mem_read(void *user, void *p, size_t n, size_t *got, struct sfw_err *err)
{
	(void)err;
	struct mem *m = user;
	size_t k = m->n - m->at < n ? m->n - m->at : n;
	memcpy(p, m->p + m->at, k);
	m->at += k;
	*got = k;
	return SFW_OK;
}

static const uint8_t BIND[32] = {1, 2, 3};

static struct sfw_ctx *new_ctx(struct sfw_model *m, int das, int chunk)
{
	struct sfw_ctx_params p = sfw_ctx_default_params();
	p.dense_as_sparse = das;
	p.prefill_chunk = chunk;
	struct sfw_ctx *c = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_ctx_new(m, &p, &c, &err) == SFW_OK, "ctx: %s", err.msg);
	return c;
}

/* Loads st (from its start) into c for prompt[0..n); returns the status. */
static enum sfw_status load(struct sfw_ctx *c, struct mem *st, const int32_t *prompt, size_t n, int64_t *got,
			    struct sfw_err *err)
{
	st->at = 0;
	return sfw_ctx_state_load(c, BIND, prompt, n, mem_read, st, got, err);
}

/* What a context gives after the prefix: its second call's logits, then
 * greedy steps. */
struct run {
	float *after_prefix, *after_rest;
	int32_t first, tokens[STEPS];
	int32_t blocks[6][64];
	int modes[6];
};

static void tail(struct sfw_ctx *c, const int32_t *ids, size_t P, size_t S, int V, struct run *r)
{
	struct sfw_err err = {0};
	struct sfw_op_sample_params gp = {0};
	gp.greedy = 1, gp.top_p = 1;
	for (int li = 0; li < 6; li++)
		r->modes[li] = sfw_ctx_last_blocks(c, li, r->blocks[li]);
	CHECK(sfw_ctx_last_logits(c, r->after_prefix, &err) == SFW_OK, "last logits: %s", err.msg);
	CHECK(sfw_ctx_next_from_last(c, &gp, 0.5, &r->first, &err) == SFW_OK, "next from last: %s", err.msg);
	CHECK(sfw_ctx_prefill(c, ids + P, S, r->after_rest, &err) == SFW_OK, "rest: %s", err.msg);
	int32_t id = -1;
	CHECK(sfw_ctx_next_from_last(c, &gp, 0.5, &id, &err) == SFW_OK, "after the rest: %s", err.msg);
	for (int i = 0; i < STEPS; i++) {
		r->tokens[i] = id;
		CHECK(sfw_ctx_decode_next(c, id, &gp, 0.5, &id, &err) == SFW_OK, "decode: %s", err.msg);
	}
	(void)V;
}

static void run_init(struct run *r, int V)
{
	memset(r, 0, sizeof(*r));
	r->after_prefix = sfw_malloc((size_t)V * sizeof(float));
	r->after_rest = sfw_malloc((size_t)V * sizeof(float));
}

static void run_release(struct run *r)
{
	sfw_free(r->after_prefix), sfw_free(r->after_rest);
}

static int run_same(const struct run *a, const struct run *b, int V)
{
	return !memcmp(a->after_prefix, b->after_prefix, (size_t)V * 4) &&
	       !memcmp(a->after_rest, b->after_rest, (size_t)V * 4) && a->first == b->first &&
	       !memcmp(a->tokens, b->tokens, sizeof(a->tokens)) &&
	       !memcmp(a->modes, b->modes, sizeof(a->modes)) &&
	       !memcmp(a->blocks, b->blocks, sizeof(a->blocks));
}

/* A (prefix as one call, save, the rest) against B (load, the rest). */
static void same_calls(struct sfw_model *m, const int32_t *ids, size_t P, size_t S, int das, struct mem *st)
{
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size;
	struct sfw_err err = {0};
	struct sfw_op_sample_params gp = {0};
	gp.greedy = 1, gp.top_p = 1;
	struct sfw_ctx *a = new_ctx(m, das, 0), *b = new_ctx(m, das, 0);
	struct run ra, rb;
	run_init(&ra, V), run_init(&rb, V);
	int32_t next = -1, nb = -2;
	CHECK(sfw_ctx_prefill_next(a, ids, P, &gp, 0.5, &next, &err) == SFW_OK, "prefix: %s", err.msg);
	st->n = 0;
	CHECK(sfw_ctx_state_save(a, BIND, ids, P, mem_write, st, &err) == SFW_OK, "save: %s", err.msg);
	int64_t got = -1;
	CHECK(load(b, st, ids, P + S, &got, &err) == SFW_OK && got == (int64_t)P &&
		  sfw_ctx_pos(b) == (int64_t)P,
	      "P=%zu: load: %lld tokens: %s", P, (long long)got, err.msg);
	tail(a, ids, P, S, V, &ra);
	tail(b, ids, P, S, V, &rb);
	CHECK(ra.first == next, "P=%zu: next_from_last is prefill_next's choice", P);
	CHECK(run_same(&ra, &rb, V),
	      "P=%zu S=%zu das=%d: a loaded state gives the logits, choices and notes of the "
	      "same calls bit for bit",
	      P, S, das);
	if (P > (size_t)cf->sparse_dense_len || das)
		CHECK(ra.modes[0] == 1 && rb.modes[0] == 1, "P=%zu: the prefix call selected blocks", P);
	/* the exact prompt: everything loads, the first token from the state */
	struct sfw_ctx *c = new_ctx(m, das, 0);
	CHECK(load(c, st, ids, P, &got, &err) == SFW_OK && got == (int64_t)P, "exact prompt loads: %s",
	      err.msg);
	CHECK(sfw_ctx_next_from_last(c, &gp, 0.5, &nb, &err) == SFW_OK && nb == next,
	      "exact prompt: the first token is the uncached one (%d, %d)", (int)nb, (int)next);
	sfw_ctx_free(c);
	run_release(&ra), run_release(&rb);
	sfw_ctx_free(a), sfw_ctx_free(b);
}

/* A failed load leaves c at position 0, and c then prefills as a fresh
 * context does. */
static void misfit(struct sfw_model *m, struct mem *st, const int32_t *ids, size_t n, const float *fresh,
		   const char *what)
{
	struct sfw_ctx *c = new_ctx(m, 0, 0);
	struct sfw_err err = {0};
	int64_t got = -1;
	enum sfw_status s = load(c, st, ids, n, &got, &err);
	CHECK(s != SFW_OK && got == 0 && sfw_ctx_pos(c) == 0, "%s: refused (%s)", what, err.msg);
	float *l = sfw_malloc((size_t)sfw_model_config(m)->vocab_size * 4);
	CHECK(sfw_ctx_prefill(c, ids, 40, l, &err) == SFW_OK &&
		  !memcmp(l, fresh, (size_t)sfw_model_config(m)->vocab_size * 4),
	      "%s: then prefilled from scratch as a fresh context", what);
	sfw_free(l);
	sfw_ctx_free(c);
}

static void misfits(struct sfw_model *m, const int32_t *ids)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sfw_err err = {0};
	struct mem st = {0}, bad = {0};
	struct sfw_op_sample_params gp = {0};
	gp.greedy = 1, gp.top_p = 1;
	float *fresh = sfw_malloc((size_t)V * 4);
	struct sfw_ctx *a = new_ctx(m, 0, 0);
	CHECK(sfw_ctx_prefill(a, ids, 40, fresh, &err) == SFW_OK, "fresh: %s", err.msg);
	sfw_ctx_reset(a);
	int32_t next;
	const size_t P = 90;
	CHECK(sfw_ctx_prefill_next(a, ids, P, &gp, 0.5, &next, &err) == SFW_OK, "prefix: %s", err.msg);
	CHECK(sfw_ctx_state_save(a, BIND, ids, P - 1, mem_write, &st, &err) == SFW_E_INVAL,
	      "save: the count must be "
	      "the context's");
	CHECK(sfw_ctx_state_save(a, BIND, ids, P, mem_write, &st, &err) == SFW_OK, "save: %s", err.msg);
	/* not an extension: nothing loaded, no error */
	int32_t *other = sfw_malloc(NTOK * sizeof(int32_t));
	memcpy(other, ids, NTOK * sizeof(int32_t));
	other[5] ^= 1;
	struct sfw_ctx *c = new_ctx(m, 0, 0);
	int64_t got = -1;
	CHECK(load(c, &st, other, NTOK, &got, &err) == SFW_OK && got == 0 && sfw_ctx_pos(c) == 0,
	      "a prompt that differs at 5: nothing loaded");
	CHECK(load(c, &st, ids, P - 1, &got, &err) == SFW_OK && got == 0, "a shorter prompt: nothing loaded");
	uint8_t b2[32] = {9};
	st.at = 0;
	CHECK(sfw_ctx_state_load(c, b2, ids, NTOK, mem_read, &st, &got, &err) == SFW_E_FORMAT && got == 0,
	      "another binding: %s", err.msg);
	sfw_ctx_free(c);
	c = new_ctx(m, 1, 0);
	CHECK(load(c, &st, ids, NTOK, &got, &err) == SFW_E_FORMAT, "--dense-as-sparse differs: %s", err.msg);
	sfw_ctx_free(c);
	c = new_ctx(m, 0, 64); /* 90 tokens: two pieces of 64, one of 256 */
	CHECK(load(c, &st, ids, NTOK, &got, &err) == SFW_E_FORMAT, "other prefill pieces: %s", err.msg);
	sfw_ctx_free(c);
	c = new_ctx(m, 0, 128); /* one piece under both */
	CHECK(load(c, &st, ids, NTOK, &got, &err) == SFW_OK && got == (int64_t)P,
	      "a chunk that cuts no piece: loads");
	sfw_ctx_free(c);
	/* truncations: every length through the header and ids, samples after */
	bad.p = sfw_malloc(st.n + 1), bad.cap = st.n + 1;
	for (size_t k = 0; k < st.n; k += k < 700 ? 1 : 997) {
		memcpy(bad.p, st.p, k);
		bad.n = k;
		c = new_ctx(m, 0, 0);
		enum sfw_status s = load(c, &bad, ids, NTOK, &got, &err);
		if (s == SFW_OK || got != 0 || sfw_ctx_pos(c) != 0)
			CHECK(0, "truncated to %zu bytes: loaded", k);
		sfw_ctx_free(c);
	}
	CHECK(1, "every truncation refused");
	memcpy(bad.p, st.p, st.n);
	bad.p[st.n] = 0, bad.n = st.n + 1;
	misfit(m, &bad, ids, NTOK, fresh, "a trailing byte");
	/* one flipped byte in the header, the ids, early and late payload, the sum */
	size_t at[] = {20, 130, 256 + 4, 256 + 4 * P + 100, st.n / 2, st.n - 12, st.n - 3};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		memcpy(bad.p, st.p, st.n);
		bad.n = st.n;
		bad.p[at[i]] ^= 0x10;
		char what[64];
		snprintf(what, sizeof(what), "byte %zu of %zu flipped", at[i], st.n);
		misfit(m, &bad, ids, NTOK, fresh, what);
	}
	/* a NaN in the payload under a checksum that holds */
	memcpy(bad.p, st.p, st.n);
	bad.n = st.n;
	size_t p0 = 256 + 4 * P, pl = st.n - p0 - SFWI_SUM;
	memcpy(bad.p + p0 + 64, "\x00\x00\xc0\x7f", 4);
	sfwi_sum(bad.p + p0, pl, bad.p + st.n - SFWI_SUM);
	misfit(m, &bad, ids, NTOK, fresh, "a NaN under a valid checksum");
	/* saved without logits: a longer prompt loads, the exact one does not */
	sfw_ctx_reset(a);
	CHECK(sfw_ctx_prefill(a, ids, P, NULL, &err) == SFW_OK, "prefix without logits");
	int32_t dummy;
	CHECK(sfw_ctx_next_from_last(a, &gp, 0.5, &dummy, &err) == SFW_E_INVAL, "no logits to choose from");
	st.n = 0;
	CHECK(sfw_ctx_state_save(a, BIND, ids, P, mem_write, &st, &err) == SFW_OK, "save without logits");
	c = new_ctx(m, 0, 0);
	CHECK(load(c, &st, ids, P, &got, &err) == SFW_OK && got == 0,
	      "without logits: the exact prompt is not loaded");
	CHECK(load(c, &st, ids, P + 1, &got, &err) == SFW_OK && got == (int64_t)P,
	      "without logits: an extension loads");
	sfw_ctx_free(c);
	sfw_ctx_free(a);
	sfw_free(other), sfw_free(fresh);
	free(st.p), sfw_free(bad.p);
}

/* The fp8 K/V cache's states (m8: the model with --kv-cache fp8, m the same
 * with bf16): the same calls bit for bit; another K/V kind refused; the
 * fp8 layout's values checked under a valid checksum. */
static void kv8_states(struct sfw_model *m, struct sfw_model *m8, const int32_t *ids, struct mem *st)
{
	same_calls(m8, ids, 600, 40, 0, st);
	same_calls(m8, ids, 100, 30, 0, st); /* 100 = 3 groups of 32 and 4 rows */
	same_calls(m8, ids, 150, 20, 1, st);
	/* st: m8's 150-token state (--dense-as-sparse) */
	uint32_t kv = (uint32_t)st->p[164] | (uint32_t)st->p[165] << 8;
	CHECK(kv == (CS_DEVICE == SFW_DEVICE_CPU ? SFWI_STATE_KV_ROUNDED : SFWI_STATE_KV_FP8),
	      "the header names the K/V kind (%u)", kv);
	struct sfw_err err = {0};
	int64_t got = -1;
	struct sfw_ctx *c = new_ctx(m, 1, 0);
	CHECK(load(c, st, ids, NTOK, &got, &err) == SFW_E_FORMAT && got == 0 &&
		  strstr(err.msg, "made with --kv-cache fp8 (") && strstr(err.msg, "), not bf16"),
	      "an fp8 state into a bf16 context: %s", err.msg);
	sfw_ctx_free(c);
	if (kv != SFWI_STATE_KV_FP8)
		return;
	/* layer 0 is sparse: its K section starts the payload, codes first;
	 * its first group's scales follow 32 * nkv * hd code bytes */
	const struct sfw_config *cf = sfw_model_config(m8);
	size_t p0 = 256 + 4 * 150, pl = st->n - p0 - SFWI_SUM;
	size_t sc = p0 + (size_t)32 * cf->num_key_value_heads * cf->head_dim;
	struct mem bad = {sfw_malloc(st->n), st->n, st->n, 0};
	const struct {
		size_t at;
		uint8_t v;
		const char *what;
	} cases[] = {{p0 + 5, 0x7f, "a NaN code"}, {p0 + 5, 0xff, "a negative NaN code"}, {sc + 3, 0x80, "a negative scale"},
		     {sc + 3, 0x7f, "an infinite scale"}};
	for (size_t i = 0; bad.p && i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(bad.p, st->p, st->n);
		bad.p[cases[i].at] = cases[i].v;
		if (cases[i].v == 0x7f && cases[i].at == sc + 3)
			bad.p[sc + 2] = 0x80; /* 0x7f80_0000: infinity */
		sfwi_sum(bad.p + p0, pl, bad.p + st->n - SFWI_SUM);
		bad.at = 0;
		c = new_ctx(m8, 1, 0);
		enum sfw_status s = load(c, &bad, ids, NTOK, &got, &err);
		CHECK(s == SFW_E_FORMAT && got == 0 && sfw_ctx_pos(c) == 0, "%s under a valid checksum: %s", cases[i].what,
		      err.msg);
		sfw_ctx_free(c);
	}
	sfw_free(bad.p);
}

/* The sums against Python's hashlib.blake2b(b"123456789", digest_size=16),
 * in one piece and in two. */
static void sum_checks(void)
{
	static const uint8_t want[SFWI_SUM] = {0xc1, 0xc6, 0xea, 0x5f, 0x2b, 0xe4, 0x36, 0xe7,
					      0x49, 0xf3, 0x65, 0xb4, 0x50, 0xcf, 0xb6, 0x75};
	uint8_t one[SFWI_SUM], two[SFWI_SUM];
	sfwi_sum("123456789", 9, one);
	struct sfwi_sum s;
	sfwi_sum_init(&s);
	sfwi_sum_update(&s, "1234", 4);
	sfwi_sum_update(&s, "56789", 5);
	sfwi_sum_final(&s, two);
	CHECK(!memcmp(one, want, SFWI_SUM), "BLAKE2b-128 check value");
	CHECK(!memcmp(two, want, SFWI_SUM), "BLAKE2b-128 in pieces");
}

int main(void)
{
	sum_checks();
	char tmp[4096], dir[4200];
	snprintf(tmp, sizeof(tmp), "%s/salafw-cs.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		CHECK(0, "mkdtemp");
		return CHECK_REPORT(CS_NAME);
	}
	snprintf(dir, sizeof(dir), "%s/tiny", tmp);
	struct sfw_err err = {0};
	struct sfw_mkmodel_params mp = {.preset = SFW_MKMODEL_TINY, .seed = 3, .no_tokenizer = 1};
	CHECK(sfw_mkmodel(dir, &mp, &err) == SFW_OK, "mkmodel tiny: %s", err.msg);
	struct sfw_model_params p = sfw_model_default_params();
	p.device = CS_DEVICE;
	struct sfw_model *m = NULL;
	if (sfw_model_load(dir, &p, &m, &err) != SFW_OK) {
		CHECK(0, "load: %s", err.msg);
		return CHECK_REPORT(CS_NAME);
	}
	const struct sfw_config *cf = sfw_model_config(m);
	int32_t ids[NTOK];
	uint64_t x = 12345;
	for (int i = 0; i < NTOK; i++) { /* ids below the special tokens */
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (int32_t)((x >> 33) % (uint64_t)(cf->vocab_size - 8));
	}
	struct mem st = {0};
	same_calls(m, ids, 600, 40, 0, &st);
	same_calls(m, ids, 100, 30, 0, &st);
	same_calls(m, ids, 300, 1, 0, &st);
	same_calls(m, ids, 150, 20, 1, &st);
	misfits(m, ids);
	struct sfw_model *m8 = NULL;
	p.kv_cache = SFW_KV_CACHE_FP8;
	if (sfw_model_load(dir, &p, &m8, &err) == SFW_OK) {
		kv8_states(m, m8, ids, &st);
		sfw_model_free(m8);
	} else {
		CHECK(0, "load with --kv-cache fp8: %s", err.msg);
	}
	free(st.p);
	sfw_model_free(m);
	char cmd[8500];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", tmp);
	return CHECK_REPORT(CS_NAME);
}
