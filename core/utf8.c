/* utf8.c - hidden characters and the name-folding key (core/utf8.h);
 * normalisation and case folding are libunistring's. */
#include "utf8.h"

#include "alloc.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unicase.h>
#include <uninorm.h>
#include <unistr.h>

size_t sfw_utf8_hidden(const unsigned char *p, size_t n)
{
	unsigned cp;
	size_t len;
	if (n >= 2 && p[0] >= 0xc2 && p[0] <= 0xdf && (p[1] & 0xc0) == 0x80)
		cp = (unsigned)(p[0] & 0x1f) << 6 | (p[1] & 0x3f), len = 2;
	else if (n >= 3 && (p[0] & 0xf0) == 0xe0 && (p[1] & 0xc0) == 0x80 && (p[2] & 0xc0) == 0x80)
		cp = (unsigned)(p[0] & 0x0f) << 12 | (unsigned)(p[1] & 0x3f) << 6 | (p[2] & 0x3f), len = 3;
	else
		return 0;
	if (cp == 0x00ad || cp == 0x061c || cp == 0x180e || (cp >= 0x200b && cp <= 0x200f) ||
	    (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x2069) ||
	    cp == 0xfeff)
		return len;
	return 0;
}

char *sfw_name_fold(const char *s)
{
	size_t n = strlen(s);
	if (u8_check((const uint8_t *)s, n) == NULL) {
		size_t len = 0;
		uint8_t *f = u8_casefold((const uint8_t *)s, n, NULL, UNINORM_NFC, NULL, &len);
		if (f) {
			char *out = sfw_malloc(len + 1);
			if (out) {
				memcpy(out, f, len);
				out[len] = '\0';
			}
			free(f); /* libunistring's own allocation */
			return out;
		}
		/* out of memory inside libunistring: so it is for us too */
		return NULL;
	}
	char *out = sfw_strdup(s);
	for (char *p = out; p && *p; p++)
		*p = (char)tolower((unsigned char)*p);
	return out;
}
