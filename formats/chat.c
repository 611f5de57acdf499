/* chat.c - chat templates (loading, rendering through formats/jinja.c),
 * generation_config.json sampling defaults, and the fixed ChatML prompt of
 * formats/tokenizer.h (sfw_chat_format, for callers that take no template). */
#include "formats/chat.h"
#include "alloc.h"
#include "file.h"
#include "formats/jinja.h"
#include "formats/tokenizer.h"
#include "json.h"
#include "log.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define TOKCFG_MAX (16u << 20) /* tokenizer_config.json (it may carry a long template) */
#define GENCFG_MAX (1u << 20)

struct sfw_chat_template {
	struct sfwi_jinja *j;
	char *text;
	size_t len;
	char *origin;
	char bos[SFW_CHAT_TOKEN_MAX + 1];
	char eos[SFW_CHAT_TOKEN_MAX + 1];
};

void sfw_chat_template_free(struct sfw_chat_template *t)
{
	if (!t)
		return;
	sfwi_jinja_free(t->j);
	sfw_free(t->text);
	sfw_free(t->origin);
	sfw_free(t);
}

static enum sfw_status set_token(char *dst, const char *src, const char *dflt, const char *what, const char *name,
				 struct sfw_err *err)
{
	if (!src)
		src = dflt;
	size_t n = strlen(src);
	if (n > SFW_CHAT_TOKEN_MAX || !sfw_utf8_valid((const unsigned char *)src, n))
		return sfw_fail(err, SFW_E_FORMAT, "%s: %s must be at most %d bytes of UTF-8", what, name,
				SFW_CHAT_TOKEN_MAX);
	memcpy(dst, src, n + 1);
	return SFW_OK;
}

enum sfw_status sfw_chat_template_new(const char *text, size_t len, const char *what, const char *bos,
				      const char *eos, struct sfw_chat_template **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_chat_template *t = sfw_calloc(1, sizeof(*t));
	if (!t || !(t->text = sfw_strndup(text, len)) || !(t->origin = sfw_strdup(what))) {
		sfw_chat_template_free(t);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	t->len = len;
	enum sfw_status st;
	if ((st = set_token(t->bos, bos, "<s>", what, "bos_token", err)) != SFW_OK ||
	    (st = set_token(t->eos, eos, "<|im_end|>", what, "eos_token", err)) != SFW_OK ||
	    (st = sfwi_jinja_compile(text, len, what, &t->j, err)) != SFW_OK) {
		sfw_chat_template_free(t);
		return st;
	}
	*out = t;
	return SFW_OK;
}

/* A special token of tokenizer_config.json: a string, {"content": string},
 * null or absent (then *out = NULL). */
static enum sfw_status token_field(const cJSON *root, const char *key, const char *what, const char **out,
				   struct sfw_err *err)
{
	*out = NULL;
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
	if (!e || cJSON_IsNull(e))
		return SFW_OK;
	if (cJSON_IsObject(e))
		e = cJSON_GetObjectItemCaseSensitive(e, "content");
	if (!cJSON_IsString(e))
		return sfw_fail(err, SFW_E_FORMAT, "%s: field '%s' must be a string or {\"content\": string}", what, key);
	*out = e->valuestring;
	return SFW_OK;
}

enum sfw_status sfw_chat_template_load(const char *model_dir, struct sfw_chat_template **out, struct sfw_err *err)
{
	*out = NULL;
	char path[4200], jpath[4200], what[4300];
	char ed[1024];
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir);
	snprintf(jpath, sizeof(jpath), "%s/chat_template.jinja", model_dir);
	struct sfw_buf cfg, jt;
	sfw_buf_init(&cfg, TOKCFG_MAX);
	sfw_buf_init(&jt, SFW_CHAT_TEMPLATE_MAX);
	cJSON *root = NULL;
	enum sfw_status st = SFW_OK;
	const char *bos = NULL, *eos = NULL, *text = NULL, *origin = "built-in";
	size_t tlen = 0;
	struct stat sb;
	if (stat(path, &sb) == 0) {
		snprintf(what, sizeof(what), "'%s'", sfw_esc(path, ed, sizeof(ed)));
		if ((st = sfw_read_file(path, TOKCFG_MAX, &cfg, err)) != SFW_OK ||
		    (st = sfw_json_parse(cfg.data ? cfg.data : "", cfg.len, what, &root, err)) != SFW_OK)
			goto out;
		if (!cJSON_IsObject(root)) {
			st = sfw_fail(err, SFW_E_FORMAT, "%s: not a JSON object", what);
			goto out;
		}
		if ((st = token_field(root, "bos_token", what, &bos, err)) != SFW_OK ||
		    (st = token_field(root, "eos_token", what, &eos, err)) != SFW_OK)
			goto out;
		const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
		if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
			const cJSON *pick = NULL;
			for (const cJSON *e = ct->child; e; e = e->next) {
				const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
				if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))
					pick = e;
			}
			ct = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
			if (!ct) {
				st = sfw_fail(err, SFW_E_FORMAT, "%s: chat_template list has no \"default\" template",
					      what);
				goto out;
			}
		}
		if (ct && !cJSON_IsNull(ct)) {
			if (!cJSON_IsString(ct)) {
				st = sfw_fail(err, SFW_E_FORMAT, "%s: field 'chat_template' must be a string", what);
				goto out;
			}
			text = ct->valuestring;
			tlen = strlen(text);
			origin = what;
		}
	}
	if (stat(jpath, &sb) == 0) { /* transformers' newer layout: the file wins */
		if ((st = sfw_read_file(jpath, SFW_CHAT_TEMPLATE_MAX, &jt, err)) != SFW_OK)
			goto out;
		snprintf(what, sizeof(what), "'%s'", sfw_esc(jpath, ed, sizeof(ed)));
		text = jt.data ? jt.data : "";
		tlen = jt.len;
		origin = what;
	}
	if (!text) {
		text = sfw_chat_builtin_template();
		tlen = strlen(text);
	}
	st = sfw_chat_template_new(text, tlen, origin, bos, eos, out, err);
out:
	cJSON_Delete(root);
	sfw_buf_release(&cfg);
	sfw_buf_release(&jt);
	return st;
}

const char *sfw_chat_template_text(const struct sfw_chat_template *t, size_t *len)
{
	if (len)
		*len = t->len;
	return t->text;
}
const char *sfw_chat_template_origin(const struct sfw_chat_template *t) { return t->origin; }
const char *sfw_chat_template_bos(const struct sfw_chat_template *t) { return t->bos; }
const char *sfw_chat_template_eos(const struct sfw_chat_template *t) { return t->eos; }

enum sfw_status sfw_chat_render(const struct sfw_chat_template *t, const cJSON *messages, const cJSON *tools,
				const cJSON *kwargs, int add_generation_prompt, struct sfw_buf *out,
				struct sfw_err *err)
{
	if (!cJSON_IsArray(messages))
		return sfw_fail(err, SFW_E_INVAL, "chat: messages must be a JSON array");
	if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
		return sfw_fail(err, SFW_E_INVAL, "chat: tools must be a JSON array");
	if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs))
		return sfw_fail(err, SFW_E_INVAL, "chat: chat_template_kwargs must be a JSON object");
	/* The variables, by reference: nothing of the input is copied. kwargs
	 * come first so the fixed names below replace any of the same name. */
	cJSON *vars = cJSON_CreateObject();
	int ok = vars != NULL;
	if (ok && kwargs && cJSON_IsObject(kwargs))
		for (const cJSON *e = kwargs->child; ok && e; e = e->next) {
			if (!e->string || !strcmp(e->string, "messages") || !strcmp(e->string, "tools") ||
			    !strcmp(e->string, "add_generation_prompt") || cJSON_GetObjectItemCaseSensitive(vars, e->string))
				continue;
			ok = cJSON_AddItemReferenceToObject(vars, e->string, (cJSON *)e);
		}
	ok = ok && cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages);
	/* as apply_chat_template: tools and documents are always defined (None) */
	if (ok && tools && cJSON_IsArray(tools))
		ok = cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools);
	else if (ok)
		ok = cJSON_AddNullToObject(vars, "tools") != NULL;
	if (ok && !cJSON_GetObjectItemCaseSensitive(vars, "documents"))
		ok = cJSON_AddNullToObject(vars, "documents") != NULL;
	ok = ok && cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt != 0);
	if (ok && !cJSON_GetObjectItemCaseSensitive(vars, "bos_token"))
		ok = cJSON_AddStringToObject(vars, "bos_token", t->bos) != NULL;
	if (ok && !cJSON_GetObjectItemCaseSensitive(vars, "eos_token"))
		ok = cJSON_AddStringToObject(vars, "eos_token", t->eos) != NULL;
	enum sfw_status st = ok ? sfwi_jinja_render(t->j, vars, out, err) : sfw_fail(err, SFW_E_NOMEM, "out of memory");
	cJSON_Delete(vars); /* references: deletes only the wrappers */
	return st;
}

int sfw_chat_needs_bos(const struct sfw_chat_template *t, const char *text, size_t len)
{
	size_t n = strlen(t->bos);
	return !(n && len >= n && !memcmp(text, t->bos, n));
}

/* ---- generation_config.json -------------------------------------------------- */

void sfw_gen_defaults_init(struct sfw_gen_defaults *d)
{
	d->temperature = SFW_GEN_DEFAULT_TEMPERATURE;
	d->top_p = SFW_GEN_DEFAULT_TOP_P;
	d->top_k = SFW_GEN_DEFAULT_TOP_K;
	d->min_p = SFW_GEN_DEFAULT_MIN_P;
	d->repetition_penalty = SFW_GEN_DEFAULT_REPETITION_PENALTY;
	d->set = 0;
}

static enum sfw_status num_field(const cJSON *root, const char *key, const char *what, double lo, double hi,
				 int lo_open, double *out, int *found, struct sfw_err *err)
{
	*found = 0;
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
	if (!e || cJSON_IsNull(e))
		return SFW_OK;
	if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
		return sfw_fail(err, SFW_E_FORMAT, "%s: field '%s' must be a number", what, key);
	double v = e->valuedouble;
	if (v < lo || v > hi || (lo_open && v == lo))
		return sfw_fail(err, SFW_E_RANGE, "%s: field '%s' is %g, outside %s%g, %g]", what, key, v,
				lo_open ? "(" : "[", lo, hi);
	*out = v;
	*found = 1;
	return SFW_OK;
}

enum sfw_status sfw_gen_defaults_parse(const char *bytes, size_t len, const char *what, struct sfw_gen_defaults *d,
				       struct sfw_err *err)
{
	sfw_gen_defaults_init(d);
	cJSON *root = NULL;
	enum sfw_status st = sfw_json_parse_object(bytes, len, GENCFG_MAX, what, &root, err);
	if (st != SFW_OK)
		return st;
	double v;
	int f;
	struct sfw_gen_defaults g;
	sfw_gen_defaults_init(&g);
	if ((st = num_field(root, "temperature", what, 0, 1e6, 0, &v, &f, err)) != SFW_OK)
		goto out;
	if (f)
		g.temperature = v, g.set |= SFW_GEN_SET_TEMPERATURE;
	if ((st = num_field(root, "top_p", what, 0, 1, 1, &v, &f, err)) != SFW_OK)
		goto out;
	if (f)
		g.top_p = v, g.set |= SFW_GEN_SET_TOP_P;
	if ((st = num_field(root, "top_k", what, -1, 1 << 30, 0, &v, &f, err)) != SFW_OK)
		goto out;
	if (f) {
		if (v != floor(v)) {
			st = sfw_fail(err, SFW_E_FORMAT, "%s: field 'top_k' must be an integer", what);
			goto out;
		}
		g.top_k = v < 0 ? 0 : (int)v; /* -1 (vLLM) and 0 (HF) both mean off */
		g.set |= SFW_GEN_SET_TOP_K;
	}
	if ((st = num_field(root, "min_p", what, 0, 1, 0, &v, &f, err)) != SFW_OK)
		goto out;
	if (f)
		g.min_p = v, g.set |= SFW_GEN_SET_MIN_P;
	if ((st = num_field(root, "repetition_penalty", what, 0, 1e6, 1, &v, &f, err)) != SFW_OK)
		goto out;
	if (f)
		g.repetition_penalty = v, g.set |= SFW_GEN_SET_REPETITION_PENALTY;
	const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
	if (ds && !cJSON_IsNull(ds)) {
		if (!cJSON_IsBool(ds)) {
			st = sfw_fail(err, SFW_E_FORMAT, "%s: field 'do_sample' must be true or false", what);
			goto out;
		}
		g.set |= SFW_GEN_SET_DO_SAMPLE;
		if (cJSON_IsFalse(ds)) { /* HF: greedy whatever the temperature */
			g.temperature = 0;
			g.set |= SFW_GEN_SET_TEMPERATURE;
		}
	}
	*d = g;
out:
	cJSON_Delete(root);
	return st;
}

enum sfw_status sfw_gen_defaults_load(const char *model_dir, struct sfw_gen_defaults *d, struct sfw_err *err)
{
	sfw_gen_defaults_init(d);
	char path[4200], what[4300], ed[1024];
	snprintf(path, sizeof(path), "%s/generation_config.json", model_dir);
	struct stat sb;
	if (stat(path, &sb) != 0) {
		if (errno == ENOENT)
			return SFW_OK;
		return sfw_fail(err, SFW_E_IO, "cannot stat '%s': %s", sfw_esc(path, ed, sizeof(ed)), strerror(errno));
	}
	struct sfw_buf b;
	sfw_buf_init(&b, GENCFG_MAX + 1);
	enum sfw_status st = sfw_read_file(path, GENCFG_MAX, &b, err);
	if (st == SFW_OK) {
		snprintf(what, sizeof(what), "'%s'", sfw_esc(path, ed, sizeof(ed)));
		st = sfw_gen_defaults_parse(b.data ? b.data : "", b.len, what, d, err);
	}
	sfw_buf_release(&b);
	return st;
}

/* ---- the fixed ChatML prompt (formats/tokenizer.h) ------------------------------ */

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

/* ---- OpenAI-style messages -> the template's ---------------------------------- */

/* The text of a content value: a string, null, or a list of parts of which
 * only {"type": "text", "text": ...} are taken (joined by "\n", as vLLM
 * joins them for templates that want a string). */
static enum sfw_status content_text(cJSON *m, size_t i, struct sfw_err *err)
{
	cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
	if (!c || cJSON_IsNull(c) || cJSON_IsString(c))
		return SFW_OK;
	if (!cJSON_IsArray(c))
		return sfw_fail(err, SFW_E_INVAL, "messages[%zu].content must be a string, null or a list of parts", i);
	struct sfw_buf b;
	sfw_buf_init(&b, SFW_CHAT_CONTENT_MAX);
	size_t k = 0;
	enum sfw_status st = SFW_OK;
	for (const cJSON *p = c->child; p && st == SFW_OK; p = p->next, k++) {
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
		const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
		if (cJSON_IsString(p)) /* a bare string part */
			tx = p;
		else if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
			st = sfw_fail(err, SFW_E_UNSUPPORTED,
				      "messages[%zu].content[%zu]: only text parts are supported (type \"text\" with a string \"text\")",
				      i, k);
			break;
		}
		if ((k && (st = sfw_buf_append(&b, "\n", 1)) != SFW_OK) ||
		    (st = sfw_buf_append(&b, tx->valuestring, strlen(tx->valuestring))) != SFW_OK)
			st = sfw_fail(err, st, "messages[%zu].content is longer than %u MiB", i, SFW_CHAT_CONTENT_MAX >> 20);
	}
	if (st == SFW_OK) {
		cJSON *s = cJSON_CreateString(b.data ? b.data : "");
		if (!s || !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", s)) {
			cJSON_Delete(s);
			st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		}
	}
	sfw_buf_release(&b);
	return st;
}

enum sfw_status sfw_chat_messages_normalize(const cJSON *in, cJSON **out, struct sfw_err *err)
{
	*out = NULL;
	if (!cJSON_IsArray(in))
		return sfw_fail(err, SFW_E_INVAL, "messages must be a list");
	cJSON *o = cJSON_Duplicate(in, 1);
	if (!o)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	enum sfw_status st = SFW_OK;
	size_t i = 0;
	for (cJSON *m = o->child; m && st == SFW_OK; m = m->next, i++) {
		if (!cJSON_IsObject(m)) {
			st = sfw_fail(err, SFW_E_INVAL, "messages[%zu] must be an object", i);
			break;
		}
		cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
		if (!cJSON_IsString(role)) {
			st = sfw_fail(err, SFW_E_INVAL, "messages[%zu].role must be a string", i);
			break;
		}
		static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
		int known = 0;
		for (int r = 0; roles[r]; r++)
			known |= !strcmp(role->valuestring, roles[r]);
		if (!known) {
			st = sfw_fail(err, SFW_E_INVAL, "messages[%zu].role must be system, developer, user, assistant or tool",
				      i);
			break;
		}
		if (!strcmp(role->valuestring, "developer") && !cJSON_SetValuestring(role, "system")) {
			st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			break;
		}
		if ((st = content_text(m, i, err)) != SFW_OK)
			break;
		cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
		if (!tc || cJSON_IsNull(tc))
			continue;
		if (!cJSON_IsArray(tc)) {
			st = sfw_fail(err, SFW_E_INVAL, "messages[%zu].tool_calls must be a list", i);
			break;
		}
		size_t k = 0;
		for (cJSON *c = tc->child; c && st == SFW_OK; c = c->next, k++) {
			cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
			cJSON *nm = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
			if (!cJSON_IsObject(fn) || !cJSON_IsString(nm)) {
				st = sfw_fail(err, SFW_E_INVAL, "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
				break;
			}
			/* arguments as a JSON text become the object (vLLM does the same
			 * before rendering), so templates see a mapping */
			cJSON *ar = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
			if (!cJSON_IsString(ar))
				continue;
			cJSON *parsed = NULL;
			size_t al = strlen(ar->valuestring);
			if (sfw_json_parse(ar->valuestring, al, "arguments", &parsed, NULL) != SFW_OK || !cJSON_IsObject(parsed)) {
				cJSON_Delete(parsed);
				st = sfw_fail(err, SFW_E_INVAL,
					      "messages[%zu].tool_calls[%zu].function.arguments is not a JSON object", i, k);
				break;
			}
			if (!cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed)) {
				cJSON_Delete(parsed);
				st = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			}
		}
	}
	if (st != SFW_OK) {
		cJSON_Delete(o);
		return st;
	}
	*out = o;
	return SFW_OK;
}
