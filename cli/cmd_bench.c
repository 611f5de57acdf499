/* salafw bench - prefill and decode speed on random token ids (no tokenizer
 * needed): one prefill of --prompt N tokens, then --gen M one-token steps. */
#include "cli.h"
#include "thread.h"
#include "alloc.h"
#include "kernels/ops.h"
#include "runner/runner.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static const struct cli_opt opts[] = {
	{"prompt", 0, "N", "prompt tokens (default 512)"},
	{"gen", 0, "M", "decode steps (default 64)"},
	{"gemm", 0, "MxNxK", "instead: time the CPU bf16 GEMM at this shape, all threads vs one"},
	{"device", 0, "cpu|cuda", "where to run (default: cuda when available, else cpu)"},
	{"threads", 0, "N", "CPU threads (default: all cores)"},
	{"dense-as-sparse", 0, NULL, "use InfLLM-v2 sparse attention at every length"},
	{"no-verify", 0, NULL, "run without checking the directory's signed manifest (says so)"},
	{"pubkey", 0, "FILE", "trust this minisign public key instead of the pinned one"},
	{0},
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double gemm_gflops(int M, int N, int K, int threads, const float *x, const uint16_t *w, float *y)
{
	sfw_ops_cpu_set_threads(threads);
	sfw_op_matmul_cpu(y, x, w, SFW_OP_BF16, M, N, K); /* warm-up */
	int reps = 0;
	double t0 = now_s(), t;
	do {
		sfw_op_matmul_cpu(y, x, w, SFW_OP_BF16, M, N, K);
		reps++;
	} while ((t = now_s() - t0) < 0.5);
	return 2.0 * M * N * K * reps / t / 1e9;
}

static int bench_gemm(const char *C, const char *shape, int threads)
{
	int M, N, K;
	if (sscanf(shape, "%dx%dx%d", &M, &N, &K) != 3 || M < 1 || N < 1 || K < 1 || M > 65536 || N > 262144 ||
	    K > 65536)
		return cli_usage_error(C, "--gemm wants MxNxK, e.g. 256x4096x4096");
	float *x = sfw_malloc((size_t)M * K * sizeof(float)), *y = sfw_malloc((size_t)M * N * sizeof(float));
	uint16_t *w = sfw_malloc((size_t)N * K * sizeof(uint16_t));
	if (!x || !y || !w) {
		sfw_free(x), sfw_free(y), sfw_free(w);
		return cli_report(SFW_E_NOMEM, NULL);
	}
	for (size_t i = 0; i < (size_t)M * K; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	for (size_t i = 0; i < (size_t)N * K; i++)
		w[i] = (uint16_t)(0x3c00 + (i * 40503u) % 512); /* bf16 values around 0.01 */
	int nt = threads > 0 ? threads : sfw_default_threads();
	double all = gemm_gflops(M, N, K, nt, x, w, y), one = gemm_gflops(M, N, K, 1, x, w, y);
	printf("gemm %dx%dx%d bf16 weights: %.1f GFLOP/s with %d threads, %.1f GFLOP/s with 1 thread (x%.2f)\n", M,
	       N, K, all, nt, one, all / one);
	sfw_free(x), sfw_free(y), sfw_free(w);
	return SFW_EXIT_OK;
}

int cmd_bench(int argc, char **argv)
{
	const char *C = "salafw bench";
	const char *device = NULL, *pubkey = NULL, *gemm = NULL;
	unsigned long long n_prompt = 512, n_gen = 64, threads = 0;
	int no_verify = 0, das = 0;
	struct cli_parser cp;
	const char *arg;
	int k;
	cli_init(&cp, C, argc, argv, opts);
	while ((k = cli_next(&cp, &arg)) != CLI_DONE) {
		if (k == CLI_HELP) {
			cli_usage(stdout, C, "MODEL_DIR [--prompt N] [--gen M]", opts);
			return SFW_EXIT_OK;
		}
		if (k == CLI_ERROR)
			return SFW_EXIT_USAGE;
		const char *nm = opts[k].name;
		if (!strcmp(nm, "prompt")) {
			if (!cli_parse_u64(C, "--prompt", arg, &n_prompt) || n_prompt < 1 || n_prompt > (1u << 24))
				return SFW_EXIT_USAGE;
		} else if (!strcmp(nm, "gen")) {
			if (!cli_parse_u64(C, "--gen", arg, &n_gen) || n_gen > (1u << 24))
				return SFW_EXIT_USAGE;
		} else if (!strcmp(nm, "gemm"))
			gemm = arg;
		else if (!strcmp(nm, "device"))
			device = arg;
		else if (!strcmp(nm, "threads")) {
			if (!cli_parse_u64(C, "--threads", arg, &threads) || threads > 256)
				return SFW_EXIT_USAGE;
		} else if (!strcmp(nm, "dense-as-sparse"))
			das = 1;
		else if (!strcmp(nm, "no-verify"))
			no_verify = 1;
		else if (!strcmp(nm, "pubkey"))
			pubkey = arg;
	}
	if (gemm)
		return cp.npos ? cli_usage_error(C, "--gemm takes no MODEL_DIR") : bench_gemm(C, gemm, (int)threads);
	if (cp.npos != 1)
		return cli_usage_error(C, "expected one MODEL_DIR");
	struct sfw_model_params mp = sfw_model_default_params();
	mp.threads = (int)threads;
	if (device) {
		if (!strcmp(device, "cpu"))
			mp.device = SFW_DEVICE_CPU;
		else if (!strcmp(device, "cuda"))
			mp.device = SFW_DEVICE_CUDA;
		else
			return cli_usage_error(C, "--device must be cpu or cuda");
	}
	int rc = cli_model_gate(C, cp.pos[0], no_verify, 0, pubkey);
	if (rc)
		return rc;
	struct sfw_err err = {0};
	enum sfw_status s;
	struct sfw_model *m = NULL;
	struct sfw_ctx *ctx = NULL;
	int32_t *ids = NULL;
	float *logits = NULL;
	if ((s = sfw_model_load(cp.pos[0], &mp, &m, &err)) != SFW_OK)
		goto done;
	const struct sfw_config *cf = sfw_model_config(m);
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = (int64_t)(n_prompt + n_gen);
	xp.dense_as_sparse = das;
	ids = sfw_malloc((size_t)n_prompt * sizeof(int32_t));
	logits = sfw_malloc((size_t)cf->vocab_size * sizeof(float));
	if (!ids || !logits) {
		s = sfw_fail(&err, SFW_E_NOMEM, "out of memory");
		goto done;
	}
	/* A fixed LCG: the speed does not depend on the ids, only reproducibility matters. */
	uint32_t x = 12345;
	ids[0] = cf->bos_token_id;
	for (size_t i = 1; i < n_prompt; i++) {
		x = x * 1664525u + 1013904223u;
		ids[i] = (int32_t)(3 + (x >> 8) % (uint32_t)(cf->vocab_size - 3));
	}
	if ((s = sfw_ctx_new(m, &xp, &ctx, &err)) != SFW_OK)
		goto done;
	double t0 = now_s();
	if ((s = sfw_ctx_prefill(ctx, ids, n_prompt, logits, &err)) != SFW_OK)
		goto done;
	double t1 = now_s();
	for (unsigned long long i = 0; i < n_gen; i++) {
		int32_t best = 0;
		for (int v = 1; v < cf->vocab_size; v++)
			if (logits[v] > logits[best])
				best = v;
		if ((s = sfw_ctx_decode(ctx, best, logits, &err)) != SFW_OK)
			goto done;
	}
	double t2 = now_s();
	printf("device %s, %d layers, hidden %d, prompt %llu, gen %llu\n", sfw_model_device_name(m),
	       cf->num_hidden_layers, cf->hidden_size, n_prompt, n_gen);
	printf("prefill: %.1f tok/s (%.3f s)\n", (double)n_prompt / (t1 - t0), t1 - t0);
	if (n_gen)
		printf("decode: %.1f tok/s (%.3f s)\n", (double)n_gen / (t2 - t1), t2 - t1);
done:
	sfw_free(ids);
	sfw_free(logits);
	sfw_ctx_free(ctx);
	sfw_model_free(m);
	return s == SFW_OK ? SFW_EXIT_OK : cli_report(s, &err);
}
