/* modules: tools quant runner formats kernels num fetch verify core */
/* gpu_golden.c - the CUDA engine end to end: every golden case against
 * golden_bf16 (the reference computed in bf16, as this backend computes), and
 * against the CPU engine on the same case (its record written to a temporary
 * safetensors file and compared the same way). The comparison code and its
 * tolerances are test_golden.c's (TOL_BF16: logits 1.5e-2 absolute, hidden
 * states 3e-2 relative, selections not required equal since bf16 ties move
 * them, first greedy token equal); the measured maxima are printed so the
 * real distance is on record. With --kv-cache fp8 (every case): the CUDA
 * engine against golden_bf16 and against the CPU engine with the same fp8
 * cache, the same tolerances, and its distance from the bf16 cache printed
 * (logits relative to their largest magnitude, top-1 per row).
 *   gpu_golden [case]     (SALAFW_GOLDEN names the golden folder) */
#define main test_golden_main
#include "test_golden.c"
#undef main

#include "lib/compare.h"
#include "quant/quant.h"
#include "runner/backend.h"
#include "tools/tools.h"

#include <sys/stat.h>
#include <unistd.h>

static struct sfw_record *run_on(struct sfw_model *m, const struct sfw_st_file *g, double *secs)
{
	struct sfw_err err = {0};
	const struct sfw_tensor_info *ids = sfw_st_find(g, "input_ids");
	const struct sfw_tensor_info *feed = sfw_st_find(g, "decode.input_ids");
	CHECK(ids && feed, "golden file has input_ids and decode.input_ids");
	if (!ids || !feed)
		return NULL;
	struct sfw_score_params sp = {ids->data, (size_t)ids->nelem, (int)feed->nelem, feed->data, 1,
				      sfw_ctx_default_params()};
	struct sfw_record *r = NULL;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	enum sfw_status s = sfw_score_run(m, &sp, &r, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	*secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	CHECK(s == SFW_OK, "score: %s", err.msg);
	return s == SFW_OK ? r : NULL;
}

static struct sfw_model *load_kv(const char *dir, enum sfw_device dev, enum sfw_kv_cache kv)
{
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = dev;
	mp.kv_cache = kv;
	enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
	CHECK(s == SFW_OK, "%s: load on %s: %s", dir, dev == SFW_DEVICE_CUDA ? "cuda" : "cpu", err.msg);
	if (s == SFW_OK)
		CHECK(strcmp(sfw_model_device_name(m), dev == SFW_DEVICE_CUDA ? "cuda" : "cpu") == 0,
		      "%s: runs on %s", dir, sfw_model_device_name(m));
	return s == SFW_OK ? m : NULL;
}

static struct sfw_model *load(const char *dir, enum sfw_device dev)
{
	return load_kv(dir, dev, SFW_KV_CACHE_ACT);
}

/* The memory plan on a loaded CUDA model: a context far past the device is
 * refused with the numbers and a largest context that fits, which is then
 * accepted; a benchmark run's real peak matches the plan. */
static void mem_plan_checks(struct sfw_model *m, const char *name)
{
	struct sfw_err err = {0};
	struct sfw_mem_plan pl;
	enum sfw_status s = sfw_plan_check(m, (int64_t)1 << 40, 256, &pl, &err);
	CHECK(s == SFW_E_NOMEM && strstr(err.msg, "does not fit the GPU") && strstr(err.msg, "GiB are free"),
	      "%s: 2^40 tokens refused with the numbers (%s)", name, err.msg);
	const char *at = strstr(err.msg, "at most about ");
	long long fit = 0;
	CHECK(at && sscanf(at, "at most about %lld", &fit) == 1 && fit > 4096, "%s: a largest context named", name);
	if (fit > 4096) {
		struct sfw_err e2 = {0};
		CHECK(sfw_plan_check(m, fit, 256, NULL, &e2) == SFW_OK, "%s: the named %lld tokens fit: %s", name, fit,
		      e2.msg);
		CHECK(sfw_plan_check(m, fit * 2 + 4096, 256, NULL, &e2) == SFW_E_NOMEM, "%s: twice that does not",
		      name);
	}
	struct sfw_bench_params bp = {300, 4, 0, 0, 0};
	struct sfw_bench_result r;
	s = sfw_bench_run(m, &bp, &r, &err);
	CHECK(s == SFW_OK, "%s: bench run: %s", name, err.msg);
	if (s == SFW_OK) {
		sfw_plan_model(m, r.n_ctx, (int)r.chunk, &pl);
		double off = r.peak_bytes - pl.total, margin = 0.1 * pl.total + (32 << 20);
		printf("  %s: memory plan %.1f MiB, measured peak %.1f MiB (%+.1f MiB)\n", name, pl.total / 1048576.0,
		       r.peak_bytes / 1048576.0, off / 1048576.0);
		CHECK(off <= margin && -off <= margin, "%s: plan %.1f MiB vs peak %.1f MiB", name, pl.total / 1048576.0,
		      r.peak_bytes / 1048576.0);
	}
}

/* int8 on CUDA against int8 on the CPU: the case quantized with the
 * project's quantizer (RTN, in process, group `group`), then both engines
 * on it, compared as bf16 CUDA vs CPU is (TOL_BF16). */
static void gpu_case_w8(const char *gdir, const char *name, int group)
{
	char src[4096], dst[256], path[4200];
	struct sfw_err err = {0};
	snprintf(src, sizeof(src), "%s/%s", gdir, name);
	snprintf(dst, sizeof(dst), "/tmp/gpu_golden_w8_%s_%d", name, (int)getpid());
	snprintf(path, sizeof(path), "%s/golden_bf16.safetensors", src);
	struct sfw_quant_params qp = sfw_quant_default_params();
	qp.method = SFW_QUANT_RTN;
	qp.group_size = group;
	qp.force = 1;
	struct sfw_quant_stats st = {0};
	qp.stats = &st;
	enum sfw_status s = sfw_quant_run(src, dst, &qp, &err);
	CHECK(s == SFW_OK, "%s: quantize (rtn, group %d): %s", name, group, err.msg);
	struct sfw_st_file *g = NULL;
	if (s == SFW_OK)
		s = sfw_st_open(path, &g, &err);
	CHECK(s == SFW_OK, "%s: %s", path, err.msg);
	if (s == SFW_OK) {
		CHECK(st.n_quantized > 0, "%s: %d linears quantized", name, st.n_quantized);
		struct sfw_model *gm = load(dst, SFW_DEVICE_CUDA);
		struct sfw_model *cm = load(dst, SFW_DEVICE_CPU);
		if (gm && cm) {
			double gs = 0, cs = 0;
			struct sfw_record *rg = run_on(gm, g, &gs);
			struct sfw_record *rc = run_on(cm, g, &cs);
			char tmp[256], label[160];
			struct worst w;
			if (rg && rc) {
				printf("  %s int8 (rtn, group %d, %d linears): cuda %.2fs, cpu %.2fs (wall)\n", name, group,
				       st.n_quantized, gs, cs);
				snprintf(tmp, sizeof(tmp), "/tmp/gpu_golden_cpu_w8_%d.safetensors", (int)getpid());
				s = sfw_record_write(rc, tmp, "case", name, &err);
				CHECK(s == SFW_OK, "write %s: %s", tmp, err.msg);
				struct sfw_st_file *cpu = NULL;
				if (s == SFW_OK && sfw_st_open(tmp, &cpu, &err) == SFW_OK) {
					double keep = g_score_factor;
					g_score_factor = 1;
					snprintf(label, sizeof(label), "%s int8 g%d cuda vs cpu engine", name, group);
					compare(label, cpu, from_record, rg, &TOL_BF16, &w);
					g_score_factor = keep;
					sfw_st_close(cpu);
				}
				unlink(tmp);
			}
			sfw_record_free(rg);
			sfw_record_free(rc);
		}
		if (gm)
			mem_plan_checks(gm, name);
		sfw_model_free(gm);
		sfw_model_free(cm);
		sfw_st_close(g);
	}
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dst);
	CHECK(system(cmd) == 0, "remove %s", dst);
}

static void gpu_case(const char *gdir, const char *name)
{
	char dir[4096], path[4200], tmp[256];
	struct sfw_err err = {0};
	snprintf(dir, sizeof(dir), "%s/%s", gdir, name);
	snprintf(path, sizeof(path), "%s/golden_bf16.safetensors", dir);
	struct sfw_st_file *g = NULL;
	enum sfw_status s = sfw_st_open(path, &g, &err);
	CHECK(s == SFW_OK, "%s: %s", path, err.msg);
	if (s != SFW_OK)
		return;
	struct sfw_model *gm = load(dir, SFW_DEVICE_CUDA);
	struct sfw_model *cm = load(dir, SFW_DEVICE_CPU);
	if (gm && cm) {
		const struct sfw_config *cf = sfw_model_config(gm);
		int group = cf->num_attention_heads / cf->num_key_value_heads;
		g_score_factor = group < 16 ? 16.0 / group : 1;
		double gs = 0, cs = 0;
		struct sfw_record *rg = run_on(gm, g, &gs);
		struct sfw_record *rc = run_on(cm, g, &cs);
		char label[160];
		struct worst w;
		if (rg) {
			printf("  %s: cuda %.2fs, cpu %.2fs (wall)\n", name, gs, cs);
			snprintf(label, sizeof(label), "%s cuda vs golden_bf16", name);
			compare(label, g, from_record, rg, &TOL_BF16, &w);
		}
		if (rg && rc) {
			/* the CPU record as a reference file, compared the same way */
			snprintf(tmp, sizeof(tmp), "/tmp/gpu_golden_cpu_%d.safetensors", (int)getpid());
			s = sfw_record_write(rc, tmp, "case", name, &err);
			CHECK(s == SFW_OK, "write %s: %s", tmp, err.msg);
			struct sfw_st_file *cpu = NULL;
			if (s == SFW_OK && sfw_st_open(tmp, &cpu, &err) == SFW_OK) {
				double keep = g_score_factor;
				g_score_factor = 1; /* both engines skip the head repetition */
				snprintf(label, sizeof(label), "%s cuda vs cpu engine", name);
				compare(label, cpu, from_record, rg, &TOL_BF16, &w);
				g_score_factor = keep;
				sfw_st_close(cpu);
			}
			unlink(tmp);
		}
		sfw_record_free(rg);
		sfw_record_free(rc);
	}
	sfw_model_free(gm);
	sfw_model_free(cm);
	sfw_st_close(g);
}

/* max |a - b| / max |a| over the logits of two records, and the rows whose
 * argmax agree. The bounds: 3% of the scale (the fp8 cache's rounding moves
 * the logits by about 1% of it on these cases), and top-1 on 96% of rows.
 * The tiny random models' top-2 gaps are small: many rows have a gap under
 * the largest difference (printed), and in tiny-sparse a changed key moves
 * the compressed keys, so some rows select other blocks. Measured on an
 * H100 (sm_90): top-1 196 / 200 (dense), 1,469 / 1,500 (sparse), 296 / 300
 * (cross) prefill rows, every decode row. */
static void logits_vs(const struct sfw_record *ra, const struct sfw_record *rb, const char *label)
{
	const char *names[] = {"prefill.logits", "decode.logits"};
	for (int k = 0; k < 2; k++) {
		const struct sfw_record_tensor *a = sfw_record_find(ra, names[k]), *b = sfw_record_find(rb, names[k]);
		if (!a || !b || a->shape[0] != b->shape[0] || a->shape[1] != b->shape[1]) {
			CHECK(0, "%s: %s in both", label, names[k]);
			continue;
		}
		long long R = a->shape[0];
		struct cmp_logits c = cmp_logits(a->data, b->data, R, a->shape[1]);
		printf("  %s %s: logits max rel %.3g, top-1 %lld / %lld rows (%lld rows with a top-2 gap under the largest "
		       "difference)\n",
		       label, names[k], c.rel, c.agree, R, c.close);
		CHECK(c.rel > 0 && c.rel < 0.03 && c.agree * 100 >= R * 96,
		      "%s %s: within 3%% of the scale, top-1 on 96%% of rows", label, names[k]);
	}
}

/* --kv-cache fp8 on CUDA: against golden_bf16, the CPU engine's fp8 cache
 * and the CUDA bf16 cache. */
static void gpu_case_kv8(const char *gdir, const char *name)
{
	char dir[4096], path[4200], tmp[256];
	struct sfw_err err = {0};
	snprintf(dir, sizeof(dir), "%s/%s", gdir, name);
	snprintf(path, sizeof(path), "%s/golden_bf16.safetensors", dir);
	struct sfw_st_file *g = NULL;
	if (sfw_st_open(path, &g, &err) != SFW_OK) {
		CHECK(0, "%s: %s", path, err.msg);
		return;
	}
	struct sfw_model *g8 = load_kv(dir, SFW_DEVICE_CUDA, SFW_KV_CACHE_FP8),
			 *c8 = load_kv(dir, SFW_DEVICE_CPU, SFW_KV_CACHE_FP8), *gb = load(dir, SFW_DEVICE_CUDA);
	if (g8 && c8 && gb) {
		const struct sfw_config *cf = sfw_model_config(g8);
		int group = cf->num_attention_heads / cf->num_key_value_heads;
		g_score_factor = group < 16 ? 16.0 / group : 1;
		double t = 0;
		struct sfw_record *r8 = run_on(g8, g, &t), *rc = run_on(c8, g, &t), *rb = run_on(gb, g, &t);
		char label[160];
		struct worst w;
		if (r8) {
			snprintf(label, sizeof(label), "%s cuda fp8 K/V vs golden_bf16", name);
			compare(label, g, from_record, r8, &TOL_BF16, &w);
		}
		if (r8 && rc) {
			snprintf(tmp, sizeof(tmp), "/tmp/gpu_golden_cpu8_%d.safetensors", (int)getpid());
			enum sfw_status s = sfw_record_write(rc, tmp, "case", name, &err);
			CHECK(s == SFW_OK, "write %s: %s", tmp, err.msg);
			struct sfw_st_file *cpu = NULL;
			if (s == SFW_OK && sfw_st_open(tmp, &cpu, &err) == SFW_OK) {
				double keep = g_score_factor;
				g_score_factor = 1;
				snprintf(label, sizeof(label), "%s cuda fp8 K/V vs cpu fp8 K/V", name);
				compare(label, cpu, from_record, r8, &TOL_BF16, &w);
				g_score_factor = keep;
				sfw_st_close(cpu);
			}
			unlink(tmp);
		}
		if (r8 && rb) {
			snprintf(label, sizeof(label), "%s cuda: fp8 K/V vs bf16 K/V", name);
			logits_vs(rb, r8, label);
		}
		sfw_record_free(r8), sfw_record_free(rc), sfw_record_free(rb);
	}
	sfw_model_free(g8), sfw_model_free(c8), sfw_model_free(gb);
	sfw_st_close(g);
}

int main(int argc, char **argv)
{
	const char *gdir = check_golden_dir();
	if (gdir) {
		const char *cases[] = {"tiny-dense", "tiny-sparse", "tiny-cross"};
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			if (argc < 2 || strcmp(argv[1], cases[i]) == 0) {
				gpu_case(gdir, cases[i]);
				gpu_case_kv8(gdir, cases[i]);
				/* int8: every case at two group sizes, all four sizes covered */
				static const int groups[][2] = {{128, 32}, {64, SFW_QL_GROUP_CHANNEL}, {32, 128}};
				for (int k = 0; k < 2; k++)
					gpu_case_w8(gdir, cases[i], groups[i][k]);
			}
	}
	return CHECK_REPORT("gpu_golden");
}
