/* bench_gpu.c - the CUDA engine's speed and memory on one model directory
 * (normally `salafw mkmodel --preset full`: the real shapes, random bf16
 * weights), with the two ceilings measured in the same process:
 *   bench_gpu MODEL [--runs P:G[@CTX],...] [--chunk C]
 * For each run: a fresh context reserved for CTX tokens (default P+G), one
 * prefill of P random ids in pieces of C rows (default 8192), then G greedy
 * one-token steps. Prints prefill tok/s, TTFT, decode tok/s, the peak device
 * memory of the run, and the ratios to the limits: decode as weight bytes per
 * step over the copy ceiling, prefill as linear-layer FLOPs over the GEMM
 * ceiling. Built in every build; without CUDA=1 it says so and exits 0. */
#include "runner/runner.h"
#include "sfw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef SFW_HAVE_CUDA
int main(void)
{
	printf("bench_gpu: built without CUDA (make CUDA=1); nothing to measure\n");
	return 0;
}
#else
#include "kernels/ops_cuda.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Linear-layer parameters (every matmul weight, lm_head apart). */
static double linear_params(const struct sfw_config *c)
{
	double D = c->hidden_size, I = c->intermediate_size, p = 0;
	double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
	double ld = (double)c->lightning_nh * c->lightning_head_dim;
	for (int i = 0; i < c->num_hidden_layers; i++) {
		p += 3 * D * I;
		if (c->mixer[i] == SFW_MIXER_SPARSE)
			p += qd * D + 2 * kvd * D + D * qd + (c->attn_use_output_gate ? qd * D : 0);
		else
			p += 4 * ld * D + (c->use_output_gate ? ld * D : 0);
	}
	return p;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_gpu MODEL [--runs P:G[@CTX],...] [--chunk C]\n");
		return 2;
	}
	const char *dir = argv[1], *runs = "1024:128";
	int chunk = 8192;
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--runs"))
			runs = argv[i + 1];
		else if (!strcmp(argv[i], "--chunk"))
			chunk = atoi(argv[i + 1]);
	}
	struct sfw_err err = {0};
	struct sfw_cuda_info info;
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	double copy = 0, gemm = 0;
	if (sfw_cuda_measure_copy((size_t)2 << 30, &copy, &err) != SFW_OK ||
	    sfw_cuda_measure_gemm(8192, &gemm, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	printf("device %s; LIMIT copy %.0f GB/s, LIMIT gemm %.0f TFLOP/s (measured now)\n", info.name, copy, gemm);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CUDA;
	struct sfw_model *m = NULL;
	double t0 = now_s();
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	size_t wlive, wpeak, wused;
	sfw_cuda_mem_stats(&wlive, &wpeak, &wused);
	const struct sfw_config *cf = sfw_model_config(m);
	double lp = linear_params(cf), head = (double)cf->vocab_size * cf->hidden_size;
	double step_bytes = 2 * (lp + head); /* bf16 weights read per decode step */
	printf("model %s: %d layers, loaded on %s in %.1f s; device memory after load %.2f GiB (ours), "
	       "%.2f GiB (driver)\n",
	       dir, cf->num_hidden_layers, sfw_model_device_name(m), now_s() - t0, wlive / 1073741824.0,
	       wused / 1073741824.0);
	printf("per token: %.2f GB of weights per decode step, %.2f GFLOP of linear layers per prefill token\n",
	       step_bytes / 1e9, 2 * lp / 1e9);
	int32_t *ids = NULL;
	float *logits = malloc((size_t)cf->vocab_size * sizeof(float));
	const char *r = runs;
	int rc = 0;
	while (*r) {
		long long P = 0, G = 0, X = 0;
		int used = 0;
		if (sscanf(r, "%lld:%lld%n", &P, &G, &used) < 2 || P < 1 || G < 0) {
			fprintf(stderr, "bench_gpu: bad run '%s'\n", r);
			return 2;
		}
		r += used;
		if (*r == '@') {
			X = strtoll(r + 1, (char **)&r, 10);
		}
		if (*r == ',')
			r++;
		if (X < P + G)
			X = P + G;
		ids = realloc(ids, (size_t)P * sizeof(int32_t));
		uint32_t x = 12345;
		ids[0] = cf->bos_token_id;
		for (long long i = 1; i < P; i++) {
			x = x * 1664525u + 1013904223u;
			ids[i] = (int32_t)(3 + (x >> 8) % (uint32_t)(cf->vocab_size - 3));
		}
		sfw_cuda_mem_reset_peak();
		struct sfw_ctx_params xp = sfw_ctx_default_params();
		xp.n_ctx = X;
		xp.prefill_chunk = chunk;
		struct sfw_ctx *ctx = NULL;
		if (sfw_ctx_new(m, &xp, &ctx, &err) != SFW_OK) {
			printf("run prompt %lld gen %lld ctx %lld: %s\n", P, G, X, err.msg);
			rc = 1;
			continue;
		}
		double a = now_s();
		if (sfw_ctx_prefill(ctx, ids, (size_t)P, logits, &err) != SFW_OK) {
			printf("run prompt %lld: prefill failed: %s\n", P, err.msg);
			sfw_ctx_free(ctx);
			rc = 1;
			continue;
		}
		double ttft = now_s() - a;
		double *st = malloc((size_t)(G ? G : 1) * sizeof(double));
		double d0 = now_s();
		for (long long i = 0; i < G; i++) {
			int32_t best = 0;
			for (int v = 1; v < cf->vocab_size; v++)
				if (logits[v] > logits[best])
					best = v;
			double s0 = now_s();
			if (sfw_ctx_decode(ctx, best, logits, &err) != SFW_OK) {
				printf("decode failed: %s\n", err.msg);
				rc = 1;
				break;
			}
			st[i] = now_s() - s0;
		}
		double dec = now_s() - d0;
		size_t live, peak, dused;
		sfw_cuda_mem_stats(&live, &peak, &dused);
		double pf_tps = P / ttft, pf_tf = 2 * lp * P / ttft / 1e12;
		printf("RUN prompt %lld gen %lld ctx %lld chunk %d: prefill %.0f tok/s, TTFT %.3f s "
		       "(linear-layer %.0f TFLOP/s = %.2f of GEMM ceiling)\n",
		       P, G, X, chunk, pf_tps, ttft, pf_tf, pf_tf / gemm);
		if (G > 0) {
			qsort(st, (size_t)G, sizeof(double), cmp_d);
			double med = st[G / 2], bw = step_bytes / med / 1e9;
			printf("RUN   decode %.1f tok/s over %lld steps (median step %.3f ms -> %.1f tok/s; "
			       "weights %.0f GB/s = %.2f of copy ceiling)\n",
			       G / dec, G, med * 1e3, 1 / med, bw, bw / copy);
		}
		printf("RUN   peak device memory %.2f GiB (salafw allocations), %.2f GiB (driver: whole process "
		       "incl. CUDA context)\n",
		       peak / 1073741824.0, dused / 1073741824.0);
		free(st);
		sfw_ctx_free(ctx);
	}
	free(ids);
	free(logits);
	sfw_model_free(m);
	return rc;
}
#endif
