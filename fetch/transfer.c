/* transfer.c - one libcurl transfer of one byte range of one file: the
 * easy handle, the header and body callbacks (bodies are written at their
 * final offsets, hashed inline at the hash position), the response checks,
 * the --limit-rate bucket, and what happens when a transfer ends (seg_done:
 * keep its bytes, then retry, move on, or restart). */

#include "fetch/internal.h"

#include "alloc.h"
#include "file.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

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
	struct sfwi_seg *s = u;
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

static int commit_ok(struct sfwi_run *r, struct sfwi_seg *s)
{
	return r->srcs[s->src].s.kind != SFW_SOURCE_HF || !s->commit[0] || strcmp(s->commit, r->m->revision) == 0;
}

static int check_first(struct sfwi_run *r, struct sfwi_seg *s)
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
	struct sfwi_seg *s = u;
	struct sfwi_run *r = s->run;
	struct sfwi_file *f = s->f;
	size_t n = sz * nm;
	if (r->p->limit_rate && r->tokens <= 0 && n) {
		/* over the cap: libcurl keeps these bytes and hands them over
		 * again when sfwi_bucket_refill() resumes the transfer */
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
		int e = s->wlen == WRITE_COALESCE ? sfwi_seg_flush(s) : 0;
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

void sfwi_seg_free(struct sfwi_run *r, struct sfwi_seg *s)
{
	if (s->h) {
		curl_multi_remove_handle(r->multi, s->h);
		curl_easy_cleanup(s->h);
		r->nhandles--;
	}
	struct sfwi_file *f = s->f;
	if (s->probe)
		r->srcs[s->src].probing = 0;
	if (s->paused)
		r->npaused--;
	r->woke = 1;
	for (struct sfwi_seg **pp = &f->segs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	f->nactive--;
	sfw_free(s->wbuf);
	sfw_free(s);
}

/* Writes the coalesced bytes at their offset; returns 0 or an errno. */
int sfwi_seg_flush(struct sfwi_seg *s)
{
	if (!s->wlen)
		return 0;
	struct sfwi_file *f = s->f;
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

enum sfw_status sfwi_seg_start(struct sfwi_run *r, struct sfwi_file *f, int src, struct sfw_err *err)
{
	const struct sfw_fetch_params *p = r->p;
	struct sfw_range rg = f->todo[0];
	struct sfwi_seg *s = sfw_calloc(1, sizeof(*s));
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
	s->t_launch = s->win_t = sfwi_now_ms();
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
	if (p->limit_rate) { /* this transfer's share: sfwi_rate_share() keeps the sum at the cap */
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

static const char *reason_text(enum sfwi_reason rs)
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

/* The only source left ignores Range and a transfer broke: count an attempt;
 * within the budget the file starts over from byte 0 as one plain request
 * after the backoff, past it the source is struck. */
static enum sfw_status restart_whole(struct sfwi_run *r, struct sfwi_file *f, int src, const char *why,
				     struct sfw_err *err)
{
	if (++f->attempts > r->p->max_retries) {
		snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfers kept breaking (%s)",
			 r->srcs[src].label, why);
		if (!f->src_failed[src])
			sfwi_strike_source(r, src, f, "server ignores Range and its transfers kept breaking");
		return SFW_OK;
	}
	enum sfw_status st = sfwi_file_reset(r, f, err);
	if (st != SFW_OK)
		return st;
	f->ntodo = 0;
	if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, 0, f->mf->size, 0) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	uint64_t delay =
		sfw_fetch_backoff_ms(f->attempts, r->p->backoff_base_ms, r->p->backoff_cap_ms, 0, sfwi_rnd32(r));
	uint64_t due = sfwi_now_ms() + delay;
	if (due > f->not_before)
		f->not_before = due;
	char msg[240];
	snprintf(msg, sizeof(msg), "%s; it ignores Range: starting the file over from byte 0 (attempt %u of %u)",
		 why, f->attempts, r->p->max_retries);
	sfwi_emit_delay(r, f, src, msg, delay);
	return SFW_OK;
}

/* What a finished transfer leaves behind once its handle is gone. */
struct ended {
	struct sfwi_file *f;
	int src;
	long status;
	CURLcode cc;
	enum sfwi_reason rs;
	int probe, progressed, io_errno, oom;
	int checked; /* its response's body had begun */
	uint64_t rest_a, rest_b; /* the part of its range it did not get */
	char retry_after[80];
	char ebuf[CURL_ERROR_SIZE];
};

/* A transfer ended: everything received goes to disk, the bytes it got join
 * the file's done ranges, a whole transfer's speed feeds its source's rate,
 * and the handle is freed; *e keeps what the decision needs. */
static void seg_settle(struct sfwi_run *r, struct sfwi_seg *s, CURLcode cc, struct ended *e)
{
	struct sfwi_file *f = s->f;
	long status = s->status;
	int we = sfwi_seg_flush(s);
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
	e->oom = s->pos > s->start && sfwi_push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0;
	f->ndone = sfw_fetch_normalize_ranges(f->done, f->ndone, UINT64_MAX, f->mf->size, NULL);
	e->f = f;
	e->src = s->src;
	e->status = status;
	e->progressed = s->pos > s->launch_pos;
	e->rest_a = s->pos;
	e->rest_b = s->end;
	e->rs = s->reason;
	e->probe = s->probe;
	e->checked = s->checked;
	if (e->rs == R_CUT && e->rest_a == e->rest_b) { /* stopped at its cut: complete */
		e->rs = R_NONE;
		cc = CURLE_OK;
	}
	e->cc = cc;
	/* what a whole transfer achieved feeds its source's measured rate */
	uint64_t got = s->pos - s->launch_pos, dt = sfwi_now_ms() - s->t_launch;
	if (e->rs == R_NONE && cc == CURLE_OK && got >= RATE_SAMPLE_MIN) {
		double sample = (double)got * 1000.0 / (double)(dt ? dt : 1);
		struct sfwi_src *sr = &r->srcs[e->src];
		sr->rate = sr->rate > 0 && !e->probe ? 0.5 * sr->rate + 0.5 * sample : sample;
	}
	e->io_errno = s->io_errno;
	memcpy(e->retry_after, s->retry_after, sizeof(e->retry_after));
	memcpy(e->ebuf, s->errbuf, sizeof(e->ebuf));
	sfwi_seg_free(r, s);
}

/* A 200 to a ranged request (R_RESTART): the source ignores Range. */
static enum sfw_status seg_ignored_range(struct sfwi_run *r, struct ended *e, struct sfw_err *err)
{
	struct sfwi_file *f = e->f;
	int src = e->src;
	if (e->probe) {
		/* a probe's ranged request answered with the whole file: this source
		 * cannot take part of a file; the range goes back to the others */
		f->norange[src] = 1;
		if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, e->rest_a, e->rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return SFW_OK;
	}
	if (f->norange[src] && !sfwi_other_source(r, f, src)) {
		/* the only source left ignores Range: every retry starts over from
		 * byte 0, one attempt each, within the retry budget */
		return restart_whole(r, f, src, "server ignores Range: restarting the file from byte 0", err);
	}
	if (f->norange[src]) {
		/* Range ignored again after a restart from byte 0: its transfers keep
		 * breaking, and restarting never counts an attempt, so take the rest
		 * from the next source instead of going round for ever. */
		if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, e->rest_a, e->rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfer broke again",
			 r->srcs[src].label);
		if (!f->src_failed[src])
			sfwi_strike_source(r, src, f, "server ignores Range and its transfer broke again");
		return SFW_OK;
	}
	/* Start the file over as one plain request from byte 0 (never append a
	 * 200). */
	f->norange[src] = 1;
	enum sfw_status st = sfwi_file_reset(r, f, err);
	if (st != SFW_OK)
		return st;
	f->ntodo = 0;
	if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, 0, f->mf->size, 0) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	sfwi_emit(r, SFW_EV_RETRY, f, src, "server ignored Range (200): restarting the file from byte 0");
	return SFW_OK;
}

/* The transfer failed: its rest goes back to the plan, then by the failure's
 * class the source is retried after a backoff or struck for this file, or
 * the run stops. */
static enum sfw_status seg_failed(struct sfwi_run *r, struct ended *e, struct sfw_err *err)
{
	struct sfwi_file *f = e->f;
	int src = e->src;
	long status = e->status;
	CURLcode cc = e->cc;
	if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, e->rest_a, e->rest_b, 1) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_fetch_class cls;
	const char *why = reason_text(e->rs);
	if (!why && !e->checked && sfw_fetch_header_too_large((int)cc))
		why = SFW_FETCH_HEADER_MSG;
	if (why)
		cls = SFW_FETCH_NEXT_SOURCE;
	else if (e->rs == R_HTTP)
		cls = sfw_fetch_classify(CURLE_HTTP_RETURNED_ERROR, status);
	else
		cls = sfw_fetch_classify(cc, status);
	char msg[200];
	if (why)
		snprintf(msg, sizeof(msg), "%s", why);
	else if (e->rs == R_HTTP || (cc == CURLE_OK && status != 200 && status != 206))
		snprintf(msg, sizeof(msg), "HTTP %ld", status);
	else if (cc == CURLE_OK)
		snprintf(msg, sizeof(msg), "connection closed at byte %llu of range ending at %llu",
			 (unsigned long long)e->rest_a, (unsigned long long)e->rest_b);
	else
		snprintf(msg, sizeof(msg), "%s", e->ebuf[0] ? e->ebuf : curl_easy_strerror(cc));
	snprintf(f->last_err, sizeof(f->last_err), "%s: %s", r->srcs[src].label, msg);
	if (cls == SFW_FETCH_FATAL)
		return sfw_fail(err, cc == CURLE_OUT_OF_MEMORY ? SFW_E_NOMEM : SFW_E_NET, "'%s': %s", f->mf->path,
				msg);
	if (cls == SFW_FETCH_SOURCE_DOWN) {
		sfwi_source_down(r, src, f, msg);
		return SFW_OK;
	}
	if (f->norange[src] && cls == SFW_FETCH_RETRY) {
		/* it ignores Range, so resuming from here is impossible: move on if
		 * another source can serve the file, else start over from byte 0
		 * (the bytes of this attempt are lost, so progress resets nothing) */
		if (sfwi_other_source(r, f, src)) {
			snprintf(f->last_err, sizeof(f->last_err), "%s: ignores Range and its transfer broke again",
				 r->srcs[src].label);
			if (!f->src_failed[src])
				sfwi_strike_source(r, src, f, "server ignores Range and its transfer broke again");
			return SFW_OK;
		}
		return restart_whole(r, f, src, msg, err);
	}
	int stalled = cc == CURLE_OPERATION_TIMEDOUT && e->progressed;
	if (stalled && ++f->stalls[src] >= STALL_STRIKES && sfwi_other_source(r, f, src)) {
		/* progress, then a stall, again and again: a failing source (the
		 * only one left still resumes: every retry gains bytes) */
		snprintf(msg, sizeof(msg), "stalled %u times after sending some data", (unsigned)f->stalls[src]);
		snprintf(f->last_err, sizeof(f->last_err), "%s: %s", r->srcs[src].label, msg);
		if (!f->src_failed[src])
			sfwi_strike_source(r, src, f, msg);
		return SFW_OK;
	}
	if (e->progressed)
		f->attempts = 0;
	int64_t ra = -1;
	if (cls == SFW_FETCH_RETRY) {
		if (e->retry_after[0])
			ra = sfw_fetch_retry_after_ms(e->retry_after, (int64_t)time(NULL));
		if (ra > 0 && (uint64_t)ra > r->p->retry_after_max_ms)
			cls = SFW_FETCH_NEXT_SOURCE; /* asked to wait longer than we will */
		else if (++f->attempts > r->p->max_retries)
			cls = SFW_FETCH_NEXT_SOURCE;
	}
	if (cls == SFW_FETCH_NEXT_SOURCE) {
		if (!f->src_failed[src])
			sfwi_strike_source(r, src, f, msg);
		return SFW_OK;
	}
	uint64_t delay = sfw_fetch_backoff_ms(f->attempts, r->p->backoff_base_ms, r->p->backoff_cap_ms,
					      ra > 0 ? (uint64_t)ra : 0, sfwi_rnd32(r));
	uint64_t due = sfwi_now_ms() + delay;
	if (due > f->not_before)
		f->not_before = due;
	sfwi_emit_delay(r, f, src, msg, delay);
	return SFW_OK;
}

/* A transfer ended: keep its bytes, then decide what happens next. */
enum sfw_status sfwi_seg_done(struct sfwi_run *r, struct sfwi_seg *s, CURLcode cc, struct sfw_err *err)
{
	struct ended e;
	seg_settle(r, s, cc, &e);
	struct sfwi_file *f = e.f;
	if (e.oom)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (e.rs == R_IO)
		return sfw_fail(err, e.io_errno == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s",
				f->part, strerror(e.io_errno));
	if (e.rs == R_CANCEL) {
		if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, e.rest_a, e.rest_b, 1) != 0)
			return sfw_fail(err, SFW_E_NOMEM, "out of memory");
		return SFW_OK;
	}
	if (e.rs == R_RESTART)
		return seg_ignored_range(r, &e, err);
	if (e.rs == R_NONE && e.cc == CURLE_OK && e.rest_a == e.rest_b) {
		r->srcs[e.src].fails = 0;
		f->attempts = 0;
		f->stalls[e.src] = 0;
		return SFW_OK;
	}
	return seg_failed(r, &e, err);
}

/* The --limit-rate bucket: limit_rate bytes/s flow in, at most BURST_MS of
 * them saved up; every byte received takes its share (going below zero
 * when libcurl hands over more at once). Paused transfers resume once it is
 * positive again. Returns the ms until it will be (0 = now or no cap). */
int sfwi_bucket_refill(struct sfwi_run *r)
{
	uint64_t lim = r->p->limit_rate;
	if (!lim)
		return 0;
	uint64_t now = sfwi_now_ms();
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
		for (struct sfwi_seg *s = r->files[i].segs; s; s = s->next)
			if (s->paused) {
				s->paused = 0; /* first: the resume may call on_write at once */
				r->npaused--;
				curl_easy_pause(s->h, CURLPAUSE_CONT);
			}
	return 0;
}

/* --limit-rate caps the sum: each transfer gets an equal share
 * (CURLOPT_MAX_RECV_SPEED_LARGE, which libcurl reads as the transfer runs),
 * recomputed whenever the number of transfers changes. */
void sfwi_rate_share(struct sfwi_run *r)
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
		for (struct sfwi_seg *s = r->files[i].segs; s; s = s->next)
			curl_easy_setopt(s->h, CURLOPT_MAX_RECV_SPEED_LARGE, share);
}

/* Stops s and gives its rest back to the file's plan: the bytes it wrote
 * stay done, [pos, end) is fetched again by whoever the scheduler picks. */
enum sfw_status sfwi_seg_requeue(struct sfwi_run *r, struct sfwi_seg *s, struct sfw_err *err)
{
	struct sfwi_file *f = s->f;
	int e = sfwi_seg_flush(s);
	if (e) /* unwritten bytes are not done */
		s->pos -= s->wlen;
	uint64_t a = s->pos, b = s->end;
	int bad = s->pos > s->start && sfwi_push_range(&f->done, &f->ndone, &f->capdone, s->start, s->pos, 0) != 0;
	f->ndone = sfw_fetch_normalize_ranges(f->done, f->ndone, UINT64_MAX, f->mf->size, NULL);
	sfwi_seg_free(r, s);
	if (bad || sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, a, b, 1) != 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (e)
		return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s", f->part,
				strerror(e));
	return SFW_OK;
}
