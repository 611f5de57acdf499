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
#include <stdio.h>
#include <string.h>

static const struct cli_opt opts[] = {
    {"host", 0, "ADDR", "address to listen on (default 127.0.0.1: this machine only)"},
    {"port", 0, "N", "TCP port (default 8080; 0 = any free port, printed)"},
    {"api-key", 0, "KEY", "ask every /v1 request for Authorization: Bearer KEY"},
    {"api-key-file", 0, "FILE", "the same with the key read from FILE (first line)"},
    {"max-running", 0, "N", "sequences decoded together at most (default 16, at most 64)"},
    {"max-queue", 0, "N", "requests waiting beyond those (default 256; more get 429)"},
    {"max-context", 0, "N", "context positions per request, prompt and reply (default 4096)"},
    {"prefill-chunk", 0, "N", "prompt tokens per engine step (default 256 on the CPU, 512 on CUDA)"},
    {"drain-timeout", 0, "SECONDS", "after SIGTERM/SIGINT, end the unfinished requests after this long (default 0: wait)"},
    {"receive-timeout", 0, "SECONDS", "close a connection whose request has not all arrived in this long (default 60; 0: none)"},
    {"conns-per-ip", 0, "N", "open connections per client address (default 128; 0: no limit, e.g. behind a proxy)"},
    {"device", 0, "cpu|cuda", "where to run (default: cuda when available, else cpu)"},
    {"served-model-name", 0, "NAME",
     "a model id requests may name, listed by /v1/models (repeatable; default: the manifest's repo id, "
     "listed, and the directory's name)"},
    {"allowed-origins", 0, "LIST",
     "CORS: web pages of these origins (comma-separated scheme://host[:port], or *) may read the answers "
     "(default: none)"},
    {"quiet", 0, NULL, "no request log lines on stderr"},
    CLI_MODEL_OPT_ROWS("serve"),
    {0},
};

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

int cmd_serve(int argc, char **argv)
{
	const char *C = "salafw serve";
	struct sfw_serve_params sp = sfw_serve_default_params();
	int have_chunk = 0;
	unsigned long long drain_timeout = 0;
	const char *key = NULL, *key_file = NULL;
	const char *served[SFW_SERVE_NAMES_MAX];
	int n_served = 0;
	unsigned long long u;
	struct cli_model_opts mo;
	cli_model_opts_init(&mo);
	struct cli_parser cp;
	const char *arg;
	int k;
	cli_init(&cp, C, argc, argv, opts);
	while ((k = cli_next_model(&cp, &mo, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, C, "MODEL_DIR [options]", opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *nm = opts[k].name;
		if (!strcmp(nm, "host")) {
			sp.host = arg;
			continue;
		}
		if (!strcmp(nm, "api-key")) {
			key = arg;
			continue;
		}
		if (!strcmp(nm, "api-key-file")) {
			key_file = arg;
			continue;
		}
		if (!strcmp(nm, "served-model-name")) {
			if (!*arg || strlen(arg) > 255)
				return cli_usage_error(C, "--served-model-name must have 1 to 255 bytes");
			if (n_served == SFW_SERVE_NAMES_MAX)
				return cli_usage_error(C, "at most %d --served-model-name",
						       SFW_SERVE_NAMES_MAX);
			served[n_served++] = arg;
			continue;
		}
		if (!strcmp(nm, "allowed-origins")) {
			if (!*arg || strlen(arg) > 4000)
				return cli_usage_error(C, "--allowed-origins must have 1 to 4000 bytes");
			sp.allowed_origins = arg;
			continue;
		}
		if (!strcmp(nm, "quiet")) {
			sp.quiet = 1;
			continue;
		}
		if (!cli_parse_u64(C, nm, arg, &u))
			return SFW_EXIT_USAGE;
		if (!strcmp(nm, "port")) {
			if (u > 65535)
				return cli_usage_error(C, "--port must be 0 to 65535");
			sp.port = (int)u;
		} else if (!strcmp(nm, "max-running")) {
			if (u < 1 || u > 64)
				return cli_usage_error(C, "--max-running must be 1 to 64");
			sp.max_running = (int)u;
		} else if (!strcmp(nm, "max-queue")) {
			if (u > 65536)
				return cli_usage_error(C, "--max-queue must be at most 65536");
			sp.max_queue = (int)u;
		} else if (!strcmp(nm, "max-context")) {
			if (u < 1 || u > (1ull << 30))
				return cli_usage_error(C, "--max-context must be 1 to %llu tokens",
						       1ull << 30);
			sp.max_context = (int64_t)u;
		} else if (!strcmp(nm, "prefill-chunk")) {
			if (u < 1 || u > (1u << 20))
				return cli_usage_error(C, "--prefill-chunk must be 1 to %u tokens", 1u << 20);
			sp.prefill_chunk = (int)u;
			have_chunk = 1;
		} else if (!strcmp(nm, "drain-timeout")) {
			if (u > 86400)
				return cli_usage_error(C, "--drain-timeout must be at most 86400 seconds");
			drain_timeout = u;
		} else if (!strcmp(nm, "receive-timeout")) {
			if (u > 86400)
				return cli_usage_error(C, "--receive-timeout must be at most 86400 seconds");
			sp.receive_timeout = (double)u;
		} else if (!strcmp(nm, "conns-per-ip")) {
			if (u > 65536)
				return cli_usage_error(C, "--conns-per-ip must be at most 65536");
			sp.conns_per_ip = (int)u;
		}
	}
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
	int rc = cli_model_gate(C, dir, mo.no_verify, mo.verify_full, mo.pubkey);
	if (rc)
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
	/* the ids: --served-model-name, else the repo id (listed) and the directory's name */
	char name[256], repo[256];
	model_name(dir, name, sizeof(name));
	manifest_repo(dir, repo, sizeof(repo));
	if (n_served) {
		for (int i = 0; i < n_served; i++)
			sp.model_names[i] = served[i];
		sp.n_names = sp.n_listed = n_served;
	} else {
		sp.n_names = sp.n_listed = 1;
		sp.model_names[0] = repo[0] ? repo : name;
		if (repo[0] && strcmp(repo, name))
			sp.model_names[sp.n_names++] = name;
	}

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
		s = sfw_plan_check_batch(m, bp.max_seqs, bp.max_ctx, bp.pool_tokens, bp.max_step_rows, &pl, &err);
		sfw_plan_print(stderr, C, &pl, bp.max_ctx, bp.max_step_rows);
		if (s != SFW_OK)
			goto fail;
	}
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
	fprintf(stderr, "%s: %s: finishing the accepted requests (a second signal ends them now)\n", C,
		sig == SIGINT ? "SIGINT" : "SIGTERM");
	sfw_serve_drain(srv);
	/* the drain: until the last reply is sent, a second signal, or --drain-timeout */
	double t_end = sfw_now_s() + (double)drain_timeout;
	int end_sig = 0;
	const char *why = "";
	while (!sfw_serve_idle(srv, 0.1)) {
		const struct timespec now = {0, 0};
		int s2 = sigtimedwait(&sigs, NULL, &now);
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
	rc = end_sig ? 128 + end_sig : 0;
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
