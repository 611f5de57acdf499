/* test_bench_plan.c - runner/plan.c's device-memory plan and parameter
 * count against independent figures: mkmodel's tensor list for the real
 * shapes (preset full: 9,477,203,968 parameters, bf16), and the KV /
 * compressed-key / lightning-state sizes of docs/performance.md §4b worked out by
 * hand for 1M tokens; and README.md's table of which context fits a card,
 * every cell recomputed from the plan. */
#include "check.h"

#include "tools/tools.h"
#include "num/w8_layout.h"

#include <math.h>
#include <string.h>

/* The largest context, in 64-token blocks, whose plan fits a card of
 * card_gib GiB after the README's allowances: the 0.55 GiB CUDA context
 * measured on the H200 and 0.5 GiB left to the driver and display. */
static int64_t card_fit(const struct sfw_config *c, int w8, int kv8, int chunk, double card_gib)
{
	const double G = 1073741824.0;
	int64_t lo = 0, hi = (int64_t)1 << 26; /* blocks; 4G tokens fit no card here */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo + 1) / 2, n = mid * 64;
		struct sfw_mem_plan p;
		if (w8)
			sfw_plan_config_w8(c, n, chunk, 128, &p);
		else
			sfw_plan_config(c, n, chunk, &p);
		if (kv8)
			sfw_plan_kv8(c, n, &p);
		struct sfw_err e = {0};
		double fr = (card_gib - 0.55 - 0.5) * G - p.weights;
		if (fr > 0 && sfw_plan_fit(&p, n, fr, &e) == SFW_OK)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo * 64;
}

/* One cell of the README's card table against the plan's largest context:
 * "does not fit" = not one block; "~NK tokens" = N K to N + 16 K below the
 * plan's figure (rounded down, never above it); "1M and more" = at least
 * 2^20, with "(~X.YM)" naming it to a tenth, rounded down. */
static int card_cell_ok(const char *cell, int64_t fit)
{
	const double M = 1048576.0;
	const char *t;
	long long k;
	double m;
	if (strstr(cell, "does not fit"))
		return fit == 0;
	if (strstr(cell, "1M and more")) {
		if ((t = strstr(cell, "(~")) && sscanf(t, "(~%lfM)", &m) == 1)
			return fit >= M && m * M <= fit * (1 + 1e-9) && fit < (m + 0.1) * M;
		return fit >= M;
	}
	if ((t = strchr(cell, '~')) && sscanf(t, "~%lldK", &k) == 1)
		return k * 1024 <= fit && fit < (k + 16) * 1024;
	return 0;
}

/* README.md's "which context fits a card" table, every cell, from this plan
 * (tests run from the repository root). */
static void test_readme_cards(const struct sfw_config *c)
{
	FILE *f = fopen("README.md", "r");
	CHECK(f != NULL, "README.md readable from the repository root");
	if (!f)
		return;
	/* the columns: bf16 default pieces, bf16 2048, int8 g128 default, int8 2048,
	 * int8 with the fp8 KV cache 2048 */
	static const int col_w8[] = {0, 0, 1, 1, 1}, col_kv8[] = {0, 0, 0, 0, 1},
			 col_chunk[] = {8192, 2048, 8192, 2048, 2048};
	int rows = 0, header = 0, gb;
	char line[1024];
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "| card |", 8))
			header = strstr(line, "| bf16, 8192-row") &&
				 strstr(line, "| bf16, `--prefill-chunk 2048`") &&
				 strstr(line, "| int8 g128, default") &&
				 strstr(line, "| int8 g128, `--prefill-chunk 2048` |") &&
				 strstr(line, "| int8 g128, `--kv-cache fp8 --prefill-chunk 2048` |");
		if (sscanf(line, "| %d GB |", &gb) != 1 || (gb != 12 && gb != 16 && gb != 24 && gb != 32))
			continue;
		rows++;
		char *cell = strchr(line + 1, '|');
		for (int col = 0; col < 5; col++) {
			char *end = cell ? strchr(cell + 1, '|') : NULL;
			if (!end) {
				CHECK(0, "README %d GB row: %d cells", gb, col);
				break;
			}
			*end = 0;
			int64_t fit = card_fit(c, col_w8[col], col_kv8[col], col_chunk[col], gb);
			CHECK(card_cell_ok(cell + 1, fit),
			      "README %d GB, %s%s, %d-row pieces: '%s' vs the plan's %lld tokens", gb,
			      col_w8[col] ? "int8 g128" : "bf16", col_kv8[col] ? " + fp8 K/V" : "", col_chunk[col], cell + 1,
			      (long long)fit);
			cell = end;
		}
	}
	fclose(f);
	CHECK(header && rows == 4, "README's card table: its header and the 12, 16, 24 and 32 GB rows (%d)",
	      rows);
}

/* salafw serve's plan (sfw_plan_seqs): 32 sequences that can each
 * reach 8K tokens, steps of 32 decode rows + 512 prompt rows, bf16 full
 * shapes, against the single-context figures above worked out by hand
 * (8 KiB of KV per token), and its refusal's arithmetic. */
static void test_batch_plan(const struct sfw_config *c)
{
	const double G = 1073741824.0;
	const int S = 32, rows = 32 + 512;
	const int64_t ctx = 8192;
	struct sfw_mem_plan one, b;
	sfw_plan_config(c, ctx, rows, &one);
	b = one;
	sfw_plan_seqs(c, S, 0, &b);
	CHECK(b.seqs == S && b.kv == S * 8192.0 * 8192 && b.compressed == S * one.compressed &&
		  b.lightning == S * 48.0 * 1048576.0,
	      "32 x 8K: KV %.0f B (32 x 64 MiB), compressed keys and lightning states x 32", b.kv);
	CHECK(b.activations == one.activations + 31.0 * c->vocab_size * 4 && b.weights == one.weights &&
		  b.scratch == one.scratch,
	      "one workspace of %d rows, a float logits row per sequence", rows);
	CHECK(b.total == b.weights + b.kv + b.compressed + b.lightning + b.activations + b.scratch, "batch total");
	struct sfw_mem_plan pool = one;
	sfw_plan_seqs(c, S, 65536, &pool);
	CHECK(pool.kv == 65536 * 8192.0, "a pool of 64K tokens bounds the KV of all (%.0f B)", pool.kv);
	/* the refusal: 32 sequences of 128K on a 24 GiB card with the weights placed */
	struct sfw_mem_plan big;
	sfw_plan_config(c, 131072, rows, &big);
	sfw_plan_seqs(c, S, 0, &big);
	double fr = 24 * G - big.weights - 0.55 * G;
	struct sfw_err e = {0};
	CHECK(sfw_plan_fit(&big, 131072, fr, &e) == SFW_E_NOMEM &&
		  strstr(e.msg, "32 sequences of 131072 tokens do not fit the GPU"),
	      "32 x 128K refused on 24 GiB: %s", e.msg);
	long long each = 0;
	const char *at = strstr(e.msg, "at most about ");
	CHECK(at && sscanf(at, "at most about %lld tokens each)", &each) == 1 && each % 64 == 0 && each > 0 &&
		  each < 131072,
	      "a largest context per sequence named (%lld)", each);
	size_t ml = strlen(e.msg);
	CHECK(ml < sizeof(e.msg) - 1 && ml > 12 && strcmp(e.msg + ml - 12, "GiB are free") == 0,
	      "the message is whole: %s", e.msg);
	printf("serve refusal, 32 x 128K on a 24 GiB card: %s\n", e.msg);
	if (each > 0) {
		struct sfw_mem_plan q;
		sfw_plan_config(c, each, rows, &q);
		sfw_plan_seqs(c, S, 0, &q);
		CHECK(sfw_plan_fit(&q, each, fr, &e) == SFW_OK, "32 x the named %lld tokens fit", each);
		sfw_plan_config(c, each + 1024, rows, &q);
		sfw_plan_seqs(c, S, 0, &q);
		CHECK(sfw_plan_fit(&q, each + 1024, fr, &e) == SFW_E_NOMEM, "1024 more each do not");
	}
}

int main(void)
{
	struct sfw_mkmodel_params mp;
	memset(&mp, 0, sizeof(mp));
	mp.preset = SFW_MKMODEL_FULL;
	struct sfw_mkmodel_plan plan;
	struct sfw_err err = {0};
	enum sfw_status s = sfw_mkmodel_plan(&mp, &plan, &err);
	CHECK(s == SFW_OK, "mkmodel plan: %s", err.msg);
	if (s != SFW_OK)
		return CHECK_REPORT("test_bench_plan");
	const struct sfw_config *c = &plan.config;
	struct sfw_mem_plan p;
	sfw_plan_config(c, 1 << 20, 8192, &p);
	CHECK(p.weights == (double)plan.n_bytes, "weights %.0f B == mkmodel's %llu B", p.weights,
	      (unsigned long long)plan.n_bytes);
	/* linear weights + lm_head read per decode step: 18.35 GB (§4b) */
	double step = 2 * (sfw_plan_linear_params(c) + (double)c->vocab_size * c->hidden_size);
	CHECK(fabs(step / 1e9 - 18.35) < 0.01, "decode step reads %.3f GB of weights (18.35)", step / 1e9);
	/* 8 sparse layers x 2 KV heads x 128 x (K+V) x 2 B = 8 KiB per token */
	CHECK(p.kv_per_token == 8192, "KV %.0f B per token (8192)", p.kv_per_token);
	CHECK(p.kv == 8.0 * 1073741824.0, "KV at 1M tokens %.0f B (8 GiB)", p.kv);
	/* 24 lightning layers x 32 heads x 128 x 128 x 4 B = 48 MiB */
	CHECK(p.lightning == 48.0 * 1048576.0, "lightning states %.0f B (48 MiB)", p.lightning);
	/* level 1 every 16 tokens, level 2 every 64: (65537 + 16385) x 256 x 2 B x 8 layers */
	CHECK(p.compressed == (65537.0 + 16385.0) * 256 * 2 * 8, "compressed keys %.0f B", p.compressed);
	CHECK(p.total / 1073741824.0 < 30, "1M-token plan %.2f GiB stays under 30 GiB", p.total / 1073741824.0);
	struct sfw_mem_plan q;
	sfw_plan_config(c, 1024, 1024, &q);
	CHECK(q.scratch < p.scratch && q.activations < p.activations && q.kv == 1024 * 8192.0,
	      "a 1K context needs no selection scratch and smaller pieces");
	/* int8: the plan's weights against mkmodel --w8's own tensor list, for
	 * every group size; the rest of the plan does not depend on the format */
	static const int groups[] = {32, 64, 128, SFW_QL_GROUP_CHANNEL};
	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
		struct sfw_mkmodel_params wp = mp;
		wp.w8 = 1;
		wp.w8_group = groups[g];
		struct sfw_mkmodel_plan wpl;
		s = sfw_mkmodel_plan(&wp, &wpl, &err);
		CHECK(s == SFW_OK, "mkmodel --w8 plan: %s", err.msg);
		if (s != SFW_OK)
			continue;
		/* mkmodel also writes the 16-byte weight_shape of each linear: 32 layers
		 * x (gate, up, down + q, k, v, o and o_gate or z) */
		int n_lin = 0;
		for (size_t i = 0; i < wpl.n_tensors; i++)
			n_lin += wpl.tensors[i].kind == SFW_MKT_W8_SHAPE;
		CHECK(n_lin == 32 * 8, "%d int8 linears (256)", n_lin);
		struct sfw_mem_plan w8;
		sfw_plan_config_w8(&wpl.config, 1 << 20, 8192, groups[g], &w8);
		CHECK(w8.weights + 16.0 * n_lin == (double)wpl.n_bytes, "group %d: int8 weights %.0f B + shapes == mkmodel's %llu B",
		      groups[g], w8.weights, (unsigned long long)wpl.n_bytes);
		CHECK(w8.kv == p.kv && w8.compressed == p.compressed && w8.activations == p.activations &&
			  w8.scratch == p.scratch && w8.lightning == p.lightning,
		      "group %d: caches, activations and scratch as for bf16", groups[g]);
		CHECK(w8.total == w8.weights + p.total - p.weights, "group %d: total", groups[g]);
		if (groups[g] == 128) {
			/* the --max-context refusal's arithmetic: a 16 GiB card with the
			 * int8 weights placed and ~0.55 GiB of CUDA context */
			struct sfw_mem_plan pn;
			double fr = 16.0 * 1073741824.0 - w8.weights - 0.55 * 1073741824.0;
			struct sfw_err e = {0};
			CHECK(sfw_plan_fit(&w8, 1 << 20, fr, &e) == SFW_E_NOMEM, "1M tokens refused on 16 GiB");
			long long fit = 0;
			const char *at = strstr(e.msg, "at most about ");
			CHECK(at && sscanf(at, "at most about %lld", &fit) == 1 && fit % 64 == 0 && fit > 100000 && fit < (1 << 20),
			      "a largest context named: %s", e.msg);
			size_t ml = strlen(e.msg);
			CHECK(ml < sizeof(e.msg) - 1 && ml > 12 && strcmp(e.msg + ml - 12, "GiB are free") == 0,
			      "the message is whole: %s", e.msg);
			sfw_plan_config_w8(&wpl.config, fit, 8192, 128, &pn);
			CHECK(sfw_plan_fit(&pn, fit, fr, &e) == SFW_OK, "the named %lld tokens fit", fit);
			sfw_plan_config_w8(&wpl.config, fit + 4096, 8192, 128, &pn);
			CHECK(sfw_plan_fit(&pn, fit + 4096, fr, &e) == SFW_E_NOMEM, "4096 more do not");
			/* the longest figures still leave the message whole */
			sfw_plan_config_w8(&wpl.config, (int64_t)1 << 40, 8192, 128, &pn);
			CHECK(sfw_plan_fit(&pn, (int64_t)1 << 40, fr, &e) == SFW_E_NOMEM &&
				  strlen(e.msg) < sizeof(e.msg) - 1 && strstr(e.msg, "GiB are free"),
			      "2^40 tokens: the message is whole (%zu chars): %s", strlen(e.msg), e.msg);
			printf("refusal at 1M on a 16 GiB card: %s\n", e.msg);
			/* 8.87 GB of codes + 1/64 of that in scales + 1.2 GB of bf16 embedding and lm_head */
			double codes = sfw_plan_linear_params(c);
			CHECK(fabs(w8.weights - (codes * (1 + 2.0 / 128) + 4.0 * c->vocab_size * c->hidden_size +
						 (p.weights - 2 * codes - 4.0 * c->vocab_size * c->hidden_size))) < 1,
			      "g128 weights = codes + scales + bf16 rest (%.0f B)", w8.weights);
			/* the bound: int8 at 1M context in under 20 GiB */
			CHECK(w8.total / 1073741824.0 < 20, "int8 1M-token plan %.2f GiB under 20 GiB", w8.total / 1073741824.0);
			printf("int8 g128 plan at 1M tokens: weights %.2f GiB, total %.2f GiB (bf16: %.2f, %.2f)\n",
			       w8.weights / 1073741824.0, w8.total / 1073741824.0, p.weights / 1073741824.0,
			       p.total / 1073741824.0);
			/* int8 + fp8 K/V: 8 layers x 2 heads x (128 codes + a 4-byte scale) x (K+V)
			 * = 4224 B per token; at 1M with 2048-row prefill pieces the whole
			 * plan within 14.9 GiB (a 16 GiB card less its CUDA context) */
			for (int chunk = 8192; chunk >= 1024; chunk /= 2) {
				struct sfw_mem_plan f8;
				sfw_plan_config_w8(&wpl.config, 1 << 20, chunk, 128, &f8);
				sfw_plan_kv8(&wpl.config, 1 << 20, &f8);
				if (chunk == 8192)
					CHECK(f8.kv_per_token == 4224 && f8.kv == 4224.0 * (1 << 20) && f8.kv8 &&
						  f8.total == w8.total - (p.kv - f8.kv),
					      "fp8 K/V: %.0f B per token (4224), the rest as bf16's", f8.kv_per_token);
				printf("int8 g128 + fp8 K/V at 1M tokens, %d-row pieces: KV %.2f GiB, activations %.2f GiB, "
				       "total %.2f GiB\n",
				       chunk, f8.kv / 1073741824.0, f8.activations / 1073741824.0, f8.total / 1073741824.0);
				if (chunk == 2048)
					CHECK(f8.total / 1073741824.0 <= 14.9,
					      "int8 + fp8 K/V at 1M with --prefill-chunk 2048: %.2f GiB <= 14.9",
					      f8.total / 1073741824.0);
			}
		}
		sfw_mkmodel_plan_free(&wpl);
	}
	test_batch_plan(c);
	test_readme_cards(c);
	sfw_mkmodel_plan_free(&plan);
	return CHECK_REPORT("test_bench_plan");
}
