/* salafw manifest - hash a model directory into a sorted manifest v1. */
#include "cli.h"
#include "verify/verify.h"

#include "alloc.h"
#include "file.h"
#include "log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_SOURCES 32

static const struct cli_opt opts[] = {
    {"repo", 0, "ORG/NAME", "repo id the manifest binds to (required)"},
    {"revision", 0, "HEX40", "40-hex commit the manifest binds to (required)"},
    {"source", 0, "KIND:URL", "http:BASE_URL or hf:ENDPOINT, in order; repeatable"},
    {"output", 'o', "FILE", "write here (atomically) instead of standard output"},
    {"key-id", 0, "HEX16", "publisher key id (default: filled in by 'salafw sign')"},
    {"pubkey", 'P', "KEY|FILE", "take the publisher key id from this public key (a file, base64, or an installed key's name)"},
    {"manifest-version", 0, "N", "rollback counter, >= 1 (default 1)"},
    {"expires-days", 0, "N", "days until the manifest expires (default 180)"},
    {"threads", 't', "N", "hashing threads (default: all cores)"},
    {0},
};

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
	const char *cmd = "salafw manifest", *arg, *out = NULL, *pubkey = NULL;
	struct sfw_manifest_build_params p = sfw_manifest_build_default_params();
	struct sfw_source src[MAX_SOURCES];
	char *urls[MAX_SOURCES] = {0};
	size_t nsrc = 0;
	unsigned long long v, days = 180;
	int k, rc = SFW_EXIT_USAGE;
	cli_init(&cp, cmd, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, cmd,
				  "DIR --repo ORG/NAME --revision HEX40 [--source KIND:URL]... [-o FILE]",
				  opts);
			rc = SFW_EXIT_OK;
			goto done;
		}
		if (k == CLI_ERROR)
			goto done;
		switch (k) {
		case 0:
			if (!cli_check_repo_id(cmd, "--repo ", arg))
				goto done;
			p.repo_id = arg;
			break;
		case 1:
			p.revision = arg;
			break;
		case 2: {
			if (nsrc == MAX_SOURCES) {
				rc = cli_usage_error(cmd, "at most %d sources", MAX_SOURCES);
				goto done;
			}
			int hf = strncmp(arg, "hf:", 3) == 0;
			if (!hf && strncmp(arg, "http:", 5) != 0) {
				rc = cli_usage_error(
				    cmd, "--source must be http:BASE_URL or hf:ENDPOINT, not '%s'", arg);
				goto done;
			}
			const char *url = arg + (hf ? 3 : 5);
			size_t n = strlen(url);
			char *u = sfw_malloc(n + 2);
			if (!u) {
				fprintf(stderr, "salafw: out of memory\n");
				rc = SFW_EXIT_IO;
				goto done;
			}
			memcpy(u, url, n + 1);
			/* http base URLs end in '/', hf endpoints do not. */
			if (hf)
				while (n > 0 && u[n - 1] == '/')
					u[--n] = '\0';
			else if (n == 0 || u[n - 1] != '/')
				memcpy(u + n, "/", 2);
			urls[nsrc] = u;
			src[nsrc].kind = hf ? SFW_SOURCE_HF : SFW_SOURCE_HTTP;
			src[nsrc].url = u;
			src[nsrc].name = NULL;
			nsrc++;
			break;
		}
		case 3:
			out = arg;
			break;
		case 4:
			p.key_id = arg;
			break;
		case 5:
			pubkey = arg;
			break;
		case 6:
			if (!cli_parse_u64(cmd, "--manifest-version", arg, &v))
				goto done;
			if (v < 1) {
				rc = cli_usage_error(cmd, "--manifest-version must be at least 1");
				goto done;
			}
			p.manifest_version = v;
			break;
		case 7:
			if (!cli_parse_u64(cmd, "--expires-days", arg, &days))
				goto done;
			if (days < 1 || days > 36500) {
				rc = cli_usage_error(cmd, "--expires-days must be between 1 and 36500");
				goto done;
			}
			break;
		case 8:
			if (!cli_parse_u64(cmd, "--threads", arg, &v))
				goto done;
			p.threads = v > 256 ? 256 : (int)v;
			break;
		}
	}
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
	p.sources = src;
	p.nsources = nsrc;
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
	for (size_t i = 0; i < nsrc; i++)
		sfw_free(urls[i]);
	return rc;
}
