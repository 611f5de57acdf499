/* alloc.h - the one allocation path of libsalafw, with a test hook that
 * makes the Nth allocation fail (torture runs check every NOMEM path). */
#ifndef SFW_ALLOC_H
#define SFW_ALLOC_H

#include <stddef.h>

void *sfw_malloc(size_t n);
void *sfw_calloc(size_t count, size_t size);
void *sfw_realloc(void *p, size_t n);
void sfw_free(void *p);
char *sfw_strdup(const char *s);
/* align must be a power of two multiple of sizeof(void *); free with sfw_free.
 * I/O buffers are page-aligned: read() into a misaligned buffer copies from
 * the page cache several times slower on some CPUs (measured: 5x the system
 * time on this project's AMD EPYC build machine). */
void *sfw_malloc_aligned(size_t align, size_t n);
char *sfw_strndup(const char *s, size_t n);

/* Test hook: the nth allocation from now (1-based) and every one after it
 * fails; 0 disables. Counts the calling thread's allocations only (other
 * threads, a pool's workers included, are not affected); tests only. */
void sfw_alloc_fail_after(long nth);

#endif
