/* libFuzzer target: the safetensors header parser on arbitrary bytes. A file
 * that parses must describe only in-bounds data: every byte of every tensor
 * is read (ASan flags any pointer outside the input), lookups by name find
 * each tensor, and the sizes agree with shape x dtype. */
#include "formats/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sfw_st_file *f = NULL;
	struct sfw_err err;
	if (sfw_st_parse(data, size, "fuzz.safetensors", &f, &err) != SFW_OK) {
		if (!memchr(err.msg, '\0', sizeof(err.msg)) || err.msg[0] == '\0')
			abort(); /* every rejection carries a message */
		return 0;
	}
	unsigned acc = 0;
	for (size_t i = 0; i < sfw_st_count(f); i++) {
		const struct sfw_tensor_info *t = sfw_st_at(f, i);
		uint64_t n = 1;
		for (int d = 0; d < t->ndim; d++)
			n *= t->shape[d];
		if (n != t->nelem || t->nbytes != n * sfw_dtype_size(t->dtype) ||
		    sfw_st_find(f, t->name) != t)
			abort();
		const unsigned char *p = t->data;
		if (t->nbytes && (p < data || p + t->nbytes > data + size))
			abort();
		for (uint64_t k = 0; k < t->nbytes; k++)
			acc += p[k];
	}
	(void)sfw_st_metadata(f, "format");
	sfw_st_close(f);
	return (int)(acc & 0); /* keep the reads */
}
