/* gpu_mem.h - device buffers for the GPU tests: every buffer starts as
 * 0xff bytes (NaN in f32 and bf16), so an output a kernel leaves unwritten
 * fails its comparison. A failed allocation ends the test with a FAIL line. */
#ifndef SFW_TEST_GPU_MEM_H
#define SFW_TEST_GPU_MEM_H

#include "kernels/ops_cuda.h"

#include <stdio.h>
#include <stdlib.h>

static inline void *sfwt_dalloc(size_t bytes, void *stream)
{
	void *p;
	struct sfw_err e = {0};
	if (sfw_cuda_malloc(&p, bytes ? bytes : 4, "test", &e) != SFW_OK) {
		printf("FAIL %s\n", e.msg);
		exit(1);
	}
	sfw_cuda_memset(p, 0xff, bytes ? bytes : 4, stream);
	return p;
}

/* A device copy of h's bytes, complete when it returns. */
static inline void *sfwt_up(const void *h, size_t bytes, void *stream)
{
	void *d = sfwt_dalloc(bytes, stream);
	sfw_cuda_h2d(d, h, bytes, stream);
	sfw_cuda_sync(stream);
	return d;
}

#endif
