/* salafw mkmodel - write a random-weight SALA model directory. */
#include "cli.h"

#include "log.h"
#include "quant/quant.h"
#include "tools/tools.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The command line's values (cli_parse_args fills them from the table). */
struct mkmodel_args {
	const char *preset, *out;
	uint64_t seed, shard_mib;
	int dry_run, force, threads, no_tokenizer, w8, group;
};

static int take_group(const char *cmd, const char *label, const char *v, void *vals)
{
	struct mkmodel_args *a = vals;
	if ((a->group = sfw_quant_group_parse(v)) < 0)
		return cli_usage_error(cmd, "%s must be 32, 64, 128 or channel", label);
	return 0;
}

#define OFF(f) offsetof(struct mkmodel_args, f)
static const struct cli_arg args[] = {
    {{"preset", 0, "NAME",
      "tiny (tests, demo), small (CPU benchmarks), full (the real shapes, ~19 GB) or wide4 (the real widths "
      "in 4 layers, ~3.4 GB)"},
     CLI_K_STR, OFF(preset), 0, 0, NULL, NULL},
    {{"seed", 0, "N", "weight seed (default 0); the output is a pure function of preset and seed"},
     CLI_K_U64, OFF(seed), 0, 0, NULL, NULL},
    {{"output", 'o', "DIR", "output directory (created if needed)"}, CLI_K_STR, OFF(out), 0, 0, NULL, NULL},
    {{"dry-run", 0, NULL, "print the tensors, shards and parameter count; write nothing"},
     CLI_K_FLAG, OFF(dry_run), 0, 0, NULL, NULL},
    {{"force", 0, NULL, "overwrite a model already in DIR"}, CLI_K_FLAG, OFF(force), 0, 0, NULL, NULL},
    {{"threads", 't', "N", "generator threads (default: all cores)"}, CLI_K_INT, OFF(threads), 1, 256, NULL, NULL},
    {{"shard-mib", 0, "N",
      "shard size limit in MiB (default: tiny 6, small 128, full 4768 = 5 GB, wide4 1907 = 2 GB)"},
     CLI_K_U64, OFF(shard_mib), 1, 1 << 20, NULL, NULL},
    {{"no-tokenizer", 0, NULL, "skip tokenizer.model and tokenizer_config.json"},
     CLI_K_FLAG, OFF(no_tokenizer), 0, 0, NULL, NULL},
    {{"w8", 0, NULL, "write the decoder linears as int8 (pack-quantized, random codes and scales) directly"},
     CLI_K_FLAG, OFF(w8), 0, 0, NULL, NULL},
    {{"group", 0, "G", "with --w8: scale group size 32, 64, 128 (default) or channel"},
     CLI_K_CALL, 0, 0, 0, take_group, NULL},
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

static const char synopsis[] = "--preset tiny|small|full|wide4 [--seed N] [--w8 [--group G]] [--dry-run] [--force] -o DIR";

struct progress {
	int tty;
	unsigned last_pct;
};

static void on_progress(void *user, uint64_t done, uint64_t total)
{
	struct progress *pg = user;
	unsigned pct = total ? (unsigned)(done * 100 / total) : 100;
	if (!pg->tty || pct == pg->last_pct)
		return;
	pg->last_pct = pct;
	fprintf(stderr, "\rmkmodel: %llu / %llu MiB (%u%%)", (unsigned long long)(done >> 20),
		(unsigned long long)(total >> 20), pct);
	if (done == total)
		fprintf(stderr, "\n");
}

static void print_plan(const struct sfw_mkmodel_plan *pl, int list)
{
	for (size_t i = 0; list && i < pl->n_tensors; i++) {
		const struct sfw_mkmodel_tensor *t = &pl->tensors[i];
		char shard[64];
		sfw_mkmodel_shard_name(shard, sizeof(shard), t->shard, pl->n_shards);
		if (t->ndim == 2)
			printf("%s %s [%llu, %llu] %s\n", t->name, t->kind == SFW_MKT_W8_PACKED ? "i32" : "bf16",
			       (unsigned long long)t->shape[0],
			       (unsigned long long)t->shape[1], shard);
		else
			printf("%s %s [%llu] %s\n", t->name, t->kind == SFW_MKT_W8_SHAPE ? "i64" : "bf16",
			       (unsigned long long)t->shape[0], shard);
	}
	printf("%zu tensors, %llu parameters, %llu bytes in %d shard%s\n", pl->n_tensors,
	       (unsigned long long)pl->n_params, (unsigned long long)pl->n_bytes, pl->n_shards,
	       pl->n_shards == 1 ? "" : "s");
}

int cmd_mkmodel(int argc, char **argv)
{
	const char *cmd = "salafw mkmodel";
	struct cli_parser cp;
	struct mkmodel_args a = {.group = SFW_QL_GROUP_DEFAULT};
	int rc = cli_parse_args(&cp, cmd, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, cmd, synopsis, args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	if (cp.npos > 0)
		return cli_usage_error(cmd, "unexpected argument '%s'", cp.pos[0]);
	if (!a.preset)
		return cli_usage_error(cmd, "--preset is required");
	struct sfw_mkmodel_params p;
	memset(&p, 0, sizeof(p));
	if (!sfw_mkmodel_preset_parse(a.preset, &p.preset))
		return cli_usage_error(cmd, "unknown preset '%s' (tiny, small, full or wide4)", a.preset);
	if (!a.out && !a.dry_run)
		return cli_usage_error(cmd, "-o DIR is required");
	const char *preset = a.preset, *out = a.out;
	int dry_run = a.dry_run;
	p.seed = a.seed;
	p.force = a.force;
	p.nthreads = a.threads;
	p.shard_bytes = (uint64_t)a.shard_mib << 20;
	p.no_tokenizer = a.no_tokenizer;
	p.w8 = a.w8;
	p.w8_group = a.group;

	struct sfw_err err = {0};
	struct sfw_mkmodel_plan pl;
	enum sfw_status s = sfw_mkmodel_plan(&p, &pl, &err);
	if (s != SFW_OK)
		return cli_report(s, &err);
	if (dry_run) {
		print_plan(&pl, 1);
		sfw_mkmodel_plan_free(&pl);
		return SFW_EXIT_OK;
	}
	struct progress pg = {isatty(2), 101};
	p.progress = on_progress;
	p.progress_user = &pg;
	s = sfw_mkmodel(out, &p, &err);
	if (s == SFW_OK) {
		char eo[1024];
		printf("%s: %s preset, seed %llu: ", sfw_esc(out, eo, sizeof(eo)), preset,
		       (unsigned long long)p.seed);
		print_plan(&pl, 0);
	}
	sfw_mkmodel_plan_free(&pl);
	return cli_report(s, &err);
}
