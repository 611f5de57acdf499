/* thread.h - a minimal parallel-for over pthreads. Work items are handed out
 * dynamically (an atomic counter), so uneven items balance across threads. */
#ifndef SFW_THREAD_H
#define SFW_THREAD_H

#include <stddef.h>

/* Called for items [begin, end) by worker `tid`. */
typedef void (*sfw_range_fn)(void *ctx, size_t begin, size_t end, int tid);

/* Number of threads to use by default: SALAFW_THREADS if set, else the
 * online CPU count (at least 1, at most 256). */
int sfw_default_threads(void);

/* Runs fn over [0, n) in chunks of `grain` items on up to nthreads threads
 * (the caller's thread included). Returns 0, or -1 if threads could not be
 * started (the work is then done on the calling thread). */
int sfw_parallel_for(int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx);

#endif
