/* bench_w8.c - the CPU int8 (W8A16) matmul, sfw_op_matmul_w8_cpu, at
 * decode and prefill shapes:
 *   bench_w8 [--threads N] [--shapes MxNxK,...] [--group G] [--time S]
 * Default shapes: the small preset's MLP (gate|up 2816 x 1024, down 1024 x
 * 2816) at M = 1, 4, 64, 256; group 128, bf16 scales; all threads. The
 * weights rotate over enough copies (>= 96 MiB of codes) that each call
 * reads them from memory, as a model's decode does, not from the cache.
 * Prints per shape the median time per call of 5 timed rounds (each at least
 * S/5 seconds, default S = 1) and GFLOP/s and code GB/s. Informational; for
 * a before/after ratio build this file against another tree's libraries and
 * run the two in turn: bench/bench_w8_ab.sh. */
#include "kernels/ops.h"
#include "alloc.h"
#include "num/w8_layout.h"
#include "sfw.h"
#include "thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int bench_shape(struct sfw_ops_cpu *ex, int M, int N, int K, int group, double secs)
{
	int span = group > 0 && group < K ? group : K;
	size_t rb = (size_t)sfw_ql_row_bytes(K), G = (size_t)sfw_ql_ngroups(K, span < K ? span : 0);
	size_t wbytes = (size_t)N * rb, ncopy = ((size_t)96 << 20) / wbytes + 1;
	uint8_t *codes = sfw_malloc(ncopy * wbytes);
	uint16_t *sc = sfw_malloc(ncopy * (size_t)N * G * sizeof(uint16_t));
	float *x = sfw_malloc((size_t)M * K * sizeof(float)), *y = sfw_malloc((size_t)M * N * sizeof(float));
	if (!codes || !sc || !x || !y) {
		fprintf(stderr, "bench_w8: out of memory at %dx%dx%d\n", M, N, K);
		sfw_free(codes), sfw_free(sc), sfw_free(x), sfw_free(y);
		return 1;
	}
	for (size_t i = 0; i < ncopy * wbytes; i++)
		codes[i] = (uint8_t)((i * 2654435761u) >> 13);
	for (size_t i = 0; i < ncopy * (size_t)N * G; i++)
		sc[i] = (uint16_t)(0x3a00 + (i * 40503u) % 256); /* bf16 around 5e-4 */
	for (size_t i = 0; i < (size_t)M * K; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	size_t c = 0;
	struct sfw_gemm_shape sh = {M, N, K, 0, 0};
	struct sfw_w8 w8 = {NULL, NULL, SFW_DTYPE_BF16, span};
#define CALL()                                                                                               \
	(w8.codes = codes + c * wbytes, w8.scales = sc + c * (size_t)N * G,                                  \
	 sfw_op_matmul_w8_cpu(ex, y, x, &w8, &sh), c = (c + 1) % ncopy)
	for (size_t i = 0; i < ncopy; i++)
		CALL(); /* warm-up: page in every copy */
	double t[5];
	for (int r = 0; r < 5; r++) {
		int reps = 0;
		double t0 = sfw_now_s(), dt;
		do {
			CALL();
			reps++;
		} while ((dt = sfw_now_s() - t0) < secs / 5);
		t[r] = dt / reps;
	}
#undef CALL
	qsort(t, 5, sizeof(double), cmp_d);
	double med = t[2];
	printf("w8 %dx%dx%d group %d: %.3f ms/call (%.3f-%.3f), %.1f GFLOP/s, %.2f GB/s of codes\n", M, N, K,
	       span, med * 1e3, t[0] * 1e3, t[4] * 1e3, 2.0 * M * N * K / med / 1e9,
	       (double)wbytes / med / 1e9);
	sfw_free(codes), sfw_free(sc), sfw_free(x), sfw_free(y);
	return 0;
}

int main(int argc, char **argv)
{
	int threads = 0, group = 128;
	double secs = 1;
	const char *shapes = "1x2816x1024,1x1024x2816,4x2816x1024,64x2816x1024,256x2816x1024";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
			shapes = argv[++i];
		else if (!strcmp(argv[i], "--group") && i + 1 < argc)
			group = !strcmp(argv[++i], "channel") ? 0 : atoi(argv[i]);
		else if (!strcmp(argv[i], "--time") && i + 1 < argc)
			secs = atof(argv[++i]);
		else {
			fprintf(stderr, "usage: bench_w8 [--threads N] [--shapes MxNxK,...] [--group "
					"G|channel] [--time S]\n");
			return 2;
		}
	}
	if (threads <= 0)
		threads = sfw_default_threads();
	struct sfw_ops_cpu *ex = NULL;
	struct sfw_err err = {0};
	if (sfw_ops_cpu_new(threads, &ex, &err) != SFW_OK) {
		fprintf(stderr, "bench_w8: %s\n", err.msg);
		return 1;
	}
	printf("== bench_w8: %d threads\n", threads);
	int rc = 0;
	for (const char *p = shapes; *p;) {
		int M, N, K, len = 0;
		if (sscanf(p, "%dx%dx%d%n", &M, &N, &K, &len) != 3 || M < 1 || N < 1 || K < 1 || M > 4096 ||
		    N > 65536 || K > 65536) {
			fprintf(stderr, "bench_w8: bad shape at '%.20s' (MxNxK)\n", p);
			rc = 2;
			break;
		}
		rc |= bench_shape(ex, M, N, K, group, secs);
		p += len;
		if (*p == ',')
			p++;
	}
	sfw_ops_cpu_free(ex);
	return rc;
}
