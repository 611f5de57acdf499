#include "buf.h"

#include "alloc.h"

#include <stdio.h>
#include <string.h>

void sfw_buf_init(struct sfw_buf *b, size_t max)
{
	b->data = NULL;
	b->len = b->cap = 0;
	b->max = max;
}

enum sfw_status sfw_buf_append(struct sfw_buf *b, const void *p, size_t n)
{
	if (n > b->max - b->len)
		return SFW_E_RANGE;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
		char *d = sfw_realloc(b->data, cap);
		if (!d)
			return SFW_E_NOMEM;
		b->data = d;
		b->cap = cap;
	}
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
	return SFW_OK;
}

enum sfw_status sfw_buf_printf(struct sfw_buf *b, const char *fmt, ...)
{
	char small[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return SFW_E_FORMAT;
	if ((size_t)n < sizeof(small))
		return sfw_buf_append(b, small, (size_t)n);
	char *big = sfw_malloc((size_t)n + 1);
	if (!big)
		return SFW_E_NOMEM;
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	enum sfw_status st = sfw_buf_append(b, big, (size_t)n);
	sfw_free(big);
	return st;
}

void sfw_buf_reset(struct sfw_buf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

char *sfw_buf_take(struct sfw_buf *b, size_t *len)
{
	char *d = b->data;
	if (len)
		*len = b->len;
	sfw_buf_init(b, b->max);
	return d;
}

void sfw_buf_release(struct sfw_buf *b)
{
	sfw_free(b->data);
	sfw_buf_init(b, b->max);
}
