/* salafw keygen - an unencrypted minisign-format key pair (publishers, tests). */
#include "cli.h"
#include "log.h"
#include "verify/verify.h"

#include <stdio.h>

static const struct cli_opt opts[] = {
    {"pubkey-out", 0, "FILE", "public key file to write (default minisign.pub)"},
    {"seckey", 's', "FILE", "secret key file to write, mode 0600 (default minisign.key)"},
    {"force", 0, NULL, "overwrite existing key files"},
    {0},
};

int cmd_keygen(int argc, char **argv)
{
	struct cli_parser cp;
	const char *cmd = "salafw keygen", *arg;
	const char *pub = "minisign.pub", *sec = "minisign.key";
	int force = 0, k;
	cli_init(&cp, cmd, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, cmd, "[--pubkey-out PUBKEY] [-s SECKEY] [--force]", opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		if (k == 0)
			pub = arg;
		else if (k == 1)
			sec = arg;
		else
			force = 1;
	}
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
