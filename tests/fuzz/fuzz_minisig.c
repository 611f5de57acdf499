/* fuzz_minisig - libFuzzer target for the .minisig and public-key parsers and
 * the whole signature check (a fixed key and message). */
#include "verify/verify.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char msg[] = "{\"schema_version\": 1}\n";
	struct sfw_pubkey key;
	sfw_pubkey_pinned(&key);
	struct sfw_minisig_info info;
	struct sfw_err err;
	(void)sfw_minisig_verify(msg, sizeof(msg) - 1, (const char *)data, size, "fuzz.minisig", &key, 0,
				 &info, &err);
	struct sfw_pubkey pk;
	(void)sfw_pubkey_parse((const char *)data, size, "fuzz key", &pk, &err);
	/* The trust flow with the input as the signature of a fixed manifest. */
	struct sfw_trust_params p = sfw_trust_default_params();
	p.state_dir = "";
	(void)sfw_manifest_verify(msg, sizeof(msg) - 1, (const char *)data, size, "fuzz", &p, NULL, NULL,
				  &err);
	return 0;
}
