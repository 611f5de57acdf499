/* modules: runner quant kernels fetch verify core */
/* gpu_long.c - long context: the tiny-sparse golden model (InfLLM-v2 from
 * 512 tokens on) fed a long random prompt (GPU_LONG_TOKENS, default 65536)
 * on the CUDA engine (prefill pieces of 4096 rows, block selection forced
 * into row batches of ~25 rows) and on the CPU engine
 * (pieces of 256), then a few greedy decode steps on each. Compared: the
 * last-position logits, every decode step's logits (bf16 vs fp32 engines:
 * the golden bf16 tolerance, 1.5e-2 absolute on logits of max ~0.4), the
 * first greedy token, and the blocks selected for the last row in every
 * sparse layer (a bf16 engine swaps near-tied blocks: on tiny-sparse the
 * bf16 reference and the fp32 CPU engine differ in ~29% of selection rows,
 * so up to a third may differ here; the logits are the real check). 256K tokens works the same way (set GPU_LONG_TOKENS);
 * the CPU side then takes minutes, so the default is shorter. */
#include "check.h"
#include "runner/backend.h"
#include "runner/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum sfw_status (*const gpu_long_backend)(int, struct sfw_backend **, struct sfw_err *) = sfw_backend_cuda_new;

#define STEPS 4

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct out {
	float *logits; /* [STEPS + 1][V] */
	int32_t tokens[STEPS + 1];
	int32_t *blocks; /* [L][nkv * k] */
	double secs;
};

static int run(const char *dir, enum sfw_device dev, int chunk, const int32_t *ids, size_t n, struct out *o)
{
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = dev;
	enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
	CHECK(s == SFW_OK, "load: %s", err.msg);
	if (s != SFW_OK)
		return 0;
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size, L = cf->num_hidden_layers, nk = cf->num_key_value_heads * cf->sparse_k;
	o->logits = malloc((size_t)(STEPS + 1) * V * sizeof(float));
	o->blocks = malloc((size_t)L * nk * sizeof(int32_t));
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = (int64_t)n + STEPS + 1;
	xp.prefill_chunk = chunk;
	struct sfw_ctx *c = NULL;
	s = sfw_ctx_new(m, &xp, &c, &err);
	CHECK(s == SFW_OK, "ctx: %s", err.msg);
	double t0 = now_s();
	if (s == SFW_OK)
		s = sfw_ctx_prefill(c, ids, n, o->logits, &err);
	CHECK(s == SFW_OK, "prefill %zu tokens on %s: %s", n, sfw_model_device_name(m), err.msg);
	for (int l = 0; s == SFW_OK && l < L; l++)
		if (sfw_ctx_last_blocks(c, l, o->blocks + (size_t)l * nk) < 0)
			memset(o->blocks + (size_t)l * nk, 0xff, (size_t)nk * sizeof(int32_t));
	for (int i = 0; s == SFW_OK && i <= STEPS; i++) {
		const float *lg = o->logits + (size_t)i * V;
		int32_t best = 0;
		for (int v = 1; v < V; v++)
			if (lg[v] > lg[best])
				best = v;
		o->tokens[i] = best;
		if (i < STEPS) {
			s = sfw_ctx_decode(c, best, o->logits + (size_t)(i + 1) * V, &err);
			CHECK(s == SFW_OK, "decode: %s", err.msg);
		}
	}
	o->secs = now_s() - t0;
	sfw_ctx_free(c);
	sfw_model_free(m);
	return s == SFW_OK ? V : 0;
}

int main(void)
{
	const char *gdir = check_golden_dir();
	if (!gdir)
		return CHECK_REPORT("gpu_long");
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/tiny-sparse", gdir);
	size_t n = getenv("GPU_LONG_TOKENS") ? (size_t)atol(getenv("GPU_LONG_TOKENS")) : 65536;
	int32_t *ids = malloc(n * sizeof(int32_t));
	uint32_t x = 777;
	ids[0] = 1;
	for (size_t i = 1; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		ids[i] = (int32_t)(3 + (x >> 8) % 1021u);
	}
	struct out g = {0}, c = {0};
	/* 1 MiB of selection scratch: the CUDA backend must cut every 4096-row
	 * piece into small row batches, the path a 1M-token prompt takes */
	setenv("SALAFW_CUDA_SELECT_MB", "1", 1);
	int V = run(dir, SFW_DEVICE_CUDA, 4096, ids, n, &g);
	int V2 = run(dir, SFW_DEVICE_CPU, 256, ids, n, &c);
	if (V && V == V2) {
		printf("gpu_long: %zu-token prompt + %d steps: cuda %.2f s, cpu %.2f s\n", n, STEPS, g.secs, c.secs);
		for (int i = 0; i <= STEPS; i++) {
			double md = 0, mr = 0;
			for (int v = 0; v < V; v++) {
				double d = fabs((double)g.logits[(size_t)i * V + v] - c.logits[(size_t)i * V + v]);
				md = d > md ? d : md;
				mr = fabs(c.logits[(size_t)i * V + v]) > mr ? fabs(c.logits[(size_t)i * V + v]) : mr;
			}
			printf("  position %zu: logits max|diff| %.3g (max|logit| %.3g), greedy %d / %d\n", n - 1 + i, md,
			       mr, g.tokens[i], c.tokens[i]);
			CHECK(md <= 1.5e-2, "position %zu: logits differ by %.3g", n - 1 + i, md);
		}
		CHECK(g.tokens[0] == c.tokens[0], "first greedy token %d vs %d", g.tokens[0], c.tokens[0]);
		/* selections of the last decode step, per sparse layer (as sets) */
		struct sfw_model *m = NULL;
		struct sfw_err err = {0};
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		if (sfw_model_load(dir, &mp, &m, &err) == SFW_OK) {
			const struct sfw_config *cf = sfw_model_config(m);
			int nk = cf->num_key_value_heads * cf->sparse_k;
			long diff = 0, tot = 0;
			for (int l = 0; l < cf->num_hidden_layers; l++) {
				if (cf->mixer[l] != SFW_MIXER_SPARSE)
					continue;
				const int32_t *a = g.blocks + (size_t)l * nk, *b = c.blocks + (size_t)l * nk;
				for (int i = 0; i < nk; i++) {
					int found = 0;
					int g0 = i / cf->sparse_k * cf->sparse_k;
					for (int j = g0; j < g0 + cf->sparse_k; j++)
						found |= a[i] == b[j];
					diff += !found;
					tot++;
				}
			}
			printf("  last-step selected blocks differing: %ld of %ld\n", diff, tot);
			CHECK(diff * 3 <= tot, "selected blocks differ: %ld of %ld", diff, tot);
			sfw_model_free(m);
		}
	}
	free(g.logits), free(g.blocks), free(c.logits), free(c.blocks), free(ids);
	return CHECK_REPORT("gpu_long");
}
