#include "cli.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A usage message, printed escaped: the values quoted come from argv, which
 * may hold any byte (a script passing on a name it was given). */
__attribute__((format(printf, 1, 2))) static void usage_say(const char *fmt, ...)
{
	char msg[2048], esc[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", sfw_esc(msg, esc, sizeof(esc)));
}

void cli_init(struct cli_parser *p, const char *cmd, int argc, char **argv, const struct cli_opt *opts)
{
	memset(p, 0, sizeof(*p));
	p->argc = argc;
	p->argv = argv;
	p->i = 1;
	p->opts = opts;
	p->stride = sizeof(struct cli_opt);
	p->cmd = cmd;
}

/* Row k of a table whose rows are `stride` bytes apart and begin with a
 * struct cli_opt (struct cli_opt itself, or struct cli_arg). */
static const struct cli_opt *row(const struct cli_opt *opts, size_t stride, int k)
{
	return (const struct cli_opt *)(const void *)((const char *)opts + (size_t)k * stride);
}
#define OPT(p, k) row((p)->opts, (p)->stride, (k))

static int add_pos(struct cli_parser *p, char *a)
{
	if (p->npos >= CLI_MAX_POS) {
		fprintf(stderr, "%s: too many arguments\n", p->cmd);
		return CLI_ERROR;
	}
	p->pos[p->npos++] = a;
	return 0;
}

int cli_next(struct cli_parser *p, const char **arg)
{
	*arg = NULL;
	while (p->i < p->argc) {
		char *a = p->argv[p->i++];
		if (p->only_pos || a[0] != '-' || a[1] == '\0') {
			if (add_pos(p, a) != 0)
				return CLI_ERROR;
			continue;
		}
		if (strcmp(a, "--") == 0) {
			p->only_pos = 1;
			continue;
		}
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
			return CLI_HELP;
		const char *inline_val = NULL;
		int found = -1;
		if (a[1] == '-') {
			const char *name = a + 2;
			const char *eq = strchr(name, '=');
			size_t len = eq ? (size_t)(eq - name) : strlen(name);
			for (int k = 0; OPT(p, k)->name; k++)
				if (strlen(OPT(p, k)->name) == len && strncmp(OPT(p, k)->name, name, len) == 0)
					found = k;
			if (eq)
				inline_val = eq + 1;
		} else if (a[2] == '\0') {
			for (int k = 0; OPT(p, k)->name; k++)
				if (OPT(p, k)->short_name == a[1])
					found = k;
		}
		if (found < 0) {
			usage_say("%s: unknown option '%s' (see --help)", p->cmd, a);
			return CLI_ERROR;
		}
		{
			size_t tl = inline_val ? (size_t)(inline_val - 1 - a) : strlen(a);
			snprintf(p->typed, sizeof(p->typed), "%.*s", (int)tl, a);
		}
		if (OPT(p, found)->arg) {
			if (inline_val) {
				*arg = inline_val;
			} else if (p->i < p->argc) {
				*arg = p->argv[p->i++];
			} else {
				usage_say("%s: option '%s' needs a value (%s)", p->cmd, a,
					  OPT(p, found)->arg);
				return CLI_ERROR;
			}
		} else if (inline_val) {
			usage_say("%s: option '%s' takes no value", p->cmd, a);
			return CLI_ERROR;
		}
		return found;
	}
	return CLI_DONE;
}

int cli_help_roff;

/* roff text: a backslash doubled, a leading '.' or '\'' guarded. */
static void roff_text(FILE *f, const char *s)
{
	int bol = 1;
	for (; *s; s++) {
		if (bol && (*s == '.' || *s == '\''))
			fputs("\\&", f);
		if (*s == '\\')
			fputs("\\e", f);
		else if (*s == '-')
			fputs("\\-", f);
		else
			fputc(*s, f);
		bol = *s == '\n';
	}
}

static void usage_roff(FILE *f, const char *cmd, const char *synopsis, const struct cli_opt *opts, size_t stride)
{
	fprintf(f, ".SH \"");
	for (const char *c = cmd; *c; c++)
		fputc(*c >= 'a' && *c <= 'z' ? *c - 32 : *c, f);
	fprintf(f, "\"\n.nf\n.B ");
	roff_text(f, cmd);
	fputc(' ', f);
	roff_text(f, synopsis);
	fprintf(f, "\n.fi\n");
	for (int k = 0; row(opts, stride, k)->name; k++) {
		fprintf(f, ".TP\n");
		if (row(opts, stride, k)->short_name)
			fprintf(f, "\\fB\\-%c\\fR, ", row(opts, stride, k)->short_name);
		fprintf(f, "\\fB\\-\\-");
		roff_text(f, row(opts, stride, k)->name);
		fprintf(f, "\\fR");
		if (row(opts, stride, k)->arg) {
			fprintf(f, " \\fI");
			roff_text(f, row(opts, stride, k)->arg);
			fprintf(f, "\\fR");
		}
		fputc('\n', f);
		roff_text(f, row(opts, stride, k)->help);
		fputc('\n', f);
	}
	fprintf(f, ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nshow this help\n.PP\n");
}

static void usage_rows(FILE *f, const char *cmd, const char *synopsis, const struct cli_opt *opts, size_t stride)
{
	if (cli_help_roff) {
		usage_roff(f, cmd, synopsis, opts, stride);
		return;
	}
	fprintf(f, "usage: %s %s\n\noptions:\n", cmd, synopsis);
	for (int k = 0; row(opts, stride, k)->name; k++) {
		char left[64];
		if (row(opts, stride, k)->short_name)
			snprintf(left, sizeof(left), "-%c, --%s%s%s", row(opts, stride, k)->short_name, row(opts, stride, k)->name,
				 row(opts, stride, k)->arg ? " " : "", row(opts, stride, k)->arg ? row(opts, stride, k)->arg : "");
		else
			snprintf(left, sizeof(left), "    --%s%s%s", row(opts, stride, k)->name, row(opts, stride, k)->arg ? " " : "",
				 row(opts, stride, k)->arg ? row(opts, stride, k)->arg : "");
		fprintf(f, "  %-30s %s\n", left, row(opts, stride, k)->help);
	}
	fprintf(f, "  %-30s %s\n", "-h, --help", "show this help");
}

void cli_usage(FILE *f, const char *cmd, const char *synopsis, const struct cli_opt *opts)
{
	usage_rows(f, cmd, synopsis, opts, sizeof(struct cli_opt));
}

void cli_usage_args(FILE *f, const char *cmd, const char *synopsis, const struct cli_arg *args)
{
	usage_rows(f, cmd, synopsis, &args[0].opt, sizeof(struct cli_arg));
}

int cli_report(enum sfw_status st, const struct sfw_err *err)
{
	if (st == SFW_OK)
		return SFW_EXIT_OK;
	char esc[1100]; /* messages carry untrusted names: never raw control bytes */
	if (err && err->msg[0])
		fprintf(stderr, "salafw: %s\n", sfw_esc(err->msg, esc, sizeof(esc)));
	else
		fprintf(stderr, "salafw: %s\n", sfw_strerror(st));
	return sfw_exit_code(st);
}

enum sfw_status cli_stdout_flush(struct sfw_err *err)
{
	/* Called right after the writes it checks: on an unbuffered stdout the
	 * write that failed already set errno, and fflush has nothing left to
	 * fail with, so that errno is the reason. */
	int before = errno;
	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno ? errno : before;
		return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write to standard output: %s",
				e ? strerror(e) : "write error");
	}
	return SFW_OK;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	usage_say("%s: %s (see --help)", cmd, msg);
	return SFW_EXIT_USAGE;
}

/* The option as the user typed it: "-n" for a one-letter name, "--name"
 * otherwise; a name given with its dashes, or an environment variable's
 * (upper case), is shown as it is. */
static void opt_label(char *buf, size_t size, const char *opt)
{
	if (opt[0] == '-' || (opt[0] >= 'A' && opt[0] <= 'Z'))
		snprintf(buf, size, "%s", opt);
	else
		snprintf(buf, size, "%s%s", opt[1] ? "--" : "-", opt);
}

int cli_parse_u64(const char *cmd, const char *opt, const char *s, unsigned long long *out)
{
	char lab[64], *end;
	opt_label(lab, sizeof(lab), opt);
	/* Digits only: strtoull would skip white space and accept a sign
	 * (" -1" wraps to 2^64 - 1). */
	if (!s || !isdigit((unsigned char)*s)) {
		usage_say("%s: %s: '%s' is not a non-negative integer", cmd, lab, s ? s : "");
		return 0;
	}
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (*end) {
		usage_say("%s: %s: '%s' is not a non-negative integer", cmd, lab, s);
		return 0;
	}
	if (errno) {
		usage_say("%s: %s: '%s' is too large", cmd, lab, s);
		return 0;
	}
	*out = v;
	return 1;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out)
{
	char lab[64], *end;
	opt_label(lab, sizeof(lab), opt);
	errno = 0;
	double v = s && *s && !isspace((unsigned char)*s) ? strtod(s, &end) : 0;
	if (!s || !*s || isspace((unsigned char)*s) || *end) {
		usage_say("%s: %s: '%s' is not a number", cmd, lab, s ? s : "");
		return 0;
	}
	if (!isfinite(v) || (errno == ERANGE && (v > 1 || v < -1))) {
		usage_say("%s: %s: '%s' is not a finite number", cmd, lab, s);
		return 0;
	}
	if (errno == ERANGE) { /* underflow: 1e-400 must not quietly become 0 */
		usage_say("%s: %s: '%s' is too close to zero", cmd, lab, s);
		return 0;
	}
	*out = v;
	return 1;
}

/* ---- --pubkey, keys, repo ids ----------------------------------------------- */

const char *cli_keys_dir(void)
{
	static char dir[4096];
	if (dir[0])
		return dir;
	const char *env = getenv("SALAFW_KEYS_DIR");
	if (env && *env) {
		snprintf(dir, sizeof(dir), "%s", env);
		return dir;
	}
	char exe[4000];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		char *sl = strrchr(exe, '/');
		if (sl) {
			*sl = '\0'; /* PREFIX/bin or the build folder */
			char *up = strrchr(exe, '/');
			const char *base = up ? up + 1 : exe;
			if (up)
				*up = '\0';
			const char *root = up ? (exe[0] ? exe : "/") : ".";
			if (strcmp(base, "bin") == 0)
				snprintf(dir, sizeof(dir), "%s/share/salafw/manifests", root);
			else
				snprintf(dir, sizeof(dir), "%s/manifests", root);
			if (access(dir, R_OK | X_OK) == 0)
				return dir;
		}
	}
	snprintf(dir, sizeof(dir), "%s", "/usr/local/share/salafw/manifests");
	return dir;
}

static int looks_base64_key(const char *s)
{
	size_t n = strlen(s);
	return n == 56 && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == n;
}

int cli_load_pubkey(const char *cmd, const char *arg, struct sfw_pubkey *key)
{
	struct sfw_err err = {0};
	enum sfw_status s;
	if (access(arg, F_OK) == 0) {
		s = sfw_pubkey_load(arg, key, &err);
	} else if (looks_base64_key(arg)) {
		s = sfw_pubkey_parse(arg, strlen(arg), "public key given with --pubkey", key, &err);
	} else {
		char path[4200];
		int named = !strchr(arg, '/') && arg[0] && arg[0] != '.';
		if (named)
			snprintf(path, sizeof(path), "%s/%s.pub", cli_keys_dir(), arg);
		if (named && access(path, F_OK) == 0)
			s = sfw_pubkey_load(path, key, &err);
		else if (strchr(arg, '/') || (strlen(arg) > 4 && strcmp(arg + strlen(arg) - 4, ".pub") == 0))
			s = sfw_pubkey_load(arg, key, &err); /* a file that is not there: "cannot open" */
		else if ((s = sfw_pubkey_parse(arg, strlen(arg), "public key given with --pubkey", key, &err)) != SFW_OK) {
			char shown[64];
			cli_printable(shown, sizeof(shown), arg);
			fprintf(stderr,
				"%s: --pubkey '%s' is not a key file, not an installed key (%s/%s.pub) and not a "
				"base64 minisign public key\n",
				cmd, shown, cli_keys_dir(), shown);
			return sfw_exit_code(s);
		}
	}
	return s == SFW_OK ? 0 : cli_report(s, &err);
}

static int repo_part_ok(const char *p, size_t n)
{
	if (n < 1 || n > 96)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (!isalnum(c) && c != '.' && c != '_' && c != '-')
			return 0;
		if (i + 1 < n && (c == '.' || c == '-') && p[i + 1] == c)
			return 0;
	}
	return p[0] != '.' && p[0] != '-' && p[n - 1] != '.' && p[n - 1] != '-';
}

int cli_check_repo_id(const char *cmd, const char *opt, const char *id)
{
	const char *sl = strchr(id, '/');
	if (sl && !strchr(sl + 1, '/') && repo_part_ok(id, (size_t)(sl - id)) && repo_part_ok(sl + 1, strlen(sl + 1)))
		return 1;
	char shown[120];
	cli_printable(shown, sizeof(shown), id);
	fprintf(stderr,
		"%s: %s'%s' is not a repository id: expected ORG/NAME, each part 1-96 of A-Z a-z 0-9 . _ -, "
		"not starting or ending with . or - (e.g. openbmb/MiniCPM-SALA)\n",
		cmd, opt ? opt : "", shown);
	return 0;
}

int cli_bytes_value(const char *s, unsigned long long *out)
{
	if (!s || !isdigit((unsigned char)*s))
		return -1;
	unsigned long long v = 0;
	for (; isdigit((unsigned char)*s); s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (ULLONG_MAX - d) / 10)
			return -2;
		v = v * 10 + d;
	}
	int shift = 0;
	switch (*s) {
	case '\0':
		break;
	case 'k':
	case 'K':
		shift = 10;
		break;
	case 'm':
	case 'M':
		shift = 20;
		break;
	case 'g':
	case 'G':
		shift = 30;
		break;
	case 't':
	case 'T':
		shift = 40;
		break;
	default:
		return -1;
	}
	if (shift) {
		s++;
		if (strcmp(s, "iB") == 0)
			s += 2;
		if (*s)
			return -1;
		if (v > (ULLONG_MAX >> shift))
			return -2;
		v <<= shift;
	}
	*out = v;
	return 0;
}

int cli_parse_bytes(const char *cmd, const char *opt, const char *s, unsigned long long *out)
{
	char lab[64];
	opt_label(lab, sizeof(lab), opt);
	switch (cli_bytes_value(s, out)) {
	case 0:
		return 1;
	case -2:
		usage_say("%s: %s: '%s' is too large", cmd, lab, s);
		return 0;
	default:
		usage_say(
		    "%s: %s: '%s' is not a byte count (digits, then optionally K, M, G or T: powers of 1024)",
		    cmd, lab, s ? s : "");
		return 0;
	}
}
