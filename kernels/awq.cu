/* awq.cu - the AWQ scale search's arithmetic on the GPU (kernels/awq_cuda.h).
 *
 * Bit-for-bit twins of the CPU search: every product, quotient and sum is an
 * explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, the
 * double ones), which nvcc never contracts into an FMA (the C side is built
 * with -std=c11, where GCC contracts nothing either), and every sum runs in
 * the C twin's order. Maxima are exact in any order. */
#include "cuda_common.cuh"

extern "C" {
#include "kernels/awq_cuda.h"
#include "num/w8_layout.h"
}

#define FULL_MASK 0xffffffffu

/* ---- float copies of the weights ------------------------------------------ */

__global__ void awq_to_f32_kernel(float *W, const void *w, int bf16, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		W[i] = bf16 ? __uint_as_float((uint32_t)((const uint16_t *)w)[i] << 16) : ((const float *)w)[i];
}

static unsigned grid_for(size_t n, unsigned block)
{
	size_t g = (n + block - 1) / block;
	return g > 65535u * 16 ? 65535u * 16 : (unsigned)(g ? g : 1);
}

extern "C" void sfw_cuda_awq_to_f32(float *W, const void *w, enum sfw_dtype wdt, size_t n, void *stream)
{
	if (n == 0)
		return;
	awq_to_f32_kernel<<<grid_for(n, 256), 256, 0, SFW_CUDA_STREAM(stream)>>>(W, w, wdt == SFW_DTYPE_BF16, n);
	SFW_CUDA_LAUNCHED();
}

/* ---- the duo statistic ----------------------------------------------------- */

/* |w| > mx ? |w| : mx from 0, as the C twin: NaN never wins, so the max is
 * the same in any order. */
static __device__ __forceinline__ float awq_amax(float mx, float a)
{
	return a > mx ? a : mx;
}

static __device__ __forceinline__ float awq_warp_amax(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = awq_amax(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

/* One warp per (row, group). */
__global__ void awq_gmax_kernel(float *gmax, const float *W, int N, int K, int span, int G)
{
	long long wid = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (wid >= (long long)N * G)
		return;
	int r = (int)(wid / G), g = (int)(wid % G);
	int k0 = g * span, n = K - k0 < span ? K - k0 : span;
	const float *w = W + (size_t)r * K + k0;
	float mx = 0.0f;
	for (int i = lane; i < n; i += 32)
		mx = awq_amax(mx, fabsf(w[i]));
	mx = awq_warp_amax(mx);
	if (lane == 0)
		gmax[wid] = mx;
}

/* One thread per column, the rows in order (the C twin's order). */
__global__ void awq_duo_sum_kernel(float *wm, const float *gmax, const float *W, int N, int K, int span, int G)
{
	int k = blockIdx.x * blockDim.x + threadIdx.x;
	if (k >= K)
		return;
	int g = k / span;
	float acc = 0.0f;
#pragma unroll 8
	for (int r = 0; r < N; r++) {
		float mx = gmax[(size_t)r * G + g];
		acc = __fadd_rn(acc, mx > 0.0f ? __fdiv_rn(fabsf(W[(size_t)r * K + k]), mx) : 0.0f);
	}
	wm[k] = acc;
}

extern "C" void sfw_cuda_awq_duo(float *wm, float *gmax, const float *W, int N, int K, int span, void *stream)
{
	if (N <= 0 || K <= 0)
		return;
	int G = (K + span - 1) / span;
	size_t warps = (size_t)N * G;
	awq_gmax_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, SFW_CUDA_STREAM(stream)>>>(gmax, W, N, K, span, G);
	SFW_CUDA_LAUNCHED();
	awq_duo_sum_kernel<<<(unsigned)((K + 127) / 128), 128, 0, SFW_CUDA_STREAM(stream)>>>(wm, gmax, W, N, K, span, G);
	SFW_CUDA_LAUNCHED();
}

/* ---- the fake quantizer (quant/w8_ref.c) ----------------------------------- */

/* sfw_f32_to_bf16 (num/num.h): round to nearest even, NaN kept quiet. */
static __device__ __forceinline__ uint32_t awq_bf16_bits(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return ((u >> 16) | 0x40u) & 0xffffu;
	return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
}

static __device__ __forceinline__ float awq_bf16_value(uint32_t bits)
{
	return __uint_as_float(bits << 16);
}

/* One warp per (row, group): the group of W diag s, its scale as
 * w8_ref.c's scale_of makes it, then q = clamp(rint(x / sd)) * sd / s. */
__global__ void awq_fake_kernel(float *Wq, int *bad_row, const float *W, const float *s, int N, int K, int span,
				int G)
{
	long long wid = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (wid >= (long long)N * G)
		return;
	int r = (int)(wid / G), g = (int)(wid % G);
	int k0 = g * span, n = K - k0 < span ? K - k0 : span;
	const float *w = W + (size_t)r * K + k0, *sk = s + k0;
	float *q = Wq + (size_t)r * K + k0;
	float mx = 0.0f;
	int bad = 0;
	for (int i = lane; i < n; i += 32) {
		float x = __fmul_rn(w[i], sk[i]);
		bad |= !isfinite(x);
		mx = awq_amax(mx, fabsf(x));
	}
	if (__any_sync(FULL_MASK, bad)) {
		if (lane == 0)
			atomicMin(bad_row, r);
		return;
	}
	mx = awq_warp_amax(mx);
	float sc = __fdiv_rn(mx, SFW_QL_SCALE_DIV);
	if (sc < SFW_QL_SCALE_MIN)
		sc = SFW_QL_SCALE_MIN;
	uint32_t bits = awq_bf16_bits(sc);
	float sd = awq_bf16_value(bits);
	if (__fdiv_rn(mx, sd) > SFW_QL_SCALE_DIV) /* scale_of's one-ulp bump */
		sd = awq_bf16_value((bits + 1u) & 0xffffu);
	for (int i = lane; i < n; i += 32) {
		float x = __fmul_rn(w[i], sk[i]);
		float v = rintf(__fdiv_rn(x, sd)); /* half to even, as rintf on the CPU */
		if (v < (float)SFW_QL_QMIN)
			v = (float)SFW_QL_QMIN;
		if (v > (float)SFW_QL_QMAX)
			v = (float)SFW_QL_QMAX;
		q[i] = __fdiv_rn(__fmul_rn(v, sd), sk[i]);
	}
}

extern "C" void sfw_cuda_awq_fake(float *Wq, int *bad_row, const float *W, const float *s, int N, int K, int group,
				  void *stream)
{
	SFW_CUDA_CHECK(cudaMemsetAsync(bad_row, 0x7f, sizeof(int), SFW_CUDA_STREAM(stream)));
	if (N <= 0 || K <= 0)
		return;
	int span = (int)sfw_ql_group_span(K, group), G = (int)sfw_ql_ngroups(K, group);
	size_t warps = (size_t)N * G;
	awq_fake_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, SFW_CUDA_STREAM(stream)>>>(Wq, bad_row, W, s, N, K, span,
											     G);
	SFW_CUDA_LAUNCHED();
}

/* ---- the product, summed as kernels/matmul.c sums it -------------------------
 * A block computes a 64 x 64 tile of Y with 512 threads: thread t is lane
 * j = t % 8 of the 8 x 8 outputs at position t / 8, and accumulates, for
 * each of them, x[m, k] * w[n, k] over k = 8i + j in i order (the C twin's
 * vector lane j). The eight lanes of an output sit in eight neighbouring
 * threads of one warp, so three shuffles add them in hsum8's tree; lane 0
 * adds the K % 8 tail in order and writes. The 65-float smem rows keep the
 * reads free of bank conflicts. */
#define MM_B 64
#define MM_BK 64
#define MM_S (MM_BK + 1)

__global__ void __launch_bounds__(512, 1)
    awq_matmul_kernel(float *Y, const float *X, const float *W, int M, int N, int K)
{
	__shared__ float xs[MM_B * MM_S], ws[MM_B * MM_S];
	int t = threadIdx.x, j = t & 7, pos = t >> 3, pn = pos & 7, pm = pos >> 3;
	int m0 = blockIdx.y * MM_B, n0 = blockIdx.x * MM_B;
	int K8 = K & ~7;
	float acc[8][8];
#pragma unroll
	for (int a = 0; a < 8; a++)
#pragma unroll
		for (int b = 0; b < 8; b++)
			acc[a][b] = 0.0f;
	for (int k0 = 0; k0 < K8; k0 += MM_BK) {
		int kl = K8 - k0 < MM_BK ? K8 - k0 : MM_BK; /* a multiple of 8 */
		__syncthreads(); /* the previous tile is read */
		for (int e = t; e < MM_B * MM_BK; e += 512) {
			int row = e / MM_BK, col = e % MM_BK;
			float xv = 0.0f, wv = 0.0f;
			if (col < kl) {
				if (m0 + row < M)
					xv = X[(size_t)(m0 + row) * K + k0 + col];
				if (n0 + row < N)
					wv = W[(size_t)(n0 + row) * K + k0 + col];
			}
			xs[row * MM_S + col] = xv;
			ws[row * MM_S + col] = wv;
		}
		__syncthreads();
		int ni = kl >> 3;
		for (int ii = 0; ii < ni; ii++) {
			float xa[8], wb[8];
#pragma unroll
			for (int a = 0; a < 8; a++)
				xa[a] = xs[(pm * 8 + a) * MM_S + ii * 8 + j];
#pragma unroll
			for (int b = 0; b < 8; b++)
				wb[b] = ws[(pn * 8 + b) * MM_S + ii * 8 + j];
#pragma unroll
			for (int a = 0; a < 8; a++)
#pragma unroll
				for (int b = 0; b < 8; b++)
					acc[a][b] = __fadd_rn(acc[a][b], __fmul_rn(xa[a], wb[b]));
		}
	}
#pragma unroll
	for (int a = 0; a < 8; a++)
#pragma unroll
		for (int b = 0; b < 8; b++) {
			float v = acc[a][b];
			v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, 4)); /* lane j < 4: l_j + l_j+4 */
			v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, 1)); /* 0: (l0+l4)+(l1+l5); 2: (l2+l6)+(l3+l7) */
			v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, 2)); /* 0: the two halves */
			int m = m0 + pm * 8 + a, n = n0 + pn * 8 + b;
			if (j == 0 && m < M && n < N) {
				const float *xr = X + (size_t)m * K, *wr = W + (size_t)n * K;
				for (int k = K8; k < K; k++)
					v = __fadd_rn(v, __fmul_rn(xr[k], wr[k]));
				Y[(size_t)m * N + n] = v;
			}
		}
}

extern "C" void sfw_cuda_awq_matmul(float *Y, const float *X, const float *W, int M, int N, int K, void *stream)
{
	if (M <= 0 || N <= 0)
		return;
	dim3 grid((unsigned)((N + MM_B - 1) / MM_B), (unsigned)((M + MM_B - 1) / MM_B));
	awq_matmul_kernel<<<grid, 512, 0, SFW_CUDA_STREAM(stream)>>>(Y, X, W, M, N, K);
	SFW_CUDA_LAUNCHED();
}

/* ---- the loss: each row's squared error, in double, n in order ----------- */

__global__ void awq_sqerr_kernel(double *part, const float *A, const float *B, int R, int N)
{
	int r = blockIdx.x * blockDim.x + threadIdx.x;
	if (r >= R)
		return;
	const float *a = A + (size_t)r * N, *b = B + (size_t)r * N;
	double t = 0.0;
#pragma unroll 8
	for (int n = 0; n < N; n++) {
		double d = __dsub_rn((double)a[n], (double)b[n]);
		t = __dadd_rn(t, __dmul_rn(d, d));
	}
	part[r] = t;
}

extern "C" void sfw_cuda_awq_sqerr_rows(double *part, const float *A, const float *B, int R, int N, void *stream)
{
	if (R <= 0)
		return;
	awq_sqerr_kernel<<<(unsigned)((R + 31) / 32), 32, 0, SFW_CUDA_STREAM(stream)>>>(part, A, B, R, N);
	SFW_CUDA_LAUNCHED();
}
