/* load.c - the manifest and its .minisig: fetched over http(s) with a size
 * cap and retries, or read from a file, before anything touches DEST. */

#include "fetch/internal.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static size_t buf_write(char *p, size_t sz, size_t nm, void *u)
{
	return sfw_buf_append(u, p, sz * nm) == SFW_OK ? sz * nm : 0;
}

/* GETs url (at most max bytes) into out, retrying transient failures;
 * messages name it as shown (its userinfo redacted). */
static enum sfw_status http_get_small(const struct sfw_fetch_params *p, const char *url, const char *shown,
				      size_t max, struct sfw_buf *out, struct sfw_err *err)
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
			return sfw_fail(err, SFW_E_MANIFEST, "'%s' is larger than %zu bytes", shown, max);
		if (sfw_fetch_header_too_large((int)cc))
			return sfw_fail(err, SFW_E_NET, "cannot fetch '%s': %s", shown, SFW_FETCH_HEADER_MSG);
		enum sfw_fetch_class c = sfw_fetch_classify(cc, status);
		if (cc == CURLE_HTTP_RETURNED_ERROR && (status == 404 || status == 410))
			return sfw_fail(err, SFW_E_HTTP, "'%s' is not there (HTTP %ld)", shown, status);
		if (c != SFW_FETCH_RETRY || attempt > p->max_retries || (p->cancel && *p->cancel))
			return sfw_fail(err, SFW_E_NET, "cannot fetch '%s': %s", shown,
					ebuf[0] ? ebuf : curl_easy_strerror(cc));
		uint64_t d = sfw_fetch_backoff_ms(attempt, p->backoff_base_ms, p->backoff_cap_ms, 0,
						  (uint32_t)sfwi_now_ms() * 2654435761u);
		usleep((useconds_t)(d > 60000 ? 60000 : d) * 1000);
	}
}

static int is_url(const char *s)
{
	return strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0;
}

enum sfw_status sfwi_load_manifest(const struct sfw_fetch_params *p, struct sfw_buf *man, struct sfw_buf *sig,
				     char **what, struct sfw_err *err)
{
	char *loc;
	if (p->manifest)
		loc = sfw_strdup(p->manifest);
	else if (p->repo_id)
		loc = sfw_fetch_manifest_url(p->endpoint ? p->endpoint : DEFAULT_ENDPOINT, p->repo_id);
	else
		return sfw_fail(err, SFW_E_INVAL, "no repository and no --manifest given");
	/* as every message shows them: a password or token in a URL never is */
	char *shown = loc ? sfw_fetch_redact_url(loc) : NULL;
	char *ep = sfw_fetch_redact_url(p->endpoint ? p->endpoint : DEFAULT_ENDPOINT);
	size_t n = loc ? strlen(loc) : 0, sn = shown ? strlen(shown) : 0;
	char *sloc = loc ? sfw_malloc(n + 9) : NULL;
	char *sshown = shown ? sfw_malloc(sn + 9) : NULL;
	if (!sloc || !sshown || !ep) {
		sfw_free(loc);
		sfw_free(shown);
		sfw_free(ep);
		sfw_free(sloc);
		sfw_free(sshown);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	memcpy(sloc, loc, n);
	memcpy(sloc + n, ".minisig", 9);
	memcpy(sshown, shown, sn);
	memcpy(sshown + sn, ".minisig", 9);
	enum sfw_status st;
	if (is_url(loc)) {
		st = http_get_small(p, loc, shown, SFW_MANIFEST_MAX, man, err);
		if (st == SFW_E_HTTP && !p->manifest && err && err->code == SFW_E_HTTP)
			sfw_fail(err, st,
				 "repository '%s' is not on '%s' (no manifest at '%s'): check the name, or give "
				 "--endpoint or --manifest",
				 p->repo_id, ep, shown);
		if (st == SFW_OK) {
			st = http_get_small(p, sloc, sshown, SFW_MINISIG_MAX, sig, err);
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
	sfw_free(sshown);
	sfw_free(ep);
	sfw_free(loc);
	if (st != SFW_OK) {
		sfw_free(shown);
		return st;
	}
	*what = shown; /* names the manifest in messages and events */
	return SFW_OK;
}
