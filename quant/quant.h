/* quant.h - offline 8-bit weight quantization (W8A16) of a MiniCPM-SALA
 * model directory into a compressed-tensors "pack-quantized" checkpoint
 * (layout: num/w8_layout.h), with round-to-nearest or AWQ scale search.
 *
 *   struct sfw_quant_params p = sfw_quant_default_params();
 *   p.group_size = 32;
 *   s = sfw_quant_run("in", "out", &p, &err);
 *
 * The output is streamed tensor by tensor from the read-only map of the
 * input (memory: one tensor's rows at a time plus, for AWQ, the calibration
 * statistics; each input tensor's pages are released from the map once it
 * is written, so the resident set stays at about one tensor, not the
 * model), each shard written to a temporary name and renamed. Before
 * the first shard lands, out_dir's config.json and index are removed, and
 * config.json (with quantization_config) is written last, so a failed run
 * never leaves a directory that loads; shards the new index does not list
 * are removed at the end (without force, only those salafw wrote). Quantization
 * always runs the plain-C reference quantizer below, so output files are a
 * deterministic function of (input, params). */
#ifndef SFW_QUANT_H
#define SFW_QUANT_H

#include "num/w8_layout.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

enum sfw_quant_method { SFW_QUANT_RTN, SFW_QUANT_AWQ };

/* The most calibration sequences the default (samples 0) runs: 128 x 512
 * tokens, AutoAWQ's and llm-awq's default, when the text is that long. */
#define SFW_QUANT_AUTO_SAMPLES 128

struct sfw_quant_stats {
	int n_quantized;        /* linears written as int8 */
	int n_copied;           /* tensors copied (possibly AWQ-folded) */
	int n_shards;
	uint64_t bytes_in;      /* tensor data read */
	uint64_t bytes_out;     /* tensor data written */
	int awq_mappings;       /* smoothing groups searched */
	int awq_identity;       /* ... of which kept alpha = 0 (no smoothing) */
	double awq_mean_alpha;  /* over the searched groups */
	double awq_loss_gain;   /* mean (1 - best loss / loss at alpha 0) */
	int64_t calib_tokens;   /* tokens run through the model (BOS of each sequence included) */
	int64_t calib_samples;  /* sequences run */
	int64_t calib_text_tokens; /* tokens the calibration text gave */
	int64_t calib_text_used;   /* text tokens the sequences took (more than calib_text_tokens:
				    * the text was gone through again; never with the default samples) */
	int awq_gpu_groups;     /* groups searched on the GPU (the model on CUDA) */
	int awq_check_diff;     /* awq_check: groups whose GPU and CPU losses differ */
	double seconds_calib, seconds_total;
};

/* Called after each output tensor (from the calling thread); returning false
 * cancels with SFW_E_ABORTED. */
typedef int (*sfw_quant_progress_fn)(void *user, const char *tensor, uint64_t bytes_done, uint64_t bytes_total);

/* What the quantizer is doing, for a progress display (from the calling
 * thread): LOAD (i = 0 before the model is loaded, or uploaded to the
 * calibration device, i = 1 after), CALIB (sequence i of n done), SEARCH
 * (layer i of n searched), WRITE (i of n output bytes written, in shard
 * `shard` of `n_shards`). elapsed: seconds since the phase began. */
enum sfw_quant_phase { SFW_QP_LOAD, SFW_QP_CALIB, SFW_QP_SEARCH, SFW_QP_WRITE };
struct sfw_quant_event {
	enum sfw_quant_phase phase;
	int64_t i, n;
	int shard, n_shards; /* WRITE: 1-based */
	double elapsed;
};
typedef void (*sfw_quant_phase_fn)(void *user, const struct sfw_quant_event *ev);

struct sfw_quant_params {
	int group_size;               /* 32, 64, 128 (default) or SFW_QL_GROUP_CHANNEL */
	enum sfw_quant_method method; /* default SFW_QUANT_AWQ */
	/* AWQ calibration (docs/awq.md §1.2-1.4) */
	const char *calib_path;       /* UTF-8 text; NULL: sfw_default_corpus */
	int samples;                  /* sequences; 0 (default): as many as the text fills, at most
				       * SFW_QUANT_AUTO_SAMPLES, each text token used once */
	int seq_len;                  /* tokens per sequence (default 512) */
	int loss_rows;                /* cached input rows per layer for the loss (default 256) */
	int n_grid;                   /* alpha grid points (default 20: alpha = k/20, k = 0..19) */
	int duo_scaling;              /* 1 (default): s = x^a / w^(1-a); 0: s = x^a */
	int device;                   /* enum sfw_device for the calibration forward (default CPU) */
	int awq_check;                /* tests: with the search on the GPU, search every group on the
				       * CPU too and count those whose losses differ (stats) */
	int fold_only;                /* tests: apply the AWQ fold, write every changed tensor as
				       * float32 and quantize nothing (no quantization_config) */
	int threads;                  /* 0: sfw_default_threads() */
	uint64_t shard_bytes;         /* 0: 5 GB, as the original checkpoint */
	int force;                    /* overwrite a model already in out_dir */
	sfw_quant_progress_fn progress;
	sfw_quant_phase_fn on_phase; /* optional; gets progress_user too */
	void *progress_user;
	struct sfw_quant_stats *stats; /* filled when non-NULL */
};
struct sfw_quant_params sfw_quant_default_params(void);

/* in_dir: a bf16 (or f32) MiniCPM-SALA model directory, not already
 * quantized; out_dir is created; it must differ from in_dir. Copies the
 * tokenizer, generation config and remote-code files. */
SFW_MUST_CHECK enum sfw_status sfw_quant_run(const char *in_dir, const char *out_dir,
					     const struct sfw_quant_params *p, struct sfw_err *err);

/* ---- the reference quantizer (quant/w8_ref.c) ------------------------------
 * One row of K weights (float) -> codes[ceil(K/4)*4] bytes (pad bytes 0) and
 * scales[ngroups] bf16 bits, by the rule of num/w8_layout.h. Returns 0, or -1
 * when the row holds a NaN or infinity (nothing meaningful is written). */
int sfw_quant_row_w8_ref(const float *w, int64_t K, int group, uint8_t *codes, uint16_t *scales);
/* codes + bf16 scales -> K floats: (b - 128) * scale. */
void sfw_quant_dequant_row_w8(const uint8_t *codes, const uint16_t *scales, int64_t K, int group, float *out);
/* Quantize then dequantize in place (the fake quantizer of the AWQ search;
 * same rule, same rounding). Returns 0 or -1 as sfw_quant_row_w8_ref. */
int sfw_quant_fake_row_w8(float *w, int64_t K, int group);

/* ---- formats (quant/qtypes.c) ---------------------------------------------- */
struct sfw_qtype_traits {
	const char *name;        /* "w8-g128", "w8-g64", "w8-g32", "w8-channel" */
	int group_size;          /* SFW_QL_GROUP_CHANNEL for per-row */
	int bits;
	size_t bytes_per_group;  /* code bytes + scale bytes of one full group (channel: 0, row-sized) */
	int (*quant_row_ref)(const float *w, int64_t K, int group, uint8_t *codes, uint16_t *scales);
	void (*dequant_row)(const uint8_t *codes, const uint16_t *scales, int64_t K, int group, float *out);
};
/* NULL when group_size is not one of 32, 64, 128, channel. */
const struct sfw_qtype_traits *sfw_quant_traits(int group_size);
/* "32" | "64" | "128" | "channel" -> group size; -1 when invalid. */
int sfw_quant_group_parse(const char *s);

#endif
