/* sampler.h - next-token choice from a row of logits.
 *
 * Order (llama.cpp's default chain): top-k, then top-p, then temperature.
 *   1. top_k > 0 keeps the k largest logits (ties broken by the lower id);
 *   2. top_p < 1 keeps, among those, the smallest set of highest-probability
 *      tokens whose softmax(logits) mass (temperature 1, renormalised over
 *      the top-k survivors) reaches top_p — always at least one token;
 *   3. the survivors are drawn with probability softmax(logit / temperature).
 * greedy (or temperature == 0) returns the argmax, the lowest id on ties.
 * NaN logits are never chosen; a +inf logit wins outright (first one).
 *
 * Randomness: xoshiro256** seeded through splitmix64(seed), one 53-bit
 * uniform per sampled token, so a seed fixes the whole sequence on every
 * platform (no rand()). */
#ifndef SFW_SAMPLER_H
#define SFW_SAMPLER_H

#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

struct sfw_sampler_params {
	float temperature; /* > 0; 0 means greedy. Default 0.9 (the model card). */
	int top_k;         /* 0 = off */
	float top_p;       /* (0, 1]; 1 = off */
	uint64_t seed;     /* default 0x5a1afa11 */
	int greedy;        /* 1 = argmax, ignores the rest */
};

struct sfw_sampler_params sfw_sampler_default_params(void);

struct sfw_sampler_cand; /* private scratch entry */

/* Caller-owned; init allocates scratch for vocab entries, release frees it. */
struct sfw_sampler {
	struct sfw_sampler_params p;
	uint64_t rng[4];
	int vocab;
	struct sfw_sampler_cand *cand; /* scratch, 2 x vocab entries */
};

/* SFW_E_INVAL for temperature < 0 or not finite, top_k < 0, top_p outside
 * (0, 1], vocab < 1; SFW_E_NOMEM. */
SFW_MUST_CHECK enum sfw_status sfw_sampler_init(struct sfw_sampler *s, const struct sfw_sampler_params *p,
						int vocab, struct sfw_err *err);
void sfw_sampler_release(struct sfw_sampler *s);

/* Returns a token id in [0, vocab); vocab must equal the init vocab
 * (asserted). Pure function of the logits and the sampler's state. */
int32_t sfw_sampler_sample(struct sfw_sampler *s, const float *logits, int vocab);

/* Argmax with the lowest index on ties, NaN skipped (0 if all are NaN). */
int32_t sfw_sampler_argmax(const float *logits, int vocab);

/* 1 if id is one of the n_eos stop ids (config.json eos_token_id: 2, 73440). */
int sfw_sampler_is_stop(int32_t id, const int *eos_ids, int n_eos);

#endif
