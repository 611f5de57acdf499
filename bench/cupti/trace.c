/* trace.c - a kernel timeline for machines without Nsight Systems: a CUDA
 * injection library (CUDA_INJECTION64_PATH=libsfw_cupti_trace.so) that
 * records every kernel's start and end through CUPTI's activity API, graph
 * nodes included, and writes "start_ns end_ns name" lines to the file named
 * by SALAFW_CUPTI_OUT when the process exits; bench/trace_step.py reads it
 * (scripts/gpu-run.sh trace). Built by `make CUDA=1 cupti-trace`;
 * scripts/device-prep.sh bundles it with libcupti. The traced process runs
 * unchanged. */
#include <cupti.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *g_out;

#define BUF_BYTES (8u << 20)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = aligned_alloc(8, BUF_BYTES);
	*size = *buffer ? BUF_BYTES : 0;
	*max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
	(void)ctx, (void)stream, (void)size;
	CUpti_Activity *rec = NULL;
	while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
		if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
			continue;
		const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
		fprintf(g_out, "%llu %llu %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
			k->name ? k->name : "?");
	}
	free(buffer);
}

static void flush_all(void)
{
	cuptiActivityFlushAll(1);
	if (g_out)
		fclose(g_out);
	g_out = NULL;
}

/* Called by the CUDA driver when it loads the library. */
int InitializeInjection(void)
{
	const char *path = getenv("SALAFW_CUPTI_OUT");
	if (!path || !(g_out = fopen(path, "w"))) {
		fprintf(stderr, "cupti_trace: set SALAFW_CUPTI_OUT to a writable file\n");
		return 0;
	}
	if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(stderr, "cupti_trace: CUPTI refused the kernel activity\n");
		fclose(g_out);
		g_out = NULL;
		return 0;
	}
	atexit(flush_all);
	return 1;
}
