/* wide_ref.h - the CPU side of tests/gpu_wide.c, computed ahead: the wide4
 * model (mkmodel --preset wide4: the real widths in 4 layers S L L S) fed a
 * 12,288-token prompt, then 8 greedy decode steps, on the CPU engine
 * (scripts/wide-ref.sh runs `test_wide --write-ref`), for the bf16 model and
 * for its `salafw quant --method rtn --group 128` int8 copy. The results go to
 * tests/data/gpu_wide/wide4-{bf16,int8}.ref (committed); test_wide checks that
 * they parse and match the preset, gpu_wide compares the CUDA engine with them.
 *
 * Rows: row 0 is the logits of the prompt's last position, row i (1..8) those
 * after decode step i, which feeds the greedy token of row i-1. A full row is
 * 73,448 floats (287 KiB), so a file keeps, for every row: the top WIDE_TOPN
 * logits (ids and values, by descending value, lower id first on ties) and
 * every WIDE_STRIDE-th logit (ids 0, 16, 32, ...); and the full rows 0 and
 * WIDE_STEPS. Then the greedy tokens (argmax of each row, lowest id on
 * ties), and per row and sparse layer the blocks selected for the last
 * position (sfw_ctx_last_blocks: nkv x k, ascending, -1 unused) with the
 * pooled block scores the selection ranked (the "block_score" tap:
 * nkv x nblocks; +inf forced, -inf no chunk; NaN pads to nb).
 *
 * The CPU run takes the prompt as two calls, 12,287 tokens then the last one,
 * so that the block-score tap (which makes every row of a call compute its
 * logits) is on for one row only: the same arithmetic per row as one call
 * (prefill is cut into pieces anyway), up to float32 summation order.
 *
 * File: 16 little-endian int64 (magic, tokens, steps, V, L, nkv, k, nb, topn,
 * stride, int8 flag, prompt hash, CPU milliseconds, sparse layer mask, 0, 0),
 * then, per row, topn int32 ids, topn float values, ceil(V / stride) floats;
 * 2 full rows of V floats; steps + 1 int32 tokens; per row and layer nkv * k
 * int32 blocks (all -1 for a lightning layer), int32 nblocks (0 for a
 * lightning layer), nkv * nb float scores. Written to a temporary name and
 * renamed; read with every field bounded and the size checked exactly. */
#ifndef SFW_WIDE_REF_H
#define SFW_WIDE_REF_H

#include "runner/runner.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIDE_TOKENS 12288
#define WIDE_STEPS 8
#define WIDE_ROWS (WIDE_STEPS + 1)
#define WIDE_TOPN 64
#define WIDE_STRIDE 16
#define WIDE_PROMPT_SEED 0x5a1a2026u
#define WIDE_MAGIC 0x3146455244495753LL /* "SWIDREF1" */

struct wide_ref {
	int64_t tokens, steps, V, L, nkv, k, nb, topn, stride, int8, cpu_ms, sparse_mask;
	uint64_t hash;
	int64_t nstr;	  /* ceil(V / stride) */
	int32_t *top_ids; /* [rows][topn] */
	float *top_val;	  /* [rows][topn] */
	float *strided;	  /* [rows][nstr] */
	float *full;	  /* [2][V]: row 0 and row steps */
	int32_t *tok;	  /* [rows] */
	int32_t *blocks;  /* [rows][L][nkv * k] */
	int32_t *nblocks; /* [rows][L] */
	float *scores;	  /* [rows][L][nkv * nb] */
	void *mem_;
};

static inline uint64_t wide_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* The prompt: BOS, then 64-token blocks (the sparse block size) of ids from
 * the ordinary vocabulary [3, V - 8) (no pad/eos, none of the special tokens
 * at the top), a pure function of the seed: about 2 blocks in 5 repeat one
 * id 64 times, the rest draw every id afresh. Uniform random tokens alone
 * make a degenerate selection: a 32-token chunk's mean-pooled key is then
 * close to every other chunk's, and every candidate block's pooled score
 * sits within ~2% of the others (a tie band, not a choice). A repeated
 * token's chunk keeps that token's whole key, so those blocks score well
 * apart from the rest and from each other, and with ~63 of them among the
 * ~158 candidates for the 62 free top-k slots the selection is a real
 * choice (test_wide checks the committed reference: spread, distinct
 * scores, blocks clearly in and clearly out). */
static inline void wide_prompt(int32_t *ids, size_t n, int V)
{
	uint64_t seed = (uint64_t)WIDE_PROMPT_SEED << 32;
	ids[0] = 1;
	for (size_t i = 1; i < n; i++) {
		uint64_t b = i / 64;
		int run = wide_mix64(seed ^ (0x52554e00u + b)) % 5 < 2;
		uint64_t z = run ? wide_mix64(seed ^ (b << 24) ^ 0xb10cu) : wide_mix64(seed + i);
		ids[i] = (int32_t)(3 + z % (uint64_t)(V - 11));
	}
}

/* Bit l set when layer l is a sparse (InfLLM-v2) layer; at most 62 layers. */
static inline int64_t wide_sparse_mask(const struct sfw_config *c)
{
	int64_t m = 0;
	for (int l = 0; l < c->num_hidden_layers && l < 62; l++)
		if (c->mixer[l] == SFW_MIXER_SPARSE)
			m |= (int64_t)1 << l;
	return m;
}

static inline uint64_t wide_ids_hash(const int32_t *ids, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a over the ids */
	for (size_t i = 0; i < n; i++) {
		h ^= (uint32_t)ids[i];
		h *= 1099511628211ull;
	}
	return h;
}

static inline int32_t wide_argmax(const float *lg, int64_t V)
{
	int32_t best = 0;
	for (int64_t v = 1; v < V; v++)
		if (lg[v] > lg[best])
			best = (int32_t)v;
	return best;
}

/* The top n of a row: ids by descending value, lower id first on ties. */
static inline void wide_topn(const float *lg, int64_t V, int n, int32_t *ids, float *val)
{
	int have = 0;
	for (int64_t v = 0; v < V; v++) {
		float x = lg[v];
		if (have == n && !(x > val[n - 1]))
			continue;
		int at = have < n ? have++ : n - 1;
		while (at > 0 && x > val[at - 1]) {
			ids[at] = ids[at - 1], val[at] = val[at - 1];
			at--;
		}
		ids[at] = (int32_t)v, val[at] = x;
	}
}

static inline size_t wide_ref_bytes(const struct wide_ref *r)
{
	size_t R = (size_t)r->steps + 1;
	return 16 * 8 + R * ((size_t)r->topn * 8 + (size_t)r->nstr * 4) + 2 * (size_t)r->V * 4 + R * 4 +
	       R * (size_t)r->L * ((size_t)r->nkv * r->k * 4 + 4 + (size_t)r->nkv * r->nb * 4);
}

/* Points the arrays into one allocation of the payload (after the header). */
static inline int wide_ref_alloc(struct wide_ref *r)
{
	size_t R = (size_t)r->steps + 1, n = wide_ref_bytes(r) - 16 * 8;
	char *p = malloc(n);
	if (!p)
		return 0;
	r->mem_ = p;
	r->top_ids = (int32_t *)p, p += R * r->topn * 4;
	r->top_val = (float *)p, p += R * r->topn * 4;
	r->strided = (float *)p, p += R * r->nstr * 4;
	r->full = (float *)p, p += 2 * (size_t)r->V * 4;
	r->tok = (int32_t *)p, p += R * 4;
	r->blocks = (int32_t *)p, p += R * r->L * r->nkv * r->k * 4;
	r->nblocks = (int32_t *)p, p += R * r->L * 4;
	r->scores = (float *)p;
	return 1;
}

static inline void wide_ref_free(struct wide_ref *r)
{
	free(r->mem_);
	memset(r, 0, sizeof(*r));
}

/* The file is the payload in the order wide_ref_alloc lays it out: per-row
 * groups are interleaved on disk as the header comment says, so write and
 * read go group by group. */
#define WIDE_REF_GROUPS(X, r, R)                                                                             \
	for (size_t i_ = 0; i_ < (R); i_++) {                                                                \
		X((r)->top_ids + i_ * (r)->topn, 4, (size_t)(r)->topn);                                      \
		X((r)->top_val + i_ * (r)->topn, 4, (size_t)(r)->topn);                                      \
		X((r)->strided + i_ * (r)->nstr, 4, (size_t)(r)->nstr);                                      \
	}                                                                                                    \
	X((r)->full, 4, 2 * (size_t)(r)->V);                                                                 \
	X((r)->tok, 4, (R));                                                                                 \
	for (size_t i_ = 0; i_ < (R) * (size_t)(r)->L; i_++) {                                               \
		X((r)->blocks + i_ * (r)->nkv * (r)->k, 4, (size_t)((r)->nkv * (r)->k));                     \
		X((r)->nblocks + i_, 4, 1);                                                                  \
		X((r)->scores + i_ * (r)->nkv * (r)->nb, 4, (size_t)((r)->nkv * (r)->nb));                   \
	}

static inline int wide_ref_write(const char *path, const struct wide_ref *r)
{
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return 0;
	int64_t h[16] = {WIDE_MAGIC, r->tokens,	     r->steps, r->V,	  r->L,	   r->nkv,
			 r->k,	     r->nb,	     r->topn,  r->stride, r->int8, (int64_t)r->hash,
			 r->cpu_ms,  r->sparse_mask, 0,	       0};
	int ok = fwrite(h, sizeof(h), 1, f) == 1;
	size_t R = (size_t)r->steps + 1;
#define WIDE_W_(p, sz, n) ok = ok && fwrite((p), (sz), (n), f) == (n);
	WIDE_REF_GROUPS(WIDE_W_, r, R)
#undef WIDE_W_
	ok = fclose(f) == 0 && ok;
	if (ok && rename(tmp, path) == 0)
		return 1;
	remove(tmp);
	return 0;
}

/* Reads and bounds a reference file. 1 on success; 0 with why[] filled. */
static inline int wide_ref_read(const char *path, struct wide_ref *r, char *why, size_t whycap)
{
	memset(r, 0, sizeof(*r));
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(why, whycap, "cannot open '%s' (scripts/wide-ref.sh, or gpu-run.sh wide-ref, makes it)", path);
		return 0;
	}
	int64_t h[16];
	int ok = fread(h, sizeof(h), 1, f) == 1 && h[0] == WIDE_MAGIC;
	if (!ok) {
		snprintf(why, whycap, "'%s' is not a gpu_wide CPU reference", path);
		fclose(f);
		return 0;
	}
	/* every count bounded, so the size arithmetic cannot overflow */
	ok = h[1] > 0 && h[1] <= (1 << 24) && h[2] >= 1 && h[2] <= 64 && h[3] >= 16 && h[3] <= (1 << 20) &&
	     h[4] >= 1 && h[4] <= 62 && h[5] >= 1 && h[5] <= 64 && h[6] >= 1 && h[6] <= 4096 && h[7] >= 1 &&
	     h[7] <= (1 << 18) && h[8] >= 1 && h[8] <= h[3] && h[8] <= 4096 && h[9] >= 1 && h[9] <= h[3] &&
	     (h[10] == 0 || h[10] == 1) && h[12] >= 0 && h[13] >= 0 && h[13] < ((int64_t)1 << h[4]) &&
	     h[14] == 0 && h[15] == 0;
	if (!ok) {
		snprintf(why, whycap, "'%s': header out of range", path);
		fclose(f);
		return 0;
	}
	r->tokens = h[1], r->steps = h[2], r->V = h[3], r->L = h[4], r->nkv = h[5], r->k = h[6], r->nb = h[7];
	r->topn = h[8], r->stride = h[9], r->int8 = h[10], r->hash = (uint64_t)h[11], r->cpu_ms = h[12];
	r->sparse_mask = h[13];
	r->nstr = (r->V + r->stride - 1) / r->stride;
	size_t R = (size_t)r->steps + 1;
	if (wide_ref_bytes(r) > ((size_t)256 << 20) || !wide_ref_alloc(r)) {
		snprintf(why, whycap, "'%s': %zu bytes is too large", path, wide_ref_bytes(r));
		fclose(f);
		memset(r, 0, sizeof(*r));
		return 0;
	}
#define WIDE_R_(p, sz, n) ok = ok && fread((p), (sz), (n), f) == (n);
	WIDE_REF_GROUPS(WIDE_R_, r, R)
#undef WIDE_R_
	ok = ok && fgetc(f) == EOF;
	fclose(f);
	if (!ok) {
		snprintf(why, whycap, "'%s' is truncated or longer than its header says (%zu bytes)", path,
			 wide_ref_bytes(r));
		wide_ref_free(r);
		return 0;
	}
	/* ids the comparisons index with: tokens and top ids in [0, V), blocks in
	 * [-1, nblocks) with nblocks in [1, nb] for a sparse layer, none else */
	for (size_t i = 0; ok && i < R; i++) {
		ok = r->tok[i] >= 0 && r->tok[i] < r->V;
		for (int64_t j = 0; ok && j < r->topn; j++)
			ok = r->top_ids[i * r->topn + j] >= 0 && r->top_ids[i * r->topn + j] < r->V;
		for (int64_t l = 0; ok && l < r->L; l++) {
			int sparse = (int)(r->sparse_mask >> l & 1);
			int32_t nb = r->nblocks[i * r->L + l];
			ok = sparse ? nb >= 1 && nb <= r->nb : nb == 0;
			const int32_t *b = r->blocks + (i * r->L + l) * r->nkv * r->k;
			for (int64_t j = 0; ok && j < r->nkv * r->k; j++)
				ok = sparse ? b[j] >= -1 && b[j] < nb : b[j] == -1;
		}
	}
	if (!ok) {
		snprintf(why, whycap, "'%s': a token, id or block index out of range", path);
		wide_ref_free(r);
		return 0;
	}
	return 1;
}

/* ---- the comparisons gpu_wide makes (and test_wide checks on the ref) ---- */

/* The bf16 tolerance of CUDA vs the CPU engine (test_golden.c's TOL_BF16 on
 * logits, which gpu_golden and gpu_long use): absolute, for logits whose
 * largest magnitude is ~0.4 on these random models. */
#define WIDE_TOL_LOGITS 1.5e-2
/* The int8 model on CUDA: its prefill dequantizes every weight to bf16 before
 * cuBLASLt, one rounding more than the bf16 model (whose weights are bf16
 * exactly) against the CPU's float dequantization; 1.5 times the bf16
 * bound, the ratio of tests/lib/backend_ops.c's TW8 to T2. */
#define WIDE_TOL_LOGITS_W8 (1.5 * WIDE_TOL_LOGITS)
/* Two blocks' pooled scores "tie" when they differ by at most this fraction
 * of the larger: a bf16 engine's scores move by that much (its q and k are
 * rounded to 8 bits of mantissa and the pooled score is a softmax of their
 * products), so such a pair may rank either way. */
#define WIDE_TIE_REL 3e-2

/* max(md, |a - b|), where a NaN difference is infinitely bad (fmax would drop it). */
static inline double wide_worse(double md, double a, double b)
{
	double d = fabs(a - b);
	return isnan(d) ? INFINITY : d > md ? d : md;
}

/* max |got - ref| over every logit row i of the reference keeps (top-N,
 * strided, and the full row for rows 0 and steps); *n_cmp = how many. */
static inline double wide_logits_diff(const struct wide_ref *r, int i, const float *got, long *n_cmp)
{
	double md = 0;
	long n = 0;
	for (int64_t j = 0; j < r->topn; j++, n++)
		md = wide_worse(md, got[r->top_ids[(size_t)i * r->topn + j]],
				r->top_val[(size_t)i * r->topn + j]);
	for (int64_t j = 0; j < r->nstr; j++, n++)
		md = wide_worse(md, got[j * r->stride], r->strided[(size_t)i * r->nstr + j]);
	const float *full = i == 0 ? r->full : i == r->steps ? r->full + r->V : NULL;
	for (int64_t v = 0; full && v < r->V; v++, n++)
		md = wide_worse(md, got[v], full[v]);
	*n_cmp = n;
	return md;
}

/* The reference's logit for id v in row i, if the file keeps it (else NAN). */
static inline double wide_ref_logit(const struct wide_ref *r, int i, int32_t v)
{
	if (i == 0 || i == r->steps)
		return r->full[(i == 0 ? 0 : r->V) + v];
	for (int64_t j = 0; j < r->topn; j++)
		if (r->top_ids[(size_t)i * r->topn + j] == v)
			return r->top_val[(size_t)i * r->topn + j];
	if (v % r->stride == 0)
		return r->strided[(size_t)i * r->nstr + v / r->stride];
	return NAN;
}

static inline int wide_in(const int32_t *set, int64_t n, int32_t b)
{
	for (int64_t i = 0; i < n; i++)
		if (set[i] == b)
			return 1;
	return 0;
}

struct wide_sel {
	long same, ties, real; /* KV-head rows: equal sets, differing only by near ties, really differing */
	double worst_tie;      /* largest relative score gap among the tied swaps */
	double worst_real;     /* largest relative score gap among the real differences */
};

/* Compares selected blocks `got` (nkv x k) with the reference's for row i,
 * layer l. A KV head's sets may differ only where every block the reference
 * chose and `got` dropped scores within band[h] (NULL: WIDE_TIE_REL for
 * every head) of every block `got` chose instead (by the reference's
 * scores). */
static inline void wide_sel_compare(const struct wide_ref *r, int i, int l, const int32_t *got, const double *band,
				    struct wide_sel *w)
{
	size_t rl = (size_t)i * r->L + l;
	const int32_t *ref = r->blocks + rl * r->nkv * r->k;
	const float *sc = r->scores + rl * r->nkv * r->nb;
	int64_t nb = r->nblocks[rl];
	for (int64_t h = 0; h < r->nkv; h++) {
		const int32_t *a = ref + h * r->k, *b = got + h * r->k;
		const float *s = sc + h * r->nb;
		double hi_drop = -INFINITY, lo_pick = INFINITY;
		int differ = 0, bad_id = 0;
		for (int64_t j = 0; j < r->k; j++) {
			if (a[j] >= 0 && !wide_in(b, r->k, a[j])) {
				differ = 1;
				hi_drop = fmax(hi_drop, s[a[j]]);
			}
			if (b[j] >= 0 && !wide_in(a, r->k, b[j])) {
				differ = 1;
				if (b[j] >= nb)
					bad_id = 1;
				else
					lo_pick = fmin(lo_pick, s[b[j]]);
			}
			if ((a[j] < 0) != (b[j] < 0)) /* a count mismatch: a swap with an absent block */
				differ = 1;
		}
		if (!differ) {
			w->same++;
			continue;
		}
		/* relative gap of the worst swap; forced (+inf) or absent (-inf)
		 * blocks swapped, or a count mismatch, are real differences */
		double gap = isfinite(hi_drop) && isfinite(lo_pick)
				 ? (hi_drop - lo_pick) / fmax(fabs(hi_drop), 1e-30)
				 : INFINITY;
		if (!bad_id && gap <= (band ? band[h] : WIDE_TIE_REL)) {
			w->ties++;
			w->worst_tie = fmax(w->worst_tie, gap);
		} else {
			w->real++;
			w->worst_real = fmax(w->worst_real, gap);
		}
	}
}

#endif
