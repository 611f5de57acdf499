/* modules: tools quant runner formats kernels num fetch verify core */
/* test_backend_ops.c - every op of struct sfw_backend through the table
 * (tests/lib/backend_ops.c), on the CPU backend:
 *   1. a 3-thread CPU backend against a 1-thread one, bit for bit: the ops
 *      split work over output rows / heads and never change a summation
 *      order with the thread count, so every output must be identical;
 *   2. the simple ops (embed, rmsnorm, add_scaled, silu_mul, sigmoid_mul,
 *      rope_neox, matmul bf16 / f32 / int8) against scalar references
 *      written here in double from the formulas of kernels/ops.h and the
 *      int8 contract of num/w8_layout.h, so (1) cannot pass by two equal
 *      wrong answers;
 *   3. mutants: the table run on a backend with a perturbed rmsnorm (eps)
 *      and a perturbed attn_dense (scale) must fail;
 *   4. the comparison gpu_backend_ops makes (the table's tolerances), on a
 *      CPU backend whose outputs come back rounded to bf16: it passes, and
 *      mutants it could hide fail;
 *   5. the memory plan (tools/tools.h) against what the CPU backend
 *      allocates for a context (a counting wrapper around the model's
 *      backend), for three models and four contexts. */
#include "check.h"
#include "lib/backend_ops.h"
#include "lib/compare.h"
#include "lib/rng.h"

#include "runner/model.h"
#include "tools/tools.h"

#include <malloc.h>
#ifdef __SANITIZE_ADDRESS__
size_t
__sanitizer_get_current_allocated_bytes(void); /* the ASan runtime's (sanitizer/allocator_interface.h) */
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- 2. scalar references ----------------------------------------------------- */

/* fp32 accumulation against double: NMSE 1e-10 and 1e-5 of max|ref| hold
 * with a wide margin for the sizes below (K <= 1030: K * 2^-24 ~ 6e-5
 * worst case relative to the sum of |terms|, sqrt(K) * 2^-24 typical). */
static void cmp_ref(const char *what, const float *got, const double *ref, size_t n)
{
	float *r = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		r[i] = (float)ref[i];
	struct cmp_stats s = cmp_stats(got, r, n);
	CHECK(s.bad == 0 && s.nmse <= 1e-10 && s.maxd <= 1e-5 * (s.maxr > 0 ? s.maxr : 1),
	      "%s against the scalar reference: NMSE %.2e, max|d| %.2e of max|ref| %.3g", what, s.nmse,
	      s.maxd, s.maxr);
	free(r);
}

static float *on(struct sfw_backend *be, const float *h, size_t n)
{
	float *d = be->alloc(be, n * sfw_be_act_size(be));
	sfw_be_from_host_f32(be, d, h, n);
	return d;
}

static float *back(struct sfw_backend *be, const void *d, size_t n)
{
	float *h = malloc(n * sizeof(float));
	sfw_be_to_host_f32(be, h, d, 0, n);
	return h;
}

static double silu(double g)
{
	return g / (1 + exp(-g));
}

static void scalar_refs(struct sfw_backend *be)
{
	uint64_t rng = 42;
	const int M = 17, K = 259, N = 67;
	float *x = bo_rand_act((size_t)M * K, 2.0f, &rng), *b = bo_rand_act((size_t)M * K, 2.0f, &rng);
	double *r = malloc(sizeof(double) * (size_t)M * (K > N ? K : N) * 4);
	float *dx = on(be, x, (size_t)M * K), *db = on(be, b, (size_t)M * K), *dy = on(be, x, (size_t)M * K);
	/* embed */
	struct bo_weight E;
	CHECK(bo_weight_make(&E, SFW_DTYPE_BF16, 0, 0, 50, K, 0.05f, 0, &rng) == 0, "embedding table");
	int32_t ids[5] = {0, 49, 7, 7, 30};
	int32_t *did = be->alloc(be, sizeof(ids));
	sfw_be_from_host(be, did, ids, sizeof(ids));
	CHECK(be->weight_upload(be, &E.w[0], NULL) == SFW_OK, "upload");
	sfw_be_embed(be, dy, &E.w[0], did, 5, 12.0f);
	for (int t = 0; t < 5; t++)
		for (int d = 0; d < K; d++)
			r[t * K + d] = (double)E.val[(size_t)ids[t] * K + d] * 12.0;
	float *h = back(be, dy, (size_t)5 * K);
	cmp_ref("embed", h, r, (size_t)5 * K);
	free(h), be->free(be, did), bo_weight_free(&E);
	/* rmsnorm: y = x / sqrt(mean(x^2) + eps) * w */
	struct bo_weight w;
	CHECK(bo_weight_make(&w, SFW_DTYPE_BF16, 0, 0, 1, K, 0.1f, 1.0f, &rng) == 0, "norm weight");
	sfw_be_rmsnorm(be, dy, dx, &w.w[0], M, K, 1e-6f);
	for (int m = 0; m < M; m++) {
		double ss = 0;
		for (int k = 0; k < K; k++)
			ss += (double)x[m * K + k] * x[m * K + k];
		double inv = 1 / sqrt(ss / K + 1e-6);
		for (int k = 0; k < K; k++)
			r[m * K + k] = x[m * K + k] * inv * w.val[k];
	}
	h = back(be, dy, (size_t)M * K);
	cmp_ref("rmsnorm", h, r, (size_t)M * K);
	free(h), bo_weight_free(&w);
	/* silu_mul, sigmoid_mul, add_scaled (last: it writes x) */
	size_t n = (size_t)M * K;
	sfw_be_silu_mul(be, dy, dx, db, n);
	for (size_t i = 0; i < n; i++)
		r[i] = silu(x[i]) * b[i];
	h = back(be, dy, n);
	cmp_ref("silu_mul", h, r, n);
	free(h);
	sfw_be_sigmoid_mul(be, dy, dx, db, n);
	for (size_t i = 0; i < n; i++)
		r[i] = x[i] / (1 + exp(-(double)b[i]));
	h = back(be, dy, n);
	cmp_ref("sigmoid_mul", h, r, n);
	free(h);
	sfw_be_add_scaled(be, dx, db, n, 0.3f);
	for (size_t i = 0; i < n; i++)
		r[i] = x[i] + (double)0.3f * b[i];
	h = back(be, dx, n);
	cmp_ref("add_scaled", h, r, n);
	free(h);
	/* rope_neox: inv_freq_m = 1 / theta^(2m/hd) in float32, angle = float(p) * inv_freq_m */
	const int T = 3, nh = 2, hd = 64;
	const int64_t pos0 = 5000;
	float *q = bo_rand_act((size_t)T * nh * hd, 1.0f, &rng), *dq = on(be, q, (size_t)T * nh * hd);
	sfw_be_rope_neox(be, dq, T, nh, hd, pos0, 10000.0f);
	for (int t = 0; t < T; t++)
		for (int hh = 0; hh < nh; hh++) {
			const float *v = q + ((size_t)t * nh + hh) * hd;
			double *o = r + ((size_t)t * nh + hh) * hd;
			for (int m = 0; m < hd / 2; m++) {
				float inv = 1.0f / powf(10000.0f, (float)(2 * m) / (float)hd);
				double ang = (double)((float)(pos0 + t) * inv);
				o[m] = v[m] * cos(ang) - v[m + hd / 2] * sin(ang);
				o[m + hd / 2] = v[m + hd / 2] * cos(ang) + v[m] * sin(ang);
			}
		}
	h = back(be, dq, (size_t)T * nh * hd);
	cmp_ref("rope_neox", h, r, (size_t)T * nh * hd);
	free(h), free(q), be->free(be, dq);
	/* matmul: bf16, f32, int8 (every group and scale dtype) against
	 * sum_k x[m,k] * w[n,k], w dequantized by num/w8_layout.h's contract,
	 * (b - 128) * scale[n, k / g], recomputed here from the raw bytes */
	static const struct {
		enum sfw_dtype dt, sdt;
		int group;
		const char *name;
	} mm[] = {{SFW_DTYPE_BF16, 0, 0, "matmul bf16"},
		  {SFW_DTYPE_F32, 0, 0, "matmul f32"},
		  {SFW_DTYPE_W8, SFW_DTYPE_BF16, 32, "matmul w8 g32 bf16 scales"},
		  {SFW_DTYPE_W8, SFW_DTYPE_F16, 64, "matmul w8 g64 f16 scales"},
		  {SFW_DTYPE_W8, SFW_DTYPE_F32, 128, "matmul w8 g128 f32 scales"},
		  {SFW_DTYPE_W8, SFW_DTYPE_BF16, SFW_QL_GROUP_CHANNEL, "matmul w8 channel bf16 scales"}};
	for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
		struct bo_weight W;
		CHECK(bo_weight_make(&W, mm[i].dt, mm[i].sdt, mm[i].group, N, K, 0.05f, 0, &rng) == 0,
		      "weight");
		CHECK(be->weight_upload(be, &W.w[0], NULL) == SFW_OK, "upload");
		float *dz = be->alloc(be, (size_t)M * N * sizeof(float));
		sfw_be_matmul(be, dz, dy, &W.w[0], M); /* dy holds x * sigmoid(b) */
		float *in = back(be, dy, n);
		int64_t rb = sfw_ql_row_bytes(K), span = sfw_ql_group_span(K, mm[i].group),
			ng = sfw_ql_ngroups(K, mm[i].group);
		for (int m = 0; m < M; m++)
			for (int o = 0; o < N; o++) {
				double s = 0;
				for (int k = 0; k < K; k++) {
					double wv;
					if (mm[i].dt == SFW_DTYPE_BF16) {
						wv = sfw_bf16_to_f32(
						    ((const uint16_t *)W.host)[(size_t)o * K + k]);
					} else if (mm[i].dt == SFW_DTYPE_F32) {
						wv = ((const float *)W.host)[(size_t)o * K + k];
					} else {
						size_t si = (size_t)(o * ng + k / span);
						double sc =
						    mm[i].sdt == SFW_DTYPE_F32 ? ((const float *)W.scales)[si]
						    : mm[i].sdt == SFW_DTYPE_BF16
							? sfw_bf16_to_f32(((const uint16_t *)W.scales)[si])
							: ldexp(1.0 + (((const uint16_t *)W.scales)[si] &
								       1023) /
									  1024.0,
								((((const uint16_t *)W.scales)[si] >> 10) &
								 31) -
								    15);
						wv = (double)(((const uint8_t *)W.host)[o * rb + k] - 128) *
						     sc;
					}
					s += (double)in[m * K + k] * wv;
				}
				r[(size_t)m * N + o] = s;
			}
		h = back(be, dz, (size_t)M * N);
		cmp_ref(mm[i].name, h, r, (size_t)M * N);
		free(h), free(in), be->free(be, dz), bo_weight_free(&W);
	}
	be->free(be, dx), be->free(be, db), be->free(be, dy);
	free(x), free(b), free(r);
}

/* ---- 3. mutants ------------------------------------------------------------------ */

static struct sfw_backend *g_real; /* the backend the mutants forward to */
static enum sfw_opk g_mut_kind;    /* the op a mutant gets wrong */
static int g_mut_big;              /* 0: by a hair (3.), 1: by what bf16 could not hide (4.) */

/* The real backend's op, with g_mut_kind's argument nudged: rmsnorm's eps,
 * the attention scale, gla's scale. */
static enum sfw_status mut_op(struct sfw_backend *be, const struct sfw_op *op, struct sfw_err *err)
{
	(void)be;
	struct sfw_op o = *op;
	if (o.kind == g_mut_kind && o.kind == SFW_OP_RMSNORM)
		o.norm.eps += g_mut_big ? 0.1f : 1e-3f;
	else if (o.kind == g_mut_kind && o.kind == SFW_OP_ATTN_DENSE)
		o.cache.scale *= g_mut_big ? 1.2f : 1.001f;
	else if (o.kind == g_mut_kind && o.kind == SFW_OP_GLA)
		o.cache.scale *= 1.05f;
	return g_real->op(g_real, &o, err);
}

static void mutant(struct sfw_backend *real, struct sfw_backend *ref, const char *filter, int which)
{
	struct sfw_backend m = *real;
	g_real = real;
	g_mut_kind = which == 0 ? SFW_OP_RMSNORM : SFW_OP_ATTN_DENSE, g_mut_big = 0;
	m.op = mut_op;
	struct bo_opts o = {1, 7, filter, 0, 1};
	struct bo_result r;
	bo_run(&m, ref, &o, &r);
	CHECK(r.failed > 0 && r.failed == r.cases - r.skipped, "mutant %s: all %d cases fail (%d failed)",
	      filter, r.cases - r.skipped, r.failed);
	/* the same cases on the real backend pass: the failures are the mutant's */
	o.quiet = 0;
	bo_run(real, ref, &o, &r);
	CHECK(r.failed == 0 && r.passed > 0, "unmutated %s: %d cases pass", filter, r.passed);
}

/* ---- 4. the tolerance path, as gpu_backend_ops takes it -------------------------
 * A CPU backend whose activations come back rounded to bf16 (one rounding
 * point on every output read, the least a bf16 backend does) must pass the
 * table's tolerances, and mutants that a bf16 backend could hide behind
 * them must not: the same code path as the CUDA comparison, run here. */

static void bf16_transfer(struct sfw_backend *be, enum sfw_xfer k, void *dst, const void *src, size_t n)
{
	(void)be;
	g_real->transfer(g_real, k, dst, src, n);
	if (k == SFW_XFER_TO_HOST_F32)
		for (size_t i = 0; i < n; i++)
			((float *)dst)[i] = bo_bf16_round(((float *)dst)[i]);
}

static void tolerance_path(struct sfw_backend *real, struct sfw_backend *ref)
{
	struct sfw_backend b = *real;
	g_real = real;
	b.name = "cpu (bf16 outputs)";
	b.transfer = bf16_transfer;
	struct bo_opts o = {0, 11, NULL, getenv("CHECK_VERBOSE") != NULL, 0};
	struct bo_result r;
	bo_run(&b, ref, &o, &r);
	check_passed_ += r.checks_passed, check_failed_ += r.checks_failed;
	CHECK(r.failed == 0 && r.passed == r.cases - r.skipped && r.passed >= 70,
	      "bf16-rounded outputs within the tolerances: %d of %d cases pass", r.passed,
	      r.cases - r.skipped);
	static const struct {
		const char *filter;
		int which;
	} mu[] = {{"rmsnorm", 0}, {"attn_dense", 1}, {"gla", 2}};
	for (size_t i = 0; i < sizeof(mu) / sizeof(mu[0]); i++) {
		struct sfw_backend m = b;
		static const enum sfw_opk kinds[] = {SFW_OP_RMSNORM, SFW_OP_ATTN_DENSE, SFW_OP_GLA};
		g_mut_kind = kinds[mu[i].which], g_mut_big = 1;
		m.op = mut_op;
		struct bo_opts q = {0, 11, mu[i].filter, 0, 1};
		bo_run(&m, ref, &q, &r);
		CHECK(r.failed > 0 && r.failed == r.cases - r.skipped,
		      "tolerance mutant %s: all %d cases fail (%d failed)", mu[i].filter, r.cases - r.skipped,
		      r.failed);
	}
}

/* ---- 5. the memory plan ---------------------------------------------------------- */

/* Bytes the heap holds now (glibc: every arena plus mmapped chunks; under
 * ASan, which replaces malloc, its allocator's count). */
static size_t heap_now(void)
{
#ifdef __SANITIZE_ADDRESS__
	return __sanitizer_get_current_allocated_bytes();
#else
	struct mallinfo2 mi = mallinfo2();
	return mi.uordblks + mi.hblkhd;
#endif
}

/* The plan is the CUDA backend's (bf16 activations and KV, fp32 lightning
 * states); the CPU backend holds KV, compressed keys and activations in
 * fp32. So the CPU's figures are the plan's with those parts doubled,
 * except the buffers that are 4-byte on both (token ids, top-k indices,
 * float32 logits, the last selection and the sampled id: R*4 + nkv*R*k*4 +
 * V*4 + L*nkv*k*4 + 16 in the plan). Weights are read in
 * place from the map on the CPU (nothing allocated), and the op scratch
 * and the block-selection scratch of the plan are the CUDA backend's
 * (the CPU ops take theirs per call and free it). */
static void plan_check(const char *dir, int64_t n_ctx, int chunk, int64_t prompt)
{
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	mp.threads = 1;
	struct sfw_model *m = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_model_load(dir, &mp, &m, &err) == SFW_OK, "load %s: %s", dir, err.msg);
	if (!m)
		return;
	struct bo_counting *w = bo_counting_wrap(m->be, heap_now);
	m->be = &w->be;
	const struct sfw_config *cf = sfw_model_config(m);
	struct sfw_mem_plan p;
	sfw_plan_model(m, n_ctx, chunk, &p);
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	cp.n_ctx = n_ctx, cp.prefill_chunk = chunk;
	struct sfw_ctx *c = NULL;
	size_t h0 = heap_now();
	CHECK(sfw_ctx_new(m, &cp, &c, &err) == SFW_OK, "context: %s", err.msg);
	long long heap = (long long)heap_now() - (long long)h0;
	if (c) {
		double R = chunk, nonact = R * 4 + (double)cf->num_key_value_heads * R * cf->sparse_k * 4 +
					   (double)cf->vocab_size * 4 +
					   (double)cf->num_hidden_layers * cf->num_key_value_heads * cf->sparse_k * 4 + 16;
		double act = 2 * p.activations - nonact, cache = 2 * (p.kv + p.compressed) + p.lightning;
		/* activations: exact */
		CHECK(fabs((double)w->alloc_live - act) < 1,
		      "%s, %lld tokens, %d-row pieces: activations %zu B, plan %.0f B (x2 for fp32)", dir,
		      (long long)n_ctx, chunk, w->alloc_live, act);
		/* caches: within 64 KiB, the cache's bookkeeping (672 B under ASan,
		 * which counts requested bytes) and glibc's page rounding of the
		 * mmapped K, V and compressed-key buffers (4 per sparse layer) */
		CHECK(fabs((double)w->cache_bytes - cache) <= 65536,
		      "%s, %lld tokens: caches %lld B, plan %.0f B (KV %.0f + compressed %.0f, x2 for fp32, "
		      "+ lightning %.0f)",
		      dir, (long long)n_ctx, w->cache_bytes, cache, p.kv, p.compressed, p.lightning);
		/* and nothing else of size: the whole context is those two + bookkeeping */
		CHECK(fabs((double)heap - act - cache) <= 131072,
		      "%s: the context's heap %lld B = activations + caches %.0f B", dir, heap, act + cache);
		/* a prompt within the reservation allocates no cache memory */
		int32_t *ids = malloc((size_t)prompt * sizeof(int32_t));
		for (int64_t i = 0; i < prompt; i++)
			ids[i] = (int32_t)(1 + (i * 7919) % (cf->vocab_size - 9));
		long long before = w->cache_bytes;
		size_t live = w->alloc_live;
		CHECK(sfw_ctx_prefill(c, ids, (size_t)prompt, NULL, &err) == SFW_OK, "prefill %lld: %s",
		      (long long)prompt, err.msg);
		CHECK(w->cache_bytes == before && w->alloc_live == live,
		      "%s: a %lld-token prompt in a %lld-token context grows nothing (caches %+lld B, "
		      "buffers %+lld B)",
		      dir, (long long)prompt, (long long)n_ctx, w->cache_bytes - before,
		      (long long)w->alloc_live - (long long)live);
		free(ids);
		printf("plan %s at %lld tokens: activations %zu B (plan %.0f), caches %lld B (plan %.0f)\n",
		       dir, (long long)n_ctx, w->alloc_live, act, w->cache_bytes, cache);
		sfw_ctx_free(c);
	}
	CHECK(w->alloc_live == 0 && llabs(w->cache_bytes) <= 65536,
	      "%s: freeing the context gives everything back (%zu B of buffers, %lld B of caches left)", dir,
	      w->alloc_live, w->cache_bytes);
	sfw_model_free(m);
}

/* The CPU backend's capabilities less int8 weights. */
static int (*real_supports)(const struct sfw_backend *, enum sfw_opk, enum sfw_dtype);
static int no_w8(const struct sfw_backend *be, enum sfw_opk op, enum sfw_dtype dt)
{
	return dt != SFW_DTYPE_W8 && real_supports(be, op, dt);
}

int main(void)
{
	struct sfw_backend *be = NULL, *ref = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_backend_cpu_new(3, &be, &err) == SFW_OK, "cpu backend, 3 threads: %s", err.msg);
	CHECK(sfw_backend_cpu_new(1, &ref, &err) == SFW_OK, "cpu backend, 1 thread: %s", err.msg);
	if (!be || !ref)
		return CHECK_REPORT("test_backend_ops");
	/* 1. thread-count invariance, every op of the table */
	struct bo_opts o = {1, 1, getenv("BO_FILTER"), getenv("CHECK_VERBOSE") != NULL, 0};
	struct bo_result r;
	bo_run(be, ref, &o, &r);
	check_passed_ += r.checks_passed, check_failed_ += r.checks_failed;
	/* the CPU backend fills every member and takes every case */
	CHECK(r.failed == 0 && r.skipped == 0 && r.passed == r.cases && (o.filter || r.passed >= 80),
	      "3 threads vs 1: %d cases passed bit for bit, %d failed, %d skipped (none)", r.passed, r.failed,
	      r.skipped);
	if (!o.filter) {
		/* a backend without int8 support: every int8 case is skipped and counted, none passes */
		struct sfw_backend no8 = *be;
		real_supports = be->supports_op;
		no8.supports_op = no_w8;
		struct bo_opts o8 = {1, 1, "w8", 0, 0};
		bo_run(&no8, ref, &o8, &r);
		CHECK(r.cases >= 20 && r.skipped == r.cases && r.passed == 0 && r.failed == 0,
		      "a backend without int8: %d of %d int8 cases skipped", r.skipped, r.cases);
		/* 2. against the formulas */
		scalar_refs(be);
		/* 3. the table catches a wrong op */
		mutant(be, ref, "rmsnorm", 0);
		mutant(be, ref, "attn_dense", 1);
		/* 4. the tolerance path of gpu_backend_ops */
		tolerance_path(be, ref);
		/* 5. the memory plan against the allocations */
		const char *g = check_golden_dir();
		if (g) {
			char d1[4096], d2[4096];
			snprintf(d1, sizeof(d1), "%s/tiny-sparse", g);
			snprintf(d2, sizeof(d2), "%s/tiny-dense", g);
			plan_check(d1, 1000, 256, 600);
			plan_check(d1, 4096, 64, 100);
			plan_check(d2, 2048, 128, 300);
		}
		char tmp[] = "/tmp/sfw-bo-XXXXXX";
		if (mkdtemp(tmp)) {
			struct sfw_mkmodel_params mp;
			memset(&mp, 0, sizeof(mp));
			mp.preset = SFW_MKMODEL_TINY, mp.seed = 3, mp.nthreads = 1, mp.no_tokenizer = 1;
			mp.w8 = 1, mp.w8_group = 64;
			CHECK(sfw_mkmodel(tmp, &mp, &err) == SFW_OK, "mkmodel tiny --w8 64: %s", err.msg);
			plan_check(tmp, 777, 256, 100);
			char cmd[4200];
			snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
			CHECK(system(cmd) == 0, "remove %s", tmp);
		}
	}
	ref->destroy(ref);
	be->destroy(be);
	return CHECK_REPORT("test_backend_ops");
}
