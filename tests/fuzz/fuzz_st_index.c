/* fuzz_st_index - libFuzzer target for model.safetensors.index.json: the
 * input is the index of a folder holding two small shards (written once),
 * opened with sfw_st_set_open as a model directory is. An index that opens
 * must give a set whose every tensor is found by its name and is one of
 * the shards' three; one that is refused says why. */
#include "formats/safetensors.h"

#include "alloc.h"
#include "file.h"

#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

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

static void shard(const char *name, const char *t1, const char *t2)
{
	struct sfw_err err;
	struct sfw_st_writer *w;
	char *path = sfw_path_join(dir, name);
	uint64_t s2[1] = {2}, s3[1] = {3};
	static const unsigned char zeros[16];
	if (!path || sfw_st_writer_new(path, &w, &err) != SFW_OK ||
	    sfw_st_writer_declare(w, t1, SFW_DTYPE_F32, 1, s2, &err) != SFW_OK ||
	    (t2 && sfw_st_writer_declare(w, t2, SFW_DTYPE_BF16, 1, s3, &err) != SFW_OK) ||
	    sfw_st_writer_write(w, zeros, 8, &err) != SFW_OK || (t2 && sfw_st_writer_write(w, zeros, 6, &err) != SFW_OK) ||
	    sfw_st_writer_commit(w, &err) != SFW_OK) {
		fprintf(stderr, "fuzz_st_index: cannot write the fixture shard %s\n", name);
		abort();
	}
	sfw_st_writer_free(w);
	sfw_free(path);
}

static void setup(void)
{
	snprintf(dir, sizeof(dir), "%s/sfw-fuzz-index-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(dir))
		abort();
	atexit(cleanup);
	shard("model-00001-of-00002.safetensors", "a", "b");
	shard("model-00002-of-00002.safetensors", "c", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0])
		setup();
	char *index = sfw_path_join(dir, "model.safetensors.index.json");
	struct sfw_err err;
	if (!index || sfw_write_file_atomic(index, data, size, &err) != SFW_OK)
		abort();
	sfw_free(index);
	struct sfw_st_set *s = NULL;
	err.msg[0] = 0;
	if (sfw_st_set_open(dir, &s, &err) != SFW_OK) {
		if (!memchr(err.msg, '\0', sizeof(err.msg)) || err.msg[0] == '\0')
			abort(); /* every refusal says why */
		return 0;
	}
	size_t n = sfw_st_set_count(s);
	if (n > 3)
		abort();
	for (size_t i = 0; i < n; i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(s, i);
		if (!t || sfw_st_set_find(s, t->name) != t ||
		    (strcmp(t->name, "a") && strcmp(t->name, "b") && strcmp(t->name, "c")))
			abort();
	}
	sfw_st_set_close(s);
	return 0;
}
