/* req.c - request bodies of /v1/completions and /v1/chat/completions:
 * strict parsing and validation, no engine (serve.h). */
#include "serve/serve.h"
#include "alloc.h"
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static enum sfw_status bad(struct sfw_serve_error *e, const char *param, const char *fmt, ...)
    SFW_PRINTF(3, 4);
static enum sfw_status bad(struct sfw_serve_error *e, const char *param, const char *fmt, ...)
{
	e->http = 400;
	e->type = "invalid_request_error";
	e->code = NULL;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	size_t P = strlen(e->param);
	while (P && !sfw_utf8_valid((const unsigned char *)e->param, P))
		e->param[--P] = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	/* a quoted field or model name may have been cut inside a character */
	size_t L = strlen(e->message);
	while (L && !sfw_utf8_valid((const unsigned char *)e->message, L))
		e->message[--L] = 0;
	return SFW_E_INVAL;
}

static int is_null(const cJSON *v)
{
	return !v || cJSON_IsNull(v);
}

/* An integral number within [lo, hi]. */
static int get_int(const cJSON *v, double lo, double hi, int64_t *out)
{
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
	    v->valuedouble < lo || v->valuedouble > hi)
		return 0;
	*out = (int64_t)v->valuedouble;
	return 1;
}

static enum sfw_status take_stop(struct sfw_serve_req *r, const cJSON *v, struct sfw_serve_error *e)
{
	if (is_null(v))
		return SFW_OK;
	const cJSON *one = cJSON_IsString(v) ? v : NULL;
	if (!one && !cJSON_IsArray(v))
		return bad(e, "stop", "'stop' must be a string or a list of strings");
	int n = one ? 1 : cJSON_GetArraySize(v);
	if (n > SFW_STOP_MAX)
		return bad(e, "stop", "'stop' has %d strings (at most %d)", n, SFW_STOP_MAX);
	for (int i = 0; i < n; i++) {
		const cJSON *s = one ? one : cJSON_GetArrayItem(v, i);
		if (!cJSON_IsString(s))
			return bad(e, "stop", "'stop' must be a string or a list of strings");
		size_t L = strlen(s->valuestring);
		if (L < 1 || L > SFW_STOP_MAX_LEN)
			return bad(e, "stop", "each stop string must have 1 to %d bytes", SFW_STOP_MAX_LEN);
		r->stop[r->n_stop++] = s->valuestring;
	}
	return SFW_OK;
}

/* prompt: a string, a list of one string, a list of token ids, or a list of
 * one list of token ids. */
static enum sfw_status take_prompt(struct sfw_serve_req *r, const cJSON *v, int vocab,
				   struct sfw_serve_error *e)
{
	if (is_null(v))
		return bad(e, "prompt", "'prompt' is required");
	if (cJSON_IsString(v)) {
		r->prompt = v->valuestring;
		return SFW_OK;
	}
	if (!cJSON_IsArray(v))
		return bad(e, "prompt",
			   "'prompt' must be a string, a list of token ids, or a list of one of those");
	int n = cJSON_GetArraySize(v);
	const cJSON *first = cJSON_GetArrayItem(v, 0);
	if (n == 1 && (cJSON_IsString(first) || cJSON_IsArray(first))) {
		if (cJSON_IsString(first)) {
			r->prompt = first->valuestring;
			return SFW_OK;
		}
		v = first;
		n = cJSON_GetArraySize(v);
	} else if (n > 1 && (cJSON_IsString(first) || cJSON_IsArray(first))) {
		return bad(e, "prompt", "a list of %d prompts (one per request is served)", n);
	}
	if (n < 1)
		return bad(e, "prompt", "'prompt' is empty");
	if ((size_t)n > SFW_SERVE_IDS_MAX)
		return bad(e, "prompt", "'prompt' has %d token ids (at most %u)", n, SFW_SERVE_IDS_MAX);
	if (!(r->prompt_ids = sfw_malloc((size_t)n * sizeof(int32_t))))
		return bad(e, "prompt", "out of memory for the prompt");
	int i = 0;
	for (const cJSON *t = v->child; t; t = t->next, i++) {
		int64_t id;
		if (!get_int(t, 0, (double)vocab - 1, &id))
			return bad(e, "prompt", "prompt token %d is not an id below the vocabulary size %d",
				   i, vocab);
		r->prompt_ids[i] = (int32_t)id;
	}
	r->n_prompt_ids = (size_t)n;
	return SFW_OK;
}

/* A message's content: a string, or a list of {"type": "text", "text": S}
 * parts, joined. */
static enum sfw_status take_content(struct sfw_serve_req *r, const cJSON *c, size_t i, const char **out,
				    struct sfw_serve_error *e)
{
	if (cJSON_IsString(c)) {
		*out = c->valuestring;
		return SFW_OK;
	}
	if (!cJSON_IsArray(c))
		return bad(e, "messages", "messages[%zu].content must be a string or a list of text parts",
			   i);
	size_t total = 0;
	for (const cJSON *p = c->child; p; p = p->next) {
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
		const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
		if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") ||
		    !cJSON_IsString(tx) || cJSON_GetArraySize(p) != 2)
			return bad(e, "messages",
				   "messages[%zu].content: only {\"type\": \"text\", \"text\": ...} parts",
				   i);
		total += strlen(tx->valuestring);
	}
	char *s = sfw_malloc(total + 1);
	char **o = s ? sfw_realloc(r->owned, (r->n_owned + 1) * sizeof(char *)) : NULL;
	if (!o) {
		sfw_free(s);
		return bad(e, "messages", "out of memory for a message");
	}
	r->owned = o;
	r->owned[r->n_owned++] = s;
	size_t k = 0;
	for (const cJSON *p = c->child; p; p = p->next) {
		const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
		size_t L = strlen(tx);
		memcpy(s + k, tx, L);
		k += L;
	}
	s[k] = 0;
	*out = s;
	return SFW_OK;
}

static enum sfw_status take_messages(struct sfw_serve_req *r, const cJSON *v, struct sfw_serve_error *e)
{
	if (is_null(v))
		return bad(e, "messages", "'messages' is required");
	if (!cJSON_IsArray(v))
		return bad(e, "messages", "'messages' must be a list of messages");
	int n = cJSON_GetArraySize(v);
	if (n < 1)
		return bad(e, "messages", "'messages' is empty");
	if (n > SFW_SERVE_MSGS_MAX)
		return bad(e, "messages", "%d messages (at most %d)", n, SFW_SERVE_MSGS_MAX);
	if (!(r->msgs = sfw_calloc((size_t)n, sizeof(*r->msgs))))
		return bad(e, "messages", "out of memory for the messages");
	size_t i = 0;
	for (const cJSON *m = v->child; m; m = m->next, i++) {
		if (!cJSON_IsObject(m))
			return bad(e, "messages", "messages[%zu] must be an object", i);
		const cJSON *role = NULL, *content = NULL;
		for (const cJSON *f = m->child; f; f = f->next) {
			if (!strcmp(f->string, "role"))
				role = f;
			else if (!strcmp(f->string, "content"))
				content = f;
			else if (!strcmp(f->string, "name")) {
				if (!cJSON_IsString(f))
					return bad(e, "messages", "messages[%zu].name must be a string", i);
			} else
				return bad(e, "messages",
					   "messages[%zu] has a field that is not supported (role, content "
					   "and name are)",
					   i);
		}
		if (!cJSON_IsString(role) ||
		    (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
		     strcmp(role->valuestring, "assistant")))
			return bad(e, "messages",
				   "messages[%zu].role must be \"system\", \"user\" or \"assistant\"", i);
		if (!content)
			return bad(e, "messages", "messages[%zu] has no content", i);
		enum sfw_status s = take_content(r, content, i, &r->msgs[i].content, e);
		if (s != SFW_OK)
			return s;
		r->msgs[i].role = role->valuestring;
	}
	r->n_msgs = i;
	return SFW_OK;
}

/* Fields that change nothing here, taken when of any JSON type. */
static const char *const ignored[] = {"user", "metadata", "store", "service_tier", "parallel_tool_calls",
				      NULL};

static int is_ignored(const char *k)
{
	for (int i = 0; ignored[i]; i++)
		if (!strcmp(k, ignored[i]))
			return 1;
	return 0;
}

/* Fields of features salafw does not have: accepted only at their "off" value. */
static int feature_off(const char *k, const cJSON *v)
{
	if (!strcmp(k, "echo") || !strcmp(k, "logprobs"))
		return is_null(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
	if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty"))
		return is_null(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
	if (!strcmp(k, "best_of"))
		return is_null(v) || (cJSON_IsNumber(v) && v->valuedouble == 1);
	if (!strcmp(k, "logit_bias"))
		return is_null(v) || (cJSON_IsObject(v) && !v->child);
	if (!strcmp(k, "tools") || !strcmp(k, "functions"))
		return is_null(v) || (cJSON_IsArray(v) && !v->child);
	if (!strcmp(k, "suffix") || !strcmp(k, "tool_choice") || !strcmp(k, "function_call") ||
	    !strcmp(k, "top_logprobs"))
		return is_null(v) ||
		       (!strcmp(k, "tool_choice") && cJSON_IsString(v) && !strcmp(v->valuestring, "none"));
	if (!strcmp(k, "response_format")) {
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
		return is_null(v) ||
		       (cJSON_IsObject(v) && cJSON_IsString(t) && !strcmp(t->valuestring, "text"));
	}
	return -1; /* not a feature field */
}

/* 1 when a string of the JSON text b holds the escape \u0000, which cJSON
 * would cut the string at; field: the top-level field it is in ("" when
 * outside one). b is valid JSON here (parsed before). */
static int has_nul_escape(const char *b, size_t n, char *field, size_t cap)
{
	int depth = 0, in_str = 0, key_next = 0, is_key = 0;
	size_t ks = 0;
	field[0] = 0;
	for (size_t i = 0; i < n; i++) {
		char c = b[i];
		if (in_str) {
			if (c == '\\') {
				if (n - i > 5 && !memcmp(b + i + 1, "u0000", 5)) {
					if (is_key)
						field[0] = 0;
					return 1;
				}
				i++;
			} else if (c == '"') {
				in_str = 0;
				if (is_key) {
					size_t L = i - ks < cap - 1 ? i - ks : cap - 1;
					memcpy(field, b + ks, L);
					field[L] = 0;
				}
			}
			continue;
		}
		if (c == '"') {
			in_str = 1;
			is_key = depth == 1 && key_next;
			key_next = 0;
			ks = i + 1;
		} else if (c == '{' || c == '[') {
			key_next = ++depth == 1 && c == '{';
		} else if (c == '}' || c == ']') {
			depth--;
		} else if (c == ',' && depth == 1) {
			key_next = 1;
		}
	}
	return 0;
}

enum sfw_status sfw_serve_req_parse(const char *body, size_t len, enum sfw_serve_kind kind,
				    const char *served_model, int vocab, struct sfw_serve_req *r,
				    struct sfw_serve_error *e)
{
	memset(r, 0, sizeof(*r));
	memset(e, 0, sizeof(*e));
	r->kind = kind;
	r->temperature = 1;
	r->top_p = 1;
	if (len > SFW_SERVE_BODY_MAX) {
		bad(e, NULL, "the request body is larger than %u bytes", SFW_SERVE_BODY_MAX);
		e->http = 413;
		return SFW_E_INVAL;
	}
	struct sfw_err je = {0};
	if (sfw_json_parse(body, len, "the request body", &r->root, &je) != SFW_OK)
		return bad(e, NULL, "%s", je.msg);
	if (!cJSON_IsObject(r->root))
		return bad(e, NULL, "the request body must be a JSON object");
	char nul_field[64];
	if (has_nul_escape(body, len, nul_field, sizeof(nul_field)))
		return bad(e, nul_field, "%s%s%sholds an escaped NUL character (\\u0000), which text here cannot hold",
			   nul_field[0] ? "'" : "", nul_field, nul_field[0] ? "' " : "the request body ");
	const cJSON *prompt = NULL, *messages = NULL;
	enum sfw_status s = SFW_OK;
	int have_model = 0;
	for (const cJSON *f = r->root->child; f && s == SFW_OK; f = f->next) {
		const char *k = f->string;
		int64_t iv = 0;
		int off = feature_off(k, f);
		if (off == 0)
			s = bad(e, k, "'%.100s' is not supported by this server", k);
		else if (off == 1 || is_ignored(k))
			continue;
		else if (!strcmp(k, "model")) {
			if (!cJSON_IsString(f))
				s = bad(e, "model", "'model' must be a string");
			r->model = f->valuestring;
			have_model = 1;
		} else if (!strcmp(k, "prompt") && kind == SFW_SERVE_COMPLETION)
			prompt = f;
		else if (!strcmp(k, "messages") && kind == SFW_SERVE_CHAT)
			messages = f;
		else if (!strcmp(k, "max_tokens") ||
			 (!strcmp(k, "max_completion_tokens") && kind == SFW_SERVE_CHAT)) {
			if (is_null(f))
				continue;
			if (!get_int(f, 1, 1 << 30, &iv))
				s = bad(e, k, "'%s' must be an integer from 1 to %d", k, 1 << 30);
			r->max_tokens = iv;
		} else if (!strcmp(k, "temperature")) {
			if (is_null(f))
				continue;
			if (!cJSON_IsNumber(f) || !(f->valuedouble >= 0 && f->valuedouble <= 2))
				s = bad(e, k, "'temperature' must be a number from 0 to 2");
			r->temperature = f->valuedouble;
		} else if (!strcmp(k, "top_p")) {
			if (is_null(f))
				continue;
			/* checked as the float the sampler takes: 1e-300 is 0 there */
			if (!cJSON_IsNumber(f) || !(f->valuedouble > 0 && f->valuedouble <= 1) ||
			    !((float)f->valuedouble > 0))
				s = bad(e, k, "'top_p' must be a number in (0, 1], at least 1.4e-45 (the smallest "
					      "float above 0)");
			r->top_p = f->valuedouble;
		} else if (!strcmp(k, "top_k")) {
			if (is_null(f))
				continue;
			if (!get_int(f, -1, INT32_MAX, &iv))
				s = bad(e, k, "'top_k' must be an integer, -1 or 0 for off");
			r->top_k = iv < 0 ? 0 : (int)iv;
		} else if (!strcmp(k, "seed")) {
			if (is_null(f))
				continue;
			if (!get_int(f, -9007199254740991.0, 9007199254740991.0, &iv))
				s = bad(e, k, "'seed' must be an integer");
			r->seed = (uint64_t)iv;
			r->have_seed = 1;
		} else if (!strcmp(k, "n")) {
			if (!is_null(f) && !(get_int(f, 1, 1, &iv)))
				s = bad(e, k, "only n = 1 is supported");
		} else if (!strcmp(k, "stop")) {
			s = take_stop(r, f, e);
		} else if (!strcmp(k, "stream")) {
			if (!is_null(f) && !cJSON_IsBool(f))
				s = bad(e, k, "'stream' must be true or false");
			r->stream = cJSON_IsTrue(f);
		} else if (!strcmp(k, "ignore_eos")) {
			if (!is_null(f) && !cJSON_IsBool(f))
				s = bad(e, k, "'ignore_eos' must be true or false");
			r->ignore_eos = cJSON_IsTrue(f);
		} else if (!strcmp(k, "stream_options")) {
			if (is_null(f))
				continue;
			const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
			if (!cJSON_IsObject(f) ||
			    (f->child && (!cJSON_IsBool(u) || cJSON_GetArraySize(f) != 1)))
				s = bad(e, k, "'stream_options' may hold only include_usage (true or false)");
			r->include_usage = cJSON_IsTrue(u);
		} else
			s = bad(e, k, "unrecognized request field '%.100s'", k);
	}
	if (s != SFW_OK)
		return s;
	if (!have_model)
		return bad(e, "model", "'model' is required");
	if (strcmp(r->model, served_model)) {
		bad(e, "model", "the model '%.200s' does not exist (this server has '%.200s')", r->model,
		    served_model);
		e->code = "model_not_found";
		return SFW_E_INVAL;
	}
	if (r->stream == 0 && r->include_usage)
		return bad(e, "stream_options", "'stream_options' needs 'stream': true");
	return kind == SFW_SERVE_COMPLETION ? take_prompt(r, prompt, vocab, e)
					    : take_messages(r, messages, e);
}

void sfw_serve_req_release(struct sfw_serve_req *r)
{
	cJSON_Delete(r->root);
	sfw_free(r->prompt_ids);
	sfw_free(r->msgs);
	for (size_t i = 0; i < r->n_owned; i++)
		sfw_free(r->owned[i]);
	sfw_free(r->owned);
	memset(r, 0, sizeof(*r));
}

char *sfw_serve_error_json(const struct sfw_serve_error *e)
{
	cJSON *o = cJSON_CreateObject(), *in = cJSON_AddObjectToObject(o, "error");
	char *out = NULL;
	if (in && cJSON_AddStringToObject(in, "message", e->message) &&
	    cJSON_AddStringToObject(in, "type", e->type ? e->type : "invalid_request_error") &&
	    (e->param[0] ? cJSON_AddStringToObject(in, "param", e->param) != NULL
			 : cJSON_AddNullToObject(in, "param") != NULL) &&
	    (e->code ? cJSON_AddStringToObject(in, "code", e->code) != NULL
		     : cJSON_AddNullToObject(in, "code") != NULL)) {
		char *p = cJSON_PrintUnformatted(o);
		if (p) {
			size_t L = strlen(p);
			if ((out = sfw_malloc(L + 1)))
				memcpy(out, p, L + 1);
			cJSON_free(p);
		}
	}
	cJSON_Delete(o);
	return out;
}
