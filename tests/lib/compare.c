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
