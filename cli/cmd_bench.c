/* salafw bench - prefill and decode speed on random token ids (no tokenizer
 * needed): one prefill of --prompt N tokens, then --gen M one-token steps
 * (tools/bench.c measures; bench/bench_gpu.c uses the same code). On CUDA
 * it also prints the peak device memory and the ratios to the two limits
 * measured in the same run: a device copy (bandwidth, for decode) and a
 * cuBLASLt GEMM (FLOP/s, for prefill). */
#include "cli.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The command line's values (cli_parse_args fills them from the table). */
struct bench_args {
	const char *gemm;
	uint64_t n_prompt, n_gen, chunk, max_ctx;
	int das;
	struct cli_model_opts mo;
};

#define OFF(f) offsetof(struct bench_args, f)
static const struct cli_arg args[] = {
    {{"prompt", 0, "N", "prompt tokens (default 512)"}, CLI_K_U64, OFF(n_prompt), 1, 1 << 24, NULL, NULL},
    {{"gen", 0, "M", "decode steps (default 64)"}, CLI_K_U64, OFF(n_gen), 0, 1 << 24, NULL, NULL},
    {{"prefill-chunk", 0, "C", "prefill rows per piece (default 8192, capped at the prompt)"},
     CLI_K_U64, OFF(chunk), 1, 1 << 20, NULL, NULL},
    {{"max-context", 0, "N", "reserve the context for N tokens (default prompt + gen)"},
     CLI_K_U64, OFF(max_ctx), 0, 1 << 30, NULL, NULL},
    {{"gemm", 0, "MxNxK", "instead: time the CPU bf16 GEMM at this shape, all threads vs one"},
     CLI_K_STR, OFF(gemm), 0, 0, NULL, NULL},
    CLI_DEVICE_ARG(struct bench_args, mo, "where to run (default: cuda when available, else cpu)"),
    CLI_KV_CACHE_ARG(struct bench_args, mo),
    {{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"}, CLI_K_FLAG, OFF(das), 0, 0, NULL, NULL},
    CLI_MODEL_ARGS(struct bench_args, mo, "run"),
    {{0}, 0, 0, 0, 0, NULL, NULL},
};
#undef OFF

static int bench_gemm(const char *C, const char *shape, int threads)
{
	int M, N, K;
	if (sscanf(shape, "%dx%dx%d", &M, &N, &K) != 3 || M < 1 || N < 1 || K < 1 || M > 65536 || N > 262144 ||
	    K > 65536)
		return cli_usage_error(C, "--gemm wants MxNxK, e.g. 256x4096x4096");
	struct sfw_err err = {0};
	double all, one;
	int nt;
	enum sfw_status s = sfw_bench_cpu_gemm(M, N, K, threads, &all, &one, &nt, &err);
	if (s != SFW_OK)
		return cli_report(s, &err);
	printf("gemm %dx%dx%d bf16 weights: %.1f GFLOP/s with %d threads, %.1f GFLOP/s with 1 thread (x%.2f)\n", M,
	       N, K, all, nt, one, all / one);
	s = cli_stdout_flush(&err);
	return cli_report(s, &err);
}

int cmd_bench(int argc, char **argv)
{
	const char *C = "salafw bench";
	struct bench_args a = {.n_prompt = 512, .n_gen = 64, .chunk = 8192};
	cli_model_opts_init(&a.mo);
	struct cli_parser cp;
	int rc = cli_parse_args(&cp, C, argc, argv, args, &a);
	if (rc == CLI_HELP) {
		cli_usage_args(stdout, C, "MODEL_DIR [--prompt N] [--gen M]", args);
		return SFW_EXIT_OK;
	}
	if (rc != 0)
		return rc;
	const char *gemm = a.gemm;
	unsigned long long n_prompt = a.n_prompt, n_gen = a.n_gen, chunk = a.chunk, max_ctx = a.max_ctx;
	int das = a.das;
	const struct cli_model_opts mo = a.mo;
	if (gemm)
		return cp.npos ? cli_usage_error(C, "--gemm takes no MODEL_DIR") : bench_gemm(C, gemm, (int)mo.threads);
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	struct sfw_model_params mp;
	if (cli_model_params(C, &mo, &mp))
		return SFW_EXIT_USAGE;
	if ((rc = cli_model_gate(C, cp.pos[0], mo.no_verify, mo.verify_full, mo.pubkey)) != 0)
		return rc;
	struct sfw_err err = {0};
	enum sfw_status s;
	struct sfw_model *m = NULL;
	if ((s = sfw_model_load(cp.pos[0], &mp, &m, &err)) != SFW_OK)
		return cli_report(s, &err);
	const struct sfw_config *cf = sfw_model_config(m);
	int cuda = !strcmp(sfw_model_device_name(m), "cuda");
	double copy = 0, gemm_tf = 0;
	if (cuda && (s = sfw_bench_limits(&copy, &gemm_tf, &err)) != SFW_OK)
		goto done;
	struct sfw_bench_params bp = {(int64_t)n_prompt, (int64_t)n_gen, (int64_t)max_ctx, (int)chunk, das};
	struct sfw_bench_result r;
	if (cuda) { /* the plan at start, as run prints it (sfw_bench_run refuses what cannot fit) */
		int64_t n_ctx, piece;
		struct sfw_mem_plan pl;
		sfw_bench_shape(&bp, &n_ctx, &piece);
		sfw_plan_model(m, n_ctx, (int)piece, &pl);
		sfw_plan_print(stderr, C, &pl, n_ctx, (int)piece);
	}
	if ((s = sfw_bench_run(m, &bp, &r, &err)) != SFW_OK)
		goto done;
	printf("device %s, %d layers, hidden %d, prompt %llu, gen %llu, context %lld, prefill chunk %lld\n",
	       sfw_model_device_name(m), cf->num_hidden_layers, cf->hidden_size, n_prompt, n_gen, (long long)r.n_ctx,
	       (long long)r.chunk);
	if (cuda)
		printf("limits (measured now): copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", copy, gemm_tf);
	double tf = r.linear_flops * (double)n_prompt / (r.ttft_s > 0 ? r.ttft_s : 1e-9) / 1e12;
	printf("prefill: %.1f tok/s (%.3f s), TTFT %.3f s", r.prefill_tps, r.ttft_s, r.ttft_s);
	if (cuda)
		printf(", linear layers %.1f TFLOP/s = %.2f of the GEMM limit", tf, tf / gemm_tf);
	printf("\n");
	if (n_gen) {
		double bw = r.weight_bytes / r.decode_median_s / 1e9;
		printf("decode: %.1f tok/s (%.3f s), median step %.3f ms -> %.1f tok/s", r.decode_tps, r.decode_s,
		       r.decode_median_s * 1e3, 1 / r.decode_median_s);
		if (cuda)
			printf(", weights %.0f GB/s = %.2f of the copy limit (roofline %.1f tok/s)", bw, bw / copy,
			       copy * 1e9 / r.weight_bytes);
		printf("\n");
	}
	if (r.device_mem)
		printf("peak device memory: %.2f GiB (salafw allocations), %.2f GiB (driver: whole process)\n",
		       r.peak_bytes / 1073741824.0, r.driver_bytes / 1073741824.0);
	s = cli_stdout_flush(&err);
done:
	sfw_model_free(m);
	return s == SFW_OK ? SFW_EXIT_OK : cli_report(s, &err);
}
