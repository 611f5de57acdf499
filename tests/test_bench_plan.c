/* test_bench_plan.c - runner/bench.c's device-memory plan and parameter
 * count against independent figures: mkmodel's tensor list for the real
 * shapes (preset full: 9,477,203,968 parameters, bf16), and the KV /
 * compressed-key / lightning-state sizes of docs/performance.md §4b worked out by
 * hand for 1M tokens. */
#include "check.h"

#include "runner/bench.h"
#include "runner/mkmodel.h"

#include <math.h>
#include <string.h>

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
	sfw_bench_mem_plan(c, 1 << 20, 8192, &p);
	CHECK(p.weights == (double)plan.n_bytes, "weights %.0f B == mkmodel's %llu B", p.weights,
	      (unsigned long long)plan.n_bytes);
	/* linear weights + lm_head read per decode step: 18.35 GB (§4b) */
	double step = 2 * (sfw_bench_linear_params(c) + (double)c->vocab_size * c->hidden_size);
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
	sfw_bench_mem_plan(c, 1024, 1024, &q);
	CHECK(q.scratch < p.scratch && q.activations < p.activations && q.kv == 1024 * 8192.0,
	      "a 1K context needs no selection scratch and smaller pieces");
	sfw_mkmodel_plan_free(&plan);
	return CHECK_REPORT("test_bench_plan");
}
