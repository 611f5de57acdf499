/* salafw - get, verify, quantize and run MiniCPM-SALA. */
#include "cli.h"
#include "verify/verify.h"

#include <stdio.h>
#include <stdlib.h>
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
	fprintf(f, "usage: salafw COMMAND [ARGS]   (salafw help COMMAND, or salafw COMMAND --help, for details)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].fn)
			fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nexit codes: 0 ok, 1 verification failed or not verified, 2 usage, 3 manifest or signature\n"
		   "            rejected, 4 network / not on the endpoint / sources exhausted, 5 local I/O\n"
		   "            (missing input, existing output, disk full), 130/143 interrupted (SIGINT/SIGTERM)\n");
}

/* The exit-code table and the environment, shared by --man. */
static const char man_tail[] =
	".SH \"EXIT STATUS\"\n"
	".TP\n0\nok\n"
	".TP\n1\nverification failed: a size or sha256 mismatch, a missing model file, a directory with no "
	"signed manifest or no longer verified\n"
	".TP\n2\nusage error (unknown option, bad value, malformed repository id)\n"
	".TP\n3\nmanifest or signature rejected (signature, key id, schema, binding, pin, expiry, rollback, "
	"equivocation, unsafe path)\n"
	".TP\n4\nnetwork: a repository not on the endpoint (HTTP 404), every source failed\n"
	".TP\n5\nlocal: a missing input file, an existing output (without \\-\\-force), disk full, a lock "
	"held by another process, other I/O\n"
	".TP\n130, 143\ninterrupted by SIGINT or SIGTERM: temporary files are removed, partial downloads "
	"kept; the process ends by the signal\n"
	".SH ENVIRONMENT\n"
	".TP\nSALAFW_ENDPOINT\nmanifest service for \\fBget\\fR (\\-\\-endpoint)\n"
	".TP\nHF_ENDPOINT\nendpoint of the manifest's hf sources (default: as the manifest lists them)\n"
	".TP\nHF_TOKEN\nsent as \\fIAuthorization: Bearer\\fR to the manifest's hf sources only, never to "
	"http sources or \\-\\-mirror ones; never printed\n"
	".TP\nSALAFW_STATE_DIR\nrollback state (default ~/.local/state/salafw)\n"
	".TP\nSALAFW_KEYS_DIR\nwhere \\-\\-pubkey NAME looks for NAME.pub\n"
	".SH FILES\n"
	".TP\nPREFIX/share/salafw/manifests/\npinned keys (freeweights.pub) and release pins\n"
	".TP\nDIR/.salafw/\nmanifest.json, manifest.json.minisig, state.json, partial/\n";

static int man_page(void)
{
	printf(".TH SALAFW 1 \"\" \"salafw %s\" \"User Commands\"\n"
	       ".SH NAME\nsalafw \\- get, verify, quantize and run MiniCPM\\-SALA\n"
	       ".SH SYNOPSIS\n.B salafw\n\\fICOMMAND\\fR [\\fIOPTIONS\\fR]\n"
	       ".SH DESCRIPTION\n",
	       SFW_VERSION);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].fn)
			printf(".TP\n\\fB%s\\fR\n%s\n", commands[i].name, commands[i].summary);
	cli_help_roff = 1;
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (!commands[i].fn)
			continue;
		char name[32], help[] = "--help";
		snprintf(name, sizeof(name), "%s", commands[i].name);
		char *av[] = {name, help, NULL};
		fflush(stdout);
		commands[i].fn(2, av);
	}
	cli_help_roff = 0;
	fputs(man_tail, stdout);
	return SFW_EXIT_OK;
}

/* Whatever a command printed must have reached stdout: a command never
 * exits 0 when its output was lost (a full disk, a closed pipe). */
static int finish(int rc)
{
	struct sfw_err err = {0};
	cli_interrupt_finish(); /* a caught signal ends the process by it */
	if (cli_stdout_flush(&err) != SFW_OK && rc == SFW_EXIT_OK) {
		fprintf(stderr, "salafw: %s\n", err.msg);
		return SFW_EXIT_IO;
	}
	return rc;
}

/* verify/ reads no environment: its per-user folders come from here. The
 * rollback state: $SALAFW_STATE_DIR, else $XDG_STATE_HOME/salafw, else
 * ~/.local/state/salafw; the user's key pair: $XDG_CONFIG_HOME/salafw, else
 * ~/.config/salafw (XDG values must be absolute paths, as the spec says). */
static void set_verify_dirs(void)
{
	char state[4096] = "", keys[4096] = "";
	const char *h = getenv("HOME"), *e = getenv("SALAFW_STATE_DIR"), *x = getenv("XDG_STATE_HOME");
	if (e && *e)
		snprintf(state, sizeof(state), "%s", e);
	else if (x && *x == '/')
		snprintf(state, sizeof(state), "%s/salafw", x);
	else if (h && *h)
		snprintf(state, sizeof(state), "%s/.local/state/salafw", h);
	if ((x = getenv("XDG_CONFIG_HOME")) && *x == '/')
		snprintf(keys, sizeof(keys), "%s/salafw", x);
	else if (h && *h)
		snprintf(keys, sizeof(keys), "%s/.config/salafw", h);
	sfw_verify_set_dirs(state, keys);
}

static const struct command *find(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(name, commands[i].name) == 0)
			return &commands[i];
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return SFW_EXIT_USAGE;
	}
	if (strcmp(argv[1], "help") == 0 && argc > 2) {
		const struct command *c = find(argv[2]);
		if (!c || !c->fn) {
			fprintf(stderr, "salafw: '%s' is not a salafw command (see 'salafw --help')\n", argv[2]);
			return SFW_EXIT_USAGE;
		}
		char help[] = "--help";
		char *av[] = {argv[2], help, NULL};
		return finish(c->fn(2, av));
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return finish(SFW_EXIT_OK);
	}
	if (strcmp(argv[1], "--man") == 0)
		return finish(man_page());
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
		printf("salafw %s\npinned keys: %s\n", SFW_VERSION, cli_keys_dir());
		return finish(SFW_EXIT_OK);
	}
	const struct command *c = find(argv[1]);
	if (c) {
		if (!c->fn) {
			fprintf(stderr, "salafw: '%s' is not part of this build\n", argv[1]);
			return SFW_EXIT_USAGE;
		}
		cli_interrupt_install();
		set_verify_dirs();
		return finish(c->fn(argc - 1, argv + 1));
	}
	fprintf(stderr, "salafw: '%s' is not a salafw command (see 'salafw --help')\n", argv[1]);
	return SFW_EXIT_USAGE;
}
