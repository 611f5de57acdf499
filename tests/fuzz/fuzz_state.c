/* fuzz_state - libFuzzer target for DIR/.salafw/state.json, the record of
 * what was verified (verify/dirverify.c). The input is the state file of a
 * folder that holds tests/data/verify's signed fixture (set up once); both
 * readers of the record run on it: sfw_state_check (the runner's gate) and
 * sfw_state_record (which merges the records it keeps). The gate's answer
 * is a status with a message; a record written over any input is one the
 * gate reads again without a format error. Run from the repository root
 * (make fuzz), or with SFW_FUZZ_DATA naming tests/data/verify. */
#include "verify/verify.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"

#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];
static struct sfw_pubkey key;
static struct sfw_trust_params tp;
static struct sfw_manifest man;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p);
}

static void cleanup(void) /* the fixture folder goes with the process */
{
	if (dir[0])
		nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void die(const char *what, const struct sfw_err *err)
{
	fprintf(stderr, "fuzz_state: %s: %s\n", what, err ? err->msg : "");
	abort();
}

static void copy(const char *from_dir, const char *name)
{
	struct sfw_err err;
	struct sfw_buf b;
	char *src = sfw_path_join(from_dir, name), *dst = sfw_path_join(dir, name);
	if (!src || !dst || sfw_read_file(src, 1 << 20, &b, &err) != SFW_OK)
		die("cannot read the fixture", &err);
	if (sfw_write_file_atomic(dst, b.data, b.len, &err) != SFW_OK)
		die("cannot write the fixture", &err);
	sfw_buf_release(&b);
	sfw_free(src);
	sfw_free(dst);
}

static void setup(void)
{
	const char *fx = getenv("SFW_FUZZ_DATA") ? getenv("SFW_FUZZ_DATA") : "tests/data/verify";
	struct sfw_err err = {0};
	snprintf(dir, sizeof(dir), "%s/sfw-fuzz-state-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	char model[1024], sub[80];
	snprintf(model, sizeof(model), "%s/model", fx);
	if (!mkdtemp(dir))
		die("cannot make a folder", NULL);
	atexit(cleanup);
	snprintf(sub, sizeof(sub), "%s/sub", dir);
	if (mkdir(sub, 0755) != 0)
		die("cannot make a folder", NULL);
	copy(model, "config.json");
	copy(model, "sub/tok.txt");
	struct sfw_buf mb, sb;
	char mp[1100], sp[1100], kp[1100];
	snprintf(mp, sizeof(mp), "%s/manifest.json", fx);
	snprintf(sp, sizeof(sp), "%s/manifest.json.minisig", fx);
	snprintf(kp, sizeof(kp), "%s/minisign.pub", fx);
	if (sfw_pubkey_load(kp, &key, &err) != SFW_OK || sfw_read_file(mp, SFW_MANIFEST_MAX, &mb, &err) != SFW_OK ||
	    sfw_read_file(sp, SFW_MINISIG_MAX, &sb, &err) != SFW_OK)
		die("no fixture (run from the repository root or set SFW_FUZZ_DATA)", &err);
	tp = sfw_trust_default_params();
	tp.keys = &key;
	tp.nkeys = 1;
	tp.state_dir = "";
	if (sfw_manifest_verify(mb.data, mb.len, sb.data, sb.len, "fixture", &tp, &man, NULL, &err) != SFW_OK ||
	    sfw_state_install_manifest(dir, mb.data, mb.len, sb.data, sb.len, &err) != SFW_OK)
		die("the fixture does not verify", &err);
	sfw_buf_release(&mb);
	sfw_buf_release(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0])
		setup();
	struct sfw_err err = {0};
	char *state = sfw_path_join(dir, ".salafw/state.json");
	if (!state || sfw_write_file_atomic(state, data, size, &err) != SFW_OK)
		die("cannot write state.json", &err);
	err.msg[0] = 0;
	enum sfw_status s = sfw_state_check(dir, &tp, &err);
	if (s != SFW_OK && err.msg[0] == 0)
		abort(); /* every refusal says why */
	/* a verify of config.json records it over whatever was there */
	struct stat st;
	char *cfg = sfw_path_join(dir, "config.json");
	if (!cfg || stat(cfg, &st) != 0)
		abort();
	struct sfw_state_file f = {"config.json", 1, {0}};
	sfw_file_id_of(&st, &f.id);
	err.msg[0] = 0;
	s = sfw_state_record(dir, &man, &f, 1, &err);
	if (s != SFW_OK && err.msg[0] == 0)
		abort();
	if (s == SFW_OK) {
		err.msg[0] = 0;
		s = sfw_state_check(dir, &tp, &err);
		/* the record it wrote is well-formed: the gate either passes or
		 * names a file it has no (valid) record of */
		if (s != SFW_OK && (s != SFW_E_UNVERIFIED || !strstr(err.msg, "sub/tok.txt")))
			die("a record written over the input reads back wrong", &err);
	}
	sfw_free(cfg);
	sfw_free(state);
	return 0;
}
