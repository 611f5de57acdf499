/* chat.c - the ChatML prompt of the MiniCPM4 family (docs/model-spec.md §4). */
#include "formats/tokenizer.h"

#include <string.h>

static enum sfw_status put(struct sfw_buf *out, const char *s, struct sfw_err *err)
{
	enum sfw_status st = sfw_buf_append(out, s, strlen(s));
	if (st != SFW_OK)
		return st == SFW_E_RANGE ? sfw_fail(err, st, "chat prompt is too long (limit %zu bytes)", out->max)
					 : sfw_fail(err, st, "out of memory for the chat prompt");
	return SFW_OK;
}

enum sfw_status sfw_chat_format(const struct sfw_chat_msg *msgs, size_t n, int add_generation_prompt,
				struct sfw_buf *out, struct sfw_err *err)
{
	enum sfw_status st = SFW_OK;
	for (size_t i = 0; i < n; i++) {
		const char *role = msgs[i].role, *content = msgs[i].content;
		if (!role || !*role || strchr(role, '\n'))
			return sfw_fail(err, SFW_E_INVAL, "chat message %zu: role must be one non-empty line", i);
		if (!content)
			return sfw_fail(err, SFW_E_INVAL, "chat message %zu: no content", i);
		if ((st = put(out, "<|im_start|>", err)) || (st = put(out, role, err)) || (st = put(out, "\n", err)) ||
		    (st = put(out, content, err)) || (st = put(out, "<|im_end|>\n", err)))
			return st;
	}
	if (add_generation_prompt)
		st = put(out, "<|im_start|>assistant\n", err);
	return st;
}
