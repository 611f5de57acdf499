/* ops_cuda.h - the CUDA runtime seen from plain C (CUDA=1 builds only).
 *
 * runner/ *_cuda.c and tests/ gpu_ *.c are compiled by the C compiler without
 * the CUDA headers, so every CUDA runtime / cuBLASLt call lives in
 * the kernels/ .cu files behind these functions. Streams, events and graphs travel as
 * opaque pointers (a cudaStream_t is a pointer). Device pointers are plain
 * void * into device memory; bf16 tensors are uint16_t bit patterns, the same
 * as on the CPU.
 *
 * Failure kinds (docs/style.md §13.4): out-of-memory and similar recoverable errors
 * return SFW_E_CUDA with a message; asynchronous faults abort through
 * SFW_CUDA_CHECK inside the .cu files. */
#ifndef SFW_OPS_CUDA_H
#define SFW_OPS_CUDA_H

#include "kernels/ops.h" /* enum sfw_dtype */
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

struct sfw_cuda_info {
	char name[256];
	int device;
	int cc_major, cc_minor;
	int sm_count;
	size_t total_mem, free_mem;
	int l2_bytes;
	size_t smem_optin; /* max dynamic shared memory per block after opt-in */
};

/* Selects the device and fills info. SFW_E_CUDA when there is no usable GPU. */
SFW_MUST_CHECK enum sfw_status sfw_cuda_init(int device, struct sfw_cuda_info *info, struct sfw_err *err);

/* Streams (non-blocking), events, synchronisation. */
SFW_MUST_CHECK enum sfw_status sfw_cuda_stream_new(void **stream, struct sfw_err *err);
void sfw_cuda_stream_free(void *stream);
void sfw_cuda_sync(void *stream); /* aborts on an asynchronous fault */
void *sfw_cuda_event_new(void);
void sfw_cuda_event_free(void *ev);
void sfw_cuda_event_record(void *ev, void *stream);
float sfw_cuda_event_ms(void *start, void *end); /* waits for end */

/* Plain device allocations (used for the arenas; nothing allocates per tensor).
 * Every successful allocation is counted for sfw_cuda_mem_stats. */
SFW_MUST_CHECK enum sfw_status sfw_cuda_malloc(void **p, size_t bytes, const char *what, struct sfw_err *err);
void sfw_cuda_free(void *p);
/* bytes currently allocated through sfw_cuda_malloc, and their high-water mark;
 * device_used = total - free as the driver reports it (context included). */
void sfw_cuda_mem_stats(size_t *live, size_t *peak, size_t *device_used);
/* The driver's free and total device memory now. */
void sfw_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Starts a new high-water mark (both figures) at the current level. */
void sfw_cuda_mem_reset_peak(void);

/* One cudaMalloc carved into aligned pieces; released as a whole. */
struct sfw_cuda_arena {
	unsigned char *base;
	size_t size, used;
};
SFW_MUST_CHECK enum sfw_status sfw_cuda_arena_new(struct sfw_cuda_arena *a, size_t bytes, const char *what,
						  struct sfw_err *err);
/* NULL when the arena is full (the caller planned the size: a bug). */
void *sfw_cuda_arena_take(struct sfw_cuda_arena *a, size_t bytes);
void sfw_cuda_arena_release(struct sfw_cuda_arena *a);
/* Rounds a size up the way sfw_cuda_arena_take does (for planning). */
size_t sfw_cuda_arena_round(size_t bytes);

/* Copies; the async ones are ordered on stream (host memory need not be pinned;
 * then the copy is synchronous with respect to the host). */
void sfw_cuda_h2d(void *dst, const void *src, size_t n, void *stream);
void sfw_cuda_d2h(void *dst, const void *src, size_t n, void *stream);
void sfw_cuda_d2d(void *dst, const void *src, size_t n, void *stream);
/* height rows of width bytes, row r at src + r * spitch to dst + r * dpitch
 * (device to device, one copy on stream; pitches within the device's
 * limit, at most INT32_MAX here). */
void sfw_cuda_d2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
		     void *stream);
void sfw_cuda_memset(void *dst, int byte, size_t n, void *stream);

/* Graph capture of everything queued on stream between begin and end. */
void sfw_cuda_graph_begin(void *stream);
SFW_MUST_CHECK enum sfw_status sfw_cuda_graph_end(void *stream, void **graph_exec, struct sfw_err *err);
void sfw_cuda_graph_launch(void *graph_exec, void *stream);
void sfw_cuda_graph_free(void *graph_exec);

/* ---- the ops of one sequence's rows, as the engine calls them ----
 * One entry per op, in one form. Each means its sfw_op_*_cuda twin
 * (kernels/ops.h) on the call's rows at positions *rr->pos, *rr->pos + 1,
 * ... (struct sfw_cuda_rowref, below: device memory, read when the kernel
 * runs), and where rr has them the caches' pointers and block table too
 * (else the arguments'). The twins, and the engine's unrecorded steps,
 * write their host position there (sfw_cuda_ctx_pos); a recorded step
 * (runner/capture_cuda.c) reads its row's from the slots written before
 * each replay, so it serves whatever position and sequence its row holds.
 * The host values only bound the launch: pos0 (attention) or the chunk
 * and block counts (selection) are at least those the rows reach (a
 * recording's: those of the largest length it serves), which sizes grids,
 * split counts and scratch; the kernels work at the actual lengths.
 *   The caches may be paged: the K and V of a paged cache live in blocks
 * of 2^shift tokens drawn from one pool: token t of the cache is row
 * (tab[t >> shift] << shift) + (t & (2^shift - 1)) of the pool's [blocks
 * << shift, nkv, hd] arrays kc, vc; tab (device memory, int32) is the
 * cache's block table (struct sfw_pages, kernels/ops.h). pg NULL or
 * pg->tab NULL is a contiguous cache (row t at t). shift >= 5 (a 32-token
 * attention tile never straddles two blocks). The compressed keys of a
 * paged cache live in the same blocks (sfw_ckey_row, kernels/ops.h): c1 and
 * c2 are then the level-1 and level-2 bases of the pool's compressed-key
 * array, paged by the same table. */
/* A sparse layer's K and V caches [len, nkv, hd] (device memory), or with
 * pg the pool's arrays they are paged in; K and V as the attentions,
 * kv_write and compress (its keys: kc) read or write them. kv8: the caches
 * are fp8 (kernels/ops.h, "the fp8 KV cache": codes and a scale per token
 * and head, in groups of 32 rows), else in the activation dtype. */
struct sfw_cuda_kv {
	void *kc, *vc;
	const struct sfw_pages *pg;
	int kv8;
};
/* Where a call's rows are, read on the device when the kernel runs: the
 * position of its first row, and (non-NULL members) its caches' pointers
 * and block table from slots written before each replay (the step table
 * and pointer table of a step of several sequences), so a recording whose
 * rows select blocks serves whatever sequences sit in those rows. NULL
 * members: the arguments themselves (with tab: pg gives the blocks' size).
 * Selection (stage 1, pooling, top-k) also reads off and len: row r is the
 * token at *pos + off + r of a cache of *pos + len tokens, which gives the
 * call's chunk and block counts (a decode row: off 0, len 1; the rows of a
 * longer call taken in batches: each batch's off, the call's len). */
struct sfw_cuda_rowref {
	const int64_t *pos; /* required */
	void *const *k, *const *v, *const *c1, *const *c2;
	const int32_t *const *tab;
	int64_t off, len;
};
/* NeoX RoPE (sfw_op_rope_neox_cuda). */
void sfw_cuda_rope_neox(void *x, int T, int nh, int hd, float theta, const struct sfw_cuda_rowref *rr,
			enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* The lightning layers' q/k norms and RoPE (sfw_op_qk_norm_rope_cuda). */
void sfw_cuda_qk_norm_rope(void *q, void *k, const void *qw, const void *kw, const struct sfw_qk_shape *sh,
			   const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* T rows of k and v ([T, nkv, hd] in act) to the caches' rows of tokens
 * *rr->pos .. *rr->pos + T - 1 (sfw_backend kv_append; the caches as given:
 * rr->pos only): copied, or for an fp8 pair quantized (sfw_op_kv8_write_cpu
 * its twin). */
void sfw_cuda_kv_write(const struct sfw_cuda_kv *kv, const void *k, const void *v, int nkv, int hd, int T,
		       const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* The compressed keys of both levels (sfw_op_compress_cuda) from the keys
 * kv->kc (sh's nkv, hd, ksize, stride; with kv->kv8 fp8, read as
 * sfw_op_kv8_read_cpu reads them; c1, c2 in act) that the sh->T tokens at
 * *rr->pos .. complete: level-1 chunks [nchunks(p), nchunks(p + T)) into
 * c1, level 2's into c2 (paged by kv->pg as the keys are: the chunks in the
 * blocks that hold their last tokens); rr->pos only. */
void sfw_cuda_compress(void *c1, void *c2, const struct sfw_cuda_kv *kv, const struct sfw_sel_shape *sh,
		       const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* Stage 1 (sfw_op_stage1_cuda; pg: the cache's pages, whose blocks hold
 * its compressed keys, or NULL); c1, c2 and the table from rr's slots where
 * it has them; sh's n1 and n2 bound the counts rr's length makes (the
 * scores are packed at those: [nkv, T, n1]). */
void sfw_cuda_stage1(float *scores, const void *q, const void *c1, const void *c2,
		     const struct sfw_sel_shape *sh, const struct sfw_pages *pg, const struct sfw_cuda_rowref *rr,
		     enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* Stage 1 and the max-pool in one pass (sfw_cuda_stage1 then
 * sfw_cuda_pool_blocks, equal pooled values; no scores written): returns 1
 * when it ran, 0 when it cannot take the call; then the caller runs the
 * two. pooled as sfw_cuda_pool_blocks's. sfw_cuda_stage1_pools says
 * whether it takes sh (a prefill's rows, bf16, tensor cores, blocks of 4
 * strides and chunks of 2): 0 if not, else the rows one wave of its
 * launch holds on this device (calls of a multiple of them fill it). */
int sfw_cuda_stage1_pools(const struct sfw_sel_shape *sh, enum sfw_dtype act, const struct sfw_cuda_ctx *cx);
int sfw_cuda_stage1_pool(float *pooled, const void *q, const void *c1, const void *c2,
			 const struct sfw_sel_shape *sh, const struct sfw_pages *pg, const struct sfw_cuda_rowref *rr,
			 enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* Max-pool (sfw_op_pool_blocks_cuda) and top-k (sfw_op_topk_blocks_cuda);
 * sh's n1 and nblocks bound the counts rr's length makes; the scores and
 * pooled values packed at those ([nkv, T, n1], [nkv, T, nblocks]). */
void sfw_cuda_pool_blocks(float *pooled, const float *scores, const struct sfw_sel_shape *sh,
			  const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_cuda_topk_blocks(int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh,
			  const struct sfw_cuda_rowref *rr, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* sfw_cuda_pool_blocks then sfw_cuda_topk_blocks, from the level-1
 * scores (no pooled array written): equal idx. Reads sh's T, nkv, ksize,
 * stride, block, init_blocks, local_blocks, nblocks and topk. Each block is
 * pooled once where the rows' keys fit in shared memory
 * (sfw_cuda_pool_topk_fits: a row's nblocks; a decode step's few rows split
 * into parts of 1,024 blocks and fit far longer); longer rows are right
 * too, but pool every block once per pass (six). The split form uses the
 * context's scratch. */
void sfw_cuda_pool_topk(int32_t *idx, const float *scores, const struct sfw_sel_shape *sh,
			const struct sfw_cuda_rowref *rr, struct sfw_cuda_ctx *cx);
int sfw_cuda_pool_topk_fits(const struct sfw_sel_shape *sh, const struct sfw_cuda_ctx *cx);
/* Dense (sfw_op_attn_dense_cuda) and sparse (sfw_op_attn_sparse_cuda)
 * attention over kv (either kind: kv->kv8; an fp8 cache means its values
 * as sfw_op_kv8_read_cpu reads them); sh's pos0 + T bounds the cache
 * length; K, V and the table from rr's slots where it has them. */
void sfw_cuda_attn_dense(void *o, const void *q, const struct sfw_cuda_kv *kv,
			 const struct sfw_attn_shape *sh, const struct sfw_cuda_rowref *rr,
			 enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_cuda_attn_sparse(void *o, const void *q, const struct sfw_cuda_kv *kv, const int32_t *idx,
			  const struct sfw_attn_shape *sh, const struct sfw_cuda_rowref *rr,
			  enum sfw_dtype act, struct sfw_cuda_ctx *cx);

/* ---- a batched decode step: one row per sequence ----
 * Sequence i of a call's table sits in row st->row[i] of its q, k, v, o;
 * its token is at position st->pos[i] (the row it appends: its cache then
 * holds pos[i] + 1 tokens) and its caches are pointers of the pointer
 * table. Each op means its single-sequence twin (sfw_op_*_cuda with T = 1
 * and pos0 = pos[i], or the sfw_cuda_* entry above at *rr->pos = pos[i]) on
 * every row, so the plain-C twins are those of the single ops, applied
 * sequence by sequence (runner/backend_compose.c). The tables are device
 * memory, written by the host (a copy) before the launch and read when it
 * runs: a recorded step of many sequences (runner/capture_cuda.c) writes
 * them before each replay and so serves whatever sequences sit in its
 * rows; an unrecorded step writes its own before each op. */
#define SFW_CUDA_SEQS_MAX 64
/* The pointers of a step's rows, per layer: K, V (append, compression), the
 * level-1 and level-2 compressed keys, the lightning state, and K, V again
 * for dense attention (NULL for a row in selection mode: its own selection
 * launches serve it). */
enum { SFW_CUDA_LK, SFW_CUDA_LV, SFW_CUDA_LC1, SFW_CUDA_LC2, SFW_CUDA_LSTATE, SFW_CUDA_LAK, SFW_CUDA_LAV, SFW_CUDA_LN };
/* A step's rows (device memory): sequences 0 .. n-1, sequence i at pos[i]
 * (0 for padding) in row row[i] with block table tab[i] (NULL:
 * contiguous; the blocks are 2^shift tokens, struct sfw_pages). A row in
 * selection mode has its own selection launches, which read its position
 * and block table here and its caches from the pointer table (struct
 * sfw_cuda_rowref). */
struct sfw_cuda_steptab {
	int n, shift;
	int64_t pos[SFW_CUDA_SEQS_MAX];
	const int32_t *tab[SFW_CUDA_SEQS_MAX];
	int row[SFW_CUDA_SEQS_MAX];
};
/* One call over a step's table: it serves sequences 0 .. n-1 of st (a
 * bucket's rows, padding included), row i's pointer j being sp[(layer *
 * SFW_CUDA_LN + pf[j]) * n + i] (one load: a block that needs its caches
 * waits on no chain of them). A NULL pointer 0 leaves the row alone: a
 * padding row, or a row that selects blocks in dense attention's fields.
 * The per-row ops that need no cache compute padding rows too, at position
 * 0. maxpos bounds the rows' positions (it sizes the attention's splits). */
struct sfw_cuda_seqs {
	int n; /* 1 .. SFW_CUDA_SEQS_MAX */
	int64_t maxpos;
	const struct sfw_cuda_steptab *st;
	void *const *sp;
	int layer;
	int pf[3];
	int kv8; /* the K/V caches are fp8 (struct sfw_cuda_kv) */
};
/* p[0] the K caches, p[1] the V caches (fp8 when s->kv8); k, v rows of
 * [nkv, hd] in act. */
void sfw_cuda_kv_append_seqs(const struct sfw_cuda_seqs *s, const void *k, const void *v, int nkv, int hd,
			     enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* p[0] the level-1, p[1] the level-2 compressed keys, p[2] the K caches
 * (fp8 when s->kv8): the chunks each sequence's token completes
 * (sfw_cuda_compress with rr). */
void sfw_cuda_compress_seqs(const struct sfw_cuda_seqs *s, int nkv, int hd, int ksize, int stride,
			    enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* The shapes of these calls give the heads and constants; their T and
 * pos0 are not read (the rows and positions are s's). */
/* Dense causal GQA of each row over its cache (p[0] K, p[1] V; fp8 when
 * s->kv8) up to and including its own position. q, o rows of [nh, hd]. */
void sfw_cuda_attn_dense_seqs(void *o, const void *q, const struct sfw_cuda_seqs *s,
			      const struct sfw_attn_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* The recurrent GLA step of each row against its fp32 state p[0] [nh, hd, hd].
 * q, k, v, o rows of [nh, hd]. */
void sfw_cuda_gla_seqs(void *o, const void *q, const void *k, const void *v, const struct sfw_cuda_seqs *s,
		       const float *decay, const struct sfw_gla_shape *sh, enum sfw_dtype act,
		       struct sfw_cuda_ctx *cx);
/* sfw_op_qk_norm_rope_cuda over the sequences' rows (q rows of [nhq, hd],
 * k rows of [nhk, hd]), sequence i's at position pos[i] (no pointers). */
void sfw_cuda_qk_norm_rope_seqs(void *q, void *k, const void *qw, const void *kw,
				const struct sfw_cuda_seqs *s, const struct sfw_qk_shape *sh,
				enum sfw_dtype act, struct sfw_cuda_ctx *cx);

/* sfw_op_sample_cuda (kernels/ops.h) for rows 0 .. n-1 of logits [n, V]
 * into out[0 .. n) in one launch (n <= SFW_CUDA_SEQS_MAX): row i with p[i]
 * and u[i]; p[i] NULL leaves out[i] alone. */
void sfw_cuda_sample_rows(int32_t *out, const float *logits, int V, int n, const struct sfw_op_sample_params *const *p,
			  const double *u, struct sfw_cuda_ctx *cx);

/* Test/bench helpers: fill with deterministic pseudo-random values
 * uniform in [-scale, scale) (bf16 or float32). Never zeros: zeros hide
 * unwritten outputs and run faster than real data. */
void sfw_cuda_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale, void *stream);
void sfw_cuda_fill_f32(float *p, size_t n, uint64_t seed, float scale, void *stream);

/* The two ceilings, measured on this device now: a device-to-device copy of
 * `bytes` (GB/s counting bytes read + written) and a bf16 cuBLASLt GEMM
 * n×n×n on random data (TFLOP/s). Medians of several timed repeats. */
SFW_MUST_CHECK enum sfw_status sfw_cuda_measure_copy(size_t bytes, double *gbps, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_cuda_measure_gemm(int n, double *tflops, struct sfw_err *err);

/* ---- linear layers: Y[M,N] = X[M,K] · W[N,K]ᵀ, bf16 in/out, fp32 accumulate ----
 * W is row-major [out=N, in=K] (PyTorch nn.Linear). X and Y are row-major with
 * row strides ldx / ldy elements (struct sfw_gemm_shape, kernels/ops.h: 0 is
 * dense; so Y may be a column slice of a wider tensor).
 * The result is rounded to bf16 once. M ≤ SFW_CUDA_GEMV_AUTO_M runs the GEMV
 * kernel (weights streamed once for all M rows); larger M runs cuBLASLt:
 * bench/bench_gemm.c on an H200 had them even at M = 2, cuBLASLt ahead on 5
 * of the 6 decode shapes at M = 4 and twice as fast at M = 8. The GEMV
 * itself takes up to SFW_CUDA_GEMV_MAX_M rows (the int8 one keeps M <= 8:
 * its cuBLASLt path dequantizes first). */
#define SFW_CUDA_GEMV_MAX_M 8
#define SFW_CUDA_GEMV_AUTO_M 2
struct sfw_cuda_blas; /* cuBLASLt handle + workspace, bound to one stream */
SFW_MUST_CHECK enum sfw_status sfw_cuda_blas_new(struct sfw_cuda_blas **out, size_t workspace_bytes,
						 struct sfw_err *err);
void sfw_cuda_blas_free(struct sfw_cuda_blas *b);

void sfw_cuda_linear(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, uint16_t *Y,
		     const struct sfw_gemm_shape *sh, void *stream);
/* Y float32 = alpha · X Wᵀ (no bf16 rounding): the logits. */
void sfw_cuda_linear_f32out(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, float *Y,
			    const struct sfw_gemm_shape *sh, float alpha, void *stream);
/* Same, but always the GEMV kernel (M ≤ SFW_CUDA_GEMV_MAX_M), or always
 * cuBLASLt: for tests and benchmarks. Every GEMV (these and the M ≤ 2 calls
 * of sfw_cuda_linear / sfw_op_matmul_cuda) reads its first weights before
 * it waits for the previous kernel (programmatic dependent launch): W must
 * not be written by a kernel launched just before it on the stream (weights
 * arrive by copies; a copy orders fully). */
void sfw_cuda_gemv(const uint16_t *X, const uint16_t *W, uint16_t *Y, const struct sfw_gemm_shape *sh,
		   void *stream);
void sfw_cuda_gemm(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, uint16_t *Y,
		   const struct sfw_gemm_shape *sh, void *stream);
/* The cuBLASLt GEMM with its heuristic's answer number `rank` (0 = the one
 * sfw_cuda_gemm takes; up to 7), Y bf16 or, with out_f32, float32: 0 when
 * there are not that many answers (nothing ran). For benchmarks. */
int sfw_cuda_gemm_rank(struct sfw_cuda_blas *b, const uint16_t *X, const uint16_t *W, void *Y,
		       const struct sfw_gemm_shape *sh, int out_f32, int rank, void *stream);
/* GEMV variant selection for tuning: rows per warp (1, 2, 4) and loads in
 * flight per lane (2, 4, 8); 0 = the built-in choice. */
void sfw_cuda_gemv_variant(const uint16_t *X, const uint16_t *W, uint16_t *Y, const struct sfw_gemm_shape *sh,
			   int rows_per_warp, int unroll, void *stream);

/* ---- int8 (W8A16) linear layers (kernels/linear_w8.cu) ----
 * W is codes [N, ceil(K/4)*4] bytes + scales [N, ceil(K/group)] (BF16, F16
 * or F32), num/w8_layout.h; group = K (or <= 0) for per-channel scales
 * (struct sfw_w8, kernels/ops.h, in device memory). The
 * GEMV (M <= 8) reads each code and scale once, before the programmatic
 * launch wait like sfw_cuda_gemv; rows_per_warp (1, 2, 4; 101, 102 the same
 * with the next batch loaded while one is consumed) and unroll (2, 4, 8)
 * pick a variant for tuning (0 = built-in; the full set for M = 1 with BF16
 * scales only). sfw_cuda_gemm_w8 dequantizes slabs of
 * sfw_cuda_w8_slab_rows rows to bf16 in `scratch` ((b - 128) * scale in
 * float32, rounded to bf16) and runs cuBLASLt on each. */
void sfw_cuda_gemv_w8_variant(const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
			      const struct sfw_gemm_shape *sh, int rows_per_warp, int unroll, void *stream);
void sfw_cuda_gemm_w8(struct sfw_cuda_blas *b, const uint16_t *X, const struct sfw_w8 *w, uint16_t *Y,
		      const struct sfw_gemm_shape *sh, void *scratch, size_t scratch_bytes, void *stream);
/* Rows [r0, r0 + nr) of W dequantized into Wd [nr, K] bf16. */
void sfw_cuda_dequant_w8(uint16_t *Wd, const struct sfw_w8 *w, int r0, int nr, int K, void *stream);
/* Rows per dequantized slab (a multiple of 64, at least 64, at most N). */
size_t sfw_cuda_w8_slab_rows(int N, int K, size_t scratch_bytes);
/* The slab the engine's int8 GEMMs past 64 rows dequantize into before each
 * cuBLASLt call (at least 64 rows). Larger is faster on the H200: at 1,024
 * rows 8, 16, 32 and 64 MiB give gate|up 428, 533, 598, 625 TFLOP/s, down
 * 336, 453, 549, 646 (bench_w8gemm --slab, bench/RESULTS.md): fewer, wider
 * GEMMs outweigh an L2-resident slab. */
#define SFW_CUDA_W8_SLAB_BYTES ((size_t)64 << 20)


/* ---- the state an op runs with ----
 * Every op (the sfw_op_*_cuda twins of kernels/ops.h and the sfw_cuda_*
 * kernels above) takes it explicitly: the stream it is queued on, the
 * cuBLASLt handle and workspace of its GEMMs, the scratch memory of its
 * split partials (at least SFW_CUDA_SCRATCH_MIN bytes), and the kernel
 * choices. Nothing is bound to a thread or to the process: two contexts
 * (two backends) never use each other's. sfw_cuda_ctx_new makes one on
 * `stream` (not owned: the caller frees it after sfw_cuda_ctx_free) with a
 * handle and scratch of its own. A context whose scratch is fixed (a
 * backend's: its recorded steps point into it) aborts when an op needs more
 * (the plan is wrong); any other grows it, outside a graph capture. */
#define SFW_CUDA_SCRATCH_MIN ((size_t)64 << 20)
/* The int8 tensor-core GEMM's split-K workspace (kernels/linear_w8_mma.h):
 * zeroed when made, left zeroed by every call; 16.1 MiB covers the model's
 * shapes on a 132-SM H200, and a call needing more runs unsplit. */
#define SFW_CUDA_W8WS_BYTES ((size_t)20 << 20)
struct sfw_cuda_ctx {
	void *stream;
	struct sfw_cuda_blas *blas;
	void *scratch;
	size_t scratch_bytes;
	void *w8ws;        /* SFW_CUDA_W8WS_BYTES, zeroed */
	int fixed;  /* the scratch never moves */
	int attn;   /* attention: 0 auto (tensor cores for supported prefill-sized calls), 1 CUDA
		     * cores only ("simt"), 2 tensor cores for every shape they support ("tc") */
	int stage1; /* stage-1 scoring: the same three modes (auto: tensor cores for decode rows too) */
	int w8gemv; /* int8 decode rows (M <= 8, not the logits): 2 the tensor-core GEMV (kernels/linear_w8.cu,
		     * being measured), else the CUDA-core GEMV (M <= 2) and the tensor-core GEMM */
	int sms;    /* multiprocessors of the device (sfw_cuda_ctx_new asks it) */
	size_t topk_smem; /* the most bytes of keys top-k holds in shared memory (0: none) */
	/* the position of ops given at a host value (sfw_cuda_ctx_pos): device
	 * memory, whose value is pos_at when pos_known */
	int64_t *pos;
	int64_t pos_at;
	int pos_known;
};
SFW_MUST_CHECK enum sfw_status sfw_cuda_ctx_new(void *stream, struct sfw_cuda_ctx **out, struct sfw_err *err);
void sfw_cuda_ctx_free(struct sfw_cuda_ctx *cx); /* NULL is a no-op */
/* Device memory that holds pos for the ops queued next on cx's stream: the
 * one way an op given a host position (an sfw_op_*_cuda twin, or the
 * engine's unrecorded path) hands it to its kernels, which read every
 * position from device memory (struct sfw_cuda_rowref). The slot is
 * written by an 8-byte copy on the stream when the value changes (a copy
 * orders fully: kernels may read it before their programmatic-launch
 * wait); ops queued before a change read the value they were queued with.
 * Never while the stream is captured: a host position has no place in a
 * recording (it reads its rows' positions from its step table). */
const int64_t *sfw_cuda_ctx_pos(struct sfw_cuda_ctx *cx, int64_t pos);

#endif
