/* modules: tools quant runner formats kernels num fetch verify core */
/* test_wide.c - the wide4 preset and the committed CPU references of
 * tests/gpu_wide.c (tests/wide_ref.h):
 *   test_wide            CI: wide4 has the full preset's widths in 4 layers
 *                        S L L S (parameter count by model-spec §3
 *                        arithmetic), and tests/data/gpu_wide/wide4-{bf16,int8}.ref
 *                        parse, match the preset's shapes and the prompt, and
 *                        hold together (greedy tokens = argmax, top-N = the full
 *                        rows, selections = the top blocks by their scores, and
 *                        the prompt's selection a real choice), with their
 *                        shard sums; damaged files are refused. The bf16 pair
 *                        must be there; the int8 pair is checked once committed.
 *   test_wide --write-ref bf16|int8 MODEL OUT
 *                        the CPU engine on MODEL (scripts/wide-ref.sh): writes OUT */
#include "check.h"
#include "tools/tools.h"
#include "wide_ref.h"

#include <time.h>
#include <unistd.h>

#define REF_DIR "tests/data/gpu_wide"


/* ------------------------------------------------------------ --write-ref */

struct capture {
	const struct wide_ref *r;
	int row;
};

static void on_tap(void *user, const struct sfw_tap *t)
{
	struct capture *cp = user;
	const struct wide_ref *r = cp->r;
	size_t n = strlen(t->name);
	if (n < 12 || strcmp(t->name + n - 12, ".block_score") != 0 || t->layer < 0 || t->layer >= r->L ||
	    t->nkv != r->nkv || t->cols > r->nb || t->is_int)
		return;
	size_t rl = (size_t)cp->row * r->L + t->layer;
	r->nblocks[rl] = t->cols;
	for (int64_t h = 0; h < r->nkv; h++)
		memcpy(r->scores + (rl * r->nkv + h) * r->nb, (const float *)t->data + h * t->cols,
		       (size_t)t->cols * sizeof(float));
}

static int write_ref(const char *kind, const char *dir, const char *out)
{
	int int8 = strcmp(kind, "int8") == 0;
	CHECK(int8 || strcmp(kind, "bf16") == 0, "--write-ref takes bf16 or int8, not '%s'", kind);
	struct sfw_mkmodel_params pp = {.preset = SFW_MKMODEL_WIDE4};
	struct sfw_mkmodel_plan pl;
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	enum sfw_status s = sfw_mkmodel_plan(&pp, &pl, &err);
	CHECK(s == SFW_OK, "wide4 plan: %s", err.msg);
	if (s != SFW_OK)
		return 0;
	s = sfw_model_load(dir, &mp, &m, &err);
	CHECK(s == SFW_OK, "load %s: %s", dir, err.msg);
	if (s != SFW_OK) {
		sfw_mkmodel_plan_free(&pl);
		return 0;
	}
	const struct sfw_config *cf = sfw_model_config(m);
	CHECK(cf->vocab_size == pl.config.vocab_size &&
		  cf->num_hidden_layers == pl.config.num_hidden_layers &&
		  cf->hidden_size == pl.config.hidden_size &&
		  wide_sparse_mask(cf) == wide_sparse_mask(&pl.config),
	      "%s has the wide4 shapes", dir);
	/* the int8 reference is of a quantized checkpoint, the bf16 one is not */
	char cfgp[4200], buf[1 << 16];
	snprintf(cfgp, sizeof(cfgp), "%s/config.json", dir);
	FILE *cfgf = fopen(cfgp, "rb");
	size_t got = cfgf ? fread(buf, 1, sizeof(buf) - 1, cfgf) : 0;
	buf[got] = 0;
	if (cfgf)
		fclose(cfgf);
	CHECK((strstr(buf, "\"quantization_config\"") != NULL) == int8, "%s: %s quantization_config", cfgp,
	      int8 ? "has a" : "has no");
	sfw_mkmodel_plan_free(&pl);
	struct wide_ref r = {0};
	r.tokens = WIDE_TOKENS, r.steps = WIDE_STEPS, r.V = cf->vocab_size, r.L = cf->num_hidden_layers;
	r.nkv = cf->num_key_value_heads, r.k = cf->sparse_k, r.topn = WIDE_TOPN, r.stride = WIDE_STRIDE;
	r.nb = (WIDE_TOKENS + WIDE_STEPS + cf->sparse_block_size - 1) / cf->sparse_block_size + 1;
	r.int8 = int8, r.sparse_mask = wide_sparse_mask(cf);
	r.nstr = (r.V + r.stride - 1) / r.stride;
	int32_t *ids = malloc(WIDE_TOKENS * sizeof(int32_t));
	float *lg = malloc((size_t)r.V * sizeof(float));
	int ok = ids && lg && wide_ref_alloc(&r);
	CHECK(ok, "out of memory");
	if (!ok || check_failed_) {
		free(ids), free(lg), wide_ref_free(&r), sfw_model_free(m);
		return 0;
	}
	wide_prompt(ids, WIDE_TOKENS, (int)r.V);
	r.hash = wide_ids_hash(ids, WIDE_TOKENS);
	for (size_t i = 0; i < (size_t)WIDE_ROWS * r.L * r.nkv * r.nb; i++)
		r.scores[i] = NAN;
	memset(r.nblocks, 0, (size_t)WIDE_ROWS * r.L * sizeof(int32_t));
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	xp.n_ctx = WIDE_TOKENS + WIDE_STEPS + 1;
	struct sfw_ctx *c = NULL;
	s = sfw_ctx_new(m, &xp, &c, &err);
	CHECK(s == SFW_OK, "ctx: %s", err.msg);
	double t0 = sfw_now_s();
	/* the prompt but its last token without the tap (see wide_ref.h) */
	if (s == SFW_OK)
		s = sfw_ctx_prefill(c, ids, WIDE_TOKENS - 1, NULL, &err);
	CHECK(s == SFW_OK, "prefill: %s", err.msg);
	printf("test_wide: %s: %d-token prefill on the CPU: %.0f s\n", kind, WIDE_TOKENS - 1, sfw_now_s() - t0);
	fflush(stdout);
	struct capture cp = {&r, 0};
	sfw_ctx_set_tap(c, on_tap, &cp);
	for (int i = 0; s == SFW_OK && i < WIDE_ROWS; i++) {
		cp.row = i;
		s = sfw_ctx_decode(c, i == 0 ? ids[WIDE_TOKENS - 1] : r.tok[i - 1], lg, &err);
		CHECK(s == SFW_OK, "row %d: %s", i, err.msg);
		if (s != SFW_OK)
			break;
		r.tok[i] = wide_argmax(lg, r.V);
		wide_topn(lg, r.V, (int)r.topn, r.top_ids + (size_t)i * r.topn,
			  r.top_val + (size_t)i * r.topn);
		for (int64_t j = 0; j < r.nstr; j++)
			r.strided[(size_t)i * r.nstr + j] = lg[j * r.stride];
		if (i == 0 || i == WIDE_STEPS)
			memcpy(r.full + (i == 0 ? 0 : r.V), lg, (size_t)r.V * sizeof(float));
		for (int l = 0; l < r.L; l++) {
			int32_t *b = r.blocks + ((size_t)i * r.L + l) * r.nkv * r.k;
			int st = sfw_ctx_last_blocks(c, l, b);
			if (st < 0)
				for (int64_t j = 0; j < r.nkv * r.k; j++)
					b[j] = -1;
			const char *path = st == 1 ? "sparse" : st == 0 ? "dense" : "lightning";
			CHECK(st == ((r.sparse_mask >> l & 1) ? 1 : -1), "row %d layer %d: took the %s path",
			      i, l, path);
			CHECK(st != 1 || r.nblocks[(size_t)i * r.L + l] > 0,
			      "row %d layer %d: block scores tapped", i, l);
		}
	}
	r.cpu_ms = (int64_t)((sfw_now_s() - t0) * 1e3);
	sfw_ctx_free(c);
	sfw_model_free(m);
	if (s == SFW_OK && !check_failed_) {
		ok = wide_ref_write(out, &r);
		CHECK(ok, "cannot write '%s'", out);
		if (ok)
			printf("test_wide: %s CPU reference (%d tokens + %d steps, %.1f s) written to %s\n",
			       kind, WIDE_TOKENS, WIDE_STEPS, r.cpu_ms / 1e3, out);
	}
	free(ids), free(lg), wide_ref_free(&r);
	return 1;
}

/* ------------------------------------------------------------ CI checks */

/* wide4 = the full preset's widths, 4 layers S L L S. */
static void test_preset(struct sfw_mkmodel_plan *wide)
{
	struct sfw_err err = {0};
	enum sfw_mkmodel_preset pr;
	CHECK(sfw_mkmodel_preset_parse("wide4", &pr) && pr == SFW_MKMODEL_WIDE4,
	      "\"wide4\" names the preset");
	struct sfw_mkmodel_params p = {.preset = SFW_MKMODEL_FULL};
	struct sfw_mkmodel_plan full;
	if (sfw_mkmodel_plan(&p, &full, &err) != SFW_OK) {
		CHECK(0, "full plan: %s", err.msg);
		return;
	}
	const struct sfw_config *a = &wide->config, *b = &full.config;
	CHECK(a->hidden_size == 4096 && a->num_attention_heads == 32 && a->num_key_value_heads == 2 &&
		  a->head_dim == 128 && a->lightning_nh == 32 && a->lightning_head_dim == 128 &&
		  a->vocab_size == 73448 && a->sparse_topk == 64 && a->sparse_window_size == 2048 &&
		  a->sparse_dense_len == 8192,
	      "wide4: hidden 4096, 32/2 heads of 128, lightning 32 x 128, vocab 73448, topk 64, window 2048, "
	      "dense_len 8192");
	CHECK(a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
		  a->num_attention_heads == b->num_attention_heads &&
		  a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
		  a->vocab_size == b->vocab_size && a->lightning_nh == b->lightning_nh &&
		  a->lightning_nkv == b->lightning_nkv && a->lightning_head_dim == b->lightning_head_dim &&
		  a->dim_model_base == b->dim_model_base && a->scale_emb == b->scale_emb &&
		  a->scale_depth == b->scale_depth && a->sparse_topk == b->sparse_topk &&
		  a->sparse_window_size == b->sparse_window_size &&
		  a->sparse_dense_len == b->sparse_dense_len &&
		  a->sparse_block_size == b->sparse_block_size &&
		  a->sparse_kernel_size == b->sparse_kernel_size &&
		  a->sparse_kernel_stride == b->sparse_kernel_stride &&
		  a->sparse_init_blocks == b->sparse_init_blocks && a->sparse_k == b->sparse_k,
	      "wide4: every width and sparse setting equals the full preset's (intermediate %d)",
	      a->intermediate_size);
	CHECK(a->num_hidden_layers == 4 && a->mixer[0] == SFW_MIXER_SPARSE &&
		  a->mixer[1] == SFW_MIXER_LIGHTNING && a->mixer[2] == SFW_MIXER_LIGHTNING &&
		  a->mixer[3] == SFW_MIXER_SPARSE,
	      "wide4: 4 layers S L L S");
	/* model-spec §3 arithmetic: embedding + lm_head + final norm, then per
	 * layer two norms, the MLP and the mixer's projections (+ 3 norms) */
	uint64_t D = 4096, I = (uint64_t)a->intermediate_size, V = 73448, q = 32 * 128, kv = 2 * 128,
		 ld = 32 * 128;
	uint64_t sparse = 2 * q * D + 2 * kv * D + D * q, light = 4 * ld * D + D * ld + 2 * 128 + ld;
	uint64_t layer = 2 * D + 3 * I * D;
	uint64_t want = 2 * V * D + D + 2 * (layer + sparse) + 2 * (layer + light);
	CHECK(wide->n_params == want && wide->n_bytes == 2 * want && wide->n_tensors == 3 + 2 * 10 + 2 * 13,
	      "wide4: %zu tensors, %llu parameters (want 49, %llu)", wide->n_tensors,
	      (unsigned long long)wide->n_params, (unsigned long long)want);
	uint64_t in_shard[8] = {0};
	int shards_ok = wide->n_shards == 2;
	for (size_t i = 0; shards_ok && i < wide->n_tensors; i++)
		in_shard[wide->tensors[i].shard] +=
		    2 * wide->tensors[i].shape[0] *
		    (wide->tensors[i].ndim == 2 ? wide->tensors[i].shape[1] : 1);
	CHECK(shards_ok && in_shard[0] <= 2000000000u && in_shard[1] <= 2000000000u,
	      "wide4: 2 shards of at most 2 GB (%d)", wide->n_shards);
	sfw_mkmodel_plan_free(&full);
}

/* A committed reference: shapes, prompt, and internal consistency. */
static void test_ref(const struct sfw_config *cf, const char *kind, struct wide_ref *r, int *have)
{
	char path[256], why[512];
	snprintf(path, sizeof(path), "%s/wide4-%s.ref", REF_DIR, kind);
	int failed0 = check_failed_;
	*have = wide_ref_read(path, r, why, sizeof(why));
	CHECK(*have, "%s", why);
	if (!*have)
		return;
	int32_t *ids = malloc(WIDE_TOKENS * sizeof(int32_t));
	if (!ids)
		return;
	wide_prompt(ids, WIDE_TOKENS, cf->vocab_size);
	CHECK(r->tokens == WIDE_TOKENS && r->steps == WIDE_STEPS &&
		  r->hash == wide_ids_hash(ids, WIDE_TOKENS),
	      "%s: made for this prompt (%lld tokens + %lld steps)", path, (long long)r->tokens,
	      (long long)r->steps);
	free(ids);
	CHECK(r->V == cf->vocab_size && r->L == cf->num_hidden_layers && r->nkv == cf->num_key_value_heads &&
		  r->k == cf->sparse_k && r->sparse_mask == wide_sparse_mask(cf) && r->topn == WIDE_TOPN &&
		  r->stride == WIDE_STRIDE && r->int8 == (strcmp(kind, "int8") == 0),
	      "%s: the preset's shapes (V %lld, L %lld, nkv %lld, k %lld, sparse layers %#llx, int8 %lld)",
	      path, (long long)r->V, (long long)r->L, (long long)r->nkv, (long long)r->k,
	      (long long)r->sparse_mask, (long long)r->int8);
	if (check_failed_ > failed0)
		return;
	/* logits: greedy token = top-1; top-N descending; every strided logit
	 * not in the top-N is below it; full rows = their top-N and strided */
	int lg_ok = 1;
	double maxabs = 0;
	for (int i = 0; i <= r->steps; i++) {
		const int32_t *ti = r->top_ids + (size_t)i * r->topn;
		const float *tv = r->top_val + (size_t)i * r->topn;
		lg_ok &= r->tok[i] == ti[0];
		for (int64_t j = 1; j < r->topn; j++)
			lg_ok &= tv[j] < tv[j - 1] || (tv[j] == tv[j - 1] && ti[j] > ti[j - 1]);
		for (int64_t j = 0; j < r->nstr; j++) {
			float x = r->strided[(size_t)i * r->nstr + j];
			lg_ok &= isfinite(x) &&
				 (wide_in(ti, r->topn, (int32_t)(j * r->stride)) || x <= tv[r->topn - 1]);
			maxabs = fmax(maxabs, fabs(x));
		}
		if (i == 0 || i == r->steps) {
			const float *full = r->full + (i == 0 ? 0 : r->V);
			int32_t id[WIDE_TOPN];
			float val[WIDE_TOPN];
			wide_topn(full, r->V, WIDE_TOPN, id, val);
			lg_ok &= memcmp(id, ti, sizeof(id)) == 0 && memcmp(val, tv, sizeof(val)) == 0 &&
				 wide_argmax(full, r->V) == r->tok[i];
			for (int64_t j = 0; j < r->nstr; j++)
				lg_ok &= full[j * r->stride] == r->strided[(size_t)i * r->nstr + j];
		}
		printf("  %s row %d: greedy %d, top-2 gap %.3g (logit tolerance %.3g)\n", kind, i, r->tok[i],
		       tv[0] - tv[1], WIDE_TOL_LOGITS);
	}
	CHECK(lg_ok, "%s: greedy = top-1, top-N sorted and above the rest, full rows agree", path);
	CHECK(maxabs > 0.05 && maxabs < 5, "%s: logits of a sane scale (max |strided| %.3g)", path, maxabs);
	/* selections: ascending, the forced (+inf) blocks in, the rest the top
	 * by score; the prompt's last row a real choice */
	int sel_ok = 1, choice_ok = 1;
	for (int i = 0; i <= r->steps; i++)
		for (int l = 0; l < r->L; l++) {
			if (!(r->sparse_mask >> l & 1))
				continue;
			size_t rl = (size_t)i * r->L + l;
			int64_t nb = r->nblocks[rl];
			for (int64_t h = 0; h < r->nkv; h++) {
				const int32_t *b = r->blocks + (rl * r->nkv + h) * r->k;
				const float *s = r->scores + (rl * r->nkv + h) * r->nb;
				int64_t nsel = 0, ncand = 0, ncand_sel = 0, distinct = 0;
				double lo_sel = INFINITY, hi_rest = -INFINITY, smin = INFINITY,
				       smax = -INFINITY;
				for (int64_t j = 0; j < r->k; j++) {
					if (b[j] < 0)
						continue;
					sel_ok &= nsel == 0 || b[j] > b[j - 1];
					nsel++;
				}
				for (int64_t j = nsel; j < r->k; j++)
					sel_ok &= b[j] == -1; /* -1 only at the end */
				for (int32_t x = 0; x < nb; x++) {
					int in = wide_in(b, r->k, x);
					if (isinf(s[x]) && s[x] > 0)
						sel_ok &= in;
					if (!isfinite(s[x]))
						continue;
					ncand++;
					smin = fmin(smin, s[x]), smax = fmax(smax, s[x]);
					int dup = 0;
					for (int32_t y = 0; y < x && !dup; y++)
						dup = s[y] == s[x];
					distinct += !dup;
					if (in)
						ncand_sel++, lo_sel = fmin(lo_sel, s[x]);
					else
						hi_rest = fmax(hi_rest, s[x]);
				}
				sel_ok &= nsel == (nb < r->k ? nb : r->k) && lo_sel >= hi_rest;
				if (i == 0) {
					/* clearly in / out: beyond the tie band around the
					 * threshold (the lowest chosen score) */
					int64_t near = 0, in = 0, out = 0;
					for (int32_t x = 0; x < nb; x++) {
						if (!isfinite(s[x]))
							continue;
						double rel = (s[x] - lo_sel) / lo_sel;
						near += fabs(rel) <= WIDE_TIE_REL;
						in += rel > WIDE_TIE_REL;
						out += rel < -WIDE_TIE_REL;
					}
					printf("  %s layer %d head %lld: %lld of %lld candidate blocks "
					       "chosen, scores %.3g to %.3g, threshold margin %.3g; %lld "
					       "clearly in, %lld clearly out, %lld within the tie band\n",
					       kind, l, (long long)h, (long long)ncand_sel, (long long)ncand,
					       smin, smax, (lo_sel - hi_rest) / lo_sel, (long long)in,
					       (long long)out, (long long)near);
					choice_ok &= ncand >= 2 * ncand_sel && ncand_sel >= r->k / 2 &&
						     distinct * 10 >= ncand * 9 && smax > 1.5 * smin &&
						     in * 4 >= ncand_sel && out * 4 >= ncand - ncand_sel;
				}
			}
		}
	CHECK(sel_ok, "%s: selections ascending, forced blocks in, the rest the top blocks by score", path);
	CHECK(choice_ok,
	      "%s: the prompt's selection is a real choice (at most half the candidates chosen, "
	      "distinct and spread scores)",
	      path);
}

/* The shards' sha256 the reference was made from (sha256sum lines, for
 * gpu-run.sh's sha256sum -c): 64 hex digits, two spaces, a shard name; for
 * the bf16 model exactly the preset's shards. */
static void test_sums(const struct sfw_mkmodel_plan *pl, const char *kind)
{
	char path[256], line[512];
	snprintf(path, sizeof(path), "%s/wide4-%s.sha256", REF_DIR, kind);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "cannot open '%s' (scripts/wide-ref.sh writes it)", path);
	if (!f)
		return;
	int n = 0, ok = 1;
	while (fgets(line, sizeof(line), f)) {
		size_t len = strcspn(line, "\n");
		line[len] = 0;
		int hex = len > 66 && line[64] == ' ' && line[65] == ' ';
		for (int i = 0; hex && i < 64; i++)
			hex = (line[i] >= '0' && line[i] <= '9') || (line[i] >= 'a' && line[i] <= 'f');
		int a = 0, b = 0, end = 0;
		ok &= hex && sscanf(line + 66, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) == 2 &&
		      line[66 + end] == 0 && a == n + 1;
		if (ok && strcmp(kind, "bf16") == 0) {
			char want[64];
			sfw_mkmodel_shard_name(want, sizeof(want), n, pl->n_shards);
			ok &= b == pl->n_shards && strcmp(line + 66, want) == 0;
		}
		n++;
	}
	fclose(f);
	CHECK(ok && n >= 1 && (strcmp(kind, "bf16") != 0 || n == pl->n_shards),
	      "%s: one sha256sum line per shard of the %s model (%d)", path, kind, n);
}

/* The reader refuses damaged files with the reason (the bytes are committed
 * data, but still go through a bounded parser): copies of the bf16 reference
 * truncated, lengthened, with another magic, a header field out of range,
 * and a token and a block id past their bounds. */
static void test_corrupt(void)
{
	char path[256], why[512], tmp[64];
	snprintf(path, sizeof(path), "%s/wide4-bf16.ref", REF_DIR);
	snprintf(tmp, sizeof(tmp), "/tmp/test_wide_%d.ref", (int)getpid());
	FILE *f = fopen(path, "rb");
	if (!f)
		return; /* test_ref has failed already */
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = n > 128 ? malloc((size_t)n + 1) : NULL;
	int ok = b && fread(b, 1, (size_t)n, f) == (size_t)n;
	fclose(f);
	if (!ok) {
		CHECK(0, "cannot read %s", path);
		free(b);
		return;
	}
	int64_t h[16];
	memcpy(h, b, sizeof(h));
	/* the offsets of tok[0] and the first block of row 0, layer 0 */
	int64_t R = h[2] + 1, nstr = (h[3] + h[9] - 1) / h[9];
	long tok_at = 128 + (long)(R * (h[8] * 8 + nstr * 4) + 2 * h[3] * 4), blk_at = tok_at + (long)R * 4;
	struct {
		const char *what, *want;
		long at, len; /* patch `width` bytes at `at` (-1: none), file length len */
		int width;
		int64_t value;
	} cases[] = {
	    {"truncated", "truncated", -1, n - 4, 0, 0},
	    {"one byte longer", "longer than its header", -1, n + 1, 0, 0},
	    {"another magic", "not a gpu_wide CPU reference", 0, n, 8, 0x3246455244495753LL},
	    {"vocab 0", "header out of range", 3 * 8, n, 8, 0},
	    {"layers 63", "header out of range", 4 * 8, n, 8, 63},
	    {"a token = V", "out of range", tok_at, n, 4, h[3]},
	    {"a block id past nblocks", "out of range", blk_at, n, 4, 100000},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned char *c = malloc((size_t)n + 1);
		if (!c)
			break;
		memcpy(c, b, (size_t)n);
		c[n] = 0;
		int32_t v32 = (int32_t)cases[i].value;
		if (cases[i].at >= 0)
			memcpy(c + cases[i].at, cases[i].width == 8 ? (const void *)&cases[i].value : &v32,
			       (size_t)cases[i].width);
		FILE *o = fopen(tmp, "wb");
		ok = o && fwrite(c, 1, (size_t)cases[i].len, o) == (size_t)cases[i].len;
		ok = o && fclose(o) == 0 && ok;
		free(c);
		struct wide_ref r;
		int read = ok && wide_ref_read(tmp, &r, why, sizeof(why));
		if (read)
			wide_ref_free(&r);
		CHECK(ok && !read && strstr(why, cases[i].want), "damaged reference (%s) refused: %s",
		      cases[i].what, why);
	}
	remove(tmp);
	free(b);
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "--write-ref") == 0) {
		write_ref(argv[2], argv[3], argv[4]);
		return CHECK_REPORT("test_wide");
	}
	if (argc != 1) {
		fprintf(stderr, "usage: test_wide [--write-ref bf16|int8 MODEL OUT]\n");
		return 2;
	}
	struct sfw_mkmodel_params p = {.preset = SFW_MKMODEL_WIDE4};
	struct sfw_mkmodel_plan pl;
	struct sfw_err err = {0};
	if (sfw_mkmodel_plan(&p, &pl, &err) != SFW_OK) {
		CHECK(0, "wide4 plan: %s", err.msg);
		return CHECK_REPORT("test_wide");
	}
	test_preset(&pl);
	struct wide_ref b = {0}, q = {0};
	int hb = 0, hq = 0;
	test_ref(&pl.config, "bf16", &b, &hb);
	test_sums(&pl, "bf16");
	test_corrupt();
	/* The int8 reference and its shard sums come as a pair (scripts/wide-ref.sh
	 * int8, or gpu-run.sh wide-ref int8 on a machine with more cores); until
	 * they are committed gpu_wide's int8 half fails on the GPU for the want of
	 * them, and this test says so. A half-committed pair fails here. */
	int qref = access(REF_DIR "/wide4-int8.ref", F_OK) == 0,
	    qsum = access(REF_DIR "/wide4-int8.sha256", F_OK) == 0;
	if (qref || qsum) {
		test_ref(&pl.config, "int8", &q, &hq);
		test_sums(&pl, "int8");
	} else {
		printf("  int8: no CPU reference committed yet; gpu_wide's int8 half fails until `bash "
		       "scripts/wide-ref.sh int8` (or `bash scripts/gpu-run.sh wide-ref int8`) makes "
		       "%s/wide4-int8.{ref,sha256}\n",
		       REF_DIR);
	}
	if (hb && hq) {
		/* the int8 model is the bf16 one rounded: close, not equal */
		double md = 0;
		long n = 0;
		md = fmax(wide_logits_diff(&b, 0, q.full, &n),
			  wide_logits_diff(&b, (int)b.steps, q.full + q.V, &n));
		printf("  int8 vs bf16 CPU references: full-row logits max|diff| %.3g\n", md);
		CHECK(md > 0 && md < 0.1, "int8 and bf16 references are of the same model, rounded (%.3g)",
		      md);
	}
	wide_ref_free(&b), wide_ref_free(&q);
	sfw_mkmodel_plan_free(&pl);
	return CHECK_REPORT("test_wide");
}
