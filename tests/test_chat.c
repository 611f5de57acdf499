/* modules: formats core */
/* test_chat.c - the chat format module (formats/chat.h): templates loaded
 * from a model directory, the built-in template against its .jinja file,
 * hostile templates and bounds (a status, never a crash), the tool-call
 * parser fed whole and in every split, garbled model output, and
 * generation_config.json defaults (the pinned real file included).
 *
 * With --render TEMPLATE CASES.json OUT.json it renders each case for
 * tests/test_chat_template.sh, which compares the text byte for byte with
 * python3-jinja2 rendering the same template (tests/chat/render.py). */
#include "check.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/chat.h"
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int render_mode(const char *tpl_path, const char *cases_path, const char *out_path)
{
	struct sfw_err err = {0};
	struct sfw_buf tb, cb;
	sfw_buf_init(&tb, SFW_CHAT_TEMPLATE_MAX + 1);
	sfw_buf_init(&cb, 64u << 20);
	cJSON *cases = NULL;
	if (sfw_read_file(tpl_path, SFW_CHAT_TEMPLATE_MAX + 1, &tb, &err) != SFW_OK ||
	    sfw_read_file(cases_path, 64u << 20, &cb, &err) != SFW_OK ||
	    sfw_json_parse(cb.data, cb.len, cases_path, &cases, &err) != SFW_OK) {
		fprintf(stderr, "test_chat --render: %s\n", err.msg);
		return 2;
	}
	struct sfw_chat_template *t = NULL;
	enum sfw_status cst = sfw_chat_template_new(tb.data ? tb.data : "", tb.len, tpl_path, NULL, NULL, &t, &err);
	char cerr[300];
	snprintf(cerr, sizeof(cerr), "compile: %s", err.msg);
	cJSON *out = cJSON_CreateArray();
	for (const cJSON *c = cases->child; c; c = c->next) {
		cJSON *r = cJSON_CreateObject();
		if (cst != SFW_OK) {
			cJSON_AddFalseToObject(r, "ok");
			cJSON_AddStringToObject(r, "error", cerr);
		} else {
			struct sfw_buf o;
			sfw_buf_init(&o, 64u << 20);
			const cJSON *agp = cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt");
			enum sfw_status st = sfw_chat_render(t, cJSON_GetObjectItemCaseSensitive(c, "messages"),
							     cJSON_GetObjectItemCaseSensitive(c, "tools"),
							     cJSON_GetObjectItemCaseSensitive(c, "kwargs"),
							     cJSON_IsTrue(agp), &o, &err);
			if (st == SFW_OK) {
				cJSON_AddTrueToObject(r, "ok");
				cJSON_AddStringToObject(r, "text", o.data ? o.data : "");
			} else {
				cJSON_AddFalseToObject(r, "ok");
				cJSON_AddStringToObject(r, "error", err.msg);
			}
			sfw_buf_release(&o);
		}
		cJSON_AddItemToArray(out, r);
	}
	char *s = cJSON_PrintUnformatted(out);
	FILE *f = fopen(out_path, "w");
	int rc = !s || !f || fputs(s, f) < 0;
	if (f && fclose(f))
		rc = 1;
	free(s);
	cJSON_Delete(out);
	cJSON_Delete(cases);
	sfw_chat_template_free(t);
	sfw_buf_release(&tb);
	sfw_buf_release(&cb);
	return rc ? 2 : 0;
}


/* ---- tool calls ---------------------------------------------------------- */

struct got {
	struct sfw_buf content;
	struct sfw_buf calls; /* "name|args\n" per call */
	int n_calls;
	int stop_at; /* abort at this call (1-based), 0 = never */
};

static int on_content(void *u, const char *s, size_t n)
{
	struct got *g = u;
	return sfw_buf_append(&g->content, s, n) != SFW_OK;
}

static int on_call(void *u, const struct sfw_toolcall *c)
{
	struct got *g = u;
	if (c->index != g->n_calls)
		return 1;
	g->n_calls++;
	if (sfw_buf_printf(&g->calls, "%s|%s\n", c->name, c->arguments) != SFW_OK)
		return 1;
	return g->stop_at && g->n_calls == g->stop_at;
}

static void got_init(struct got *g)
{
	memset(g, 0, sizeof(*g));
	sfw_buf_init(&g->content, 64u << 20);
	sfw_buf_init(&g->calls, 64u << 20);
}

static void got_release(struct got *g)
{
	sfw_buf_release(&g->content);
	sfw_buf_release(&g->calls);
}

/* Feeds text in pieces of the given sizes (cycled; 0 = whole). */
static enum sfw_status parse_pieces(const char *text, size_t len, const size_t *sizes, size_t n_sizes, struct got *g)
{
	struct sfw_toolparse *p = NULL;
	struct sfw_err err = {0};
	struct sfw_toolparse_cb cb = {on_content, on_call, g};
	enum sfw_status st = sfw_toolparse_new(&p, &err);
	size_t off = 0, k = 0;
	while (st == SFW_OK && off < len) {
		size_t n = n_sizes && sizes[k % n_sizes] ? sizes[k % n_sizes] : len - off;
		if (n > len - off)
			n = len - off;
		st = sfw_toolparse_feed(p, text + off, n, &cb, &err);
		off += n;
		k++;
	}
	if (st == SFW_OK)
		st = sfw_toolparse_finish(p, &cb, &err);
	if (st == SFW_OK && sfw_toolparse_count(p) != g->n_calls)
		st = SFW_E_FORMAT;
	sfw_toolparse_free(p);
	return st;
}

static const char *S(const struct sfw_buf *b) { return b->data ? b->data : ""; }

/* whole, byte by byte, and split at every position: the same result */
static void check_splits(const char *what, const char *text, const char *want_content, const char *want_calls)
{
	size_t len = strlen(text);
	struct got g;
	got_init(&g);
	enum sfw_status st = parse_pieces(text, len, NULL, 0, &g);
	CHECK(st == SFW_OK && !strcmp(S(&g.content), want_content) && !strcmp(S(&g.calls), want_calls),
	      "toolcall %s: content [%s] calls [%s]", what, S(&g.content), S(&g.calls));
	got_release(&g);
	int all_ok = 1;
	size_t one = 1;
	got_init(&g);
	st = parse_pieces(text, len, &one, 1, &g);
	all_ok &= st == SFW_OK && !strcmp(S(&g.content), want_content) && !strcmp(S(&g.calls), want_calls);
	got_release(&g);
	for (size_t cut = 1; cut < len && all_ok; cut++) {
		size_t sz[2] = {cut, len};
		got_init(&g);
		st = parse_pieces(text, len, sz, 2, &g);
		all_ok &= st == SFW_OK && !strcmp(S(&g.content), want_content) && !strcmp(S(&g.calls), want_calls);
		if (!all_ok)
			printf("  split at %zu: content [%s] calls [%s]\n", cut, S(&g.content), S(&g.calls));
		got_release(&g);
	}
	CHECK(all_ok, "toolcall %s: the same fed byte by byte and split at every position", what);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t xs(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void test_toolcalls(void)
{
	check_splits("plain text", "Hello, world! <b>not a call</b> <tool_ca", "Hello, world! <b>not a call</b> <tool_ca", "");
	check_splits("one call", "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
		     "Sure.\n", "get_weather|{\"city\":\"Paris\",\"days\":2}\n");
	check_splits("two calls and text between",
		     "a<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"x\": [1, \"<tool_call>\"]}}</tool_call>z",
		     "a\nz", "f|{}\ng|{\"x\":[1,\"<tool_call>\"]}\n");
	check_splits("arguments as a JSON string", "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"\\u00fc\\\"}\"}</tool_call>", "",
		     "f|{\"a\":\"\xc3\xbc\"}\n");
	check_splits("no arguments", "<tool_call>{\"name\": \"now\"}</tool_call>", "", "now|{}\n");
	check_splits("null arguments", "<tool_call>{\"name\": \"now\", \"arguments\": null}</tool_call>", "", "now|{}\n");
	check_splits("unclosed at the end", "x <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", "x ", "f|{\"a\":1}\n");
	check_splits("garbled JSON is content", "x <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> y",
		     "x <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> y", "");
	check_splits("no name is content", "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", "");
	check_splits("empty name is content", "<tool_call>{\"name\": \"\"}</tool_call>", "<tool_call>{\"name\": \"\"}</tool_call>", "");
	check_splits("arguments a list is content", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
		     "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "");
	check_splits("arguments string not an object is content", "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>",
		     "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>", "");
	check_splits("duplicate keys are content", "<tool_call>{\"name\": \"f\", \"name\": \"g\"}</tool_call>",
		     "<tool_call>{\"name\": \"f\", \"name\": \"g\"}</tool_call>", "");
	check_splits("unclosed garbage is content", "t <tool_call>{\"name\": ", "t <tool_call>{\"name\": ", "");
	check_splits("close tag alone is content", "a </tool_call> b", "a </tool_call> b", "");
	check_splits("empty call", "<tool_call></tool_call>", "<tool_call></tool_call>", "");
	check_splits("nested open", "<tool_call><tool_call>{\"name\":\"f\"}</tool_call>",
		     "<tool_call><tool_call>{\"name\":\"f\"}</tool_call>", "");

	/* a body past the cap: all content, nothing lost */
	size_t big = SFW_TOOLCALL_BODY_MAX + 100;
	char *t = malloc(big + 64);
	strcpy(t, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"");
	size_t o = strlen(t);
	memset(t + o, 'x', big - o);
	strcpy(t + big, "\"}}</tool_call>tail");
	struct got g;
	got_init(&g);
	size_t sz[3] = {7, 65536, 3};
	enum sfw_status st = parse_pieces(t, strlen(t), sz, 3, &g);
	CHECK(st == SFW_OK && g.n_calls == 0 && g.content.len == strlen(t) && !memcmp(g.content.data, t, g.content.len),
	      "toolcall: a body over %u bytes is given back as content, byte for byte", SFW_TOOLCALL_BODY_MAX);
	got_release(&g);
	free(t);

	/* more than SFW_TOOLCALL_MAX calls: the rest stays content */
	struct sfw_buf m;
	sfw_buf_init(&m, 1u << 20);
	for (int i = 0; i < SFW_TOOLCALL_MAX + 3; i++)
		CHECK(sfw_buf_printf(&m, "<tool_call>{\"name\": \"f%d\"}</tool_call>", i) == SFW_OK, "build");
	got_init(&g);
	st = parse_pieces(m.data, m.len, NULL, 0, &g);
	CHECK(st == SFW_OK && g.n_calls == SFW_TOOLCALL_MAX &&
		      !strcmp(S(&g.content), "<tool_call>{\"name\": \"f64\"}</tool_call><tool_call>{\"name\": \"f65\"}</tool_call>"
					     "<tool_call>{\"name\": \"f66\"}</tool_call>"),
	      "toolcall: %d calls at most, the rest is content (%d calls, content [%.80s])", SFW_TOOLCALL_MAX, g.n_calls,
	      S(&g.content));
	got_release(&g);
	sfw_buf_release(&m);

	/* NUL bytes after a call (fuzz_chat found a tail copied as a string) */
	static const char nul[] = "<tool_call>{\"name\": \"f\"}</tool_call>a\0b\0";
	got_init(&g);
	size_t nsz[2] = {3, 40};
	st = parse_pieces(nul, sizeof(nul) - 1, nsz, 2, &g);
	CHECK(st == SFW_OK && g.n_calls == 1 && g.content.len == 4 && !memcmp(g.content.data, "a\0b\0", 4),
	      "toolcall: NUL bytes after a call stay content, byte for byte");
	got_release(&g);

	/* the caller stops it */
	got_init(&g);
	g.stop_at = 1;
	const char *two = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
	st = parse_pieces(two, strlen(two), NULL, 0, &g);
	CHECK(st == SFW_E_ABORTED && g.n_calls == 1, "toolcall: a callback's stop is SFW_E_ABORTED");
	got_release(&g);

	/* garbled model output: random bytes around tag pieces, random splits.
	 * Whenever no call is reported, the content is the input exactly. */
	static const char *frag[] = {"<tool_call>", "</tool_call>", "<tool_", "call>", "{\"name\": \"f\"}", "{",
				     "}", "\"", "\n", "\xe2\x82", "\xac", "x", "<", "</", "\\", "\"arguments\": {}"};
	int fuzz_ok = 1, with_calls = 0;
	for (int it = 0; it < 3000 && fuzz_ok; it++) {
		char buf[512];
		size_t n = 0;
		int parts = (int)(xs() % 12);
		for (int k = 0; k < parts; k++) {
			const char *f = frag[xs() % (sizeof(frag) / sizeof(frag[0]))];
			size_t fl = strlen(f);
			if (n + fl >= sizeof(buf))
				break;
			memcpy(buf + n, f, fl);
			n += fl;
			if (xs() % 4 == 0 && n + 1 < sizeof(buf))
				buf[n++] = (char)(xs() % 255 + 1);
		}
		buf[n] = 0;
		size_t sizes[4] = {xs() % 5 + 1, xs() % 17 + 1, xs() % 3 + 1, xs() % 40 + 1};
		got_init(&g);
		st = parse_pieces(buf, n, sizes, 4, &g);
		if (st != SFW_OK)
			fuzz_ok = 0;
		else if (g.n_calls == 0 && (g.content.len != n || (n && memcmp(g.content.data, buf, n))))
			fuzz_ok = 0;
		with_calls += g.n_calls > 0;
		if (!fuzz_ok)
			printf("  input [%s] -> content [%s]\n", buf, S(&g.content));
		got_release(&g);
	}
	CHECK(fuzz_ok && with_calls > 0, "toolcall: 3000 garbled replies parse without loss (%d had calls)", with_calls);
}

/* ---- generation_config.json ------------------------------------------------ */

static void test_gen_defaults(void)
{
	struct sfw_gen_defaults d;
	struct sfw_err err = {0};
	const char *pin = "../shared/pins/generation_config.json";
	struct sfw_buf b;
	sfw_buf_init(&b, 1u << 20);
	enum sfw_status st = sfw_read_file(pin, 1u << 20, &b, &err);
	CHECK(st == SFW_OK, "the pinned release's generation_config.json is readable: %s", err.msg);
	if (st == SFW_OK) {
		st = sfw_gen_defaults_parse(b.data, b.len, pin, &d, &err);
		CHECK(st == SFW_OK && d.set == 0 && d.temperature == SFW_GEN_DEFAULT_TEMPERATURE && d.top_p == 1.0 &&
			      d.top_k == 0 && d.min_p == 0 && d.repetition_penalty == 1.0,
		      "the real release sets no sampling field: the fallbacks hold (%s)", err.msg);
	}
	sfw_buf_release(&b);
	const char *full = "{\"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 20, \"min_p\": 0.05, "
			   "\"repetition_penalty\": 1.05, \"do_sample\": true, \"eos_token_id\": [2]}";
	st = sfw_gen_defaults_parse(full, strlen(full), "g", &d, &err);
	CHECK(st == SFW_OK && d.temperature == 0.7 && d.top_p == 0.8 && d.top_k == 20 && d.min_p == 0.05 &&
		      d.repetition_penalty == 1.05 && d.set == 0x3f,
	      "every field read (%s)", err.msg);
	const char *greedy = "{\"do_sample\": false, \"temperature\": 0.6, \"top_k\": -1}";
	st = sfw_gen_defaults_parse(greedy, strlen(greedy), "g", &d, &err);
	CHECK(st == SFW_OK && d.temperature == 0 && d.top_k == 0, "do_sample false is greedy; top_k -1 is off");
	static const struct {
		const char *json, *field;
	} bad[] = {{"{\"temperature\": \"0.7\"}", "temperature"}, {"{\"top_p\": 0}", "top_p"},
		   {"{\"top_p\": 1.5}", "top_p"},		{"{\"top_k\": 2.5}", "top_k"},
		   {"{\"min_p\": -0.1}", "min_p"},		{"{\"repetition_penalty\": 0}", "repetition_penalty"},
		   {"{\"temperature\": -1}", "temperature"},	{"{\"do_sample\": 1}", "do_sample"},
		   {"[1]", "not a JSON object"},		{"{\"a\": 1, \"a\": 2}", "duplicate"},
		   {"{\"temperature\": 1e999}", ""}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sfw_gen_defaults_init(&d);
		d.temperature = 42;
		st = sfw_gen_defaults_parse(bad[i].json, strlen(bad[i].json), "'g.json'", &d, &err);
		CHECK(st != SFW_OK && strstr(err.msg, bad[i].field) && strstr(err.msg, "'g.json'") && d.temperature == 1.0,
		      "bad %s refused naming the file and field: %s", bad[i].json, err.msg);
	}
	st = sfw_gen_defaults_load("/nonexistent-dir-for-test", &d, &err);
	CHECK(st == SFW_OK && d.set == 0, "no generation_config.json: the fallbacks");
}

/* ---- templates ------------------------------------------------------------- */

static char tmpdir[64];

static void write_file(const char *name, const char *text)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", tmpdir, name);
	FILE *f = fopen(p, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static enum sfw_status render_str(const struct sfw_chat_template *t, const char *msgs_json, const char *kw_json,
				  int agp, size_t cap, struct sfw_buf *out, struct sfw_err *err)
{
	cJSON *m = cJSON_Parse(msgs_json), *k = kw_json ? cJSON_Parse(kw_json) : NULL;
	sfw_buf_init(out, cap);
	enum sfw_status st = sfw_chat_render(t, m, NULL, k, agp, out, err);
	cJSON_Delete(m);
	cJSON_Delete(k);
	return st;
}

static void test_templates(void)
{
	struct sfw_err err = {0};
	struct sfw_chat_template *t = NULL;
	struct sfw_buf o;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/salafw-chat.XXXXXX");
	CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");

	/* no files: the built-in template */
	CHECK(sfw_chat_template_load(tmpdir, &t, &err) == SFW_OK && !strcmp(sfw_chat_template_origin(t), "built-in") &&
		      !strcmp(sfw_chat_template_bos(t), "<s>") && !strcmp(sfw_chat_template_eos(t), "<|im_end|>"),
	      "an empty directory gives the built-in template (%s)", err.msg);
	/* what the built-in template renders, written out by hand */
	CHECK(render_str(t, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 1, 1 << 20,
			 &o, &err) == SFW_OK &&
		      !strcmp(S(&o), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
	      "built-in: system + user + generation prompt [%s] %s", S(&o), err.msg);
	CHECK(sfw_chat_needs_bos(t, S(&o), o.len), "a prompt without <s> needs BOS");
	sfw_buf_release(&o);
	CHECK(render_str(t, "[{\"role\":\"user\",\"content\":\"Hi\"}]", "{\"enable_thinking\": false}", 1, 1 << 20, &o, &err) ==
			  SFW_OK &&
		      !strcmp(S(&o), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
	      "built-in: enable_thinking false [%s]", S(&o));
	sfw_buf_release(&o);
	/* an output cap: SFW_E_RANGE, the buffer as it was */
	sfw_buf_init(&o, 16);
	CHECK(sfw_buf_append(&o, "keep", 4) == SFW_OK, "append");
	cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"a long enough message\"}]");
	enum sfw_status st = sfw_chat_render(t, m, NULL, NULL, 1, &o, &err);
	CHECK(st == SFW_E_RANGE && o.len == 4 && !strcmp(o.data, "keep"), "output past the cap: E_RANGE, nothing appended (%s)",
	      err.msg);
	sfw_buf_release(&o);
	st = sfw_chat_render(t, cJSON_GetArrayItem(m, 0), NULL, NULL, 1, &o, &err);
	CHECK(st == SFW_E_INVAL, "messages not an array: E_INVAL (%s)", err.msg);
	cJSON_Delete(m);

	/* a 48 MiB message renders (concatenations are not doubling buffers) */
	{
		size_t big = 48u << 20;
		char *c = malloc(big + 1);
		memset(c, 'a', big);
		c[big] = 0;
		cJSON *bm = cJSON_CreateArray(), *u = cJSON_CreateObject();
		cJSON_AddStringToObject(u, "role", "user");
		cJSON_AddStringToObject(u, "content", c);
		cJSON_AddItemToArray(bm, u);
		free(c);
		sfw_buf_init(&o, 64u << 20);
		st = sfw_chat_render(t, bm, NULL, NULL, 1, &o, &err);
		CHECK(st == SFW_OK && o.len == big + 50, "a 48 MiB message renders into a 64 MiB cap (%s, %zu bytes)", err.msg, o.len);
		sfw_buf_release(&o);
		cJSON_Delete(bm);
	}
	sfw_chat_template_free(t);
	t = NULL;

	/* tokenizer_config.json's template, bos as {"content": ...} */
	write_file("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", "
					    "\"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\"}");
	CHECK(sfw_chat_template_load(tmpdir, &t, &err) == SFW_OK && strstr(sfw_chat_template_origin(t), "tokenizer_config.json") &&
		      !strcmp(sfw_chat_template_bos(t), "<B>"),
	      "tokenizer_config.json's chat_template and bos_token (%s)", err.msg);
	CHECK(t && render_str(t, "[{\"role\":\"user\",\"content\":\"x\"}]", NULL, 0, 1 << 20, &o, &err) == SFW_OK &&
		      !strcmp(S(&o), "<B>x<E>") && !sfw_chat_needs_bos(t, S(&o), o.len),
	      "rendered with its tokens; a prompt that starts with bos needs no BOS [%s]", S(&o));
	sfw_buf_release(&o);
	sfw_chat_template_free(t);
	t = NULL;
	/* the list form */
	write_file("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
					    "{\"name\": \"default\", \"template\": \"D{{ messages|length }}\"}]}");
	CHECK(sfw_chat_template_load(tmpdir, &t, &err) == SFW_OK &&
		      render_str(t, "[]", NULL, 0, 1 << 20, &o, &err) == SFW_OK && !strcmp(S(&o), "D0"),
	      "a list of templates: \"default\" [%s] %s", S(&o), err.msg);
	sfw_buf_release(&o);
	sfw_chat_template_free(t);
	t = NULL;
	/* chat_template.jinja wins */
	write_file("chat_template.jinja", "J{{ add_generation_prompt }}\n");
	CHECK(sfw_chat_template_load(tmpdir, &t, &err) == SFW_OK && strstr(sfw_chat_template_origin(t), "chat_template.jinja") &&
		      render_str(t, "[]", NULL, 1, 1 << 20, &o, &err) == SFW_OK && !strcmp(S(&o), "JTrue"),
	      "chat_template.jinja is preferred; one trailing newline dropped [%s]", S(&o));
	sfw_buf_release(&o);
	sfw_chat_template_free(t);
	t = NULL;
	/* broken files: named errors */
	write_file("chat_template.jinja", "{% if %}");
	st = sfw_chat_template_load(tmpdir, &t, &err);
	CHECK(st == SFW_E_FORMAT && strstr(err.msg, "chat_template.jinja") && strstr(err.msg, "line 1"),
	      "a syntax error names the file and line: %s", err.msg);
	write_file("chat_template.jinja", "ok");
	write_file("tokenizer_config.json", "{\"chat_template\": 5}");
	st = sfw_chat_template_load(tmpdir, &t, &err);
	CHECK(st == SFW_E_FORMAT && strstr(err.msg, "chat_template"), "chat_template not a string: %s", err.msg);
	write_file("tokenizer_config.json", "{\"bos_token\": [1]}");
	st = sfw_chat_template_load(tmpdir, &t, &err);
	CHECK(st == SFW_E_FORMAT && strstr(err.msg, "bos_token"), "bos_token of a wrong type: %s", err.msg);
	char p[256];
	snprintf(p, sizeof(p), "%s/chat_template.jinja", tmpdir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/tokenizer_config.json", tmpdir);
	unlink(p);
	rmdir(tmpdir);
}

/* Templates that try to break the engine: each must come back as a status. */
static void test_hostile(void)
{
	struct sfw_err err = {0};
	struct sfw_chat_template *t = NULL;
	struct sfw_buf o;
	/* deep nesting at compile time */
	size_t n = 20000;
	char *deep = malloc(2 * n + 16);
	strcpy(deep, "{{ ");
	for (size_t i = 0; i < n; i++)
		strcat(deep + 3 + i, "(");
	size_t l = strlen(deep);
	for (size_t i = 0; i < n; i++)
		deep[l++] = ')';
	strcpy(deep + l, " }}");
	enum sfw_status st = sfw_chat_template_new(deep, strlen(deep), "deep", NULL, NULL, &t, &err);
	CHECK(st == SFW_E_RANGE && !t, "20000 nested parentheses: E_RANGE (%s)", err.msg);
	free(deep);
	static const struct {
		const char *tpl;
		enum sfw_status want;
		const char *what;
	} cases[] = {
		{"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", SFW_E_RANGE, "10^10 iterations"},
		{"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", SFW_E_RANGE, "unbounded recursion"},
		{"{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
		 SFW_E_RANGE, "a string doubled 64 times"},
		{"{{ 'x' * 100000000000 }}", SFW_E_RANGE, "a huge repetition"},
		{"{{ raise_exception('custom refusal') }}", SFW_E_INVAL, "raise_exception"},
		{"{{ 9223372036854775807 + 1 }}", SFW_E_RANGE, "integer overflow"},
		{"{{ range(1000000)|length }}", SFW_E_RANGE, "a huge range"},
		{"{% raw %}x{% endraw %}", SFW_E_UNSUPPORTED, "raw blocks"},
		{"{% include 'x' %}", SFW_E_UNSUPPORTED, "include"},
		{"{{ strftime_now('%Y') }}", SFW_E_UNSUPPORTED, "strftime_now"},
		{"{{ 1234567890123456789012345678901234567890123456789012345678901234567890 }}", SFW_E_UNSUPPORTED,
		 "a 70-digit literal"},
		{"{{ 1e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5 }}", SFW_E_FORMAT, "a garbled exponent"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		t = NULL;
		st = sfw_chat_template_new(cases[i].tpl, strlen(cases[i].tpl), "hostile", NULL, NULL, &t, &err);
		if (st == SFW_OK) {
			cJSON *m = cJSON_CreateArray();
			sfw_buf_init(&o, 64u << 20);
			st = sfw_chat_render(t, m, NULL, NULL, 1, &o, &err);
			sfw_buf_release(&o);
			cJSON_Delete(m);
		}
		CHECK(st == cases[i].want, "%s: status %d want %d (%s)", cases[i].what, st, cases[i].want, err.msg);
		if (cases[i].want == SFW_E_INVAL)
			CHECK(strstr(err.msg, "custom refusal") != NULL, "raise_exception's message is kept: %s", err.msg);
		sfw_chat_template_free(t);
	}
	st = sfw_chat_template_new("a\xff", 2, "utf8", NULL, NULL, &t, &err);
	CHECK(st == SFW_E_FORMAT, "invalid UTF-8: E_FORMAT (%s)", err.msg);
	/* mutations of the built-in template: compile and render, never crash */
	const char *src = sfw_chat_builtin_template();
	size_t sl = strlen(src);
	char *mut = malloc(sl + 1);
	int rendered = 0, refused = 0;
	cJSON *msgs = cJSON_Parse("[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
				  "{\"role\":\"assistant\",\"content\":\"<think>r</think>a\",\"tool_calls\":[{\"function\":"
				  "{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},{\"role\":\"tool\",\"content\":\"t\"}]");
	static const char junk[] = "{}%#-+()[]'\"|.,:~ \n";
	for (int it = 0; it < 2000; it++) {
		memcpy(mut, src, sl + 1);
		int edits = 1 + (int)(xs() % 4);
		for (int e = 0; e < edits; e++) {
			size_t at = xs() % sl;
			mut[at] = junk[xs() % (sizeof(junk) - 1)];
		}
		t = NULL;
		st = sfw_chat_template_new(mut, sl, "mutant", NULL, NULL, &t, &err);
		if (st == SFW_OK) {
			sfw_buf_init(&o, 1u << 20);
			st = sfw_chat_render(t, msgs, NULL, NULL, 1, &o, &err);
			sfw_buf_release(&o);
		}
		if (st == SFW_OK)
			rendered++;
		else
			refused++;
		sfw_chat_template_free(t);
	}
	cJSON_Delete(msgs);
	free(mut);
	CHECK(rendered + refused == 2000 && refused > 0, "2000 mutated templates: %d rendered, %d refused, no crash",
	      rendered, refused);
}

/* ---- OpenAI messages -> template messages --------------------------------- */

static void test_normalize(void)
{
	struct sfw_err err = {0};
	cJSON *in = cJSON_Parse(
		"[{\"role\":\"developer\",\"content\":\"D\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
		"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": [1, \\\"y\\\"]}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}]");
	cJSON *out = NULL;
	enum sfw_status st = sfw_chat_messages_normalize(in, &out, &err);
	char *s = out ? cJSON_PrintUnformatted(out) : NULL;
	const char *want = "[{\"role\":\"system\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"a\\nb\"},"
			   "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
			   "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":[1,\"y\"]}}}]},"
			   "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}]";
	CHECK(st == SFW_OK && s && !strcmp(s, want), "normalize: developer is system, text parts joined, arguments parsed: %s %s",
	      s ? s : "", err.msg);
	free(s);
	/* the built-in template over it: the call rendered from the object */
	struct sfw_chat_template *t = NULL;
	CHECK(sfw_chat_template_new(sfw_chat_builtin_template(), strlen(sfw_chat_builtin_template()), "builtin", NULL, NULL,
				    &t, &err) == SFW_OK,
	      "builtin compiles");
	struct sfw_buf o;
	sfw_buf_init(&o, 1 << 20);
	st = t ? sfw_chat_render(t, out, NULL, NULL, 1, &o, &err) : SFW_E_INVAL;
	CHECK(st == SFW_OK && strstr(S(&o), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, \"y\"]}}\n</tool_call>") &&
		      strstr(S(&o), "<|im_start|>system\nD<|im_end|>") && strstr(S(&o), "<tool_response>\nr\n</tool_response>"),
	      "normalized messages render (%s): %s", err.msg, S(&o));
	sfw_buf_release(&o);
	sfw_chat_template_free(t);
	cJSON_Delete(out);
	cJSON_Delete(in);
	static const struct {
		const char *json, *want;
	} bad[] = {
		{"{}", "must be a list"},
		{"[1]", "messages[0] must be an object"},
		{"[{\"content\":\"x\"}]", "messages[0].role"},
		{"[{\"role\":\"wizard\",\"content\":\"x\"}]", "messages[0].role must be"},
		{"[{\"role\":\"user\",\"content\":5}]", "messages[0].content"},
		{"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]", "messages[0].content[0]: only text"},
		{"[{\"role\":\"assistant\",\"tool_calls\":{}}]", "tool_calls must be a list"},
		{"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]", "tool_calls[0].function.name"},
		{"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{bad\"}}]}]",
		 "arguments is not a JSON object"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cJSON *b = cJSON_Parse(bad[i].json);
		out = NULL;
		st = sfw_chat_messages_normalize(b, &out, &err);
		CHECK(st != SFW_OK && !out && strstr(err.msg, bad[i].want), "normalize refuses %s: %s", bad[i].json, err.msg);
		cJSON_Delete(b);
	}
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--render"))
		return render_mode(argv[2], argv[3], argv[4]);
	test_toolcalls();
	test_gen_defaults();
	test_templates();
	test_hostile();
	test_normalize();
	return CHECK_REPORT("test_chat");
}
