/* lightning.cu - CUDA twins of kernels/lightning.c: simple gated linear
 * attention with an fp32 state [nh, hd(k), hd(v)] updated in place.
 *
 * Both forms split a head's state by value columns into tiles of 32: one
 * block per (head, tile), so the state never leaves the block between tokens
 * and no block depends on another. The recurrent form (decode) keeps its
 * tile in registers; the chunked form (prefill) keeps it in shared memory and
 * walks the sequence in sub-chunks of up to 32 tokens (intra-chunk causal
 * part + inter-chunk state term, as fla's chunk_simple_gla; the sub-chunk
 * length changes only the fp32 summation order, not the function). */
#include "attn_tc.cuh"

#include <string.h>

#define GLA_THREADS 256
#define GLA_WARPS (GLA_THREADS / 32)

/* The state a block updates: the call's, or (a batched decode step, one
 * row per sequence) that of sequence blockIdx.z. */
static __device__ __forceinline__ float *gla_state(const sfwc_one_seq &, float *state)
{
	return state;
}

static __device__ __forceinline__ float *gla_state(const sfw_cuda_seqs &sq, float *)
{
	return (float *)sfwc_seq_p(sq, 0, blockIdx.z);
}

/* The block's first row: 0 for one sequence, its sequence's row otherwise. */
static __device__ __forceinline__ size_t gla_row(const sfwc_one_seq &)
{
	return 0;
}

static __device__ __forceinline__ size_t gla_row(const sfw_cuda_seqs &sq)
{
	return (size_t)sfwc_seq_row(sq, blockIdx.z);
}

/* blockIdx.z: the sequence (0 for one; else its T = 1 row is row[z]) */
template <typename A, int HD, typename SQ>
static __global__ void __launch_bounds__(GLA_THREADS)
	gla_rec_kernel(A *o, const A *q, const A *k, const A *v, float *state, const float *decay, int T, int nh,
		       float scale, const SQ sq)
{
	constexpr int RPT = HD / GLA_WARPS; /* state rows per thread */
	__shared__ float qs[HD], ks[HD], red[GLA_WARPS][32];
	int h = blockIdx.x, col = blockIdx.y * 32 + (threadIdx.x & 31), w = threadIdx.x >> 5;
	if (!sfwc_seq_live(sq, blockIdx.z)) /* a recorded bucket's padding row */
		return;
	float *S = gla_state(sq, state) + (size_t)h * HD * HD;
	/* The state (and the decay, a weight) before the programmatic-launch
	 * wait: it is read-modified-written only by this layer's GLA, whose
	 * previous launch came many kernels earlier, and a kernel runs code
	 * before its wait only once the kernel before it has passed its own
	 * wait (cuda_common.cuh, sfwc_pdl_wait), so every kernel before that
	 * one is complete. The layer's q, k, v come after the wait. */
	float g = expf(-decay[h]);
	float s[RPT];
#pragma unroll
	for (int i = 0; i < RPT; i++)
		s[i] = S[(size_t)(w + i * GLA_WARPS) * HD + col];
	sfwc_pdl_wait();
	size_t rs = (size_t)nh * HD;
	for (int t = 0; t < T; t++) {
		size_t base = (gla_row(sq) + t) * rs + (size_t)h * HD;
		__syncthreads();
		for (int i = threadIdx.x; i < HD; i += GLA_THREADS)
			qs[i] = act_ld(q, base + i), ks[i] = act_ld(k, base + i);
		__syncthreads();
		float vc = act_ld(v, base + col), acc = 0;
#pragma unroll
		for (int i = 0; i < RPT; i++) {
			int a = w + i * GLA_WARPS;
			s[i] = g * s[i] + ks[a] * vc;
			acc += qs[a] * s[i];
		}
		red[w][threadIdx.x & 31] = acc;
		__syncthreads();
		if (w == 0) {
			float sum = 0;
#pragma unroll
			for (int j = 0; j < GLA_WARPS; j++)
				sum += red[j][threadIdx.x];
			act_st(o, base + col, sum * scale);
		}
	}
#pragma unroll
	for (int i = 0; i < RPT; i++)
		S[(size_t)(w + i * GLA_WARPS) * HD + col] = s[i];
}

#define GLA_CI 32 /* sub-chunk length */

template <int HD> static constexpr size_t gla_chunk_smem()
{
	/* q, k [CI][HD+1]; v tile [CI][32]; A [CI][CI+1]; S tile [HD][33]; decay powers */
	return sizeof(float) *
	       ((size_t)2 * GLA_CI * (HD + 1) + GLA_CI * 32 + GLA_CI * (GLA_CI + 1) + HD * 33 + GLA_CI + 1);
}

template <typename A, int HD>
static __global__ void __launch_bounds__(GLA_THREADS)
	gla_chunk_kernel(A *o, const A *q, const A *k, const A *v, float *state, const float *decay, int T, int nh,
			 float scale)
{
	sfwc_pdl_wait();
	/* q and k rows padded to HD + 1 floats: the intra-chunk products read
	 * k rows r = 0..31 across a warp at the same column, which an
	 * unpadded stride of HD (a multiple of 32) puts all in one bank */
	constexpr int LD = HD + 1;
	extern __shared__ float sm[];
	float *qs = sm, *ks = qs + GLA_CI * LD, *vs = ks + GLA_CI * LD, *Am = vs + GLA_CI * 32;
	float *S = Am + GLA_CI * (GLA_CI + 1), *dec = S + HD * 33;
	int h = blockIdx.x, c0 = blockIdx.y * 32, tid = threadIdx.x;
	float *Sg = state + (size_t)h * HD * HD;
	float lg = -decay[h];
	for (int n = tid; n <= GLA_CI; n += GLA_THREADS)
		dec[n] = expf(lg * (float)n);
	for (int i = tid; i < HD * 32; i += GLA_THREADS)
		S[(i >> 5) * 33 + (i & 31)] = Sg[(size_t)(i >> 5) * HD + c0 + (i & 31)];
	size_t rs = (size_t)nh * HD;
	for (int t0 = 0; t0 < T; t0 += GLA_CI) {
		int c = T - t0 < GLA_CI ? T - t0 : GLA_CI;
		__syncthreads();
		for (int i = tid; i < c * HD; i += GLA_THREADS) {
			size_t gi = (size_t)(t0 + i / HD) * rs + (size_t)h * HD + i % HD;
			int si = i / HD * LD + i % HD;
			qs[si] = act_ld(q, gi), ks[si] = act_ld(k, gi);
		}
		for (int i = tid; i < c * 32; i += GLA_THREADS)
			vs[i] = act_ld(v, (size_t)(t0 + (i >> 5)) * rs + (size_t)h * HD + c0 + (i & 31));
		__syncthreads();
		/* intra-chunk weights A[i][r] = γ^(i-r) (q_i · k_r), r ≤ i */
		for (int e = tid; e < c * c; e += GLA_THREADS) {
			int i = e / c, r = e % c;
			if (r > i)
				continue;
			float d = 0;
			for (int a = 0; a < HD; a++)
				d += qs[i * LD + a] * ks[r * LD + a];
			Am[i * (GLA_CI + 1) + r] = d * dec[i - r];
		}
		__syncthreads();
		/* o_i = scale · (γ^(i+1) q_i S + Σ_{r≤i} A[i][r] v_r) */
		for (int e = tid; e < c * 32; e += GLA_THREADS) {
			int i = e >> 5, cc = e & 31;
			float acc = 0;
			for (int a = 0; a < HD; a++)
				acc += qs[i * LD + a] * S[a * 33 + cc];
			acc *= dec[i + 1];
			for (int r = 0; r <= i; r++)
				acc += Am[i * (GLA_CI + 1) + r] * vs[r * 32 + cc];
			act_st(o, (size_t)(t0 + i) * rs + (size_t)h * HD + c0 + cc, acc * scale);
		}
		__syncthreads();
		/* S = γ^c S + Σ_r γ^(c-1-r) k_rᵀ v_r */
		for (int e = tid; e < HD * 32; e += GLA_THREADS) {
			int a = e >> 5, cc = e & 31;
			float acc = S[a * 33 + cc] * dec[c];
			for (int r = 0; r < c; r++)
				acc += ks[r * LD + a] * dec[c - 1 - r] * vs[r * 32 + cc];
			S[a * 33 + cc] = acc;
		}
	}
	__syncthreads();
	for (int i = tid; i < HD * 32; i += GLA_THREADS)
		Sg[(size_t)(i >> 5) * HD + c0 + (i & 31)] = S[(i >> 5) * 33 + (i & 31)];
}

/* ---- chunk-parallel prefill (bf16; fp32 takes the serial kernel above) ----
 * The serial kernel above walks every token of a head in one block; this
 * form spreads the chunks (64 tokens) of a piece over blocks, three launches
 * per group of up to NC chunks:
 *   delta: D[j] = Σ_r γ^(c-1-r) k_rᵀ v_r             (block per chunk, head)
 *   scan:  D[j] <- S at the start of chunk j, S = γ^c S + D[j] (in place,
 *          one thread per state element, serial over the group's chunks)
 *   out:   o_i = scale (γ^(i+1) q_i S_j + Σ_{r≤i} γ^(i-r) (q_i·k_r) v_r)
 * D lives in the op scratch.
 *
 * delta and out run on tensor cores (mma.sync m16n8k16, bf16 in, fp32
 * accumulate; fragment layouts: attn_tc.cuh). Products of bf16 q, k, v are
 * exact in fp32, so those MMAs differ from the CPU twin only in the fp32
 * summation order. Three operands are fp32 instead: the decayed keys
 * γ^(c-1-r) k_r of delta, the decayed intra-chunk weights A[i][r] =
 * γ^(i-r) (q_i·k_r) of out, and the state S_j. Rounding them to bf16 would
 * lose all but 8 significant bits; each is split instead into hi + lo
 * (tc_split: hi = bf16(x), lo = bf16(x - hi)) and multiplied by two MMAs,
 * hi y + lo y, against an exact bf16 y, so every product is within 2^-16
 * relative of the fp32 one. The row factor γ^(i+1) of the inter-chunk term
 * is applied to the fp32 accumulator, as the twin does. Decay powers are
 * expf(-decay n), the twin's expression. */
#define GLA_C 64
#define GLA_OW 4 /* warps of the out kernel: warp w owns chunk rows 16w..16w+15 */
#define GLA_SR 32 /* state rows per slab in the out kernel */

/* The rows tok..tok+c-1 of head h of x [T][nh][HD] -> xs [GLA_C][HD + 8]
 * by cp.async (not committed), rows c.. zeros. Rows are 16 bytes longer
 * than HD so that the 8 row addresses of one ldmatrix fall in 8 different
 * 4-bank groups. */
template <int HD, int NT>
static __device__ __forceinline__ void gla_tile_load(uint16_t *xs, const uint16_t *x, int tok, int c, int h,
						     int nh)
{
	constexpr int LD = HD + 8, CH = HD / 8;
	for (int i = threadIdx.x; i < GLA_C * CH; i += NT) {
		int r = i / CH, ch = i % CH;
		bool ok = r < c;
		tc_cp16(xs + r * LD + ch * 8, x + (ok ? ((size_t)(tok + r) * nh + h) * HD + ch * 8 : 0),
			ok ? 16 : 0);
	}
}

template <int HD> static constexpr size_t gla_delta_smem()
{
	/* the decayed keys' hi and lo, and v: [GLA_C][HD + 8] bf16 each */
	return (size_t)3 * GLA_C * (HD + 8) * 2;
}

/* D[j][h] = Wᵀ V with W[r][a] = γ^(c-1-r) k_r[a]: M = key dim a, N = value
 * dim b, K = the chunk's tokens r (rows r >= c zero). HD / 16 warps; warp w
 * owns rows a = 16w..16w+15 and all HD columns. */
template <int HD>
static __global__ void __launch_bounds__(HD * 2)
	gla_delta_kernel(float *D, const uint16_t *k, const uint16_t *v, const float *decay, int T, int t0, int nh)
{
	sfwc_pdl_wait();
	constexpr int LD = HD + 8, NT = HD * 2, CH = HD / 8;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *whi = (uint16_t *)smem_raw, *wlo = whi + GLA_C * LD, *vs = wlo + GLA_C * LD;
	const int j = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int gid = lane >> 2, tq = lane & 3;
	const int tb = t0 + j * GLA_C, c = min(GLA_C, T - tb);
	gla_tile_load<HD, NT>(vs, v, tb, c, h, nh);
	tc_cp_commit();
	float lg = -decay[h];
	for (int i = tid; i < GLA_C * CH; i += NT) {
		int r = i / CH, ch = i % CH;
		uint4 hv = make_uint4(0, 0, 0, 0), lv = hv;
		if (r < c) {
			float f[8], g = expf(lg * (float)(c - 1 - r));
			sfwc_unpack8(*(const uint4 *)(k + ((size_t)(tb + r) * nh + h) * HD + ch * 8), f);
			tc_split(f[0] * g, f[1] * g, &hv.x, &lv.x);
			tc_split(f[2] * g, f[3] * g, &hv.y, &lv.y);
			tc_split(f[4] * g, f[5] * g, &hv.z, &lv.z);
			tc_split(f[6] * g, f[7] * g, &hv.w, &lv.w);
		}
		*(uint4 *)(whi + r * LD + ch * 8) = hv;
		*(uint4 *)(wlo + r * LD + ch * 8) = lv;
	}
	tc_cp_wait<0>();
	__syncthreads();
	float acc[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
	for (int kt = 0; kt < GLA_C / 16; kt++) {
		if (16 * kt >= c) /* zero rows only */
			break;
		/* A = Wᵀ (W stored [r][a]): ldmatrix.trans, matrices (r, a) +
		 * (0, 0), (0, 8), (8, 0), (8, 8) give a[0..3] */
		uint32_t ah[4], al[4];
		int ao = (kt * 16 + (lane & 7) + (lane >> 4) * 8) * LD + 16 * w + ((lane >> 3) & 1) * 8;
		tc_ldsm_x4_trans(ah, whi + ao);
		tc_ldsm_x4_trans(al, wlo + ao);
#pragma unroll
		for (int dp = 0; dp < HD / 16; dp++) {
			uint32_t bv[4];
			tc_ldsm_x4_trans(bv, vs + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
						 dp * 16 + (lane >> 4) * 8);
			tc_mma(acc[2 * dp], ah, bv[0], bv[1]);
			tc_mma(acc[2 * dp], al, bv[0], bv[1]);
			tc_mma(acc[2 * dp + 1], ah, bv[2], bv[3]);
			tc_mma(acc[2 * dp + 1], al, bv[2], bv[3]);
		}
	}
	float *Dj = D + ((size_t)j * nh + h) * HD * HD + (size_t)(16 * w + gid) * HD;
#pragma unroll
	for (int n = 0; n < HD / 8; n++) {
		*(float2 *)(Dj + n * 8 + 2 * tq) = make_float2(acc[n][0], acc[n][1]);
		*(float2 *)(Dj + 8 * HD + n * 8 + 2 * tq) = make_float2(acc[n][2], acc[n][3]);
	}
}

static __global__ void gla_scan_kernel(float *D, float *state, const float *decay, int T, int t0, int nh, int hd,
				       int nc)
{
	sfwc_pdl_wait();
	size_t hh = (size_t)hd * hd, e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (e >= (size_t)nh * hh)
		return;
	int h = (int)(e / hh);
	float lg = -decay[h], S = state[e];
	for (int j = 0; j < nc; j++) {
		int c = min(GLA_C, T - (t0 + j * GLA_C));
		float *dp = D + (size_t)j * nh * hh + e; /* D[j][h][a][b], e = h*hh + a*hd + b */
		float d = *dp;
		*dp = S;
		S = expf(lg * (float)c) * S + d;
	}
	state[e] = S;
}

template <int HD> static constexpr size_t gla_out_smem()
{
	/* q, k, v [GLA_C][HD + 8] and a state slab's hi and lo [GLA_SR][HD + 8]
	 * bf16; γ^n for n = 0..GLA_C */
	return (size_t)(3 * GLA_C + 2 * GLA_SR) * (HD + 8) * 2 + sizeof(float) * (GLA_C + 1);
}

/* A state slab (GLA_SR rows of S_j, fp32) in registers: element 4 (tid + u NT). */
template <int HD>
static __device__ __forceinline__ void gla_slab_get(float4 (&pf)[GLA_SR * HD / 4 / (GLA_OW * 32)],
						    const float *S)
{
#pragma unroll
	for (int u = 0; u < GLA_SR * HD / 4 / (GLA_OW * 32); u++)
		pf[u] = ((const float4 *)S)[threadIdx.x + u * GLA_OW * 32];
}

/* ... split, into shi and slo [GLA_SR][HD + 8] */
template <int HD>
static __device__ __forceinline__ void gla_slab_put(uint16_t *shi, uint16_t *slo,
						    const float4 (&pf)[GLA_SR * HD / 4 / (GLA_OW * 32)])
{
#pragma unroll
	for (int u = 0; u < GLA_SR * HD / 4 / (GLA_OW * 32); u++) {
		int e = threadIdx.x + u * GLA_OW * 32, off = e / (HD / 4) * (HD + 8) + e % (HD / 4) * 4;
		uint2 hv, lv;
		tc_split(pf[u].x, pf[u].y, &hv.x, &lv.x);
		tc_split(pf[u].z, pf[u].w, &hv.y, &lv.y);
		*(uint2 *)(shi + off) = hv;
		*(uint2 *)(slo + off) = lv;
	}
}

/* o of chunk j, head h: warp w computes rows i = 16w + gid (+ 8) (rows >= c
 * are not stored), all HD columns, in three steps into one accumulator:
 *   inter: Q S_j, S_j staged GLA_SR rows at a time as hi/lo (the next slab's
 *          loads in flight meanwhile), then rows times γ^(i+1);
 *   A = Q Kᵀ over keys r < 16(w+1) (exact), times γ^(i-r) for r <= i < c,
 *          else 0, in the accumulator registers;
 *   intra: A V, A taken from those registers as the A operand (attn_tc.cuh),
 *          split hi/lo. */
template <int HD>
static __global__ void __launch_bounds__(GLA_OW * 32)
	gla_out_kernel(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *D,
		       const float *decay, int T, int t0, int nh, float scale)
{
	sfwc_pdl_wait();
	constexpr int LD = HD + 8, NT = GLA_OW * 32, NS = HD / GLA_SR;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *qs = (uint16_t *)smem_raw, *ks = qs + GLA_C * LD, *vs = ks + GLA_C * LD;
	uint16_t *shi = vs + GLA_C * LD, *slo = shi + GLA_SR * LD;
	float *dec = (float *)(slo + GLA_SR * LD);
	const int j = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int gid = lane >> 2, tq = lane & 3, i0 = 16 * w + gid, i1 = i0 + 8;
	const int tok = t0 + j * GLA_C, c = min(GLA_C, T - tok);
	gla_tile_load<HD, NT>(qs, q, tok, c, h, nh);
	gla_tile_load<HD, NT>(ks, k, tok, c, h, nh);
	gla_tile_load<HD, NT>(vs, v, tok, c, h, nh);
	tc_cp_commit();
	const float *Sj = D + ((size_t)j * nh + h) * HD * HD;
	float4 pf[GLA_SR * HD / 4 / NT];
	gla_slab_get<HD>(pf, Sj);
	float lg = -decay[h];
	for (int n = tid; n <= GLA_C; n += NT)
		dec[n] = expf(lg * (float)n);
	/* A fragment of Q: rows 16w.., columns kc.. (ldmatrix, attn_tc.cuh) */
	const uint16_t *qa_p = qs + (16 * w + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
	/* B fragments of a [k][n] tile by ldmatrix.trans: this lane's offset */
	const int bt = ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
	float acc[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
	for (int s = 0; s < NS; s++) {
		if (s > 0)
			__syncthreads(); /* the slab before is read */
		gla_slab_put<HD>(shi, slo, pf);
		if (s + 1 < NS)
			gla_slab_get<HD>(pf, Sj + (size_t)(s + 1) * GLA_SR * HD);
		if (s == 0)
			tc_cp_wait<0>();
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < GLA_SR / 16; kk++) {
			uint32_t qa[4];
			tc_ldsm_x4(qa, qa_p + s * GLA_SR + kk * 16);
#pragma unroll
			for (int dp = 0; dp < HD / 16; dp++) {
				uint32_t bh[4], bl[4];
				tc_ldsm_x4_trans(bh, shi + kk * 16 * LD + dp * 16 + bt);
				tc_ldsm_x4_trans(bl, slo + kk * 16 * LD + dp * 16 + bt);
				tc_mma(acc[2 * dp], qa, bh[0], bh[1]);
				tc_mma(acc[2 * dp], qa, bl[0], bl[1]);
				tc_mma(acc[2 * dp + 1], qa, bh[2], bh[3]);
				tc_mma(acc[2 * dp + 1], qa, bl[2], bl[3]);
			}
		}
	}
	const float g0 = dec[i0 + 1], g1 = dec[i1 + 1];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		acc[n][0] *= g0, acc[n][1] *= g0, acc[n][2] *= g1, acc[n][3] *= g1;
	/* A = Q Kᵀ: 8 n-tiles of 8 keys; this warp's rows see keys < 16(w + 1) */
	float a[GLA_C / 8][4];
#pragma unroll
	for (int n = 0; n < GLA_C / 8; n++)
		a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++) {
		uint32_t qa[4];
		tc_ldsm_x4(qa, qa_p + kk * 16);
#pragma unroll
		for (int np = 0; np < GLA_OW; np++)
			if (np <= w) {
				uint32_t kb[4];
				tc_ldsm_x4(kb, ks + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
						       ((lane >> 3) & 1) * 8);
				tc_mma(a[2 * np], qa, kb[0], kb[1]);
				tc_mma(a[2 * np + 1], qa, kb[2], kb[3]);
			}
	}
	/* a[n][e]: row e < 2 ? i0 : i1, key r = 8n + 2tq + (e & 1) */
#pragma unroll
	for (int n = 0; n < GLA_C / 8; n++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int i = e < 2 ? i0 : i1, r = 8 * n + 2 * tq + (e & 1);
			a[n][e] = r <= i && i < c ? a[n][e] * dec[i - r] : 0.0f;
		}
#pragma unroll
	for (int kt = 0; kt < GLA_OW; kt++)
		if (kt <= w) {
			uint32_t ah[4], al[4];
			tc_split(a[2 * kt][0], a[2 * kt][1], &ah[0], &al[0]);
			tc_split(a[2 * kt][2], a[2 * kt][3], &ah[1], &al[1]);
			tc_split(a[2 * kt + 1][0], a[2 * kt + 1][1], &ah[2], &al[2]);
			tc_split(a[2 * kt + 1][2], a[2 * kt + 1][3], &ah[3], &al[3]);
#pragma unroll
			for (int dp = 0; dp < HD / 16; dp++) {
				uint32_t bv[4];
				tc_ldsm_x4_trans(bv, vs + kt * 16 * LD + dp * 16 + bt);
				tc_mma(acc[2 * dp], ah, bv[0], bv[1]);
				tc_mma(acc[2 * dp], al, bv[0], bv[1]);
				tc_mma(acc[2 * dp + 1], ah, bv[2], bv[3]);
				tc_mma(acc[2 * dp + 1], al, bv[2], bv[3]);
			}
		}
	size_t rs = (size_t)nh * HD;
	uint16_t *o0 = o + (size_t)(tok + i0) * rs + (size_t)h * HD + 2 * tq, *o1 = o0 + 8 * rs;
#pragma unroll
	for (int n = 0; n < HD / 8; n++) {
		if (i0 < c)
			*(uint32_t *)(o0 + n * 8) = sfwc_pack2(acc[n][0] * scale, acc[n][1] * scale);
		if (i1 < c)
			*(uint32_t *)(o1 + n * 8) = sfwc_pack2(acc[n][2] * scale, acc[n][3] * scale);
	}
}

/* A kernel's dynamic shared memory limit, raised once per device. */
template <typename K> static void gla_smem_attr(K kernel, size_t smem, bool *set_dev)
{
	bool &set = set_dev[sfwc_device()]; /* harmless if raced */
	if (!set) {
		SFW_CUDA_CHECK(
		    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
		set = true;
	}
}

template <int HD>
static void gla_scan_launch(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *state,
			    const float *decay, int T, int nh, float scale, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	/* the tiles come by 16-byte copies: rows of nh * HD bf16 from the
	 * activation arena (a multiple of 16 bytes apart) */
	SFW_ASSERT((((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0 && ((uintptr_t)o & 3) == 0);
	size_t per_chunk = (size_t)nh * HD * HD * sizeof(float);
	int64_t chunks = (T + GLA_C - 1) / GLA_C, cap = (int64_t)(((size_t)32 << 20) / per_chunk);
	int NC = (int)(chunks < cap ? chunks : cap > 0 ? cap : 1);
	float *D = (float *)sfwi_cuda_scratch(cx, (size_t)NC * per_chunk);
	constexpr size_t dsmem = gla_delta_smem<HD>(), osmem = gla_out_smem<HD>();
	static bool dset[SFWC_MAX_DEVICES], oset[SFWC_MAX_DEVICES]; /* per instantiation and device */
	gla_smem_attr(gla_delta_kernel<HD>, dsmem, dset);
	gla_smem_attr(gla_out_kernel<HD>, osmem, oset);
	unsigned sblocks = (unsigned)(((size_t)nh * HD * HD + GLA_THREADS - 1) / GLA_THREADS);
	for (int t0 = 0; t0 < T; t0 += NC * GLA_C) {
		int nc = (int)(((int64_t)T - t0 + GLA_C - 1) / GLA_C);
		nc = nc < NC ? nc : NC;
		sfwc_launch(gla_delta_kernel<HD>, dim3(nc, nh), dim3(HD * 2), dsmem, s, D, k, v, decay, T, t0,
			    nh);
		SFW_CUDA_LAUNCHED();
		sfwc_launch(gla_scan_kernel, dim3(sblocks), dim3(GLA_THREADS), 0, s, D, state, decay, T, t0, nh, HD, nc);
		SFW_CUDA_LAUNCHED();
		sfwc_launch(gla_out_kernel<HD>, dim3(nc, nh), dim3(GLA_OW * 32), osmem, s, o, q, k, v,
			    (const float *)D, decay, T, t0, nh, scale);
		SFW_CUDA_LAUNCHED();
	}
}

template <typename A, int HD>
static void gla_launch(bool chunked, void *o, const void *q, const void *k, const void *v, float *state,
		       const float *decay, int T, int nh, float scale, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	dim3 grid(nh, HD / 32);
	if (!chunked) {
		sfwc_launch(gla_rec_kernel<A, HD, sfwc_one_seq>, dim3(grid), dim3(GLA_THREADS), 0, s, (A *)o, (const A *)q,
			    (const A *)k, (const A *)v, state, decay, T, nh, scale, sfwc_one_seq());
	} else if (sizeof(A) == 2) {
		gla_scan_launch<HD>((uint16_t *)o, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, state,
				    decay, T, nh, scale, cx);
		return;
	} else {
		constexpr size_t smem = gla_chunk_smem<HD>();
		static bool set[SFWC_MAX_DEVICES]; /* per instantiation and device */
		gla_smem_attr(gla_chunk_kernel<A, HD>, smem, set);
		sfwc_launch(gla_chunk_kernel<A, HD>, dim3(grid), dim3(GLA_THREADS), smem, s, (A *)o, (const A *)q, (const A *)k,
									 (const A *)v, state, decay, T, nh, scale);
	}
	SFW_CUDA_LAUNCHED();
}

static void gla_any(bool chunked, void *o, const void *q, const void *k, const void *v, float *state,
		    const float *decay, int T, int nh, int hd, float scale, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (T <= 0)
		return;
	switch (hd) {
	case 32: ACT_DISPATCH(act, gla_launch<A, 32>(chunked, o, q, k, v, state, decay, T, nh, scale, cx)); break;
	case 64: ACT_DISPATCH(act, gla_launch<A, 64>(chunked, o, q, k, v, state, decay, T, nh, scale, cx)); break;
	case 128: ACT_DISPATCH(act, gla_launch<A, 128>(chunked, o, q, k, v, state, decay, T, nh, scale, cx)); break;
	default:
		fprintf(stderr, "salafw: lightning head_dim %d is not supported on CUDA (32, 64, 128)\n", hd);
		abort();
	}
}

extern "C" void sfw_op_gla_recurrent_cuda(void *o, const void *q, const void *k, const void *v, float *state,
					  const float *decay, const struct sfw_gla_shape *sh,
					  enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	gla_any(false, o, q, k, v, state, decay, sh->T, sh->nh, sh->hd, sh->scale, act, cx);
}

extern "C" void sfw_op_gla_chunked_cuda(void *o, const void *q, const void *k, const void *v, float *state,
					const float *decay, const struct sfw_gla_shape *sh,
					enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(sh->chunk > 0);
	gla_any(true, o, q, k, v, state, decay, sh->T, sh->nh, sh->hd, sh->scale, act, cx);
}

/* A batched decode step: row i (T = 1) against sequence i's state. */
extern "C" void sfw_cuda_gla_seqs(void *o, const void *q, const void *k, const void *v,
				  const struct sfw_cuda_seqs *s, const float *decay,
				  const struct sfw_gla_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	int nh = sh->nh, hd = sh->hd;
	float scale = sh->scale;
	SFW_ASSERT(s->n >= 1 && s->n <= SFW_CUDA_SEQS_MAX);
	cudaStream_t st = SFW_CUDA_STREAM(cx->stream);
#define GLA_SEQS(HD)                                                                                             \
	ACT_DISPATCH(act, sfwc_launch(gla_rec_kernel<A, HD, sfw_cuda_seqs>, dim3(nh, HD / 32, s->n), dim3(GLA_THREADS), \
				      0, st, (A *)o, (const A *)q, (const A *)k, (const A *)v, (float *)NULL, decay, 1, \
				      nh, scale, *s))
	switch (hd) {
	case 32: GLA_SEQS(32); break;
	case 64: GLA_SEQS(64); break;
	case 128: GLA_SEQS(128); break;
	default:
		fprintf(stderr, "salafw: lightning head_dim %d is not supported on CUDA (32, 64, 128)\n", hd);
		abort();
	}
#undef GLA_SEQS
	SFW_CUDA_LAUNCHED();
}
