/* cuda_rt.cu - the CUDA runtime behind ops_cuda.h: device selection,
 * counted allocations, arenas, copies, streams, events, graphs, random fills
 * and the copy-bandwidth ceiling. */
#include "cuda_common.cuh"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <string.h>
#include <vector>

extern "C" {
#include "kernels/ops_cuda.h"
}

/* Allocation accounting for the memory report. Process-wide on purpose: it
 * counts what this process holds on the device, whoever allocated it. */
static std::atomic<size_t> g_live{0}, g_peak{0};
static std::atomic<size_t> g_dev_peak_used{0};

extern "C" enum sfw_status sfw_cuda_init(int device, struct sfw_cuda_info *info, struct sfw_err *err)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0)
		return sfw_fail(err, SFW_E_CUDA, "no CUDA device: %s",
				e != cudaSuccess ? cudaGetErrorString(e) : "none found");
	if (device < 0 || device >= n)
		return sfw_fail(err, SFW_E_CUDA, "CUDA device %d does not exist (%d found)", device, n);
	if ((e = cudaSetDevice(device)) != cudaSuccess)
		return sfw_fail(err, SFW_E_CUDA, "cannot select CUDA device %d: %s", device, cudaGetErrorString(e));
	cudaDeviceProp p;
	SFW_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
	if (p.major < 8)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "CUDA device '%s' is sm_%d%d; salafw needs sm_80 or newer",
				p.name, p.major, p.minor);
	if (info) {
		memset(info, 0, sizeof(*info));
		snprintf(info->name, sizeof(info->name), "%s", p.name);
		info->device = device;
		info->cc_major = p.major;
		info->cc_minor = p.minor;
		info->sm_count = p.multiProcessorCount;
		info->l2_bytes = p.l2CacheSize;
		info->smem_optin = p.sharedMemPerBlockOptin;
		SFW_CUDA_CHECK(cudaMemGetInfo(&info->free_mem, &info->total_mem));
	}
	return SFW_OK;
}

extern "C" enum sfw_status sfw_cuda_stream_new(void **stream, struct sfw_err *err)
{
	cudaStream_t s;
	cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	if (e != cudaSuccess)
		return sfw_fail(err, SFW_E_CUDA, "cannot create a CUDA stream: %s", cudaGetErrorString(e));
	*stream = (void *)s;
	return SFW_OK;
}

extern "C" void sfw_cuda_stream_free(void *stream)
{
	if (stream)
		SFW_CUDA_CHECK(cudaStreamDestroy(SFW_CUDA_STREAM(stream)));
}

static void note_device_used(void)
{
	size_t fr = 0, tot = 0;
	if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
		size_t used = tot - fr, old = g_dev_peak_used.load();
		while (used > old && !g_dev_peak_used.compare_exchange_weak(old, used))
			;
	}
}

extern "C" void sfw_cuda_sync(void *stream)
{
	SFW_CUDA_CHECK(cudaStreamSynchronize(SFW_CUDA_STREAM(stream)));
}

extern "C" void *sfw_cuda_event_new(void)
{
	cudaEvent_t ev;
	SFW_CUDA_CHECK(cudaEventCreate(&ev));
	return (void *)ev;
}

extern "C" void sfw_cuda_event_free(void *ev)
{
	if (ev)
		SFW_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

extern "C" void sfw_cuda_event_record(void *ev, void *stream)
{
	SFW_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, SFW_CUDA_STREAM(stream)));
}

extern "C" float sfw_cuda_event_ms(void *start, void *end)
{
	float ms = 0;
	SFW_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)end));
	SFW_CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
	return ms;
}

/* cudaFree does not tell the size: sizes of live allocations are kept here. */
static std::mutex g_sizes_mu;
static std::unordered_map<void *, size_t> *g_sizes;

static void size_note(void *p, size_t n)
{
	std::lock_guard<std::mutex> l(g_sizes_mu);
	if (!g_sizes)
		g_sizes = new std::unordered_map<void *, size_t>();
	(*g_sizes)[p] = n;
}

static size_t size_forget(void *p)
{
	std::lock_guard<std::mutex> l(g_sizes_mu);
	if (!g_sizes)
		return 0;
	auto it = g_sizes->find(p);
	if (it == g_sizes->end())
		return 0;
	size_t n = it->second;
	g_sizes->erase(it);
	return n;
}

extern "C" enum sfw_status sfw_cuda_malloc(void **p, size_t bytes, const char *what, struct sfw_err *err)
{
	*p = NULL;
	if (bytes == 0)
		bytes = 256;
	cudaError_t e = cudaMalloc(p, bytes);
	if (e != cudaSuccess) {
		cudaGetLastError(); /* out of memory is not sticky: clear it */
		size_t fr = 0, tot = 0;
		cudaMemGetInfo(&fr, &tot);
		return sfw_fail(err, SFW_E_CUDA, "cannot allocate %.2f GiB of device memory for %s: %s (%.2f GiB free)",
				bytes / 1073741824.0, what ? what : "buffers", cudaGetErrorString(e), fr / 1073741824.0);
	}
	size_note(*p, bytes);
	size_t live = g_live.fetch_add(bytes) + bytes, old = g_peak.load();
	while (live > old && !g_peak.compare_exchange_weak(old, live))
		;
	note_device_used();
	return SFW_OK;
}

static enum sfw_status counted_malloc(void **p, size_t bytes, const char *what, struct sfw_err *err)
{
	return sfw_cuda_malloc(p, bytes, what, err);
}

extern "C" void sfw_cuda_free(void *p)
{
	if (!p)
		return;
	note_device_used();
	g_live.fetch_sub(size_forget(p));
	SFW_CUDA_CHECK(cudaFree(p));
}

extern "C" void sfw_cuda_mem_stats(size_t *live, size_t *peak, size_t *device_used)
{
	note_device_used();
	if (live)
		*live = g_live.load();
	if (peak)
		*peak = g_peak.load();
	if (device_used)
		*device_used = g_dev_peak_used.load();
}

extern "C" void sfw_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
	size_t f = 0, t = 0;
	SFW_CUDA_CHECK(cudaMemGetInfo(&f, &t));
	*free_bytes = f;
	*total_bytes = t;
}

extern "C" void sfw_cuda_mem_reset_peak(void)
{
	g_peak.store(g_live.load());
	size_t fr = 0, tot = 0;
	if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
		g_dev_peak_used.store(tot - fr);
}

#define ARENA_ALIGN 256

extern "C" size_t sfw_cuda_arena_round(size_t bytes)
{
	return (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

extern "C" enum sfw_status sfw_cuda_arena_new(struct sfw_cuda_arena *a, size_t bytes, const char *what,
					       struct sfw_err *err)
{
	a->base = NULL;
	a->size = a->used = 0;
	void *p;
	enum sfw_status st = counted_malloc(&p, bytes, what, err);
	if (st != SFW_OK)
		return st;
	a->base = (unsigned char *)p;
	a->size = bytes;
	return SFW_OK;
}

extern "C" void *sfw_cuda_arena_take(struct sfw_cuda_arena *a, size_t bytes)
{
	size_t n = sfw_cuda_arena_round(bytes);
	if (!a->base || n > a->size - a->used)
		return NULL;
	void *p = a->base + a->used;
	a->used += n;
	return p;
}

extern "C" void sfw_cuda_arena_release(struct sfw_cuda_arena *a)
{
	if (a->base)
		sfw_cuda_free(a->base);
	a->base = NULL;
	a->size = a->used = 0;
}

extern "C" void sfw_cuda_h2d(void *dst, const void *src, size_t n, void *stream)
{
	SFW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_d2h(void *dst, const void *src, size_t n, void *stream)
{
	SFW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_d2d(void *dst, const void *src, size_t n, void *stream)
{
	SFW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_d2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				size_t height, void *stream)
{
	SFW_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice,
					 SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_memset(void *dst, int byte, size_t n, void *stream)
{
	SFW_CUDA_CHECK(cudaMemsetAsync(dst, byte, n, SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_graph_begin(void *stream)
{
	SFW_CUDA_CHECK(cudaStreamBeginCapture(SFW_CUDA_STREAM(stream), cudaStreamCaptureModeThreadLocal));
}

extern "C" enum sfw_status sfw_cuda_graph_end(void *stream, void **graph_exec, struct sfw_err *err)
{
	cudaGraph_t g;
	cudaGraphExec_t ge;
	SFW_CUDA_CHECK(cudaStreamEndCapture(SFW_CUDA_STREAM(stream), &g));
	cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return sfw_fail(err, SFW_E_CUDA, "cannot instantiate the decode graph: %s", cudaGetErrorString(e));
	}
	*graph_exec = (void *)ge;
	return SFW_OK;
}

extern "C" void sfw_cuda_graph_launch(void *graph_exec, void *stream)
{
	SFW_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph_exec, SFW_CUDA_STREAM(stream)));
}

extern "C" void sfw_cuda_graph_free(void *graph_exec)
{
	if (graph_exec)
		SFW_CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph_exec));
}

/* splitmix64 of (seed, index): independent per element, reproducible. */
static __device__ __forceinline__ float rnd_uniform(uint64_t seed, size_t i)
{
	uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

static __global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = sfwc_tobf(rnd_uniform(seed, i) * scale);
}

static __global__ void fill_f32_kernel(float *p, size_t n, uint64_t seed, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = rnd_uniform(seed, i) * scale;
}

static unsigned fill_grid(size_t n)
{
	size_t b = (n + 255) / 256;
	return (unsigned)std::min<size_t>(std::max<size_t>(b, 1), 65536);
}

extern "C" void sfw_cuda_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale, void *stream)
{
	fill_bf16_kernel<<<fill_grid(n), 256, 0, SFW_CUDA_STREAM(stream)>>>(p, n, seed, scale);
	SFW_CUDA_LAUNCHED();
}

extern "C" void sfw_cuda_fill_f32(float *p, size_t n, uint64_t seed, float scale, void *stream)
{
	fill_f32_kernel<<<fill_grid(n), 256, 0, SFW_CUDA_STREAM(stream)>>>(p, n, seed, scale);
	SFW_CUDA_LAUNCHED();
}

extern "C" enum sfw_status sfw_cuda_measure_copy(size_t bytes, double *gbps, struct sfw_err *err)
{
	void *a, *b;
	enum sfw_status st = counted_malloc(&a, bytes, "the copy benchmark", err);
	if (st != SFW_OK)
		return st;
	if ((st = counted_malloc(&b, bytes, "the copy benchmark", err)) != SFW_OK) {
		sfw_cuda_free(a);
		return st;
	}
	cudaStream_t s;
	SFW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	sfw_cuda_fill_bf16((uint16_t *)a, bytes / 2, 7, 1.0f, s);
	cudaEvent_t e0, e1;
	SFW_CUDA_CHECK(cudaEventCreate(&e0));
	SFW_CUDA_CHECK(cudaEventCreate(&e1));
	for (int i = 0; i < 3; i++)
		SFW_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
	std::vector<float> t;
	for (int i = 0; i < 15; i++) {
		SFW_CUDA_CHECK(cudaEventRecord(e0, s));
		SFW_CUDA_CHECK(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, s));
		SFW_CUDA_CHECK(cudaEventRecord(e1, s));
		float ms;
		SFW_CUDA_CHECK(cudaEventSynchronize(e1));
		SFW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
		t.push_back(ms);
	}
	std::sort(t.begin(), t.end());
	*gbps = 2.0 * (double)bytes / (t[t.size() / 2] * 1e-3) / 1e9;
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(s);
	sfw_cuda_free(a);
	sfw_cuda_free(b);
	return SFW_OK;
}
