/* salafw quant - 8-bit weight quantization (W8A16, AWQ or round-to-nearest)
 * of a verified model directory into a compressed-tensors pack-quantized
 * checkpoint (quant/layout.h) that vLLM, SGLang, transformers and salafw run. */
#include "cli.h"
#include "quant/quant.h"
#include "runner/runner.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct cli_opt opts[] = {
	{"output", 'o', "OUT", "output model directory (created)"},
	{"group", 0, "32|64|128|channel", "scale group size along the input dimension (default 128)"},
	{"method", 0, "awq|rtn", "awq: activation-aware smoothing before rounding (default); rtn: plain rounding"},
	{"calib", 0, "FILE", "AWQ calibration text (UTF-8; default: the built-in corpus)"},
	{"samples", 0, "N", "AWQ calibration sequences (default 128)"},
	{"seq-len", 0, "L", "AWQ tokens per calibration sequence (default 512)"},
	{"loss-rows", 0, "N", "AWQ cached input rows per layer for the search loss (default 256)"},
	{"no-duo", 0, NULL, "AWQ: plain scales x^a instead of duo scaling x^a / w^(1-a)"},
	{"fold-only", 0, NULL, "AWQ fold without quantization, float32 output (checks)"},
	{"device", 0, "cpu|cuda", "where the AWQ calibration forward runs (default cpu)"},
	{"shard-size", 0, "BYTES", "largest output shard (K/M/G suffixes: powers of 1024; default 5000000000)"},
	{"force", 0, NULL, "overwrite a model already in OUT"},
	{"quiet", 'q', NULL, "no progress or summary on stderr"},
	CLI_MODEL_OPT_ROWS("quantize"),
	{0},
};

struct progress {
	int quiet;
	int last_pct;
};

static int on_progress(void *user, const char *tensor, uint64_t done, uint64_t total)
{
	struct progress *pr = user;
	(void)tensor;
	int pct = total ? (int)(done * 100 / total) : 100;
	if (!pr->quiet && pct != pr->last_pct && isatty(2)) {
		fprintf(stderr, "\rsalafw quant: writing %3d%%", pct);
		pr->last_pct = pct;
	}
	return 1;
}

int cmd_quant(int argc, char **argv)
{
	const char *C = "salafw quant";
	const char *out = NULL;
	unsigned long long u;
	int quiet = 0;
	struct cli_model_opts mo;
	cli_model_opts_init(&mo);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	struct cli_parser cp;
	const char *arg;
	int k;
	cli_init(&cp, C, argc, argv, opts);
	while ((k = cli_next_model(&cp, &mo, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, C, "MODEL_DIR -o OUT [--group 32|64|128|channel] [--method awq|rtn] [--calib FILE]",
				  opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *nm = opts[k].name;
		if (!strcmp(nm, "output"))
			out = arg;
		else if (!strcmp(nm, "group")) {
			if ((p.group_size = sfw_quant_group_parse(arg)) < 0)
				return cli_usage_error(C, "--group must be 32, 64, 128 or channel");
		} else if (!strcmp(nm, "method")) {
			if (!strcmp(arg, "awq"))
				p.method = SFW_QUANT_AWQ;
			else if (!strcmp(arg, "rtn"))
				p.method = SFW_QUANT_RTN;
			else
				return cli_usage_error(C, "--method must be awq or rtn");
		} else if (!strcmp(nm, "calib"))
			p.calib_path = arg;
		else if (!strcmp(nm, "samples")) {
			if (!cli_parse_u64(C, "samples", arg, &u))
				return SFW_EXIT_USAGE;
			if (u < 1 || u > 100000)
				return cli_usage_error(C, "--samples must be in [1, 100000]");
			p.samples = (int)u;
		} else if (!strcmp(nm, "seq-len")) {
			if (!cli_parse_u64(C, "seq-len", arg, &u))
				return SFW_EXIT_USAGE;
			if (u < 2 || u > (1u << 20))
				return cli_usage_error(C, "--seq-len must be in [2, 1048576]");
			p.seq_len = (int)u;
		} else if (!strcmp(nm, "loss-rows")) {
			if (!cli_parse_u64(C, "loss-rows", arg, &u))
				return SFW_EXIT_USAGE;
			if (u < 1 || u > (1u << 20))
				return cli_usage_error(C, "--loss-rows must be in [1, 1048576]");
			p.loss_rows = (int)u;
		} else if (!strcmp(nm, "no-duo"))
			p.duo_scaling = 0;
		else if (!strcmp(nm, "fold-only"))
			p.fold_only = 1;
		else if (!strcmp(nm, "shard-size")) {
			if (!cli_parse_bytes(C, "shard-size", arg, &u))
				return SFW_EXIT_USAGE;
			if (u < 1)
				return cli_usage_error(C, "--shard-size must be at least 1 byte");
			p.shard_bytes = u;
		} else if (!strcmp(nm, "force"))
			p.force = 1;
		else if (!strcmp(nm, "quiet"))
			quiet = 1;
	}
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	if (!out)
		return cli_usage_error(C, "-o OUT is required");
	if (p.fold_only && p.method != SFW_QUANT_AWQ)
		return cli_usage_error(C, "--fold-only needs --method awq");
	p.threads = (int)mo.threads;
	if (mo.device != SFW_DEVICE_AUTO) /* AWQ calibration runs on the CPU unless asked */
		p.device = mo.device;
	int rc = cli_model_gate(C, cp.pos[0], mo.no_verify, mo.verify_full, mo.pubkey);
	if (rc)
		return rc;
	struct progress pr = {quiet, -1};
	p.progress = on_progress;
	p.progress_user = &pr;
	p.stats = &st;
	struct sfw_err err = {0};
	enum sfw_status s = sfw_quant_run(cp.pos[0], out, &p, &err);
	if (!quiet && pr.last_pct >= 0)
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
	return SFW_EXIT_OK;
}
