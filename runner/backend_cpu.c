/* backend_cpu.c - the CPU instance of struct sfw_backend: fp32 activations in
 * host memory, weights used in place from the read-only map (bf16 converted
 * inside the matmul), caches grown with realloc in whole blocks.
 *
 * Paged KV (pool_new, runner/batch.h): the pool is one anonymous shared
 * file (memfd) holding, per sparse layer and K/V, `blocks` blocks of 64
 * tokens, allocated up front (fallocate). A paged cache reserves, per sparse
 * layer, an address range for its K and one for its V (max_tokens each, no
 * memory behind them), and cache_reserve maps a free pool block into the
 * next 64-token slot of every range: the page table is the block table, and
 * the ops keep reading K/V [len, nkv, hd] at one address. A block's bytes
 * must be whole pages (64 * nkv * hd * 4 a multiple of the page size) and
 * the mappings (blocks x sparse layers x 2) within max_maps(); otherwise
 * pool_new says SFW_E_UNSUPPORTED and the caller keeps per-sequence caches.
 * The compressed keys of a paged cache live in the blocks too: per sparse
 * layer the pool holds a host array of `ckr` compressed-key rows per block
 * (sfw_ckey_row, kernels/ops.h), read through the block table, so a block's
 * holders share its compressed keys with its K/V. A cache of its own keeps
 * its compressed keys in arrays grown by realloc. */
#include "runner/backend.h"
#include "alloc.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct cpu_layer {
	int sparse;
	float *k, *v;       /* [cap, nkv, hd] */
	float *c1, *c2;     /* [cap1, nkv, hd], [cap2, nkv, hd]; paged: the pool's, by the table */
	int64_t len, cap, n1, n2, cap1, cap2;
	float *state;       /* lightning: [lnh, lhd, lhd] */
};

struct sfw_bcache {
	struct sfw_cache_desc d;
	struct cpu_layer *L;
	/* paged (d.pool != NULL): per sparse layer, k and v are views of
	 * maxblk blocks; table[0..nblk) the pool blocks mapped there */
	int32_t *table;
	int64_t nblk, maxblk;
};

/* The mappings a full pool may need (blocks x sparse layers x 2, adjacent
 * ones merge, so this is the worst case): half of vm.max_map_count, the
 * rest left to the process. */
static int64_t max_maps(void)
{
	long long n = 65530; /* Linux's default */
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	if (f) {
		if (fscanf(f, "%lld", &n) != 1)
			n = 65530;
		fclose(f);
	}
	return n / 2;
}

struct sfw_bpool {
	int fd;
	size_t bb;      /* bytes of one block of one layer's K (or V) */
	int nsparse, shift; /* blocks of 2^shift tokens */
	int64_t ckr;    /* compressed-key rows per block (both levels) */
	float *ck;      /* [nsparse, nblocks, ckr, nkv, hd]: the blocks' compressed keys */
	int64_t nblocks, nfree;
	int32_t *free;  /* stack of free block ids */
	int32_t *ref;   /* [nblocks]: the caches holding each block (forks share whole blocks) */
};

static float *F(const void *p)
{
	return (float *)(uintptr_t)p;
}

/* The backend's executor (thread pool + failure flag, kernels/ops.h), passed
 * to every op: two CPU backends never share threads or flags. */
static struct sfw_ops_cpu *EX(struct sfw_backend *be)
{
	return be->impl;
}

static void cpu_destroy(struct sfw_backend *be)
{
	sfw_ops_cpu_free(be->impl);
	sfw_free(be);
}

static enum sfw_status cpu_weight_upload(struct sfw_backend *be, struct sfw_bweight *w, struct sfw_err *err)
{
	(void)be, (void)err;
	w->dev = NULL; /* used in place */
	return SFW_OK;
}

static void *cpu_alloc(struct sfw_backend *be, size_t bytes)
{
	(void)be;
	return sfw_malloc(bytes ? bytes : 1);
}

static void cpu_free(struct sfw_backend *be, void *p)
{
	(void)be;
	sfw_free(p);
}

/* Host memory both sides: every transfer a copy (n floats for the _F32 kinds). */
static void cpu_transfer(struct sfw_backend *be, enum sfw_xfer k, void *dst, const void *src, size_t n)
{
	(void)be;
	memcpy(dst, src, k == SFW_XFER_TO_HOST_F32 || k == SFW_XFER_FROM_HOST_F32 ? n * sizeof(float) : n);
}

/* Nothing to wait for; the executor's failure flag, taken. */
static enum sfw_status cpu_sync(struct sfw_backend *be, int wait, struct sfw_err *err)
{
	(void)wait;
	if (sfw_ops_cpu_take_failure(be->impl))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a CPU op's scratch");
	return SFW_OK;
}

static void cpu_embed(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids, int T,
		      float scale)
{
	(void)be;
	sfw_op_embed_cpu(F(x), E->host, E->dtype, ids, T, (int)E->cols, scale);
}

static void cpu_rmsnorm(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int rows,
			int n, float eps)
{
	sfw_op_rmsnorm_cpu(EX(be), F(y), F(x), w->host, w->dtype, rows, n, eps);
}

static void cpu_add_scaled(struct sfw_backend *be, void *x, const void *b, size_t n, float scale)
{
	(void)be;
	sfw_op_add_scaled_cpu(F(x), F(b), n, scale);
}

static int cpu_sample(struct sfw_backend *be, int32_t *out, const float *logits, int V, int n,
		      const struct sfw_op_sample_params *const *p, const double *u)
{
	for (int i = 0; i < n; i++)
		if (p[i])
			out[i] = sfw_op_sample_cpu(EX(be), logits + (size_t)i * V, V, p[i], u[i]);
	return 1;
}

/* the composition of add_scaled and rmsnorm (kernels/fused.c) */
static void cpu_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			    const struct sfw_bweight *w, int rows, int n, float eps)
{
	struct sfw_norm_shape sh = {rows, n, eps, w->dtype};
	sfw_op_add_rmsnorm_cpu(EX(be), F(y), F(x), F(b), scale, w->host, &sh);
}

/* the composition of rmsnorm and sigmoid_mul (kernels/fused.c) */
static void cpu_rmsnorm_gate(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w,
			     const void *z, int rows, int n, float eps)
{
	struct sfw_norm_shape sh = {rows, n, eps, w->dtype};
	sfw_op_rmsnorm_gate_cpu(EX(be), F(y), F(x), w->host, F(z), &sh);
}

/* the norms and RoPE of kernels/fused.c; a missing norm weight leaves that
 * norm out */
static void cpu_qk_norm_rope(struct sfw_backend *be, void *q, void *k, const struct sfw_bweight *qw,
			     const struct sfw_bweight *kw, int T, int nhq, int nhk, int hd, float eps, int rope,
			     int64_t pos0, float theta)
{
	struct sfw_qk_shape sh = {T, nhq, nhk, hd, eps, rope, pos0, theta, qw ? qw->dtype : SFW_DTYPE_F32,
				  kw ? kw->dtype : SFW_DTYPE_F32};
	sfw_op_qk_norm_rope_cpu(EX(be), F(q), F(k), qw ? qw->host : NULL, kw ? kw->host : NULL, &sh);
}

static void cpu_silu_mul(struct sfw_backend *be, void *y, const void *g, const void *u, size_t n)
{
	(void)be;
	sfw_op_silu_mul_cpu(F(y), F(g), F(u), n);
}

static void cpu_sigmoid_mul(struct sfw_backend *be, void *y, const void *x, const void *g, size_t n)
{
	(void)be;
	sfw_op_sigmoid_mul_cpu(F(y), F(x), F(g), n);
}

static void cpu_rope(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0, float theta)
{
	(void)be;
	sfw_op_rope_neox_cpu(F(x), T, nh, hd, pos0, theta);
}

static void cpu_matmul(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M)
{
	struct sfw_w8 w8 = {w->host, w->scales, w->scale_dtype, w->group};
	struct sfw_gemm_shape sh = {M, (int)w->rows, (int)w->cols, 0, 0};
	if (w->dtype == SFW_DTYPE_W8)
		sfw_op_matmul_w8_cpu(EX(be), F(y), F(x), &w8, &sh);
	else
		sfw_op_matmul_cpu(EX(be), F(y), F(x), w->host, w->dtype, M, (int)w->rows, (int)w->cols);
}

static void cpu_logits(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
		       float in_scale)
{
	struct sfw_w8 w8 = {w->host, w->scales, w->scale_dtype, w->group};
	struct sfw_gemm_shape sh = {M, (int)w->rows, (int)w->cols, 0, 0};
	if (w->dtype == SFW_DTYPE_W8) { /* a third-party checkpoint that quantized lm_head */
		size_t n = (size_t)M * (size_t)w->cols;
		float *xs = sfw_malloc(n * sizeof(float));
		if (!xs) {
			sfwi_ops_cpu_fail(EX(be));
		} else {
			for (size_t i = 0; i < n; i++)
				xs[i] = F(x)[i] * in_scale;
			sfw_op_matmul_w8_cpu(EX(be), y, xs, &w8, &sh);
			sfw_free(xs);
		}
	} else {
		sfw_op_logits_cpu(EX(be), y, F(x), w->host, w->dtype, &sh, in_scale);
	}
}

/* Weights as stored (bf16, f32, int8 pack-quantized); paged KV; no
 * recording (a decode step runs its ops as they come). */
/* ---- caches --------------------------------------------------------------- */

/* ---- paged KV pool --------------------------------------------------------- */

static off_t pool_off(const struct sfw_bpool *p, int si, int kv, int32_t b)
{
	return (off_t)((((size_t)si * 2 + (size_t)kv) * (size_t)p->nblocks + (size_t)b) * p->bb);
}

static enum sfw_status cpu_pool_new(struct sfw_backend *be, const struct sfw_cache_desc *d, int64_t blocks,
				    struct sfw_bpool **out, struct sfw_err *err)
{
	(void)be;
	*out = NULL;
	int nsparse = 0;
	for (int i = 0; i < d->n_layers; i++)
		nsparse += d->mixer[i] == SFW_MIXER_SPARSE;
	size_t bb = (size_t)d->block * d->nkv * d->hd * sizeof(float);
	long page = sysconf(_SC_PAGESIZE);
	int shift = 0;
	while (shift < 30 && (1 << shift) < d->block)
		shift++;
	int64_t ckr = d->block == 1 << shift ? sfw_ckey_rows_per_block(shift, d->stride) : 0;
	if (blocks < 1 || page <= 0 || bb % (size_t)page || nsparse == 0 || ckr == 0 ||
	    blocks * 2 * nsparse > max_maps())
		return sfw_fail(err, SFW_E_UNSUPPORTED,
				"no paged KV pool of %lld blocks of %zu bytes here (whole pages, blocks a power of two "
				"and a multiple of 4 strides, at most %lld mappings)",
				(long long)blocks, bb, (long long)max_maps());
	size_t ckn = (size_t)nsparse * (size_t)blocks * (size_t)ckr * d->nkv * d->hd;
	struct sfw_bpool *p = sfw_calloc(1, sizeof(*p));
	if (!p || !(p->free = sfw_malloc((size_t)blocks * sizeof(int32_t))) ||
	    !(p->ref = sfw_calloc((size_t)blocks, sizeof(int32_t))) || !(p->ck = sfw_malloc(ckn * sizeof(float)))) {
		if (p)
			sfw_free(p->free), sfw_free(p->ref);
		sfw_free(p);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a KV pool of %lld blocks", (long long)blocks);
	}
	p->bb = bb, p->nsparse = nsparse, p->shift = shift, p->ckr = ckr, p->nblocks = blocks, p->nfree = blocks;
	for (int64_t i = 0; i < blocks; i++) /* popped lowest first */
		p->free[i] = (int32_t)(blocks - 1 - i);
	off_t size = pool_off(p, nsparse, 0, 0);
	p->fd = memfd_create("salafw-kv-pool", MFD_CLOEXEC);
	int e = p->fd < 0 ? errno : 0;
	if (!e && ftruncate(p->fd, size) != 0)
		e = errno;
	if (!e) { /* the memory now; where fallocate is not supported, on first touch */
		int r = posix_fallocate(p->fd, 0, size);
		if (r != 0 && r != EOPNOTSUPP && r != EINVAL)
			e = r;
	}
	if (e) {
		if (p->fd >= 0)
			close(p->fd);
		sfw_free(p->free), sfw_free(p->ref), sfw_free(p->ck), sfw_free(p);
		return sfw_fail(err, e == ENOSPC || e == ENOMEM ? SFW_E_NOMEM : SFW_E_IO,
				"cannot allocate a KV pool of %lld blocks (%.1f MiB): %s", (long long)blocks,
				(double)size / 1048576.0, strerror(e));
	}
	*out = p;
	return SFW_OK;
}

static void cpu_pool_free(struct sfw_backend *be, struct sfw_bpool *p)
{
	(void)be;
	if (!p)
		return;
	close(p->fd);
	sfw_free(p->free);
	sfw_free(p->ref);
	sfw_free(p->ck);
	sfw_free(p);
}

static int64_t cpu_pool_used(struct sfw_backend *be, const struct sfw_bpool *p)
{
	(void)be;
	return p->nblocks - p->nfree;
}

/* Slot j of every sparse layer's views back to reserved, inaccessible
 * address space; the block returns to the pool when no other cache holds
 * it. */
static void pool_unmap_slot(struct sfw_bcache *c, int64_t j)
{
	struct sfw_bpool *p = c->d.pool;
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		if (!l->sparse)
			continue;
		mmap((char *)l->k + j * p->bb, p->bb, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		mmap((char *)l->v + j * p->bb, p->bb, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	}
	if (--p->ref[c->table[j]] == 0)
		p->free[p->nfree++] = c->table[j];
}

/* Pool block b (one more holder) into slot j (= c->nblk) of every sparse
 * layer's views. */
static enum sfw_status pool_map_block(struct sfw_bcache *c, int64_t j, int32_t b, struct sfw_err *err)
{
	struct sfw_bpool *p = c->d.pool;
	c->table[j] = b;
	p->ref[b]++;
	int si = 0;
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		if (!l->sparse)
			continue;
		for (int kv = 0; kv < 2; kv++) {
			void *at = (char *)(kv ? l->v : l->k) + j * p->bb;
			if (mmap(at, p->bb, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, pool_off(p, si, kv, b)) ==
			    MAP_FAILED) {
				int e = errno;
				pool_unmap_slot(c, j); /* what was mapped of it, and the block */
				return sfw_fail(err, SFW_E_NOMEM, "cannot map a KV block: %s", strerror(e));
			}
		}
		si++;
	}
	return SFW_OK;
}

/* A free block into slot j (= c->nblk) of every sparse layer's views. */
static enum sfw_status pool_map_slot(struct sfw_bcache *c, int64_t j, struct sfw_err *err)
{
	struct sfw_bpool *p = c->d.pool;
	if (p->nfree == 0)
		return sfw_fail(err, SFW_E_NOSPACE, "KV pool full: %lld of %lld blocks in use",
				(long long)(p->nblocks - p->nfree), (long long)p->nblocks);
	/* (a failed map gives the block back: its only holder let it go) */
	return pool_map_block(c, j, p->free[--p->nfree], err);
}

static void cpu_cache_free(struct sfw_backend *be, struct sfw_bcache *c)
{
	(void)be;
	if (!c)
		return;
	if (c->d.pool && c->table)
		while (c->nblk > 0)
			pool_unmap_slot(c, --c->nblk);
	if (c->L)
		for (int i = 0; i < c->d.n_layers; i++) {
			struct cpu_layer *l = &c->L[i];
			if (c->d.pool) {
				size_t span = (size_t)c->maxblk * c->d.pool->bb;
				if (l->k)
					munmap(l->k, span);
				if (l->v)
					munmap(l->v, span);
			} else {
				sfw_free(l->k), sfw_free(l->v), sfw_free(l->c1), sfw_free(l->c2);
			}
			sfw_free(l->state);
		}
	sfw_free(c->table);
	sfw_free(c->L);
	sfw_free(c);
}

static enum sfw_status cpu_cache_new(struct sfw_backend *be, const struct sfw_cache_desc *d,
				     struct sfw_bcache **out, struct sfw_err *err)
{
	struct sfw_bcache *c = sfw_calloc(1, sizeof(*c));
	if (!c || !(c->L = sfw_calloc((size_t)d->n_layers, sizeof(*c->L)))) {
		sfw_free(c);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the context caches");
	}
	c->d = *d;
	c->d.mixer = NULL; /* not kept: the per-layer flag below is enough */
	if (d->pool) {
		c->maxblk = (d->max_tokens + d->block - 1) / d->block;
		if (c->maxblk < 1 || !(c->table = sfw_malloc((size_t)c->maxblk * sizeof(int32_t)))) {
			cpu_cache_free(be, c);
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for a block table");
		}
	}
	for (int i = 0, si = 0; i < d->n_layers; i++) {
		c->L[i].sparse = d->mixer[i] == SFW_MIXER_SPARSE;
		if (c->L[i].sparse && d->pool) { /* address space for max_tokens, no memory */
			struct sfw_bpool *p = d->pool;
			size_t row = (size_t)d->nkv * d->hd, span = (size_t)c->maxblk * p->bb;
			/* the compressed keys: the pool's, this layer's share, through the table */
			c->L[i].c1 = p->ck + (size_t)si++ * (size_t)p->nblocks * (size_t)p->ckr * row;
			c->L[i].c2 = c->L[i].c1 + (size_t)(((int64_t)1 << p->shift) / d->stride) * row;
			for (int kv = 0; kv < 2; kv++) {
				void *v = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
				if (v == MAP_FAILED) {
					cpu_cache_free(be, c);
					return sfw_fail(err, SFW_E_NOMEM, "cannot reserve address space for a paged KV cache");
				}
				*(kv ? &c->L[i].v : &c->L[i].k) = v;
			}
		}
		if (!c->L[i].sparse) {
			c->L[i].state = sfw_calloc((size_t)d->lnh * d->lhd * d->lhd, sizeof(float));
			if (!c->L[i].state) {
				cpu_cache_free(be, c);
				return sfw_fail(err, SFW_E_NOMEM, "out of memory for the lightning states");
			}
		}
	}
	*out = c;
	return SFW_OK;
}

static int grow(float **p, int64_t n, size_t row)
{
	float *q = sfw_realloc(*p, (size_t)n * row * sizeof(float));
	if (!q)
		return -1;
	*p = q;
	return 0;
}

static enum sfw_status cpu_cache_reserve(struct sfw_backend *be, struct sfw_bcache *c, int64_t tokens,
					 struct sfw_err *err)
{
	(void)be;
	const struct sfw_cache_desc *d = &c->d;
	int64_t cap = (tokens + d->block - 1) / d->block * d->block;
	size_t row = (size_t)d->nkv * d->hd;
	if (d->pool) { /* the K/V blocks first: all of them or none */
		int64_t need = cap / d->block, had = c->nblk;
		if (need > c->maxblk)
			return sfw_fail(err, SFW_E_RANGE, "a paged KV cache holds at most %lld tokens, not %lld",
					(long long)d->max_tokens, (long long)tokens);
		for (; c->nblk < need; c->nblk++) {
			enum sfw_status s = pool_map_slot(c, c->nblk, err);
			if (s != SFW_OK) {
				while (c->nblk > had)
					pool_unmap_slot(c, --c->nblk);
				return s;
			}
		}
	}
	for (int i = 0; i < d->n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		if (!l->sparse || cap <= l->cap)
			continue;
		int64_t cap1 = cap / d->stride + 1, cap2 = cap / (4 * d->stride) + 1;
		if (!d->pool && (grow(&l->k, cap, row) || grow(&l->v, cap, row) || grow(&l->c1, cap1, row) ||
				 grow(&l->c2, cap2, row)))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for a KV cache of %lld tokens",
					(long long)tokens);
		l->cap = cap, l->cap1 = cap1, l->cap2 = cap2;
	}
	return SFW_OK;
}

static void cpu_cache_reset(struct sfw_backend *be, struct sfw_bcache *c)
{
	(void)be;
	if (c->d.pool) /* every block back to the pool */
		while (c->nblk > 0)
			pool_unmap_slot(c, --c->nblk);
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		l->len = l->n1 = l->n2 = 0;
		if (c->d.pool)
			l->cap = 0;
		if (l->state)
			memset(l->state, 0, (size_t)c->d.lnh * c->d.lhd * c->d.lhd * sizeof(float));
	}
}

/* Paged: dst (holding no blocks) takes src's whole blocks of its len
 * tokens, one more holder each (a whole block is never written again:
 * tokens are only appended), and a block of its own for the last, partial
 * one, and room for the compressed keys; all or nothing. */
static enum sfw_status pages_share(struct sfw_backend *be, struct sfw_bcache *dst, const struct sfw_bcache *src,
				   int64_t len, struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &src->d;
	SFW_ASSERT(dst->d.pool == d->pool && dst->nblk == 0 && len <= src->nblk * d->block);
	enum sfw_status s = SFW_OK;
	while (s == SFW_OK && dst->nblk < len / d->block) {
		s = pool_map_block(dst, dst->nblk, src->table[dst->nblk], err);
		dst->nblk += s == SFW_OK;
	}
	if (s == SFW_OK)
		s = cpu_cache_reserve(be, dst, len, err);
	if (s != SFW_OK)
		cpu_cache_reset(be, dst); /* empty again: every block let go */
	return s;
}

/* dst becomes src's copy (sfw_be_cache_copy): the K/V and compressed keys
 * of its tokens (paged: src's whole blocks shared, the last partial one
 * copied into a block of dst's own; else into dst's room, reserved by the
 * caller), their counts, the lightning states. */
static enum sfw_status cpu_cache_copy(struct sfw_backend *be, struct sfw_bcache *dst, const struct sfw_bcache *src,
				      struct sfw_err *err)
{
	const struct sfw_cache_desc *d = &src->d;
	size_t row = (size_t)d->nkv * d->hd * sizeof(float);
	SFW_ASSERT(dst != src && dst->d.n_layers == d->n_layers && dst->d.nkv == d->nkv && dst->d.hd == d->hd);
	int64_t len = 0, from = 0; /* tokens, and the first one whose K/V is copied */
	for (int i = 0; i < d->n_layers; i++)
		if (src->L[i].sparse)
			len = src->L[i].len; /* every sparse layer holds the same tokens */
	if (d->pool) {
		enum sfw_status s = pages_share(be, dst, src, len, err);
		if (s != SFW_OK)
			return s;
		from = len / d->block * d->block;
	}
	int64_t part = d->pool && len > from ? len / d->block : -1; /* the partial block, copied */
	for (int i = 0; i < d->n_layers; i++) {
		const struct cpu_layer *s = &src->L[i];
		struct cpu_layer *t = &dst->L[i];
		SFW_ASSERT(s->sparse == t->sparse);
		if (!s->sparse) {
			memcpy(t->state, s->state, (size_t)d->lnh * d->lhd * d->lhd * sizeof(float));
			continue;
		}
		SFW_ASSERT(s->len <= t->cap && s->n1 <= t->cap1 && s->n2 <= t->cap2);
		if (s->len > from) {
			size_t at = (size_t)from * d->nkv * d->hd; /* elements */
			memcpy(t->k + at, s->k + at, (size_t)(s->len - from) * row);
			memcpy(t->v + at, s->v + at, (size_t)(s->len - from) * row);
		}
		if (d->pool) { /* the compressed keys of the partial block (c1: its first row) */
			size_t ckb = (size_t)d->pool->ckr * row;
			if (part >= 0)
				memcpy((char *)t->c1 + (size_t)dst->table[part] * ckb,
				       (const char *)s->c1 + (size_t)src->table[part] * ckb, ckb);
		} else {
			if (s->n1)
				memcpy(t->c1, s->c1, (size_t)s->n1 * row);
			if (s->n2)
				memcpy(t->c2, s->c2, (size_t)s->n2 * row);
		}
		t->len = s->len, t->n1 = s->n1, t->n2 = s->n2;
	}
	return SFW_OK;
}

static void cpu_kv_append(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k, const void *v,
			  int T)
{
	(void)be;
	struct cpu_layer *l = &c->L[layer];
	size_t row = (size_t)c->d.nkv * c->d.hd;
	SFW_ASSERT(l->sparse && l->len + T <= l->cap);
	float *kd = l->k + (size_t)l->len * row, *vd = l->v + (size_t)l->len * row;
	memcpy(kd, k, (size_t)T * row * sizeof(float));
	memcpy(vd, v, (size_t)T * row * sizeof(float));
	if (c->d.kv8) /* the values an fp8 cache holds (kernels/ops.h), kept as floats */
		for (size_t h = 0; h < (size_t)T * c->d.nkv; h++) {
			sfw_op_kv8_round_cpu(kd + h * c->d.hd, c->d.hd);
			sfw_op_kv8_round_cpu(vd + h * c->d.hd, c->d.hd);
		}
	l->len += T;
}

static void cpu_attn_dense(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer, int T,
			   int nh, float scale)
{
	struct cpu_layer *l = &c->L[layer];
	struct sfw_attn_shape sh = {T, nh, c->d.nkv, c->d.hd, l->len - T, scale, 0, 0};
	sfw_op_attn_dense_cpu(EX(be), F(o), F(q), l->k, l->v, &sh);
}

/* Where c's compressed keys are: paged by its block table, or contiguous. */
static struct sfw_pages ckey_pages(const struct sfw_bcache *c)
{
	struct sfw_pages pg = {c->d.pool ? c->table : NULL, c->d.pool ? c->d.pool->shift : 0};
	return pg;
}

static enum sfw_status cpu_compress(struct sfw_backend *be, struct sfw_bcache *c, int layer, struct sfw_err *err)
{
	(void)be, (void)err;
	struct cpu_layer *l = &c->L[layer];
	const struct sfw_cache_desc *d = &c->d;
	int64_t t1 = sfw_nchunks(l->len, d->ksize, d->stride), t2 = sfw_nchunks(l->len, 4 * d->ksize, 4 * d->stride);
	SFW_ASSERT(t1 <= l->cap1 && t2 <= l->cap2);
	struct sfw_sel_shape sh = {.nkv = d->nkv, .hd = d->hd, .ksize = d->ksize, .stride = d->stride};
	struct sfw_pages pg = ckey_pages(c);
	if (t1 > l->n1)
		sfw_op_compress_cpu(l->c1, l->k, 1, l->n1, t1, &sh, &pg);
	if (t2 > l->n2)
		sfw_op_compress_cpu(l->c2, l->k, 2, l->n2, t2, &sh, &pg);
	l->n1 = t1 > l->n1 ? t1 : l->n1;
	l->n2 = t2 > l->n2 ? t2 : l->n2;
	return SFW_OK;
}

#define SELECT_ROWS 32 /* rows per stage-1 batch: bounds the score scratch */

static enum sfw_status cpu_sparse_select(struct sfw_backend *be, int32_t *idx, const void *q, struct sfw_bcache *c,
					 int layer, int nh, const struct sfw_sparse_params *sp, float *pooled_last,
					 struct sfw_err *err)
{
	struct cpu_layer *l = &c->L[layer];
	int nkv = c->d.nkv, hd = c->d.hd, k = sp->k;
	int64_t n1 = l->n1, nb = sp->nblocks;
	int rb = sp->T < SELECT_ROWS ? sp->T : SELECT_ROWS;
	struct sfw_pages pg = ckey_pages(c);
	float *scores = sfw_malloc(((size_t)nkv * rb * (size_t)(n1 ? n1 : 1)) * sizeof(float));
	float *pooled = sfw_malloc(((size_t)nkv * rb * (size_t)nb) * sizeof(float));
	int32_t *tk = sfw_malloc((size_t)nkv * rb * k * sizeof(int32_t));
	if (!scores || !pooled || !tk) {
		sfw_free(scores), sfw_free(pooled), sfw_free(tk);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for block selection");
	}
	for (int r0 = 0; r0 < sp->T; r0 += rb) {
		int n = sp->T - r0 < rb ? sp->T - r0 : rb;
		int64_t p0 = sp->pos0 + r0;
		struct sfw_sel_shape sh = {.T = n, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = p0,
					   .ksize = sp->ksize, .stride = sp->stride, .block = sp->block,
					   .init_blocks = sp->init_blocks, .local_blocks = sp->local_blocks,
					   .scale = sp->scale, .n1 = n1, .n2 = l->n2, .nblocks = nb,
					   .topk = k};
		sfw_op_stage1_cpu(EX(be), scores, F(q) + (size_t)r0 * nh * hd, l->c1, l->c2, &sh, &pg);
		sfw_op_pool_blocks_cpu(pooled, scores, &sh);
		sfw_op_topk_blocks_cpu(EX(be), tk, pooled, &sh);
		for (int g = 0; g < nkv; g++)
			memcpy(idx + ((size_t)g * sp->T + r0) * k, tk + (size_t)g * n * k, (size_t)n * k * sizeof(int32_t));
		if (pooled_last && r0 + n == sp->T)
			for (int g = 0; g < nkv; g++)
				memcpy(pooled_last + (size_t)g * nb, pooled + ((size_t)g * n + (n - 1)) * nb,
				       (size_t)nb * sizeof(float));
	}
	sfw_free(scores), sfw_free(pooled), sfw_free(tk);
	return SFW_OK;
}

static void cpu_attn_sparse(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
			    const int32_t *idx, int nh, const struct sfw_sparse_params *sp)
{
	struct cpu_layer *l = &c->L[layer];
	struct sfw_attn_shape sh = {sp->T, nh, c->d.nkv, c->d.hd, sp->pos0, sp->scale, sp->k, sp->block};
	sfw_op_attn_sparse_cpu(EX(be), F(o), F(q), l->k, l->v, idx, &sh);
}

static void cpu_gla(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
		    struct sfw_bcache *c, int layer, const float *decay, int T, int nh, int hd, float scale)
{
	float *S = c->L[layer].state;
	struct sfw_gla_shape sh = {T, nh, hd, scale, 64};
	if (T >= 64)
		sfw_op_gla_chunked_cpu(EX(be), F(o), F(q), F(k), F(v), S, decay, &sh);
	else
		sfw_op_gla_recurrent_cpu(EX(be), F(o), F(q), F(k), F(v), S, decay, &sh);
}

/* SFW_OP_CACHE_VIEW (backend.h): the layer's counts and buffers, after
 * setting its counts; a paged cache's counts only (its compressed keys are
 * the pool's, through the block table) and no set. */
static enum sfw_status cpu_cache_view(struct sfw_bcache *c, int layer, const int64_t *set,
				      struct sfw_cache_view *out, struct sfw_err *err)
{
	if (set && c->d.pool)
		return sfw_fail(err, SFW_E_UNSUPPORTED, "a paged KV cache has no view");
	SFW_ASSERT(layer >= 0 && layer < c->d.n_layers);
	struct cpu_layer *l = &c->L[layer];
	if (set && l->sparse) {
		enum sfw_status s = sfwi_cache_counts_fit(set, l->cap, l->cap1, l->cap2, err);
		if (s != SFW_OK)
			return s;
		l->len = set[0], l->n1 = set[1], l->n2 = set[2];
	}
	*out = (struct sfw_cache_view){l->k, l->v, l->c1, l->c2, l->state, l->len, l->n1, l->n2, l->cap, l->cap1, l->cap2};
	if (c->d.pool)
		out->k = out->v = out->c1 = out->c2 = NULL;
	return SFW_OK;
}

/* Everything but recording (no step member) and the projection groups,
 * SwiGLU over a group and the per-sequence ops, which sfwi_op composes;
 * bf16 and f32 weights, int8 in the products; paged KV; cache copies. */
static int cpu_supports_op(const struct sfw_backend *be, enum sfw_opk k, enum sfw_dtype dt)
{
	(void)be;
	switch (k) {
	case SFW_OP_MATMUL_GROUP:
	case SFW_OP_SWIGLU:
	case SFW_OP_QK_NORM_ROPE_SEQS:
	case SFW_OP_GLA_SEQS:
	case SFW_OP_KV_APPEND_SEQS:
	case SFW_OP_COMPRESS_SEQS:
	case SFW_OP_ATTN_DENSE_SEQS:
		return 0;
	case SFW_OP_POOL:
	case SFW_OP_CACHE_COPY:
		return 1;
	default:
		return sfwi_weight_dtype_ok(k, dt);
	}
}

static enum sfw_status cpu_op(struct sfw_backend *be, const struct sfw_op *o, struct sfw_err *err)
{
	switch (o->kind) {
	case SFW_OP_EMBED:
		cpu_embed(be, o->embed.x, o->embed.E, o->embed.ids, o->embed.T, o->embed.scale);
		break;
	case SFW_OP_RMSNORM:
		cpu_rmsnorm(be, o->norm.y, o->norm.x, o->norm.w, o->norm.rows, o->norm.n, o->norm.eps);
		break;
	case SFW_OP_ADD_RMSNORM:
		cpu_add_rmsnorm(be, o->norm.y, o->norm.x, o->norm.b, o->norm.scale, o->norm.w, o->norm.rows, o->norm.n,
				o->norm.eps);
		break;
	case SFW_OP_RMSNORM_GATE:
		cpu_rmsnorm_gate(be, o->norm.y, o->norm.x, o->norm.w, o->norm.z, o->norm.rows, o->norm.n, o->norm.eps);
		break;
	case SFW_OP_ADD_SCALED:
		cpu_add_scaled(be, o->ew.y, o->ew.b, o->ew.n, o->ew.scale);
		break;
	case SFW_OP_SILU_MUL:
		cpu_silu_mul(be, o->ew.y, o->ew.a, o->ew.b, o->ew.n);
		break;
	case SFW_OP_SIGMOID_MUL:
		cpu_sigmoid_mul(be, o->ew.y, o->ew.a, o->ew.b, o->ew.n);
		break;
	case SFW_OP_ROPE:
		cpu_rope(be, o->rope.x, o->rope.T, o->rope.nh, o->rope.hd, o->rope.pos0, o->rope.theta);
		break;
	case SFW_OP_MATMUL:
		cpu_matmul(be, o->mm.y, o->mm.x, o->mm.w, o->mm.M);
		break;
	case SFW_OP_LOGITS:
		cpu_logits(be, o->mm.y, o->mm.x, o->mm.w, o->mm.M, o->mm.scale);
		break;
	case SFW_OP_QK_NORM_ROPE:
		cpu_qk_norm_rope(be, o->qk.q, o->qk.k, o->qk.qw, o->qk.kw, o->qk.T, o->qk.nhq, o->qk.nhk, o->qk.hd,
				 o->qk.eps, o->qk.rope, o->qk.pos0, o->qk.theta);
		break;
	case SFW_OP_KV_APPEND:
		cpu_kv_append(be, o->cache.c, o->cache.layer, o->cache.k, o->cache.v, o->cache.T);
		break;
	case SFW_OP_ATTN_DENSE:
		cpu_attn_dense(be, o->cache.o, o->cache.q, o->cache.c, o->cache.layer, o->cache.T, o->cache.nh,
			       o->cache.scale);
		break;
	case SFW_OP_COMPRESS:
		return cpu_compress(be, o->cache.c, o->cache.layer, err);
	case SFW_OP_SPARSE_SELECT:
		return cpu_sparse_select(be, o->cache.idx, o->cache.q, o->cache.c, o->cache.layer, o->cache.nh,
					 o->cache.sp, o->cache.pooled_last, err);
	case SFW_OP_ATTN_SPARSE:
		cpu_attn_sparse(be, o->cache.o, o->cache.q, o->cache.c, o->cache.layer, o->cache.idx, o->cache.nh,
				o->cache.sp);
		break;
	case SFW_OP_GLA:
		cpu_gla(be, o->cache.o, o->cache.q, o->cache.k, o->cache.v, o->cache.c, o->cache.layer, o->cache.decay,
			o->cache.T, o->cache.nh, o->cache.hd, o->cache.scale);
		break;
	case SFW_OP_SAMPLE:
		cpu_sample(be, o->sample.out, o->sample.logits, o->sample.V, o->sample.n, o->sample.p, o->sample.u);
		break;
	case SFW_OP_CACHE_COPY:
		return cpu_cache_copy(be, o->copy.dst, o->copy.src, err);
	case SFW_OP_CACHE_VIEW:
		return cpu_cache_view(o->view.c, o->view.layer, o->view.set, o->view.out, err);
	case SFW_OP_CACHE_RESET:
		cpu_cache_reset(be, o->reset.c);
		break;
	default:
		return sfw_fail(err, SFW_E_UNSUPPORTED, "the cpu backend has no op %d", (int)o->kind);
	}
	return SFW_OK;
}

/* The CPU backend's table (backend.h); impl is the op executor, set per
 * instance. No merging, load phases or recorded steps: those are NULL. */
static const struct sfw_backend cpu_backend = {
	.name = "cpu",
	.act = SFW_DTYPE_F32,
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.transfer = cpu_transfer,
	.sync = cpu_sync,
	.weight_upload = cpu_weight_upload,
	.cache_new = cpu_cache_new,
	.cache_free = cpu_cache_free,
	.cache_reserve = cpu_cache_reserve,
	.pool_new = cpu_pool_new,
	.pool_free = cpu_pool_free,
	.pool_used = cpu_pool_used,
	.op = cpu_op,
	.supports_op = cpu_supports_op,
};

enum sfw_status sfw_backend_cpu_new(int nthreads, struct sfw_backend **out, struct sfw_err *err)
{
	struct sfw_backend *be = sfw_calloc(1, sizeof(*be));
	if (!be)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	if (nthreads <= 0)
		nthreads = sfw_default_threads();
	struct sfw_ops_cpu *ex = NULL;
	enum sfw_status s = sfw_ops_cpu_new(nthreads > 256 ? 256 : nthreads, &ex, err);
	if (s != SFW_OK) {
		sfw_free(be);
		return s;
	}
	*be = cpu_backend;
	be->impl = ex;
	*out = be;
	return SFW_OK;
}
