/* req.c - request bodies of /v1/completions and /v1/chat/completions:
 * strict JSON, lenient fields (vLLM's habits: unknown ones ignored and
 * reported, features salafw lacks refused only at a value that would change
 * the answer), no engine (serve.h). */
#include "serve/serve.h"
#include "alloc.h"
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One client error (the OpenAI error object): HTTP status, its type, the
 * parameter and the message, cut at a whole UTF-8 character (a quoted field
 * or model name may have been cut inside one). Returns SFW_E_INVAL. */
enum sfw_status sfwi_serve_fail(struct sfw_serve_error *e, int http, const char *param, const char *fmt, ...)
{
	e->http = http;
	e->type = http >= 500 ? "server_error" : "invalid_request_error";
	e->code = NULL;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	size_t P = strlen(e->param);
	while (P && !sfw_utf8_valid((const unsigned char *)e->param, P))
		e->param[--P] = 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	size_t L = strlen(e->message);
	while (L && !sfw_utf8_valid((const unsigned char *)e->message, L))
		e->message[--L] = 0;
	return SFW_E_INVAL;
}
#define bad(e, ...) sfwi_serve_fail((e), 400, __VA_ARGS__)

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

/* A message's content: a string, a list of {"type": "text", "text": S}
 * parts (other members of a part ignored), joined by "\n" (as vLLM and
 * formats/chat.h join them), or null (*out NULL). */
static enum sfw_status take_content(struct sfw_serve_req *r, const cJSON *c, size_t i, const char **out,
				    struct sfw_serve_error *e)
{
	*out = NULL;
	if (is_null(c))
		return SFW_OK;
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
		    !cJSON_IsString(tx))
			return bad(e, "messages",
				   "messages[%zu].content: only {\"type\": \"text\", \"text\": ...} parts "
				   "(this model reads text)",
				   i);
		total += strlen(tx->valuestring) + 1;
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
		if (p != c->child)
			s[k++] = '\n';
		memcpy(s + k, tx, L);
		k += L;
	}
	s[k] = 0;
	*out = s;
	return SFW_OK;
}

static void note_unknown(struct sfw_serve_req *r, const char *k)
{
	for (size_t i = 0; i < r->n_unknown; i++)
		if (!strcmp(r->unknown[i], k))
			return;
	if (r->n_unknown < SFW_SERVE_UNKNOWN_MAX)
		r->unknown[r->n_unknown++] = k;
}

/* An assistant's tool_calls: [{"id"?, "type": "function", "function":
 * {"name": S, "arguments": S or object}}]. */
static enum sfw_status check_tool_calls(const cJSON *v, size_t i, struct sfw_serve_error *e)
{
	if (!cJSON_IsArray(v))
		return bad(e, "messages", "messages[%zu].tool_calls must be a list", i);
	for (const cJSON *t = v->child; t; t = t->next) {
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
		const cJSON *ar = cJSON_GetObjectItemCaseSensitive(f, "arguments");
		if (!cJSON_IsObject(t) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"))) ||
		    !cJSON_IsObject(f) || !cJSON_IsString(nm) || (ar && !cJSON_IsString(ar) && !cJSON_IsObject(ar)))
			return bad(e, "messages",
				   "messages[%zu].tool_calls: each is {\"type\": \"function\", \"function\": "
				   "{\"name\": ..., \"arguments\": ...}}",
				   i);
	}
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
		const cJSON *role = NULL, *content = NULL, *calls = NULL, *call_id = NULL, *name = NULL,
			    *reasoning = NULL;
		for (const cJSON *f = m->child; f; f = f->next) {
			if (!strcmp(f->string, "role"))
				role = f;
			else if (!strcmp(f->string, "content"))
				content = f;
			else if (!strcmp(f->string, "tool_calls"))
				calls = is_null(f) ? NULL : f;
			else if (!strcmp(f->string, "tool_call_id"))
				call_id = f;
			else if (!strcmp(f->string, "name"))
				name = f;
			else if (!strcmp(f->string, "reasoning_content") || !strcmp(f->string, "reasoning"))
				reasoning = is_null(f) ? NULL : f;
			else if (!strcmp(f->string, "function_call") || !strcmp(f->string, "audio")) {
				if (!is_null(f))
					return bad(e, "messages", "messages[%zu].%s is not supported (use tool_calls)",
						   i, f->string);
			} else /* refusal, annotations, ...: ignored */
				note_unknown(r, f->string);
		}
		const char *rs = cJSON_IsString(role) ? role->valuestring : "";
		int sys = !strcmp(rs, "system") || !strcmp(rs, "developer"), asst = !strcmp(rs, "assistant");
		int tool = !strcmp(rs, "tool");
		if (!sys && !asst && !tool && strcmp(rs, "user"))
			return bad(e, "messages",
				   "messages[%zu].role must be \"system\", \"developer\", \"user\", \"assistant\" "
				   "or \"tool\"",
				   i);
		if (name && !cJSON_IsString(name))
			return bad(e, "messages", "messages[%zu].name must be a string", i);
		if (call_id && !is_null(call_id) && !cJSON_IsString(call_id))
			return bad(e, "messages", "messages[%zu].tool_call_id must be a string", i);
		if (reasoning && !cJSON_IsString(reasoning))
			return bad(e, "messages", "messages[%zu].reasoning_content must be a string", i);
		if (calls && !asst)
			return bad(e, "messages", "messages[%zu]: only an assistant message has tool_calls", i);
		enum sfw_status s = calls ? check_tool_calls(calls, i, e) : SFW_OK;
		if (s != SFW_OK)
			return s;
		if (!content && !asst)
			return bad(e, "messages", "messages[%zu] has no content", i);
		const char *text = NULL;
		if ((s = take_content(r, content, i, &text, e)) != SFW_OK)
			return s;
		if (!text && !asst)
			return bad(e, "messages", "messages[%zu].content is null (only an assistant's may be)", i);
		r->msgs[i].role = sys ? "system" : rs;
		r->msgs[i].content = text ? text : "";
		r->has_tool_msgs |= tool || calls;
	}
	r->n_msgs = i;
	return SFW_OK;
}

/* tools: [{"type": "function", "function": {"name": S, "description"?: S,
 * "parameters"?: object}}]; tool_choice: "none", "auto", "required" or
 * {"type": "function", "function": {"name": one of them}}. */
static enum sfw_status take_tools(struct sfw_serve_req *r, const cJSON *tools, const cJSON *choice,
				  struct sfw_serve_error *e)
{
	int n = 0;
	if (!is_null(tools)) {
		if (!cJSON_IsArray(tools))
			return bad(e, "tools", "'tools' must be a list");
		for (const cJSON *t = tools->child; t; t = t->next, n++) {
			const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
			const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
			const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
			const cJSON *ds = cJSON_GetObjectItemCaseSensitive(f, "description");
			const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
			if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") ||
			    !cJSON_IsObject(f) || !cJSON_IsString(nm) || !nm->valuestring[0] ||
			    (ds && !is_null(ds) && !cJSON_IsString(ds)) || (pa && !is_null(pa) && !cJSON_IsObject(pa)))
				return bad(e, "tools",
					   "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ..., "
					   "\"description\": ..., \"parameters\": {...}}}",
					   n);
		}
		if (n)
			r->tools = tools;
	}
	r->tool_choice = n ? SFW_TOOLS_AUTO : SFW_TOOLS_NONE;
	if (is_null(choice))
		return SFW_OK;
	if (cJSON_IsString(choice)) {
		const char *c = choice->valuestring;
		if (!strcmp(c, "none"))
			r->tool_choice = SFW_TOOLS_NONE;
		else if (!strcmp(c, "auto") && n)
			r->tool_choice = SFW_TOOLS_AUTO;
		else if (!strcmp(c, "required") && n)
			r->tool_choice = SFW_TOOLS_REQUIRED;
		else
			return bad(e, "tool_choice",
				   n ? "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function"
				     : "'tool_choice' other than \"none\" needs 'tools'");
		return SFW_OK;
	}
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
	const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
	if (!cJSON_IsObject(choice) || !cJSON_IsString(nm))
		return bad(e, "tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", "
					     "\"function\": {\"name\": ...}}");
	for (const cJSON *t = n ? tools->child : NULL; t; t = t->next)
		if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")
				->valuestring,
			    nm->valuestring)) {
			r->tool_choice = SFW_TOOLS_NAMED;
			r->tool_name = nm->valuestring;
			return SFW_OK;
		}
	return bad(e, "tool_choice", "'tool_choice' names '%.100s', which is not one of 'tools'", nm->valuestring);
}

/* logit_bias: {"token id": bias in [-100, 100]}. */
static enum sfw_status take_bias(struct sfw_serve_req *r, const cJSON *v, int vocab, struct sfw_serve_error *e)
{
	if (is_null(v))
		return SFW_OK;
	if (!cJSON_IsObject(v))
		return bad(e, "logit_bias", "'logit_bias' must be an object of token ids to numbers");
	int n = cJSON_GetArraySize(v);
	if (n > SFW_SERVE_BIAS_MAX)
		return bad(e, "logit_bias", "'logit_bias' has %d entries (at most %d)", n, SFW_SERVE_BIAS_MAX);
	if (n == 0)
		return SFW_OK;
	if (!(r->bias = sfw_calloc((size_t)n, sizeof(*r->bias))))
		return bad(e, "logit_bias", "out of memory for logit_bias");
	for (const cJSON *b = v->child; b; b = b->next) {
		const char *k = b->string;
		char *end = NULL;
		long id = strtol(k, &end, 10);
		if (!k[0] || *end || k[0] == '+' || k[0] == '-' || k[0] == ' ' || id < 0 || id >= vocab)
			return bad(e, "logit_bias", "logit_bias key '%.40s' is not a token id below %d", k, vocab);
		if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100))
			return bad(e, "logit_bias", "logit_bias[%ld] must be a number from -100 to 100", id);
		for (size_t j = 0; j < r->n_bias; j++)
			if (r->bias[j].id == (int32_t)id)
				return bad(e, "logit_bias", "logit_bias names token %ld twice", id);
		r->bias[r->n_bias++] = (struct sfw_sample_adj){(int32_t)id, 0, 0, (float)b->valuedouble};
	}
	return SFW_OK;
}

/* Fields that change nothing here, taken when of any JSON type. */
static const char *const ignored[] = {"user",	  "metadata",	"store",	 "service_tier",
				      "parallel_tool_calls", "prediction", "request_id",	 "cache_salt",
				      "spaces_between_special_tokens", "priority", NULL};

static int is_ignored(const char *k)
{
	for (int i = 0; ignored[i]; i++)
		if (!strcmp(k, ignored[i]))
			return 1;
	return 0;
}

static int in_list(const char *k, const char *const *l)
{
	for (int i = 0; l[i]; i++)
		if (!strcmp(k, l[i]))
			return 1;
	return 0;
}

/* Fields of features salafw does not have: accepted only at a value that
 * changes nothing. 1: fine, 0: refused, -1: not such a field. */
static int feature_off(const char *k, const cJSON *v)
{
	static const char *const off_false[] = {"echo", "continue_final_message", "include_stop_str_in_output",
						"use_beam_search", NULL};
	static const char *const off_null[] = {"suffix",	 "reasoning_effort", "audio",
					       "web_search_options", "chat_template",    "guided_json",
					       "guided_regex",	 "guided_choice",    "guided_grammar",
					       "structured_outputs", "prompt_logprobs",  "truncate_prompt_tokens",
					       "bad_words",	 "allowed_token_ids", "documents",
					       NULL};
	if (in_list(k, off_false))
		return is_null(v) || cJSON_IsFalse(v);
	if (in_list(k, off_null))
		return is_null(v) || (!strcmp(k, "suffix") && cJSON_IsString(v) && !v->valuestring[0]) ||
		       (cJSON_IsArray(v) && !v->child);
	if (!strcmp(k, "best_of"))
		return is_null(v) || (cJSON_IsNumber(v) && v->valuedouble == 1);
	if (!strcmp(k, "min_tokens"))
		return is_null(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
	if (!strcmp(k, "length_penalty"))
		return is_null(v) || (cJSON_IsNumber(v) && v->valuedouble == 1);
	if (!strcmp(k, "functions"))
		return is_null(v) || (cJSON_IsArray(v) && !v->child);
	if (!strcmp(k, "function_call"))
		return is_null(v) || (cJSON_IsString(v) && (!strcmp(v->valuestring, "none") ||
							    !strcmp(v->valuestring, "auto")));
	if (!strcmp(k, "modalities")) {
		if (is_null(v))
			return 1;
		if (!cJSON_IsArray(v))
			return 0;
		for (const cJSON *m = v->child; m; m = m->next)
			if (!cJSON_IsString(m) || strcmp(m->valuestring, "text"))
				return 0;
		return 1;
	}
	if (!strcmp(k, "response_format")) {
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
		return is_null(v) ||
		       (cJSON_IsObject(v) && cJSON_IsString(t) && !strcmp(t->valuestring, "text"));
	}
	return -1; /* not a feature field */
}

/* A number within [lo, hi] into *out, its SFW_SERVE_SET_ bit set. */
static enum sfw_status num_field(struct sfw_serve_req *r, const cJSON *f, double lo, double hi, int lo_open,
				 double *out, unsigned bit, struct sfw_serve_error *e)
{
	if (is_null(f))
		return SFW_OK;
	if (!cJSON_IsNumber(f) || !(f->valuedouble >= lo && f->valuedouble <= hi) ||
	    (lo_open && f->valuedouble == lo))
		return bad(e, f->string, "'%s' must be a number in %s%g, %g]", f->string, lo_open ? "(" : "[", lo,
			   hi);
	*out = f->valuedouble;
	r->set |= bit;
	return SFW_OK;
}

static enum sfw_status take_bool(const cJSON *f, int *out, struct sfw_serve_error *e)
{
	if (is_null(f))
		return SFW_OK;
	if (!cJSON_IsBool(f))
		return bad(e, f->string, "'%s' must be true or false", f->string);
	*out = cJSON_IsTrue(f);
	return SFW_OK;
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

/* The fields of a request body the parser keeps for after the loop. */
struct req_fields {
	const cJSON *prompt, *messages, *tools, *tool_choice, *bias;
	int have_model, logprobs_set;
};

/* One top-level field of a request body into r (or fl). */
static enum sfw_status take_field(struct sfw_serve_req *r, const cJSON *f, int chat, struct req_fields *fl,
				  struct sfw_serve_error *e)
{
	enum sfw_status s = SFW_OK;
	const char *k = f->string;
	int64_t iv = 0;
	int off = feature_off(k, f);
	if (off == 0)
		s = bad(e, k, "'%.100s' is not supported by this server at that value", k);
	else if (off == 1 || is_ignored(k))
		return SFW_OK;
	else if (!strcmp(k, "model")) {
		if (!cJSON_IsString(f))
			s = bad(e, "model", "'model' must be a string");
		r->model = f->valuestring;
		fl->have_model = 1;
	} else if (!strcmp(k, "prompt") && !chat)
		fl->prompt = f;
	else if (!strcmp(k, "messages") && chat)
		fl->messages = f;
	else if (!strcmp(k, "tools") && chat)
		fl->tools = f;
	else if (!strcmp(k, "tool_choice") && chat)
		fl->tool_choice = f;
	else if (!strcmp(k, "logit_bias"))
		fl->bias = f;
	else if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens")) {
		if (is_null(f))
			return SFW_OK;
		if (!get_int(f, 1, 1 << 30, &iv))
			s = bad(e, k, "'%s' must be an integer from 1 to %d", k, 1 << 30);
		r->max_tokens = iv;
	} else if (!strcmp(k, "temperature"))
		s = num_field(r, f, 0, 2, 0, &r->temperature, SFW_SERVE_SET_TEMPERATURE, e);
	else if (!strcmp(k, "top_p")) {
		/* checked as the float the sampler takes: 1e-300 is 0 there */
		s = num_field(r, f, 0, 1, 1, &r->top_p, SFW_SERVE_SET_TOP_P, e);
		if (s == SFW_OK && !is_null(f) && !((float)f->valuedouble > 0))
			s = bad(e, k, "'top_p' must be a number in (0, 1], at least 1.4e-45 (the smallest "
				      "float above 0)");
	}
	else if (!strcmp(k, "min_p"))
		s = num_field(r, f, 0, 1, 0, &r->min_p, SFW_SERVE_SET_MIN_P, e);
	else if (!strcmp(k, "repetition_penalty"))
		s = num_field(r, f, 0, 10, 1, &r->repetition_penalty, SFW_SERVE_SET_REPETITION, e);
	else if (!strcmp(k, "presence_penalty"))
		s = num_field(r, f, -2, 2, 0, &r->presence_penalty, 0, e);
	else if (!strcmp(k, "frequency_penalty"))
		s = num_field(r, f, -2, 2, 0, &r->frequency_penalty, 0, e);
	else if (!strcmp(k, "top_k")) {
		if (is_null(f))
			return SFW_OK;
		if (!get_int(f, -1, INT32_MAX, &iv))
			s = bad(e, k, "'top_k' must be an integer, -1 or 0 for off");
		r->top_k = iv < 0 ? 0 : (int)iv;
		r->set |= SFW_SERVE_SET_TOP_K;
	} else if (!strcmp(k, "seed")) {
		if (is_null(f))
			return SFW_OK;
		if (!get_int(f, -9007199254740991.0, 9007199254740991.0, &iv))
			s = bad(e, k, "'seed' must be an integer");
		r->seed = (uint64_t)iv;
		r->have_seed = 1;
	} else if (!strcmp(k, "n")) {
		if (!is_null(f) && !(get_int(f, 1, SFW_SERVE_N_MAX, &iv)))
			s = bad(e, k, "'n' must be an integer from 1 to %d", SFW_SERVE_N_MAX);
		r->n = is_null(f) ? 1 : (int)iv;
	} else if (!strcmp(k, "logprobs")) {
		if (is_null(f))
			return SFW_OK;
		if (chat) { /* true or false; top_logprobs says how many */
			s = take_bool(f, &r->logprobs, e);
		} else if (cJSON_IsFalse(f)) {
		} else if (!get_int(f, 0, SFW_SAMPLE_TOP_MAX, &iv)) {
			s = bad(e, k, "'logprobs' must be an integer from 0 to %d", SFW_SAMPLE_TOP_MAX);
		} else { /* completions: the number of top tokens */
			r->logprobs = 1;
			r->top_logprobs = (int)iv;
		}
	} else if (!strcmp(k, "top_logprobs") && chat) {
		if (is_null(f))
			return SFW_OK;
		if (!get_int(f, 0, SFW_SAMPLE_TOP_MAX, &iv))
			s = bad(e, k, "'top_logprobs' must be an integer from 0 to %d", SFW_SAMPLE_TOP_MAX);
		r->top_logprobs = (int)iv;
		fl->logprobs_set = 1;
	} else if (!strcmp(k, "stop")) {
		s = take_stop(r, f, e);
	} else if (!strcmp(k, "stream")) {
		s = take_bool(f, &r->stream, e);
	} else if (!strcmp(k, "ignore_eos")) {
		s = take_bool(f, &r->ignore_eos, e);
	} else if (!strcmp(k, "return_tokens_as_token_ids")) {
		s = take_bool(f, &r->token_ids, e);
	} else if (!strcmp(k, "skip_special_tokens")) {
		s = take_bool(f, &r->skip_special, e);
	} else if (!strcmp(k, "add_generation_prompt") && chat) {
		s = take_bool(f, &r->add_generation_prompt, e);
	} else if (!strcmp(k, "chat_template_kwargs") && chat) {
		if (!is_null(f) && !cJSON_IsObject(f))
			s = bad(e, k, "'chat_template_kwargs' must be an object");
		r->template_kwargs = cJSON_IsObject(f) ? f : NULL;
	} else if (!strcmp(k, "stream_options")) {
		if (is_null(f))
			return SFW_OK;
		const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
		if (!cJSON_IsObject(f) || (u && !cJSON_IsBool(u)))
			s = bad(e, k, "'stream_options' must be an object; include_usage true or false");
		r->include_usage = cJSON_IsTrue(u);
	} else
		note_unknown(r, k);
	return s;
}

enum sfw_status sfw_serve_req_parse(const char *body, size_t len, enum sfw_serve_kind kind,
				    const char *const *names, size_t n_names, int vocab, struct sfw_serve_req *r,
				    struct sfw_serve_error *e)
{
	memset(r, 0, sizeof(*r));
	memset(e, 0, sizeof(*e));
	r->kind = kind;
	r->temperature = 1;
	r->top_p = 1;
	r->repetition_penalty = 1;
	r->n = 1;
	r->skip_special = 1;
	r->add_generation_prompt = 1;
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
	struct req_fields fl = {0};
	int chat = kind == SFW_SERVE_CHAT;
	enum sfw_status s = SFW_OK;
	for (const cJSON *f = r->root->child; f && s == SFW_OK; f = f->next)
		s = take_field(r, f, chat, &fl, e);
	if (s != SFW_OK)
		return s;
	if (!fl.have_model && names)
		return bad(e, "model", "'model' is required");
	size_t mi = 0;
	while (fl.have_model && names && mi < n_names && strcmp(r->model, names[mi]))
		mi++;
	if (fl.have_model && names && mi == n_names) {
		bad(e, "model", "the model '%.200s' does not exist (this server has '%.200s')", r->model,
		    n_names ? names[0] : "");
		e->http = 404;
		e->code = "model_not_found";
		return SFW_E_INVAL;
	}
	if (fl.logprobs_set && r->top_logprobs > 0 && !r->logprobs)
		return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
	if (r->stream == 0 && r->include_usage)
		return bad(e, "stream_options", "'stream_options' needs 'stream': true");
	if ((s = take_bias(r, fl.bias, vocab, e)) != SFW_OK)
		return s;
	if (chat && (s = take_tools(r, fl.tools, fl.tool_choice, e)) != SFW_OK)
		return s;
	return kind == SFW_SERVE_COMPLETION ? take_prompt(r, fl.prompt, vocab, e)
					    : take_messages(r, fl.messages, e);
}

void sfw_serve_req_release(struct sfw_serve_req *r)
{
	cJSON_Delete(r->root);
	sfw_free(r->bias);
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
