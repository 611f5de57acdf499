/* salafw mkmodel - write a random-weight SALA model directory. */
#include "cli.h"

#include "log.h"
#include "quant/quant.h"
#include "tools/tools.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct cli_opt opts[] = {
    {"preset", 0, "NAME",
     "tiny (tests, demo), small (CPU benchmarks), full (the real shapes, ~19 GB) or wide4 (the real widths "
     "in 4 layers, ~3.4 GB)"},
    {"seed", 0, "N", "weight seed (default 0); the output is a pure function of preset and seed"},
    {"output", 'o', "DIR", "output directory (created if needed)"},
    {"dry-run", 0, NULL, "print the tensors, shards and parameter count; write nothing"},
    {"force", 0, NULL, "overwrite a model already in DIR"},
    {"threads", 't', "N", "generator threads (default: all cores)"},
    {"shard-mib", 0, "N",
     "shard size limit in MiB (default: tiny 6, small 128, full 4768 = 5 GB, wide4 1907 = 2 GB)"},
    {"no-tokenizer", 0, NULL, "skip tokenizer.model and tokenizer_config.json"},
    {"w8", 0, NULL, "write the decoder linears as int8 (pack-quantized, random codes and scales) directly"},
    {"group", 0, "G", "with --w8: scale group size 32, 64, 128 (default) or channel"},
    {0},
};

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
	struct sfw_mkmodel_params p;
	memset(&p, 0, sizeof(p));
	const char *preset = NULL, *out = NULL, *arg;
	int dry_run = 0, k, group = SFW_QL_GROUP_DEFAULT;
	unsigned long long v;
	cli_init(&cp, cmd, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, cmd, synopsis, opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *name = opts[k].name;
		if (strcmp(name, "preset") == 0) {
			preset = arg;
		} else if (strcmp(name, "seed") == 0) {
			if (!cli_parse_u64(cmd, name, arg, &v))
				return SFW_EXIT_USAGE;
			p.seed = v;
		} else if (strcmp(name, "output") == 0) {
			out = arg;
		} else if (strcmp(name, "dry-run") == 0) {
			dry_run = 1;
		} else if (strcmp(name, "force") == 0) {
			p.force = 1;
		} else if (strcmp(name, "threads") == 0) {
			if (!cli_parse_u64(cmd, name, arg, &v))
				return SFW_EXIT_USAGE;
			if (v < 1 || v > 256)
				return cli_usage_error(cmd, "--threads must be 1 to 256");
			p.nthreads = (int)v;
		} else if (strcmp(name, "shard-mib") == 0) {
			if (!cli_parse_u64(cmd, name, arg, &v))
				return SFW_EXIT_USAGE;
			if (v < 1 || v > (1u << 20))
				return cli_usage_error(cmd, "--shard-mib must be 1 to 1048576");
			p.shard_bytes = (uint64_t)v << 20;
		} else if (strcmp(name, "no-tokenizer") == 0) {
			p.no_tokenizer = 1;
		} else if (strcmp(name, "w8") == 0) {
			p.w8 = 1;
		} else if (strcmp(name, "group") == 0) {
			if ((group = sfw_quant_group_parse(arg)) < 0)
				return cli_usage_error(cmd, "--group must be 32, 64, 128 or channel");
		}
	}
	if (cp.npos > 0)
		return cli_usage_error(cmd, "unexpected argument '%s'", cp.pos[0]);
	if (!preset)
		return cli_usage_error(cmd, "--preset is required");
	if (!sfw_mkmodel_preset_parse(preset, &p.preset))
		return cli_usage_error(cmd, "unknown preset '%s' (tiny, small, full or wide4)", preset);
	if (!out && !dry_run)
		return cli_usage_error(cmd, "-o DIR is required");
	p.w8_group = group;

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
