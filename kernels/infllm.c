/* infllm.c - InfLLM-v2 block selection on the CPU (docs/model-spec.md §2.6.3-2.6.4):
 * mean-pooled key compression, stage-1 scores normalised by the level-2 LSE
 * and summed over each KV group, max-pooling to blocks with forced init and
 * local blocks, and top-k with ties to the lower block index. */
#include "kernels/ops.h"
#include "alloc.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int32_t *pg_tab(const struct sfw_pages *pg)
{
	return pg ? pg->tab : NULL;
}

static int pg_shift(const struct sfw_pages *pg)
{
	return pg && pg->tab ? pg->shift : 0;
}

void sfw_op_compress_cpu(float *c, const float *k, int level, int64_t j0, int64_t j1,
			 const struct sfw_sel_shape *sh, const struct sfw_pages *pg)
{
	int nkv = sh->nkv, hd = sh->hd, lv = level == 2 ? 4 : 1;
	int ksize = lv * sh->ksize, stride = lv * sh->stride;
	SFW_ASSERT(level == 1 || level == 2);
	SFW_ASSERT(!pg_tab(pg) || sfw_ckey_rows_per_block(pg->shift, sh->stride) > 0);
	size_t row = (size_t)nkv * hd;
	for (int64_t j = j0; j < j1; j++) {
		float *out = c + (size_t)sfw_ckey_row(pg_tab(pg), pg_shift(pg), sh->ksize, sh->stride, level, j) * row;
		memset(out, 0, row * sizeof(float));
		for (int t = 0; t < ksize; t++) {
			const float *kt = k + ((size_t)j * stride + t) * row;
			for (size_t i = 0; i < row; i++)
				out[i] += kt[i];
		}
		for (size_t i = 0; i < row; i++)
			out[i] /= (float)ksize;
	}
}

/* Chunks of a level visible from position p: j*stride + ksize - 1 <= p. */
static int64_t visible(int64_t p, int64_t n, int ksize, int stride)
{
	if (p < ksize - 1)
		return 0;
	int64_t v = (p - (ksize - 1)) / stride + 1;
	return v < n ? v : n;
}

static float dotf(const float *a, const float *b, int n)
{
	float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		s0 += a[i] * b[i];
		s1 += a[i + 1] * b[i + 1];
		s2 += a[i + 2] * b[i + 2];
		s3 += a[i + 3] * b[i + 3];
	}
	for (; i < n; i++)
		s0 += a[i] * b[i];
	return (s0 + s1) + (s2 + s3);
}

struct s1_job {
	float *scores;
	const float *q, *c1, *c2;
	int64_t n1, n2, pos0;
	int T, nh, nkv, hd, ksize, stride;
	float scale;
	const int32_t *tab; /* paged compressed keys (sfw_ckey_row), or NULL */
	int shift;
};

/* Group g's part of chunk c of level lv. */
static const float *s1_key(const struct s1_job *j, int lv, int64_t c, int g)
{
	const float *base = lv == 2 ? j->c2 : j->c1;
	return base + (size_t)sfw_ckey_row(j->tab, j->shift, j->ksize, j->stride, lv, c) * j->nkv * j->hd +
	       (size_t)g * j->hd;
}

static void s1_items(void *ctx, size_t b, size_t e, int tid)
{
	const struct s1_job *j = ctx;
	(void)tid;
	int group = j->nh / j->nkv, hd = j->hd;
	for (size_t it = b; it < e; it++) {
		int g = (int)(it / (size_t)j->T), r = (int)(it % (size_t)j->T);
		int64_t p = j->pos0 + r;
		int64_t v1 = visible(p, j->n1, j->ksize, j->stride);
		int64_t v2 = visible(p, j->n2, 4 * j->ksize, 4 * j->stride);
		float *s = j->scores + ((size_t)g * j->T + r) * (size_t)j->n1;
		memset(s, 0, (size_t)j->n1 * sizeof(float));
		for (int hh = 0; hh < group; hh++) {
			int h = g * group + hh;
			const float *q = j->q + ((size_t)r * j->nh + h) * hd;
			/* LSE over the visible level-2 keys (-inf when there are none) */
			float mx = -INFINITY;
			for (int64_t c = 0; c < v2; c++) {
				float x = j->scale * dotf(q, s1_key(j, 2, c, g), hd);
				if (x > mx)
					mx = x;
			}
			float lse = -INFINITY;
			if (v2 > 0) {
				float sum = 0;
				for (int64_t c = 0; c < v2; c++)
					sum += expf(j->scale * dotf(q, s1_key(j, 2, c, g), hd) - mx);
				lse = mx + logf(sum);
			}
			for (int64_t c = 0; c < v1; c++) {
				float x = j->scale * dotf(q, s1_key(j, 1, c, g), hd);
				s[c] += expf(x - lse);
			}
		}
		for (int64_t c = 0; c < v1; c++)
			if (isnan(s[c]))
				s[c] = 0;
	}
}

void sfw_op_stage1_cpu(struct sfw_ops_cpu *ex, float *scores, const float *q, const float *c1, const float *c2,
		       const struct sfw_sel_shape *sh, const struct sfw_pages *pg)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd, ksize = sh->ksize, stride = sh->stride;
	int64_t pos0 = sh->pos0, n1 = sh->n1, n2 = sh->n2;
	float scale = sh->scale;
	SFW_ASSERT(nkv > 0 && nh % nkv == 0);
	SFW_ASSERT(!pg_tab(pg) || sfw_ckey_rows_per_block(pg->shift, stride) > 0);
	struct s1_job j = {scores, q,	  c1,	 c2,	 n1,	 n2,	 pos0,	      T,
			   nh,	   nkv,	  hd,	 ksize, stride, scale, pg_tab(pg), pg_shift(pg)};
	size_t items = (size_t)nkv * T;
	double work = (double)items * (double)(n1 + n2) * nh / nkv * hd;
	sfwi_ops_cpu_for(ex, work < 1e5 ? 1 : sfw_ops_cpu_threads(ex), items, 1, s1_items, &j);
}

void sfw_op_pool_blocks_cpu(float *pooled, const float *scores, const struct sfw_sel_shape *sh)
{
	int nkv = sh->nkv, T = sh->T, ksize = sh->ksize, stride = sh->stride, block = sh->block;
	int init_blocks = sh->init_blocks, local_blocks = sh->local_blocks;
	int64_t pos0 = sh->pos0, n1 = sh->n1, nblocks = sh->nblocks;
	for (int g = 0; g < nkv; g++)
		for (int r = 0; r < T; r++) {
			int64_t p = pos0 + r, qb = p / block;
			const float *s = scores + ((size_t)g * T + r) * (size_t)n1;
			float *out = pooled + ((size_t)g * T + r) * (size_t)nblocks;
			for (int64_t b = 0; b < nblocks; b++) {
				if (b < init_blocks || (b >= qb - local_blocks && b <= qb)) {
					out[b] = INFINITY;
					continue;
				}
				/* level-1 chunks overlapping [b*block, b*block + block - 1] */
				int64_t lo_num = b * block - ksize + 1;
				int64_t lo = lo_num <= 0 ? 0 : (lo_num + stride - 1) / stride;
				int64_t hi = (b * block + block - 1) / stride;
				if (hi > n1 - 1)
					hi = n1 - 1;
				float m = -INFINITY;
				for (int64_t c = lo; c <= hi; c++)
					if (s[c] > m)
						m = s[c];
				out[b] = m;
			}
		}
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

void sfw_op_topk_blocks_cpu(struct sfw_ops_cpu *ex, int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh)
{
	int nkv = sh->nkv, T = sh->T, k = sh->topk, block = sh->block;
	int64_t pos0 = sh->pos0, nblocks = sh->nblocks;
	int kk = nblocks < k ? (int)nblocks : k;
	float *best = sfw_malloc(((size_t)kk + 1) * sizeof(float));
	if (!best) { /* no block selected: the attention that reads idx stays in bounds */
		for (size_t i = 0; i < (size_t)nkv * T * (size_t)k; i++)
			idx[i] = -1;
		sfwi_ops_cpu_fail(ex);
		return;
	}
	for (int g = 0; g < nkv; g++)
		for (int r = 0; r < T; r++) {
			int64_t qb = (pos0 + r) / block;
			const float *s = pooled + ((size_t)g * T + r) * (size_t)nblocks;
			int32_t *out = idx + ((size_t)g * T + r) * (size_t)k;
			int n = 0;
			/* Insertion into a list sorted by score descending; scanning b
			 * ascending and inserting after equal scores keeps ties in index
			 * order, so the lower index wins at the k-th rank. */
			for (int64_t b = 0; b < nblocks; b++) {
				float v = s[b];
				if (isnan(v))
					v = INFINITY; /* torch.topk ranks NaN highest */
				if (n == kk && !(v > best[kk - 1]))
					continue;
				int pos = n < kk ? n : kk - 1;
				while (pos > 0 && best[pos - 1] < v) {
					best[pos] = best[pos - 1];
					out[pos] = out[pos - 1];
					pos--;
				}
				best[pos] = v;
				out[pos] = (int32_t)b;
				if (n < kk)
					n++;
			}
			qsort(out, (size_t)n, sizeof(int32_t), cmp_i32);
			for (int i = 0; i < n; i++)
				if (out[i] > qb)
					out[i] = -1;
			for (int i = n; i < k; i++)
				out[i] = -1;
		}
	sfw_free(best);
}
