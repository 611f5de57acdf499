/* rng.h - the tests' data generator (splitmix64): deterministic, with its
 * state in the caller's hands, independent of anything under test. */
#ifndef SFW_TEST_RNG_H
#define SFW_TEST_RNG_H

#include <stdint.h>
#include <stdlib.h>

static inline uint64_t sfwt_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1), 24 bits. */
static inline float sfwt_unit(uint64_t *state)
{
	return (float)(sfwt_next(state) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform in [-1, 1). */
static inline float sfwt_urand(uint64_t *state)
{
	return sfwt_unit(state) * 2.0f - 1.0f;
}

/* t[0 .. n) = 0 .. n-1 in a random order (Fisher-Yates, one draw per
 * place from the last down): a paged cache's block table in the tests. */
static inline void sfwt_iota_shuffle(int32_t *t, int64_t n, uint64_t *state)
{
	for (int64_t i = 0; i < n; i++)
		t[i] = (int32_t)i;
	for (int64_t i = n - 1; i > 0; i--) {
		int64_t j = (int64_t)(sfwt_next(state) % (uint64_t)(i + 1));
		int32_t x = t[i];
		t[i] = t[j], t[j] = x;
	}
}

/* A paged cache's block table for nb blocks (kernels/ops.h, struct
 * sfw_pages): distinct places in a pool of 2 nb blocks, shuffled; the
 * table holds all 2 nb (the first nb are the cache's). malloc'd; NULL when
 * out of memory. */
static inline int32_t *sfwt_block_table(int64_t nb, uint64_t *state)
{
	int32_t *t = (int32_t *)malloc((size_t)(2 * nb) * sizeof(int32_t));
	if (t)
		sfwt_iota_shuffle(t, 2 * nb, state);
	return t;
}

#endif