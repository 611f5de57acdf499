/* attention.c - dense causal and block-sparse causal GQA softmax attention
 * on the CPU (sparse layers, docs/model-spec.md §2.6.2 and §2.6.5). Work items are
 * (row, head) pairs; each computes its scores, then an exact softmax. */
#include "kernels/ops.h"
#include "alloc.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <string.h>

struct attn_job {
	float *o;
	const float *q, *kc, *vc;
	const int32_t *idx; /* NULL: dense */
	int T, nh, nkv, hd, k, block;
	int64_t pos0;
	float scale;
	size_t maxkeys;
	struct sfw_ops_cpu *ex; /* the job view (ops.h): an item's failure */
};

static float dot(const float *a, const float *b, int n)
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

static void attn_items(void *ctx, size_t b, size_t e, int tid)
{
	const struct attn_job *j = ctx;
	(void)tid;
	int hd = j->hd, group = j->nh / j->nkv;
	size_t kstride = (size_t)j->nkv * hd;
	float *sc = sfw_malloc(j->maxkeys * sizeof(float));
	int64_t *pos = sfw_malloc(j->maxkeys * sizeof(int64_t));
	if (!sc || !pos) { /* the caller learns it from sfw_ops_cpu_take_failure */
		sfw_free(sc), sfw_free(pos);
		sfwi_ops_cpu_fail(j->ex);
		return;
	}
	for (size_t it = b; it < e; it++) {
		int r = (int)(it / (size_t)j->nh), h = (int)(it % (size_t)j->nh), g = h / group;
		int64_t p = j->pos0 + r;
		const float *q = j->q + ((size_t)r * j->nh + h) * hd;
		size_t n = 0;
		if (!j->idx) {
			for (int64_t t = 0; t <= p; t++)
				pos[n++] = t;
		} else {
			const int32_t *sel = j->idx + ((size_t)g * j->T + r) * j->k;
			for (int s = 0; s < j->k; s++) {
				if (sel[s] < 0)
					continue;
				int64_t t0 = (int64_t)sel[s] * j->block;
				for (int64_t t = t0; t < t0 + j->block && t <= p; t++)
					pos[n++] = t;
			}
		}
		float mx = -INFINITY;
		for (size_t i = 0; i < n; i++) {
			sc[i] = j->scale * dot(q, j->kc + (size_t)pos[i] * kstride + (size_t)g * hd, hd);
			if (sc[i] > mx)
				mx = sc[i];
		}
		float *o = j->o + ((size_t)r * j->nh + h) * hd;
		memset(o, 0, (size_t)hd * sizeof(float));
		if (n == 0)
			continue; /* nothing visible: zeros (never happens with block 0 forced) */
		float sum = 0;
		for (size_t i = 0; i < n; i++) {
			float w = expf(sc[i] - mx);
			sum += w;
			const float *v = j->vc + (size_t)pos[i] * kstride + (size_t)g * hd;
			for (int c = 0; c < hd; c++)
				o[c] += w * v[c];
		}
		float inv = 1.0f / sum;
		for (int c = 0; c < hd; c++)
			o[c] *= inv;
	}
	sfw_free(sc);
	sfw_free(pos);
}

static void run(struct sfw_ops_cpu *ex, struct attn_job *j)
{
	size_t items = (size_t)j->T * j->nh;
	double work = (double)items * (double)j->maxkeys * j->hd;
	int nt = work < 1e5 ? 1 : sfw_ops_cpu_threads(ex);
	j->ex = sfwi_ops_cpu_job(ex);
	sfwi_ops_cpu_for(ex, nt, items, 1, attn_items, j);
}

void sfw_op_attn_dense_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *kc, const float *vc,
			   const struct sfw_attn_shape *sh)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
	int64_t pos0 = sh->pos0;
	float scale = sh->scale;
	SFW_ASSERT(nkv > 0 && nh % nkv == 0);
	struct attn_job j = {o, q, kc, vc, NULL, T, nh, nkv, hd, 0, 0, pos0, scale, (size_t)(pos0 + T), NULL};
	run(ex, &j);
}

void sfw_op_attn_sparse_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *kc, const float *vc, const int32_t *idx,
			    const struct sfw_attn_shape *sh)
{
	int T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd, k = sh->topk, block = sh->block;
	int64_t pos0 = sh->pos0;
	float scale = sh->scale;
	SFW_ASSERT(nkv > 0 && nh % nkv == 0);
	size_t maxkeys = (size_t)k * block;
	struct attn_job j = {o, q, kc, vc, idx, T, nh, nkv, hd, k, block, pos0, scale, maxkeys, NULL};
	run(ex, &j);
}

/* ---- the fp8 KV cache (ops.h) ---- */

static int64_t kv8_row(const struct sfw_pages *pg, int64_t t)
{
	if (!pg || !pg->tab)
		return t;
	return ((int64_t)pg->tab[t >> pg->shift] << pg->shift) + (t & (((int64_t)1 << pg->shift) - 1));
}

/* one head's hd values to codes and a scale */
static void kv8_quant(uint8_t *codes, float *scale, const float *x, int hd)
{
	float amax = 0, s, inv;
	for (int i = 0; i < hd; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	sfw_kv8_scale_of(amax, &s, &inv);
	for (int i = 0; i < hd; i++)
		codes[i] = sfw_e4m3_from_f32(x[i] * inv);
	*scale = s;
}

void sfw_op_kv8_write_cpu(uint8_t *kc, uint8_t *vc, const float *k, const float *v, int T, int nkv, int hd,
			  int64_t pos0, const struct sfw_pages *pg)
{
	for (int r = 0; r < T; r++) {
		int64_t row = kv8_row(pg, pos0 + r);
		for (int g = 0; g < nkv; g++) {
			size_t src = ((size_t)r * nkv + g) * hd, co = sfw_kv8_codes_off(row, g, nkv, hd),
			       so = sfw_kv8_scale_off(row, g, nkv, hd);
			float s;
			kv8_quant(kc + co, &s, k + src, hd);
			memcpy(kc + so, &s, 4);
			kv8_quant(vc + co, &s, v + src, hd);
			memcpy(vc + so, &s, 4);
		}
	}
}

void sfw_op_kv8_read_cpu(float *x, const uint8_t *c, int64_t t0, int64_t t1, int nkv, int hd,
			 const struct sfw_pages *pg)
{
	for (int64_t t = t0; t < t1; t++) {
		int64_t row = kv8_row(pg, t);
		for (int g = 0; g < nkv; g++) {
			const uint8_t *codes = c + sfw_kv8_codes_off(row, g, nkv, hd);
			float s;
			memcpy(&s, c + sfw_kv8_scale_off(row, g, nkv, hd), 4);
			float *out = x + ((size_t)(t - t0) * nkv + g) * hd;
			for (int i = 0; i < hd; i++)
				out[i] = sfw_e4m3_to_f32(codes[i]) * s;
		}
	}
}

void sfw_op_kv8_round_cpu(float *x, int hd)
{
	uint8_t codes[1024];
	SFW_ASSERT(hd > 0 && hd <= 1024);
	float s;
	kv8_quant(codes, &s, x, hd);
	for (int i = 0; i < hd; i++)
		x[i] = sfw_e4m3_to_f32(codes[i]) * s;
}
