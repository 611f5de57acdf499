/* enospc.c - a write wrapper for tests (LD_PRELOAD): write(2) to a file
 * whose path contains $SFW_TEST_ENOSPC fails with ENOSPC, as on a full
 * disk; every other write goes through. For the full-disk cases where no
 * small file system can be mounted. Built by the tests that use it:
 *   cc -shared -fPIC -o enospc.so tests/shim/enospc.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ssize_t write(int fd, const void *buf, size_t n)
{
	static ssize_t (*real)(int, const void *, size_t);
	if (!real)
		real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	const char *pat = getenv("SFW_TEST_ENOSPC");
	if (pat && *pat && fd > 2) {
		char link[64], path[4096];
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t k = readlink(link, path, sizeof(path) - 1);
		if (k > 0) {
			path[k] = 0;
			if (strstr(path, pat)) {
				errno = ENOSPC;
				return -1;
			}
		}
	}
	return real(fd, buf, n);
}
