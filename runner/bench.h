/* bench.h - the engine's speed and memory measured through the public API,
 * shared by `salafw bench` (cli/cmd_bench.c) and bench/bench_gpu.c, and the
 * device-memory plan `salafw run` prints. */
#ifndef SFW_BENCH_H
#define SFW_BENCH_H

#include "runner/config.h"
#include "runner/runner.h"
#include "sfw.h"

#include <stdint.h>
#include <stdio.h>

struct sfw_bench_params {
	int64_t prompt;      /* prompt tokens (random ids after BOS, fixed LCG) */
	int64_t gen;         /* greedy one-token decode steps */
	int64_t n_ctx;       /* context reserved up front; 0 = prompt + gen */
	int prefill_chunk;   /* rows per prefill piece; 0 = 8192 (capped at the prompt) */
	int dense_as_sparse;
};

struct sfw_bench_result {
	double ttft_s;             /* the prefill call, logits of the last row on the host */
	double prefill_tps;
	double decode_s;           /* all steps, host argmax included */
	double decode_tps;
	double decode_median_s;    /* median step */
	double weight_bytes;       /* bf16 linear + lm_head bytes read per decode step */
	double linear_flops;       /* linear-layer FLOPs per prefill token */
	int device_mem;            /* 1: the two figures below are known (CUDA) */
	double peak_bytes;         /* salafw's device allocations, high-water mark of the run */
	double driver_bytes;       /* the driver's view: whole process, CUDA context included */
	int64_t n_ctx, chunk;      /* as used */
};

/* One run on a fresh context. Memory figures on CUDA count from the start of
 * this call. */
SFW_MUST_CHECK enum sfw_status sfw_bench_run(struct sfw_model *m, const struct sfw_bench_params *p,
					     struct sfw_bench_result *r, struct sfw_err *err);

/* The limits, measured on the device now: copy bandwidth (GB/s, read +
 * written, 2 GiB device copy) and a bf16 cuBLASLt 8192^3 GEMM (TFLOP/s).
 * SFW_E_UNSUPPORTED in a build without CUDA. */
SFW_MUST_CHECK enum sfw_status sfw_bench_limits(double *copy_gbps, double *gemm_tflops, struct sfw_err *err);

/* Parameters of all linear layers (lm_head apart). */
double sfw_bench_linear_params(const struct sfw_config *c);

/* Device memory a context of max_ctx tokens needs on the CUDA backend, in
 * bytes (bf16 weights and activations). */
struct sfw_mem_plan {
	double weights;        /* every tensor, bf16 */
	double kv_per_token;   /* sparse layers' K and V */
	double kv;             /* kv_per_token * max_ctx (64-token blocks) */
	double compressed;     /* both levels of compressed keys */
	double lightning;      /* fp32 states */
	double activations;    /* forward.c's buffers for one piece of `chunk` rows + logits */
	double scratch;        /* op scratch, cuBLASLt workspace, block-selection scratch */
	double total;
};
void sfw_bench_mem_plan(const struct sfw_config *c, int64_t max_ctx, int chunk, struct sfw_mem_plan *p);
/* The same with int8 decoder linears (codes + BF16 scales of `group`, 32,
 * 64, 128 or SFW_QL_GROUP_CHANNEL), embedding, lm_head and norms bf16: what
 * `salafw quant --group G` and `mkmodel --w8` produce. */
void sfw_bench_mem_plan_w8(const struct sfw_config *c, int64_t max_ctx, int chunk, int group, struct sfw_mem_plan *p);
/* The plan of a loaded model: its weights as bound (int8 or bf16). */
void sfw_bench_mem_plan_model(const struct sfw_model *m, int64_t max_ctx, int chunk, struct sfw_mem_plan *p);
/* The plan as one block of lines (salafw run prints it to stderr at start). */
void sfw_bench_mem_print(FILE *f, const char *who, const struct sfw_mem_plan *p, int64_t n_ctx, int chunk);
/* On the CUDA backend: SFW_E_NOMEM, with the plan's figures, the device's
 * free memory and the largest context that fits, when a context of n_ctx
 * tokens needs more than the device has free (the weights are placed
 * already); SFW_OK otherwise and on the CPU. *out (may be NULL) gets the plan. */
/* The arithmetic of that check: p = the plan at n_ctx tokens, free_bytes
 * the device's free memory with the weights placed. The message (within
 * struct sfw_err) names the largest context that fits, in 64-token blocks. */
SFW_MUST_CHECK enum sfw_status sfw_bench_mem_fit(const struct sfw_mem_plan *p, int64_t n_ctx, double free_bytes,
						 struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_bench_mem_check(const struct sfw_model *m, int64_t n_ctx, int chunk,
						   struct sfw_mem_plan *out, struct sfw_err *err);

#endif
