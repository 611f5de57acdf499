/* userkey.c - the user's own signing key and the models they derive: the
 * key pair in the folder the program gave, the rule that limits its trust to
 * local derived manifests, and publishing a derived directory (manifest with
 * lineage, signature, verified state) so it runs verified (verify.h). */
#include "verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOCAL_NS "local/"

char *sfw_userkey_path(int secret)
{
	char *d = sfwi_key_dir();
	char *p = d ? sfw_path_join(d, secret ? "user.key" : "user.pub") : NULL;
	sfw_free(d);
	return p;
}

enum sfw_status sfw_userkey_load_pub(struct sfw_pubkey *out, struct sfw_err *err)
{
	char *p = sfw_userkey_path(0);
	if (!p)
		return sfw_fail(err, SFW_E_MISSING, "no user key: no folder for it was given");
	struct stat st;
	enum sfw_status s = stat(p, &st) != 0 && errno == ENOENT
				? sfw_fail(err, SFW_E_MISSING, "no user key '%s' yet", p)
				: sfw_pubkey_load(p, out, err);
	sfw_free(p);
	return s;
}

/* user.pub as user.key says it must be: written again from the secret key
 * (which carries its public half) when it is missing, unreadable or of
 * another key. */
static enum sfw_status pub_repair(const char *pp, const char *sp, const struct sfw_seckey *sk,
				  struct sfw_pubkey *pk, struct sfw_err *err)
{
	struct sfw_pubkey want, have;
	sfw_seckey_pubkey(sk, &want);
	struct sfw_err e = {0};
	if (sfw_pubkey_load(pp, &have, &e) == SFW_OK && memcmp(&have, &want, sizeof(want)) == 0) {
		*pk = want;
		return SFW_OK;
	}
	sfw_log(SFW_LOG_WARN, "'%s' does not hold the public half of '%s' (%s): writing it again from the secret key",
		pp, sp, e.msg[0] ? e.msg : "another key");
	enum sfw_status s = sfw_pubkey_write(pp, &want, err);
	if (s == SFW_OK)
		*pk = want;
	return s;
}

enum sfw_status sfw_userkey_ensure(struct sfw_seckey *sk, struct sfw_pubkey *pk, int *created,
				   struct sfw_err *err)
{
	*created = 0;
	char *d = sfwi_key_dir(), *sp = sfw_userkey_path(1), *pp = sfw_userkey_path(0);
	enum sfw_status s = SFW_OK;
	struct stat st;
	if (!d || !sp || !pp) {
		s = sfw_fail(err, SFW_E_IO, "no place for a user key: no folder for it was given (the CLI "
					    "takes XDG_CONFIG_HOME or HOME)");
		goto out;
	}
	if (stat(sp, &st) != 0) {
		if (errno != ENOENT) {
			s = sfw_fail(err, SFW_E_IO, "cannot stat '%s': %s", sp, strerror(errno));
			goto out;
		}
		if ((s = sfw_mkdirs(d, err)) != SFW_OK)
			goto out;
		if (chmod(d, 0700) != 0) {
			s = sfw_fail(err, SFW_E_IO, "cannot make '%s' private: %s", d, strerror(errno));
			goto out;
		}
		/* a lone user.pub (a kill between the pair's two renames) has
		 * no secret half to sign with: the new pair replaces it */
		if ((s = sfw_keygen(pp, sp, 1, err)) != SFW_OK)
			goto out;
		*created = 1;
	}
	if ((s = sfw_seckey_load(sp, sk, err)) == SFW_OK)
		s = pub_repair(pp, sp, sk, pk, err);
out:
	sfw_free(d);
	sfw_free(sp);
	sfw_free(pp);
	return s;
}

enum sfw_status sfw_userkey_trust(const struct sfw_manifest *m, const char *what, struct sfw_err *err)
{
	size_t n;
	const struct sfwi_pin *pins = sfwi_pins(&n);
	for (size_t i = 0; i < n; i++)
		if (strcmp(pins[i].repo_id, m->repo_id) == 0)
			return sfw_fail(
			    err, SFW_E_MANIFEST,
			    "%s claims the pinned publisher repo '%s' but is signed by your local key %s: "
			    "a local key is trusted only for models you derived (repo local/NAME)",
			    what, m->repo_id, m->publisher_key_id);
	if (strncmp(m->repo_id, LOCAL_NS, sizeof(LOCAL_NS) - 1) != 0 || !m->lineage.present)
		return sfw_fail(
		    err, SFW_E_MANIFEST,
		    "%s is for '%s' and is signed by your local key %s, which is trusted only for "
		    "derived models (repo local/NAME with a lineage)",
		    what, m->repo_id, m->publisher_key_id);
	return SFW_OK;
}

int sfw_pin_of_file(const char *path, const unsigned char sha256[32], struct sfw_pin_info *out)
{
	size_t n;
	const struct sfwi_pin *pins = sfwi_pins(&n);
	char hex[65];
	sfw_hex_encode(sha256, 32, hex);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < pins[i].nfiles; k++)
			if (strcmp(pins[i].files[k].path, path) == 0 &&
			    strcmp(pins[i].files[k].sha256_hex, hex) == 0) {
				out->repo_id = pins[i].repo_id;
				out->revision = pins[i].revision;
				return 1;
			}
	return 0;
}

void sfw_local_repo_id(const char *dir, char *out, size_t cap)
{
	char name[97];
	size_t len = strlen(dir);
	while (len > 1 && dir[len - 1] == '/')
		len--;
	size_t b = len;
	while (b > 0 && dir[b - 1] != '/')
		b--;
	size_t n = 0;
	for (size_t i = b; i < len && n < sizeof(name) - 1; i++) {
		char c = dir[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			 c == '_' || c == '-' || c == '.';
		c = ok ? c : '-';
		if (n > 0 && (c == '-' || c == '.') && (name[n - 1] == '-' || name[n - 1] == '.'))
			continue; /* no "--" or ".." */
		if (n == 0 && (c == '-' || c == '.'))
			continue;
		name[n++] = c;
	}
	while (n > 0 && (name[n - 1] == '-' || name[n - 1] == '.'))
		n--;
	name[n] = 0;
	snprintf(out, cap, "%s%s", LOCAL_NS, n ? name : "model");
}

static enum sfw_status record_verified(const char *dir, const char *mpath, struct sfw_err *err)
{
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(mpath, SFW_MANIFEST_MAX, &b, err);
	if (s != SFW_OK)
		return s;
	struct sfw_manifest m;
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", mpath);
	s = sfw_manifest_parse(b.data, b.len, what, &m, err);
	sfw_buf_release(&b);
	if (s != SFW_OK)
		return s;
	struct sfw_verify_params vp = sfw_verify_default_params();
	struct sfw_verify_report rep;
	memset(&rep, 0, sizeof(rep));
	vp.record_state = 1;
	s = sfw_verify_dir(dir, &m, &vp, &rep, err);
	sfw_verify_report_release(&rep);
	sfw_manifest_release(&m);
	return s;
}

enum sfw_status sfw_derived_publish(const char *dir, const char *lineage_json, const struct sfw_seckey *key,
				    struct sfw_err *err)
{
	char repo[128], rev[41], kid[17], hex[65];
	sfw_local_repo_id(dir, repo, sizeof(repo));
	unsigned char h[32];
	struct sfw_sha256 sh;
	if (sfw_sha256_init(&sh) != SFW_OK)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	sfw_sha256_update(&sh, lineage_json, strlen(lineage_json));
	sfw_sha256_final(&sh, h);
	sfw_sha256_release(&sh);
	sfw_hex_encode(h, 32, hex);
	memcpy(rev, hex, 40);
	rev[40] = 0;
	struct sfw_manifest_build_params bp = sfw_manifest_build_default_params();
	bp.repo_id = repo;
	bp.revision = rev;
	bp.lineage_json = lineage_json;
	bp.created = (int64_t)time(NULL);
	bp.expires =
	    bp.created + 10 * 366 * 86400ll;	    /* the user's own artifact: expiry is a fetch-time rule */
	bp.manifest_version = (uint64_t)bp.created; /* a rebuild supersedes the older manifest */
	if (key) {
		sfw_pubkey_id_hex(key->key_id, kid);
		bp.key_id = kid;
	}
	char *text = NULL, *sd = sfw_path_join(dir, ".salafw");
	char *mpath = sfw_path_join(dir, ".salafw/manifest.json"), *spath = NULL;
	size_t len = 0;
	enum sfw_status s = SFW_OK;
	if (!sd || !mpath || !(spath = sfw_malloc(strlen(mpath) + 9))) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	sprintf(spath, "%s.minisig", mpath);
	if ((s = sfw_manifest_build(dir, &bp, &text, &len, err)) != SFW_OK ||
	    (s = sfw_mkdirs(sd, err)) != SFW_OK)
		goto out;
	/* an older signature never stands next to a new manifest */
	if (unlink(spath) != 0 && errno != ENOENT) {
		s = sfw_fail(err, SFW_E_IO, "cannot remove '%s': %s", spath, strerror(errno));
		goto out;
	}
	if ((s = sfw_write_file_atomic(mpath, text, len, err)) != SFW_OK || !key)
		goto out;
	char tc[512];
	snprintf(tc, sizeof(tc), "salafw-manifest repo_id=%s revision=%s manifest_version=%llu", repo, rev,
		 (unsigned long long)bp.manifest_version);
	if ((s = sfw_sign_bytes(text, len, mpath, key, tc, err)) == SFW_OK)
		s = record_verified(dir, mpath, err);
out:
	sfw_free(text);
	sfw_free(sd);
	sfw_free(mpath);
	sfw_free(spath);
	return s;
}

/* The manifest is a derived one of a local repo (quant's), not a
 * publisher's: the user key never signs anything else. An empty key id
 * (quant without a key) is filled in for the parse only. */
static enum sfw_status check_derived(const char *mpath, struct sfw_err *err)
{
	struct sfw_buf b, pb;
	enum sfw_status s = sfw_read_file(mpath, SFW_MANIFEST_MAX, &b, err);
	if (s != SFW_OK)
		return s;
	sfw_buf_init(&pb, SFW_MANIFEST_MAX + 32);
	char *k = b.data ? strstr(b.data, "\"key_id\": \"\"") : NULL;
	if (k) {
		*k = 0;
		s = sfw_buf_printf(&pb, "%s\"key_id\": \"0000000000000000\"%s", b.data, k + 12);
	}
	struct sfw_manifest m;
	char what[300];
	snprintf(what, sizeof(what), "manifest '%s'", mpath);
	if (s == SFW_OK)
		s = sfw_manifest_parse(k ? pb.data : b.data, k ? pb.len : b.len, what, &m, err);
	else
		s = sfw_fail(err, s, "out of memory");
	if (s == SFW_OK) {
		if (!m.lineage.present || strncmp(m.repo_id, LOCAL_NS, sizeof(LOCAL_NS) - 1) != 0)
			s = sfw_fail(err, SFW_E_MANIFEST,
				     "%s is for '%s' without a lineage: not a model you derived, so your "
				     "local key does "
				     "not sign it",
				     what, m.repo_id);
		sfw_manifest_release(&m);
	}
	sfw_buf_release(&pb);
	sfw_buf_release(&b);
	return s;
}

enum sfw_status sfw_derived_sign(const char *dir, const struct sfw_seckey *key, struct sfw_err *err)
{
	char *mpath = sfw_path_join(dir, ".salafw/manifest.json");
	if (!mpath)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status s = check_derived(mpath, err);
	if (s == SFW_OK)
		s = sfw_manifest_sign(mpath, key, err);
	if (s == SFW_OK)
		s = record_verified(dir, mpath, err);
	sfw_free(mpath);
	return s;
}
