/* model.c - binds the checkpoint's tensors (model-spec §3) to the backend,
 * checking each name, dtype and shape against the config first. */
#include "runner/model.h"
#include "alloc.h"

#include <stdio.h>
#include <string.h>

struct binder {
	struct sfw_model *m;
	struct sfw_err *err;
	char dir[1024];
};

/* Finds `name` with dtype BF16 or F32 and shape [d0] or [d0, d1]. */
static enum sfw_status bind(struct binder *b, struct sfw_bweight *w, const char *name, int ndim, int64_t d0,
			    int64_t d1)
{
	const struct sfw_tensor_info *t = sfw_st_set_find(b->m->st, name);
	if (!t)
		return sfw_fail(b->err, SFW_E_FORMAT, "model '%s': tensor '%s' is missing", b->dir, name);
	if (t->dtype != SFW_DTYPE_BF16 && t->dtype != SFW_DTYPE_F32)
		return sfw_fail(b->err, SFW_E_UNSUPPORTED, "model '%s': tensor '%s' has dtype %s (want BF16 or F32)",
				b->dir, name, sfw_dtype_name(t->dtype));
	int ok = t->ndim == ndim && (int64_t)t->shape[0] == d0 && (ndim == 1 || (int64_t)t->shape[1] == d1);
	if (!ok) {
		char got[128] = "", want[64];
		for (int i = 0; i < t->ndim && i < 4; i++)
			snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%llu", i ? ", " : "",
				 (unsigned long long)t->shape[i]);
		if (ndim == 1)
			snprintf(want, sizeof(want), "%lld", (long long)d0);
		else
			snprintf(want, sizeof(want), "%lld, %lld", (long long)d0, (long long)d1);
		return sfw_fail(b->err, SFW_E_FORMAT, "model '%s': tensor '%s' has shape [%s], config says [%s]",
				b->dir, name, got, want);
	}
	w->name = t->name;
	w->host = t->data;
	w->dev = NULL;
	w->dtype = t->dtype == SFW_DTYPE_BF16 ? SFW_OP_BF16 : SFW_OP_F32;
	w->rows = ndim == 1 ? 1 : d0;
	w->cols = ndim == 1 ? d0 : d1;
	enum sfw_status s = b->m->be->weight_upload(b->m->be, w, b->err);
	if (s == SFW_OK)
		b->m->nweights++;
	return s;
}

static enum sfw_status bindf(struct binder *b, struct sfw_bweight *w, int ndim, int64_t d0, int64_t d1,
			     const char *fmt, int layer)
{
	char name[256];
	snprintf(name, sizeof(name), fmt, layer);
	return bind(b, w, name, ndim, d0, d1);
}

static void release(struct sfw_model *m, struct sfw_bweight *w)
{
	if (w->host && m->be)
		m->be->weight_release(m->be, w);
	memset(w, 0, sizeof(*w));
}

enum sfw_status sfwi_model_open(struct sfw_model *m, const char *dir, struct sfw_err *err)
{
	struct binder b = {.m = m, .err = err};
	snprintf(b.dir, sizeof(b.dir), "%s", dir);
	const struct sfw_config *c = &m->cfg;
	enum sfw_status s;
	if ((s = sfw_config_load(dir, &m->cfg, err)) != SFW_OK)
		return s;
	if (c->attn_use_rope)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': attn_use_rope is true (sparse layers are NoPE)",
				dir);
	if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads)
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': num_attention_heads %d is not a multiple of "
				"num_key_value_heads %d", dir, c->num_attention_heads, c->num_key_value_heads);
	if ((s = sfw_st_set_open(dir, &m->st, err)) != SFW_OK)
		return s;
	m->layers = sfw_calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
	if (!m->layers)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	int64_t D = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
	int64_t qd = (int64_t)c->num_attention_heads * c->head_dim, kvd = (int64_t)c->num_key_value_heads * c->head_dim;
	int64_t ld = (int64_t)c->lightning_nh * c->lightning_head_dim;
	if ((s = bind(&b, &m->embed, "model.embed_tokens.weight", 2, V, D)) ||
	    (s = bind(&b, &m->norm, "model.norm.weight", 1, D, 0)) ||
	    (s = bind(&b, &m->lm_head, "lm_head.weight", 2, V, D)))
		return s;
	for (int i = 0; i < c->num_hidden_layers; i++) {
		struct sfwi_layer *L = &m->layers[i];
		L->kind = c->mixer[i];
		if ((s = bindf(&b, &L->in_norm, 1, D, 0, "model.layers.%d.input_layernorm.weight", i)) ||
		    (s = bindf(&b, &L->post_norm, 1, D, 0, "model.layers.%d.post_attention_layernorm.weight", i)) ||
		    (s = bindf(&b, &L->gate, 2, I, D, "model.layers.%d.mlp.gate_proj.weight", i)) ||
		    (s = bindf(&b, &L->up, 2, I, D, "model.layers.%d.mlp.up_proj.weight", i)) ||
		    (s = bindf(&b, &L->down, 2, D, I, "model.layers.%d.mlp.down_proj.weight", i)))
			return s;
		if (L->kind == SFW_MIXER_SPARSE) {
			if ((s = bindf(&b, &L->q, 2, qd, D, "model.layers.%d.self_attn.q_proj.weight", i)) ||
			    (s = bindf(&b, &L->k, 2, kvd, D, "model.layers.%d.self_attn.k_proj.weight", i)) ||
			    (s = bindf(&b, &L->v, 2, kvd, D, "model.layers.%d.self_attn.v_proj.weight", i)) ||
			    (s = bindf(&b, &L->o, 2, D, qd, "model.layers.%d.self_attn.o_proj.weight", i)))
				return s;
			if (c->attn_use_output_gate &&
			    (s = bindf(&b, &L->o_gate, 2, qd, D, "model.layers.%d.self_attn.o_gate.weight", i)))
				return s;
		} else {
			if ((s = bindf(&b, &L->q, 2, ld, D, "model.layers.%d.self_attn.q_proj.weight", i)) ||
			    (s = bindf(&b, &L->k, 2, ld, D, "model.layers.%d.self_attn.k_proj.weight", i)) ||
			    (s = bindf(&b, &L->v, 2, ld, D, "model.layers.%d.self_attn.v_proj.weight", i)) ||
			    (s = bindf(&b, &L->o, 2, D, ld, "model.layers.%d.self_attn.o_proj.weight", i)))
				return s;
			if (c->use_output_gate &&
			    (s = bindf(&b, &L->z, 2, ld, D, "model.layers.%d.self_attn.z_proj.weight", i)))
				return s;
			if (c->qk_norm &&
			    ((s = bindf(&b, &L->q_norm, 1, c->lightning_head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", i)) ||
			     (s = bindf(&b, &L->k_norm, 1, c->lightning_head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", i))))
				return s;
			if (c->use_output_norm &&
			    (s = bindf(&b, &L->o_norm, 1, ld, 0, "model.layers.%d.self_attn.o_norm.weight", i)))
				return s;
		}
	}
	/* Lightning decays: the ALiBi slope list (model-spec §1.2). */
	int nh = c->lightning_nh;
	float slopes[1024];
	if (nh > 1024)
		return sfw_fail(err, SFW_E_RANGE, "model '%s': lightning_nh %d is too large", dir, nh);
	for (int h = 0; h < nh; h++)
		slopes[h] = sfw_config_lightning_slope(nh, h);
	m->decay = m->be->alloc(m->be, (size_t)nh * sizeof(float));
	if (!m->decay)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the lightning decays");
	m->be->from_host(m->be, m->decay, slopes, (size_t)nh * sizeof(float));
	return SFW_OK;
}

void sfwi_model_close(struct sfw_model *m)
{
	if (m->layers) {
		for (int i = 0; i < m->cfg.num_hidden_layers; i++) {
			struct sfwi_layer *L = &m->layers[i];
			struct sfw_bweight *ws[] = {&L->in_norm, &L->post_norm, &L->gate, &L->up, &L->down, &L->q,
						    &L->k, &L->v, &L->o, &L->o_gate, &L->z, &L->q_norm, &L->k_norm,
						    &L->o_norm};
			for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]); k++)
				release(m, ws[k]);
		}
		sfw_free(m->layers);
		m->layers = NULL;
	}
	release(m, &m->embed);
	release(m, &m->norm);
	release(m, &m->lm_head);
	if (m->decay && m->be)
		m->be->free(m->be, m->decay);
	m->decay = NULL;
	sfw_st_set_close(m->st);
	m->st = NULL;
}
