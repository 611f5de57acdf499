/* cli/progress.c - progress rows that fit the terminal (see cli.h). Self
 * contained (tests/test_cli_progress.c includes it). */
#include "cli.h"
#include "utf8.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

int cli_term_width(int fd)
{
	struct winsize ws;
	if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	const char *c = getenv("COLUMNS");
	if (c && *c) {
		char *end;
		long v = strtol(c, &end, 10);
		if (!*end && v > 0 && v < 10000)
			return (int)v;
	}
	return 80;
}

void cli_human_bytes(char *out, size_t n, double b)
{
	const char *u[] = {"B", "KB", "MB", "GB", "TB"};
	int i = 0;
	while (b >= 1000 && i < 4) {
		b /= 1000;
		i++;
	}
	snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

int cli_str_cols(const char *s)
{
	int n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		n += (*p & 0xC0) != 0x80;
	return n;
}

/* The bytes of a C0 or C1 control character (C1 as its UTF-8 form C2
 * 80..9F), DEL, or a character that hides or reorders text (bidi overrides,
 * zero-width ones: sfw_utf8_hidden) at p; 0 for anything else. */
static size_t control_at(const unsigned char *p)
{
	if (*p < 0x20 || *p == 0x7f)
		return 1;
	if (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F)
		return 2;
	return sfw_utf8_hidden(p, strnlen((const char *)p, 3));
}

void cli_printable(char *out, size_t cap, const char *s)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && o + 1 < cap; p++) {
		size_t k = control_at(p);
		if (k) {
			out[o++] = '?';
			p += k - 1; /* every byte of it */
		} else {
			out[o++] = (char)*p;
		}
	}
	if (cap)
		out[o] = '\0';
}

/* Copies name into out (cap bytes) in at most cols columns: control bytes
 * (and DEL, and hidden characters) become '?', a longer name ends in "…".
 * Returns the columns. */
static int fit_name(char *out, size_t cap, const char *name, int cols)
{
	size_t o = 0;
	int used = 0, total = cli_str_cols(name);
	int room = total > cols ? cols - 1 : cols; /* keep a column for the ellipsis */
	for (const unsigned char *p = (const unsigned char *)name; *p && o + 5 < cap;) {
		size_t len = 1;
		if (*p >= 0xC0)
			while ((p[len] & 0xC0) == 0x80 && len < 4)
				len++;
		if (used + 1 > room)
			break;
		if (control_at(p) || (*p >= 0x80 && *p < 0xC0)) {
			out[o++] = '?';
		} else {
			memcpy(out + o, p, len);
			o += len;
		}
		used++;
		p += len;
	}
	if (total > cols && cols >= 1 && o + 4 < cap) {
		memcpy(out + o, "\xe2\x80\xa6", 3); /* … */
		o += 3;
		used++;
	}
	out[o] = '\0';
	return used;
}

int cli_progress_line(char *out, size_t cap, int width, const char *name, uint64_t done, uint64_t size,
		      double rate, long eta)
{
	char a[32], b[32], r[32], e[32], tail[160], nm[1024];
	cli_human_bytes(a, sizeof(a), (double)done);
	cli_human_bytes(b, sizeof(b), (double)size);
	cli_human_bytes(r, sizeof(r), rate);
	if (eta >= 0)
		snprintf(e, sizeof(e), "ETA %ld:%02ld", eta / 60, eta % 60);
	else
		snprintf(e, sizeof(e), "ETA --:--");
	double pct = size ? 100.0 * (double)done / (double)size : 100.0;
	int avail = width - 1; /* the last column would wrap on some terminals */
	if (avail < 4) {
		if (cap)
			out[0] = '\0';
		return 0;
	}
	/* the fullest form that leaves at least 12 columns of name */
	for (int form = 0; form < 4; form++) {
		if (form == 0)
			snprintf(tail, sizeof(tail), " %5.1f%% %9s / %-9s %9s/s  %s", pct, a, b, r, e);
		else if (form == 1)
			snprintf(tail, sizeof(tail), " %5.1f%% %9s / %-9s %9s/s", pct, a, b, r);
		else if (form == 2)
			snprintf(tail, sizeof(tail), " %5.1f%% %9s", pct, a);
		else
			snprintf(tail, sizeof(tail), " %5.1f%%", pct);
		int tc = (int)strlen(tail);
		if (avail - 2 - tc >= 12 || form == 3) {
			int ncols = avail - 2 - tc;
			if (ncols > 48)
				ncols = 48;
			if (ncols < 1) { /* narrower than the percent: the name alone */
				ncols = avail - 2 > 0 ? avail - 2 : 0;
				tail[0] = '\0';
				tc = 0;
			}
			int used = fit_name(nm, sizeof(nm), name ? name : "", ncols);
			int pad = ncols - used; /* names pad to their column so rows line up */
			snprintf(out, cap, "  %s%*s%s", nm, pad, "", tail);
			return 2 + used + pad + tc;
		}
	}
	return 0;
}
