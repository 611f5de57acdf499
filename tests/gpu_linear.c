/* modules: kernels num core */
/* GPU linear layers against a float64 CPU reference (mathematics), and the
 * two ceilings of this device: copy bandwidth and cuBLASLt bf16 GEMM rate.
 * Then the decode GEMV on the real model's shapes, each variant timed with
 * rotating weight copies (several times the L2), as a fraction of the copy
 * ceiling, and the prefill GEMMs as a fraction of the GEMM ceiling.
 * GPU_LINEAR_QUICK=1 skips the timing tables. */
#include "check.h"
#include "lib/rng.h"

#include "kernels/ops_cuda.h"
#include "num/num.h"

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
		{2, 640, 256, 256, 640, 0},       {4, 640, 256, 256, 640, 0}, /* either side of SFW_CUDA_GEMV_AUTO_M */
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
			sfw_cuda_gemv(dx, dw, dy, &(struct sfw_gemm_shape){M, N, K, ldx, ldy}, s);
		else if (cases[c].path == 2)
			sfw_cuda_gemm(blas, dx, dw, dy, &(struct sfw_gemm_shape){M, N, K, ldx, ldy}, s);
		else
			sfw_cuda_linear(blas, dx, dw, dy, &(struct sfw_gemm_shape){M, N, K, ldx, ldy}, s);
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
		sfw_cuda_gemv_variant(x, w[i % ncopies], y, &(struct sfw_gemm_shape){M, N, K, K, N}, R, U, s);
	for (int i = 0; i < reps; i++) {
		sfw_cuda_event_record(e0, s);
		sfw_cuda_gemv_variant(x, w[i % ncopies], y, &(struct sfw_gemm_shape){M, N, K, K, N}, R, U, s);
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
		sfw_cuda_gemv(x, w[0], y, &(struct sfw_gemm_shape){1, N, K, K, N}, s);
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
			sfw_cuda_gemm(blas, x, w, y, &(struct sfw_gemm_shape){M, N, K, K, N}, s);
		for (int r = 0; r < 15; r++) {
			sfw_cuda_event_record(e0, s);
			sfw_cuda_gemm(blas, x, w, y, &(struct sfw_gemm_shape){M, N, K, K, N}, s);
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

/* ---- int8 (W8A16): kernels/linear_w8.cu against its C twin sfw_op_matmul_w8_cpu ---- */

/* float -> IEEE half bits, round to nearest even (normal range: the test's
 * scales are normal halves). */
static uint16_t f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000u;
	int e = (int)((u >> 23) & 0xff) - 127 + 15;
	uint32_t man = u & 0x7fffffu;
	if (e <= 0 || e >= 31)
		return (uint16_t)sign; /* never reached by the test's values */
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fffu;
	if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

/* half bits (normal numbers: all the test writes) -> float */
static float f16_to_f32_normal(uint16_t h)
{
	uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | ((uint32_t)(((h >> 10) & 0x1f) + 112) << 23) |
		     ((uint32_t)(h & 0x3ffu) << 13);
	float f;
	memcpy(&f, &u, 4);
	return f;
}

struct w8_host {
	uint8_t *codes;  /* [N, rb] */
	void *scales;    /* [N, G] in sdt */
	size_t rb, G, ss, cbytes, sbytes;
};

static void w8_make(struct w8_host *h, int N, int K, int group, enum sfw_dtype sdt)
{
	int span = group > 0 ? group : K;
	h->rb = (size_t)(K + 3) / 4 * 4;
	h->G = (size_t)((K + span - 1) / span);
	h->ss = sdt == SFW_DTYPE_F32 ? 4 : 2;
	h->cbytes = (size_t)N * h->rb;
	h->sbytes = (size_t)N * h->G * h->ss;
	h->codes = calloc(h->cbytes, 1);
	h->scales = malloc(h->sbytes);
	for (int n = 0; n < N; n++)
		for (int k = 0; k < K; k++)
			h->codes[(size_t)n * h->rb + k] = (uint8_t)(sfwt_next(&rng_state) & 0xff);
	for (size_t i = 0; i < (size_t)N * h->G; i++) {
		float v = 1e-3f * (1.5f + urand()); /* (0.5, 2.5) x 1e-3, never zero */
		if (sdt == SFW_DTYPE_F32)
			((float *)h->scales)[i] = v;
		else if (sdt == SFW_DTYPE_F16)
			((uint16_t *)h->scales)[i] = f32_to_f16(v);
		else
			((uint16_t *)h->scales)[i] = sfw_f32_to_bf16(v);
	}
}

static void w8_free(struct w8_host *h)
{
	free(h->codes), free(h->scales);
}

static const char *sdt_name(enum sfw_dtype d)
{
	return d == SFW_DTYPE_F32 ? "F32" : d == SFW_DTYPE_F16 ? "F16" : "BF16";
}

/* Y (bf16 or, for logits, float) against the C twin on the same bf16 inputs:
 * per element |d| <= rel |r| + a rms(r) (rel = 1/128 unless said), NMSE < nmse_max (2e-5 for one
 * rounding of the output). a = 2e-3 for the GEMV (M <= 2: bf16 output
 * rounding only); 1.6e-2 when the weights went through bf16 (M >= 3: the
 * tensor-core GEMM up to 64 rows, the dequantize path past it; each
 * dequantized weight rounded to 8 significant bits, whose sum
 * over K has a standard deviation near 1.6e-3 rms(r), maxima seen 8.7e-3 on
 * 40,000 outputs: 1.6e-2 is ~10 of them; the NMSE bound stays tight). */
static void w8_compare_rel(const char *what, const float *ref, const void *got, int out_f32, int M, int N, int ldy,
			   double rel, double nmse_max)
{
	double a = M > 2 ? 1.6e-2 : 2e-3;
	double num = 0, den = 0, maxd = 0;
	for (size_t i = 0; i < (size_t)M * N; i++)
		den += (double)ref[i] * ref[i];
	double rms = sqrt(den / ((double)M * N)), bad = 0;
	int bm = -1, bn = 0;
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double r = ref[(size_t)m * N + n];
			double y = out_f32 ? ((const float *)got)[(size_t)m * ldy + n]
					   : sfw_bf16_to_f32(((const uint16_t *)got)[(size_t)m * ldy + n]);
			double d = fabs(y - r);
			num += d * d;
			maxd = d > maxd ? d : maxd;
			if (!(d <= fabs(r) * rel + a * rms) && bm < 0)
				bad = y, bm = m, bn = n;
		}
	double nmse = den > 0 ? num / den : num;
	printf("%-58s NMSE %.2e  max|diff| %.2e  (rms ref %.2e)\n", what, nmse, maxd, rms);
	CHECK(bm < 0, "%s: y[%d,%d] = %g, C twin %g", what, bm, bn, bad, bm < 0 ? 0.0 : ref[(size_t)bm * N + bn]);
	CHECK(nmse < nmse_max, "%s: NMSE %.3e (< %.1e)", what, nmse, nmse_max);
}

static void w8_compare(const char *what, const float *ref, const void *got, int out_f32, int M, int N, int ldy)
{
	w8_compare_rel(what, ref, got, out_f32, M, N, ldy, 1.0 / 128, 2e-5);
}

static void correctness_w8(struct sfw_cuda_ctx *cx)
{
	void *s = cx->stream;
	static const int groups[] = {32, 64, 128, 0};
	static const enum sfw_dtype sdts[] = {SFW_DTYPE_BF16, SFW_DTYPE_F16, SFW_DTYPE_F32};
	/* widths: multiples of 16 and of every group, a width that ends in a
	 * partial group (208 = 6.5 x 32), one that is not a multiple of 16 (the
	 * scalar kernel) and one not a multiple of 4 (padded code rows) */
	static const struct {
		int N, K;
	} shapes[] = {{256, 512}, {100, 208}, {77, 200}, {33, 130}, {1000, 1024}};
	static const int Ms[] = {1, 3, 8, 40};
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
		for (size_t gi = 0; gi < sizeof(groups) / sizeof(groups[0]); gi++)
			for (size_t di = 0; di < sizeof(sdts) / sizeof(sdts[0]); di++) {
				int N = shapes[si].N, K = shapes[si].K, group = groups[gi];
				enum sfw_dtype sdt = sdts[di];
				if (group > K)
					continue;
				struct w8_host h;
				w8_make(&h, N, K, group, sdt);
				int Mmax = 40;
				size_t nx = (size_t)Mmax * K;
				uint16_t *X = malloc(nx * 2);
				float *xf = malloc(nx * 4), *ref = malloc((size_t)Mmax * N * 4);
				void *Y = malloc((size_t)Mmax * N * 4);
				rand_bf16(X, nx, 1.0f);
				for (size_t i = 0; i < nx; i++)
					xf[i] = sfw_bf16_to_f32(X[i]);
				void *dx, *dc, *dsc, *dy;
				struct sfw_err e = {0};
				CHECK(sfw_cuda_malloc(&dx, nx * 2, "x", &e) == SFW_OK, "%s", e.msg);
				CHECK(sfw_cuda_malloc(&dc, h.cbytes, "codes", &e) == SFW_OK, "%s", e.msg);
				CHECK(sfw_cuda_malloc(&dsc, h.sbytes, "scales", &e) == SFW_OK, "%s", e.msg);
				CHECK(sfw_cuda_malloc(&dy, (size_t)Mmax * N * 4, "y", &e) == SFW_OK, "%s", e.msg);
				sfw_cuda_h2d(dx, X, nx * 2, s);
				sfw_cuda_h2d(dc, h.codes, h.cbytes, s);
				sfw_cuda_h2d(dsc, h.scales, h.sbytes, s);
				int span = group > 0 ? group : K;
				for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++) {
					int M = Ms[mi];
					sfw_op_matmul_w8_cpu(NULL, ref, xf,
							     &(struct sfw_w8){h.codes, h.scales, sdt, span},
							     &(struct sfw_gemm_shape){M, N, K, 0, 0});
					sfw_cuda_memset(dy, 0xff, (size_t)Mmax * N * 4, s);
					sfw_op_matmul_w8_cuda(dy, dx, &(struct sfw_w8){dc, dsc, sdt, span},
							      &(struct sfw_gemm_shape){M, N, K, 0, 0},
							      SFW_DTYPE_BF16, cx);
					sfw_cuda_d2h(Y, dy, (size_t)M * N * 2, s);
					sfw_cuda_sync(s);
					char name[128];
					snprintf(name, sizeof(name), "w8 %s M=%d N=%d K=%d group %s %s",
						 M <= 8 ? "gemv" : "gemm", M, N, K, group ? (group == 32 ? "32" : group == 64 ? "64" : "128") : "channel",
						 sdt_name(sdt));
					w8_compare(name, ref, Y, 0, M, N, N);
				}
				/* every tuning variant of the M = 1 GEMV (BF16 scales) on the same data */
				static const int var[][2] = {{1, 2},   {1, 4},   {1, 8},   {2, 2},   {2, 4},   {2, 8},
							     {4, 2},   {4, 4},   {101, 2}, {101, 4}, {102, 2}, {202, 2},
							     {202, 4}, {204, 2}, {204, 4}, {208, 2}, {208, 4}, {301, 2},
							     {301, 4}};
				for (size_t v = 0; sdt == SFW_DTYPE_BF16 && v < sizeof(var) / sizeof(var[0]); v++) {
					sfw_op_matmul_w8_cpu(NULL, ref, xf,
							     &(struct sfw_w8){h.codes, h.scales, sdt, span},
							     &(struct sfw_gemm_shape){1, N, K, 0, 0});
					sfw_cuda_memset(dy, 0xff, (size_t)N * 2, s);
					sfw_cuda_gemv_w8_variant(dx, &(struct sfw_w8){dc, dsc, sdt, span}, dy,
								 &(struct sfw_gemm_shape){1, N, K, K, N},
								 var[v][0], var[v][1], s);
					sfw_cuda_d2h(Y, dy, (size_t)N * 2, s);
					sfw_cuda_sync(s);
					char name[128];
					snprintf(name, sizeof(name), "w8 gemv variant %s%dU%d N=%d K=%d group %d",
						 var[v][0] > 300 ? "T" : var[v][0] > 200 ? "S" : var[v][0] > 100 ? "P" : "R",
						 var[v][0] % 100, var[v][1], N, K, group);
					w8_compare(name, ref, Y, 0, 1, N, N);
				}
				/* the SwiGLU epilogue over these rows as a merged gate|up [2I, K]:
				 * bit-equal to the R1U2 GEMV + sfw_op_silu_mul_cuda it replaces,
				 * near the C twin; refused (0, nothing written) where the vector
				 * kernel cannot run or the scales are not BF16 */
				if (N % 2 == 0) {
					int I = N / 2;
					int takes = sdt == SFW_DTYPE_BF16 && K % 16 == 0 && span % 16 == 0;
					uint16_t *Yf = malloc((size_t)I * 2), *Yu = malloc((size_t)I * 2);
					void *dyu;
					CHECK(sfw_cuda_malloc(&dyu, (size_t)N * 2, "y", &e) == SFW_OK, "%s", e.msg);
					sfw_cuda_memset(dy, 0xff, (size_t)I * 2, s);
					int got = sfw_op_matmul_silu_w8_cuda(
					    dy, dx, &(struct sfw_w8){dc, dsc, sdt, span}, I, K, cx);
					sfw_cuda_d2h(Yf, dy, (size_t)I * 2, s);
					sfw_cuda_sync(s);
					char name[128];
					snprintf(name, sizeof(name), "w8 gemv+silu I=%d K=%d group %s %s", I, K,
						 group ? (group == 32 ? "32" : group == 64 ? "64" : "128") : "channel", sdt_name(sdt));
					CHECK(got == takes, "%s: returned %d, expected %d", name, got, takes);
					if (got && takes) {
						sfw_cuda_gemv_w8_variant(
						    dx, &(struct sfw_w8){dc, dsc, sdt, span}, dyu,
						    &(struct sfw_gemm_shape){1, N, K, K, N}, 1, 2, s);
						sfw_op_silu_mul_cuda(dyu, dyu, (uint16_t *)dyu + I, (size_t)I, SFW_DTYPE_BF16, cx);
						sfw_cuda_d2h(Yu, dyu, (size_t)I * 2, s);
						sfw_cuda_sync(s);
						int diff = -1;
						for (int i = 0; i < I && diff < 0; i++)
							if (Yf[i] != Yu[i])
								diff = i;
						CHECK(diff < 0, "%s: y[%d] = %#x, unfused GEMV + silu_mul %#x", name, diff,
						      diff < 0 ? 0 : Yf[diff], diff < 0 ? 0 : Yu[diff]);
						/* three bf16 roundings on the GPU (gate, up, the product)
						 * against the twin's float32 composition: up to ~3/256 of
						 * |r| apart, so 1/64 here, and three times the one
						 * rounding's NMSE bound; the bits are pinned above */
						sfw_op_matmul_silu_w8_cpu(NULL, 
						    ref, xf, &(struct sfw_w8){h.codes, h.scales, sdt, span},
						    I, K);
						w8_compare_rel(name, ref, Yf, 0, 1, I, I, 1.0 / 64, 6e-5);
						/* the tensor-core form (SALAFW_CUDA_W8GEMV=tc; the default
						 * kernel where the shape does not fit it): the same bound */
						cx->w8gemv = 2;
						sfw_cuda_memset(dy, 0xff, (size_t)I * 2, s);
						got = sfw_op_matmul_silu_w8_cuda(dy, dx, &(struct sfw_w8){dc, dsc, sdt, span}, I,
										 K, cx);
						cx->w8gemv = 0;
						sfw_cuda_d2h(Yf, dy, (size_t)I * 2, s);
						sfw_cuda_sync(s);
						snprintf(name, sizeof(name), "w8 gemv+silu, w8gemv tc, I=%d K=%d group %d", I, K,
							 span);
						CHECK(got == 1, "%s: returned %d", name, got);
						w8_compare_rel(name, ref, Yf, 0, 1, I, I, 1.0 / 64, 6e-5);
					}
					sfw_cuda_free(dyu);
					free(Yf), free(Yu);
				}
				/* logits: in_scale 1/16 rides as alpha; bf16-rounded float out */
				for (int M = 1; M <= 40; M += 39) {
					float *xs = malloc((size_t)M * K * 4);
					for (size_t i = 0; i < (size_t)M * K; i++)
						xs[i] = xf[i] / 16;
					sfw_op_matmul_w8_cpu(NULL, ref, xs,
							     &(struct sfw_w8){h.codes, h.scales, sdt, span},
							     &(struct sfw_gemm_shape){M, N, K, 0, 0});
					for (size_t i = 0; i < (size_t)M * N; i++)
						ref[i] = sfw_bf16_to_f32(sfw_f32_to_bf16(ref[i]));
					sfw_op_logits_w8_cuda(dy, dx, &(struct sfw_w8){dc, dsc, sdt, span},
							      &(struct sfw_gemm_shape){M, N, K, 0, 0},
							      1.0f / 16, SFW_DTYPE_BF16, cx);
					sfw_cuda_d2h(Y, dy, (size_t)M * N * 4, s);
					sfw_cuda_sync(s);
					char name[128];
					snprintf(name, sizeof(name), "w8 logits M=%d N=%d K=%d group %d %s", M, N, K, group,
						 sdt_name(sdt));
					w8_compare(name, ref, Y, 1, M, N, N);
					free(xs);
				}
				/* the prefill dequantization, bit for bit: bf16((b - 128) * scale) */
				{
					int r0 = N > 8 ? 5 : 0, nr = N - r0;
					uint16_t *got = malloc((size_t)nr * K * 2);
					void *dw;
					CHECK(sfw_cuda_malloc(&dw, (size_t)nr * K * 2, "w", &e) == SFW_OK, "%s", e.msg);
					sfw_cuda_dequant_w8(dw, &(struct sfw_w8){dc, dsc, sdt, span}, r0, nr,
							    K, s);
					sfw_cuda_d2h(got, dw, (size_t)nr * K * 2, s);
					sfw_cuda_sync(s);
					long bad = 0;
					for (int r = 0; r < nr; r++) {
						int n = r0 + r;
						size_t g0 = (size_t)n * h.G;
						for (int k = 0; k < K; k++) {
							float sc;
							size_t gi2 = g0 + (size_t)(k / span);
							if (sdt == SFW_DTYPE_F32)
								sc = ((float *)h.scales)[gi2];
							else if (sdt == SFW_DTYPE_BF16)
								sc = sfw_bf16_to_f32(((uint16_t *)h.scales)[gi2]);
							else
								sc = f16_to_f32_normal(((uint16_t *)h.scales)[gi2]);
							float w = (float)((int)h.codes[(size_t)n * h.rb + k] - 128) * sc;
							bad += got[(size_t)r * K + k] != sfw_f32_to_bf16(w);
						}
					}
					CHECK(bad == 0, "w8 dequant N=%d K=%d group %d %s: %ld of %ld weights differ", N, K,
					      group, sdt_name(sdt), bad, (long)nr * K);
					if (bad == 0)
						printf("w8 dequant rows %d.. N=%d K=%d group %d %s: bf16 bits equal\n", r0, N, K, group,
						       sdt_name(sdt));
					sfw_cuda_free(dw);
					free(got);
				}
				sfw_cuda_free(dx), sfw_cuda_free(dc), sfw_cuda_free(dsc), sfw_cuda_free(dy);
				free(X), free(xf), free(ref), free(Y);
				w8_free(&h);
			}
}

/* Median ms per launch of `reps` back-to-back launches of one W8 GEMV
 * variant over rotating copies (as a decode step issues them), and of one
 * launch alone between two events (launch and ramp-up included). */
static void time_gemv_w8(uint8_t **c, void **sc, int ncopies, const uint16_t *x, uint16_t *y, int M, int N, int K,
			 int R, int U, void *s, void *e0, void *e1, float *alone, float *stream)
{
	float t[25];
	for (int i = 0; i < 3; i++)
		sfw_cuda_gemv_w8_variant(
		    x, &(struct sfw_w8){c[i % ncopies], sc[i % ncopies], SFW_DTYPE_BF16, 128}, y,
		    &(struct sfw_gemm_shape){M, N, K, K, N}, R, U, s);
	for (int i = 0; i < 25; i++) {
		sfw_cuda_event_record(e0, s);
		sfw_cuda_gemv_w8_variant(
		    x, &(struct sfw_w8){c[i % ncopies], sc[i % ncopies], SFW_DTYPE_BF16, 128}, y,
		    &(struct sfw_gemm_shape){M, N, K, K, N}, R, U, s);
		sfw_cuda_event_record(e1, s);
		t[i] = sfw_cuda_event_ms(e0, e1);
	}
	qsort(t, 25, sizeof(float), cmp_float);
	*alone = t[12];
	for (int rep = 0; rep < 9; rep++) {
		sfw_cuda_event_record(e0, s);
		for (int i = 0; i < 20; i++)
			sfw_cuda_gemv_w8_variant(x,
						 &(struct sfw_w8){c[(rep * 20 + i) % ncopies],
								  sc[(rep * 20 + i) % ncopies],
								  SFW_DTYPE_BF16, 128},
						 y, &(struct sfw_gemm_shape){M, N, K, K, N}, R, U, s);
		sfw_cuda_event_record(e1, s);
		t[rep] = sfw_cuda_event_ms(e0, e1) / 20;
	}
	qsort(t, 9, sizeof(float), cmp_float);
	*stream = t[4];
}

static void bench_gemv_w8(double copy_gbps, void *s)
{
	static const struct {
		int N, K;
		const char *what;
	} shapes[] = {
		{4096, 4096, "o_proj"},
		{8704, 4096, "sparse q|k|v|o_gate merged"},
		{16384, 4096, "lightning q|k|v|z merged"},
		{32768, 4096, "gate|up merged"},
		{4096, 16384, "down_proj"},
	};
	/* rows per warp 101, 102: the pipelined forms (next batch in flight);
	 * 202, 204, 208: one row over 2, 4, 8 warps (split K, S2U2 ..) */
	static const int variants[][2] = {{1, 2},   {1, 4},   {1, 8},   {2, 2},   {2, 4},   {4, 4},   {101, 2},
					  {101, 4}, {202, 2}, {202, 4}, {204, 2}, {204, 4}, {208, 2}, {301, 2},
					  {301, 4}, {0, 0}};
	size_t nv = sizeof(variants) / sizeof(variants[0]);
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	printf("\nGEMV int8 (g128, BF16 scales), M=1: GB/s of code + scale bytes, ratio to the copy ceiling %.0f GB/s;\n"
	       "each cell: back-to-back launches (per launch) | one launch alone between events\n",
	       copy_gbps);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int N = shapes[i].N, K = shapes[i].K;
		size_t cb = (size_t)N * K, sb = (size_t)N * (K / 128) * 2, bytes = cb + sb;
		int ncopies = (int)((600u << 20) / bytes) + 1;
		if (ncopies > 48)
			ncopies = 48;
		uint8_t *c[48];
		void *sc[48], *x, *y;
		struct sfw_err e = {0};
		int ok = 1;
		for (int k = 0; k < ncopies; k++) {
			ok &= sfw_cuda_malloc((void **)&c[k], cb, "codes", &e) == SFW_OK;
			ok &= sfw_cuda_malloc(&sc[k], sb, "scales", &e) == SFW_OK;
			if (!ok)
				break;
			sfw_cuda_fill_bf16((uint16_t *)c[k], cb / 2, 300 + k, 1.0f, s); /* random bytes */
			sfw_cuda_fill_bf16(sc[k], sb / 2, 400 + k, 0.002f, s);
		}
		ok &= sfw_cuda_malloc(&x, (size_t)K * 2 * 8, "x", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&y, (size_t)N * 2 * 8, "y", &e) == SFW_OK;
		CHECK(ok, "w8 bench allocations: %s", e.msg);
		if (!ok)
			return;
		sfw_cuda_fill_bf16(x, (size_t)K * 8, 98, 1.0f, s);
		printf("%-6d x %-6d %-28s\n", N, K, shapes[i].what);
		for (size_t v = 0; v < nv; v++) {
			float a, b;
			time_gemv_w8(c, sc, ncopies, x, y, 1, N, K, variants[v][0], variants[v][1], s, e0, e1, &a, &b);
			double ga = bytes / (a * 1e-3) / 1e9, gb = bytes / (b * 1e-3) / 1e9;
			char nm[16];
			if (variants[v][0])
				snprintf(nm, sizeof(nm), "%s%dU%d",
					 variants[v][0] > 300   ? "T"
					 : variants[v][0] > 200 ? "S"
					 : variants[v][0] > 100 ? "P"
								: "R",
					 variants[v][0] % 100,
					 variants[v][1]);
			else
				snprintf(nm, sizeof(nm), "default");
			printf("   %-8s %5.0f GB/s %.2f | %5.0f GB/s %.2f\n", nm, gb, gb / copy_gbps, ga, ga / copy_gbps);
			if (!variants[v][0])
				printf("W8GEMV %dx%d %s: %.2f of copy (back to back), %.2f (alone)\n", N, K, shapes[i].what,
				       gb / copy_gbps, ga / copy_gbps);
		}
		float a4, b4;
		time_gemv_w8(c, sc, ncopies, x, y, 4, N, K, 0, 0, s, e0, e1, &a4, &b4);
		printf("   M=4      %5.0f GB/s\n", bytes / (b4 * 1e-3) / 1e9);
		/* the timed matrix against the C twin on its first 512 rows */
		{
			int n = N < 512 ? N : 512;
			uint8_t *hc = malloc((size_t)n * K);
			uint16_t *hs = malloc((size_t)n * (K / 128) * 2), *hx = malloc((size_t)K * 2), *hy = malloc((size_t)N * 2);
			float *xf = malloc((size_t)K * 4), *ref = malloc((size_t)n * 4);
			sfw_cuda_gemv_w8_variant(x, &(struct sfw_w8){c[0], sc[0], SFW_DTYPE_BF16, 128}, y,
						 &(struct sfw_gemm_shape){1, N, K, K, N}, 0, 0, s);
			sfw_cuda_d2h(hc, c[0], (size_t)n * K, s);
			sfw_cuda_d2h(hs, sc[0], (size_t)n * (K / 128) * 2, s);
			sfw_cuda_d2h(hx, x, (size_t)K * 2, s);
			sfw_cuda_d2h(hy, y, (size_t)N * 2, s);
			sfw_cuda_sync(s);
			for (int k = 0; k < K; k++)
				xf[k] = sfw_bf16_to_f32(hx[k]);
			sfw_op_matmul_w8_cpu(NULL, ref, xf, &(struct sfw_w8){hc, hs, SFW_DTYPE_BF16, 128},
					     &(struct sfw_gemm_shape){1, n, K, 0, 0});
			char name[96];
			snprintf(name, sizeof(name), "w8 gemv timed matrix %dx%d (first %d rows)", N, K, n);
			w8_compare(name, ref, hy, 0, 1, n, N);
			free(hc), free(hs), free(hx), free(hy), free(xf), free(ref);
		}
		for (int k = 0; k < ncopies; k++)
			sfw_cuda_free(c[k]), sfw_cuda_free(sc[k]);
		sfw_cuda_free(x), sfw_cuda_free(y);
	}
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
}

/* Prefill with int8 weights: dequantize to a bf16 slab (64 MiB, as the op
 * scratch) + cuBLASLt, against the bf16 GEMM of the same shape. */
static void bench_gemm_w8(struct sfw_cuda_blas *blas, double gemm_tflops, void *s)
{
	static const struct {
		int N, K;
		const char *what;
	} shapes[] = {
		{4096, 4096, "o_proj / z / o_gate"}, {4608, 4096, "sparse q|k|v"}, {12288, 4096, "lightning q|k|v"},
		{16384, 4096, "gate or up"},        {4096, 16384, "down_proj"},
	};
	int M = 8192;
	size_t scr_bytes = SFW_CUDA_SCRATCH_MIN;
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new(), *scr;
	struct sfw_err e = {0};
	CHECK(sfw_cuda_malloc(&scr, scr_bytes, "scratch", &e) == SFW_OK, "%s", e.msg);
	printf("\nGEMM int8 g128 (dequantize to bf16 slabs + cuBLASLt), M=%d: TFLOP/s, ratio to the GEMM ceiling %.0f\n"
	       "and to the bf16 GEMM of the same shape\n",
	       M, gemm_tflops);
	double t8 = 0, t16 = 0;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int N = shapes[i].N, K = shapes[i].K;
		void *x, *w, *y, *c, *sc;
		size_t sb = (size_t)N * (K / 128) * 2;
		int ok = sfw_cuda_malloc(&x, (size_t)M * K * 2, "x", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&w, (size_t)N * K * 2, "w", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&y, (size_t)M * N * 2, "y", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&c, (size_t)N * K, "codes", &e) == SFW_OK;
		ok &= sfw_cuda_malloc(&sc, sb, "scales", &e) == SFW_OK;
		CHECK(ok, "w8 gemm bench allocations: %s", e.msg);
		if (!ok)
			return;
		sfw_cuda_fill_bf16(x, (size_t)M * K, 5, 1.0f, s);
		sfw_cuda_fill_bf16(w, (size_t)N * K, 6, 0.05f, s);
		sfw_cuda_fill_bf16(c, (size_t)N * K / 2, 7, 1.0f, s);
		sfw_cuda_fill_bf16(sc, sb / 2, 8, 0.002f, s);
		float t[2][9];
		for (int r = 0; r < 2; r++) {
			sfw_cuda_gemm(blas, x, w, y, &(struct sfw_gemm_shape){M, N, K, K, N}, s);
			sfw_cuda_gemm_w8(blas, x, &(struct sfw_w8){c, sc, SFW_DTYPE_BF16, 128}, y,
					 &(struct sfw_gemm_shape){M, N, K, K, N}, scr, scr_bytes, s);
		}
		for (int r = 0; r < 9; r++) {
			sfw_cuda_event_record(e0, s);
			sfw_cuda_gemm(blas, x, w, y, &(struct sfw_gemm_shape){M, N, K, K, N}, s);
			sfw_cuda_event_record(e1, s);
			t[0][r] = sfw_cuda_event_ms(e0, e1);
			sfw_cuda_event_record(e0, s);
			sfw_cuda_gemm_w8(blas, x, &(struct sfw_w8){c, sc, SFW_DTYPE_BF16, 128}, y,
					 &(struct sfw_gemm_shape){M, N, K, K, N}, scr, scr_bytes, s);
			sfw_cuda_event_record(e1, s);
			t[1][r] = sfw_cuda_event_ms(e0, e1);
		}
		qsort(t[0], 9, sizeof(float), cmp_float);
		qsort(t[1], 9, sizeof(float), cmp_float);
		double fl = 2.0 * M * N * K, tb = fl / (t[0][4] * 1e-3) / 1e12, tq = fl / (t[1][4] * 1e-3) / 1e12;
		printf("  %6d x %-6d %-22s bf16 %7.3f ms %4.0f TFLOP/s | int8 %7.3f ms %4.0f TFLOP/s  %.2f of ceiling, "
		       "%.2f of bf16\n",
		       N, K, shapes[i].what, t[0][4], tb, t[1][4], tq, tq / gemm_tflops, tq / tb);
		t16 += t[0][4], t8 += t[1][4];
		sfw_cuda_free(x), sfw_cuda_free(w), sfw_cuda_free(y), sfw_cuda_free(c), sfw_cuda_free(sc);
	}
	printf("W8GEMM all shapes: int8 %.3f ms vs bf16 %.3f ms: %.2f of the bf16 rate\n", t8, t16, t16 / t8);
	sfw_cuda_free(scr);
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
}

/* The tensor-core decode rows (sfw_cuda_gemv_w8_variant R = 301, U 2 and 4;
 * kernels/linear_w8.cu) against the C twin, each activation row held to the
 * GEMV's bound (its products are exact, its sums fp32), at M = 1, 2, 3 and 8:
 * the real model's shapes (o_proj 4096 x 4096, merged gate|up 32768 x 4096,
 * down 4096 x 16384, the 2-head K/V 256 x 4096) with g128, and odd splits:
 * K = 2112 (33 slices over 8 warps: one warp idle, a last group of one slice
 * at g128) at groups 64, 128 and per channel, each scale type; the engine's
 * op with SALAFW_CUDA_W8GEMV=tc's switch, and the merged gate|up's SwiGLU
 * form. Shapes it does not take (group 32, K % 64) run the default kernels;
 * those the loop above covers. */
static void w8_tc_check(const char *what, const float *ref, const uint16_t *Y, int M, int N)
{
	for (int m = 0; m < M; m++) {
		char name[160];
		snprintf(name, sizeof(name), "%s, row %d of %d", what, m, M);
		w8_compare(name, ref + (size_t)m * N, Y + (size_t)m * N, 0, 1, N, N);
	}
}

static void test_w8_tc(struct sfw_cuda_ctx *cx)
{
	void *s = cx->stream;
	static const struct {
		int N, K, group;
	} shapes[] = {{4096, 4096, 128}, {32768, 4096, 128}, {4096, 16384, 128}, {256, 4096, 128},
		      {64, 2112, 64},	 {64, 2112, 128},    {64, 2112, 0}};
	static const enum sfw_dtype sdts[] = {SFW_DTYPE_BF16, SFW_DTYPE_F16, SFW_DTYPE_F32};
	static const int Ms[] = {1, 2, 3, 8};
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
		for (size_t di = 0; di < sizeof(sdts) / sizeof(sdts[0]); di++) {
			int N = shapes[si].N, K = shapes[si].K, group = shapes[si].group;
			enum sfw_dtype sdt = sdts[di];
			if (N > 4096 && sdt != SFW_DTYPE_BF16) /* (the widest once: the C twin's time) */
				continue;
			struct w8_host h;
			w8_make(&h, N, K, group, sdt);
			uint16_t *X = malloc((size_t)8 * K * 2), *Y = malloc((size_t)8 * N * 2);
			float *xf = malloc((size_t)8 * K * 4), *ref = malloc((size_t)8 * N * 4);
			rand_bf16(X, (size_t)8 * K, 1.0f);
			for (size_t i = 0; i < (size_t)8 * K; i++)
				xf[i] = sfw_bf16_to_f32(X[i]);
			int span = group > 0 ? group : K;
			struct sfw_w8 hw = {h.codes, h.scales, sdt, span};
			sfw_op_matmul_w8_cpu(NULL, ref, xf, &hw, &(struct sfw_gemm_shape){8, N, K, 0, 0});
			void *dx, *dc, *dsc, *dy;
			struct sfw_err e = {0};
			CHECK(sfw_cuda_malloc(&dx, (size_t)8 * K * 2, "x", &e) == SFW_OK, "%s", e.msg);
			CHECK(sfw_cuda_malloc(&dc, h.cbytes, "codes", &e) == SFW_OK, "%s", e.msg);
			CHECK(sfw_cuda_malloc(&dsc, h.sbytes, "scales", &e) == SFW_OK, "%s", e.msg);
			CHECK(sfw_cuda_malloc(&dy, (size_t)8 * N * 2, "y", &e) == SFW_OK, "%s", e.msg);
			sfw_cuda_h2d(dx, X, (size_t)8 * K * 2, s);
			sfw_cuda_h2d(dc, h.codes, h.cbytes, s);
			sfw_cuda_h2d(dsc, h.scales, h.sbytes, s);
			struct sfw_w8 dw = {dc, dsc, sdt, span};
			char name[128];
			for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++) {
				int M = Ms[mi];
				for (int u = 2; u <= 4; u += 2) {
					sfw_cuda_memset(dy, 0xff, (size_t)8 * N * 2, s);
					sfw_cuda_gemv_w8_variant(dx, &dw, dy, &(struct sfw_gemm_shape){M, N, K, K, N}, 301, u,
								 s);
					sfw_cuda_d2h(Y, dy, (size_t)M * N * 2, s);
					sfw_cuda_sync(s);
					snprintf(name, sizeof(name), "w8 gemv tensor cores T1U%d M=%d N=%d K=%d group %d %s", u,
						 M, N, K, span, sdt_name(sdt));
					w8_tc_check(name, ref, Y, M, N);
				}
				/* the engine's op with the context's switch (SALAFW_CUDA_W8GEMV=tc) */
				cx->w8gemv = 2;
				sfw_cuda_memset(dy, 0xff, (size_t)8 * N * 2, s);
				sfw_op_matmul_w8_cuda(dy, dx, &dw, &(struct sfw_gemm_shape){M, N, K, 0, 0}, SFW_DTYPE_BF16,
						      cx);
				cx->w8gemv = 0;
				sfw_cuda_d2h(Y, dy, (size_t)M * N * 2, s);
				sfw_cuda_sync(s);
				snprintf(name, sizeof(name), "w8 op, w8gemv tc, M=%d N=%d K=%d group %d %s", M, N, K, span,
					 sdt_name(sdt));
				w8_tc_check(name, ref, Y, M, N);
			}
			/* the merged gate|up's SwiGLU form on the tensor cores (BF16 scales:
			 * the form's precondition), against the C twin's composition with
			 * the bound of the CUDA-core form's check */
			if (N == 32768 && sdt == SFW_DTYPE_BF16) {
				int I = N / 2;
				sfw_op_matmul_silu_w8_cpu(NULL, ref, xf, &hw, I, K);
				cx->w8gemv = 2;
				sfw_cuda_memset(dy, 0xff, (size_t)I * 2, s);
				int got = sfw_op_matmul_silu_w8_cuda(dy, dx, &dw, I, K, cx);
				cx->w8gemv = 0;
				sfw_cuda_d2h(Y, dy, (size_t)I * 2, s);
				sfw_cuda_sync(s);
				snprintf(name, sizeof(name), "w8 gemv+silu, w8gemv tc, I=%d K=%d group %d", I, K, span);
				CHECK(got == 1, "%s: returned %d", name, got);
				w8_compare_rel(name, ref, Y, 0, 1, I, I, 1.0 / 64, 6e-5);
			}
			sfw_cuda_free(dx), sfw_cuda_free(dc), sfw_cuda_free(dsc), sfw_cuda_free(dy);
			w8_free(&h);
			free(X), free(Y), free(xf), free(ref);
		}
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
	struct sfw_cuda_ctx *cx = NULL; /* the W8 op twins' handle and scratch, on s */
	CHECK(sfw_cuda_ctx_new(s, &cx, &err) == SFW_OK, "%s", err.msg);
	if (cx) {
		correctness_w8(cx);
		test_w8_tc(cx);
	}
	sfw_cuda_ctx_free(cx);
	if (!getenv("GPU_LINEAR_QUICK")) {
		double copy = 0, gemm = 0;
		CHECK(sfw_cuda_measure_copy((size_t)2 << 30, &copy, &err) == SFW_OK, "%s", err.msg);
		CHECK(sfw_cuda_measure_gemm(8192, &gemm, &err) == SFW_OK, "%s", err.msg);
		printf("LIMIT copy %.0f GB/s (2 GiB device-to-device, read+write)\n", copy);
		printf("LIMIT gemm %.0f TFLOP/s (cuBLASLt bf16 8192^3, random data)\n", gemm);
		CHECK(copy > 100 && gemm > 10, "ceilings look wrong: %.0f GB/s, %.0f TFLOP/s", copy, gemm);
		bench_gemv(copy, s);
		bench_gemm(blas, gemm, s);
		bench_gemv_w8(copy, s);
		bench_gemm_w8(blas, gemm, s);
	}
	size_t live, peak, used;
	sfw_cuda_mem_stats(&live, &peak, &used);
	CHECK(live == 32u << 20, "device bytes still allocated: %zu (expected the 32 MiB workspace)", live);
	sfw_cuda_blas_free(blas);
	sfw_cuda_stream_free(s);
	return CHECK_REPORT("gpu_linear");
}
