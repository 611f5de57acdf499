/* fused.cu - CUDA fused ops (CPU twins: kernels/fused.c). Each computes
 * exactly what the unfused kernels compute, with the same rounding points
 * and the same reduction order, so fused and unfused results are equal bit
 * for bit; the gain is launches (decode runs ~600 small kernels a token)
 * and, for prefill rows, passes over memory. */
#include "cuda_act.cuh"

extern "C" {
#include "kernels/ops.h"
}

/* x += round(scale*b) (rounded to the activation type, as add_scaled_kernel),
 * then rmsnorm_block_kernel's arithmetic on the new x. One 512-thread block
 * per row; each thread re-reads only the elements it wrote itself. */
template <typename T>
static __global__ void add_rmsnorm_kernel(T *y, T *x, const T *b, float scale, const void *w, enum sfw_dtype wdt,
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
	rms_store(yr, xr, w, wdt, n, inv, threadIdx.x, blockDim.x);
}

/* x += round(scale*b) over the 8-element vectors v = first, first + step,
 * ... of a bf16 row (ew8's add_scaled), the rounded sums stored; returns
 * the sum of their squares in rms_sumsq_vec8's order. */
static __device__ __forceinline__ float add_sumsq_vec8(uint4 *xr, const uint4 *br, float scale, int n, int first,
							int step)
{
	float ss = 0;
	for (int v = first; v < n / 8; v += step) {
		float fx[8], fb[8];
		sfwc_unpack8(xr[v], fx);
		sfwc_unpack8(br[v], fb);
#pragma unroll
		for (int e = 0; e < 8; e++)
			fx[e] = sfwc_rbf(fx[e] + sfwc_rbf(scale * fb[e]));
#pragma unroll
		for (int e = 0; e < 8; e++)
			ss = fmaf(fx[e], fx[e], ss);
		xr[v] = sfwc_pack8(fx);
	}
	return ss;
}

/* bf16, 8-wide: the vectors of rmsnorm_block_kernel's VEC form, in its
 * order (equal bits to add_scaled + rmsnorm); the sum of squares is taken
 * over the stored (rounded) sums, as the scalar form reads them back. */
static __global__ void add_rmsnorm_vec_kernel(uint16_t *y, uint16_t *x, const uint16_t *b, float scale, const void *w,
					      enum sfw_dtype wdt, int n, float eps, int regs)
{
	rms_regs R;
	if (regs) /* (rms_regs_ok) */
		rms_load_w(R, w, wdt, n / 8);
	sfwc_pdl_wait();
	__shared__ float red[32];
	uint4 *xr = (uint4 *)(x + (size_t)blockIdx.x * n);
	const uint4 *br = (const uint4 *)(b + (size_t)blockIdx.x * n);
	float ss = 0;
	if (regs) {
#pragma unroll
		for (int c = 0; c < RMS_VC; c++) {
			int v = threadIdx.x + c * blockDim.x;
			if (v >= n / 8)
				break;
			float fb[8];
			sfwc_unpack8(xr[v], R.x[c]);
			sfwc_unpack8(br[v], fb);
#pragma unroll
			for (int e = 0; e < 8; e++)
				R.x[c][e] = sfwc_rbf(R.x[c][e] + sfwc_rbf(scale * fb[e]));
#pragma unroll
			for (int e = 0; e < 8; e++)
				ss = fmaf(R.x[c][e], R.x[c][e], ss);
			xr[v] = sfwc_pack8(R.x[c]);
		}
		ss = sfwc_block_sum(ss, red);
		rms_store_regs(y + (size_t)blockIdx.x * n, R, 1.0f / sqrtf(ss / (float)n + eps), n / 8);
		return;
	}
	ss = sfwc_block_sum(add_sumsq_vec8(xr, br, scale, n, threadIdx.x, blockDim.x), red);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	rms_store_vec8(y + (size_t)blockIdx.x * n, x + (size_t)blockIdx.x * n, w, wdt, n, inv, threadIdx.x, blockDim.x);
}

/* Prefill rows (rows >= 1024, bf16, n >= 1024, 16-byte aligned): a warp
 * a row, 8 a block, as rmsnorm_warp_kernel's VEC form runs them. Lane l
 * adds the vectors v = l, l + 32, ... as ew8's add_scaled does, stores the
 * rounded sums and takes their squares in rms_sumsq_vec8's order; the
 * norm's store rereads only the lane's own vectors (rms_store_vec8): the
 * bits of add_scaled + rmsnorm, one pass over x and b fewer. */
static __global__ void add_rmsnorm_warp_kernel(uint16_t *y, uint16_t *x, const uint16_t *b, float scale, const void *w,
					       enum sfw_dtype wdt, int rows, int n, float eps)
{
	sfwc_pdl_wait();
	const int lane = threadIdx.x & 31;
	const long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= rows)
		return;
	uint4 *xr = (uint4 *)(x + (size_t)r * n);
	const uint4 *br = (const uint4 *)(b + (size_t)r * n);
	const float ss = sfwc_warp_sum(add_sumsq_vec8(xr, br, scale, n, lane, 32));
	const float inv = 1.0f / sqrtf(ss / (float)n + eps);
	rms_store_vec8(y + (size_t)r * n, x + (size_t)r * n, w, wdt, n, inv, lane, 32);
}

extern "C" void sfw_op_add_rmsnorm_cuda(void *y, void *x, const void *b, float scale, const void *w,
					const struct sfw_norm_shape *sh, enum sfw_dtype act,
					struct sfw_cuda_ctx *cx)
{
	int rows = sh->rows, n = sh->n;
	float eps = sh->eps;
	enum sfw_dtype wdt = sh->wdt;
	if (rows <= 0)
		return;
	/* prefill rows: the warp form of sfw_op_rmsnorm_cuda's VEC shape */
	if (n >= 1024 && rows >= 1024 && sfwi_rmsnorm_vec_ok(y, x, n, act) && !((uintptr_t)b & 15)) {
		sfwc_launch(add_rmsnorm_warp_kernel, dim3((unsigned)((rows + 7) / 8)), dim3(256), 0,
			    SFW_CUDA_STREAM(cx->stream), (uint16_t *)y, (uint16_t *)x, (const uint16_t *)b, scale, w, wdt,
			    rows, n, eps);
		SFW_CUDA_LAUNCHED();
		return;
	}
	/* the shape sfw_op_rmsnorm_cuda runs with its block kernel; other shapes
	 * take the two unfused launches */
	if (!(n >= 1024 && rows < 1024)) {
		sfw_op_add_scaled_cuda(x, b, (size_t)rows * (size_t)n, scale, act, cx);
		sfw_op_rmsnorm_cuda(y, x, w, wdt, rows, n, eps, act, cx);
		return;
	}
	if (sfwi_rmsnorm_vec_ok(y, x, n, act)) {
		if ((uintptr_t)b & 15) { /* the unfused pair, and its bits */
			sfw_op_add_scaled_cuda(x, b, (size_t)rows * (size_t)n, scale, act, cx);
			sfw_op_rmsnorm_cuda(y, x, w, wdt, rows, n, eps, act, cx);
			return;
		}
		sfwc_launch(add_rmsnorm_vec_kernel, dim3(rows), dim3(512), 0, SFW_CUDA_STREAM(cx->stream), (uint16_t *)y,
			    (uint16_t *)x, (const uint16_t *)b, scale, w, wdt, n, eps, (int)rms_regs_ok(w, wdt, n, 512));
	} else {
		ACT_DISPATCH(act, sfwc_launch(add_rmsnorm_kernel<A>, dim3(rows), dim3(512), 0, SFW_CUDA_STREAM(cx->stream),
					      (A *)y, (A *)x, (const A *)b, scale, w, wdt, n, eps));
	}
	SFW_CUDA_LAUNCHED();
}

/* The gated norm of one 8-element vector: rmsnorm's stored value (x inv
 * rounded, times the weight, rounded) times ew8's rounded sigmoid of the
 * gate z, packed (the bits of rmsnorm followed by sigmoid_mul). */
static __device__ __forceinline__ uint4 rms_gate8(const float x[8], float inv, const float w[8], uint4 z)
{
	float f[8], fz[8];
	sfwc_unpack8(z, fz);
#pragma unroll
	for (int e = 0; e < 8; e++)
		f[e] = sfwc_rbf(sfwc_rbf(x[e] * inv) * w[e]) * sfwc_rbf(1.0f / (1.0f + expf(-fz[e])));
	return sfwc_pack8(f);
}

/* rmsnorm_block_kernel's VEC arithmetic on the row held in registers
 * (rms_regs), then ew8's sigmoid gate on the values rmsnorm stores (bf16):
 * equal bits to sfw_op_rmsnorm_cuda followed by sfw_op_sigmoid_mul_cuda.
 * Each thread rereads only its own vectors, so y may alias x. */
static __global__ void rmsnorm_gate_kernel(uint16_t *y, const uint16_t *x, const void *w, enum sfw_dtype wdt,
					   const uint16_t *z, int n, float eps)
{
	rms_regs R;
	rms_load_w(R, w, wdt, n / 8);
	sfwc_pdl_wait();
	__shared__ float red[32];
	const uint4 *zr = (const uint4 *)(z + (size_t)blockIdx.x * n);
	uint4 zv[RMS_VC];
#pragma unroll
	for (int c = 0; c < RMS_VC; c++) /* the gate's loads in flight with the row's */
		if (threadIdx.x + c * blockDim.x < n / 8)
			zv[c] = zr[threadIdx.x + c * blockDim.x];
	float ss = sfwc_block_sum(rms_load_row(R, x + (size_t)blockIdx.x * n, n / 8), red);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	uint4 *yr = (uint4 *)(y + (size_t)blockIdx.x * n);
#pragma unroll
	for (int c = 0; c < RMS_VC; c++) {
		int v = threadIdx.x + c * blockDim.x;
		if (v >= n / 8)
			break;
		yr[v] = rms_gate8(R.x[c], inv, R.w[c], zv[c]);
	}
}

/* Prefill rows (rows >= 1024): rmsnorm_warp_kernel's VEC arithmetic, a
 * warp a row, then the gate on each stored value as above. Each lane
 * rereads only its own vectors, so y may alias x. */
static __global__ void rmsnorm_gate_warp_kernel(uint16_t *y, const uint16_t *x, const void *w, enum sfw_dtype wdt,
						const uint16_t *z, int rows, int n, float eps)
{
	sfwc_pdl_wait();
	const int lane = threadIdx.x & 31;
	const long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= rows)
		return;
	const uint16_t *xr = x + (size_t)r * n;
	const uint4 *zr = (const uint4 *)(z + (size_t)r * n);
	uint4 *yr = (uint4 *)(y + (size_t)r * n);
	const float ss = sfwc_warp_sum(rms_sumsq_vec8(xr, n, lane, 32));
	const float inv = 1.0f / sqrtf(ss / (float)n + eps);
	for (int v = lane; v < n / 8; v += 32) {
		float f[8], wv[8];
		sfwc_unpack8(((const uint4 *)xr)[v], f);
#pragma unroll
		for (int e = 0; e < 8; e++)
			wv[e] = wget(w, wdt, (size_t)8 * v + e);
		yr[v] = rms_gate8(f, inv, wv, zr[v]);
	}
}

extern "C" void sfw_op_rmsnorm_gate_cuda(void *y, const void *x, const void *w, const void *z,
					 const struct sfw_norm_shape *sh, enum sfw_dtype act,
					 struct sfw_cuda_ctx *cx)
{
	int rows = sh->rows, n = sh->n;
	float eps = sh->eps;
	enum sfw_dtype wdt = sh->wdt;
	if (rows <= 0)
		return;
	/* the shape sfw_op_rmsnorm_cuda runs with its 8-wide block kernel, and
	 * a gate ew8 takes; else the two launches */
	if (n >= 1024 && rows < 1024 && sfwi_rmsnorm_vec_ok(y, x, n, act) && !((uintptr_t)z & 15) &&
	    rms_regs_ok(w, wdt, n, 512)) {
		sfwc_launch(rmsnorm_gate_kernel, dim3(rows), dim3(512), 0, SFW_CUDA_STREAM(cx->stream), (uint16_t *)y,
			    (const uint16_t *)x, w, wdt, (const uint16_t *)z, n, eps);
		SFW_CUDA_LAUNCHED();
		return;
	}
	if (n >= 1024 && rows >= 1024 && sfwi_rmsnorm_vec_ok(y, x, n, act) && !((uintptr_t)z & 15)) {
		sfwc_launch(rmsnorm_gate_warp_kernel, dim3((unsigned)((rows + 7) / 8)), dim3(256), 0,
			    SFW_CUDA_STREAM(cx->stream), (uint16_t *)y, (const uint16_t *)x, w, wdt, (const uint16_t *)z,
			    rows, n, eps);
		SFW_CUDA_LAUNCHED();
		return;
	}
	sfw_op_rmsnorm_cuda(y, x, w, wdt, rows, n, eps, act, cx);
	sfw_op_sigmoid_mul_cuda(y, y, z, (size_t)rows * (size_t)n, act, cx);
}

/* ---- per-head q/k RMSNorm + NeoX RoPE (lightning layers), one pass ----
 * A CTA takes one token's head rows (q rows, then k rows), or with grid.y
 * > 1 (calls of few tokens: decode) a share of them; a warp takes a row at
 * a time. The token's cosines and sines are taken once into shared memory
 * (the angles of rope_kernel: float(p) * inv_freq[m]). Each row is read
 * once: rmsnorm_warp_kernel's lane/element assignment (i = lane + 32 j),
 * fmaf order, warp reduction and two roundings (to the activation type,
 * then times the weight, as its store), then rope_kernel's rotation
 * (sfwc_rope_rot) of the pairs (m, m + hd/2) in registers (a shuffle at
 * hd = 32), and one store: the bits of the unfused launches. */
#define QKN_WARPS 8

/* inv_freq as sfwi_rope_neox_cuda computes it (host powf), hd <= 128 */
struct qkn_table {
	float inv[64];
};

/* Row t's position: *dpos + t for one sequence, pos[t] for row t of a
 * batched decode step. */
static __device__ __forceinline__ int64_t qkn_pos(const sfwc_one_seq &, const int64_t *dpos, int t)
{
	return *dpos + t;
}

static __device__ __forceinline__ int64_t qkn_pos(const sfw_cuda_seqs &sq, const int64_t *, int t)
{
	return sfwc_seq_pos(sq, t);
}

/* Head h (of nh) of row t of the call: for a batched step, t counts
 * sequences and their rows are row[t]. */
static __device__ __forceinline__ size_t qkn_head(const sfwc_one_seq &, int t, int h, int nh)
{
	return (size_t)t * nh + h;
}

static __device__ __forceinline__ size_t qkn_head(const sfw_cuda_seqs &sq, int t, int h, int nh)
{
	return (size_t)sfwc_seq_row(sq, t) * nh + h;
}

template <typename A, int HD, typename SQ>
static __global__ void __launch_bounds__(32 * QKN_WARPS)
	qk_norm_rope_kernel(A *q, A *k, const void *qw, enum sfw_dtype qwdt, const void *kw, enum sfw_dtype kwdt,
			    int nhq, int nhk, int n, float eps, int rope, const qkn_table tab, const int64_t *dpos,
			    const SQ sq)
{
	constexpr int NJ = HD / 32;
	__shared__ float cs[2][HD / 2];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = blockIdx.x;
	const int nr = nhq + nhk, per = (nr + (int)gridDim.y - 1) / (int)gridDim.y;
	const int r0 = (int)blockIdx.y * per, r1 = min(nr, r0 + per);
	/* the norm weights before the programmatic-launch wait: they are
	 * written only by copies (as the GEMVs' weights) */
	float wq[NJ], wk[NJ];
#pragma unroll
	for (int j = 0; j < NJ; j++)
		wq[j] = wget(qw, qwdt, lane + 32 * j), wk[j] = wget(kw, kwdt, lane + 32 * j);
	sfwc_pdl_wait();
	if (rope) {
		const float p = (float)qkn_pos(sq, dpos, t);
		for (int m = threadIdx.x; m < HD / 2; m += blockDim.x) {
			const float a = p * tab.inv[m];
			cs[0][m] = cosf(a), cs[1][m] = sinf(a);
		}
		__syncthreads();
	}
	for (int r = r0 + w; r < r1; r += QKN_WARPS) {
		const bool isq = r < nhq;
		A *xr = isq ? q + qkn_head(sq, t, r, nhq) * HD : k + qkn_head(sq, t, r - nhq, nhk) * HD;
		float y[NJ];
		float ss = 0;
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			y[j] = act_ld(xr, lane + 32 * j);
			ss = fmaf(y[j], y[j], ss);
		}
		ss = sfwc_warp_sum(ss);
		/* n = HD passed at run time: a constant divisor could be folded into
		 * a multiply-add with eps, which the rmsnorm kernel cannot do */
		const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
		for (int j = 0; j < NJ; j++) /* the value rmsnorm stores */
			y[j] = act_round<A>(act_round<A>(y[j] * inv) * (isq ? wq[j] : wk[j]));
		if (rope) {
			if (HD == 32) { /* the pair of lanes m and m + 16 */
				const float o = __shfl_xor_sync(0xffffffffu, y[0], 16);
				const int m = lane & 15;
				float y0, y1;
				if (lane < 16)
					sfwc_rope_rot(y[0], o, cs[0][m], cs[1][m], y0, y1), y[0] = y0;
				else
					sfwc_rope_rot(o, y[0], cs[0][m], cs[1][m], y0, y1), y[0] = y1;
			} else { /* the pairs (j, j + NJ / 2) of the lane */
#pragma unroll
				for (int j = 0; j < NJ / 2; j++) {
					const int m = lane + 32 * j;
					float y0, y1;
					sfwc_rope_rot(y[j], y[j + NJ / 2], cs[0][m], cs[1][m], y0, y1);
					y[j] = y0, y[j + NJ / 2] = y1;
				}
			}
		}
#pragma unroll
		for (int j = 0; j < NJ; j++)
			act_st(xr, lane + 32 * j, y[j]);
	}
}

template <typename SQ>
static void qkn_any(void *q, void *k, const void *qw, enum sfw_dtype qwdt, const void *kw, enum sfw_dtype kwdt, int T,
		    int nhq, int nhk, int hd, float eps, int rope, const int64_t *dpos, float theta,
		    enum sfw_dtype act, const SQ &sq, struct sfw_cuda_ctx *cx)
{
	if (T <= 0 || nhq + nhk <= 0)
		return;
	SFW_ASSERT(nhq >= 0 && nhk >= 0 && (int64_t)T * (nhq + nhk) <= INT32_MAX);
	if (hd != 32 && hd != 64 && hd != 128) { /* other head dims: the unfused launches */
		sfw_op_rmsnorm_cuda(q, q, qw, qwdt, T * nhq, hd, eps, act, cx);
		sfw_op_rmsnorm_cuda(k, k, kw, kwdt, T * nhk, hd, eps, act, cx);
		if (rope) {
			sfwi_rope_neox_cuda(q, T, nhq, hd, dpos, theta, act, cx);
			sfwi_rope_neox_cuda(k, T, nhk, hd, dpos, theta, act, cx);
		}
		return;
	}
	qkn_table tab = {};
	if (rope)
		for (int m = 0; m < hd / 2; m++)
			tab.inv[m] = 1.0f / powf(theta, (float)(2 * m) / (float)hd);
	/* a CTA a token; below 4 CTAs an SM, a token's rows over CTAs of a row
	 * a warp (each takes the angles again: hd / 2 of them) */
	const int nr = nhq + nhk;
	const int split = T < 4 * sfwi_cuda_sms(cx) ? (nr + QKN_WARPS - 1) / QKN_WARPS : 1;
	dim3 grid((unsigned)T, (unsigned)split), block(32 * QKN_WARPS);
#define QKN_LAUNCH(HD)                                                                                            \
	ACT_DISPATCH(act, sfwc_launch(qk_norm_rope_kernel<A, HD, SQ>, grid, block, 0, SFW_CUDA_STREAM(cx->stream),       \
				      (A *)q, (A *)k, qw, qwdt, kw, kwdt, nhq, nhk, hd, eps, rope, tab, dpos, sq))
	if (hd == 32)
		QKN_LAUNCH(32);
	else if (hd == 64)
		QKN_LAUNCH(64);
	else
		QKN_LAUNCH(128);
#undef QKN_LAUNCH
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_qk_norm_rope(void *q, void *k, const void *qw, const void *kw,
				      const struct sfw_qk_shape *sh, const struct sfw_cuda_rowref *rr,
				      enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	const int64_t *dpos = rr->pos;
	int T = sh->T, nhq = sh->nhq, nhk = sh->nhk, hd = sh->hd, rope = sh->rope;
	enum sfw_dtype qwdt = sh->qwdt, kwdt = sh->kwdt;
	float eps = sh->eps, theta = sh->theta;
	SFW_ASSERT(dpos);
	qkn_any(q, k, qw, qwdt, kw, kwdt, T, nhq, nhk, hd, eps, rope, dpos, theta, act, sfwc_one_seq(), cx);
}

extern "C" void sfw_cuda_qk_norm_rope_seqs(void *q, void *k, const void *qw, const void *kw,
					   const struct sfw_cuda_seqs *s, const struct sfw_qk_shape *sh,
					   enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	int nhq = sh->nhq, nhk = sh->nhk, hd = sh->hd, rope = sh->rope;
	float eps = sh->eps, theta = sh->theta;
	enum sfw_dtype qwdt = sh->qwdt, kwdt = sh->kwdt;
	SFW_ASSERT(s->n >= 1 && s->n <= SFW_CUDA_SEQS_MAX && (hd == 32 || hd == 64 || hd == 128));
	qkn_any(q, k, qw, qwdt, kw, kwdt, s->n, nhq, nhk, hd, eps, rope, NULL, theta, act, *s, cx);
}

extern "C" void sfw_op_qk_norm_rope_cuda(void *q, void *k, const void *qw, const void *kw,
					 const struct sfw_qk_shape *sh, enum sfw_dtype act,
					 struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	sfw_cuda_qk_norm_rope(q, k, qw, kw, sh, &rr, act, cx);
}
