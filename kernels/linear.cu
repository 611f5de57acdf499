/* linear.cu - Y[M,N] = X[M,K] · W[N,K]ᵀ in bf16 with fp32 accumulation.
 *
 * Decode (M ≤ 8) is a pure weight stream: the GEMV kernel gives each warp R
 * whole rows of W, reads them with 16-byte no-L1-allocate loads, U vectors
 * per lane in flight per row, and applies each weight vector to all M
 * activation rows (read through L1, they are tiny and shared by every warp).
 * Its first weight loads are issued before the programmatic-launch wait, so
 * W must never be written by a kernel just before the GEMV (weights are
 * uploaded by copies, never by kernels).
 * Prefill goes to cuBLASLt (bf16 tensor cores, fp32 compute). */
#include "cuda_common.cuh"

#include <cublasLt.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "kernels/ops_cuda.h"
}

#define SFW_CUBLAS_CHECK(stmt)                                                                            \
	do {                                                                                              \
		cublasStatus_t s_ = (stmt);                                                               \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
			fprintf(stderr, "salafw: cuBLAS error %d (%s)\n  in '%s'\n  at %s:%d\n", (int)s_,  \
				cublasLtGetStatusString(s_), #stmt, __FILE__, __LINE__);                  \
			fflush(stderr);                                                                   \
			abort();                                                                          \
		}                                                                                         \
	} while (0)

#define GEMV_WARPS 4

static __device__ __forceinline__ void out_st(uint16_t *p, size_t i, float v)
{
	p[i] = sfwc_tobf(v);
}
static __device__ __forceinline__ void out_st(float *p, size_t i, float v)
{
	p[i] = v;
}
/* float32 logits rounded through bf16 as the reference rounds them (§2.5),
 * in the GEMV's own store instead of a pass of their own */
struct sfwc_f32_bf16r {
	float v;
};
static __device__ __forceinline__ void out_st(sfwc_f32_bf16r *p, size_t i, float v)
{
	p[i].v = sfwc_rbf(v);
}

template <int R, int U, int M, typename TO>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
	gemv_kernel(const uint16_t *__restrict__ X, int ldx, const uint16_t *__restrict__ W, TO *__restrict__ Y,
		    int ldy, int N, int K, float alpha)
{
	int lane = threadIdx.x & 31;
	int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
	if (row0 >= N)
		return;
	int kv = K >> 3;
	const uint4 *wr[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		wr[r] = (const uint4 *)(W + (size_t)min(row0 + r, N - 1) * K);
	float acc[R][M];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int m = 0; m < M; m++)
			acc[r][m] = 0.0f;
	uint4 w[U][R];
	auto load = [&](int base) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			int i = base + u * 32 + lane;
#pragma unroll
			for (int r = 0; r < R; r++)
				w[u][r] = i < kv ? sfwc_ld_stream(wr[r] + i) : make_uint4(0, 0, 0, 0);
		}
	};
	/* The weights do not depend on the previous kernel: the first batch is
	 * in flight while that kernel drains (programmatic dependent launch);
	 * only X waits for it. */
	load(0);
	sfwc_pdl_wait();
	for (int base = 0; base < kv; base += 32 * U) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			int i = base + u * 32 + lane;
			if (i >= kv)
				break;
#pragma unroll
			for (int m = 0; m < M; m++) {
				float xf[8];
				sfwc_unpack8(__ldg((const uint4 *)(X + (size_t)m * ldx) + i), xf);
#pragma unroll
				for (int r = 0; r < R; r++) {
					float wf[8];
					sfwc_unpack8(w[u][r], wf);
					float s = acc[r][m];
#pragma unroll
					for (int j = 0; j < 8; j++)
						s = fmaf(wf[j], xf[j], s);
					acc[r][m] = s;
				}
			}
		}
		if (base + 32 * U < kv)
			load(base + 32 * U);
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int m = 0; m < M; m++)
			acc[r][m] = sfwc_warp_sum(acc[r][m]);
	if (lane == 0) {
#pragma unroll
		for (int r = 0; r < R; r++)
			if (row0 + r < N)
#pragma unroll
				for (int m = 0; m < M; m++)
					out_st(Y, (size_t)m * ldy + row0 + r, alpha * acc[r][m]);
	}
}

/* Any alignment, any K: one warp per (row, m). Used when 16-byte loads are
 * impossible; never on the real model's shapes. */
template <typename TO>
static __global__ void gemv_scalar_kernel(const uint16_t *X, int ldx, const uint16_t *W, TO *Y, int ldy, int M,
					  int N, int K, float alpha)
{
	sfwc_pdl_wait();
	int lane = threadIdx.x & 31;
	long w = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (w >= (long)M * N)
		return;
	int m = (int)(w / N), n = (int)(w % N);
	float s = 0;
	for (int k = lane; k < K; k += 32)
		s = fmaf(sfwc_bf(W[(size_t)n * K + k]), sfwc_bf(X[(size_t)m * ldx + k]), s);
	s = sfwc_warp_sum(s);
	if (lane == 0)
		out_st(Y, (size_t)m * ldy + n, alpha * s);
}

template <int R, int U, int M, typename TO>
static void launch_gemv(const uint16_t *X, int ldx, const uint16_t *W, TO *Y, int ldy, int N, int K, float alpha,
			cudaStream_t s)
{
	int warps = (N + R - 1) / R;
	int blocks = (warps + GEMV_WARPS - 1) / GEMV_WARPS;
	sfwc_launch(gemv_kernel<R, U, M, TO>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, s, X, ldx, W, Y, ldy, N, K, alpha);
	SFW_CUDA_LAUNCHED();
}

template <int R, int U, typename TO>
static void launch_gemv_m(const uint16_t *X, int ldx, const uint16_t *W, TO *Y, int ldy, int M, int N, int K,
			  float alpha, cudaStream_t s)
{
	switch (M) {
	case 1: launch_gemv<R, U, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); break;
	case 2: launch_gemv<R, U, 2>(X, ldx, W, Y, ldy, N, K, alpha, s); break;
	case 3: launch_gemv<R, U, 3>(X, ldx, W, Y, ldy, N, K, alpha, s); break;
	case 4: launch_gemv<R, U, 4>(X, ldx, W, Y, ldy, N, K, alpha, s); break;
	default:
		/* 5..8 rows: two passes of at most 4 (the weights stream twice,
		 * still far cheaper than a tensor-core GEMM at this M) */
		launch_gemv<R, U, 4>(X, ldx, W, Y, ldy, N, K, alpha, s);
		launch_gemv_m<R, U>(X + (size_t)4 * ldx, ldx, W, Y + (size_t)4 * ldy, ldy, M - 4, N, K, alpha, s);
		break;
	}
}

static bool gemv_vec_ok(const uint16_t *X, int ldx, const uint16_t *W, int M, int K)
{
	return K % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)X & 15) == 0 && (M == 1 || ldx % 8 == 0);
}

template <typename TO>
static void gemv_scalar(const uint16_t *X, int ldx, const uint16_t *W, TO *Y, int ldy, int M, int N, int K,
			float alpha, cudaStream_t s)
{
	long warps = (long)M * N;
	sfwc_launch(gemv_scalar_kernel<TO>, dim3((unsigned)((warps + 7) / 8)), dim3(256), 0, s, X, ldx, W, Y, ldy, M, N, K, alpha);
	SFW_CUDA_LAUNCHED();
}

template <typename TO>
static void gemv_any(const uint16_t *X, int ldx, const uint16_t *W, TO *Y, int ldy, int M, int N, int K,
		     int rows_per_warp, int unroll, float alpha, cudaStream_t s)
{
	SFW_ASSERT(M >= 1 && M <= SFW_CUDA_GEMV_MAX_M && N >= 1 && K >= 1);
	if (!gemv_vec_ok(X, ldx, W, M, K)) {
		gemv_scalar(X, ldx, W, Y, ldy, M, N, K, alpha, s);
		return;
	}
	if (rows_per_warp == 0) /* measured on H200 (bench/RESULTS.md): see gemv table */
		rows_per_warp = N >= 8192 ? 2 : 1;
	if (unroll == 0)
		unroll = 4;
	int v = rows_per_warp * 10 + unroll;
	if (M == 1) {
		switch (v) {
		case 12: launch_gemv<1, 2, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 14: launch_gemv<1, 4, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 18: launch_gemv<1, 8, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 22: launch_gemv<2, 2, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 24: launch_gemv<2, 4, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 28: launch_gemv<2, 8, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 42: launch_gemv<4, 2, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 44: launch_gemv<4, 4, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		case 48: launch_gemv<4, 8, 1>(X, ldx, W, Y, ldy, N, K, alpha, s); return;
		default: break;
		}
	}
	if (rows_per_warp >= 2)
		launch_gemv_m<2, 4>(X, ldx, W, Y, ldy, M, N, K, alpha, s);
	else
		launch_gemv_m<1, 4>(X, ldx, W, Y, ldy, M, N, K, alpha, s);
}

void sfwi_cuda_gemv_logits(const uint16_t *X, const uint16_t *W, float *Y, int M, int N, int K, float alpha,
			   void *stream)
{
	static_assert(sizeof(sfwc_f32_bf16r) == sizeof(float), "one float per logit");
	gemv_any(X, K, W, (sfwc_f32_bf16r *)Y, N, M, N, K, 0, 0, alpha, SFW_CUDA_STREAM(stream));
}

extern "C" void sfw_cuda_gemv_variant(const uint16_t *X, const uint16_t *W, uint16_t *Y,
				      const struct sfw_gemm_shape *sh, int rows_per_warp, int unroll,
				      void *stream)
{
	gemv_any(X, sfw_gemm_ldx(sh), W, Y, sfw_gemm_ldy(sh), sh->M, sh->N, sh->K, rows_per_warp, unroll,
		 1.0f, SFW_CUDA_STREAM(stream));
}

extern "C" void sfw_cuda_gemv(const uint16_t *X, const uint16_t *W, uint16_t *Y,
			      const struct sfw_gemm_shape *sh, void *stream)
{
	sfw_cuda_gemv_variant(X, W, Y, sh, 0, 0, stream);
}

/* ---- cuBLASLt ---- */

struct gemm_plan {
	int M, N, K, ldx, ldy, out_f32, rank; /* rank: which of cuBLASLt's heuristic answers (0 = its first) */
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo;
};

struct sfw_cuda_blas {
	cublasLtHandle_t lt;
	void *ws;
	size_t ws_bytes;
	std::vector<gemm_plan> *plans; /* few distinct shapes per model: linear search */
};

extern "C" enum sfw_status sfw_cuda_blas_new(struct sfw_cuda_blas **out, size_t workspace_bytes, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_cuda_blas *b = (struct sfw_cuda_blas *)calloc(1, sizeof(*b));
	if (!b)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	cublasStatus_t s = cublasLtCreate(&b->lt);
	if (s != CUBLAS_STATUS_SUCCESS) {
		free(b);
		return sfw_fail(err, SFW_E_CUDA, "cannot create a cuBLASLt handle: %s", cublasLtGetStatusString(s));
	}
	b->ws_bytes = workspace_bytes;
	enum sfw_status st = sfw_cuda_malloc(&b->ws, workspace_bytes, "the cuBLASLt workspace", err);
	if (st != SFW_OK) {
		cublasLtDestroy(b->lt);
		free(b);
		return st;
	}
	b->plans = new std::vector<gemm_plan>();
	*out = b;
	return SFW_OK;
}

extern "C" void sfw_cuda_blas_free(struct sfw_cuda_blas *b)
{
	if (!b)
		return;
	for (auto &p : *b->plans) {
		cublasLtMatrixLayoutDestroy(p.a);
		cublasLtMatrixLayoutDestroy(p.b);
		cublasLtMatrixLayoutDestroy(p.c);
		cublasLtMatmulDescDestroy(p.op);
	}
	delete b->plans;
	sfw_cuda_free(b->ws);
	cublasLtDestroy(b->lt);
	free(b);
}

/* Row-major Y[M,N] = X[M,K] W[N,K]ᵀ is column-major Yᵀ[N,M] = (Wᵀ)ᵀ[N,K] · Xᵀ[K,M]:
 * A = W seen as column-major K×N (lda K) with op T, B = X as K×M (ldb ldx). */
#define GEMM_RANKS 8
/* NULL when cuBLASLt has fewer than rank + 1 answers for the shape (rank 0:
 * aborts, as there is no GEMM at all). */
static const gemm_plan *get_plan(struct sfw_cuda_blas *b, int M, int N, int K, int ldx, int ldy, int out_f32,
				 int rank)
{
	for (auto &p : *b->plans)
		if (p.M == M && p.N == N && p.K == K && p.ldx == ldx && p.ldy == ldy && p.out_f32 == out_f32 &&
		    p.rank == rank)
			return &p;
	SFW_ASSERT(rank >= 0 && rank < GEMM_RANKS);
	gemm_plan p;
	p.M = M, p.N = N, p.K = K, p.ldx = ldx, p.ldy = ldy, p.out_f32 = out_f32, p.rank = rank;
	SFW_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	SFW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	SFW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	SFW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
	SFW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, ldx));
	SFW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, N, M, ldy));
	cublasLtMatmulPreference_t pref;
	SFW_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
	SFW_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
							      &b->ws_bytes, sizeof(b->ws_bytes)));
	cublasLtMatmulHeuristicResult_t h[GEMM_RANKS];
	int found = 0;
	SFW_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, p.op, p.a, p.b, p.c, p.c, pref, rank + 1, h, &found));
	cublasLtMatmulPreferenceDestroy(pref);
	if (found < 1) {
		fprintf(stderr, "salafw: cuBLASLt has no algorithm for a %d×%d×%d bf16 GEMM\n", M, N, K);
		abort();
	}
	if (found <= rank) {
		cublasLtMatrixLayoutDestroy(p.a);
		cublasLtMatrixLayoutDestroy(p.b);
		cublasLtMatrixLayoutDestroy(p.c);
		cublasLtMatmulDescDestroy(p.op);
		return NULL;
	}
	p.algo = h[rank].algo;
	b->plans->push_back(p);
	return &b->plans->back();
}

static int gemm_rank(struct sfw_cuda_blas *b, const uint16_t *X, int ldx, const uint16_t *W, void *Y, int ldy, int M,
		     int N, int K, int out_f32, float alpha, int rank, void *stream)
{
	const gemm_plan *p = get_plan(b, M, N, K, ldx, ldy, out_f32, rank);
	if (!p)
		return 0;
	float beta = 0.0f;
	SFW_CUBLAS_CHECK(cublasLtMatmul(b->lt, p->op, &alpha, W, p->a, X, p->b, &beta, Y, p->c, Y, p->c, &p->algo, b->ws,
					b->ws_bytes, SFW_CUDA_STREAM(stream)));
	return 1;
}

static void gemm_any(struct sfw_cuda_blas *b, const uint16_t *X, int ldx, const uint16_t *W, void *Y, int ldy, int M,
		     int N, int K, int out_f32, float alpha, void *stream)
{
	gemm_rank(b, X, ldx, W, Y, ldy, M, N, K, out_f32, alpha, 0, stream);
}

extern "C" int sfw_cuda_gemm_rank(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, void *Y,
				  const struct sfw_gemm_shape *sh, int out_f32, int rank, void *stream)
{
	return gemm_rank(b, X, sfw_gemm_ldx(sh), W, Y, sfw_gemm_ldy(sh), sh->M, sh->N, sh->K, out_f32, 1.0f,
			 rank, stream);
}

extern "C" void sfw_cuda_gemm(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, uint16_t *Y,
			      const struct sfw_gemm_shape *sh, void *stream)
{
	gemm_any(b, X, sfw_gemm_ldx(sh), W, Y, sfw_gemm_ldy(sh), sh->M, sh->N, sh->K, 0, 1.0f, stream);
}

extern "C" void sfw_cuda_linear_f32out(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W,
				       float *Y, const struct sfw_gemm_shape *sh, float alpha, void *stream)
{
	int ldx = sfw_gemm_ldx(sh), ldy = sfw_gemm_ldy(sh), M = sh->M, N = sh->N, K = sh->K;
	if (M <= SFW_CUDA_GEMV_AUTO_M)
		gemv_any(X, ldx, W, Y, ldy, M, N, K, 0, 0, alpha, SFW_CUDA_STREAM(stream));
	else
		gemm_any(b, X, ldx, W, Y, ldy, M, N, K, 1, alpha, stream);
}

extern "C" void sfw_cuda_linear(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, uint16_t *Y,
				const struct sfw_gemm_shape *sh, void *stream)
{
	if (sh->M <= SFW_CUDA_GEMV_AUTO_M)
		sfw_cuda_gemv(X, W, Y, sh, stream);
	else
		sfw_cuda_gemm(b, X, W, Y, sh, stream);
}

extern "C" enum sfw_status sfw_cuda_measure_gemm(int n, double *tflops, struct sfw_err *err)
{
	struct sfw_cuda_blas *b;
	enum sfw_status st = sfw_cuda_blas_new(&b, 64u << 20, err);
	if (st != SFW_OK)
		return st;
	size_t e = (size_t)n * n;
	void *x, *w, *y;
	if ((st = sfw_cuda_malloc(&x, e * 2, "the GEMM benchmark", err)) != SFW_OK)
		goto out0;
	if ((st = sfw_cuda_malloc(&w, e * 2, "the GEMM benchmark", err)) != SFW_OK)
		goto out1;
	if ((st = sfw_cuda_malloc(&y, e * 2, "the GEMM benchmark", err)) != SFW_OK)
		goto out2;
	{
		cudaStream_t s;
		SFW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
		sfw_cuda_fill_bf16((uint16_t *)x, e, 11, 1.0f, s);
		sfw_cuda_fill_bf16((uint16_t *)w, e, 12, 1.0f, s);
		cudaEvent_t e0, e1;
		SFW_CUDA_CHECK(cudaEventCreate(&e0));
		SFW_CUDA_CHECK(cudaEventCreate(&e1));
		struct sfw_gemm_shape sh = {n, n, n, n, n};
		for (int i = 0; i < 3; i++)
			sfw_cuda_gemm(b, (uint16_t *)x, (uint16_t *)w, (uint16_t *)y, &sh, s);
		std::vector<float> t;
		for (int i = 0; i < 10; i++) {
			SFW_CUDA_CHECK(cudaEventRecord(e0, s));
			sfw_cuda_gemm(b, (uint16_t *)x, (uint16_t *)w, (uint16_t *)y, &sh, s);
			SFW_CUDA_CHECK(cudaEventRecord(e1, s));
			float ms;
			SFW_CUDA_CHECK(cudaEventSynchronize(e1));
			SFW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
			t.push_back(ms);
		}
		std::sort(t.begin(), t.end());
		*tflops = 2.0 * (double)n * n * n / (t[t.size() / 2] * 1e-3) / 1e12;
		cudaEventDestroy(e0);
		cudaEventDestroy(e1);
		cudaStreamDestroy(s);
	}
	sfw_cuda_free(y);
out2:
	sfw_cuda_free(w);
out1:
	sfw_cuda_free(x);
out0:
	sfw_cuda_blas_free(b);
	return st;
}

/* ---- the explicit state the ops run with (struct sfw_cuda_ctx, ops_cuda.h) ---- */

extern "C" enum sfw_status sfw_cuda_ctx_new(void *stream, struct sfw_cuda_ctx **out, struct sfw_err *err)
{
	*out = NULL;
	struct sfw_cuda_ctx *cx = (struct sfw_cuda_ctx *)calloc(1, sizeof(*cx));
	if (!cx)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	cx->stream = stream;
	enum sfw_status s = sfw_cuda_blas_new(&cx->blas, (size_t)32 << 20, err);
	if (s == SFW_OK)
		s = sfw_cuda_malloc(&cx->scratch, SFW_CUDA_SCRATCH_MIN, "op scratch", err);
	if (s == SFW_OK)
		s = sfw_cuda_malloc(&cx->w8ws, SFW_CUDA_W8WS_BYTES, "int8 GEMM workspace", err);
	if (s == SFW_OK)
		sfw_cuda_memset(cx->w8ws, 0, SFW_CUDA_W8WS_BYTES, stream);
	if (s == SFW_OK)
		s = sfw_cuda_malloc((void **)&cx->pos, sizeof(int64_t), "op positions", err);
	if (s != SFW_OK) {
		sfw_cuda_ctx_free(cx);
		return s;
	}
	cx->scratch_bytes = SFW_CUDA_SCRATCH_MIN;
	int dev = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&dev));
	SFW_CUDA_CHECK(cudaDeviceGetAttribute(&cx->sms, cudaDevAttrMultiProcessorCount, dev));
	cx->topk_smem = sfwi_topk_smem_prepare();
	*out = cx;
	return SFW_OK;
}

extern "C" void sfw_cuda_ctx_free(struct sfw_cuda_ctx *cx)
{
	if (!cx)
		return;
	if (cx->stream)
		SFW_CUDA_CHECK(cudaStreamSynchronize(SFW_CUDA_STREAM(cx->stream)));
	sfw_cuda_blas_free(cx->blas);
	sfw_cuda_free(cx->scratch);
	sfw_cuda_free(cx->w8ws);
	sfw_cuda_free(cx->pos);
	free(cx);
}

extern "C" const int64_t *sfw_cuda_ctx_pos(struct sfw_cuda_ctx *cx, int64_t pos)
{
	cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	SFW_CUDA_CHECK(cudaStreamIsCapturing(SFW_CUDA_STREAM(cx->stream), &cs));
	SFW_ASSERT(cs == cudaStreamCaptureStatusNone);
	if (!cx->pos_known || cx->pos_at != pos) {
		/* from pageable memory: staged before the call returns */
		sfw_cuda_h2d(cx->pos, &pos, sizeof(pos), cx->stream);
		cx->pos_at = pos, cx->pos_known = 1;
	}
	return cx->pos;
}

int sfwi_cuda_sms(const struct sfw_cuda_ctx *cx)
{
	if (cx->sms > 0)
		return cx->sms;
	int dev = 0, n = 0;
	SFW_CUDA_CHECK(cudaGetDevice(&dev));
	SFW_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
	return n;
}

void *sfwi_cuda_scratch(struct sfw_cuda_ctx *cx, size_t bytes)
{
	if (bytes <= cx->scratch_bytes)
		return cx->scratch;
	/* a fixed scratch (a backend's: recorded steps point into it) was
	 * planned too small: a bug; else it grows, outside a capture only */
	SFW_ASSERT(!cx->fixed);
	cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	SFW_CUDA_CHECK(cudaStreamIsCapturing(SFW_CUDA_STREAM(cx->stream), &cs));
	SFW_ASSERT(cs == cudaStreamCaptureStatusNone);
	SFW_CUDA_CHECK(cudaStreamSynchronize(SFW_CUDA_STREAM(cx->stream)));
	sfw_cuda_free(cx->scratch);
	cx->scratch = NULL, cx->scratch_bytes = 0;
	struct sfw_err e = {};
	if (sfw_cuda_malloc(&cx->scratch, bytes, "op scratch", &e) != SFW_OK) {
		fprintf(stderr, "salafw: %s\n", e.msg);
		abort();
	}
	cx->scratch_bytes = bytes;
	return cx->scratch;
}
