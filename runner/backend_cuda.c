/* backend_cuda.c - the CUDA instance of struct sfw_backend (CUDA=1 builds):
 * bf16 activations in device memory, rounded where the reference rounds;
 * weights uploaded tensor by tensor from the map into a few large device
 * slabs (no per-tensor cudaMalloc); caches in device memory, the sparse KV
 * cache growing in whole 64-token blocks (exactly the reserved length when
 * the context is reserved up front), lightning states fp32 updated in place.
 * A batch's caches may instead be paged (pool_new): their K/V blocks come
 * from one pool allocated up front, found through a block table per cache
 * that the attention, compression and K/V append kernels read
 * (kernels/ops_cuda.h, struct sfw_pages).
 * Every op runs on the backend's one stream; the host waits only in transfers to the host
 * and sync. CUDA runtime calls live in kernels/ (ops_cuda.h), so the
 * backend's files are plain C. This file holds the device, the weights,
 * memory and transfers and the member table; the caches, the ops and the
 * recorded steps have files of their own (runner/backend_cuda.h). */
#include "runner/backend_cuda.h"
#include "alloc.h"
#include "file.h"
#include "formats/safetensors.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const prof_name[PROF_N] = {
	"embed", "rmsnorm", "add_scaled", "silu_mul", "sigmoid_mul", "rope", "matmul M<=8 (GEMV)",
	"matmul M>8 (cuBLASLt)", "logits", "kv_append", "attn_dense", "compress", "sparse_select",
	"attn_sparse", "gla recurrent", "gla chunked", "add_rmsnorm (fused)", "sample", "qk_norm_rope (fused)",
	"rmsnorm_gate (fused)"};

#define SLAB_MIN ((size_t)4 << 20)
#define SLAB_MAX ((size_t)2 << 30)

/* Stage-1 score + pooled scratch per row batch: 256 MiB keeps a 1M-token
 * context under 30 GiB; struct sfw_backend_opts select_mb overrides it
 * (tests make it tiny to exercise the row batching). */
#define SELECT_BYTES_DEFAULT ((size_t)256 << 20)

static void cu_destroy(struct sfw_backend *be)
{
	struct cu_be *b = IMPL(be);
	sfw_cuda_sync(b->stream);
	sfwi_cu_prof_report(b);
	sfw_cuda_event_free(b->ev0);
	sfw_cuda_event_free(b->ev1);
	for (int i = 0; i < b->nslabs; i++)
		sfw_cuda_arena_release(&b->slab[i]);
	sfw_cuda_free(b->sel);
	sfw_cuda_free(b->seqtab);
	sfw_cuda_ctx_free(b->cx);
	sfw_cuda_stream_free(b->stream);
	sfw_free(b->stage);
	sfw_free(b->pend);
	sfw_free(b);
	sfw_free(be);
}

/* int8 weights (num/w8_layout.h): codes [rows, ceil(cols/4)*4] bytes, then
 * scales [rows, ceil(cols/group)] in their stored dtype, each in its own
 * slab piece; a merged group keeps its parts' codes and its parts' scales
 * back to back. */
static size_t w8_code_bytes(const struct sfw_bweight *w)
{
	return (size_t)w->rows * sfw_bweight_w8_code_row(w);
}

static size_t w8_scale_bytes(const struct sfw_bweight *w)
{
	return (size_t)w->rows * sfw_bweight_w8_scale_row(w);
}

/* Bytes of the weight's main tensor (the codes for int8). */
static size_t wbytes(const struct sfw_bweight *w)
{
	if (w->dtype == SFW_DTYPE_W8)
		return w8_code_bytes(w);
	return (size_t)w->rows * (size_t)w->cols * (w->dtype == SFW_DTYPE_BF16 ? 2 : 4);
}

/* What the weight takes in a slab (arena-rounded pieces). */
static size_t slab_bytes(const struct sfw_bweight *w)
{
	size_t n = sfw_cuda_arena_round(wbytes(w));
	if (w->dtype == SFW_DTYPE_W8)
		n += sfw_cuda_arena_round(w8_scale_bytes(w));
	return n;
}

static enum sfw_status place(struct cu_be *b, size_t n, int deferred, void **out, struct sfw_err *err);

/* After a weight's copies were issued: a copy from pageable memory returns
 * once the bytes are staged, so the map's pages are no longer needed (they
 * page in again from the file if the host reads them: AWQ's search does). */
static void host_done(const struct sfw_bweight *w)
{
	if (!w->host_mapped)
		return;
	sfw_map_release(w->host, wbytes(w));
	if (w->dtype == SFW_DTYPE_W8)
		sfw_map_release(w->scales, w8_scale_bytes(w));
}

/* Places and uploads one weight (int8: codes, then scales). */
static enum sfw_status place_one(struct cu_be *b, struct sfw_bweight *w, int deferred, struct sfw_err *err)
{
	void *p, *q = NULL;
	enum sfw_status s = place(b, wbytes(w), deferred, &p, err);
	if (s == SFW_OK && w->dtype == SFW_DTYPE_W8)
		s = place(b, w8_scale_bytes(w), deferred, &q, err);
	if (s != SFW_OK)
		return s;
	sfw_cuda_h2d(p, w->host, wbytes(w), b->stream);
	w->dev = p;
	if (q) {
		sfw_cuda_h2d(q, w->scales, w8_scale_bytes(w), b->stream);
		w->scales_dev = q;
	}
	host_done(w);
	return SFW_OK;
}

static enum sfw_status cu_weight_upload(struct sfw_backend *be, struct sfw_bweight *w, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	/* bf16, f32, or int8 with BF16 / F16 / F32 scales (kernels/linear_w8.cu) */
	if (w->dtype != SFW_DTYPE_BF16 && w->dtype != SFW_DTYPE_F32 &&
	    !(w->dtype == SFW_DTYPE_W8 && (w->scale_dtype == SFW_DTYPE_BF16 || w->scale_dtype == SFW_DTYPE_F16 ||
					w->scale_dtype == SFW_DTYPE_F32)))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "weight '%s': the cuda backend runs bf16, f32 or int8 weights only",
				w->name ? w->name : "?");
	if (b->defer && w->rows > 1) {
		/* placed by cu_merge or cu_load(end) */
		if (b->npend == b->pend_cap) {
			size_t nc = b->pend_cap ? 2 * b->pend_cap : 512;
			struct sfw_bweight **np = sfw_realloc(b->pend, nc * sizeof(*np));
			if (!np)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
			b->pend = np, b->pend_cap = nc;
		}
		b->pend[b->npend++] = w;
		w->dev = NULL;
		return SFW_OK;
	}
	return place_one(b, w, 0, err);
}

/* Bytes the deferred weights still to be placed take in a slab. */
static size_t pending_bytes(const struct cu_be *b)
{
	size_t sum = 0;
	for (size_t i = 0; i < b->npend; i++)
		if (b->pend[i])
			sum += slab_bytes(b->pend[i]);
	return sum;
}

/* Room for n bytes of weights in the slabs. deferred: n belongs to the
 * deferred weights (merge, load(end)), whose total is known, so a new slab
 * holds exactly all of them: no slack at the end of the last slab (2 GiB
 * slabs left up to ~2 GiB unused, the margin a 32 GB card needs at 1M). */
static enum sfw_status place(struct cu_be *b, size_t n, int deferred, void **out, struct sfw_err *err)
{
	void *p = b->nslabs ? sfw_cuda_arena_take(&b->slab[b->nslabs - 1], n) : NULL;
	if (!p) {
		if (b->nslabs == MAX_SLABS)
			return sfw_fail(err, SFW_E_NOMEM, "too many weight slabs");
		/* otherwise slabs double from SLAB_MIN to 2 GiB: a few allocations
		 * for a big model, little waste for a tiny one */
		size_t sz = b->nslabs ? b->slab[b->nslabs - 1].size * 2 : SLAB_MIN;
		if (sz > SLAB_MAX)
			sz = SLAB_MAX;
		if (sz < sfw_cuda_arena_round(n))
			sz = sfw_cuda_arena_round(n);
		enum sfw_status s = SFW_E_NOMEM;
		size_t exact = deferred ? pending_bytes(b) : 0;
		if (exact >= sfw_cuda_arena_round(n))
			s = sfw_cuda_arena_new(&b->slab[b->nslabs], exact, "the weights", err);
		if (s != SFW_OK) /* not deferred, or one exact slab is more than the device gives at once */
			s = sfw_cuda_arena_new(&b->slab[b->nslabs], sz, "the weights", err);
		if (s != SFW_OK)
			return s;
		b->nslabs++;
		p = sfw_cuda_arena_take(&b->slab[b->nslabs - 1], n);
		SFW_ASSERT(p != NULL);
	}
	*out = p;
	b->weight_bytes += n;
	if (b->weight_bytes >= b->next_report) {
		sfw_log(SFW_LOG_INFO, "cuda: uploaded %.2f GiB of weights", b->weight_bytes / 1073741824.0);
		b->next_report += (size_t)2 << 30;
	}
	return SFW_OK;
}


static int pending_index(const struct cu_be *b, const struct sfw_bweight *w)
{
	for (size_t i = b->npend; i-- > 0;) /* the parts were bound last */
		if (b->pend[i] == w)
			return (int)i;
	return -1;
}

/* One slab region for the group, each part's rows at its offset: the
 * separate weights are views into the merged one (no second copy). */
static enum sfw_status cu_merge(struct sfw_backend *be, struct sfw_bweight *const *parts, int n, int *merged,
				struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	*merged = 0;
	if (!b->defer || n < 2)
		return SFW_OK;
	size_t total = 0, stotal = 0;
	int w8 = parts[0]->dtype == SFW_DTYPE_W8;
	for (int i = 0; i < n; i++) {
		const struct sfw_bweight *w = parts[i];
		/* keep every part on the arena's alignment (16-byte loads); int8
		 * parts merge codes with codes and scales with scales, so they must
		 * agree on the group and the scale dtype */
		if ((w->dtype != SFW_DTYPE_BF16 && !w8) || w->dtype != parts[0]->dtype || w->cols != parts[0]->cols ||
		    wbytes(w) % 256 != 0 || pending_index(b, w) < 0)
			return SFW_OK;
		if (w8 && (w->group != parts[0]->group || w->scale_dtype != parts[0]->scale_dtype))
			return SFW_OK;
		total += wbytes(w);
		stotal += w8 ? w8_scale_bytes(w) : 0;
	}
	void *p, *q = NULL;
	enum sfw_status s = place(b, total, 1, &p, err);
	if (s == SFW_OK && w8)
		s = place(b, stotal, 1, &q, err);
	if (s != SFW_OK)
		return s;
	size_t off = 0, soff = 0;
	for (int i = 0; i < n; i++) {
		struct sfw_bweight *w = parts[i];
		sfw_cuda_h2d((char *)p + off, w->host, wbytes(w), b->stream);
		w->dev = (char *)p + off;
		off += wbytes(w);
		if (w8) {
			sfw_cuda_h2d((char *)q + soff, w->scales, w8_scale_bytes(w), b->stream);
			w->scales_dev = (char *)q + soff;
			soff += w8_scale_bytes(w);
		}
		host_done(w);
		b->pend[pending_index(b, w)] = NULL;
	}
	*merged = 1;
	return SFW_OK;
}

/* begin: weight uploads are deferred (cu_merge may place them as one
 * matrix); end: whatever is still deferred is placed. */
static enum sfw_status cu_load(struct sfw_backend *be, int end, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	if (!end) {
		b->defer = 1;
		return SFW_OK;
	}
	enum sfw_status s = SFW_OK;
	for (size_t i = 0; i < b->npend && s == SFW_OK; i++) {
		struct sfw_bweight *w = b->pend[i];
		if (!w)
			continue;
		if ((s = place_one(b, w, 1, err)) == SFW_OK)
			b->pend[i] = NULL; /* placed: no longer pending for the slab plan */
	}
	b->defer = 0;
	b->npend = 0;
	sfw_cuda_sync(b->stream);
	return s;
}

static void *cu_alloc(struct sfw_backend *be, size_t bytes)
{
	(void)be;
	void *p;
	struct sfw_err e;
	if (sfw_cuda_malloc(&p, bytes ? bytes : 16, "activations", &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "%s", e.msg);
		return NULL;
	}
	return p;
}

static void cu_free(struct sfw_backend *be, void *p)
{
	sfw_cuda_sync(IMPL(be)->stream);
	sfw_cuda_free(p);
}

static uint16_t *stage(struct cu_be *b, size_t n)
{
	if (n > b->stage_n) {
		uint16_t *p = sfw_realloc(b->stage, n * 2);
		SFW_ASSERT(p != NULL); /* host staging of one activation buffer */
		b->stage = p;
		b->stage_n = n;
	}
	return b->stage;
}

static void cu_to_host_f32(struct sfw_backend *be, float *dst, const void *src, size_t off, size_t n)
{
	struct cu_be *b = IMPL(be);
	uint16_t *h = stage(b, n);
	sfw_cuda_d2h(h, (const uint16_t *)src + off, n * 2, b->stream);
	sfw_cuda_sync(b->stream);
	for (size_t i = 0; i < n; i++)
		dst[i] = sfw_bf16_to_f32(h[i]);
}

static void cu_from_host_f32(struct sfw_backend *be, void *dst, const float *src, size_t n)
{
	struct cu_be *b = IMPL(be);
	uint16_t *h = stage(b, n);
	sfw_cuda_sync(b->stream); /* the staging buffer may still feed a copy */
	for (size_t i = 0; i < n; i++)
		h[i] = sfw_f32_to_bf16(src[i]);
	sfw_cuda_h2d(dst, h, n * 2, b->stream);
	sfw_cuda_sync(b->stream);
}

static void cu_to_host(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_be *b = IMPL(be);
	sfw_cuda_d2h(dst, src, bytes, b->stream);
	sfw_cuda_sync(b->stream);
}

static void cu_from_host(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_be *b = IMPL(be);
	/* Callers pass pageable memory (token ids, slopes): the runtime stages a
	 * pageable source before the call returns, so it is reusable at once
	 * without a host wait (one fewer per decode step). */
	sfw_cuda_h2d(dst, src, bytes, b->stream);
}

static void cu_copy(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	sfw_cuda_d2d(dst, src, bytes, IMPL(be)->stream);
}

static void cu_transfer(struct sfw_backend *be, enum sfw_xfer k, void *dst, const void *src, size_t n)
{
	/* a replayed step's copies are in its recording (capture_cuda.c); the
	 * host crosses no bytes inside a step */
	SFW_ASSERT(!IMPL(be)->skip || k == SFW_XFER_COPY);
	if (IMPL(be)->skip)
		return;
	switch (k) {
	case SFW_XFER_TO_HOST:
		cu_to_host(be, dst, src, n);
		break;
	case SFW_XFER_FROM_HOST:
		cu_from_host(be, dst, src, n);
		break;
	case SFW_XFER_COPY:
		cu_copy(be, dst, src, n);
		break;
	case SFW_XFER_TO_HOST_F32:
		cu_to_host_f32(be, dst, src, 0, n);
		break;
	case SFW_XFER_FROM_HOST_F32:
		cu_from_host_f32(be, dst, src, n);
		break;
	}
}

/* The CUDA ops report no failure they could not return (asynchronous
 * faults abort in kernels/). */
static enum sfw_status cu_sync(struct sfw_backend *be, int wait, struct sfw_err *err)
{
	(void)err;
	if (wait)
		sfw_cuda_sync(IMPL(be)->stream);
	return SFW_OK;
}

void sfwi_cu_prof_report(struct cu_be *b)
{
	static const char *const phase[2] = {"prefill (calls of more than 64 rows)",
					     "decode steps (calls of at most 64 rows: one, or one per sequence)"};
	for (int ph = 0; b->prof && ph < 2; ph++) {
		double tot = 0;
		for (int i = 0; i < PROF_N; i++)
			tot += b->prof_ms[ph][i];
		if (tot <= 0)
			continue;
		fprintf(stderr, "cuda profile, %s (device time per op; the host waits for each op):\n", phase[ph]);
		for (int i = 0; i < PROF_N; i++)
			if (b->prof_calls[ph][i])
				fprintf(stderr, "  %-24s %10.2f ms %5.1f%%  %8ld calls  %9.1f us/call\n", prof_name[i],
					b->prof_ms[ph][i], 100 * b->prof_ms[ph][i] / tot, b->prof_calls[ph][i],
					1e3 * b->prof_ms[ph][i] / b->prof_calls[ph][i]);
		fprintf(stderr, "  %-24s %10.2f ms\n", "total", tot);
	}
	memset(b->prof_ms, 0, sizeof(b->prof_ms));
	memset(b->prof_calls, 0, sizeof(b->prof_calls));
}

/* bf16/f32 weights everywhere, int8 in the products; paged KV; cache
 * copies. */
static int cu_supports_op(const struct sfw_backend *be, enum sfw_opk op, enum sfw_dtype dt)
{
	(void)be;
	if (op == SFW_OP_POOL || op == SFW_OP_CACHE_COPY)
		return 1;
	return sfwi_weight_dtype_ok(op, dt);
}

/* The CUDA backend's table: every member (backend.h); impl is the device
 * state, set per instance, and the options choose paths inside the members. */
static const struct sfw_backend cuda_backend = {
	.name = "cuda",
	.act = SFW_DTYPE_BF16,
	.destroy = cu_destroy,
	.alloc = cu_alloc,
	.free = cu_free,
	.transfer = cu_transfer,
	.sync = cu_sync,
	.weight_upload = cu_weight_upload,
	.merge = cu_merge,
	.load = cu_load,
	.supports_op = cu_supports_op,
};

enum sfw_status sfw_backend_cuda_new(const struct sfw_backend_opts *o, struct sfw_backend **out,
				     struct sfw_err *err)
{
	int dev = o->cuda_device;
	*out = NULL;
	struct sfw_backend *be = sfw_calloc(1, sizeof(*be));
	struct cu_be *b = sfw_calloc(1, sizeof(*b));
	if (!be || !b) {
		sfw_free(be), sfw_free(b);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	enum sfw_status s = sfw_cuda_init(dev, &b->info, err);
	if (s == SFW_OK)
		s = sfw_cuda_stream_new(&b->stream, err);
	if (s == SFW_OK)
		s = sfw_cuda_ctx_new(b->stream, &b->cx, err);
	if (s == SFW_OK)
		s = sfw_cuda_malloc(&b->seqtab, SFWI_CU_SEQTAB_BYTES, "the step tables", err);
	if (s != SFW_OK) {
		sfw_cuda_ctx_free(b->cx);
		sfw_cuda_stream_free(b->stream);
		sfw_free(be), sfw_free(b);
		return s;
	}
	b->cx->fixed = 1; /* recorded steps point into the scratch */
	if (o->profile) {
		b->prof = 1;
		b->ev0 = sfw_cuda_event_new();
		b->ev1 = sfw_cuda_event_new();
	}
	b->next_report = (size_t)2 << 30;
	b->select_bytes = o->select_mb > 0 ? (size_t)o->select_mb << 20 : SELECT_BYTES_DEFAULT;
	b->cx->attn = o->attn;
	b->cx->stage1 = o->stage1;
	b->cx->w8gemv = o->w8gemv;
	b->cx->sms = b->info.sm_count;
	sfw_log(SFW_LOG_INFO, "cuda: %s (sm_%d%d, %d SMs), %.1f GiB free of %.1f GiB", b->info.name, b->info.cc_major,
		b->info.cc_minor, b->info.sm_count, b->info.free_mem / 1073741824.0, b->info.total_mem / 1073741824.0);
	*be = cuda_backend;
	be->impl = b;
	sfwi_cu_caches(be);
	sfwi_cu_ops(be);
	sfwi_cu_capture(be);
	/* graphs record, they do not time ops: none while profiling */
	b->graphs = !o->no_graph && !b->prof;
	*out = be;
	return SFW_OK;
}
