#include "sfw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[SFW_E__COUNT] = {
	[SFW_OK] = "ok",
	[SFW_E_INVAL] = "invalid argument",
	[SFW_E_NOMEM] = "out of memory",
	[SFW_E_IO] = "I/O error",
	[SFW_E_FORMAT] = "malformed input",
	[SFW_E_NET] = "network error",
	[SFW_E_HTTP] = "HTTP error",
	[SFW_E_RANGE] = "value out of range",
	[SFW_E_HASH] = "sha256 mismatch",
	[SFW_E_SIG] = "signature rejected",
	[SFW_E_KEYID] = "signature key id mismatch",
	[SFW_E_UNSUPPORTED] = "unsupported",
	[SFW_E_CUDA] = "CUDA error",
	[SFW_E_ABORTED] = "aborted",
	[SFW_E_SIZE] = "size mismatch",
	[SFW_E_MISSING] = "missing file",
	[SFW_E_MANIFEST] = "manifest rejected",
	[SFW_E_PATH] = "unsafe path",
	[SFW_E_NOSPACE] = "not enough disk space",
	[SFW_E_EXHAUSTED] = "all sources failed",
	[SFW_E_LOCKED] = "locked by another process",
	[SFW_E_UNVERIFIED] = "not verified",
	[SFW_E_EXISTS] = "output exists",
};

const char *sfw_strerror(enum sfw_status code)
{
	if ((unsigned)code >= SFW_E__COUNT || !status_names[code])
		return "unknown error";
	return status_names[code];
}

enum sfw_status sfw_vfail(struct sfw_err *err, enum sfw_status code, const char *fmt, va_list ap)
{
	if (err) {
		err->code = code;
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	}
	return code;
}

enum sfw_status sfw_fail(struct sfw_err *err, enum sfw_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	sfw_vfail(err, code, fmt, ap);
	va_end(ap);
	return code;
}

enum sfw_status sfw_err_prefix(struct sfw_err *err, const char *fmt, ...)
{
	if (!err)
		return SFW_E_INVAL;
	char prefix[sizeof(err->msg)], old[sizeof(err->msg)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	snprintf(err->msg, sizeof(err->msg), "%s: %s", prefix, old);
	return err->code;
}

void sfw_err_clear(struct sfw_err *err)
{
	if (err) {
		err->code = SFW_OK;
		err->msg[0] = '\0';
	}
}

int sfw_exit_code(enum sfw_status code)
{
	switch (code) {
	case SFW_OK:
		return SFW_EXIT_OK;
	case SFW_E_HASH:
	case SFW_E_SIZE:
	case SFW_E_MISSING:
	case SFW_E_UNVERIFIED:
		return SFW_EXIT_VERIFY;
	case SFW_E_INVAL:
		return SFW_EXIT_USAGE;
	case SFW_E_SIG:
	case SFW_E_KEYID:
	case SFW_E_MANIFEST:
	case SFW_E_PATH:
		return SFW_EXIT_MANIFEST;
	case SFW_E_NET:
	case SFW_E_HTTP:
	case SFW_E_EXHAUSTED:
		return SFW_EXIT_NET;
	default:
		return SFW_EXIT_IO;
	}
}

void sfw_assert_fail(const char *expr, const char *file, int line)
{
	fprintf(stderr, "salafw: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
	abort();
}
