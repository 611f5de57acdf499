/* modules: formats num core */
/* safetensors reader and writer: the golden files written by the reference
 * library open with the shapes, dtypes and values golden/README.md states;
 * the writer round-trips; every class of hostile file is rejected with a
 * one-line error naming the file. */
#include "check.h"

#include "alloc.h"
#include "checked.h"
#include "file.h"
#include "formats/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* ------------------------------------------------------------ golden */

static const struct sfw_tensor_info *expect(const struct sfw_st_set *s, const char *name, enum sfw_dtype dt,
					    int nd, uint64_t d0, uint64_t d1, uint64_t d2)
{
	uint64_t shape[3] = {d0, d1, d2};
	const struct sfw_tensor_info *t = NULL;
	struct sfw_err err = {0};
	enum sfw_status st = sfw_st_set_expect(s, name, dt, nd, shape, &t, &err);
	CHECK(st == SFW_OK, "expect %s: %s", name, err.msg);
	return t;
}

static void stats_bf16(const struct sfw_tensor_info *t, double *mean, double *sd)
{
	const uint16_t *p = t->data;
	double s = 0, s2 = 0;
	for (uint64_t i = 0; i < t->nelem; i++) {
		double v = sfw_bf16_to_f32(p[i]);
		s += v;
		s2 += v * v;
	}
	*mean = s / (double)t->nelem;
	*sd = sqrt(s2 / (double)t->nelem - *mean * *mean);
}

static void test_golden_model(const char *g, const char *cas, int layers, const char *mix)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/%s", g, cas);
	struct sfw_st_set *s = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_st_set_open(dir, &s, &err) == SFW_OK, "open golden %s: %s", cas, err.msg);
	if (!s)
		return;
	int nsparse = 0;
	for (int i = 0; i < layers; i++)
		nsparse += mix[i] == 'S';
	/* docs/model-spec.md §3 count: 3 + 5 per layer + 5 per sparse + 8 per lightning layer. */
	size_t want = 3 + 5 * (size_t)layers + 5 * (size_t)nsparse + 8 * (size_t)(layers - nsparse);
	CHECK(sfw_st_set_count(s) == want, "%s has %zu tensors (want %zu)", cas, sfw_st_set_count(s), want);
	const struct sfw_tensor_info *e =
	    expect(s, "model.embed_tokens.weight", SFW_DTYPE_BF16, 2, 1024, 256, 0);
	expect(s, "lm_head.weight", SFW_DTYPE_BF16, 2, 1024, 256, 0);
	const struct sfw_tensor_info *n = expect(s, "model.norm.weight", SFW_DTYPE_BF16, 1, 256, 0, 0);
	char name[128];
	for (int i = 0; i < layers; i++) {
		snprintf(name, sizeof(name), "model.layers.%d.mlp.down_proj.weight", i);
		expect(s, name, SFW_DTYPE_BF16, 2, 256, 640, 0);
		snprintf(name, sizeof(name), "model.layers.%d.self_attn.k_proj.weight", i);
		expect(s, name, SFW_DTYPE_BF16, 2, mix[i] == 'S' ? 64 : 256, 256, 0);
		snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s.weight", i,
			 mix[i] == 'S' ? "o_gate" : "z_proj");
		expect(s, name, SFW_DTYPE_BF16, 2, 256, 256, 0);
		snprintf(name, sizeof(name), "model.layers.%d.self_attn.q_norm.weight", i);
		CHECK((sfw_st_set_find(s, name) != NULL) == (mix[i] == 'L'),
		      "%s: q_norm only in lightning layers", name);
	}
	/* README: linear/embedding 0.02*N(0,1), norms 1 + 0.1*N(0,1). */
	double mean, sd;
	if (e) {
		stats_bf16(e, &mean, &sd);
		CHECK(fabs(mean) < 0.001 && fabs(sd - 0.02) < 0.001, "%s embedding mean %g sd %g", cas, mean,
		      sd);
	}
	if (n) {
		stats_bf16(n, &mean, &sd);
		CHECK(fabs(mean - 1) < 0.03 && fabs(sd - 0.1) < 0.02, "%s norm mean %g sd %g", cas, mean, sd);
	}
	/* A wrong expectation names the tensor, the file and both shapes. */
	uint64_t bad[2] = {4096, 4096};
	CHECK(sfw_st_set_expect(s, "model.embed_tokens.weight", SFW_DTYPE_F32, 2, bad, NULL, &err) ==
		      SFW_E_FORMAT &&
		  strstr(err.msg, "tensor 'model.embed_tokens.weight' in '") &&
		  strstr(err.msg, "model.safetensors': expected f32 [4096, 4096], found bf16 [1024, 256]"),
	      "expect mismatch message: %s", err.msg);
	CHECK(sfw_st_set_expect(s, "model.layers.99.mlp.up_proj.weight", SFW_DTYPE_BF16, 2, bad, NULL,
				&err) == SFW_E_FORMAT &&
		  strstr(err.msg, "'model.layers.99.mlp.up_proj.weight' is missing"),
	      "expect missing message: %s", err.msg);
	sfw_st_set_close(s);
}

static void test_golden_outputs(const char *g, const char *cas, uint64_t T, uint64_t logit_rows, int layers)
{
	for (int k = 0; k < 2; k++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s/golden_%s.safetensors", g, cas, k ? "bf16" : "f32");
		struct sfw_st_file *f = NULL;
		struct sfw_err err = {0};
		CHECK(sfw_st_open(path, &f, &err) == SFW_OK, "open %s: %s", path, err.msg);
		if (!f)
			continue;
		const struct sfw_tensor_info *ids = sfw_st_find(f, "input_ids");
		CHECK(ids && ids->dtype == SFW_DTYPE_I32 && ids->ndim == 1 && ids->shape[0] == T,
		      "%s input_ids i32 [%llu]", path, (unsigned long long)T);
		if (ids && ids->dtype == SFW_DTYPE_I32) {
			/* README: BOS (1), then uniform ids in [3, vocab). */
			const int32_t *v = ids->data;
			int ok = v[0] == 1;
			for (uint64_t i = 1; i < ids->nelem; i++)
				ok &= v[i] >= 3 && v[i] < 1024;
			CHECK(ok, "%s input_ids = BOS then [3, 1024)", path);
		}
		const struct sfw_tensor_info *lg = sfw_st_find(f, "prefill.logits");
		CHECK(lg && lg->dtype == SFW_DTYPE_F32 && lg->ndim == 2 && lg->shape[0] == logit_rows &&
			  lg->shape[1] == 1024,
		      "%s prefill.logits f32 [%llu, 1024]", path, (unsigned long long)logit_rows);
		if (lg && lg->dtype == SFW_DTYPE_F32) {
			const float *v = lg->data;
			float mx = 0;
			for (uint64_t i = 0; i < lg->nelem; i++)
				mx = fabsf(v[i]) > mx ? fabsf(v[i]) : mx;
			CHECK(mx > 0.05f && mx < 1.0f, "%s max |logit| %g (README: ~0.4)", path, mx);
		}
		char name[64];
		snprintf(name, sizeof(name), "prefill.layer.%d.out", layers - 1);
		const struct sfw_tensor_info *h = sfw_st_find(f, name);
		CHECK(h && h->dtype == SFW_DTYPE_F32 && h->shape[0] == T && h->shape[1] == 256,
		      "%s %s [T, 256]", path, name);
		const struct sfw_tensor_info *tok = sfw_st_find(f, "decode.tokens");
		CHECK(tok && tok->dtype == SFW_DTYPE_I32 && tok->ndim == 1, "%s decode.tokens i32", path);
		const char *c = sfw_st_metadata(f, "case");
		CHECK(c && strcmp(c, cas) == 0, "%s metadata case = %s", path, c ? c : "(none)");
		c = sfw_st_metadata(f, "compute_dtype");
		CHECK(c && strcmp(c, k ? "bfloat16" : "float32") == 0, "%s compute_dtype", path);
		CHECK(sfw_st_metadata(f, "no such key") == NULL, "absent metadata is NULL");
		sfw_st_close(f);
	}
}

static void test_golden_sparse(const char *g)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/tiny-sparse/golden_f32.safetensors", g);
	struct sfw_st_file *f = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_st_open(path, &f, &err) == SFW_OK, "open %s: %s", path, err.msg);
	if (!f)
		return;
	/* README: k = 4 + 2 = 6, Hk = 2, T = 1500; 92 / 22 compressed keys after prefill. */
	const struct sfw_tensor_info *t = sfw_st_find(f, "sparse.layer.0.prefill.topk_idx");
	CHECK(t && t->dtype == SFW_DTYPE_I32 && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 1500 &&
		  t->shape[2] == 6,
	      "topk_idx i32 [2, 1500, 6]");
	if (t && t->nelem == 2 * 1500 * 6) {
		const int32_t *v = t->data;
		/* Last row of head 0: block 0 is forced, qb = 1499/64 = 23 is forced. */
		const int32_t *row = v + 1499 * 6;
		CHECK(row[0] == 0 && row[5] == 23, "last row selects block 0 and the current block 23");
	}
	const struct sfw_tensor_info *nc = sfw_st_find(f, "sparse.layer.0.decode.n_compressed");
	CHECK(nc && nc->dtype == SFW_DTYPE_I32 && nc->shape[0] == 16 && nc->shape[1] == 2,
	      "decode.n_compressed i32 [16, 2]");
	if (nc && nc->nelem == 32) {
		const int32_t *v = nc->data;
		/* Step 0 sees 1501 tokens: n1 = (1501-32)/16+1 = 92, n2 = (1501-128)/64+1 = 22. */
		CHECK(v[0] == 92 && v[1] == 22, "n_compressed at step 0 = (92, 22), got (%d, %d)", v[0],
		      v[1]);
	}
	sfw_st_close(f);
}

/* ------------------------------------------------------------ hostile */

/* Builds [N][header][data] in memory. */
static unsigned char *mk(const char *header, uint64_t n_override, size_t data_len, size_t *size)
{
	size_t hl = strlen(header), padded = (hl + 7) / 8 * 8; /* data 8-aligned, as real files */
	*size = 8 + padded + data_len;
	unsigned char *b = calloc(1, *size + 1);
	sfw_le64_store(b, n_override ? n_override : padded);
	memcpy(b + 8, header, hl);
	memset(b + 8 + hl, ' ', padded - hl);
	return b;
}

static void hostile(const char *label, const char *header, uint64_t n_override, size_t data_len,
		    enum sfw_status want, const char *needle)
{
	size_t size;
	unsigned char *b = mk(header, n_override, data_len, &size);
	struct sfw_st_file *f = NULL;
	struct sfw_err err = {0};
	enum sfw_status st = sfw_st_parse(b, size, "evil.safetensors", &f, &err);
	CHECK(st == want && f == NULL && strstr(err.msg, "'evil.safetensors'") && strstr(err.msg, needle) &&
		  !strchr(err.msg, '\n'),
	      "%s: rejected (status %d want %d) with '%s' naming the file: %s", label, st, want, needle,
	      err.msg);
	sfw_st_close(f);
	free(b);
}

#define T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_hostile(void)
{
	/* Control: the well-formed base file parses. */
	size_t size;
	unsigned char *b = mk("{" T1 "}", 0, 8, &size);
	struct sfw_st_file *f = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_st_parse(b, size, "ok.safetensors", &f, &err) == SFW_OK && sfw_st_count(f) == 1,
	      "control parses: %s", err.msg);
	sfw_st_close(f);
	free(b);

	hostile("header length > file", "{" T1 "}", 4096, 8, SFW_E_FORMAT, "exceeds the file size");
	hostile("header length > cap", "{" T1 "}", (uint64_t)SFW_ST_HEADER_MAX + 1, 8, SFW_E_FORMAT,
		"exceeds the 104857600-byte limit");
	hostile("header length 2^64-1", "{" T1 "}", UINT64_MAX, 8, SFW_E_FORMAT, "exceeds");
	hostile("truncated data", "{" T1 "}", 0, 5, SFW_E_FORMAT, "outside the 5-byte data section");
	/* W8 is the ops' dtype of int8 codes (num/num.h), never a file's. */
	hostile("ops-only dtype W8", "{\"a\":{\"dtype\":\"W8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_UNSUPPORTED, "unsupported dtype 'W8'");
	hostile("overlapping offsets",
		"{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
		SFW_E_FORMAT, "overlap");
	hostile("shape product overflows",
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_RANGE, "overflows 64 bits");
	hostile("bytes overflow",
		"{\"a\":{\"dtype\":\"I64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_RANGE, "overflows 64 bits");
	hostile("size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_FORMAT, "f32 [3] needs 12 bytes, offsets give 8");
	hostile("unknown dtype", "{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_UNSUPPORTED, "unsupported dtype 'Q4_K'");
	hostile("duplicate names", "{" T1 "," T1 "}", 0, 8, SFW_E_FORMAT, "duplicate key 'a'");
	hostile("non-object header", "[1, 2, 3]", 0, 0, SFW_E_FORMAT, "not a JSON object");
	hostile("invalid JSON", "{\"a\":", 0, 0, SFW_E_FORMAT, "invalid JSON");
	hostile("tensor not an object", "{\"a\":[1]}", 0, 0, SFW_E_FORMAT, "is not an object");
	hostile("offsets not integers",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8.5]}}", 0, 9, SFW_E_FORMAT,
		"data_offsets must be non-negative integers");
	hostile("negative offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 0, 8,
		SFW_E_FORMAT, "data_offsets must be non-negative integers");
	hostile("string offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",\"8\"]}}",
		0, 8, SFW_E_FORMAT, "data_offsets must be non-negative integers");
	hostile("begin > end", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8,
		SFW_E_FORMAT, "outside");
	hostile("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8,
		SFW_E_FORMAT, "shape entries must be integers");
	hostile("too many dims",
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 0, 8,
		SFW_E_UNSUPPORTED, "dimensions");
	hostile("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8, SFW_E_FORMAT,
		"data_offsets array");
	hostile("unknown field",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 0, 8,
		SFW_E_FORMAT, "unknown field 'extra'");
	hostile("metadata not strings", "{\"__metadata__\":{\"k\":1}," T1 "}", 0, 8, SFW_E_FORMAT,
		"__metadata__ value 'k' is not a string");
	hostile("unaligned f32", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 0, 8,
		SFW_E_UNSUPPORTED, "not aligned");
	hostile("trailing garbage", "{" T1 "}x", 0, 8, SFW_E_FORMAT, "trailing bytes");

	/* Too short for the length prefix. */
	unsigned char tiny[4] = {0};
	f = NULL;
	CHECK(sfw_st_parse(tiny, sizeof(tiny), "short.safetensors", &f, &err) == SFW_E_FORMAT &&
		  strstr(err.msg, "'short.safetensors': too short"),
	      "4-byte file: %s", err.msg);

	/* Zero-length tensors and padding between tensors are legal. */
	b = mk("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[4,4]},"
	       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}   ",
	       0, 24, &size);
	f = NULL;
	CHECK(sfw_st_parse(b, size, "pad.safetensors", &f, &err) == SFW_OK &&
		  sfw_st_find(f, "e")->nelem == 0 && sfw_st_find(f, "a")->nbytes == 8,
	      "empty tensor and padding accepted: %s", err.msg);
	sfw_st_close(f);
	free(b);

	/* A file on disk that ends inside the data: sfw_st_open says so. */
	char path[512];
	snprintf(path, sizeof(path), "%s/trunc.safetensors", tmpdir);
	b = mk("{" T1 "}", 0, 8, &size);
	CHECK(sfw_write_file_atomic(path, b, size - 3, &err) == SFW_OK, "write truncated file");
	f = NULL;
	CHECK(sfw_st_open(path, &f, &err) == SFW_E_FORMAT && strstr(err.msg, path) &&
		  strstr(err.msg, "truncated"),
	      "truncated file on disk: %s", err.msg);
	free(b);
	snprintf(path, sizeof(path), "%s/absent.safetensors", tmpdir);
	CHECK(sfw_st_open(path, &f, &err) == SFW_E_MISSING && strstr(err.msg, path), "absent file: %s",
	      err.msg);
}

/* ------------------------------------------------------------ writer */

static int dir_entries(const char *dir, const char *prefix)
{
	int n = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (d)
		closedir(d);
	return n;
}

static void test_writer(void)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/w.safetensors", tmpdir);
	struct sfw_err err = {0};
	struct sfw_st_writer *w = NULL;
	float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
	int64_t i64[3] = {-1, 1LL << 40, 7};
	uint16_t bf[5] = {0x3f80, 0xbf80, 0x4000, 0, 0x7f80};
	uint8_t u8[3] = {1, 2, 255};
	uint64_t s_i64[1] = {3}, s_f32[2] = {2, 3}, s_bf[1] = {5}, s_u8[1] = {3};
	enum sfw_status st = sfw_st_writer_new(path, &w, &err);
	st = st ? st : sfw_st_writer_meta(w, "format", "pt", &err);
	st = st ? st : sfw_st_writer_meta(w, "note", "quote \" backslash \\ newline \n ok", &err);
	st = st ? st : sfw_st_writer_declare(w, "ints", SFW_DTYPE_I64, 1, s_i64, &err);
	st = st ? st : sfw_st_writer_declare(w, "floats", SFW_DTYPE_F32, 2, s_f32, &err);
	st = st ? st : sfw_st_writer_declare(w, "scalar", SFW_DTYPE_F32, 0, NULL, &err);
	st = st ? st : sfw_st_writer_declare(w, "bf", SFW_DTYPE_BF16, 1, s_bf, &err);
	CHECK(st == SFW_OK, "writer declare: %s", err.msg);
	CHECK(sfw_st_writer_declare(w, "bf", SFW_DTYPE_BF16, 1, s_bf, &err) == SFW_E_INVAL &&
		  strstr(err.msg, "declared twice"),
	      "duplicate declaration rejected: %s", err.msg);
	CHECK(sfw_st_writer_declare(w, "codes", SFW_DTYPE_W8, 1, s_u8, &err) == SFW_E_INVAL &&
		  strstr(err.msg, "bad dtype"),
	      "W8 (no safetensors dtype) refused by the writer: %s", err.msg);
	/* 10 bytes of bf16 leave the next 4-byte tensor unaligned. */
	CHECK(sfw_st_writer_declare(w, "late", SFW_DTYPE_F32, 1, s_u8, &err) == SFW_E_INVAL &&
		  strstr(err.msg, "unaligned"),
	      "unaligned declaration rejected: %s", err.msg);
	st = sfw_st_writer_declare(w, "bytes", SFW_DTYPE_U8, 1, s_u8, &err);
	/* Data in odd pieces, crossing tensor boundaries. */
	unsigned char all[24 + 24 + 4 + 10 + 3];
	float one = 42.0f;
	memcpy(all, i64, 24);
	memcpy(all + 24, f32, 24);
	memcpy(all + 48, &one, 4);
	memcpy(all + 52, bf, 10);
	memcpy(all + 62, u8, 3);
	st = st ? st : sfw_st_writer_write(w, all, 7, &err);
	st = st ? st : sfw_st_writer_write(w, all + 7, 0, &err);
	st = st ? st : sfw_st_writer_write(w, all + 7, 50, &err);
	CHECK(st == SFW_OK, "writer writes: %s", err.msg);
	CHECK(sfw_st_writer_declare(w, "after", SFW_DTYPE_U8, 1, s_u8, &err) == SFW_E_INVAL,
	      "declare after data rejected: %s", err.msg);
	CHECK(access(path, F_OK) != 0, "nothing at the final name before commit");
	st = sfw_st_writer_write(w, all + 57, sizeof(all) - 57, &err);
	st = st ? st : sfw_st_writer_commit(w, &err);
	CHECK(st == SFW_OK, "writer commit: %s", err.msg);
	sfw_st_writer_free(w);
	CHECK(dir_entries(tmpdir, "w.safetensors.tmp") == 0, "no temp file left");

	struct sfw_map m;
	CHECK(sfw_map_open(&m, path, &err) == SFW_OK, "map written file");
	if (m.data) {
		uint64_t n = sfw_le64_load(m.data);
		CHECK((8 + n) % 8 == 0 && m.data[8 + n - 1] == ' ' && m.size == 8 + n + sizeof(all),
		      "header padded with spaces to an 8-byte data start (N = %llu)", (unsigned long long)n);
		CHECK(memcmp(m.data + 8 + n, all, sizeof(all)) == 0, "data section = bytes written");
		sfw_map_close(&m);
	}
	struct sfw_st_file *f = NULL;
	CHECK(sfw_st_open(path, &f, &err) == SFW_OK, "written file re-opens: %s", err.msg);
	if (f) {
		const struct sfw_tensor_info *t = sfw_st_find(f, "floats");
		CHECK(t && t->dtype == SFW_DTYPE_F32 && t->ndim == 2 && t->shape[1] == 3 &&
			  memcmp(t->data, f32, 24) == 0,
		      "floats round trip");
		t = sfw_st_find(f, "ints");
		CHECK(t && t->dtype == SFW_DTYPE_I64 && ((const int64_t *)t->data)[1] == 1LL << 40,
		      "ints round trip");
		t = sfw_st_find(f, "scalar");
		CHECK(t && t->ndim == 0 && t->nelem == 1 && *(const float *)t->data == 42.0f,
		      "scalar round trip");
		t = sfw_st_find(f, "bytes");
		CHECK(t && t->dtype == SFW_DTYPE_U8 && ((const uint8_t *)t->data)[2] == 255, "u8 round trip");
		CHECK(sfw_st_count(f) == 5 && sfw_st_at(f, 5) == NULL, "5 tensors");
		const char *note = sfw_st_metadata(f, "note");
		CHECK(note && strcmp(note, "quote \" backslash \\ newline \n ok") == 0,
		      "metadata escaping round trip");
		sfw_st_close(f);
	}

	/* Commit with bytes missing fails and leaves nothing behind. */
	snprintf(path, sizeof(path), "%s/short.safetensors", tmpdir);
	w = NULL;
	st = sfw_st_writer_new(path, &w, &err);
	st = st ? st : sfw_st_writer_declare(w, "x", SFW_DTYPE_F32, 1, s_u8, &err);
	st = st ? st : sfw_st_writer_write(w, all, 8, &err);
	CHECK(st == SFW_OK, "short writer setup");
	CHECK(sfw_st_writer_commit(w, &err) == SFW_E_INVAL && strstr(err.msg, "only 8 of 12"),
	      "commit with missing bytes: %s", err.msg);
	sfw_st_writer_free(w);
	CHECK(access(path, F_OK) != 0 && dir_entries(tmpdir, "short.safetensors") == 0,
	      "failed writer leaves no file");
	/* Writing past the declared size fails. */
	st = sfw_st_writer_new(path, &w, &err);
	st = st ? st : sfw_st_writer_declare(w, "x", SFW_DTYPE_U8, 1, s_u8, &err);
	CHECK(st == SFW_OK && sfw_st_writer_write(w, all, 4, &err) == SFW_E_INVAL &&
		  strstr(err.msg, "more bytes"),
	      "overlong write rejected: %s", err.msg);
	sfw_st_writer_free(w);
	CHECK(dir_entries(tmpdir, "short.safetensors") == 0, "abandoned writer leaves no file");
	/* Unwritable target directory. */
	CHECK(sfw_st_writer_new("/nonexistent-dir/x.safetensors", &w, &err) != SFW_OK &&
		  strstr(err.msg, "/nonexistent-dir/x.safetensors"),
	      "writer into a missing directory: %s", err.msg);
}

/* ------------------------------------------------------------ index */

static void write_text(const char *dir, const char *name, const char *text)
{
	char path[512];
	struct sfw_err err;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (sfw_write_file_atomic(path, text, strlen(text), &err) != SFW_OK)
		printf("FAIL cannot write %s: %s\n", path, err.msg);
}

static void write_st(const char *dir, const char *name, const char *tensor)
{
	char path[512];
	struct sfw_err err = {0};
	struct sfw_st_writer *w = NULL;
	uint64_t shape[1] = {4};
	uint16_t v[4] = {1, 2, 3, 4};
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	enum sfw_status st = sfw_st_writer_new(path, &w, &err);
	st = st ? st : sfw_st_writer_declare(w, tensor, SFW_DTYPE_BF16, 1, shape, &err);
	st = st ? st : sfw_st_writer_write(w, v, sizeof(v), &err);
	st = st ? st : sfw_st_writer_commit(w, &err);
	sfw_st_writer_free(w);
	CHECK(st == SFW_OK, "write %s: %s", name, err.msg);
}

static void index_case(const char *label, const char *index, enum sfw_status want, const char *needle)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/idx", tmpdir);
	write_text(dir, "model.safetensors.index.json", index);
	struct sfw_st_set *s = NULL;
	struct sfw_err err = {0};
	enum sfw_status st = sfw_st_set_open(dir, &s, &err);
	CHECK(st == want && (want == SFW_OK) == (s != NULL) && (want == SFW_OK || strstr(err.msg, needle)),
	      "%s: status %d want %d, '%s' in: %s", label, st, want, needle, err.msg);
	if (s && want == SFW_OK) {
		CHECK(sfw_st_set_count(s) == 2 && sfw_st_set_find(s, "a") && sfw_st_set_find(s, "b") &&
			  ((const uint16_t *)sfw_st_set_find(s, "b")->data)[3] == 4,
		      "%s: both tensors reachable", label);
		CHECK(strcmp(sfw_st_set_at(s, 0)->name, "a") == 0 && sfw_st_set_at(s, 2) == NULL,
		      "set_at in order");
	}
	sfw_st_set_close(s);
}

static void test_index(void)
{
	char dir[512];
	struct sfw_err err = {0};
	snprintf(dir, sizeof(dir), "%s/idx", tmpdir);
	CHECK(sfw_mkdirs(dir, &err) == SFW_OK, "mkdir idx");
	write_st(dir, "s1.safetensors", "a");
	write_st(dir, "s2.safetensors", "b");
	write_st(tmpdir, "x.safetensors", "b");
	struct sfw_st_set *s = NULL;
	CHECK(sfw_st_set_open(dir, &s, &err) == SFW_E_MISSING &&
		  strstr(err.msg, "no model.safetensors.index.json"),
	      "directory without a model: %s", err.msg);
	index_case("good index",
		   "{\"metadata\":{\"total_size\":16},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2."
		   "safetensors\"}}",
		   SFW_OK, "");
	index_case("traversal", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"../x.safetensors\"}}",
		   SFW_E_PATH, "shard name '../x.safetensors' for 'b' is not a plain file name");
	index_case("dot-dot", "{\"weight_map\":{\"a\":\"..\"}}", SFW_E_PATH, "not a plain file name");
	index_case("absolute", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", SFW_E_PATH,
		   "not a plain file name");
	index_case("missing shard", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}",
		   SFW_E_MISSING, "s3.safetensors");
	index_case("tensor not in its shard",
		   "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}", SFW_E_FORMAT,
		   "tensor 'b' is not in its shard");
	index_case("no weight_map", "{\"metadata\":{}}", SFW_E_FORMAT, "weight_map");
	index_case("shard not a string", "{\"weight_map\":{\"a\":1}}", SFW_E_FORMAT, "not a file name");
	index_case("duplicate entry", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}",
		   SFW_E_FORMAT, "duplicate key 'a'");
	/* A hostile shard reached through the index is named in the error. */
	char bad[512];
	snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);
	CHECK(sfw_write_file_atomic(bad, "\x05\0\0\0\0\0\0\0[1,2]", 13, &err) == SFW_OK, "write bad shard");
	index_case("hostile shard", "{\"weight_map\":{\"a\":\"bad.safetensors\"}}", SFW_E_FORMAT,
		   "bad.safetensors': header is not a JSON object");
}

static void test_convert(void)
{
	CHECK(sfw_f16_to_f32(0x3c00) == 1.0f && sfw_f16_to_f32(0xc000) == -2.0f &&
		  sfw_f16_to_f32(0x7bff) == 65504.0f,
	      "f16 normals");
	CHECK(sfw_f16_to_f32(0x0001) == ldexpf(1, -24) && sfw_f16_to_f32(0x03ff) == ldexpf(1023, -24),
	      "f16 subnormals");
	CHECK(isinf(sfw_f16_to_f32(0x7c00)) && isnan(sfw_f16_to_f32(0x7e00)) &&
		  signbit(sfw_f16_to_f32(0x8000)),
	      "f16 inf, nan, -0");
	/* Every f16 value against its exact value mant * 2^(exp-25). */
	int bad = 0;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		uint32_t e = h >> 10, m = h & 0x3ff;
		float want = e ? ldexpf((float)(m | 0x400), (int)e - 25) : ldexpf((float)m, -24);
		bad += sfw_f16_to_f32((uint16_t)h) != want;
	}
	CHECK(bad == 0, "all finite f16 values exact (%d wrong)", bad);
	/* bf16 rounding: nearest, ties to even. */
	CHECK(sfw_f32_to_bf16(1.0f) == 0x3f80 && sfw_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80 &&
		  sfw_f32_to_bf16(1.0f + ldexpf(3, -8)) == 0x3f82 &&
		  sfw_f32_to_bf16(1.0f + ldexpf(1, -7)) == 0x3f81,
	      "bf16 round to nearest even");
	CHECK(sfw_dtype_size(SFW_DTYPE_I64) == 8 && strcmp(sfw_dtype_name(SFW_DTYPE_BF16), "BF16") == 0 &&
		  sfw_dtype_size(SFW_DTYPE_W8) == 1 && sfw_dtype_size(SFW_DTYPE__COUNT) == 0,
	      "dtype table");
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "%s/salafw-st.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	const char *g = check_golden_dir();
	if (g) {
		test_golden_model(g, "tiny-dense", 4, "SLLS");
		test_golden_model(g, "tiny-sparse", 6, "SLLSLS");
		test_golden_model(g, "tiny-cross", 4, "SLSL");
		test_golden_outputs(g, "tiny-dense", 200, 200, 4);
		test_golden_outputs(g, "tiny-sparse", 1500, 256, 6);
		test_golden_outputs(g, "tiny-cross", 300, 300, 4);
		test_golden_sparse(g);
	}
	test_hostile();
	test_writer();
	test_index();
	test_convert();
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", tmpdir);
	return CHECK_REPORT("test_safetensors");
}
