/* toolcall.c - tool calls out of a model's reply, incrementally
 * (formats/chat.h documents the behaviour). Untrusted input: the model
 * writes whatever it writes. Everything is bounded: the held-back text by the
 * opening tag's length, a call body by SFW_TOOLCALL_BODY_MAX, the calls by
 * SFW_TOOLCALL_MAX; a body is parsed by the strict JSON parser (core/json.h). */
#include "formats/chat.h"
#include "alloc.h"
#include "json.h"

#include <string.h>

static const char OPEN[] = SFW_CHAT_TOOL_OPEN, CLOSE[] = SFW_CHAT_TOOL_CLOSE;
#define OPEN_LEN (sizeof(OPEN) - 1)
#define CLOSE_LEN (sizeof(CLOSE) - 1)

struct sfw_toolparse {
	int in_call;  /* inside <tool_call> ... */
	int n_calls;
	int done;     /* SFW_TOOLCALL_MAX reached: the rest is content */
	int overflow; /* the current body outgrew the cap: content until the close tag */
	struct sfw_buf buf; /* held-back text (outside) or the body so far (inside) */
};

enum sfw_status sfw_toolparse_new(struct sfw_toolparse **out, struct sfw_err *err)
{
	struct sfw_toolparse *p = sfw_calloc(1, sizeof(*p));
	if (!p)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	sfw_buf_init(&p->buf, SFW_TOOLCALL_BODY_MAX + CLOSE_LEN + OPEN_LEN);
	*out = p;
	return SFW_OK;
}

void sfw_toolparse_free(struct sfw_toolparse *p)
{
	if (!p)
		return;
	sfw_buf_release(&p->buf);
	sfw_free(p);
}

int sfw_toolparse_count(const struct sfw_toolparse *p) { return p->n_calls; }

static enum sfw_status content(const struct sfw_toolparse_cb *cb, const char *s, size_t n, struct sfw_err *err)
{
	if (!n || !cb->content)
		return SFW_OK;
	if (cb->content(cb->user, s, n))
		return sfw_fail(err, SFW_E_ABORTED, "tool-call parsing stopped by the caller");
	return SFW_OK;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* body -> name + compact arguments; 0 when it is not a call */
static int parse_call(const char *body, size_t n, char **name, char **args)
{
	*name = *args = NULL;
	while (n && is_space(*body))
		body++, n--;
	while (n && is_space(body[n - 1]))
		n--;
	cJSON *root = NULL;
	if (!n || sfw_json_parse(body, n, "tool call", &root, NULL) != SFW_OK)
		return 0;
	int ok = 0;
	const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
	const cJSON *ar = cJSON_GetObjectItemCaseSensitive(root, "arguments");
	cJSON *parsed = NULL;
	if (!cJSON_IsObject(root) || !cJSON_IsString(nm) || !nm->valuestring[0])
		goto out;
	if (cJSON_IsString(ar)) { /* arguments as a JSON string holding an object */
		size_t an = strlen(ar->valuestring);
		if (sfw_json_parse(ar->valuestring, an, "tool call arguments", &parsed, NULL) != SFW_OK ||
		    !cJSON_IsObject(parsed))
			goto out;
		ar = parsed;
	} else if (ar && !cJSON_IsNull(ar) && !cJSON_IsObject(ar))
		goto out;
	*name = sfw_strdup(nm->valuestring);
	if (ar && cJSON_IsObject(ar)) {
		char *s = cJSON_PrintUnformatted(ar);
		*args = s ? sfw_strdup(s) : NULL;
		cJSON_free(s);
	} else
		*args = sfw_strdup("{}");
	ok = *name && *args;
	if (!ok) {
		sfw_free(*name);
		sfw_free(*args);
		*name = *args = NULL;
		ok = -1; /* out of memory */
	}
out:
	cJSON_Delete(parsed);
	cJSON_Delete(root);
	return ok;
}

/* The call in buf (closed or not): reported as a call, or given back as
 * content with its tags. */
static enum sfw_status end_call(struct sfw_toolparse *p, const struct sfw_toolparse_cb *cb, int closed,
				struct sfw_err *err)
{
	char *name, *args;
	int r = p->overflow ? 0 : parse_call(p->buf.data ? p->buf.data : "", p->buf.len, &name, &args);
	enum sfw_status st = SFW_OK;
	if (r < 0)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (r > 0) {
		struct sfw_toolcall c = {.index = p->n_calls, .name = name, .arguments = args};
		p->n_calls++;
		if (cb->call && cb->call(cb->user, &c))
			st = sfw_fail(err, SFW_E_ABORTED, "tool-call parsing stopped by the caller");
		sfw_free(name);
		sfw_free(args);
		if (p->n_calls >= SFW_TOOLCALL_MAX)
			p->done = 1;
	} else {
		if ((st = content(cb, OPEN, OPEN_LEN, err)) == SFW_OK &&
		    (st = content(cb, p->buf.data, p->buf.len, err)) == SFW_OK && closed)
			st = content(cb, CLOSE, CLOSE_LEN, err);
	}
	sfw_buf_reset(&p->buf);
	p->in_call = 0;
	p->overflow = 0;
	return st;
}

/* the longest suffix of s[0..n) that is a proper prefix of tag */
static size_t partial_tail(const char *s, size_t n, const char *tag, size_t tl)
{
	size_t k = n < tl - 1 ? n : tl - 1;
	for (; k > 0; k--)
		if (!memcmp(s + n - k, tag, k))
			return k;
	return 0;
}

static enum sfw_status drop_front(struct sfw_toolparse *p, size_t k)
{
	memmove(p->buf.data, p->buf.data + k, p->buf.len - k);
	p->buf.len -= k;
	p->buf.data[p->buf.len] = 0;
	return SFW_OK;
}

enum sfw_status sfw_toolparse_feed(struct sfw_toolparse *p, const char *text, size_t len,
				   const struct sfw_toolparse_cb *cb, struct sfw_err *err)
{
	enum sfw_status st;
	while (len) {
		if (p->done && !p->in_call) { /* no more calls: everything is content */
			if (p->buf.len) {
				if ((st = content(cb, p->buf.data, p->buf.len, err)) != SFW_OK)
					return st;
				sfw_buf_reset(&p->buf);
			}
			return content(cb, text, len, err);
		}
		/* take at most a slice at a time, so the buffer's cap is never hit */
		size_t room = p->buf.max - p->buf.len;
		size_t take = len < room ? len : room;
		if (!take) { /* an outgrown body: keep only a tail that may hold the close tag */
			SFW_ASSERT(p->in_call);
			if (!p->overflow) {
				p->overflow = 1;
				if ((st = content(cb, OPEN, OPEN_LEN, err)) != SFW_OK)
					return st;
			}
			size_t keep = CLOSE_LEN - 1;
			if ((st = content(cb, p->buf.data, p->buf.len - keep, err)) != SFW_OK)
				return st;
			drop_front(p, p->buf.len - keep);
			continue;
		}
		if ((st = sfw_buf_append(&p->buf, text, take)) != SFW_OK)
			return sfw_fail(err, st, "out of memory");
		text += take;
		len -= take;
		for (;;) {
			const char *b = p->buf.data;
			size_t n = p->buf.len;
			if (!p->in_call) {
				const char *o = n >= OPEN_LEN ? memmem(b, n, OPEN, OPEN_LEN) : NULL;
				if (o && !p->done) {
					size_t k = (size_t)(o - b);
					if ((st = content(cb, b, k, err)) != SFW_OK)
						return st;
					drop_front(p, k + OPEN_LEN);
					p->in_call = 1;
					continue;
				}
				size_t hold = p->done ? 0 : partial_tail(b, n, OPEN, OPEN_LEN);
				if ((st = content(cb, b, n - hold, err)) != SFW_OK)
					return st;
				drop_front(p, n - hold);
				break;
			}
			const char *c = n >= CLOSE_LEN ? memmem(b, n, CLOSE, CLOSE_LEN) : NULL;
			if (!c)
				break;
			size_t k = (size_t)(c - b);
			size_t rest = n - k - CLOSE_LEN;
			/* the body is buf[0, k); what follows the close tag stays */
			char *tail = NULL;
			if (rest) { /* bytes, NUL included: not a string copy */
				if (!(tail = sfw_malloc(rest)))
					return sfw_fail(err, SFW_E_NOMEM, "out of memory");
				memcpy(tail, c + CLOSE_LEN, rest);
			}
			p->buf.len = k;
			p->buf.data[k] = 0;
			if (p->overflow) { /* the outgrown body's last bytes, then the tag */
				st = content(cb, p->buf.data, p->buf.len, err);
				if (st == SFW_OK)
					st = content(cb, CLOSE, CLOSE_LEN, err);
				sfw_buf_reset(&p->buf);
				p->in_call = 0;
				p->overflow = 0;
			} else
				st = end_call(p, cb, 1, err);
			if (st == SFW_OK && rest)
				st = sfw_buf_append(&p->buf, tail, rest) == SFW_OK ? SFW_OK
										  : sfw_fail(err, SFW_E_NOMEM, "out of memory");
			sfw_free(tail);
			if (st != SFW_OK)
				return st;
			if (p->done && !p->in_call) {
				if (p->buf.len) {
					if ((st = content(cb, p->buf.data, p->buf.len, err)) != SFW_OK)
						return st;
					sfw_buf_reset(&p->buf);
				}
				break;
			}
		}
	}
	return SFW_OK;
}

enum sfw_status sfw_toolparse_finish(struct sfw_toolparse *p, const struct sfw_toolparse_cb *cb, struct sfw_err *err)
{
	enum sfw_status st = SFW_OK;
	if (p->in_call) {
		if (p->overflow) {
			st = content(cb, p->buf.data, p->buf.len, err);
			sfw_buf_reset(&p->buf);
			p->in_call = p->overflow = 0;
		} else
			st = end_call(p, cb, 0, err);
	} else if (p->buf.len) {
		st = content(cb, p->buf.data, p->buf.len, err);
		sfw_buf_reset(&p->buf);
	}
	return st;
}
