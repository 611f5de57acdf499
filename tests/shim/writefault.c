/* writefault.c - a write wrapper for tests (LD_PRELOAD). write(2) to a file
 * whose path contains $SFW_TEST_ENOSPC fails with ENOSPC, as on a full
 * disk; one to a file whose path contains $SFW_TEST_KILL ends the process
 * by SIGKILL at that instant (nothing of it can clean up); the first one to
 * a file whose path contains $SFW_TEST_TRUNCATE_AT truncates the file
 * $SFW_TEST_TRUNCATE to $SFW_TEST_TRUNCATE_SIZE bytes (default 0), as
 * another program would, and goes through. Every other write goes
 * through. For the full-disk and kill cases where no small file
 * system can be mounted and a timed kill would be a race. Built by the
 * tests that use it:
 *   cc -shared -fPIC -o writefault.so tests/shim/writefault.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int path_has(int fd, const char *pat)
{
	if (!pat || !*pat || fd <= 2)
		return 0;
	char link[64], path[4096];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t k = readlink(link, path, sizeof(path) - 1);
	if (k <= 0)
		return 0;
	path[k] = 0;
	return strstr(path, pat) != NULL;
}

ssize_t write(int fd, const void *buf, size_t n)
{
	static ssize_t (*real)(int, const void *, size_t);
	if (!real)
		real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	if (path_has(fd, getenv("SFW_TEST_KILL")))
		kill(getpid(), SIGKILL);
	static int truncated;
	if (!truncated && path_has(fd, getenv("SFW_TEST_TRUNCATE_AT")) && getenv("SFW_TEST_TRUNCATE")) {
		const char *n = getenv("SFW_TEST_TRUNCATE_SIZE");
		truncated = 1;
		if (truncate(getenv("SFW_TEST_TRUNCATE"), n ? atoll(n) : 0) != 0)
			abort();
	}
	if (path_has(fd, getenv("SFW_TEST_ENOSPC"))) {
		errno = ENOSPC;
		return -1;
	}
	return real(fd, buf, n);
}
