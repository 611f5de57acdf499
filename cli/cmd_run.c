/* salafw run - generate text with a verified model through the runner's
 * generation API (runner/generate.h): a prompt (-p, -f, --chat or --ids), or
 * with -i a multi-turn ChatML chat whose history stays in the context; the
 * text streams to stdout, one stats line per reply goes to stderr (speed,
 * finish reason, context use and the seed that repeats the run).
 *
 * Also home of the helpers that run, score and bench share (cli.h). */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/tokenizer.h"
#include "json.h"
#include "log.h"
#include "runner/generate.h"
#include "runner/runner.h"
#include "runner/sampler.h"
#include "tools/tools.h"

#include <errno.h>
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
	if (mp->device == SFW_DEVICE_AUTO && dev && !strcmp(dev, "cpu"))
		mp->device = SFW_DEVICE_CPU;
	mp->threads = (int)o->threads;
	const char *th = getenv("SALAFW_THREADS");
	if (!o->threads && th && *th) {
		unsigned long long n;
		if (!cli_parse_u64(cmd, "SALAFW_THREADS", th, &n))
			return SFW_EXIT_USAGE;
		if (n > 256)
			return cli_usage_error(cmd, "SALAFW_THREADS must be at most 256 (0 = all cores)");
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

static const struct cli_opt opts[] = {
	{"prompt", 'p', "TEXT", "prompt text (encoded with BOS); with -i the first user turn"},
	{"file", 'f', "FILE", "prompt text from a file"},
	{"interactive", 'i', NULL, "chat: read user turns from standard input after a \"> \" prompt (ChatML)"},
	{"chat", 0, NULL, "wrap the prompt (-p, -f, or standard input) as one ChatML user turn"},
	{"system", 0, "TEXT", "with --chat or -i: a system message"},
	{"ids", 0, "FILE", "prompt as token ids (text integers, or safetensors with input_ids)"},
	{"n-predict", 'n', "N", "tokens per reply at most (default 128, with -i 512; 0 = to EOS or the context)"},
	{"ctx-size", 'c', "N", "context size: replies stop there (default prompt + -n, or + 4096; -i 4096)"},
	{"stop", 0, "STR", "stop where STR appears in the reply (STR not shown; repeatable)"},
	{"temp", 0, "T", "sampling temperature (default 0.9; 0 = greedy)"},
	{"top-k", 0, "K", "keep the K most likely tokens (default 0 = off)"},
	{"top-p", 0, "P", "nucleus sampling mass (default 1 = off)"},
	{"seed", 0, "S", "sampler seed (default: random, printed with the stats)"},
	{"greedy", 0, NULL, "always take the most likely token"},
	{"ignore-eos", 0, NULL, "do not stop at end-of-sequence tokens"},
	{"print-ids", 0, NULL, "print the generated token ids (one line) instead of text"},
	{"device", 0, "cpu|cuda", "where to run (default: cuda when available, else cpu)"},
	{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"},
	{"max-context", 0, "N", "reserve the context for N tokens up front (default: the context size)"},
	{"prefill-chunk", 0, "C", "prefill rows per piece (default 256 on the CPU, 8192 on CUDA)"},
	CLI_MODEL_OPT_ROWS("run"),
	{0},
};

#define CHAT_STDIN_MAX (64u << 20)
#define PROMPT_FILE_MAX (64u << 20)
#define CHAT_LINE_MAX (1u << 20)
#define CHAT_CTX_DEFAULT 4096

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

/* One user line for -i: *eof = 1 at the end of input. The line loses its
 * "\n" (and a "\r" before it); NUL bytes and lines over CHAT_LINE_MAX are
 * refused. Returns an exit code (0 = ok). */
static int read_turn(const char *cmd, struct sfw_buf *b, int *eof)
{
	b->len = 0;
	*eof = 0;
	int c;
	while ((c = getchar()) != EOF && c != '\n') {
		char ch = (char)c;
		if (ch == '\0') {
			fprintf(stderr, "%s: -i: a NUL byte in the input; turns must be text\n", cmd);
			return SFW_EXIT_IO;
		}
		if (sfw_buf_append(b, &ch, 1) != SFW_OK) {
			fprintf(stderr, "%s: -i: a line longer than %u MiB\n", cmd, CHAT_LINE_MAX >> 20);
			return SFW_EXIT_IO;
		}
	}
	if (c == EOF && ferror(stdin)) {
		fprintf(stderr, "%s: -i: cannot read standard input: %s\n", cmd, strerror(errno));
		return SFW_EXIT_IO;
	}
	if (c == EOF && b->len == 0)
		*eof = 1;
	if (b->len && b->data[b->len - 1] == '\r')
		b->data[--b->len] = 0;
	return 0;
}

struct run_out {
	int print_ids;
	int64_t shown;   /* ids printed (--print-ids) */
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
	}
	if ((o->status = cli_stdout_flush(&o->err)) != SFW_OK)
		return 1;
	return 0;
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

/* The ids of chat turn 2+: the reply's last token (never fed, stats.pending)
 * unless it was an end-of-sequence id, <|im_end|> closing the reply, then
 * "\n" + the user turn + the assistant header, without BOS. */
static enum sfw_status next_turn_ids(const struct sfw_tokenizer *tok, const struct sfw_eos_set *eos,
				     int32_t pending, const char *msg, int32_t **ids, size_t *n, struct sfw_err *err)
{
	int32_t im_end = sfw_tokenizer_special_id(tok, "<|im_end|>");
	if (im_end < 0)
		return sfw_fail(err, SFW_E_FORMAT, "the tokenizer has no <|im_end|> token for a chat");
	struct sfw_buf t;
	sfw_buf_init(&t, CHAT_LINE_MAX + 4096);
	struct sfw_chat_msg m = {"user", msg};
	enum sfw_status s = sfw_buf_append(&t, "\n", 1);
	if (s == SFW_OK)
		s = sfw_chat_format(&m, 1, 1, &t, err);
	int32_t *body = NULL;
	size_t nb = 0;
	if (s == SFW_OK)
		s = sfw_tokenizer_encode(tok, t.data, t.len, 0, &body, &nb, err);
	sfw_buf_release(&t);
	if (s != SFW_OK)
		return s;
	int lead = pending >= 0 && !sfw_eos_has(eos, pending);
	int32_t *v = sfw_malloc((nb + 2) * sizeof(int32_t));
	if (!v) {
		sfw_free(body);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	size_t k = 0;
	if (lead)
		v[k++] = pending;
	v[k++] = im_end;
	memcpy(v + k, body, nb * sizeof(int32_t));
	sfw_free(body);
	*ids = v;
	*n = k + nb;
	return SFW_OK;
}

int cmd_run(int argc, char **argv)
{
	const char *C = "salafw run";
	const char *prompt = NULL, *ids_path = NULL, *system = NULL, *file = NULL;
	const char *stops[SFW_STOP_MAX];
	size_t n_stop = 0;
	int chat = 0, inter = 0, print_ids = 0, das = 0, have_seed = 0, have_n = 0, ignore_eos = 0;
	unsigned long long n_gen = 128, u, max_ctx = 0, ctx_size = 0, chunk = 0;
	uint64_t seed = 0;
	struct cli_model_opts mo;
	cli_model_opts_init(&mo);
	double d;
	struct sfw_op_sample_params sp = sfw_sampler_default_params();
	double temp = sp.temperature, top_p = sp.top_p;
	struct cli_parser cp;
	const char *arg;
	int k;
	cli_init(&cp, C, argc, argv, opts);
	while ((k = cli_next_model(&cp, &mo, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, C, "MODEL_DIR (-p TEXT | -f FILE | --chat | -i | --ids FILE) [options]", opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *nm = opts[k].name;
		if (!strcmp(nm, "prompt"))
			prompt = arg;
		else if (!strcmp(nm, "file"))
			file = arg;
		else if (!strcmp(nm, "interactive"))
			inter = 1;
		else if (!strcmp(nm, "chat"))
			chat = 1;
		else if (!strcmp(nm, "system"))
			system = arg;
		else if (!strcmp(nm, "ids"))
			ids_path = arg;
		else if (!strcmp(nm, "n-predict")) {
			if (!cli_parse_u64(C, "n", arg, &n_gen)) /* "-n: ...", as before --n-predict */
				return SFW_EXIT_USAGE;
			if (n_gen > (1u << 24))
				return cli_usage_error(C, "-n %llu is more than %u tokens", n_gen, 1u << 24);
			have_n = 1;
		} else if (!strcmp(nm, "ctx-size")) {
			if (!cli_parse_u64(C, nm, arg, &ctx_size))
				return SFW_EXIT_USAGE;
			if (ctx_size < 1 || ctx_size > (1ull << 30))
				return cli_usage_error(C, "--ctx-size must be 1 to %llu tokens", 1ull << 30);
		} else if (!strcmp(nm, "stop")) {
			if (n_stop >= SFW_STOP_MAX)
				return cli_usage_error(C, "more than %d --stop strings", SFW_STOP_MAX);
			size_t L = strlen(arg);
			if (L < 1 || L > SFW_STOP_MAX_LEN || !sfw_utf8_valid((const unsigned char *)arg, L))
				return cli_usage_error(C, "--stop wants 1 to %d bytes of UTF-8", SFW_STOP_MAX_LEN);
			stops[n_stop++] = arg;
		} else if (!strcmp(nm, "temp")) {
			if (!cli_parse_double(C, nm, arg, &d))
				return SFW_EXIT_USAGE;
			temp = d;
		} else if (!strcmp(nm, "top-k")) {
			if (!cli_parse_u64(C, nm, arg, &u))
				return SFW_EXIT_USAGE;
			if (u > INT32_MAX)
				return cli_usage_error(C, "--top-k %llu is more than %d", u, INT32_MAX);
			sp.top_k = (int)u;
		} else if (!strcmp(nm, "top-p")) {
			if (!cli_parse_double(C, nm, arg, &d))
				return SFW_EXIT_USAGE;
			top_p = d;
		} else if (!strcmp(nm, "seed")) {
			if (!cli_parse_u64(C, nm, arg, &u))
				return SFW_EXIT_USAGE;
			seed = u;
			have_seed = 1;
		} else if (!strcmp(nm, "greedy"))
			sp.greedy = 1;
		else if (!strcmp(nm, "ignore-eos"))
			ignore_eos = 1;
		else if (!strcmp(nm, "print-ids"))
			print_ids = 1;
		else if (!strcmp(nm, "dense-as-sparse"))
			das = 1;
		else if (!strcmp(nm, "max-context")) {
			if (!cli_parse_u64(C, nm, arg, &max_ctx))
				return SFW_EXIT_USAGE;
			if (max_ctx > (1ull << 30))
				return cli_usage_error(C, "--max-context %llu is more than %llu tokens", max_ctx, 1ull << 30);
		} else if (!strcmp(nm, "prefill-chunk")) {
			if (!cli_parse_u64(C, nm, arg, &chunk))
				return SFW_EXIT_USAGE;
			if (chunk < 1 || chunk > (1u << 20))
				return cli_usage_error(C, "--prefill-chunk must be 1 to %u rows", 1u << 20);
		}
	}
	/* Sampler values are checked here, before any model is loaded, as the
	 * floats the sampler gets. Below 1e-6 a temperature only rounds the
	 * logits apart (1e-40 would overflow 1/T): 0 already means greedy. */
	if (temp < 0)
		return cli_usage_error(C, "--temp %g is negative (0 = greedy)", temp);
	if (temp > 0 && temp < 1e-6)
		return cli_usage_error(C, "--temp %g is too small; use --temp 0 for greedy", temp);
	if (temp > 1e6)
		return cli_usage_error(C, "--temp %g is too large (at most 1e6)", temp);
	if (!((float)top_p > 0 && top_p <= 1))
		return cli_usage_error(C, "--top-p %g must be in (0, 1]", top_p);
	sp.temperature = (float)temp;
	sp.top_p = (float)top_p;
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	if ((prompt != NULL) + (file != NULL) + (ids_path != NULL) > 1 || (ids_path && (chat || inter)) ||
	    (chat && inter) || (!prompt && !file && !ids_path && !chat && !inter))
		return cli_usage_error(C, "give exactly one of -p TEXT, -f FILE, --chat, -i or --ids FILE");
	if (system && !chat && !inter)
		return cli_usage_error(C, "--system needs --chat or -i");
	if (n_stop && print_ids)
		return cli_usage_error(C, "--stop needs text output (not --print-ids)");
	if (!have_seed)
		seed = random_seed();
	if (inter && !have_n)
		n_gen = 512;
	struct sfw_model_params mp;
	if (cli_model_params(C, &mo, &mp))
		return SFW_EXIT_USAGE;
	const char *dir = cp.pos[0];
	int rc = cli_model_gate(C, dir, mo.no_verify, mo.verify_full, mo.pubkey);
	if (rc)
		return rc;

	struct sfw_err err = {0};
	enum sfw_status s;
	struct sfw_model *m = NULL;
	struct sfw_ctx *ctx = NULL;
	struct sfw_tokenizer *tok = NULL;
	struct sfw_sampler smp;
	int smp_ok = 0;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	struct sfw_buf text, in, line;
	/* The chat turn is the message plus the system text and a few markers. */
	sfw_buf_init(&text, CHAT_STDIN_MAX + (system ? strlen(system) : 0) + 4096);
	sfw_buf_init(&in, CHAT_STDIN_MAX);
	sfw_buf_init(&line, CHAT_LINE_MAX);
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
	const char *body = prompt ? prompt : in.data ? in.data : "";
	int first_turn = !inter || prompt || file;
	if (!ids_path && first_turn) {
		if (chat || inter) {
			struct sfw_chat_msg msgs[2];
			size_t nm = 0;
			if (system)
				msgs[nm++] = (struct sfw_chat_msg){"system", system};
			msgs[nm++] = (struct sfw_chat_msg){"user", body};
			if ((s = sfw_chat_format(msgs, nm, 1, &text, &err)) != SFW_OK)
				goto fail;
		} else if ((s = sfw_buf_append(&text, body, strlen(body))) != SFW_OK) {
			sfw_fail(&err, s, "prompt too long");
			goto fail;
		}
		if ((s = sfw_tokenizer_encode(tok, text.data ? text.data : "", text.len, 1, &ids, &n_ids, &err)) !=
		    SFW_OK)
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
	struct sfw_gen_stats st;
	st.pending = -1;
	int turns = 0;
	for (;;) {
		if (inter && (turns > 0 || !first_turn)) {
			/* the next user turn, after a visible prompt */
			int eof;
			printf("%s> ", turns ? "\n" : "");
			if ((s = cli_stdout_flush(&err)) != SFW_OK)
				goto fail;
			if ((rc = read_turn(C, &line, &eof)) != 0)
				goto out_rc;
			if (eof)
				break;
			if (!line.len)
				continue;
			sfw_free(ids);
			ids = NULL;
			if (turns == 0) {
				struct sfw_chat_msg msgs[2];
				size_t nm = 0;
				if (system)
					msgs[nm++] = (struct sfw_chat_msg){"system", system};
				msgs[nm++] = (struct sfw_chat_msg){"user", line.data};
				text.len = 0;
				if ((s = sfw_chat_format(msgs, nm, 1, &text, &err)) != SFW_OK ||
				    (s = sfw_tokenizer_encode(tok, text.data, text.len, 1, &ids, &n_ids, &err)) != SFW_OK)
					goto fail;
			} else if ((s = next_turn_ids(tok, &eos, st.pending, line.data, &ids, &n_ids, &err)) != SFW_OK) {
				goto fail;
			}
		}
		gp.ids = ids;
		gp.n_ids = n_ids;
		ro.shown = 0;
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
		print_stats(C, &st, sfw_model_device_name(m), seed);
		if (!inter)
			break;
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
	sfw_buf_release(&text);
	sfw_buf_release(&in);
	sfw_buf_release(&line);
	sfw_ctx_free(ctx);
	sfw_tokenizer_free(tok);
	sfw_model_free(m);
	return rc;
}
