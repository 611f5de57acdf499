#include "thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

int sfw_default_threads(void)
{
	const char *env = getenv("SALAFW_THREADS");
	long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	if (n > 256)
		n = 256;
	return (int)n;
}

struct pf_job {
	sfw_range_fn fn;
	void *ctx;
	size_t n, grain;
	atomic_size_t next;
};

struct pf_worker {
	struct pf_job *job;
	int tid;
};

static void pf_run(struct pf_job *job, int tid)
{
	for (;;) {
		size_t b = atomic_fetch_add(&job->next, job->grain);
		if (b >= job->n)
			break;
		size_t e = b + job->grain < job->n ? b + job->grain : job->n;
		job->fn(job->ctx, b, e, tid);
	}
}

static void *pf_thread(void *arg)
{
	struct pf_worker *w = arg;
	pf_run(w->job, w->tid);
	return NULL;
}

int sfw_parallel_for(int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx)
{
	if (grain == 0)
		grain = 1;
	struct pf_job job = {.fn = fn, .ctx = ctx, .n = n, .grain = grain};
	atomic_init(&job.next, 0);
	size_t chunks = (n + grain - 1) / grain;
	if (nthreads < 1)
		nthreads = 1;
	if ((size_t)nthreads > chunks)
		nthreads = chunks ? (int)chunks : 1;
	if (nthreads == 1) {
		pf_run(&job, 0);
		return 0;
	}
	pthread_t th[256];
	struct pf_worker w[256];
	int started = 0, rc = 0;
	for (int i = 1; i < nthreads && i < 256; i++) {
		w[i].job = &job;
		w[i].tid = i;
		if (pthread_create(&th[i], NULL, pf_thread, &w[i]) != 0) {
			rc = -1;
			break;
		}
		started = i;
	}
	pf_run(&job, 0);
	for (int i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	return rc;
}
