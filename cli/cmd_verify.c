/* salafw verify - prove a model directory is exactly what a publisher signed:
 * signature first (pinned key unless --pubkey/-P), then every file's size,
 * then sha256; extra files are a warning. Records DIR/.salafw/state.json. */
#include "cli.h"
#include "verify/verify.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEYS 8

/* One wording per result, the same as the library's errors say it
 * (verify/dirverify.c): "sha256 mismatch", also as --json's status. */
static const char *status_word(enum sfw_file_result r)
{
	switch (r) {
	case SFW_FILE_OK:
		return "ok";
	case SFW_FILE_MISSING:
		return "missing";
	case SFW_FILE_SIZE:
		return "size mismatch";
	case SFW_FILE_HASH:
		return "sha256 mismatch";
	case SFW_FILE_NOT_REGULAR:
		return "not a regular file";
	}
	return "?";
}

static void print_json(cJSON *o)
{
	char *t = cJSON_Print(o);
	if (t) {
		puts(t);
		cJSON_free(t);
	}
}

/* An error before any file was checked: one line on stderr, and with --json
 * an object saying why on stdout. */
static int fail(int json, const char *dir, enum sfw_status s, const struct sfw_err *err)
{
	if (json) {
		cJSON *o = cJSON_CreateObject();
		if (o) {
			cJSON_AddStringToObject(o, "dir", dir);
			cJSON_AddBoolToObject(o, "ok", 0);
			cJSON_AddStringToObject(o, "error", err->msg[0] ? err->msg : sfw_strerror(s));
			cJSON_AddNumberToObject(o, "exit_code", sfw_exit_code(s));
			print_json(o);
			cJSON_Delete(o);
		}
	}
	return cli_report(s, err);
}

/* The command line. */
struct args {
	const char *dir, *manifest;
	struct sfw_pubkey keys[MAX_KEYS];
	size_t nkeys;
	int json, no_state;
	int threads;
	struct sfw_trust_params tp;
};

/* --pubkey KEY|FILE and --pubkey-string KEY, repeatable: one more trusted key. */
static int take_key(const char *cmd, const char *label, const char *v, void *vals)
{
	struct args *a = vals;
	struct sfw_err err = {0};
	enum sfw_status s;
	if (a->nkeys == MAX_KEYS)
		return cli_usage_error(cmd, "at most %d trusted keys", MAX_KEYS);
	if (strcmp(label, "--pubkey-string") != 0) {
		int rc = cli_load_pubkey(cmd, v, &a->keys[a->nkeys]);
		if (rc)
			return rc;
	} else if ((s = sfw_pubkey_parse(v, strlen(v), "public key given with --pubkey-string", &a->keys[a->nkeys],
					 &err)) != SFW_OK) {
		return cli_report(s, &err);
	}
	a->nkeys++;
	return 0;
}

static int take_repo(const char *cmd, const char *label, const char *v, void *vals)
{
	(void)label;
	if (!cli_check_repo_id(cmd, "--repo ", v))
		return SFW_EXIT_USAGE;
	((struct args *)vals)->tp.repo_id = v;
	return 0;
}

#define OFF(f) offsetof(struct args, f)
static const struct cli_arg args[] = {
    {{"manifest", 'm', "FILE", "signed manifest (default DIR/.salafw/manifest.json; FILE.minisig next to it)"},
     CLI_K_STR, OFF(manifest), 0, 0, NULL, NULL},
    {{"pubkey", 'P', "KEY|FILE",
      "trust this minisign public key (a file, base64, or an installed key's name) instead of the pinned one; "
      "repeatable"},
     CLI_K_CALL, 0, 0, 0, take_key, NULL},
    {{"pubkey-string", 0, "KEY", "the same, base64 only (older spelling)"}, CLI_K_CALL, 0, 0, 0, take_key, NULL},
    {{"json", 0, NULL, "print a machine-readable report on standard output"}, CLI_K_FLAG, OFF(json), 0, 0, NULL, NULL},
    {{"threads", 't', "N", "files hashed in parallel (default: all cores)"}, CLI_K_INT, OFF(threads), 0, 256, NULL, NULL},
    {{"repo", 0, "ORG/NAME", "require the manifest to be for this repo"}, CLI_K_CALL, 0, 0, 0, take_repo, NULL},
    {{"revision", 0, "HEX40", "require the manifest to be for this revision"},
     CLI_K_STR, OFF(tp.revision), 0, 0, NULL, NULL},
    {{"require-prehashed", 0, NULL, "refuse legacy (non-prehashed) signatures"},
     CLI_K_FLAG, OFF(tp.require_prehashed), 0, 0, NULL, NULL},
    {{"allow-downgrade", 0, NULL, "accept a manifest_version older than one seen before"},
     CLI_K_FLAG, OFF(tp.allow_downgrade), 0, 0, NULL, NULL},
    {{"no-state", 0, NULL, "do not write DIR/.salafw/state.json"}, CLI_K_FLAG, OFF(no_state), 0, 0, NULL, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

/* -1: go on; otherwise the exit code (help, a usage error). */
static int parse_args(int argc, char **argv, struct args *a)
{
	struct cli_parser cp;
	const char *cmd = "salafw verify";
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, "DIR [--manifest FILE] [-P KEY|FILE] [--json] [--threads N]", args);
		printf("\nexit codes: 0 all files verified, 1 a file is missing or differs, or DIR has no\n"
		       "            signed manifest, 2 usage, 3 manifest or signature rejected (or an unsafe\n"
		       "            path), 5 local I/O (a missing --manifest FILE)\n");
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	if (cp.npos != 1)
		return cli_usage_error(cmd, "expected one DIR");
	a->dir = cp.pos[0];
	return -1;
}

/* The signed pair: the folder's own as installed (never through a symlink,
 * never half of an interrupted install), or --manifest FILE as named. A
 * failure is mapped to what it means here: DIR without a manifest is not
 * verified (exit 1, as run says; a model the user derived gets the command
 * that signs it); a --manifest FILE that is not there is a missing input
 * (exit 5); no signature or an oversized file is a rejection (exit 3); a
 * local read error stays one (exit 5). */
static enum sfw_status read_pair(const struct args *a, const char *mpath, const char *spath, struct sfw_buf *mb,
				 struct sfw_buf *sb, struct sfw_err *err)
{
	const char *dir = a->dir;
	enum sfw_status s;
	int no_manifest;
	if (a->manifest) {
		s = sfw_read_file(mpath, SFW_MANIFEST_MAX, mb, err);
		no_manifest = s == SFW_E_MISSING;
		if (s == SFW_OK)
			s = sfw_read_file(spath, SFW_MINISIG_MAX, sb, err);
	} else {
		s = sfw_state_read_manifest(dir, mb, sb, err);
		struct stat mst;
		no_manifest = s == SFW_E_MISSING && lstat(mpath, &mst) != 0 && errno == ENOENT;
	}
	if (s == SFW_OK)
		return s;
	if (no_manifest && !a->manifest && cli_derived_unsigned(dir))
		return sfw_fail(err, SFW_E_UNVERIFIED,
				"'%s' has no signed manifest in .salafw/ (a model you derived; fix: salafw sign --user %s)",
				dir, dir);
	if (no_manifest && !a->manifest)
		return sfw_fail(err, SFW_E_UNVERIFIED,
				"'%s' has no signed manifest in .salafw/ (run 'salafw get', or pass --manifest FILE)", dir);
	if (s == SFW_E_MISSING && !a->manifest && cli_derived_unsigned(dir))
		return sfw_fail(err, SFW_E_UNVERIFIED,
				"the manifest of the derived model '%s' is not signed (fix: salafw sign --user %s)", dir,
				dir);
	if (no_manifest)
		s = SFW_E_IO;
	else if (s == SFW_E_MISSING || s == SFW_E_RANGE)
		s = SFW_E_MANIFEST;
	err->code = s;
	return s;
}

static void print_signature(const struct sfw_manifest *m, const struct sfw_minisig_info *info, const char *kid,
			    int local_key)
{
	char esc[1100], par[200] = "", how[600] = "", epar[800], ehow[2400];
	printf("signature ok: key %s%s, %s, trusted comment: %s\n", kid, local_key ? " (your local key)" : "",
	       info->prehashed ? "prehashed" : "legacy", sfw_esc(info->trusted_comment, esc, sizeof(esc)));
	if (!m->lineage.present)
		return;
	cli_parent_text(&m->lineage, par, sizeof(par));
	cli_lineage_text(&m->lineage, how, sizeof(how));
	printf("lineage: derived from %s: %s\n", sfw_esc(par, epar, sizeof(epar)), sfw_esc(how, ehow, sizeof(ehow)));
	if (m->lineage.has_parent) {
		char ph[65];
		sfw_hex_encode(m->lineage.parent_manifest_sha256, 32, ph);
		printf("lineage: parent manifest sha256 %s, signed by key %s\n", ph, m->lineage.parent_key_id);
	}
}

static void add_lineage(cJSON *o, const struct sfw_manifest_lineage *l)
{
	cJSON *lo = cJSON_AddObjectToObject(o, "lineage"), *pa = cJSON_CreateObject();
	cJSON_AddStringToObject(lo, "derived_by", l->derived_by);
	cJSON_AddStringToObject(lo, "method", l->method);
	for (size_t i = 0; pa && i < l->nparams; i++)
		cJSON_AddStringToObject(pa, l->param_key[i], l->param_value[i]);
	cJSON_AddItemToObject(lo, "params", pa);
	if (l->has_parent) {
		char ph[65];
		sfw_hex_encode(l->parent_manifest_sha256, 32, ph);
		cJSON *po = cJSON_AddObjectToObject(lo, "parent");
		cJSON_AddStringToObject(po, "repo_id", l->parent_repo_id);
		cJSON_AddStringToObject(po, "revision", l->parent_revision);
		cJSON_AddStringToObject(po, "manifest_sha256", ph);
		cJSON_AddStringToObject(po, "key_id", l->parent_key_id);
	}
}

/* The --json report of a verification that got as far as the files. */
static cJSON *report_json(const char *dir, const char *mpath, const struct sfw_manifest *m,
			  const struct sfw_minisig_info *info, const char *kid, int local_key,
			  const struct sfw_verify_report *rep, enum sfw_status s, const struct sfw_err *err)
{
	char hex[65];
	sfw_hex_encode(m->manifest_sha256, 32, hex);
	cJSON *o = cJSON_CreateObject(), *sig = cJSON_CreateObject(), *files = cJSON_CreateArray(),
	      *extra = cJSON_CreateArray();
	if (!o || !sig || !files || !extra) {
		cJSON_Delete(o);
		cJSON_Delete(sig);
		cJSON_Delete(files);
		cJSON_Delete(extra);
		return NULL;
	}
	cJSON_AddStringToObject(o, "dir", dir);
	cJSON_AddStringToObject(o, "manifest", mpath);
	cJSON_AddStringToObject(o, "manifest_sha256", hex);
	cJSON_AddStringToObject(sig, "key_id", kid);
	cJSON_AddBoolToObject(sig, "prehashed", info->prehashed);
	cJSON_AddStringToObject(sig, "trusted_comment", info->trusted_comment);
	cJSON_AddBoolToObject(sig, "local_key", local_key);
	cJSON_AddItemToObject(o, "signature", sig);
	if (m->lineage.present)
		add_lineage(o, &m->lineage);
	cJSON_AddStringToObject(o, "repo_id", m->repo_id);
	cJSON_AddStringToObject(o, "revision", m->revision);
	cJSON_AddNumberToObject(o, "manifest_version", (double)m->manifest_version);
	cJSON_AddBoolToObject(o, "expired", (int64_t)time(NULL) >= m->expires);
	for (size_t i = 0; i < m->nfiles; i++) {
		cJSON *f = cJSON_CreateObject();
		if (!f)
			continue;
		cJSON_AddStringToObject(f, "path", m->files[i].path);
		cJSON_AddNumberToObject(f, "size", (double)m->files[i].size);
		cJSON_AddStringToObject(f, "status", status_word(rep->results[i]));
		cJSON_AddItemToArray(files, f);
	}
	cJSON_AddItemToObject(o, "files", files);
	for (size_t i = 0; i < rep->nextra; i++)
		cJSON_AddItemToArray(extra, cJSON_CreateString(rep->extra[i]));
	cJSON_AddItemToObject(o, "extra", extra);
	cJSON_AddNumberToObject(o, "bad", (double)rep->nbad);
	cJSON_AddBoolToObject(o, "ok", s == SFW_OK);
	if (s != SFW_OK)
		cJSON_AddStringToObject(o, "error", err->msg);
	cJSON_AddNumberToObject(o, "exit_code", sfw_exit_code(s));
	return o;
}

/* After the files were checked: a failure with --manifest drops the records
 * its bad files had under this same manifest; a success commits what was
 * verified (verify.h: the ratchet; with --manifest also the pair and every
 * file's state, sfw_verify_dir having recorded nothing then). */
static enum sfw_status settle(const struct args *a, const struct sfw_manifest *m, const struct sfw_buf *mb,
			      const struct sfw_buf *sb, const struct sfw_verify_report *rep, enum sfw_status s,
			      struct sfw_err *err)
{
	char esc[1100];
	int install = a->manifest && !a->no_state;
	if (s != SFW_OK) {
		struct sfw_err e3 = {0};
		if (install && sfw_state_forget(a->dir, m, rep, &e3) != SFW_OK)
			fprintf(stderr, "salafw: warning: %s\n", sfw_esc(e3.msg, esc, sizeof(esc)));
		return s;
	}
	struct sfw_state_file *sf = install ? sfw_calloc(m->nfiles ? m->nfiles : 1, sizeof(*sf)) : NULL;
	if (install && !sf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; sf && i < m->nfiles; i++)
		sf[i].path = m->files[i].path, sf[i].ok = 1, sf[i].id = rep->ids[i];
	struct sfw_verified v = {m, install ? mb->data : NULL, install ? sb->data : NULL, mb->len, sb->len, sf,
				 install ? m->nfiles : 0};
	s = sfw_verified_commit(a->dir, &v, &a->tp, err);
	sfw_free(sf);
	return s;
}

int cmd_verify(int argc, char **argv)
{
	struct args a;
	memset(&a, 0, sizeof(a));
	a.tp = sfw_trust_default_params();
	int rc = parse_args(argc, argv, &a);
	if (rc >= 0)
		return rc;
	const char *dir = a.dir;
	struct sfw_err err = {0};
	enum sfw_status s;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		s = sfw_fail(&err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
		return fail(a.json, dir, s, &err);
	}
	close(dfd);

	char *mpath = a.manifest ? sfw_strdup(a.manifest) : sfw_path_join(dir, ".salafw/manifest.json");
	size_t ml = mpath ? strlen(mpath) : 0;
	char *spath = mpath ? sfw_malloc(ml + 9) : NULL;
	if (!mpath || !spath) {
		sfw_free(mpath);
		return fail(a.json, dir, sfw_fail(&err, SFW_E_NOMEM, "out of memory"), &err);
	}
	snprintf(spath, ml + 9, "%s.minisig", mpath);
	struct sfw_buf mb = {0}, sb = {0};
	struct sfw_manifest m;
	memset(&m, 0, sizeof(m));
	struct sfw_minisig_info info;
	struct sfw_verify_report rep;
	memset(&rep, 0, sizeof(rep));
	cJSON *o = NULL;

	/* Signature first: the manifest bytes are only parsed once it verified. */
	if ((s = read_pair(&a, mpath, spath, &mb, &sb, &err)) != SFW_OK) {
		rc = fail(a.json, dir, s, &err);
		goto out;
	}
	/* no key given: the pinned one, and the user's own for a model they
	 * derived (sfw_userkey_trust below) */
	int user_at = -1;
	if (a.nkeys == 0 && cli_trusted_keys(NULL, a.keys, &a.nkeys, &user_at, &err) != SFW_OK)
		a.nkeys = 0;
	a.tp.keys = a.nkeys ? a.keys : NULL;
	a.tp.nkeys = a.nkeys;
	a.tp.allow_expired = 1; /* offline verify only warns (docs/fetch-verify.md §3.12-3) */
	/* Rollback matters when a manifest is taken in (get, or --manifest
	 * here); the folder's own copy was checked when it came, and another
	 * folder holding a newer version must not make it unverifiable. Equal
	 * versions with other bytes (equivocation) are still refused. */
	if (!a.manifest)
		a.tp.allow_downgrade = 1;
	char what[300], kid[17], esc[1100];
	snprintf(what, sizeof(what), "manifest '%s'", mpath);
	s = sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, what, &a.tp, &m, &info, &err);
	int local_key = s == SFW_OK && user_at >= 0 && memcmp(info.key_id, a.keys[user_at].key_id, 8) == 0;
	if (s == SFW_OK && local_key)
		s = sfw_userkey_trust(&m, what, &err);
	if (s != SFW_OK) {
		rc = fail(a.json, dir, s, &err);
		goto out;
	}
	sfw_pubkey_id_hex(info.key_id, kid);
	if (!a.json)
		print_signature(&m, &info, kid, local_key);

	struct sfw_verify_params vp = sfw_verify_default_params();
	vp.threads = a.threads;
	/* With --manifest the record is written only once that manifest is
	 * installed: a failure leaves the folder's state as it was. */
	vp.record_state = !a.no_state && !a.manifest;
	s = sfw_verify_dir(dir, &m, &vp, &rep, &err);
	if (s != SFW_OK && s != SFW_E_MISSING && s != SFW_E_SIZE && s != SFW_E_HASH && s != SFW_E_PATH) {
		rc = fail(a.json, dir, s, &err);
		goto out;
	}
	s = settle(&a, &m, &mb, &sb, &rep, s, &err);
	if (a.json) {
		if (!(o = report_json(dir, mpath, &m, &info, kid, local_key, &rep, s, &err))) {
			rc = fail(0, dir, sfw_fail(&err, SFW_E_NOMEM, "out of memory"), &err);
			goto out;
		}
		print_json(o);
	} else {
		uint64_t bytes = 0;
		for (size_t i = 0; i < m.nfiles; i++) {
			bytes += m.files[i].size;
			printf("%-15s %s\n", status_word(rep.results[i]), sfw_esc(m.files[i].path, esc, sizeof(esc)));
		}
		if (s == SFW_OK)
			printf("verified %zu files, %llu bytes: %s@%s manifest_version %llu\n", m.nfiles,
			       (unsigned long long)bytes, sfw_esc(m.repo_id, esc, sizeof(esc)), m.revision,
			       (unsigned long long)m.manifest_version);
	}
	/* names found on disk: anything a file system allows */
	for (size_t i = 0; i < rep.nextra; i++)
		fprintf(stderr, "salafw: warning: extra file not in the manifest: %s\n",
			sfw_esc(rep.extra[i], esc, sizeof(esc)));
	rc = cli_report(s, &err);
out:
	cJSON_Delete(o);
	sfw_verify_report_release(&rep);
	sfw_manifest_release(&m);
	sfw_buf_release(&mb);
	sfw_buf_release(&sb);
	sfw_free(mpath);
	sfw_free(spath);
	return rc;
}
