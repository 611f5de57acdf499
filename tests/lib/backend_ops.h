/* backend_ops.h - one table of cases that drives every op of struct
 * sfw_backend (runner/backend.h) on a backend under test against a
 * reference backend (the CPU one), through the table only: buffers come
 * from be->alloc and cross with from_host_f32 / to_host_f32 / from_host /
 * to_host exactly as runner/forward.c uses them.
 *
 * Shared by tests/test_backend_ops.c (a 3-thread CPU backend against a
 * 1-thread one: bit-identical expected) and tests/gpu_backend_ops.c (the
 * CUDA backend against the CPU one: the tolerances of the table). Only
 * function pointers of the two backends, libc and the header-only helpers
 * are used here, so this file links into every test binary.
 *
 * A case whose member the backend lacks (NULL, supports_w8 == 0 for int8,
 * matmul_silu returning 0, pool_new saying SFW_E_UNSUPPORTED) is skipped and
 * counted, never passed. */
#ifndef SFW_TEST_BACKEND_OPS_H
#define SFW_TEST_BACKEND_OPS_H

#include "runner/backend.h"

#include <stddef.h>
#include <stdint.h>

struct bo_opts {
	int exact; /* 1: every output bit-identical to ref's; 0: the table's tolerances */
	uint64_t seed;
	const char *filter; /* run only cases whose name contains this (NULL: all) */
	int verbose;	    /* one line per case, not only failures */
	int quiet;	    /* no FAIL lines (a run that must fail: the mutation checks) */
};

struct bo_result {
	int cases, passed, failed, skipped;
	int checks_passed, checks_failed; /* individual comparisons */
};

/* Runs every case of the table on be and ref; prints "FAIL ..." lines for
 * failures and one summary line. */
void bo_run(struct sfw_backend *be, struct sfw_backend *ref, const struct bo_opts *o, struct bo_result *r);

/* ---- helpers the tests share ---- */

/* A weight in host memory as the checkpoint holds it, its float values
 * (dequantized by the contract of num/w8_layout.h for int8), and one
 * sfw_bweight per backend that uploads it. */
struct bo_weight {
	void *host;   /* bf16 bits, f32, or int8 codes [rows, ceil(cols/4)*4] */
	void *scales; /* W8: [rows, ceil(cols/group)] in sdt */
	float *val;   /* [rows, cols] the values the weight stands for */
	struct sfw_bweight w[2];
};
/* dt BF16 / F32: values offset + scale * U(-1, 1) (bf16-rounded for BF16);
 * W8 (scale, offset unused): random codes, scales in [1/128, 1/64) exact in
 * sdt (BF16, F16 or F32),
 * group 32/64/128 or SFW_QL_GROUP_CHANNEL. 0, or -1 out of memory. */
int bo_weight_make(struct bo_weight *bw, enum sfw_dtype dt, enum sfw_dtype sdt, int group, int64_t rows,
		   int64_t cols, float scale, float offset, uint64_t *rng);
void bo_weight_free(struct bo_weight *bw);
/* bf16-exact random values scale * U(-1, 1) (both backends see the same numbers). */
float *bo_rand_act(size_t n, float scale, uint64_t *rng);
/* x rounded to the nearest bf16 (ties to even), as a float. */
float bo_bf16_round(float x);

/* A backend that forwards to `real` (a copy of its table: the same impl and
 * op members) and counts what the memory members take, for checking the
 * memory plan (tools/tools.h) against real allocations: the bytes alloc
 * hands out (live and peak), and the change of now() (the caller's measure
 * of real memory: the heap on the CPU, the CUDA allocator's live bytes on a
 * GPU) across the cache members. Its destroy destroys real. Put it in
 * place of a loaded model's backend (struct sfw_model's be) before the
 * context is made. */
struct bo_counting {
	struct sfw_backend be; /* first: the table the engine sees */
	struct sfw_backend *real;
	size_t (*now)(void);
	size_t alloc_live, alloc_peak;
	long long cache_bytes; /* sum of now() deltas across cache_new / cache_reserve / cache_free */
	struct bo_block {
		void *p;
		size_t n;
	} * blocks;
	size_t nblocks, cap;
};
struct bo_counting *bo_counting_wrap(struct sfw_backend *real, size_t (*now)(void));

#endif
