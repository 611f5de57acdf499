/* rng.h - the tests' data generator (splitmix64): deterministic, with its
 * state in the caller's hands, independent of anything under test. */
#ifndef SFW_TEST_RNG_H
#define SFW_TEST_RNG_H

#include <stdint.h>

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

#endif
