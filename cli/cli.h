/* cli.h - the salafw command line: the only code that prints usage and exits.
 *
 * Each subcommand lives in cli/cmd_<name>.c, owns one option table (the single
 * place its flags are documented; --help is generated from it), turns argv
 * into a params struct, makes one library call and returns an exit code
 * (enum sfw_exit in core/sfw.h). */
#ifndef SFW_CLI_H
#define SFW_CLI_H

#include "sfw.h"
#include "verify/verify.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cli_opt {
	const char *name;   /* long name without "--" */
	char short_name;    /* 0 if none */
	const char *arg;    /* argument name shown in help, NULL for a flag */
	const char *help;
};

#define CLI_MAX_POS 64
#define CLI_MAX_OPTS 128

/* A typed row of a command's option table (as curl's tool_getparam.c and
 * llama.cpp's common/arg.cpp keep theirs): the option as --help shows it,
 * what it sets and how, and the environment variable that stands in for it
 * when it is not given (an empty variable counts as unset). A command keeps its values in one struct of its own;
 * off is offsetof into it. cli_parse_args does the parsing, the range checks
 * and the messages, so a command's function only reads the struct. */
enum cli_kind {
	CLI_K_CALL = 0, /* fn(cmd, label, value, vals): anything else (repeatable options, enums) */
	CLI_K_FLAG,     /* int, set to 1 (from the environment: a value other than "" and "0") */
	CLI_K_STR,      /* const char *, the argument itself (argv or environ: not copied) */
	CLI_K_U64,      /* uint64_t, decimal digits, within [lo, hi] when lo < hi */
	CLI_K_INT,      /* int (or unsigned), decimal digits, within [lo, hi] (INT_MAX at most) */
	CLI_K_DOUBLE,   /* double, finite, within [lo, hi] when lo < hi */
	CLI_K_BYTES,    /* uint64_t, a byte count (cli_bytes_value), within [lo, hi] when lo < hi */
};
struct cli_arg {
	struct cli_opt opt; /* first: cli_next, --help and --man read the table through it */
	enum cli_kind kind;
	size_t off;
	double lo, hi;
	/* CLI_K_CALL: label is "--name", "-n" or the variable's name; dst is
	 * vals + off (off 0: the whole values struct); returns 0 or an exit code
	 * after printing why */
	int (*fn)(const char *cmd, const char *label, const char *value, void *dst);
	const char *env; /* read when the option is not on the command line */
};

struct cli_parser {
	int argc;
	char **argv;
	int i;
	const struct cli_opt *opts;
	size_t stride;    /* bytes between rows: sizeof(struct cli_opt) or sizeof(struct cli_arg) */
	const char *cmd;  /* "salafw verify" for messages */
	char *pos[CLI_MAX_POS]; /* positional arguments, in order */
	int npos;
	int only_pos;     /* after "--" */
	unsigned char given[CLI_MAX_OPTS]; /* cli_parse_args: row k was on the command line */
	char typed[64];   /* the last option as typed ("-n", "--n-predict"), without "=VALUE" */
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
void cli_usage_args(FILE *f, const char *cmd, const char *synopsis, const struct cli_arg *args);
/* Parses argv[1..] against a typed table (ending with a row whose name is
 * NULL) into vals, then fills each option that was not given from its
 * environment variable, if set. Positional arguments are left in p->pos.
 * Returns 0, CLI_HELP (-h/--help), or an exit code (the problem printed:
 * "CMD: --threads: 'x' is not a non-negative integer", "CMD: --threads must
 * be 1 to 256 (see --help)", the variable's name in place of the option's). */
int cli_parse_args(struct cli_parser *p, const char *cmd, int argc, char **argv, const struct cli_arg *args,
		   void *vals);
/* Whether the option NAME (its long name) was on the command line. */
int cli_given(const struct cli_parser *p, const char *name);

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
/* A byte count: decimal digits and an optional suffix K, M, G or T (either
 * case, "KiB"-style spelling too), each a power of 1024 as in curl ("10K" =
 * 10240, "1M" = 1048576). cli_bytes_value returns 0, -1 for anything else
 * (sign, space, fraction, unknown suffix) or -2 when it does not fit in 64
 * bits; cli_parse_bytes prints the error like cli_parse_u64. */
int cli_bytes_value(const char *s, unsigned long long *out);
int cli_parse_bytes(const char *cmd, const char *opt, const char *s, unsigned long long *out);

/* Options of every command that opens a model (run, score, bench, quant,
 * serve): --device, --threads, --no-verify, --verify-full, --pubkey. */
struct cli_model_opts {
	int device; /* enum sfw_device (runner/runner.h); AUTO unless --device */
	int threads; /* 0 = all cores */
	int no_verify, verify_full;
	const char *pubkey;
	int kv_cache; /* enum sfw_kv_cache; --kv-cache (run, score, bench, serve) */
};
/* The same options as typed rows (struct cli_arg) of a command whose values
 * struct T holds a struct cli_model_opts F: CLI_MODEL_ARGS(T, F, VERB) are
 * --threads (SALAFW_THREADS), --no-verify, --verify-full and --pubkey;
 * CLI_DEVICE_ARG(T, F, HELP) is --device cpu|cuda (SALAFW_DEVICE). */
int cli_take_device(const char *cmd, const char *label, const char *value, void *device);
#define CLI_MODEL_ARGS(T, F, VERB)                                                                           \
	{{"threads", 't', "N", "CPU threads (default: all cores)"},                                            \
	 CLI_K_INT, offsetof(T, F.threads), 0, 256, NULL, "SALAFW_THREADS"},                                   \
	{{"no-verify", 0, NULL, VERB " without checking the directory's signed manifest (says so)"},          \
	 CLI_K_FLAG, offsetof(T, F.no_verify), 0, 0, NULL, NULL},                                              \
	{{"verify-full", 0, NULL, "re-hash every model file first"},                                           \
	 CLI_K_FLAG, offsetof(T, F.verify_full), 0, 0, NULL, NULL},                                            \
	{{"pubkey", 'P', "KEY|FILE",                                                                           \
	  "trust this minisign public key (a file, base64, or an installed key's name) instead of the pinned one"}, \
	 CLI_K_STR, offsetof(T, F.pubkey), 0, 0, NULL, NULL}
#define CLI_DEVICE_ARG(T, F, HELP)                                                                           \
	{{"device", 0, "cpu|cuda", HELP}, CLI_K_CALL, offsetof(T, F.device), 0, 0, cli_take_device, "SALAFW_DEVICE"}
/* --kv-cache bf16|fp8 (SALAFW_KV_CACHE): how the sparse layers keep K and V
 * (enum sfw_kv_cache, runner/runner.h). */
int cli_take_kv_cache(const char *cmd, const char *label, const char *value, void *kv);
#define CLI_KV_CACHE_ARG(T, F)                                                                               \
	{{"kv-cache", 0, "bf16|fp8",                                                                          \
	  "the K/V cache: bf16 (default; float32 on the CPU), or fp8 E4M3 with a scale per token and head (about "  \
	  "half the memory)"},                                                                                \
	 CLI_K_CALL, offsetof(T, F.kv_cache), 0, 0, cli_take_kv_cache, "SALAFW_KV_CACHE"}
void cli_model_opts_init(struct cli_model_opts *o);

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
/* The gate, telling what it checked (cmd_quant records the parent). A model
 * signed by the user's own key (verify.h) passes only when its manifest is
 * a local derived one, and says so on stderr, with its lineage. */
struct cli_gate_info {
	int verified, local_key;
	char repo_id[200], revision[41], key_id[17], manifest_sha256[65];
};
int cli_model_gate_info(const char *cmd, const char *dir, int no_verify, int verify_full, const char *pubkey,
			struct cli_gate_info *info);
/* Trusted keys for a command without explicit keys: the pinned one and the
 * user's own (*user_at its index, -1 when the user has none); with pubkey
 * only that one. Returns a status. */
struct sfw_pubkey;
struct sfw_manifest_lineage;
int cli_trusted_keys(const char *pubkey, struct sfw_pubkey *keys /* [2] */, size_t *n, int *user_at, struct sfw_err *err);
/* "awq by salafw/0.1 (group_size 128, ...)" and "REPO@REV" of a lineage. */
void cli_lineage_text(const struct sfw_manifest_lineage *l, char *out, size_t cap);
void cli_parent_text(const struct sfw_manifest_lineage *l, char *out, size_t cap);
/* For a folder refused for want of a signed manifest: 1 when it holds a
 * model the user derived (its unsigned manifest has a lineage, or, without a
 * manifest, config.json declares a quantization), whose fix is `salafw sign
 * --user DIR`. */
int cli_derived_unsigned(const char *dir);
int cli_read_ids(const char *cmd, const char *path, int32_t **ids, size_t *n);
/* The model-load parameters of o plus the environment: the one place the
 * command line reads the engine's variables (README, "Environment"):
 * SALAFW_DEVICE=cpu (without --device), SALAFW_THREADS (without --threads)
 * and the SALAFW_CUDA_* switches (struct sfw_backend_opts). Returns 0, or
 * prints the bad value and returns the usage exit code. (cli/cmd_run.c) */
struct sfw_model_params;
int cli_model_params(const char *cmd, const struct cli_model_opts *o, struct sfw_model_params *mp);

/* --pubkey (every command): a key file, a base64 minisign public key, or
 * the name of a key installed with salafw (NAME.pub in cli_keys_dir(),
 * e.g. "freeweights"). An existing file wins; then a base64 key; then an
 * installed name; otherwise the argument is opened as a file. Returns an
 * exit code (0 = ok), the problem printed. */
int cli_load_pubkey(const char *cmd, const char *arg, struct sfw_pubkey *key);
/* The folder holding the pinned keys (manifests/, NAME.pub files): $SALAFW_KEYS_DIR,
 * else PREFIX/share/salafw/manifests next to an installed binary
 * (PREFIX/bin/salafw), else the source tree's manifests/ next to build/. */
const char *cli_keys_dir(void);
/* ORG/NAME as the Hugging Face Hub allows it (two parts of [A-Za-z0-9._-],
 * 1..96 characters each, not starting or ending with '.' or '-', no "--"
 * or ".."). Returns 1 when valid; 0 after printing why (usage error). */
int cli_check_repo_id(const char *cmd, const char *opt, const char *id);

/* Interrupts (cli/interrupt.c). main installs the SIGINT/SIGTERM handler
 * before running a command. A command that polls for interrupts (get: the
 * downloader's cancel flag) calls cli_interrupt_polled() and gets the flag
 * the handler sets. Otherwise the handler ends the process at once when no
 * temporary file exists (sfw_atomic_quiesce), or makes the library's
 * atomic writers fail (SFW_E_ABORTED) so their error paths remove their
 * temporary files, and the process ends by the signal when the command
 * returns: the shell sees 128 + signal (130 SIGINT, 143 SIGTERM). */
void cli_interrupt_install(void);
volatile sig_atomic_t *cli_interrupt_polled(void);
/* After the command: if a signal was caught, say so and end by it. */
void cli_interrupt_finish(void);
/* For a polling command that handled the interrupt itself (run -i: Ctrl-C
 * stops a reply and the chat goes on): the signal caught (0 if none), and
 * the flag and the record cleared, so the next Ctrl-C is a first one again. */
int cli_interrupt_take(void);

/* Progress display (cli/progress.c). cli_term_width: the width of the
 * terminal on fd (TIOCGWINSZ), else $COLUMNS, else 80. cli_progress_line
 * formats one file's row to fit `width` columns (at most width - 1 are
 * used, so the terminal never wraps): name (control characters shown as
 * '?', cut with an ellipsis), percent, bytes, rate and ETA, dropping ETA
 * then rate then sizes when narrow. eta < 0: unknown. Returns the columns
 * used. */
int cli_term_width(int fd);
int cli_progress_line(char *out, size_t cap, int width, const char *name, uint64_t done, uint64_t size,
		      double rate, long eta);
/* s with control characters, DEL and characters that hide or reorder text
 * (bidi overrides, zero-width ones) shown as '?' (one line, no terminal
 * escapes), cut to cap - 1 bytes. */
void cli_printable(char *out, size_t cap, const char *s);
/* "1.5 MB" (powers of 1000). */
void cli_human_bytes(char *out, size_t n, double b);
/* The columns a UTF-8 string takes (code points; no wide-character table). */
int cli_str_cols(const char *s);

/* Help: cli_usage prints plain text, or with cli_help_roff set (salafw
 * --man) a roff section of the salafw(1) page, from the same table. */
extern int cli_help_roff;

/* ---- run --prompt-cache FILE (cli/promptcache.c) ----------------------------
 * The state after the prompt (sfw_ctx_state_save) kept in FILE, bound to the
 * model (cli_pcache_bind), loaded before the prompt when its tokens start the
 * prompt and written again when they do not (README, `run`). Problems with
 * FILE are one warning line each; the run then goes on without it. */
struct sfw_ctx;
struct sfw_model_params;
struct cli_pcache {
	const char *cmd, *path;
	unsigned char bind[32];
	int64_t loaded; /* prompt tokens taken from FILE */
	int write;      /* FILE is (re)written after the prompt */
};
/* The binding: the verified manifest's sha256 (gi->verified), else the
 * identity of the files the model reads (names, sizes, inodes, times: stat
 * only), with the device and the CUDA kernel choices. Returns 0, or 1 after
 * a warning (the run goes on without the cache). */
int cli_pcache_bind(struct cli_pcache *pc, const char *dir, const struct cli_gate_info *gi, const char *device,
		    const struct sfw_model_params *mp);
/* Loads FILE into ctx for prompt ids[0..n) when it fits (pc->loaded). */
void cli_pcache_load(struct cli_pcache *pc, struct sfw_ctx *ctx, const int32_t *ids, size_t n);
/* struct sfw_gen_params.on_prompt: writes FILE when pc->write. */
void cli_pcache_save(void *pc, struct sfw_ctx *ctx, const int32_t *ids, size_t n);

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
