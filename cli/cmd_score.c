/* salafw score - logits (and with --taps the hidden states) for given token
 * ids, written as a safetensors file with the golden files' tensor names, so
 * an engine can be checked against ../shared/golden or another engine. */
#include "cli.h"
#include "alloc.h"
#include "formats/safetensors.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Decode steps at most, with --decode or taken from --feed-from. */
#define SCORE_DECODE_MAX (1u << 20)

/* The command line's values (cli_parse_args fills them from the table). */
struct score_args {
	const char *ids_path, *feed_path, *outp;
	uint64_t n_dec, chunk;
	int taps, das;
	struct cli_model_opts mo;
};

#define OFF(f) offsetof(struct score_args, f)
static const struct cli_arg args[] = {
    {{"ids", 0, "FILE", "prompt token ids (text integers, or safetensors with input_ids)"},
     CLI_K_STR, OFF(ids_path), 0, 0, NULL, NULL},
    {{"decode", 0, "N", "one-token decode steps after the prompt (default 0; with --feed-from: its length)"},
     CLI_K_U64, OFF(n_dec), 0, SCORE_DECODE_MAX, NULL, NULL},
    {{"feed-from", 0, "GOLDEN", "feed decode.input_ids of this safetensors file instead of the greedy chain"},
     CLI_K_STR, OFF(feed_path), 0, 0, NULL, NULL},
    {{"taps", 0, NULL, "also write prefill/decode embed, layer outputs and final norm"},
     CLI_K_FLAG, OFF(taps), 0, 0, NULL, NULL},
    {{"output", 'o', "OUT", "output safetensors file"}, CLI_K_STR, OFF(outp), 0, 0, NULL, NULL},
    CLI_DEVICE_ARG(struct score_args, mo, "where to run (default: cuda when available, else cpu)"),
    CLI_KV_CACHE_ARG(struct score_args, mo),
    {{"chunk", 0, "N", "rows per internal prefill step (default 256)"}, CLI_K_U64, OFF(chunk), 1, 1 << 20, NULL, NULL},
    {{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"}, CLI_K_FLAG, OFF(das), 0, 0, NULL, NULL},
    CLI_MODEL_ARGS(struct score_args, mo, "score"),
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

int cmd_score(int argc, char **argv)
{
	const char *C = "salafw score";
	struct score_args a = {0};
	cli_model_opts_init(&a.mo);
	struct cli_parser cp;
	int rc = cli_parse_args(&cp, C, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, C, "MODEL_DIR --ids FILE [--decode N] [--feed-from GOLDEN] [--taps] -o OUT", args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	const char *ids_path = a.ids_path, *feed_path = a.feed_path, *outp = a.outp;
	unsigned long long n_dec = a.n_dec, chunk = a.chunk;
	int have_dec = cli_given(&cp, "decode"), taps = a.taps, das = a.das;
	const struct cli_model_opts mo = a.mo;
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	if (!ids_path || !outp)
		return cli_usage_error(C, "--ids FILE and -o OUT are required");
	struct sfw_model_params mp;
	if (cli_model_params(C, &mo, &mp))
		return SFW_EXIT_USAGE;
	if ((rc = cli_model_gate(C, cp.pos[0], mo.no_verify, mo.verify_full, mo.pubkey)) != 0)
		return rc;
	int32_t *ids = NULL;
	size_t n = 0;
	if ((rc = cli_read_ids(C, ids_path, &ids, &n)) != 0)
		return rc;

	struct sfw_err err = {0};
	enum sfw_status s = SFW_OK;
	struct sfw_st_file *feed = NULL;
	struct sfw_model *m = NULL;
	struct sfw_record *r = NULL;
	const int32_t *feed_ids = NULL;
	if (feed_path) {
		if ((s = sfw_st_open(feed_path, &feed, &err)) != SFW_OK) {
			/* an input file: exit 5, not 1 ("verification failed") */
			char msg[sizeof(err.msg)];
			snprintf(msg, sizeof(msg), "%s", err.msg);
			s = sfw_fail(&err, s == SFW_E_MISSING ? SFW_E_IO : s, "--feed-from: %s", msg);
			goto done;
		}
		const struct sfw_tensor_info *t = sfw_st_find(feed, "decode.input_ids");
		if (!t || t->dtype != SFW_DTYPE_I32 || t->ndim != 1) {
			s = sfw_fail(&err, SFW_E_FORMAT, "--feed-from: '%s' has no I32 vector 'decode.input_ids'", feed_path);
			goto done;
		}
		if (!have_dec && t->nelem > SCORE_DECODE_MAX) {
			s = sfw_fail(&err, SFW_E_INVAL,
				     "--feed-from: '%s' holds %llu decode ids, more than %u steps (pass --decode N)",
				     feed_path, (unsigned long long)t->nelem, SCORE_DECODE_MAX);
			goto done;
		}
		if (!have_dec)
			n_dec = t->nelem;
		if (n_dec > t->nelem) {
			s = sfw_fail(&err, SFW_E_INVAL, "--decode %llu but --feed-from '%s' holds only %llu decode ids", n_dec,
				     feed_path, (unsigned long long)t->nelem);
			goto done;
		}
		feed_ids = t->data;
	}
	if ((s = sfw_model_load(cp.pos[0], &mp, &m, &err)) != SFW_OK)
		goto done;
	struct sfw_score_params sp = {ids, n, (int)n_dec, feed_ids, taps, sfw_ctx_default_params()};
	sp.ctx.dense_as_sparse = das;
	sp.ctx.prefill_chunk = (int)chunk;
	if ((s = sfw_score_run(m, &sp, &r, &err)) != SFW_OK)
		goto done;
	s = sfw_record_write(r, outp, "salafw.score", das ? "dense-as-sparse" : "reference", &err);
done:
	sfw_record_free(r);
	sfw_model_free(m);
	sfw_st_close(feed);
	sfw_free(ids);
	return s == SFW_OK ? SFW_EXIT_OK : cli_report(s, &err);
}
