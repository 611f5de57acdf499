/* lightning.c - simple gated linear attention (Lightning layers, docs/model-spec.md
 * §2.7 step 5) on the CPU: the recurrent form used for decode and the chunked
 * form (as fla's chunk_simple_gla) used for prefill. Heads run in parallel. */
#include "kernels/ops.h"
#include "alloc.h"
#include "sfw.h"
#include "thread.h"

#include <math.h>
#include <string.h>

struct gla_job {
	float *o;
	const float *q, *k, *v;
	float *state;
	const float *decay;
	int T, nh, hd, chunk;
	float scale;
	struct sfw_ops_cpu *ex; /* the job view (ops.h): a head's failure */
};

static void gla_rec_heads(void *ctx, size_t b, size_t e, int tid)
{
	const struct gla_job *j = ctx;
	(void)tid;
	int hd = j->hd;
	size_t rs = (size_t)j->nh * hd; /* stride between tokens */
	for (size_t h = b; h < e; h++) {
		float *S = j->state + h * (size_t)hd * hd;
		float g = expf(-j->decay[h]);
		for (int t = 0; t < j->T; t++) {
			const float *q = j->q + t * rs + h * hd, *k = j->k + t * rs + h * hd, *v = j->v + t * rs + h * hd;
			float *o = j->o + t * rs + h * hd;
			for (int c = 0; c < hd; c++)
				o[c] = 0;
			for (int a = 0; a < hd; a++) {
				float *row = S + (size_t)a * hd;
				float ka = k[a], qa = q[a];
				for (int c = 0; c < hd; c++) {
					row[c] = g * row[c] + ka * v[c];
					o[c] += qa * row[c];
				}
			}
			for (int c = 0; c < hd; c++)
				o[c] *= j->scale;
		}
	}
}

void sfw_op_gla_recurrent_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *k, const float *v, float *state,
			      const float *decay, const struct sfw_gla_shape *sh)
{
	int T = sh->T, nh = sh->nh, hd = sh->hd;
	float scale = sh->scale;
	struct gla_job j = {o, q, k, v, state, decay, T, nh, hd, 0, scale, NULL};
	int nt = T * (size_t)nh * hd * hd < 1 << 16 ? 1 : sfw_ops_cpu_threads(ex);
	sfwi_ops_cpu_for(ex, nt, (size_t)nh, 1, gla_rec_heads, &j);
}

static void gla_chunk_heads(void *ctx, size_t b, size_t e, int tid)
{
	const struct gla_job *j = ctx;
	(void)tid;
	int hd = j->hd, C = j->chunk;
	size_t rs = (size_t)j->nh * hd;
	/* A: C x C intra-chunk weights; dec: gamma^n for n = 0..C. */
	float *A = sfw_malloc(((size_t)C * C + (size_t)C + 1) * sizeof(float));
	if (!A) {
		sfwi_ops_cpu_fail(j->ex);
		return;
	}
	float *dec = A + (size_t)C * C;
	for (size_t h = b; h < e; h++) {
		float *S = j->state + h * (size_t)hd * hd;
		float lg = -j->decay[h];
		for (int n = 0; n <= C; n++)
			dec[n] = expf(lg * (float)n);
		for (int t0 = 0; t0 < j->T; t0 += C) {
			int c = j->T - t0 < C ? j->T - t0 : C;
			/* intra-chunk: A[i][r] = gamma^(i-r) (q_i . k_r), r <= i */
			for (int i = 0; i < c; i++) {
				const float *qi = j->q + (size_t)(t0 + i) * rs + h * hd;
				for (int r = 0; r <= i; r++) {
					const float *kr = j->k + (size_t)(t0 + r) * rs + h * hd;
					float d = 0;
					for (int a = 0; a < hd; a++)
						d += qi[a] * kr[a];
					A[(size_t)i * C + r] = d * dec[i - r];
				}
			}
			for (int i = 0; i < c; i++) {
				const float *qi = j->q + (size_t)(t0 + i) * rs + h * hd;
				float *oi = j->o + (size_t)(t0 + i) * rs + h * hd;
				/* inter-chunk: gamma^(i+1) q_i S */
				for (int cc = 0; cc < hd; cc++)
					oi[cc] = 0;
				for (int a = 0; a < hd; a++) {
					float qa = qi[a];
					const float *row = S + (size_t)a * hd;
					for (int cc = 0; cc < hd; cc++)
						oi[cc] += qa * row[cc];
				}
				for (int cc = 0; cc < hd; cc++)
					oi[cc] *= dec[i + 1];
				for (int r = 0; r <= i; r++) {
					float w = A[(size_t)i * C + r];
					const float *vr = j->v + (size_t)(t0 + r) * rs + h * hd;
					for (int cc = 0; cc < hd; cc++)
						oi[cc] += w * vr[cc];
				}
				for (int cc = 0; cc < hd; cc++)
					oi[cc] *= j->scale;
			}
			/* state: S = gamma^c S + sum_r gamma^(c-1-r) k_r^T v_r */
			for (size_t x = 0; x < (size_t)hd * hd; x++)
				S[x] *= dec[c];
			for (int r = 0; r < c; r++) {
				const float *kr = j->k + (size_t)(t0 + r) * rs + h * hd;
				const float *vr = j->v + (size_t)(t0 + r) * rs + h * hd;
				float w = dec[c - 1 - r];
				for (int a = 0; a < hd; a++) {
					float ka = kr[a] * w;
					float *row = S + (size_t)a * hd;
					for (int cc = 0; cc < hd; cc++)
						row[cc] += ka * vr[cc];
				}
			}
		}
	}
	sfw_free(A);
}

void sfw_op_gla_chunked_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *k, const float *v, float *state,
			    const float *decay, const struct sfw_gla_shape *sh)
{
	int T = sh->T, nh = sh->nh, hd = sh->hd, chunk = sh->chunk;
	float scale = sh->scale;
	SFW_ASSERT(chunk > 0);
	struct gla_job j = {o, q, k, v, state, decay, T, nh, hd, chunk, scale, sfwi_ops_cpu_job(ex)};
	sfwi_ops_cpu_for(ex, sfw_ops_cpu_threads(ex), (size_t)nh, 1, gla_chunk_heads, &j);
}
