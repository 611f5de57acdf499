/* bench_batch.c - aggregate decode throughput of batched decode
 * (runner/batch.h) on one model directory:
 *   bench_batch MODEL [--device cpu|cuda] [--threads N] [--batch 1,8,32,64]
 *               [--ctx L | --ctx LMIN-LMAX] [--gen G] [--chunk C]
 * For each batch size B: a fresh batch of B sequences; sequence i gets a
 * prompt of L tokens (or, with LMIN-LMAX, lengths spread geometrically from
 * LMIN to LMAX: the mixed-length case), BOS then random ids, prefilled in
 * chunks of C rows (default 512), one chunk per step (not timed); then G
 * steps in which every sequence decodes one token (greedy, host argmax,
 * included in the time). Prints the aggregate decode tokens/s (B * G / time)
 * and the median step, against B times the B = 1 figure of the same run.
 * Built in every build; on the CPU it runs as is (small presets: the
 * prefill dominates the wall time, keep L small). */
#include "runner/batch.h"
#include "runner/runner.h"
#include "sfw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int32_t argmax(const float *l, int V)
{
	int32_t b = 0;
	for (int i = 1; i < V; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* One batch size: returns the aggregate tok/s, or < 0 on failure. */
static double run_batch(struct sfw_model *m, int B, int64_t lmin, int64_t lmax, int gen, int chunk, double *med_ms)
{
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size;
	int64_t len[SFW_BATCH_MAX_SEQS], pool = 0, blk = cf->sparse_block_size;
	for (int i = 0; i < B; i++) {
		double f = B > 1 ? (double)i / (B - 1) : 0;
		len[i] = (int64_t)llround((double)lmin * pow((double)lmax / (double)lmin, f));
		pool += (len[i] + gen + blk - 1) / blk * blk;
	}
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = B;
	bp.pool_tokens = pool;
	bp.max_ctx = lmax + gen;
	bp.max_step_rows = chunk > B ? chunk : B;
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)chunk);
	double *steps = malloc(sizeof(double) * (size_t)(gen ? gen : 1));
	int seq[SFW_BATCH_MAX_SEQS];
	int32_t next[SFW_BATCH_MAX_SEQS];
	struct sfw_batch_item it[SFW_BATCH_MAX_SEQS];
	double tps = -1;
	if (!ids || !steps || sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		fprintf(stderr, "bench_batch: B=%d: %s\n", B, err.msg[0] ? err.msg : "out of memory");
		goto out;
	}
	uint64_t rng = 12345;
	for (int i = 0; i < B; i++) {
		if (sfw_batch_seq_open(b, &seq[i], &err) != SFW_OK)
			goto fail;
		for (int64_t off = 0; off < len[i]; off += chunk) {
			int n = (int)(len[i] - off < chunk ? len[i] - off : chunk);
			for (int j = 0; j < n; j++) {
				rng = rng * 6364136223846793005ull + 1442695040888963407ull;
				ids[j] = off + j == 0 ? 1 : (int32_t)(3 + (rng >> 33) % (uint64_t)(V - 11));
			}
			struct sfw_batch_item p = {seq[i], ids, n, off + n == len[i]};
			if (sfw_batch_step(b, &p, 1, &err) != SFW_OK)
				goto fail;
		}
		next[i] = argmax(sfw_batch_logits(b, 0), V);
	}
	double t0 = now_s();
	for (int s = 0; s < gen; s++) {
		double ts = now_s();
		for (int i = 0; i < B; i++)
			it[i] = (struct sfw_batch_item){seq[i], &next[i], 1, 1};
		if (sfw_batch_step(b, it, B, &err) != SFW_OK)
			goto fail;
		for (int i = 0; i < B; i++)
			next[i] = argmax(sfw_batch_logits(b, i), V);
		steps[s] = now_s() - ts;
	}
	double dt = now_s() - t0;
	qsort(steps, (size_t)gen, sizeof(double), cmp_d);
	*med_ms = gen ? steps[gen / 2] * 1e3 : 0;
	tps = dt > 0 ? (double)B * gen / dt : 0;
	goto out;
fail:
	fprintf(stderr, "bench_batch: B=%d: %s\n", B, err.msg);
out:
	sfw_batch_free(b);
	free(ids);
	free(steps);
	return tps;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_batch MODEL [--device cpu|cuda] [--threads N] [--batch 1,8,32,64] "
				"[--ctx L | --ctx LMIN-LMAX] [--gen G] [--chunk C]\n");
		return 2;
	}
	const char *dir = argv[1], *batches = "1,8,32,64", *ctx = "1024";
	int gen = 32, chunk = 512;
	struct sfw_model_params mp = sfw_model_default_params();
	for (int i = 2; i + 1 < argc; i += 2) {
		const char *o = argv[i], *v = argv[i + 1];
		if (!strcmp(o, "--device"))
			mp.device = !strcmp(v, "cpu") ? SFW_DEVICE_CPU : !strcmp(v, "cuda") ? SFW_DEVICE_CUDA : SFW_DEVICE_AUTO;
		else if (!strcmp(o, "--threads"))
			mp.threads = atoi(v);
		else if (!strcmp(o, "--batch"))
			batches = v;
		else if (!strcmp(o, "--ctx"))
			ctx = v;
		else if (!strcmp(o, "--gen"))
			gen = atoi(v);
		else if (!strcmp(o, "--chunk"))
			chunk = atoi(v);
		else {
			fprintf(stderr, "bench_batch: unknown option '%s'\n", o);
			return 2;
		}
	}
	long long lmin = 0, lmax = 0;
	int k = sscanf(ctx, "%lld-%lld", &lmin, &lmax);
	if (k == 1)
		lmax = lmin;
	if (k < 1 || lmin < 1 || lmax < lmin || gen < 1 || chunk < 1 || chunk > 65536) {
		fprintf(stderr, "bench_batch: bad --ctx, --gen or --chunk\n");
		return 2;
	}
	struct sfw_model *m = NULL;
	struct sfw_err err = {0};
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK) {
		fprintf(stderr, "bench_batch: %s\n", err.msg);
		return 1;
	}
	printf("model %s on %s; context %lld%s%lld tokens, %d decode steps, prefill chunk %d\n", dir,
	       sfw_model_device_name(m), lmin, lmin == lmax ? " (all), max " : " to ", lmax, gen, chunk);
	double one = 0;
	int rc = 0;
	for (const char *p = batches; *p;) {
		char *e;
		long B = strtol(p, &e, 10);
		if (e == p || B < 1 || B > SFW_BATCH_MAX_SEQS) {
			fprintf(stderr, "bench_batch: bad --batch '%s'\n", batches);
			rc = 2;
			break;
		}
		p = *e == ',' ? e + 1 : e;
		double med = 0, tps = run_batch(m, (int)B, lmin, lmax, gen, chunk, &med);
		if (tps < 0) {
			rc = 1;
			continue;
		}
		if (B == 1)
			one = tps;
		printf("BATCH B=%ld ctx %lld-%lld: aggregate decode %.1f tok/s (%.2f per sequence), median step %.2f ms",
		       B, lmin, lmax, tps, tps / B, med);
		if (one > 0 && B > 1)
			printf(", %.2fx B=1 (ideal %ld)", tps / one, B);
		printf("\n");
	}
	sfw_model_free(m);
	return rc;
}
