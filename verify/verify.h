/* verify.h - minisign signatures, signed manifests, SHA-256, and the record
 * of what was verified. Public API of the verify module (libsodium, OpenSSL,
 * cJSON). See manifests/README.md for the manifest schema and the trusted
 * comment convention.
 *
 * Trust flow (docs/fetch-verify.md §5.4): size caps -> minisign (parse, key id,
 * signature over the exact bytes, global signature over sig || trusted
 * comment) -> strict JSON -> schema -> publisher.key_id -> binding (repo_id,
 * revision) -> pins -> expiry -> rollback ratchet -> per-file rules. */
#ifndef SFW_VERIFY_H
#define SFW_VERIFY_H

#include "buf.h"
#include "sfw.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define SFW_MANIFEST_MAX (1u << 20)  /* 1 MiB cap, checked before parsing */
#define SFW_MINISIG_MAX (16u << 10)  /* a .minisig is < 10 KiB by minisign's limits */

/* ---- SHA-256 (OpenSSL EVP) ---------------------------------------------- */
struct sfw_sha256 {
	void *ctx; /* EVP_MD_CTX */
};
SFW_MUST_CHECK enum sfw_status sfw_sha256_init(struct sfw_sha256 *h);
void sfw_sha256_update(struct sfw_sha256 *h, const void *p, size_t n);
void sfw_sha256_final(struct sfw_sha256 *h, unsigned char out[32]);
void sfw_sha256_release(struct sfw_sha256 *h);
/* Hashes a whole file with large sequential reads; *size gets its length. */
SFW_MUST_CHECK enum sfw_status sfw_sha256_file(const char *path, unsigned char out[32], uint64_t *size,
					       struct sfw_err *err);
/* Hashes the first `len` bytes of an open fd (used to re-hash a partial). */
SFW_MUST_CHECK enum sfw_status sfw_sha256_fd_prefix(int fd, uint64_t len, struct sfw_sha256 *h,
						    struct sfw_err *err);
void sfw_hex_encode(const unsigned char *in, size_t n, char *out /* 2n+1 */);
/* Exactly 2n lower-case hex digits. Returns 0 on success. */
int sfw_hex_decode(const char *hex, unsigned char *out, size_t n);

/* ---- minisign ------------------------------------------------------------ */
struct sfw_pubkey {
	unsigned char key_id[8]; /* raw bytes as stored (minisign prints them little-endian) */
	unsigned char pk[32];
};
/* Key file (two lines) or bare base64 (-P form). `what` names it in errors. */
SFW_MUST_CHECK enum sfw_status sfw_pubkey_parse(const char *text, size_t len, const char *what,
						struct sfw_pubkey *out, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_pubkey_load(const char *path, struct sfw_pubkey *out, struct sfw_err *err);
/* The signed-weights service's pinned key (manifests/freeweights.pub). */
void sfw_pubkey_pinned(struct sfw_pubkey *out);
/* Key id as minisign prints it: 16 upper-case hex digits, little-endian. */
void sfw_pubkey_id_hex(const unsigned char key_id[8], char out[17]);

struct sfw_minisig_info {
	int prehashed;                /* 1 = "ED", 0 = legacy "Ed" */
	unsigned char key_id[8];
	char trusted_comment[8192];   /* verified text, without the prefix */
};
/* Verifies msg against a .minisig text, in minisign's order, with every check
 * minisign makes. SFW_E_SIG / SFW_E_KEYID / SFW_E_FORMAT on rejection. */
SFW_MUST_CHECK enum sfw_status sfw_minisig_verify(const void *msg, size_t msg_len, const char *sig_text,
						  size_t sig_len, const char *sig_name,
						  const struct sfw_pubkey *key, int require_prehashed,
						  struct sfw_minisig_info *info, struct sfw_err *err);

/* Publisher side (sign/keygen): unencrypted minisign-format keys. */
struct sfw_seckey {
	unsigned char key_id[8];
	unsigned char sk[64];
};
/* The pair is one unit: both written to temporary names, then the public
 * key renamed into place, then the secret key; a failure (a full disk)
 * leaves neither. */
SFW_MUST_CHECK enum sfw_status sfw_keygen(const char *pub_path, const char *sec_path, int force,
					  struct sfw_err *err);
/* The public half a secret key carries (minisign secret keys hold it). */
void sfw_seckey_pubkey(const struct sfw_seckey *sk, struct sfw_pubkey *out);
/* Writes a minisign public key file atomically. */
SFW_MUST_CHECK enum sfw_status sfw_pubkey_write(const char *path, const struct sfw_pubkey *pk,
						struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_seckey_load(const char *path, struct sfw_seckey *out, struct sfw_err *err);
/* Writes "<file>.minisig" (prehashed ED) atomically with the given trusted comment. */
SFW_MUST_CHECK enum sfw_status sfw_sign_file(const char *file, const struct sfw_seckey *key,
					     const char *trusted_comment, struct sfw_err *err);
/* The same for bytes in memory that are (or are about to be) file's contents. */
SFW_MUST_CHECK enum sfw_status sfw_sign_bytes(const void *data, size_t len, const char *file,
					      const struct sfw_seckey *key, const char *trusted_comment,
					      struct sfw_err *err);

/* ---- manifest v1 --------------------------------------------------------- */
enum sfw_source_kind { SFW_SOURCE_HTTP, SFW_SOURCE_HF };

struct sfw_source {
	enum sfw_source_kind kind;
	char *url;  /* http: base_url ending in '/'; hf: endpoint without trailing '/' */
	char *name; /* may be NULL */
};

struct sfw_manifest_file {
	char *path;  /* validated: relative, normalised, safe */
	uint64_t size;
	unsigned char sha256[32];
};

/* The optional `lineage` object of a derived model's manifest (one that
 * salafw made from another, e.g. `salafw quant`): what it came from and how.
 *   "lineage": {"derived_by": "salafw/<version>", "method": "awq",
 *               "params": {"group_size": "128", ...},        (strings)
 *               "parent": {"repo_id": ..., "revision": <hex40>,
 *                          "manifest_sha256": <hex64>, "key_id": <hex16>}}
 * parent is absent when the input was not verified. Strict: no other keys,
 * at most SFW_LINEAGE_MAX_PARAMS params, printable ASCII values. */
#define SFW_LINEAGE_MAX_PARAMS 32
struct sfw_manifest_lineage {
	int present;
	char *derived_by; /* printable ASCII, at most 64 bytes */
	char *method;	  /* [a-z0-9_-], at most 32 bytes */
	size_t nparams;
	char *param_key[SFW_LINEAGE_MAX_PARAMS];   /* [a-z0-9_], at most 32 bytes */
	char *param_value[SFW_LINEAGE_MAX_PARAMS]; /* printable ASCII, at most 128 bytes */
	int has_parent;
	char *parent_repo_id;
	char parent_revision[41];
	unsigned char parent_manifest_sha256[32];
	char parent_key_id[17];
};

struct sfw_manifest {
	int schema_version;
	char *generator;
	char publisher_key_id[17]; /* 16 upper-case hex */
	char *repo_id;
	char revision[41];
	uint64_t manifest_version;
	int64_t created, expires; /* unix seconds */
	uint64_t total_size;
	struct sfw_manifest_file *files;
	size_t nfiles;
	struct sfw_source *sources;
	size_t nsources;
	unsigned char manifest_sha256[32]; /* of the exact signed bytes */
	struct sfw_manifest_lineage lineage;
};

/* Strict parse of already-verified bytes (schema, types, path rules, sorting,
 * total_size). Does not check signatures, binding or expiry. */
SFW_MUST_CHECK enum sfw_status sfw_manifest_parse(const char *bytes, size_t len, const char *what,
						  struct sfw_manifest *out, struct sfw_err *err);
void sfw_manifest_release(struct sfw_manifest *m);

/* Path rule of docs/fetch-verify.md §3.12-4. Returns SFW_OK or SFW_E_PATH. */
SFW_MUST_CHECK enum sfw_status sfw_path_check(const char *path, struct sfw_err *err);

struct sfw_trust_params {
	const struct sfw_pubkey *keys; /* trusted keys (pinned one by default) */
	size_t nkeys;
	const char *repo_id;      /* required binding, NULL = don't check */
	const char *revision;     /* required binding, NULL = don't check */
	int64_t now;              /* for expiry; 0 = time(NULL) */
	int allow_expired;        /* offline verify only warns */
	int allow_downgrade;       /* accept a lower manifest_version (an equal one with other bytes never) */
	int require_prehashed;
	const char *state_dir;    /* rollback ratchet dir; NULL = the one given to sfw_verify_set_dirs
				   * (none given: not checked, with a warning), "" = disabled */
};
struct sfw_trust_params sfw_trust_default_params(void);

/* The whole trust flow over manifest bytes and signature text: signature,
 * parse, key id, binding, pins, expiry, rollback (checked, not recorded). */
SFW_MUST_CHECK enum sfw_status sfw_manifest_verify(const char *bytes, size_t len, const char *sig_text,
						   size_t sig_len, const char *what,
						   const struct sfw_trust_params *p, struct sfw_manifest *out,
						   struct sfw_minisig_info *info, struct sfw_err *err);
/* Records manifest_version for rollback checks; call only after full success. */
SFW_MUST_CHECK enum sfw_status sfw_manifest_ratchet_commit(const struct sfw_manifest *m,
							   const struct sfw_trust_params *p,
							   struct sfw_err *err);

/* ---- publisher side: building and signing a manifest ---------------------- */
struct sfw_manifest_build_params {
	const char *repo_id;
	const char *revision;
	const char *key_id;        /* 16 hex; NULL writes "" for `sfw_manifest_sign` to fill in */
	const char *generator;     /* NULL = "salafw/<version>" */
	uint64_t manifest_version; /* 0 = 1 */
	int64_t created;           /* 0 = now */
	int64_t expires;           /* 0 = created + 180 days */
	const struct sfw_source *sources;
	size_t nsources;
	int threads;               /* 0 = all cores */
	const char *lineage_json;  /* NULL, or the `lineage` object's JSON text (checked by the parse) */
};
struct sfw_manifest_build_params sfw_manifest_build_default_params(void);
/* Hashes every regular file under dir (skipping the .salafw state folder;
 * symlinks and special files are refused) and returns the manifest text,
 * sorted by path (free with sfw_free). */
SFW_MUST_CHECK enum sfw_status sfw_manifest_build(const char *dir, const struct sfw_manifest_build_params *p,
						  char **text, size_t *len, struct sfw_err *err);
/* Signs a manifest file: fills an empty publisher.key_id with the key's id
 * (rewriting the file atomically), checks the result parses, refuses a key
 * id that differs, and writes FILE.minisig (prehashed) with the trusted
 * comment "salafw-manifest repo_id=<id> revision=<sha> manifest_version=<n>". */
SFW_MUST_CHECK enum sfw_status sfw_manifest_sign(const char *path, const struct sfw_seckey *key,
						 struct sfw_err *err);

/* ---- directory verification and the verified-state record ---------------- */
enum sfw_file_result { SFW_FILE_OK, SFW_FILE_MISSING, SFW_FILE_SIZE, SFW_FILE_HASH, SFW_FILE_NOT_REGULAR };

/* What a file was when its sha256 was computed: the stat of the open file
 * taken after the last byte was read (so a record never vouches for bytes
 * that were not hashed). */
struct sfw_file_id {
	uint64_t size, ino, dev, mtime_ns, ctime_ns;
};

struct sfw_verify_report {
	enum sfw_file_result *results; /* one per manifest file */
	struct sfw_file_id *ids;       /* one per manifest file; set where results[i] is OK */
	char **extra;                  /* files in DIR not in the manifest (excluding .salafw/) */
	size_t nextra;
	size_t nbad;
};

struct sfw_verify_params {
	int threads;        /* 0 = all cores */
	int record_state;   /* write DIR/.salafw/state.json for verified files */
	/* optional progress: called from worker threads, must be thread-safe */
	void (*on_file)(void *user, const struct sfw_manifest_file *f, enum sfw_file_result r);
	void *user;
};
struct sfw_verify_params sfw_verify_default_params(void);

/* Checks each file (lstat, regular, size, sha256); never modifies model files.
 * Returns SFW_OK if all match, SFW_E_MISSING/SFW_E_SIZE/SFW_E_HASH otherwise. */
SFW_MUST_CHECK enum sfw_status sfw_verify_dir(const char *dir, const struct sfw_manifest *m,
					      const struct sfw_verify_params *p, struct sfw_verify_report *rep,
					      struct sfw_err *err);
void sfw_verify_report_release(struct sfw_verify_report *rep);

/* DIR/.salafw/state.json: per file size, mtime_ns, ctime_ns, inode, dev and
 * when its sha256 matched. Record after a verified download or verify: each
 * checked file with its result; ok files with the id they had when hashed
 * (a file whose current stat differs from it is refused: it changed after
 * it was hashed); a file checked and found bad loses any earlier record;
 * records of files not named stay (same manifest only). */
struct sfw_state_file {
	const char *path;
	int ok;
	struct sfw_file_id id; /* when ok */
};
SFW_MUST_CHECK enum sfw_status sfw_state_record(const char *dir, const struct sfw_manifest *m,
						const struct sfw_state_file *files, size_t n, struct sfw_err *err);
/* Drops the records of files found bad when DIR's record was made for
 * manifest m (a verify against that same manifest elsewhere); leaves a record
 * for another manifest alone. */
SFW_MUST_CHECK enum sfw_status sfw_state_forget(const char *dir, const struct sfw_manifest *m,
						const struct sfw_verify_report *rep, struct sfw_err *err);
/* DIR/.salafw/manifest.json and its .minisig: the verified bytes, installed
 * as one unit (dirverify.c: the new pair is written in a fresh folder and
 * committed with one rename); after a kill or a full disk at any instant,
 * sfw_state_read_manifest gives the old pair or the new one, never a mix. */
SFW_MUST_CHECK enum sfw_status sfw_state_install_manifest(const char *dir, const void *man, size_t man_len,
							  const void *sig, size_t sig_len, struct sfw_err *err);
/* "Commit what was verified": the one step after a manifest verified and
 * its files checked out, for `get` (every file downloaded and hashed) and
 * `verify --manifest FILE` (every file of DIR matched). In this order:
 * records manifest_version for the rollback ratchet (tp->state_dir as in
 * sfw_manifest_verify); then, when man is not NULL, installs the signed
 * pair man/sig as DIR/.salafw/manifest.json + .minisig
 * (sfw_state_install_manifest) and records files[0..nfiles) in
 * DIR/.salafw/state.json (sfw_state_record: each with ok and the id it had
 * when hashed). man NULL: the ratchet only (`verify DIR` against the
 * folder's own pair, whose state sfw_verify_dir records). */
struct sfw_verified {
	const struct sfw_manifest *m; /* as sfw_manifest_verify gave it */
	const void *man, *sig;	      /* the exact signed bytes, or NULL */
	size_t man_len, sig_len;
	const struct sfw_state_file *files;
	size_t nfiles;
};
SFW_MUST_CHECK enum sfw_status sfw_verified_commit(const char *dir, const struct sfw_verified *v,
						   const struct sfw_trust_params *tp, struct sfw_err *err);
/* The pair as installed (what `verify DIR` and the runner check); also
 * reads the plain layout of older versions. SFW_E_MISSING when absent,
 * SFW_E_PATH for a symlinked .salafw or file. */
SFW_MUST_CHECK enum sfw_status sfw_state_read_manifest(const char *dir, struct sfw_buf *man, struct sfw_buf *sig,
						       struct sfw_err *err);
/* DIR/.salafw (and its folder sub, when not NULL) as a directory descriptor,
 * opened from DIR down without following symlinks. With write, made when
 * missing and required to belong to this process's user; refused otherwise
 * (SFW_E_PATH, "unsafe path: ..."). */
SFW_MUST_CHECK enum sfw_status sfw_state_dir_open(const char *dir, const char *sub, int write, int *fd,
						  struct sfw_err *err);
/* The id of an open file as sfw_state_record compares it. */
void sfw_file_id_of(const struct stat *st, struct sfw_file_id *id);
/* Cheap check that every manifest file still matches its record (stat only).
 * Also re-verifies DIR/.salafw/manifest.json against its signature. */
SFW_MUST_CHECK enum sfw_status sfw_state_check(const char *dir, const struct sfw_trust_params *p,
					       struct sfw_err *err);

/* ---- the folders the library is given -------------------------------------
 * verify/ reads no environment: the program names the per-user folders once,
 * before any other call (the CLI resolves them: cli/main.c). state_dir holds
 * the rollback ratchet (trust params' state_dir NULL), key_dir the user's
 * own key pair (below). NULL or "" = none (the ratchet is then not checked,
 * with a warning, and there is no user key). The strings are copied. */
void sfw_verify_set_dirs(const char *state_dir, const char *key_dir);

/* ---- the user's own key, for the models they derive (verify/userkey.c) ---
 * A per-user minisign key pair kept apart from the pinned publisher key:
 * KEY_DIR/user.key + user.pub (KEY_DIR given by sfw_verify_set_dirs; the
 * CLI's is $XDG_CONFIG_HOME/salafw, else ~/.config/salafw), folder 0700,
 * secret key 0600 and unencrypted (signing is one step in scripts; the key
 * is only ever trusted for the user's own derived models, below, so it
 * cannot stand in for a publisher). */
/* Fresh paths (sfw_free); NULL when no key folder was given. */
char *sfw_userkey_path(int secret);
/* The public key; SFW_E_MISSING when the user has none yet. */
SFW_MUST_CHECK enum sfw_status sfw_userkey_load_pub(struct sfw_pubkey *out, struct sfw_err *err);
/* The pair, created on first use (*created = 1 then; written as one unit,
 * sfw_keygen). A user.pub that is missing or not the secret key's public
 * half is written again from user.key (with a warning); a lone user.pub is
 * replaced by a new pair. */
SFW_MUST_CHECK enum sfw_status sfw_userkey_ensure(struct sfw_seckey *sk, struct sfw_pubkey *pk, int *created,
						  struct sfw_err *err);
/* The rule for the user's key: a manifest it signed is trusted only when it
 * is a derived one (a lineage object) of a local repo ("local/NAME") that
 * no pin names. SFW_E_MANIFEST (naming why) otherwise. */
SFW_MUST_CHECK enum sfw_status sfw_userkey_trust(const struct sfw_manifest *m, const char *what,
						 struct sfw_err *err);
/* "local/<name>" from a directory's last path component (HF's characters;
 * others become '-'). */
void sfw_local_repo_id(const char *dir, char *out, size_t cap);

/* The pinned release one of whose files (path, sha256) is this one: 1 and
 * *out filled (static strings), or 0. Names the get command that fetches a
 * directory's signed manifest back. */
struct sfw_pin_info {
	const char *repo_id, *revision;
};
int sfw_pin_of_file(const char *path, const unsigned char sha256[32], struct sfw_pin_info *out);

/* Publishes a derived model: hashes dir into a manifest for
 * local/<basename> (revision: the first 40 hex digits of the lineage's
 * sha256; manifest_version: the time, so a rebuild supersedes), written as
 * dir/.salafw/manifest.json; with key, signs it (user key id in the
 * manifest), then checks every file against it and records the verified
 * state, so the directory runs verified. Without key it removes a stale
 * signature and leaves the manifest for `salafw sign --user`. */
SFW_MUST_CHECK enum sfw_status sfw_derived_publish(const char *dir, const char *lineage_json,
						   const struct sfw_seckey *key, struct sfw_err *err);
/* Signs dir's existing derived manifest with key after checking every file
 * against it, and records the verified state. */
SFW_MUST_CHECK enum sfw_status sfw_derived_sign(const char *dir, const struct sfw_seckey *key,
						struct sfw_err *err);

#endif
