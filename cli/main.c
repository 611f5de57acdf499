/* salafw - get, verify, quantize and run MiniCPM-SALA. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* A subcommand missing from a partial build resolves to NULL. */
#pragma weak cmd_verify
#pragma weak cmd_manifest
#pragma weak cmd_sign
#pragma weak cmd_keygen
#pragma weak cmd_get
#pragma weak cmd_mkmodel
#pragma weak cmd_run
#pragma weak cmd_score
#pragma weak cmd_bench
#pragma weak cmd_quant
#pragma weak cmd_serve

struct command {
	const char *name;
	int (*fn)(int, char **);
	const char *summary;
};

static const struct command commands[] = {
	{"get", cmd_get, "download a model's signed files from ordered sources, resumably"},
	{"verify", cmd_verify, "check a model directory against its signed manifest"},
	{"manifest", cmd_manifest, "hash a directory into a sorted manifest (publishers)"},
	{"sign", cmd_sign, "sign a manifest with a minisign secret key (publishers)"},
	{"keygen", cmd_keygen, "make a minisign key pair (publishers)"},
	{"mkmodel", cmd_mkmodel, "write a random-weight SALA model directory (tests, benchmarks)"},
	{"quant", cmd_quant, "quantize a verified model to 8-bit weights (AWQ, compressed-tensors)"},
	{"run", cmd_run, "generate text with a verified model"},
	{"serve", cmd_serve, "serve a verified model over an OpenAI-compatible HTTP API"},
	{"score", cmd_score, "write logits and hidden states for given token ids (checks)"},
	{"bench", cmd_bench, "measure prefill and decode speed"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: salafw COMMAND [ARGS]   (salafw COMMAND --help for details)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].fn)
			fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nexit codes: 0 ok, 1 verification failed, 2 usage, 3 manifest or signature rejected,\n"
		   "            4 network / sources exhausted, 5 local I/O or other error\n");
}

/* Whatever a command printed must have reached stdout: a command never
 * exits 0 when its output was lost (a full disk, a closed pipe). */
static int finish(int rc)
{
	struct sfw_err err = {0};
	if (cli_stdout_flush(&err) != SFW_OK && rc == SFW_EXIT_OK) {
		fprintf(stderr, "salafw: %s\n", err.msg);
		return SFW_EXIT_IO;
	}
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return SFW_EXIT_USAGE;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return finish(SFW_EXIT_OK);
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
		printf("salafw %s\n", SFW_VERSION);
		return finish(SFW_EXIT_OK);
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[1], commands[i].name) != 0)
			continue;
		if (!commands[i].fn) {
			fprintf(stderr, "salafw: '%s' is not part of this build\n", argv[1]);
			return SFW_EXIT_USAGE;
		}
		return finish(commands[i].fn(argc - 1, argv + 1));
	}
	fprintf(stderr, "salafw: '%s' is not a salafw command (see 'salafw --help')\n", argv[1]);
	return SFW_EXIT_USAGE;
}
