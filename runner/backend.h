/* backend.h - the op table that runner/forward.c is written against.
 *
 * One forward pass, several backends: the CPU backend (runner/backend_cpu.c,
 * fp32 activations, weights read in place from the mmap) and a CUDA backend
 * (bf16 activations with the reference's rounding points, weights uploaded
 * into one device arena). forward.c never dereferences an activation: every
 * buffer is an opaque pointer into backend memory, sized in elements of the
 * backend's activation dtype (act_size bytes each), and the only ways across
 * are the to_host / from_host calls. Buffers are plain addresses in the
 * backend's memory space, so (char *)p + i * act_size is element i (forward.c
 * offsets rows this way).
 *
 * Fused ops (norm+matmul, gate+up+SiLU, ...) enter this table as new members;
 * forward.c uses them when non-NULL, and the CPU backend implements them as
 * the composition of the unfused ops (docs/style.md §13.10).
 *
 * Caches belong to the backend: per sparse layer the K and V of every token
 * [len, nkv, hd], growing in 64-token blocks, and the two levels of
 * compressed keys; per lightning layer the fp32 state [nh, hd, hd]. Memory
 * follows the context actually used (cache_reserve), never
 * max_position_embeddings. */
#ifndef SFW_BACKEND_H
#define SFW_BACKEND_H

#include "kernels/ops.h"
#include "num/w8_layout.h"
#include "formats/config.h"
#include "runner/runner.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

/* A weight as a backend holds it. `host` points into the read-only map and
 * stays valid until sfw_model_free; `dev` is the backend's own copy (NULL on
 * the CPU). */
struct sfw_bweight {
	const char *name;
	const void *host;
	void *dev;
	enum sfw_dtype dtype; /* as stored: BF16 or F32, or W8 (below) */
	int64_t rows, cols;      /* [out, in]; a vector is rows = 1 */
	/* dtype SFW_DTYPE_W8 (compressed-tensors pack-quantized int8, quant/layout.h):
	 * host = the codes [rows, ceil(cols/4)*4] bytes (weight_packed), scales =
	 * weight_scale [rows, ceil(cols/group)] in scale_dtype (BF16, F16 or F32),
	 * group = the group size along cols (cols for per-channel). scales_dev is
	 * the backend's copy of the scales (NULL on the CPU). */
	const void *scales;
	enum sfw_dtype scale_dtype;
	int group;
	void *scales_dev;
};

/* Bytes per row of an SFW_DTYPE_W8 weight's codes, and of its scales. */
static inline size_t sfw_bweight_w8_code_row(const struct sfw_bweight *w)
{
	return (size_t)sfw_ql_row_bytes(w->cols);
}
static inline size_t sfw_bweight_w8_scale_row(const struct sfw_bweight *w)
{
	int span = w->group > 0 && w->group < w->cols ? w->group : SFW_QL_GROUP_CHANNEL;
	return (size_t)sfw_ql_ngroups(w->cols, span) * (w->scale_dtype == SFW_DTYPE_F32 ? 4 : 2);
}

struct sfw_bcache; /* opaque, backend-owned */
struct sfw_bpool;  /* opaque: a paged KV pool (pool_new) */

/* Which sequence length a layer's cache must hold: filled from the config. */
struct sfw_cache_desc {
	int n_layers;
	const enum sfw_mixer *mixer; /* [n_layers] */
	int nkv, hd;                 /* sparse layers */
	int lnh, lhd;                /* lightning layers */
	int ksize, stride;           /* level-1 compression (level 2: x4) */
	int block;                   /* KV growth granule and selection block (64) */
	int sel_k;                   /* blocks selected per row (topk + window/block) */
	/* Paged KV (backends with pool_new): the K and V of the sparse layers
	 * in blocks drawn from pool by cache_reserve, at most max_tokens;
	 * NULL: the cache grows on its own. */
	struct sfw_bpool *pool;
	int64_t max_tokens;
};

/* Parameters of one sparse-layer selection call (docs/model-spec.md §2.6.4). */
struct sfw_sparse_params {
	int64_t pos0;       /* position of the call's first row */
	int T;              /* rows */
	int64_t nblocks;    /* ceil(L / block), L = total length at the END of the forward call */
	int k;              /* topk + window/block */
	int init_blocks, local_blocks;
	int ksize, stride, block;
	float scale;        /* 1/sqrt(hd) */
};

struct sfw_backend {
	const char *name;          /* "cpu", "cuda" */
	enum sfw_dtype act;     /* activation dtype */
	size_t act_size;           /* bytes per activation element */
	void *impl;                /* backend private state */

	void (*destroy)(struct sfw_backend *be);

	/* ---- memory ---- */
	/* Uploads (or, on the CPU, adopts) one weight; fills w->dev. */
	SFW_MUST_CHECK enum sfw_status (*weight_upload)(struct sfw_backend *be, struct sfw_bweight *w,
							struct sfw_err *err);
	void (*weight_release)(struct sfw_backend *be, struct sfw_bweight *w);
	/* Activation / scratch buffers in backend memory; NULL on failure. */
	void *(*alloc)(struct sfw_backend *be, size_t bytes);
	void (*free)(struct sfw_backend *be, void *p);
	/* n activation elements (dtype act) at src + off elements -> host float. */
	void (*to_host_f32)(struct sfw_backend *be, float *dst, const void *src, size_t off, size_t n);
	/* host float -> n activation elements at dst. */
	void (*from_host_f32)(struct sfw_backend *be, void *dst, const float *src, size_t n);
	/* raw bytes (ids, top-k indices, fp32 scores). */
	void (*to_host)(struct sfw_backend *be, void *dst, const void *src, size_t bytes);
	void (*from_host)(struct sfw_backend *be, void *dst, const void *src, size_t bytes);
	void (*sync)(struct sfw_backend *be);

	/* ---- ops (meaning: kernels/ops.h; every buffer, ids included, is a
	 * backend pointer) ---- */
	void (*embed)(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids, int T,
		      float scale);
	void (*rmsnorm)(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int rows,
			int n, float eps);
	void (*add_scaled)(struct sfw_backend *be, void *x, const void *b, size_t n, float scale);
	void (*silu_mul)(struct sfw_backend *be, void *y, const void *gate, const void *up, size_t n);
	void (*sigmoid_mul)(struct sfw_backend *be, void *y, const void *x, const void *gate, size_t n);
	void (*rope_neox)(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0, float theta);
	/* y[M, W.rows] = x[M, W.cols] . W^T */
	void (*matmul)(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M);
	/* Optional (NULL: none): one token's SwiGLU y[N] = silu(g)·u over a merged
	 * gate|up view gu [2N, K] (meaning: sfw_op_matmul_silu_w8_cpu); returns 0,
	 * doing nothing, for weights it does not take. */
	int (*matmul_silu)(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *gu, int N);
	/* logits are always float32 (host-readable through to_host) */
	void (*logits)(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
		       float in_scale);

	/* ---- caches ---- */
	SFW_MUST_CHECK enum sfw_status (*cache_new)(struct sfw_backend *be, const struct sfw_cache_desc *d,
						    struct sfw_bcache **out, struct sfw_err *err);
	void (*cache_free)(struct sfw_backend *be, struct sfw_bcache *c);
	/* Makes room for `tokens` tokens in every sparse layer (rounded up to
	 * whole blocks); never shrinks. */
	SFW_MUST_CHECK enum sfw_status (*cache_reserve)(struct sfw_backend *be, struct sfw_bcache *c,
							int64_t tokens, struct sfw_err *err);
	/* Forgets every token and zeroes the lightning states. */
	void (*cache_reset)(struct sfw_backend *be, struct sfw_bcache *c);
	/* Tokens currently in the cache (sparse layers all agree). */
	int64_t (*cache_len)(struct sfw_backend *be, const struct sfw_bcache *c, int layer);
	/* (level-1, level-2) compressed keys currently made for a sparse layer. */
	void (*cache_ncompressed)(struct sfw_backend *be, const struct sfw_bcache *c, int layer, int64_t out[2]);

	/* Sparse layer: appends k, v [T, nkv, hd] at the end of layer's cache
	 * (room reserved beforehand). */
	void (*kv_append)(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k, const void *v,
			  int T);
	/* Dense causal GQA over the layer's cache; the call's rows are the last T
	 * tokens of the cache. q, o [T, nh, hd]. */
	void (*attn_dense)(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer, int T,
			   int nh, float scale);
	/* Brings the layer's compressed keys (both levels) up to its cache length. */
	SFW_MUST_CHECK enum sfw_status (*compress)(struct sfw_backend *be, struct sfw_bcache *c, int layer,
						   struct sfw_err *err);
	/* Stage 1 + max-pool + top-k for the call's rows; idx [nkv, T, k] int32 in
	 * backend memory. pooled_last (host, may be NULL) receives the pooled
	 * scores [nkv, nblocks] of the last row (for checks). */
	SFW_MUST_CHECK enum sfw_status (*sparse_select)(struct sfw_backend *be, int32_t *idx, const void *q,
							struct sfw_bcache *c, int layer, int nh,
							const struct sfw_sparse_params *sp, float *pooled_last,
							struct sfw_err *err);
	void (*attn_sparse)(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
			    const int32_t *idx, int nh, const struct sfw_sparse_params *sp);
	/* Lightning layer: simple GLA against the layer's fp32 state; chunked
	 * (chunk 64) when T >= 64, recurrent otherwise (as the reference).
	 * decay: [nh] float slopes in backend memory (alloc + from_host). */
	void (*gla)(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
		    struct sfw_bcache *c, int layer, const float *decay, int T, int nh, int hd, float scale);

	/* 1 when matmul/logits accept SFW_DTYPE_W8 weights; a backend that leaves it
	 * 0 is refused int8 checkpoints at load (runner/model.c). */
	int supports_w8;

	/* ---- optional members (NULL: forward.c takes the plain path) ---- */
	/* Copies bytes between two backend buffers, ordered with the ops (no
	 * host wait): keeps per-step results such as the selected blocks in
	 * backend memory until someone asks for them. */
	void (*copy)(struct sfw_backend *be, void *dst, const void *src, size_t bytes);
	/* Merged projections (docs/performance.md §5.7). Between load_begin and
	 * load_end weight_upload may defer its copy. merge places parts[0..n-1]
	 * (same cols and dtype) as consecutive row ranges of one [sum rows, cols]
	 * matrix in backend memory and points each part's dev into it; *merged
	 * = 1 when it did (0: the parts stay separate, e.g. SALAFW_CUDA_NOMERGE=1).
	 * No weight is held twice. load_end uploads whatever is still deferred.
	 * forward.c sees a merge only through contiguous dev pointers
	 * (sfwi_merged_view) and then runs one matmul over the wide matrix. */
	void (*load_begin)(struct sfw_backend *be);
	SFW_MUST_CHECK enum sfw_status (*merge)(struct sfw_backend *be, struct sfw_bweight *const *parts, int n,
						int *merged, struct sfw_err *err);
	SFW_MUST_CHECK enum sfw_status (*load_end)(struct sfw_backend *be, struct sfw_err *err);
	/* Fused ops; the CPU backend composes the unfused ones.
	 * add_rmsnorm: x += scale * b (rounded as add_scaled), then y = rmsnorm(x). */
	void (*add_rmsnorm)(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			    const struct sfw_bweight *w, int rows, int n, float eps);
	/* qk_norm_rope: the lightning layers' per-head norms and RoPE in place,
	 * q [T, nhq, hd] = rmsnorm(q; qw), k [T, nhk, hd] = rmsnorm(k; kw) (rows
	 * of hd), then, when rope != 0, rope_neox on both from position pos0, or
	 * from *dpos (int64, backend memory, read when the op runs) when dpos is
	 * non-NULL (recorded steps): equal to those four calls. NULL: forward.c
	 * makes the four calls. */
	void (*qk_norm_rope)(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			     const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			     int64_t pos0, const int64_t *dpos, float theta);
	/* Next-token choice from one row of float logits (backend memory), the
	 * meaning of sfw_op_sample_cpu for uniform u; *out (backend memory) = the
	 * id, or -1 when the host must finish with sfw_op_sample_cpu. */
	void (*sample)(struct sfw_backend *be, int32_t *out, const float *logits, int V,
		       const struct sfw_op_sample_params *p, double u);
	/* Decode graphs: graph_begin starts recording the backend's ops instead
	 * of running them, for one-row calls whose position the caller writes to
	 * `pos` (int64, backend memory) before each graph_run; graph_end returns
	 * the recorded sequence (NULL when recording failed: nothing ran, the
	 * caller runs the ops itself); graph_run replays it. A varying position
	 * goes through rope_neox_dev, which reads it from `pos` when the op runs.
	 * An error from graph_begin means nothing is being recorded. */
	SFW_MUST_CHECK enum sfw_status (*graph_begin)(struct sfw_backend *be, struct sfw_bcache *c, const int64_t *pos,
						      int64_t bound, struct sfw_err *err);
	void *(*graph_end)(struct sfw_backend *be);
	void (*graph_run)(struct sfw_backend *be, void *g);
	void (*graph_free)(struct sfw_backend *be, void *g);
	void (*rope_neox_dev)(struct sfw_backend *be, void *x, int T, int nh, int hd, const int64_t *pos, float theta);
	/* Whole-step decode graphs (backends that set cache_advance): while
	 * recording, the sparse-layer ops (kv_append, compress, sparse_select,
	 * attn_sparse, attn_dense) of a one-row call read the row's position
	 * from `pos` when they run, plan their launches for cache lengths up to
	 * `bound` tokens (bound <= cache_room), and leave the host-side cache
	 * counters alone; compress keeps the compressed keys current in either
	 * mode, provided they were current (compress called) before the step.
	 * cache_advance applies a replayed step's T rows to those counters.
	 * mem_epoch changes whenever the backend moves memory a recording may
	 * hold (cache regrowth, selection scratch): the recording is then stale. */
	void (*cache_advance)(struct sfw_backend *be, struct sfw_bcache *c, int T);
	/* A failure the ops could not return (they return void): the CPU ops
	 * whose scratch could not be allocated left their outputs undefined.
	 * SFW_OK, or the error once (then cleared). NULL: ops never fail so. */
	SFW_MUST_CHECK enum sfw_status (*take_failure)(struct sfw_backend *be, struct sfw_err *err);
	int64_t (*cache_room)(struct sfw_backend *be, const struct sfw_bcache *c);
	uint64_t (*mem_epoch)(struct sfw_backend *be, const struct sfw_bcache *c);
	/* Paged KV (runner/batch.h): a pool of `blocks` blocks of d->block
	 * tokens, each holding those tokens' K and V in every sparse layer,
	 * allocated now. Caches made with d->pool set take a free block per
	 * d->block tokens in cache_reserve (SFW_E_NOSPACE "KV pool full" when
	 * none is left; a failed reserve takes none) and give every block back
	 * in cache_reset and cache_free. The ops see each cache's K/V as before:
	 * [len, nkv, hd] at one address (the CPU backend maps the blocks there;
	 * backend_cpu.c). SFW_E_UNSUPPORTED: the shapes do not allow paging
	 * here (the caller keeps caches of their own). pool_used: blocks taken. */
	SFW_MUST_CHECK enum sfw_status (*pool_new)(struct sfw_backend *be, const struct sfw_cache_desc *d,
						   int64_t blocks, struct sfw_bpool **out, struct sfw_err *err);
	void (*pool_free)(struct sfw_backend *be, struct sfw_bpool *p);
	int64_t (*pool_used)(struct sfw_backend *be, const struct sfw_bpool *p);
};

/* The CPU backend; nthreads <= 0 means sfw_default_threads(). */
SFW_MUST_CHECK enum sfw_status sfw_backend_cpu_new(int nthreads, struct sfw_backend **out, struct sfw_err *err);

#ifdef SFW_HAVE_CUDA
/* The CUDA backend (runner/backend_cuda.c) on GPU o->cuda_device. */
SFW_MUST_CHECK enum sfw_status sfw_backend_cuda_new(const struct sfw_backend_opts *o, struct sfw_backend **out,
						    struct sfw_err *err);
#endif

#endif
