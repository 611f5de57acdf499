/* mkmodel.h - random-weight MiniCPM-SALA model directories for tests and
 * benchmarks: config.json (the real field names), generation_config.json,
 * bf16 safetensors shards + model.safetensors.index.json, tokenizer.model and
 * tokenizer_config.json.
 *
 * Presets:
 *   tiny  - the shapes of golden tiny-sparse (6 layers S L L S L S, hidden 256,
 *           vocab 1024, dense_len 512); two shards so the index is exercised.
 *   small - CPU benchmarks: hidden 1024, intermediate 2816, 8 layers (sparse 0
 *           and 5), 16 heads of 64, 2 KV heads, lightning 16 x 64, vocab 16384.
 *   full  - the real model's shapes (docs/model-spec.md §1, §3): 395 tensors,
 *           9,477,203,968 parameters in 4 shards of at most 5 GB (as the
 *           real checkpoint).
 *   wide4 - the full preset's widths (hidden 4096, intermediate 16384, 32
 *           heads / 2 KV heads of 128, lightning 32 x 128, vocab 73448, topk
 *           64, window 2048, dense_len 8192) in 4 layers S L L S: 1.68 G
 *           parameters in 2 shards of at most 2 GB (tests/gpu_wide.c).
 *
 * Weights (as the golden models): linear and embedding 0.02*N(0,1), norm
 * weights 1 + 0.1*N(0,1), rounded to bf16. Element e of tensor `name` comes
 * from a counter-based generator keyed by (seed, hash(name), e/2) (Box-Muller
 * pairs), so the output is a pure function of (preset, seed), chunks are
 * generated in parallel, and the model is streamed: memory stays at a few
 * chunk buffers whatever the model size.
 *
 * Special tokens sit at the top of the model vocab V (V-8 <|im_end|> ...
 * V-1 <|fim_suffix|>); config.json's eos_token_id is [2, V-8]. The
 * SentencePiece model has min(V-8, 1000) pieces for tiny, min(V-8, 4000)
 * otherwise (a soft limit, see sfw_tokenizer_train). */
#ifndef SFW_MKMODEL_H
#define SFW_MKMODEL_H

#include "runner/config.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

enum sfw_mkmodel_preset { SFW_MKMODEL_TINY, SFW_MKMODEL_SMALL, SFW_MKMODEL_FULL, SFW_MKMODEL_WIDE4 };

/* "tiny" | "small" | "full" | "wide4"; 0 if unknown. */
int sfw_mkmodel_preset_parse(const char *name, enum sfw_mkmodel_preset *out);

/* Called after each chunk of weights is written (from the calling thread). */
typedef void (*sfw_mkmodel_progress_fn)(void *user, uint64_t bytes_done, uint64_t bytes_total);

struct sfw_mkmodel_params {
	enum sfw_mkmodel_preset preset;
	uint64_t seed;
	int force;			  /* overwrite a model already in out_dir */
	int nthreads;			  /* 0: sfw_default_threads() */
	uint64_t shard_bytes;		  /* 0: the preset's shard size limit */
	int no_tokenizer;		  /* skip tokenizer.model / tokenizer_config.json */
	sfw_mkmodel_progress_fn progress; /* may be NULL */
	void *progress_user;
	/* w8 = 1: the decoder linears (sfw_ql_is_quantized) are written directly
	 * as compressed-tensors pack-quantized int8 (num/w8_layout.h) with group
	 * w8_group (32, 64, 128; SFW_QL_GROUP_CHANNEL = 0 per channel): random
	 * uniform codes, BF16 scales 2.7e-4 * (1 + 0.1 N(0,1)) (weights of about
	 * the bf16 preset's spread), and config.json's quantization_config. No
	 * bf16 weights are made and quantized: a full-size int8 model for
	 * benchmarks in a minute. Embedding, lm_head and norms stay bf16. */
	int w8;
	int w8_group;
};

struct sfw_mkmodel_tensor {
	char name[80];
	int ndim;
	uint64_t shape[2];
	int is_norm; /* 1 + 0.1*N(0,1) instead of 0.02*N(0,1) */
	int shard;   /* 0-based */
	int kind;    /* SFW_MKT_*: what the tensor holds */
	uint64_t w8_n, w8_k; /* SFW_MKT_W8_SHAPE: the values written */
};
enum { SFW_MKT_BF16, SFW_MKT_W8_PACKED, SFW_MKT_W8_SCALE, SFW_MKT_W8_SHAPE };

/* What sfw_mkmodel writes (--dry-run prints this). */
struct sfw_mkmodel_plan {
	struct sfw_config config; /* config_json parsed back */
	char *config_json;	  /* the config.json text */
	size_t config_json_len;
	struct sfw_mkmodel_tensor *tensors; /* in file order */
	size_t n_tensors;
	int n_shards;
	uint64_t n_params;
	uint64_t n_bytes; /* tensor data bytes */
};

SFW_MUST_CHECK enum sfw_status sfw_mkmodel_plan(const struct sfw_mkmodel_params *p,
						struct sfw_mkmodel_plan *out, struct sfw_err *err);
void sfw_mkmodel_plan_free(struct sfw_mkmodel_plan *plan);
/* "model-00001-of-00002.safetensors" into buf. */
void sfw_mkmodel_shard_name(char *buf, size_t cap, int shard, int n_shards);

/* Writes the model into out_dir (created if needed). Refuses a directory that
 * already holds a model (config.json, model.safetensors[.index.json]) unless
 * p->force; with force, stale shards of the old model are removed after the
 * new one is complete. Every file is written to a temporary name and
 * renamed; config.json is written last. */
SFW_MUST_CHECK enum sfw_status sfw_mkmodel(const char *out_dir, const struct sfw_mkmodel_params *p,
					   struct sfw_err *err);

/* The value mkmodel stores for element e of tensor name (before bf16
 * rounding), for tests that recompute weights independently of the files. */
float sfw_mkmodel_weight(uint64_t seed, const char *name, int is_norm, uint64_t e);

#endif
