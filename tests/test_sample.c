/* test_sample.c - kernels/sample.c (the CPU twin of the CUDA sampling
 * kernel): the host sampler runner/sampler.c is this twin fed its own
 * uniform stream (reproduced by sfw_op_sample_uniform from a copy of its
 * state), draw for draw; greedy, +inf and all-NaN rows. */
#include "check.h"
#include "lib/rng.h"

#include "kernels/ops.h"
#include "runner/runner.h"
#include "runner/sampler.h"

#include <stdlib.h>

#include <math.h>
#include <string.h>

static uint64_t rng = 0x1234567887654321ull;
static float urand(void)
{
	return sfwt_unit(&rng);
}

int main(void)
{
	enum { V = 3000, DRAWS = 300 };
	static float lg[V];
	struct {
		float t;
		int k;
		float p;
	} cfg[] = {{0.9f, 0, 1.0f}, {0.7f, 40, 1.0f}, {1.0f, 0, 0.9f}, {0.8f, 50, 0.8f}, {1.3f, 2000, 0.95f},
		   {0.5f, 1, 1.0f},  {2.0f, 0, 0.5f}};
	int total = 0, diff = 0;
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		struct sfw_op_sample_params sp = sfw_sampler_default_params();
		sp.temperature = cfg[c].t, sp.top_k = cfg[c].k, sp.top_p = cfg[c].p;
		struct sfw_sampler s;
		struct sfw_err err = {0};
		CHECK(sfw_sampler_init(&s, &sp, 99 + c, V, &err) == SFW_OK, "sampler init: %s", err.msg);
		uint64_t st[4];
		memcpy(st, s.rng, sizeof(st));
		struct sfw_op_sample_params op = {
		    .temperature = cfg[c].t, .top_k = cfg[c].k, .top_p = cfg[c].p, .greedy = 0};
		int d = 0;
		for (int r = 0; r < DRAWS; r++) {
			/* peaked rows (a few strong tokens), some NaN and -inf */
			for (int i = 0; i < V; i++) {
				float x = urand();
				lg[i] = 8 * x * x * x * x + 2 * urand();
				if (x > 0.999f)
					lg[i] = NAN;
				else if (x < 0.001f)
					lg[i] = -INFINITY;
			}
			double u = sfw_op_sample_uniform(st);
			int32_t a = sfw_sampler_sample(&s, lg, V), b = sfw_op_sample_cpu(NULL, lg, V, &op, u);
			CHECK(b >= 0 && b < V && !isnan(lg[b]) && lg[b] != -INFINITY, "twin picked a candidate (%d)", b);
			d += a != b;
		}
		printf("  T %.1f top-k %d top-p %.2f: %d of %d draws differ\n", cfg[c].t, cfg[c].k, cfg[c].p, d, DRAWS);
		total += DRAWS, diff += d;
		sfw_sampler_release(&s);
	}
	/* one sampler: the host sampler is the twin fed its own uniform stream */
	CHECK(diff == 0, "the host sampler is the twin on its uniform stream: %d of %d draws agree", total - diff, total);
	/* the exact cases */
	struct sfw_op_sample_params g = {.temperature = 0.9f, .top_k = 0, .top_p = 1.0f, .greedy = 1};
	for (int i = 0; i < V; i++)
		lg[i] = (float)(i % 97);
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &g, 0.5) == sfw_sampler_argmax(lg, V),
	      "greedy = argmax, lowest id on ties");
	struct sfw_op_sample_params t0 = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .greedy = 0};
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &t0, 0.5) == 96, "temperature 0 = argmax");
	struct sfw_op_sample_params tiny = {
	    .temperature = 1e-40f, .top_k = 0, .top_p = 1.0f, .greedy = 0}; /* 1/T = inf: the greedy limit */
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &tiny, 0.5) == 96 &&
		  sfw_op_sample_cpu(NULL, lg, V, &tiny, 0.999) == 96,
	      "temperature 1e-40 = argmax (not the least likely id)");
	lg[500] = INFINITY, lg[700] = INFINITY;
	struct sfw_op_sample_params tp = {.temperature = 1.0f, .top_k = 5, .top_p = 0.5f, .greedy = 0};
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &tp, 0.99) == 500, "the first +inf wins");
	for (int i = 0; i < V; i++)
		lg[i] = NAN;
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &tp, 0.3) == 0, "all NaN: 0, as sfw_sampler_argmax");
	/* a two-token row: the draw splits at the probability mass */
	for (int i = 0; i < V; i++)
		lg[i] = -INFINITY;
	lg[10] = 0, lg[20] = logf(3); /* p(10) = 1/4 in id order */
	struct sfw_op_sample_params pl = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .greedy = 0};
	CHECK(sfw_op_sample_cpu(NULL, lg, V, &pl, 0.2) == 10 &&
		  sfw_op_sample_cpu(NULL, lg, V, &pl, 0.3) == 20,
	      "u below 1/4 draws the first token, above it the second");
	/* sfw_ctx_decode_next on the CPU engine = decode + the twin */
	const char *gd = check_golden_dir();
	if (gd) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/tiny-sparse", gd);
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		struct sfw_model *m = NULL;
		struct sfw_ctx *a = NULL, *b = NULL;
		struct sfw_err err = {0};
		enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
		if (s == SFW_OK)
			s = sfw_ctx_new(m, NULL, &a, &err);
		if (s == SFW_OK)
			s = sfw_ctx_new(m, NULL, &b, &err);
		CHECK(s == SFW_OK, "%s: %s", dir, err.msg);
		int Vm = s == SFW_OK ? sfw_model_config(m)->vocab_size : 0, same = 0, steps = 0;
		float *l = malloc((size_t)(Vm ? Vm : 1) * sizeof(float));
		int32_t prompt[3] = {1, 50, 60}, id = 7;
		struct sfw_op_sample_params sp = {
		    .temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .greedy = 0};
		uint64_t st2[4] = {5, 6, 7, 8};
		if (s == SFW_OK && (s = sfw_ctx_prefill(a, prompt, 3, NULL, &err)) == SFW_OK)
			s = sfw_ctx_prefill(b, prompt, 3, NULL, &err);
		for (int i = 0; i < 12 && s == SFW_OK; i++) {
			double u = sfw_op_sample_uniform(st2);
			int32_t na = -1;
			if ((s = sfw_ctx_decode_next(a, id, &sp, u, &na, &err)) == SFW_OK &&
			    (s = sfw_ctx_decode(b, id, l, &err)) == SFW_OK) {
				id = sfw_op_sample_cpu(NULL, l, Vm, &sp, u);
				same += na == id;
				steps++;
			}
		}
		CHECK(s == SFW_OK && steps == 12 && same == 12, "decode_next = decode + twin on %d of %d steps (%s)", same,
		      steps, err.msg);
		free(l);
		sfw_ctx_free(a);
		sfw_ctx_free(b);
		sfw_model_free(m);
	}
	return CHECK_REPORT("test_sample");
}
