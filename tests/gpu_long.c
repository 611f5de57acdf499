/* modules: quant runner formats kernels num fetch verify core */
/* gpu_long.c - long context: the tiny-sparse golden model (InfLLM-v2 from
 * 512 tokens on) fed a long random prompt (GPU_LONG_TOKENS, default 65536)
 * on the CUDA engine (prefill pieces of 4096 rows, block selection forced
 * into row batches of ~25 rows) and on the CPU engine
 * (pieces of 256), then a few greedy decode steps on each. Compared: the
 * last-position logits, every decode step's logits (bf16 vs fp32 engines:
 * the golden bf16 tolerance, 1.5e-2 absolute on logits of max ~0.4), the
 * first greedy token, and the blocks selected for the last row in every
 * sparse layer (a bf16 engine swaps near-tied blocks: on tiny-sparse the
 * bf16 reference and the fp32 CPU engine differ in ~29% of selection rows,
 * so up to a third may differ here; the logits are the real check).
 *
 * 256K tokens works the same way (GPU_LONG_TOKENS=262144), but the CPU side
 * then takes long on the GPU machine's clock, so it can be computed ahead on
 * any machine: GPU_LONG_WRITE_REF=FILE runs only the CPU engine and writes its
 * results (scripts/long-ref.sh); GPU_LONG_REF=FILE reads them back instead of
 * running the CPU engine. The file names the prompt length, vocabulary, layer
 * count and the prompt's hash; a file that does not match is a failure, never
 * a silent fallback. */
#include "check.h"
#include "runner/backend.h"
#include "runner/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEPS 4


struct out {
	float *logits; /* [STEPS + 1][V] */
	int32_t tokens[STEPS + 1];
	int32_t *blocks; /* [L][nkv * k] */
	double secs;
};

static int run(const char *dir, enum sfw_device dev, int chunk, const int32_t *ids, size_t n, struct out *o)
{
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = dev;
	/* 1 MiB of selection scratch: the CUDA backend must cut every 4096-row
	 * piece into small row batches, the path a 1M-token prompt takes */
	mp.be.select_mb = 1;
	enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
	CHECK(s == SFW_OK, "load: %s", err.msg);
	if (s != SFW_OK)
		return 0;
	const struct sfw_config *cf = sfw_model_config(m);
	int V = cf->vocab_size, L = cf->num_hidden_layers, nk = cf->num_key_value_heads * cf->sparse_k;
	o->logits = malloc((size_t)(STEPS + 1) * V * sizeof(float));
	o->blocks = malloc((size_t)L * nk * sizeof(int32_t));
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = (int64_t)n + STEPS + 1;
	xp.prefill_chunk = chunk;
	struct sfw_ctx *c = NULL;
	s = sfw_ctx_new(m, &xp, &c, &err);
	CHECK(s == SFW_OK, "ctx: %s", err.msg);
	double t0 = sfw_now_s();
	if (s == SFW_OK)
		s = sfw_ctx_prefill(c, ids, n, o->logits, &err);
	CHECK(s == SFW_OK, "prefill %zu tokens on %s: %s", n, sfw_model_device_name(m), err.msg);
	for (int l = 0; s == SFW_OK && l < L; l++)
		if (sfw_ctx_last_blocks(c, l, o->blocks + (size_t)l * nk) < 0)
			memset(o->blocks + (size_t)l * nk, 0xff, (size_t)nk * sizeof(int32_t));
	for (int i = 0; s == SFW_OK && i <= STEPS; i++) {
		const float *lg = o->logits + (size_t)i * V;
		int32_t best = 0;
		for (int v = 1; v < V; v++)
			if (lg[v] > lg[best])
				best = v;
		o->tokens[i] = best;
		if (i < STEPS) {
			s = sfw_ctx_decode(c, best, o->logits + (size_t)(i + 1) * V, &err);
			CHECK(s == SFW_OK, "decode: %s", err.msg);
		}
	}
	o->secs = sfw_now_s() - t0;
	sfw_ctx_free(c);
	sfw_model_free(m);
	return s == SFW_OK ? V : 0;
}

/* The CPU engine's results as a file: a header of 8 little-endian int64
 * (magic, tokens, steps, V, L, nk, prompt hash, CPU milliseconds), then logits, tokens,
 * blocks. Written under a temporary name and renamed when complete. */
#define REF_MAGIC 0x314645524c465353LL /* "SSFLREF1" */

static uint64_t ids_hash(const int32_t *ids, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint32_t)ids[i];
		h *= 1099511628211ull;
	}
	return h;
}

static int ref_write(const char *path, const struct out *o, size_t n, uint64_t hash, int V, int L, int nk)
{
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return 0;
	int64_t h[8] = {REF_MAGIC, (int64_t)n, STEPS, V, L, nk, (int64_t)hash, (int64_t)(o->secs * 1e3)};
	int ok = fwrite(h, sizeof(h), 1, f) == 1 &&
		 fwrite(o->logits, sizeof(float), (size_t)(STEPS + 1) * V, f) == (size_t)(STEPS + 1) * V &&
		 fwrite(o->tokens, sizeof(int32_t), STEPS + 1, f) == STEPS + 1 &&
		 fwrite(o->blocks, sizeof(int32_t), (size_t)L * nk, f) == (size_t)L * nk;
	ok = fclose(f) == 0 && ok;
	if (ok && rename(tmp, path) == 0)
		return 1;
	remove(tmp);
	return 0;
}

/* V on success, 0 (with a failed check naming the file) otherwise. */
static int ref_read(const char *path, struct out *o, size_t n, uint64_t hash, int V, int L, int nk)
{
	FILE *f = fopen(path, "rb");
	CHECK(f != NULL, "%s: cannot open the CPU reference (scripts/long-ref.sh makes it)", path);
	if (!f)
		return 0;
	int64_t h[8];
	int ok = fread(h, sizeof(h), 1, f) == 1;
	CHECK(ok && h[0] == REF_MAGIC, "%s: not a gpu_long CPU reference", path);
	if (ok && h[0] == REF_MAGIC) {
		ok = h[1] == (int64_t)n && h[2] == STEPS && h[3] == V && h[4] == L && h[5] == nk && h[6] == (int64_t)hash;
		CHECK(ok, "%s: made for %lld tokens (V %lld, L %lld), this run has %zu tokens (V %d, L %d) or another prompt",
		      path, (long long)h[1], (long long)h[3], (long long)h[4], n, V, L);
	} else {
		ok = 0;
	}
	if (ok) {
		o->secs = (double)h[7] / 1e3;
		o->logits = malloc((size_t)(STEPS + 1) * V * sizeof(float));
		o->blocks = malloc((size_t)L * nk * sizeof(int32_t));
		ok = o->logits && o->blocks &&
		     fread(o->logits, sizeof(float), (size_t)(STEPS + 1) * V, f) == (size_t)(STEPS + 1) * V &&
		     fread(o->tokens, sizeof(int32_t), STEPS + 1, f) == STEPS + 1 &&
		     fread(o->blocks, sizeof(int32_t), (size_t)L * nk, f) == (size_t)L * nk && fgetc(f) == EOF;
		CHECK(ok, "%s: truncated or longer than its header says", path);
	}
	fclose(f);
	return ok ? V : 0;
}

int main(void)
{
	const char *gdir = check_golden_dir();
	if (!gdir)
		return CHECK_REPORT("gpu_long");
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/tiny-sparse", gdir);
	size_t n = getenv("GPU_LONG_TOKENS") ? (size_t)atol(getenv("GPU_LONG_TOKENS")) : 65536;
	int32_t *ids = malloc(n * sizeof(int32_t));
	uint32_t x = 777;
	ids[0] = 1;
	for (size_t i = 1; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		ids[i] = (int32_t)(3 + (x >> 8) % 1021u);
	}
	struct out g = {0}, c = {0};
	const char *write_ref = getenv("GPU_LONG_WRITE_REF"), *read_ref = getenv("GPU_LONG_REF");
	uint64_t hash = ids_hash(ids, n);
	int Vc = 0, Lc = 0, nkc = 0;
	{
		/* the shapes the reference file is checked against */
		struct sfw_model *m = NULL;
		struct sfw_err err = {0};
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		enum sfw_status s = sfw_model_load(dir, &mp, &m, &err);
		CHECK(s == SFW_OK, "load %s: %s", dir, err.msg);
		if (s != SFW_OK)
			return CHECK_REPORT("gpu_long");
		const struct sfw_config *cf = sfw_model_config(m);
		Vc = cf->vocab_size, Lc = cf->num_hidden_layers, nkc = cf->num_key_value_heads * cf->sparse_k;
		sfw_model_free(m);
	}
	if (write_ref && *write_ref) { /* the CPU side only, for a later GPU run */
		int V2 = run(dir, SFW_DEVICE_CPU, 256, ids, n, &c);
		if (V2) {
			int ok = ref_write(write_ref, &c, n, hash, Vc, Lc, nkc);
			CHECK(ok, "%s: cannot write the CPU reference", write_ref);
			if (ok)
				printf("gpu_long: CPU reference for %zu tokens + %d steps written to %s (%.1f s)\n", n, STEPS,
				       write_ref, c.secs);
		}
		free(c.logits), free(c.blocks), free(ids);
		return CHECK_REPORT("gpu_long");
	}
	int V = run(dir, SFW_DEVICE_CUDA, 4096, ids, n, &g);
	int V2 = read_ref && *read_ref ? ref_read(read_ref, &c, n, hash, Vc, Lc, nkc)
				       : run(dir, SFW_DEVICE_CPU, 256, ids, n, &c);
	if (V && V == V2) {
		printf("gpu_long: %zu-token prompt + %d steps: cuda %.2f s, cpu %.2f s%s\n", n, STEPS, g.secs, c.secs,
		       read_ref && *read_ref ? " (CPU side read from the reference file)" : "");
		for (int i = 0; i <= STEPS; i++) {
			double md = 0, mr = 0;
			for (int v = 0; v < V; v++) {
				double d = fabs((double)g.logits[(size_t)i * V + v] - c.logits[(size_t)i * V + v]);
				md = d > md ? d : md;
				mr = fabs(c.logits[(size_t)i * V + v]) > mr ? fabs(c.logits[(size_t)i * V + v]) : mr;
			}
			printf("  position %zu: logits max|diff| %.3g (max|logit| %.3g), greedy %d / %d\n", n - 1 + i, md,
			       mr, g.tokens[i], c.tokens[i]);
			CHECK(md <= 1.5e-2, "position %zu: logits differ by %.3g", n - 1 + i, md);
		}
		CHECK(g.tokens[0] == c.tokens[0], "first greedy token %d vs %d", g.tokens[0], c.tokens[0]);
		/* selections of the last decode step, per sparse layer (as sets) */
		struct sfw_model *m = NULL;
		struct sfw_err err = {0};
		struct sfw_model_params mp = sfw_model_default_params();
		mp.device = SFW_DEVICE_CPU;
		if (sfw_model_load(dir, &mp, &m, &err) == SFW_OK) {
			const struct sfw_config *cf = sfw_model_config(m);
			int nk = cf->num_key_value_heads * cf->sparse_k;
			long diff = 0, tot = 0;
			for (int l = 0; l < cf->num_hidden_layers; l++) {
				if (cf->mixer[l] != SFW_MIXER_SPARSE)
					continue;
				const int32_t *a = g.blocks + (size_t)l * nk, *b = c.blocks + (size_t)l * nk;
				for (int i = 0; i < nk; i++) {
					int found = 0;
					int g0 = i / cf->sparse_k * cf->sparse_k;
					for (int j = g0; j < g0 + cf->sparse_k; j++)
						found |= a[i] == b[j];
					diff += !found;
					tot++;
				}
			}
			printf("  last-step selected blocks differing: %ld of %ld\n", diff, tot);
			CHECK(diff * 3 <= tot, "selected blocks differ: %ld of %ld", diff, tot);
			sfw_model_free(m);
		}
	}
	free(g.logits), free(g.blocks), free(c.logits), free(c.blocks), free(ids);
	return CHECK_REPORT("gpu_long");
}
