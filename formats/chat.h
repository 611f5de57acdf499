/* chat.h - the chat format of a model: its chat template (a bounded subset
 * of Jinja2, formats/jinja.c), the tool calls its replies carry
 * (formats/toolcall.c) and the sampling defaults of its
 * generation_config.json (formats/chat.c). Everything about how messages
 * become a prompt and how a reply becomes content and tool calls lives here.
 *
 * The template. sfw_chat_template_load takes, in order: DIR/chat_template.jinja,
 * tokenizer_config.json's "chat_template" (a string, or a list of
 * {"name", "template"} from which "default" is taken), else the built-in
 * template (sfw_chat_builtin_template(): the Qwen3 chat template, the family
 * MiniCPM4.1/MiniCPM-SALA's description matches; README "Chat templates" says
 * what is confirmed of it). bos_token and eos_token come from
 * tokenizer_config.json (strings or {"content": ...}), else "<s>" and
 * "<|im_end|>". A template is compiled once; the compiled form is immutable,
 * so any number of threads may render with it at once.
 *
 * Rendering is Jinja2 semantics as HF transformers' apply_chat_template runs
 * it (trim_blocks and lstrip_blocks on, keep_trailing_newline off, tojson with
 * ensure_ascii off and ", "/": " separators, raise_exception): the variables
 * are messages, tools (None when NULL), documents (None), add_generation_prompt,
 * bos_token, eos_token, and every member of kwargs (chat_template_kwargs,
 * e.g. enable_thinking; a kwarg may set bos_token/eos_token/documents, not
 * messages/tools/add_generation_prompt). The supported subset: {{ }}, {% if/elif/else %}, {% for %}
 * (with else, loop.index/index0/first/last/length/revindex, tuple unpacking,
 * an if filter), {% set %} (also ns.attr and block set), {% macro %} with
 * {% call %}/caller(), namespace(), {# #}, whitespace control -/+, the
 * operators of expressions (or and not in is, comparisons, + - * / // % ~,
 * x if c else y, subscripts, slices, attributes, literals, lists, dicts),
 * the filters tojson (HF's: ensure_ascii, indent, separators, sort_keys),
 * length count string trim upper lower title capitalize default/d join first
 * last list reverse items dictsort int float abs round replace unique sum max
 * min select reject selectattr rejectattr map indent wordcount safe e/escape;
 * string methods strip lstrip rstrip split rsplit startswith endswith upper
 * lower title capitalize replace find index count join splitlines is*; dict
 * methods items keys values get; list index/count; globals range namespace
 * dict raise_exception; the {% generation %} block and break/continue (HF
 * enables both); tests defined undefined none string number integer float
 * boolean true false mapping sequence iterable callable odd even divisibleby
 * in eq/equalto ne lt le gt ge sameas lower upper. Python semantics are kept
 * where a chat template can see them (str() and repr() of values, float
 * repr, code-point lengths and slices, Unicode whitespace in strip/split,
 * banker's rounding); upper/lower/title change ASCII letters only. JSON
 * numbers that are integral read as ints (cJSON keeps no int/float mark).
 * Anything else (raw, include, extends, filter blocks, strftime_now, ...) is
 * SFW_E_UNSUPPORTED or SFW_E_FORMAT
 * at compile or render time, with the template line.
 *
 * Bounds: a template of at most SFW_CHAT_TEMPLATE_MAX bytes; render output at
 * most out->max bytes; SFW_JINJA_DEPTH_MAX nested calls/expressions;
 * SFW_JINJA_STEPS_MAX loop iterations and calls per render; 256 MiB of
 * working memory per render plus 4 times out->max. A template error is a status with a message
 * naming the template line, never a crash: raise_exception is SFW_E_INVAL
 * with its message, a bound SFW_E_RANGE, the rest SFW_E_FORMAT or
 * SFW_E_UNSUPPORTED. */
#ifndef SFW_CHAT_H
#define SFW_CHAT_H

#include "buf.h"
#include "sfw.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SFW_CHAT_TEMPLATE_MAX (1u << 20) /* template source bytes */
#define SFW_CHAT_TOKEN_MAX 256           /* bos/eos token text bytes */
#define SFW_JINJA_DEPTH_MAX 200          /* nesting of calls, expressions, blocks */
#define SFW_JINJA_STEPS_MAX 10000000L    /* loop iterations + macro calls per render */

/* ---- templates ---------------------------------------------------------- */

struct sfw_chat_template;

/* From a model directory as described above. */
SFW_MUST_CHECK enum sfw_status sfw_chat_template_load(const char *model_dir, struct sfw_chat_template **out,
						      struct sfw_err *err);
/* From template text (len bytes, UTF-8, no NUL). bos/eos may be NULL ("<s>",
 * "<|im_end|>"). what names the text in messages ("'x/chat_template.jinja'"). */
SFW_MUST_CHECK enum sfw_status sfw_chat_template_new(const char *text, size_t len, const char *what,
						     const char *bos, const char *eos,
						     struct sfw_chat_template **out, struct sfw_err *err);
void sfw_chat_template_free(struct sfw_chat_template *t); /* NULL is a no-op */

/* Borrowed, valid until sfw_chat_template_free. */
const char *sfw_chat_template_text(const struct sfw_chat_template *t, size_t *len);
const char *sfw_chat_template_origin(const struct sfw_chat_template *t); /* file name or "built-in" */
const char *sfw_chat_template_bos(const struct sfw_chat_template *t);
const char *sfw_chat_template_eos(const struct sfw_chat_template *t);

/* The built-in template text (NUL-terminated). */
const char *sfw_chat_builtin_template(void);

/* Renders the prompt. messages: a JSON array of message objects (role,
 * content, tool_calls, ... as the template reads them; not validated here
 * beyond being an array). tools: an array or NULL (then `tools` is None, as
 * transformers passes it). kwargs: an object or NULL. Appends to out; on an
 * error out is as it was. */
SFW_MUST_CHECK enum sfw_status sfw_chat_render(const struct sfw_chat_template *t, const cJSON *messages,
					       const cJSON *tools, const cJSON *kwargs, int add_generation_prompt,
					       struct sfw_buf *out, struct sfw_err *err);

/* 1 when text does not already begin with the template's bos_token text, so
 * the encoder should prepend BOS (sfw_tokenizer_encode's add_bos); 0 when the
 * template wrote it (as MiniCPM-SALA's does). */
int sfw_chat_needs_bos(const struct sfw_chat_template *t, const char *text, size_t len);

/* The special-token texts a reply shows only with --special /
 * skip_special_tokens false is the tokenizer's business (sfw_tokdec's
 * skip_special); the chat format's own markers are these: */
#define SFW_CHAT_TOOL_OPEN "<tool_call>"
#define SFW_CHAT_TOOL_CLOSE "</tool_call>"
#define SFW_CHAT_THINK_OPEN "<think>"
#define SFW_CHAT_THINK_CLOSE "</think>"

/* OpenAI chat-completions messages as templates read them (what vLLM does
 * before rendering): role "developer" becomes "system"; content may be a
 * string, null, or a list of text parts ({"type": "text", "text": ...},
 * joined by "\n"; other part types are SFW_E_UNSUPPORTED); an assistant's
 * tool_calls[].function.arguments given as JSON text becomes the object
 * (SFW_E_INVAL when it is not one). Other members are kept as they are. *out
 * is a new array (cJSON_Delete it); in is not changed. Errors name the
 * message ("messages[2].content[0]: ..."). */
#define SFW_CHAT_CONTENT_MAX (64u << 20) /* bytes of one message's joined text */
SFW_MUST_CHECK enum sfw_status sfw_chat_messages_normalize(const cJSON *in, cJSON **out, struct sfw_err *err);

/* ---- tool calls in a reply (formats/toolcall.c) ------------------------- *
 * The template asks for each call as
 *     <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>
 * The parser is fed the reply text in chunks as it streams and reports, in
 * order, content (text outside calls) and complete calls. Text that might be
 * the start of "<tool_call>" is held back until it is known not to be. A call
 * whose body is not a JSON object with a string "name" (and "arguments" an
 * object, or a string holding JSON, or absent = {}) is given back as content,
 * verbatim, tags included. At finish an unclosed call is parsed as if closed
 * (the model stopped at end-of-sequence), else it is content. Bounds: a call
 * body of at most SFW_TOOLCALL_BODY_MAX bytes (a longer one becomes content),
 * at most SFW_TOOLCALL_MAX calls per reply (later ones stay content). */
#define SFW_TOOLCALL_BODY_MAX (1u << 20)
#define SFW_TOOLCALL_MAX 64

struct sfw_toolcall {
	int index;             /* 0, 1, ... in the reply */
	const char *name;      /* NUL-terminated, valid during the callback */
	const char *arguments; /* compact JSON object text, NUL-terminated */
};

/* Callbacks; return nonzero to stop (the feed then returns SFW_E_ABORTED). */
struct sfw_toolparse_cb {
	int (*content)(void *user, const char *text, size_t len);
	int (*call)(void *user, const struct sfw_toolcall *call);
	void *user;
};

struct sfw_toolparse;
SFW_MUST_CHECK enum sfw_status sfw_toolparse_new(struct sfw_toolparse **out, struct sfw_err *err);
void sfw_toolparse_free(struct sfw_toolparse *p); /* NULL is a no-op */
SFW_MUST_CHECK enum sfw_status sfw_toolparse_feed(struct sfw_toolparse *p, const char *text, size_t len,
						  const struct sfw_toolparse_cb *cb, struct sfw_err *err);
/* End of the reply: flushes held-back text and an unclosed call. */
SFW_MUST_CHECK enum sfw_status sfw_toolparse_finish(struct sfw_toolparse *p, const struct sfw_toolparse_cb *cb,
						    struct sfw_err *err);
/* Calls reported so far. */
int sfw_toolparse_count(const struct sfw_toolparse *p);

/* ---- sampling defaults (generation_config.json) ------------------------- *
 * One set of defaults for run and serve: what generation_config.json sets,
 * else the fallbacks below (vLLM's: temperature 1, top_p 1, top_k off, min_p
 * off, repetition_penalty 1). A missing file is all fallbacks; a file that
 * is not strict JSON or sets a value of the wrong type or range is an error
 * naming the field. Read: temperature (>= 0), top_p (0, 1], top_k (integer
 * >= 0, -1 = off), min_p [0, 1], repetition_penalty (> 0). do_sample: false
 * means greedy (temperature 0). At most 1 MiB. */
#define SFW_GEN_DEFAULT_TEMPERATURE 1.0
#define SFW_GEN_DEFAULT_TOP_P 1.0
#define SFW_GEN_DEFAULT_TOP_K 0
#define SFW_GEN_DEFAULT_MIN_P 0.0
#define SFW_GEN_DEFAULT_REPETITION_PENALTY 1.0

enum {
	SFW_GEN_SET_TEMPERATURE = 1 << 0,
	SFW_GEN_SET_TOP_P = 1 << 1,
	SFW_GEN_SET_TOP_K = 1 << 2,
	SFW_GEN_SET_MIN_P = 1 << 3,
	SFW_GEN_SET_REPETITION_PENALTY = 1 << 4,
	SFW_GEN_SET_DO_SAMPLE = 1 << 5
};

struct sfw_gen_defaults {
	double temperature;
	double top_p;
	int top_k; /* 0 = off */
	double min_p;
	double repetition_penalty;
	unsigned set; /* SFW_GEN_SET_* bits: which came from the file */
};

void sfw_gen_defaults_init(struct sfw_gen_defaults *d); /* the fallbacks */
/* DIR/generation_config.json. */
SFW_MUST_CHECK enum sfw_status sfw_gen_defaults_load(const char *model_dir, struct sfw_gen_defaults *d,
						     struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_gen_defaults_parse(const char *bytes, size_t len, const char *what,
						      struct sfw_gen_defaults *d, struct sfw_err *err);

#ifdef __cplusplus
}
#endif

#endif
