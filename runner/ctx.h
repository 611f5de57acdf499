/* ctx.h - (library-internal) struct sfw_ctx, the state of one sequence (or
 * of a batch's workspace) that runner/forward.c runs steps on: its caches,
 * its position and its step buffers in backend memory. runner/ctx.c makes,
 * resets and frees it; the public calls are runner/runner.h's sfw_ctx_*. */
#ifndef SFW_CTX_H
#define SFW_CTX_H

#include "runner/model.h"

struct sfw_ctx {
	struct sfw_model *m;
	struct sfw_ctx_params p;
	struct sfw_bcache *cache;
	int64_t pos;
	int cap_rows;
	/* backend buffers for one piece of cap_rows rows: x the residual
	 * stream, u its norm, out a block's output, proj the projection
	 * group's outputs (q | k | v | gate, each [R, width]), a the attention
	 * output, mg the MLP's hidden rows, gu their gate | up scratch */
	void *x, *u, *out, *proj, *a, *mg, *gu;
	int32_t *next_dev; /* the sampled id (sfw_ctx_decode_next) */
	int broken;        /* a call failed half-way: refused until sfw_ctx_reset */
	void *step;        /* the backend's state for its decode steps (be->step's state) */
	int64_t step_replays; /* for tests: steps that ran from a recording */
	float *host_logits; /* [V] when the host finishes a sample */
	int32_t *ids_dev, *idx_dev;
	float *logits_dev; /* [cap_rows, V] when tapping, else [logit rows, V] */
	int logits_rows;
	int last_row;      /* the row of logits_dev holding the last call's (or
			    * a loaded state's) last logits; -1: none made */
	/* taps */
	sfw_tap_fn tap;
	void *tap_user;
	int tap_lin;       /* also report the inputs of the linears (AWQ calibration) */
	float *host;       /* staging: cap_rows * max(D, V) floats */
	int32_t *host_idx; /* nkv * cap_rows * k */
	float *host_pool;  /* nkv * nblocks (grown) */
	int64_t host_pool_cap;
	/* last selection per layer: kept in backend memory (last_dev, no host
	 * wait per decode step) and brought to last_blocks when asked */
	int32_t *last_blocks; /* [L, nkv, k] */
	int *last_state;      /* per layer: -1 not sparse, 0 dense, 1 sparse */
	int32_t *last_dev;    /* backend [L, nkv, k] */
	int *last_fresh;      /* per layer: last_dev is newer than last_blocks */
};

/* Host staging and full-width logits for taps, sized on first use. */
SFW_MUST_CHECK enum sfw_status sfwi_ctx_tap_buffers(struct sfw_ctx *c, struct sfw_err *err);

#endif
