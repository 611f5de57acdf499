/* plan.h - the device memory the engine needs for a context or a batch
 * (bf16 or int8 weights, caches, activations, scratch), worked out from the
 * shapes alone, and the check that admits or refuses a context of n_ctx
 * tokens before anything is allocated (`salafw run`, `salafw serve`,
 * `salafw bench` print the plan; tests/test_bench_plan.c checks it against
 * independent figures). */
#ifndef SFW_PLAN_H
#define SFW_PLAN_H

#include "formats/config.h"
#include "runner/runner.h"
#include "sfw.h"

#include <stdint.h>
#include <stdio.h>

/* Parameters of all linear layers (lm_head apart). */
double sfw_plan_linear_params(const struct sfw_config *c);

/* Device memory a context of max_ctx tokens needs on the CUDA backend, in
 * bytes (bf16 weights and activations). */
struct sfw_mem_plan {
	double weights;        /* every tensor, bf16 */
	double kv_per_token;   /* sparse layers' K and V (bf16, or with kv8 fp8 and its scales) */
	double kv;             /* kv_per_token * max_ctx (64-token blocks) */
	double compressed;     /* both levels of compressed keys */
	double lightning;      /* fp32 states */
	double activations;    /* forward.c's buffers for one piece of `chunk` rows + logits */
	double scratch;        /* op scratch, cuBLASLt workspace, block-selection scratch */
	double total;
	int seqs;              /* sequences planned for (sfw_plan_batch); 0 or 1: one context */
	int parked;            /* of them, slots kept for parked sequences (serve's prefix-cache
				* entries): named apart when printed; their KV is the pool's */
	int kv8;               /* the KV cache is fp8 (--kv-cache fp8; sfw_plan_model from the
				* model, sfw_plan_kv8), else bf16 */
};
void sfw_plan_config(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p);
/* The same with int8 decoder linears (codes + BF16 scales of `group`, 32,
 * 64, 128 or SFW_QL_GROUP_CHANNEL), embedding, lm_head and norms bf16: what
 * `salafw quant --group G` and `mkmodel --w8` produce. */
void sfw_plan_config_w8(const struct sfw_config *c, int64_t max_ctx, int chunk, int group, struct sfw_mem_plan *p);
/* A plan of one context of max_ctx tokens made by either of the above,
 * its KV cache made fp8 (--kv-cache fp8). */
void sfw_plan_kv8(const struct sfw_config *c, int64_t max_ctx, struct sfw_mem_plan *p);
/* The plan of a loaded model: its weights as bound (int8 or bf16), its KV
 * cache as the model keeps it (struct sfw_model_params kv_cache). */
void sfw_plan_model(const struct sfw_model *m, int64_t max_ctx, int chunk, struct sfw_mem_plan *p);
/* The plan of a batch (runner/batch.h; `salafw serve`): seqs sequences that
 * can each reach max_ctx tokens (their KV, compressed keys and lightning
 * states; when pool_tokens is not 0, the KV and compressed keys of a pool
 * of pool_tokens in all), and one
 * workspace for step_rows rows with a logits row per sequence. */
void sfw_plan_batch(const struct sfw_model *m, int seqs, int64_t max_ctx, int64_t pool_tokens, int step_rows,
		    struct sfw_mem_plan *p);
/* The same from a plan of one context (made for max_ctx tokens and
 * step_rows-row pieces by any of the above). */
void sfw_plan_seqs(const struct sfw_config *c, int seqs, int64_t pool_tokens, struct sfw_mem_plan *p);
/* The bytes one sequence's state holds in a backend whose activations are
 * act_size bytes (kv8: an fp8 KV cache): its K/V for `tokens` tokens in whole blocks, the
 * compressed keys (paged != 0: those of its blocks; else for max_ctx), the
 * Lightning states (the plan's kv, compressed and lightning, for one
 * sequence; runner/batch.h sfw_seq_state_bytes). */
int64_t sfw_plan_seq_bytes(const struct sfw_config *c, int act_size, int kv8, int64_t max_ctx, int64_t tokens,
			   int paged);
/* The plan as one block of lines (salafw run prints it to stderr at start). */
void sfw_plan_print(FILE *f, const char *who, const struct sfw_mem_plan *p, int64_t n_ctx, int chunk);
/* The arithmetic of sfw_plan_check: p = the plan at n_ctx tokens, free_bytes
 * the device's free memory with the weights placed. The message (within
 * struct sfw_err) names the largest context that fits, in 64-token blocks. */
SFW_MUST_CHECK enum sfw_status sfw_plan_fit(const struct sfw_mem_plan *p, int64_t n_ctx, double free_bytes,
					    struct sfw_err *err);
/* On the CUDA backend: SFW_E_NOMEM, with the plan's figures, the device's
 * free memory and the largest context that fits, when a context of n_ctx
 * tokens needs more than the device has free (the weights are placed
 * already); SFW_OK otherwise and on the CPU. *out (may be NULL) gets the plan. */
SFW_MUST_CHECK enum sfw_status sfw_plan_check(const struct sfw_model *m, int64_t n_ctx, int chunk,
					      struct sfw_mem_plan *out, struct sfw_err *err);
/* sfw_plan_check for a batch planned as sfw_plan_batch, parked of its
 * seqs slots kept for parked sequences (serve's prefix-cache entries; the
 * plan and its messages name them apart): the message names the largest
 * context per sequence that fits. */
SFW_MUST_CHECK enum sfw_status sfw_plan_check_batch(const struct sfw_model *m, int seqs, int parked, int64_t max_ctx,
						    int64_t pool_tokens, int step_rows, struct sfw_mem_plan *out,
						    struct sfw_err *err);

#endif
