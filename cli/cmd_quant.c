/* salafw quant - 8-bit weight quantization (W8A16, AWQ or round-to-nearest)
 * of a verified model directory into a compressed-tensors pack-quantized
 * checkpoint (num/w8_layout.h) that vLLM, SGLang, transformers and salafw run. */
#include "cli.h"
#include "alloc.h"
#include "buf.h"
#include "log.h"
#include "quant/quant.h"
#include "runner/runner.h"
#include "verify/verify.h"

#include <sodium.h>

#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* The command line's values (cli_parse_args fills them from the table). */
struct quant_args {
	struct sfw_quant_params p;
	const char *out;
	int quiet, sign, no_duo; /* sign: -1 unless --sign / --no-sign (the later one wins) */
	struct cli_model_opts mo;
};

static int take_group(const char *cmd, const char *label, const char *v, void *dst)
{
	if ((*(int *)dst = sfw_quant_group_parse(v)) < 0)
		return cli_usage_error(cmd, "%s must be 32, 64, 128 or channel", label);
	return 0;
}

static int take_method(const char *cmd, const char *label, const char *v, void *dst)
{
	enum sfw_quant_method *m = dst;
	if (!strcmp(v, "awq"))
		*m = SFW_QUANT_AWQ;
	else if (!strcmp(v, "rtn"))
		*m = SFW_QUANT_RTN;
	else
		return cli_usage_error(cmd, "%s must be awq or rtn", label);
	return 0;
}

static int take_sign(const char *cmd, const char *label, const char *v, void *dst)
{
	(void)cmd;
	(void)v;
	*(int *)dst = strcmp(label, "--sign") == 0;
	return 0;
}

#define OFF(f) offsetof(struct quant_args, f)
static const struct cli_arg args[] = {
    {{"output", 'o', "OUT", "output model directory (created)"}, CLI_K_STR, OFF(out), 0, 0, NULL, NULL},
    {{"group", 0, "32|64|128|channel", "scale group size along the input dimension (default 128)"},
     CLI_K_CALL, OFF(p.group_size), 0, 0, take_group, NULL},
    {{"method", 0, "awq|rtn", "awq: activation-aware smoothing before rounding (default); rtn: plain rounding"},
     CLI_K_CALL, OFF(p.method), 0, 0, take_method, NULL},
    {{"calib", 0, "FILE", "AWQ calibration text (UTF-8; default: the built-in corpus)"},
     CLI_K_STR, OFF(p.calib_path), 0, 0, NULL, NULL},
    {{"samples", 0, "N", "AWQ calibration sequences (default: as many as the text fills, at most 128)"},
     CLI_K_INT, OFF(p.samples), 1, 100000, NULL, NULL},
    {{"seq-len", 0, "L", "AWQ tokens per calibration sequence (default 512)"},
     CLI_K_INT, OFF(p.seq_len), 2, 1 << 20, NULL, NULL},
    {{"loss-rows", 0, "N", "AWQ cached input rows per layer for the search loss (default 256)"},
     CLI_K_INT, OFF(p.loss_rows), 1, 1 << 20, NULL, NULL},
    {{"no-duo", 0, NULL, "AWQ: plain scales x^a instead of duo scaling x^a / w^(1-a)"},
     CLI_K_FLAG, OFF(no_duo), 0, 0, NULL, NULL},
    {{"fold-only", 0, NULL, "AWQ fold without quantization, float32 output (checks)"},
     CLI_K_FLAG, OFF(p.fold_only), 0, 0, NULL, NULL},
    CLI_DEVICE_ARG(struct quant_args, mo, "where the AWQ calibration forward and search run (default cpu)"),
    {{"shard-size", 0, "BYTES", "largest output shard (K/M/G suffixes: powers of 1024; default 5000000000)"},
     CLI_K_BYTES, OFF(p.shard_bytes), 1, 18446744073709551615.0, NULL, NULL},
    {{"force", 0, NULL, "overwrite a model already in OUT"}, CLI_K_FLAG, OFF(p.force), 0, 0, NULL, NULL},
    {{"sign", 0, NULL, "sign OUT with your local key even when MODEL_DIR was not verified (--no-verify)"},
     CLI_K_CALL, OFF(sign), 0, 0, take_sign, NULL},
    {{"no-sign", 0, NULL,
      "leave OUT's manifest unsigned (default: signed with your local key when MODEL_DIR was verified; sign later "
      "with 'salafw sign --user OUT')"},
     CLI_K_CALL, OFF(sign), 0, 0, take_sign, NULL},
    {{"quiet", 'q', NULL, "no progress or summary on stderr"}, CLI_K_FLAG, OFF(quiet), 0, 0, NULL, NULL},
    CLI_MODEL_ARGS(struct quant_args, mo, "quantize"),
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

struct progress {
	int quiet, tty;
	int open_line;           /* a refreshing line is on the terminal */
	enum sfw_quant_phase ph; /* of the last line */
	int64_t last_step;       /* non-terminal: the last step printed */
	double last_print;       /* ... and when (writing) */
	const char *device;
};

static void clock_text(double s, char *out, size_t cap)
{
	long t = s < 0 ? 0 : (long)(s + 0.5);
	if (t >= 3600)
		snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

/* One line per step when stderr is not a terminal (a layer, a calibration
 * sequence out of about 16, 5% of the output), one refreshing line on a
 * terminal; each with the phase's elapsed time and an ETA. */
static void on_phase(void *user, const struct sfw_quant_event *ev)
{
	struct progress *pr = user;
	if (pr->quiet)
		return;
	char line[200], el[32], eta[32];
	clock_text(ev->elapsed, el, sizeof(el));
	int64_t step = ev->i;
	if (ev->phase == SFW_QP_CALIB && !pr->tty) {
		int64_t every = ev->n >= 16 ? ev->n / 16 : 1;
		step = ev->i == ev->n ? ev->n : ev->i / every * every;
	} else if (ev->phase == SFW_QP_WRITE) {
		step = ev->n ? ev->i * 20 / ev->n : 20; /* 5% steps */
	}
	if (!pr->tty && ev->phase == pr->ph && step == pr->last_step && ev->phase != SFW_QP_LOAD)
		return;
	/* writing, to a log: the first and last 5% step, and one every 10 s between */
	if (!pr->tty && ev->phase == SFW_QP_WRITE && pr->ph == SFW_QP_WRITE && ev->i < ev->n &&
	    ev->elapsed - pr->last_print < 10.0)
		return;
	pr->last_print = ev->phase == SFW_QP_WRITE ? ev->elapsed : 0;
	/* writing: no ETA from the first 5% (small tensors and file set-up first:
	 * 4:54 was shown for a write of 0.1 s) */
	if (ev->phase == SFW_QP_WRITE && ev->i < ev->n && ev->i * 20 < ev->n)
		snprintf(eta, sizeof(eta), "--:--");
	else if (ev->i > 0 && ev->i < ev->n)
		clock_text(ev->elapsed / (double)ev->i * (double)(ev->n - ev->i), eta, sizeof(eta));
	else
		snprintf(eta, sizeof(eta), "0:00");
	switch (ev->phase) {
	case SFW_QP_LOAD:
		if (ev->i == 0)
			snprintf(line, sizeof(line), "loading the model%s%s%s", strcmp(pr->device, "cpu") ? " (uploading to " : "",
				 strcmp(pr->device, "cpu") ? pr->device : "", strcmp(pr->device, "cpu") ? ")" : "");
		else
			snprintf(line, sizeof(line), "model loaded in %s", el);
		break;
	case SFW_QP_CALIB:
		snprintf(line, sizeof(line), "calibrating (%s): sequence %lld/%lld, %s elapsed, ETA %s", pr->device,
			 (long long)ev->i, (long long)ev->n, el, eta);
		break;
	case SFW_QP_SEARCH:
		snprintf(line, sizeof(line), "searching AWQ scales: layer %lld/%lld, %s elapsed, ETA %s", (long long)ev->i,
			 (long long)ev->n, el, eta);
		break;
	case SFW_QP_WRITE:
		snprintf(line, sizeof(line), "writing shard %d/%d: %3d%% of %.1f %s, %s elapsed, ETA %s", ev->shard,
			 ev->n_shards, ev->n ? (int)(ev->i * 100 / ev->n) : 100, ev->n >= 1e9 ? ev->n / 1e9 : ev->n / 1e6,
			 ev->n >= 1e9 ? "GB" : "MB", el, eta);
		break;
	}
	if (pr->tty) {
		if (pr->open_line && ev->phase != pr->ph)
			fputc('\n', stderr);
		fprintf(stderr, "\rsalafw quant: %-100s", line);
		pr->open_line = 1;
		if (ev->phase == SFW_QP_LOAD && ev->i == 0) { /* no steps follow until it is loaded */
			fputc('\n', stderr);
			pr->open_line = 0;
		}
	} else {
		fprintf(stderr, "salafw quant: %s\n", line);
	}
	fflush(stderr);
	pr->ph = ev->phase;
	pr->last_step = step;
}

/* OUT's lineage (verify.h): the verified parent, the method and every
 * parameter that shapes the output, and this salafw. */
static char *lineage_json(const struct sfw_quant_params *p, const struct cli_gate_info *g,
			  const struct sfw_quant_stats *st)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 1u << 16);
	char gs[16], calib[80] = "built-in";
	if (p->group_size > 0)
		snprintf(gs, sizeof(gs), "%d", p->group_size);
	else
		snprintf(gs, sizeof(gs), "channel");
	if (p->calib_path) {
		unsigned char h[32];
		uint64_t n;
		struct sfw_err e = {0};
		char hex[65];
		if (sfw_sha256_file(p->calib_path, h, &n, &e) == SFW_OK) {
			sfw_hex_encode(h, 32, hex);
			snprintf(calib, sizeof(calib), "sha256:%s", hex);
		} else {
			snprintf(calib, sizeof(calib), "unreadable");
		}
	}
	enum sfw_status s = sfw_buf_printf(&b, "{\"derived_by\": \"salafw/%s\", \"method\": \"%s\", \"params\": "
					   "{\"format\": \"pack-quantized int8\", \"group_size\": \"%s\"",
					   SFW_VERSION, p->method == SFW_QUANT_AWQ ? "awq" : "rtn", gs);
	if (s == SFW_OK && p->method == SFW_QUANT_AWQ)
		s = sfw_buf_printf(&b,
				   ", \"samples\": \"%d\", \"seq_len\": \"%d\", \"loss_rows\": \"%d\", \"n_grid\": \"%d\", "
				   "\"duo_scaling\": \"%d\", \"calib\": \"%s\", \"calib_tokens\": \"%lld\", "
				   "\"calib_text_tokens\": \"%lld\", \"calib_device\": \"%s\"%s",
				   (int)st->calib_samples, p->seq_len, p->loss_rows, p->n_grid, p->duo_scaling, calib,
				   (long long)st->calib_tokens, (long long)st->calib_text_tokens,
				   p->device == SFW_DEVICE_CUDA ? "cuda" : "cpu",
				   p->fold_only ? ", \"fold_only\": \"1\"" : "");
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "}");
	if (s == SFW_OK && g->verified)
		s = sfw_buf_printf(&b,
				   ", \"parent\": {\"repo_id\": \"%s\", \"revision\": \"%s\", \"manifest_sha256\": \"%s\", "
				   "\"key_id\": \"%s\"}",
				   g->repo_id, g->revision, g->manifest_sha256, g->key_id);
	if (s == SFW_OK)
		s = sfw_buf_printf(&b, "}");
	if (s != SFW_OK) {
		sfw_buf_release(&b);
		return NULL;
	}
	size_t len;
	return sfw_buf_take(&b, &len);
}

/* OUT/.salafw/manifest.json with the lineage; signed with the user's key
 * (made on first use) when sign, so that `salafw run OUT` runs verified. */
static int publish(const char *C, const char *out, const struct sfw_quant_params *p,
		   const struct cli_gate_info *g, const struct sfw_quant_stats *st, int sign, int quiet)
{
	struct sfw_err err = {0};
	char *lj = lineage_json(p, g, st);
	if (!lj)
		return cli_report(SFW_E_NOMEM, NULL);
	struct sfw_seckey sk;
	struct sfw_pubkey pk;
	int created = 0;
	enum sfw_status s = sign ? sfw_userkey_ensure(&sk, &pk, &created, &err) : SFW_OK;
	if (s == SFW_OK)
		s = sfw_derived_publish(out, lj, sign ? &sk : NULL, &err);
	sodium_memzero(&sk, sizeof(sk));
	sfw_free(lj);
	if (s != SFW_OK)
		return cli_report(s, &err);
	if (!quiet) {
		char id[17], *kp = sfw_userkey_path(1), ek[1024], eo[1024];
		const char *uo = sfw_esc(out, eo, sizeof(eo)); /* paths printed escaped */
		if (sign) {
			sfw_pubkey_id_hex(pk.key_id, id);
			if (created)
				fprintf(stderr,
					"%s: created your local signing key %s in '%s' (.pub beside it)\n", C,
					id, kp ? sfw_esc(kp, ek, sizeof(ek)) : "?");
			fprintf(stderr,
				"%s: signed '%s' with your local key %s; derived from %s%s%s; run it: salafw "
				"run %s\n",
				C, uo, id, g->verified ? g->repo_id : "an unverified model",
				g->verified ? "@" : "", g->verified ? g->revision : "", uo);
		} else {
			fprintf(
			    stderr,
			    "%s: '%s' has an unsigned manifest; to run it verified: salafw sign --user %s\n",
			    C, uo, uo);
		}
		sfw_free(kp);
	}
	return SFW_EXIT_OK;
}

int cmd_quant(int argc, char **argv)
{
	const char *C = "salafw quant";
	struct quant_args a = {.p = sfw_quant_default_params(), .sign = -1};
	cli_model_opts_init(&a.mo);
	struct cli_parser cp;
	int rc = cli_parse_args(&cp, C, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, C, "MODEL_DIR -o OUT [--group 32|64|128|channel] [--method awq|rtn] [--calib FILE]",
			       args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	struct sfw_quant_params p = a.p;
	if (a.no_duo)
		p.duo_scaling = 0;
	const char *out = a.out;
	int quiet = a.quiet;
	int sign = a.sign;
	const struct cli_model_opts mo = a.mo;
	struct sfw_quant_stats st;
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	if (!out)
		return cli_usage_error(C, "-o OUT is required");
	if (p.fold_only && p.method != SFW_QUANT_AWQ)
		return cli_usage_error(C, "--fold-only needs --method awq");
	p.threads = mo.threads;
	if (mo.device != SFW_DEVICE_AUTO) /* AWQ calibration runs on the CPU unless asked */
		p.device = mo.device;
	struct cli_gate_info gi;
	if ((rc = cli_model_gate_info(C, cp.pos[0], mo.no_verify, mo.verify_full, mo.pubkey, &gi)) != 0)
		return rc;
	if (sign < 0) /* the default: sign what was derived from verified weights */
		sign = gi.verified;
	struct progress pr = {quiet, isatty(2), 0, SFW_QP_LOAD, -1, 0, p.device == SFW_DEVICE_CUDA ? "cuda" : "cpu"};
	p.on_phase = on_phase;
	p.progress_user = &pr;
	p.stats = &st;
	struct sfw_err err = {0};
	enum sfw_status s = sfw_quant_run(cp.pos[0], out, &p, &err);
	if (pr.open_line)
		fprintf(stderr, "\n");
	if (s != SFW_OK)
		return cli_report(s, &err);
	if (!quiet) {
		fprintf(stderr, "salafw quant: %d linears int8 (%s), %d tensors copied, %d shard%s; %.1f MB -> %.1f MB in %.2f s\n",
			st.n_quantized, sfw_quant_traits(p.group_size)->name, st.n_copied, st.n_shards,
			st.n_shards == 1 ? "" : "s", st.bytes_in / 1e6, st.bytes_out / 1e6, st.seconds_total);
		if (p.method == SFW_QUANT_AWQ)
			fprintf(stderr, "salafw quant: awq: %lld calibration tokens in %.2f s; %d groups searched, %d kept "
				"alpha 0, mean alpha %.3f, mean loss reduction %.1f%%\n",
				(long long)st.calib_tokens, st.seconds_calib, st.awq_mappings, st.awq_identity,
				st.awq_mean_alpha, 100.0 * st.awq_loss_gain);
	}
	/* an explicit --samples x --seq-len beyond the text's tokens goes
	 * through it more than once: say so, with the way out (the default
	 * --samples takes what the text fills: never) */
	if (p.method == SFW_QUANT_AWQ && st.calib_text_used > st.calib_text_tokens)
		fprintf(stderr,
			"salafw quant: warning: the calibration text gave %lld tokens, fewer than the %d x %d asked for "
			"(--samples, --seq-len), so it was used %.1f times over; a longer --calib FILE gives more "
			"distinct text\n",
			(long long)st.calib_text_tokens, p.samples, p.seq_len,
			(double)st.calib_text_used / (double)(st.calib_text_tokens ? st.calib_text_tokens : 1));
	return publish(C, out, &p, &gi, &st, sign, quiet);
}
