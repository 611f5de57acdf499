/* ctxstate.h - (library-internal) the context-state file: what
 * sfw_ctx_state_save writes and sfw_ctx_state_load reads (runner/runner.h;
 * `salafw run --prompt-cache FILE` keeps one per prompt). The format is
 * pure bytes, parsed here without a model (runner/ctxstate_fmt.c, fuzzed
 * by tests/fuzz/fuzz_promptcache.c); runner/ctxstate.c moves the sections
 * between the file and a context's caches.
 *
 * Layout, little-endian throughout:
 *
 *   off  size  field
 *     0     8  magic "SFWCTXST"
 *     8     4  version (2)
 *    12     4  header bytes (256)
 *    16    32  binding: the caller's 32 bytes (which model, which numerics)
 *    48    16  backend name, NUL-padded ("cpu", "cuda")
 *    64     4  act_size: bytes per activation element (4 fp32, 2 bf16)
 *    68     4  act_dtype (enum sfw_dtype of the activations)
 *    72    40  n_layers, nkv, hd, lnh, lhd, ksize, stride, block, sel_k, vocab (u32 each)
 *   112    16  sum of the layer kinds (n_layers bytes, 1 sparse, 0 lightning)
 *   128     4  dense_as_sparse (the context's parameter)
 *   132     4  chunk rows: rows per prefill piece of the context that made it
 *   136     8  n_tokens P (1 .. INT32_MAX)
 *   144    16  sum of the token ids (P int32)
 *   160     4  flags: bit 0 = the last row's logits are included
 *   164     4  kv: the sparse layers' K/V, 0 as the activations, 1 the same
 *              elements rounded as fp8 (the CPU's --kv-cache fp8), 2 the fp8
 *              layout (the CUDA backend's --kv-cache fp8: K and V sections
 *              of ceil(P / 32) groups of kernels/ops.h, "the fp8 KV cache";
 *              the rows past P of the last group are zeros)
 *   168     8  payload bytes (what the fields above imply, checked)
 *   176    64  0
 *   240    16  sum of bytes 0 .. 239
 *   256  4*P  the token ids, int32
 *        ...   the payload: per layer in order, a sparse layer's K [P, nkv, hd],
 *              V [P, nkv, hd] (kv 2: the fp8 groups), level-1 keys [n1, nkv, hd], level-2 keys
 *              [n2, nkv, hd] (activation elements; n1 = chunks(P, ksize,
 *              stride), n2 = chunks(P, 4 ksize, 4 stride), chunks(L, k, s) =
 *              L < k ? 0 : (L - k) / s + 1), a lightning layer's state
 *              [lnh, lhd, lhd] fp32; then per sparse layer its selection
 *              note (int32 mode 0 dense / 1 sparse, int32 blocks [nkv,
 *              sel_k], -1 unused); then, with flags bit 0, the logits [vocab] fp32
 *       16     sum of the payload
 *   (end of file)
 *
 * A sum is BLAKE2b with a 16-byte digest and no key (libsodium's
 * crypto_generichash; Python's hashlib.blake2b(digest_size=16)). It finds
 * corruption and edits; it is not a signature: whoever can write the file
 * can write any state (as they could write the prompt), and the reader
 * still bounds every size and admits only finite floats and in-range
 * notes. */
#ifndef SFW_CTXSTATE_H
#define SFW_CTXSTATE_H

#include "runner/runner.h"
#include "sfw.h"

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#define SFWI_STATE_MAGIC "SFWCTXST"
#define SFWI_STATE_VERSION 2
#define SFWI_STATE_HDR 256
#define SFWI_STATE_LOGITS 1u /* flags */

/* The sums (above): in pieces (init, update..., final), or of one buffer. */
#define SFWI_SUM 16
struct sfwi_sum {
	crypto_generichash_state st;
};
void sfwi_sum_init(struct sfwi_sum *s);
void sfwi_sum_update(struct sfwi_sum *s, const void *p, size_t n);
void sfwi_sum_final(struct sfwi_sum *s, uint8_t out[SFWI_SUM]);
void sfwi_sum(const void *p, size_t n, uint8_t out[SFWI_SUM]);

/* The header's fields. */
struct sfwi_state_hdr {
	uint8_t binding[32];
	char backend[16];
	uint32_t act_size, act_dtype;
	uint32_t n_layers, nkv, hd, lnh, lhd, ksize, stride, block, sel_k, vocab;
	uint8_t kinds_sum[SFWI_SUM];
	uint32_t dense_as_sparse, chunk_rows;
	uint64_t n_tokens;
	uint8_t ids_sum[SFWI_SUM];
	uint32_t flags;
	uint32_t kv; /* SFWI_STATE_KV_* */
	uint64_t payload_bytes;
};
#define SFWI_STATE_KV_ACT 0u
#define SFWI_STATE_KV_ROUNDED 1u
#define SFWI_STATE_KV_FP8 2u

/* The payload's sections, in file order. */
enum sfwi_sec {
	SFWI_SEC_K,
	SFWI_SEC_V,
	SFWI_SEC_C1,
	SFWI_SEC_C2,
	SFWI_SEC_STATE,
	SFWI_SEC_NOTES,
	SFWI_SEC_LOGITS
};
struct sfwi_sec_desc {
	enum sfwi_sec kind;
	int layer;     /* -1 for notes and logits */
	uint64_t rows; /* K, V, C1, C2: rows of nkv * hd elements */
	uint64_t bytes;
	int elem; /* 4 fp32, 2 bf16 (the activations), 1 fp8 groups (kv 2), 0 int32 notes */
};

/* Section i (0, 1, ...) of a state with header h and layer kinds
 * sparse[0..n_layers): 1 and *d, or 0 past the last. h's sizes must have
 * passed sfwi_state_payload_bytes. */
int sfwi_state_section(const struct sfwi_state_hdr *h, const uint8_t *sparse, int i, struct sfwi_sec_desc *d);
/* The payload bytes h implies (overflow-checked): SFW_E_FORMAT when they
 * do not fit 64 bits. */
SFW_MUST_CHECK enum sfw_status sfwi_state_payload_bytes(const struct sfwi_state_hdr *h, const uint8_t *sparse,
							uint64_t *out, struct sfw_err *err);

/* The header's 256 bytes for h (its sum included). */
void sfwi_state_hdr_encode(const struct sfwi_state_hdr *h, unsigned char out[SFWI_STATE_HDR]);

/* Receives the payload in order, in pieces (off: the piece's offset in its
 * section; h: the header, checked); an error stops the read and is
 * returned. */
typedef enum sfw_status (*sfwi_state_sink_fn)(void *user, const struct sfwi_state_hdr *h,
					      const struct sfwi_sec_desc *d, uint64_t off, const void *p,
					      size_t n, struct sfw_err *err);

/* Reads a state made for want (every field but n_tokens, ids_sum, flags and
 * payload_bytes; layer kinds sparse[0..want->n_layers)) whose tokens are a
 * prefix of prompt[0..n_prompt): the header (checked field by field before
 * anything else is read), the ids, then the payload to sink, its sum and
 * the end of the input. *n_loaded = P when it fits; 0 with SFW_OK when its
 * tokens are not a prefix of the prompt (or are all of it without logits),
 * nothing then passed to sink. Any other misfit is an error naming it
 * (SFW_E_FORMAT; SFW_E_UNSUPPORTED: another version). The read function's
 * and the sink's errors are returned as they are. got (may be NULL): the
 * header as read, once its own sum held. */
SFW_MUST_CHECK enum sfw_status sfwi_state_read(const struct sfwi_state_hdr *want, const uint8_t *sparse,
					       const int32_t *prompt, size_t n_prompt, sfw_state_read_fn rd,
					       void *ru, sfwi_state_sink_fn sink, void *su,
					       struct sfwi_state_hdr *got, int64_t *n_loaded,
					       struct sfw_err *err);

#endif
