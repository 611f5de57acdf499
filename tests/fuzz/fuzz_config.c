/* fuzz_config - libFuzzer target for config.json parsing: any accepted config
 * must describe a model the engine can size without overflow. */
#include "formats/config.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sfw_config c;
	struct sfw_err err;
	if (sfw_config_parse((const char *)data, size, "fuzz", &c, &err) != SFW_OK)
		return 0;
	if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.vocab_size <= 0 || c.head_dim <= 0 ||
	    c.num_hidden_layers <= 0 || c.num_hidden_layers > SFW_MAX_LAYERS || c.num_attention_heads <= 0 ||
	    c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0 ||
	    c.n_eos < 0 || c.n_eos > SFW_MAX_EOS)
		abort();
	/* the largest tensor, vocab x hidden elements, must fit in 64 bits */
	uint64_t e = (uint64_t)c.vocab_size * (uint64_t)c.hidden_size;
	if (e / (uint64_t)c.vocab_size != (uint64_t)c.hidden_size)
		abort();
	return 0;
}
