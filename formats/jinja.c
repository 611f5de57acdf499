/* jinja.c - a bounded subset of Jinja2 for chat templates, rendered the way
 * HF transformers' apply_chat_template renders them (trim_blocks,
 * lstrip_blocks, no trailing newline kept, its tojson, raise_exception, loop
 * controls, the {% generation %} block). The architecture is Jinja's own: a
 * lexer that turns template text into text/tag/expression tokens (with the
 * whitespace rules applied to the text), a recursive-descent parser to an
 * AST, and a tree-walking evaluator over values that borrow the input JSON.
 *
 * Memory: the compiled tree lives in the template's arena; each render has
 * an arena of its own (values, strings, scopes), capped, freed at the end.
 * Errors (syntax, a bad operation, raise_exception, a bound) longjmp back to
 * compile/render, which turn them into a status: nothing else is held across
 * a jump, so nothing leaks. Values are immutable except namespace() objects,
 * as in Jinja's ImmutableSandboxedEnvironment that HF uses. */
#include "formats/jinja.h"
#include "alloc.h"
#include "formats/chat.h"
#include "json.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_CHUNK (64u << 10)
#define RENDER_MEM_MAX ((size_t)256 << 20)
#define COMPILE_MEM_MAX ((size_t)64 << 20)

/* ---- arena and errors ----------------------------------------------------- */

struct chunk {
	struct chunk *next;
	size_t used, size;
	max_align_t data[];
};

struct arena {
	struct chunk *head;
	size_t total, cap;
};

struct ctx {
	jmp_buf jb;
	struct sfw_err *err;
	enum sfw_status st;
	struct arena *ar;
	const char *what;
	int line;
};

static void arena_free(struct arena *a)
{
	struct chunk *c = a->head;
	while (c) {
		struct chunk *n = c->next;
		sfw_free(c);
		c = n;
	}
	a->head = NULL;
	a->total = 0;
}

static void fail(struct ctx *c, enum sfw_status st, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
static void fail(struct ctx *c, enum sfw_status st, const char *fmt, ...)
{
	char msg[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (c->line > 0)
		sfw_fail(c->err, st, "%s line %d: %s", c->what, c->line, msg);
	else
		sfw_fail(c->err, st, "%s: %s", c->what, msg);
	c->st = st;
	longjmp(c->jb, 1);
}

static void *alloc(struct ctx *c, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct arena *a = c->ar;
	if (!a->head || a->head->size - a->head->used < n) {
		size_t sz = n > ARENA_CHUNK ? n : ARENA_CHUNK;
		if (n > a->cap || a->total > a->cap - sz)
			fail(c, SFW_E_RANGE, "the template needs more than %zu MiB of memory", a->cap >> 20);
		struct chunk *ch = sfw_malloc(sizeof(*ch) + sz);
		if (!ch)
			fail(c, SFW_E_NOMEM, "out of memory");
		ch->next = a->head;
		ch->used = 0;
		ch->size = sz;
		a->head = ch;
		a->total += sz;
	}
	void *p = (char *)a->head->data + a->head->used;
	a->head->used += n;
	return p;
}

static char *sdup(struct ctx *c, const char *s, size_t n)
{
	char *p = alloc(c, n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

/* ---- values ---------------------------------------------------------------- */

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC, V_METHOD, V_LOOP };

struct val;
struct list {
	struct val *v;
	size_t n;
	int tuple; /* prints as (a, b) */
};
struct dict {
	struct val *k; /* keys: strings (JSON) or any constant (dict literals) */
	struct val *v;
	size_t n, cap;
};
struct method;
struct macro;
struct loopst;

struct val {
	enum vt t;
	union {
		int b;
		int64_t i;
		double f;
		struct {
			const char *p;
			size_t n;
		} s; /* V_STR, and V_UNDEF's name (may be NULL) */
		struct list *l;
		struct dict *d; /* V_DICT and V_NS */
		struct macro *m;
		int fn;
		struct method *me;
		struct loopst *lp;
	} u;
};

struct method {
	struct val self;
	const char *name;
};

static struct val mk_undef(const char *name)
{
	struct val v = {.t = V_UNDEF};
	v.u.s.p = name;
	v.u.s.n = name ? strlen(name) : 0;
	return v;
}
static struct val mk_none(void) { return (struct val){.t = V_NONE}; }
static struct val mk_bool(int b)
{
	struct val v = {.t = V_BOOL};
	v.u.b = !!b;
	return v;
}
static struct val mk_int(int64_t i)
{
	struct val v = {.t = V_INT};
	v.u.i = i;
	return v;
}
static struct val mk_float(double f)
{
	struct val v = {.t = V_FLOAT};
	v.u.f = f;
	return v;
}
static struct val mk_str(const char *p, size_t n)
{
	struct val v = {.t = V_STR};
	v.u.s.p = p;
	v.u.s.n = n;
	return v;
}
static struct val mk_cstr(const char *p) { return mk_str(p, strlen(p)); }

/* ---- the lexer ------------------------------------------------------------- */

enum tk { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

struct tok {
	enum tk t;
	int line;
	const char *s; /* text, name, decoded string, operator */
	size_t n;
	int64_t i;
	double f;
};

struct toks {
	struct tok *v;
	size_t n, cap;
};

static void tpush(struct ctx *c, struct toks *ts, struct tok t)
{
	if (ts->n == ts->cap) {
		size_t nc = ts->cap ? ts->cap * 2 : 256;
		struct tok *nv = alloc(c, nc * sizeof(*nv));
		if (ts->n)
			memcpy(nv, ts->v, ts->n * sizeof(*nv));
		ts->v = nv;
		ts->cap = nc;
	}
	ts->v[ts->n++] = t;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Text with newlines normalised (\r\n and \r to \n), as Jinja's lexer does. */
static void push_text(struct ctx *c, struct toks *ts, const char *s, size_t n, int line)
{
	if (!n)
		return;
	char *p = alloc(c, n + 1);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\r') {
			p[k++] = '\n';
			if (i + 1 < n && s[i + 1] == '\n')
				i++;
		} else
			p[k++] = s[i];
	}
	p[k] = 0;
	tpush(c, ts, (struct tok){.t = T_TEXT, .line = line, .s = p, .n = k});
}

static int count_lines(const char *s, size_t n)
{
	int k = 0;
	for (size_t i = 0; i < n; i++)
		k += s[i] == '\n';
	return k;
}

static void put_utf8(char *p, size_t *k, uint32_t cp)
{
	if (cp < 0x80)
		p[(*k)++] = (char)cp;
	else if (cp < 0x800) {
		p[(*k)++] = (char)(0xC0 | (cp >> 6));
		p[(*k)++] = (char)(0x80 | (cp & 0x3F));
	} else if (cp < 0x10000) {
		p[(*k)++] = (char)(0xE0 | (cp >> 12));
		p[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
		p[(*k)++] = (char)(0x80 | (cp & 0x3F));
	} else {
		p[(*k)++] = (char)(0xF0 | (cp >> 18));
		p[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
		p[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
		p[(*k)++] = (char)(0x80 | (cp & 0x3F));
	}
}

static int hexval(char ch)
{
	return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* A string literal's body, decoded as Jinja does (Python's unicode-escape
 * over the text; unknown escapes keep their backslash). */
static struct tok lex_string(struct ctx *c, const char *s, size_t n, size_t *pos, int line)
{
	char q = s[*pos];
	size_t i = *pos + 1;
	char *p = alloc(c, n - *pos + 1); /* decoded is never longer (\U.. 10 bytes -> 4) */
	size_t k = 0;
	for (;;) {
		if (i >= n)
			fail(c, SFW_E_FORMAT, "unterminated string literal");
		char ch = s[i];
		if (ch == q)
			break;
		if (ch == '\r') { /* newlines normalised */
			p[k++] = '\n';
			i += (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
			continue;
		}
		if (ch != '\\') {
			p[k++] = ch;
			i++;
			continue;
		}
		if (i + 1 >= n)
			fail(c, SFW_E_FORMAT, "unterminated string literal");
		char e = s[i + 1];
		i += 2;
		switch (e) {
		case 'n': p[k++] = '\n'; break;
		case 't': p[k++] = '\t'; break;
		case 'r': p[k++] = '\r'; break;
		case '\\': p[k++] = '\\'; break;
		case '\'': p[k++] = '\''; break;
		case '"': p[k++] = '"'; break;
		case 'a': p[k++] = '\a'; break;
		case 'b': p[k++] = '\b'; break;
		case 'f': p[k++] = '\f'; break;
		case 'v': p[k++] = '\v'; break;
		case '\n': break; /* line continuation */
		case 'x':
		case 'u':
		case 'U': {
			int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
			uint32_t cp = 0;
			for (int d = 0; d < nd; d++) {
				int h = i + d < n ? hexval(s[i + d]) : -1;
				if (h < 0)
					fail(c, SFW_E_FORMAT, "bad \\%c escape in a string literal", e);
				cp = cp * 16 + (uint32_t)h;
			}
			if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
				fail(c, SFW_E_UNSUPPORTED, "escape \\%c names no Unicode scalar value", e);
			i += (size_t)nd;
			put_utf8(p, &k, cp);
			break;
		}
		default:
			if (e >= '0' && e <= '7') {
				uint32_t cp = (uint32_t)(e - '0');
				for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++)
					cp = cp * 8 + (uint32_t)(s[i++] - '0');
				put_utf8(p, &k, cp);
			} else if (e == 'N') {
				fail(c, SFW_E_UNSUPPORTED, "\\N{...} escapes are not supported");
			} else {
				p[k++] = '\\';
				i--; /* the char after the backslash is ordinary */
			}
		}
	}
	*pos = i + 1;
	p[k] = 0;
	return (struct tok){.t = T_STR, .line = line, .s = p, .n = k};
}

/* Expression tokens from *pos up to the closing delimiter (close: "}}",
 * "%}"). Returns with *pos after the delimiter; *strip_after when "-"
 * preceded it; *keep when "+" did. */
static void lex_tag(struct ctx *c, struct toks *ts, const char *s, size_t n, size_t *pos, int *line, char close,
		    int *strip_after, int *plus_after)
{
	size_t i = *pos;
	*strip_after = *plus_after = 0;
	for (;;) {
		while (i < n && is_ws(s[i])) {
			if (s[i] == '\n')
				(*line)++;
			i++;
		}
		if (i >= n)
			fail(c, SFW_E_FORMAT, "a tag is not closed");
		char ch = s[i];
		if ((ch == '-' || ch == '+') && i + 2 < n && s[i + 1] == close && s[i + 2] == '}') {
			*strip_after = ch == '-';
			*plus_after = ch == '+';
			*pos = i + 3;
			return;
		}
		if (ch == close && i + 1 < n && s[i + 1] == '}') {
			*pos = i + 2;
			return;
		}
		c->line = *line;
		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
			size_t b = i;
			while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_' ||
					 (s[i] >= '0' && s[i] <= '9')))
				i++;
			tpush(c, ts, (struct tok){.t = T_NAME, .line = *line, .s = sdup(c, s + b, i - b), .n = i - b});
			continue;
		}
		if (ch >= '0' && ch <= '9') {
			char num[64];
			size_t k = 0;
			int isf = 0;
			while (i < n && k < sizeof(num) - 3) {
				char d = s[i];
				if (d >= '0' && d <= '9')
					num[k++] = d;
				else if (d == '_')
					;
				else if (d == '.' && !isf && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')
					isf = 1, num[k++] = d;
				else if ((d == 'e' || d == 'E') && i + 1 < n &&
					 ((s[i + 1] >= '0' && s[i + 1] <= '9') ||
					  ((s[i + 1] == '-' || s[i + 1] == '+') && i + 2 < n && s[i + 2] >= '0' && s[i + 2] <= '9'))) {
					isf = 1;
					num[k++] = d;
					num[k++] = s[++i];
				} else
					break;
				i++;
			}
			num[k] = 0;
			if (i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
				fail(c, SFW_E_UNSUPPORTED, "a number literal of more than 60 digits");
			struct tok t = {.line = *line};
			if (isf) {
				t.t = T_FLOAT;
				t.f = strtod(num, NULL);
			} else {
				t.t = T_INT;
				unsigned long long u = strtoull(num, NULL, 10);
				if (u > (unsigned long long)INT64_MAX)
					fail(c, SFW_E_UNSUPPORTED, "integer literal %s is too large", num);
				t.i = (int64_t)u;
			}
			tpush(c, ts, t);
			continue;
		}
		if (ch == '\'' || ch == '"') {
			size_t b = i;
			struct tok t = lex_string(c, s, n, &i, *line);
			*line += count_lines(s + b, i - b);
			tpush(c, ts, t);
			continue;
		}
		static const char *ops2[] = {"==", "!=", "<=", ">=", "//", "**"};
		const char *op = NULL;
		size_t ol = 0;
		for (size_t k = 0; k < sizeof(ops2) / sizeof(ops2[0]); k++)
			if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) {
				op = ops2[k];
				ol = 2;
			}
		if (!op && strchr("+-*/%~<>=()[]{}.,:|", ch)) {
			op = sdup(c, s + i, 1);
			ol = 1;
		}
		if (!op)
			fail(c, SFW_E_FORMAT, "unexpected character '%c' in a tag", ch >= 32 && ch < 127 ? ch : '?');
		tpush(c, ts, (struct tok){.t = T_OP, .line = *line, .s = op, .n = ol});
		i += ol;
	}
}

static void lex(struct ctx *c, struct toks *ts, const char *s, size_t n)
{
	/* keep_trailing_newline off: one trailing newline is not part of it */
	if (n && s[n - 1] == '\n')
		n -= (n >= 2 && s[n - 2] == '\r') ? 2 : 1;
	else if (n && s[n - 1] == '\r')
		n--;
	size_t i = 0, tb = 0; /* text begins at tb */
	int line = 1, tline = 1;
	int strip_next = 0, trim_next = 0;
	while (i <= n) {
		const char *o = i < n ? memchr(s + i, '{', n - i) : NULL;
		size_t at = o ? (size_t)(o - s) : n;
		if (at + 1 >= n || (s[at + 1] != '{' && s[at + 1] != '%' && s[at + 1] != '#')) {
			if (at >= n) {
				/* the rest is text */
				size_t b = tb, e = n;
				if (strip_next)
					while (b < e && is_ws(s[b]))
						b++;
				else if (trim_next && b < e && s[b] == '\n')
					b++;
				else if (trim_next && b < e && s[b] == '\r')
					b += (b + 1 < e && s[b + 1] == '\n') ? 2 : 1;
				push_text(c, ts, s + b, e - b, tline);
				break;
			}
			i = at + 1;
			continue;
		}
		char kind = s[at + 1];
		char mod = at + 2 < n ? s[at + 2] : 0;
		/* the text before the tag */
		size_t b = tb, e = at;
		if (strip_next)
			while (b < e && is_ws(s[b]))
				b++;
		else if (trim_next && b < e && s[b] == '\n')
			b++;
		else if (trim_next && b < e && s[b] == '\r')
			b += (b + 1 < e && s[b + 1] == '\n') ? 2 : 1;
		if (mod == '-') {
			while (e > b && is_ws(s[e - 1]))
				e--;
		} else if (kind != '{' && mod != '+') {
			/* lstrip_blocks: spaces/tabs from the line's start to the tag */
			size_t k = e;
			while (k > b && (s[k - 1] == ' ' || s[k - 1] == '\t'))
				k--;
			if (k == 0 || s[k - 1] == '\n' || s[k - 1] == '\r')
				e = k;
			else if (k == b && b > 0 && (s[b - 1] == '\n' || s[b - 1] == '\r'))
				e = k; /* the line began inside the stripped part */
		}
		push_text(c, ts, s + b, e - b, tline);
		line += count_lines(s + tb, at - tb);
		size_t p = at + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
		int sa = 0, pa = 0;
		c->line = line;
		if (kind == '#') {
			const char *end = NULL;
			for (size_t k = p; k + 1 < n; k++)
				if (s[k] == '#' && s[k + 1] == '}') {
					end = s + k;
					break;
				}
			if (!end)
				fail(c, SFW_E_FORMAT, "a comment is not closed");
			size_t k = (size_t)(end - s);
			sa = k > p && s[k - 1] == '-';
			pa = k > p && s[k - 1] == '+';
			line += count_lines(s + p, k - p);
			p = k + 2;
			strip_next = sa;
			trim_next = !sa && !pa;
		} else if (kind == '%') {
			/* {% raw %} is outside the subset */
			size_t k = p;
			while (k < n && is_ws(s[k]))
				k++;
			if (n - k >= 3 && !memcmp(s + k, "raw", 3) && (k + 3 >= n || !((s[k + 3] >= 'a' && s[k + 3] <= 'z') || s[k + 3] == '_')))
				fail(c, SFW_E_UNSUPPORTED, "{%% raw %%} blocks are not supported");
			tpush(c, ts, (struct tok){.t = T_BBEGIN, .line = line});
			lex_tag(c, ts, s, n, &p, &line, '%', &sa, &pa);
			tpush(c, ts, (struct tok){.t = T_BEND, .line = line});
			strip_next = sa;
			trim_next = !sa && !pa;
		} else {
			tpush(c, ts, (struct tok){.t = T_VBEGIN, .line = line});
			lex_tag(c, ts, s, n, &p, &line, '}', &sa, &pa);
			tpush(c, ts, (struct tok){.t = T_VEND, .line = line});
			strip_next = sa;
			trim_next = 0;
		}
		tb = i = p;
		tline = line;
	}
	tpush(c, ts, (struct tok){.t = T_EOF, .line = line});
}

/* ---- the AST --------------------------------------------------------------- */

enum nk {
	/* expressions */
	N_CONST, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_POS, N_BIN, N_CMP,
	N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT,
	/* statements */
	N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_BODY, N_BREAK, N_CONTINUE
};

struct node {
	enum nk k;
	int line;
	struct node *a, *b, *c, *d; /* operands / cond, body, else / ... */
	struct node **v;            /* args, items, statements */
	size_t nv;
	struct node **kv;           /* keyword arg values, dict values, defaults */
	const char **names;         /* keyword names, targets, params, compare ops */
	size_t nnames;
	const char *s;              /* name, op, text */
	size_t sn;
	struct val cv;              /* N_CONST */
	int neg;                    /* N_TEST: is not */
};

struct parser {
	struct ctx *c;
	struct tok *t;
	size_t i, n;
	int depth;
	int loops; /* for bodies around the current statement (break/continue) */
};

static struct node *nnew(struct parser *p, enum nk k)
{
	struct node *x = alloc(p->c, sizeof(*x));
	memset(x, 0, sizeof(*x));
	x->k = k;
	x->line = p->t[p->i].line;
	return x;
}

struct vec {
	void **v;
	size_t n, cap;
};
static void vpush(struct ctx *c, struct vec *v, void *x)
{
	if (v->n == v->cap) {
		size_t nc = v->cap ? v->cap * 2 : 8;
		void **nv = alloc(c, nc * sizeof(void *));
		if (v->n)
			memcpy(nv, v->v, v->n * sizeof(void *));
		v->v = nv;
		v->cap = nc;
	}
	v->v[v->n++] = x;
}

static struct tok *cur(struct parser *p) { return &p->t[p->i]; }
static int is_op(struct parser *p, const char *op)
{
	struct tok *t = cur(p);
	return t->t == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int is_name(struct parser *p, const char *nm)
{
	struct tok *t = cur(p);
	return t->t == T_NAME && !strcmp(t->s, nm);
}
static void perr(struct parser *p, const char *what)
{
	p->c->line = cur(p)->line;
	struct tok *t = cur(p);
	if (t->t == T_NAME || t->t == T_OP)
		fail(p->c, SFW_E_FORMAT, "expected %s, found '%.40s'", what, t->s);
	fail(p->c, SFW_E_FORMAT, "expected %s", what);
}
static void expect_op(struct parser *p, const char *op)
{
	if (!is_op(p, op)) {
		char w[16];
		snprintf(w, sizeof(w), "'%s'", op);
		perr(p, w);
	}
	p->i++;
}
static const char *expect_name(struct parser *p)
{
	if (cur(p)->t != T_NAME)
		perr(p, "a name");
	return p->t[p->i++].s;
}

static struct node *p_expr(struct parser *p);
static struct node *p_or(struct parser *p);
static struct node *p_unary(struct parser *p, int with_filter);

static void enter(struct parser *p)
{
	if (++p->depth > SFW_JINJA_DEPTH_MAX) {
		p->c->line = cur(p)->line;
		fail(p->c, SFW_E_RANGE, "nesting deeper than %d", SFW_JINJA_DEPTH_MAX);
	}
}

/* (args, kw=...) after the "(" was seen */
static void p_args(struct parser *p, struct node *x)
{
	struct vec a = {0}, kn = {0}, kv = {0};
	while (!is_op(p, ")")) {
		if (a.n + kn.n)
			expect_op(p, ",");
		if (is_op(p, ")"))
			break;
		if (cur(p)->t == T_NAME && p->t[p->i + 1].t == T_OP && p->t[p->i + 1].n == 1 && p->t[p->i + 1].s[0] == '=') {
			vpush(p->c, &kn, (void *)p->t[p->i].s);
			p->i += 2;
			vpush(p->c, &kv, p_expr(p));
		} else {
			if (kn.n)
				perr(p, "a keyword argument");
			vpush(p->c, &a, p_expr(p));
		}
	}
	p->i++;
	x->v = (struct node **)a.v;
	x->nv = a.n;
	x->names = (const char **)kn.v;
	x->nnames = kn.n;
	x->kv = (struct node **)kv.v;
}

static struct node *p_primary(struct parser *p)
{
	enter(p);
	struct tok *t = cur(p);
	struct node *x;
	if (t->t == T_NAME) {
		p->i++;
		if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
			x = nnew(p, N_CONST);
			x->cv = mk_bool(1);
		} else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
			x = nnew(p, N_CONST);
			x->cv = mk_bool(0);
		} else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
			x = nnew(p, N_CONST);
			x->cv = mk_none();
		} else {
			x = nnew(p, N_NAME);
			x->s = t->s;
		}
	} else if (t->t == T_STR) {
		/* adjacent literals concatenate */
		size_t total = 0, k = p->i;
		while (p->t[k].t == T_STR)
			total += p->t[k++].n;
		char *buf = alloc(p->c, total + 1);
		size_t o = 0;
		while (cur(p)->t == T_STR) {
			memcpy(buf + o, cur(p)->s, cur(p)->n);
			o += cur(p)->n;
			p->i++;
		}
		buf[o] = 0;
		x = nnew(p, N_CONST);
		x->cv = mk_str(buf, o);
	} else if (t->t == T_INT) {
		p->i++;
		x = nnew(p, N_CONST);
		x->cv = mk_int(t->i);
	} else if (t->t == T_FLOAT) {
		p->i++;
		x = nnew(p, N_CONST);
		x->cv = mk_float(t->f);
	} else if (is_op(p, "(")) {
		p->i++;
		if (is_op(p, ")")) {
			p->i++;
			x = nnew(p, N_TUPLE);
		} else {
			struct node *e = p_expr(p);
			if (is_op(p, ",")) {
				struct vec v = {0};
				vpush(p->c, &v, e);
				while (is_op(p, ",")) {
					p->i++;
					if (is_op(p, ")"))
						break;
					vpush(p->c, &v, p_expr(p));
				}
				x = nnew(p, N_TUPLE);
				x->v = (struct node **)v.v;
				x->nv = v.n;
			} else
				x = e;
			expect_op(p, ")");
		}
	} else if (is_op(p, "[")) {
		p->i++;
		struct vec v = {0};
		while (!is_op(p, "]")) {
			if (v.n)
				expect_op(p, ",");
			if (is_op(p, "]"))
				break;
			vpush(p->c, &v, p_expr(p));
		}
		p->i++;
		x = nnew(p, N_LIST);
		x->v = (struct node **)v.v;
		x->nv = v.n;
	} else if (is_op(p, "{")) {
		p->i++;
		struct vec k = {0}, v = {0};
		while (!is_op(p, "}")) {
			if (k.n)
				expect_op(p, ",");
			if (is_op(p, "}"))
				break;
			vpush(p->c, &k, p_expr(p));
			expect_op(p, ":");
			vpush(p->c, &v, p_expr(p));
		}
		p->i++;
		x = nnew(p, N_DICT);
		x->v = (struct node **)k.v;
		x->nv = k.n;
		x->kv = (struct node **)v.v;
	} else {
		perr(p, "an expression");
	}
	p->depth--;
	return x;
}

static struct node *p_postfix(struct parser *p, struct node *x)
{
	for (;;) {
		if (is_op(p, ".")) {
			p->i++;
			struct node *y = nnew(p, N_ATTR);
			y->a = x;
			if (cur(p)->t == T_INT) { /* x.0 */
				y->k = N_ITEM;
				y->b = nnew(p, N_CONST);
				y->b->cv = mk_int(cur(p)->i);
				p->i++;
			} else
				y->s = expect_name(p);
			x = y;
		} else if (is_op(p, "[")) {
			p->i++;
			struct node *parts[3] = {0};
			int colons = 0;
			while (!is_op(p, "]")) {
				if (is_op(p, ":")) {
					if (++colons > 2)
						perr(p, "']'");
					p->i++;
					continue;
				}
				if (parts[colons])
					perr(p, "':' or ']'");
				parts[colons] = p_expr(p);
			}
			p->i++;
			struct node *y;
			if (colons) {
				y = nnew(p, N_SLICE);
				y->b = parts[0];
				y->c = parts[1];
				y->d = parts[2];
			} else {
				if (!parts[0])
					perr(p, "a subscript");
				y = nnew(p, N_ITEM);
				y->b = parts[0];
			}
			y->a = x;
			x = y;
		} else if (is_op(p, "(")) {
			p->i++;
			struct node *y = nnew(p, N_CALL);
			y->a = x;
			p_args(p, y);
			x = y;
		} else
			return x;
	}
}

static struct node *p_filters(struct parser *p, struct node *x)
{
	for (;;) {
		if (is_op(p, "|")) {
			p->i++;
			struct node *y = nnew(p, N_FILTER);
			y->a = x;
			y->s = expect_name(p);
			if (is_op(p, "(")) {
				p->i++;
				p_args(p, y);
			}
			x = y;
		} else if (is_name(p, "is")) {
			p->i++;
			struct node *y = nnew(p, N_TEST);
			y->a = x;
			if (is_name(p, "not")) {
				y->neg = 1;
				p->i++;
			}
			y->s = expect_name(p);
			if (is_op(p, "(")) {
				p->i++;
				p_args(p, y);
			} else {
				/* one bare argument: "is divisibleby 3", "is sameas none" */
				struct tok *t = cur(p);
				if (t->t == T_STR || t->t == T_INT || t->t == T_FLOAT || is_op(p, "[") || is_op(p, "{") ||
				    (t->t == T_NAME && strcmp(t->s, "and") && strcmp(t->s, "or") && strcmp(t->s, "else") &&
				     strcmp(t->s, "if") && strcmp(t->s, "in") && strcmp(t->s, "is") && strcmp(t->s, "not"))) {
					struct vec a = {0};
					vpush(p->c, &a, p_postfix(p, p_primary(p)));
					y->v = (struct node **)a.v;
					y->nv = 1;
				}
			}
			x = y;
		} else
			return x;
	}
}

static struct node *p_unary(struct parser *p, int with_filter)
{
	enter(p);
	struct node *x;
	if (is_op(p, "-") || is_op(p, "+")) {
		int neg = is_op(p, "-");
		p->i++;
		x = nnew(p, neg ? N_NEG : N_POS);
		x->a = p_unary(p, 0);
	} else
		x = p_primary(p);
	x = p_postfix(p, x);
	if (with_filter)
		x = p_filters(p, x);
	p->depth--;
	return x;
}

static struct node *bin(struct parser *p, const char *op, struct node *a, struct node *b)
{
	struct node *x = nnew(p, N_BIN);
	x->s = op;
	x->a = a;
	x->b = b;
	return x;
}

static struct node *p_pow(struct parser *p)
{
	struct node *x = p_unary(p, 1);
	while (is_op(p, "**")) {
		p->i++;
		x = bin(p, "**", x, p_unary(p, 1));
	}
	return x;
}
static struct node *p_math2(struct parser *p)
{
	struct node *x = p_pow(p);
	while (is_op(p, "*") || is_op(p, "/") || is_op(p, "//") || is_op(p, "%")) {
		const char *op = cur(p)->s;
		p->i++;
		x = bin(p, op, x, p_pow(p));
	}
	return x;
}
static struct node *p_concat(struct parser *p)
{
	struct node *x = p_math2(p);
	while (is_op(p, "~")) {
		p->i++;
		x = bin(p, "~", x, p_math2(p));
	}
	return x;
}
static struct node *p_math1(struct parser *p)
{
	struct node *x = p_concat(p);
	while (is_op(p, "+") || is_op(p, "-")) {
		const char *op = cur(p)->s;
		p->i++;
		x = bin(p, op, x, p_concat(p));
	}
	return x;
}
static struct node *p_compare(struct parser *p)
{
	struct node *x = p_math1(p);
	struct vec ops = {0}, rhs = {0};
	for (;;) {
		const char *op = NULL;
		if (is_op(p, "==") || is_op(p, "!=") || is_op(p, "<") || is_op(p, "<=") || is_op(p, ">") || is_op(p, ">="))
			op = cur(p)->s, p->i++;
		else if (is_name(p, "in"))
			op = "in", p->i++;
		else if (is_name(p, "not") && p->t[p->i + 1].t == T_NAME && !strcmp(p->t[p->i + 1].s, "in"))
			op = "notin", p->i += 2;
		else
			break;
		vpush(p->c, &ops, (void *)op);
		vpush(p->c, &rhs, p_math1(p));
	}
	if (!ops.n)
		return x;
	struct node *y = nnew(p, N_CMP);
	y->a = x;
	y->names = (const char **)ops.v;
	y->nnames = ops.n;
	y->v = (struct node **)rhs.v;
	y->nv = rhs.n;
	return y;
}
static struct node *p_not(struct parser *p)
{
	if (is_name(p, "not")) {
		enter(p);
		p->i++;
		struct node *x = nnew(p, N_NOT);
		x->a = p_not(p);
		p->depth--;
		return x;
	}
	return p_compare(p);
}
static struct node *p_and(struct parser *p)
{
	struct node *x = p_not(p);
	while (is_name(p, "and")) {
		p->i++;
		struct node *y = nnew(p, N_AND);
		y->a = x;
		y->b = p_not(p);
		x = y;
	}
	return x;
}
static struct node *p_or(struct parser *p)
{
	struct node *x = p_and(p);
	while (is_name(p, "or")) {
		p->i++;
		struct node *y = nnew(p, N_OR);
		y->a = x;
		y->b = p_and(p);
		x = y;
	}
	return x;
}
/* with the conditional expression (x if c else y) */
static struct node *p_expr(struct parser *p)
{
	enter(p);
	struct node *x = p_or(p);
	while (is_name(p, "if")) {
		p->i++;
		struct node *y = nnew(p, N_COND);
		y->a = x;
		y->b = p_or(p);
		if (is_name(p, "else")) {
			p->i++;
			y->c = p_expr(p);
		}
		x = y;
	}
	p->depth--;
	return x;
}

/* statements */

static int at_block(struct parser *p, const char *const *names)
{
	if (cur(p)->t != T_BBEGIN || p->t[p->i + 1].t != T_NAME)
		return 0;
	for (; *names; names++)
		if (!strcmp(p->t[p->i + 1].s, *names))
			return 1;
	return 0;
}

static void end_tag(struct parser *p)
{
	if (cur(p)->t != T_BEND)
		perr(p, "the end of the tag");
	p->i++;
}

static struct node *p_body(struct parser *p, const char *const *until);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};

static struct node *p_if(struct parser *p)
{
	struct node *x = nnew(p, N_IF);
	x->a = p_expr(p);
	end_tag(p);
	x->b = p_body(p, END_IF);
	p->i++; /* {% */
	const char *kw = expect_name(p);
	if (!strcmp(kw, "elif")) {
		x->c = p_if(p);
		return x;
	}
	if (!strcmp(kw, "else")) {
		end_tag(p);
		static const char *const E[] = {"endif", NULL};
		x->c = p_body(p, E);
		p->i++;
		expect_name(p);
	}
	end_tag(p);
	return x;
}

static void p_targets(struct parser *p, struct node *x)
{
	struct vec v = {0};
	int paren = is_op(p, "(");
	if (paren)
		p->i++;
	vpush(p->c, &v, (void *)expect_name(p));
	while (is_op(p, ",")) {
		p->i++;
		vpush(p->c, &v, (void *)expect_name(p));
	}
	if (paren)
		expect_op(p, ")");
	x->names = (const char **)v.v;
	x->nnames = v.n;
}

static struct node *p_stmt(struct parser *p)
{
	struct parser *P = p;
	p->i++; /* {% */
	int line = cur(p)->line;
	P->c->line = line;
	const char *kw = expect_name(p);
	struct node *x;
	if (!strcmp(kw, "if")) {
		x = p_if(p);
	} else if (!strcmp(kw, "for")) {
		x = nnew(p, N_FOR);
		p_targets(p, x);
		if (!is_name(p, "in"))
			perr(p, "'in'");
		p->i++;
		/* the iterable: an expression without the conditional form (its "if" filters) */
		x->a = p_or(p);
		if (is_op(p, ",")) { /* a tuple literal without parentheses */
			struct node *t = nnew(p, N_TUPLE);
			struct vec v = {0};
			vpush(p->c, &v, x->a);
			while (is_op(p, ",")) {
				p->i++;
				vpush(p->c, &v, p_or(p));
			}
			t->v = (struct node **)v.v;
			t->nv = v.n;
			x->a = t;
		}
		if (is_name(p, "if")) {
			p->i++;
			x->d = p_or(p);
		}
		if (is_name(p, "recursive"))
			fail(p->c, SFW_E_UNSUPPORTED, "recursive for loops are not supported");
		end_tag(p);
		p->loops++;
		x->b = p_body(p, END_FOR);
		p->loops--;
		p->i++;
		const char *e = expect_name(p);
		if (!strcmp(e, "else")) {
			end_tag(p);
			static const char *const E[] = {"endfor", NULL};
			x->c = p_body(p, E);
			p->i++;
			expect_name(p);
		}
		end_tag(p);
	} else if (!strcmp(kw, "set")) {
		const char *name = expect_name(p);
		const char *attr = NULL;
		if (is_op(p, ".")) {
			p->i++;
			attr = expect_name(p);
		}
		if (is_op(p, "=")) {
			p->i++;
			x = nnew(p, N_SET);
			x->s = name;
			x->names = alloc(p->c, sizeof(char *));
			x->names[0] = attr;
			x->a = p_expr(p);
			if (is_op(p, ","))
				fail(p->c, SFW_E_UNSUPPORTED, "tuple assignment in set is not supported");
			end_tag(p);
		} else if (is_op(p, ",")) {
			fail(p->c, SFW_E_UNSUPPORTED, "tuple assignment in set is not supported");
		} else {
			if (attr)
				perr(p, "'='");
			x = nnew(p, N_SETBLOCK);
			x->s = name;
			if (is_op(p, "|"))
				fail(p->c, SFW_E_UNSUPPORTED, "filtered block set is not supported");
			end_tag(p);
			static const char *const E[] = {"endset", NULL};
			x->b = p_body(p, E);
			p->i++;
			expect_name(p);
			end_tag(p);
		}
	} else if (!strcmp(kw, "macro")) {
		x = nnew(p, N_MACRO);
		x->s = expect_name(p);
		expect_op(p, "(");
		struct vec nm = {0}, df = {0};
		while (!is_op(p, ")")) {
			if (nm.n)
				expect_op(p, ",");
			vpush(p->c, &nm, (void *)expect_name(p));
			struct node *d = NULL;
			if (is_op(p, "=")) {
				p->i++;
				d = p_expr(p);
			}
			vpush(p->c, &df, d);
		}
		p->i++;
		x->names = (const char **)nm.v;
		x->nnames = nm.n;
		x->kv = (struct node **)df.v;
		end_tag(p);
		static const char *const E[] = {"endmacro", NULL};
		int outer = p->loops;
		p->loops = 0;
		x->b = p_body(p, E);
		p->loops = outer;
		p->i++;
		expect_name(p);
		if (cur(p)->t == T_NAME)
			p->i++; /* {% endmacro name %} */
		end_tag(p);
	} else if (!strcmp(kw, "call")) {
		x = nnew(p, N_CALLBLOCK);
		if (is_op(p, "(")) { /* caller parameters */
			p->i++;
			struct vec nm = {0}, df = {0};
			while (!is_op(p, ")")) {
				if (nm.n)
					expect_op(p, ",");
				vpush(p->c, &nm, (void *)expect_name(p));
				struct node *d = NULL;
				if (is_op(p, "=")) {
					p->i++;
					d = p_expr(p);
				}
				vpush(p->c, &df, d);
			}
			p->i++;
			x->names = (const char **)nm.v;
			x->nnames = nm.n;
			x->kv = (struct node **)df.v;
		}
		x->a = p_expr(p);
		if (x->a->k != N_CALL)
			perr(p, "a macro call");
		end_tag(p);
		static const char *const E[] = {"endcall", NULL};
		x->b = p_body(p, E);
		p->i++;
		expect_name(p);
		end_tag(p);
	} else if (!strcmp(kw, "generation")) {
		/* HF's AssistantTracker: the body renders as is */
		end_tag(p);
		static const char *const E[] = {"endgeneration", NULL};
		x = p_body(p, E);
		p->i++;
		expect_name(p);
		end_tag(p);
	} else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
		if (!p->loops)
			fail(p->c, SFW_E_FORMAT, "{%% %s %%} outside a loop", kw);
		x = nnew(p, kw[0] == 'b' ? N_BREAK : N_CONTINUE);
		end_tag(p);
	} else {
		p->c->line = line;
		fail(p->c, SFW_E_UNSUPPORTED, "the '%.40s' tag is not supported", kw);
	}
	x->line = line;
	return x;
}

static struct node *p_body(struct parser *p, const char *const *until)
{
	enter(p);
	struct node *b = nnew(p, N_BODY);
	struct vec v = {0};
	for (;;) {
		struct tok *t = cur(p);
		if (t->t == T_EOF) {
			if (until) {
				p->c->line = t->line;
				fail(p->c, SFW_E_FORMAT, "missing {%% %s %%}", until[0]);
			}
			break;
		}
		if (t->t == T_TEXT) {
			struct node *x = nnew(p, N_TEXT);
			x->s = t->s;
			x->sn = t->n;
			p->i++;
			vpush(p->c, &v, x);
		} else if (t->t == T_VBEGIN) {
			p->i++;
			struct node *x = nnew(p, N_OUT);
			x->a = p_expr(p);
			if (cur(p)->t != T_VEND)
				perr(p, "'}}'");
			p->i++;
			vpush(p->c, &v, x);
		} else if (t->t == T_BBEGIN) {
			if (until && at_block(p, until))
				break;
			static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset", "endmacro",
							    "endcall", "endgeneration", NULL};
			if (at_block(p, stray)) {
				p->c->line = t->line;
				fail(p->c, SFW_E_FORMAT, "unexpected {%% %s %%}", p->t[p->i + 1].s);
			}
			vpush(p->c, &v, p_stmt(p));
		} else {
			perr(p, "text or a tag");
		}
	}
	b->v = (struct node **)v.v;
	b->nv = v.n;
	p->depth--;
	return b;
}

struct sfwi_jinja {
	struct arena ar;
	struct node *root;
	char *what;
};

enum sfw_status sfwi_jinja_compile(const char *src, size_t len, const char *what, struct sfwi_jinja **out,
				   struct sfw_err *err)
{
	*out = NULL;
	if (len > SFW_CHAT_TEMPLATE_MAX)
		return sfw_fail(err, SFW_E_RANGE, "%s: the template is larger than %u KiB", what,
				SFW_CHAT_TEMPLATE_MAX >> 10);
	if (memchr(src, 0, len) || !sfw_utf8_valid((const unsigned char *)src, len))
		return sfw_fail(err, SFW_E_FORMAT, "%s: the template is not NUL-free UTF-8", what);
	struct sfwi_jinja *j = sfw_calloc(1, sizeof(*j));
	if (!j || !(j->what = sfw_strdup(what))) {
		sfw_free(j);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	j->ar.cap = COMPILE_MEM_MAX;
	struct ctx c = {.err = err, .ar = &j->ar, .what = j->what};
	if (setjmp(c.jb)) {
		sfwi_jinja_free(j);
		return c.st;
	}
	struct toks ts = {0};
	lex(&c, &ts, src, len);
	struct parser p = {.c = &c, .t = ts.v, .n = ts.n};
	j->root = p_body(&p, NULL);
	*out = j;
	return SFW_OK;
}

void sfwi_jinja_free(struct sfwi_jinja *j)
{
	if (!j)
		return;
	arena_free(&j->ar);
	sfw_free(j->what);
	sfw_free(j);
}

/* ---- evaluation ------------------------------------------------------------ */

struct scope {
	struct scope *parent;
	const char **names;
	struct val *vals;
	size_t n, cap;
};

struct macro {
	struct node *def;     /* N_MACRO, or N_CALLBLOCK for caller() */
	struct scope *closure;
	struct val caller;    /* V_MACRO of the {% call %} body, or undefined */
};

struct loopst {
	struct list *items;
	size_t idx;
};

enum { F_RANGE = 1, F_NAMESPACE, F_RAISE, F_DICT, F_STRFTIME };

struct rctx {
	struct ctx c;
	struct sfw_buf *out;
	long steps;
	int depth;
	int brk; /* 1 break, 2 continue */
};

static void step(struct rctx *r)
{
	if (++r->steps > SFW_JINJA_STEPS_MAX)
		fail(&r->c, SFW_E_RANGE, "more than %ld loop iterations and calls", (long)SFW_JINJA_STEPS_MAX);
}

static void rdepth(struct rctx *r, int d)
{
	r->depth += d;
	if (r->depth > SFW_JINJA_DEPTH_MAX)
		fail(&r->c, SFW_E_RANGE, "nesting or recursion deeper than %d", SFW_JINJA_DEPTH_MAX);
}

static void scope_set(struct rctx *r, struct scope *s, const char *name, struct val v)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->names[i], name)) {
			s->vals[i] = v;
			return;
		}
	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 8;
		const char **nn = alloc(&r->c, nc * sizeof(char *));
		struct val *nv = alloc(&r->c, nc * sizeof(struct val));
		if (s->n) {
			memcpy(nn, s->names, s->n * sizeof(char *));
			memcpy(nv, s->vals, s->n * sizeof(struct val));
		}
		s->names = nn;
		s->vals = nv;
		s->cap = nc;
	}
	s->names[s->n] = name;
	s->vals[s->n++] = v;
}

static int scope_get(struct scope *s, const char *name, struct val *out)
{
	for (; s; s = s->parent)
		for (size_t i = s->n; i-- > 0;)
			if (!strcmp(s->names[i], name)) {
				*out = s->vals[i];
				return 1;
			}
	return 0;
}

static struct scope *scope_new(struct rctx *r, struct scope *parent)
{
	struct scope *s = alloc(&r->c, sizeof(*s));
	memset(s, 0, sizeof(*s));
	s->parent = parent;
	return s;
}

static struct list *list_new(struct rctx *r, size_t n)
{
	struct list *l = alloc(&r->c, sizeof(*l));
	l->n = n;
	l->tuple = 0;
	l->v = n ? alloc(&r->c, n * sizeof(struct val)) : NULL;
	return l;
}

static struct dict *dict_new(struct rctx *r, size_t cap)
{
	struct dict *d = alloc(&r->c, sizeof(*d));
	d->n = 0;
	d->cap = cap ? cap : 4;
	d->k = alloc(&r->c, d->cap * sizeof(struct val));
	d->v = alloc(&r->c, d->cap * sizeof(struct val));
	return d;
}

static int val_eq(const struct val *a, const struct val *b);

static struct val *dict_find(struct dict *d, const struct val *k)
{
	for (size_t i = 0; i < d->n; i++)
		if (val_eq(&d->k[i], k))
			return &d->v[i];
	return NULL;
}

static struct val *dict_find_s(struct dict *d, const char *k, size_t n)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == V_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n))
			return &d->v[i];
	return NULL;
}

static void dict_put(struct rctx *r, struct dict *d, struct val k, struct val v)
{
	struct val *e = dict_find(d, &k);
	if (e) {
		*e = v;
		return;
	}
	if (d->n == d->cap) {
		size_t nc = d->cap * 2;
		struct val *nk = alloc(&r->c, nc * sizeof(struct val)), *nv = alloc(&r->c, nc * sizeof(struct val));
		memcpy(nk, d->k, d->n * sizeof(struct val));
		memcpy(nv, d->v, d->n * sizeof(struct val));
		d->k = nk;
		d->v = nv;
		d->cap = nc;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
}

/* JSON -> values; strings borrow cJSON's memory (alive for the render). */
static struct val from_json(struct rctx *r, const cJSON *j, int depth)
{
	if (depth > SFW_JINJA_DEPTH_MAX)
		fail(&r->c, SFW_E_RANGE, "input JSON nested deeper than %d", SFW_JINJA_DEPTH_MAX);
	if (!j || cJSON_IsNull(j))
		return mk_none();
	if (cJSON_IsBool(j))
		return mk_bool(cJSON_IsTrue(j));
	if (cJSON_IsNumber(j)) {
		double d = j->valuedouble;
		/* JSON keeps no int/float distinction through cJSON: integral values
		 * within 2^53 are ints (Python's json reads "3" as int). */
		if (isfinite(d) && d == floor(d) && fabs(d) <= 9007199254740992.0)
			return mk_int((int64_t)d);
		return mk_float(d);
	}
	if (cJSON_IsString(j))
		return mk_cstr(j->valuestring ? j->valuestring : "");
	if (cJSON_IsArray(j)) {
		size_t n = 0;
		for (const cJSON *e = j->child; e; e = e->next)
			n++;
		struct list *l = list_new(r, n);
		size_t i = 0;
		for (const cJSON *e = j->child; e; e = e->next)
			l->v[i++] = from_json(r, e, depth + 1);
		struct val v = {.t = V_LIST};
		v.u.l = l;
		return v;
	}
	if (cJSON_IsObject(j)) {
		size_t n = 0;
		for (const cJSON *e = j->child; e; e = e->next)
			n++;
		struct dict *d = dict_new(r, n);
		for (const cJSON *e = j->child; e; e = e->next)
			dict_put(r, d, mk_cstr(e->string ? e->string : ""), from_json(r, e, depth + 1));
		struct val v = {.t = V_DICT};
		v.u.d = d;
		return v;
	}
	fail(&r->c, SFW_E_FORMAT, "unsupported JSON value");
}

static const char *tname(enum vt t)
{
	static const char *n[] = {"undefined", "none", "bool", "int", "float", "str", "list", "dict",
				  "namespace", "macro", "function", "method", "loop"};
	return n[t];
}

static int truthy(const struct val *v)
{
	switch (v->t) {
	case V_UNDEF:
	case V_NONE: return 0;
	case V_BOOL: return v->u.b;
	case V_INT: return v->u.i != 0;
	case V_FLOAT: return v->u.f != 0;
	case V_STR: return v->u.s.n != 0;
	case V_LIST: return v->u.l->n != 0;
	case V_DICT: return v->u.d->n != 0;
	default: return 1;
	}
}

static int val_eq(const struct val *a, const struct val *b)
{
	int an = a->t == V_INT || a->t == V_FLOAT || a->t == V_BOOL, bn = b->t == V_INT || b->t == V_FLOAT || b->t == V_BOOL;
	if (an && bn) {
		if (a->t != V_FLOAT && b->t != V_FLOAT) {
			int64_t x = a->t == V_BOOL ? a->u.b : a->u.i, y = b->t == V_BOOL ? b->u.b : b->u.i;
			return x == y;
		}
		double x = a->t == V_FLOAT ? a->u.f : a->t == V_BOOL ? a->u.b : (double)a->u.i;
		double y = b->t == V_FLOAT ? b->u.f : b->t == V_BOOL ? b->u.b : (double)b->u.i;
		return x == y;
	}
	if (a->t != b->t)
		return 0;
	switch (a->t) {
	case V_UNDEF:
	case V_NONE: return 1;
	case V_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
	case V_LIST:
		if (a->u.l->n != b->u.l->n)
			return 0;
		for (size_t i = 0; i < a->u.l->n; i++)
			if (!val_eq(&a->u.l->v[i], &b->u.l->v[i]))
				return 0;
		return 1;
	case V_DICT:
		if (a->u.d->n != b->u.d->n)
			return 0;
		for (size_t i = 0; i < a->u.d->n; i++) {
			struct val *o = dict_find(b->u.d, &a->u.d->k[i]);
			if (!o || !val_eq(&a->u.d->v[i], o))
				return 0;
		}
		return 1;
	default: return a->u.d == b->u.d;
	}
}

/* -- text conversion (Python's str/repr) -- */

struct sb {
	char *p;
	size_t n, cap;
};

static void sb_add(struct rctx *r, struct sb *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		if (n > RENDER_MEM_MAX || b->n > RENDER_MEM_MAX - n)
			fail(&r->c, SFW_E_RANGE, "a string longer than %zu MiB", RENDER_MEM_MAX >> 20);
		size_t nc = b->cap ? b->cap : 64;
		while (nc < b->n + n + 1)
			nc *= 2;
		char *np = alloc(&r->c, nc);
		if (b->n)
			memcpy(np, b->p, b->n);
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}
static void sb_cs(struct rctx *r, struct sb *b, const char *s) { sb_add(r, b, s, strlen(s)); }

/* Python's repr of a float: the shortest text that reads back the same. */
static void float_repr(double f, char *out, size_t cap)
{
	if (isnan(f)) {
		snprintf(out, cap, "nan");
		return;
	}
	if (isinf(f)) {
		snprintf(out, cap, f < 0 ? "-inf" : "inf");
		return;
	}
	char buf[40];
	int prec;
	for (prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*e", prec - 1, f);
		if (strtod(buf, NULL) == f)
			break;
	}
	/* digits and exponent of the shortest form */
	char digits[24];
	size_t nd = 0;
	const char *q = buf;
	int neg = 0;
	if (*q == '-')
		neg = 1, q++;
	for (; *q && *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			digits[nd++] = *q;
	int ex = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	digits[nd] = 0;
	char *o = out;
	size_t left = cap;
#define PUT(...)                                                   \
	do {                                                       \
		int w_ = snprintf(o, left, __VA_ARGS__);           \
		if (w_ < 0 || (size_t)w_ >= left)                  \
			return;                                    \
		o += w_;                                           \
		left -= (size_t)w_;                                \
	} while (0)
	if (neg)
		PUT("-");
	if (ex < -4 || ex >= 16) {
		PUT("%c", digits[0]);
		if (nd > 1)
			PUT(".%s", digits + 1);
		PUT("e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
	} else if (ex < 0) {
		PUT("0.");
		for (int k = 0; k < -ex - 1; k++)
			PUT("0");
		PUT("%s", digits);
	} else {
		for (int k = 0; k <= ex; k++)
			PUT("%c", (size_t)k < nd ? digits[k] : '0');
		PUT(".");
		if ((size_t)ex + 1 < nd)
			PUT("%s", digits + ex + 1);
		else
			PUT("0");
	}
#undef PUT
}

static void to_str(struct rctx *r, struct sb *b, const struct val *v, int repr);

static void py_repr_str(struct rctx *r, struct sb *b, const char *s, size_t n)
{
	int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
	char q = sq && !dq ? '"' : '\'';
	sb_add(r, b, &q, 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		char e[8];
		if (ch == (unsigned char)q || ch == '\\')
			e[0] = '\\', e[1] = (char)ch, sb_add(r, b, e, 2);
		else if (ch == '\n')
			sb_cs(r, b, "\\n");
		else if (ch == '\r')
			sb_cs(r, b, "\\r");
		else if (ch == '\t')
			sb_cs(r, b, "\\t");
		else if (ch < 0x20 || ch == 0x7f) {
			snprintf(e, sizeof(e), "\\x%02x", ch);
			sb_cs(r, b, e);
		} else
			sb_add(r, b, (const char *)&ch, 1);
	}
	sb_add(r, b, &q, 1);
}

static void to_str(struct rctx *r, struct sb *b, const struct val *v, int repr)
{
	char num[64];
	switch (v->t) {
	case V_UNDEF: if (repr) sb_cs(r, b, "Undefined"); return;
	case V_NONE: sb_cs(r, b, "None"); return;
	case V_BOOL: sb_cs(r, b, v->u.b ? "True" : "False"); return;
	case V_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v->u.i);
		sb_cs(r, b, num);
		return;
	case V_FLOAT:
		float_repr(v->u.f, num, sizeof(num));
		sb_cs(r, b, num);
		return;
	case V_STR:
		if (repr)
			py_repr_str(r, b, v->u.s.p, v->u.s.n);
		else
			sb_add(r, b, v->u.s.p, v->u.s.n);
		return;
	case V_LIST:
		rdepth(r, 1);
		sb_cs(r, b, v->u.l->tuple ? "(" : "[");
		for (size_t i = 0; i < v->u.l->n; i++) {
			if (i)
				sb_cs(r, b, ", ");
			to_str(r, b, &v->u.l->v[i], 1);
		}
		sb_cs(r, b, v->u.l->tuple ? (v->u.l->n == 1 ? ",)" : ")") : "]");
		rdepth(r, -1);
		return;
	case V_DICT:
		rdepth(r, 1);
		sb_cs(r, b, "{");
		for (size_t i = 0; i < v->u.d->n; i++) {
			if (i)
				sb_cs(r, b, ", ");
			to_str(r, b, &v->u.d->k[i], 1);
			sb_cs(r, b, ": ");
			to_str(r, b, &v->u.d->v[i], 1);
		}
		sb_cs(r, b, "}");
		rdepth(r, -1);
		return;
	default:
		fail(&r->c, SFW_E_UNSUPPORTED, "cannot print a %s", tname(v->t));
	}
}

static struct val str_of(struct rctx *r, const struct val *v)
{
	if (v->t == V_STR)
		return *v;
	struct sb b = {0};
	to_str(r, &b, v, 0);
	return mk_str(b.p ? b.p : "", b.n);
}

/* -- JSON out (HF's tojson: json.dumps with ensure_ascii, indent,
 * separators, sort_keys as given) -- */

struct jopt {
	int ascii;
	int indent; /* -1 = none */
	const char *isep, *ksep;
	int sort;
};

static void json_str(struct rctx *r, struct sb *b, const char *s, size_t n, int ascii)
{
	sb_cs(r, b, "\"");
	for (size_t i = 0; i < n;) {
		unsigned char ch = (unsigned char)s[i];
		char e[16];
		if (ch == '"' || ch == '\\') {
			e[0] = '\\', e[1] = (char)ch;
			sb_add(r, b, e, 2);
			i++;
		} else if (ch < 0x20) {
			const char *m = ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
			if (m)
				sb_cs(r, b, m);
			else {
				snprintf(e, sizeof(e), "\\u%04x", ch);
				sb_cs(r, b, e);
			}
			i++;
		} else if (ch < 0x80 || !ascii) {
			if (ch == 0x7f && ascii) {
				sb_cs(r, b, "\\u007f");
				i++;
				continue;
			}
			size_t k = i + 1;
			while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80 && ch >= 0x80)
				k++;
			sb_add(r, b, s + i, k - i);
			i = k;
		} else {
			uint32_t cp;
			size_t len = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : 2;
			cp = ch & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
			for (size_t k = 1; k < len && i + k < n; k++)
				cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
			if (cp >= 0x10000) {
				uint32_t x = cp - 0x10000;
				snprintf(e, sizeof(e), "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
			} else
				snprintf(e, sizeof(e), "\\u%04x", cp);
			sb_cs(r, b, e);
			i += len;
		}
	}
	sb_cs(r, b, "\"");
}

static void json_nl(struct rctx *r, struct sb *b, const struct jopt *o, int level)
{
	sb_cs(r, b, "\n");
	for (int k = 0; k < o->indent * level; k++)
		sb_cs(r, b, " ");
}

static int key_cmp(const void *a, const void *b)
{
	const struct val *x = *(struct val *const *)a, *y = *(struct val *const *)b;
	size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
	int c = memcmp(x->u.s.p, y->u.s.p, n);
	return c ? c : (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
}

static void to_json(struct rctx *r, struct sb *b, const struct val *v, const struct jopt *o, int level)
{
	char num[64];
	rdepth(r, 1);
	switch (v->t) {
	case V_NONE: sb_cs(r, b, "null"); break;
	case V_BOOL: sb_cs(r, b, v->u.b ? "true" : "false"); break;
	case V_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v->u.i);
		sb_cs(r, b, num);
		break;
	case V_FLOAT:
		if (isnan(v->u.f))
			sb_cs(r, b, "NaN");
		else if (isinf(v->u.f))
			sb_cs(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
		else {
			float_repr(v->u.f, num, sizeof(num));
			sb_cs(r, b, num);
		}
		break;
	case V_STR: json_str(r, b, v->u.s.p, v->u.s.n, o->ascii); break;
	case V_LIST:
		if (!v->u.l->n) {
			sb_cs(r, b, "[]");
			break;
		}
		sb_cs(r, b, "[");
		for (size_t i = 0; i < v->u.l->n; i++) {
			if (i)
				sb_cs(r, b, o->isep);
			if (o->indent >= 0)
				json_nl(r, b, o, level + 1);
			to_json(r, b, &v->u.l->v[i], o, level + 1);
		}
		if (o->indent >= 0)
			json_nl(r, b, o, level);
		sb_cs(r, b, "]");
		break;
	case V_DICT:
	case V_NS: {
		struct dict *d = v->u.d;
		if (!d->n) {
			sb_cs(r, b, "{}");
			break;
		}
		struct val **keys = alloc(&r->c, d->n * sizeof(*keys));
		for (size_t i = 0; i < d->n; i++) {
			if (d->k[i].t != V_STR)
				fail(&r->c, SFW_E_UNSUPPORTED, "tojson: a dict key that is not a string");
			keys[i] = &d->k[i];
		}
		if (o->sort)
			qsort(keys, d->n, sizeof(*keys), key_cmp);
		sb_cs(r, b, "{");
		for (size_t i = 0; i < d->n; i++) {
			if (i)
				sb_cs(r, b, o->isep);
			if (o->indent >= 0)
				json_nl(r, b, o, level + 1);
			json_str(r, b, keys[i]->u.s.p, keys[i]->u.s.n, o->ascii);
			sb_cs(r, b, o->ksep);
			to_json(r, b, &d->v[keys[i] - d->k], o, level + 1);
		}
		if (o->indent >= 0)
			json_nl(r, b, o, level);
		sb_cs(r, b, "}");
		break;
	}
	default: fail(&r->c, SFW_E_FORMAT, "tojson: a %s is not JSON serializable", tname(v->t));
	}
	rdepth(r, -1);
}

/* -- UTF-8 helpers for Python's code-point semantics -- */

static size_t u8_count(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xC0) != 0x80;
	return k;
}

/* byte offset of code point cp (cp <= count) */
static size_t u8_off(const char *s, size_t n, size_t cp)
{
	size_t i = 0, k = 0;
	while (i < n) {
		if (((unsigned char)s[i] & 0xC0) != 0x80) {
			if (k == cp)
				return i;
			k++;
		}
		i++;
	}
	return n;
}

/* Python's str.isspace for one code point at s (len bytes); returns its
 * length when it is whitespace, else 0. */
static size_t py_space_at(const char *s, size_t n)
{
	unsigned char c0 = (unsigned char)s[0];
	if (c0 == ' ' || (c0 >= 0x09 && c0 <= 0x0D) || (c0 >= 0x1C && c0 <= 0x1F))
		return 1;
	if (c0 == 0xC2 && n >= 2 && ((unsigned char)s[1] == 0x85 || (unsigned char)s[1] == 0xA0))
		return 2;
	if (c0 == 0xE1 && n >= 3 && (unsigned char)s[1] == 0x9A && (unsigned char)s[2] == 0x80)
		return 3;
	if (c0 == 0xE2 && n >= 3) {
		unsigned c1 = (unsigned char)s[1], c2 = (unsigned char)s[2];
		if (c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8A) || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF))
			return 3;
		if (c1 == 0x81 && c2 == 0x9F)
			return 3;
	}
	if (c0 == 0xE3 && n >= 3 && (unsigned char)s[1] == 0x80 && (unsigned char)s[2] == 0x80)
		return 3;
	return 0;
}

static size_t u8_len_at(const char *s, size_t n)
{
	unsigned char ch = (unsigned char)s[0];
	size_t l = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
	return l > n ? n : l;
}

/* does the code point at s[0..] appear in chars? */
static size_t in_chars(const char *s, size_t n, const struct val *chars)
{
	size_t l = u8_len_at(s, n);
	const char *c = chars->u.s.p;
	size_t cn = chars->u.s.n;
	for (size_t i = 0; i < cn;) {
		size_t cl = u8_len_at(c + i, cn - i);
		if (cl == l && !memcmp(c + i, s, l))
			return l;
		i += cl;
	}
	return 0;
}

static size_t strip_left(const char *s, size_t n, const struct val *chars)
{
	size_t i = 0;
	while (i < n) {
		size_t l = chars ? in_chars(s + i, n - i, chars) : py_space_at(s + i, n - i);
		if (!l)
			break;
		i += l;
	}
	return i;
}

/* the index where the trailing run begins */
static size_t strip_right(const char *s, size_t n, size_t from, const struct val *chars)
{
	size_t e = n;
	while (e > from) {
		size_t b = e - 1;
		while (b > from && ((unsigned char)s[b] & 0xC0) == 0x80)
			b--;
		size_t l = chars ? in_chars(s + b, e - b, chars) : py_space_at(s + b, e - b);
		if (!l || b + l != e)
			break;
		e = b;
	}
	return e;
}

/* ---- the evaluator ---------------------------------------------------------- */

static struct val eval(struct rctx *r, struct node *x, struct scope *sc);
static void exec_body(struct rctx *r, struct node *b, struct scope *sc, struct sb *out);
static struct val call_value(struct rctx *r, struct val f, struct val *args, size_t na, const char **kn,
			     struct val *kv, size_t nk, struct scope *sc);

static void need_str(struct rctx *r, const struct val *v, const char *what)
{
	if (v->t != V_STR)
		fail(&r->c, SFW_E_FORMAT, "%s wants a string, got %s", what, tname(v->t));
}

static void undef_error(struct rctx *r, const struct val *v) __attribute__((noreturn));
static void undef_error(struct rctx *r, const struct val *v)
{
	if (v->u.s.p)
		fail(&r->c, SFW_E_FORMAT, "'%.*s' is undefined", (int)(v->u.s.n > 80 ? 80 : v->u.s.n), v->u.s.p);
	fail(&r->c, SFW_E_FORMAT, "an undefined value was used");
}

static struct val mk_method(struct rctx *r, struct val self, const char *name)
{
	struct method *m = alloc(&r->c, sizeof(*m));
	m->self = self;
	m->name = name;
	struct val v = {.t = V_METHOD};
	v.u.me = m;
	return v;
}

static int is_str_method(const char *n)
{
	static const char *m[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
				  "lower", "replace", "find", "count", "title", "capitalize", "join", "format",
				  "splitlines", "index", "isdigit", "isspace", "isalpha", "isalnum", "islower", "isupper", NULL};
	for (int i = 0; m[i]; i++)
		if (!strcmp(m[i], n))
			return 1;
	return 0;
}

static struct val getattr_v(struct rctx *r, struct val o, const char *name)
{
	size_t nl = strlen(name);
	switch (o.t) {
	case V_UNDEF: undef_error(r, &o);
	case V_DICT:
		if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values") || !strcmp(name, "get"))
			return mk_method(r, o, name);
		{
			struct val *e = dict_find_s(o.u.d, name, nl);
			return e ? *e : mk_undef(name);
		}
	case V_NS: {
		struct val *e = dict_find_s(o.u.d, name, nl);
		return e ? *e : mk_undef(name);
	}
	case V_STR:
		if (is_str_method(name))
			return mk_method(r, o, name);
		return mk_undef(name);
	case V_LIST:
		if (!strcmp(name, "index") || !strcmp(name, "count"))
			return mk_method(r, o, name);
		if (!strcmp(name, "append") || !strcmp(name, "extend") || !strcmp(name, "pop") || !strcmp(name, "insert"))
			fail(&r->c, SFW_E_FORMAT, "list.%s is not allowed (immutable sandbox)", name);
		return mk_undef(name);
	case V_LOOP: {
		struct loopst *l = o.u.lp;
		int64_t n = (int64_t)l->items->n, i = (int64_t)l->idx;
		if (!strcmp(name, "index"))
			return mk_int(i + 1);
		if (!strcmp(name, "index0"))
			return mk_int(i);
		if (!strcmp(name, "revindex"))
			return mk_int(n - i);
		if (!strcmp(name, "revindex0"))
			return mk_int(n - i - 1);
		if (!strcmp(name, "first"))
			return mk_bool(i == 0);
		if (!strcmp(name, "last"))
			return mk_bool(i == n - 1);
		if (!strcmp(name, "length"))
			return mk_int(n);
		if (!strcmp(name, "depth"))
			return mk_int(1);
		if (!strcmp(name, "depth0"))
			return mk_int(0);
		if (!strcmp(name, "previtem"))
			return i > 0 ? l->items->v[i - 1] : mk_undef("previtem");
		if (!strcmp(name, "nextitem"))
			return i + 1 < n ? l->items->v[i + 1] : mk_undef("nextitem");
		if (!strcmp(name, "cycle"))
			return mk_method(r, o, name);
		return mk_undef(name);
	}
	default: return mk_undef(name);
	}
}

static int64_t as_index(struct rctx *r, const struct val *v)
{
	if (v->t == V_INT)
		return v->u.i;
	if (v->t == V_BOOL)
		return v->u.b;
	fail(&r->c, SFW_E_FORMAT, "indices must be integers, not %s", tname(v->t));
}

static struct val getitem_v(struct rctx *r, struct val o, struct val k)
{
	switch (o.t) {
	case V_UNDEF: undef_error(r, &o);
	case V_DICT:
	case V_NS: {
		struct val *e = dict_find(o.u.d, &k);
		if (e)
			return *e;
		if (k.t == V_STR && o.t == V_DICT) {
			char *nm = alloc(&r->c, k.u.s.n + 1);
			memcpy(nm, k.u.s.p, k.u.s.n);
			nm[k.u.s.n] = 0;
			if (!strcmp(nm, "items") || !strcmp(nm, "keys") || !strcmp(nm, "values") || !strcmp(nm, "get"))
				return mk_method(r, o, nm);
			return mk_undef(nm);
		}
		return mk_undef(NULL);
	}
	case V_LIST: {
		if (k.t == V_STR) {
			char *nm = sdup(&r->c, k.u.s.p, k.u.s.n);
			return getattr_v(r, o, nm);
		}
		int64_t i = as_index(r, &k), n = (int64_t)o.u.l->n;
		if (i < 0)
			i += n;
		if (i < 0 || i >= n)
			return mk_undef("list index");
		return o.u.l->v[i];
	}
	case V_STR: {
		if (k.t == V_STR)
			return getattr_v(r, o, sdup(&r->c, k.u.s.p, k.u.s.n));
		int64_t i = as_index(r, &k), n = (int64_t)u8_count(o.u.s.p, o.u.s.n);
		if (i < 0)
			i += n;
		if (i < 0 || i >= n)
			return mk_undef("string index");
		size_t b = u8_off(o.u.s.p, o.u.s.n, (size_t)i), e = u8_off(o.u.s.p, o.u.s.n, (size_t)i + 1);
		return mk_str(o.u.s.p + b, e - b);
	}
	default:
		if (k.t == V_STR)
			return getattr_v(r, o, sdup(&r->c, k.u.s.p, k.u.s.n));
		return mk_undef(NULL);
	}
}

/* Python slice indices for a sequence of length n */
static void slice_idx(struct rctx *r, int64_t n, const struct val *a, const struct val *b, const struct val *c,
		      int64_t *start, int64_t *stop, int64_t *stepv)
{
	int64_t st = c && c->t != V_NONE && c->t != V_UNDEF ? as_index(r, c) : 1;
	if (st == 0)
		fail(&r->c, SFW_E_FORMAT, "slice step cannot be zero");
	int64_t lo, hi;
	if (st > 0) {
		lo = 0;
		hi = n;
	} else {
		lo = -1;
		hi = n - 1;
	}
	int64_t s0 = st > 0 ? lo : hi, s1 = st > 0 ? hi : lo;
	if (a && a->t != V_NONE && a->t != V_UNDEF) {
		s0 = as_index(r, a);
		if (s0 < 0)
			s0 += n;
		if (s0 < lo)
			s0 = lo;
		if (s0 > hi)
			s0 = hi;
	}
	if (b && b->t != V_NONE && b->t != V_UNDEF) {
		s1 = as_index(r, b);
		if (s1 < 0)
			s1 += n;
		if (s1 < lo)
			s1 = lo;
		if (s1 > hi)
			s1 = hi;
	}
	*start = s0;
	*stop = s1;
	*stepv = st;
}

static struct val slice_v(struct rctx *r, struct val o, struct val *a, struct val *b, struct val *c)
{
	int64_t s0, s1, st;
	if (o.t == V_LIST) {
		slice_idx(r, (int64_t)o.u.l->n, a, b, c, &s0, &s1, &st);
		size_t cnt = 0;
		for (int64_t i = s0; st > 0 ? i < s1 : i > s1; i += st)
			cnt++;
		struct list *l = list_new(r, cnt);
		size_t k = 0;
		for (int64_t i = s0; st > 0 ? i < s1 : i > s1; i += st)
			l->v[k++] = o.u.l->v[i];
		struct val v = {.t = V_LIST};
		v.u.l = l;
		return v;
	}
	if (o.t == V_STR) {
		int64_t n = (int64_t)u8_count(o.u.s.p, o.u.s.n);
		slice_idx(r, n, a, b, c, &s0, &s1, &st);
		struct sb out = {0};
		for (int64_t i = s0; st > 0 ? i < s1 : i > s1; i += st) {
			size_t bo = u8_off(o.u.s.p, o.u.s.n, (size_t)i), eo = u8_off(o.u.s.p, o.u.s.n, (size_t)i + 1);
			sb_add(r, &out, o.u.s.p + bo, eo - bo);
		}
		return mk_str(out.p ? out.p : "", out.n);
	}
	if (o.t == V_UNDEF)
		undef_error(r, &o);
	fail(&r->c, SFW_E_FORMAT, "cannot slice a %s", tname(o.t));
}

static double as_num(struct rctx *r, const struct val *v, const char *op)
{
	if (v->t == V_INT)
		return (double)v->u.i;
	if (v->t == V_FLOAT)
		return v->u.f;
	if (v->t == V_BOOL)
		return v->u.b;
	if (v->t == V_UNDEF)
		undef_error(r, v);
	fail(&r->c, SFW_E_FORMAT, "unsupported operand type %s for %s", tname(v->t), op);
}

static int is_num(const struct val *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }

/* a + b for strings, in one allocation of the exact size (a chain of them
 * over a long message must not pay a doubling buffer per step) */
static struct val concat(struct rctx *r, const struct val *a, const struct val *b)
{
	if (!a->u.s.n)
		return *b;
	if (!b->u.s.n)
		return *a;
	if (a->u.s.n > RENDER_MEM_MAX || b->u.s.n > RENDER_MEM_MAX - a->u.s.n)
		fail(&r->c, SFW_E_RANGE, "a string longer than %zu MiB", RENDER_MEM_MAX >> 20);
	char *p = alloc(&r->c, a->u.s.n + b->u.s.n + 1);
	memcpy(p, a->u.s.p, a->u.s.n);
	memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
	p[a->u.s.n + b->u.s.n] = 0;
	return mk_str(p, a->u.s.n + b->u.s.n);
}

static struct val arith(struct rctx *r, const char *op, struct val a, struct val b)
{
	if (!strcmp(op, "~")) {
		struct val x = str_of(r, &a), y = str_of(r, &b);
		return concat(r, &x, &y);
	}
	if (a.t == V_UNDEF)
		undef_error(r, &a);
	if (b.t == V_UNDEF)
		undef_error(r, &b);
	if (!strcmp(op, "+")) {
		if (a.t == V_STR && b.t == V_STR)
			return concat(r, &a, &b);
		if (a.t == V_LIST && b.t == V_LIST) {
			struct list *l = list_new(r, a.u.l->n + b.u.l->n);
			if (a.u.l->n)
				memcpy(l->v, a.u.l->v, a.u.l->n * sizeof(struct val));
			if (b.u.l->n)
				memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(struct val));
			struct val v = {.t = V_LIST};
			v.u.l = l;
			return v;
		}
	}
	if (!strcmp(op, "*") && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
		struct val s = a.t == V_STR ? a : b;
		int64_t k = a.t == V_INT ? a.u.i : b.u.i;
		struct sb o = {0};
		for (int64_t i = 0; i < k; i++) {
			step(r);
			sb_add(r, &o, s.u.s.p, s.u.s.n);
		}
		return mk_str(o.p ? o.p : "", o.n);
	}
	if (!is_num(&a) || !is_num(&b))
		fail(&r->c, SFW_E_FORMAT, "unsupported operand types for %s: %s and %s", op, tname(a.t), tname(b.t));
	int ints = a.t != V_FLOAT && b.t != V_FLOAT;
	if (ints) {
		int64_t x = a.t == V_BOOL ? a.u.b : a.u.i, y = b.t == V_BOOL ? b.u.b : b.u.i, z;
		if (!strcmp(op, "+")) {
			if (__builtin_add_overflow(x, y, &z))
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			return mk_int(z);
		}
		if (!strcmp(op, "-")) {
			if (__builtin_sub_overflow(x, y, &z))
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			return mk_int(z);
		}
		if (!strcmp(op, "*")) {
			if (__builtin_mul_overflow(x, y, &z))
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			return mk_int(z);
		}
		if (!strcmp(op, "//") || !strcmp(op, "%")) {
			if (y == 0)
				fail(&r->c, SFW_E_FORMAT, "division by zero");
			if (x == INT64_MIN && y == -1)
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			int64_t q = x / y, m = x % y;
			if (m != 0 && ((m < 0) != (y < 0)))
				q--, m += y;
			return !strcmp(op, "//") ? mk_int(q) : mk_int(m);
		}
		if (!strcmp(op, "**")) {
			if (y < 0)
				return mk_float(pow((double)x, (double)y));
			int64_t acc = 1;
			for (int64_t i = 0; i < y; i++) {
				step(r);
				if (__builtin_mul_overflow(acc, x, &acc))
					fail(&r->c, SFW_E_RANGE, "integer overflow");
			}
			return mk_int(acc);
		}
	}
	double x = as_num(r, &a, op), y = as_num(r, &b, op);
	if (!strcmp(op, "+"))
		return mk_float(x + y);
	if (!strcmp(op, "-"))
		return mk_float(x - y);
	if (!strcmp(op, "*"))
		return mk_float(x * y);
	if (!strcmp(op, "**"))
		return mk_float(pow(x, y));
	if (y == 0)
		fail(&r->c, SFW_E_FORMAT, "division by zero");
	if (!strcmp(op, "/"))
		return mk_float(x / y);
	if (!strcmp(op, "//"))
		return mk_float(floor(x / y));
	double m = fmod(x, y);
	if (m != 0 && ((m < 0) != (y < 0)))
		m += y;
	return mk_float(m);
}

static int compare_lt(struct rctx *r, const struct val *a, const struct val *b)
{
	if (is_num(a) && is_num(b))
		return as_num(r, a, "<") < as_num(r, b, "<");
	if (a->t == V_STR && b->t == V_STR) {
		size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
		int c = memcmp(a->u.s.p, b->u.s.p, n);
		return c ? c < 0 : a->u.s.n < b->u.s.n;
	}
	if (a->t == V_LIST && b->t == V_LIST) {
		size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
		for (size_t i = 0; i < n; i++) {
			if (!val_eq(&a->u.l->v[i], &b->u.l->v[i]))
				return compare_lt(r, &a->u.l->v[i], &b->u.l->v[i]);
		}
		return a->u.l->n < b->u.l->n;
	}
	if (a->t == V_UNDEF)
		undef_error(r, a);
	if (b->t == V_UNDEF)
		undef_error(r, b);
	fail(&r->c, SFW_E_FORMAT, "cannot order %s and %s", tname(a->t), tname(b->t));
}

static int contains(struct rctx *r, const struct val *hay, const struct val *needle)
{
	switch (hay->t) {
	case V_STR:
		need_str(r, needle, "'in <string>'");
		if (!needle->u.s.n)
			return 1;
		return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
	case V_LIST:
		for (size_t i = 0; i < hay->u.l->n; i++)
			if (val_eq(&hay->u.l->v[i], needle))
				return 1;
		return 0;
	case V_DICT:
	case V_NS: return dict_find(hay->u.d, needle) != NULL;
	case V_UNDEF: return 0; /* Undefined iterates as empty */
	default: fail(&r->c, SFW_E_FORMAT, "argument of type %s is not iterable", tname(hay->t));
	}
}

/* The items a for loop or a filter iterates: list items, dict keys,
 * string characters; undefined iterates as empty. */
static struct list *iter_items(struct rctx *r, const struct val *v)
{
	switch (v->t) {
	case V_LIST: return v->u.l;
	case V_UNDEF: return list_new(r, 0);
	case V_DICT: {
		struct list *l = list_new(r, v->u.d->n);
		for (size_t i = 0; i < v->u.d->n; i++)
			l->v[i] = v->u.d->k[i];
		return l;
	}
	case V_STR: {
		size_t n = u8_count(v->u.s.p, v->u.s.n);
		struct list *l = list_new(r, n);
		size_t i = 0, k = 0;
		while (i < v->u.s.n) {
			size_t len = u8_len_at(v->u.s.p + i, v->u.s.n - i);
			l->v[k++] = mk_str(v->u.s.p + i, len);
			i += len;
		}
		return l;
	}
	default: fail(&r->c, SFW_E_FORMAT, "a %s is not iterable", tname(v->t));
	}
}

static struct val list_val(struct list *l)
{
	struct val v = {.t = V_LIST};
	v.u.l = l;
	return v;
}

/* -- keyword/positional argument helper -- */
struct args {
	struct val *a;
	size_t na;
	const char **kn;
	struct val *kv;
	size_t nk;
};

static struct val *arg(struct args *A, size_t pos, const char *kw)
{
	if (pos < A->na)
		return &A->a[pos];
	for (size_t i = 0; kw && i < A->nk; i++)
		if (!strcmp(A->kn[i], kw))
			return &A->kv[i];
	return NULL;
}

static int test_v(struct rctx *r, const char *name, struct val v, struct args *A);

/* Attribute path "a.b" of an item, for selectattr/map(attribute=) */
static struct val attr_path(struct rctx *r, struct val v, const struct val *path)
{
	need_str(r, path, "attribute");
	const char *p = path->u.s.p, *e = p + path->u.s.n;
	while (p < e) {
		const char *d = memchr(p, '.', (size_t)(e - p));
		size_t n = d ? (size_t)(d - p) : (size_t)(e - p);
		char *nm = sdup(&r->c, p, n);
		int isnum = n > 0;
		for (size_t i = 0; i < n; i++)
			isnum &= nm[i] >= '0' && nm[i] <= '9';
		v = isnum ? getitem_v(r, v, mk_int(atoll(nm))) : getitem_v(r, v, mk_cstr(nm));
		if (v.t == V_UNDEF)
			return v;
		p += n + (d ? 1 : 0);
	}
	return v;
}

static struct val apply_filter(struct rctx *r, const char *name, struct val v, struct args *A, struct scope *sc);

static struct val filter_v(struct rctx *r, const char *f, struct val v, struct args *A, struct scope *sc)
{
	(void)sc;
	if (!strcmp(f, "tojson")) {
		struct jopt o = {.ascii = 0, .indent = -1, .isep = ", ", .ksep = ": ", .sort = 0};
		struct val *x;
		if ((x = arg(A, 0, "indent")) && x->t != V_NONE) {
			if (x->t != V_INT || x->u.i < 0 || x->u.i > 64)
				fail(&r->c, SFW_E_UNSUPPORTED, "tojson: indent must be an int in 0..64");
			o.indent = (int)x->u.i;
			o.isep = ",";
		}
		if ((x = arg(A, 99, "ensure_ascii")))
			o.ascii = truthy(x);
		if ((x = arg(A, 99, "sort_keys")))
			o.sort = truthy(x);
		if ((x = arg(A, 99, "separators")) && x->t != V_NONE) {
			if (x->t != V_LIST || x->u.l->n != 2 || x->u.l->v[0].t != V_STR || x->u.l->v[1].t != V_STR)
				fail(&r->c, SFW_E_FORMAT, "tojson: separators must be two strings");
			o.isep = sdup(&r->c, x->u.l->v[0].u.s.p, x->u.l->v[0].u.s.n);
			o.ksep = sdup(&r->c, x->u.l->v[1].u.s.p, x->u.l->v[1].u.s.n);
		}
		if (v.t == V_UNDEF)
			undef_error(r, &v);
		struct sb b = {0};
		to_json(r, &b, &v, &o, 0);
		return mk_str(b.p ? b.p : "", b.n);
	}
	if (!strcmp(f, "length") || !strcmp(f, "count")) {
		switch (v.t) {
		case V_STR: return mk_int((int64_t)u8_count(v.u.s.p, v.u.s.n));
		case V_LIST: return mk_int((int64_t)v.u.l->n);
		case V_DICT:
		case V_NS: return mk_int((int64_t)v.u.d->n);
		case V_UNDEF: return mk_int(0);
		default: fail(&r->c, SFW_E_FORMAT, "object of type %s has no len()", tname(v.t));
		}
	}
	if (!strcmp(f, "string"))
		return str_of(r, &v);
	if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape")) {
		if (f[0] == 's')
			return v;
		/* autoescape is off: escape still escapes */
		struct val s = str_of(r, &v);
		struct sb b = {0};
		for (size_t i = 0; i < s.u.s.n; i++) {
			char ch = s.u.s.p[i];
			const char *m = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
			if (m)
				sb_cs(r, &b, m);
			else
				sb_add(r, &b, &ch, 1);
		}
		return mk_str(b.p ? b.p : "", b.n);
	}
	if (!strcmp(f, "trim")) {
		struct val s = str_of(r, &v);
		struct val *ch = arg(A, 0, "chars");
		if (ch && ch->t == V_NONE)
			ch = NULL;
		if (ch)
			need_str(r, ch, "trim");
		size_t b = strip_left(s.u.s.p, s.u.s.n, ch), e = strip_right(s.u.s.p, s.u.s.n, b, ch);
		return mk_str(s.u.s.p + b, e - b);
	}
	if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
		struct val s = str_of(r, &v);
		struct val m = mk_method(r, s, f);
		return call_value(r, m, NULL, 0, NULL, NULL, 0, sc);
	}
	if (!strcmp(f, "default") || !strcmp(f, "d")) {
		struct val *dv = arg(A, 0, "default_value");
		struct val *bo = arg(A, 1, "boolean");
		int use = v.t == V_UNDEF || (bo && truthy(bo) && !truthy(&v));
		return use ? (dv ? *dv : mk_str("", 0)) : v;
	}
	if (!strcmp(f, "join")) {
		struct val *sep = arg(A, 0, "d");
		struct val *at = arg(A, 1, "attribute");
		struct list *l = iter_items(r, &v);
		struct sb b = {0};
		for (size_t i = 0; i < l->n; i++) {
			if (i && sep) {
				struct val s = str_of(r, sep);
				sb_add(r, &b, s.u.s.p, s.u.s.n);
			}
			struct val it = at ? attr_path(r, l->v[i], at) : l->v[i];
			struct val s = str_of(r, &it);
			sb_add(r, &b, s.u.s.p, s.u.s.n);
		}
		return mk_str(b.p ? b.p : "", b.n);
	}
	if (!strcmp(f, "first") || !strcmp(f, "last")) {
		struct list *l = iter_items(r, &v);
		if (!l->n)
			return mk_undef(f);
		return f[0] == 'f' ? l->v[0] : l->v[l->n - 1];
	}
	if (!strcmp(f, "list"))
		return list_val(iter_items(r, &v));
	if (!strcmp(f, "reverse")) {
		if (v.t == V_STR) {
			struct val m1 = mk_int(-1);
			return slice_v(r, v, NULL, NULL, &m1);
		}
		struct list *l = iter_items(r, &v), *o = list_new(r, l->n);
		for (size_t i = 0; i < l->n; i++)
			o->v[i] = l->v[l->n - 1 - i];
		return list_val(o);
	}
	if (!strcmp(f, "items") || !strcmp(f, "dictsort")) {
		if (v.t == V_UNDEF)
			return list_val(list_new(r, 0));
		if (v.t != V_DICT && v.t != V_NS)
			fail(&r->c, SFW_E_FORMAT, "%s wants a mapping, got %s", f, tname(v.t));
		struct list *l = list_new(r, v.u.d->n);
		for (size_t i = 0; i < v.u.d->n; i++) {
			struct list *t = list_new(r, 2);
			t->v[0] = v.u.d->k[i];
			t->v[1] = v.u.d->v[i];
			t->tuple = 1;
			l->v[i] = list_val(t);
		}
		if (f[0] == 'd') { /* sort by key, case-insensitively by default */
			for (size_t i = 1; i < l->n; i++)
				for (size_t j = i; j > 0; j--) {
					struct val a = l->v[j - 1].u.l->v[0], b = l->v[j].u.l->v[0];
					if (a.t == V_STR && b.t == V_STR) {
						struct val la = mk_method(r, a, "lower"), lb = mk_method(r, b, "lower");
						a = call_value(r, la, NULL, 0, NULL, NULL, 0, sc);
						b = call_value(r, lb, NULL, 0, NULL, NULL, 0, sc);
					}
					if (!compare_lt(r, &b, &a))
						break;
					struct val t = l->v[j];
					l->v[j] = l->v[j - 1];
					l->v[j - 1] = t;
				}
		}
		return list_val(l);
	}
	if (!strcmp(f, "int")) {
		struct val *dflt = arg(A, 0, "default");
		if (v.t == V_INT)
			return v;
		if (v.t == V_BOOL)
			return mk_int(v.u.b);
		if (v.t == V_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
			return mk_int((int64_t)v.u.f);
		if (v.t == V_STR) {
			char *s = sdup(&r->c, v.u.s.p, v.u.s.n), *end;
			long long x = strtoll(s, &end, 10);
			while (*end == ' ' || *end == '\n' || *end == '\t')
				end++;
			if (*s && !*end)
				return mk_int(x);
			double d = strtod(s, &end);
			if (*s && !*end && isfinite(d) && fabs(d) < 9.2e18)
				return mk_int((int64_t)d);
		}
		return dflt ? *dflt : mk_int(0);
	}
	if (!strcmp(f, "float")) {
		struct val *dflt = arg(A, 0, "default");
		if (v.t == V_FLOAT)
			return v;
		if (v.t == V_INT)
			return mk_float((double)v.u.i);
		if (v.t == V_BOOL)
			return mk_float(v.u.b);
		if (v.t == V_STR) {
			char *s = sdup(&r->c, v.u.s.p, v.u.s.n), *end;
			double d = strtod(s, &end);
			if (*s && !*end)
				return mk_float(d);
		}
		return dflt ? *dflt : mk_float(0);
	}
	if (!strcmp(f, "abs")) {
		if (v.t == V_INT) {
			if (v.u.i == INT64_MIN)
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			return mk_int(v.u.i < 0 ? -v.u.i : v.u.i);
		}
		return mk_float(fabs(as_num(r, &v, "abs")));
	}
	if (!strcmp(f, "round")) {
		struct val *pr = arg(A, 0, "precision"), *me = arg(A, 1, "method");
		int64_t p = pr ? as_index(r, pr) : 0;
		double x = as_num(r, &v, "round"), m = pow(10.0, (double)p);
		const char *meth = me && me->t == V_STR ? me->u.s.p : "common";
		/* Python's round(): halves go to the even neighbour */
		double y = !strncmp(meth, "floor", 5) ? floor(x * m) / m : !strncmp(meth, "ceil", 4) ? ceil(x * m) / m : nearbyint(x * m) / m;
		return mk_float(y);
	}
	if (!strcmp(f, "replace")) {
		struct val s = str_of(r, &v);
		struct val m = mk_method(r, s, "replace");
		return call_value(r, m, A->a, A->na, A->kn, A->kv, A->nk, sc);
	}
	if (!strcmp(f, "unique")) {
		struct list *l = iter_items(r, &v), *o = list_new(r, l->n);
		size_t k = 0;
		for (size_t i = 0; i < l->n; i++) {
			int seen = 0;
			for (size_t j = 0; j < k && !seen; j++)
				seen = val_eq(&o->v[j], &l->v[i]);
			if (!seen)
				o->v[k++] = l->v[i];
		}
		o->n = k;
		return list_val(o);
	}
	if (!strcmp(f, "sum")) {
		struct list *l = iter_items(r, &v);
		struct val *at = arg(A, 0, "attribute"), *st = arg(A, 1, "start");
		struct val acc = st ? *st : mk_int(0);
		for (size_t i = 0; i < l->n; i++)
			acc = arith(r, "+", acc, at ? attr_path(r, l->v[i], at) : l->v[i]);
		return acc;
	}
	if (!strcmp(f, "max") || !strcmp(f, "min")) {
		struct list *l = iter_items(r, &v);
		if (!l->n)
			return mk_undef(f);
		struct val best = l->v[0];
		for (size_t i = 1; i < l->n; i++) {
			int lt = compare_lt(r, &l->v[i], &best);
			if (f[1] == 'i' ? lt : compare_lt(r, &best, &l->v[i]))
				best = l->v[i];
			(void)lt;
		}
		return best;
	}
	if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
		int attr = strstr(f, "attr") != NULL, keep = f[0] == 's';
		struct list *l = iter_items(r, &v), *o = list_new(r, l->n);
		size_t k = 0, first = attr ? 1 : 0;
		struct val *path = attr ? arg(A, 0, NULL) : NULL;
		if (attr && !path)
			fail(&r->c, SFW_E_FORMAT, "%s needs an attribute", f);
		struct val *tn = arg(A, first, NULL);
		for (size_t i = 0; i < l->n; i++) {
			struct val it = attr ? attr_path(r, l->v[i], path) : l->v[i];
			int ok;
			if (!tn)
				ok = truthy(&it);
			else {
				need_str(r, tn, f);
				struct args T = {A->a + first + 1, A->na > first + 1 ? A->na - first - 1 : 0, NULL, NULL, 0};
				ok = test_v(r, sdup(&r->c, tn->u.s.p, tn->u.s.n), it, &T);
			}
			if (ok == keep)
				o->v[k++] = l->v[i];
		}
		o->n = k;
		return list_val(o);
	}
	if (!strcmp(f, "map")) {
		struct list *l = iter_items(r, &v), *o = list_new(r, l->n);
		struct val *at = arg(A, 99, "attribute");
		if (at) {
			struct val *df = arg(A, 99, "default");
			for (size_t i = 0; i < l->n; i++) {
				o->v[i] = attr_path(r, l->v[i], at);
				if (o->v[i].t == V_UNDEF && df)
					o->v[i] = *df;
			}
			return list_val(o);
		}
		struct val *fn = arg(A, 0, NULL);
		if (!fn || fn->t != V_STR)
			fail(&r->c, SFW_E_FORMAT, "map needs a filter name or attribute=");
		const char *fname = sdup(&r->c, fn->u.s.p, fn->u.s.n);
		struct args F = {A->a + 1, A->na - 1, A->kn, A->kv, A->nk};
		for (size_t i = 0; i < l->n; i++)
			o->v[i] = apply_filter(r, fname, l->v[i], &F, sc);
		return list_val(o);
	}
	if (!strcmp(f, "indent")) {
		struct val s = str_of(r, &v);
		struct val *w = arg(A, 0, "width"), *fi = arg(A, 1, "first"), *bl = arg(A, 2, "blank");
		struct sb pad = {0};
		if (w && w->t == V_STR)
			sb_add(r, &pad, w->u.s.p, w->u.s.n);
		else {
			int64_t n = w ? as_index(r, w) : 4;
			for (int64_t i = 0; i < n && i < 1024; i++)
				sb_cs(r, &pad, " ");
		}
		struct sb o = {0};
		size_t i = 0;
		int firstline = 1;
		while (i <= s.u.s.n) {
			const char *nl = memchr(s.u.s.p + i, '\n', s.u.s.n - i);
			size_t e = nl ? (size_t)(nl - s.u.s.p) : s.u.s.n;
			int blank = e == i;
			if ((firstline ? (fi && truthy(fi)) : 1) && (!blank || (bl && truthy(bl))) && pad.n)
				sb_add(r, &o, pad.p, pad.n);
			sb_add(r, &o, s.u.s.p + i, e - i);
			if (!nl)
				break;
			sb_cs(r, &o, "\n");
			i = e + 1;
			firstline = 0;
		}
		return mk_str(o.p ? o.p : "", o.n);
	}
	if (!strcmp(f, "wordcount")) {
		struct val s = str_of(r, &v);
		int64_t n = 0;
		int in = 0;
		for (size_t i = 0; i < s.u.s.n; i++) {
			unsigned char ch = (unsigned char)s.u.s.p[i];
			int w = ch >= 0x80 || (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
			if (w && !in)
				n++;
			in = w;
		}
		return mk_int(n);
	}
	if (!strcmp(f, "batch") || !strcmp(f, "sort") || !strcmp(f, "groupby") || !strcmp(f, "center") ||
	    !strcmp(f, "format") || !strcmp(f, "pprint") || !strcmp(f, "urlencode") || !strcmp(f, "xmlattr"))
		fail(&r->c, SFW_E_UNSUPPORTED, "the '%s' filter is not supported", f);
	fail(&r->c, SFW_E_FORMAT, "no filter named '%.40s'", f);
}

static struct val apply_filter(struct rctx *r, const char *name, struct val v, struct args *A, struct scope *sc)
{
	return filter_v(r, name, v, A, sc);
}

static int test_v(struct rctx *r, const char *t, struct val v, struct args *A)
{
	struct val *x = arg(A, 0, NULL);
	if (!strcmp(t, "defined"))
		return v.t != V_UNDEF;
	if (!strcmp(t, "undefined"))
		return v.t == V_UNDEF;
	if (!strcmp(t, "none"))
		return v.t == V_NONE;
	if (!strcmp(t, "string"))
		return v.t == V_STR;
	if (!strcmp(t, "number"))
		return v.t == V_INT || v.t == V_FLOAT;
	if (!strcmp(t, "integer"))
		return v.t == V_INT;
	if (!strcmp(t, "float"))
		return v.t == V_FLOAT;
	if (!strcmp(t, "boolean"))
		return v.t == V_BOOL;
	if (!strcmp(t, "true"))
		return v.t == V_BOOL && v.u.b;
	if (!strcmp(t, "false"))
		return v.t == V_BOOL && !v.u.b;
	if (!strcmp(t, "mapping"))
		return v.t == V_DICT || v.t == V_NS;
	if (!strcmp(t, "sequence"))
		return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
	if (!strcmp(t, "iterable"))
		return v.t == V_LIST || v.t == V_STR || v.t == V_DICT || v.t == V_NS;
	if (!strcmp(t, "callable"))
		return v.t == V_MACRO || v.t == V_FUNC || v.t == V_METHOD;
	if (!strcmp(t, "odd") || !strcmp(t, "even")) {
		if (v.t != V_INT)
			fail(&r->c, SFW_E_FORMAT, "test %s wants an int", t);
		return (v.u.i % 2 != 0) == (t[0] == 'o');
	}
	if (!strcmp(t, "divisibleby")) {
		if (!x || v.t != V_INT || x->t != V_INT || x->u.i == 0)
			fail(&r->c, SFW_E_FORMAT, "divisibleby wants two non-zero ints");
		return v.u.i % x->u.i == 0;
	}
	if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
		if (v.t != V_STR)
			return 0;
		int any = 0;
		for (size_t i = 0; i < v.u.s.n; i++) {
			char ch = v.u.s.p[i];
			if ((t[0] == 'l' && ch >= 'A' && ch <= 'Z') || (t[0] == 'u' && ch >= 'a' && ch <= 'z'))
				return 0;
			any |= (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
		}
		return any;
	}
	if (!x)
		fail(&r->c, SFW_E_FORMAT, "no test named '%.40s', or it needs an argument", t);
	if (!strcmp(t, "in"))
		return contains(r, x, &v);
	if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "=="))
		return val_eq(&v, x);
	if (!strcmp(t, "ne") || !strcmp(t, "!="))
		return !val_eq(&v, x);
	if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<"))
		return compare_lt(r, &v, x);
	if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">"))
		return compare_lt(r, x, &v);
	if (!strcmp(t, "le") || !strcmp(t, "<="))
		return !compare_lt(r, x, &v);
	if (!strcmp(t, "ge") || !strcmp(t, ">="))
		return !compare_lt(r, &v, x);
	if (!strcmp(t, "sameas"))
		return (v.t == x->t && (v.t == V_NONE || v.t == V_UNDEF || (v.t == V_BOOL && v.u.b == x->u.b))) ||
		       (v.t == x->t && (v.t == V_LIST || v.t == V_DICT || v.t == V_NS) && v.u.d == x->u.d);
	fail(&r->c, SFW_E_FORMAT, "no test named '%.40s'", t);
}

/* -- string methods -- */

static struct val split_v(struct rctx *r, struct val s, struct val *sep, struct val *maxs, int right)
{
	int64_t maxsplit = maxs && maxs->t != V_NONE ? as_index(r, maxs) : -1;
	struct vec out = {0};
	const char *p = s.u.s.p;
	size_t n = s.u.s.n;
	if (!sep || sep->t == V_NONE) {
		/* runs of whitespace; leading/trailing ignored */
		if (!right) {
			size_t i = 0;
			int64_t done = 0;
			for (;;) {
				i += strip_left(p + i, n - i, NULL);
				if (i >= n)
					break;
				if (maxsplit >= 0 && done >= maxsplit) {
					size_t e = strip_right(p, n, i, NULL);
					struct val *v = alloc(&r->c, sizeof(*v));
					*v = mk_str(p + i, e - i);
					vpush(&r->c, &out, v);
					break;
				}
				size_t b = i;
				while (i < n && !py_space_at(p + i, n - i))
					i += u8_len_at(p + i, n - i);
				struct val *v = alloc(&r->c, sizeof(*v));
				*v = mk_str(p + b, i - b);
				vpush(&r->c, &out, v);
				done++;
			}
		} else {
			size_t e = n;
			int64_t done = 0;
			struct vec rev = {0};
			for (;;) {
				e = strip_right(p, e, 0, NULL);
				if (e == 0)
					break;
				if (maxsplit >= 0 && done >= maxsplit) {
					size_t b = strip_left(p, e, NULL);
					struct val *v = alloc(&r->c, sizeof(*v));
					*v = mk_str(p + b, e - b);
					vpush(&r->c, &rev, v);
					break;
				}
				size_t b = e;
				while (b > 0) {
					size_t k = b - 1;
					while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80)
						k--;
					if (py_space_at(p + k, b - k) == b - k)
						break;
					b = k;
				}
				struct val *v = alloc(&r->c, sizeof(*v));
				*v = mk_str(p + b, e - b);
				vpush(&r->c, &rev, v);
				e = b;
				done++;
			}
			for (size_t i = rev.n; i-- > 0;)
				vpush(&r->c, &out, rev.v[i]);
		}
	} else {
		need_str(r, sep, "split");
		if (!sep->u.s.n)
			fail(&r->c, SFW_E_FORMAT, "empty separator");
		const char *q = sep->u.s.p;
		size_t qn = sep->u.s.n;
		if (!right) {
			size_t i = 0;
			int64_t done = 0;
			for (;;) {
				const char *h = (maxsplit >= 0 && done >= maxsplit) ? NULL : memmem(p + i, n - i, q, qn);
				struct val *v = alloc(&r->c, sizeof(*v));
				if (!h) {
					*v = mk_str(p + i, n - i);
					vpush(&r->c, &out, v);
					break;
				}
				*v = mk_str(p + i, (size_t)(h - (p + i)));
				vpush(&r->c, &out, v);
				i = (size_t)(h - p) + qn;
				done++;
				step(r);
			}
		} else {
			struct vec rev = {0};
			size_t e = n;
			int64_t done = 0;
			for (;;) {
				const char *h = NULL;
				if (!(maxsplit >= 0 && done >= maxsplit) && e >= qn)
					for (size_t k = e - qn + 1; k-- > 0;)
						if (!memcmp(p + k, q, qn)) {
							h = p + k;
							break;
						}
				struct val *v = alloc(&r->c, sizeof(*v));
				if (!h) {
					*v = mk_str(p, e);
					vpush(&r->c, &rev, v);
					break;
				}
				*v = mk_str(h + qn, e - (size_t)(h - p) - qn);
				vpush(&r->c, &rev, v);
				e = (size_t)(h - p);
				done++;
				step(r);
			}
			for (size_t i = rev.n; i-- > 0;)
				vpush(&r->c, &out, rev.v[i]);
		}
	}
	struct list *l = list_new(r, out.n);
	for (size_t i = 0; i < out.n; i++)
		l->v[i] = *(struct val *)out.v[i];
	return list_val(l);
}

static struct val str_method(struct rctx *r, struct val s, const char *m, struct args *A)
{
	const char *p = s.u.s.p;
	size_t n = s.u.s.n;
	if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
		struct val *ch = arg(A, 0, "chars");
		if (ch && ch->t == V_NONE)
			ch = NULL;
		if (ch)
			need_str(r, ch, m);
		size_t b = m[0] == 'r' ? 0 : strip_left(p, n, ch);
		size_t e = m[0] == 'l' ? n : strip_right(p, n, b, ch);
		return mk_str(p + b, e - b);
	}
	if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
		return split_v(r, s, arg(A, 0, "sep"), arg(A, 1, "maxsplit"), m[0] == 'r');
	if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
		struct val *x = arg(A, 0, NULL);
		if (!x)
			fail(&r->c, SFW_E_FORMAT, "%s needs an argument", m);
		struct list one = {x, 1, 0};
		struct list *alts = x->t == V_LIST ? x->u.l : &one;
		for (size_t i = 0; i < alts->n; i++) {
			need_str(r, &alts->v[i], m);
			size_t k = alts->v[i].u.s.n;
			if (k <= n && !memcmp(m[0] == 's' ? p : p + n - k, alts->v[i].u.s.p, k))
				return mk_bool(1);
		}
		return mk_bool(0);
	}
	if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
		/* ASCII letters only; other characters are unchanged */
		char *o = alloc(&r->c, n + 1);
		int prev_alpha = 0;
		for (size_t i = 0; i < n; i++) {
			char ch = p[i];
			int up = ch >= 'a' && ch <= 'z', lo = ch >= 'A' && ch <= 'Z';
			int toup = m[0] == 'u' ? 1 : m[0] == 'l' ? 0 : m[0] == 't' ? !prev_alpha : i == 0;
			if (toup && up)
				ch = (char)(ch - 32);
			else if (!toup && lo)
				ch = (char)(ch + 32);
			o[i] = ch;
			prev_alpha = up || lo || ((unsigned char)ch >= 0x80);
		}
		o[n] = 0;
		return mk_str(o, n);
	}
	if (!strcmp(m, "replace")) {
		struct val *a = arg(A, 0, "old"), *b = arg(A, 1, "new"), *cnt = arg(A, 2, "count");
		if (!a || !b)
			fail(&r->c, SFW_E_FORMAT, "replace needs two arguments");
		need_str(r, a, "replace");
		need_str(r, b, "replace");
		int64_t max = cnt ? as_index(r, cnt) : -1;
		struct sb o = {0};
		size_t i = 0;
		int64_t done = 0;
		if (!a->u.s.n) { /* Python inserts new between characters */
			while (i <= n) {
				if (max < 0 || done < max) {
					sb_add(r, &o, b->u.s.p, b->u.s.n);
					done++;
				}
				if (i == n)
					break;
				size_t l = u8_len_at(p + i, n - i);
				sb_add(r, &o, p + i, l);
				i += l;
			}
			return mk_str(o.p ? o.p : "", o.n);
		}
		while (i < n) {
			const char *h = (max >= 0 && done >= max) ? NULL : memmem(p + i, n - i, a->u.s.p, a->u.s.n);
			if (!h) {
				sb_add(r, &o, p + i, n - i);
				break;
			}
			sb_add(r, &o, p + i, (size_t)(h - p) - i);
			sb_add(r, &o, b->u.s.p, b->u.s.n);
			i = (size_t)(h - p) + a->u.s.n;
			done++;
		}
		return mk_str(o.p ? o.p : "", o.n);
	}
	if (!strcmp(m, "find") || !strcmp(m, "index") || !strcmp(m, "count")) {
		struct val *x = arg(A, 0, NULL);
		if (!x)
			fail(&r->c, SFW_E_FORMAT, "%s needs an argument", m);
		need_str(r, x, m);
		if (m[0] == 'c') {
			if (!x->u.s.n)
				return mk_int((int64_t)u8_count(p, n) + 1);
			int64_t k = 0;
			size_t i = 0;
			const char *h;
			while (i <= n && (h = memmem(p + i, n - i, x->u.s.p, x->u.s.n))) {
				k++;
				i = (size_t)(h - p) + x->u.s.n;
			}
			return mk_int(k);
		}
		const char *h = memmem(p, n, x->u.s.p, x->u.s.n);
		if (!h && m[0] == 'i')
			fail(&r->c, SFW_E_FORMAT, "substring not found");
		return mk_int(h ? (int64_t)u8_count(p, (size_t)(h - p)) : -1);
	}
	if (!strcmp(m, "join")) {
		struct val *x = arg(A, 0, NULL);
		if (!x)
			fail(&r->c, SFW_E_FORMAT, "join needs an argument");
		struct list *l = iter_items(r, x);
		struct sb o = {0};
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				sb_add(r, &o, p, n);
			need_str(r, &l->v[i], "join");
			sb_add(r, &o, l->v[i].u.s.p, l->v[i].u.s.n);
		}
		return mk_str(o.p ? o.p : "", o.n);
	}
	if (!strcmp(m, "splitlines")) {
		struct vec out = {0};
		size_t i = 0;
		while (i < n) {
			const char *nl = memchr(p + i, '\n', n - i);
			size_t e = nl ? (size_t)(nl - p) : n;
			struct val *v = alloc(&r->c, sizeof(*v));
			size_t ee = e > i && p[e - 1] == '\r' ? e - 1 : e;
			*v = mk_str(p + i, ee - i);
			vpush(&r->c, &out, v);
			i = e + 1;
		}
		struct list *l = list_new(r, out.n);
		for (size_t k = 0; k < out.n; k++)
			l->v[k] = *(struct val *)out.v[k];
		return list_val(l);
	}
	if (!strncmp(m, "is", 2)) {
		if (!n)
			return mk_bool(0);
		for (size_t i = 0; i < n; i++) {
			unsigned char ch = (unsigned char)p[i];
			int ok = !strcmp(m, "isdigit") ? (ch >= '0' && ch <= '9')
				 : !strcmp(m, "isspace") ? (py_space_at(p + i, n - i) > 0)
				 : !strcmp(m, "isalpha") ? ((ch | 32) >= 'a' && (ch | 32) <= 'z')
				 : !strcmp(m, "isalnum") ? (((ch | 32) >= 'a' && (ch | 32) <= 'z') || (ch >= '0' && ch <= '9'))
				 : !strcmp(m, "islower") ? !(ch >= 'A' && ch <= 'Z')
							 : !(ch >= 'a' && ch <= 'z');
			if (!ok)
				return mk_bool(0);
		}
		return mk_bool(1);
	}
	fail(&r->c, SFW_E_UNSUPPORTED, "str.%s is not supported", m);
}

static struct val exec_macro(struct rctx *r, struct macro *m, struct args *A)
{
	struct node *d = m->def;
	struct scope *s = scope_new(r, m->closure);
	for (size_t i = 0; i < d->nnames; i++) {
		struct val *v = arg(A, i, d->names[i]);
		if (v)
			scope_set(r, s, d->names[i], *v);
		else if (d->kv[i])
			scope_set(r, s, d->names[i], eval(r, d->kv[i], s));
		else
			scope_set(r, s, d->names[i], mk_undef(d->names[i]));
	}
	if (A->na > d->nnames)
		fail(&r->c, SFW_E_FORMAT, "macro '%s' takes %zu arguments, got %zu", d->s ? d->s : "caller",
		     d->nnames, A->na);
	for (size_t k = 0; k < A->nk; k++) {
		size_t i = 0;
		while (i < d->nnames && strcmp(d->names[i], A->kn[k]))
			i++;
		if (i == d->nnames)
			fail(&r->c, SFW_E_FORMAT, "macro '%s' takes no keyword argument '%.40s'", d->s ? d->s : "caller",
			     A->kn[k]);
	}
	if (m->caller.t == V_MACRO)
		scope_set(r, s, "caller", m->caller);
	struct sb out = {0};
	rdepth(r, 1);
	exec_body(r, d->b, s, &out);
	rdepth(r, -1);
	r->brk = 0;
	return mk_str(out.p ? out.p : "", out.n);
}

static struct val call_value(struct rctx *r, struct val f, struct val *a, size_t na, const char **kn, struct val *kv,
			     size_t nk, struct scope *sc)
{
	(void)sc;
	step(r);
	struct args A = {a, na, kn, kv, nk};
	if (f.t == V_MACRO)
		return exec_macro(r, f.u.m, &A);
	if (f.t == V_METHOD) {
		struct method *m = f.u.me;
		if (m->self.t == V_STR)
			return str_method(r, m->self, m->name, &A);
		if (m->self.t == V_DICT) {
			struct dict *d = m->self.u.d;
			if (!strcmp(m->name, "get")) {
				struct val *k = arg(&A, 0, NULL), *df = arg(&A, 1, NULL);
				if (!k)
					fail(&r->c, SFW_E_FORMAT, "get needs a key");
				struct val *e = dict_find(d, k);
				return e ? *e : df ? *df : mk_none();
			}
			struct list *l = list_new(r, d->n);
			for (size_t i = 0; i < d->n; i++) {
				if (m->name[0] == 'k')
					l->v[i] = d->k[i];
				else if (m->name[0] == 'v')
					l->v[i] = d->v[i];
				else {
					struct list *t = list_new(r, 2);
					t->v[0] = d->k[i];
					t->v[1] = d->v[i];
					t->tuple = 1;
					l->v[i] = list_val(t);
				}
			}
			return list_val(l);
		}
		if (m->self.t == V_LIST) {
			struct val *x = arg(&A, 0, NULL);
			if (!x)
				fail(&r->c, SFW_E_FORMAT, "list.%s needs an argument", m->name);
			int64_t k = 0;
			for (size_t i = 0; i < m->self.u.l->n; i++)
				if (val_eq(&m->self.u.l->v[i], x)) {
					if (m->name[0] == 'i')
						return mk_int((int64_t)i);
					k++;
				}
			if (m->name[0] == 'i')
				fail(&r->c, SFW_E_FORMAT, "value is not in list");
			return mk_int(k);
		}
		if (m->self.t == V_LOOP) { /* loop.cycle(a, b, ...) */
			if (!na)
				fail(&r->c, SFW_E_FORMAT, "loop.cycle needs arguments");
			return a[m->self.u.lp->idx % na];
		}
	}
	if (f.t == V_FUNC) {
		switch (f.u.fn) {
		case F_RAISE: {
			struct val *x = arg(&A, 0, NULL);
			struct val s = x ? str_of(r, x) : mk_cstr("raise_exception");
			sfw_fail(r->c.err, SFW_E_INVAL, "%s: %.*s", r->c.what, (int)(s.u.s.n > 200 ? 200 : s.u.s.n), s.u.s.p);
			r->c.st = SFW_E_INVAL;
			longjmp(r->c.jb, 1);
		}
		case F_NAMESPACE:
		case F_DICT: {
			struct dict *d = dict_new(r, nk + 4);
			for (size_t i = 0; i < na; i++) {
				if (a[i].t != V_DICT && a[i].t != V_NS)
					fail(&r->c, SFW_E_FORMAT, "namespace()/dict() takes mappings and keywords");
				for (size_t k = 0; k < a[i].u.d->n; k++)
					dict_put(r, d, a[i].u.d->k[k], a[i].u.d->v[k]);
			}
			for (size_t i = 0; i < nk; i++)
				dict_put(r, d, mk_cstr(kn[i]), kv[i]);
			struct val v = {.t = f.u.fn == F_NAMESPACE ? V_NS : V_DICT};
			v.u.d = d;
			return v;
		}
		case F_RANGE: {
			int64_t lo = 0, hi, st = 1;
			if (na == 1)
				hi = as_index(r, &a[0]);
			else if (na == 2 || na == 3) {
				lo = as_index(r, &a[0]);
				hi = as_index(r, &a[1]);
				if (na == 3)
					st = as_index(r, &a[2]);
			} else
				fail(&r->c, SFW_E_FORMAT, "range takes 1 to 3 arguments");
			if (st == 0)
				fail(&r->c, SFW_E_FORMAT, "range step must not be zero");
			int64_t cnt = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
			if (cnt > 100000)
				fail(&r->c, SFW_E_RANGE, "range of more than 100000 items");
			struct list *l = list_new(r, (size_t)cnt);
			for (int64_t i = 0; i < cnt; i++)
				l->v[i] = mk_int(lo + i * st);
			return list_val(l);
		}
		case F_STRFTIME:
			fail(&r->c, SFW_E_UNSUPPORTED, "strftime_now is not supported (renders would not be reproducible)");
		}
	}
	if (f.t == V_UNDEF)
		undef_error(r, &f);
	fail(&r->c, SFW_E_FORMAT, "a %s is not callable", tname(f.t));
}

static void eval_args(struct rctx *r, struct node *x, struct scope *sc, struct args *A)
{
	A->na = x->nv;
	A->a = x->nv ? alloc(&r->c, x->nv * sizeof(struct val)) : NULL;
	for (size_t i = 0; i < x->nv; i++)
		A->a[i] = eval(r, x->v[i], sc);
	A->nk = x->nnames;
	A->kn = x->names;
	A->kv = x->nnames ? alloc(&r->c, x->nnames * sizeof(struct val)) : NULL;
	for (size_t i = 0; i < x->nnames; i++)
		A->kv[i] = eval(r, x->kv[i], sc);
}

static struct val eval(struct rctx *r, struct node *x, struct scope *sc)
{
	r->c.line = x->line;
	rdepth(r, 1);
	struct val v;
	switch (x->k) {
	case N_CONST: v = x->cv; break;
	case N_NAME:
		if (!scope_get(sc, x->s, &v))
			v = mk_undef(x->s);
		break;
	case N_ATTR: v = getattr_v(r, eval(r, x->a, sc), x->s); break;
	case N_ITEM: {
		struct val o = eval(r, x->a, sc);
		v = getitem_v(r, o, eval(r, x->b, sc));
		break;
	}
	case N_SLICE: {
		struct val o = eval(r, x->a, sc), a, b, c;
		if (x->b)
			a = eval(r, x->b, sc);
		if (x->c)
			b = eval(r, x->c, sc);
		if (x->d)
			c = eval(r, x->d, sc);
		v = slice_v(r, o, x->b ? &a : NULL, x->c ? &b : NULL, x->d ? &c : NULL);
		break;
	}
	case N_CALL: {
		struct val f = eval(r, x->a, sc);
		struct args A;
		eval_args(r, x, sc, &A);
		v = call_value(r, f, A.a, A.na, A.kn, A.kv, A.nk, sc);
		break;
	}
	case N_FILTER: {
		struct val o = eval(r, x->a, sc);
		struct args A;
		eval_args(r, x, sc, &A);
		v = filter_v(r, x->s, o, &A, sc);
		break;
	}
	case N_TEST: {
		struct val o = eval(r, x->a, sc);
		struct args A;
		eval_args(r, x, sc, &A);
		v = mk_bool(test_v(r, x->s, o, &A) != x->neg);
		break;
	}
	case N_NOT: {
		struct val o = eval(r, x->a, sc);
		v = mk_bool(!truthy(&o));
		break;
	}
	case N_NEG:
	case N_POS: {
		struct val o = eval(r, x->a, sc);
		if (x->k == N_POS)
			v = o;
		else if (o.t == V_INT) {
			if (o.u.i == INT64_MIN)
				fail(&r->c, SFW_E_RANGE, "integer overflow");
			v = mk_int(-o.u.i);
		} else
			v = mk_float(-as_num(r, &o, "unary -"));
		break;
	}
	case N_BIN: {
		struct val a = eval(r, x->a, sc);
		v = arith(r, x->s, a, eval(r, x->b, sc));
		break;
	}
	case N_CMP: {
		struct val a = eval(r, x->a, sc);
		int ok = 1;
		for (size_t i = 0; i < x->nnames && ok; i++) {
			struct val b = eval(r, x->v[i], sc);
			const char *op = x->names[i];
			if (!strcmp(op, "=="))
				ok = val_eq(&a, &b);
			else if (!strcmp(op, "!="))
				ok = !val_eq(&a, &b);
			else if (!strcmp(op, "<"))
				ok = compare_lt(r, &a, &b);
			else if (!strcmp(op, ">"))
				ok = compare_lt(r, &b, &a);
			else if (!strcmp(op, "<="))
				ok = !compare_lt(r, &b, &a);
			else if (!strcmp(op, ">="))
				ok = !compare_lt(r, &a, &b);
			else if (!strcmp(op, "in"))
				ok = contains(r, &b, &a);
			else
				ok = !contains(r, &b, &a);
			a = b;
		}
		v = mk_bool(ok);
		break;
	}
	case N_AND: {
		struct val a = eval(r, x->a, sc);
		v = truthy(&a) ? eval(r, x->b, sc) : a;
		break;
	}
	case N_OR: {
		struct val a = eval(r, x->a, sc);
		v = truthy(&a) ? a : eval(r, x->b, sc);
		break;
	}
	case N_COND: {
		struct val c = eval(r, x->b, sc);
		v = truthy(&c) ? eval(r, x->a, sc) : x->c ? eval(r, x->c, sc) : mk_undef(NULL);
		break;
	}
	case N_LIST:
	case N_TUPLE: {
		struct list *l = list_new(r, x->nv);
		for (size_t i = 0; i < x->nv; i++)
			l->v[i] = eval(r, x->v[i], sc);
		l->tuple = x->k == N_TUPLE;
		v = list_val(l);
		break;
	}
	case N_DICT: {
		struct dict *d = dict_new(r, x->nv);
		for (size_t i = 0; i < x->nv; i++) {
			struct val k = eval(r, x->v[i], sc);
			dict_put(r, d, k, eval(r, x->kv[i], sc));
		}
		v = (struct val){.t = V_DICT};
		v.u.d = d;
		break;
	}
	default: fail(&r->c, SFW_E_FORMAT, "internal: a statement in an expression");
	}
	rdepth(r, -1);
	return v;
}

static void emit(struct rctx *r, struct sb *out, const char *s, size_t n)
{
	if (out) {
		sb_add(r, out, s, n);
		return;
	}
	enum sfw_status st = sfw_buf_append(r->out, s, n);
	if (st == SFW_E_RANGE)
		fail(&r->c, SFW_E_RANGE, "the rendered prompt is longer than %zu bytes", r->out->max);
	if (st != SFW_OK)
		fail(&r->c, SFW_E_NOMEM, "out of memory for the rendered prompt");
}

static void bind_targets(struct rctx *r, struct node *x, struct scope *s, struct val item)
{
	if (x->nnames == 1) {
		scope_set(r, s, x->names[0], item);
		return;
	}
	struct list *l = iter_items(r, &item);
	if (l->n != x->nnames)
		fail(&r->c, SFW_E_FORMAT, "cannot unpack %zu values into %zu names", l->n, x->nnames);
	for (size_t i = 0; i < x->nnames; i++)
		scope_set(r, s, x->names[i], l->v[i]);
}

static void exec_stmt(struct rctx *r, struct node *x, struct scope *sc, struct sb *out)
{
	r->c.line = x->line;
	switch (x->k) {
	case N_TEXT: emit(r, out, x->s, x->sn); break;
	case N_OUT: {
		struct val v = eval(r, x->a, sc);
		struct val s = str_of(r, &v);
		emit(r, out, s.u.s.p, s.u.s.n);
		break;
	}
	case N_BODY: exec_body(r, x, sc, out); break;
	case N_IF: {
		struct val c = eval(r, x->a, sc);
		if (truthy(&c))
			exec_body(r, x->b, sc, out);
		else if (x->c)
			exec_stmt(r, x->c, sc, out);
		break;
	}
	case N_FOR: {
		struct val it = eval(r, x->a, sc);
		if (it.t == V_NONE)
			fail(&r->c, SFW_E_FORMAT, "'NoneType' object is not iterable");
		struct list *all = iter_items(r, &it);
		struct list *items = all;
		if (x->d) { /* the loop filter: evaluated with the targets bound */
			items = list_new(r, all->n);
			size_t k = 0;
			for (size_t i = 0; i < all->n; i++) {
				step(r);
				struct scope *f = scope_new(r, sc);
				bind_targets(r, x, f, all->v[i]);
				struct val c = eval(r, x->d, f);
				if (truthy(&c))
					items->v[k++] = all->v[i];
			}
			items->n = k;
		}
		struct loopst *ls = alloc(&r->c, sizeof(*ls));
		ls->items = items;
		struct val lv = {.t = V_LOOP};
		lv.u.lp = ls;
		rdepth(r, 1);
		for (size_t i = 0; i < items->n; i++) {
			step(r);
			ls->idx = i;
			struct scope *s = scope_new(r, sc);
			scope_set(r, s, "loop", lv);
			bind_targets(r, x, s, items->v[i]);
			exec_body(r, x->b, s, out);
			if (r->brk == 1) {
				r->brk = 0;
				break;
			}
			r->brk = 0;
		}
		rdepth(r, -1);
		if (!items->n && x->c)
			exec_body(r, x->c, sc, out);
		break;
	}
	case N_SET: {
		struct val v = eval(r, x->a, sc);
		if (x->names[0]) {
			struct val ns;
			if (!scope_get(sc, x->s, &ns) || ns.t != V_NS)
				fail(&r->c, SFW_E_FORMAT, "cannot assign attribute on non-namespace object '%s'", x->s);
			dict_put(r, ns.u.d, mk_cstr(x->names[0]), v);
		} else
			scope_set(r, sc, x->s, v);
		break;
	}
	case N_SETBLOCK: {
		struct sb b = {0};
		exec_body(r, x->b, sc, &b);
		scope_set(r, sc, x->s, mk_str(b.p ? b.p : "", b.n));
		break;
	}
	case N_MACRO: {
		struct macro *m = alloc(&r->c, sizeof(*m));
		m->def = x;
		m->closure = sc;
		m->caller = mk_undef(NULL);
		struct val v = {.t = V_MACRO};
		v.u.m = m;
		scope_set(r, sc, x->s, v);
		break;
	}
	case N_CALLBLOCK: {
		struct macro *cm = alloc(&r->c, sizeof(*cm));
		cm->def = x;
		cm->closure = sc;
		cm->caller = mk_undef(NULL);
		struct val cv = {.t = V_MACRO};
		cv.u.m = cm;
		struct node *call = x->a;
		struct val f = eval(r, call->a, sc);
		if (f.t != V_MACRO)
			fail(&r->c, SFW_E_FORMAT, "{%% call %%} needs a macro");
		struct args A;
		eval_args(r, call, sc, &A);
		struct macro tmp = *f.u.m;
		tmp.caller = cv;
		step(r);
		struct val res = exec_macro(r, &tmp, &A);
		emit(r, out, res.u.s.p, res.u.s.n);
		break;
	}
	case N_BREAK: r->brk = 1; break;
	case N_CONTINUE: r->brk = 2; break;
	default: fail(&r->c, SFW_E_FORMAT, "internal: an expression as a statement");
	}
}

static void exec_body(struct rctx *r, struct node *b, struct scope *sc, struct sb *out)
{
	rdepth(r, 1);
	for (size_t i = 0; i < b->nv && !r->brk; i++)
		exec_stmt(r, b->v[i], sc, out);
	rdepth(r, -1);
}

enum sfw_status sfwi_jinja_render(const struct sfwi_jinja *j, const cJSON *vars, struct sfw_buf *out,
				  struct sfw_err *err)
{
	/* working memory: 256 MiB, more for a caller that allows long output
	 * (each long string may be copied a few times on its way out) */
	size_t cap = RENDER_MEM_MAX;
	if (out->max < (SIZE_MAX - cap) / 4)
		cap += 4 * out->max;
	struct arena ar = {.cap = cap};
	struct rctx r = {.c = {.err = err, .ar = &ar, .what = j->what}, .out = out};
	size_t len0 = out->len;
	if (setjmp(r.c.jb)) {
		arena_free(&ar);
		if (out->data) { /* nothing half-rendered is left behind */
			out->len = len0;
			out->data[len0] = 0;
		}
		return r.c.st;
	}
	struct scope *g = scope_new(&r, NULL);
	static const struct {
		const char *name;
		int fn;
	} fns[] = {{"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"raise_exception", F_RAISE}, {"dict", F_DICT},
		   {"strftime_now", F_STRFTIME}};
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		struct val f = {.t = V_FUNC};
		f.u.fn = fns[i].fn;
		scope_set(&r, g, fns[i].name, f);
	}
	if (vars && cJSON_IsObject(vars))
		for (const cJSON *e = vars->child; e; e = e->next)
			if (e->string)
				scope_set(&r, g, e->string, from_json(&r, e, 0));
	struct scope *top = scope_new(&r, g);
	exec_body(&r, j->root, top, NULL);
	arena_free(&ar);
	return SFW_OK;
}
