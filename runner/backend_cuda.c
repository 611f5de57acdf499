/* backend_cuda.c - the CUDA instance of struct sfw_backend (CUDA=1 builds):
 * bf16 activations in device memory, rounded where the reference rounds;
 * weights uploaded tensor by tensor from the map into a few large device
 * slabs (no per-tensor cudaMalloc); caches in device memory, the sparse KV
 * cache growing in whole 64-token blocks (exactly the reserved length when
 * the context is reserved up front), lightning states fp32 updated in place.
 * A batch's caches may instead be paged (pool_new): their K/V blocks come
 * from one pool allocated up front, found through a block table per cache
 * that the attention, compression and K/V append kernels read
 * (kernels/ops_cuda.h, struct sfw_cuda_pages).
 * Every op runs on the backend's one stream; the host waits only in to_host
 * and sync. CUDA runtime calls live in kernels/ (ops_cuda.h), so this file is
 * plain C. */
#include "runner/backend.h"
#include "alloc.h"
#include "file.h"
#include "kernels/ops_cuda.h"
#include "log.h"
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLAB_MIN ((size_t)4 << 20)
#define SLAB_MAX ((size_t)2 << 30)
#define MAX_SLABS 256
/* Stage-1 score + pooled scratch per row batch: 256 MiB keeps a 1M-token
 * context under 30 GiB; struct sfw_backend_opts select_mb overrides it
 * (tests make it tiny to exercise the row batching). */
#define SELECT_BYTES_DEFAULT ((size_t)256 << 20)

enum prof_op {
	P_EMBED, P_RMSNORM, P_ADD, P_SILU, P_SIGMOID, P_ROPE, P_MATMUL_DEC, P_MATMUL_PRE, P_LOGITS, P_KV, P_DENSE,
	P_COMPRESS, P_SELECT, P_SPARSE, P_GLA_REC, P_GLA_CHUNK, P_ADDNORM, P_SAMPLE, P_QKNORM, P_NORMGATE,
	PROF_N
};
static const char *const prof_name[PROF_N] = {
	"embed", "rmsnorm", "add_scaled", "silu_mul", "sigmoid_mul", "rope", "matmul M<=8 (GEMV)",
	"matmul M>8 (cuBLASLt)", "logits", "kv_append", "attn_dense", "compress", "sparse_select",
	"attn_sparse", "gla recurrent", "gla chunked", "add_rmsnorm (fused)", "sample", "qk_norm_rope (fused)",
	"rmsnorm_gate (fused)"};

struct cu_be {
	void *stream;
	struct sfw_cuda_blas *blas;
	void *scratch;
	size_t scratch_bytes;
	struct sfw_cuda_arena slab[MAX_SLABS];
	int nslabs;
	size_t weight_bytes, next_report;
	struct sfw_cuda_info info;
	/* host staging for to_host_f32 / from_host_f32 */
	uint16_t *stage;
	size_t stage_n;
	/* block-selection scratch (device): scores, pooled, top-k of one row batch */
	void *sel;
	size_t sel_bytes;
	/* SALAFW_CUDA_PROFILE=1: device time per op, from events around each op
	 * (the host waits for each op, so this slows the run; the device times
	 * themselves stay right) */
	int prof;
	void *ev0, *ev1;
	int prof_decode; /* the ops since the last embed serve at most 64 rows: a (batched) decode step */
	double prof_ms[2][PROF_N];
	long prof_calls[2][PROF_N];
	/* SALAFW_CUDA_STEPSYNC=1: the old per-step host waits (from_host waits,
	 * no device-side copy of the selected blocks) */
	int stepsync;
	size_t select_bytes;          /* block-selection scratch cap */
	struct sfw_cuda_ops_cfg cfg;  /* bound with blas and scratch before every op */
	/* the paths the options chose (struct sfw_backend_opts) */
	int graphs, no_fuse, no_merge, no_sample, w8_silu, no_seqs;
	/* recording a decode step (cu_step): the ops that take a position read
	 * it from rec_pos, and the sparse-layer ops plan for cache lengths up
	 * to rec_bound */
	int rec;
	const int64_t *rec_pos;
	int64_t rec_bound;
	/* recording a step of many sequences (cu_bstep): the *_seqs ops launch
	 * over rec_rows rows (a batch-size bucket) that read their sequences
	 * from rec_tab (device, written before each replay), plan for lengths
	 * up to rec_bound, and leave the host's counters alone (cache_advance
	 * after the replay) */
	int rec_seqs, rec_rows, rec_fail; /* rec_fail: an op had to use host positions */
	const struct sfw_cuda_steptab *rec_tab;
	void *const *rec_ptr; /* [n_layers][SFW_CUDA_LN][rec_rows] (sfw_cuda_seqs.sp) */
	/* ... and its sequences as the host sees them: a sequence in selection
	 * mode runs its own selection ops, reading its position from rec_tab */
	struct sfw_bcache *const *rec_caches;
	int rec_n;
	uint64_t cache_serial; /* the last cache's serial (struct sfw_bcache) */
	/* bumped when the caches or the selection scratch move */
	uint64_t epoch;
	int64_t recordings; /* decode steps recorded (tests) */
	int64_t seqs_replays; /* steps of several sequences replayed (tests) */
	/* weight uploads deferred between load_begin and load_end (merging) */
	int defer;
	struct sfw_bweight **pend;
	size_t npend, pend_cap;
};

struct cu_layer {
	int sparse;
	void *k, *v;   /* bf16 [cap, nkv, hd] */
	void *c1, *c2; /* bf16 [cap1, nkv, hd], [cap2, nkv, hd] */
	int64_t len, cap, n1, n2, cap1, cap2;
	float *state;  /* lightning: fp32 [lnh, lhd, lhd] */
};

struct sfw_bcache {
	struct sfw_cache_desc d;
	struct cu_layer *L;
	/* paged (d.pool != NULL): every sparse layer's k, v are the pool's
	 * arrays of that layer, pg.tab the device copy of table[0..maxblk)
	 * (entries [0, nblk) are the blocks taken); cap = nblk blocks. The
	 * compressed keys are allocated for maxblk blocks at once, so they never
	 * move (a recorded step stays valid as the cache grows). pg.tab NULL:
	 * contiguous caches of their own. */
	struct sfw_cuda_pages pg;
	int32_t *table;
	int64_t nblk, maxblk;
	uint64_t serial; /* unique in the backend: names the cache in a recording's key */
};

/* The paged KV pool: per sparse layer si, K then V of `nblocks` blocks
 * (block b of layer si's K at mem + ((si * 2) * nblocks + b) * bb). */
struct sfw_bpool {
	void *mem;
	size_t bb; /* bytes of one block of one layer's K (or V) */
	int nsparse, shift;
	int64_t nblocks, nfree;
	int32_t *free; /* stack of free block ids */
};

static void prof_report(struct cu_be *b);

static struct cu_be *IMPL(struct sfw_backend *be)
{
	return (struct cu_be *)be->impl;
}

static void cu_destroy(struct sfw_backend *be)
{
	struct cu_be *b = IMPL(be);
	sfw_cuda_sync(b->stream);
	prof_report(b);
	sfw_cuda_event_free(b->ev0);
	sfw_cuda_event_free(b->ev1);
	sfw_cuda_ops_bind(NULL, NULL, 0);
	for (int i = 0; i < b->nslabs; i++)
		sfw_cuda_arena_release(&b->slab[i]);
	sfw_cuda_free(b->scratch);
	sfw_cuda_free(b->sel);
	sfw_cuda_blas_free(b->blas);
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
		/* placed by cu_merge or cu_load_end */
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
 * deferred weights (merge, load_end), whose total is known, so a new slab
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

static void cu_load_begin(struct sfw_backend *be)
{
	IMPL(be)->defer = !IMPL(be)->no_merge;
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
	if (b->no_merge) /* SALAFW_CUDA_NOMERGE=1: the parts stay separate */
		return SFW_OK;
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

static enum sfw_status cu_load_end(struct sfw_backend *be, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
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

static void cu_weight_release(struct sfw_backend *be, struct sfw_bweight *w)
{
	(void)be;
	w->dev = NULL; /* the slabs go with the backend */
	w->scales_dev = NULL;
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
	if (b->stepsync)
		sfw_cuda_sync(b->stream);
}

static void cu_copy(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	sfw_cuda_d2d(dst, src, bytes, IMPL(be)->stream);
}

static void cu_sync(struct sfw_backend *be)
{
	sfw_cuda_sync(IMPL(be)->stream);
}

/* ---- ops ---- */

/* The stream of an op, after binding this backend's cuBLASLt handle, scratch
 * and choices to the calling thread (kernels/ops_cuda.h): every op passes
 * through here, so two backends in one process never use each other's. */
static void *cu_stream(struct sfw_backend *be)
{
	struct cu_be *b = IMPL(be);
	sfw_cuda_ops_bind(b->blas, b->scratch, b->scratch_bytes);
	sfw_cuda_ops_set_cfg(&b->cfg);
	return b->stream;
}
#define S(be) cu_stream(be)

static void prof_begin(struct sfw_backend *be)
{
	struct cu_be *b = IMPL(be);
	if (b->prof)
		sfw_cuda_event_record(b->ev0, b->stream);
}

static void prof_end(struct sfw_backend *be, enum prof_op op)
{
	struct cu_be *b = IMPL(be);
	if (!b->prof)
		return;
	sfw_cuda_event_record(b->ev1, b->stream);
	b->prof_ms[b->prof_decode][op] += sfw_cuda_event_ms(b->ev0, b->ev1);
	b->prof_calls[b->prof_decode][op]++;
}

static void prof_report(struct cu_be *b)
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

#define PROF(op, stmt)                                                                                    \
	do {                                                                                              \
		prof_begin(be);                                                                           \
		stmt;                                                                                     \
		prof_end(be, op);                                                                         \
	} while (0)

static void cu_embed(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids, int T,
		     float scale)
{
	IMPL(be)->prof_decode = T <= SFW_CUDA_SEQS_MAX; /* a decode step: one row, or one per sequence */
	PROF(P_EMBED, sfw_op_embed_cuda(x, E->dev, E->dtype, ids, T, (int)E->cols, scale, SFW_DTYPE_BF16, S(be)));
}

static void cu_rmsnorm(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int rows, int n,
		       float eps)
{
	PROF(P_RMSNORM, sfw_op_rmsnorm_cuda(y, x, w->dev, w->dtype, rows, n, eps, SFW_DTYPE_BF16, S(be)));
}

static void cu_add_scaled(struct sfw_backend *be, void *x, const void *b, size_t n, float scale)
{
	PROF(P_ADD, sfw_op_add_scaled_cuda(x, b, n, scale, SFW_DTYPE_BF16, S(be)));
}

/* SALAFW_CUDA_NOFUSE=1: add_scaled + rmsnorm as two kernels */
static void cu_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			   const struct sfw_bweight *w, int rows, int n, float eps)
{
	if (IMPL(be)->no_fuse)
		sfwi_compose_add_rmsnorm(be, y, x, b, scale, w, rows, n, eps);
	else
		PROF(P_ADDNORM,
		     sfw_op_add_rmsnorm_cuda(y, x, b, scale, w->dev, w->dtype, rows, n, eps, SFW_DTYPE_BF16, S(be)));
}

/* SALAFW_CUDA_NOFUSE=1: rmsnorm + sigmoid_mul as two kernels */
static void cu_rmsnorm_gate(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w,
			    const void *z, int rows, int n, float eps)
{
	if (IMPL(be)->no_fuse)
		sfwi_compose_rmsnorm_gate(be, y, x, w, z, rows, n, eps);
	else
		PROF(P_NORMGATE,
		     sfw_op_rmsnorm_gate_cuda(y, x, w->dev, w->dtype, z, rows, n, eps, SFW_DTYPE_BF16, S(be)));
}

/* One kernel when both norms are there (the position from the device while
 * recording); else, or with SALAFW_CUDA_NOFUSE=1, the four calls. */
static void cu_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			    const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			    int64_t pos0, float theta)
{
	struct cu_be *b = IMPL(be);
	if (b->no_fuse || !qw || !kw) {
		sfwi_compose_qk_norm_rope(be, q, k, qw, kw, T, nhq, nhk, hd, eps, rope, pos0, theta);
		return;
	}
	PROF(P_QKNORM, sfw_cuda_qk_norm_rope_devpos(q, k, qw->dev, qw->dtype, kw->dev, kw->dtype, T, nhq, nhk, hd, eps,
						    rope, pos0, b->rec ? b->rec_pos : NULL, theta, SFW_DTYPE_BF16,
						    S(be)));
}

static enum sfw_status sel_room(struct sfw_backend *be, size_t bytes, struct sfw_err *err);
static int64_t nchunks(int64_t len, int ksize, int stride);

/* Selection scratch of one recorded decode row at cache lengths up to bound:
 * scores [nkv, n1], pooled [nkv, nblocks], and the sizes of the first two. */
static size_t sel_plan_row(const struct sfw_cache_desc *d, int64_t bound, int k, size_t *sc, size_t *po)
{
	int64_t n1 = nchunks(bound, d->ksize, d->stride), nb = (bound + d->block - 1) / d->block;
	*sc = sfw_cuda_arena_round((size_t)d->nkv * (size_t)(n1 ? n1 : 1) * 4);
	*po = sfw_cuda_arena_round((size_t)d->nkv * (size_t)nb * 4);
	return *sc + *po + (size_t)d->nkv * k * 4;
}

static int64_t cu_cache_room(const struct sfw_bcache *c);

/* Starts recording one decode step of c whose position the ops read from
 * pos (device) when they run, for cache lengths up to bound. */
static enum sfw_status rec_begin(struct sfw_backend *be, struct sfw_bcache *c, const int64_t *pos, int64_t bound,
				 struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	int any_sparse = 0;
	for (int i = 0; i < c->d.n_layers; i++)
		any_sparse |= c->L[i].sparse;
	if (any_sparse) {
		/* everything a recorded step touches is in place before the
		 * recording starts: no allocation (and no host wait) inside it */
		size_t sc, po;
		if (bound < 1 || bound > cu_cache_room(c))
			return sfw_fail(err, SFW_E_INVAL, "decode graph bound %lld outside the cache room",
					(long long)bound);
		enum sfw_status s = sel_room(be, sel_plan_row(&c->d, bound, c->d.sel_k, &sc, &po), err);
		if (s != SFW_OK)
			return s;
	}
	b->rec = 1, b->rec_pos = pos, b->rec_bound = bound;
	sfw_cuda_graph_begin(S(be));
	return SFW_OK;
}

static void *rec_end(struct sfw_backend *be)
{
	void *g = NULL;
	struct sfw_err e = {0};
	IMPL(be)->rec = 0;
	if (sfw_cuda_graph_end(S(be), &g, &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "cuda: %s; decoding without graphs", e.msg);
		return NULL;
	}
	return g;
}

/* SALAFW_CUDA_NOSAMPLE=1: the host chooses */
static int cu_sample(struct sfw_backend *be, int32_t *out, const float *logits, int V, int n,
		     const struct sfw_op_sample_params *const *p, const double *u)
{
	if (IMPL(be)->no_sample)
		return 0;
	PROF(P_SAMPLE, sfw_cuda_sample_rows(out, logits, V, n, p, u, S(be)));
	return 1;
}

static void cu_silu_mul(struct sfw_backend *be, void *y, const void *g, const void *u, size_t n)
{
	PROF(P_SILU, sfw_op_silu_mul_cuda(y, g, u, n, SFW_DTYPE_BF16, S(be)));
}

static void cu_sigmoid_mul(struct sfw_backend *be, void *y, const void *x, const void *g, size_t n)
{
	PROF(P_SIGMOID, sfw_op_sigmoid_mul_cuda(y, x, g, n, SFW_DTYPE_BF16, S(be)));
}

/* While recording, the position comes from the device (the replayed step's). */
static void cu_rope(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0, float theta)
{
	struct cu_be *b = IMPL(be);
	if (b->rec)
		PROF(P_ROPE, sfw_cuda_rope_neox_devpos(x, T, nh, hd, b->rec_pos, theta, S(be)));
	else
		PROF(P_ROPE, sfw_op_rope_neox_cuda(x, T, nh, hd, pos0, theta, SFW_DTYPE_BF16, S(be)));
}

static void cu_matmul(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M)
{
	if (w->dtype == SFW_DTYPE_W8)
		PROF(M <= SFW_CUDA_GEMV_MAX_M ? P_MATMUL_DEC : P_MATMUL_PRE,
		     sfw_op_matmul_w8_cuda(y, x, w->dev, w->scales_dev, w->scale_dtype, w->group, M, (int)w->rows,
					   (int)w->cols, SFW_DTYPE_BF16, S(be)));
	else
		PROF(M <= SFW_CUDA_GEMV_MAX_M ? P_MATMUL_DEC : P_MATMUL_PRE,
		     sfw_op_matmul_cuda(y, x, w->dev, w->dtype, M, (int)w->rows, (int)w->cols, SFW_DTYPE_BF16, S(be)));
}

/* One row over a merged group: one GEMV over the merged matrix
 * (docs/performance.md §5.7), whose output row is the parts' side by side. */
static void cu_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M)
{
	if (M == 1 && g->merged.rows)
		cu_matmul(be, y, x, &g->merged, 1);
	else
		sfwi_compose_matmul_group(be, y, x, g, M);
}

/* One row over a merged gate|up: one GEMV, then silu_mul; int8 weights take
 * a GEMV with the SwiGLU in its epilogue, one launch less per layer and
 * bit-equal to the GEMV and silu_mul it replaces (opts.no_w8_silu,
 * SALAFW_CUDA_W8_SILU=0 in the CLI, brings the pair back: decode 284.6 vs
 * 281.5 tok/s in bench/RESULTS.md). */
static void cu_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu, int M)
{
	const struct sfw_bweight *w = &gu->merged;
	int N = (int)gu->part[0]->rows;
	if (M != 1 || !w->rows) {
		sfwi_compose_swiglu(be, y, tmp, x, gu, M);
		return;
	}
	int done = 0;
	if (IMPL(be)->w8_silu && w->dtype == SFW_DTYPE_W8 && w->rows == (int64_t)2 * N)
		PROF(P_MATMUL_DEC, done = sfw_op_matmul_silu_w8_cuda(y, x, w->dev, w->scales_dev, w->scale_dtype,
								     w->group, N, (int)w->cols, S(be)));
	if (!done) {
		cu_matmul(be, tmp, x, w, 1);
		cu_silu_mul(be, y, tmp, (char *)tmp + (size_t)N * 2, (size_t)N);
	}
}

static void cu_logits(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
		      float in_scale)
{
	if (w->dtype == SFW_DTYPE_W8)
		PROF(P_LOGITS, sfw_op_logits_w8_cuda(y, x, w->dev, w->scales_dev, w->scale_dtype, w->group, M,
						     (int)w->rows, (int)w->cols, in_scale, SFW_DTYPE_BF16, S(be)));
	else
		PROF(P_LOGITS, sfw_op_logits_cuda(y, x, w->dev, w->dtype, M, (int)w->rows, (int)w->cols, in_scale,
						  SFW_DTYPE_BF16, S(be)));
}

/* ---- caches ---- */

static void layer_free(struct cu_layer *l)
{
	sfw_cuda_free(l->k), sfw_cuda_free(l->v), sfw_cuda_free(l->c1), sfw_cuda_free(l->c2);
	sfw_cuda_free(l->state);
	memset(l, 0, sizeof(*l));
}

/* Every block the paged cache holds back to its pool (ordered on the one
 * stream: a block's next owner writes after this owner's last reads). */
static void pages_release(struct sfw_bcache *c)
{
	struct sfw_bpool *p = c->d.pool;
	while (c->nblk > 0)
		p->free[p->nfree++] = c->table[--c->nblk];
	for (int i = 0; i < c->d.n_layers; i++)
		if (c->L[i].sparse)
			c->L[i].cap = 0;
}

static void cu_cache_free(struct sfw_backend *be, struct sfw_bcache *c)
{
	if (!c)
		return;
	sfw_cuda_sync(S(be));
	prof_report(IMPL(be)); /* one report per context (a bench run) */
	if (c->table)
		pages_release(c);
	if (c->L)
		for (int i = 0; i < c->d.n_layers; i++) {
			if (c->table) /* the pool's, not this cache's */
				c->L[i].k = c->L[i].v = NULL;
			layer_free(&c->L[i]);
		}
	sfw_cuda_free((void *)c->pg.tab);
	sfw_free(c->table);
	sfw_free(c->L);
	sfw_free(c);
}

/* A paged cache: the pool's arrays, a block table for max_tokens, and the
 * compressed keys for max_tokens. */
static enum sfw_status cache_pages_new(struct sfw_bcache *c, struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &c->d;
	struct sfw_bpool *p = d->pool;
	if (d->max_tokens < 1 || d->block != 1 << p->shift)
		return sfw_fail(err, SFW_E_INVAL, "a paged KV cache needs a context length and the pool's block size");
	c->maxblk = (d->max_tokens + d->block - 1) / d->block;
	size_t tb = (size_t)c->maxblk * sizeof(int32_t);
	if (!(c->table = sfw_malloc(tb)))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a block table");
	void *tab;
	enum sfw_status s = sfw_cuda_malloc(&tab, tb, "a KV block table", err);
	if (s != SFW_OK)
		return s;
	c->pg.tab = tab, c->pg.shift = p->shift;
	size_t row = (size_t)d->nkv * d->hd * 2;
	int64_t cap = c->maxblk * d->block, cap1 = cap / d->stride + 1, cap2 = cap / (4 * d->stride) + 1;
	int si = 0;
	for (int i = 0; i < d->n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		if (!l->sparse)
			continue;
		l->k = (char *)p->mem + (size_t)si * 2 * (size_t)p->nblocks * p->bb;
		l->v = (char *)l->k + (size_t)p->nblocks * p->bb;
		si++;
		if ((s = sfw_cuda_malloc(&l->c1, (size_t)cap1 * row, "the compressed keys", err)) != SFW_OK ||
		    (s = sfw_cuda_malloc(&l->c2, (size_t)cap2 * row, "the compressed keys", err)) != SFW_OK)
			return s;
		l->cap1 = cap1, l->cap2 = cap2;
	}
	return SFW_OK;
}

static enum sfw_status cu_cache_new(struct sfw_backend *be, const struct sfw_cache_desc *d, struct sfw_bcache **out,
				    struct sfw_err *err)
{
	/* The attention, stage-1 and GLA kernels are instantiated for these head
	 * sizes only; refuse others here rather than abort inside a launch. */
	for (int k = 0; k < 2; k++) {
		int hd = k ? d->lhd : d->hd;
		if (hd != 32 && hd != 64 && hd != 128)
			return sfw_fail(err, SFW_E_UNSUPPORTED,
					"%s head_dim %d is not supported by the cuda backend (32, 64 or 128; use --device cpu)",
					k ? "lightning" : "sparse-layer", hd);
	}
	struct sfw_bcache *c = sfw_calloc(1, sizeof(*c));
	if (!c || !(c->L = sfw_calloc((size_t)d->n_layers, sizeof(*c->L)))) {
		sfw_free(c);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the context caches");
	}
	c->d = *d;
	c->d.mixer = NULL;
	c->serial = ++IMPL(be)->cache_serial;
	size_t sbytes = (size_t)d->lnh * d->lhd * d->lhd * sizeof(float);
	for (int i = 0; i < d->n_layers; i++) {
		c->L[i].sparse = d->mixer[i] == SFW_MIXER_SPARSE;
		if (!c->L[i].sparse) {
			enum sfw_status s = sfw_cuda_malloc((void **)&c->L[i].state, sbytes, "the lightning states", err);
			if (s != SFW_OK) {
				cu_cache_free(be, c);
				return s;
			}
			sfw_cuda_memset(c->L[i].state, 0, sbytes, S(be));
		}
	}
	if (d->pool) {
		enum sfw_status s = cache_pages_new(c, err);
		if (s != SFW_OK) {
			cu_cache_free(be, c);
			return s;
		}
	}
	*out = c;
	return SFW_OK;
}

/* Moves buffer *p of `old` bytes into a new one of `n` bytes. */
static enum sfw_status regrow(struct sfw_backend *be, void **p, size_t old, size_t n, const char *what,
			      struct sfw_err *err)
{
	void *q;
	enum sfw_status s = sfw_cuda_malloc(&q, n, what, err);
	if (s != SFW_OK)
		return s;
	if (*p && old)
		sfw_cuda_d2d(q, *p, old, S(be));
	sfw_cuda_sync(S(be));
	sfw_cuda_free(*p);
	*p = q;
	IMPL(be)->epoch++; /* here, not after the whole regrowth: a later one may fail */
	return SFW_OK;
}

/* Paged: blocks for `tokens` tokens, all of them or none; the new table
 * entries to the device, ordered before the ops that read them. */
static enum sfw_status pages_reserve(struct sfw_backend *be, struct sfw_bcache *c, int64_t tokens,
				     struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &c->d;
	struct sfw_bpool *p = d->pool;
	int64_t need = (tokens + d->block - 1) / d->block, had = c->nblk;
	if (need > c->maxblk)
		return sfw_fail(err, SFW_E_RANGE, "a paged KV cache holds at most %lld tokens, not %lld",
				(long long)d->max_tokens, (long long)tokens);
	if (need <= had)
		return SFW_OK;
	if (p->nfree < need - had)
		return sfw_fail(err, SFW_E_NOSPACE, "KV pool full: %lld of %lld blocks in use",
				(long long)(p->nblocks - p->nfree), (long long)p->nblocks);
	for (; c->nblk < need; c->nblk++)
		c->table[c->nblk] = p->free[--p->nfree];
	sfw_cuda_h2d((int32_t *)c->pg.tab + had, c->table + had, (size_t)(need - had) * sizeof(int32_t), S(be));
	for (int i = 0; i < d->n_layers; i++)
		if (c->L[i].sparse)
			c->L[i].cap = need * d->block;
	return SFW_OK;
}

static enum sfw_status cu_cache_reserve(struct sfw_backend *be, struct sfw_bcache *c, int64_t tokens,
					struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &c->d;
	if (c->table)
		return pages_reserve(be, c, tokens, err);
	size_t row = (size_t)d->nkv * d->hd * 2;
	int64_t need = (tokens + d->block - 1) / d->block * d->block;
	int grown = 0;
	for (int i = 0; i < d->n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		if (!l->sparse || need <= l->cap)
			continue;
		/* a cache that grows during generation grows by a quarter at a time
		 * (every growth copies it); a reservation is taken exactly */
		int64_t cap = l->cap ? l->cap + l->cap / 4 : need;
		if (d->max_tokens > 0 && cap > d->max_tokens) /* a batch's sequence: never past its context */
			cap = d->max_tokens;
		if (cap < need)
			cap = need;
		cap = (cap + d->block - 1) / d->block * d->block;
		int64_t cap1 = cap / d->stride + 1, cap2 = cap / (4 * d->stride) + 1;
		enum sfw_status s;
		if ((s = regrow(be, &l->k, (size_t)l->len * row, (size_t)cap * row, "the KV cache", err)) ||
		    (s = regrow(be, &l->v, (size_t)l->len * row, (size_t)cap * row, "the KV cache", err)) ||
		    (s = regrow(be, &l->c1, (size_t)l->n1 * row, (size_t)cap1 * row, "the compressed keys", err)) ||
		    (s = regrow(be, &l->c2, (size_t)l->n2 * row, (size_t)cap2 * row, "the compressed keys", err)))
			return sfw_err_prefix(err, "KV cache for %lld tokens", (long long)tokens);
		l->cap = cap, l->cap1 = cap1, l->cap2 = cap2;
		grown = 1;
	}
	if (grown) {
		size_t live, peak, used;
		sfw_cuda_mem_stats(&live, &peak, &used);
		sfw_log(SFW_LOG_DEBUG, "cuda: cache room for %lld tokens; device memory held %.2f GiB (peak %.2f GiB)",
			(long long)tokens, live / 1073741824.0, peak / 1073741824.0);
	}
	return SFW_OK;
}

static void cu_cache_reset(struct sfw_backend *be, struct sfw_bcache *c)
{
	if (c->table) /* every block back to the pool */
		pages_release(c);
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		l->len = l->n1 = l->n2 = 0;
		if (l->state)
			sfw_cuda_memset(l->state, 0, (size_t)c->d.lnh * c->d.lhd * c->d.lhd * sizeof(float), S(be));
	}
}

static int64_t cu_cache_len(struct sfw_backend *be, const struct sfw_bcache *c, int layer)
{
	(void)be;
	return c->L[layer].len;
}

static void cu_cache_ncompressed(struct sfw_backend *be, const struct sfw_bcache *c, int layer, int64_t out[2])
{
	(void)be;
	out[0] = c->L[layer].n1;
	out[1] = c->L[layer].n2;
}

/* A replayed step's T rows onto the host-side counters (the recorded ops
 * leave them alone). */
static void cache_advance(struct sfw_bcache *c, int T)
{
	const struct sfw_cache_desc *d = &c->d;
	for (int i = 0; i < d->n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		if (!l->sparse)
			continue;
		SFW_ASSERT(T >= 0 && l->len + T <= l->cap);
		l->len += T;
		int64_t t1 = nchunks(l->len, d->ksize, d->stride), t2 = nchunks(l->len, 4 * d->ksize, 4 * d->stride);
		l->n1 = t1 > l->n1 ? t1 : l->n1;
		l->n2 = t2 > l->n2 ? t2 : l->n2;
	}
}

/* The tokens a recorded step may reach: what the cache holds room for, or a
 * paged cache's whole table (its blocks are reserved before each step;
 * the compressed keys are allocated for all of it). */
static int64_t cu_cache_room(const struct sfw_bcache *c)
{
	if (c->table)
		return c->maxblk * c->d.block;
	int64_t room = INT64_MAX;
	for (int i = 0; i < c->d.n_layers; i++)
		if (c->L[i].sparse && c->L[i].cap < room)
			room = c->L[i].cap;
	return room;
}


static void cu_kv_append(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k, const void *v, int T)
{
	struct cu_layer *l = &c->L[layer];
	size_t row = (size_t)c->d.nkv * c->d.hd * 2;
	if (IMPL(be)->rec) { /* at row *rec_pos; cache_advance moves len after the replay */
		SFW_ASSERT(l->sparse && T == 1);
		sfw_cuda_kv_append_devpos(l->k, l->v, &c->pg, k, v, row, IMPL(be)->rec_pos, S(be));
		return;
	}
	SFW_ASSERT(l->sparse && l->len + T <= l->cap);
	PROF(P_KV, sfw_cuda_kv_write_pg(l->k, l->v, &c->pg, k, v, row, l->len, T, S(be)));
	l->len += T;
}

static void cu_attn_dense(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer, int T,
			  int nh, float scale)
{
	struct cu_layer *l = &c->L[layer];
	if (IMPL(be)->rec) {
		SFW_ASSERT(T == 1);
		sfw_cuda_attn_dense_devpos(o, q, l->k, l->v, &c->pg, nh, c->d.nkv, c->d.hd, IMPL(be)->rec_bound, scale,
					   IMPL(be)->rec_pos, SFW_DTYPE_BF16, S(be));
		return;
	}
	PROF(P_DENSE, sfw_cuda_attn_dense_pg(o, q, l->k, l->v, &c->pg, T, nh, c->d.nkv, c->d.hd, l->len - T, scale,
					     SFW_DTYPE_BF16, S(be)));
}

static int64_t nchunks(int64_t len, int ksize, int stride)
{
	return len < ksize ? 0 : (len - ksize) / stride + 1;
}

static enum sfw_status cu_compress(struct sfw_backend *be, struct sfw_bcache *c, int layer, struct sfw_err *err)
{
	(void)err;
	struct cu_layer *l = &c->L[layer];
	const struct sfw_cache_desc *d = &c->d;
	if (IMPL(be)->rec) { /* the chunks the step's token completes */
		sfw_cuda_compress_devpos(l->c1, l->c2, l->k, &c->pg, d->nkv, d->hd, d->ksize, d->stride,
					 IMPL(be)->rec_pos, SFW_DTYPE_BF16, S(be));
		return SFW_OK;
	}
	int64_t t1 = nchunks(l->len, d->ksize, d->stride), t2 = nchunks(l->len, 4 * d->ksize, 4 * d->stride);
	SFW_ASSERT(t1 <= l->cap1 && t2 <= l->cap2);
	prof_begin(be);
	if (t1 > l->n1)
		sfw_cuda_compress_pg(l->c1, l->k, &c->pg, d->nkv, d->hd, l->n1, t1, d->ksize, d->stride, SFW_DTYPE_BF16,
				     S(be));
	if (t2 > l->n2)
		sfw_cuda_compress_pg(l->c2, l->k, &c->pg, d->nkv, d->hd, l->n2, t2, 4 * d->ksize, 4 * d->stride,
				     SFW_DTYPE_BF16, S(be));
	prof_end(be, P_COMPRESS);
	l->n1 = t1 > l->n1 ? t1 : l->n1;
	l->n2 = t2 > l->n2 ? t2 : l->n2;
	return SFW_OK;
}

static enum sfw_status sel_room(struct sfw_backend *be, size_t bytes, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	if (bytes <= b->sel_bytes)
		return SFW_OK;
	if (b->rec || b->rec_seqs) /* planned before the recording; growing here would wait inside it */
		return sfw_fail(err, SFW_E_CUDA, "block selection scratch too small for the decode graph");
	/* Decode asks for a little more every few steps: grow by half (at least
	 * 4 MiB) so the reallocation, which waits for the device, stays rare;
	 * never beyond the larger of the request and the configured cap. */
	size_t want = b->sel_bytes + b->sel_bytes / 2;
	if (want < ((size_t)4 << 20))
		want = (size_t)4 << 20;
	if (want > b->select_bytes)
		want = b->select_bytes;
	if (want < bytes)
		want = bytes;
	bytes = want;
	sfw_cuda_sync(b->stream);
	sfw_cuda_free(b->sel);
	b->sel = NULL;
	b->sel_bytes = 0;
	b->epoch++;
	enum sfw_status s = sfw_cuda_malloc(&b->sel, bytes, "block selection", err);
	if (s == SFW_OK)
		b->sel_bytes = bytes;
	return s;
}

/* Where a recorded step's selection ops read c's position: the
 * one-sequence recording's rec_pos, or c's entry of a many-sequence
 * recording's step table; NULL when nothing records. */
static const int64_t *rec_dpos(struct sfw_backend *be, const struct sfw_bcache *c)
{
	struct cu_be *b = IMPL(be);
	if (b->rec)
		return b->rec_pos;
	if (!b->rec_seqs)
		return NULL;
	for (int i = 0; i < b->rec_n; i++)
		if (b->rec_caches[i] == c)
			return &b->rec_tab->pos[i];
	SFW_ASSERT(!"a recorded step's sequence");
	return NULL;
}

static enum sfw_status cu_sparse_select(struct sfw_backend *be, int32_t *idx, const void *q, struct sfw_bcache *c,
					int layer, int nh, const struct sfw_sparse_params *sp, float *pooled_last,
					struct sfw_err *err)
{
	struct cu_layer *l = &c->L[layer];
	int nkv = c->d.nkv, hd = c->d.hd, k = sp->k;
	const int64_t *dpos = rec_dpos(be, c);
	if (dpos) { /* one row at *dpos, lengths up to rec_bound */
		struct cu_be *b = IMPL(be);
		size_t sc, po;
		SFW_ASSERT(sp->T == 1);
		enum sfw_status s = sel_room(be, sel_plan_row(&c->d, b->rec_bound, k, &sc, &po), err);
		if (s != SFW_OK)
			return s;
		float *scores = b->sel, *pooled = (float *)((char *)b->sel + sc);
		sfw_cuda_stage1_devpos(scores, q, l->c1, l->c2, nh, nkv, hd, b->rec_bound, sp->ksize, sp->stride, sp->scale,
				       dpos, SFW_DTYPE_BF16, S(be));
		/* up to 4096 blocks (256K tokens) top-k holds the blocks in
		 * registers and pools them itself: one launch less */
		if ((b->rec_bound + sp->block - 1) / sp->block <= 4096) {
			sfw_cuda_pool_topk_devpos(idx, scores, nkv, k, sp->block, sp->ksize, sp->stride, sp->init_blocks,
						  sp->local_blocks, dpos, S(be));
		} else {
			sfw_cuda_pool_blocks_devpos(pooled, scores, nkv, b->rec_bound, sp->ksize, sp->stride, sp->block,
						    sp->init_blocks, sp->local_blocks, dpos, S(be));
			sfw_cuda_topk_blocks_devpos(idx, pooled, nkv, k, sp->block, dpos, S(be));
		}
		(void)pooled_last; /* no taps while recording */
		return SFW_OK;
	}
	int64_t n1 = l->n1, nb = sp->nblocks;
	/* rows per batch: scores [nkv, rb, n1] + pooled [nkv, rb, nb] within select_bytes() */
	size_t per_row = (size_t)nkv * ((size_t)(n1 ? n1 : 1) + (size_t)nb + (size_t)k) * 4;
	int rb = (int)(IMPL(be)->select_bytes / per_row);
	if (rb < 1)
		rb = 1;
	if (rb > sp->T)
		rb = sp->T;
	size_t sc_bytes = sfw_cuda_arena_round((size_t)nkv * rb * (size_t)(n1 ? n1 : 1) * 4);
	size_t po_bytes = sfw_cuda_arena_round((size_t)nkv * rb * (size_t)nb * 4);
	size_t tk_bytes = (size_t)nkv * rb * k * 4;
	enum sfw_status s = sel_room(be, sc_bytes + po_bytes + tk_bytes, err);
	if (s != SFW_OK)
		return s;
	float *scores = IMPL(be)->sel;
	float *pooled = (float *)((char *)IMPL(be)->sel + sc_bytes);
	int32_t *tk = (int32_t *)((char *)IMPL(be)->sel + sc_bytes + po_bytes);
	size_t qrow = (size_t)nh * hd * 2;
	prof_begin(be);
	for (int r0 = 0; r0 < sp->T; r0 += rb) {
		int n = sp->T - r0 < rb ? sp->T - r0 : rb;
		int64_t p0 = sp->pos0 + r0;
		int32_t *dst = n == sp->T ? idx : tk;
		if (n1 > 0)
			sfw_op_stage1_cuda(scores, (const char *)q + (size_t)r0 * qrow, l->c1, n1, l->c2, l->n2, n, nh, nkv,
					   hd, p0, sp->ksize, sp->stride, sp->scale, SFW_DTYPE_BF16, S(be));
		sfw_op_pool_blocks_cuda(pooled, scores, n1, nb, nkv, n, p0, sp->ksize, sp->stride, sp->block,
					sp->init_blocks, sp->local_blocks, SFW_DTYPE_BF16, S(be));
		sfw_op_topk_blocks_cuda(dst, pooled, nb, nkv, n, p0, k, sp->block, SFW_DTYPE_BF16, S(be));
		if (dst != idx)
			for (int g = 0; g < nkv; g++)
				sfw_cuda_d2d(idx + ((size_t)g * sp->T + r0) * k, tk + (size_t)g * n * k,
					     (size_t)n * k * sizeof(int32_t), S(be));
		if (pooled_last && r0 + n == sp->T) {
			for (int g = 0; g < nkv; g++)
				sfw_cuda_d2h(pooled_last + (size_t)g * nb, pooled + ((size_t)g * n + (n - 1)) * nb,
					     (size_t)nb * sizeof(float), S(be));
			sfw_cuda_sync(S(be));
		}
	}
	prof_end(be, P_SELECT);
	return SFW_OK;
}

static void cu_attn_sparse(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
			   const int32_t *idx, int nh, const struct sfw_sparse_params *sp)
{
	struct cu_layer *l = &c->L[layer];
	const int64_t *dpos = rec_dpos(be, c);
	if (dpos) {
		SFW_ASSERT(sp->T == 1);
		sfw_cuda_attn_sparse_devpos(o, q, l->k, l->v, &c->pg, idx, nh, c->d.nkv, c->d.hd, sp->k, sp->block,
					    sp->scale, dpos, SFW_DTYPE_BF16, S(be));
		return;
	}
	PROF(P_SPARSE, sfw_cuda_attn_sparse_pg(o, q, l->k, l->v, &c->pg, idx, sp->T, nh, c->d.nkv, c->d.hd, sp->pos0,
					       sp->k, sp->block, sp->scale, SFW_DTYPE_BF16, S(be)));
}

static void cu_gla(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v, struct sfw_bcache *c,
		   int layer, const float *decay, int T, int nh, int hd, float scale)
{
	float *st = c->L[layer].state;
	if (T >= 64)
		PROF(P_GLA_CHUNK, sfw_op_gla_chunked_cuda(o, q, k, v, st, decay, T, nh, hd, scale, 64, SFW_DTYPE_BF16, S(be)));
	else
		PROF(P_GLA_REC, sfw_op_gla_recurrent_cuda(o, q, k, v, st, decay, T, nh, hd, scale, SFW_DTYPE_BF16, S(be)));
}

/* ---- a batched decode step's per-sequence ops (backend.h *_seqs) ----
 * The sequences with one row (decode rows) in one launch (kernels/ops_cuda.h,
 * struct sfw_cuda_seqs), when there are at least two of them; the others
 * (prefill chunks of a mixed step), and every sequence while recording a
 * step or with SALAFW_CUDA_NOSEQS, one by one (runner/backend_compose.c). */
struct seqs_split {
	struct sfw_cuda_seqs t;           /* the ones one launch serves */
	const struct sfw_bseq *one[SFW_CUDA_SEQS_MAX];
	struct sfw_bseq rest[SFW_BSEQ_MAX]; /* the others */
	int nrest;
};

/* Splits s[0..ns): returns how many one launch serves (0: none, and then
 * rest is all of s); ok(i) may hold a decode row back. */
static int seqs_split(struct sfw_backend *be, const struct sfw_bseq *s, int ns, struct seqs_split *sp,
		      int (*ok)(const struct sfw_bseq *q, int layer), int layer)
{
	struct cu_be *b = IMPL(be);
	int n = 0;
	sp->nrest = 0;
	sp->t.shift = 0;
	sp->t.layer = layer;
	SFW_ASSERT(ns >= 0 && ns <= SFW_BSEQ_MAX);
	if (b->rec_seqs) {
		/* recording many sequences (cu_step_seqs made sure each of these
		 * qualifies): the bucket's rows, their sequences read from rec_tab
		 * when the replay runs; pos[] only bounds the launch */
		sp->t.st = b->rec_tab, sp->t.sp = b->rec_ptr;
		sp->t.n = b->rec_rows;
		for (int i = 0; i < b->rec_rows; i++)
			sp->t.pos[i] = b->rec_bound - 1;
		return b->rec_rows;
	}
	sp->t.st = NULL;
	for (int i = 0; i < ns; i++) {
		if (!b->rec && !b->no_seqs && s[i].R == 1 && n < SFW_CUDA_SEQS_MAX && (!ok || ok(&s[i], layer))) {
			const struct sfw_bcache *c = s[i].cache;
			sp->one[n] = &s[i];
			sp->t.pos[n] = s[i].pos0;
			sp->t.row[n] = s[i].row0;
			sp->t.tab[n] = c->pg.tab; /* one pool per batch: one shift */
			if (c->pg.tab) {
				SFW_ASSERT(sp->t.shift == 0 || sp->t.shift == c->pg.shift);
				sp->t.shift = c->pg.shift;
			}
			n++;
		} else {
			sp->rest[sp->nrest++] = s[i];
		}
	}
	if (n < 2) { /* one row alone takes the single-sequence ops */
		sp->nrest = ns;
		memcpy(sp->rest, s, (size_t)ns * sizeof(*s));
		return 0;
	}
	sp->t.n = n;
	return n;
}

static void cu_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				 const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk, int hd,
				 float eps, int rope, float theta)
{
	struct seqs_split sp;
	if (!IMPL(be)->no_fuse && qw && kw && seqs_split(be, s, ns, &sp, NULL, 0)) {
		PROF(P_QKNORM, sfw_cuda_qk_norm_rope_seqs(q, k, qw->dev, qw->dtype, kw->dev, kw->dtype, &sp.t, nhq, nhk, hd,
							  eps, rope, theta, SFW_DTYPE_BF16, S(be)));
	} else {
		sp.nrest = ns, memcpy(sp.rest, s, (size_t)ns * sizeof(*s));
		IMPL(be)->rec_fail |= IMPL(be)->rec_seqs; /* the single ops take host positions */
	}
	if (sp.nrest)
		sfwi_compose_qk_norm_rope_seqs(be, q, k, qw, kw, sp.rest, sp.nrest, nhq, nhk, hd, eps, rope, theta);
}

static void cu_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		sp.t.pf[0] = SFW_CUDA_LSTATE;
		for (int i = 0; !sp.t.st && i < sp.t.n; i++)
			sp.t.p[0][i] = sp.one[i]->cache->L[layer].state;
		PROF(P_GLA_REC, sfw_cuda_gla_seqs(o, q, k, v, &sp.t, decay, nh, hd, scale, SFW_DTYPE_BF16, S(be)));
	}
	if (sp.nrest)
		sfwi_compose_gla_seqs(be, o, q, k, v, sp.rest, sp.nrest, layer, decay, nh, hd, scale);
}

static void cu_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
			      const void *v, int kvd)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		sp.t.pf[0] = SFW_CUDA_LK, sp.t.pf[1] = SFW_CUDA_LV;
		SFW_ASSERT(s[0].cache->d.nkv * s[0].cache->d.hd == kvd);
		/* recording: cache_advance after each replay */
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			struct cu_layer *l = &sp.one[i]->cache->L[layer];
			SFW_ASSERT(l->sparse);
			sp.t.p[0][i] = l->k, sp.t.p[1][i] = l->v;
			SFW_ASSERT(l->len == sp.one[i]->pos0 && l->len + 1 <= l->cap);
			l->len++;
		}
		PROF(P_KV, sfw_cuda_kv_append_seqs(&sp.t, k, v, (size_t)kvd * 2, S(be)));
	}
	if (sp.nrest)
		sfwi_compose_kv_append_seqs(be, sp.rest, sp.nrest, layer, k, v, kvd);
}

/* One token completes at most one chunk per level, from keys made up to
 * the token before it (its K appended: len = pos0 + 1). */
static int compress_current(const struct sfw_bseq *q, int layer)
{
	const struct cu_layer *l = &q->cache->L[layer];
	const struct sfw_cache_desc *d = &q->cache->d;
	return l->len == q->pos0 + 1 && l->n1 == nchunks(l->len - 1, d->ksize, d->stride) &&
	       l->n2 == nchunks(l->len - 1, 4 * d->ksize, 4 * d->stride);
}

static enum sfw_status cu_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer,
					struct sfw_err *err)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, compress_current, layer)) {
		const struct sfw_cache_desc *d = &s[0].cache->d; /* one batch: one shape */
		sp.t.pf[0] = SFW_CUDA_LC1, sp.t.pf[1] = SFW_CUDA_LC2, sp.t.pf[2] = SFW_CUDA_LK;
		/* recording: every cache current, with room for rec_bound (bstep_current) */
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			struct cu_layer *l = &sp.one[i]->cache->L[layer];
			sp.t.p[0][i] = l->c1, sp.t.p[1][i] = l->c2, sp.t.p[2][i] = l->k;
			int64_t t1 = nchunks(l->len, d->ksize, d->stride), t2 = nchunks(l->len, 4 * d->ksize, 4 * d->stride);
			SFW_ASSERT(t1 <= l->cap1 && t2 <= l->cap2);
			l->n1 = t1, l->n2 = t2;
		}
		PROF(P_COMPRESS, sfw_cuda_compress_seqs(&sp.t, d->nkv, d->hd, d->ksize, d->stride, SFW_DTYPE_BF16, S(be)));
	}
	return sp.nrest ? sfwi_compose_compress_seqs(be, sp.rest, sp.nrest, layer, err) : SFW_OK;
}

static void cu_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
			       int layer, int nh, int hd, float scale)
{
	struct seqs_split sp;
	if (seqs_split(be, s, ns, &sp, NULL, layer)) {
		/* recording: the rows in selection mode have NULL here (their own ops attend) */
		sp.t.pf[0] = SFW_CUDA_LAK, sp.t.pf[1] = SFW_CUDA_LAV;
		for (int i = 0; !sp.t.st && i < sp.t.n; i++) {
			const struct cu_layer *l = &sp.one[i]->cache->L[layer];
			SFW_ASSERT(l->len == sp.one[i]->pos0 + 1);
			sp.t.p[0][i] = l->k, sp.t.p[1][i] = l->v;
		}
		PROF(P_DENSE, sfw_cuda_attn_dense_seqs(o, q, &sp.t, nh, s[0].cache->d.nkv, hd, scale, SFW_DTYPE_BF16,
						       S(be)));
	}
	if (sp.nrest)
		sfwi_compose_attn_dense_seqs(be, o, q, sp.rest, sp.nrest, layer, nh, hd, scale);
}

/* o: the switches that bring back an older path without a rebuild. */
/* ---- decode steps as graphs ---- */

/* Positions one recording serves: re-recorded every STEP_SPAN tokens, so
 * launches planned for its bound stay close to the real lengths. */
#define STEP_SPAN 4096

/* A context's recording of its decode step (be->step's *rec): valid for
 * positions below bound, in one mode (sparse or dense selection) and while
 * the backend's memory epoch stays epoch. */
struct cu_step {
	int many;     /* 0 (struct cu_bstep: 1) */
	void *graph;
	int64_t bound;
	int sparse;
	uint64_t epoch;
	int64_t *pos; /* device: the position the replay reads */
	int off;      /* a recording failed: steps run directly from now on */
};

static void cu_bstep_free(struct sfw_backend *be, void *rec);

static void cu_step_free(struct sfw_backend *be, void *rec)
{
	struct cu_step *r = rec;
	if (!r)
		return;
	if (r->many) {
		cu_bstep_free(be, rec);
		return;
	}
	if (r->graph) {
		sfw_cuda_sync(IMPL(be)->stream);
		sfw_cuda_graph_free(r->graph);
	}
	if (r->pos)
		cu_free(be, r->pos);
	sfw_free(r);
}

/* Makes *recp's recording valid for pos and sparse (recorded now when
 * there is none or it is stale); 0 when the step has to run directly:
 * graphs are off (SALAFW_CUDA_NOGRAPH=1, STEPSYNC=1, PROFILE=1) or a
 * recording could not be made, then or before (r->off). */
static int step_ready(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos, int sparse,
		      sfw_step_fn fn, void *arg, enum sfw_status *st, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	struct cu_step *r = *recp;
	*st = SFW_OK;
	if (!b->graphs || (r && r->off))
		return 0;
	if (!r) {
		if (!(r = sfw_calloc(1, sizeof(*r))) || !(r->pos = cu_alloc(be, sizeof(int64_t)))) {
			sfw_free(r);
			*st = sfw_fail(err, SFW_E_NOMEM, "out of memory for a decode graph");
			return 0;
		}
		*recp = r;
	}
	if (r->graph && (r->sparse != sparse || pos + 1 > r->bound || r->epoch != b->epoch)) {
		sfw_cuda_sync(b->stream);
		sfw_cuda_graph_free(r->graph);
		r->graph = NULL;
	}
	if (r->graph)
		return 1;
	int64_t bound = (pos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN, room = cu_cache_room(c);
	struct sfw_err e = {0};
	if (bound > room)
		bound = room;
	if (rec_begin(be, c, r->pos, bound, &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "cuda: %s; decoding without graphs", e.msg);
		r->off = 1;
		return 0;
	}
	enum sfw_status s = fn(arg, &e);
	void *g = rec_end(be);
	if (s != SFW_OK || !g) { /* nothing ran: the step runs directly, from now on */
		if (g)
			sfw_cuda_graph_free(g);
		if (s != SFW_OK)
			sfw_log(SFW_LOG_WARN, "cuda: recording a decode step: %s; decoding without graphs", e.msg);
		r->off = 1;
		return 0;
	}
	r->graph = g;
	r->bound = bound;
	r->sparse = sparse;
	r->epoch = b->epoch;
	b->recordings++;
	return 1;
}

int64_t sfwi_cuda_recordings(const struct sfw_backend *be)
{
	return ((const struct cu_be *)be->impl)->recordings;
}

int64_t sfwi_cuda_seqs_replays(const struct sfw_backend *be)
{
	return ((const struct cu_be *)be->impl)->seqs_replays;
}

/* ---- decode steps of several sequences as graphs (be->step_seqs) ----
 * One recording per batch-size bucket (2, 4, 8, 16, 32, 64 rows) in the
 * batch's *rec. The *_seqs ops recorded over the bucket's rows read each
 * replay's sequences from device memory written just before the launch:
 * positions and block tables (struct sfw_cuda_steptab), and every row's
 * cache pointers per layer (sfw_cuda_seqs.sp: one flat table, so a block
 * loads its pointer in one step, not through a chain). Rows past
 * the step's n are padding: the linears run over them (their cost is the
 * weights', not the rows'), the *_seqs kernels skip them. So a recording
 * of dense-mode rows serves any sequences: they join and leave between
 * steps and the bucket's recording still serves. A sequence in selection
 * mode runs its own selection and sparse attention launches, recorded with
 * its caches' pointers and reading its position from the table: such a
 * recording serves while the same sequences (by serial) sit in the same
 * rows in selection mode, the dense ones being any. Only paged caches (a
 * batch's on this backend): a cache of its own may move its buffers. */
#define STEP_SEQS_STABLE 2 /* steps a key runs directly before it is recorded */
#define STEP_BUCKETS 6     /* 2 .. SFW_CUDA_SEQS_MAX rows */

/* What a recording was made for: its rows and, when some sequences select
 * blocks, the step's n and which sequence sits in each selecting row. */
struct cu_bkey {
	int rows, n, nsparse;
	uint64_t serial[SFW_CUDA_SEQS_MAX]; /* rows in selection mode: the cache's serial; else 0 */
};

struct cu_bucket {
	void *graph;
	struct cu_bkey key, pend; /* the recording's key; the key of the steps run directly */
	int same;                 /* steps run directly with key pend */
	int64_t bound;
	uint64_t epoch;
};

struct cu_bstep {
	int many; /* 1 */
	struct cu_bucket bk[STEP_BUCKETS];
	struct sfw_cuda_steptab *tab; /* device: the replay's sequences */
	struct sfw_cuda_steptab host;
	void **ptr, **hptr; /* device, host: [layers][SFW_CUDA_LN][rows] (sfw_cuda_seqs.sp) */
	int layers;
	int off;
};

static void cu_bstep_free(struct sfw_backend *be, void *rec)
{
	struct cu_bstep *r = rec;
	for (int i = 0; i < STEP_BUCKETS; i++)
		if (r->bk[i].graph) {
			sfw_cuda_sync(IMPL(be)->stream);
			sfw_cuda_graph_free(r->bk[i].graph);
		}
	if (r->tab)
		cu_free(be, r->tab);
	if (r->ptr)
		cu_free(be, r->ptr);
	sfw_free(r->hptr);
	sfw_free(r);
}

/* Every sequence's caches as a recorded step expects them before its
 * token: paged, pos[i] tokens in, the compressed keys made up to them, and
 * room for the token. */
static int bstep_current(struct sfw_bcache *const *caches, const int64_t *pos, int n)
{
	for (int i = 0; i < n; i++) {
		const struct sfw_bcache *c = caches[i];
		const struct sfw_cache_desc *d = &c->d;
		if (!c->table || c->pg.shift != caches[0]->pg.shift)
			return 0;
		for (int li = 0; li < d->n_layers; li++) {
			const struct cu_layer *l = &c->L[li];
			if (l->sparse && (l->len != pos[i] || l->len + 1 > l->cap || l->n1 != nchunks(l->len, d->ksize, d->stride) ||
					  l->n2 != nchunks(l->len, 4 * d->ksize, 4 * d->stride)))
				return 0;
		}
	}
	return 1;
}

/* The bucket of n rows: the smallest power of two >= n, at most max_rows
 * (then max_rows itself, >= n). */
static int bucket_of(int n, int max_rows, int *idx)
{
	int rows = 2, i = 0;
	while (rows < n)
		rows *= 2, i++;
	if (rows > max_rows)
		rows = max_rows;
	*idx = i;
	return rows;
}

static void bkey_make(struct cu_bkey *k, int rows, struct sfw_bcache *const *caches, const int *sparse, int n)
{
	memset(k, 0, sizeof(*k));
	k->rows = rows;
	for (int i = 0; i < n; i++)
		if (sparse[i])
			k->serial[i] = caches[i]->serial, k->nsparse++;
	k->n = k->nsparse ? n : 0; /* all dense: any n of the bucket */
}

static int bkey_eq(const struct cu_bkey *a, const struct cu_bkey *b)
{
	return a->rows == b->rows && a->n == b->n && a->nsparse == b->nsparse &&
	       (!a->nsparse || !memcmp(a->serial, b->serial, (size_t)a->n * sizeof(a->serial[0])));
}

static enum sfw_status cu_step_seqs(struct sfw_backend *be, void **recp, struct sfw_bcache *const *caches,
				    const int64_t *pos, const int *sparse, int n, int max_rows, sfw_rows_fn fn,
				    void *arg, int *replayed, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	struct cu_bstep *r = *recp;
	*replayed = 0;
	if (!b->graphs || b->no_seqs || b->no_fuse || n < 2 || n > SFW_CUDA_SEQS_MAX || max_rows < n || (r && r->off))
		return fn(arg, n, err);
	if (!r) {
		int L = caches[0]->d.n_layers;
		size_t pb = (size_t)L * SFW_CUDA_LN * SFW_CUDA_SEQS_MAX * sizeof(void *);
		if (!(r = sfw_calloc(1, sizeof(*r))))
			return fn(arg, n, err); /* no recording, the step all the same */
		r->many = 1, r->layers = L;
		*recp = r;
		if (!(r->tab = cu_alloc(be, sizeof(*r->tab))) || !(r->ptr = cu_alloc(be, pb)) || !(r->hptr = sfw_malloc(pb))) {
			r->off = 1;
			return fn(arg, n, err);
		}
	}
	if (!bstep_current(caches, pos, n))
		return fn(arg, n, err);
	int64_t maxpos = 0, room = INT64_MAX;
	for (int i = 0; i < n; i++) {
		maxpos = pos[i] > maxpos ? pos[i] : maxpos;
		int64_t rm = cu_cache_room(caches[i]);
		room = rm < room ? rm : room;
	}
	int bi;
	int rows = bucket_of(n, max_rows, &bi);
	struct cu_bucket *k = &r->bk[bi];
	struct cu_bkey key;
	bkey_make(&key, rows, caches, sparse, n);
	int match = k->graph && bkey_eq(&k->key, &key);
	if (!match || maxpos + 1 > k->bound || k->epoch != b->epoch) {
		/* a new key runs directly until it has held for STEP_SEQS_STABLE
		 * steps; the recording's own key past its bound (or after the
		 * memory moved) is recorded again at once */
		if (!match) {
			if (!bkey_eq(&k->pend, &key))
				k->pend = key, k->same = 0;
			if (++k->same <= STEP_SEQS_STABLE)
				return fn(arg, n, err);
		}
		int64_t bound = (maxpos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN;
		if (bound > room)
			bound = room;
		if (bound < maxpos + 1)
			return fn(arg, n, err);
		if (k->graph) {
			sfw_cuda_sync(b->stream);
			sfw_cuda_graph_free(k->graph);
			k->graph = NULL;
		}
		struct sfw_err e = {0};
		enum sfw_status s = SFW_OK;
		if (key.nsparse) { /* the selection scratch in place before the recording */
			size_t sc, po;
			s = sel_room(be, sel_plan_row(&caches[0]->d, bound, caches[0]->d.sel_k, &sc, &po), &e);
		}
		void *g = NULL;
		struct sfw_err ge = {0};
		enum sfw_status gs = SFW_OK;
		if (s == SFW_OK) {
			b->rec_seqs = 1, b->rec_tab = r->tab, b->rec_ptr = r->ptr, b->rec_rows = rows, b->rec_bound = bound;
			b->rec_fail = 0, b->rec_caches = caches, b->rec_n = n;
			sfw_cuda_graph_begin(S(be));
			s = fn(arg, rows, &e);
			b->rec_seqs = 0, b->rec_tab = NULL, b->rec_ptr = NULL, b->rec_caches = NULL, b->rec_n = 0;
			gs = sfw_cuda_graph_end(S(be), &g, &ge);
		}
		if (s != SFW_OK || gs != SFW_OK || b->rec_fail) {
			/* nothing ran: the step runs directly, and so do the next ones */
			if (g)
				sfw_cuda_graph_free(g);
			if (s != SFW_OK || gs != SFW_OK)
				sfw_log(SFW_LOG_WARN, "cuda: recording a step of %d rows: %s; batched steps without graphs",
					rows, s != SFW_OK ? e.msg : ge.msg);
			else /* a model whose q/k norms and RoPE have no batched kernel */
				sfw_log(SFW_LOG_DEBUG, "cuda: a step of %d rows cannot be recorded here", rows);
			r->off = 1;
			return fn(arg, n, err);
		}
		k->graph = g, k->key = key, k->bound = bound, k->epoch = b->epoch;
		b->recordings++;
	}
	struct sfw_cuda_steptab *t = &r->host;
	t->n = n, t->shift = caches[0]->pg.shift;
	for (int i = 0; i < rows; i++) {
		t->pos[i] = i < n ? pos[i] : 0;
		t->tab[i] = i < n ? caches[i]->pg.tab : NULL;
	}
	size_t np = (size_t)r->layers * SFW_CUDA_LN * (size_t)rows;
	memset(r->hptr, 0, np * sizeof(void *)); /* padding rows: NULL */
	for (int li = 0; li < r->layers; li++)
		for (int i = 0; i < n; i++) {
			const struct cu_layer *l = &caches[i]->L[li];
			void **e = r->hptr + (size_t)li * SFW_CUDA_LN * rows + i;
			if (!l->sparse) {
				e[SFW_CUDA_LSTATE * rows] = l->state;
				continue;
			}
			e[SFW_CUDA_LK * rows] = l->k, e[SFW_CUDA_LV * rows] = l->v;
			e[SFW_CUDA_LC1 * rows] = l->c1, e[SFW_CUDA_LC2 * rows] = l->c2;
			if (!sparse[i])
				e[SFW_CUDA_LAK * rows] = l->k, e[SFW_CUDA_LAV * rows] = l->v;
		}
	/* staged before they return, ordered after the replay before (which reads them) */
	cu_from_host(be, r->tab, t, sizeof(*t));
	cu_from_host(be, r->ptr, r->hptr, np * sizeof(void *));
	sfw_cuda_graph_launch(k->graph, S(be));
	for (int i = 0; i < n; i++)
		cache_advance(caches[i], 1);
	b->seqs_replays++;
	*replayed = 1;
	return SFW_OK;
}

/* Replays the step's recording (step_ready), or runs fn directly. */
static enum sfw_status cu_step(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos, int sparse,
			       sfw_step_fn fn, void *arg, int *replayed, struct sfw_err *err)
{
	enum sfw_status s;
	*replayed = 0;
	if (!step_ready(be, recp, c, pos, sparse, fn, arg, &s, err))
		return s != SFW_OK ? s : fn(arg, err);
	struct cu_step *r = *recp;
	/* a paged cache's recording reaches its whole table: the block of pos must be taken */
	SFW_ASSERT(!c->table || pos < c->nblk * c->d.block);
	cu_from_host(be, r->pos, &pos, sizeof(pos));
	sfw_cuda_graph_launch(r->graph, S(be));
	cache_advance(c, 1);
	*replayed = 1;
	return SFW_OK;
}

/* The recording only; the replay's position is written by the step. */
static enum sfw_status cu_step_record(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos,
				      int sparse, sfw_step_fn fn, void *arg, struct sfw_err *err)
{
	enum sfw_status s;
	step_ready(be, recp, c, pos, sparse, fn, arg, &s, err);
	return s;
}

/* bf16/f32 weights everywhere, int8 in the products; paged KV; recordings
 * unless graphs are off. */
static int cu_supports(const struct sfw_backend *be, enum sfw_bop op, enum sfw_dtype dt)
{
	if (op == SFW_BOP_RECORD)
		return ((const struct cu_be *)be->impl)->graphs;
	if (op == SFW_BOP_POOL)
		return 1;
	return sfwi_weight_dtype_ok(op, dt);
}

static enum sfw_status cu_pool_new(struct sfw_backend *be, const struct sfw_cache_desc *d, int64_t blocks,
				   struct sfw_bpool **out, struct sfw_err *err)
{
	(void)be;
	*out = NULL;
	int nsparse = 0, shift = 0;
	for (int i = 0; i < d->n_layers; i++)
		nsparse += d->mixer[i] == SFW_MIXER_SPARSE;
	while (shift < 30 && (1 << shift) < d->block)
		shift++;
	/* a block holds whole 32-token attention tiles (sfw_cuda_pages) */
	if (nsparse == 0 || d->block != 1 << shift || shift < 5)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "no paged KV pool for blocks of %d tokens here (a power of two, at least 32)",
				d->block);
	size_t bb = (size_t)d->block * d->nkv * d->hd * 2;
	if (blocks < 1 || blocks > INT32_MAX || (size_t)blocks > SIZE_MAX / bb / 2 / (size_t)nsparse)
		return sfw_fail(err, SFW_E_INVAL, "invalid KV pool size (%lld blocks)", (long long)blocks);
	struct sfw_bpool *p = sfw_calloc(1, sizeof(*p));
	if (!p || !(p->free = sfw_malloc((size_t)blocks * sizeof(int32_t)))) {
		sfw_free(p);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	p->bb = bb, p->nsparse = nsparse, p->shift = shift, p->nblocks = blocks, p->nfree = blocks;
	for (int64_t i = 0; i < blocks; i++) /* popped lowest first */
		p->free[i] = (int32_t)(blocks - 1 - i);
	enum sfw_status s = sfw_cuda_malloc(&p->mem, (size_t)nsparse * 2 * (size_t)blocks * bb, "the KV pool", err);
	if (s != SFW_OK) {
		sfw_free(p->free), sfw_free(p);
		return s;
	}
	*out = p;
	return SFW_OK;
}

static void cu_pool_free(struct sfw_backend *be, struct sfw_bpool *p)
{
	if (!p)
		return;
	sfw_cuda_sync(S(be));
	sfw_cuda_free(p->mem);
	sfw_free(p->free);
	sfw_free(p);
}

static int64_t cu_pool_used(struct sfw_backend *be, const struct sfw_bpool *p)
{
	(void)be;
	return p->nblocks - p->nfree;
}

/* The CUDA ops report no failure they could not return. */
static enum sfw_status cu_take_failure(struct sfw_backend *be, struct sfw_err *err)
{
	(void)be, (void)err;
	return SFW_OK;
}

/* The CUDA backend's table: every member (backend.h); impl is the device
 * state, set per instance, and the options choose paths inside the members. */
static const struct sfw_backend cuda_backend = {
	.name = "cuda",
	.act = SFW_DTYPE_BF16,
	.act_size = 2, /* bf16 */
	.destroy = cu_destroy,
	.weight_upload = cu_weight_upload,
	.weight_release = cu_weight_release,
	.alloc = cu_alloc,
	.free = cu_free,
	.to_host_f32 = cu_to_host_f32,
	.from_host_f32 = cu_from_host_f32,
	.to_host = cu_to_host,
	.from_host = cu_from_host,
	.sync = cu_sync,
	.embed = cu_embed,
	.rmsnorm = cu_rmsnorm,
	.add_scaled = cu_add_scaled,
	.silu_mul = cu_silu_mul,
	.sigmoid_mul = cu_sigmoid_mul,
	.rope_neox = cu_rope,
	.matmul = cu_matmul,
	.matmul_group = cu_matmul_group,
	.swiglu = cu_swiglu,
	.add_rmsnorm = cu_add_rmsnorm,
	.rmsnorm_gate = cu_rmsnorm_gate,
	.qk_norm_rope = cu_qk_norm_rope,
	.qk_norm_rope_seqs = cu_qk_norm_rope_seqs,
	.gla_seqs = cu_gla_seqs,
	.kv_append_seqs = cu_kv_append_seqs,
	.compress_seqs = cu_compress_seqs,
	.attn_dense_seqs = cu_attn_dense_seqs,
	.logits = cu_logits,
	.cache_new = cu_cache_new,
	.cache_free = cu_cache_free,
	.cache_reserve = cu_cache_reserve,
	.cache_reset = cu_cache_reset,
	.cache_len = cu_cache_len,
	.cache_ncompressed = cu_cache_ncompressed,
	.kv_append = cu_kv_append,
	.attn_dense = cu_attn_dense,
	.compress = cu_compress,
	.sparse_select = cu_sparse_select,
	.attn_sparse = cu_attn_sparse,
	.gla = cu_gla,
	.supports = cu_supports,
	.copy = cu_copy,
	.load_begin = cu_load_begin,
	.merge = cu_merge,
	.load_end = cu_load_end,
	.sample = cu_sample,
	.step = cu_step,
	.step_free = cu_step_free,
	.step_record = cu_step_record,
	.step_seqs = cu_step_seqs,
	.take_failure = cu_take_failure,
	.pool_new = cu_pool_new,
	.pool_free = cu_pool_free,
	.pool_used = cu_pool_used,
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
		s = sfw_cuda_blas_new(&b->blas, (size_t)32 << 20, err);
	if (s == SFW_OK)
		s = sfw_cuda_malloc(&b->scratch, SFW_CUDA_SCRATCH_MIN, "op scratch", err);
	if (s != SFW_OK) {
		sfw_cuda_blas_free(b->blas);
		sfw_cuda_stream_free(b->stream);
		sfw_free(be), sfw_free(b);
		return s;
	}
	b->scratch_bytes = SFW_CUDA_SCRATCH_MIN;
	if (o->profile) {
		b->prof = 1;
		b->ev0 = sfw_cuda_event_new();
		b->ev1 = sfw_cuda_event_new();
	}
	b->next_report = (size_t)2 << 30;
	b->stepsync = o->step_sync;
	b->select_bytes = o->select_mb > 0 ? (size_t)o->select_mb << 20 : SELECT_BYTES_DEFAULT;
	b->cfg.attn = o->attn;
	b->cfg.stage1 = o->stage1;
	b->cfg.gla_serial = o->gla_serial;
	b->cfg.no_pdl = o->no_pdl;
	b->cfg.sms = b->info.sm_count;
	b->cfg.w8_gemv = o->w8_gemv;
	sfw_log(SFW_LOG_INFO, "cuda: %s (sm_%d%d, %d SMs), %.1f GiB free of %.1f GiB", b->info.name, b->info.cc_major,
		b->info.cc_minor, b->info.sm_count, b->info.free_mem / 1073741824.0, b->info.total_mem / 1073741824.0);
	*be = cuda_backend;
	be->impl = b;
	/* graphs record, they do not time ops: none while profiling; the
	 * per-step host waits of STEPSYNC have none either */
	b->graphs = !o->no_graph && !b->prof && !b->stepsync;
	b->no_fuse = o->no_fuse;
	b->no_seqs = o->no_seqs;
	b->no_merge = o->no_merge;
	b->no_sample = o->no_sample;
	b->w8_silu = !o->no_w8_silu;
	*out = be;
	return SFW_OK;
}
