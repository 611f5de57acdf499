/* bench_gemm.c - the bf16 linear layers of a decode step at batch sizes
 * M = 1 .. 64, every kernel the engine could run them with, against the copy
 * ceiling measured in the same process:
 *   bench_gemm [--m 1,2,4,8,16,32,64]
 * Shapes: MiniCPM-SALA's (hidden 4096, MLP 16384, vocab 73448): the merged
 * q|k|v|o_gate of a sparse layer (8704 x 4096), q|k|v|z of a lightning layer
 * (16384 x 4096), o_proj (4096 x 4096), gate|up (32768 x 4096), down (4096 x
 * 16384) and lm_head (73448 x 4096, float32 out). For each: the GEMV
 * (M <= 8, sfw_cuda_gemv / the logits GEMV) and cuBLASLt's heuristic answers
 * 0..7 (answer 0 is what sfw_cuda_gemm runs), each the median of 20 timed
 * calls on random data; GB/s counts the weight, input and output bytes.
 *   bench_gemm --m 4096,8192: a prefill chunk's rows (M 65 .. 16384):
 * the shapes prefill runs, one projection at a time (q, o_gate and a
 * lightning part 4096 x 4096, k and v 256 x 4096, gate and up 16384 x 4096,
 * down), the answers in TFLOP/s against the bf16 GEMM ceiling measured now.
 * Built in every build; without CUDA=1 it says so and exits 0. */
#include "sfw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SFW_HAVE_CUDA
int main(void)
{
	printf("bench_gemm: built without CUDA (make CUDA=1); nothing to measure\n");
	return 0;
}
#else
#include "kernels/ops_cuda.h"

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

enum kind { K_GEMV, K_RANK };

/* Median ms of 20 calls (after 3 warm-ups); -1 when the kernel does not exist. */
static float time_one(struct sfw_cuda_blas *b, enum kind k, int rank, const uint16_t *X, const uint16_t *W, void *Y,
		      int M, int N, int K, int f32, void *s, void *e0, void *e1)
{
	float t[20];
	for (int i = -3; i < 20; i++) {
		sfw_cuda_event_record(e0, s);
		if (k == K_GEMV) {
			if (f32)
				sfw_cuda_linear_f32out(b, X, W, Y, &(struct sfw_gemm_shape){M, N, K, K, N},
						       1.0f, s);
			else
				sfw_cuda_gemv(X, W, Y, &(struct sfw_gemm_shape){M, N, K, K, N}, s);
		} else if (!sfw_cuda_gemm_rank(b, X, W, Y, &(struct sfw_gemm_shape){M, N, K, K, N}, f32, rank,
					       s)) {
			return -1;
		}
		sfw_cuda_event_record(e1, s);
		float ms = sfw_cuda_event_ms(e0, e1);
		if (i >= 0)
			t[i] = ms;
	}
	qsort(t, 20, sizeof(t[0]), cmp_f);
	return t[10];
}

int main(int argc, char **argv)
{
	const char *ms = "1,2,4,8,16,32,64";
	for (int i = 1; i + 1 < argc; i += 2)
		if (!strcmp(argv[i], "--m"))
			ms = argv[i + 1];
	/* the rows asked for, checked before the device starts; the largest
	 * decides the shapes and the buffers */
	long mlist[32], mmax = 0;
	int nm = 0;
	for (const char *p = ms; *p;) {
		char *e;
		long M = strtol(p, &e, 10);
		if (e == p || M < 1 || M > 16384 || nm == 32) {
			fprintf(stderr, "bench_gemm: --m: '%s' is not a list of at most 32 row counts 1..16384\n", ms);
			return 2;
		}
		mlist[nm++] = M;
		mmax = M > mmax ? M : mmax;
		p = *e == ',' ? e + 1 : e;
	}
	struct sfw_err err = {0};
	struct sfw_cuda_info info;
	double copy = 0;
	struct sfw_cuda_blas *b = NULL;
	void *s = NULL;
	if (sfw_cuda_init(0, &info, &err) != SFW_OK || sfw_cuda_measure_copy((size_t)1 << 30, &copy, &err) != SFW_OK ||
	    sfw_cuda_blas_new(&b, (size_t)32 << 20, &err) != SFW_OK || sfw_cuda_stream_new(&s, &err) != SFW_OK) {
		fprintf(stderr, "bench_gemm: %s\n", err.msg);
		return 1;
	}
	int prefill = mmax > 64;
	double gemm = 0;
	if (prefill && sfw_cuda_measure_gemm(8192, &gemm, &err) != SFW_OK) {
		fprintf(stderr, "bench_gemm: %s\n", err.msg);
		return 1;
	}
	printf("device %s; LIMIT copy %.0f GB/s", info.name, copy);
	if (prefill)
		printf(", LIMIT gemm %.0f TFLOP/s", gemm);
	printf(" (measured now)\n");
	static const struct shape {
		const char *name;
		int N, K, f32;
	} dshapes[] = {{"sparse q|k|v|o_gate", 8704, 4096, 0}, {"lightning q|k|v|z", 16384, 4096, 0},
		       {"o_proj", 4096, 4096, 0},		  {"gate|up", 32768, 4096, 0},
		       {"down", 4096, 16384, 0},		  {"lm_head (f32 out)", 73448, 4096, 1}},
	  pshapes[] = {{"q|o_gate|o|lightning", 4096, 4096, 0}, {"k|v (2 KV heads)", 256, 4096, 0},
		       {"gate|up, each", 16384, 4096, 0},	  {"down", 4096, 16384, 0}};
	const struct shape *shapes = prefill ? pshapes : dshapes;
	size_t nshapes = prefill ? sizeof(pshapes) / sizeof(pshapes[0]) : sizeof(dshapes) / sizeof(dshapes[0]);
	size_t wmax = (size_t)73448 * 4096, xmax = (size_t)(mmax > 64 ? mmax : 64) * 16384,
	       ymax = prefill ? (size_t)mmax * 16384 * 2 : (size_t)64 * 73448 * 4;
	uint16_t *W, *X;
	void *Y;
	if (sfw_cuda_malloc((void **)&W, wmax * 2, "bench", &err) != SFW_OK ||
	    sfw_cuda_malloc((void **)&X, xmax * 2, "bench", &err) != SFW_OK ||
	    sfw_cuda_malloc(&Y, ymax, "bench", &err) != SFW_OK) {
		fprintf(stderr, "bench_gemm: %s\n", err.msg);
		return 1;
	}
	sfw_cuda_fill_bf16(W, wmax, 1, 0.05f, s);
	sfw_cuda_fill_bf16(X, xmax, 2, 1.0f, s);
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	for (size_t si = 0; si < nshapes; si++) {
		int N = shapes[si].N, K = shapes[si].K, f32 = shapes[si].f32;
		for (int mi = 0; mi < nm; mi++) {
			long M = mlist[mi];
			if (prefill != (M > 64)) /* a list takes decode rows or prefill rows */
				continue;
			double bytes = (double)N * K * 2 + (double)M * K * 2 + (double)M * N * (f32 ? 4 : 2);
			printf("GEMM %-20s M=%-2ld N=%-5d K=%-5d", shapes[si].name, M, N, K);
			fflush(stdout);
			float best = 1e30f, lt0 = 1e30f;
			int br = -1; /* -1: the GEMV, else the cuBLASLt answer */
			if (M <= SFW_CUDA_GEMV_MAX_M) {
				best = time_one(b, K_GEMV, 0, X, W, Y, (int)M, N, K, f32, s, e0, e1);
				printf("  gemv %7.1f us", best * 1e3);
			}
			for (int r = 0; r < 8; r++) {
				float t = time_one(b, K_RANK, r, X, W, Y, (int)M, N, K, f32, s, e0, e1);
				if (t < 0)
					break;
				printf("  lt%d %7.1f", r, t * 1e3);
				if (r == 0)
					lt0 = t;
				if (t < best)
					best = t, br = r;
			}
			char bn[8] = "gemv";
			if (br >= 0)
				snprintf(bn, sizeof(bn), "lt%d", br);
			if (prefill) {
				double tf = 2.0 * (double)M * N * K / (best * 1e-3) / 1e12;
				printf("  | best %s %.1f us, %.0f TFLOP/s, %.2f of gemm (lt0 %.2f)\n", bn, best * 1e3, tf,
				       tf / gemm, 2.0 * (double)M * N * K / (lt0 * 1e-3) / 1e12 / gemm);
			} else {
				printf("  | best %s %.1f us, %.0f GB/s, %.2f of copy\n", bn, best * 1e3,
				       bytes / (best * 1e-3) / 1e9, bytes / (best * 1e-3) / 1e9 / copy);
			}
		}
	}
	sfw_cuda_event_free(e0);
	sfw_cuda_event_free(e1);
	sfw_cuda_free(W), sfw_cuda_free(X), sfw_cuda_free(Y);
	sfw_cuda_blas_free(b);
	sfw_cuda_stream_free(s);
	return 0;
}
#endif
