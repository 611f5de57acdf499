/* cuda_act.cuh - activation-dtype plumbing for the CUDA twins of ops.h:
 * kernels are templates over the activation storage type A (float for
 * SFW_DTYPE_F32, uint16_t bf16 bits for SFW_DTYPE_BF16). act_round<A> is the
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

/* NeoX RoPE's rotation of the pair (x0, x1) by the angle of cosine c and
 * sine s: y0 = x0 c - x1 s, y1 = x1 c + x0 s, each as one FMA over the
 * rounded product of x1 (the contraction nvcc chose for rope_kernel's
 * plain expression, so the engine's bits stay what they were), spelled
 * with _rn intrinsics so that no kernel that rotates can be contracted
 * another way: rope_kernel and the fused q/k norm + RoPE give equal bits. */
static __device__ __forceinline__ void sfwc_rope_rot(float x0, float x1, float c, float s, float &y0, float &y1)
{
	y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
	y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
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
static __device__ __forceinline__ float wget(const void *w, enum sfw_dtype dt, size_t i)
{
	return dt == SFW_DTYPE_BF16 ? sfwc_bf(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Runs the statement with A bound to the activation storage type. */
#define ACT_DISPATCH(act, ...)                                                                           \
	do {                                                                                              \
		if ((act) == SFW_DTYPE_BF16) {                                                               \
			typedef uint16_t A;                                                               \
			__VA_ARGS__;                                                                             \
		} else {                                                                                  \
			typedef float A;                                                                  \
			__VA_ARGS__;                                                                             \
		}                                                                                         \
	} while (0)

/* RMSNorm pieces over one row, each thread (or lane) taking the elements
 * first, first + step, ... (scalar) or the 8-element vectors first,
 * first + step, ... (vec8, bf16 only): the sum of squares in that order,
 * and y = round(x * inv) * w, the two roundings of docs/model-spec.md §2.2. The
 * norm kernels and the fused add + norm share them, so equal orders give
 * equal bits. */
template <typename T>
static __device__ __forceinline__ float rms_sumsq(const T *xr, int n, int first, int step)
{
	float ss = 0;
	for (int i = first; i < n; i += step) {
		float v = act_ld(xr, i);
		ss = fmaf(v, v, ss);
	}
	return ss;
}
template <typename T>
static __device__ __forceinline__ void rms_store(T *yr, const T *xr, const void *w, enum sfw_dtype wdt, int n,
						 float inv, int first, int step)
{
	for (int i = first; i < n; i += step)
		act_st(yr, i, act_round<T>(act_ld(xr, i) * inv) * wget(w, wdt, i));
}
static __device__ __forceinline__ float rms_sumsq_vec8(const uint16_t *xr, int n, int first, int step)
{
	float ss = 0;
	for (int v = first; v < n / 8; v += step) {
		float f[8];
		sfwc_unpack8(((const uint4 *)xr)[v], f);
#pragma unroll
		for (int e = 0; e < 8; e++)
			ss = fmaf(f[e], f[e], ss);
	}
	return ss;
}
static __device__ __forceinline__ void rms_store_vec8(uint16_t *yr, const uint16_t *xr, const void *w,
						      enum sfw_dtype wdt, int n, float inv, int first, int step)
{
	for (int v = first; v < n / 8; v += step) {
		float f[8];
		sfwc_unpack8(((const uint4 *)xr)[v], f);
#pragma unroll
		for (int e = 0; e < 8; e++)
			f[e] = sfwc_rbf(f[e] * inv) * wget(w, wdt, (size_t)8 * v + e);
		((uint4 *)yr)[v] = make_uint4(sfwc_pack2(f[0], f[1]), sfwc_pack2(f[2], f[3]), sfwc_pack2(f[4], f[5]),
					      sfwc_pack2(f[6], f[7]));
	}
}

/* The one-block-per-row RMSNorm kernels' row and weights in registers: up to
 * RMS_VC vectors of 8 per thread (n ≤ RMS_VC · 8 · blockDim.x, 8192 at 512
 * threads). The weights are read before the programmatic-launch wait (they
 * are written only by copies, as the GEMVs' weights), the row only once; the
 * arithmetic stays rms_sumsq_vec8's and rms_store_vec8's, so the bits do not
 * change. rms_regs_ok: the shape and pointers allow it. */
#define RMS_VC 2
struct rms_regs {
	float w[RMS_VC][8];
	float x[RMS_VC][8];
};

static __device__ __forceinline__ void rms_load_w(rms_regs &r, const void *w, enum sfw_dtype wdt, int nv)
{
#pragma unroll
	for (int c = 0; c < RMS_VC; c++) {
		int v = threadIdx.x + c * blockDim.x;
		if (v >= nv)
			break;
		if (wdt == SFW_DTYPE_BF16) {
			sfwc_unpack8(__ldg((const uint4 *)w + v), r.w[c]);
		} else {
			float4 a = __ldg((const float4 *)w + 2 * v), b = __ldg((const float4 *)w + 2 * v + 1);
			r.w[c][0] = a.x, r.w[c][1] = a.y, r.w[c][2] = a.z, r.w[c][3] = a.w;
			r.w[c][4] = b.x, r.w[c][5] = b.y, r.w[c][6] = b.z, r.w[c][7] = b.w;
		}
	}
}

/* The row's vectors into r.x; returns this thread's sum of squares in
 * rms_sumsq_vec8's order. */
static __device__ __forceinline__ float rms_load_row(rms_regs &r, const uint16_t *xr, int nv)
{
	float ss = 0;
#pragma unroll
	for (int c = 0; c < RMS_VC; c++) {
		int v = threadIdx.x + c * blockDim.x;
		if (v >= nv)
			break;
		sfwc_unpack8(((const uint4 *)xr)[v], r.x[c]);
#pragma unroll
		for (int e = 0; e < 8; e++)
			ss = fmaf(r.x[c][e], r.x[c][e], ss);
	}
	return ss;
}

static __device__ __forceinline__ void rms_store_regs(uint16_t *yr, const rms_regs &r, float inv, int nv)
{
#pragma unroll
	for (int c = 0; c < RMS_VC; c++) {
		int v = threadIdx.x + c * blockDim.x;
		if (v >= nv)
			break;
		float f[8];
#pragma unroll
		for (int e = 0; e < 8; e++)
			f[e] = sfwc_rbf(r.x[c][e] * inv) * r.w[c][e];
		((uint4 *)yr)[v] = make_uint4(sfwc_pack2(f[0], f[1]), sfwc_pack2(f[2], f[3]), sfwc_pack2(f[4], f[5]),
					      sfwc_pack2(f[6], f[7]));
	}
}

static inline bool rms_regs_ok(const void *w, enum sfw_dtype wdt, int n, int threads)
{
	return n % 8 == 0 && n / 8 <= RMS_VC * threads && !((uintptr_t)w & (wdt == SFW_DTYPE_BF16 ? 15 : 31)) &&
	       (wdt == SFW_DTYPE_BF16 || wdt == SFW_DTYPE_F32);
}

/* bytes of the context's scratch (kernels/linear.cu; struct sfw_cuda_ctx). */
void *sfwi_cuda_scratch(struct sfw_cuda_ctx *cx, size_t bytes);
/* The one-block-per-row RMSNorm takes its 8-wide form (elementwise.cu). */
bool sfwi_rmsnorm_vec_ok(const void *y, const void *x, int n, enum sfw_dtype act);
/* Y[M, N] float = round_bf16(alpha · X Wᵀ) by the bf16 GEMV (M ≤ SFW_CUDA_GEMV_MAX_M; kernels/linear.cu). */
void sfwi_cuda_gemv_logits(const uint16_t *X, const uint16_t *W, float *Y, int M, int N, int K, float alpha,
			   void *stream);
/* NeoX RoPE of T rows at positions *dpos + t (device memory). */
void sfwi_rope_neox_cuda(void *x, int T, int nh, int hd, const int64_t *dpos, float theta, enum sfw_dtype act,
			 struct sfw_cuda_ctx *cx);

/* Where a selection call's rows are when its kernels run (struct
 * sfw_cuda_rowref's pos, off and len): row r is the token at *pos + off +
 * r of a cache of *pos + len tokens, whose chunk and block counts are
 * those of the call. */
struct sfwc_selpos {
	const int64_t *pos;
	int64_t off, len;
};

/* A stage-1 kernel's arguments (kernels/infllm.cu s1_args, kernels/
 * attn_tc_stage1_dec.cu s1d_args) resolved when it runs: the compressed
 * keys and their table from a recorded row's slots where it has them, the
 * rows' first position and the level-1 and level-2 chunk counts from sp. */
template <class S> static __device__ __forceinline__ void sfwc_s1_resolve(S &a)
{
	if (a.pc1)
		a.c1 = (decltype(a.c1))*a.pc1, a.c2 = (decltype(a.c2))*a.pc2;
	if (a.ptab)
		a.tab = *a.ptab;
	int64_t len = *a.sp.pos + a.sp.len;
	a.pos0 = *a.sp.pos + a.sp.off;
	a.n1 = sfw_nchunks(len, a.ksize, a.stride);
	a.n2 = sfw_nchunks(len, 4 * a.ksize, 4 * a.stride);
}

/* A row reference with only its position (the twins'). */
static inline struct sfw_cuda_rowref sfwc_rowref_at(const int64_t *pos)
{
	struct sfw_cuda_rowref rr = {};
	rr.pos = pos;
	return rr;
}

/* A kernel's sequences: sfwc_one_seq (the call's own cache, an empty
 * launch parameter) or struct sfw_cuda_seqs (ops_cuda.h: row i of a
 * batched decode step belongs to sequence i). Kernels templated on it keep
 * one body for both. */
struct sfwc_one_seq {};

/* Row of token t in a cache paged by tab (ops_cuda.h, struct
 * sfw_pages), or t when tab is NULL (contiguous). */
static __device__ __forceinline__ int64_t sfwc_kv_row(const int32_t *tab, int shift, int64_t t)
{
	return tab ? ((int64_t)tab[t >> shift] << shift) + (t & (((int64_t)1 << shift) - 1)) : t;
}

/* Sequence i of a batched launch (struct sfw_cuda_seqs): whether row i is
 * a sequence (not a recorded bucket's padding), its position, row, block
 * table and shift, and its pointer j of the op. */
static __device__ __forceinline__ bool sfwc_seq_live(const sfwc_one_seq &, int)
{
	return true;
}

static __device__ __forceinline__ int64_t sfwc_seq_pos(const sfw_cuda_seqs &s, int i)
{
	return s.st->pos[i];
}

static __device__ __forceinline__ int sfwc_seq_row(const sfw_cuda_seqs &s, int i)
{
	return s.st->row[i];
}

static __device__ __forceinline__ const int32_t *sfwc_seq_tab(const sfw_cuda_seqs &s, int i)
{
	return s.st->tab[i];
}

static __device__ __forceinline__ int sfwc_seq_shift(const sfw_cuda_seqs &s)
{
	return s.st->shift;
}

static __device__ __forceinline__ void *sfwc_seq_p(const sfw_cuda_seqs &s, int j, int i)
{
	return s.sp[(size_t)(s.layer * SFW_CUDA_LN + s.pf[j]) * s.n + i];
}

static __device__ __forceinline__ bool sfwc_seq_live(const sfw_cuda_seqs &s, int i)
{
	return sfwc_seq_p(s, 0, i) != NULL;
}

/* A launch's view of pg (NULL: contiguous): the table and its shift. */
static inline const int32_t *sfwc_pg_tab(const struct sfw_pages *pg)
{
	SFW_ASSERT(!pg || !pg->tab || (pg->shift >= 5 && pg->shift < 31)); /* whole 32-token tiles per block */
	return pg ? pg->tab : NULL;
}

static inline int sfwc_pg_shift(const struct sfw_pages *pg)
{
	return pg && pg->tab ? pg->shift : 0;
}

#endif
