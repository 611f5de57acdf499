/* check.h - the test harness: CHECK prints one PASS/FAIL line per assertion,
 * CHECK_REPORT prints "<test>: N passed, N failed" and gives the exit code.
 * Tests run from the repository root. */
#ifndef SFW_CHECK_H
#define SFW_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_passed_, check_failed_;

#define CHECK(cond, ...)                                                                                  \
	do {                                                                                              \
		if (cond) {                                                                               \
			check_passed_++;                                                                  \
			if (getenv("CHECK_VERBOSE")) {                                                    \
				printf("PASS ");                                                          \
				printf(__VA_ARGS__);                                                      \
				printf("\n");                                                             \
			}                                                                                 \
		} else {                                                                                  \
			check_failed_++;                                                                  \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                       \
			printf(__VA_ARGS__);                                                              \
			printf("\n");                                                                     \
			fflush(stdout);                                                                   \
		}                                                                                         \
	} while (0)

#define CHECK_REPORT(name)                                                                                \
	(printf("%s: %d passed, %d failed\n", (name), check_passed_, check_failed_),                      \
	 check_failed_ ? 1 : 0)

/* Golden data lives in ../shared/golden (SALAFW_GOLDEN overrides). A test that
 * needs it and cannot find it fails loudly: it never skips. */
static inline const char *check_golden_dir(void)
{
	const char *d = getenv("SALAFW_GOLDEN");
	if (!d)
		d = "../shared/golden";
	FILE *f;
	char probe[4096];
	snprintf(probe, sizeof(probe), "%s/README.md", d);
	if (!(f = fopen(probe, "r"))) {
		printf("FAIL golden data not found at '%s' (set SALAFW_GOLDEN)\n", d);
		check_failed_++;
		return NULL;
	}
	fclose(f);
	return d;
}

#endif
