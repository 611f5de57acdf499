/* lightning.cu - CUDA twins of kernels/lightning.c: simple gated linear
 * attention with an fp32 state [nh, hd(k), hd(v)] updated in place.
 *
 * Every form splits a head's state by value columns into tiles (of 32, or
 * of 16 or 32 on tensor cores): one block per (head, tile), so the state
 * never leaves the block between tokens and no block depends on another.
 * The recurrent form (decode) keeps its tile in registers; the chunked form
 * (prefill) walks the sequence in chunks (intra-chunk causal part +
 * inter-chunk state term, as fla's chunk_simple_gla; the chunk length
 * changes only the fp32 summation order, not the function): on fp32 in
 * sub-chunks of up to 32 tokens with its tile in shared memory, on bf16 in
 * chunks of 64 on tensor cores with its tile in registers (the section
 * "chunked prefill on tensor cores"). */
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

/* ---- chunked prefill on tensor cores, one kernel (bf16; fp32 takes the serial kernel above) ----
 * One launch per call. A block owns head h and the value columns b0 ..
 * b0 + BV - 1 and walks all the call's chunks of GLA_C tokens in order (the
 * last one partial, c = min(GLA_C, T - tok)); its state slice S[a][b0..)
 * (a = 0..HD-1, fp32) stays in registers for the whole call, read from and
 * written back to state once. Per chunk j, with S_j the slice before it:
 *   out:    o_i = scale (γ^(i+1) q_i S_j + Σ_{r≤i} γ^(i-r) (q_i·k_r) v_r),
 *           rows i >= c not stored;
 *   update: S_{j+1} = γ^c S_j + Wᵀ V, W[r][a] = γ^(c-1-r) k_r[a]: the
 *           registers are scaled by γ^c, then Wᵀ V is accumulated onto them.
 * This replaces a three-launch form (per chunk deltas Wᵀ V in global memory,
 * a serial scan over them, then the outputs) whose fp32 per-chunk states,
 * 64 KB per chunk and head (~1 GB of traffic for 8,192 rows of 32 heads of
 * 128), and 24 launches per call cost far more than its FLOPs. The price
 * here is that the HD / BV blocks of a head each compute the chunk's Q Kᵀ,
 * and that one block is a serial walk over the chunks.
 *
 * Every product runs on tensor cores (mma.sync m16n8k16, bf16 in, fp32
 * accumulate; fragment layouts: attn_tc.cuh). Products of bf16 q, k, v are
 * exact in fp32, so those MMAs differ from the CPU twin only in the fp32
 * summation order. Three operands are fp32 instead: the state S_j (a B
 * operand of the out step), the decayed intra-chunk weights A[i][r] =
 * γ^(i-r) (q_i·k_r) and the decayed keys W. Rounding them to bf16 would
 * lose all but 8 significant bits; each is split instead into hi + lo
 * (tc_split: hi = bf16(x), lo = bf16(x - hi)) and multiplied by two MMAs,
 * hi y + lo y, against an exact bf16 y, so every product is within 2^-16
 * relative of the fp32 one. The state is fp32 in the registers; the out step
 * reads its hi/lo copy in shared memory, rewritten after each update. The
 * row factor γ^(i+1) of the inter-chunk term is applied to the fp32
 * accumulator, as the twin does. Decay powers are expf(-decay n), the
 * twin's expression.
 *
 * Warps: GLA_FW; in the out step warp w owns chunk rows 16w..16w+15 (all BV
 * columns; its keys r <= i lie in k-tiles 0..w), in the update it owns
 * m-tiles (state rows a) and n-tiles (columns) of the slice (gla_part).
 * Shared memory: two stages of q, k [GLA_C][HD + 8] and v [GLA_C][BV + 8]
 * (the next chunk's copies by cp.async in flight while this one computes),
 * the slice's hi and lo [HD][BV + 8]; W's hi and lo are written over the
 * chunk's q and k once the out step has read them. Rows are 16 bytes longer
 * than the data so that the 8 row addresses of one ldmatrix fall in 8
 * different 4-bank groups. */
#define GLA_C 64
#define GLA_FW 4 /* warps of the fused kernel: GLA_C / 16 */
#define GLA_FT (GLA_FW * 32)

template <int HD, int BV> static constexpr size_t gla_fused_smem()
{
	/* two stages of q, k [GLA_C][HD + 8] and v [GLA_C][BV + 8], the state
	 * slice's hi and lo [HD][BV + 8] (bf16); γ^n for n = 0..GLA_C */
	return ((size_t)2 * GLA_C * (2 * (HD + 8) + BV + 8) + (size_t)2 * HD * (BV + 8)) * 2 +
	       sizeof(float) * (GLA_C + 1);
}

/* Rows tok..tok+c-1 of x (row stride rs elements, W columns from x) -> xs
 * [GLA_C][W + 8] by cp.async (not committed), rows c.. zeros. */
template <int W>
static __device__ __forceinline__ void gla_tile_load(uint16_t *xs, const uint16_t *x, size_t rs, int tok,
						     int c)
{
	constexpr int CH = W / 8;
	for (int i = threadIdx.x; i < GLA_C * CH; i += GLA_FT) {
		int r = i / CH, ch = i % CH;
		bool ok = r < c;
		tc_cp16(xs + r * (W + 8) + ch * 8, x + (ok ? (size_t)(tok + r) * rs + ch * 8 : 0),
			ok ? 16 : 0);
	}
}

/* The block's state slice: MPW m-tiles x NPW n-tiles of 16 x 8 per warp, in
 * the C/D fragment layout (attn_tc.cuh); warp w = wm + WM wn, its m-tile mi
 * is state rows 16 (wm + WM mi).., its n-tile jn columns 8 (wn NPW + jn)..
 * of the slice (hd 32: two warps split the columns of each m-tile). */
template <int HD, int BV> struct gla_part {
	static constexpr int MT = HD / 16, WM = MT < GLA_FW ? MT : GLA_FW, WN = GLA_FW / WM;
	static constexpr int MPW = MT / WM, NPW = BV / 8 / WN;
	static_assert(WM * WN == GLA_FW && NPW >= 1 && (NPW == 1 || NPW % 2 == 0), "state tiling");
};

/* The slice's registers -> its hi/lo copy [HD][BV + 8] (the B operand of
 * the out step). */
template <int HD, int BV>
static __device__ __forceinline__ void
gla_state_put(uint16_t *shi, uint16_t *slo, const float (&s)[gla_part<HD, BV>::MPW][gla_part<HD, BV>::NPW][4],
	      int wm, int wn, int lane)
{
	using P = gla_part<HD, BV>;
	constexpr int LV = BV + 8;
#pragma unroll
	for (int mi = 0; mi < P::MPW; mi++)
#pragma unroll
		for (int jn = 0; jn < P::NPW; jn++) {
			int off = (16 * (wm + P::WM * mi) + (lane >> 2)) * LV + 8 * (wn * P::NPW + jn) +
				  2 * (lane & 3);
			uint32_t hw, lw;
			tc_split(s[mi][jn][0], s[mi][jn][1], &hw, &lw);
			*(uint32_t *)(shi + off) = hw, *(uint32_t *)(slo + off) = lw;
			tc_split(s[mi][jn][2], s[mi][jn][3], &hw, &lw);
			*(uint32_t *)(shi + off + 8 * LV) = hw, *(uint32_t *)(slo + off + 8 * LV) = lw;
		}
}

/* The slice's registers from (STORE false) or to (STORE true) the state,
 * Sg = the slice's first column of row 0. */
template <int HD, int BV, bool STORE>
static __device__ __forceinline__ void
gla_state_io(float (&s)[gla_part<HD, BV>::MPW][gla_part<HD, BV>::NPW][4], float *Sg, int wm, int wn, int lane)
{
	using P = gla_part<HD, BV>;
#pragma unroll
	for (int mi = 0; mi < P::MPW; mi++)
#pragma unroll
		for (int jn = 0; jn < P::NPW; jn++) {
			float *p = Sg + (size_t)(16 * (wm + P::WM * mi) + (lane >> 2)) * HD +
				   8 * (wn * P::NPW + jn) + 2 * (lane & 3);
			if (STORE) {
				*(float2 *)p = make_float2(s[mi][jn][0], s[mi][jn][1]);
				*(float2 *)(p + 8 * HD) = make_float2(s[mi][jn][2], s[mi][jn][3]);
			} else {
				float2 x0 = *(const float2 *)p, x1 = *(const float2 *)(p + 8 * HD);
				s[mi][jn][0] = x0.x, s[mi][jn][1] = x0.y, s[mi][jn][2] = x1.x,
				s[mi][jn][3] = x1.y;
			}
		}
}

/* The out step of one chunk of c rows for warp w: rows i0 = 16w + gid and
 * i1 = i0 + 8 (rows >= c not stored) at o0 and o0 + 8 rs, BV columns; qs, ks,
 * vs the chunk's tiles, shi/slo the slice S_j, dec[n] = γ^n. Three steps
 * into one accumulator:
 *   inter: Q S_j, S_j as hi + lo, then rows times γ^(i+1);
 *   A = Q Kᵀ over keys r < 16(w+1) (exact), times γ^(i-r) for r <= i < c,
 *          else 0, in the accumulator registers;
 *   intra: A V, A taken from those registers as the A operand (attn_tc.cuh),
 *          split hi/lo.
 * Lane offsets of ldmatrix (attn_tc.cuh): qa_o, the A fragment of Q
 * (row-major, this warp's rows); bt_o, a B fragment of a [k][n] tile by
 * .trans (the state, v); kb_o, a B fragment of an [n][k] tile (k). */
template <int HD, int BV>
static __device__ __forceinline__ void
gla_chunk_out(uint16_t *o0, size_t rs, const uint16_t *qs, const uint16_t *ks, const uint16_t *vs,
	      const uint16_t *shi, const uint16_t *slo, const float *dec, int c, float scale)
{
	constexpr int LK = HD + 8, LV = BV + 8;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, tq = lane & 3;
	const int i0 = 16 * w + (lane >> 2), i1 = i0 + 8;
	const int qa_o = (16 * w + (lane & 7) + ((lane >> 3) & 1) * 8) * LK + (lane >> 4) * 8;
	const int bt_o = ((lane & 7) + ((lane >> 3) & 1) * 8) * LV + (lane >> 4) * 8;
	const int kb_o = ((lane & 7) + (lane >> 4) * 8) * LK + ((lane >> 3) & 1) * 8;
	uint32_t qa[HD / 16][4];
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
		tc_ldsm_x4(qa[kk], qs + qa_o + kk * 16);
	float acc[BV / 8][4];
#pragma unroll
	for (int n = 0; n < BV / 8; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int dp = 0; dp < BV / 16; dp++) {
			uint32_t bh[4], bl[4];
			tc_ldsm_x4_trans(bh, shi + kk * 16 * LV + dp * 16 + bt_o);
			tc_ldsm_x4_trans(bl, slo + kk * 16 * LV + dp * 16 + bt_o);
			tc_mma(acc[2 * dp], qa[kk], bh[0], bh[1]);
			tc_mma(acc[2 * dp], qa[kk], bl[0], bl[1]);
			tc_mma(acc[2 * dp + 1], qa[kk], bh[2], bh[3]);
			tc_mma(acc[2 * dp + 1], qa[kk], bl[2], bl[3]);
		}
	const float g0 = dec[i0 + 1], g1 = dec[i1 + 1];
#pragma unroll
	for (int n = 0; n < BV / 8; n++)
		acc[n][0] *= g0, acc[n][1] *= g0, acc[n][2] *= g1, acc[n][3] *= g1;
	/* A: 8 n-tiles of 8 keys; keys >= c are zero rows of ks */
	float a[GLA_C / 8][4];
#pragma unroll
	for (int n = 0; n < GLA_C / 8; n++)
		a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int np = 0; np < GLA_FW; np++)
			if (np <= w && 16 * np < c) {
				uint32_t kb[4];
				tc_ldsm_x4(kb, ks + np * 16 * LK + kk * 16 + kb_o);
				tc_mma(a[2 * np], qa[kk], kb[0], kb[1]);
				tc_mma(a[2 * np + 1], qa[kk], kb[2], kb[3]);
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
	for (int kt = 0; kt < GLA_FW; kt++)
		if (kt <= w && 16 * kt < c) {
			uint32_t ah[4], al[4];
			tc_split(a[2 * kt][0], a[2 * kt][1], &ah[0], &al[0]);
			tc_split(a[2 * kt][2], a[2 * kt][3], &ah[1], &al[1]);
			tc_split(a[2 * kt + 1][0], a[2 * kt + 1][1], &ah[2], &al[2]);
			tc_split(a[2 * kt + 1][2], a[2 * kt + 1][3], &ah[3], &al[3]);
#pragma unroll
			for (int dp = 0; dp < BV / 16; dp++) {
				uint32_t bv[4];
				tc_ldsm_x4_trans(bv, vs + kt * 16 * LV + dp * 16 + bt_o);
				tc_mma(acc[2 * dp], ah, bv[0], bv[1]);
				tc_mma(acc[2 * dp], al, bv[0], bv[1]);
				tc_mma(acc[2 * dp + 1], ah, bv[2], bv[3]);
				tc_mma(acc[2 * dp + 1], al, bv[2], bv[3]);
			}
		}
	uint16_t *o1 = o0 + 8 * rs;
#pragma unroll
	for (int n = 0; n < BV / 8; n++) {
		if (i0 < c)
			*(uint32_t *)(o0 + n * 8) = sfwc_pack2(acc[n][0] * scale, acc[n][1] * scale);
		if (i1 < c)
			*(uint32_t *)(o1 + n * 8) = sfwc_pack2(acc[n][2] * scale, acc[n][3] * scale);
	}
}

/* The chunk's decayed keys W[r][a] = γ^(c-1-r) k_r[a] (k in ks, rows >= c
 * zero), split: hi written over qs, lo over ks, in place. */
template <int HD>
static __device__ __forceinline__ void gla_w_put(uint16_t *qs, uint16_t *ks, const float *dec, int c)
{
	constexpr int LK = HD + 8;
	for (int i = threadIdx.x; i < GLA_C * HD / 8; i += GLA_FT) {
		int r = i / (HD / 8), off = r * LK + i % (HD / 8) * 8;
		uint4 hv = make_uint4(0, 0, 0, 0), lv = hv;
		if (r < c) {
			float f[8], g = dec[c - 1 - r];
			sfwc_unpack8(*(const uint4 *)(ks + off), f);
			tc_split(f[0] * g, f[1] * g, &hv.x, &lv.x);
			tc_split(f[2] * g, f[3] * g, &hv.y, &lv.y);
			tc_split(f[4] * g, f[5] * g, &hv.z, &lv.z);
			tc_split(f[6] * g, f[7] * g, &hv.w, &lv.w);
		}
		*(uint4 *)(qs + off) = hv;
		*(uint4 *)(ks + off) = lv;
	}
}

/* The update of the slice's registers over one chunk of c rows: S = γ^c S +
 * Wᵀ V, M = state rows a, N = the slice's columns, K = the chunk's tokens r
 * (k-tiles past c skipped); whi/wlo = W's hi and lo (gla_w_put), vs = V.
 * Wᵀ's A fragments by ldmatrix.trans of W [r][a], lane offset as a B
 * fragment of an [n][k] tile (attn_tc.cuh): matrices (r, a) + (0, 0), (0,
 * 8), (8, 0), (8, 8) give a[0..3]. */
template <int HD, int BV>
static __device__ __forceinline__ void
gla_state_update(float (&s)[gla_part<HD, BV>::MPW][gla_part<HD, BV>::NPW][4], const uint16_t *whi,
		 const uint16_t *wlo, const uint16_t *vs, const float *dec, int c, int wm, int wn, int lane)
{
	using P = gla_part<HD, BV>;
	constexpr int LK = HD + 8, LV = BV + 8, NPP = (P::NPW + 1) / 2;
	const int bt_o = ((lane & 7) + ((lane >> 3) & 1) * 8) * LV + (lane >> 4) * 8;
	const int wa_o = ((lane & 7) + (lane >> 4) * 8) * LK + ((lane >> 3) & 1) * 8;
	const float gc = dec[c];
#pragma unroll
	for (int mi = 0; mi < P::MPW; mi++)
#pragma unroll
		for (int jn = 0; jn < P::NPW; jn++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				s[mi][jn][e] *= gc;
#pragma unroll
	for (int kt = 0; kt < GLA_C / 16; kt++) {
		if (16 * kt >= c)
			break;
		/* V's B fragments: pairs of n-tiles; one n-tile per warp (NPW
		 * 1) takes its half of a pair */
		uint32_t bv[NPP][4];
#pragma unroll
		for (int p = 0; p < NPP; p++)
			tc_ldsm_x4_trans(bv[p],
					 vs + kt * 16 * LV + ((wn * P::NPW) >> 1) * 16 + p * 16 + bt_o);
#pragma unroll
		for (int mi = 0; mi < P::MPW; mi++) {
			uint32_t ah[4], al[4];
			int ao = kt * 16 * LK + 16 * (wm + P::WM * mi) + wa_o;
			tc_ldsm_x4_trans(ah, whi + ao);
			tc_ldsm_x4_trans(al, wlo + ao);
#pragma unroll
			for (int jn = 0; jn < P::NPW; jn++) {
				bool hi = P::NPW == 1 ? (wn & 1) : (jn & 1);
				uint32_t x0 = hi ? bv[jn >> 1][2] : bv[jn >> 1][0];
				uint32_t x1 = hi ? bv[jn >> 1][3] : bv[jn >> 1][1];
				tc_mma(s[mi][jn], ah, x0, x1);
				tc_mma(s[mi][jn], al, x0, x1);
			}
		}
	}
}

/* grid (nh, HD / BV), GLA_FT threads: the state slice of head blockIdx.x,
 * columns blockIdx.y BV.., over all T rows (the section's comment). */
template <int HD, int BV>
static __global__ void __launch_bounds__(GLA_FT)
    gla_fused_kernel(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *state,
		     const float *decay, int T, int nh, float scale)
{
	sfwc_pdl_wait();
	using P = gla_part<HD, BV>;
	constexpr int LK = HD + 8, LV = BV + 8, SZ = GLA_C * (2 * LK + LV); /* SZ: one stage */
	static_assert(BV % 16 == 0 && BV <= HD && GLA_C == 16 * GLA_FW, "shape");
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *stg = (uint16_t *)smem_raw, *shi = stg + 2 * SZ, *slo = shi + HD * LV;
	float *dec = (float *)(slo + HD * LV);
	const int h = blockIdx.x, b0 = blockIdx.y * BV, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int wm = w % P::WM, wn = w / P::WM;
	const size_t rs = (size_t)nh * HD;
	const uint16_t *qh = q + (size_t)h * HD, *kh = k + (size_t)h * HD, *vh = v + (size_t)h * HD + b0;
	float *Sg = state + (size_t)h * HD * HD + b0;
	gla_tile_load<HD>(stg, qh, rs, 0, min(GLA_C, T));
	gla_tile_load<HD>(stg + GLA_C * LK, kh, rs, 0, min(GLA_C, T));
	gla_tile_load<BV>(stg + 2 * GLA_C * LK, vh, rs, 0, min(GLA_C, T));
	tc_cp_commit();
	const float lg = -decay[h];
	for (int n = tid; n <= GLA_C; n += GLA_FT)
		dec[n] = expf(lg * (float)n);
	float s[P::MPW][P::NPW][4];
	gla_state_io<HD, BV, false>(s, Sg, wm, wn, lane);
	gla_state_put<HD, BV>(shi, slo, s, wm, wn, lane);
	/* this lane's output rows 16w + gid (+ 8), columns b0 + 2tq.. */
	uint16_t *ol = o + (size_t)(16 * w + (lane >> 2)) * rs + (size_t)h * HD + b0 + 2 * (lane & 3);
	const int nch = (int)(((int64_t)T + GLA_C - 1) / GLA_C);
	for (int j = 0; j < nch; j++) {
		const int tok = j * GLA_C, c = min(GLA_C, T - tok);
		uint16_t *qs = stg + (j & 1) * SZ, *ks = qs + GLA_C * LK, *vs = ks + GLA_C * LK;
		tc_cp_wait<0>();
		/* chunk j's tiles are in; every warp is done with chunk j - 1
		 * (its stage is free, the slice's hi/lo rewritten) */
		__syncthreads();
		if (j + 1 < nch) {
			uint16_t *nq = stg + ((j + 1) & 1) * SZ;
			int nt = tok + GLA_C, cn = min(GLA_C, T - nt);
			gla_tile_load<HD>(nq, qh, rs, nt, cn);
			gla_tile_load<HD>(nq + GLA_C * LK, kh, rs, nt, cn);
			gla_tile_load<BV>(nq + 2 * GLA_C * LK, vh, rs, nt, cn);
			tc_cp_commit();
		}
		gla_chunk_out<HD, BV>(ol + (size_t)tok * rs, rs, qs, ks, vs, shi, slo, dec, c, scale);
		__syncthreads(); /* q and k of this chunk are read */
		gla_w_put<HD>(qs, ks, dec, c);
		__syncthreads(); /* W is written */
		gla_state_update<HD, BV>(s, qs, ks, vs, dec, c, wm, wn, lane);
		if (j + 1 < nch)
			gla_state_put<HD, BV>(shi, slo, s, wm, wn, lane);
	}
	gla_state_io<HD, BV, true>(s, Sg, wm, wn, lane);
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

/* gla_fused_kernel<HD, BV> made ready on the current device (its shared
 * memory limit raised); returns how many of its blocks one SM holds there
 * (asked once per device). */
template <int HD, int BV> static int gla_fused_prepare(void)
{
	constexpr size_t smem = gla_fused_smem<HD, BV>();
	static bool set[SFWC_MAX_DEVICES];
	static int fit[SFWC_MAX_DEVICES]; /* 0: not asked yet; harmless if raced */
	gla_smem_attr(gla_fused_kernel<HD, BV>, smem, set);
	int &n = fit[sfwc_device()];
	if (n == 0) {
		int b = 0;
		SFW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gla_fused_kernel<HD, BV>,
									     GLA_FT, smem));
		n = b > 0 ? b : -1;
	}
	return n;
}

template <int HD, int BV>
static void gla_fused_go(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *state,
			 const float *decay, int T, int nh, float scale, cudaStream_t s)
{
	(void)gla_fused_prepare<HD, BV>();
	sfwc_launch(gla_fused_kernel<HD, BV>, dim3(nh, HD / BV), dim3(GLA_FT), gla_fused_smem<HD, BV>(), s, o,
		    q, k, v, state, decay, T, nh, scale);
}

template <int HD>
static void gla_fused_launch(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v,
			     float *state, const float *decay, int T, int nh, float scale,
			     struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	/* the tiles come by 16-byte copies: rows of nh * HD bf16 from the
	 * activation arena (a multiple of 16 bytes apart) */
	SFW_ASSERT((((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0 && ((uintptr_t)o & 3) == 0);
	/* The slice width. A block is one serial walk over the chunks by 4
	 * warps, bound by the latency of its dependent MMAs and barriers, not
	 * by the tensor pipes: a second resident block per SM does nearly
	 * twice the work in the same time. So BV = 32 when its grid alone
	 * gives every SM two blocks; else BV = 16, twice the blocks (each
	 * re-computes the chunk's Q Kᵀ for a slice half as wide; the rest of
	 * its work halves), provided an SM holds two of them (else they only
	 * add waves). 32 heads of 128 on an H100 (132 SMs): 128 blocks at 32,
	 * so 256 at 16, two per SM for all but 8 SMs (86 KB of shared memory
	 * each). */
	if ((int64_t)nh * (HD / 32) >= 2 * (int64_t)sfwi_cuda_sms(cx) || gla_fused_prepare<HD, 16>() < 2)
		gla_fused_go<HD, 32>(o, q, k, v, state, decay, T, nh, scale, s);
	else
		gla_fused_go<HD, 16>(o, q, k, v, state, decay, T, nh, scale, s);
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
		gla_fused_launch<HD>((uint16_t *)o, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, state,
				     decay, T, nh, scale, cx);
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
