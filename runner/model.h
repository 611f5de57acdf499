/* model.h - (library-internal) the MiniCPM-SALA tensor-name table of
 * docs/model-spec.md §3 bound to a backend, and the model/context structs that
 * runner/forward.c works on. Public API: runner/runner.h. */
#ifndef SFW_MODEL_H
#define SFW_MODEL_H

#include "formats/config.h"
#include "formats/safetensors.h"
#include "runner/backend.h"
#include "runner/runner.h"

struct sfwi_layer {
	enum sfw_mixer kind;
	struct sfw_bweight in_norm, post_norm, gate, up, down;
	struct sfw_bweight q, k, v, o;
	struct sfw_bweight o_gate;               /* sparse, when attn_use_output_gate */
	struct sfw_bweight z, q_norm, k_norm, o_norm; /* lightning (each optional by config flag) */
	/* bound at load: q|k|v(|o_gate or z) and gate|up (backend.h) */
	struct sfw_bgroup proj, gu;
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
	 * int8, num/w8_layout.h); quantized = 0 for a bf16/f32 checkpoint */
	int quantized;
	int quant_groups[8]; /* group sizes the config declares (0 = channel) */
	int n_quant_groups;
	int n_w8;            /* linears bound as int8 */
	enum sfw_kv_cache kv_cache; /* struct sfw_model_params */
};

/* Whether m's backend keeps its K/V in the fp8 layout (kernels/ops.h): an
 * fp8 KV cache on a bf16 backend (the CPU backend keeps float caches,
 * rounded as fp8). */
static inline int sfwi_kv8_layout(const struct sfw_model *m)
{
	return m->kv_cache == SFW_KV_CACHE_FP8 && m->be->act != SFW_DTYPE_F32;
}

/* Model loading (sfw_model_load, runner/model.c) picks the backend from the
 * registry (backend.h), opens, checks and binds every tensor, and forms the
 * projection groups. */

/* Bytes of the model's weights as bound (int8: codes + scales; bf16/f32 as
 * stored): *all of them, and *step, those one decode step reads (the decoder
 * linears and lm_head). */
void sfwi_model_weight_bytes(const struct sfw_model *m, double *all, double *step);

/* One sequence's rows in a forward step (runner/forward.c): rows [row0,
 * row0 + R) of the step's buffers, at positions pos0 .. pos0 + R - 1 of its
 * cache. sparse / nblocks are its call's InfLLM-v2 decision, fixed from the
 * length at the end of the call; last_piece: the call ends with these rows. */
struct sfwi_part {
	struct sfw_bcache *cache;
	int64_t pos0;
	int row0, R;
	int sparse;
	int64_t nblocks;
	int last_piece;
};

/* The cache description of m's shapes; pool / max_tokens as in backend.h
 * (NULL, 0: a cache that grows on its own). */
void sfwi_cache_desc(const struct sfw_model *m, struct sfw_bpool *pool, int64_t max_tokens, struct sfw_cache_desc *d);
/* One sequence's caches (every layer), empty. */
SFW_MUST_CHECK enum sfw_status sfwi_cache_new(struct sfw_model *m, struct sfw_bpool *pool, int64_t max_tokens,
					      struct sfw_bcache **out, struct sfw_err *err);

/* A context without a sequence of its own: step buffers for `rows` rows and
 * logits for logit_rows of them (runner/batch.c). Freed with sfw_ctx_free. */
SFW_MUST_CHECK enum sfw_status sfwi_ctx_workspace(struct sfw_model *m, int rows, int logit_rows,
						  struct sfw_ctx **out, struct sfw_err *err);
/* What a step does with the logits of one of its rows (sfwi_forward). */
struct sfwi_pick {
	int row;                                /* the step's row */
	int host;                               /* bring its logits to the host */
	const struct sfw_op_sample_params *sp;  /* non-NULL: choose the next token */
	double u;
};

/* One forward step of R rows (host ids) belonging to np sequences (parts,
 * in row order, each cache reserved for its rows) on workspace ws: the
 * linears once over all rows, attention, compression, selection and the
 * lightning states per part. Then the logits of rows pick[0..nl).row: row
 * i of logits [nl, vocab] (host) receives them where pick[i].host, and
 * next[i] the token chosen where pick[i].sp (sfw_op_sample_cpu's meaning;
 * on the backend when it can), else -1. The step's ops go between the
 * backend's step begin and end (be->step), with its state for decode steps
 * (every part one decode row with its logits) of one sequence in *rec, of
 * several in *brec (NULL: none; the CUDA backend records such steps and
 * replays them; a step it pads to a batch-size bucket reads ids from ws's
 * rows past R, which hold token ids from its creation on). A context's
 * untapped call runs here too, one part on its own cache (ws is the
 * context: a batch of one); then its selection notes are written after its
 * last piece. A failure leaves the parts' caches in an unknown state. */
SFW_MUST_CHECK enum sfw_status sfwi_forward(struct sfw_ctx *ws, const int32_t *ids, int R,
					    const struct sfwi_part *parts, int np, const struct sfwi_pick *pick,
					    int nl, float *logits, int32_t *next, void **rec, void **brec,
					    struct sfw_err *err);

/* Decode steps of c that ran as a replay of the whole-step graph (tests). */
int64_t sfwi_ctx_step_replays(const struct sfw_ctx *c);

#endif
