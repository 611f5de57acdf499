/* dirfd.c - directory descriptors opened from a tree's root down (file.h):
 * each segment with openat(O_NOFOLLOW | O_DIRECTORY), made with mkdirat when
 * asked, so a symlink planted below the root is refused and never followed,
 * and later writes resolve names against an open descriptor, not a path
 * string that can be swapped between a check and a use. */
#include "file.h"

#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int (*sfwi_fault_hook)(const char *op, const char *name);

int sfwi_fault(const char *op, const char *name)
{
	return sfwi_fault_hook ? sfwi_fault_hook(op, name) : 0;
}

enum sfw_status sfw_dir_open(const char *path, int *fd, struct sfw_err *err)
{
	*fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0)
		return sfw_fail(err, errno == ENOENT ? SFW_E_MISSING : SFW_E_IO, "cannot open directory '%s': %s",
				path, strerror(errno));
	return SFW_OK;
}

/* One segment: name under dfd, a real directory (made if create). */
static enum sfw_status open_seg(int dfd, const char *shown, const char *name, int flags, int *out,
				struct sfw_err *err)
{
	for (int tries = 0;; tries++) {
		int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			struct stat st;
			if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
				close(fd);
				return sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is not a directory", shown);
			}
			if ((flags & SFW_DIR_OWNED) && st.st_uid != geteuid()) {
				close(fd);
				return sfw_fail(err, SFW_E_PATH,
						"unsafe path: '%s' belongs to another user (uid %ld); refusing to "
						"write into it",
						shown, (long)st.st_uid);
			}
			*out = fd;
			return SFW_OK;
		}
		int e = errno;
		if (e == ELOOP || e == ENOTDIR) { /* O_NOFOLLOW met a symlink, or a file */
			struct stat lst;
			int link = e == ELOOP ||
				   (fstatat(dfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode));
			return sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is %s, not a directory", shown,
					link ? "a symlink" : "another kind of file");
		}
		if (e != ENOENT || !(flags & SFW_DIR_CREATE) || tries == 3)
			return sfw_fail(err, e == ENOENT ? SFW_E_MISSING : SFW_E_IO,
					"cannot open directory '%s': %s", shown, strerror(e));
		int fe = sfwi_fault("mkdir", name);
		if (fe || (mkdirat(dfd, name, 0755) != 0 && errno != EEXIST)) {
			e = fe ? fe : errno;
			return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO,
					"cannot create directory '%s': %s", shown, strerror(e));
		}
		/* made (or raced with another maker): open what is there now */
	}
}

enum sfw_status sfw_dir_openat(int dfd, const char *shown, const char *rel, int flags, int *out,
			       struct sfw_err *err)
{
	*out = -1;
	size_t n = strlen(rel), sl = strlen(shown);
	char *buf = sfw_malloc(sl + n + 2);
	if (!buf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	/* buf is shown + "/" + rel, cut after each segment for messages */
	memcpy(buf, shown, sl);
	buf[sl] = '/';
	memcpy(buf + sl + 1, rel, n + 1);
	char *seg = buf + sl + 1;
	int cur = dfd;
	enum sfw_status s = SFW_OK;
	while (*seg) {
		char *slash = strchr(seg, '/');
		if (slash)
			*slash = '\0';
		if (strcmp(seg, ".") == 0 || strcmp(seg, "..") == 0 || !*seg) {
			s = sfw_fail(err, SFW_E_PATH, "unsafe path: '%s' is not a plain folder name", buf);
			break;
		}
		int next;
		/* ownership matters for the last segment, the folder written into */
		int f = slash && slash[1] ? flags & ~SFW_DIR_OWNED : flags;
		s = open_seg(cur, buf, seg, f, &next, err);
		if (s != SFW_OK)
			break;
		if (cur != dfd)
			close(cur);
		cur = next;
		if (!slash)
			break;
		*slash = '/';
		seg = slash + 1;
	}
	if (s != SFW_OK) {
		if (cur != dfd)
			close(cur);
	} else if (cur == dfd) { /* rel was empty: a new descriptor for dfd itself */
		*out = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (*out < 0)
			s = sfw_fail(err, SFW_E_IO, "cannot open directory '%s': %s", shown, strerror(errno));
	} else {
		*out = cur;
	}
	sfw_free(buf);
	return s;
}

enum sfw_status sfw_fsync_dirfd(int dfd, const char *shown, struct sfw_err *err)
{
	/* Some file systems refuse fsync on directories; that is not data loss. */
	if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS)
		return sfw_fail(err, SFW_E_IO, "cannot sync directory '%s': %s", shown, strerror(errno));
	return SFW_OK;
}

enum sfw_status sfw_renameat_checked(int from_dfd, const char *from, int to_dfd, const char *to,
				     const char *shown_from, const char *shown_to, struct sfw_err *err)
{
	int fe = sfwi_fault("rename", to);
	if (fe || renameat(from_dfd, from, to_dfd, to) != 0) {
		int e = fe ? fe : errno;
		return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot rename '%s' to '%s': %s",
				shown_from, shown_to, strerror(e));
	}
	return SFW_OK;
}
