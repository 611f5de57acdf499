/* salafw manifest - hash a model directory into a sorted manifest v1. */
#include "cli.h"
#include "verify/verify.h"

#include "alloc.h"
#include "file.h"
#include "log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_SOURCES 32

/* The command line's values (cli_parse_args fills them from the table). */
struct manifest_args {
	struct sfw_manifest_build_params p;
	const char *out, *pubkey;
	uint64_t version, days;
	int threads, failed;
	struct sfw_source src[MAX_SOURCES];
	char *urls[MAX_SOURCES];
	size_t nsrc;
};

static int take_repo(const char *cmd, const char *label, const char *v, void *vals)
{
	(void)label;
	if (!cli_check_repo_id(cmd, "--repo ", v))
		return SFW_EXIT_USAGE;
	((struct manifest_args *)vals)->p.repo_id = v;
	return 0;
}

/* --source KIND:URL, repeatable: http base URLs end in '/', hf endpoints do not. */
static int take_source(const char *cmd, const char *label, const char *v, void *vals)
{
	struct manifest_args *a = vals;
	if (a->nsrc == MAX_SOURCES)
		return cli_usage_error(cmd, "at most %d sources", MAX_SOURCES);
	int hf = strncmp(v, "hf:", 3) == 0;
	if (!hf && strncmp(v, "http:", 5) != 0)
		return cli_usage_error(cmd, "%s must be http:BASE_URL or hf:ENDPOINT, not '%s'", label, v);
	const char *url = v + (hf ? 3 : 5);
	size_t n = strlen(url);
	char *u = sfw_malloc(n + 2);
	if (!u) {
		fprintf(stderr, "salafw: out of memory\n");
		return SFW_EXIT_IO;
	}
	memcpy(u, url, n + 1);
	if (hf)
		while (n > 0 && u[n - 1] == '/')
			u[--n] = '\0';
	else if (n == 0 || u[n - 1] != '/')
		memcpy(u + n, "/", 2);
	a->urls[a->nsrc] = u;
	a->src[a->nsrc].kind = hf ? SFW_SOURCE_HF : SFW_SOURCE_HTTP;
	a->src[a->nsrc].url = u;
	a->src[a->nsrc].name = NULL;
	a->nsrc++;
	return 0;
}

#define OFF(f) offsetof(struct manifest_args, f)
static const struct cli_arg args[] = {
    {{"repo", 0, "ORG/NAME", "repo id the manifest binds to (required)"}, CLI_K_CALL, 0, 0, 0, take_repo, NULL},
    {{"revision", 0, "HEX40", "40-hex commit the manifest binds to (required)"},
     CLI_K_STR, OFF(p.revision), 0, 0, NULL, NULL},
    {{"source", 0, "KIND:URL", "http:BASE_URL or hf:ENDPOINT, in order; repeatable"},
     CLI_K_CALL, 0, 0, 0, take_source, NULL},
    {{"output", 'o', "FILE", "write here (atomically) instead of standard output"},
     CLI_K_STR, OFF(out), 0, 0, NULL, NULL},
    {{"key-id", 0, "HEX16", "publisher key id (default: filled in by 'salafw sign')"},
     CLI_K_STR, OFF(p.key_id), 0, 0, NULL, NULL},
    {{"pubkey", 'P', "KEY|FILE",
      "take the publisher key id from this public key (a file, base64, or an installed key's name)"},
     CLI_K_STR, OFF(pubkey), 0, 0, NULL, NULL},
    {{"manifest-version", 0, "N", "rollback counter, >= 1 (default 1)"},
     CLI_K_U64, OFF(version), 1, 9007199254740992.0, NULL, NULL},
    {{"expires-days", 0, "N", "days until the manifest expires (default 180)"},
     CLI_K_U64, OFF(days), 1, 36500, NULL, NULL},
    {{"threads", 't', "N", "hashing threads (default: all cores)"}, CLI_K_INT, OFF(threads), 0, 256, NULL, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

/* A manifest already at path for the same repository and manifest_version,
 * with other bytes: signing this one too would be equivocation, which every
 * client that saw the other refuses. Says so (a warning: the publisher may
 * mean to replace an unpublished one). */
static void warn_same_version(const char *cmd, const char *path, const struct sfw_manifest_build_params *p,
			      const char *text, size_t len)
{
	struct sfw_buf b;
	struct sfw_err e = {0};
	char ep[1024];
	if (!path || sfw_read_file(path, SFW_MANIFEST_MAX, &b, &e) != SFW_OK)
		return;
	cJSON *o = cJSON_ParseWithLength(b.data, b.len);
	int same = b.len == len && memcmp(b.data, text, len) == 0;
	sfw_buf_release(&b);
	const cJSON *repo = cJSON_GetObjectItemCaseSensitive(o, "repo_id");
	const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "manifest_version");
	unsigned long long want = p->manifest_version ? p->manifest_version : 1;
	if (!same && cJSON_IsString(repo) && strcmp(repo->valuestring, p->repo_id) == 0 && cJSON_IsNumber(ver) &&
	    ver->valuedouble == (double)want)
		fprintf(
		    stderr,
		    "%s: warning: '%s' already holds manifest_version %llu of %s with other bytes: signing "
		    "this one too is equivocation, which clients that saw the other refuse; pass "
		    "--manifest-version %llu\n",
		    cmd, sfw_esc(path, ep, sizeof(ep)), want, p->repo_id, want + 1);
	cJSON_Delete(o);
}

int cmd_manifest(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw manifest";
	struct manifest_args a = {.p = sfw_manifest_build_default_params(), .days = 180};
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, &a);
	struct sfw_manifest_build_params p = a.p;
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, "DIR --repo ORG/NAME --revision HEX40 [--source KIND:URL]... [-o FILE]", args);
		rc = SFW_EXIT_OK;
		goto done;
	}
	if (rc != 0)
		goto done;
	if (a.version)
		p.manifest_version = a.version;
	if (a.threads)
		p.threads = a.threads;
	const char *out = a.out, *pubkey = a.pubkey;
	unsigned long long days = a.days;
	if (cp.npos != 1) {
		rc = cli_usage_error(cmd, "expected one DIR");
		goto done;
	}
	if (!p.repo_id || !p.revision) {
		rc = cli_usage_error(cmd, "--repo and --revision are required");
		goto done;
	}
	struct sfw_err err = {0};
	char kid[17];
	if (pubkey) {
		struct sfw_pubkey pk;
		if ((rc = cli_load_pubkey(cmd, pubkey, &pk)) != 0)
			goto done;
		sfw_pubkey_id_hex(pk.key_id, kid);
		p.key_id = kid;
	}
	p.sources = a.src;
	p.nsources = a.nsrc;
	p.created = (int64_t)time(NULL);
	p.expires = p.created + (int64_t)days * 86400;
	char *text = NULL;
	size_t len = 0;
	enum sfw_status s = sfw_manifest_build(cp.pos[0], &p, &text, &len, &err);
	if (s == SFW_OK) {
		char *own = sfw_path_join(cp.pos[0], ".salafw/manifest.json");
		warn_same_version(cmd, out, &p, text, len);
		if (own && (!out || strcmp(own, out) != 0))
			warn_same_version(cmd, own, &p, text, len);
		sfw_free(own);
		if (out) {
			s = sfw_write_file_atomic(out, text, len, &err);
		} else if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) {
			s = sfw_fail(&err, errno == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO,
				     "cannot write to standard output: %s", strerror(errno));
		}
	}
	sfw_free(text);
	rc = cli_report(s, &err);
done:
	for (size_t i = 0; i < a.nsrc; i++)
		sfw_free(a.urls[i]);
	return rc;
}
