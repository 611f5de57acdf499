/* modules: quant runner formats kernels num fetch verify core */
/* test_reentrant.c - two different models in one process do not interfere:
 * tiny-dense and tiny-sparse (../shared/golden) are loaded side by side, each
 * with its own CPU backend (thread pool, failure flag), and run
 *   1. alone, one after the other: the logits of the golden prompt and of
 *      every fed decode step, checked against golden_f32 (test_golden's
 *      logit tolerance, 1e-5 absolute);
 *   2. interleaved on one thread, one call of each model in turn;
 *   3. on two threads at once;
 *   4. while a third thread makes the other model's calls fail (injected
 *      allocation failures on that thread alone);
 * and 2-4 must give the logits of 1 bit for bit, without a failed call.
 * tests/gpu_reentrant.c builds the same test for the CUDA backend (RE_CUDA:
 * golden_bf16, its tolerance, the two models with different backend options,
 * no step 4). */
#include "check.h"
#include "alloc.h"
#include "formats/safetensors.h"
#include "runner/runner.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifndef RE_CUDA
#define RE_NAME "test_reentrant"
#define RE_DEVICE SFW_DEVICE_CPU
#define RE_GOLDEN "golden_f32"
#define RE_TOL 1e-5 /* test_golden's logit tolerance for golden_f32 */
#endif

struct seq {
	const char *name;
	struct sfw_model *m;
	struct sfw_st_file *g;
	const int32_t *ids, *feed;
	size_t n;
	int steps, V;
	float *ref; /* [(steps + 1) * V]: the run alone */
	float *got; /* a later run */
	struct sfw_ctx *c;
	int step; /* next call: 0 = the prompt, i = feed[i - 1] */
	enum sfw_status st;
	char msg[256];
};

/* opts: the backend options of this model (the CUDA test gives the two
 * models different ones). */
static int seq_open(const char *gdir, const char *name, const struct sfw_backend_opts *opts, struct seq *q)
{
	char dir[4096], path[4200];
	struct sfw_err err = {0};
	memset(q, 0, sizeof(*q));
	q->name = name;
	snprintf(dir, sizeof(dir), "%s/%s", gdir, name);
	snprintf(path, sizeof(path), "%s/" RE_GOLDEN ".safetensors", dir);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = RE_DEVICE;
	mp.threads = 2;
	mp.be = *opts;
	if (sfw_model_load(dir, &mp, &q->m, &err) != SFW_OK || sfw_st_open(path, &q->g, &err) != SFW_OK) {
		CHECK(0, "%s: %s", name, err.msg);
		return -1;
	}
	const struct sfw_tensor_info *ids = sfw_st_find(q->g, "input_ids"),
				     *feed = sfw_st_find(q->g, "decode.input_ids");
	if (!ids || !feed || ids->dtype != SFW_DTYPE_I32 || feed->dtype != SFW_DTYPE_I32) {
		CHECK(0, "%s: golden input ids", name);
		return -1;
	}
	q->ids = ids->data, q->n = (size_t)ids->nelem;
	q->feed = feed->data, q->steps = (int)feed->nelem;
	if (q->steps > 8)
		q->steps = 8; /* enough calls to interleave; keeps the test short */
	q->V = sfw_model_config(q->m)->vocab_size;
	q->ref = malloc((size_t)(q->steps + 1) * q->V * sizeof(float));
	q->got = malloc((size_t)(q->steps + 1) * q->V * sizeof(float));
	return q->ref && q->got ? 0 : -1;
}

static void seq_close(struct seq *q)
{
	sfw_ctx_free(q->c);
	sfw_model_free(q->m);
	sfw_st_close(q->g);
	free(q->ref), free(q->got);
}

/* Starts a run (on the sequence's one context, reset). */
static void seq_begin(struct seq *q)
{
	struct sfw_err err = {0};
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	q->step = 0;
	q->st = SFW_OK;
	q->msg[0] = 0;
	if (!q->c && (q->st = sfw_ctx_new(q->m, &xp, &q->c, &err)) != SFW_OK)
		snprintf(q->msg, sizeof(q->msg), "%s", err.msg);
	else
		sfw_ctx_reset(q->c);
}

/* One call; returns 1 while calls remain. */
static int seq_step(struct seq *q, float *out)
{
	if (q->st != SFW_OK || q->step > q->steps)
		return 0;
	struct sfw_err err = {0};
	float *lg = out + (size_t)q->step * q->V;
	q->st = q->step == 0 ? sfw_ctx_prefill(q->c, q->ids, q->n, lg, &err)
			     : sfw_ctx_decode(q->c, q->feed[q->step - 1], lg, &err);
	if (q->st != SFW_OK)
		snprintf(q->msg, sizeof(q->msg), "%s", err.msg);
	q->step++;
	return q->step <= q->steps;
}

static void seq_run(struct seq *q, float *out)
{
	seq_begin(q);
	while (seq_step(q, out))
		;
}

static int same(const struct seq *q)
{
	return q->st == SFW_OK && memcmp(q->ref, q->got, (size_t)(q->steps + 1) * q->V * sizeof(float)) == 0;
}

/* The run alone against the golden file: the last row of prefill.logits, then decode.logits. */
static void check_golden(const struct seq *q)
{
	const struct sfw_tensor_info *pl = sfw_st_find(q->g, "prefill.logits"),
				     *dl = sfw_st_find(q->g, "decode.logits");
	if (!pl || !dl || pl->dtype != SFW_DTYPE_F32 || dl->dtype != SFW_DTYPE_F32) {
		CHECK(0, "%s: golden logits present", q->name);
		return;
	}
	double worst = 0;
	for (int s = 0; s <= q->steps; s++) {
		/* prefill.logits may hold only the last positions (tiny-sparse): its last row is the prompt's
		 */
		const float *r = s == 0 ? (const float *)pl->data + (size_t)(pl->shape[0] - 1) * q->V
					: (const float *)dl->data + (size_t)(s - 1) * q->V;
		for (int i = 0; i < q->V; i++) {
			double d = fabs((double)r[i] - q->ref[(size_t)s * q->V + i]);
			if (!(d <= worst))
				worst = isnan(d) ? INFINITY : d;
		}
	}
	CHECK(worst < RE_TOL,
	      "%s alone: logits of the prompt and %d decode steps within %g of " RE_GOLDEN " (max %.3g)",
	      q->name, q->steps, RE_TOL, worst);
}

static void *thread_run(void *arg)
{
	struct seq *q = arg;
	seq_run(q, q->got);
	return NULL;
}

#ifndef RE_CUDA
/* Injected allocation failures on this thread only, on the other model,
 * until *stop: every call must fail with NOMEM or succeed. */
struct failer {
	struct sfw_model *m;
	const int32_t *ids;
	size_t n;
	atomic_int *stop;
	int calls, failed, bad;
};

static void *thread_fail(void *arg)
{
	struct failer *f = arg;
	struct sfw_err err = {0};
	struct sfw_ctx *c = NULL;
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	if (sfw_ctx_new(f->m, &xp, &c, &err) != SFW_OK) {
		f->bad++;
		return NULL;
	}
	for (long k = 1; !atomic_load(f->stop) || f->calls < 4; k = k % 3000 + 7) {
		sfw_ctx_reset(c);
		sfw_alloc_fail_after(k);
		enum sfw_status s = sfw_ctx_prefill(c, f->ids, f->n, NULL, &err);
		sfw_alloc_fail_after(0);
		f->calls++;
		f->failed += s != SFW_OK;
		f->bad += s != SFW_OK && s != SFW_E_NOMEM;
	}
	sfw_ctx_free(c);
	return NULL;
}
#endif

int main(void)
{
	const char *gdir = check_golden_dir();
	if (!gdir)
		return CHECK_REPORT(RE_NAME);
	struct seq a, b;
	struct sfw_backend_opts oa = {0}, ob = {0};
#ifdef RE_CUDA
	oa.attn = oa.stage1 = 1; /* CUDA-core kernels for one model, tensor cores for the other */
	ob.attn = ob.stage1 = 2;
#endif
	memset(&a, 0, sizeof(a)), memset(&b, 0, sizeof(b));
	if (seq_open(gdir, "tiny-dense", &oa, &a) || seq_open(gdir, "tiny-sparse", &ob, &b)) {
		seq_close(&a), seq_close(&b);
		return CHECK_REPORT(RE_NAME);
	}
	/* 1. alone */
	seq_run(&a, a.ref);
	seq_run(&b, b.ref);
	CHECK(a.st == SFW_OK && b.st == SFW_OK, "runs alone: %s %s", a.msg, b.msg);
	check_golden(&a);
	check_golden(&b);

	/* 2. interleaved on one thread */
	seq_begin(&a);
	seq_begin(&b);
	int more_a = 1, more_b = 1;
	while (more_a || more_b) {
		if (more_a)
			more_a = seq_step(&a, a.got);
		if (more_b)
			more_b = seq_step(&b, b.got);
	}
	CHECK(same(&a) && same(&b),
	      "interleaved on one thread: both models' logits equal their runs alone (%s%s)", a.msg, b.msg);

	/* 3. two threads */
	memset(a.got, 0, (size_t)(a.steps + 1) * a.V * sizeof(float));
	memset(b.got, 0, (size_t)(b.steps + 1) * b.V * sizeof(float));
	pthread_t ta, tb;
	CHECK(pthread_create(&ta, NULL, thread_run, &a) == 0 &&
		  pthread_create(&tb, NULL, thread_run, &b) == 0,
	      "two threads start");
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	CHECK(same(&a) && same(&b),
	      "on two threads at once: both models' logits equal their runs alone (%s%s)", a.msg, b.msg);

#ifndef RE_CUDA
	/* 4. tiny-sparse three times while tiny-dense's calls fail on another thread */
	atomic_int stop;
	atomic_init(&stop, 0);
	struct failer f = {a.m, a.ids, a.n, &stop, 0, 0, 0};
	pthread_t tf;
	int ok = pthread_create(&tf, NULL, thread_fail, &f) == 0, all_same = 1;
	for (int r = 0; ok && r < 3; r++) {
		memset(b.got, 0, (size_t)(b.steps + 1) * b.V * sizeof(float));
		seq_run(&b, b.got);
		all_same &= same(&b);
	}
	atomic_store(&stop, 1);
	if (ok)
		pthread_join(tf, NULL);
	CHECK(ok && f.failed > 0 && f.bad == 0,
	      "the failing model: %d of %d calls failed, all with NOMEM (%d otherwise)", f.failed, f.calls,
	      f.bad);
	CHECK(all_same, "the other model meanwhile: no failed call, logits equal its run alone (%s)", b.msg);
#endif
	seq_close(&a);
	seq_close(&b);
	return CHECK_REPORT(RE_NAME);
}
