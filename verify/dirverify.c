/* dirverify.c - checks a model directory against a manifest (sizes first,
 * then sha256 with several files hashed in parallel), and keeps the record of
 * what was verified in DIR/.salafw/state.json so the runner can check with
 * stat() alone that nothing changed since.
 *
 * Every path is resolved relative to a directory handle, one segment at a time
 * with O_NOFOLLOW: a symlink anywhere in a manifest path is refused, never
 * followed out of the tree. Nothing here writes to a model file. */
#include "verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "json.h"
#include "log.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* 256 KiB: half of a core's L2, so read() fills it and SHA-256 consumes it
 * without a trip to memory in between. */
#define READ_BUF (256u << 10)
#define STATE_MAX (16u << 20)

struct sfw_verify_params sfw_verify_default_params(void)
{
	struct sfw_verify_params p;
	memset(&p, 0, sizeof(p));
	return p;
}

/* Resolves rel under dirfd without following symlinks. Returns an O_PATH-free
 * parent fd in *parent (caller closes) and the last segment's name, or sets
 * *res to MISSING / NOT_REGULAR. On success the lstat of the target is in *st. */
enum walk_res { WALK_OK, WALK_MISSING, WALK_NOT_REGULAR, WALK_IO };

static enum walk_res walk_stat(int dirfd, const char *rel, struct stat *st, int open_it, int *fd_out,
			       int *eno)
{
	char buf[1100];
	size_t n = strlen(rel);
	*eno = 0;
	if (fd_out)
		*fd_out = -1;
	if (n >= sizeof(buf))
		return WALK_NOT_REGULAR;
	memcpy(buf, rel, n + 1);
	int cur = dirfd;
	char *seg = buf;
	enum walk_res r = WALK_OK;
	for (;;) {
		char *slash = strchr(seg, '/');
		if (!slash)
			break;
		*slash = '\0';
		int next = openat(cur, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			*eno = errno;
			struct stat lst;
			if (errno == ENOENT)
				r = WALK_MISSING;
			else if (errno == ELOOP || errno == ENOTDIR ||
				 (fstatat(cur, seg, &lst, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(lst.st_mode)))
				r = WALK_NOT_REGULAR;
			else
				r = WALK_IO;
			goto out;
		}
		if (cur != dirfd)
			close(cur);
		cur = next;
		seg = slash + 1;
	}
	if (fstatat(cur, seg, st, AT_SYMLINK_NOFOLLOW) != 0) {
		*eno = errno;
		r = errno == ENOENT ? WALK_MISSING : errno == ENOTDIR ? WALK_NOT_REGULAR : WALK_IO;
		goto out;
	}
	if (!S_ISREG(st->st_mode)) {
		r = WALK_NOT_REGULAR;
		goto out;
	}
	if (open_it) {
		int fd = openat(cur, seg, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		struct stat st2;
		if (fd < 0) {
			*eno = errno;
			r = errno == ENOENT ? WALK_MISSING : errno == ELOOP ? WALK_NOT_REGULAR : WALK_IO;
			goto out;
		}
		/* The file we opened must be the one we looked at. */
		if (fstat(fd, &st2) != 0 || !S_ISREG(st2.st_mode) || st2.st_ino != st->st_ino ||
		    st2.st_dev != st->st_dev) {
			close(fd);
			r = WALK_NOT_REGULAR;
			goto out;
		}
		*st = st2;
		*fd_out = fd;
	}
out:
	if (cur != dirfd)
		close(cur);
	return r;
}

/* ---- directory verification ----------------------------------------------------------- */

struct vjob {
	int dirfd;
	const char *dir;
	const struct sfw_manifest *m;
	const struct sfw_verify_params *p;
	enum sfw_file_result *res;
	struct sfw_file_id *ids;
	size_t *order;	      /* indices of files to hash, largest first */
	unsigned char **bufs; /* one per thread */
	pthread_mutex_t lock;
	struct sfw_err io_err;
	int io_failed;
};

static void io_fail(struct vjob *j, enum sfw_status code, const char *fmt, const char *a, const char *b)
{
	pthread_mutex_lock(&j->lock);
	if (!j->io_failed) {
		j->io_failed = 1;
		sfw_fail(&j->io_err, code, fmt, a, b);
	}
	pthread_mutex_unlock(&j->lock);
}

/* One file's sha256 check; *changed = 1 when its size or times moved while
 * it was read (the bytes hashed are then no version of the file). */
static enum sfw_file_result hash_one(struct vjob *j, size_t i, int tid, int *changed)
{
	const struct sfw_manifest_file *f = &j->m->files[i];
	struct stat st;
	int fd, eno;
	*changed = 0;
	enum walk_res w = walk_stat(j->dirfd, f->path, &st, 1, &fd, &eno);
	if (w == WALK_MISSING)
		return SFW_FILE_MISSING;
	if (w == WALK_NOT_REGULAR)
		return SFW_FILE_NOT_REGULAR;
	if (w == WALK_IO) {
		io_fail(j, SFW_E_IO, "cannot open '%s/%s'", j->dir, f->path);
		return SFW_FILE_MISSING;
	}
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	struct sfw_sha256 h;
	uint64_t done = 0;
	int bad_io = 0;
	if (sfw_sha256_init(&h) != SFW_OK) {
		io_fail(j, SFW_E_NOMEM, "out of memory hashing '%s/%s'", j->dir, f->path);
		close(fd);
		return SFW_FILE_MISSING;
	}
	for (;;) {
		ssize_t n = read(fd, j->bufs[tid], READ_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			bad_io = 1;
			break;
		}
		if (n == 0)
			break;
		sfw_sha256_update(&h, j->bufs[tid], (size_t)n);
		done += (uint64_t)n;
	}
	unsigned char d[32];
	sfw_sha256_final(&h, d);
	sfw_sha256_release(&h);
	/* the file as it is after the last byte was read: the id a record
	 * vouches for */
	struct stat after;
	*changed = fstat(fd, &after) != 0 || after.st_size != st.st_size ||
		   after.st_mtim.tv_sec != st.st_mtim.tv_sec || after.st_mtim.tv_nsec != st.st_mtim.tv_nsec ||
		   after.st_ctim.tv_sec != st.st_ctim.tv_sec || after.st_ctim.tv_nsec != st.st_ctim.tv_nsec;
	close(fd);
	if (bad_io) {
		io_fail(j, SFW_E_IO, "cannot read '%s/%s'", j->dir, f->path);
		return SFW_FILE_MISSING;
	}
	if (*changed || done != f->size)
		return done != f->size ? SFW_FILE_SIZE : SFW_FILE_HASH;
	enum sfw_file_result r = CRYPTO_memcmp(d, f->sha256, 32) == 0 ? SFW_FILE_OK : SFW_FILE_HASH;
	if (r == SFW_FILE_OK)
		sfw_file_id_of(&after, &j->ids[i]);
	return r;
}

static void hash_range(void *ctx, size_t begin, size_t end, int tid)
{
	struct vjob *j = ctx;
	for (size_t k = begin; k < end; k++) {
		size_t i = j->order[k];
		int changed;
		enum sfw_file_result r = hash_one(j, i, tid, &changed);
		if (changed) /* touched while read (chmod, touch, a writer): once more */
			r = hash_one(j, i, tid, &changed);
		if (changed)
			sfw_log(SFW_LOG_WARN, "'%s/%s' changed while it was being verified", j->dir, j->m->files[i].path);
		j->res[i] = r;
		if (j->p->on_file)
			j->p->on_file(j->p->user, &j->m->files[i], r);
	}
}

struct extra_walk {
	const struct sfw_manifest *m;
	char **list;
	size_t n, cap;
	size_t seen;
	int failed;
};

static int cmp_file_path(const void *key, const void *elem)
{
	return strcmp((const char *)key, ((const struct sfw_manifest_file *)elem)->path);
}

static int add_extra(struct extra_walk *w, const char *rel)
{
	if (w->n == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 16;
		char **nl = sfw_realloc(w->list, nc * sizeof(*nl));
		if (!nl)
			return -1;
		w->list = nl;
		w->cap = nc;
	}
	if (!(w->list[w->n] = sfw_strdup(rel)))
		return -1;
	w->n++;
	return 0;
}

/* Lists every non-directory under fd that the manifest does not name; never
 * descends into a symlink; skips the top-level .salafw state folder. */
static void walk_extra(struct extra_walk *w, int fd, const char *prefix, int depth)
{
	if (depth > 64 || w->failed) {
		close(fd);
		return;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) && !w->failed) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (sfwi_skip_dir_entry(prefix, e->d_name, depth))
			continue;
		if (++w->seen > 1000000) {
			w->failed = 1;
			break;
		}
		char rel[4096];
		snprintf(rel, sizeof(rel), "%s%s%s", prefix, *prefix ? "/" : "", e->d_name);
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			int sub =
			    openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				walk_extra(w, sub, rel, depth + 1);
			continue;
		}
		if (!bsearch(rel, w->m->files, w->m->nfiles, sizeof(*w->m->files), cmp_file_path) &&
		    add_extra(w, rel) != 0)
			w->failed = 1;
	}
	closedir(d);
}

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
	const struct sfw_manifest *m = ctx;
	uint64_t x = m->files[*(const size_t *)a].size, y = m->files[*(const size_t *)b].size;
	return x < y ? 1 : x > y ? -1 : 0;
}

void sfw_verify_report_release(struct sfw_verify_report *rep)
{
	if (!rep)
		return;
	sfw_free(rep->results);
	sfw_free(rep->ids);
	for (size_t i = 0; i < rep->nextra; i++)
		sfw_free(rep->extra[i]);
	sfw_free(rep->extra);
	memset(rep, 0, sizeof(*rep));
}

static const char *result_text(enum sfw_file_result r)
{
	switch (r) {
	case SFW_FILE_OK:
		return "ok";
	case SFW_FILE_MISSING:
		return "missing";
	case SFW_FILE_SIZE:
		return "size mismatch";
	case SFW_FILE_HASH:
		return "sha256 mismatch";
	case SFW_FILE_NOT_REGULAR:
		return "not a regular file (symlink or special file, or under a symlinked folder)";
	}
	return "?";
}

/* The state record after every file of m was checked (rep): ok files with
 * the id they had when hashed, bad ones lose their records. A failure to
 * write it is the error only when every file matched; otherwise the
 * mismatch is the news and the record is secondary (a warning). */
static enum sfw_status record_checked(const char *dir, const struct sfw_manifest *m,
				      const struct sfw_verify_report *rep, struct sfw_err *err)
{
	size_t n = m->nfiles;
	struct sfw_state_file *sf = sfw_calloc(n ? n : 1, sizeof(*sf));
	if (!sf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		sf[i].path = m->files[i].path;
		sf[i].ok = rep->results[i] == SFW_FILE_OK;
		sf[i].id = rep->ids[i];
	}
	struct sfw_err rerr = {0};
	enum sfw_status s = sfw_state_record(dir, m, sf, n, &rerr);
	sfw_free(sf);
	if (s != SFW_OK && rep->nbad == 0) {
		if (err)
			*err = rerr;
		return s;
	}
	if (s != SFW_OK)
		sfw_log(SFW_LOG_WARN, "%s", rerr.msg);
	return SFW_OK;
}

enum sfw_status sfw_verify_dir(const char *dir, const struct sfw_manifest *m,
			       const struct sfw_verify_params *p, struct sfw_verify_report *rep,
			       struct sfw_err *err)
{
	struct sfw_verify_params defaults = sfw_verify_default_params();
	if (!p)
		p = &defaults;
	memset(rep, 0, sizeof(*rep));
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
	size_t n = m->nfiles;
	rep->results = sfw_calloc(n ? n : 1, sizeof(*rep->results));
	rep->ids = sfw_calloc(n ? n : 1, sizeof(*rep->ids));
	size_t *order = sfw_calloc(n ? n : 1, sizeof(*order));
	struct vjob j;
	memset(&j, 0, sizeof(j));
	enum sfw_status s = SFW_OK;
	if (!rep->results || !rep->ids || !order) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	/* Pass 1: existence, type and size (cheap), so a short file is never hashed. */
	size_t nhash = 0;
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		int eno;
		enum walk_res w = walk_stat(dfd, m->files[i].path, &st, 0, NULL, &eno);
		enum sfw_file_result r = SFW_FILE_OK;
		if (w == WALK_MISSING)
			r = SFW_FILE_MISSING;
		else if (w == WALK_NOT_REGULAR)
			r = SFW_FILE_NOT_REGULAR;
		else if (w == WALK_IO) {
			s = sfw_fail(err, SFW_E_IO, "cannot read '%s/%s': %s", dir, m->files[i].path,
				     strerror(eno));
			goto out;
		} else if ((uint64_t)st.st_size != m->files[i].size)
			r = SFW_FILE_SIZE;
		else
			order[nhash++] = i;
		rep->results[i] = r;
		if (r != SFW_FILE_OK && p->on_file)
			p->on_file(p->user, &m->files[i], r);
	}
	/* Pass 2: sha256, largest files first so the threads finish together. */
	qsort_r(order, nhash, sizeof(*order), cmp_size_desc, (void *)m);
	int threads = p->threads > 0 ? p->threads : sfw_default_threads();
	if ((size_t)threads > nhash)
		threads = nhash ? (int)nhash : 1;
	if (threads > 256)
		threads = 256;
	j.dirfd = dfd;
	j.dir = dir;
	j.m = m;
	j.p = p;
	j.res = rep->results;
	j.ids = rep->ids;
	j.order = order;
	pthread_mutex_init(&j.lock, NULL);
	j.bufs = sfw_calloc((size_t)threads, sizeof(*j.bufs));
	for (int t = 0; j.bufs && t < threads; t++)
		if (!(j.bufs[t] = sfw_malloc_aligned(4096, READ_BUF)))
			break;
	if (!j.bufs || !j.bufs[threads - 1]) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out_lock;
	}
	if (nhash)
		sfw_parallel_for(threads, nhash, 1, hash_range, &j);
	if (j.io_failed) {
		s = j.io_err.code;
		if (err)
			*err = j.io_err;
		goto out_lock;
	}
	/* Extra files: a warning, not a failure. */
	struct extra_walk ew = {.m = m};
	int wfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (wfd >= 0)
		walk_extra(&ew, wfd, "", 0);
	if (ew.failed)
		sfw_log(SFW_LOG_WARN, "'%s': the list of extra files is incomplete", dir);
	rep->extra = ew.list;
	rep->nextra = ew.n;
	/* Summary status: the worst kind of problem decides the code, the first
	 * bad file names it. Ranks follow enum sfw_file_result. */
	size_t first = n, nbad = 0;
	enum sfw_file_result worst = SFW_FILE_OK;
	for (size_t i = 0; i < n; i++) {
		if (rep->results[i] == SFW_FILE_OK)
			continue;
		nbad++;
		if (first == n)
			first = i;
		if (rep->results[i] > worst)
			worst = rep->results[i];
	}
	rep->nbad = nbad;
	if (p->record_state && (s = record_checked(dir, m, rep, err)) != SFW_OK)
		goto out_lock;
	if (nbad) {
		/* the file named is one of the worst kind, so message and code agree */
		for (size_t i = 0; i < n; i++)
			if (rep->results[i] == worst) {
				first = i;
				break;
			}
		static const enum sfw_status code[] = {SFW_OK, SFW_E_MISSING, SFW_E_SIZE, SFW_E_HASH,
						       SFW_E_PATH};
		char more[64] = "";
		if (nbad > 1)
			snprintf(more, sizeof(more), " (%zu of %zu files failed)", nbad, n);
		s = sfw_fail(err, code[worst], "'%s/%s': %s%s", dir, m->files[first].path,
			     result_text(rep->results[first]), more);
	}
out_lock:
	if (j.bufs)
		for (int t = 0; t < threads; t++)
			sfw_free(j.bufs[t]);
	sfw_free(j.bufs);
	pthread_mutex_destroy(&j.lock);
out:
	sfw_free(order);
	close(dfd);
	if (s != SFW_OK && s != SFW_E_MISSING && s != SFW_E_SIZE && s != SFW_E_HASH && s != SFW_E_PATH)
		sfw_verify_report_release(rep);
	return s;
}

/* ---- the verified-state record ---------------------------------------------------------- */

static char *salafw_file(const char *dir, const char *name)
{
	char rel[64];
	snprintf(rel, sizeof(rel), ".salafw/%s", name);
	return sfw_path_join(dir, rel);
}

enum sfw_status sfw_state_dir_open(const char *dir, const char *sub, int write, int *out, struct sfw_err *err)
{
	*out = -1;
	int dfd, sfd = -1;
	enum sfw_status s = sfw_dir_open(dir, &dfd, err);
	if (s != SFW_OK)
		return s;
	int flags = write ? SFW_DIR_CREATE | SFW_DIR_OWNED : 0;
	char *shown = sfw_path_join(dir, ".salafw");
	if (!shown)
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (s == SFW_OK)
		s = sfw_dir_openat(dfd, dir, ".salafw", flags, &sfd, err);
	close(dfd);
	if (s == SFW_OK && sub) {
		int pfd;
		s = sfw_dir_openat(sfd, shown, sub, flags, &pfd, err);
		close(sfd);
		sfd = pfd;
	}
	sfw_free(shown);
	if (s == SFW_OK)
		*out = sfd;
	return s;
}

/* flock on the .salafw folder itself: writers of state.json and of the
 * manifest pair hold it exclusively, readers of the pair shared. A file
 * system without flock is no lock (fetch-verify.md §3.9). */
static void lock_dir(int sfd, int how)
{
	while (flock(sfd, how) != 0 && errno == EINTR)
		;
}

static void sweep_stale(int sfd);

static int64_t ts_ns(struct timespec t)
{
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* 64-bit fields that may pass 2^53 are kept as decimal strings. */
static int add_u64_str(cJSON *o, const char *k, unsigned long long v)
{
	char b[32];
	snprintf(b, sizeof(b), "%llu", v);
	return cJSON_AddStringToObject(o, k, b) ? 0 : -1;
}

static int get_u64_str(const cJSON *o, const char *k, unsigned long long *v)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
	if (!cJSON_IsString(it) || !it->valuestring[0] ||
	    strspn(it->valuestring, "0123456789") != strlen(it->valuestring) || strlen(it->valuestring) > 20)
		return -1;
	errno = 0;
	*v = strtoull(it->valuestring, NULL, 10);
	return errno ? -1 : 0;
}

/* DIR/.salafw/state.json read through the open .salafw folder (no symlink). */
static enum sfw_status load_state(int sfd, const char *dir, cJSON **out, struct sfw_err *err)
{
	*out = NULL;
	char *path = salafw_file(dir, "state.json");
	if (!path)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_buf b;
	enum sfw_status s = sfw_read_fileat(sfd, "state.json", path, STATE_MAX, &b, err);
	if (s == SFW_OK) {
		s = sfw_json_parse(b.data, b.len, path, out, err);
		sfw_buf_release(&b);
		if (s == SFW_OK && !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(*out, "files"))) {
			cJSON_Delete(*out);
			*out = NULL;
			s = sfw_fail(err, SFW_E_FORMAT, "'%s' has no 'files' object", path);
		}
	}
	sfw_free(path);
	return s;
}

void sfw_file_id_of(const struct stat *st, struct sfw_file_id *id)
{
	id->size = (uint64_t)st->st_size;
	id->ino = (uint64_t)st->st_ino;
	id->dev = (uint64_t)st->st_dev;
	id->mtime_ns = (uint64_t)ts_ns(st->st_mtim);
	id->ctime_ns = (uint64_t)ts_ns(st->st_ctim);
}

enum sfw_status sfw_state_record(const char *dir, const struct sfw_manifest *m, const struct sfw_state_file *sf,
				 size_t npaths, struct sfw_err *err)
{
	char hex[65];
	sfw_hex_encode(m->manifest_sha256, 32, hex);
	cJSON *old = NULL, *root = cJSON_CreateObject(), *files = NULL;
	enum sfw_status s = SFW_OK;
	int dfd = -1, sfd = -1;
	char *spath = NULL;
	if (!root || !(files = cJSON_CreateObject())) {
		cJSON_Delete(files);
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	if (!cJSON_AddNumberToObject(root, "version", 1) ||
	    !cJSON_AddStringToObject(root, "manifest_sha256", hex) ||
	    !cJSON_AddStringToObject(root, "repo_id", m->repo_id) ||
	    !cJSON_AddStringToObject(root, "revision", m->revision)) {
		cJSON_Delete(files);
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	cJSON_AddItemToObject(root, "files", files);
	/* The folder written into: a real one of this user's (never a planted
	 * symlink), locked while state.json is read, changed and replaced, so
	 * two writers cannot drop each other's records. */
	if ((s = sfw_state_dir_open(dir, NULL, 1, &sfd, err)) != SFW_OK)
		goto out;
	lock_dir(sfd, LOCK_EX);
	sweep_stale(sfd);
	/* Keep earlier records made for the same manifest (get records as it goes). */
	if (load_state(sfd, dir, &old, NULL) == SFW_OK) {
		const cJSON *sha = cJSON_GetObjectItemCaseSensitive(old, "manifest_sha256");
		if (cJSON_IsString(sha) && strcmp(sha->valuestring, hex) == 0) {
			cJSON *e;
			cJSON *of = cJSON_GetObjectItemCaseSensitive(old, "files");
			cJSON_ArrayForEach(e, of)
			{
				if (!bsearch(e->string, m->files, m->nfiles, sizeof(*m->files),
					     cmp_file_path))
					continue;
				int again = 0; /* checked now: recorded anew if ok, dropped if not */
				for (size_t i = 0; i < npaths && !again; i++)
					again = strcmp(sf[i].path, e->string) == 0;
				if (!again) {
					cJSON *dup = cJSON_Duplicate(e, 1);
					if (!dup) {
						s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
						goto out;
					}
					cJSON_AddItemToObject(files, e->string, dup);
				}
			}
		}
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
		goto out;
	}
	int64_t now = (int64_t)time(NULL);
	for (size_t i = 0; i < npaths; i++) {
		const struct sfw_manifest_file *f =
		    bsearch(sf[i].path, m->files, m->nfiles, sizeof(*m->files), cmp_file_path);
		if (!f) {
			s = sfw_fail(err, SFW_E_INVAL, "'%s' is not in the manifest", sf[i].path);
			goto out;
		}
		if (!sf[i].ok)
			continue;
		struct stat st;
		struct sfw_file_id now_id;
		int eno;
		if (walk_stat(dfd, f->path, &st, 0, NULL, &eno) != WALK_OK) {
			s = sfw_fail(err, SFW_E_IO, "cannot record '%s/%s': not a regular file in the tree",
				     dir, f->path);
			goto out;
		}
		sfw_file_id_of(&st, &now_id);
		if (memcmp(&now_id, &sf[i].id, sizeof(now_id)) != 0 || now_id.size != f->size) {
			s = sfw_fail(err, SFW_E_IO, "'%s/%s' changed after it was verified; verify again", dir,
				     f->path);
			goto out;
		}
		cJSON *e = cJSON_CreateObject();
		if (!e || add_u64_str(e, "size", (unsigned long long)now_id.size) ||
		    add_u64_str(e, "mtime_ns", (unsigned long long)now_id.mtime_ns) ||
		    add_u64_str(e, "ctime_ns", (unsigned long long)now_id.ctime_ns) ||
		    add_u64_str(e, "inode", (unsigned long long)now_id.ino) ||
		    add_u64_str(e, "dev", (unsigned long long)now_id.dev) ||
		    !cJSON_AddNumberToObject(e, "verified_at", (double)now)) {
			cJSON_Delete(e);
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto out;
		}
		cJSON_AddItemToObject(files, f->path, e);
	}
	spath = salafw_file(dir, "state.json");
	if (!spath) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	char *text = cJSON_Print(root);
	if (!text) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	size_t tl = strlen(text);
	text[tl] = '\0';
	struct sfw_buf b;
	sfw_buf_init(&b, STATE_MAX);
	if (sfw_buf_append(&b, text, tl) != SFW_OK || sfw_buf_append(&b, "\n", 1) != SFW_OK)
		s = sfw_fail(err, SFW_E_NOMEM, "state record too large");
	else
		s = sfw_write_file_atomicat(sfd, "state.json", spath, b.data, b.len, err);
	sfw_buf_release(&b);
	cJSON_free(text);
out:
	if (dfd >= 0)
		close(dfd);
	if (sfd >= 0)
		close(sfd); /* drops the lock */
	sfw_free(spath);
	cJSON_Delete(old);
	cJSON_Delete(root);
	return s;
}

enum sfw_status sfw_state_forget(const char *dir, const struct sfw_manifest *m, const struct sfw_verify_report *rep,
				 struct sfw_err *err)
{
	cJSON *old = NULL;
	int sfd;
	if (!rep->results || sfw_state_dir_open(dir, NULL, 0, &sfd, NULL) != SFW_OK)
		return SFW_OK; /* no record: nothing to drop */
	enum sfw_status ls = load_state(sfd, dir, &old, NULL);
	close(sfd);
	if (ls != SFW_OK)
		return SFW_OK; /* no record, or one we cannot read: nothing to drop */
	char hex[65];
	sfw_hex_encode(m->manifest_sha256, 32, hex);
	const cJSON *sha = cJSON_GetObjectItemCaseSensitive(old, "manifest_sha256");
	int same = cJSON_IsString(sha) && strcmp(sha->valuestring, hex) == 0;
	cJSON_Delete(old);
	if (!same)
		return SFW_OK;
	struct sfw_state_file *sf = sfw_calloc(m->nfiles ? m->nfiles : 1, sizeof(*sf));
	if (!sf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < m->nfiles; i++)
		if (rep->results[i] != SFW_FILE_OK)
			sf[k].path = m->files[i].path, sf[k++].ok = 0;
	enum sfw_status s = k ? sfw_state_record(dir, m, sf, k, err) : SFW_OK;
	sfw_free(sf);
	return s;
}

/* ---- the signed manifest pair, installed as one unit ----------------------------------------
 *
 * DIR/.salafw/manifest.json and manifest.json.minisig stay where readers
 * (and people) look for them; an install never leaves the two from different
 * versions, whatever instant it is killed at or runs out of space:
 *   1. the new pair is written and synced into a fresh folder
 *      .salafw/pair.tmp.<pid>.<n>/ (space runs out here, if at all);
 *   2. that folder is renamed to .salafw/manifest.next: the commit point;
 *   3. each file is renamed from manifest.next/ over its old copy, then the
 *      empty manifest.next is removed.
 * A reader takes each of the two files from manifest.next/ while it is
 * there, else from .salafw/: before 2 that is the old pair, from 2 on the
 * new one, at every step of 3 included. The next install (or pair write)
 * first finishes a step 3 that a kill interrupted and removes step-1 folders
 * left behind. A directory without manifest.next (every layout before this
 * one) reads as it always did. Writers hold an exclusive flock on .salafw,
 * readers a shared one, so a reader never sees half of step 3 between its
 * two reads. */
#define PAIR_NEXT "manifest.next"
static const char *const pair_names[2] = {"manifest.json", "manifest.json.minisig"};

/* Removes a step-1 folder (flat: regular files only), best effort. */
static void pair_tmp_remove(int sfd, const char *name)
{
	int fd = openat(sfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			(void)unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	(void)unlinkat(sfd, name, AT_REMOVEDIR);
}

/* Step 3, for an install that reached step 2. */
static enum sfw_status pair_roll_forward(int sfd, const char *sshown, struct sfw_err *err)
{
	int nfd = openat(sfd, PAIR_NEXT, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (nfd < 0 && errno == ENOENT)
		return SFW_OK;
	if (nfd < 0)
		return sfw_fail(err, errno == ELOOP || errno == ENOTDIR ? SFW_E_PATH : SFW_E_IO,
				"cannot open '%s/" PAIR_NEXT "': %s", sshown, strerror(errno));
	enum sfw_status s = SFW_OK;
	for (int i = 1; i >= 0 && s == SFW_OK; i--) { /* the signature first, then the manifest */
		struct stat st;
		if (fstatat(nfd, pair_names[i], &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue; /* moved already */
		s = sfw_renameat_checked(nfd, pair_names[i], sfd, pair_names[i], PAIR_NEXT, pair_names[i], err);
	}
	close(nfd);
	if (s == SFW_OK)
		s = sfw_fsync_dirfd(sfd, sshown, err);
	if (s == SFW_OK && unlinkat(sfd, PAIR_NEXT, AT_REMOVEDIR) != 0 && errno != ENOENT) {
		pair_tmp_remove(sfd, PAIR_NEXT); /* anything else put there goes too */
		struct stat st;
		if (fstatat(sfd, PAIR_NEXT, &st, AT_SYMLINK_NOFOLLOW) == 0)
			s = sfw_fail(err, SFW_E_IO, "cannot remove '%s/" PAIR_NEXT "'", sshown);
	}
	return s;
}

static void sweep_stale(int sfd)
{
	int fd = openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *e;
	/* writers of these hold the lock while they exist: any seen under it
	 * is a killed writer's */
	while ((e = readdir(d)))
		if (strncmp(e->d_name, "pair.tmp.", 9) == 0)
			pair_tmp_remove(sfd, e->d_name);
		else if (strncmp(e->d_name, "state.json.tmp.", 15) == 0)
			(void)unlinkat(sfd, e->d_name, 0);
	closedir(d);
}

enum sfw_status sfw_state_install_manifest(const char *dir, const void *man, size_t man_len, const void *sig,
					   size_t sig_len, struct sfw_err *err)
{
	static atomic_uint counter;
	int sfd, tfd = -1;
	enum sfw_status s = sfw_state_dir_open(dir, NULL, 1, &sfd, err);
	if (s != SFW_OK)
		return s;
	char *sshown = sfw_path_join(dir, ".salafw");
	char tname[64], shown[4200];
	if (!sshown) {
		close(sfd);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	lock_dir(sfd, LOCK_EX);
	s = pair_roll_forward(sfd, sshown, err); /* an earlier install killed in step 3 */
	if (s != SFW_OK)
		goto out;
	sweep_stale(sfd);
	/* 1. the new pair in a fresh folder */
	snprintf(tname, sizeof(tname), "pair.tmp.%ld.%u", (long)getpid(), atomic_fetch_add(&counter, 1));
	snprintf(shown, sizeof(shown), "%s/%s", sshown, tname);
	if ((s = sfw_dir_openat(sfd, sshown, tname, SFW_DIR_CREATE | SFW_DIR_OWNED, &tfd, err)) != SFW_OK)
		goto out;
	const void *data[2] = {man, sig};
	size_t len[2] = {man_len, sig_len};
	for (int i = 0; i < 2 && s == SFW_OK; i++) {
		char fshown[4300];
		snprintf(fshown, sizeof(fshown), "%s/%s", shown, pair_names[i]);
		s = sfw_write_file_atomicat(tfd, pair_names[i], fshown, data[i], len[i], err);
	}
	if (s == SFW_OK)
		s = sfw_fsync_dirfd(tfd, shown, err);
	/* 2. the commit point */
	if (s == SFW_OK)
		s = sfw_renameat_checked(sfd, tname, sfd, PAIR_NEXT, shown, sshown, err);
	if (s != SFW_OK) {
		pair_tmp_remove(sfd, tname); /* the old pair stays, untouched */
		goto out;
	}
	if ((s = sfw_fsync_dirfd(sfd, sshown, err)) != SFW_OK)
		goto out;
	/* 3. into place */
	s = pair_roll_forward(sfd, sshown, err);
out:
	if (tfd >= 0)
		close(tfd);
	close(sfd);
	sfw_free(sshown);
	return s;
}

enum sfw_status sfw_verified_commit(const char *dir, const struct sfw_verified *v, const struct sfw_trust_params *tp,
				    struct sfw_err *err)
{
	/* the ratchet first: once a version is taken in, an older one never is
	 * again, even when the folder's record below fails */
	enum sfw_status s = sfw_manifest_ratchet_commit(v->m, tp, err);
	if (s != SFW_OK || !v->man)
		return s;
	if ((s = sfw_state_install_manifest(dir, v->man, v->man_len, v->sig, v->sig_len, err)) != SFW_OK)
		return s;
	return sfw_state_record(dir, v->m, v->files, v->nfiles, err);
}

enum sfw_status sfw_state_read_manifest(const char *dir, struct sfw_buf *man, struct sfw_buf *sig,
					struct sfw_err *err)
{
	sfw_buf_init(man, SFW_MANIFEST_MAX);
	sfw_buf_init(sig, SFW_MINISIG_MAX);
	int sfd;
	enum sfw_status s = sfw_state_dir_open(dir, NULL, 0, &sfd, err);
	if (s == SFW_E_MISSING) {
		char *mp = salafw_file(dir, pair_names[0]);
		s = sfw_fail(err, SFW_E_MISSING, "cannot open '%s': %s", mp ? mp : dir, strerror(ENOENT));
		sfw_free(mp);
	}
	if (s != SFW_OK)
		return s;
	lock_dir(sfd, LOCK_SH);
	int nfd = openat(sfd, PAIR_NEXT, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct sfw_buf *out[2] = {man, sig};
	size_t max[2] = {SFW_MANIFEST_MAX, SFW_MINISIG_MAX};
	for (int i = 0; i < 2 && s == SFW_OK; i++) {
		char *shown = salafw_file(dir, pair_names[i]);
		if (!shown) {
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			break;
		}
		s = nfd >= 0 ? sfw_read_fileat(nfd, pair_names[i], shown, max[i], out[i], err) : SFW_E_MISSING;
		if (s == SFW_E_MISSING) /* not in manifest.next (or no install under way) */
			s = sfw_read_fileat(sfd, pair_names[i], shown, max[i], out[i], err);
		sfw_free(shown);
	}
	if (s != SFW_OK) {
		sfw_buf_release(man);
		sfw_buf_release(sig);
	}
	if (nfd >= 0)
		close(nfd);
	close(sfd);
	return s;
}

enum sfw_status sfw_state_check(const char *dir, const struct sfw_trust_params *p, struct sfw_err *err)
{
	char *mpath = salafw_file(dir, "manifest.json"), *spath = salafw_file(dir, "manifest.json.minisig");
	struct sfw_buf mb = {0}, sb = {0};
	struct sfw_manifest m;
	memset(&m, 0, sizeof(m));
	cJSON *state = NULL;
	int dfd = -1;
	enum sfw_status s;
	if (!mpath || !spath) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	s = sfw_state_read_manifest(dir, &mb, &sb, err);
	if (s == SFW_E_MISSING) {
		s = sfw_fail(err, SFW_E_UNVERIFIED,
			     "'%s' has no signed manifest in .salafw/ (run 'salafw get')", dir);
		goto out;
	}
	if (s == SFW_E_RANGE) {
		if (err)
			err->code = SFW_E_MANIFEST;
		s = SFW_E_MANIFEST;
	}
	if (s != SFW_OK)
		goto out;
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", mpath);
	struct sfw_trust_params tp = p ? *p : sfw_trust_default_params();
	tp.allow_expired = 1; /* already-verified files stay valid; expiry matters when fetching */
	tp.allow_downgrade = 1; /* so does rollback (a newer version elsewhere); equivocation still fails */
	if ((s = sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, what, &tp, &m, NULL, err)) != SFW_OK)
		goto out;
	{
		int sfd;
		s = sfw_state_dir_open(dir, NULL, 0, &sfd, err);
		if (s == SFW_OK) {
			s = load_state(sfd, dir, &state, err);
			close(sfd);
		}
	}
	if (s == SFW_E_MISSING) {
		s = sfw_fail(err, SFW_E_UNVERIFIED, "'%s' has not been verified yet (run 'salafw verify %s')",
			     dir, dir);
		goto out;
	}
	if (s != SFW_OK) {
		if (s != SFW_E_NOMEM) {
			sfw_err_prefix(err, "cannot check '%s'", dir);
			if (err)
				err->code = SFW_E_UNVERIFIED;
			s = SFW_E_UNVERIFIED;
		}
		goto out;
	}
	char hex[65];
	sfw_hex_encode(m.manifest_sha256, 32, hex);
	const cJSON *sha = cJSON_GetObjectItemCaseSensitive(state, "manifest_sha256");
	if (!cJSON_IsString(sha) || strcmp(sha->valuestring, hex) != 0) {
		s = sfw_fail(err, SFW_E_UNVERIFIED,
			     "'%s' was verified against another manifest (run 'salafw verify %s')", dir, dir);
		goto out;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
		goto out;
	}
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(state, "files");
	for (size_t i = 0; i < m.nfiles; i++) {
		const struct sfw_manifest_file *f = &m.files[i];
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, f->path);
		unsigned long long size, mt, ct, ino, dev;
		if (!cJSON_IsObject(e) || get_u64_str(e, "size", &size) || get_u64_str(e, "mtime_ns", &mt) ||
		    get_u64_str(e, "ctime_ns", &ct) || get_u64_str(e, "inode", &ino) ||
		    get_u64_str(e, "dev", &dev)) {
			s = sfw_fail(err, SFW_E_UNVERIFIED,
				     "'%s/%s' has not been verified (run 'salafw verify %s')", dir, f->path,
				     dir);
			goto out;
		}
		struct stat st;
		int eno;
		enum walk_res w = walk_stat(dfd, f->path, &st, 0, NULL, &eno);
		if (w == WALK_MISSING) {
			s = sfw_fail(err, SFW_E_MISSING, "'%s/%s' is missing", dir, f->path);
			goto out;
		}
		if (w != WALK_OK) {
			s = sfw_fail(err, SFW_E_UNVERIFIED, "'%s/%s' is not a regular file in the tree", dir,
				     f->path);
			goto out;
		}
		if ((uint64_t)st.st_size != f->size || size != f->size ||
		    (unsigned long long)ts_ns(st.st_mtim) != mt ||
		    (unsigned long long)ts_ns(st.st_ctim) != ct || (unsigned long long)st.st_ino != ino ||
		    (unsigned long long)st.st_dev != dev) {
			s = sfw_fail(err, SFW_E_UNVERIFIED,
				     "'%s/%s' changed since it was verified (run 'salafw verify %s')", dir,
				     f->path, dir);
			goto out;
		}
	}
out:
	if (dfd >= 0)
		close(dfd);
	cJSON_Delete(state);
	sfw_manifest_release(&m);
	sfw_buf_release(&mb);
	sfw_buf_release(&sb);
	sfw_free(mpath);
	sfw_free(spath);
	return s;
}
