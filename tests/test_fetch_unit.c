/* modules: fetch core */
/* test_fetch_unit.c - table tests of the downloader's pure decisions:
 * error classes, Retry-After, backoff bounds, Content-Range, response checks,
 * URL building with per-segment percent-encoding, resume ranges and pieces,
 * libcurl's header-size refusal, and the redaction of a URL's userinfo. */
#include "check.h"
#include "fetch/fetch.h"

#include "alloc.h"

#include <curl/curl.h>
#include <stdint.h>
#include <string.h>

static void test_classify(void)
{
	static const struct {
		int cc;
		long status;
		enum sfw_fetch_class want;
	} t[] = {
		{CURLE_OK, 200, SFW_FETCH_RETRY}, /* completed but short */
		{CURLE_OK, 206, SFW_FETCH_RETRY},
		{CURLE_OK, 0, SFW_FETCH_RETRY},
		{CURLE_OK, 404, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 410, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 401, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 403, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 416, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 400, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 301, SFW_FETCH_NEXT_SOURCE}, /* a redirect not followed */
		{CURLE_OK, 408, SFW_FETCH_RETRY},
		{CURLE_OK, 425, SFW_FETCH_RETRY},
		{CURLE_OK, 429, SFW_FETCH_RETRY},
		{CURLE_OK, 500, SFW_FETCH_RETRY},
		{CURLE_OK, 502, SFW_FETCH_RETRY},
		{CURLE_OK, 503, SFW_FETCH_RETRY},
		{CURLE_OK, 504, SFW_FETCH_RETRY},
		{CURLE_OK, 501, SFW_FETCH_NEXT_SOURCE},
		{CURLE_OK, 505, SFW_FETCH_NEXT_SOURCE},
		{CURLE_HTTP_RETURNED_ERROR, 503, SFW_FETCH_RETRY},
		{CURLE_HTTP_RETURNED_ERROR, 404, SFW_FETCH_NEXT_SOURCE},
		/* a refused connection or an unknown host: down for every file,
		 * not retried (curl's --retry and wget do not retry those either) */
		{CURLE_COULDNT_CONNECT, 0, SFW_FETCH_SOURCE_DOWN},
		{CURLE_COULDNT_RESOLVE_HOST, 0, SFW_FETCH_SOURCE_DOWN},
		{CURLE_COULDNT_RESOLVE_PROXY, 0, SFW_FETCH_RETRY}, /* the local proxy, not the source */
		{100, 200, SFW_FETCH_NEXT_SOURCE}, /* CURLE_TOO_LARGE (libcurl 8.6+): a header over the limit */
		{CURLE_OPERATION_TIMEDOUT, 200, SFW_FETCH_RETRY}, /* stall */
		{CURLE_PARTIAL_FILE, 200, SFW_FETCH_RETRY},
		{CURLE_RECV_ERROR, 206, SFW_FETCH_RETRY},
		{CURLE_SEND_ERROR, 0, SFW_FETCH_RETRY},
		{CURLE_GOT_NOTHING, 0, SFW_FETCH_RETRY},
		{CURLE_HTTP2_STREAM, 0, SFW_FETCH_RETRY},
		{CURLE_TOO_MANY_REDIRECTS, 302, SFW_FETCH_NEXT_SOURCE},
		{CURLE_PEER_FAILED_VERIFICATION, 0, SFW_FETCH_NEXT_SOURCE},
		{CURLE_FILESIZE_EXCEEDED, 200, SFW_FETCH_NEXT_SOURCE},
		{CURLE_UNSUPPORTED_PROTOCOL, 0, SFW_FETCH_NEXT_SOURCE},
		{CURLE_URL_MALFORMAT, 0, SFW_FETCH_NEXT_SOURCE},
		{CURLE_RANGE_ERROR, 200, SFW_FETCH_NEXT_SOURCE},
		{CURLE_WEIRD_SERVER_REPLY, 0, SFW_FETCH_NEXT_SOURCE},
		{CURLE_BAD_CONTENT_ENCODING, 200, SFW_FETCH_NEXT_SOURCE},
		{CURLE_WRITE_ERROR, 200, SFW_FETCH_FATAL},
		{CURLE_OUT_OF_MEMORY, 0, SFW_FETCH_FATAL},
		{CURLE_ABORTED_BY_CALLBACK, 200, SFW_FETCH_FATAL},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		enum sfw_fetch_class c = sfw_fetch_classify(t[i].cc, t[i].status);
		CHECK(c == t[i].want, "classify(%d, %ld) = %s, want %s", t[i].cc, t[i].status,
		      sfw_fetch_class_name(c), sfw_fetch_class_name(t[i].want));
	}
}

/* libcurl's header-size refusal: CURLE_OUT_OF_MEMORY before 8.6 (measured
 * with curl 7.88: a 200 KB header line gives exit 27), CURLE_TOO_LARGE (100)
 * from 8.6 on; nothing else is. */
static void test_header_too_large(void)
{
	CHECK(sfw_fetch_header_too_large(CURLE_OUT_OF_MEMORY), "CURLE_OUT_OF_MEMORY is libcurl's header refusal");
	CHECK(sfw_fetch_header_too_large(100), "CURLE_TOO_LARGE (100) is libcurl's header refusal");
	static const int no[] = {CURLE_OK, CURLE_RECV_ERROR, CURLE_WRITE_ERROR, CURLE_FILESIZE_EXCEEDED,
				 CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT};
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		CHECK(!sfw_fetch_header_too_large(no[i]), "CURLcode %d is not a header refusal", no[i]);
	CHECK(strcmp(sfw_fetch_class_name(SFW_FETCH_SOURCE_DOWN), "source-down") == 0, "class name source-down");
}

/* Userinfo in a URL is never shown; everything else is kept byte for byte.
 * The wanted strings are written out by hand from RFC 3986 3.2. */
static void test_redact(void)
{
	static const struct {
		const char *in, *want;
	} t[] = {
		{"http://user:pass@host/x", "http://***@host/x"},
		{"https://tok3n@host:8443/a/b?q=1", "https://***@host:8443/a/b?q=1"},
		{"http://u:p@127.0.0.1:9/m/", "http://***@127.0.0.1:9/m/"},
		{"http://a@b:c@host/", "http://***@host/"},                /* the last '@' ends the userinfo */
		{"http://host/path@x", "http://host/path@x"},              /* '@' in the path is not userinfo */
		{"http://host/?u=a@b", "http://host/?u=a@b"},
		{"http://host#f@x", "http://host#f@x"},
		{"http://host:80/", "http://host:80/"},
		{"HTTP://U:P@H/", "HTTP://***@H/"},
		{"hf+x.y://k@h", "hf+x.y://***@h"},
		{"http://:secret@h/", "http://***@h/"},
		{"http://@h/", "http://***@h/"},
		{"src0", "src0"},                                          /* a source's name */
		{"mirror user:pw@host", "mirror user:pw@host"},            /* not a URL */
		{"1http://u:p@h/", "1http://u:p@h/"},                      /* a scheme starts with a letter */
		{"/local/file@2.json", "/local/file@2.json"},
		{"", ""},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		char *got = sfw_fetch_redact_url(t[i].in);
		CHECK(got && strcmp(got, t[i].want) == 0, "redact '%s': got '%s' want '%s'", t[i].in, got ? got : "(null)",
		      t[i].want);
		sfw_free(got);
	}
	CHECK(sfw_fetch_redact_url(NULL) == NULL, "redact NULL is NULL");
}

static void test_retry_after(void)
{
	/* 784111777 = Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example date) */
	const int64_t date = 784111777;
	static const struct {
		const char *v;
		int64_t now;
		int64_t want;
	} t[] = {
		{"0", 0, 0},
		{"5", 0, 5000},
		{" 12 ", 0, 12000},
		{"120\r\n", 0, 120000},
		{"86400", 0, 86400000},
		{"99999999999999999999999", 0, 86400000}, /* clamped, no overflow */
		{"", 0, -1},
		{"abc", 0, -1},
		{"-1", 0, -1},
		{"1.5", 0, -1},
		{"5s", 0, -1},
		{"Sun, 06 Nov 1994 08:49:37 GMT", date - 30, 30000},
		{"Sun, 06 Nov 1994 08:49:37 GMT", date + 30, 0}, /* in the past */
		{"Sunday, 06-Nov-94 08:49:37 GMT", date - 7, 7000},
		{"Sun Nov  6 08:49:37 1994", date - 2, 2000},
		{"Sun, 06 Nov 1994 08:49:37 GMT", date - 200000, 86400000},
		{"tomorrow", 0, -1},
		{"Nov", 0, -1},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int64_t got = sfw_fetch_retry_after_ms(t[i].v, t[i].now);
		CHECK(got == t[i].want, "retry_after('%s') = %lld, want %lld", t[i].v, (long long)got,
		      (long long)t[i].want);
	}
	CHECK(sfw_fetch_retry_after_ms(NULL, 0) == -1, "retry_after(NULL)");
}

static void test_backoff(void)
{
	const uint64_t base = 1000, cap = 30000;
	const uint32_t rnds[] = {0, 1, 0x80000000u, 0xffffffffu, 12345678u};
	int ok = 1;
	for (unsigned a = 1; a <= 40; a++) {
		uint64_t d = base;
		for (unsigned i = 1; i < a && d < cap; i++)
			d *= 2;
		if (d > cap)
			d = cap;
		for (size_t k = 0; k < sizeof(rnds) / sizeof(rnds[0]); k++) {
			uint64_t got = sfw_fetch_backoff_ms(a, base, cap, 0, rnds[k]);
			if (got < d / 2 || got >= d + d / 2) {
				ok = 0;
				printf("  attempt %u rnd %u: %llu not in [%llu, %llu)\n", a, rnds[k],
				       (unsigned long long)got, (unsigned long long)(d / 2),
				       (unsigned long long)(d + d / 2));
			}
		}
	}
	CHECK(ok, "backoff within [d/2, 3d/2) for attempts 1..40");
	CHECK(sfw_fetch_backoff_ms(1, base, cap, 0, 0) == 500, "attempt 1, rnd 0 gives base/2");
	CHECK(sfw_fetch_backoff_ms(3, base, cap, 0, 0x80000000u) == 4000, "attempt 3, mid rnd gives 4 s");
	CHECK(sfw_fetch_backoff_ms(30, base, cap, 0, 0xffffffffu) < 45000, "capped at 1.5 x cap");
	CHECK(sfw_fetch_backoff_ms(1, base, cap, 45000, 0) == 45000, "Retry-After raises the delay");
	CHECK(sfw_fetch_backoff_ms(5, base, cap, 10, 0) == 8000, "a short Retry-After does not lower it");
	/* jitter spreads: mean over many draws near d */
	uint32_t x = 2463534242u;
	double sum = 0;
	for (int i = 0; i < 10000; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		sum += (double)sfw_fetch_backoff_ms(2, base, cap, 0, x);
	}
	CHECK(sum / 10000 > 1900 && sum / 10000 < 2100, "mean jittered delay %.0f near 2000", sum / 10000);
	CHECK(sfw_fetch_backoff_ms(200, UINT64_MAX / 4, UINT64_MAX, 0, 0) >= UINT64_MAX / 8, "no overflow");
}

static void test_content_range(void)
{
	static const struct {
		const char *v;
		int ok;
		uint64_t a, b, t;
	} t[] = {
		{"bytes 0-99/100", 1, 0, 99, 100},
		{"bytes 10-19/100", 1, 10, 19, 100},
		{"  bytes 5-5/6\r\n", 1, 5, 5, 6},
		{"bytes */100", 1, UINT64_MAX, UINT64_MAX, 100},
		{"bytes 4294967296-8589934591/8589934592", 1, 4294967296ull, 8589934591ull, 8589934592ull},
		{"bytes 0-100/100", 0, 0, 0, 0},
		{"bytes 5-4/100", 0, 0, 0, 0},
		{"bytes=0-99/100", 0, 0, 0, 0},
		{"bytes 0-99/*", 0, 0, 0, 0},
		{"bytes 0-99/100 x", 0, 0, 0, 0},
		{"bytes -1-5/10", 0, 0, 0, 0},
		{"bytes 0-1/99999999999999999999999", 0, 0, 0, 0},
		{"bytes 0 -1/10", 0, 0, 0, 0},
		{"items 0-1/10", 0, 0, 0, 0},
		{"", 0, 0, 0, 0},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		uint64_t a = 7, b = 7, tot = 7;
		int r = sfw_fetch_parse_content_range(t[i].v, &a, &b, &tot);
		if (t[i].ok)
			CHECK(r == 0 && a == t[i].a && b == t[i].b && tot == t[i].t, "content-range '%s'", t[i].v);
		else
			CHECK(r != 0, "content-range '%s' rejected", t[i].v);
	}
	uint64_t a, b, tot;
	CHECK(sfw_fetch_parse_content_range(NULL, &a, &b, &tot) != 0, "content-range NULL");
}

static void test_check_response(void)
{
	const uint64_t S = 1000;
	static const struct {
		int ranged;
		uint64_t start, end;
		long status;
		const char *cr;
		int64_t cl;
		enum sfw_fetch_verdict want;
	} t[] = {
		{1, 100, 200, 206, "bytes 100-199/1000", 100, SFW_RESP_ACCEPT},
		{1, 100, 200, 206, "bytes 100-199/1000", -1, SFW_RESP_ACCEPT},
		{1, 0, 1000, 206, "bytes 0-999/1000", 1000, SFW_RESP_ACCEPT},
		{1, 100, 200, 206, "bytes 0-99/1000", 100, SFW_RESP_NEXT_SOURCE},  /* wrong start */
		{1, 100, 200, 206, "bytes 100-299/1000", 200, SFW_RESP_NEXT_SOURCE},
		{1, 100, 200, 206, "bytes 100-199/1001", 100, SFW_RESP_NEXT_SOURCE}, /* other file */
		{1, 100, 200, 206, NULL, 100, SFW_RESP_NEXT_SOURCE},
		{1, 100, 200, 206, "bytes 100-199/1000", 101, SFW_RESP_NEXT_SOURCE},
		{1, 100, 200, 206, "bytes */1000", 100, SFW_RESP_NEXT_SOURCE},
		{1, 100, 200, 200, NULL, 1000, SFW_RESP_RESTART}, /* Range ignored */
		{1, 100, 200, 200, NULL, -1, SFW_RESP_RESTART},
		{1, 100, 200, 200, NULL, 1001, SFW_RESP_NEXT_SOURCE}, /* longer than the manifest */
		{0, 0, 1000, 200, NULL, 1000, SFW_RESP_ACCEPT},
		{0, 0, 1000, 200, NULL, -1, SFW_RESP_ACCEPT},
		{0, 0, 1000, 200, NULL, 999, SFW_RESP_NEXT_SOURCE},
		{0, 0, 1000, 206, "bytes 0-999/1000", 1000, SFW_RESP_NEXT_SOURCE}, /* unasked 206 */
		{1, 100, 200, 416, "bytes */1000", 0, SFW_RESP_ERROR},
		{1, 100, 200, 404, NULL, 10, SFW_RESP_ERROR},
		{0, 0, 1000, 503, NULL, 10, SFW_RESP_ERROR},
		{0, 0, 1000, 302, NULL, 0, SFW_RESP_ERROR},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		enum sfw_fetch_verdict v =
			sfw_fetch_check_response(t[i].ranged, t[i].start, t[i].end, S, t[i].status, t[i].cr, t[i].cl);
		CHECK(v == t[i].want, "check_response #%zu (status %ld, '%s', cl %lld) = %d, want %d", i, t[i].status,
		      t[i].cr ? t[i].cr : "-", (long long)t[i].cl, v, t[i].want);
	}
}

static void check_url(const char *what, char *got, const char *want)
{
	CHECK(got && strcmp(got, want) == 0, "%s: got '%s', want '%s'", what, got ? got : "(null)", want);
	sfw_free(got);
}

static void test_urls(void)
{
	const char *rev = "0123456789abcdef0123456789abcdef01234567";
	struct sfw_source http = {SFW_SOURCE_HTTP, "http://127.0.0.1:8080/m/", NULL};
	struct sfw_source http_noslash = {SFW_SOURCE_HTTP, "http://127.0.0.1:8080/m", NULL};
	struct sfw_source hf = {SFW_SOURCE_HF, "http://127.0.0.1:9/", "hf"};
	check_url("http plain", sfw_fetch_file_url(&http, "org/name", rev, "config.json"),
		  "http://127.0.0.1:8080/m/config.json");
	check_url("http nested keeps '/'", sfw_fetch_file_url(&http, "org/name", rev, "sub/dir/a.bin"),
		  "http://127.0.0.1:8080/m/sub/dir/a.bin");
	check_url("http base without '/'", sfw_fetch_file_url(&http_noslash, NULL, NULL, "a"),
		  "http://127.0.0.1:8080/m/a");
	check_url("http reserved characters",
		  sfw_fetch_file_url(&http, "o/n", rev, "a b/c#d?e%f&g+h=i;j@k,l'm(n)!*$"),
		  "http://127.0.0.1:8080/m/a%20b/c%23d%3Fe%25f%26g%2Bh%3Di%3Bj%40k%2Cl%27m%28n%29%21%2A%24");
	check_url("http unreserved kept", sfw_fetch_file_url(&http, "o/n", rev, "A-Z_a.z~0-9"),
		  "http://127.0.0.1:8080/m/A-Z_a.z~0-9");
	check_url("http UTF-8 bytes", sfw_fetch_file_url(&http, "o/n", rev, "caf\xc3\xa9.txt"),
		  "http://127.0.0.1:8080/m/caf%C3%A9.txt");
	check_url("hf layout", sfw_fetch_file_url(&hf, "openbmb/MiniCPM-SALA", rev, "model-00001-of-00004.safetensors"),
		  "http://127.0.0.1:9/openbmb/MiniCPM-SALA/resolve/0123456789abcdef0123456789abcdef01234567/"
		  "model-00001-of-00004.safetensors");
	check_url("hf revision encoded with no safe characters", sfw_fetch_file_url(&hf, "o/n", "refs/pr/1", "x/y z"),
		  "http://127.0.0.1:9/o/n/resolve/refs%2Fpr%2F1/x/y%20z");
	check_url("hf repo segments encoded", sfw_fetch_file_url(&hf, "o r/n?", rev, "f"),
		  "http://127.0.0.1:9/o%20r/n%3F/resolve/0123456789abcdef0123456789abcdef01234567/f");
	CHECK(sfw_fetch_file_url(&hf, NULL, rev, "f") == NULL, "hf needs a repo id");
	check_url("manifest url", sfw_fetch_manifest_url("https://freeweights.allternit.com", "openbmb/MiniCPM-SALA"),
		  "https://freeweights.allternit.com/manifests/openbmb/MiniCPM-SALA.json");
	check_url("manifest url, trailing '/'", sfw_fetch_manifest_url("http://127.0.0.1:1//", "a/b c"),
		  "http://127.0.0.1:1/manifests/a/b%20c.json");
}

static void test_ranges(void)
{
	struct sfw_range r[] = {{5, 10}, {0, 5}, {8, 12}, {20, 30}, {40, 50}, {3, 3}};
	uint64_t have = 0;
	size_t n = sfw_fetch_normalize_ranges(r, 6, 25, 100, &have);
	CHECK(n == 2 && r[0].start == 0 && r[0].end == 12 && r[1].start == 20 && r[1].end == 25 && have == 17,
	      "normalize merges, sorts and clips to the part length (n=%zu have=%llu)", n,
	      (unsigned long long)have);
	struct sfw_range r2[] = {{0, 200}};
	n = sfw_fetch_normalize_ranges(r2, 1, 1000, 100, &have);
	CHECK(n == 1 && r2[0].end == 100 && have == 100, "normalize clips to the manifest size");
	n = sfw_fetch_normalize_ranges(r2, 0, 1000, 100, &have);
	CHECK(n == 0 && have == 0, "no journal: nothing kept");
	struct sfw_range r3[] = {{0, 50}};
	n = sfw_fetch_normalize_ranges(r3, 1, 0, 100, &have);
	CHECK(n == 0 && have == 0, "empty part file: journal claims ignored");

	struct sfw_range out[64];
	n = sfw_fetch_plan_pieces(NULL, 0, 100, 4, 10, out, 64);
	CHECK(n == 4 && out[0].start == 0 && out[0].end == 25 && out[3].start == 75 && out[3].end == 100,
	      "4 connections: 4 equal pieces");
	n = sfw_fetch_plan_pieces(NULL, 0, 100, 4, 40, out, 64);
	CHECK(n == 3 && out[0].end == 34 && out[1].end == 68 && out[2].end == 100,
	      "minimum piece size respected, pieces balanced (n=%zu)", n);
	n = sfw_fetch_plan_pieces(NULL, 0, 100, 1, 1, out, 64);
	CHECK(n == 1 && out[0].start == 0 && out[0].end == 100, "one connection: one piece");
	struct sfw_range d1[] = {{0, 50}};
	n = sfw_fetch_plan_pieces(d1, 1, 100, 1, 1, out, 64);
	CHECK(n == 1 && out[0].start == 50 && out[0].end == 100, "resume continues after the kept prefix");
	struct sfw_range d2[] = {{10, 20}, {30, 40}};
	n = sfw_fetch_plan_pieces(d2, 2, 50, 1, 1, out, 64);
	CHECK(n == 3 && out[0].start == 0 && out[0].end == 10 && out[1].start == 20 && out[1].end == 30 &&
		      out[2].start == 40 && out[2].end == 50,
	      "gaps between kept ranges are fetched");
	struct sfw_range d3[] = {{0, 100}};
	CHECK(sfw_fetch_plan_pieces(d3, 1, 100, 4, 1, out, 64) == 0, "complete partial: nothing to fetch");
	CHECK(sfw_fetch_plan_pieces(NULL, 0, 0, 4, 1, out, 64) == 0, "empty file: nothing to fetch");
	CHECK(sfw_fetch_plan_pieces(NULL, 0, 100, 8, 1, out, 3) == SIZE_MAX, "output too small is reported");

	/* property: pieces are disjoint and cover exactly the complement */
	uint32_t x = 88172645u;
	int ok = 1;
	for (int iter = 0; iter < 500 && ok; iter++) {
		unsigned char map[300];
		memset(map, 0, sizeof(map));
		struct sfw_range d[8];
		size_t nd = 0;
		uint64_t size = 1 + (x % 300);
		for (int k = 0; k < 8; k++) {
			x ^= x << 13;
			x ^= x >> 17;
			x ^= x << 5;
			uint64_t a = x % (size + 1), b = a + (x >> 8) % 40;
			d[nd++] = (struct sfw_range){a, b};
		}
		nd = sfw_fetch_normalize_ranges(d, nd, size, size, NULL);
		for (size_t k = 0; k < nd; k++)
			for (uint64_t i = d[k].start; i < d[k].end; i++)
				map[i] = 1;
		unsigned conn = 1 + x % 6;
		size_t np = sfw_fetch_plan_pieces(d, nd, size, conn, 1 + (x >> 4) % 50, out, 64);
		if (np == SIZE_MAX) {
			ok = 0;
			break;
		}
		for (size_t k = 0; k < np; k++)
			for (uint64_t i = out[k].start; i < out[k].end; i++)
				map[i] += 2;
		for (uint64_t i = 0; i < size; i++)
			if (map[i] != 1 && map[i] != 2)
				ok = 0;
	}
	CHECK(ok, "pieces partition the missing bytes (random cases)");
}

static void test_redirects_and_names(void)
{
	static const struct {
		const char *url, *want;
	} t[] = {
		{"https://weights.example/a/", "https"}, /* never downgraded by a redirect */
		{"HTTPS://weights.example/", "https"},
		{"http://127.0.0.1:8080/", "http,https"}, /* a plain source may stay plain */
		{"HTTP://mirror/", "http,https"},
		{"httpx://odd/", "https"},
		{"", "https"},
		{NULL, "https"},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		const char *got = sfw_fetch_redir_protocols(t[i].url);
		CHECK(strcmp(got, t[i].want) == 0, "redirect protocols of '%s': got %s want %s",
		      t[i].url ? t[i].url : "(null)", got, t[i].want);
	}
	/* published FNV-1a 64 vectors (and one computed with Python) */
	static const struct {
		const char *path, *want;
	} v[] = {
		{"", "cbf29ce484222325"},
		{"a", "af63dc4c8601ec8c"},
		{"foobar", "85944171f73967e8"},
		{"sub/dup2.bin", "ee37672410131684"},
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		char tag[17];
		sfw_fetch_path_tag(v[i].path, tag);
		CHECK(strcmp(tag, v[i].want) == 0, "path tag of '%s': got %s want %s", v[i].path, tag, v[i].want);
	}
	char t1[17], t2[17];
	sfw_fetch_path_tag("dup1.bin", t1);
	sfw_fetch_path_tag("sub/dup1.bin", t2);
	CHECK(strcmp(t1, t2) != 0, "equal content at two paths gets two partial names");
}

static void test_speed_verdict(void)
{
	/* rate and other in bytes/s per connection; remaining in bytes. The
	 * expected column follows the rule: nearly done (remaining/rate under
	 * 2 s) keeps; a measured other source >= 4x faster takes the rest; an
	 * unmeasured one is probed when the rest can be halved into >= 256 KiB. */
	static const struct {
		double rate;
		uint64_t remaining;
		double other;
		enum sfw_fetch_speed want;
	} t[] = {
		{100e3, 20000000, 50e6, SFW_SPEED_MOVE},   /* the 100 KB/s mirror */
		{100e3, 20000000, 0, SFW_SPEED_PROBE},     /* other not measured yet */
		{100e3, 20000000, 399e3, SFW_SPEED_KEEP},  /* under 4x: order decides */
		{100e3, 20000000, 400e3, SFW_SPEED_MOVE},  /* exactly 4x */
		{50e6, 20000000, 60e6, SFW_SPEED_KEEP},    /* comparable */
		{50e6, 20000000, 0, SFW_SPEED_KEEP},       /* 0.4 s to go: no probe */
		{100e3, 150000, 50e6, SFW_SPEED_KEEP},     /* 1.5 s to go */
		{100e3, 200000, 50e6, SFW_SPEED_MOVE},     /* 2.0 s to go */
		{0, 18000000, 1, SFW_SPEED_MOVE},          /* stalled: anything moving beats it */
		{0, 18000000, 0, SFW_SPEED_PROBE},
		{0, 500000, 0, SFW_SPEED_KEEP},            /* too short to split for a probe */
		{0, 524288, 0, SFW_SPEED_PROBE},           /* exactly 2 x 256 KiB */
		{100e3, 0, 50e6, SFW_SPEED_KEEP},          /* nothing left */
		{-1, 20000000, 50e6, SFW_SPEED_KEEP},      /* nonsense in: no decision */
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		enum sfw_fetch_speed got = sfw_fetch_speed_verdict(t[i].rate, t[i].remaining, t[i].other);
		CHECK(got == t[i].want, "speed verdict %zu (rate %.0f, remaining %llu, other %.0f): got %d want %d", i,
		      t[i].rate, (unsigned long long)t[i].remaining, t[i].other, (int)got, (int)t[i].want);
	}
}

int main(void)
{
	test_classify();
	test_header_too_large();
	test_redact();
	test_retry_after();
	test_backoff();
	test_content_range();
	test_check_response();
	test_urls();
	test_ranges();
	test_redirects_and_names();
	test_speed_verdict();
	return CHECK_REPORT("test_fetch_unit");
}
