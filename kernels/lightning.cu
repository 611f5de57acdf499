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

#define GLA_THREADS 256
#define GLA_WARPS (GLA_THREADS / 32)

template <typename A, int HD>
static __global__ void __launch_bounds__(GLA_THREADS)
	gla_rec_kernel(A *o, const A *q, const A *k, const A *v, float *state, const float *decay, int T, int nh,
		       float scale)
{
	sfwc_pdl_wait();
	constexpr int RPT = HD / GLA_WARPS; /* state rows per thread */
	__shared__ float qs[HD], ks[HD], red[GLA_WARPS][32];
	int h = blockIdx.x, col = blockIdx.y * 32 + (threadIdx.x & 31), w = threadIdx.x >> 5;
	float *S = state + (size_t)h * HD * HD;
	float g = expf(-decay[h]);
	float s[RPT];
#pragma unroll
	for (int i = 0; i < RPT; i++)
		s[i] = S[(size_t)(w + i * GLA_WARPS) * HD + col];
	size_t rs = (size_t)nh * HD;
	for (int t = 0; t < T; t++) {
		size_t base = t * rs + (size_t)h * HD;
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

template <typename A, int HD>
static void gla_launch(bool chunked, void *o, const void *q, const void *k, const void *v, float *state,
		       const float *decay, int T, int nh, float scale, cudaStream_t s)
{
	dim3 grid(nh, HD / 32);
	if (!chunked) {
		sfwc_launch(gla_rec_kernel<A, HD>, dim3(grid), dim3(GLA_THREADS), 0, s, (A *)o, (const A *)q, (const A *)k, (const A *)v,
								     state, decay, T, nh, scale);
	} else {
		constexpr size_t smem = gla_chunk_smem<HD>();
		static bool attr_set = false; /* per instantiation; harmless if raced */
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
		    const float *decay, int T, int nh, int hd, float scale, enum sfw_op_dtype act, void *stream)
{
	if (T <= 0)
		return;
	cudaStream_t s = SFW_CUDA_STREAM(stream);
	switch (hd) {
	case 32: ACT_DISPATCH(act, gla_launch<A, 32>(chunked, o, q, k, v, state, decay, T, nh, scale, s)); break;
	case 64: ACT_DISPATCH(act, gla_launch<A, 64>(chunked, o, q, k, v, state, decay, T, nh, scale, s)); break;
	case 128: ACT_DISPATCH(act, gla_launch<A, 128>(chunked, o, q, k, v, state, decay, T, nh, scale, s)); break;
	default:
		fprintf(stderr, "salafw: lightning head_dim %d is not supported on CUDA (32, 64, 128)\n", hd);
		abort();
	}
}

extern "C" void sfw_op_gla_recurrent_cuda(void *o, const void *q, const void *k, const void *v, float *state,
					  const float *decay, int T, int nh, int hd, float scale, enum sfw_op_dtype act,
					  void *stream)
{
	gla_any(false, o, q, k, v, state, decay, T, nh, hd, scale, act, stream);
}

extern "C" void sfw_op_gla_chunked_cuda(void *o, const void *q, const void *k, const void *v, float *state,
					const float *decay, int T, int nh, int hd, float scale, int chunk,
					enum sfw_op_dtype act, void *stream)
{
	SFW_ASSERT(chunk > 0);
	gla_any(true, o, q, k, v, state, decay, T, nh, hd, scale, act, stream);
}
