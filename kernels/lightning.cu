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
#include "cuda_act.cuh"

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
 * The same function as the serial form and the CPU twin; only the fp32
 * summation order differs. D lives in the op scratch. */
#define GLA_C 64

/* Register tiles of the chunk-parallel kernels: acc = 0, and acc += a bᵀ. */
template <int X, int Y> static __device__ __forceinline__ void tile_zero(float (&acc)[X][Y])
{
#pragma unroll
	for (int x = 0; x < X; x++)
#pragma unroll
		for (int y = 0; y < Y; y++)
			acc[x][y] = 0;
}

template <int X, int Y>
static __device__ __forceinline__ void tile_outer(float (&acc)[X][Y], const float (&a)[X], const float (&b)[Y])
{
#pragma unroll
	for (int x = 0; x < X; x++)
#pragma unroll
		for (int y = 0; y < Y; y++)
			acc[x][y] = fmaf(a[x], b[y], acc[x][y]);
}

/* per thread: TA rows x TA cols of the HD x HD delta (16 x 16 threads) */
template <int HD>
static __global__ void __launch_bounds__(GLA_THREADS)
	gla_delta_kernel(float *D, const uint16_t *k, const uint16_t *v, const float *decay, int T, int t0, int nh)
{
	sfwc_pdl_wait();
	constexpr int TA = HD / 16;
	__shared__ uint16_t ks[GLA_C][HD], vs[GLA_C][HD];
	int j = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	int tb = t0 + j * GLA_C, c = min(GLA_C, T - tb);
	size_t rs = (size_t)nh * HD;
	for (int i = tid; i < c * HD; i += GLA_THREADS) {
		size_t g = (size_t)(tb + i / HD) * rs + (size_t)h * HD + i % HD;
		ks[i / HD][i % HD] = k[g], vs[i / HD][i % HD] = v[g];
	}
	__syncthreads();
	float lg = -decay[h];
	int ta = tid / 16, tc = tid % 16; /* rows ta + 16x, cols tc + 16y */
	float acc[TA][TA];
	tile_zero(acc);
	for (int r = 0; r < c; r++) {
		float w = expf(lg * (float)(c - 1 - r)), kk[TA], vv[TA];
#pragma unroll
		for (int x = 0; x < TA; x++)
			kk[x] = sfwc_bf(ks[r][ta + 16 * x]) * w, vv[x] = sfwc_bf(vs[r][tc + 16 * x]);
		tile_outer(acc, kk, vv);
	}
	float *Dj = D + ((size_t)j * nh + h) * HD * HD;
#pragma unroll
	for (int x = 0; x < TA; x++)
#pragma unroll
		for (int y = 0; y < TA; y++)
			Dj[(size_t)(ta + 16 * x) * HD + tc + 16 * y] = acc[x][y];
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
	/* q, k [C][HD+2] and v [C][HD] bf16; A [C][C+1] and a 32-row state slab fp32 */
	return (size_t)2 * GLA_C * (HD + 2) * 2 + (size_t)GLA_C * HD * 2 + sizeof(float) * ((size_t)GLA_C * (GLA_C + 1) + 32 * HD);
}

/* rows i = ti + 16x (x < 4), value columns b = tb + 16y (y < HD/16) */
template <int HD>
static __global__ void __launch_bounds__(GLA_THREADS)
	gla_out_kernel(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *D,
		       const float *decay, int T, int t0, int nh, float scale)
{
	sfwc_pdl_wait();
	constexpr int LDB = HD + 2, TB = HD / 16;
	extern __shared__ float4 sm4[];
	uint16_t *qs = (uint16_t *)sm4, *ks = qs + GLA_C * LDB, *vs = ks + GLA_C * LDB;
	float *Am = (float *)(vs + GLA_C * HD), *Ss = Am + GLA_C * (GLA_C + 1);
	int j = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	int tok = t0 + j * GLA_C, c = min(GLA_C, T - tok);
	size_t rs = (size_t)nh * HD;
	for (int i = tid; i < c * HD; i += GLA_THREADS) {
		int r = i / HD, a = i % HD;
		size_t g = (size_t)(tok + r) * rs + (size_t)h * HD + a;
		qs[r * LDB + a] = q[g], ks[r * LDB + a] = k[g], vs[r * HD + a] = v[g];
	}
	__syncthreads();
	float lg = -decay[h];
	int ti = tid / 16, tb = tid % 16;
	{ /* A[i][r] = γ^(i-r) q_i·k_r for r <= i < c, else 0 */
		float acc[4][4];
		tile_zero(acc);
		for (int a = 0; a < HD; a++) {
			float qv[4], kv[4];
#pragma unroll
			for (int x = 0; x < 4; x++)
				qv[x] = sfwc_bf(qs[(ti + 16 * x) * LDB + a]), kv[x] = sfwc_bf(ks[(tb + 16 * x) * LDB + a]);
			tile_outer(acc, qv, kv);
		}
#pragma unroll
		for (int x = 0; x < 4; x++)
#pragma unroll
			for (int y = 0; y < 4; y++) {
				int i = ti + 16 * x, r = tb + 16 * y;
				Am[i * (GLA_C + 1) + r] = r <= i && i < c ? acc[x][y] * expf(lg * (float)(i - r)) : 0.0f;
			}
	}
	float acc[4][TB];
	tile_zero(acc);
	/* inter-chunk: q_i S_j, S_j streamed through shared memory 32 rows at a time */
	const float *Sj = D + ((size_t)j * nh + h) * HD * HD;
	for (int a0 = 0; a0 < HD; a0 += 32) {
		__syncthreads();
		for (int e = tid; e < 32 * HD; e += GLA_THREADS)
			Ss[e] = Sj[(size_t)a0 * HD + e];
		__syncthreads();
		for (int aa = 0; aa < 32; aa++) {
			float qv[4], sv[TB];
#pragma unroll
			for (int x = 0; x < 4; x++)
				qv[x] = sfwc_bf(qs[(ti + 16 * x) * LDB + a0 + aa]);
#pragma unroll
			for (int y = 0; y < TB; y++)
				sv[y] = Ss[aa * HD + tb + 16 * y];
			tile_outer(acc, qv, sv);
		}
	}
#pragma unroll
	for (int x = 0; x < 4; x++) {
		float w = expf(lg * (float)(ti + 16 * x + 1));
#pragma unroll
		for (int y = 0; y < TB; y++)
			acc[x][y] *= w;
	}
	/* intra-chunk: Σ_r A[i][r] v_r (A is 0 above the diagonal) */
	for (int r = 0; r < c; r++) {
		float av[4], vv[TB];
#pragma unroll
		for (int x = 0; x < 4; x++)
			av[x] = Am[(ti + 16 * x) * (GLA_C + 1) + r];
#pragma unroll
		for (int y = 0; y < TB; y++)
			vv[y] = sfwc_bf(vs[r * HD + tb + 16 * y]);
		tile_outer(acc, av, vv);
	}
#pragma unroll
	for (int x = 0; x < 4; x++) {
		int i = ti + 16 * x;
		if (i >= c)
			continue;
#pragma unroll
		for (int y = 0; y < TB; y++)
			o[(size_t)(tok + i) * rs + (size_t)h * HD + tb + 16 * y] = sfwc_tobf(acc[x][y] * scale);
	}
}

template <int HD>
static void gla_scan_launch(uint16_t *o, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *state,
			    const float *decay, int T, int nh, float scale, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	size_t per_chunk = (size_t)nh * HD * HD * sizeof(float);
	int64_t chunks = (T + GLA_C - 1) / GLA_C, cap = (int64_t)(((size_t)32 << 20) / per_chunk);
	int NC = (int)(chunks < cap ? chunks : cap > 0 ? cap : 1);
	float *D = (float *)sfwi_cuda_scratch(cx, (size_t)NC * per_chunk);
	constexpr size_t smem = gla_out_smem<HD>();
	static bool attr_dev[SFWC_MAX_DEVICES]; /* per instantiation and device; harmless if raced */
	bool &attr_set = attr_dev[sfwc_device()];
	if (!attr_set) {
		SFW_CUDA_CHECK(cudaFuncSetAttribute(gla_out_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
						    (int)smem));
		attr_set = true;
	}
	unsigned sblocks = (unsigned)(((size_t)nh * HD * HD + GLA_THREADS - 1) / GLA_THREADS);
	for (int t0 = 0; t0 < T; t0 += NC * GLA_C) {
		int nc = (int)(((int64_t)T - t0 + GLA_C - 1) / GLA_C);
		nc = nc < NC ? nc : NC;
		sfwc_launch(gla_delta_kernel<HD>, dim3(nc, nh), dim3(GLA_THREADS), 0, s, D, k, v, decay, T, t0, nh);
		SFW_CUDA_LAUNCHED();
		sfwc_launch(gla_scan_kernel, dim3(sblocks), dim3(GLA_THREADS), 0, s, D, state, decay, T, t0, nh, HD, nc);
		SFW_CUDA_LAUNCHED();
		sfwc_launch(gla_out_kernel<HD>, dim3(nc, nh), dim3(GLA_THREADS), smem, s, o, q, k, v, (const float *)D,
			    decay, T, t0, nh, scale);
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
		static bool attr_dev[SFWC_MAX_DEVICES]; /* per instantiation and device; harmless if raced */
		bool &attr_set = attr_dev[sfwc_device()];
		if (!attr_set) {
			SFW_CUDA_CHECK(cudaFuncSetAttribute(gla_chunk_kernel<A, HD>,
							    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
			attr_set = true;
		}
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
