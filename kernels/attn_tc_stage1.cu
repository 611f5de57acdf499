/* attn_tc_stage1.cu - tensor-core stage-1 scoring of InfLLM-v2 block
 * selection for prefill (the meaning of sfw_op_stage1, kernels/infllm.c;
 * decode rows: kernels/attn_tc_stage1_dec.cu):
 *   LSE_h = log sum_{j2 visible} exp(scale q_h.c2[j2])
 *   s[g, r, j] = sum_{h in g} exp(scale q_h.c1[j] - LSE_h) for visible j, else 0.
 * Fragment layouts: kernels/attn_tc.cuh.
 *
 * Prefill: the products are taken transposed, keys as the M side: a warp
 * computes D[key][head] = K[key] . Q[head] for S1T_TOK query tokens at once,
 * each 16-key m-tile of compressed keys (an A fragment, ldmatrix from shared
 * memory) against every token's G heads of one KV group (two n-tiles of 8
 * heads, B fragments held in registers; heads >= G are zero). A key tile thus
 * feeds S1T_TOK tokens' MMAs from one shared-memory read, and the sum over a
 * token's heads is a sum over the columns a lane holds: four values in the
 * lane, then a reduce-scatter over its quad (3 shuffles give each lane one
 * finished (token, key) sum). A CTA holds S1T_W warps, S1T_R = S1T_W *
 * S1T_TOK consecutive tokens of one group, which read the same compressed
 * keys: each 64-chunk tile is loaded once per CTA (cp.async, two stages). The
 * CTA first walks the level-2 tiles (an online max / sum of exp2 per head and
 * lane, merged over the lanes of a head at the switch: the LSE), then the
 * level-1 tiles: per element exp2(x - LSE_h) (log2 domain), summed over the
 * heads, NaN -> 0, rounded to bf16 as the CUDA-core kernel. Columns past the
 * CTA's tiles up to n1 are written as zeros (the CPU twin's memset). */
#include "attn_tc.cuh"

#include <limits.h>

#define S1T_TILE 64		  /* compressed keys per tile */
#ifndef S1T_W
#define S1T_W 4 /* warps per CTA (-D: for measuring other shapes) */
#endif
#define S1T_TOK 2		  /* query tokens per warp */
#define S1T_R (S1T_W * S1T_TOK) /* query tokens per CTA */

struct s1tc_args {
	float *scores;
	const uint16_t *q, *c1, *c2;
	int64_t n1, n2, pos0; /* from sp when the kernel runs */
	sfwc_selpos sp;
	int T, nh, nkv, ksize, stride;
	float scale_log2; /* scale * log2(e) */
	const int32_t *tab; /* paged compressed keys (sfw_ckey_row), or NULL */
	int shift;
	/* POOL: the pooled blocks' parameters (ksize = 2 stride, block = 4
	 * stride: block b pools chunks 4b - 1 .. 4b + 3) */
	int block, init_blocks, local_blocks;
};

/* The rows of a tile each thread copies (s1t_load): S1T_TILE rows of HD / 8
 * 16-byte pieces over the CTA's threads. */
template <int HD> struct s1t_rows {
	static constexpr int N = S1T_TILE * (HD / 8) / (S1T_W * 32);
	static_assert(N * S1T_W * 32 == S1T_TILE * (HD / 8), "a tile's pieces over the CTA's threads");
	/* the compressed-key row of each (sfw_ckey_row) is blk[k] * per + off[k]
	 * (contiguous: blk 0); off -1: past the visible chunks. blk holds the
	 * block-table load, used only when the tile is copied. */
	int32_t blk[N];
	int32_t off[N]; /* (the launch keeps n1 and n2 below INT_MAX) */
};

/* Where tile i's rows are (level-2 tile i for i < nA, else level-1 tile
 * i - nA; chunks past the CTA's visible ones, v2max and v1max, are -1).
 * Paged keys cost a block-table load per row: the caller fetches a tile's
 * rows a tile ahead of its copy, so the loads are in flight while the
 * tile before is computed. */
template <int HD>
static __device__ __forceinline__ void s1t_where(const s1tc_args &a, s1t_rows<HD> &w, int i, int nA, int64_t v1max,
						 int64_t v2max)
{
	constexpr int CH = HD / 8, RSTEP = S1T_W * 32 / CH; /* a thread's rows RSTEP apart */
	static_assert(S1T_W * 32 % CH == 0, "a thread keeps its column");
	const int level = i < nA ? 2 : 1;
	const int j0 = (i < nA ? i : i - nA) * S1T_TILE + (int)threadIdx.x / CH; /* the thread's first row */
	const int lim = (int)(i < nA ? v2max : v1max);
	if (!a.tab) {
#pragma unroll
		for (int k = 0; k < s1t_rows<HD>::N; k++) {
			const int j = j0 + k * RSTEP;
			w.blk[k] = 0, w.off[k] = j < lim ? j : -1;
		}
		return;
	}
	/* sfw_ckey_row in two parts, in 32 bits (s1t_keys_ok: every chunk's
	 * last token is an int): chunk j's last token is e = j 2^L + c */
	const int L = sfw_log2i(a.stride) + (level == 2 ? 2 : 0), c = (a.ksize << (level == 2 ? 2 : 0)) - 1;
	const unsigned mask = (1u << a.shift) - 1u;
#pragma unroll
	for (int k = 0; k < s1t_rows<HD>::N; k++) {
		const int j = j0 + k * RSTEP;
		const unsigned e = ((unsigned)j << L) + (unsigned)c;
		w.blk[k] = 0, w.off[k] = -1;
		if (j < lim) {
			w.blk[k] = __ldg(&a.tab[e >> a.shift]);
			w.off[k] = (int)((e & mask) >> L);
		}
	}
}

/* tile i -> stage st, from the rows w says (s1t_where): row blk per + off
 * of the level's array [rows, nkv, HD], the thread's column of head g */
template <int HD>
static __device__ __forceinline__ void s1t_load(const s1tc_args &a, uint16_t (*tile)[S1T_TILE * (HD + 8)],
						const s1t_rows<HD> &w, int i, int st, int nA, int g)
{
	constexpr int LD = HD + 8, CH = HD / 8, RSTEP = S1T_W * 32 / CH; /* a thread's rows RSTEP apart */
	const int ch = (int)threadIdx.x % CH;
	const char *src = (const char *)((i < nA ? a.c2 : a.c1) + g * HD + ch * 8);
	/* bytes a row and a block (both nonnegative, as blk and off of a row
	 * that is copied: unsigned products, one IMAD.WIDE.U32 each) */
	const unsigned rs = (unsigned)(a.nkv * HD * 2);
	const unsigned brs = a.tab ? (unsigned)sfw_ckey_per(a.shift, a.stride) * rs : 0u;
	uint16_t *dst = &tile[st][((int)threadIdx.x / CH) * LD + ch * 8];
#pragma unroll
	for (int k = 0; k < s1t_rows<HD>::N; k++) {
		const bool ok = w.off[k] >= 0;
		const char *p = src + (uint64_t)(unsigned)w.blk[k] * brs + (uint64_t)(unsigned)w.off[k] * rs;
		tc_cp16(dst + k * RSTEP * LD, ok ? p : src, ok ? 16 : 0);
	}
	tc_cp_commit();
}

/* Token t's Q as B fragments of D = K Qᵀ (k = head dims, n = heads):
 * qb[kk][nt] = {Q[8nt + gid][16kk + 2tq, +1], Q[8nt + gid][16kk + 2tq + 8, +9]}
 * of the G heads of group g (heads >= G, or an inactive row, zero). */
template <int HD>
static __device__ __forceinline__ void s1t_load_qb(uint32_t (&qb)[HD / 16][2][2], const uint16_t *q, bool active,
						   int r, int nh, int g, int G, int lane)
{
	const int gid = lane >> 2, tq = lane & 3;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int nt = 0; nt < 2; nt++) {
			int h = 8 * nt + gid;
			const uint16_t *row = q + ((size_t)r * nh + (size_t)g * G + h) * HD + kk * 16 + 2 * tq;
			bool ok = active && h < G;
			qb[kk][nt][0] = ok ? *(const uint32_t *)row : 0u;
			qb[kk][nt][1] = ok ? *(const uint32_t *)(row + 8) : 0u;
		}
}

/* d[t][nt] = the C fragments of keys 16m.. of tile Ks [64][HD + 8] against
 * token t's heads of n-tile nt: c[0], c[1] = key gid, heads 8nt + 2tq, +1;
 * c[2], c[3] = key gid + 8, the same heads */
template <int HD>
static __device__ __forceinline__ void s1t_mtile(float (&d)[S1T_TOK][2][4], const uint32_t (&qb)[S1T_TOK][HD / 16][2][2],
						 const uint16_t *Ks, int m, int lane)
{
	constexpr int LD = HD + 8;
#pragma unroll
	for (int t = 0; t < S1T_TOK; t++)
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
			d[t][nt][0] = d[t][nt][1] = d[t][nt][2] = d[t][nt][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++) {
		uint32_t ka[4];
		tc_ldsm_x4(ka, Ks + (m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
		for (int t = 0; t < S1T_TOK; t++)
#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
				tc_mma(d[t][nt], ka, qb[t][kk][nt][0], qb[t][kk][nt][1]);
			}
	}
}

/* Level 2, one m-tile (keys jA = j0 + gid and jA + 8, visible while below
 * v2; FULL: the whole m-tile is visible to both tokens): the lane's online
 * max m and sum l of exp2 per (token, head slot 2nt + e), log2 domain; l is
 * rescaled only when m grows. */
template <bool FULL>
static __device__ __forceinline__ void s1t_level2(const float (&d)[S1T_TOK][2][4], float (&m)[S1T_TOK][4],
						  float (&l)[S1T_TOK][4], int jA, const int (&v2)[S1T_TOK],
						  float scale_log2)
{
#pragma unroll
	for (int t = 0; t < S1T_TOK; t++) {
		const bool va = FULL || jA < v2[t], vb = FULL || jA + 8 < v2[t];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int hs = 2 * nt + e;
				float xa = va ? d[t][nt][e] * scale_log2 : -INFINITY;
				float xb = vb ? d[t][nt][2 + e] * scale_log2 : -INFINITY;
				float mn = fmaxf(m[t][hs], fmaxf(xa, xb));
				if (!FULL && mn == -INFINITY)
					continue;
				if (mn > m[t][hs]) {
					l[t][hs] *= tc_ex2(m[t][hs] - mn); /* 0 while m = -inf */
					m[t][hs] = mn;
				}
				l[t][hs] += tc_ex2(xa - mn) + tc_ex2(xb - mn);
			}
	}
}

/* The LSE of each (token, head slot) from the 8 lanes holding that head
 * (the same tq): their maxima differ, so sums are rescaled to the largest.
 * A head slot past the group (8nt + 2tq + e >= G: a zero row of Q) gets
 * +inf, so that level 1's exp2(x - LSE) is 0 there without a test. */
static __device__ __forceinline__ void s1t_lse(const float (&m)[S1T_TOK][4], const float (&l)[S1T_TOK][4],
					       float (&lse)[S1T_TOK][4], int G, int tq)
{
#pragma unroll
	for (int t = 0; t < S1T_TOK; t++)
#pragma unroll
		for (int hs = 0; hs < 4; hs++) {
			float M = m[t][hs];
			M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 4));
			M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 8));
			M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 16));
			float L = M == -INFINITY ? 0.0f : l[t][hs] * tc_ex2(m[t][hs] - M);
			L += __shfl_xor_sync(0xffffffffu, L, 4);
			L += __shfl_xor_sync(0xffffffffu, L, 8);
			L += __shfl_xor_sync(0xffffffffu, L, 16);
			const int h = 8 * (hs >> 1) + 2 * tq + (hs & 1);
			lse[t][hs] = h >= G ? INFINITY : M == -INFINITY ? -INFINITY : M + log2f(L);
		}
}

/* Level 1, one m-tile (keys jA = j0 + gid and jA + 8, visible while below
 * v1; FULL: all visible to both tokens): each lane sums exp2(x - LSE) over
 * its four heads for its two keys and S1T_TOK tokens (v[2t + k]), then the
 * quad reduce-scatters so that lane tq holds the whole sum of entry tq:
 * token tq >> 1, key jA + 8 (tq & 1). That lane writes it (NaN -> 0,
 * rounded to bf16) when the token is active; POOL, returns it instead (-inf
 * past the chunks) for s1t_pool. */
template <bool FULL, bool POOL>
static __device__ __forceinline__ float s1t_level1(const float (&d)[S1T_TOK][2][4], const float (&lse)[S1T_TOK][4],
						  float *const (&out)[S1T_TOK], const bool (&active)[S1T_TOK], int n1,
						  int jA, const int (&v1)[S1T_TOK], float scale_log2, int tq)
{
	static_assert(S1T_TOK == 2, "the reduce-scatter below spreads 2 tokens x 2 keys over a quad");
	float v[4];
#pragma unroll
	for (int t = 0; t < S1T_TOK; t++) {
		const bool va = FULL || jA < v1[t], vb = FULL || jA + 8 < v1[t];
		float sa = 0.0f, sb = 0.0f;
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int hs = 2 * nt + e;
				float ea = tc_ex2(d[t][nt][e] * scale_log2 - lse[t][hs]);
				float eb = tc_ex2(d[t][nt][2 + e] * scale_log2 - lse[t][hs]);
				sa += FULL || va ? ea : 0.0f;
				sb += FULL || vb ? eb : 0.0f;
			}
		v[2 * t] = sa, v[2 * t + 1] = sb;
	}
	/* round 1 (lanes tq, tq ^ 1): keep the entries of parity b0, pass the others */
	const int b0 = tq & 1, b1 = tq >> 1;
	float k0 = (b0 ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, b0 ? v[0] : v[1], 1);
	float k1 = (b0 ? v[3] : v[2]) + __shfl_xor_sync(0xffffffffu, b0 ? v[2] : v[3], 1);
	/* round 2 (lanes tq, tq ^ 2): entry b0 + 2 b1 = tq */
	float sum = (b1 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, b1 ? k0 : k1, 2);
	const int col = jA + 8 * b0;
	if (isnan(sum))
		sum = 0.0f;
	if (POOL) /* the chunk's score, or -inf past the chunks (none to pool) */
		return col < n1 ? sfwc_rbf(sum) : -INFINITY;
	/* (selects, not indexing: the arrays stay in registers) */
	if ((b1 ? active[1] : active[0]) && col < n1)
		(b1 ? out[1] : out[0])[col] = sfwc_rbf(sum);
	return 0.0f;
}

/* POOL: the max-pool of one m-tile's level-1 scores (model-spec §2.6.4
 * step 4, the CPU twin's pool_blocks) into its four blocks, b = jA0 / 4 + bl
 * for the m-tile's first chunk jA0: block b pools chunks 4b - 1 .. 4b + 3.
 * v is the lane's score from s1t_level1: token tq >> 1, chunk c = gid +
 * 8 (tq & 1) of the m-tile. Each lane takes the score of chunk c - 1 (one
 * shuffle), so the max of (v, that) over the four lanes of a block (gid
 * bits 0 and 1: two shuffles) covers chunks 4bl - 1 .. 4bl + 3. Chunk -1 is
 * the m-tile before's chunk 15, which lanes 29 and 31 (gid 7, tq 1 and 3)
 * hold in last and offer in the first shuffle instead of their v (no lane
 * needs this m-tile's chunk 15 as a chunk before); last is -inf before the
 * first m-tile and each lane's v on return. Lanes gid 0 and 4 write their
 * token's block, +inf for the initial and local blocks. */
static __device__ __forceinline__ void s1t_pool(float v, float &last, float *const (&out)[S1T_TOK],
						const bool (&active)[S1T_TOK], const int (&qb)[S1T_TOK], int jA0,
						int nblocks, int init_blocks, int local_blocks, int gid, int tq)
{
	static_assert(S1T_TOK == 2, "a quad holds 2 tokens x 2 chunk halves");
	const int lane = 4 * gid + tq;
	const float offer = (lane | 2) == 31 ? last : v;
	/* chunk c - 1: gid - 1 (lane - 4); gid 0 of the second half: chunk 7
	 * (gid 7, the token's first half); gid 0 of the first: chunk -1 */
	const int src = gid ? lane - 4 : (tq & 1) ? 28 | (tq & 2) : 29 | (tq & 2);
	float g4 = fmaxf(v, __shfl_sync(0xffffffffu, offer, src));
	g4 = fmaxf(g4, __shfl_xor_sync(0xffffffffu, g4, 4));
	g4 = fmaxf(g4, __shfl_xor_sync(0xffffffffu, g4, 8));
	last = v;
	const int t = tq >> 1;
	const int b = jA0 / 4 + (gid >> 2) + 2 * (tq & 1);
	if ((gid & 3) == 0 && (t ? active[1] : active[0]) && b < nblocks) {
		const int q = t ? qb[1] : qb[0];
		const bool kept = b < init_blocks || (b >= q - local_blocks && b <= q);
		(t ? out[1] : out[0])[b] = kept ? INFINITY : g4;
	}
}

/* A warp's state over the tiles: its S1T_TOK tokens' Q fragments,
 * visibility and outputs, the level-2 running max and sum, the LSE, and
 * POOL's last scores (s1t_pool). */
template <int HD> struct s1t_warp {
	uint32_t qb[S1T_TOK][HD / 16][2][2];
	float m[S1T_TOK][4], l[S1T_TOK][4], lse[S1T_TOK][4];
	float *out[S1T_TOK];
	bool active[S1T_TOK];
	int v1[S1T_TOK], v2[S1T_TOK], qblk[S1T_TOK];
	float last;
};

/* One tile's four m-tiles (keys j0 ..), in straight-line code: the MMAs of
 * m-tile mt + 1 are issued before the exponentials of m-tile mt, so the
 * tensor pipe and the SFU work at once (the level and fullness are the
 * template's, not tests in the loop). */
template <int HD, bool L2, bool FULL, bool POOL>
static __device__ __forceinline__ void s1t_tile(s1t_warp<HD> &s, const uint16_t *Ks, int j0, int nblocks,
						const s1tc_args &a, int lane)
{
	const int gid = lane >> 2, tq = lane & 3;
	float d[2][S1T_TOK][2][4];
	s1t_mtile<HD>(d[0], s.qb, Ks, 0, lane);
#pragma unroll
	for (int mt = 0; mt < S1T_TILE / 16; mt++) {
		if (mt + 1 < S1T_TILE / 16)
			s1t_mtile<HD>(d[(mt + 1) & 1], s.qb, Ks, mt + 1, lane);
		const int jA = j0 + 16 * mt + gid;
		if (L2) {
			s1t_level2<FULL>(d[mt & 1], s.m, s.l, jA, s.v2, a.scale_log2);
		} else {
			const float v = s1t_level1<FULL, POOL>(d[mt & 1], s.lse, s.out, s.active, (int)a.n1, jA,
								s.v1, a.scale_log2, tq);
			if (POOL)
				s1t_pool(v, s.last, s.out, s.active, s.qblk, j0 + 16 * mt, nblocks, a.init_blocks,
					 a.local_blocks, gid, tq);
		}
	}
}

/* Tiles i0 .. i1 - 1 of the N (level 2 below nA), each copied a tile ahead
 * of its use (two stages; wn: the rows of the next tile to copy, fetched a
 * tile before that). */
template <int HD, bool L2, bool POOL>
static __device__ __forceinline__ void s1t_pass(s1t_warp<HD> &s, const s1tc_args &a,
						uint16_t (*tile)[S1T_TILE * (HD + 8)], s1t_rows<HD> &wn, int i0,
						int i1, int N, int nA, int64_t v1max, int64_t v2max, int vmin, int nblocks,
						int g, int lane)
{
	const bool any = s.active[0]; /* token 0 of the warp is the first: none active without it */
	for (int i = i0; i < i1; i++) {
		const int st = i & 1;
		if (i + 1 < N) {
			s1t_load<HD>(a, tile, wn, i + 1, st ^ 1, nA, g);
			if (i + 2 < N) /* tile i + 2's rows: in flight while tile i is computed */
				s1t_where<HD>(a, wn, i + 2, nA, v1max, v2max);
			tc_cp_wait<1>();
		} else {
			tc_cp_wait<0>();
		}
		__syncthreads();
		if (any) {
			const int j0 = (L2 ? i : i - nA) * S1T_TILE;
			if (j0 + S1T_TILE <= vmin) /* the warp's tokens all see the whole tile */
				s1t_tile<HD, L2, true, POOL>(s, tile[st], j0, nblocks, a, lane);
			else
				s1t_tile<HD, L2, false, POOL>(s, tile[st], j0, nblocks, a, lane);
		}
		__syncthreads(); /* stage st is free for the load two steps on */
	}
}

#ifndef S1T_MINB
/* CTAs an SM. At 3: 168 registers, 4 bytes of spill stores (12-16 of
 * loads), and the fastest of the shapes timed on an H100 at 128K and 1M
 * (docs/performance.md §5.16). At 2: 246-249 registers, no spills. */
#define S1T_MINB 3
#endif

template <int HD, bool POOL>
static __global__ void __launch_bounds__(S1T_W * 32, S1T_MINB) stage1_tc_kernel(s1tc_args a)
{
	sfwc_pdl_wait();
	a.pos0 = *a.sp.pos + a.sp.off;
	a.n1 = sfw_nchunks(*a.sp.pos + a.sp.len, a.ksize, a.stride);
	a.n2 = sfw_nchunks(*a.sp.pos + a.sp.len, 4 * a.ksize, 4 * a.stride);
	/* POOL: the rows' blocks, the out rows' length (as the pool kernel's) */
	const int nblocks = POOL ? (int)((*a.sp.pos + a.sp.len + a.block - 1) / a.block) : 0;
	constexpr int LD = HD + 8; /* padded rows: conflict-free ldmatrix */
	__shared__ __align__(16) uint16_t tile[2][S1T_TILE * LD];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, tq = lane & 3;
	const int g = blockIdx.y, G = a.nh / a.nkv;
	const int r0 = blockIdx.x * S1T_R;
	const int64_t pmax = a.pos0 + min(a.T - 1, r0 + S1T_R - 1);
	/* visibility grows with p: the CTA's last token sees the most */
	const int64_t v1max = tc_visible(pmax, a.n1, a.ksize, a.stride);
	const int64_t v2max = tc_visible(pmax, a.n2, 4 * a.ksize, 4 * a.stride);
	const int nA = (int)((v2max + S1T_TILE - 1) / S1T_TILE),
		  nB = (int)((v1max + S1T_TILE - 1) / S1T_TILE);

	/* this warp's tokens: r0 + S1T_TOK w + t (counts in ints: the launch
	 * keeps n1 and n2 below INT_MAX) */
	s1t_warp<HD> s;
	int v1min = INT_MAX, v2min = INT_MAX; /* over the active tokens: tiles below are whole */
#pragma unroll
	for (int t = 0; t < S1T_TOK; t++) {
		const int r = r0 + S1T_TOK * w + t;
		s.active[t] = r < a.T;
		s.v1[t] = s.active[t] ? (int)tc_visible(a.pos0 + r, a.n1, a.ksize, a.stride) : 0;
		s.v2[t] = s.active[t] ? (int)tc_visible(a.pos0 + r, a.n2, 4 * a.ksize, 4 * a.stride) : 0;
		if (s.active[t])
			v1min = min(v1min, s.v1[t]), v2min = min(v2min, s.v2[t]);
		s.out[t] = a.scores + ((size_t)g * a.T + (s.active[t] ? r : 0)) * (size_t)(POOL ? nblocks : a.n1);
		s.qblk[t] = POOL ? (int)((a.pos0 + r) / a.block) : 0;
		s1t_load_qb<HD>(s.qb[t], a.q, s.active[t], r, a.nh, g, G, lane);
#pragma unroll
		for (int hs = 0; hs < 4; hs++)
			s.m[t][hs] = -INFINITY, s.l[t][hs] = 0.0f, s.lse[t][hs] = -INFINITY;
	}
	s.last = -INFINITY;
	const int n1 = (int)a.n1;

	const int N = nA + nB;
	s1t_rows<HD> wn; /* the rows of the next tile to copy */
	if (N > 0) {
		s1t_where<HD>(a, wn, 0, nA, v1max, v2max);
		s1t_load<HD>(a, tile, wn, 0, 0, nA, g);
		if (N > 1)
			s1t_where<HD>(a, wn, 1, nA, v1max, v2max);
	}
	/* level 2 (the LSE's max and sum), the LSE, then level 1: two loops,
	 * so that the running max and sum are dead in the second */
	s1t_pass<HD, true, POOL>(s, a, tile, wn, 0, nA, N, nA, v1max, v2max, v2min, nblocks, g, lane);
	s1t_lse(s.m, s.l, s.lse, G, tq);
	s1t_pass<HD, false, POOL>(s, a, tile, wn, nA, N, N, nA, v1max, v2max, v1min, nblocks, g, lane);
	if constexpr (POOL) {
		/* the blocks past the tiles: their chunks below n1 are beyond every
		 * row's visible ones (score 0); block 16 nB's first chunk is the
		 * last tile's last (the last scores of lanes 29 and 31: token 0, 1) */
		const int bt = nB * (S1T_TILE / 4);
#pragma unroll
		for (int t = 0; t < S1T_TOK; t++) {
			const float ct = __shfl_sync(0xffffffffu, s.last, 29 + 2 * t);
			if (s.active[t])
				for (int b = bt + lane; b < nblocks; b += 32) {
					const int lo = max(0, 4 * b - 1), hi = min(4 * b + 3, n1 - 1);
					float v = max(lo, nB * S1T_TILE) <= hi ? 0.0f : -INFINITY;
					if (b == bt && nB > 0)
						v = fmaxf(v, ct);
					const bool kept =
						b < a.init_blocks || (b >= s.qblk[t] - a.local_blocks && b <= s.qblk[t]);
					s.out[t][b] = kept ? INFINITY : v;
				}
		}
	} else {
#pragma unroll
		for (int t = 0; t < S1T_TOK; t++)
			if (s.active[t])
				for (int col = nB * S1T_TILE + lane; col < n1; col += 32)
					s.out[t][col] = 0.0f;
	}
}

/* The prefill kernel's launch (the checks done): out is the scores, or
 * with pooling (s1tc_args's block, init_blocks, local_blocks set) the
 * pooled blocks. */
template <bool POOL> static void s1t_launch(const s1tc_args &a, int hd, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	dim3 grid((unsigned)((a.T + S1T_R - 1) / S1T_R), (unsigned)a.nkv);
	switch (hd) {
	case 32:
		sfwc_launch(stage1_tc_kernel<32, POOL>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	case 64:
		sfwc_launch(stage1_tc_kernel<64, POOL>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	default:
		sfwc_launch(stage1_tc_kernel<128, POOL>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	}
	SFW_CUDA_LAUNCHED();
}

/* The shapes every tensor-core form takes (else the CUDA-core kernel) */
static int s1t_shape_ok(const struct sfw_sel_shape *sh, enum sfw_dtype act, enum tc_mode mode)
{
	int nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
	if (mode == TC_SIMT || act != SFW_DTYPE_BF16 || sh->T <= 0 || sh->n1 <= 0 || nkv <= 0 || nh % nkv != 0 ||
	    nh / nkv > 16)
		return 0;
	if (hd != 32 && hd != 64 && hd != 128)
		return 0;
	/* tile counts and the prefill kernel's key indices (up to a tile past
	 * the counts) are int */
	return sh->n1 < INT_MAX - S1T_TILE && sh->n2 < INT_MAX - S1T_TILE;
}

/* The prefill kernel's paged keys (s1t_where) take a chunk's last token in
 * 32 bits: every tile's chunks, up to a tile past the counts, end below
 * INT_MAX (asked of contiguous keys too, so that the pooling form's
 * answer does not depend on the pages). */
static int s1t_keys_ok(const struct sfw_sel_shape *sh)
{
	return sh->stride >= 1 && sh->ksize >= 1 &&
	       ((int64_t)sh->n1 + S1T_TILE) * sh->stride + sh->ksize < (int64_t)INT_MAX &&
	       ((int64_t)sh->n2 + S1T_TILE) * 4 * sh->stride + 4 * (int64_t)sh->ksize < (int64_t)INT_MAX;
}

static s1tc_args s1t_args(float *out, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
			  const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck)
{
	s1tc_args a;
	memset(&a, 0, sizeof(a));
	a.scores = out, a.q = (const uint16_t *)q, a.c1 = (const uint16_t *)c1, a.c2 = (const uint16_t *)c2;
	a.n1 = sh->n1, a.n2 = sh->n2 > 0 ? sh->n2 : 0;
	a.sp = sfwc_selpos{rr->pos, rr->off, rr->len};
	a.T = sh->T, a.nh = sh->nh, a.nkv = sh->nkv, a.ksize = sh->ksize, a.stride = sh->stride;
	a.scale_log2 = sh->scale * 1.4426950408889634f;
	a.tab = ck->tab, a.shift = ck->shift;
	return a;
}

int sfwi_stage1_tc(float *scores, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
		   const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, enum sfw_dtype act,
		   struct sfw_cuda_ctx *cx)
{
	enum tc_mode mode = tc_mode_of(cx->stage1);
	if (!s1t_shape_ok(sh, act, mode))
		return 0;
	/* decode rows: the split over the keys above; between those and
	 * prefill-sized calls (auto) the CUDA-core kernel; the prefill kernel
	 * takes the compressed keys as given only */
	if (sh->T <= S1D_MAXT)
		return sfwi_stage1_tc_rows(scores, q, c1, c2, sh, rr, ck, cx);
	if ((mode == TC_AUTO && sh->T < 64) || rr->c1 || ck->ptab || !s1t_keys_ok(sh))
		return 0;
	s1t_launch<false>(s1t_args(scores, q, c1, c2, sh, rr, ck), sh->hd, cx);
	return 1;
}

/* The pooling kernel's CTAs resident on an SM of this device (asked once
 * per device and head size; 0: not asked yet, harmless if raced). */
static int s1t_pool_fit(int hd)
{
	static int fit[SFWC_MAX_DEVICES][3];
	int &n = fit[sfwc_device()][hd == 32 ? 0 : hd == 64 ? 1 : 2];
	if (n == 0) {
		int b = 0;
		const int nt = S1T_W * 32;
		if (hd == 32)
			SFW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, stage1_tc_kernel<32, true>, nt, 0));
		else if (hd == 64)
			SFW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, stage1_tc_kernel<64, true>, nt, 0));
		else
			SFW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, stage1_tc_kernel<128, true>, nt, 0));
		n = b > 0 ? b : 1;
	}
	return n;
}

int sfwi_stage1_tc_pools(const struct sfw_sel_shape *sh, enum sfw_dtype act, const struct sfw_cuda_ctx *cx)
{
	/* the prefill kernel (any T past the decode rows'), and blocks of four
	 * chunks of a stride, chunks of two (s1t_pool) */
	if (!(s1t_shape_ok(sh, act, tc_mode_of(cx->stage1)) && sh->T > S1D_MAXT && sh->stride >= 2 &&
	      sh->ksize == 2 * sh->stride && sh->block == 4 * sh->stride && sh->nblocks >= 1 &&
	      sh->nblocks <= INT_MAX / sh->block && sh->init_blocks >= 0 && sh->local_blocks >= 0 && s1t_keys_ok(sh)))
		return 0;
	/* the rows one wave of CTAs holds: each CTA takes S1T_R rows of a group */
	return s1t_pool_fit(sh->hd) * sfwi_cuda_sms(cx) * S1T_R / sh->nkv;
}

int sfwi_stage1_tc_pool(float *pooled, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
			const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, enum sfw_dtype act,
			struct sfw_cuda_ctx *cx)
{
	if (!sfwi_stage1_tc_pools(sh, act, cx) || rr->c1 || ck->ptab)
		return 0;
	s1tc_args a = s1t_args(pooled, q, c1, c2, sh, rr, ck);
	a.block = sh->block, a.init_blocks = sh->init_blocks, a.local_blocks = sh->local_blocks;
	s1t_launch<true>(a, sh->hd, cx);
	return 1;
}
