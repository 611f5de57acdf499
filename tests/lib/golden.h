/* golden.h - a golden case's model loaded for a CPU test: the case NAME
 * under check_golden_dir() (check.h), or NULL after one FAIL line naming
 * it (the golden data missing, or the model refused). Include after
 * check.h. */
#ifndef SFW_TEST_GOLDEN_H
#define SFW_TEST_GOLDEN_H

#include "runner/runner.h"

static inline struct sfw_model *check_golden_model(const char *name, int threads)
{
	const char *g = check_golden_dir();
	if (!g)
		return NULL;
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/%s", g, name);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	mp.threads = threads;
	struct sfw_model *m = NULL;
	struct sfw_err err = {0};
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK) {
		CHECK(0, "%s: %s", name, err.msg);
		return NULL;
	}
	return m;
}

#endif
