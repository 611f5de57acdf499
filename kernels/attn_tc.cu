/* attn_tc.cu - tensor-core dense causal and block-sparse causal GQA attention
 * for prefill (the meaning of sfw_op_attn_dense/sparse, kernels/attention.c).
 * Fragment layouts: kernels/attn_tc.cuh.
 *
 * GQA packing: one warp owns one query token and the G = nh/nkv heads of one
 * KV group: an M = 16 tile (rows >= G are zero and never stored) against
 * 64-key tiles (N = 64, K = head dim). A CTA holds ATC_W consecutive tokens of
 * one group; they share most of their blocks (init block, the local window,
 * usually much of the top-k), so the CTA walks the merge of the warps' block
 * lists and loads each distinct block once (cp.async, two stages) for every
 * warp whose list holds it. The merge takes, each step, the smallest current
 * entry of all lists and advances every list whose current entry equals it,
 * so each list entry is visited exactly once in list order whatever the
 * order, duplicates included (sorted lists, as top-k makes, merge best).
 * Every thread runs the merge itself on the lists in shared memory, so the
 * next block is known without a barrier and can be prefetched.
 * Dense rows use the implicit lists 0..p/64. Softmax: online, in the log2
 * domain, fp32, exp2 by one ex2.approx.ftz (tc_ex2: a probability below
 * 2^-126 is 0); P is rounded to bf16 for the P·V product (as flash-attn).
 *
 * An fp8 cache (kernels/ops.h, "the fp8 KV cache") keeps the same pipeline
 * one step earlier: cp.async brings a block's raw codes and scales (two
 * stages, about half the bytes of bf16 tiles), and after the wait the CTA
 * turns the current stage into the one bf16 K/V tile (each value rounded to
 * bf16 from e4m3(code) * scale), behind one more barrier; the MMA code reads
 * that tile exactly as it reads a bf16 cache's. */
#include "attn_tc.cuh"

#include <limits.h>

#define ATC_BLK 64   /* keys per tile = the sparse block size */
#define ATC_W 4	     /* warps = query tokens per CTA */
#define ATC_KMAX 256 /* longest block list held in shared memory */
/* Stages of the bf16 tiles (-D, for gpu-run.sh variants). 2: block i + 1's
 * load is issued before block i's wait, and a step takes two barriers. 3:
 * block i + 2's load is issued after step i's barrier, into the stage step
 * i - 1 read, and a step takes one barrier (at head size 128 the tiles fill
 * 102 KiB: two CTAs an SM, and past sm_86's and sm_89's 99 KiB a block, where
 * the launch declines and the CUDA-core kernel runs). The fp8 form keeps its
 * own two raw stages. */
#ifndef ATC_STAGES
#define ATC_STAGES 2
#endif
#ifndef ATC_MINB
#define ATC_MINB 3 /* CTAs an SM the registers allow (launch bounds): 168 registers */
#endif
static_assert(ATC_STAGES == 2 || ATC_STAGES == 3, "ATC_STAGES: 2 or 3");

struct atc_args {
	/* q; kc, vc bf16, or (the kernel's KV8) the fp8 form's arrays, read as bytes */
	const uint16_t *q, *kc, *vc;
	const int32_t *idx; /* NULL: dense; else entries -1 or blocks of the cache (64 b <= pos0 + T - 1,
			     * an int: the launch makes sure), as top-k gives them */
	uint16_t *o;
	int T, nh, nkv, k;
	const int64_t *dpos; /* the position of row 0, read when the kernel runs */
	float scale_log2; /* scale * log2(e) */
	const int32_t *tab; /* the cache's pages (ops_cuda.h); NULL: contiguous */
	int shift;
};

/* Dynamic shared memory: the K/V tiles [stage][K, V][64][HD + 8] bf16
 * (ATC_STAGES of them; the fp8 form: one stage, then two raw stages of
 * atc_raw_bytes), then the block lists. */
template <int HD> static __host__ __device__ constexpr size_t atc_raw_bytes(void)
{
	return (size_t)2 * ATC_BLK * HD + (size_t)2 * ATC_BLK * 4; /* K, V codes [64][HD]; K, V scales [64] */
}
template <int HD, bool KV8> static __host__ __device__ constexpr size_t atc_lists_off(void)
{
	return KV8 ? (size_t)2 * ATC_BLK * (HD + 8) * 2 + 2 * atc_raw_bytes<HD>()
		   : (size_t)ATC_STAGES * 2 * ATC_BLK * (HD + 8) * 2;
}
template <int HD, bool KV8> static __host__ __device__ constexpr size_t atc_smem(void)
{
	return atc_lists_off<HD, KV8>() + (size_t)ATC_W * ATC_KMAX * 4;
}

/* this warp's block list into shared memory (lens_s[w]): the non-negative
 * entries of idx[g, r, :] in order, or for a dense row the implicit 0..p/64 */
static __device__ __forceinline__ void atc_build_list(const atc_args &a, int *lists, int *lens_s, bool active,
						      int r, int g, int p, int w, int lane)
{
	if (a.idx) {
		int n = 0;
		if (active) {
			const int32_t *sel = a.idx + ((size_t)g * a.T + r) * a.k;
			for (int s0 = 0; s0 < a.k; s0 += 32) {
				int v = s0 + lane < a.k ? sel[s0 + lane] : -1;
				unsigned bal = __ballot_sync(0xffffffffu, v >= 0);
				if (v >= 0)
					lists[w * ATC_KMAX + n + __popc(bal & ((1u << lane) - 1))] = v;
				n += __popc(bal);
			}
		}
		if (lane == 0)
			lens_s[w] = n;
	} else if (lane == 0) {
		lens_s[w] = active ? (int)(p / ATC_BLK) + 1 : 0;
	}
}

/* next block of the merge (INT_MAX: done); *mask = warps that use it */
static __device__ __forceinline__ int atc_next(const int (&len)[ATC_W], int (&cur)[ATC_W], const int *lists,
					       bool dense, unsigned *mask)
{
	int e[ATC_W], b = INT_MAX;
#pragma unroll
	for (int i = 0; i < ATC_W; i++) {
		e[i] = cur[i] < len[i] ? (dense ? cur[i] : lists[i * ATC_KMAX + cur[i]]) : INT_MAX;
		b = min(b, e[i]);
	}
	unsigned m = 0;
#pragma unroll
	for (int i = 0; i < ATC_W; i++)
		if (b != INT_MAX && e[i] == b)
			m |= 1u << i, cur[i]++;
	*mask = m;
	return b;
}

/* The first pool row of each 32-row half of block b (pages hold 2^shift >= 32
 * tokens, so a half never crosses a page): row h32 + i of the block is pool
 * row base[h] + i for i < 32. The second half's lookup is skipped when the
 * tile holds no row past 31 (last < 32). */
static __device__ __forceinline__ void atc_half_rows(const atc_args &a, int b, int last, int64_t (&base)[2])
{
	const int64_t t0 = (int64_t)b * ATC_BLK;
	base[0] = sfwc_kv_row(a.tab, a.shift, t0);
	base[1] = last >= 32 ? sfwc_kv_row(a.tab, a.shift, t0 + 32) : base[0];
}

/* block b -> stage st of kvs; keys past the CTA's last position pmax are
 * zeros (they may lie past the cache; masked anyway). Positions are ints
 * here (the launch makes sure every one fits). A thread copies one 16-byte
 * column ch of rows r0, r0 + RS, ... of K and V: two table lookups per block
 * (atc_half_rows), then one add per copy. */
template <int HD>
static __device__ __forceinline__ void atc_load(const atc_args &a, uint16_t *kvs, int b, int st, int pmax, int g)
{
	constexpr int LD = HD + 8, TILE = ATC_BLK * LD, CH = HD / 8, RS = ATC_W * 32 / CH;
	static_assert(ATC_W * 32 % CH == 0 && 32 % RS == 0, "a thread's rows must keep one column and halves");
	uint16_t *dst = kvs + (size_t)st * 2 * TILE;
	const int last = pmax - b * ATC_BLK; /* the tile's last key row to load */
	const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
	const size_t stride = (size_t)a.nkv * HD; /* one pool row */
	int64_t base[2];
	atc_half_rows(a, b, last, base);
	size_t off[2];
#pragma unroll
	for (int h = 0; h < 2; h++)
		off[h] = ((size_t)base[h] * a.nkv + g) * HD + ch * 8 + (size_t)r0 * stride;
#pragma unroll
	for (int k = 0; k < ATC_BLK / RS; k++) {
		const int row = r0 + k * RS;
		const bool ok = row <= last;
		const size_t o = ok ? off[k * RS / 32] + (size_t)(k * RS % 32) * stride : 0;
		tc_cp16(dst + row * LD + ch * 8, a.kc + o, ok ? 16 : 0);
		tc_cp16(dst + TILE + row * LD + ch * 8, a.vc + o, ok ? 16 : 0);
	}
	tc_cp_commit();
}

/* The fp8 form: block b's raw codes and scales of head g -> raw stage st
 * (atc_raw_bytes: K codes [64][HD], V codes [64][HD], K scales [64], V
 * scales [64]), keys past pmax zeros (code 0, scale 0: value 0). A row's
 * codes are HD contiguous bytes (sfw_kv8_codes_off), copied 16 at a time;
 * its scale is one float (sfw_kv8_scale_off). */
template <int HD>
static __device__ __forceinline__ void atc_load8(const atc_args &a, unsigned char *raw, int b, int st, int pmax,
						 int g)
{
	constexpr int CH = HD / 16, RS = ATC_W * 32 / CH;
	static_assert(ATC_W * 32 % CH == 0, "a thread's rows must keep one column");
	unsigned char *dst = raw + (size_t)st * atc_raw_bytes<HD>();
	const unsigned char *kc = (const unsigned char *)a.kc, *vc = (const unsigned char *)a.vc;
	const int last = pmax - b * ATC_BLK;
	int64_t base[2];
	atc_half_rows(a, b, last, base);
	/* within a 32-row group a row's codes are nkv * HD bytes after the
	 * previous row's, its scale nkv * 4 (sfw_kv8_codes_off, _scale_off) */
	const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
	const size_t cstride = (size_t)a.nkv * HD;
	size_t off[2];
#pragma unroll
	for (int h = 0; h < 2; h++)
		off[h] = sfw_kv8_codes_off(base[h], g, a.nkv, HD) + ch * 16;
#pragma unroll
	for (int k = 0; k < ATC_BLK / RS; k++) {
		const int row = r0 + k * RS;
		const bool ok = row <= last;
		/* RS dividing 32: the half and the row within it fold to constants plus r0 */
		const int h = 32 % RS == 0 ? k * RS / 32 : row / 32, i = 32 % RS == 0 ? r0 + k * RS % 32 : row % 32;
		const size_t o = ok ? off[h] + (size_t)i * cstride : 0;
		tc_cp16(dst + row * HD + ch * 16, kc + o, ok ? 16 : 0);
		tc_cp16(dst + (size_t)ATC_BLK * HD + row * HD + ch * 16, vc + o, ok ? 16 : 0);
	}
	for (int i = threadIdx.x; i < 2 * ATC_BLK; i += ATC_W * 32) {
		int which = i / ATC_BLK, row = i % ATC_BLK;
		bool ok = row <= last;
		const unsigned char *src =
		    (which ? vc : kc) + (ok ? sfw_kv8_scale_off((row < 32 ? base[0] : base[1]) + row % 32, g, a.nkv, HD) : 0);
		tc_cp4(dst + (size_t)2 * ATC_BLK * HD + i * 4, src, ok ? 4 : 0);
	}
	tc_cp_commit();
}

/* Raw stage `raw` (atc_load8's, landed and visible to the CTA) -> the bf16
 * K/V tiles kvs [K, V][64][HD + 8]: every value
 * __float2bfloat16_rn(e4m3(code) * scale), 8 per thread and step (an 8-byte
 * read, a 16-byte store at the bf16 form's places). */
template <int HD>
static __device__ __forceinline__ void atc_convert(const unsigned char *raw, uint16_t *kvs)
{
	constexpr int LD = HD + 8, TILE = ATC_BLK * LD, CH = HD / 8;
	const float *scales = (const float *)(raw + (size_t)2 * ATC_BLK * HD);
	for (int i = threadIdx.x; i < 2 * ATC_BLK * CH; i += ATC_W * 32) {
		int which = i / (ATC_BLK * CH), rem = i % (ATC_BLK * CH), row = rem / CH, ch = rem % CH;
		uint2 c = *(const uint2 *)(raw + (size_t)which * ATC_BLK * HD + row * HD + ch * 8);
		float f[8];
		sfwc_e4m3x8_f32(c, scales[which * ATC_BLK + row] * SFWC_E4M3_H2_UNIT, f);
		*(uint4 *)(kvs + which * TILE + row * LD + ch * 8) =
		    make_uint4(tc_pack(f[0], f[1]), tc_pack(f[2], f[3]), tc_pack(f[4], f[5]), tc_pack(f[6], f[7]));
	}
}

/* Block b -> stage st: the bf16 tiles (cp.async), or the fp8 form's raw stage. */
template <int HD, bool KV8>
static __device__ __forceinline__ void atc_fetch(const atc_args &a, uint16_t *kvs, unsigned char *raw, int b, int st,
						 int pmax, int g)
{
	if constexpr (KV8)
		atc_load8<HD>(a, raw, b, st, pmax, g);
	else
		atc_load<HD>(a, kvs, b, st, pmax, g);
}

/* one tile's scores s (keys kb..kb+63): scale, causal mask (key kb + c
 * visible while c <= last = p - kb), then the online softmax update of rows
 * gid (lo) and gid + 8 (hi): the running maxima m, the per-lane partial sums
 * l and O rescaled, s turned into P = exp2(s - max) */
template <int HD>
static __device__ __forceinline__ void atc_softmax(float (&s)[8][4], float (&o)[HD / 8][4], float &m_lo,
						   float &m_hi, float &l_lo, float &l_hi, int last,
						   float scale_log2, int tq)
{
	const bool full = last >= ATC_BLK - 1;
	float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
	for (int j = 0; j < 8; j++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			float x0 = s[j][e] * scale_log2, x1 = s[j][2 + e] * scale_log2;
			if (!full && j * 8 + 2 * tq + e > last)
				x0 = x1 = -INFINITY;
			s[j][e] = x0, s[j][2 + e] = x1;
			mx_lo = fmaxf(mx_lo, x0), mx_hi = fmaxf(mx_hi, x1);
		}
	/* the 4 lanes of a quad hold one row */
	mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
	mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
	mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
	mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
	float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
	float mu_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
	float c_lo = tc_ex2(m_lo - mu_lo), c_hi = tc_ex2(m_hi - mu_hi); /* 0 while m = -inf */
	m_lo = mn_lo, m_hi = mn_hi;
	l_lo *= c_lo, l_hi *= c_hi; /* per-lane partial sums; the quad is summed at the end */
#pragma unroll
	for (int j = 0; j < HD / 8; j++)
		o[j][0] *= c_lo, o[j][1] *= c_lo, o[j][2] *= c_hi, o[j][3] *= c_hi;
#pragma unroll
	for (int j = 0; j < 8; j++) {
		s[j][0] = tc_ex2(s[j][0] - mu_lo), s[j][1] = tc_ex2(s[j][1] - mu_lo);
		s[j][2] = tc_ex2(s[j][2] - mu_hi), s[j][3] = tc_ex2(s[j][3] - mu_hi);
		l_lo += s[j][0] + s[j][1], l_hi += s[j][2] + s[j][3];
	}
}

/* O += P V over one tile Vs [64][HD + 8], P (bf16) straight from the S
 * accumulators */
template <int HD>
static __device__ __forceinline__ void atc_pv(float (&o)[HD / 8][4], const float (&s)[8][4],
					      const uint16_t *Vs, int lane)
{
	constexpr int LD = HD + 8;
#pragma unroll
	for (int ks = 0; ks < 4; ks++) {
		uint32_t pa[4] = {tc_pack(s[2 * ks][0], s[2 * ks][1]), tc_pack(s[2 * ks][2], s[2 * ks][3]),
				  tc_pack(s[2 * ks + 1][0], s[2 * ks + 1][1]),
				  tc_pack(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
		for (int dp = 0; dp < HD / 16; dp++) {
			uint32_t bf[4];
			tc_ldsm_x4_trans(bf, Vs + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
						 dp * 16 + (lane >> 4) * 8);
			tc_mma(o[2 * dp], pa, bf[0], bf[1]);
			tc_mma(o[2 * dp + 1], pa, bf[2], bf[3]);
		}
	}
}

/* one step of a warp whose row chose the block at tile Ks (its V tile
 * follows): S = Q Kᵀ, the online softmax (last: the row's last visible key
 * of the tile), O += P V */
template <int HD>
static __device__ __forceinline__ void atc_tile(const uint16_t *Ks, const uint32_t (&qa)[HD / 16][4],
						float (&o)[HD / 8][4], float &m_lo, float &m_hi, float &l_lo,
						float &l_hi, int last, float scale_log2, int lane, int tq)
{
	const uint16_t *Vs = Ks + ATC_BLK * (HD + 8);
	float s[8][4]; /* S = Q Kᵀ: 8 n-tiles of 8 keys */
#pragma unroll
	for (int j = 0; j < 8; j++)
		s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
	tc_qk_tile<HD>(s, qa, Ks, lane);
	atc_softmax<HD>(s, o, m_lo, m_hi, l_lo, l_hi, last, scale_log2, tq);
	atc_pv<HD>(o, s, Vs, lane);
}

/* the quads' row sums, then O / l as bf16 into o's rows of this token's G
 * heads (no visible key: zeros, as the CPU twin) */
template <int HD>
static __device__ __forceinline__ void atc_store(const atc_args &a, const float (&o)[HD / 8][4], float l_lo,
						 float l_hi, bool active, int r, int g, int G, int lane)
{
	const int gid = lane >> 2, tq = lane & 3;
	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
	if (!active)
		return;
	float inv_lo = l_lo > 0 ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0 ? 1.0f / l_hi : 0.0f;
	uint16_t *orow = a.o + ((size_t)r * a.nh + (size_t)g * G) * HD;
#pragma unroll
	for (int j = 0; j < HD / 8; j++) {
		int col = j * 8 + 2 * tq;
		if (gid < G)
			*(uint32_t *)(orow + (size_t)gid * HD + col) =
			    tc_pack(o[j][0] * inv_lo, o[j][1] * inv_lo);
		if (gid + 8 < G)
			*(uint32_t *)(orow + (size_t)(gid + 8) * HD + col) =
			    tc_pack(o[j][2] * inv_hi, o[j][3] * inv_hi);
	}
}

template <int HD, bool KV8> static __global__ void __launch_bounds__(ATC_W * 32, ATC_MINB) attn_tc_kernel(atc_args a)
{
	sfwc_pdl_wait();
	/* K and V tiles [64][HD + 8]: rows 16 bytes longer than HD so that the 8
	 * row addresses of one ldmatrix fall in 8 different 4-bank groups. */
	constexpr int LD = HD + 8, TILE = ATC_BLK * LD;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *kvs = (uint16_t *)smem_raw; /* [stage][K, V][64][LD]; KV8: one stage */
	unsigned char *raw = smem_raw + (size_t)2 * TILE * 2; /* KV8: the raw stages */
	int *lists = (int *)(smem_raw + atc_lists_off<HD, KV8>());
	__shared__ int lens_s[ATC_W];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, tq = lane & 3;
	const int g = blockIdx.y, G = a.nh / a.nkv;
	const int r0 = blockIdx.x * ATC_W, r = r0 + w;
	const bool active = r < a.T;
	/* (the launch makes sure pos0 + T fits an int) */
	const int pos0 = (int)__ldg(a.dpos);
	const int p = pos0 + r;
	const int pmax = pos0 + min(a.T - 1, r0 + ATC_W - 1);

	atc_build_list(a, lists, lens_s, active, r, g, p, w, lane);
	__syncthreads();
	int len[ATC_W], cur[ATC_W];
#pragma unroll
	for (int i = 0; i < ATC_W; i++)
		len[i] = lens_s[i], cur[i] = 0;
	const bool dense = a.idx == NULL;

	uint32_t qa[HD / 16][4];
	tc_load_q<HD>(qa, a.q, active, r, a.nh, g, G, lane);
	float o[HD / 8][4];
#pragma unroll
	for (int j = 0; j < HD / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f; /* rows gid, gid + 8 */

	unsigned mask0, mask1;
	int b0 = atc_next(len, cur, lists, dense, &mask0), st = 0;
	if (b0 != INT_MAX)
		atc_fetch<HD, KV8>(a, kvs, raw, b0, 0, pmax, g);
	if constexpr (!KV8 && ATC_STAGES == 3) {
		int b1 = atc_next(len, cur, lists, dense, &mask1);
		if (b1 != INT_MAX)
			atc_load<HD>(a, kvs, b1, 1, pmax, g);
		while (b0 != INT_MAX) {
			/* pending: b0's load and b1's */
			if (b1 != INT_MAX)
				tc_cp_wait<1>();
			else
				tc_cp_wait<0>();
			__syncthreads(); /* stage st landed; every warp is done with the step that read stage st - 1 */
			unsigned mask2;
			const int b2 = atc_next(len, cur, lists, dense, &mask2), st2 = st == 0 ? 2 : st - 1;
			if (b2 != INT_MAX)
				atc_load<HD>(a, kvs, b2, st2, pmax, g);
			if ((mask0 >> w) & 1)
				atc_tile<HD>(kvs + (size_t)st * 2 * TILE, qa, o, m_lo, m_hi, l_lo, l_hi, p - b0 * ATC_BLK,
					     a.scale_log2, lane, tq);
			b0 = b1, mask0 = mask1, b1 = b2, mask1 = mask2, st = st == 2 ? 0 : st + 1;
		}
	} else {
		while (b0 != INT_MAX) {
			int b1 = atc_next(len, cur, lists, dense, &mask1);
			if (b1 != INT_MAX) {
				/* that stage was last read before the previous barrier */
				atc_fetch<HD, KV8>(a, kvs, raw, b1, st ^ 1, pmax, g);
				tc_cp_wait<1>();
			} else {
				tc_cp_wait<0>();
			}
			__syncthreads();
			if constexpr (KV8) {
				/* stage st landed; the tile was last read before the previous barrier */
				atc_convert<HD>(raw + (size_t)st * atc_raw_bytes<HD>(), kvs);
				__syncthreads();
			}
			if ((mask0 >> w) & 1)
				atc_tile<HD>(KV8 ? kvs : kvs + (size_t)st * 2 * TILE, qa, o, m_lo, m_hi, l_lo, l_hi,
					     p - b0 * ATC_BLK, a.scale_log2, lane, tq);
			__syncthreads(); /* stage st is free for the load two steps on */
			b0 = b1, mask0 = mask1, st ^= 1;
		}
	}
	atc_store<HD>(a, o, l_lo, l_hi, active, r, g, G, lane);
}

template <int HD, bool KV8> static int attn_tc_launch(const atc_args &a, cudaStream_t s)
{
	static int ready_dev[SFWC_MAX_DEVICES]; /* per device: 1 limit raised; -1: refused */
	int &ready = ready_dev[sfwc_device()];
	size_t smem = atc_smem<HD, KV8>();
	if (!ready) {
		cudaError_t e = cudaFuncSetAttribute(attn_tc_kernel<HD, KV8>,
						     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (e != cudaSuccess) {
			(void)cudaGetLastError(); /* clear it: the CUDA-core kernel runs instead */
			ready = -1;
		} else {
			/* ATC_MINB CTAs an SM (launch bounds) need the whole
			 * carveout; a refusal only costs occupancy */
			if (cudaFuncSetAttribute(attn_tc_kernel<HD, KV8>, cudaFuncAttributePreferredSharedMemoryCarveout,
						 100) != cudaSuccess)
				(void)cudaGetLastError();
			ready = 1;
		}
	}
	if (ready < 0)
		return 0;
	dim3 grid((unsigned)((a.T + ATC_W - 1) / ATC_W), (unsigned)a.nkv);
	sfwc_launch(attn_tc_kernel<HD, KV8>, grid, dim3(ATC_W * 32), smem, s, a);
	SFW_CUDA_LAUNCHED();
	return 1;
}

int sfwi_attn_tc(void *o, const void *q, const struct sfw_cuda_kv *kv, const int32_t *idx,
		 const struct sfw_attn_shape *sh, const int64_t *dpos, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd, k = sh->topk, block = sh->block;
	int64_t pos0 = sh->pos0;
	const struct sfw_pages *pg = kv->pg;
	enum tc_mode mode = tc_mode_of(cx->attn);
	if (mode == TC_SIMT || act != SFW_DTYPE_BF16 || T <= 0 || nkv <= 0 || nh % nkv != 0 || nh / nkv > 16)
		return 0;
	if (idx && (block != ATC_BLK || k <= 0 || k > ATC_KMAX))
		return 0;
	if (hd != 32 && hd != 64 && hd != 128)
		return 0;
	/* every position must fit an int (pos0 + T bounds them: the kernel
	 * works in ints); the merge uses INT_MAX as "done" */
	if (pos0 + T >= (int64_t)INT_MAX)
		return 0;
	/* auto: prefill-sized calls only; decode rows (few, long) are better
	 * served by the CUDA-core kernel's split over the keys */
	if (mode == TC_AUTO && T < 128)
		return 0;
	atc_args a = {(const uint16_t *)q,
		      (const uint16_t *)kv->kc,
		      (const uint16_t *)kv->vc,
		      idx,
		      (uint16_t *)o,
		      T,
		      nh,
		      nkv,
		      k,
		      dpos,
		      sh->scale * 1.4426950408889634f,
		      sfwc_pg_tab(pg),
		      sfwc_pg_shift(pg)};
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	if (kv->kv8) /* the fp8 form: the same kernel with its own loads */
		switch (hd) {
		case 32:
			return attn_tc_launch<32, true>(a, s);
		case 64:
			return attn_tc_launch<64, true>(a, s);
		default:
			return attn_tc_launch<128, true>(a, s);
		}
	switch (hd) {
	case 32:
		return attn_tc_launch<32, false>(a, s);
	case 64:
		return attn_tc_launch<64, false>(a, s);
	default:
		return attn_tc_launch<128, false>(a, s);
	}
}
