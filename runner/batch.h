/* batch.h - batched decode (continuous batching): one forward step advances
 * up to 64 sequences at different lengths.
 *
 * A batch holds up to max_seqs sequences of one model. Each step takes a list
 * of items, one per sequence: 1 token when decoding, a chunk of its prompt
 * when prefilling; a step may mix both. The step runs the model once over all
 * the items' rows (runner/forward.c, the same forward path as struct
 * sfw_ctx): every linear (q/k/v/o, MLP, lm_head) once over all rows, so the
 * weights stream once per step; the attention, the key compression, the
 * InfLLM-v2 block selection and the Lightning state per sequence, each
 * against its own cache. Sequences open, fork and close between steps.
 *
 * Same meaning at every batch size: a sequence's rows are computed exactly as
 * they are by a context of its own (runner/runner.h), fed the same tokens in
 * calls of the same sizes: on the CPU backend bit for bit (tests/test_batch.c;
 * the CPU linears give a row the same bits whatever the other rows, bf16
 * and f32 in kernels/matmul.c, int8 in kernels/matmul_w8.c). A prefill chunk of n tokens is one call of n tokens
 * (one InfLLM-v2 dense/sparse decision, from its end); it matches
 * sfw_ctx_prefill of those n tokens when n <= that context's prefill_chunk.
 *
 * KV blocks: the pool is pool_tokens / 64 blocks of 64 tokens (the model's
 * sparse_block_size), shared by the sequences: a sequence holds
 * ceil(len / 64) of them (each block holds its 64 tokens' K and V in every
 * sparse layer), takes more as it grows and gives them all back when closed.
 * A step whose new tokens need more blocks than are free fails with
 * SFW_E_NOSPACE "KV pool full: N of M blocks in use" before anything ran:
 * every sequence stays as it was and usable.
 *   Paged (sfw_batch_paged = 1): the pool is one allocation made at
 * sfw_batch_new. The CPU backend (when a block is whole pages and the pool
 * within its mapping limit: runner/backend_cpu.c) maps a sequence's blocks
 * into an address range of its own, so the ops read its K/V as one array
 * while the memory is the pool's; the CUDA backend (blocks of a power of two
 * >= 32 tokens) gives each sequence a block table that its attention,
 * compression and K/V append kernels read (kernels/ops_cuda.h, struct
 * sfw_pages). Not paged (shapes neither can page): the blocks are a
 * budget over per-sequence caches grown block by block (as struct
 * sfw_ctx's); the same API and errors, but memory is taken as sequences
 * grow, not up front.
 *   On CUDA the decode rows of a step (one row each) share one launch per
 * layer and op (the backend's *_seqs ops: K/V append, compression, dense
 * attention, q/k norm + RoPE, GLA); prefill chunks and the sparse-mode
 * selection run per sequence; a step of one sequence's single decode row
 * replays that sequence's recorded step (be->step, the batch-size-1
 * bucket), and a step whose rows are all decode rows replays the batch's
 * recording for its batch-size bucket (be->step: 2, 4, 8, 16, 32 or
 * 64 rows, the rows past the step's padding; recorded once the bucket has
 * run two steps directly). A recording of dense-mode rows is for no
 * particular sequences: each replay reads its sequences' positions, block
 * tables and caches on the device, so sequences join and leave without a
 * new recording. Rows in selection mode keep their own selection launches
 * in the recording, which read the row's position, caches and block table
 * on the device too: the recording serves any sequences that select
 * blocks in those rows. Steps with prefill chunks launch op by op. A paged
 * cache's compressed keys live in its KV blocks (each in the block of its
 * chunk's last token), so they are shared and freed with the blocks.
 *
 * A batch is used by one thread at a time. */
#ifndef SFW_BATCH_H
#define SFW_BATCH_H

#include "kernels/ops.h" /* struct sfw_op_sample_params */
#include "runner/runner.h"
#include "sfw.h"

#include <stdint.h>

#define SFW_BATCH_MAX_SEQS 64

struct sfw_batch;

struct sfw_batch_params {
	int max_seqs;        /* 1 .. SFW_BATCH_MAX_SEQS */
	int64_t pool_tokens; /* KV pool size in tokens (whole blocks of 64), shared by all sequences */
	int64_t max_ctx;     /* tokens per sequence */
	/* additions to the agreed interface: */
	int max_step_rows;   /* rows one step may carry (the sum of the items' n); 0 = max_seqs + 256 */
	int dense_as_sparse; /* as struct sfw_ctx_params */
};
/* max_seqs 16, pool_tokens 65536, max_ctx 8192, max_step_rows 0. */
struct sfw_batch_params sfw_batch_default_params(void);

SFW_MUST_CHECK enum sfw_status sfw_batch_new(struct sfw_model *m, const struct sfw_batch_params *p,
					     struct sfw_batch **out, struct sfw_err *err);
void sfw_batch_free(struct sfw_batch *b); /* NULL is a no-op */

/* A free sequence slot, empty (position 0): SFW_E_RANGE "all N sequences in
 * use" when there is none. */
SFW_MUST_CHECK enum sfw_status sfw_batch_seq_open(struct sfw_batch *b, int *seq, struct sfw_err *err);
/* A free sequence slot (*dst) whose state is an exact copy of open
 * sequence src: its position, the K/V of its tokens in every sparse layer
 * (paged: src's whole blocks shared by reference, a block freed only when
 * no sequence holds it, and a block of its own for the last, partial one,
 * its tokens copied; not paged: in a cache of its own), both levels of
 * compressed keys and
 * every Lightning layer's recurrent state (the caches are the whole of a
 * sequence's state: the InfLLM-v2 selection is recomputed each step from
 * them). Stepping dst then gives exactly what stepping a sequence fed the
 * same tokens in the same calls as src gives (on the CPU backend bit for
 * bit; tests/test_batch.c), and src goes on unchanged: the n choices of a
 * request share one prefill (serve/server.c), and the prefix cache's
 * entries hold their prompts' blocks once (runner/prefix.h). Paged, the
 * fork takes one free block (none when pos is a multiple of 64); not
 * paged, ceil(pos / 64) (a slot's parked cache keeps its room, if more).
 * The copy is the backend's op (SFW_OP_CACHE_COPY:
 * runner/backend.h sfw_be_cache_copy; on CUDA device-to-device copies on
 * the backend's stream, no host round trip), ordered before the next step.
 * All or nothing: SFW_E_INVAL when src is not open (or broken by a failed
 * step), SFW_E_RANGE "all N sequences in use" when no slot is free,
 * SFW_E_NOSPACE "KV pool full: N of M blocks in use" when the pool lacks
 * the blocks, SFW_E_UNSUPPORTED when the backend has no cache copy, and
 * SFW_E_NOMEM making the cache change nothing (*dst = -1). */
SFW_MUST_CHECK enum sfw_status sfw_batch_seq_fork(struct sfw_batch *b, int src, int *dst, struct sfw_err *err);
/* Frees the slot. The cache is kept (parked) for the slot's next sequence,
 * which finds it emptied (no device allocation per sequence). Paged: its KV
 * blocks return to the pool at once. Caches of their own: their blocks
 * count against pool_tokens until then, or until a step needs them (the
 * parked caches are freed first). A closed or invalid seq is a no-op. */
void sfw_batch_seq_close(struct sfw_batch *b, int seq);
/* Tokens in the sequence's context (its next token's position); -1 when seq
 * is not open. */
int64_t sfw_batch_seq_pos(const struct sfw_batch *b, int seq);
/* Which opening of its slot the open sequence is: a number no other
 * sequence of the batch had or will have (1, 2, ... in the order sequences
 * were opened or forked); 0 when seq is not open. */
uint64_t sfw_batch_seq_serial(const struct sfw_batch *b, int seq);
/* The bytes a sequence of `tokens` tokens holds in backend memory: its KV
 * blocks (paged: with their compressed keys), and the caches every
 * sequence has whatever its length (the Lightning states; caches of their
 * own: the compressed keys for max_ctx tokens). What runner/prefix.h
 * counts against its budget. */
int64_t sfw_batch_seq_bytes(const struct sfw_batch *b, int64_t tokens);
/* The same for a sequence of model m's batches of max_ctx tokens, paged or
 * not, without a batch (its blocks: (this at n tokens) - (this at 0)). */
int64_t sfw_seq_state_bytes(const struct sfw_model *m, int64_t max_ctx, int64_t tokens, int paged);
/* KV blocks in use by the open sequences (paged: the pool's blocks in use,
 * a block that forks share counted once), and the pool's size in blocks. */
int64_t sfw_batch_blocks_used(const struct sfw_batch *b);
int64_t sfw_batch_blocks_total(const struct sfw_batch *b);
/* 1 when the KV blocks are one pool allocated at sfw_batch_new (above). */
int sfw_batch_paged(const struct sfw_batch *b);
/* Tokens per KV block (the model's sparse_block_size, 64). */
int sfw_batch_block(const struct sfw_batch *b);

struct sfw_batch_item {
	int seq;
	const int32_t *ids;
	int n;           /* tokens appended: 1 when decoding, a prompt chunk when prefilling */
	int want_logits; /* logits of its last row, on the host (sfw_batch_logits) */
	/* non-NULL: the step also chooses the next token from its last row
	 * (sfw_batch_next): sfw_op_sample_cpu(those logits, vocab, sample, u)
	 * in meaning, computed on the backend where it can, so the logits
	 * cross to the host only when want_logits asks for them (as
	 * sfw_ctx_decode_next). u in [0, 1). */
	const struct sfw_op_sample_params *sample;
	double u;
};

/* One forward step over the items (each open sequence at most once, n >= 1,
 * ids in the vocabulary, pos + n <= max_ctx, the rows within max_step_rows).
 * All or nothing: a refused step (SFW_E_INVAL, SFW_E_RANGE, SFW_E_NOSPACE
 * "KV pool full: N of M blocks in use", SFW_E_NOMEM growing a cache) changes
 * nothing. A step that fails once computing has begun (an op's scratch)
 * leaves the items' sequences inconsistent: they refuse further steps
 * (SFW_E_INVAL) until closed; the other sequences are untouched. */
SFW_MUST_CHECK enum sfw_status sfw_batch_step(struct sfw_batch *b, const struct sfw_batch_item *it, int n,
					      struct sfw_err *err);
/* Item `item` of the last successful step: its vocab_size float logits when
 * it asked for them, else NULL. Valid until the next step. */
const float *sfw_batch_logits(const struct sfw_batch *b, int item);
/* Item `item` of the last successful step: the token it chose (its
 * `sample`), or -1 when it chose none. */
int32_t sfw_batch_next(const struct sfw_batch *b, int item);

#endif
