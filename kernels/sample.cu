/* sample.cu - next-token choice on the GPU (CPU twin: kernels/sample.c, the
 * meaning: kernels/ops.h, sfw_op_sample_cpu). One block of SFWS_THREADS
 * threads; thread t owns the contiguous vocabulary chunk [t*C, (t+1)*C), so
 * every double sum runs in the order the twin uses and the two agree
 * exactly. The survivors of top-k / top-p come from a radix select of the
 * best S <= SFWS_MAX_SORT candidate keys and a bitonic sort in shared
 * memory; the sequential walks (nucleus, draw) are thread 0's. Only the id
 * (4 bytes) has to reach the host. A launch chooses for up to
 * SFW_CUDA_SEQS_MAX rows at once, one block each (a batched step's rows:
 * one launch instead of one per row). min-p is applied here, the
 * penalties and logit biases on a copy of the row (adjust_kernel, in scratch
 * taken in stream order), and the logprobs are written to scratch and copied
 * to the caller's struct (the twin's arithmetic; log() is CUDA's, within an
 * ulp of the host's before the float rounding). */
#include "cuda_common.cuh"

extern "C" {
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
}
#include <stdlib.h>
#include <string.h>
#include "kernels/sample_twin.h"

static __device__ __forceinline__ bool is_cand(float l)
{
	return !isnan(l) && l != -INFINITY;
}

/* a candidate that min-p keeps (the twin's surv) */
static __device__ __forceinline__ bool surv(float l, float max, float min_p)
{
	return is_cand(l) && (min_p <= 0.0f || sfws_exp(SFWS_SUB(l, max)) >= min_p);
}

struct red {
	float bv;
	int best, inf, n, last;
	float mx;
};

static __device__ __forceinline__ void combine(red &a, const red &b)
{
	if (b.best >= 0 && (a.best < 0 || b.bv > a.bv || (b.bv == a.bv && b.best < a.best)))
		a.bv = b.bv, a.best = b.best;
	a.inf = min(a.inf, b.inf);
	a.n += b.n;
	a.last = max(a.last, b.last);
	a.mx = fmaxf(a.mx, b.mx);
}

/* combine over the 32 lanes of a warp (a butterfly: every lane ends with the
 * warp's result; combine is exact and symmetric, so the order is free) */
static __device__ __forceinline__ void warp_combine(red &m)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		red b;
		b.bv = __shfl_xor_sync(0xffffffffu, m.bv, o);
		b.best = __shfl_xor_sync(0xffffffffu, m.best, o);
		b.inf = __shfl_xor_sync(0xffffffffu, m.inf, o);
		b.n = __shfl_xor_sync(0xffffffffu, m.n, o);
		b.last = __shfl_xor_sync(0xffffffffu, m.last, o);
		b.mx = __shfl_xor_sync(0xffffffffu, m.mx, o);
		combine(m, b);
	}
}

/* The penalties and biases of n entries on a row (its copy), one thread an
 * entry (distinct ids), as the twin's adjust(): rounded op by op. */
static __global__ void adjust_kernel(float *lg, int V, const struct sfw_sample_adj *a, int n, float rep, float pres,
				     float freq)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n || a[i].id < 0 || a[i].id >= V)
		return;
	float l = lg[a[i].id];
	if (a[i].seen && rep > 0.0f && rep != 1.0f)
		l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
	l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)a[i].count, freq), a[i].count > 0 ? pres : 0.0f));
	lg[a[i].id] = __fadd_rn(l, a[i].bias);
}

/* Block b: logits row row[b] of lg (or its penalised copy lgp[b]) into
 * out[row[b]], with its parameters. */
struct sample_rows {
	int32_t *out;
	const float *lg;
	const float *lgp[SFW_CUDA_SEQS_MAX];
	int V;
	int row[SFW_CUDA_SEQS_MAX], top_k[SFW_CUDA_SEQS_MAX], greedy[SFW_CUDA_SEQS_MAX];
	float inv_t[SFW_CUDA_SEQS_MAX], top_p[SFW_CUDA_SEQS_MAX], min_p[SFW_CUDA_SEQS_MAX];
	int host[SFW_CUDA_SEQS_MAX];		      /* scratch could not be had: the host's (-1) */
	struct sfw_sample_lp *lpo[SFW_CUDA_SEQS_MAX]; /* logprobs out (device), or NULL */
	int top[SFW_CUDA_SEQS_MAX];
	double u[SFW_CUDA_SEQS_MAX];
};

/* The best logit (lowest id among equals), the first +inf, the count, last
 * id and max of the candidates of row lg: exact and independent of who looks
 * at which logit, so this pass reads the logits strided over the block
 * (coalesced, eight loads in flight) and reduces with shuffles, then over
 * the warps through r (every thread gets the block's result); the sums of
 * the kernel keep the twin's chunks. */
static __device__ __forceinline__ red smp_scan(const float *lg, int V, red *r, int t)
{
	red m = {0.0f, -1, INT_MAX, 0, -1, -INFINITY};
	auto look = [&](int i, float l) {
		if (isnan(l))
			return;
		if (m.best < 0 || l > m.bv)
			m.bv = l, m.best = i;
		if (l == INFINITY) {
			m.inf = min(m.inf, i);
		} else if (l != -INFINITY) {
			m.n++;
			m.mx = fmaxf(m.mx, l);
			m.last = i;
		}
	};
	int i = t;
	for (; i + 7 * SFWS_THREADS < V; i += 8 * SFWS_THREADS) {
		float l[8];
#pragma unroll
		for (int j = 0; j < 8; j++)
			l[j] = __ldg(lg + i + j * SFWS_THREADS);
#pragma unroll
		for (int j = 0; j < 8; j++)
			look(i + j * SFWS_THREADS, l[j]);
	}
	for (; i < V; i += SFWS_THREADS)
		look(i, __ldg(lg + i));
	warp_combine(m);
	if ((t & 31) == 0)
		r[t >> 5] = m;
	__syncthreads();
	if (t < 32) {
		m = r[t];
		warp_combine(m);
		if (t == 0)
			r[32] = m;
	}
	__syncthreads();
	return r[32];
}

/* thread 0 of the id-order draw (no top-k, no top-p): the row's total from
 * the chunks' sums part, the chunk holding u * total, then its survivor
 * (or force); the choice into *out, its logprob into lpo; the total into
 * *tot for the top survivors' logprobs */
static __device__ __forceinline__ void smp_draw_ids(const float *lg, int V, int C, const double *part,
						    double u, float max, float it, float min_p, int force,
						    int last, int32_t *out, struct sfw_sample_lp *lpo,
						    double *tot)
{
	double total = 0;
	for (int c = 0; c < SFWS_THREADS; c++)
		total += part[c];
	double target = u * total, start = 0;
	int id = -1;
	for (int c = 0; force < 0 && id < 0 && c < SFWS_THREADS; c++) {
		if (target < start + part[c]) {
			double acc = start;
			for (int i = c * C; i < V && i < (c + 1) * C; i++) {
				if (!surv(lg[i], max, min_p))
					continue;
				acc += sfws_exp(SFWS_MUL(SFWS_SUB(lg[i], max), it));
				if (target < acc) {
					id = i;
					break;
				}
			}
		}
		start += part[c];
	}
	if (force >= 0)
		id = force;
	if (id < 0) { /* rounding: the last survivor */
		id = last;
		while (min_p > 0.0f && id > 0 && !surv(lg[id], max, min_p))
			id--;
	}
	*out = id;
	if (lpo) {
		lpo->logprob = (float)log(sfws_exp(SFWS_MUL(SFWS_SUB(lg[id], max), it)) / total);
		lpo->n_top = 0;
	}
	*tot = total;
}

/* the S-th largest candidate key of the row (thread t's chunk i0..i1): a
 * radix select, 8 bits a pass, the count still wanted in need (set by the
 * caller, with prefix = mask = 0, before a barrier) */
static __device__ __forceinline__ unsigned long long smp_select(const float *lg, int i0, int i1, int t,
								int *hist, unsigned long long &prefix,
								unsigned long long &mask, int &need)
{
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int b = t; b < 256; b += SFWS_THREADS)
			hist[b] = 0;
		__syncthreads();
		const unsigned long long pf = prefix, mk = mask;
		for (int i = i0; i < i1; i++) {
			float l = lg[i];
			if (!is_cand(l))
				continue;
			unsigned long long k = sfws_key(l, i);
			if ((k & mk) == pf)
				atomicAdd(&hist[(k >> shift) & 255], 1);
		}
		__syncthreads();
		if (t == 0) {
			for (int b = 255; b >= 0; b--) {
				if (hist[b] >= need) {
					prefix |= (unsigned long long)b << shift;
					break;
				}
				need -= hist[b];
			}
			mask |= 255ull << shift;
		}
		__syncthreads();
	}
	return prefix;
}

/* the candidate keys >= kth into keys (cnt = 0 set before a barrier),
 * zeros after them, sorted descending (a bitonic sort) */
static __device__ __forceinline__ void smp_gather_sort(const float *lg, int i0, int i1, int t,
						       unsigned long long kth, unsigned long long *keys,
						       int *cnt)
{
	for (int i = t; i < SFWS_MAX_SORT; i += SFWS_THREADS)
		keys[i] = 0;
	__syncthreads();
	for (int i = i0; i < i1; i++) {
		float l = lg[i];
		if (!is_cand(l))
			continue;
		unsigned long long k = sfws_key(l, i);
		if (k >= kth)
			keys[atomicAdd(cnt, 1)] = k;
	}
	__syncthreads();
	for (int k = 2; k <= SFWS_MAX_SORT; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			for (int a = t; a < SFWS_MAX_SORT; a += SFWS_THREADS) {
				int b = a ^ j;
				if (b > a) {
					unsigned long long x = keys[a], y = keys[b];
					bool desc = (a & k) == 0;
					if (desc ? x < y : x > y)
						keys[a] = y, keys[b] = x;
				}
			}
			__syncthreads();
		}
}

/* the id-order draw's top survivors (a prefix of the best S candidates)
 * and their logprobs over its total tot */
static __device__ __forceinline__ void smp_top_survivors(const unsigned long long *keys, int S, float max,
							 float it, float min_p, const double *tot,
							 struct sfw_sample_lp *lpo)
{
	int nt = 0;
	while (nt < S && surv(sfws_key_logit(keys[nt]), max, min_p))
		nt++;
	lpo->n_top = nt;
	for (int i = 0; i < nt; i++) {
		lpo->top_id[i] = sfws_key_id(keys[i]);
		lpo->top_logprob[i] =
		    (float)log(sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(keys[i]), max), it)) / *tot);
	}
}

/* top-p over the sorted keys: the count mm of the nucleus (of S; the
 * total over the top kk, or all candidates' from part), or -1 when it is
 * wider than SFWS_MAX_SORT (the host finishes) */
static __device__ __forceinline__ int smp_nucleus(const unsigned long long *keys, const double *part, int S,
						  int kk, int n, float top_p, float max)
{
	double total = 0, acc = 0;
	if (kk)
		for (int i = 0; i < kk; i++)
			total += sfws_exp(SFWS_SUB(sfws_key_logit(keys[i]), max));
	else
		for (int c = 0; c < SFWS_THREADS; c++)
			total += part[c];
	double want = (double)top_p * total;
	for (int i = 0; i < S; i++) {
		acc += sfws_exp(SFWS_SUB(sfws_key_logit(keys[i]), max));
		if (acc >= want)
			return i + 1;
	}
	return !kk && n > S ? -1 : S;
}

/* the draw from the first mm sorted keys (or the argmax, force), into
 * *out, and its logprobs */
static __device__ __forceinline__ void smp_draw_sorted(const unsigned long long *keys, int mm, double u,
						       float max, float it, int force, int top, int32_t *out,
						       struct sfw_sample_lp *lpo)
{
	double sum = 0, acc = 0;
	for (int i = 0; i < mm; i++)
		sum += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(keys[i]), max), it));
	double target = u * sum;
	int ci = mm - 1; /* the chosen key's index */
	for (int i = 0; force < 0 && i < mm; i++) {
		acc += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(keys[i]), max), it));
		if (target < acc) {
			ci = i;
			break;
		}
	}
	if (force >= 0)
		ci = 0; /* the argmax: the best key */
	*out = sfws_key_id(keys[ci]);
	if (lpo) {
		lpo->logprob =
		    (float)log(sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(keys[ci]), max), it)) / sum);
		lpo->n_top = min(top, mm);
		for (int i = 0; i < lpo->n_top; i++) {
			lpo->top_id[i] = sfws_key_id(keys[i]);
			lpo->top_logprob[i] =
			    (float)log(sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(keys[i]), max), it)) / sum);
		}
	}
}

/* a certain choice: id, with logprob 0 (and itself the one top entry) */
static __device__ __forceinline__ void smp_certain(int id, int top, int32_t *out, struct sfw_sample_lp *lpo)
{
	*out = id;
	if (lpo) {
		lpo->logprob = 0.0f;
		lpo->n_top = top ? 1 : 0;
		lpo->top_id[0] = id;
		lpo->top_logprob[0] = 0.0f;
	}
}

static __global__ void __launch_bounds__(SFWS_THREADS) sample_kernel(const sample_rows R)
{
	sfwc_pdl_wait();
	const int b = blockIdx.x, V = R.V, top_k = R.top_k[b], greedy = R.greedy[b];
	const float inv_t = R.inv_t[b], top_p = R.top_p[b], min_p = R.min_p[b];
	const double u = R.u[b];
	const float *lg = R.lgp[b] ? R.lgp[b] : R.lg + (size_t)R.row[b] * V;
	int32_t *out = R.out + R.row[b];
	struct sfw_sample_lp *const lpo = R.lpo[b];
	const int top = R.top[b];
	if (R.host[b]) {
		if (threadIdx.x == 0)
			*out = -1;
		return;
	}
	__shared__ red r[SFWS_THREADS];
	__shared__ double part[SFWS_THREADS];
	__shared__ unsigned long long keys[SFWS_MAX_SORT];
	__shared__ int hist[256];
	__shared__ unsigned long long prefix, mask;
	__shared__ int need, cnt, S;
	__shared__ double tot; /* the id-order draw's sum (its logprobs) */
	const int t = threadIdx.x, C = (V + SFWS_THREADS - 1) / SFWS_THREADS;
	const int i0 = t * C, i1 = min(V, i0 + C);
	const red g = smp_scan(lg, V, r, t);
	const int best = g.best < 0 ? 0 : g.best;
	/* greedy, temperature 0 (inv_t = 0 passed), no candidate, or +inf; a
	 * greedy choice asking for logprobs goes on at temperature 1 with the
	 * draw replaced by the argmax (force), as the twin does */
	const int gr = greedy || inv_t == 0.0f;
	if (g.n == 0 || g.inf != INT_MAX || (gr && !lpo)) {
		if (t == 0)
			smp_certain(g.inf != INT_MAX ? g.inf : best, top, out, lpo);
		return;
	}
	const int force = gr ? best : -1;
	const float it = gr ? 1.0f : inv_t;
	const float max = g.mx;
	const int n = g.n, kk = top_k > 0 && top_k < n ? top_k : 0, cut_p = top_p < 1.0f;
	if (kk > SFWS_MAX_SORT) {
		if (t == 0)
			*out = -1; /* the host finishes */
		return;
	}
	int nocut = 0; /* the id-order draw made; S: its top survivors for the logprobs */
	if (!kk) {
		double s = 0;
		for (int i = i0; i < i1; i++)
			if (cut_p ? is_cand(lg[i]) : surv(lg[i], max, min_p))
				s += cut_p ? sfws_exp(SFWS_SUB(lg[i], max))
					   : sfws_exp(SFWS_MUL(SFWS_SUB(lg[i], max), it));
		part[t] = s;
		__syncthreads();
		if (!cut_p) { /* draw in id order */
			if (t == 0)
				smp_draw_ids(lg, V, C, part, u, max, it, min_p, force, g.last, out, lpo,
					     &tot);
			if (!lpo || top == 0)
				return;
			nocut = 1; /* the top survivors: a select of the best top candidates */
		}
	}
	/* the best S candidates: radix select of the S-th largest key (keys
	 * are unique: the id is part of them), then gather and sort */
	if (t == 0) {
		S = nocut ? min(top, n) : kk ? kk : min(n, SFWS_MAX_SORT);
		need = S;
		prefix = 0, mask = 0, cnt = 0;
	}
	__syncthreads();
	const unsigned long long kth = smp_select(lg, i0, i1, t, hist, prefix, mask, need);
	smp_gather_sort(lg, i0, i1, t, kth, keys, &cnt);
	if (t != 0)
		return;
	if (nocut) { /* survivors are a prefix of the best candidates */
		smp_top_survivors(keys, S, max, it, min_p, &tot, lpo);
		return;
	}
	int mm = S;
	if (cut_p && (mm = smp_nucleus(keys, part, S, kk, n, top_p, max)) < 0) {
		*out = -1; /* the nucleus is wider than SFWS_MAX_SORT: the host finishes */
		return;
	}
	/* min-p: a prefix of the survivors (the best has weight 1) */
	while (min_p > 0.0f && mm > 1 && !(sfws_exp(SFWS_SUB(sfws_key_logit(keys[mm - 1]), max)) >= min_p))
		mm--;
	smp_draw_sorted(keys, mm, u, max, it, force, top, out, lpo);
}

extern "C" void sfw_cuda_sample_rows(int32_t *out, const float *logits, int V, int n,
				     const struct sfw_op_sample_params *const *p, const double *u, struct sfw_cuda_ctx *cx)
{
	SFW_ASSERT(n >= 0 && n <= SFW_CUDA_SEQS_MAX);
	cudaStream_t st = SFW_CUDA_STREAM(cx->stream);
	sample_rows R;
	memset(&R, 0, sizeof(R));
	R.out = out, R.lg = logits, R.V = V;
	/* scratch in stream order, one allocation: the rows with penalties or
	 * biases (a copy of the row adjusted on the device), the logprobs of the
	 * rows that ask for them, then the penalties' entries; when it cannot be
	 * had, those rows are the host's */
	size_t na = 0;
	int nr = 0, nl = 0;
	for (int i = 0; i < n; i++) {
		if (!p[i])
			continue;
		if (p[i]->n_adj > 0)
			na += (size_t)p[i]->n_adj, nr++;
		nl += p[i]->logprobs != NULL;
	}
	const size_t lp_at = (size_t)nr * V * sizeof(float),
		     adj_at = lp_at + (size_t)nl * sizeof(struct sfw_sample_lp);
	char *scratch = NULL;
	struct sfw_sample_adj *ha = NULL;
	if ((nr || nl) && (!na || (ha = (struct sfw_sample_adj *)malloc(na * sizeof(*ha)))) &&
	    cudaMallocAsync((void **)&scratch, adj_at + na * sizeof(*ha), st) != cudaSuccess) {
		cudaGetLastError(); /* not sticky: the rows go to the host */
		scratch = NULL;
	}
	if (scratch && na) {
		size_t k = 0;
		for (int i = 0; i < n; i++)
			if (p[i] && p[i]->n_adj > 0) {
				memcpy(ha + k, p[i]->adj, (size_t)p[i]->n_adj * sizeof(*ha));
				k += (size_t)p[i]->n_adj;
			}
		/* pageable memory: staged before the call returns, so ha may go */
		SFW_CUDA_CHECK(
		    cudaMemcpyAsync(scratch + adj_at, ha, na * sizeof(*ha), cudaMemcpyHostToDevice, st));
	}
	free(ha);
	int nb = 0, kr = 0, kl = 0;
	size_t ka = 0;
	for (int i = 0; i < n; i++) {
		if (!p[i])
			continue;
		/* inv_t as the twin computes it; 0 marks greedy / temperature 0 */
		float inv_t = p[i]->temperature == 0.0f ? 0.0f : 1.0f / p[i]->temperature;
		if (!isfinite(inv_t)) /* the greedy limit, as the twin takes it */
			inv_t = 0.0f;
		R.row[nb] = i, R.top_k[nb] = p[i]->top_k, R.greedy[nb] = p[i]->greedy;
		R.inv_t[nb] = inv_t, R.top_p[nb] = p[i]->top_p, R.u[nb] = u[i];
		R.min_p[nb] = p[i]->min_p;
		int top = p[i]->top_logprobs;
		R.top[nb] = top < 0 ? 0 : top > SFW_SAMPLE_TOP_MAX ? SFW_SAMPLE_TOP_MAX : top;
		if ((p[i]->n_adj > 0 || p[i]->logprobs) && !scratch)
			R.host[nb] = 1;
		if (scratch && p[i]->logprobs)
			R.lpo[nb] = (struct sfw_sample_lp *)(scratch + lp_at) + kl++;
		if (scratch && p[i]->n_adj > 0) {
			float *row = (float *)scratch + (size_t)kr++ * V;
			struct sfw_sample_adj *da = (struct sfw_sample_adj *)(scratch + adj_at) + ka;
			ka += (size_t)p[i]->n_adj;
			SFW_CUDA_CHECK(cudaMemcpyAsync(row, logits + (size_t)i * V, (size_t)V * sizeof(float),
						       cudaMemcpyDeviceToDevice, st));
			adjust_kernel<<<(p[i]->n_adj + 255) / 256, 256, 0, st>>>(
			    row, V, da, p[i]->n_adj, p[i]->repetition_penalty, p[i]->presence_penalty,
			    p[i]->frequency_penalty);
			SFW_CUDA_LAUNCHED();
			R.lgp[nb] = row;
		}
		nb++;
	}
	if (nb) {
		sfwc_launch(sample_kernel, dim3((unsigned)nb), dim3(SFWS_THREADS), 0, st, R);
		SFW_CUDA_LAUNCHED();
	}
	/* the logprobs to the callers' (host) structs: to pageable memory the
	 * copy is done when the call returns (a row the kernel handed back gets
	 * its logprobs from the host twin after this) */
	for (int b = 0; b < nb; b++)
		if (R.lpo[b])
			SFW_CUDA_CHECK(cudaMemcpyAsync(p[R.row[b]]->logprobs, R.lpo[b],
						       sizeof(struct sfw_sample_lp), cudaMemcpyDeviceToHost,
						       st));
	if (scratch)
		SFW_CUDA_CHECK(cudaFreeAsync(scratch, st));
}

extern "C" void sfw_op_sample_cuda(int32_t *out, const float *logits, int V, const struct sfw_op_sample_params *p,
				   double u, struct sfw_cuda_ctx *cx)
{
	sfw_cuda_sample_rows(out, logits, V, 1, &p, &u, cx);
}
