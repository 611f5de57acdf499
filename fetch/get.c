/* get.c - the downloader behind `salafw get`: one libcurl multi handle, up to
 * jobs x connections easy handles, each fetching one byte range of one file
 * into DEST/.salafw/partial/<sha256>-<path tag>.part with pwrite at its final
 * offset.
 *
 * Hashing: each file keeps a SHA-256 context over [0, hash_pos). A write at
 * exactly hash_pos is hashed as it streams (the single-stream case hashes
 * everything inline); whatever lies beyond is hashed in one sequential pass
 * from disk when the file is complete.
 *
 * Durability: every journal_interval the data of each active file is
 * fdatasync'ed and only then is the journal (ranges known written) replaced
 * atomically, so a kill -9 loses at most the bytes since the last journal.
 * A verified file is fsync'ed, renamed into place and its directory synced
 * (in batches: finish_batch) before it counts as done, and so before the
 * state record can name it.
 *
 * Sources: each transfer's speed is measured (sfwi_measure()); a source several
 * times slower than another one usable for the same file is demoted and its
 * transfers' remaining ranges move (sfw_fetch_speed_verdict). --limit-rate
 * is one byte bucket for the whole run (sfwi_bucket_refill).
 *
 * This file is the orchestration: the default parameters, the events, the
 * scheduler and the transfer loop, and sfw_fetch_get. The rest of the
 * downloader: journal.c (range lists, the resume journal), sources.c (source
 * choice, speed measurement), transfer.c (libcurl transfers of one range),
 * files.c (a file from its partial to its place), load.c (the manifest). */

#include "fetch/internal.h"

#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "file.h"
#include "log.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

struct sfw_fetch_params sfw_fetch_default_params(void)
{
	struct sfw_fetch_params p;
	memset(&p, 0, sizeof(p));
	p.trust = sfw_trust_default_params();
	p.endpoint = DEFAULT_ENDPOINT;
	p.jobs = 4;
	p.connections = 4;
	p.min_segment = 32u << 20;
	p.connect_timeout_s = 15;
	p.stall_timeout_s = 30;
	p.stall_bytes_per_s = 1024;
	p.max_retries = 5;
	p.backoff_base_ms = 1000;
	p.backoff_cap_ms = 30000;
	p.retry_after_max_ms = 120000;
	p.demote_after = 3;
	p.journal_interval_s = 5.0;
	p.progress_interval_s = 0.5;
	return p;
}

uint64_t sfwi_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint32_t sfwi_rnd32(struct sfwi_run *r)
{
	uint32_t x = r->rng;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return r->rng = x;
}

bool sfwi_emit(struct sfwi_run *r, enum sfw_fetch_event_kind kind, struct sfwi_file *f, int src, const char *msg)
{
	if (!r->p->on_event)
		return true;
	struct sfw_fetch_event ev;
	memset(&ev, 0, sizeof(ev));
	ev.kind = kind;
	ev.file = f ? f->mf : NULL;
	ev.file_index = f ? f->idx : 0;
	ev.source = src >= 0 && (size_t)src < r->nsrcs ? r->srcs[src].label : NULL;
	ev.msg = msg;
	ev.file_done = f ? f->have : 0;
	uint64_t done = 0;
	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].state == F_ACTIVE || r->files[i].state == F_VERIFIED || r->files[i].state == F_DONE ||
		    (r->files[i].state == F_FAILED && r->files[i].have))
			done += r->files[i].have;
	ev.total_done = done;
	ev.total_size = r->plan_total;
	ev.received = r->received;
	ev.rate = r->rate;
	ev.elapsed = (double)(sfwi_now_ms() - r->t0) / 1000.0;
	if (f) {
		ev.http_status = f->last_status;
		ev.curl_code = f->last_curl;
	}
	return r->p->on_event(r->p->user, &ev);
}

bool sfwi_emit_delay(struct sfwi_run *r, struct sfwi_file *f, int src, const char *msg, uint64_t delay)
{
	if (!r->p->on_event)
		return true;
	/* RETRY carries its delay; everything else goes through sfwi_emit() */
	struct sfw_fetch_event ev;
	memset(&ev, 0, sizeof(ev));
	ev.kind = SFW_EV_RETRY;
	ev.file = f->mf;
	ev.file_index = f->idx;
	ev.source = src >= 0 ? r->srcs[src].label : NULL;
	ev.msg = msg;
	ev.file_done = f->have;
	ev.total_size = r->plan_total;
	ev.received = r->received;
	ev.elapsed = (double)(sfwi_now_ms() - r->t0) / 1000.0;
	ev.delay_ms = delay;
	ev.http_status = f->last_status;
	ev.curl_code = f->last_curl;
	return r->p->on_event(r->p->user, &ev);
}

static enum sfw_status schedule(struct sfwi_run *r, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	unsigned active = 0;
	for (size_t i = 0; i < r->nfiles; i++)
		active += r->files[i].state == F_ACTIVE;
	uint64_t now = sfwi_now_ms();
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		if (f->state == F_PENDING && active < p->jobs) {
			enum sfw_status st = sfwi_file_activate(r, f, err);
			if (st == SFW_E_LOCKED) {
				f->locked = 1;
				snprintf(f->last_err, sizeof(f->last_err), "%s", err->msg);
				sfwi_file_close(f);
				f->state = F_FAILED;
				sfwi_emit(r, SFW_EV_FILE_FAILED, f, -1, f->last_err);
				sfw_err_clear(err);
				continue;
			}
			if (st != SFW_OK)
				return st;
			active++;
		}
		if (f->state != F_ACTIVE)
			continue;
		if (f->ntodo == 0 && f->nactive == 0) {
			enum sfw_status st = sfwi_file_finish(r, f, err);
			if (st != SFW_OK)
				return st;
			if (f->state != F_ACTIVE) {
				active--;
				continue;
			}
		}
		if (!f->exhausted &&
		    (f->cur_src < 0 || f->src_failed[f->cur_src] || r->srcs[f->cur_src].demoted))
			f->cur_src = sfwi_pick_source(r, f);
		if (f->cur_src < 0) {
			if (f->nactive == 0) {
				sfwi_file_fail(r, f);
				active--;
			}
			continue;
		}
		while (f->ntodo && f->nactive < (int)p->connections && now >= f->not_before) {
			enum sfw_status st = sfwi_seg_start(r, f, f->cur_src, err);
			if (st != SFW_OK)
				return st;
		}
	}
	/* the batch of verified files is synced when full, when it has waited
	 * long enough, or when nothing else is in flight */
	if (r->nverified && (r->nverified >= SYNC_BATCH || now - r->verified_since >= SYNC_WAIT_MS || !r->nhandles)) {
		enum sfw_status st = sfwi_finish_batch(r, err);
		if (st != SFW_OK)
			return st;
		r->woke = 1; /* jobs freed: more files may start */
	}
	sfwi_rate_share(r);
	return SFW_OK;
}

static void progress(struct sfwi_run *r, int force)
{
	uint64_t now = sfwi_now_ms();
	uint64_t dt = now - r->last_progress;
	if (!force && dt < (uint64_t)(r->p->progress_interval_s * 1000))
		return;
	if (dt) {
		double inst = (double)r->rate_bytes * 1000.0 / (double)dt;
		r->rate = r->rate == 0 ? inst : 0.5 * r->rate + 0.5 * inst;
	}
	r->rate_bytes = 0;
	r->last_progress = now;
	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].state == F_ACTIVE && !sfwi_emit(r, SFW_EV_PROGRESS, &r->files[i], r->files[i].cur_src, NULL))
			r->cancelled = 1;
	if (!sfwi_emit(r, SFW_EV_PROGRESS, NULL, -1, NULL))
		r->cancelled = 1;
}

static enum sfw_status flush_all(struct sfwi_run *r, struct sfw_err *err)
{
	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].state == F_ACTIVE) {
			enum sfw_status st = sfwi_journal_flush(r, &r->files[i], err);
			if (st != SFW_OK)
				return st;
		}
	return SFW_OK;
}

static enum sfw_status run_loop(struct sfwi_run *r, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	r->last_progress = r->last_journal = r->tokens_t = sfwi_now_ms();
	r->tokens = (double)p->limit_rate * BURST_MS / 1000.0;
	for (;;) {
		if (r->cancelled || (p->cancel && *p->cancel)) {
			r->cancelled = 1;
			return SFW_E_ABORTED;
		}
		r->woke = 0;
		enum sfw_status st = schedule(r, err);
		if (st == SFW_OK)
			st = sfwi_measure(r, err);
		if (st != SFW_OK)
			return st;
		int busy = r->nverified > 0;
		for (size_t i = 0; i < r->nfiles && !busy; i++)
			busy |= r->files[i].state == F_ACTIVE || r->files[i].state == F_PENDING;
		if (!busy)
			return SFW_OK;
		int running = 0;
		int owed_ms = sfwi_bucket_refill(r);
		if (curl_multi_perform(r->multi, &running) != CURLM_OK)
			return sfw_fail(err, SFW_E_NET, "libcurl multi failed");
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(r->multi, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct sfwi_seg *s = NULL;
			CURLcode cc = msg->data.result;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
			st = sfwi_seg_done(r, s, cc, err);
			if (st != SFW_OK)
				return st;
		}
		uint64_t now = sfwi_now_ms();
		if (now - r->last_journal >= (uint64_t)(p->journal_interval_s * 1000)) {
			st = flush_all(r, err);
			if (st != SFW_OK)
				return st;
			r->last_journal = now;
		}
		progress(r, 0);
		/* sleep until I/O, or the next due retry / journal / progress tick;
		 * not at all when a transfer ended (its file may finish, the next
		 * file start) */
		int timeout = r->woke ? 0 : 100;
		if (r->nverified && timeout > SYNC_WAIT_MS)
			timeout = SYNC_WAIT_MS;
		if (r->npaused && owed_ms < timeout)
			timeout = owed_ms ? owed_ms : 1;
		for (size_t i = 0; i < r->nfiles; i++) {
			struct sfwi_file *f = &r->files[i];
			if (f->state == F_ACTIVE && f->ntodo && f->nactive == 0 && f->not_before > now &&
			    f->not_before - now < (uint64_t)timeout)
				timeout = (int)(f->not_before - now);
		}
		if (r->nhandles)
			curl_multi_poll(r->multi, NULL, 0, timeout, NULL);
		else if (timeout > 0)
			usleep((useconds_t)timeout * 1000);
	}
}

/* ---- the whole get ---------------------------------------------------------------------- */

static enum sfw_status space_check(struct sfwi_run *r, struct sfw_err *err)
{
	uint64_t need = 0;
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		if (f->state != F_PENDING)
			continue;
		uint64_t n = f->mf->size;
		struct stat sb;
		if (fstatat(r->pfd, f->pname, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)) {
			uint64_t alloc = (uint64_t)sb.st_blocks * 512;
			n = alloc >= n ? 0 : n - alloc;
		}
		if (!sfw_add_ok(need, n, &need))
			need = UINT64_MAX;
	}
	uint64_t margin = need / 100 + (16u << 20);
	if (!sfw_add_ok(need, margin, &need))
		need = UINT64_MAX;
	struct statvfs vfs;
	if (statvfs(r->dest, &vfs) != 0)
		return SFW_OK; /* cannot tell: the write itself will report ENOSPC */
	uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
	if (avail < need)
		return sfw_fail(err, SFW_E_NOSPACE,
				"not enough free space in '%s': need %llu bytes, %llu available "
				"(--no-space-check to try anyway)",
				r->dest, (unsigned long long)need, (unsigned long long)avail);
	return SFW_OK;
}

static int take_dest_lock(int sfd, const char *dir, struct sfw_err *err, enum sfw_status *st)
{
	char *path = sfw_path_join(dir, ".salafw/lock");
	if (!path) {
		*st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return -1;
	}
	int fd = openat(sfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	struct stat lst;
	if (fd < 0 || fstat(fd, &lst) != 0 || !S_ISREG(lst.st_mode)) {
		int e = fd < 0 ? errno : 0;
		*st = e == ELOOP ? sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is a symlink", path)
		      : e	 ? sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", path, strerror(e))
				 : sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is not a regular file", path);
		if (fd >= 0)
			close(fd);
		sfw_free(path);
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno == EWOULDBLOCK) {
			*st = sfw_fail(err, SFW_E_LOCKED, "another 'salafw get' is writing into '%s' (lock '%s')", dir,
				       path);
			close(fd);
			sfw_free(path);
			return -1;
		}
		/* no flock on this file system: proceed, correctness does not need it */
		sfw_log(SFW_LOG_WARN, "cannot lock '%s': %s; continuing without a lock", path, strerror(errno));
	}
	sfw_free(path);
	*st = SFW_OK;
	return fd;
}

static void files_release(struct sfwi_run *r)
{
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		while (f->segs)
			sfwi_seg_free(r, f->segs);
		sfwi_file_close(f);
		sfw_free(f->part);
		sfw_free(f->journal);
		sfw_free(f->pname);
		sfw_free(f->jname);
		sfw_free(f->final);
		sfw_free(f->done);
		sfw_free(f->todo);
		sfw_free(f->src_failed);
		sfw_free(f->contributed);
		sfw_free(f->norange);
		sfw_free(f->stalls);
		sfw_free(f->probed);
	}
	sfw_free(r->files);
}

static int selected(const struct sfw_fetch_params *p, const char *path)
{
	int in = p->ninclude == 0;
	/* a pattern equal to the path names it, glob characters and all
	 * ("--include 'x[1].bin'", as a refusal's hint prints it) */
	for (size_t i = 0; !in && i < p->ninclude; i++)
		in = !strcmp(p->include[i], path) || fnmatch(p->include[i], path, 0) == 0;
	for (size_t i = 0; in && i < p->nexclude; i++)
		in = strcmp(p->exclude[i], path) && fnmatch(p->exclude[i], path, 0) != 0;
	return in;
}

static enum sfw_status add_sources(struct sfwi_run *r, const struct sfw_source *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct sfwi_src *s = &r->srcs[r->nsrcs++];
		s->s = v[i];
		s->label = v[i].name && v[i].name[0] ? v[i].name : v[i].url;
	}
	return SFW_OK;
}

/* One get from start to end: the verified manifest, the run over it, and
 * what the steps below hold open (released by get_release). */
struct get {
	const struct sfw_fetch_params *p;
	struct sfw_fetch_summary *sum;
	struct sfw_buf man, sig;
	char *what; /* where the manifest came from */
	struct sfw_trust_params tp;
	struct sfw_manifest m;
	struct sfwi_run r;
	size_t ns;  /* sources in all */
	int lockfd;
	char *sdir, *pdir;
};

/* 1. The manifest: fetched, then verified, before anything touches DEST. */
static enum sfw_status get_manifest(struct get *g, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = g->p;
	enum sfw_status st = sfwi_load_manifest(p, &g->man, &g->sig, &g->what, err);
	if (st != SFW_OK)
		return st;
	g->tp = p->trust;
	g->tp.repo_id = p->repo_id;
	g->tp.revision = p->revision;
	struct sfw_minisig_info info;
	st = sfw_manifest_verify(g->man.data, g->man.len, g->sig.data, g->sig.len, g->what, &g->tp, &g->m, &info,
				 err);
	if (st != SFW_OK)
		return st;
	struct sfw_fetch_summary *sum = g->sum;
	snprintf(sum->repo_id, sizeof(sum->repo_id), "%s", g->m.repo_id ? g->m.repo_id : "");
	snprintf(sum->revision, sizeof(sum->revision), "%s", g->m.revision);
	sum->nfiles = g->m.nfiles;
	/* Defence in depth: the manifest parser validated every path already. */
	for (size_t i = 0; i < g->m.nfiles; i++)
		if ((st = sfw_path_check(g->m.files[i].path, err)) != SFW_OK)
			return st;
	return SFW_OK;
}

/* 2. The run's sources in their order (user mirrors first, the manifest's,
 * user mirrors last) and its file table. */
static enum sfw_status get_sources(struct get *g, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = g->p;
	struct sfwi_run *r = &g->r;
	const struct sfw_manifest *m = &g->m;
	g->ns = p->nmirrors_first + m->nsources + p->nmirrors_last;
	r->srcs = sfw_calloc(g->ns ? g->ns : 1, sizeof(*r->srcs));
	r->files = sfw_calloc(m->nfiles ? m->nfiles : 1, sizeof(*r->files));
	r->hashbuf = sfw_malloc_aligned(4096, HASH_CHUNK);
	if (!r->srcs || !r->files || !r->hashbuf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	add_sources(r, p->mirrors_first, p->nmirrors_first);
	add_sources(r, m->sources, m->nsources);
	for (size_t i = p->nmirrors_first; i < r->nsrcs; i++)
		if (r->srcs[i].s.kind == SFW_SOURCE_HF) {
			r->srcs[i].bearer = 1;
			if (p->hf_endpoint) {
				if (r->srcs[i].label == r->srcs[i].s.url)
					r->srcs[i].label = p->hf_endpoint;
				r->srcs[i].s.url = (char *)p->hf_endpoint;
			}
		}
	add_sources(r, p->mirrors_last, p->nmirrors_last);
	/* a URL's password or token is never shown (progress, --json, errors) */
	for (size_t i = 0; i < r->nsrcs; i++)
		if (!(r->srcs[i].label = r->srcs[i].shown = sfw_fetch_redact_url(r->srcs[i].label)))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	r->nfiles = m->nfiles;
	return SFW_OK;
}

/* 3. DEST bookkeeping: folders, lock. The verified manifest bytes are copied
 * only on success (get_commit): until then DEST keeps the manifest its files
 * were last verified against (nothing below reads the copies). */
static enum sfw_status get_dest(struct get *g, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = g->p;
	struct sfwi_run *r = &g->r;
	enum sfw_status st;
	g->sdir = sfw_path_join(p->dest, ".salafw");
	g->pdir = sfw_path_join(p->dest, ".salafw/partial");
	if (!g->sdir || !g->pdir)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	/* DEST itself as named (made if missing), then .salafw and partial/ as
	 * real folders of this user's, never through a symlink */
	if ((st = sfw_mkdirs(p->dest, err)) != SFW_OK || (st = sfw_dir_open(p->dest, &r->dfd, err)) != SFW_OK ||
	    (st = sfw_dir_openat(r->dfd, p->dest, ".salafw", SFW_DIR_CREATE | SFW_DIR_OWNED, &r->sfd, err)) != SFW_OK ||
	    (st = sfw_dir_openat(r->sfd, g->sdir, "partial", SFW_DIR_CREATE | SFW_DIR_OWNED, &r->pfd, err)) != SFW_OK)
		return st;
	g->lockfd = take_dest_lock(r->sfd, p->dest, err, &st);
	if (st != SFW_OK)
		return st;
	char msg[300];
	snprintf(msg, sizeof(msg), "%s (%s@%s, %zu files)", g->what, g->m.repo_id, g->m.revision, g->m.nfiles);
	r->t0 = sfwi_now_ms();
	if (!sfwi_emit(r, SFW_EV_MANIFEST, NULL, -1, msg))
		return sfw_fail(err, SFW_E_ABORTED, "cancelled");
	return SFW_OK;
}

/* Each file's names: its partial and journal in partial/, its final path. */
static enum sfw_status get_files(struct get *g, struct sfw_err *err)
{
	const struct sfw_manifest *m = &g->m;
	size_t ns = g->ns ? g->ns : 1;
	for (size_t i = 0; i < m->nfiles; i++) {
		struct sfwi_file *f = &g->r.files[i];
		char hex[65], tag[17];
		sfw_hex_encode(m->files[i].sha256, 32, hex);
		/* content + path: equal files each get their own partial and lock,
		 * and resume still finds the partial of the same path */
		sfw_fetch_path_tag(m->files[i].path, tag);
		char name[100];
		f->idx = i;
		f->mf = &m->files[i];
		f->fd = -1;
		f->cur_src = -1;
		snprintf(name, sizeof(name), "%s-%s.part", hex, tag);
		f->pname = sfw_strdup(name);
		f->part = sfw_path_join(g->pdir, name);
		snprintf(name, sizeof(name), "%s-%s.json", hex, tag);
		f->jname = sfw_strdup(name);
		f->journal = sfw_path_join(g->pdir, name);
		f->final = sfw_path_join(g->p->dest, m->files[i].path);
		f->src_failed = sfw_calloc(ns, 1);
		f->contributed = sfw_calloc(ns, 1);
		f->norange = sfw_calloc(ns, 1);
		f->stalls = sfw_calloc(ns, 1);
		f->probed = sfw_calloc(ns, 1);
		if (!f->part || !f->journal || !f->pname || !f->jname || !f->final || !f->src_failed ||
		    !f->contributed || !f->norange || !f->stalls || !f->probed)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	return SFW_OK;
}

/* 4. What is already there and verified is skipped; what --include and
 * --exclude leave out is not fetched; the rest is the plan. */
static enum sfw_status get_plan(struct get *g, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = g->p;
	const struct sfw_manifest *m = &g->m;
	struct sfwi_run *r = &g->r;
	struct sfw_verify_params vp = sfw_verify_default_params();
	vp.record_state = 0;
	struct sfw_verify_report rep;
	memset(&rep, 0, sizeof(rep));
	struct sfw_err verr;
	sfw_err_clear(&verr);
	enum sfw_status vs = sfw_verify_dir(p->dest, m, &vp, &rep, &verr);
	if (vs != SFW_OK && !rep.results)
		return sfw_fail(err, vs, "%s", verr.msg);
	for (size_t i = 0; i < m->nfiles; i++)
		if (rep.results && rep.results[i] == SFW_FILE_OK) {
			r->files[i].state = F_SKIPPED;
			r->files[i].id = rep.ids[i];
			/* a leftover partial of a file already in place is useless */
			unlinkat(r->pfd, r->files[i].pname, 0);
			unlinkat(r->pfd, r->files[i].jname, 0);
			r->files[i].have = m->files[i].size;
			g->sum->nskipped++;
			sfwi_emit(r, SFW_EV_SKIP, &r->files[i], -1, "already present and verified");
			r->files[i].have = 0;
		}
	sfw_verify_report_release(&rep);
	for (size_t i = 0; i < m->nfiles; i++)
		if (r->files[i].state == F_PENDING && !selected(p, m->files[i].path)) {
			r->files[i].state = F_UNSELECTED;
			g->sum->nfiles--;
		}
	for (size_t i = 0; i < m->nfiles; i++)
		if (r->files[i].state == F_PENDING)
			r->plan_total += m->files[i].size;
	/* refuse before starting when the disk cannot hold it */
	enum sfw_status st;
	if (!p->no_space_check && (st = space_check(r, err)) != SFW_OK)
		return st;
	if (g->ns == 0 && r->plan_total > 0)
		for (size_t i = 0; i < m->nfiles; i++)
			if (r->files[i].state == F_PENDING)
				return sfw_fail(err, SFW_E_EXHAUSTED, "the manifest lists no sources; give one with --mirror");
	sfwi_emit(r, SFW_EV_PLAN, NULL, -1, NULL);
	return SFW_OK;
}

/* Whatever stopped the run, every byte written stays resumable: transfers
 * still open give their bytes to the done ranges, and each active file's
 * journal is written. Returns st, or the first failure of doing that. */
static enum sfw_status keep_resumable(struct sfwi_run *r, enum sfw_status st, struct sfw_err *err)
{
	struct sfw_err ferr;
	sfw_err_clear(&ferr);
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		while (f->segs) {
			struct sfwi_seg *s = f->segs;
			if (sfwi_seg_flush(s) != 0) /* unwritten bytes are not done */
				s->pos -= s->wlen;
			if (s->pos > s->start && sfwi_push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0 &&
			    st == SFW_OK)
				st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			sfwi_seg_free(r, s);
		}
		if (f->state == F_ACTIVE) {
			f->dirty = 1;
			if (sfwi_journal_flush(r, f, &ferr) != SFW_OK && st == SFW_OK)
				st = sfw_fail(err, ferr.code, "%s", ferr.msg);
		}
	}
	return st;
}

/* 5. The download: the transfer loop, then what was verified before a stop
 * is still installed and the rest stays resumable. */
static enum sfw_status get_download(struct get *g, struct sfw_err *err)
{
	struct sfwi_run *r = &g->r;
	r->multi = curl_multi_init();
	if (!r->multi)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	/* + one per source: a probe (sfwi_measure()) never waits for a free slot */
	curl_multi_setopt(r->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)(g->p->jobs * g->p->connections + g->ns));
	enum sfw_status st = run_loop(r, err);
	if (r->nverified) { /* verified before a stop: still installed */
		struct sfw_err berr;
		sfw_err_clear(&berr);
		enum sfw_status bs = sfwi_finish_batch(r, &berr);
		if (bs != SFW_OK && st == SFW_OK)
			st = sfw_fail(err, bs, "%s", berr.msg);
	}
	st = keep_resumable(r, st, err);
	if (st == SFW_E_ABORTED && (!err || !err->msg[0] || err->code != SFW_E_ABORTED))
		st = sfw_fail(err, SFW_E_ABORTED, "interrupted; run the same command again to resume");
	progress(r, 1);
	return st;
}

/* The run's verdict from its files: every failure a sha256 mismatch is
 * "verification failed" (exit 1), a partial held by another process is a
 * local condition (exit 5), else some file failed on every source. */
static enum sfw_status get_outcome(struct get *g, enum sfw_status st, struct sfw_err *err)
{
	struct sfwi_run *r = &g->r;
	size_t nfail = 0;
	struct sfwi_file *first = NULL;
	for (size_t i = 0; i < r->nfiles; i++) {
		if (r->files[i].state == F_DONE)
			g->sum->ndownloaded++;
		if (r->files[i].state == F_FAILED && !nfail++)
			first = &r->files[i];
	}
	int locked = 0;
	for (size_t i = 0; i < r->nfiles && !locked; i++)
		if (r->files[i].state == F_FAILED && r->files[i].locked) {
			locked = 1;
			first = &r->files[i];
		}
	g->sum->nfailed = nfail;
	int all_hash = nfail > 0;
	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].state == F_FAILED && strcmp(r->files[i].last_err, "sha256 mismatch") != 0)
			all_hash = 0;
	if (st == SFW_OK && nfail)
		st = sfw_fail(err, all_hash ? SFW_E_HASH : locked ? SFW_E_LOCKED : SFW_E_EXHAUSTED,
			      "%zu file%s failed; '%s': %s", nfail, nfail == 1 ? "" : "s", first->mf->path,
			      first->last_err[0] ? first->last_err : "every source failed");
	return st;
}

/* 6. Remember what was verified (rollback ratchet, offline verify): each
 * file as it was when its sha256 matched; one changed since (while others
 * downloaded) is refused by the record. */
static enum sfw_status get_commit(struct get *g, struct sfw_err *err)
{
	const struct sfw_manifest *m = &g->m;
	struct sfw_state_file *paths = sfw_calloc(m->nfiles ? m->nfiles : 1, sizeof(*paths));
	if (!paths)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < m->nfiles; i++)
		paths[i].path = m->files[i].path, paths[i].ok = g->r.files[i].state != F_UNSELECTED,
		paths[i].id = g->r.files[i].id;
	/* verify/'s one commit: the rollback ratchet, the signed pair, the state */
	struct sfw_verified v = {m, g->man.data, g->sig.data, g->man.len, g->sig.len, paths, m->nfiles};
	enum sfw_status st = sfw_verified_commit(g->p->dest, &v, &g->tp, err);
	sfw_free(paths);
	if (st == SFW_OK)
		unlinkat(g->r.sfd, "partial", AT_REMOVEDIR); /* only when empty */
	return st;
}

static void get_release(struct get *g)
{
	struct sfwi_run *r = &g->r;
	if (r->files)
		files_release(r);
	if (r->multi)
		curl_multi_cleanup(r->multi);
	for (size_t i = 0; r->srcs && i < r->nsrcs; i++)
		sfw_free(r->srcs[i].shown);
	sfw_free(r->srcs);
	sfw_free(r->hashbuf);
	if (g->lockfd >= 0)
		close(g->lockfd);
	for (int *fdp = &r->dfd; fdp <= &r->pfd; fdp++)
		if (*fdp >= 0)
			close(*fdp);
	sfw_free(g->sdir);
	sfw_free(g->pdir);
	sfw_free(g->what);
	sfw_manifest_release(&g->m);
	sfw_buf_release(&g->man);
	sfw_buf_release(&g->sig);
}

enum sfw_status sfw_fetch_get(const struct sfw_fetch_params *p, struct sfw_fetch_summary *sum,
			      struct sfw_err *err)
{
	struct sfw_fetch_summary dummy;
	if (!sum)
		sum = &dummy;
	memset(sum, 0, sizeof(*sum));
	if (!p || !p->dest || !p->dest[0])
		return sfw_fail(err, SFW_E_INVAL, "no destination directory");
	if (p->jobs < 1 || p->connections < 1)
		return sfw_fail(err, SFW_E_INVAL, "jobs and connections must be at least 1");
	uint64_t t_start = sfwi_now_ms();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		return sfw_fail(err, SFW_E_NOMEM, "cannot initialise libcurl");
	struct get g;
	memset(&g, 0, sizeof(g));
	g.p = p;
	g.sum = sum;
	g.lockfd = -1;
	sfw_buf_init(&g.man, 0);
	sfw_buf_init(&g.sig, 0);
	struct sfwi_run *r = &g.r;
	r->p = p;
	r->m = &g.m;
	r->dest = p->dest;
	r->rng = (uint32_t)(sfwi_now_ms() ^ ((uint64_t)getpid() << 16)) | 1;
	r->fatal = SFW_OK;
	r->dfd = r->sfd = r->pfd = -1;

	enum sfw_status st = get_manifest(&g, err);
	if (st != SFW_OK) { /* nothing was written */
		get_release(&g);
		return st;
	}
	if ((st = get_sources(&g, err)) == SFW_OK && (st = get_dest(&g, err)) == SFW_OK &&
	    (st = get_files(&g, err)) == SFW_OK && (st = get_plan(&g, err)) == SFW_OK) {
		st = get_outcome(&g, get_download(&g, err), err);
		if (st == SFW_OK)
			st = get_commit(&g, err);
		sfwi_emit(r, SFW_EV_DONE, NULL, -1, st == SFW_OK ? "ok" : (err ? err->msg : sfw_strerror(st)));
	}
	sum->received = r->received;
	sum->resumed = r->resumed;
	sum->discarded = r->discarded;
	sum->seconds = (double)(sfwi_now_ms() - t_start) / 1000.0;
	get_release(&g);
	return st;
}
