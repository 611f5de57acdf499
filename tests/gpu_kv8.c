/* modules: kernels num core */
/* gpu_kv8.c - the fp8 KV cache (kernels/ops.h, "the fp8 KV cache") on
 * CUDA against its C twins (the law):
 *   - the append kernels (sfw_cuda_kv_write, sfw_cuda_kv_append_seqs) bit
 *     for bit against sfw_op_kv8_write_cpu, over whole cache arrays (codes,
 *     scales and the rows nobody wrote), contiguous and paged, bf16 and f32
 *     inputs, heads that are zero, above 448, tiny, below the zero-head
 *     threshold, one large value among small ones (subnormal codes);
 *   - the decode of every code at scales from subnormal to huge, exactly
 *     (compression with ksize = stride = 1 copies the keys it reads);
 *   - compression (sfw_cuda_compress, both levels, in pieces: a long call,
 *     single tokens, another long call; contiguous and paged;
 *     sfw_cuda_compress_seqs) against sfw_op_compress_cpu on the keys read
 *     back by sfw_op_kv8_read_cpu: bit for bit in f32, within the bf16
 *     tolerance of gpu_ops otherwise;
 *   - attention, dense and sparse, decode rows (split over the keys) and
 *     prefill rows, on the CUDA-core kernel (SALAFW_CUDA_ATTN=simt's
 *     choice) and the tensor-core one (tc), contiguous, paged (bit for bit
 *     the contiguous result) and from a recorded row's slots, and
 *     sfw_cuda_attn_dense_seqs, against sfw_op_attn_*_cpu on the read-back
 *     caches (gpu_attn_tc's and gpu_ops' tolerances); each attention case
 *     also runs on a bf16 (or f32) cache of the same inputs, whose result
 *     must differ: a loader that ignored kv8 could not pass both.
 *   gpu_kv8 [check]   the comparisons
 *   gpu_kv8 bench     timings: attention over the fp8 cache against the bf16
 *                     one, and the append kernels (copy against quantize)
 *   gpu_kv8 all       both */
#include "check.h"
#include "lib/compare.h"
#include "lib/gpu_mem.h"
#include "lib/rng.h"

#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void *g_s;
static struct sfw_cuda_ctx *g_cx; /* on g_s: what the ops run with */
static uint64_t rng = 0x6a09e667f3bcc909ull;

static const char *dt_name(enum sfw_dtype act)
{
	return act == SFW_DTYPE_BF16 ? "bf16" : "f32";
}

static size_t act_size(enum sfw_dtype act)
{
	return act == SFW_DTYPE_BF16 ? 2 : 4;
}

static float bfr(float x)
{
	return sfw_bf16_to_f32(sfw_f32_to_bf16(x));
}

/* n values uniform in [-scale, scale), bf16 values in bf16 mode. */
static float *randv(size_t n, float scale, enum sfw_dtype act)
{
	float *p = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		p[i] = sfwt_urand(&rng) * scale;
		if (act == SFW_DTYPE_BF16)
			p[i] = bfr(p[i]);
	}
	return p;
}

static void *dalloc(size_t bytes)
{
	return sfwt_dalloc(bytes, g_s);
}

static void *up(const void *h, size_t bytes)
{
	return sfwt_up(h, bytes, g_s);
}

static void *down(const void *d, size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);
	sfw_cuda_d2h(h, d, bytes, g_s);
	sfw_cuda_sync(g_s);
	return h;
}

/* Host floats -> device activations of act. */
static void *up_act(const float *h, size_t n, enum sfw_dtype act)
{
	if (act == SFW_DTYPE_F32)
		return up(h, n * 4);
	uint16_t *b = malloc((n ? n : 1) * 2);
	for (size_t i = 0; i < n; i++)
		b[i] = sfw_f32_to_bf16(h[i]);
	void *d = up(b, n * 2);
	free(b);
	return d;
}

static float *down_act(const void *d, size_t n, enum sfw_dtype act)
{
	if (act == SFW_DTYPE_F32)
		return down(d, n * 4);
	uint16_t *b = down(d, n * 2);
	float *f = malloc((n ? n : 1) * 4);
	for (size_t i = 0; i < n; i++)
		f[i] = sfw_bf16_to_f32(b[i]);
	free(b);
	return f;
}

/* The first byte where two arrays differ, or -1. */
static int64_t first_diff(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return (int64_t)i;
	return -1;
}

struct tol {
	double nmse, maxrel;
};

/* NMSE and max|diff| against ref (gpu_ops' and gpu_attn_tc's checks). */
static void cmp(const char *what, const float *got, const float *ref, size_t n, struct tol t)
{
	struct cmp_stats c = cmp_stats(got, ref, n);
	printf("  %-72s NMSE %.2e  max|diff| %.2e  max|ref| %.2e\n", what, c.nmse, c.maxd, c.maxr);
	CHECK(c.bad == 0, "%s: %zu non-finite mismatches (first at %zu: got %g, ref %g)", what, c.bad, c.first_bad,
	      c.bad ? got[c.first_bad] : 0.0, c.bad ? ref[c.first_bad] : 0.0);
	CHECK(c.nmse <= t.nmse, "%s: NMSE %.3e > %.1e", what, c.nmse, t.nmse);
	CHECK(c.maxd <= t.maxrel * (c.maxr > 0 ? c.maxr : 1), "%s: max|diff| %.3e > %.1e x %.3e", what, c.maxd,
	      t.maxrel, c.maxr);
}

/* bf16 attention outputs (gpu_attn_tc), f32 ones (gpu_ops), compression
 * (gpu_ops). */
static const struct tol TOL_ATTN_BF16 = {3e-5, 1.6e-2}, TOL_ATTN_F32 = {1e-10, 1e-4};
static const struct tol TOL_CK_BF16 = {1e-5, 8e-3}, TOL_CK_F32 = {1e-12, 1e-5};

/* ---- a cache of L tokens, contiguous or paged ---- */

/* The fp8 pair of L tokens of k, v ([L, nkv, hd]) on the host and the
 * device, contiguous (tab NULL) or paged in 64-token blocks through a
 * shuffled table into a pool of twice the blocks (the others unwritten). */
struct cache8 {
	int64_t L;
	int nkv, hd;
	int32_t *tab, *dtab; /* host, device; NULL: contiguous */
	struct sfw_pages hpg, dpg;
	size_t bytes;
	uint8_t *hk, *hv;
	void *dk, *dv;
};

static const struct sfw_pages *host_pg(const struct cache8 *c)
{
	return c->tab ? &c->hpg : NULL;
}

static void cache8_make(struct cache8 *c, const float *k, const float *v, int64_t L, int nkv, int hd, int paged)
{
	int64_t nb = (L + 63) / 64;
	memset(c, 0, sizeof(*c));
	c->L = L, c->nkv = nkv, c->hd = hd;
	c->bytes = sfw_kv8_bytes(paged ? 2 * nb * 64 : L, nkv, hd);
	c->hk = malloc(c->bytes), c->hv = malloc(c->bytes);
	memset(c->hk, 0, c->bytes), memset(c->hv, 0, c->bytes);
	if (paged) {
		c->tab = sfwt_block_table(nb, &rng);
		c->hpg = (struct sfw_pages){c->tab, 6};
		c->dtab = up(c->tab, (size_t)nb * sizeof(int32_t));
		c->dpg = (struct sfw_pages){c->dtab, 6};
	}
	sfw_op_kv8_write_cpu(c->hk, c->hv, k, v, (int)L, nkv, hd, 0, host_pg(c));
	c->dk = up(c->hk, c->bytes), c->dv = up(c->hv, c->bytes);
}

static void cache8_free(struct cache8 *c)
{
	free(c->hk), free(c->hv), free(c->tab);
	sfw_cuda_free(c->dk), sfw_cuda_free(c->dv), sfw_cuda_free(c->dtab);
}

/* Tokens [0, L) of K (which 0) or V (1) read back as the kernels see them. */
static float *cache8_read(const struct cache8 *c, int which)
{
	float *x = malloc((size_t)c->L * c->nkv * c->hd * sizeof(float));
	sfw_op_kv8_read_cpu(x, which ? c->hv : c->hk, 0, c->L, c->nkv, c->hd, host_pg(c));
	return x;
}

static struct sfw_cuda_kv cache8_kv(struct cache8 *c)
{
	struct sfw_cuda_kv kv = {c->dk, c->dv, c->tab ? &c->dpg : NULL, 1};
	return kv;
}

/* ---- appending ---- */

/* K and V rows [T, nkv, hd] whose heads take turns among the cases the
 * quantizer must get right: random, zeros (signed), above 448, tiny,
 * below the zero-head threshold 2^-100, one large value among small ones. */
static float *kv_rows(int T, int nkv, int hd, enum sfw_dtype act)
{
	float *x = malloc((size_t)T * nkv * hd * sizeof(float));
	for (int h = 0; h < T * nkv; h++) {
		float *y = x + (size_t)h * hd;
		int kind = (int)(sfwt_next(&rng) % 6);
		for (int i = 0; i < hd; i++) {
			float u = sfwt_urand(&rng);
			switch (kind) {
			case 0: y[i] = u * 2.0f; break;
			case 1: y[i] = i % 2 ? -0.0f : 0.0f; break;
			case 2: y[i] = u * 3000.0f; break;
			case 3: y[i] = u * 1e-20f; break;
			case 4: y[i] = u * 1e-33f; break;
			default: y[i] = i == hd / 3 ? -100.0f : u * 0.01f; break;
			}
			if (act == SFW_DTYPE_BF16)
				y[i] = bfr(y[i]);
		}
	}
	return x;
}

/* T rows at pos0, then one more at pos0 + T (a decode step), through
 * sfw_cuda_kv_write and through the twin: the whole arrays equal. */
static void t_write(int T, int nkv, int hd, int paged, enum sfw_dtype act)
{
	int64_t pos0 = paged ? 70 : 37, L = pos0 + T + 1, nb = (L + 63) / 64;
	size_t row = (size_t)nkv * hd, bytes = sfw_kv8_bytes(paged ? 2 * nb * 64 : L, nkv, hd);
	float *k = kv_rows(T + 1, nkv, hd, act), *v = kv_rows(T + 1, nkv, hd, act);
	uint8_t *hk = malloc(bytes), *hv = malloc(bytes);
	memset(hk, 0xff, bytes), memset(hv, 0xff, bytes); /* as dalloc leaves the device's */
	int32_t *tab = paged ? sfwt_block_table(nb, &rng) : NULL;
	struct sfw_pages hpg = {tab, 6};
	sfw_op_kv8_write_cpu(hk, hv, k, v, T, nkv, hd, pos0, paged ? &hpg : NULL);
	sfw_op_kv8_write_cpu(hk, hv, k + T * row, v + T * row, 1, nkv, hd, pos0 + T, paged ? &hpg : NULL);
	void *dk = dalloc(bytes), *dv = dalloc(bytes), *ik = up_act(k, (T + 1) * row, act);
	void *iv = up_act(v, (T + 1) * row, act);
	int32_t *dtab = paged ? up(tab, (size_t)nb * 4) : NULL;
	struct sfw_pages dpg = {dtab, 6};
	struct sfw_cuda_kv kv = {dk, dv, paged ? &dpg : NULL, 1};
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, pos0)};
	sfw_cuda_kv_write(&kv, ik, iv, nkv, hd, T, &rr, act, g_cx);
	rr.pos = sfw_cuda_ctx_pos(g_cx, pos0 + T);
	size_t off = (size_t)T * row * act_size(act);
	sfw_cuda_kv_write(&kv, (char *)ik + off, (char *)iv + off, nkv, hd, 1, &rr, act, g_cx);
	uint8_t *gk = down(dk, bytes), *gv = down(dv, bytes);
	int64_t dk_at = first_diff(gk, hk, bytes), dv_at = first_diff(gv, hv, bytes);
	printf("  kv_write T=%d (+1) nkv=%d hd=%d %s %s: K %s, V %s\n", T, nkv, hd, paged ? "paged" : "contiguous",
	       dt_name(act), dk_at < 0 ? "equal" : "DIFFERS", dv_at < 0 ? "equal" : "DIFFERS");
	CHECK(dk_at < 0 && dv_at < 0,
	      "kv_write T=%d nkv=%d hd=%d %s %s: the fp8 caches equal the twin's (first difference K %lld, V %lld)",
	      T, nkv, hd, paged ? "paged" : "contiguous", dt_name(act), (long long)dk_at, (long long)dv_at);
	free(k), free(v), free(hk), free(hv), free(tab), free(gk), free(gv);
	sfw_cuda_free(dk), sfw_cuda_free(dv), sfw_cuda_free(ik), sfw_cuda_free(iv), sfw_cuda_free(dtab);
}

/* ---- a batched step's sequences in one pool ---- */

#define NSEQ 6    /* sequences; the step table has one padding row more */
#define SEQBLK 6  /* 64-token blocks per sequence */
#define NBLK 48   /* the pool */
#define NROW (NSEQ + 1)

/* Sequences 0 .. NSEQ-1 holding len[i] tokens in a shared fp8 pool
 * (blocks tab[i]), row `pad` of the step table a padding row, sequence i
 * in row row[i] of the step's activations. */
struct seqs8 {
	int nkv, hd, pad;
	int64_t len[NROW];
	int row[NROW];
	int32_t *tab[NROW], *dtab[NROW];
	size_t bytes;
	uint8_t *hk, *hv;
	void *dk, *dv;
	struct sfw_cuda_steptab *dst;
	void **dsp;
};

static const int64_t SEQ_LEN[NSEQ] = {128, 192, 48, 100, 320, 383}; /* chunks of both levels, one, none */

static void seqs8_make(struct seqs8 *s, int nkv, int hd, enum sfw_dtype act)
{
	int32_t perm[NBLK];
	memset(s, 0, sizeof(*s));
	s->nkv = nkv, s->hd = hd, s->pad = 3;
	s->bytes = sfw_kv8_bytes((int64_t)NBLK * 64, nkv, hd);
	s->hk = calloc(s->bytes, 1), s->hv = calloc(s->bytes, 1);
	sfwt_iota_shuffle(perm, NBLK, &rng);
	int rows[NROW] = {5, 0, 6, 2, 1, 4, 3};
	for (int i = 0, q = 0; i < NROW; i++) {
		s->row[i] = rows[i];
		if (i == s->pad)
			continue;
		s->len[i] = SEQ_LEN[q];
		s->tab[i] = malloc(SEQBLK * sizeof(int32_t));
		memcpy(s->tab[i], perm + q * SEQBLK, SEQBLK * sizeof(int32_t));
		s->dtab[i] = up(s->tab[i], SEQBLK * sizeof(int32_t));
		size_t n = (size_t)s->len[i] * nkv * hd;
		float *k = randv(n, 1.0f, act), *v = randv(n, 1.0f, act);
		struct sfw_pages pg = {s->tab[i], 6};
		sfw_op_kv8_write_cpu(s->hk, s->hv, k, v, (int)s->len[i], nkv, hd, 0, &pg);
		free(k), free(v), q++;
	}
	s->dk = up(s->hk, s->bytes), s->dv = up(s->hv, s->bytes);
	s->dst = dalloc(sizeof(struct sfw_cuda_steptab));
	s->dsp = dalloc((size_t)SFW_CUDA_LN * NROW * sizeof(void *));
}

static void seqs8_free(struct seqs8 *s)
{
	for (int i = 0; i < NROW; i++)
		free(s->tab[i]), sfw_cuda_free(s->dtab[i]);
	free(s->hk), free(s->hv);
	sfw_cuda_free(s->dk), sfw_cuda_free(s->dv), sfw_cuda_free(s->dst), sfw_cuda_free(s->dsp);
}

/* The step's tables: sequence i at position pos[i] = len[i] - 1 (its last
 * token, the one a step appends), K and V for append and attention, c1 and
 * c2 (the compressed keys' pool, level 2 four rows on) for compression. */
static struct sfw_cuda_seqs seqs8_tables(struct seqs8 *s, void *ck, enum sfw_dtype act)
{
	struct sfw_cuda_steptab ht;
	void *hp[SFW_CUDA_LN * NROW];
	memset(&ht, 0, sizeof(ht));
	memset(hp, 0, sizeof(hp));
	ht.n = NROW, ht.shift = 6;
	int64_t maxpos = 0;
	for (int i = 0; i < NROW; i++) {
		ht.row[i] = s->row[i];
		if (i == s->pad)
			continue;
		ht.pos[i] = s->len[i] - 1, ht.tab[i] = s->dtab[i];
		maxpos = ht.pos[i] > maxpos ? ht.pos[i] : maxpos;
		hp[SFW_CUDA_LK * NROW + i] = hp[SFW_CUDA_LAK * NROW + i] = s->dk;
		hp[SFW_CUDA_LV * NROW + i] = hp[SFW_CUDA_LAV * NROW + i] = s->dv;
		hp[SFW_CUDA_LC1 * NROW + i] = ck;
		hp[SFW_CUDA_LC2 * NROW + i] = (char *)ck + (size_t)4 * s->nkv * s->hd * act_size(act);
	}
	sfw_cuda_h2d(s->dst, &ht, sizeof(ht), g_s);
	sfw_cuda_h2d(s->dsp, hp, sizeof(hp), g_s);
	sfw_cuda_sync(g_s);
	struct sfw_cuda_seqs t = {NROW, maxpos, s->dst, (void *const *)s->dsp, 0, {0, 0, 0}, 1};
	return t;
}

/* Each sequence's row appended at its position by sfw_cuda_kv_append_seqs
 * and by the twin: the whole pools equal. */
static void t_append_seqs(int nkv, int hd, enum sfw_dtype act)
{
	struct seqs8 s;
	seqs8_make(&s, nkv, hd, act);
	size_t row = (size_t)nkv * hd;
	float *k = kv_rows(NROW, nkv, hd, act), *v = kv_rows(NROW, nkv, hd, act);
	for (int i = 0; i < NROW; i++) {
		if (i == s.pad)
			continue;
		struct sfw_pages pg = {s.tab[i], 6};
		sfw_op_kv8_write_cpu(s.hk, s.hv, k + s.row[i] * row, v + s.row[i] * row, 1, nkv, hd, s.len[i] - 1, &pg);
	}
	void *ik = up_act(k, NROW * row, act), *iv = up_act(v, NROW * row, act);
	struct sfw_cuda_seqs t = seqs8_tables(&s, NULL, act);
	t.pf[0] = SFW_CUDA_LK, t.pf[1] = SFW_CUDA_LV;
	sfw_cuda_kv_append_seqs(&t, ik, iv, nkv, hd, act, g_cx);
	uint8_t *gk = down(s.dk, s.bytes), *gv = down(s.dv, s.bytes);
	int64_t dk_at = first_diff(gk, s.hk, s.bytes), dv_at = first_diff(gv, s.hv, s.bytes);
	printf("  kv_append_seqs %d sequences + padding, nkv=%d hd=%d %s: K %s, V %s\n", NSEQ, nkv, hd, dt_name(act),
	       dk_at < 0 ? "equal" : "DIFFERS", dv_at < 0 ? "equal" : "DIFFERS");
	CHECK(dk_at < 0 && dv_at < 0,
	      "kv_append_seqs nkv=%d hd=%d %s: the fp8 pools equal the twin's (first difference K %lld, V %lld)", nkv,
	      hd, dt_name(act), (long long)dk_at, (long long)dv_at);
	free(k), free(v), free(gk), free(gv);
	sfw_cuda_free(ik), sfw_cuda_free(iv);
	seqs8_free(&s);
}

/* ---- compression ---- */

/* Every code (0 .. 255 across each head) at scales from subnormal to
 * near the largest, read by compression with ksize = stride = 1 (chunk j
 * = 0 + token j, divided by 1): the device's decode against the twin's
 * (sfw_op_compress_cpu over sfw_op_kv8_read_cpu's keys), exactly: as float
 * (f32), or rounded to bf16 once; NaN codes NaN. */
static void t_decode(enum sfw_dtype act)
{
	const int nkv = 2, hd = 128, L = 64;
	static const float scales[8] = {1.0f, 0.37f, 1e-30f, 1e-36f, 1e-40f, 7e35f, 0.0f, 3.0517578125e-5f};
	size_t row = (size_t)nkv * hd, bytes = sfw_kv8_bytes(L, nkv, hd);
	uint8_t *hk = malloc(bytes);
	for (int t = 0; t < L; t++)
		for (int g = 0; g < nkv; g++) {
			for (int i = 0; i < hd; i++)
				hk[sfw_kv8_codes_off(t, g, nkv, hd) + i] = (uint8_t)((t * nkv + g) * 37 + i * 2 + (t & 1));
			float s = scales[(t * nkv + g) % 8];
			memcpy(hk + sfw_kv8_scale_off(t, g, nkv, hd), &s, 4);
		}
	float *keys = malloc((size_t)L * row * 4), *ref = malloc((size_t)L * row * 4);
	struct sfw_sel_shape sh = {.T = L, .nkv = nkv, .hd = hd, .ksize = 1, .stride = 1};
	sfw_op_kv8_read_cpu(keys, hk, 0, L, nkv, hd, NULL);
	sfw_op_compress_cpu(ref, keys, 1, 0, L, &sh, NULL);
	void *dk = up(hk, bytes), *c1 = dalloc((size_t)L * row * act_size(act)), *c2 = dalloc((size_t)L * row * 4);
	struct sfw_cuda_kv kv = {dk, NULL, NULL, 1};
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, 0)};
	sfw_cuda_compress(c1, c2, &kv, &sh, &rr, act, g_cx);
	float *got = down_act(c1, (size_t)L * row, act);
	size_t bad = 0, nan = 0, sub = 0, first = 0;
	for (size_t i = 0; i < (size_t)L * row; i++) {
		float want = act == SFW_DTYPE_BF16 ? bfr(ref[i]) : ref[i];
		int same = isnan(want) ? isnan(got[i]) : memcmp(&want, &got[i], 4) == 0;
		nan += isnan(want) != 0, sub += fpclassify(want) == FP_SUBNORMAL;
		if (!same && !bad++)
			first = i;
	}
	printf("  decode of every code, 8 scales %s: %zu of %zu differ (%zu NaN, %zu subnormal values)\n", dt_name(act),
	       bad, (size_t)L * row, nan, sub);
	CHECK(bad == 0, "decode %s: %zu values differ from the twin's (first %zu: got %g, want %g)", dt_name(act), bad,
	      first, bad ? got[first] : 0.0, bad ? ref[first] : 0.0);
	free(hk), free(keys), free(ref), free(got);
	sfw_cuda_free(dk), sfw_cuda_free(c1), sfw_cuda_free(c2);
}

/* The compressed keys of a cache of L tokens, made in three calls as the
 * engine makes them (a prefill of 300 tokens, 40 single tokens, the rest),
 * against the twin over the read-back keys: contiguous c1 [n1], c2 [n2],
 * or (paged) both levels in the pool's compressed-key rows (sfw_ckey_row;
 * level 2 four rows on, rows no chunk owns 0). */
static void t_compress(int paged, enum sfw_dtype act)
{
	const int nkv = 2, hd = 128, L = 1000;
	size_t row = (size_t)nkv * hd, as = act_size(act);
	float *k = randv((size_t)L * row, 1.0f, act), *v = randv((size_t)L * row, 1.0f, act);
	struct cache8 c;
	cache8_make(&c, k, v, L, nkv, hd, paged);
	float *keys = cache8_read(&c, 0);
	int64_t n1 = sfw_nchunks(L, 32, 16), n2 = sfw_nchunks(L, 128, 64), nb = (L + 63) / 64;
	int64_t rows = paged ? 2 * nb * sfw_ckey_rows_per_block(6, 16) : n1 + n2; /* c2 at n1 when contiguous */
	size_t c2off = (size_t)(paged ? 4 : n1) * row;
	struct sfw_sel_shape sh = {.nkv = nkv, .hd = hd, .ksize = 32, .stride = 16};
	float *ref = calloc((size_t)rows * row, 4);
	sfw_op_compress_cpu(ref, keys, 1, 0, n1, &sh, host_pg(&c));
	sfw_op_compress_cpu(ref + c2off, keys, 2, 0, n2, &sh, host_pg(&c));
	void *dc = dalloc((size_t)rows * row * as);
	sfw_cuda_memset(dc, 0, (size_t)rows * row * as, g_s);
	struct sfw_cuda_kv kv = cache8_kv(&c);
	static const int calls[][2] = {{0, 300}, {300, 1}, {1, 0}, {340, 660}}; /* {p, T}; {1, 0}: 39 more singles */
	for (int i = 0; i < 4; i++) {
		int p0 = calls[i][0], T = calls[i][1], n = T ? 1 : 39;
		if (!T)
			p0 = 301, T = 1;
		for (int j = 0; j < n; j++) {
			struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, p0 + j)};
			sh.T = T;
			sfw_cuda_compress(dc, (char *)dc + c2off * as, &kv, &sh, &rr, act, g_cx);
		}
	}
	float *got = down_act(dc, (size_t)rows * row, act);
	char what[160];
	snprintf(what, sizeof(what), "compress L=%d (300 + 40 x 1 + 660), both levels, %s, %s", L,
		 paged ? "paged" : "contiguous", dt_name(act));
	cmp(what, got, ref, (size_t)rows * row, act == SFW_DTYPE_BF16 ? TOL_CK_BF16 : TOL_CK_F32);
	if (act == SFW_DTYPE_F32) /* the same sums in the same order */
		CHECK(first_diff(got, ref, (size_t)rows * row * 4) < 0, "%s: bit for bit the twin's", what);
	free(k), free(v), free(keys), free(ref), free(got);
	sfw_cuda_free(dc);
	cache8_free(&c);
}

/* sfw_cuda_compress_seqs over the step's sequences (each at its last
 * token: both levels complete, one, or none) against the twin on each
 * sequence's read-back keys, into the compressed-key rows of its blocks. */
static void t_compress_seqs(enum sfw_dtype act)
{
	const int nkv = 2, hd = 128;
	struct seqs8 s;
	seqs8_make(&s, nkv, hd, act);
	size_t row = (size_t)nkv * hd, as = act_size(act);
	int64_t rows = (int64_t)NBLK * sfw_ckey_rows_per_block(6, 16);
	float *ref = calloc((size_t)rows * row, 4);
	struct sfw_sel_shape sh = {.nkv = nkv, .hd = hd, .ksize = 32, .stride = 16};
	for (int i = 0; i < NROW; i++) {
		if (i == s.pad)
			continue;
		struct sfw_pages pg = {s.tab[i], 6};
		int64_t p = s.len[i] - 1;
		float *keys = malloc((size_t)s.len[i] * row * 4);
		sfw_op_kv8_read_cpu(keys, s.hk, 0, s.len[i], nkv, hd, &pg);
		sfw_op_compress_cpu(ref, keys, 1, sfw_nchunks(p, 32, 16), sfw_nchunks(p + 1, 32, 16), &sh, &pg);
		sfw_op_compress_cpu(ref + 4 * row, keys, 2, sfw_nchunks(p, 128, 64), sfw_nchunks(p + 1, 128, 64), &sh,
				    &pg);
		free(keys);
	}
	void *dc = dalloc((size_t)rows * row * as);
	sfw_cuda_memset(dc, 0, (size_t)rows * row * as, g_s);
	struct sfw_cuda_seqs t = seqs8_tables(&s, dc, act);
	t.pf[0] = SFW_CUDA_LC1, t.pf[1] = SFW_CUDA_LC2, t.pf[2] = SFW_CUDA_LK;
	sfw_cuda_compress_seqs(&t, nkv, hd, 32, 16, act, g_cx);
	float *got = down_act(dc, (size_t)rows * row, act);
	char what[160];
	snprintf(what, sizeof(what), "compress_seqs %d sequences + padding, %s", NSEQ, dt_name(act));
	cmp(what, got, ref, (size_t)rows * row, act == SFW_DTYPE_BF16 ? TOL_CK_BF16 : TOL_CK_F32);
	if (act == SFW_DTYPE_F32)
		CHECK(first_diff(got, ref, (size_t)rows * row * 4) < 0, "%s: bit for bit the twin's", what);
	free(ref), free(got);
	sfw_cuda_free(dc);
	seqs8_free(&s);
}

/* ---- attention ---- */

/* A selection the way the engine makes one (CPU pool + top-k on random
 * scores), every ~7th entry then -1 (gpu_attn_tc's make_idx, undisturbed
 * otherwise). */
static int32_t *make_idx(int nkv, int T, int64_t pos0, int k, int block)
{
	int64_t L = pos0 + T, nblocks = (L + block - 1) / block, n1 = sfw_nchunks(L, 32, 16);
	float *sc = malloc(((size_t)nkv * T * (n1 ? n1 : 1)) * 4);
	for (size_t i = 0; i < (size_t)nkv * T * n1; i++)
		sc[i] = sfwt_unit(&rng) + 1.0f;
	float *pooled = malloc((size_t)nkv * T * nblocks * 4);
	struct sfw_sel_shape sh = {.T = T, .nkv = nkv, .pos0 = pos0, .ksize = 32, .stride = 16, .block = block,
				   .init_blocks = 1, .local_blocks = 32, .n1 = n1, .nblocks = nblocks, .topk = k};
	sfw_op_pool_blocks_cpu(pooled, sc, &sh);
	int32_t *idx = malloc((size_t)nkv * T * k * 4);
	sfw_op_topk_blocks_cpu(NULL, idx, pooled, &sh);
	for (size_t i = 0; i < (size_t)nkv * T * k; i++)
		if (sfwt_next(&rng) % 7 == 0)
			idx[i] = -1;
	free(sc), free(pooled);
	return idx;
}

/* One attention case's inputs on the device. */
struct attn_case {
	int sparse, T, nh, nkv, hd, k;
	int64_t L;
	enum sfw_dtype act;
	struct sfw_attn_shape sh;
	void *dq, *didx;
	struct cache8 c, p; /* the fp8 cache contiguous, and paged */
	void *dkb, *dvb;    /* the same inputs in an act cache (contiguous) */
};

/* o = attention over kv (rr: the position, or a recorded row's slots). */
static float *attn_run(const struct attn_case *a, const struct sfw_cuda_kv *kv, const struct sfw_cuda_rowref *rr)
{
	size_t nq = (size_t)a->T * a->nh * a->hd;
	void *o = dalloc(nq * act_size(a->act));
	if (a->sparse)
		sfw_cuda_attn_sparse(o, a->dq, kv, a->didx, &a->sh, rr, a->act, g_cx);
	else
		sfw_cuda_attn_dense(o, a->dq, kv, &a->sh, rr, a->act, g_cx);
	float *got = down_act(o, nq, a->act);
	sfw_cuda_free(o);
	return got;
}

/* The kernel `mode` forces (1 CUDA cores, 2 tensor cores) against ref; the
 * paged cache bit for bit the contiguous one (and for a decode row, read
 * from a recorded row's slots too); the act cache's result different. */
static void attn_mode(const struct attn_case *a, int mode, const float *ref, const char *name)
{
	size_t nq = (size_t)a->T * a->nh * a->hd;
	const char *mn = mode == 1 ? "simt" : "tc";
	g_cx->attn = mode;
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, a->sh.pos0)};
	struct sfw_cuda_kv kv = cache8_kv((struct cache8 *)&a->c), kp = cache8_kv((struct cache8 *)&a->p);
	float *got = attn_run(a, &kv, &rr), *gp = attn_run(a, &kp, &rr);
	char what[200];
	snprintf(what, sizeof(what), "[%s] %s", mn, name);
	cmp(what, got, ref, nq, a->act == SFW_DTYPE_BF16 ? TOL_ATTN_BF16 : TOL_ATTN_F32);
	CHECK(first_diff(gp, got, nq * 4) < 0, "%s: paged cache = contiguous, bit for bit", what);
	if (a->T == 1 && mode == 1) { /* a recorded decode row: caches and table from slots */
		void *slot[3] = {a->p.dk, a->p.dv, a->p.dtab}, **dslot = up(slot, sizeof(slot));
		struct sfw_pages pgn = {NULL, 6};
		struct sfw_cuda_kv kn = {NULL, NULL, &pgn, 1};
		struct sfw_cuda_rowref rs = {rr.pos, dslot, dslot + 1, NULL, NULL, (const int32_t *const *)(dslot + 2),
					     0, 1};
		float *gs = attn_run(a, &kn, &rs);
		CHECK(first_diff(gs, got, nq * 4) < 0, "%s: a recorded row's slots = the caches given, bit for bit",
		      what);
		free(gs);
		sfw_cuda_free(dslot);
	}
	struct sfw_cuda_kv kb = {a->dkb, a->dvb, NULL, 0};
	float *gb = attn_run(a, &kb, &rr);
	struct cmp_stats d = cmp_stats(gb, got, nq);
	printf("    the %s cache's result against the fp8 one: NMSE %.2e\n", dt_name(a->act), d.nmse);
	CHECK(first_diff(gb, got, nq * 4) >= 0 && d.nmse < 1e-1,
	      "%s: the fp8 cache is read as fp8 (the %s cache of the same inputs gives another, close result)", what,
	      dt_name(a->act));
	g_cx->attn = 0;
	free(got), free(gp), free(gb);
}

static void t_attn(int sparse, int T, int64_t L, int nh, int nkv, int hd, enum sfw_dtype act)
{
	struct attn_case a;
	memset(&a, 0, sizeof(a));
	a.sparse = sparse, a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.k = 96, a.L = L, a.act = act;
	int64_t pos0 = L - T;
	size_t nq = (size_t)T * nh * hd, nc = (size_t)L * nkv * hd;
	a.sh = (struct sfw_attn_shape){T, nh, nkv, hd, pos0, 1.0f / sqrtf((float)hd), a.k, 64};
	float *q = randv(nq, 1.0f, act), *k = randv(nc, 1.0f, act), *v = randv(nc, 1.0f, act);
	cache8_make(&a.c, k, v, L, nkv, hd, 0);
	cache8_make(&a.p, k, v, L, nkv, hd, 1);
	float *kr = cache8_read(&a.c, 0), *vr = cache8_read(&a.c, 1), *ref = malloc(nq * 4);
	int32_t *idx = sparse ? make_idx(nkv, T, pos0, a.k, 64) : NULL;
	if (sparse)
		sfw_op_attn_sparse_cpu(NULL, ref, q, kr, vr, idx, &a.sh);
	else
		sfw_op_attn_dense_cpu(NULL, ref, q, kr, vr, &a.sh);
	a.dq = up_act(q, nq, act), a.dkb = up_act(k, nc, act), a.dvb = up_act(v, nc, act);
	a.didx = sparse ? up(idx, (size_t)nkv * T * a.k * 4) : NULL;
	char name[160];
	snprintf(name, sizeof(name), "attn_%s T=%d L=%lld nh=%d nkv=%d hd=%d %s", sparse ? "sparse" : "dense", T,
		 (long long)L, nh, nkv, hd, dt_name(act));
	attn_mode(&a, 1, ref, name);
	if (act == SFW_DTYPE_BF16) /* the tensor-core kernel: bf16 only */
		attn_mode(&a, 2, ref, name);
	free(q), free(k), free(v), free(kr), free(vr), free(ref), free(idx);
	sfw_cuda_free(a.dq), sfw_cuda_free(a.dkb), sfw_cuda_free(a.dvb), sfw_cuda_free(a.didx);
	cache8_free(&a.c), cache8_free(&a.p);
}

/* sfw_cuda_attn_dense_seqs over the step's sequences, each row against the
 * twin on its sequence's read-back caches (its position: its last token). */
static void t_attn_seqs(enum sfw_dtype act)
{
	const int nkv = 2, hd = 128, nh = 16;
	struct seqs8 s;
	seqs8_make(&s, nkv, hd, act);
	size_t row = (size_t)nkv * hd, qd = (size_t)nh * hd;
	float *q = randv(NROW * qd, 1.0f, act), *ref = malloc(NROW * qd * 4);
	void *dq = up_act(q, NROW * qd, act), *o = dalloc(NROW * qd * act_size(act));
	struct sfw_cuda_seqs t = seqs8_tables(&s, NULL, act);
	t.pf[0] = SFW_CUDA_LAK, t.pf[1] = SFW_CUDA_LAV;
	struct sfw_attn_shape sh = {NROW, nh, nkv, hd, 0, 1.0f / sqrtf((float)hd), 0, 0};
	sfw_cuda_attn_dense_seqs(o, dq, &t, &sh, act, g_cx);
	float *got = down_act(o, NROW * qd, act);
	for (int i = 0; i < NROW; i++) {
		if (i == s.pad)
			continue;
		struct sfw_pages pg = {s.tab[i], 6};
		float *kr = malloc((size_t)s.len[i] * row * 4), *vr = malloc((size_t)s.len[i] * row * 4);
		sfw_op_kv8_read_cpu(kr, s.hk, 0, s.len[i], nkv, hd, &pg);
		sfw_op_kv8_read_cpu(vr, s.hv, 0, s.len[i], nkv, hd, &pg);
		struct sfw_attn_shape rs = {1, nh, nkv, hd, s.len[i] - 1, sh.scale, 0, 0};
		sfw_op_attn_dense_cpu(NULL, ref + s.row[i] * qd, q + s.row[i] * qd, kr, vr, &rs);
		char what[160];
		snprintf(what, sizeof(what), "attn_dense_seqs row %d (L=%lld) %s", s.row[i], (long long)s.len[i],
			 dt_name(act));
		cmp(what, got + s.row[i] * qd, ref + s.row[i] * qd, qd,
		    act == SFW_DTYPE_BF16 ? TOL_ATTN_BF16 : TOL_ATTN_F32);
		free(kr), free(vr);
	}
	free(q), free(ref), free(got);
	sfw_cuda_free(dq), sfw_cuda_free(o);
	seqs8_free(&s);
}

static void checks(void)
{
	const enum sfw_dtype dts[2] = {SFW_DTYPE_BF16, SFW_DTYPE_F32};
	printf("appending: bit for bit against sfw_op_kv8_write_cpu\n");
	static const int wshapes[3][2] = {{2, 128}, {1, 64}, {4, 32}}, wT[4] = {1, 5, 64, 100};
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 3; s++)
			for (int t = 0; t < 4; t++)
				for (int paged = 0; paged < 2; paged++)
					t_write(wT[t], wshapes[s][0], wshapes[s][1], paged, dts[d]);
	for (int d = 0; d < 2; d++) {
		t_append_seqs(2, 128, dts[d]);
		t_append_seqs(1, 64, dts[d]);
	}
	printf("decode and compression: against sfw_op_compress_cpu on the read-back keys\n");
	for (int d = 0; d < 2; d++) {
		t_decode(dts[d]);
		t_compress(0, dts[d]);
		t_compress(1, dts[d]);
		t_compress_seqs(dts[d]);
	}
	printf("attention: CUDA-core (simt) and tensor-core (tc) kernels against the twins on the read-back caches\n");
	/* decode rows: the split over the keys */
	t_attn(1, 1, 20000, 32, 2, 128, SFW_DTYPE_BF16);
	t_attn(0, 1, 7000, 32, 2, 128, SFW_DTYPE_BF16);
	t_attn(0, 1, 100, 32, 2, 128, SFW_DTYPE_BF16);
	t_attn(1, 1, 3000, 2, 2, 64, SFW_DTYPE_BF16);
	t_attn(0, 1, 5000, 4, 4, 64, SFW_DTYPE_BF16);
	/* prefill rows */
	t_attn(1, 64, 9000, 32, 2, 128, SFW_DTYPE_BF16);
	t_attn(1, 200, 5000, 16, 2, 128, SFW_DTYPE_BF16);
	t_attn(0, 64, 3000, 32, 2, 128, SFW_DTYPE_BF16);
	t_attn(0, 200, 200, 8, 2, 32, SFW_DTYPE_BF16);
	t_attn(0, 200, 2000, 16, 2, 128, SFW_DTYPE_BF16);
	t_attn(1, 77, 1500, 8, 2, 32, SFW_DTYPE_BF16);
	t_attn(1, 130, 3000, 16, 1, 64, SFW_DTYPE_BF16);
	/* f32 activations (CUDA cores): the dequantized values are the twin's */
	t_attn(1, 1, 20000, 32, 2, 128, SFW_DTYPE_F32);
	t_attn(0, 1, 7000, 32, 2, 128, SFW_DTYPE_F32);
	t_attn(0, 45, 300, 32, 2, 128, SFW_DTYPE_F32);
	t_attn(1, 64, 4000, 8, 2, 32, SFW_DTYPE_F32);
	for (int d = 0; d < 2; d++)
		t_attn_seqs(dts[d]);
}

/* ---- timings: the fp8 cache against the bf16 one ---- */

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* A real selection's shape (gpu_attn_tc's bench_idx, every row its own
 * picks): block 0, the 33 local blocks, 62 random past blocks, ascending. */
static int32_t *bench_idx(int nkv, int T, int64_t pos0, int k)
{
	int32_t *idx = malloc((size_t)nkv * T * k * 4);
	for (int g = 0; g < nkv; g++)
		for (int r = 0; r < T; r++) {
			int64_t qb = (pos0 + r) / 64, lo = 1, hi = qb - 33;
			int32_t *sel = idx + ((size_t)g * T + r) * k;
			int n = 0;
			sel[n++] = 0;
			for (int64_t b = qb - 32 < 1 ? 1 : qb - 32; b <= qb; b++)
				sel[n++] = (int32_t)b;
			for (int i = 0; i < 62 && n < k && hi >= lo; i++) {
				int32_t b = (int32_t)(lo + (int64_t)(sfwt_next(&rng) % (uint64_t)(hi - lo + 1))), dup = 0;
				for (int j = 0; j < n && !dup; j++)
					dup = sel[j] == b;
				if (!dup)
					sel[n++] = b;
			}
			qsort(sel, (size_t)n, sizeof(int32_t), cmp_i32);
			for (int i = n; i < k; i++)
				sel[i] = -1;
		}
	return idx;
}

struct bench {
	void *o, *q, *idx;
	struct sfw_cuda_kv kv;
	struct sfw_attn_shape sh;
	/* kv_write timing: T rows of k, v */
	void *k, *v;
	int write;
};

static void bench_run(struct bench *b)
{
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, b->write ? 0 : b->sh.pos0)};
	if (b->write)
		sfw_cuda_kv_write(&b->kv, b->k, b->v, b->sh.nkv, b->sh.hd, b->sh.T, &rr, SFW_DTYPE_BF16, g_cx);
	else if (b->idx)
		sfw_cuda_attn_sparse(b->o, b->q, &b->kv, b->idx, &b->sh, &rr, SFW_DTYPE_BF16, g_cx);
	else
		sfw_cuda_attn_dense(b->o, b->q, &b->kv, &b->sh, &rr, SFW_DTYPE_BF16, g_cx);
}

static float bench_ms(struct bench *b)
{
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	float t[5];
	bench_run(b); /* warm-up */
	for (int i = 0; i < 5; i++) {
		sfw_cuda_event_record(e0, g_s);
		bench_run(b);
		sfw_cuda_event_record(e1, g_s);
		t[i] = sfw_cuda_event_ms(e0, e1);
	}
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
	for (int i = 1; i < 5; i++) /* median */
		for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
			float x = t[j];
			t[j] = t[j - 1], t[j - 1] = x;
		}
	return t[2];
}

/* One shape (nh 32, nkv 2, hd 128, k 96) through the bf16 and the fp8
 * cache on the kernel `mode` forces (1 simt, 2 tc); the fp8 cache written
 * from the bf16 one by sfw_cuda_kv_write (timed against the bf16 copy). */
static void bench_attn(int sparse, int T, int64_t L, int mode)
{
	const int nh = 32, nkv = 2, hd = 128, k = 96;
	size_t nq = (size_t)T * nh * hd, nc = (size_t)L * nkv * hd, b8 = sfw_kv8_bytes(L, nkv, hd);
	struct bench b = {dalloc(nq * 2), dalloc(nq * 2), NULL, {dalloc(nc * 2), dalloc(nc * 2), NULL, 0},
			  {T, nh, nkv, hd, L - T, 1.0f / sqrtf((float)hd), k, 64}, NULL, NULL, 0};
	sfw_cuda_fill_bf16(b.q, nq, 1, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.kv.kc, nc, 2, 1.0f, g_s);
	sfw_cuda_fill_bf16(b.kv.vc, nc, 3, 1.0f, g_s);
	int32_t *idx = sparse ? bench_idx(nkv, T, L - T, k) : NULL;
	b.idx = sparse ? up(idx, (size_t)nkv * T * k * 4) : NULL;
	struct sfw_cuda_kv kb = b.kv, k8 = {dalloc(b8), dalloc(b8), NULL, 1};
	struct bench w = b;
	w.write = 1, w.k = kb.kc, w.v = kb.vc, w.sh.T = (int)L;
	w.kv = (struct sfw_cuda_kv){dalloc(nc * 2), dalloc(nc * 2), NULL, 0};
	float wb = bench_ms(&w);
	sfw_cuda_free(w.kv.kc), sfw_cuda_free(w.kv.vc);
	w.kv = k8;
	float w8 = bench_ms(&w);
	g_cx->attn = mode;
	float tb = bench_ms(&b);
	b.kv = k8;
	float t8 = bench_ms(&b);
	g_cx->attn = 0;
	printf("  attn_%s T=%d L=%lld [%s]: bf16 cache %8.3f ms, fp8 cache %8.3f ms (%.2fx); kv_write of L rows: "
	       "copy %.3f ms, quantize %.3f ms\n",
	       sparse ? "sparse" : "dense", T, (long long)L, mode == 1 ? "simt" : "tc", tb, t8, t8 / tb, wb, w8);
	free(idx);
	sfw_cuda_free(b.o), sfw_cuda_free(b.q), sfw_cuda_free(b.idx), sfw_cuda_free(kb.kc), sfw_cuda_free(kb.vc);
	sfw_cuda_free(k8.kc), sfw_cuda_free(k8.vc);
}

static void benches(void)
{
	printf("timings (median of 5, event-timed; nh 32, nkv 2, hd 128, k 96)\n");
	bench_attn(1, 1, 131072, 1);
	bench_attn(0, 1, 32768, 1);
	bench_attn(1, 8192, 131072, 2);
	bench_attn(1, 8192, 131072, 1);
	bench_attn(0, 8192, 8192, 2);
	bench_attn(1, 64, 131072, 1);
}

int main(int argc, char **argv)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_kv8");
	}
	if (sfw_cuda_stream_new(&g_s, &err) != SFW_OK || sfw_cuda_ctx_new(g_s, &g_cx, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_kv8");
	}
	printf("the fp8 KV cache on %s (sm_%d%d) against its C twins\n", info.name, info.cc_major, info.cc_minor);
	const char *what = argc > 1 ? argv[1] : "check";
	if (strcmp(what, "bench") != 0)
		checks();
	if (strcmp(what, "check") != 0)
		benches();
	sfw_cuda_ctx_free(g_cx);
	size_t live;
	sfw_cuda_mem_stats(&live, NULL, NULL);
	CHECK(live == 0, "device bytes still allocated after the tests: %zu", live);
	sfw_cuda_stream_free(g_s);
	return CHECK_REPORT("gpu_kv8");
}
