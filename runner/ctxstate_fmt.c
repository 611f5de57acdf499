/* ctxstate_fmt.c - the context-state file as bytes (runner/ctxstate.h): the
 * sums, the header, the sections' order and sizes, and the bounded reader
 * that checks a file against what the model and the prompt imply. No
 * model, no backend: the fuzzer drives it as the engine does. */
#include "runner/ctxstate.h"
#include "alloc.h"
#include "checked.h"

#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the state's payload is the host's little-endian bytes");

/* ---- the sums: BLAKE2b-128 (libsodium) -------------------------------- */

void sfwi_sum_init(struct sfwi_sum *s)
{
	crypto_generichash_init(&s->st, NULL, 0, SFWI_SUM);
}

void sfwi_sum_update(struct sfwi_sum *s, const void *p, size_t n)
{
	crypto_generichash_update(&s->st, p, n);
}

void sfwi_sum_final(struct sfwi_sum *s, uint8_t out[SFWI_SUM])
{
	crypto_generichash_final(&s->st, out, SFWI_SUM);
}

void sfwi_sum(const void *p, size_t n, uint8_t out[SFWI_SUM])
{
	crypto_generichash(out, SFWI_SUM, p, n, NULL, 0);
}

/* ---- sections --------------------------------------------------------------- */

static uint64_t nchunks(uint64_t len, uint64_t k, uint64_t s)
{
	return len < k ? 0 : (len - k) / s + 1;
}

int sfwi_state_section(const struct sfwi_state_hdr *h, const uint8_t *sparse, int i, struct sfwi_sec_desc *d)
{
	uint64_t P = h->n_tokens, row = (uint64_t)h->nkv * h->hd * h->act_size;
	int k = 0;
	for (uint32_t li = 0; li < h->n_layers; li++) {
		int n = sparse[li] ? 4 : 1;
		if (i >= k + n) {
			k += n;
			continue;
		}
		int j = i - k;
		memset(d, 0, sizeof(*d));
		d->layer = (int)li;
		if (!sparse[li]) {
			d->kind = SFWI_SEC_STATE;
			d->bytes = (uint64_t)h->lnh * h->lhd * h->lhd * 4;
			d->elem = 4;
			return 1;
		}
		d->kind = (enum sfwi_sec)(SFWI_SEC_K + j);
		d->rows = j < 2	   ? P
			  : j == 2 ? nchunks(P, h->ksize, h->stride)
				   : nchunks(P, 4ull * h->ksize, 4ull * h->stride);
		d->bytes = d->rows * row;
		d->elem = (int)h->act_size;
		if (j < 2 && h->kv == SFWI_STATE_KV_FP8) { /* whole groups of 32 rows */
			d->bytes = (P + 31) / 32 * (32 * (uint64_t)h->nkv * (h->hd + 4ull));
			d->elem = 1;
		}
		return 1;
	}
	memset(d, 0, sizeof(*d));
	d->layer = -1;
	uint64_t ns = 0;
	for (uint32_t li = 0; li < h->n_layers; li++)
		ns += sparse[li] != 0;
	if (ns && i == k) { /* no notes without sparse layers */
		d->kind = SFWI_SEC_NOTES;
		d->bytes = ns * (1 + (uint64_t)h->nkv * h->sel_k) * 4;
		return 1;
	}
	if (i == k + (ns != 0) && (h->flags & SFWI_STATE_LOGITS)) {
		d->kind = SFWI_SEC_LOGITS;
		d->bytes = (uint64_t)h->vocab * 4;
		d->elem = 4;
		return 1;
	}
	return 0;
}

enum sfw_status sfwi_state_payload_bytes(const struct sfwi_state_hdr *h, const uint8_t *sparse, uint64_t *out,
					 struct sfw_err *err)
{
	/* every product below fits once these do: u32 fields, P < 2^31 */
	uint64_t row, st, total = 0, ns = 0, t;
	if (!sfw_mul_ok((uint64_t)h->nkv * h->hd, h->act_size, &row) ||
	    !sfw_mul_ok((uint64_t)h->lnh * h->lhd, (uint64_t)h->lhd * 4, &st) || h->n_tokens > INT32_MAX ||
	    h->ksize == 0 || h->stride == 0)
		return sfw_fail(err, SFW_E_FORMAT, "sizes out of range");
	for (uint32_t li = 0; li < h->n_layers; li++) {
		if (!sparse[li]) {
			if (!sfw_add_ok(total, st, &total))
				return sfw_fail(err, SFW_E_FORMAT, "sizes out of range");
			continue;
		}
		ns++;
		uint64_t rows = (h->kv == SFWI_STATE_KV_FP8 ? 0 : 2 * h->n_tokens) +
				nchunks(h->n_tokens, h->ksize, h->stride) +
				nchunks(h->n_tokens, 4ull * h->ksize, 4ull * h->stride);
		if (!sfw_mul_ok(rows, row, &t) || !sfw_add_ok(total, t, &total))
			return sfw_fail(err, SFW_E_FORMAT, "sizes out of range");
		if (h->kv == SFWI_STATE_KV_FP8 && /* K and V: whole groups (u32 nkv, hd: no overflow) */
		    (!sfw_mul_ok((h->n_tokens + 31) / 32, 64 * (uint64_t)h->nkv * (h->hd + 4ull), &t) ||
		     !sfw_add_ok(total, t, &total)))
			return sfw_fail(err, SFW_E_FORMAT, "sizes out of range");
	}
	if (!sfw_mul_ok(ns, (1 + (uint64_t)h->nkv * h->sel_k) * 4, &t) || !sfw_add_ok(total, t, &total) ||
	    ((h->flags & SFWI_STATE_LOGITS) && !sfw_add_ok(total, (uint64_t)h->vocab * 4, &total)))
		return sfw_fail(err, SFW_E_FORMAT, "sizes out of range");
	*out = total;
	return SFW_OK;
}

/* ---- the header ------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

void sfwi_state_hdr_encode(const struct sfwi_state_hdr *h, unsigned char out[SFWI_STATE_HDR])
{
	memset(out, 0, SFWI_STATE_HDR);
	memcpy(out, SFWI_STATE_MAGIC, 8);
	put32(out + 8, SFWI_STATE_VERSION);
	put32(out + 12, SFWI_STATE_HDR);
	memcpy(out + 16, h->binding, 32);
	memcpy(out + 48, h->backend, 16);
	const uint32_t f[] = {h->act_size, h->act_dtype, h->n_layers, h->nkv,	h->hd,	  h->lnh,
			      h->lhd,	   h->ksize,	 h->stride,   h->block, h->sel_k, h->vocab};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		put32(out + 64 + 4 * i, f[i]);
	memcpy(out + 112, h->kinds_sum, SFWI_SUM);
	put32(out + 128, h->dense_as_sparse);
	put32(out + 132, h->chunk_rows);
	sfw_le64_store(out + 136, h->n_tokens);
	memcpy(out + 144, h->ids_sum, SFWI_SUM);
	put32(out + 160, h->flags);
	put32(out + 164, h->kv);
	sfw_le64_store(out + 168, h->payload_bytes);
	sfwi_sum(out, 240, out + 240);
}

static enum sfw_status hdr_decode(const unsigned char *b, struct sfwi_state_hdr *h, struct sfw_err *err)
{
	if (memcmp(b, SFWI_STATE_MAGIC, 8) != 0)
		return sfw_fail(err, SFW_E_FORMAT, "not a salafw state file");
	uint32_t v = sfw_le32_load(b + 8);
	if (v != SFWI_STATE_VERSION)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "state format version %u (this salafw reads %d)", v,
				SFWI_STATE_VERSION);
	uint8_t sum[SFWI_SUM];
	sfwi_sum(b, 240, sum);
	if (sfw_le32_load(b + 12) != SFWI_STATE_HDR || sodium_memcmp(b + 240, sum, SFWI_SUM) != 0)
		return sfw_fail(err, SFW_E_FORMAT, "the header's checksum does not match");
	for (int i = 176; i < 240; i++)
		if (b[i])
			return sfw_fail(err, SFW_E_FORMAT, "reserved header bytes are not zero");
	memset(h, 0, sizeof(*h));
	memcpy(h->binding, b + 16, 32);
	memcpy(h->backend, b + 48, 16);
	uint32_t *f[] = {&h->act_size, &h->act_dtype, &h->n_layers, &h->nkv,   &h->hd,	  &h->lnh,
			 &h->lhd,      &h->ksize,     &h->stride,   &h->block, &h->sel_k, &h->vocab};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		*f[i] = sfw_le32_load(b + 64 + 4 * i);
	memcpy(h->kinds_sum, b + 112, SFWI_SUM);
	h->dense_as_sparse = sfw_le32_load(b + 128);
	h->chunk_rows = sfw_le32_load(b + 132);
	h->n_tokens = sfw_le64_load(b + 136);
	memcpy(h->ids_sum, b + 144, SFWI_SUM);
	h->flags = sfw_le32_load(b + 160);
	h->kv = sfw_le32_load(b + 164);
	h->payload_bytes = sfw_le64_load(b + 168);
	if (h->flags & ~SFWI_STATE_LOGITS)
		return sfw_fail(err, SFW_E_FORMAT, "unknown flags 0x%x", h->flags);
	if (h->kv > SFWI_STATE_KV_FP8)
		return sfw_fail(err, SFW_E_FORMAT, "unknown K/V kind %u", h->kv);
	if (h->n_tokens < 1 || h->n_tokens > INT32_MAX)
		return sfw_fail(err, SFW_E_FORMAT, "%llu tokens (1 to %d allowed)",
				(unsigned long long)h->n_tokens, INT32_MAX);
	return SFW_OK;
}

/* Whether a state of header h fits the context want describes: the same
 * binding, model layout and backend, and parameters that give the same
 * state for its tokens. */
static enum sfw_status hdr_fits(const struct sfwi_state_hdr *h, const struct sfwi_state_hdr *want,
				struct sfw_err *err)
{
	if (memcmp(h->binding, want->binding, 32) != 0)
		return sfw_fail(err, SFW_E_FORMAT, "made for another model (or other numeric options)");
	if (memcmp(h->backend, want->backend, 16) != 0 || h->act_size != want->act_size ||
	    h->act_dtype != want->act_dtype)
		return sfw_fail(err, SFW_E_FORMAT, "made on another device");
	if (h->n_layers != want->n_layers || h->nkv != want->nkv || h->hd != want->hd ||
	    h->lnh != want->lnh || h->lhd != want->lhd || h->ksize != want->ksize ||
	    h->stride != want->stride || h->block != want->block || h->sel_k != want->sel_k ||
	    h->vocab != want->vocab || memcmp(h->kinds_sum, want->kinds_sum, SFWI_SUM) != 0)
		return sfw_fail(err, SFW_E_FORMAT, "made for another model layout");
	if (h->kv != want->kv) { /* (hdr_decode bounded h->kv) */
		static const char *const kv[] = {"bf16", "fp8 (the CPU's rounded values)", "fp8 (the CUDA layout)"};
		return sfw_fail(err, SFW_E_FORMAT, "made with --kv-cache %s, not %s", kv[h->kv], kv[want->kv]);
	}
	if (h->dense_as_sparse != want->dense_as_sparse)
		return sfw_fail(err, SFW_E_FORMAT, "made %s --dense-as-sparse",
				h->dense_as_sparse ? "with" : "without");
	/* the prefill's pieces shape the state: the same pieces, or one
	 * piece under both */
	if (h->chunk_rows != want->chunk_rows &&
	    (h->n_tokens > h->chunk_rows || h->n_tokens > want->chunk_rows))
		return sfw_fail(err, SFW_E_FORMAT, "made with prefill pieces of %u rows, not %u",
				h->chunk_rows, want->chunk_rows);
	return SFW_OK;
}

/* ---- the reader --------------------------------------------------------------- */

#define PIECE (1u << 20) /* bytes per read: a multiple of every element size */

/* Reads exactly n bytes, or says the input is truncated. */
static enum sfw_status read_exact(sfw_state_read_fn rd, void *ru, void *p, size_t n, const char *what,
				  struct sfw_err *err)
{
	size_t have = 0;
	while (have < n) {
		size_t got = 0;
		enum sfw_status s = rd(ru, (char *)p + have, n - have, &got, err);
		if (s != SFW_OK)
			return s;
		if (got == 0)
			return sfw_fail(err, SFW_E_FORMAT, "truncated in %s", what);
		have += got;
	}
	return SFW_OK;
}

/* Finite floats only (fp32, or bf16: exponent not all ones; fp8 groups:
 * no NaN code, scales finite and not negative), notes in range. off: the
 * piece's offset in its section (a multiple of 4). */
static int piece_ok(const struct sfwi_state_hdr *h, const struct sfwi_sec_desc *d, uint64_t off,
		    const unsigned char *p, size_t n)
{
	if (d->elem == 1) {
		uint64_t gb = 32 * (uint64_t)h->nkv * (h->hd + 4ull), cb = 32 * (uint64_t)h->nkv * h->hd;
		for (size_t i = 0; i < n;) {
			uint64_t in = (off + i) % gb;
			if (in < cb) {
				if ((p[i] & 0x7f) == 0x7f)
					return 0;
				i++;
			} else {
				uint32_t u = sfw_le32_load(p + i);
				if ((u & 0x7f800000u) == 0x7f800000u || (u >> 31))
					return 0;
				i += 4;
			}
		}
	} else if (d->elem == 4) {
		for (size_t i = 0; i < n; i += 4)
			if ((sfw_le32_load(p + i) & 0x7f800000u) == 0x7f800000u)
				return 0;
	} else if (d->elem == 2) {
		for (size_t i = 0; i < n; i += 2)
			if ((((unsigned)p[i + 1] << 8 | p[i]) & 0x7f80u) == 0x7f80u)
				return 0;
	} else { /* notes: per sparse layer a mode (0 or 1) then blocks >= -1 */
		for (size_t i = 0; i < n; i += 4) {
			int32_t v = (int32_t)sfw_le32_load(p + i);
			if (v < -1)
				return 0;
		}
	}
	return 1;
}

static const char *sec_name(enum sfwi_sec k)
{
	static const char *const names[] = {
	    "the keys",		 "the values",		"the compressed keys", "the compressed keys",
	    "a lightning state", "the selection notes", "the logits"};
	return names[k];
}

/* The payload, section by section, to sink; into its sum. */
static enum sfw_status read_payload(const struct sfwi_state_hdr *h, const uint8_t *sparse,
				    sfw_state_read_fn rd, void *ru, sfwi_state_sink_fn sink, void *su,
				    unsigned char *buf, struct sfwi_sum *sum, struct sfw_err *err)
{
	struct sfwi_sec_desc d;
	uint64_t nsk = (uint64_t)h->nkv * h->sel_k + 1; /* int32 per note */
	for (int i = 0; sfwi_state_section(h, sparse, i, &d); i++)
		for (uint64_t off = 0; off < d.bytes;) {
			size_t n = d.bytes - off < PIECE ? (size_t)(d.bytes - off) : PIECE;
			enum sfw_status s = read_exact(rd, ru, buf, n, sec_name(d.kind), err);
			if (s != SFW_OK)
				return s;
			sfwi_sum_update(sum, buf, n);
			int ok = piece_ok(h, &d, off, buf, n);
			/* a note's mode: 0 or 1 */
			for (uint64_t j = 0; ok && d.kind == SFWI_SEC_NOTES && j < n; j += 4)
				if (((off + j) / 4) % nsk == 0 && sfw_le32_load(buf + j) > 1)
					ok = 0;
			if (!ok)
				return sfw_fail(err, SFW_E_FORMAT, "%s hold values the model cannot make",
						sec_name(d.kind));
			if (sink && (s = sink(su, h, &d, off, buf, n, err)) != SFW_OK)
				return s;
			off += n;
		}
	return SFW_OK;
}

enum sfw_status sfwi_state_read(const struct sfwi_state_hdr *want, const uint8_t *sparse,
				const int32_t *prompt, size_t n_prompt, sfw_state_read_fn rd, void *ru,
				sfwi_state_sink_fn sink, void *su, struct sfwi_state_hdr *got,
				int64_t *n_loaded, struct sfw_err *err)
{
	*n_loaded = 0;
	unsigned char hb[SFWI_STATE_HDR];
	struct sfwi_state_hdr h;
	uint64_t bytes;
	enum sfw_status s = read_exact(rd, ru, hb, 8, "the header", err);
	if (s == SFW_OK && memcmp(hb, SFWI_STATE_MAGIC, 8) != 0)
		return sfw_fail(err, SFW_E_FORMAT, "not a salafw state file");
	if (s != SFW_OK ||
	    (s = read_exact(rd, ru, hb + 8, SFWI_STATE_HDR - 8, "the header", err)) != SFW_OK ||
	    (s = hdr_decode(hb, &h, err)) != SFW_OK)
		return s;
	if (got)
		*got = h;
	if ((s = hdr_fits(&h, want, err)) != SFW_OK ||
	    (s = sfwi_state_payload_bytes(&h, sparse, &bytes, err)) != SFW_OK)
		return s;
	if (bytes != h.payload_bytes)
		return sfw_fail(err, SFW_E_FORMAT, "a payload of %llu bytes where its header implies %llu",
				(unsigned long long)h.payload_bytes, (unsigned long long)bytes);
	/* longer than the prompt: not its prefix, and nothing more is read
	 * (what is allocated below is bounded by the prompt) */
	if (h.n_tokens > n_prompt)
		return SFW_OK;
	size_t P = (size_t)h.n_tokens;
	unsigned char *buf = sfw_malloc(P * 4 > PIECE ? P * 4 : PIECE);
	if (!buf)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if ((s = read_exact(rd, ru, buf, P * 4, "the token ids", err)) != SFW_OK)
		goto out;
	uint8_t ids_sum[SFWI_SUM];
	sfwi_sum(buf, P * 4, ids_sum);
	if (memcmp(ids_sum, h.ids_sum, SFWI_SUM) != 0) {
		s = sfw_fail(err, SFW_E_FORMAT, "the token ids' checksum does not match");
		goto out;
	}
	int prefix = 1;
	for (size_t i = 0; i < P && prefix; i++)
		prefix = (int32_t)sfw_le32_load(buf + 4 * i) == prompt[i];
	if (!prefix || (P == n_prompt && !(h.flags & SFWI_STATE_LOGITS)))
		goto out; /* SFW_OK, nothing loaded */
	struct sfwi_sum sum;
	uint8_t tail[SFWI_SUM + 1], want_sum[SFWI_SUM];
	size_t extra = 0;
	sfwi_sum_init(&sum);
	if ((s = read_payload(&h, sparse, rd, ru, sink, su, buf, &sum, err)) != SFW_OK ||
	    (s = read_exact(rd, ru, tail, SFWI_SUM, "the checksum", err)) != SFW_OK)
		goto out;
	sfwi_sum_final(&sum, want_sum);
	if (sodium_memcmp(tail, want_sum, SFWI_SUM) != 0) {
		s = sfw_fail(err, SFW_E_FORMAT, "the payload's checksum does not match");
		goto out;
	}
	if ((s = rd(ru, tail + SFWI_SUM, 1, &extra, err)) != SFW_OK)
		goto out;
	if (extra) {
		s = sfw_fail(err, SFW_E_FORMAT, "bytes after the end of the state");
		goto out;
	}
	*n_loaded = (int64_t)P;
out:
	sfw_free(buf);
	return s;
}
