/* compare.h - element-wise comparison statistics shared by the twin tests
 * (CUDA op against its CPU twin, tensor-core path against CUDA-core path). */
#ifndef SFW_TEST_COMPARE_H
#define SFW_TEST_COMPARE_H

#include <stddef.h>

struct cmp_stats {
	double nmse;      /* sum (got - ref)^2 / sum ref^2 (plain sum when ref is all zero) */
	double maxd;      /* max |got - ref| */
	double maxr;      /* max |ref| */
	size_t bad;       /* non-finite mismatches (equal infinities agree) */
	size_t first_bad; /* index of the first, when bad > 0 */
};

struct cmp_stats cmp_stats(const float *got, const float *ref, size_t n);

#endif
