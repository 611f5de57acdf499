#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local long fail_countdown; /* 0 = never fail; per thread: a test arms its own */

static int should_fail(void)
{
	if (fail_countdown <= 0)
		return 0;
	if (fail_countdown == 1)
		return 1;
	fail_countdown--;
	return 0;
}

void sfw_alloc_fail_after(long nth)
{
	fail_countdown = nth;
}

void *sfw_malloc(size_t n)
{
	return should_fail() ? NULL : malloc(n ? n : 1);
}

void *sfw_calloc(size_t count, size_t size)
{
	return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *sfw_realloc(void *p, size_t n)
{
	return should_fail() ? NULL : realloc(p, n ? n : 1);
}

void *sfw_malloc_aligned(size_t align, size_t n)
{
	void *p = NULL;
	if (should_fail() || posix_memalign(&p, align, n ? n : 1) != 0)
		return NULL;
	return p;
}

void sfw_free(void *p)
{
	free(p);
}

char *sfw_strndup(const char *s, size_t n)
{
	size_t len = strnlen(s, n);
	char *d = sfw_malloc(len + 1);
	if (d) {
		memcpy(d, s, len);
		d[len] = '\0';
	}
	return d;
}

char *sfw_strdup(const char *s)
{
	return sfw_strndup(s, strlen(s));
}
