/* config.h - MiniCPM-SALA config.json -> struct sfw_config (docs/model-spec.md §1).
 * Untrusted input: strict JSON, every size bounded, consistency checked. */
#ifndef SFW_CONFIG_H
#define SFW_CONFIG_H

#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

#define SFW_MAX_LAYERS 256
#define SFW_MAX_EOS 8

enum sfw_mixer { SFW_MIXER_SPARSE /* "minicpm4" */, SFW_MIXER_LIGHTNING /* "lightning-attn" & co */ };

struct sfw_config {
	int hidden_size;          /* D */
	int intermediate_size;    /* I */
	int num_hidden_layers;    /* L */
	int num_attention_heads;  /* sparse-layer q heads */
	int num_key_value_heads;  /* sparse-layer kv heads */
	int head_dim;
	int vocab_size;
	double rms_norm_eps;
	double rope_theta;
	int64_t max_position_embeddings;
	double scale_emb;
	double scale_depth;
	double dim_model_base;
	int bos_token_id;
	int eos_token_ids[SFW_MAX_EOS];
	int n_eos;
	enum sfw_mixer mixer[SFW_MAX_LAYERS];
	/* sparse (InfLLM-v2) */
	int attn_use_rope;        /* must be 0 for this model family */
	int attn_use_output_gate;
	int sparse_kernel_size;   /* 32 */
	int sparse_kernel_stride; /* 16 */
	int sparse_block_size;    /* 64 */
	int sparse_topk;          /* 64 (the engine adds window/block) */
	int sparse_init_blocks;   /* 1 */
	int sparse_window_size;   /* 2048 */
	int64_t sparse_dense_len; /* 8192 */
	/* lightning */
	int lightning_nh;
	int lightning_nkv;
	int lightning_head_dim;
	int lightning_use_rope;
	int qk_norm;
	int use_output_norm;
	int use_output_gate;
	/* derived */
	double residual_scale;    /* scale_depth / sqrt(L) */
	double logit_divisor;     /* hidden_size / dim_model_base */
	int sparse_k;             /* topk + window/block */
	int sparse_local_blocks;  /* window/block */
};

SFW_MUST_CHECK enum sfw_status sfw_config_parse(const char *bytes, size_t len, const char *what,
						struct sfw_config *out, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_config_load(const char *model_dir, struct sfw_config *out,
					       struct sfw_err *err);
/* Lightning decay slope of head h (ALiBi list for nh heads), as the reference
 * computes it in double and stores as float32. */
float sfw_config_lightning_slope(int nh, int h);

/* ---- end-of-sequence ids (formats/eos.c) ------------------------------------
 * The ids that end generation: config.json's eos_token_id (above), those of
 * generation_config.json and tokenizer_config.json's eos_token; the model
 * directory's whole set is sfw_eos_load (runner/generate.h). */

#define SFW_EOS_MAX 16	     /* end-of-sequence ids in one set */
#define SFW_STOP_MAX_LEN 256 /* bytes per stop string (an eos_token name is one) */

struct sfw_eos_set {
	int n;
	int32_t ids[SFW_EOS_MAX];
};

/* Adds id unless present; SFW_E_RANGE when the set is full. */
SFW_MUST_CHECK enum sfw_status sfw_eos_add(struct sfw_eos_set *s, int32_t id, struct sfw_err *err);
int sfw_eos_has(const struct sfw_eos_set *s, int32_t id);

/* generation_config.json (at most 1 MiB): its eos_token_id, an id or a list
 * of ids below vocab, is added to the set; a file without the field adds
 * nothing. Strict JSON (core/json.h); anything else is SFW_E_FORMAT or
 * SFW_E_RANGE naming `what`. */
SFW_MUST_CHECK enum sfw_status sfw_eos_parse_generation_config(const char *bytes, size_t len,
							       const char *what, int vocab,
							       struct sfw_eos_set *s, struct sfw_err *err);
/* tokenizer_config.json's eos_token: a string, or an object whose "content"
 * is one (HF's AddedToken form), copied into name (cap bytes, NUL-terminated);
 * "" when the file has none. At most SFW_STOP_MAX_LEN bytes. */
SFW_MUST_CHECK enum sfw_status sfw_eos_parse_tokenizer_config(const char *bytes, size_t len, const char *what,
							      char *name, size_t cap, struct sfw_err *err);

#endif
