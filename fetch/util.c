/* util.c - the pure decisions of the downloader: error classes, backoff,
 * Retry-After, Content-Range, response checks, URLs, resume ranges. No I/O
 * here, so tests/test_fetch_unit.c covers them from tables. */
#include "fetch/fetch.h"

#include "alloc.h"
#include "buf.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CURLCODE_TOO_LARGE 100 /* CURLE_TOO_LARGE, named from libcurl 8.6 on */

int sfw_fetch_header_too_large(int curlcode)
{
	return curlcode == CURLE_OUT_OF_MEMORY || curlcode == CURLCODE_TOO_LARGE;
}

enum sfw_fetch_class sfw_fetch_classify(int curlcode, long http_status)
{
	if (curlcode == CURLCODE_TOO_LARGE) /* a header or field over libcurl's limit: this source's */
		return SFW_FETCH_NEXT_SOURCE;
	switch ((CURLcode)curlcode) {
	case CURLE_OK:
	case CURLE_HTTP_RETURNED_ERROR:
		break; /* decided by the status below */
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_CONNECT:
		return SFW_FETCH_SOURCE_DOWN;
	case CURLE_COULDNT_RESOLVE_PROXY:
	case CURLE_PARTIAL_FILE:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_GOT_NOTHING:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_HTTP3:
	case CURLE_QUIC_CONNECT_ERROR:
	case CURLE_AGAIN:
		return SFW_FETCH_RETRY;
	case CURLE_OUT_OF_MEMORY:
	case CURLE_FAILED_INIT:
	case CURLE_WRITE_ERROR:
	case CURLE_ABORTED_BY_CALLBACK:
	case CURLE_BAD_FUNCTION_ARGUMENT:
	case CURLE_NOT_BUILT_IN:
		return SFW_FETCH_FATAL;
	default:
		/* redirect loops, TLS verification, size cap, malformed URL,
		 * weird replies, unsupported protocol: this source is unusable */
		return SFW_FETCH_NEXT_SOURCE;
	}
	if (http_status == 0)
		return SFW_FETCH_RETRY; /* closed before any status line */
	if (http_status >= 200 && http_status < 300)
		return SFW_FETCH_RETRY; /* a success that ended early */
	switch (http_status) {
	case 408:
	case 425:
	case 429:
	case 500:
	case 502:
	case 503:
	case 504:
		return SFW_FETCH_RETRY;
	default:
		return SFW_FETCH_NEXT_SOURCE;
	}
}

const char *sfw_fetch_class_name(enum sfw_fetch_class c)
{
	switch (c) {
	case SFW_FETCH_RETRY:
		return "retry";
	case SFW_FETCH_NEXT_SOURCE:
		return "next-source";
	case SFW_FETCH_FATAL:
		return "fatal";
	case SFW_FETCH_SOURCE_DOWN:
		return "source-down";
	}
	return "?";
}

#define DAY_MS (86400LL * 1000)

int64_t sfw_fetch_retry_after_ms(const char *v, int64_t now)
{
	if (!v)
		return -1;
	while (*v == ' ' || *v == '\t')
		v++;
	size_t n = strlen(v);
	while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' || v[n - 1] == '\n'))
		n--;
	if (n == 0 || n > 64)
		return -1;
	char tmp[65];
	memcpy(tmp, v, n);
	tmp[n] = '\0';
	if (tmp[0] >= '0' && tmp[0] <= '9') {
		int64_t s = 0;
		for (size_t i = 0; i < n; i++) {
			if (tmp[i] < '0' || tmp[i] > '9')
				return -1;
			if (s < 86400)
				s = s * 10 + (tmp[i] - '0');
		}
		return s >= 86400 ? DAY_MS : s * 1000;
	}
	/* Every HTTP-date form (IMF-fixdate, RFC 850, asctime) names a month and
	 * has a hh:mm:ss time: require both so curl_getdate's leniency does not
	 * accept junk. */
	static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
					     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	int month = 0;
	for (int i = 0; i < 12; i++)
		month |= strstr(tmp, months[i]) != NULL;
	if (!month || !strchr(tmp, ':'))
		return -1;
	time_t t = curl_getdate(tmp, NULL);
	if (t == (time_t)-1)
		return -1;
	int64_t d = (int64_t)t - now;
	if (d <= 0)
		return 0;
	return d >= 86400 ? DAY_MS : d * 1000;
}

uint64_t sfw_fetch_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms, uint64_t retry_after_ms,
			      uint32_t rnd)
{
	if (attempt < 1)
		attempt = 1;
	uint64_t d = base_ms;
	for (unsigned i = 1; i < attempt && d < cap_ms; i++)
		d = d > UINT64_MAX / 2 ? UINT64_MAX : d * 2;
	if (d > cap_ms)
		d = cap_ms;
	/* uniform in [d/2, 3d/2): d/2 + d*rnd/2^32 */
	uint64_t j = d / 2 + (uint64_t)(((unsigned __int128)d * rnd) >> 32);
	if (j < retry_after_ms)
		j = retry_after_ms;
	return j;
}

static const char *parse_u64(const char *s, uint64_t *out)
{
	if (*s < '0' || *s > '9')
		return NULL;
	uint64_t v = 0;
	while (*s >= '0' && *s <= '9') {
		if (v > (UINT64_MAX - 9) / 10)
			return NULL;
		v = v * 10 + (uint64_t)(*s - '0');
		s++;
	}
	*out = v;
	return s;
}

int sfw_fetch_parse_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total)
{
	if (!v)
		return -1;
	while (*v == ' ' || *v == '\t')
		v++;
	if (strncmp(v, "bytes ", 6) != 0)
		return -1;
	v += 6;
	uint64_t a = UINT64_MAX, b = UINT64_MAX, t;
	if (*v == '*') {
		v++;
	} else {
		if (!(v = parse_u64(v, &a)) || *v++ != '-' || !(v = parse_u64(v, &b)))
			return -1;
	}
	if (*v++ != '/' || !(v = parse_u64(v, &t)))
		return -1;
	while (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n')
		v++;
	if (*v)
		return -1;
	if (a != UINT64_MAX && (a > b || b >= t))
		return -1;
	*first = a;
	*last = b;
	*total = t;
	return 0;
}

enum sfw_fetch_verdict sfw_fetch_check_response(int ranged, uint64_t start, uint64_t end, uint64_t size,
						long status, const char *content_range, int64_t content_length)
{
	if (status == 206) {
		uint64_t a, b, t;
		if (!ranged || start >= end)
			return SFW_RESP_NEXT_SOURCE;
		if (sfw_fetch_parse_content_range(content_range, &a, &b, &t) != 0)
			return SFW_RESP_NEXT_SOURCE;
		if (a != start || b != end - 1 || t != size)
			return SFW_RESP_NEXT_SOURCE;
		if (content_length >= 0 && (uint64_t)content_length != end - start)
			return SFW_RESP_NEXT_SOURCE;
		return SFW_RESP_ACCEPT;
	}
	if (status == 200) {
		if (content_length >= 0 && (uint64_t)content_length != size)
			return SFW_RESP_NEXT_SOURCE;
		return ranged ? SFW_RESP_RESTART : SFW_RESP_ACCEPT;
	}
	return SFW_RESP_ERROR;
}

int sfw_fetch_pct_encode(struct sfw_buf *out, const char *s, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned char c = *p;
		int keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
			   c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
		if (keep) {
			if (sfw_buf_append(out, p, 1) != SFW_OK)
				return -1;
		} else {
			char e[3] = {'%', hex[c >> 4], hex[c & 15]};
			if (sfw_buf_append(out, e, 3) != SFW_OK)
				return -1;
		}
	}
	return 0;
}

#define URL_MAX (64u << 10)

char *sfw_fetch_file_url(const struct sfw_source *src, const char *repo_id, const char *revision,
			 const char *path)
{
	struct sfw_buf b;
	sfw_buf_init(&b, URL_MAX);
	int bad = 0;
	if (!src || !src->url || !path) {
		return NULL;
	} else if (src->kind == SFW_SOURCE_HTTP) {
		size_t n = strlen(src->url);
		bad |= sfw_buf_append(&b, src->url, n) != SFW_OK;
		if (n == 0 || src->url[n - 1] != '/')
			bad |= sfw_buf_append(&b, "/", 1) != SFW_OK;
		bad |= sfw_fetch_pct_encode(&b, path, 1) != 0;
	} else {
		if (!repo_id || !revision)
			return NULL;
		size_t n = strlen(src->url);
		while (n && src->url[n - 1] == '/')
			n--;
		bad |= sfw_buf_append(&b, src->url, n) != SFW_OK;
		bad |= sfw_buf_append(&b, "/", 1) != SFW_OK;
		bad |= sfw_fetch_pct_encode(&b, repo_id, 1) != 0;
		bad |= sfw_buf_append(&b, "/resolve/", 9) != SFW_OK;
		bad |= sfw_fetch_pct_encode(&b, revision, 0) != 0;
		bad |= sfw_buf_append(&b, "/", 1) != SFW_OK;
		bad |= sfw_fetch_pct_encode(&b, path, 1) != 0;
	}
	if (bad) {
		sfw_buf_release(&b);
		return NULL;
	}
	return sfw_buf_take(&b, NULL);
}

char *sfw_fetch_manifest_url(const char *endpoint, const char *repo_id)
{
	if (!endpoint || !repo_id)
		return NULL;
	struct sfw_buf b;
	sfw_buf_init(&b, URL_MAX);
	size_t n = strlen(endpoint);
	while (n && endpoint[n - 1] == '/')
		n--;
	int bad = sfw_buf_append(&b, endpoint, n) != SFW_OK;
	bad |= sfw_buf_append(&b, "/manifests/", 11) != SFW_OK;
	bad |= sfw_fetch_pct_encode(&b, repo_id, 1) != 0;
	bad |= sfw_buf_append(&b, ".json", 5) != SFW_OK;
	if (bad) {
		sfw_buf_release(&b);
		return NULL;
	}
	return sfw_buf_take(&b, NULL);
}

const char *sfw_fetch_redir_protocols(const char *url)
{
	/* case-insensitive like libcurl's scheme match: "HTTP://" is plain too */
	return url && strncasecmp(url, "http://", 7) == 0 ? "http,https" : "https";
}

char *sfw_fetch_redact_url(const char *s)
{
	if (!s)
		return NULL;
	/* scheme ":" "//" authority, the authority ending at the first '/',
	 * '?' or '#'; its userinfo is what comes before its last '@' */
	size_t k = 0;
	while ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') || (k && ((s[k] >= '0' && s[k] <= '9') ||
										s[k] == '+' || s[k] == '-' || s[k] == '.')))
		k++;
	const char *at = NULL;
	if (k && strncmp(s + k, "://", 3) == 0) {
		const char *a = s + k + 3;
		size_t alen = strcspn(a, "/?#");
		for (size_t i = 0; i < alen; i++)
			if (a[i] == '@')
				at = a + i;
	}
	if (!at)
		return sfw_strdup(s);
	size_t head = k + 3, tail = strlen(at);
	char *out = sfw_malloc(head + 3 + tail + 1);
	if (!out)
		return NULL;
	memcpy(out, s, head);
	memcpy(out + head, "***", 3);
	memcpy(out + head + 3, at, tail + 1);
	return out;
}

void sfw_fetch_path_tag(const char *path, char out[17])
{
	static const char hex[] = "0123456789abcdef";
	uint64_t h = 14695981039346656037ull; /* FNV-1a 64: stable across builds and hosts */
	for (const unsigned char *p = (const unsigned char *)path; p && *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	for (int i = 15; i >= 0; i--, h >>= 4)
		out[i] = hex[h & 15];
	out[16] = '\0';
}

static int range_cmp(const void *a, const void *b)
{
	const struct sfw_range *x = a, *y = b;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

size_t sfw_fetch_normalize_ranges(struct sfw_range *r, size_t n, uint64_t part_len, uint64_t size,
				  uint64_t *have)
{
	uint64_t lim = part_len < size ? part_len : size;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t a = r[i].start, b = r[i].end;
		if (b > lim)
			b = lim;
		if (a >= b)
			continue;
		r[k].start = a;
		r[k].end = b;
		k++;
	}
	if (k > 1) /* qsort with a NULL base is undefined even for 0 items */
		qsort(r, k, sizeof(*r), range_cmp);
	size_t m = 0;
	uint64_t total = 0;
	for (size_t i = 0; i < k; i++) {
		if (m && r[i].start <= r[m - 1].end) {
			if (r[i].end > r[m - 1].end)
				r[m - 1].end = r[i].end;
		} else {
			r[m++] = r[i];
		}
	}
	for (size_t i = 0; i < m; i++)
		total += r[i].end - r[i].start;
	if (have)
		*have = total;
	return m;
}

size_t sfw_fetch_plan_pieces(const struct sfw_range *done, size_t ndone, uint64_t size, unsigned connections,
			     uint64_t min_piece, struct sfw_range *out, size_t max_out)
{
	uint64_t have = 0;
	for (size_t i = 0; i < ndone; i++)
		have += done[i].end - done[i].start;
	uint64_t missing = size > have ? size - have : 0;
	if (connections < 1)
		connections = 1;
	if (min_piece < 1)
		min_piece = 1;
	uint64_t piece = missing / connections + (missing % connections != 0);
	if (piece < min_piece)
		piece = min_piece;
	size_t k = 0;
	uint64_t pos = 0;
	for (size_t i = 0; i <= ndone; i++) {
		uint64_t gs = pos, ge = i < ndone ? done[i].start : size;
		if (i < ndone)
			pos = done[i].end;
		if (ge <= gs)
			continue;
		uint64_t gap = ge - gs;
		uint64_t cnt = gap / piece + (gap % piece != 0);
		uint64_t len = gap / cnt + (gap % cnt != 0); /* balanced pieces */
		for (uint64_t a = gs; a < ge; a += len) {
			if (k >= max_out)
				return SIZE_MAX;
			out[k].start = a;
			out[k].end = a + len < ge ? a + len : ge;
			k++;
		}
	}
	return k;
}

enum sfw_fetch_speed sfw_fetch_speed_verdict(double rate, uint64_t remaining, double other)
{
	if (!(rate >= 0) || !(other >= 0) || remaining == 0)
		return SFW_SPEED_KEEP; /* NaN or nothing left: nothing to decide */
	if (rate > 0 && (double)remaining * 1000.0 / rate < SFW_FETCH_STEAL_ETA_MS)
		return SFW_SPEED_KEEP; /* nearly done: not worth moving */
	if (other > 0)
		return other >= SFW_FETCH_SLOW_FACTOR * rate ? SFW_SPEED_MOVE : SFW_SPEED_KEEP;
	return remaining / 2 >= SFW_FETCH_PROBE_MIN ? SFW_SPEED_PROBE : SFW_SPEED_KEEP;
}
