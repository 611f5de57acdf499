/* modules: tools quant runner formats kernels num fetch verify core */
/* test_kv8.c - the fp8 KV cache's numbers and layout (kernels/ops.h, "the
 * fp8 KV cache"), against mathematics:
 *   - every E4M3 code decodes to (-1)^s 2^(e-7) (1 + m/8), or m 2^-9 for
 *     e = 0, computed here with ldexp; 0x7f and 0xff are NaN;
 *   - encoding a code's value gives the code back; a value between two
 *     neighbours goes to the nearer, a midpoint to the even code; 448 and up
 *     saturate; NaN stays NaN;
 *   - a head written and read back is within half a step of each value
 *     (|x| 2^-4, or 2^-10 of the scale below the normal range), its largest
 *     value within 2 ulp;
 *   - a paged write lands where the layout's offsets say: read back through
 *     its table it equals the contiguous write of the same rows;
 * and its accuracy on the golden cases (../shared/golden): the CPU engine
 * with --kv-cache fp8 against the same engine with float K/V, fed the same
 * tokens (logits relative to their largest magnitude, and the top-1 token
 * of every row). */
#include "check.h"
#include "lib/compare.h"
#include "kernels/ops.h"
#include "formats/safetensors.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float code_value(int c)
{
	int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
	double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
	return (float)(s ? -v : v);
}

static void decode_all(void)
{
	int bad = 0;
	for (int c = 0; c < 256; c++) {
		float f = sfw_e4m3_to_f32((uint8_t)c);
		if ((c & 0x7f) == 0x7f) {
			bad += !isnan(f);
			continue;
		}
		bad += f != code_value(c) || (signbit(f) != 0) != (c >> 7 != 0);
	}
	CHECK(bad == 0, "every code decodes to its value (%d wrong)", bad);
	CHECK(code_value(0x7e) == 448.0f && code_value(0x01) == ldexpf(1, -9) && code_value(0x08) == ldexpf(1, -6),
	      "the range: largest 448, least subnormal 2^-9, least normal 2^-6");
}

/* The decode of devices without the e4m3 instruction (sfw_e4m3x2_half_bits,
 * kernels/cuda_common.cuh): every pair of codes, each half read as an IEEE
 * half and scaled by 2^8, is the code's value (NaN for a NaN code, signs
 * kept). */
static void half_bits_all(void)
{
	long bad = 0;
	for (uint32_t lo = 0; lo < 256; lo++)
		for (uint32_t hi = 0; hi < 256; hi++) {
			uint32_t h = sfw_e4m3x2_half_bits(lo | hi << 8);
			const uint32_t code[2] = {lo, hi};
			for (int k = 0; k < 2; k++) {
				float got = sfw_f16_to_f32((uint16_t)(h >> (16 * k))) * 256.0f,
				      want = sfw_e4m3_to_f32((uint8_t)code[k]);
				if (isnan(want))
					bad += !isnan(got);
				else
					bad += got != want || (signbit(got) != 0) != (signbit(want) != 0);
			}
		}
	CHECK(bad == 0, "the half-bits decode gives every code's value in both halves (%ld wrong)", bad);
}

static void encode_all(void)
{
	int back = 0, near = 0, ties = 0;
	for (int c = 0; c < 256; c++) {
		if ((c & 0x7f) == 0x7f || c == 0x80) /* NaN; -0 encodes as -0 (0x80) and is checked below */
			continue;
		back += sfw_e4m3_from_f32(code_value(c)) != c;
	}
	CHECK(back == 0, "each code's value encodes to the code (%d wrong)", back);
	CHECK(sfw_e4m3_from_f32(-0.0f) == 0x80 && sfw_e4m3_from_f32(0.0f) == 0, "signed zeros");
	/* between neighbours c and c + 1 (positive, finite) */
	for (int c = 0; c < 0x7e; c++) {
		double a = code_value(c), b = code_value(c + 1), mid = (a + b) / 2;
		float lo = nextafterf((float)mid, 0), hi = nextafterf((float)mid, INFINITY);
		near += sfw_e4m3_from_f32(lo) != c || sfw_e4m3_from_f32(hi) != c + 1;
		near += sfw_e4m3_from_f32((float)-mid + 0.0f) != (0x80 | ((c & 1) ? c + 1 : c));
		ties += sfw_e4m3_from_f32((float)mid) != ((c & 1) ? c + 1 : c);
	}
	CHECK(near == 0, "values between two codes go to the nearer (%d wrong)", near);
	CHECK(ties == 0, "midpoints go to the even code (%d wrong)", ties);
	CHECK(sfw_e4m3_from_f32(448.0f) == 0x7e && sfw_e4m3_from_f32(464.0f) == 0x7e &&
		  sfw_e4m3_from_f32(1e30f) == 0x7e && sfw_e4m3_from_f32(INFINITY) == 0x7e &&
		  sfw_e4m3_from_f32(-INFINITY) == 0xfe,
	      "448 and beyond saturate to +-448");
	CHECK((sfw_e4m3_from_f32(NAN) & 0x7f) == 0x7f, "NaN stays NaN");
	CHECK(sfw_e4m3_from_f32(ldexpf(1, -11)) == 0 && sfw_e4m3_from_f32(nextafterf(ldexpf(1, -10), 1)) == 1 &&
		  sfw_e4m3_from_f32(ldexpf(1, -10)) == 0,
	      "below half the least subnormal: zero; the midpoint 2^-10 to even (zero)");
}

static uint32_t rng = 12345;
static float frand(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)((rng >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* one head of hd values of magnitude about `mag`, some tiny */
static void head_fill(float *x, int hd, float mag)
{
	for (int i = 0; i < hd; i++)
		x[i] = frand() * mag * (i % 7 == 0 ? 1e-4f : 1.0f);
}

static void round_trip(void)
{
	enum { NKV = 2, HD = 128, T = 70 };
	static float k[T * NKV * HD], v[T * NKV * HD], kr[T * NKV * HD], vr[T * NKV * HD];
	const float mags[] = {1.0f, 300.0f, 1e-3f, 6e4f, 0.0f};
	for (int t = 0; t < T; t++)
		for (int g = 0; g < NKV; g++) {
			head_fill(k + ((size_t)t * NKV + g) * HD, HD, mags[(t + g) % 5]);
			head_fill(v + ((size_t)t * NKV + g) * HD, HD, mags[(t + 2 * g + 1) % 5]);
		}
	size_t bytes = sfw_kv8_bytes(T, NKV, HD);
	CHECK(bytes == 3 * (size_t)32 * NKV * (HD + 4), "70 rows take 3 groups of 32");
	uint8_t *kc = calloc(1, bytes), *vc = calloc(1, bytes);
	/* two calls, one across a group's end */
	sfw_op_kv8_write_cpu(kc, vc, k, v, 40, NKV, HD, 0, NULL);
	sfw_op_kv8_write_cpu(kc, vc, k + 40 * NKV * HD, v + 40 * NKV * HD, T - 40, NKV, HD, 40, NULL);
	sfw_op_kv8_read_cpu(kr, kc, 0, T, NKV, HD, NULL);
	sfw_op_kv8_read_cpu(vr, vc, 0, T, NKV, HD, NULL);
	int over = 0, amax_bad = 0, zero_bad = 0;
	for (int pass = 0; pass < 2; pass++) {
		const float *x = pass ? v : k, *r = pass ? vr : kr;
		for (size_t h = 0; h < (size_t)T * NKV; h++) {
			float amax = 0;
			size_t at = 0;
			for (int i = 0; i < HD; i++)
				if (fabsf(x[h * HD + i]) > amax)
					amax = fabsf(x[h * HD + i]), at = (size_t)i;
			if (amax == 0) {
				for (int i = 0; i < HD; i++)
					zero_bad += r[h * HD + i] != 0;
				continue;
			}
			double s = amax / 448.0;
			for (int i = 0; i < HD; i++) {
				double xi = x[h * HD + i], e = fabs(r[h * HD + i] - xi);
				double tol = fmax(fabs(xi) * 0x1p-4, s * 0x1p-10) * (1 + 1e-6) + 1e-30;
				over += e > tol;
			}
			amax_bad += fabsf(r[h * HD + at] - x[h * HD + at]) > 2 * (nextafterf(amax, INFINITY) - amax);
		}
	}
	CHECK(over == 0, "every value read back within half a step (%d over)", over);
	CHECK(amax_bad == 0, "each head's largest value read back within 2 ulp (%d not)", amax_bad);
	CHECK(zero_bad == 0, "a zero head reads back as zeros");
	/* the round in place (the CPU backend's fp8 cache) gives the same values */
	int same = 0;
	for (size_t h = 0; h < (size_t)T * NKV; h++) {
		float tmp[HD];
		memcpy(tmp, k + h * HD, sizeof(tmp));
		sfw_op_kv8_round_cpu(tmp, HD);
		same += memcmp(tmp, kr + h * HD, sizeof(tmp)) == 0;
	}
	CHECK(same == T * NKV, "sfw_op_kv8_round_cpu gives the values a read gives (%d of %d)", same, T * NKV);

	/* paged: blocks of 64 rows (shift 6) in a shuffled pool of 4 blocks */
	int32_t tab[2] = {3, 1};
	struct sfw_pages pg = {tab, 6};
	size_t pbytes = sfw_kv8_bytes(4 * 64, NKV, HD);
	uint8_t *pk = calloc(1, pbytes), *pv = calloc(1, pbytes);
	sfw_op_kv8_write_cpu(pk, pv, k, v, T, NKV, HD, 0, &pg);
	static float pr[T * NKV * HD];
	sfw_op_kv8_read_cpu(pr, pk, 0, T, NKV, HD, &pg);
	CHECK(memcmp(pr, kr, sizeof(pr)) == 0, "a paged cache reads back as the contiguous one");
	/* token 65 lies in block tab[1] = 1: pool row 65, group 2, slot 1 */
	size_t co = sfw_kv8_codes_off(65, 1, NKV, HD), so = sfw_kv8_scale_off(65, 1, NKV, HD);
	size_t gb = 32 * (size_t)NKV * (HD + 4);
	CHECK(co == 2 * gb + (1 * NKV + 1) * HD && so == 2 * gb + 32 * NKV * HD + (1 * NKV + 1) * 4,
	      "the offsets of row 65, head 1");
	CHECK(memcmp(pk + co, kc + sfw_kv8_codes_off(65, 1, NKV, HD), HD) == 0 &&
		  memcmp(pk + so, kc + sfw_kv8_scale_off(65, 1, NKV, HD), 4) == 0,
	      "token 65 of the paged cache (pool row 65) holds the contiguous cache's row 65");
	/* token 3 lies in block tab[0] = 3: pool row 195 */
	CHECK(memcmp(pk + sfw_kv8_codes_off(195, 0, NKV, HD), kc + sfw_kv8_codes_off(3, 0, NKV, HD), HD) == 0 &&
		  memcmp(pk + sfw_kv8_scale_off(195, 0, NKV, HD), kc + sfw_kv8_scale_off(3, 0, NKV, HD), 4) == 0,
	      "token 3 lands at pool row 195 (block 3)");
	free(kc), free(vc), free(pk), free(pv);
}

/* The score records of one golden case with float and fp8 K/V. */
static int golden_pair(const char *dir, struct sfw_record *r[2])
{
	struct sfw_err err = {0};
	char path[4200];
	snprintf(path, sizeof(path), "%s/golden_f32.safetensors", dir);
	struct sfw_st_file *g = NULL;
	if (sfw_st_open(path, &g, &err) != SFW_OK) {
		CHECK(0, "%s: %s", path, err.msg);
		return 1;
	}
	const struct sfw_tensor_info *ids = sfw_st_find(g, "input_ids"), *feed = sfw_st_find(g, "decode.input_ids");
	int rc = 1;
	r[0] = r[1] = NULL;
	for (int kv = 0; ids && feed && kv < 2; kv++) {
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		mp.kv_cache = kv ? SFW_KV_CACHE_FP8 : SFW_KV_CACHE_ACT;
		struct sfw_model *m = NULL;
		struct sfw_score_params sp = {ids->data, (size_t)ids->nelem, (int)feed->nelem, feed->data, 1,
					      sfw_ctx_default_params()};
		enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
		if (s == SFW_OK)
			s = sfw_score_run(m, &sp, &r[kv], &err);
		CHECK(s == SFW_OK, "%s (kv %d): %s", dir, kv, err.msg);
		sfw_model_free(m);
		rc = s != SFW_OK;
	}
	sfw_st_close(g);
	return rc;
}

static void golden_accuracy(void)
{
	const char *gdir = check_golden_dir();
	if (!gdir) /* one FAIL line said so */
		return;
	const char *cases[] = {"tiny-dense", "tiny-sparse", "tiny-cross"};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/%s", gdir, cases[i]);
		struct sfw_record *r[2];
		if (golden_pair(dir, r) == 0) {
			const char *names[] = {"prefill.logits", "decode.logits"};
			for (int k = 0; k < 2; k++) {
				const struct sfw_record_tensor *a = sfw_record_find(r[0], names[k]),
							       *b = sfw_record_find(r[1], names[k]);
				int same = a && b && a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1];
				CHECK(same, "%s: %s in both runs, of one shape", cases[i], names[k]);
				if (!same)
					continue;
				long long rows = a->shape[0];
				struct cmp_logits c = cmp_logits(a->data, b->data, rows, a->shape[1]);
				printf("  %s %s: fp8 K/V vs float K/V: logits max rel %.3g, top-1 %lld / %lld rows (%lld rows "
				       "with a top-2 gap under the largest difference)\n",
				       cases[i], names[k], c.rel, c.agree, rows, c.close);
				CHECK(c.rel > 0, "%s %s: fp8 changes the logits (the cache is rounded)", cases[i], names[k]);
				CHECK(c.rel < 0.02, "%s %s: logits within 2%% of their scale (%.3g)", cases[i], names[k], c.rel);
				CHECK(c.agree * 100 >= rows * 99, "%s %s: top-1 agrees on 99%% of rows (%lld / %lld)", cases[i],
				      names[k], c.agree, rows);
			}
		}
		sfw_record_free(r[0]);
		sfw_record_free(r[1]);
	}
}

int main(void)
{
	decode_all();
	half_bits_all();
	encode_all();
	round_trip();
	golden_accuracy();
	return CHECK_REPORT("test_kv8");
}
