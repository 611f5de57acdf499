/* verify_int.h - internal helpers shared by the verify module's files. */
#ifndef SFW_VERIFY_INT_H
#define SFW_VERIFY_INT_H

#include "verify.h"

#include <string.h>

/* sodium_init once (thread-safe); returns 0 when libsodium is usable. */
int sfwi_sodium_ready(void);

/* The parsed lines of a .minisig, after every structural check (steps 1-12 of
 * docs/fetch-verify.md §1.4) but before key id and signature checks. */
struct sfwi_minisig {
	unsigned char alg[2];
	unsigned char key_id[8];
	unsigned char sig[64];
	unsigned char global_sig[64];
	char trusted_comment[8192];
	size_t trusted_len;
};
SFW_MUST_CHECK enum sfw_status sfwi_minisig_parse(const char *text, size_t len, const char *name,
						  struct sfwi_minisig *out, struct sfw_err *err);

/* Pinned repo+revision file digests (manifests/pins/). NULL if not pinned. */
struct sfwi_pin_file {
	const char *sha256_hex;
	const char *path;
};
struct sfwi_pin {
	const char *repo_id;
	const char *revision;
	const char *manifest_sha256_hex;
	const char *key_id_hex;
	const struct sfwi_pin_file *files;
	size_t nfiles;
};
const struct sfwi_pin *sfwi_pin_find(const char *repo_id, const char *revision);
/* All pins, for tests: *n gets the count. */
const struct sfwi_pin *sfwi_pins(size_t *n);

/* The state dir: override, else the one given to sfw_verify_set_dirs.
 * Fresh string (sfw_free) or NULL when there is none. */
char *sfwi_state_dir(const char *override);
/* The user key's folder given to sfw_verify_set_dirs: fresh string or NULL. */
char *sfwi_key_dir(void);

/* Parses "YYYY-MM-DDTHH:MM:SSZ" into unix seconds. Returns 0 on success. */
int sfwi_parse_rfc3339(const char *s, int64_t *out);
void sfwi_format_rfc3339(int64_t t, char out[21]);

/* Folders that are never part of a model tree: the tool's state, git's,
 * and the Hugging Face local-dir cache (the manifest path rules reserve the
 * same names). name is one directory entry at `depth` under DIR, prefix the
 * path of its parent ("" at the top). */
static inline int sfwi_skip_dir_entry(const char *prefix, const char *name, int depth)
{
	return (depth == 0 && strcmp(name, ".salafw") == 0) || strcmp(name, ".git") == 0 ||
	       (depth == 1 && strcmp(prefix, ".cache") == 0 && strcmp(name, "huggingface") == 0);
}

#endif
