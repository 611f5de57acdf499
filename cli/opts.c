#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void cli_init(struct cli_parser *p, const char *cmd, int argc, char **argv, const struct cli_opt *opts)
{
	memset(p, 0, sizeof(*p));
	p->argc = argc;
	p->argv = argv;
	p->i = 1;
	p->opts = opts;
	p->cmd = cmd;
}

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
			for (int k = 0; p->opts[k].name; k++)
				if (strlen(p->opts[k].name) == len && strncmp(p->opts[k].name, name, len) == 0)
					found = k;
			if (eq)
				inline_val = eq + 1;
		} else if (a[2] == '\0') {
			for (int k = 0; p->opts[k].name; k++)
				if (p->opts[k].short_name == a[1])
					found = k;
		}
		if (found < 0) {
			fprintf(stderr, "%s: unknown option '%s' (see --help)\n", p->cmd, a);
			return CLI_ERROR;
		}
		if (p->opts[found].arg) {
			if (inline_val) {
				*arg = inline_val;
			} else if (p->i < p->argc) {
				*arg = p->argv[p->i++];
			} else {
				fprintf(stderr, "%s: option '%s' needs a value (%s)\n", p->cmd, a, p->opts[found].arg);
				return CLI_ERROR;
			}
		} else if (inline_val) {
			fprintf(stderr, "%s: option '%s' takes no value\n", p->cmd, a);
			return CLI_ERROR;
		}
		return found;
	}
	return CLI_DONE;
}

void cli_usage(FILE *f, const char *cmd, const char *synopsis, const struct cli_opt *opts)
{
	fprintf(f, "usage: %s %s\n\noptions:\n", cmd, synopsis);
	for (int k = 0; opts[k].name; k++) {
		char left[64];
		if (opts[k].short_name)
			snprintf(left, sizeof(left), "-%c, --%s%s%s", opts[k].short_name, opts[k].name,
				 opts[k].arg ? " " : "", opts[k].arg ? opts[k].arg : "");
		else
			snprintf(left, sizeof(left), "    --%s%s%s", opts[k].name, opts[k].arg ? " " : "",
				 opts[k].arg ? opts[k].arg : "");
		fprintf(f, "  %-30s %s\n", left, opts[k].help);
	}
	fprintf(f, "  %-30s %s\n", "-h, --help", "show this help");
}

int cli_report(enum sfw_status st, const struct sfw_err *err)
{
	if (st == SFW_OK)
		return SFW_EXIT_OK;
	if (err && err->msg[0])
		fprintf(stderr, "salafw: %s\n", err->msg);
	else
		fprintf(stderr, "salafw: %s\n", sfw_strerror(st));
	return sfw_exit_code(st);
}

enum sfw_status cli_stdout_flush(struct sfw_err *err)
{
	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout))
		return sfw_fail(err, SFW_E_IO, "cannot write to standard output: %s",
				errno ? strerror(errno) : "write error");
	return SFW_OK;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see --help)\n");
	return SFW_EXIT_USAGE;
}

/* The option as the user typed it: "-n" for a one-letter name, "--name"
 * otherwise; a name given with its dashes is shown as it is. */
static void opt_label(char *buf, size_t size, const char *opt)
{
	if (opt[0] == '-')
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
		fprintf(stderr, "%s: %s: '%s' is not a non-negative integer\n", cmd, lab, s ? s : "");
		return 0;
	}
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (*end) {
		fprintf(stderr, "%s: %s: '%s' is not a non-negative integer\n", cmd, lab, s);
		return 0;
	}
	if (errno) {
		fprintf(stderr, "%s: %s: '%s' is too large\n", cmd, lab, s);
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
		fprintf(stderr, "%s: %s: '%s' is not a number\n", cmd, lab, s ? s : "");
		return 0;
	}
	if (!isfinite(v) || (errno == ERANGE && (v > 1 || v < -1))) {
		fprintf(stderr, "%s: %s: '%s' is not a finite number\n", cmd, lab, s);
		return 0;
	}
	if (errno == ERANGE) { /* underflow: 1e-400 must not quietly become 0 */
		fprintf(stderr, "%s: %s: '%s' is too close to zero\n", cmd, lab, s);
		return 0;
	}
	*out = v;
	return 1;
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
		fprintf(stderr, "%s: %s: '%s' is too large\n", cmd, lab, s);
		return 0;
	default:
		fprintf(stderr, "%s: %s: '%s' is not a byte count (digits, then optionally K, M, G or T: powers of 1024)\n",
			cmd, lab, s ? s : "");
		return 0;
	}
}
