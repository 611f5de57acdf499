/* backend_ops.c - the table of tests/lib/backend_ops.h and its driver. */
#include "backend_ops.h"
#include "compare.h"
#include "rng.h"

#include "num/num.h" /* the bf16 conversions */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------ */

enum bo_op {
	BO_EMBED,
	BO_RMSNORM,
	BO_ADD_SCALED,
	BO_SILU_MUL,
	BO_SIGMOID_MUL,
	BO_ROPE,
	BO_MATMUL,
	BO_SWIGLU,
	BO_LOGITS,
	BO_ADD_RMSNORM,
	BO_RMSNORM_GATE,
	BO_QK_NORM_ROPE,
	BO_SAMPLE,
	BO_COPY,
	BO_DENSE,  /* cache_reserve + kv_append + attn_dense, call after call */
	BO_SPARSE, /* kv_append + compress + sparse_select + attn_sparse */
	BO_GLA,	   /* gla against the lightning state, call after call */
	BO_CACHE,  /* cache_len, cache_ncompressed, cache_view, cache_reset */
	BO_POOL,   /* pool_new, paged cache_reserve, pool_used, exhaustion, a paged view */
	BO_SEQS,   /* the *_seqs ops over several caches at different lengths */
};

struct tol {
	double nmse, maxrel;
};

/* Tolerances of a bf16-activation backend against the fp32 CPU reference on
 * bf16-exact inputs, by the rule of tests/gpu_ops.c: NMSE (sum d^2 / sum
 * ref^2) and max|d| <= maxrel * max|ref|. One rounding to bf16 (nearest,
 * ties to even) errs by at most 2^-8 = 3.9e-3 relative and by about
 * 2^-8/sqrt(3) rms (NMSE 5e-6); the bounds count the op's rounding points
 * (docs/model-spec.md §2: where the reference rounds):
 *   T1   one point: the output (embed: E[id] * scale).
 *   T2   up to four points in the max, six in rms: rmsnorm (normalised x,
 *        times w), add_scaled (scale * b, the sum), silu/sigmoid (the gate,
 *        the product), rope (x cos, x sin, the sum), bf16/f32 matmul and
 *        logits (the input rounded to bf16 on the CUDA side is exact here,
 *        so the output rounding and fp32 summation order), attention (P in
 *        bf16 for the P.V product, the output): gpu_ops's bf16 column.
 *   TW8  int8: T2 plus the dequantized weight rounded to bf16 (the
 *        cuBLASLt path for M > 8 dequantizes into bf16 slabs, 2^-8 relative
 *        on every weight, partly averaging out over K).
 *   TGLA gla: q.k products and the intra-chunk decay weights of the
 *        chunked form in bf16 on top of the output rounding (gpu_ops).
 * A backend whose activations are fp32 is compared bit for bit instead
 * (bo_opts.exact). */
enum tol_class { T0, T1, T2, TW8, TGLA }; /* T0: ids and bytes, compared exactly */
static const struct tol tols[] = {{0, 0}, {1.5e-5, 8e-3}, {3e-5, 1.6e-2}, {6e-5, 2.4e-2}, {1e-4, 3e-2}};

/* Field meanings per op:
 *   embed        M ids, K = hidden, N = vocab, wdt the table's dtype
 *   rmsnorm, add_rmsnorm, rmsnorm_gate  M rows of K, wdt the norm weight's dtype
 *   add_scaled, silu_mul, sigmoid_mul  M x K elements
 *   rope         M rows (T), nh heads of hd, from position pos0
 *   matmul, logits  y[M, N] = x[M, K] . W[N, K]^T, W in wdt (W8: sdt scales, group)
 *   swiglu       M rows: y[M, N] = silu(x G^T) (x U^T) over a gate|up group [2N, K]
 *   qk_norm_rope M rows, nh q heads, nkv k heads of hd, from pos0 (N = 0: no rope)
 *   sample       N logits, M = the parameter set (below)
 *   copy         K bytes
 *   dense, gla   calls[] rows per call on one cache (nh / nkv heads of hd)
 *   sparse       pos0 tokens first (dense appends), then calls[] rows per
 *                selection call (topk K blocks + 2 local + 1 init)
 *   cache, pool  the calls as described by the function
 *   seqs         M sequences (nh heads of hd; nkv kv heads in the sparse
 *                layer), sequence i first holding pos0 + 29 i tokens
 *                (appended, compressed, and as many GLA rows on the
 *                lightning layer), then calls[1] steps of calls[0] rows
 *                each (0: one row each, the batched decode; else sequence
 *                i takes 1 + i % calls[0] rows) through kv_append_seqs,
 *                compress_seqs, attn_dense_seqs, qk_norm_rope_seqs (N:
 *                rope) and gla_seqs */
struct bo_case {
	const char *name;
	enum bo_op op;
	enum sfw_dtype wdt, sdt;
	int group;
	int M, K, N;
	int nh, nkv, hd;
	int64_t pos0;
	int calls[4];
	enum tol_class tol;
};

#define BF SFW_DTYPE_BF16
#define F32 SFW_DTYPE_F32
#define W8 SFW_DTYPE_W8
#define F16 SFW_DTYPE_F16
#define CH SFW_QL_GROUP_CHANNEL

/* Batched row counts M = 1, 2, 4, 8 (the CUDA GEMV), 17 (odd, above it), 64
 * (a prefill piece). The GEMV rows (M <= 8) take odd K and N (k, n). The
 * larger M go to cuBLASLt on CUDA (int8: after dequantization to bf16) and
 * take odd N but K not a multiple of 8 with rows still 4-byte aligned (K2,
 * N2), the shapes gpu_linear has run there (int8, M = 40, K = 130, N = 33
 * and 77); the engine's widths are multiples of 64. A GEMM over odd K (rows
 * 2-byte aligned) is the table's last case: should cuBLASLt refuse it, the
 * abort names the shape and nothing else is lost. */
#define MM1(nm, wdt, sdt, g, M, K, N, tol)                                                                   \
	{                                                                                                    \
		nm " M=" #M, BO_MATMUL, wdt, sdt, g, M, K, N, 0, 0, 0, 0, {0}, tol                           \
	}
#define MM(nm, wdt, sdt, g, k, n, K2, N2, tol)                                                               \
	MM1(nm, wdt, sdt, g, 1, k, n, tol), MM1(nm, wdt, sdt, g, 2, k, n, tol),                              \
	    MM1(nm, wdt, sdt, g, 4, k, n, tol), MM1(nm, wdt, sdt, g, 8, k, n, tol),                          \
	    MM1(nm, wdt, sdt, g, 17, K2, N2, tol), MM1(nm, wdt, sdt, g, 64, K2, N2, tol)

static const struct bo_case cases[] = {
    {"embed bf16", BO_EMBED, BF, 0, 0, 5, 256, 1000, 0, 0, 0, 0, {0}, T1},
    {"embed bf16 M=64", BO_EMBED, BF, 0, 0, 64, 200, 301, 0, 0, 0, 0, {0}, T1},
    {"embed f32", BO_EMBED, F32, 0, 0, 17, 130, 77, 0, 0, 0, 0, {0}, T1},
    {"rmsnorm bf16 w", BO_RMSNORM, BF, 0, 0, 1, 256, 0, 0, 0, 0, 0, {0}, T2},
    {"rmsnorm bf16 w M=17", BO_RMSNORM, BF, 0, 0, 17, 1030, 0, 0, 0, 0, 0, {0}, T2},
    {"rmsnorm f32 w per head", BO_RMSNORM, F32, 0, 0, 64 * 4, 64, 0, 0, 0, 0, 0, {0}, T2},
    {"rmsnorm odd n", BO_RMSNORM, BF, 0, 0, 8, 77, 0, 0, 0, 0, 0, {0}, T2},
    {"add_scaled", BO_ADD_SCALED, 0, 0, 0, 17, 1023, 0, 0, 0, 0, 0, {0}, T2},
    {"add_scaled M=1", BO_ADD_SCALED, 0, 0, 0, 1, 8, 0, 0, 0, 0, 0, {0}, T2},
    {"silu_mul", BO_SILU_MUL, 0, 0, 0, 17, 999, 0, 0, 0, 0, 0, {0}, T2},
    {"silu_mul M=64", BO_SILU_MUL, 0, 0, 0, 64, 256, 0, 0, 0, 0, 0, {0}, T2},
    {"sigmoid_mul", BO_SIGMOID_MUL, 0, 0, 0, 8, 513, 0, 0, 0, 0, 0, {0}, T2},
    {"sigmoid_mul M=1", BO_SIGMOID_MUL, 0, 0, 0, 1, 7, 0, 0, 0, 0, 0, {0}, T2},
    {"rope hd64", BO_ROPE, 0, 0, 0, 17, 0, 0, 4, 0, 64, 5, {0}, T2},
    {"rope hd128 far", BO_ROPE, 0, 0, 0, 2, 0, 0, 3, 0, 128, 70000, {0}, T2},
    {"rope hd32 M=64", BO_ROPE, 0, 0, 0, 64, 0, 0, 2, 0, 32, 0, {0}, T2},
    MM("matmul bf16", BF, 0, 0, 255, 129, 258, 130, T2),
    MM("matmul f32", F32, 0, 0, 131, 67, 131, 67, T2), /* a plain kernel for every M on CUDA */
    MM("matmul w8 g128 bf16 scales", W8, BF, 128, 385, 97, 386, 98, TW8),
    MM("matmul w8 g32 f16 scales odd K", W8, F16, 32, 199, 77, 202, 78, TW8),
    {"matmul w8 g64 bf16 scales M=1", BO_MATMUL, W8, BF, 64, 1, 256, 130, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 g64 f32 scales M=17", BO_MATMUL, W8, F32, 64, 17, 320, 65, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 g64 f16 scales M=8", BO_MATMUL, W8, F16, 64, 8, 192, 33, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 channel bf16 scales M=4", BO_MATMUL, W8, BF, CH, 4, 256, 64, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 channel f32 scales M=64", BO_MATMUL, W8, F32, CH, 64, 130, 50, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 g128 f32 scales M=2 odd K", BO_MATMUL, W8, F32, 128, 2, 301, 40, 0, 0, 0, 0, {0}, TW8},
    {"matmul w8 g32 bf16 scales M=17", BO_MATMUL, W8, BF, 32, 17, 256, 96, 0, 0, 0, 0, {0}, TW8},
    {"swiglu w8 g128", BO_SWIGLU, W8, BF, 128, 1, 256, 96, 0, 0, 0, 0, {0}, TW8},
    {"swiglu w8 g32", BO_SWIGLU, W8, BF, 32, 1, 512, 64, 0, 0, 0, 0, {0}, TW8},
    {"swiglu bf16 M=1", BO_SWIGLU, BF, 0, 0, 1, 256, 96, 0, 0, 0, 0, {0}, T2},
    {"swiglu bf16 M=17", BO_SWIGLU, BF, 0, 0, 17, 200, 72, 0, 0, 0, 0, {0}, T2},
    {"swiglu w8 g64 M=8", BO_SWIGLU, W8, F32, 64, 8, 320, 40, 0, 0, 0, 0, {0}, TW8},
    {"logits bf16 M=1", BO_LOGITS, BF, 0, 0, 1, 256, 1001, 0, 0, 0, 0, {0}, T2},
    {"logits bf16 M=17", BO_LOGITS, BF, 0, 0, 17, 130, 333, 0, 0, 0, 0, {0}, T2},
    {"logits f32 M=4", BO_LOGITS, F32, 0, 0, 4, 64, 99, 0, 0, 0, 0, {0}, T2},
    {"logits w8 g128 M=2", BO_LOGITS, W8, BF, 128, 2, 256, 300, 0, 0, 0, 0, {0}, TW8},
    {"add_rmsnorm M=1", BO_ADD_RMSNORM, BF, 0, 0, 1, 1024, 0, 0, 0, 0, 0, {0}, T2}, /* CUDA: the fused kernel
										     */
    {"add_rmsnorm M=17", BO_ADD_RMSNORM, BF, 0, 0, 17, 1024, 0, 0, 0, 0, 0, {0}, T2},
    {"add_rmsnorm odd n", BO_ADD_RMSNORM, F32, 0, 0, 4, 99, 0, 0, 0, 0, 0, {0}, T2},
    {"rmsnorm_gate M=1", BO_RMSNORM_GATE, BF, 0, 0, 1, 4096, 0, 0, 0, 0, 0, {0}, T2}, /* CUDA: the fused kernel */
    {"rmsnorm_gate M=3 f32 w", BO_RMSNORM_GATE, F32, 0, 0, 3, 1024, 0, 0, 0, 0, 0, {0}, T2},
    {"rmsnorm_gate M=4 n=256", BO_RMSNORM_GATE, BF, 0, 0, 4, 256, 0, 0, 0, 0, 0, {0}, T2}, /* CUDA: two kernels */
    {"rmsnorm_gate odd n", BO_RMSNORM_GATE, BF, 0, 0, 2, 77, 0, 0, 0, 0, 0, {0}, T2},
    {"add_rmsnorm M=8 n=256", BO_ADD_RMSNORM, BF, 0, 0, 8, 256, 0, 0, 0, 0, 0, {0}, T2}, /* CUDA: the unfused
											    pair */
    {"qk_norm_rope hd64", BO_QK_NORM_ROPE, BF, 0, 0, 1, 0, 1, 4, 4, 64, 9, {0}, T2},
    {"qk_norm_rope hd128 M=17", BO_QK_NORM_ROPE, BF, 0, 0, 17, 0, 1, 4, 2, 128, 100, {0}, T2},
    {"qk_norm_rope no rope M=64", BO_QK_NORM_ROPE, F32, 0, 0, 64, 0, 0, 2, 2, 32, 0, {0}, T2},
    {"sample greedy", BO_SAMPLE, 0, 0, 0, 0, 0, 1000, 0, 0, 0, 0, {0}, T0},
    {"sample temperature", BO_SAMPLE, 0, 0, 0, 1, 0, 1000, 0, 0, 0, 0, {0}, T0},
    {"sample top_k 40", BO_SAMPLE, 0, 0, 0, 2, 0, 5003, 0, 0, 0, 0, {0}, T0},
    {"sample top_p 0.9", BO_SAMPLE, 0, 0, 0, 3, 0, 777, 0, 0, 0, 0, {0}, T0},
    {"copy", BO_COPY, 0, 0, 0, 0, 4099, 0, 0, 0, 0, 0, {0}, T0},
    {"attn_dense prefill+decode", BO_DENSE, 0, 0, 0, 0, 0, 0, 4, 2, 64, 0, {100, 1, 1, 17}, T2},
    {"attn_dense M=64 hd128", BO_DENSE, 0, 0, 0, 0, 0, 0, 4, 2, 128, 0, {64, 64, 2, 0}, T2},
    {"attn_dense hd32 MHA", BO_DENSE, 0, 0, 0, 0, 0, 0, 2, 2, 32, 0, {8, 4, 1, 0}, T2},
    {"attn_sparse decode", BO_SPARSE, 0, 0, 0, 0, 8, 0, 4, 2, 64, 1000, {1, 1, 0, 0}, T2},
    {"attn_sparse M=17", BO_SPARSE, 0, 0, 0, 0, 8, 0, 4, 2, 64, 1100, {17, 0, 0, 0}, T2},
    {"attn_sparse M=64 hd128", BO_SPARSE, 0, 0, 0, 0, 6, 0, 4, 2, 128, 700, {64, 1, 0, 0}, T2},
    {"gla recurrent", BO_GLA, 0, 0, 0, 0, 0, 0, 4, 0, 64, 0, {1, 17, 2, 0}, TGLA},
    {"gla chunked", BO_GLA, 0, 0, 0, 0, 0, 0, 4, 0, 64, 0, {64, 130, 1, 0}, TGLA},
    {"gla chunked hd128", BO_GLA, 0, 0, 0, 0, 0, 0, 2, 0, 128, 0, {200, 8, 0, 0}, TGLA},
    {"gla hd32 M=4", BO_GLA, 0, 0, 0, 0, 0, 0, 3, 0, 32, 0, {4, 4, 70, 0}, TGLA},
    {"cache reserve/len/reset", BO_CACHE, 0, 0, 0, 0, 0, 0, 4, 2, 64, 0, {0}, TGLA},
    {"pool exhaustion", BO_POOL, 0, 0, 0, 0, 0, 0, 4, 2, 64, 0, {0}, T2},
    {"seqs decode B=5", BO_SEQS, BF, 0, 0, 5, 0, 1, 4, 2, 64, 20, {0, 40, 0, 0}, TGLA},
    {"seqs decode B=64 hd128", BO_SEQS, BF, 0, 0, 64, 0, 1, 2, 1, 128, 3, {0, 4, 0, 0}, TGLA},
    {"seqs decode B=3 hd32 no rope f32 norms", BO_SEQS, F32, 0, 0, 3, 0, 0, 2, 2, 32, 100, {0, 20, 0, 0}, TGLA},
    {"seqs mixed rows B=4", BO_SEQS, BF, 0, 0, 4, 0, 1, 4, 2, 64, 50, {3, 6, 0, 0}, TGLA},
    {"seqs one B=1", BO_SEQS, BF, 0, 0, 1, 0, 1, 4, 2, 64, 63, {0, 3, 0, 0}, TGLA},
    /* last (see MM above) */
    {"matmul bf16 M=17 odd K and N", BO_MATMUL, BF, 0, 0, 17, 255, 129, 0, 0, 0, 0, {0}, T2},
};

/* ---- plumbing ------------------------------------------------------------- */

struct run {
	struct sfw_backend *b[2]; /* [0] under test, [1] reference */
	const struct bo_opts *o;
	struct bo_result *r;
	const struct bo_case *c;
	uint64_t rng;
	int fail;
};

static void *need(void *p)
{
	if (!p) {
		printf("FAIL backend_ops: out of memory\n");
		exit(1);
	}
	return p;
}

static void check(struct run *x, int ok, const char *fmt, ...)
{
	char msg[320];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (ok) {
		x->r->checks_passed++;
		if (x->o->verbose)
			printf("  ok   %s: %s\n", x->c->name, msg);
	} else {
		x->r->checks_failed++;
		x->fail = 1;
		if (!x->o->quiet)
			printf("FAIL %s [%s vs %s]: %s\n", x->c->name, x->b[0]->name, x->b[1]->name, msg);
	}
}

float bo_bf16_round(float x)
{
	return sfw_bf16_to_f32(sfw_f32_to_bf16(x));
}

float *bo_rand_act(size_t n, float scale, uint64_t *rng)
{
	float *p = need(malloc((n ? n : 1) * sizeof(float)));
	for (size_t i = 0; i < n; i++)
		p[i] = bo_bf16_round(scale * sfwt_urand(rng));
	return p;
}

/* An f16 of bits h (normal numbers only: the scales made below). */
static float f16_value(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	return ldexpf(1.0f + (float)m / 1024.0f, e - 15);
}

int bo_weight_make(struct bo_weight *bw, enum sfw_dtype dt, enum sfw_dtype sdt, int group, int64_t rows,
		   int64_t cols, float scale, float offset, uint64_t *rng)
{
	memset(bw, 0, sizeof(*bw));
	size_t n = (size_t)rows * (size_t)cols;
	if (!(bw->val = malloc(n * sizeof(float))))
		return -1;
	struct sfw_bweight w = {0};
	w.name = "test", w.dtype = dt, w.rows = rows, w.cols = cols;
	if (dt == SFW_DTYPE_BF16 || dt == SFW_DTYPE_F32) {
		if (!(bw->host = malloc(n * (dt == SFW_DTYPE_BF16 ? 2 : 4))))
			return -1;
		for (size_t i = 0; i < n; i++) {
			float v = offset + scale * sfwt_urand(rng);
			if (dt == SFW_DTYPE_BF16) {
				((uint16_t *)bw->host)[i] = sfw_f32_to_bf16(v);
				v = sfw_bf16_to_f32(((uint16_t *)bw->host)[i]);
			} else {
				((float *)bw->host)[i] = v;
			}
			bw->val[i] = v;
		}
	} else { /* W8, num/w8_layout.h: w[r, k] = (b - 128) * scale[r, k / g] in float32 */
		int64_t rb = sfw_ql_row_bytes(cols), span = sfw_ql_group_span(cols, group);
		int64_t ng = sfw_ql_ngroups(cols, group);
		uint8_t *codes = calloc((size_t)(rows * rb), 1);
		bw->scales = malloc((size_t)(rows * ng) * (sdt == SFW_DTYPE_F32 ? 4 : 2));
		if (!(bw->host = codes) || !bw->scales)
			return -1;
		float *sv = need(malloc((size_t)(rows * ng) * sizeof(float)));
		for (int64_t i = 0; i < rows * ng; i++) {
			/* in [1/128, 1/64): weights up to about 1 (codes of +-128), exact in sdt */
			uint32_t m = (uint32_t)(sfwt_next(rng) >> 54); /* 10 random bits */
			if (sdt == SFW_DTYPE_F16) {
				uint16_t h = (uint16_t)((15 - 7) << 10 | m);
				((uint16_t *)bw->scales)[i] = h;
				sv[i] = f16_value(h);
			} else {
				float v = (1.0f + (float)m / 1024.0f) * (1.0f / 128.0f);
				if (sdt == SFW_DTYPE_BF16) {
					((uint16_t *)bw->scales)[i] = sfw_f32_to_bf16(v);
					sv[i] = sfw_bf16_to_f32(((uint16_t *)bw->scales)[i]);
				} else {
					((float *)bw->scales)[i] = v;
					sv[i] = v;
				}
			}
		}
		for (int64_t r = 0; r < rows; r++)
			for (int64_t k = 0; k < cols; k++) {
				uint8_t b = (uint8_t)(sfwt_next(rng) >> 56);
				codes[r * rb + k] = b;
				bw->val[r * cols + k] = (float)(b - SFW_QL_BIAS) * sv[r * ng + k / span];
			}
		free(sv);
		w.scales = bw->scales, w.scale_dtype = sdt, w.group = group;
	}
	w.host = bw->host;
	bw->w[0] = bw->w[1] = w;
	return 0;
}

void bo_weight_free(struct bo_weight *bw)
{
	free(bw->host), free(bw->scales), free(bw->val);
	memset(bw, 0, sizeof(*bw));
}

static void wmake(struct bo_weight *bw, enum sfw_dtype dt, enum sfw_dtype sdt, int group, int64_t rows,
		  int64_t cols, float scale, float offset, uint64_t *rng)
{
	if (bo_weight_make(bw, dt, sdt, group, rows, cols, scale, offset, rng) != 0)
		need(NULL);
}

static int wup(struct run *x, struct bo_weight *bw)
{
	for (int i = 0; i < 2; i++) {
		struct sfw_err err = {0};
		enum sfw_status s = x->b[i]->weight_upload(x->b[i], &bw->w[i], &err);
		check(x, s == SFW_OK, "weight_upload on %s: %s", x->b[i]->name, err.msg);
		if (s != SFW_OK)
			return -1;
	}
	return 0;
}

/* n activation elements in b's memory holding h. */
static void *dup_act(struct sfw_backend *b, const float *h, size_t n)
{
	void *d = need(b->alloc(b, (n ? n : 1) * sfw_be_act_size(b)));
	sfw_be_from_host_f32(b, d, h, n);
	return d;
}

/* n activation elements in b's memory, all NaN: an unwritten output fails. */
static void *poisoned(struct sfw_backend *b, size_t n)
{
	float *h = need(malloc((n ? n : 1) * sizeof(float)));
	for (size_t i = 0; i < n; i++)
		h[i] = NAN;
	void *d = dup_act(b, h, n);
	free(h);
	return d;
}

static void *dup_raw(struct sfw_backend *b, const void *h, size_t bytes)
{
	void *d = need(b->alloc(b, bytes ? bytes : 1));
	sfw_be_from_host(b, d, h, bytes);
	return d;
}

static float *get(struct sfw_backend *b, const void *d, size_t n)
{
	float *h = need(malloc((n ? n : 1) * sizeof(float)));
	sfw_be_wait(b);
	sfw_be_to_host_f32(b, h, d, 0, n);
	return h;
}

static void *at(const struct sfw_backend *b, void *p, size_t elems)
{
	return (char *)p + elems * sfw_be_act_size(b);
}

/* Output `what` of backend 0 against backend 1. */
static void cmp(struct run *x, const char *what, const float *got, const float *ref, size_t n)
{
	if (x->o->exact) { /* NaN is never an output: an element both left unwritten (poisoned) fails */
		size_t i = 0;
		while (i < n && memcmp(&got[i], &ref[i], sizeof(float)) == 0 && !isnan(got[i]))
			i++;
		check(x, i == n, "%s: bit-identical (%zu values)%s%.9g vs %.9g at %zu", what, n,
		      i == n ? "" : "; first difference or NaN ", i < n ? got[i] : 0.0, i < n ? ref[i] : 0.0,
		      i);
		return;
	}
	struct cmp_stats s = cmp_stats(got, ref, n);
	struct tol t = tols[x->c->tol];
	int ok = s.bad == 0 && s.nmse <= t.nmse && s.maxd <= t.maxrel * (s.maxr > 0 ? s.maxr : 1);
	check(x, ok,
	      "%s: NMSE %.2e (<= %.1e), max|d| %.2e (<= %.1e x max|ref| %.3g), %zu non-finite mismatches",
	      what, s.nmse, t.nmse, s.maxd, t.maxrel, s.maxr, s.bad);
}

/* Device buffers of both backends for the same host data. */
struct pair {
	void *d[2];
};

static struct pair pair_act(struct run *x, const float *h, size_t n)
{
	struct pair p = {{dup_act(x->b[0], h, n), dup_act(x->b[1], h, n)}};
	return p;
}

static struct pair pair_poisoned(struct run *x, size_t n)
{
	struct pair p = {{poisoned(x->b[0], n), poisoned(x->b[1], n)}};
	return p;
}

static void pair_free(struct run *x, struct pair *p)
{
	for (int i = 0; i < 2; i++)
		if (p->d[i])
			x->b[i]->free(x->b[i], p->d[i]);
	p->d[0] = p->d[1] = NULL;
}

static void pair_cmp(struct run *x, const char *what, struct pair *p, size_t n)
{
	float *g = get(x->b[0], p->d[0], n), *r = get(x->b[1], p->d[1], n);
	cmp(x, what, g, r, n);
	free(g), free(r);
}

/* ---- elementwise, norms, matrix products ------------------------------- */

static void t_embed(struct run *x)
{
	const struct bo_case *c = x->c;
	struct bo_weight E;
	wmake(&E, c->wdt, 0, 0, c->N, c->K, 0.05f, 0, &x->rng);
	if (wup(x, &E))
		return bo_weight_free(&E);
	int32_t *ids = need(malloc((size_t)c->M * sizeof(int32_t)));
	for (int t = 0; t < c->M; t++)
		ids[t] = t == 0 ? c->N - 1 : (int32_t)(sfwt_next(&x->rng) % (uint64_t)c->N);
	struct pair id = {{dup_raw(x->b[0], ids, (size_t)c->M * 4), dup_raw(x->b[1], ids, (size_t)c->M * 4)}};
	size_t n = (size_t)c->M * c->K;
	struct pair y = pair_poisoned(x, n);
	for (int i = 0; i < 2; i++)
		sfw_be_embed(x->b[i], y.d[i], &E.w[i], id.d[i], c->M, 12.0f);
	pair_cmp(x, "x = E[ids] * 12", &y, n);
	pair_free(x, &y), pair_free(x, &id), free(ids);
	bo_weight_free(&E);
}

static void t_rmsnorm(struct run *x)
{
	const struct bo_case *c = x->c;
	struct bo_weight w;
	wmake(&w, c->wdt, 0, 0, 1, c->K, 0.1f, 1.0f, &x->rng);
	if (wup(x, &w))
		return bo_weight_free(&w);
	size_t n = (size_t)c->M * c->K;
	float *h = bo_rand_act(n, 2.0f, &x->rng);
	struct pair in = pair_act(x, h, n), y = pair_poisoned(x, n);
	for (int i = 0; i < 2; i++)
		sfw_be_rmsnorm(x->b[i], y.d[i], in.d[i], &w.w[i], c->M, c->K, 1e-6f);
	pair_cmp(x, "y = rmsnorm(x)", &y, n);
	for (int i = 0; i < 2; i++) /* y may alias x */
		sfw_be_rmsnorm(x->b[i], in.d[i], in.d[i], &w.w[i], c->M, c->K, 1e-6f);
	pair_cmp(x, "x = rmsnorm(x) in place", &in, n);
	pair_free(x, &in), pair_free(x, &y), free(h);
	bo_weight_free(&w);
}

static void t_elementwise(struct run *x)
{
	const struct bo_case *c = x->c;
	size_t n = (size_t)c->M * c->K;
	float *ha = bo_rand_act(n, 3.0f, &x->rng), *hb = bo_rand_act(n, 3.0f, &x->rng);
	struct pair a = pair_act(x, ha, n), b = pair_act(x, hb, n), y = pair_poisoned(x, n);
	for (int i = 0; i < 2; i++) {
		struct sfw_backend *be = x->b[i];
		if (c->op == BO_ADD_SCALED)
			sfw_be_add_scaled(be, a.d[i], b.d[i], n, 0.35355339f);
		else if (c->op == BO_SILU_MUL)
			sfw_be_silu_mul(be, y.d[i], a.d[i], b.d[i], n);
		else
			sfw_be_sigmoid_mul(be, y.d[i], a.d[i], b.d[i], n);
	}
	if (c->op == BO_ADD_SCALED)
		pair_cmp(x, "x += 0.354 b", &a, n);
	else
		pair_cmp(x, c->op == BO_SILU_MUL ? "y = silu(g) u" : "y = x sigmoid(g)", &y, n);
	pair_free(x, &a), pair_free(x, &b), pair_free(x, &y), free(ha), free(hb);
}

static void t_rope(struct run *x)
{
	const struct bo_case *c = x->c;
	size_t n = (size_t)c->M * c->nh * c->hd;
	float *h = bo_rand_act(n, 1.0f, &x->rng);
	struct pair a = pair_act(x, h, n);
	for (int i = 0; i < 2; i++)
		sfw_be_rope_neox(x->b[i], a.d[i], c->M, c->nh, c->hd, c->pos0, 10000.0f);
	pair_cmp(x, "rope_neox in place", &a, n);
	pair_free(x, &a), free(h);
}

static void skip(struct run *x, const char *why)
{
	x->r->skipped++;
	printf("SKIP %s [%s]: %s\n", x->c->name, x->b[0]->name, why);
}

/* 1 when backend 0 lacks what the case needs (reported as skipped). */
static int lacks_w8(struct run *x)
{
	if (x->c->wdt == SFW_DTYPE_W8 && !x->b[0]->supports_op(x->b[0], SFW_OP_MATMUL, SFW_DTYPE_W8)) {
		skip(x, "the backend does not take int8 weights");
		return 1;
	}
	return 0;
}

static void t_matmul(struct run *x)
{
	const struct bo_case *c = x->c;
	struct bo_weight w;
	wmake(&w, c->wdt, c->sdt, c->group, c->N, c->K, 0.05f, 0, &x->rng);
	if (wup(x, &w))
		return bo_weight_free(&w);
	float *h = bo_rand_act((size_t)c->M * c->K, 1.0f, &x->rng);
	size_t ny = (size_t)c->M * c->N;
	struct pair in = pair_act(x, h, (size_t)c->M * c->K);
	if (c->op == BO_MATMUL) {
		struct pair y = pair_poisoned(x, ny);
		for (int i = 0; i < 2; i++)
			sfw_be_matmul(x->b[i], y.d[i], in.d[i], &w.w[i], c->M);
		pair_cmp(x, "y = x W^T", &y, ny);
		pair_free(x, &y);
	} else { /* logits: float32 in backend memory */
		float *nan = need(malloc(ny * sizeof(float)));
		for (size_t i = 0; i < ny; i++)
			nan[i] = NAN;
		float *g[2];
		for (int i = 0; i < 2; i++) {
			float *d = dup_raw(x->b[i], nan, ny * 4);
			sfw_be_logits(x->b[i], d, in.d[i], &w.w[i], c->M, 0.25f);
			g[i] = need(malloc(ny * sizeof(float)));
			sfw_be_to_host(x->b[i], g[i], d, ny * 4);
			x->b[i]->free(x->b[i], d);
		}
		cmp(x, "logits = (x / 4) W^T", g[0], g[1], ny);
		free(g[0]), free(g[1]), free(nan);
	}
	pair_free(x, &in), free(h);
	bo_weight_free(&w);
}

/* Rows [r0, r0 + n) of an uploaded weight as a weight of their own (host
 * and backend copies): a part of a projection group. */
static struct sfw_bweight rows_view(const struct sfw_bweight *w, int64_t r0, int64_t n)
{
	struct sfw_bweight v = *w;
	size_t rb = w->dtype == SFW_DTYPE_W8 ? sfw_bweight_w8_code_row(w) : (size_t)w->cols * (w->dtype == SFW_DTYPE_F32 ? 4 : 2);
	size_t sb = w->dtype == SFW_DTYPE_W8 ? sfw_bweight_w8_scale_row(w) : 0;
	v.rows = n;
	v.host = (const char *)w->host + (size_t)r0 * rb;
	if (w->dev)
		v.dev = (char *)w->dev + (size_t)r0 * rb;
	if (sb) {
		v.scales = (const char *)w->scales + (size_t)r0 * sb;
		if (w->scales_dev)
			v.scales_dev = (char *)w->scales_dev + (size_t)r0 * sb;
	}
	return v;
}

/* swiglu over a gate|up group whose parts are the two row halves of one
 * [2N, K] weight (merged, as be->merge places them, and then again as two
 * separate parts): against the reference's matmul + silu_mul, and the
 * merged one-row call against backend 0's own matmul over the whole weight
 * + silu_mul bit for bit (the member's contract, runner/backend.h). */
static void t_swiglu(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0], *ref = x->b[1];
	struct bo_weight w;
	wmake(&w, c->wdt, c->sdt, c->group, 2 * c->N, c->K, 0.05f, 0, &x->rng);
	if (wup(x, &w))
		return bo_weight_free(&w);
	size_t n = (size_t)c->M * c->N;
	float *h = bo_rand_act((size_t)c->M * c->K, 1.0f, &x->rng);
	struct pair in = pair_act(x, h, (size_t)c->M * c->K), t = pair_poisoned(x, 2 * n);
	struct sfw_bweight g[2][2];
	struct sfw_bgroup gu[2];
	for (int i = 0; i < 2; i++) {
		g[i][0] = rows_view(&w.w[i], 0, c->N), g[i][1] = rows_view(&w.w[i], c->N, c->N);
		gu[i].part[0] = &g[i][0], gu[i].part[1] = &g[i][1], gu[i].n = 2;
		/* the whole weight is the group's merged matrix where the backend
		 * keeps a copy of its own (the CPU reads the map: no merging) */
		memset(&gu[i].merged, 0, sizeof(gu[i].merged));
		if (w.w[i].dev)
			gu[i].merged = w.w[i];
	}
	struct pair ry = pair_poisoned(x, n);
	sfw_be_matmul(ref, t.d[1], in.d[1], &g[1][0], c->M);
	sfw_be_matmul(ref, at(ref, t.d[1], n), in.d[1], &g[1][1], c->M);
	sfw_be_silu_mul(ref, ry.d[1], t.d[1], at(ref, t.d[1], n), n);
	for (int merged = 1; merged >= 0; merged--) {
		struct sfw_bgroup gb = gu[0];
		if (!merged)
			memset(&gb.merged, 0, sizeof(gb.merged));
		struct pair y = pair_poisoned(x, n);
		sfw_be_swiglu(be, y.d[0], t.d[0], in.d[0], &gb, c->M);
		sfw_be_copy(ref, y.d[1], ry.d[1], n * sfw_be_act_size(ref));
		pair_cmp(x, merged ? "y = silu(x G^T) (x U^T), merged group" : "y = silu(x G^T) (x U^T), two parts", &y,
			 n);
		if (merged && c->M == 1 && gb.merged.rows) {
			void *own = poisoned(be, n), *tw = poisoned(be, 2 * n);
			sfw_be_matmul(be, tw, in.d[0], &w.w[0], 1);
			sfw_be_silu_mul(be, own, tw, at(be, tw, n), n);
			float *a = get(be, y.d[0], n), *b = get(be, own, n);
			check(x, memcmp(a, b, n * sizeof(float)) == 0,
			      "merged swiglu == own matmul over the whole weight + silu_mul bit for bit");
			free(a), free(b);
			be->free(be, own), be->free(be, tw);
		}
		pair_free(x, &y);
	}
	pair_free(x, &in), pair_free(x, &t), pair_free(x, &ry), free(h);
	bo_weight_free(&w);
}

/* add_rmsnorm against the reference's (or its add_scaled + rmsnorm), and
 * backend 0's fused member against its own composition bit for bit. */
/* The norm cases' inputs: the weight [1, K] in the case's dtype, and two
 * random [M, K] activations (values up to 2 and up to sb) as host arrays
 * and pairs. 0 when the weight could not go up (then nothing is held). */
static int norm_inputs(struct run *x, struct bo_weight *w, float sb, float **ha, float **hb, struct pair *a,
		       struct pair *b)
{
	const struct bo_case *c = x->c;
	wmake(w, c->wdt, 0, 0, 1, c->K, 0.1f, 1.0f, &x->rng);
	if (wup(x, w)) {
		bo_weight_free(w);
		return 0;
	}
	size_t n = (size_t)c->M * c->K;
	*ha = bo_rand_act(n, 2.0f, &x->rng), *hb = bo_rand_act(n, sb, &x->rng);
	*a = pair_act(x, *ha, n), *b = pair_act(x, *hb, n);
	return 1;
}

static void t_add_rmsnorm(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0], *ref = x->b[1];
	struct bo_weight w;
	float *ha, *hb;
	struct pair a, b;
	if (!norm_inputs(x, &w, 2.0f, &ha, &hb, &a, &b))
		return;
	size_t n = (size_t)c->M * c->K;
	struct pair y = pair_poisoned(x, n);
	const float s = 0.2f, eps = 1e-6f;
	sfw_be_add_rmsnorm(be, y.d[0], a.d[0], b.d[0], s, &w.w[0], c->M, c->K, eps);
	sfw_be_add_rmsnorm(ref, y.d[1], a.d[1], b.d[1], s, &w.w[1], c->M, c->K, eps);
	pair_cmp(x, "x += 0.2 b", &a, n);
	pair_cmp(x, "y = rmsnorm(x)", &y, n);
	/* the composition on backend 0 from the same inputs */
	void *a2 = dup_act(be, ha, n), *y2 = poisoned(be, n);
	sfw_be_add_scaled(be, a2, b.d[0], n, s);
	sfw_be_rmsnorm(be, y2, a2, &w.w[0], c->M, c->K, eps);
	float *f = get(be, y.d[0], n), *u = get(be, y2, n);
	check(x, memcmp(f, u, n * sizeof(float)) == 0, "fused == own add_scaled + rmsnorm bit for bit");
	free(f), free(u);
	be->free(be, a2), be->free(be, y2);
	pair_free(x, &a), pair_free(x, &b), pair_free(x, &y), free(ha), free(hb);
	bo_weight_free(&w);
}

/* rmsnorm_gate against the reference's, in place (y = x, as forward.c
 * calls it) as well as not, and backend 0's fused member against its own
 * rmsnorm + sigmoid_mul bit for bit. */
static void t_rmsnorm_gate(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0], *ref = x->b[1];
	struct bo_weight w;
	float *ha, *hz;
	struct pair a, z;
	if (!norm_inputs(x, &w, 4.0f, &ha, &hz, &a, &z))
		return;
	size_t n = (size_t)c->M * c->K;
	struct pair y = pair_poisoned(x, n);
	const float eps = 1e-6f;
	sfw_be_rmsnorm_gate(be, y.d[0], a.d[0], &w.w[0], z.d[0], c->M, c->K, eps);
	sfw_be_rmsnorm_gate(ref, y.d[1], a.d[1], &w.w[1], z.d[1], c->M, c->K, eps);
	pair_cmp(x, "y = rmsnorm(x) * sigmoid(z)", &y, n);
	pair_cmp(x, "x unchanged", &a, n);
	/* in place on backend 0, and its own composition, from the same inputs */
	void *a2 = dup_act(be, ha, n), *y3 = poisoned(be, n);
	sfw_be_rmsnorm_gate(be, a2, a2, &w.w[0], z.d[0], c->M, c->K, eps);
	sfw_be_rmsnorm(be, y3, a.d[0], &w.w[0], c->M, c->K, eps);
	sfw_be_sigmoid_mul(be, y3, y3, z.d[0], n);
	float *f = get(be, y.d[0], n), *g = get(be, a2, n), *u = get(be, y3, n);
	check(x, memcmp(f, g, n * sizeof(float)) == 0, "in place == out of place bit for bit");
	check(x, memcmp(f, u, n * sizeof(float)) == 0, "fused == own rmsnorm + sigmoid_mul bit for bit");
	free(f), free(g), free(u);
	be->free(be, a2), be->free(be, y3);
	pair_free(x, &a), pair_free(x, &z), pair_free(x, &y), free(ha), free(hz);
	bo_weight_free(&w);
}

static void qk_compose(struct sfw_backend *b, void *q, void *k, const struct sfw_bweight *qw,
		       const struct sfw_bweight *kw, const struct bo_case *c)
{
	sfw_be_rmsnorm(b, q, q, qw, c->M * c->nh, c->hd, 1e-6f);
	sfw_be_rmsnorm(b, k, k, kw, c->M * c->nkv, c->hd, 1e-6f);
	if (c->N) {
		sfw_be_rope_neox(b, q, c->M, c->nh, c->hd, c->pos0, 10000.0f);
		sfw_be_rope_neox(b, k, c->M, c->nkv, c->hd, c->pos0, 10000.0f);
	}
}

static void t_qk_norm_rope(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0], *ref = x->b[1];
	struct bo_weight qw, kw;
	wmake(&qw, c->wdt, 0, 0, 1, c->hd, 0.1f, 1.0f, &x->rng);
	wmake(&kw, c->wdt, 0, 0, 1, c->hd, 0.1f, 1.0f, &x->rng);
	if (wup(x, &qw) || wup(x, &kw))
		return bo_weight_free(&qw), bo_weight_free(&kw);
	size_t nq = (size_t)c->M * c->nh * c->hd, nk = (size_t)c->M * c->nkv * c->hd;
	float *hq = bo_rand_act(nq, 2.0f, &x->rng), *hk = bo_rand_act(nk, 2.0f, &x->rng);
	struct pair q = pair_act(x, hq, nq), k = pair_act(x, hk, nk);
	sfw_be_qk_norm_rope(be, q.d[0], k.d[0], &qw.w[0], &kw.w[0], c->M, c->nh, c->nkv, c->hd, 1e-6f, c->N,
			 c->pos0, 10000.0f);
	sfw_be_qk_norm_rope(ref, q.d[1], k.d[1], &qw.w[1], &kw.w[1], c->M, c->nh, c->nkv, c->hd, 1e-6f, c->N,
			  c->pos0, 10000.0f);
	pair_cmp(x, "q", &q, nq);
	pair_cmp(x, "k", &k, nk);
	void *q2 = dup_act(be, hq, nq), *k2 = dup_act(be, hk, nk);
	qk_compose(be, q2, k2, &qw.w[0], &kw.w[0], c);
	float *a = get(be, q.d[0], nq), *b = get(be, q2, nq), *e = get(be, k.d[0], nk), *f = get(be, k2, nk);
	check(x, !memcmp(a, b, nq * 4) && !memcmp(e, f, nk * 4),
	      "fused == own rmsnorm x2 + rope x2 bit for bit");
	free(a), free(b), free(e), free(f);
	be->free(be, q2), be->free(be, k2);
	pair_free(x, &q), pair_free(x, &k), free(hq), free(hk);
	bo_weight_free(&qw), bo_weight_free(&kw);
}

static void t_sample(struct run *x)
{
	const struct bo_case *c = x->c;
	static const struct sfw_op_sample_params ps[] = {
	    {.temperature = 0, .top_k = 0, .top_p = 1, .greedy = 1},
	    {.temperature = 0.8f, .top_k = 0, .top_p = 1, .greedy = 0},
	    {.temperature = 0.7f, .top_k = 40, .top_p = 1, .greedy = 0},
	    {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .greedy = 0}};
	/* three rows in one call: this case's sampler, no choice, the next sampler */
	const struct sfw_op_sample_params *p[3] = {&ps[c->M], NULL, &ps[(c->M + 1) % 4]};
	float *l = need(malloc((size_t)3 * c->N * sizeof(float)));
	for (int round = 0; round < 8; round++) {
		for (int i = 0; i < 3 * c->N; i++)
			l[i] = 4.0f * sfwt_urand(&x->rng);
		double u[3] = {sfwt_unit(&x->rng), 0.5, sfwt_unit(&x->rng)};
		int32_t id[2][3];
		for (int i = 0; i < 2; i++) {
			struct sfw_backend *b = x->b[i];
			float *d = dup_raw(b, l, (size_t)3 * c->N * 4);
			int32_t init[4] = {-2, -2, -2, -2};
			int32_t *o = dup_raw(b, init, sizeof(init));
			if (sfw_be_sample(b, o, d, c->N, 3, p, u))
				sfw_be_to_host(b, id[i], o, sizeof(id[i]));
			else /* this backend leaves every draw to the host */
				id[i][0] = id[i][2] = -1, id[i][1] = -2;
			b->free(b, d), b->free(b, o);
		}
		/* -1: the backend hands the draw to the host (sfw_op_sample_cpu,
		 * which is the CPU backend's own answer) */
		for (int r = 0; r < 3; r += 2)
			check(x, id[1][r] >= 0 && id[1][r] < c->N && (id[0][r] == id[1][r] || id[0][r] == -1),
			      "round %d row %d (u %.4f): id %d vs %d", round, r, u[r], id[0][r], id[1][r]);
		check(x, id[0][1] == -2 && id[1][1] == -2, "round %d: the row without a sampler untouched (%d, %d)", round,
		      id[0][1], id[1][1]);
	}
	free(l);
}

static void t_copy(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0];
	unsigned char *h = need(malloc((size_t)c->K)), *g = need(malloc((size_t)c->K));
	for (int i = 0; i < c->K; i++)
		h[i] = (unsigned char)(sfwt_next(&x->rng) >> 56);
	void *src = dup_raw(be, h, (size_t)c->K), *dst = need(be->alloc(be, (size_t)c->K + 8));
	sfw_be_copy(be, dst, src, (size_t)c->K);
	sfw_be_to_host(be, g, dst, (size_t)c->K);
	check(x, memcmp(g, h, (size_t)c->K) == 0, "%d bytes copied unchanged", c->K);
	be->free(be, src), be->free(be, dst), free(h), free(g);
}

/* ---- caches ------------------------------------------------------------------ */

static const enum sfw_mixer mix[2] = {SFW_MIXER_SPARSE, SFW_MIXER_LIGHTNING};

/* Layer 0 sparse, layer 1 lightning; compression 32/16, blocks of 64. */
static void desc_of(const struct bo_case *c, struct sfw_cache_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->n_layers = 2;
	d->mixer = mix;
	d->nkv = c->nkv ? c->nkv : 1;
	d->hd = c->hd;
	d->lnh = c->nh, d->lhd = c->hd;
	d->ksize = 32, d->stride = 16, d->block = 64;
	d->sel_k = c->K + 3;
}

static int caches_new(struct run *x, const struct sfw_cache_desc *d, struct sfw_bcache *cc[2])
{
	cc[0] = cc[1] = NULL;
	for (int i = 0; i < 2; i++) {
		struct sfw_err err = {0};
		enum sfw_status s = x->b[i]->cache_new(x->b[i], d, &cc[i], &err);
		check(x, s == SFW_OK, "cache_new on %s: %s", x->b[i]->name, err.msg);
		if (s != SFW_OK)
			return -1;
	}
	return 0;
}

static void caches_free(struct run *x, struct sfw_bcache *cc[2])
{
	for (int i = 0; i < 2; i++)
		if (cc[i])
			x->b[i]->cache_free(x->b[i], cc[i]);
}

static int reserve(struct run *x, struct sfw_bcache *cc[2], int64_t tokens)
{
	for (int i = 0; i < 2; i++) {
		struct sfw_err err = {0};
		enum sfw_status s = x->b[i]->cache_reserve(x->b[i], cc[i], tokens, &err);
		if (s != SFW_OK) {
			check(x, 0, "cache_reserve(%lld) on %s: %s", (long long)tokens, x->b[i]->name,
			      err.msg);
			return -1;
		}
	}
	return 0;
}

/* Appends T random rows of K and V to layer 0 of both caches. */
static void append(struct run *x, struct sfw_bcache *cc[2], int T, const struct sfw_cache_desc *d)
{
	size_t n = (size_t)T * d->nkv * d->hd;
	float *hk = bo_rand_act(n, 1.0f, &x->rng), *hv = bo_rand_act(n, 1.0f, &x->rng);
	struct pair k = pair_act(x, hk, n), v = pair_act(x, hv, n);
	for (int i = 0; i < 2; i++)
		sfw_be_kv_append(x->b[i], cc[i], 0, k.d[i], v.d[i], T);
	pair_free(x, &k), pair_free(x, &v), free(hk), free(hv);
}

static int64_t nchunks(int64_t len, int ksize, int stride)
{
	return len < ksize ? 0 : (len - ksize) / stride + 1;
}

static void t_dense(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_cache_desc d;
	desc_of(c, &d);
	struct sfw_bcache *cc[2];
	if (caches_new(x, &d, cc) == 0) {
		int64_t len = 0;
		for (int j = 0; j < 4 && c->calls[j]; j++) {
			int T = c->calls[j];
			if (reserve(x, cc, len + T)) /* grows call by call, as decode does */
				break;
			append(x, cc, T, &d);
			len += T;
			size_t n = (size_t)T * c->nh * c->hd;
			float *hq = bo_rand_act(n, 1.0f, &x->rng);
			struct pair q = pair_act(x, hq, n), o = pair_poisoned(x, n);
			for (int i = 0; i < 2; i++)
				sfw_be_attn_dense(x->b[i], o.d[i], q.d[i], cc[i], 0, T, c->nh,
						    1.0f / sqrtf((float)c->hd));
			char what[64];
			snprintf(what, sizeof(what), "call %d (%d rows at %lld)", j, T, (long long)(len - T));
			pair_cmp(x, what, &o, n);
			check(x,
			      sfw_be_cache_len(x->b[0], cc[0], 0) == len &&
				  sfw_be_cache_len(x->b[1], cc[1], 0) == len,
			      "cache_len %lld after call %d", (long long)len, j);
			pair_free(x, &q), pair_free(x, &o), free(hq);
		}
	}
	caches_free(x, cc);
}

/* The InfLLM-v2 path as forward.c drives it: append, compress, select,
 * attend. Selection is compared where it is defined up to near ties (bf16
 * compressed keys on the CUDA side); attn_sparse is then fed the
 * reference's blocks on both backends so it is compared on equal inputs. */
static void t_sparse(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_cache_desc d;
	desc_of(c, &d);
	struct sfw_bcache *cc[2];
	if (caches_new(x, &d, cc) != 0)
		return caches_free(x, cc);
	int64_t len = 0, need_len = c->pos0;
	for (int j = 0; j < 4 && c->calls[j]; j++)
		need_len += c->calls[j];
	if (reserve(x, cc, need_len))
		return caches_free(x, cc);
	for (int64_t done = 0; done < c->pos0; done += 256) {
		int T = (int)(c->pos0 - done < 256 ? c->pos0 - done : 256);
		append(x, cc, T, &d);
		len += T;
	}
	for (int j = 0; j < 4 && c->calls[j]; j++) {
		int T = c->calls[j];
		append(x, cc, T, &d);
		len += T;
		for (int i = 0; i < 2; i++) {
			struct sfw_err err = {0};
			check(x, sfw_be_compress(x->b[i], cc[i], 0, &err) == SFW_OK, "compress on %s: %s",
			      x->b[i]->name, err.msg);
		}
		int64_t n2[2][2];
		for (int i = 0; i < 2; i++)
			sfw_be_cache_ncompressed(x->b[i], cc[i], 0, n2[i]);
		check(x,
		      n2[0][0] == nchunks(len, 32, 16) && n2[0][1] == nchunks(len, 128, 64) &&
			  n2[1][0] == n2[0][0] && n2[1][1] == n2[0][1],
		      "compressed keys at %lld tokens: (%lld, %lld) and (%lld, %lld), want (%lld, %lld)",
		      (long long)len, (long long)n2[0][0], (long long)n2[0][1], (long long)n2[1][0],
		      (long long)n2[1][1], (long long)nchunks(len, 32, 16), (long long)nchunks(len, 128, 64));
		struct sfw_sparse_params sp = {len - T, T,  (len + 63) / 64,	       d.sel_k, 1, 2, 32,
					       16,	64, 1.0f / sqrtf((float)c->hd)};
		size_t nq = (size_t)T * c->nh * c->hd, ni = (size_t)d.nkv * T * sp.k;
		float *hq = bo_rand_act(nq, 2.0f, &x->rng);
		struct pair q = pair_act(x, hq, nq), o = pair_poisoned(x, nq);
		int32_t *idx[2], *idev[2];
		float *pl[2];
		for (int i = 0; i < 2; i++) {
			struct sfw_backend *b = x->b[i];
			struct sfw_err err = {0};
			idev[i] = need(b->alloc(b, ni * 4));
			idx[i] = need(malloc(ni * 4));
			pl[i] = need(malloc((size_t)d.nkv * sp.nblocks * 4));
			check(x,
			      sfw_be_sparse_select(b, idev[i], q.d[i], cc[i], 0, c->nh, &sp, pl[i], &err) ==
				  SFW_OK,
			      "sparse_select on %s: %s", b->name, err.msg);
			sfw_be_to_host(b, idx[i], idev[i], ni * 4);
		}
		/* agreement per (KV head, row) as multisets: the k slots hold the
		 * chosen blocks in ascending order, then -1s, so one block swapped
		 * for another would shift every slot after it if slots were
		 * compared by position */
		size_t same = 0;
		for (size_t seg = 0; seg < ni; seg += (size_t)sp.k) {
			const int32_t *u = idx[0] + seg, *v = idx[1] + seg;
			int i = 0, jj = 0, nu = 0, nv = 0;
			while (i < sp.k && jj < sp.k && u[i] >= 0 && v[jj] >= 0) {
				if (u[i] == v[jj])
					same++, i++, jj++;
				else if (u[i] < v[jj])
					i++;
				else
					jj++;
			}
			for (int e = 0; e < sp.k; e++)
				nu += u[e] < 0, nv += v[e] < 0;
			same += (size_t)(nu < nv ? nu : nv);
		}
		char what[96];
		snprintf(what, sizeof(what), "call %d (%d rows at %lld): pooled scores of the last row", j, T,
			 (long long)sp.pos0);
		cmp(x, what, pl[0], pl[1], (size_t)d.nkv * sp.nblocks);
		/* bf16: at most 1 in 10 selected blocks another one (near ties of
		 * the pooled scores, whose tolerance is checked just above) */
		check(x, x->o->exact ? same == ni : same * 10 >= ni * 9,
		      "call %d: %zu of %zu selected blocks agree", j, same, ni);
		sfw_be_from_host(x->b[0], idev[0], idx[1], ni * 4);
		for (int i = 0; i < 2; i++)
			sfw_be_attn_sparse(x->b[i], o.d[i], q.d[i], cc[i], 0, idev[i], c->nh, &sp);
		snprintf(what, sizeof(what), "call %d (%d rows): attn_sparse over the reference's blocks", j,
			 T);
		pair_cmp(x, what, &o, nq);
		for (int i = 0; i < 2; i++)
			x->b[i]->free(x->b[i], idev[i]), free(idx[i]), free(pl[i]);
		pair_free(x, &q), pair_free(x, &o), free(hq);
	}
	caches_free(x, cc);
}

static float *slopes(int nh)
{
	float *s = need(malloc((size_t)nh * sizeof(float)));
	for (int h = 0; h < nh; h++) /* ALiBi-like, the reference's form */
		s[h] = exp2f(-8.0f * (float)(h + 1) / (float)nh);
	return s;
}

/* Calls of T rows on layer 1 (lightning) of caches cc; from call `from` on. */
static void gla_calls(struct run *x, struct sfw_bcache *cc[2], const int *calls, int ncalls, const char *tag)
{
	const struct bo_case *c = x->c;
	float *hs = slopes(c->nh);
	struct pair dec = {
	    {dup_raw(x->b[0], hs, (size_t)c->nh * 4), dup_raw(x->b[1], hs, (size_t)c->nh * 4)}};
	for (int j = 0; j < ncalls && calls[j]; j++) {
		int T = calls[j];
		size_t n = (size_t)T * c->nh * c->hd;
		float *hq = bo_rand_act(n, 1.0f, &x->rng), *hk = bo_rand_act(n, 1.0f, &x->rng),
		      *hv = bo_rand_act(n, 1.0f, &x->rng);
		struct pair q = pair_act(x, hq, n), k = pair_act(x, hk, n), v = pair_act(x, hv, n),
			    o = pair_poisoned(x, n);
		for (int i = 0; i < 2; i++)
			sfw_be_gla(x->b[i], o.d[i], q.d[i], k.d[i], v.d[i], cc[i], 1, dec.d[i], T, c->nh,
				     c->hd, 1.0f / sqrtf((float)c->hd));
		char what[80];
		snprintf(what, sizeof(what), "%scall %d (%d rows, %s)", tag, j, T,
			 T >= 64 ? "chunked" : "recurrent");
		pair_cmp(x, what, &o, n);
		pair_free(x, &q), pair_free(x, &k), pair_free(x, &v), pair_free(x, &o);
		free(hq), free(hk), free(hv);
	}
	pair_free(x, &dec), free(hs);
}

static void t_gla(struct run *x)
{
	struct sfw_cache_desc d;
	desc_of(x->c, &d);
	struct sfw_bcache *cc[2];
	if (caches_new(x, &d, cc) == 0)
		gla_calls(x, cc, x->c->calls, 4, "");
	caches_free(x, cc);
}

/* The per-sequence ops of a step over several caches, as forward.c calls
 * them (sparse layer 0: kv_append_seqs, compress_seqs, attn_dense_seqs;
 * lightning layer 1: qk_norm_rope_seqs, gla_seqs), each sequence at its own
 * length; the backend under test may run a call as one launch. */
static void t_seqs(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_cache_desc d;
	desc_of(c, &d);
	int ns = c->M, nh = c->nh, hd = c->hd, nkv = d.nkv;
	struct sfw_bcache *cc[SFW_BSEQ_MAX][2];
	struct sfw_bseq bs[2][SFW_BSEQ_MAX];
	int64_t len[SFW_BSEQ_MAX];
	int made = 0, ok = 1;
	float scale = 1.0f / sqrtf((float)hd);
	float *hs = slopes(nh);
	struct pair dec = {{dup_raw(x->b[0], hs, (size_t)nh * 4), dup_raw(x->b[1], hs, (size_t)nh * 4)}};
	struct bo_weight qw, kw;
	wmake(&qw, c->wdt, 0, 0, 1, hd, 0.1f, 1.0f, &x->rng);
	wmake(&kw, c->wdt, 0, 0, 1, hd, 0.1f, 1.0f, &x->rng);
	if (wup(x, &qw) || wup(x, &kw))
		ok = 0;
	/* each sequence's history: K/V appended and compressed, GLA rows */
	for (int i = 0; ok && i < ns; i++, made++) {
		if (caches_new(x, &d, cc[i]) || reserve(x, cc[i], c->pos0 + 29 * i + 1)) {
			made += cc[i][0] || cc[i][1];
			ok = 0;
			break;
		}
		len[i] = c->pos0 + 29 * i;
		if (len[i] > 0) {
			append(x, cc[i], (int)len[i], &d);
			for (int b = 0; b < 2; b++) {
				struct sfw_err err = {0};
				check(x, sfw_be_compress(x->b[b], cc[i][b], 0, &err) == SFW_OK, "compress: %s",
				      err.msg);
			}
			int g = (int)(len[i] % 97 + 1);
			gla_calls(x, cc[i], &g, 1, "history ");
		}
	}
	for (int st = 0; ok && st < c->calls[1]; st++) {
		int rows = 0;
		for (int i = 0; i < ns; i++) {
			int R = c->calls[0] ? 1 + i % c->calls[0] : 1;
			if (reserve(x, cc[i], len[i] + R)) {
				ok = 0;
				break;
			}
			for (int b = 0; b < 2; b++)
				bs[b][i] = (struct sfw_bseq){cc[i][b], len[i], rows, R};
			rows += R;
		}
		if (!ok)
			break;
		size_t nq = (size_t)rows * nh * hd, nk = (size_t)rows * nkv * hd;
		float *hq = bo_rand_act(nq, 1.0f, &x->rng), *hk = bo_rand_act(nk, 1.0f, &x->rng),
		      *hv = bo_rand_act(nk, 1.0f, &x->rng);
		float *lq = bo_rand_act(nq, 2.0f, &x->rng), *lk = bo_rand_act(nq, 2.0f, &x->rng),
		      *lv = bo_rand_act(nq, 1.0f, &x->rng);
		struct pair q = pair_act(x, hq, nq), k = pair_act(x, hk, nk), v = pair_act(x, hv, nk),
			    o = pair_poisoned(x, nq);
		struct pair q2 = pair_act(x, lq, nq), k2 = pair_act(x, lk, nq), v2 = pair_act(x, lv, nq),
			    o2 = pair_poisoned(x, nq);
		for (int b = 0; b < 2; b++) {
			struct sfw_backend *be = x->b[b];
			struct sfw_err err = {0};
			sfw_be_kv_append_seqs(be, bs[b], ns, 0, k.d[b], v.d[b], nkv * hd);
			check(x, sfw_be_compress_seqs(be, bs[b], ns, 0, &err) == SFW_OK, "compress_seqs on %s: %s",
			      be->name, err.msg);
			sfw_be_attn_dense_seqs(be, o.d[b], q.d[b], bs[b], ns, 0, nh, hd, scale);
			sfw_be_qk_norm_rope_seqs(be, q2.d[b], k2.d[b], &qw.w[b], &kw.w[b], bs[b], ns, nh, nh, hd, 1e-6f,
					      c->N, 10000.0f);
			sfw_be_gla_seqs(be, o2.d[b], q2.d[b], k2.d[b], v2.d[b], bs[b], ns, 1, dec.d[b], nh, hd, scale);
		}
		char what[96];
		snprintf(what, sizeof(what), "step %d (%d rows): attn_dense_seqs", st, rows);
		pair_cmp(x, what, &o, nq);
		snprintf(what, sizeof(what), "step %d: qk_norm_rope_seqs q", st);
		pair_cmp(x, what, &q2, nq);
		snprintf(what, sizeof(what), "step %d: qk_norm_rope_seqs k", st);
		pair_cmp(x, what, &k2, nq);
		snprintf(what, sizeof(what), "step %d: gla_seqs", st);
		pair_cmp(x, what, &o2, nq);
		for (int i = 0; i < ns; i++) {
			len[i] += bs[0][i].R;
			int64_t n2[2][2];
			for (int b = 0; b < 2; b++)
				sfw_be_cache_ncompressed(x->b[b], cc[i][b], 0, n2[b]);
			int good = sfw_be_cache_len(x->b[0], cc[i][0], 0) == len[i] &&
				   sfw_be_cache_len(x->b[1], cc[i][1], 0) == len[i] &&
				   n2[0][0] == nchunks(len[i], 32, 16) && n2[0][1] == nchunks(len[i], 128, 64) &&
				   n2[1][0] == n2[0][0] && n2[1][1] == n2[0][1];
			if (!good || i == ns - 1)
				check(x, good, "step %d, sequence %d: %lld tokens, compressed (%lld, %lld)", st, i,
				      (long long)len[i], (long long)n2[0][0], (long long)n2[0][1]);
		}
		pair_free(x, &q), pair_free(x, &k), pair_free(x, &v), pair_free(x, &o);
		pair_free(x, &q2), pair_free(x, &k2), pair_free(x, &v2), pair_free(x, &o2);
		free(hq), free(hk), free(hv), free(lq), free(lk), free(lv);
	}
	for (int i = 0; i < made; i++)
		caches_free(x, cc[i]);
	bo_weight_free(&qw), bo_weight_free(&kw);
	pair_free(x, &dec), free(hs);
}

/* cache_len / cache_ncompressed / cache_view / cache_reset: a view gives
 * each layer's counts and buffers (a lightning layer: its state, counts 0),
 * a reset forgets the tokens and zeroes the lightning state (the gla after
 * it matches a fresh cache's). */
static void t_cache(struct run *x)
{
	struct sfw_cache_desc d;
	desc_of(x->c, &d);
	struct sfw_bcache *cc[2];
	if (caches_new(x, &d, cc) != 0)
		return caches_free(x, cc);
	check(x, sfw_be_cache_len(x->b[0], cc[0], 0) == 0, "a new cache is empty");
	static const int warm[2] = {70, 3};
	if (reserve(x, cc, 1) == 0 && reserve(x, cc, 70) == 0) { /* grows 64 -> 128 */
		append(x, cc, 70, &d);
		for (int i = 0; i < 2; i++) {
			struct sfw_err err = {0};
			check(x, sfw_be_compress(x->b[i], cc[i], 0, &err) == SFW_OK, "compress: %s",
			      err.msg);
		}
		int64_t n[2];
		sfw_be_cache_ncompressed(x->b[0], cc[0], 0, n);
		check(x, sfw_be_cache_len(x->b[0], cc[0], 0) == 70 && n[0] == 3 && n[1] == 0,
		      "70 tokens: len %lld, compressed (%lld, %lld), want (3, 0)",
		      (long long)sfw_be_cache_len(x->b[0], cc[0], 0), (long long)n[0], (long long)n[1]);
		for (int i = 0; i < 2; i++) {
			struct sfw_cache_view v[2];
			struct sfw_err err = {0};
			memset(v, 0, sizeof(v));
			check(x, sfw_be_cache_view(x->b[i], cc[i], 0, NULL, &v[0], &err) == SFW_OK &&
				      sfw_be_cache_view(x->b[i], cc[i], 1, NULL, &v[1], &err) == SFW_OK,
			      "cache_view on %s: %s", x->b[i]->name, err.msg);
			check(x, v[0].len == 70 && v[0].n1 == 3 && v[0].n2 == 0 && v[0].cap >= 70 && v[0].k && v[0].v &&
				      v[0].c1 && v[0].c2 && !v[0].state,
			      "%s: the sparse layer's view: 70 tokens, (3, 0) compressed, its buffers", x->b[i]->name);
			check(x, v[1].len == 0 && v[1].n1 == 0 && v[1].n2 == 0 && v[1].state && !v[1].k && !v[1].c1,
			      "%s: the lightning layer's view: its state, counts 0", x->b[i]->name);
		}
		gla_calls(x, cc, warm, 2, "before reset: ");
		for (int i = 0; i < 2; i++)
			sfw_be_cache_reset(x->b[i], cc[i]);
		sfw_be_cache_ncompressed(x->b[0], cc[0], 0, n);
		check(x, sfw_be_cache_len(x->b[0], cc[0], 0) == 0 && n[0] == 0 && n[1] == 0,
		      "reset: empty");
		/* after the reset: backend 0's reset cache against a fresh reference cache */
		struct sfw_bcache *fresh[2] = {cc[0], NULL};
		struct sfw_err err = {0};
		check(x, x->b[1]->cache_new(x->b[1], &d, &fresh[1], &err) == SFW_OK, "cache_new: %s",
		      err.msg);
		if (fresh[1]) {
			gla_calls(x, fresh, warm, 2, "after reset: ");
			x->b[1]->cache_free(x->b[1], fresh[1]);
		}
		if (reserve(x, cc, 64) == 0) { /* and it takes tokens again */
			append(x, cc, 64, &d);
			check(x, sfw_be_cache_len(x->b[0], cc[0], 0) == 64, "64 tokens after the reset");
		}
	}
	caches_free(x, cc);
}

/* A paged pool of 3 blocks: two caches draw from it, the one that finds it
 * full fails with SFW_E_NOSPACE and takes nothing, a reset gives its
 * blocks back, and a paged cache's attention equals the reference's
 * unpaged one. */
static void t_pool(struct run *x)
{
	const struct bo_case *c = x->c;
	struct sfw_backend *be = x->b[0], *ref = x->b[1];
	if (!be->supports_op(be, SFW_OP_POOL, SFW_DTYPE_F32))
		return skip(x, "no paged KV pool on this backend");
	struct sfw_cache_desc d;
	desc_of(c, &d);
	struct sfw_bpool *pool = NULL;
	struct sfw_err err = {0};
	enum sfw_status s = be->pool_new(be, &d, 3, &pool, &err);
	if (s == SFW_E_UNSUPPORTED)
		return skip(x, err.msg);
	check(x, s == SFW_OK, "pool_new(3 blocks): %s", err.msg);
	if (s != SFW_OK)
		return;
	struct sfw_cache_desc dp = d;
	dp.pool = pool, dp.max_tokens = 256;
	struct sfw_bcache *A = NULL, *B = NULL, *cc[2] = {NULL, NULL};
	check(x, be->cache_new(be, &dp, &A, &err) == SFW_OK && be->cache_new(be, &dp, &B, &err) == SFW_OK,
	      "paged caches: %s", err.msg);
	check(x, ref->cache_new(ref, &d, &cc[1], &err) == SFW_OK, "reference cache: %s", err.msg);
	if (A && B && cc[1]) {
		check(x, be->pool_used(be, pool) == 0, "a new pool is unused");
		check(x, be->cache_reserve(be, A, 100, &err) == SFW_OK && be->pool_used(be, pool) == 2,
		      "100 tokens take 2 blocks (used %lld): %s", (long long)be->pool_used(be, pool),
		      err.msg);
		err.msg[0] = 0;
		s = be->cache_reserve(be, B, 128, &err);
		check(x, s == SFW_E_NOSPACE && be->pool_used(be, pool) == 2,
		      "128 more tokens: NOSPACE (%d) and nothing taken (used %lld): '%s'", (int)s,
		      (long long)be->pool_used(be, pool), err.msg);
		check(x, be->cache_reserve(be, B, 64, &err) == SFW_OK && be->pool_used(be, pool) == 3,
		      "64 tokens take the last block: %s", err.msg);
		check(x, be->cache_reserve(be, B, 65, &err) == SFW_E_NOSPACE && be->pool_used(be, pool) == 3,
		      "the full pool refuses a fourth block");
		sfw_be_cache_reset(be, B);
		check(x, be->pool_used(be, pool) == 2 && sfw_be_cache_len(be, B, 0) == 0,
		      "a reset gives the block back");
		s = ref->cache_reserve(ref, cc[1], 100, &err);
		check(x, s == SFW_OK, "reference reserve: %s", err.msg);
		cc[0] = A;
		if (s == SFW_OK) {
			append(x, cc, 100, &d);
			/* a paged cache's view: the counts, no buffers, no set */
			struct sfw_cache_view v[2];
			memset(v, 0, sizeof(v));
			check(x, sfw_be_cache_view(be, A, 0, NULL, &v[0], &err) == SFW_OK &&
				      sfw_be_cache_view(be, A, 1, NULL, &v[1], &err) == SFW_OK,
			      "a paged cache's view: %s", err.msg);
			check(x, v[0].len == 100 && sfw_be_cache_len(be, A, 0) == 100 && !v[0].k && !v[0].v &&
				      !v[0].c1 && !v[0].c2 && v[1].state && v[1].len == 0,
			      "a paged cache's view: 100 tokens, no K/V address, the lightning state");
			const int64_t set[3] = {0, 0, 0};
			err.msg[0] = 0;
			enum sfw_status sv = sfw_be_cache_view(be, A, 0, set, &v[0], &err);
			check(x, sv == SFW_E_UNSUPPORTED && !strcmp(err.msg, "a paged KV cache has no view") &&
				      sfw_be_cache_len(be, A, 0) == 100,
			      "a paged cache's counts are not set (%d): '%s'", (int)sv, err.msg);
			size_t n = (size_t)5 * c->nh * c->hd;
			float *hq = bo_rand_act(n, 1.0f, &x->rng);
			struct pair q = pair_act(x, hq, n), o = pair_poisoned(x, n);
			for (int i = 0; i < 2; i++)
				sfw_be_attn_dense(x->b[i], o.d[i], q.d[i], cc[i], 0, 5, c->nh,
						    1.0f / sqrtf((float)c->hd));
			pair_cmp(x, "attn_dense over a paged cache", &o, n);
			pair_free(x, &q), pair_free(x, &o), free(hq);
		}
	}
	if (A)
		be->cache_free(be, A);
	if (B)
		be->cache_free(be, B);
	check(x, be->pool_used(be, pool) == 0, "freed caches give every block back");
	if (cc[1])
		ref->cache_free(ref, cc[1]);
	be->pool_free(be, pool);
}

/* ---- driver ----------------------------------------------------------------- */

void bo_run(struct sfw_backend *be, struct sfw_backend *ref, const struct bo_opts *o, struct bo_result *r)
{
	memset(r, 0, sizeof(*r));
	struct run x = {{be, ref}, o, r, NULL, o->seed ? o->seed : 0x5eed, 0};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bo_case *c = &cases[i];
		if (o->filter && !strstr(c->name, o->filter))
			continue;
		x.c = c;
		x.fail = 0;
		r->cases++;
		int skipped0 = r->skipped;
		x.rng = (o->seed ? o->seed : 0x5eed) * 0x9e3779b97f4a7c15ull +
			i; /* a case's inputs do not depend on the others */
		if ((c->op == BO_MATMUL || c->op == BO_SWIGLU || c->op == BO_LOGITS) && lacks_w8(&x))
			continue;
		switch (c->op) {
		case BO_EMBED:
			t_embed(&x);
			break;
		case BO_RMSNORM:
			t_rmsnorm(&x);
			break;
		case BO_ADD_SCALED:
		case BO_SILU_MUL:
		case BO_SIGMOID_MUL:
			t_elementwise(&x);
			break;
		case BO_ROPE:
			t_rope(&x);
			break;
		case BO_MATMUL:
		case BO_LOGITS:
			t_matmul(&x);
			break;
		case BO_SWIGLU:
			t_swiglu(&x);
			break;
		case BO_ADD_RMSNORM:
			t_add_rmsnorm(&x);
			break;
		case BO_RMSNORM_GATE:
			t_rmsnorm_gate(&x);
			break;
		case BO_QK_NORM_ROPE:
			t_qk_norm_rope(&x);
			break;
		case BO_SAMPLE:
			t_sample(&x);
			break;
		case BO_COPY:
			t_copy(&x);
			break;
		case BO_DENSE:
			t_dense(&x);
			break;
		case BO_SPARSE:
			t_sparse(&x);
			break;
		case BO_GLA:
			t_gla(&x);
			break;
		case BO_CACHE:
			t_cache(&x);
			break;
		case BO_POOL:
			t_pool(&x);
			break;
		case BO_SEQS:
			t_seqs(&x);
			break;
		}
		struct sfw_err ferr = {0};
		check(&x, sfwi_take_failure(be, &ferr) == SFW_OK, "no op failure reported: %s", ferr.msg);
		if (r->skipped != skipped0)
			continue;
		if (x.fail)
			r->failed++;
		else
			r->passed++;
		if (o->verbose || (x.fail && !o->quiet))
			printf("%s %s\n", x.fail ? "FAIL case" : "case ok:", c->name);
	}
	printf("backend ops, %s against %s (%s): %d cases: %d passed, %d failed, %d skipped (%d checks "
	       "passed, %d failed)\n",
	       be->name, ref->name, o->exact ? "bit-identical" : "tolerances of the table", r->cases,
	       r->passed, r->failed, r->skipped, r->checks_passed, r->checks_failed);
}

/* ---- the counting wrapper ---------------------------------------------------- */

static struct bo_counting *CW(struct sfw_backend *be)
{
	return (struct bo_counting *)be;
}

static void *cw_alloc(struct sfw_backend *be, size_t bytes)
{
	struct bo_counting *w = CW(be);
	void *p = w->real->alloc(w->real, bytes);
	if (!p)
		return NULL;
	if (w->nblocks == w->cap) {
		size_t nc = w->cap ? 2 * w->cap : 64;
		struct bo_block *nb = need(realloc(w->blocks, nc * sizeof(*nb)));
		w->blocks = nb, w->cap = nc;
	}
	w->blocks[w->nblocks].p = p, w->blocks[w->nblocks++].n = bytes;
	w->alloc_live += bytes;
	if (w->alloc_live > w->alloc_peak)
		w->alloc_peak = w->alloc_live;
	return p;
}

static void cw_free(struct sfw_backend *be, void *p)
{
	struct bo_counting *w = CW(be);
	for (size_t i = 0; i < w->nblocks; i++)
		if (w->blocks[i].p == p) {
			w->alloc_live -= w->blocks[i].n;
			w->blocks[i] = w->blocks[--w->nblocks];
			break;
		}
	w->real->free(w->real, p);
}

static long long delta(size_t before, size_t after)
{
	return (long long)after - (long long)before;
}

static enum sfw_status cw_cache_new(struct sfw_backend *be, const struct sfw_cache_desc *d,
				    struct sfw_bcache **out, struct sfw_err *err)
{
	struct bo_counting *w = CW(be);
	size_t t0 = w->now();
	enum sfw_status s = w->real->cache_new(w->real, d, out, err);
	w->cache_bytes += delta(t0, w->now());
	return s;
}

static enum sfw_status cw_cache_reserve(struct sfw_backend *be, struct sfw_bcache *c, int64_t tokens,
					struct sfw_err *err)
{
	struct bo_counting *w = CW(be);
	size_t t0 = w->now();
	enum sfw_status s = w->real->cache_reserve(w->real, c, tokens, err);
	w->cache_bytes += delta(t0, w->now());
	return s;
}

static void cw_cache_free(struct sfw_backend *be, struct sfw_bcache *c)
{
	struct bo_counting *w = CW(be);
	size_t t0 = w->now();
	w->real->cache_free(w->real, c);
	w->cache_bytes += delta(t0, w->now());
}

static void cw_destroy(struct sfw_backend *be)
{
	struct bo_counting *w = CW(be);
	w->real->destroy(w->real);
	free(w->blocks);
	free(w);
}

struct bo_counting *bo_counting_wrap(struct sfw_backend *real, size_t (*now)(void))
{
	struct bo_counting *w = need(calloc(1, sizeof(*w)));
	w->be = *real;
	w->real = real, w->now = now;
	w->be.alloc = cw_alloc, w->be.free = cw_free, w->be.destroy = cw_destroy;
	w->be.cache_new = cw_cache_new, w->be.cache_reserve = cw_cache_reserve,
	w->be.cache_free = cw_cache_free;
	return w;
}
