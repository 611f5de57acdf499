/* modules: verify core */
/* test_dest - the security rules of a destination folder (issue 12):
 * folders opened from DEST down refuse planted symlinks and folders of
 * another user; the signed manifest pair is installed as one unit (a full
 * disk or a kill before every step of the install, by the fault hook of
 * core/file.h, leaves exactly the old pair or exactly the new one); the
 * rollback record never goes down under concurrent commits (forked
 * processes); untrusted strings print escaped. Expected values are the
 * bytes written, not anything the code under test computes. */
#include "check.h"
#include "verify/verify.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[256];

static void run(const char *cmd)
{
	if (system(cmd) != 0)
		printf("note: '%s' failed\n", cmd);
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* ---- sfw_esc --------------------------------------------------------------- */

/* No C0/DEL byte, no C1 control, valid UTF-8: checked byte by byte here. */
static int printable(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		if (*p < 0x20 || *p == 0x7f)
			return 0;
		if (*p < 0x80) {
			p++;
			continue;
		}
		int len = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc2 ? 2 : 0;
		if (!len || (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
			return 0;
		for (int i = 1; i < len; i++)
			if ((p[i] & 0xc0) != 0x80)
				return 0;
		p += len;
	}
	return 1;
}

static void test_esc(void)
{
	char b[256];
	struct {
		const char *in, *want;
	} cases[] = {
	    {"plain.bin", "plain.bin"},
	    {"\x1b[31mred", "\\x1b[31mred"},
	    {"a\rverified evil.bin\n", "a\\x0dverified evil.bin\\x0a"},
	    {"tab\there", "tab\\x09here"},
	    {"del\x7f", "del\\x7f"},
	    {"back\\slash", "back\\\\slash"},
	    {"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"},
	    {"csi\xc2\x9b" "31m", "csi\\xc2\\x9b31m"},        /* C1 CSI as UTF-8 */
	    {"raw\x9b" "31m", "raw\\x9b31m"},                 /* C1 CSI as a lone byte */
	    {"bad\xff\xfe", "bad\\xff\\xfe"},
	    {"overlong\xc0\xaf", "overlong\\xc0\\xaf"},
	    {"surrogate\xed\xa0\x80", "surrogate\\xed\\xa0\\x80"},
	    {"cut\xe6\x97", "cut\\xe6\\x97"},
	    {"", ""},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		CHECK(strcmp(sfw_esc(cases[i].in, b, sizeof(b)), cases[i].want) == 0, "sfw_esc case %zu: got '%s'", i,
		      b);
	CHECK(strcmp(sfw_esc(NULL, b, sizeof(b)), "(null)") == 0, "sfw_esc(NULL)");
	/* bounded: a long string is cut with "...", never past cap */
	char small[16];
	memset(small, 'Z', sizeof(small));
	sfw_esc("\x1b\x1b\x1b\x1b\x1b\x1b\x1b\x1b", small, 12);
	CHECK(strcmp(small, "\\x1b\\x1b...") == 0 && small[12] == 'Z', "sfw_esc bounded: '%s'", small);
	sfw_esc("abcdefghijk", small, 12); /* 11 bytes + NUL fit exactly */
	CHECK(strcmp(small, "abcdefghijk") == 0, "sfw_esc exact fit: '%s'", small);
	sfw_esc("abcdefghijkl", small, 12);
	CHECK(strcmp(small, "abcdefgh...") == 0, "sfw_esc one over: '%s'", small);
	/* random bytes: always printable, and the escape is reversible in length */
	unsigned x = 12345;
	int ok = 1;
	for (int it = 0; it < 20000 && ok; it++) {
		char in[40], out[200];
		int n = 1 + (int)(x % 39);
		for (int i = 0; i < n; i++) {
			x = x * 1103515245u + 12345u;
			in[i] = (char)((x >> 16) & 0xff ? (x >> 16) & 0xff : 1);
		}
		in[n] = '\0';
		sfw_esc(in, out, sizeof(out));
		ok = printable(out) && strlen(out) < sizeof(out);
		if (!ok)
			printf("input %d bytes gave '%s'\n", n, out);
	}
	CHECK(ok, "sfw_esc output of 20000 random strings has no control byte and is valid UTF-8");
}

/* ---- folders opened from DEST down ---------------------------------------------------- */

static void test_dirs(void)
{
	char d[300], out[300], cmd[1024];
	struct sfw_err err = {0};
	snprintf(d, sizeof(d), "%s/dest", tmp);
	snprintf(out, sizeof(out), "%s/outside", tmp);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/sub %s && ln -s %s %s/link && touch %s/file", d, out, out, d, d);
	run(cmd);
	int root, fd;
	CHECK(sfw_dir_open(d, &root, &err) == SFW_OK, "open DEST: %s", err.msg);
	CHECK(sfw_dir_openat(root, d, "sub", 0, &fd, &err) == SFW_OK && fd >= 0, "real folder opens");
	close(fd);
	CHECK(sfw_dir_openat(root, d, "link", SFW_DIR_CREATE, &fd, &err) == SFW_E_PATH &&
		  strstr(err.msg, "unsafe path") && strstr(err.msg, "symlink") && strstr(err.msg, "/link"),
	      "symlinked folder refused: %s", err.msg);
	CHECK(sfw_dir_openat(root, d, "link/x/y", SFW_DIR_CREATE, &fd, &err) == SFW_E_PATH,
	      "symlink in the middle refused: %s", err.msg);
	CHECK(count_entries(out) == 0, "nothing made through the link");
	CHECK(sfw_dir_openat(root, d, "file/x", SFW_DIR_CREATE, &fd, &err) == SFW_E_PATH,
	      "a file where a folder should be: %s", err.msg);
	CHECK(sfw_dir_openat(root, d, "sub/../../x", SFW_DIR_CREATE, &fd, &err) == SFW_E_PATH, "'..' refused");
	CHECK(sfw_dir_openat(root, d, "new/a/b", SFW_DIR_CREATE, &fd, &err) == SFW_OK, "nested create: %s",
	      err.msg);
	close(fd);
	snprintf(cmd, sizeof(cmd), "%s/new/a/b", d);
	struct stat st;
	CHECK(lstat(cmd, &st) == 0 && S_ISDIR(st.st_mode), "made for real");
	CHECK(sfw_dir_openat(root, d, "missing", 0, &fd, &err) == SFW_E_MISSING, "missing without create");

	/* the state folder: planted symlink, or another user's */
	char d2[300];
	snprintf(d2, sizeof(d2), "%s/d2", tmp);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s && ln -s %s %s/.salafw", d2, out, d2);
	run(cmd);
	CHECK(sfw_state_dir_open(d2, NULL, 1, &fd, &err) == SFW_E_PATH && strstr(err.msg, ".salafw"),
	      "symlinked .salafw refused for writing: %s", err.msg);
	CHECK(sfw_state_dir_open(d2, NULL, 0, &fd, &err) == SFW_E_PATH, "... and for reading");
	struct sfw_buf mb, sb;
	CHECK(sfw_state_read_manifest(d2, &mb, &sb, &err) == SFW_E_PATH, "pair not read through it: %s",
	      err.msg);
	CHECK(sfw_state_install_manifest(d2, "m", 1, "s", 1, &err) == SFW_E_PATH, "pair not written through it");
	CHECK(count_entries(out) == 0, "nothing written outside DEST");
	snprintf(cmd, sizeof(cmd), "rm %s/.salafw && mkdir -p %s/.salafw && ln -s %s %s/.salafw/partial", d2, d2,
		 out, d2);
	run(cmd);
	CHECK(sfw_state_dir_open(d2, "partial", 1, &fd, &err) == SFW_E_PATH && strstr(err.msg, "partial"),
	      "symlinked .salafw/partial refused: %s", err.msg);
	if (geteuid() == 0) {
		snprintf(cmd, sizeof(cmd), "%s/.salafw", d2);
		CHECK(chown(cmd, 65534, 65534) == 0, "chown to nobody");
		CHECK(sfw_state_dir_open(d2, NULL, 1, &fd, &err) == SFW_E_PATH &&
			  strstr(err.msg, "another user"),
		      ".salafw of another user refused for writing: %s", err.msg);
		CHECK(sfw_state_install_manifest(d2, "m", 1, "s", 1, &err) == SFW_E_PATH &&
			  count_entries(cmd) == 1,
		      "no pair written into it (only the planted link there)");
		CHECK(sfw_state_dir_open(d2, NULL, 0, &fd, &err) == SFW_OK, "... read is fine: %s", err.msg);
		close(fd);
	} else {
		printf("note: not root, the other-user case runs in tests/test_dest.sh only as root\n");
	}
	close(root);
}

/* ---- the pair as one unit ----------------------------------------------------------------- */

static const char M1[] = "{\"manifest\": 1}\n", S1[] = "sig of manifest 1\n";
static const char M2[] = "{\"manifest\": 2, \"longer\": true}\n", S2[] = "sig of manifest 2\n";
static const char M3[] = "{\"manifest\": 3}\n", S3[] = "sig of manifest 3\n";

static int hook_at, hook_n, hook_kill;
static int hook(const char *op, const char *name)
{
	(void)op;
	(void)name;
	if (++hook_n != hook_at)
		return 0;
	if (hook_kill)
		_exit(9); /* SIGKILL's effect: nothing after this instant happens */
	return ENOSPC;
}

/* Which pair the folder reads as: 1, 2, 3, 0 for a mix or none. */
static int which_pair(const char *dir)
{
	struct sfw_buf m, s;
	struct sfw_err err = {0};
	if (sfw_state_read_manifest(dir, &m, &s, &err) != SFW_OK)
		return 0;
	const char *ms[3] = {M1, M2, M3}, *ss[3] = {S1, S2, S3};
	int r = 0;
	for (int i = 0; i < 3; i++)
		if (m.len == strlen(ms[i]) && memcmp(m.data, ms[i], m.len) == 0 && s.len == strlen(ss[i]) &&
		    memcmp(s.data, ss[i], s.len) == 0)
			r = i + 1;
	sfw_buf_release(&m);
	sfw_buf_release(&s);
	return r;
}

/* .salafw holds exactly the pair (no step folder left, no temporary). */
static int tidy(const char *dir)
{
	char p[400];
	snprintf(p, sizeof(p), "%s/.salafw", dir);
	return count_entries(p) == 2;
}

static void fresh_v1(const char *dir)
{
	char cmd[600];
	struct sfw_err err = {0};
	snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s", dir, dir);
	run(cmd);
	if (sfw_state_install_manifest(dir, M1, strlen(M1), S1, strlen(S1), &err) != SFW_OK)
		printf("note: v1 install failed: %s\n", err.msg);
}

static void test_pair(void)
{
	char d[300], p[400];
	struct sfw_err err = {0};
	snprintf(d, sizeof(d), "%s/pair", tmp);
	fresh_v1(d);
	CHECK(which_pair(d) == 1 && tidy(d), "v1 installed, nothing else left");
	/* the layout is the old one: the two files at their old names */
	snprintf(p, sizeof(p), "%s/.salafw/manifest.json", d);
	struct sfw_buf b;
	CHECK(sfw_read_file(p, 1 << 20, &b, &err) == SFW_OK && b.len == strlen(M1) && memcmp(b.data, M1, b.len) == 0,
	      "manifest.json where it always was");
	sfw_buf_release(&b);
	/* count the fault points of one v1 -> v2 install */
	hook_at = -1, hook_n = 0, hook_kill = 0;
	sfwi_fault_hook = hook;
	CHECK(sfw_state_install_manifest(d, M2, strlen(M2), S2, strlen(S2), &err) == SFW_OK, "v2 install: %s",
	      err.msg);
	sfwi_fault_hook = NULL;
	int points = hook_n;
	CHECK(points >= 6 && which_pair(d) == 2 && tidy(d), "v2 installed through %d fault points", points);

	/* ENOSPC (or any failure) at each point: old pair or new, never a mix */
	int saw_old = 0, saw_new = 0;
	for (int k = 1; k <= points + 1; k++) {
		fresh_v1(d);
		hook_at = k, hook_n = 0, hook_kill = 0;
		sfwi_fault_hook = hook;
		enum sfw_status s = sfw_state_install_manifest(d, M2, strlen(M2), S2, strlen(S2), &err);
		sfwi_fault_hook = NULL;
		int w = which_pair(d);
		CHECK(w == 1 || w == 2, "ENOSPC at point %d of %d: reads as pair %d (want 1 or 2)", k, points, w);
		CHECK(k <= points ? s != SFW_OK : s == SFW_OK, "ENOSPC at point %d: install says %d", k, s);
		CHECK(w == 2 || s != SFW_OK, "a successful install reads as the new pair");
		saw_old += w == 1, saw_new += w == 2;
		/* the next install finishes or sweeps what was left */
		CHECK(sfw_state_install_manifest(d, M3, strlen(M3), S3, strlen(S3), &err) == SFW_OK &&
			  which_pair(d) == 3 && tidy(d),
		      "after ENOSPC at %d, the next install is clean: %s", k, err.msg);
	}
	CHECK(saw_old && saw_new, "faults before the commit keep v1 (%d), after it give v2 (%d)", saw_old, saw_new);

	/* killed before each point (a child process dies there) */
	saw_old = saw_new = 0;
	for (int k = 1; k <= points + 1; k++) {
		fresh_v1(d);
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			hook_at = k, hook_n = 0, hook_kill = 1;
			sfwi_fault_hook = hook;
			struct sfw_err e2;
			_exit(sfw_state_install_manifest(d, M2, strlen(M2), S2, strlen(S2), &e2) == SFW_OK ? 0 : 1);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		int killed = WIFEXITED(st) && WEXITSTATUS(st) == 9;
		CHECK(k <= points ? killed : WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d ended as planned", k);
		int w = which_pair(d);
		CHECK(w == 1 || w == 2, "killed at point %d of %d: reads as pair %d (want 1 or 2)", k, points, w);
		saw_old += w == 1, saw_new += w == 2;
		CHECK(sfw_state_install_manifest(d, M3, strlen(M3), S3, strlen(S3), &err) == SFW_OK &&
			  which_pair(d) == 3 && tidy(d),
		      "after a kill at %d, the next install is clean: %s", k, err.msg);
	}
	CHECK(saw_old && saw_new, "kills before the commit keep v1 (%d), after it give v2 (%d)", saw_old, saw_new);

	/* a kill in step 3 (signature moved, manifest not yet): hand-made, and
	 * read without any writer finishing it */
	fresh_v1(d);
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "mkdir %s/.salafw/manifest.next", d);
	run(cmd);
	snprintf(p, sizeof(p), "%s/.salafw/manifest.next/manifest.json", d);
	put(p, M2);
	snprintf(p, sizeof(p), "%s/.salafw/manifest.json.minisig", d);
	put(p, S2);
	CHECK(which_pair(d) == 2, "half-moved step 3 reads as the new pair");
	snprintf(p, sizeof(p), "%s/.salafw/manifest.next/junk", d);
	put(p, "planted");
	CHECK(sfw_state_install_manifest(d, M3, strlen(M3), S3, strlen(S3), &err) == SFW_OK && which_pair(d) == 3 &&
		  tidy(d),
	      "the next install finishes it, junk in manifest.next or not: %s", err.msg);
}

/* ---- the rollback record under concurrent commits ------------------------------------------- */

static uint64_t stored_version(const char *state)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/trusted/org--tiny.8877665544332211.json", state);
	struct sfw_buf b;
	uint64_t v = 0;
	if (sfw_read_file(p, 65536, &b, NULL) != SFW_OK)
		return 0;
	const char *k = strstr(b.data, "\"manifest_version\": ");
	if (k)
		v = strtoull(k + 20, NULL, 10);
	sfw_buf_release(&b);
	return v;
}

static void test_ratchet(void)
{
	char state[300];
	snprintf(state, sizeof(state), "%s/state", tmp);
	enum { KIDS = 6, EACH = 60 };
	fflush(stdout);
	pid_t pids[KIDS];
	for (int c = 0; c < KIDS; c++) {
		pids[c] = fork();
		if (pids[c] == 0) {
			/* child c takes in versions c+1, c+1+KIDS, ...: all race upwards */
			struct sfw_manifest m;
			memset(&m, 0, sizeof(m));
			m.repo_id = "org/tiny";
			snprintf(m.publisher_key_id, sizeof(m.publisher_key_id), "8877665544332211");
			snprintf(m.revision, sizeof(m.revision), "0123456789abcdef0123456789abcdef01234567");
			struct sfw_trust_params tp = sfw_trust_default_params();
			tp.state_dir = state;
			tp.allow_downgrade = c % 2; /* both kinds of caller */
			int bad = 0;
			for (int i = 0; i < EACH; i++) {
				m.manifest_version = (uint64_t)(c + 1 + i * KIDS);
				memset(m.manifest_sha256, (int)(m.manifest_version & 0xff), 32);
				struct sfw_err e;
				enum sfw_status s = sfw_manifest_ratchet_commit(&m, &tp, &e);
				/* refused as a rollback (a newer one came in) or recorded */
				if (s != SFW_OK && !(s == SFW_E_MANIFEST && !tp.allow_downgrade))
					bad |= 1;
				/* what is recorded is never below what this child just took in */
				if (s == SFW_OK && stored_version(state) < m.manifest_version)
					bad |= 2;
			}
			_exit(bad);
		}
	}
	int worst = 0;
	for (int c = 0; c < KIDS; c++) {
		int st = 0;
		waitpid(pids[c], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			worst |= WIFEXITED(st) ? WEXITSTATUS(st) : 4;
	}
	CHECK(!(worst & 1), "concurrent commits: each either recorded or refused as a rollback");
	CHECK(!(worst & 2), "concurrent commits never lowered the record below a committed version");
	CHECK(!(worst & 4), "children exited normally");
	CHECK(stored_version(state) == KIDS * EACH, "the record ends at the highest version (%llu, want %d)",
	      (unsigned long long)stored_version(state), KIDS * EACH);
}

int main(void)
{
	sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1);
	snprintf(tmp, sizeof(tmp), "%s/sfw-dest-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	test_esc();
	test_dirs();
	test_pair();
	test_ratchet();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	run(cmd);
	return CHECK_REPORT("test_dest");
}
