/* model.c - loads a model: picks the backend (the registry, runner/backends.c),
 * binds the checkpoint's tensors (docs/model-spec.md §3) to it, checking each
 * name, dtype and shape against the config first, and forms the projection
 * groups the forward pass calls (merged into one matrix where the backend
 * places them so). */
#include "runner/model.h"
#include "alloc.h"
#include "file.h"
#include "json.h"
#include "log.h"
#include "num/w8_layout.h"

#include <stdio.h>
#include <string.h>

struct binder {
	struct sfw_model *m;
	struct sfw_err *err;
	char dir[1024];
};

/* ---- compressed-tensors pack-quantized int8 (num/w8_layout.h) ---------------- */

static const char *jstr(const cJSON *o, const char *k)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static int jnull(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return !v || cJSON_IsNull(v);
}

/* One config group's "weights": int8, symmetric, group or channel, static. */
static enum sfw_status quant_group(struct sfw_model *m, const char *dir, const char *gname, const cJSON *g,
				   const char *fmt, struct sfw_err *err)
{
	const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
	const char *gf = jstr(g, "format");
	if (gf)
		fmt = gf;
	if (!cJSON_IsObject(w))
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': quantization_config group '%.40s' has no weights", dir,
				gname);
	if (!fmt || strcmp(fmt, "pack-quantized") != 0)
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"model '%s': compressed-tensors format '%.40s' is not supported (salafw runs "
				"pack-quantized int8 weights)", dir, fmt ? fmt : "(none)");
	if (!jnull(g, "input_activations") || !jnull(g, "output_activations"))
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"model '%s': activation quantization (W8A8) is not supported (weight-only int8 is)", dir);
	const cJSON *nb = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
	const char *type = jstr(w, "type"), *strat = jstr(w, "strategy");
	if (!cJSON_IsNumber(nb) || nb->valuedouble != SFW_QL_BITS)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': %g-bit weights are not supported (int8 only)", dir,
				cJSON_IsNumber(nb) ? nb->valuedouble : 0.0);
	if (!type || strcmp(type, "int") != 0)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': weight type '%.20s' is not supported (int only)", dir,
				type ? type : "(none)");
	if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "symmetric")))
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"model '%s': asymmetric int8 (zero points) is not supported (symmetric only)", dir);
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "dynamic")) || !jnull(w, "actorder"))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': dynamic or act-order weight quantization is not "
				"supported", dir);
	const cJSON *gs = cJSON_GetObjectItemCaseSensitive(w, "group_size");
	int group;
	if (strat && !strcmp(strat, "channel"))
		group = 0;
	else if (strat && !strcmp(strat, "group") && cJSON_IsNumber(gs) && gs->valuedouble == -1)
		group = 0;
	else if (strat && !strcmp(strat, "group") && cJSON_IsNumber(gs) && gs->valuedouble >= 1 &&
		 gs->valuedouble <= 65536 && gs->valuedouble == (int)gs->valuedouble)
		group = (int)gs->valuedouble;
	else
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': weight strategy '%.20s' is not supported (group or "
				"channel)", dir, strat ? strat : "(none)");
	if (m->n_quant_groups >= (int)(sizeof(m->quant_groups) / sizeof(m->quant_groups[0])))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': too many quantization config groups", dir);
	m->quant_groups[m->n_quant_groups++] = group;
	return SFW_OK;
}

/* Reads config.json's quantization_config (absent: a plain checkpoint). */
static enum sfw_status quant_config(struct sfw_model *m, const char *dir, struct sfw_err *err)
{
	char *path = sfw_path_join(dir, "config.json");
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_buf b;
	sfw_buf_init(&b, 4u << 20);
	cJSON *root = NULL;
	enum sfw_status s = sfw_read_file(path, 4u << 20, &b, err);
	if (s == SFW_OK)
		s = sfw_json_parse(b.data, b.len, path, &root, err);
	sfw_buf_release(&b);
	sfw_free(path);
	if (s != SFW_OK)
		return s;
	const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
	if (!q || cJSON_IsNull(q))
		goto done;
	m->quantized = 1;
	const char *meth = jstr(q, "quant_method");
	if (!cJSON_IsObject(q) || !meth || strcmp(meth, "compressed-tensors") != 0) {
		s = sfw_fail(err, SFW_E_UNSUPPORTED,
			     "model '%s': quantization method '%.40s' is not supported (salafw runs compressed-tensors "
			     "pack-quantized int8, as `salafw quant` writes)", dir, meth ? meth : "(none)");
		goto done;
	}
	if (!jnull(q, "kv_cache_scheme")) {
		s = sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': a quantized KV cache (kv_cache_scheme) is not supported",
			     dir);
		goto done;
	}
	const cJSON *sp = cJSON_GetObjectItemCaseSensitive(q, "sparsity_config");
	if (cJSON_IsObject(sp) && sp->child && jstr(sp, "format") && strcmp(jstr(sp, "format"), "dense") != 0) {
		s = sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': sparse (%.20s) weights are not supported", dir,
			     jstr(sp, "format"));
		goto done;
	}
	const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups"), *g;
	if (!cJSON_IsObject(groups) || !groups->child) {
		s = sfw_fail(err, SFW_E_FORMAT, "model '%s': quantization_config has no config_groups", dir);
		goto done;
	}
	cJSON_ArrayForEach(g, groups)
	{
		if ((s = quant_group(m, dir, g->string, g, jstr(q, "format"), err)) != SFW_OK)
			goto done;
	}
done:
	cJSON_Delete(root);
	return s;
}

/* Binds `<prefix>.weight_packed/_scale/_shape` as an int8 [d0, d1] weight. */
static enum sfw_status bind_w8(struct sfw_model *m, struct sfw_bweight *w, const char *dir, const char *prefix,
			       int64_t d0, int64_t d1, struct sfw_err *err)
{
	char nm[300];
	const struct sfw_tensor_info *pk, *sc, *sh;
	snprintf(nm, sizeof(nm), "%s.weight_zero_point", prefix);
	if (sfw_st_set_find(m->st, nm))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': '%s' has zero points (asymmetric int8 is not "
				"supported)", dir, prefix);
	snprintf(nm, sizeof(nm), "%s.weight_packed", prefix);
	pk = sfw_st_set_find(m->st, nm);
	snprintf(nm, sizeof(nm), "%s.weight_scale", prefix);
	sc = sfw_st_set_find(m->st, nm);
	snprintf(nm, sizeof(nm), "%s.weight_shape", prefix);
	sh = sfw_st_set_find(m->st, nm);
	if (!pk || !sc || !sh)
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': '%s' needs weight_packed, weight_scale and weight_shape",
				dir, prefix);
	if (pk->dtype != SFW_DTYPE_I32 || pk->ndim != 2 || (int64_t)pk->shape[0] != d0 ||
	    (int64_t)pk->shape[1] != sfw_ql_words(d1))
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': '%s.weight_packed' must be I32 [%lld, %lld] (int8 "
				"codes of a [%lld, %lld] weight)", dir, prefix, (long long)d0,
				(long long)sfw_ql_words(d1), (long long)d0, (long long)d1);
	int64_t shv[2] = {-1, -1};
	if (sh->ndim == 1 && sh->nelem == 2 && sh->dtype == SFW_DTYPE_I64)
		memcpy(shv, sh->data, sizeof(shv));
	else if (sh->ndim == 1 && sh->nelem == 2 && sh->dtype == SFW_DTYPE_I32)
		shv[0] = ((const int32_t *)sh->data)[0], shv[1] = ((const int32_t *)sh->data)[1];
	if (shv[0] != d0 || shv[1] != d1)
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': '%s.weight_shape' is [%lld, %lld], config says "
				"[%lld, %lld]", dir, prefix, (long long)shv[0], (long long)shv[1], (long long)d0,
				(long long)d1);
	if ((sc->dtype != SFW_DTYPE_BF16 && sc->dtype != SFW_DTYPE_F16 && sc->dtype != SFW_DTYPE_F32) ||
	    sc->ndim != 2 || (int64_t)sc->shape[0] != d0 || sc->shape[1] < 1 || (int64_t)sc->shape[1] > d1)
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': '%s.weight_scale' must be BF16, F16 or F32 [%lld, G]",
				dir, prefix, (long long)d0);
	/* the group size the config declares that gives this many scale columns */
	int64_t G = (int64_t)sc->shape[1];
	int group = -1;
	for (int i = 0; i < m->n_quant_groups && group < 0; i++)
		if (sfw_ql_ngroups(d1, m->quant_groups[i]) == G)
			group = m->quant_groups[i];
	if (group < 0)
		return sfw_fail(err, SFW_E_FORMAT, "model '%s': '%s.weight_scale' has %lld columns, which no group size "
				"of quantization_config gives for %lld inputs", dir, prefix, (long long)G, (long long)d1);
	if (!m->be->supports_op(m->be, SFW_OP_MATMUL, SFW_DTYPE_W8) || !m->be->supports_op(m->be, SFW_OP_LOGITS, SFW_DTYPE_W8))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s' has int8 weights, which the %s backend cannot run "
				"yet (use --device cpu)", dir, m->be->name);
	w->name = pk->name;
	w->host = pk->data;
	w->dev = NULL;
	w->dtype = SFW_DTYPE_W8;
	w->rows = d0;
	w->cols = d1;
	w->scales = sc->data;
	w->scale_dtype = sc->dtype; /* BF16, F16 or F32: checked above */
	w->group = (int)sfw_ql_group_span(d1, group);
	w->scales_dev = NULL;
	w->host_mapped = 1; /* both in the shard's map */
	enum sfw_status s = m->be->weight_upload(m->be, w, err);
	if (s == SFW_OK)
		m->nweights++, m->n_w8++;
	return s;
}

/* Finds `name` with dtype BF16 or F32 and shape [d0] or [d0, d1]. */
static enum sfw_status bind(struct binder *b, struct sfw_bweight *w, const char *name, int ndim, int64_t d0,
			    int64_t d1)
{
	const struct sfw_tensor_info *t = sfw_st_set_find(b->m->st, name);
	size_t nl = strlen(name);
	if (!t && b->m->quantized && ndim == 2 && nl > 7 && nl < 280 && !strcmp(name + nl - 7, ".weight")) {
		/* int8 only where the engine computes through matmul/logits: the
		 * decoder linears and lm_head; an int8 embedding would be read as
		 * floats (4x past its end) */
		if (!sfw_ql_is_quantized(name, NULL) && strcmp(name, "lm_head.weight") != 0)
			return sfw_fail(b->err, SFW_E_UNSUPPORTED,
					"model '%s': tensor '%s' is missing (stored quantized? only the decoder linears "
					"and lm_head may be int8)",
					b->dir, name);
		char prefix[300];
		memcpy(prefix, name, nl - 7);
		prefix[nl - 7] = 0;
		return bind_w8(b->m, w, b->dir, prefix, d0, d1, b->err);
	}
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
	w->dtype = t->dtype; /* BF16 or F32: checked above */
	w->rows = ndim == 1 ? 1 : d0;
	w->cols = ndim == 1 ? d0 : d1;
	w->host_mapped = 1;
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

/* An uploaded weight lives as long as the backend (sfw_model_free destroys
 * it after this): only the binding is cleared. */
static void release(struct sfw_bweight *w)
{
	memset(w, 0, sizeof(*w));
}

static enum sfw_status model_open(struct sfw_model *m, const char *dir, struct sfw_err *err)
{
	struct binder b = {.m = m, .err = err};
	snprintf(b.dir, sizeof(b.dir), "%s", dir);
	const struct sfw_config *c = &m->cfg;
	enum sfw_status s;
	if ((s = sfw_config_load(dir, &m->cfg, err)) != SFW_OK || (s = quant_config(m, dir, err)) != SFW_OK)
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
	/* Lightning decays: the ALiBi slope list (docs/model-spec.md §1.2). */
	int nh = c->lightning_nh;
	float slopes[1024];
	if (nh > 1024)
		return sfw_fail(err, SFW_E_RANGE, "model '%s': lightning_nh %d is too large", dir, nh);
	for (int h = 0; h < nh; h++)
		slopes[h] = sfw_config_lightning_slope(nh, h);
	m->decay = m->be->alloc(m->be, (size_t)nh * sizeof(float));
	if (!m->decay)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the lightning decays");
	sfw_be_from_host(m->be, m->decay, slopes, (size_t)nh * sizeof(float));
	return SFW_OK;
}

static double bweight_bytes(const struct sfw_bweight *w)
{
	if (!w->host)
		return 0;
	if (w->dtype == SFW_DTYPE_W8)
		return (double)w->rows * (double)(sfw_bweight_w8_code_row(w) + sfw_bweight_w8_scale_row(w));
	return (double)w->rows * (double)w->cols * (w->dtype == SFW_DTYPE_BF16 ? 2 : 4);
}

void sfwi_model_weight_bytes(const struct sfw_model *m, double *all, double *step)
{
	double a = bweight_bytes(&m->embed) + bweight_bytes(&m->norm), st = bweight_bytes(&m->lm_head);
	for (int i = 0; m->layers && i < m->cfg.num_hidden_layers; i++) {
		const struct sfwi_layer *L = &m->layers[i];
		const struct sfw_bweight *lin[] = {&L->gate, &L->up, &L->down, &L->q, &L->k, &L->v, &L->o, &L->o_gate, &L->z};
		const struct sfw_bweight *nrm[] = {&L->in_norm, &L->post_norm, &L->q_norm, &L->k_norm, &L->o_norm};
		for (size_t k = 0; k < sizeof(lin) / sizeof(lin[0]); k++)
			st += bweight_bytes(lin[k]);
		for (size_t k = 0; k < sizeof(nrm) / sizeof(nrm[0]); k++)
			a += bweight_bytes(nrm[k]);
	}
	*all = a + st;
	*step = st;
}

static void model_close(struct sfw_model *m)
{
	if (m->layers) {
		for (int i = 0; i < m->cfg.num_hidden_layers; i++) {
			struct sfwi_layer *L = &m->layers[i];
			struct sfw_bweight *ws[] = {&L->in_norm, &L->post_norm, &L->gate, &L->up, &L->down, &L->q,
						    &L->k, &L->v, &L->o, &L->o_gate, &L->z, &L->q_norm, &L->k_norm,
						    &L->o_norm};
			for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]); k++)
				release(ws[k]);
		}
		sfw_free(m->layers);
		m->layers = NULL;
	}
	release(&m->embed);
	release(&m->norm);
	release(&m->lm_head);
	if (m->decay && m->be)
		m->be->free(m->be, m->decay);
	m->decay = NULL;
	sfw_st_set_close(m->st);
	m->st = NULL;
}

/* ---- projection groups ------------------------------------------------------ */

/* Each layer's projections that read the same input, offered to the
 * backend as one matrix (decode then runs one GEMV over it). */
static enum sfw_status groups_bind(struct sfw_model *m, struct sfw_err *err)
{
	int done = 0;
	enum sfw_status s;
	for (int i = 0; i < m->cfg.num_hidden_layers; i++) {
		struct sfwi_layer *L = &m->layers[i];
		struct sfw_bweight *last = L->kind == SFW_MIXER_SPARSE ? &L->o_gate : &L->z;
		struct sfw_bgroup *p = &L->proj, *gu = &L->gu;
		p->part[0] = &L->q, p->part[1] = &L->k, p->part[2] = &L->v, p->part[3] = last;
		p->n = last->host ? 4 : 3;
		gu->part[0] = &L->gate, gu->part[1] = &L->up;
		gu->n = 2;
		if ((s = sfwi_group_bind(m->be, p, err)) != SFW_OK || (s = sfwi_group_bind(m->be, gu, err)) != SFW_OK)
			return s;
		done += (p->merged.rows > 0) + (gu->merged.rows > 0);
	}
	sfw_log(SFW_LOG_DEBUG, "%s: %d merged projections", m->be->name, done);
	return SFW_OK;
}

/* ---- loading ---------------------------------------------------------------- */

struct sfw_model_params sfw_model_default_params(void)
{
	struct sfw_model_params p = {SFW_DEVICE_AUTO, 0, {0}, SFW_KV_CACHE_ACT};
	return p;
}

/* The first backend of the registry that p->device names (AUTO: the first
 * that starts) into m->be. */
static enum sfw_status backend_pick(const struct sfw_model_params *p, struct sfw_model *m, struct sfw_err *err)
{
	int n;
	const struct sfw_backend_entry *bl = sfw_backend_list(&n);
	for (int i = 0; i < n; i++) {
		if (p->device != SFW_DEVICE_AUTO && bl[i].device != p->device)
			continue;
		struct sfw_err be = {0};
		enum sfw_status s = bl[i].create(p, &m->be, &be);
		if (s == SFW_OK)
			return SFW_OK;
		if (p->device != SFW_DEVICE_AUTO) {
			if (err)
				*err = be;
			return s;
		}
		if (bl[i].device == SFW_DEVICE_CUDA) /* a CUDA build on a machine without a usable GPU */
			sfw_log(SFW_LOG_WARN, "no usable GPU (%s): running on the CPU", be.msg);
		else
			sfw_log(SFW_LOG_WARN, "the %s backend did not start (%s)", bl[i].name, be.msg);
	}
	if (p->device == SFW_DEVICE_CUDA)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "this build has no CUDA support (rebuild with make CUDA=1)");
	return sfw_fail(err, SFW_E_UNSUPPORTED, "no backend of this build could start");
}

enum sfw_status sfw_model_load(const char *dir, const struct sfw_model_params *p, struct sfw_model **out,
			       struct sfw_err *err)
{
	struct sfw_model_params dp = sfw_model_default_params();
	if (!p)
		p = &dp;
	*out = NULL;
	if (p->kv_cache != SFW_KV_CACHE_ACT && p->kv_cache != SFW_KV_CACHE_FP8)
		return sfw_fail(err, SFW_E_INVAL, "unknown KV cache kind %d", (int)p->kv_cache);
	struct sfw_model *m = sfw_calloc(1, sizeof(*m));
	if (!m)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	m->kv_cache = p->kv_cache;
	enum sfw_status s = backend_pick(p, m, err);
	if (s != SFW_OK) {
		sfw_free(m);
		return s;
	}
	s = sfwi_load(m->be, 0, err);
	if (s == SFW_OK)
		s = model_open(m, dir, err);
	if (s == SFW_OK)
		s = groups_bind(m, err);
	if (s == SFW_OK)
		s = sfwi_load(m->be, 1, err);
	if (s != SFW_OK) {
		/* AUTO picked a backend without int8 support: the CPU runs it */
		int retry = p->device == SFW_DEVICE_AUTO && s == SFW_E_UNSUPPORTED && m->n_w8 == 0 && m->quantized &&
			    !m->be->supports_op(m->be, SFW_OP_MATMUL, SFW_DTYPE_W8);
		sfw_model_free(m);
		if (retry) {
			struct sfw_model_params cp = *p;
			cp.device = SFW_DEVICE_CPU;
			sfw_log(SFW_LOG_WARN, "'%s' has int8 weights: running on the CPU", dir);
			return sfw_model_load(dir, &cp, out, err);
		}
		return s;
	}
	*out = m;
	return SFW_OK;
}

void sfw_model_free(struct sfw_model *m)
{
	if (!m)
		return;
	model_close(m);
	if (m->be)
		m->be->destroy(m->be);
	sfw_free(m);
}

const struct sfw_config *sfw_model_config(const struct sfw_model *m)
{
	return &m->cfg;
}

const char *sfw_model_device_name(const struct sfw_model *m)
{
	return m->be->name;
}
