/* config.c - config.json of a MiniCPM-SALA model (docs/model-spec.md §1), strict:
 * every field the forward pass depends on must be present with the right
 * type; fields with a fixed meaning in this family must have the value the
 * engine implements; sizes are bounded so products fit comfortably. */
#include "formats/config.h"

#include "alloc.h"
#include "file.h"
#include "json.h"

#include <math.h>
#include <string.h>

#define CONFIG_MAX (1u << 20)
#define MAX_HIDDEN 65536
#define MAX_INTER (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024

struct ctx {
	const cJSON *root;
	const char *what;
	struct sfw_err *err;
};

static enum sfw_status get_int(struct ctx *c, const cJSON *obj, const char *key, const char *prefix,
			       int64_t lo, int64_t hi, int required, int64_t dflt, int64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
	if (!v) {
		if (required)
			return sfw_fail(c->err, SFW_E_FORMAT, "%s: missing field '%s%s'", c->what, prefix,
					key);
		if (dflt < lo || dflt > hi) /* a default derived from other fields obeys the same range */
			return sfw_fail(c->err, SFW_E_RANGE, "%s: field '%s%s' is missing and its default %lld is "
					"outside [%lld, %lld]",
					c->what, prefix, key, (long long)dflt, (long long)lo, (long long)hi);
		*out = dflt;
		return SFW_OK;
	}
	double d = v->valuedouble;
	if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field '%s%s' must be an integer", c->what, prefix,
				key);
	if (d < (double)lo || d > (double)hi)
		return sfw_fail(c->err, SFW_E_RANGE, "%s: field '%s%s' = %.17g is outside [%lld, %lld]",
				c->what, prefix, key, d, (long long)lo, (long long)hi);
	*out = (int64_t)d;
	return SFW_OK;
}

static enum sfw_status get_i32(struct ctx *c, const char *key, int64_t lo, int64_t hi, int *out)
{
	int64_t v;
	enum sfw_status s = get_int(c, c->root, key, "", lo, hi, 1, 0, &v);
	if (s == SFW_OK)
		*out = (int)v;
	return s;
}

/* A finite number with lo < x (or lo <= x when !strict_lo) and x <= hi. */
static enum sfw_status get_num(struct ctx *c, const char *key, double lo, int strict_lo, double hi,
			       int required, double dflt, double *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
	if (!v) {
		if (required)
			return sfw_fail(c->err, SFW_E_FORMAT, "%s: missing field '%s'", c->what, key);
		*out = dflt;
		return SFW_OK;
	}
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field '%s' must be a number", c->what, key);
	double d = v->valuedouble;
	if ((strict_lo ? d <= lo : d < lo) || d > hi)
		return sfw_fail(c->err, SFW_E_RANGE, "%s: field '%s' = %.17g is out of range", c->what, key,
				d);
	*out = d;
	return SFW_OK;
}

static enum sfw_status get_bool(struct ctx *c, const char *key, int dflt, int *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
	if (!v) {
		*out = dflt;
		return SFW_OK;
	}
	if (!cJSON_IsBool(v))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field '%s' must be true or false", c->what, key);
	*out = cJSON_IsTrue(v);
	return SFW_OK;
}

/* An optional field that, when present, must hold the one value the engine implements. */
static enum sfw_status want_string(struct ctx *c, const char *key, const char *value)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
	if (!v)
		return SFW_OK;
	if (!cJSON_IsString(v))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field '%s' must be a string", c->what, key);
	if (strcmp(v->valuestring, value) != 0)
		return sfw_fail(c->err, SFW_E_UNSUPPORTED, "%s: %s '%.60s' is not supported (only '%s')",
				c->what, key, v->valuestring, value);
	return SFW_OK;
}

static enum sfw_status want_bool(struct ctx *c, const char *key, int value)
{
	int b;
	enum sfw_status s = get_bool(c, key, value, &b);
	if (s == SFW_OK && b != value)
		s = sfw_fail(c->err, SFW_E_UNSUPPORTED, "%s: %s = %s is not supported", c->what, key,
			     b ? "true" : "false");
	return s;
}

static enum sfw_status parse_mixers(struct ctx *c, struct sfw_config *o)
{
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(c->root, "mixer_types");
	if (!m)
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: missing field 'mixer_types'", c->what);
	if (!cJSON_IsArray(m))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field 'mixer_types' must be a list of strings",
				c->what);
	int n = cJSON_GetArraySize(m);
	if (n != o->num_hidden_layers)
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: mixer_types has %d entries for %d layers", c->what,
				n, o->num_hidden_layers);
	int i = 0;
	for (const cJSON *e = m->child; e; e = e->next, i++) {
		if (!cJSON_IsString(e))
			return sfw_fail(c->err, SFW_E_FORMAT, "%s: mixer_types[%d] must be a string", c->what,
					i);
		const char *s = e->valuestring;
		if (strcmp(s, "minicpm4") == 0)
			o->mixer[i] = SFW_MIXER_SPARSE;
		else if (strcmp(s, "lightning") == 0 || strcmp(s, "lightning_attn") == 0 ||
			 strcmp(s, "lightning-attn") == 0)
			o->mixer[i] = SFW_MIXER_LIGHTNING;
		else
			return sfw_fail(c->err, SFW_E_UNSUPPORTED, "%s: mixer_types[%d] = '%.40s' is unknown",
					c->what, i, s);
	}
	/* The reference counts seen tokens through layer 0's sparse cache. */
	if (o->mixer[0] != SFW_MIXER_SPARSE)
		return sfw_fail(c->err, SFW_E_UNSUPPORTED,
				"%s: layer 0 must be 'minicpm4' (found a lightning layer)", c->what);
	return SFW_OK;
}

static enum sfw_status parse_sparse(struct ctx *c, struct sfw_config *o)
{
	const cJSON *sc = cJSON_GetObjectItemCaseSensitive(c->root, "sparse_config");
	if (!sc)
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: missing field 'sparse_config'", c->what);
	if (!cJSON_IsObject(sc))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field 'sparse_config' must be an object", c->what);
	const char *p = "sparse_config.";
	int64_t ks, st, bs, tk, ib, ws, dl;
	enum sfw_status s;
	if ((s = get_int(c, sc, "kernel_size", p, 1, 1 << 16, 1, 0, &ks)) ||
	    (s = get_int(c, sc, "kernel_stride", p, 1, 1 << 16, 1, 0, &st)) ||
	    (s = get_int(c, sc, "block_size", p, 1, 1 << 16, 1, 0, &bs)) ||
	    (s = get_int(c, sc, "topk", p, 1, 1 << 20, 1, 0, &tk)) ||
	    (s = get_int(c, sc, "init_blocks", p, 0, 1 << 20, 1, 0, &ib)) ||
	    (s = get_int(c, sc, "window_size", p, 0, 1 << 30, 1, 0, &ws)) ||
	    (s = get_int(c, sc, "dense_len", p, 0, (int64_t)1 << 40, 1, 0, &dl)))
		return s;
	const cJSON *nope = cJSON_GetObjectItemCaseSensitive(sc, "use_nope");
	if (nope && !cJSON_IsBool(nope))
		return sfw_fail(c->err, SFW_E_FORMAT,
				"%s: field 'sparse_config.use_nope' must be true or false", c->what);
	/* Compression chunks overlap by kernel - stride and tile the blocks. */
	if (st > ks || bs % st != 0)
		return sfw_fail(
		    c->err, SFW_E_UNSUPPORTED,
		    "%s: sparse_config kernel_size %lld / kernel_stride %lld / block_size %lld are not "
		    "consistent (stride <= kernel, block a multiple of stride)",
		    c->what, (long long)ks, (long long)st, (long long)bs);
	if (ws % bs != 0)
		return sfw_fail(c->err, SFW_E_UNSUPPORTED,
				"%s: sparse_config.window_size %lld is not a multiple of block_size %lld",
				c->what, (long long)ws, (long long)bs);
	o->sparse_kernel_size = (int)ks;
	o->sparse_kernel_stride = (int)st;
	o->sparse_block_size = (int)bs;
	o->sparse_topk = (int)tk;
	o->sparse_init_blocks = (int)ib;
	o->sparse_window_size = (int)ws;
	o->sparse_dense_len = dl;
	o->sparse_local_blocks = (int)(ws / bs);
	o->sparse_k = (int)tk + o->sparse_local_blocks;
	return SFW_OK;
}

static enum sfw_status parse_eos(struct ctx *c, struct sfw_config *o)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(c->root, "eos_token_id");
	if (!e)
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: missing field 'eos_token_id'", c->what);
	const cJSON *one = cJSON_IsNumber(e) ? e : NULL;
	if (!one && !cJSON_IsArray(e))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: field 'eos_token_id' must be an integer or a list",
				c->what);
	int n = one ? 1 : cJSON_GetArraySize(e);
	if (n < 1 || n > SFW_MAX_EOS)
		return sfw_fail(c->err, SFW_E_RANGE, "%s: eos_token_id has %d ids (1 to %d allowed)", c->what,
				n, SFW_MAX_EOS);
	o->n_eos = 0;
	for (const cJSON *v = one ? one : e->child; v; v = one ? NULL : v->next) {
		double d = v->valuedouble;
		if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || d < 0 || d >= o->vocab_size)
			return sfw_fail(c->err, SFW_E_RANGE,
					"%s: eos_token_id entries must be token ids below %d", c->what,
					o->vocab_size);
		o->eos_token_ids[o->n_eos++] = (int)d;
	}
	return SFW_OK;
}

static enum sfw_status parse_root(struct ctx *c, struct sfw_config *o)
{
	enum sfw_status s;
	const char *mt;
	if (!cJSON_IsObject(c->root))
		return sfw_fail(c->err, SFW_E_FORMAT, "%s: not a JSON object", c->what);
	if ((s = sfw_json_string(c->root, "model_type", c->what, &mt, c->err)) != SFW_OK)
		return s;
	if (strcmp(mt, "minicpm_sala") != 0)
		return sfw_fail(c->err, SFW_E_UNSUPPORTED,
				"%s: model_type '%.60s' is not supported (want 'minicpm_sala')", c->what, mt);
	if ((s = get_i32(c, "hidden_size", 1, MAX_HIDDEN, &o->hidden_size)) ||
	    (s = get_i32(c, "intermediate_size", 1, MAX_INTER, &o->intermediate_size)) ||
	    (s = get_i32(c, "num_hidden_layers", 1, SFW_MAX_LAYERS, &o->num_hidden_layers)) ||
	    (s = get_i32(c, "num_attention_heads", 1, MAX_HEADS, &o->num_attention_heads)) ||
	    (s = get_i32(c, "num_key_value_heads", 1, MAX_HEADS, &o->num_key_value_heads)) ||
	    (s = get_i32(c, "vocab_size", 1, MAX_VOCAB, &o->vocab_size)))
		return s;
	int64_t v;
	/* head_dim defaults to hidden / heads, as in the reference config class. */
	if ((s = get_int(c, c->root, "head_dim", "", 1, MAX_HEAD_DIM, 0,
			 o->hidden_size / o->num_attention_heads, &v)))
		return s;
	if (v < 1)
		return sfw_fail(c->err, SFW_E_RANGE, "%s: head_dim must be positive", c->what);
	o->head_dim = (int)v;
	if ((s = get_int(c, c->root, "max_position_embeddings", "", 1, (int64_t)1 << 40, 1, 0,
			 &o->max_position_embeddings)) ||
	    (s = get_num(c, "rms_norm_eps", 0, 1, 1, 1, 0, &o->rms_norm_eps)) ||
	    (s = get_num(c, "rope_theta", 0, 1, 1e12, 0, 10000.0, &o->rope_theta)) ||
	    (s = get_num(c, "scale_emb", 0, 1, 1e6, 1, 0, &o->scale_emb)) ||
	    (s = get_num(c, "scale_depth", 0, 1, 1e6, 1, 0, &o->scale_depth)) ||
	    (s = get_num(c, "dim_model_base", 0, 1, 1e9, 1, 0, &o->dim_model_base)))
		return s;
	if ((s = get_int(c, c->root, "bos_token_id", "", 0, o->vocab_size - 1, 0, 1, &v)))
		return s;
	o->bos_token_id = (int)v;
	if ((s = parse_eos(c, o)) || (s = parse_mixers(c, o)) || (s = parse_sparse(c, o)))
		return s;
	if ((s = get_bool(c, "attn_use_rope", 0, &o->attn_use_rope)) ||
	    (s = get_bool(c, "attn_use_output_gate", 1, &o->attn_use_output_gate)) ||
	    (s = get_bool(c, "lightning_use_rope", 1, &o->lightning_use_rope)) ||
	    (s = get_bool(c, "qk_norm", 1, &o->qk_norm)) ||
	    (s = get_bool(c, "use_output_norm", 1, &o->use_output_norm)) ||
	    (s = get_bool(c, "use_output_gate", 1, &o->use_output_gate)))
		return s;
	if ((s = get_i32(c, "lightning_nh", 1, MAX_HEADS, &o->lightning_nh)) ||
	    (s = get_i32(c, "lightning_nkv", 1, MAX_HEADS, &o->lightning_nkv)) ||
	    (s = get_i32(c, "lightning_head_dim", 1, MAX_HEAD_DIM, &o->lightning_head_dim)))
		return s;
	/* Values this engine does not implement (the real model has exactly these). */
	if ((s = want_string(c, "hidden_act", "silu")) ||
	    (s = want_string(c, "lightning_scale", "1/sqrt(d)")) || (s = want_bool(c, "attention_bias", 0)) ||
	    (s = want_bool(c, "tie_word_embeddings", 0)) || (s = want_bool(c, "attn_use_rope", 0)))
		return s;
	const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
	if (rs && !cJSON_IsNull(rs))
		return sfw_fail(c->err, SFW_E_UNSUPPORTED, "%s: rope_scaling is not supported (must be null)",
				c->what);

	/* Shape consistency. */
	if (o->num_attention_heads % o->num_key_value_heads != 0)
		return sfw_fail(c->err, SFW_E_FORMAT,
				"%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
				c->what, o->num_attention_heads, o->num_key_value_heads);
	if ((int64_t)o->num_attention_heads * o->head_dim > MAX_HIDDEN)
		return sfw_fail(c->err, SFW_E_RANGE, "%s: num_attention_heads x head_dim is too large",
				c->what);
	if (o->lightning_nkv != o->lightning_nh)
		return sfw_fail(
		    c->err, SFW_E_UNSUPPORTED,
		    "%s: lightning_nkv %d differs from lightning_nh %d (no GQA in lightning layers)", c->what,
		    o->lightning_nkv, o->lightning_nh);
	/* NeoX RoPE rotates half-dimension pairs: an odd head size has none to pair. */
	if (o->lightning_use_rope && o->lightning_head_dim % 2)
		return sfw_fail(c->err, SFW_E_UNSUPPORTED, "%s: lightning_head_dim %d must be even with lightning_use_rope",
				c->what, o->lightning_head_dim);
	/* o_norm and the z gate work on hidden_size-wide lightning outputs. */
	if ((int64_t)o->lightning_nh * o->lightning_head_dim != o->hidden_size)
		return sfw_fail(c->err, SFW_E_FORMAT,
				"%s: lightning_nh %d x lightning_head_dim %d must equal hidden_size %d",
				c->what, o->lightning_nh, o->lightning_head_dim, o->hidden_size);

	o->residual_scale = o->scale_depth / sqrt((double)o->num_hidden_layers);
	o->logit_divisor = (double)o->hidden_size / o->dim_model_base;
	return SFW_OK;
}

enum sfw_status sfw_config_parse(const char *bytes, size_t len, const char *what, struct sfw_config *out,
				 struct sfw_err *err)
{
	char label[300];
	snprintf(label, sizeof(label), "'%s'", what ? what : "config.json");
	cJSON *root = NULL;
	enum sfw_status s = sfw_json_parse(bytes, len, label, &root, err);
	if (s != SFW_OK)
		return s;
	struct sfw_config o;
	memset(&o, 0, sizeof(o));
	struct ctx c = {root, label, err};
	s = parse_root(&c, &o);
	cJSON_Delete(root);
	if (s == SFW_OK)
		*out = o;
	return s;
}

enum sfw_status sfw_config_load(const char *model_dir, struct sfw_config *out, struct sfw_err *err)
{
	char *path = sfw_path_join(model_dir, "config.json");
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(path, CONFIG_MAX, &b, err);
	if (s == SFW_OK) {
		s = sfw_config_parse(b.data, b.len, path, out, err);
		sfw_buf_release(&b);
	}
	sfw_free(path);
	return s;
}

/* slope i of the ALiBi list for n heads (the reference's get_slopes):
 * powers of two: start * start^i with start = 2^(-2^-(log2 n - 3));
 * otherwise the list for the power of two below, then every other slope of
 * the list for twice that. */
static double alibi_slope(int n, int i)
{
	double l = log2((double)n);
	if (l == floor(l)) {
		double start = pow(2.0, -pow(2.0, -(l - 3)));
		return start * pow(start, (double)i);
	}
	int c = 1 << (int)floor(l);
	if (i < c)
		return alibi_slope(c, i);
	return alibi_slope(2 * c, 2 * (i - c));
}

float sfw_config_lightning_slope(int nh, int h)
{
	SFW_ASSERT(nh >= 1 && nh <= MAX_HEADS && h >= 0 && h < nh);
	return (float)alibi_slope(nh, h);
}
