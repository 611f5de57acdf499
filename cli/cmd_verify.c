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
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEYS 8

static const struct cli_opt opts[] = {
    {"manifest", 'm', "FILE", "signed manifest (default DIR/.salafw/manifest.json; FILE.minisig next to it)"},
    {"pubkey", 'P', "KEY|FILE", "trust this minisign public key (a file, base64, or an installed key's name) instead of the pinned one; repeatable"},
    {"pubkey-string", 0, "KEY", "the same, base64 only (older spelling)"},
    {"json", 0, NULL, "print a machine-readable report on standard output"},
    {"threads", 't', "N", "files hashed in parallel (default: all cores)"},
    {"repo", 0, "ORG/NAME", "require the manifest to be for this repo"},
    {"revision", 0, "HEX40", "require the manifest to be for this revision"},
    {"require-prehashed", 0, NULL, "refuse legacy (non-prehashed) signatures"},
    {"allow-downgrade", 0, NULL, "accept a manifest_version older than one seen before"},
    {"no-state", 0, NULL, "do not write DIR/.salafw/state.json"},
    {0},
};

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
		return "hash mismatch";
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

int cmd_verify(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw verify", *arg, *manifest = NULL;
	struct sfw_pubkey keys[MAX_KEYS];
	size_t nkeys = 0;
	int json = 0, no_state = 0, k;
	unsigned long long threads = 0;
	struct sfw_trust_params tp = sfw_trust_default_params();
	struct sfw_err err = {0};
	enum sfw_status s;
	cli_init(&cp, cmd, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, cmd,
				  "DIR [--manifest FILE] [-P KEY|FILE] [--json] [--threads N]",
				  opts);
			printf(
			    "\nexit codes: 0 all files verified, 1 a file is missing or differs, or DIR has no\n"
			    "            signed manifest, 2 usage, 3 manifest or signature rejected (or an unsafe\n"
			    "            path), 5 local I/O (a missing --manifest FILE)\n");
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		switch (k) {
		case 0:
			manifest = arg;
			break;
		case 1:
		case 2:
			if (nkeys == MAX_KEYS)
				return cli_usage_error(cmd, "at most %d trusted keys", MAX_KEYS);
			if (k == 1) {
				int rc = cli_load_pubkey(cmd, arg, &keys[nkeys]);
				if (rc)
					return rc;
			} else if ((s = sfw_pubkey_parse(arg, strlen(arg), "public key given with --pubkey-string",
							 &keys[nkeys], &err)) != SFW_OK) {
				return cli_report(s, &err);
			}
			nkeys++;
			break;
		case 3:
			json = 1;
			break;
		case 4:
			if (!cli_parse_u64(cmd, "--threads", arg, &threads))
				return SFW_EXIT_USAGE;
			if (threads > 256)
				threads = 256;
			break;
		case 5:
			if (!cli_check_repo_id(cmd, "--repo ", arg))
				return SFW_EXIT_USAGE;
			tp.repo_id = arg;
			break;
		case 6:
			tp.revision = arg;
			break;
		case 7:
			tp.require_prehashed = 1;
			break;
		case 8:
			tp.allow_downgrade = 1;
			break;
		case 9:
			no_state = 1;
			break;
		}
	}
	if (cp.npos != 1)
		return cli_usage_error(cmd, "expected one DIR");
	const char *dir = cp.pos[0];

	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		s = sfw_fail(&err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
		return fail(json, dir, s, &err);
	}
	close(dfd);

	char *mpath = manifest ? sfw_strdup(manifest) : sfw_path_join(dir, ".salafw/manifest.json");
	size_t ml = mpath ? strlen(mpath) : 0;
	char *spath = mpath ? sfw_malloc(ml + 9) : NULL;
	if (!mpath || !spath) {
		sfw_free(mpath);
		return fail(json, dir, sfw_fail(&err, SFW_E_NOMEM, "out of memory"), &err);
	}
	snprintf(spath, ml + 9, "%s.minisig", mpath);
	struct sfw_buf mb = {0}, sb = {0};
	struct sfw_manifest m;
	memset(&m, 0, sizeof(m));
	struct sfw_minisig_info info;
	struct sfw_verify_report rep;
	memset(&rep, 0, sizeof(rep));
	cJSON *o = NULL;
	int rc;

	/* Signature first: the manifest bytes are only parsed once it verified.
	 * The folder's own pair as installed (never through a symlink, never
	 * half of an interrupted install); --manifest FILE as named. */
	int no_manifest;
	if (manifest) {
		s = sfw_read_file(mpath, SFW_MANIFEST_MAX, &mb, &err);
		no_manifest = s == SFW_E_MISSING;
		if (s == SFW_OK)
			s = sfw_read_file(spath, SFW_MINISIG_MAX, &sb, &err);
	} else {
		s = sfw_state_read_manifest(dir, &mb, &sb, &err);
		struct stat mst;
		no_manifest = s == SFW_E_MISSING && lstat(mpath, &mst) != 0 && errno == ENOENT;
	}
	if (s != SFW_OK) {
		/* DIR without a manifest: not verified (exit 1, as run says);
		 * a --manifest FILE that is not there: a missing input (exit 5);
		 * no signature or an oversized file: rejected (exit 3), except a
		 * model the user derived (not verified, exit 1, with the command
		 * that signs it, as run says); a local read error stays one (exit 5) */
		if (no_manifest && !manifest && cli_derived_unsigned(dir)) {
			s = sfw_fail(&err, SFW_E_UNVERIFIED,
				     "'%s' has no signed manifest in .salafw/ (a model you derived; fix: "
				     "salafw sign --user %s)",
				     dir, dir);
		} else if (no_manifest && !manifest) {
			s = sfw_fail(&err, SFW_E_UNVERIFIED,
				     "'%s' has no signed manifest in .salafw/ (run 'salafw get', or pass --manifest FILE)",
				     dir);
		} else if (s == SFW_E_MISSING && !manifest && cli_derived_unsigned(dir)) {
			/* as run says it: not verified (exit 1), and the command that signs it */
			s = sfw_fail(&err, SFW_E_UNVERIFIED,
				     "the manifest of the derived model '%s' is not signed (fix: salafw sign "
				     "--user %s)",
				     dir, dir);
		} else if (no_manifest) {
			s = SFW_E_IO;
			err.code = s;
		} else if (s == SFW_E_MISSING || s == SFW_E_RANGE) {
			s = SFW_E_MANIFEST;
			err.code = s;
		}
		rc = fail(json, dir, s, &err);
		goto out;
	}
	/* no key given: the pinned one, and the user's own for a model they
	 * derived (sfw_userkey_trust below) */
	int user_at = -1;
	if (nkeys == 0 && cli_trusted_keys(NULL, keys, &nkeys, &user_at, &err) != SFW_OK)
		nkeys = 0;
	tp.keys = nkeys ? keys : NULL;
	tp.nkeys = nkeys;
	tp.allow_expired = 1; /* offline verify only warns (docs/fetch-verify.md §3.12-3) */
	/* Rollback matters when a manifest is taken in (get, or --manifest
	 * here); the folder's own copy was checked when it came, and another
	 * folder holding a newer version must not make it unverifiable. Equal
	 * versions with other bytes (equivocation) are still refused. */
	if (!manifest)
		tp.allow_downgrade = 1;
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", mpath);
	s = sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, what, &tp, &m, &info, &err);
	if (s != SFW_OK) {
		rc = fail(json, dir, s, &err);
		goto out;
	}
	char kid[17];
	sfw_pubkey_id_hex(info.key_id, kid);
	int local_key = user_at >= 0 && memcmp(info.key_id, keys[user_at].key_id, 8) == 0;
	if (local_key && (s = sfw_userkey_trust(&m, what, &err)) != SFW_OK) {
		rc = fail(json, dir, s, &err);
		goto out;
	}
	int expired = (int64_t)time(NULL) >= m.expires;
	char esc[1100], par[200] = "", how[600] = "";
	if (m.lineage.present) {
		cli_parent_text(&m.lineage, par, sizeof(par));
		cli_lineage_text(&m.lineage, how, sizeof(how));
	}
	if (!json) {
		char epar[800], ehow[2400];
		printf("signature ok: key %s%s, %s, trusted comment: %s\n", kid,
		       local_key ? " (your local key)" : "", info.prehashed ? "prehashed" : "legacy",
		       sfw_esc(info.trusted_comment, esc, sizeof(esc)));
		if (m.lineage.present) {
			printf("lineage: derived from %s: %s\n", sfw_esc(par, epar, sizeof(epar)),
			       sfw_esc(how, ehow, sizeof(ehow)));
			if (m.lineage.has_parent) {
				char ph[65];
				sfw_hex_encode(m.lineage.parent_manifest_sha256, 32, ph);
				printf("lineage: parent manifest sha256 %s, signed by key %s\n", ph,
				       m.lineage.parent_key_id);
			}
		}
	}

	struct sfw_verify_params vp = sfw_verify_default_params();
	vp.threads = (int)threads;
	/* With --manifest the record is written only once that manifest is
	 * installed: a failure leaves the folder's state as it was. */
	vp.record_state = !no_state && !manifest;
	s = sfw_verify_dir(dir, &m, &vp, &rep, &err);
	if (s != SFW_OK && s != SFW_E_MISSING && s != SFW_E_SIZE && s != SFW_E_HASH && s != SFW_E_PATH) {
		rc = fail(json, dir, s, &err);
		goto out;
	}
	if (s != SFW_OK && manifest && !no_state) {
		/* bad files lose a record made for this same manifest */
		struct sfw_err e3 = {0};
		if (sfw_state_forget(dir, &m, &rep, &e3) != SFW_OK)
			fprintf(stderr, "salafw: warning: %s\n", sfw_esc(e3.msg, esc, sizeof(esc)));
	}
	if (s == SFW_OK) {
		struct sfw_err e2 = {0};
		enum sfw_status s2 = sfw_manifest_ratchet_commit(&m, &tp, &e2);
		if (s2 == SFW_OK && manifest && !no_state)
			s2 = sfw_state_install_manifest(dir, mb.data, mb.len, sb.data, sb.len, &e2);
		if (s2 == SFW_OK && manifest && !no_state) {
			struct sfw_state_file *sf = sfw_calloc(m.nfiles ? m.nfiles : 1, sizeof(*sf));
			if (!sf)
				s2 = sfw_fail(&e2, SFW_E_NOMEM, "out of memory");
			for (size_t i = 0; sf && i < m.nfiles; i++)
				sf[i].path = m.files[i].path, sf[i].ok = 1, sf[i].id = rep.ids[i];
			if (sf)
				s2 = sfw_state_record(dir, &m, sf, m.nfiles, &e2);
			sfw_free(sf);
		}
		if (s2 != SFW_OK) {
			s = s2;
			err = e2;
		}
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < m.nfiles; i++)
		bytes += m.files[i].size;
	if (json) {
		char hex[65];
		sfw_hex_encode(m.manifest_sha256, 32, hex);
		o = cJSON_CreateObject();
		cJSON *sig = cJSON_CreateObject(), *files = cJSON_CreateArray(), *extra = cJSON_CreateArray();
		if (!o || !sig || !files || !extra) {
			cJSON_Delete(sig);
			cJSON_Delete(files);
			cJSON_Delete(extra);
			rc = fail(0, dir, sfw_fail(&err, SFW_E_NOMEM, "out of memory"), &err);
			goto out;
		}
		cJSON_AddStringToObject(o, "dir", dir);
		cJSON_AddStringToObject(o, "manifest", mpath);
		cJSON_AddStringToObject(o, "manifest_sha256", hex);
		cJSON_AddStringToObject(sig, "key_id", kid);
		cJSON_AddBoolToObject(sig, "prehashed", info.prehashed);
		cJSON_AddStringToObject(sig, "trusted_comment", info.trusted_comment);
		cJSON_AddBoolToObject(sig, "local_key", local_key);
		cJSON_AddItemToObject(o, "signature", sig);
		if (m.lineage.present) {
			cJSON *lo = cJSON_AddObjectToObject(o, "lineage"), *pa = cJSON_CreateObject();
			cJSON_AddStringToObject(lo, "derived_by", m.lineage.derived_by);
			cJSON_AddStringToObject(lo, "method", m.lineage.method);
			for (size_t i = 0; pa && i < m.lineage.nparams; i++)
				cJSON_AddStringToObject(pa, m.lineage.param_key[i], m.lineage.param_value[i]);
			cJSON_AddItemToObject(lo, "params", pa);
			if (m.lineage.has_parent) {
				char ph[65];
				sfw_hex_encode(m.lineage.parent_manifest_sha256, 32, ph);
				cJSON *po = cJSON_AddObjectToObject(lo, "parent");
				cJSON_AddStringToObject(po, "repo_id", m.lineage.parent_repo_id);
				cJSON_AddStringToObject(po, "revision", m.lineage.parent_revision);
				cJSON_AddStringToObject(po, "manifest_sha256", ph);
				cJSON_AddStringToObject(po, "key_id", m.lineage.parent_key_id);
			}
		}
		cJSON_AddStringToObject(o, "repo_id", m.repo_id);
		cJSON_AddStringToObject(o, "revision", m.revision);
		cJSON_AddNumberToObject(o, "manifest_version", (double)m.manifest_version);
		cJSON_AddBoolToObject(o, "expired", expired);
		for (size_t i = 0; i < m.nfiles; i++) {
			cJSON *f = cJSON_CreateObject();
			if (!f)
				continue;
			cJSON_AddStringToObject(f, "path", m.files[i].path);
			cJSON_AddNumberToObject(f, "size", (double)m.files[i].size);
			cJSON_AddStringToObject(f, "status", status_word(rep.results[i]));
			cJSON_AddItemToArray(files, f);
		}
		cJSON_AddItemToObject(o, "files", files);
		for (size_t i = 0; i < rep.nextra; i++)
			cJSON_AddItemToArray(extra, cJSON_CreateString(rep.extra[i]));
		cJSON_AddItemToObject(o, "extra", extra);
		cJSON_AddNumberToObject(o, "bad", (double)rep.nbad);
		cJSON_AddBoolToObject(o, "ok", s == SFW_OK);
		if (s != SFW_OK)
			cJSON_AddStringToObject(o, "error", err.msg);
		cJSON_AddNumberToObject(o, "exit_code", sfw_exit_code(s));
		print_json(o);
	} else {
		for (size_t i = 0; i < m.nfiles; i++)
			printf("%-14s %s\n", status_word(rep.results[i]), sfw_esc(m.files[i].path, esc, sizeof(esc)));
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
