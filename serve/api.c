/* api.c - the chat prompt of a request, /tokenize and /detokenize, CORS
 * origins (serve.h): no engine. */
#include "serve/serve.h"
#include "alloc.h"
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define bad sfwi_serve_fail

enum sfw_status sfw_serve_chat_prompt(const struct sfw_chat_template *t, const struct sfw_serve_req *r,
				      struct sfw_buf *out, size_t *forced_at, struct sfw_err *err)
{
	const cJSON *tools = r->tool_choice == SFW_TOOLS_NONE ? NULL : r->tools;
	cJSON *msgs = NULL;
	enum sfw_status s =
	    sfw_chat_messages_normalize(cJSON_GetObjectItemCaseSensitive(r->root, "messages"), &msgs, err);
	/* an assistant's content null (beside its tool calls) as "": templates
	 * that test for a string read it alike, and simple ones can join it */
	for (cJSON *m = msgs ? msgs->child : NULL; s == SFW_OK && m; m = m->next) {
		cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
		if (c && !cJSON_IsNull(c))
			continue;
		cJSON *e = cJSON_CreateString("");
		if (!e || !(c ? cJSON_ReplaceItemInObjectCaseSensitive(m, "content", e)
			      : cJSON_AddItemToObject(m, "content", e))) {
			cJSON_Delete(e);
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		}
	}
	if (s == SFW_OK)
		s = sfw_chat_render(t, msgs, tools, r->template_kwargs, r->add_generation_prompt, out, err);
	cJSON_Delete(msgs);
	if (s != SFW_OK)
		return s;
	*forced_at = out->len;
	/* the reply starts as the template asks a call to be written
	 * (SFW_CHAT_TOOL_OPEN, then the JSON object with the name first) */
	if (r->tool_choice == SFW_TOOLS_REQUIRED)
		s = sfw_buf_printf(out, "%s\n{\"name\": \"", SFW_CHAT_TOOL_OPEN);
	else if (r->tool_choice == SFW_TOOLS_NAMED) {
		cJSON *nm = cJSON_CreateString(r->tool_name);
		char *q = nm ? cJSON_PrintUnformatted(nm) : NULL;
		s = q ? sfw_buf_printf(out, "%s\n{\"name\": %s, \"arguments\": ", SFW_CHAT_TOOL_OPEN, q)
		      : sfw_fail(err, SFW_E_NOMEM, "out of memory");
		cJSON_free(q);
		cJSON_Delete(nm);
	}
	if (s != SFW_OK && !err->msg[0])
		sfw_fail(err, s, "the prompt is too long");
	return s;
}

static char *print_json(cJSON *o)
{
	char *p = o ? cJSON_PrintUnformatted(o) : NULL, *out = NULL;
	cJSON_Delete(o);
	if (p) {
		size_t L = strlen(p);
		if ((out = sfw_malloc(L + 1)))
			memcpy(out, p, L + 1);
		cJSON_free(p);
	}
	return out;
}

/* The body as an object with an optional model among names. */
static enum sfw_status body_object(const char *body, size_t len, const char *const *names, size_t n_names,
				   cJSON **root, struct sfw_serve_error *e)
{
	struct sfw_err je = {0};
	*root = NULL;
	if (sfw_json_parse(body, len, "the request body", root, &je) != SFW_OK)
		return bad(e, 400, NULL, "%s", je.msg);
	if (!cJSON_IsObject(*root))
		return bad(e, 400, NULL, "the request body must be a JSON object");
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(*root, "model");
	if (m && !cJSON_IsNull(m)) {
		if (!cJSON_IsString(m))
			return bad(e, 400, "model", "'model' must be a string");
		size_t i = 0;
		while (i < n_names && strcmp(names[i], m->valuestring))
			i++;
		if (i == n_names) {
			bad(e, 404, "model", "the model '%.200s' does not exist (this server has '%.200s')",
			    m->valuestring, n_names ? names[0] : "");
			e->code = "model_not_found";
			return SFW_E_INVAL;
		}
	}
	return SFW_OK;
}

enum sfw_status sfw_serve_tokenize(const char *body, size_t len, const char *const *names, size_t n_names,
				   const struct sfw_tokenizer *tok, const struct sfw_chat_template *chat,
				   int64_t max_context, char **out, struct sfw_serve_error *e)
{
	cJSON *root = NULL;
	*out = NULL;
	memset(e, 0, sizeof(*e));
	enum sfw_status s = body_object(body, len, names, n_names, &root, e);
	int32_t *ids = NULL;
	size_t n = 0;
	struct sfw_err err = {0};
	if (s != SFW_OK)
		goto done;
	const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
	const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
	if (!prompt == !msgs) {
		s = bad(e, 400, "prompt", "give 'prompt' (a string) or 'messages', one of them");
		goto done;
	}
	if (prompt) {
		const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
		if (!cJSON_IsString(prompt)) {
			s = bad(e, 400, "prompt", "'prompt' must be a string");
			goto done;
		}
		if (sp && !cJSON_IsBool(sp)) {
			s = bad(e, 400, "add_special_tokens", "'add_special_tokens' must be true or false");
			goto done;
		}
		s = sfw_tokenizer_encode(tok, prompt->valuestring, strlen(prompt->valuestring),
					 !cJSON_IsFalse(sp), &ids, &n, &err);
	} else {
		/* the chat request's own parsing and rendering, the model optional */
		struct sfw_serve_req r;
		struct sfw_buf t;
		size_t forced;
		sfw_buf_init(&t, 2 * SFW_SERVE_BODY_MAX);
		s = sfw_serve_req_parse(body, len, SFW_SERVE_CHAT, NULL, 0, sfw_tokenizer_vocab(tok), &r, e);
		if (s == SFW_OK && (s = sfw_serve_chat_prompt(chat, &r, &t, &forced, &err)) == SFW_OK)
			s = sfw_tokenizer_encode(tok, t.data ? t.data : "", t.len,
						 sfw_chat_needs_bos(chat, t.data ? t.data : "", t.len), &ids,
						 &n, &err);
		sfw_buf_release(&t);
		sfw_serve_req_release(&r);
		if (e->http)
			goto done;
	}
	if (s != SFW_OK) {
		s = bad(e, s == SFW_E_NOMEM ? 500 : 400, prompt ? "prompt" : "messages", "%s", err.msg);
		goto done;
	}
	cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
	for (size_t i = 0; arr && i < n; i++)
		cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
	cJSON_AddNumberToObject(o, "count", (double)n);
	cJSON_AddNumberToObject(o, "max_model_len", (double)max_context);
	cJSON_AddNullToObject(o, "token_strs");
	if (!(*out = print_json(o)))
		s = bad(e, 500, NULL, "out of memory");
done:
	sfw_free(ids);
	cJSON_Delete(root);
	return s;
}

enum sfw_status sfw_serve_detokenize(const char *body, size_t len, const char *const *names, size_t n_names,
				     const struct sfw_tokenizer *tok, char **out, struct sfw_serve_error *e)
{
	cJSON *root = NULL;
	*out = NULL;
	memset(e, 0, sizeof(*e));
	enum sfw_status s = body_object(body, len, names, n_names, &root, e);
	int32_t *ids = NULL;
	struct sfw_buf t;
	sfw_buf_init(&t, 64u << 20);
	if (s != SFW_OK)
		goto done;
	const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokens");
	int n = cJSON_IsArray(tk) ? cJSON_GetArraySize(tk) : -1, V = sfw_tokenizer_vocab(tok), i = 0;
	if (n < 0 || (size_t)n > SFW_SERVE_IDS_MAX) {
		s = bad(e, 400, "tokens", "'tokens' must be a list of at most %u token ids",
			SFW_SERVE_IDS_MAX);
		goto done;
	}
	if (!(ids = sfw_malloc((size_t)(n ? n : 1) * sizeof(int32_t)))) {
		s = bad(e, 500, NULL, "out of memory");
		goto done;
	}
	for (const cJSON *x = tk->child; x; x = x->next, i++) {
		if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int32_t)x->valuedouble ||
		    x->valuedouble < 0 || x->valuedouble >= V) {
			s = bad(e, 400, "tokens", "tokens[%d] is not a token id below %d", i, V);
			goto done;
		}
		ids[i] = (int32_t)x->valuedouble;
	}
	struct sfw_err err = {0};
	if ((s = sfw_tokenizer_decode(tok, ids, (size_t)n, 0, &t, &err)) != SFW_OK) {
		s = bad(e, s == SFW_E_NOMEM ? 500 : 400, "tokens", "%s", err.msg);
		goto done;
	}
	cJSON *o = cJSON_CreateObject();
	char *txt = sfw_malloc(t.len + 1);
	if (txt) {
		memcpy(txt, t.data ? t.data : "", t.len);
		txt[t.len] = 0;
		cJSON_AddStringToObject(o, "prompt", txt);
		sfw_free(txt);
	}
	if (!txt || !(*out = print_json(o)))
		s = bad(e, 500, NULL, "out of memory");
	if (!txt)
		cJSON_Delete(o);
done:
	sfw_buf_release(&t);
	sfw_free(ids);
	cJSON_Delete(root);
	return s;
}

int sfw_serve_origin_allowed(const char *allowed, const char *origin)
{
	if (!allowed || !origin || !*origin)
		return 0;
	size_t on = strlen(origin);
	for (const char *p = allowed; *p;) {
		while (*p == ',' || *p == ' ')
			p++;
		const char *q = p;
		while (*q && *q != ',' && *q != ' ')
			q++;
		size_t n = (size_t)(q - p);
		if ((n == 1 && *p == '*') || (n == on && !strncmp(p, origin, n)))
			return 1;
		p = q;
	}
	return 0;
}
