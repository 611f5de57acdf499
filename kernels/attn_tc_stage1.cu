/* attn_tc_stage1.cu - tensor-core stage-1 scoring of InfLLM-v2 block
 * selection for prefill (the meaning of sfw_op_stage1, kernels/infllm.c):
 *   LSE_h = log sum_{j2 visible} exp(scale q_h.c2[j2])
 *   s[g, r, j] = sum_{h in g} exp(scale q_h.c1[j] - LSE_h) for visible j, else 0.
 * Fragment layouts: kernels/attn_tc.cuh.
 *
 * One warp owns one query token and the G heads of one KV group (an M = 16
 * tile, rows >= G masked); a CTA holds S1T_W consecutive tokens of one group,
 * which read the same compressed keys, so each 64-chunk tile is loaded once
 * per CTA (cp.async, two stages). The CTA first walks the level-2 tiles (an
 * online max / sum of exp per head: the LSE), then the level-1 tiles: per
 * element exp2(x - LSE_h) (log2 domain), summed over the 16 rows of the tile
 * (the heads) with shuffles, NaN -> 0, rounded to bf16 as the CUDA-core
 * kernel, and written as 64 consecutive floats per warp. Columns past the
 * CTA's tiles up to n1 are written as zeros (the CPU twin's memset). */
#include "attn_tc.cuh"

#define S1T_TILE 64 /* compressed keys per tile */
#define S1T_W 8	    /* warps = query tokens per CTA */

struct s1tc_args {
	float *scores;
	const uint16_t *q, *c1, *c2;
	int64_t n1, n2, pos0;
	int T, nh, nkv, ksize, stride;
	float scale_log2; /* scale * log2(e) */
};

static __device__ __forceinline__ int64_t s1t_visible(int64_t p, int64_t n, int ksize, int stride)
{
	if (p < ksize - 1)
		return 0;
	int64_t v = (p - (ksize - 1)) / stride + 1;
	return v < n ? v : n;
}

template <int HD> static __global__ void __launch_bounds__(S1T_W * 32, 2) stage1_tc_kernel(s1tc_args a)
{
	sfwc_pdl_wait();
	constexpr int LD = HD + 8, CH = HD / 8; /* padded rows: conflict-free ldmatrix */
	__shared__ __align__(16) uint16_t tile[2][S1T_TILE * LD];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
	const int g = blockIdx.y, G = a.nh / a.nkv;
	const int r0 = blockIdx.x * S1T_W, r = r0 + w;
	const bool active = r < a.T;
	const int64_t p = a.pos0 + r, pmax = a.pos0 + min(a.T - 1, r0 + S1T_W - 1);
	const int64_t v1 = active ? s1t_visible(p, a.n1, a.ksize, a.stride) : 0;
	const int64_t v2 = active ? s1t_visible(p, a.n2, 4 * a.ksize, 4 * a.stride) : 0;
	/* visibility grows with p: the CTA's last token sees the most */
	const int64_t v1max = s1t_visible(pmax, a.n1, a.ksize, a.stride);
	const int64_t v2max = s1t_visible(pmax, a.n2, 4 * a.ksize, 4 * a.stride);
	const int nA = (int)((v2max + S1T_TILE - 1) / S1T_TILE),
		  nB = (int)((v1max + S1T_TILE - 1) / S1T_TILE);

	/* tile i: level-2 tile i for i < nA, else level-1 tile i - nA */
	auto load = [&](int i, int st) {
		const uint16_t *src = i < nA ? a.c2 : a.c1;
		int64_t j0 = (int64_t)(i < nA ? i : i - nA) * S1T_TILE, lim = i < nA ? v2max : v1max;
		for (int e = threadIdx.x; e < S1T_TILE * CH; e += S1T_W * 32) {
			int row = e / CH, ch = e % CH;
			int64_t j = j0 + row;
			bool ok = j < lim;
			tc_cp16(&tile[st][row * LD + ch * 8],
				src + (ok ? ((size_t)j * a.nkv + g) * HD + ch * 8 : 0), ok ? 16 : 0);
		}
		tc_cp_commit();
	};

	uint32_t qa[HD / 16][4];
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int row = gid + (i & 1) * 8, col = kk * 16 + tq * 2 + (i >> 1) * 8;
			qa[kk][i] =
			    active && row < G
				? *(const uint32_t *)(a.q + ((size_t)r * a.nh + (size_t)g * G + row) * HD +
						      col)
				: 0u;
		}
	/* rows gid and gid + 8: running max / per-lane partial sum (log2 domain) */
	float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
	float lse_lo = -INFINITY, lse_hi = -INFINITY;
	float *out = a.scores + ((size_t)g * a.T + r) * (size_t)a.n1;

	const int N = nA + nB;
	if (N > 0)
		load(0, 0);
	for (int i = 0, st = 0; i < N; i++, st ^= 1) {
		if (i + 1 < N) {
			load(i + 1, st ^ 1);
			tc_cp_wait<1>();
		} else {
			tc_cp_wait<0>();
		}
		__syncthreads();
		float s[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
			s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
		if (active) {
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
				for (int np = 0; np < 4; np++) {
					uint32_t bf[4];
					tc_ldsm_x4(bf,
						   &tile[st][(np * 16 + (lane & 7) + (lane >> 4) * 8) * LD +
							     kk * 16 + ((lane >> 3) & 1) * 8]);
					tc_mma(s[2 * np], qa[kk], bf[0], bf[1]);
					tc_mma(s[2 * np + 1], qa[kk], bf[2], bf[3]);
				}
		}
		if (active && i < nA) {
			/* level 2: online log-sum-exp per head over the visible chunks */
			int64_t j0 = (int64_t)i * S1T_TILE;
			float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
			for (int j = 0; j < 8; j++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					bool vis = j0 + j * 8 + 2 * tq + e < v2;
					float x0 = vis ? s[j][e] * a.scale_log2 : -INFINITY;
					float x1 = vis ? s[j][2 + e] * a.scale_log2 : -INFINITY;
					s[j][e] = x0, s[j][2 + e] = x1;
					mx_lo = fmaxf(mx_lo, x0), mx_hi = fmaxf(mx_hi, x1);
				}
			float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
			float mu_lo = mn_lo == -INFINITY ? 0.0f : mn_lo,
			      mu_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
			l_lo *= exp2f(m_lo - mu_lo), l_hi *= exp2f(m_hi - mu_hi);
			m_lo = mn_lo, m_hi = mn_hi;
#pragma unroll
			for (int j = 0; j < 8; j++)
				l_lo += exp2f(s[j][0] - mu_lo) + exp2f(s[j][1] - mu_lo),
				    l_hi += exp2f(s[j][2] - mu_hi) + exp2f(s[j][3] - mu_hi);
		} else if (i >= nA) {
			if (i == nA) {
				/* LSE of each row from the 4 lanes of its quad (lane-local maxima differ) */
				float M_lo = fmaxf(m_lo, __shfl_xor_sync(0xffffffffu, m_lo, 1));
				M_lo = fmaxf(M_lo, __shfl_xor_sync(0xffffffffu, M_lo, 2));
				float M_hi = fmaxf(m_hi, __shfl_xor_sync(0xffffffffu, m_hi, 1));
				M_hi = fmaxf(M_hi, __shfl_xor_sync(0xffffffffu, M_hi, 2));
				float L_lo = M_lo == -INFINITY ? 0.0f : l_lo * exp2f(m_lo - M_lo);
				float L_hi = M_hi == -INFINITY ? 0.0f : l_hi * exp2f(m_hi - M_hi);
				L_lo += __shfl_xor_sync(0xffffffffu, L_lo, 1);
				L_lo += __shfl_xor_sync(0xffffffffu, L_lo, 2);
				L_hi += __shfl_xor_sync(0xffffffffu, L_hi, 1);
				L_hi += __shfl_xor_sync(0xffffffffu, L_hi, 2);
				lse_lo = M_lo == -INFINITY ? -INFINITY : M_lo + log2f(L_lo);
				lse_hi = M_hi == -INFINITY ? -INFINITY : M_hi + log2f(L_hi);
			}
			/* level 1: column sums over the heads of exp2(x - LSE) */
			int64_t j0 = (int64_t)(i - nA) * S1T_TILE;
			float cs[8][2];
#pragma unroll
			for (int j = 0; j < 8; j++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					bool vis = j0 + j * 8 + 2 * tq + e < v1;
					float lo =
					    vis && gid < G ? exp2f(s[j][e] * a.scale_log2 - lse_lo) : 0.0f;
					float hi = vis && gid + 8 < G
						       ? exp2f(s[j][2 + e] * a.scale_log2 - lse_hi)
						       : 0.0f;
					float v = lo + hi;
					v += __shfl_xor_sync(0xffffffffu, v, 4);
					v += __shfl_xor_sync(0xffffffffu, v, 8);
					v += __shfl_xor_sync(0xffffffffu, v, 16);
					cs[j][e] = v; /* every lane: columns 8j + 2tq + e */
				}
			if (active) {
				/* lane (gid, tq) writes n-tile gid: 64 consecutive floats per warp */
#pragma unroll
				for (int j = 0; j < 8; j++)
					if (j == gid)
#pragma unroll
						for (int e = 0; e < 2; e++) {
							int64_t col = j0 + j * 8 + 2 * tq + e;
							float v = cs[j][e];
							if (isnan(v))
								v = 0.0f;
							if (col < a.n1)
								out[col] = sfwc_rbf(v);
						}
			}
		}
		__syncthreads(); /* stage st is free for the load two steps on */
	}
	if (active)
		for (int64_t col = (int64_t)nB * S1T_TILE + lane; col < a.n1; col += 32)
			out[col] = 0.0f;
}

int sfwi_stage1_tc(float *scores, const void *q, const void *c1, int64_t n1, const void *c2, int64_t n2,
		   int T, int nh, int nkv, int hd, int64_t pos0, int ksize, int stride, float scale,
		   enum sfw_dtype act, void *stream)
{
	enum tc_mode mode = tc_mode_of(sfwi_cuda_cfg_stage1());
	if (mode == TC_SIMT || act != SFW_DTYPE_BF16 || T <= 0 || n1 <= 0 || nkv <= 0 || nh % nkv != 0 ||
	    nh / nkv > 16)
		return 0;
	if (hd != 32 && hd != 64 && hd != 128)
		return 0;
	/* tile counts are int */
	if (n1 / S1T_TILE >= (int64_t)1 << 30 || n2 / S1T_TILE >= (int64_t)1 << 30)
		return 0;
	/* auto: prefill-sized calls; one decode row is better served by the
	 * CUDA-core kernel's split over the level-2 keys */
	if (mode == TC_AUTO && T < 64)
		return 0;
	s1tc_args a = {scores,
		       (const uint16_t *)q,
		       (const uint16_t *)c1,
		       (const uint16_t *)c2,
		       n1,
		       n2 > 0 ? n2 : 0,
		       pos0,
		       T,
		       nh,
		       nkv,
		       ksize,
		       stride,
		       scale * 1.4426950408889634f};
	cudaStream_t s = SFW_CUDA_STREAM(stream);
	dim3 grid((unsigned)((T + S1T_W - 1) / S1T_W), (unsigned)nkv);
	switch (hd) {
	case 32:
		sfwc_launch(stage1_tc_kernel<32>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	case 64:
		sfwc_launch(stage1_tc_kernel<64>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	default:
		sfwc_launch(stage1_tc_kernel<128>, grid, dim3(S1T_W * 32), 0, s, a);
		break;
	}
	SFW_CUDA_LAUNCHED();
	return 1;
}
