/* fuzz_chat - libFuzzer target for the chat format (formats/chat.h): the
 * bytes as a chat template, compiled and rendered over a fixed conversation
 * with tools (any outcome but a crash, a hang or an overrun is fine; an
 * accepted render respects the output cap), and the same bytes as a model
 * reply fed to the tool-call parser in pieces: with no call reported, the
 * content must be the input exactly. */
#include "formats/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char MSGS[] =
	"[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u \\u00e9\"},"
	"{\"role\":\"assistant\",\"content\":\"<think>r</think>a\",\"tool_calls\":[{\"type\":\"function\","
	"\"function\":{\"name\":\"f\",\"arguments\":{\"x\":[1,2.5,null,true]}}}]},{\"role\":\"tool\",\"content\":\"t\"},"
	"{\"role\":\"user\",\"content\":\"\"}]";
static const char TOOLS[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]";

struct acc {
	size_t len;
	int ok;
	const uint8_t *want;
};

static int on_content(void *u, const char *s, size_t n)
{
	struct acc *a = u;
	if (a->ok && memcmp(a->want + a->len, s, n) != 0)
		a->ok = 0;
	a->len += n;
	return 0;
}

static int on_call(void *u, const struct sfw_toolcall *c)
{
	struct acc *a = u;
	a->ok = 0; /* content no longer equals the input: not compared */
	if (!c->name || !c->name[0] || !c->arguments || c->arguments[0] != '{')
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sfw_err err;
	struct sfw_chat_template *t = NULL;
	if (sfw_chat_template_new((const char *)data, size, "fuzz", NULL, NULL, &t, &err) == SFW_OK) {
		cJSON *m = cJSON_Parse(MSGS), *tools = cJSON_Parse(TOOLS);
		struct sfw_buf out;
		sfw_buf_init(&out, 1u << 20);
		if (sfw_chat_render(t, m, tools, NULL, 1, &out, &err) == SFW_OK && out.len > out.max)
			abort();
		sfw_buf_release(&out);
		cJSON_Delete(m);
		cJSON_Delete(tools);
		sfw_chat_template_free(t);
	}
	struct sfw_toolparse *p = NULL;
	if (sfw_toolparse_new(&p, &err) != SFW_OK)
		return 0;
	struct acc a = {0, 1, data};
	struct sfw_toolparse_cb cb = {on_content, on_call, &a};
	size_t off = 0, step = size ? (size_t)data[0] % 7 + 1 : 1;
	while (off < size) {
		size_t n = size - off < step ? size - off : step;
		if (sfw_toolparse_feed(p, (const char *)data + off, n, &cb, &err) != SFW_OK)
			abort();
		off += n;
		step = step % 13 + 1;
	}
	if (sfw_toolparse_finish(p, &cb, &err) != SFW_OK)
		abort();
	if (a.ok && a.len != size)
		abort();
	sfw_toolparse_free(p);
	return 0;
}
