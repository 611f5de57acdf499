/* runner.h - the MiniCPM-SALA engine: load a model directory, keep one
 * sequence's state in a context, prefill and decode.
 *
 * The forward pass (runner/forward.c) follows docs/model-spec.md §2 and is written
 * once against struct sfw_backend (runner/backend.h): fp32 on the CPU, bf16
 * on CUDA. A call's rows take the dense or the sparse attention path as one,
 * decided by the total length at the end of the call (L >= dense_len ->
 * InfLLM-v2, as the reference); prefill is processed in chunks internally
 * without changing that decision.
 *
 * The generation loop over a context (prompt, sampling, stop conditions,
 * streamed text) is runner/generate.h; many sequences in one forward step
 * (continuous batching) are runner/batch.h.
 *
 * This layer does not check the verified state of the directory: the CLI
 * (or any caller) does that with sfw_state_check before loading. */
#ifndef SFW_RUNNER_H
#define SFW_RUNNER_H

#include "formats/config.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

struct sfw_model;
struct sfw_ctx;

enum sfw_device { SFW_DEVICE_AUTO, SFW_DEVICE_CPU, SFW_DEVICE_CUDA };

/* Backend choices given at model load; all 0 = the defaults. The library
 * reads no environment: `salafw` maps its SALAFW_CUDA_* variables onto these
 * (README, "Environment"). */
struct sfw_backend_opts {
	int cuda_device;     /* GPU index */
	int attn;            /* attention kernels: 0 auto, 1 CUDA cores only, 2 tensor cores wherever supported */
	int stage1;          /* stage-1 scoring kernels: the same */
	int w8gemv;          /* int8 decode rows (up to 8): 2 the tensor-core GEMV, else the default kernels */
	int no_graph;        /* no recorded decode steps: every op launched one by one (the debug escape) */
	int profile;         /* device time per op, printed when the model is freed (no recorded steps) */
	int select_mb;       /* block-selection scratch in MiB; 0 = 256 */
};

/* How the sparse layers keep their K and V (--kv-cache): in the
 * activation dtype (bf16 on CUDA, float32 on the CPU), or as fp8 E4M3 with a
 * float32 scale per token and KV head (kernels/ops.h, "the fp8 KV cache"):
 * 0.52 of bf16's bytes on CUDA. The CPU backend rounds its float caches
 * as fp8 (the same values, no memory saved). */
enum sfw_kv_cache { SFW_KV_CACHE_ACT = 0, SFW_KV_CACHE_FP8 = 1 };

struct sfw_model_params {
	enum sfw_device device; /* AUTO: CUDA when built with it and a GPU answers, else CPU */
	int threads;            /* CPU threads (the CPU backend's own pool), at most 256;
				 * 0 = sfw_default_threads() */
	struct sfw_backend_opts be;
	enum sfw_kv_cache kv_cache; /* the contexts' and batches' K/V caches */
};
struct sfw_model_params sfw_model_default_params(void);

/* Opens DIR/config.json and the safetensors (one file or an index + shards),
 * checks every tensor of docs/model-spec.md §3 against the config (name, dtype BF16
 * or F32, shape) and binds the weights to the backend. */
SFW_MUST_CHECK enum sfw_status sfw_model_load(const char *dir, const struct sfw_model_params *p,
					      struct sfw_model **out, struct sfw_err *err);
void sfw_model_free(struct sfw_model *m); /* NULL is a no-op */
/* Valid until sfw_model_free. */
const struct sfw_config *sfw_model_config(const struct sfw_model *m);
const char *sfw_model_device_name(const struct sfw_model *m); /* "cpu" | "cuda" */

struct sfw_ctx_params {
	int64_t n_ctx;        /* tokens to reserve up front (0 = grow by 64-token blocks as needed) */
	int prefill_chunk;    /* rows per internal prefill step; 0 = 256 (rounded up to 64) */
	int dense_as_sparse;  /* 1: InfLLM-v2 for every length (SGLang's --dense-as-sparse) */
};
struct sfw_ctx_params sfw_ctx_default_params(void);

SFW_MUST_CHECK enum sfw_status sfw_ctx_new(struct sfw_model *m, const struct sfw_ctx_params *p,
					   struct sfw_ctx **out, struct sfw_err *err);
void sfw_ctx_free(struct sfw_ctx *c); /* NULL is a no-op */
/* Forgets the sequence (position 0, empty caches, no selected blocks). */
void sfw_ctx_reset(struct sfw_ctx *c);
/* Tokens processed so far (the next token's position). */
int64_t sfw_ctx_pos(const struct sfw_ctx *c);
/* The model the context runs. */
struct sfw_model *sfw_ctx_model(const struct sfw_ctx *c);

/* One forward call over n tokens at positions pos .. pos+n-1 (a prompt, or a
 * continuation of one). logits (may be NULL) receives the vocab_size float32
 * logits of the last token. Ids outside [0, vocab) are SFW_E_INVAL. A call
 * that fails once it has started computing leaves some layers' caches ahead
 * of others: the context then refuses every call (SFW_E_INVAL) until
 * sfw_ctx_reset. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_prefill(struct sfw_ctx *c, const int32_t *ids, size_t n, float *logits,
					       struct sfw_err *err);
/* One token: the same as sfw_ctx_prefill with n = 1, named for intent. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_decode(struct sfw_ctx *c, int32_t id, float *logits,
					      struct sfw_err *err);
/* One token whose successor is chosen where the logits are (on the GPU for
 * the CUDA backend: only the id crosses to the host): *next = the choice of
 * sfw_op_sample_cpu (kernels/ops.h: runner/sampler.h's meaning for the
 * uniform u in [0, 1), e.g. sfw_op_sample_uniform on a sampler's rng). */
struct sfw_op_sample_params;
SFW_MUST_CHECK enum sfw_status sfw_ctx_decode_next(struct sfw_ctx *c, int32_t id,
						   const struct sfw_op_sample_params *sp, double u, int32_t *next,
						   struct sfw_err *err);
/* n tokens (a prompt, or a continuation of one) whose successor is chosen
 * as sfw_ctx_decode_next chooses it: the first token after a prompt is
 * chosen exactly like every later one, where the logits are. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_prefill_next(struct sfw_ctx *c, const int32_t *ids, size_t n,
						    const struct sfw_op_sample_params *sp, double u, int32_t *next,
						    struct sfw_err *err);

/* ---- a context's state (runner/ctxstate.c; the bytes: runner/ctxstate.h) ----
 * The sequence a context holds, written after a prompt and read back into a
 * context of the same model, so that a later prompt that starts with the
 * same tokens is not prefilled again (salafw run --prompt-cache). A loaded
 * state is what the context would hold after sfw_ctx_prefill of those
 * tokens as one call with its parameters: every sparse layer's K/V and
 * compressed keys, every lightning layer's state, the position, the
 * selection notes (sfw_ctx_last_blocks) and the last row's logits (the
 * next token is chosen from them: sfw_ctx_next_from_last). Both backends;
 * not a batch's sequences. No file I/O here: the bytes go through the
 * caller's functions (the CLI owns the file and its policy). */
typedef enum sfw_status (*sfw_state_write_fn)(void *user, const void *p, size_t n, struct sfw_err *err);
/* Reads up to n bytes into p; *got < n only at the end of the input. */
typedef enum sfw_status (*sfw_state_read_fn)(void *user, void *p, size_t n, size_t *got, struct sfw_err *err);

/* Writes c's state. binding: 32 bytes the caller chooses (which model
 * files, which numeric options), which a load must present again; ids[0..n):
 * the tokens c holds (n = sfw_ctx_pos(c) >= 1). The last row's logits go
 * with it when c has them (a call that made them: sfw_ctx_prefill with
 * logits, sfw_ctx_prefill_next, decode). SFW_E_INVAL for a broken context,
 * an empty one, another count; wr's errors are returned as they are. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_state_save(struct sfw_ctx *c, const uint8_t binding[32], const int32_t *ids,
						  size_t n, sfw_state_write_fn wr, void *user, struct sfw_err *err);
/* Reads a state into c (reset first) when it fits: the same binding, this
 * model's layout and backend, c's dense_as_sparse, and the same prefill
 * pieces (c's prefill_chunk, unless both take its tokens in one piece);
 * its tokens a prefix of prompt[0..n_prompt). Then c holds them, *n_loaded
 * >= 1 of them, as after sfw_ctx_prefill. Tokens that are not a prefix of
 * the prompt (or are all of it, saved without logits): SFW_OK, *n_loaded =
 * 0, nothing read past the token ids. Any other misfit -- another binding,
 * layout or parameters, another version, a truncated, corrupt or altered
 * state -- is an error naming it (SFW_E_FORMAT; SFW_E_UNSUPPORTED for
 * another version); rd's errors are returned as they are. Whatever fails,
 * c is left reset (position 0). Every size is checked against the model
 * and the prompt before the payload is allocated or read. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_state_load(struct sfw_ctx *c, const uint8_t binding[32], const int32_t *prompt,
						  size_t n_prompt, sfw_state_read_fn rd, void *user, int64_t *n_loaded,
						  struct sfw_err *err);
/* The next token from the logits of the last row of c's last call (or of
 * the state it loaded), chosen as sfw_ctx_prefill_next chooses it at the
 * end of a call (where the logits are). SFW_E_INVAL when c has none: after
 * a reset, a call that made none (sfw_ctx_prefill of several tokens
 * without logits), a state saved without them. */
SFW_MUST_CHECK enum sfw_status sfw_ctx_next_from_last(struct sfw_ctx *c, const struct sfw_op_sample_params *sp,
						      double u, int32_t *next, struct sfw_err *err);
/* Those logits [vocab] to out (the same condition). */
SFW_MUST_CHECK enum sfw_status sfw_ctx_last_logits(struct sfw_ctx *c, float *out, struct sfw_err *err);

/* Taps: named intermediate tensors, as the golden files name them. While a
 * tap is set, every call reports (host memory, valid during the callback):
 *   "<phase>.embed"             F32 [rows, hidden]      layer -1
 *   "<phase>.layer.{i}.out"     F32 [rows, hidden]      layer i
 *   "<phase>.final_norm"        F32 [rows, hidden]      layer -1
 *   "<phase>.logits"            F32 [rows, vocab]       layer -1 (every row)
 *   "sparse.layer.{i}.<phase>.topk_idx"   I32 [nkv, rows, k] (sparse calls only)
 *   "sparse.layer.{i}.<phase>.block_score" F32 [nkv, nblocks] (last row of the call)
 *   "sparse.layer.{i}.<phase>.n_compressed" I32 [2]  (sparse calls only)
 * where <phase> is "prefill" for calls of more than one token and "decode"
 * for one-token calls. Rows arrive in order, possibly in several pieces per
 * call (row0 = the absolute position of the first row). */
struct sfw_tap {
	const char *name;
	int layer;
	int64_t row0;
	int rows;     /* first dimension for [rows, cols]; for topk_idx: rows of the piece */
	int cols;     /* hidden, vocab, k, nblocks, or 2 */
	int nkv;      /* topk_idx / block_score only */
	int is_int;   /* 1: data is int32 */
	const void *data;
};
typedef void (*sfw_tap_fn)(void *user, const struct sfw_tap *t);
void sfw_ctx_set_tap(struct sfw_ctx *c, sfw_tap_fn fn, void *user); /* fn NULL: off */
/* With on = 1 (and a tap set) every call also reports the inputs of the
 * linears, per layer i (AWQ calibration, quant/awq.c):
 *   "<phase>.layer.{i}.attn_in"  F32 [rows, hidden]  input_layernorm output (q,k,v,o_gate|z input)
 *   "<phase>.layer.{i}.o_in"     F32 [rows, nh*hd]   o_proj input (after o_norm and the output gate)
 *   "<phase>.layer.{i}.mlp_in"   F32 [rows, hidden]  post_attention_layernorm output (gate, up input)
 *   "<phase>.layer.{i}.down_in"  F32 [rows, inter]   silu(gate) * up (down_proj input) */
void sfw_ctx_set_tap_linear_inputs(struct sfw_ctx *c, int on);

/* The blocks selected for the last row of the last call in sparse layer
 * `layer`: out [nkv * k] (k = config sparse_k), ascending, -1 = unused.
 * Returns 0 when that call took the dense path (out filled with -1), 1 when it
 * took the sparse path, -1 when layer is not a sparse layer. */
int sfw_ctx_last_blocks(const struct sfw_ctx *c, int layer, int32_t *out);

#endif
