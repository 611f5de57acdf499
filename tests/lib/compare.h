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

/* Two [rows, V] logits matrices a (the reference) and b: max |a - b| /
 * max |a|, the rows whose argmax (first of equals) agree, and the rows
 * whose top-2 gap in a is at most max |a - b| (those a change of that size
 * could flip). */
struct cmp_logits {
	double rel;
	long long agree, close;
};

struct cmp_logits cmp_logits(const float *a, const float *b, long long rows, long long V);

#endif
