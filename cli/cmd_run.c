/* salafw run - generate text with a verified model: prompt (-p, --chat or
 * --ids) -> prefill -> sample until EOS or -n tokens, streaming the text;
 * then one line of prefill and decode speed on stderr.
 *
 * Also home of the helpers that run, score and bench share (cli.h). */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "kernels/ops.h"
#include "runner/bench.h"
#include "runner/runner.h"
#include "runner/safetensors.h"
#include "runner/sampler.h"
#include "runner/tokenizer.h"
#include "verify/verify.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- salafw run ------------------------------------------------------------- */

static const struct cli_opt opts[] = {
	{"prompt", 'p', "TEXT", "prompt text (encoded with BOS)"},
	{"chat", 0, NULL, "wrap the prompt (-p, or standard input) as a ChatML user turn"},
	{"system", 0, "TEXT", "with --chat: a system message"},
	{"ids", 0, "FILE", "prompt as token ids (text integers, or safetensors with input_ids)"},
	{"n", 'n', "N", "tokens to generate at most (default 128)"},
	{"temp", 0, "T", "sampling temperature (default 0.9; 0 = greedy)"},
	{"top-k", 0, "K", "keep the K most likely tokens (default 0 = off)"},
	{"top-p", 0, "P", "nucleus sampling mass (default 1 = off)"},
	{"seed", 0, "S", "sampler seed"},
	{"greedy", 0, NULL, "always take the most likely token"},
	{"print-ids", 0, NULL, "print the generated token ids (one line) instead of text"},
	{"device", 0, "cpu|cuda", "where to run (default: cuda when available, else cpu)"},
	{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"},
	{"max-context", 0, "N", "reserve the context for N tokens (default prompt + -n)"},
	{"prefill-chunk", 0, "C", "prefill rows per piece (default 256 on the CPU, 8192 on CUDA)"},
	CLI_MODEL_OPT_ROWS("run"),
	{0},
};

#define CHAT_STDIN_MAX (64u << 20)

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


int cmd_run(int argc, char **argv)
{
	const char *C = "salafw run";
	const char *prompt = NULL, *ids_path = NULL, *system = NULL;
	int chat = 0, print_ids = 0, das = 0;
	unsigned long long n_gen = 128, u, max_ctx = 0, chunk = 0;
	struct cli_model_opts mo;
	cli_model_opts_init(&mo);
	double d;
	struct sfw_sampler_params sp = sfw_sampler_default_params();
	double temp = sp.temperature, top_p = sp.top_p;
	struct cli_parser cp;
	const char *arg;
	int k;
	cli_init(&cp, C, argc, argv, opts);
	while ((k = cli_next_model(&cp, &mo, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, C, "MODEL_DIR (-p TEXT | --chat | --ids FILE) [options]", opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *nm = opts[k].name;
		if (!strcmp(nm, "prompt"))
			prompt = arg;
		else if (!strcmp(nm, "chat"))
			chat = 1;
		else if (!strcmp(nm, "system"))
			system = arg;
		else if (!strcmp(nm, "ids"))
			ids_path = arg;
		else if (!strcmp(nm, "n")) {
			if (!cli_parse_u64(C, nm, arg, &n_gen))
				return SFW_EXIT_USAGE;
			if (n_gen > (1u << 24))
				return cli_usage_error(C, "-n %llu is more than %u tokens", n_gen, 1u << 24);
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
			sp.seed = u;
		} else if (!strcmp(nm, "greedy"))
			sp.greedy = 1;
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
	if ((prompt != NULL) + (ids_path != NULL) > 1 || (ids_path && chat) || (!prompt && !ids_path && !chat))
		return cli_usage_error(C, "give exactly one of -p TEXT, --chat or --ids FILE");
	if (system && !chat)
		return cli_usage_error(C, "--system needs --chat");
	struct sfw_model_params mp = sfw_model_default_params();
	mp.threads = (int)mo.threads;
	mp.device = mo.device;
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
	float *logits = NULL;
	struct sfw_buf text, out, in;
	/* The chat turn is the message plus the system text and a few markers. */
	sfw_buf_init(&text, CHAT_STDIN_MAX + (system ? strlen(system) : 0) + 4096);
	sfw_buf_init(&out, 1u << 20);
	sfw_buf_init(&in, CHAT_STDIN_MAX);

	/* Input problems are reported before the model is loaded. */
	char tpath[4200];
	struct stat st;
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.model", dir);
	int have_tok = stat(tpath, &st) == 0;
	if (!have_tok && (prompt || chat)) {
		fprintf(stderr, "%s: '%s' has no tokenizer.model (use --ids)\n", C, dir);
		rc = SFW_EXIT_USAGE;
		goto out_rc;
	}
	if (ids_path && (rc = cli_read_ids(C, ids_path, &ids, &n_ids)) != 0)
		goto out_rc;
	if (chat && !prompt && (rc = read_stdin(C, &in)) != 0)
		goto out_rc;

	if ((s = sfw_model_load(dir, &mp, &m, &err)) != SFW_OK)
		goto fail;
	const struct sfw_config *cf = sfw_model_config(m);
	if (have_tok && (s = sfw_tokenizer_load(dir, cf->vocab_size, &tok, &err)) != SFW_OK)
		goto fail;
	if (!ids_path) {
		if (chat) {
			struct sfw_chat_msg msgs[2];
			size_t nm = 0;
			if (system)
				msgs[nm++] = (struct sfw_chat_msg){"system", system};
			msgs[nm++] = (struct sfw_chat_msg){"user", prompt ? prompt : in.data ? in.data : ""};
			if ((s = sfw_chat_format(msgs, nm, 1, &text, &err)) != SFW_OK)
				goto fail;
		} else if ((s = sfw_buf_append(&text, prompt, strlen(prompt))) != SFW_OK) {
			sfw_fail(&err, s, "prompt too long");
			goto fail;
		}
		if ((s = sfw_tokenizer_encode(tok, text.data ? text.data : "", text.len, 1, &ids, &n_ids, &err)) !=
		    SFW_OK)
			goto fail;
	}
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = (int64_t)n_ids + (int64_t)n_gen;
	if ((int64_t)max_ctx > xp.n_ctx)
		xp.n_ctx = (int64_t)max_ctx;
	xp.dense_as_sparse = das;
	int cuda = !strcmp(sfw_model_device_name(m), "cuda");
	if (chunk)
		xp.prefill_chunk = (int)chunk;
	else if (cuda) /* bounded activations, large GEMMs; no more rows than the prompt */
		xp.prefill_chunk = n_ids < 8192 ? (int)((n_ids + 63) / 64 * 64) : 8192;
	if (cuda) { /* the plan at start, and a context that cannot fit refused with its numbers */
		struct sfw_mem_plan pl;
		s = sfw_bench_mem_check(m, xp.n_ctx, xp.prefill_chunk, &pl, &err);
		sfw_bench_mem_print(stderr, C, &pl, xp.n_ctx, xp.prefill_chunk);
		if (s != SFW_OK)
			goto fail;
	}
	if ((s = sfw_ctx_new(m, &xp, &ctx, &err)) != SFW_OK)
		goto fail;
	if ((s = sfw_sampler_init(&smp, &sp, cf->vocab_size, &err)) != SFW_OK)
		goto fail;
	smp_ok = 1;
	logits = sfw_malloc((size_t)cf->vocab_size * sizeof(float));
	if (!logits) {
		s = sfw_fail(&err, SFW_E_NOMEM, "out of memory");
		goto fail;
	}
	double t0 = cli_now_s();
	if ((s = sfw_ctx_prefill(ctx, ids, n_ids, logits, &err)) != SFW_OK)
		goto fail;
	double t1 = cli_now_s();
	struct sfw_tokdec dec;
	if (tok) {
		sfw_tokdec_init(&dec, tok, 1);
		/* Prime with the prompt so the first piece keeps its leading space. */
		if ((s = sfw_tokdec_prime(&dec, ids, n_ids, &err)) != SFW_OK)
			goto fail;
	}
	unsigned long long produced = 0, steps = 0;
	int use_text = tok && !print_ids;
	/* On CUDA the token is chosen on the GPU (kernels/sample.cu, the sampler's
	 * meaning for the sampler's own uniform stream): one id per step crosses
	 * to the host instead of the logits. SALAFW_CUDA_NOSAMPLE=1: host sampler. */
	const char *ns = getenv("SALAFW_CUDA_NOSAMPLE");
	int dev_sample = cuda && !(ns && *ns && strcmp(ns, "0") != 0);
	struct sfw_op_sample_params osp = {sp.temperature, sp.top_k, sp.top_p, sp.greedy};
	int32_t id = -1;
	for (; produced < n_gen; produced++) {
		if (produced == 0 || !dev_sample)
			id = sfw_sampler_sample(&smp, logits, cf->vocab_size);
		if (sfw_sampler_is_stop(id, cf->eos_token_ids, cf->n_eos))
			break;
		if (use_text) {
			out.len = 0;
			if ((s = sfw_tokdec_push(&dec, id, &out, &err)) != SFW_OK)
				goto fail;
			fwrite(out.data ? out.data : "", 1, out.len, stdout);
		} else {
			printf("%s%d", produced ? " " : "", id);
		}
		if ((s = cli_stdout_flush(&err)) != SFW_OK)
			goto fail;
		if (produced + 1 == n_gen)
			break; /* no forward pass for a token nobody will read */
		if (dev_sample)
			s = sfw_ctx_decode_next(ctx, id, &osp, sfw_op_sample_uniform(smp.rng), &id, &err);
		else
			s = sfw_ctx_decode(ctx, id, logits, &err);
		if (s != SFW_OK)
			goto fail;
		steps++;
	}
	double t2 = cli_now_s();
	if (use_text) {
		out.len = 0;
		if ((s = sfw_tokdec_flush(&dec, &out, &err)) != SFW_OK)
			goto fail;
		fwrite(out.data ? out.data : "", 1, out.len, stdout);
	}
	printf("\n");
	if ((s = cli_stdout_flush(&err)) != SFW_OK)
		goto fail;
	/* Decode speed counts the one-token forward passes actually made. */
	fprintf(stderr, "%s: prefill %zu tokens in %.3f s (%.1f tok/s), decode %llu tokens in %.3f s (%.1f tok/s) [%s]\n",
		C, n_ids, t1 - t0, (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), steps, t2 - t1,
		steps ? (double)steps / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, sfw_model_device_name(m));
	rc = 0;
	goto out_rc;
fail:
	rc = cli_report(s, &err);
out_rc:
	if (smp_ok)
		sfw_sampler_release(&smp);
	sfw_free(logits);
	sfw_free(ids);
	sfw_buf_release(&text);
	sfw_buf_release(&out);
	sfw_buf_release(&in);
	sfw_ctx_free(ctx);
	sfw_tokenizer_free(tok);
	sfw_model_free(m);
	return rc;
}
