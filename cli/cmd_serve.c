/* salafw serve - an OpenAI-compatible HTTP server on a verified model
 * (serve/serve.h): the same gate, model options and messages as run; binds
 * to loopback unless --host says otherwise. SIGTERM or SIGINT starts the
 * drain: new requests get 503, the accepted ones finish, exit 0. A second
 * signal, or --drain-timeout, ends the accepted requests at once (503, or an
 * error event in a stream) and exits 128 + the signal's number. */
#include "cli.h"
#include "buf.h"
#include "file.h"
#include "log.h"
#include "formats/tokenizer.h"
#include "runner/generate.h"
#include "runner/runner.h"
#include "serve/serve.h"
#include "tools/tools.h"
#include "verify/verify.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The command line's values (cli_parse_args fills them from the table). */
struct serve_args {
	struct sfw_serve_params sp;
	const char *key, *key_file;
	const char *served[SFW_SERVE_NAMES_MAX];
	int n_served;
	uint64_t max_context, drain_timeout;
	double prefix_gib; /* < 0: not given */
	uint64_t prefix_every;
	struct cli_model_opts mo;
};

static int take_name(const char *cmd, const char *label, const char *v, void *dst)
{
	struct serve_args *a = dst;
	if (!*v || strlen(v) > 255)
		return cli_usage_error(cmd, "%s must have 1 to 255 bytes", label);
	if (a->n_served == SFW_SERVE_NAMES_MAX)
		return cli_usage_error(cmd, "at most %d %s", SFW_SERVE_NAMES_MAX, label);
	a->served[a->n_served++] = v;
	return 0;
}

static int take_origins(const char *cmd, const char *label, const char *v, void *dst)
{
	if (!*v || strlen(v) > 4000)
		return cli_usage_error(cmd, "%s must have 1 to 4000 bytes", label);
	((struct serve_args *)dst)->sp.allowed_origins = v;
	return 0;
}

#define OFF(f) offsetof(struct serve_args, f)
static const struct cli_arg args[] = {
    {{"host", 0, "ADDR", "address to listen on (default 127.0.0.1: this machine only)"},
     CLI_K_STR, OFF(sp.host), 0, 0, NULL, NULL},
    {{"port", 0, "N", "TCP port (default 8080; 0 = any free port, printed)"}, CLI_K_INT, OFF(sp.port), 0, 65535, NULL, NULL},
    {{"api-key", 0, "KEY", "ask every /v1 request for Authorization: Bearer KEY"}, CLI_K_STR, OFF(key), 0, 0, NULL, NULL},
    {{"api-key-file", 0, "FILE", "the same with the key read from FILE (first line)"},
     CLI_K_STR, OFF(key_file), 0, 0, NULL, NULL},
    {{"max-running", 0, "N", "sequences decoded together at most (default 16, at most 64)"},
     CLI_K_INT, OFF(sp.max_running), 1, 64, NULL, NULL},
    {{"max-queue", 0, "N", "requests waiting beyond those (default 256; more get 429)"},
     CLI_K_INT, OFF(sp.max_queue), 0, 65536, NULL, NULL},
    {{"max-context", 0, "N", "context positions per request, prompt and reply (default 4096)"},
     CLI_K_U64, OFF(max_context), 1, 1 << 30, NULL, NULL},
    {{"prefill-chunk", 0, "N", "prompt tokens per engine step (default 256 on the CPU, 512 on CUDA)"},
     CLI_K_INT, OFF(sp.prefill_chunk), 1, 1 << 20, NULL, NULL},
    {{"drain-timeout", 0, "SECONDS", "after SIGTERM/SIGINT, end the unfinished requests after this long (default 0: wait)"},
     CLI_K_U64, OFF(drain_timeout), 0, 86400, NULL, NULL},
    {{"receive-timeout", 0, "SECONDS",
      "close a connection whose request has not all arrived in this long (default 60; 0: none)"},
     CLI_K_DOUBLE, OFF(sp.receive_timeout), 0, 86400, NULL, NULL},
    {{"prefix-cache", 0, "GIB",
      "keep prompt states for later prompts that start with them, up to GIB GiB in 8 entries (default: half the KV "
      "pool; 0: off)"},
     CLI_K_DOUBLE, OFF(prefix_gib), 0, 1 << 20, NULL, NULL},
    {{"prefix-every", 0, "N", "keep a long prompt's state also each N tokens of its prefill (default 32768)"},
     CLI_K_U64, OFF(prefix_every), 64, (uint64_t)1 << 40, NULL, NULL},
    {{"conns-per-ip", 0, "N", "open connections per client address (default 128; 0: no limit, e.g. behind a proxy)"},
     CLI_K_INT, OFF(sp.conns_per_ip), 0, 65536, NULL, NULL},
    CLI_DEVICE_ARG(struct serve_args, mo, "where to run (default: cuda when available, else cpu)"),
    CLI_KV_CACHE_ARG(struct serve_args, mo),
    {{"served-model-name", 0, "NAME",
      "a model id requests may name, listed by /v1/models (repeatable; default: the manifest's repo id, listed, and "
      "the directory's name)"},
     CLI_K_CALL, 0, 0, 0, take_name, NULL},
    {{"allowed-origins", 0, "LIST",
      "CORS: web pages of these origins (comma-separated scheme://host[:port], or *) may read the answers (default: "
      "none)"},
     CLI_K_CALL, 0, 0, 0, take_origins, NULL},
    {{"quiet", 0, NULL, "no request log lines on stderr"}, CLI_K_FLAG, OFF(sp.quiet), 0, 0, NULL, NULL},
    CLI_MODEL_ARGS(struct serve_args, mo, "serve"),
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

#define KEY_FILE_MAX 4096

/* The key of --api-key-file: its first line, without the line end. */
static int read_key_file(const char *cmd, const char *path, struct sfw_buf *b)
{
	struct sfw_err err = {0};
	if (sfw_read_file(path, KEY_FILE_MAX, b, &err) != SFW_OK) {
		fprintf(stderr, "%s: --api-key-file: %s\n", cmd, err.msg);
		return SFW_EXIT_IO;
	}
	size_t n = 0;
	while (n < b->len && b->data[n] != '\n' && b->data[n] != '\r' && b->data[n] != '\0')
		n++;
	if (n == 0) {
		char ep[1024];
		fprintf(stderr, "%s: --api-key-file: '%s' holds no key on its first line\n", cmd,
			sfw_esc(path, ep, sizeof(ep)));
		return SFW_EXIT_IO;
	}
	b->data[n] = 0;
	b->len = n;
	return 0;
}

/* The repo id of DIR's manifest (already verified by the gate), or "". */
static void manifest_repo(const char *dir, char *out, size_t cap)
{
	char path[4200];
	struct sfw_buf b;
	struct sfw_err err = {0};
	struct sfw_manifest m;
	out[0] = 0;
	snprintf(path, sizeof(path), "%s/.salafw/manifest.json", dir);
	sfw_buf_init(&b, SFW_MANIFEST_MAX);
	if (sfw_read_file(path, SFW_MANIFEST_MAX, &b, &err) == SFW_OK && b.data &&
	    sfw_manifest_parse(b.data, b.len, path, &m, &err) == SFW_OK) {
		if (m.repo_id)
			snprintf(out, cap, "%s", m.repo_id);
		sfw_manifest_release(&m);
	}
	sfw_buf_release(&b);
}

/* The directory's last name: a model id the server answers to. */
static void model_name(const char *dir, char *out, size_t cap)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	size_t a = n;
	while (a > 0 && dir[a - 1] != '/')
		a--;
	snprintf(out, cap, "%.*s", (int)(n - a), dir + a);
}

/* The model ids: --served-model-name, else the manifest's repo id (listed)
 * and the directory's name. */
static void serve_names(struct serve_args *a, const char *dir, char *name, char *repo, size_t cap)
{
	struct sfw_serve_params *sp = &a->sp;
	model_name(dir, name, cap);
	manifest_repo(dir, repo, cap);
	if (a->n_served) {
		for (int i = 0; i < a->n_served; i++)
			sp->model_names[i] = a->served[i];
		sp->n_names = sp->n_listed = a->n_served;
	} else {
		sp->n_names = sp->n_listed = 1;
		sp->model_names[0] = repo[0] ? repo : name;
		if (repo[0] && strcmp(repo, name))
			sp->model_names[sp->n_names++] = name;
	}
}

/* The drain after the first signal: until the last reply is sent, a
 * second signal, or --drain-timeout. Returns the exit code. */
static int serve_drain(const char *C, struct sfw_server *srv, const sigset_t *sigs, int sig, uint64_t drain_timeout)
{
	fprintf(stderr, "%s: %s: finishing the accepted requests (a second signal ends them now)\n", C,
		sig == SIGINT ? "SIGINT" : "SIGTERM");
	sfw_serve_drain(srv);
	double t_end = sfw_now_s() + (double)drain_timeout;
	int end_sig = 0;
	const char *why = "";
	while (!sfw_serve_idle(srv, 0.1)) {
		const struct timespec now = {0, 0};
		int s2 = sigtimedwait(sigs, NULL, &now);
		if (s2 > 0) {
			end_sig = s2;
			why = s2 == SIGINT ? "a second signal (SIGINT)" : "a second signal (SIGTERM)";
			break;
		}
		if (drain_timeout && sfw_now_s() >= t_end) {
			end_sig = sig;
			why = "--drain-timeout";
			break;
		}
	}
	if (end_sig) {
		int n = sfw_serve_abort(srv);
		fprintf(stderr, "%s: %s: ended %d unfinished request%s\n", C, why, n, n == 1 ? "" : "s");
	}
	sfw_serve_stop(srv);
	fprintf(stderr, "%s: stopped\n", C);
	return end_sig ? 128 + end_sig : 0;
}

int cmd_serve(int argc, char **argv)
{
	const char *C = "salafw serve";
	struct serve_args a = {.sp = sfw_serve_default_params(), .prefix_gib = -1};
	a.prefix_every = (uint64_t)a.sp.prefix_every;
	cli_model_opts_init(&a.mo);
	a.max_context = (uint64_t)a.sp.max_context;
	struct cli_parser cp;
	int rc = cli_parse_args(&cp, C, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, C, "MODEL_DIR [options]", args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	struct sfw_serve_params sp = a.sp;
	sp.max_context = (int64_t)a.max_context;
	sp.prefix_every = (int64_t)a.prefix_every;
	if (a.prefix_gib >= 0)
		sp.prefix_cache_bytes = (int64_t)(a.prefix_gib * (double)(1 << 30));
	int have_chunk = cli_given(&cp, "prefill-chunk");
	const char *key = a.key, *key_file = a.key_file;
	const struct cli_model_opts mo = a.mo;
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	if (key && key_file)
		return cli_usage_error(C, "give --api-key or --api-key-file, not both");
	if (key && !*key)
		return cli_usage_error(C, "--api-key is empty");
	struct sfw_model_params mp;
	if (cli_model_params(C, &mo, &mp))
		return SFW_EXIT_USAGE;
	const char *dir = cp.pos[0];
	if ((rc = cli_model_gate(C, dir, mo.no_verify, mo.verify_full, mo.pubkey)) != 0)
		return rc;
	struct sfw_buf kb;
	sfw_buf_init(&kb, KEY_FILE_MAX);
	if (key_file && (rc = read_key_file(C, key_file, &kb)) != 0) {
		sfw_buf_release(&kb);
		return rc;
	}
	if (key_file)
		key = kb.data;
	sp.api_key = key;
	char name[256], repo[256];
	a.sp = sp;
	serve_names(&a, dir, name, repo, sizeof(name));
	sp = a.sp;

	struct sfw_err err = {0};
	enum sfw_status s;
	struct sfw_model *m = NULL;
	struct sfw_tokenizer *tok = NULL;
	struct sfw_server *srv = NULL;
	struct sfw_eos_set eos;
	struct sfw_chat_template *chat = NULL;
	/* SIGTERM and SIGINT wait for sigwait below, in every thread started from here */
	sigset_t sigs, old;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	signal(SIGPIPE, SIG_IGN); /* a client that goes away is an error on its socket */
	if ((s = sfw_model_load(dir, &mp, &m, &err)) != SFW_OK)
		goto fail;
	const struct sfw_config *cf = sfw_model_config(m);
	if ((s = sfw_tokenizer_load(dir, cf->vocab_size, &tok, &err)) != SFW_OK)
		goto fail;
	if ((s = sfw_eos_load(dir, cf, tok, &eos, &err)) != SFW_OK)
		goto fail;
	/* the chat format and the sampling defaults, as run takes them */
	if ((s = sfw_chat_template_load(dir, &chat, &err)) != SFW_OK ||
	    (s = sfw_gen_defaults_load(dir, &sp.defaults, &err)) != SFW_OK)
		goto fail;
	sp.chat = chat;
	if (!have_chunk) /* a chunk per step that keeps the decode rows flowing */
		sp.prefill_chunk = strcmp(sfw_model_device_name(m), "cuda") ? 256 : 512; /* bench/RESULTS.md */
	if (!strcmp(sfw_model_device_name(m), "cuda")) {
		/* the plan at start, as run prints it, of the batch the server
		 * will run; what cannot fit is refused with its numbers */
		struct sfw_mem_plan pl;
		struct sfw_batch_params bp = sfw_serve_batch_params(&sp);
		s = sfw_plan_check_batch(m, bp.max_seqs, sfw_serve_prefix_entries(&sp), bp.max_ctx, bp.pool_tokens,
					 bp.max_step_rows, &pl, &err);
		sfw_plan_print(stderr, C, &pl, bp.max_ctx, bp.max_step_rows);
		if (s != SFW_OK)
			goto fail;
	}
	int64_t pcb = sfw_serve_prefix_bytes(&sp, m);
	if (pcb > 0)
		fprintf(stderr, "%s: prefix cache: up to %.2f GiB of prompt states in %d entries (prompts of %lld tokens "
				"or more), from the KV pool when running sequences leave it room\n",
			C, (double)pcb / (double)(1 << 30), sfw_serve_prefix_entries(&sp), (long long)sp.prefix_min_tokens);
	else
		fprintf(stderr, "%s: prefix cache: off\n", C);
	if ((s = sfw_serve_start(m, tok, &eos, &sp, &srv, &err)) != SFW_OK)
		goto fail;
	fprintf(
	    stderr,
	    "%s: serving '%s' on http://%s%s%s:%d/v1 [%s], up to %d running, %d queued, %lld-token context\n",
	    C, sp.model_names[0], strchr(sp.host, ':') ? "[" : "", sp.host, strchr(sp.host, ':') ? "]" : "",
	    sfw_serve_port(srv), sfw_model_device_name(m), sp.max_running, sp.max_queue,
	    (long long)sp.max_context);
	int sig = 0;
	sigwait(&sigs, &sig);
	rc = serve_drain(C, srv, &sigs, sig, a.drain_timeout);
	goto out;
fail:
	rc = cli_report(s, &err);
out:
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	sfw_tokenizer_free(tok);
	sfw_chat_template_free(chat);
	sfw_model_free(m);
	sfw_buf_release(&kb);
	return rc;
}
