/* fuzz_gencfg - libFuzzer target for the end-of-sequence parsers
 * (formats/eos.c): the same bytes as generation_config.json and as
 * tokenizer_config.json. Whatever is accepted must respect the bounds: at
 * most SFW_EOS_MAX ids, each below the vocab size; an eos_token name of 1 to
 * SFW_STOP_MAX_LEN bytes, NUL-terminated, or empty. */
#include "formats/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sfw_eos_set s = {0};
	struct sfw_err err;
	const int vocab = 73448;
	if (sfw_eos_parse_generation_config((const char *)data, size, "fuzz", vocab, &s, &err) == SFW_OK) {
		if (s.n < 0 || s.n > SFW_EOS_MAX)
			abort();
		for (int i = 0; i < s.n; i++)
			if (s.ids[i] < 0 || s.ids[i] >= vocab)
				abort();
	}
	char name[SFW_STOP_MAX_LEN + 1];
	memset(name, 'x', sizeof(name));
	if (sfw_eos_parse_tokenizer_config((const char *)data, size, "fuzz", name, sizeof(name), &err) ==
	    SFW_OK) {
		size_t n = strnlen(name, sizeof(name));
		if (n >= sizeof(name))
			abort();
	}
	return 0;
}
