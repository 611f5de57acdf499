/* mkmodel.c - random-weight SALA model directories, streamed shard by shard. */
#include "tools/tools.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "num/w8_layout.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_ELEMS ((size_t)16 << 20) /* 32 MiB of bf16 per write */
#define GRAIN_ELEMS ((size_t)1 << 16)

struct preset {
	const char *name;
	int hidden, inter, layers, heads, kv, head_dim, vocab, lnh, lhd, dim_model_base;
	long long max_pos;
	int topk, window, dense_len;
	const char *mixers; /* one letter per layer: S minicpm4, L lightning */
	uint64_t shard_bytes;
	int tok_pieces;
};

static const struct preset presets[] = {
    [SFW_MKMODEL_TINY] = {"tiny", 256, 640, 6, 8, 2, 32, 1024, 8, 32, 64, 4096, 4, 128, 512, "SLLSLS",
			  6u << 20, 1000},
    [SFW_MKMODEL_SMALL] = {"small", 1024, 2816, 8, 16, 2, 64, 16384, 16, 64, 64, 32768, 64, 2048, 8192,
			   "SLLLLSLL", 128u << 20, 4000},
    [SFW_MKMODEL_FULL] = {"full", 4096, 16384, 32, 32, 2, 128, 73448, 32, 128, 256, 524288, 64, 2048, 8192,
			  "SLLLLLLLLSLLLLLLSSLLLLSLLLLLLSSS", 5000000000u, 4000},
    [SFW_MKMODEL_WIDE4] = {"wide4", 4096, 16384, 4, 32, 2, 128, 73448, 32, 128, 256, 524288, 64, 2048, 8192,
			   "SLLS", 2000000000u, 4000},
};

int sfw_mkmodel_preset_parse(const char *name, enum sfw_mkmodel_preset *out)
{
	for (int i = 0; i < (int)(sizeof(presets) / sizeof(presets[0])); i++)
		if (name && strcmp(name, presets[i].name) == 0) {
			*out = (enum sfw_mkmodel_preset)i;
			return 1;
		}
	return 0;
}

void sfw_mkmodel_shard_name(char *buf, size_t cap, int shard, int n_shards)
{
	snprintf(buf, cap, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

/* ------------------------------------------------------------ weights */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t tensor_key(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ULL;
	return mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ h);
}

/* Box-Muller pair k of a tensor: two independent N(0,1). */
static inline void normal_pair(uint64_t key, uint64_t k, double *z0, double *z1)
{
	uint64_t h = mix64(key + (k + 1) * 0x9e3779b97f4a7c15ULL);
	double u1 = ((double)(h >> 32) + 1.0) * (1.0 / 4294967296.0); /* (0, 1] */
	double u2 = (double)(h & 0xffffffffu) * (1.0 / 4294967296.0); /* [0, 1) */
	double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
	*z0 = r * cos(a);
	*z1 = r * sin(a);
}

static inline float weight_of(double z, int is_norm)
{
	return is_norm ? (float)(1.0 + 0.1 * z) : (float)(0.02 * z);
}

float sfw_mkmodel_weight(uint64_t seed, const char *name, int is_norm, uint64_t e)
{
	double z0, z1;
	normal_pair(tensor_key(seed, name), e / 2, &z0, &z1);
	return weight_of(e & 1 ? z1 : z0, is_norm);
}

struct fill_ctx {
	uint16_t *out;
	uint64_t key;
	uint64_t first; /* element index of out[0] in the tensor (even) */
	size_t n;
	int is_norm;
	int kind; /* SFW_MKT_BF16, _W8_PACKED (random bytes), _W8_SCALE */
};

static void fill_range(void *vctx, size_t begin, size_t end, int tid)
{
	(void)tid;
	const struct fill_ctx *c = vctx;
	size_t lo = begin * GRAIN_ELEMS, hi = end * GRAIN_ELEMS;
	if (hi > c->n)
		hi = c->n;
	if (c->kind == SFW_MKT_W8_PACKED) { /* two uniform code bytes per slot (every preset width is a
					     * multiple of 4: no pad bytes, which must be 0) */
		for (size_t i = lo; i < hi; i++)
			c->out[i] = (uint16_t)(mix64(c->key + (c->first + i + 1) * 0x9e3779b97f4a7c15ULL) >> 48);
		return;
	}
	for (size_t i = lo; i < hi; i += 2) {
		double z0, z1;
		if (c->kind == SFW_MKT_W8_SCALE) {
			normal_pair(c->key, (c->first + i) / 2, &z0, &z1);
			c->out[i] = sfw_f32_to_bf16((float)(2.7e-4 * (1.0 + 0.1 * z0)));
			if (i + 1 < hi)
				c->out[i + 1] = sfw_f32_to_bf16((float)(2.7e-4 * (1.0 + 0.1 * z1)));
			continue;
		}
		normal_pair(c->key, (c->first + i) / 2, &z0, &z1);
		c->out[i] = sfw_f32_to_bf16(weight_of(z0, c->is_norm));
		if (i + 1 < hi)
			c->out[i + 1] = sfw_f32_to_bf16(weight_of(z1, c->is_norm));
	}
}

/* ------------------------------------------------------------ plan */

static enum sfw_status config_text(const struct preset *pr, const struct sfw_mkmodel_params *p, struct sfw_buf *b)
{
	int V = pr->vocab;
	enum sfw_status s = sfw_buf_printf(
	    b,
	    "{\n"
	    "  \"architectures\": [\n    \"MiniCPMSALAForCausalLM\"\n  ],\n"
	    "  \"attention_bias\": false,\n"
	    "  \"attention_dropout\": 0.0,\n"
	    "  \"attn_use_output_gate\": true,\n"
	    "  \"attn_use_rope\": false,\n"
	    "  \"auto_map\": {\n"
	    "    \"AutoConfig\": \"configuration_minicpm_sala.MiniCPMSALAConfig\",\n"
	    "    \"AutoModel\": \"modeling_minicpm_sala.MiniCPMSALAModel\",\n"
	    "    \"AutoModelForCausalLM\": \"modeling_minicpm_sala.MiniCPMSALAForCausalLM\",\n"
	    "    \"AutoModelForSeq2SeqLM\": \"modeling_minicpm_sala.MiniCPMSALAForCausalLM\",\n"
	    "    \"AutoModelForSequenceClassification\": "
	    "\"modeling_minicpm_sala.MiniCPMSALAForSequenceClassification\"\n"
	    "  },\n"
	    "  \"bos_token_id\": 1,\n"
	    "  \"dim_model_base\": %d,\n"
	    "  \"eos_token_id\": [\n    2,\n    %d\n  ],\n"
	    "  \"head_dim\": %d,\n"
	    "  \"hidden_act\": \"silu\",\n"
	    "  \"hidden_size\": %d,\n"
	    "  \"initializer_range\": 0.1,\n"
	    "  \"intermediate_size\": %d,\n"
	    "  \"lightning_head_dim\": %d,\n"
	    "  \"lightning_nh\": %d,\n"
	    "  \"lightning_nkv\": %d,\n"
	    "  \"lightning_scale\": \"1/sqrt(d)\",\n"
	    "  \"lightning_use_rope\": true,\n"
	    "  \"max_position_embeddings\": %lld,\n"
	    "  \"mixer_types\": [\n",
	    pr->dim_model_base, V - 8, pr->head_dim, pr->hidden, pr->inter, pr->lhd, pr->lnh, pr->lnh,
	    pr->max_pos);
	for (int i = 0; s == SFW_OK && i < pr->layers; i++)
		s = sfw_buf_printf(b, "    \"%s\"%s\n", pr->mixers[i] == 'S' ? "minicpm4" : "lightning-attn",
				   i + 1 < pr->layers ? "," : "");
	/* int8: quantization_config as salafw quant writes it (num/w8_layout.h) */
	char qcfg[1024] = "", gs[16];
	if (p->w8) {
		if (p->w8_group > 0)
			snprintf(gs, sizeof(gs), "%d", p->w8_group);
		else
			snprintf(gs, sizeof(gs), "null");
		snprintf(qcfg, sizeof(qcfg),
			 "  \"quantization_config\": {\n"
			 "    \"config_groups\": {\"group_0\": {\"format\": \"pack-quantized\", \"input_activations\": null, "
			 "\"output_activations\": null, \"targets\": [\"Linear\"], \"weights\": {\"actorder\": null, "
			 "\"block_structure\": null, \"dynamic\": false, \"group_size\": %s, \"num_bits\": 8, "
			 "\"observer\": \"minmax\", \"observer_kwargs\": {}, \"strategy\": \"%s\", \"symmetric\": true, "
			 "\"type\": \"int\"}}},\n"
			 "    \"format\": \"pack-quantized\", \"global_compression_ratio\": null, \"ignore\": [\"lm_head\"], "
			 "\"kv_cache_scheme\": null, \"quant_method\": \"compressed-tensors\", "
			 "\"quantization_status\": \"compressed\", \"sparsity_config\": {}, \"transform_config\": {}, "
			 "\"version\": \"%s\"\n"
			 "  },\n",
			 gs, p->w8_group > 0 ? "group" : "channel", SFW_QL_CT_VERSION);
	}
	if (s == SFW_OK)
		s = sfw_buf_printf(b,
				   "  ],\n"
				   "  \"model_type\": \"minicpm_sala\",\n"
				   "  \"mup_denominator\": 32,\n"
				   "  \"num_attention_heads\": %d,\n"
				   "  \"num_hidden_layers\": %d,\n"
				   "  \"num_key_value_heads\": %d,\n"
				   "  \"pad_token_id\": 2,\n"
				   "  \"pretraining_tp\": 1,\n"
				   "%s"
				   "  \"qk_norm\": true,\n"
				   "  \"rms_norm_eps\": 1e-06,\n"
				   "  \"rope_scaling\": null,\n"
				   "  \"rope_theta\": 10000.0,\n"
				   "  \"scale_depth\": 1.4,\n"
				   "  \"scale_emb\": 12,\n"
				   "  \"shift_labels\": true,\n"
				   "  \"sparse_config\": {\n"
				   "    \"kernel_size\": 32,\n"
				   "    \"kernel_stride\": 16,\n"
				   "    \"block_size\": 64,\n"
				   "    \"topk\": %d,\n"
				   "    \"init_blocks\": 1,\n"
				   "    \"window_size\": %d,\n"
				   "    \"dense_len\": %d,\n"
				   "    \"use_nope\": false\n"
				   "  },\n"
				   "  \"tie_word_embeddings\": false,\n"
				   "  \"torch_dtype\": \"bfloat16\",\n"
				   "  \"transformers_version\": \"4.57.1\",\n"
				   "  \"use_cache\": true,\n"
				   "  \"use_output_gate\": true,\n"
				   "  \"use_output_norm\": true,\n"
				   "  \"vocab_size\": %d\n"
				   "}\n",
				   pr->heads, pr->layers, pr->kv, qcfg, pr->topk, pr->window, pr->dense_len, V);
	return s;
}

static uint64_t tensor_elem_bytes(const struct sfw_mkmodel_tensor *t)
{
	return t->kind == SFW_MKT_W8_PACKED ? 4 : t->kind == SFW_MKT_W8_SHAPE ? 8 : 2;
}

static const enum sfw_dtype kind_dtype[] = {SFW_DTYPE_BF16, SFW_DTYPE_I32, SFW_DTYPE_BF16, SFW_DTYPE_I64};

static int add_tensor(struct sfw_mkmodel_plan *pl, size_t cap, int is_norm, uint64_t d0, uint64_t d1,
		      const char *fmt, int layer)
{
	if (pl->n_tensors >= cap)
		return 0;
	struct sfw_mkmodel_tensor *t = &pl->tensors[pl->n_tensors++];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), fmt, layer);
	t->is_norm = is_norm;
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1;
	return 1;
}

void sfw_mkmodel_plan_free(struct sfw_mkmodel_plan *pl)
{
	if (!pl)
		return;
	sfw_free(pl->config_json);
	sfw_free(pl->tensors);
	memset(pl, 0, sizeof(*pl));
}

enum sfw_status sfw_mkmodel_plan(const struct sfw_mkmodel_params *p, struct sfw_mkmodel_plan *out,
				 struct sfw_err *err)
{
	memset(out, 0, sizeof(*out));
	if ((unsigned)p->preset >= sizeof(presets) / sizeof(presets[0]))
		return sfw_fail(err, SFW_E_INVAL, "unknown mkmodel preset %d", (int)p->preset);
	const struct preset *pr = &presets[p->preset];
	if (p->w8 && p->w8_group != 32 && p->w8_group != 64 && p->w8_group != 128 &&
	    p->w8_group != SFW_QL_GROUP_CHANNEL)
		return sfw_fail(err, SFW_E_INVAL, "int8 group size %d (32, 64, 128 or channel)", p->w8_group);
	struct sfw_buf b;
	sfw_buf_init(&b, 1 << 20);
	enum sfw_status s = config_text(pr, p, &b);
	if (s != SFW_OK) {
		sfw_buf_release(&b);
		return sfw_fail(err, s, "out of memory");
	}
	out->config_json = sfw_buf_take(&b, &out->config_json_len);
	/* The generator's own config goes through the strict parser. */
	s = sfw_config_parse(out->config_json, out->config_json_len, "generated config.json", &out->config,
			     err);
	if (s != SFW_OK) {
		sfw_mkmodel_plan_free(out);
		return s;
	}
	const struct sfw_config *c = &out->config;
	size_t cap = 3 + 13 * 3 * (size_t)c->num_hidden_layers;
	out->tensors = sfw_calloc(cap, sizeof(*out->tensors));
	if (!out->tensors) {
		sfw_mkmodel_plan_free(out);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	uint64_t D = (uint64_t)c->hidden_size, I = (uint64_t)c->intermediate_size,
		 V = (uint64_t)c->vocab_size;
	uint64_t qd = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
	uint64_t kvd = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
	uint64_t ld = (uint64_t)c->lightning_nh * (uint64_t)c->lightning_head_dim;
	int ok = add_tensor(out, cap, 0, V, D, "model.embed_tokens.weight", 0);
	for (int i = 0; i < c->num_hidden_layers; i++) {
		ok &= add_tensor(out, cap, 1, D, 0, "model.layers.%d.input_layernorm.weight", i);
		if (c->mixer[i] == SFW_MIXER_SPARSE) {
			ok &= add_tensor(out, cap, 0, qd, D, "model.layers.%d.self_attn.q_proj.weight", i);
			ok &= add_tensor(out, cap, 0, kvd, D, "model.layers.%d.self_attn.k_proj.weight", i);
			ok &= add_tensor(out, cap, 0, kvd, D, "model.layers.%d.self_attn.v_proj.weight", i);
			ok &= add_tensor(out, cap, 0, D, qd, "model.layers.%d.self_attn.o_proj.weight", i);
			ok &= add_tensor(out, cap, 0, qd, D, "model.layers.%d.self_attn.o_gate.weight", i);
		} else {
			ok &= add_tensor(out, cap, 0, ld, D, "model.layers.%d.self_attn.q_proj.weight", i);
			ok &= add_tensor(out, cap, 0, ld, D, "model.layers.%d.self_attn.k_proj.weight", i);
			ok &= add_tensor(out, cap, 0, ld, D, "model.layers.%d.self_attn.v_proj.weight", i);
			ok &= add_tensor(out, cap, 0, D, ld, "model.layers.%d.self_attn.o_proj.weight", i);
			ok &= add_tensor(out, cap, 0, ld, D, "model.layers.%d.self_attn.z_proj.weight", i);
			ok &= add_tensor(out, cap, 1, (uint64_t)c->lightning_head_dim, 0,
					 "model.layers.%d.self_attn.q_norm.weight", i);
			ok &= add_tensor(out, cap, 1, (uint64_t)c->lightning_head_dim, 0,
					 "model.layers.%d.self_attn.k_norm.weight", i);
			ok &= add_tensor(out, cap, 1, ld, 0, "model.layers.%d.self_attn.o_norm.weight", i);
		}
		ok &= add_tensor(out, cap, 1, D, 0, "model.layers.%d.post_attention_layernorm.weight", i);
		ok &= add_tensor(out, cap, 0, I, D, "model.layers.%d.mlp.gate_proj.weight", i);
		ok &= add_tensor(out, cap, 0, I, D, "model.layers.%d.mlp.up_proj.weight", i);
		ok &= add_tensor(out, cap, 0, D, I, "model.layers.%d.mlp.down_proj.weight", i);
	}
	ok &= add_tensor(out, cap, 1, D, 0, "model.norm.weight", 0);
	ok &= add_tensor(out, cap, 0, V, D, "lm_head.weight", 0);
	SFW_ASSERT(ok);
	if (p->w8) { /* each decoder linear becomes weight_packed, weight_scale, weight_shape */
		size_t n0 = out->n_tensors;
		struct sfw_mkmodel_tensor *old = sfw_calloc(n0, sizeof(*old));
		if (!old) {
			sfw_mkmodel_plan_free(out);
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		}
		memcpy(old, out->tensors, n0 * sizeof(*old));
		out->n_tensors = 0;
		for (size_t i = 0; i < n0; i++) {
			size_t pl;
			if (!sfw_ql_is_quantized(old[i].name, &pl)) {
				out->tensors[out->n_tensors++] = old[i];
				continue;
			}
			uint64_t N = old[i].shape[0], K = old[i].shape[1];
			static const char *const suf[3] = {"weight_packed", "weight_scale", "weight_shape"};
			for (int k = 0; k < 3; k++) {
				struct sfw_mkmodel_tensor *t = &out->tensors[out->n_tensors++];
				memset(t, 0, sizeof(*t));
				snprintf(t->name, sizeof(t->name), "%.*s.%s", (int)pl, old[i].name, suf[k]);
				t->kind = SFW_MKT_W8_PACKED + k;
				t->ndim = k == 2 ? 1 : 2;
				t->shape[0] = k == 2 ? 2 : N;
				t->shape[1] = k == 0 ? (uint64_t)sfw_ql_words((int64_t)K)
					      : k == 1 ? (uint64_t)sfw_ql_ngroups((int64_t)K, p->w8_group)
						       : 0;
				/* weight_shape's values ride in shape-independent fields */
				if (k == 2)
					t->w8_n = N, t->w8_k = K;
			}
		}
		sfw_free(old);
	}
	/* Greedy sharding: a new shard when the next tensor would pass the limit. */
	uint64_t limit = p->shard_bytes ? p->shard_bytes : pr->shard_bytes, in_shard = 0;
	int shard = 0;
	for (size_t i = 0; i < out->n_tensors; i++) {
		struct sfw_mkmodel_tensor *t = &out->tensors[i];
		uint64_t n = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1), bytes = n * tensor_elem_bytes(t);
		if (in_shard > 0 && in_shard + bytes > limit) {
			shard++;
			in_shard = 0;
		}
		t->shard = shard;
		in_shard += bytes;
		out->n_params += t->kind == SFW_MKT_BF16 ? n : t->kind == SFW_MKT_W8_PACKED ? 4 * n : 0;
		out->n_bytes += bytes;
	}
	out->n_shards = shard + 1;
	return SFW_OK;
}

/* ------------------------------------------------------------ writing */

static enum sfw_status write_shard(const char *dir, const struct sfw_mkmodel_plan *pl, int shard,
				   const struct sfw_mkmodel_params *p, uint16_t *buf, uint64_t *done,
				   struct sfw_err *err)
{
	char name[64];
	sfw_mkmodel_shard_name(name, sizeof(name), shard, pl->n_shards);
	char *path = sfw_path_join(dir, name);
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_st_writer *w = NULL;
	enum sfw_status s = sfw_st_writer_new(path, &w, err);
	if (s == SFW_OK)
		s = sfw_st_writer_meta(w, "format", "pt", err);
	for (size_t i = 0; s == SFW_OK && i < pl->n_tensors; i++)
		if (pl->tensors[i].shard == shard)
			s = sfw_st_writer_declare(w, pl->tensors[i].name, kind_dtype[pl->tensors[i].kind],
						  pl->tensors[i].ndim, pl->tensors[i].shape, err);
	int nthreads = p->nthreads > 0 ? p->nthreads : sfw_default_threads();
	for (size_t i = 0; s == SFW_OK && i < pl->n_tensors; i++) {
		const struct sfw_mkmodel_tensor *t = &pl->tensors[i];
		if (t->shard != shard)
			continue;
		uint64_t n = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
		if (t->kind == SFW_MKT_W8_SHAPE) {
			int64_t sh[2] = {(int64_t)t->w8_n, (int64_t)t->w8_k};
			s = sfw_st_writer_write(w, sh, sizeof(sh), err);
			*done += sizeof(sh);
			continue;
		}
		/* int8 codes: 2 random bytes per bf16-sized slot (n words = 2n slots) */
		uint64_t slots = t->kind == SFW_MKT_W8_PACKED ? 2 * n : n;
		struct fill_ctx c = {buf, tensor_key(p->seed, t->name), 0, 0, t->is_norm, t->kind};
		for (uint64_t at = 0; s == SFW_OK && at < slots; at += CHUNK_ELEMS) {
			c.first = at;
			c.n = (size_t)(slots - at < CHUNK_ELEMS ? slots - at : CHUNK_ELEMS);
			sfw_parallel_for(nthreads, (c.n + GRAIN_ELEMS - 1) / GRAIN_ELEMS, 1, fill_range, &c);
			s = sfw_st_writer_write(w, buf, c.n * 2, err);
			*done += c.n * 2;
			if (s == SFW_OK && p->progress)
				p->progress(p->progress_user, *done, pl->n_bytes);
		}
	}
	if (s == SFW_OK)
		s = sfw_st_writer_commit(w, err);
	sfw_st_writer_free(w);
	sfw_free(path);
	return s;
}

static enum sfw_status write_text(const char *dir, const char *name, const char *text, size_t len,
				  struct sfw_err *err)
{
	char *path = sfw_path_join(dir, name);
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status s = sfw_write_file_atomic(path, text, len, err);
	sfw_free(path);
	return s;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(const struct sfw_mkmodel_tensor *const *)a)->name,
		      (*(const struct sfw_mkmodel_tensor *const *)b)->name);
}

static enum sfw_status write_index(const char *dir, const struct sfw_mkmodel_plan *pl, struct sfw_err *err)
{
	const struct sfw_mkmodel_tensor **sorted = sfw_calloc(pl->n_tensors, sizeof(*sorted));
	if (!sorted)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < pl->n_tensors; i++)
		sorted[i] = &pl->tensors[i];
	qsort(sorted, pl->n_tensors, sizeof(*sorted), cmp_tensor_name);
	struct sfw_buf b;
	sfw_buf_init(&b, 16u << 20);
	enum sfw_status s = sfw_buf_printf(&b,
					   "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n"
					   "  \"weight_map\": {\n",
					   (unsigned long long)pl->n_bytes);
	for (size_t i = 0; s == SFW_OK && i < pl->n_tensors; i++) {
		char shard[64];
		sfw_mkmodel_shard_name(shard, sizeof(shard), sorted[i]->shard, pl->n_shards);
		s = sfw_buf_printf(&b, "    \"%s\": \"%s\"%s\n", sorted[i]->name, shard,
				   i + 1 < pl->n_tensors ? "," : "");
	}
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "  }\n}\n");
	sfw_free(sorted);
	if (s != SFW_OK) {
		sfw_buf_release(&b);
		return sfw_fail(err, s, "out of memory");
	}
	s = write_text(dir, "model.safetensors.index.json", b.data, b.len, err);
	sfw_buf_release(&b);
	return s;
}

static enum sfw_status write_generation_config(const char *dir, const struct sfw_config *c,
					       struct sfw_err *err)
{
	char text[512];
	int n = snprintf(
	    text, sizeof(text),
	    "{\n  \"bos_token_id\": %d,\n  \"do_sample\": true,\n  \"eos_token_id\": [\n    %d,\n    %d\n"
	    "  ],\n  \"pad_token_id\": 2,\n  \"temperature\": 0.9,\n"
	    "  \"transformers_version\": \"4.57.1\"\n}\n",
	    c->bos_token_id, c->eos_token_ids[0], c->eos_token_ids[1]);
	return write_text(dir, "generation_config.json", text, (size_t)n, err);
}

static int exists_in(const char *dir, const char *name)
{
	char *path = sfw_path_join(dir, name);
	struct stat st;
	int r = path && lstat(path, &st) == 0;
	sfw_free(path);
	return r;
}

/* Old shards that the new index does not name (after --force). */
static void remove_stale(const char *dir, const struct sfw_mkmodel_plan *pl)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		int shard_like = strncmp(e->d_name, "model-", 6) == 0 && n > 12 &&
				 strcmp(e->d_name + n - 12, ".safetensors") == 0;
		if (!shard_like && strcmp(e->d_name, "model.safetensors") != 0)
			continue;
		int ours = 0;
		for (int i = 0; i < pl->n_shards && !ours; i++) {
			char name[64];
			sfw_mkmodel_shard_name(name, sizeof(name), i, pl->n_shards);
			ours = strcmp(name, e->d_name) == 0;
		}
		if (!ours) {
			char *path = sfw_path_join(dir, e->d_name);
			if (path)
				unlink(path);
			sfw_free(path);
		}
	}
	closedir(d);
}

enum sfw_status sfw_mkmodel(const char *out_dir, const struct sfw_mkmodel_params *p, struct sfw_err *err)
{
	struct stat st;
	if (!out_dir || !*out_dir)
		return sfw_fail(err, SFW_E_INVAL, "no output directory given");
	if (stat(out_dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			return sfw_fail(err, SFW_E_IO, "'%s' exists and is not a directory", out_dir);
		static const char *const model_files[] = {"config.json", "model.safetensors.index.json",
							  "model.safetensors"};
		for (size_t i = 0; i < 3 && !p->force; i++)
			if (exists_in(out_dir, model_files[i]))
				return sfw_fail(
				    err, SFW_E_EXISTS,
				    "'%s' already holds a model ('%s'); use --force to overwrite it", out_dir,
				    model_files[i]);
	}
	struct sfw_mkmodel_plan pl;
	enum sfw_status s = sfw_mkmodel_plan(p, &pl, err);
	if (s != SFW_OK)
		return s;
	s = sfw_mkdirs(out_dir, err);
	/* Probe writability before spending minutes on weights. */
	if (s == SFW_OK && access(out_dir, W_OK | X_OK) != 0)
		s = sfw_fail(err, SFW_E_IO, "cannot write into '%s': %s", out_dir, strerror(errno));
	/* Remove config.json first: a model directory is complete when it exists. */
	if (s == SFW_OK && p->force && exists_in(out_dir, "config.json")) {
		char *cfg = sfw_path_join(out_dir, "config.json");
		if (!cfg || unlink(cfg) != 0)
			s = sfw_fail(err, SFW_E_IO, "cannot remove the old config.json in '%s'", out_dir);
		sfw_free(cfg);
	}
	uint16_t *buf = NULL;
	if (s == SFW_OK && !(buf = sfw_malloc(CHUNK_ELEMS * sizeof(uint16_t))))
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the weight buffer");
	uint64_t done = 0;
	for (int i = 0; s == SFW_OK && i < pl.n_shards; i++)
		s = write_shard(out_dir, &pl, i, p, buf, &done, err);
	sfw_free(buf);
	if (s == SFW_OK && !p->no_tokenizer) {
		const struct preset *pr = &presets[p->preset];
		int pieces =
		    pl.config.vocab_size - 8 < pr->tok_pieces ? pl.config.vocab_size - 8 : pr->tok_pieces;
		char *tok = sfw_path_join(out_dir, "tokenizer.model");
		if (!tok)
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		else
			s = sfw_tokenizer_train(NULL, pieces, tok, err);
		sfw_free(tok);
		if (s == SFW_OK)
			s = sfw_tokenizer_write_config(out_dir, pl.config.vocab_size, err);
	}
	if (s == SFW_OK)
		s = write_generation_config(out_dir, &pl.config, err);
	if (s == SFW_OK)
		s = write_index(out_dir, &pl, err);
	if (s == SFW_OK && p->force)
		remove_stale(out_dir, &pl);
	if (s == SFW_OK)
		s = write_text(out_dir, "config.json", pl.config_json, pl.config_json_len, err);
	sfw_mkmodel_plan_free(&pl);
	return s;
}
