#include "thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sfw_default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
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

/* ---- persistent pool ------------------------------------------------------ */

struct pool_worker {
	struct sfw_pool *p;
	int tid;
	pthread_t th;
};

struct sfw_pool {
	int n;                      /* threads, the caller's included */
	pthread_mutex_t job_mu;     /* one job at a time */
	pthread_mutex_t mu;         /* guards the fields below */
	pthread_cond_t wake, done;
	uint64_t gen;               /* bumped per job (and at shutdown) */
	int stop;
	struct pf_job *job;
	int job_threads;            /* workers with tid < job_threads take part */
	int pending;                /* workers of the current job not finished */
	struct pool_worker w[];     /* [n], w[0] unused (the caller) */
};

static void *pool_thread(void *arg)
{
	struct pool_worker *w = arg;
	struct sfw_pool *p = w->p;
	uint64_t seen = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->gen == seen && !p->stop)
			pthread_cond_wait(&p->wake, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		if (w->tid >= p->job_threads)
			continue;
		struct pf_job *job = p->job;
		pthread_mutex_unlock(&p->mu);
		pf_run(job, w->tid);
		pthread_mutex_lock(&p->mu);
		if (--p->pending == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void pool_stop(struct sfw_pool *p, int started)
{
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i <= started; i++)
		pthread_join(p->w[i].th, NULL);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->mu);
	pthread_mutex_destroy(&p->job_mu);
	free(p);
}

enum sfw_status sfw_pool_new(int nthreads, struct sfw_pool **out, struct sfw_err *err)
{
	if (nthreads < 1 || nthreads > 256)
		return sfw_fail(err, SFW_E_INVAL, "thread pool of %d threads (1 to 256)", nthreads);
	struct sfw_pool *p = calloc(1, sizeof(*p) + (size_t)nthreads * sizeof(p->w[0]));
	if (!p)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a thread pool");
	p->n = nthreads;
	pthread_mutex_init(&p->job_mu, NULL);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	for (int i = 1; i < nthreads; i++) {
		p->w[i].p = p;
		p->w[i].tid = i;
		int rc = pthread_create(&p->w[i].th, NULL, pool_thread, &p->w[i]);
		if (rc != 0) {
			pool_stop(p, i - 1);
			return sfw_fail(err, rc == EAGAIN ? SFW_E_NOMEM : SFW_E_IO,
					"cannot start thread %d of a pool of %d: %s", i, nthreads, strerror(rc));
		}
	}
	*out = p;
	return SFW_OK;
}

void sfw_pool_free(struct sfw_pool *p)
{
	if (p)
		pool_stop(p, p->n - 1);
}

int sfw_pool_threads(const struct sfw_pool *p)
{
	return p->n;
}

void sfw_pool_for(struct sfw_pool *p, int nthreads, size_t n, size_t grain, sfw_range_fn fn, void *ctx)
{
	if (grain == 0)
		grain = 1;
	struct pf_job job = {.fn = fn, .ctx = ctx, .n = n, .grain = grain};
	atomic_init(&job.next, 0);
	size_t chunks = (n + grain - 1) / grain;
	if (nthreads > p->n)
		nthreads = p->n;
	if ((size_t)nthreads > chunks)
		nthreads = chunks ? (int)chunks : 1;
	if (nthreads <= 1) {
		pf_run(&job, 0);
		return;
	}
	pthread_mutex_lock(&p->job_mu);
	pthread_mutex_lock(&p->mu);
	p->job = &job;
	p->job_threads = nthreads;
	p->pending = nthreads - 1;
	p->gen++;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	pf_run(&job, 0);
	pthread_mutex_lock(&p->mu);
	while (p->pending > 0)
		pthread_cond_wait(&p->done, &p->mu);
	p->job = NULL;
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_unlock(&p->job_mu);
}
