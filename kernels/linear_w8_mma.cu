/* linear_w8_mma.cu - Y[M,N] = X[M,K] · Wᵀ with W int8 pack-quantized (W8A16,
 * num/w8_layout.h) on the tensor cores: int8 codes and their group scales
 * are read once per tile, turned into bf16 in registers and fed to
 * mma.sync m16n8k16 (bf16 in, fp32 accumulation), sm_80 and later. The CUDA
 * twin, for 2 ≤ M ≤ a prefill piece, of sfw_op_matmul_w8_cpu
 * (kernels/matmul_w8.c); no bf16 copy of a weight is written anywhere.
 *
 * Layout: the kernel reads the checkpoint's layout in place (codes [N, K]
 * row-major, scales [N, G]), so the one copy uploaded serves the decode GEMV
 * (kernels/linear_w8.cu) and this GEMM alike: there is nothing to repack.
 * What a repack buys Marlin-class kernels (each lane's fragment in one
 * load) comes here from the order of k inside an MMA, which is free: A and
 * B only have to agree. The weights are the MMA's A operand (16 weight rows
 * per m16 tile), the activations its B operand (8 activation rows per n8
 * tile), so the dequantized codes go straight into A's fragment registers.
 * Lane (g = lane / 4, c = lane % 4) of a warp takes, for each 64-wide slice
 * k0 of K, the 16 contiguous codes W[n, k0 + 16c .. k0 + 16c + 15] of its
 * rows n = g and g + 8 of each weight tile (one 16-byte shared-memory load
 * each) and the 16 contiguous activations X[m, same k] of its row m = g of
 * each activation tile (two 16-byte loads); MMA step t (0..3) of the slice
 * uses codes and activations 4t .. 4t + 3 of those 16 in the fragment
 * positions k = 2c, 2c + 1, 2c + 8, 2c + 9. Each lane's 16 codes lie in one
 * group (groups are multiples of 16): one scale per lane, row and slice.
 *
 * Dequantization: w = (b - 128) · scale in float32 (b - 128 formed exactly:
 * the byte under the exponent of 2^23, minus 2^23 + 128), rounded to bf16
 * once (round to nearest even): the same bf16 weight the dequantize-then-
 * cuBLASLt path (sfw_cuda_dequant_w8) feeds the tensor cores. BF16 scales
 * take a path without conversions of the same bits (w8m_dequant4_bf).
 *
 * Tiles: a block computes BM × BN of Y (warps WM × WN, each TT activation
 * tiles × WT weight tiles), streaming K in stages of 128 through shared
 * memory with cp.async (STAGES deep; 16-byte units placed with an XOR
 * swizzle so that the fragment loads hit distinct banks); the configuration
 * follows M, N and K (w8m_cfg_for). Few tiles (small M, narrow N) split K
 * over S blocks, enough to fill the device once (with the blocks that fit
 * on a multiprocessor, or one each: the configuration's split target);
 * each writes its fp32 partial tile to the workspace, and the last
 * of the S to arrive (a counter per tile) adds the S partials in the order
 * 0..S-1 and writes Y: deterministic, no atomics on data.
 *
 * SiLU epilogue (silu = 1): W is the merged gate|up [2N, K]; each warp's
 * weight tiles alternate gate rows and the matching up rows, and the
 * epilogue writes silu(g)·u as the GEMV's SiLU variant does (g and u rounded
 * to bf16, silu(g) rounded, the product rounded on the store): y [M, N].
 *
 * Measured (H200, bench/bench_w8gemm.c, bench/RESULTS.md): at M <= 16 it
 * is ahead of the bf16 cuBLASLt GEMM on every shape; from M = 24 it runs
 * below it on the square and down shapes: ncu puts the issue rate at one
 * instruction per 4 cycles per scheduler with 2 warps each (shared memory
 * bounds the blocks), and the SMs ~60% busy over the call (one wave, the
 * split's last block per tile adds the partials). Past M = 128 the
 * dequantize-then-cuBLASLt path is faster (this kernel reaches ~200
 * TFLOP/s, cuBLASLt ~850). */
#include "cuda_common.cuh"
#include "w8_bits.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

extern "C" {
#include "kernels/linear_w8_mma.h"
#include "kernels/ops_cuda.h"
}

#define W8M_BK 128 /* codes (k) per row per stage */
/* Split workspace: W8M_CNT_MAX tile counters first (a fixed region, so that
 * calls of any shape share one workspace and its counters stay zero), then
 * the partials. */
#define W8M_CNT_MAX 4096

/* ---- device helpers ---- */

static __device__ __forceinline__ uint32_t w8m_smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; src_bytes 0 fills the destination with zeros. */
static __device__ __forceinline__ void w8m_cp16(void *dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(w8m_smem_addr(dst)), "l"(src),
		     "r"(src_bytes));
}
static __device__ __forceinline__ void w8m_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void w8m_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ float w8m_scale(const void *s, int sdt, size_t i)
{
	if (sdt == SFW_DTYPE_F32)
		return __ldg((const float *)s + i);
	uint16_t h = __ldg((const uint16_t *)s + i);
	if (sdt == SFW_DTYPE_BF16)
		return sfwc_bf(h);
	return __half2float(__ushort_as_half(h));
}

/* Four codes (bytes of w, k ascending) times the scale, as the two bf16x2
 * registers of a B fragment: lo = codes 0, 1; hi = codes 2, 3. */
static __device__ __forceinline__ void w8m_dequant4(uint32_t w, float s, uint32_t &lo, uint32_t &hi)
{
	const float magic = 8388736.0f; /* 2^23 + 128 */
	float f0 = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540)) - magic) * s;
	float f1 = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7541)) - magic) * s;
	float f2 = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7542)) - magic) * s;
	float f3 = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7543)) - magic) * s;
	__nv_bfloat162 a = __floats2bfloat162_rn(f0, f1), b = __floats2bfloat162_rn(f2, f3);
	lo = *(uint32_t *)&a;
	hi = *(uint32_t *)&b;
}

/* The same for BF16 scales, without conversions: b - 128 as an exact bf16
 * (w8_codes4_bf, kernels/w8_bits.cuh), then one bf16 multiply by the scale
 * s2 = (s, s): the product of two 8-bit significands is exact before its one
 * rounding to nearest even, so the bits equal those of w8m_dequant4. */
static __device__ __forceinline__ void w8m_dequant4_bf(uint32_t w, uint32_t s2, const w8_bfk &k, uint32_t &lo,
						       uint32_t &hi)
{
	uint32_t u0, u1;
	w8_codes4_bf(w, k, u0, u1);
	__nv_bfloat162 s = *(__nv_bfloat162 *)&s2;
	__nv_bfloat162 r0 = __hmul2(*(__nv_bfloat162 *)&u0, s), r1 = __hmul2(*(__nv_bfloat162 *)&u1, s);
	lo = *(uint32_t *)&r0;
	hi = *(uint32_t *)&r1;
}


static __device__ __forceinline__ uint4 w8m_lds(const void *p)
{
	return *(const uint4 *)p;
}

/* ---- the kernel ---- */

struct w8m_args {
	const uint16_t *X;
	const uint8_t *C;
	const void *S;
	uint16_t *Y;
	int *cnt;    /* split: one counter per tile, zero between calls */
	float *part; /* split: [tiles][splits][threads][acc] */
	int ldx, ldy, M, N, K; /* N: output columns (silu: half the weight rows) */
	int sdt, group, G;     /* group: k per scale (K for per channel) */
	int gshift;            /* log2(group) when a power of two, else -1 */
	int splits, cps;       /* K splits, 128-chunks per split */
};

/* A warp computes WT × 16 weight rows (the MMA's A operand, dequantized in
 * registers) against TT × 8 activation rows (its B operand); WM × WN warps. */
template <int TT, int WT, int WM, int WN, int STAGES, bool SILU>
struct w8m_cfg {
	static constexpr int BM = WM * TT * 8, BN = WN * WT * 16, THREADS = WM * WN * 32;
	static constexpr int A_BYTES = BM * W8M_BK * 2, B_BYTES = BN * W8M_BK; /* activations, codes */
	static constexpr int STAGE = A_BYTES + B_BYTES, SMEM = STAGES * STAGE;
	static constexpr int ACC = TT * WT * 4;
	static_assert(!SILU || WT % 2 == 0, "the SiLU epilogue pairs gate and up tiles");
};

/* The scales' type in registers: floats, or (BF16 scales) bf16 pairs (s, s). */
template <bool SBF> using w8m_sc_t = typename std::conditional<SBF, uint32_t, float>::type;

/* The global weight row of block-local row r (-1: none). SiLU: each warp's
 * 16-row tiles alternate gate (even) and up (odd) rows of the same outputs. */
template <int WT, int BN, bool SILU>
static __device__ __forceinline__ int w8m_wrow(const struct w8m_args &p, int r)
{
	if (!SILU) {
		int n = blockIdx.x * BN + r;
		return n < p.N ? n : -1;
	}
	int w = r / (WT * 16), j = (r % (WT * 16)) / 16, i = r % 16;
	int o = blockIdx.x * (BN / 2) + w * (WT / 2) * 16 + (j / 2) * 16 + i;
	if (o >= p.N)
		return -1;
	return j % 2 == 0 ? o : p.N + o;
}

/* This thread's share of each stage, fixed over the stages: code units (row
 * tid / 8 + x T / 8, unit tid % 8) and activation units (row tid / 16 + x T
 * / 16, unit tid % 16). Activations = [BM][16 units of 8 bf16], unit u of
 * row r at u ^ (r & 1); codes = [BN][8 units of 16], unit u at u ^ ((r & 1)
 * << 2): the fragment loads below hit distinct banks. */
template <int BU, bool SILU> struct w8m_copies {
	/* codes: unit x at byte boff (SiLU: boff[x]) from the codes' base
	 * (sfw_cuda_w8mma_ok bounds N K to 32 bits), valid for x < bn (SiLU:
	 * bit x of bvalid); into shared byte bdst + x (T / 8) W8M_BK (the rows
	 * x T / 8 apart keep their parity, so their swizzle) */
	uint32_t boff[SILU ? BU : 1], bstep, bdst;
	int bn;
	unsigned bvalid;
	/* activations: unit x at element aoff + x astep from X's base, valid
	 * for x < an; into shared byte adst + x (T / 16) 2 W8M_BK */
	uint32_t aoff, astep, adst;
	int an;
	int bu, au;
};

/* The number of x in [0, n) with r0 + x step < lim. */
static __device__ __forceinline__ int w8m_count(int r0, int step, int lim, int n)
{
	if (r0 >= lim)
		return 0;
	int c = (lim - r0 + step - 1) / step;
	return c < n ? c : n;
}

template <class CF, int WT, bool SILU, int BU, int AU>
static __device__ __forceinline__ void w8m_copy_plan(const struct w8m_args &p, int tid, int m0,
						     struct w8m_copies<BU, SILU> &cp)
{
	constexpr int T = CF::THREADS;
	static_assert((T / 8) % 2 == 0 && (T / 16) % 2 == 0, "rows x apart keep their parity");
	int bu = tid & 7, au = tid & 15, rb = tid >> 3, ra = tid >> 4;
	if constexpr (SILU) {
		unsigned bvalid = 0;
#pragma unroll
		for (int x = 0; x < BU; x++) {
			int n = w8m_wrow<WT, CF::BN, SILU>(p, rb + x * (T / 8));
			bvalid |= (n >= 0 ? 1u : 0u) << x;
			cp.boff[x] = (uint32_t)(n < 0 ? 0 : n) * (uint32_t)p.K + (uint32_t)(bu * 16);
		}
		cp.bvalid = bvalid;
	} else {
		int n0 = blockIdx.x * CF::BN + rb;
		cp.boff[0] = (uint32_t)(n0 < p.N ? n0 : 0) * (uint32_t)p.K + (uint32_t)(bu * 16);
		cp.bn = w8m_count(n0, T / 8, p.N, BU);
	}
	cp.bstep = (uint32_t)(T / 8) * (uint32_t)p.K;
	cp.bdst = (uint32_t)(CF::A_BYTES + rb * W8M_BK + ((bu ^ ((rb & 1) << 2)) << 4));
	int am = m0 + ra;
	cp.aoff = (uint32_t)(am < p.M ? am : 0) * (uint32_t)p.ldx + (uint32_t)(au * 8);
	cp.astep = (uint32_t)(T / 16) * (uint32_t)p.ldx;
	cp.an = w8m_count(am, T / 16, p.M, AU);
	cp.adst = (uint32_t)(ra * (W8M_BK * 2) + ((au ^ (ra & 1)) << 4));
	cp.bu = bu, cp.au = au;
}

/* Starts the copies of chunk kc's codes into stage st. */
template <class CF, int BU, bool SILU>
static __device__ __forceinline__ void w8m_load_b(unsigned char *smem, const struct w8m_args &p,
						  const struct w8m_copies<BU, SILU> &cp, int st, int kc)
{
	constexpr int T = CF::THREADS;
	unsigned char *base = smem + (size_t)st * CF::STAGE + cp.bdst;
	int k0 = kc * W8M_BK;
	bool kin = k0 + cp.bu * 16 < p.K;
	const uint8_t *src = p.C + k0; /* (k0 < K: in bounds with offset 0, the address a skipped copy names) */
#pragma unroll
	for (int x = 0; x < BU; x++) {
		bool ok;
		uint32_t off;
		if constexpr (SILU)
			ok = kin && ((cp.bvalid >> x) & 1), off = cp.boff[x];
		else
			ok = kin && x < cp.bn, off = cp.boff[0] + (uint32_t)x * cp.bstep;
		w8m_cp16(base + x * (T / 8) * W8M_BK, src + (ok ? off : 0u), ok ? 16 : 0);
	}
}

/* Starts the copies of chunk kc's activations into stage st. */
template <class CF, int AU, int BU, bool SILU>
static __device__ __forceinline__ void w8m_load_a(unsigned char *smem, const struct w8m_args &p,
						  const struct w8m_copies<BU, SILU> &cp, int st, int kc)
{
	constexpr int T = CF::THREADS;
	unsigned char *base = smem + (size_t)st * CF::STAGE + cp.adst;
	int k0 = kc * W8M_BK;
	bool kin = k0 + cp.au * 8 < p.K;
	const uint16_t *src = p.X + k0; /* (k0 < K <= ldx: in bounds with offset 0) */
#pragma unroll
	for (int x = 0; x < AU; x++) {
		bool ok = kin && x < cp.an;
		w8m_cp16(base + x * (T / 16) * (W8M_BK * 2), src + (ok ? cp.aoff + (uint32_t)x * cp.astep : 0u),
			 ok ? 16 : 0);
	}
}

/* This lane's weight rows: g and g + 8 of each 16-row tile (block-local),
 * and the offsets of their scale rows. */
template <int WT, int BN, bool SILU>
static __device__ __forceinline__ void w8m_lane_rows(const struct w8m_args &p, int wn, int g,
						     int (&brow)[WT][2], size_t (&srow)[WT][2])
{
#pragma unroll
	for (int j = 0; j < WT; j++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			brow[j][h] = wn * WT * 16 + j * 16 + g + 8 * h;
			int n = w8m_wrow<WT, BN, SILU>(p, brow[j][h]);
			srow[j][h] = (size_t)(n < 0 ? 0 : n) * p.G;
		}
}

/* The scales of this lane's 16-code units in half `half` of chunk kc (one
 * group each). */
template <int WT, bool SBF>
static __device__ __forceinline__ void w8m_scales(const struct w8m_args &p, const size_t (&srow)[WT][2],
						  int c, int kc, int half, w8m_sc_t<SBF> (*sv)[2])
{
	int k = kc * W8M_BK + half * 64 + c * 16;
	int gi = min(p.gshift >= 0 ? k >> p.gshift : k / p.group, p.G - 1);
#pragma unroll
	for (int j = 0; j < WT; j++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			if constexpr (SBF) {
				uint32_t v = __ldg((const uint16_t *)p.S + srow[j][h] + gi);
				sv[j][h] = v | (v << 16);
			} else {
				sv[j][h] = w8m_scale(p.S, p.sdt, srow[j][h] + gi);
			}
		}
}

/* MMA step s (0..3) of a 64-wide slice: the codes 4s .. 4s + 3 of bw,
 * dequantized into the A fragments, times activation units a (its halves t
 * = s % 2), into acc. */
template <int TT, int WT, bool SBF>
static __device__ __forceinline__ void w8m_step(const uint4 (&bw)[WT][2], const uint4 (&a)[TT],
						const w8m_sc_t<SBF> (&sc)[WT][2], int s, int t, const w8_bfk &k,
						float (&acc)[TT][WT][4])
{
	uint32_t wf[WT][4]; /* A fragments: a0 a1 a2 a3 */
#pragma unroll
	for (int j = 0; j < WT; j++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t w = s == 0   ? bw[j][h].x
				     : s == 1 ? bw[j][h].y
				     : s == 2 ? bw[j][h].z
					      : bw[j][h].w;
			if constexpr (SBF)
				w8m_dequant4_bf(w, sc[j][h], k, wf[j][h], wf[j][2 + h]);
			else
				w8m_dequant4(w, sc[j][h], wf[j][h], wf[j][2 + h]);
		}
#pragma unroll
	for (int i = 0; i < TT; i++) {
		uint32_t b0 = t ? a[i].z : a[i].x, b1 = t ? a[i].w : a[i].y;
#pragma unroll
		for (int j = 0; j < WT; j++)
			tc_mma(acc[i][j], wf[j], b0, b1);
	}
}

/* One stage in shared memory (activations A, codes B) into acc: two 64-wide
 * slices of four MMA steps each. */
template <int TT, int WT, bool SBF>
static __device__ __forceinline__ void w8m_stage(const unsigned char *A, const unsigned char *B, int wm,
						 int g, int c, const int (&brow)[WT][2],
						 const w8m_sc_t<SBF> (&sc)[2][WT][2], const w8_bfk &k,
						 float (&acc)[TT][WT][4])
{
#pragma unroll
	for (int half = 0; half < 2; half++) {
		uint4 bw[WT][2]; /* 16 codes of rows g, g + 8 of each tile */
#pragma unroll
		for (int j = 0; j < WT; j++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int r = brow[j][h], u = half * 4 + c;
				bw[j][h] = w8m_lds(B + r * W8M_BK + ((u ^ ((r & 1) << 2)) << 4));
			}
#pragma unroll
		for (int q = 0; q < 2; q++) { /* steps 2q, 2q + 1: one activation unit per row */
			uint4 a[TT];
#pragma unroll
			for (int i = 0; i < TT; i++) {
				int r = wm * TT * 8 + i * 8 + g, u = half * 8 + 2 * c + q;
				a[i] = w8m_lds(A + r * (W8M_BK * 2) + ((u ^ (r & 1)) << 4));
			}
#pragma unroll
			for (int t = 0; t < 2; t++)
				w8m_step<TT, WT, SBF>(bw, a, sc[half], q * 2 + t, t, k, acc);
		}
	}
}

/* Split K: writes this block's partial tile to the workspace; the last of
 * the S blocks of the tile to arrive sums the S partials in the order
 * 0..S-1 into acc and returns true, the others return false. last: the
 * kernel's flag in shared memory. */
template <class CF, int TT, int WT>
static __device__ __forceinline__ bool w8m_split_sum(const struct w8m_args &p, int tid, int split,
						     float (&acc)[TT][WT][4], int &last)
{
	constexpr int T = CF::THREADS;
	int tile = blockIdx.y * gridDim.x + blockIdx.x;
	float4 *mine = (float4 *)(p.part + (((size_t)tile * p.splits + split) * T + tid) * CF::ACC);
#pragma unroll
	for (int i = 0; i < TT; i++)
#pragma unroll
		for (int j = 0; j < WT; j++)
			mine[i * WT + j] =
			    make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
	__threadfence();
	__syncthreads();
	if (tid == 0)
		last = atomicAdd(p.cnt + tile, 1) == p.splits - 1;
	__syncthreads();
	if (!last)
		return false;
	__threadfence();
#pragma unroll
	for (int i = 0; i < TT; i++)
#pragma unroll
		for (int j = 0; j < WT; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[i][j][e] = 0.0f;
	for (int s = 0; s < p.splits; s++) {
		const float4 *src =
		    (const float4 *)(p.part + (((size_t)tile * p.splits + s) * T + tid) * CF::ACC);
#pragma unroll
		for (int i = 0; i < TT; i++)
#pragma unroll
			for (int j = 0; j < WT; j++) {
				float4 v = __ldcg(src + i * WT + j);
				acc[i][j][0] += v.x, acc[i][j][1] += v.y, acc[i][j][2] += v.z,
				    acc[i][j][3] += v.w;
			}
	}
	if (tid == 0)
		p.cnt[tile] = 0; /* ready for the next call */
	return true;
}

/* Epilogue: acc[i][j][e] is Y[m, n] for m = activation row 2c + e % 2 of
 * tile i, n = weight row g + 8 (e / 2) of tile j. */
template <int TT, int WT, int BN, bool SILU>
static __device__ __forceinline__ void w8m_epilogue(const struct w8m_args &p, int m0, int wm, int wn, int g,
						    int c, const float (&acc)[TT][WT][4])
{
#pragma unroll
	for (int i = 0; i < TT; i++)
#pragma unroll
		for (int e2 = 0; e2 < 2; e2++) {
			int m = m0 + wm * TT * 8 + i * 8 + 2 * c + e2;
			if (m >= p.M)
				continue;
			uint16_t *y = p.Y + (size_t)m * p.ldy;
			if (!SILU) {
#pragma unroll
				for (int j = 0; j < WT; j++)
#pragma unroll
					for (int h = 0; h < 2; h++) {
						int n = blockIdx.x * BN + wn * WT * 16 + j * 16 + g + 8 * h;
						if (n < p.N)
							y[n] = sfwc_tobf(acc[i][j][2 * h + e2]);
					}
			} else {
#pragma unroll
				for (int j = 0; j < WT; j += 2)
#pragma unroll
					for (int h = 0; h < 2; h++) {
						int n = blockIdx.x * (BN / 2) + wn * (WT / 2) * 16 +
							(j / 2) * 16 + g + 8 * h;
						if (n >= p.N)
							continue;
						float gt = sfwc_rbf(acc[i][j][2 * h + e2]);
						float up = sfwc_rbf(acc[i][j + 1][2 * h + e2]);
						y[n] = sfwc_tobf(sfwc_rbf(gt / (1.0f + expf(-gt))) * up);
					}
			}
		}
}

template <int TT, int WT, int WM, int WN, int STAGES, int MINB, bool SILU, bool SBF>
static __global__ void __launch_bounds__(WM *WN * 32, MINB) w8m_kernel(struct w8m_args p)
{
	using CF = w8m_cfg<TT, WT, WM, WN, STAGES, SILU>;
	using sc_t = w8m_sc_t<SBF>;
	constexpr int BM = CF::BM, BN = CF::BN, T = CF::THREADS;
	constexpr int BU = BN * 8 / T, AU = BM * 16 / T; /* 16-byte units per thread per stage */
	static_assert(BN * 8 % T == 0 && BM * 16 % T == 0, "whole units per thread");
	extern __shared__ __align__(16) unsigned char smem[];
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	int wm = warp / WN, wn = warp % WN, g = lane >> 2, c = lane & 3;
	int m0 = blockIdx.y * BM;
	int split = blockIdx.z;
	int kc0 = split * p.cps, kcn = (p.K + W8M_BK - 1) / W8M_BK;
	int kc1 = min(kcn, kc0 + p.cps);
	int nst = kc1 - kc0; /* stages of this block (>= 1 by the plan) */

	struct w8m_copies<BU, SILU> cp;
	w8m_copy_plan<CF, WT, SILU, BU, AU>(p, tid, m0, cp);
	int brow[WT][2];
	size_t srow[WT][2];
	w8m_lane_rows<WT, BN, SILU>(p, wn, g, brow, srow);
	const w8_bfk bfk = w8_bfk_make();

	/* acc[i][j]: activation tile i (8 rows) × weight tile j (16 rows); the
	 * MMA's D: element e is weight row g + 8 (e / 2), activation row 2c +
	 * e % 2. */
	float acc[TT][WT][4];
#pragma unroll
	for (int i = 0; i < TT; i++)
#pragma unroll
		for (int j = 0; j < WT; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[i][j][e] = 0.0f;

				/* Weights first (written only by copies): they stream while the kernel
				 * before finishes; activations after the programmatic-launch wait. */
#pragma unroll
	for (int s = 0; s < STAGES - 1; s++)
		if (s < nst)
			w8m_load_b<CF, BU, SILU>(smem, p, cp, s, kc0 + s);
	sc_t sc[2][WT][2];
	w8m_scales<WT, SBF>(p, srow, c, kc0, 0, sc[0]);
	w8m_scales<WT, SBF>(p, srow, c, kc0, 1, sc[1]);
	sfwc_pdl_wait();
#pragma unroll
	for (int s = 0; s < STAGES - 1; s++) {
		if (s < nst)
			w8m_load_a<CF, AU, BU, SILU>(smem, p, cp, s, kc0 + s);
		w8m_commit();
	}

	/* st = it % STAGES, sn = (it + STAGES - 1) % STAGES, kept without a division */
	for (int it = 0, st = 0, sn = STAGES - 1; it < nst; it++) {
		w8m_wait<STAGES - 2>();
		__syncthreads(); /* stage st landed for all; stage (it - 1) % STAGES is free */
		{
			int nx = it + STAGES - 1;
			if (nx < nst) {
				w8m_load_b<CF, BU, SILU>(smem, p, cp, sn, kc0 + nx);
				w8m_load_a<CF, AU, BU, SILU>(smem, p, cp, sn, kc0 + nx);
			}
			w8m_commit();
			sn = sn + 1 == STAGES ? 0 : sn + 1;
		}
		sc_t scn[2][WT][2];
		if (it + 1 < nst) {
			w8m_scales<WT, SBF>(p, srow, c, kc0 + it + 1, 0, scn[0]);
			w8m_scales<WT, SBF>(p, srow, c, kc0 + it + 1, 1, scn[1]);
		}
		const unsigned char *A = smem + (size_t)st * CF::STAGE;
		w8m_stage<TT, WT, SBF>(A, A + CF::A_BYTES, wm, g, c, brow, sc, bfk, acc);
		if (it + 1 < nst) {
#pragma unroll
			for (int j = 0; j < WT; j++)
#pragma unroll
				for (int h = 0; h < 2; h++)
					sc[0][j][h] = scn[0][j][h], sc[1][j][h] = scn[1][j][h];
		}
		st = st + 1 == STAGES ? 0 : st + 1;
	}
	w8m_wait<0>();

	if (p.splits > 1) {
		__shared__ int last;
		if (!w8m_split_sum<CF>(p, tid, split, acc, last))
			return;
	}
	w8m_epilogue<TT, WT, BN, SILU>(p, m0, wm, wn, g, c, acc);
}

/* ---- plan and launch ---- */

/* The tile configurations X(id, TT, WT, WM, WN, STAGES, MINB): a block is
 * WM x WN warps, each TT activation tiles (8 rows) x WT weight tiles (16
 * rows), K streamed in STAGES stages; MINB the blocks per multiprocessor
 * the register allocation is held to (__launch_bounds__). Each runs with
 * one of two split targets (w8m_split): as many blocks as fit on the
 * device at once, or one per multiprocessor (longer K per block). A call's
 * configuration and target follow M (w8m_cfg_for, chosen on the H200 with
 * bench_w8gemm --sweep, bench/RESULTS.md); the others stay for the sweep
 * and are tested like the chosen ones (tests/gpu_w8gemm.c). The SiLU
 * epilogue needs WT even. */
#define W8M_CFGS(X)                                                                                       \
	X(0, 1, 2, 1, 4, 4, 1)                                                                            \
	X(1, 2, 2, 1, 4, 4, 1)                                                                            \
	X(2, 4, 2, 1, 4, 4, 1)                                                                            \
	X(3, 4, 2, 2, 4, 3, 1)                                                                            \
	X(4, 8, 2, 2, 4, 3, 1)                                                                            \
	X(5, 2, 1, 1, 8, 4, 1)                                                                            \
	X(6, 4, 1, 1, 4, 4, 1)                                                                            \
	X(7, 4, 1, 1, 8, 3, 1)                                                                            \
	X(8, 8, 1, 1, 4, 3, 1)                                                                            \
	X(9, 8, 1, 1, 8, 3, 1)                                                                            \
	X(10, 8, 2, 1, 4, 3, 1)                                                                           \
	X(11, 4, 1, 2, 4, 4, 1)                                                                           \
	X(12, 4, 2, 1, 2, 4, 1)                                                                           \
	X(13, 4, 2, 2, 4, 3, 2)                                                                           \
	X(14, 8, 1, 1, 8, 3, 2)                                                                           \
	X(15, 2, 2, 1, 4, 3, 2)                                                                           \
	X(16, 1, 2, 1, 2, 6, 1)                                                                           \
	X(17, 2, 2, 1, 2, 6, 1)                                                                           \
	X(18, 4, 2, 1, 2, 6, 1)
#define W8M_NBASE 19
/* cfg = 2 x the table's id + the split target (0: fill the device, 1: one
 * block per multiprocessor) */
#define W8M_NCFG (2 * W8M_NBASE)

/* The configuration a call of M rows and N outputs over K takes: the
 * fastest of the sweep on the H200 (bench/RESULTS.md, the fourteenth
 * session) for the model's shapes, in sfw_cuda_w8mma_cfg_name's terms.
 * SiLU (gate|up): t2w2 1x4 to 16 rows, t4w2 1x4 to 32, t8w2 1x4 beyond,
 * split to one block per multiprocessor. Narrow outputs (K/V, N <= 512):
 * t1w2 1x2 s6 to 32 rows, t2w1 1x8 beyond. The others: t2w1 1x8 to 16
 * rows, t4w1 1x8 to 32; to 64 t8w1 1x4 (down, K >= 2N) or t4w2 1x2 s6
 * (4096 x 4096), one block per multiprocessor; to 128 t8w2 1x4 or t4w1
 * 1x8, one per multiprocessor; past 128 rows t8w2 2x4. */
static int w8m_cfg_for(int M, int N, int K, int silu)
{
	if (M > 128) /* prefill pieces (the engine dequantizes there): the widest tiles */
		return 2 * 4;
	if (silu)
		return M <= 16 ? 2 * 1 + 1 : M <= 32 ? 2 * 2 + 1 : 2 * 10 + 1;
	if (N <= 512)
		return M <= 32 ? 2 * 16 : 2 * 5;
	if (M <= 16)
		return 2 * 5;
	if (M <= 32)
		return 2 * 7;
	if (M <= 64)
		return K >= 2 * N ? 2 * 8 + 1 : 2 * 18 + 1;
	return K >= 2 * N ? 2 * 10 + 1 : 2 * 7 + 1;
}

struct w8m_plan {
	int cfg, bm, bn, threads, acc, smem, per_sm;
	int tiles_m, tiles_n, splits, cps;
	size_t ws_bytes; /* counters + partials (0: no split) */
};

/* The kernel's shared-memory limit raised, once per device. */
template <int MT, int NT, int WM, int WN, int ST, int MB, bool SILU, bool SBF> static void w8m_attr(void)
{
	using CF = w8m_cfg<MT, NT, WM, WN, ST, SILU>;
	static bool set[SFWC_MAX_DEVICES];
	int dev = sfwc_device();
	if (!set[dev]) {
		SFW_CUDA_CHECK(cudaFuncSetAttribute(w8m_kernel<MT, NT, WM, WN, ST, MB, SILU, SBF>,
						    cudaFuncAttributeMaxDynamicSharedMemorySize, CF::SMEM));
		set[dev] = true;
	}
}

/* Blocks of the kernel resident per multiprocessor (shared memory and
 * registers both count), as the runtime computes it; once per device. */
template <int MT, int NT, int WM, int WN, int ST, int MB, bool SILU> static int w8m_occ(void)
{
	using CF = w8m_cfg<MT, NT, WM, WN, ST, SILU>;
	static int occ[SFWC_MAX_DEVICES];
	int dev = sfwc_device();
	if (!occ[dev]) {
		int n = 0;
		w8m_attr<MT, NT, WM, WN, ST, MB, SILU, true>();
		SFW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		    &n, w8m_kernel<MT, NT, WM, WN, ST, MB, SILU, true>, CF::THREADS, CF::SMEM));
		occ[dev] = n < 1 ? 1 : n;
	}
	return occ[dev];
}

static int w8m_cfg_ok(int cfg, int silu)
{
	if (cfg < 0 || cfg >= W8M_NCFG)
		return 0;
	switch (cfg / 2) {
#define X(id, MT, NT, WM, WN, ST, MB)                                                                     \
	case id:                                                                                          \
		return !silu || NT % 2 == 0;
		W8M_CFGS(X)
#undef X
	default:
		return 0;
	}
}

/* The split over K: enough blocks to fill the device once (per_sm on each
 * multiprocessor; one: one on each), each split at least two stages, and
 * its partials within ws_max bytes of workspace. */
static void w8m_split(struct w8m_plan *pl, int K, int sms, int one, size_t ws_max)
{
	int kcn = (K + W8M_BK - 1) / W8M_BK;
	long tiles = (long)pl->tiles_m * pl->tiles_n;
	long want = (long)sms * (one ? 1 : pl->per_sm);
	size_t per_split = (size_t)tiles * pl->threads * pl->acc * sizeof(float);
	int s = 1;
	if (tiles < want && tiles <= W8M_CNT_MAX) {
		s = (int)((want + tiles - 1) / tiles);
		if (s > kcn / 2)
			s = kcn / 2;
		size_t room = ws_max > W8M_CNT_MAX * sizeof(int) ? ws_max - W8M_CNT_MAX * sizeof(int) : 0;
		if ((size_t)s * per_split > room)
			s = (int)(room / per_split);
		if (s < 1)
			s = 1;
	}
	pl->cps = (kcn + s - 1) / s;
	pl->splits = (kcn + pl->cps - 1) / pl->cps; /* no empty split */
	pl->ws_bytes = pl->splits > 1 ? W8M_CNT_MAX * sizeof(int) + (size_t)pl->splits * per_split : 0;
}

static struct w8m_plan w8m_plan_for(int M, int N, int K, int silu, int sms, int cfg, size_t ws_max)
{
	struct w8m_plan pl = {};
	pl.cfg = cfg;
	switch (cfg / 2) {
#define X(id, MT, NT, WM, WN, ST, MB)                                                                     \
	case id: {                                                                                        \
		using CF = w8m_cfg<MT, NT, WM, WN, ST, false>;                                            \
		pl.bm = CF::BM, pl.bn = CF::BN, pl.threads = CF::THREADS, pl.acc = CF::ACC, pl.smem = CF::SMEM; \
		if constexpr (NT % 2 == 0)                                                                \
			pl.per_sm = silu ? w8m_occ<MT, NT, WM, WN, ST, MB, true>()                       \
					 : w8m_occ<MT, NT, WM, WN, ST, MB, false>();                     \
		else                                                                                      \
			pl.per_sm = w8m_occ<MT, NT, WM, WN, ST, MB, false>();                            \
		break;                                                                                    \
	}
		W8M_CFGS(X)
#undef X
	}
	int outn = silu ? pl.bn / 2 : pl.bn; /* output columns per block */
	pl.tiles_m = (M + pl.bm - 1) / pl.bm;
	pl.tiles_n = (N + outn - 1) / outn;
	w8m_split(&pl, K, sms, cfg % 2, ws_max);
	return pl;
}

/* The device's multiprocessors: the caller's figure (struct sfw_cuda_ctx
 * holds it), else asked of the runtime. */
static int w8m_sms(int sms)
{
	if (sms > 0)
		return sms;
	int dev = 0, n = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&dev));
	SFW_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
	return n;
}

extern "C" int sfw_cuda_w8mma_ncfg(void)
{
	return W8M_NCFG;
}

extern "C" const char *sfw_cuda_w8mma_cfg_name(int cfg)
{
	if (cfg < 0 || cfg >= W8M_NCFG)
		return "?";
	switch (cfg) {
#define X(id, MT, NT, WM, WN, ST, MB)                                                                     \
	case 2 * id:                                                                                      \
		return "t" #MT "w" #NT " " #WM "x" #WN " s" #ST " b" #MB " fill";                         \
	case 2 * id + 1:                                                                                  \
		return "t" #MT "w" #NT " " #WM "x" #WN " s" #ST " b" #MB " one";
		W8M_CFGS(X)
#undef X
	default:
		return "?";
	}
}

extern "C" int sfw_cuda_w8mma_cfg_takes(int cfg, int silu)
{
	return w8m_cfg_ok(cfg, silu);
}

extern "C" size_t sfw_cuda_w8mma_ws_bytes_cfg(int M, int N, int K, int silu, int sms, int cfg)
{
	if (M <= 0 || N <= 0 || K <= 0)
		return 0;
	if (cfg < 0)
		cfg = w8m_cfg_for(M, N, K, silu);
	if (!w8m_cfg_ok(cfg, silu))
		return 0;
	return w8m_plan_for(M, N, K, silu, w8m_sms(sms), cfg, SIZE_MAX).ws_bytes;
}

extern "C" size_t sfw_cuda_w8mma_ws_bytes(int M, int N, int K, int silu, int sms)
{
	return sfw_cuda_w8mma_ws_bytes_cfg(M, N, K, silu, sms, -1);
}

extern "C" int sfw_cuda_w8mma_ok(const void *X, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh)
{
	const uint8_t *codes = w->codes;
	enum sfw_dtype sdt = w->sdt;
	int group = w->group, ldx = sfw_gemm_ldx(sh), M = sh->M, N = sh->N, K = sh->K;
	int g = group <= 0 || group >= K ? K : group;
	/* the copies address codes and X with 32-bit offsets */
	if ((uint64_t)N * (uint64_t)K > UINT32_MAX / 2 || (uint64_t)M * (uint64_t)ldx > UINT32_MAX / 2)
		return 0;
	return M >= 1 && N >= 1 && K >= 16 && K % 16 == 0 && g % 16 == 0 && ldx >= K && ldx % 8 == 0 &&
	       ((uintptr_t)X & 15) == 0 && ((uintptr_t)codes & 15) == 0 &&
	       (sdt == SFW_DTYPE_BF16 || sdt == SFW_DTYPE_F16 || sdt == SFW_DTYPE_F32);
}

template <int MT, int NT, int WM, int WN, int ST, int MB, bool SILU, bool SBF>
static void w8m_launch1(const struct w8m_plan &pl, const struct w8m_args &a, cudaStream_t s)
{
	using CF = w8m_cfg<MT, NT, WM, WN, ST, SILU>;
	w8m_attr<MT, NT, WM, WN, ST, MB, SILU, SBF>();
	sfwc_launch(w8m_kernel<MT, NT, WM, WN, ST, MB, SILU, SBF>, dim3(pl.tiles_n, pl.tiles_m, pl.splits),
		    dim3(CF::THREADS), CF::SMEM, s, a);
	SFW_CUDA_LAUNCHED();
}

template <int MT, int NT, int WM, int WN, int ST, int MB, bool SILU>
static void w8m_launch(const struct w8m_plan &pl, const struct w8m_args &a, cudaStream_t s)
{
	if constexpr (!SILU || NT % 2 == 0) {
		if (a.sdt == SFW_DTYPE_BF16)
			w8m_launch1<MT, NT, WM, WN, ST, MB, SILU, true>(pl, a, s);
		else
			w8m_launch1<MT, NT, WM, WN, ST, MB, SILU, false>(pl, a, s);
	}
}

/* The call, with configuration cfg (-1: w8m_cfg_for's). */
static int w8m_gemm(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y, const struct sfw_gemm_shape *sh,
		    int silu, void *ws, size_t ws_bytes, void *stream, int sms, int cfg)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	int group = w->group, ldx = sfw_gemm_ldx(sh), ldy = sfw_gemm_ldy(sh), M = sh->M, N = sh->N, K = sh->K;
	if (!sfw_cuda_w8mma_ok(X, w, sh) || ldy < N)
		return 0;
	if (cfg < 0)
		cfg = w8m_cfg_for(M, N, K, silu);
	if (!w8m_cfg_ok(cfg, silu))
		return 0;
	int g = group <= 0 || group >= K ? K : group;
	/* a workspace that is missing, misaligned or small: fewer splits (at
	 * worst one block per tile over the whole K) */
	size_t room = ws && ((uintptr_t)ws & 255) == 0 ? ws_bytes : 0;
	struct w8m_plan pl = w8m_plan_for(M, N, K, silu, w8m_sms(sms), cfg, room);
	struct w8m_args a = {};
	a.X = X, a.C = codes, a.S = scales, a.Y = Y;
	a.ldx = ldx, a.ldy = ldy, a.M = M, a.N = N, a.K = K;
	a.sdt = (int)sdt, a.group = g, a.G = (K + g - 1) / g;
	a.gshift = (g & (g - 1)) == 0 ? sfw_log2i(g) : -1;
	a.splits = pl.splits, a.cps = pl.cps;
	if (pl.splits > 1) {
		a.cnt = (int *)ws;
		a.part = (float *)((char *)ws + W8M_CNT_MAX * sizeof(int));
	}
	cudaStream_t s = SFW_CUDA_STREAM(stream);
	switch (cfg / 2) {
#define X(id, MT, NT, WM, WN, ST, MB)                                                                     \
	case id:                                                                                          \
		if (silu)                                                                                 \
			w8m_launch<MT, NT, WM, WN, ST, MB, true>(pl, a, s);                                \
		else                                                                                      \
			w8m_launch<MT, NT, WM, WN, ST, MB, false>(pl, a, s);                               \
		break;
		W8M_CFGS(X)
#undef X
	}
	return 1;
}

extern "C" int sfw_cuda_gemm_w8_mma(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
				    const struct sfw_gemm_shape *sh, int silu, void *ws, size_t ws_bytes,
				    void *stream, int sms)
{
	return w8m_gemm(X, w, Y, sh, silu, ws, ws_bytes, stream, sms, -1);
}

extern "C" int sfw_cuda_gemm_w8_mma_cfg(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
					const struct sfw_gemm_shape *sh, int silu, void *ws, size_t ws_bytes,
					void *stream, int cfg)
{
	return w8m_gemm(X, w, Y, sh, silu, ws, ws_bytes, stream, 0, cfg);
}
