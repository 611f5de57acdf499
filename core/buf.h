/* buf.h - a growable byte buffer with a hard cap (curl's dynbuf idea):
 * appends past the cap fail instead of growing without bound. The data is
 * always NUL-terminated so text parsers can use it directly. */
#ifndef SFW_BUF_H
#define SFW_BUF_H

#include "sfw.h"

struct sfw_buf {
	char *data;  /* NUL-terminated; NULL until the first append */
	size_t len;
	size_t cap;
	size_t max;  /* hard cap on len */
};

void sfw_buf_init(struct sfw_buf *b, size_t max);
SFW_MUST_CHECK enum sfw_status sfw_buf_append(struct sfw_buf *b, const void *p, size_t n);
SFW_MUST_CHECK enum sfw_status sfw_buf_printf(struct sfw_buf *b, const char *fmt, ...) SFW_PRINTF(2, 3);
void sfw_buf_reset(struct sfw_buf *b);
/* Hands the data to the caller (free with sfw_free) and re-initialises b. */
char *sfw_buf_take(struct sfw_buf *b, size_t *len);
void sfw_buf_release(struct sfw_buf *b);

#endif
