/* cmd_get.c - `salafw get REPO[@REV] [-d DEST]`: download a model's signed
 * files, resumably, from ordered sources. Progress: a live block on a TTY,
 * plain lines otherwise, one JSON object per line with --json (stdout). */
#include "cli.h"
#include "fetch/fetch.h"

#include "alloc.h"
#include "log.h"
#include "utf8.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char synopsis[] =
	"[OPTIONS] REPO[@REVISION]\n"
	"       (REPO is org/name; REVISION a 40-hex commit the manifest must name)\n"
	"Sources are tried per file in this order: --mirror ones, the manifest's, --mirror-last ones;\n"
	"a source several times slower than another (measured) gives its remaining ranges to it.\n"
	"BYTES take K, M, G, T suffixes (powers of 1024, as curl: 10K = 10240).\n"
	"Environment: HF_ENDPOINT replaces the endpoint of the manifest's hf sources; HF_TOKEN is sent\n"
	"as a bearer token to those only (never to http sources or --mirror ones, never printed).\n"
	"Exit: 0 all verified; 1 some file's every source served wrong bytes (sha256); 2 usage;\n"
	"3 manifest or signature rejected, an unsafe path in DEST; 4 not on the endpoint / network /\n"
	"every source failed (a file is tried on at most 64 sources);\n"
	"5 local I/O, no space, DEST or a partial locked by another process;\n"
	"130/143 interrupted (partials kept: run again to resume)";

enum mode { M_PLAIN, M_TTY, M_JSON };

struct ui {
	enum mode mode;
	int quiet;
	int drawn;              /* lines of the live block on screen */
	double plain_every;     /* M_PLAIN: seconds between progress lines */
	double plain_last;      /* ... when the last ones were printed */
	struct {
		const char *path;
		uint64_t done, size;
		uint64_t done0; /* bytes on disk when the file started (resumed prefix) */
		double t0;      /* run time (s) when the file started */
		int live;
	} *rows;
	size_t nrows;
};

#define human cli_human_bytes

/* The file's own rate: bytes received since it started over its time. */
static double row_rate(const struct ui *u, size_t i, double now)
{
	double dt = now - u->rows[i].t0;
	return dt > 0.2 && u->rows[i].done > u->rows[i].done0 ? (double)(u->rows[i].done - u->rows[i].done0) / dt : 0;
}

/* A JSON string; characters that hide or reorder text (bidi overrides,
 * zero-width ones) as \uXXXX escapes, so a reader printing the line raw is
 * not fooled by them either. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		size_t k = sfw_utf8_hidden(p, strnlen((const char *)p, 3));
		if (k) {
			unsigned cp = k == 2 ? (unsigned)(p[0] & 0x1f) << 6 | (p[1] & 0x3f)
					     : (unsigned)(p[0] & 0x0f) << 12 | (unsigned)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
			fprintf(f, "\\u%04x", cp);
			p += k - 1;
		} else if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static const char *kind_name(enum sfw_fetch_event_kind k)
{
	static const char *const n[] = {"manifest", "skip", "plan", "file_start", "progress", "retry",
					"source_failed", "source_demoted", "hash_mismatch", "file_done", "file_failed",
					"done"};
	return (size_t)k < sizeof(n) / sizeof(n[0]) ? n[k] : "?";
}

static void clear_block(struct ui *u)
{
	/* every row fits the width (cli_progress_line), so a row is one line */
	if (u->drawn)
		fprintf(stderr, "\033[%dA\r\033[J", u->drawn);
	u->drawn = 0;
}

static void draw_block(struct ui *u, const struct sfw_fetch_event *ev)
{
	char a[32], b[32], r[32], line[2048];
	int width = cli_term_width(2);
	clear_block(u);
	for (size_t i = 0; i < u->nrows; i++) {
		if (!u->rows[i].live)
			continue;
		double fr = row_rate(u, i, ev->elapsed);
		double fleft = u->rows[i].size > u->rows[i].done ? (double)(u->rows[i].size - u->rows[i].done) : 0;
		cli_progress_line(line, sizeof(line), width, u->rows[i].path, u->rows[i].done, u->rows[i].size, fr,
				  fr > 1 ? (long)(fleft / fr) : -1);
		fprintf(stderr, "%s\n", line);
		u->drawn++;
	}
	human(a, sizeof(a), (double)ev->total_done);
	human(b, sizeof(b), (double)ev->total_size);
	human(r, sizeof(r), ev->rate);
	double left = ev->total_size > ev->total_done ? (double)(ev->total_size - ev->total_done) : 0;
	long eta = ev->rate > 1 ? (long)(left / ev->rate) : -1;
	char eta_s[32] = "--:--";
	if (eta >= 0)
		snprintf(eta_s, sizeof(eta_s), "%ld:%02ld", eta / 60, eta % 60);
	snprintf(line, sizeof(line), "total %s / %s  %s/s  ETA %s", a, b, r, eta_s);
	if (width > 1 && (int)strlen(line) > width - 1)
		line[width - 1] = '\0'; /* ASCII only */
	fprintf(stderr, "%s\n", line);
	u->drawn++;
	fflush(stderr);
}

/* Not a terminal (a CI log): every plain_every seconds one line per active
 * file, so a long shard is never minutes of silence. */
static void plain_lines(struct ui *u, const struct sfw_fetch_event *ev)
{
	if (ev->elapsed - u->plain_last < u->plain_every)
		return;
	u->plain_last = ev->elapsed;
	for (size_t i = 0; i < u->nrows; i++) {
		if (!u->rows[i].live)
			continue;
		char a[32], b[32], r[32], nm[1024];
		human(a, sizeof(a), (double)u->rows[i].done);
		human(b, sizeof(b), (double)u->rows[i].size);
		human(r, sizeof(r), row_rate(u, i, ev->elapsed));
		double pct = u->rows[i].size ? 100.0 * (double)u->rows[i].done / (double)u->rows[i].size : 100;
		cli_printable(nm, sizeof(nm), u->rows[i].path);
		fprintf(stderr, "progress %s %llu / %llu bytes (%.1f%%, %s of %s) %s/s\n", nm,
			(unsigned long long)u->rows[i].done, (unsigned long long)u->rows[i].size, pct, a, b, r);
	}
	fflush(stderr);
}

static bool on_event(void *user, const struct sfw_fetch_event *ev)
{
	struct ui *u = user;
	const char *path = ev->file ? ev->file->path : NULL;
	if (u->mode == M_JSON) {
		printf("{\"event\":\"%s\"", kind_name(ev->kind));
		if (path) {
			printf(",\"path\":");
			json_str(stdout, path);
			printf(",\"size\":%llu,\"file_done\":%llu", (unsigned long long)ev->file->size,
			       (unsigned long long)ev->file_done);
		}
		if (ev->source) {
			printf(",\"source\":");
			json_str(stdout, ev->source);
		}
		if (ev->msg) {
			printf(",\"msg\":");
			json_str(stdout, ev->msg);
		}
		if (ev->kind == SFW_EV_RETRY)
			printf(",\"delay_ms\":%llu", (unsigned long long)ev->delay_ms);
		if (ev->http_status)
			printf(",\"http_status\":%ld", ev->http_status);
		printf(",\"total_done\":%llu,\"total_size\":%llu,\"received\":%llu,\"rate\":%.0f,\"elapsed\":%.3f}\n",
		       (unsigned long long)ev->total_done, (unsigned long long)ev->total_size,
		       (unsigned long long)ev->received, ev->rate, ev->elapsed);
		fflush(stdout);
		return true;
	}
	if (ev->file && ev->file_index < u->nrows) {
		u->rows[ev->file_index].path = path;
		u->rows[ev->file_index].size = ev->file->size;
		u->rows[ev->file_index].done = ev->file_done;
		if (ev->kind == SFW_EV_FILE_START) {
			u->rows[ev->file_index].live = 1;
			u->rows[ev->file_index].done0 = ev->file_done;
			u->rows[ev->file_index].t0 = ev->elapsed;
		}
		if (ev->kind == SFW_EV_FILE_DONE || ev->kind == SFW_EV_FILE_FAILED)
			u->rows[ev->file_index].live = 0;
	}
	if (ev->kind == SFW_EV_PROGRESS) {
		if (u->mode == M_TTY && !u->quiet && !ev->file)
			draw_block(u, ev);
		else if (u->mode == M_PLAIN && !u->quiet && !ev->file)
			plain_lines(u, ev);
		return true;
	}
	if (u->quiet && ev->kind != SFW_EV_FILE_FAILED)
		return true;
	if (u->mode == M_TTY)
		clear_block(u);
	char a[32];
	/* source names, URLs and messages come from the manifest and servers:
	 * printed escaped (a name could otherwise colour the terminal or forge
	 * a "verified" line) */
	char pb[1100], sb[600], mb[600];
	path = path ? sfw_esc(path, pb, sizeof(pb)) : NULL;
	const char *src = ev->source ? sfw_esc(ev->source, sb, sizeof(sb)) : NULL;
	const char *msg = ev->msg ? sfw_esc(ev->msg, mb, sizeof(mb)) : NULL;
	switch (ev->kind) {
	case SFW_EV_MANIFEST:
		fprintf(stderr, "manifest verified: %s\n", msg ? msg : "");
		break;
	case SFW_EV_SKIP:
		fprintf(stderr, "ok       %s (already present and verified)\n", path);
		break;
	case SFW_EV_PLAN:
		human(a, sizeof(a), (double)ev->total_size);
		fprintf(stderr, "to fetch %s\n", a);
		break;
	case SFW_EV_FILE_START:
		if (ev->file_done)
			fprintf(stderr, "resume   %s from %llu of %llu bytes via %s\n", path,
				(unsigned long long)ev->file_done, (unsigned long long)ev->file->size,
				src ? src : "-");
		else
			fprintf(stderr, "get      %s (%llu bytes) via %s\n", path, (unsigned long long)ev->file->size,
				src ? src : "-");
		break;
	case SFW_EV_RETRY:
		fprintf(stderr, "retry    %s in %.1f s: %s\n", path, (double)ev->delay_ms / 1000, msg ? msg : "");
		break;
	case SFW_EV_SOURCE_FAILED:
		if (path)
			fprintf(stderr, "source   %s failed for %s: %s\n", src ? src : "-", path, msg ? msg : "");
		else
			fprintf(stderr, "source   %s failed: %s\n", src ? src : "-", msg ? msg : "");
		break;
	case SFW_EV_SOURCE_DEMOTED:
		fprintf(stderr, "source   %s demoted: %s\n", src ? src : "-", msg ? msg : "");
		break;
	case SFW_EV_HASH_MISMATCH:
		fprintf(stderr, "BAD      %s: %s\n", path, msg ? msg : "");
		break;
	case SFW_EV_FILE_DONE:
		fprintf(stderr, "verified %s\n", path);
		break;
	case SFW_EV_FILE_FAILED:
		fprintf(stderr, "FAILED   %s: %s\n", path, msg ? msg : "");
		break;
	default:
		break;
	}
	return true;
}

/* A --mirror's usage error, the password or token in its URL not shown. */
static int mirror_error(const char *cmd, const char *v, const char *why)
{
	const char *c = strchr(v, ':');
	char *shown = sfw_fetch_redact_url(c ? c + 1 : v);
	cli_usage_error(cmd, "--mirror '%.*s%s': %s", c ? (int)(c - v + 1) : 0, v, shown ? shown : "", why);
	sfw_free(shown);
	return 0;
}

static int parse_mirror(const char *cmd, const char *v, struct sfw_source *out)
{
	const char *c = strchr(v, ':');
	if (!c)
		return mirror_error(cmd, v, "expected http:URL or hf:URL");
	size_t k = (size_t)(c - v);
	const char *url = c + 1;
	if (k == 4 && strncmp(v, "http", 4) == 0)
		out->kind = SFW_SOURCE_HTTP;
	else if (k == 2 && strncmp(v, "hf", 2) == 0)
		out->kind = SFW_SOURCE_HF;
	else
		return mirror_error(cmd, v, "kind must be http or hf");
	if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
		return mirror_error(cmd, v, "URL must start with http:// or https://");
	out->url = (char *)url;
	out->name = (char *)url;
	return 1;
}

/* What the command line and the environment ask for. */
struct get_args {
	struct sfw_fetch_params p;
	struct sfw_source first[16], last[16];
	size_t nfirst, nlast;
	const char *pubkey, *revision;
	int pubkey_file;
	const char *include[64], *exclude[64];
	size_t ninclude, nexclude;
	int json, quiet;
	double plain_every;
	uint64_t connect_timeout, stall_timeout, sync_interval;
	char repo[512], rev[64], hf_ep[1024];
	struct sfw_pubkey key;
};

/* --include / --exclude GLOB, repeatable. */
static int take_glob(const char *cmd, const char *label, const char *v, void *vals)
{
	struct get_args *g = vals;
	int inc = strcmp(label, "--include") == 0;
	size_t *n = inc ? &g->ninclude : &g->nexclude;
	if (*n >= 64)
		return cli_usage_error(cmd, "at most 64 %s options", label);
	(inc ? g->include : g->exclude)[(*n)++] = v;
	return 0;
}

/* --mirror / --mirror-last KIND:URL, repeatable. */
static int take_mirror(const char *cmd, const char *label, const char *v, void *vals)
{
	struct get_args *g = vals;
	int is_first = strcmp(label, "--mirror") == 0;
	size_t *n = is_first ? &g->nfirst : &g->nlast;
	if (*n >= 16)
		return cli_usage_error(cmd, "at most 16 %s options", label);
	if (!parse_mirror(cmd, v, is_first ? &g->first[*n] : &g->last[*n]))
		return SFW_EXIT_USAGE;
	(*n)++;
	return 0;
}

static int take_pubkey_file(const char *cmd, const char *label, const char *v, void *vals)
{
	struct get_args *g = vals;
	(void)cmd;
	(void)label;
	g->pubkey = v;
	g->pubkey_file = 1;
	return 0;
}

#define OFF(f) offsetof(struct get_args, f)
#define P(f) offsetof(struct get_args, p.f)
static const struct cli_arg args[] = {
    {{"dest", 'd', "DIR", "destination directory (default: ./NAME)"}, CLI_K_STR, P(dest), 0, 0, NULL, NULL},
    {{"local-dir", 0, "DIR", "the same as --dest (the hf CLI's name)"}, CLI_K_STR, P(dest), 0, 0, NULL, NULL},
    {{"revision", 0, "HEX40", "the 40-hex commit the manifest must name (the same as REPO@HEX40)"},
     CLI_K_STR, OFF(revision), 0, 0, NULL, NULL},
    {{"include", 0, "GLOB",
      "fetch only files matching GLOB (fnmatch, '*' matches '/' too) or named by it exactly (repeatable)"},
     CLI_K_CALL, 0, 0, 0, take_glob, NULL},
    {{"exclude", 0, "GLOB", "skip files matching GLOB (repeatable; applied after --include)"},
     CLI_K_CALL, 0, 0, 0, take_glob, NULL},
    {{"endpoint", 0, "URL", "manifest service (default $SALAFW_ENDPOINT or https://freeweights.allternit.com)"},
     CLI_K_STR, P(endpoint), 0, 0, NULL, "SALAFW_ENDPOINT"},
    {{"manifest", 'm', "URL|FILE", "take the manifest from here (+ '.minisig') instead of the service"},
     CLI_K_STR, P(manifest), 0, 0, NULL, NULL},
    {{"pubkey", 'P', "KEY|FILE",
      "trust this minisign public key (a file, base64, or an installed key's name) instead of the pinned one"},
     CLI_K_STR, OFF(pubkey), 0, 0, NULL, NULL},
    {{"pubkey-file", 0, "FILE", "the same, a key file only (older spelling)"},
     CLI_K_CALL, 0, 0, 0, take_pubkey_file, NULL},
    {{"mirror", 0, "KIND:URL", "extra source tried BEFORE the manifest's (http:URL or hf:URL; repeatable)"},
     CLI_K_CALL, 0, 0, 0, take_mirror, NULL},
    {{"mirror-last", 0, "KIND:URL", "extra source tried AFTER the manifest's (repeatable)"},
     CLI_K_CALL, 0, 0, 0, take_mirror, NULL},
    {{"jobs", 'j', "N", "files downloaded at once (default 4)"}, CLI_K_INT, P(jobs), 1, 64, NULL, NULL},
    {{"connections", 'x', "N", "ranged connections per file (default 4; aria2's -x)"},
     CLI_K_INT, P(connections), 1, 64, NULL, NULL},
    {{"segment-size", 0, "BYTES", "never split a file into pieces smaller than this (default 32M)"},
     CLI_K_BYTES, P(min_segment), 0, 0, NULL, NULL},
    {{"connect-timeout", 0, "SECONDS", "connect timeout (default 15)"},
     CLI_K_U64, OFF(connect_timeout), 0, 0, NULL, NULL},
    {{"stall-timeout", 0, "SECONDS", "abort a transfer below 1 KiB/s for this long (default 30)"},
     CLI_K_U64, OFF(stall_timeout), 0, 0, NULL, NULL},
    {{"retries", 0, "N", "retries per file and source, reset by progress (default 5)"},
     CLI_K_INT, P(max_retries), 0, 1000, NULL, NULL},
    {{"retry-wait", 0, "MS", "first backoff delay, doubled each retry, jittered (default 1000)"},
     CLI_K_U64, P(backoff_base_ms), 0, 0, NULL, NULL},
    {{"retry-max-wait", 0, "MS", "backoff cap (default 30000)"}, CLI_K_U64, P(backoff_cap_ms), 0, 0, NULL, NULL},
    {{"limit-rate", 0, "BYTES", "cap on the total download speed in bytes/s, shared by all transfers (default none)"},
     CLI_K_BYTES, P(limit_rate), 0, 0, NULL, NULL},
    {{"sync-interval", 0, "SECONDS", "fdatasync partials + journal this often; a kill loses at most that (default 5)"},
     CLI_K_U64, OFF(sync_interval), 0, 0, NULL, NULL},
    {{"no-space-check", 0, NULL, "do not refuse when free disk space looks too small"},
     CLI_K_FLAG, P(no_space_check), 0, 0, NULL, NULL},
    {{"allow-expired", 0, NULL, "accept an expired manifest (archival fetch of a pinned revision)"},
     CLI_K_FLAG, P(trust.allow_expired), 0, 0, NULL, NULL},
    {{"allow-downgrade", 0, NULL, "accept a lower manifest_version than one seen before"},
     CLI_K_FLAG, P(trust.allow_downgrade), 0, 0, NULL, NULL},
    {{"progress-interval", 0, "SECONDS", "when stderr is not a terminal: a line per active file this often (default 5)"},
     CLI_K_DOUBLE, OFF(plain_every), 0.1, 86400, NULL, NULL},
    {{"json", 0, NULL, "one JSON event per line on stdout"}, CLI_K_FLAG, OFF(json), 0, 0, NULL, NULL},
    {{"quiet", 'q', NULL, "only errors and the summary"}, CLI_K_FLAG, OFF(quiet), 0, 0, NULL, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF
#undef P

/* The values a table row cannot store as they are (a 0 that means 1, the
 * params' own types). */
static void get_settle(struct get_args *g, const struct cli_parser *cp)
{
	struct sfw_fetch_params *p = &g->p;
	if (cli_given(cp, "connect-timeout"))
		p->connect_timeout_s = (long)(g->connect_timeout ? g->connect_timeout : 1);
	if (cli_given(cp, "stall-timeout"))
		p->stall_timeout_s = (long)(g->stall_timeout ? g->stall_timeout : 1);
	if (cli_given(cp, "sync-interval"))
		p->journal_interval_s = g->sync_interval ? (double)g->sync_interval : 1;
	if (cli_given(cp, "segment-size") && !p->min_segment)
		p->min_segment = 1;
}

/* REPO[@REVISION], --revision and the destination. Returns 0 or an exit code. */
static int get_target(const char *cmd, struct get_args *g, const struct cli_parser *cp)
{
	struct sfw_fetch_params *p = &g->p;
	if (cp->npos > 1)
		return cli_usage_error(cmd, "expected one REPO[@REVISION]");
	if (cp->npos == 1) {
		const char *a = cp->pos[0];
		const char *at = strchr(a, '@');
		size_t rl = at ? (size_t)(at - a) : strlen(a);
		if (rl >= sizeof(g->repo))
			return cli_usage_error(cmd, "'%.40s...' is not org/name[@revision]", a);
		memcpy(g->repo, a, rl);
		if (!cli_check_repo_id(cmd, NULL, g->repo)) /* before any network */
			return SFW_EXIT_USAGE;
		if (at && g->revision && strcmp(at + 1, g->revision) != 0)
			return cli_usage_error(cmd, "REPO@%s and --revision %s disagree", at + 1, g->revision);
		if (at)
			g->revision = at + 1;
		p->repo_id = g->repo;
	} else if (!p->manifest) {
		return cli_usage_error(cmd, "missing REPO (or --manifest)");
	}
	if (g->revision) {
		if (strlen(g->revision) != 40 || strspn(g->revision, "0123456789abcdef") != 40)
			return cli_usage_error(cmd, "revision '%s' must be a 40-hex commit (lower case)", g->revision);
		snprintf(g->rev, sizeof(g->rev), "%s", g->revision);
		p->revision = g->rev;
	}
	if (!p->dest) {
		const char *sl = strrchr(g->repo, '/');
		if (!sl || !sl[1])
			return cli_usage_error(cmd, "missing --dest");
		p->dest = sl + 1;
	}
	return 0;
}

/* The key to trust, HF_ENDPOINT, HF_TOKEN, SALAFW_STATE_DIR, and the lists
 * the params point at. Returns 0 or an exit code. */
static int get_trust_env(const char *cmd, struct get_args *g)
{
	struct sfw_fetch_params *p = &g->p;
	if (g->pubkey) {
		if (g->pubkey_file) {
			struct sfw_err err;
			sfw_err_clear(&err);
			enum sfw_status st = sfw_pubkey_load(g->pubkey, &g->key, &err);
			if (st != SFW_OK)
				return cli_report(st, &err);
		} else {
			int rc = cli_load_pubkey(cmd, g->pubkey, &g->key);
			if (rc)
				return rc;
		}
		p->trust.keys = &g->key;
		p->trust.nkeys = 1;
	}
	p->include = g->include;
	p->ninclude = g->ninclude;
	p->exclude = g->exclude;
	p->nexclude = g->nexclude;
	const char *hfe = getenv("HF_ENDPOINT");
	if (hfe && *hfe) {
		size_t n = strlen(hfe);
		while (n > 0 && hfe[n - 1] == '/')
			n--;
		if ((strncmp(hfe, "http://", 7) != 0 && strncmp(hfe, "https://", 8) != 0) || n >= sizeof(g->hf_ep))
			return cli_usage_error(cmd, "HF_ENDPOINT must be an http:// or https:// URL");
		memcpy(g->hf_ep, hfe, n);
		g->hf_ep[n] = '\0';
		p->hf_endpoint = g->hf_ep;
	}
	const char *tok = getenv("HF_TOKEN");
	if (tok && *tok) {
		for (const unsigned char *c = (const unsigned char *)tok; *c; c++)
			if (*c <= 0x20 || *c >= 0x7f) /* never echoed: say what is wrong, not what it is */
				return cli_usage_error(cmd, "HF_TOKEN holds a space or control character");
		p->hf_token = tok;
	}
	const char *sd = getenv("SALAFW_STATE_DIR");
	if (sd && *sd)
		p->trust.state_dir = sd;
	p->mirrors_first = g->first;
	p->nmirrors_first = g->nfirst;
	p->mirrors_last = g->last;
	p->nmirrors_last = g->nlast;
	return 0;
}

/* The closing summary: a JSON object with --json, one line on stderr. */
static void print_summary(int json, enum sfw_status st, const struct sfw_fetch_summary *sum,
			  const struct sfw_err *err)
{
	char rb[32], rate[32];
	human(rb, sizeof(rb), (double)sum->received);
	human(rate, sizeof(rate), sum->seconds > 0 ? (double)sum->received / sum->seconds : 0);
	if (json) {
		printf("{\"event\":\"summary\",\"status\":\"%s\",\"exit\":%d,\"files\":%zu,\"skipped\":%zu,"
		       "\"downloaded\":%zu,\"failed\":%zu,\"received\":%llu,\"resumed\":%llu,\"discarded\":%llu,"
		       "\"seconds\":%.3f,\"error\":",
		       st == SFW_OK ? "ok" : sfw_strerror(st), sfw_exit_code(st), sum->nfiles, sum->nskipped,
		       sum->ndownloaded, sum->nfailed, (unsigned long long)sum->received,
		       (unsigned long long)sum->resumed, (unsigned long long)sum->discarded, sum->seconds);
		json_str(stdout, st == SFW_OK ? "" : err->msg);
		printf("}\n");
		fflush(stdout);
	}
	if (sum->nfiles)
		fprintf(stderr, "%s@%s: %zu/%zu files verified (%zu downloaded, %zu already present, %zu failed); "
				"%s received in %.1f s (%s/s), %llu bytes resumed, %llu discarded\n",
			sum->repo_id, sum->revision, sum->ndownloaded + sum->nskipped, sum->nfiles, sum->ndownloaded,
			sum->nskipped, sum->nfailed, rb, sum->seconds, rate, (unsigned long long)sum->resumed,
			(unsigned long long)sum->discarded);
}

/* Runs the get with its progress display; returns the exit code. */
static int get_run(struct get_args *g)
{
	struct sfw_fetch_params *p = &g->p;
	struct ui u;
	memset(&u, 0, sizeof(u));
	u.mode = g->json ? M_JSON : isatty(2) ? M_TTY : M_PLAIN;
	u.quiet = g->quiet;
	u.plain_every = g->plain_every;
	u.nrows = 4096;
	u.rows = sfw_calloc(u.nrows, sizeof(*u.rows));
	if (!u.rows)
		return cli_report(SFW_E_NOMEM, NULL);
	p->on_event = on_event;
	p->user = &u;
	p->cancel = cli_interrupt_polled();
	signal(SIGPIPE, SIG_IGN);
	struct sfw_err err;
	sfw_err_clear(&err);
	struct sfw_fetch_summary sum;
	enum sfw_status st = sfw_fetch_get(p, &sum, &err);
	if (u.mode == M_TTY)
		clear_block(&u);
	sfw_free(u.rows);
	print_summary(g->json, st, &sum, &err);
	return cli_report(st, &err);
}

int cmd_get(int argc, char **argv)
{
	const char *cmd = "salafw get";
	struct get_args *g = sfw_calloc(1, sizeof(*g));
	if (!g)
		return cli_report(SFW_E_NOMEM, NULL);
	g->p = sfw_fetch_default_params();
	g->plain_every = 5;
	struct cli_parser cp;
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, g);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, synopsis, args);
		rc = SFW_EXIT_OK;
	} else if (rc == 0) {
		get_settle(g, &cp);
		if ((rc = get_target(cmd, g, &cp)) == 0 && (rc = get_trust_env(cmd, g)) == 0)
			rc = get_run(g);
	}
	sfw_free(g);
	return rc;
}
