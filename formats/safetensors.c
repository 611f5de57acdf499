/* safetensors.c - bounded reader over a read-only map, multi-shard sets and a
 * streaming writer. Every number in a header is untrusted: sizes go through
 * checked.h, offsets are range- and overlap-checked before any pointer into
 * the map is formed. */
#include "formats/safetensors.h"

#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "file.h"
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_MAX (64u << 20)

static const struct {
	const char *name;  /* as in the file format */
	const char *lower; /* as in messages */
	size_t size;
	int in_files; /* a safetensors dtype (W8 is the ops' own, never in a file) */
} dtypes[SFW_DTYPE__COUNT] = {
    [SFW_DTYPE_BF16] = {"BF16", "bf16", 2, 1}, [SFW_DTYPE_F16] = {"F16", "f16", 2, 1},
    [SFW_DTYPE_F32] = {"F32", "f32", 4, 1},    [SFW_DTYPE_I8] = {"I8", "i8", 1, 1},
    [SFW_DTYPE_U8] = {"U8", "u8", 1, 1},       [SFW_DTYPE_I32] = {"I32", "i32", 4, 1},
    [SFW_DTYPE_I64] = {"I64", "i64", 8, 1},    [SFW_DTYPE_W8] = {"W8", "w8", 1, 0},
};

size_t sfw_dtype_size(enum sfw_dtype t)
{
	return (unsigned)t < SFW_DTYPE__COUNT ? dtypes[t].size : 0;
}

const char *sfw_dtype_name(enum sfw_dtype t)
{
	return (unsigned)t < SFW_DTYPE__COUNT ? dtypes[t].name : "?";
}

/* "[4096, 4096]" */
static void shape_str(char *out, size_t cap, int ndim, const uint64_t *shape)
{
	size_t at = 0;
	at += (size_t)snprintf(out, cap, "[");
	for (int i = 0; i < ndim && at < cap; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s%llu", i ? ", " : "",
				       (unsigned long long)shape[i]);
	if (at < cap)
		snprintf(out + at, cap - at, "]");
}

/* ------------------------------------------------------------------ reader */

struct sfw_st_file {
	struct sfw_map map; /* when opened from a path */
	char *what;	    /* file name for messages */
	cJSON *root;	    /* owns the name strings */
	struct sfw_tensor_info *t;
	size_t n;
	const struct sfw_tensor_info **by_name; /* sorted by name */
	const cJSON *meta;
};

static int cmp_name_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct sfw_tensor_info *const *)a)->name,
		      (*(const struct sfw_tensor_info *const *)b)->name);
}

/* A JSON number that is an integer in [0, 2^53-1]. */
static int json_uint(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > (double)SFW_JSON_MAX_SAFE_INT)
		return 0;
	uint64_t u = (uint64_t)v->valuedouble;
	if ((double)u != v->valuedouble)
		return 0;
	*out = u;
	return 1;
}

struct span {
	uint64_t begin, end;
	size_t idx;
};
static int cmp_span(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_dtype(const char *s, enum sfw_dtype *out)
{
	for (int i = 0; i < SFW_DTYPE__COUNT; i++)
		if (dtypes[i].in_files && strcmp(s, dtypes[i].name) == 0) {
			*out = (enum sfw_dtype)i;
			return 1;
		}
	return 0;
}

static enum sfw_status parse_tensor(const cJSON *e, const char *what, uint64_t data_size, uint64_t data_start,
				    struct sfw_tensor_info *t, uint64_t *begin_out, struct sfw_err *err)
{
	const char *name = e->string;
	if (!cJSON_IsObject(e))
		return sfw_fail(err, SFW_E_FORMAT, "'%s': tensor '%.80s' is not an object", what, name);
	for (const cJSON *c = e->child; c; c = c->next)
		if (strcmp(c->string, "dtype") != 0 && strcmp(c->string, "shape") != 0 &&
		    strcmp(c->string, "data_offsets") != 0)
			return sfw_fail(err, SFW_E_FORMAT,
					"'%s': tensor '%.80s' has an unknown field '%.40s'", what, name,
					c->string);
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
	if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
		return sfw_fail(
		    err, SFW_E_FORMAT,
		    "'%s': tensor '%.80s' needs a string dtype, a shape array and a data_offsets array", what,
		    name);
	if (!parse_dtype(dt->valuestring, &t->dtype))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "'%s': tensor '%.80s' has unsupported dtype '%.20s'",
				what, name, dt->valuestring);
	int nd = cJSON_GetArraySize(sh);
	if (nd > SFW_ST_MAX_DIMS)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "'%s': tensor '%.80s' has %d dimensions (at most %d)",
				what, name, nd, SFW_ST_MAX_DIMS);
	t->ndim = nd;
	uint64_t nelem = 1;
	int i = 0;
	for (const cJSON *d = sh->child; d; d = d->next, i++) {
		if (!json_uint(d, &t->shape[i]))
			return sfw_fail(err, SFW_E_FORMAT,
					"'%s': tensor '%.80s': shape entries must be integers >= 0", what,
					name);
		if (!sfw_mul_ok(nelem, t->shape[i], &nelem))
			return sfw_fail(err, SFW_E_RANGE,
					"'%s': tensor '%.80s': shape product overflows 64 bits", what, name);
	}
	uint64_t nbytes;
	if (!sfw_mul_ok(nelem, dtypes[t->dtype].size, &nbytes))
		return sfw_fail(err, SFW_E_RANGE, "'%s': tensor '%.80s': byte size overflows 64 bits", what,
				name);
	if (cJSON_GetArraySize(off) != 2)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': tensor '%.80s': data_offsets must be [begin, end]",
				what, name);
	uint64_t o[2];
	for (int k = 0; k < 2; k++) {
		const cJSON *v = cJSON_GetArrayItem(off, k);
		if (!json_uint(v, &o[k]))
			return sfw_fail(err, SFW_E_FORMAT,
					"'%s': tensor '%.80s': data_offsets must be non-negative integers",
					what, name);
	}
	if (o[0] > o[1] || o[1] > data_size)
		return sfw_fail(
		    err, SFW_E_FORMAT,
		    "'%s': tensor '%.80s': data_offsets [%llu, %llu] outside the %llu-byte data section "
		    "(truncated file?)",
		    what, name, (unsigned long long)o[0], (unsigned long long)o[1],
		    (unsigned long long)data_size);
	if (o[1] - o[0] != nbytes) {
		char s[160];
		shape_str(s, sizeof(s), nd, t->shape);
		return sfw_fail(err, SFW_E_FORMAT,
				"'%s': tensor '%.80s': %s %s needs %llu bytes, offsets give %llu", what, name,
				dtypes[t->dtype].lower, s, (unsigned long long)nbytes,
				(unsigned long long)(o[1] - o[0]));
	}
	/* The engine reads tensors in place: the element type must be aligned. */
	if (nbytes && (data_start + o[0]) % dtypes[t->dtype].size != 0)
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"'%s': tensor '%.80s' is not aligned to its %zu-byte elements", what, name,
				dtypes[t->dtype].size);
	t->name = name;
	t->nelem = nelem;
	t->nbytes = nbytes;
	*begin_out = o[0];
	return SFW_OK;
}

static void file_free(struct sfw_st_file *f)
{
	if (!f)
		return;
	sfw_map_close(&f->map);
	cJSON_Delete(f->root);
	sfw_free(f->t);
	sfw_free(f->by_name);
	sfw_free(f->what);
	sfw_free(f);
}

static enum sfw_status parse_into(struct sfw_st_file *f, const unsigned char *buf, uint64_t size,
				  struct sfw_err *err)
{
	const char *what = f->what;
	if (size < 8)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': too short for a safetensors file (%llu bytes)",
				what, (unsigned long long)size);
	uint64_t n = sfw_le64_load(buf);
	if (n > SFW_ST_HEADER_MAX)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': header length %llu exceeds the %u-byte limit", what,
				(unsigned long long)n, SFW_ST_HEADER_MAX);
	if (n > size - 8)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': header length %llu exceeds the file size %llu",
				what, (unsigned long long)n, (unsigned long long)size);
	if (n < 2)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': header is not a JSON object", what);
	char label[300];
	snprintf(label, sizeof(label), "'%s' header", what);
	enum sfw_status s = sfw_json_parse((const char *)buf + 8, (size_t)n, label, &f->root, err);
	if (s != SFW_OK)
		return s;
	if (!cJSON_IsObject(f->root))
		return sfw_fail(err, SFW_E_FORMAT, "'%s': header is not a JSON object", what);
	uint64_t data_start = 8 + n, data_size = size - data_start;
	size_t count = 0;
	for (const cJSON *c = f->root->child; c; c = c->next)
		count++;
	f->t = sfw_calloc(count ? count : 1, sizeof(*f->t));
	struct span *spans = sfw_calloc(count ? count : 1, sizeof(*spans));
	f->by_name = sfw_calloc(count ? count : 1, sizeof(*f->by_name));
	if (!f->t || !spans || !f->by_name) {
		sfw_free(spans);
		return sfw_fail(err, SFW_E_NOMEM, "'%s': out of memory for %zu tensors", what, count);
	}
	size_t nt = 0;
	for (const cJSON *c = f->root->child; c; c = c->next) {
		if (strcmp(c->string, "__metadata__") == 0) {
			if (!cJSON_IsObject(c)) {
				sfw_free(spans);
				return sfw_fail(err, SFW_E_FORMAT, "'%s': __metadata__ is not an object",
						what);
			}
			for (const cJSON *m = c->child; m; m = m->next)
				if (!cJSON_IsString(m)) {
					sfw_free(spans);
					return sfw_fail(err, SFW_E_FORMAT,
							"'%s': __metadata__ value '%.80s' is not a string",
							what, m->string);
				}
			f->meta = c;
			continue;
		}
		if (c->string[0] == '\0') {
			sfw_free(spans);
			return sfw_fail(err, SFW_E_FORMAT, "'%s': a tensor has an empty name", what);
		}
		uint64_t begin = 0;
		s = parse_tensor(c, what, data_size, data_start, &f->t[nt], &begin, err);
		if (s != SFW_OK) {
			sfw_free(spans);
			return s;
		}
		f->t[nt].data = buf + data_start + begin;
		spans[nt] = (struct span){begin, begin + f->t[nt].nbytes, nt};
		nt++;
	}
	f->n = nt;
	/* Overlap check on the non-empty tensors, sorted by offset. */
	qsort(spans, nt, sizeof(*spans), cmp_span);
	const struct span *prev = NULL;
	for (size_t i = 0; i < nt; i++) {
		if (spans[i].begin == spans[i].end)
			continue;
		if (prev && spans[i].begin < prev->end) {
			s = sfw_fail(err, SFW_E_FORMAT, "'%s': tensors '%.80s' and '%.80s' overlap", what,
				     f->t[prev->idx].name, f->t[spans[i].idx].name);
			sfw_free(spans);
			return s;
		}
		prev = &spans[i];
	}
	sfw_free(spans);
	for (size_t i = 0; i < nt; i++)
		f->by_name[i] = &f->t[i];
	qsort(f->by_name, nt, sizeof(*f->by_name), cmp_name_ptr);
	return SFW_OK;
}

static enum sfw_status file_new(const char *what, struct sfw_st_file **out, struct sfw_err *err)
{
	*out = sfw_calloc(1, sizeof(**out));
	if (!*out || !((*out)->what = sfw_strdup(what ? what : "safetensors"))) {
		sfw_free(*out);
		*out = NULL;
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	return SFW_OK;
}

enum sfw_status sfw_st_parse(const unsigned char *buf, uint64_t size, const char *what,
			     struct sfw_st_file **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_st_file *f;
	enum sfw_status s = file_new(what, &f, err);
	if (s != SFW_OK)
		return s;
	s = parse_into(f, buf, size, err);
	if (s != SFW_OK) {
		file_free(f);
		return s;
	}
	*out = f;
	return SFW_OK;
}

enum sfw_status sfw_st_open(const char *path, struct sfw_st_file **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_st_file *f;
	enum sfw_status s = file_new(path, &f, err);
	if (s != SFW_OK)
		return s;
	s = sfw_map_open(&f->map, path, err);
	if (s == SFW_OK)
		s = parse_into(f, f->map.data, f->map.size, err);
	if (s != SFW_OK) {
		file_free(f);
		return s;
	}
	*out = f;
	return SFW_OK;
}

void sfw_st_close(struct sfw_st_file *f)
{
	file_free(f);
}

size_t sfw_st_count(const struct sfw_st_file *f)
{
	return f->n;
}

const struct sfw_tensor_info *sfw_st_at(const struct sfw_st_file *f, size_t i)
{
	return i < f->n ? &f->t[i] : NULL;
}

const struct sfw_tensor_info *sfw_st_find(const struct sfw_st_file *f, const char *name)
{
	size_t lo = 0, hi = f->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(f->by_name[mid]->name, name);
		if (c == 0)
			return f->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *sfw_st_metadata(const struct sfw_st_file *f, const char *key)
{
	if (!f->meta)
		return NULL;
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* --------------------------------------------------------------- shard sets */

struct set_entry {
	const struct sfw_tensor_info *t;
	const struct sfw_st_file *file;
};

struct sfw_st_set {
	struct sfw_st_file **files;
	size_t nfiles;
	struct set_entry *e; /* sorted by name */
	size_t n;
	char *dir;
};

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct set_entry *)a)->t->name, ((const struct set_entry *)b)->t->name);
}

void sfw_st_set_close(struct sfw_st_set *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->nfiles; i++)
		file_free(s->files[i]);
	sfw_free(s->files);
	sfw_free(s->e);
	sfw_free(s->dir);
	sfw_free(s);
}

static int plain_name(const char *n)
{
	return n[0] && strcmp(n, ".") != 0 && strcmp(n, "..") != 0 && !strchr(n, '/') && !strchr(n, '\\');
}

static enum sfw_status open_shard(struct sfw_st_set *s, const char *name, struct sfw_st_file **out,
				  struct sfw_err *err)
{
	/* Shard paths are short relative names: find an already-open one. */
	for (size_t i = 0; i < s->nfiles; i++) {
		const char *w = s->files[i]->what;
		size_t lw = strlen(w), ln = strlen(name);
		if (lw > ln && strcmp(w + lw - ln, name) == 0 && w[lw - ln - 1] == '/') {
			*out = s->files[i];
			return SFW_OK;
		}
	}
	char *path = sfw_path_join(s->dir, name);
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_st_file **grown = sfw_realloc(s->files, (s->nfiles + 1) * sizeof(*grown));
	if (!grown) {
		sfw_free(path);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	s->files = grown;
	enum sfw_status st = sfw_st_open(path, out, err);
	sfw_free(path);
	if (st != SFW_OK)
		return st;
	s->files[s->nfiles++] = *out;
	return SFW_OK;
}

static enum sfw_status open_index(struct sfw_st_set *s, const char *index_path, struct sfw_err *err)
{
	struct sfw_buf b;
	enum sfw_status st = sfw_read_file(index_path, INDEX_MAX, &b, err);
	if (st != SFW_OK)
		return st;
	char label[300];
	snprintf(label, sizeof(label), "'%s'", index_path);
	cJSON *root = NULL;
	st = sfw_json_parse(b.data, b.len, label, &root, err);
	sfw_buf_release(&b);
	if (st != SFW_OK)
		return st;
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
		cJSON_Delete(root);
		return sfw_fail(err, SFW_E_FORMAT, "'%s': needs a \"weight_map\" object", index_path);
	}
	size_t count = 0;
	for (const cJSON *c = wm->child; c; c = c->next)
		count++;
	s->e = sfw_calloc(count ? count : 1, sizeof(*s->e));
	if (!s->e) {
		cJSON_Delete(root);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	for (const cJSON *c = wm->child; c; c = c->next) {
		if (!cJSON_IsString(c)) {
			st = sfw_fail(err, SFW_E_FORMAT, "'%s': weight_map entry '%.80s' is not a file name",
				      index_path, c->string);
			break;
		}
		if (!plain_name(c->valuestring)) {
			st = sfw_fail(err, SFW_E_PATH,
				      "'%s': shard name '%.80s' for '%.80s' is not a plain file name",
				      index_path, c->valuestring, c->string);
			break;
		}
		struct sfw_st_file *f;
		st = open_shard(s, c->valuestring, &f, err);
		if (st != SFW_OK) {
			sfw_err_prefix(err, "shard of '%s'", index_path);
			break;
		}
		const struct sfw_tensor_info *t = sfw_st_find(f, c->string);
		if (!t) {
			st = sfw_fail(err, SFW_E_FORMAT, "'%s': tensor '%.80s' is not in its shard '%s'",
				      index_path, c->string, f->what);
			break;
		}
		s->e[s->n++] = (struct set_entry){t, f};
	}
	cJSON_Delete(root);
	return st;
}

enum sfw_status sfw_st_set_open(const char *dir, struct sfw_st_set **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_st_set *s = sfw_calloc(1, sizeof(*s));
	if (!s || !(s->dir = sfw_strdup(dir))) {
		sfw_free(s);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	char *index = sfw_path_join(dir, INDEX_NAME), *single = sfw_path_join(dir, SINGLE_NAME);
	enum sfw_status st = SFW_OK;
	struct stat sb;
	if (!index || !single) {
		st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	} else if (stat(index, &sb) == 0) {
		st = open_index(s, index, err);
	} else if (stat(single, &sb) == 0) {
		struct sfw_st_file *f;
		st = open_shard(s, SINGLE_NAME, &f, err);
		if (st == SFW_OK) {
			s->e = sfw_calloc(f->n ? f->n : 1, sizeof(*s->e));
			if (!s->e)
				st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			for (size_t i = 0; st == SFW_OK && i < f->n; i++)
				s->e[s->n++] = (struct set_entry){&f->t[i], f};
		}
	} else {
		st = sfw_fail(err, SFW_E_MISSING, "no %s or %s in '%s'", INDEX_NAME, SINGLE_NAME, dir);
	}
	sfw_free(index);
	sfw_free(single);
	if (st == SFW_OK) {
		qsort(s->e, s->n, sizeof(*s->e), cmp_entry);
		/* JSON duplicates are rejected per object; this catches none in practice but keeps find
		 * exact. */
		for (size_t i = 1; i < s->n; i++)
			if (strcmp(s->e[i - 1].t->name, s->e[i].t->name) == 0) {
				st = sfw_fail(err, SFW_E_FORMAT, "'%s': tensor '%.80s' appears twice", dir,
					      s->e[i].t->name);
				break;
			}
	}
	if (st != SFW_OK) {
		sfw_st_set_close(s);
		return st;
	}
	*out = s;
	return SFW_OK;
}

size_t sfw_st_set_count(const struct sfw_st_set *s)
{
	return s->n;
}

const struct sfw_tensor_info *sfw_st_set_at(const struct sfw_st_set *s, size_t i)
{
	return i < s->n ? s->e[i].t : NULL;
}

static const struct set_entry *set_lookup(const struct sfw_st_set *s, const char *name)
{
	size_t lo = 0, hi = s->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(s->e[mid].t->name, name);
		if (c == 0)
			return &s->e[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct sfw_tensor_info *sfw_st_set_find(const struct sfw_st_set *s, const char *name)
{
	const struct set_entry *e = set_lookup(s, name);
	return e ? e->t : NULL;
}

enum sfw_status sfw_st_set_expect(const struct sfw_st_set *s, const char *name, enum sfw_dtype dtype,
				  int ndim, const uint64_t *shape, const struct sfw_tensor_info **out,
				  struct sfw_err *err)
{
	if (out)
		*out = NULL;
	SFW_ASSERT((unsigned)dtype < SFW_DTYPE__COUNT && dtypes[dtype].in_files && ndim >= 0 &&
		   ndim <= SFW_ST_MAX_DIMS);
	const struct set_entry *e = set_lookup(s, name);
	if (!e)
		return sfw_fail(err, SFW_E_FORMAT, "tensor '%.80s' is missing from the model in '%.120s'",
				name, s->dir);
	const struct sfw_tensor_info *t = e->t;
	int same = t->dtype == dtype && t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		char want[100], got[100];
		shape_str(want, sizeof(want), ndim, shape);
		shape_str(got, sizeof(got), t->ndim, t->shape);
		return sfw_fail(err, SFW_E_FORMAT, "tensor '%.80s' in '%.100s': expected %s %s, found %s %s",
				name, e->file->what, dtypes[dtype].lower, want, dtypes[t->dtype].lower, got);
	}
	if (out)
		*out = t;
	return SFW_OK;
}

/* ------------------------------------------------------------------ writer */

struct wdecl {
	char *name;
	enum sfw_dtype dtype;
	int ndim;
	uint64_t shape[SFW_ST_MAX_DIMS];
	uint64_t nbytes;
	uint64_t begin;
};

struct sfw_st_writer {
	struct sfw_atomic a;
	int open; /* a holds a temp file */
	struct wdecl *d;
	size_t n, cap;
	char **meta; /* key, value pairs */
	size_t nmeta;
	uint64_t data_size; /* sum of declared sizes */
	uint64_t written;   /* data bytes written */
	int header_done;
	int failed;
};

enum sfw_status sfw_st_writer_new(const char *path, struct sfw_st_writer **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_st_writer *w = sfw_calloc(1, sizeof(*w));
	if (!w)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status s = sfw_atomic_open(&w->a, path, err);
	if (s != SFW_OK) {
		sfw_free(w);
		return s;
	}
	w->open = 1;
	*out = w;
	return SFW_OK;
}

static enum sfw_status check_state(struct sfw_st_writer *w, int declaring, struct sfw_err *err)
{
	if (w->failed || !w->open)
		return sfw_fail(err, SFW_E_INVAL, "safetensors writer for '%s' is no longer usable",
				w->a.path ? w->a.path : "?");
	if (declaring && w->header_done)
		return sfw_fail(err, SFW_E_INVAL,
				"'%s': tensors and metadata must be declared before data is written",
				w->a.path);
	return SFW_OK;
}

static int name_ok(const char *s)
{
	return s && s[0] && sfw_utf8_valid((const unsigned char *)s, strlen(s));
}

enum sfw_status sfw_st_writer_meta(struct sfw_st_writer *w, const char *key, const char *value,
				   struct sfw_err *err)
{
	enum sfw_status s = check_state(w, 1, err);
	if (s != SFW_OK)
		return s;
	if (!name_ok(key) || !value || !sfw_utf8_valid((const unsigned char *)value, strlen(value)))
		return sfw_fail(err, SFW_E_INVAL, "'%s': metadata key and value must be non-empty UTF-8",
				w->a.path);
	for (size_t i = 0; i < w->nmeta; i++)
		if (strcmp(w->meta[2 * i], key) == 0)
			return sfw_fail(err, SFW_E_INVAL, "'%s': metadata key '%.80s' given twice", w->a.path,
					key);
	char **grown = sfw_realloc(w->meta, (w->nmeta + 1) * 2 * sizeof(*grown));
	if (!grown)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	w->meta = grown;
	char *k = sfw_strdup(key), *v = sfw_strdup(value);
	if (!k || !v) {
		sfw_free(k);
		sfw_free(v);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	w->meta[2 * w->nmeta] = k;
	w->meta[2 * w->nmeta + 1] = v;
	w->nmeta++;
	return SFW_OK;
}

enum sfw_status sfw_st_writer_declare(struct sfw_st_writer *w, const char *name, enum sfw_dtype dtype,
				      int ndim, const uint64_t *shape, struct sfw_err *err)
{
	enum sfw_status s = check_state(w, 1, err);
	if (s != SFW_OK)
		return s;
	if (!name_ok(name) || strcmp(name, "__metadata__") == 0)
		return sfw_fail(err, SFW_E_INVAL, "'%s': bad tensor name", w->a.path);
	if ((unsigned)dtype >= SFW_DTYPE__COUNT || !dtypes[dtype].in_files || ndim < 0 ||
	    ndim > SFW_ST_MAX_DIMS || (ndim && !shape))
		return sfw_fail(err, SFW_E_INVAL, "'%s': tensor '%.80s': bad dtype or shape", w->a.path,
				name);
	for (size_t i = 0; i < w->n; i++)
		if (strcmp(w->d[i].name, name) == 0)
			return sfw_fail(err, SFW_E_INVAL, "'%s': tensor '%.80s' declared twice", w->a.path,
					name);
	uint64_t nbytes = dtypes[dtype].size;
	for (int i = 0; i < ndim; i++)
		if (!sfw_mul_ok(nbytes, shape[i], &nbytes) || shape[i] > SFW_JSON_MAX_SAFE_INT)
			return sfw_fail(err, SFW_E_RANGE, "'%s': tensor '%.80s' is too large", w->a.path,
					name);
	/* Data starts 8-aligned; keep every tensor aligned to its element size
	 * without gaps (the reference library rejects gaps). */
	if (w->data_size % dtypes[dtype].size != 0)
		return sfw_fail(
		    err, SFW_E_INVAL,
		    "'%s': tensor '%.80s' would start unaligned; declare larger element types first",
		    w->a.path, name);
	uint64_t end;
	if (!sfw_add_ok(w->data_size, nbytes, &end) || end > SFW_JSON_MAX_SAFE_INT)
		return sfw_fail(err, SFW_E_RANGE, "'%s': data section too large", w->a.path);
	if (w->n == w->cap) {
		size_t nc = w->cap ? 2 * w->cap : 16;
		struct wdecl *g = sfw_realloc(w->d, nc * sizeof(*g));
		if (!g)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		w->d = g;
		w->cap = nc;
	}
	struct wdecl *d = &w->d[w->n];
	memset(d, 0, sizeof(*d));
	if (!(d->name = sfw_strdup(name)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	d->dtype = dtype;
	d->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		d->shape[i] = shape[i];
	d->nbytes = nbytes;
	d->begin = w->data_size;
	w->data_size = end;
	w->n++;
	return SFW_OK;
}

static enum sfw_status json_str(struct sfw_buf *b, const char *s)
{
	enum sfw_status st = sfw_buf_append(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; st == SFW_OK && *p; p++) {
		if (*p == '"' || *p == '\\') {
			char e[2] = {'\\', (char)*p};
			st = sfw_buf_append(b, e, 2);
		} else if (*p < 0x20) {
			st = sfw_buf_printf(b, "\\u%04x", *p);
		} else {
			st = sfw_buf_append(b, p, 1);
		}
	}
	if (st == SFW_OK)
		st = sfw_buf_append(b, "\"", 1);
	return st;
}

static enum sfw_status write_header(struct sfw_st_writer *w, struct sfw_err *err)
{
	struct sfw_buf b;
	sfw_buf_init(&b, SFW_ST_HEADER_MAX);
	enum sfw_status s = sfw_buf_append(&b, "{", 1);
	if (w->nmeta) {
		s = s ? s : sfw_buf_append(&b, "\"__metadata__\":{", 16);
		for (size_t i = 0; s == SFW_OK && i < w->nmeta; i++) {
			if (i)
				s = sfw_buf_append(&b, ",", 1);
			s = s ? s : json_str(&b, w->meta[2 * i]);
			s = s ? s : sfw_buf_append(&b, ":", 1);
			s = s ? s : json_str(&b, w->meta[2 * i + 1]);
		}
		s = s ? s : sfw_buf_append(&b, "}", 1);
	}
	for (size_t i = 0; s == SFW_OK && i < w->n; i++) {
		const struct wdecl *d = &w->d[i];
		if (i || w->nmeta)
			s = sfw_buf_append(&b, ",", 1);
		s = s ? s : json_str(&b, d->name);
		s = s ? s : sfw_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[d->dtype].name);
		for (int k = 0; s == SFW_OK && k < d->ndim; k++)
			s = sfw_buf_printf(&b, "%s%llu", k ? "," : "", (unsigned long long)d->shape[k]);
		s = s ? s
		      : sfw_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)d->begin,
				       (unsigned long long)(d->begin + d->nbytes));
	}
	s = s ? s : sfw_buf_append(&b, "}", 1);
	/* Pad with spaces so the data section starts 8-aligned, as the reference does. */
	while (s == SFW_OK && b.len % 8 != 0)
		s = sfw_buf_append(&b, " ", 1);
	if (s != SFW_OK) {
		sfw_buf_release(&b);
		return sfw_fail(err, s, "'%s': header too large", w->a.path);
	}
	unsigned char len8[8];
	sfw_le64_store(len8, b.len);
	s = sfw_atomic_write(&w->a, len8, 8, err);
	if (s == SFW_OK)
		s = sfw_atomic_write(&w->a, b.data, b.len, err);
	sfw_buf_release(&b);
	if (s == SFW_OK)
		w->header_done = 1;
	return s;
}

enum sfw_status sfw_st_writer_write(struct sfw_st_writer *w, const void *p, size_t n, struct sfw_err *err)
{
	enum sfw_status s = check_state(w, 0, err);
	if (s != SFW_OK)
		return s;
	if (n > w->data_size - w->written) {
		w->failed = 1;
		return sfw_fail(err, SFW_E_INVAL,
				"'%s': %zu more bytes written than the declared tensors hold", w->a.path,
				(size_t)(n - (w->data_size - w->written)));
	}
	if (!w->header_done && (s = write_header(w, err)) != SFW_OK) {
		w->failed = 1;
		return s;
	}
	if (n && (s = sfw_atomic_write(&w->a, p, n, err)) != SFW_OK) {
		w->failed = 1;
		return s;
	}
	w->written += n;
	return SFW_OK;
}

enum sfw_status sfw_st_writer_commit(struct sfw_st_writer *w, struct sfw_err *err)
{
	enum sfw_status s = check_state(w, 0, err);
	if (s != SFW_OK)
		return s;
	if (w->written != w->data_size) {
		w->failed = 1;
		return sfw_fail(err, SFW_E_INVAL, "'%s': only %llu of %llu data bytes were written",
				w->a.path, (unsigned long long)w->written, (unsigned long long)w->data_size);
	}
	if (!w->header_done && (s = write_header(w, err)) != SFW_OK) {
		w->failed = 1;
		return s;
	}
	w->open = 0; /* commit releases the temp file either way */
	return sfw_atomic_commit(&w->a, err);
}

void sfw_st_writer_free(struct sfw_st_writer *w)
{
	if (!w)
		return;
	if (w->open)
		sfw_atomic_abort(&w->a);
	for (size_t i = 0; i < w->n; i++)
		sfw_free(w->d[i].name);
	sfw_free(w->d);
	for (size_t i = 0; i < 2 * w->nmeta; i++)
		sfw_free(w->meta[i]);
	sfw_free(w->meta);
	sfw_free(w);
}
