/* backend_cpu.c - the CPU instance of struct sfw_backend: fp32 activations in
 * host memory, weights used in place from the read-only map (bf16 converted
 * inside the matmul), caches grown with realloc in whole blocks. */
#include "runner/backend.h"
#include "alloc.h"
#include "thread.h"

#include <math.h>
#include <string.h>

struct cpu_layer {
	int sparse;
	float *k, *v;       /* [cap, nkv, hd] */
	float *c1, *c2;     /* [cap1, nkv, hd], [cap2, nkv, hd] */
	int64_t len, cap, n1, n2, cap1, cap2;
	float *state;       /* lightning: [lnh, lhd, lhd] */
};

struct sfw_bcache {
	struct sfw_cache_desc d;
	struct cpu_layer *L;
};

static float *F(const void *p)
{
	return (float *)(uintptr_t)p;
}

/* The backend's executor (thread pool + failure flag, kernels/ops.h) is bound
 * to the calling thread for the length of each op call and the previous
 * binding restored after: two CPU backends never share threads or flags. */
static struct sfw_ops_cpu *enter(struct sfw_backend *be)
{
	return sfw_ops_cpu_bind(be->impl);
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

static void cpu_weight_release(struct sfw_backend *be, struct sfw_bweight *w)
{
	(void)be, (void)w;
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

static void cpu_to_host_f32(struct sfw_backend *be, float *dst, const void *src, size_t off, size_t n)
{
	(void)be;
	memcpy(dst, (const float *)src + off, n * sizeof(float));
}

static void cpu_from_host_f32(struct sfw_backend *be, void *dst, const float *src, size_t n)
{
	(void)be;
	memcpy(dst, src, n * sizeof(float));
}

static void cpu_copy(struct sfw_backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	memcpy(dst, src, bytes);
}

static void cpu_sync(struct sfw_backend *be)
{
	(void)be;
}

static void cpu_embed(struct sfw_backend *be, void *x, const struct sfw_bweight *E, const int32_t *ids, int T,
		      float scale)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_embed_cpu(F(x), E->host, E->dtype, ids, T, (int)E->cols, scale);
	sfw_ops_cpu_bind(prev);
}

static void cpu_rmsnorm(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int rows,
			int n, float eps)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_rmsnorm_cpu(F(y), F(x), w->host, w->dtype, rows, n, eps);
	sfw_ops_cpu_bind(prev);
}

static void cpu_add_scaled(struct sfw_backend *be, void *x, const void *b, size_t n, float scale)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_add_scaled_cpu(F(x), F(b), n, scale);
	sfw_ops_cpu_bind(prev);
}

static void cpu_sample(struct sfw_backend *be, int32_t *out, const float *logits, int V,
		       const struct sfw_op_sample_params *p, double u)
{
	struct sfw_ops_cpu *prev = enter(be);
	*out = sfw_op_sample_cpu(logits, V, p, u);
	sfw_ops_cpu_bind(prev);
}

/* the composition of add_scaled and rmsnorm (kernels/fused.c) */
static void cpu_add_rmsnorm(struct sfw_backend *be, void *y, void *x, const void *b, float scale,
			    const struct sfw_bweight *w, int rows, int n, float eps)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_add_rmsnorm_cpu(F(y), F(x), F(b), scale, w->host, w->dtype, rows, n, eps);
	sfw_ops_cpu_bind(prev);
}

static void cpu_silu_mul(struct sfw_backend *be, void *y, const void *g, const void *u, size_t n)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_silu_mul_cpu(F(y), F(g), F(u), n);
	sfw_ops_cpu_bind(prev);
}

static void cpu_sigmoid_mul(struct sfw_backend *be, void *y, const void *x, const void *g, size_t n)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_sigmoid_mul_cpu(F(y), F(x), F(g), n);
	sfw_ops_cpu_bind(prev);
}

static void cpu_rope(struct sfw_backend *be, void *x, int T, int nh, int hd, int64_t pos0, float theta)
{
	struct sfw_ops_cpu *prev = enter(be);
	sfw_op_rope_neox_cpu(F(x), T, nh, hd, pos0, theta);
	sfw_ops_cpu_bind(prev);
}

static void cpu_matmul(struct sfw_backend *be, void *y, const void *x, const struct sfw_bweight *w, int M)
{
	struct sfw_ops_cpu *prev = enter(be);
	if (w->dtype == SFW_OP_W8)
		sfw_op_matmul_w8_cpu(F(y), F(x), w->host, w->scales, w->scale_dtype, w->group, M, (int)w->rows,
				     (int)w->cols);
	else
		sfw_op_matmul_cpu(F(y), F(x), w->host, w->dtype, M, (int)w->rows, (int)w->cols);
	sfw_ops_cpu_bind(prev);
}

static void cpu_logits(struct sfw_backend *be, float *y, const void *x, const struct sfw_bweight *w, int M,
		       float in_scale)
{
	struct sfw_ops_cpu *prev = enter(be);
	if (w->dtype == SFW_OP_W8) { /* a third-party checkpoint that quantized lm_head */
		size_t n = (size_t)M * (size_t)w->cols;
		float *xs = sfw_malloc(n * sizeof(float));
		if (!xs) {
			sfwi_ops_cpu_fail();
		} else {
			for (size_t i = 0; i < n; i++)
				xs[i] = F(x)[i] * in_scale;
			sfw_op_matmul_w8_cpu(y, xs, w->host, w->scales, w->scale_dtype, w->group, M, (int)w->rows,
					     (int)w->cols);
			sfw_free(xs);
		}
	} else {
		sfw_op_logits_cpu(y, F(x), w->host, w->dtype, M, (int)w->rows, (int)w->cols, in_scale);
	}
	sfw_ops_cpu_bind(prev);
}

/* ---- caches --------------------------------------------------------------- */

static void cpu_cache_free(struct sfw_backend *be, struct sfw_bcache *c)
{
	(void)be;
	if (!c)
		return;
	if (c->L)
		for (int i = 0; i < c->d.n_layers; i++) {
			struct cpu_layer *l = &c->L[i];
			sfw_free(l->k), sfw_free(l->v), sfw_free(l->c1), sfw_free(l->c2), sfw_free(l->state);
		}
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
	for (int i = 0; i < d->n_layers; i++) {
		c->L[i].sparse = d->mixer[i] == SFW_MIXER_SPARSE;
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
	for (int i = 0; i < d->n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		if (!l->sparse || cap <= l->cap)
			continue;
		int64_t cap1 = cap / d->stride + 1, cap2 = cap / (4 * d->stride) + 1;
		if (grow(&l->k, cap, row) || grow(&l->v, cap, row) || grow(&l->c1, cap1, row) || grow(&l->c2, cap2, row))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for a KV cache of %lld tokens",
					(long long)tokens);
		l->cap = cap, l->cap1 = cap1, l->cap2 = cap2;
	}
	return SFW_OK;
}

static void cpu_cache_reset(struct sfw_backend *be, struct sfw_bcache *c)
{
	(void)be;
	for (int i = 0; i < c->d.n_layers; i++) {
		struct cpu_layer *l = &c->L[i];
		l->len = l->n1 = l->n2 = 0;
		if (l->state)
			memset(l->state, 0, (size_t)c->d.lnh * c->d.lhd * c->d.lhd * sizeof(float));
	}
}

static int64_t cpu_cache_len(struct sfw_backend *be, const struct sfw_bcache *c, int layer)
{
	(void)be;
	return c->L[layer].len;
}

static void cpu_cache_ncompressed(struct sfw_backend *be, const struct sfw_bcache *c, int layer, int64_t out[2])
{
	(void)be;
	out[0] = c->L[layer].n1;
	out[1] = c->L[layer].n2;
}

static void cpu_kv_append(struct sfw_backend *be, struct sfw_bcache *c, int layer, const void *k, const void *v,
			  int T)
{
	(void)be;
	struct cpu_layer *l = &c->L[layer];
	size_t row = (size_t)c->d.nkv * c->d.hd;
	SFW_ASSERT(l->sparse && l->len + T <= l->cap);
	memcpy(l->k + (size_t)l->len * row, k, (size_t)T * row * sizeof(float));
	memcpy(l->v + (size_t)l->len * row, v, (size_t)T * row * sizeof(float));
	l->len += T;
}

static void cpu_attn_dense(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer, int T,
			   int nh, float scale)
{
	struct sfw_ops_cpu *prev = enter(be);
	struct cpu_layer *l = &c->L[layer];
	sfw_op_attn_dense_cpu(F(o), F(q), l->k, l->v, T, nh, c->d.nkv, c->d.hd, l->len - T, scale);
	sfw_ops_cpu_bind(prev);
}

static int64_t nchunks(int64_t len, int ksize, int stride)
{
	return len < ksize ? 0 : (len - ksize) / stride + 1;
}

static enum sfw_status cpu_compress(struct sfw_backend *be, struct sfw_bcache *c, int layer, struct sfw_err *err)
{
	(void)err;
	struct sfw_ops_cpu *prev = enter(be);
	struct cpu_layer *l = &c->L[layer];
	const struct sfw_cache_desc *d = &c->d;
	int64_t t1 = nchunks(l->len, d->ksize, d->stride), t2 = nchunks(l->len, 4 * d->ksize, 4 * d->stride);
	SFW_ASSERT(t1 <= l->cap1 && t2 <= l->cap2);
	if (t1 > l->n1)
		sfw_op_compress_cpu(l->c1, l->k, d->nkv, d->hd, l->n1, t1, d->ksize, d->stride);
	if (t2 > l->n2)
		sfw_op_compress_cpu(l->c2, l->k, d->nkv, d->hd, l->n2, t2, 4 * d->ksize, 4 * d->stride);
	l->n1 = t1 > l->n1 ? t1 : l->n1;
	l->n2 = t2 > l->n2 ? t2 : l->n2;
	sfw_ops_cpu_bind(prev);
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
	float *scores = sfw_malloc(((size_t)nkv * rb * (size_t)(n1 ? n1 : 1)) * sizeof(float));
	float *pooled = sfw_malloc(((size_t)nkv * rb * (size_t)nb) * sizeof(float));
	int32_t *tk = sfw_malloc((size_t)nkv * rb * k * sizeof(int32_t));
	if (!scores || !pooled || !tk) {
		sfw_free(scores), sfw_free(pooled), sfw_free(tk);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for block selection");
	}
	struct sfw_ops_cpu *prev = enter(be);
	for (int r0 = 0; r0 < sp->T; r0 += rb) {
		int n = sp->T - r0 < rb ? sp->T - r0 : rb;
		int64_t p0 = sp->pos0 + r0;
		sfw_op_stage1_cpu(scores, F(q) + (size_t)r0 * nh * hd, l->c1, n1, l->c2, l->n2, n, nh, nkv, hd, p0,
				  sp->ksize, sp->stride, sp->scale);
		sfw_op_pool_blocks_cpu(pooled, scores, n1, nb, nkv, n, p0, sp->ksize, sp->stride, sp->block,
				       sp->init_blocks, sp->local_blocks);
		sfw_op_topk_blocks_cpu(tk, pooled, nb, nkv, n, p0, k, sp->block);
		for (int g = 0; g < nkv; g++)
			memcpy(idx + ((size_t)g * sp->T + r0) * k, tk + (size_t)g * n * k, (size_t)n * k * sizeof(int32_t));
		if (pooled_last && r0 + n == sp->T)
			for (int g = 0; g < nkv; g++)
				memcpy(pooled_last + (size_t)g * nb, pooled + ((size_t)g * n + (n - 1)) * nb,
				       (size_t)nb * sizeof(float));
	}
	sfw_ops_cpu_bind(prev);
	sfw_free(scores), sfw_free(pooled), sfw_free(tk);
	return SFW_OK;
}

static void cpu_attn_sparse(struct sfw_backend *be, void *o, const void *q, struct sfw_bcache *c, int layer,
			    const int32_t *idx, int nh, const struct sfw_sparse_params *sp)
{
	struct sfw_ops_cpu *prev = enter(be);
	struct cpu_layer *l = &c->L[layer];
	sfw_op_attn_sparse_cpu(F(o), F(q), l->k, l->v, idx, sp->T, nh, c->d.nkv, c->d.hd, sp->pos0, sp->k, sp->block,
			       sp->scale);
	sfw_ops_cpu_bind(prev);
}

static void cpu_gla(struct sfw_backend *be, void *o, const void *q, const void *k, const void *v,
		    struct sfw_bcache *c, int layer, const float *decay, int T, int nh, int hd, float scale)
{
	struct sfw_ops_cpu *prev = enter(be);
	float *S = c->L[layer].state;
	if (T >= 64)
		sfw_op_gla_chunked_cpu(F(o), F(q), F(k), F(v), S, decay, T, nh, hd, scale, 64);
	else
		sfw_op_gla_recurrent_cpu(F(o), F(q), F(k), F(v), S, decay, T, nh, hd, scale);
	sfw_ops_cpu_bind(prev);
}

static enum sfw_status cpu_take_failure(struct sfw_backend *be, struct sfw_err *err)
{
	if (sfw_ops_cpu_take_failure(be->impl))
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a CPU op's scratch");
	return SFW_OK;
}

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
	be->impl = ex;
	be->name = "cpu";
	be->act = SFW_OP_F32;
	be->act_size = sizeof(float);
	be->destroy = cpu_destroy;
	be->weight_upload = cpu_weight_upload;
	be->weight_release = cpu_weight_release;
	be->alloc = cpu_alloc;
	be->free = cpu_free;
	be->to_host_f32 = cpu_to_host_f32;
	be->from_host_f32 = cpu_from_host_f32;
	be->to_host = cpu_copy;
	be->from_host = cpu_copy;
	be->sync = cpu_sync;
	be->embed = cpu_embed;
	be->rmsnorm = cpu_rmsnorm;
	be->add_scaled = cpu_add_scaled;
	be->silu_mul = cpu_silu_mul;
	be->sigmoid_mul = cpu_sigmoid_mul;
	be->rope_neox = cpu_rope;
	be->matmul = cpu_matmul;
	be->logits = cpu_logits;
	be->cache_new = cpu_cache_new;
	be->cache_free = cpu_cache_free;
	be->cache_reserve = cpu_cache_reserve;
	be->cache_reset = cpu_cache_reset;
	be->cache_len = cpu_cache_len;
	be->cache_ncompressed = cpu_cache_ncompressed;
	be->kv_append = cpu_kv_append;
	be->attn_dense = cpu_attn_dense;
	be->compress = cpu_compress;
	be->sparse_select = cpu_sparse_select;
	be->attn_sparse = cpu_attn_sparse;
	be->gla = cpu_gla;
	be->take_failure = cpu_take_failure;
	be->supports_w8 = 1;
	be->add_rmsnorm = cpu_add_rmsnorm;
	be->sample = cpu_sample;
	*out = be;
	return SFW_OK;
}
