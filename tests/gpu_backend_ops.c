/* modules: tools quant runner formats kernels num fetch verify core */
/* gpu_backend_ops.c - every op of struct sfw_backend on the CUDA backend
 * (sfw_backend_cuda_new, default struct sfw_backend_opts) against the CPU
 * backend, through the table of tests/lib/backend_ops.c: the same cases as
 * test_backend_ops (batched M = 1, 2, 4, 8, 17, 64, odd K and N, every
 * weight dtype, group size and scale dtype), compared with the table's
 * tolerances (bf16 activations on the CUDA side); and the
 * memory plan (runner/plan.h) against the CUDA allocator's own accounting
 * (sfw_cuda_mem_stats: every sfw_cuda_malloc, the arenas included) and,
 * for a large context, the driver's free memory (cudaMemGetInfo).
 * Without a usable GPU it fails (it is run where one is: scripts/gpu-run.sh).
 *   gpu_backend_ops [FILTER]   (SALAFW_GOLDEN names the golden folder) */
#include "check.h"
#include "lib/backend_ops.h"

#include "kernels/ops_cuda.h"
#include "runner/model.h"
#include "tools/tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* forward.c refers to the CUDA backend weakly: make sure it is linked. */
enum sfw_status (*const gpu_backend_ops_backend)(const struct sfw_backend_opts *, struct sfw_backend **,
						 struct sfw_err *) = sfw_backend_cuda_new;

static size_t cuda_live(void)
{
	size_t live = 0;
	sfw_cuda_mem_stats(&live, NULL, NULL);
	return live;
}

static void fold(const struct bo_result *r)
{
	check_passed_ += r->checks_passed, check_failed_ += r->checks_failed;
}

#define MIB ((double)(1 << 20))

/* The plan on the CUDA backend: weights in slabs (the plan's bytes; the
 * first slab of SLAB_MIN = 4 MiB, holding the one-row weights placed
 * before the deferred ones, may be partly empty); at backend creation the
 * op scratch (64 MiB), the cuBLASLt workspace (32 MiB) and the int8 GEMM's
 * split-K workspace (SFW_CUDA_W8WS_BYTES), the plan's fixed scratch; per context the activations (bf16, as planned, the 4-byte
 * buffers included) and the caches (KV, compressed keys, lightning states
 * reserved exactly for n_ctx); during a call past dense_len the
 * block-selection scratch, which the plan counts at its cap (256 MiB). */
static void plan_check(const char *dir, int64_t n_ctx, int chunk, int64_t prompt, int driver)
{
	size_t live0 = cuda_live();
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CUDA;
	struct sfw_model *m = NULL;
	struct sfw_err err = {0};
	CHECK(sfw_model_load(dir, &mp, &m, &err) == SFW_OK, "load %s on cuda: %s", dir, err.msg);
	if (!m)
		return;
	const struct sfw_config *cf = sfw_model_config(m);
	struct sfw_mem_plan p;
	sfw_plan_model(m, n_ctx, chunk, &p);
	double fixed = 96 * MIB + (double)SFW_CUDA_W8WS_BYTES, sel = p.scratch - fixed;
	double placed = (double)cuda_live() - (double)live0 - fixed;
	CHECK(placed >= p.weights && placed <= p.weights * 1.01 + 4 * MIB + 4096,
	      "%s: weights and slabs %.0f B, plan %.0f B (+ at most the first 4 MiB slab)", dir, placed,
	      p.weights);
	struct bo_counting *w = bo_counting_wrap(m->be, cuda_live);
	m->be = &w->be;
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	cp.n_ctx = n_ctx, cp.prefill_chunk = chunk;
	struct sfw_ctx *c = NULL;
	size_t fr0 = 0, fr1 = 0, tot = 0;
	sfw_cuda_mem_info(&fr0, &tot);
	CHECK(sfw_ctx_new(m, &cp, &c, &err) == SFW_OK, "context of %lld: %s", (long long)n_ctx, err.msg);
	sfw_cuda_mem_info(&fr1, &tot);
	if (c) {
		double extra = 64; /* the allocator's alignment of a dozen buffers */
		double cache = p.kv + p.compressed + p.lightning;
		CHECK((double)w->alloc_live >= p.activations &&
			  (double)w->alloc_live <= p.activations + extra,
		      "%s, %lld tokens, %d-row pieces: activations %zu B, plan %.0f B (+ at most %.0f)",
		      dir, (long long)n_ctx, chunk, w->alloc_live, p.activations, extra);
		CHECK(
		    fabs((double)w->cache_bytes - cache) <= 0.001 * cache + 4096,
		    "%s, %lld tokens: caches %lld B, plan %.0f B (KV %.0f, compressed %.0f, lightning %.0f)",
		    dir, (long long)n_ctx, w->cache_bytes, cache, p.kv, p.compressed, p.lightning);
		if (driver) { /* the driver's view, at a size where its 2 MiB granules do not matter */
			double used = (double)fr0 - (double)fr1, want = cache + p.activations;
			CHECK(used >= 0.99 * want && used <= 1.05 * want + 16 * MIB,
			      "%s: the driver's free memory fell by %.0f B for a context the plan puts at "
			      "%.0f B",
			      dir, used, want);
		}
		if (prompt > 0) {
			int32_t *ids = malloc((size_t)prompt * sizeof(int32_t));
			for (int64_t i = 0; i < prompt; i++)
				ids[i] = (int32_t)(1 + (i * 7919) % (cf->vocab_size - 9));
			long long before = w->cache_bytes;
			size_t base = cuda_live(), peak = 0;
			sfw_cuda_mem_reset_peak();
			CHECK(sfw_ctx_prefill(c, ids, (size_t)prompt, NULL, &err) == SFW_OK,
			      "prefill %lld: %s", (long long)prompt, err.msg);
			sfw_cuda_mem_stats(NULL, &peak, NULL);
			double grew = (double)peak - (double)base;
			CHECK(w->cache_bytes == before,
			      "%s: a %lld-token prompt in a %lld-token context grows no cache (%+lld B)", dir,
			      (long long)prompt, (long long)n_ctx, w->cache_bytes - before);
			CHECK(grew <= sel + 4096,
			      "%s: the call's peak growth %.0f B within the planned selection scratch %.0f B",
			      dir, grew, sel);
			CHECK((double)peak - (double)live0 <= p.total * 1.01 + 4 * MIB,
			      "%s: peak device memory %.0f B within the plan's total %.0f B", dir,
			      (double)peak - (double)live0, p.total);
			printf("plan %s at %lld tokens on cuda: weights %.0f B (plan %.0f), activations %zu "
			       "B (plan %.0f), caches "
			       "%lld B (plan %.0f), a %lld-token call's scratch %.0f B (plan at most %.0f)\n",
			       dir, (long long)n_ctx, placed, p.weights, w->alloc_live, p.activations,
			       w->cache_bytes, cache, (long long)prompt, grew, sel);
			free(ids);
		}
		sfw_ctx_free(c);
	}
	CHECK(w->alloc_live == 0 && llabs(w->cache_bytes) <= 4096,
	      "%s: freeing the context gives everything back (%zu B of buffers, %lld B of caches left)", dir,
	      w->alloc_live, w->cache_bytes);
	sfw_model_free(m);
}

static void plan_checks(void)
{
	struct sfw_err err = {0};
	const char *g = check_golden_dir();
	if (g) {
		char d1[4096], d2[4096];
		snprintf(d1, sizeof(d1), "%s/tiny-sparse", g);
		snprintf(d2, sizeof(d2), "%s/tiny-dense", g);
		plan_check(d1, 1000, 256, 600, 0); /* past dense_len 512: the selection scratch */
		plan_check(d1, 131072, 256, 0, 1); /* a large context: the driver's view too */
		plan_check(d2, 2048, 128, 300, 0);
	}
	char tmp[] = "/tmp/sfw-gbo-XXXXXX";
	if (mkdtemp(tmp)) {
		struct sfw_mkmodel_params mp;
		memset(&mp, 0, sizeof(mp));
		mp.preset = SFW_MKMODEL_TINY, mp.seed = 3, mp.no_tokenizer = 1;
		mp.w8 = 1, mp.w8_group = 64;
		CHECK(sfw_mkmodel(tmp, &mp, &err) == SFW_OK, "mkmodel tiny --w8 64: %s", err.msg);
		plan_check(tmp, 777, 256, 100, 0);
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
		CHECK(system(cmd) == 0, "remove %s", tmp);
	}
}

/* The memory plan first (nothing else on the device yet), then the whole
 * table, whose last case is the one that may abort (MM in
 * tests/lib/backend_ops.c). */
int main(int argc, char **argv)
{
	struct sfw_backend *be = NULL, *ref = NULL;
	struct sfw_err err = {0};
	struct sfw_backend_opts bo;
	memset(&bo, 0, sizeof(bo));
	if (sfw_backend_cuda_new(&bo, &be, &err) != SFW_OK) {
		CHECK(0, "no CUDA backend: %s", err.msg);
		return CHECK_REPORT("gpu_backend_ops");
	}
	be->destroy(be);
	be = NULL;
	const char *filter = argc > 1 ? argv[1] : NULL;
	if (!filter)
		plan_checks();
	CHECK(sfw_backend_cpu_new(0, &ref, &err) == SFW_OK, "cpu backend: %s", err.msg);
	if (!ref)
		return CHECK_REPORT("gpu_backend_ops");
	struct bo_opts o = {0, 1, filter, getenv("CHECK_VERBOSE") != NULL, 0};
	struct bo_result r;
	CHECK(sfw_backend_cuda_new(&bo, &be, &err) == SFW_OK, "cuda backend: %s", err.msg);
	if (be) {
		bo_run(be, ref, &o, &r);
		fold(&r);
		/* no paged pool (1 case) on the CUDA backend today: at most 1 skipped */
		CHECK(r.failed == 0 && r.skipped <= 1 && r.passed == r.cases - r.skipped &&
			  (filter || r.passed >= 80),
		      "cuda vs cpu: %d cases passed, %d failed, %d skipped (at most 1)", r.passed, r.failed,
		      r.skipped);
		be->destroy(be);
	}
	ref->destroy(ref);
	return CHECK_REPORT("gpu_backend_ops");
}
