/* sample_twin.h - (kernels-internal) the arithmetic that kernels/sample.c and
 * kernels/sample.cu must share bit for bit: the weight exp() and the
 * candidate ordering key. Plain C, compiled by the C compiler and by nvcc
 * (as __host__ __device__). Multiplications go through SFWS_MUL so nvcc
 * cannot fuse them into an FMA that the host does not do. */
#ifndef SFW_SAMPLE_TWIN_H
#define SFW_SAMPLE_TWIN_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SFWS_FN static __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define SFWS_MUL(a, b) __fmul_rn((a), (b))
#define SFWS_SUB(a, b) __fsub_rn((a), (b))
#else
#define SFWS_MUL(a, b) ((a) * (b))
#define SFWS_SUB(a, b) ((a) - (b))
#endif
#else
#define SFWS_FN static inline
#define SFWS_MUL(a, b) ((a) * (b))
#define SFWS_SUB(a, b) ((a) - (b))
#endif

/* Threads of the CUDA kernel = contiguous chunks of the vocabulary that the
 * full-vocabulary sums are split into (the CPU twin sums the same way). */
#define SFWS_THREADS 1024
/* Most survivors the CUDA kernel sorts; beyond it the host finishes. */
#define SFWS_MAX_SORT 1024

/* exp(x) for x <= 0 (weights relative to the max), the same float result on
 * host and device: exp(x) = 2^n * p(f), x*log2(e) = n + f, f in [0, 1),
 * p the degree-7 Taylor polynomial of e^(f ln2) through fmaf (correctly
 * rounded on both). Relative error < 2e-6, which moves no sampling
 * meaningfully; 0 below e^-87. */
SFWS_FN float sfws_exp(float x)
{
	if (!(x > -87.0f))
		return 0.0f;
	float t = SFWS_MUL(x, 1.44269504088896341f);
	float n = floorf(t);
	float f = SFWS_SUB(t, n); /* [0, 1) */
	/* 2^f = e^(f ln2): Taylor in g = f*ln2 up to g^7 */
	float g = SFWS_MUL(f, 0.693147180559945309f);
	float p = 1.0f / 5040.0f;
	p = fmaf(p, g, 1.0f / 720.0f);
	p = fmaf(p, g, 1.0f / 120.0f);
	p = fmaf(p, g, 1.0f / 24.0f);
	p = fmaf(p, g, 1.0f / 6.0f);
	p = fmaf(p, g, 0.5f);
	p = fmaf(p, g, 1.0f);
	p = fmaf(p, g, 1.0f);
	return ldexpf(p, (int)n);
}

/* Larger key = better candidate: larger logit, then lower id (the sampler's
 * order). Only for candidates (not NaN, not -inf). */
SFWS_FN uint64_t sfws_key(float l, int32_t id)
{
	uint32_t u;
	memcpy(&u, &l, 4);
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ((uint64_t)u << 32) | (uint32_t)(0x7fffffff - id);
}

SFWS_FN float sfws_key_logit(uint64_t k)
{
	uint32_t u = (uint32_t)(k >> 32);
	u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
	float l;
	memcpy(&l, &u, 4);
	return l;
}

SFWS_FN int32_t sfws_key_id(uint64_t k)
{
	return 0x7fffffff - (int32_t)(uint32_t)(k & 0xffffffffu);
}

#endif
