/* sampler.h - next-token choice from a row of logits: the one sampler.
 *
 * Meaning (llama.cpp's default chain; kernels/ops.h sfw_op_sample_cpu is the
 * implementation, shared with the CUDA twin): the penalties and logit biases
 * of the parameters' entries first, then top-k, then top-p among the
 * survivors at temperature 1, then min-p, then a draw at the temperature;
 * greedy (or temperature 0) returns the argmax, the lowest id on ties. NaN
 * logits are never chosen; a +inf logit wins outright (the first one). The
 * choice can report its log-probability and the best survivors' (ops.h
 * struct sfw_sample_lp).
 *
 * Parameters are struct sfw_op_sample_params (kernels/ops.h), the same struct
 * the device sampler takes, plus a seed. Randomness: xoshiro256**
 * (sfw_op_sample_uniform) seeded through splitmix64(seed); every sampled token takes exactly one
 * 53-bit uniform (greedy ones too), so a seed fixes the whole sequence on
 * every platform and backend (no rand()). */
#ifndef SFW_SAMPLER_H
#define SFW_SAMPLER_H

#include "kernels/ops.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

/* temperature 0.9 (the model card), top-k off, top-p 1 */
struct sfw_op_sample_params sfw_sampler_default_params(void);
#define SFW_SAMPLER_DEFAULT_SEED 0x5a1afa11u

/* Caller-owned. */
struct sfw_sampler {
	struct sfw_op_sample_params p;
	uint64_t seed;
	uint64_t rng[4];
	int vocab;
};

/* SFW_E_INVAL for temperature < 0, not finite or too small to divide by,
 * top_k < 0, top_p outside (0, 1], min_p outside [0, 1], penalties not
 * finite or a negative repetition penalty, n_adj < 0, top_logprobs outside
 * 0 .. SFW_SAMPLE_TOP_MAX, vocab < 1. The adj list and the logprobs
 * target are borrowed (the caller updates them between draws). */
SFW_MUST_CHECK enum sfw_status sfw_sampler_init(struct sfw_sampler *s, const struct sfw_op_sample_params *p,
						uint64_t seed, int vocab, struct sfw_err *err);
void sfw_sampler_release(struct sfw_sampler *s);

/* The next uniform in [0, 1) of the sampler's stream (what a device sampler
 * is given for the same draw). */
double sfw_sampler_uniform(struct sfw_sampler *s);

/* sfw_op_sample_cpu(logits, vocab, &s->p, sfw_sampler_uniform(s)): a token
 * id in [0, vocab), or -1 when the op's scratch could not be allocated (the
 * caller reports SFW_E_NOMEM). vocab must equal the init vocab (asserted). */
int32_t sfw_sampler_sample(struct sfw_sampler *s, const float *logits, int vocab);

/* Argmax with the lowest index on ties, NaN skipped (0 if all are NaN). */
int32_t sfw_sampler_argmax(const float *logits, int vocab);

/* 1 if id is one of the n_eos stop ids. */
int sfw_sampler_is_stop(int32_t id, const int *eos_ids, int n_eos);

#endif
