/* modules: runner quant kernels fetch verify core */
/* gpu_golden.c - the CUDA engine end to end: every golden case against
 * golden_bf16 (the reference computed in bf16, as this backend computes), and
 * against the CPU engine on the same case (its record written to a temporary
 * safetensors file and compared the same way). The comparison code and its
 * tolerances are test_golden.c's (TOL_BF16: logits 1.5e-2 absolute, hidden
 * states 3e-2 relative, selections not required equal since bf16 ties move
 * them, first greedy token equal); the measured maxima are printed so the
 * real distance is on record.
 *   gpu_golden [case]     (SALAFW_GOLDEN names the golden folder) */
#define main test_golden_main
#include "test_golden.c"
#undef main

#include "runner/backend.h"

#include <unistd.h>

/* forward.c refers to the CUDA backend weakly: make sure this binary has it
 * even if the link flags change. */
enum sfw_status (*const gpu_golden_backend)(const struct sfw_backend_opts *, struct sfw_backend **,
					  struct sfw_err *) = sfw_backend_cuda_new;

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

static struct sfw_model *load(const char *dir, enum sfw_device dev)
{
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = dev;
	enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
	CHECK(s == SFW_OK, "%s: load on %s: %s", dir, dev == SFW_DEVICE_CUDA ? "cuda" : "cpu", err.msg);
	if (s == SFW_OK)
		CHECK(strcmp(sfw_model_device_name(m), dev == SFW_DEVICE_CUDA ? "cuda" : "cpu") == 0,
		      "%s: runs on %s", dir, sfw_model_device_name(m));
	return s == SFW_OK ? m : NULL;
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

int main(int argc, char **argv)
{
	const char *gdir = check_golden_dir();
	if (gdir) {
		const char *cases[] = {"tiny-dense", "tiny-sparse", "tiny-cross"};
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			if (argc < 2 || strcmp(argv[1], cases[i]) == 0)
				gpu_case(gdir, cases[i]);
	}
	return CHECK_REPORT("gpu_golden");
}
