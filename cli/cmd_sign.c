/* salafw sign - sign a manifest (or any file) with an unencrypted minisign
 * secret key; writes FILE.minisig, prehashed. */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"
#include "formats/safetensors.h"
#include "verify/verify.h"

#include <sys/stat.h>

#include <sodium.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

struct sign_args {
	const char *seckey, *comment;
	int raw, user;
};

#define OFF(f) offsetof(struct sign_args, f)
static const struct cli_arg args[] = {
    {{"seckey", 's', "FILE", "unencrypted minisign secret key (salafw keygen, minisign -G -W)"},
     CLI_K_STR, OFF(seckey), 0, 0, NULL, NULL},
    {{"trusted-comment", 0, "TEXT", "sign FILE as a plain file with this trusted comment"},
     CLI_K_STR, OFF(comment), 0, 0, NULL, NULL},
    {{"raw", 0, NULL, "FILE is not a manifest: minisign's default trusted comment"}, CLI_K_FLAG, OFF(raw), 0, 0, NULL, NULL},
    {{"user", 0, NULL, "sign the model directory you derived (salafw quant) with your local key, made on first use"},
     CLI_K_FLAG, OFF(user), 0, 0, NULL, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

/* salafw sign --user DIR: DIR's derived manifest (written by quant), or
 * for a salafw quant output without one a fresh manifest whose lineage is
 * what its shards say, signed with the user's key; DIR then runs verified. */
static int sign_user(const char *cmd, const char *dir)
{
	struct sfw_err err = {0};
	struct sfw_seckey sk;
	struct sfw_pubkey pk;
	int created = 0;
	char *mp = sfw_path_join(dir, ".salafw/manifest.json"), *kp = sfw_userkey_path(1);
	struct stat st;
	enum sfw_status s = mp ? SFW_OK : SFW_E_NOMEM;
	int have = mp && stat(mp, &st) == 0;
	char lj[512];
	if (s == SFW_OK && !have) {
		/* only what salafw quant wrote: its shards name the method */
		char *ip = sfw_path_join(dir, "model.safetensors.index.json");
		struct sfw_buf ib;
		sfw_buf_init(&ib, 64u << 20);
		const char *method = NULL, *group = NULL;
		struct sfw_st_file *f = NULL;
		char first[300] = "";
		if (ip && sfw_read_file(ip, 64u << 20, &ib, &err) == SFW_OK && ib.data) {
			const char *q = strstr(ib.data, "\"model-00001-of-");
			if (q && strlen(q) > 40 && sscanf(q + 1, "%250[^\"]", first) == 1 &&
			    !strchr(first, '/')) {
				char *fp = sfw_path_join(dir, first);
				if (fp && sfw_st_open(fp, &f, &err) == SFW_OK &&
				    sfw_st_metadata(f, "salafw.format")) {
					method = sfw_st_metadata(f, "quant.method");
					group = sfw_st_metadata(f, "quant.group_size");
				}
				sfw_free(fp);
			}
		}
		if (!method || !group || strspn(method, "abcdefghijklmnopqrstuvwxyz") != strlen(method) ||
		    !*method || strspn(group, "0123456789channel") != strlen(group) || !*group ||
		    strlen(method) > 16 || strlen(group) > 16) {
			s = sfw_fail(
			    &err, SFW_E_UNVERIFIED,
			    "'%s' has no manifest and is not a model salafw quant wrote: your local key "
			    "signs only "
			    "what you derived (fetch a publisher's model with 'salafw get ORG/NAME -d %s')",
			    dir, dir);
		} else {
			snprintf(
			    lj, sizeof(lj),
			    "{\"derived_by\": \"salafw/%s\", \"method\": \"%s\", \"params\": {\"format\": "
			    "\"pack-quantized int8\", \"group_size\": \"%s\", \"signed_later\": \"1\"}}",
			    SFW_VERSION, method, group);
		}
		sfw_st_close(f);
		sfw_buf_release(&ib);
		sfw_free(ip);
	}
	if (s == SFW_OK)
		s = sfw_userkey_ensure(&sk, &pk, &created, &err);
	if (s == SFW_OK)
		s = have ? sfw_derived_sign(dir, &sk, &err) : sfw_derived_publish(dir, lj, &sk, &err);
	sodium_memzero(&sk, sizeof(sk));
	char ed[1024], ek[1024]; /* paths printed escaped */
	const char *ud = sfw_esc(dir, ed, sizeof(ed));
	if (s == SFW_OK) {
		char id[17];
		sfw_pubkey_id_hex(pk.key_id, id);
		if (created)
			printf("created your local signing key %s in '%s' (.pub beside it)\n", id,
			       kp ? sfw_esc(kp, ek, sizeof(ek)) : "?");
		printf("signed '%s' with your local key %s; run it: salafw run %s\n", ud, id, ud);
	}
	sfw_free(mp);
	sfw_free(kp);
	if (s == SFW_E_MANIFEST && have)
		fprintf(stderr, "%s: '%s/.salafw/manifest.json' is not a manifest salafw quant wrote\n", cmd,
			ud);
	return s == SFW_OK ? SFW_EXIT_OK : cli_report(s, &err);
}

int cmd_sign(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw sign";
	struct sign_args a = {0};
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, "-s SECKEY FILE | --user DIR", args);
		printf("\nA manifest gets the trusted comment\n"
		       "  salafw-manifest repo_id=<id> revision=<sha> manifest_version=<n>\n"
		       "and an empty publisher.key_id is filled in with the signing key's id.\n");
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	const char *seckey = a.seckey, *comment = a.comment;
	int raw = a.raw, user = a.user;
	if (user) {
		if (seckey || comment || raw)
			return cli_usage_error(cmd, "--user signs with your local key: no -s, -t or --raw");
		if (cp.npos != 1)
			return cli_usage_error(cmd, "--user takes exactly one model DIR");
		return sign_user(cmd, cp.pos[0]);
	}
	if (!seckey)
		return cli_usage_error(cmd, "a secret key is required (-s FILE)");
	if (cp.npos != 1)
		return cli_usage_error(cmd, "expected exactly one FILE to sign");
	const char *file = cp.pos[0];
	struct sfw_err err = {0};
	struct sfw_seckey key;
	enum sfw_status s = sfw_seckey_load(seckey, &key, &err);
	if (s != SFW_OK)
		return cli_report(s, &err);
	if (comment || raw) {
		char def[512];
		if (!comment) {
			const char *base = strrchr(file, '/');
			snprintf(def, sizeof(def), "timestamp:%lld\tfile:%s\thashed", (long long)time(NULL),
				 base ? base + 1 : file);
			comment = def;
		}
		s = sfw_sign_file(file, &key, comment, &err);
	} else {
		s = sfw_manifest_sign(file, &key, &err);
	}
	sodium_memzero(&key, sizeof(key));
	if (s != SFW_OK)
		return cli_report(s, &err);
	char ef[1024];
	printf("signed '%s' -> '%s.minisig'\n", sfw_esc(file, ef, sizeof(ef)), ef);
	return SFW_EXIT_OK;
}
