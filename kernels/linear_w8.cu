/* linear_w8.cu - Y[M,N] = X[M,K] · Wᵀ with W int8 pack-quantized (W8A16,
 * num/w8_layout.h), bf16 activations, fp32 accumulation: the CUDA twins of
 * sfw_op_matmul_w8_cpu (kernels/matmul_w8.c).
 *
 * Decode (M ≤ 8) is a pure stream of codes and scales: each warp takes R
 * whole rows, each lane reads 16 codes per 16-byte no-L1-allocate load (U
 * loads per row in flight) together with the scale of their group, turns
 * each byte into the float b - 128 exactly (the byte under a 2^23 exponent,
 * minus 2^23 + 128: one byte permute and one subtract), and accumulates
 * Σ (b - 128)·x over the 16 codes, then adds that sum times the group's
 * scale: the meaning w = (b - 128) · scale in float32 of the C twin, summed
 * in another order. The weights are read before the programmatic-launch
 * wait, as the bf16 GEMV's (kernels/linear.cu): codes and scales are written
 * only by copies.
 *
 * Prefill (M > 8) dequantizes a slab of rows into bf16 in the op scratch
 * ((b - 128) · scale in float32, rounded to bf16 once: the bf16 tensor cores'
 * input) and runs cuBLASLt on it, slab after slab, each writing its column
 * range of Y. Shapes the vector kernels cannot take (K or the group not a
 * multiple of 16, unaligned pointers) run a scalar warp-per-output kernel of
 * the same meaning. */
#include "cuda_act.cuh"
#include "kernels/linear_w8_mma.h"
#include "w8_bits.cuh"

#include <cuda_fp16.h>

#define W8_WARPS 4
#define SDT_F32 0
#define SDT_BF16 1
#define SDT_F16 3

static_assert(SFW_DTYPE_F32 == SDT_F32 && SFW_DTYPE_BF16 == SDT_BF16 && SFW_DTYPE_F16 == SDT_F16, "scale dtype codes");

template <int SDT> static __device__ __forceinline__ float w8_scale(const void *s, size_t i)
{
	if (SDT == SDT_F32)
		return __ldg((const float *)s + i);
	uint16_t h = __ldg((const uint16_t *)s + i);
	if (SDT == SDT_BF16)
		return sfwc_bf(h);
	return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float w8_scale_any(const void *s, enum sfw_dtype sdt, size_t i)
{
	return sdt == SFW_DTYPE_F32 ? w8_scale<SDT_F32>(s, i)
	       : sdt == SFW_DTYPE_F16 ? w8_scale<SDT_F16>(s, i)
				   : w8_scale<SDT_BF16>(s, i);
}

/* The four codes of a word as exact floats b - 128: byte j under the
 * exponent of 2^23 is 2^23 + b. */
static __device__ __forceinline__ void w8_unpack4(uint32_t w, float *f)
{
	const float magic = 8388736.0f; /* 2^23 + 128 */
	f[0] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540)) - magic;
	f[1] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7541)) - magic;
	f[2] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7542)) - magic;
	f[3] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7543)) - magic;
}

static __device__ __forceinline__ void w8_unpack16(uint4 v, float *f)
{
	w8_unpack4(v.x, f), w8_unpack4(v.y, f + 4), w8_unpack4(v.z, f + 8), w8_unpack4(v.w, f + 12);
}

static __device__ __forceinline__ void w8_out(uint16_t *p, size_t i, float v)
{
	p[i] = sfwc_tobf(v);
}
/* float outputs are the logits: rounded through bf16 as the reference does */
static __device__ __forceinline__ void w8_out(float *p, size_t i, float v)
{
	p[i] = sfwc_rbf(v);
}

/* Warps per block of a variant: 4, or KS where a row takes more. */
#define W8_BW(KS) ((KS) > W8_WARPS ? (KS) : W8_WARPS)

/* KS > 1 (split K): KS warps of the block share each R rows, warp j of them
 * taking the 16-code vectors j·32 + lane + t·32·KS, so every warp still reads
 * 512 contiguous bytes per load and a row of K = 4096 is a single batch;
 * their sums are added in shared memory in a fixed order (warp 0 + 1 + …). */
/* SILU (R = 2, M = 1, bf16 out; the merged gate|up of 2N rows): the warp
 * takes rows n and N + n, rounds both sums to bf16 as the plain GEMV writes
 * them, and writes silu(g)·u rounded as silu_mul_kernel (kernels/
 * elementwise.cu) does: bit-equal to the GEMV R1 with the same U followed by
 * sfw_op_silu_mul_cuda, one launch less. */
template <int R, int U, int M, int SDT, typename TO, bool PIPE = false, int KS = 1, bool SILU = false>
static __global__ void __launch_bounds__(W8_BW(KS) * 32)
	gemv_w8_kernel(const uint16_t *__restrict__ X, int ldx, const uint8_t *__restrict__ C, const void *__restrict__ S,
		       int G, int group, int gshift, TO *__restrict__ Y, int ldy, int N, int K, float alpha)
{
	constexpr int BW = W8_BW(KS);
	int warp = threadIdx.x >> 5;
	int lane = (warp % KS) * 32 + (threadIdx.x & 31); /* the lane within the row's KS warps */
	static_assert(!SILU || (R == 2 && M == 1 && KS == 1), "the SiLU epilogue: two rows, one activation row");
	int row0 = (blockIdx.x * (BW / KS) + warp / KS) * (SILU ? 1 : R);
	if (KS == 1 && row0 >= N)
		return;
	int nv = K >> 4; /* 16-code vectors per row (rows are K bytes: K % 16 == 0) */
	const uint4 *cr[R];
	size_t sr[R];
#pragma unroll
	for (int r = 0; r < R; r++) {
		int row = SILU ? row0 + r * N : min(row0 + r, N - 1);
		cr[r] = (const uint4 *)(C + (size_t)row * K);
		sr[r] = (size_t)row * G;
	}
	float acc[R][M];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int m = 0; m < M; m++)
			acc[r][m] = 0.0f;
	uint4 w[U][R], wn[PIPE ? U : 1][R];
	float sc[U][R], scn[PIPE ? U : 1][R];
	/* gshift: log2(group / 16) when the group is a power of two, else -1 */
	auto gidx = [&](int i) { return gshift >= 0 ? i >> gshift : (i << 4) / group; };
	auto load = [&](int base, uint4 (*wd)[R], float (*sd)[R]) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			int i = base + u * 32 * KS + lane;
#pragma unroll
			for (int r = 0; r < R; r++) {
				wd[u][r] = i < nv ? sfwc_ld_stream(cr[r] + i) : make_uint4(0, 0, 0, 0);
				sd[u][r] = i < nv ? w8_scale<SDT>(S, sr[r] + gidx(i)) : 0.0f;
			}
		}
	};
	/* One 16-code vector of each of the R rows against the M activation
	 * rows: four independent FMA chains per vector, then the group scale. */
	auto consume = [&](int u, int i) {
		float q[R][16];
#pragma unroll
		for (int r = 0; r < R; r++)
			w8_unpack16(w[u][r], q[r]);
#pragma unroll
		for (int m = 0; m < M; m++) {
			const uint4 *xp = (const uint4 *)(X + (size_t)m * ldx) + 2 * i;
			float xf[16];
			sfwc_unpack8(__ldg(xp), xf);
			sfwc_unpack8(__ldg(xp + 1), xf + 8);
#pragma unroll
			for (int r = 0; r < R; r++) {
				float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
				for (int j = 0; j < 16; j++)
					s4[j & 3] = fmaf(q[r][j], xf[j], s4[j & 3]);
				acc[r][m] = fmaf((s4[0] + s4[1]) + (s4[2] + s4[3]), sc[u][r], acc[r][m]);
			}
		}
	};
	load(0, w, sc);
	sfwc_pdl_wait();
	for (int base = 0; base < nv; base += 32 * KS * U) {
		int next = base + 32 * KS * U;
		if (PIPE && next < nv) /* the next batch in flight while this one is consumed */
			load(next, wn, scn);
		if (next <= nv) { /* a full batch: no bounds checks between the vectors */
#pragma unroll
			for (int u = 0; u < U; u++)
				consume(u, base + u * 32 * KS + lane);
		} else {
#pragma unroll
			for (int u = 0; u < U; u++)
				if (base + u * 32 * KS + lane < nv)
					consume(u, base + u * 32 * KS + lane);
		}
		if (next < nv) {
			if (PIPE) {
#pragma unroll
				for (int u = 0; u < U; u++)
#pragma unroll
					for (int r = 0; r < R; r++)
						w[u][r] = wn[PIPE ? u : 0][r], sc[u][r] = scn[PIPE ? u : 0][r];
			} else {
				load(next, w, sc);
			}
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int m = 0; m < M; m++)
			acc[r][m] = sfwc_warp_sum(acc[r][m]);
	if (KS > 1) {
		__shared__ float part[BW][R][M];
		if ((threadIdx.x & 31) == 0)
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int m = 0; m < M; m++)
					part[warp][r][m] = acc[r][m];
		__syncthreads();
		if (warp % KS != 0 || row0 >= N)
			return;
#pragma unroll
		for (int j = 1; j < KS; j++)
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int m = 0; m < M; m++)
					acc[r][m] += part[warp + j][r][m];
	}
	if (SILU) {
		if (lane == 0) {
			float g = sfwc_rbf(alpha * acc[0][0]), u = sfwc_rbf(alpha * acc[1 % R][0]);
			w8_out(Y, row0, sfwc_rbf(g / (1.0f + expf(-g))) * u);
		}
		return;
	}
	if (lane == 0) {
#pragma unroll
		for (int r = 0; r < R; r++)
			if (row0 + r < N)
#pragma unroll
				for (int m = 0; m < M; m++)
					w8_out(Y, (size_t)m * ldy + row0 + r, alpha * acc[r][m]);
	}
}

/* Decode rows (M <= 8) on the tensor cores (the variant R = 301 of
 * sfw_cuda_gemv_w8_variant, U the 64-code slices a lane keeps in flight; the
 * engine's with SALAFW_CUDA_W8GEMV=tc while it is measured, docs/
 * performance.md §5.18). A block takes 16 rows (one m16 tile, the MMA's A
 * operand) and W8T_KS warps split K between them; activation row m is the B
 * operand's column m (an n8 tile: columns past M hold copies of row 0 and
 * are never stored), so the codes are read once whatever M. Per 64-code
 * slice, lane (g, c) loads the 16 codes W[n0 + g, k0 + 16c ..] and
 * W[n0 + g + 8, same k] (16-byte no-L1-allocate loads, the first U slices
 * before the programmatic-launch wait) and the 16 activations of the same k
 * of its row g; MMA step t (0..3) takes codes and activations 4t .. 4t + 3
 * of those 16 in the fragment positions k = 2c, 2c + 1, 2c + 8, 2c + 9 (as
 * kernels/linear_w8_mma.cu: A and B only have to agree on the order of k).
 * The codes become the exact bf16 values b - 128 (w8_codes4_bf: 2
 * instructions a code, against the CUDA-core kernel's 3 and its
 * activations' unpacking), the MMA sums a group's products in fp32, and each
 * group's sum is multiplied by its scale into the row's fp32 total:
 * w = (b - 128) · scale in float32, the C twin's meaning, summed in another
 * order. Groups are whole slices (a
 * multiple of 64, or one per row); the warps' partial rows are added in
 * shared memory in warp order. */
#define W8T_KS 8
/* SILU: the merged gate|up [2N, K]; the block's tiles are gate rows n0 ..
 * n0 + 15 and up rows N + n0 .., and it writes silu(g)·u for its 16 outputs
 * with the roundings of gemv_w8_kernel's SILU form (g and u to bf16, silu(g)
 * to bf16, the product on the store). */
template <int U, int SDT, bool SILU>
static __global__ void __launch_bounds__(W8T_KS * 32)
	gemv_w8_tc_kernel(const uint16_t *__restrict__ X, int ldx, int M, const uint8_t *__restrict__ C,
			  const void *__restrict__ S, int G, int spg, uint16_t *__restrict__ Y, int ldy, int N, int K,
			  float alpha)
{
	constexpr int NT = SILU ? 2 : 1; /* m16 tiles of the block */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
	const int n0 = blockIdx.x * 16, ns = K >> 6, per = (ns + W8T_KS - 1) / W8T_KS;
	const int s0 = min(ns, warp * per), s1 = min(ns, s0 + per);
	const uint4 *rr[NT][2];
#pragma unroll
	for (int j = 0; j < NT; j++)
#pragma unroll
		for (int h = 0; h < 2; h++)
			rr[j][h] = (const uint4 *)(C + (size_t)(j * N + n0 + g + 8 * h) * K) + c;
	/* the B operand's column g: activation row g (rows past M read row 0;
	 * their columns are never stored) */
	const uint4 *xr = (const uint4 *)(X + (size_t)(g < M ? g : 0) * ldx) + 2 * c;
	const w8_bfk bk = w8_bfk_make();
	uint4 w[U][NT][2];
#pragma unroll
	for (int u = 0; u < U; u++)
		if (s0 + u < s1)
#pragma unroll
			for (int j = 0; j < NT; j++)
				w[u][j][0] = sfwc_ld_stream(rr[j][0] + 4 * (s0 + u)),
				w[u][j][1] = sfwc_ld_stream(rr[j][1] + 4 * (s0 + u));
	sfwc_pdl_wait();
	float acc[NT][4] = {}, ga[NT][4] = {};
	int gi = s0 / spg, left = spg - s0 % spg; /* this slice's group, and its slices from here */
	for (int sb = s0; sb < s1; sb += U) {
		uint4 nx[U][NT][2];
#pragma unroll
		for (int u = 0; u < U; u++)
			if (sb + U + u < s1)
#pragma unroll
				for (int j = 0; j < NT; j++)
					nx[u][j][0] = sfwc_ld_stream(rr[j][0] + 4 * (sb + U + u)),
					nx[u][j][1] = sfwc_ld_stream(rr[j][1] + 4 * (sb + U + u));
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int sl = sb + u;
			if (sl >= s1)
				break;
			const uint4 xa = __ldg(xr + 8 * sl), xb = __ldg(xr + 8 * sl + 1);
			const uint32_t xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const uint4 p = w[u][j][0], q = w[u][j][1];
				const uint32_t ca[4] = {p.x, p.y, p.z, p.w}, cb[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
				for (int t = 0; t < 4; t++) {
					uint32_t a[4];
					w8_codes4_bf(ca[t], bk, a[0], a[2]); /* row g: k pairs (2c, 2c + 1), (2c + 8, 2c + 9) */
					w8_codes4_bf(cb[t], bk, a[1], a[3]); /* row g + 8 */
					tc_mma(ga[j], a, xv[2 * t], xv[2 * t + 1]);
				}
			}
			if (--left == 0 || sl == s1 - 1) { /* the group ends here, or this warp's share */
#pragma unroll
				for (int j = 0; j < NT; j++) {
					const size_t o0 = (size_t)(j * N + n0 + g) * G + gi, o1 = o0 + (size_t)8 * G;
					const float sg = w8_scale<SDT>(S, o0), sg8 = w8_scale<SDT>(S, o1);
					acc[j][0] = fmaf(ga[j][0], sg, acc[j][0]), acc[j][1] = fmaf(ga[j][1], sg, acc[j][1]);
					acc[j][2] = fmaf(ga[j][2], sg8, acc[j][2]), acc[j][3] = fmaf(ga[j][3], sg8, acc[j][3]);
					ga[j][0] = ga[j][1] = ga[j][2] = ga[j][3] = 0.0f;
				}
				gi++, left = spg;
			}
		}
#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int j = 0; j < NT; j++)
				w[u][j][0] = nx[u][j][0], w[u][j][1] = nx[u][j][1];
	}
	/* lane (g, c) holds rows g (acc[.][0, 1]) and g + 8 (acc[.][2, 3]) of
	 * columns 2c, 2c + 1: activation rows */
	__shared__ float part[W8T_KS][NT][16][8];
#pragma unroll
	for (int j = 0; j < NT; j++)
#pragma unroll
		for (int e = 0; e < 2; e++)
			part[warp][j][g][2 * c + e] = acc[j][e], part[warp][j][g + 8][2 * c + e] = acc[j][2 + e];
	__syncthreads();
	const int r = threadIdx.x & 15, m = threadIdx.x >> 4; /* output (row n0 + r, activation row m) */
	if (m < M) {
		float t[NT];
#pragma unroll
		for (int j = 0; j < NT; j++) {
			t[j] = part[0][j][r][m];
#pragma unroll
			for (int i = 1; i < W8T_KS; i++)
				t[j] += part[i][j][r][m];
		}
		if (SILU) {
			float gv = sfwc_rbf(alpha * t[0]), uv = sfwc_rbf(alpha * t[NT - 1]);
			w8_out(Y, (size_t)m * ldy + n0 + r, sfwc_rbf(gv / (1.0f + expf(-gv))) * uv);
		} else {
			w8_out(Y, (size_t)m * ldy + n0 + r, alpha * t[0]);
		}
	}
}

/* Any K, group, alignment and activation type: one warp per (row, m). */
template <typename A, typename TO>
static __global__ void gemv_w8_scalar_kernel(const A *X, int ldx, const uint8_t *C, const void *S,
					     enum sfw_dtype sdt, int group, TO *Y, int ldy, int M, int N, int K,
					     float alpha)
{
	sfwc_pdl_wait();
	int lane = threadIdx.x & 31;
	long o = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (o >= (long)M * N)
		return;
	int m = (int)(o / N), n = (int)(o % N);
	size_t rb = (size_t)(K + 3) / 4 * 4, G = (size_t)((K + group - 1) / group);
	float s = 0;
	for (int k = lane; k < K; k += 32) {
		float wv = (float)((int)C[(size_t)n * rb + k] - 128) * w8_scale_any(S, sdt, (size_t)n * G + k / group);
		s = fmaf(wv, act_ld(X, (size_t)m * ldx + k), s);
	}
	s = sfwc_warp_sum(s);
	if (lane == 0) {
		if (sizeof(TO) == 4)
			((float *)Y)[(size_t)m * ldy + n] = act_round<A>(alpha * s);
		else
			act_st((A *)Y, (size_t)m * ldy + n, alpha * s);
	}
}

/* Rows [r0, r0 + nr) dequantized to bf16 Wd[nr, K]: (b - 128) · scale in
 * float32, rounded once. The vector form (K and the group multiples of 16,
 * aligned): thread x of the grid's x extent takes the 16 codes x of rows
 * blockIdx.y, blockIdx.y + gridDim.y, ... (no division per vector; as fast
 * as the grid-stride form with a 64-bit division per 16 codes it replaced,
 * bench/RESULTS.md); gshift as the GEMV's (log2(group / 16), or -1). */
static __global__ void dequant_w8_vec_kernel(uint16_t *Wd, const uint8_t *C, const void *S, enum sfw_dtype sdt,
					     int group, int gshift, int r0, int nr, int K)
{
	sfwc_pdl_wait(); /* Wd may still be read by the kernel before (the last slab's GEMM) */
	int per = K / 16, v = blockIdx.x * blockDim.x + threadIdx.x;
	if (v >= per)
		return;
	int G = (K + group - 1) / group, gi = gshift >= 0 ? v >> gshift : (v * 16) / group;
	for (int r = blockIdx.y; r < nr; r += gridDim.y) {
		size_t row = (size_t)r0 + r;
		uint4 c = __ldg((const uint4 *)(C + row * (size_t)K) + v);
		float sc = w8_scale_any(S, sdt, row * G + gi), q[16];
		w8_unpack16(c, q);
		uint4 *o = (uint4 *)(Wd + (size_t)r * K) + 2 * v;
		o[0] = make_uint4(sfwc_pack2(q[0] * sc, q[1] * sc), sfwc_pack2(q[2] * sc, q[3] * sc),
				  sfwc_pack2(q[4] * sc, q[5] * sc), sfwc_pack2(q[6] * sc, q[7] * sc));
		o[1] = make_uint4(sfwc_pack2(q[8] * sc, q[9] * sc), sfwc_pack2(q[10] * sc, q[11] * sc),
				  sfwc_pack2(q[12] * sc, q[13] * sc), sfwc_pack2(q[14] * sc, q[15] * sc));
	}
}

/* The scalar form: any K, group and alignment. */
static __global__ void dequant_w8_kernel(uint16_t *Wd, const uint8_t *C, const void *S, enum sfw_dtype sdt,
					 int group, int r0, int nr, int K)
{
	sfwc_pdl_wait();
	size_t rb = (size_t)(K + 3) / 4 * 4, G = (size_t)((K + group - 1) / group);
	size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t n = (size_t)nr * K;
	for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += stride) {
		size_t r = t / K, k = t % K, row = (size_t)r0 + r;
		float v = (float)((int)C[row * rb + k] - 128) * w8_scale_any(S, sdt, row * G + k / group);
		Wd[t] = sfwc_tobf(v);
	}
}

static __global__ void round_bf16_rows(float *y, int M, int N, int ldy)
{
	sfwc_pdl_wait();
	size_t n = (size_t)M * N;
	for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
		size_t i = (t / N) * ldy + t % N;
		y[i] = sfwc_rbf(y[i]);
	}
}

/* ---- launch ---- */

static int w8_group(int group, int K)
{
	return group <= 0 || group > K ? K : group;
}

static bool w8_vec_ok(const void *X, int ldx, const uint8_t *C, int group, int M, int K)
{
	return K % 16 == 0 && group % 16 == 0 && ((uintptr_t)C & 15) == 0 && ((uintptr_t)X & 15) == 0 &&
	       (M == 1 || ldx % 8 == 0);
}

static int w8_gshift(int group)
{
	int g = group / 16, s = 0;
	if (g & (g - 1))
		return -1;
	while ((1 << s) < g)
		s++;
	return s;
}

template <int R, int U, int M, int SDT, typename TO, bool PIPE = false, int KS = 1>
static void launch_w8(const uint16_t *X, int ldx, const uint8_t *C, const void *S, int group, TO *Y, int ldy, int N,
		      int K, float alpha, cudaStream_t s)
{
	int rowsets = (N + R - 1) / R, per = W8_BW(KS) / KS; /* R-row sets, and per block */
	int blocks = (rowsets + per - 1) / per;
	int G = (K + group - 1) / group;
	sfwc_launch(gemv_w8_kernel<R, U, M, SDT, TO, PIPE, KS>, dim3(blocks), dim3(W8_BW(KS) * 32), 0, s, X, ldx, C, S,
		    G, group, w8_gshift(group), Y, ldy, N, K, alpha);
	SFW_CUDA_LAUNCHED();
}

template <int R, int SDT, typename TO>
static void launch_w8_m(const uint16_t *X, int ldx, const uint8_t *C, const void *S, int group, TO *Y, int ldy, int M,
			int N, int K, float alpha, cudaStream_t s)
{
	switch (M) {
	case 1: launch_w8<R, 4, 1, SDT>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); break;
	case 2: launch_w8<R, 4, 2, SDT>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); break;
	case 3: launch_w8<R, 4, 3, SDT>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); break;
	case 4: launch_w8<R, 4, 4, SDT>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); break;
	default: /* 5..8 rows: two passes of at most 4 */
		launch_w8<R, 4, 4, SDT>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s);
		launch_w8_m<R, SDT>(X + (size_t)4 * ldx, ldx, C, S, group, Y + (size_t)4 * ldy, ldy, M - 4, N, K, alpha,
				    s);
		break;
	}
}

/* The decode variant (M = 1, BF16 scales). The W8 GEMV table of
 * bench/RESULTS.md (H200, back-to-back launches) has the wide matrices
 * fastest with many warps and short batches (gate|up 32768 rows, R1U2: 0.88
 * of the copy limit; q|k|v|z 16384 rows: 0.80) and the narrow ones far below
 * (o_proj 4096 rows: 0.47 at best), since the int8 kernel does ~3x the
 * arithmetic per byte of the bf16 one and 4096 warps leave too little in
 * flight. So: 2 loads per lane, and rows split over KS warps (split K) until
 * N·KS ≥ 16384 warps, as many as q|k|v|z has, while each warp keeps at least
 * one full batch (o_proj and down_proj KS 4, q|k|v|o_gate KS 2). The
 * tuning variants stay reachable through sfw_cuda_gemv_w8_variant. */
static void w8_default_variant(int N, int K, int *R, int *U)
{
	int ks = 1, nv = K / 16;
	while (ks < 8 && (long)N * ks < 16384 && nv >= 32 * 2 * ks * 2)
		ks *= 2;
	*R = ks > 1 ? 200 + ks : 1, *U = 2;
}

/* The tensor-core decode row (variant 301): 16-row blocks, groups of whole
 * 64-code slices; 0 where the shape does not fit it. */
template <int U, bool SILU = false>
static int launch_w8_tc(const uint16_t *X, int ldx, int M, const uint8_t *C, const void *S, enum sfw_dtype sdt,
			int group, uint16_t *Y, int ldy, int N, int K, float alpha, cudaStream_t s)
{
	if (M < 1 || M > 8 || (SILU && M != 1) || N % 16 != 0 || K % 64 != 0 || group % 64 != 0 ||
	    ((uintptr_t)C & 15) || ((uintptr_t)X & 15) || (M > 1 && ldx % 8 != 0))
		return 0;
	int G = (K + group - 1) / group, spg = group / 64; /* (a last group may be partial) */
	dim3 grid((unsigned)(N / 16)), block(W8T_KS * 32);
	if (sdt == SFW_DTYPE_F32)
		sfwc_launch(gemv_w8_tc_kernel<U, SDT_F32, SILU>, grid, block, 0, s, X, ldx, M, C, S, G, spg, Y, ldy, N, K,
			    alpha);
	else if (sdt == SFW_DTYPE_F16)
		sfwc_launch(gemv_w8_tc_kernel<U, SDT_F16, SILU>, grid, block, 0, s, X, ldx, M, C, S, G, spg, Y, ldy, N, K,
			    alpha);
	else
		sfwc_launch(gemv_w8_tc_kernel<U, SDT_BF16, SILU>, grid, block, 0, s, X, ldx, M, C, S, G, spg, Y, ldy, N, K,
			    alpha);
	SFW_CUDA_LAUNCHED();
	return 1;
}

template <typename TO>
static void gemv_w8_any(const uint16_t *X, int ldx, const uint8_t *C, const void *S, enum sfw_dtype sdt, int group,
			TO *Y, int ldy, int M, int N, int K, int R, int U, float alpha, cudaStream_t s)
{
	SFW_ASSERT(M >= 1 && M <= SFW_CUDA_GEMV_MAX_M && N >= 1 && K >= 1);
	group = w8_group(group, K);
	if (!w8_vec_ok(X, ldx, C, group, M, K)) {
		long outs = (long)M * N;
		sfwc_launch(gemv_w8_scalar_kernel<uint16_t, TO>, dim3((unsigned)((outs + 7) / 8)), dim3(256), 0, s, X, ldx,
			    C, S, sdt, group, Y, ldy, M, N, K, alpha);
		SFW_CUDA_LAUNCHED();
		return;
	}
	/* 301: the tensor-core decode rows (M <= 8, any scale type; K % 64 == 0
	 * and whole-slice groups, else the default below) */
	if (R == 301 && sizeof(TO) == 2 &&
	    (U == 2 ? launch_w8_tc<2>(X, ldx, M, C, S, sdt, group, (uint16_t *)Y, ldy, N, K, alpha, s)
		    : launch_w8_tc<4>(X, ldx, M, C, S, sdt, group, (uint16_t *)Y, ldy, N, K, alpha, s)))
		return;
	if (R == 301)
		R = 0, U = 0;
	if (R == 0 && U == 0 && M == 1 && sdt == SFW_DTYPE_BF16 && sizeof(TO) == 2)
		w8_default_variant(N, K, &R, &U);
	if (R == 0) /* M > 1 or other scales: two rows per warp on wide matrices */
		R = N >= 8192 ? 2 : 1;
	if (U == 0)
		U = 4;
	if (M == 1 && sdt == SFW_DTYPE_BF16 && sizeof(TO) == 2) { /* the tuning variants (R4U4 .. R1U2) */
		switch ((R >= 200 ? 200 : R >= 100 ? 100 : 0) + (R % 100) * 10 + U) {
		case 12: launch_w8<1, 2, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 18: launch_w8<1, 8, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 22: launch_w8<2, 2, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 28: launch_w8<2, 8, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 42: launch_w8<4, 2, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 44: launch_w8<4, 4, 1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		/* 1RU: the next batch loaded while the current one is consumed */
		case 112: launch_w8<1, 2, 1, SDT_BF16, TO, true>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 114: launch_w8<1, 4, 1, SDT_BF16, TO, true>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 122: launch_w8<2, 2, 1, SDT_BF16, TO, true>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		/* 2KU: one row over KS warps (split K) */
		case 222: launch_w8<1, 2, 1, SDT_BF16, TO, false, 2>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 224: launch_w8<1, 4, 1, SDT_BF16, TO, false, 2>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 242: launch_w8<1, 2, 1, SDT_BF16, TO, false, 4>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 244: launch_w8<1, 4, 1, SDT_BF16, TO, false, 4>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 282: launch_w8<1, 2, 1, SDT_BF16, TO, false, 8>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		case 284: launch_w8<1, 4, 1, SDT_BF16, TO, false, 8>(X, ldx, C, S, group, Y, ldy, N, K, alpha, s); return;
		default: break;
		}
	}
	int r2 = R % 100 >= 2;
	switch (sdt) {
	case SFW_DTYPE_F32:
		r2 ? launch_w8_m<2, SDT_F32>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s)
		   : launch_w8_m<1, SDT_F32>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s);
		break;
	case SFW_DTYPE_F16:
		r2 ? launch_w8_m<2, SDT_F16>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s)
		   : launch_w8_m<1, SDT_F16>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s);
		break;
	default:
		r2 ? launch_w8_m<2, SDT_BF16>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s)
		   : launch_w8_m<1, SDT_BF16>(X, ldx, C, S, group, Y, ldy, M, N, K, alpha, s);
		break;
	}
}

extern "C" void sfw_cuda_dequant_w8(uint16_t *Wd, const struct sfw_w8 *w, int r0, int nr, int K, void *stream)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	if (nr <= 0)
		return;
	int group = w8_group(w->group, K);
	int vec = K % 16 == 0 && group % 16 == 0 && ((uintptr_t)codes & 15) == 0 && ((uintptr_t)Wd & 15) == 0;
	if (vec) {
		/* 128 vectors per block along a row; rows over y (at most 65535
		 * a launch: the kernel strides over the rest) */
		unsigned bx = (unsigned)((K / 16 + 127) / 128), by = (unsigned)(nr < 65535 ? nr : 65535);
		sfwc_launch(dequant_w8_vec_kernel, dim3(bx, by), dim3(128), 0, SFW_CUDA_STREAM(stream), Wd, codes,
			    scales, sdt, group, w8_gshift(group), r0, nr, K);
	} else {
		unsigned blocks = sfwc_blocks((size_t)nr * K, 256);
		if (blocks > 132 * 16)
			blocks = 132 * 16;
		sfwc_launch(dequant_w8_kernel, dim3(blocks), dim3(256), 0, SFW_CUDA_STREAM(stream), Wd, codes, scales,
			    sdt, group, r0, nr, K);
	}
	SFW_CUDA_LAUNCHED();
}

extern "C" size_t sfw_cuda_w8_slab_rows(int N, int K, size_t scratch_bytes)
{
	size_t rows = scratch_bytes / ((size_t)K * 2) / 64 * 64;
	if (rows < 64)
		rows = 64;
	return rows > (size_t)N ? (size_t)N : rows;
}

/* Slab by slab: dequantize rows [n0, n0 + nb) into the scratch, then one
 * cuBLASLt GEMM writes Y's columns [n0, n0 + nb). */
static void gemm_w8_any(struct sfw_cuda_blas *b, const uint16_t *X, int ldx, const uint8_t *C, const void *S,
			enum sfw_dtype sdt, int group, void *Y, int ldy, int M, int N, int K, int out_f32,
			float alpha, void *scratch, size_t scratch_bytes, void *stream)
{
	int rows = (int)sfw_cuda_w8_slab_rows(N, K, scratch_bytes);
	SFW_ASSERT((size_t)rows * K * 2 <= scratch_bytes); /* planned: K ≤ scratch / 128 */
	struct sfw_w8 w = {C, S, sdt, group};
	for (int n0 = 0; n0 < N; n0 += rows) {
		int nb = N - n0 < rows ? N - n0 : rows;
		struct sfw_gemm_shape slab = {M, nb, K, ldx, ldy};
		sfw_cuda_dequant_w8((uint16_t *)scratch, &w, n0, nb, K, stream);
		if (out_f32)
			sfw_cuda_linear_f32out(b, X, (const uint16_t *)scratch, (float *)Y + n0, &slab, alpha,
					       stream);
		else
			sfw_cuda_gemm(b, X, (const uint16_t *)scratch, (uint16_t *)Y + n0, &slab, stream);
	}
	if (out_f32) {
		size_t n = (size_t)M * N;
		unsigned blocks = sfwc_blocks(n, 256);
		sfwc_launch(round_bf16_rows, dim3(blocks > 65535 ? 65535 : blocks), dim3(256), 0, SFW_CUDA_STREAM(stream),
			    (float *)Y, M, N, ldy);
		SFW_CUDA_LAUNCHED();
	}
}

extern "C" void sfw_cuda_gemv_w8_variant(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
					 const struct sfw_gemm_shape *sh, int rows_per_warp, int unroll,
					 void *stream)
{
	gemv_w8_any(X, sfw_gemm_ldx(sh), w->codes, w->scales, w->sdt, w->group, Y, sfw_gemm_ldy(sh), sh->M,
		    sh->N, sh->K, rows_per_warp, unroll, 1.0f, SFW_CUDA_STREAM(stream));
}

extern "C" int sfw_op_matmul_silu_w8_cuda(void *y, const void *x, const struct sfw_w8 *w, int N, int K,
					  struct sfw_cuda_ctx *cx)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	int group = w8_group(w->group, K);
	if (N <= 0 || sdt != SFW_DTYPE_BF16 || !w8_vec_ok(x, K, codes, group, 1, K))
		return 0;
	/* SALAFW_CUDA_W8GEMV=tc: the tensor-core form (two slices in flight:
	 * its two tiles' codes), where the shape fits it */
	if (cx->w8gemv == 2 && launch_w8_tc<2, true>((const uint16_t *)x, K, 1, codes, scales, sdt, group, (uint16_t *)y,
						       N, N, K, 1.0f, SFW_CUDA_STREAM(cx->stream)))
		return 1;
	int blocks = (N + W8_WARPS - 1) / W8_WARPS;
	/* U2: the unroll of the plain decode GEMV on gate|up (w8_default_variant) */
	sfwc_launch(gemv_w8_kernel<2, 2, 1, SDT_BF16, uint16_t, false, 1, true>, dim3(blocks), dim3(W8_WARPS * 32), 0,
		    SFW_CUDA_STREAM(cx->stream), (const uint16_t *)x, K, codes, scales, (K + group - 1) / group, group,
		    w8_gshift(group), (uint16_t *)y, N, N, K, 1.0f);
	SFW_CUDA_LAUNCHED();
	return 1;
}

extern "C" void sfw_cuda_gemm_w8(struct sfw_cuda_blas *b, const uint16_t *X, const struct sfw_w8 *w,
				 uint16_t *Y, const struct sfw_gemm_shape *sh, void *scratch,
				 size_t scratch_bytes, void *stream)
{
	gemm_w8_any(b, X, sfw_gemm_ldx(sh), w->codes, w->scales, w->sdt, w->group, Y, sfw_gemm_ldy(sh), sh->M,
		    sh->N, sh->K, 0, 1.0f, scratch, scratch_bytes, stream);
}

/* The scratch the op twins dequantize into: SFW_CUDA_W8_SLAB_BYTES of the
 * bound op scratch (reused in stream order), at least 64 rows. */
static void *w8_scratch(struct sfw_cuda_ctx *cx, int K, size_t *bytes)
{
	size_t want = (size_t)64 * K * 2;
	*bytes = want > SFW_CUDA_W8_SLAB_BYTES ? want : SFW_CUDA_W8_SLAB_BYTES;
	return sfwi_cuda_scratch(cx, *bytes);
}

/* Where the tensor-core GEMM (linear_w8_mma.cu) beats both the GEMV and
 * dequantize + cuBLASLt on an H200 (bench/RESULTS.md, bench_w8gemm --sweep):
 * 3 to 64 rows on every shape of the model (4096 x 4096 at 64 rows: 24.5
 * µs against the dequantize path's ~26.5); the GEMV below 3 rows, the
 * dequantize path above. */
static int w8mma_rows(int M)
{
	return M >= 3 && M <= 64;
}

extern "C" int sfw_op_swiglu_w8_cuda(void *y, const void *x, const struct sfw_w8 *w,
				     const struct sfw_gemm_shape *sh, struct sfw_cuda_ctx *cx)
{
	int M = sh->M, N = sh->N, K = sh->K;
	if (!w8mma_rows(M))
		return 0;
	struct sfw_gemm_shape dense = {M, N, K, K, N};
	return sfw_cuda_gemm_w8_mma((const uint16_t *)x, w, (uint16_t *)y, &dense, 1, cx->w8ws,
				    SFW_CUDA_W8WS_BYTES, cx->stream, cx->sms);
}

extern "C" void sfw_op_matmul_w8_cuda(void *y, const void *x, const struct sfw_w8 *w,
				      const struct sfw_gemm_shape *sh, enum sfw_dtype act,
				      struct sfw_cuda_ctx *cx)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	int group = w->group, M = sh->M, N = sh->N, K = sh->K;
	if (M <= 0 || N <= 0)
		return;
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	struct sfw_gemm_shape dense = {M, N, K, K, N};
	/* SALAFW_CUDA_W8GEMV=tc: up to 8 rows on the tensor-core GEMV, where the shape fits it */
	if (act == SFW_DTYPE_BF16 && cx->w8gemv == 2 && M <= 8 &&
	    launch_w8_tc<4>((const uint16_t *)x, K, M, codes, scales, sdt, w8_group(group, K), (uint16_t *)y, N, N, K,
			    1.0f, s))
		return;
	if (act == SFW_DTYPE_BF16 && w8mma_rows(M) &&
	    sfw_cuda_gemm_w8_mma((const uint16_t *)x, w, (uint16_t *)y, &dense, 0, cx->w8ws,
				 SFW_CUDA_W8WS_BYTES, cx->stream, cx->sms))
		return;
	if (act == SFW_DTYPE_BF16 && M <= SFW_CUDA_GEMV_MAX_M) {
		gemv_w8_any((const uint16_t *)x, K, codes, scales, sdt, group, (uint16_t *)y, N, M, N, K, 0, 0,
			    1.0f, s);
		return;
	}
	if (act == SFW_DTYPE_BF16) {
		size_t sb;
		void *scr = w8_scratch(cx, K, &sb);
		gemm_w8_any(cx->blas, (const uint16_t *)x, K, codes, scales, sdt, group, y, N, M, N, K, 0, 1.0f, scr,
			    sb, cx->stream);
		return;
	}
	long outs = (long)M * N;
	sfwc_launch(gemv_w8_scalar_kernel<float, float>, dim3((unsigned)((outs + 7) / 8)), dim3(256), 0, s,
		    (const float *)x, K, codes, scales, sdt, w8_group(group, K), (float *)y, N, M, N, K, 1.0f);
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_op_logits_w8_cuda(float *y, const void *x, const struct sfw_w8 *w,
				      const struct sfw_gemm_shape *sh, float in_scale, enum sfw_dtype act,
				      struct sfw_cuda_ctx *cx)
{
	const uint8_t *codes = w->codes;
	const void *scales = w->scales;
	enum sfw_dtype sdt = w->sdt;
	int group = w->group, M = sh->M, N = sh->N, K = sh->K;
	if (M <= 0 || N <= 0)
		return;
	SFW_ASSERT(act == SFW_DTYPE_BF16); /* the engine's activations; float twins use the CPU */
	if (M <= SFW_CUDA_GEMV_MAX_M) {
		gemv_w8_any((const uint16_t *)x, K, codes, scales, sdt, group, y, N, M, N, K, 0, 0, in_scale,
			    SFW_CUDA_STREAM(cx->stream));
		return;
	}
	size_t sb;
	void *scr = w8_scratch(cx, K, &sb);
	gemm_w8_any(cx->blas, (const uint16_t *)x, K, codes, scales, sdt, group, y, N, M, N, K, 1, in_scale, scr,
		    sb, cx->stream);
}
