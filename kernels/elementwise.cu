/* elementwise.cu - CUDA twins of kernels/elementwise.c (embedding, RMSNorm,
 * scaled residual, SiLU-gate, sigmoid gate, NeoX RoPE). Activations are
 * float (SFW_DTYPE_F32: the same arithmetic as the CPU twin) or bf16
 * (SFW_DTYPE_BF16: rounded where the reference rounds, docs/model-spec.md §2). */
#include "cuda_act.cuh"

extern "C" {
#include "kernels/ops.h"
}

template <typename T>
static __global__ void embed_kernel(T *x, const void *E, enum sfw_dtype edt, const int32_t *ids, int D, float scale)
{
	sfwc_pdl_wait();
	int t = blockIdx.x;
	size_t base = (size_t)ids[t] * D;
	for (int i = threadIdx.x; i < D; i += blockDim.x)
		act_st(x, (size_t)t * D + i, wget(E, edt, base + i) * scale);
}

/* bf16 table and activations, D % 8 == 0, 16-byte aligned: the row as
 * 16-byte vectors, every load of a thread issued before the first store
 * (the scalar loop above left a decode step's one-row lookup at ~8 µs of
 * dependent loads); the same product and rounding per element. */
#define EMB_VPT 4
static __global__ void embed_vec_kernel(uint16_t *x, const uint16_t *E, const int32_t *ids, int D, float scale)
{
	sfwc_pdl_wait();
	int t = blockIdx.x, nv = D / 8;
	const uint4 *er = (const uint4 *)(E + (size_t)ids[t] * D);
	uint4 *xr = (uint4 *)(x + (size_t)t * D);
	for (int v0 = threadIdx.x; v0 < nv; v0 += EMB_VPT * blockDim.x) {
		uint4 e[EMB_VPT];
#pragma unroll
		for (int j = 0; j < EMB_VPT; j++) {
			int v = v0 + j * blockDim.x;
			if (v < nv)
				e[j] = __ldg(er + v);
		}
#pragma unroll
		for (int j = 0; j < EMB_VPT; j++) {
			int v = v0 + j * blockDim.x;
			if (v >= nv)
				break;
			float f[8];
			sfwc_unpack8(e[j], f);
			xr[v] = make_uint4(sfwc_pack2(f[0] * scale, f[1] * scale), sfwc_pack2(f[2] * scale, f[3] * scale),
					   sfwc_pack2(f[4] * scale, f[5] * scale), sfwc_pack2(f[6] * scale, f[7] * scale));
		}
	}
}

extern "C" void sfw_op_embed_cuda(void *x, const void *E, enum sfw_dtype edt, const int32_t *ids, int T, int D,
				  float scale, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (T <= 0)
		return;
	if (act == SFW_DTYPE_BF16 && edt == SFW_DTYPE_BF16 && D % 8 == 0 && !(((uintptr_t)x | (uintptr_t)E) & 15)) {
		sfwc_launch(embed_vec_kernel, dim3(T), dim3(128), 0, SFW_CUDA_STREAM(cx->stream), (uint16_t *)x,
			    (const uint16_t *)E, ids, D, scale);
		SFW_CUDA_LAUNCHED();
		return;
	}
	ACT_DISPATCH(act, sfwc_launch(embed_kernel<A>, dim3(T), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (A *)x, E, edt, ids, D, scale));
	SFW_CUDA_LAUNCHED();
}

/* One warp per row (n ≤ 4096 typical): lanes read 8 strided values at a time.
 * The same thread reads and later writes each element, so y may alias x.
 * VEC (bf16 rows of n >= 1024, n % 8 == 0, aligned: prefill's hidden-size
 * norms): lane-owned 8-element vectors v = lane, lane + 32, ... read with
 * one 16-byte load each. Head-sized rows (n = hd) keep the scalar order,
 * which the fused q/k norm + RoPE kernel reproduces bit for bit. */
template <typename T, bool VEC>
static __global__ void rmsnorm_warp_kernel(T *y, const T *x, const void *w, enum sfw_dtype wdt, int rows, int n,
					   float eps)
{
	sfwc_pdl_wait();
	int lane = threadIdx.x & 31;
	long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= rows)
		return;
	const T *xr = x + (size_t)r * n;
	T *yr = y + (size_t)r * n;
	float ss;
	if constexpr (VEC)
		ss = rms_sumsq_vec8(xr, n, lane, 32);
	else
		ss = rms_sumsq(xr, n, lane, 32);
	ss = sfwc_warp_sum(ss);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	if constexpr (VEC)
		rms_store_vec8(yr, xr, w, wdt, n, inv, lane, 32);
	else
		rms_store(yr, xr, w, wdt, n, inv, lane, 32);
}

/* One block per row for few wide rows (decode: 1 row of 4096): a single warp
 * per row left 31/32 of the GPU idle and cost ~38 µs per call on H200.
 * VEC (bf16, n % 8 == 0, x and y 16-byte aligned: sfwi_rmsnorm_vec_ok): each
 * thread owns 8-element vectors v = tid, tid + blockDim, ... (one 16-byte
 * load per vector instead of eight dependent scalar ones). The fused
 * add + RMSNorm (kernels/fused.cu) walks the same vectors in the same order,
 * so the two give equal bits. */
template <typename T, bool VEC>
static __global__ void rmsnorm_block_kernel(T *y, const T *x, const void *w, enum sfw_dtype wdt, int n, float eps,
					    int regs)
{
	rms_regs R;
	if (VEC && regs) /* (rms_regs_ok) */
		rms_load_w(R, w, wdt, n / 8);
	sfwc_pdl_wait();
	__shared__ float red[32];
	const T *xr = x + (size_t)blockIdx.x * n;
	T *yr = y + (size_t)blockIdx.x * n;
	if constexpr (VEC) {
		if (regs) { /* rms_sumsq_vec8 and rms_store_vec8 on the row read once */
			float ss = sfwc_block_sum(rms_load_row(R, (const uint16_t *)xr, n / 8), red);
			rms_store_regs(yr, R, 1.0f / sqrtf(ss / (float)n + eps), n / 8);
			return;
		}
	}
	float ss;
	if constexpr (VEC)
		ss = rms_sumsq_vec8(xr, n, threadIdx.x, blockDim.x);
	else
		ss = rms_sumsq(xr, n, threadIdx.x, blockDim.x);
	ss = sfwc_block_sum(ss, red);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	if constexpr (VEC)
		rms_store_vec8(yr, xr, w, wdt, n, inv, threadIdx.x, blockDim.x);
	else
		rms_store(yr, xr, w, wdt, n, inv, threadIdx.x, blockDim.x);
}

bool sfwi_rmsnorm_vec_ok(const void *y, const void *x, int n, enum sfw_dtype act)
{
	return act == SFW_DTYPE_BF16 && n % 8 == 0 && !(((uintptr_t)y | (uintptr_t)x) & 15);
}

extern "C" void sfw_op_rmsnorm_cuda(void *y, const void *x, const void *w, enum sfw_dtype wdt, int rows, int n,
				    float eps, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (rows <= 0)
		return;
	if (n >= 1024 && rows < 1024) {
		if (sfwi_rmsnorm_vec_ok(y, x, n, act))
			sfwc_launch(rmsnorm_block_kernel<uint16_t, true>, dim3(rows), dim3(512), 0, SFW_CUDA_STREAM(cx->stream),
				    (uint16_t *)y, (const uint16_t *)x, w, wdt, n, eps, (int)rms_regs_ok(w, wdt, n, 512));
		else
			ACT_DISPATCH(act, sfwc_launch(rmsnorm_block_kernel<A, false>, dim3(rows), dim3(512), 0,
						      SFW_CUDA_STREAM(cx->stream), (A *)y, (const A *)x, w, wdt, n, eps, 0));
		SFW_CUDA_LAUNCHED();
		return;
	}
	unsigned blocks = (unsigned)((rows + 7) / 8);
	if (n >= 1024 && sfwi_rmsnorm_vec_ok(y, x, n, act))
		sfwc_launch(rmsnorm_warp_kernel<uint16_t, true>, dim3(blocks), dim3(256), 0, SFW_CUDA_STREAM(cx->stream),
			    (uint16_t *)y, (const uint16_t *)x, w, wdt, rows, n, eps);
	else
		ACT_DISPATCH(act, sfwc_launch(rmsnorm_warp_kernel<A, false>, dim3(blocks), dim3(256), 0,
					      SFW_CUDA_STREAM(cx->stream), (A *)y, (const A *)x, w, wdt, rows, n, eps));
	SFW_CUDA_LAUNCHED();
}

template <typename T>
static __global__ void add_scaled_kernel(T *x, const T *b, size_t n, float scale)
{
	sfwc_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		act_st(x, i, act_ld(x, i) + act_round<T>(scale * act_ld(b, i)));
}

static unsigned grid_for(size_t n)
{
	size_t b = (n + 255) / 256;
	return (unsigned)(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b);
}

/* bf16, 8 elements per thread (16-byte loads and stores): the same
 * per-element arithmetic as the scalar kernels below and above, so the same
 * bits; the scalar forms ran prefill's 134M-element SiLU gate at about a
 * third of the memory bandwidth. Plain (coherent) loads: y may alias an input. */
enum { EW_ADD_SCALED, EW_SILU_MUL, EW_SIGMOID_MUL };

template <int OP>
static __global__ void ew8_kernel(uint4 *y, const uint4 *a, const uint4 *b, size_t n8, float scale)
{
	sfwc_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
		float fa[8], fb[8], o[8];
		sfwc_unpack8(a[i], fa);
		sfwc_unpack8(b[i], fb);
#pragma unroll
		for (int j = 0; j < 8; j++) {
			if (OP == EW_ADD_SCALED) /* a = x, b = the addend */
				o[j] = fa[j] + sfwc_rbf(scale * fb[j]);
			else if (OP == EW_SILU_MUL) /* a = gate, b = up */
				o[j] = sfwc_rbf(fa[j] / (1.0f + expf(-fa[j]))) * fb[j];
			else /* a = x, b = gate */
				o[j] = fa[j] * sfwc_rbf(1.0f / (1.0f + expf(-fb[j])));
		}
		y[i] = make_uint4(sfwc_pack2(o[0], o[1]), sfwc_pack2(o[2], o[3]), sfwc_pack2(o[4], o[5]),
				  sfwc_pack2(o[6], o[7]));
	}
}

/* 1 when the bf16 vector form applies (and was launched). */
template <int OP>
static bool ew8(void *y, const void *a, const void *b, size_t n, float scale, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (act != SFW_DTYPE_BF16 || n % 8 || (((uintptr_t)y | (uintptr_t)a | (uintptr_t)b) & 15))
		return false;
	sfwc_launch(ew8_kernel<OP>, dim3(grid_for(n / 8)), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (uint4 *)y,
		    (const uint4 *)a, (const uint4 *)b, n / 8, scale);
	SFW_CUDA_LAUNCHED();
	return true;
}

extern "C" void sfw_op_add_scaled_cuda(void *x, const void *b, size_t n, float scale, enum sfw_dtype act,
				       struct sfw_cuda_ctx *cx)
{
	if (n == 0)
		return;
	if (ew8<EW_ADD_SCALED>(x, x, b, n, scale, act, cx))
		return;
	ACT_DISPATCH(act, sfwc_launch(add_scaled_kernel<A>, dim3(grid_for(n)), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (A *)x, (const A *)b,
												 n, scale));
	SFW_CUDA_LAUNCHED();
}

template <typename T>
static __global__ void silu_mul_kernel(T *y, const T *gate, const T *up, size_t n)
{
	sfwc_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		float g = act_ld(gate, i);
		act_st(y, i, act_round<T>(g / (1.0f + expf(-g))) * act_ld(up, i));
	}
}

extern "C" void sfw_op_silu_mul_cuda(void *y, const void *gate, const void *up, size_t n, enum sfw_dtype act,
				     struct sfw_cuda_ctx *cx)
{
	if (n == 0)
		return;
	if (ew8<EW_SILU_MUL>(y, gate, up, n, 0.0f, act, cx))
		return;
	ACT_DISPATCH(act, sfwc_launch(silu_mul_kernel<A>, dim3(grid_for(n)), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), 
				  (A *)y, (const A *)gate, (const A *)up, n));
	SFW_CUDA_LAUNCHED();
}

template <typename T>
static __global__ void sigmoid_mul_kernel(T *y, const T *x, const T *gate, size_t n)
{
	sfwc_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		act_st(y, i, act_ld(x, i) * act_round<T>(1.0f / (1.0f + expf(-act_ld(gate, i)))));
}

extern "C" void sfw_op_sigmoid_mul_cuda(void *y, const void *x, const void *gate, size_t n, enum sfw_dtype act,
					struct sfw_cuda_ctx *cx)
{
	if (n == 0)
		return;
	if (ew8<EW_SIGMOID_MUL>(y, x, gate, n, 0.0f, act, cx))
		return;
	ACT_DISPATCH(act, sfwc_launch(sigmoid_mul_kernel<A>, dim3(grid_for(n)), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), 
				  (A *)y, (const A *)x, (const A *)gate, n));
	SFW_CUDA_LAUNCHED();
}

/* One thread per (row, head, m < hd/2): rotates the pair (m, m + hd/2).
 * Angles as torch: inv_freq = 1/theta^(2m/hd) in float32, angle = float(p)·inv. */
/* inv_freq computed on the host with the same libm powf as the CPU twin: at
 * positions near 1M one ulp of inv_freq moves the angle by ~0.06 rad. Passed
 * by value, so a captured graph carries it. */
struct rope_table {
	float inv[256];
};

template <typename T>
static __global__ void rope_kernel(T *x, int T_, int nh, int hd, const rope_table tab, const int64_t *dpos)
{
	sfwc_pdl_wait();
	int half = hd >> 1;
	size_t n = (size_t)T_ * nh * half;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		int m = (int)(i % half);
		size_t th = i / half;
		int t = (int)(th / nh);
		float a = (float)(*dpos + t) * tab.inv[m];
		float c = cosf(a), s = sinf(a);
		T *v = x + th * hd;
		float y0, y1;
		sfwc_rope_rot(act_ld(v, m), act_ld(v, m + half), c, s, y0, y1);
		act_st(v, m, y0);
		act_st(v, m + half, y1);
	}
}

void sfwi_rope_neox_cuda(void *x, int T, int nh, int hd, const int64_t *dpos, float theta, enum sfw_dtype act,
			 struct sfw_cuda_ctx *cx)
{
	size_t n = (size_t)T * nh * (hd / 2);
	if (n == 0)
		return;
	SFW_ASSERT(hd % 2 == 0 && hd / 2 <= 256 && dpos);
	rope_table tab;
	for (int m = 0; m < hd / 2; m++)
		tab.inv[m] = 1.0f / powf(theta, (float)(2 * m) / (float)hd);
	ACT_DISPATCH(act, sfwc_launch(rope_kernel<A>, dim3(grid_for(n)), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (A *)x, T, nh, hd, tab,
											   dpos));
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_rope_neox(void *x, int T, int nh, int hd, float theta, const struct sfw_cuda_rowref *rr,
				   enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	sfwi_rope_neox_cuda(x, T, nh, hd, rr->pos, theta, act, cx);
}

extern "C" void sfw_op_rope_neox_cuda(void *x, int T, int nh, int hd, int64_t pos0, float theta,
				      enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	sfwi_rope_neox_cuda(x, T, nh, hd, sfw_cuda_ctx_pos(cx, pos0), theta, act, cx);
}
