/* cli/model.c - what the commands that open a model share: their common
 * options, the verified-weights gate, and reading token ids. */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"
#include "formats/safetensors.h"
#include "runner/runner.h"
#include "verify/verify.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>


void cli_model_opts_init(struct cli_model_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->device = SFW_DEVICE_AUTO;
}

int cli_take_device(const char *cmd, const char *label, const char *value, void *device)
{
	if (!strcmp(value, "cpu"))
		*(int *)device = SFW_DEVICE_CPU;
	else if (!strcmp(value, "cuda"))
		*(int *)device = SFW_DEVICE_CUDA;
	else
		return cli_usage_error(cmd, "%s must be cpu or cuda", label);
	return 0;
}

int cli_take_kv_cache(const char *cmd, const char *label, const char *value, void *kv)
{
	if (!strcmp(value, "bf16"))
		*(int *)kv = SFW_KV_CACHE_ACT;
	else if (!strcmp(value, "fp8"))
		*(int *)kv = SFW_KV_CACHE_FP8;
	else
		return cli_usage_error(cmd, "%s must be bf16 or fp8", label);
	return 0;
}

/* ---- the verified-weights gate ------------------------------------------------
 * Every refusal names the command that fixes it: a missing manifest -> the
 * get (or, for a model salafw derived, the sign) command; an unsigned
 * derived manifest -> `salafw sign --user`; a missing model file -> the get
 * that re-fetches only it; files not (or no longer) verified -> verify. */

static char *dot_salafw(const char *dir, const char *name)
{
	char rel[64];
	snprintf(rel, sizeof(rel), ".salafw/%s", name);
	return sfw_path_join(dir, rel);
}

/* A bf16 model directory whose config.json is a pinned release's: the repo
 * and revision it came from, for the get command; NULL otherwise. */
static const struct sfw_pin_info *pinned_origin(const char *dir, struct sfw_pin_info *out)
{
	char *cp = sfw_path_join(dir, "config.json");
	unsigned char h[32];
	uint64_t size;
	struct sfw_err e = {0};
	int ok = cp && sfw_sha256_file(cp, h, &size, &e) == SFW_OK && sfw_pin_of_file("config.json", h, out);
	sfw_free(cp);
	return ok ? out : NULL;
}

/* config.json declares a quantization: a model salafw (or another tool)
 * derived, not one a publisher signed as it is. */
static int is_quantized(const char *dir)
{
	char *cp = sfw_path_join(dir, "config.json");
	struct sfw_buf b;
	sfw_buf_init(&b, 4u << 20);
	struct sfw_err e = {0};
	int q = cp && sfw_read_file(cp, 4u << 20, &b, &e) == SFW_OK && b.data &&
		strstr(b.data, "\"quantization_config\"") &&
		!strstr(b.data, "\"quantization_config\": null") &&
		!strstr(b.data, "\"quantization_config\":null");
	sfw_buf_release(&b);
	sfw_free(cp);
	return q;
}

/* pubkey: the key this command was given, which the get must trust too */
static void print_get_hint(const char *cmd, const char *dir, const struct sfw_manifest *m, const char *file,
			   const char *pubkey)
{
	struct sfw_pin_info pin;
	const char *repo = m ? m->repo_id : NULL, *rev = m ? m->revision : NULL;
	char ed[4096], ef[1024], ek[1024];
	if (!repo && pinned_origin(dir, &pin))
		repo = pin.repo_id, rev = pin.revision;
	dir = sfw_esc(dir, ed, sizeof(ed)); /* untrusted strings, printed escaped */
	const char *key = pubkey ? sfw_esc(pubkey, ek, sizeof(ek)) : "";
	/* the file as a shell word: quoted unless plain (a path holds no control
	 * byte and no backslash, sfw_path_check) */
	const char *q = "";
	if (file && strspn(file, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/-") !=
			strlen(file))
		q = strchr(file, '\'') ? "\"" : "'";
	if (repo)
		fprintf(stderr,
			"%s: refusing to run unverified weights; fix: salafw get %s@%s -d %s%s%s%s%s%s%s\n",
			cmd, repo, rev, dir, file ? " --include " : "", q,
			file ? sfw_esc(file, ef, sizeof(ef)) : "", q, pubkey ? " --pubkey " : "", key);
	else
		fprintf(stderr,
			"%s: refusing to run unverified weights; fix: salafw get ORG/NAME@REVISION -d %s%s%s "
			"(the repo it came from); for weights of your own that no repo signed (salafw mkmodel): "
			"add --no-verify\n",
			cmd, dir, pubkey ? " --pubkey " : "", key);
}

/* The bytes of an unsigned manifest that `salafw manifest` or `quant`
 * wrote, with an empty key id filled for the parse (for the hint only). */
static int unsigned_is_derived(const char *mpath)
{
	struct sfw_buf b;
	struct sfw_err e = {0};
	if (sfw_read_file(mpath, SFW_MANIFEST_MAX, &b, &e) != SFW_OK)
		return 0;
	char *k = b.data ? strstr(b.data, "\"key_id\": \"\"") : NULL;
	struct sfw_buf pb;
	sfw_buf_init(&pb, SFW_MANIFEST_MAX + 32);
	int derived = 0;
	if (k) {
		*k = 0;
		if (sfw_buf_printf(&pb, "%s\"key_id\": \"0000000000000000\"%s", b.data, k + 12) != SFW_OK)
			k = NULL;
	}
	struct sfw_manifest m;
	const char *t = k ? pb.data : b.data;
	size_t n = k ? pb.len : b.len;
	if (t && sfw_manifest_parse(t, n, "manifest", &m, &e) == SFW_OK) {
		derived = m.lineage.present;
		sfw_manifest_release(&m);
	}
	sfw_buf_release(&pb);
	sfw_buf_release(&b);
	return derived;
}

int cli_derived_unsigned(const char *dir)
{
	char *mp = sfw_path_join(dir, ".salafw/manifest.json");
	struct stat st;
	int r = 0;
	if (mp && lstat(mp, &st) == 0)
		r = S_ISREG(st.st_mode) && unsigned_is_derived(mp);
	else if (mp && errno == ENOENT)
		r = is_quantized(dir);
	sfw_free(mp);
	return r;
}

void cli_lineage_text(const struct sfw_manifest_lineage *l, char *out, size_t cap)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 4096);
	enum sfw_status s = sfw_buf_printf(&b, "%s by %s", l->method, l->derived_by);
	for (size_t i = 0; s == SFW_OK && i < l->nparams; i++)
		s = sfw_buf_printf(&b, "%s%s %s", i ? ", " : " (", l->param_key[i], l->param_value[i]);
	if (s == SFW_OK && l->nparams)
		s = sfw_buf_printf(&b, ")");
	snprintf(out, cap, "%s", s == SFW_OK && b.data ? b.data : l->method);
	sfw_buf_release(&b);
}

void cli_parent_text(const struct sfw_manifest_lineage *l, char *out, size_t cap)
{
	if (!l->has_parent)
		snprintf(out, cap, "a model that was not verified");
	else
		snprintf(out, cap, "%s@%s", l->parent_repo_id, l->parent_revision);
}

int cli_trusted_keys(const char *pubkey, struct sfw_pubkey *keys, size_t *n, int *user_at,
		     struct sfw_err *err)
{
	*n = 0;
	*user_at = -1;
	if (pubkey) {
		enum sfw_status s = sfw_pubkey_load(pubkey, &keys[0], err);
		if (s != SFW_OK)
			return s;
		*n = 1;
		return SFW_OK;
	}
	sfw_pubkey_pinned(&keys[0]);
	*n = 1;
	struct sfw_err e = {0};
	if (sfw_userkey_load_pub(&keys[1], &e) == SFW_OK && memcmp(keys[1].key_id, keys[0].key_id, 8) != 0) {
		*user_at = 1;
		*n = 2;
	}
	return SFW_OK;
}

/* DIR must be a directory (worded as verify and manifest word it: one
 * condition, one message); --no-verify then says so and passes. Returns an
 * exit code, or -1 to go on to the manifest. */
static int gate_dir(const char *cmd, const char *dir, const char *udir, int no_verify)
{
	struct sfw_err err = {0};
	struct stat dst;
	int st_ok = stat(dir, &dst) == 0;
	if (!st_ok || !S_ISDIR(dst.st_mode)) {
		int e = st_ok ? ENOTDIR : errno;
		int missing = !st_ok && (e == ENOENT || e == ENOTDIR);
		sfw_fail(&err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(e));
		int rc = cli_report(err.code, &err);
		if (missing)
			fprintf(stderr,
				"%s: hint: check the path, or fetch a model there: salafw get "
				"ORG/NAME@REVISION -d %s\n",
				cmd, udir);
		return rc;
	}
	if (no_verify) {
		fprintf(stderr, "%s: warning: --no-verify: running '%s' without checking its signed manifest\n", cmd,
			udir);
		return 0;
	}
	return -1;
}

/* The fix for files that no longer match their verified state (s): a
 * derived model is made again, a missing or changed file fetched again,
 * anything else verified again. */
static void gate_state_hint(const char *cmd, const char *dir, const struct sfw_manifest *m, enum sfw_status s,
			    const char *pubkey)
{
	char edir[4096], ekey[1024];
	const char *udir = sfw_esc(dir, edir, sizeof(edir));
	const char *gone = NULL;
	for (size_t i = 0; i < m->nfiles && !gone; i++) {
		char *fp = sfw_path_join(dir, m->files[i].path);
		struct stat st;
		if (fp && lstat(fp, &st) != 0 && errno == ENOENT)
			gone = m->files[i].path;
		sfw_free(fp);
	}
	if (m->lineage.present && (gone || s == SFW_E_HASH || s == SFW_E_SIZE))
		fprintf(stderr,
			"%s: refusing to run unverified weights; fix: make the derived model again: "
			"salafw quant PARENT_DIR -o %s --force\n",
			cmd, udir);
	else if (gone)
		print_get_hint(cmd, dir, m, gone, pubkey);
	else if (s == SFW_E_HASH || s == SFW_E_SIZE)
		print_get_hint(cmd, dir, m, NULL, pubkey);
	else
		fprintf(stderr, "%s: refusing to run unverified weights; fix: salafw verify %s%s%s\n", cmd, udir,
			pubkey ? " --pubkey " : "", pubkey ? sfw_esc(pubkey, ekey, sizeof(ekey)) : "");
}

/* "verified: signed by ..., derived from ..." for a model the user derived. */
static void gate_say_derived(const char *cmd, const char *udir, const struct sfw_manifest *m, int local,
			     const char *key_id)
{
	char par[200];
	const char *group = "";
	for (size_t i = 0; i < m->lineage.nparams; i++)
		if (!strcmp(m->lineage.param_key[i], "group_size"))
			group = m->lineage.param_value[i];
	cli_parent_text(&m->lineage, par, sizeof(par));
	fprintf(stderr, "%s: verified: signed by %s %s, derived from %s (%s%s%s; salafw verify %s shows how)\n", cmd,
		local ? "your local key" : "key", key_id, par, m->lineage.method, *group ? " group " : "", group, udir);
}

int cli_model_gate_info(const char *cmd, const char *dir, int no_verify, int full, const char *pubkey,
			struct cli_gate_info *info)
{
	struct sfw_err err = {0};
	struct cli_gate_info scratch;
	if (!info)
		info = &scratch;
	memset(info, 0, sizeof(*info));
	char edir[4096]; /* dir as the hints print it (escaped) */
	const char *udir = sfw_esc(dir, edir, sizeof(edir));
	int drc = gate_dir(cmd, dir, udir, no_verify);
	if (drc >= 0)
		return drc;
	struct sfw_pubkey keys[2];
	size_t nkeys;
	int user_at;
	enum sfw_status s = SFW_OK;
	if (pubkey) { /* a file, base64, or an installed key's name, as in every command */
		int krc = cli_load_pubkey(cmd, pubkey, &keys[0]);
		if (krc)
			return krc;
		nkeys = 1;
		user_at = -1;
	} else if ((s = cli_trusted_keys(NULL, keys, &nkeys, &user_at, &err)) != SFW_OK) {
		return cli_report(s, &err);
	}
	char *mp = dot_salafw(dir, "manifest.json");
	struct sfw_buf mb, sb;
	sfw_buf_init(&mb, SFW_MANIFEST_MAX);
	sfw_buf_init(&sb, SFW_MINISIG_MAX);
	struct sfw_manifest m;
	struct sfw_minisig_info *si = sfw_malloc(sizeof(*si));
	memset(&m, 0, sizeof(m));
	int rc = 0;
	if (!mp || !si) {
		rc = cli_report(SFW_E_NOMEM, NULL);
		goto out;
	}
	/* the pair as installed (never through a symlink, never half of an
	 * interrupted install); which half is missing decides the hint */
	s = sfw_state_read_manifest(dir, &mb, &sb, &err);
	struct stat mst;
	int no_manifest = s == SFW_E_MISSING && lstat(mp, &mst) != 0 && errno == ENOENT;
	if (no_manifest) {
		sfw_fail(&err, SFW_E_UNVERIFIED, "'%s' has no signed manifest in .salafw/", dir);
		rc = cli_report(err.code, &err);
		if (is_quantized(dir))
			fprintf(stderr,
				"%s: refusing to run unverified weights; fix: salafw sign --user %s (signs "
				"the model you derived with your local key)\n",
				cmd, udir);
		else
			print_get_hint(cmd, dir, NULL, NULL, pubkey);
		goto out;
	}
	if (s == SFW_E_MISSING) { /* a manifest without its signature */
		int derived = unsigned_is_derived(mp);
		sfw_fail(&err, SFW_E_UNVERIFIED, "the manifest of %s model '%s' is not signed",
			 derived ? "the derived" : "", dir);
		rc = cli_report(err.code, &err);
		if (derived)
			fprintf(stderr,
				"%s: refusing to run unverified weights; fix: salafw sign --user %s\n", cmd,
				udir);
		else
			print_get_hint(cmd, dir, NULL, NULL, pubkey);
		goto out;
	}
	if (s != SFW_OK) {
		if (s == SFW_E_RANGE)
			s = err.code = SFW_E_MANIFEST;
		rc = cli_report(s, &err);
		goto out;
	}
	struct sfw_trust_params tp = sfw_trust_default_params();
	tp.keys = keys;
	tp.nkeys = nkeys;
	tp.allow_expired = 1;	/* verified files stay valid; expiry matters when fetching */
	tp.allow_downgrade = 1; /* and rollback when taking a manifest in, not for the folder's own */
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", mp);
	s = sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, what, &tp, &m, si, &err);
	if (s != SFW_OK) {
		rc = cli_report(s, &err);
		if (!pubkey && (s == SFW_E_KEYID || s == SFW_E_SIG))
			fprintf(stderr,
				"%s: refusing to run unverified weights; fix: pass --pubkey FILE with the "
				"key of whoever "
				"signed it%s%s%s\n",
				cmd, user_at < 0 ? " (or, for a model you derived: salafw sign --user " : "",
				user_at < 0 ? udir : "", user_at < 0 ? ")" : "");
		goto out;
	}
	const struct sfw_pubkey *signer = &keys[0];
	for (size_t i = 0; i < nkeys; i++)
		if (memcmp(keys[i].key_id, si->key_id, 8) == 0)
			signer = &keys[i];
	int local = user_at >= 0 && signer == &keys[user_at];
	if (local && (s = sfw_userkey_trust(&m, what, &err)) != SFW_OK) {
		rc = cli_report(s, &err);
		goto out;
	}
	tp.keys = signer;
	tp.nkeys = 1;
	if (full) {
		struct sfw_verify_params vp = sfw_verify_default_params();
		struct sfw_verify_report rep;
		memset(&rep, 0, sizeof(rep));
		vp.record_state = 1;
		s = sfw_verify_dir(dir, &m, &vp, &rep, &err);
		sfw_verify_report_release(&rep);
	} else {
		s = sfw_state_check(dir, &tp, &err);
	}
	if (s != SFW_OK) {
		rc = cli_report(s, &err);
		gate_state_hint(cmd, dir, &m, s, pubkey);
		goto out;
	}
	info->verified = 1;
	info->local_key = local;
	snprintf(info->repo_id, sizeof(info->repo_id), "%s", m.repo_id);
	memcpy(info->revision, m.revision, sizeof(info->revision));
	sfw_pubkey_id_hex(si->key_id, info->key_id);
	sfw_hex_encode(m.manifest_sha256, 32, info->manifest_sha256);
	if (local || m.lineage.present)
		gate_say_derived(cmd, udir, &m, local, info->key_id);
out:
	sfw_manifest_release(&m);
	sfw_buf_release(&mb);
	sfw_buf_release(&sb);
	sfw_free(si);
	sfw_free(mp);
	return rc;
}

int cli_model_gate(const char *cmd, const char *dir, int no_verify, int full, const char *pubkey)
{
	return cli_model_gate_info(cmd, dir, no_verify, full, pubkey, NULL);
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
