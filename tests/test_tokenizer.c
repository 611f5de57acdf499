/* modules: tools formats num core */
/* test_tokenizer.c - the SentencePiece shim against Debian's spm_train /
 * spm_encode (a real peer), round trips, byte fallback, special tokens, the
 * streaming decoder, ChatML and our trainer. Models are trained here, into a
 * temporary directory, from tests/data/tokenizer/train.txt. */
#include "check.h"
#include "tools/tools.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/tokenizer.h"
#include "json.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN_TXT "tests/data/tokenizer/train.txt"
#define LINES_TXT "tests/data/tokenizer/lines.txt"
#define MAX_LINES 64

static char tmpdir[64];

static int run(const char *fmt, ...) SFW_PRINTF(1, 2);
static int run(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	if (rc != 0)
		printf("command failed (%d): %s\n", rc, cmd);
	return rc;
}

static char *path(const char *name)
{
	static char p[8][256];
	static int k;
	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", tmpdir, name);
	return p[k];
}

/* Splits a file into NUL-terminated lines (in place, in b). */
static int read_lines(const char *file, struct sfw_buf *b, char **lines, int max)
{
	struct sfw_err err = {0};
	sfw_buf_init(b, 1 << 20);
	if (sfw_read_file(file, 1 << 20, b, &err) != SFW_OK) {
		printf("cannot read %s: %s\n", file, err.msg);
		return -1;
	}
	int n = 0;
	char *p = b->data;
	while (p && *p && n < max) {
		char *nl = strchr(p, '\n');
		lines[n++] = p;
		if (!nl)
			break;
		*nl = '\0';
		p = nl + 1;
	}
	return n;
}

/* Parses "1 2 3" into ids; returns the count. */
static size_t parse_ids(const char *s, int32_t *ids, size_t max)
{
	size_t n = 0;
	char *end;
	while (*s && n < max) {
		long v = strtol(s, &end, 10);
		if (end == s)
			break;
		ids[n++] = (int32_t)v;
		s = end;
	}
	return n;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
	return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

static char *decode_str(const struct sfw_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
	struct sfw_buf b;
	struct sfw_err err = {0};
	sfw_buf_init(&b, 1 << 20);
	if (sfw_tokenizer_decode(t, ids, n, skip, &b, &err) != SFW_OK) {
		printf("decode: %s\n", err.msg);
		sfw_buf_release(&b);
		return NULL;
	}
	if (sfw_buf_append(&b, "", 0) != SFW_OK) /* data non-NULL even when empty */
		return NULL;
	size_t len;
	return sfw_buf_take(&b, &len);
}

static int32_t *encode(const struct sfw_tokenizer *t, const char *s, int bos, size_t *n)
{
	int32_t *ids = NULL;
	struct sfw_err err = {0};
	if (sfw_tokenizer_encode(t, s, strlen(s), bos, &ids, n, &err) != SFW_OK) {
		printf("encode '%s': %s\n", s, err.msg);
		return NULL;
	}
	return ids;
}

/* Our encode of every line of LINES_TXT equals spm_encode's ids. */
static void compare_with_spm_encode(const struct sfw_tokenizer *t, const char *model, const char *tag)
{
	const char *out = path("spm_ids.txt");
	CHECK(run("spm_encode --model=%s --output_format=id < %s > %s", model, LINES_TXT, out) == 0,
	      "%s: spm_encode runs", tag);
	struct sfw_buf lb, ob;
	char *lines[MAX_LINES], *outl[MAX_LINES];
	int n = read_lines(LINES_TXT, &lb, lines, MAX_LINES);
	int m = read_lines(out, &ob, outl, MAX_LINES);
	CHECK(n >= 10 && n == m, "%s: %d input lines, %d spm_encode lines", tag, n, m);
	for (int i = 0; i < n && i < m; i++) {
		int32_t want[512];
		size_t nw = parse_ids(outl[i], want, 512), ng = 0;
		int32_t *got = encode(t, lines[i], 0, &ng);
		CHECK(got && same_ids(got, ng, want, nw), "%s: line %d '%s' encodes like spm_encode (%zu vs %zu ids)",
		      tag, i, lines[i], ng, nw);
		char *back = got ? decode_str(t, got, ng, 0) : NULL;
		CHECK(back && strcmp(back, lines[i]) == 0, "%s: line %d round trip: '%s'", tag, i, back ? back : "");
		sfw_free(back);
		sfw_free(got);
	}
	sfw_buf_release(&lb);
	sfw_buf_release(&ob);
}

/* Feeding ids one by one: every chunk is valid UTF-8 and the chunks
 * concatenate to the whole decode. */
static void check_streaming(const struct sfw_tokenizer *t, const int32_t *ids, size_t n, int skip,
			    const char *want, const char *tag)
{
	struct sfw_tokdec d;
	struct sfw_buf all, chunk;
	struct sfw_err err = {0};
	sfw_tokdec_init(&d, t, skip);
	sfw_buf_init(&all, 1 << 20);
	sfw_buf_init(&chunk, 1 << 20);
	int ok = 1, valid = 1, held = 0;
	for (size_t i = 0; i <= n && ok; i++) {
		sfw_buf_reset(&chunk);
		if (i < n)
			ok = sfw_tokdec_push(&d, ids[i], &chunk, &err) == SFW_OK;
		else
			ok = sfw_tokdec_flush(&d, &chunk, &err) == SFW_OK;
		if (i < n && d.n_pending > 0)
			held++;
		if (!sfw_utf8_valid((const unsigned char *)(chunk.data ? chunk.data : ""), chunk.len))
			valid = 0;
		if (ok && chunk.len)
			ok = sfw_buf_append(&all, chunk.data, chunk.len) == SFW_OK;
	}
	CHECK(ok, "%s: streaming decode ok (%s)", tag, err.msg);
	CHECK(valid, "%s: every streamed chunk is complete UTF-8", tag);
	CHECK(all.data && strcmp(all.data, want) == 0, "%s: streamed text '%s' equals '%s'", tag,
	      all.data ? all.data : "", want);
	if (strstr(tag, "bytes"))
		CHECK(held > 0, "%s: some bytes were held back (%d)", tag, held);
	sfw_buf_release(&all);
	sfw_buf_release(&chunk);
}

static void test_peer_model(void)
{
	const char *model = path("peer.model");
	/* LLaMA-style settings, as our trainer uses: identity normalisation
	 * and no whitespace squeezing keep the text intact. */
	CHECK(run("spm_train --input=%s --model_prefix=%s/peer --vocab_size=600 --model_type=bpe "
		  "--byte_fallback=true --character_coverage=1.0 --normalization_rule_name=identity "
		  "--remove_extra_whitespaces=false --split_digits=true --num_threads=1 --minloglevel=2 "
		  ">/dev/null 2>&1",
		  TRAIN_TXT, tmpdir) == 0,
	      "spm_train trains the peer model");
	struct sfw_tokenizer *t = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_tokenizer_load_files(model, NULL, 0, &t, &err) == SFW_OK, "load peer model: %s", err.msg);
	if (!t)
		return;
	int np = sfw_tokenizer_n_pieces(t), V = sfw_tokenizer_vocab(t);
	CHECK(np == 600 && V == 608, "pieces %d, vocab %d", np, V);
	CHECK(sfw_tokenizer_bos(t) == 1 && sfw_tokenizer_eos(t) == 2, "bos 1, eos 2");
	compare_with_spm_encode(t, model, "peer");

	/* Default special tokens: <unk> <s> </s> and 8 at V-8 .. V-1 (docs/model-spec.md §4). */
	static const char *names[8] = {"<|im_end|>",      "<|im_start|>",   "<|tool_call|>",
				       "<|execute_start|>", "<|execute_end|>", "<|fim_prefix|>",
				       "<|fim_middle|>",  "<|fim_suffix|>"};
	int ok = sfw_tokenizer_special_id(t, "<unk>") == 0 && sfw_tokenizer_special_id(t, "<s>") == 1 &&
		 sfw_tokenizer_special_id(t, "</s>") == 2;
	for (int i = 0; i < 8; i++)
		ok = ok && sfw_tokenizer_special_id(t, names[i]) == V - 8 + i && sfw_tokenizer_is_special(t, V - 8 + i);
	CHECK(ok, "default special ids");
	CHECK(sfw_tokenizer_special_id(t, "<think>") == -1 && !sfw_tokenizer_is_special(t, 100),
	      "<think> is not special; piece 100 is not special");

	/* Special tokens inside text: split, mapped, segments as SentencePiece. */
	const char *text = "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n";
	size_t n = 0, na = 0, nb = 0, nc = 0;
	int32_t *ids = encode(t, text, 1, &n);
	int32_t *a = encode(t, "user\nHello world", 0, &na);
	int32_t *b = encode(t, "\n", 0, &nb);
	int32_t *c = encode(t, "assistant\n", 0, &nc);
	if (ids && a && b && c) {
		int32_t want[256];
		size_t k = 0;
		want[k++] = 1;
		want[k++] = V - 7;
		memcpy(want + k, a, na * 4), k += na;
		want[k++] = V - 8;
		memcpy(want + k, b, nb * 4), k += nb;
		want[k++] = V - 7;
		memcpy(want + k, c, nc * 4), k += nc;
		CHECK(same_ids(ids, n, want, k), "ChatML text: <s>, specials and SentencePiece segments (%zu ids)", n);
		char *back = decode_str(t, ids, n, 0);
		char full[256];
		snprintf(full, sizeof(full), "<s>%s", text);
		CHECK(back && strcmp(back, full) == 0, "special tokens decode back: '%s'", back ? back : "");
		sfw_free(back);
		back = decode_str(t, ids, n, 1);
		CHECK(back && strcmp(back, "user\nHello world\nassistant\n") == 0, "skip_special: '%s'",
		      back ? back : "");
		sfw_free(back);
		check_streaming(t, ids, n, 0, full, "chatml stream");
	} else {
		CHECK(0, "encode ChatML pieces");
	}
	sfw_free(ids), sfw_free(a), sfw_free(b), sfw_free(c);

	/* Adjacent and partial special tokens, text around them. */
	const char *tricky[] = {"a<|im_end|>b", "<|im_end|><|im_start|>", " <|im_end|> x ", "<|im_end",
				"<|im_start|><|im_start|>\n\n", "x</s>y<s>z<unk>", "<|fim_prefix|>def f():<|fim_suffix|>"};
	for (size_t i = 0; i < sizeof(tricky) / sizeof(*tricky); i++) {
		ids = encode(t, tricky[i], 0, &n);
		char *back = ids ? decode_str(t, ids, n, 0) : NULL;
		CHECK(back && strcmp(back, tricky[i]) == 0, "round trip '%s' -> '%s'", tricky[i], back ? back : "");
		if (ids)
			check_streaming(t, ids, n, 0, tricky[i], tricky[i]);
		sfw_free(back);
		sfw_free(ids);
	}
	ids = encode(t, "<|im_end", 0, &n);
	int none = 1;
	for (size_t i = 0; ids && i < n; i++)
		none = none && !sfw_tokenizer_is_special(t, ids[i]);
	CHECK(ids && none, "an unfinished special token is plain text");
	sfw_free(ids);

	/* Byte fallback: 😀 (F0 9F 98 80) is absent from the training text, so
	 * it is four byte pieces; SentencePiece puts <0xNN> at id 3 + NN. */
	ids = encode(t, "😀", 0, &n);
	int bytes_ok = ids && n >= 4;
	static const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
	for (int i = 0; bytes_ok && i < 4; i++)
		bytes_ok = ids[n - 4 + (size_t)i] == 3 + emoji[i];
	CHECK(bytes_ok, "😀 is encoded as byte pieces <0xF0><0x9F><0x98><0x80> (%zu ids)", n);
	sfw_free(ids);

	/* Streaming over byte-fallback text never splits a character. */
	const char *mixed = "Emoji 😀👍🏽 漢字 Ελληνικά and plain text, Привет!";
	ids = encode(t, mixed, 1, &n);
	if (ids) {
		char want[256];
		snprintf(want, sizeof(want), "<s>%s", mixed);
		check_streaming(t, ids, n, 0, want, "mixed bytes");
		check_streaming(t, ids, n, 1, mixed, "mixed bytes skip");
	}
	sfw_free(ids);

	/* A continuation streamed after priming with the prompt's ids is the
	 * rest of the full decode, at every split point. */
	const char *story = "The capital of France is Paris 😀, <|im_end|> ok";
	ids = encode(t, story, 1, &n);
	char *full = ids ? decode_str(t, ids, n, 0) : NULL;
	int prime_ok = ids && full;
	for (size_t k = 0; prime_ok && k <= n; k++) {
		char *head = decode_str(t, ids, k, 0);
		struct sfw_tokdec d;
		struct sfw_buf tail;
		sfw_buf_init(&tail, 1 << 16);
		sfw_tokdec_init(&d, t, 0);
		int ok = head && sfw_tokdec_prime(&d, ids, k, &err) == SFW_OK;
		for (size_t i = k; ok && i < n; i++)
			ok = sfw_tokdec_push(&d, ids[i], &tail, &err) == SFW_OK;
		ok = ok && sfw_tokdec_flush(&d, &tail, &err) == SFW_OK;
		/* Splits inside the emoji's bytes: the head ends in U+FFFD. */
		int inside = head && strstr(head, "\xEF\xBF\xBD") != NULL;
		if (ok && !inside) {
			size_t hl = strlen(head);
			ok = strncmp(full, head, hl) == 0 && strcmp(full + hl, tail.data ? tail.data : "") == 0;
			if (!ok)
				printf("split %zu: head '%s' tail '%s'\n", k, head, tail.data ? tail.data : "");
		}
		prime_ok = ok;
		sfw_free(head);
		sfw_buf_release(&tail);
	}
	CHECK(prime_ok, "prime + stream = the rest of the full decode at every split");
	sfw_free(full);
	sfw_free(ids);

	/* Invalid byte sequences become U+FFFD, one per byte, never raw bytes. */
	int32_t hello = 0;
	{
		int32_t *h = encode(t, "Hello", 0, &n);
		hello = h && n ? h[n - 1] : 0;
		sfw_free(h);
	}
	int32_t bad1[] = {3 + 0xE2, 3 + 0x82, hello};       /* truncated € then text */
	int32_t bad2[] = {3 + 0x80, 3 + 0xE2, 3 + 0x82, 3 + 0xAC}; /* stray continuation, then € */
	int32_t bad3[] = {3 + 0xF0, 3 + 0x9F};              /* truncated at the end */
	int32_t bad4[] = {3 + 0xED, 3 + 0xA0, 3 + 0x80};    /* a surrogate: 3 bad bytes */
	int32_t bad5[] = {3 + 0xE2, 3 + 0x82, 3 + 0x41};    /* truncated € then 'A' */
	char *s5 = decode_str(t, bad5, 3, 0);
	CHECK(s5 && strcmp(s5, "\xEF\xBF\xBD\xEF\xBF\xBD" "A") == 0, "truncated € then A: '%s'", s5 ? s5 : "");
	sfw_free(s5);
	char *s1 = decode_str(t, bad1, 3, 0), *s2 = decode_str(t, bad2, 4, 0), *s3 = decode_str(t, bad3, 2, 0),
	     *s4 = decode_str(t, bad4, 3, 0);
	CHECK(s1 && strncmp(s1, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0 && strlen(s1) > 6 &&
		      sfw_utf8_valid((unsigned char *)s1, strlen(s1)),
	      "truncated sequence before text: '%s'", s1 ? s1 : "");
	CHECK(s2 && strcmp(s2, "\xEF\xBF\xBD\xE2\x82\xAC") == 0, "stray continuation then €: '%s'", s2 ? s2 : "");
	CHECK(s3 && strcmp(s3, "\xEF\xBF\xBD\xEF\xBF\xBD") == 0, "truncated at the end: '%s'", s3 ? s3 : "");
	CHECK(s4 && strcmp(s4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") == 0, "surrogate bytes: '%s'", s4 ? s4 : "");
	sfw_free(s1), sfw_free(s2), sfw_free(s3), sfw_free(s4);

	/* Hostile input. */
	int32_t *x = NULL;
	CHECK(sfw_tokenizer_encode(t, "\xFF\xFE", 2, 0, &x, &n, &err) == SFW_E_INVAL && !x,
	      "invalid UTF-8 is rejected");
	struct sfw_buf ob;
	sfw_buf_init(&ob, 1024);
	int32_t oob[] = {5, V};
	CHECK(sfw_tokenizer_decode(t, oob, 2, 0, &ob, &err) == SFW_E_RANGE, "id == vocab is rejected: %s", err.msg);
	int32_t neg[] = {-1};
	CHECK(sfw_tokenizer_decode(t, neg, 1, 0, &ob, &err) == SFW_E_RANGE, "negative id is rejected");
	sfw_buf_release(&ob);
	size_t ne = 99;
	CHECK(sfw_tokenizer_encode(t, "", 0, 0, &x, &ne, &err) == SFW_OK && ne == 0, "empty text, no ids");
	sfw_free(x);
	CHECK(sfw_tokenizer_encode(t, "", 0, 1, &x, &ne, &err) == SFW_OK && ne == 1 && x[0] == 1,
	      "empty text with BOS");
	sfw_free(x);
	sfw_tokenizer_free(t);

	/* A model vocab larger than pieces + 8 moves the defaults up; too small
	 * a vocab is refused. */
	CHECK(sfw_tokenizer_load_files(model, NULL, 700, &t, &err) == SFW_OK &&
		      sfw_tokenizer_special_id(t, "<|im_end|>") == 692 && sfw_tokenizer_vocab(t) == 700,
	      "model vocab 700: <|im_end|> at 692");
	sfw_tokenizer_free(t);
	t = NULL;
	CHECK(sfw_tokenizer_load_files(model, NULL, 604, &t, &err) == SFW_E_FORMAT && !t,
	      "model vocab 604 leaves no room: %s", err.msg);
}

/* tokenizer_config.json: added_tokens_decoder is the source of truth. */
static void write_text(const char *file, const char *s)
{
	FILE *f = fopen(file, "w");
	if (f) {
		fputs(s, f);
		fclose(f);
	}
}

static void test_config(void)
{
	const char *model = path("peer.model"), *cfg = path("tokenizer_config.json");
	struct sfw_tokenizer *t = NULL;
	struct sfw_err err = {0};
	write_text(cfg, "{\"added_tokens_decoder\": {\"0\": {\"content\": \"<unk>\"}, \"1\": {\"content\": \"<s>\"},"
			" \"2\": {\"content\": \"</s>\"}, \"650\": {\"content\": \"<|im_end|>\"},"
			" \"651\": {\"content\": \"<|im_start|>\"}, \"652\": {\"content\": \"<|im\"}},"
			" \"add_bos_token\": true}");
	CHECK(sfw_tokenizer_load_files(model, cfg, 660, &t, &err) == SFW_OK, "config load: %s", err.msg);
	if (t) {
		CHECK(sfw_tokenizer_special_id(t, "<|im_end|>") == 650 && sfw_tokenizer_special_id(t, "<|im|") == -1 &&
			      sfw_tokenizer_special_id(t, "<|tool_call|>") == -1,
		      "config ids used, defaults not added");
		size_t n;
		int32_t *ids = encode(t, "<|im_start|><|im", 0, &n);
		CHECK(ids && n == 2 && ids[0] == 651 && ids[1] == 652, "longest special token wins");
		sfw_free(ids);
		/* 600..649 and 653..659 are padding ids: no text. */
		int32_t pad[] = {600, 659};
		char *s = decode_str(t, pad, 2, 0);
		CHECK(s && *s == '\0', "padding ids decode to nothing");
		sfw_free(s);
		sfw_tokenizer_free(t);
	}
	static const struct {
		const char *json, *what;
	} bad[] = {
		{"{\"added_tokens_decoder\": {\"700\": {\"content\": \"<x>\"}}}", "id past the vocab"},
		{"{\"added_tokens_decoder\": {\"5\": {\"content\": \"<x>\"}}}", "id of another piece"},
		{"{\"added_tokens_decoder\": {\"01\": {\"content\": \"<x>\"}}}", "leading zero"},
		{"{\"added_tokens_decoder\": {\"-1\": {\"content\": \"<x>\"}}}", "negative"},
		{"{\"added_tokens_decoder\": {\"650\": {\"content\": \"<x>\"}, \"651\": {\"content\": \"<x>\"}}}",
		 "same text twice"},
		{"{\"added_tokens_decoder\": {\"650\": {\"content\": \"\"}}}", "empty text"},
		{"{\"added_tokens_decoder\": {\"650\": {}}}", "no content"},
		{"{\"added_tokens_decoder\": [1]}", "not an object"},
		{"{\"added_tokens_decoder\": {\"650\": {\"content\": \"<a>\"}, \"650\": {\"content\": \"<b>\"}}}",
		 "duplicate key"},
		{"{\"added_tokens_decoder\": {}} x", "trailing bytes"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		write_text(cfg, bad[i].json);
		t = NULL;
		enum sfw_status st = sfw_tokenizer_load_files(model, cfg, 660, &t, &err);
		CHECK(st == SFW_E_FORMAT && !t && strlen(err.msg) > 0, "config with %s rejected: %s", bad[i].what,
		      err.msg);
		sfw_tokenizer_free(t);
	}
	CHECK(sfw_tokenizer_load_files(path("absent.model"), NULL, 0, &t, &err) != SFW_OK && !t,
	      "missing model: %s", err.msg);
	write_text(path("garbage.model"), "this is not a protobuf");
	CHECK(sfw_tokenizer_load_files(path("garbage.model"), NULL, 0, &t, &err) == SFW_E_FORMAT && !t,
	      "garbage model: %s", err.msg);
}

/* "legacy": false: only text at the start gets SentencePiece's dummy prefix.
 * With identity normalisation, the no-prefix encoding of " Y" sees exactly
 * what the prefixed encoding of "Y" sees ("▁Y"), so the legacy tokenizer
 * (checked against spm_encode above) is the reference. */
static void test_non_legacy(void)
{
	const char *model = path("peer.model"), *cfg = path("tokenizer_config.json");
	struct sfw_tokenizer *leg = NULL, *nl = NULL;
	struct sfw_err err = {0};
	write_text(cfg, "{\"legacy\": false}");
	CHECK(sfw_tokenizer_load_files(model, NULL, 0, &leg, &err) == SFW_OK &&
		      sfw_tokenizer_load_files(model, cfg, 0, &nl, &err) == SFW_OK,
	      "load legacy and non-legacy: %s", err.msg);
	if (!leg || !nl)
		goto out;
	int V = sfw_tokenizer_vocab(nl);
	CHECK(sfw_tokenizer_special_id(nl, "<|im_end|>") == V - 8, "non-legacy: default specials");
	size_t n1, n2, n3;
	int32_t *a = encode(leg, "Hello world", 0, &n1);
	int32_t *b = encode(nl, "x<|im_end|> Hello world", 0, &n2);
	int32_t *c = encode(nl, "Hello world", 1, &n3);
	size_t at = 0;
	while (b && at < n2 && b[at] != V - 8)
		at++;
	CHECK(a && b && at < n2 && same_ids(b + at + 1, n2 - at - 1, a, n1),
	      "non-legacy: ' Hello world' after a special = prefixed 'Hello world'");
	CHECK(a && c && n3 == n1 + 1 && c[0] == 1 && same_ids(c + 1, n3 - 1, a, n1),
	      "non-legacy: text at the start (after BOS) keeps the prefix");
	sfw_free(a), sfw_free(b), sfw_free(c);
	a = encode(leg, "<|im_start|>user", 0, &n1);
	b = encode(nl, "<|im_start|>user", 0, &n2);
	CHECK(a && b && !same_ids(a, n1, b, n2), "non-legacy differs from legacy after a special");
	sfw_free(a), sfw_free(b);
	const char *texts[] = {"<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "a<|im_end|> b",
			       "<s> Hello", "<s>Hello", " lead<|im_end|>  two", "x</s> y", "😀<|im_end|>😀"};
	for (size_t i = 0; i < sizeof(texts) / sizeof(*texts); i++) {
		a = encode(nl, texts[i], 0, &n1);
		char *back = a ? decode_str(nl, a, n1, 0) : NULL;
		CHECK(back && strcmp(back, texts[i]) == 0, "non-legacy round trip '%s' -> '%s'", texts[i],
		      back ? back : "");
		if (a)
			check_streaming(nl, a, n1, 0, texts[i], texts[i]);
		sfw_free(back);
		sfw_free(a);
	}
	write_text(cfg, "{\"legacy\": \"no\"}");
	struct sfw_tokenizer *bad = NULL;
	CHECK(sfw_tokenizer_load_files(model, cfg, 0, &bad, &err) == SFW_E_FORMAT && !bad, "legacy: \"no\" rejected");
out:
	sfw_tokenizer_free(leg);
	sfw_tokenizer_free(nl);
}

static int files_equal(const char *a, const char *b)
{
	struct sfw_buf x, y;
	sfw_buf_init(&x, 64 << 20);
	sfw_buf_init(&y, 64 << 20);
	int eq = sfw_read_file(a, 64 << 20, &x, NULL) == SFW_OK && sfw_read_file(b, 64 << 20, &y, NULL) == SFW_OK &&
		 x.len == y.len && x.len > 0 && memcmp(x.data, y.data, x.len) == 0;
	sfw_buf_release(&x);
	sfw_buf_release(&y);
	return eq;
}

static void test_train(void)
{
	struct sfw_err err = {0};
	const char *ours = path("ours.model");
	CHECK(sfw_tokenizer_train(TRAIN_TXT, 500, ours, &err) == SFW_OK, "train on the test text: %s", err.msg);
	struct sfw_tokenizer *t = NULL;
	CHECK(sfw_tokenizer_load_files(ours, NULL, 0, &t, &err) == SFW_OK, "load our model: %s", err.msg);
	if (t) {
		CHECK(sfw_tokenizer_n_pieces(t) <= 500 && sfw_tokenizer_n_pieces(t) > 300, "our model has %d pieces",
		      sfw_tokenizer_n_pieces(t));
		compare_with_spm_encode(t, ours, "ours");
		sfw_tokenizer_free(t);
	}
	CHECK(sfw_tokenizer_train(TRAIN_TXT, 500, path("ours2.model"), &err) == SFW_OK &&
		      files_equal(ours, path("ours2.model")),
	      "training is deterministic");

	/* The embedded corpus, as mkmodel uses it, written with its config. */
	char *dir = path("model");
	CHECK(run("mkdir -p %s", dir) == 0, "mkdir");
	char mp[256];
	snprintf(mp, sizeof(mp), "%s/tokenizer.model", dir);
	CHECK(sfw_tokenizer_train(NULL, 2040, mp, &err) == SFW_OK, "train on the default corpus: %s", err.msg);
	CHECK(sfw_default_corpus_len() > 16000 && strlen(sfw_default_corpus) == sfw_default_corpus_len() &&
		      sfw_utf8_valid((const unsigned char *)sfw_default_corpus, sfw_default_corpus_len()),
	      "default corpus is %zu bytes of UTF-8", sfw_default_corpus_len());
	CHECK(sfw_tokenizer_write_config(dir, 2048, &err) == SFW_OK, "write config: %s", err.msg);
	CHECK(sfw_tokenizer_load(dir, 2048, &t, &err) == SFW_OK, "load generated dir: %s", err.msg);
	if (t) {
		CHECK(sfw_tokenizer_special_id(t, "<|im_end|>") == 2040 &&
			      sfw_tokenizer_special_id(t, "<|fim_suffix|>") == 2047 &&
			      sfw_tokenizer_special_id(t, "<s>") == 1 && sfw_tokenizer_n_pieces(t) <= 2040,
		      "generated config: specials at 2040..2047 (%d pieces)", sfw_tokenizer_n_pieces(t));
		compare_with_spm_encode(t, mp, "default corpus");
		sfw_tokenizer_free(t);
	}
	/* The JSON written is what HF reads: check a few fields independently. */
	struct sfw_buf b;
	sfw_buf_init(&b, 1 << 20);
	char cp[256];
	snprintf(cp, sizeof(cp), "%s/tokenizer_config.json", dir);
	cJSON *root = NULL;
	if (sfw_read_file(cp, 1 << 20, &b, &err) == SFW_OK &&
	    sfw_json_parse(b.data, b.len, "tokenizer_config.json", &root, &err) == SFW_OK) {
		const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(added, "2041");
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
		const cJSON *bos = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
		const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token");
		CHECK(cJSON_GetArraySize(added) == 11 && cJSON_IsString(c) && !strcmp(c->valuestring, "<|im_start|>") &&
			      cJSON_IsTrue(bos) && cJSON_IsString(eos) && !strcmp(eos->valuestring, "<|im_end|>"),
		      "tokenizer_config.json fields");
		cJSON_Delete(root);
	} else {
		CHECK(0, "read tokenizer_config.json: %s", err.msg);
	}
	sfw_buf_release(&b);
	snprintf(cp, sizeof(cp), "%s/special_tokens_map.json", dir);
	sfw_buf_init(&b, 1 << 20);
	CHECK(sfw_read_file(cp, 1 << 20, &b, &err) == SFW_OK && strstr(b.data, "\"<|fim_suffix|>\"") &&
		      strstr(b.data, "\"bos_token\"") &&
		      sfw_json_parse(b.data, b.len, "special_tokens_map.json", &root, &err) == SFW_OK,
	      "special_tokens_map.json");
	if (root)
		cJSON_Delete(root);
	sfw_buf_release(&b);
	/* A vocab that cannot hold the trained pieces + 8 is refused. */
	CHECK(sfw_tokenizer_write_config(dir, 100, &err) != SFW_OK, "write config with vocab 100: %s", err.msg);

	CHECK(sfw_tokenizer_train(TRAIN_TXT, 10, path("tiny.model"), &err) == SFW_E_INVAL, "vocab 10: %s",
	      err.msg);
	CHECK(sfw_tokenizer_train(path("no-such-corpus.txt"), 500, path("x.model"), &err) != SFW_OK,
	      "missing corpus: %s", err.msg);
	CHECK(sfw_tokenizer_train(TRAIN_TXT, 500, "/nonexistent-dir/x.model", &err) != SFW_OK,
	      "unwritable output: %s", err.msg);
}

static void test_chat(void)
{
	struct sfw_chat_msg msgs[] = {{"system", "You are a helpful assistant."},
				      {"user", "What is 2+2?"},
				      {"assistant", "4"},
				      {"user", "And 3+3?\nThanks."}};
	struct sfw_buf b;
	struct sfw_err err = {0};
	sfw_buf_init(&b, 1 << 16);
	CHECK(sfw_chat_format(msgs, 4, 1, &b, &err) == SFW_OK, "chat format");
	const char *want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
			   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
			   "<|im_start|>assistant\n4<|im_end|>\n"
			   "<|im_start|>user\nAnd 3+3?\nThanks.<|im_end|>\n"
			   "<|im_start|>assistant\n";
	CHECK(b.data && strcmp(b.data, want) == 0, "ChatML text:\n%s", b.data ? b.data : "");
	sfw_buf_reset(&b);
	CHECK(sfw_chat_format(msgs + 1, 1, 0, &b, &err) == SFW_OK && b.data &&
		      strcmp(b.data, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n") == 0,
	      "no generation prompt");
	struct sfw_chat_msg bad[] = {{"us\ner", "x"}};
	CHECK(sfw_chat_format(bad, 1, 1, &b, &err) == SFW_E_INVAL, "role with newline: %s", err.msg);
	struct sfw_chat_msg bad2[] = {{"", "x"}};
	CHECK(sfw_chat_format(bad2, 1, 1, &b, &err) == SFW_E_INVAL, "empty role");
	sfw_buf_release(&b);
	struct sfw_buf small;
	sfw_buf_init(&small, 16);
	CHECK(sfw_chat_format(msgs, 4, 1, &small, &err) != SFW_OK, "capped buffer: %s", err.msg);
	sfw_buf_release(&small);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sfw_tok_XXXXXX");
	if (!mkdtemp(tmpdir)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	test_peer_model();
	test_config();
	test_non_legacy();
	test_train();
	test_chat();
	run("rm -rf %s", tmpdir);
	return CHECK_REPORT("test_tokenizer");
}
