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
 * Sources: each transfer's speed is measured (measure()); a source several
 * times slower than another one usable for the same file is demoted and its
 * transfers' remaining ranges move (sfw_fetch_speed_verdict). --limit-rate
 * is one byte bucket for the whole run (bucket_refill). */
#include "fetch/fetch.h"

#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "file.h"
#include "json.h"
#include "log.h"
#include "thread.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define JOURNAL_MAX (256u << 10)
#define HASH_CHUNK (4u << 20)
#define WRITEBACK_KICK (8u << 20) /* bytes written before their writeback is started */
/* libcurl hands the body over in 16 KiB pieces: one pwrite per piece cost more
 * system time than the copy into this buffer (measured: 67652 pwrites per GiB
 * were half of the run's system time). Lost on SIGKILL: at most this per
 * transfer, never counted as durable (the journal flushes it first). */
#define WRITE_COALESCE (1u << 20)
#define DEFAULT_ENDPOINT "https://freeweights.allternit.com"
/* Scheduling by measured throughput (sfw_fetch_speed_verdict): every
 * MEASURE_MS each transfer's rate over its last WINDOW_MS is taken; a
 * transfer on a source several times slower (per connection) than another
 * source usable for the same file loses its remaining range to that source,
 * and the slow source is demoted (tried after the others from then on). A
 * source with no measurement yet is measured first by a probe: the tail of
 * the slow transfer's range, at most PROBE_MAX bytes. Below the factor the
 * order of sources decides, as before. */
#define MEASURE_MS 500
#define WINDOW_MS 1000
#define PROBE_MAX (8u << 20)
#define RATE_SAMPLE_MIN (64u << 10) /* a finished transfer this short says little about a source's speed */
/* A source whose transfers of one file end in a stall (the low-speed abort)
 * this many times with no completed range between is struck for that file,
 * even though each stall came after some progress, when another source is
 * left for it. */
#define STALL_STRIKES 3
/* Verified files wait for their fsync in batches: up to SYNC_BATCH files or
 * SYNC_WAIT_MS, then SYNC_THREADS fsyncs at once (a device flush each: run
 * one after another they cap a run at ~300 files/s on this disk, in
 * parallel the flushes coalesce), then the renames, then one fsync per
 * directory. A file counts as done (and the state record may name it) only
 * after all of that. */
#define SYNC_BATCH 128
#define SYNC_WAIT_MS 20
#define SYNC_THREADS 16

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

/* ---- state ---------------------------------------------------------------- */

struct src {
	struct sfw_source s;
	const char *label;
	int bearer;     /* a manifest hf source: gets p->hf_token */
	unsigned fails; /* consecutive failures */
	int demoted;
	double rate;    /* measured bytes/s per connection, 0 = not measured yet */
	int probing;    /* a probe transfer is measuring it */
};

enum reason { R_NONE, R_HTTP, R_RANGE, R_COMMIT, R_OVERFLOW, R_IO, R_CANCEL, R_RESTART, R_CUT };

struct file;

struct seg {
	struct file *f;
	struct run *run;       /* the get this transfer belongs to (the write callback's) */
	CURL *h;
	int src;
	uint64_t start, end, pos, launch_pos, synced;
	uint64_t req_end;      /* end of the range asked for; end may be lowered below it (cut) */
	uint64_t t_launch, win_t, win_pos; /* ms; the rate window's start */
	double rate;           /* bytes/s over the last window */
	int rate_ok;           /* a whole window measured */
	int probe;             /* measures its source for the scheduler */
	int cut;               /* end lowered: its tail went to another source */
	int paused;            /* held by the --limit-rate bucket (CURL_WRITEFUNC_PAUSE) */
	int held, held_win;    /* paused at some time in the current / last rate window */
	uint64_t kicked;       /* [kicked, pos - wlen) on disk, writeback not started */
	unsigned char *wbuf;   /* received bytes [pos - wlen, pos) not yet written */
	size_t wlen;
	int ranged, checked;
	enum reason reason;
	int io_errno;
	long status;
	char content_range[128];
	char retry_after[80];
	char commit[64];
	char errbuf[CURL_ERROR_SIZE];
	struct seg *next;
};

/* F_VERIFIED: every byte in and the sha256 matched; waiting for the batched
 * fsync + rename (finish_batch) before it is F_DONE. F_UNSELECTED: left out
 * by --include/--exclude. */
enum fstate { F_PENDING, F_ACTIVE, F_VERIFIED, F_DONE, F_FAILED, F_SKIPPED, F_UNSELECTED };

struct file {
	size_t idx;
	const struct sfw_manifest_file *mf;
	enum fstate state;
	int fd;
	char *part, *journal, *final; /* as messages name them */
	char *pname, *jname;          /* the partial's and journal's names in partial/ */
	struct sfw_range *done;
	size_t ndone, capdone;
	struct sfw_range *todo;
	size_t ntodo, captodo;
	struct seg *segs;
	int nactive;
	uint64_t not_before;
	unsigned attempts;
	int cur_src;
	unsigned char *src_failed, *contributed;
	unsigned char *norange; /* per source: answered a Range with 200 once already */
	unsigned char *stalls;  /* per source: stalls since its last completed range */
	unsigned char *probed;  /* per source: a probe for this file was started */
	struct sfw_sha256 h;
	int h_ok;
	uint64_t hash_pos;
	uint64_t have;      /* bytes of the file written (done + active progress) */
	uint64_t kept;      /* resumed from an earlier run */
	int prior;          /* holds bytes whose source is unknown (earlier run) */
	int locked;         /* its partial is held by another process */
	int exhausted;      /* mismatches that no source can be blamed for: fail it */
	struct sfw_file_id id; /* in place and verified: what the state record vouches for */
	int dirty;
	unsigned mismatches;
	long last_status;
	int last_curl;
	char last_err[200];
};

struct run {
	const struct sfw_fetch_params *p;
	const struct sfw_manifest *m;
	const char *dest;
	int dfd, sfd, pfd; /* DEST, DEST/.salafw, DEST/.salafw/partial: every write goes through them */
	struct src *srcs;
	size_t nsrcs;
	struct file *files;
	size_t nfiles;
	CURLM *multi;
	int nhandles;
	uint64_t t0;
	uint64_t plan_total, plan_done_base;
	uint64_t received, discarded, resumed;
	uint64_t last_progress, last_journal, rate_bytes, last_measure;
	int rate_nhandles;      /* handles the --limit-rate share was last computed for */
	size_t nverified;       /* files in F_VERIFIED */
	uint64_t verified_since;/* when the oldest of them got there */
	int woke;               /* something finished: run the scheduler before waiting */
	double tokens;          /* --limit-rate bucket: bytes that may arrive now (< 0: owed) */
	uint64_t tokens_t;      /* when it was last refilled */
	int npaused;            /* transfers paused until it refills */
	double rate;
	uint32_t rng;
	unsigned char *hashbuf;
	int cancelled;
	enum sfw_status fatal;
	struct sfw_err fatal_err;
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint32_t rnd32(struct run *r)
{
	uint32_t x = r->rng;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return r->rng = x;
}

static bool emit(struct run *r, enum sfw_fetch_event_kind kind, struct file *f, int src, const char *msg)
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
	ev.elapsed = (double)(now_ms() - r->t0) / 1000.0;
	if (f) {
		ev.http_status = f->last_status;
		ev.curl_code = f->last_curl;
	}
	return r->p->on_event(r->p->user, &ev);
}

static bool emit_delay(struct run *r, struct file *f, int src, const char *msg, uint64_t delay)
{
	if (!r->p->on_event)
		return true;
	/* RETRY carries its delay; everything else goes through emit() */
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
	ev.elapsed = (double)(now_ms() - r->t0) / 1000.0;
	ev.delay_ms = delay;
	ev.http_status = f->last_status;
	ev.curl_code = f->last_curl;
	return r->p->on_event(r->p->user, &ev);
}

/* ---- range lists ------------------------------------------------------------ */

static int push_range(struct sfw_range **v, size_t *n, size_t *cap, uint64_t a, uint64_t b, int front)
{
	if (a >= b)
		return 0;
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 8;
		struct sfw_range *nv = sfw_realloc(*v, nc * sizeof(**v));
		if (!nv)
			return -1;
		*v = nv;
		*cap = nc;
	}
	if (front) {
		memmove(*v + 1, *v, *n * sizeof(**v));
		(*v)[0] = (struct sfw_range){a, b};
	} else {
		(*v)[*n] = (struct sfw_range){a, b};
	}
	(*n)++;
	return 0;
}

static int hash_reset(struct file *f)
{
	if (f->h_ok)
		sfw_sha256_release(&f->h);
	f->h_ok = sfw_sha256_init(&f->h) == SFW_OK;
	f->hash_pos = 0;
	return f->h_ok ? 0 : -1;
}

/* ---- journal ------------------------------------------------------------------ */

static enum sfw_status journal_write(struct run *r, struct file *f, struct sfw_err *err)
{
	size_t n = f->ndone;
	for (struct seg *s = f->segs; s; s = s->next)
		n++;
	struct sfw_range *v = sfw_malloc((n + 1) * sizeof(*v));
	if (!v)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < f->ndone; i++)
		v[k++] = f->done[i];
	for (struct seg *s = f->segs; s; s = s->next)
		if (s->synced > s->start)
			v[k++] = (struct sfw_range){s->start, s->synced};
	k = sfw_fetch_normalize_ranges(v, k, UINT64_MAX, f->mf->size, NULL);
	char hex[65];
	sfw_hex_encode(f->mf->sha256, 32, hex);
	struct sfw_buf b;
	sfw_buf_init(&b, JOURNAL_MAX);
	enum sfw_status st = sfw_buf_printf(&b, "{\"v\":1,\"size\":%llu,\"sha256\":\"%s\",\"done\":[",
					    (unsigned long long)f->mf->size, hex);
	for (size_t i = 0; i < k && st == SFW_OK; i++)
		st = sfw_buf_printf(&b, "%s[%llu,%llu]", i ? "," : "", (unsigned long long)v[i].start,
				    (unsigned long long)v[i].end);
	if (st == SFW_OK)
		st = sfw_buf_printf(&b, "]}\n");
	sfw_free(v);
	if (st != SFW_OK) {
		sfw_buf_release(&b);
		return sfw_fail(err, st, "journal for '%s' too large", f->mf->path);
	}
	st = sfw_write_file_atomicat(r->pfd, f->jname, f->journal, b.data, b.len, err);
	sfw_buf_release(&b);
	return st;
}

static int seg_flush(struct seg *s);

/* fdatasync the data, then record what is now durable. */
static enum sfw_status journal_flush(struct run *r, struct file *f, struct sfw_err *err)
{
	if (f->fd < 0 || !f->dirty)
		return SFW_OK;
	for (struct seg *s = f->segs; s; s = s->next) {
		int e = seg_flush(s);
		if (e)
			return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s", f->part,
					strerror(e));
	}
	if (fdatasync(f->fd) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot sync '%s': %s", f->part, strerror(errno));
	for (struct seg *s = f->segs; s; s = s->next)
		s->synced = s->pos;
	f->dirty = 0;
	return journal_write(r, f, err);
}

/* Reads the journal's done ranges; anything unreadable or for other content
 * counts as no journal (the partial is then started over). */
static size_t journal_read(struct run *r, struct file *f, struct sfw_range **out)
{
	struct sfw_buf b;
	*out = NULL;
	if (sfw_read_fileat(r->pfd, f->jname, f->journal, JOURNAL_MAX, &b, NULL) != SFW_OK)
		return 0;
	cJSON *j = NULL;
	size_t n = 0;
	if (sfw_json_parse(b.data, b.len, "journal", &j, NULL) != SFW_OK)
		goto out;
	uint64_t v = 0, size = 0;
	const char *hex = NULL;
	unsigned char sha[32];
	if (sfw_json_u64(j, "v", "journal", &v, NULL) != SFW_OK || v != 1 ||
	    sfw_json_u64(j, "size", "journal", &size, NULL) != SFW_OK || size != f->mf->size ||
	    sfw_json_string(j, "sha256", "journal", &hex, NULL) != SFW_OK || sfw_hex_decode(hex, sha, 32) != 0 ||
	    memcmp(sha, f->mf->sha256, 32) != 0)
		goto out;
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "done");
	if (!cJSON_IsArray(d))
		goto out;
	int cnt = cJSON_GetArraySize(d);
	if (cnt <= 0 || cnt > 100000)
		goto out;
	*out = sfw_calloc((size_t)cnt, sizeof(**out));
	if (!*out)
		goto out;
	const cJSON *e;
	cJSON_ArrayForEach(e, d)
	{
		uint64_t a, bb;
		if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 ||
		    sfw_json_item_u64(cJSON_GetArrayItem(e, 0), "start", "journal", &a, NULL) != SFW_OK ||
		    sfw_json_item_u64(cJSON_GetArrayItem(e, 1), "end", "journal", &bb, NULL) != SFW_OK || a > bb) {
			n = 0;
			goto out;
		}
		(*out)[n++] = (struct sfw_range){a, bb};
	}
out:
	if (j)
		cJSON_Delete(j);
	sfw_buf_release(&b);
	if (n == 0) {
		sfw_free(*out);
		*out = NULL;
	}
	return n;
}

/* ---- sources ---------------------------------------------------------------- */

static int pick_source(struct run *r, struct file *f)
{
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < r->nsrcs; i++)
			if (!f->src_failed[i] && r->srcs[i].demoted == pass)
				return (int)i;
	return -1;
}

static void strike_source(struct run *r, int src, struct file *f, const char *why)
{
	struct src *s = &r->srcs[src];
	f->src_failed[src] = 1;
	emit(r, SFW_EV_SOURCE_FAILED, f, src, why);
	if (++s->fails >= r->p->demote_after && !s->demoted) {
		s->demoted = 1;
		emit(r, SFW_EV_SOURCE_DEMOTED, NULL, src, "kept failing; tried last from now on");
	}
	if (f->cur_src == src)
		f->cur_src = pick_source(r, f);
	f->attempts = 0;
}

/* ---- curl callbacks ------------------------------------------------------------- */

static int hdr_is(const char *line, size_t n, const char *name, const char **val, size_t *vlen)
{
	size_t k = strlen(name);
	if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
		return 0;
	const char *v = line + k + 1;
	const char *e = line + n;
	while (v < e && (*v == ' ' || *v == '\t'))
		v++;
	while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
		e--;
	*val = v;
	*vlen = (size_t)(e - v);
	return 1;
}

static void copy_hdr(char *dst, size_t cap, const char *v, size_t n)
{
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, v, n);
	dst[n] = '\0';
}

static size_t on_header(char *p, size_t sz, size_t nm, void *u)
{
	struct seg *s = u;
	size_t n = sz * nm;
	const char *v;
	size_t vl;
	if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
		/* a new response (after a redirect): forget the previous one's headers */
		s->content_range[0] = '\0';
		s->retry_after[0] = '\0';
	} else if (hdr_is(p, n, "Content-Range", &v, &vl)) {
		copy_hdr(s->content_range, sizeof(s->content_range), v, vl);
	} else if (hdr_is(p, n, "Retry-After", &v, &vl)) {
		copy_hdr(s->retry_after, sizeof(s->retry_after), v, vl);
	} else if (hdr_is(p, n, "X-Repo-Commit", &v, &vl)) {
		copy_hdr(s->commit, sizeof(s->commit), v, vl);
	}
	return n;
}

static int commit_ok(struct run *r, struct seg *s)
{
	return r->srcs[s->src].s.kind != SFW_SOURCE_HF || !s->commit[0] || strcmp(s->commit, r->m->revision) == 0;
}

static int check_first(struct run *r, struct seg *s)
{
	long status = 0;
	curl_off_t cl = -1;
	curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_getinfo(s->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
	s->status = status;
	if (!commit_ok(r, s)) {
		s->reason = R_COMMIT;
		return -1;
	}
	switch (sfw_fetch_check_response(s->ranged, s->start, s->req_end, s->f->mf->size, status,
					 s->content_range[0] ? s->content_range : NULL, (int64_t)cl)) {
	case SFW_RESP_ACCEPT:
		return 0;
	case SFW_RESP_RESTART:
		s->reason = R_RESTART;
		return -1;
	case SFW_RESP_NEXT_SOURCE:
		s->reason = R_RANGE;
		return -1;
	case SFW_RESP_ERROR:
		s->reason = R_HTTP;
		return -1;
	}
	return -1;
}

static size_t on_write(char *p, size_t sz, size_t nm, void *u)
{
	struct seg *s = u;
	struct run *r = s->run;
	struct file *f = s->f;
	size_t n = sz * nm;
	if (r->p->limit_rate && r->tokens <= 0 && n) {
		/* over the cap: libcurl keeps these bytes and hands them over
		 * again when bucket_refill() resumes the transfer */
		s->paused = s->held = 1;
		r->npaused++;
		return CURL_WRITEFUNC_PAUSE;
	}
	r->tokens -= (double)n;
	if (!s->checked) {
		if (check_first(r, s) != 0)
			return 0;
		s->checked = 1;
	}
	if (r->p->cancel && *r->p->cancel) {
		s->reason = R_CANCEL;
		return 0;
	}
	r->received += n;
	r->rate_bytes += n;
	uint64_t room = s->end - s->pos;
	size_t w = n > room ? (size_t)room : n;
	if (w && f->hash_pos == s->pos && f->h_ok) {
		sfw_sha256_update(&f->h, p, w);
		f->hash_pos += w;
	}
	for (size_t done = 0; done < w;) {
		size_t k = WRITE_COALESCE - s->wlen;
		if (k > w - done)
			k = w - done;
		memcpy(s->wbuf + s->wlen, p + done, k);
		s->wlen += k;
		s->pos += k;
		done += k;
		int e = s->wlen == WRITE_COALESCE ? seg_flush(s) : 0;
		if (e) {
			s->reason = R_IO;
			s->io_errno = e;
			f->have += done;
			return 0;
		}
	}
	f->have += w;
	if (w) {
		f->dirty = 1;
		f->contributed[s->src] = 1;
	}
	if (w < n) {
		/* past a cut: the rest is another transfer's; past the range
		 * asked for: more bytes than asked for, never written */
		s->reason = s->cut && s->end < s->req_end ? R_CUT : R_OVERFLOW;
		return 0;
	}
	if (w && s->pos == s->end && s->cut && s->end < s->req_end) {
		s->reason = R_CUT; /* the cut point reached: stop here, not at the next byte */
		return 0;
	}
	return n;
}

/* ---- segments ------------------------------------------------------------------- */

static void seg_free(struct run *r, struct seg *s)
{
	if (s->h) {
		curl_multi_remove_handle(r->multi, s->h);
		curl_easy_cleanup(s->h);
		r->nhandles--;
	}
	struct file *f = s->f;
	if (s->probe)
		r->srcs[s->src].probing = 0;
	if (s->paused)
		r->npaused--;
	r->woke = 1;
	for (struct seg **pp = &f->segs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	f->nactive--;
	sfw_free(s->wbuf);
	sfw_free(s);
}

/* Writes the coalesced bytes at their offset; returns 0 or an errno. */
static int seg_flush(struct seg *s)
{
	if (!s->wlen)
		return 0;
	struct file *f = s->f;
	uint64_t off = s->pos - s->wlen;
	if (sfw_pwrite_all(f->fd, s->wbuf, s->wlen, off) != 0)
		return errno ? errno : EIO;
	s->wlen = 0;
	/* Start the disk writeback of every few MiB now (asynchronously), so the
	 * journal's fdatasync and the final fsync find little left to write
	 * instead of stalling the transfer loop while the page cache drains. */
	if (s->pos - s->kicked >= WRITEBACK_KICK) {
		(void)sync_file_range(f->fd, (off64_t)s->kicked, (off64_t)(s->pos - s->kicked), SYNC_FILE_RANGE_WRITE);
		s->kicked = s->pos;
	}
	return 0;
}

static enum sfw_status seg_start(struct run *r, struct file *f, int src, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	struct sfw_range rg = f->todo[0];
	struct seg *s = sfw_calloc(1, sizeof(*s));
	if (s && !(s->wbuf = sfw_malloc_aligned(4096, WRITE_COALESCE))) {
		sfw_free(s);
		s = NULL;
	}
	if (!s)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	char *url = sfw_fetch_file_url(&r->srcs[src].s, r->m->repo_id, r->m->revision, f->mf->path);
	CURL *h = curl_easy_init();
	if (!url || !h) {
		sfw_free(url);
		if (h)
			curl_easy_cleanup(h);
		sfw_free(s->wbuf);
		sfw_free(s);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	s->f = f;
	s->h = h;
	s->src = src;
	s->start = s->pos = s->launch_pos = s->synced = s->kicked = s->win_pos = rg.start;
	s->end = s->req_end = rg.end;
	s->t_launch = s->win_t = now_ms();
	s->ranged = !(rg.start == 0 && rg.end == f->mf->size);
	char range[64];
	snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)rg.start, (unsigned long long)rg.end - 1);
	curl_easy_setopt(h, CURLOPT_URL, url);
	if (s->ranged)
		curl_easy_setopt(h, CURLOPT_RANGE, range);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	/* an https source stays https through its redirects */
	curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR,
			 sfw_fetch_redir_protocols(r->srcs[src].s.url));
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
	curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_USERAGENT, "salafw/" SFW_VERSION);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, p->connect_timeout_s);
	long low = p->stall_bytes_per_s;
	if (p->limit_rate) { /* a transfer held back by the cap is not stalled */
		uint64_t floor = p->limit_rate / ((uint64_t)p->jobs * p->connections + r->nsrcs) / 4;
		if ((uint64_t)low > floor)
			low = floor ? (long)floor : 1;
	}
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, low);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, p->stall_timeout_s);
	/* libcurl applies this to redirect and error bodies too, so allow a
	 * small page on top; on_write is the hard cap at the range's end. */
	curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(f->mf->size + (64u << 10)));
	curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
	if (p->limit_rate) { /* this transfer's share: rate_share() keeps the sum at the cap */
		uint64_t share = p->limit_rate / (uint64_t)(r->nhandles + 1);
		curl_easy_setopt(h, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)(share ? share : 1));
		curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 64L * 1024);
		r->rate_nhandles = -1;
	}
	if (p->hf_token && r->srcs[f->cur_src].bearer) { /* libcurl keeps it to this host */
		curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
		curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, p->hf_token);
	}
	s->run = r;
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, s->errbuf);
	curl_easy_setopt(h, CURLOPT_PRIVATE, s);
	/* no CURLOPT_ACCEPT_ENCODING: bodies stay identity-encoded, sizes exact */
	sfw_free(url); /* libcurl copies option strings */
	if (curl_multi_add_handle(r->multi, h) != CURLM_OK) {
		curl_easy_cleanup(h);
		sfw_free(s->wbuf);
		sfw_free(s);
		return sfw_fail(err, SFW_E_NOMEM, "cannot add a transfer");
	}
	r->nhandles++;
	memmove(f->todo, f->todo + 1, (f->ntodo - 1) * sizeof(*f->todo));
	f->ntodo--;
	s->next = f->segs;
	f->segs = s;
	f->nactive++;
	return SFW_OK;
}

/* ---- file lifecycle ------------------------------------------------------------ */

static void file_close(struct file *f)
{
	if (f->fd >= 0)
		close(f->fd); /* also drops the flock */
	f->fd = -1;
	if (f->h_ok)
		sfw_sha256_release(&f->h);
	f->h_ok = 0;
}

static enum sfw_status plan_todo(struct run *r, struct file *f, struct sfw_err *err)
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
static enum sfw_status prealloc(struct file *f, uint64_t cur_size, struct sfw_err *err)
{
	if (f->mf->size && cur_size < f->mf->size && fallocate(f->fd, 0, 0, (off_t)f->mf->size) != 0 &&
	    errno == ENOSPC)
		return sfw_fail(err, SFW_E_NOSPACE, "no space left for '%s'", f->part);
	return SFW_OK;
}

/* Forgets every byte of the partial and starts the file over. */
static enum sfw_status file_reset(struct run *r, struct file *f, struct sfw_err *err)
{
	while (f->segs)
		seg_free(r, f->segs);
	r->discarded += f->have;
	f->have = 0;
	f->ndone = 0;
	f->prior = 0;
	f->dirty = 0;
	memset(f->contributed, 0, r->nsrcs);
	if (hash_reset(f) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (ftruncate(f->fd, 0) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot truncate '%s': %s", f->part, strerror(errno));
	enum sfw_status st = journal_write(r, f, err);
	if (st != SFW_OK)
		return st;
	return plan_todo(r, f, err);
}

static enum sfw_status file_activate(struct run *r, struct file *f, struct sfw_err *err)
{
	f->fd = openat(r->pfd, f->pname, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (f->fd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", f->part, strerror(errno));
	if (flock(f->fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
		return sfw_fail(err, SFW_E_LOCKED, "'%s' is being written by another process", f->part);
	struct stat st;
	if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
		return sfw_fail(err, SFW_E_IO, "'%s' is not a regular file", f->part);
	if (hash_reset(f) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	struct sfw_range *d = NULL;
	size_t n = journal_read(r, f, &d);
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
	f->cur_src = pick_source(r, f);
	f->state = F_ACTIVE;
	emit(r, SFW_EV_FILE_START, f, f->cur_src, have ? "resuming" : NULL);
	return SFW_OK;
}

/* The folder of rel under DEST, made if missing, opened segment by segment
 * from DEST's descriptor without following a symlink: a folder swapped for
 * a link at any moment is refused or written through its descriptor, never
 * followed out of DEST. *base gets rel's last segment. */
static enum sfw_status open_parent(struct run *r, const char *rel, int *fd, const char **base,
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
static enum sfw_status file_finish(struct run *r, struct file *f, struct sfw_err *err)
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
		emit(r, SFW_EV_HASH_MISMATCH, f, sole, msg);
		snprintf(f->last_err, sizeof(f->last_err), "sha256 mismatch");
		f->mismatches++;
		if (sole >= 0)
			strike_source(r, sole, f, "sha256 mismatch");
		enum sfw_status st = file_reset(r, f, err);
		if (st != SFW_OK)
			return st;
		f->cur_src = pick_source(r, f);
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
		r->verified_since = now_ms();
	f->state = F_VERIFIED;
	return SFW_OK;
}

/* A verified file, its data synced: rename it into place through its parent
 * folder, opened from DEST down without following links (a symlink or folder
 * at the final name itself is replaced, never followed: rename works on the
 * name). *pfd stays open for the caller (finish_batch), which syncs it
 * before the file counts as done. */
static enum sfw_status file_install(struct run *r, struct file *f, int *pfd, struct sfw_err *err)
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
	file_close(f);
	return SFW_OK;
}

struct sync_job {
	struct file **f;
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
static enum sfw_status finish_batch(struct run *r, struct sfw_err *err)
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
		emit(r, SFW_EV_FILE_DONE, j.f[i], j.f[i]->cur_src, NULL);
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

static void file_fail(struct run *r, struct file *f)
{
	struct sfw_err e;
	sfw_err_clear(&e);
	while (f->segs)
		seg_free(r, f->segs);
	if (journal_flush(r, f, &e) != SFW_OK)
		sfw_log(SFW_LOG_WARN, "%s", e.msg);
	file_close(f);
	f->state = F_FAILED;
	emit(r, SFW_EV_FILE_FAILED, f, -1, f->last_err[0] ? f->last_err : "every source failed");
}

static const char *reason_text(enum reason rs)
{
	switch (rs) {
	case R_RANGE:
		return "response does not match the requested range or size";
	case R_COMMIT:
		return "X-Repo-Commit differs from the manifest revision";
	case R_OVERFLOW:
		return "body longer than requested";
	default:
		return NULL;
	}
}

/* Another source not yet struck for this file? */
static int other_source(struct run *r, struct file *f, int src)
{
	for (size_t i = 0; i < r->nsrcs; i++)
		if ((int)i != src && !f->src_failed[i])
			return 1;
	return 0;
}

/* The only source left ignores Range and a transfer broke: count an attempt;
 * within the budget the file starts over from byte 0 as one plain request
 * after the backoff, past it the source is struck. */
static enum sfw_status restart_whole(struct run *r, struct file *f, int src, const char *why,
				     struct sfw_err *err)
{
	if (++f->attempts > r->p->max_retries) {
		snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfers kept breaking (%s)",
			 r->srcs[src].label, why);
		if (!f->src_failed[src])
			strike_source(r, src, f, "server ignores Range and its transfers kept breaking");
		return SFW_OK;
	}
	enum sfw_status st = file_reset(r, f, err);
	if (st != SFW_OK)
		return st;
	f->ntodo = 0;
	if (push_range(&f->todo, &f->ntodo, &f->captodo, 0, f->mf->size, 0) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	uint64_t delay =
		sfw_fetch_backoff_ms(f->attempts, r->p->backoff_base_ms, r->p->backoff_cap_ms, 0, rnd32(r));
	uint64_t due = now_ms() + delay;
	if (due > f->not_before)
		f->not_before = due;
	char msg[240];
	snprintf(msg, sizeof(msg), "%s; it ignores Range: starting the file over from byte 0 (attempt %u of %u)",
		 why, f->attempts, r->p->max_retries);
	emit_delay(r, f, src, msg, delay);
	return SFW_OK;
}

/* A transfer ended: keep its bytes, then decide what happens next. */
static enum sfw_status seg_done(struct run *r, struct seg *s, CURLcode cc, struct sfw_err *err)
{
	struct file *f = s->f;
	int src = s->src;
	long status = s->status;
	/* Everything received goes to disk before the range counts as done. */
	int we = seg_flush(s);
	if (we && s->reason != R_IO) {
		s->reason = R_IO;
		s->io_errno = we;
	}
	if (we) /* the unwritten tail is not done: drop it from the range */
		s->pos -= s->wlen;
	if (!status)
		curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
	if (!s->checked && cc == CURLE_OK && s->reason == R_NONE) {
		/* no body arrived (an empty error page, or an empty range) */
		s->status = status;
		if (!commit_ok(r, s))
			s->reason = R_COMMIT;
		else if (status != 200 && status != 206)
			s->reason = R_HTTP;
	}
	f->last_status = status;
	f->last_curl = (int)cc;
	/* out of memory: those bytes stay unrecorded (fetched again on resume) */
	int oom = s->pos > s->start && push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0;
	f->ndone = sfw_fetch_normalize_ranges(f->done, f->ndone, UINT64_MAX, f->mf->size, NULL);
	int progressed = s->pos > s->launch_pos;
	uint64_t rest_a = s->pos, rest_b = s->end;
	enum reason rs = s->reason;
	int probe = s->probe;
	if (rs == R_CUT && rest_a == rest_b) { /* stopped at its cut: complete */
		rs = R_NONE;
		cc = CURLE_OK;
	}
	{
		/* what a whole transfer achieved feeds its source's measured rate */
		uint64_t got = s->pos - s->launch_pos, dt = now_ms() - s->t_launch;
		if (rs == R_NONE && cc == CURLE_OK && got >= RATE_SAMPLE_MIN) {
			double sample = (double)got * 1000.0 / (double)(dt ? dt : 1);
			struct src *sr = &r->srcs[src];
			sr->rate = sr->rate > 0 && !probe ? 0.5 * sr->rate + 0.5 * sample : sample;
		}
	}
	int io_errno = s->io_errno;
	char retry_after[80];
	memcpy(retry_after, s->retry_after, sizeof(retry_after));
	char ebuf[CURL_ERROR_SIZE];
	memcpy(ebuf, s->errbuf, sizeof(ebuf));
	seg_free(r, s);

	if (oom)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (rs == R_IO)
		return sfw_fail(err, io_errno == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s",
				f->part, strerror(io_errno));
	if (rs == R_CANCEL) {
		if (push_range(&f->todo, &f->ntodo, &f->captodo, rest_a, rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return SFW_OK;
	}
	if (rs == R_RESTART && probe) {
		/* a probe's ranged request answered with the whole file: this source
		 * cannot take part of a file; the range goes back to the others */
		f->norange[src] = 1;
		if (push_range(&f->todo, &f->ntodo, &f->captodo, rest_a, rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return SFW_OK;
	}
	if (rs == R_RESTART && f->norange[src] && !other_source(r, f, src)) {
		/* the only source left ignores Range: every retry starts over from
		 * byte 0, one attempt each, within the retry budget */
		return restart_whole(r, f, src, "server ignores Range: restarting the file from byte 0", err);
	}
	if (rs == R_RESTART && f->norange[src]) {
		/* Range ignored again after a restart from byte 0: its transfers keep
		 * breaking, and restarting never counts an attempt, so take the rest
		 * from the next source instead of going round for ever. */
		if (push_range(&f->todo, &f->ntodo, &f->captodo, rest_a, rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfer broke again",
			 r->srcs[src].label);
		if (!f->src_failed[src])
			strike_source(r, src, f, "server ignores Range and its transfer broke again");
		return SFW_OK;
	}
	if (rs == R_RESTART) {
		/* 200 to a ranged request: this source ignores Range. Start the file
		 * over as one plain request from byte 0 (never append a 200). */
		f->norange[src] = 1;
		enum sfw_status st = file_reset(r, f, err);
		if (st != SFW_OK)
			return st;
		f->ntodo = 0;
		if (push_range(&f->todo, &f->ntodo, &f->captodo, 0, f->mf->size, 0) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		emit(r, SFW_EV_RETRY, f, src, "server ignored Range (200): restarting the file from byte 0");
		return SFW_OK;
	}
	if (rs == R_NONE && cc == CURLE_OK && rest_a == rest_b) {
		r->srcs[src].fails = 0;
		f->attempts = 0;
		f->stalls[src] = 0;
		return SFW_OK;
	}
	if (push_range(&f->todo, &f->ntodo, &f->captodo, rest_a, rest_b, 1) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_fetch_class cls;
	const char *why = reason_text(rs);
	if (why)
		cls = SFW_FETCH_NEXT_SOURCE;
	else if (rs == R_HTTP)
		cls = sfw_fetch_classify(CURLE_HTTP_RETURNED_ERROR, status);
	else
		cls = sfw_fetch_classify(cc, status);
	char msg[200];
	if (why)
		snprintf(msg, sizeof(msg), "%s", why);
	else if (rs == R_HTTP || (cc == CURLE_OK && status != 200 && status != 206))
		snprintf(msg, sizeof(msg), "HTTP %ld", status);
	else if (cc == CURLE_OK)
		snprintf(msg, sizeof(msg), "connection closed at byte %llu of range ending at %llu",
			 (unsigned long long)rest_a, (unsigned long long)rest_b);
	else
		snprintf(msg, sizeof(msg), "%s", ebuf[0] ? ebuf : curl_easy_strerror(cc));
	snprintf(f->last_err, sizeof(f->last_err), "%s: %s", r->srcs[src].label, msg);
	if (cls == SFW_FETCH_FATAL)
		return sfw_fail(err, cc == CURLE_OUT_OF_MEMORY ? SFW_E_NOMEM : SFW_E_NET, "'%s': %s", f->mf->path,
				msg);
	if (f->norange[src] && cls == SFW_FETCH_RETRY) {
		/* it ignores Range, so resuming from here is impossible: move on if
		 * another source can serve the file, else start over from byte 0
		 * (the bytes of this attempt are lost, so progress resets nothing) */
		if (other_source(r, f, src)) {
			snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfer broke again",
				 r->srcs[src].label);
			if (!f->src_failed[src])
				strike_source(r, src, f, "server ignores Range and its transfer broke again");
			return SFW_OK;
		}
		return restart_whole(r, f, src, msg, err);
	}
	int stalled = cc == CURLE_OPERATION_TIMEDOUT && progressed;
	if (stalled && ++f->stalls[src] >= STALL_STRIKES && other_source(r, f, src)) {
		/* progress, then a stall, again and again: a failing source (the
		 * only one left still resumes: every retry gains bytes) */
		snprintf(msg, sizeof(msg), "stalled %u times after sending some data", (unsigned)f->stalls[src]);
		snprintf(f->last_err, sizeof(f->last_err), "%s: %s", r->srcs[src].label, msg);
		if (!f->src_failed[src])
			strike_source(r, src, f, msg);
		return SFW_OK;
	}
	if (progressed)
		f->attempts = 0;
	int64_t ra = -1;
	if (cls == SFW_FETCH_RETRY) {
		if (retry_after[0])
			ra = sfw_fetch_retry_after_ms(retry_after, (int64_t)time(NULL));
		if (ra > 0 && (uint64_t)ra > r->p->retry_after_max_ms)
			cls = SFW_FETCH_NEXT_SOURCE; /* asked to wait longer than we will */
		else if (++f->attempts > r->p->max_retries)
			cls = SFW_FETCH_NEXT_SOURCE;
	}
	if (cls == SFW_FETCH_NEXT_SOURCE) {
		if (!f->src_failed[src])
			strike_source(r, src, f, msg);
		return SFW_OK;
	}
	uint64_t delay = sfw_fetch_backoff_ms(f->attempts, r->p->backoff_base_ms, r->p->backoff_cap_ms,
					      ra > 0 ? (uint64_t)ra : 0, rnd32(r));
	uint64_t due = now_ms() + delay;
	if (due > f->not_before)
		f->not_before = due;
	emit_delay(r, f, src, msg, delay);
	return SFW_OK;
}

/* ---- the loop ---------------------------------------------------------------------- */

static void rate_share(struct run *r);

/* The --limit-rate bucket: limit_rate bytes/s flow in, at most BURST_MS of
 * them saved up; every byte received takes its share (going below zero
 * when libcurl hands over more at once). Paused transfers resume once it is
 * positive again. Returns the ms until it will be (0 = now or no cap). */
#define BURST_MS 50
static int bucket_refill(struct run *r)
{
	uint64_t lim = r->p->limit_rate;
	if (!lim)
		return 0;
	uint64_t now = now_ms();
	double cap = (double)lim * BURST_MS / 1000.0;
	if (cap < 16384)
		cap = 16384;
	r->tokens += (double)(now - r->tokens_t) * (double)lim / 1000.0;
	if (r->tokens > cap)
		r->tokens = cap;
	r->tokens_t = now;
	if (r->tokens <= 0)
		return (int)(-r->tokens * 1000.0 / (double)lim) + 1;
	for (size_t i = 0; i < r->nfiles && r->npaused; i++)
		for (struct seg *s = r->files[i].segs; s; s = s->next)
			if (s->paused) {
				s->paused = 0; /* first: the resume may call on_write at once */
				r->npaused--;
				curl_easy_pause(s->h, CURLPAUSE_CONT);
			}
	return 0;
}

static enum sfw_status schedule(struct run *r, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	unsigned active = 0;
	for (size_t i = 0; i < r->nfiles; i++)
		active += r->files[i].state == F_ACTIVE;
	uint64_t now = now_ms();
	for (size_t i = 0; i < r->nfiles; i++) {
		struct file *f = &r->files[i];
		if (f->state == F_PENDING && active < p->jobs) {
			enum sfw_status st = file_activate(r, f, err);
			if (st == SFW_E_LOCKED) {
				f->locked = 1;
				snprintf(f->last_err, sizeof(f->last_err), "%s", err->msg);
				file_close(f);
				f->state = F_FAILED;
				emit(r, SFW_EV_FILE_FAILED, f, -1, f->last_err);
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
			enum sfw_status st = file_finish(r, f, err);
			if (st != SFW_OK)
				return st;
			if (f->state != F_ACTIVE) {
				active--;
				continue;
			}
		}
		if (!f->exhausted &&
		    (f->cur_src < 0 || f->src_failed[f->cur_src] || r->srcs[f->cur_src].demoted))
			f->cur_src = pick_source(r, f);
		if (f->cur_src < 0) {
			if (f->nactive == 0) {
				file_fail(r, f);
				active--;
			}
			continue;
		}
		while (f->ntodo && f->nactive < (int)p->connections && now >= f->not_before) {
			enum sfw_status st = seg_start(r, f, f->cur_src, err);
			if (st != SFW_OK)
				return st;
		}
	}
	/* the batch of verified files is synced when full, when it has waited
	 * long enough, or when nothing else is in flight */
	if (r->nverified && (r->nverified >= SYNC_BATCH || now - r->verified_since >= SYNC_WAIT_MS || !r->nhandles)) {
		enum sfw_status st = finish_batch(r, err);
		if (st != SFW_OK)
			return st;
		r->woke = 1; /* jobs freed: more files may start */
	}
	rate_share(r);
	return SFW_OK;
}

/* --limit-rate caps the sum: each transfer gets an equal share
 * (CURLOPT_MAX_RECV_SPEED_LARGE, which libcurl reads as the transfer runs),
 * recomputed whenever the number of transfers changes. */
static void rate_share(struct run *r)
{
	if (!r->p->limit_rate || r->nhandles == r->rate_nhandles)
		return;
	r->rate_nhandles = r->nhandles;
	if (!r->nhandles)
		return;
	curl_off_t share = (curl_off_t)(r->p->limit_rate / (uint64_t)r->nhandles);
	if (share < 1)
		share = 1;
	for (size_t i = 0; i < r->nfiles; i++)
		for (struct seg *s = r->files[i].segs; s; s = s->next)
			curl_easy_setopt(s->h, CURLOPT_MAX_RECV_SPEED_LARGE, share);
}

/* Can src take a part of f now? (not struck for it, not demoted, and able to
 * answer a Range) */
static int src_usable(struct run *r, struct file *f, size_t src)
{
	return !f->src_failed[src] && !f->norange[src] && !r->srcs[src].demoted;
}

/* Stops s and gives its rest back to the file's plan: the bytes it wrote
 * stay done, [pos, end) is fetched again by whoever the scheduler picks. */
static enum sfw_status seg_requeue(struct run *r, struct seg *s, struct sfw_err *err)
{
	struct file *f = s->f;
	int e = seg_flush(s);
	if (e) /* unwritten bytes are not done */
		s->pos -= s->wlen;
	uint64_t a = s->pos, b = s->end;
	int bad = s->pos > s->start && push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0;
	f->ndone = sfw_fetch_normalize_ranges(f->done, f->ndone, UINT64_MAX, f->mf->size, NULL);
	seg_free(r, s);
	if (bad || push_range(&f->todo, &f->ntodo, &f->captodo, a, b, 1) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (e)
		return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s", f->part,
				strerror(e));
	return SFW_OK;
}

static void human_rate(char *out, size_t n, double b)
{
	if (b >= 1e6)
		snprintf(out, n, "%.1f MB/s", b / 1e6);
	else
		snprintf(out, n, "%.0f KB/s", b / 1e3);
}

/* slow is several times slower than fast: demote it, and every transfer on
 * it whose file can go to a faster source gives its rest back. */
static enum sfw_status demote_slow(struct run *r, int slow, int fast, double slow_rate, struct sfw_err *err)
{
	struct src *s = &r->srcs[slow];
	char a[32], b[32], msg[300];
	human_rate(a, sizeof(a), slow_rate);
	human_rate(b, sizeof(b), r->srcs[fast].rate);
	snprintf(msg, sizeof(msg), "%s per connection against %s from %s: its remaining ranges go to the faster source",
		 a, b, r->srcs[fast].label);
	s->demoted = 1;
	emit(r, SFW_EV_SOURCE_DEMOTED, NULL, slow, msg);
	for (size_t i = 0; i < r->nfiles; i++) {
		struct file *f = &r->files[i];
		if (f->state != F_ACTIVE)
			continue;
		int alt = 0;
		for (size_t k = 0; k < r->nsrcs; k++)
			alt |= (int)k != slow && src_usable(r, f, k);
		if (!alt)
			continue;
		for (struct seg *g = f->segs, *next; g; g = next) {
			next = g->next;
			if (g->src == slow) {
				enum sfw_status st = seg_requeue(r, g, err);
				if (st != SFW_OK)
					return st;
			}
		}
		if (f->cur_src == slow)
			f->cur_src = pick_source(r, f);
	}
	return SFW_OK;
}

/* Every MEASURE_MS: each transfer's rate over its last window, each source's
 * best per-connection rate, then at most one decision: demote a source
 * several times slower than another usable one, or probe an unmeasured one
 * with the tail of a transfer that still has a while to go. */
static enum sfw_status measure(struct run *r, struct sfw_err *err)
{
	uint64_t now = now_ms();
	if (now - r->last_measure < MEASURE_MS)
		return SFW_OK;
	r->last_measure = now;
	double *best = sfw_calloc(r->nsrcs ? r->nsrcs : 1, sizeof(*best));
	if (!best)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < r->nfiles; i++)
		for (struct seg *s = r->files[i].segs; s; s = s->next) {
			if (now - s->win_t < WINDOW_MS)
				continue;
			s->rate = (double)(s->pos - s->win_pos) * 1000.0 / (double)(now - s->win_t);
			s->rate_ok = 1;
			s->win_t = now;
			s->win_pos = s->pos;
			s->held_win = s->held;
			s->held = s->paused;
			if (s->rate > best[s->src])
				best[s->src] = s->rate;
		}
	for (size_t i = 0; i < r->nsrcs; i++)
		if (best[i] > 0)
			r->srcs[i].rate = best[i];
	sfw_free(best);
	for (size_t i = 0; i < r->nfiles; i++) {
		struct file *f = &r->files[i];
		if (f->state != F_ACTIVE)
			continue;
		for (struct seg *s = f->segs; s; s = s->next) {
			/* judged once it has sent something (before its first byte
			 * the connect and stall timeouts are the judges), and not when
			 * the --limit-rate cap held it back (the cap set its pace) */
			if (!s->rate_ok || s->pos >= s->end || s->pos == s->launch_pos || s->held_win)
				continue;
			uint64_t rem = s->end - s->pos;
			int fast = -1, unknown = -1;
			for (size_t k = 0; k < r->nsrcs; k++) {
				if ((int)k == s->src || !src_usable(r, f, k))
					continue;
				double rk = r->srcs[k].rate;
				switch (sfw_fetch_speed_verdict(s->rate, rem, rk)) {
				case SFW_SPEED_MOVE:
					if (fast < 0 || rk > r->srcs[fast].rate)
						fast = (int)k;
					break;
				case SFW_SPEED_PROBE:
					if (unknown < 0 && !r->srcs[k].probing && !f->probed[k])
						unknown = (int)k;
					break;
				case SFW_SPEED_KEEP:
					break;
				}
			}
			if (fast >= 0)
				return demote_slow(r, s->src, fast, s->rate, err);
			if (unknown < 0)
				continue;
			/* probe: the tail of this range goes to the unmeasured source */
			uint64_t len = rem / 2 < PROBE_MAX ? rem / 2 : PROBE_MAX;
			uint64_t mid = s->end - len;
			if (push_range(&f->todo, &f->ntodo, &f->captodo, mid, s->end, 1) != 0)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
			s->end = mid;
			s->cut = 1;
			enum sfw_status st = seg_start(r, f, unknown, err);
			if (st != SFW_OK)
				return st;
			f->segs->probe = 1; /* seg_start puts the new one first */
			r->srcs[unknown].probing = 1;
			f->probed[unknown] = 1;
			return SFW_OK;
		}
	}
	return SFW_OK;
}

static void progress(struct run *r, int force)
{
	uint64_t now = now_ms();
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
		if (r->files[i].state == F_ACTIVE && !emit(r, SFW_EV_PROGRESS, &r->files[i], r->files[i].cur_src, NULL))
			r->cancelled = 1;
	if (!emit(r, SFW_EV_PROGRESS, NULL, -1, NULL))
		r->cancelled = 1;
}

static enum sfw_status flush_all(struct run *r, struct sfw_err *err)
{
	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].state == F_ACTIVE) {
			enum sfw_status st = journal_flush(r, &r->files[i], err);
			if (st != SFW_OK)
				return st;
		}
	return SFW_OK;
}

static enum sfw_status run_loop(struct run *r, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	r->last_progress = r->last_journal = r->tokens_t = now_ms();
	r->tokens = (double)p->limit_rate * BURST_MS / 1000.0;
	for (;;) {
		if (r->cancelled || (p->cancel && *p->cancel)) {
			r->cancelled = 1;
			return SFW_E_ABORTED;
		}
		r->woke = 0;
		enum sfw_status st = schedule(r, err);
		if (st == SFW_OK)
			st = measure(r, err);
		if (st != SFW_OK)
			return st;
		int busy = r->nverified > 0;
		for (size_t i = 0; i < r->nfiles && !busy; i++)
			busy |= r->files[i].state == F_ACTIVE || r->files[i].state == F_PENDING;
		if (!busy)
			return SFW_OK;
		int running = 0;
		int owed_ms = bucket_refill(r);
		if (curl_multi_perform(r->multi, &running) != CURLM_OK)
			return sfw_fail(err, SFW_E_NET, "libcurl multi failed");
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(r->multi, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct seg *s = NULL;
			CURLcode cc = msg->data.result;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
			st = seg_done(r, s, cc, err);
			if (st != SFW_OK)
				return st;
		}
		uint64_t now = now_ms();
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
			struct file *f = &r->files[i];
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

/* ---- manifest ------------------------------------------------------------------------ */

static size_t buf_write(char *p, size_t sz, size_t nm, void *u)
{
	return sfw_buf_append(u, p, sz * nm) == SFW_OK ? sz * nm : 0;
}

static enum sfw_status http_get_small(const struct sfw_fetch_params *p, const char *url, size_t max,
				      struct sfw_buf *out, struct sfw_err *err)
{
	char ebuf[CURL_ERROR_SIZE];
	for (unsigned attempt = 1;; attempt++) {
		sfw_buf_init(out, max);
		CURL *h = curl_easy_init();
		if (!h)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		ebuf[0] = '\0';
		curl_easy_setopt(h, CURLOPT_URL, url);
		curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
		curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, sfw_fetch_redir_protocols(url));
		curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
		curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
		curl_easy_setopt(h, CURLOPT_USERAGENT, "salafw/" SFW_VERSION);
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, p->connect_timeout_s);
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, p->stall_bytes_per_s);
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, p->stall_timeout_s);
		curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
		CURLcode cc = curl_easy_perform(h);
		long status = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		curl_easy_cleanup(h);
		if (cc == CURLE_OK)
			return SFW_OK;
		sfw_buf_release(out);
		if (cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED)
			return sfw_fail(err, SFW_E_MANIFEST, "'%s' is larger than %zu bytes", url, max);
		enum sfw_fetch_class c = sfw_fetch_classify(cc, status);
		if (cc == CURLE_HTTP_RETURNED_ERROR && (status == 404 || status == 410))
			return sfw_fail(err, SFW_E_HTTP, "'%s' is not there (HTTP %ld)", url, status);
		if (c != SFW_FETCH_RETRY || attempt > p->max_retries || (p->cancel && *p->cancel))
			return sfw_fail(err, cc == CURLE_OUT_OF_MEMORY ? SFW_E_NOMEM : SFW_E_NET,
					"cannot fetch '%s': %s", url,
					ebuf[0] ? ebuf : curl_easy_strerror(cc));
		uint64_t d = sfw_fetch_backoff_ms(attempt, p->backoff_base_ms, p->backoff_cap_ms, 0,
						  (uint32_t)now_ms() * 2654435761u);
		usleep((useconds_t)(d > 60000 ? 60000 : d) * 1000);
	}
}

static int is_url(const char *s)
{
	return strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0;
}

static enum sfw_status load_manifest(const struct sfw_fetch_params *p, struct sfw_buf *man, struct sfw_buf *sig,
				     char **what, struct sfw_err *err)
{
	char *loc;
	if (p->manifest)
		loc = sfw_strdup(p->manifest);
	else if (p->repo_id)
		loc = sfw_fetch_manifest_url(p->endpoint ? p->endpoint : DEFAULT_ENDPOINT, p->repo_id);
	else
		return sfw_fail(err, SFW_E_INVAL, "no repository and no --manifest given");
	if (!loc)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t n = strlen(loc);
	char *sloc = sfw_malloc(n + 9);
	if (!sloc) {
		sfw_free(loc);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	memcpy(sloc, loc, n);
	memcpy(sloc + n, ".minisig", 9);
	enum sfw_status st;
	if (is_url(loc)) {
		st = http_get_small(p, loc, SFW_MANIFEST_MAX, man, err);
		if (st == SFW_E_HTTP && !p->manifest && err && err->code == SFW_E_HTTP)
			sfw_fail(err, st,
				 "repository '%s' is not on '%s' (no manifest at '%s'): check the name, or give "
				 "--endpoint or --manifest",
				 p->repo_id, p->endpoint ? p->endpoint : DEFAULT_ENDPOINT, loc);
		if (st == SFW_OK) {
			st = http_get_small(p, sloc, SFW_MINISIG_MAX, sig, err);
			if (st != SFW_OK)
				sfw_buf_release(man);
		}
	} else {
		st = sfw_read_file(loc, SFW_MANIFEST_MAX, man, err);
		if (st == SFW_OK) {
			st = sfw_read_file(sloc, SFW_MINISIG_MAX, sig, err);
			if (st != SFW_OK)
				sfw_buf_release(man);
		}
		if (st == SFW_E_RANGE || st == SFW_E_MISSING) {
			/* too large: rejected as a manifest; absent: a local error, not
			 * "verification failed" */
			st = st == SFW_E_RANGE ? SFW_E_MANIFEST : SFW_E_IO;
			if (err)
				err->code = st;
		}
	}
	sfw_free(sloc);
	if (st != SFW_OK) {
		sfw_free(loc);
		return st;
	}
	*what = loc;
	return SFW_OK;
}

/* ---- the whole get ---------------------------------------------------------------------- */

static enum sfw_status space_check(struct run *r, struct sfw_err *err)
{
	uint64_t need = 0;
	for (size_t i = 0; i < r->nfiles; i++) {
		struct file *f = &r->files[i];
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

static void files_release(struct run *r)
{
	for (size_t i = 0; i < r->nfiles; i++) {
		struct file *f = &r->files[i];
		while (f->segs)
			seg_free(r, f->segs);
		file_close(f);
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

static enum sfw_status add_sources(struct run *r, const struct sfw_source *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct src *s = &r->srcs[r->nsrcs++];
		s->s = v[i];
		s->label = v[i].name && v[i].name[0] ? v[i].name : v[i].url;
	}
	return SFW_OK;
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
	uint64_t t_start = now_ms();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		return sfw_fail(err, SFW_E_NOMEM, "cannot initialise libcurl");

	/* 1. manifest: fetched, then verified, before anything touches DEST */
	struct sfw_buf man, sig;
	char *what = NULL;
	enum sfw_status st = load_manifest(p, &man, &sig, &what, err);
	if (st != SFW_OK)
		return st;
	struct sfw_trust_params tp = p->trust;
	tp.repo_id = p->repo_id;
	tp.revision = p->revision;
	struct sfw_manifest m;
	memset(&m, 0, sizeof(m));
	struct sfw_minisig_info info;
	st = sfw_manifest_verify(man.data, man.len, sig.data, sig.len, what, &tp, &m, &info, err);
	if (st != SFW_OK) {
		sfw_free(what);
		sfw_buf_release(&man);
		sfw_buf_release(&sig);
		return st;
	}
	snprintf(sum->repo_id, sizeof(sum->repo_id), "%s", m.repo_id ? m.repo_id : "");
	snprintf(sum->revision, sizeof(sum->revision), "%s", m.revision);
	sum->nfiles = m.nfiles;

	struct run r;
	memset(&r, 0, sizeof(r));
	r.p = p;
	r.m = &m;
	r.dest = p->dest;
	r.rng = (uint32_t)(now_ms() ^ ((uint64_t)getpid() << 16)) | 1;
	r.fatal = SFW_OK;
	r.dfd = r.sfd = r.pfd = -1;
	int lockfd = -1;
	char *sdir = NULL, *pdir = NULL;

	/* Defence in depth: the manifest parser validated every path already. */
	for (size_t i = 0; i < m.nfiles; i++)
		if ((st = sfw_path_check(m.files[i].path, err)) != SFW_OK)
			goto out;

	size_t ns = p->nmirrors_first + m.nsources + p->nmirrors_last;
	r.srcs = sfw_calloc(ns ? ns : 1, sizeof(*r.srcs));
	r.files = sfw_calloc(m.nfiles ? m.nfiles : 1, sizeof(*r.files));
	r.hashbuf = sfw_malloc_aligned(4096, HASH_CHUNK);
	if (!r.srcs || !r.files || !r.hashbuf) {
		st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	add_sources(&r, p->mirrors_first, p->nmirrors_first);
	add_sources(&r, m.sources, m.nsources);
	for (size_t i = p->nmirrors_first; i < r.nsrcs; i++)
		if (r.srcs[i].s.kind == SFW_SOURCE_HF) {
			r.srcs[i].bearer = 1;
			if (p->hf_endpoint)
			{
				if (r.srcs[i].label == r.srcs[i].s.url)
					r.srcs[i].label = p->hf_endpoint;
				r.srcs[i].s.url = (char *)p->hf_endpoint;
			}
		}
	add_sources(&r, p->mirrors_last, p->nmirrors_last);
	r.nfiles = m.nfiles;

	/* 2. DEST bookkeeping: folders, lock. The verified manifest bytes are
	 * copied only on success (6.): until then DEST keeps the manifest its
	 * files were last verified against (nothing below reads the copies). */
	sdir = sfw_path_join(p->dest, ".salafw");
	pdir = sfw_path_join(p->dest, ".salafw/partial");
	if (!sdir || !pdir) {
		st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	/* DEST itself as named (made if missing), then .salafw and partial/ as
	 * real folders of this user's, never through a symlink */
	if ((st = sfw_mkdirs(p->dest, err)) != SFW_OK || (st = sfw_dir_open(p->dest, &r.dfd, err)) != SFW_OK ||
	    (st = sfw_dir_openat(r.dfd, p->dest, ".salafw", SFW_DIR_CREATE | SFW_DIR_OWNED, &r.sfd, err)) != SFW_OK ||
	    (st = sfw_dir_openat(r.sfd, sdir, "partial", SFW_DIR_CREATE | SFW_DIR_OWNED, &r.pfd, err)) != SFW_OK)
		goto out;
	lockfd = take_dest_lock(r.sfd, p->dest, err, &st);
	if (st != SFW_OK)
		goto out;
	{
		char msg[300];
		snprintf(msg, sizeof(msg), "%s (%s@%s, %zu files)", what, m.repo_id, m.revision, m.nfiles);
		r.t0 = now_ms();
		if (!emit(&r, SFW_EV_MANIFEST, NULL, -1, msg)) {
			st = sfw_fail(err, SFW_E_ABORTED, "cancelled");
			goto out;
		}
	}

	/* 3. what is already there and verified is skipped */
	for (size_t i = 0; i < m.nfiles; i++) {
		struct file *f = &r.files[i];
		char hex[65], tag[17];
		sfw_hex_encode(m.files[i].sha256, 32, hex);
		/* content + path: equal files each get their own partial and lock,
		 * and resume still finds the partial of the same path */
		sfw_fetch_path_tag(m.files[i].path, tag);
		char name[100];
		f->idx = i;
		f->mf = &m.files[i];
		f->fd = -1;
		f->cur_src = -1;
		snprintf(name, sizeof(name), "%s-%s.part", hex, tag);
		f->pname = sfw_strdup(name);
		f->part = sfw_path_join(pdir, name);
		snprintf(name, sizeof(name), "%s-%s.json", hex, tag);
		f->jname = sfw_strdup(name);
		f->journal = sfw_path_join(pdir, name);
		f->final = sfw_path_join(p->dest, m.files[i].path);
		f->src_failed = sfw_calloc(ns ? ns : 1, 1);
		f->contributed = sfw_calloc(ns ? ns : 1, 1);
		f->norange = sfw_calloc(ns ? ns : 1, 1);
		f->stalls = sfw_calloc(ns ? ns : 1, 1);
		f->probed = sfw_calloc(ns ? ns : 1, 1);
		if (!f->part || !f->journal || !f->pname || !f->jname || !f->final || !f->src_failed ||
		    !f->contributed || !f->norange || !f->stalls || !f->probed) {
			st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto out;
		}
	}
	{
		struct sfw_verify_params vp = sfw_verify_default_params();
		vp.record_state = 0;
		struct sfw_verify_report rep;
		memset(&rep, 0, sizeof(rep));
		struct sfw_err verr;
		sfw_err_clear(&verr);
		enum sfw_status vs = sfw_verify_dir(p->dest, &m, &vp, &rep, &verr);
		if (vs != SFW_OK && !rep.results) {
			st = sfw_fail(err, vs, "%s", verr.msg);
			goto out;
		}
		for (size_t i = 0; i < m.nfiles; i++)
			if (rep.results && rep.results[i] == SFW_FILE_OK) {
				r.files[i].state = F_SKIPPED;
				r.files[i].id = rep.ids[i];
				/* a leftover partial of a file already in place is useless */
				unlinkat(r.pfd, r.files[i].pname, 0);
				unlinkat(r.pfd, r.files[i].jname, 0);
				r.files[i].have = m.files[i].size;
				sum->nskipped++;
				emit(&r, SFW_EV_SKIP, &r.files[i], -1, "already present and verified");
				r.files[i].have = 0;
			}
		sfw_verify_report_release(&rep);
	}
	for (size_t i = 0; i < m.nfiles; i++)
		if (r.files[i].state == F_PENDING && !selected(p, m.files[i].path)) {
			r.files[i].state = F_UNSELECTED;
			sum->nfiles--;
		}
	for (size_t i = 0; i < m.nfiles; i++)
		if (r.files[i].state == F_PENDING)
			r.plan_total += m.files[i].size;

	/* 4. refuse before starting when the disk cannot hold it */
	if (!p->no_space_check && (st = space_check(&r, err)) != SFW_OK)
		goto out;
	if (ns == 0 && r.plan_total + 0 > 0) {
		for (size_t i = 0; i < m.nfiles; i++)
			if (r.files[i].state == F_PENDING) {
				st = sfw_fail(err, SFW_E_EXHAUSTED, "the manifest lists no sources; give one with --mirror");
				goto out;
			}
	}
	emit(&r, SFW_EV_PLAN, NULL, -1, NULL);

	/* 5. download */
	r.multi = curl_multi_init();
	if (!r.multi) {
		st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	/* + one per source: a probe (measure()) never waits for a free slot */
	curl_multi_setopt(r.multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)(p->jobs * p->connections + ns));
	st = run_loop(&r, err);
	if (r.nverified) { /* verified before a stop: still installed */
		struct sfw_err berr;
		sfw_err_clear(&berr);
		enum sfw_status bs = finish_batch(&r, &berr);
		if (bs != SFW_OK && st == SFW_OK)
			st = sfw_fail(err, bs, "%s", berr.msg);
	}
	{
		/* whatever happened, keep every byte written resumable */
		struct sfw_err ferr;
		sfw_err_clear(&ferr);
		for (size_t i = 0; i < r.nfiles; i++) {
			struct file *f = &r.files[i];
			while (f->segs) {
				struct seg *s = f->segs;
				if (seg_flush(s) != 0) /* unwritten bytes are not done */
					s->pos -= s->wlen;
				if (s->pos > s->start &&
				    push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0 && st == SFW_OK)
					st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
				seg_free(&r, s);
			}
			if (f->state == F_ACTIVE) {
				f->dirty = 1;
				if (journal_flush(&r, f, &ferr) != SFW_OK && st == SFW_OK)
					st = sfw_fail(err, ferr.code, "%s", ferr.msg);
			}
		}
	}
	if (st == SFW_E_ABORTED && (!err || !err->msg[0] || err->code != SFW_E_ABORTED))
		st = sfw_fail(err, SFW_E_ABORTED, "interrupted; run the same command again to resume");
	progress(&r, 1);
	{
		size_t nfail = 0;
		struct file *first = NULL;
		for (size_t i = 0; i < r.nfiles; i++) {
			if (r.files[i].state == F_DONE)
				sum->ndownloaded++;
			if (r.files[i].state == F_FAILED && !nfail++)
				first = &r.files[i];
		}
		/* a partial held by another process is a local condition (exit 5) */
		int locked = 0;
		for (size_t i = 0; i < r.nfiles && !locked; i++)
			if (r.files[i].state == F_FAILED && r.files[i].locked) {
				locked = 1;
				first = &r.files[i];
			}
		sum->nfailed = nfail;
		/* every failure a sha256 mismatch: say "verification failed" (exit 1) */
		int all_hash = nfail > 0;
		for (size_t i = 0; i < r.nfiles; i++)
			if (r.files[i].state == F_FAILED && strcmp(r.files[i].last_err, "sha256 mismatch") != 0)
				all_hash = 0;
		if (st == SFW_OK && nfail)
			st = sfw_fail(err, all_hash ? SFW_E_HASH : locked ? SFW_E_LOCKED : SFW_E_EXHAUSTED,
				      "%zu file%s failed; '%s': %s", nfail, nfail == 1 ? "" : "s",
				      first->mf->path, first->last_err[0] ? first->last_err : "every source failed");
	}
	if (st == SFW_OK) {
		/* 6. remember what was verified (rollback ratchet, offline verify):
		 * each file as it was when its sha256 matched; one changed since
		 * (while others downloaded) is refused by the record */
		struct sfw_state_file *paths = sfw_calloc(m.nfiles ? m.nfiles : 1, sizeof(*paths));
		if (!paths) {
			st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < m.nfiles; i++)
			paths[i].path = m.files[i].path, paths[i].ok = r.files[i].state != F_UNSELECTED,
			paths[i].id = r.files[i].id;
		st = sfw_manifest_ratchet_commit(&m, &tp, err);
		if (st == SFW_OK)
			st = sfw_state_install_manifest(p->dest, man.data, man.len, sig.data, sig.len, err);
		if (st == SFW_OK)
			st = sfw_state_record(p->dest, &m, paths, m.nfiles, err);
		sfw_free(paths);
		if (st == SFW_OK)
			unlinkat(r.sfd, "partial", AT_REMOVEDIR); /* only when empty */
	}
	sum->received = r.received;
	sum->resumed = r.resumed;
	sum->discarded = r.discarded;
	emit(&r, SFW_EV_DONE, NULL, -1, st == SFW_OK ? "ok" : (err ? err->msg : sfw_strerror(st)));
out:
	sum->received = r.received;
	sum->resumed = r.resumed;
	sum->discarded = r.discarded;
	sum->seconds = (double)(now_ms() - t_start) / 1000.0;
	if (r.files)
		files_release(&r);
	if (r.multi)
		curl_multi_cleanup(r.multi);
	sfw_free(r.srcs);
	sfw_free(r.hashbuf);
	if (lockfd >= 0)
		close(lockfd);
	for (int *fdp = &r.dfd; fdp <= &r.pfd; fdp++)
		if (*fdp >= 0)
			close(*fdp);
	sfw_free(sdir);
	sfw_free(pdir);
	sfw_free(what);
	sfw_manifest_release(&m);
	sfw_buf_release(&man);
	sfw_buf_release(&sig);
	return st;
}
