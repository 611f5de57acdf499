/* quant_int.h - (module-internal) the AWQ fold handed from the scale search
 * (quant/awq.c) to the writer (quant/quant.c), and the helpers both share.
 * Calls run one way: quant.c -> awq.c (sfwi_awq_search); both -> fold.c
 * (the fold, the clock, phase events, page release). */
#ifndef SFW_QUANT_INT_H
#define SFW_QUANT_INT_H

#include "formats/config.h"
#include "quant/quant.h"

struct sfw_bweight; /* runner/backend.h */
struct sfw_ops_cpu; /* kernels/ops.h */

/* Per-input-channel smoothing scales of one decoder layer (docs/awq.md §1.8);
 * NULL = identity. The fold (exact in real arithmetic, docs/awq.md §1.5):
 *   s_attn [D]:  input_layernorm.weight /= s; q,k,v,o_gate|z_proj columns *= s
 *   s_o    [ld]: (lightning) o_norm.weight /= s; o_proj columns *= s
 *   s_mlp  [D]:  post_attention_layernorm.weight /= s; gate,up columns *= s
 *   s_down [I]:  up_proj rows /= s; down_proj columns *= s
 * Never v_proj -> o_proj: o_norm (lightning) or GQA (sparse) sits between. */
struct sfwi_fold_layer {
	float *s_attn, *s_o, *s_mlp, *s_down;
};
struct sfwi_fold {
	int n_layers;
	struct sfwi_fold_layer *L;
};
void sfwi_fold_free(struct sfwi_fold *f); /* quant/fold.c, as the three below */

/* What a tensor of the checkpoint receives from the fold: columns multiplied
 * by col[k] (2-D) and rows / elements divided by div[r] (a 1-D norm weight:
 * div[k]). Both NULL when untouched. */
void sfwi_fold_lookup(const struct sfwi_fold *f, const char *name, const float **col, const float **div);

/* The progress event, when the caller asked for one. */
void sfwi_phase(const struct sfw_quant_params *p, enum sfw_quant_phase ph, int64_t i, int64_t n, double t0);

/* Runs the calibration forward on in_dir and searches every smoothing group
 * (quant/awq.c); fills *out (caller frees with sfwi_fold_free). */
SFW_MUST_CHECK enum sfw_status sfwi_awq_search(const char *in_dir, const struct sfw_quant_params *p,
					       struct sfwi_fold *out, struct sfw_err *err);

/* ---- one smoothing group's search (quant/awq.c) ----------------------------
 * The balance linears w[0..n) ([rows_i, K] each, bf16 or f32, stacked in
 * order as one [N, K] matrix W), the input statistic (per channel sum |x|
 * over count rows) and the R cached input rows X [R, K] (host memory). */
struct sfwi_awq_group {
	const struct sfw_bweight *w[5];
	int n, K;
	const double *sum;
	int64_t count;
	const float *X;
	int R;
};
/* The search's GPU side (quant/awq_cuda.c, CUDA=1 builds): device buffers
 * and a stream of its own. */
struct sfwi_awq_dev;

/* Searches one group (docs/awq.md §1.4, awq.c's header) on the CPU (dev
 * NULL; ex's threads, kernels/ops.h) or on the GPU (dev, with every w[i]->dev
 * set; else the CPU): the same losses either way, bit for bit. losses
 * [n_grid] (optional) gets each candidate's loss, *best_k the chosen one,
 * *out its scales [K] (NULL for the identity; the caller frees). dir names
 * the model in messages. */
SFW_MUST_CHECK enum sfw_status sfwi_awq_search_group(struct sfw_ops_cpu *ex, const char *dir,
						     const struct sfwi_awq_group *g,
						     const struct sfw_quant_params *p,
						     struct sfwi_awq_dev *dev, double *losses, int *best_k,
						     float **out, struct sfw_err *err);
/* Candidate gk's scales s [K] from xm (mean |x|) and wm (duo statistic):
 * gk 0 the identity, else alpha = gk / n_grid (awq.c's header). */
void sfwi_awq_scales(const float *xm, const float *wm, int K, int gk, int n_grid, int duo, float *s);

/* The C twins of kernels/awq.cu's kernels (kernels/awq_cuda.h), on
 * executor ex (kernels/ops.h; NULL: serially):
 *   fake_rows: Wq = Q(W diag s) diag(s)^-1 row by row (sfw_quant_fake_row_w8
 *     with `group`); bad[r] = 1 where row r of W diag s is not finite;
 *   duo_sums: gmax [N, ceil(K/span)] each row's group max |w|, then
 *     wm[k] = sum over rows r in order of |W[r, k]| / gmax (0 when the max is 0);
 *   sqerr_rows: part[r] = sum over n in order of (double(A[r, n]) - B[r, n])^2.
 * The product X W^T is sfw_op_matmul_cpu's with F32 weights. */
void sfwi_awq_fake_rows(struct sfw_ops_cpu *ex, float *Wq, unsigned char *bad, const float *W, const float *s,
			int64_t N, int K, int group);
void sfwi_awq_duo_sums(struct sfw_ops_cpu *ex, float *wm, float *gmax, const float *W, int N, int K,
		       int span);
void sfwi_awq_sqerr_rows(struct sfw_ops_cpu *ex, double *part, const float *A, const float *B, int R,
			 size_t N);

#if SFW_HAVE_CUDA
/* quant/awq_cuda.c: the GPU side on the current device. */
SFW_MUST_CHECK enum sfw_status sfwi_awq_dev_new(struct sfwi_awq_dev **out, struct sfw_err *err);
void sfwi_awq_dev_free(struct sfwi_awq_dev *d); /* NULL is a no-op */
/* Begins group g: W [N, K] as float from the device copies, X uploaded,
 * Y = X W^T, and the duo sums wm [K] (sfwi_awq_duo_sums with span) back on the host. */
SFW_MUST_CHECK enum sfw_status sfwi_awq_dev_begin(struct sfwi_awq_dev *d, const struct sfwi_awq_group *g, int span,
						  float *wm, struct sfw_err *err);
/* One candidate s [K]: part [R] the rows' squared errors of X Wq^T against
 * Y (sfwi_awq_sqerr_rows), Wq = fake_rows(W, s, group); *bad_row the first
 * row of W diag s that is not finite (part then unset), or -1. */
SFW_MUST_CHECK enum sfw_status sfwi_awq_dev_loss(struct sfwi_awq_dev *d, const float *s, int group, double *part,
						 int64_t *bad_row, struct sfw_err *err);
#endif

#endif
