/* log.h - leveled messages through a replaceable sink (default: stderr).
 * The library logs warnings and progress here; errors travel in sfw_err. */
#ifndef SFW_LOG_H
#define SFW_LOG_H

#include "sfw.h"

enum sfw_log_level { SFW_LOG_DEBUG, SFW_LOG_INFO, SFW_LOG_WARN };

typedef void (*sfw_log_fn)(enum sfw_log_level level, const char *msg, void *user);

void sfw_log_set(sfw_log_fn fn, void *user, enum sfw_log_level min_level);
void sfw_log(enum sfw_log_level level, const char *fmt, ...) SFW_PRINTF(2, 3);

/* An untrusted string made safe to print: control bytes (C0, DEL), C1
 * controls (U+0080..U+009F), the characters that hide or reorder text
 * (bidi overrides, zero-width ones: sfw_utf8_hidden), bytes that are not
 * valid UTF-8 and the backslash become \xNN byte by byte (\\ for the
 * backslash); other valid UTF-8 text is kept.
 * Writes at most cap bytes with the NUL (cap >= 8); a string that does not
 * fit ends in "...". NULL prints as "(null)". Returns out, so it nests in a
 * printf argument list: printf("%s", sfw_esc(name, b, sizeof(b))). The
 * default log sink and the CLI's error reporter pass whole messages through
 * it; callers escape each untrusted field they print themselves. */
const char *sfw_esc(const char *s, char *out, size_t cap);

#endif
