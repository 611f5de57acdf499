/* fuzz_promptcache - libFuzzer target for the context-state file (the
 * bytes of `salafw run --prompt-cache FILE`; runner/ctxstate.h). The input
 * is a whole file, read in pieces of varying size by sfwi_state_read, the
 * reader sfw_ctx_state_load runs, against a small fixed model layout (3
 * layers S L S) and a 32-token prompt. Checked on every input: the sink sees
 * sections in order, within their sizes, and all of the payload when a
 * state loads; a loaded state's tokens are a prefix of the prompt; an error
 * has a message. Every input is read twice: for a context whose K/V are
 * activations and for one with the fp8 layout (--kv-cache fp8 on a bf16
 * backend: K and V sections of whole groups of codes and scales).
 * SFW_FUZZ_WRITE_SEEDS=DIR writes valid states of both kinds (1, 5 and 32
 * tokens, with and without logits) there and exits: the seeds in
 * tests/fuzz/seeds/fuzz_promptcache. */
#include "runner/ctxstate.h"
#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const uint8_t SPARSE[3] = {1, 0, 1};
#define NPROMPT 32
static int32_t prompt[NPROMPT];

/* kv: SFWI_STATE_KV_ACT (float activations) or SFWI_STATE_KV_FP8 (bf16
 * activations, the fp8 layout) */
static struct sfwi_state_hdr layout(uint32_t kv)
{
	struct sfwi_state_hdr h;
	memset(&h, 0, sizeof(h));
	for (int i = 0; i < 32; i++)
		h.binding[i] = (uint8_t)(i * 7);
	const char *backend = kv == SFWI_STATE_KV_FP8 ? "cuda" : "cpu";
	memcpy(h.backend, backend, strlen(backend));
	h.act_size = kv == SFWI_STATE_KV_FP8 ? 2 : 4, h.act_dtype = 1;
	h.kv = kv;
	h.n_layers = 3, h.nkv = 1, h.hd = 4, h.lnh = 1, h.lhd = 4;
	h.ksize = 4, h.stride = 2, h.block = 8, h.sel_k = 2, h.vocab = 16;
	sfwi_sum(SPARSE, 3, h.kinds_sum);
	h.chunk_rows = 256;
	return h;
}

struct input {
	const uint8_t *p;
	size_t n, at;
	unsigned step;
};

static enum sfw_status in_read(void *user, void *p, size_t n, size_t *got, struct sfw_err *err)
{
	(void)err;
	struct input *in = user;
	size_t k = in->n - in->at;
	in->step = in->step * 1103515245u + 12345u;
	size_t cap = 1 + (in->step >> 16) % 97; /* short reads: the reader must loop */
	k = k < n ? k : n;
	k = k < cap ? k : cap;
	memcpy(p, in->p + in->at, k);
	in->at += k;
	*got = k;
	return SFW_OK;
}

struct sink {
	int last; /* the previous section's index in file order */
	enum sfwi_sec kind;
	int layer;
	uint64_t off, total;
};

static enum sfw_status on_piece(void *user, const struct sfwi_state_hdr *h, const struct sfwi_sec_desc *d,
				uint64_t off, const void *p, size_t n, struct sfw_err *err)
{
	(void)p, (void)err;
	struct sink *s = user;
	if (n == 0 || off + n > d->bytes || h->n_tokens > NPROMPT)
		abort();
	if (off == 0) { /* a new section: the next one in file order */
		struct sfwi_sec_desc want;
		do /* empty sections (no level-2 keys yet) pass no piece */
			if (!sfwi_state_section(h, SPARSE, ++s->last, &want))
				abort();
		while (want.bytes == 0);
		if (want.kind != d->kind || want.layer != d->layer || want.bytes != d->bytes)
			abort();
	} else if (off != s->off || d->kind != s->kind || d->layer != s->layer) {
		abort();
	}
	s->kind = d->kind, s->layer = d->layer, s->off = off + n;
	s->total += n;
	return SFW_OK;
}

static void one(const uint8_t *data, size_t size, uint32_t kv)
{
	struct sfwi_state_hdr want = layout(kv), got;
	struct input in = {data, size, 0, (unsigned)size};
	struct sink sk = {-1, SFWI_SEC_K, 0, 0, 0};
	struct sfw_err err = {0};
	int64_t n = -1;
	enum sfw_status s =
	    sfwi_state_read(&want, SPARSE, prompt, NPROMPT, in_read, &in, on_piece, &sk, &got, &n, &err);
	if (s != SFW_OK && (n != 0 || !err.msg[0]))
		abort();
	if (s == SFW_OK && n > 0) {
		if (n > NPROMPT || sk.total != got.payload_bytes || in.at != size)
			abort();
		for (int64_t i = 0; i < n; i++) /* the file's ids are the prompt's */
			if (memcmp(data + SFWI_STATE_HDR + 4 * i, &prompt[i], 4) != 0)
				abort();
	}
	if (s == SFW_OK && n == 0 && sk.total != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	one(data, size, SFWI_STATE_KV_ACT);
	one(data, size, SFWI_STATE_KV_FP8);
	return 0;
}

/* A valid state of P tokens: the header, the prompt's ids, every section
 * (finite values, read as float32, bf16 or fp8 codes and scales: the bytes
 * of 0, 0.25, .. 1.5 are none of their NaN or negative forms; notes mode 0
 * and blocks -1), the payload's sum. */
static void write_seed(const char *dir, uint64_t P, int logits, uint32_t kv)
{
	struct sfwi_state_hdr h = layout(kv);
	h.n_tokens = P;
	h.flags = logits ? SFWI_STATE_LOGITS : 0;
	sfwi_sum(prompt, P * 4, h.ids_sum);
	struct sfw_err err = {0};
	if (sfwi_state_payload_bytes(&h, SPARSE, &h.payload_bytes, &err) != SFW_OK)
		abort();
	char path[4200];
	snprintf(path, sizeof(path), "%s/state-%llu%s%s", dir, (unsigned long long)P, logits ? "-logits" : "",
		 kv == SFWI_STATE_KV_FP8 ? "-fp8" : "");
	FILE *f = fopen(path, "wb");
	if (!f)
		abort();
	unsigned char hb[SFWI_STATE_HDR];
	sfwi_state_hdr_encode(&h, hb);
	fwrite(hb, 1, sizeof(hb), f);
	fwrite(prompt, 4, P, f);
	struct sfwi_sum sum;
	sfwi_sum_init(&sum);
	struct sfwi_sec_desc d;
	for (int i = 0; sfwi_state_section(&h, SPARSE, i, &d); i++)
		for (uint64_t k = 0; k < d.bytes; k += 4) {
			float x = 0.25f * (float)(k % 7);
			int32_t v = (k / 4) % (1 + h.nkv * h.sel_k) == 0 ? 0 : -1;
			unsigned char b[4];
			memcpy(b, d.kind == SFWI_SEC_NOTES ? (void *)&v : (void *)&x, 4);
			sfwi_sum_update(&sum, b, 4);
			fwrite(b, 1, 4, f);
		}
	unsigned char t[SFWI_SUM];
	sfwi_sum_final(&sum, t);
	fwrite(t, 1, SFWI_SUM, f);
	if (fclose(f) != 0)
		abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	for (int i = 0; i < NPROMPT; i++)
		prompt[i] = (int32_t)((i * 5 + 3) % 16);
	const char *dir = getenv("SFW_FUZZ_WRITE_SEEDS");
	if (dir && *dir) {
		const uint32_t kinds[] = {SFWI_STATE_KV_ACT, SFWI_STATE_KV_FP8};
		for (int i = 0; i < 2; i++) {
			write_seed(dir, 1, 1, kinds[i]);
			write_seed(dir, 5, 0, kinds[i]);
			write_seed(dir, 5, 1, kinds[i]);
			write_seed(dir, NPROMPT, 1, kinds[i]);
		}
		exit(0);
	}
	return 0;
}
