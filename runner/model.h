/* model.h - (library-internal) the MiniCPM-SALA tensor-name table of
 * docs/model-spec.md §3 bound to a backend, and the model/context structs that
 * runner/forward.c works on. Public API: runner/runner.h. */
#ifndef SFW_MODEL_H
#define SFW_MODEL_H

#include "runner/backend.h"
#include "runner/config.h"
#include "runner/runner.h"
#include "runner/safetensors.h"

struct sfwi_layer {
	enum sfw_mixer kind;
	struct sfw_bweight in_norm, post_norm, gate, up, down;
	struct sfw_bweight q, k, v, o;
	struct sfw_bweight o_gate;               /* sparse, when attn_use_output_gate */
	struct sfw_bweight z, q_norm, k_norm, o_norm; /* lightning (each optional by config flag) */
};

struct sfw_model {
	struct sfw_config cfg;
	struct sfw_st_set *st;
	struct sfw_backend *be;
	struct sfw_bweight embed, norm, lm_head;
	struct sfwi_layer *layers;
	float *decay; /* backend memory: [lightning_nh] slopes */
	int nweights;
	/* config.json quantization_config (compressed-tensors pack-quantized
	 * int8, quant/layout.h); quantized = 0 for a bf16/f32 checkpoint */
	int quantized;
	int quant_groups[8]; /* group sizes the config declares (0 = channel) */
	int n_quant_groups;
	int n_w8;            /* linears bound as int8 */
};

/* Opens, checks and binds; on failure everything is released. */
SFW_MUST_CHECK enum sfw_status sfwi_model_open(struct sfw_model *m, const char *dir, struct sfw_err *err);
void sfwi_model_close(struct sfw_model *m);

/* Bytes of the model's weights as bound (int8: codes + scales; bf16/f32 as
 * stored): *all of them, and *step, those one decode step reads (the decoder
 * linears and lm_head). */
void sfwi_model_weight_bytes(const struct sfw_model *m, double *all, double *step);

/* Decode steps of c that ran as a replay of the whole-step graph (tests). */
int64_t sfwi_ctx_step_replays(const struct sfw_ctx *c);

#endif
