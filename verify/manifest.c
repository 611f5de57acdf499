/* manifest.c - manifest v1 (docs/fetch-verify.md §5): strict parse behind a small
 * adapter, path rules (§3.12-4), and the trust flow of §5.4: caps, minisign,
 * strict JSON, schema, publisher.key_id, binding, pins, expiry, rollback. */
#include "verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "file.h"
#include "json.h"
#include "log.h"
#include "utf8.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers --------------------------------------------------------- */

static int is_hex_lower(const char *s, size_t n)
{
	if (strlen(s) != n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
	y -= m <= 2;
	const int64_t era = (y >= 0 ? y : y - 399) / 400;
	const unsigned yoe = (unsigned)(y - era * 400);
	const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (int64_t)doe - 719468;
}

int sfwi_parse_rfc3339(const char *s, int64_t *out)
{
	/* Exactly YYYY-MM-DDTHH:MM:SSZ. */
	static const char shape[] = "dddd-dd-ddTdd:dd:ddZ";
	if (strlen(s) != sizeof(shape) - 1)
		return -1;
	for (size_t i = 0; shape[i]; i++) {
		if (shape[i] == 'd' ? !isdigit((unsigned char)s[i]) : s[i] != shape[i])
			return -1;
	}
	int y = atoi(s), mo = atoi(s + 5), d = atoi(s + 8), h = atoi(s + 11), mi = atoi(s + 14),
	    se = atoi(s + 17);
	static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 || se > 59)
		return -1;
	int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	if (mo == 2 && d == 29 && !leap)
		return -1;
	*out = days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + h * 3600 + mi * 60 + se;
	return 0;
}

void sfwi_format_rfc3339(int64_t t, char out[21])
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (!gmtime_r(&tt, &tm) || strftime(out, 21, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(out, 21, "@%lld", (long long)t);
}

/* The folders the program gave (sfw_verify_set_dirs); empty = none. */
static char given_state[4096], given_keys[4096];

void sfw_verify_set_dirs(const char *state_dir, const char *key_dir)
{
	snprintf(given_state, sizeof(given_state), "%s", state_dir ? state_dir : "");
	snprintf(given_keys, sizeof(given_keys), "%s", key_dir ? key_dir : "");
}

char *sfwi_state_dir(const char *override)
{
	if (override)
		return sfw_strdup(override);
	return given_state[0] ? sfw_strdup(given_state) : NULL;
}

char *sfwi_key_dir(void)
{
	return given_keys[0] ? sfw_strdup(given_keys) : NULL;
}

/* ns/name with HF's characters; no "--" or ".." so "--" can escape the '/'. */
static int repo_id_ok(const char *r)
{
	const char *slash = strchr(r, '/');
	if (!slash || strchr(slash + 1, '/') || strstr(r, "--") || strstr(r, ".."))
		return 0;
	size_t a = (size_t)(slash - r), b = strlen(slash + 1);
	if (a < 1 || a > 96 || b < 1 || b > 96)
		return 0;
	for (const char *p = r; *p; p++)
		if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.' || *p == '/'))
			return 0;
	const char *parts[2] = {r, slash + 1};
	size_t lens[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		char f = parts[i][0], l = parts[i][lens[i] - 1];
		if (f == '-' || f == '.' || l == '-' || l == '.')
			return 0;
	}
	return 1;
}

static int url_ok(const char *u)
{
	if (strncmp(u, "https://", 8) != 0 && strncmp(u, "http://", 7) != 0)
		return 0;
	size_t n = strlen(u);
	if (n > 2048)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)u[i] <= 0x20 || u[i] == 0x7f)
			return 0;
	return 1;
}

/* ---- path rules --------------------------------------------------------------- */

enum sfw_status sfw_path_check(const char *path, struct sfw_err *err)
{
	size_t n = strlen(path);
	if (n == 0)
		return sfw_fail(err, SFW_E_PATH, "empty file path");
	if (n > 1024)
		return sfw_fail(err, SFW_E_PATH, "file path '%.64s...' is longer than 1024 bytes", path);
	if (!sfw_utf8_valid((const unsigned char *)path, n))
		return sfw_fail(err, SFW_E_PATH, "file path is not valid UTF-8");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)path[i];
		if (c < 0x20 || c == 0x7f)
			return sfw_fail(err, SFW_E_PATH, "file path contains a control character (0x%02x)",
					c);
		if (c == '\\')
			return sfw_fail(err, SFW_E_PATH, "file path '%s' contains a backslash", path);
		if (c == ':')
			return sfw_fail(err, SFW_E_PATH, "file path '%s' contains ':'", path);
	}
	if (path[0] == '/')
		return sfw_fail(err, SFW_E_PATH, "file path '%s' is absolute", path);
	if (path[n - 1] == '/')
		return sfw_fail(err, SFW_E_PATH, "file path '%s' ends with '/'", path);
	const char *seg = path;
	int first = 1;
	for (;;) {
		const char *slash = strchr(seg, '/');
		size_t len = slash ? (size_t)(slash - seg) : strlen(seg);
		if (len == 0)
			return sfw_fail(err, SFW_E_PATH, "file path '%s' has an empty segment", path);
		if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
			return sfw_fail(err, SFW_E_PATH, "file path '%s' is not normalised ('%.*s' segment)",
					path, (int)len, seg);
		if (len > 255)
			return sfw_fail(err, SFW_E_PATH, "file path '%.64s...' has a segment over 255 bytes",
					path);
		/* case-blind: on a case-insensitive file system .SALAFW is .salafw */
		if ((len == 7 && strncasecmp(seg, ".salafw", 7) == 0) || (len == 4 && strncasecmp(seg, ".git", 4) == 0))
			return sfw_fail(err, SFW_E_PATH, "file path '%s' uses the reserved name '%.*s'", path,
					(int)len, seg);
		if (first && strncasecmp(path, ".cache/huggingface/", 19) == 0)
			return sfw_fail(err, SFW_E_PATH,
					"file path '%s' is inside the reserved .cache/huggingface", path);
		first = 0;
		if (!slash)
			break;
		seg = slash + 1;
	}
	return SFW_OK;
}

/* Errors from the JSON helpers (FORMAT, RANGE) become "manifest rejected". */
static enum sfw_status as_manifest(struct sfw_err *err)
{
	if (err && err->code == SFW_E_NOMEM)
		return SFW_E_NOMEM;
	if (err)
		err->code = SFW_E_MANIFEST;
	return SFW_E_MANIFEST;
}

/* ---- parse ------------------------------------------------------------------------- */

void sfw_manifest_release(struct sfw_manifest *m)
{
	if (!m)
		return;
	sfw_free(m->generator);
	sfw_free(m->repo_id);
	for (size_t i = 0; i < m->nfiles; i++)
		sfw_free(m->files[i].path);
	sfw_free(m->files);
	for (size_t i = 0; i < m->nsources; i++) {
		sfw_free(m->sources[i].url);
		sfw_free(m->sources[i].name);
	}
	sfw_free(m->sources);
	struct sfw_manifest_lineage *l = &m->lineage;
	sfw_free(l->derived_by);
	sfw_free(l->method);
	for (size_t i = 0; i < l->nparams; i++) {
		sfw_free(l->param_key[i]);
		sfw_free(l->param_value[i]);
	}
	sfw_free(l->parent_repo_id);
	memset(m, 0, sizeof(*m));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Collisions of case or Unicode normalisation (sfw_name_fold: "A"/"a",
 * NFC/NFD "caf\u00e9"/"cafe\u0301", U+212B/U+00C5) and file-vs-folder-prefix
 * conflicts (files sorted, unique). */
static enum sfw_status check_collisions(const struct sfw_manifest *m, const char *what, struct sfw_err *err)
{
	size_t n = m->nfiles;
	char **low = sfw_calloc(n, sizeof(*low));
	char **sorted = sfw_calloc(n, sizeof(*sorted));
	enum sfw_status s = SFW_OK;
	if (!low || !sorted) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		sorted[i] = m->files[i].path;
		if (!(low[i] = sfw_name_fold(m->files[i].path))) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto out;
		}
	}
	qsort(low, n, sizeof(*low), cmp_str);
	for (size_t i = 1; i < n; i++)
		if (strcmp(low[i - 1], low[i]) == 0) {
			s = sfw_fail(err, SFW_E_MANIFEST,
				     "%s: two paths differ only in case or Unicode normalisation ('%s')", what,
				     low[i]);
			goto out;
		}
	for (size_t i = 0; i < n; i++) {
		const char *p = m->files[i].path;
		char prefix[1100]; /* paths are at most 1024 bytes (sfw_path_check) */
		for (const char *sl = strchr(p, '/'); sl; sl = strchr(sl + 1, '/')) {
			size_t pl = (size_t)(sl - p);
			memcpy(prefix, p, pl);
			prefix[pl] = '\0';
			char *key = prefix;
			if (bsearch(&key, sorted, n, sizeof(*sorted), cmp_str)) {
				s = sfw_fail(err, SFW_E_MANIFEST,
					     "%s: '%s' is both a file and the folder of '%s'", what, prefix,
					     p);
				goto out;
			}
		}
	}
out:
	if (low)
		for (size_t i = 0; i < n; i++)
			sfw_free(low[i]);
	sfw_free(low);
	sfw_free(sorted);
	return s;
}

static enum sfw_status parse_files(const cJSON *arr, const char *what, struct sfw_manifest *m,
				   struct sfw_err *err)
{
	if (!cJSON_IsArray(arr))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'files' must be an array", what);
	size_t n = (size_t)cJSON_GetArraySize(arr);
	if (n == 0)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'files' is empty", what);
	m->files = sfw_calloc(n, sizeof(*m->files));
	if (!m->files)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	uint64_t total = 0;
	size_t i = 0;
	const cJSON *f;
	cJSON_ArrayForEach(f, arr)
	{
		if (!cJSON_IsObject(f))
			return sfw_fail(err, SFW_E_MANIFEST, "%s: files[%zu] must be an object", what, i);
		char ctx[300];
		snprintf(ctx, sizeof(ctx), "%s: files[%zu]", what, i);
		const char *path, *sha;
		struct sfw_manifest_file *mf = &m->files[i];
		if (sfw_json_string(f, "path", ctx, &path, err) != SFW_OK ||
		    sfw_json_u64(f, "size", ctx, &mf->size, err) != SFW_OK ||
		    sfw_json_string(f, "sha256", ctx, &sha, err) != SFW_OK) {
			return as_manifest(err);
		}
		if (sfw_path_check(path, err) != SFW_OK) {
			sfw_err_prefix(err, "%s", ctx);
			return SFW_E_PATH;
		}
		if (!is_hex_lower(sha, 64) || sfw_hex_decode(sha, mf->sha256, 32) != 0)
			return sfw_fail(err, SFW_E_MANIFEST, "%s: 'sha256' must be 64 lower-case hex digits",
					ctx);
		if (!(mf->path = sfw_strdup(path)))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		m->nfiles = ++i;
		if (i > 1) {
			int c = strcmp(m->files[i - 2].path, path);
			if (c == 0)
				return sfw_fail(err, SFW_E_MANIFEST, "%s: duplicate path '%s'", what, path);
			if (c > 0)
				return sfw_fail(err, SFW_E_MANIFEST,
						"%s: files are not sorted ('%s' comes after '%s')", what,
						path, m->files[i - 2].path);
		}
		if (!sfw_add_ok(total, mf->size, &total))
			return sfw_fail(err, SFW_E_MANIFEST, "%s: total of file sizes overflows", what);
	}
	if (total != m->total_size)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: total_size is %llu but the files add up to %llu",
				what, (unsigned long long)m->total_size, (unsigned long long)total);
	return check_collisions(m, what, err);
}

static enum sfw_status parse_sources(const cJSON *arr, const char *what, struct sfw_manifest *m,
				     struct sfw_err *err)
{
	if (!arr)
		return SFW_OK;
	if (!cJSON_IsArray(arr))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'sources' must be an array", what);
	size_t n = (size_t)cJSON_GetArraySize(arr);
	if (n == 0)
		return SFW_OK;
	m->sources = sfw_calloc(n, sizeof(*m->sources));
	if (!m->sources)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t i = 0;
	const cJSON *src;
	cJSON_ArrayForEach(src, arr)
	{
		char ctx[300];
		snprintf(ctx, sizeof(ctx), "%s: sources[%zu]", what, i++);
		if (!cJSON_IsObject(src))
			return sfw_fail(err, SFW_E_MANIFEST, "%s must be an object", ctx);
		const char *kind, *url, *name = NULL;
		if (sfw_json_string(src, "kind", ctx, &kind, err) != SFW_OK) {
			return as_manifest(err);
		}
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(src, "name");
		if (nm) {
			if (!cJSON_IsString(nm))
				return sfw_fail(err, SFW_E_MANIFEST, "%s: 'name' must be a string", ctx);
			name = nm->valuestring;
		}
		struct sfw_source *so = &m->sources[m->nsources];
		if (strcmp(kind, "http") == 0) {
			if (sfw_json_string(src, "base_url", ctx, &url, err) != SFW_OK) {
				return as_manifest(err);
			}
			if (!url_ok(url) || url[strlen(url) - 1] != '/')
				return sfw_fail(err, SFW_E_MANIFEST,
						"%s: base_url must be an http(s) URL ending in '/'", ctx);
			so->kind = SFW_SOURCE_HTTP;
		} else if (strcmp(kind, "hf") == 0) {
			if (sfw_json_string(src, "endpoint", ctx, &url, err) != SFW_OK) {
				return as_manifest(err);
			}
			if (!url_ok(url) || url[strlen(url) - 1] == '/')
				return sfw_fail(err, SFW_E_MANIFEST,
						"%s: endpoint must be an http(s) URL without a trailing '/'",
						ctx);
			so->kind = SFW_SOURCE_HF;
		} else {
			sfw_log(SFW_LOG_WARN, "%s: unknown source kind '%.32s' skipped", ctx, kind);
			continue;
		}
		so->url = sfw_strdup(url);
		so->name = name ? sfw_strdup(name) : NULL;
		m->nsources++;
		if (!so->url || (name && !so->name))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	return SFW_OK;
}

/* ---- lineage (a derived model's parent and recipe; verify.h) --------------- */

/* 1 when s is 1..max bytes, each printable ASCII (or, with set, in set). */
static int text_ok(const char *s, size_t max, const char *set)
{
	size_t n = strlen(s);
	if (n < 1 || n > max)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (set ? !strchr(set, c) || c == 0 : c < 0x20 || c > 0x7e)
			return 0;
	}
	return 1;
}

static const char lower_word[] = "abcdefghijklmnopqrstuvwxyz0123456789_";

/* Only the named members: a lineage says nothing the parser does not read. */
static enum sfw_status only_keys(const cJSON *o, const char *const *keys, const char *ctx,
				 struct sfw_err *err)
{
	const cJSON *c;
	cJSON_ArrayForEach(c, o)
	{
		int known = 0;
		for (size_t i = 0; keys[i] && !known; i++)
			known = strcmp(c->string, keys[i]) == 0;
		if (!known)
			return sfw_fail(err, SFW_E_MANIFEST, "%s: unknown member '%.32s'", ctx,
					text_ok(c->string, 32, lower_word) ? c->string : "?");
	}
	return SFW_OK;
}

static enum sfw_status parse_lineage(const cJSON *lo, const char *what, struct sfw_manifest_lineage *l,
				     struct sfw_err *err)
{
	static const char *const top[] = {"derived_by", "method", "params", "parent", NULL};
	static const char *const par[] = {"repo_id", "revision", "manifest_sha256", "key_id", NULL};
	char ctx[320];
	snprintf(ctx, sizeof(ctx), "%s: lineage", what);
	const char *s;
	if (!cJSON_IsObject(lo))
		return sfw_fail(err, SFW_E_MANIFEST, "%s must be an object", ctx);
	if (only_keys(lo, top, ctx, err) != SFW_OK)
		return SFW_E_MANIFEST;
	l->present = 1;
	if (sfw_json_string(lo, "derived_by", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!text_ok(s, 64, NULL))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: derived_by must be 1 to 64 printable characters",
				ctx);
	if (!(l->derived_by = sfw_strdup(s)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (sfw_json_string(lo, "method", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!text_ok(s, 32, "abcdefghijklmnopqrstuvwxyz0123456789_-"))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: method must be 1 to 32 of [a-z0-9_-]", ctx);
	if (!(l->method = sfw_strdup(s)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	const cJSON *pa = cJSON_GetObjectItemCaseSensitive(lo, "params"), *c;
	if (pa) {
		if (!cJSON_IsObject(pa))
			return sfw_fail(err, SFW_E_MANIFEST, "%s: params must be an object", ctx);
		if (cJSON_GetArraySize(pa) > SFW_LINEAGE_MAX_PARAMS)
			return sfw_fail(err, SFW_E_MANIFEST, "%s: more than %d params", ctx,
					SFW_LINEAGE_MAX_PARAMS);
		cJSON_ArrayForEach(c, pa)
		{
			if (!text_ok(c->string, 32, lower_word))
				return sfw_fail(err, SFW_E_MANIFEST,
						"%s: a param name must be 1 to 32 of [a-z0-9_]", ctx);
			if (!cJSON_IsString(c) || !text_ok(c->valuestring, 128, NULL))
				return sfw_fail(
				    err, SFW_E_MANIFEST,
				    "%s: params.%s must be a string of 1 to 128 printable characters", ctx,
				    c->string);
			size_t i = l->nparams;
			l->param_key[i] = sfw_strdup(c->string);
			l->param_value[i] = sfw_strdup(c->valuestring);
			l->nparams++;
			if (!l->param_key[i] || !l->param_value[i])
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		}
	}
	const cJSON *po = cJSON_GetObjectItemCaseSensitive(lo, "parent");
	if (!po)
		return SFW_OK;
	snprintf(ctx, sizeof(ctx), "%s: lineage.parent", what);
	if (!cJSON_IsObject(po))
		return sfw_fail(err, SFW_E_MANIFEST, "%s must be an object", ctx);
	if (only_keys(po, par, ctx, err) != SFW_OK)
		return SFW_E_MANIFEST;
	if (sfw_json_string(po, "repo_id", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!repo_id_ok(s))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: repo_id is not of the form ORG/NAME", ctx);
	if (!(l->parent_repo_id = sfw_strdup(s)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (sfw_json_string(po, "revision", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!is_hex_lower(s, 40))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: revision must be 40 lower-case hex digits", ctx);
	memcpy(l->parent_revision, s, 41);
	if (sfw_json_string(po, "manifest_sha256", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!is_hex_lower(s, 64) || sfw_hex_decode(s, l->parent_manifest_sha256, 32) != 0)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: manifest_sha256 must be 64 lower-case hex digits",
				ctx);
	if (sfw_json_string(po, "key_id", ctx, &s, err) != SFW_OK)
		return as_manifest(err);
	if (!text_ok(s, 16, "0123456789ABCDEF") || strlen(s) != 16)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: key_id must be 16 upper-case hex digits", ctx);
	memcpy(l->parent_key_id, s, 17);
	l->has_parent = 1;
	return SFW_OK;
}

/* The adapter: salafw's own v1 schema. Another generator family (the
 * service's real field names, §5.5) gets its own function mapping its JSON
 * onto struct sfw_manifest, chosen in sfw_manifest_parse. */
static enum sfw_status adapt_salafw_v1(const cJSON *root, const char *what, struct sfw_manifest *m,
				       struct sfw_err *err)
{
	uint64_t v;
	const char *s;
	enum sfw_status st;
#define REQ(call)                                                                                            \
	do {                                                                                                 \
		if ((st = (call)) != SFW_OK) {                                                               \
			if (err && st != SFW_E_NOMEM)                                                        \
				err->code = SFW_E_MANIFEST;                                                  \
			return st == SFW_E_NOMEM ? st : SFW_E_MANIFEST;                                      \
		}                                                                                            \
	} while (0)
	REQ(sfw_json_u64(root, "schema_version", what, &v, err));
	if (v != 1)
		return sfw_fail(err, SFW_E_MANIFEST,
				"%s: unsupported schema_version %llu (this salafw reads 1)", what,
				(unsigned long long)v);
	m->schema_version = 1;
	REQ(sfw_json_string(root, "generator", what, &s, err));
	if (!(m->generator = sfw_strdup(s)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	const cJSON *pub = cJSON_GetObjectItemCaseSensitive(root, "publisher");
	if (!cJSON_IsObject(pub))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'publisher' must be an object", what);
	REQ(sfw_json_string(pub, "key_id", what, &s, err));
	if (strlen(s) != 16 || strspn(s, "0123456789ABCDEFabcdef") != 16)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: publisher.key_id must be 16 hex digits", what);
	for (int i = 0; i < 16; i++)
		m->publisher_key_id[i] = (char)toupper((unsigned char)s[i]);
	m->publisher_key_id[16] = '\0';
	const cJSON *rt = cJSON_GetObjectItemCaseSensitive(root, "repo_type");
	if (rt && !(cJSON_IsString(rt) && strcmp(rt->valuestring, "model") == 0))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: repo_type must be \"model\"", what);
	REQ(sfw_json_string(root, "repo_id", what, &s, err));
	if (!repo_id_ok(s))
		return sfw_fail(err, SFW_E_MANIFEST, "%s: repo_id '%.100s' is not of the form ORG/NAME", what,
				s);
	if (!(m->repo_id = sfw_strdup(s)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	REQ(sfw_json_string(root, "revision", what, &s, err));
	if (!is_hex_lower(s, 40))
		return sfw_fail(err, SFW_E_MANIFEST,
				"%s: revision must be 40 lower-case hex digits (a commit)", what);
	memcpy(m->revision, s, 41);
	REQ(sfw_json_u64(root, "manifest_version", what, &m->manifest_version, err));
	if (m->manifest_version < 1)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: manifest_version must be at least 1", what);
	REQ(sfw_json_string(root, "created", what, &s, err));
	if (sfwi_parse_rfc3339(s, &m->created) != 0)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'created' is not YYYY-MM-DDTHH:MM:SSZ", what);
	REQ(sfw_json_string(root, "expires", what, &s, err));
	if (sfwi_parse_rfc3339(s, &m->expires) != 0)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'expires' is not YYYY-MM-DDTHH:MM:SSZ", what);
	if (m->expires <= m->created)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: 'expires' is not after 'created'", what);
	REQ(sfw_json_u64(root, "total_size", what, &m->total_size, err));
#undef REQ
	st = parse_files(cJSON_GetObjectItemCaseSensitive(root, "files"), what, m, err);
	if (st != SFW_OK)
		return st;
	const cJSON *lin = cJSON_GetObjectItemCaseSensitive(root, "lineage");
	if (lin && (st = parse_lineage(lin, what, &m->lineage, err)) != SFW_OK)
		return st;
	return parse_sources(cJSON_GetObjectItemCaseSensitive(root, "sources"), what, m, err);
}

enum sfw_status sfw_manifest_parse(const char *bytes, size_t len, const char *what, struct sfw_manifest *out,
				   struct sfw_err *err)
{
	memset(out, 0, sizeof(*out));
	if (len > SFW_MANIFEST_MAX)
		return sfw_fail(err, SFW_E_MANIFEST, "%s is too large (%zu bytes, limit %u)", what, len,
				SFW_MANIFEST_MAX);
	/* cJSON ends a string at an escaped NUL, so "a\u0000b" would read as "a". */
	int in_str = 0;
	for (size_t i = 0; i < len; i++) {
		if (bytes[i] == '"') {
			in_str = !in_str;
		} else if (in_str && bytes[i] == '\\' && i + 1 < len) {
			if (bytes[i + 1] == 'u' && i + 5 < len && memcmp(bytes + i + 2, "0000", 4) == 0)
				return sfw_fail(err, SFW_E_MANIFEST, "%s: contains an escaped NUL (\\u0000)",
						what);
			i++;
		}
	}
	cJSON *root = NULL;
	enum sfw_status s = sfw_json_parse(bytes, len, what, &root, err);
	if (s != SFW_OK) {
		if (err)
			err->code = SFW_E_MANIFEST;
		return SFW_E_MANIFEST;
	}
	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return sfw_fail(err, SFW_E_MANIFEST, "%s: not a JSON object", what);
	}
	s = adapt_salafw_v1(root, what, out, err);
	cJSON_Delete(root);
	if (s != SFW_OK) {
		sfw_manifest_release(out);
		return s;
	}
	struct sfw_sha256 h;
	if (sfw_sha256_init(&h) != SFW_OK) {
		sfw_manifest_release(out);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	sfw_sha256_update(&h, bytes, len);
	sfw_sha256_final(&h, out->manifest_sha256);
	sfw_sha256_release(&h);
	return SFW_OK;
}

/* ---- trust flow -------------------------------------------------------------------- */

struct sfw_trust_params sfw_trust_default_params(void)
{
	struct sfw_trust_params p;
	memset(&p, 0, sizeof(p));
	return p;
}

/* "salafw-manifest repo_id=... revision=... manifest_version=..." must agree
 * with the JSON; any other comment (minisign's default) is display only. */
static enum sfw_status check_trusted_comment(const char *tc, const struct sfw_manifest *m, const char *what,
					     struct sfw_err *err)
{
	static const char tag[] = "salafw-manifest ";
	if (strncmp(tc, tag, sizeof(tag) - 1) != 0)
		return SFW_OK;
	const char *p = tc + sizeof(tag) - 1;
	while (*p) {
		while (*p == ' ')
			p++;
		size_t n = strcspn(p, " ");
		if (n == 0)
			break;
		const char *eq = memchr(p, '=', n);
		if (eq) {
			size_t kl = (size_t)(eq - p), vl = n - kl - 1;
			const char *v = eq + 1;
			char num[32];
			snprintf(num, sizeof(num), "%llu", (unsigned long long)m->manifest_version);
			const char *want = NULL;
			if (kl == 7 && memcmp(p, "repo_id", 7) == 0)
				want = m->repo_id;
			else if (kl == 8 && memcmp(p, "revision", 8) == 0)
				want = m->revision;
			else if (kl == 16 && memcmp(p, "manifest_version", 16) == 0)
				want = num;
			if (want && (strlen(want) != vl || memcmp(want, v, vl) != 0))
				return sfw_fail(
				    err, SFW_E_MANIFEST,
				    "%s: the signed trusted comment says %.*s but the manifest says '%s'",
				    what, (int)(n > 120 ? 120 : n), p, want);
		}
		p += n;
	}
	return SFW_OK;
}

static enum sfw_status check_pin(const struct sfw_manifest *m, const char *what, struct sfw_err *err)
{
	const struct sfwi_pin *pin = sfwi_pin_find(m->repo_id, m->revision);
	if (!pin)
		return SFW_OK;
	for (size_t i = 0; i < m->nfiles; i++) {
		const struct sfwi_pin_file *pf = NULL;
		for (size_t k = 0; k < pin->nfiles && !pf; k++)
			if (strcmp(pin->files[k].path, m->files[i].path) == 0)
				pf = &pin->files[k];
		if (!pf)
			return sfw_fail(err, SFW_E_MANIFEST,
					"%s: '%s' is not among the pinned files of %s@%.12s", what,
					m->files[i].path, m->repo_id, m->revision);
		unsigned char want[32];
		SFW_ASSERT(sfw_hex_decode(pf->sha256_hex, want, 32) == 0);
		if (CRYPTO_memcmp(want, m->files[i].sha256, 32) != 0)
			return sfw_fail(err, SFW_E_MANIFEST,
					"%s: sha256 of '%s' disagrees with the pin for %s@%.12s", what,
					m->files[i].path, m->repo_id, m->revision);
	}
	if (m->nfiles != pin->nfiles)
		return sfw_fail(err, SFW_E_MANIFEST, "%s: lists %zu files but the pin for %s@%.12s has %zu",
				what, m->nfiles, m->repo_id, m->revision, pin->nfiles);
	return SFW_OK;
}

/* <state>/trusted/<ns>--<name>.<KEYID>.json */
static char *ratchet_path(const struct sfw_manifest *m, const struct sfw_trust_params *p)
{
	char *dir = sfwi_state_dir(p->state_dir);
	if (!dir)
		return NULL;
	char name[256];
	const char *slash = strchr(m->repo_id, '/');
	snprintf(name, sizeof(name), "trusted/%.*s--%s.%s.json", (int)(slash - m->repo_id), m->repo_id,
		 slash + 1, m->publisher_key_id);
	char *path = sfw_path_join(dir, name);
	sfw_free(dir);
	return path;
}

struct ratchet {
	int present;
	uint64_t version;
	unsigned char sha[32];
};

static enum sfw_status ratchet_load(const char *path, struct ratchet *r, struct sfw_err *err)
{
	memset(r, 0, sizeof(*r));
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(path, 65536, &b, err);
	if (s == SFW_E_MISSING)
		return SFW_OK;
	if (s != SFW_OK)
		return s;
	cJSON *root = NULL;
	char what[300];
	snprintf(what, sizeof(what), "rollback state '%s'", path);
	s = sfw_json_parse(b.data, b.len, what, &root, err);
	sfw_buf_release(&b);
	if (s != SFW_OK)
		return s;
	const char *sha;
	if ((s = sfw_json_u64(root, "manifest_version", what, &r->version, err)) == SFW_OK &&
	    (s = sfw_json_string(root, "manifest_sha256", what, &sha, err)) == SFW_OK &&
	    (!is_hex_lower(sha, 64) || sfw_hex_decode(sha, r->sha, 32) != 0))
		s = sfw_fail(err, SFW_E_FORMAT, "%s: bad manifest_sha256", what);
	cJSON_Delete(root);
	r->present = s == SFW_OK;
	return s;
}

static enum sfw_status ratchet_compare(const struct sfw_manifest *m, const struct sfw_trust_params *p,
				       const struct ratchet *r, const char *what, const char *path,
				       struct sfw_err *err)
{
	if (m->manifest_version < r->version && !p->allow_downgrade)
		return sfw_fail(err, SFW_E_MANIFEST,
				"%s: manifest_version %llu is older than version %llu already seen for %s "
				"(key %s): possible rollback (--allow-downgrade overrides)",
				what, (unsigned long long)m->manifest_version, (unsigned long long)r->version,
				m->repo_id, m->publisher_key_id);
	if (m->manifest_version == r->version && CRYPTO_memcmp(r->sha, m->manifest_sha256, 32) != 0) {
		char seen[65], here[65];
		sfw_hex_encode(r->sha, 32, seen);
		sfw_hex_encode(m->manifest_sha256, 32, here);
		return sfw_fail(err, SFW_E_MANIFEST,
				"equivocation: %.60s manifest_version %llu was seen before with other bytes (%.8s.. "
				"now, %.8s.. then): ask the publisher for a higher version, or remove '%s' to accept it",
				m->repo_id, (unsigned long long)m->manifest_version, here, seen, path);
	}
	return SFW_OK;
}

static enum sfw_status check_ratchet(const struct sfw_manifest *m, const struct sfw_trust_params *p,
				     const char *what, struct sfw_err *err)
{
	if (p->state_dir && !*p->state_dir)
		return SFW_OK;
	char *path = ratchet_path(m, p);
	if (!path) {
		sfw_log(SFW_LOG_WARN,
			"no state directory was given (the CLI takes SALAFW_STATE_DIR, XDG_STATE_HOME or HOME): rollback not checked");
		return SFW_OK;
	}
	struct ratchet r;
	enum sfw_status s = ratchet_load(path, &r, err);
	if (s == SFW_E_FORMAT && p->allow_downgrade) {
		/* a damaged record cannot be compared with; the commit rewrites it */
		sfw_log(SFW_LOG_WARN, "rollback state '%s' is damaged: not checked (it will be rewritten)", path);
		s = SFW_OK, r.present = 0;
	} else if (s == SFW_E_FORMAT && err) {
		char m0[sizeof(err->msg)];
		snprintf(m0, sizeof(m0), "%s", err->msg);
		sfw_fail(err, s, "%.400s (--allow-downgrade starts it afresh)", m0);
	}
	if (s != SFW_OK || !r.present) {
		sfw_free(path);
		return s;
	}
	s = ratchet_compare(m, p, &r, what, path, err);
	sfw_free(path);
	return s;
}

/* The rollback record is read, compared and replaced under an exclusive
 * flock on <state>/trusted/.lock, so two runs taking in manifests at once
 * (get, verify --manifest) cannot lower it: the later one compares against
 * what the earlier one wrote. Without flock (some network file systems) the
 * record is still replaced atomically, only that race is open again. */
static int ratchet_lock(const char *dir, struct sfw_err *err, enum sfw_status *s)
{
	char *lp = sfw_path_join(dir, ".lock");
	if (!lp) {
		*s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return -1;
	}
	int fd = open(lp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		*s = sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", lp, strerror(errno));
		sfw_free(lp);
		return -1;
	}
	int r;
	while ((r = flock(fd, LOCK_EX)) != 0 && errno == EINTR)
		;
	if (r != 0)
		sfw_log(SFW_LOG_WARN, "cannot lock '%s': %s; continuing without a lock", lp, strerror(errno));
	sfw_free(lp);
	*s = SFW_OK;
	return fd;
}

enum sfw_status sfw_manifest_ratchet_commit(const struct sfw_manifest *m, const struct sfw_trust_params *p,
					    struct sfw_err *err)
{
	if (p->state_dir && !*p->state_dir)
		return SFW_OK;
	char *path = ratchet_path(m, p);
	if (!path)
		return SFW_OK;
	char *slash = strrchr(path, '/');
	*slash = '\0';
	enum sfw_status s = sfw_mkdirs(path, err);
	int lockfd = s == SFW_OK ? ratchet_lock(path, err, &s) : -1;
	*slash = '/';
	if (s != SFW_OK) {
		sfw_free(path);
		return s;
	}
	struct ratchet r;
	s = ratchet_load(path, &r, err);
	if (s == SFW_E_FORMAT) /* damaged: rewritten (the check before already said so) */
		s = SFW_OK, r.present = 0;
	char what[300];
	snprintf(what, sizeof(what), "manifest for %s", m->repo_id);
	/* Compared again under the lock: another run may have taken in a newer
	 * (or an equal, other) manifest since this one was checked. */
	if (s == SFW_OK && r.present)
		s = ratchet_compare(m, p, &r, what, path, err);
	/* Never lower the ratchet (a downgrade allowed once stays a one-off),
	 * and an equal record needs no write. */
	int write = s == SFW_OK && (!r.present || r.version < m->manifest_version);
	if (write) {
		char hex[65];
		sfw_hex_encode(m->manifest_sha256, 32, hex);
		struct sfw_buf b;
		sfw_buf_init(&b, 4096);
		if (sfw_buf_printf(&b,
				   "{\"repo_id\": \"%s\", \"key_id\": \"%s\", \"manifest_version\": %llu, "
				   "\"manifest_sha256\": \"%s\", \"revision\": \"%s\"}\n",
				   m->repo_id, m->publisher_key_id, (unsigned long long)m->manifest_version,
				   hex, m->revision) != SFW_OK)
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		else
			s = sfw_write_file_atomic(path, b.data, b.len, err);
		sfw_buf_release(&b);
	}
	if (lockfd >= 0)
		close(lockfd);
	sfw_free(path);
	return s;
}

enum sfw_status sfw_manifest_verify(const char *bytes, size_t len, const char *sig_text, size_t sig_len,
				    const char *what, const struct sfw_trust_params *p,
				    struct sfw_manifest *out, struct sfw_minisig_info *info,
				    struct sfw_err *err)
{
	struct sfw_manifest local;
	struct sfw_manifest *m = out ? out : &local;
	memset(m, 0, sizeof(*m));
	if (len > SFW_MANIFEST_MAX)
		return sfw_fail(err, SFW_E_MANIFEST, "%s is too large (%zu bytes, limit %u)", what, len,
				SFW_MANIFEST_MAX);
	/* what is "manifest '<path>'": the signature is '<path>.minisig' */
	char sig_name[300];
	const char *q1 = strchr(what, '\''), *q2 = strrchr(what, '\'');
	if (q1 && q2 > q1 + 1)
		snprintf(sig_name, sizeof(sig_name), "%.*s.minisig", (int)(q2 - q1 - 1), q1 + 1);
	else
		snprintf(sig_name, sizeof(sig_name), "%s.minisig", what);
	/* Pick the trusted key by the signature's key id. */
	struct sfwi_minisig *ms = sfw_malloc(sizeof(*ms));
	struct sfw_minisig_info *inf = sfw_malloc(sizeof(*inf));
	enum sfw_status s = SFW_OK;
	if (!ms || !inf) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	if ((s = sfwi_minisig_parse(sig_text, sig_len, sig_name, ms, err)) != SFW_OK)
		goto out;
	struct sfw_pubkey pinned;
	const struct sfw_pubkey *keys = p->keys;
	size_t nkeys = p->nkeys;
	if (!keys || nkeys == 0) {
		sfw_pubkey_pinned(&pinned);
		keys = &pinned;
		nkeys = 1;
	}
	const struct sfw_pubkey *key = &keys[0];
	for (size_t i = 0; i < nkeys; i++)
		if (memcmp(keys[i].key_id, ms->key_id, 8) == 0)
			key = &keys[i];
	if ((s = sfw_minisig_verify(bytes, len, sig_text, sig_len, sig_name, key, p->require_prehashed, inf,
				    err)) != SFW_OK)
		goto out;
	/* Only now does the JSON parser see the bytes. */
	if ((s = sfw_manifest_parse(bytes, len, what, m, err)) != SFW_OK)
		goto out;
	char kid[17];
	sfw_pubkey_id_hex(key->key_id, kid);
	if (strcmp(kid, m->publisher_key_id) != 0) {
		s = sfw_fail(err, SFW_E_MANIFEST, "%s names publisher key %s but was signed by key %s", what,
			     m->publisher_key_id, kid);
		goto out;
	}
	if (p->repo_id && strcmp(p->repo_id, m->repo_id) != 0) {
		s = sfw_fail(err, SFW_E_MANIFEST, "%s is for repo '%s', not the requested '%s'", what,
			     m->repo_id, p->repo_id);
		goto out;
	}
	if (p->revision && strcmp(p->revision, m->revision) != 0) {
		s = sfw_fail(err, SFW_E_MANIFEST, "%s is for revision %s, not the requested %.64s", what,
			     m->revision, p->revision);
		goto out;
	}
	if ((s = check_trusted_comment(inf->trusted_comment, m, what, err)) != SFW_OK)
		goto out;
	if ((s = check_pin(m, what, err)) != SFW_OK)
		goto out;
	int64_t now = p->now ? p->now : (int64_t)time(NULL);
	if (now >= m->expires) {
		char e[21], n[21];
		sfwi_format_rfc3339(m->expires, e);
		sfwi_format_rfc3339(now, n);
		if (!p->allow_expired) {
			s = sfw_fail(err, SFW_E_MANIFEST, "%s expired at %s (this machine's clock says %s)",
				     what, e, n);
			goto out;
		}
		sfw_log(SFW_LOG_WARN, "%s expired at %s (clock says %s); the signed bytes are still valid",
			what, e, n);
	}
	if ((s = check_ratchet(m, p, what, err)) != SFW_OK)
		goto out;
	if (info)
		memcpy(info, inf, sizeof(*info));
out:
	if (s != SFW_OK || !out)
		sfw_manifest_release(m);
	sfw_free(ms);
	sfw_free(inf);
	return s;
}
