/* sampler.c - top-k, top-p, temperature and greedy choice (see sampler.h). */
#include "runner/sampler.h"

#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sfw_sampler_cand {
	float logit;
	int32_t id;
	float w; /* exp(logit - max), then the tempered weight */
};

struct sfw_sampler_params sfw_sampler_default_params(void)
{
	struct sfw_sampler_params p = {.temperature = 0.9f, .top_k = 0, .top_p = 1.0f, .seed = 0x5a1afa11u,
				       .greedy = 0};
	return p;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna). */
static uint64_t next_u64(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t s[4])
{
	return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

enum sfw_status sfw_sampler_init(struct sfw_sampler *s, const struct sfw_sampler_params *p, int vocab,
				 struct sfw_err *err)
{
	memset(s, 0, sizeof(*s));
	if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
		return sfw_fail(err, SFW_E_INVAL, "temperature %g must be finite and >= 0", (double)p->temperature);
	if (p->temperature > 0.0f && !isfinite(1.0f / p->temperature))
		return sfw_fail(err, SFW_E_INVAL, "temperature %g is too small to divide by (0 means greedy)",
				(double)p->temperature);
	if (p->top_k < 0)
		return sfw_fail(err, SFW_E_INVAL, "top-k %d must be >= 0", p->top_k);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return sfw_fail(err, SFW_E_INVAL, "top-p %g must be in (0, 1]", (double)p->top_p);
	if (vocab < 1)
		return sfw_fail(err, SFW_E_INVAL, "vocab %d must be >= 1", vocab);
	/* Two halves: the candidates and a selection buffer. */
	s->cand = sfw_calloc((size_t)vocab * 2, sizeof(*s->cand));
	if (!s->cand)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the sampler (%d entries)", vocab);
	s->p = *p;
	s->vocab = vocab;
	uint64_t x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	return SFW_OK;
}

void sfw_sampler_release(struct sfw_sampler *s)
{
	sfw_free(s->cand);
	memset(s, 0, sizeof(*s));
}

int32_t sfw_sampler_argmax(const float *logits, int vocab)
{
	int32_t best = -1;
	for (int i = 0; i < vocab; i++) {
		if (isnan(logits[i]))
			continue;
		if (best < 0 || logits[i] > logits[best])
			best = i;
	}
	return best < 0 ? 0 : best;
}

int sfw_sampler_is_stop(int32_t id, const int *eos_ids, int n_eos)
{
	for (int i = 0; i < n_eos; i++)
		if (eos_ids[i] == id)
			return 1;
	return 0;
}

/* a ranks before b: larger logit, then lower id. */
static int better(const struct sfw_sampler_cand *a, const struct sfw_sampler_cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb)
{
	const struct sfw_sampler_cand *a = pa, *b = pb;
	return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Min-heap on "better": the root is the worst of the kept k. */
static void sift_down(struct sfw_sampler_cand *h, int n, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, w = i;
		if (l < n && better(&h[w], &h[l]))
			w = l;
		if (r < n && better(&h[w], &h[r]))
			w = r;
		if (w == i)
			return;
		struct sfw_sampler_cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

/* The k best of src[0..n) (0 < k < n) into dst[0..k), sorted best first;
 * src is left as it was. */
static void select_top(const struct sfw_sampler_cand *src, int n, int k, struct sfw_sampler_cand *dst)
{
	memcpy(dst, src, (size_t)k * sizeof(*dst));
	for (int i = k / 2 - 1; i >= 0; i--)
		sift_down(dst, k, i);
	for (int i = k; i < n; i++) {
		if (better(&src[i], &dst[0])) {
			dst[0] = src[i];
			sift_down(dst, k, 0);
		}
	}
	qsort(dst, (size_t)k, sizeof(*dst), cmp_cand);
}

/* Draws from c[0..n) with weights exp((logit - max) / T). */
static int32_t draw(struct sfw_sampler *s, struct sfw_sampler_cand *c, int n, float max)
{
	float inv_t = 1.0f / s->p.temperature;
	double sum = 0.0;
	for (int i = 0; i < n; i++)
		sum += c[i].w = expf((c[i].logit - max) * inv_t);
	double u = next_unit(s->rng) * sum, acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += c[i].w;
		if (u < acc)
			return c[i].id;
	}
	return c[n - 1].id; /* rounding: u landed on the total */
}

/* Candidates: every logit above -inf (NaN excluded). Returns the count, or
 * -1 - id when logit id is +inf (all the mass sits on the first one). */
static int gather(struct sfw_sampler_cand *c, const float *logits, int vocab, float *max)
{
	int n = 0;
	*max = -INFINITY;
	for (int i = 0; i < vocab; i++) {
		float l = logits[i];
		if (isnan(l) || l == -INFINITY)
			continue;
		if (l == INFINITY)
			return -1 - i;
		c[n].logit = l;
		c[n].id = i;
		n++;
		if (l > *max)
			*max = l;
	}
	return n;
}

/* Sets w = exp(logit - max) (temperature 1) and returns their sum. */
static double weigh(struct sfw_sampler_cand *c, int n, float max)
{
	double total = 0.0;
	for (int i = 0; i < n; i++)
		total += c[i].w = expf(c[i].logit - max);
	return total;
}

/* Sorted c[0..n) with weights: the shortest prefix whose mass reaches
 * top_p * total (at least one). */
static int nucleus(const struct sfw_sampler_cand *c, int n, double top_p, double total)
{
	double want = top_p * total, acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += c[i].w;
		if (acc >= want)
			return i + 1;
	}
	return n;
}

int32_t sfw_sampler_sample(struct sfw_sampler *s, const float *logits, int vocab)
{
	SFW_ASSERT(vocab == s->vocab);
	if (s->p.greedy || s->p.temperature == 0.0f)
		return sfw_sampler_argmax(logits, vocab);
	struct sfw_sampler_cand *c = s->cand, *sel = s->cand + vocab;
	float max;
	int n = gather(c, logits, vocab, &max);
	if (n < 0)
		return -1 - n;
	if (n == 0)
		return sfw_sampler_argmax(logits, vocab);
	int k = s->p.top_k;
	double top_p = s->p.top_p;
	if (k > 0 && k < n) {
		select_top(c, n, k, sel);
		c = sel;
		n = k;
		if (top_p < 1.0)
			n = nucleus(c, n, top_p, weigh(c, n, max));
	} else if (top_p < 1.0) {
		/* The nucleus is usually small: look for it among the best 64,
		 * then 512, ... before sorting all candidates. */
		double total = weigh(c, n, max);
		for (int kk = 64;; kk *= 8) {
			if (kk >= n) {
				qsort(c, (size_t)n, sizeof(*c), cmp_cand);
				n = nucleus(c, n, top_p, total);
				break;
			}
			select_top(c, n, kk, sel);
			int m = nucleus(sel, kk, top_p, total);
			if (m < kk) { /* reached inside the best kk */
				c = sel;
				n = m;
				break;
			}
		}
	}
	return draw(s, c, n, max);
}
