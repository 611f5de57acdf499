/* sfw.h - the umbrella public header of libsalafw: status codes, the error
 * buffer every fallible call fills, and the helpers that only the CLI turns
 * into an exit code.
 *
 * Conventions (see docs/style in the shared folder):
 *   - every fallible function returns enum sfw_status and takes an optional
 *     struct sfw_err *err (may be NULL) that receives one line of detail;
 *   - the library never exits; broken invariants abort through SFW_ASSERT. */
#ifndef SFW_H
#define SFW_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define SFW_VERSION "0.1.0"

#if defined(__GNUC__) || defined(__clang__)
#define SFW_MUST_CHECK __attribute__((warn_unused_result))
#define SFW_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SFW_MUST_CHECK
#define SFW_PRINTF(a, b)
#endif

/* Append-only: never renumber, add new codes last. */
enum sfw_status {
	SFW_OK = 0,
	SFW_E_INVAL,       /* bad argument or usage */
	SFW_E_NOMEM,       /* allocation failed */
	SFW_E_IO,          /* local file-system error */
	SFW_E_FORMAT,      /* malformed file contents */
	SFW_E_NET,         /* transport-level network failure */
	SFW_E_HTTP,        /* HTTP status the caller cannot use */
	SFW_E_RANGE,       /* value out of range / overflow */
	SFW_E_HASH,        /* sha256 mismatch */
	SFW_E_SIG,         /* signature rejected */
	SFW_E_KEYID,       /* signature made by another key */
	SFW_E_UNSUPPORTED, /* valid but unsupported (version, dtype, algorithm) */
	SFW_E_CUDA,        /* CUDA runtime failure (recoverable kind, e.g. OOM) */
	SFW_E_ABORTED,     /* cancelled by a callback or a signal */
	SFW_E_SIZE,        /* file size differs from what was expected */
	SFW_E_MISSING,     /* expected file is missing */
	SFW_E_MANIFEST,    /* manifest rejected (schema, binding, expiry, rollback) */
	SFW_E_PATH,        /* unsafe path (traversal, symlink, reserved name) */
	SFW_E_NOSPACE,     /* not enough free disk space */
	SFW_E_EXHAUSTED,   /* every source failed */
	SFW_E_LOCKED,      /* resource held by another process */
	SFW_E_UNVERIFIED,  /* model directory not (or no longer) verified */
	SFW_E_EXISTS,      /* the output exists and --force was not given */
	SFW_E__COUNT
};

/* Documented CLI exit codes (README "Exit codes"). */
enum sfw_exit {
	SFW_EXIT_OK = 0,
	SFW_EXIT_VERIFY = 1,   /* size/hash mismatch, missing file */
	SFW_EXIT_USAGE = 2,    /* bad command line */
	SFW_EXIT_MANIFEST = 3, /* manifest or signature rejected */
	SFW_EXIT_NET = 4,      /* network failure, sources exhausted */
	SFW_EXIT_IO = 5        /* local I/O, format or other operational error */
};

struct sfw_err {
	enum sfw_status code;
	char msg[256];
};

const char *sfw_strerror(enum sfw_status code);

/* Records code and a formatted one-line message in err (if not NULL) and
 * returns code, so call sites read `return sfw_fail(err, SFW_E_IO, ...)`. */
enum sfw_status sfw_fail(struct sfw_err *err, enum sfw_status code, const char *fmt, ...)
	SFW_PRINTF(3, 4);
enum sfw_status sfw_vfail(struct sfw_err *err, enum sfw_status code, const char *fmt, va_list ap);

/* Prefixes an existing message: "context: old message". Returns err->code. */
enum sfw_status sfw_err_prefix(struct sfw_err *err, const char *fmt, ...) SFW_PRINTF(2, 3);

void sfw_err_clear(struct sfw_err *err);

/* Maps a status to the documented exit code. */
int sfw_exit_code(enum sfw_status code);

/* Seconds on the monotonic clock (core/clock.c): for elapsed times only. */
double sfw_now_s(void);

/* Broken invariants (programmer bugs): abort with file:line. */
void sfw_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define SFW_ASSERT(x) ((x) ? (void)0 : sfw_assert_fail(#x, __FILE__, __LINE__))

#endif
