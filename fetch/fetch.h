/* fetch.h - `salafw get`: resumable, verified downloads of a signed
 * manifest's files from ordered sources (docs/fetch-verify.md §2-§5). Public API
 * of the fetch module (libcurl multi, verify module for trust and hashing).
 *
 * Flow of sfw_fetch_get: fetch manifest + .minisig (capped) -> full trust
 * flow (verify.h) -> nothing is written before that succeeds -> DEST lock ->
 * skip files already present and verified -> free-space check -> download
 * the rest (several files at once, large files in ranged segments) ->
 * size + sha256 -> fsync -> rename into place -> ratchet + state record.
 *
 * On disk, under DEST/.salafw/ (a real folder owned by the user running
 * get, as is partial/: a symlink or another user's folder is refused with
 * SFW_E_PATH; every write goes through descriptors opened from DEST down
 * with O_NOFOLLOW, and a verified file is renamed into a parent folder
 * opened the same way, so a folder swapped for a symlink is never followed):
 *   manifest.json, manifest.json.minisig  the verified bytes, unchanged,
 *                                         installed as one unit through
 *                                         manifest.next/ (verify.h)
 *   lock                                  advisory flock (a helper only)
 *   partial/<sha256>-<P>.part             data at its final offsets (a symlink,
 *                                         folder or FIFO there: SFW_E_PATH); P is
 *                                         sfw_fetch_path_tag(path): two
 *                                         entries with equal content each
 *                                         get their own partial and lock
 *   partial/<sha256>-<P>.json             journal: {"v":1,"size":N,
 *       "sha256":"<hex>","done":[[a,b],...]} - byte ranges [a,b) whose data
 *       was fdatasync'ed before the journal was written (atomically).
 * Partials are keyed by content (and path), claimed with a per-partial flock,
 * and never trusted: the whole-file sha256 decides, and a mismatch discards
 * them. The manifest copies are written only after every file verified, so
 * a failed get never leaves DEST claiming another manifest.
 *
 * Sources: user mirrors given with prepend=1 come first, then the manifest's
 * sources in order, then user mirrors with prepend=0. A source that fails
 * (after its retries) for `demote_after` consecutive attempts is demoted:
 * tried after every healthy source for the rest of the run. So is a source
 * measured several times slower per connection than another one usable for
 * the same file (an unmeasured one is measured by a probe: the tail of a slow
 * transfer's range); its transfers give their remaining ranges to the faster
 * one. A source whose transfers keep stalling after some progress is struck
 * for the file when another source is left; one that ignores Range restarts
 * the file from byte 0 on each retry when it is the only one left. */
#ifndef SFW_FETCH_H
#define SFW_FETCH_H

#include "buf.h"
#include "sfw.h"
#include "verify/verify.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- pure helpers (table-tested in tests/test_fetch_unit.c) -------------- */

enum sfw_fetch_class {
	SFW_FETCH_RETRY,       /* transient: retry the same source after a backoff */
	SFW_FETCH_NEXT_SOURCE, /* permanent for this source: move the file on */
	SFW_FETCH_FATAL,       /* stop the whole run (local problem, out of memory) */
	SFW_FETCH_SOURCE_DOWN  /* the host cannot be reached (refused, unresolvable): the source
				* is struck for every file at once, not retried (curl and wget
				* do not retry a refused connection either) */
};
/* curlcode is a CURLcode (0 = transfer completed); http_status the final
 * response code (0 when none arrived). A completed transfer with a 2xx status
 * classifies as RETRY only if the caller found it incomplete. */
enum sfw_fetch_class sfw_fetch_classify(int curlcode, long http_status);
const char *sfw_fetch_class_name(enum sfw_fetch_class c);
/* libcurl refuses a response header line longer than its limit
 * (CURL_MAX_HTTP_HEADER, 100 KB) with CURLE_TOO_LARGE from 8.6 on and with
 * CURLE_OUT_OF_MEMORY before. For a transfer whose body has not begun, either
 * code is that refusal: a failure of the source (the next one is tried; the
 * manifest's URL fails with SFW_E_NET), never "out of memory" for the run.
 * Returns 1 for those two codes. */
int sfw_fetch_header_too_large(int curlcode);
#define SFW_FETCH_HEADER_MSG "response header too large (a line over libcurl's 100 KB limit)"

/* Retry-After (RFC 9110 §10.2.3): delay-seconds or an HTTP-date. Returns the
 * delay in milliseconds (a date in the past gives 0), or -1 if the value is
 * not valid. now is unix seconds. Values above one day are clamped to it. */
int64_t sfw_fetch_retry_after_ms(const char *value, int64_t now);

/* Jittered exponential backoff for attempt >= 1: d = min(cap, base*2^(n-1)),
 * result in [d/2, 3d/2) chosen by rnd (uniform 32-bit), then raised to at
 * least retry_after_ms (0 = none). */
uint64_t sfw_fetch_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms, uint64_t retry_after_ms,
			      uint32_t rnd);

/* Content-Range "bytes a-b/total" (or "bytes * /total" without the space: *first = *last =
 * UINT64_MAX). Strict: digits only, a <= b < total. Returns 0 on success. */
int sfw_fetch_parse_content_range(const char *value, uint64_t *first, uint64_t *last, uint64_t *total);

enum sfw_fetch_verdict {
	SFW_RESP_ACCEPT,       /* body is exactly the bytes asked for */
	SFW_RESP_RESTART,      /* 200 to a ranged request: body is the whole file from 0 */
	SFW_RESP_NEXT_SOURCE,  /* wrong range/size: this source serves something else */
	SFW_RESP_ERROR         /* not a success status: classify it */
};
/* Checks a response to a request for [start, end) of a file of `size` bytes.
 * ranged says whether a Range header was sent (not sent when [0,size) is
 * asked). content_range / content_length may be NULL / -1 when absent. */
enum sfw_fetch_verdict sfw_fetch_check_response(int ranged, uint64_t start, uint64_t end, uint64_t size,
						long status, const char *content_range, int64_t content_length);

/* Percent-encodes s (RFC 3986 unreserved kept; '/' kept if keep_slash) and
 * appends to out. Returns 0, or -1 on allocation failure / cap. */
int sfw_fetch_pct_encode(struct sfw_buf *out, const char *s, int keep_slash);
/* The URL of `path` on a source: http: base_url + encoded path; hf:
 * endpoint/{repo_id}/resolve/{revision}/{path}, each part encoded, '/' kept
 * in repo_id and path only. Returns a new string (sfw_free) or NULL. */
char *sfw_fetch_file_url(const struct sfw_source *src, const char *repo_id, const char *revision,
			 const char *path);
/* {endpoint}/manifests/{org}/{name}.json for repo_id "org/name". */
char *sfw_fetch_manifest_url(const char *endpoint, const char *repo_id);
/* Protocols redirects from url may go to (CURLOPT_REDIR_PROTOCOLS_STR):
 * "http,https" only when url itself is plain http, else "https", so an https
 * source is never downgraded by a redirect. */
const char *sfw_fetch_redir_protocols(const char *url);
/* A URL as it may be shown (progress, --json, errors): the userinfo of its
 * authority (RFC 3986 3.2.1, "user:password@" or "token@") becomes "***",
 * e.g. "http://u:pw@host/x" shows as "http://" "***" "@host/x"; any other string
 * comes back unchanged. The user part goes too, since a token often sits there. Returns
 * a new string (sfw_free) or NULL when out of memory. */
char *sfw_fetch_redact_url(const char *s);
/* 16 hex digits (FNV-1a 64 of path) + NUL into out: the partial's name
 * suffix, so equal content at two paths never shares a partial. */
void sfw_fetch_path_tag(const char *path, char out[17]);

/* A byte range [start, end). */
struct sfw_range {
	uint64_t start, end;
};
/* Resume decision: clips journal ranges to the part file's length and the
 * manifest size, sorts and merges them in place; returns how many remain and
 * sets *have to the total bytes they cover. */
size_t sfw_fetch_normalize_ranges(struct sfw_range *r, size_t n, uint64_t part_len, uint64_t size,
				  uint64_t *have);
/* Splits what is missing from [0,size) (given normalized done ranges) into
 * at most max_out pieces: gaps larger than a piece are cut into pieces of
 * max(min_piece, ceil(missing/connections)) bytes. Returns the count, or
 * SIZE_MAX when max_out is too small. */
size_t sfw_fetch_plan_pieces(const struct sfw_range *done, size_t ndone, uint64_t size, unsigned connections,
			     uint64_t min_piece, struct sfw_range *out, size_t max_out);

/* Scheduling by measured throughput (aria2's lowest-speed limit and range
 * stealing). A transfer receiving `rate` bytes/s per connection, with
 * `remaining` bytes of its range to go, and another source usable for the
 * same file measured at `other` bytes/s per connection (0 = not measured):
 * MOVE when the other is SFW_FETCH_SLOW_FACTOR times faster or more (the
 * transfer's rest goes there), PROBE when it is unmeasured (measure it with
 * the tail of this range), KEEP otherwise, and always when the transfer
 * would finish within SFW_FETCH_STEAL_ETA_MS or its rest is too short to
 * split (2 x SFW_FETCH_PROBE_MIN). A stalled transfer (rate 0) never
 * finishes. */
#define SFW_FETCH_SLOW_FACTOR 4.0
#define SFW_FETCH_STEAL_ETA_MS 2000
#define SFW_FETCH_PROBE_MIN (256u << 10)
enum sfw_fetch_speed { SFW_SPEED_KEEP, SFW_SPEED_MOVE, SFW_SPEED_PROBE };
enum sfw_fetch_speed sfw_fetch_speed_verdict(double rate, uint64_t remaining, double other);

/* A file is tried on at most this many sources: once that many failed for it
 * (a source down counts for every file), it fails with the sources after them
 * untried, so a manifest listing thousands of dead sources costs a bounded
 * time. */
#define SFW_FETCH_MAX_SOURCES 64

/* ---- the downloader -------------------------------------------------------- */

enum sfw_fetch_event_kind {
	SFW_EV_MANIFEST,      /* manifest verified: msg = source of it */
	SFW_EV_SKIP,          /* file already present and verified */
	SFW_EV_PLAN,          /* download plan made: total_size = bytes to fetch */
	SFW_EV_FILE_START,    /* file begins (or resumes: file_done = bytes kept) */
	SFW_EV_PROGRESS,      /* periodic; file == NULL for the total */
	SFW_EV_RETRY,         /* transient failure: delay_ms until next attempt */
	SFW_EV_SOURCE_FAILED, /* a source failed for this file; moving on */
	SFW_EV_SOURCE_DEMOTED,/* a source kept failing; tried last from now on */
	SFW_EV_HASH_MISMATCH, /* bytes discarded */
	SFW_EV_FILE_DONE,     /* verified and renamed into place */
	SFW_EV_FILE_FAILED,   /* every source failed for this file */
	SFW_EV_DONE           /* end of run (also after a failure) */
};

struct sfw_fetch_event {
	enum sfw_fetch_event_kind kind;
	const struct sfw_manifest_file *file; /* NULL for run-wide events */
	size_t file_index;
	const char *source;   /* name or URL of the source involved, or NULL */
	const char *msg;      /* one-line detail, or NULL */
	uint64_t file_done;   /* bytes of this file on disk (kept + received) */
	uint64_t total_done;  /* bytes of the plan done so far */
	uint64_t total_size;  /* bytes to fetch in this run's plan */
	uint64_t received;    /* body bytes received from the network, all files */
	double rate;          /* bytes/s, recent (PROGRESS) */
	double elapsed;       /* seconds since the start of the download */
	uint64_t delay_ms;    /* RETRY */
	long http_status;     /* last HTTP status, when relevant */
	int curl_code;        /* last CURLcode, when relevant */
};
/* Return false to cancel the run (SFW_E_ABORTED; everything stays resumable). */
typedef bool (*sfw_fetch_event_fn)(void *user, const struct sfw_fetch_event *ev);

struct sfw_fetch_params {
	const char *repo_id;        /* "org/name"; required binding unless NULL */
	const char *revision;       /* 40 hex to bind, or NULL */
	const char *endpoint;       /* manifest service (no trailing '/') */
	const char *manifest;       /* URL (http/https) or file; NULL = service layout */
	const char *dest;           /* destination directory */
	struct sfw_trust_params trust;
	const struct sfw_source *mirrors_first; /* user sources tried before the manifest's */
	size_t nmirrors_first;
	const struct sfw_source *mirrors_last;  /* ... and after them */
	size_t nmirrors_last;
	unsigned jobs;              /* files at once (default 4) */
	unsigned connections;       /* ranged connections per file (default 4) */
	uint64_t min_segment;       /* never split into pieces smaller than this (default 32 MiB) */
	long connect_timeout_s;     /* default 15 */
	long stall_timeout_s;       /* abort a transfer below stall_bytes_per_s for this long (default 30) */
	long stall_bytes_per_s;     /* default 1024 */
	unsigned max_retries;       /* per file and source, reset by progress (default 5) */
	uint64_t backoff_base_ms;   /* default 1000 */
	uint64_t backoff_cap_ms;    /* default 30000 */
	uint64_t retry_after_max_ms;/* a longer Retry-After moves to the next source (default 120000) */
	unsigned demote_after;      /* consecutive failures before demotion (default 3) */
	uint64_t limit_rate;        /* bytes/s, the sum over all transfers (each gets a share), 0 = none */
	int no_space_check;
	double journal_interval_s;  /* how often data is fdatasync'ed and journalled (default 5) */
	double progress_interval_s; /* default 0.5 */
	volatile sig_atomic_t *cancel; /* set (e.g. by SIGINT) to stop cleanly */
	/* Which files: a manifest path is fetched when it matches one of
	 * include (fnmatch(3) without flags: '*' also matches '/', as the hf
	 * CLI's globs) and none of exclude; none given = every file. Files left
	 * out are not recorded as verified. */
	const char *const *include;
	size_t ninclude;
	const char *const *exclude;
	size_t nexclude;
	const char *hf_endpoint; /* replaces the endpoint of the manifest's hf sources (HF_ENDPOINT); NULL = as listed */
	const char *hf_token;    /* Authorization: Bearer for the manifest's hf sources only (HF_TOKEN), never
				  * for http sources or user mirrors, nor across a redirect to another host */
	sfw_fetch_event_fn on_event;
	void *user;
};
struct sfw_fetch_params sfw_fetch_default_params(void);

struct sfw_fetch_summary {
	size_t nfiles;
	size_t nskipped;     /* already present and verified */
	size_t ndownloaded;  /* verified and renamed this run */
	size_t nfailed;
	uint64_t received;   /* body bytes received (including discarded ones) */
	uint64_t resumed;    /* bytes kept from earlier runs' partials */
	uint64_t discarded;  /* bytes thrown away (hash mismatch, restarts) */
	double seconds;
	char repo_id[256];
	char revision[41];
};

/* Runs a whole `get`. Returns SFW_OK when every file verified; otherwise the
 * first decisive status: SFW_E_SIG/KEYID/MANIFEST/PATH (manifest rejected,
 * nothing written), SFW_E_NOSPACE, SFW_E_LOCKED, SFW_E_EXHAUSTED (some file
 * failed on every source), SFW_E_ABORTED, SFW_E_IO ... sum may be NULL. */
SFW_MUST_CHECK enum sfw_status sfw_fetch_get(const struct sfw_fetch_params *p, struct sfw_fetch_summary *sum,
					     struct sfw_err *err);

#endif
