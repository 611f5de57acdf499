/* bench_attn.c - the long-context attention ops of one prefill chunk or
 * decode row, each timed alone on the device: stage 1 (the compressed keys'
 * scores), pooling, top-k, pooling and top-k in one launch (a single row:
 * what a recorded decode step runs; older trees: up to 4,096 blocks), sparse
 * attention over the blocks top-k chose, and dense attention over the whole
 * cache for comparison, at MiniCPM-SALA's shapes (32 query heads, 2 KV
 * heads of 128, blocks of 64, top 96, level-1 chunks 32/16):
 *   bench_attn [--ctx 32768,131072] [--rows 8192]
 * For each context length L the chunk is the last `rows` tokens (positions
 * L - rows .. L - 1) over a cache of L tokens, as the engine's last prefill
 * chunk (--rows 1: a decode row). K, V and q are random (a fixed seed), the
 * compressed keys are made by the compression op, and each op reads the
 * previous op's output, so the blocks attention loads are those top-k
 * picks. Each figure is the median of 7 rounds of 3 calls (1 warm-up), in
 * ms; the ops go through the twins (sfw_op_*_cuda) and sfw_cuda_pool_topk,
 * whose signatures this tool needs only, so the same source builds against
 * an older tree (gpu-run.sh before-after attn). A prefill chunk also times
 * a Lightning layer's chunked prefill over its rows (gla: 32 heads of 128,
 * the model's decays), which does not depend on the context, and stage 1
 * with the pooling in its kernel (stage1_pool, what the engine's prefill
 * runs before top-k).
 * After each context a line "bits:" gives 64-bit FNV-1a hashes of what the
 * ops made: a decode row's stage-1 scores, the blocks top-k chose (from
 * stage 1 + pooling, and from stage1_pool), and the sparse attention's
 * output. Two builds whose hashes agree computed the same bits (gpu-run.sh
 * variants compares them).
 * Built in every build; without CUDA=1 it says so and exits 0. */
#include "sfw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SFW_HAVE_CUDA
int main(void)
{
	printf("bench_attn: built without CUDA (make CUDA=1); nothing to measure\n");
	return 0;
}
#else
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"

/* (declared here and weak: older trees, which gpu-run.sh before-after
 * builds this source against, lack it; the op is then skipped) */
int sfw_cuda_stage1_pool(float *pooled, const void *q, const void *c1, const void *c2,
			 const struct sfw_sel_shape *sh, const struct sfw_pages *pg, const struct sfw_cuda_rowref *rr,
			 enum sfw_dtype act, struct sfw_cuda_ctx *cx) __attribute__((weak));

enum { NH = 32, NKV = 2, HD = 128, KSIZE = 32, STRIDE = 16, BLOCK = 64, TOPK = 96, INIT = 1, LOCAL = 32 };
enum op { O_STAGE1, O_POOL, O_TOPK, O_POOL_TOPK, O_SPARSE, O_DENSE, O_GLA, O_S1POOL, O_N };
static const char *op_name[O_N] = {"stage1", "pool", "topk", "pool_topk", "attn_sparse", "attn_dense", "gla",
				   "stage1_pool"};

struct bufs {
	void *k, *v, *q, *o, *c1, *c2;
	float *scores, *pooled;
	int32_t *idx;
	float *state, *decay; /* a Lightning layer's: [NH][HD][HD], [NH] */
};

static void bufs_free(struct bufs *b)
{
	sfw_cuda_free(b->k), sfw_cuda_free(b->v), sfw_cuda_free(b->q), sfw_cuda_free(b->o);
	sfw_cuda_free(b->c1), sfw_cuda_free(b->c2), sfw_cuda_free(b->scores), sfw_cuda_free(b->pooled);
	sfw_cuda_free(b->idx), sfw_cuda_free(b->state), sfw_cuda_free(b->decay);
}

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

static int64_t nchunks(int64_t len, int ks, int st)
{
	return len < ks ? 0 : (len - ks) / st + 1;
}

/* n random bf16 values in about [-1, 1) (xorshift64, seeded) to dst */
static int fill_random(void *dst, size_t n, uint64_t seed, void *s)
{
	uint16_t *h = malloc(n * 2);
	if (!h)
		return 0;
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		float f = (float)(int32_t)(x >> 32) / 2147483648.0f;
		uint32_t u;
		memcpy(&u, &f, 4);
		h[i] = (uint16_t)(u >> 16);
	}
	sfw_cuda_h2d(dst, h, n * 2, s);
	sfw_cuda_sync(s);
	free(h);
	return 1;
}

static void call(enum op op, struct bufs *b, const struct sfw_sel_shape *ss, const struct sfw_attn_shape *as,
		 struct sfw_cuda_ctx *cx)
{
	switch (op) {
	case O_STAGE1:
		sfw_op_stage1_cuda(b->scores, b->q, b->c1, b->c2, ss, NULL, SFW_DTYPE_BF16, cx);
		break;
	case O_POOL:
		sfw_op_pool_blocks_cuda(b->pooled, b->scores, ss, SFW_DTYPE_BF16, cx);
		break;
	case O_TOPK:
		sfw_op_topk_blocks_cuda(b->idx, b->pooled, ss, SFW_DTYPE_BF16, cx);
		break;
	case O_POOL_TOPK: { /* (one row: the fused form takes no more) */
		struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(cx, ss->pos0), .len = ss->T};
		sfw_cuda_pool_topk(b->idx, b->scores, ss, &rr, cx);
		break;
	}
	case O_SPARSE:
		sfw_op_attn_sparse_cuda(b->o, b->q, b->k, b->v, b->idx, as, SFW_DTYPE_BF16, cx);
		break;
	case O_DENSE:
		sfw_op_attn_dense_cuda(b->o, b->q, b->k, b->v, as, SFW_DTYPE_BF16, cx);
		break;
	case O_GLA: { /* a Lightning layer's prefill over the chunk's rows: q as q, k and v (timing only) */
		struct sfw_gla_shape gs = {.T = as->T, .nh = NH, .hd = HD, .scale = as->scale, .chunk = 64};
		sfw_op_gla_chunked_cuda(b->o, b->q, b->q, b->q, b->state, b->decay, &gs, SFW_DTYPE_BF16, cx);
		break;
	}
	case O_S1POOL: { /* stage 1 pooling as it scores (a prefill's rows) */
		struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(cx, ss->pos0), .len = ss->T};
		if (!sfw_cuda_stage1_pool(b->pooled, b->q, b->c1, b->c2, ss, NULL, &rr, SFW_DTYPE_BF16, cx)) {
			fprintf(stderr, "bench_attn: stage1_pool declined the call\n");
			exit(1);
		}
		break;
	}
	default:
		break;
	}
}

/* The fused pooling + top-k takes one row only; Lightning's chunked form
 * is a prefill's (64 rows or more) */
static int op_runs(enum op op, int T)
{
	if (op == O_S1POOL)
		return T >= 64 && sfw_cuda_stage1_pool != NULL;
	return op == O_POOL_TOPK ? T == 1 : op == O_GLA ? T >= 64 : 1;
}

static float time_op(enum op op, struct bufs *b, const struct sfw_sel_shape *ss, const struct sfw_attn_shape *as,
		     struct sfw_cuda_ctx *cx, void *e0, void *e1)
{
	float t[7];
	call(op, b, ss, as, cx);
	for (int r = 0; r < 7; r++) {
		sfw_cuda_event_record(e0, cx->stream);
		for (int i = 0; i < 3; i++)
			call(op, b, ss, as, cx);
		sfw_cuda_event_record(e1, cx->stream);
		t[r] = sfw_cuda_event_ms(e0, e1) / 3;
	}
	qsort(t, 7, sizeof(float), cmp_f);
	return t[3];
}

/* 64-bit FNV-1a of n bytes of device memory */
static unsigned long long dev_hash(const void *d, size_t n, void *stream)
{
	unsigned char *h = malloc(n ? n : 1);
	if (!h) {
		fprintf(stderr, "bench_attn: out of host memory for a %zu-byte copy\n", n);
		exit(1);
	}
	sfw_cuda_d2h(h, d, n, stream);
	sfw_cuda_sync(stream);
	unsigned long long x = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		x = (x ^ h[i]) * 0x100000001b3ull;
	free(h);
	return x;
}

/* How much consecutive rows' selections overlap (what a query block of W
 * rows that loads each distinct block once loads): the mean number of
 * distinct blocks in the union of W consecutive rows' lists, per KV head */
static void print_unions(const int32_t *didx, int T, void *stream)
{
	size_t n = (size_t)NKV * T * TOPK;
	int32_t *idx = malloc(n * 4);
	unsigned char *seen = NULL;
	int32_t maxb = 0;
	if (!idx)
		return;
	sfw_cuda_d2h(idx, didx, n * 4, stream);
	sfw_cuda_sync(stream);
	for (size_t i = 0; i < n; i++)
		maxb = idx[i] > maxb ? idx[i] : maxb;
	seen = calloc((size_t)maxb + 1, 1);
	if (!seen) {
		free(idx);
		return;
	}
	printf("    union of W consecutive rows' blocks (top %d), mean:", TOPK);
	for (int W = 1; W <= 64; W *= 2) {
		double sum = 0;
		long groups = 0;
		for (int g = 0; g < NKV; g++)
			for (int r0 = 0; r0 + W <= T; r0 += W, groups++) {
				int u = 0;
				for (int r = r0; r < r0 + W; r++)
					for (int j = 0; j < TOPK; j++) {
						int32_t v = idx[((size_t)g * T + r) * TOPK + j];
						if (v >= 0 && !seen[v])
							seen[v] = 1, u++;
					}
				sum += u;
				for (int r = r0; r < r0 + W; r++)
					for (int j = 0; j < TOPK; j++) {
						int32_t v = idx[((size_t)g * T + r) * TOPK + j];
						if (v >= 0)
							seen[v] = 0;
					}
			}
		printf(" W %d: %.1f |", W, groups ? sum / groups : 0.0);
	}
	printf("\n");
	free(seen);
	free(idx);
}

static int parse_list(const char *s, int64_t *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long long v = strtoll(s, &end, 10);
		if (end == s || v < 1 || v > ((int64_t)1 << 30))
			return -1;
		out[n++] = v;
		if (*end && *end != ',')
			return -1;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

static int run_ctx(int64_t L, int T, struct sfw_cuda_ctx *cx, void *e0, void *e1, struct sfw_err *err)
{
	int64_t pos0 = L - T, n1 = nchunks(L, KSIZE, STRIDE), n2 = nchunks(L, 4 * KSIZE, 4 * STRIDE);
	int64_t nb = (L + BLOCK - 1) / BLOCK;
	struct bufs b;
	memset(&b, 0, sizeof(b));
	size_t kv = (size_t)L * NKV * HD * 2, qb = (size_t)T * NH * HD * 2;
	int ok = sfw_cuda_malloc(&b.k, kv, "k", err) == SFW_OK && sfw_cuda_malloc(&b.v, kv, "v", err) == SFW_OK &&
		 sfw_cuda_malloc(&b.q, qb, "q", err) == SFW_OK && sfw_cuda_malloc(&b.o, qb, "o", err) == SFW_OK &&
		 sfw_cuda_malloc(&b.c1, (size_t)n1 * NKV * HD * 2 + 2, "c1", err) == SFW_OK &&
		 sfw_cuda_malloc(&b.c2, (size_t)n2 * NKV * HD * 2 + 2, "c2", err) == SFW_OK &&
		 sfw_cuda_malloc((void **)&b.scores, (size_t)NKV * T * n1 * 4, "scores", err) == SFW_OK &&
		 sfw_cuda_malloc((void **)&b.pooled, (size_t)NKV * T * nb * 4, "pooled", err) == SFW_OK &&
		 sfw_cuda_malloc((void **)&b.idx, (size_t)NKV * T * TOPK * 4, "idx", err) == SFW_OK &&
		 sfw_cuda_malloc((void **)&b.state, (size_t)NH * HD * HD * 4, "state", err) == SFW_OK &&
		 sfw_cuda_malloc((void **)&b.decay, NH * 4, "decay", err) == SFW_OK;
	ok = ok && fill_random(b.k, kv / 2, 1, cx->stream) && fill_random(b.v, kv / 2, 2, cx->stream) &&
	     fill_random(b.q, qb / 2, 3, cx->stream);
	if (ok) { /* the model's decays (model-spec: slope 2^(-(h+1)/4)), a zero state */
		float dec[NH];
		for (int h = 0; h < NH; h++)
			dec[h] = exp2f(-(float)(h + 1) / 4);
		sfw_cuda_h2d(b.decay, dec, sizeof(dec), cx->stream);
		sfw_cuda_memset(b.state, 0, (size_t)NH * HD * HD * 4, cx->stream);
		sfw_cuda_sync(cx->stream);
	}
	if (!ok) {
		if (!err->msg[0])
			snprintf(err->msg, sizeof(err->msg), "out of host memory");
		bufs_free(&b);
		return 0;
	}
	float scale = 0.08838834764831845f; /* 1 / sqrt(128) */
	struct sfw_sel_shape ss = {.T = T, .nh = NH, .nkv = NKV, .hd = HD, .pos0 = pos0, .ksize = KSIZE,
				   .stride = STRIDE, .block = BLOCK, .init_blocks = INIT, .local_blocks = LOCAL,
				   .scale = scale, .n1 = n1, .n2 = n2, .nblocks = nb, .topk = TOPK};
	struct sfw_attn_shape as = {.T = T, .nh = NH, .nkv = NKV, .hd = HD, .pos0 = pos0, .scale = scale,
				    .topk = TOPK, .block = BLOCK};
	sfw_op_compress_cuda(b.c1, b.k, 1, 0, n1, &ss, NULL, SFW_DTYPE_BF16, cx);
	sfw_op_compress_cuda(b.c2, b.k, 2, 0, n2, &ss, NULL, SFW_DTYPE_BF16, cx);
	float t[O_N] = {0};
	size_t idx_bytes = (size_t)NKV * T * TOPK * 4;
	unsigned long long h_sel = 0, h_attn = 0, h_sel1 = 0, h_s1 = 0;
	for (int op = 0; op < O_N; op++) {
		if (!op_runs((enum op)op, T))
			continue;
		t[op] = time_op((enum op)op, &b, &ss, &as, cx, e0, e1);
		if (op == O_STAGE1 && T <= 16) /* a decode row's scores (a prefill chunk's are GiBs) */
			h_s1 = dev_hash(b.scores, (size_t)NKV * T * n1 * 4, cx->stream);
		else if (op == O_TOPK)
			h_sel = dev_hash(b.idx, idx_bytes, cx->stream);
		else if (op == O_SPARSE)
			h_attn = dev_hash(b.o, qb, cx->stream);
	}

	printf("ctx %7lld rows %5d |", (long long)L, T);
	for (int op = 0; op < O_N; op++)
		if (op_runs((enum op)op, T))
			printf(" %s %8.3f |", op_name[op], t[op]);
	float sel = t[O_STAGE1] + t[O_POOL] + t[O_TOPK];
	printf(" select %.3f, sparse path %.3f, dense / sparse path %.2f", sel, sel + t[O_SPARSE],
	       t[O_DENSE] / (sel + t[O_SPARSE]));
	if (op_runs(O_S1POOL, T)) /* the engine's prefill form: stage1_pool, then top-k */
		printf(", select with stage1_pool %.3f", t[O_S1POOL] + t[O_TOPK]);
	printf("\n");
	if (T >= 64)
		print_unions(b.idx, T, cx->stream);
	if (op_runs(O_S1POOL, T)) { /* top-k of stage1_pool's pooled scores (the last op timed) */
		call(O_TOPK, &b, &ss, &as, cx);
		h_sel1 = dev_hash(b.idx, idx_bytes, cx->stream);
	}
	printf("    bits:");
	if (T <= 16)
		printf(" stage1 %016llx |", h_s1);
	printf(" selection %016llx | attn_sparse %016llx", h_sel, h_attn);
	if (op_runs(O_S1POOL, T))
		printf(" | selection by stage1_pool %016llx", h_sel1);
	printf("\n");
	fflush(stdout);
	bufs_free(&b);
	return 1;
}

int main(int argc, char **argv)
{
	int64_t ctx[16] = {32768, 131072};
	int nc = 2, rows = 8192;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
			nc = parse_list(argv[++i], ctx, 16);
			if (nc <= 0) {
				fprintf(stderr, "bench_attn: --ctx: a comma list of context lengths 1..2^30\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
			rows = atoi(argv[++i]);
			if (rows < 1 || rows > 65536) {
				fprintf(stderr, "bench_attn: --rows: 1..65536\n");
				return 2;
			}
		} else {
			fprintf(stderr, "usage: bench_attn [--ctx 32768,131072] [--rows 8192]\n");
			return 2;
		}
	}
	for (int i = 0; i < nc; i++)
		if (ctx[i] < rows || ctx[i] < 4 * KSIZE) {
			fprintf(stderr, "bench_attn: --ctx: %lld is shorter than the chunk (%d rows) or one level-2 chunk\n",
				(long long)ctx[i], rows);
			return 2;
		}
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	void *s;
	struct sfw_cuda_ctx *cx;
	if (sfw_cuda_init(0, &info, &err) != SFW_OK || sfw_cuda_stream_new(&s, &err) != SFW_OK ||
	    sfw_cuda_ctx_new(s, &cx, &err) != SFW_OK) {
		fprintf(stderr, "bench_attn: %s\n", err.msg);
		return 1;
	}
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	printf("device: %s, %d SMs; %d heads, %d KV heads of %d, top %d blocks of %d; ms per call (median of 7 x 3)\n",
	       info.name, info.sm_count, NH, NKV, HD, TOPK, BLOCK);
	for (int i = 0; i < nc; i++)
		if (!run_ctx(ctx[i], rows, cx, e0, e1, &err)) {
			fprintf(stderr, "bench_attn: ctx %lld: %s\n", (long long)ctx[i], err.msg);
			return 1;
		}
	return 0;
}
#endif
