/* backend.h - the op table that runner/forward.c is written against.
 *
 * One forward pass, several backends: the CPU backend (runner/backend_cpu.c,
 * fp32 activations, weights read in place from the mmap) and a CUDA backend
 * (bf16 activations with the reference's rounding points, weights uploaded
 * into one device arena). forward.c never dereferences an activation: every
 * buffer is an opaque pointer into backend memory, sized in elements of the
 * backend's activation dtype (sfw_be_act_size bytes each), and the only way
 * across is the transfer member. Buffers are plain addresses in the
 * backend's memory space, so (char *)p + i * sfw_be_act_size(be) is element
 * i (forward.c offsets rows this way).
 *
 * The table (name, act, impl and 18 function members) has five groups a
 * reader can name: memory and transfers, weights, caches and the block
 * pool, the ops, steps. Every op goes through one member, op(), with an op
 * kind and its arguments (struct sfw_op); callers use the typed sfw_be_*
 * calls below, which fill one. The caches' bookkeeping is ops too: a
 * layer's counts and addresses (SFW_OP_CACHE_VIEW), a reset
 * (SFW_OP_CACHE_RESET), a sequence's copy (SFW_OP_CACHE_COPY).
 * Optional members are NULL, and the one place that stands in for them is
 * runner/backend_compose.c (sfwi_op, sfwi_step, ...): an op a backend does
 * not take (supports_op, the single way to ask) is composed there from the
 * unfused ops (projection groups, gate|up + SiLU, q/k norm + RoPE, the
 * per-sequence ops; docs/style.md §13.10). What a backend does with a
 * step's ops (CUDA: records decode steps as graphs and replays them) is its
 * own business: forward.c issues the ops between the step's begin and end
 * (member step) and knows nothing of recording.
 *
 * Caches belong to the backend: per sparse layer the K and V of every token
 * [len, nkv, hd], growing in 64-token blocks, and the two levels of
 * compressed keys (paged: in the KV blocks, kernels/ops.h sfw_ckey_row);
 * per lightning layer the fp32 state [nh, hd, hd]. Memory
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
	/* dtype SFW_DTYPE_W8 (compressed-tensors pack-quantized int8, num/w8_layout.h):
	 * host = the codes [rows, ceil(cols/4)*4] bytes (weight_packed), scales =
	 * weight_scale [rows, ceil(cols/group)] in scale_dtype (BF16, F16 or F32),
	 * group = the group size along cols (cols for per-channel). scales_dev is
	 * the backend's copy of the scales (NULL on the CPU). */
	const void *scales;
	enum sfw_dtype scale_dtype;
	int group;
	void *scales_dev;
	/* host (and scales) lie in the model's read-only file map (core/file.h):
	 * a backend that keeps a copy of its own drops their resident pages
	 * once uploaded (sfw_map_release), so the host holds no second model */
	int host_mapped;
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
	int kv8;                     /* the sparse layers' K and V in fp8 (kernels/ops.h; the
				      * CPU backend keeps them in float, rounded as fp8) */
	/* Paged KV (backends that support SFW_OP_POOL): the K and V of the sparse layers
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

/* Projections that read the same input: a layer's q|k|v(|z or o_gate), or
 * gate|up, bound once at load (runner/model.c). merged: when the backend
 * placed the parts as consecutive row ranges of one matrix (be->merge), the
 * view of that matrix (merged.rows = the parts' rows together); rows == 0
 * when they stay separate. */
struct sfw_bgroup {
	struct sfw_bweight *part[4];
	int n;
	struct sfw_bweight merged;
};

/* The ops (member op) and the capabilities supports_op answers for. */
enum sfw_opk {
	SFW_OP_EMBED,
	SFW_OP_RMSNORM,
	SFW_OP_ADD_SCALED,
	SFW_OP_SILU_MUL,
	SFW_OP_SIGMOID_MUL,
	SFW_OP_ROPE,
	SFW_OP_MATMUL,
	SFW_OP_MATMUL_GROUP,    /* composable */
	SFW_OP_SWIGLU,          /* composable */
	SFW_OP_ADD_RMSNORM,
	SFW_OP_RMSNORM_GATE,
	SFW_OP_QK_NORM_ROPE,    /* composable */
	SFW_OP_LOGITS,
	SFW_OP_KV_APPEND,
	SFW_OP_ATTN_DENSE,
	SFW_OP_COMPRESS,
	SFW_OP_SPARSE_SELECT,
	SFW_OP_ATTN_SPARSE,
	SFW_OP_GLA,
	SFW_OP_QK_NORM_ROPE_SEQS, /* composable, as are the four below */
	SFW_OP_GLA_SEQS,
	SFW_OP_KV_APPEND_SEQS,
	SFW_OP_COMPRESS_SEQS,
	SFW_OP_ATTN_DENSE_SEQS,
	SFW_OP_SAMPLE,
	SFW_OP_CACHE_COPY, /* optional, not composable: no fork without it (sfw_be_cache_copy) */
	SFW_OP_CACHE_VIEW,      /* every backend's: not composable */
	SFW_OP_CACHE_RESET,     /* every backend's: not composable */
	SFW_OP_N,
	/* capabilities (supports_op only; dtype ignored) */
	SFW_OP_POOL = SFW_OP_N, /* paged KV (pool_new) */
};

/* One sequence's rows in a forward step: rows [row0, row0 + R) of the
 * step's buffers, at positions pos0 .. pos0 + R - 1 of cache (the *_SEQS
 * ops; runner/forward.c). At most SFW_BSEQ_MAX per call. */
#define SFW_BSEQ_MAX 64
struct sfw_bseq {
	struct sfw_bcache *cache;
	int64_t pos0;
	int row0, R;
};

/* One layer's cache (SFW_OP_CACHE_VIEW): its counts, and its buffers as
 * backend addresses for copies of a whole sequence's state through
 * transfer (runner/ctxstate.c). Sparse layers: len, n1, n2 rows held
 * (tokens, level-1 and level-2 compressed keys) of cap, cap1, cap2, and k,
 * v [cap, nkv, hd] and the compressed keys c1 [cap1, nkv, hd], c2 [cap2,
 * nkv, hd], in activation elements (state NULL); k, v, c1, c2 are NULL
 * where they are not at one address (a paged cache). Lightning layers: the
 * fp32 state [lnh, lhd, lhd] (the others NULL, the counts 0). */
struct sfw_cache_view {
	void *k, *v, *c1, *c2;
	float *state;
	int64_t len, n1, n2, cap, cap1, cap2;
};

/* An op and its arguments: kind names the member of the union that holds
 * them. Meanings: kernels/ops.h, and the sfw_be_* calls below; every
 * buffer, ids included, is a backend pointer. */
struct sfw_op {
	enum sfw_opk kind;
	union {
		struct { void *x; const struct sfw_bweight *E; const int32_t *ids; int T; float scale; } embed;
		/* rmsnorm, and add_rmsnorm (x += scale * b first: x is written), rmsnorm_gate (y *= sigmoid(z)) */
		struct {
			void *y, *x;
			const void *b, *z;
			float scale;
			const struct sfw_bweight *w;
			int rows, n;
			float eps;
		} norm;
		/* add_scaled: x += scale * b; silu_mul: y = silu(a) * b; sigmoid_mul: y = a * sigmoid(b) */
		struct { void *y; const void *a, *b; size_t n; float scale; } ew;
		struct { void *x; int T, nh, hd; int64_t pos0; float theta; } rope;
		/* matmul (w), matmul_group (g), swiglu (g, tmp), logits (w; y float) */
		struct {
			void *y, *tmp;
			const void *x;
			const struct sfw_bweight *w;
			const struct sfw_bgroup *g;
			int M;
			float scale;
		} mm;
		/* qk_norm_rope (pos0, T) and qk_norm_rope_seqs (s, ns) */
		struct {
			void *q, *k;
			const struct sfw_bweight *qw, *kw;
			const struct sfw_bseq *s;
			int ns, T, nhq, nhk, hd;
			float eps;
			int rope;
			int64_t pos0;
			float theta;
		} qk;
		/* the single-cache ops: kv_append (k, v, T), attn_dense (o, q, T,
		 * nh, scale), compress, sparse_select (idx out, q, nh, sp,
		 * pooled_last), attn_sparse (o, q, idx, nh, sp), gla (o, q, k, v,
		 * decay, T, nh, hd, scale) */
		struct {
			struct sfw_bcache *c;
			int layer;
			void *o;
			const void *q, *k, *v;
			int32_t *idx;
			const float *decay;
			int T, nh, hd;
			float scale;
			const struct sfw_sparse_params *sp;
			float *pooled_last;
		} cache;
		/* the per-sequence ops: gla_seqs (o, q, k, v, decay, nh, hd,
		 * scale), kv_append_seqs (k, v, kvd), compress_seqs,
		 * attn_dense_seqs (o, q, nh, hd, scale) */
		struct {
			const struct sfw_bseq *s;
			int ns, layer;
			void *o;
			const void *q, *k, *v;
			const float *decay;
			int nh, hd, kvd;
			float scale;
		} seqs;
		/* next-token choices from rows 0 .. n-1 of float logits [n, V]:
		 * out[i] = the id, or -1 when the host must finish with
		 * sfw_op_sample_cpu; p[i] NULL: no choice for row i */
		struct {
			int32_t *out;
			const float *logits;
			int V, n;
			const struct sfw_op_sample_params *const *p;
			const double *u;
		} sample;
		/* cache_copy: dst becomes a copy of src (sfw_be_cache_copy) */
		struct {
			struct sfw_bcache *dst;
			const struct sfw_bcache *src;
		} copy;
		/* cache_view: *out = layer's view of c; set (may be NULL) first
		 * makes its counts set[0..3) (tokens, level-1, level-2 compressed
		 * keys; sparse layers) */
		struct {
			struct sfw_bcache *c;
			int layer;
			const int64_t *set;
			struct sfw_cache_view *out;
		} view;
		/* cache_reset: c forgets its tokens (sfw_be_cache_reset) */
		struct {
			struct sfw_bcache *c;
		} reset;
	};
};

/* One forward step's ops, bracketed (member step): begin (end = 0) before
 * the step's first op, end (end = 1) after its last, also when an op
 * failed (failed = 1). The step's sequences are n, sequence i's cache
 * caches[i] at position pos[i], its sparse layers selecting blocks where
 * sparse[i]; decode: each has one row, row i, and the step's logits are its
 * rows' in order; rows: the step's rows. What a backend does with a step's
 * ops is its own business (CUDA: records decode steps as graphs and
 * replays them); it keeps what it needs in *state, the caller's slot (one
 * per workspace and kind of step; freed by step_free). It may ask, at
 * begin, for the ops to be issued over more rows than the step has (rows
 * raised, at most max_rows, what the caller's buffers hold: padding rows,
 * whose outputs are garbage), and at end for the step's ops once more
 * (again: it did not run them, and the caller issues them again, begin to
 * end). replayed: the step ran from a recording (for tests). */
struct sfw_step {
	void **state;
	struct sfw_bcache *const *caches;
	const int64_t *pos;
	const int *sparse;
	int n, decode, max_rows;
	int rows;     /* in; begin may raise it */
	int failed;   /* in, at end */
	int again;    /* out, at end */
	int replayed; /* out, at end */
};

/* The transfers (member transfer); n is bytes, or activation elements for
 * the _F32 kinds (activations <-> host float). */
enum sfw_xfer { SFW_XFER_TO_HOST, SFW_XFER_FROM_HOST, SFW_XFER_COPY, SFW_XFER_TO_HOST_F32, SFW_XFER_FROM_HOST_F32 };

struct sfw_backend {
	const char *name;       /* "cpu", "cuda" */
	enum sfw_dtype act;     /* activation dtype (sfw_be_act_size: bytes per element) */
	void *impl;             /* backend private state */
	void (*destroy)(struct sfw_backend *be);

	/* ---- memory and transfers ---- */
	/* Activation / scratch buffers in backend memory; NULL on failure. */
	void *(*alloc)(struct sfw_backend *be, size_t bytes);
	void (*free)(struct sfw_backend *be, void *p);
	/* Ordered with the ops; to the host: the host has the bytes on return. */
	void (*transfer)(struct sfw_backend *be, enum sfw_xfer k, void *dst, const void *src, size_t n);
	/* The failure an op could not return (ops return void: a CPU op whose
	 * scratch could not be allocated left its output undefined): SFW_OK,
	 * or the error once (then cleared); wait: also wait for the device. */
	SFW_MUST_CHECK enum sfw_status (*sync)(struct sfw_backend *be, int wait, struct sfw_err *err);

	/* ---- weights ---- */
	/* Uploads (or, on the CPU, adopts) one weight; fills w->dev. An
	 * uploaded weight lives until the backend is destroyed (there is no
	 * release of one weight). */
	SFW_MUST_CHECK enum sfw_status (*weight_upload)(struct sfw_backend *be, struct sfw_bweight *w,
							struct sfw_err *err);
	/* Merged projections (docs/performance.md §5.7), optional. Between
	 * load(begin) and load(end) weight_upload may defer its copy. merge
	 * places parts[0..n-1] (same cols and dtype) as consecutive row ranges
	 * of one [sum rows, cols] matrix in backend memory and points each
	 * part's dev into it; *merged = 1 when it did. No weight is held twice.
	 * load(end) uploads whatever is still deferred. NULL: no merging. */
	SFW_MUST_CHECK enum sfw_status (*merge)(struct sfw_backend *be, struct sfw_bweight *const *parts, int n,
						int *merged, struct sfw_err *err);
	SFW_MUST_CHECK enum sfw_status (*load)(struct sfw_backend *be, int end, struct sfw_err *err);

	/* ---- caches and the block pool ---- */
	SFW_MUST_CHECK enum sfw_status (*cache_new)(struct sfw_backend *be, const struct sfw_cache_desc *d,
						    struct sfw_bcache **out, struct sfw_err *err);
	void (*cache_free)(struct sfw_backend *be, struct sfw_bcache *c);
	/* Makes room for `tokens` tokens in every sparse layer (rounded up to
	 * whole blocks); never shrinks. */
	SFW_MUST_CHECK enum sfw_status (*cache_reserve)(struct sfw_backend *be, struct sfw_bcache *c,
							int64_t tokens, struct sfw_err *err);
	/* Paged KV (runner/batch.h): a pool of `blocks` blocks of d->block
	 * tokens, each holding those tokens' K and V in every sparse layer,
	 * allocated now. Caches made with d->pool set take a free block per
	 * d->block tokens in cache_reserve (SFW_E_NOSPACE "KV pool full" when
	 * none is left; a failed reserve takes none) and give every block back
	 * in a reset (sfw_be_cache_reset) and cache_free. The ops mean what
	 * they mean on a cache's K/V as [len, nkv, hd] at one address (the CPU
	 * backend maps the blocks there, backend_cpu.c; the CUDA kernels read
	 * each cache's block table, cache_cuda.c). SFW_E_UNSUPPORTED: no paging
	 * here (supports_op SFW_OP_POOL is 0) or the shapes do not allow it; the
	 * caller keeps caches of their own. pool_used: blocks taken. */
	SFW_MUST_CHECK enum sfw_status (*pool_new)(struct sfw_backend *be, const struct sfw_cache_desc *d,
						   int64_t blocks, struct sfw_bpool **out, struct sfw_err *err);
	void (*pool_free)(struct sfw_backend *be, struct sfw_bpool *p);
	int64_t (*pool_used)(struct sfw_backend *be, const struct sfw_bpool *p);

	/* ---- the ops ---- */
	/* Runs one op (struct sfw_op) that supports_op says the backend takes.
	 * SFW_OK, or the failure of an op that can fail (compress, select). */
	SFW_MUST_CHECK enum sfw_status (*op)(struct sfw_backend *be, const struct sfw_op *op, struct sfw_err *err);
	/* 1 when the backend takes op kind k with weights of dtype dt (for ops
	 * with weights; SFW_DTYPE_W8 for int8 checkpoints: runner/model.c
	 * refuses them at load otherwise), or has capability k (SFW_OP_POOL).
	 * An op not taken is composed (runner/backend_compose.c), except
	 * SFW_OP_CACHE_COPY, which has no composition (no fork then). */
	int (*supports_op)(const struct sfw_backend *be, enum sfw_opk k, enum sfw_dtype dt);

	/* ---- steps ---- */
	/* The begin (end = 0) or end (end = 1) of a step's ops (struct
	 * sfw_step), optional: NULL runs the ops as they come. */
	SFW_MUST_CHECK enum sfw_status (*step)(struct sfw_backend *be, struct sfw_step *st, int end,
					       struct sfw_err *err);
	void (*step_free)(struct sfw_backend *be, void *state); /* state NULL: a no-op */
};

static inline size_t sfw_be_act_size(const struct sfw_backend *be)
{
	return be->act == SFW_DTYPE_F32 ? 4 : 2;
}

/* ---- the calls (runner/backend_compose.c stands in for what is absent) ---- */

/* Runs op on be, or its composition when be does not take it. */
SFW_MUST_CHECK enum sfw_status sfwi_op(struct sfw_backend *be, const struct sfw_op *op, struct sfw_err *err);
/* be->step, or (none) nothing to do: the ops run as they come. */
SFW_MUST_CHECK enum sfw_status sfwi_step(struct sfw_backend *be, struct sfw_step *st, int end, struct sfw_err *err);
void sfwi_step_free(struct sfw_backend *be, void *state);
/* be->load, or nothing when be has none. */
SFW_MUST_CHECK enum sfw_status sfwi_load(struct sfw_backend *be, int end, struct sfw_err *err);
/* The failure an op could not return, taken (be->sync without waiting). */
SFW_MUST_CHECK enum sfw_status sfwi_take_failure(struct sfw_backend *be, struct sfw_err *err);

static inline void sfw_be_to_host(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	be->transfer(be, SFW_XFER_TO_HOST, dst, src, bytes);
}
static inline void sfw_be_from_host(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	be->transfer(be, SFW_XFER_FROM_HOST, dst, src, bytes);
}
/* Copies bytes between two backend buffers, ordered with the ops (no host
 * wait): keeps per-step results such as the selected blocks in backend
 * memory until someone asks for them. */
static inline void sfw_be_copy(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	be->transfer(be, SFW_XFER_COPY, dst, src, bytes);
}
/* n activation elements at src + off elements -> host float. */
static inline void sfw_be_to_host_f32(struct sfw_backend *be, float *dst, const void *src, size_t off, size_t n)
{
	be->transfer(be, SFW_XFER_TO_HOST_F32, dst, (const char *)src + off * sfw_be_act_size(be), n);
}
/* host float -> n activation elements at dst. */
static inline void sfw_be_from_host_f32(struct sfw_backend *be, void *dst, const float *src, size_t n)
{
	be->transfer(be, SFW_XFER_FROM_HOST_F32, dst, src, n);
}
/* Waits for every op queued so far (a failure it reports is logged). */
void sfw_be_wait(struct sfw_backend *be);
/* A layer's counts (SFW_OP_CACHE_VIEW without set, which every cache
 * answers: it cannot fail for a layer of c). */
static inline struct sfw_cache_view sfwi_cache_counts(struct sfw_backend *be, const struct sfw_bcache *c,
						      int layer)
{
	struct sfw_cache_view v;
	struct sfw_op op = {.kind = SFW_OP_CACHE_VIEW,
			    .view = {(struct sfw_bcache *)(uintptr_t)c, layer, NULL, &v}};
	enum sfw_status s = sfwi_op(be, &op, NULL);
	SFW_ASSERT(s == SFW_OK);
	return v;
}
/* A sparse layer's tokens (every sparse layer agrees). */
static inline int64_t sfw_be_cache_len(struct sfw_backend *be, const struct sfw_bcache *c, int layer)
{
	return sfwi_cache_counts(be, c, layer).len;
}
/* (level-1, level-2) compressed keys currently made for a sparse layer. */
static inline void sfw_be_cache_ncompressed(struct sfw_backend *be, const struct sfw_bcache *c, int layer,
					    int64_t out[2])
{
	struct sfw_cache_view v = sfwi_cache_counts(be, c, layer);
	out[0] = v.n1, out[1] = v.n2;
}

/* The ops, one call each (meaning: kernels/ops.h). The ops that cannot fail
 * return nothing. */
static inline void sfwi_op_void(struct sfw_backend *be, const struct sfw_op *op)
{
	enum sfw_status s = sfwi_op(be, op, NULL);
	(void)s; /* cannot fail: a CPU op's scratch failure is reported by sync */
}
static inline void sfw_be_embed(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids,
				int T, float scale)
{
	struct sfw_op op = {.kind = SFW_OP_EMBED, .embed = {x, E, ids, T, scale}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_rmsnorm(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w,
				  int rows, int n, float eps)
{
	struct sfw_op op = {.kind = SFW_OP_RMSNORM, .norm = {y, (void *)(uintptr_t)x, NULL, NULL, 0, w, rows, n, eps}};
	sfwi_op_void(be, &op);
}
/* x += scale * b (rounded as add_scaled), then y = rmsnorm(x; w). */
static inline void sfw_be_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
				      const struct sfw_bweight *w, int rows, int n, float eps)
{
	struct sfw_op op = {.kind = SFW_OP_ADD_RMSNORM, .norm = {y, x, b, NULL, scale, w, rows, n, eps}};
	sfwi_op_void(be, &op);
}
/* y = rmsnorm(x; w), then y *= sigmoid(z) [rows, n] (y may alias x, not z). */
static inline void sfw_be_rmsnorm_gate(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w,
				       const void *z, int rows, int n, float eps)
{
	struct sfw_op op = {.kind = SFW_OP_RMSNORM_GATE,
			    .norm = {y, (void *)(uintptr_t)x, NULL, z, 0, w, rows, n, eps}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_add_scaled(struct sfw_backend *be, void *x, const void *b, size_t n, float scale)
{
	struct sfw_op op = {.kind = SFW_OP_ADD_SCALED, .ew = {x, x, b, n, scale}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_silu_mul(struct sfw_backend *be, void *y, const void *gate, const void *up, size_t n)
{
	struct sfw_op op = {.kind = SFW_OP_SILU_MUL, .ew = {y, gate, up, n, 0}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_sigmoid_mul(struct sfw_backend *be, void *y, const void *x, const void *gate, size_t n)
{
	struct sfw_op op = {.kind = SFW_OP_SIGMOID_MUL, .ew = {y, x, gate, n, 0}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_rope_neox(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0,
				    float theta)
{
	struct sfw_op op = {.kind = SFW_OP_ROPE, .rope = {x, T, nh, hd, pos0, theta}};
	sfwi_op_void(be, &op);
}
/* y[M, W.rows] = x[M, W.cols] . W^T */
static inline void sfw_be_matmul(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M)
{
	struct sfw_op op = {.kind = SFW_OP_MATMUL, .mm = {y, NULL, x, w, NULL, M, 0}};
	sfwi_op_void(be, &op);
}
/* y = the group's products over M rows: part i's [M, part[i]->rows] at
 * element offset M * (the rows of the parts before it). For one row this
 * is the merged matrix's output row, which a backend may compute so. */
static inline void sfw_be_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g,
				       int M)
{
	struct sfw_op op = {.kind = SFW_OP_MATMUL_GROUP, .mm = {y, NULL, x, NULL, g, M, 0}};
	sfwi_op_void(be, &op);
}
/* The MLP's SwiGLU over gu = {gate, up}: y[M, N] = silu(x . gate^T) *
 * (x . up^T), N = gate rows; tmp [M, 2N] is scratch (matmul_group's
 * output). Equal to matmul_group then silu_mul. */
static inline void sfw_be_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x,
				 const struct sfw_bgroup *gu, int M)
{
	struct sfw_op op = {.kind = SFW_OP_SWIGLU, .mm = {y, tmp, x, NULL, gu, M, 0}};
	sfwi_op_void(be, &op);
}
/* logits are always float32 (host-readable through sfw_be_to_host) */
static inline void sfw_be_logits(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
				 float in_scale)
{
	struct sfw_op op = {.kind = SFW_OP_LOGITS, .mm = {y, NULL, x, w, NULL, M, in_scale}};
	sfwi_op_void(be, &op);
}
/* The lightning layers' per-head norms and RoPE in place: q [T, nhq, hd]
 * = rmsnorm(q; qw), k [T, nhk, hd] = rmsnorm(k; kw) (rows of hd; qw, kw
 * NULL: no norms), then, when rope != 0, rope_neox on both from pos0:
 * equal to those four calls. */
static inline void sfw_be_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				       const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
				       int64_t pos0, float theta)
{
	struct sfw_op op = {.kind = SFW_OP_QK_NORM_ROPE,
			    .qk = {q, k, qw, kw, NULL, 0, T, nhq, nhk, hd, eps, rope, pos0, theta}};
	sfwi_op_void(be, &op);
}
/* Sparse layer: appends k, v [T, nkv, hd] at the end of layer's cache
 * (room reserved beforehand). */
static inline void sfw_be_kv_append(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k,
				    const void *v, int T)
{
	struct sfw_op op = {.kind = SFW_OP_KV_APPEND, .cache = {.c = c, .layer = layer, .k = k, .v = v, .T = T}};
	sfwi_op_void(be, &op);
}
/* Dense causal GQA over the layer's cache; the call's rows are the last T
 * tokens of the cache. q, o [T, nh, hd]. */
static inline void sfw_be_attn_dense(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
				     int T, int nh, float scale)
{
	struct sfw_op op = {.kind = SFW_OP_ATTN_DENSE,
			    .cache = {.c = c, .layer = layer, .o = o, .q = q, .T = T, .nh = nh, .scale = scale}};
	sfwi_op_void(be, &op);
}
/* Brings the layer's compressed keys (both levels) up to its cache length. */
static inline SFW_MUST_CHECK enum sfw_status sfw_be_compress(struct sfw_backend *be, struct sfw_bcache *c, int layer,
							     struct sfw_err *err)
{
	struct sfw_op op = {.kind = SFW_OP_COMPRESS, .cache = {.c = c, .layer = layer}};
	return sfwi_op(be, &op, err);
}
/* Stage 1 + max-pool + top-k for the call's rows; idx [nkv, T, k] int32 in
 * backend memory. pooled_last (host, may be NULL) receives the pooled
 * scores [nkv, nblocks] of the last row (for checks). */
static inline SFW_MUST_CHECK enum sfw_status sfw_be_sparse_select(struct sfw_backend *be, int32_t *idx,
								  const void *q, struct sfw_bcache *c, int layer,
								  int nh, const struct sfw_sparse_params *sp,
								  float *pooled_last, struct sfw_err *err)
{
	struct sfw_op op = {.kind = SFW_OP_SPARSE_SELECT,
			    .cache = {.c = c, .layer = layer, .q = q, .idx = idx, .nh = nh, .sp = sp,
				      .pooled_last = pooled_last}};
	return sfwi_op(be, &op, err);
}
static inline void sfw_be_attn_sparse(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c,
				      int layer, const int32_t *idx, int nh, const struct sfw_sparse_params *sp)
{
	struct sfw_op op = {.kind = SFW_OP_ATTN_SPARSE,
			    .cache = {.c = c, .layer = layer, .o = o, .q = q, .idx = (int32_t *)(uintptr_t)idx, .nh = nh,
				      .sp = sp}};
	sfwi_op_void(be, &op);
}
/* Lightning layer: simple GLA against the layer's fp32 state; chunked
 * (chunk 64) when T >= 64, recurrent otherwise (as the reference).
 * decay: [nh] float slopes in backend memory. */
static inline void sfw_be_gla(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			      struct sfw_bcache *c, int layer, const float *decay, int T, int nh, int hd, float scale)
{
	struct sfw_op op = {.kind = SFW_OP_GLA,
			    .cache = {.c = c, .layer = layer, .o = o, .q = q, .k = k, .v = v, .decay = decay, .T = T,
				      .nh = nh, .hd = hd, .scale = scale}};
	sfwi_op_void(be, &op);
}
/* The per-sequence ops of a step's sequences, one call per layer: each
 * means its single-cache op above applied to every sequence s[i] in turn,
 * on rows [s[i].row0, s[i].row0 + s[i].R) of the step's buffers (q, k, v, o
 * rows of nh * hd elements): qk_norm_rope at the sequence's positions, gla
 * against its state, kv_append to its cache, compress of its cache,
 * attn_dense over its cache. A backend with kernels that take many
 * sequences at once (CUDA: one decode row each) runs them in one launch. */
static inline void sfw_be_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
					    const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq,
					    int nhk, int hd, float eps, int rope, float theta)
{
	struct sfw_op op = {.kind = SFW_OP_QK_NORM_ROPE_SEQS,
			    .qk = {q, k, qw, kw, s, ns, 0, nhq, nhk, hd, eps, rope, 0, theta}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
				   const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd,
				   float scale)
{
	struct sfw_op op = {.kind = SFW_OP_GLA_SEQS, .seqs = {s, ns, layer, o, q, k, v, decay, nh, hd, 0, scale}};
	sfwi_op_void(be, &op);
}
static inline void sfw_be_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer,
					 const void *k, const void *v, int kvd)
{
	struct sfw_op op = {.kind = SFW_OP_KV_APPEND_SEQS,
			    .seqs = {.s = s, .ns = ns, .layer = layer, .k = k, .v = v, .kvd = kvd}};
	sfwi_op_void(be, &op);
}
static inline SFW_MUST_CHECK enum sfw_status sfw_be_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s,
								  int ns, int layer, struct sfw_err *err)
{
	struct sfw_op op = {.kind = SFW_OP_COMPRESS_SEQS, .seqs = {.s = s, .ns = ns, .layer = layer}};
	return sfwi_op(be, &op, err);
}
static inline void sfw_be_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s,
					  int ns, int layer, int nh, int hd, float scale)
{
	struct sfw_op op = {.kind = SFW_OP_ATTN_DENSE_SEQS,
			    .seqs = {.s = s, .ns = ns, .layer = layer, .o = o, .q = q, .nh = nh, .hd = hd, .scale = scale}};
	sfwi_op_void(be, &op);
}
/* Next-token choices from rows 0 .. n-1 (n <= SFW_BSEQ_MAX) of float
 * logits [n, V] (backend memory), each the meaning of sfw_op_sample_cpu
 * with p[i] and uniform u[i]: out[i] (backend memory) = the id, or -1
 * when the host must finish with sfw_op_sample_cpu; p[i] NULL: no choice
 * for row i (out[i] untouched). Returns 0 (out untouched) when this
 * backend leaves every choice to the host (supports_op SFW_OP_SAMPLE). */
static inline int sfw_be_sample(struct sfw_backend *be, int32_t *out, const float *logits, int V, int n,
				const struct sfw_op_sample_params *const *p, const double *u)
{
	if (!be->supports_op(be, SFW_OP_SAMPLE, SFW_DTYPE_F32))
		return 0;
	struct sfw_op op = {.kind = SFW_OP_SAMPLE, .sample = {out, logits, V, n, p, u}};
	sfwi_op_void(be, &op);
	return 1;
}

/* A sequence's fork (runner/batch.h sfw_batch_seq_fork): dst, an empty
 * cache of the same shapes (made from the same struct sfw_cache_desc,
 * paged from the same pool or not), becomes an exact copy of src: every
 * sparse layer's K and V of src's tokens, both levels of compressed keys
 * and their counts, every lightning layer's state; then the ops give on dst
 * what they give on src, bit for bit. Paged (dst holds no blocks): dst
 * shares src's whole blocks with the compressed keys they hold, by
 * reference (the pool counts their holders
 * and frees a block when the last lets go; a whole block is never written
 * again, as tokens are only appended), and takes a free block for src's
 * last, partial one, whose tokens are copied (SFW_E_NOSPACE "KV pool full"
 * when there is none: nothing changed). Not paged: dst has room reserved
 * (cache_reserve) for src's tokens, and they are copied. Ordered with the
 * ops, in backend memory (CUDA: device-to-device copies on the backend's
 * stream, no host round trip); src is unchanged. SFW_E_UNSUPPORTED when the
 * backend does not take SFW_OP_CACHE_COPY (supports_op): nothing is
 * composed for it. A cache view (SFW_OP_CACHE_VIEW) writes only caches
 * whose blocks are their own (runner/ctxstate.c loads into an emptied
 * sequence). */
static inline SFW_MUST_CHECK enum sfw_status sfw_be_cache_copy(struct sfw_backend *be, struct sfw_bcache *dst,
							       const struct sfw_bcache *src, struct sfw_err *err)
{
	if (!be->supports_op(be, SFW_OP_CACHE_COPY, SFW_DTYPE_F32))
		return sfw_fail(err, SFW_E_UNSUPPORTED, "the %s backend cannot copy a sequence's caches", be->name);
	struct sfw_op op = {.kind = SFW_OP_CACHE_COPY, .copy = {dst, src}};
	return sfwi_op(be, &op, err);
}

/* For backends' SFW_OP_CACHE_VIEW: a sparse layer's counts set[0..3)
 * checked against its room (cap, cap1, cap2), SFW_E_RANGE past it. */
static inline SFW_MUST_CHECK enum sfw_status sfwi_cache_counts_fit(const int64_t *set, int64_t cap, int64_t cap1,
								   int64_t cap2, struct sfw_err *err)
{
	if (set[0] < 0 || set[0] > cap || set[1] < 0 || set[1] > cap1 || set[2] < 0 || set[2] > cap2)
		return sfw_fail(err, SFW_E_RANGE, "cache counts (%lld, %lld, %lld) past the room reserved",
				(long long)set[0], (long long)set[1], (long long)set[2]);
	return SFW_OK;
}

/* A layer's cache (struct sfw_cache_view), after making its counts
 * set[0..3) when set is not NULL: each within its capacity (room reserved
 * with cache_reserve), else SFW_E_RANGE and nothing changed. Every cache
 * gives its counts; a paged cache (d->pool) gives no buffers (k, v, c1, c2
 * NULL: its K/V are not at one address on every backend) and refuses set
 * (SFW_E_UNSUPPORTED "a paged KV cache has no view"). The counts change
 * nothing in backend memory: a caller that sets them has written
 * (transfer) what they count. */
static inline SFW_MUST_CHECK enum sfw_status sfw_be_cache_view(struct sfw_backend *be, struct sfw_bcache *c, int layer,
							       const int64_t *set, struct sfw_cache_view *out,
							       struct sfw_err *err)
{
	struct sfw_op op = {.kind = SFW_OP_CACHE_VIEW, .view = {c, layer, set, out}};
	return sfwi_op(be, &op, err);
}

/* c forgets every token (and the compressed keys) and its lightning
 * states are zeroed, ordered with the ops: SFW_OP_CACHE_RESET, every
 * backend's, which cannot fail. Its room stays reserved, except a paged
 * cache's: it lets go of its blocks (each back to the pool when no other
 * cache holds it). */
static inline void sfw_be_cache_reset(struct sfw_backend *be, struct sfw_bcache *c)
{
	struct sfw_op op = {.kind = SFW_OP_CACHE_RESET, .reset = {c}};
	enum sfw_status s = sfwi_op(be, &op, NULL);
	SFW_ASSERT(s == SFW_OK);
}

/* The CPU backend; nthreads <= 0 means sfw_default_threads(). */
SFW_MUST_CHECK enum sfw_status sfw_backend_cpu_new(int nthreads, struct sfw_backend **out, struct sfw_err *err);

#ifdef SFW_HAVE_CUDA
/* The CUDA backend (runner/backend_cuda.c) on GPU o->cuda_device. */
SFW_MUST_CHECK enum sfw_status sfw_backend_cuda_new(const struct sfw_backend_opts *o, struct sfw_backend **out,
						    struct sfw_err *err);
/* Decode steps it has recorded so far (for tests). */
int64_t sfwi_cuda_recordings(const struct sfw_backend *be);
/* Steps of several sequences replayed from a recording (be->step), so far. */
int64_t sfwi_cuda_seqs_replays(const struct sfw_backend *be);
#endif

/* The backends this build has, in the order SFW_DEVICE_AUTO tries them
 * (runner/backends.c): CUDA first when built with it, the CPU last. */
struct sfw_backend_entry {
	enum sfw_device device;
	const char *name;
	SFW_MUST_CHECK enum sfw_status (*create)(const struct sfw_model_params *p, struct sfw_backend **out,
						 struct sfw_err *err);
};
const struct sfw_backend_entry *sfw_backend_list(int *n);

/* A group's parts offered to be->merge (between load(begin) and load(end)),
 * then g->merged set from where they landed (sfwi_group_view: the view of
 * one matrix when the parts are consecutive row ranges in backend memory,
 * rows 0 otherwise). */
SFW_MUST_CHECK enum sfw_status sfwi_group_bind(struct sfw_backend *be, struct sfw_bgroup *g, struct sfw_err *err);
void sfwi_group_view(struct sfw_bgroup *g);

/* The compositions sfwi_op runs for an op a backend does not take, which
 * a backend may also call for shapes its kernels do not take
 * (runner/backend_compose.c): each is the unfused ops of this table. */
void sfwi_compose_matmul_group(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M);
void sfwi_compose_swiglu(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu,
			 int M);
void sfwi_compose_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			       const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			       int64_t pos0, float theta);
/* The *_seqs members as their single-cache ops, sequence by sequence. */
void sfwi_compose_qk_norm_rope_seqs(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				    const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk,
				    int hd, float eps, int rope, float theta);
void sfwi_compose_gla_seqs(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			   const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale);
void sfwi_compose_kv_append_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
				 const void *v, int kvd);
SFW_MUST_CHECK enum sfw_status sfwi_compose_compress_seqs(struct sfw_backend *be, const struct sfw_bseq *s, int ns,
							  int layer, struct sfw_err *err);
void sfwi_compose_attn_dense_seqs(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
				  int layer, int nh, int hd, float scale);
/* The weight dtypes of the weight-taking ops (SFW_OP_MATMUL and the other
 * products, SFW_OP_LOGITS, SFW_OP_EMBED, the norms) as every backend of
 * this tree takes them: bf16 and f32 everywhere, int8 (pack-quantized) in
 * the products. 1 for the ops without weights. */
int sfwi_weight_dtype_ok(enum sfw_opk op, enum sfw_dtype dt);

#endif
