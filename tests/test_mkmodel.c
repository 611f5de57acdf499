/* modules: tools formats num core */
/* The model generator against independent references: the tiny preset has
 * exactly the config and the tensor names/dtypes/shapes of golden tiny-sparse
 * (written by the reference code); the full preset's plan has docs/model-spec.md §3's
 * 395 tensors and per-part parameter counts; weights have the documented
 * distributions; the output does not depend on the thread count; the
 * directory re-opens through the safetensors set, the config parser and the
 * tokenizer; existing models are refused unless forced. */
#include "check.h"

#include "alloc.h"
#include "file.h"
#include "formats/config.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "tools/tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[256];
static const char *golden;

static int same_file(const char *a, const char *b)
{
	struct sfw_buf x, y;
	struct sfw_err err;
	if (sfw_read_file(a, 1 << 26, &x, &err) != SFW_OK)
		return 0;
	if (sfw_read_file(b, 1 << 26, &y, &err) != SFW_OK) {
		sfw_buf_release(&x);
		return 0;
	}
	int same = x.len == y.len && memcmp(x.data, y.data, x.len) == 0;
	sfw_buf_release(&x);
	sfw_buf_release(&y);
	return same;
}

static void test_config_matches_golden(const char *dir)
{
	struct sfw_config a, g;
	struct sfw_err err = {0};
	char gdir[512];
	snprintf(gdir, sizeof(gdir), "%s/tiny-sparse", golden);
	if (sfw_config_load(dir, &a, &err) != SFW_OK || sfw_config_load(gdir, &g, &err) != SFW_OK) {
		CHECK(0, "load configs: %s", err.msg);
		return;
	}
	/* Everything but the eos list (golden [2]; ours [2, V-8] with the chat specials). */
	CHECK(a.n_eos == 2 && a.eos_token_ids[0] == 2 && a.eos_token_ids[1] == 1016, "tiny eos [2, 1016]");
	int same = memcmp(a.mixer, g.mixer, sizeof(a.mixer)) == 0;
#define F(x) same &= a.x == g.x
	F(hidden_size);
	F(intermediate_size);
	F(num_hidden_layers);
	F(num_attention_heads);
	F(num_key_value_heads);
	F(head_dim);
	F(vocab_size);
	F(rms_norm_eps);
	F(rope_theta);
	F(max_position_embeddings);
	F(scale_emb);
	F(scale_depth);
	F(dim_model_base);
	F(bos_token_id);
	F(attn_use_rope);
	F(attn_use_output_gate);
	F(sparse_kernel_size);
	F(sparse_kernel_stride);
	F(sparse_block_size);
	F(sparse_topk);
	F(sparse_init_blocks);
	F(sparse_window_size);
	F(sparse_dense_len);
	F(lightning_nh);
	F(lightning_nkv);
	F(lightning_head_dim);
	F(lightning_use_rope);
	F(qk_norm);
	F(use_output_norm);
	F(use_output_gate);
	F(residual_scale);
	F(logit_divisor);
	F(sparse_k);
	F(sparse_local_blocks);
#undef F
	CHECK(same, "tiny config equals golden tiny-sparse's (but eos)");
}

static void test_tensors_match_golden(const char *dir)
{
	struct sfw_st_set *a = NULL, *g = NULL;
	struct sfw_err err = {0};
	char gdir[512];
	snprintf(gdir, sizeof(gdir), "%s/tiny-sparse", golden);
	CHECK(sfw_st_set_open(dir, &a, &err) == SFW_OK, "generated model opens: %s", err.msg);
	CHECK(sfw_st_set_open(gdir, &g, &err) == SFW_OK, "golden model opens: %s", err.msg);
	if (!a || !g)
		goto out;
	CHECK(sfw_st_set_count(a) == sfw_st_set_count(g), "tensor count %zu = golden %zu",
	      sfw_st_set_count(a), sfw_st_set_count(g));
	int bad = 0;
	for (size_t i = 0; i < sfw_st_set_count(g); i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(g, i);
		if (sfw_st_set_expect(a, t->name, t->dtype, t->ndim, t->shape, NULL, &err) != SFW_OK) {
			bad++;
			printf("  %s\n", err.msg);
		}
	}
	CHECK(bad == 0, "every golden tensor present with its dtype and shape (%d wrong)", bad);
	/* Weight distributions (golden/README.md recipe). */
	const struct sfw_tensor_info *e = sfw_st_set_find(a, "model.embed_tokens.weight");
	const struct sfw_tensor_info *n = sfw_st_set_find(a, "model.layers.2.self_attn.o_norm.weight");
	const struct sfw_tensor_info *views[2] = {e, n};
	const double want_mean[2] = {0, 1}, want_sd[2] = {0.02, 0.1};
	for (int k = 0; k < 2; k++) {
		const struct sfw_tensor_info *t = views[k];
		if (!t)
			continue;
		const uint16_t *p = t->data;
		double s = 0, s2 = 0, within = 0;
		for (uint64_t i = 0; i < t->nelem; i++) {
			double v = sfw_bf16_to_f32(p[i]);
			s += v;
			s2 += v * v;
			within += fabs(v - want_mean[k]) < want_sd[k];
		}
		double mean = s / (double)t->nelem, sd = sqrt(s2 / (double)t->nelem - mean * mean);
		double frac = within / (double)t->nelem;
		/* Tolerances: several standard errors for n = 262144 (embed) / 256 (norm). */
		double tol = k ? 0.03 : 0.0005;
		CHECK(fabs(mean - want_mean[k]) < tol &&
			  fabs(sd - want_sd[k]) < want_sd[k] * (k ? 0.2 : 0.02),
		      "%s: mean %g sd %g", t->name, mean, sd);
		CHECK(fabs(frac - 0.6827) < (k ? 0.1 : 0.01), "%s: %.4f within 1 sd (normal: 0.6827)",
		      t->name, frac);
	}
	/* The stored values are the documented generator's, rounded to bf16, everywhere in the tensor. */
	if (e) {
		int ok = 1;
		for (uint64_t i = 0; i < e->nelem; i += 4099)
			ok &= ((const uint16_t *)e->data)[i] ==
			      sfw_f32_to_bf16(sfw_mkmodel_weight(7, "model.embed_tokens.weight", 0, i));
		ok &= ((const uint16_t *)e->data)[e->nelem - 1] ==
		      sfw_f32_to_bf16(sfw_mkmodel_weight(7, "model.embed_tokens.weight", 0, e->nelem - 1));
		CHECK(ok, "embedding values = sfw_mkmodel_weight(seed 7)");
	}
	/* Two shards, each a valid standalone file tagged as PyTorch-style. */
	for (int s = 0; s < 2; s++) {
		char name[64], path[512];
		sfw_mkmodel_shard_name(name, sizeof(name), s, 2);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		struct sfw_st_file *f = NULL;
		CHECK(sfw_st_open(path, &f, &err) == SFW_OK && sfw_st_metadata(f, "format") &&
			  strcmp(sfw_st_metadata(f, "format"), "pt") == 0 && sfw_st_count(f) > 0,
		      "shard %s opens alone: %s", name, err.msg);
		sfw_st_close(f);
	}
out:
	sfw_st_set_close(a);
	sfw_st_set_close(g);
}

/* docs/model-spec.md §3 parameter arithmetic for the real shapes. */
static void test_full_plan(void)
{
	struct sfw_mkmodel_params p = {.preset = SFW_MKMODEL_FULL};
	struct sfw_mkmodel_plan pl;
	struct sfw_err err = {0};
	if (sfw_mkmodel_plan(&p, &pl, &err) != SFW_OK) {
		CHECK(0, "full plan: %s", err.msg);
		return;
	}
	CHECK(pl.n_tensors == 395 && pl.n_params == 9477203968ULL && pl.n_bytes == 18954407936ULL,
	      "full: %zu tensors, %llu params (spec: 395, 9477203968, 18954407936 B)", pl.n_tensors,
	      (unsigned long long)pl.n_params);
	uint64_t attn[32] = {0}, rest[32] = {0}, global = 0;
	for (size_t i = 0; i < pl.n_tensors; i++) {
		const struct sfw_mkmodel_tensor *t = &pl.tensors[i];
		uint64_t n = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
		int layer;
		if (sscanf(t->name, "model.layers.%d.", &layer) == 1 && layer >= 0 && layer < 32) {
			if (strstr(t->name, ".self_attn."))
				attn[layer] += n;
			else
				rest[layer] += n;
		} else {
			global += n;
		}
	}
	static const int sparse[8] = {0, 9, 16, 17, 22, 29, 30, 31};
	int ok = global == 2 * 300843008ULL + 4096;
	for (int l = 0; l < 32; l++) {
		int is_sparse = 0;
		for (int k = 0; k < 8; k++)
			is_sparse |= sparse[k] == l;
		ok &= attn[l] == (is_sparse ? 52428800ULL : 83890432ULL) && rest[l] == 201334784ULL;
		ok &= pl.config.mixer[l] == (is_sparse ? SFW_MIXER_SPARSE : SFW_MIXER_LIGHTNING);
	}
	CHECK(ok, "full: per-layer parameters as docs/model-spec.md §3 (sparse 52428800, "
		  "lightning 83890432, MLP 201334784)");
	CHECK(pl.config.vocab_size == 73448 && pl.config.n_eos == 2 && pl.config.eos_token_ids[1] == 73440 &&
		  pl.config.sparse_k == 96 && pl.config.sparse_dense_len == 8192,
	      "full config: vocab 73448, eos [2, 73440], k 96");
	CHECK(pl.n_shards == 4, "full: 4 shards as the real checkpoint (%d)", pl.n_shards);
	sfw_mkmodel_plan_free(&pl);

	p.preset = SFW_MKMODEL_SMALL;
	if (sfw_mkmodel_plan(&p, &pl, &err) == SFW_OK) {
		const struct sfw_config *c = &pl.config;
		CHECK(c->hidden_size == 1024 && c->intermediate_size == 2816 && c->num_hidden_layers == 8 &&
			  c->num_attention_heads == 16 && c->head_dim == 64 && c->num_key_value_heads == 2 &&
			  c->lightning_nh == 16 && c->vocab_size == 16384 &&
			  c->mixer[0] == SFW_MIXER_SPARSE && c->mixer[5] == SFW_MIXER_SPARSE &&
			  c->mixer[1] == SFW_MIXER_LIGHTNING,
		      "small preset shapes");
		/* 3 + 8 x 5 + 2 x 5 + 6 x 8 tensors. */
		CHECK(pl.n_tensors == 101, "small: 101 tensors (%zu)", pl.n_tensors);
		sfw_mkmodel_plan_free(&pl);
	} else {
		CHECK(0, "small plan: %s", err.msg);
	}
}

struct prog {
	uint64_t last, total;
	int calls, monotonic;
};
static void on_progress(void *user, uint64_t done, uint64_t total)
{
	struct prog *p = user;
	p->monotonic &= done > p->last;
	p->last = done;
	p->total = total;
	p->calls++;
}

int main(void)
{
	snprintf(tmp, sizeof(tmp), "%s/salafw-mk.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		printf("FAIL mkdtemp\n");
		return 1;
	}
	golden = check_golden_dir();
	char a[512], b[512], path[512], path2[512];
	snprintf(a, sizeof(a), "%s/a", tmp);
	snprintf(b, sizeof(b), "%s/b/c", tmp);
	struct sfw_err err = {0};
	struct prog pg = {0, 0, 0, 1};
	struct sfw_mkmodel_params p = {
	    .preset = SFW_MKMODEL_TINY, .seed = 7, .progress = on_progress, .progress_user = &pg};
	CHECK(sfw_mkmodel(a, &p, &err) == SFW_OK, "tiny into a fresh directory: %s", err.msg);
	CHECK(pg.calls >= 72 && pg.monotonic && pg.last == pg.total && pg.total == 10297728,
	      "progress reaches the total (%llu of %llu)", (unsigned long long)pg.last,
	      (unsigned long long)pg.total);
	if (golden) {
		test_config_matches_golden(a);
		test_tensors_match_golden(a);
	}
	/* The tokenizer written next to the weights loads with the model vocab. */
	struct sfw_tokenizer *tok = NULL;
	CHECK(sfw_tokenizer_load(a, 1024, &tok, &err) == SFW_OK, "tokenizer loads: %s", err.msg);
	if (tok) {
		CHECK(sfw_tokenizer_special_id(tok, "<|im_end|>") == 1016 &&
			  sfw_tokenizer_special_id(tok, "<|fim_suffix|>") == 1023 &&
			  sfw_tokenizer_bos(tok) == 1,
		      "special tokens at V-8..V-1");
		CHECK(sfw_tokenizer_n_pieces(tok) >= 300 && sfw_tokenizer_n_pieces(tok) <= 1000,
		      "tokenizer has %d pieces (<= 1000)", sfw_tokenizer_n_pieces(tok));
		sfw_tokenizer_free(tok);
	}

	/* One thread gives the same bytes as all threads; nested new directory. */
	p.nthreads = 1;
	p.progress = NULL;
	p.no_tokenizer = 1;
	CHECK(sfw_mkmodel(b, &p, &err) == SFW_OK, "tiny with 1 thread: %s", err.msg);
	int same = 1;
	const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
			       "model.safetensors.index.json", "config.json", "generation_config.json"};
	for (int i = 0; i < 5; i++) {
		snprintf(path, sizeof(path), "%s/%s", a, files[i]);
		snprintf(path2, sizeof(path2), "%s/%s", b, files[i]);
		same &= same_file(path, path2);
	}
	CHECK(same, "1 thread and all threads write identical files");
	snprintf(path, sizeof(path), "%s/tokenizer.model", b);
	CHECK(access(path, F_OK) != 0, "no_tokenizer skips tokenizer.model");

	/* An existing model is refused; --force replaces it and drops stale shards. */
	CHECK(sfw_mkmodel(b, &p, &err) == SFW_E_EXISTS && strstr(err.msg, "already holds a model") &&
		  strstr(err.msg, b),
	      "existing model refused: %s", err.msg);
	snprintf(path, sizeof(path), "%s/model-00003-of-00003.safetensors", b);
	CHECK(sfw_write_file_atomic(path, "x", 1, &err) == SFW_OK, "plant a stale shard");
	p.force = 1;
	p.seed = 8;
	CHECK(sfw_mkmodel(b, &p, &err) == SFW_OK, "--force overwrites: %s", err.msg);
	CHECK(access(path, F_OK) != 0, "stale shard removed");
	snprintf(path, sizeof(path), "%s/%s", a, files[0]);
	snprintf(path2, sizeof(path2), "%s/%s", b, files[0]);
	CHECK(!same_file(path, path2), "another seed gives other weights");
	struct sfw_st_set *s = NULL;
	CHECK(sfw_st_set_open(b, &s, &err) == SFW_OK && sfw_st_set_count(s) == 72,
	      "forced model re-opens: %s", err.msg);
	sfw_st_set_close(s);

	/* Output path that is a file. */
	snprintf(path, sizeof(path), "%s/a/config.json", tmp);
	CHECK(sfw_mkmodel(path, &p, &err) == SFW_E_IO && strstr(err.msg, "not a directory"),
	      "-o naming a file: %s", err.msg);

	test_full_plan();

	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", tmp);
	return CHECK_REPORT("test_mkmodel");
}
