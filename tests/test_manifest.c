/* modules: verify core */
/* test_manifest - manifest v1 parsing (every bad-input class of issue #2),
 * path rules, the trust flow (binding, pins, expiry, rollback ratchet),
 * directory verification and the verified-state record. Expected digests come
 * from the FIPS 180-2 vectors and the shared pin list, not from our code. */
#include "check.h"
#include "verify/verify.h"
#include "verify/verify_int.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"

#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA_56 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
#define TEXT_56 "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
#define REV "0123456789abcdef0123456789abcdef01234567"

static char tmp[256];

struct mf {
	const char *schema, *key, *repo, *rev, *ver, *created, *expires, *total, *files, *tail;
};

static struct mf mf_default(void)
{
	struct mf d = {"1",
		       "8877665544332211",
		       "org/tiny",
		       REV,
		       "1",
		       "2026-01-01T00:00:00Z",
		       "2099-01-01T00:00:00Z",
		       "59",
		       "{\"path\": \"a.bin\", \"size\": 3, \"sha256\": \"" SHA_ABC "\"}, "
		       "{\"path\": \"sub/c.txt\", \"size\": 56, \"sha256\": \"" SHA_56 "\"}",
		       ", \"sources\": [{\"kind\": \"http\", \"base_url\": \"https://m.example/x/\"}, "
		       "{\"kind\": \"hf\", \"endpoint\": \"https://hf.example\", \"name\": \"hf\"}]"};
	return d;
}

static char *mf_text(const struct mf *d)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 4u << 20);
	SFW_ASSERT(
	    sfw_buf_printf(
		&b,
		"{\"schema_version\": %s, \"generator\": \"test/1\", \"publisher\": {\"key_id\": \"%s\"}, "
		"\"repo_id\": \"%s\", \"revision\": \"%s\", \"manifest_version\": %s, \"created\": \"%s\", "
		"\"expires\": \"%s\", \"total_size\": %s, \"files\": [%s]%s}\n",
		d->schema, d->key, d->repo, d->rev, d->ver, d->created, d->expires, d->total, d->files,
		d->tail) == SFW_OK);
	size_t n;
	return sfw_buf_take(&b, &n);
}

static enum sfw_status parse_mf(const struct mf *d, struct sfw_err *err)
{
	char *t = mf_text(d);
	struct sfw_manifest m;
	enum sfw_status s = sfw_manifest_parse(t, strlen(t), "manifest 'm.json'", &m, err);
	if (s == SFW_OK)
		sfw_manifest_release(&m);
	sfw_free(t);
	return s;
}

#define BAD(field, value, want, needle)                                                                      \
	do {                                                                                                 \
		struct mf d_ = mf_default();                                                                 \
		d_.field = (value);                                                                          \
		struct sfw_err e_ = {0};                                                                     \
		enum sfw_status s_ = parse_mf(&d_, &e_);                                                     \
		CHECK(s_ == (want) && strstr(e_.msg, "m.json") && strstr(e_.msg, (needle)),                  \
		      "%s=%s: got %s '%s'", #field, (value), sfw_strerror(s_), e_.msg);                      \
	} while (0)

static void test_parse(void)
{
	struct mf d = mf_default();
	char *t = mf_text(&d);
	struct sfw_manifest m;
	struct sfw_err err = {0};
	CHECK(sfw_manifest_parse(t, strlen(t), "manifest 'm.json'", &m, &err) == SFW_OK, "valid manifest: %s",
	      err.msg);
	CHECK(m.nfiles == 2 && strcmp(m.files[1].path, "sub/c.txt") == 0 && m.files[1].size == 56 &&
		  m.total_size == 59 && strcmp(m.publisher_key_id, "8877665544332211") == 0 &&
		  strcmp(m.repo_id, "org/tiny") == 0 && m.manifest_version == 1,
	      "fields read");
	CHECK(m.nsources == 2 && m.sources[0].kind == SFW_SOURCE_HTTP && m.sources[1].kind == SFW_SOURCE_HF &&
		  strcmp(m.sources[1].url, "https://hf.example") == 0 && strcmp(m.sources[1].name, "hf") == 0,
	      "sources in order (%zu)", m.nsources);
	CHECK(m.created == 1767225600 && m.expires == 4070908800LL, "RFC 3339 times (%lld, %lld)",
	      (long long)m.created, (long long)m.expires);
	unsigned char want[32];
	struct sfw_sha256 h;
	CHECK(sfw_sha256_init(&h) == SFW_OK, "init");
	sfw_sha256_update(&h, t, strlen(t));
	sfw_sha256_final(&h, want);
	sfw_sha256_release(&h);
	CHECK(memcmp(want, m.manifest_sha256, 32) == 0, "manifest_sha256 is the sha256 of the bytes");
	sfw_manifest_release(&m);

	/* Sizes over 4 GiB and up to 2^53-1 stay exact (never through valueint). */
	d.files = "{\"path\": \"big\", \"size\": 9007199254740991, \"sha256\": \"" SHA_ABC "\"}";
	d.total = "9007199254740991";
	sfw_free(t);
	t = mf_text(&d);
	CHECK(sfw_manifest_parse(t, strlen(t), "m", &m, &err) == SFW_OK &&
		  m.files[0].size == 9007199254740991ULL,
	      "2^53-1 size exact");
	sfw_manifest_release(&m);
	d.files = "{\"path\": \"big\", \"size\": 4990000001, \"sha256\": \"" SHA_ABC "\"}";
	d.total = "4990000001";
	sfw_free(t);
	t = mf_text(&d);
	CHECK(sfw_manifest_parse(t, strlen(t), "m", &m, &err) == SFW_OK && m.files[0].size == 4990000001ULL,
	      "4.99 GB size exact");
	sfw_manifest_release(&m);

	{ /* An unknown source kind is skipped (with a warning), not an error. */
		struct mf du = mf_default();
		du.tail = ", \"sources\": [{\"kind\": \"cas\", \"base_url\": \"https://c.example/\"}]";
		sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1);
		sfw_free(t);
		t = mf_text(&du);
		CHECK(sfw_manifest_parse(t, strlen(t), "m", &m, &err) == SFW_OK && m.nsources == 0,
		      "unknown source kind skipped");
		sfw_manifest_release(&m);
		sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1);
	}
	/* Truncated, oversized, non-UTF-8, duplicate keys, trailing bytes. */
	d = mf_default();
	sfw_free(t);
	t = mf_text(&d);
	size_t n = strlen(t);
	for (size_t cut = 1; cut < n - 2; cut += 37) {
		struct sfw_err e = {0};
		enum sfw_status s = sfw_manifest_parse(t, cut, "manifest 'm.json'", &m, &e);
		CHECK(s == SFW_E_MANIFEST && strstr(e.msg, "m.json"), "truncated at %zu: %s", cut, e.msg);
	}
	char *big = sfw_malloc(SFW_MANIFEST_MAX + 2);
	memset(big, ' ', SFW_MANIFEST_MAX + 1);
	memcpy(big, t, n);
	sfw_err_clear(&err);
	CHECK(sfw_manifest_parse(big, SFW_MANIFEST_MAX + 1, "manifest 'm.json'", &m, &err) ==
		      SFW_E_MANIFEST &&
		  strstr(err.msg, "too large"),
	      "oversized: %s", err.msg);
	sfw_free(big);
	BAD(repo,
	    "org/ti\xff"
	    "ny",
	    SFW_E_MANIFEST, "UTF-8");
	BAD(tail, ", \"repo_id\": \"org/tiny\"", SFW_E_MANIFEST, "duplicate key");
	BAD(tail, "} {", SFW_E_MANIFEST, "m.json");
	BAD(tail, ", \"publisher\": {\"key_id\": \"1111111111111111\"}", SFW_E_MANIFEST, "duplicate");

	/* Wrong types and values. */
	BAD(schema, "\"1\"", SFW_E_MANIFEST, "schema_version");
	BAD(schema, "2", SFW_E_MANIFEST, "unsupported schema_version 2");
	BAD(ver, "0", SFW_E_MANIFEST, "manifest_version");
	BAD(ver, "1.5", SFW_E_MANIFEST, "manifest_version");
	BAD(total, "\"59\"", SFW_E_MANIFEST, "total_size");
	BAD(total, "60", SFW_E_MANIFEST, "add up to 59");
	BAD(key, "88776655443322", SFW_E_MANIFEST, "publisher.key_id");
	BAD(key, "88776655443322zz", SFW_E_MANIFEST, "publisher.key_id");
	BAD(repo, "tiny", SFW_E_MANIFEST, "ORG/NAME");
	BAD(repo, "org/../x", SFW_E_MANIFEST, "ORG/NAME");
	BAD(rev, "0123456789ABCDEF0123456789abcdef01234567", SFW_E_MANIFEST, "revision");
	BAD(rev, "main", SFW_E_MANIFEST, "revision");
	BAD(created, "2026-01-01 00:00:00", SFW_E_MANIFEST, "created");
	BAD(expires, "2026-02-30T00:00:00Z", SFW_E_MANIFEST, "expires");
	BAD(expires, "2025-01-01T00:00:00Z", SFW_E_MANIFEST, "not after");
	BAD(files, "", SFW_E_MANIFEST, "empty");
	BAD(tail, ", \"sources\": [{\"kind\": \"http\", \"base_url\": \"https://m.example/x\"}]",
	    SFW_E_MANIFEST, "base_url");
	BAD(tail, ", \"sources\": [{\"kind\": \"hf\", \"endpoint\": \"ftp://h\"}]", SFW_E_MANIFEST,
	    "endpoint");
	BAD(tail, ", \"sources\": {}", SFW_E_MANIFEST, "sources");
	BAD(tail, ", \"repo_type\": \"dataset\"", SFW_E_MANIFEST, "repo_type");
#define F1(path, size, sha) "{\"path\": \"" path "\", \"size\": " size ", \"sha256\": \"" sha "\"}"
	BAD(files, F1("a", "\"3\"", SHA_ABC), SFW_E_MANIFEST, "size");
	BAD(files, F1("a", "-3", SHA_ABC), SFW_E_MANIFEST, "size");
	BAD(files, F1("a", "9007199254740992", SHA_ABC), SFW_E_MANIFEST, "2^53");
	BAD(files, F1("a", "3.5", SHA_ABC), SFW_E_MANIFEST, "size");
	BAD(files, F1("a", "1e400", SHA_ABC), SFW_E_MANIFEST, "m.json");
	BAD(files, F1("a", "3", "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"),
	    SFW_E_MANIFEST, "sha256");
	BAD(files, F1("a", "3", "ba78"), SFW_E_MANIFEST, "sha256");
	BAD(files, "{\"path\": 7, \"size\": 3, \"sha256\": \"" SHA_ABC "\"}", SFW_E_MANIFEST, "path");
	BAD(files, "[]", SFW_E_MANIFEST, "files[0]");
	BAD(tail, ", \"files\": []", SFW_E_MANIFEST, "duplicate");
	/* Sorted, unique, no case collisions, no file that is also a folder. */
	BAD(files, F1("b", "3", SHA_ABC) ", " F1("a", "56", SHA_56), SFW_E_MANIFEST, "not sorted");
	BAD(files, F1("a", "3", SHA_ABC) ", " F1("a", "56", SHA_56), SFW_E_MANIFEST, "duplicate path 'a'");
	BAD(files, F1("A", "3", SHA_ABC) ", " F1("a", "56", SHA_56), SFW_E_MANIFEST, "case");
	BAD(files, F1("a", "3", SHA_ABC) ", " F1("a.txt", "0", SHA_ABC) ", " F1("a/b", "56", SHA_56),
	    SFW_E_MANIFEST, "folder");
	/* Paths (§3.12-4): each is SFW_E_PATH naming the entry. */
	static const char *bad_paths[] = {"../x",      "/etc/x",	"a/./b",
					  "a\\\\b",    "a//b",		"a/",
					  ".",	       "x/..",		"a:b",
					  ".salafw/x", "s/.git/config", "",
					  "a\\u0001b", "a\\u007fb",	".cache/huggingface/x",
					  ".SALAFW/x", "s/.Git/config", ".Cache/HuggingFace/x"};
	for (size_t i = 0; i < sizeof(bad_paths) / sizeof(bad_paths[0]); i++) {
		char files[512];
		snprintf(files, sizeof(files),
			 "{\"path\": \"%s\", \"size\": 59, \"sha256\": \"" SHA_ABC "\"}", bad_paths[i]);
		struct mf dd = mf_default();
		dd.files = files;
		struct sfw_err e = {0};
		enum sfw_status s = parse_mf(&dd, &e);
		CHECK(s == SFW_E_PATH && strstr(e.msg, "files[0]") && strstr(e.msg, "m.json"),
		      "path '%s': %s '%s'", bad_paths[i], sfw_strerror(s), e.msg);
	}
	{ /* NUL inside a path (JSON \u0000) is refused before anything else. */
		struct mf dd = mf_default();
		dd.files = "{\"path\": \"a\\u0000b\", \"size\": 59, \"sha256\": \"" SHA_ABC "\"}";
		struct sfw_err e = {0};
		enum sfw_status s = parse_mf(&dd, &e);
		CHECK(s == SFW_E_PATH || s == SFW_E_MANIFEST, "NUL in path rejected: %s", e.msg);
	}
	CHECK(sfw_path_check("model-00001-of-00004.safetensors", NULL) == SFW_OK, "normal path ok");
	CHECK(sfw_path_check("sub/dir/file.json", NULL) == SFW_OK, "nested path ok");
	CHECK(sfw_path_check(".gitattributes", NULL) == SFW_OK, ".gitattributes ok");
	char longseg[300];
	memset(longseg, 'a', 256);
	longseg[256] = '\0';
	CHECK(sfw_path_check(longseg, NULL) == SFW_E_PATH, "256-byte segment refused");
	CHECK(sfw_path_check("caf\xc3\xa9", NULL) == SFW_OK, "UTF-8 path ok");
	CHECK(sfw_path_check("caf\xc3", NULL) == SFW_E_PATH, "broken UTF-8 path refused");
	sfw_free(t);
}

/* ---- signing helpers ------------------------------------------------------------ */

struct tkey {
	struct sfw_seckey sk;
	struct sfw_pubkey pk;
	char id[17];
};

static void tkey_make(struct tkey *k, unsigned char seed_byte, const char *id8)
{
	unsigned char seed[32], pk[32];
	memset(seed, seed_byte, 32);
	crypto_sign_seed_keypair(pk, k->sk.sk, seed);
	memcpy(k->sk.key_id, id8, 8);
	memcpy(k->pk.key_id, id8, 8);
	memcpy(k->pk.pk, pk, 32);
	sfw_pubkey_id_hex(k->pk.key_id, k->id);
}

/* Signs text (written to tmp/name) and returns the .minisig text. */
static char *sign_text(const char *text, const char *name, const struct tkey *k, const char *comment)
{
	char path[400], sp[420];
	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	snprintf(sp, sizeof(sp), "%s.minisig", path);
	SFW_ASSERT(sfw_write_file_atomic(path, text, strlen(text), NULL) == SFW_OK);
	SFW_ASSERT(sfw_sign_file(path, &k->sk, comment, NULL) == SFW_OK);
	struct sfw_buf b;
	SFW_ASSERT(sfw_read_file(sp, 1 << 16, &b, NULL) == SFW_OK);
	size_t n;
	return sfw_buf_take(&b, &n);
}

static enum sfw_status trust(const char *text, const char *sig, const struct sfw_trust_params *p,
			     struct sfw_manifest *m, struct sfw_err *err)
{
	return sfw_manifest_verify(text, strlen(text), sig, strlen(sig), "manifest 'm.json'", p, m, NULL,
				   err);
}

static void test_trust(void)
{
	struct tkey k, k2;
	tkey_make(&k, 1, "\x11\x22\x33\x44\x55\x66\x77\x88");
	tkey_make(&k2, 2, "\x01\x02\x03\x04\x05\x06\x07\x08");
	char state[300];
	snprintf(state, sizeof(state), "%s/state", tmp);
	struct sfw_trust_params p = sfw_trust_default_params();
	p.keys = &k.pk;
	p.nkeys = 1;
	p.state_dir = state;
	p.now = 1800000000; /* 2027-01-15 */
	struct mf d = mf_default();
	d.key = k.id;
	char *t = mf_text(&d);
	char *sig = sign_text(t, "m.json", &k,
			      "salafw-manifest repo_id=org/tiny revision=" REV " manifest_version=1");
	struct sfw_manifest m;
	struct sfw_err err = {0};
	CHECK(trust(t, sig, &p, &m, &err) == SFW_OK, "trust flow ok: %s", err.msg);
	sfw_manifest_release(&m);
	struct sfw_minisig_info info;
	CHECK(sfw_manifest_verify(t, strlen(t), sig, strlen(sig), "m", &p, NULL, &info, &err) == SFW_OK &&
		  strstr(info.trusted_comment, "salafw-manifest"),
	      "info filled, out may be NULL");

	/* Default keys: the pinned one, which did not sign this. */
	struct sfw_trust_params pp = p;
	pp.keys = NULL;
	pp.nkeys = 0;
	CHECK(trust(t, sig, &pp, NULL, &err) == SFW_E_KEYID && strstr(err.msg, "2DC28CC7B26A283B"),
	      "pinned key by default: %s", err.msg);
	/* Several trusted keys: chosen by key id. */
	struct sfw_pubkey two[2] = {k2.pk, k.pk};
	pp.keys = two;
	pp.nkeys = 2;
	CHECK(trust(t, sig, &pp, NULL, &err) == SFW_OK, "key chosen by id among several");
	/* Signed by k2 but publisher.key_id names k. */
	char *sig2 = sign_text(t, "m2.json", &k2, "x");
	CHECK(trust(t, sig2, &pp, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "publisher key"),
	      "publisher.key_id must equal the signing key: %s", err.msg);
	sfw_free(sig2);
	/* Signature checked before cJSON sees the bytes. */
	const char *junk = "{\"not json";
	char *sigj = sign_text(junk, "j.json", &k, "x");
	CHECK(trust(junk, sig, &p, NULL, &err) == SFW_E_SIG,
	      "bad bytes with a wrong signature: signature error");
	CHECK(trust(junk, sigj, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "JSON"),
	      "signed non-JSON: manifest error: %s", err.msg);
	sfw_free(sigj);

	/* Binding. */
	struct sfw_trust_params pb = p;
	pb.repo_id = "org/other";
	CHECK(trust(t, sig, &pb, NULL, &err) == SFW_E_MANIFEST &&
		  strstr(err.msg, "not the requested 'org/other'"),
	      "repo binding: %s", err.msg);
	pb = p;
	pb.revision = "1123456789abcdef0123456789abcdef01234567";
	CHECK(trust(t, sig, &pb, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "revision"),
	      "revision binding: %s", err.msg);
	pb = p;
	pb.repo_id = "org/tiny";
	pb.revision = REV;
	CHECK(trust(t, sig, &pb, NULL, &err) == SFW_OK, "matching binding ok");
	/* The trusted comment must agree when it uses the salafw convention. */
	char *sigc = sign_text(t, "c.json", &k,
			       "salafw-manifest repo_id=org/evil revision=" REV " manifest_version=1");
	CHECK(trust(t, sigc, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "trusted comment"),
	      "trusted comment disagreeing: %s", err.msg);
	sfw_free(sigc);
	sigc = sign_text(t, "c.json", &k,
			 "salafw-manifest repo_id=org/tiny revision=" REV " manifest_version=2");
	CHECK(trust(t, sigc, &p, NULL, &err) == SFW_E_MANIFEST, "trusted comment version disagreeing");
	sfw_free(sigc);
	sigc = sign_text(t, "c.json", &k, "timestamp:1\tfile:m.json\thashed");
	CHECK(trust(t, sigc, &p, NULL, &err) == SFW_OK, "minisign default comment is display only");
	sfw_free(sigc);

	/* Expiry: rejected unless allowed (offline verify warns). */
	struct sfw_trust_params pe = p;
	pe.now = 4070908800LL + 1;
	CHECK(trust(t, sig, &pe, NULL, &err) == SFW_E_MANIFEST &&
		  strstr(err.msg, "expired at 2099-01-01T00:00:00Z") && strstr(err.msg, "clock"),
	      "expired: %s", err.msg);
	pe.allow_expired = 1;
	CHECK(trust(t, sig, &pe, NULL, &err) == SFW_OK, "expired allowed for offline verify");

	/* Rollback ratchet, per repo and key id. */
	struct mf d2 = d;
	d2.ver = "2";
	char *t2 = mf_text(&d2);
	char *s2 = sign_text(t2, "v2.json", &k, "x");
	CHECK(trust(t2, s2, &p, &m, &err) == SFW_OK, "v2 ok");
	CHECK(sfw_manifest_ratchet_commit(&m, &p, &err) == SFW_OK, "commit v2: %s", err.msg);
	sfw_manifest_release(&m);
	char rpath[400];
	snprintf(rpath, sizeof(rpath), "%s/trusted/org--tiny.%s.json", state, k.id);
	CHECK(access(rpath, R_OK) == 0, "ratchet file %s", rpath);
	CHECK(trust(t, sig, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "rollback") &&
		  strstr(err.msg, "version 2"),
	      "v1 after v2 rejected: %s", err.msg);
	struct sfw_trust_params pd = p;
	pd.allow_downgrade = 1;
	CHECK(trust(t, sig, &pd, &m, &err) == SFW_OK, "--allow-downgrade accepts v1");
	CHECK(sfw_manifest_ratchet_commit(&m, &pd, &err) == SFW_OK, "commit of v1 keeps v2");
	sfw_manifest_release(&m);
	CHECK(trust(t, sig, &p, NULL, &err) == SFW_E_MANIFEST, "ratchet not lowered by a downgrade");
	CHECK(trust(t2, s2, &p, NULL, &err) == SFW_OK, "same version, same bytes ok");
	struct mf d2b = d2;
	d2b.tail = "";
	char *t2b = mf_text(&d2b);
	char *s2b = sign_text(t2b, "v2b.json", &k, "x");
	CHECK(trust(t2b, s2b, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "equivocation"),
	      "same version, other bytes: %s", err.msg);
	struct sfw_trust_params pn = p;
	pn.state_dir = "";
	CHECK(trust(t, sig, &pn, NULL, &err) == SFW_OK, "state_dir \"\" disables the ratchet");
	/* Another key id has its own ratchet. */
	struct mf dk = d;
	dk.key = k2.id;
	char *tk = mf_text(&dk);
	char *sk = sign_text(tk, "k2.json", &k2, "x");
	struct sfw_trust_params pk = p;
	pk.keys = &k2.pk;
	CHECK(trust(tk, sk, &pk, NULL, &err) == SFW_OK, "ratchet is per key id: %s", err.msg);
	/* NULL: the state dir the program gave (sfw_verify_set_dirs); the
	 * library itself reads no environment */
	char envdir[400];
	snprintf(envdir, sizeof(envdir), "%s/envstate", tmp);
	setenv("SALAFW_STATE_DIR", tmp, 1); /* ignored */
	sfw_verify_set_dirs(envdir, NULL);
	struct sfw_trust_params pz = p;
	pz.state_dir = NULL;
	CHECK(trust(t2, s2, &pz, &m, &err) == SFW_OK && sfw_manifest_ratchet_commit(&m, &pz, &err) == SFW_OK,
	      "commit to default state dir");
	sfw_manifest_release(&m);
	snprintf(rpath, sizeof(rpath), "%s/trusted/org--tiny.%s.json", envdir, k.id);
	CHECK(access(rpath, R_OK) == 0, "the given state dir is used, not the environment's");
	CHECK(trust(t, sig, &pz, NULL, &err) == SFW_E_MANIFEST, "rollback via default state dir");
	sfw_free(t);
	sfw_free(sig);
	sfw_free(t2);
	sfw_free(s2);
	sfw_free(t2b);
	sfw_free(s2b);
	sfw_free(tk);
	sfw_free(sk);
}

/* The pin: table == manifests/pins file == shared pin list; a manifest
 * for the pinned repo+revision must carry exactly those sha256 values. */
static void test_pins(void)
{
	size_t np;
	const struct sfwi_pin *pins = sfwi_pins(&np);
	CHECK(np >= 1, "at least one pin");
	const struct sfwi_pin *pin =
	    sfwi_pin_find("openbmb/MiniCPM-SALA", "9180fe1db74f71fb81bc7105efe88f6b19c959b0");
	CHECK(pin && pin->nfiles == 15, "MiniCPM-SALA pin has 15 files");
	if (!pin)
		return;
	(void)pins;
	struct sfw_buf shared, local;
	struct sfw_err err = {0};
	CHECK(sfw_read_file("../shared/pins/openbmb__MiniCPM-SALA.txt", 1 << 20, &shared, &err) == SFW_OK,
	      "shared pin list: %s", err.msg);
	CHECK(sfw_read_file("manifests/pins/openbmb__MiniCPM-SALA.pin", 1 << 20, &local, &err) == SFW_OK,
	      "manifests pin file: %s", err.msg);
	if (!shared.data || !local.data)
		return;
	CHECK(strstr(shared.data, pin->manifest_sha256_hex) && strstr(local.data, pin->manifest_sha256_hex),
	      "manifest sha256 agrees");
	CHECK(strstr(shared.data, pin->revision) && strstr(local.data, pin->revision), "revision agrees");
	size_t agree = 0;
	for (size_t i = 0; i < pin->nfiles; i++) {
		char a[400], b[400];
		snprintf(a, sizeof(a), "\n%s  ", pin->files[i].sha256_hex);
		snprintf(b, sizeof(b), "file %s %s\n", pin->files[i].sha256_hex, pin->files[i].path);
		const char *hit = strstr(shared.data, a);
		char path[300] = "";
		if (hit)
			sscanf(hit + 1 + 64, "%*s %299s", path);
		if (hit && strcmp(path, pin->files[i].path) == 0 && strstr(local.data, b))
			agree++;
		else
			CHECK(0, "pin entry %s disagrees", pin->files[i].path);
	}
	CHECK(agree == 15, "all 15 pinned sha256 agree with the shared list and the pin file");

	/* A manifest built from the shared list's digests passes; one flipped digest fails. */
	struct tkey k;
	tkey_make(&k, 5, "PINTEST!");
	struct sfw_buf files;
	sfw_buf_init(&files, 1 << 20);
	const char *line = shared.data;
	int count = 0;
	while ((line = strchr(line, '\n'))) {
		line++;
		char sha[65], size[32], path[300];
		if (sscanf(line, "%64[0-9a-f] %31s %299s", sha, size, path) == 3 && strlen(sha) == 64) {
			SFW_ASSERT(sfw_buf_printf(&files,
						  "%s{\"path\": \"%s\", \"size\": 1, \"sha256\": \"%s\"}",
						  count ? ", " : "", path, sha) == SFW_OK);
			count++;
		}
	}
	CHECK(count == 15, "15 files in the shared list");
	struct mf d = mf_default();
	d.key = k.id;
	d.repo = "openbmb/MiniCPM-SALA";
	d.rev = "9180fe1db74f71fb81bc7105efe88f6b19c959b0";
	d.total = "15";
	d.files = files.data;
	d.tail = "";
	struct sfw_trust_params p = sfw_trust_default_params();
	p.keys = &k.pk;
	p.nkeys = 1;
	p.state_dir = "";
	p.now = 1800000000;
	char *t = mf_text(&d);
	char *s = sign_text(t, "pin.json", &k, "x");
	CHECK(trust(t, s, &p, NULL, &err) == SFW_OK, "manifest matching the pin accepted: %s", err.msg);
	sfw_free(t);
	sfw_free(s);
	char *tok = strstr(files.data, "bb74d511");
	tok[0] = 'c';
	t = mf_text(&d);
	s = sign_text(t, "pin.json", &k, "x");
	CHECK(trust(t, s, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "tokenizer.model") &&
		  strstr(err.msg, "pin"),
	      "one digest off the pin rejected: %s", err.msg);
	sfw_free(t);
	sfw_free(s);
	tok[0] = 'b';
	/* Drop the last file: the pin lists 15. */
	char *last = strrchr(files.data, '{');
	last[-2] = '\0';
	d.total = "14";
	t = mf_text(&d);
	s = sign_text(t, "pin.json", &k, "x");
	CHECK(trust(t, s, &p, NULL, &err) == SFW_E_MANIFEST && strstr(err.msg, "pin"),
	      "a file short of the pin: %s", err.msg);
	sfw_free(t);
	sfw_free(s);
	sfw_buf_release(&files);
	sfw_buf_release(&shared);
	sfw_buf_release(&local);
}

/* ---- directory verification ------------------------------------------------------ */

static void put(const char *rel, const char *content)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", tmp, rel);
	SFW_ASSERT(sfw_write_file_atomic(p, content, strlen(content), NULL) == SFW_OK);
}

static void sh(const char *fmt, const char *a)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), fmt, a, a, a);
	SFW_ASSERT(system(cmd) == 0);
}

static enum sfw_status vdir(const struct sfw_manifest *m, int threads, int record,
			    struct sfw_verify_report *rep, struct sfw_err *err)
{
	char dir[400];
	snprintf(dir, sizeof(dir), "%s/model", tmp);
	struct sfw_verify_params vp = sfw_verify_default_params();
	vp.threads = threads;
	vp.record_state = record;
	return sfw_verify_dir(dir, m, &vp, rep, err);
}

static void test_verify_dir(void)
{
	char dir[400];
	snprintf(dir, sizeof(dir), "%s/model", tmp);
	sh("mkdir -p '%s/model/sub' '%s/outside/sub'", tmp);
	put("model/a.bin", "abc");
	put("model/sub/c.txt", TEXT_56);
	put("outside/a.bin", "abc");
	put("outside/sub/c.txt", TEXT_56);
	struct tkey k;
	tkey_make(&k, 1, "\x11\x22\x33\x44\x55\x66\x77\x88");
	struct mf d = mf_default();
	d.key = k.id;
	char *t = mf_text(&d);
	struct sfw_manifest m;
	struct sfw_err err = {0};
	SFW_ASSERT(sfw_manifest_parse(t, strlen(t), "m", &m, NULL) == SFW_OK);
	struct sfw_verify_report rep;
	struct stat before, after;
	char ap[500];
	snprintf(ap, sizeof(ap), "%s/a.bin", dir);
	SFW_ASSERT(stat(ap, &before) == 0);
	for (int th = 1; th <= 2; th++) {
		CHECK(vdir(&m, th, 0, &rep, &err) == SFW_OK && rep.nbad == 0 && rep.nextra == 0 &&
			  rep.results[0] == SFW_FILE_OK && rep.results[1] == SFW_FILE_OK,
		      "good tree verifies with %d thread(s): %s", th, err.msg);
		sfw_verify_report_release(&rep);
	}
	SFW_ASSERT(stat(ap, &after) == 0);
	CHECK(before.st_mtim.tv_nsec == after.st_mtim.tv_nsec &&
		  before.st_mtim.tv_sec == after.st_mtim.tv_sec &&
		  before.st_ctim.tv_sec == after.st_ctim.tv_sec &&
		  before.st_ctim.tv_nsec == after.st_ctim.tv_nsec,
	      "verify does not touch model files");
	char sp[500];
	snprintf(sp, sizeof(sp), "%s/.salafw/state.json", dir);
	CHECK(access(sp, F_OK) != 0, "no state without record_state");

	/* The record vouches for what was hashed: the ids of the report match
	 * the files now; a file changed after its hash (same bytes even) is
	 * refused, and nothing is written. */
	CHECK(vdir(&m, 1, 0, &rep, &err) == SFW_OK, "ids for the record: %s", err.msg);
	struct sfw_state_file sf[2] = {{m.files[0].path, 1, rep.ids[0]}, {m.files[1].path, 1, rep.ids[1]}};
	CHECK(rep.ids[0].size == 3 && rep.ids[0].ino == (uint64_t)before.st_ino, "report id = the file's stat");
	sfw_verify_report_release(&rep);
	usleep(20000);
	put("model/a.bin", "abc"); /* rewritten: same bytes, new times */
	CHECK(sfw_state_record(dir, &m, sf, 2, &err) == SFW_E_IO && strstr(err.msg, "a.bin") &&
		  strstr(err.msg, "changed after it was verified") && access(sp, F_OK) != 0,
	      "a file changed after its hash is not recorded: %s", err.msg);
	CHECK(vdir(&m, 1, 0, &rep, &err) == SFW_OK, "ids again: %s", err.msg);
	sf[0].id = rep.ids[0];
	sfw_verify_report_release(&rep);
	CHECK(sfw_state_record(dir, &m, sf, 2, &err) == SFW_OK && access(sp, F_OK) == 0, "recorded: %s", err.msg);
	sh("rm -rf '%s/model/.salafw'", tmp);
	SFW_ASSERT(stat(ap, &before) == 0);

	put("model/extra.txt", "x");
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_OK && rep.nextra == 1 &&
		  strcmp(rep.extra[0], "extra.txt") == 0,
	      "extra file listed, still ok");
	sfw_verify_report_release(&rep);
	sh("rm '%s/model/extra.txt'", tmp);

	put("model/a.bin", "abd");
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_E_HASH && rep.results[0] == SFW_FILE_HASH && rep.nbad == 1 &&
		  strstr(err.msg, "a.bin") && strstr(err.msg, "sha256 mismatch"),
	      "hash mismatch: %s", err.msg);
	sfw_verify_report_release(&rep);
	put("model/a.bin", "abcd");
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_E_SIZE && rep.results[0] == SFW_FILE_SIZE &&
		  strstr(err.msg, "size"),
	      "size mismatch: %s", err.msg);
	sfw_verify_report_release(&rep);
	sh("rm '%s/model/a.bin'", tmp);
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_E_MISSING && rep.results[0] == SFW_FILE_MISSING &&
		  strstr(err.msg, "missing"),
	      "missing file: %s", err.msg);
	sfw_verify_report_release(&rep);
	sh("ln -s ../outside/a.bin '%s/model/a.bin'", tmp);
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_E_PATH && rep.results[0] == SFW_FILE_NOT_REGULAR,
	      "symlinked file refused: %s", err.msg);
	sfw_verify_report_release(&rep);
	sh("rm '%s/model/a.bin'", tmp);
	put("model/a.bin", "abc");
	sh("rm -r '%s/model/sub' && ln -s ../outside/sub '%s/model/sub'", tmp);
	CHECK(vdir(&m, 2, 0, &rep, &err) == SFW_E_PATH && rep.results[1] == SFW_FILE_NOT_REGULAR &&
		  strstr(err.msg, "sub/c.txt"),
	      "symlinked subdirectory refused: %s", err.msg);
	sfw_verify_report_release(&rep);
	sh("rm '%s/model/sub' && mkdir '%s/model/sub'", tmp);
	put("model/sub/c.txt", TEXT_56);
	/* Two problems at once: the worst decides the code, the count is given. */
	put("model/a.bin", "abd");
	sh("rm '%s/model/sub/c.txt'", tmp);
	CHECK(vdir(&m, 1, 0, &rep, &err) == SFW_E_HASH && rep.nbad == 2 && strstr(err.msg, "2 of 2"),
	      "two problems: %s", err.msg);
	sfw_verify_report_release(&rep);
	put("model/a.bin", "abc");
	put("model/sub/c.txt", TEXT_56);
	char missing[400];
	snprintf(missing, sizeof(missing), "%s/nope", tmp);
	CHECK(sfw_verify_dir(missing, &m, NULL, &rep, &err) == SFW_E_IO && strstr(err.msg, "nope"),
	      "missing DIR: %s", err.msg);

	/* The verified-state record and the runner's cheap check. */
	struct sfw_trust_params p = sfw_trust_default_params();
	p.keys = &k.pk;
	p.nkeys = 1;
	p.state_dir = "";
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED && strstr(err.msg, "signed manifest"),
	      "no manifest in .salafw: %s", err.msg);
	sh("mkdir -p '%s/model/.salafw'", tmp);
	char *sig = sign_text(t, "model/.salafw/manifest.json", &k, "x");
	sfw_free(sig);
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED && strstr(err.msg, "not been verified"),
	      "no state yet: %s", err.msg);
	CHECK(vdir(&m, 2, 1, &rep, &err) == SFW_OK, "verify and record");
	sfw_verify_report_release(&rep);
	CHECK(access(sp, R_OK) == 0, "state.json written");
	CHECK(sfw_state_check(dir, &p, &err) == SFW_OK, "state check ok: %s", err.msg);
	struct sfw_buf sb;
	if (sfw_read_file(sp, 1 << 20, &sb, NULL) == SFW_OK) {
		char ino[64];
		snprintf(ino, sizeof(ino), "\"%llu\"", (unsigned long long)after.st_ino);
		CHECK(strstr(sb.data, "\"sub/c.txt\"") && strstr(sb.data, "mtime_ns") &&
			  strstr(sb.data, "ctime_ns") && strstr(sb.data, "verified_at") &&
			  strstr(sb.data, "\"dev\""),
		      "state.json has the per-file record");
		sfw_buf_release(&sb);
	}
	/* Wrong trusted key: the manifest re-check fails. */
	struct tkey other;
	tkey_make(&other, 9, "OTHERKEY");
	struct sfw_trust_params po = p;
	po.keys = &other.pk;
	CHECK(sfw_state_check(dir, &po, &err) == SFW_E_KEYID, "state check re-verifies the signature: %s",
	      err.msg);
	/* Any change of mtime is noticed with stat alone. */
	struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
	SFW_ASSERT(utimensat(AT_FDCWD, ap, ts, 0) == 0);
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED && strstr(err.msg, "a.bin") &&
		  strstr(err.msg, "changed"),
	      "touched file: %s", err.msg);
	CHECK(vdir(&m, 2, 1, &rep, &err) == SFW_OK, "re-verify");
	sfw_verify_report_release(&rep);
	CHECK(sfw_state_check(dir, &p, &err) == SFW_OK, "ok after re-verify: %s", err.msg);
	/* Replaced file (same content, new inode). */
	char np[520];
	snprintf(np, sizeof(np), "%s.new", ap);
	SFW_ASSERT(sfw_write_file_atomic(np, "abc", 3, NULL) == SFW_OK && rename(np, ap) == 0);
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED, "replaced file noticed");
	sh("rm '%s/model/sub/c.txt'", tmp);
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_MISSING ||
		  sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED,
	      "missing file noticed: %s", err.msg);
	/* A record made for another manifest does not count. */
	put("model/sub/c.txt", TEXT_56);
	CHECK(vdir(&m, 2, 1, &rep, &err) == SFW_OK, "re-verify");
	sfw_verify_report_release(&rep);
	struct mf d2 = d;
	d2.ver = "2";
	char *t2 = mf_text(&d2);
	sfw_free(sign_text(t2, "model/.salafw/manifest.json", &k, "x"));
	CHECK(sfw_state_check(dir, &p, &err) == SFW_E_UNVERIFIED && strstr(err.msg, "another manifest"),
	      "state for another manifest: %s", err.msg);
	sfw_free(t2);
	sfw_manifest_release(&m);
	sfw_free(t);
}

/* Publisher: the manifest command's builder, checked against known digests. */
static void test_build(void)
{
	char dir[400];
	snprintf(dir, sizeof(dir), "%s/model", tmp);
	struct sfw_manifest_build_params bp = sfw_manifest_build_default_params();
	bp.repo_id = "org/tiny";
	bp.revision = REV;
	bp.key_id = "8877665544332211";
	bp.created = 1767225600;
	struct sfw_source src = {SFW_SOURCE_HTTP, "https://m.example/x/", NULL};
	bp.sources = &src;
	bp.nsources = 1;
	char *text = NULL;
	size_t len = 0;
	struct sfw_err err = {0};
	CHECK(sfw_manifest_build(dir, &bp, &text, &len, &err) == SFW_OK, "build: %s", err.msg);
	if (!text)
		return;
	struct sfw_manifest m;
	CHECK(sfw_manifest_parse(text, len, "built", &m, &err) == SFW_OK, "built manifest parses: %s",
	      err.msg);
	char h0[65], h1[65];
	sfw_hex_encode(m.files[0].sha256, 32, h0);
	sfw_hex_encode(m.files[1].sha256, 32, h1);
	CHECK(m.nfiles == 2 && strcmp(m.files[0].path, "a.bin") == 0 && strcmp(h0, SHA_ABC) == 0 &&
		  strcmp(m.files[1].path, "sub/c.txt") == 0 && strcmp(h1, SHA_56) == 0 &&
		  m.total_size == 59 && m.expires == 1767225600 + 180 * 86400,
	      "built manifest has the FIPS digests, .salafw skipped");
	sfw_manifest_release(&m);
	sfw_free(text);
	sh("ln -s a.bin '%s/model/link'", tmp);
	CHECK(sfw_manifest_build(dir, &bp, &text, &len, &err) == SFW_E_PATH && strstr(err.msg, "link"),
	      "symlink refused by the builder: %s", err.msg);
	sh("rm '%s/model/link'", tmp);
}

int main(void)
{
	if (sodium_init() < 0)
		return 1;
	sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1); /* expected warnings stay quiet */
	snprintf(tmp, sizeof(tmp), "%s/salafw-manifest.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	test_parse();
	test_trust();
	test_pins();
	test_verify_dir();
	test_build();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("warning: could not remove %s\n", tmp);
	return CHECK_REPORT("test_manifest");
}
