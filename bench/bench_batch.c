/* bench_batch.c - aggregate decode throughput of batched decode
 * (runner/batch.h) on one model directory:
 *   bench_batch MODEL [--device cpu|cuda] [--threads N] [--batch 1,8,32,64]
 *               [--ctx L | --ctx LMIN-LMAX] [--gen G] [--chunk C]
 *               [--profile 1] [--w8gemv tc|simt]
 * One batch of Bmax sequences (the largest B asked for), prefilled once:
 * sequence i gets a prompt of L tokens (or, with LMIN-LMAX, lengths spread
 * geometrically from LMIN to LMAX: the mixed-length case), BOS then random
 * ids, in chunks of C rows (default 512), one chunk per step (not timed).
 * Then for each batch size B, B of them spread evenly over the set (the
 * shortest and the longest included) decode one untimed step, then G timed
 * steps together (greedy, the choice made in the step: on the device on
 * CUDA, sfw_batch_item.sample). Prints the aggregate decode tokens/s
 * (B * G / time), the lengths it ran at and the median step, against B
 * times the B = 1 figure of the same run. (Each run leaves its sequences
 * G + 1 tokens longer for the next: small against the contexts measured.)
 * --w8gemv tc: an int8 model's steps of up to 8 rows on the tensor-core GEMV
 * (SALAFW_CUDA_W8GEMV=tc's switch, docs/performance.md §5.18).
 * --profile 1: the device time per op (SALAFW_CUDA_PROFILE's, printed at exit). Built in
 * every build; on the CPU it runs as is (small presets: the
 * prefill dominates the wall time, keep L small).
 *
 *   bench_batch MODEL --serve N:P:G [--batch R] [--chunk C] [--tokens 1]
 * The workload of `salafw serve --max-running R --prefill-chunk C` under
 * bench/bench_serve.py, in process and without HTTP (the engine's peer of
 * the server's figure: their ratio is the server's own cost): N requests,
 * each a prompt of P tokens (BOS then random ids) and G tokens
 * made (greedy, EOS ignored), all queued at time 0, at most R running
 * (default 16, serve's). The steps are serve/server.c engine_main's,
 * restated in serve_run: every running request in one sfw_batch_step,
 * decoding ones a row each, prompts a chunk each while the step's budget
 * of C prompt rows lasts, oldest first, the next token chosen in the step;
 * queued requests join as sequences close. One warm-up request alone first
 * (bench_serve.py sends one), untimed. Prints output tok/s = N * G / the
 * wall time from the first step's start to the last's end, prompt tok/s
 * over the same time, and the steps: decode-only (their median time),
 * mixed (a prompt chunk and decode rows), prefill-only. --tokens 1: also a
 * line per request, "REQ i prompt IDS gen IDS" (tests/test_bench_serve.c). */
#include "runner/batch.h"
#include "runner/runner.h"
#include "runner/sampler.h"
#include "sfw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static const struct sfw_op_sample_params greedy = {.temperature = 0, .top_k = 0, .top_p = 1, .greedy = 1};

/* A random token id (the same stream for the same seed): 3 .. V - 9. */
static int32_t rand_id(uint64_t *rng, int V)
{
	*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
	return (int32_t)(3 + (*rng >> 33) % (uint64_t)(V - 11));
}

/* The sequences of one run: n of them, sequence i prefilled with a prompt
 * of len[i] tokens (BOS then random ids) in chunks of `chunk` rows, one
 * chunk per step (not timed); next[i] its first greedy token. */
struct seqs {
	struct sfw_batch *b;
	int n;
	int seq[SFW_BATCH_MAX_SEQS];
	int32_t next[SFW_BATCH_MAX_SEQS];
	int64_t len[SFW_BATCH_MAX_SEQS];
};

static int prefill_all(struct sfw_model *m, struct seqs *S, int nmax, int64_t lmin, int64_t lmax, int gen, int nruns,
		       int chunk)
{
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size;
	int64_t pool = 0, blk = cf->sparse_block_size;
	S->n = nmax;
	for (int i = 0; i < nmax; i++) {
		double f = nmax > 1 ? (double)i / (nmax - 1) : 0;
		S->len[i] = (int64_t)llround((double)lmin * pow((double)lmax / (double)lmin, f));
		pool += (S->len[i] + (int64_t)(gen + 1) * nruns + blk - 1) / blk * blk;
	}
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = nmax;
	bp.pool_tokens = pool;
	bp.max_ctx = lmax + (int64_t)(gen + 1) * nruns; /* each run: its untimed step and gen more */
	bp.max_step_rows = chunk > nmax ? chunk : nmax;
	struct sfw_err err = {0};
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)chunk);
	if (!ids || sfw_batch_new(m, &bp, &S->b, &err) != SFW_OK) {
		fprintf(stderr, "bench_batch: %d sequences: %s\n", nmax, err.msg[0] ? err.msg : "out of memory");
		free(ids);
		return -1;
	}
	uint64_t rng = 12345;
	for (int i = 0; i < nmax; i++) {
		if (sfw_batch_seq_open(S->b, &S->seq[i], &err) != SFW_OK)
			goto fail;
		for (int64_t off = 0; off < S->len[i]; off += chunk) {
			int n = (int)(S->len[i] - off < chunk ? S->len[i] - off : chunk);
			for (int j = 0; j < n; j++) {
				int32_t r = rand_id(&rng, V);
				ids[j] = off + j == 0 ? 1 : r;
			}
			struct sfw_batch_item p = {S->seq[i], ids, n, off + n == S->len[i], NULL, 0};
			if (sfw_batch_step(S->b, &p, 1, &err) != SFW_OK)
				goto fail;
		}
		S->next[i] = sfw_sampler_argmax(sfw_batch_logits(S->b, 0), V);
	}
	free(ids);
	return 0;
fail:
	fprintf(stderr, "bench_batch: prefill: %s\n", err.msg);
	free(ids);
	return -1;
}

/* B of the sequences, spread evenly over them (so a mixed-length run keeps
 * its spread), decode gen steps together: returns the aggregate tok/s, or
 * < 0 on failure. */
static double run_batch(struct seqs *S, int B, int gen, double *med_ms, int64_t *lo, int64_t *hi)
{
	struct sfw_batch_item it[SFW_BATCH_MAX_SEQS];
	int pick[SFW_BATCH_MAX_SEQS];
	struct sfw_err err = {0};
	double *steps = malloc(sizeof(double) * (size_t)gen);
	if (!steps)
		return -1;
	for (int j = 0; j < B; j++)
		pick[j] = B > 1 ? (int)llround((double)j * (S->n - 1) / (B - 1)) : 0;
	*lo = S->len[pick[0]], *hi = S->len[pick[B - 1]];
	/* one step untimed first: this batch size's first step makes what a
	 * running server has long made (the GEMM plans of its row count, a
	 * recording for B = 1) */
	double t0 = 0;
	for (int s = -1; s < gen; s++) {
		if (s == 0)
			t0 = sfw_now_s();
		double ts = sfw_now_s();
		for (int j = 0; j < B; j++)
			it[j] = (struct sfw_batch_item){S->seq[pick[j]], &S->next[pick[j]], 1, 0, &greedy, 0};
		if (sfw_batch_step(S->b, it, B, &err) != SFW_OK) {
			fprintf(stderr, "bench_batch: B=%d: %s\n", B, err.msg);
			free(steps);
			return -1;
		}
		for (int j = 0; j < B; j++)
			S->next[pick[j]] = sfw_batch_next(S->b, j);
		if (s >= 0)
			steps[s] = sfw_now_s() - ts;
	}
	double dt = sfw_now_s() - t0;
	qsort(steps, (size_t)gen, sizeof(double), cmp_d);
	*med_ms = steps[gen / 2] * 1e3;
	free(steps);
	return dt > 0 ? (double)B * gen / dt : 0;
}

/* ---- --serve N:P:G: salafw serve's workload in process ---- */

struct serve_stats {
	int64_t steps, decode_only, mixed, prefill_only; /* steps by what their rows were */
	double wall_s, med_decode_ms;			  /* first step to last; median decode-only step */
};

/* n requests, request i's prompt ids[i * P ..] (P tokens), each run to G
 * tokens (greedy, no EOS) through b: at most R sequences running, the
 * others queued in order behind them, all there from the start. The
 * scheduling restates serve/server.c engine_main: each step, the queue
 * first joins the batch while fewer than R run (sfw_batch_seq_open), then
 * one sfw_batch_step of every running request, oldest first: a decoding
 * one its last token (one row), a prefilling one the next chunk of its
 * prompt while the step's prefill budget (chunk rows) lasts; the step
 * chooses the next token (sfw_batch_item.sample) from a decode row and from
 * a prompt's last chunk, read with sfw_batch_next; a request is closed when
 * it has G tokens. (serve's cancellation, queue limits and failure path
 * have no part here: a failed step ends the run.) out: the n * G tokens,
 * request by request, or NULL. Returns 0, or -1 with a message printed. */
static int serve_run(struct sfw_batch *b, const int32_t *ids, int n, int P, int G, int R, int chunk, int32_t *out,
		     struct serve_stats *st)
{
	struct sfw_batch_item it[SFW_BATCH_MAX_SEQS];
	int run[SFW_BATCH_MAX_SEQS], ir[SFW_BATCH_MAX_SEQS], nrun = 0, queued = 0, rc = -1;
	int64_t *prefilled = calloc((size_t)n, sizeof(int64_t));
	int32_t *next = calloc((size_t)n, sizeof(int32_t));
	int *seq = calloc((size_t)n, sizeof(int)), *made = calloc((size_t)n, sizeof(int));
	size_t cap = 1024, nd = 0;
	double *dec = malloc(cap * sizeof(double));
	struct sfw_err err = {0};
	memset(st, 0, sizeof(*st));
	if (!prefilled || !next || !seq || !made || !dec) {
		fprintf(stderr, "bench_batch: out of memory\n");
		goto out;
	}
	double t0 = sfw_now_s();
	for (;;) {
		while (queued < n && nrun < R) {
			if (sfw_batch_seq_open(b, &seq[queued], &err) != SFW_OK) {
				fprintf(stderr, "bench_batch: request %d: %s\n", queued, err.msg);
				goto out;
			}
			run[nrun++] = queued++;
		}
		if (nrun == 0)
			break;
		int m = 0, prows = 0, drows = 0; /* items; prompt rows, decode rows */
		int64_t budget = chunk;
		for (int i = 0; i < nrun; i++) {
			int r = run[i];
			if (prefilled[r] < P) {
				if (budget <= 0)
					continue;
				int k = (int)(P - prefilled[r] < budget ? P - prefilled[r] : budget);
				budget -= k;
				prows += k;
				it[m] = (struct sfw_batch_item){seq[r], ids + (size_t)r * P + prefilled[r], k, 0, NULL, 0};
			} else {
				it[m] = (struct sfw_batch_item){seq[r], &next[r], 1, 0, NULL, 0};
				drows++;
			}
			if (prefilled[r] >= P || prefilled[r] + it[m].n == P)
				it[m].sample = &greedy;
			ir[m++] = r;
		}
		double ts = sfw_now_s();
		if (sfw_batch_step(b, it, m, &err) != SFW_OK) {
			fprintf(stderr, "bench_batch: step %lld: %s\n", (long long)st->steps, err.msg);
			goto out;
		}
		double dt = sfw_now_s() - ts;
		st->steps++;
		if (!prows) {
			st->decode_only++;
			if (nd == cap) {
				double *d2 = realloc(dec, 2 * cap * sizeof(double));
				if (!d2) {
					fprintf(stderr, "bench_batch: out of memory\n");
					goto out;
				}
				dec = d2, cap *= 2;
			}
			dec[nd++] = dt;
		} else if (drows)
			st->mixed++;
		else
			st->prefill_only++;
		for (int i = 0; i < m; i++) {
			int r = ir[i];
			if (prefilled[r] < P)
				prefilled[r] += it[i].n;
			if (!it[i].sample)
				continue;
			int32_t tok = sfw_batch_next(b, i);
			if (tok < 0) {
				fprintf(stderr, "bench_batch: request %d: the step chose no token\n", r);
				goto out;
			}
			if (out)
				out[(size_t)r * G + made[r]] = tok;
			next[r] = tok;
			if (++made[r] == G) {
				sfw_batch_seq_close(b, seq[r]);
				int j = 0;
				while (run[j] != r)
					j++;
				memmove(run + j, run + j + 1, (size_t)(nrun - j - 1) * sizeof(run[0]));
				nrun--;
			}
		}
	}
	st->wall_s = sfw_now_s() - t0;
	if (nd) {
		qsort(dec, nd, sizeof(double), cmp_d);
		st->med_decode_ms = dec[nd / 2] * 1e3;
	}
	rc = 0;
out:
	if (rc)
		for (int i = 0; i < nrun; i++)
			sfw_batch_seq_close(b, seq[run[i]]);
	free(prefilled);
	free(next);
	free(seq);
	free(made);
	free(dec);
	return rc;
}

/* --serve: one warm-up request alone (as bench/bench_serve.py sends one
 * before each concurrency), then the n requests timed. */
static int serve_main(struct sfw_model *m, int n, int P, int G, int R, int chunk, int tokens)
{
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size;
	int64_t blk = cf->sparse_block_size;
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = R;
	bp.max_ctx = (int64_t)P + G;
	bp.pool_tokens = (int64_t)R * ((bp.max_ctx + blk - 1) / blk * blk); /* as serve: every sequence to max_ctx */
	bp.max_step_rows = R + chunk;					    /* as serve: every decode row and the budget */
	struct sfw_batch *b = NULL;
	struct sfw_err err = {0};
	int32_t *ids = malloc((size_t)n * P * sizeof(int32_t));
	int32_t *out = tokens ? malloc((size_t)n * G * sizeof(int32_t)) : NULL;
	int rc = 1;
	if (!ids || (tokens && !out)) {
		fprintf(stderr, "bench_batch: out of memory\n");
		goto done;
	}
	if (sfw_batch_new(m, &bp, &b, &err) != SFW_OK) {
		fprintf(stderr, "bench_batch: %d sequences: %s\n", R, err.msg);
		goto done;
	}
	uint64_t rng = 12345;
	for (size_t i = 0; i < (size_t)n * P; i++) {
		int32_t r = rand_id(&rng, V);
		ids[i] = i % (size_t)P == 0 ? 1 : r;
	}
	struct serve_stats st;
	if (serve_run(b, ids, 1, P, G, R, chunk, NULL, &st) != 0 || serve_run(b, ids, n, P, G, R, chunk, out, &st) != 0)
		goto done;
	double w = st.wall_s > 0 ? st.wall_s : 1e-9;
	printf("SERVE N=%d R=%d prompt %d gen %d chunk %d: output %.1f tok/s (%.2f s), prompt %.1f tok/s, %lld steps "
	       "(%lld decode-only, median ",
	       n, R, P, G, chunk, (double)n * G / w, st.wall_s, (double)n * P / w, (long long)st.steps,
	       (long long)st.decode_only);
	if (st.decode_only)
		printf("%.2f ms", st.med_decode_ms);
	else
		printf("none");
	printf("; %lld mixed, %lld prefill-only)\n", (long long)st.mixed, (long long)st.prefill_only);
	for (int i = 0; tokens && i < n; i++) {
		printf("REQ %d prompt", i);
		for (int j = 0; j < P; j++)
			printf(" %d", ids[(size_t)i * P + j]);
		printf(" gen");
		for (int j = 0; j < G; j++)
			printf(" %d", out[(size_t)i * G + j]);
		printf("\n");
	}
	rc = 0;
done:
	sfw_batch_free(b);
	free(ids);
	free(out);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_batch MODEL [--device cpu|cuda] [--threads N] [--batch 1,8,32,64] "
				"[--ctx L | --ctx LMIN-LMAX] [--gen G] [--chunk C] [--profile 1] [--kv-cache bf16|fp8]\n"
				"       bench_batch MODEL --serve N:P:G [--batch R] [--chunk C] [--tokens 1] [--device ...] "
				"[--threads N] [--profile 1]\n");
		return 2;
	}
	const char *dir = argv[1], *batches = "1,8,32,64", *ctx = "1024", *serve = NULL;
	int gen = 32, chunk = 512, tokens = 0, set_batch = 0, set_ctx_gen = 0;
	struct sfw_model_params mp = sfw_model_default_params();
	for (int i = 2; i + 1 < argc; i += 2) {
		const char *o = argv[i], *v = argv[i + 1];
		if (!strcmp(o, "--device"))
			mp.device = !strcmp(v, "cpu") ? SFW_DEVICE_CPU : !strcmp(v, "cuda") ? SFW_DEVICE_CUDA : SFW_DEVICE_AUTO;
		else if (!strcmp(o, "--threads"))
			mp.threads = atoi(v);
		else if (!strcmp(o, "--batch"))
			batches = v, set_batch = 1;
		else if (!strcmp(o, "--ctx"))
			ctx = v, set_ctx_gen = 1;
		else if (!strcmp(o, "--gen"))
			gen = atoi(v), set_ctx_gen = 1;
		else if (!strcmp(o, "--serve"))
			serve = v;
		else if (!strcmp(o, "--tokens"))
			tokens = atoi(v) != 0;
		else if (!strcmp(o, "--chunk"))
			chunk = atoi(v);
		else if (!strcmp(o, "--profile"))
			mp.be.profile = atoi(v) != 0;
		else if (!strcmp(o, "--w8gemv") && (!strcmp(v, "tc") || !strcmp(v, "simt")))
			mp.be.w8gemv = !strcmp(v, "tc") ? 2 : 1;
		else if (!strcmp(o, "--kv-cache") && (!strcmp(v, "bf16") || !strcmp(v, "fp8")))
			mp.kv_cache = !strcmp(v, "fp8") ? SFW_KV_CACHE_FP8 : SFW_KV_CACHE_ACT;
		else {
			fprintf(stderr, "bench_batch: unknown option '%s'\n", o);
			return 2;
		}
	}
	int sn = 0, sP = 0, sG = 0, sR = 16; /* --serve N:P:G, --batch R (default: serve's --max-running) */
	if (serve) {
		char *e = NULL;
		int end = 0;
		if (sscanf(serve, "%d:%d:%d%n", &sn, &sP, &sG, &end) != 3 || serve[end] || sn < 1 || sn > 1000000 ||
		    sP < 1 || sP > (1 << 20) || sG < 1 || sG > (1 << 20)) {
			fprintf(stderr, "bench_batch: bad --serve '%s' (N:P:G, requests:prompt tokens:generated tokens)\n",
				serve);
			return 2;
		}
		if (set_batch && ((sR = (int)strtol(batches, &e, 10)) < 1 || sR > SFW_BATCH_MAX_SEQS || *e)) {
			fprintf(stderr, "bench_batch: bad --batch '%s' (with --serve: one R, 1 to %d)\n", batches,
				SFW_BATCH_MAX_SEQS);
			return 2;
		}
		if (set_ctx_gen || chunk < 1 || chunk > 65536) {
			fprintf(stderr, "bench_batch: --serve takes no --ctx or --gen (N:P:G has them); --chunk 1 to 65536\n");
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
	if (serve) {
		printf("model %s on %s; serve workload: %d requests, prompt %d tokens, %d generated, up to %d running, "
		       "prefill chunk %d\n",
		       dir, sfw_model_device_name(m), sn, sP, sG, sR, chunk);
		int src = serve_main(m, sn, sP, sG, sR, chunk, tokens);
		sfw_model_free(m);
		return src;
	}
	printf("model %s on %s; context %lld%s%lld tokens, %d decode steps, prefill chunk %d\n", dir,
	       sfw_model_device_name(m), lmin, lmin == lmax ? " (all), max " : " to ", lmax, gen, chunk);
	int Bs[64], nb = 0, bmax = 0, rc = 0;
	for (const char *p = batches; *p && nb < 64;) {
		char *e;
		long B = strtol(p, &e, 10);
		if (e == p || B < 1 || B > SFW_BATCH_MAX_SEQS || (*e && *e != ',')) {
			fprintf(stderr, "bench_batch: bad --batch '%s'\n", batches);
			sfw_model_free(m);
			return 2;
		}
		p = *e == ',' ? e + 1 : e;
		Bs[nb++] = (int)B;
		bmax = B > bmax ? (int)B : bmax;
	}
	/* one set of sequences, prefilled once, for every batch size */
	struct seqs S = {0};
	if (prefill_all(m, &S, bmax, lmin, lmax, gen, nb, chunk) != 0) {
		sfw_batch_free(S.b);
		sfw_model_free(m);
		return 1;
	}
	double one = 0;
	for (int k = 0; k < nb; k++) {
		int B = Bs[k];
		int64_t lo, hi;
		double med = 0, tps = run_batch(&S, B, gen, &med, &lo, &hi);
		if (tps < 0) {
			rc = 1;
			continue;
		}
		if (B == 1)
			one = tps;
		printf("BATCH B=%d ctx %lld-%lld: aggregate decode %.1f tok/s (%.2f per sequence), median step %.2f ms", B,
		       (long long)lo, (long long)hi, tps, tps / B, med);
		if (one > 0 && B > 1)
			printf(", %.2fx B=1 (ideal %d)", tps / one, B);
		printf("\n");
	}
	sfw_batch_free(S.b);
	sfw_model_free(m);
	return rc;
}
