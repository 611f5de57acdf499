/* fuzz_tokenizer - libFuzzer target for our own parsing of the tokenizer
 * files: the input is tokenizer_config.json ("legacy", the
 * added_tokens_decoder table of special tokens) next to a fixed
 * SentencePiece tokenizer.model (tests/fuzz/data/tokenizer.model, the one
 * `salafw mkmodel --preset tiny` trains; $SFW_FUZZ_TOKENIZER names another);
 * the model's own protobuf is SentencePiece's to parse. A config that loads gives a tokenizer whose
 * special tokens encode to their ids and whose text round-trips: decode
 * (encode(x)) == x for a text made of every special token's text between
 * plain words (tokenizer.h). */
#include "formats/tokenizer.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"

#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], model[4096];

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

static void setup(void)
{
	const char *m = getenv("SFW_FUZZ_TOKENIZER");
	snprintf(model, sizeof(model), "%s", m && *m ? m : "tests/fuzz/data/tokenizer.model");
	if (access(model, R_OK) != 0) {
		fprintf(stderr, "fuzz_tokenizer: no tokenizer.model at '%s' (set SFW_FUZZ_TOKENIZER)\n", model);
		abort();
	}
	snprintf(dir, sizeof(dir), "%s/sfw-fuzz-tok-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(dir))
		abort();
	atexit(cleanup);
}

/* every special token's text, each between two plain words */
static void check(const struct sfw_tokenizer *t)
{
	struct sfw_buf text, out;
	struct sfw_err err;
	sfw_buf_init(&text, 1 << 24);
	sfw_buf_init(&out, 1 << 26);
	if (sfw_buf_printf(&text, "hello") != SFW_OK)
		abort();
	int V = sfw_tokenizer_vocab(t);
	for (int32_t id = 0; id < V; id++) {
		if (!sfw_tokenizer_is_special(t, id))
			continue;
		struct sfw_buf one;
		sfw_buf_init(&one, 1 << 20);
		if (sfw_tokenizer_decode(t, &id, 1, 0, &one, &err) != SFW_OK || !one.data)
			abort();
		if (sfw_tokenizer_special_id(t, one.data) != id && memchr(one.data, 0, one.len) == NULL) {
			/* two specials may share a text only if the table allows
			 * it: then the id found must render the same text */
			int32_t other = sfw_tokenizer_special_id(t, one.data);
			struct sfw_buf o2;
			sfw_buf_init(&o2, 1 << 20);
			if (other < 0 || sfw_tokenizer_decode(t, &other, 1, 0, &o2, &err) != SFW_OK ||
			    o2.len != one.len || memcmp(o2.data, one.data, one.len) != 0)
				abort();
			sfw_buf_release(&o2);
		}
		if (sfw_buf_append(&text, one.data, one.len) != SFW_OK || sfw_buf_printf(&text, " word") != SFW_OK)
			abort();
		sfw_buf_release(&one);
	}
	int32_t *ids = NULL;
	size_t n = 0;
	if (sfw_tokenizer_encode(t, text.data, text.len, 0, &ids, &n, &err) == SFW_OK) {
		for (size_t i = 0; i < n; i++)
			if (ids[i] < 0 || ids[i] >= V)
				abort();
		if (sfw_tokenizer_decode(t, ids, n, 0, &out, &err) != SFW_OK || out.len != text.len ||
		    memcmp(out.data, text.data, text.len) != 0) {
			fprintf(stderr, "fuzz_tokenizer: decode(encode(x)) != x for x = '%.*s' (got '%.*s')\n",
				(int)text.len, text.data, (int)out.len, out.data ? out.data : "");
			abort();
		}
	} else if (err.msg[0] == 0) {
		abort();
	}
	sfw_free(ids);
	sfw_buf_release(&text);
	sfw_buf_release(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0])
		setup();
	struct sfw_err err = {0};
	char *cfg = sfw_path_join(dir, "tokenizer_config.json");
	if (!cfg || sfw_write_file_atomic(cfg, data, size, &err) != SFW_OK)
		abort();
	/* the pieces + 8 default and a wider model vocab */
	static const int vocab[2] = {0, 4096};
	for (int k = 0; k < 2; k++) {
		struct sfw_tokenizer *t = NULL;
		err.msg[0] = 0;
		if (sfw_tokenizer_load_files(model, cfg, vocab[k], &t, &err) != SFW_OK) {
			if (err.msg[0] == 0)
				abort(); /* every refusal says why */
			continue;
		}
		check(t);
		sfw_tokenizer_free(t);
	}
	sfw_free(cfg);
	return 0;
}
