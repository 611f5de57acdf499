/* sample.c - the CPU twin of kernels/sample.cu: next-token choice with the
 * meaning of runner/sampler.c for a given uniform u (kernels/ops.h), summed
 * and ordered exactly as the CUDA kernel does (kernels/sample_twin.h). */
#include "kernels/ops.h"
#include "kernels/sample_twin.h"
#include "alloc.h"
#include "sfw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_key_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

static int is_cand(float l)
{
	return !isnan(l) && l != -INFINITY;
}

/* A candidate that min-p keeps (when nothing else cuts: the draw in id
 * order); the same test as the kernel's. */
static int surv(float l, float max, float min_p)
{
	return is_cand(l) && (min_p <= 0.0f || sfws_exp(SFWS_SUB(l, max)) >= min_p);
}

/* The survivors' weight at inv_t (the draw's). */
static double wt(float l, float max, float inv_t)
{
	return sfws_exp(SFWS_MUL(SFWS_SUB(l, max), inv_t));
}

/* logprobs of a sorted survivor list k[0..m) with weight sum `sum` */
static void lp_sorted(struct sfw_sample_lp *lp, int top, const uint64_t *k, int m, double sum, float max,
		      float inv_t, float lid)
{
	lp->logprob = (float)log(wt(lid, max, inv_t) / sum);
	lp->n_top = top < m ? top : m;
	for (int i = 0; i < lp->n_top; i++) {
		lp->top_id[i] = sfws_key_id(k[i]);
		lp->top_logprob[i] = (float)log(wt(sfws_key_logit(k[i]), max, inv_t) / sum);
	}
}

/* The choice on logits lg (penalties already applied), its logprobs into lp
 * when not NULL. A greedy choice asking for logprobs takes the sampling
 * path at temperature 1 with the draw replaced by the argmax (force). */
/* The top survivors of a draw over the whole vocabulary, best first, into
 * lp (a selection of top keys, no sort of V entries). */
static void lp_survivors(struct sfw_sample_lp *lp, const float *lg, int V, int top, float max, float min_p,
			 double total, float inv_t, int32_t id)
{
	uint64_t tk[SFW_SAMPLE_TOP_MAX];
	int nt = 0;
	for (int i = 0; i < V && top; i++) {
		if (!surv(lg[i], max, min_p))
			continue;
		uint64_t key = sfws_key(lg[i], i);
		if (nt == top && key <= tk[nt - 1])
			continue;
		int j = nt < top ? nt++ : nt - 1;
		while (j > 0 && tk[j - 1] < key) {
			tk[j] = tk[j - 1];
			j--;
		}
		tk[j] = key;
	}
	lp_sorted(lp, nt, tk, nt, total, max, inv_t, lg[id]);
}

/* The n candidates' keys, best first (sfw_malloc'd; NULL when there is no
 * scratch). */
static uint64_t *cand_keys(const float *lg, int V, int n)
{
	uint64_t *k = sfw_malloc((size_t)n * sizeof(uint64_t));
	if (!k)
		return NULL;
	int m = 0;
	for (int i = 0; i < V; i++)
		if (is_cand(lg[i]))
			k[m++] = sfws_key(lg[i], i);
	qsort(k, (size_t)n, sizeof(*k), cmp_key_desc);
	return k;
}

/* The nucleus: the shortest prefix of the n keys (best first) whose weights
 * reach want; all n when none does. */
static int nucleus(const uint64_t *k, int n, float max, double want)
{
	double acc = 0;
	for (int i = 0; i < n; i++) {
		acc += sfws_exp(SFWS_SUB(sfws_key_logit(k[i]), max));
		if (acc >= want)
			return i + 1;
	}
	return n;
}

/* The choice (ops.h) from the logits as given; -1 when there is no scratch. */
static int32_t choose(const float *lg, int V, const struct sfw_op_sample_params *p, double u,
		      struct sfw_sample_lp *lp)
{
	int32_t best = -1, inf = -1;
	int n = 0;
	float max = -INFINITY;
	for (int i = 0; i < V; i++) {
		float l = lg[i];
		if (isnan(l))
			continue;
		if (best < 0 || l > lg[best])
			best = i;
		if (l == INFINITY) {
			if (inf < 0)
				inf = i;
		} else if (l != -INFINITY) {
			n++;
			if (l > max)
				max = l;
		}
	}
	if (best < 0)
		best = 0;
	int top = p->top_logprobs < 0			 ? 0
		  : p->top_logprobs > SFW_SAMPLE_TOP_MAX ? SFW_SAMPLE_TOP_MAX
							 : p->top_logprobs;
	/* a temperature so small that 1/T overflows is the greedy limit */
	int greedy = p->greedy || p->temperature == 0.0f || !isfinite(1.0f / p->temperature);
	if (n == 0 || inf >= 0 || (greedy && !lp)) {
		int32_t id = inf >= 0 ? inf : best;
		if (lp) { /* a certain choice */
			lp->logprob = 0;
			lp->n_top = top ? 1 : 0;
			lp->top_id[0] = id;
			lp->top_logprob[0] = 0;
		}
		return id;
	}
	int32_t force = greedy ? best : -1;
	int kk = p->top_k > 0 && p->top_k < n ? p->top_k : 0;
	int cut_p = p->top_p < 1.0f;
	float inv_t = greedy ? 1.0f : 1.0f / p->temperature, min_p = p->min_p;
	int C = (V + SFWS_THREADS - 1) / SFWS_THREADS;
	uint64_t *k = NULL;
	int m = 0;
	int32_t id;
	if (!kk) {
		/* full-vocabulary sums per chunk, as the kernel's threads make them */
		double part[SFWS_THREADS], total = 0;
		for (int t = 0; t < SFWS_THREADS; t++) {
			double s = 0;
			for (int i = t * C; i < V && i < (t + 1) * C; i++) {
				if (cut_p ? !is_cand(lg[i]) : !surv(lg[i], max, min_p))
					continue;
				s += cut_p ? sfws_exp(SFWS_SUB(lg[i], max)) : wt(lg[i], max, inv_t);
			}
			part[t] = s;
			total += s;
		}
		if (!cut_p) { /* draw in id order */
			double target = u * total, start = 0;
			id = -1;
			for (int t = 0; force < 0 && id < 0 && t < SFWS_THREADS; t++) {
				if (target < start + part[t]) {
					double acc = start;
					for (int i = t * C; i < V && i < (t + 1) * C; i++) {
						if (!surv(lg[i], max, min_p))
							continue;
						acc += wt(lg[i], max, inv_t);
						if (target < acc) {
							id = i;
							break;
						}
					}
				}
				start += part[t];
			}
			if (force >= 0)
				id = force;
			for (int i = V - 1; id < 0 && i >= 0; i--) /* rounding: the last survivor */
				if (surv(lg[i], max, min_p))
					id = i;
			if (lp)
				lp_survivors(lp, lg, V, top, max, min_p, total, inv_t, id);
			return id;
		}
		/* top-p alone: the nucleus is a prefix of all candidates, best first */
		if (!(k = cand_keys(lg, V, n)))
			return -1; /* no scratch */
		m = nucleus(k, n, max, (double)p->top_p * total);
	} else {
		/* top-k: the kk best, best first; then the nucleus among them */
		if (!(k = cand_keys(lg, V, n)))
			return -1;
		m = kk;
		if (cut_p) {
			double total = 0;
			for (int i = 0; i < kk; i++)
				total += sfws_exp(SFWS_SUB(sfws_key_logit(k[i]), max));
			m = nucleus(k, kk, max, (double)p->top_p * total);
		}
	}
	/* min-p: a prefix of the survivors (the best has weight 1) */
	while (min_p > 0.0f && m > 1 && !(sfws_exp(SFWS_SUB(sfws_key_logit(k[m - 1]), max)) >= min_p))
		m--;
	double sum = 0, acc = 0;
	for (int i = 0; i < m; i++)
		sum += wt(sfws_key_logit(k[i]), max, inv_t);
	double target = u * sum;
	id = sfws_key_id(k[m - 1]);
	for (int i = 0; force < 0 && i < m; i++) {
		acc += wt(sfws_key_logit(k[i]), max, inv_t);
		if (target < acc) {
			id = sfws_key_id(k[i]);
			break;
		}
	}
	if (force >= 0)
		id = force;
	if (lp)
		lp_sorted(lp, top, k, m, sum, max, inv_t, lg[id]);
	sfw_free(k);
	return id;
}

/* l after the penalties and the bias of one entry (ops.h) */
static float adjust(float l, const struct sfw_op_sample_params *p, const struct sfw_sample_adj *a)
{
	float rep = p->repetition_penalty;
	if (a->seen && rep > 0.0f && rep != 1.0f)
		l = l > 0.0f ? l / rep : l * rep;
	l -= (float)a->count * p->frequency_penalty + (a->count > 0 ? p->presence_penalty : 0.0f);
	return l + a->bias;
}

/* A choice with the penalties and biases applied; -1 without scratch. */
static int32_t choose_adjusted(const float *lg, int V, const struct sfw_op_sample_params *p, double u)
{
	float *a = sfw_malloc((size_t)V * sizeof(float));
	if (!a)
		return -1;
	memcpy(a, lg, (size_t)V * sizeof(float));
	for (int i = 0; i < p->n_adj; i++) {
		int32_t id = p->adj[i].id;
		if (id >= 0 && id < V)
			a[id] = adjust(a[id], p, &p->adj[i]);
	}
	int32_t id = choose(a, V, p, u, p->logprobs);
	sfw_free(a);
	return id;
}

int32_t sfw_op_sample_cpu(struct sfw_ops_cpu *ex, const float *lg, int V,
			  const struct sfw_op_sample_params *p, double u)
{
	int32_t id = p->n_adj > 0 ? choose_adjusted(lg, V, p, u) : choose(lg, V, p, u, p->logprobs);
	if (id < 0 && ex) /* no scratch (ops.h) */
		sfwi_ops_cpu_fail(ex);
	return id;
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

double sfw_op_sample_uniform(uint64_t s[4])
{
	/* xoshiro256** (Blackman & Vigna), the host sampler's generator */
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return (double)(r >> 11) * 0x1.0p-53;
}
