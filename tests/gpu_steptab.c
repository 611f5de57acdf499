/* modules: kernels num core */
/* gpu_steptab.c - the batched decode ops as a recorded step of many
 * sequences runs them (kernels/ops_cuda.h, struct sfw_cuda_seqs): one CUDA
 * graph recorded once for a bucket of 8 rows, replayed for three different
 * sets of sequences (5 sequences, then 3 others, then all 8 in another
 * order with one of them selecting blocks), only the device tables written
 * in between. Each replay is compared bit for bit with the same ops
 * launched unrecorded, as an unrecorded step runs them (the route
 * gpu_backend_ops holds to the CPU twins): tables of exactly the set's
 * sequences, no padding, written before the ops, the dense attention's
 * table listing only the rows that do not select (their rows by the row
 * table); on a copy of the same data: the paged K/V pools after the
 * append, the compressed keys (in the same blocks), the lightning states,
 * the dense attention and GLA outputs, the normed and rotated q/k.
 * The rows past a set's sequences (padding) and the dense attention of the
 * selecting row must stay untouched (their outputs keep a sentinel; the
 * pools, keys and states equal the unrecorded route's, which never saw
 * them). Every set has a sequence at the bound's last position, so both
 * routes plan the attention's splits alike (a recorded step plans for its
 * bound; a shorter plan sums in another order). */
#include "check.h"
#include "lib/rng.h"

#include "kernels/ops_cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 8     /* the bucket */
#define NSEQ 8     /* sequences */
#define BLK 64     /* tokens per KV block */
#define SHIFT 6
#define SEQBLK 6   /* blocks per sequence */
#define NBLK 64    /* the pool */
#define NKV 2
#define HD 128
#define NH 8       /* dense attention heads */
#define LNH 4      /* lightning heads (HD each) */
#define KS 32
#define KST 16

static const int64_t BOUND = (int64_t)SEQBLK * BLK; /* every sequence's room, and the launch's bound */
static const size_t KROW = (size_t)NKV * HD; /* elements of one token's K (or V) */
/* the pool's compressed keys: per block, BLK / KST level-1 rows, then
 * BLK / (4 KST) level-2 rows (kernels/ops.h sfw_ckey_row) */
static const int64_t CKR = BLK / KST + BLK / (4 * KST);
static const size_t C2OFF = (size_t)(BLK / KST) * NKV * HD * 2; /* level 2's base, bytes past level 1's */

static void *dmalloc(size_t n)
{
	void *p = NULL;
	struct sfw_err e = {0};
	if (sfw_cuda_malloc(&p, n, "test", &e) != SFW_OK) {
		CHECK(0, "device memory: %s", e.msg);
		return NULL;
	}
	return p;
}

/* Both routes' copy of one mutable buffer: a (unrecorded) and b (recorded). */
struct pair {
	void *a, *b;
	size_t bytes;
};

static void pair_new(struct pair *p, size_t bytes, int f32, uint64_t seed, float scale)
{
	p->bytes = bytes;
	p->a = dmalloc(bytes), p->b = dmalloc(bytes);
	if (!p->a || !p->b) {
		sfw_cuda_free(p->a), sfw_cuda_free(p->b);
		p->a = p->b = NULL;
		return;
	}
	if (f32)
		sfw_cuda_fill_f32(p->a, bytes / 4, seed, scale, NULL);
	else
		sfw_cuda_fill_bf16(p->a, bytes / 2, seed, scale, NULL);
	sfw_cuda_d2d(p->b, p->a, bytes, NULL);
}

static void pair_free(struct pair *p)
{
	sfw_cuda_free(p->a);
	sfw_cuda_free(p->b);
}

/* 1 when bytes [off, off + n) of the two copies are equal. */
static int pair_same(const struct pair *p, size_t off, size_t n)
{
	unsigned char *x = malloc(n), *y = malloc(n);
	int same = 0;
	if (x && y) {
		sfw_cuda_d2h(x, (const char *)p->a + off, n, NULL);
		sfw_cuda_d2h(y, (const char *)p->b + off, n, NULL);
		sfw_cuda_sync(NULL);
		same = !memcmp(x, y, n);
	}
	free(x), free(y);
	return same;
}

/* 1 when bytes [off, off + n) of d all hold the sentinel byte 0xff. */
static int untouched(const void *d, size_t off, size_t n)
{
	unsigned char *x = malloc(n);
	int ok = x != NULL;
	if (x) {
		sfw_cuda_d2h(x, (const char *)d + off, n, NULL);
		sfw_cuda_sync(NULL);
		for (size_t i = 0; i < n && ok; i++)
			ok = x[i] == 0xff;
	}
	free(x);
	return ok;
}

/* An unrecorded launch's tables: n sequences, sequence i at pos[i] in row
 * row[i] with block table tab[i], every pointer column filled (a layer of
 * the recording's layout) from cols[j][i], written to dt and dp. */
static void put_tables(struct sfw_cuda_steptab *dt, void **dp, int n, const int64_t *pos, const int *row,
		       int32_t *const *tab, void *const (*cols)[ROWS], void *s)
{
	struct sfw_cuda_steptab ht;
	void *hp[SFW_CUDA_LN * ROWS];
	memset(&ht, 0, sizeof(ht));
	memset(hp, 0, sizeof(hp));
	ht.n = n, ht.shift = SHIFT;
	for (int i = 0; i < n; i++) {
		ht.pos[i] = pos[i], ht.row[i] = row[i], ht.tab[i] = tab[i];
		for (int j = 0; j < SFW_CUDA_LN; j++)
			hp[j * n + i] = cols[j][i];
	}
	sfw_cuda_h2d(dt, &ht, sizeof(ht), s);
	sfw_cuda_h2d(dp, hp, sizeof(hp), s);
}

struct set {
	const char *what;
	int n;
	int seq[ROWS];
	int64_t pos[ROWS];
	int selecting; /* row whose sparse layer selects blocks (no dense attention), -1 none */
};

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "no GPU: %s", err.msg);
		return CHECK_REPORT("gpu_steptab");
	}
	void *s = NULL;
	struct sfw_cuda_ctx *cx = NULL;
	if (sfw_cuda_stream_new(&s, &err) != SFW_OK || sfw_cuda_ctx_new(s, &cx, &err) != SFW_OK) {
		CHECK(0, "stream: %s", err.msg);
		return CHECK_REPORT("gpu_steptab");
	}
	const size_t ld = (size_t)LNH * HD, qd = (size_t)NH * HD, sbytes = (size_t)LNH * HD * HD * 4;
	/* the mutable state, one copy per route */
	struct pair K, V, C, st[NSEQ], oatt, ogla, ql, kl;
	pair_new(&K, (size_t)NBLK * BLK * KROW * 2, 0, 1, 1.0f);
	pair_new(&V, (size_t)NBLK * BLK * KROW * 2, 0, 2, 1.0f);
	pair_new(&C, (size_t)NBLK * CKR * KROW * 2, 0, 10, 1.0f); /* the compressed keys, in the pool's blocks */
	for (int i = 0; i < NSEQ; i++)
		pair_new(&st[i], sbytes, 1, 30 + (uint64_t)i, 0.05f);
	pair_new(&oatt, ROWS * qd * 2, 0, 3, 1.0f);
	pair_new(&ogla, ROWS * ld * 2, 0, 4, 1.0f);
	pair_new(&ql, ROWS * ld * 2, 0, 5, 1.0f);
	pair_new(&kl, ROWS * ld * 2, 0, 6, 1.0f);
	/* the inputs, shared */
	void *q = dmalloc(ROWS * qd * 2), *kn = dmalloc(ROWS * KROW * 2), *vn = dmalloc(ROWS * KROW * 2);
	void *vl = dmalloc(ROWS * ld * 2), *ql0 = dmalloc(ROWS * ld * 2), *kl0 = dmalloc(ROWS * ld * 2);
	void *qw = dmalloc(HD * 2), *kw = dmalloc(HD * 2);
	float *decay = dmalloc(LNH * 4);
	int ok = q && kn && vn && vl && ql0 && kl0 && qw && kw && decay && K.b && V.b && C.b && oatt.b && ogla.b && ql.b &&
		 kl.b;
	for (int i = 0; i < NSEQ; i++)
		ok &= st[i].b != NULL; /* pair_new: both copies or none (a failed CHECK) */
	if (ok) {
		sfw_cuda_fill_bf16(q, ROWS * qd, 7, 1.0f, NULL);
		sfw_cuda_fill_bf16(kn, ROWS * KROW, 8, 1.0f, NULL);
		sfw_cuda_fill_bf16(vn, ROWS * KROW, 9, 1.0f, NULL);
		sfw_cuda_fill_bf16(vl, ROWS * ld, 11, 1.0f, NULL);
		sfw_cuda_fill_bf16(ql0, ROWS * ld, 12, 1.0f, NULL);
		sfw_cuda_fill_bf16(kl0, ROWS * ld, 13, 1.0f, NULL);
		sfw_cuda_fill_bf16(qw, HD, 14, 1.0f, NULL);
		sfw_cuda_fill_bf16(kw, HD, 15, 1.0f, NULL);
		float hdec[LNH];
		for (int h = 0; h < LNH; h++)
			hdec[h] = 0.05f + 0.3f * (float)h;
		sfw_cuda_h2d(decay, hdec, sizeof(hdec), NULL);
	}
	/* every sequence's blocks: distinct places of the pool, shuffled */
	int32_t perm[NBLK];
	uint64_t rng = 0x243f6a8885a308d3ull;
	sfwt_iota_shuffle(perm, NBLK, &rng);
	int32_t *tab[NSEQ];
	for (int i = 0; i < NSEQ; i++) {
		tab[i] = dmalloc(SEQBLK * sizeof(int32_t));
		ok &= tab[i] != NULL;
		if (tab[i])
			sfw_cuda_h2d(tab[i], perm + i * SEQBLK, SEQBLK * sizeof(int32_t), NULL);
	}
	/* the recording's tables, the unrecorded launches' (all the set's
	 * sequences; the dense attention's rows) */
	struct sfw_cuda_steptab *dst = dmalloc(sizeof(*dst)), *dua = dmalloc(sizeof(*dua)), *dud = dmalloc(sizeof(*dud));
	void **dsp = dmalloc((size_t)SFW_CUDA_LN * ROWS * sizeof(void *));
	void **dpa = dmalloc((size_t)SFW_CUDA_LN * ROWS * sizeof(void *));
	void **dpd = dmalloc((size_t)SFW_CUDA_LN * ROWS * sizeof(void *));
	ok &= dst && dsp && dua && dud && dpa && dpd;
	sfw_cuda_sync(NULL);
	if (!ok)
		return CHECK_REPORT("gpu_steptab");
	const float scale = 1.0f / sqrtf((float)HD);
	const struct sfw_attn_shape ash = {ROWS, NH, NKV, HD, 0, scale, 0, 0};
	const struct sfw_gla_shape gsh = {ROWS, LNH, HD, scale, 0};
	const enum sfw_dtype bf = SFW_DTYPE_BF16;
	const struct sfw_qk_shape qsh = {ROWS, LNH, LNH, HD, 1e-6f, 1, 0, 10000.0f, bf, bf};
	/* the attention's split scratch taken before the recording (it may not
	 * allocate inside one): a pure op, 8 rows at the bound */
	{
		int64_t wpos[ROWS];
		int wrow[ROWS];
		void *wc[SFW_CUDA_LN][ROWS];
		memset(wc, 0, sizeof(wc));
		for (int i = 0; i < ROWS; i++)
			wpos[i] = BOUND - 1, wrow[i] = i, wc[SFW_CUDA_LAK][i] = K.a, wc[SFW_CUDA_LAV][i] = V.a;
		put_tables(dud, dpd, ROWS, wpos, wrow, tab, wc, s);
		struct sfw_cuda_seqs w = {ROWS, BOUND - 1, dud, (void *const *)dpd, 0, {SFW_CUDA_LAK, SFW_CUDA_LAV, 0}, 0};
		sfw_cuda_attn_dense_seqs(oatt.a, q, &w, &ash, SFW_DTYPE_BF16, cx);
		sfw_cuda_sync(s);
	}

	/* the step, recorded once: append, compression, dense attention; q/k
	 * norm + RoPE, GLA; all over the bucket's rows, layer 0 of the table */
	struct sfw_cuda_seqs t = {ROWS, BOUND - 1, dst, (void *const *)dsp, 0, {0, 0, 0}, 0}; /* the bound: the last position */
	sfw_cuda_graph_begin(s);
	t.pf[0] = SFW_CUDA_LK, t.pf[1] = SFW_CUDA_LV;
	sfw_cuda_kv_append_seqs(&t, kn, vn, NKV, HD, SFW_DTYPE_BF16, cx);
	t.pf[0] = SFW_CUDA_LC1, t.pf[1] = SFW_CUDA_LC2, t.pf[2] = SFW_CUDA_LK;
	sfw_cuda_compress_seqs(&t, NKV, HD, KS, KST, SFW_DTYPE_BF16, cx);
	t.pf[0] = SFW_CUDA_LAK, t.pf[1] = SFW_CUDA_LAV;
	sfw_cuda_attn_dense_seqs(oatt.b, q, &t, &ash, SFW_DTYPE_BF16, cx);
	sfw_cuda_qk_norm_rope_seqs(ql.b, kl.b, qw, kw, &t, &qsh, SFW_DTYPE_BF16, cx);
	t.pf[0] = SFW_CUDA_LSTATE;
	sfw_cuda_gla_seqs(ogla.b, ql.b, kl.b, vl, &t, decay, &gsh, SFW_DTYPE_BF16, cx);
	void *g = NULL;
	CHECK(sfw_cuda_graph_end(s, &g, &err) == SFW_OK, "the step recorded: %s", err.msg);

	static const struct set sets[3] = {
	    {"5 sequences (3 padding rows)", 5, {0, 1, 2, 3, 4}, {BOUND - 1, 10, 200, 64, 300}, -1},
	    {"3 others (5 padding rows)", 3, {5, 6, 7}, {100, BOUND - 1, 31}, -1},
	    {"all 8 reordered, row 2 selecting", 8, {3, 0, 6, 1, 7, 2, 5, 4}, {BOUND - 1, 50, 250, 127, 128, 15, 47, 350}, 2},
	};
	for (int si = 0; g && si < 3; si++) {
		const struct set *z = &sets[si];
		/* outputs to the sentinel, the in-place q/k back to their inputs */
		sfw_cuda_memset(oatt.a, 0xff, oatt.bytes, s), sfw_cuda_memset(oatt.b, 0xff, oatt.bytes, s);
		sfw_cuda_memset(ogla.a, 0xff, ogla.bytes, s), sfw_cuda_memset(ogla.b, 0xff, ogla.bytes, s);
		sfw_cuda_d2d(ql.a, ql0, ql.bytes, s), sfw_cuda_d2d(ql.b, ql0, ql.bytes, s);
		sfw_cuda_d2d(kl.a, kl0, kl.bytes, s), sfw_cuda_d2d(kl.b, kl0, kl.bytes, s);
		/* the step table route: the replay's tables, then the graph */
		struct sfw_cuda_steptab ht;
		void *hp[SFW_CUDA_LN][ROWS];
		memset(&ht, 0, sizeof(ht));
		memset(hp, 0, sizeof(hp));
		ht.n = z->n, ht.shift = SHIFT;
		for (int i = 0; i < ROWS; i++)
			ht.row[i] = i;
		for (int i = 0; i < z->n; i++) {
			int q_ = z->seq[i];
			ht.pos[i] = z->pos[i], ht.tab[i] = tab[q_];
			hp[SFW_CUDA_LK][i] = K.b, hp[SFW_CUDA_LV][i] = V.b;
			hp[SFW_CUDA_LC1][i] = C.b, hp[SFW_CUDA_LC2][i] = (char *)C.b + C2OFF;
			hp[SFW_CUDA_LSTATE][i] = st[q_].b;
			if (i != z->selecting)
				hp[SFW_CUDA_LAK][i] = K.b, hp[SFW_CUDA_LAV][i] = V.b;
		}
		sfw_cuda_h2d(dst, &ht, sizeof(ht), s);
		sfw_cuda_h2d(dsp, hp, sizeof(hp), s);
		sfw_cuda_graph_launch(g, s);
		/* the unrecorded route on the other copies: the set's sequences
		 * alone, each in its row */
		int64_t upos[ROWS], dpos[ROWS];
		int urow[ROWS], drow[ROWS], nd = 0;
		int32_t *utab[ROWS], *dtab[ROWS];
		void *uc[SFW_CUDA_LN][ROWS], *dc[SFW_CUDA_LN][ROWS];
		memset(uc, 0, sizeof(uc));
		memset(dc, 0, sizeof(dc));
		for (int i = 0; i < z->n; i++) {
			upos[i] = z->pos[i], urow[i] = i, utab[i] = tab[z->seq[i]];
			uc[SFW_CUDA_LK][i] = K.a, uc[SFW_CUDA_LV][i] = V.a;
			uc[SFW_CUDA_LC1][i] = C.a, uc[SFW_CUDA_LC2][i] = (char *)C.a + C2OFF;
			uc[SFW_CUDA_LSTATE][i] = st[z->seq[i]].a;
			if (i != z->selecting) { /* dense attention: the rows that do not select */
				dpos[nd] = z->pos[i], drow[nd] = i, dtab[nd] = tab[z->seq[i]];
				dc[SFW_CUDA_LAK][nd] = K.a, dc[SFW_CUDA_LAV][nd] = V.a;
				nd++;
			}
		}
		put_tables(dua, dpa, z->n, upos, urow, utab, uc, s);
		put_tables(dud, dpd, nd, dpos, drow, dtab, dc, s);
		int64_t umax = 0, dmax = 0;
		for (int i = 0; i < z->n; i++)
			umax = upos[i] > umax ? upos[i] : umax;
		for (int i = 0; i < nd; i++)
			dmax = dpos[i] > dmax ? dpos[i] : dmax;
		struct sfw_cuda_seqs u = {z->n, umax, dua, (void *const *)dpa, 0, {SFW_CUDA_LK, SFW_CUDA_LV, 0}, 0};
		sfw_cuda_kv_append_seqs(&u, kn, vn, NKV, HD, SFW_DTYPE_BF16, cx);
		u.pf[0] = SFW_CUDA_LC1, u.pf[1] = SFW_CUDA_LC2, u.pf[2] = SFW_CUDA_LK;
		sfw_cuda_compress_seqs(&u, NKV, HD, KS, KST, SFW_DTYPE_BF16, cx);
		struct sfw_cuda_seqs d = {nd, dmax, dud, (void *const *)dpd, 0, {SFW_CUDA_LAK, SFW_CUDA_LAV, 0}, 0};
		sfw_cuda_attn_dense_seqs(oatt.a, q, &d, &ash, SFW_DTYPE_BF16, cx);
		sfw_cuda_qk_norm_rope_seqs(ql.a, kl.a, qw, kw, &u, &qsh, SFW_DTYPE_BF16, cx);
		u.pf[0] = SFW_CUDA_LSTATE;
		sfw_cuda_gla_seqs(ogla.a, ql.a, kl.a, vl, &u, decay, &gsh, SFW_DTYPE_BF16, cx);
		sfw_cuda_sync(s);

		printf("%s:\n", z->what);
		CHECK(pair_same(&K, 0, K.bytes) && pair_same(&V, 0, V.bytes),
		      "%s: the K/V pools after the append equal the unrecorded route's", z->what);
		int keys = pair_same(&C, 0, C.bytes), states = 1;
		for (int i = 0; i < NSEQ; i++)
			states &= pair_same(&st[i], 0, st[i].bytes);
		CHECK(keys, "%s: the compressed keys equal the unrecorded route's", z->what);
		CHECK(states, "%s: the lightning states equal the unrecorded route's", z->what);
		for (int i = 0; i < z->n; i++) {
			if (i == z->selecting)
				CHECK(untouched(oatt.b, (size_t)i * qd * 2, qd * 2),
				      "%s: row %d (selecting blocks) has no dense attention output", z->what, i);
			else
				CHECK(pair_same(&oatt, (size_t)i * qd * 2, qd * 2), "%s: row %d's dense attention is the same",
				      z->what, i);
			CHECK(pair_same(&ql, (size_t)i * ld * 2, ld * 2) && pair_same(&kl, (size_t)i * ld * 2, ld * 2),
			      "%s: row %d's q/k norm + RoPE is the same", z->what, i);
			CHECK(pair_same(&ogla, (size_t)i * ld * 2, ld * 2), "%s: row %d's GLA output is the same", z->what, i);
		}
		for (int i = z->n; i < ROWS; i++)
			CHECK(untouched(oatt.b, (size_t)i * qd * 2, qd * 2) && untouched(ogla.b, (size_t)i * ld * 2, ld * 2),
			      "%s: padding row %d left alone", z->what, i);
	}
	if (g)
		sfw_cuda_graph_free(g);
	pair_free(&K), pair_free(&V), pair_free(&C), pair_free(&oatt), pair_free(&ogla), pair_free(&ql), pair_free(&kl);
	for (int i = 0; i < NSEQ; i++)
		pair_free(&st[i]), sfw_cuda_free(tab[i]);
	sfw_cuda_free(q), sfw_cuda_free(kn), sfw_cuda_free(vn), sfw_cuda_free(vl), sfw_cuda_free(ql0);
	sfw_cuda_free(kl0), sfw_cuda_free(qw), sfw_cuda_free(kw), sfw_cuda_free(decay), sfw_cuda_free(dst);
	sfw_cuda_free(dsp), sfw_cuda_free(dua), sfw_cuda_free(dud), sfw_cuda_free(dpa), sfw_cuda_free(dpd);
	sfw_cuda_ctx_free(cx);
	sfw_cuda_stream_free(s);
	return CHECK_REPORT("gpu_steptab");
}
