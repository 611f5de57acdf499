/* file.h - bounded reads, read-only maps and atomic writes.
 *
 * Atomic write protocol: create "<path>.tmp.<pid>.<n>" with O_EXCL|O_NOFOLLOW
 * in the target's directory, write, fsync, rename over <path>, fsync the
 * directory. A failed or abandoned write leaves the target untouched, except
 * a failure syncing the directory after the rename: the new content is then
 * in place but not yet durable. A replaced file keeps its permission bits. */
#ifndef SFW_FILE_H
#define SFW_FILE_H

#include "buf.h"
#include "sfw.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

/* Reads a whole regular file of at most max bytes into out (NUL-terminated). */
SFW_MUST_CHECK enum sfw_status sfw_read_file(const char *path, size_t max, struct sfw_buf *out,
					     struct sfw_err *err);

/* Read-only mapping of a whole file. size 0 files map to data == NULL.
 * The map reads the file as it is now: if another program truncates it in
 * place while it is mapped, a later read past the new end faults (salafw's
 * own writers replace files by rename, which is safe). The fault guard
 * (core/mapguard.c) catches that fault: every map is registered, the first
 * installs a SIGBUS handler (chained to the one before it), and a fault
 * inside a map makes the rest of that map read as zeros and is recorded;
 * a fault anywhere else is the earlier handler's, or the default's. */
struct sfw_map {
	const unsigned char *data;
	uint64_t size;
};
SFW_MUST_CHECK enum sfw_status sfw_map_open(struct sfw_map *m, const char *path, struct sfw_err *err);
void sfw_map_close(struct sfw_map *m);
/* Drops the pages of [p, p + n), which must lie in a read-only map of
 * sfw_map_open, from the resident set (madvise MADV_DONTNEED, widened to
 * whole pages): what is read there later pages in again from the file.
 * For a reader done with a range (an upload, a written tensor); advice
 * only, a failure costs memory, not data. */
void sfw_map_release(const void *p, uint64_t n);

/* How many faults the guard caught (sticky: never reset). */
int sfw_map_faults(void);
/* SFW_OK while no mapped file changed under the process; once one did,
 * SFW_E_IO "'PATH' was truncated while mapped ..." on every call: what was
 * computed from the map is suspect until the process restarts. For the
 * engine to check after each step. */
SFW_MUST_CHECK enum sfw_status sfw_map_check(struct sfw_err *err);
/* The registry (sfw_map_open / sfw_map_close use them). */
void sfwi_map_guard_add(const void *p, uint64_t size, const char *path);
void sfwi_map_guard_remove(const void *p);
/* A system call returned EFAULT for [p, p + n): when that lies in a
 * registered map (a file truncated under it, which the kernel reports so
 * instead of faulting), records it as a fault and returns 1. */
int sfwi_map_guard_efault(const void *p, size_t n);

struct sfw_atomic {
	int fd;
	char *path; /* final name */
	char *tmp;  /* temporary name in the same directory */
	int dfd;    /* sfw_atomic_openat: the directory (its own descriptor), else -1 */
	char *name, *tmpname; /* ... and the names in it */
	int live;   /* the temporary file may exist (counted by sfw_atomic_quiesce) */
};
SFW_MUST_CHECK enum sfw_status sfw_atomic_open(struct sfw_atomic *a, const char *path, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_atomic_write(struct sfw_atomic *a, const void *p, size_t n,
						struct sfw_err *err);
/* fsync, rename over the final name, fsync the directory, release. */
SFW_MUST_CHECK enum sfw_status sfw_atomic_commit(struct sfw_atomic *a, struct sfw_err *err);
/* Removes the temporary file and releases; safe after a failed commit. */
void sfw_atomic_abort(struct sfw_atomic *a);

/* Interrupts (the CLI's SIGINT/SIGTERM handler): once *flag is non-zero,
 * sfw_atomic_open and sfw_atomic_write fail with SFW_E_ABORTED, so the
 * writer's error path removes its temporary file. flag NULL: none.
 * sfw_atomic_quiesce (async-signal-safe) returns 1 when no temporary file
 * exists and none can be created any more (the process may end at once),
 * 0 while one is being written. */
void sfw_atomic_set_cancel(volatile sig_atomic_t *flag);
int sfw_atomic_quiesce(void);

/* One-shot atomic write of a buffer. */
SFW_MUST_CHECK enum sfw_status sfw_write_file_atomic(const char *path, const void *p, size_t n,
						     struct sfw_err *err);

/* write()/pwrite()/pread() loops that retry on EINTR and short counts. */
SFW_MUST_CHECK int sfw_write_all(int fd, const void *p, size_t n);
SFW_MUST_CHECK int sfw_pwrite_all(int fd, const void *p, size_t n, uint64_t off);
/* Returns bytes read (short only at EOF) or -1. */
SFW_MUST_CHECK long long sfw_pread_full(int fd, void *p, size_t n, uint64_t off);

/* mkdir -p with mode 0755; every existing component must be a directory. */
SFW_MUST_CHECK enum sfw_status sfw_mkdirs(const char *path, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_fsync_dir(const char *dir, struct sfw_err *err);

/* ---- directory descriptors (core/dirfd.c) --------------------------------
 * Every write under a destination tree goes through descriptors opened from
 * its root down, one segment at a time with O_NOFOLLOW | O_DIRECTORY: a
 * symlink (or a file) planted where a folder is expected is refused with
 * SFW_E_PATH ("unsafe path: ..."), never followed, and names are resolved
 * against an open descriptor, never as a path string a second time. `shown`
 * is how messages name the directory. */
#define SFW_DIR_CREATE 1 /* make missing segments (mode 0755) */
#define SFW_DIR_OWNED 2  /* the last segment must belong to the effective user */
/* The root itself, as the caller named it (the one path that is followed). */
SFW_MUST_CHECK enum sfw_status sfw_dir_open(const char *path, int *fd, struct sfw_err *err);
/* The folder rel ("a/b", no "." or ".." segments) under dfd; "" gives a new
 * descriptor for dfd itself. */
SFW_MUST_CHECK enum sfw_status sfw_dir_openat(int dfd, const char *shown, const char *rel, int flags, int *out,
					      struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_fsync_dirfd(int dfd, const char *shown, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_renameat_checked(int from_dfd, const char *from, int to_dfd, const char *to,
						    const char *shown_from, const char *shown_to,
						    struct sfw_err *err);
/* The atomic write protocol inside an open directory: name is one entry of
 * dfd (the temporary beside it), shown names the final file in messages. */
SFW_MUST_CHECK enum sfw_status sfw_atomic_openat(struct sfw_atomic *a, int dfd, const char *name,
						 const char *shown, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_write_file_atomicat(int dfd, const char *name, const char *shown, const void *p,
						       size_t n, struct sfw_err *err);
/* sfw_read_file of one entry of dfd, refusing a symlink (O_NOFOLLOW). */
SFW_MUST_CHECK enum sfw_status sfw_read_fileat(int dfd, const char *name, const char *shown, size_t max,
					       struct sfw_buf *out, struct sfw_err *err);
/* Fault injection for tests: when set, sfw_atomic_write ("write"),
 * sfw_renameat_checked ("rename", so also the commit of sfw_atomic_openat)
 * and the folders sfw_dir_openat makes ("mkdir") ask it first, with the
 * entry concerned; a non-zero errno it returns is reported as if the call
 * had failed with it (ENOSPC: a full disk), and a hook that exits there
 * is a kill at that instant. NULL (the default) costs one test. */
extern int (*sfwi_fault_hook)(const char *op, const char *name);
int sfwi_fault(const char *op, const char *name);

/* "a" + "/" + "b" into a fresh string (sfw_free), NULL on NOMEM. */
char *sfw_path_join(const char *a, const char *b);

#endif
