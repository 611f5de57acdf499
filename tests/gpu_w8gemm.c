/* modules: kernels num core */
/* The int8 tensor-core GEMM (kernels/linear_w8_mma.cu) against its C twin
 * sfw_op_matmul_w8_cpu, and against mathematics: a float64 sum over the
 * bf16-rounded weights the kernel multiplies.
 *
 * Cases: the real model's shapes (4096 x 4096, the merged gate|up 2 x 16384
 * x 4096 with the fused SiLU, 16384 -> 4096 down, 4096 -> 256 K/V) at M = 1,
 * 2, 3, 8, 16, 17, 32, 64, 100, 256 and a prefill piece (o_proj 2048, K/V 8192,
 * gate|up and down 512 rows: the C twin bounds the size), int8
 * group 128 BF16 scales (what salafw quant writes); then every group size
 * (32, 64, 128, per channel) and scale dtype (BF16, F16, F32) on shapes that
 * are not multiples of the tiles (N = 1000, K = 1040, strided X and Y), plain
 * and SiLU; the split-K workspace path and the unsplit one; repeated calls
 * bit-equal; then every tile configuration (sfw_cuda_w8mma_cfg_name) on
 * those off-grid shapes, split and unsplit, plain and SiLU (a configuration
 * that cannot do SiLU must refuse it and write nothing), and on 4096 x 4096
 * at 64 rows.
 *
 * Tolerances, per output (bf16) against the C twin r (float32 weights
 * w = (b - 128) scale): |y - r| <= |r| / 128 + 1.6e-2 rms(r) and NMSE <
 * 2e-5, the bounds tests/gpu_linear.c uses for the dequantize-then-cuBLASLt
 * path, whose bf16 weights are the same: each w rounded to 8 significant
 * bits (relative error <= 2^-9) gives a sum error of standard deviation near
 * 1.6e-3 rms(r), and the output rounding adds <= 2^-9 |r|. Against the
 * float64 sum R over the bf16 weights (256 sampled outputs per case; the
 * weights rounded as the kernel does, b - 128 exact times the scale in
 * float32, then round to nearest even): |y - R| <= 2^-8 |R| + 2^-16 sum|x w|
 * (output rounding, plus fp32 accumulation well inside 2^-16 of the
 * magnitude sum for K <= 16384; one k term wrong is ~2^-14 of it at K =
 * 16384). SiLU: g and u are the twin's rounded to bf16, y = silu(g) u as the
 * GPU forms it; |y - r| <= |r| / 64 + 3.2e-2 rms(r), NMSE < 6e-5 (the
 * rounding of g and u to bf16 sits on top of the weights' rounding). */
#include "check.h"
#include "lib/rng.h"
#include "thread.h"

#include "kernels/linear_w8_mma.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x5eed8;
static int case_cfg = -1; /* run_case's tile configuration (-1: the kernel's choice) */
static struct sfw_ops_cpu *twin_ex; /* the C twin's executor (main) */

static float urand(void)
{
	return sfwt_urand(&rng_state);
}

/* float -> IEEE half bits, round to nearest even (normal numbers only: the
 * test's scales). */
static uint16_t f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000u;
	int e = (int)((u >> 23) & 0xff) - 127 + 15;
	uint32_t man = u & 0x7fffffu;
	if (e <= 0 || e >= 31)
		return (uint16_t)sign;
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fffu;
	if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

static float scale_of(const void *s, enum sfw_dtype sdt, size_t i)
{
	if (sdt == SFW_DTYPE_F32)
		return ((const float *)s)[i];
	uint16_t h = ((const uint16_t *)s)[i];
	return sdt == SFW_DTYPE_F16 ? sfw_f16_to_f32(h) : sfw_bf16_to_f32(h);
}

static const char *sdt_name(enum sfw_dtype d)
{
	return d == SFW_DTYPE_F32 ? "F32" : d == SFW_DTYPE_F16 ? "F16" : "BF16";
}

/* One int8 weight on host and device. */
struct w8 {
	int N, K, group; /* group: 0 = per channel */
	enum sfw_dtype sdt;
	uint8_t *codes; /* [N, K] (K % 16 == 0: no row padding) */
	void *scales;	/* [N, G] */
	size_t G, ss;
	void *dc, *ds;
};

static int w8_make(struct w8 *w, int N, int K, int group, enum sfw_dtype sdt, void *s)
{
	struct sfw_err e = {0};
	memset(w, 0, sizeof(*w));
	w->N = N, w->K = K, w->group = group, w->sdt = sdt;
	int span = group > 0 ? group : K;
	w->G = (size_t)((K + span - 1) / span);
	w->ss = sdt == SFW_DTYPE_F32 ? 4 : 2;
	w->codes = malloc((size_t)N * K);
	w->scales = malloc((size_t)N * w->G * w->ss);
	if (!w->codes || !w->scales) {
		CHECK(0, "host memory for a %d x %d weight", N, K);
		return 0;
	}
	for (size_t i = 0; i < (size_t)N * K; i++)
		w->codes[i] = (uint8_t)(sfwt_next(&rng_state) & 0xff);
	for (size_t i = 0; i < (size_t)N * w->G; i++) {
		float v = 1e-3f * (1.5f + urand()); /* (0.5, 2.5) x 1e-3 */
		if (sdt == SFW_DTYPE_F32)
			((float *)w->scales)[i] = v;
		else if (sdt == SFW_DTYPE_F16)
			((uint16_t *)w->scales)[i] = f32_to_f16(v);
		else
			((uint16_t *)w->scales)[i] = sfw_f32_to_bf16(v);
	}
	int ok = sfw_cuda_malloc(&w->dc, (size_t)N * K, "codes", &e) == SFW_OK &&
		 sfw_cuda_malloc(&w->ds, (size_t)N * w->G * w->ss, "scales", &e) == SFW_OK;
	CHECK(ok, "%s", e.msg);
	if (!ok)
		return 0;
	sfw_cuda_h2d(w->dc, w->codes, (size_t)N * K, s);
	sfw_cuda_h2d(w->ds, w->scales, (size_t)N * w->G * w->ss, s);
	return 1;
}

static void w8_free(struct w8 *w)
{
	free(w->codes), free(w->scales);
	if (w->dc)
		sfw_cuda_free(w->dc);
	if (w->ds)
		sfw_cuda_free(w->ds);
	memset(w, 0, sizeof(*w));
}

/* The bf16 weight the kernel multiplies: (b - 128) * scale in float32,
 * rounded to nearest even. */
static float w_bf16(const struct w8 *w, int n, int k)
{
	int span = w->group > 0 ? w->group : w->K;
	float v = (float)((int)w->codes[(size_t)n * w->K + k] - 128) *
		  scale_of(w->scales, w->sdt, (size_t)n * w->G + (size_t)(k / span));
	return sfw_bf16_to_f32(sfw_f32_to_bf16(v));
}

static float silu_bf(float g, float u)
{
	float s = sfw_bf16_to_f32(sfw_f32_to_bf16(g / (1.0f + expf(-g))));
	return s * u;
}

/* y against the C twin (tolerances in the header comment). */
static void compare_twin(const char *what, const float *ref, const uint16_t *y, int M, int N, int ldy, double rel,
			 double a, double nmse_max)
{
	double num = 0, den = 0, maxd = 0;
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++)
			den += (double)ref[(size_t)m * N + n] * ref[(size_t)m * N + n];
	double rms = sqrt(den / ((double)M * N));
	int bm = -1, bn = 0;
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double r = ref[(size_t)m * N + n], v = sfw_bf16_to_f32(y[(size_t)m * ldy + n]);
			double d = fabs(v - r);
			num += d * d;
			maxd = d > maxd ? d : maxd;
			if (!(d <= fabs(r) * rel + a * rms) && bm < 0)
				bm = m, bn = n;
		}
	double nmse = den > 0 ? num / den : num;
	printf("%-64s NMSE %.2e  max|diff| %.2e  (rms ref %.2e)\n", what, nmse, maxd, rms);
	CHECK(bm < 0, "%s: y[%d,%d] = %g, C twin %g", what, bm, bn,
	      bm < 0 ? 0.0 : sfw_bf16_to_f32(y[(size_t)bm * ldy + bn]), bm < 0 ? 0.0 : ref[(size_t)bm * N + bn]);
	CHECK(nmse < nmse_max, "%s: NMSE %.3e (< %.1e)", what, nmse, nmse_max);
}

/* Sampled outputs against the float64 sum over the bf16 weights. */
static void compare_exact(const char *what, const uint16_t *x, int ldx, const struct w8 *w, const uint16_t *y,
			  int ldy, int M, int N, int silu)
{
	int bad = 0, samples = 256;
	for (int t = 0; t < samples; t++) {
		int m = (int)(sfwt_next(&rng_state) % (uint64_t)M), n = (int)(sfwt_next(&rng_state) % (uint64_t)N);
		double r[2] = {0, 0}, mag[2] = {0, 0};
		for (int h = 0; h < (silu ? 2 : 1); h++)
			for (int k = 0; k < w->K; k++) {
				double p = (double)sfw_bf16_to_f32(x[(size_t)m * ldx + k]) * w_bf16(w, n + h * N, k);
				r[h] += p, mag[h] += fabs(p);
			}
		double v = sfw_bf16_to_f32(y[(size_t)m * ldy + n]), R, tol;
		if (!silu) {
			R = r[0], tol = fabs(R) / 256 + mag[0] / 65536;
		} else {
			/* g and u within their own bounds, through silu(g) u */
			double eg = fabs(r[0]) / 256 + mag[0] / 65536, eu = fabs(r[1]) / 256 + mag[1] / 65536;
			R = silu_bf((float)r[0], (float)r[1]);
			double dsilu = 1.1; /* |silu'| <= 1.1 */
			tol = fabs(R) / 128 + dsilu * eg * (fabs(r[1]) + eu) + eu * (fabs(r[0]) * 1.1 + eg) +
			      1e-6;
		}
		if (!(fabs(v - R) <= tol)) {
			if (!bad)
				CHECK(0, "%s: y[%d,%d] = %.6g, float64 over bf16 weights %.6g (tolerance %.2e)", what, m,
				      n, v, R, tol);
			bad++;
		}
	}
	if (!bad)
		CHECK(1, "%s: %d sampled outputs", what, samples);
}

struct ws {
	void *p;
	size_t bytes;
};

/* Y = X W^T (or the SiLU form) on the GPU and on the CPU twin; X is M x K
 * with row stride ldx, Y has row stride ldy (columns beyond N poisoned and
 * checked untouched). use_ws 0: no workspace (the unsplit path). */
static void run_case(const struct w8 *w, int M, int ldx, int ldy, int silu, int use_ws, struct ws *ws, void *s)
{
	int K = w->K, N = silu ? w->N / 2 : w->N, rows = w->N;
	struct sfw_err e = {0};
	size_t nx = (size_t)M * ldx, ny = (size_t)M * ldy;
	uint16_t *x = malloc(nx * 2), *y = malloc(ny * 2), *y2 = malloc(ny * 2);
	float *xf = malloc((size_t)M * K * sizeof(float)), *ref = malloc((size_t)M * rows * sizeof(float));
	float *out = silu ? malloc((size_t)M * N * sizeof(float)) : ref;
	void *dx = NULL, *dy = NULL;
	if (!x || !y || !y2 || !xf || !ref || !out) {
		CHECK(0, "host memory for M = %d", M);
		goto done;
	}
	for (size_t i = 0; i < nx; i++)
		x[i] = sfw_f32_to_bf16(urand());
	for (int m = 0; m < M; m++)
		for (int k = 0; k < K; k++)
			xf[(size_t)m * K + k] = sfw_bf16_to_f32(x[(size_t)m * ldx + k]);
	int ok = sfw_cuda_malloc(&dx, nx * 2, "x", &e) == SFW_OK && sfw_cuda_malloc(&dy, ny * 2, "y", &e) == SFW_OK;
	CHECK(ok, "%s", e.msg);
	if (!ok)
		goto done;
	size_t need = sfw_cuda_w8mma_ws_bytes_cfg(M, N, K, silu, 0, case_cfg);
	if (use_ws && need > ws->bytes) {
		if (ws->p)
			sfw_cuda_free(ws->p);
		ws->p = NULL, ws->bytes = 0;
		if (sfw_cuda_malloc(&ws->p, need, "w8mma workspace", &e) != SFW_OK) {
			CHECK(0, "%s", e.msg);
			goto done;
		}
		sfw_cuda_memset(ws->p, 0, need, s);
		ws->bytes = need;
	}
	sfw_cuda_h2d(dx, x, nx * 2, s);
	sfw_cuda_memset(dy, 0xff, ny * 2, s); /* poison: NaN bf16 */
	int took = sfw_cuda_gemm_w8_mma_cfg(dx, &(struct sfw_w8){w->dc, w->ds, w->sdt, w->group}, dy,
					    &(struct sfw_gemm_shape){M, N, K, ldx, ldy}, silu,
					    use_ws ? ws->p : NULL, use_ws ? ws->bytes : 0, s, case_cfg);
	char name[192];
	snprintf(name, sizeof(name), "w8mma%s M=%d N=%d K=%d group %d %s%s%s%s%s", silu ? " silu" : "", M, N, K,
		 w->group, sdt_name(w->sdt), ldx != K || ldy != N ? " strided" : "",
		 use_ws ? (need ? " split" : "") : " no-ws", case_cfg >= 0 ? " cfg " : "",
		 case_cfg >= 0 ? sfw_cuda_w8mma_cfg_name(case_cfg) : "");
	if (case_cfg >= 0)
		CHECK(took == sfw_cuda_w8mma_cfg_takes(case_cfg, silu), "%s: took the call: %d, says it takes it: %d",
		      name, took, sfw_cuda_w8mma_cfg_takes(case_cfg, silu));
	if (!took && case_cfg >= 0 && silu && !sfw_cuda_w8mma_cfg_takes(case_cfg, silu)) {
		/* refused, as it says it would: nothing written */
		int untouched = 1;
		sfw_cuda_d2h(y, dy, ny * 2, s);
		sfw_cuda_sync(s);
		for (size_t i = 0; i < ny; i++)
			untouched &= y[i] == 0xffff;
		CHECK(untouched, "%s: refused, yet wrote", name);
		goto done;
	}
	CHECK(took == 1, "%s: the call was not taken", name);
	sfw_cuda_d2h(y, dy, ny * 2, s);
	/* again: the same bits (a deterministic split, counters left at zero) */
	sfw_cuda_memset(dy, 0xff, ny * 2, s);
	sfw_cuda_gemm_w8_mma_cfg(dx, &(struct sfw_w8){w->dc, w->ds, w->sdt, w->group}, dy,
				 &(struct sfw_gemm_shape){M, N, K, ldx, ldy}, silu, use_ws ? ws->p : NULL,
				 use_ws ? ws->bytes : 0, s, case_cfg);
	sfw_cuda_d2h(y2, dy, ny * 2, s);
	sfw_cuda_sync(s);
	int same = 1, untouched = 1;
	for (int m = 0; m < M; m++) {
		if (memcmp(y + (size_t)m * ldy, y2 + (size_t)m * ldy, (size_t)N * 2))
			same = 0;
		for (int n = N; n < ldy; n++)
			if (y[(size_t)m * ldy + n] != 0xffff)
				untouched = 0;
	}
	CHECK(same, "%s: a second call gave other bits", name);
	CHECK(untouched, "%s: wrote outside its columns", name);

	sfw_op_matmul_w8_cpu(twin_ex, ref, xf, &(struct sfw_w8){w->codes, w->scales, w->sdt, w->group},
			     &(struct sfw_gemm_shape){M, rows, K, 0, 0});
	if (silu) {
		for (int m = 0; m < M; m++)
			for (int n = 0; n < N; n++) {
				float g = sfw_bf16_to_f32(sfw_f32_to_bf16(ref[(size_t)m * rows + n]));
				float u = sfw_bf16_to_f32(sfw_f32_to_bf16(ref[(size_t)m * rows + N + n]));
				out[(size_t)m * N + n] = silu_bf(g, u);
			}
		compare_twin(name, out, y, M, N, ldy, 1.0 / 64, 3.2e-2, 6e-5);
	} else {
		compare_twin(name, ref, y, M, N, ldy, 1.0 / 128, 1.6e-2, 2e-5);
	}
	compare_exact(name, x, ldx, w, y, ldy, M, N, silu);
done:
	if (dx)
		sfw_cuda_free(dx);
	if (dy)
		sfw_cuda_free(dy);
	if (out != ref)
		free(out);
	free(x), free(y), free(y2), free(xf), free(ref);
}

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_w8gemm");
	}
	printf("device: %s, sm_%d%d, %d SMs\n", info.name, info.cc_major, info.cc_minor, info.sm_count);
	void *s;
	if (sfw_cuda_stream_new(&s, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_w8gemm");
	}
	/* the C twin on every core (the prefill pieces are 10-70 GFLOP each) */
	if (sfw_ops_cpu_new(sfw_default_threads(), &twin_ex, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_w8gemm");
	}
	struct ws ws = {NULL, 0};
	int quick = getenv("GPU_W8GEMM_QUICK") != NULL;

	/* The real model's shapes, group 128, BF16 scales. */
	static const int Ms[] = {1, 2, 3, 8, 16, 17, 32, 64, 100, 256};
	static const struct {
		int rows, K, silu, prefill; /* rows: weight rows (silu: 2 x the output) */
	} real[] = {
		{4096, 4096, 0, 2048},   /* o_proj */
		{256, 4096, 0, 8192},    /* the 2-head K/V */
		{2 * 16384, 4096, 1, 512}, /* merged gate|up, fused SiLU */
		{4096, 16384, 0, 512},   /* down_proj */
		{2 * 16384, 4096, 0, 0}, /* gate|up unfused */
	};
	for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++) {
		struct w8 w;
		if (!w8_make(&w, real[i].rows, real[i].K, 128, SFW_DTYPE_BF16, s))
			continue;
		for (size_t j = 0; j < sizeof(Ms) / sizeof(Ms[0]); j++) {
			if (quick && Ms[j] > 17)
				continue;
			run_case(&w, Ms[j], w.K, real[i].silu ? w.N / 2 : w.N, real[i].silu, 1, &ws, s);
		}
		if (real[i].prefill && !quick)
			run_case(&w, real[i].prefill, w.K, real[i].silu ? w.N / 2 : w.N, real[i].silu, 1, &ws, s);
		w8_free(&w);
	}

	/* Every group size and scale dtype, on shapes off the tile grid. */
	static const int groups[] = {32, 64, 128, 0};
	static const enum sfw_dtype sdts[] = {SFW_DTYPE_BF16, SFW_DTYPE_F16, SFW_DTYPE_F32};
	for (size_t gi = 0; gi < 4; gi++)
		for (size_t di = 0; di < 3; di++) {
			struct w8 w;
			if (!w8_make(&w, 1000, 1040, groups[gi], sdts[di], s))
				continue;
			run_case(&w, 2, 1040, 1000, 0, 1, &ws, s);
			run_case(&w, 17, 1048, 1004, 0, 1, &ws, s);
			run_case(&w, 100, 1040, 1000, 0, 1, &ws, s);
			run_case(&w, 3, 1040, 500, 1, 1, &ws, s);
			run_case(&w, 64, 1056, 508, 1, 1, &ws, s);
			w8_free(&w);
		}
	/* The unsplit path (no workspace), and tiny shapes. */
	{
		struct w8 w;
		if (w8_make(&w, 4096, 4096, 64, SFW_DTYPE_BF16, s)) {
			run_case(&w, 2, 4096, 4096, 0, 0, &ws, s);
			run_case(&w, 40, 4096, 4096, 0, 0, &ws, s);
			w8_free(&w);
		}
		if (w8_make(&w, 24, 48, 16, SFW_DTYPE_F16, s)) {
			run_case(&w, 5, 48, 24, 0, 1, &ws, s);
			run_case(&w, 5, 48, 12, 1, 1, &ws, s);
			w8_free(&w);
		}
	}
	/* Every tile configuration (the ones the sweep may choose tomorrow):
	 * off the tile grid in every dimension, split and unsplit, plain and
	 * SiLU (where it can: an even number of weight tiles), and a real shape
	 * at 64 rows. A configuration that cannot take the SiLU call says so
	 * with 0. */
	for (int c = 0; c < sfw_cuda_w8mma_ncfg(); c++) {
		struct w8 w;
		case_cfg = c;
		if (w8_make(&w, 1000, 1040, 32, SFW_DTYPE_F16, s)) {
			run_case(&w, 17, 1048, 1004, 0, 1, &ws, s);
			run_case(&w, 41, 1040, 1000, 0, 0, &ws, s);
			run_case(&w, 33, 1056, 508, 1, 1, &ws, s);
			w8_free(&w);
		}
		if (w8_make(&w, 4096, 4096, 128, SFW_DTYPE_BF16, s)) {
			run_case(&w, 64, 4096, 4096, 0, 1, &ws, s);
			w8_free(&w);
		}
	}
	case_cfg = -1;
	/* What the kernel does not take: a clear 0, nothing written. */
	CHECK(!sfw_cuda_w8mma_ok((const void *)16,
				 &(struct sfw_w8){(const uint8_t *)16, NULL, SFW_DTYPE_BF16, 128},
				 &(struct sfw_gemm_shape){4, 100, 1000, 1000, 0}),
	      "K = 1000 (not a multiple of 16) refused");
	CHECK(!sfw_cuda_w8mma_ok((const void *)16,
				 &(struct sfw_w8){(const uint8_t *)16, NULL, SFW_DTYPE_BF16, 40},
				 &(struct sfw_gemm_shape){4, 100, 4096, 4096, 0}),
	      "group 40 refused");
	CHECK(!sfw_cuda_w8mma_ok((const void *)8,
				 &(struct sfw_w8){(const uint8_t *)16, NULL, SFW_DTYPE_BF16, 128},
				 &(struct sfw_gemm_shape){4, 100, 4096, 4096, 0}),
	      "unaligned X refused");
	CHECK(!sfw_cuda_w8mma_ok((const void *)16,
				 &(struct sfw_w8){(const uint8_t *)16, NULL, SFW_DTYPE_I32, 128},
				 &(struct sfw_gemm_shape){4, 100, 4096, 4096, 0}),
	      "I32 scales refused");
	CHECK(sfw_cuda_gemm_w8_mma(
		  (const uint16_t *)16,
		  &(struct sfw_w8){(const uint8_t *)16, (const void *)16, SFW_DTYPE_BF16, 128},
		  (uint16_t *)16, &(struct sfw_gemm_shape){4, 100, 1000, 4100, 100}, 0, NULL, 0, s, 0) == 0,
	      "a refused call returns 0");

	if (ws.p)
		sfw_cuda_free(ws.p);
	sfw_cuda_stream_free(s);
	CHECK(!sfw_ops_cpu_take_failure(twin_ex), "the C twin ran out of memory");
	sfw_ops_cpu_free(twin_ex);
	return CHECK_REPORT("gpu_w8gemm");
}
