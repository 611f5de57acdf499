/* cli/model.c - what the commands that open a model share: their common
 * options, the verified-weights gate, and reading token ids. */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "runner/runner.h"
#include "runner/safetensors.h"
#include "verify/verify.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double cli_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_model_opts_init(struct cli_model_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->device = SFW_DEVICE_AUTO;
}

/* 1: name was a model option (taken), 0: it was not, -1: bad value (printed). */
static int model_opt(struct cli_model_opts *o, const char *cmd, const char *name, const char *arg)
{
	if (!strcmp(name, "device")) {
		if (!strcmp(arg, "cpu"))
			o->device = SFW_DEVICE_CPU;
		else if (!strcmp(arg, "cuda"))
			o->device = SFW_DEVICE_CUDA;
		else {
			cli_usage_error(cmd, "--device must be cpu or cuda");
			return -1;
		}
	} else if (!strcmp(name, "threads")) {
		if (!cli_parse_u64(cmd, "threads", arg, &o->threads))
			return -1;
		if (o->threads > 256) {
			cli_usage_error(cmd, "--threads must be at most 256 (0 = all cores)");
			return -1;
		}
	} else if (!strcmp(name, "no-verify")) {
		o->no_verify = 1;
	} else if (!strcmp(name, "verify-full")) {
		o->verify_full = 1;
	} else if (!strcmp(name, "pubkey")) {
		o->pubkey = arg;
	} else {
		return 0;
	}
	return 1;
}

int cli_next_model(struct cli_parser *p, struct cli_model_opts *o, const char **arg)
{
	for (;;) {
		int k = cli_next(p, arg);
		if (k < 0)
			return k;
		int taken = model_opt(o, p->cmd, p->opts[k].name, *arg);
		if (taken < 0)
			return CLI_ERROR;
		if (!taken)
			return k;
	}
}

static enum sfw_status verify_full(const char *dir, struct sfw_trust_params *tp, struct sfw_err *err)
{
	char mp[4096];
	snprintf(mp, sizeof(mp), "%s/.salafw/manifest.json", dir);
	struct sfw_buf mb, sb;
	sfw_buf_init(&mb, SFW_MANIFEST_MAX);
	sfw_buf_init(&sb, SFW_MINISIG_MAX);
	struct sfw_manifest m;
	memset(&m, 0, sizeof(m));
	enum sfw_status s = sfw_state_read_manifest(dir, &mb, &sb, err); /* as installed */
	if (s == SFW_E_MISSING)
		s = sfw_fail(err, SFW_E_UNVERIFIED, "'%s' has no signed manifest in .salafw/ (run 'salafw get')", dir);
	tp->allow_expired = 1; /* verified files stay valid; expiry matters when fetching */
	tp->allow_downgrade = 1; /* and rollback when taking a manifest in, not for the folder's own */
	if (s == SFW_OK)
		s = sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, mp, tp, &m, NULL, err);
	if (s == SFW_OK) {
		struct sfw_verify_params vp = sfw_verify_default_params();
		struct sfw_verify_report rep;
		memset(&rep, 0, sizeof(rep));
		vp.record_state = 1;
		s = sfw_verify_dir(dir, &m, &vp, &rep, err);
		sfw_verify_report_release(&rep);
		sfw_manifest_release(&m);
	}
	sfw_buf_release(&mb);
	sfw_buf_release(&sb);
	return s;
}

int cli_model_gate(const char *cmd, const char *dir, int no_verify, int full, const char *pubkey)
{
	struct sfw_err err = {0};
	if (no_verify) {
		fprintf(stderr, "%s: warning: --no-verify: running '%s' without checking its signed manifest\n", cmd,
			dir);
		return 0;
	}
	struct sfw_trust_params tp = sfw_trust_default_params();
	struct sfw_pubkey key;
	if (pubkey) {
		int rc = cli_load_pubkey(cmd, pubkey, &key); /* a file, base64, or an installed key's name */
		if (rc)
			return rc;
		tp.keys = &key;
		tp.nkeys = 1;
	}
	enum sfw_status s = full ? verify_full(dir, &tp, &err) : sfw_state_check(dir, &tp, &err);
	if (s != SFW_OK) {
		int rc = cli_report(s, &err);
		fprintf(stderr, "%s: refusing to run unverified weights (run 'salafw verify %s', or pass --no-verify)\n",
			cmd, dir);
		return rc;
	}
	return 0;
}

/* An --ids file that cannot be opened or parsed is a local input problem:
 * exit 5 (I/O), never 1, which means "verification failed". */
static int ids_fail(const char *cmd, const struct sfw_err *err)
{
	fprintf(stderr, "%s: --ids: %s\n", cmd, err->msg[0] ? err->msg : sfw_strerror(err->code));
	return SFW_EXIT_IO;
}

int cli_read_ids(const char *cmd, const char *path, int32_t **ids, size_t *n)
{
	struct sfw_err err = {0};
	*ids = NULL;
	*n = 0;
	struct sfw_st_file *f = NULL;
	size_t len = strlen(path);
	if (len > 12 && strcmp(path + len - 12, ".safetensors") == 0) {
		if (sfw_st_open(path, &f, &err) != SFW_OK)
			return ids_fail(cmd, &err);
		const struct sfw_tensor_info *t = sfw_st_find(f, "input_ids");
		if (!t || (t->dtype != SFW_DTYPE_I32 && t->dtype != SFW_DTYPE_I64) || t->nelem == 0) {
			sfw_st_close(f);
			fprintf(stderr, "%s: --ids: '%s' has no non-empty I32/I64 tensor 'input_ids'\n", cmd, path);
			return SFW_EXIT_IO;
		}
		if (t->nelem > (1u << 30)) {
			fprintf(stderr, "%s: --ids: '%s': input_ids holds %llu ids, more than the limit %u\n", cmd, path,
				(unsigned long long)t->nelem, 1u << 30);
			sfw_st_close(f);
			return SFW_EXIT_IO;
		}
		*ids = sfw_malloc((size_t)t->nelem * sizeof(int32_t));
		if (!*ids) {
			sfw_st_close(f);
			return cli_report(SFW_E_NOMEM, NULL);
		}
		for (uint64_t i = 0; i < t->nelem; i++) {
			int64_t v = t->dtype == SFW_DTYPE_I32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
			if (v < 0 || v > INT32_MAX) {
				sfw_st_close(f);
				sfw_free(*ids);
				*ids = NULL;
				fprintf(stderr, "%s: --ids: '%s': input_ids[%llu] = %lld is not a token id\n", cmd, path,
					(unsigned long long)i, (long long)v);
				return SFW_EXIT_IO;
			}
			(*ids)[i] = (int32_t)v;
		}
		*n = (size_t)t->nelem;
		sfw_st_close(f);
		return 0;
	}
	struct sfw_buf b;
	sfw_buf_init(&b, 256u << 20);
	if (sfw_read_file(path, 256u << 20, &b, &err) != SFW_OK)
		return ids_fail(cmd, &err);
	if (b.data && memchr(b.data, '\0', b.len)) {
		fprintf(stderr, "%s: --ids: '%s' holds a NUL byte (want text integers or a .safetensors file)\n", cmd,
			path);
		sfw_buf_release(&b);
		return SFW_EXIT_IO;
	}
	size_t cap = 0;
	const char *p = b.data ? b.data : "";
	while (*p) {
		if (isspace((unsigned char)*p) || *p == ',') {
			p++;
			continue;
		}
		char *end;
		errno = 0;
		long long v = strtoll(p, &end, 10);
		if (end == p || errno || v < 0 || v > INT32_MAX) {
			fprintf(stderr, "%s: --ids: '%s': not a token id near '%.16s'\n", cmd, path, p);
			sfw_free(*ids);
			*ids = NULL;
			sfw_buf_release(&b);
			return SFW_EXIT_IO;
		}
		if (*n == cap) {
			cap = cap ? cap * 2 : 256;
			int32_t *q = sfw_realloc(*ids, cap * sizeof(int32_t));
			if (!q) {
				sfw_free(*ids);
				*ids = NULL;
				sfw_buf_release(&b);
				return cli_report(SFW_E_NOMEM, NULL);
			}
			*ids = q;
		}
		(*ids)[(*n)++] = (int32_t)v;
		p = end;
	}
	sfw_buf_release(&b);
	if (*n == 0) {
		fprintf(stderr, "%s: --ids: '%s' holds no token ids\n", cmd, path);
		return SFW_EXIT_IO;
	}
	return 0;
}
