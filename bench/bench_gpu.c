/* bench_gpu.c - the CUDA engine's speed and memory on one model directory
 * (normally `salafw mkmodel --preset full`: the real shapes, random bf16
 * weights), with the two ceilings measured in the same process:
 *   bench_gpu MODEL [--runs P:G[@CTX],...] [--chunk C] [--kv-cache bf16|fp8]
 * For each run: a fresh context reserved for CTX tokens (default P+G), one
 * prefill of P random ids in pieces of C rows (default 8192), then G greedy
 * one-token steps. Prints prefill tok/s, TTFT, decode tok/s, the peak device
 * memory of the run, and the ratios to the limits: decode as weight bytes per
 * step over the copy ceiling, prefill as linear-layer FLOPs over the GEMM
 * ceiling. The measuring is tools/bench.c's (the same as `salafw bench`).
 * Built in every build; without CUDA=1 it says so and exits 0. */
#include "tools/tools.h"
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


int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_gpu MODEL [--runs P:G[@CTX],...] [--chunk C] [--kv-cache bf16|fp8]\n");
		return 2;
	}
	const char *dir = argv[1], *runs = "1024:128";
	int chunk = 8192, kv8 = 0;
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--runs"))
			runs = argv[i + 1];
		else if (!strcmp(argv[i], "--chunk"))
			chunk = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--kv-cache"))
			kv8 = !strcmp(argv[i + 1], "fp8");
	}
	struct sfw_err err = {0};
	struct sfw_cuda_info info;
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	double copy = 0, gemm = 0;
	if (sfw_bench_limits(&copy, &gemm, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	printf("device %s; LIMIT copy %.0f GB/s, LIMIT gemm %.0f TFLOP/s (measured now)\n", info.name, copy, gemm);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CUDA;
	mp.kv_cache = kv8 ? SFW_KV_CACHE_FP8 : SFW_KV_CACHE_ACT;
	struct sfw_model *m = NULL;
	double t0 = sfw_now_s();
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK) {
		fprintf(stderr, "bench_gpu: %s\n", err.msg);
		return 1;
	}
	size_t wlive, wpeak, wused;
	sfw_cuda_mem_stats(&wlive, &wpeak, &wused);
	const struct sfw_config *cf = sfw_model_config(m);
	double lp = sfw_plan_linear_params(cf);
	/* weights read per decode step, as bound (int8: codes + scales) */
	struct sfw_mem_plan wp;
	sfw_plan_model(m, 0, chunk, &wp);
	double step_bytes = 0;
	printf("model %s: %d layers, loaded on %s in %.1f s; device memory after load %.2f GiB (ours), "
	       "%.2f GiB (driver)\n",
	       dir, cf->num_hidden_layers, sfw_model_device_name(m), sfw_now_s() - t0, wlive / 1073741824.0,
	       wused / 1073741824.0);
	printf("weights on the device: %.2f GiB (the plan's figure for this model); KV cache %s\n",
	       wp.weights / 1073741824.0, kv8 ? "fp8" : "bf16");
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
		if (*r == '@')
			X = strtoll(r + 1, (char **)&r, 10);
		if (*r == ',')
			r++;
		struct sfw_bench_params bp = {P, G, X, chunk, 0};
		struct sfw_bench_result res;
		if (sfw_bench_run(m, &bp, &res, &err) != SFW_OK) {
			printf("run prompt %lld gen %lld ctx %lld: %s\n", P, G, X, err.msg);
			rc = 1;
			continue;
		}
		double pf_tf = res.linear_flops * P / res.ttft_s / 1e12;
		if (step_bytes == 0) {
			step_bytes = res.weight_bytes;
			printf("per token: %.2f GB of weights per decode step (roofline %.0f tok/s at the copy limit), "
			       "%.2f GFLOP of linear layers per prefill token\n",
			       step_bytes / 1e9, copy * 1e9 / step_bytes, 2 * lp / 1e9);
		}
		printf("RUN prompt %lld gen %lld ctx %lld chunk %lld: prefill %.0f tok/s, TTFT %.3f s "
		       "(linear-layer %.0f TFLOP/s = %.2f of GEMM ceiling)\n",
		       P, G, (long long)res.n_ctx, (long long)res.chunk, res.prefill_tps, res.ttft_s, pf_tf, pf_tf / gemm);
		if (G > 0) {
			double med = res.decode_median_s, bw = res.weight_bytes / med / 1e9;
			printf("RUN   decode %.1f tok/s over %lld steps (median step %.3f ms -> %.1f tok/s; "
			       "weights %.0f GB/s = %.2f of copy ceiling)\n",
			       res.decode_tps, G, med * 1e3, 1 / med, bw, bw / copy);
		}
		printf("RUN   peak device memory %.2f GiB (salafw allocations), %.2f GiB (driver: whole process "
		       "incl. CUDA context)\n",
		       res.peak_bytes / 1073741824.0, res.driver_bytes / 1073741824.0);
		/* the plan against the real allocations (the peak counts from the
		 * run's start level, the weights and scratch included) */
		struct sfw_mem_plan pl;
		sfw_plan_model(m, res.n_ctx, (int)res.chunk, &pl);
		double real = res.peak_bytes, GiB = 1073741824.0, off = real - pl.total;
		double margin = pl.total * 0.05 > 256.0 * 1048576 ? pl.total * 0.05 : 256.0 * 1048576;
		printf("RUN   plan %.2f GiB (weights %.2f, KV %.2f, compressed %.2f, lightning %.3f, activations %.2f, "
		       "scratch %.2f) vs measured %.2f GiB: %+.2f GiB, %s (margin %.2f GiB)\n",
		       pl.total / GiB, pl.weights / GiB, pl.kv / GiB, pl.compressed / GiB, pl.lightning / GiB, pl.activations / GiB,
		       pl.scratch / GiB, real / GiB, off / GiB, off <= margin && -off <= margin ? "PLAN OK" : "PLAN OFF",
		       margin / GiB);
		if (!(off <= margin && -off <= margin))
			rc = 1;
	}
	sfw_model_free(m);
	return rc;
}
#endif
