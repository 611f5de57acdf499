/* cache_cuda.c - the CUDA backend's caches (runner/backend_cuda.h): per
 * sparse layer the K/V cache growing in whole blocks (or paged from a pool
 * through a block table) and the two levels of compressed keys; per
 * lightning layer the fp32 state; the paged KV pool; the block-selection
 * scratch. */
#include "runner/backend_cuda.h"
#include "alloc.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- caches ---- */

/* Bytes of a K (or V) array of rows rows: bf16, or the fp8 layout's whole
 * groups (kernels/ops.h). */
static size_t kv_bytes(const struct sfw_cache_desc *d, int64_t rows)
{
	return d->kv8 ? sfw_kv8_bytes(rows, d->nkv, d->hd) : (size_t)rows * d->nkv * d->hd * 2;
}

static void layer_free(struct cu_layer *l)
{
	sfw_cuda_free(l->k), sfw_cuda_free(l->v), sfw_cuda_free(l->c1), sfw_cuda_free(l->c2);
	sfw_cuda_free(l->state);
	memset(l, 0, sizeof(*l));
}

/* Every block the paged cache holds back to its pool, unless another
 * cache holds it too (ordered on the one stream: a block's next owner
 * writes after this owner's last reads). */
static void pages_release(struct sfw_bcache *c)
{
	struct sfw_bpool *p = c->d.pool;
	while (c->nblk > 0) {
		int32_t b = c->table[--c->nblk];
		if (--p->ref[b] == 0)
			p->free[p->nfree++] = b;
	}
	for (int i = 0; i < c->d.n_layers; i++)
		if (c->L[i].sparse)
			c->L[i].cap = 0;
}

static void cu_cache_free(struct sfw_backend *be, struct sfw_bcache *c)
{
	if (!c)
		return;
	sfw_cuda_sync(IMPL(be)->stream);
	sfwi_cu_prof_report(IMPL(be)); /* one report per context (a bench run) */
	if (c->table)
		pages_release(c);
	if (c->L)
		for (int i = 0; i < c->d.n_layers; i++) {
			if (c->table) /* the pool's, not this cache's */
				c->L[i].k = c->L[i].v = c->L[i].c1 = c->L[i].c2 = NULL;
			layer_free(&c->L[i]);
		}
	sfw_cuda_free((void *)c->pg.tab);
	sfw_free(c->table);
	sfw_free(c->L);
	sfw_free(c);
}

/* A paged cache: the pool's arrays (K, V, compressed keys) and a block
 * table for max_tokens. */
static enum sfw_status cache_pages_new(struct sfw_bcache *c, struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &c->d;
	struct sfw_bpool *p = d->pool;
	if (d->max_tokens < 1 || d->block != 1 << p->shift || d->kv8 != p->kv8)
		return sfw_fail(err, SFW_E_INVAL,
				"a paged KV cache needs a context length and the pool's block size and KV kind");
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
		l->c1 = (char *)p->ck + (size_t)si * (size_t)p->nblocks * p->cb;
		l->c2 = (char *)l->c1 + (size_t)(d->block / d->stride) * row;
		si++;
		l->cap1 = cap1, l->cap2 = cap2; /* bounds: the chunks the table's blocks can hold */
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
	size_t sbytes = (size_t)d->lnh * d->lhd * d->lhd * sizeof(float);
	for (int i = 0; i < d->n_layers; i++) {
		c->L[i].sparse = d->mixer[i] == SFW_MIXER_SPARSE;
		if (!c->L[i].sparse) {
			enum sfw_status s = sfw_cuda_malloc((void **)&c->L[i].state, sbytes, "the lightning states", err);
			if (s != SFW_OK) {
				cu_cache_free(be, c);
				return s;
			}
			sfw_cuda_memset(c->L[i].state, 0, sbytes, IMPL(be)->stream);
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
		sfw_cuda_d2d(q, *p, old, IMPL(be)->stream);
	sfw_cuda_sync(IMPL(be)->stream);
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
	for (; c->nblk < need; c->nblk++) {
		c->table[c->nblk] = p->free[--p->nfree];
		p->ref[c->table[c->nblk]] = 1;
	}
	sfw_cuda_h2d((int32_t *)c->pg.tab + had, c->table + had, (size_t)(need - had) * sizeof(int32_t), IMPL(be)->stream);
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
		if ((s = regrow(be, &l->k, kv_bytes(d, l->len), kv_bytes(d, cap), "the KV cache", err)) ||
		    (s = regrow(be, &l->v, kv_bytes(d, l->len), kv_bytes(d, cap), "the KV cache", err)) ||
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

/* SFW_OP_CACHE_RESET (backend.h): the host's counts (and a paged cache's
 * blocks) at once, the lightning states zeroed on the stream. */
void sfwi_cu_cache_reset(struct sfw_backend *be, struct sfw_bcache *c)
{
	if (c->table) /* every block back to the pool */
		pages_release(c);
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		l->len = l->n1 = l->n2 = 0;
		if (l->state)
			sfw_cuda_memset(l->state, 0, (size_t)c->d.lnh * c->d.lhd * c->d.lhd * sizeof(float), IMPL(be)->stream);
	}
}

/* Paged: src's blocks [j0, nb) into dst's, each block one 2D copy of its K
 * and V in every sparse layer (rows of the pool's arrays, pitch nblocks
 * blocks: struct sfw_bpool), or one copy per array past the 2D pitch
 * limit; then its compressed keys the same way. */
static void pages_copy(struct sfw_backend *be, struct sfw_bcache *dst, const struct sfw_bcache *src, int64_t j0,
		       int64_t nb)
{
	struct sfw_bpool *p = src->d.pool;
	void *st = IMPL(be)->stream;
	size_t pitch = (size_t)p->nblocks * p->bb, rows = (size_t)p->nsparse * 2;
	SFW_ASSERT(dst->table && dst->d.pool == p && nb <= dst->nblk && nb <= src->nblk);
	for (int64_t j = j0; j < nb; j++) {
		char *to = (char *)p->mem + (size_t)dst->table[j] * p->bb;
		const char *from = (const char *)p->mem + (size_t)src->table[j] * p->bb;
		char *cto = (char *)p->ck + (size_t)dst->table[j] * p->cb;
		const char *cfrom = (const char *)p->ck + (size_t)src->table[j] * p->cb;
		size_t cpitch = (size_t)p->nblocks * p->cb;
		if (pitch <= (size_t)INT32_MAX && cpitch <= (size_t)INT32_MAX) {
			sfw_cuda_d2d_2d(to, pitch, from, pitch, p->bb, rows, st);
			sfw_cuda_d2d_2d(cto, cpitch, cfrom, cpitch, p->cb, (size_t)p->nsparse, st);
			continue;
		}
		for (size_t r = 0; r < rows; r++)
			sfw_cuda_d2d(to + r * pitch, from + r * pitch, p->bb, st);
		for (int r = 0; r < p->nsparse; r++)
			sfw_cuda_d2d(cto + r * cpitch, cfrom + r * cpitch, p->cb, st);
	}
}

/* Paged: dst (holding no blocks) takes src's whole blocks of its len
 * tokens, one more holder each (a whole block is never written again:
 * tokens are only appended; the table entries to the device on the
 * stream), and a block of its own for the last, partial one; all or
 * nothing. */
static enum sfw_status pages_share(struct sfw_backend *be, struct sfw_bcache *dst, const struct sfw_bcache *src,
				   int64_t len, struct sfw_err *err)
{
	struct sfw_bpool *p = src->d.pool;
	int64_t whole = len / src->d.block;
	SFW_ASSERT(dst->table && dst->d.pool == p && dst->nblk == 0 && whole <= src->nblk && whole <= dst->maxblk);
	if ((len % src->d.block) && p->nfree == 0) /* before anything is shared */
		return sfw_fail(err, SFW_E_NOSPACE, "KV pool full: %lld of %lld blocks in use",
				(long long)(p->nblocks - p->nfree), (long long)p->nblocks);
	for (; dst->nblk < whole; dst->nblk++) {
		dst->table[dst->nblk] = src->table[dst->nblk];
		p->ref[dst->table[dst->nblk]]++;
	}
	if (whole)
		sfw_cuda_h2d((int32_t *)dst->pg.tab, dst->table, (size_t)whole * sizeof(int32_t), IMPL(be)->stream);
	for (int i = 0; i < dst->d.n_layers; i++)
		if (dst->L[i].sparse)
			dst->L[i].cap = whole * src->d.block;
	enum sfw_status s = pages_reserve(be, dst, len, err); /* the partial block: a free one is there */
	if (s != SFW_OK)
		pages_release(dst);
	return s;
}

/* dst becomes src's copy (sfw_be_cache_copy), device to device on the
 * stream: the K/V and compressed keys of its tokens (paged: src's whole
 * blocks shared, the last partial one copied into a block of dst's own;
 * else into dst's arrays, room reserved by the caller), their counts, the
 * lightning states. */
enum sfw_status sfwi_cu_cache_copy(struct sfw_backend *be, struct sfw_bcache *dst, const struct sfw_bcache *src,
				   struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &src->d;
	void *st = IMPL(be)->stream;
	size_t row = (size_t)d->nkv * d->hd * 2;
	SFW_ASSERT(dst != src && dst->d.n_layers == d->n_layers && !dst->table == !src->table);
	int64_t len = 0;
	for (int i = 0; i < d->n_layers; i++)
		if (src->L[i].sparse)
			len = src->L[i].len; /* every sparse layer holds the same tokens */
	if (src->table) {
		enum sfw_status s = pages_share(be, dst, src, len, err);
		if (s != SFW_OK)
			return s;
		pages_copy(be, dst, src, len / d->block, (len + d->block - 1) / d->block);
	}
	for (int i = 0; i < d->n_layers; i++) {
		const struct cu_layer *s = &src->L[i];
		struct cu_layer *t = &dst->L[i];
		SFW_ASSERT(s->sparse == t->sparse);
		if (!s->sparse) {
			sfw_cuda_d2d(t->state, s->state, (size_t)d->lnh * d->lhd * d->lhd * sizeof(float), st);
			continue;
		}
		SFW_ASSERT(s->len <= t->cap && s->n1 <= t->cap1 && s->n2 <= t->cap2);
		if (!src->table && s->len) {
			sfw_cuda_d2d(t->k, s->k, kv_bytes(d, s->len), st);
			sfw_cuda_d2d(t->v, s->v, kv_bytes(d, s->len), st);
		}
		if (!src->table && s->n1) /* (paged: in the blocks, shared or copied above) */
			sfw_cuda_d2d(t->c1, s->c1, (size_t)s->n1 * row, st);
		if (!src->table && s->n2)
			sfw_cuda_d2d(t->c2, s->c2, (size_t)s->n2 * row, st);
		t->len = s->len, t->n1 = s->n1, t->n2 = s->n2;
	}
	return SFW_OK;
}

/* SFW_OP_CACHE_VIEW (backend.h): the layer's counts and buffers, after
 * setting its counts; a paged cache's counts only (its K/V live in pool
 * blocks) and no set. */
enum sfw_status sfwi_cu_cache_view(struct sfw_bcache *c, int layer, const int64_t *set, struct sfw_cache_view *out,
				   struct sfw_err *err)
{
	if (set && c->table)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "a paged KV cache has no view");
	SFW_ASSERT(layer >= 0 && layer < c->d.n_layers);
	struct cu_layer *l = &c->L[layer];
	if (set && l->sparse) {
		enum sfw_status s = sfwi_cache_counts_fit(set, l->cap, l->cap1, l->cap2, err);
		if (s != SFW_OK)
			return s;
		l->len = set[0], l->n1 = set[1], l->n2 = set[2];
	}
	*out = (struct sfw_cache_view){l->k, l->v, l->c1, l->c2, l->state, l->len, l->n1, l->n2, l->cap, l->cap1, l->cap2};
	if (c->table)
		out->k = out->v = out->c1 = out->c2 = NULL;
	return SFW_OK;
}

/* A replayed step's T rows onto the host-side counters (the recorded ops
 * leave them alone). */
void sfwi_cu_cache_advance(struct sfw_bcache *c, int T)
{
	const struct sfw_cache_desc *d = &c->d;
	for (int i = 0; i < d->n_layers; i++) {
		struct cu_layer *l = &c->L[i];
		if (!l->sparse)
			continue;
		SFW_ASSERT(T >= 0 && l->len + T <= l->cap);
		l->len += T;
		int64_t t1 = sfw_nchunks(l->len, d->ksize, d->stride), t2 = sfw_nchunks(l->len, 4 * d->ksize, 4 * d->stride);
		l->n1 = t1 > l->n1 ? t1 : l->n1;
		l->n2 = t2 > l->n2 ? t2 : l->n2;
	}
}

/* The tokens a recorded step may reach: what the cache holds room for, or a
 * paged cache's whole table (its blocks, with their compressed keys, are
 * reserved before each step). */
int64_t sfwi_cu_cache_room(const struct sfw_bcache *c)
{
	if (c->table)
		return c->maxblk * c->d.block;
	int64_t room = INT64_MAX;
	for (int i = 0; i < c->d.n_layers; i++)
		if (c->L[i].sparse && c->L[i].cap < room)
			room = c->L[i].cap;
	return room;
}

enum sfw_status sfwi_cu_sel_room(struct sfw_backend *be, size_t bytes, struct sfw_err *err)
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
	/* a block holds whole 32-token attention tiles (sfw_pages), and the
	 * compressed keys of the chunks that end in it (sfw_ckey_row) */
	int64_t ckr = d->block == 1 << shift ? sfw_ckey_rows_per_block(shift, d->stride) : 0;
	if (nsparse == 0 || d->block != 1 << shift || shift < 5 || ckr == 0)
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"no paged KV pool for blocks of %d tokens here (a power of two, at least 32, and a multiple "
				"of 4 strides)",
				d->block);
	size_t bb = kv_bytes(d, d->block), cb = (size_t)ckr * d->nkv * d->hd * 2;
	if (blocks < 1 || blocks > INT32_MAX || (size_t)blocks > SIZE_MAX / (2 * bb + cb) / (size_t)nsparse)
		return sfw_fail(err, SFW_E_INVAL, "invalid KV pool size (%lld blocks)", (long long)blocks);
	struct sfw_bpool *p = sfw_calloc(1, sizeof(*p));
	if (!p || !(p->free = sfw_malloc((size_t)blocks * sizeof(int32_t))) ||
	    !(p->ref = sfw_calloc((size_t)blocks, sizeof(int32_t)))) {
		if (p)
			sfw_free(p->free);
		sfw_free(p);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	p->bb = bb, p->cb = cb, p->ckr = ckr, p->nsparse = nsparse, p->shift = shift, p->nblocks = blocks,
	p->nfree = blocks, p->kv8 = d->kv8;
	for (int64_t i = 0; i < blocks; i++) /* popped lowest first */
		p->free[i] = (int32_t)(blocks - 1 - i);
	enum sfw_status s = sfw_cuda_malloc(&p->mem, (size_t)nsparse * 2 * (size_t)blocks * bb, "the KV pool", err);
	if (s == SFW_OK &&
	    (s = sfw_cuda_malloc(&p->ck, (size_t)nsparse * (size_t)blocks * cb, "the KV pool's compressed keys", err)) !=
		    SFW_OK)
		sfw_cuda_free(p->mem);
	if (s != SFW_OK) {
		sfw_free(p->free), sfw_free(p->ref), sfw_free(p);
		return s;
	}
	*out = p;
	return SFW_OK;
}

static void cu_pool_free(struct sfw_backend *be, struct sfw_bpool *p)
{
	if (!p)
		return;
	sfw_cuda_sync(IMPL(be)->stream);
	sfw_cuda_free(p->mem);
	sfw_cuda_free(p->ck);
	sfw_free(p->free);
	sfw_free(p->ref);
	sfw_free(p);
}

static int64_t cu_pool_used(struct sfw_backend *be, const struct sfw_bpool *p)
{
	(void)be;
	return p->nblocks - p->nfree;
}

void sfwi_cu_caches(struct sfw_backend *be)
{
	be->cache_new = cu_cache_new;
	be->cache_free = cu_cache_free;
	be->cache_reserve = cu_cache_reserve;
	be->pool_new = cu_pool_new;
	be->pool_free = cu_pool_free;
	be->pool_used = cu_pool_used;
}
