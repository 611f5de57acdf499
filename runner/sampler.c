/* sampler.c - the host side of the one sampler (see sampler.h): parameter
 * checks, the seeded uniform stream, and kernels/sample.c's choice. */
#include "runner/sampler.h"

#include <math.h>
#include <string.h>

struct sfw_op_sample_params sfw_sampler_default_params(void)
{
	struct sfw_op_sample_params p = {.temperature = 0.9f, .top_k = 0, .top_p = 1.0f, .greedy = 0};
	return p;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

enum sfw_status sfw_sampler_init(struct sfw_sampler *s, const struct sfw_op_sample_params *p, uint64_t seed,
				 int vocab, struct sfw_err *err)
{
	memset(s, 0, sizeof(*s));
	if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
		return sfw_fail(err, SFW_E_INVAL, "temperature %g must be finite and >= 0",
				(double)p->temperature);
	if (p->temperature > 0.0f && !isfinite(1.0f / p->temperature))
		return sfw_fail(err, SFW_E_INVAL, "temperature %g is too small to divide by (0 means greedy)",
				(double)p->temperature);
	if (p->top_k < 0)
		return sfw_fail(err, SFW_E_INVAL, "top-k %d must be >= 0", p->top_k);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return sfw_fail(err, SFW_E_INVAL, "top-p %g must be in (0, 1]", (double)p->top_p);
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return sfw_fail(err, SFW_E_INVAL, "min-p %g must be in [0, 1]", (double)p->min_p);
	if (!(p->repetition_penalty >= 0.0f) || !isfinite(p->repetition_penalty) ||
	    !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
		return sfw_fail(err, SFW_E_INVAL, "penalties must be finite (the repetition penalty > 0)");
	if (p->n_adj < 0 || (p->n_adj > 0 && !p->adj))
		return sfw_fail(err, SFW_E_INVAL, "%d penalty entries without a list", p->n_adj);
	if (p->top_logprobs < 0 || p->top_logprobs > SFW_SAMPLE_TOP_MAX)
		return sfw_fail(err, SFW_E_INVAL, "top logprobs %d must be 0 to %d", p->top_logprobs,
				SFW_SAMPLE_TOP_MAX);
	if (vocab < 1)
		return sfw_fail(err, SFW_E_INVAL, "vocab %d must be >= 1", vocab);
	s->p = *p;
	s->vocab = vocab;
	s->seed = seed;
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	return SFW_OK;
}

void sfw_sampler_release(struct sfw_sampler *s)
{
	memset(s, 0, sizeof(*s));
}

double sfw_sampler_uniform(struct sfw_sampler *s)
{
	return sfw_op_sample_uniform(s->rng);
}

int32_t sfw_sampler_sample(struct sfw_sampler *s, const float *logits, int vocab)
{
	SFW_ASSERT(vocab == s->vocab);
	double u = sfw_sampler_uniform(s);
	/* no executor: a failure is the -1 alone (kernels/ops.h) */
	return sfw_op_sample_cpu(NULL, logits, vocab, &s->p, u);
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
