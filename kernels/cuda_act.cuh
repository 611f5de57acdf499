/* cuda_act.cuh - activation-dtype plumbing for the CUDA twins of ops.h:
 * kernels are templates over the activation storage type A (float for
 * SFW_OP_F32, uint16_t bf16 bits for SFW_OP_BF16). act_round<A> is the
 * reference's bf16 rounding point: identity in float mode. */
#ifndef SFW_CUDA_ACT_CUH
#define SFW_CUDA_ACT_CUH

#include "cuda_common.cuh"

extern "C" {
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
}

static __device__ __forceinline__ float act_ld(const float *p, size_t i)
{
	return p[i];
}
static __device__ __forceinline__ float act_ld(const uint16_t *p, size_t i)
{
	return sfwc_bf(p[i]);
}
static __device__ __forceinline__ void act_st(float *p, size_t i, float v)
{
	p[i] = v;
}
static __device__ __forceinline__ void act_st(uint16_t *p, size_t i, float v)
{
	p[i] = sfwc_tobf(v);
}

template <typename A> static __device__ __forceinline__ float act_round(float v);
template <> __device__ __forceinline__ float act_round<float>(float v)
{
	return v;
}
template <> __device__ __forceinline__ float act_round<uint16_t>(float v)
{
	return sfwc_rbf(v);
}

/* 8 consecutive activations as raw bits: one 16-byte load in bf16, two in
 * f32 (8-element aligned addresses only). */
template <typename A> struct vec8;
template <> struct vec8<uint16_t> {
	uint4 v;
	__device__ __forceinline__ void load(const uint16_t *p) { v = __ldg((const uint4 *)p); }
	__device__ __forceinline__ void zero() { v = make_uint4(0, 0, 0, 0); }
	__device__ __forceinline__ void to_f32(float *f) const { sfwc_unpack8(v, f); }
};
template <> struct vec8<float> {
	float4 a, b;
	__device__ __forceinline__ void load(const float *p)
	{
		a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
	}
	__device__ __forceinline__ void zero() { a = b = make_float4(0, 0, 0, 0); }
	__device__ __forceinline__ void to_f32(float *f) const
	{
		f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
	}
};

/* Weight element i, stored as bf16 or f32. */
static __device__ __forceinline__ float wget(const void *w, enum sfw_op_dtype dt, size_t i)
{
	return dt == SFW_OP_BF16 ? sfwc_bf(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Runs the statement with A bound to the activation storage type. */
#define ACT_DISPATCH(act, ...)                                                                           \
	do {                                                                                              \
		if ((act) == SFW_OP_BF16) {                                                               \
			typedef uint16_t A;                                                               \
			__VA_ARGS__;                                                                             \
		} else {                                                                                  \
			typedef float A;                                                                  \
			__VA_ARGS__;                                                                             \
		}                                                                                         \
	} while (0)

/* Scratch memory and the cuBLASLt handle the twins share (kernels/cuda_rt.cu). */
void *sfwi_cuda_scratch(size_t bytes);
/* The one-block-per-row RMSNorm takes its 8-wide form (elementwise.cu). */
bool sfwi_rmsnorm_vec_ok(const void *y, const void *x, int n, enum sfw_op_dtype act);
struct sfw_cuda_blas *sfwi_cuda_blas(void);
void sfwi_rope_neox_cuda(void *x, int T, int nh, int hd, int64_t pos0, const int64_t *dpos, float theta,
			 enum sfw_op_dtype act, void *stream);

#endif
