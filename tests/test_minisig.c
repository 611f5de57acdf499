/* modules: verify core */
/* test_minisig - SHA-256 against the FIPS 180-2 vectors, hex, public keys, and
 * minisign signatures made by an independent libsodium fixture writer below
 * (it follows docs/fetch-verify.md §1.3 directly, sharing no code with verify/),
 * including every malformed case the minisign CLI cannot produce. */
#include "check.h"
#include "verify/verify.h"
#include "verify/verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* ---- fixture writer ---------------------------------------------------------- */

struct fkey {
	unsigned char id[8], pk[32], sk[64];
};

static void fkey_make(struct fkey *k, unsigned char seed_byte, const char *id8)
{
	unsigned char seed[32];
	memset(seed, seed_byte, sizeof(seed));
	crypto_sign_seed_keypair(k->pk, k->sk, seed);
	memcpy(k->id, id8, 8);
}

static void b64(const unsigned char *in, size_t n, char *out, size_t outsz)
{
	sodium_bin2base64(out, outsz, in, n, sodium_base64_VARIANT_ORIGINAL);
}

static void fkey_pub_b64(const struct fkey *k, char out[64])
{
	unsigned char raw[42];
	memcpy(raw, "Ed", 2);
	memcpy(raw + 2, k->id, 8);
	memcpy(raw + 10, k->pk, 32);
	b64(raw, 42, out, 64);
}

static void fkey_to_pubkey(const struct fkey *k, struct sfw_pubkey *p)
{
	memcpy(p->key_id, k->id, 8);
	memcpy(p->pk, k->pk, 32);
}

/* Signature file text: alg "ED"/"Ed"/anything; eol "\n" or "\r\n". */
static void make_sig(char *out, size_t outsz, const void *msg, size_t len, const struct fkey *k,
		     const char *alg, const char *comment, const char *eol)
{
	unsigned char raw[74], gsig[64];
	memcpy(raw, alg, 2);
	memcpy(raw + 2, k->id, 8);
	if (alg[1] == 'D') {
		unsigned char h[64];
		crypto_generichash(h, 64, msg, len, NULL, 0);
		crypto_sign_detached(raw + 10, NULL, h, 64, k->sk);
	} else {
		crypto_sign_detached(raw + 10, NULL, msg, len, k->sk);
	}
	size_t cl = strlen(comment);
	unsigned char *g = malloc(64 + cl);
	memcpy(g, raw + 10, 64);
	memcpy(g + 64, comment, cl);
	crypto_sign_detached(gsig, NULL, g, 64 + cl, k->sk);
	free(g);
	char l2[128], l4[128];
	b64(raw, 74, l2, sizeof(l2));
	b64(gsig, 64, l4, sizeof(l4));
	snprintf(out, outsz, "untrusted comment: fixture%s%s%strusted comment: %s%s%s%s", eol, l2, eol,
		 comment, eol, l4, eol);
}

static enum sfw_status verify_text(const char *msg, const char *sig, const struct fkey *k, int req_ph,
				   struct sfw_minisig_info *info, struct sfw_err *err)
{
	struct sfw_pubkey pk;
	fkey_to_pubkey(k, &pk);
	return sfw_minisig_verify(msg, strlen(msg), sig, strlen(sig), "fx.minisig", &pk, req_ph, info, err);
}

/* Replaces line `n` (0-based) of a 4-line signature text. */
static void replace_line(char *sig, size_t sz, int n, const char *with)
{
	char *lines[8];
	int cnt = 0;
	char *copy = strdup(sig);
	for (char *p = strtok(copy, "\n"); p && cnt < 8; p = strtok(NULL, "\n"))
		lines[cnt++] = p;
	size_t o = 0;
	sig[0] = '\0';
	for (int i = 0; i < cnt; i++)
		o += (size_t)snprintf(sig + o, sz - o, "%s\n", i == n ? with : lines[i]);
	free(copy);
}

static void get_line(const char *sig, int n, char *out, size_t sz)
{
	const char *p = sig;
	for (int i = 0; i < n; i++)
		p = strchr(p, '\n') + 1;
	size_t l = strcspn(p, "\n");
	snprintf(out, sz, "%.*s", (int)l, p);
}

#define EXPECT_REJECT(st, want_code, err, needle, descr)                                                     \
	CHECK((st) == (want_code) && strstr((err).msg, (needle)) && strstr((err).msg, "fx.minisig"),         \
	      "%s: got %s, msg '%s'", descr, sfw_strerror(st), (err).msg)

static void test_sha256(void)
{
	static const struct {
		const char *in;
		const char *hex;
	} v[] = {
	    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
	    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
	     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
	};
	for (size_t i = 0; i < 3; i++) {
		struct sfw_sha256 h;
		unsigned char d[32];
		char hex[65];
		CHECK(sfw_sha256_init(&h) == SFW_OK, "sha256 init");
		sfw_sha256_update(&h, v[i].in, strlen(v[i].in));
		sfw_sha256_final(&h, d);
		sfw_sha256_release(&h);
		sfw_hex_encode(d, 32, hex);
		CHECK(strcmp(hex, v[i].hex) == 0, "sha256 vector %zu: %s", i, hex);
	}
	/* One million 'a' through a file (crosses the read-buffer size). */
	char path[300];
	snprintf(path, sizeof(path), "%s/million", tmpdir);
	char *a = malloc(1000000);
	memset(a, 'a', 1000000);
	CHECK(sfw_write_file_atomic(path, a, 1000000, NULL) == SFW_OK, "write million-a file");
	unsigned char d[32];
	uint64_t size = 0;
	char hex[65];
	CHECK(sfw_sha256_file(path, d, &size, NULL) == SFW_OK && size == 1000000, "sha256 of a file");
	sfw_hex_encode(d, 32, hex);
	CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
	      "sha256 million a: %s", hex);
	/* Prefix of an fd: the first 3 bytes of "abc..." file. */
	snprintf(path, sizeof(path), "%s/abcfile", tmpdir);
	CHECK(sfw_write_file_atomic(path, "abcdef", 6, NULL) == SFW_OK, "write abcdef");
	FILE *f = fopen(path, "rb");
	struct sfw_sha256 h;
	CHECK(f && sfw_sha256_init(&h) == SFW_OK, "open prefix");
	CHECK(sfw_sha256_fd_prefix(fileno(f), 3, &h, NULL) == SFW_OK, "hash prefix");
	sfw_sha256_final(&h, d);
	sfw_sha256_release(&h);
	sfw_hex_encode(d, 32, hex);
	CHECK(strcmp(hex, v[1].hex) == 0, "prefix hash equals sha256('abc')");
	CHECK(sfw_sha256_init(&h) == SFW_OK, "init");
	struct sfw_err err = {0};
	CHECK(sfw_sha256_fd_prefix(fileno(f), 100, &h, &err) == SFW_E_SIZE,
	      "prefix past EOF is a size error");
	sfw_sha256_release(&h);
	fclose(f);
	struct sfw_err e2 = {0};
	snprintf(path, sizeof(path), "%s/nope", tmpdir);
	CHECK(sfw_sha256_file(path, d, NULL, &e2) == SFW_E_MISSING && strstr(e2.msg, "nope"),
	      "missing file: %s", e2.msg);
	free(a);
}

static void test_hex(void)
{
	unsigned char in[4] = {0x00, 0x9f, 0xab, 0xff}, out[4];
	char hex[9];
	sfw_hex_encode(in, 4, hex);
	CHECK(strcmp(hex, "009fabff") == 0, "hex encode %s", hex);
	CHECK(sfw_hex_decode("009fabff", out, 4) == 0 && memcmp(in, out, 4) == 0, "hex decode");
	CHECK(sfw_hex_decode("009FABFF", out, 4) != 0, "upper-case hex refused");
	CHECK(sfw_hex_decode("009fab", out, 4) != 0, "short hex refused");
	CHECK(sfw_hex_decode("009fabff0", out, 4) != 0, "long hex refused");
	CHECK(sfw_hex_decode("009fabfg", out, 4) != 0, "non-hex refused");
}

static void test_pubkeys(void)
{
	struct sfw_pubkey pin, file;
	char id[17];
	sfw_pubkey_pinned(&pin);
	sfw_pubkey_id_hex(pin.key_id, id);
	CHECK(strcmp(id, "2DC28CC7B26A283B") == 0, "pinned key id %s", id);
	struct sfw_err err = {0};
	CHECK(sfw_pubkey_load("manifests/freeweights.pub", &file, &err) == SFW_OK,
	      "load manifests/freeweights.pub: %s", err.msg);
	CHECK(memcmp(&pin, &file, sizeof(pin)) == 0, "pinned key equals manifests/freeweights.pub");
	/* Independent source: the shared pin list names the service key. */
	struct sfw_buf b;
	const char *g = getenv("SALAFW_PINS");
	CHECK(sfw_read_file(g ? g : "../shared/pins/openbmb__MiniCPM-SALA.txt", 1 << 20, &b, &err) == SFW_OK,
	      "read the shared pin list: %s", err.msg);
	if (b.data) {
		char *pk = strstr(b.data, "# public key");
		char key[80] = "";
		if (pk)
			sscanf(pk, "# public key %79s", key);
		struct sfw_pubkey shared;
		CHECK(sfw_pubkey_parse(key, strlen(key), "shared", &shared, &err) == SFW_OK &&
			  memcmp(&shared, &pin, sizeof(pin)) == 0,
		      "pinned key equals the shared pin list's key '%s'", key);
		CHECK(strstr(b.data, "key id 2DC28CC7B26A283B") != NULL, "shared list names the key id");
		sfw_buf_release(&b);
	}
	/* Key id printing is little-endian: bytes 01..08 print as 0807060504030201. */
	unsigned char kid[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	sfw_pubkey_id_hex(kid, id);
	CHECK(strcmp(id, "0807060504030201") == 0, "key id hex %s", id);

	struct fkey k;
	fkey_make(&k, 7, "ABCDEFGH");
	char b64k[64], text[256];
	fkey_pub_b64(&k, b64k);
	struct sfw_pubkey p;
	CHECK(sfw_pubkey_parse(b64k, strlen(b64k), "-P", &p, &err) == SFW_OK && memcmp(p.pk, k.pk, 32) == 0 &&
		  memcmp(p.key_id, k.id, 8) == 0,
	      "-P form parses");
	snprintf(text, sizeof(text), "untrusted comment: minisign public key X\r\n%s\r\n", b64k);
	CHECK(sfw_pubkey_parse(text, strlen(text), "crlf", &p, &err) == SFW_OK, "CRLF key file parses");
	snprintf(text, sizeof(text), "%s", b64k);
	text[10] = text[10] == 'A' ? 'B' : 'A';
	CHECK(sfw_pubkey_parse(text, strlen(text), "flip", &p, &err) == SFW_OK &&
		  memcmp(p.key_id, k.id, 8) != 0,
	      "a flipped key-id character parses to another key id");
	snprintf(text, sizeof(text), "%.52s", b64k);
	struct sfw_err e = {0};
	CHECK(sfw_pubkey_parse(text, strlen(text), "short key", &p, &e) == SFW_E_SIG &&
		  strstr(e.msg, "short key: base64 conversion failed"),
	      "truncated key rejected: %s", e.msg);
	snprintf(text, sizeof(text), "%s ", b64k);
	CHECK(sfw_pubkey_parse(text, strlen(text), "space", &p, &e) == SFW_E_SIG,
	      "stray space in key rejected");
	snprintf(text, sizeof(text), "%s==", b64k);
	CHECK(sfw_pubkey_parse(text, strlen(text), "pad", &p, &e) == SFW_E_SIG, "padded key rejected");
	unsigned char raw[42];
	memcpy(raw, "Ex", 2);
	memcpy(raw + 2, k.id, 8);
	memcpy(raw + 10, k.pk, 32);
	b64(raw, 42, text, sizeof(text));
	CHECK(sfw_pubkey_parse(text, strlen(text), "alg", &p, &e) == SFW_E_SIG &&
		  strstr(e.msg, "unsupported signature algorithm"),
	      "key algorithm Ex rejected: %s", e.msg);
	snprintf(text, sizeof(text), "c\n%s\nextra\n", b64k);
	CHECK(sfw_pubkey_parse(text, strlen(text), "3 lines", &p, &e) == SFW_E_SIG,
	      "3-line key file rejected");
}

static void test_signatures(void)
{
	struct fkey k, other, twin;
	fkey_make(&k, 1, "\x11\x22\x33\x44\x55\x66\x77\x88");
	fkey_make(&other, 2, "\x99\x22\x33\x44\x55\x66\x77\x88");
	fkey_make(&twin, 3, "\x11\x22\x33\x44\x55\x66\x77\x88"); /* same key id, other key */
	const char *msg = "{\"schema_version\": 1}\n";
	const char *tc = "salafw-manifest repo_id=a/b revision=0 manifest_version=1";
	char sig[4096], bad[4096], line[4096];
	struct sfw_err err = {0};
	struct sfw_minisig_info info;

	make_sig(sig, sizeof(sig), msg, strlen(msg), &k, "ED", tc, "\n");
	CHECK(verify_text(msg, sig, &k, 0, &info, &err) == SFW_OK && info.prehashed == 1 &&
		  strcmp(info.trusted_comment, tc) == 0 && memcmp(info.key_id, k.id, 8) == 0,
	      "prehashed signature verifies: %s", err.msg);
	CHECK(verify_text(msg, sig, &k, 1, NULL, &err) == SFW_OK, "prehashed passes --require-prehashed");

	make_sig(bad, sizeof(bad), msg, strlen(msg), &k, "Ed", tc, "\n");
	CHECK(verify_text(msg, bad, &k, 0, &info, &err) == SFW_OK && info.prehashed == 0,
	      "legacy Ed verifies: %s", err.msg);
	sfw_err_clear(&err);
	EXPECT_REJECT(verify_text(msg, bad, &k, 1, NULL, &err), SFW_E_SIG, err, "legacy", "legacy with -H");

	make_sig(bad, sizeof(bad), msg, strlen(msg), &k, "ED", tc, "\r\n");
	CHECK(verify_text(msg, bad, &k, 0, NULL, &err) == SFW_OK, "CRLF signature verifies: %s", err.msg);
	/* No final newline is fine too (minisign's fgets reads the last line). */
	snprintf(bad, sizeof(bad), "%.*s", (int)strlen(sig) - 1, sig);
	CHECK(verify_text(msg, bad, &k, 0, NULL, &err) == SFW_OK, "no final newline verifies");

	make_sig(bad, sizeof(bad), msg, strlen(msg), &k, "ED", "tab\tis\tfine", "\n");
	CHECK(verify_text(msg, bad, &k, 0, NULL, &err) == SFW_OK, "tab in trusted comment accepted");

	/* Flipped bytes: message, trusted comment, signature, global signature. */
	char flipped[128];
	snprintf(flipped, sizeof(flipped), "%s", msg);
	flipped[3] ^= 1;
	sfw_err_clear(&err);
	EXPECT_REJECT(verify_text(flipped, sig, &k, 0, NULL, &err), SFW_E_SIG, err, "does not match",
		      "flipped message byte");
	snprintf(bad, sizeof(bad), "%s", sig);
	char *t = strstr(bad, "repo_id=a");
	t[8] = 'c';
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "trusted comment signature",
		      "flipped trusted comment byte");
	for (int ln = 1; ln <= 3; ln += 2) {
		snprintf(bad, sizeof(bad), "%s", sig);
		get_line(bad, ln, line, sizeof(line));
		line[20] = line[20] == 'Q' ? 'R' : 'Q';
		replace_line(bad, sizeof(bad), ln, line);
		sfw_err_clear(&err);
		enum sfw_status st = verify_text(msg, bad, &k, 0, NULL, &err);
		CHECK(st == SFW_E_SIG, "flipped base64 in line %d rejected: %s", ln + 1, err.msg);
	}
	/* Other key: key id mismatch; same key id, other key: signature fails. */
	EXPECT_REJECT(verify_text(msg, sig, &other, 0, NULL, &err), SFW_E_KEYID, err,
		      "made by key 8877665544332211", "key id mismatch");
	EXPECT_REJECT(verify_text(msg, sig, &twin, 0, NULL, &err), SFW_E_SIG, err, "does not match",
		      "same key id, other key");

	/* Algorithm bytes. */
	make_sig(bad, sizeof(bad), msg, strlen(msg), &k, "Xx", tc, "\n");
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err,
		      "unsupported signature algorithm", "algorithm Xx");

	/* Base64 shapes on line 2. */
	get_line(sig, 1, line, sizeof(line));
	char l2[256];
	snprintf(l2, sizeof(l2), "%.96s", line);
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 1, l2);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 2", "truncated base64");
	snprintf(l2, sizeof(l2), "%.50s %s", line, line + 51);
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 1, l2);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 2",
		      "space inside base64");
	snprintf(l2, sizeof(l2), "%.50s*%s", line, line + 51);
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 1, l2);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 2",
		      "bad base64 character");
	snprintf(l2, sizeof(l2), "%.98s==", line);
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 1, l2);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 2",
		      "padding inside base64");
	{ /* 73 bytes encode fine but are one byte short */
		unsigned char raw[80];
		CHECK(sodium_base642bin(raw, sizeof(raw), line, strlen(line), NULL, NULL, NULL,
					sodium_base64_VARIANT_ORIGINAL) == 0,
		      "decode line 2");
		b64(raw, 73, l2, sizeof(l2));
		snprintf(bad, sizeof(bad), "%s", sig);
		replace_line(bad, sizeof(bad), 1, l2);
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "74-byte",
			      "73-byte signature");
	}
	get_line(sig, 3, line, sizeof(line));
	snprintf(l2, sizeof(l2), "%.84s", line);
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 3, l2);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 4",
		      "truncated global sig");

	/* Line structure. */
	snprintf(bad, sizeof(bad), "%s", sig);
	replace_line(bad, sizeof(bad), 0, "comment without prefix");
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 1", "untrusted prefix");
	snprintf(bad, sizeof(bad), "%s", sig);
	get_line(sig, 2, line, sizeof(line));
	replace_line(bad, sizeof(bad), 2, line + 1);
	EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 3", "trusted prefix");
	{
		char l1[256], s2[256], s4[256];
		get_line(sig, 0, l1, sizeof(l1));
		get_line(sig, 1, s2, sizeof(s2));
		get_line(sig, 3, s4, sizeof(s4));
		snprintf(bad, sizeof(bad), "%s\n%s\n%s\n", l1, s2,
			 s4); /* signify-style: no trusted comment */
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "line 3",
			      "trusted comment line missing");
		snprintf(bad, sizeof(bad), "%s\n", l1);
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "1 line", "1 line");
		snprintf(bad, sizeof(bad), "%s\n%s\n", l1, s2);
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "2 lines", "2 lines");
		snprintf(bad, sizeof(bad), "%s\n%s\ntrusted comment: %s\n", l1, s2, tc);
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "3 lines", "3 lines");
		snprintf(bad, sizeof(bad), "%sextra\n", sig);
		EXPECT_REJECT(verify_text(msg, bad, &k, 0, NULL, &err), SFW_E_SIG, err, "more than 4",
			      "5 lines");
	}
	sfw_err_clear(&err);
	CHECK(verify_text(msg, "", &k, 0, NULL, &err) == SFW_E_SIG, "empty signature file rejected");

	/* Trusted comment content: C0, DEL, C1, invalid UTF-8, bare CR. */
	const char *badc[] = {"a\x01z", "a\x7fz", "a\xc2\x85z", "a\xff", "a\rz"};
	for (size_t i = 0; i < sizeof(badc) / sizeof(badc[0]); i++) {
		make_sig(bad, sizeof(bad), msg, strlen(msg), &k, "ED", badc[i], "\n");
		sfw_err_clear(&err);
		enum sfw_status st = verify_text(msg, bad, &k, 0, NULL, &err);
		CHECK(st == SFW_E_SIG && (strstr(err.msg, "unprintable") || strstr(err.msg, "too long")),
		      "trusted comment case %zu rejected: %s", i, err.msg);
	}
	/* Sizes: a trusted comment of 8192 bytes, a line 1 of 1024, a file over 16 KiB. */
	char *big = malloc(20000);
	memset(big, 'x', 8200);
	big[8200] = '\0';
	char *bigsig = malloc(30000);
	make_sig(bigsig, 30000, msg, strlen(msg), &k, "ED", big, "\n");
	EXPECT_REJECT(verify_text(msg, bigsig, &k, 0, NULL, &err), SFW_E_SIG, err, "too long",
		      "8 KiB trusted comment");
	memset(big, 'x', 8100);
	big[8100] = '\0';
	make_sig(bigsig, 30000, msg, strlen(msg), &k, "ED", big, "\n");
	CHECK(verify_text(msg, bigsig, &k, 0, NULL, &err) == SFW_OK, "8100-byte trusted comment accepted");
	snprintf(bigsig, 30000, "untrusted comment: %.1100s\n%s", big, strchr(sig, '\n') + 1);
	EXPECT_REJECT(verify_text(msg, bigsig, &k, 0, NULL, &err), SFW_E_SIG, err,
		      "untrusted comment too long", "long line 1");
	memset(bigsig, 'y', 20000);
	bigsig[20000 - 1] = '\0';
	EXPECT_REJECT(verify_text(msg, bigsig, &k, 0, NULL, &err), SFW_E_SIG, err, "too large",
		      "20 KB signature");
	free(big);
	free(bigsig);
	{ /* NUL inside */
		struct sfw_pubkey pk;
		fkey_to_pubkey(&k, &pk);
		snprintf(bad, sizeof(bad), "%s", sig);
		bad[5] = '\0';
		EXPECT_REJECT(
		    sfw_minisig_verify(msg, strlen(msg), bad, strlen(sig), "fx.minisig", &pk, 0, NULL, &err),
		    SFW_E_SIG, err, "NUL", "NUL byte");
	}
}

/* Publisher side: salafw's keygen/sign, checked by the fixture's own
 * libsodium calls (and by the minisign CLI in test_verify_cli.sh). */
static void test_publisher(void)
{
	char pub[300], sec[300], file[300], sigp[320];
	snprintf(pub, sizeof(pub), "%s/k.pub", tmpdir);
	snprintf(sec, sizeof(sec), "%s/k.key", tmpdir);
	snprintf(file, sizeof(file), "%s/doc.txt", tmpdir);
	snprintf(sigp, sizeof(sigp), "%s.minisig", file);
	struct sfw_err err = {0};
	CHECK(sfw_keygen(pub, sec, 0, &err) == SFW_OK, "keygen: %s", err.msg);
	CHECK(sfw_keygen(pub, sec, 0, &err) == SFW_E_EXISTS && strstr(err.msg, "already exists"),
	      "keygen refuses to overwrite: %s", err.msg);
	CHECK(sfw_keygen(pub, sec, 1, &err) == SFW_OK, "keygen -f overwrites");
	CHECK(access(sec, R_OK) == 0, "secret key written");
	struct sfw_seckey sk;
	struct sfw_pubkey pk;
	CHECK(sfw_seckey_load(sec, &sk, &err) == SFW_OK, "load secret key: %s", err.msg);
	CHECK(sfw_pubkey_load(pub, &pk, &err) == SFW_OK, "load public key");
	CHECK(memcmp(sk.key_id, pk.key_id, 8) == 0 && memcmp(sk.sk + 32, pk.pk, 32) == 0, "key pair matches");
	const char *text = "signed by salafw\n";
	CHECK(sfw_write_file_atomic(file, text, strlen(text), NULL) == SFW_OK, "write doc");
	CHECK(sfw_sign_file(file, &sk, "hello\tworld", &err) == SFW_OK, "sign: %s", err.msg);
	struct sfw_buf b;
	CHECK(sfw_read_file(sigp, 1 << 16, &b, &err) == SFW_OK, "read .minisig");
	if (!b.data)
		return;
	/* Independent check with raw libsodium: ED = sign(BLAKE2b-512(file)). */
	char l2[256], l3[9000], l4[256];
	get_line(b.data, 1, l2, sizeof(l2));
	get_line(b.data, 2, l3, sizeof(l3));
	get_line(b.data, 3, l4, sizeof(l4));
	unsigned char raw[74], g[64], h[64];
	size_t n2 = 0, n4 = 0;
	CHECK(sodium_base642bin(raw, 74, l2, strlen(l2), NULL, &n2, NULL, sodium_base64_VARIANT_ORIGINAL) ==
		      0 &&
		  n2 == 74 && raw[0] == 'E' && raw[1] == 'D' && memcmp(raw + 2, pk.key_id, 8) == 0,
	      "line 2 is ED + key id + signature");
	crypto_generichash(h, 64, (const unsigned char *)text, strlen(text), NULL, 0);
	CHECK(crypto_sign_verify_detached(raw + 10, h, 64, pk.pk) == 0,
	      "libsodium verifies the prehashed signature");
	CHECK(strcmp(l3, "trusted comment: hello\tworld") == 0, "trusted comment line");
	CHECK(sodium_base642bin(g, 64, l4, strlen(l4), NULL, &n4, NULL, sodium_base64_VARIANT_ORIGINAL) ==
		      0 &&
		  n4 == 64,
	      "line 4 decodes");
	unsigned char gm[64 + 11];
	memcpy(gm, raw + 10, 64);
	memcpy(gm + 64, "hello\tworld", 11);
	CHECK(crypto_sign_verify_detached(g, gm, sizeof(gm), pk.pk) == 0,
	      "libsodium verifies the global signature");
	CHECK(sfw_minisig_verify(text, strlen(text), b.data, b.len, "doc", &pk, 1, NULL, &err) == SFW_OK,
	      "salafw verifies its own signature");
	sfw_buf_release(&b);
	CHECK(sfw_sign_file(file, &sk, "bad\ncomment", &err) == SFW_E_INVAL,
	      "multi-line trusted comment refused");

	/* Secret key files: a minisign -W style zero checksum loads, a wrong one does not,
	 * an encrypted one is refused with a hint. */
	struct fkey fk;
	fkey_make(&fk, 9, "12345678");
	unsigned char raw2[158];
	memset(raw2, 0, sizeof(raw2));
	memcpy(raw2, "Ed", 2);
	memcpy(raw2 + 4, "B2", 2);
	memcpy(raw2 + 54, fk.id, 8);
	memcpy(raw2 + 62, fk.sk, 64);
	char kb[300], kt[400];
	b64(raw2, 158, kb, sizeof(kb));
	snprintf(kt, sizeof(kt), "untrusted comment: minisign encrypted secret key\n%s\n", kb);
	CHECK(sfw_write_file_atomic(sec, kt, strlen(kt), NULL) == SFW_OK, "write -W style key");
	CHECK(sfw_seckey_load(sec, &sk, &err) == SFW_OK && memcmp(sk.key_id, fk.id, 8) == 0,
	      "zero-checksum key loads: %s", err.msg);
	raw2[140] = 1;
	b64(raw2, 158, kb, sizeof(kb));
	snprintf(kt, sizeof(kt), "untrusted comment: x\n%s\n", kb);
	CHECK(sfw_write_file_atomic(sec, kt, strlen(kt), NULL) == SFW_OK, "write bad-checksum key");
	CHECK(sfw_seckey_load(sec, &sk, &err) == SFW_E_FORMAT && strstr(err.msg, "checksum"),
	      "bad checksum refused: %s", err.msg);
	raw2[140] = 0;
	memcpy(raw2 + 2, "Sc", 2);
	b64(raw2, 158, kb, sizeof(kb));
	snprintf(kt, sizeof(kt), "untrusted comment: x\n%s\n", kb);
	CHECK(sfw_write_file_atomic(sec, kt, strlen(kt), NULL) == SFW_OK, "write encrypted-tag key");
	CHECK(sfw_seckey_load(sec, &sk, &err) == SFW_E_UNSUPPORTED && strstr(err.msg, "encrypted"),
	      "encrypted key refused: %s", err.msg);
}

/* ---- a key pair as one unit, and the user key's repair ------------------------ */

static const char *fail_name; /* writes to a path ending so fail with ENOSPC */
static int enospc_hook(const char *op, const char *name)
{
	size_t a = strlen(name), b = fail_name ? strlen(fail_name) : 0;
	return fail_name && strcmp(op, "write") == 0 && a >= b && strcmp(name + a - b, fail_name) == 0 ? ENOSPC : 0;
}

static int exists(const char *p)
{
	return access(p, F_OK) == 0;
}

static int no_tmp_in(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | grep -q '\\.tmp\\.'", dir);
	return system(cmd) != 0;
}

static void test_pair_unit(void)
{
	char d[300], pub[400], sec[400];
	snprintf(d, sizeof(d), "%s/pair", tmpdir);
	snprintf(pub, sizeof(pub), "%s/u.pub", d);
	snprintf(sec, sizeof(sec), "%s/u.key", d);
	struct sfw_err err = {0};
	CHECK(sfw_mkdirs(d, &err) == SFW_OK, "mkdir");
	sfwi_fault_hook = enospc_hook;
	const char *which[2] = {"/u.pub", "/u.key"};
	for (int i = 0; i < 2; i++) {
		fail_name = which[i];
		enum sfw_status s = sfw_keygen(pub, sec, 0, &err);
		CHECK(s == SFW_E_NOSPACE && !exists(pub) && !exists(sec) && no_tmp_in(d),
		      "a full disk at %s leaves neither key file (%s)", which[i] + 1, err.msg);
	}
	sfwi_fault_hook = NULL;
	fail_name = NULL;
	CHECK(sfw_keygen(pub, sec, 0, &err) == SFW_OK && exists(pub) && exists(sec), "then keygen makes the pair");
	/* the public half a secret key carries is the pair's public key, byte for byte */
	struct sfw_seckey sk;
	struct sfw_pubkey pk, derived;
	struct sfw_buf orig, again;
	char pub2[400];
	snprintf(pub2, sizeof(pub2), "%s/derived.pub", d);
	CHECK(sfw_seckey_load(sec, &sk, &err) == SFW_OK && sfw_pubkey_load(pub, &pk, &err) == SFW_OK, "load");
	sfw_seckey_pubkey(&sk, &derived);
	CHECK(memcmp(&derived, &pk, sizeof(pk)) == 0, "sfw_seckey_pubkey gives the pair's public key");
	CHECK(sfw_pubkey_write(pub2, &derived, &err) == SFW_OK && sfw_read_file(pub, 4096, &orig, &err) == SFW_OK &&
		  sfw_read_file(pub2, 4096, &again, &err) == SFW_OK && orig.len == again.len &&
		  memcmp(orig.data, again.data, orig.len) == 0,
	      "sfw_pubkey_write writes keygen's file again");
	sfw_buf_release(&orig);
	sfw_buf_release(&again);

	/* the user key: folders given, never read from the environment */
	char kd[300], upub[400], ukey[400];
	snprintf(kd, sizeof(kd), "%s/cfg", tmpdir);
	snprintf(upub, sizeof(upub), "%s/user.pub", kd);
	snprintf(ukey, sizeof(ukey), "%s/user.key", kd);
	setenv("XDG_CONFIG_HOME", d, 1); /* ignored */
	sfw_verify_set_dirs(NULL, kd);
	char *kp = sfw_userkey_path(1);
	CHECK(kp && strcmp(kp, ukey) == 0, "the key path is in the folder given: %s", kp ? kp : "(null)");
	sfw_free(kp);
	int created = 0;
	struct sfw_pubkey u1, u2;
	CHECK(sfw_userkey_ensure(&sk, &u1, &created, &err) == SFW_OK && created && exists(ukey) && exists(upub),
	      "ensure makes the pair: %s", err.msg);
	CHECK(sfw_read_file(upub, 4096, &orig, &err) == SFW_OK, "read user.pub");
	unlink(upub);
	CHECK(sfw_userkey_ensure(&sk, &u2, &created, &err) == SFW_OK && !created &&
		  memcmp(&u1, &u2, sizeof(u1)) == 0,
	      "a lone user.key: user.pub written again from it: %s", err.msg);
	CHECK(sfw_read_file(upub, 4096, &again, &err) == SFW_OK && orig.len == again.len &&
		  memcmp(orig.data, again.data, orig.len) == 0,
	      "... byte for byte the file it had");
	sfw_buf_release(&again);
	static const char bad[] = "untrusted comment: x\nRWQ=\n";
	CHECK(sfw_write_file_atomic(upub, bad, sizeof(bad) - 1, &err) == SFW_OK, "damage user.pub");
	CHECK(sfw_userkey_ensure(&sk, &u2, &created, &err) == SFW_OK && memcmp(&u1, &u2, sizeof(u1)) == 0 &&
		  sfw_read_file(upub, 4096, &again, &err) == SFW_OK && again.len == orig.len,
	      "a damaged user.pub is written again too");
	sfw_buf_release(&again);
	sfw_buf_release(&orig);
	unlink(upub);
	unlink(ukey);
	CHECK(sfw_pubkey_write(upub, &pk, &err) == SFW_OK, "a lone user.pub");
	CHECK(sfw_userkey_ensure(&sk, &u2, &created, &err) == SFW_OK && created && memcmp(&u2, &pk, sizeof(pk)) != 0,
	      "a lone user.pub is replaced by a new pair: %s", err.msg);
	sfw_verify_set_dirs(NULL, NULL);
	CHECK(sfw_userkey_ensure(&sk, &u2, &created, &err) == SFW_E_IO && sfw_userkey_path(0) == NULL,
	      "no folder given: no user key (%s)", err.msg);
	sodium_memzero(&sk, sizeof(sk));
}

int main(void)
{
	if (sodium_init() < 0) {
		printf("FAIL sodium_init\n");
		return 1;
	}
	snprintf(tmpdir, sizeof(tmpdir), "%s/salafw-minisig.XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	test_sha256();
	test_hex();
	test_pubkeys();
	test_signatures();
	test_publisher();
	test_pair_unit();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		printf("warning: could not remove %s\n", tmpdir);
	return CHECK_REPORT("test_minisig");
}
