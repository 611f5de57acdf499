/* sha256.c - SHA-256 through OpenSSL EVP (SHA-NI when the CPU has it), whole
 * files with large sequential reads, and hex. */
#include "verify.h"

#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 256 KiB: large enough that syscalls cost nothing, small enough to stay in
 * a core's L2 between read() copying it and SHA-256 consuming it. */
#define HASH_BUF (256u << 10)

enum sfw_status sfw_sha256_init(struct sfw_sha256 *h)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	h->ctx = c;
	if (!c)
		return SFW_E_NOMEM;
	if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(c);
		h->ctx = NULL;
		return SFW_E_NOMEM;
	}
	return SFW_OK;
}

void sfw_sha256_update(struct sfw_sha256 *h, const void *p, size_t n)
{
	/* EVP_DigestUpdate cannot fail for an initialised SHA-256 context. */
	if (n)
		SFW_ASSERT(EVP_DigestUpdate((EVP_MD_CTX *)h->ctx, p, n) == 1);
}

void sfw_sha256_final(struct sfw_sha256 *h, unsigned char out[32])
{
	unsigned int len = 0;
	SFW_ASSERT(EVP_DigestFinal_ex((EVP_MD_CTX *)h->ctx, out, &len) == 1 && len == 32);
}

void sfw_sha256_release(struct sfw_sha256 *h)
{
	EVP_MD_CTX_free((EVP_MD_CTX *)h->ctx);
	h->ctx = NULL;
}

static enum sfw_status hash_fd(int fd, uint64_t limit, int to_eof, struct sfw_sha256 *h, uint64_t *got,
			       const char *name, struct sfw_err *err)
{
	unsigned char *buf = sfw_malloc_aligned(4096, HASH_BUF);
	if (!buf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory hashing '%s'", name);
	uint64_t done = 0;
	enum sfw_status s = SFW_OK;
	while (to_eof || done < limit) {
		size_t want = HASH_BUF;
		if (!to_eof && limit - done < want)
			want = (size_t)(limit - done);
		ssize_t n = to_eof ? read(fd, buf, want) : pread(fd, buf, want, (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			s = sfw_fail(err, SFW_E_IO, "cannot read '%s': %s", name, strerror(errno));
			break;
		}
		if (n == 0) {
			if (!to_eof)
				s = sfw_fail(err, SFW_E_SIZE, "'%s' ends after %llu bytes, expected %llu",
					     name, (unsigned long long)done, (unsigned long long)limit);
			break;
		}
		sfw_sha256_update(h, buf, (size_t)n);
		done += (uint64_t)n;
	}
	sfw_free(buf);
	*got = done;
	return s;
}

enum sfw_status sfw_sha256_file(const char *path, unsigned char out[32], uint64_t *size, struct sfw_err *err)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (e == ELOOP)
			return sfw_fail(err, SFW_E_PATH, "'%s' is a symlink: refusing to follow it", path);
		return sfw_fail(err, e == ENOENT ? SFW_E_MISSING : SFW_E_IO, "cannot open '%s': %s", path,
				strerror(e));
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sfw_fail(err, SFW_E_IO, "'%s' is not a regular file", path);
	}
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	struct sfw_sha256 h;
	if (sfw_sha256_init(&h) != SFW_OK) {
		close(fd);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory hashing '%s'", path);
	}
	uint64_t n = 0;
	enum sfw_status s = hash_fd(fd, 0, 1, &h, &n, path, err);
	close(fd);
	if (s == SFW_OK)
		sfw_sha256_final(&h, out);
	sfw_sha256_release(&h);
	if (s == SFW_OK && size)
		*size = n;
	return s;
}

enum sfw_status sfw_sha256_fd_prefix(int fd, uint64_t len, struct sfw_sha256 *h, struct sfw_err *err)
{
	uint64_t got = 0;
	return hash_fd(fd, len, 0, h, &got, "partial file", err);
}

void sfw_hex_encode(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int sfw_hex_decode(const char *hex, unsigned char *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!hex[2 * i] || !hex[2 * i + 1])
			return -1;
		int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
		if (a < 0 || b < 0)
			return -1;
		out[i] = (unsigned char)(a << 4 | b);
	}
	return hex[2 * n] == '\0' ? 0 : -1;
}
