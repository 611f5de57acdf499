/* utf8.h - Unicode for names that are shown or compared: the characters
 * that hide or reorder text on a terminal, and the key under which two
 * names are one name to a file system that ignores case or normalisation. */
#ifndef SFW_UTF8_H
#define SFW_UTF8_H

#include <stddef.h>

/* The length of the character at p (n bytes left) when it is one that hides
 * or reorders text when shown, else 0: the bidi controls (U+061C, U+200E,
 * U+200F, U+202A-U+202E, U+2066-U+2069), the zero-width and invisible ones
 * (U+00AD, U+180E, U+200B-U+200D, U+2060-U+2064, U+FEFF) and the line and
 * paragraph separators (U+2028, U+2029). sfw_esc escapes them like control
 * characters ("evil\u202Egnp.exe" would show as "evilexe.png"). */
size_t sfw_utf8_hidden(const unsigned char *p, size_t n);

/* The key two names share when a file system may take them for one: NFC
 * (canonical composition: "cafe\u0301" and "caf\u00e9", U+212B and U+00C5
 * are one) and full Unicode case folding, by libunistring's u8_casefold.
 * A name that is not valid UTF-8 gets ASCII lower case only. Returns a new
 * string (sfw_free) or NULL when out of memory. */
char *sfw_name_fold(const char *s);

#endif
