/* thread.h - a minimal parallel-for over pthreads. Work items are handed out
 * dynamically (an atomic counter), so uneven items balance across threads. */
#ifndef SFW_THREAD_H
#define SFW_THREAD_H

#include "sfw.h"

#include <stddef.h>

/* Called for items [begin, end) by worker `tid`. */
typedef void (*sfw_range_fn)(void *ctx, size_t begin, size_t end, int tid);

/* Number of threads to use by default: the online CPU count (at least 1, at
 * most 256). The library reads no environment (the CLI maps SALAFW_THREADS
 * onto the model's thread count). */
int sfw_default_threads(void);

/* Runs fn over [0, n) in chunks of `grain` items on up to nthreads threads
 * (the caller's thread included). Returns 0, or -1 if threads could not be
 * started (the work is then done on the calling thread). */
int sfw_parallel_for(int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx);

/* A persistent pool: nthreads - 1 workers started once, asleep on a
 * condition variable between jobs; the calling thread is worker 0. */
struct sfw_pool;
/* nthreads in [1, 256]. NULL with *out unset when a worker cannot start
 * (SFW_E_NOMEM for memory, SFW_E_IO otherwise); err may be NULL. */
SFW_MUST_CHECK enum sfw_status sfw_pool_new(int nthreads, struct sfw_pool **out, struct sfw_err *err);
void sfw_pool_free(struct sfw_pool *p); /* joins the workers; NULL is a no-op */
int sfw_pool_threads(const struct sfw_pool *p);
/* sfw_parallel_for on the pool: fn over [0, n) in chunks of `grain`, handed
 * out dynamically to at most nthreads of the pool's threads (tid < nthreads),
 * the caller's included; returns when every item is done. Jobs from several
 * threads on one pool run one after the other. fn must not use the same
 * pool. */
void sfw_pool_for(struct sfw_pool *p, int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx);

#endif
