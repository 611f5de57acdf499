/* modules: verify core */
/* test_cli_args.c - typed option tables (struct cli_arg, cli/args.c): each
 * kind stores what the definition says (values written out here), ranges
 * refuse their first value outside and take their bounds, an environment
 * variable stands in for an absent option and loses to a given one, bad
 * values from either place exit with the usage code and name the option or
 * the variable, and cli_given tells which options were typed. The parser
 * lives in cli/, which no module archive holds, so it is compiled in here. */
#include "check.h"

#include "../cli/args.c"
#include "../cli/opts.c"
#include "../cli/progress.c" /* cli_printable, used by opts.c */

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct vals {
	const char *name;
	uint64_t count, bytes;
	int flag, small, calls;
	double ratio;
	char last[32];
};

static int take(const char *cmd, const char *label, const char *v, void *vp)
{
	struct vals *x = vp;
	(void)cmd;
	(void)label;
	if (strcmp(v, "bad") == 0)
		return SFW_EXIT_USAGE;
	x->calls++;
	snprintf(x->last, sizeof(x->last), "%s", v);
	return 0;
}

#define OFF(f) offsetof(struct vals, f)
static const struct cli_arg table[] = {
    {{"name", 'n', "S", "a string"}, CLI_K_STR, OFF(name), 0, 0, NULL, "TEST_CLI_NAME"},
    {{"count", 0, "N", "any count"}, CLI_K_U64, OFF(count), 0, 0, NULL, NULL},
    {{"small", 's', "N", "1 to 8"}, CLI_K_INT, OFF(small), 1, 8, NULL, "TEST_CLI_SMALL"},
    {{"ratio", 0, "X", "0 to 1"}, CLI_K_DOUBLE, OFF(ratio), 0, 1, NULL, NULL},
    {{"bytes", 0, "B", "a byte count"}, CLI_K_BYTES, OFF(bytes), 0, 0, NULL, NULL},
    {{"flag", 'f', NULL, "a flag"}, CLI_K_FLAG, OFF(flag), 0, 0, NULL, "TEST_CLI_FLAG"},
    {{"item", 0, "V", "repeatable"}, CLI_K_CALL, 0, 0, 0, take, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};

/* Parses the words of line (space separated, at most 31) into *v. */
static int parse(const char *line, struct vals *v, struct cli_parser *p)
{
	static char buf[512];
	char *argv[32];
	int argc = 0;
	snprintf(buf, sizeof(buf), "%s", line);
	for (char *t = strtok(buf, " "); t && argc < 31; t = strtok(NULL, " "))
		argv[argc++] = t;
	argv[argc] = NULL;
	memset(v, 0, sizeof(*v));
	return cli_parse_args(p, "test", argc, argv, table, v);
}

int main(void)
{
	struct cli_parser p;
	struct vals v;
	/* stderr carries the messages; keep them out of the test's output */
	if (!freopen("/dev/null", "w", stderr))
		return 1;
	unsetenv("TEST_CLI_NAME");
	unsetenv("TEST_CLI_SMALL");
	unsetenv("TEST_CLI_FLAG");

	CHECK(parse("cmd -n abc --count 18446744073709551615 -s 8 --ratio 0.25 --bytes 3K -f --item x --item y pos",
		    &v, &p) == 0,
	      "a full line parses");
	CHECK(v.name && strcmp(v.name, "abc") == 0, "string stored");
	CHECK(v.count == 18446744073709551615ull, "u64 up to 2^64 - 1 when no range");
	CHECK(v.small == 8, "int at its upper bound");
	CHECK(v.ratio == 0.25, "double stored");
	CHECK(v.bytes == 3 * 1024, "bytes: K = 1024");
	CHECK(v.flag == 1, "flag set");
	CHECK(v.calls == 2 && strcmp(v.last, "y") == 0, "a call row runs once per occurrence");
	CHECK(p.npos == 1 && strcmp(p.pos[0], "pos") == 0, "positional argument kept");
	CHECK(cli_given(&p, "small") && cli_given(&p, "flag") && cli_given(&p, "ratio"), "cli_given: typed options");
	CHECK(parse("cmd --name=inline", &v, &p) == 0 && strcmp(v.name, "inline") == 0, "--name=VALUE");
	CHECK(!cli_given(&p, "small") && cli_given(&p, "name"), "cli_given: only what was typed");

	CHECK(parse("cmd -s 0", &v, &p) == SFW_EXIT_USAGE, "int below its range refused");
	CHECK(parse("cmd -s 9", &v, &p) == SFW_EXIT_USAGE, "int above its range refused");
	CHECK(parse("cmd -s 1", &v, &p) == 0 && v.small == 1, "int at its lower bound");
	CHECK(parse("cmd -s 99999999999999999999", &v, &p) == SFW_EXIT_USAGE, "int: too large refused");
	CHECK(parse("cmd -s 18446744073709551615", &v, &p) == SFW_EXIT_USAGE, "int: 2^64 - 1 out of range refused");
	CHECK(parse("cmd -s -1", &v, &p) == SFW_EXIT_USAGE, "int: a sign refused");
	CHECK(parse("cmd --ratio 1.0000001", &v, &p) == SFW_EXIT_USAGE, "double above its range refused");
	CHECK(parse("cmd --ratio -0.5", &v, &p) == SFW_EXIT_USAGE, "double below its range refused");
	CHECK(parse("cmd --ratio nan", &v, &p) == SFW_EXIT_USAGE, "double: nan refused");
	CHECK(parse("cmd --ratio 1e-400", &v, &p) == SFW_EXIT_USAGE, "double: underflow refused");
	CHECK(parse("cmd --bytes 3Q", &v, &p) == SFW_EXIT_USAGE, "bytes: unknown suffix refused");
	CHECK(parse("cmd --item bad", &v, &p) == SFW_EXIT_USAGE, "a call row's exit code is returned");
	CHECK(parse("cmd --nope", &v, &p) == SFW_EXIT_USAGE, "unknown option refused");
	CHECK(parse("cmd --count", &v, &p) == SFW_EXIT_USAGE, "missing value refused");
	CHECK(parse("cmd --flag=1", &v, &p) == SFW_EXIT_USAGE, "a flag takes no value");
	CHECK(parse("cmd -h", &v, &p) == CLI_HELP, "-h is help");

	/* the environment stands in for absent options only */
	setenv("TEST_CLI_NAME", "from-env", 1);
	setenv("TEST_CLI_SMALL", "3", 1);
	setenv("TEST_CLI_FLAG", "0", 1);
	CHECK(parse("cmd", &v, &p) == 0 && strcmp(v.name, "from-env") == 0 && v.small == 3 && v.flag == 0,
	      "environment fills absent options; FLAG=0 leaves a flag off");
	CHECK(parse("cmd -n typed -s 5", &v, &p) == 0 && strcmp(v.name, "typed") == 0 && v.small == 5,
	      "a typed option wins over its variable");
	setenv("TEST_CLI_NAME", "", 1);
	CHECK(parse("cmd", &v, &p) == 0 && v.name == NULL, "an empty variable counts as unset");
	setenv("TEST_CLI_NAME", "from-env", 1);
	setenv("TEST_CLI_FLAG", "1", 1);
	CHECK(parse("cmd", &v, &p) == 0 && v.flag == 1, "FLAG=1 sets a flag");
	setenv("TEST_CLI_SMALL", "12", 1);
	CHECK(parse("cmd", &v, &p) == SFW_EXIT_USAGE, "a variable out of range is refused");
	CHECK(parse("cmd -s 2", &v, &p) == 0 && v.small == 2, "... unless the option is given");

	/* the messages name the option or the variable */
	int fd[2];
	CHECK(pipe(fd) == 0, "pipe");
	fflush(stderr);
	int saved = dup(2);
	dup2(fd[1], 2);
	(void)parse("cmd", &v, &p);
	setenv("TEST_CLI_SMALL", "x", 1);
	(void)parse("cmd", &v, &p);
	unsetenv("TEST_CLI_SMALL");
	(void)parse("cmd -s 0", &v, &p);
	(void)parse("cmd --small=9", &v, &p);
	(void)parse("cmd --ratio 2", &v, &p);
	fflush(stderr);
	dup2(saved, 2);
	close(fd[1]);
	char msg[2048] = {0};
	ssize_t got = read(fd[0], msg, sizeof(msg) - 1);
	close(fd[0]);
	CHECK(got > 0 && strstr(msg, "test: TEST_CLI_SMALL must be 1 to 8 (see --help)"), "range message names the variable");
	CHECK(strstr(msg, "test: TEST_CLI_SMALL: 'x' is not a non-negative integer") != NULL,
	      "value message names the variable");
	CHECK(strstr(msg, "test: -s must be 1 to 8 (see --help)") != NULL, "range message names the option as typed (-s)");
	CHECK(strstr(msg, "test: --small must be 1 to 8 (see --help)") != NULL, "... and as typed (--small=9)");
	CHECK(strstr(msg, "test: --ratio must be at most 1 (see --help)") != NULL, "a range from 0 says its bound");
	return CHECK_REPORT("test_cli_args");
}
