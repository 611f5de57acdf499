/* attn_tc_stage1_dec.cu - stage 1 of InfLLM-v2 block selection on tensor
 * cores for decode rows (T <= S1D_MAXT; the meaning of sfw_op_stage1,
 * kernels/infllm.c, as kernels/attn_tc_stage1.cu's prefill kernel):
 *   LSE_h = log sum_{j2 visible} exp(scale q_h.c2[j2])
 *   s[g, r, j] = sum_{h in g} exp(scale q_h.c1[j] - LSE_h) for visible j, else 0.
 * Fragment layouts: kernels/attn_tc.cuh. sfwi_stage1_tc (attn_tc_stage1.cu)
 * hands its decode rows here. */
#include "attn_tc.cuh"

/* The work split over the keys.
 *
 * One decode row has one m16 tile per KV group (its G heads), so the
 * prefill kernel (attn_tc_stage1.cu) would run on two warps. Here the keys are spread over
 * many warps instead, in two launches as the CUDA-core kernels of
 * kernels/infllm.cu do: pass A, per split of the level-2 keys, the running
 * max and sum of exp2 per head (log2 domain); pass B merges the splits into
 * LSE_h once per CTA and writes the level-1 scores, 32 keys per warp and
 * step. Both launch about two CTAs per SM: pass A's splits are at least one
 * CTA step of keys, and pass B's CTAs stride over the keys, so a 1M-token
 * row (65,536 level-1 keys) keeps every SM busy with a few steps per warp,
 * each step's loads issued before the step before is computed.
 *
 * No shared memory between lanes (S1D_STAGES below stages each lane's own
 * loads): the dot products sum over the head dimension, so any fixed
 * permutation of it may be used for both operands. Lane (gid,
 * tq) loads 16 contiguous bytes of key row gid (dims 32c + 8tq .. +7) and of
 * its two query rows; of these the .x/.y words are the b[0]/b[1] (a[0]/a[2])
 * of k-step 2c and the .z/.w words those of k-step 2c + 1. A quad thus reads
 * 64 contiguous bytes of a row per load, a warp 8 rows. */
#define S1D_W 4	       /* warps per CTA */
#define S1D_KEYS 32    /* keys per warp and step: 4 n-tiles */
#define S1D_MAXSPLIT 128 /* pass A's CTAs per (row, group) */
/* Pass B's key loads (-D, for gpu-run.sh variants). 0: the next step's keys
 * in registers (one step ahead). 2 or 3: through shared memory, each lane
 * copying (cp.async) and reading back only its own 16-byte pieces, in a
 * ring of S1D_STAGES steps, so its loads run S1D_STAGES - 1 steps ahead
 * without a barrier and without the second set of registers. At head size
 * 128 and 3 stages a CTA holds 96 KiB: the two CTAs an SM the grid asks. */
#ifndef S1D_STAGES
#define S1D_STAGES 0
#endif
static_assert(S1D_STAGES == 0 || S1D_STAGES == 2 || S1D_STAGES == 3, "S1D_STAGES: 0, 2 or 3");
/* S1D_EARLY=1 (-D, with the ring): what the passes read of kernels before
 * pass A (the positions, the query, pass B's level-1 keys, which compress,
 * the kernel before pass A, wrote) is read before the programmatic-launch
 * wait, so it overlaps the kernel before: pass A prefetches its first keys
 * into L2 (compress may still write the newest), pass B copies its first
 * S1D_STAGES - 1 steps of keys. Such reads bypass L1 (.cg), where a line an
 * earlier kernel read could be stale. */
#ifndef S1D_EARLY
#define S1D_EARLY 0
#endif
static_assert(!S1D_EARLY || S1D_STAGES > 0, "S1D_EARLY needs S1D_STAGES");

struct s1d_args {
	float *scores, *part; /* part: [T*nkv][nsplit][G] of (max, sum), log2 domain */
	const uint16_t *q, *c1, *c2;
	int64_t n1, n2, pos0; /* from sp when the kernel runs */
	int T, nh, nkv, ksize, stride, nsplit;
	float scale_log2;
	sfwc_selpos sp;
	void *const *pc1, *const *pc2; /* non-NULL: c1 = *pc1, c2 = *pc2 (struct sfw_cuda_rowref) */
	const int32_t *tab;	       /* paged compressed keys (sfw_ckey_row), or NULL */
	const int32_t *const *ptab;    /* non-NULL: tab = *ptab */
	int shift;
};

/* The A fragments of query row r, group g (rows >= G zero), in the permuted
 * order described above. */
template <int HD>
static __device__ __forceinline__ void s1d_qfrag(uint32_t qa[HD / 16][4], const s1d_args &a, int r, int g, int G)
{
	const int lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
	const uint16_t *q0 = a.q + ((size_t)r * a.nh + (size_t)g * G) * HD;
#pragma unroll
	for (int c = 0; c < HD / 32; c++) {
		uint4 lo = make_uint4(0, 0, 0, 0), hi = make_uint4(0, 0, 0, 0);
#if S1D_EARLY
		if (gid < G)
			lo = __ldcg((const uint4 *)(q0 + (size_t)gid * HD + 32 * c + 8 * tq));
		if (gid + 8 < G)
			hi = __ldcg((const uint4 *)(q0 + (size_t)(gid + 8) * HD + 32 * c + 8 * tq));
#else
		if (gid < G)
			lo = *(const uint4 *)(q0 + (size_t)gid * HD + 32 * c + 8 * tq);
		if (gid + 8 < G)
			hi = *(const uint4 *)(q0 + (size_t)(gid + 8) * HD + 32 * c + 8 * tq);
#endif
		qa[2 * c][0] = lo.x, qa[2 * c][1] = hi.x, qa[2 * c][2] = lo.y, qa[2 * c][3] = hi.y;
		qa[2 * c + 1][0] = lo.z, qa[2 * c + 1][1] = hi.z, qa[2 * c + 1][2] = lo.w, qa[2 * c + 1][3] = hi.w;
	}
}

/* The 32 keys from j0 of the level's compressed keys (keys >= lim read
 * as zero rows), as B fragments in the permuted order: kv[n][cc] of key
 * j0 + 8n + gid. */
template <int HD>
static __device__ __forceinline__ void s1d_load(uint4 kv[4][HD / 32], const s1d_args &a, int level, int64_t j0,
						int64_t lim, int g)
{
	const int lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
	const uint16_t *c = level == 2 ? a.c2 : a.c1;
#pragma unroll
	for (int n = 0; n < 4; n++) {
		int64_t j = j0 + 8 * n + gid;
		int64_t cr = j < lim ? sfw_ckey_row(a.tab, a.shift, a.ksize, a.stride, level, j) : 0;
		const uint16_t *row = c + ((size_t)cr * a.nkv + g) * HD + 8 * tq;
#pragma unroll
		for (int cc = 0; cc < HD / 32; cc++)
			kv[n][cc] = j < lim ? *(const uint4 *)(row + 32 * cc) : make_uint4(0, 0, 0, 0);
	}
}

/* Shared memory of pass B's ring (S1D_STAGES > 0): [stage][warp][piece][lane]
 * of 16-byte pieces, HD / 8 pieces a lane and step (s1d_load's kv[n][cc]
 * as piece n * HD / 32 + cc). */
template <int HD> static constexpr size_t s1d_ring_bytes(void)
{
	return (size_t)(S1D_STAGES > 0 ? S1D_STAGES : 1) * S1D_W * (HD / 8) * 32 * 16;
}

/* s1d_load's pieces (level 1) copied into this lane's slots of one stage
 * (slot: the stage's piece 0 of this lane; pieces 32 apart), as one
 * cp.async group; keys >= lim are zero-filled. */
template <int HD>
static __device__ __forceinline__ void s1d_stage(uint4 *slot, const s1d_args &a, int64_t j0, int64_t lim, int g)
{
	const int lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
#pragma unroll
	for (int n = 0; n < 4; n++) {
		int64_t j = j0 + 8 * n + gid;
		const bool ok = j < lim;
		int64_t cr = ok ? sfw_ckey_row(a.tab, a.shift, a.ksize, a.stride, 1, j) : 0;
		const uint16_t *row = a.c1 + ((size_t)cr * a.nkv + g) * HD + 8 * tq;
#pragma unroll
		for (int cc = 0; cc < HD / 32; cc++)
			tc_cp16(slot + (n * (HD / 32) + cc) * 32, row + 32 * cc, ok ? 16 : 0);
	}
	tc_cp_commit();
}

/* s[n][.] = the C fragments of q · (the keys s1d_load gave). */
template <int HD>
static __device__ __forceinline__ void s1d_mma(float s[4][4], const uint32_t qa[HD / 16][4], const uint4 kv[4][HD / 32])
{
#pragma unroll
	for (int n = 0; n < 4; n++) {
		s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
		for (int cc = 0; cc < HD / 32; cc++) {
			tc_mma(s[n], qa[2 * cc], kv[n][cc].x, kv[n][cc].y);
			tc_mma(s[n], qa[2 * cc + 1], kv[n][cc].z, kv[n][cc].w);
		}
	}
}

/* s[n][.] = the C fragments of q · c[j0 + 8n + .] for the 32 keys from j0
 * (keys >= lim read as zero rows) of the level's compressed keys. */
template <int HD>
static __device__ __forceinline__ void s1d_scores(float s[4][4], const uint32_t qa[HD / 16][4], const s1d_args &a,
						  int level, int64_t j0, int64_t lim, int g)
{
	uint4 kv[4][HD / 32];
	s1d_load<HD>(kv, a, level, j0, lim, g);
	s1d_mma<HD>(s, qa, kv);
}

/* Pass A: grid (T*nkv, nsplit); this CTA's share of the visible level-2
 * keys, 32 per warp and step, the next step's keys loaded before this
 * step's products. */
template <int HD> static __global__ void __launch_bounds__(S1D_W * 32) stage1_dec_lse_kernel(s1d_args a)
{
#if !S1D_EARLY
	sfwc_pdl_wait();
#endif
	sfwc_s1_resolve(a);
	__shared__ float red[S1D_W][16][2];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
	const int rg = blockIdx.x, r = rg / a.nkv, g = rg % a.nkv, G = a.nh / a.nkv;
	const int64_t v2 = tc_visible(a.pos0 + r, a.n2, 4 * a.ksize, 4 * a.stride);
	const int64_t per = (v2 + a.nsplit - 1) / a.nsplit;
	const int64_t c0 = (int64_t)blockIdx.y * per, c1 = min(v2, c0 + per);
	uint32_t qa[HD / 16][4];
	s1d_qfrag<HD>(qa, a, r, g, G);
	float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
	int64_t j0 = c0 + (int64_t)w * S1D_KEYS;
#if S1D_EARLY
	/* this warp's first keys into L2 (each key row's 128-byte lines, one
	 * lane a line), then the wait for compress */
	if (tq * 64 < HD)
#pragma unroll
		for (int n = 0; n < 4; n++) {
			const int64_t j = j0 + 8 * n + gid;
			if (j < c1) {
				const int64_t cr = sfw_ckey_row(a.tab, a.shift, a.ksize, a.stride, 2, j);
				const uint16_t *row = a.c2 + ((size_t)cr * a.nkv + g) * HD + 64 * tq;
				asm volatile("prefetch.global.L2 [%0];" ::"l"(row));
			}
		}
	sfwc_pdl_wait();
#endif
	uint4 kv[4][HD / 32];
	if (j0 < c1)
		s1d_load<HD>(kv, a, 2, j0, c1, g);
	for (; j0 < c1; j0 += S1D_W * S1D_KEYS) {
		uint4 nx[4][HD / 32];
		if (j0 + S1D_W * S1D_KEYS < c1)
			s1d_load<HD>(nx, a, 2, j0 + S1D_W * S1D_KEYS, c1, g);
		float s[4][4];
		s1d_mma<HD>(s, qa, kv);
		float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				bool vis = j0 + 8 * n + 2 * tq + e < c1;
				float x0 = vis ? s[n][e] * a.scale_log2 : -INFINITY;
				float x1 = vis ? s[n][2 + e] * a.scale_log2 : -INFINITY;
				s[n][e] = x0, s[n][2 + e] = x1;
				mx_lo = fmaxf(mx_lo, x0), mx_hi = fmaxf(mx_hi, x1);
			}
		float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
		float mu_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
		l_lo *= tc_ex2(m_lo - mu_lo), l_hi *= tc_ex2(m_hi - mu_hi);
		m_lo = mn_lo, m_hi = mn_hi;
#pragma unroll
		for (int n = 0; n < 4; n++)
			l_lo += tc_ex2(s[n][0] - mu_lo) + tc_ex2(s[n][1] - mu_lo),
			    l_hi += tc_ex2(s[n][2] - mu_hi) + tc_ex2(s[n][3] - mu_hi);
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int cc = 0; cc < HD / 32; cc++)
				kv[n][cc] = nx[n][cc];
	}
	/* each row over its quad, then over the warps */
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
	if (tq == 0) {
		red[w][gid][0] = M_lo, red[w][gid][1] = L_lo;
		red[w][gid + 8][0] = M_hi, red[w][gid + 8][1] = L_hi;
	}
	__syncthreads();
	if (threadIdx.x < G) {
		int h = threadIdx.x;
		float M = -INFINITY, S = 0.0f;
		for (int i = 0; i < S1D_W; i++)
			M = fmaxf(M, red[i][h][0]);
		if (M != -INFINITY)
			for (int i = 0; i < S1D_W; i++)
				S += red[i][h][1] * exp2f(red[i][h][0] - M);
		float *pp = a.part + (((size_t)rg * a.nsplit + blockIdx.y) * G + h) * 2;
		pp[0] = M, pp[1] = S;
	}
}

/* Pass B: grid (T*nkv, nb); LSE_h from pass A's splits (once per CTA),
 * then the level-1 scores: warp w of CTA y takes the 32 keys from
 * (y * S1D_W + w) * 32, then every nb * S1D_W * 32 keys on, the next step's
 * keys loaded before this step's products. */
template <int HD> static __global__ void __launch_bounds__(S1D_W * 32) stage1_dec_score_kernel(s1d_args a)
{
#if !S1D_EARLY
	sfwc_pdl_wait();
#endif
	sfwc_s1_resolve(a);
	__shared__ float lse[16];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
	const int rg = blockIdx.x, r = rg / a.nkv, g = rg % a.nkv, G = a.nh / a.nkv;
	const int64_t step = (int64_t)gridDim.y * S1D_W * S1D_KEYS;
	int64_t j0 = ((int64_t)blockIdx.y * S1D_W + w) * S1D_KEYS;
	if ((int64_t)blockIdx.y * S1D_W * S1D_KEYS >= a.n1)
		return; /* the whole CTA: past this call's keys (a recorded step's bound) */
	const int64_t v1 = tc_visible(a.pos0 + r, a.n1, a.ksize, a.stride);
	/* this warp's first keys and the query first: their loads run while
	 * the splits are merged */
	uint4 kv[4][HD / 32];
#if S1D_STAGES > 0
	extern __shared__ uint4 s1d_smem[];
	uint4 *ring = s1d_smem + (size_t)w * (HD / 8) * 32 + lane; /* this lane's slots of stage 0 */
	for (int k = 0; k < S1D_STAGES - 1; k++) {
		const int64_t jk = j0 + (int64_t)k * step;
		if (jk < a.n1)
			s1d_stage<HD>(ring + (size_t)k * S1D_W * (HD / 8) * 32, a, jk, v1, g);
		else
			tc_cp_commit();
	}
#else
	if (j0 < a.n1)
		s1d_load<HD>(kv, a, 1, j0, v1, g);
#endif
	uint32_t qa[HD / 16][4];
	s1d_qfrag<HD>(qa, a, r, g, G);
#if S1D_EARLY
	sfwc_pdl_wait(); /* pass A's partials */
#endif
	/* LSE_h: warp w merges heads w, w + S1D_W, ... over the splits, lane i
	 * holding splits i, i + 32, ... */
	const float *pr = a.part + (size_t)rg * a.nsplit * G * 2;
	for (int h = w; h < G; h += S1D_W) {
		float mx = -INFINITY;
		for (int i = lane; i < a.nsplit; i += 32)
			mx = fmaxf(mx, pr[((size_t)i * G + h) * 2]);
		const float M = sfwc_warp_max(mx);
		float t = 0.0f;
		if (M != -INFINITY)
			for (int i = lane; i < a.nsplit; i += 32) {
				float m = pr[((size_t)i * G + h) * 2];
				t += m == -INFINITY ? 0.0f : pr[((size_t)i * G + h) * 2 + 1] * exp2f(m - M);
			}
		const float S = M == -INFINITY ? 0.0f : sfwc_warp_sum(t);
		if (lane == 0)
			lse[h] = M == -INFINITY ? -INFINITY : M + log2f(S);
	}
	__syncthreads();
	const float lse_lo = gid < G ? lse[gid] : 0.0f, lse_hi = gid + 8 < G ? lse[gid + 8] : 0.0f;
	float *out = a.scores + ((size_t)g * a.T + r) * (size_t)a.n1;
#if S1D_STAGES > 0
	for (int st = 0; j0 < a.n1; j0 += step, st = st == S1D_STAGES - 1 ? 0 : st + 1) {
		/* step j0 + (S - 1) * step into the stage the step before read
		 * (this lane's own slots: its reads are done), then this step's */
		{
			const int64_t jn = j0 + (int64_t)(S1D_STAGES - 1) * step;
			const int sn = st == 0 ? S1D_STAGES - 1 : st - 1;
			if (jn < a.n1)
				s1d_stage<HD>(ring + (size_t)sn * S1D_W * (HD / 8) * 32, a, jn, v1, g);
			else
				tc_cp_commit();
			tc_cp_wait<S1D_STAGES - 1>();
			const uint4 *sl = ring + (size_t)st * S1D_W * (HD / 8) * 32;
#pragma unroll
			for (int n = 0; n < 4; n++)
#pragma unroll
				for (int cc = 0; cc < HD / 32; cc++)
					kv[n][cc] = sl[(n * (HD / 32) + cc) * 32];
		}
#else
	for (; j0 < a.n1; j0 += step) {
		uint4 nx[4][HD / 32];
		if (j0 + step < a.n1)
			s1d_load<HD>(nx, a, 1, j0 + step, v1, g);
#endif
		float s[4][4];
		s1d_mma<HD>(s, qa, kv);
		float cs[4][2];
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				bool vis = j0 + 8 * n + 2 * tq + e < v1;
				float lo = vis && gid < G ? tc_ex2(s[n][e] * a.scale_log2 - lse_lo) : 0.0f;
				float hi = vis && gid + 8 < G ? tc_ex2(s[n][2 + e] * a.scale_log2 - lse_hi) : 0.0f;
				float v = lo + hi;
				v += __shfl_xor_sync(0xffffffffu, v, 4);
				v += __shfl_xor_sync(0xffffffffu, v, 8);
				v += __shfl_xor_sync(0xffffffffu, v, 16);
				cs[n][e] = v; /* every lane: columns 8n + 2tq + e */
			}
		/* lanes of gid n < 4 write n-tile n: 32 consecutive floats per warp */
#pragma unroll
		for (int n = 0; n < 4; n++)
			if (n == gid)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					int64_t col = j0 + 8 * n + 2 * tq + e;
					float v = cs[n][e];
					if (isnan(v))
						v = 0.0f;
					if (col < a.n1)
						out[col] = sfwc_rbf(v);
				}
#if S1D_STAGES == 0
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int cc = 0; cc < HD / 32; cc++)
				kv[n][cc] = nx[n][cc];
#endif
	}
}

/* Pass B's ring may be launched on this device (S1D_STAGES > 0: its shared
 * memory limit raised once per device and head size; refused, the caller
 * declines and the CUDA-core kernel runs). */
template <int HD> static bool s1d_ring_ready(void)
{
	if (S1D_STAGES == 0)
		return true;
	static int ready_dev[SFWC_MAX_DEVICES]; /* 1 raised; -1 refused */
	int &ready = ready_dev[sfwc_device()];
	if (!ready) {
		if (cudaFuncSetAttribute(stage1_dec_score_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 (int)s1d_ring_bytes<HD>()) == cudaSuccess) {
			ready = 1;
		} else {
			(void)cudaGetLastError();
			ready = -1;
		}
	}
	return ready > 0;
}

/* Pass A, then pass B (0: pass B's ring may not be launched here). */
template <int HD> static int s1d_launch(const s1d_args &a, dim3 ga, dim3 gb, cudaStream_t s)
{
	if (!s1d_ring_ready<HD>())
		return 0;
	sfwc_launch(stage1_dec_lse_kernel<HD>, ga, dim3(S1D_W * 32), 0, s, a);
	sfwc_launch(stage1_dec_score_kernel<HD>, gb, dim3(S1D_W * 32), S1D_STAGES ? s1d_ring_bytes<HD>() : 0, s, a);
	return 1;
}

/* T <= 16 rows: the keys split over many warps; c1, c2 and the table from
 * rr's and ck's slots where they have them. */
int sfwi_stage1_tc_rows(float *scores, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
			const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, struct sfw_cuda_ctx *cx)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
	int64_t n1 = sh->n1, n2 = sh->n2 > 0 ? sh->n2 : 0;
	/* grid.y of pass B is unsigned, and so are the key indices' products */
	if (T > S1D_MAXT || n1 / (S1D_W * S1D_KEYS) >= (int64_t)1 << 30)
		return 0;
	int G = nh / nkv, rows = T * nkv, sms = sfwi_cuda_sms(cx);
	/* pass A: splits of at least one CTA's step of keys, enough CTAs for
	 * two per SM */
	int nsplit = 1;
	while (nsplit < S1D_MAXSPLIT && rows * nsplit < 2 * sms && n2 / (2 * nsplit) >= S1D_W * S1D_KEYS)
		nsplit *= 2;
	/* pass B: two CTAs per SM, or one per step of keys when fewer */
	int64_t nb = (n1 + S1D_W * S1D_KEYS - 1) / (S1D_W * S1D_KEYS), nbmax = (2 * sms + rows - 1) / rows;
	if (nb > nbmax)
		nb = nbmax;
	s1d_args a = {scores,
		      (float *)sfwi_cuda_scratch(cx, (size_t)rows * nsplit * G * 2 * sizeof(float)),
		      (const uint16_t *)q,
		      (const uint16_t *)c1,
		      (const uint16_t *)c2,
		      n1,
		      n2,
		      0,
		      T,
		      nh,
		      nkv,
		      sh->ksize,
		      sh->stride,
		      nsplit,
		      sh->scale * 1.4426950408889634f,
		      sfwc_selpos{rr->pos, rr->off, rr->len},
		      rr->c1,
		      rr->c2,
		      ck->tab,
		      ck->ptab,
		      ck->shift};
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	dim3 ga((unsigned)rows, (unsigned)nsplit),
	    gb((unsigned)rows, (unsigned)nb);
	int ran = hd == 32   ? s1d_launch<32>(a, ga, gb, s)
		  : hd == 64 ? s1d_launch<64>(a, ga, gb, s)
			     : s1d_launch<128>(a, ga, gb, s);
	if (!ran)
		return 0;
	SFW_CUDA_LAUNCHED();
	return 1;
}
