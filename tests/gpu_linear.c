/* modules: kernels core */
/* GPU linear layers against a float64 CPU reference (mathematics), and the
 * two ceilings of this device: copy bandwidth and cuBLASLt bf16 GEMM rate.
 * Then the decode GEMV on the real model's shapes, each variant timed with
 * rotating weight copies (several times the L2), as a fraction of the copy
 * ceiling, and the prefill GEMMs as a fraction of the GEMM ceiling.
 * GPU_LINEAR_QUICK=1 skips the timing tables. */
#include "check.h"
#include "lib/rng.h"

#include "kernels/ops_cuda.h"
#include "runner/safetensors.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x1234567;
static float urand(void)
{
	return sfwt_urand(&rng_state);
}

static void rand_bf16(uint16_t *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = sfw_f32_to_bf16(urand() * scale);
}

/* Compares Y (bf16, M×N with stride ldy) on the rows in [0,N) step `step`
 * with a float64 reference; returns 1 when within tolerance. bf16 output
 * rounding alone gives relative error ≤ 2^-9; accumulation order adds far less. */
static int compare(const char *what, const uint16_t *X, int ldx, const uint16_t *W, const uint16_t *Y, int ldy,
		   int M, int N, int K, int step)
{
	double num = 0, den = 0, maxd = 0, maxr = 0;
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n += step) {
			double r = 0;
			for (int k = 0; k < K; k++)
				r += (double)sfw_bf16_to_f32(W[(size_t)n * K + k]) *
				     (double)sfw_bf16_to_f32(X[(size_t)m * ldx + k]);
			double y = sfw_bf16_to_f32(Y[(size_t)m * ldy + n]);
			double d = fabs(y - r);
			num += d * d, den += r * r;
			if (d > maxd)
				maxd = d;
			if (fabs(r) > maxr)
				maxr = fabs(r);
			if (!(d <= fabs(r) * (1.0 / 256) + 1e-4 * sqrt((double)K) * 0.01)) {
				CHECK(0, "%s: y[%d,%d] = %g, reference %g", what, m, n, y, r);
				return 0;
			}
		}
	double nmse = den > 0 ? num / den : num;
	printf("%-44s NMSE %.2e  max|diff| %.2e  (max|ref| %.2e)\n", what, nmse, maxd, maxr);
	CHECK(nmse < 1e-5, "%s: NMSE %.3e", what, nmse);
	return 1;
}

static void correctness(struct sfw_cuda_blas *blas, void *s)
{
	struct {
		int M, N, K, ldx, ldy, path; /* path 0 linear, 1 gemv, 2 gemm */
	} cases[] = {
		{1, 4096, 4096, 4096, 4096, 0},   {1, 100, 264, 264, 100, 1}, {3, 1000, 640, 640, 1000, 1},
		{5, 999, 256, 256, 1000, 1},      {8, 333, 512, 520, 340, 1}, {1, 77, 30, 30, 77, 1},
		{2, 50, 33, 40, 64, 1},           {77, 264, 320, 320, 264, 0}, {64, 1024, 256, 256, 1024, 2},
		{1500, 640, 256, 256, 640, 0},    {9, 130, 136, 144, 136, 0}, {4, 640, 256, 256, 1920, 2},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int M = cases[c].M, N = cases[c].N, K = cases[c].K, ldx = cases[c].ldx, ldy = cases[c].ldy;
		size_t nx = (size_t)M * ldx, nw = (size_t)N * K, ny = (size_t)M * ldy;
		uint16_t *X = malloc(nx * 2), *W = malloc(nw * 2), *Y = malloc(ny * 2);
		rand_bf16(X, nx, 1.0f);
		rand_bf16(W, nw, 0.05f);
		void *dx, *dw, *dy;
		struct sfw_err e = {0};
		CHECK(sfw_cuda_malloc(&dx, nx * 2, "x", &e) == SFW_OK, "%s", e.msg);
		CHECK(sfw_cuda_malloc(&dw, nw * 2, "w", &e) == SFW_OK, "%s", e.msg);
		CHECK(sfw_cuda_malloc(&dy, ny * 2, "y", &e) == SFW_OK, "%s", e.msg);
		sfw_cuda_h2d(dx, X, nx * 2, s);
		sfw_cuda_h2d(dw, W, nw * 2, s);
		sfw_cuda_memset(dy, 0xff, ny * 2, s); /* poison: NaN bf16 everywhere */
		if (cases[c].path == 1)
			sfw_cuda_gemv(dx, ldx, dw, dy, ldy, M, N, K, s);
		else if (cases[c].path == 2)
			sfw_cuda_gemm(blas, dx, ldx, dw, dy, ldy, M, N, K, s);
		else
			sfw_cuda_linear(blas, dx, ldx, dw, dy, ldy, M, N, K, s);
		sfw_cuda_d2h(Y, dy, ny * 2, s);
		sfw_cuda_sync(s);
		char name[96];
		snprintf(name, sizeof(name), "%s M=%d N=%d K=%d ldx=%d ldy=%d",
			 cases[c].path == 1 ? "gemv" : cases[c].path == 2 ? "gemm" : "linear", M, N, K, ldx, ldy);
		compare(name, X, ldx, W, Y, ldy, M, N, K, 1);
		/* columns outside N in a strided Y stay poisoned (nothing wrote them) */
		int untouched = 1;
		for (int m = 0; m < M; m++)
			for (int n = N; n < ldy; n++)
				if (Y[(size_t)m * ldy + n] != 0xffff)
					untouched = 0;
		CHECK(untouched, "%s wrote outside its columns", name);
		sfw_cuda_free(dx), sfw_cuda_free(dw), sfw_cuda_free(dy);
		free(X), free(W), free(Y);
	}
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median ms of `reps` launches of one GEMV variant over rotating copies. */
static float time_gemv(uint16_t **w, int ncopies, const uint16_t *x, uint16_t *y, int M, int N, int K, int R, int U,
		       void *s, void *e0, void *e1)
{
	float t[40];
	int reps = 40;
	for (int i = 0; i < 3; i++)
		sfw_cuda_gemv_variant(x, K, w[i % ncopies], y, N, M, N, K, R, U, s);
	for (int i = 0; i < reps; i++) {
		sfw_cuda_event_record(e0, s);
		sfw_cuda_gemv_variant(x, K, w[i % ncopies], y, N, M, N, K, R, U, s);
		sfw_cuda_event_record(e1, s);
		t[i] = sfw_cuda_event_ms(e0, e1);
	}
	qsort(t, reps, sizeof(float), cmp_float);
	return t[reps / 2];
}

static void bench_gemv(double copy_gbps, void *s)
{
	static const struct {
		int N, K;
		const char *what;
	} shapes[] = {
		{4096, 4096, "o_proj / z / o_gate / sparse q"},
		{4608, 4096, "sparse q|k|v merged"},
		{12288, 4096, "lightning q|k|v merged"},
		{16384, 4096, "gate (or up) alone"},
		{32768, 4096, "gate|up merged"},
		{4096, 16384, "down_proj"},
		{73448, 4096, "lm_head"},
	};
	static const int variants[][2] = {{1, 2}, {1, 4}, {1, 8}, {2, 2}, {2, 4}, {2, 8}, {4, 2}, {4, 4}, {0, 0}};
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	printf("\nGEMV bf16, M=1: GB/s of weight bytes (ratio to the measured copy ceiling %.0f GB/s)\n", copy_gbps);
	printf("%-8s %-6s %-32s", "N", "K", "what");
	for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++)
		printf(v + 1 < sizeof(variants) / sizeof(variants[0]) ? "  R%dU%d " : " default", variants[v][0],
		       variants[v][1]);
	printf("\n");
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int N = shapes[i].N, K = shapes[i].K;
		size_t bytes = (size_t)N * K * 2;
		int ncopies = (int)((600u << 20) / bytes) + 1; /* ≥ 600 MB rotating: 10× the L2 */
		if (ncopies > 32)
			ncopies = 32;
		uint16_t *w[32];
		void *x, *y;
		struct sfw_err e = {0};
		int ok = 1;
		for (int c = 0; c < ncopies; c++) {
			ok &= sfw_cuda_malloc((void **)&w[c], bytes, "w", &e) == SFW_OK;
			sfw_cuda_fill_bf16(w[c], (size_t)N * K, 100 + c, 0.05f, s);
		}
		ok &= sfw_cuda_malloc(&x, (size_t)K * 2 * 8, "x", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&y, (size_t)N * 2 * 8, "y", &e) == SFW_OK;
		CHECK(ok, "bench allocations: %s", e.msg);
		sfw_cuda_fill_bf16(x, (size_t)K * 8, 99, 1.0f, s);
		printf("%-8d %-6d %-32s", N, K, shapes[i].what);
		double best = 0;
		for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
			float ms = time_gemv(w, ncopies, x, y, 1, N, K, variants[v][0], variants[v][1], s, e0, e1);
			double gbps = bytes / (ms * 1e-3) / 1e9;
			if (gbps > best)
				best = gbps;
			printf(" %5.0f/%.2f", gbps, gbps / copy_gbps);
		}
		/* M = 4 with the default variant: the weights are read once for 4 rows */
		float ms4 = time_gemv(w, ncopies, x, y, 4, N, K, 0, 0, s, e0, e1);
		printf("  | M=4 %.0f GB/s\n", bytes / (ms4 * 1e-3) / 1e9);
		/* the timed matrix, checked on sampled rows */
		uint16_t *hw = malloc(bytes), *hx = malloc((size_t)K * 2), *hy = malloc((size_t)N * 2);
		sfw_cuda_gemv(x, K, w[0], y, N, 1, N, K, s);
		sfw_cuda_d2h(hw, w[0], bytes, s);
		sfw_cuda_d2h(hx, x, (size_t)K * 2, s);
		sfw_cuda_d2h(hy, y, (size_t)N * 2, s);
		sfw_cuda_sync(s);
		char name[64];
		snprintf(name, sizeof(name), "gemv timed matrix %dx%d (sampled rows)", N, K);
		compare(name, hx, K, hw, hy, N, 1, N, K, 61);
		free(hw), free(hx), free(hy);
		for (int c = 0; c < ncopies; c++)
			sfw_cuda_free(w[c]);
		sfw_cuda_free(x), sfw_cuda_free(y);
	}
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
}

static void bench_gemm(struct sfw_cuda_blas *blas, double gemm_tflops, void *s)
{
	static const struct {
		int N, K;
		const char *what;
	} shapes[] = {
		{4096, 4096, "o_proj / z / o_gate"},
		{4608, 4096, "sparse q|k|v"},
		{12288, 4096, "lightning q|k|v"},
		{32768, 4096, "gate|up"},
		{4096, 16384, "down_proj"},
	};
	int M = 8192;
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	printf("\nGEMM bf16 (cuBLASLt), M=%d: TFLOP/s (ratio to the measured GEMM ceiling %.0f)\n", M, gemm_tflops);
	double tot_ms = 0, tot_flop = 0;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int N = shapes[i].N, K = shapes[i].K;
		void *x, *w, *y;
		struct sfw_err e = {0};
		int ok = sfw_cuda_malloc(&x, (size_t)M * K * 2, "x", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&w, (size_t)N * K * 2, "w", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&y, (size_t)M * N * 2, "y", &e) == SFW_OK;
		CHECK(ok, "gemm bench allocations: %s", e.msg);
		sfw_cuda_fill_bf16(x, (size_t)M * K, 5, 1.0f, s);
		sfw_cuda_fill_bf16(w, (size_t)N * K, 6, 0.05f, s);
		float t[15];
		for (int r = 0; r < 3; r++)
			sfw_cuda_gemm(blas, x, K, w, y, N, M, N, K, s);
		for (int r = 0; r < 15; r++) {
			sfw_cuda_event_record(e0, s);
			sfw_cuda_gemm(blas, x, K, w, y, N, M, N, K, s);
			sfw_cuda_event_record(e1, s);
			t[r] = sfw_cuda_event_ms(e0, e1);
		}
		qsort(t, 15, sizeof(float), cmp_float);
		double fl = 2.0 * M * N * K, tf = fl / (t[7] * 1e-3) / 1e12;
		printf("  %6d x %-6d %-22s %7.3f ms %6.0f TFLOP/s  %.2f\n", N, K, shapes[i].what, t[7], tf,
		       tf / gemm_tflops);
		/* per layer: lightning has qkv + o + z; sparse q|k|v + o + o_gate */
		sfw_cuda_free(x), sfw_cuda_free(w), sfw_cuda_free(y);
		(void)tot_ms, (void)tot_flop;
	}
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
}

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_linear");
	}
	printf("device: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), L2 %d MiB\n", info.name, info.cc_major,
	       info.cc_minor, info.sm_count, info.total_mem / 1073741824.0, info.free_mem / 1073741824.0,
	       info.l2_bytes >> 20);
	void *s;
	CHECK(sfw_cuda_stream_new(&s, &err) == SFW_OK, "%s", err.msg);
	struct sfw_cuda_blas *blas;
	CHECK(sfw_cuda_blas_new(&blas, 32u << 20, &err) == SFW_OK, "%s", err.msg);
	correctness(blas, s);
	if (!getenv("GPU_LINEAR_QUICK")) {
		double copy = 0, gemm = 0;
		CHECK(sfw_cuda_measure_copy((size_t)2 << 30, &copy, &err) == SFW_OK, "%s", err.msg);
		CHECK(sfw_cuda_measure_gemm(8192, &gemm, &err) == SFW_OK, "%s", err.msg);
		printf("LIMIT copy %.0f GB/s (2 GiB device-to-device, read+write)\n", copy);
		printf("LIMIT gemm %.0f TFLOP/s (cuBLASLt bf16 8192^3, random data)\n", gemm);
		CHECK(copy > 100 && gemm > 10, "ceilings look wrong: %.0f GB/s, %.0f TFLOP/s", copy, gemm);
		bench_gemv(copy, s);
		bench_gemm(blas, gemm, s);
	}
	size_t live, peak, used;
	sfw_cuda_mem_stats(&live, &peak, &used);
	CHECK(live == 32u << 20, "device bytes still allocated: %zu (expected the 32 MiB workspace)", live);
	sfw_cuda_blas_free(blas);
	sfw_cuda_stream_free(s);
	return CHECK_REPORT("gpu_linear");
}
