/* fold.c - the quant module's shared helpers: the AWQ fold (built by the
 * scale search, quant/awq.c; read by the writer's plan, quant/quant.c) and
 * the progress clock and phase events both use. The calls run
 * one way: quant.c -> awq.c -> fold.c, quant.c -> fold.c (quant_int.h). */
#include "quant/quant_int.h"
#include "alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- the fold ------------------------------------------------------------- */

void sfwi_fold_free(struct sfwi_fold *f)
{
	if (!f || !f->L)
		return;
	for (int i = 0; i < f->n_layers; i++) {
		sfw_free(f->L[i].s_attn);
		sfw_free(f->L[i].s_o);
		sfw_free(f->L[i].s_mlp);
		sfw_free(f->L[i].s_down);
	}
	sfw_free(f->L);
	f->L = NULL;
	f->n_layers = 0;
}

void sfwi_fold_lookup(const struct sfwi_fold *f, const char *name, const float **col, const float **div)
{
	*col = *div = NULL;
	int li, off = 0;
	if (!f || !f->L || sscanf(name, "model.layers.%d.%n", &li, &off) != 1 || off == 0 || li < 0 ||
	    li >= f->n_layers)
		return;
	const struct sfwi_fold_layer *L = &f->L[li];
	const char *s = name + off;
	if (!strcmp(s, "input_layernorm.weight"))
		*div = L->s_attn;
	else if (!strcmp(s, "self_attn.q_proj.weight") || !strcmp(s, "self_attn.k_proj.weight") ||
		 !strcmp(s, "self_attn.v_proj.weight") || !strcmp(s, "self_attn.o_gate.weight") ||
		 !strcmp(s, "self_attn.z_proj.weight"))
		*col = L->s_attn;
	else if (!strcmp(s, "self_attn.o_norm.weight"))
		*div = L->s_o;
	else if (!strcmp(s, "self_attn.o_proj.weight"))
		*col = L->s_o;
	else if (!strcmp(s, "post_attention_layernorm.weight"))
		*div = L->s_mlp;
	else if (!strcmp(s, "mlp.gate_proj.weight"))
		*col = L->s_mlp;
	else if (!strcmp(s, "mlp.up_proj.weight")) {
		*col = L->s_mlp;
		*div = L->s_down;
	} else if (!strcmp(s, "mlp.down_proj.weight"))
		*col = L->s_down;
}

/* ---- progress ---------------------------------------------------------------- */

void sfwi_phase(const struct sfw_quant_params *p, enum sfw_quant_phase ph, int64_t i, int64_t n, double t0)
{
	if (!p->on_phase)
		return;
	struct sfw_quant_event ev = {ph, i, n, 0, 0, sfw_now_s() - t0};
	p->on_phase(p->progress_user, &ev);
}
