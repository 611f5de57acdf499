#include "compare.h"

#include <math.h>

struct cmp_stats cmp_stats(const float *got, const float *ref, size_t n)
{
	struct cmp_stats c = {0, 0, 0, 0, 0};
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		if (isinf(ref[i]) && got[i] == ref[i])
			continue;
		double d = fabs((double)got[i] - ref[i]);
		if (!(d == d) || isinf(got[i]) != isinf(ref[i])) {
			if (!c.bad++)
				c.first_bad = i;
			continue;
		}
		num += d * d;
		den += (double)ref[i] * ref[i];
		if (d > c.maxd)
			c.maxd = d;
		if (fabs(ref[i]) > c.maxr)
			c.maxr = fabs(ref[i]);
	}
	c.nmse = den > 0 ? num / den : num;
	return c;
}

struct cmp_logits cmp_logits(const float *a, const float *b, long long rows, long long V)
{
	struct cmp_logits c = {0, 0, 0};
	double amax = 0, dmax = 0;
	for (long long r = 0; r < rows; r++) {
		const float *x = a + r * V, *y = b + r * V;
		long long ia = 0, ib = 0;
		for (long long j = 0; j < V; j++) {
			double d = fabs((double)x[j] - y[j]);
			amax = fabs(x[j]) > amax ? fabs(x[j]) : amax;
			dmax = d > dmax ? d : dmax;
			ia = x[j] > x[ia] ? j : ia;
			ib = y[j] > y[ib] ? j : ib;
		}
		c.agree += ia == ib;
	}
	for (long long r = 0; r < rows; r++) {
		const float *x = a + r * V;
		float m1 = -INFINITY, m2 = -INFINITY;
		for (long long j = 0; j < V; j++) {
			if (x[j] > m1)
				m2 = m1, m1 = x[j];
			else if (x[j] > m2)
				m2 = x[j];
		}
		c.close += m1 - m2 <= dmax;
	}
	c.rel = dmax / (amax > 0 ? amax : 1);
	return c;
}
