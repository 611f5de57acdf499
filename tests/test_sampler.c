/* modules: runner formats kernels num core */
/* test_sampler.c - the sampler against mathematics: argmax ties, empirical
 * distributions of 20000 draws against softmax(logits / T) by chi-square,
 * truncation sets computed independently here, seeds and bad parameters. */
#include "check.h"

#include "runner/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DRAWS 20000

/* Chi-square critical values at p = 0.001 for df = 1..15 (standard table).
 * A fixed seed makes each test deterministic; a correct sampler passes with
 * probability 0.999 per seed, and the seeds below are fixed. */
static const double chi2_crit_001[16] = {0,      10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322,
					 26.124, 27.877, 29.588, 31.264, 32.909, 34.528, 36.123, 37.697};

/* A tiny independent generator for test data (not the sampler's). */
static uint64_t lcg = 12345;
static double urand(void)
{
	lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(lcg >> 11) * 0x1.0p-53;
}

/* Chi-square critical value at p = 0.001: the table, or Wilson-Hilferty's
 * approximation above df 15 (z = 3.0902). */
static double chi2_crit(int df)
{
	if (df <= 15)
		return chi2_crit_001[df];
	double h = 2.0 / (9.0 * df);
	return df * pow(1.0 - h + 3.0902 * sqrt(h), 3);
}

static const float *sort_logits;
static int cmp_ref(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;
	if (sort_logits[a] != sort_logits[b])
		return sort_logits[a] > sort_logits[b] ? -1 : 1;
	return a < b ? -1 : 1;
}

/* Reference: which ids survive top-k then top-p, by sorting everything. */
static void allowed_set(const float *l, int V, int top_k, double top_p, int *allowed)
{
	int *order = malloc(sizeof(int) * (size_t)V);
	for (int i = 0; i < V; i++)
		order[i] = i;
	sort_logits = l;
	qsort(order, (size_t)V, sizeof(int), cmp_ref);
	int n = top_k > 0 && top_k < V ? top_k : V;
	double sum = 0, acc = 0;
	for (int i = 0; i < n; i++)
		sum += exp((double)l[order[i]]);
	int keep = n;
	if (top_p < 1.0)
		for (int i = 0; i < n; i++) {
			acc += exp((double)l[order[i]]) / sum;
			if (acc >= top_p - 1e-12) {
				keep = i + 1;
				break;
			}
		}
	memset(allowed, 0, sizeof(int) * (size_t)V);
	for (int i = 0; i < keep; i++)
		allowed[order[i]] = 1;
	free(order);
}

/* Draws DRAWS samples and compares them with softmax(l / T) over `allowed`.
 * Returns the chi-square statistic; *outside counts draws outside allowed. */
static double chi2_run(const float *l, int V, const struct sfw_op_sample_params *p, uint64_t seed, const int *allowed, int *df,
		       int *outside)
{
	struct sfw_sampler s;
	struct sfw_err err = {0};
	if (sfw_sampler_init(&s, p, seed, V, &err) != SFW_OK) {
		printf("init: %s\n", err.msg);
		return INFINITY;
	}
	long *count = calloc((size_t)V, sizeof(long));
	*outside = 0;
	for (int i = 0; i < DRAWS; i++) {
		int32_t id = sfw_sampler_sample(&s, l, V);
		if (id < 0 || id >= V || !allowed[id])
			(*outside)++;
		else
			count[id]++;
	}
	sfw_sampler_release(&s);
	double mx = -INFINITY, sum = 0, chi2 = 0;
	for (int i = 0; i < V; i++)
		if (allowed[i] && l[i] > mx)
			mx = l[i];
	for (int i = 0; i < V; i++)
		if (allowed[i])
			sum += exp((l[i] - mx) / p->temperature);
	int cells = 0;
	for (int i = 0; i < V; i++) {
		if (!allowed[i])
			continue;
		double e = DRAWS * exp((l[i] - mx) / p->temperature) / sum;
		chi2 += (count[i] - e) * (count[i] - e) / e;
		cells++;
	}
	free(count);
	*df = cells - 1;
	return chi2;
}

static void test_distribution(const char *name, const float *l, int V, float T, int top_k, float top_p,
			      uint64_t seed)
{
	struct sfw_op_sample_params p = sfw_sampler_default_params();
	p.temperature = T;
	p.top_k = top_k;
	p.top_p = top_p;
	int *allowed = malloc(sizeof(int) * (size_t)V), df = 0, outside = -1;
	allowed_set(l, V, top_k, top_p, allowed);
	double chi2 = chi2_run(l, V, &p, seed, allowed, &df, &outside);
	free(allowed);
	CHECK(outside == 0, "%s: %d draws outside the allowed set", name, outside);
	CHECK(df >= 1 && chi2 < chi2_crit(df), "%s: chi2 %.2f < %.3f (df %d)", name, chi2, df >= 1 ? chi2_crit(df) : 0.0,
	      df);
}

/* Nuclei that fit the sampler's first guesses (the best 64, then 512) and
 * one that needs the full sort: a few large logits over a flat floor. */
static void test_nucleus_sizes(void)
{
	static float l[3000];
	static const struct {
		int V, n_big;
		float big, top_p;
	} cases[] = {{3000, 12, 9.0f, 0.7f}, {1000, 100, 7.0f, 0.8f}, {600, 0, 0.0f, 0.5f}};
	for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
		int V = cases[c].V;
		for (int i = 0; i < V; i++)
			l[i] = (float)(urand() * 0.5);
		for (int i = 0; i < cases[c].n_big; i++)
			l[(i * 7919) % V] += cases[c].big;
		int *allowed = malloc(sizeof(int) * (size_t)V), kept = 0;
		allowed_set(l, V, 0, cases[c].top_p, allowed);
		for (int i = 0; i < V; i++)
			kept += allowed[i];
		free(allowed);
		char name[96];
		snprintf(name, sizeof(name), "V=%d, %d large logits, top-p %.1f (nucleus %d)", V, cases[c].n_big,
			 (double)cases[c].top_p, kept);
		test_distribution(name, l, V, 0.9f, 0, cases[c].top_p, 100 + c);
	}
}

static void test_greedy(void)
{
	float tie[] = {1, 3, 3, 2};
	float nan_first[] = {NAN, 2, 5, 5, -INFINITY};
	float all_nan[] = {NAN, NAN};
	float neg[] = {-INFINITY, -5, -5};
	CHECK(sfw_sampler_argmax(tie, 4) == 1, "argmax: first of tied maxima");
	CHECK(sfw_sampler_argmax(nan_first, 5) == 2, "argmax skips NaN");
	CHECK(sfw_sampler_argmax(all_nan, 2) == 0, "argmax of all NaN is 0");
	CHECK(sfw_sampler_argmax(neg, 3) == 1, "argmax with -inf");

	struct sfw_op_sample_params p = sfw_sampler_default_params();
	CHECK(p.temperature == 0.9f && p.top_k == 0 && p.top_p == 1.0f && !p.greedy, "defaults: T 0.9, no top-k/p");
	struct sfw_sampler g, z, k1;
	struct sfw_err err = {0};
	p.greedy = 1;
	int ok = sfw_sampler_init(&g, &p, SFW_SAMPLER_DEFAULT_SEED, 64, &err) == SFW_OK;
	p.greedy = 0;
	p.temperature = 0;
	ok = ok && sfw_sampler_init(&z, &p, SFW_SAMPLER_DEFAULT_SEED, 64, &err) == SFW_OK;
	p.temperature = 0.9f;
	p.top_k = 1;
	ok = ok && sfw_sampler_init(&k1, &p, SFW_SAMPLER_DEFAULT_SEED, 64, &err) == SFW_OK;
	CHECK(ok, "init greedy samplers");
	int same = 1;
	for (int r = 0; r < 200 && ok; r++) {
		float l[64];
		for (int i = 0; i < 64; i++)
			l[i] = (float)floor(urand() * 8); /* many ties */
		int32_t want = 0;
		for (int i = 1; i < 64; i++)
			if (l[i] > l[want])
				want = i;
		same = same && sfw_sampler_sample(&g, l, 64) == want && sfw_sampler_sample(&z, l, 64) == want &&
		       sfw_sampler_sample(&k1, l, 64) == want;
	}
	CHECK(same, "greedy, T = 0 and top-k 1 all give the first argmax");
	sfw_sampler_release(&g);
	sfw_sampler_release(&z);
	sfw_sampler_release(&k1);
}

static void test_seeds(void)
{
	struct sfw_op_sample_params p = sfw_sampler_default_params();
	struct sfw_sampler a, b, c;
	struct sfw_err err = {0};
	CHECK(sfw_sampler_init(&a, &p, 0, 32, &err) == SFW_OK, "init");
	/* splitmix64's first output for state 0 (Vigna's reference code). */
	CHECK(a.rng[0] == 0xE220A8397B1DCDAFull, "splitmix64 seeding: %016llx", (unsigned long long)a.rng[0]);
	sfw_sampler_release(&a);

	p.top_p = 0.95f;
	int ok = sfw_sampler_init(&a, &p, 7, 32, &err) == SFW_OK && sfw_sampler_init(&b, &p, 7, 32, &err) == SFW_OK;
	ok = ok && sfw_sampler_init(&c, &p, 8, 32, &err) == SFW_OK;
	CHECK(ok, "init seeded samplers");
	float l[32];
	for (int i = 0; i < 32; i++)
		l[i] = (float)(urand() * 2);
	int same = 1, differ = 0;
	for (int i = 0; i < 1000 && ok; i++) {
		int32_t x = sfw_sampler_sample(&a, l, 32), y = sfw_sampler_sample(&b, l, 32),
			z = sfw_sampler_sample(&c, l, 32);
		same = same && x == y;
		differ += x != z;
	}
	CHECK(same, "same seed, same sequence");
	CHECK(differ > 500, "another seed, another sequence (%d of 1000 differ)", differ);
	sfw_sampler_release(&a);
	sfw_sampler_release(&b);
	sfw_sampler_release(&c);
}

static void test_edges(void)
{
	struct sfw_sampler s;
	struct sfw_err err = {0};
	struct sfw_op_sample_params p = sfw_sampler_default_params();
	CHECK(sfw_sampler_init(&s, &p, SFW_SAMPLER_DEFAULT_SEED, 4, &err) == SFW_OK, "init");
	float inf[] = {0, INFINITY, 1, INFINITY};
	float masked[] = {-INFINITY, 0.5f, NAN, -INFINITY};
	float none[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
	int ok_inf = 1, ok_mask = 1;
	for (int i = 0; i < 200; i++) {
		ok_inf = ok_inf && sfw_sampler_sample(&s, inf, 4) == 1;
		ok_mask = ok_mask && sfw_sampler_sample(&s, masked, 4) == 1;
	}
	CHECK(ok_inf, "+inf logit wins (first one)");
	CHECK(ok_mask, "-inf and NaN are never drawn");
	CHECK(sfw_sampler_sample(&s, none, 4) == 0, "all -inf: id 0");
	sfw_sampler_release(&s);

	static const struct {
		float t;
		int k;
		float tp;
		int v;
	} bad[] = {{-1, 0, 1, 4}, {NAN, 0, 1, 4}, {INFINITY, 0, 1, 4}, {1, -1, 1, 4},
		   {1, 0, 0, 4},  {1, 0, 1.5f, 4}, {1, 0, NAN, 4},     {1, 0, 1, 0},
		   {1e-40f, 0, 1, 4}}; /* 1/T overflows: was the least likely id every time */
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		p.temperature = bad[i].t;
		p.top_k = bad[i].k;
		p.top_p = bad[i].tp;
		CHECK(sfw_sampler_init(&s, &p, 1, bad[i].v, &err) == SFW_E_INVAL && !s.vocab, "bad params %zu: %s", i,
		      err.msg);
	}
	int eos[] = {2, 73440};
	CHECK(sfw_sampler_is_stop(2, eos, 2) && sfw_sampler_is_stop(73440, eos, 2) && !sfw_sampler_is_stop(1, eos, 2) &&
		      !sfw_sampler_is_stop(73441, eos, 2) && !sfw_sampler_is_stop(2, eos, 0),
	      "stop ids 2 and 73440");
}

/* The real vocab: top-k/top-p never return an excluded id. */
static void test_big_vocab(void)
{
	enum { V = 73448 };
	float *l = malloc(sizeof(float) * V);
	if (!l) {
		CHECK(0, "malloc");
		return;
	}
	for (int i = 0; i < V; i++)
		l[i] = (float)(urand() * 20 - 10);
	/* Threshold of the 40th largest, computed by counting. */
	struct sfw_sampler s;
	struct sfw_err err = {0};
	struct sfw_op_sample_params p = sfw_sampler_default_params();
	p.top_k = 40;
	CHECK(sfw_sampler_init(&s, &p, 3, V, &err) == SFW_OK, "init big");
	int ok = 1;
	for (int r = 0; r < 100; r++) {
		int32_t id = sfw_sampler_sample(&s, l, V);
		int above = 0;
		for (int i = 0; i < V; i++)
			above += l[i] > l[id];
		ok = ok && above < 40;
	}
	CHECK(ok, "top-k 40 over 73448 logits stays in the top 40");
	sfw_sampler_release(&s);
	free(l);
}

/* ---- penalties, biases, min-p and logprobs (sfw_op_sample_params' additions) */

/* The adjusted logits computed here from the formula (ops.h), independently
 * of kernels/sample.c. */
static void adjusted(const float *l, int V, const struct sfw_op_sample_params *p, double *out)
{
	for (int i = 0; i < V; i++)
		out[i] = l[i];
	for (int k = 0; k < p->n_adj; k++) {
		const struct sfw_sample_adj *a = &p->adj[k];
		double x = out[a->id];
		if (a->seen && p->repetition_penalty > 0 && p->repetition_penalty != 1)
			x = x > 0 ? x / p->repetition_penalty : x * p->repetition_penalty;
		x -= a->count * (double)p->frequency_penalty + (a->count > 0 ? p->presence_penalty : 0);
		out[a->id] = x + a->bias;
	}
}

/* The distribution to draw from, computed directly: survivors of top-k (by
 * value, lower id on ties), top-p and min-p at temperature 1, softmax at T. */
static void direct_dist(const double *x, int V, int top_k, double top_p, double min_p, double T, double *prob)
{
	int *ord = malloc((size_t)V * sizeof(int));
	for (int i = 0; i < V; i++)
		ord[i] = i;
	for (int i = 1; i < V; i++) /* insertion sort: larger first, lower id on ties */
		for (int j = i; j > 0 && (x[ord[j]] > x[ord[j - 1]]); j--) {
			int t = ord[j];
			ord[j] = ord[j - 1];
			ord[j - 1] = t;
		}
	int m = top_k > 0 && top_k < V ? top_k : V;
	double mx = x[ord[0]], tot = 0, acc = 0;
	for (int i = 0; i < m; i++)
		tot += exp(x[ord[i]] - mx);
	for (int i = 0; top_p < 1 && i < m; i++) {
		acc += exp(x[ord[i]] - mx);
		if (acc >= top_p * tot) {
			m = i + 1;
			break;
		}
	}
	while (m > 1 && exp(x[ord[m - 1]] - mx) < min_p)
		m--;
	double z = 0;
	for (int i = 0; i < V; i++)
		prob[i] = 0;
	for (int i = 0; i < m; i++)
		z += exp((x[ord[i]] - mx) / T);
	for (int i = 0; i < m; i++)
		prob[ord[i]] = exp((x[ord[i]] - mx) / T) / z;
	free(ord);
}

/* For a grid of N uniforms the share drawing each id is its probability
 * (within 1/N and rounding), the logprobs reported are log(prob), the top
 * list is the most probable ids in order. */
static void test_extras_case(const char *name, const float *l, int V, struct sfw_op_sample_params p)
{
	enum { N = 20000 };
	double *x = malloc((size_t)V * sizeof(double)), *prob = malloc((size_t)V * sizeof(double));
	int *hits = calloc((size_t)V, sizeof(int));
	adjusted(l, V, &p, x);
	direct_dist(x, V, p.top_k, p.top_p, p.min_p, p.greedy ? 1.0 : p.temperature, prob);
	struct sfw_sample_lp lp;
	p.logprobs = &lp;
	int lp_ok = 1, top_ok = 1, outside = 0;
	double worst = 0;
	for (int j = 0; j < N; j++) {
		memset(&lp, 0xff, sizeof(lp));
		int32_t id = sfw_op_sample_cpu(NULL, l, V, &p, (j + 0.5) / N);
		if (id < 0 || id >= V || prob[id] == 0) {
			outside++;
			continue;
		}
		hits[id]++;
		double d = fabs(lp.logprob - log(prob[id]));
		worst = d > worst ? d : worst;
		lp_ok &= d < 1e-4;
		if (j % 997 == 0) { /* the top list */
			int want = p.top_logprobs;
			int ns = 0;
			for (int i = 0; i < V; i++)
				ns += prob[i] > 0;
			top_ok &= lp.n_top == (want < ns ? want : ns);
			for (int t = 0; top_ok && t < lp.n_top; t++) {
				int32_t ti = lp.top_id[t];
				top_ok &= ti >= 0 && ti < V && prob[ti] > 0 &&
					  fabs(lp.top_logprob[t] - log(prob[ti])) < 1e-4;
				if (t > 0) {
					int32_t pi = lp.top_id[t - 1];
					top_ok &= x[pi] > x[ti] || (x[pi] == x[ti] && pi < ti);
				}
				for (int i = 0; top_ok && i < V; i++) /* nothing better left out */
					if (prob[i] > prob[ti] * (1 + 1e-9)) {
						int in = 0;
						for (int q = 0; q < t; q++)
							in |= lp.top_id[q] == i;
						top_ok &= in;
					}
			}
		}
	}
	double dev = 0;
	for (int i = 0; i < V; i++) {
		double d = fabs((double)hits[i] / N - (p.greedy ? 0 : prob[i]));
		if (!p.greedy)
			dev = d > dev ? d : dev;
	}
	CHECK(outside == 0, "%s: every draw is a survivor of the direct computation (%d outside)", name,
	      outside);
	CHECK(dev < 2.0 / N + 1e-5, "%s: the uniform grid draws each id at its probability (worst %.2e)",
	      name, dev);
	CHECK(lp_ok, "%s: the chosen token's logprob is log(prob) (worst %.2e)", name, worst);
	CHECK(top_ok, "%s: top_logprobs: the most probable survivors, in order, log(prob)", name);
	free(x), free(prob), free(hits);
}

static void test_extras(void)
{
	enum { V = 40 };
	float l[V];
	for (int i = 0; i < V; i++)
		l[i] = (float)(3 * sin(i * 1.7) + 0.1 * i);
	l[7] = l[8]; /* a tie */
	struct sfw_sample_adj adj[] = {{3, 2, 1, 0},	 {11, 0, 1, 0},	    {17, 1, 1, 0.5f},
				       {25, 0, 0, 2.5f}, {31, 4, 1, -1.0f}, {5, 0, 0, -100}};
	struct sfw_op_sample_params base = {.temperature = 0.8f, .top_p = 1.0f};
	struct sfw_op_sample_params p = base;
	p.top_logprobs = 5;
	test_extras_case("logprobs, T 0.8", l, V, p);
	p.min_p = 0.2f;
	test_extras_case("min-p 0.2, T 0.8", l, V, p);
	p.top_k = 12, p.top_p = 0.9f;
	test_extras_case("top-k 12 + top-p 0.9 + min-p 0.2", l, V, p);
	p = base, p.top_logprobs = 20, p.top_p = 0.8f, p.min_p = 0.05f;
	test_extras_case("top-p 0.8 + min-p 0.05, 20 top", l, V, p);
	p = base, p.top_logprobs = 3;
	p.repetition_penalty = 1.3f, p.presence_penalty = 0.4f, p.frequency_penalty = 0.3f;
	p.adj = adj, p.n_adj = (int)(sizeof(adj) / sizeof(adj[0]));
	test_extras_case("penalties and biases, T 0.8", l, V, p);
	p.temperature = 1.4f, p.top_k = 9;
	test_extras_case("penalties and biases, top-k 9, T 1.4", l, V, p);
	p.greedy = 1, p.top_k = 0;
	test_extras_case("greedy: logprobs at temperature 1", l, V, p);
	/* greedy follows the penalties: the argmax of the adjusted logits */
	double x[V];
	adjusted(l, V, &p, x);
	int want = 0;
	for (int i = 1; i < V; i++)
		if (x[i] > x[want])
			want = i;
	struct sfw_op_sample_params g = p;
	g.logprobs = NULL;
	CHECK(sfw_op_sample_cpu(NULL, l, V, &g, 0.3) == want, "greedy: the argmax after penalties (%d)",
	      want);
	/* logit_bias: +100 takes every draw, -100 none */
	struct sfw_sample_adj force = {13, 0, 0, 100}, ban = {want, 0, 0, -100};
	struct sfw_op_sample_params f = base;
	f.adj = &force, f.n_adj = 1;
	int all = 1;
	for (int j = 0; j < 200; j++)
		all &= sfw_op_sample_cpu(NULL, l, V, &f, (j + 0.5) / 200) == 13;
	CHECK(all, "logit_bias +100 takes every draw");
	f = g, f.adj = &ban, f.n_adj = 1;
	CHECK(sfw_op_sample_cpu(NULL, l, V, &f, 0.5) != want, "logit_bias -100 bans the argmax");
	/* the input row is left as it was */
	float copy[V];
	memcpy(copy, l, sizeof(copy));
	(void)sfw_op_sample_cpu(NULL, l, V, &p, 0.5);
	CHECK(!memcmp(copy, l, sizeof(copy)), "the penalties leave the caller's logits alone");
	/* a certain choice (+inf) has logprob 0 */
	struct sfw_sample_lp lp;
	struct sfw_op_sample_params q = base;
	q.logprobs = &lp, q.top_logprobs = 2;
	l[9] = INFINITY;
	CHECK(sfw_op_sample_cpu(NULL, l, V, &q, 0.5) == 9 && lp.logprob == 0 && lp.n_top == 1 &&
		  lp.top_id[0] == 9,
	      "+inf: the choice is certain, logprob 0");
	/* the sampler refuses bad additions */
	struct sfw_sampler smp;
	struct sfw_err err = {0};
	struct sfw_op_sample_params bad[4] = {base, base, base, base};
	bad[0].min_p = 1.5f, bad[1].repetition_penalty = -1, bad[2].top_logprobs = 21, bad[3].n_adj = 2;
	for (int i = 0; i < 4; i++)
		CHECK(sfw_sampler_init(&smp, &bad[i], 1, V, &err) == SFW_E_INVAL, "bad addition %d refused",
		      i);
}

int main(void)
{
	test_greedy();
	test_seeds();
	test_edges();

	float l10[10];
	for (int i = 0; i < 10; i++)
		l10[i] = (float)(urand() * 4 - 2);
	test_distribution("softmax T=0.7", l10, 10, 0.7f, 0, 1.0f, 1);
	test_distribution("softmax T=1.5", l10, 10, 1.5f, 0, 1.0f, 2);
	test_distribution("softmax T=0.9 default", l10, 10, 0.9f, 0, 1.0f, 0x5a1afa11u);
	test_distribution("top-k 3, T=0.8", l10, 10, 0.8f, 3, 1.0f, 4);
	test_distribution("top-p 0.6, T=0.8", l10, 10, 0.8f, 0, 0.6f, 5);
	test_distribution("top-k 6 + top-p 0.7, T=1.2", l10, 10, 1.2f, 6, 0.7f, 6);
	float ties[8] = {1, 1, 1, 0.5f, 0.5f, 0, 0, -1};
	test_distribution("top-k 2 over ties (lower ids kept)", ties, 8, 1.0f, 2, 1.0f, 7);
	float flat[16];
	for (int i = 0; i < 16; i++)
		flat[i] = 0;
	test_distribution("uniform logits", flat, 16, 0.9f, 0, 1.0f, 8);
	test_nucleus_sizes();
	test_big_vocab();
	test_extras();
	return CHECK_REPORT("test_sampler");
}
