/* modules: core */
/* Core helpers against direct expectations: status mapping, checked
 * arithmetic, capped buffers, strict JSON, atomic writes, parallel-for. */
#include "check.h"

#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "file.h"
#include "json.h"
#include "log.h"
#include "utf8.h"
#include "thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Characters that hide or reorder text are escaped byte by byte like C1
 * controls (their UTF-8 bytes written out from the Unicode code charts);
 * other text, accents and CJK included, is kept. */
static void test_esc_hidden(void)
{
	static const struct {
		const char *in, *want;
	} t[] = {
		{"evil\xe2\x80\xaegnp.exe", "evil\\xe2\\x80\\xaegnp.exe"}, /* U+202E RIGHT-TO-LEFT OVERRIDE */
		{"a\xe2\x80\x8b" "b", "a\\xe2\\x80\\x8bb"},                  /* U+200B ZERO WIDTH SPACE */
		{"a\xe2\x80\x8d" "b", "a\\xe2\\x80\\x8db"},                  /* U+200D ZERO WIDTH JOINER */
		{"\xef\xbb\xbfname", "\\xef\\xbb\\xbfname"},                 /* U+FEFF BOM */
		{"x\xe2\x81\xa6y\xe2\x81\xa9", "x\\xe2\\x81\\xa6y\\xe2\\x81\\xa9"}, /* U+2066 LRI, U+2069 PDI */
		{"x\xd8\x9c", "x\\xd8\\x9c"},                                /* U+061C ARABIC LETTER MARK */
		{"x\xe2\x80\xa8y", "x\\xe2\\x80\\xa8y"},                     /* U+2028 LINE SEPARATOR */
		{"soft\xc2\xad" "hy", "soft\\xc2\\xadhy"},                   /* U+00AD SOFT HYPHEN */
		{"x\xe2\x80\x8e", "x\\xe2\\x80\\x8e"},                       /* U+200E LRM */
		{"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"}, /* kept */
		{"\xe2\x80\x90-\xe2\x80\xaf", "\xe2\x80\x90-\xe2\x80\xaf"},  /* U+2010 HYPHEN, U+202F NNBSP: kept */
		{"\xe2\x81\xa5", "\xe2\x81\xa5"},                            /* U+2065 (unassigned, between the ranges) */
		{"a\x1b[31m", "a\\x1b[31m"},                                 /* still: C0 */
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		char out[128];
		sfw_esc(t[i].in, out, sizeof(out));
		CHECK(strcmp(out, t[i].want) == 0, "sfw_esc case %zu: got '%s' want '%s'", i, out, t[i].want);
	}
	CHECK(sfw_utf8_hidden((const unsigned char *)"\xe2\x80\xae", 3) == 3, "U+202E is hidden, 3 bytes");
	CHECK(sfw_utf8_hidden((const unsigned char *)"\xe2\x80\xae", 2) == 0, "a cut sequence is not");
	CHECK(sfw_utf8_hidden((const unsigned char *)"\xc3\xa9", 2) == 0, "U+00E9 is not hidden");
}

/* The folding key against Python's unicodedata.normalize('NFC', s).casefold()
 * (values computed with it and written here). */
static void test_name_fold(void)
{
	static const struct {
		const char *in, *want;
	} t[] = {
		{"CAFE\xcc\x81", "caf\xc3\xa9"},         /* NFD, upper case */
		{"Caf\xc3\xa9", "caf\xc3\xa9"},          /* NFC */
		{"\xe2\x84\xab", "\xc3\xa5"},            /* U+212B ANGSTROM SIGN */
		{"\xc3\x85", "\xc3\xa5"},                /* U+00C5 */
		{"a\xcc\x8a", "\xc3\xa5"},               /* a + U+030A */
		{"Stra\xc3\x9f" "e", "strasse"},         /* full folding */
		{"Model-00001.SafeTensors", "model-00001.safetensors"},
		{"bad\xff" "NAME", "bad\xff" "name"},     /* not UTF-8: ASCII lower case only */
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		char *k = sfw_name_fold(t[i].in);
		CHECK(k && strcmp(k, t[i].want) == 0, "sfw_name_fold case %zu: got '%s'", i, k ? k : "(null)");
		sfw_free(k);
	}
}

static void test_status(void)
{
	struct sfw_err e;
	CHECK(sfw_fail(&e, SFW_E_IO, "cannot open '%s'", "x") == SFW_E_IO, "sfw_fail returns its code");
	CHECK(strcmp(e.msg, "cannot open 'x'") == 0, "sfw_fail formats the message");
	sfw_err_prefix(&e, "model");
	CHECK(strcmp(e.msg, "model: cannot open 'x'") == 0, "sfw_err_prefix prepends");
	CHECK(sfw_exit_code(SFW_OK) == 0 && sfw_exit_code(SFW_E_HASH) == 1 && sfw_exit_code(SFW_E_INVAL) == 2 &&
		      sfw_exit_code(SFW_E_SIG) == 3 && sfw_exit_code(SFW_E_EXHAUSTED) == 4 &&
		      sfw_exit_code(SFW_E_IO) == 5 && sfw_exit_code(SFW_E_EXISTS) == 5 && sfw_exit_code(SFW_E_NOSPACE) == 5,
	      "exit codes follow the documented table");
	for (int c = 0; c < SFW_E__COUNT; c++)
		CHECK(strcmp(sfw_strerror((enum sfw_status)c), "unknown error") != 0, "strerror names code %d", c);
}

static void test_checked(void)
{
	uint64_t r;
	CHECK(sfw_add_ok(1, 2, &r) && r == 3, "add");
	CHECK(!sfw_add_ok(UINT64_MAX, 1, &r), "add overflow detected");
	CHECK(!sfw_mul_ok(1ULL << 32, 1ULL << 32, &r), "mul overflow detected");
	CHECK(sfw_mul_ok(1ULL << 31, 1ULL << 32, &r) && r == 1ULL << 63, "mul in range");
	unsigned char b[8];
	sfw_le64_store(b, 0x0102030405060708ULL);
	CHECK(b[0] == 8 && b[7] == 1 && sfw_le64_load(b) == 0x0102030405060708ULL, "le64 round trip");
}

static void test_buf(void)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 10);
	CHECK(sfw_buf_append(&b, "hello", 5) == SFW_OK, "append within cap");
	CHECK(sfw_buf_append(&b, "world!", 6) == SFW_E_RANGE, "append past cap refused");
	CHECK(b.len == 5 && strcmp(b.data, "hello") == 0, "refused append leaves buffer intact");
	sfw_buf_release(&b);
	sfw_buf_init(&b, 1 << 20);
	sfw_alloc_fail_after(1);
	CHECK(sfw_buf_append(&b, "x", 1) == SFW_E_NOMEM, "allocation failure reported");
	sfw_alloc_fail_after(0);
	sfw_buf_release(&b);
}

static void test_json(void)
{
	cJSON *j;
	struct sfw_err e;
	const char *ok = "{\"a\": 1, \"b\": {\"c\": \"x\"}}";
	CHECK(sfw_json_parse(ok, strlen(ok), "t", &j, &e) == SFW_OK, "valid JSON parses");
	uint64_t v = 0;
	CHECK(j && sfw_json_u64(j, "a", "t", &v, &e) == SFW_OK && v == 1, "u64 read");
	CHECK(j && sfw_json_u64(j, "A", "t", &v, &e) == SFW_E_FORMAT, "lookups are case-sensitive");
	cJSON_Delete(j);
	j = NULL;
	CHECK(sfw_json_parse_object("{\"a\": 1}", 8, 8, "f", &j, &e) == SFW_OK && cJSON_IsObject(j),
	      "an object of max bytes parses");
	cJSON_Delete(j);
	CHECK(sfw_json_parse_object("{\"a\": 1}", 8, 7, "f", &j, &e) == SFW_E_RANGE && !j &&
		  !strcmp(e.msg, "f: larger than 7 bytes"),
	      "one byte over max is refused before parsing: %s", e.msg);
	CHECK(sfw_json_parse_object("[1]", 3, 64, "f", &j, &e) == SFW_E_FORMAT && !j && !strcmp(e.msg, "f: not a JSON object"),
	      "an array is not an object: %s", e.msg);
	const char *dup = "{\"a\": 1, \"b\": {\"c\": 1, \"c\": 2}}";
	CHECK(sfw_json_parse(dup, strlen(dup), "t", &j, &e) == SFW_E_FORMAT && strstr(e.msg, "duplicate"),
	      "nested duplicate key rejected");
	/* many keys (a safetensors header of empty tensors): the first and the
	 * last equal is still found; all distinct parses */
	{
		size_t nk = 200000, cap = nk * 16 + 64, len = 0;
		char *wide = malloc(cap);
		len += (size_t)snprintf(wide + len, cap - len, "{");
		for (size_t i = 0; i < nk; i++)
			len += (size_t)snprintf(wide + len, cap - len, "%s\"k%zu\":0", i ? "," : "", i);
		len += (size_t)snprintf(wide + len, cap - len, "}");
		CHECK(sfw_json_parse(wide, len, "t", &j, &e) == SFW_OK, "%zu distinct keys parse", nk);
		cJSON_Delete(j);
		len -= 1;
		len += (size_t)snprintf(wide + len, cap - len, ",\"k0\":1}");
		CHECK(sfw_json_parse(wide, len, "t", &j, &e) == SFW_E_FORMAT && strstr(e.msg, "duplicate key 'k0'"),
		      "a duplicate %zu keys apart is found (%s)", nk, e.msg);
		free(wide);
	}
	const char *trail = "{\"a\": 1} x";
	CHECK(sfw_json_parse(trail, strlen(trail), "t", &j, &e) == SFW_E_FORMAT, "trailing bytes rejected");
	const char bad_utf8[] = "{\"a\": \"\xc0\xaf\"}";
	CHECK(sfw_json_parse(bad_utf8, strlen(bad_utf8), "t", &j, &e) == SFW_E_FORMAT, "overlong UTF-8 rejected");
	const char nul[] = "{\"a\": 1}\0";
	CHECK(sfw_json_parse(nul, sizeof(nul) - 1, "t", &j, &e) == SFW_E_FORMAT, "embedded NUL rejected");
	const char *big = "{\"a\": 9007199254740993, \"n\": -1, \"f\": 1.5, \"m\": 9007199254740991}";
	CHECK(sfw_json_parse(big, strlen(big), "t", &j, &e) == SFW_OK, "numbers parse");
	CHECK(sfw_json_u64(j, "a", "t", &v, &e) == SFW_E_RANGE, "> 2^53 rejected");
	CHECK(sfw_json_u64(j, "n", "t", &v, &e) == SFW_E_RANGE, "negative rejected");
	CHECK(sfw_json_u64(j, "f", "t", &v, &e) == SFW_E_RANGE, "fraction rejected");
	CHECK(sfw_json_u64(j, "m", "t", &v, &e) == SFW_OK && v == 9007199254740991ULL, "2^53-1 accepted");
	cJSON_Delete(j);
}

static void test_files(void)
{
	char dir[] = "/tmp/sfw-core-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	char *p = sfw_path_join(dir, "a/b/c");
	struct sfw_err e;
	CHECK(sfw_mkdirs(p, &e) == SFW_OK, "mkdirs creates nested directories");
	char *f = sfw_path_join(p, "file");
	CHECK(sfw_write_file_atomic(f, "abc", 3, &e) == SFW_OK, "atomic write");
	struct sfw_buf b;
	CHECK(sfw_read_file(f, 100, &b, &e) == SFW_OK && b.len == 3 && memcmp(b.data, "abc", 3) == 0,
	      "read back what was written");
	sfw_buf_release(&b);
	CHECK(sfw_read_file(f, 2, &b, &e) == SFW_E_RANGE, "read cap enforced");
	struct sfw_atomic a;
	CHECK(sfw_atomic_open(&a, f, &e) == SFW_OK, "atomic open over existing file");
	CHECK(sfw_atomic_write(&a, "zzzz", 4, &e) == SFW_OK, "write to temp");
	sfw_atomic_abort(&a);
	CHECK(sfw_read_file(f, 100, &b, &e) == SFW_OK && b.len == 3, "aborted write leaves target untouched");
	sfw_buf_release(&b);
	struct sfw_map m;
	CHECK(sfw_map_open(&m, f, &e) == SFW_OK && m.size == 3 && m.data[2] == 'c', "map reads the file");
	sfw_map_close(&m);
	CHECK(sfw_map_open(&m, "/nonexistent/x", &e) == SFW_E_MISSING && strstr(e.msg, "/nonexistent/x"),
	      "missing file named in error");
	/* a replaced file keeps its mode; a FIFO is refused, not waited on */
	struct stat st;
	CHECK(chmod(f, 0600) == 0 && sfw_write_file_atomic(f, "xyz", 3, &e) == SFW_OK && stat(f, &st) == 0 &&
		  (st.st_mode & 0777) == 0600,
	      "atomic replace keeps mode 0600 (got %o)", (unsigned)(st.st_mode & 0777));
	char *lnk = sfw_path_join(dir, "link"), *tgt = sfw_path_join(dir, "target");
	CHECK(sfw_write_file_atomic(tgt, "t", 1, &e) == SFW_OK && chmod(tgt, 0777) == 0 && symlink(tgt, lnk) == 0 &&
		  sfw_write_file_atomic(lnk, "n", 1, &e) == SFW_OK && lstat(lnk, &st) == 0 && S_ISREG(st.st_mode) &&
		  (st.st_mode & 0777) != 0777,
	      "replacing a link does not copy its target's mode (got %o)", (unsigned)(st.st_mode & 0777));
	sfw_free(lnk), sfw_free(tgt);
	char *fifo = sfw_path_join(dir, "fifo");
	CHECK(mkfifo(fifo, 0600) == 0 && sfw_read_file(fifo, 100, &b, &e) == SFW_E_IO && strstr(e.msg, "not a regular file"),
	      "a FIFO is refused at once: %s", e.msg);
	CHECK(sfw_map_open(&m, fifo, &e) == SFW_E_IO, "a FIFO is not mapped: %s", e.msg);
	sfw_free(fifo);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0, "cleanup");
	sfw_free(p);
	sfw_free(f);
}

/* The process's resident bytes (/proc/self/statm), -1 when unreadable. */
static long long resident_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long long size = 0, res = -1;
	if (f) {
		if (fscanf(f, "%lld %lld", &size, &res) != 2)
			res = -1;
		fclose(f);
	}
	return res < 0 ? -1 : res * sysconf(_SC_PAGESIZE);
}

/* sfw_map_release: a read range leaves the resident set and reads back the
 * same bytes (the CUDA upload and the quant writer lean on both). */
static void test_map_release(void)
{
	char dir[] = "/tmp/sfw-core-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	char *f = sfw_path_join(dir, "big");
	const size_t n = (size_t)64 << 20;
	unsigned char *src = sfw_malloc(n);
	CHECK(src != NULL, "64 MiB");
	if (!src)
		return;
	uint32_t x = 12345;
	for (size_t i = 0; i < n; i++)
		x = x * 1103515245u + 12345u, src[i] = (unsigned char)(x >> 24);
	struct sfw_err e;
	CHECK(sfw_write_file_atomic(f, src, n, &e) == SFW_OK, "write 64 MiB");
	struct sfw_map m;
	CHECK(sfw_map_open(&m, f, &e) == SFW_OK && m.size == n, "map it");
	long long r0 = resident_bytes();
	unsigned long long h = 0;
	for (size_t i = 0; i < n; i += 4096)
		h += m.data[i];
	long long r1 = resident_bytes();
	/* a range that does not start on a page: widened to whole pages */
	sfw_map_release(m.data + 1, n - 1);
	long long r2 = resident_bytes();
	CHECK(r0 >= 0 && r1 - r0 >= (long long)(n * 3 / 4) && r1 - r2 >= (long long)(n * 3 / 4),
	      "release drops the read pages from the resident set (%lld -> %lld -> %lld MiB)", r0 >> 20, r1 >> 20,
	      r2 >> 20);
	CHECK(memcmp(m.data, src, n) == 0 && h > 0, "the released range reads back the file's bytes");
	sfw_map_release(NULL, 10), sfw_map_release(m.data, 0); /* no-ops */
	sfw_map_close(&m);
	sfw_free(src);
	unlink(f);
	rmdir(dir);
	sfw_free(f);
}

/* Ended by a SIGBUS the guard passed on: by the signal itself, or (SAN=1)
 * by the handler installed before the guard's, the sanitizer's, which
 * reports it and exits 1; never by going on (exit codes 3 to 5 below). */
static int died_of_sigbus(int ws)
{
	return WIFSIGNALED(ws) ? WTERMSIG(ws) == SIGBUS : WIFEXITED(ws) && WEXITSTATUS(ws) == 1;
}

/* The fault guard: a map whose file is truncated under it reads zeros past
 * the new end instead of killing the process, and the fault is reported
 * (naming the file) from then on; a fault outside any map still ends the
 * process by SIGBUS (a child shows it). */
static void test_map_guard(void)
{
	char dir[] = "/tmp/sfw-core-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	char *f = sfw_path_join(dir, "shard.bin"), *g = sfw_path_join(dir, "other.bin");
	const size_t n = 64 * 4096;
	unsigned char *src = sfw_malloc(n);
	CHECK(f && g && src, "alloc");
	if (!f || !g || !src)
		return;
	memset(src, 0xA5, n);
	struct sfw_err e = {0};
	CHECK(sfw_write_file_atomic(f, src, n, &e) == SFW_OK && sfw_write_file_atomic(g, src, n, &e) == SFW_OK,
	      "write two files");
	CHECK(sfw_map_faults() == 0 && sfw_map_check(&e) == SFW_OK, "no fault yet");
	struct sfw_map m;
	CHECK(sfw_map_open(&m, f, &e) == SFW_OK && m.size == n, "map it");
	CHECK(m.data[0] == 0xA5 && m.data[n - 1] == 0xA5, "reads the file");
	CHECK(truncate(f, 8 * 4096) == 0, "another program truncates it");
	volatile const unsigned char *d = m.data;
	unsigned sum_before = d[8 * 4096 - 1], sum_after = 0;
	for (size_t i = 8 * 4096; i < n; i += 512)
		sum_after += d[i]; /* faulted without the guard: SIGBUS */
	CHECK(sum_before == 0xA5 && sum_after == 0, "the map reads on: the file's bytes, then zeros past its end");
	CHECK(sfw_map_faults() >= 1, "the fault is counted (%d)", sfw_map_faults());
	enum sfw_status st = sfw_map_check(&e);
	CHECK(st == SFW_E_IO && strstr(e.msg, f) && strstr(e.msg, "was truncated while mapped"),
	      "sfw_map_check names the file: %s", e.msg);
	sfw_map_close(&m);
	CHECK(sfw_map_check(&e) == SFW_E_IO, "and keeps saying so after the map is closed");
	/* a write from a truncated map: the kernel says EFAULT (no fault to
	 * catch); the atomic writer names it as the guard does */
	int n0 = sfw_map_faults();
	struct sfw_map m3;
	struct sfw_atomic at;
	char *out = sfw_path_join(dir, "out.bin");
	CHECK(out && sfw_write_file_atomic(f, src, n, &e) == SFW_OK && sfw_map_open(&m3, f, &e) == SFW_OK &&
		  truncate(f, 4096) == 0 && sfw_atomic_open(&at, out, &e) == SFW_OK,
	      "map a file again, truncate it");
	st = sfw_atomic_write(&at, m3.data + 16 * 4096, 4096, &e);
	CHECK(st == SFW_E_IO && strstr(e.msg, "was truncated while mapped") && sfw_map_faults() == n0 + 1,
	      "writing bytes of a truncated map is reported as the guard reports a fault: %s", e.msg);
	sfw_atomic_abort(&at);
	sfw_map_close(&m3);
	sfw_free(out);
	/* a fault outside every guarded map: the process dies of it */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(g, O_RDONLY);
		const volatile unsigned char *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
		if (fd < 0 || p == MAP_FAILED || ftruncate(open(g, O_WRONLY), 0) != 0)
			_exit(3);
		_exit(p[n - 1] == 0xA5 ? 4 : 5);
	}
	int ws = 0;
	CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && died_of_sigbus(ws),
	      "a fault outside the maps still raises SIGBUS (status %#x)", ws);
	/* a SIGBUS someone sends is not the guard's either */
	pid = fork();
	if (pid == 0) {
		struct sfw_map m2;
		if (sfw_map_open(&m2, f, &e) != SFW_OK)
			_exit(3);
		raise(SIGBUS);
		_exit(4);
	}
	CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && died_of_sigbus(ws),
	      "a sent SIGBUS still ends the process (status %#x)", ws);
	unlink(f);
	unlink(g);
	rmdir(dir);
	sfw_free(f);
	sfw_free(g);
	sfw_free(src);
}

static atomic_long sum;
static void add_range(void *ctx, size_t b, size_t e, int tid)
{
	(void)ctx;
	(void)tid;
	for (size_t i = b; i < e; i++)
		atomic_fetch_add(&sum, (long)i);
}

static void test_parallel(void)
{
	atomic_store(&sum, 0);
	CHECK(sfw_parallel_for(4, 10001, 7, add_range, NULL) == 0, "parallel_for runs");
	CHECK(atomic_load(&sum) == 10000L * 10001 / 2, "parallel_for covers every item once");
}

static atomic_int max_tid;
static void tid_range(void *ctx, size_t b, size_t e, int tid)
{
	add_range(ctx, b, e, tid);
	int m = atomic_load(&max_tid);
	while (tid > m && !atomic_compare_exchange_weak(&max_tid, &m, tid))
		;
}

struct pool_use {
	struct sfw_pool *p;
};

/* 200 jobs on one pool, from the thread given; each must cover [0, 1000). */
static atomic_long sum2;
static void sum2_range(void *ctx, size_t b, size_t e, int tid)
{
	(void)ctx, (void)tid;
	for (size_t i = b; i < e; i++)
		atomic_fetch_add(&sum2, (long)i);
}
static void *pool_user(void *arg)
{
	struct pool_use *u = arg;
	for (int r = 0; r < 200; r++) {
		sfw_pool_for(u->p, 4, 1000, 3, sum2_range, NULL);
	}
	return NULL;
}

static void test_pool(void)
{
	struct sfw_pool *p = NULL;
	CHECK(sfw_pool_new(0, &p, NULL) == SFW_E_INVAL && sfw_pool_new(257, &p, NULL) == SFW_E_INVAL,
	      "pool sizes outside 1..256 are refused");
	CHECK(sfw_pool_new(4, &p, NULL) == SFW_OK && sfw_pool_threads(p) == 4, "a pool of 4 threads");
	/* many jobs in a row: the workers sleep and wake between them */
	int all = 1;
	for (int r = 0; r < 500; r++) {
		atomic_store(&sum, 0);
		atomic_store(&max_tid, 0);
		sfw_pool_for(p, r % 5, 10001, 7, tid_range, NULL);
		all &= atomic_load(&sum) == 10000L * 10001 / 2 && atomic_load(&max_tid) < (r % 5 > 1 ? r % 5 : 1);
	}
	CHECK(all, "500 jobs of 0..4 threads each cover every item once, on tids below their thread count");
	/* two threads sharing the pool take turns */
	atomic_store(&sum2, 0);
	struct pool_use u1 = {p}, u2 = {p};
	pthread_t t1, t2;
	CHECK(pthread_create(&t1, NULL, pool_user, &u1) == 0 && pthread_create(&t2, NULL, pool_user, &u2) == 0,
	      "two users start");
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	CHECK(atomic_load(&sum2) == 400L * (999L * 1000 / 2), "jobs from two threads on one pool all complete");
	sfw_pool_free(p);
	sfw_pool_free(NULL);
}

int main(void)
{
	test_esc_hidden();
	test_name_fold();
	test_status();
	test_checked();
	test_buf();
	test_json();
	test_files();
	test_map_release();
	test_map_guard();
	test_parallel();
	test_pool();
	return CHECK_REPORT("test_core");
}
