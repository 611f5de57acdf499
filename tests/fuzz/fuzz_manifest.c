/* fuzz_manifest - libFuzzer target for the manifest parser (strict JSON,
 * schema, path rules, sorting) and the path checker. */
#include "verify/verify.h"

#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1);
	struct sfw_manifest m;
	struct sfw_err err;
	if (sfw_manifest_parse((const char *)data, size, "fuzz", &m, &err) == SFW_OK) {
		/* Everything a parsed manifest promises must hold. */
		uint64_t total = 0;
		for (size_t i = 0; i < m.nfiles; i++) {
			if (sfw_path_check(m.files[i].path, NULL) != SFW_OK)
				abort();
			if (i && strcmp(m.files[i - 1].path, m.files[i].path) >= 0)
				abort();
			total += m.files[i].size;
		}
		if (total != m.total_size || m.nfiles == 0)
			abort();
		const struct sfw_manifest_lineage *l = &m.lineage; /* bounded, and complete when present */
		if (l->present && (!l->derived_by || !l->method || l->nparams > SFW_LINEAGE_MAX_PARAMS ||
				   (l->has_parent && (!l->parent_repo_id || strlen(l->parent_key_id) != 16))))
			abort();
		for (size_t i = 0; i < l->nparams; i++)
			if (!l->param_key[i] || !l->param_value[i] || strlen(l->param_value[i]) > 128)
				abort();
		sfw_manifest_release(&m);
	}
	char *s = malloc(size + 1);
	if (s) {
		memcpy(s, data, size);
		s[size] = '\0';
		(void)sfw_path_check(s, &err);
		free(s);
	}
	return 0;
}
