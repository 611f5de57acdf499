/* salafw run - generate text with a verified model through the runner's
 * generation API (runner/generate.h): a prompt (-p, -f, --chat or --ids),
 * with a chat model a user turn in the model's chat template (formats/chat.h;
 * --raw: plain text), or with -i a chat whose history stays in the context
 * (Ctrl-C stops a reply and keeps its text; Ctrl-C at the prompt or Ctrl-D
 * ends); the text streams to stdout without special tokens (--special shows
 * them), one stats line per reply goes to stderr (speed, finish reason,
 * context use and the seed that repeats the run). Sampling defaults come
 * from the model's generation_config.json (sfw_gen_defaults_load), as in
 * serve.
 *
 * Also home of the helpers that run, score and bench share (cli.h). */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/chat.h"
#include "formats/tokenizer.h"
#include "json.h"
#include "log.h"
#include "runner/generate.h"
#include "runner/runner.h"
#include "runner/sampler.h"
#include "tools/tools.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the engine's environment ---------------------------------------------- */

/* A switch is on when set to anything but "" or "0". */
static int env_on(const char *name)
{
	const char *e = getenv(name);
	return e && *e && strcmp(e, "0") != 0;
}

/* "simt" -> 1, "tc" -> 2, unset or anything else -> 0 (auto) */
static int env_tc(const char *name)
{
	const char *e = getenv(name);
	return !e ? 0 : !strcmp(e, "simt") ? 1 : !strcmp(e, "tc") ? 2 : 0;
}

int cli_model_params(const char *cmd, const struct cli_model_opts *o, struct sfw_model_params *mp)
{
	*mp = sfw_model_default_params();
	mp->device = o->device;
	mp->kv_cache = (enum sfw_kv_cache)o->kv_cache;
	const char *dev = getenv("SALAFW_DEVICE");
	int d = SFW_DEVICE_AUTO;
	if (mp->device == SFW_DEVICE_AUTO && dev && *dev) {
		if (cli_take_device(cmd, "SALAFW_DEVICE", dev, &d))
			return SFW_EXIT_USAGE;
		mp->device = (enum sfw_device)d;
	}
	mp->threads = o->threads;
	const char *th = getenv("SALAFW_THREADS");
	if (!o->threads && th && *th) {
		unsigned long long n;
		if (!cli_parse_u64(cmd, "SALAFW_THREADS", th, &n))
			return SFW_EXIT_USAGE;
		if (n > 256)
			return cli_usage_error(cmd, "SALAFW_THREADS must be at most 256");
		mp->threads = (int)n;
	}
	struct sfw_backend_opts *b = &mp->be;
	b->attn = env_tc("SALAFW_CUDA_ATTN");
	b->stage1 = env_tc("SALAFW_CUDA_STAGE1");
	b->w8gemv = env_tc("SALAFW_CUDA_W8GEMV");
	b->no_graph = env_on("SALAFW_CUDA_NOGRAPH");
	b->profile = env_on("SALAFW_CUDA_PROFILE");
	const char *mb = getenv("SALAFW_CUDA_SELECT_MB");
	if (mb && *mb) {
		unsigned long long n;
		if (!cli_parse_u64(cmd, "SALAFW_CUDA_SELECT_MB", mb, &n))
			return SFW_EXIT_USAGE;
		if (n > (1u << 20))
			return cli_usage_error(cmd, "SALAFW_CUDA_SELECT_MB must be at most %u", 1u << 20);
		b->select_mb = (int)n;
	}
	return 0;
}

/* ---- salafw run ------------------------------------------------------------- */

/* The command line's values (cli_parse_args fills them from the table). */
struct run_args {
	const char *prompt, *file, *system, *kw_text, *model, *ids_path, *pcache;
	const char *stops[SFW_STOP_MAX];
	size_t n_stop;
	int chat, inter, raw, special, print_ids, das, ignore_eos, greedy, top_k;
	uint64_t n_gen, ctx_size, max_ctx, chunk, seed;
	double temp, top_p;
	struct cli_model_opts mo;
};

static int take_model(const char *cmd, const char *label, const char *v, void *dst)
{
	struct run_args *a = dst;
	(void)label;
	if (a->model)
		return cli_usage_error(cmd, "--model (-m) given twice");
	a->model = v;
	return 0;
}

static int take_stop(const char *cmd, const char *label, const char *v, void *dst)
{
	struct run_args *a = dst;
	if (a->n_stop >= SFW_STOP_MAX)
		return cli_usage_error(cmd, "more than %d %s strings", SFW_STOP_MAX, label);
	size_t L = strlen(v);
	if (L < 1 || L > SFW_STOP_MAX_LEN || !sfw_utf8_valid((const unsigned char *)v, L))
		return cli_usage_error(cmd, "%s wants 1 to %d bytes of UTF-8", label, SFW_STOP_MAX_LEN);
	a->stops[a->n_stop++] = v;
	return 0;
}

#define OFF(f) offsetof(struct run_args, f)
static const struct cli_arg args[] = {
    {{"prompt", 'p', "TEXT",
      "prompt text; with a chat model one user turn in the model's chat template (--raw: plain text to continue); "
      "with -i the first turn"},
     CLI_K_STR, OFF(prompt), 0, 0, NULL, NULL},
    {{"file", 'f', "FILE", "prompt text from a file (as -p)"}, CLI_K_STR, OFF(file), 0, 0, NULL, NULL},
    {{"interactive", 'i', NULL,
      "chat: user turns from standard input after a \"> \" prompt, the history kept; Ctrl-C stops a reply, Ctrl-C at "
      "the prompt (exit 130) or Ctrl-D (exit 0) ends"},
     CLI_K_FLAG, OFF(inter), 0, 0, NULL, NULL},
    {{"chat", 0, NULL, "the prompt from standard input as one user turn (without -p or -f)"},
     CLI_K_FLAG, OFF(chat), 0, 0, NULL, NULL},
    {{"raw", 0, NULL, "no chat template: the prompt (-p, -f) is plain text to continue, encoded with BOS"},
     CLI_K_FLAG, OFF(raw), 0, 0, NULL, NULL},
    {{"system", 0, "TEXT", "a system message before the first user turn"}, CLI_K_STR, OFF(system), 0, 0, NULL, NULL},
    {{"chat-template-kwargs", 0, "JSON", "variables for the chat template, e.g. '{\"enable_thinking\": false}'"},
     CLI_K_STR, OFF(kw_text), 0, 0, NULL, NULL},
    {{"special", 0, NULL, "print special tokens (<|im_end|>, <|tool_call|>, ...); hidden by default"},
     CLI_K_FLAG, OFF(special), 0, 0, NULL, NULL},
    {{"model", 0, "DIR", "the model directory, instead of MODEL_DIR (-m DIR too, as llama.cpp writes it)"},
     CLI_K_CALL, 0, 0, 0, take_model, NULL},
    {{"ids", 0, "FILE", "prompt as token ids (text integers, or safetensors with input_ids)"},
     CLI_K_STR, OFF(ids_path), 0, 0, NULL, NULL},
    {{"n-predict", 'n', "N", "tokens per reply at most (default 128, with -i 512; 0 = to EOS or the context)"},
     CLI_K_U64, OFF(n_gen), 0, 1 << 24, NULL, NULL},
    {{"ctx-size", 'c', "N", "context size: replies stop there (default prompt + -n, or + 4096; -i 4096)"},
     CLI_K_U64, OFF(ctx_size), 1, 1 << 30, NULL, NULL},
    {{"stop", 0, "STR", "stop where STR appears in the reply (STR not shown; repeatable)"},
     CLI_K_CALL, 0, 0, 0, take_stop, NULL},
    {{"temp", 0, "T", "sampling temperature (default: generation_config.json's, else 1; 0 = greedy)"},
     CLI_K_DOUBLE, OFF(temp), 0, 0, NULL, NULL},
    {{"temperature", 0, "T", "the same as --temp"}, CLI_K_DOUBLE, OFF(temp), 0, 0, NULL, NULL},
    {{"top-k", 0, "K", "keep the K most likely tokens (default: generation_config.json's, else 0 = off)"},
     CLI_K_INT, OFF(top_k), 0, INT32_MAX, NULL, NULL},
    {{"top-p", 0, "P", "nucleus sampling mass (default: generation_config.json's, else 1 = off)"},
     CLI_K_DOUBLE, OFF(top_p), 0, 0, NULL, NULL},
    {{"seed", 0, "S", "sampler seed (default: random, printed with the stats)"}, CLI_K_U64, OFF(seed), 0, 0, NULL, NULL},
    {{"greedy", 0, NULL, "always take the most likely token"}, CLI_K_FLAG, OFF(greedy), 0, 0, NULL, NULL},
    {{"ignore-eos", 0, NULL, "do not stop at end-of-sequence tokens"}, CLI_K_FLAG, OFF(ignore_eos), 0, 0, NULL, NULL},
    {{"print-ids", 0, NULL, "print the generated token ids (one line) instead of text"},
     CLI_K_FLAG, OFF(print_ids), 0, 0, NULL, NULL},
    {{"prompt-cache", 0, "FILE",
      "keep the state after the prompt in FILE; a later prompt that starts with FILE's tokens loads it and "
      "prefills only the rest (README, run)"},
     CLI_K_STR, OFF(pcache), 0, 0, NULL, NULL},
    CLI_DEVICE_ARG(struct run_args, mo, "where to run (default: cuda when available, else cpu)"),
    CLI_KV_CACHE_ARG(struct run_args, mo),
    {{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"}, CLI_K_FLAG, OFF(das), 0, 0, NULL, NULL},
    {{"max-context", 0, "N", "reserve the context for N tokens up front (default: the context size)"},
     CLI_K_U64, OFF(max_ctx), 0, 1 << 30, NULL, NULL},
    {{"prefill-chunk", 0, "C", "prefill rows per piece (default 256 on the CPU, 8192 on CUDA)"},
     CLI_K_U64, OFF(chunk), 1, 1 << 20, NULL, NULL},
    CLI_MODEL_ARGS(struct run_args, mo, "run"),
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

#define CHAT_STDIN_MAX (64u << 20)
#define PROMPT_FILE_MAX (64u << 20)
#define CHAT_LINE_MAX (1u << 20)
#define CHAT_CTX_DEFAULT 4096
#define REPLY_MAX (64u << 20)
#define KWARGS_MAX (1u << 20)

/* The --chat message from standard input: at most CHAT_STDIN_MAX bytes of
 * text without NUL (the message is a C string from here on). Prints the
 * problem and returns an exit code (0 = ok). */
static int read_stdin(const char *cmd, struct sfw_buf *b)
{
	char tmp[65536];
	size_t k;
	while ((k = fread(tmp, 1, sizeof(tmp), stdin)) > 0) {
		if (memchr(tmp, '\0', k)) {
			fprintf(stderr, "%s: --chat: standard input holds a NUL byte; the message must be text\n", cmd);
			return SFW_EXIT_IO;
		}
		enum sfw_status s = sfw_buf_append(b, tmp, k);
		if (s == SFW_E_RANGE) {
			fprintf(stderr, "%s: --chat: the message on standard input is too long (limit %u MiB)\n", cmd,
				CHAT_STDIN_MAX >> 20);
			return SFW_EXIT_IO;
		}
		if (s != SFW_OK)
			return cli_report(s, NULL);
	}
	if (ferror(stdin)) {
		fprintf(stderr, "%s: --chat: cannot read standard input: %s\n", cmd, strerror(errno));
		return SFW_EXIT_IO;
	}
	return 0;
}

/* -f FILE: text without NUL bytes, at most PROMPT_FILE_MAX bytes. */
static int read_prompt_file(const char *cmd, const char *path, struct sfw_buf *b)
{
	struct sfw_err err = {0};
	enum sfw_status s = sfw_read_file(path, PROMPT_FILE_MAX, b, &err);
	if (s != SFW_OK) {
		fprintf(stderr, "%s: --file: %s\n", cmd, err.msg);
		return SFW_EXIT_IO;
	}
	if (b->len && memchr(b->data, '\0', b->len)) {
		char ep[1024];
		fprintf(stderr, "%s: --file: '%s' holds a NUL byte; the prompt must be text\n", cmd,
			sfw_esc(path, ep, sizeof(ep)));
		return SFW_EXIT_IO;
	}
	return 0;
}

/* Standard input for -i, read with read(2) after poll(2): an interrupt at
 * the prompt is seen within POLL_MS even though the handler restarts calls. */
#define POLL_MS 100
struct line_in {
	char buf[65536];
	size_t off, len;
	int eof;
};

enum { TURN_OK, TURN_EOF, TURN_INTR };

/* One user line for -i: TURN_EOF at the end of input, TURN_INTR when an
 * interrupt came while waiting. The line loses its "\n" (and a "\r" before
 * it); NUL bytes and lines over CHAT_LINE_MAX are refused. *rc: an exit code
 * (0 = ok). */
static int read_turn(const char *cmd, struct line_in *in, struct sfw_buf *b, volatile sig_atomic_t *intr, int *rc)
{
	b->len = 0;
	if (b->data)
		b->data[0] = 0;
	*rc = 0;
	for (;;) {
		if (in->off < in->len) {
			char *s = in->buf + in->off;
			size_t n = in->len - in->off;
			char *nl = memchr(s, '\n', n);
			size_t k = nl ? (size_t)(nl - s) : n;
			if (memchr(s, '\0', k)) {
				fprintf(stderr, "%s: -i: a NUL byte in the input; turns must be text\n", cmd);
				*rc = SFW_EXIT_IO;
				return TURN_EOF;
			}
			if (sfw_buf_append(b, s, k) != SFW_OK) {
				fprintf(stderr, "%s: -i: a line longer than %u MiB\n", cmd, CHAT_LINE_MAX >> 20);
				*rc = SFW_EXIT_IO;
				return TURN_EOF;
			}
			in->off += k + (nl ? 1 : 0);
			if (nl)
				break;
			continue;
		}
		if (in->eof) {
			if (!b->len)
				return TURN_EOF;
			break;
		}
		if (intr && *intr)
			return TURN_INTR;
		struct pollfd pf = {.fd = 0, .events = POLLIN};
		int pr = poll(&pf, 1, POLL_MS);
		if (pr < 0 && errno != EINTR) {
			fprintf(stderr, "%s: -i: cannot read standard input: %s\n", cmd, strerror(errno));
			*rc = SFW_EXIT_IO;
			return TURN_EOF;
		}
		if (pr <= 0)
			continue;
		ssize_t r = read(0, in->buf, sizeof(in->buf));
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			fprintf(stderr, "%s: -i: cannot read standard input: %s\n", cmd, strerror(errno));
			*rc = SFW_EXIT_IO;
			return TURN_EOF;
		}
		in->off = 0;
		in->len = (size_t)r;
		in->eof = r == 0;
	}
	if (b->len && b->data[b->len - 1] == '\r')
		b->data[--b->len] = 0;
	return TURN_OK;
}

struct run_out {
	int print_ids;
	int64_t shown;			/* ids printed (--print-ids) */
	volatile sig_atomic_t *intr;	/* -i: Ctrl-C stops the reply */
	struct sfw_buf *reply;		/* the reply's text (-i: it joins the history) */
	struct sfw_err err;
	enum sfw_status status;
};

/* The generation callback: text (or ids) to stdout, flushed per token. */
static int on_token(void *user, const struct sfw_gen_token *t)
{
	struct run_out *o = user;
	if (o->print_ids) {
		if (t->id >= 0)
			printf("%s%d", o->shown++ ? " " : "", t->id);
	} else if (t->len) {
		fwrite(t->text, 1, t->len, stdout);
		if (o->reply && (o->status = sfw_buf_append(o->reply, t->text, t->len)) != SFW_OK) {
			sfw_fail(&o->err, o->status, "the reply is longer than %u MiB", REPLY_MAX >> 20);
			return 1;
		}
	}
	if ((o->status = cli_stdout_flush(&o->err)) != SFW_OK)
		return 1;
	return o->intr && *o->intr;
}

static uint64_t random_seed(void)
{
	uint64_t x = 0;
	if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
	}
	return x;
}

static void print_stats(const char *C, const struct sfw_gen_stats *st, const char *dev, uint64_t seed)
{
	double pt = st->prefill_s > 0 ? st->prefill_s : 1e-9, dt = st->decode_s > 0 ? st->decode_s : 1e-9;
	/* decode speed counts the one-token forward passes actually made */
	fprintf(stderr,
		"%s: prefill %lld tokens in %.3f s (%.1f tok/s), decode %lld tokens in %.3f s (%.1f tok/s) [%s]; "
		"%lld generated, finish %s, context %lld tokens, seed %llu\n",
		C, (long long)st->prompt_tokens, st->prefill_s, (double)st->prompt_tokens / pt,
		(long long)st->decode_steps, st->decode_s, st->decode_steps ? (double)st->decode_steps / dt : 0.0, dev,
		(long long)st->tokens, sfw_finish_name(st->finish), (long long)st->ctx_pos, (unsigned long long)seed);
}

/* ---- the chat: messages, the template, and what each turn feeds -------------- */

static enum sfw_status add_msg(cJSON *msgs, const char *role, const char *content, size_t len, struct sfw_err *err)
{
	cJSON *m = cJSON_CreateObject();
	char *c = sfw_strndup(content, len);
	if (!m || !c || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", c) ||
	    !cJSON_AddItemToArray(msgs, m)) {
		sfw_free(c);
		cJSON_Delete(m);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	sfw_free(c);
	return SFW_OK;
}

/* The first prompt of a chat: the messages rendered with the generation
 * prompt; BOS first unless the template wrote it. */
static enum sfw_status first_turn_ids(const struct sfw_tokenizer *tok, const struct sfw_chat_template *tpl,
				      const cJSON *msgs, const cJSON *kw, struct sfw_buf *text, int32_t **ids,
				      size_t *n, struct sfw_err *err)
{
	text->len = 0;
	enum sfw_status s = sfw_chat_render(tpl, msgs, NULL, kw, 1, text, err);
	if (s != SFW_OK)
		return s;
	const char *t = text->data ? text->data : "";
	return sfw_tokenizer_encode(tok, t, text->len, sfw_chat_needs_bos(tpl, t, text->len), ids, n, err);
}

/* The ids of turn 2+, msgs holding the history with the new user turn last.
 * The context holds the earlier prompts and replies (a reply's last token
 * pending: never fed). What the template adds for the new turn is the text
 * by which its rendering with the turn (and the generation prompt) extends
 * its rendering without (as llama.cpp's chat does); the reply is closed by
 * what the template writes after the last reply's text (its eos and a
 * newline when that text cannot be found). Fed: the pending token unless it
 * ended the reply (an end-of-sequence id: the closing text feeds it), then
 * the closing text and the new turn, without BOS. */
static enum sfw_status next_turn_ids(const struct sfw_tokenizer *tok, const struct sfw_eos_set *eos,
				     const struct sfw_chat_template *tpl, cJSON *msgs, const cJSON *kw,
				     int32_t pending, struct sfw_buf *text, int32_t **ids, size_t *n,
				     struct sfw_err *err)
{
	struct sfw_buf prev, full, feed;
	sfw_buf_init(&prev, text->max);
	sfw_buf_init(&full, text->max);
	sfw_buf_init(&feed, text->max);
	int32_t *body = NULL;
	size_t nb = 0;
	int cnt = cJSON_GetArraySize(msgs);
	cJSON *user = cJSON_DetachItemFromArray(msgs, cnt - 1);
	const cJSON *last = cJSON_GetArrayItem(msgs, cnt - 2); /* the reply */
	enum sfw_status s = sfw_chat_render(tpl, msgs, NULL, kw, 0, &prev, err);
	if (!cJSON_AddItemToArray(msgs, user)) { /* back in its place */
		cJSON_Delete(user);
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	if (s == SFW_OK)
		s = sfw_chat_render(tpl, msgs, NULL, kw, 1, &full, err);
	if (s != SFW_OK)
		goto out;
	const char *pv = prev.data ? prev.data : "", *fl = full.data ? full.data : "";
	/* the closing text: after the last occurrence of the reply in prev */
	const cJSON *lc = cJSON_GetObjectItemCaseSensitive(last, "content");
	const char *reply = cJSON_IsString(lc) ? lc->valuestring : "";
	size_t rl = strlen(reply), cl = 0;
	const char *close = NULL;
	if (rl && prev.len >= rl)
		for (size_t k = prev.len - rl + 1; k-- > 0;)
			if (!memcmp(pv + k, reply, rl)) {
				close = pv + k + rl;
				cl = prev.len - k - rl;
				break;
			}
	char eos_nl[SFW_CHAT_TOKEN_MAX + 2];
	if (!close || cl > 256) {
		snprintf(eos_nl, sizeof(eos_nl), "%s\n", sfw_chat_template_eos(tpl));
		close = eos_nl;
		cl = strlen(eos_nl);
	}
	const char *delta = fl;
	size_t dl = full.len;
	if (full.len >= prev.len && !memcmp(fl, pv, prev.len)) {
		delta = fl + prev.len;
		dl = full.len - prev.len;
	} else { /* the template rewrote the history: the new turn alone */
		cJSON *one = cJSON_CreateArray();
		cJSON *u = cJSON_Duplicate(user, 1);
		if (!one || !u || !cJSON_AddItemToArray(one, u)) {
			cJSON_Delete(u);
			cJSON_Delete(one);
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
			goto out;
		}
		full.len = 0;
		s = sfw_chat_render(tpl, one, NULL, kw, 1, &full, err);
		cJSON_Delete(one);
		if (s != SFW_OK)
			goto out;
		delta = full.data ? full.data : "";
		dl = full.len;
	}
	if ((s = sfw_buf_append(&feed, close, cl)) != SFW_OK || (s = sfw_buf_append(&feed, delta, dl)) != SFW_OK) {
		sfw_fail(err, s, "the chat turn is too long");
		goto out;
	}
	if ((s = sfw_tokenizer_encode(tok, feed.data ? feed.data : "", feed.len, 0, &body, &nb, err)) != SFW_OK)
		goto out;
	int lead = pending >= 0 && !sfw_eos_has(eos, pending);
	int32_t *v = sfw_malloc((nb + 1) * sizeof(int32_t));
	if (!v) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto out;
	}
	size_t k = 0;
	if (lead)
		v[k++] = pending;
	if (nb)
		memcpy(v + k, body, nb * sizeof(int32_t));
	*ids = v;
	*n = k + nb;
out:
	sfw_free(body);
	sfw_buf_release(&prev);
	sfw_buf_release(&full);
	sfw_buf_release(&feed);
	return s;
}

/* llama.cpp's "-m MODEL": argv's "-m" (where it is an option, not another
 * option's value) becomes "--model", which the table documents. */
static void model_short_m(int argc, char **argv)
{
	static char model_long[] = "--model";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--"))
			return;
		if (!strcmp(a, "-m")) {
			argv[i] = model_long;
			i++; /* its value */
			continue;
		}
		if (a[0] != '-' || !a[1])
			continue;
		for (int k = 0; args[k].opt.name; k++) {
			const struct cli_opt *o = &args[k].opt;
			int is = a[1] == '-' ? (!strcmp(a + 2, o->name)) : (a[2] == 0 && a[1] == o->short_name);
			if (is && o->arg) {
				i++; /* skip the value */
				break;
			}
		}
	}
}

/* Everything one run holds, released by run_release. */
struct run {
	const char *C, *dir;
	struct run_args ra;
	int have_temp, have_top_k, have_top_p;
	cJSON *kw, *msgs;
	struct sfw_model *m;
	struct sfw_ctx *ctx;
	struct sfw_tokenizer *tok;
	struct sfw_chat_template *tpl;
	struct sfw_sampler smp;
	int smp_ok, use_chat, first_turn, turns;
	uint64_t seed;
	int32_t *ids;
	size_t n_ids;
	struct sfw_buf text, in, line, reply;
	struct line_in *lin;
	struct run_out ro;
	struct sfw_eos_set eos;
	struct sfw_gen_params gp;
	struct sfw_gen_stats st;
	struct sfw_err err;
	struct cli_gate_info gi;
	struct sfw_model_params mp;
	struct cli_pcache pc; /* --prompt-cache; path NULL: none */
};

/* The values that go together, checked before any model is loaded (the
 * sampler's as the floats it takes). Returns 0 or an exit code. */
static int run_check(struct run *r, const struct cli_parser *cp)
{
	const char *C = r->C;
	const struct run_args *a = &r->ra;
	/* Below 1e-6 a temperature only rounds the logits apart (1e-40 would
	 * overflow 1/T): 0 already means greedy. */
	if (r->have_temp && a->temp < 0)
		return cli_usage_error(C, "--temp %g is negative (0 = greedy)", a->temp);
	if (r->have_temp && a->temp > 0 && a->temp < 1e-6)
		return cli_usage_error(C, "--temp %g is too small; use --temp 0 for greedy", a->temp);
	if (r->have_temp && a->temp > 1e6)
		return cli_usage_error(C, "--temp %g is too large (at most 1e6)", a->temp);
	if (r->have_top_p && !((float)a->top_p > 0 && a->top_p <= 1))
		return cli_usage_error(C, "--top-p %g must be in (0, 1]", a->top_p);
	if (cp->npos + (a->model != NULL) != 1)
		return cli_usage_error(C, "expected one MODEL_DIR (or -m DIR)");
	if ((a->prompt != NULL) + (a->file != NULL) + (a->ids_path != NULL) > 1 ||
	    (a->ids_path && (a->chat || a->inter)) || (a->chat && a->inter) ||
	    (!a->prompt && !a->file && !a->ids_path && !a->chat && !a->inter))
		return cli_usage_error(C, "give exactly one of -p TEXT, -f FILE, --chat, -i or --ids FILE");
	if (a->raw && (a->chat || a->inter || a->ids_path))
		return cli_usage_error(C, "--raw is for -p and -f (a chat needs the template)");
	if (a->system && (a->raw || a->ids_path))
		return cli_usage_error(C, "--system needs a chat prompt (not --raw or --ids)");
	if (a->kw_text && (a->raw || a->ids_path))
		return cli_usage_error(C, "--chat-template-kwargs needs a chat prompt (not --raw or --ids)");
	if (a->n_stop && a->print_ids)
		return cli_usage_error(C, "--stop needs text output (not --print-ids)");
	if (a->pcache && a->inter)
		return cli_usage_error(C, "--prompt-cache is for one prompt (not -i)");
	if (a->pcache && !*a->pcache)
		return cli_usage_error(C, "--prompt-cache wants a file name");
	if (a->kw_text) {
		struct sfw_err kerr = {0};
		size_t kl = strlen(a->kw_text);
		if (kl > KWARGS_MAX ||
		    sfw_json_parse(a->kw_text, kl, "--chat-template-kwargs", &r->kw, &kerr) != SFW_OK ||
		    !cJSON_IsObject(r->kw))
			return cli_usage_error(C, "--chat-template-kwargs wants a JSON object%s%s",
					       kerr.msg[0] ? ": " : "", kerr.msg);
	}
	return 0;
}

/* The inputs (read before the model is loaded, so their problems come
 * first), the sampling defaults (generation_config.json's, one set with
 * serve), the model, its tokenizer, end ids and chat template, and the
 * first turn's ids. Returns 0 or an exit code. */
static int run_load(struct run *r, struct sfw_op_sample_params *sp, const struct sfw_model_params *mp)
{
	const char *C = r->C, *dir = r->dir;
	const struct run_args *a = &r->ra;
	struct sfw_err *err = &r->err;
	enum sfw_status s = SFW_OK;
	int rc;
	char tpath[4200], ed[1024];
	struct stat stt;
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.model", dir);
	int have_tok = stat(tpath, &stt) == 0;
	if (!have_tok && !a->ids_path) {
		fprintf(stderr, "%s: '%s' has no tokenizer.model (use --ids)\n", C, sfw_esc(dir, ed, sizeof(ed)));
		return SFW_EXIT_USAGE;
	}
	if (a->ids_path && (rc = cli_read_ids(C, a->ids_path, &r->ids, &r->n_ids)) != 0)
		return rc;
	if (a->file && (rc = read_prompt_file(C, a->file, &r->in)) != 0)
		return rc;
	if (a->chat && !a->prompt && !a->file && (rc = read_stdin(C, &r->in)) != 0)
		return rc;
	struct sfw_gen_defaults gd;
	if ((s = sfw_gen_defaults_load(dir, &gd, err)) != SFW_OK)
		return cli_report(s, err);
	sp->temperature = (float)(r->have_temp ? a->temp : gd.temperature);
	sp->top_p = (float)(r->have_top_p ? a->top_p : gd.top_p);
	if (!r->have_top_k)
		sp->top_k = gd.top_k;
	if ((s = sfw_model_load(dir, mp, &r->m, err)) != SFW_OK)
		return cli_report(s, err);
	const struct sfw_config *cf = sfw_model_config(r->m);
	if (have_tok && (s = sfw_tokenizer_load(dir, cf->vocab_size, &r->tok, err)) != SFW_OK)
		return cli_report(s, err);
	if ((s = sfw_eos_load(dir, cf, r->tok, &r->eos, err)) != SFW_OK)
		return cli_report(s, err);
	if (a->ignore_eos)
		r->eos.n = 0;
	/* A chat model: its tokenizer has the chat tokens. -p and -f are then a
	 * user turn in its template unless --raw. */
	int chat_model = r->tok && sfw_tokenizer_special_id(r->tok, "<|im_start|>") >= 0 &&
			 sfw_tokenizer_special_id(r->tok, "<|im_end|>") >= 0;
	r->use_chat = !a->ids_path && !a->raw && chat_model;
	if ((a->chat || a->inter || a->system || r->kw) && !chat_model) {
		fprintf(stderr, "%s: '%s' is not a chat model (its tokenizer has no <|im_start|>/<|im_end|>)\n", C,
			sfw_esc(dir, ed, sizeof(ed)));
		return SFW_EXIT_USAGE;
	}
	if (r->use_chat) {
		if ((s = sfw_chat_template_load(dir, &r->tpl, err)) != SFW_OK)
			return cli_report(s, err);
		if (!(r->msgs = cJSON_CreateArray()))
			return cli_report(sfw_fail(err, SFW_E_NOMEM, "out of memory"), err);
		if (a->system && (s = add_msg(r->msgs, "system", a->system, strlen(a->system), err)) != SFW_OK)
			return cli_report(s, err);
	}
	const char *body = a->prompt ? a->prompt : r->in.data ? r->in.data : "";
	r->first_turn = !a->inter || a->prompt || a->file;
	if (!a->ids_path && r->first_turn) {
		if (!r->use_chat)
			s = sfw_tokenizer_encode(r->tok, body, strlen(body), 1, &r->ids, &r->n_ids, err);
		else if ((s = add_msg(r->msgs, "user", body, strlen(body), err)) == SFW_OK)
			s = first_turn_ids(r->tok, r->tpl, r->msgs, r->kw, &r->text, &r->ids, &r->n_ids, err);
		if (s != SFW_OK)
			return cli_report(s, err);
	}
	return 0;
}

/* The context (-c, else (chat) 4096, else prompt + -n, or + 4096 with -n
 * 0), the device plan on CUDA, the sampler and the generation's parameters.
 * Returns 0 or an exit code. */
static int run_context(struct run *r, const struct sfw_op_sample_params *sp, unsigned long long n_gen)
{
	const struct run_args *a = &r->ra;
	struct sfw_err *err = &r->err;
	enum sfw_status s;
	int64_t limit = a->ctx_size ? (int64_t)a->ctx_size
			: a->inter  ? CHAT_CTX_DEFAULT
				    : (int64_t)r->n_ids + (n_gen ? (int64_t)n_gen : CHAT_CTX_DEFAULT);
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = limit;
	if ((int64_t)a->max_ctx > xp.n_ctx)
		xp.n_ctx = (int64_t)a->max_ctx;
	xp.dense_as_sparse = a->das;
	int cuda = !strcmp(sfw_model_device_name(r->m), "cuda");
	if (a->chunk)
		xp.prefill_chunk = (int)a->chunk;
	else if (cuda) /* bounded activations, large GEMMs; no more rows than the prompt */
		xp.prefill_chunk = r->n_ids && r->n_ids < 8192 ? (int)((r->n_ids + 63) / 64 * 64) : 8192;
	if (cuda) { /* the plan at start, and a context that cannot fit refused with its numbers */
		struct sfw_mem_plan pl;
		s = sfw_plan_check(r->m, xp.n_ctx, xp.prefill_chunk, &pl, err);
		sfw_plan_print(stderr, r->C, &pl, xp.n_ctx, xp.prefill_chunk);
		if (s != SFW_OK)
			return cli_report(s, err);
	}
	if ((s = sfw_ctx_new(r->m, &xp, &r->ctx, err)) != SFW_OK)
		return cli_report(s, err);
	if ((s = sfw_sampler_init(&r->smp, sp, r->seed, sfw_model_config(r->m)->vocab_size, err)) != SFW_OK)
		return cli_report(s, err);
	r->smp_ok = 1;
	r->gp = sfw_gen_default_params();
	r->gp.max_tokens = (int64_t)n_gen;
	r->gp.max_ctx = limit;
	r->gp.eos = &r->eos;
	r->gp.stop = a->stops;
	r->gp.n_stop = a->n_stop;
	r->gp.skip_special = !a->special;
	r->st.pending = -1;
	if (a->pcache) { /* bound to the model; a problem here is a warning, then no cache */
		r->pc.cmd = r->C;
		r->pc.path = a->pcache;
		if (cli_pcache_bind(&r->pc, r->dir, &r->gi, sfw_model_device_name(r->m), &r->mp) == 0) {
			cli_pcache_load(&r->pc, r->ctx, r->ids, r->n_ids);
			r->gp.n_cached = (size_t)r->pc.loaded;
			r->gp.on_prompt = cli_pcache_save;
			r->gp.prompt_user = &r->pc;
		}
	}
	if (a->inter) {
		/* Ctrl-C stops the reply (the flag is polled per token) */
		r->ro.intr = cli_interrupt_polled();
		r->ro.reply = &r->reply;
		if (!(r->lin = sfw_calloc(1, sizeof(*r->lin))))
			return cli_report(sfw_fail(err, SFW_E_NOMEM, "out of memory"), err);
	}
	return 0;
}

/* -i: the next user turn after a visible prompt, as ids in r->ids. Returns
 * 1 for a turn, 0 at the end of input (Ctrl-D), -1 with *rc set (Ctrl-C at
 * the prompt: 128 + the signal; or an error, reported). */
static int run_next_turn(struct run *r, int *rc)
{
	struct sfw_err *err = &r->err;
	enum sfw_status s;
	do {
		printf("%s> ", r->turns ? "\n" : "");
		if ((s = cli_stdout_flush(err)) != SFW_OK)
			return *rc = cli_report(s, err), -1;
		int t = read_turn(r->C, r->lin, &r->line, r->ro.intr, rc);
		if (*rc)
			return -1;
		if (t == TURN_INTR) { /* Ctrl-C at the prompt ends the chat */
			int sig = cli_interrupt_take();
			printf("\n");
			if ((s = cli_stdout_flush(err)) != SFW_OK)
				return *rc = cli_report(s, err), -1;
			return *rc = 128 + sig, -1;
		}
		if (t == TURN_EOF)
			return 0;
	} while (!r->line.len);
	sfw_free(r->ids);
	r->ids = NULL;
	if ((s = add_msg(r->msgs, "user", r->line.data, r->line.len, err)) != SFW_OK)
		return *rc = cli_report(s, err), -1;
	if (r->turns == 0)
		s = first_turn_ids(r->tok, r->tpl, r->msgs, r->kw, &r->text, &r->ids, &r->n_ids, err);
	else
		s = next_turn_ids(r->tok, &r->eos, r->tpl, r->msgs, r->kw, r->st.pending, &r->text, &r->ids,
				  &r->n_ids, err);
	if (s != SFW_OK)
		return *rc = cli_report(s, err), -1;
	return 1;
}

/* The replies: one, or with -i one per user turn until Ctrl-D or Ctrl-C at
 * the prompt. Returns the exit code. */
static int run_turns(struct run *r)
{
	const int inter = r->ra.inter;
	const char *dev = sfw_model_device_name(r->m);
	struct sfw_err *err = &r->err;
	enum sfw_status s;
	int rc = 0;
	for (;;) {
		if (inter && (r->turns > 0 || !r->first_turn)) {
			int t = run_next_turn(r, &rc);
			if (t < 0)
				return rc;
			if (t == 0)
				break;
		}
		r->gp.ids = r->ids;
		r->gp.n_ids = r->n_ids;
		r->ro.shown = 0;
		r->reply.len = 0;
		s = sfw_generate(r->ctx, r->tok, &r->smp, &r->gp, on_token, &r->ro, &r->st, err);
		if (r->ro.status != SFW_OK)
			return cli_report(r->ro.status, &r->ro.err);
		if (s != SFW_OK)
			return cli_report(s, err);
		r->turns++;
		if (!inter)
			printf("\n");
		if ((s = cli_stdout_flush(err)) != SFW_OK)
			return cli_report(s, err);
		if (inter && r->ro.intr && *r->ro.intr) {
			/* a reply stopped by Ctrl-C: its text so far stays in the history */
			int sig = cli_interrupt_take();
			if (sig != SIGINT) { /* SIGTERM ends the chat */
				print_stats(r->C, &r->st, dev, r->seed);
				return 128 + sig;
			}
			printf("\n");
			if ((s = cli_stdout_flush(err)) != SFW_OK)
				return cli_report(s, err);
		}
		print_stats(r->C, &r->st, dev, r->seed);
		if (!inter)
			break;
		s = add_msg(r->msgs, "assistant", r->reply.data ? r->reply.data : "", r->reply.len, err);
		if (s != SFW_OK)
			return cli_report(s, err);
	}
	if (inter) {
		printf("\n");
		if ((s = cli_stdout_flush(err)) != SFW_OK)
			return cli_report(s, err);
	}
	return 0;
}

static void run_release(struct run *r)
{
	if (r->smp_ok)
		sfw_sampler_release(&r->smp);
	sfw_free(r->ids);
	sfw_free(r->lin);
	sfw_buf_release(&r->text);
	sfw_buf_release(&r->in);
	sfw_buf_release(&r->line);
	sfw_buf_release(&r->reply);
	cJSON_Delete(r->msgs);
	cJSON_Delete(r->kw);
	sfw_chat_template_free(r->tpl);
	sfw_ctx_free(r->ctx);
	sfw_tokenizer_free(r->tok);
	sfw_model_free(r->m);
}

int cmd_run(int argc, char **argv)
{
	struct run *r = sfw_calloc(1, sizeof(*r));
	if (!r)
		return cli_report(SFW_E_NOMEM, NULL);
	r->C = "salafw run";
	r->ra = (struct run_args){.n_gen = 128, .top_p = 1};
	cli_model_opts_init(&r->ra.mo);
	struct cli_parser cp;
	model_short_m(argc, argv);
	int rc = cli_parse_args(&cp, r->C, argc, argv, args, &r->ra);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, r->C, "MODEL_DIR|-m DIR (-p TEXT | -f FILE | --chat | -i | --ids FILE) [options]",
			       args);
		rc = SFW_EXIT_OK;
		goto out;
	}
	if (rc != 0)
		goto out;
	r->have_temp = cli_given(&cp, "temp") || cli_given(&cp, "temperature");
	r->have_top_k = cli_given(&cp, "top-k");
	r->have_top_p = cli_given(&cp, "top-p");
	if ((rc = run_check(r, &cp)) != 0)
		goto out;
	struct sfw_op_sample_params sp = sfw_sampler_default_params();
	sp.greedy = r->ra.greedy;
	sp.top_k = r->ra.top_k;
	r->seed = cli_given(&cp, "seed") ? r->ra.seed : random_seed();
	unsigned long long n_gen = r->ra.inter && !cli_given(&cp, "n-predict") ? 512 : r->ra.n_gen;
	struct sfw_model_params *mp = &r->mp;
	if (cli_model_params(r->C, &r->ra.mo, mp)) {
		rc = SFW_EXIT_USAGE;
		goto out;
	}
	r->dir = r->ra.model ? r->ra.model : cp.pos[0];
	if ((rc = cli_model_gate_info(r->C, r->dir, r->ra.mo.no_verify, r->ra.mo.verify_full, r->ra.mo.pubkey,
				      &r->gi)) != 0)
		goto out;
	/* the chat turn is the message plus the system text and the template's markers */
	sfw_buf_init(&r->text, 2 * (size_t)CHAT_STDIN_MAX + (r->ra.system ? strlen(r->ra.system) : 0) + (1u << 20));
	sfw_buf_init(&r->in, CHAT_STDIN_MAX);
	sfw_buf_init(&r->line, CHAT_LINE_MAX);
	sfw_buf_init(&r->reply, REPLY_MAX);
	r->ro.print_ids = r->ra.print_ids;
	if ((rc = run_load(r, &sp, mp)) == 0 && (rc = run_context(r, &sp, n_gen)) == 0)
		rc = run_turns(r);
out:
	run_release(r);
	sfw_free(r);
	return rc;
}
