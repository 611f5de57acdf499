/* cli/promptcache.c - `salafw run --prompt-cache FILE` (llama.cpp's flag):
 * the context's state after the prompt (runner/runner.h,
 * sfw_ctx_state_save; the bytes: runner/ctxstate.h) kept in FILE, and the
 * policy around the file, which the library leaves to its caller:
 *
 *   - bound to the model: a verified model's manifest sha256 (its files are
 *     what the gate just checked against their recorded state), or for an
 *     unverified one (--no-verify) the identity of the files the model
 *     reads (config.json and the safetensors: name, size, device, inode,
 *     mtime and ctime, the record sfw_state_check compares; nothing is
 *     hashed), with the device and the CUDA kernel choices;
 *   - read only when FILE is a regular file opened without following a
 *     symlink; a symlink or another kind of file is neither read nor
 *     written (one warning), as the project's readers refuse symlinks and
 *     its writers never write through one;
 *   - a file that does not start as a state file does (a prefix of its
 *     magic, or empty) is someone else's: left alone, with a warning;
 *   - written with the atomic protocol (core/file.h: a temporary beside it,
 *     fsync, rename), so FILE is the old state or the new one, never part.
 * Every problem is one warning line naming FILE (escaped) and the reason;
 * the run then goes on as without the cache. */
#include "cli.h"
#include "alloc.h"
#include "file.h"
#include "log.h"
#include "runner/runner.h"
#include "verify/verify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "SFWCTXST" /* runner/ctxstate.h */

static void warn(const struct cli_pcache *pc, const char *what, const char *why)
{
	char ep[1024], ew[512];
	fprintf(stderr, "%s: warning: prompt cache '%s' %s: %s\n", pc->cmd, sfw_esc(pc->path, ep, sizeof(ep)),
		what, sfw_esc(why, ew, sizeof(ew)));
}

/* The files a model directory's weights are read from. */
static int model_file(const struct dirent *d)
{
	size_t n = strlen(d->d_name);
	return !strcmp(d->d_name, "config.json") || (n > 12 && !strcmp(d->d_name + n - 12, ".safetensors")) ||
	       (n > 23 && !strcmp(d->d_name + n - 23, ".safetensors.index.json"));
}

static void put_u64(struct sfw_sha256 *h, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	sfw_sha256_update(h, b, 8);
}

int cli_pcache_bind(struct cli_pcache *pc, const char *dir, const struct cli_gate_info *gi,
		    const char *device, const struct sfw_model_params *mp)
{
	struct sfw_sha256 h;
	if (sfw_sha256_init(&h) != SFW_OK) {
		warn(pc, "not used", "cannot start a hash");
		return 1;
	}
	static const char tag[] = "salafw prompt cache binding 1\n";
	sfw_sha256_update(&h, tag, sizeof(tag) - 1);
	int rc = 0;
	if (gi->verified) {
		sfw_sha256_update(&h, "manifest ", 9);
		sfw_sha256_update(&h, gi->manifest_sha256, strlen(gi->manifest_sha256));
	} else {
		struct dirent **ents = NULL;
		int n = scandir(dir, &ents, model_file, alphasort);
		if (n < 0) {
			warn(pc, "not used", strerror(errno));
			rc = 1;
		}
		sfw_sha256_update(&h, "files", 5);
		for (int i = 0; i < n; i++) {
			char *p = sfw_path_join(dir, ents[i]->d_name);
			struct stat st;
			/* followed, as the loader opens them */
			if (!p || stat(p, &st) != 0) {
				warn(pc, "not used", p ? strerror(errno) : "out of memory");
				rc = 1;
			} else {
				struct sfw_file_id id;
				sfw_file_id_of(&st, &id);
				sfw_sha256_update(&h, ents[i]->d_name, strlen(ents[i]->d_name) + 1);
				const uint64_t f[] = {id.size, id.dev, id.ino, id.mtime_ns, id.ctime_ns};
				for (size_t k = 0; k < 5; k++)
					put_u64(&h, f[k]);
			}
			sfw_free(p);
			free(ents[i]);
		}
		free(ents);
	}
	char num[96];
	snprintf(num, sizeof(num), "\ndevice %s attn %d stage1 %d kv %d\n", device, mp->be.attn, mp->be.stage1,
		 (int)mp->kv_cache);
	sfw_sha256_update(&h, num, strlen(num));
	sfw_sha256_final(&h, pc->bind);
	sfw_sha256_release(&h);
	return rc;
}

static enum sfw_status fd_read(void *user, void *p, size_t n, size_t *got, struct sfw_err *err)
{
	int fd = *(int *)user;
	*got = 0;
	for (;;) {
		ssize_t k = read(fd, p, n);
		if (k >= 0) {
			*got = (size_t)k;
			return SFW_OK;
		}
		if (errno != EINTR)
			return sfw_fail(err, SFW_E_IO, "cannot read it: %s", strerror(errno));
	}
}

/* Opens FILE for reading as the policy allows: *fd, or -1 with pc->write
 * set as the file's kind decides (after a warning where it is refused). */
static void open_cache(struct cli_pcache *pc, int *fd)
{
	*fd = open(pc->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	pc->write = 0;
	if (*fd < 0) {
		if (errno == ENOENT)
			pc->write = 1; /* made after the prompt */
		else if (errno == ELOOP)
			warn(pc, "not used", "it is a symlink (neither read nor written)");
		else
			warn(pc, "not used", strerror(errno));
		return;
	}
	struct stat st;
	unsigned char head[8];
	long long k = 0;
	if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode))
		warn(pc, "not used", "it is not a regular file (neither read nor written)");
	else if ((k = sfw_pread_full(*fd, head, sizeof(head), 0)) < 0)
		warn(pc, "not used", strerror(errno));
	else if (memcmp(head, MAGIC, (size_t)k) != 0)
		warn(pc, "not used", "it is not a salafw prompt cache (left as it is)");
	else
		pc->write = 1; /* a state file, whole or not: this run's state replaces it */
	if (!pc->write) {
		close(*fd);
		*fd = -1;
	}
}

void cli_pcache_load(struct cli_pcache *pc, struct sfw_ctx *ctx, const int32_t *ids, size_t n)
{
	int fd;
	char ep[1024];
	pc->loaded = 0;
	open_cache(pc, &fd);
	if (fd < 0)
		return;
	struct sfw_err err = {0};
	int64_t got = 0;
	struct stat st;
	double t0 = sfw_now_s(), bytes = fstat(fd, &st) == 0 ? (double)st.st_size : 0;
	enum sfw_status s = sfw_ctx_state_load(ctx, pc->bind, ids, n, fd_read, &fd, &got, &err);
	close(fd);
	if (s != SFW_OK) {
		warn(pc, "ignored", err.msg[0] ? err.msg : sfw_strerror(s));
		return;
	}
	const char *path = sfw_esc(pc->path, ep, sizeof(ep));
	if (got == 0) {
		fprintf(stderr, "%s: prompt cache: '%s' holds another prompt; prefilling this one whole\n",
			pc->cmd, path);
		return;
	}
	pc->loaded = got;
	pc->write = (size_t)got < n; /* the longer prompt replaces it */
	fprintf(stderr, "%s: prompt cache: loaded %lld of %zu prompt tokens from '%s' (%.1f MiB in %.3f s)\n", pc->cmd,
		(long long)got, n, path, bytes / (1 << 20), sfw_now_s() - t0);
}

/* The atomic writer, counting what went through it. */
struct counted {
	struct sfw_atomic *a;
	double bytes;
};

static enum sfw_status atomic_wr(void *user, const void *p, size_t n, struct sfw_err *err)
{
	struct counted *c = user;
	c->bytes += (double)n;
	return sfw_atomic_write(c->a, p, n, err);
}

void cli_pcache_save(void *user, struct sfw_ctx *ctx, const int32_t *ids, size_t n)
{
	struct cli_pcache *pc = user;
	if (!pc->write)
		return;
	struct sfw_atomic a;
	struct sfw_err err = {0};
	struct counted cw = {&a, 0};
	double t0 = sfw_now_s();
	enum sfw_status s = sfw_atomic_open(&a, pc->path, &err);
	if (s == SFW_OK) {
		s = sfw_ctx_state_save(ctx, pc->bind, ids, n, atomic_wr, &cw, &err);
		if (s == SFW_OK)
			s = sfw_atomic_commit(&a, &err);
		if (s != SFW_OK) /* no temporary file stays */
			sfw_atomic_abort(&a);
	}
	if (s != SFW_OK) {
		warn(pc, "not saved", err.msg[0] ? err.msg : sfw_strerror(s));
		return;
	}
	char ep[1024];
	fprintf(stderr, "%s: prompt cache: saved %zu tokens to '%s' (%.1f MiB in %.3f s)\n", pc->cmd, n,
		sfw_esc(pc->path, ep, sizeof(ep)), cw.bytes / (1 << 20), sfw_now_s() - t0);
}
