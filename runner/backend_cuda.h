/* backend_cuda.h - (library-internal, CUDA=1 builds) the CUDA backend's
 * state shared by its files: runner/backend_cuda.c (device, weights,
 * memory and transfers, the member table), runner/cache_cuda.c (caches,
 * the paged KV pool, block-selection scratch), runner/glue_cuda.c (the ops:
 * struct sfw_backend's members onto the kernels of kernels/ops_cuda.h) and
 * runner/capture_cuda.c (decode steps recorded as CUDA graphs and
 * replayed). */
#ifndef SFW_BACKEND_CUDA_H
#define SFW_BACKEND_CUDA_H

#include "runner/backend.h"
#include "kernels/ops_cuda.h"

#include <stddef.h>
#include <stdint.h>

#define MAX_SLABS 256

enum prof_op {
	P_EMBED, P_RMSNORM, P_ADD, P_SILU, P_SIGMOID, P_ROPE, P_MATMUL_DEC, P_MATMUL_PRE, P_LOGITS, P_KV, P_DENSE,
	P_COMPRESS, P_SELECT, P_SPARSE, P_GLA_REC, P_GLA_CHUNK, P_ADDNORM, P_SAMPLE, P_QKNORM, P_NORMGATE,
	PROF_N
};

enum { CAP_DIRECT, CAP_RECORD, CAP_REPLAY }; /* struct cu_be's cap */

struct cu_be {
	void *stream;
	struct sfw_cuda_ctx *cx; /* on stream: every op's handle, scratch and choices */
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
	/* an unrecorded step's table of sequences and its op's pointers
	 * (device, SFWI_CU_SEQTAB_BYTES: glue_cuda.c seqs_put) */
	void *seqtab;
	/* SALAFW_CUDA_PROFILE=1: device time per op, from events around each op
	 * (the host waits for each op, so this slows the run; the device times
	 * themselves stay right) */
	int prof;
	void *ev0, *ev1;
	int prof_decode; /* the ops since the last embed serve at most 64 rows: a (batched) decode step */
	double prof_ms[2][PROF_N];
	long prof_calls[2][PROF_N];
	size_t select_bytes;          /* block-selection scratch cap */
	/* the paths the options chose (struct sfw_backend_opts) */
	int graphs;
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
	/* the step now being issued (capture_cuda.c): cap is how its ops are
	 * taken (CAP_DIRECT: run as they come, CAP_RECORD: recorded, then
	 * launched at the step's end, CAP_REPLAY: skip, set with it: op() and
	 * copies do nothing, the recording launches at the end); cap_rec its
	 * recording's holder, cap_bk the bucket of a step of several sequences */
	int cap, skip;
	void *cap_rec;
	int cap_bk;
	/* bumped when the caches or the selection scratch move */
	uint64_t epoch;
	int64_t recordings; /* decode steps recorded (tests) */
	int64_t seqs_replays; /* steps of several sequences replayed (tests) */
	/* weight uploads deferred between load(begin) and load(end) (merging) */
	int defer;
	struct sfw_bweight **pend;
	size_t npend, pend_cap;
};

/* A struct sfw_cuda_steptab, then a pointer table of one layer (struct
 * sfw_cuda_seqs.sp: SFW_CUDA_LN columns of up to SFW_CUDA_SEQS_MAX rows). */
#define SFWI_CU_SEQTAB_BYTES (sizeof(struct sfw_cuda_steptab) + (size_t)SFW_CUDA_LN * SFW_CUDA_SEQS_MAX * sizeof(void *))

struct cu_layer {
	int sparse;
	void *k, *v;   /* bf16 [cap, nkv, hd], or fp8 (kernels/ops.h: groups of 32 rows) */
	void *c1, *c2; /* bf16 [cap1, nkv, hd], [cap2, nkv, hd]; paged: the pool's, by the table */
	int64_t len, cap, n1, n2, cap1, cap2;
	float *state;  /* lightning: fp32 [lnh, lhd, lhd] */
};

struct sfw_bcache {
	struct sfw_cache_desc d;
	struct cu_layer *L;
	/* paged (d.pool != NULL): every sparse layer's k, v are the pool's
	 * arrays of that layer, pg.tab the device copy of table[0..maxblk)
	 * (entries [0, nblk) are the blocks taken); cap = nblk blocks. The
	 * compressed keys are the pool's too (c1, c2: the layer's level-1 and
	 * level-2 bases, sfw_ckey_row), so nothing moves as the cache grows (a
	 * recorded step stays valid). pg.tab NULL: contiguous caches of their
	 * own. */
	struct sfw_pages pg;
	int32_t *table;
	int64_t nblk, maxblk;
};

/* The paged KV pool: per sparse layer si, K then V of `nblocks` blocks
 * (block b of layer si's K at mem + ((si * 2) * nblocks + b) * bb), and
 * the blocks' compressed keys (block b of layer si's at ck + (si * nblocks
 * + b) * cb: ckr rows, kernels/ops.h sfw_ckey_row). */
struct sfw_bpool {
	void *mem, *ck;
	size_t bb; /* bytes of one block of one layer's K (or V) */
	size_t cb; /* bytes of one block's compressed keys of one layer */
	int64_t ckr; /* their rows */
	int nsparse, shift;
	int kv8; /* its blocks hold fp8 K/V (struct sfw_cache_desc) */
	int64_t nblocks, nfree;
	int32_t *free; /* stack of free block ids */
	int32_t *ref;  /* [nblocks]: the caches holding each block (forks share whole blocks) */
};

static inline struct cu_be *IMPL(struct sfw_backend *be)
{
	return (struct cu_be *)be->impl;
}

/* What an op runs with (kernels/ops_cuda.h): the backend's stream,
 * cuBLASLt handle, scratch and kernel choices, passed to every kernel. */
#define S(be) (IMPL(be)->cx)

static inline void sfwi_cu_prof_begin(struct sfw_backend *be)
{
	struct cu_be *b = IMPL(be);
	if (b->prof)
		sfw_cuda_event_record(b->ev0, b->stream);
}

static inline void sfwi_cu_prof_end(struct sfw_backend *be, enum prof_op op)
{
	struct cu_be *b = IMPL(be);
	if (!b->prof)
		return;
	sfw_cuda_event_record(b->ev1, b->stream);
	b->prof_ms[b->prof_decode][op] += sfw_cuda_event_ms(b->ev0, b->ev1);
	b->prof_calls[b->prof_decode][op]++;
}

#define PROF(op, stmt)                                                                                    \
	do {                                                                                              \
		sfwi_cu_prof_begin(be);                                                                           \
		stmt;                                                                                     \
		sfwi_cu_prof_end(be, op);                                                                         \
	} while (0)

/* Selection scratch of one recorded decode row at cache lengths up to bound:
 * scores [nkv, n1], pooled [nkv, nblocks], and the sizes of the first two. */
static inline size_t sfwi_cu_sel_plan_row(const struct sfw_cache_desc *d, int64_t bound, int k, size_t *sc, size_t *po)
{
	int64_t n1 = sfw_nchunks(bound, d->ksize, d->stride), nb = (bound + d->block - 1) / d->block;
	*sc = sfw_cuda_arena_round((size_t)d->nkv * (size_t)(n1 ? n1 : 1) * 4);
	*po = sfw_cuda_arena_round((size_t)d->nkv * (size_t)nb * 4);
	return *sc + *po + (size_t)d->nkv * k * 4;
}

/* backend_cuda.c */
void sfwi_cu_prof_report(struct cu_be *b);
/* cache_cuda.c: the cache and pool members; the tokens a recorded step may
 * reach; a replayed step's rows onto the host-side counters; a cache's copy
 * (SFW_OP_CACHE_COPY); block-selection scratch of at least bytes (never
 * grown while recording) */
void sfwi_cu_caches(struct sfw_backend *be);
int64_t sfwi_cu_cache_room(const struct sfw_bcache *c);
void sfwi_cu_cache_advance(struct sfw_bcache *c, int T);
SFW_MUST_CHECK enum sfw_status sfwi_cu_cache_copy(struct sfw_backend *be, struct sfw_bcache *dst,
						  const struct sfw_bcache *src, struct sfw_err *err);
/* SFW_OP_CACHE_VIEW and SFW_OP_CACHE_RESET (cache_cuda.c). */
SFW_MUST_CHECK enum sfw_status sfwi_cu_cache_view(struct sfw_bcache *c, int layer, const int64_t *set,
						  struct sfw_cache_view *out, struct sfw_err *err);
void sfwi_cu_cache_reset(struct sfw_backend *be, struct sfw_bcache *c);
SFW_MUST_CHECK enum sfw_status sfwi_cu_sel_room(struct sfw_backend *be, size_t bytes, struct sfw_err *err);
/* glue_cuda.c: the op members */
void sfwi_cu_ops(struct sfw_backend *be);
/* capture_cuda.c: step (its begin and end: a decode step of one sequence or several recorded and replayed), step_free */
void sfwi_cu_capture(struct sfw_backend *be);

#endif
