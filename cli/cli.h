/* cli.h - the salafw command line: the only code that prints usage and exits.
 *
 * Each subcommand lives in cli/cmd_<name>.c, owns one option table (the single
 * place its flags are documented; --help is generated from it), turns argv
 * into a params struct, makes one library call and returns an exit code
 * (enum sfw_exit in core/sfw.h). */
#ifndef SFW_CLI_H
#define SFW_CLI_H

#include "sfw.h"

#include <stdint.h>
#include <stdio.h>

struct cli_opt {
	const char *name;   /* long name without "--" */
	char short_name;    /* 0 if none */
	const char *arg;    /* argument name shown in help, NULL for a flag */
	const char *help;
};

#define CLI_MAX_POS 64

struct cli_parser {
	int argc;
	char **argv;
	int i;
	const struct cli_opt *opts;
	const char *cmd;  /* "salafw verify" for messages */
	char *pos[CLI_MAX_POS]; /* positional arguments, in order */
	int npos;
	int only_pos;     /* after "--" */
};

#define CLI_DONE (-1)
#define CLI_ERROR (-2)
#define CLI_HELP (-3)

/* argv[0] is the subcommand name. opts ends with a {0} entry. */
void cli_init(struct cli_parser *p, const char *cmd, int argc, char **argv, const struct cli_opt *opts);
/* Returns the index of the next option in opts (arg set when it takes one),
 * CLI_DONE at the end, CLI_HELP for -h/--help, or CLI_ERROR (message printed). */
int cli_next(struct cli_parser *p, const char **arg);
void cli_usage(FILE *f, const char *cmd, const char *synopsis, const struct cli_opt *opts);

/* "salafw: <message>" on stderr; returns the exit code for status. */
int cli_report(enum sfw_status st, const struct sfw_err *err);
int cli_usage_error(const char *cmd, const char *fmt, ...) SFW_PRINTF(2, 3);
/* Flushes standard output: SFW_E_IO (exit 5) when the output could not be
 * written (a full disk, /dev/full), so a command never exits 0 without it. */
SFW_MUST_CHECK enum sfw_status cli_stdout_flush(struct sfw_err *err);

/* Parse a non-negative decimal integer / a finite number as the value of
 * option opt: its bare name as in the table ("temp", "n"; shown as --temp,
 * -n). On error they print "CMD: --opt: 'VALUE' is not ..." and return 0;
 * range checks are the caller's, reported with cli_usage_error. */
int cli_parse_u64(const char *cmd, const char *opt, const char *s, unsigned long long *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out);

/* Options of every command that opens a model (run, score, bench, quant),
 * taken by cli_next_model (cli/model.c): --device, --threads, --no-verify,
 * --verify-full, --pubkey. CLI_MODEL_OPT_ROWS(VERB) are their table rows but
 * --device, whose default differs between commands. */
struct cli_model_opts {
	int device; /* enum sfw_device (runner/runner.h); AUTO unless --device */
	unsigned long long threads; /* 0 = all cores */
	int no_verify, verify_full;
	const char *pubkey;
};
#define CLI_MODEL_OPT_ROWS(VERB)                                                                             \
	{"threads", 0, "N", "CPU threads (default: all cores)"},                                               \
	{"no-verify", 0, NULL, VERB " without checking the directory's signed manifest (says so)"},           \
	{"verify-full", 0, NULL, "re-hash every model file first"},                                            \
	{"pubkey", 0, "FILE", "trust this minisign public key instead of the pinned one"}
void cli_model_opts_init(struct cli_model_opts *o);
/* cli_next that takes the model options into o itself: returns the next
 * other option, CLI_DONE, CLI_HELP, or CLI_ERROR (also for a bad value). */
int cli_next_model(struct cli_parser *p, struct cli_model_opts *o, const char **arg);
/* Seconds on the monotonic clock. */
double cli_now_s(void);

/* Shared by run, score, bench and quant (cli/model.c). cli_model_gate enforces the
 * verified-weights rule on a model directory: the recorded state must hold
 * (sfw_state_check), or with verify_full every file is re-hashed against the
 * signed manifest; no_verify skips it and says so on stderr. pubkey (NULL =
 * the pinned key) names a minisign public key file to trust instead. cli_read_ids
 * reads token ids: a safetensors file's I32/I64 `input_ids`, or text integers
 * separated by white space or commas; a file it cannot open or parse is
 * reported (naming --ids and the file) with exit 5. Both return an exit code
 * (0 = ok). */
int cli_model_gate(const char *cmd, const char *dir, int no_verify, int verify_full, const char *pubkey);
int cli_read_ids(const char *cmd, const char *path, int32_t **ids, size_t *n);
/* The model-load parameters of o plus the environment: the one place the
 * command line reads the engine's variables (README, "Environment"):
 * SALAFW_DEVICE=cpu (without --device), SALAFW_THREADS (without --threads)
 * and the SALAFW_CUDA_* switches (struct sfw_backend_opts). Returns 0, or
 * prints the bad value and returns the usage exit code. (cli/cmd_run.c) */
struct sfw_model_params;
int cli_model_params(const char *cmd, const struct cli_model_opts *o, struct sfw_model_params *mp);

/* Subcommands (each returns an exit code). */
int cmd_verify(int argc, char **argv);
int cmd_manifest(int argc, char **argv);
int cmd_sign(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_get(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quant(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
