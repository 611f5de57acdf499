/* tools.h - what is built on the engine for tests, benchmarks and model
 * work, rather than for running a model: random-weight model directories
 * (tools/mkmodel.c), SentencePiece training (tools/spm_train.cpp: the only
 * code that needs libsentencepiece_train, linked only where tools/ is),
 * speed and memory measurement (tools/bench.c) and recording and scoring
 * (tools/score.c). */
#ifndef SFW_TOOLS_H
#define SFW_TOOLS_H

#include "formats/config.h"
#include "runner/plan.h"
#include "runner/runner.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mkmodel (tools/mkmodel.c) -------------------------------------------
 * Random-weight MiniCPM-SALA model directories for tests and
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

/* ---- tokenizer training (tools/spm_train.cpp) -------------------------------
 * Trains a SentencePiece BPE model (byte_fallback, identity normalisation,
 * dummy prefix, no whitespace squeezing, split digits, 1 thread: deterministic
 * for a given corpus) and writes it atomically to out_model_path.
 * corpus_path NULL = the embedded default corpus (formats/corpus.c).
 * n_pieces is SentencePiece's vocab size — for a model of vocab V pass V - 8
 * (the special tokens sit above it); it must be >= 300 (3 control + 256 byte
 * pieces + some merges). It is a soft limit: a small corpus may give fewer
 * pieces (ids between the pieces and V-8 then simply never occur).
 * Not to be run concurrently with itself (it quiets libsentencepiece's global
 * log level while it trains). */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_train(const char *corpus_path, int n_pieces,
						   const char *out_model_path, struct sfw_err *err);

/* ---- bench (tools/bench.c) -------------------------------------------------
 * The engine's speed and memory measured through the public API,
 * shared by `salafw bench` (cli/cmd_bench.c) and bench/bench_gpu.c, and the
 * device-memory plan `salafw run` prints. */

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
/* The context and the prefill piece sfw_bench_run uses for p (the memory
 * plan `salafw bench` prints at start is for these). */
void sfw_bench_shape(const struct sfw_bench_params *p, int64_t *n_ctx, int64_t *chunk);

/* The limits, measured on the device now: copy bandwidth (GB/s, read +
 * written, 2 GiB device copy) and a bf16 cuBLASLt 8192^3 GEMM (TFLOP/s).
 * SFW_E_UNSUPPORTED in a build without CUDA. */
SFW_MUST_CHECK enum sfw_status sfw_bench_limits(double *copy_gbps, double *gemm_tflops, struct sfw_err *err);

/* The CPU bf16 GEMM y[M, N] = x[M, K] . w^T (sfw_op_matmul_cpu) at one
 * shape on random data, timed for about half a second each on an executor
 * of `threads` threads (<= 0: sfw_default_threads()) and on one thread:
 * GFLOP/s into *all and *one, the threads used into *nthreads. */
SFW_MUST_CHECK enum sfw_status sfw_bench_cpu_gemm(int M, int N, int K, int threads, double *all, double *one,
						  int *nthreads, struct sfw_err *err);

/* ---- recording taps and scoring (tools/score.c) ---------------------------
 * A record gathers the taps of one fresh sequence (a prompt of prompt_len
 * tokens, then up to decode_steps one-token calls) into whole tensors named
 * as the golden files name them:
 *   prefill.embed / prefill.layer.{i}.out / prefill.final_norm [T, hidden],
 *   prefill.logits [T, vocab], decode.* [S, ...], decode.logits [S, vocab],
 *   sparse.layer.{i}.prefill.topk_idx [nkv, T, k] (-1 when never written),
 *   sparse.layer.{i}.prefill.block_score_last [nkv, nblocks],
 *   sparse.layer.{i}.decode.topk_idx [S, nkv, k] (-1 for dense steps),
 *   sparse.layer.{i}.decode.block_score [S, nkv, max nblocks] (NaN padded),
 *   sparse.layer.{i}.decode.n_compressed [S, 2] ((0, 0) for dense steps). */
struct sfw_record;
struct sfw_record_tensor {
	const char *name;
	int is_int; /* int32, else float32 */
	int ndim;
	int64_t shape[3];
	void *data;
};
SFW_MUST_CHECK enum sfw_status sfw_record_new(const struct sfw_config *cf, int64_t prompt_len, int decode_steps,
					      struct sfw_record **out, struct sfw_err *err);
void sfw_record_free(struct sfw_record *r);
/* A sfw_tap_fn: user is the record. Allocation failures are remembered and
 * returned by sfw_record_status. */
void sfw_record_tap(void *user, const struct sfw_tap *t);
enum sfw_status sfw_record_status(const struct sfw_record *r, struct sfw_err *err);
/* Adds (or replaces) an int32 vector, e.g. decode.tokens. */
SFW_MUST_CHECK enum sfw_status sfw_record_put_i32(struct sfw_record *r, const char *name, const int32_t *v,
						  int64_t n, struct sfw_err *err);
size_t sfw_record_count(const struct sfw_record *r);
const struct sfw_record_tensor *sfw_record_at(const struct sfw_record *r, size_t i);
const struct sfw_record_tensor *sfw_record_find(const struct sfw_record *r, const char *name);
/* Writes every tensor (sorted by name) as a safetensors file: temp + rename. */
SFW_MUST_CHECK enum sfw_status sfw_record_write(const struct sfw_record *r, const char *path,
						const char *meta_key, const char *meta_value, struct sfw_err *err);

struct sfw_score_params {
	const int32_t *ids;     /* the prompt */
	size_t n;
	int decode_steps;       /* one-token calls after the prompt */
	const int32_t *feed;    /* [decode_steps] tokens to feed; NULL: the greedy chain */
	int taps;               /* 0: only logits / tokens / selections */
	struct sfw_ctx_params ctx;
};
/* Runs the prompt and the decode steps on a fresh context, recording
 * prefill.logits for every position, decode.logits, decode.tokens (argmax
 * of the last prefill logits, then of each step; lowest index on ties),
 * decode.input_ids, the sparse selections, and with taps the hidden states.
 * The record is the caller's (sfw_record_free). */
SFW_MUST_CHECK enum sfw_status sfw_score_run(struct sfw_model *m, const struct sfw_score_params *p,
					     struct sfw_record **out, struct sfw_err *err);

#ifdef __cplusplus
}
#endif

#endif
