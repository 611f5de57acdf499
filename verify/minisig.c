/* minisig.c - minisign public keys, signatures, and the publisher side
 * (unencrypted key pairs, prehashed signing), following docs/fetch-verify.md §1.
 * Every check minisign 0.11/0.12 makes is made here, in the same order. */
#include "verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PUBKEY_BYTES 42
#define SIG_BYTES 74
#define SECKEY_BYTES 158
#define UNTRUSTED_PREFIX "untrusted comment: "
#define TRUSTED_PREFIX "trusted comment: "
#define COMMENT_MAX 1024 /* minisign's line-1 buffer, line ending included */
#define TRUSTED_MAX 8192 /* minisign's trusted-comment buffer, prefix included */

/* The signed-weights service's key (manifests/freeweights.pub; key id 2DC28CC7B26A283B). */
static const char pinned_b64[] = "RWQ7KGqyx4zCLXtUFOqvfv8L3g+8fpKJ1FsuxPyOYMF+4KufbUxKq1Oq";

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_ok;
static void sodium_init_once(void)
{
	sodium_ok = sodium_init() >= 0;
}

int sfwi_sodium_ready(void)
{
	pthread_once(&sodium_once, sodium_init_once);
	return sodium_ok ? 0 : -1;
}

/* Strict standard base64 with padding: whole input consumed, exact length. */
static int b64_decode_exact(const char *s, size_t len, unsigned char *out, size_t want)
{
	size_t got = 0;
	if (len % 4 != 0)
		return -1;
	if (sodium_base642bin(out, want, s, len, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) != 0)
		return -1;
	return got == want ? 0 : -1;
}

static char *b64_encode(const unsigned char *in, size_t n)
{
	size_t len = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
	char *out = sfw_malloc(len);
	if (out)
		sodium_bin2base64(out, len, in, n, sodium_base64_VARIANT_ORIGINAL);
	return out;
}

void sfw_pubkey_id_hex(const unsigned char key_id[8], char out[17])
{
	static const char digits[] = "0123456789ABCDEF";
	for (int i = 0; i < 8; i++) {
		unsigned char b = key_id[7 - i];
		out[2 * i] = digits[b >> 4];
		out[2 * i + 1] = digits[b & 15];
	}
	out[16] = '\0';
}

/* Splits text into lines the way minisign's trim() sees them: one trailing
 * LF removed, then at most one CR; a CR anywhere else makes the line bad. */
struct line {
	const char *p;
	size_t len;
	int bad_cr;
};

static size_t split_lines(const char *text, size_t len, struct line *lines, size_t max, size_t *consumed)
{
	size_t n = 0, i = 0;
	while (i < len && n < max) {
		const char *nl = memchr(text + i, '\n', len - i);
		size_t end = nl ? (size_t)(nl - text) : len;
		struct line l = {text + i, end - i, 0};
		if (l.len && l.p[l.len - 1] == '\r')
			l.len--;
		if (memchr(l.p, '\r', l.len))
			l.bad_cr = 1;
		lines[n++] = l;
		i = nl ? end + 1 : len;
	}
	*consumed = i;
	return n;
}

static int starts_with(const struct line *l, const char *prefix)
{
	size_t n = strlen(prefix);
	return l->len >= n && memcmp(l->p, prefix, n) == 0;
}

/* minisign (after 0.12): tab allowed; C0 controls, DEL and C1 rejected; UTF-8. */
static int comment_printable(const char *s, size_t n)
{
	if (!sfw_utf8_valid((const unsigned char *)s, n))
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return 0;
		/* C1 controls U+0080..U+009F are encoded C2 80..C2 9F */
		if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
		    (unsigned char)s[i + 1] <= 0x9F)
			return 0;
	}
	return 1;
}

enum sfw_status sfwi_minisig_parse(const char *text, size_t len, const char *name, struct sfwi_minisig *out,
				   struct sfw_err *err)
{
	if (sfwi_sodium_ready() != 0)
		return sfw_fail(err, SFW_E_IO, "libsodium could not be initialised");
	if (len > SFW_MINISIG_MAX)
		return sfw_fail(err, SFW_E_SIG, "signature '%s' is too large (%zu bytes, limit %u)", name,
				len, SFW_MINISIG_MAX);
	if (memchr(text, '\0', len))
		return sfw_fail(err, SFW_E_SIG, "signature '%s' contains a NUL byte", name);
	struct line l[5];
	size_t used = 0;
	size_t n = split_lines(text, len, l, 5, &used);
	if (n < 1 || len == 0)
		return sfw_fail(err, SFW_E_SIG, "signature '%s' is empty", name);
	if (l[0].len + 1 >= COMMENT_MAX || l[0].bad_cr)
		return sfw_fail(err, SFW_E_SIG, "signature '%s': untrusted comment too long", name);
	if (!starts_with(&l[0], UNTRUSTED_PREFIX))
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': line 1 should start with '" UNTRUSTED_PREFIX "'", name);
	if (n < 2)
		return sfw_fail(err, SFW_E_SIG, "signature '%s' has 1 line, expected 4", name);
	if (l[1].len > 100 || l[1].bad_cr)
		return sfw_fail(err, SFW_E_SIG, "signature '%s': signature line too long", name);
	if (n < 3)
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s' has 2 lines, expected 4 (trusted comment not present)", name);
	if (!starts_with(&l[2], TRUSTED_PREFIX))
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': line 3 should start with '" TRUSTED_PREFIX "'", name);
	if (l[2].len + 1 >= TRUSTED_MAX || l[2].bad_cr)
		return sfw_fail(err, SFW_E_SIG, "signature '%s': trusted comment too long", name);
	const char *tc = l[2].p + strlen(TRUSTED_PREFIX);
	size_t tclen = l[2].len - strlen(TRUSTED_PREFIX);
	if (!comment_printable(tc, tclen))
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': trusted comment contains unprintable characters", name);
	if (n < 4)
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s' has 3 lines, expected 4 (global signature missing)", name);
	/* minisign ignores what follows line 4; a signature file it writes never
	 * has anything there, so refuse it rather than leave it unexplained. */
	if (n > 4 || used < len)
		return sfw_fail(err, SFW_E_SIG, "signature '%s' has more than 4 lines", name);
	unsigned char raw[SIG_BYTES];
	if (l[1].bad_cr || b64_decode_exact(l[1].p, l[1].len, raw, SIG_BYTES) != 0)
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': line 2 is not the base64 of a 74-byte signature", name);
	if (!((raw[0] == 'E' && raw[1] == 'd') || (raw[0] == 'E' && raw[1] == 'D')))
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': unsupported signature algorithm (0x%02x%02x)", name, raw[0],
				raw[1]);
	if (l[3].bad_cr || b64_decode_exact(l[3].p, l[3].len, out->global_sig, 64) != 0)
		return sfw_fail(err, SFW_E_SIG,
				"signature '%s': line 4 is not the base64 of a 64-byte global signature",
				name);
	memcpy(out->alg, raw, 2);
	memcpy(out->key_id, raw + 2, 8);
	memcpy(out->sig, raw + 10, 64);
	memcpy(out->trusted_comment, tc, tclen);
	out->trusted_comment[tclen] = '\0';
	out->trusted_len = tclen;
	return SFW_OK;
}

enum sfw_status sfw_minisig_verify(const void *msg, size_t msg_len, const char *sig_text, size_t sig_len,
				   const char *sig_name, const struct sfw_pubkey *key, int require_prehashed,
				   struct sfw_minisig_info *info, struct sfw_err *err)
{
	struct sfwi_minisig *ms = sfw_malloc(sizeof(*ms));
	if (!ms)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status s = sfwi_minisig_parse(sig_text, sig_len, sig_name, ms, err);
	if (s != SFW_OK)
		goto out;
	int prehashed = ms->alg[1] == 'D';
	if (require_prehashed && !prehashed) {
		s = sfw_fail(err, SFW_E_SIG, "signature '%s': legacy (non-prehashed) signature found",
			     sig_name);
		goto out;
	}
	if (memcmp(ms->key_id, key->key_id, 8) != 0) {
		char a[17], b[17];
		sfw_pubkey_id_hex(ms->key_id, a);
		sfw_pubkey_id_hex(key->key_id, b);
		s = sfw_fail(err, SFW_E_KEYID, "signature '%s' was made by key %s, but the trusted key is %s",
			     sig_name, a, b);
		goto out;
	}
	int bad;
	if (prehashed) {
		unsigned char h[crypto_generichash_BYTES_MAX];
		crypto_generichash(h, sizeof(h), msg, msg_len, NULL, 0);
		bad = crypto_sign_verify_detached(ms->sig, h, sizeof(h), key->pk);
	} else {
		bad = crypto_sign_verify_detached(ms->sig, msg, msg_len, key->pk);
	}
	if (bad) {
		s = sfw_fail(err, SFW_E_SIG, "signature '%s' does not match the signed file", sig_name);
		goto out;
	}
	unsigned char gmsg[64 + sizeof(ms->trusted_comment)];
	memcpy(gmsg, ms->sig, 64);
	memcpy(gmsg + 64, ms->trusted_comment, ms->trusted_len);
	if (crypto_sign_verify_detached(ms->global_sig, gmsg, 64 + ms->trusted_len, key->pk) != 0) {
		s = sfw_fail(err, SFW_E_SIG, "signature '%s': trusted comment signature verification failed",
			     sig_name);
		goto out;
	}
	if (info) {
		info->prehashed = prehashed;
		memcpy(info->key_id, ms->key_id, 8);
		memcpy(info->trusted_comment, ms->trusted_comment, ms->trusted_len + 1);
	}
out:
	sodium_memzero(ms, sizeof(*ms));
	sfw_free(ms);
	return s;
}

/* ---- public keys --------------------------------------------------------- */

enum sfw_status sfw_pubkey_parse(const char *text, size_t len, const char *what, struct sfw_pubkey *out,
				 struct sfw_err *err)
{
	if (sfwi_sodium_ready() != 0)
		return sfw_fail(err, SFW_E_IO, "libsodium could not be initialised");
	if (len > 4096 || memchr(text, '\0', len))
		return sfw_fail(err, SFW_E_SIG, "%s is not a minisign public key", what);
	struct line l[3];
	size_t used = 0;
	size_t n = split_lines(text, len, l, 3, &used);
	const struct line *b64;
	/* One line: the -P form. Two lines: comment (ignored, as minisign does) + key. */
	if (n == 1)
		b64 = &l[0];
	else if (n == 2)
		b64 = &l[1];
	else
		return sfw_fail(err, SFW_E_SIG, "%s is not a minisign public key (expected 1 or 2 lines)",
				what);
	unsigned char raw[PUBKEY_BYTES];
	if (b64->bad_cr || b64_decode_exact(b64->p, b64->len, raw, PUBKEY_BYTES) != 0)
		return sfw_fail(err, SFW_E_SIG,
				"%s: base64 conversion failed - was an actual public key given?", what);
	if (raw[0] != 'E' || raw[1] != 'd')
		return sfw_fail(err, SFW_E_SIG, "%s: unsupported signature algorithm (0x%02x%02x)", what,
				raw[0], raw[1]);
	memcpy(out->key_id, raw + 2, 8);
	memcpy(out->pk, raw + 10, 32);
	return SFW_OK;
}

enum sfw_status sfw_pubkey_load(const char *path, struct sfw_pubkey *out, struct sfw_err *err)
{
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(path, 4096, &b, err);
	if (s == SFW_E_MISSING && err)
		err->code = SFW_E_IO; /* a missing key file is a local problem, not a missing model file */
	if (s != SFW_OK)
		return s == SFW_E_RANGE	    ? sfw_fail(err, SFW_E_SIG, "public key '%s' is too large", path)
		       : s == SFW_E_MISSING ? SFW_E_IO
					    : s;
	char what[300];
	snprintf(what, sizeof(what), "public key '%s'", path);
	s = sfw_pubkey_parse(b.data, b.len, what, out, err);
	sfw_buf_release(&b);
	return s;
}

void sfw_pubkey_pinned(struct sfw_pubkey *out)
{
	SFW_ASSERT(sfwi_sodium_ready() == 0);
	SFW_ASSERT(sfw_pubkey_parse(pinned_b64, sizeof(pinned_b64) - 1, "pinned key", out, NULL) == SFW_OK);
}

/* ---- publisher side -------------------------------------------------------- */

static enum sfw_status write_private(const char *path, const void *p, size_t n, int secret,
				     struct sfw_err *err)
{
	struct sfw_atomic a;
	enum sfw_status s = sfw_atomic_open(&a, path, err);
	if (s != SFW_OK)
		return s;
	if (secret && fchmod(a.fd, 0600) != 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot restrict permissions of '%s': %s", a.tmp,
			     strerror(errno));
		sfw_atomic_abort(&a);
		return s;
	}
	s = sfw_atomic_write(&a, p, n, err);
	if (s != SFW_OK) {
		sfw_atomic_abort(&a);
		return s;
	}
	return sfw_atomic_commit(&a, err);
}

static void seckey_checksum(const unsigned char key_id[8], const unsigned char sk[64], unsigned char out[32])
{
	crypto_generichash_state st;
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, (const unsigned char *)"Ed", 2);
	crypto_generichash_update(&st, key_id, 8);
	crypto_generichash_update(&st, sk, 64);
	crypto_generichash_final(&st, out, 32);
}

/* "untrusted comment: minisign public key ID\n<base64>\n" */
static enum sfw_status pub_text(const unsigned char key_id[8], const unsigned char pk[32], struct sfw_buf *out)
{
	unsigned char pub[PUBKEY_BYTES];
	memcpy(pub, "Ed", 2);
	memcpy(pub + 2, key_id, 8);
	memcpy(pub + 10, pk, 32);
	char id[17], *pb = b64_encode(pub, sizeof(pub));
	sfw_pubkey_id_hex(key_id, id);
	enum sfw_status s =
	    pb ? sfw_buf_printf(out, "untrusted comment: minisign public key %s\n%s\n", id, pb) : SFW_E_NOMEM;
	sfw_free(pb);
	return s;
}

void sfw_seckey_pubkey(const struct sfw_seckey *sk, struct sfw_pubkey *out)
{
	memcpy(out->key_id, sk->key_id, 8);
	memcpy(out->pk, sk->sk + 32, 32); /* an Ed25519 secret key ends with its public key */
}

enum sfw_status sfw_pubkey_write(const char *path, const struct sfw_pubkey *pk, struct sfw_err *err)
{
	struct sfw_buf t;
	sfw_buf_init(&t, 4096);
	enum sfw_status s = pub_text(pk->key_id, pk->pk, &t);
	s = s == SFW_OK ? write_private(path, t.data, t.len, 0, err) : sfw_fail(err, s, "out of memory");
	sfw_buf_release(&t);
	return s;
}

/* Both files of a pair written to temporary names first (a full disk or an
 * error leaves neither), then the public key renamed into place, then the
 * secret key: the secret one never stands without its public half (only a
 * kill between the renames leaves a lone .pub, which holds no secret). */
static enum sfw_status write_pair(const char *pub_path, const struct sfw_buf *pt, const char *sec_path,
				  const struct sfw_buf *stx, struct sfw_err *err)
{
	struct sfw_atomic ap, as;
	enum sfw_status s = sfw_atomic_open(&as, sec_path, err);
	if (s != SFW_OK)
		return s;
	if (fchmod(as.fd, 0600) != 0) {
		s = sfw_fail(err, SFW_E_IO, "cannot restrict permissions of '%s': %s", as.tmp, strerror(errno));
		sfw_atomic_abort(&as);
		return s;
	}
	if ((s = sfw_atomic_write(&as, stx->data, stx->len, err)) != SFW_OK ||
	    (s = sfw_atomic_open(&ap, pub_path, err)) != SFW_OK) {
		sfw_atomic_abort(&as);
		return s;
	}
	if ((s = sfw_atomic_write(&ap, pt->data, pt->len, err)) != SFW_OK ||
	    (s = sfw_atomic_commit(&ap, err)) != SFW_OK) {
		sfw_atomic_abort(&ap);
		sfw_atomic_abort(&as);
		return s;
	}
	if ((s = sfw_atomic_commit(&as, err)) != SFW_OK) {
		sfw_atomic_abort(&as);
		unlink(pub_path); /* the pair is one unit: no new public key without its secret */
	}
	return s;
}

enum sfw_status sfw_keygen(const char *pub_path, const char *sec_path, int force, struct sfw_err *err)
{
	if (sfwi_sodium_ready() != 0)
		return sfw_fail(err, SFW_E_IO, "libsodium could not be initialised");
	struct stat st;
	if (!force && lstat(sec_path, &st) == 0)
		return sfw_fail(err, SFW_E_EXISTS, "secret key '%s' already exists (use --force to overwrite it)",
				sec_path);
	if (!force && lstat(pub_path, &st) == 0)
		return sfw_fail(err, SFW_E_EXISTS, "public key '%s' already exists (use --force to overwrite it)",
				pub_path);
	unsigned char sec[SECKEY_BYTES];
	unsigned char key_id[8], pk[32], sk[64];
	crypto_sign_keypair(pk, sk);
	randombytes_buf(key_id, sizeof(key_id));
	memset(sec, 0, sizeof(sec));
	memcpy(sec, "Ed", 2); /* KDF tag stays 00 00: unencrypted, like minisign -W */
	memcpy(sec + 4, "B2", 2);
	memcpy(sec + 54, key_id, 8);
	memcpy(sec + 62, sk, 64);
	seckey_checksum(key_id, sk, sec + 126);
	char id[17];
	sfw_pubkey_id_hex(key_id, id);
	char *sb = b64_encode(sec, sizeof(sec));
	struct sfw_buf pt, stx;
	sfw_buf_init(&pt, 4096);
	sfw_buf_init(&stx, 4096);
	enum sfw_status s = SFW_E_NOMEM;
	if (sb && pub_text(key_id, pk, &pt) == SFW_OK &&
	    sfw_buf_printf(&stx, "untrusted comment: salafw unencrypted secret key %s\n%s\n", id, sb) ==
		SFW_OK)
		s = SFW_OK;
	else
		sfw_fail(err, s, "out of memory");
	if (s == SFW_OK)
		s = write_pair(pub_path, &pt, sec_path, &stx, err);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(sec, sizeof(sec));
	if (sb)
		sodium_memzero(sb, strlen(sb));
	if (stx.data)
		sodium_memzero(stx.data, stx.len);
	sfw_free(sb);
	sfw_buf_release(&pt);
	sfw_buf_release(&stx);
	return s;
}

enum sfw_status sfw_seckey_load(const char *path, struct sfw_seckey *out, struct sfw_err *err)
{
	if (sfwi_sodium_ready() != 0)
		return sfw_fail(err, SFW_E_IO, "libsodium could not be initialised");
	struct sfw_buf b;
	enum sfw_status s = sfw_read_file(path, 4096, &b, err);
	if (s == SFW_E_MISSING) {
		if (err)
			err->code = SFW_E_IO;
		return SFW_E_IO;
	}
	if (s != SFW_OK)
		return s;
	struct line l[3];
	size_t used = 0;
	size_t n = split_lines(b.data, b.len, l, 3, &used);
	unsigned char raw[SECKEY_BYTES];
	s = SFW_OK;
	if (n != 2 || b64_decode_exact(l[1].p, l[1].len, raw, SECKEY_BYTES) != 0)
		s = sfw_fail(err, SFW_E_FORMAT, "secret key '%s' is not a minisign secret key", path);
	sodium_memzero(b.data, b.len);
	sfw_buf_release(&b);
	if (s != SFW_OK)
		return s;
	if (raw[0] != 'E' || raw[1] != 'd' || raw[4] != 'B' || raw[5] != '2')
		s = sfw_fail(err, SFW_E_UNSUPPORTED, "secret key '%s': unsupported algorithm", path);
	else if (raw[2] != 0 || raw[3] != 0)
		s = sfw_fail(
		    err, SFW_E_UNSUPPORTED,
		    "secret key '%s' is encrypted; make an unencrypted one (salafw keygen or minisign -G -W)",
		    path);
	if (s == SFW_OK) {
		memcpy(out->key_id, raw + 54, 8);
		memcpy(out->sk, raw + 62, 64);
		/* minisign leaves the checksum zero for -W keys; a non-zero one must match. */
		unsigned char sum[32], zero[32] = {0};
		seckey_checksum(out->key_id, out->sk, sum);
		if (sodium_memcmp(raw + 126, zero, 32) != 0 && sodium_memcmp(raw + 126, sum, 32) != 0)
			s = sfw_fail(err, SFW_E_FORMAT, "secret key '%s': checksum mismatch", path);
		/* The public half stored in sk must be the one its seed gives. */
		unsigned char pk[32], sk2[64];
		crypto_sign_seed_keypair(pk, sk2, out->sk);
		if (s == SFW_OK && sodium_memcmp(pk, out->sk + 32, 32) != 0)
			s = sfw_fail(err, SFW_E_FORMAT, "secret key '%s' is inconsistent", path);
		sodium_memzero(sk2, sizeof(sk2));
	}
	sodium_memzero(raw, sizeof(raw));
	if (s != SFW_OK)
		sodium_memzero(out, sizeof(*out));
	return s;
}

static enum sfw_status write_sig(const unsigned char *h, size_t hlen, const char *file, const struct sfw_seckey *key,
				 const char *trusted_comment, struct sfw_err *err);

static enum sfw_status check_comment(const char *trusted_comment, struct sfw_err *err)
{
	if (sfwi_sodium_ready() != 0)
		return sfw_fail(err, SFW_E_IO, "libsodium could not be initialised");
	size_t tclen = strlen(trusted_comment);
	if (tclen + strlen(TRUSTED_PREFIX) + 2 >= TRUSTED_MAX || !comment_printable(trusted_comment, tclen))
		return sfw_fail(err, SFW_E_INVAL, "trusted comment must be one printable line under 8 KiB");
	return SFW_OK;
}

enum sfw_status sfw_sign_bytes(const void *data, size_t len, const char *file, const struct sfw_seckey *key,
			       const char *trusted_comment, struct sfw_err *err)
{
	enum sfw_status s = check_comment(trusted_comment, err);
	if (s != SFW_OK)
		return s;
	unsigned char h[crypto_generichash_BYTES_MAX];
	crypto_generichash(h, sizeof(h), data, len, NULL, 0);
	return write_sig(h, sizeof(h), file, key, trusted_comment, err);
}

enum sfw_status sfw_sign_file(const char *file, const struct sfw_seckey *key, const char *trusted_comment,
			      struct sfw_err *err)
{
	enum sfw_status cs = check_comment(trusted_comment, err);
	if (cs != SFW_OK)
		return cs;
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", file, /* exit 5, not 1 (a hash mismatch) */
				strerror(errno));
	crypto_generichash_state st;
	crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES_MAX);
	unsigned char *buf = sfw_malloc(1 << 16);
	if (!buf) {
		close(fd);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	for (;;) {
		ssize_t n = read(fd, buf, 1 << 16);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			sfw_free(buf);
			close(fd);
			return sfw_fail(err, SFW_E_IO, "cannot read '%s': %s", file, strerror(e));
		}
		if (n == 0)
			break;
		crypto_generichash_update(&st, buf, (size_t)n);
	}
	sfw_free(buf);
	close(fd);
	unsigned char h[crypto_generichash_BYTES_MAX];
	crypto_generichash_final(&st, h, sizeof(h));
	return write_sig(h, sizeof(h), file, key, trusted_comment, err);
}

/* "<file>.minisig" for the BLAKE2b-512 hash h of file's bytes. */
static enum sfw_status write_sig(const unsigned char *h, size_t hlen, const char *file, const struct sfw_seckey *key,
				 const char *trusted_comment, struct sfw_err *err)
{
	size_t tclen = strlen(trusted_comment);
	unsigned char raw[SIG_BYTES];
	memcpy(raw, "ED", 2);
	memcpy(raw + 2, key->key_id, 8);
	crypto_sign_detached(raw + 10, NULL, h, hlen, key->sk);
	unsigned char *gmsg = sfw_malloc(64 + tclen);
	if (!gmsg)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	memcpy(gmsg, raw + 10, 64);
	memcpy(gmsg + 64, trusted_comment, tclen);
	unsigned char gsig[64];
	crypto_sign_detached(gsig, NULL, gmsg, 64 + tclen, key->sk);
	sfw_free(gmsg);

	char *s1 = b64_encode(raw, sizeof(raw)), *s2 = b64_encode(gsig, sizeof(gsig));
	char *out_path = NULL;
	size_t pl = strlen(file) + 9;
	struct sfw_buf text;
	sfw_buf_init(&text, SFW_MINISIG_MAX);
	enum sfw_status s = SFW_E_NOMEM;
	if (s1 && s2 && (out_path = sfw_malloc(pl)) &&
	    sfw_buf_printf(
		&text, "untrusted comment: signature from salafw secret key\n%s\n" TRUSTED_PREFIX "%s\n%s\n",
		s1, trusted_comment, s2) == SFW_OK) {
		snprintf(out_path, pl, "%s.minisig", file);
		s = sfw_write_file_atomic(out_path, text.data, text.len, err);
	} else {
		sfw_fail(err, s, "out of memory");
	}
	sfw_free(s1);
	sfw_free(s2);
	sfw_free(out_path);
	sfw_buf_release(&text);
	return s;
}
