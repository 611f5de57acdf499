/* publish.c - the publisher side of manifests: hash a directory into a sorted
 * manifest v1, and sign one (binding the trusted comment to its content). */
#include "verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_FILES 100000

struct sfw_manifest_build_params sfw_manifest_build_default_params(void)
{
	struct sfw_manifest_build_params p;
	memset(&p, 0, sizeof(p));
	return p;
}

struct collect {
	char **paths;
	size_t n, cap;
	struct sfw_err *err;
	enum sfw_status s;
	const char *root;
};

/* "*.tmp.*": a temporary file another writer has not renamed yet (core/file.h's
 * "<name>.tmp.<pid>.<n>", and the same pattern .gitignore keeps out) is never
 * part of the tree. */
static int atomic_tmp_name(const char *name)
{
	return fnmatch("*.tmp.*", name, 0) == 0;
}

static void collect_fail(struct collect *c, enum sfw_status code, const char *fmt, const char *a,
			 const char *b)
{
	if (c->s == SFW_OK)
		c->s = sfw_fail(c->err, code, fmt, a, b);
}

static void walk(struct collect *c, int fd, const char *prefix, int depth)
{
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		collect_fail(c, SFW_E_IO, "cannot read directory '%s/%s'", c->root, prefix);
		return;
	}
	struct dirent *e;
	while (c->s == SFW_OK && (errno = 0, e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (sfwi_skip_dir_entry(prefix, e->d_name, depth) || atomic_tmp_name(e->d_name))
			continue; /* the tool's own state, git's, the HF cache, temporary files */
		char rel[4096];
		if ((size_t)snprintf(rel, sizeof(rel), "%s%s%s", prefix, *prefix ? "/" : "", e->d_name) >=
		    sizeof(rel)) {
			collect_fail(c, SFW_E_PATH, "path under '%s' is too long ('%s...')", c->root, prefix);
			break;
		}
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			collect_fail(c, SFW_E_IO, "cannot stat '%s/%s'", c->root, rel);
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			if (depth >= 64) {
				collect_fail(c, SFW_E_PATH, "'%s/%s' is nested too deeply", c->root, rel);
				break;
			}
			int sub =
			    openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				collect_fail(c, SFW_E_IO, "cannot open directory '%s/%s'", c->root, rel);
				break;
			}
			walk(c, sub, rel, depth + 1);
			continue;
		}
		if (!S_ISREG(st.st_mode)) {
			collect_fail(
			    c, SFW_E_PATH,
			    "'%s/%s' is a symlink or special file: a manifest lists regular files only",
			    c->root, rel);
			break;
		}
		if (c->n == MAX_FILES) {
			collect_fail(c, SFW_E_RANGE, "'%s' has more than 100000 files%s", c->root, "");
			break;
		}
		if (c->n == c->cap) {
			size_t nc = c->cap ? c->cap * 2 : 64;
			char **np = sfw_realloc(c->paths, nc * sizeof(*np));
			if (!np) {
				collect_fail(c, SFW_E_NOMEM, "out of memory%s%s", "", "");
				break;
			}
			c->paths = np;
			c->cap = nc;
		}
		if (!(c->paths[c->n] = sfw_strdup(rel))) {
			collect_fail(c, SFW_E_NOMEM, "out of memory%s%s", "", "");
			break;
		}
		c->n++;
	}
	if (c->s == SFW_OK && errno != 0)
		collect_fail(c, SFW_E_IO, "cannot read directory '%s/%s'", c->root, prefix);
	closedir(d);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct hjob {
	const char *dir;
	char **paths;
	unsigned char (*sha)[32];
	uint64_t *size;
	pthread_mutex_t lock;
	struct sfw_err err;
	enum sfw_status s;
};

static void hash_some(void *ctx, size_t b, size_t e, int tid)
{
	(void)tid;
	struct hjob *j = ctx;
	for (size_t i = b; i < e; i++) {
		struct sfw_err err = {0};
		char *full = sfw_path_join(j->dir, j->paths[i]);
		enum sfw_status s = full ? sfw_sha256_file(full, j->sha[i], &j->size[i], &err)
					 : sfw_fail(&err, SFW_E_NOMEM, "out of memory");
		sfw_free(full);
		if (s != SFW_OK) {
			pthread_mutex_lock(&j->lock);
			if (j->s == SFW_OK) {
				j->s = s;
				j->err = err;
			}
			pthread_mutex_unlock(&j->lock);
		}
	}
}

/* JSON string literal; the text is valid UTF-8 already (checked paths/URLs). */
static enum sfw_status put_str(struct sfw_buf *b, const char *s)
{
	enum sfw_status st = sfw_buf_append(b, "\"", 1);
	for (const char *p = s; *p && st == SFW_OK; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '"' || c == '\\')
			st = sfw_buf_printf(b, "\\%c", c);
		else if (c < 0x20)
			st = sfw_buf_printf(b, "\\u%04x", c);
		else
			st = sfw_buf_append(b, p, 1);
	}
	return st == SFW_OK ? sfw_buf_append(b, "\"", 1) : st;
}

/* The text b parses as a manifest; placeholder: its empty key_id is
 * filled in for the parse (sfw_manifest_sign fills it for real). */
static enum sfw_status probe_parses(const struct sfw_buf *b, int placeholder, struct sfw_err *err)
{
	char *probe = sfw_strndup(b->data, b->len);
	if (!probe)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	char *k = placeholder ? strstr(probe, "\"key_id\": \"\"") : NULL;
	struct sfw_buf pb;
	sfw_buf_init(&pb, SFW_MANIFEST_MAX + 32);
	enum sfw_status s;
	if (k) {
		*k = '\0';
		s = sfw_buf_printf(&pb, "%s\"key_id\": \"0000000000000000\"%s", probe, k + 12);
	} else {
		s = sfw_buf_append(&pb, probe, strlen(probe));
	}
	struct sfw_manifest m;
	if (s == SFW_OK)
		s = sfw_manifest_parse(pb.data, pb.len, "new manifest", &m, err);
	else
		sfw_fail(err, s, "out of memory");
	if (s == SFW_OK)
		sfw_manifest_release(&m);
	sfw_buf_release(&pb);
	sfw_free(probe);
	return s;
}

enum sfw_status sfw_manifest_build(const char *dir, const struct sfw_manifest_build_params *p, char **text,
				   size_t *len, struct sfw_err *err)
{
	*text = NULL;
	*len = 0;
	if (!p->repo_id || !p->revision)
		return sfw_fail(err, SFW_E_INVAL, "a manifest needs a repo id and a revision");
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
	struct collect c = {.err = err, .root = dir};
	walk(&c, fd, "", 0);
	struct hjob j = {.dir = dir};
	enum sfw_status s = c.s;
	struct sfw_buf b;
	sfw_buf_init(&b, SFW_MANIFEST_MAX);
	if (s != SFW_OK)
		goto out;
	if (c.n == 0) {
		s = sfw_fail(err, SFW_E_INVAL, "'%s' has no files to list", dir);
		goto out;
	}
	qsort(c.paths, c.n, sizeof(*c.paths), cmp_str);
	for (size_t i = 0; i < c.n; i++) {
		if ((s = sfw_path_check(c.paths[i], err)) != SFW_OK) {
			sfw_err_prefix(err, "'%s'", dir);
			goto out;
		}
	}
	j.paths = c.paths;
	j.sha = sfw_calloc(c.n, sizeof(*j.sha));
	j.size = sfw_calloc(c.n, sizeof(*j.size));
	if (!j.sha || !j.size) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	pthread_mutex_init(&j.lock, NULL);
	sfw_parallel_for(p->threads > 0 ? p->threads : sfw_default_threads(), c.n, 1, hash_some, &j);
	pthread_mutex_destroy(&j.lock);
	if (j.s != SFW_OK) {
		s = j.s;
		if (err)
			*err = j.err;
		goto out;
	}
	uint64_t total = 0;
	for (size_t i = 0; i < c.n; i++)
		total += j.size[i];
	int64_t created = p->created ? p->created : (int64_t)time(NULL);
	int64_t expires = p->expires ? p->expires : created + 180 * 86400;
	char cr[21], ex[21];
	sfwi_format_rfc3339(created, cr);
	sfwi_format_rfc3339(expires, ex);
	char gen[64];
	snprintf(gen, sizeof(gen), "salafw/%s", SFW_VERSION);
	s = sfw_buf_printf(&b, "{\n  \"schema_version\": 1,\n  \"generator\": ");
	if (s == SFW_OK)
		s = put_str(&b, p->generator ? p->generator : gen);
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, ",\n  \"publisher\": {\"key_id\": ");
	if (s == SFW_OK)
		s = put_str(&b, p->key_id ? p->key_id : "");
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "},\n  \"repo_type\": \"model\",\n  \"repo_id\": ");
	if (s == SFW_OK)
		s = put_str(&b, p->repo_id);
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, ",\n  \"revision\": ");
	if (s == SFW_OK)
		s = put_str(&b, p->revision);
	/* a derived model's parent and recipe (checked by the probe below) */
	if (s == SFW_OK && p->lineage_json)
		s = sfw_buf_printf(&b, ",\n  \"lineage\": %s", p->lineage_json);
	if (s == SFW_OK)
		s = sfw_buf_printf(
		    &b,
		    ",\n  \"manifest_version\": %llu,\n  \"created\": \"%s\",\n  \"expires\": \"%s\",\n"
		    "  \"total_size\": %llu,\n  \"files\": [\n",
		    (unsigned long long)(p->manifest_version ? p->manifest_version : 1), cr, ex,
		    (unsigned long long)total);
	for (size_t i = 0; i < c.n && s == SFW_OK; i++) {
		char hex[65];
		sfw_hex_encode(j.sha[i], 32, hex);
		s = sfw_buf_printf(&b, "    {\"path\": ");
		if (s == SFW_OK)
			s = put_str(&b, c.paths[i]);
		if (s == SFW_OK)
			s = sfw_buf_printf(&b, ", \"size\": %llu, \"sha256\": \"%s\"}%s\n",
					   (unsigned long long)j.size[i], hex, i + 1 < c.n ? "," : "");
	}
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "  ],\n  \"sources\": [");
	for (size_t i = 0; i < p->nsources && s == SFW_OK; i++) {
		const struct sfw_source *so = &p->sources[i];
		s = sfw_buf_printf(&b, "%s\n    {\"kind\": \"%s\", \"%s\": ", i ? "," : "",
				   so->kind == SFW_SOURCE_HF ? "hf" : "http",
				   so->kind == SFW_SOURCE_HF ? "endpoint" : "base_url");
		if (s == SFW_OK)
			s = put_str(&b, so->url);
		if (s == SFW_OK && so->name) {
			s = sfw_buf_printf(&b, ", \"name\": ");
			if (s == SFW_OK)
				s = put_str(&b, so->name);
		}
		if (s == SFW_OK)
			s = sfw_buf_append(&b, "}", 1);
	}
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "%s]\n}\n", p->nsources ? "\n  " : "");
	if (s != SFW_OK) {
		s = sfw_fail(err, SFW_E_RANGE, "the manifest for '%s' would pass the %u-byte limit", dir,
			     SFW_MANIFEST_MAX);
		goto out;
	}
	/* What we write must be what verifiers accept (a placeholder key id aside). */
	if ((s = probe_parses(&b, !p->key_id, err)) != SFW_OK)
		goto out;
	*text = sfw_buf_take(&b, len);
out:
	for (size_t i = 0; i < c.n; i++)
		sfw_free(c.paths[i]);
	sfw_free(c.paths);
	sfw_free(j.sha);
	sfw_free(j.size);
	sfw_buf_release(&b);
	return s;
}

enum sfw_status sfw_manifest_sign(const char *path, const struct sfw_seckey *key, struct sfw_err *err)
{
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(path, SFW_MANIFEST_MAX, &b, err);
	if (s == SFW_E_MISSING) { /* a local input problem: exit 5, not 1 */
		if (err)
			err->code = SFW_E_IO;
		return SFW_E_IO;
	}
	if (s != SFW_OK)
		return s;
	char kid[17];
	sfw_pubkey_id_hex(key->key_id, kid);
	/* Bind the placeholder written by `salafw manifest` without a key. The
	 * new bytes are parsed, checked and signed before anything is written. */
	static const char ph[] = "\"key_id\": \"\"";
	char *hit = strstr(b.data, ph);
	int rewritten = 0;
	if (hit && !strstr(hit + 1, ph)) {
		struct sfw_buf nb;
		sfw_buf_init(&nb, SFW_MANIFEST_MAX + 32);
		size_t pre = (size_t)(hit - b.data);
		if (sfw_buf_append(&nb, b.data, pre) != SFW_OK ||
		    sfw_buf_printf(&nb, "\"key_id\": \"%s\"", kid) != SFW_OK ||
		    sfw_buf_append(&nb, hit + sizeof(ph) - 1, b.len - pre - (sizeof(ph) - 1)) != SFW_OK) {
			sfw_buf_release(&nb);
			sfw_buf_release(&b);
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		}
		sfw_buf_release(&b);
		b = nb;
		rewritten = 1;
	}
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", path);
	struct sfw_manifest m;
	s = sfw_manifest_parse(b.data, b.len, what, &m, err);
	char tc[512];
	if (s == SFW_OK) {
		if (strcmp(m.publisher_key_id, kid) != 0)
			s = sfw_fail(err, SFW_E_MANIFEST, "%s names publisher key %s, but the signing key is %s",
				     what, m.publisher_key_id, kid);
		snprintf(tc, sizeof(tc), "salafw-manifest repo_id=%s revision=%s manifest_version=%llu", m.repo_id,
			 m.revision, (unsigned long long)m.manifest_version);
		sfw_manifest_release(&m);
	}
	/* the manifest first, then its signature over exactly those bytes */
	if (s == SFW_OK && rewritten)
		s = sfw_write_file_atomic(path, b.data, b.len, err);
	if (s == SFW_OK)
		s = sfw_sign_bytes(b.data, b.len, path, key, tc, err);
	sfw_buf_release(&b);
	return s;
}
