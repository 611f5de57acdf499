#include "log.h"

#include "utf8.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
	unsigned c = p[0];
	size_t len;
	unsigned cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0; /* overlong, out of range, surrogate */
	if (cp >= 0x80 && cp <= 0x9f)
		return 0; /* C1 control: escaped byte by byte */
	if (sfw_utf8_hidden(p, n))
		return 0; /* bidi, zero-width: escaped byte by byte too */
	return len;
}

/* Escapes s into out while it fits in limit bytes (no NUL); returns the
 * bytes written and sets *all when the whole string fitted. */
static size_t esc_into(const unsigned char *p, char *out, size_t limit, int *all)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = strlen((const char *)p), o = 0;
	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(p + i, n - i);
		char piece[4];
		const char *src = (const char *)p + i;
		size_t len = k;
		if (k == 0 || (k == 1 && (p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\'))) {
			/* one byte as \xNN, the backslash as \\ */
			piece[0] = '\\';
			if (p[i] == '\\') {
				piece[1] = '\\';
				len = 2;
			} else {
				piece[1] = 'x';
				piece[2] = hex[p[i] >> 4];
				piece[3] = hex[p[i] & 15];
				len = 4;
			}
			src = piece;
			k = 1;
		}
		if (o + len > limit) {
			*all = 0;
			return o;
		}
		if (out)
			memcpy(out + o, src, len);
		o += len;
		i += k;
	}
	*all = 1;
	return o;
}

const char *sfw_esc(const char *s, char *out, size_t cap)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "(null)");
	int all;
	size_t o = esc_into(p, out, cap - 1, &all);
	if (!all) { /* cut at a whole piece, with room for the mark */
		o = esc_into(p, out, cap - 4, &all);
		memcpy(out + o, "...", 3);
		o += 3;
	}
	out[o] = '\0';
	return out;
}

static void default_sink(enum sfw_log_level level, const char *msg, void *user)
{
	(void)user;
	char safe[1100]; /* messages carry untrusted names: never raw control bytes */
	fprintf(stderr, "salafw: %s%s\n", level == SFW_LOG_WARN ? "warning: " : "",
		sfw_esc(msg, safe, sizeof(safe)));
}

static sfw_log_fn sink = default_sink;
static void *sink_user;
static enum sfw_log_level min_lvl = SFW_LOG_INFO;

void sfw_log_set(sfw_log_fn fn, void *user, enum sfw_log_level min_level)
{
	sink = fn ? fn : default_sink;
	sink_user = user;
	min_lvl = min_level;
}

void sfw_log(enum sfw_log_level level, const char *fmt, ...)
{
	if (level < min_lvl)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sink(level, msg, sink_user);
}
