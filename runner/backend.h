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
 * Every member is filled by every backend: forward.c calls each op the same
 * way whatever the backend. Fused ops (add+norm, q/k norm+RoPE, gate|up+SiLU,
 * projection groups) are always called; a backend that has no fused kernel
 * composes the unfused ops (runner/backend_compose.c, docs/style.md §13.10).
 * What a backend takes is declared by `supports` (per op and weight dtype),
 * not by NULL members. Decode-step recording (CUDA graphs) is the backend's
 * business: forward.c hands it one step's ops as a function (`step`).
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
	/* Paged KV (backends that support SFW_BOP_POOL): the K and V of the sparse layers
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

/* What `supports` is asked about: an op taking weights of a dtype. */
enum sfw_bop {
	SFW_BOP_MATMUL,  /* matmul, matmul_group, swiglu */
	SFW_BOP_LOGITS,
	SFW_BOP_EMBED,
	SFW_BOP_NORM,    /* rmsnorm, add_rmsnorm, qk_norm_rope weights */
	SFW_BOP_POOL,    /* paged KV (pool_new); dtype ignored */
	SFW_BOP_RECORD,  /* step replays a recording (dtype ignored) */
};

/* One sequence's rows in a forward step: rows [row0, row0 + R) of the
 * step's buffers, at positions pos0 .. pos0 + R - 1 of cache (the *_seqs
 * ops below; runner/forward.c). At most SFW_BSEQ_MAX per call. */
#define SFW_BSEQ_MAX 64
struct sfw_bseq {
	struct sfw_bcache *cache;
	int64_t pos0;
	int row0, R;
};

/* One decode step's ops, issued by forward.c (backend.h, step). */
typedef enum sfw_status (*sfw_step_fn)(void *arg, struct sfw_err *err);
/* A batched step's ops over `rows` rows (be->step_seqs): the step's own n,
 * or a batch-size bucket's rows >= n whose rows from n on are padding. */
typedef enum sfw_status (*sfw_rows_fn)(void *arg, int rows, struct sfw_err *err);

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
	/* y = the group's products over M rows: part i's [M, part[i]->rows] at
	 * element offset M * (the rows of the parts before it). For one row this
	 * is the merged matrix's output row, which a backend may compute so. */
	void (*matmul_group)(struct sfw_backend *be, void *y, const void *x, const struct sfw_bgroup *g, int M);
	/* The MLP's SwiGLU over gu = {gate, up}: y[M, N] = silu(x . gate^T) *
	 * (x . up^T), N = gate rows; tmp [M, 2N] is scratch (matmul_group's
	 * output). Equal to matmul_group then silu_mul. */
	void (*swiglu)(struct sfw_backend *be, void *y, void *tmp, const void *x, const struct sfw_bgroup *gu, int M);
	/* x += scale * b (rounded as add_scaled), then y = rmsnorm(x; w). */
	void (*add_rmsnorm)(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			    const struct sfw_bweight *w, int rows, int n, float eps);
	/* y = rmsnorm(x; w), then y *= sigmoid(z) [rows, n] (y may alias x, not
	 * z): equal to rmsnorm followed by sigmoid_mul. */
	void (*rmsnorm_gate)(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, const void *z,
			     int rows, int n, float eps);
	/* The lightning layers' per-head norms and RoPE in place: q [T, nhq, hd]
	 * = rmsnorm(q; qw), k [T, nhk, hd] = rmsnorm(k; kw) (rows of hd; qw, kw
	 * NULL: no norms), then, when rope != 0, rope_neox on both from pos0:
	 * equal to those four calls. */
	void (*qk_norm_rope)(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			     const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			     int64_t pos0, float theta);
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

	/* ---- the per-sequence ops of a step's sequences, one call per layer ----
	 * Each means its single-cache op above applied to every sequence s[i]
	 * in turn, on rows [s[i].row0, s[i].row0 + s[i].R) of the step's
	 * buffers (q, k, v, o rows of nh * hd elements): qk_norm_rope at the
	 * sequence's positions, gla against its state, kv_append to its cache,
	 * compress of its cache, attn_dense over its cache. A backend with
	 * kernels that take many sequences at once (CUDA: one decode row each)
	 * runs them in one launch; others compose them
	 * (runner/backend_compose.c, sfwi_compose_*_seqs). */
	void (*qk_norm_rope_seqs)(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
				  const struct sfw_bweight *kw, const struct sfw_bseq *s, int ns, int nhq, int nhk,
				  int hd, float eps, int rope, float theta);
	void (*gla_seqs)(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
			 const struct sfw_bseq *s, int ns, int layer, const float *decay, int nh, int hd, float scale);
	void (*kv_append_seqs)(struct sfw_backend *be, const struct sfw_bseq *s, int ns, int layer, const void *k,
			       const void *v, int kvd);
	SFW_MUST_CHECK enum sfw_status (*compress_seqs)(struct sfw_backend *be, const struct sfw_bseq *s, int ns,
							int layer, struct sfw_err *err);
	void (*attn_dense_seqs)(struct sfw_backend *be, void *o, const void *q, const struct sfw_bseq *s, int ns,
				int layer, int nh, int hd, float scale);

	/* 1 when the backend takes op with weights of dtype dt (SFW_DTYPE_W8 for
	 * int8 checkpoints: runner/model.c refuses them at load otherwise). */
	int (*supports)(const struct sfw_backend *be, enum sfw_bop op, enum sfw_dtype dt);
	/* Copies bytes between two backend buffers, ordered with the ops (no
	 * host wait): keeps per-step results such as the selected blocks in
	 * backend memory until someone asks for them. */
	void (*copy)(struct sfw_backend *be, void *dst, const void *src, size_t bytes);
	/* Merged projections (docs/performance.md §5.7). Between load_begin and
	 * load_end weight_upload may defer its copy. merge places parts[0..n-1]
	 * (same cols and dtype) as consecutive row ranges of one [sum rows, cols]
	 * matrix in backend memory and points each part's dev into it; *merged
	 * = 1 when it did (0: the parts stay separate, as on the CPU). No weight
	 * is held twice. load_end uploads whatever is still deferred. */
	void (*load_begin)(struct sfw_backend *be);
	SFW_MUST_CHECK enum sfw_status (*merge)(struct sfw_backend *be, struct sfw_bweight *const *parts, int n,
						int *merged, struct sfw_err *err);
	SFW_MUST_CHECK enum sfw_status (*load_end)(struct sfw_backend *be, struct sfw_err *err);
	/* Next-token choices from rows 0 .. n-1 (n <= SFW_BSEQ_MAX) of float
	 * logits [n, V] (backend memory), each the meaning of sfw_op_sample_cpu
	 * with p[i] and uniform u[i]: out[i] (backend memory) = the id, or -1
	 * when the host must finish with sfw_op_sample_cpu; p[i] NULL: no choice
	 * for row i (out[i] untouched). Returns 0 (out untouched) when this
	 * backend leaves every choice to the host. */
	int (*sample)(struct sfw_backend *be, int32_t *out, const float *logits, int V, int n,
		      const struct sfw_op_sample_params *const *p, const double *u);
	/* One decode step: one row of cache c at position pos, its sparse
	 * layers in mode `sparse` (1: selection, 0: dense). fn(arg) issues the
	 * step's ops. A backend that records steps (supports SFW_BOP_RECORD)
	 * replays the recording it keeps in *rec while that is valid for pos and
	 * sparse, and otherwise makes one first by running fn while recording;
	 * others just run fn. *replayed = 1 when the ops ran from a recording:
	 * fn's host-side code then did not run this time, so whatever it notes
	 * on the host the caller notes itself. If a recording cannot be made,
	 * the backend runs fn directly, and from then on for this *rec.
	 * step_free releases *rec (NULL: a no-op). */
	SFW_MUST_CHECK enum sfw_status (*step)(struct sfw_backend *be, void **rec, struct sfw_bcache *c, int64_t pos,
					       int sparse, sfw_step_fn fn, void *arg, int *replayed,
					       struct sfw_err *err);
	void (*step_free)(struct sfw_backend *be, void *rec);
	/* Makes the recording step() would make for pos and sparse now, without
	 * running it (fn is recorded, not run), so that the step itself only
	 * replays it: a prefill records its first decode step while the GPU
	 * still works on the prompt. Nothing happens where steps are not
	 * recorded, a recording is already valid, or one cannot be made (the
	 * step then does what it would have done). */
	SFW_MUST_CHECK enum sfw_status (*step_record)(struct sfw_backend *be, void **rec, struct sfw_bcache *c,
						      int64_t pos, int sparse, sfw_step_fn fn, void *arg,
						      struct sfw_err *err);
	/* One decode step of n >= 2 sequences, one row each: row i is
	 * caches[i]'s token at pos[i], its sparse layers selecting blocks where
	 * sparse[i] (else dense attention); fn(arg, rows) issues the
	 * step's ops (the *_seqs ops over the n sequences in this order) over
	 * `rows` rows. Run directly, rows = n. A backend that records steps
	 * keeps in *rec one recording per batch-size bucket (2, 4, 8, 16, 32,
	 * 64 rows, at most max_rows: what the caller's buffers hold, >= n),
	 * made by running fn(arg, bucket) while recording once that bucket
	 * has run a few steps directly (backend_cuda.c, STEP_SEQS_STABLE), and
	 * replayed for any n sequences it holds (the rows past n are padding:
	 * they read token ids the caller keeps valid, and their outputs are
	 * garbage) while it covers the positions. A recording of dense-mode rows names no cache:
	 * each replay is told its sequences. One with rows in selection mode
	 * serves only while the same caches sit in those rows, in that mode,
	 * beside any dense ones (the backend keys it so). *replayed as for
	 * step; step_free releases *rec. */
	SFW_MUST_CHECK enum sfw_status (*step_seqs)(struct sfw_backend *be, void **rec, struct sfw_bcache *const *caches,
						    const int64_t *pos, const int *sparse, int n, int max_rows,
						    sfw_rows_fn fn, void *arg, int *replayed, struct sfw_err *err);
	/* A failure the ops could not return (they return void): the CPU ops
	 * whose scratch could not be allocated left their outputs undefined.
	 * SFW_OK, or the error once (then cleared). */
	SFW_MUST_CHECK enum sfw_status (*take_failure)(struct sfw_backend *be, struct sfw_err *err);
	/* Paged KV (runner/batch.h): a pool of `blocks` blocks of d->block
	 * tokens, each holding those tokens' K and V in every sparse layer,
	 * allocated now. Caches made with d->pool set take a free block per
	 * d->block tokens in cache_reserve (SFW_E_NOSPACE "KV pool full" when
	 * none is left; a failed reserve takes none) and give every block back
	 * in cache_reset and cache_free. The ops mean what they mean on a
	 * cache's K/V as [len, nkv, hd] at one address (the CPU backend maps the
	 * blocks there, backend_cpu.c; the CUDA kernels read each cache's block
	 * table, backend_cuda.c). SFW_E_UNSUPPORTED: no paging here (supports
	 * SFW_BOP_POOL is 0) or the shapes do not allow it; the caller keeps
	 * caches of their own. pool_used: blocks taken. */
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
/* Decode steps it has recorded so far (for tests). */
int64_t sfwi_cuda_recordings(const struct sfw_backend *be);
/* Steps of several sequences replayed from a recording (step_seqs), so far. */
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

/* A group's parts offered to be->merge (between load_begin and load_end),
 * then g->merged set from where they landed (sfwi_group_view: the view of
 * one matrix when the parts are consecutive row ranges in backend memory,
 * rows 0 otherwise). */
SFW_MUST_CHECK enum sfw_status sfwi_group_bind(struct sfw_backend *be, struct sfw_bgroup *g, struct sfw_err *err);
void sfwi_group_view(struct sfw_bgroup *g);

/* The compositions a backend without a fused kernel fills its members with
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
/* The weight dtypes of the weight-taking ops (SFW_BOP_MATMUL, LOGITS,
 * EMBED, NORM) as every backend of this tree takes them: bf16 and f32
 * everywhere, int8 (pack-quantized) in the products. 0 for other ops. */
int sfwi_weight_dtype_ok(enum sfw_bop op, enum sfw_dtype dt);
/* step for a backend that does not record: runs fn (*replayed = 0). */
SFW_MUST_CHECK enum sfw_status sfwi_step_direct(struct sfw_backend *be, void **rec, struct sfw_bcache *c,
						int64_t pos, int sparse, sfw_step_fn fn, void *arg, int *replayed,
						struct sfw_err *err);
void sfwi_step_free_none(struct sfw_backend *be, void *rec);
/* step_seqs for a backend that does not record: runs fn (*replayed = 0). */
SFW_MUST_CHECK enum sfw_status sfwi_step_seqs_direct(struct sfw_backend *be, void **rec,
						     struct sfw_bcache *const *caches, const int64_t *pos,
						     const int *sparse, int n, int max_rows, sfw_rows_fn fn, void *arg,
						     int *replayed, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfwi_step_record_none(struct sfw_backend *be, void **rec, struct sfw_bcache *c,
						     int64_t pos, int sparse, sfw_step_fn fn, void *arg,
						     struct sfw_err *err);

#endif
