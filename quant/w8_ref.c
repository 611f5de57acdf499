/* w8_ref.c - the reference int8 group quantizer (num/w8_layout.h): plain C,
 * float32, round half to even. Every model file salafw writes comes from
 * here; tests/ref/awq_ref.py computes the same bytes independently. */
#include "num/num.h"
#include "quant/quant.h"
#include "simd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The stored scale (bf16 bits) and its value for a group whose max |w| is
 * amax (finite). */
static void scale_of(float amax, uint16_t *bits, float *value)
{
	float s = amax / SFW_QL_SCALE_DIV;
	if (s < SFW_QL_SCALE_MIN)
		s = SFW_QL_SCALE_MIN;
	*bits = sfw_f32_to_bf16(s);
	*value = sfw_bf16_to_f32(*bits); /* divide by the scale as stored */
	/* bf16 rounding may have lowered the scale so far that amax lands past
	 * 127.5 steps (e.g. amax = 1: 1/127.5 rounds to 2^-7, and 1/2^-7 = 128
	 * would be clamped to 127, almost a step off): one bf16 ulp up (it
	 * suffices: rounding lowers by at most half an ulp) keeps every weight
	 * within half a step of its code */
	if (amax / *value > SFW_QL_SCALE_DIV) {
		(*bits)++;
		*value = sfw_bf16_to_f32(*bits);
	}
}

/* The group's stored scale (bf16 bits) and its value; -1 on NaN/inf. */
static int group_scale(const float *w, int64_t n, uint16_t *bits, float *value)
{
	float amax = 0.0f;
	for (int64_t k = 0; k < n; k++) {
		if (!isfinite(w[k]))
			return -1;
		float a = fabsf(w[k]);
		amax = a > amax ? a : amax;
	}
	scale_of(amax, bits, value);
	return 0;
}

static inline int quant_one(float w, float sd)
{
	float q = rintf(w / sd); /* default rounding mode: half to even */
	if (q < (float)SFW_QL_QMIN)
		q = (float)SFW_QL_QMIN;
	if (q > (float)SFW_QL_QMAX)
		q = (float)SFW_QL_QMAX;
	return (int)q;
}

/* One group of n weights -> n codes and its bf16 scale. */
static int quant_group(const float *w, int64_t n, uint8_t *codes, uint16_t *scale)
{
	float sd;
	if (group_scale(w, n, scale, &sd) != 0)
		return -1;
	for (int64_t k = 0; k < n; k++)
		codes[k] = (uint8_t)(quant_one(w[k], sd) + SFW_QL_BIAS);
	return 0;
}

int sfw_quant_row_w8_ref(const float *w, int64_t K, int group, uint8_t *codes, uint16_t *scales)
{
	int64_t span = sfw_ql_group_span(K, group), G = sfw_ql_ngroups(K, group);
	for (int64_t g = 0; g < G; g++) {
		int64_t k0 = g * span, n = K - k0 < span ? K - k0 : span;
		if (quant_group(w + k0, n, codes + k0, scales + g) != 0)
			return -1;
	}
	memset(codes + K, 0, (size_t)(sfw_ql_row_bytes(K) - K));
	return 0;
}

void sfw_quant_dequant_row_w8(const uint8_t *codes, const uint16_t *scales, int64_t K, int group, float *out)
{
	int64_t span = sfw_ql_group_span(K, group);
	for (int64_t k = 0; k < K; k++)
		out[k] = sfw_ql_dequant(codes[k], sfw_bf16_to_f32(scales[k / span]));
}

/* The fake quantizer runs inside the AWQ search (21 candidates over every
 * weight of the model), so its groups of whole 8-float vectors take a vector
 * path with the same bits as quant_one: w / sd is the same IEEE division;
 * |w / sd| <= 127.5 after group_scale, where adding and subtracting 1.5 *
 * 2^23 rounds to the nearest integer, ties to even, as rintf does (and
 * gives +0, as the int conversion does); the clamp to [-128, 127] and the
 * product are exact. GCC also builds an AVX2 clone, chosen at load time. */

typedef float w8v8f __attribute__((vector_size(32)));
typedef int32_t w8v8i __attribute__((vector_size(32)));

/* One group of n (a multiple of 8) finite-checked weights: its scale, then
 * quantize-dequantize in place; -1 on NaN/inf. */
SFW_CLONES
static int fake_group_v8(float *w, int64_t n)
{
	/* amax and finiteness on the bits: |w| as an int orders as the float */
	const w8v8i absm = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
			     0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
	const w8v8i infb = {0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000,
			     0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000};
	w8v8i mx = {0}, bad = {0};
	for (int64_t k = 0; k < n; k += 8) {
		w8v8i b;
		memcpy(&b, w + k, 32);
		b &= absm;
		bad |= b >= infb;
		w8v8i gt = b > mx;
		mx = (b & gt) | (mx & ~gt);
	}
	int32_t m = 0;
	for (int i = 0; i < 8; i++) {
		if (bad[i])
			return -1;
		m = mx[i] > m ? mx[i] : m;
	}
	float amax;
	memcpy(&amax, &m, 4);
	/* the scale as group_scale makes it (amax is the same float) */
	uint16_t bits;
	float sd;
	scale_of(amax, &bits, &sd);
	const float M = 12582912.0f; /* 1.5 * 2^23 */
	const w8v8f vM = {M, M, M, M, M, M, M, M}, vs = {sd, sd, sd, sd, sd, sd, sd, sd};
	const w8v8f hi = {127, 127, 127, 127, 127, 127, 127, 127}, lo = {-128, -128, -128, -128, -128, -128, -128, -128};
	for (int64_t k = 0; k < n; k += 8) {
		w8v8f x;
		memcpy(&x, w + k, 32);
		w8v8f q = (x / vs + vM) - vM;
		w8v8i qi, hb, lb;
		memcpy(&qi, &q, 32), memcpy(&hb, &hi, 32), memcpy(&lb, &lo, 32);
		w8v8i over = q > hi, under = q < lo;
		qi = (qi & ~over) | (hb & over);
		qi = (qi & ~under) | (lb & under);
		memcpy(&q, &qi, 32);
		x = q * vs;
		memcpy(w + k, &x, 32);
	}
	return 0;
}

int sfw_quant_fake_row_w8(float *w, int64_t K, int group)
{
	int64_t span = sfw_ql_group_span(K, group), G = sfw_ql_ngroups(K, group);
	for (int64_t g = 0; g < G; g++) {
		int64_t k0 = g * span, n = K - k0 < span ? K - k0 : span;
		if (n % 8 == 0) {
			if (fake_group_v8(w + k0, n) != 0)
				return -1;
			continue;
		}
		uint16_t bits;
		float sd;
		if (group_scale(w + k0, n, &bits, &sd) != 0)
			return -1;
		for (int64_t k = 0; k < n; k++)
			w[k0 + k] = (float)quant_one(w[k0 + k], sd) * sd;
	}
	return 0;
}
