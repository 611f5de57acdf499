/* num.h - the number formats every layer shares: the one dtype enum and the
 * one copy of the bf16/f16 <-> f32 conversions on the host. The int8 weight
 * layout is num/w8_layout.h. Header-only; below kernels/ (it depends on
 * nothing but the C library), so kernels/, formats/, runner/ and quant/ all
 * read it and none of them owns it.
 *
 * The CUDA device helpers (kernels/cuda_common.cuh sfwc_bf, sfwc_tobf) are
 * device code of their own but must compute exactly these functions: the CPU
 * twins and the CUDA kernels round identically because both follow this file. */
#ifndef SFW_NUM_H
#define SFW_NUM_H

#include <stdint.h>

/* Element types of tensors: of safetensors files (formats/safetensors.h reads
 * and writes BF16 F16 F32 I8 U8 I32 I64) and of the ops' weights and
 * activations (kernels/ops.h: F32, BF16, W8, F16). The values are fixed:
 * F32 = 0 and BF16 = 1 index per-dtype tables (tests/gpu_ops.c), and
 * kernels/linear_w8.cu asserts the scale dtype codes F32, BF16, F16. */
enum sfw_dtype {
	SFW_DTYPE_F32 = 0,
	SFW_DTYPE_BF16 = 1,
	/* int8 weights, compressed-tensors pack-quantized (num/w8_layout.h): codes
	 * q + 128 as bytes, rows of ceil(K/4)*4 bytes, plus a scale tensor. Only
	 * sfw_op_matmul_w8_* read them; the bf16/f32 ops never do. Not a
	 * safetensors dtype: a file stores the codes packed in I32. */
	SFW_DTYPE_W8 = 2,
	SFW_DTYPE_F16 = 3, /* ops: scale tensors of third-party checkpoints only */
	SFW_DTYPE_I8 = 4,
	SFW_DTYPE_U8 = 5,
	SFW_DTYPE_I32 = 6,
	SFW_DTYPE_I64 = 7,
	SFW_DTYPE__COUNT
};

/* bf16 bits -> float (exact). */
static inline float sfw_bf16_to_f32(uint16_t h)
{
	union {
		uint32_t u;
		float f;
	} v = {.u = (uint32_t)h << 16};
	return v.f;
}

/* float -> bf16 bits: round to nearest even; a NaN stays a NaN, made quiet
 * (never rounded into an infinity). */
static inline uint16_t sfw_f32_to_bf16(float f)
{
	union {
		float f;
		uint32_t u;
	} v = {.f = f};
	if ((v.u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((v.u >> 16) | 0x40);
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}

/* IEEE half bits -> float (exact: every half is a float; subnormals are
 * normalised, NaN payloads kept). */
static inline float sfw_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13);
	} else if (exp != 0) {
		u = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		u = sign;
	} else { /* subnormal: normalise */
		int e = -1;
		do {
			e++;
			man <<= 1;
		} while (!(man & 0x400));
		u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
	}
	union {
		uint32_t u;
		float f;
	} v = {.u = u};
	return v.f;
}

#endif
