/* modules: verify core */
/* test_cli_bytes.c - the byte-count parser behind every BYTES option
 * (get --limit-rate / --segment-size, quant --shard-size): suffixes are
 * powers of 1024 as in curl, and values that do not fit in 64 bits or are
 * not a plain count are refused. Expected values are computed here from the
 * definition (shifts), not copied from the parser. The parser lives in
 * cli/opts.c, which no module archive holds, so it is compiled in here
 * (with cli/progress.c, whose cli_printable it uses). */
#include "check.h"

#include "../cli/opts.c"
#include "../cli/progress.c" /* cli_printable, used by opts.c */

#include <stdint.h>
#include <string.h>

static void test_values(void)
{
	static const struct {
		const char *in;
		unsigned long long want;
	} ok[] = {
	    {"0", 0},
	    {"1", 1},
	    {"10K", 10ull << 10},
	    {"10k", 10ull << 10},
	    {"10KiB", 10ull << 10},
	    {"1M", 1ull << 20},
	    {"1MiB", 1ull << 20},
	    {"200K", 200ull << 10},
	    {"2G", 2ull << 30},
	    {"2g", 2ull << 30},
	    {"3T", 3ull << 40},
	    {"0M", 0},
	    {"007K", 7ull << 10},
	    {"18446744073709551615", UINT64_MAX},
	    {"16777215T", 16777215ull << 40}, /* the largest T that fits */
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		unsigned long long v = 12345;
		int rc = cli_bytes_value(ok[i].in, &v);
		CHECK(rc == 0 && v == ok[i].want, "'%s': rc %d value %llu, want %llu", ok[i].in, rc, v,
		      ok[i].want);
	}
	static const struct {
		const char *in;
		int want; /* -1 not a byte count, -2 too large */
	} bad[] = {
	    {"18446744073709551616", -2}, /* 2^64 */
	    {"99999999999999999999999", -2},
	    {"16777216T", -2}, /* 2^64 exactly */
	    {"17179869184G", -2},
	    {"18446744073709551615K", -2},
	    {"", -1},
	    {"K", -1},
	    {"-1", -1},
	    {"+1", -1},
	    {" 1", -1},
	    {"1 ", -1},
	    {"1.5M", -1},
	    {"1e6", -1},
	    {"10X", -1},
	    {"10KB", -1}, /* ambiguous (1000 or 1024): refused, not guessed */
	    {"10Ki", -1},
	    {"10KiBs", -1},
	    {"10MK", -1},
	    {"0x10", -1},
	    {"abc", -1},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		unsigned long long v = 777;
		int rc = cli_bytes_value(bad[i].in, &v);
		CHECK(rc == bad[i].want && v == 777, "'%s': rc %d (want %d), value left %llu", bad[i].in, rc,
		      bad[i].want, v);
	}
	unsigned long long v = 0;
	CHECK(cli_bytes_value(NULL, &v) == -1, "NULL refused");
}

static void test_messages(void)
{
	/* the printing wrapper: 1 and the value, or 0 and one line on stderr */
	unsigned long long v = 0;
	CHECK(cli_parse_bytes("salafw get", "limit-rate", "1M", &v) == 1 && v == 1048576, "--limit-rate 1M");
	CHECK(cli_parse_bytes("salafw get", "limit-rate", "1Q", &v) == 0, "--limit-rate 1Q refused");
	CHECK(cli_parse_bytes("salafw quant", "shard-size", "99999999999G", &v) == 0,
	      "--shard-size overflow refused");
}

int main(void)
{
	test_values();
	test_messages();
	return CHECK_REPORT("test_cli_bytes");
}
