/* fused.cu - CUDA fused ops (CPU twins: kernels/fused.c). Each computes
 * exactly what the unfused kernels compute, with the same rounding points
 * and the same reduction order, so fused and unfused results are equal bit
 * for bit; the gain is launches (decode runs ~600 small kernels a token). */
#include "cuda_act.cuh"

extern "C" {
#include "kernels/ops.h"
}

/* x += round(scale*b) (rounded to the activation type, as add_scaled_kernel),
 * then rmsnorm_block_kernel's arithmetic on the new x. One 512-thread block
 * per row; each thread re-reads only the elements it wrote itself. */
template <typename T>
static __global__ void add_rmsnorm_kernel(T *y, T *x, const T *b, float scale, const void *w, enum sfw_op_dtype wdt,
					  int n, float eps)
{
	sfwc_pdl_wait();
	__shared__ float red[32];
	T *xr = x + (size_t)blockIdx.x * n;
	const T *br = b + (size_t)blockIdx.x * n;
	T *yr = y + (size_t)blockIdx.x * n;
	float ss = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		act_st(xr, i, act_ld(xr, i) + act_round<T>(scale * act_ld(br, i)));
		float v = act_ld(xr, i);
		ss = fmaf(v, v, ss);
	}
	ss = sfwc_block_sum(ss, red);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		act_st(yr, i, act_round<T>(act_ld(xr, i) * inv) * wget(w, wdt, i));
}

extern "C" void sfw_op_add_rmsnorm_cuda(void *y, void *x, const void *b, float scale, const void *w,
					enum sfw_op_dtype wdt, int rows, int n, float eps, enum sfw_op_dtype act,
					void *stream)
{
	if (rows <= 0)
		return;
	/* the shape sfw_op_rmsnorm_cuda runs with its block kernel; other shapes
	 * (prefill) take the two unfused launches */
	if (!(n >= 1024 && rows < 1024)) {
		sfw_op_add_scaled_cuda(x, b, (size_t)rows * (size_t)n, scale, act, stream);
		sfw_op_rmsnorm_cuda(y, x, w, wdt, rows, n, eps, act, stream);
		return;
	}
	ACT_DISPATCH(act, sfwc_launch(add_rmsnorm_kernel<A>, dim3(rows), dim3(512), 0, SFW_CUDA_STREAM(stream), (A *)y,
				      (A *)x, (const A *)b, scale, w, wdt, n, eps));
	SFW_CUDA_LAUNCHED();
}
