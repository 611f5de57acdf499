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
	const char *prompt, *file, *system, *kw_text, *model, *ids_path;
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
    CLI_DEVICE_ARG(struct run_args, mo, "where to run (default: cuda when available, else cpu)"),
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

int cmd_run(int argc, char **argv)
{
	const char *C = "salafw run";
	struct run_args ra = {.n_gen = 128, .top_p = 1};
	cli_model_opts_init(&ra.mo);
	struct cli_parser cp;
	model_short_m(argc, argv);
	int rc = cli_parse_args(&cp, C, argc, argv, args, &ra);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, C, "MODEL_DIR|-m DIR (-p TEXT | -f FILE | --chat | -i | --ids FILE) [options]", args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	const char *prompt = ra.prompt, *ids_path = ra.ids_path, *system = ra.system, *file = ra.file,
		   *model = ra.model, *kw_text = ra.kw_text;
	const char *const *stops = ra.stops;
	size_t n_stop = ra.n_stop;
	int chat = ra.chat, inter = ra.inter, print_ids = ra.print_ids, das = ra.das, ignore_eos = ra.ignore_eos,
	    raw = ra.raw, special = ra.special;
	int have_seed = cli_given(&cp, "seed"), have_n = cli_given(&cp, "n-predict");
	int have_temp = cli_given(&cp, "temp") || cli_given(&cp, "temperature"), have_top_k = cli_given(&cp, "top-k"),
	    have_top_p = cli_given(&cp, "top-p");
	unsigned long long n_gen = ra.n_gen, max_ctx = ra.max_ctx, ctx_size = ra.ctx_size, chunk = ra.chunk;
	uint64_t seed = ra.seed;
	const struct cli_model_opts mo = ra.mo;
	struct sfw_op_sample_params sp = sfw_sampler_default_params();
	sp.greedy = ra.greedy;
	sp.top_k = ra.top_k;
	double temp = ra.temp, top_p = ra.top_p;
	/* Sampler values are checked here, before any model is loaded, as the
	 * floats the sampler gets. Below 1e-6 a temperature only rounds the
	 * logits apart (1e-40 would overflow 1/T): 0 already means greedy. */
	if (have_temp && temp < 0)
		return cli_usage_error(C, "--temp %g is negative (0 = greedy)", temp);
	if (have_temp && temp > 0 && temp < 1e-6)
		return cli_usage_error(C, "--temp %g is too small; use --temp 0 for greedy", temp);
	if (have_temp && temp > 1e6)
		return cli_usage_error(C, "--temp %g is too large (at most 1e6)", temp);
	if (have_top_p && !((float)top_p > 0 && top_p <= 1))
		return cli_usage_error(C, "--top-p %g must be in (0, 1]", top_p);
	if (cp.npos + (model != NULL) != 1)
		return cli_usage_error(C, "expected one MODEL_DIR (or -m DIR)");
	if ((prompt != NULL) + (file != NULL) + (ids_path != NULL) > 1 || (ids_path && (chat || inter)) ||
	    (chat && inter) || (!prompt && !file && !ids_path && !chat && !inter))
		return cli_usage_error(C, "give exactly one of -p TEXT, -f FILE, --chat, -i or --ids FILE");
	if (raw && (chat || inter || ids_path))
		return cli_usage_error(C, "--raw is for -p and -f (a chat needs the template)");
	if (system && (raw || ids_path))
		return cli_usage_error(C, "--system needs a chat prompt (not --raw or --ids)");
	if (kw_text && (raw || ids_path))
		return cli_usage_error(C, "--chat-template-kwargs needs a chat prompt (not --raw or --ids)");
	if (n_stop && print_ids)
		return cli_usage_error(C, "--stop needs text output (not --print-ids)");
	cJSON *kw = NULL;
	if (kw_text) {
		struct sfw_err kerr = {0};
		size_t kl = strlen(kw_text);
		if (kl > KWARGS_MAX || sfw_json_parse(kw_text, kl, "--chat-template-kwargs", &kw, &kerr) != SFW_OK ||
		    !cJSON_IsObject(kw)) {
			cJSON_Delete(kw);
			return cli_usage_error(C, "--chat-template-kwargs wants a JSON object%s%s", kerr.msg[0] ? ": " : "",
					       kerr.msg);
		}
	}
	if (!have_seed)
		seed = random_seed();
	if (inter && !have_n)
		n_gen = 512;
	struct sfw_model_params mp;
	if (cli_model_params(C, &mo, &mp)) {
		cJSON_Delete(kw);
		return SFW_EXIT_USAGE;
	}
	const char *dir = model ? model : cp.pos[0];
	rc = cli_model_gate(C, dir, mo.no_verify, mo.verify_full, mo.pubkey);
	if (rc) {
		cJSON_Delete(kw);
		return rc;
	}

	struct sfw_err err = {0};
	enum sfw_status s;
	struct sfw_model *m = NULL;
	struct sfw_ctx *ctx = NULL;
	struct sfw_tokenizer *tok = NULL;
	struct sfw_chat_template *tpl = NULL;
	cJSON *msgs = NULL;
	struct sfw_sampler smp;
	int smp_ok = 0;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	struct sfw_buf text, in, line, reply;
	/* The chat turn is the message plus the system text and the template's markers. */
	sfw_buf_init(&text, 2 * (size_t)CHAT_STDIN_MAX + (system ? strlen(system) : 0) + (1u << 20));
	sfw_buf_init(&in, CHAT_STDIN_MAX);
	sfw_buf_init(&line, CHAT_LINE_MAX);
	sfw_buf_init(&reply, REPLY_MAX);
	struct line_in *lin = NULL;
	struct run_out ro = {.print_ids = print_ids};

	/* Input problems are reported before the model is loaded. */
	char tpath[4200];
	struct stat stt;
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.model", dir);
	int have_tok = stat(tpath, &stt) == 0;
	if (!have_tok && !ids_path) {
		char ed[1024];
		fprintf(stderr, "%s: '%s' has no tokenizer.model (use --ids)\n", C,
			sfw_esc(dir, ed, sizeof(ed)));
		rc = SFW_EXIT_USAGE;
		goto out_rc;
	}
	if (ids_path && (rc = cli_read_ids(C, ids_path, &ids, &n_ids)) != 0)
		goto out_rc;
	if (file && (rc = read_prompt_file(C, file, &in)) != 0)
		goto out_rc;
	if (chat && !prompt && !file && (rc = read_stdin(C, &in)) != 0)
		goto out_rc;

	/* One set of sampling defaults with serve: generation_config.json's. */
	struct sfw_gen_defaults gd;
	if ((s = sfw_gen_defaults_load(dir, &gd, &err)) != SFW_OK)
		goto fail;
	sp.temperature = (float)(have_temp ? temp : gd.temperature);
	sp.top_p = (float)(have_top_p ? top_p : gd.top_p);
	if (!have_top_k)
		sp.top_k = gd.top_k;

	if ((s = sfw_model_load(dir, &mp, &m, &err)) != SFW_OK)
		goto fail;
	const struct sfw_config *cf = sfw_model_config(m);
	if (have_tok && (s = sfw_tokenizer_load(dir, cf->vocab_size, &tok, &err)) != SFW_OK)
		goto fail;
	struct sfw_eos_set eos;
	if ((s = sfw_eos_load(dir, cf, tok, &eos, &err)) != SFW_OK)
		goto fail;
	if (ignore_eos)
		eos.n = 0;
	/* A chat model: its tokenizer has the chat tokens. -p and -f are then a
	 * user turn in its template unless --raw. */
	int chat_model = tok && sfw_tokenizer_special_id(tok, "<|im_start|>") >= 0 &&
			 sfw_tokenizer_special_id(tok, "<|im_end|>") >= 0;
	int use_chat = !ids_path && !raw && chat_model;
	if ((chat || inter || system || kw) && !chat_model) {
		char ed[1024];
		fprintf(stderr, "%s: '%s' is not a chat model (its tokenizer has no <|im_start|>/<|im_end|>)\n", C,
			sfw_esc(dir, ed, sizeof(ed)));
		rc = SFW_EXIT_USAGE;
		goto out_rc;
	}
	if (use_chat) {
		if ((s = sfw_chat_template_load(dir, &tpl, &err)) != SFW_OK)
			goto fail;
		if (!(msgs = cJSON_CreateArray())) {
			s = sfw_fail(&err, SFW_E_NOMEM, "out of memory");
			goto fail;
		}
		if (system && (s = add_msg(msgs, "system", system, strlen(system), &err)) != SFW_OK)
			goto fail;
	}
	const char *body = prompt ? prompt : in.data ? in.data : "";
	int first_turn = !inter || prompt || file;
	if (!ids_path && first_turn) {
		if (use_chat) {
			if ((s = add_msg(msgs, "user", body, strlen(body), &err)) != SFW_OK ||
			    (s = first_turn_ids(tok, tpl, msgs, kw, &text, &ids, &n_ids, &err)) != SFW_OK)
				goto fail;
		} else if ((s = sfw_tokenizer_encode(tok, body, strlen(body), 1, &ids, &n_ids, &err)) != SFW_OK)
			goto fail;
	}
	/* The context: -c, else (chat) 4096, else prompt + -n (-n 0: + 4096). */
	int64_t limit = ctx_size ? (int64_t)ctx_size
			: inter  ? CHAT_CTX_DEFAULT
				 : (int64_t)n_ids + (n_gen ? (int64_t)n_gen : CHAT_CTX_DEFAULT);
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = limit;
	if ((int64_t)max_ctx > xp.n_ctx)
		xp.n_ctx = (int64_t)max_ctx;
	xp.dense_as_sparse = das;
	int cuda = !strcmp(sfw_model_device_name(m), "cuda");
	if (chunk)
		xp.prefill_chunk = (int)chunk;
	else if (cuda) /* bounded activations, large GEMMs; no more rows than the prompt */
		xp.prefill_chunk = n_ids && n_ids < 8192 ? (int)((n_ids + 63) / 64 * 64) : 8192;
	if (cuda) { /* the plan at start, and a context that cannot fit refused with its numbers */
		struct sfw_mem_plan pl;
		s = sfw_plan_check(m, xp.n_ctx, xp.prefill_chunk, &pl, &err);
		sfw_plan_print(stderr, C, &pl, xp.n_ctx, xp.prefill_chunk);
		if (s != SFW_OK)
			goto fail;
	}
	if ((s = sfw_ctx_new(m, &xp, &ctx, &err)) != SFW_OK)
		goto fail;
	if ((s = sfw_sampler_init(&smp, &sp, seed, cf->vocab_size, &err)) != SFW_OK)
		goto fail;
	smp_ok = 1;
	struct sfw_gen_params gp = sfw_gen_default_params();
	gp.max_tokens = (int64_t)n_gen;
	gp.max_ctx = limit;
	gp.eos = &eos;
	gp.stop = stops;
	gp.n_stop = n_stop;
	gp.skip_special = !special;
	struct sfw_gen_stats st;
	st.pending = -1;
	if (inter) {
		/* Ctrl-C stops the reply (the flag is polled per token) */
		ro.intr = cli_interrupt_polled();
		ro.reply = &reply;
		if (!(lin = sfw_calloc(1, sizeof(*lin)))) {
			s = sfw_fail(&err, SFW_E_NOMEM, "out of memory");
			goto fail;
		}
	}
	int turns = 0;
	for (;;) {
		if (inter && (turns > 0 || !first_turn)) {
			/* the next user turn, after a visible prompt */
			printf("%s> ", turns ? "\n" : "");
			if ((s = cli_stdout_flush(&err)) != SFW_OK)
				goto fail;
			int t = read_turn(C, lin, &line, ro.intr, &rc);
			if (rc)
				goto out_rc;
			if (t == TURN_INTR) { /* Ctrl-C at the prompt ends the chat */
				int sig = cli_interrupt_take();
				printf("\n");
				if ((s = cli_stdout_flush(&err)) != SFW_OK)
					goto fail;
				rc = 128 + sig;
				goto out_rc;
			}
			if (t == TURN_EOF)
				break;
			if (!line.len)
				continue;
			sfw_free(ids);
			ids = NULL;
			if ((s = add_msg(msgs, "user", line.data, line.len, &err)) != SFW_OK)
				goto fail;
			if (turns == 0)
				s = first_turn_ids(tok, tpl, msgs, kw, &text, &ids, &n_ids, &err);
			else
				s = next_turn_ids(tok, &eos, tpl, msgs, kw, st.pending, &text, &ids, &n_ids, &err);
			if (s != SFW_OK)
				goto fail;
		}
		gp.ids = ids;
		gp.n_ids = n_ids;
		ro.shown = 0;
		reply.len = 0;
		s = sfw_generate(ctx, tok, &smp, &gp, on_token, &ro, &st, &err);
		if (ro.status != SFW_OK) {
			s = ro.status;
			err = ro.err;
			goto fail;
		}
		if (s != SFW_OK)
			goto fail;
		turns++;
		if (!inter)
			printf("\n");
		if ((s = cli_stdout_flush(&err)) != SFW_OK)
			goto fail;
		if (inter && ro.intr && *ro.intr) {
			/* a reply stopped by Ctrl-C: its text so far stays in the history */
			int sig = cli_interrupt_take();
			if (sig != SIGINT) { /* SIGTERM ends the chat */
				print_stats(C, &st, sfw_model_device_name(m), seed);
				rc = 128 + sig;
				goto out_rc;
			}
			printf("\n");
			if ((s = cli_stdout_flush(&err)) != SFW_OK)
				goto fail;
		}
		print_stats(C, &st, sfw_model_device_name(m), seed);
		if (!inter)
			break;
		if ((s = add_msg(msgs, "assistant", reply.data ? reply.data : "", reply.len, &err)) != SFW_OK)
			goto fail;
	}
	if (inter) {
		printf("\n");
		if ((s = cli_stdout_flush(&err)) != SFW_OK)
			goto fail;
	}
	rc = 0;
	goto out_rc;
fail:
	rc = cli_report(s, &err);
out_rc:
	if (smp_ok)
		sfw_sampler_release(&smp);
	sfw_free(ids);
	sfw_free(lin);
	sfw_buf_release(&text);
	sfw_buf_release(&in);
	sfw_buf_release(&line);
	sfw_buf_release(&reply);
	cJSON_Delete(msgs);
	cJSON_Delete(kw);
	sfw_chat_template_free(tpl);
	sfw_ctx_free(ctx);
	sfw_tokenizer_free(tok);
	sfw_model_free(m);
	return rc;
}
