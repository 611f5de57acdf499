/* salafw keygen - an unencrypted minisign-format key pair (publishers, tests). */
#include "cli.h"
#include "log.h"
#include "verify/verify.h"

#include <stddef.h>
#include <stdio.h>

struct keygen_args {
	const char *pub, *sec;
	int force;
};

#define OFF(f) offsetof(struct keygen_args, f)
static const struct cli_arg args[] = {
    {{"pubkey-out", 0, "FILE", "public key file to write (default minisign.pub)"}, CLI_K_STR, OFF(pub), 0, 0, NULL, NULL},
    {{"seckey", 's', "FILE", "secret key file to write, mode 0600 (default minisign.key)"},
     CLI_K_STR, OFF(sec), 0, 0, NULL, NULL},
    {{"force", 0, NULL, "overwrite existing key files"}, CLI_K_FLAG, OFF(force), 0, 0, NULL, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

int cmd_keygen(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw keygen";
	struct keygen_args a = {"minisign.pub", "minisign.key", 0};
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, "[--pubkey-out PUBKEY] [-s SECKEY] [--force]", args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	const char *pub = a.pub, *sec = a.sec;
	int force = a.force;
	if (cp.npos)
		return cli_usage_error(cmd, "unexpected argument '%s'", cp.pos[0]);
	struct sfw_err err = {0};
	enum sfw_status s = sfw_keygen(pub, sec, force, &err);
	if (s != SFW_OK)
		return cli_report(s, &err);
	struct sfw_pubkey pk;
	if ((s = sfw_pubkey_load(pub, &pk, &err)) != SFW_OK)
		return cli_report(s, &err);
	char id[17];
	sfw_pubkey_id_hex(pk.key_id, id);
	char ep[1024], es[1024]; /* paths printed escaped */
	printf("key id %s\npublic key  %s\nsecret key  %s (unencrypted: keep it private)\n", id,
	       sfw_esc(pub, ep, sizeof(ep)), sfw_esc(sec, es, sizeof(es)));
	return SFW_EXIT_OK;
}
