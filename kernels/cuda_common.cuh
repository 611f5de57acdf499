/* cuda_common.cuh - shared by every kernels/ *.cu files: the CUDA fault check,
 * warp/block reductions, bf16 helpers and the fp8 (E4M3) KV cache's decode.
 * Device code only sees raw uint16_t bf16 storage and uint8_t fp8 codes (the
 * same bits the CPU twins use), converted here. */
#ifndef SFW_CUDA_COMMON_CUH
#define SFW_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "kernels/ops_cuda.h"
#include "sfw.h"
}

/* An asynchronous CUDA fault leaves the context unusable: log the statement,
 * function, file, line and device, then abort (docs/style.md §13.4c). Recoverable
 * failures (cudaMalloc out of memory) go through sfw_fail instead. */
#define SFW_CUDA_CHECK(stmt)                                                                              \
	do {                                                                                              \
		cudaError_t e_ = (stmt);                                                                  \
		if (e_ != cudaSuccess) {                                                                  \
			int d_ = -1;                                                                      \
			cudaGetDevice(&d_);                                                               \
			fprintf(stderr, "salafw: CUDA error %s (%s)\n  in '%s'\n  at %s:%d (%s), device %d\n", \
				cudaGetErrorName(e_), cudaGetErrorString(e_), #stmt, __FILE__, __LINE__,  \
				__func__, d_);                                                            \
			fflush(stderr);                                                                   \
			abort();                                                                          \
		}                                                                                         \
	} while (0)

/* After every launch: catches bad launch configurations at once. */
#define SFW_CUDA_LAUNCHED() SFW_CUDA_CHECK(cudaGetLastError())

#define SFW_CUDA_STREAM(s) ((cudaStream_t)(s))

static __device__ __forceinline__ float sfwc_warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float sfwc_warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, ≤ 1024); every
 * thread gets the result. `scratch` holds 32 floats of shared memory. */
static __device__ __forceinline__ float sfwc_block_sum(float v, float *scratch)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = sfwc_warp_sum(v);
	__syncthreads(); /* scratch may still be read by a previous call */
	if (lane == 0)
		scratch[wid] = v;
	__syncthreads();
	v = lane < nw ? scratch[lane] : 0.0f;
	return sfwc_warp_sum(v);
}

static __device__ __forceinline__ float sfwc_block_max(float v, float *scratch)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = sfwc_warp_max(v);
	__syncthreads();
	if (lane == 0)
		scratch[wid] = v;
	__syncthreads();
	v = lane < nw ? scratch[lane] : -INFINITY;
	return sfwc_warp_max(v);
}

/* bf16 bits <-> float, round to nearest even with NaN kept quiet: device
 * copies of sfw_bf16_to_f32 / sfw_f32_to_bf16 of num/num.h, which is the law
 * they match bit for bit (so the CPU twins and the kernels round identically). */
static __device__ __forceinline__ float sfwc_bf(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ uint16_t sfwc_tobf(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* float rounded through bf16 (the reference's rounding points). */
static __device__ __forceinline__ float sfwc_rbf(float f)
{
	return sfwc_bf(sfwc_tobf(f));
}

/* The two bf16 halves of a 32-bit word. */
static __device__ __forceinline__ float sfwc_lo(uint32_t w)
{
	return __uint_as_float(w << 16);
}
static __device__ __forceinline__ float sfwc_hi(uint32_t w)
{
	return __uint_as_float(w & 0xffff0000u);
}

/* 8 bf16 values (one 16-byte vector) to float. */
static __device__ __forceinline__ void sfwc_unpack8(uint4 v, float f[8])
{
	f[0] = sfwc_lo(v.x), f[1] = sfwc_hi(v.x), f[2] = sfwc_lo(v.y), f[3] = sfwc_hi(v.y);
	f[4] = sfwc_lo(v.z), f[5] = sfwc_hi(v.z), f[6] = sfwc_lo(v.w), f[7] = sfwc_hi(v.w);
}

static __device__ __forceinline__ uint32_t sfwc_pack2(float a, float b)
{
	return (uint32_t)sfwc_tobf(a) | ((uint32_t)sfwc_tobf(b) << 16);
}

/* 8 floats to 8 bf16 values (one 16-byte vector), each rounded. */
static __device__ __forceinline__ uint4 sfwc_pack8(const float f[8])
{
	return make_uint4(sfwc_pack2(f[0], f[1]), sfwc_pack2(f[2], f[3]), sfwc_pack2(f[4], f[5]), sfwc_pack2(f[6], f[7]));
}

/* ---- fp8 E4M3 codes (kernels/ops.h, "the fp8 KV cache") ----
 * The fast exact decode: two codes to two fp16 halves, then float. sm_89+
 * converts in one instruction (cvt.rn.f16x2.e4m3x2, the codes' values).
 * Older devices place a code's 7 magnitude bits under fp16's exponent and
 * mantissa fields (sfw_e4m3x2_half_bits, kernels/ops.h): every finite code,
 * subnormals included, reads as its value times 2^-8. Both are
 * exact; SFWC_E4M3_H2_UNIT is the factor the halves fall short by, to be
 * multiplied into a row's scale once (exact too: a scale is 0, a normal
 * float at most FLT_MAX / 448, infinite or NaN). SFWC_E4M3_SOFT=1 (a
 * compiler flag) takes the bit form on every device, to run the older
 * devices' path on a newer one; test_kv8 checks the bit form for every pair
 * of codes on the CPU. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !SFWC_E4M3_SOFT
#define SFWC_E4M3_HW 1
#else
#define SFWC_E4M3_HW 0
#endif
#if SFWC_E4M3_HW
#define SFWC_E4M3_H2_UNIT 1.0f
#else
#define SFWC_E4M3_H2_UNIT 256.0f
#endif

/* The codes in bits 0-7 (low half) and 8-15 (high half) of c2 as fp16
 * bits, valued code / SFWC_E4M3_H2_UNIT. */
static __device__ __forceinline__ uint32_t sfwc_e4m3x2_h2(uint32_t c2)
{
#if SFWC_E4M3_HW
	uint32_t h;
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)c2));
	return h;
#else
	return sfw_e4m3x2_half_bits(c2); /* (kernels/ops.h; test_kv8 checks every pair of codes) */
#endif
}

/* The two values of sfwc_e4m3x2_h2's halves times su, each product
 * rounded once (__fmul_rn: never fused into a later add). With su = s *
 * SFWC_E4M3_H2_UNIT that is sfw_e4m3_to_f32(code) * s, bit for bit. */
static __device__ __forceinline__ float2 sfwc_e4m3x2_mul(uint32_t c2, float su)
{
	uint32_t h = sfwc_e4m3x2_h2(c2);
	__half2_raw r;
	r.x = (unsigned short)(h & 0xffffu), r.y = (unsigned short)(h >> 16);
	float2 f = __half22float2(__half2(r));
	return make_float2(__fmul_rn(f.x, su), __fmul_rn(f.y, su));
}

/* 8 codes (c's bytes, lowest first) to their values times s (su = s *
 * SFWC_E4M3_H2_UNIT), as sfw_op_kv8_read_cpu reads them. */
static __device__ __forceinline__ void sfwc_e4m3x8_f32(uint2 c, float su, float f[8])
{
	float2 a = sfwc_e4m3x2_mul(c.x, su), b = sfwc_e4m3x2_mul(c.x >> 16, su);
	float2 d = sfwc_e4m3x2_mul(c.y, su), e = sfwc_e4m3x2_mul(c.y >> 16, su);
	f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = d.x, f[5] = d.y, f[6] = e.x, f[7] = e.y;
}

/* One code's value times s (su = s * SFWC_E4M3_H2_UNIT). */
static __device__ __forceinline__ float sfwc_e4m3_mul(uint8_t c, float su)
{
	return sfwc_e4m3x2_mul(c, su).x;
}

/* Streaming 16-byte load that does not allocate in L1: weights are read once
 * per token, so they should not evict the activations. */
static __device__ __forceinline__ uint4 sfwc_ld_stream(const uint4 *p)
{
	uint4 r;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
		     : "l"(p));
	return r;
}

/* Programmatic dependent launch (sm_90+): a kernel launched through
 * sfwc_launch may start while the previous kernel of the stream runs, so its
 * launch, block scheduling and anything that does not depend on that kernel
 * (the GEMV's first weight loads) overlap the other's tail (decode runs
 * ~450 small dependent kernels per token). Every such kernel calls
 * sfwc_pdl_wait() before touching memory the previous kernels write: that
 * waits for the previous grid to finish and see its writes. It then lets the
 * next kernel launch at once: all of this grid's blocks are running by then,
 * so the next one's blocks only take free slots, and they wait in turn.
 * SALAFW_CUDA_PDL=0 turns it off. */
static __device__ __forceinline__ void sfwc_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The context's multiprocessor count, or the current device's when it has
 * none (kernels/linear.cu). */
int sfwi_cuda_sms(const struct sfw_cuda_ctx *cx);
/* The shared-memory limit of top-k's kernels raised on the current device:
 * the bytes of keys one block may hold, 0 when refused (kernels/infllm.cu) */
size_t sfwi_topk_smem_prepare(void);

/* The current device, for memos of per-device driver state (a kernel's
 * shared-memory limit is set once per device, as the driver keeps it). */
#define SFWC_MAX_DEVICES 64
static inline int sfwc_device(void)
{
	int d = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&d));
	SFW_ASSERT(d >= 0 && d < SFWC_MAX_DEVICES);
	return d;
}

/* sm_90+ */
static inline int sfwc_pdl_enabled(void)
{
	int dev = 0, major = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&dev));
	SFW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
	return major >= 9;
}

template <typename... KArgs, typename... Args>
static inline void sfwc_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
			       Args... args)
{
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = s;
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = sfwc_pdl_enabled();
	cfg.attrs = at;
	cfg.numAttrs = 1;
	SFW_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, (KArgs)args...));
}

static inline unsigned sfwc_blocks(size_t n, unsigned threads)
{
	return (unsigned)((n + threads - 1) / threads);
}

#endif
