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
 * place while it is mapped, a later read past the new end raises SIGBUS
 * (salafw's own writers replace files by rename, which is safe). */
struct sfw_map {
	const unsigned char *data;
	uint64_t size;
};
SFW_MUST_CHECK enum sfw_status sfw_map_open(struct sfw_map *m, const char *path, struct sfw_err *err);
void sfw_map_close(struct sfw_map *m);

struct sfw_atomic {
	int fd;
	char *path; /* final name */
	char *tmp;  /* temporary name in the same directory */
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

/* "a" + "/" + "b" into a fresh string (sfw_free), NULL on NOMEM. */
char *sfw_path_join(const char *a, const char *b);

#endif
