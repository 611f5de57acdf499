/* files.c - a file from its partial to its place: open and resume the
 * partial (journal, re-hash of the kept prefix), plan its ranges, hash what
 * is left and compare, then sync in batches and rename into place through
 * folders opened from DEST down (never through a symlink). */

#include "fetch/internal.h"

#include "alloc.h"
#include "file.h"
#include "log.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

void sfwi_file_close(struct sfwi_file *f)
{
	if (f->fd >= 0)
		close(f->fd); /* also drops the flock */
	f->fd = -1;
	if (f->h_ok)
		sfw_sha256_release(&f->h);
	f->h_ok = 0;
}

static enum sfw_status plan_todo(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	size_t cap = f->ndone + 2 + r->p->connections * 2 + 8;
	struct sfw_range *v = sfw_malloc(cap * sizeof(*v));
	if (!v)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t k = sfw_fetch_plan_pieces(f->done, f->ndone, f->mf->size, r->p->connections, r->p->min_segment, v,
					 cap);
	SFW_ASSERT(k != SIZE_MAX);
	sfw_free(f->todo);
	f->todo = v;
	f->ntodo = k;
	f->captodo = cap;
	return SFW_OK;
}

/* Preallocates the file: fails early on a full disk; a file system without
 * support is fine (the writes themselves report ENOSPC then). */
static enum sfw_status prealloc(struct sfwi_file *f, uint64_t cur_size, struct sfw_err *err)
{
	if (f->mf->size && cur_size < f->mf->size && fallocate(f->fd, 0, 0, (off_t)f->mf->size) != 0 &&
	    errno == ENOSPC)
		return sfw_fail(err, SFW_E_NOSPACE, "no space left for '%s'", f->part);
	return SFW_OK;
}

/* Forgets every byte of the partial and starts the file over. */
enum sfw_status sfwi_file_reset(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	while (f->segs)
		sfwi_seg_free(r, f->segs);
	r->discarded += f->have;
	f->have = 0;
	f->ndone = 0;
	f->prior = 0;
	f->dirty = 0;
	memset(f->contributed, 0, r->nsrcs);
	if (sfwi_hash_reset(f) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (ftruncate(f->fd, 0) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot truncate '%s': %s", f->part, strerror(errno));
	enum sfw_status st = sfwi_journal_write(r, f, err);
	if (st != SFW_OK)
		return st;
	return plan_todo(r, f, err);
}

enum sfw_status sfwi_file_activate(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	/* O_NONBLOCK: a FIFO planted there opens at once and is refused below */
	f->fd = openat(r->pfd, f->pname, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
	if (f->fd < 0 && (errno == ELOOP || errno == EISDIR))
		return sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is %s, not a partial of get's; remove it and run again",
				f->part, errno == ELOOP ? "a symlink" : "a folder");
	if (f->fd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", f->part, strerror(errno));
	struct stat st;
	if (fstat(f->fd, &st) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot stat '%s': %s", f->part, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is not a regular file; remove it and run again",
				f->part);
	if (fcntl(f->fd, F_SETFL, 0) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", f->part, strerror(errno));
	if (flock(f->fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
		return sfw_fail(err, SFW_E_LOCKED, "'%s' is being written by another process", f->part);
	if (sfwi_hash_reset(f) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_range *d = NULL;
	size_t n = sfwi_journal_read(r, f, &d);
	uint64_t have = 0;
	n = sfw_fetch_normalize_ranges(d, n, (uint64_t)st.st_size, f->mf->size, &have);
	sfw_free(f->done);
	f->done = d;
	f->ndone = n;
	f->capdone = n;
	if (n == 0 && st.st_size > 0) {
		if (ftruncate(f->fd, 0) != 0)
			return sfw_fail(err, SFW_E_IO, "cannot truncate '%s': %s", f->part, strerror(errno));
		st.st_size = 0; /* so it is preallocated again below */
	}
	/* Re-hash the kept prefix: a saved hash state is never trusted. */
	if (n && d[0].start == 0) {
		enum sfw_status s2 = sfw_sha256_fd_prefix(f->fd, d[0].end, &f->h, err);
		if (s2 != SFW_OK)
			return s2;
		f->hash_pos = d[0].end;
	}
	f->have = f->kept = have;
	f->prior = have > 0;
	r->resumed += have;
	enum sfw_status s3 = prealloc(f, (uint64_t)st.st_size, err);
	if (s3 == SFW_OK)
		s3 = plan_todo(r, f, err);
	if (s3 != SFW_OK)
		return s3;
	f->cur_src = sfwi_pick_source(r, f);
	f->state = F_ACTIVE;
	sfwi_emit(r, SFW_EV_FILE_START, f, f->cur_src, have ? "resuming" : NULL);
	return SFW_OK;
}

/* The folder of rel under DEST, made if missing, opened segment by segment
 * from DEST's descriptor without following a symlink: a folder swapped for
 * a link at any moment is refused or written through its descriptor, never
 * followed out of DEST. *base gets rel's last segment. */
static enum sfw_status open_parent(struct sfwi_run *r, const char *rel, int *fd, const char **base,
				   struct sfw_err *err)
{
	const char *sl = strrchr(rel, '/');
	*base = sl ? sl + 1 : rel;
	char *dir = sl ? sfw_strndup(rel, (size_t)(sl - rel)) : sfw_strdup("");
	if (!dir)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status st = sfw_dir_openat(r->dfd, r->dest, dir, SFW_DIR_CREATE, fd, err);
	sfw_free(dir);
	return st;
}

/* All bytes are in: hash the rest; if it matches the file waits, F_VERIFIED,
 * for finish_batch to sync it and rename it into place. */
enum sfw_status sfwi_file_finish(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	const struct sfw_manifest_file *mf = f->mf;
	while (f->hash_pos < mf->size) {
		uint64_t want = mf->size - f->hash_pos;
		size_t k = want > HASH_CHUNK ? HASH_CHUNK : (size_t)want;
		long long got = sfw_pread_full(f->fd, r->hashbuf, k, f->hash_pos);
		if (got != (long long)k)
			return sfw_fail(err, SFW_E_IO, "cannot read '%s': %s", f->part,
					got < 0 ? strerror(errno) : "file is short");
		sfw_sha256_update(&f->h, r->hashbuf, k);
		f->hash_pos += k;
	}
	unsigned char got[32];
	sfw_sha256_final(&f->h, got);
	sfw_sha256_release(&f->h);
	f->h_ok = 0;
	if (memcmp(got, mf->sha256, 32) != 0) {
		/* Strike a source only when it alone served every byte: bytes mixed
		 * from several sources, or kept from an earlier run's partial, do
		 * not say which one was bad. Then the file starts over from the
		 * highest-priority source alone, to isolate it (docs/fetch-verify.md §3.4). */
		int sole = -1, nsrc = 0;
		for (size_t i = 0; i < r->nsrcs; i++)
			if (f->contributed[i]) {
				sole = (int)i;
				nsrc++;
			}
		if (nsrc != 1 || f->prior)
			sole = -1;
		char msg[200];
		/* no bytes from anyone: the signed size and sha256 disagree
		 * (e.g. size 0 with another file's hash); no source can fix that */
		int hopeless = nsrc == 0 && !f->prior;
		snprintf(msg, sizeof(msg), "sha256 mismatch: %llu bytes discarded%s", (unsigned long long)f->have,
			 hopeless    ? " (no source served any: the manifest's size and sha256 disagree)"
			 : sole >= 0 ? ""
			 : f->prior  ? " (partly from an earlier run's partial); starting over from one source"
				     : " (from several sources); starting over from one source");
		sfwi_emit(r, SFW_EV_HASH_MISMATCH, f, sole, msg);
		snprintf(f->last_err, sizeof(f->last_err), "sha256 mismatch");
		f->mismatches++;
		if (sole >= 0)
			sfwi_strike_source(r, sole, f, "sha256 mismatch");
		enum sfw_status st = sfwi_file_reset(r, f, err);
		if (st != SFW_OK)
			return st;
		f->cur_src = sfwi_pick_source(r, f);
		f->attempts = 0;
		if (hopeless || f->mismatches > r->nsrcs + 1) { /* fails it (schedule) */
			f->exhausted = 1;
			f->cur_src = -1;
		}
		return SFW_OK;
	}
	struct stat sb;
	if (fstat(f->fd, &sb) == 0 && (uint64_t)sb.st_size != mf->size && ftruncate(f->fd, (off_t)mf->size) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot truncate '%s': %s", f->part, strerror(errno));
	/* the data's writeback starts now; its fsync comes with the batch */
	if (mf->size)
		(void)sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	if (r->nverified++ == 0)
		r->verified_since = sfwi_now_ms();
	f->state = F_VERIFIED;
	return SFW_OK;
}

/* A verified file, its data synced: rename it into place through its parent
 * folder, opened from DEST down without following links (a symlink or folder
 * at the final name itself is replaced, never followed: rename works on the
 * name). *pfd stays open for the caller (finish_batch), which syncs it
 * before the file counts as done. */
static enum sfw_status file_install(struct sfwi_run *r, struct sfwi_file *f, int *pfd, struct sfw_err *err)
{
	const struct sfw_manifest_file *mf = f->mf;
	const char *base;
	enum sfw_status st = open_parent(r, mf->path, pfd, &base, err);
	if (st != SFW_OK)
		return st;
	st = sfw_renameat_checked(r->pfd, f->pname, *pfd, base, f->part, f->final, err);
	if (st != SFW_OK) {
		close(*pfd);
		*pfd = -1;
		return st;
	}
	struct stat fin; /* after the rename (it moves ctime): the record's id */
	if (fstat(f->fd, &fin) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot stat '%s': %s", f->final, strerror(errno));
	sfw_file_id_of(&fin, &f->id);
	unlinkat(r->pfd, f->jname, 0);
	sfwi_file_close(f);
	return SFW_OK;
}

struct sync_job {
	struct sfwi_file **f;
	int *dfd;  /* the folder each rename went into, one descriptor per folder */
	int *err;  /* errno per item, 0 = synced */
};

static void sync_files_fn(void *ctx, size_t a, size_t b, int tid)
{
	struct sync_job *j = ctx;
	(void)tid;
	for (size_t i = a; i < b; i++)
		j->err[i] = fsync(j->f[i]->fd) != 0 ? errno : 0;
}

static void sync_dirs_fn(void *ctx, size_t a, size_t b, int tid)
{
	struct sync_job *j = ctx;
	(void)tid;
	/* some file systems refuse fsync on directories: not data loss */
	for (size_t i = a; i < b; i++)
		j->err[i] = fsync(j->dfd[i]) != 0 && errno != EINVAL && errno != EROFS ? errno : 0;
}

/* Every F_VERIFIED file: fsync (in parallel), rename into place, fsync each
 * folder a rename went into (once, through the descriptor the rename used),
 * then F_DONE and its event. */
enum sfw_status sfwi_finish_batch(struct sfwi_run *r, struct sfw_err *err)
{
	size_t n = r->nverified, k = 0, nd = 0;
	if (!n)
		return SFW_OK;
	struct sync_job j;
	j.f = sfw_calloc(n, sizeof(*j.f));
	j.dfd = sfw_calloc(n, sizeof(*j.dfd));
	j.err = sfw_calloc(n, sizeof(*j.err));
	struct stat *ds = sfw_calloc(n, sizeof(*ds));
	const char **dname = sfw_calloc(n, sizeof(*dname));
	enum sfw_status st = SFW_OK;
	if (!j.f || !j.dfd || !j.err || !ds || !dname) {
		st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < r->nfiles && k < n; i++)
		if (r->files[i].state == F_VERIFIED)
			j.f[k++] = &r->files[i];
	SFW_ASSERT(k == n);
	sfw_parallel_for(n < SYNC_THREADS ? (int)n : SYNC_THREADS, n, 1, sync_files_fn, &j);
	for (size_t i = 0; i < n; i++)
		if (j.err[i]) {
			st = sfw_fail(err, SFW_E_IO, "cannot sync '%s': %s", j.f[i]->part, strerror(j.err[i]));
			goto out;
		}
	for (size_t i = 0; i < n; i++) {
		int fd;
		struct stat sb;
		if ((st = file_install(r, j.f[i], &fd, err)) != SFW_OK)
			goto out;
		if (fstat(fd, &sb) != 0) {
			st = sfw_fail(err, SFW_E_IO, "cannot stat the folder of '%s': %s", j.f[i]->final,
				      strerror(errno));
			close(fd);
			goto out;
		}
		size_t u = 0;
		while (u < nd && (ds[u].st_dev != sb.st_dev || ds[u].st_ino != sb.st_ino))
			u++;
		if (u < nd) { /* that folder is synced once */
			close(fd);
			continue;
		}
		ds[nd] = sb;
		dname[nd] = j.f[i]->final;
		j.dfd[nd++] = fd;
	}
	sfw_parallel_for(nd < SYNC_THREADS ? (int)nd : SYNC_THREADS, nd, 1, sync_dirs_fn, &j);
	for (size_t i = 0; i < nd; i++)
		if (j.err[i]) {
			st = sfw_fail(err, SFW_E_IO, "cannot sync the folder of '%s': %s", dname[i],
				      strerror(j.err[i]));
			goto out;
		}
	for (size_t i = 0; i < n; i++) {
		j.f[i]->state = F_DONE;
		sfwi_emit(r, SFW_EV_FILE_DONE, j.f[i], j.f[i]->cur_src, NULL);
	}
	r->nverified = 0;
out:
	for (size_t i = 0; j.dfd && i < nd; i++)
		close(j.dfd[i]);
	sfw_free(j.dfd);
	sfw_free(j.f);
	sfw_free(j.err);
	sfw_free(ds);
	sfw_free(dname);
	return st;
}

void sfwi_file_fail(struct sfwi_run *r, struct sfwi_file *f)
{
	struct sfw_err e;
	sfw_err_clear(&e);
	while (f->segs)
		sfwi_seg_free(r, f->segs);
	if (sfwi_journal_flush(r, f, &e) != SFW_OK)
		sfw_log(SFW_LOG_WARN, "%s", e.msg);
	sfwi_file_close(f);
	f->state = F_FAILED;
	if (f->nstruck >= SFW_FETCH_MAX_SOURCES && r->nsrcs > f->nstruck) {
		size_t k = strlen(f->last_err);
		snprintf(f->last_err + k, sizeof(f->last_err) - k, "%s%zu sources failed, the most tried per file; %zu more not tried",
			 k ? "; " : "", f->nstruck, r->nsrcs - f->nstruck);
	}
	sfwi_emit(r, SFW_EV_FILE_FAILED, f, -1, f->last_err[0] ? f->last_err : "every source failed");
}
