/* args.c - typed option tables (struct cli_arg, cli.h): one row per option
 * says what it sets, its range and its environment variable; this file does
 * the parsing and the messages for every command that uses one. */
#include "cli.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const struct cli_arg *arg_row(const struct cli_arg *args, int k)
{
	return &args[k];
}

static int in_range(const char *cmd, const char *label, const struct cli_arg *a, double v)
{
	if (a->lo < a->hi && a->lo == 0 && v >= 0 && v > a->hi)
		return cli_usage_error(cmd, "%s must be at most %.17g", label, a->hi);
	if (a->lo < a->hi && (v < a->lo || v > a->hi))
		return cli_usage_error(cmd, "%s must be %.17g to %.17g", label, a->lo, a->hi);
	return 0;
}

/* One value of row a (from argv or the environment) into vals. */
static int apply(const char *cmd, const char *label, const struct cli_arg *a, const char *value, void *vals)
{
	char *dst = (char *)vals + a->off;
	unsigned long long u;
	double d;
	int rc;
	switch (a->kind) {
	case CLI_K_CALL:
		return a->fn ? a->fn(cmd, label, value, dst) : 0;
	case CLI_K_FLAG:
		*(int *)(void *)dst = 1;
		return 0;
	case CLI_K_STR:
		*(const char **)(void *)dst = value;
		return 0;
	case CLI_K_U64:
	case CLI_K_INT:
		if (!cli_parse_u64(cmd, label, value, &u))
			return SFW_EXIT_USAGE;
		if (u > (1ull << 53) && a->lo < a->hi) /* past exact doubles: out of any range we write */
			return in_range(cmd, label, a, a->hi * 2 + 1);
		if ((rc = in_range(cmd, label, a, (double)u)) != 0)
			return rc;
		if (a->kind == CLI_K_INT) {
			if (u > INT_MAX)
				return cli_usage_error(cmd, "%s must be at most %d", label, INT_MAX);
			*(int *)(void *)dst = (int)u;
		} else {
			*(uint64_t *)(void *)dst = u;
		}
		return 0;
	case CLI_K_DOUBLE:
		if (!cli_parse_double(cmd, label, value, &d))
			return SFW_EXIT_USAGE;
		if ((rc = in_range(cmd, label, a, d)) != 0)
			return rc;
		*(double *)(void *)dst = d;
		return 0;
	case CLI_K_BYTES:
		if (!cli_parse_bytes(cmd, label, value, &u))
			return SFW_EXIT_USAGE;
		if ((rc = in_range(cmd, label, a, (double)u)) != 0)
			return rc;
		*(uint64_t *)(void *)dst = u;
		return 0;
	}
	return 0;
}

int cli_parse_args(struct cli_parser *p, const char *cmd, int argc, char **argv, const struct cli_arg *args,
		   void *vals)
{
	int n = 0, k, rc;
	const char *value;
	while (arg_row(args, n)->opt.name)
		n++;
	SFW_ASSERT(n <= CLI_MAX_OPTS);
	cli_init(p, cmd, argc, argv, &args[0].opt);
	p->stride = sizeof(struct cli_arg);
	while ((k = cli_next(p, &value)) != CLI_DONE) {
		if (k == CLI_HELP)
			return CLI_HELP;
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const struct cli_arg *a = arg_row(args, k);
		const char *label = p->typed; /* as typed: "-n" or "--n-predict" */
		p->given[k] = 1;
		if ((rc = apply(cmd, label, a, value, vals)) != 0)
			return rc;
	}
	for (k = 0; k < n; k++) {
		const struct cli_arg *a = arg_row(args, k);
		const char *env = a->env && !p->given[k] ? getenv(a->env) : NULL;
		/* an empty variable counts as unset */
		if (!env || !*env || (a->kind == CLI_K_FLAG && strcmp(env, "0") == 0))
			continue;
		if ((rc = apply(cmd, a->env, a, env, vals)) != 0)
			return rc;
	}
	return 0;
}

int cli_given(const struct cli_parser *p, const char *name)
{
	const struct cli_arg *args = (const struct cli_arg *)(const void *)p->opts;
	SFW_ASSERT(p->stride == sizeof(struct cli_arg));
	for (int k = 0; args[k].opt.name; k++)
		if (strcmp(args[k].opt.name, name) == 0)
			return p->given[k];
	SFW_ASSERT(!"cli_given: no such option");
	return 0;
}
