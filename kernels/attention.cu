/* attention.cu - CUDA twins of kernels/attention.c: dense causal and
 * block-sparse causal GQA attention (sparse layers).
 *
 * One block per (query row, KV group, split): the G = nh/nkv query heads of a
 * group share every K/V tile (GQA packing), so a tile of 32 keys is loaded
 * once for all of them. Warp w owns heads w and w+8: it scores its heads
 * against the tile (lane = key), keeps the online-softmax max/sum, and
 * accumulates P·V with lane = value column. Keys come in units of 32 tokens:
 * dense rows walk [0, p]; sparse rows walk the two halves of each selected
 * 64-token block (block order as in idx, which is ascending). Decode rows
 * (few rows, many keys) split their units over several blocks and merge the
 * partial (max, sum, o) in a second kernel (flash-decoding).
 *
 * An fp8 cache (struct sfw_cuda_kv's kv8; kernels/ops.h, "the fp8 KV
 * cache") is read by its own tile loader (kv8_tile): a 32-key tile is one
 * group of the layout, dequantized to fp32 as it is stored to shared memory,
 * so the scoring and P·V code is the same for both caches.
 *
 * Prefill-sized bf16 calls go to the tensor-core kernel (kernels/attn_tc.cu)
 * unless SALAFW_CUDA_ATTN=simt; SALAFW_CUDA_ATTN=tc sends every shape it
 * supports there (tests). */
#include "attn_tc.cuh"

#define ATT_THREADS 256
#define ATT_WARPS 8
#define ATT_KT 32

struct att_args {
	const void *q, *kc, *vc;
	const int32_t *idx; /* NULL: dense */
	void *o;
	float *part; /* split partials: [rows*nkv][nsplit][G][HD + 2] */
	int T, nh, nkv, k, block, nsplit;
	int64_t pos0; /* bounds the launch (dense: the cache holds at most pos0 + T tokens) */
	float scale;
	/* the position of row 0, read when the kernel runs */
	const int64_t *dpos;
	/* the cache's pages (ops_cuda.h, struct sfw_pages): NULL = contiguous */
	const int32_t *tab;
	int shift;
	/* non-NULL: kc, vc, tab read from these slots when the kernel runs
	 * (struct sfw_cuda_rowref; one sequence's recorded row) */
	void *const *pk, *const *pv;
	const int32_t *const *ptab;
	int kv8; /* the caches are fp8 (struct sfw_cuda_kv): the launch picks the kernel by it */
};

/* Unit u of row (r, g): the first token of a 32-key tile, or -1 when the
 * unit is empty (skipped block, or entirely in the future). */
static __device__ __forceinline__ int64_t unit_start(const att_args &a, const int32_t *sel, int u, int64_t p)
{
	if (!sel) {
		int64_t t0 = (int64_t)u * ATT_KT;
		return t0 <= p ? t0 : -1;
	}
	int per = a.block / ATT_KT; /* units per block */
	int b = sel[u / per];
	if (b < 0)
		return -1;
	int64_t t0 = (int64_t)b * a.block + (int64_t)(u % per) * ATT_KT;
	return t0 <= p ? t0 : -1;
}

/* A K/V tile is ATT_KT * HD / 8 vectors of 8 (vec8, cuda_act.cuh) per cache;
 * every thread loads its share of the next tile into registers while the
 * block works on the current one (independent loads: one memory latency per
 * tile, not one per element as scalar loads in a loop would cost). */
/* The tile of unit start t0 (tokens t0 .. t0 + ATT_KT - 1 of KV group g, at
 * cache rows r0 .. r0 + ATT_KT - 1: a tile never straddles two blocks of a
 * paged cache): thread-owned vectors i = threadIdx.x + n * ATT_THREADS;
 * tokens past p load as zeros (their scores are masked, their values
 * weighted 0). */
template <typename A, int HD>
struct kv_tile {
	static constexpr int NV = (ATT_KT * HD / 8 + ATT_THREADS - 1) / ATT_THREADS;
	vec8<A> k[NV], v[NV];
	/* kstride = nkv * HD elements from one row to the next */
	__device__ __forceinline__ void load(const void *kc, const void *vc, size_t kstride, int, int g, int64_t t0,
					     int64_t r0, int64_t p)
	{
#pragma unroll
		for (int n = 0; n < NV; n++) {
			int i = threadIdx.x + n * ATT_THREADS;
			int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
			int64_t t = t0 + j;
			if (i < ATT_KT * HD / 8 && t <= p) {
				size_t off = (size_t)(r0 + j) * kstride + (size_t)g * HD + c;
				k[n].load((const A *)kc + off), v[n].load((const A *)vc + off);
			} else {
				k[n].zero(), v[n].zero();
			}
		}
	}
	__device__ __forceinline__ void store(float (*Ks)[HD + 4], float (*Vs)[HD]) const
	{
#pragma unroll
		for (int n = 0; n < NV; n++) {
			int i = threadIdx.x + n * ATT_THREADS;
			if (i >= ATT_KT * HD / 8)
				break;
			int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
			float f[8];
			k[n].to_f32(f);
			*(float4 *)&Ks[j][c] = make_float4(f[0], f[1], f[2], f[3]);
			*(float4 *)&Ks[j][c + 4] = make_float4(f[4], f[5], f[6], f[7]);
			v[n].to_f32(f);
			*(float4 *)&Vs[j][c] = make_float4(f[0], f[1], f[2], f[3]);
			*(float4 *)&Vs[j][c + 4] = make_float4(f[4], f[5], f[6], f[7]);
		}
	}
};

/* The same tile of an fp8 cache: the tile's rows r0 .. r0 + 31 are one
 * group of the layout (r0 is a multiple of 32: tiles start at multiples of
 * 32 tokens, and a paged block holds whole groups), head g's codes are 32
 * rows of HD bytes (sfw_kv8_codes_off) and its scales 32 floats
 * (sfw_kv8_scale_off). Each thread holds the same 8-element vectors as
 * kv_tile (so the same shared-memory stores): one 8-byte load of 8 codes
 * and its row's scale per cache, dequantized (sfw_op_kv8_read_cpu's
 * values, bit for bit) when stored. */
template <int HD>
struct kv8_tile {
	static constexpr int NV = (ATT_KT * HD / 8 + ATT_THREADS - 1) / ATT_THREADS;
	uint2 k[NV], v[NV];
	float ks[NV], vs[NV]; /* the rows' scales times SFWC_E4M3_H2_UNIT */
	__device__ __forceinline__ void load(const void *kc, const void *vc, size_t, int nkv, int g, int64_t t0,
					     int64_t r0, int64_t p)
	{
		const uint8_t *kb = (const uint8_t *)kc, *vb = (const uint8_t *)vc;
#pragma unroll
		for (int n = 0; n < NV; n++) {
			int i = threadIdx.x + n * ATT_THREADS;
			int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
			int64_t t = t0 + j;
			if (i < ATT_KT * HD / 8 && t <= p) {
				size_t co = sfw_kv8_codes_off(r0 + j, g, nkv, HD) + c, so = sfw_kv8_scale_off(r0 + j, g, nkv, HD);
				k[n] = __ldg((const uint2 *)(kb + co)), v[n] = __ldg((const uint2 *)(vb + co));
				ks[n] = __ldg((const float *)(kb + so)) * SFWC_E4M3_H2_UNIT;
				vs[n] = __ldg((const float *)(vb + so)) * SFWC_E4M3_H2_UNIT;
			} else {
				k[n] = v[n] = make_uint2(0, 0), ks[n] = vs[n] = 0.0f;
			}
		}
	}
	__device__ __forceinline__ void store(float (*Ks)[HD + 4], float (*Vs)[HD]) const
	{
#pragma unroll
		for (int n = 0; n < NV; n++) {
			int i = threadIdx.x + n * ATT_THREADS;
			if (i >= ATT_KT * HD / 8)
				break;
			int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
			float f[8];
			sfwc_e4m3x8_f32(k[n], ks[n], f);
			*(float4 *)&Ks[j][c] = make_float4(f[0], f[1], f[2], f[3]);
			*(float4 *)&Ks[j][c + 4] = make_float4(f[4], f[5], f[6], f[7]);
			sfwc_e4m3x8_f32(v[n], vs[n], f);
			*(float4 *)&Vs[j][c] = make_float4(f[0], f[1], f[2], f[3]);
			*(float4 *)&Vs[j][c + 4] = make_float4(f[4], f[5], f[6], f[7]);
		}
	}
};

/* The tile loader of a cache: activations A, or (KV8) fp8. */
template <typename A, int HD, bool KV8> struct tile_of {
	typedef kv_tile<A, HD> type;
};
template <typename A, int HD> struct tile_of<A, HD, true> {
	typedef kv8_tile<HD> type;
};

/* The first unit in [u, u1) that is not empty (u1 when none). Uniform over
 * the block: every thread reads the same selection. */
static __device__ __forceinline__ int next_unit(const att_args &a, const int32_t *sel, int u, int u1, int64_t p,
						int64_t *t0)
{
	for (; u < u1; u++)
		if ((*t0 = unit_start(a, sel, u, p)) >= 0)
			return u;
	return u1;
}

/* Row r's caches, their block table and shift, and its position: the
 * call's, or sequence r's. */
static __device__ __forceinline__ int64_t row_seq(const att_args &a, const sfwc_one_seq &, int r, const void **kc,
						  const void **vc, const int32_t **tab, int *shift)
{
	*kc = a.pk ? *a.pk : a.kc, *vc = a.pv ? *a.pv : a.vc, *tab = a.ptab ? *a.ptab : a.tab, *shift = a.shift;
	return *a.dpos + r;
}

static __device__ __forceinline__ int64_t row_seq(const att_args &, const sfw_cuda_seqs &s, int r, const void **kc,
						  const void **vc, const int32_t **tab, int *shift)
{
	*kc = sfwc_seq_p(s, 0, r), *vc = sfwc_seq_p(s, 1, r), *tab = sfwc_seq_tab(s, r), *shift = sfwc_seq_shift(s);
	return sfwc_seq_pos(s, r);
}

/* Where row r's q and o sit among the call's rows. */
static __device__ __forceinline__ size_t row_at(const sfwc_one_seq &, int r)
{
	return (size_t)r;
}

static __device__ __forceinline__ size_t row_at(const sfw_cuda_seqs &s, int r)
{
	return (size_t)sfwc_seq_row(s, r);
}

template <typename A, int HD, int HPW, typename SQ, bool KV8>
static __global__ void __launch_bounds__(ATT_THREADS) attn_kernel(att_args a, const SQ sq)
{
	constexpr int CPL = HD / 32; /* value columns per lane */
	/* K rows padded by 4 floats: 16-byte loads, lanes 8 apart never share a bank */
	__shared__ __align__(16) float qs[ATT_WARPS * HPW][HD];
	__shared__ __align__(16) float Ks[ATT_KT][HD + 4];
	__shared__ __align__(16) float Vs[ATT_KT][HD];
	int r = blockIdx.x / a.nkv, g = blockIdx.x % a.nkv, split = blockIdx.y;
	int G = a.nh / a.nkv, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	if (!sfwc_seq_live(sq, r)) /* a recorded bucket's padding row */
		return;
	const void *kv, *vv;
	const int32_t *tab;
	int shift;
	int64_t p = row_seq(a, sq, r, &kv, &vv, &tab, &shift);
	const A *q = (const A *)a.q;
	const int32_t *sel = a.idx ? a.idx + ((size_t)g * a.T + r) * a.k : NULL;
	/* the row's sequence (positions and cache pointers: written by the host
	 * before the launch, never by a kernel) before the programmatic-launch
	 * wait; q, the caches and the selection after it */
	sfwc_pdl_wait();
	for (int i = threadIdx.x; i < ATT_WARPS * HPW * HD; i += ATT_THREADS)
		qs[i / HD][i % HD] = i < G * HD ? act_ld(q, (row_at(sq, r) * a.nh + (size_t)g * G) * HD + i) : 0.0f;
	int units = sel ? a.k * (a.block / ATT_KT) : (int)((p + ATT_KT) / ATT_KT);
	int per_split = (units + a.nsplit - 1) / a.nsplit;
	int u0 = split * per_split, u1 = min(units, u0 + per_split);
	float m[HPW], l[HPW], acc[HPW][CPL];
#pragma unroll
	for (int j = 0; j < HPW; j++) {
		m[j] = -INFINITY, l[j] = 0;
#pragma unroll
		for (int c = 0; c < CPL; c++)
			acc[j][c] = 0;
	}
	size_t kstride = (size_t)a.nkv * HD;
	typename tile_of<A, HD, KV8>::type tile;
	int64_t t0 = -1, tn = -1;
	int u = next_unit(a, sel, u0, u1, p, &t0);
	if (u < u1)
		tile.load(kv, vv, kstride, a.nkv, g, t0, sfwc_kv_row(tab, shift, t0), p);
	while (u < u1) {
		__syncthreads(); /* the previous tile is no longer read */
		tile.store(Ks, Vs);
		__syncthreads();
		/* the next tile's loads fly while this one is scored */
		int un = next_unit(a, sel, u + 1, u1, p, &tn);
		if (un < u1)
			tile.load(kv, vv, kstride, a.nkv, g, tn, sfwc_kv_row(tab, shift, tn), p);
		bool valid = t0 + lane <= p;
		/* scores of this warp's heads against key `lane`, all heads in one pass */
		float s[HPW];
#pragma unroll
		for (int j = 0; j < HPW; j++)
			s[j] = 0;
#pragma unroll 4
		for (int c = 0; c < HD; c += 4) {
			float4 kv = *(const float4 *)&Ks[lane][c];
#pragma unroll
			for (int j = 0; j < HPW; j++) {
				float4 qv = *(const float4 *)&qs[w + j * ATT_WARPS][c];
				s[j] = fmaf(qv.x, kv.x, s[j]);
				s[j] = fmaf(qv.y, kv.y, s[j]);
				s[j] = fmaf(qv.z, kv.z, s[j]);
				s[j] = fmaf(qv.w, kv.w, s[j]);
			}
		}
		float pe[HPW];
#pragma unroll
		for (int j = 0; j < HPW; j++) {
			float sj = valid ? s[j] * a.scale : -INFINITY;
			float mx = fmaxf(m[j], sfwc_warp_max(sj));
			pe[j] = valid ? expf(sj - mx) : 0.0f;
			float corr = m[j] == -INFINITY ? 0.0f : expf(m[j] - mx);
			l[j] = l[j] * corr + sfwc_warp_sum(pe[j]);
			m[j] = mx;
#pragma unroll
			for (int c = 0; c < CPL; c++)
				acc[j][c] *= corr;
		}
		for (int kk = 0; kk < ATT_KT; kk++) {
			float pk[HPW];
#pragma unroll
			for (int j = 0; j < HPW; j++)
				pk[j] = __shfl_sync(0xffffffffu, pe[j], kk);
#pragma unroll
			for (int c = 0; c < CPL; c++) {
				float vv = Vs[kk][lane + 32 * c];
#pragma unroll
				for (int j = 0; j < HPW; j++)
					acc[j][c] = fmaf(pk[j], vv, acc[j][c]);
			}
		}
		u = un, t0 = tn;
	}
#pragma unroll
	for (int j = 0; j < HPW; j++) {
		int hh = w + j * ATT_WARPS;
		if (hh >= G)
			break;
		if (a.nsplit == 1) {
			float inv = l[j] > 0 ? 1.0f / l[j] : 0.0f;
			size_t ob = (row_at(sq, r) * a.nh + (size_t)g * G + hh) * HD;
#pragma unroll
			for (int c = 0; c < CPL; c++)
				act_st((A *)a.o, ob + lane + 32 * c, acc[j][c] * inv);
		} else {
			float *pp = a.part + (((size_t)blockIdx.x * a.nsplit + split) * G + hh) * (HD + 2);
#pragma unroll
			for (int c = 0; c < CPL; c++)
				pp[lane + 32 * c] = acc[j][c];
			if (lane == 0)
				pp[HD] = m[j], pp[HD + 1] = l[j];
		}
	}
}

/* One block per (row, group, head), one thread per value column: warp 0
 * turns the splits' (max, sum) into weights in shared memory, then every
 * column sums its splits with independent loads. (A block per (row, group)
 * walking the splits serially cost ~150 µs per decode call.) */
#define ATT_MAXSPLIT 64
template <typename A, int HD, typename SQ>
static __global__ void __launch_bounds__(HD) attn_combine_kernel(att_args a, const SQ sq)
{
	__shared__ float wt[ATT_MAXSPLIT];
	__shared__ float s_l;
	int G = a.nh / a.nkv, rg = blockIdx.x, hh = blockIdx.y, c = threadIdx.x;
	int r = rg / a.nkv, g = rg % a.nkv;
	if (!sfwc_seq_live(sq, r)) /* before the wait: the step table is the host's */
		return;
	sfwc_pdl_wait();
	const float *base = a.part + ((size_t)rg * a.nsplit * G + hh) * (HD + 2);
	size_t sstride = (size_t)G * (HD + 2); /* one split to the next */
	if (threadIdx.x < 32) {
		int lane = threadIdx.x;
		float m0 = lane < a.nsplit ? base[lane * sstride + HD] : -INFINITY;
		float m1 = lane + 32 < a.nsplit ? base[(lane + 32) * sstride + HD] : -INFINITY;
		float M = sfwc_warp_max(fmaxf(m0, m1));
		float f0 = M == -INFINITY || m0 == -INFINITY ? 0.0f : expf(m0 - M);
		float f1 = M == -INFINITY || m1 == -INFINITY ? 0.0f : expf(m1 - M);
		float l = 0;
		if (lane < a.nsplit)
			l += base[lane * sstride + HD + 1] * f0;
		if (lane + 32 < a.nsplit)
			l += base[(lane + 32) * sstride + HD + 1] * f1;
		l = sfwc_warp_sum(l);
		wt[lane] = f0;
		wt[lane + 32] = f1;
		if (lane == 0)
			s_l = l;
	}
	__syncthreads();
	float o = 0;
#pragma unroll 8
	for (int sp = 0; sp < a.nsplit; sp++)
		o += wt[sp] * base[sp * sstride + c];
	float L = s_l;
	act_st((A *)a.o, (row_at(sq, r) * a.nh + (size_t)g * G + hh) * HD + c, L > 0 ? o / L : 0.0f);
}

template <typename A, int HD, bool KV8, typename SQ>
static void attn_launch(att_args a, const SQ &sq, int sms, struct sfw_cuda_ctx *cx)
{
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	int G = a.nh / a.nkv;
	int rows = a.T * a.nkv;
	int64_t maxkeys = a.idx ? (int64_t)a.k * a.block : a.pos0 + a.T;
	int units = (int)((maxkeys + ATT_KT - 1) / ATT_KT);
	int nsplit = 1;
	/* split-K only when the rows alone cannot fill the GPU */
	while (rows * nsplit < 2 * sms && units / (nsplit * 2) >= 1 && nsplit < ATT_MAXSPLIT)
		nsplit *= 2;
	size_t need = (size_t)rows * nsplit * G * (HD + 2) * sizeof(float);
	if (nsplit > 1)
		a.part = (float *)sfwi_cuda_scratch(cx, need);
	a.nsplit = nsplit;
	dim3 grid(rows, nsplit);
	if (G <= ATT_WARPS)
		sfwc_launch(attn_kernel<A, HD, 1, SQ, KV8>, dim3(grid), dim3(ATT_THREADS), 0, s, a, sq);
	else
		sfwc_launch(attn_kernel<A, HD, 2, SQ, KV8>, dim3(grid), dim3(ATT_THREADS), 0, s, a, sq);
	SFW_CUDA_LAUNCHED();
	if (nsplit > 1) {
		sfwc_launch(attn_combine_kernel<A, HD, SQ>, dim3(rows, G), dim3(HD), 0, s, a, sq);
		SFW_CUDA_LAUNCHED();
	}
}

template <bool KV8, typename SQ>
static void attn_hd(const att_args &a, const SQ &sq, int hd, enum sfw_dtype act, int sms, struct sfw_cuda_ctx *cx)
{
	switch (hd) {
	case 32: ACT_DISPATCH(act, attn_launch<A, 32, KV8>(a, sq, sms, cx)); break;
	case 64: ACT_DISPATCH(act, attn_launch<A, 64, KV8>(a, sq, sms, cx)); break;
	case 128: ACT_DISPATCH(act, attn_launch<A, 128, KV8>(a, sq, sms, cx)); break;
	default:
		fprintf(stderr, "salafw: attention head_dim %d is not supported on CUDA (32, 64, 128)\n", hd);
		abort();
	}
}

/* The CUDA-core attention of either cache kind (a.kv8). */
template <typename SQ>
static void attn_any(att_args a, const SQ &sq, int hd, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (a.T <= 0)
		return;
	SFW_ASSERT(a.nkv > 0 && a.nh % a.nkv == 0 && a.nh / a.nkv <= 2 * ATT_WARPS);
	SFW_ASSERT(!a.idx || a.block % ATT_KT == 0);
	int sms = sfwi_cuda_sms(cx);
	if (a.kv8)
		attn_hd<true>(a, sq, hd, act, sms, cx);
	else
		attn_hd<false>(a, sq, hd, act, sms, cx);
}

/* The one entry of each attention (ops_cuda.h): the row's position, and
 * where rr has them its caches, read on the device when the kernel runs. */
static att_args att_make(void *o, const void *q, const struct sfw_cuda_kv *kv, const int32_t *idx,
			 const struct sfw_attn_shape *sh, const struct sfw_cuda_rowref *rr)
{
	const struct sfw_pages *pg = kv->pg;
	SFW_ASSERT(rr->pos && !rr->k == !rr->v && (!rr->tab || pg));
	/* a table from a slot: pg gives its blocks' size (pg->tab unused) */
	int shift = rr->tab ? pg->shift : sfwc_pg_shift(pg);
	att_args a = {q,
		      kv->kc,
		      kv->vc,
		      idx,
		      o,
		      NULL,
		      sh->T,
		      sh->nh,
		      sh->nkv,
		      idx ? sh->topk : 0,
		      idx ? sh->block : 0,
		      1,
		      sh->pos0,
		      sh->scale,
		      rr->pos,
		      sfwc_pg_tab(pg),
		      shift,
		      rr->k,
		      rr->v,
		      rr->tab,
		      kv->kv8 != 0};
	return a;
}

extern "C" void sfw_cuda_attn_dense(void *o, const void *q, const struct sfw_cuda_kv *kv,
				    const struct sfw_attn_shape *sh, const struct sfw_cuda_rowref *rr,
				    enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	/* the split count is planned for pos0 + T keys; a split past the row's
	 * last key writes an empty partial (max -inf, sum 0). The tensor-core
	 * kernel takes the caches as given only. Both read either cache kind. */
	if (!rr->k && !rr->tab && sfwi_attn_tc(o, q, kv, NULL, sh, rr->pos, act, cx))
		return;
	attn_any(att_make(o, q, kv, NULL, sh, rr), sfwc_one_seq(), sh->hd, act, cx);
}

extern "C" void sfw_cuda_attn_sparse(void *o, const void *q, const struct sfw_cuda_kv *kv, const int32_t *idx,
				     const struct sfw_attn_shape *sh, const struct sfw_cuda_rowref *rr,
				     enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (!rr->k && !rr->tab && sfwi_attn_tc(o, q, kv, idx, sh, rr->pos, act, cx))
		return;
	attn_any(att_make(o, q, kv, idx, sh, rr), sfwc_one_seq(), sh->hd, act, cx);
}

/* The twins read the caches only (struct sfw_cuda_kv's pointers are not
 * const); their caches are in the activation dtype. */
extern "C" void sfw_op_attn_dense_cuda(void *o, const void *q, const void *kc, const void *vc,
				       const struct sfw_attn_shape *sh, enum sfw_dtype act,
				       struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_kv kv = {(void *)kc, (void *)vc, NULL, 0};
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	sfw_cuda_attn_dense(o, q, &kv, sh, &rr, act, cx);
}

extern "C" void sfw_op_attn_sparse_cuda(void *o, const void *q, const void *kc, const void *vc,
					const int32_t *idx, const struct sfw_attn_shape *sh,
					enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	struct sfw_cuda_kv kv = {(void *)kc, (void *)vc, NULL, 0};
	struct sfw_cuda_rowref rr = sfwc_rowref_at(sfw_cuda_ctx_pos(cx, sh->pos0));
	sfw_cuda_attn_sparse(o, q, &kv, idx, sh, &rr, act, cx);
}

/* ---- appending to the caches ---- */

/* One warp quantizes one (token, head) x[0 .. hd) into row `row`, head g
 * of an fp8 cache: sfw_op_kv8_write_cpu's arithmetic, bit for bit (amax
 * = max |x| over the head, its scale and reciprocal by sfw_kv8_scale_of,
 * code_i = sfw_e4m3_from_f32(x_i * inv)). Lanes take elements lane, lane
 * + 32, ...: a warp's code stores fill 32 consecutive bytes. */
template <typename A>
static __device__ __forceinline__ void kv8_quant_head(uint8_t *c, int64_t row, int g, int nkv, int hd, const A *x,
						      int lane)
{
	float amax = 0.0f; /* NaN never wins, as in the twin's compare */
	for (int i = lane; i < hd; i += 32)
		amax = fmaxf(amax, fabsf(act_ld(x, i)));
	amax = sfwc_warp_max(amax);
	float s, inv;
	sfw_kv8_scale_of(amax, &s, &inv);
	uint8_t *codes = c + sfw_kv8_codes_off(row, g, nkv, hd);
	for (int i = lane; i < hd; i += 32)
		codes[i] = sfw_e4m3_from_f32(__fmul_rn(act_ld(x, i), inv));
	if (lane == 0)
		*(float *)(c + sfw_kv8_scale_off(row, g, nkv, hd)) = s;
}

/* One token's K and V ([nkv, hd] each at k, v) into cache row `row` of an
 * fp8 pair: the block's warps take the 2 nkv (cache, head) pairs. */
template <typename A>
static __device__ __forceinline__ void kv8_quant_row(uint8_t *kc, uint8_t *vc, const A *k, const A *v, int64_t row,
						     int nkv, int hd)
{
	int lane = threadIdx.x & 31;
	for (int w = threadIdx.x >> 5; w < 2 * nkv; w += blockDim.x >> 5) {
		int g = w >> 1;
		size_t src = (size_t)g * hd;
		if (w & 1)
			kv8_quant_head(vc, row, g, nkv, hd, v + src, lane);
		else
			kv8_quant_head(kc, row, g, nkv, hd, k + src, lane);
	}
}

/* Threads of a quantizing block: a warp per (cache, head), at most 8. */
static unsigned kv8_threads(int nkv)
{
	return 32u * (unsigned)(2 * nkv < 8 ? 2 * nkv : 8);
}

/* T tokens' K and V rows (n vectors of V each) from rows 0 .. T-1 of k, v to
 * the cache rows of tokens *dpos + r: one block per token. */
template <typename V>
static __global__ void kv_write_kernel(V *kc, V *vc, const V *k, const V *v, int n, const int64_t *dpos,
				       const int32_t *tab, int shift)
{
	sfwc_pdl_wait();
	int r = blockIdx.x;
	size_t base = (size_t)sfwc_kv_row(tab, shift, *dpos + r) * (size_t)n, src = (size_t)r * n;
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		kc[base + i] = k[src + i];
		vc[base + i] = v[src + i];
	}
}

/* The same into an fp8 pair: token r's rows of k, v ([T, nkv, hd] in A)
 * quantized into the cache row of token *dpos + r; one block per token. */
template <typename A>
static __global__ void kv8_write_kernel(uint8_t *kc, uint8_t *vc, const A *k, const A *v, int nkv, int hd,
					const int64_t *dpos, const int32_t *tab, int shift)
{
	sfwc_pdl_wait();
	int r = blockIdx.x;
	size_t src = (size_t)r * nkv * hd;
	kv8_quant_row(kc, vc, k + src, v + src, sfwc_kv_row(tab, shift, *dpos + r), nkv, hd);
}

static void kv_write(void *kc, void *vc, const struct sfw_pages *pg, const void *k, const void *v,
		     size_t row_bytes, const int64_t *dpos, int T, cudaStream_t s)
{
	SFW_ASSERT(row_bytes % 2 == 0 && row_bytes / 2 <= INT32_MAX && T >= 1);
	uintptr_t al = (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v | (uintptr_t)row_bytes;
	const int32_t *tab = sfwc_pg_tab(pg);
	int shift = sfwc_pg_shift(pg);
	if (al % 16 == 0)
		sfwc_launch(kv_write_kernel<uint4>, dim3((unsigned)T), dim3(256), 0, s, (uint4 *)kc, (uint4 *)vc,
			    (const uint4 *)k, (const uint4 *)v, (int)(row_bytes / 16), dpos, tab, shift);
	else
		sfwc_launch(kv_write_kernel<uint16_t>, dim3((unsigned)T), dim3(256), 0, s, (uint16_t *)kc,
			    (uint16_t *)vc, (const uint16_t *)k, (const uint16_t *)v, (int)(row_bytes / 2), dpos, tab,
			    shift);
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_kv_write(const struct sfw_cuda_kv *kv, const void *k, const void *v, int nkv, int hd, int T,
				  const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	if (T <= 0)
		return;
	SFW_ASSERT(rr->pos && !rr->k && !rr->tab); /* the caches as given, the position from the device */
	SFW_ASSERT(nkv >= 1 && hd >= 1 && (act == SFW_DTYPE_BF16 || act == SFW_DTYPE_F32));
	cudaStream_t s = SFW_CUDA_STREAM(cx->stream);
	if (!kv->kv8) {
		kv_write(kv->kc, kv->vc, kv->pg, k, v, (size_t)nkv * hd * (act == SFW_DTYPE_BF16 ? 2 : 4), rr->pos, T, s);
		return;
	}
	ACT_DISPATCH(act, sfwc_launch(kv8_write_kernel<A>, dim3((unsigned)T), dim3(kv8_threads(nkv)), 0, s,
				      (uint8_t *)kv->kc, (uint8_t *)kv->vc, (const A *)k, (const A *)v, nkv, hd, rr->pos,
				      sfwc_pg_tab(kv->pg), sfwc_pg_shift(kv->pg)));
	SFW_CUDA_LAUNCHED();
}

/* ---- a batched decode step: one row per sequence (ops_cuda.h) ---- */

extern "C" void sfw_cuda_attn_dense_seqs(void *o, const void *q, const struct sfw_cuda_seqs *s,
					 const struct sfw_attn_shape *sh, enum sfw_dtype act,
					 struct sfw_cuda_ctx *cx)
{
	int nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
	float scale = sh->scale;
	SFW_ASSERT(s->n >= 1 && s->n <= SFW_CUDA_SEQS_MAX && s->st && s->sp);
	/* pos0 + T = the longest row's keys: it plans the split count; a split
	 * past a shorter row's last key writes an empty partial */
	att_args a = {q,     NULL, NULL, NULL, o,    NULL, s->n, nh,   nkv,  0,	  0,
		      1,     s->maxpos + 1 - s->n, scale, NULL, NULL, 0,    NULL, NULL, NULL,
		      s->kv8 != 0};
	attn_any(a, *s, hd, act, cx);
}

/* Row row[b] of k and v (nv vectors of 16 bytes, or of 2) to row pos[b] of
 * sequence b's caches. */
template <typename V>
static __global__ void kv_append_seqs_kernel(const sfw_cuda_seqs S, const V *k, const V *v, int nv)
{
	int b = blockIdx.x; /* its sequence before the wait: the host's table */
	if (!sfwc_seq_live(S, b))
		return;
	V *kc = (V *)sfwc_seq_p(S, 0, b), *vc = (V *)sfwc_seq_p(S, 1, b);
	size_t base = (size_t)sfwc_kv_row(sfwc_seq_tab(S, b), sfwc_seq_shift(S), sfwc_seq_pos(S, b)) * (size_t)nv;
	size_t src = (size_t)sfwc_seq_row(S, b) * (size_t)nv;
	sfwc_pdl_wait();
	for (int i = threadIdx.x; i < nv; i += blockDim.x) {
		kc[base + i] = k[src + i];
		vc[base + i] = v[src + i];
	}
}

/* The same into fp8 pairs: row row[b] of k, v ([nkv, hd] in A) quantized
 * into row pos[b] of sequence b's caches. */
template <typename A>
static __global__ void kv8_append_seqs_kernel(const sfw_cuda_seqs S, const A *k, const A *v, int nkv, int hd)
{
	int b = blockIdx.x; /* its sequence before the wait: the host's table */
	if (!sfwc_seq_live(S, b))
		return;
	uint8_t *kc = (uint8_t *)sfwc_seq_p(S, 0, b), *vc = (uint8_t *)sfwc_seq_p(S, 1, b);
	int64_t row = sfwc_kv_row(sfwc_seq_tab(S, b), sfwc_seq_shift(S), sfwc_seq_pos(S, b));
	size_t src = (size_t)sfwc_seq_row(S, b) * nkv * hd;
	sfwc_pdl_wait();
	kv8_quant_row(kc, vc, k + src, v + src, row, nkv, hd);
}

extern "C" void sfw_cuda_kv_append_seqs(const struct sfw_cuda_seqs *s, const void *k, const void *v, int nkv, int hd,
					enum sfw_dtype act, struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(s->n >= 1 && s->n <= SFW_CUDA_SEQS_MAX && nkv >= 1 && hd >= 1);
	SFW_ASSERT(act == SFW_DTYPE_BF16 || act == SFW_DTYPE_F32);
	cudaStream_t st = SFW_CUDA_STREAM(cx->stream);
	if (s->kv8) {
		ACT_DISPATCH(act, sfwc_launch(kv8_append_seqs_kernel<A>, dim3(s->n), dim3(kv8_threads(nkv)), 0, st, *s,
					      (const A *)k, (const A *)v, nkv, hd));
		SFW_CUDA_LAUNCHED();
		return;
	}
	size_t row_bytes = (size_t)nkv * hd * (act == SFW_DTYPE_BF16 ? 2 : 4);
	SFW_ASSERT(row_bytes / 2 <= INT32_MAX);
	/* the caches: cudaMalloc'd or pool blocks, rows of row_bytes */
	uintptr_t al = (uintptr_t)k | (uintptr_t)v | (uintptr_t)row_bytes;
	if (al % 16 == 0)
		sfwc_launch(kv_append_seqs_kernel<uint4>, dim3(s->n), dim3(256), 0, st, *s, (const uint4 *)k,
			    (const uint4 *)v, (int)(row_bytes / 16));
	else
		sfwc_launch(kv_append_seqs_kernel<uint16_t>, dim3(s->n), dim3(256), 0, st, *s, (const uint16_t *)k,
			    (const uint16_t *)v, (int)(row_bytes / 2));
	SFW_CUDA_LAUNCHED();
}
