/* sample.c - the CPU twin of kernels/sample.cu: next-token choice with the
 * meaning of runner/sampler.c for a given uniform u (kernels/ops.h), summed
 * and ordered exactly as the CUDA kernel does (kernels/sample_twin.h). */
#include "kernels/ops.h"
#include "kernels/sample_twin.h"
#include "alloc.h"
#include "sfw.h"

#include <math.h>
#include <stdlib.h>

static int cmp_key_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

static int is_cand(float l)
{
	return !isnan(l) && l != -INFINITY;
}

int32_t sfw_op_sample_cpu(const float *lg, int V, const struct sfw_op_sample_params *p, double u)
{
	int32_t best = -1, inf = -1;
	int n = 0;
	float max = -INFINITY;
	for (int i = 0; i < V; i++) {
		float l = lg[i];
		if (isnan(l))
			continue;
		if (best < 0 || l > lg[best])
			best = i;
		if (l == INFINITY) {
			if (inf < 0)
				inf = i;
		} else if (l != -INFINITY) {
			n++;
			if (l > max)
				max = l;
		}
	}
	if (best < 0)
		best = 0;
	/* a temperature so small that 1/T overflows is the greedy limit */
	if (p->greedy || p->temperature == 0.0f || !isfinite(1.0f / p->temperature) || n == 0)
		return inf >= 0 ? inf : best;
	if (inf >= 0)
		return inf;
	int kk = p->top_k > 0 && p->top_k < n ? p->top_k : 0;
	int cut_p = p->top_p < 1.0f;
	float inv_t = 1.0f / p->temperature;
	int C = (V + SFWS_THREADS - 1) / SFWS_THREADS;
	if (!kk) {
		/* full-vocabulary sums per chunk, as the kernel's threads make them */
		double part[SFWS_THREADS], total = 0;
		for (int t = 0; t < SFWS_THREADS; t++) {
			double s = 0;
			for (int i = t * C; i < V && i < (t + 1) * C; i++)
				if (is_cand(lg[i]))
					s += cut_p ? sfws_exp(SFWS_SUB(lg[i], max))
						   : sfws_exp(SFWS_MUL(SFWS_SUB(lg[i], max), inv_t));
			part[t] = s;
			total += s;
		}
		if (!cut_p) { /* draw in id order */
			double target = u * total, start = 0;
			int32_t last = -1;
			for (int t = 0; t < SFWS_THREADS; t++) {
				if (target < start + part[t]) {
					double acc = start;
					for (int i = t * C; i < V && i < (t + 1) * C; i++) {
						if (!is_cand(lg[i]))
							continue;
						acc += sfws_exp(SFWS_MUL(SFWS_SUB(lg[i], max), inv_t));
						if (target < acc)
							return i;
					}
				}
				start += part[t];
				for (int i = t * C; i < V && i < (t + 1) * C; i++)
					if (is_cand(lg[i]))
						last = i;
			}
			return last;
		}
		/* top-p alone: the nucleus is a prefix of all candidates, best first */
		uint64_t *k = sfw_malloc((size_t)n * sizeof(uint64_t));
		if (!k) { /* V entries of scratch; the greedy choice stands in */
			sfwi_ops_cpu_fail();
			return best;
		}
		int m = 0;
		for (int i = 0; i < V; i++)
			if (is_cand(lg[i]))
				k[m++] = sfws_key(lg[i], i);
		qsort(k, (size_t)n, sizeof(*k), cmp_key_desc);
		double want = (double)p->top_p * total, acc = 0;
		m = n;
		for (int i = 0; i < n; i++) {
			acc += sfws_exp(SFWS_SUB(sfws_key_logit(k[i]), max));
			if (acc >= want) {
				m = i + 1;
				break;
			}
		}
		double sum = 0;
		for (int i = 0; i < m; i++)
			sum += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(k[i]), max), inv_t));
		double target = u * sum;
		int32_t id = sfws_key_id(k[m - 1]);
		acc = 0;
		for (int i = 0; i < m; i++) {
			acc += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(k[i]), max), inv_t));
			if (target < acc) {
				id = sfws_key_id(k[i]);
				break;
			}
		}
		sfw_free(k);
		return id;
	}
	/* top-k: the kk best, best first; then the nucleus among them */
	uint64_t *k = sfw_malloc((size_t)n * sizeof(uint64_t));
	if (!k) {
		sfwi_ops_cpu_fail();
		return best;
	}
	int m = 0;
	for (int i = 0; i < V; i++)
		if (is_cand(lg[i]))
			k[m++] = sfws_key(lg[i], i);
	qsort(k, (size_t)n, sizeof(*k), cmp_key_desc);
	m = kk;
	if (cut_p) {
		double total = 0, acc = 0;
		for (int i = 0; i < kk; i++)
			total += sfws_exp(SFWS_SUB(sfws_key_logit(k[i]), max));
		double want = (double)p->top_p * total;
		for (int i = 0; i < kk; i++) {
			acc += sfws_exp(SFWS_SUB(sfws_key_logit(k[i]), max));
			if (acc >= want) {
				m = i + 1;
				break;
			}
		}
	}
	double sum = 0, acc = 0;
	for (int i = 0; i < m; i++)
		sum += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(k[i]), max), inv_t));
	double target = u * sum;
	int32_t id = sfws_key_id(k[m - 1]);
	for (int i = 0; i < m; i++) {
		acc += sfws_exp(SFWS_MUL(SFWS_SUB(sfws_key_logit(k[i]), max), inv_t));
		if (target < acc) {
			id = sfws_key_id(k[i]);
			break;
		}
	}
	sfw_free(k);
	return id;
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

double sfw_op_sample_uniform(uint64_t s[4])
{
	/* xoshiro256** (Blackman & Vigna), the host sampler's generator */
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return (double)(r >> 11) * 0x1.0p-53;
}
