/* salafw sign - sign a manifest (or any file) with an unencrypted minisign
 * secret key; writes FILE.minisig, prehashed. */
#include "cli.h"
#include "verify/verify.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const struct cli_opt opts[] = {
    {"seckey", 's', "FILE", "unencrypted minisign secret key (salafw keygen, minisign -G -W)"},
    {"trusted-comment", 0, "TEXT", "sign FILE as a plain file with this trusted comment"},
    {"raw", 0, NULL, "FILE is not a manifest: minisign's default trusted comment"},
    {0},
};

int cmd_sign(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw sign", *arg, *seckey = NULL, *comment = NULL;
	int raw = 0, k;
	cli_init(&cp, cmd, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, cmd, "-s SECKEY FILE", opts);
			printf("\nA manifest gets the trusted comment\n"
			       "  salafw-manifest repo_id=<id> revision=<sha> manifest_version=<n>\n"
			       "and an empty publisher.key_id is filled in with the signing key's id.\n");
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		if (k == 0)
			seckey = arg;
		else if (k == 1)
			comment = arg;
		else
			raw = 1;
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
	printf("signed '%s' -> '%s.minisig'\n", file, file);
	return SFW_EXIT_OK;
}
