#include "file.h"

#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static enum sfw_status read_opened(int fd, const char *path, size_t max, struct sfw_buf *out,
				   struct sfw_err *err);

enum sfw_status sfw_read_file(const char *path, size_t max, struct sfw_buf *out, struct sfw_err *err)
{
	/* O_NONBLOCK: opening a FIFO would otherwise wait for a writer before
	 * the regular-file check can refuse it (regular files ignore it) */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return sfw_fail(err, errno == ENOENT ? SFW_E_MISSING : SFW_E_IO, "cannot open '%s': %s", path,
				strerror(errno));
	return read_opened(fd, path, max, out, err);
}

enum sfw_status sfw_read_fileat(int dfd, const char *name, const char *shown, size_t max, struct sfw_buf *out,
				struct sfw_err *err)
{
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
	if (fd < 0 && errno == ELOOP)
		return sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is a symlink", shown);
	if (fd < 0)
		return sfw_fail(err, errno == ENOENT ? SFW_E_MISSING : SFW_E_IO, "cannot open '%s': %s", shown,
				strerror(errno));
	return read_opened(fd, shown, max, out, err);
}

static enum sfw_status read_opened(int fd, const char *path, size_t max, struct sfw_buf *out,
				   struct sfw_err *err)
{
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sfw_fail(err, SFW_E_IO, "'%s' is not a regular file", path);
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return sfw_fail(err, SFW_E_RANGE, "'%s' is too large (%lld bytes, limit %zu)", path,
				(long long)st.st_size, max);
	}
	sfw_buf_init(out, max);
	char chunk[65536];
	for (;;) {
		ssize_t n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			sfw_buf_release(out);
			return sfw_fail(err, SFW_E_IO, "cannot read '%s': %s", path, strerror(e));
		}
		if (n == 0)
			break;
		enum sfw_status s = sfw_buf_append(out, chunk, (size_t)n);
		if (s != SFW_OK) {
			close(fd);
			sfw_buf_release(out);
			return sfw_fail(err, s, "'%s' grew past the limit of %zu bytes", path, max);
		}
	}
	close(fd);
	if (!out->data) { /* empty file: still give a NUL-terminated buffer */
		enum sfw_status s = sfw_buf_append(out, "", 0);
		if (s != SFW_OK)
			return sfw_fail(err, s, "out of memory reading '%s'", path);
	}
	return SFW_OK;
}

enum sfw_status sfw_map_open(struct sfw_map *m, const char *path, struct sfw_err *err)
{
	m->data = NULL;
	m->size = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* see sfw_read_file */
	if (fd < 0)
		return sfw_fail(err, errno == ENOENT ? SFW_E_MISSING : SFW_E_IO, "cannot open '%s': %s", path,
				strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sfw_fail(err, SFW_E_IO, "'%s' is not a regular file", path);
	}
	if (st.st_size > 0) {
		void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (p == MAP_FAILED) {
			int e = errno;
			close(fd);
			return sfw_fail(err, SFW_E_IO, "cannot map '%s': %s", path, strerror(e));
		}
		m->data = p;
		m->size = (uint64_t)st.st_size;
		sfwi_map_guard_add(p, m->size, path);
	}
	close(fd);
	return SFW_OK;
}

void sfw_map_release(const void *p, uint64_t n)
{
	long pg = sysconf(_SC_PAGESIZE);
	if (!p || n == 0 || pg <= 0)
		return;
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1),
		  b = ((uintptr_t)p + (uintptr_t)n + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	(void)madvise((void *)a, (size_t)(b - a), MADV_DONTNEED);
}

void sfw_map_close(struct sfw_map *m)
{
	if (m->data) {
		sfwi_map_guard_remove(m->data);
		munmap((void *)m->data, (size_t)m->size);
	}
	m->data = NULL;
	m->size = 0;
}

int sfw_write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

int sfw_pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const char *c = p;
	while (n) {
		ssize_t w = pwrite(fd, c, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

long long sfw_pread_full(int fd, void *p, size_t n, uint64_t off)
{
	char *c = p;
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, c + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (long long)got;
}

char *sfw_path_join(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int slash = la > 0 && a[la - 1] != '/';
	char *p = sfw_malloc(la + lb + 2);
	if (!p)
		return NULL;
	memcpy(p, a, la);
	if (slash)
		p[la++] = '/';
	memcpy(p + la, b, lb + 1);
	return p;
}

static char *dir_of(const char *path)
{
	char *copy = sfw_strdup(path);
	if (!copy)
		return NULL;
	char *d = sfw_strdup(dirname(copy));
	sfw_free(copy);
	return d;
}

enum sfw_status sfw_fsync_dir(const char *dir, struct sfw_err *err)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", dir, strerror(errno));
	/* Some file systems refuse fsync on directories; that is not data loss. */
	if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
		int e = errno;
		close(fd);
		return sfw_fail(err, SFW_E_IO, "cannot sync directory '%s': %s", dir, strerror(e));
	}
	close(fd);
	return SFW_OK;
}

static atomic_uint tmp_counter;

/* Temporary files that may exist; -1 once sfw_atomic_quiesce closed the door. */
static atomic_int g_live;
static volatile sig_atomic_t *g_cancel;

void sfw_atomic_set_cancel(volatile sig_atomic_t *flag)
{
	g_cancel = flag;
}

int sfw_atomic_quiesce(void)
{
	int zero = 0;
	return atomic_compare_exchange_strong(&g_live, &zero, -1);
}

static void live_drop(struct sfw_atomic *a)
{
	if (a->live)
		atomic_fetch_sub(&g_live, 1);
	a->live = 0;
}

/* Counts a temporary file that may come to exist, unless an interrupt came
 * first (then nothing is created). */
static enum sfw_status live_take(struct sfw_atomic *a, const char *shown, struct sfw_err *err)
{
	a->live = 0;
	for (int v = atomic_load(&g_live);;) {
		if (v < 0 || (g_cancel && *g_cancel))
			return sfw_fail(err, SFW_E_ABORTED, "interrupted before writing '%s'", shown);
		if (atomic_compare_exchange_weak(&g_live, &v, v + 1))
			break;
	}
	a->live = 1;
	return SFW_OK;
}

enum sfw_status sfw_atomic_open(struct sfw_atomic *a, const char *path, struct sfw_err *err)
{
	a->fd = -1;
	a->dfd = -1;
	a->name = a->tmpname = NULL;
	a->tmp = NULL;
	a->path = NULL;
	if (live_take(a, path, err) != SFW_OK)
		return SFW_E_ABORTED;
	a->path = sfw_strdup(path);
	size_t n = strlen(path) + 64;
	a->tmp = sfw_malloc(n);
	if (!a->path || !a->tmp) {
		sfw_atomic_abort(a);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	for (int tries = 0; tries < 100; tries++) {
		snprintf(a->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
		a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (a->fd >= 0) {
			/* a replaced file keeps its permission bits (a 0600 one
			 * must not become readable by others) */
			struct stat old; /* the path itself: a link's target is not what is replaced */
			if (lstat(path, &old) == 0 && S_ISREG(old.st_mode))
				(void)fchmod(a->fd, old.st_mode & 0777);
			return SFW_OK;
		}
		if (errno != EEXIST)
			break;
	}
	enum sfw_status s = sfw_fail(err, SFW_E_IO, "cannot create '%s': %s", a->tmp, strerror(errno));
	sfw_free(a->tmp);
	a->tmp = NULL;
	sfw_atomic_abort(a);
	return s;
}

enum sfw_status sfw_atomic_write(struct sfw_atomic *a, const void *p, size_t n, struct sfw_err *err)
{
	if (g_cancel && *g_cancel)
		return sfw_fail(err, SFW_E_ABORTED, "interrupted while writing '%s'", a->path);
	int fe = sfwi_fault("write", a->name ? a->name : a->path);
	if (fe || sfw_write_all(a->fd, p, n) != 0) {
		int e = fe ? fe : errno;
		/* bytes from a map whose file was truncated: the kernel says
		 * EFAULT where a read would fault; the guard names the file */
		if (e == EFAULT && sfwi_map_guard_efault(p, n))
			return sfw_map_check(err);
		return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s", a->tmp,
				strerror(e));
	}
	return SFW_OK;
}

enum sfw_status sfw_atomic_commit(struct sfw_atomic *a, struct sfw_err *err)
{
	enum sfw_status s = SFW_OK;
	if (fsync(a->fd) != 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot sync '%s': %s", a->tmp, strerror(errno));
		goto fail;
	}
	if (close(a->fd) != 0) {
		a->fd = -1;
		s = sfw_fail(err, SFW_E_IO, "cannot close '%s': %s", a->tmp, strerror(errno));
		goto fail;
	}
	a->fd = -1;
	if (a->dfd >= 0) {
		if ((s = sfw_renameat_checked(a->dfd, a->tmpname, a->dfd, a->name, a->tmp, a->path, err)) != SFW_OK)
			goto fail;
		s = sfw_fsync_dirfd(a->dfd, a->path, err); /* in place; durable once this succeeds */
		sfw_free(a->tmpname);
		a->tmpname = NULL;
		sfw_atomic_abort(a);
		return s;
	}
	if (rename(a->tmp, a->path) != 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot rename '%s' to '%s': %s", a->tmp, a->path, strerror(errno));
		goto fail;
	}
	live_drop(a);
	/* the rename is done: a failure from here on means "in place, but not
	 * yet durable" (file.h) */
	char *dir = dir_of(a->path);
	if (dir) {
		s = sfw_fsync_dir(dir, err);
		sfw_free(dir);
	} else {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory syncing the directory of '%s'", a->path);
	}
	sfw_free(a->tmp);
	sfw_free(a->path);
	a->tmp = a->path = NULL;
	return s;
fail:
	sfw_atomic_abort(a);
	return s;
}

void sfw_atomic_abort(struct sfw_atomic *a)
{
	if (a->fd >= 0)
		close(a->fd);
	if (a->dfd >= 0 && a->tmpname)
		unlinkat(a->dfd, a->tmpname, 0);
	else if (a->dfd < 0 && a->tmp)
		unlink(a->tmp);
	if (a->dfd >= 0)
		close(a->dfd);
	live_drop(a);
	sfw_free(a->tmp);
	sfw_free(a->path);
	sfw_free(a->name);
	sfw_free(a->tmpname);
	a->fd = a->dfd = -1;
	a->tmp = a->path = a->name = a->tmpname = NULL;
}

enum sfw_status sfw_atomic_openat(struct sfw_atomic *a, int dfd, const char *name, const char *shown,
				  struct sfw_err *err)
{
	a->fd = a->dfd = -1;
	a->name = a->tmpname = a->tmp = a->path = NULL;
	if (live_take(a, shown, err) != SFW_OK)
		return SFW_E_ABORTED;
	a->dfd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	size_t n = strlen(name) + 64, sn = strlen(shown) + 64;
	a->name = sfw_strdup(name);
	a->path = sfw_strdup(shown);
	a->tmpname = sfw_malloc(n);
	a->tmp = sfw_malloc(sn);
	if (a->dfd < 0 || !a->name || !a->path || !a->tmpname || !a->tmp) {
		int e = a->dfd < 0 ? errno : ENOMEM;
		sfw_atomic_abort(a);
		return sfw_fail(err, e == ENOMEM ? SFW_E_NOMEM : SFW_E_IO, "cannot write '%s': %s", shown,
				strerror(e));
	}
	for (int tries = 0; tries < 100; tries++) {
		unsigned k = atomic_fetch_add(&tmp_counter, 1);
		snprintf(a->tmpname, n, "%s.tmp.%ld.%u", name, (long)getpid(), k);
		snprintf(a->tmp, sn, "%s.tmp.%ld.%u", shown, (long)getpid(), k);
		a->fd = openat(a->dfd, a->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (a->fd >= 0) {
			struct stat old; /* a replaced file keeps its permission bits */
			if (fstatat(a->dfd, name, &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(old.st_mode))
				(void)fchmod(a->fd, old.st_mode & 0777);
			return SFW_OK;
		}
		if (errno != EEXIST)
			break;
	}
	enum sfw_status s = sfw_fail(err, errno == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot create '%s': %s",
				     a->tmp, strerror(errno));
	sfw_free(a->tmpname);
	a->tmpname = NULL;
	sfw_atomic_abort(a);
	return s;
}

/* Writes n bytes into an opened atomic file and commits it (or removes it). */
static enum sfw_status write_and_commit(struct sfw_atomic *a, enum sfw_status opened, const void *p, size_t n,
					struct sfw_err *err)
{
	if (opened != SFW_OK)
		return opened;
	enum sfw_status s = sfw_atomic_write(a, p, n, err);
	if (s != SFW_OK) {
		sfw_atomic_abort(a);
		return s;
	}
	return sfw_atomic_commit(a, err);
}

enum sfw_status sfw_write_file_atomicat(int dfd, const char *name, const char *shown, const void *p, size_t n,
					struct sfw_err *err)
{
	struct sfw_atomic a;
	return write_and_commit(&a, sfw_atomic_openat(&a, dfd, name, shown, err), p, n, err);
}

enum sfw_status sfw_write_file_atomic(const char *path, const void *p, size_t n, struct sfw_err *err)
{
	struct sfw_atomic a;
	return write_and_commit(&a, sfw_atomic_open(&a, path, err), p, n, err);
}

enum sfw_status sfw_mkdirs(const char *path, struct sfw_err *err)
{
	char *p = sfw_strdup(path);
	if (!p)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t len = strlen(p);
	for (size_t i = 1; i <= len; i++) {
		if (p[i] != '/' && p[i] != '\0')
			continue;
		char saved = p[i];
		p[i] = '\0';
		if (mkdir(p, 0755) != 0 && errno != EEXIST) {
			enum sfw_status s = sfw_fail(err, SFW_E_IO, "cannot create directory '%s': %s", p, strerror(errno));
			sfw_free(p);
			return s;
		}
		struct stat st;
		if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
			enum sfw_status s = sfw_fail(err, SFW_E_IO, "'%s' exists and is not a directory", p);
			sfw_free(p);
			return s;
		}
		p[i] = saved;
	}
	sfw_free(p);
	return SFW_OK;
}
