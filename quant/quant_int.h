/* quant_int.h - (module-internal) the AWQ fold handed from the scale search
 * (quant/awq.c) to the writer (quant/quant.c), and the helpers both share.
 * Calls run one way: quant.c -> awq.c (sfwi_awq_search); both -> fold.c
 * (the fold, the clock, phase events, page release). */
#ifndef SFW_QUANT_INT_H
#define SFW_QUANT_INT_H

#include "formats/config.h"
#include "quant/quant.h"

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

#endif
