/* modules: quant runner formats kernels num fetch verify core */
/* test_bench_serve.c - bench_batch --serve N:P:G (salafw serve's workload in
 * process: serve/server.c engine_main's scheduling) on the CPU, on the golden
 * tiny-dense model (../shared/golden), the bench binary run as it is
 * ($BUILD/bench/bench_batch, --tokens 1 printing every request's prompt and
 * tokens):
 *   - every request's G greedy tokens equal those of its prompt run alone on a
 *     context of its own (runner/runner.h), fed the prompt in the same chunks
 *     (the CPU backend is bit for bit the same batched and alone,
 *     runner/batch.h), then decoded one token at a time;
 *   - exactly N requests of G tokens each, the prompts BOS then ids in the
 *     vocabulary, no two the same;
 *   - the steps (all, decode-only, mixed, prefill-only) as the scheduling
 *     rule gives them, worked out here from the rule (and, for N=5 R=2 P=20
 *     G=6 chunk 8, by hand: 24 steps, 11 decode-only, 8 mixed, 5
 *     prefill-only); the chunk sizes fed alone come from the same working;
 *   - the printed rates: prompt / output tok/s = P / G.
 * The shapes: a queue behind R running, a prompt split over steps by the
 * budget, several prompts in one step (chunk > P), G = 1 (a request done by
 * its prefill: no decode-only step), R > N. */
#include "check.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "runner/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 64
#define MAXN 16
#define MAXP 64
#define MAXG 16

/* The rule: each step the queue joins while fewer than R run; then, oldest
 * first, a decoding request gives one row and a token, a prefilling one the
 * next min(left, budget) rows of its prompt while the budget (C rows) is
 * above 0, a token when that ends its prompt; a request leaves after the
 * step that gave its G-th token. */
struct plan {
	int steps, decode_only, mixed, prefill_only;
	int nchunks[MAXN], chunk[MAXN][MAXP];
};

static void plan(int N, int R, int P, int G, int C, struct plan *pl)
{
	int left[MAXN], toks[MAXN], run[MAXN], nrun = 0, next = 0;
	memset(pl, 0, sizeof(*pl));
	for (int i = 0; i < N; i++)
		left[i] = P, toks[i] = 0;
	while (next < N || nrun) {
		while (next < N && nrun < R)
			run[nrun++] = next++;
		int budget = C, prows = 0, drows = 0;
		for (int j = 0; j < nrun; j++) {
			int r = run[j];
			if (!left[r]) {
				drows++, toks[r]++;
			} else if (budget > 0) {
				int k = left[r] < budget ? left[r] : budget;
				pl->chunk[r][pl->nchunks[r]++] = k;
				left[r] -= k, budget -= k, prows += k;
				toks[r] += !left[r];
			}
		}
		pl->steps++;
		if (!prows)
			pl->decode_only++;
		else if (drows)
			pl->mixed++;
		else
			pl->prefill_only++;
		int k = 0;
		for (int j = 0; j < nrun; j++)
			if (toks[run[j]] < G)
				run[k++] = run[j];
		nrun = k;
	}
}

/* The request's tokens alone: its prompt in the chunks the batch fed it,
 * then G - 1 decode calls, greedy. 0 on success. */
static int alone(struct sfw_model *m, const int32_t *prompt, const int *chunks, int nch, int G, int32_t *tok)
{
	int V = sfw_model_config(m)->vocab_size;
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	cp.prefill_chunk = 64; /* >= every chunk here: one call each */
	struct sfw_ctx *c = NULL;
	struct sfw_err err = {0};
	float *l = malloc(sizeof(float) * (size_t)V);
	int rc = -1;
	if (!l || sfw_ctx_new(m, &cp, &c, &err) != SFW_OK) {
		CHECK(0, "context: %s", err.msg[0] ? err.msg : "out of memory");
		goto out;
	}
	for (int i = 0, off = 0; i < nch; off += chunks[i++])
		if (sfw_ctx_prefill(c, prompt + off, (size_t)chunks[i], l, &err) != SFW_OK) {
			CHECK(0, "alone prefill: %s", err.msg);
			goto out;
		}
	for (int g = 0; g < G; g++) {
		tok[g] = sfw_sampler_argmax(l, V);
		if (g + 1 < G && sfw_ctx_decode(c, tok[g], l, &err) != SFW_OK) {
			CHECK(0, "alone decode: %s", err.msg);
			goto out;
		}
	}
	rc = 0;
out:
	sfw_ctx_free(c);
	free(l);
	return rc;
}

/* Reads n ints after the word `key` in s; the count read. */
static int read_ids(const char *s, const char *key, int32_t *v, int max)
{
	const char *p = strstr(s, key);
	if (!p)
		return -1;
	p += strlen(key);
	int n = 0;
	char *e;
	for (;;) {
		long x = strtol(p, &e, 10);
		if (e == p)
			break;
		if (n == max)
			return max + 1;
		v[n++] = (int32_t)x;
		p = e;
	}
	return n;
}

static void run_case(struct sfw_model *m, const char *bench, const char *model, int N, int R, int P, int G, int C)
{
	int V = sfw_model_config(m)->vocab_size;
	char cmd[8192], line[16384], name[96];
	snprintf(name, sizeof(name), "N=%d R=%d P=%d G=%d chunk %d", N, R, P, G, C);
	snprintf(cmd, sizeof(cmd), "'%s' '%s' --device cpu --threads 1 --serve %d:%d:%d --batch %d --chunk %d --tokens 1",
		 bench, model, N, P, G, R, C);
	struct plan pl;
	plan(N, R, P, G, C, &pl);
	FILE *f = popen(cmd, "r");
	if (!f) {
		CHECK(0, "%s: cannot run '%s'", name, cmd);
		return;
	}
	static int32_t prompt[MAXN][MAXP], gen[MAXN][MAXG];
	int seen[MAXN] = {0}, nreq = 0, serve_lines = 0;
	long long steps = -1, dec = -1, mixed = -1, pre = -1;
	double out_tps = 0, wall = 0, prompt_tps = 0;
	while (fgets(line, sizeof(line), f)) {
		int i, a, b;
		line[strcspn(line, "\n")] = 0;
		if (!strncmp(line, "SERVE ", 6)) {
			serve_lines++;
			char want[128];
			snprintf(want, sizeof(want), "SERVE N=%d R=%d prompt %d gen %d chunk %d: output ", N, R, P, G, C);
			CHECK(!strncmp(line, want, strlen(want)), "%s: the SERVE line names the workload: %s", name, line);
			const char *p = strstr(line, ": output ");
			CHECK(p && sscanf(p, ": output %lf tok/s (%lf s), prompt %lf tok/s, %lld steps (%lld decode-only",
					  &out_tps, &wall, &prompt_tps, &steps, &dec) == 5,
			      "%s: the SERVE line reads: %s", name, line);
			p = strstr(line, "; ");
			CHECK(p && sscanf(p, "; %lld mixed, %lld prefill-only)", &mixed, &pre) == 2,
			      "%s: the SERVE line's step kinds read: %s", name, line);
		} else if (sscanf(line, "REQ %d prompt", &i) == 1) {
			if (i < 0 || i >= N || seen[i]++) {
				CHECK(0, "%s: request %d out of range or printed twice", name, i);
				continue;
			}
			nreq++;
			a = read_ids(line, " prompt", prompt[i], MAXP);
			b = read_ids(line, " gen", gen[i], MAXG);
			CHECK(a == P, "%s: request %d: a prompt of %d ids (want %d)", name, i, a, P);
			CHECK(b == G, "%s: request %d: %d tokens made (want %d)", name, i, b, G);
		}
	}
	int st = pclose(f);
	CHECK(st == 0, "%s: bench_batch exits 0 (status %d)", name, st);
	CHECK(serve_lines == 1, "%s: one SERVE line (%d)", name, serve_lines);
	CHECK(nreq == N, "%s: %d requests printed (want %d): %d tokens", name, nreq, N, nreq * G);
	CHECK(steps == pl.steps && dec == pl.decode_only && mixed == pl.mixed && pre == pl.prefill_only,
	      "%s: steps %lld (%lld decode-only, %lld mixed, %lld prefill-only), the rule gives %d (%d, %d, %d)", name,
	      steps, dec, mixed, pre, pl.steps, pl.decode_only, pl.mixed, pl.prefill_only);
	/* both rates are printed to 0.1 (±0.05 each), so their ratio can be
	 * off by up to 0.05 / out · (1 + prompt / out) */
	CHECK(out_tps > 0 && wall > 0 &&
		      fabs(prompt_tps / out_tps - (double)P / G) < 1e-3 * P / G + 0.05 / out_tps * (1.0 + (double)P / G),
	      "%s: prompt tok/s %.1f / output tok/s %.1f = P / G", name, prompt_tps, out_tps);
	if (nreq != N)
		return;
	int bad_prompt = 0, same = 0, bad_tok = 0;
	for (int i = 0; i < N; i++) {
		bad_prompt += prompt[i][0] != 1;
		for (int j = 1; j < P; j++)
			bad_prompt += prompt[i][j] < 0 || prompt[i][j] >= V;
		for (int k = 0; k < i; k++)
			same += !memcmp(prompt[i], prompt[k], sizeof(int32_t) * (size_t)P);
	}
	CHECK(!bad_prompt && !same, "%s: prompts BOS then ids in the vocabulary (%d bad), all different (%d alike)",
	      name, bad_prompt, same);
	if (bad_prompt)
		return;
	for (int i = 0; i < N; i++) {
		int32_t ref[MAXG];
		if (alone(m, prompt[i], pl.chunk[i], pl.nchunks[i], G, ref) != 0)
			return;
		int d = memcmp(ref, gen[i], sizeof(int32_t) * (size_t)G) != 0;
		if (d) {
			printf("  request %d alone:", i);
			for (int g = 0; g < G; g++)
				printf(" %d", ref[g]);
			printf("; batched:");
			for (int g = 0; g < G; g++)
				printf(" %d", gen[i][g]);
			printf("\n");
		}
		bad_tok += d;
	}
	CHECK(bad_tok == 0, "%s: every request's tokens as its prompt alone (%d of %d differ)", name, bad_tok, N);
}

int main(void)
{
	const char *g = check_golden_dir();
	if (!g)
		return CHECK_REPORT("test_bench_serve");
	char model[4096], bench[4096];
	snprintf(model, sizeof(model), "%s/tiny-dense", g);
	const char *build = getenv("BUILD");
	snprintf(bench, sizeof(bench), "%s/bench/bench_batch", build && *build ? build : "build");
	FILE *probe = fopen(bench, "r");
	CHECK(probe != NULL, "the bench is built: %s (make)", bench);
	if (!probe)
		return CHECK_REPORT("test_bench_serve");
	fclose(probe);
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	mp.threads = 1;
	struct sfw_model *m = NULL;
	struct sfw_err err = {0};
	if (sfw_model_load(model, &mp, &m, &err) != SFW_OK) {
		CHECK(0, "tiny-dense: %s", err.msg);
		return CHECK_REPORT("test_bench_serve");
	}
	/* the rule against a count by hand, requests A-E (rows A/B; P: prompt
	 * rows, t: a token; D: decode-only, M: mixed, F: prefill-only):
	 *  1 A8 F, 2 A8 F, 3 A4t B4 F, 4 At B8 M, 5 At B8t M, 6-8 At Bt D (A done),
	 *  9 Bt C8 M, 10 Bt C8 M (B done), 11 C4t D4 F, 12 Ct D8 M, 13 Ct D8t M,
	 *  14-16 Ct Dt D (C done), 17 Dt E8 M, 18 Dt E8 M (D done), 19 E4t F,
	 *  20-24 Et D: 24 steps, 11 D, 8 M, 5 F. */
	struct plan pl;
	plan(5, 2, 20, 6, 8, &pl);
	CHECK(pl.steps == 24 && pl.decode_only == 11 && pl.mixed == 8 && pl.prefill_only == 5,
	      "the rule's steps for N=5 R=2 P=20 G=6 chunk 8: %d (%d, %d, %d), by hand 24 (11, 8, 5)", pl.steps,
	      pl.decode_only, pl.mixed, pl.prefill_only);
	CHECK(pl.nchunks[1] == 3 && pl.chunk[1][0] == 4 && pl.chunk[1][1] == 8 && pl.chunk[1][2] == 8,
	      "request 1's prompt in chunks 4, 8, 8 (the budget's leftover first)");
	run_case(m, bench, model, 5, 2, 20, 6, 8);   /* a queue; prompts split by the budget */
	run_case(m, bench, model, 6, 3, 13, 4, 30);  /* several prompts in one step */
	run_case(m, bench, model, 4, 3, 9, 1, 4);    /* G = 1: done by the prefill */
	run_case(m, bench, model, 3, 8, 17, 5, 64);  /* R > N: all at once */
	sfw_model_free(m);
	return CHECK_REPORT("test_bench_serve");
}
