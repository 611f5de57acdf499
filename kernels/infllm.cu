/* infllm.cu - CUDA twins of kernels/infllm.c: InfLLM-v2 key compression,
 * stage-1 scoring (level-2 LSE normaliser, summed over each KV group),
 * max-pooling to blocks with forced init/local blocks, and top-k with ties
 * to the lower block index (docs/model-spec.md §2.6.3-2.6.4).
 *
 * In bf16 mode the stage-1 scores are rounded to bf16 values (the reference
 * kernel writes bf16) and pooling works on those.
 *
 * bf16 stage-1 calls of decode rows (T <= 16, the recorded step's too) and
 * prefill-sized ones (T >= 64) go to the tensor-core kernels
 * (kernels/attn_tc_stage1.cu) unless SALAFW_CUDA_STAGE1=simt;
 * SALAFW_CUDA_STAGE1=tc sends every shape they support there (tests). */
#include "attn_tc.cuh"

/* ---- compression ---- */

/* Where a level's chunks go (sfw_ckey_row, kernels/ops.h): the level
 * (1, 2), level 1's kernel and stride, and the block table of paged
 * compressed keys (NULL: contiguous). */
struct ck_dst {
	const int32_t *tab;
	int shift, level, ksize, stride;
};

/* The keys compression reads, element i of cache row r (i < nkv * hd): a
 * cache in the activation dtype A, or (KV8) an fp8 one (kernels/ops.h, "the
 * fp8 KV cache"), read as sfw_op_kv8_read_cpu reads it. make() takes the
 * cache's array (a kernel's argument, or a sequence's pointer). */
template <typename A, bool KV8> struct ck_keys {
	const A *k;
	int row;
	static __device__ __host__ ck_keys make(const void *k, int nkv, int hd)
	{
		return ck_keys{(const A *)k, nkv * hd};
	}
	__device__ __forceinline__ float at(int64_t r, int i) const
	{
		return act_ld(k, (size_t)r * row + i);
	}
};
template <typename A> struct ck_keys<A, true> {
	const uint8_t *k;
	int nkv, hd;
	static __device__ __host__ ck_keys make(const void *k, int nkv, int hd)
	{
		return ck_keys{(const uint8_t *)k, nkv, hd};
	}
	/* the value rounded once (sfwc_e4m3_mul): never fused into the sum */
	__device__ __forceinline__ float at(int64_t r, int i) const
	{
		int g = i / hd, d = i - g * hd;
		float s = __ldg((const float *)(k + sfw_kv8_scale_off(r, g, nkv, hd)));
		return sfwc_e4m3_mul(k[sfw_kv8_codes_off(r, g, nkv, hd) + d], s * SFWC_E4M3_H2_UNIT);
	}
};

/* Chunks [j0, j1) of one level, grid-strided over (chunk, element); token
 * t of the cache `keys` at row sfwc_kv_row(tab, shift, t) (contiguous: t),
 * chunk j at row sfw_ckey_row of d. */
template <typename A, typename K>
static __device__ __forceinline__ void compress_chunks(A *c, const K &keys, const int32_t *tab, int shift, int row,
						       int64_t j0, int64_t j1, const ck_dst &d)
{
	int lv = d.level == 2 ? 4 : 1, ksize = lv * d.ksize, stride = lv * d.stride;
	size_t n = (size_t)(j1 - j0) * row;
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
		int64_t j = j0 + (int64_t)(e / row);
		int i = (int)(e % row);
		float s = 0;
		for (int t = 0; t < ksize; t++)
			s += keys.at(sfwc_kv_row(tab, shift, j * stride + t), i);
		act_st(c, (size_t)sfw_ckey_row(d.tab, d.shift, d.ksize, d.stride, d.level, j) * row + i, s / (float)ksize);
	}
}

template <typename A>
static __global__ void compress_kernel(A *c, const A *k, const int32_t *tab, int shift, int row, int64_t j0,
				       int64_t j1, ck_dst d)
{
	sfwc_pdl_wait();
	compress_chunks(c, ck_keys<A, false>{k, row}, tab, shift, row, j0, j1, d);
}

/* kpg pages the keys, d the chunks. */
static void compress_range(void *c, const void *k, const struct sfw_pages *kpg, int nkv, int hd, int64_t j0,
			   int64_t j1, const ck_dst &d, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (j1 <= j0)
		return;
	size_t n = (size_t)(j1 - j0) * nkv * hd;
	unsigned blocks = (unsigned)((n + 255) / 256 > 65535 ? 65535 : (n + 255) / 256);
	ACT_DISPATCH(act, sfwc_launch(compress_kernel<A>, dim3(blocks), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (A *)c,
				      (const A *)k, sfwc_pg_tab(kpg), sfwc_pg_shift(kpg), nkv * hd, j0, j1, d));
	SFW_CUDA_LAUNCHED();
}

/* The chunk destination of level `level` for compressed keys paged by pg. */
static ck_dst ck_dst_of(const struct sfw_pages *pg, int level, const struct sfw_sel_shape *sh)
{
	const int32_t *tab = sfwc_pg_tab(pg);
	SFW_ASSERT(!tab || sfw_ckey_rows_per_block(pg->shift, sh->stride) > 0);
	return ck_dst{tab, sfwc_pg_shift(pg), level, sh->ksize, sh->stride};
}

extern "C" void sfw_op_compress_cuda(void *c, const void *k, int level, int64_t j0, int64_t j1,
				     const struct sfw_sel_shape *sh, const struct sfw_pages *pg, enum sfw_dtype act,
				     struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(level == 1 || level == 2);
	compress_range(c, k, NULL, sh->nkv, sh->hd, j0, j1, ck_dst_of(pg, level, sh), act, cx);
}

/* The level-1 (blockIdx.y 0) and level-2 (1) chunks that the T tokens at
 * positions *dpos .. *dpos + T - 1 complete: chunks [nchunks(p),
 * nchunks(p + T)) of each level. */
template <typename A, typename K>
static __global__ void compress_tokens_kernel(A *c1, A *c2, const K keys, const int32_t *tab, int shift, int row,
					      int ksize, int stride, const int64_t *dpos, int T)
{
	sfwc_pdl_wait();
	int lv = blockIdx.y;
	int ks = lv ? 4 * ksize : ksize, st = lv ? 4 * stride : stride;
	A *c = lv ? c2 : c1;
	int64_t p = *dpos;
	compress_chunks(c, keys, tab, shift, row, sfw_nchunks(p, ks, st), sfw_nchunks(p + T, ks, st),
			ck_dst{tab, shift, lv + 1, ksize, stride});
}

/* A batched decode step: sequence blockIdx.z's token at pos[z]; p[0] c1,
 * p[1] c2, p[2] its K cache (paged by tab[z]; fp8 with KV8). */
template <typename A, bool KV8>
static __global__ void compress_seqs_kernel(const sfw_cuda_seqs S, int nkv, int hd, int ksize, int stride)
{
	int lv = blockIdx.y, z = blockIdx.z; /* its sequence before the wait: the host's table */
	if (!sfwc_seq_live(S, z))
		return;
	int ks = lv ? 4 * ksize : ksize, st = lv ? 4 * stride : stride;
	A *c = (A *)sfwc_seq_p(S, lv, z);
	int64_t p = sfwc_seq_pos(S, z);
	int64_t j0 = sfw_nchunks(p, ks, st), j1 = sfw_nchunks(p + 1, ks, st);
	const ck_keys<A, KV8> keys = ck_keys<A, KV8>::make(sfwc_seq_p(S, 2, z), nkv, hd);
	const int32_t *tab = sfwc_seq_tab(S, z);
	int shift = sfwc_seq_shift(S);
	sfwc_pdl_wait();
	compress_chunks(c, keys, tab, shift, nkv * hd, j0, j1, ck_dst{tab, shift, lv + 1, ksize, stride});
}

extern "C" void sfw_cuda_compress_seqs(const struct sfw_cuda_seqs *s, int nkv, int hd, int ksize, int stride,
				       enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(s->n >= 1 && s->n <= SFW_CUDA_SEQS_MAX && ksize >= 1 && stride >= 1);
	int row = nkv * hd;
	dim3 grid((unsigned)((row + 255) / 256), 2, s->n);
	cudaStream_t st = SFW_CUDA_STREAM(cx->stream);
	if (s->kv8)
		ACT_DISPATCH(act, sfwc_launch(compress_seqs_kernel<A, true>, grid, dim3(256), 0, st, *s, nkv, hd, ksize,
					      stride));
	else
		ACT_DISPATCH(act, sfwc_launch(compress_seqs_kernel<A, false>, grid, dim3(256), 0, st, *s, nkv, hd, ksize,
					      stride));
	SFW_CUDA_LAUNCHED();
}

/* sfw_cuda_compress's launch over keys of either kind (K: ck_keys). */
template <typename A, typename K>
static void compress_tokens(void *c1, void *c2, const K &keys, const struct sfw_pages *pg, int row, int ksize,
			    int stride, const int64_t *dpos, int T, struct sfw_cuda_ctx *cx)
{
	/* T tokens complete at most (T - 1) / stride + 1 level-1 chunks: the
	 * grid covers those, striding when the elements outnumber it */
	size_t n = (size_t)((T - 1) / stride + 1) * row;
	unsigned blocks = (unsigned)((n + 255) / 256 > 65535 ? 65535 : (n + 255) / 256);
	sfwc_launch(compress_tokens_kernel<A, K>, dim3(blocks, 2), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), (A *)c1,
		    (A *)c2, keys, sfwc_pg_tab(pg), sfwc_pg_shift(pg), row, ksize, stride, dpos, T);
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_compress(void *c1, void *c2, const struct sfw_cuda_kv *kv, const struct sfw_sel_shape *sh,
				  const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	const void *k = kv->kc;
	const struct sfw_pages *pg = kv->pg;
	int nkv = sh->nkv, hd = sh->hd, ksize = sh->ksize, stride = sh->stride, T = sh->T;
	SFW_ASSERT(ksize >= 1 && stride >= 1 && rr->pos && !rr->k && !rr->tab);
	if (T <= 0)
		return;
	SFW_ASSERT(!sfwc_pg_tab(pg) || sfw_ckey_rows_per_block(pg->shift, stride) > 0);
	int row = nkv * hd;
	if (kv->kv8) /* the keys read from the fp8 cache; c1, c2 in act */
		ACT_DISPATCH(act, compress_tokens<A>(c1, c2, ck_keys<A, true>::make(k, nkv, hd), pg, row, ksize, stride,
						     rr->pos, T, cx));
	else
		ACT_DISPATCH(act, compress_tokens<A>(c1, c2, ck_keys<A, false>::make(k, nkv, hd), pg, row, ksize,
						     stride, rr->pos, T, cx));
}

/* ---- stage 1 ---- */

static __device__ __forceinline__ int64_t visible(int64_t p, int64_t n, int ksize, int stride)
{
	if (p < ksize - 1)
		return 0;
	int64_t v = (p - (ksize - 1)) / stride + 1;
	return v < n ? v : n;
}

#define S1_THREADS 256
#define S1_MAXG 16
#define S1_MAXSPLIT 64 /* s1_launch's nsplit */

struct s1_args {
	float *scores;
	const void *q, *c1, *c2;
	float *part; /* [rows*nkv][nsplit][G][2] = (max, sum) of the level-2 exponentials */
	/* the rows' first position and the counts (also the score stride),
	 * from sp when the kernel runs; the host's values bound the launch */
	int64_t n1, n2, pos0;
	int T, nh, nkv, ksize, stride, nsplit;
	float scale;
	sfwc_selpos sp;
	/* non-NULL: c1 = *pc1, c2 = *pc2 when the kernel runs (struct sfw_cuda_rowref) */
	void *const *pc1, *const *pc2;
	/* paged compressed keys (sfw_ckey_row): the block table, or (ptab
	 * non-NULL) *ptab when the kernel runs; NULL: contiguous */
	const int32_t *tab;
	const int32_t *const *ptab;
	int shift;
};

/* x[h] += q_h · k for the G heads of the group, d ascending (as the CPU
 * twin sums). The key row is read as 16-byte vectors, all in flight at
 * once; the head loop stays rolled: unrolled over heads and dimensions the
 * body was ~100 KB of code, and instruction fetch made a decode step's
 * stage 1 (a few thousand threads) take ~200 µs. */
template <typename A, int HD>
static __device__ __forceinline__ void s1_dot(float x[S1_MAXG], const A *kr, const float (*qs)[HD], int G)
{
	vec8<A> kv[HD / 8];
#pragma unroll
	for (int i = 0; i < HD / 8; i++)
		kv[i].load(kr + 8 * i);
#pragma unroll 1
	for (int h = 0; h < G; h++) {
		float acc = x[h];
#pragma unroll
		for (int i = 0; i < HD / 8; i++) {
			float f[8];
			kv[i].to_f32(f);
			float4 q0 = *(const float4 *)&qs[h][8 * i], q1 = *(const float4 *)&qs[h][8 * i + 4];
			acc = fmaf(q0.x, f[0], acc);
			acc = fmaf(q0.y, f[1], acc);
			acc = fmaf(q0.z, f[2], acc);
			acc = fmaf(q0.w, f[3], acc);
			acc = fmaf(q1.x, f[4], acc);
			acc = fmaf(q1.y, f[5], acc);
			acc = fmaf(q1.z, f[6], acc);
			acc = fmaf(q1.w, f[7], acc);
		}
		x[h] = acc;
	}
}

/* Pass A: per head of the group, max and sum of exp over this split's share
 * of the visible level-2 keys. */
template <typename A, int HD>
static __global__ void __launch_bounds__(S1_THREADS) s1_lse_kernel(s1_args a)
{
	sfwc_pdl_wait();
	sfwc_s1_resolve(a);
	__shared__ __align__(16) float qs[S1_MAXG][HD];
	__shared__ float wred[S1_MAXG][S1_THREADS / 32];
	int rg = blockIdx.x, r = rg / a.nkv, g = rg % a.nkv, G = a.nh / a.nkv;
	int64_t p = a.pos0 + r;
	int64_t v2 = visible(p, a.n2, 4 * a.ksize, 4 * a.stride);
	for (int i = threadIdx.x; i < G * HD; i += S1_THREADS)
		qs[i / HD][i % HD] = act_ld((const A *)a.q, ((size_t)r * a.nh + (size_t)g * G) * HD + i);
	__syncthreads();
	int64_t per = (v2 + a.nsplit - 1) / a.nsplit;
	int64_t c0 = (int64_t)blockIdx.y * per, c1 = min(v2, c0 + per);
	float m[S1_MAXG], s[S1_MAXG];
#pragma unroll
	for (int h = 0; h < S1_MAXG; h++)
		m[h] = -INFINITY, s[h] = 0;
	size_t crow = (size_t)a.nkv * HD;
	for (int64_t c = c0 + threadIdx.x; c < c1; c += S1_THREADS) {
		const A *kr = (const A *)a.c2 + (size_t)sfw_ckey_row(a.tab, a.shift, a.ksize, a.stride, 2, c) * crow +
			      (size_t)g * HD;
		float x[S1_MAXG];
#pragma unroll
		for (int h = 0; h < S1_MAXG; h++)
			x[h] = 0;
		s1_dot<A, HD>(x, kr, qs, G);
#pragma unroll
		for (int h = 0; h < S1_MAXG; h++) {
			if (h >= G)
				break;
			float xv = a.scale * x[h];
			float mx = fmaxf(m[h], xv);
			s[h] = s[h] * (m[h] == -INFINITY ? 0.0f : expf(m[h] - mx)) + expf(xv - mx);
			m[h] = mx;
		}
	}
	/* per head, sfwc_block_max of m, then sfwc_block_sum of s·exp(m − M):
	 * the same shuffles and the same order, for all G heads at once (two
	 * barriers per pass instead of two per head and pass: 64 at G = 16,
	 * most of the kernel's time in a decode step) */
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	constexpr int NW = S1_THREADS / 32;
	float M[S1_MAXG];
#pragma unroll
	for (int h = 0; h < S1_MAXG; h++) {
		float v = sfwc_warp_max(m[h]);
		if (lane == 0 && h < G)
			wred[h][wid] = v;
	}
	__syncthreads();
#pragma unroll
	for (int h = 0; h < S1_MAXG; h++)
		M[h] = h < G ? sfwc_warp_max(lane < NW ? wred[h][lane] : -INFINITY) : -INFINITY;
	__syncthreads(); /* wred is read by every warp before it is written again */
#pragma unroll
	for (int h = 0; h < S1_MAXG; h++) {
		float v = sfwc_warp_sum(M[h] == -INFINITY ? 0.0f : s[h] * expf(m[h] - M[h]));
		if (lane == 0 && h < G)
			wred[h][wid] = v;
	}
	__syncthreads();
	if (wid == 0)
		for (int h = 0; h < G; h++) {
			float S = sfwc_warp_sum(lane < NW ? wred[h][lane] : 0.0f);
			if (lane == 0) {
				float *pp = a.part + (((size_t)rg * a.nsplit + blockIdx.y) * G + h) * 2;
				pp[0] = M[h], pp[1] = S;
			}
		}
}

/* Pass B: one thread per level-1 chunk: Σ_h exp(x_h − LSE_h). */
template <typename A, int HD>
static __global__ void __launch_bounds__(S1_THREADS) s1_score_kernel(s1_args a)
{
	sfwc_pdl_wait();
	sfwc_s1_resolve(a);
	__shared__ __align__(16) float qs[S1_MAXG][HD];
	__shared__ float lse[S1_MAXG];
	__shared__ float parts[S1_MAXSPLIT * S1_MAXG * 2];
	int rg = blockIdx.x, r = rg / a.nkv, g = rg % a.nkv, G = a.nh / a.nkv;
	int64_t p = a.pos0 + r;
	int64_t v1 = visible(p, a.n1, a.ksize, a.stride);
	for (int i = threadIdx.x; i < G * HD; i += S1_THREADS)
		qs[i / HD][i % HD] = act_ld((const A *)a.q, ((size_t)r * a.nh + (size_t)g * G) * HD + i);
	/* pass A's (max, sum) pairs of this row and group, loaded by the whole
	 * block at once (one thread per head walking them from global memory
	 * was a chain of dependent loads), then combined per head in split
	 * order as before */
	const float *pr = a.part + (size_t)rg * a.nsplit * G * 2;
	for (int i = threadIdx.x; i < a.nsplit * G * 2; i += S1_THREADS)
		parts[i] = pr[i];
	__syncthreads();
	if (threadIdx.x < G) {
		int h = threadIdx.x;
		float M = -INFINITY;
		for (int sp = 0; sp < a.nsplit; sp++)
			M = fmaxf(M, parts[(sp * G + h) * 2]);
		float S = 0;
		if (M != -INFINITY)
			for (int sp = 0; sp < a.nsplit; sp++) {
				const float *pp = parts + (sp * G + h) * 2;
				S += pp[1] * expf(pp[0] - M);
			}
		lse[h] = M == -INFINITY ? -INFINITY : M + logf(S);
	}
	__syncthreads();
	int64_t j = (int64_t)blockIdx.y * S1_THREADS + threadIdx.x;
	if (j >= a.n1)
		return;
	float out = 0;
	if (j < v1) {
		const A *kr = (const A *)a.c1 +
			      (size_t)sfw_ckey_row(a.tab, a.shift, a.ksize, a.stride, 1, j) * a.nkv * HD + (size_t)g * HD;
		float x[S1_MAXG];
#pragma unroll
		for (int h = 0; h < S1_MAXG; h++)
			x[h] = 0;
		s1_dot<A, HD>(x, kr, qs, G);
#pragma unroll
		for (int h = 0; h < S1_MAXG; h++)
			if (h < G)
				out += expf(a.scale * x[h] - lse[h]);
		if (isnan(out))
			out = 0;
		out = act_round<A>(out);
	}
	a.scores[((size_t)g * a.T + r) * a.n1 + j] = out;
}

template <typename A, int HD>
static void s1_launch(s1_args a, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	int G = a.nh / a.nkv, rows = a.T * a.nkv;
	int nsplit = 1;
	/* decode (two rows): spread the level-2 keys over blocks down to 64 per
	 * block, else a handful of blocks walks them all */
	int sms = sfwi_cuda_sms(cx);
	while (rows * nsplit < 2 * sms && a.n2 / (nsplit * 2) >= 64 && nsplit < S1_MAXSPLIT)
		nsplit *= 2;
	a.nsplit = nsplit;
	a.part = (float *)sfwi_cuda_scratch(cx, (size_t)rows * nsplit * G * 2 * sizeof(float));
	sfwc_launch(s1_lse_kernel<A, HD>, dim3(dim3(rows, nsplit)), dim3(S1_THREADS), 0, s, a);
	SFW_CUDA_LAUNCHED();
	unsigned jb = (unsigned)((a.n1 + S1_THREADS - 1) / S1_THREADS);
	sfwc_launch(s1_score_kernel<A, HD>, dim3(dim3(rows, jb)), dim3(S1_THREADS), 0, s, a);
	SFW_CUDA_LAUNCHED();
}

static void s1_any(s1_args a, int hd, enum sfw_dtype act, struct sfw_cuda_ctx *cx);

extern "C" void sfw_cuda_stage1(float *scores, const void *q, const void *c1, const void *c2,
				const struct sfw_sel_shape *sh, const struct sfw_pages *pg,
				const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
	if (T <= 0 || sh->n1 <= 0) /* (no chunk can be complete within the bound: no scores) */
		return;
	SFW_ASSERT(nkv > 0 && nh % nkv == 0 && nh / nkv <= S1_MAXG && rr->pos && !rr->c1 == !rr->c2);
	/* the compressed keys' pages: pg's table, or the row's slot (rr->tab) */
	struct sfwi_ckpages ck = {sfwc_pg_tab(pg), rr->tab, pg ? pg->shift : 0};
	SFW_ASSERT(!ck.tab || sfw_ckey_rows_per_block(ck.shift, sh->stride) > 0);
	if (sfwi_stage1_tc(scores, q, c1, c2, sh, rr, &ck, act, cx))
		return;
	s1_args a = {scores, q,	      c1,		     c2,     NULL,    sh->n1,  sh->n2, 0,	 T,
		     nh,     nkv,     sh->ksize,	     sh->stride, 1,   sh->scale, sfwc_selpos{rr->pos, rr->off, rr->len},
		     rr->c1, rr->c2,  ck.tab,		     ck.ptab, ck.shift};
	s1_any(a, hd, act, cx);
}

/* The counts a twin is given as the length of a cache (the kernels take
 * them so: struct sfwc_selpos): the least length whose chunk counts of the
 * first `levels` levels (0, 1 or 2: n1, n2) and, with blocks, block count
 * are sh's. The CUDA twins of stage 1 (both levels), pooling (level 1 and
 * blocks) and top-k (blocks) take counts that one length gives, as the
 * engine's always are. */
static int64_t twin_len(const struct sfw_sel_shape *sh, int levels, int blocks)
{
	int64_t len = sfw_len_of_counts(sh->n1, sh->n2 > 0 ? sh->n2 : 0, sh->nblocks, sh->ksize, sh->stride, sh->block,
					levels, blocks);
	if (len < 0) {
		fprintf(stderr, "salafw: selection counts n1 %lld, n2 %lld, nblocks %lld are not those of one cache length\n",
			(long long)sh->n1, (long long)sh->n2, (long long)sh->nblocks);
		abort();
	}
	return len;
}

extern "C" void sfw_op_stage1_cuda(float *scores, const void *q, const void *c1, const void *c2,
				   const struct sfw_sel_shape *sh, const struct sfw_pages *pg, enum sfw_dtype act,
				   struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	rr.len = twin_len(sh, 2, 0) - sh->pos0;
	sfw_cuda_stage1(scores, q, c1, c2, sh, pg, &rr, act, cx);
}

static void s1_any(s1_args a, int hd, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	switch (hd) {
	case 32: ACT_DISPATCH(act, s1_launch<A, 32>(a, cx)); break;
	case 64: ACT_DISPATCH(act, s1_launch<A, 64>(a, cx)); break;
	case 128: ACT_DISPATCH(act, s1_launch<A, 128>(a, cx)); break;
	default:
		fprintf(stderr, "salafw: stage-1 head_dim %d is not supported on CUDA (32, 64, 128)\n", hd);
		abort();
	}
}

/* ---- pooling ---- */

/* Block b's pooled score for a row whose query block is qb: +inf for the
 * initial and local blocks (always kept), else the max of the level-1
 * scores s[0, n1) whose chunks overlap the block (-inf when none does). In
 * 32 bits: the launches keep the blocks' tokens below 2^31. */
static __device__ __forceinline__ float pool_value(const float *s, int n1, int b, int qb, int ksize, int stride,
						   int block, int init_blocks, int local_blocks)
{
	if (b < init_blocks || (b >= qb - local_blocks && b <= qb))
		return INFINITY;
	int lo_num = b * block - ksize + 1;
	int lo = lo_num <= 0 ? 0 : (int)(((unsigned)lo_num + (unsigned)stride - 1u) / (unsigned)stride);
	int hi = (int)((unsigned)(b * block + block - 1) / (unsigned)stride);
	if (hi > n1 - 1)
		hi = n1 - 1;
	float m = -INFINITY;
	for (int c = lo; c <= hi; c++)
		if (s[c] > m)
			m = s[c];
	return m;
}

/* The pooling and top-k launches' bound: every block's tokens in an int. */
static void pool_bound_check(const struct sfw_sel_shape *sh)
{
	SFW_ASSERT(sh->block > 0 && sh->nblocks <= (int64_t)INT32_MAX / sh->block &&
		   (int64_t)sh->nkv * sh->T <= INT32_MAX);
}

/* grid (x: blocks of the row, y: rows nkv * T, strided) */
static __global__ void pool_kernel(float *pooled, const float *scores, int T, int ksize, int stride, int block,
				   int init_blocks, int local_blocks, int rows, const sfwc_selpos sp)
{
	sfwc_pdl_wait();
	/* the rows' positions and the counts, from the device */
	int64_t len = *sp.pos + sp.len, pos0 = *sp.pos + sp.off;
	int n1 = (int)sfw_nchunks(len, ksize, stride), nblocks = (int)((len + block - 1) / block);
	for (int gr = blockIdx.y; gr < rows; gr += gridDim.y) {
		int qb = (int)((pos0 + gr % T) / block);
		const float *sc = scores + (size_t)gr * n1;
		float *out = pooled + (size_t)gr * nblocks;
		for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += gridDim.x * blockDim.x)
			out[b] = pool_value(sc, n1, b, qb, ksize, stride, block, init_blocks, local_blocks);
	}
}

extern "C" void sfw_cuda_pool_blocks(float *pooled, const float *scores, const struct sfw_sel_shape *sh,
				     const struct sfw_cuda_rowref *rr, enum sfw_dtype act,
				     struct sfw_cuda_ctx *cx)
{
	int nkv = sh->nkv, T = sh->T, ksize = sh->ksize, stride = sh->stride, block = sh->block;
	int init_blocks = sh->init_blocks, local_blocks = sh->local_blocks;
	int64_t nblocks = sh->nblocks; /* the bound */
	(void)act; /* scores are already rounded where the reference rounds */
	SFW_ASSERT(rr->pos);
	pool_bound_check(sh);
	if ((int64_t)nkv * T * nblocks == 0)
		return;
	int rows = nkv * T;
	unsigned bx = (unsigned)((nblocks + 255) / 256), by = (unsigned)(rows < 65535 ? rows : 65535);
	if ((uint64_t)bx * by > 65535u * 8)
		bx = (unsigned)((65535u * 8) / by > 0 ? (65535u * 8) / by : 1);
	sfwc_launch(pool_kernel, dim3(bx, by), dim3(256), 0, SFW_CUDA_STREAM(cx->stream), pooled, scores, T, ksize,
		    stride, block, init_blocks, local_blocks, rows, sfwc_selpos{rr->pos, rr->off, rr->len});
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_op_pool_blocks_cuda(float *pooled, const float *scores, const struct sfw_sel_shape *sh,
					enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	rr.len = twin_len(sh, 1, 1) - sh->pos0;
	sfw_cuda_pool_blocks(pooled, scores, sh, &rr, act, cx);
}

/* ---- stage 1 and pooling in one pass ---- */

extern "C" int sfw_cuda_stage1_pools(const struct sfw_sel_shape *sh, enum sfw_dtype act,
				    const struct sfw_cuda_ctx *cx)
{
	return sfwi_stage1_tc_pools(sh, act, cx);
}

extern "C" int sfw_cuda_stage1_pool(float *pooled, const void *q, const void *c1, const void *c2,
				   const struct sfw_sel_shape *sh, const struct sfw_pages *pg,
				   const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(sh->nkv > 0 && rr->pos && !rr->c1 == !rr->c2);
	pool_bound_check(sh);
	struct sfwi_ckpages ck = {sfwc_pg_tab(pg), rr->tab, pg ? pg->shift : 0};
	SFW_ASSERT(!ck.tab || sfw_ckey_rows_per_block(ck.shift, sh->stride) > 0);
	return sfwi_stage1_tc_pool(pooled, q, c1, c2, sh, rr, &ck, act, cx);
}

/* ---- top-k ---- */

/* Order-preserving map float -> uint32 (NaN ranks as +inf, -0 as +0, as the
 * CPU twin compares them). */
static __device__ __forceinline__ uint32_t fkey(float v)
{
	if (isnan(v))
		v = INFINITY;
	if (v == 0.0f)
		v = 0.0f;
	uint32_t u = __float_as_uint(v);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Inclusive prefix sum of one value per lane across the (full) warp. */
static __device__ __forceinline__ int warp_incl_scan(int x)
{
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		int y = __shfl_up_sync(0xffffffffu, x, o);
		if (lane >= o)
			x += y;
	}
	return x;
}

/* Top-k over the keys key(i), i in [0, n), of one row, by a block of NT
 * threads: topk_select finds the kk-th largest key (the threshold) and how
 * many keys equal to it are taken (the first ones in index order: ties go
 * to the lower index); topk_emit hands put(j, i) the j-th taken index i in
 * index order, j = 0 .. kk - 1. The histogram counts do not depend on which
 * thread counts what, so the result is the CPU twin's in every form. */
template <int NT> struct topk_smem {
	int hist[256];
	int w_above[NT / 32], w_equal[NT / 32], w_pos[NT / 32], w_take[NT / 32];
	uint32_t prefix;
	int remaining;
};

/* Radix select, 8 bits at a time from the top. The histogram adds are
 * aggregated per warp (the top byte of most keys is one of a few
 * exponents). Starts with a barrier: keys written to shared memory before
 * the call are in place. */
template <int NT, typename K>
static __device__ __forceinline__ void topk_select(const K &key, int n, int kk, topk_smem<NT> &sm, uint32_t &prefix,
						   int &remaining)
{
	const int lane = threadIdx.x & 31;
	const unsigned lt = (1u << lane) - 1u;
	uint32_t mask = 0;
	prefix = 0, remaining = kk;
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = threadIdx.x; i < 256; i += NT)
			sm.hist[i] = 0;
		__syncthreads();
		for (int i0 = 0; i0 < n; i0 += NT) { /* uniform trip count: full-warp votes */
			int i = i0 + threadIdx.x;
			uint32_t kv = i < n ? key(i) : 0;
			bool hit = i < n && (kv & mask) == prefix;
			unsigned d = (kv >> shift) & 255u, any = __ballot_sync(0xffffffffu, hit);
			if (hit) {
				unsigned peers = __match_any_sync(any, d);
				if ((peers & lt) == 0)
					atomicAdd(&sm.hist[d], __popc(peers));
			}
		}
		__syncthreads();
		if (threadIdx.x < 32) {
			/* the highest digit d whose count from 255 down to d reaches
			 * `remaining` (0 when none does): lane l sums bins
			 * 255 - 8l .. 248 - 8l, a warp scan finds the lane, the lane
			 * walks its 8 bins */
			int top = 255 - 8 * lane, c = 0;
#pragma unroll
			for (int j = 0; j < 8; j++)
				c += sm.hist[top - j];
			int incl = warp_incl_scan(c);
			unsigned hitl = __ballot_sync(0xffffffffu, incl >= remaining);
			int owner = hitl ? __ffs(hitl) - 1 : 31;
			if (lane == owner) {
				int above = incl - c, d = top;
				while (d > top - 7 && above + sm.hist[d] < remaining)
					above += sm.hist[d--];
				sm.prefix = prefix | ((uint32_t)d << shift);
				sm.remaining = remaining - above;
			}
		}
		__syncthreads();
		prefix = sm.prefix;
		remaining = sm.remaining;
		mask |= 255u << shift;
	}
}

/* Warp w owns the w-th contiguous range of [0, n) (a multiple of 32 long),
 * counts its keys above and equal to the threshold, a scan over the warps
 * places each warp's outputs, and each warp walks its range 32 keys at a
 * time. */
template <int NT, typename K, typename P>
static __device__ __forceinline__ void topk_emit(const K &key, int n, uint32_t prefix, int remaining,
						 topk_smem<NT> &sm, const P &put)
{
	constexpr int NW = NT / 32;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const unsigned lt = (1u << lane) - 1u;
	int per = ((n + NW - 1) / NW + 31) / 32 * 32;
	int lo = w * per, hi = min(n, lo + per);
	int above = 0, equal = 0;
	for (int i = lo + lane; i < hi; i += 32) {
		uint32_t kv = key(i);
		above += kv > prefix;
		equal += kv == prefix;
	}
	above = __reduce_add_sync(0xffffffffu, above);
	equal = __reduce_add_sync(0xffffffffu, equal);
	if (lane == 0)
		sm.w_above[w] = above, sm.w_equal[w] = equal;
	__syncthreads();
	if (threadIdx.x == 0) { /* where each warp's outputs start, and its equal keys taken */
		int at = 0, left = remaining;
		for (int i = 0; i < NW; i++) {
			int take = min(left, sm.w_equal[i]);
			sm.w_pos[i] = at, sm.w_take[i] = take;
			at += sm.w_above[i] + take, left -= take;
		}
	}
	__syncthreads();
	int pos = sm.w_pos[w], etake = sm.w_take[w], eseen = 0;
	for (int i0 = lo; i0 < hi; i0 += 32) {
		int i = i0 + lane;
		uint32_t kv = i < hi ? key(i) : 0;
		bool eq = i < hi && kv == prefix;
		unsigned em = __ballot_sync(0xffffffffu, eq);
		bool take = (i < hi && kv > prefix) || (eq && eseen + __popc(em & lt) < etake);
		unsigned tm = __ballot_sync(0xffffffffu, take);
		if (take)
			put(pos + __popc(tm & lt), i);
		pos += __popc(tm), eseen += __popc(em);
	}
}

/* Where a row's keys come from: the pooled array (pooled) or, POOL, the
 * level-1 scores pooled here (scores, the rows' pooling parameters). */
struct topk_src {
	const float *pooled, *scores;
	int ksize, stride, init_blocks, local_blocks;
};

/* A row's counts and its query block, from the device (sp). */
struct topk_row {
	int nblocks, n1, qb;
};
template <bool POOL>
static __device__ __forceinline__ topk_row topk_row_at(const sfwc_selpos &sp, int block, const topk_src &src, int r)
{
	int64_t len = *sp.pos + sp.len, pos0 = *sp.pos + sp.off;
	topk_row t;
	t.nblocks = (int)((len + block - 1) / block);
	t.n1 = POOL ? (int)sfw_nchunks(len, src.ksize, src.stride) : 0;
	t.qb = (int)((pos0 + r) / block);
	return t;
}

template <bool POOL>
static __device__ __forceinline__ uint32_t topk_key(const topk_src &src, const topk_row &t, int gr, int b, int block)
{
	return fkey(POOL ? pool_value(src.scores + (size_t)gr * t.n1, t.n1, b, t.qb, src.ksize, src.stride, block,
				      src.init_blocks, src.local_blocks)
			 : src.pooled[(size_t)gr * t.nblocks + b]);
}

/* One block of NT threads per (group, row): 256 when rows are many
 * (prefill), 1024 for the few rows of a decode step. SMEM: the row's keys
 * are read (pooled, when POOL) once into dynamic shared memory and every
 * later pass reads them there; without SMEM (rows longer than the device's
 * shared memory holds) each pass reads or pools them again. */
template <int NT, bool POOL, bool SMEM>
static __global__ void __launch_bounds__(NT)
	topk_kernel(int32_t *idx, const topk_src src, int T, int k, int block, const sfwc_selpos sp)
{
	sfwc_pdl_wait();
	extern __shared__ uint32_t ks[]; /* SMEM: the keys, [nblocks] */
	__shared__ topk_smem<NT> sm;
	const int gr = blockIdx.x;
	const topk_row t = topk_row_at<POOL>(sp, block, src, gr % T);
	/* the launch sized the keys' room for the bound of the rows' counts; a
	 * row past it reads its keys from global memory like a longer one */
	uint32_t room;
	asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(room));
	const bool in_smem = SMEM && (uint64_t)t.nblocks * sizeof(uint32_t) <= room;
	if (in_smem)
		for (int b = threadIdx.x; b < t.nblocks; b += NT)
			ks[b] = topk_key<POOL>(src, t, gr, b, block);
	auto key = [&](int b) { return in_smem ? ks[b] : topk_key<POOL>(src, t, gr, b, block); };
	int kk = min(t.nblocks, k), remaining;
	uint32_t prefix;
	topk_select<NT>(key, t.nblocks, kk, sm, prefix, remaining);
	int32_t *out = idx + (size_t)gr * k;
	const int qb = t.qb;
	topk_emit<NT>(key, t.nblocks, prefix, remaining, sm,
		      [&](int j, int b) { out[j] = b > qb ? -1 : (int32_t)b; });
	for (int i = kk + threadIdx.x; i < k; i += NT)
		out[i] = -1;
}

/* The decode form's split (few rows, many blocks): pass A, grid (rows,
 * parts), takes the top min(k, part) of each part of TOPK_PART blocks
 * (ties to the lower index, as the whole row's) and writes them in index
 * order to k candidate slots, the rest key 0 (below every real key: fkey
 * maps -inf to 0x007fffff); pass B takes the top kk of a row's parts * k
 * candidates. Under the order (key descending, index ascending) a row's
 * top k are among its parts' top k, and the candidates sit in index order,
 * so pass B's result is the whole row's. */
#define TOPK_PART 1024
#define TOPK_PART_NT 256
/* A row splits only past this many parts: at 2 parts (128K tokens) the
 * second launch cost more than the split saved (0.018 against 0.012 ms a
 * row on an H100, bench/RESULTS.md), at 16 (1M) the split is 0.13 of the
 * one-block form. */
#define TOPK_SPLIT_PARTS 4
template <bool POOL>
static __global__ void __launch_bounds__(TOPK_PART_NT)
	topk_part_kernel(uint32_t *ckey, int32_t *cidx, const topk_src src, int T, int k, int block, const sfwc_selpos sp)
{
	sfwc_pdl_wait();
	__shared__ uint32_t ks[TOPK_PART];
	__shared__ topk_smem<TOPK_PART_NT> sm;
	const int gr = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
	const topk_row t = topk_row_at<POOL>(sp, block, src, gr % T);
	/* parts of equal length, at most TOPK_PART (the launch sized the parts
	 * for the bound; a row past it would not fit: its blocks beyond are
	 * left out, which the launch's bound precondition excludes) */
	int per = min((t.nblocks + parts - 1) / parts, TOPK_PART);
	int b0 = part * per, n = max(0, min(t.nblocks, b0 + per) - b0);
	for (int i = threadIdx.x; i < n; i += TOPK_PART_NT)
		ks[i] = topk_key<POOL>(src, t, gr, b0 + i, block);
	auto key = [&](int i) { return ks[i]; };
	int kk = min(n, k), remaining;
	uint32_t prefix;
	topk_select<TOPK_PART_NT>(key, n, kk, sm, prefix, remaining);
	uint32_t *ok = ckey + ((size_t)gr * parts + part) * k;
	int32_t *oi = cidx + ((size_t)gr * parts + part) * k;
	topk_emit<TOPK_PART_NT>(key, n, prefix, remaining, sm, [&](int j, int i) { ok[j] = ks[i], oi[j] = b0 + i; });
	for (int j = kk + threadIdx.x; j < k; j += TOPK_PART_NT)
		ok[j] = 0, oi[j] = -1;
}

template <int NT>
static __global__ void __launch_bounds__(NT)
	topk_merge_kernel(int32_t *idx, const uint32_t *ckey, const int32_t *cidx, int T, int k, int parts, int block,
			  const sfwc_selpos sp)
{
	sfwc_pdl_wait();
	extern __shared__ uint32_t ks[]; /* the row's candidates' keys, [parts * k] */
	__shared__ topk_smem<NT> sm;
	const int gr = blockIdx.x, n = parts * k;
	const topk_row t = topk_row_at<false>(sp, block, topk_src{}, gr % T);
	const uint32_t *rk = ckey + (size_t)gr * n;
	const int32_t *ri = cidx + (size_t)gr * n;
	for (int i = threadIdx.x; i < n; i += NT)
		ks[i] = rk[i];
	auto key = [&](int i) { return ks[i]; };
	int kk = min(t.nblocks, k), remaining;
	uint32_t prefix;
	topk_select<NT>(key, n, kk, sm, prefix, remaining);
	int32_t *out = idx + (size_t)gr * k;
	const int qb = t.qb;
	topk_emit<NT>(key, n, prefix, remaining, sm, [&](int j, int i) {
		int32_t b = ri[i];
		out[j] = b > qb ? -1 : b;
	});
	for (int i = kk + threadIdx.x; i < k; i += NT)
		out[i] = -1;
}

/* The largest key array top-k keeps in shared memory on this device (0:
 * none), its kernels' limit raised to it; sfw_cuda_ctx_new asks once per
 * context (never while a stream is captured). */
#define TOPK_SMEM_RESERVE 4096 /* the kernels' static shared memory, and more */
template <typename F> static int topk_smem_raise(F *f, int bytes)
{
	return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

size_t sfwi_topk_smem_prepare(void)
{
	int dev = 0, optin = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&dev));
	SFW_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
	int bytes = optin - TOPK_SMEM_RESERVE;
	if (bytes <= 0)
		return 0;
	if (!(topk_smem_raise(topk_kernel<1024, false, true>, bytes) &&
	      topk_smem_raise(topk_kernel<1024, true, true>, bytes) &&
	      topk_smem_raise(topk_kernel<256, false, true>, bytes) &&
	      topk_smem_raise(topk_kernel<256, true, true>, bytes) && topk_smem_raise(topk_merge_kernel<1024>, bytes))) {
		(void)cudaGetLastError(); /* clear it: the global-memory form runs instead */
		return 0;
	}
	return (size_t)bytes;
}

/* Top-k over nkv * T rows whose keys are pooled (src.scores NULL) or pooled
 * here from the level-1 scores; nblocks bounds the rows' block counts. A
 * decode step's few rows of more than TOPK_SPLIT_PARTS parts split over
 * parts when the candidates fit in shared memory; else one block per row,
 * its keys in shared memory when they fit. */
static void topk_launch(int32_t *idx, const topk_src &src, int T, int nkv, int k, int block, int64_t nblocks,
			const sfwc_selpos &sp, struct sfw_cuda_ctx *cx)
{
	int rows = nkv * T;
	bool pool = src.scores != NULL, decode = rows < 64;
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	int64_t parts = (nblocks + TOPK_PART - 1) / TOPK_PART;
	size_t cand = (size_t)parts * k * sizeof(uint32_t);
	if (decode && parts > TOPK_SPLIT_PARTS && parts <= 65535 && cand <= cx->topk_smem) {
		size_t per_row = (size_t)parts * k;
		uint32_t *ckey = (uint32_t *)sfwi_cuda_scratch(cx, (size_t)rows * per_row * 8);
		int32_t *cidx = (int32_t *)(ckey + (size_t)rows * per_row);
		dim3 ga((unsigned)rows, (unsigned)parts);
		if (pool)
			sfwc_launch(topk_part_kernel<true>, ga, dim3(TOPK_PART_NT), 0, s, ckey, cidx, src, T, k, block, sp);
		else
			sfwc_launch(topk_part_kernel<false>, ga, dim3(TOPK_PART_NT), 0, s, ckey, cidx, src, T, k, block, sp);
		SFW_CUDA_LAUNCHED();
		sfwc_launch(topk_merge_kernel<1024>, dim3((unsigned)rows), dim3(1024), cand, s, idx, (const uint32_t *)ckey,
			    (const int32_t *)cidx, T, k, (int)parts, block, sp);
		SFW_CUDA_LAUNCHED();
		return;
	}
	size_t smem = (size_t)nblocks * sizeof(uint32_t);
	bool in_smem = smem <= cx->topk_smem;
	dim3 grid((unsigned)rows);
#define TOPK_GO(NT, POOL, SMEM) \
	sfwc_launch(topk_kernel<NT, POOL, SMEM>, grid, dim3(NT), SMEM ? smem : 0, s, idx, src, T, k, block, sp)
	if (decode && pool) {
		in_smem ? TOPK_GO(1024, true, true) : TOPK_GO(1024, true, false);
	} else if (decode) {
		in_smem ? TOPK_GO(1024, false, true) : TOPK_GO(1024, false, false);
	} else if (pool) {
		in_smem ? TOPK_GO(256, true, true) : TOPK_GO(256, true, false);
	} else {
		in_smem ? TOPK_GO(256, false, true) : TOPK_GO(256, false, false);
	}
#undef TOPK_GO
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_topk_blocks(int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh,
				     const struct sfw_cuda_rowref *rr, enum sfw_dtype act,
				     struct sfw_cuda_ctx *cx)
{
	(void)act;
	if (sh->T <= 0 || sh->nkv <= 0)
		return;
	SFW_ASSERT(sh->nblocks >= 1 && rr->pos);
	pool_bound_check(sh);
	topk_src src = {pooled, NULL, 0, 0, 0, 0};
	topk_launch(idx, src, sh->T, sh->nkv, sh->topk, sh->block, sh->nblocks, sfwc_selpos{rr->pos, rr->off, rr->len},
		    cx);
}

extern "C" void sfw_op_topk_blocks_cuda(int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh,
					enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	rr.len = twin_len(sh, 0, 1) - sh->pos0;
	sfw_cuda_topk_blocks(idx, pooled, sh, &rr, act, cx);
}

extern "C" void sfw_cuda_pool_topk(int32_t *idx, const float *scores, const struct sfw_sel_shape *sh,
				   const struct sfw_cuda_rowref *rr, struct sfw_cuda_ctx *cx)
{
	if (sh->T <= 0 || sh->nkv <= 0)
		return;
	SFW_ASSERT(sh->nblocks >= 1 && rr->pos);
	pool_bound_check(sh);
	topk_src src = {NULL, scores, sh->ksize, sh->stride, sh->init_blocks, sh->local_blocks};
	topk_launch(idx, src, sh->T, sh->nkv, sh->topk, sh->block, sh->nblocks, sfwc_selpos{rr->pos, rr->off, rr->len},
		    cx);
}

int sfw_cuda_pool_topk_fits(const struct sfw_sel_shape *sh, const struct sfw_cuda_ctx *cx)
{
	return (size_t)sh->nblocks * sizeof(uint32_t) <= cx->topk_smem;
}
