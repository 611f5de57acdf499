/* quant.c - sfw_quant_run: the streaming writer of the quantized model.
 *
 * Plan first (every output tensor's name, dtype, shape and shard, from the
 * input headers alone), then write shard by shard: each shard declares its
 * tensors largest element type first (I64 shapes, I32 codes, F32, BF16
 * scales and copies, ...) so every tensor stays aligned without gaps, and
 * each tensor is produced from the read-only map in chunks of rows. A linear's
 * codes and scales come from the same reference quantizer run twice (once per
 * tensor), which keeps memory at one chunk instead of a shard's scales. */
#include "quant/quant_int.h"
#include "alloc.h"
#include "checked.h"
#include "file.h"
#include "formats/safetensors.h"
#include "json.h"
#include "log.h"
#include "runner/runner.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHARD_DEFAULT 5000000000ull
#define CHUNK_BYTES (16u << 20) /* output bytes produced per chunk */
#define COPY_MAX (256u << 20)   /* largest side file (tokenizer.json ...) copied */
#define INDEX_NAME "model.safetensors.index.json"

struct sfw_quant_params sfw_quant_default_params(void)
{
	struct sfw_quant_params p;
	memset(&p, 0, sizeof(p));
	p.group_size = SFW_QL_GROUP_DEFAULT;
	p.method = SFW_QUANT_AWQ;
	p.samples = 0; /* as many as the text fills (quant.h) */
	p.seq_len = 512;
	p.loss_rows = 256;
	p.n_grid = 20;
	p.duo_scaling = 1;
	p.device = SFW_DEVICE_CPU;
	return p;
}

enum part { P_COPY, P_PACKED, P_SCALE, P_SHAPE };

struct entry {
	char *name;
	enum sfw_dtype dtype;
	int ndim;
	uint64_t shape[SFW_ST_MAX_DIMS];
	uint64_t nbytes;
	const struct sfw_tensor_info *src;
	enum part part;
	const float *col, *div; /* AWQ fold (quant_int.h) */
	int shard;
};

struct plan {
	struct entry *e;
	size_t n, cap;
	int n_shards;
	uint64_t total;
};

static void plan_free(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++)
		sfw_free(p->e[i].name);
	sfw_free(p->e);
	memset(p, 0, sizeof(*p));
}

static enum sfw_status plan_add(struct plan *p, const char *name, const char *suffix, enum sfw_dtype dt, int ndim,
				const uint64_t *shape, const struct sfw_tensor_info *src, enum part part,
				struct sfw_err *err)
{
	if (p->n == p->cap) {
		size_t nc = p->cap ? 2 * p->cap : 64;
		struct entry *g = sfw_realloc(p->e, nc * sizeof(*g));
		if (!g)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		p->e = g;
		p->cap = nc;
	}
	struct entry *e = &p->e[p->n];
	memset(e, 0, sizeof(*e));
	size_t ln = strlen(name), ls = suffix ? strlen(suffix) : 0;
	if (!(e->name = sfw_malloc(ln + ls + 1)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	memcpy(e->name, name, ln);
	if (ls)
		memcpy(e->name + ln, suffix, ls);
	e->name[ln + ls] = 0;
	e->dtype = dt;
	e->ndim = ndim;
	e->nbytes = sfw_dtype_size(dt);
	for (int i = 0; i < ndim; i++) {
		e->shape[i] = shape[i];
		if (!sfw_mul_ok(e->nbytes, shape[i], &e->nbytes))
			return sfw_fail(err, SFW_E_RANGE, "tensor '%s' is too large", e->name);
	}
	e->src = src;
	e->part = part;
	p->n++;
	return SFW_OK;
}

static int is_float(enum sfw_dtype t)
{
	return t == SFW_DTYPE_BF16 || t == SFW_DTYPE_F16 || t == SFW_DTYPE_F32;
}

static float elem(const struct sfw_tensor_info *t, uint64_t i)
{
	switch (t->dtype) {
	case SFW_DTYPE_BF16:
		return sfw_bf16_to_f32(((const uint16_t *)t->data)[i]);
	case SFW_DTYPE_F16:
		return sfw_f16_to_f32(((const uint16_t *)t->data)[i]);
	default:
		return ((const float *)t->data)[i];
	}
}

/* Row r of a [rows, K] tensor (1-D: rows = 1) as float, with the fold. */
static void src_row(const struct entry *e, int64_t r, int64_t K, float *out)
{
	const struct sfw_tensor_info *t = e->src;
	int vec = t->ndim == 1;
	uint64_t base = (uint64_t)r * (uint64_t)K;
	for (int64_t k = 0; k < K; k++) {
		float v = elem(t, base + (uint64_t)k);
		if (e->col)
			v *= e->col[k];
		if (e->div)
			v /= vec ? e->div[k] : e->div[r];
		out[k] = v;
	}
}

/* ---- producing one tensor's bytes --------------------------------------- */

struct rows_job {
	const struct entry *e;
	int64_t r0, K;
	int group;
	enum part part;
	unsigned char *out;  /* rows of the chunk, in the entry's output layout */
	float **rowbuf;      /* per thread K floats */
	uint8_t **codebuf;   /* per thread row_bytes (P_SCALE) */
	uint16_t **scalebuf; /* per thread ngroups (P_PACKED) */
	int bad;
};

static void rows_fn(void *ctx, size_t b, size_t e_, int tid)
{
	struct rows_job *j = ctx;
	const struct entry *e = j->e;
	int64_t K = j->K, G = sfw_ql_ngroups(K, j->group), rb = sfw_ql_row_bytes(K);
	for (size_t i = b; i < e_; i++) {
		int64_t r = j->r0 + (int64_t)i;
		float *w = j->rowbuf[tid];
		src_row(e, r, K, w);
		if (j->part == P_PACKED) {
			if (sfw_quant_row_w8_ref(w, K, j->group, j->out + i * (size_t)rb, j->scalebuf[tid]) != 0)
				__atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
		} else if (j->part == P_SCALE) {
			if (sfw_quant_row_w8_ref(w, K, j->group, j->codebuf[tid], (uint16_t *)j->out + i * (size_t)G) != 0)
				__atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
		} else { /* converted copy */
			if (e->dtype == SFW_DTYPE_F32) {
				memcpy(j->out + i * (size_t)K * 4, w, (size_t)K * 4);
			} else {
				uint16_t *o = (uint16_t *)j->out + i * (size_t)K;
				for (int64_t k = 0; k < K; k++)
					o[k] = sfw_f32_to_bf16(w[k]);
			}
		}
	}
}

struct writer_ctx {
	const struct sfw_quant_params *p;
	const char *in_dir; /* for error messages */
	int nt;
	float **rowbuf;
	uint8_t **codebuf;
	uint16_t **scalebuf;
	int64_t maxK;
	unsigned char *chunk;
	size_t chunk_cap;
};

static enum sfw_status produce(struct writer_ctx *c, struct sfw_st_writer *w, const struct entry *e,
			       struct sfw_err *err)
{
	const struct sfw_tensor_info *t = e->src;
	enum sfw_status s;
	if (e->part == P_SHAPE) {
		int64_t sh[2] = {(int64_t)t->shape[0], (int64_t)t->shape[1]};
		return sfw_st_writer_write(w, sh, sizeof(sh), err);
	}
	int converted = e->part != P_COPY || e->col || e->div || e->dtype != t->dtype;
	if (!converted) { /* byte copy straight from the map */
		const unsigned char *d = t->data;
		for (uint64_t off = 0; off < t->nbytes; off += CHUNK_BYTES) {
			size_t n = t->nbytes - off < CHUNK_BYTES ? (size_t)(t->nbytes - off) : CHUNK_BYTES;
			if ((s = sfw_st_writer_write(w, d + off, n, err)) != SFW_OK)
				return s;
		}
		return SFW_OK;
	}
	int64_t rows = t->ndim == 1 ? 1 : (int64_t)t->shape[0];
	int64_t K = t->ndim == 1 ? (int64_t)t->shape[0] : (int64_t)t->shape[1];
	if (t->ndim > 2 || K > c->maxK)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s': tensor '%s': unexpected shape for a folded copy",
				c->in_dir, t->name);
	size_t out_row = e->part == P_PACKED  ? (size_t)sfw_ql_row_bytes(K)
			 : e->part == P_SCALE ? (size_t)sfw_ql_ngroups(K, c->p->group_size) * 2
					      : (size_t)K * sfw_dtype_size(e->dtype);
	int64_t per = (int64_t)(c->chunk_cap / out_row);
	if (per < 1)
		return sfw_fail(err, SFW_E_RANGE, "model '%s': tensor '%s': rows too long", c->in_dir, t->name);
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t n = rows - r0 < per ? rows - r0 : per;
		struct rows_job j = {e, r0, K, c->p->group_size, e->part, c->chunk, c->rowbuf, c->codebuf, c->scalebuf, 0};
		int nt = (double)n * K < 65536 ? 1 : c->nt;
		sfw_parallel_for(nt, (size_t)n, 1, rows_fn, &j);
		if (j.bad)
			return sfw_fail(err, SFW_E_FORMAT, "model '%s': tensor '%s' holds NaN or infinite values",
					c->in_dir, t->name);
		if ((s = sfw_st_writer_write(w, c->chunk, (size_t)n * out_row, err)) != SFW_OK)
			return s;
	}
	return SFW_OK;
}

/* ---- plan ----------------------------------------------------------------- */

static enum sfw_status make_plan(const char *in_dir, const struct sfw_st_set *set, const struct sfw_quant_params *p,
				 const struct sfwi_fold *fold, struct plan *pl, int *n_quant, struct sfw_err *err)
{
	enum sfw_status s;
	size_t n = sfw_st_set_count(set);
	*n_quant = 0;
	for (size_t i = 0; i < n; i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(set, i);
		const float *col = NULL, *div = NULL;
		if (fold)
			sfwi_fold_lookup(fold, t->name, &col, &div);
		if ((col || div) && !is_float(t->dtype))
			return sfw_fail(err, SFW_E_FORMAT, "model '%s': tensor '%s' has dtype %s; a float type was expected",
					in_dir, t->name, sfw_dtype_name(t->dtype));
		size_t plen;
		if (sfw_ql_is_quantized(t->name, &plen) && !p->fold_only) {
			if (t->ndim != 2 || !is_float(t->dtype) || t->shape[0] == 0 || t->shape[1] == 0 ||
			    t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX)
				return sfw_fail(err, SFW_E_FORMAT,
						"model '%s': tensor '%s': a linear weight must be a non-empty 2-D float tensor",
						in_dir, t->name);
			char mod[512];
			if (plen >= sizeof(mod))
				return sfw_fail(err, SFW_E_FORMAT, "model '%s': tensor name '%.80s...' is too long", in_dir,
						t->name);
			memcpy(mod, t->name, plen);
			mod[plen] = 0;
			int64_t K = (int64_t)t->shape[1];
			uint64_t sh_p[2] = {t->shape[0], (uint64_t)sfw_ql_words(K)};
			uint64_t sh_s[2] = {t->shape[0], (uint64_t)sfw_ql_ngroups(K, p->group_size)};
			uint64_t sh_shape[1] = {2};
			if ((s = plan_add(pl, mod, ".weight_packed", SFW_DTYPE_I32, 2, sh_p, t, P_PACKED, err)) ||
			    (s = plan_add(pl, mod, ".weight_scale", SFW_DTYPE_BF16, 2, sh_s, t, P_SCALE, err)) ||
			    (s = plan_add(pl, mod, ".weight_shape", SFW_DTYPE_I64, 1, sh_shape, t, P_SHAPE, err)))
				return s;
			pl->e[pl->n - 3].col = pl->e[pl->n - 2].col = col;
			pl->e[pl->n - 3].div = pl->e[pl->n - 2].div = div;
			(*n_quant)++;
		} else {
			enum sfw_dtype dt = t->dtype;
			if ((col || div) && p->fold_only)
				dt = SFW_DTYPE_F32; /* exact fold for the identity test */
			else if ((col || div) && dt == SFW_DTYPE_F16)
				dt = SFW_DTYPE_BF16; /* the converted copy writes bf16 or f32 */
			if ((s = plan_add(pl, t->name, NULL, dt, t->ndim, t->shape, t, P_COPY, err)) != SFW_OK)
				return s;
			pl->e[pl->n - 1].col = col;
			pl->e[pl->n - 1].div = div;
		}
	}
	/* shards in name order, each at most shard_bytes (a larger tensor alone) */
	uint64_t limit = p->shard_bytes ? p->shard_bytes : SHARD_DEFAULT, cur = 0;
	int shard = 0;
	for (size_t i = 0; i < pl->n; i++) {
		if (cur > 0 && cur + pl->e[i].nbytes > limit) {
			shard++;
			cur = 0;
		}
		pl->e[i].shard = shard;
		cur += pl->e[i].nbytes;
		pl->total += pl->e[i].nbytes;
	}
	pl->n_shards = shard + 1;
	return SFW_OK;
}

/* ---- side files ------------------------------------------------------------ */

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Tokenizer, generation config and remote-code files travel with the model;
 * weights, config.json (rewritten), the manifest and READMEs do not. */
static int side_file(const char *nm)
{
	if (nm[0] == '.' || !strcmp(nm, "config.json") || !strcmp(nm, INDEX_NAME) || ends_with(nm, ".safetensors"))
		return 0;
	return ends_with(nm, ".json") || ends_with(nm, ".py") || ends_with(nm, ".model") || ends_with(nm, ".txt") ||
	       ends_with(nm, ".jinja") || ends_with(nm, ".tiktoken");
}

static enum sfw_status copy_side_files(const char *in, const char *out, struct sfw_err *err)
{
	DIR *d = opendir(in);
	if (!d)
		return sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", in, strerror(errno));
	enum sfw_status s = SFW_OK;
	struct dirent *de;
	while (s == SFW_OK && (de = readdir(d))) {
		if (!side_file(de->d_name))
			continue;
		char *src = sfw_path_join(in, de->d_name), *dst = sfw_path_join(out, de->d_name);
		struct stat st;
		if (!src || !dst) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		} else if (stat(src, &st) != 0) { /* stat: a symlink's target is copied */
			sfw_log(SFW_LOG_WARN, "cannot read '%s': %s; not copied", src, strerror(errno));
		} else if (!S_ISREG(st.st_mode)) {
			sfw_log(SFW_LOG_WARN, "'%s' is not a regular file: not copied", src);
		} else {
			struct sfw_buf b;
			sfw_buf_init(&b, COPY_MAX);
			s = sfw_read_file(src, COPY_MAX, &b, err);
			if (s == SFW_OK)
				s = sfw_write_file_atomic(dst, b.data, b.len, err);
			sfw_buf_release(&b);
		}
		sfw_free(src);
		sfw_free(dst);
	}
	closedir(d);
	return s;
}

/* ---- config.json and the index -------------------------------------------- */

static cJSON *quant_config(const struct sfw_quant_params *p, const struct sfw_st_set *set)
{
	cJSON *q = cJSON_CreateObject(), *groups = cJSON_AddObjectToObject(q, "config_groups");
	cJSON *g0 = cJSON_AddObjectToObject(groups, "group_0");
	cJSON_AddStringToObject(g0, "format", "pack-quantized");
	cJSON_AddNullToObject(g0, "input_activations");
	cJSON_AddNullToObject(g0, "output_activations");
	cJSON *tg = cJSON_AddArrayToObject(g0, "targets");
	cJSON_AddItemToArray(tg, cJSON_CreateString("Linear"));
	cJSON *w = cJSON_AddObjectToObject(g0, "weights");
	cJSON_AddNullToObject(w, "actorder");
	cJSON_AddNullToObject(w, "block_structure");
	cJSON_AddFalseToObject(w, "dynamic");
	if (p->group_size > 0)
		cJSON_AddNumberToObject(w, "group_size", p->group_size);
	else
		cJSON_AddNullToObject(w, "group_size");
	cJSON_AddNumberToObject(w, "num_bits", SFW_QL_BITS);
	cJSON_AddStringToObject(w, "observer", "minmax");
	cJSON_AddObjectToObject(w, "observer_kwargs");
	cJSON_AddStringToObject(w, "strategy", p->group_size > 0 ? "group" : "channel");
	cJSON_AddTrueToObject(w, "symmetric");
	cJSON_AddStringToObject(w, "type", "int");
	cJSON_AddStringToObject(q, "format", "pack-quantized");
	cJSON_AddNullToObject(q, "global_compression_ratio");
	/* every 2-D weight we keep in full precision that a loader could take for
	 * a Linear (the embedding is an nn.Embedding, never targeted) */
	cJSON *ig = cJSON_AddArrayToObject(q, "ignore");
	for (size_t i = 0; i < sfw_st_set_count(set); i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(set, i);
		size_t n = strlen(t->name);
		if (t->ndim != 2 || !ends_with(t->name, ".weight") || sfw_ql_is_quantized(t->name, NULL) ||
		    strstr(t->name, "embed_tokens"))
			continue;
		char *m = sfw_strndup(t->name, n - 7);
		if (m)
			cJSON_AddItemToArray(ig, cJSON_CreateString(m));
		sfw_free(m);
	}
	cJSON_AddNullToObject(q, "kv_cache_scheme");
	cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
	cJSON_AddStringToObject(q, "quantization_status", "compressed");
	cJSON_AddObjectToObject(q, "sparsity_config");
	cJSON_AddObjectToObject(q, "transform_config");
	cJSON_AddStringToObject(q, "version", SFW_QL_CT_VERSION);
	return q;
}

static enum sfw_status write_json(const char *dir, const char *name, cJSON *root, struct sfw_err *err)
{
	char *text = cJSON_PrintBuffered(root, 1 << 16, 1);
	char *path = sfw_path_join(dir, name);
	enum sfw_status s;
	if (!text || !path) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	} else {
		size_t n = strlen(text);
		char *t2 = sfw_malloc(n + 2);
		if (!t2) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		} else {
			memcpy(t2, text, n);
			t2[n] = '\n';
			s = sfw_write_file_atomic(path, t2, n + 1, err);
			sfw_free(t2);
		}
	}
	if (text)
		cJSON_free(text);
	sfw_free(path);
	return s;
}

/* The number tokens of a JSON text in document order: the start of each is
 * a '-' or digit outside a string; it runs over [-+.0-9eE]. */
struct numtok {
	const char *p;
	size_t n;
};

static size_t lex_numbers(const char *t, size_t len, struct numtok *out, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		char c = t[i];
		if (c == '"') { /* skip the string, escapes included */
			for (i++; i < len && t[i] != '"'; i++)
				if (t[i] == '\\')
					i++;
		} else if (c == '-' || (c >= '0' && c <= '9')) {
			size_t j = i;
			while (j < len && (strchr("-+.eE", t[j]) || (t[j] >= '0' && t[j] <= '9')))
				j++;
			if (n < cap)
				out[n] = (struct numtok){t + i, j - i};
			n++;
			i = j - 1;
		}
	}
	return n;
}

/* Replaces every number of the tree (document order, as cJSON keeps it) by a
 * raw item holding the number's original text, so the rewritten config.json
 * keeps `0.0` and `10000.0` floats (cJSON would print 10000) and `1e-06` as
 * written. Returns -1 on a count mismatch or no memory. */
static int keep_numbers(cJSON *node, const struct numtok *tok, size_t ntok, size_t *at)
{
	for (cJSON *c = node->child, *next; c; c = next) {
		next = c->next;
		if (cJSON_IsNumber(c)) {
			if (*at >= ntok)
				return -1;
			char *txt = sfw_strndup(tok[*at].p, tok[*at].n);
			cJSON *raw = txt ? cJSON_CreateRaw(txt) : NULL;
			sfw_free(txt);
			if (!raw)
				return -1;
			raw->string = c->string; /* the member's key moves over */
			c->string = NULL;
			cJSON_ReplaceItemViaPointer(node, c, raw); /* cannot fail: c is node's child */
			(*at)++;
		} else if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && keep_numbers(c, tok, ntok, at) != 0) {
			return -1;
		}
	}
	return 0;
}

static enum sfw_status load_config_json(const char *dir, cJSON **out, struct sfw_err *err)
{
	char *path = sfw_path_join(dir, "config.json");
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_buf b;
	sfw_buf_init(&b, 4u << 20);
	enum sfw_status s = sfw_read_file(path, 4u << 20, &b, err);
	if (s == SFW_OK)
		s = sfw_json_parse(b.data, b.len, path, out, err);
	if (s == SFW_OK) {
		size_t ntok = lex_numbers(b.data, b.len, NULL, 0), at = 0;
		struct numtok *tok = sfw_malloc((ntok ? ntok : 1) * sizeof(*tok));
		if (!tok || lex_numbers(b.data, b.len, tok, ntok) != ntok ||
		    keep_numbers(*out, tok, ntok, &at) != 0 || at != ntok) {
			s = sfw_fail(err, tok ? SFW_E_FORMAT : SFW_E_NOMEM,
				     "'%s': cannot keep its numbers as written", path);
			cJSON_Delete(*out);
			*out = NULL;
		}
		sfw_free(tok);
	}
	sfw_buf_release(&b);
	sfw_free(path);
	return s;
}

static void shard_name(char *buf, size_t cap, int i, int n)
{
	snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

/* ---- the run ---------------------------------------------------------------- */

static int cmp_size_desc(const void *a, const void *b)
{
	const struct entry *x = *(const struct entry *const *)a, *y = *(const struct entry *const *)b;
	size_t sx = sfw_dtype_size(x->dtype), sy = sfw_dtype_size(y->dtype);
	if (sx != sy)
		return sx > sy ? -1 : 1;
	return x < y ? -1 : x > y; /* stable: plan (name) order */
}

/* Before the first shard lands: OUT stops looking like a complete model
 * (an older config.json or index next to our shards would load as a mix of
 * two models); config.json comes back last, when the run is complete. */
static enum sfw_status unpublish(const char *out_dir, struct sfw_err *err)
{
	/* what makes OUT load; the old weights stay until the new model is
	 * complete (remove_stale), so a failed run never loses data */
	static const char *const names[] = {"config.json", INDEX_NAME};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char *path = sfw_path_join(out_dir, names[i]);
		if (!path)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		int bad = unlink(path) != 0 && errno != ENOENT;
		enum sfw_status s = bad ? sfw_fail(err, SFW_E_IO, "cannot remove '%s': %s", path, strerror(errno)) : SFW_OK;
		sfw_free(path);
		if (s != SFW_OK)
			return s;
	}
	return SFW_OK;
}

static enum sfw_status write_shards(const char *out_dir, struct plan *pl, struct writer_ctx *wc,
				    const struct sfw_quant_params *p, struct sfw_quant_stats *st, struct sfw_err *err)
{
	enum sfw_status s = SFW_OK;
	struct entry **order = sfw_malloc(pl->n * sizeof(*order));
	if (!order)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	uint64_t done = 0;
	double t_write = sfw_now_s();
	char gs[16];
	if (p->group_size > 0)
		snprintf(gs, sizeof(gs), "%d", p->group_size);
	else
		snprintf(gs, sizeof(gs), "channel");
	size_t at = 0;
	for (int sh = 0; s == SFW_OK && sh < pl->n_shards; sh++) {
		size_t n = 0;
		for (; at + n < pl->n && pl->e[at + n].shard == sh; n++)
			order[n] = &pl->e[at + n];
		qsort(order, n, sizeof(*order), cmp_size_desc);
		char nm[64];
		shard_name(nm, sizeof(nm), sh, pl->n_shards);
		char *path = sfw_path_join(out_dir, nm);
		struct sfw_st_writer *w = NULL;
		if (!path) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			break;
		}
		s = sfw_st_writer_new(path, &w, err);
		sfw_free(path);
		if (s == SFW_OK)
			s = sfw_st_writer_meta(w, "format", "pt", err);
		if (s == SFW_OK)
			s = sfw_st_writer_meta(w, "salafw.format", p->fold_only ? "awq-fold-f32" : SFW_QL_FORMAT, err);
		if (s == SFW_OK)
			s = sfw_st_writer_meta(w, "salafw.version", SFW_QL_VERSION, err);
		if (s == SFW_OK)
			s = sfw_st_writer_meta(w, "quant.group_size", gs, err);
		if (s == SFW_OK)
			s = sfw_st_writer_meta(w, "quant.method", p->method == SFW_QUANT_AWQ ? "awq" : "rtn", err);
		for (size_t i = 0; s == SFW_OK && i < n; i++)
			s = sfw_st_writer_declare(w, order[i]->name, order[i]->dtype, order[i]->ndim, order[i]->shape, err);
		for (size_t i = 0; s == SFW_OK && i < n; i++) {
			s = produce(wc, w, order[i], err);
			/* the input pages of this tensor are done with (a linear's other
			 * part reads them again from the page cache, not the disk) */
			sfw_map_release(order[i]->src->data, order[i]->src->nbytes);
			done += order[i]->nbytes;
			if (p->on_phase) {
				struct sfw_quant_event ev = {SFW_QP_WRITE,	 (int64_t)done,
							     (int64_t)pl->total, sh + 1,
							     pl->n_shards,	 sfw_now_s() - t_write};
				p->on_phase(p->progress_user, &ev);
			}
			if (s == SFW_OK && p->progress && !p->progress(p->progress_user, order[i]->name, done, pl->total))
				s = sfw_fail(err, SFW_E_ABORTED, "quantization cancelled");
		}
		if (s == SFW_OK && sh == 0)
			s = unpublish(out_dir, err);
		/* an input truncated under us reads as zeros (core/file.h): never
		 * a shard made of them */
		if (s == SFW_OK)
			s = sfw_map_check(err);
		if (s == SFW_OK)
			s = sfw_st_writer_commit(w, err);
		sfw_st_writer_free(w);
		at += n;
	}
	sfw_free(order);
	if (st)
		st->bytes_out = pl->total;
	return s;
}

static enum sfw_status write_index(const char *out_dir, const struct plan *pl, struct sfw_err *err)
{
	cJSON *root = cJSON_CreateObject();
	cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
	cJSON_AddNumberToObject(meta, "total_size", (double)pl->total);
	cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
	/* names sorted, as the reference library writes them */
	for (size_t i = 0; i < pl->n; i++) {
		char nm[64];
		shard_name(nm, sizeof(nm), pl->e[i].shard, pl->n_shards);
		cJSON_AddStringToObject(wm, pl->e[i].name, nm);
	}
	enum sfw_status s = SFW_OK;
	if (!wm || cJSON_GetArraySize(wm) != (int)pl->n)
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	else
		s = write_json(out_dir, INDEX_NAME, root, err);
	cJSON_Delete(root);
	return s;
}

/* A shard this run did not write: with force, any older model's; without,
 * only the leftovers of a failed run of ours (salafw.format in the header). */
static int stale_shard(const char *out_dir, const char *name, int n_shards, int force)
{
	int a, b;
	char tail[32], keep[64];
	if (strcmp(name, "model.safetensors") == 0)
		return force;
	if (sscanf(name, "model-%5d-of-%5d%31s", &a, &b, tail) != 3 || strcmp(tail, ".safetensors") != 0)
		return 0;
	if (a >= 1 && a <= n_shards) {
		shard_name(keep, sizeof(keep), a - 1, n_shards);
		if (strcmp(keep, name) == 0)
			return 0;
	}
	if (force)
		return 1;
	char *path = sfw_path_join(out_dir, name);
	struct sfw_st_file *f = NULL;
	struct sfw_err e2;
	int ours = path && sfw_st_open(path, &f, &e2) == SFW_OK && sfw_st_metadata(f, "salafw.format") != NULL;
	sfw_st_close(f);
	sfw_free(path);
	return ours;
}

static void remove_stale(const char *out_dir, int n_shards, int force)
{
	DIR *d = opendir(out_dir);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!stale_shard(out_dir, de->d_name, n_shards, force))
			continue;
		char *path = sfw_path_join(out_dir, de->d_name);
		if (path && unlink(path) != 0)
			sfw_log(SFW_LOG_WARN, "cannot remove stale '%s': %s", path, strerror(errno));
		sfw_free(path);
	}
	closedir(d);
}

/* ---- OUT/.salafw/quant.partial: a run's own incomplete output ---------------
 * Written before anything of a run lands in OUT, removed once config.json
 * is in place. A run that finds it knows OUT holds what an earlier run of
 * quant left when it was killed or ran out of space: it takes OUT over
 * without --force and removes that run's temporary files. Without it, a
 * model in OUT is someone else's and is refused. */
#define PARTIAL_DIR ".salafw"
#define PARTIAL_NAME "quant.partial"

static int partial_marked(const char *out)
{
	char *d = sfw_path_join(out, PARTIAL_DIR), *f = sfw_path_join(out, PARTIAL_DIR "/" PARTIAL_NAME);
	struct stat a, b;
	int yes = d && f && lstat(d, &a) == 0 && S_ISDIR(a.st_mode) && lstat(f, &b) == 0 && S_ISREG(b.st_mode);
	sfw_free(d);
	sfw_free(f);
	return yes;
}

static enum sfw_status partial_mark(const char *out, struct sfw_err *err)
{
	static const char text[] = "salafw quant: this folder holds an incomplete output; a rerun of salafw quant "
				   "replaces it (this file goes when the model is complete)\n";
	int dfd = -1, sfd = -1;
	char shown[PATH_MAX];
	snprintf(shown, sizeof(shown), "%s/" PARTIAL_DIR "/" PARTIAL_NAME, out);
	enum sfw_status s = sfw_dir_open(out, &dfd, err);
	if (s == SFW_OK)
		s = sfw_dir_openat(dfd, out, PARTIAL_DIR, SFW_DIR_CREATE | SFW_DIR_OWNED, &sfd, err);
	if (s == SFW_OK)
		s = sfw_write_file_atomicat(sfd, PARTIAL_NAME, shown, text, sizeof(text) - 1, err);
	if (sfd >= 0)
		close(sfd);
	if (dfd >= 0)
		close(dfd);
	return s;
}

static void partial_clear(const char *out)
{
	char *f = sfw_path_join(out, PARTIAL_DIR "/" PARTIAL_NAME);
	if (f && unlink(f) != 0 && errno != ENOENT)
		sfw_log(SFW_LOG_WARN, "cannot remove '%s': %s", f, strerror(errno));
	sfw_free(f);
}

/* "NAME.tmp.<pid>.<n>" (core/file.h's temporary names) of a file quant
 * writes: a shard, the index, config.json or a copied side file. */
static int own_tmp(const char *nm)
{
	const char *t = strstr(nm, ".tmp.");
	if (!t || t == nm)
		return 0;
	const char *q = t + 5;
	size_t a = strspn(q, "0123456789");
	if (a == 0 || q[a] != '.' || strspn(q + a + 1, "0123456789") == 0 || q[a + 1 + strspn(q + a + 1, "0123456789")])
		return 0;
	char base[256];
	if ((size_t)(t - nm) >= sizeof(base))
		return 0;
	memcpy(base, nm, (size_t)(t - nm));
	base[t - nm] = 0;
	int x, y;
	char tail[32];
	int shard = !strcmp(base, "model.safetensors") ||
		    (sscanf(base, "model-%5d-of-%5d%31s", &x, &y, tail) == 3 && !strcmp(tail, ".safetensors"));
	return shard || !strcmp(base, "config.json") || !strcmp(base, INDEX_NAME) || side_file(base);
}

static void sweep_own_tmp(const char *out)
{
	DIR *d = opendir(out);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!own_tmp(de->d_name))
			continue;
		char *path = sfw_path_join(out, de->d_name);
		struct stat st;
		if (path && lstat(path, &st) == 0 && S_ISREG(st.st_mode) && unlink(path) != 0)
			sfw_log(SFW_LOG_WARN, "cannot remove '%s': %s", path, strerror(errno));
		sfw_free(path);
	}
	closedir(d);
}

static enum sfw_status check_dirs(const char *in, const char *out, int force, struct sfw_err *err)
{
	enum sfw_status s = sfw_mkdirs(out, err);
	if (s != SFW_OK)
		return s;
	char a[PATH_MAX], b[PATH_MAX];
	if (!realpath(in, a))
		return sfw_fail(err, SFW_E_IO, "cannot resolve '%s': %s", in, strerror(errno));
	if (!realpath(out, b))
		return sfw_fail(err, SFW_E_IO, "cannot resolve '%s': %s", out, strerror(errno));
	if (strcmp(a, b) == 0)
		return sfw_fail(err, SFW_E_INVAL, "output directory '%s' is the input directory", out);
	if (partial_marked(out)) { /* an earlier run's incomplete output: ours to replace */
		sfw_log(SFW_LOG_INFO, "'%s' holds the incomplete output of an earlier quant: replacing it", out);
		sweep_own_tmp(out);
		return SFW_OK;
	}
	const char *probe[] = {"config.json", INDEX_NAME, "model.safetensors"};
	for (size_t i = 0; !force && i < sizeof(probe) / sizeof(probe[0]); i++) {
		char *pth = sfw_path_join(out, probe[i]);
		struct stat st;
		int exists = pth && stat(pth, &st) == 0;
		sfw_free(pth);
		if (exists)
			return sfw_fail(err, SFW_E_EXISTS, "'%s' already holds a model (use --force to overwrite)", out);
	}
	return SFW_OK;
}

enum sfw_status sfw_quant_run(const char *in_dir, const char *out_dir, const struct sfw_quant_params *pp,
			      struct sfw_err *err)
{
	struct sfw_quant_params dp = sfw_quant_default_params();
	const struct sfw_quant_params *p = pp ? pp : &dp;
	struct sfw_quant_stats local, *st = p->stats ? p->stats : &local;
	memset(st, 0, sizeof(*st));
	double t0 = sfw_now_s();
	if (!sfw_quant_traits(p->group_size))
		return sfw_fail(err, SFW_E_INVAL, "group size %d is not supported (32, 64, 128 or channel)",
				p->group_size);
	if (p->method != SFW_QUANT_RTN && p->method != SFW_QUANT_AWQ)
		return sfw_fail(err, SFW_E_INVAL, "unknown quantization method");
	if (p->fold_only && p->method != SFW_QUANT_AWQ)
		return sfw_fail(err, SFW_E_INVAL, "fold_only needs the AWQ method");

	struct sfw_config cfg;
	cJSON *cj = NULL;
	struct sfw_st_set *set = NULL;
	struct sfwi_fold fold = {0, NULL};
	struct plan pl = {0};
	struct writer_ctx wc = {0};
	enum sfw_status s;
	if ((s = sfw_config_load(in_dir, &cfg, err)) != SFW_OK || (s = load_config_json(in_dir, &cj, err)) != SFW_OK)
		goto done;
	const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cj, "quantization_config");
	if (qc && !cJSON_IsNull(qc)) { /* null: not quantized, as the runner reads it */
		s = sfw_fail(err, SFW_E_UNSUPPORTED, "model '%s' is already quantized (config.json has quantization_config)",
			     in_dir);
		goto done;
	}
	if ((s = check_dirs(in_dir, out_dir, p->force, err)) != SFW_OK || (s = partial_mark(out_dir, err)) != SFW_OK)
		goto done;
	if ((s = sfw_st_set_open(in_dir, &set, err)) != SFW_OK)
		goto done;
	if (p->method == SFW_QUANT_AWQ) {
		double tc = sfw_now_s();
		if ((s = sfwi_awq_search(in_dir, p, &fold, err)) != SFW_OK)
			goto done;
		st->seconds_calib = sfw_now_s() - tc;
	}
	if ((s = make_plan(in_dir, set, p, p->method == SFW_QUANT_AWQ ? &fold : NULL, &pl, &st->n_quantized, err)) != SFW_OK)
		goto done;
	st->n_copied = (int)pl.n - 3 * st->n_quantized;
	st->n_shards = pl.n_shards;
	for (size_t i = 0; i < sfw_st_set_count(set); i++)
		st->bytes_in += sfw_st_set_at(set, i)->nbytes;

	/* per-thread row buffers and one chunk buffer */
	wc.p = p;
	wc.in_dir = in_dir;
	wc.nt = p->threads > 0 ? p->threads : sfw_default_threads();
	for (size_t i = 0; i < pl.n; i++) {
		const struct sfw_tensor_info *t = pl.e[i].src;
		int64_t K = t->ndim == 1 ? (int64_t)t->shape[0] : t->ndim == 2 ? (int64_t)t->shape[1] : 0;
		wc.maxK = K > wc.maxK ? K : wc.maxK;
	}
	wc.rowbuf = sfw_calloc((size_t)wc.nt, sizeof(*wc.rowbuf));
	wc.codebuf = sfw_calloc((size_t)wc.nt, sizeof(*wc.codebuf));
	wc.scalebuf = sfw_calloc((size_t)wc.nt, sizeof(*wc.scalebuf));
	wc.chunk_cap = CHUNK_BYTES;
	if ((size_t)wc.maxK * 4 > wc.chunk_cap)
		wc.chunk_cap = (size_t)wc.maxK * 4;
	wc.chunk = sfw_malloc(wc.chunk_cap);
	if (!wc.rowbuf || !wc.codebuf || !wc.scalebuf || !wc.chunk) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto done;
	}
	for (int i = 0; i < wc.nt; i++) {
		wc.rowbuf[i] = sfw_malloc((size_t)wc.maxK * sizeof(float) + 4);
		wc.codebuf[i] = sfw_malloc((size_t)sfw_ql_row_bytes(wc.maxK) + 4);
		wc.scalebuf[i] = sfw_malloc((size_t)sfw_ql_ngroups(wc.maxK, 32) * 2 + 4);
		if (!wc.rowbuf[i] || !wc.codebuf[i] || !wc.scalebuf[i]) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto done;
		}
	}
	/* side files before the index: a failed copy leaves no index that blocks a rerun */
	if ((s = write_shards(out_dir, &pl, &wc, p, st, err)) != SFW_OK ||
	    (s = copy_side_files(in_dir, out_dir, err)) != SFW_OK || (s = write_index(out_dir, &pl, err)) != SFW_OK)
		goto done;
	if (!p->fold_only) {
		cJSON_DeleteItemFromObjectCaseSensitive(cj, "quantization_config"); /* a null one */
		cJSON *q = quant_config(p, set);
		if (!q || !cJSON_AddItemToObject(cj, "quantization_config", q)) {
			cJSON_Delete(q);
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto done;
		}
	}
	if ((s = sfw_map_check(err)) != SFW_OK ||
	    (s = write_json(out_dir, "config.json", cj, err)) != SFW_OK) /* last: the model is complete */
		goto done;
	remove_stale(out_dir, pl.n_shards, p->force);
	partial_clear(out_dir); /* last: OUT holds a complete model */
	st->seconds_total = sfw_now_s() - t0;
done:
	if (wc.rowbuf)
		for (int i = 0; i < wc.nt; i++) {
			sfw_free(wc.rowbuf[i]);
			if (wc.codebuf)
				sfw_free(wc.codebuf[i]);
			if (wc.scalebuf)
				sfw_free(wc.scalebuf[i]);
		}
	sfw_free(wc.rowbuf);
	sfw_free(wc.codebuf);
	sfw_free(wc.scalebuf);
	sfw_free(wc.chunk);
	plan_free(&pl);
	sfwi_fold_free(&fold);
	sfw_st_set_close(set);
	cJSON_Delete(cj);
	return s;
}
