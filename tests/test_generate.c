/* modules: tools quant runner formats kernels num fetch verify core */
/* test_generate.c - the generation API (runner/generate.h) on the CPU:
 *   - greedy generation reproduces the golden greedy chains (decode.tokens of
 *     ../shared/golden, the reference PyTorch model's argmax chain);
 *   - a stop string that spans a token boundary ends the text exactly where
 *     it starts (the text before it equals the unstopped run's), and no piece
 *     ever shows a byte of it; the hold-back rule on its own;
 *   - every text piece is whole UTF-8 while byte-fallback pieces come (mkmodel
 *     tiny's tokenizer has byte fallback; hot sampling produces them), and
 *     some pieces were held back to make that so;
 *   - EOS ids from generation_config.json and tokenizer_config.json stop the
 *     run (finish eos, the id not shown), malformed files are refused;
 *   - a seed fixes the output; the token limit; appending to a context keeps
 *     its history (turn 2 prefills only its own tokens);
 *   - struct sfw_gen_stream on its own (serve's per-request half): the same
 *     text and stop as sfw_generate for the same ids, the context limit. */
#include "check.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/safetensors.h"
#include "json.h"
#include "runner/generate.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct collect {
	struct sfw_buf text;
	int32_t ids[4096];
	int64_t n;
	int bad_utf8, held, pieces;
	const struct sfw_tokenizer *tok;
};

static int on_tok(void *user, const struct sfw_gen_token *t)
{
	struct collect *c = user;
	if (t->id >= 0 && c->n < 4096)
		c->ids[c->n++] = t->id;
	if (t->len && !sfw_utf8_valid((const unsigned char *)t->text, t->len))
		c->bad_utf8++;
	if (t->id >= 0 && t->len == 0 && c->tok && !sfw_tokenizer_is_special(c->tok, t->id))
		c->held++;
	c->pieces++;
	if (t->len && sfw_buf_append(&c->text, t->text, t->len) != SFW_OK)
		return 1;
	return 0;
}

static void collect_init(struct collect *c, const struct sfw_tokenizer *tok)
{
	memset(c, 0, sizeof(*c));
	sfw_buf_init(&c->text, 1u << 20);
	c->tok = tok;
}

/* One generation on a fresh context. */
static enum sfw_status gen(struct sfw_model *m, const struct sfw_tokenizer *tok,
			   const struct sfw_op_sample_params *sp, uint64_t seed,
			   const struct sfw_gen_params *g, struct collect *c, struct sfw_gen_stats *st,
			   struct sfw_err *err)
{
	struct sfw_ctx *ctx = NULL;
	struct sfw_ctx_params xp = sfw_ctx_default_params();
	struct sfw_sampler smp;
	enum sfw_status s = sfw_ctx_new(m, &xp, &ctx, err);
	if (s == SFW_OK &&
	    (s = sfw_sampler_init(&smp, sp, seed, sfw_model_config(m)->vocab_size, err)) == SFW_OK) {
		s = sfw_generate(ctx, tok, &smp, g, on_tok, c, st, err);
		sfw_sampler_release(&smp);
	}
	sfw_ctx_free(ctx);
	return s;
}

static const struct sfw_op_sample_params GREEDY = {
    .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .greedy = 1};

static void test_golden_chain(const char *gdir, const char *name)
{
	char dir[4096], path[4200];
	struct sfw_err err = {0};
	snprintf(dir, sizeof(dir), "%s/%s", gdir, name);
	snprintf(path, sizeof(path), "%s/golden_f32.safetensors", dir);
	struct sfw_model *m = NULL;
	struct sfw_st_file *g = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK || sfw_st_open(path, &g, &err) != SFW_OK) {
		CHECK(0, "%s: %s", name, err.msg);
		sfw_model_free(m);
		return;
	}
	const struct sfw_tensor_info *ids = sfw_st_find(g, "input_ids"),
				     *want = sfw_st_find(g, "decode.tokens");
	CHECK(ids && want && ids->dtype == SFW_DTYPE_I32 && want->dtype == SFW_DTYPE_I32, "%s: golden ids",
	      name);
	if (ids && want) {
		struct sfw_eos_set none = {0};
		struct sfw_gen_params gp = sfw_gen_default_params();
		gp.ids = ids->data;
		gp.n_ids = (size_t)ids->nelem;
		gp.max_tokens = (int64_t)want->nelem;
		gp.eos = &none;
		struct collect c;
		collect_init(&c, NULL);
		struct sfw_gen_stats st;
		enum sfw_status s = gen(m, NULL, &GREEDY, 1, &gp, &c, &st, &err);
		CHECK(s == SFW_OK && st.finish == SFW_FINISH_LENGTH && c.n == (int64_t)want->nelem &&
			  memcmp(c.ids, want->data, (size_t)c.n * sizeof(int32_t)) == 0,
		      "%s: greedy generate gives golden decode.tokens (%lld tokens, finish %s): %s", name,
		      (long long)c.n, sfw_finish_name(st.finish), err.msg);
		int64_t T = (int64_t)ids->nelem, W = (int64_t)want->nelem;
		CHECK(st.prompt_tokens == T && st.decode_steps == W - 1 && st.ctx_pos == T + W - 1 &&
			  st.pending == c.ids[c.n - 1],
		      "%s: counts: %lld prefilled, %lld steps, context %lld, the last token pending", name,
		      (long long)st.prompt_tokens, (long long)st.decode_steps, (long long)st.ctx_pos);
		sfw_buf_release(&c.text);
	}
	sfw_st_close(g);
	sfw_model_free(m);
}

static void test_holdback(void)
{
	const char *stops[] = {"END", "€uro"}; /* € = E2 82 AC */
	CHECK(sfw_stop_holdback("abcEN", 5, stops, 2) == 2, "holdback: 'EN' may become 'END'");
	CHECK(sfw_stop_holdback("abcE", 4, stops, 2) == 1, "holdback: 'E'");
	CHECK(sfw_stop_holdback("abcx", 4, stops, 2) == 0, "holdback: nothing");
	CHECK(sfw_stop_holdback("ab\xe2\x82\xac", 5, stops, 2) == 3, "holdback: a whole multi-byte prefix");
	CHECK(sfw_stop_holdback("END", 3, stops, 2) == 0,
	      "holdback: only proper prefixes (a whole match is a stop)");
}

/* A tiny mkmodel model with its tokenizer: stop strings, UTF-8, EOS, seeds. */
static void test_text(const char *dir)
{
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_tokenizer *tok = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	if (sfw_model_load(dir, &mp, &m, &err) != SFW_OK ||
	    sfw_tokenizer_load(dir, sfw_model_config(m)->vocab_size, &tok, &err) != SFW_OK) {
		CHECK(0, "tiny: %s", err.msg);
		sfw_model_free(m);
		return;
	}
	const struct sfw_config *cf = sfw_model_config(m);
	struct sfw_eos_set none = {0};
	struct sfw_op_sample_params warm = sfw_sampler_default_params();
	const char *prompt = "The weather today is";
	struct sfw_gen_params gp = sfw_gen_default_params();
	gp.text = prompt;
	gp.text_len = strlen(prompt);
	gp.max_tokens = 60;
	gp.eos = &none;
	gp.skip_special = 1;

	/* the reference run: no stop string */
	struct collect r, r2;
	collect_init(&r, tok);
	collect_init(&r2, tok);
	struct sfw_gen_stats st, st2;
	enum sfw_status s = gen(m, tok, &warm, 11, &gp, &r, &st, &err);
	CHECK(s == SFW_OK && st.finish == SFW_FINISH_LENGTH && st.tokens == 60 && r.n == 60,
	      "tiny: 60 tokens, finish length (%s): %s", sfw_finish_name(st.finish), err.msg);
	s = gen(m, tok, &warm, 11, &gp, &r2, &st2, &err);
	CHECK(s == SFW_OK && r2.n == r.n && !memcmp(r.ids, r2.ids, (size_t)r.n * 4) &&
		  r.text.len == r2.text.len && !memcmp(r.text.data, r2.text.data, r.text.len),
	      "tiny: the same seed gives the same tokens and text");
	sfw_buf_release(&r2.text);
	collect_init(&r2, tok);
	s = gen(m, tok, &warm, 12, &gp, &r2, &st2, &err);
	CHECK(s == SFW_OK && (r2.n != r.n || memcmp(r.ids, r2.ids, (size_t)r.n * 4) != 0),
	      "tiny: another seed gives other tokens");
	sfw_buf_release(&r2.text);

	/* a stop string across a token boundary: the last 2 bytes of the text of
	 * token k and the first 2 of token k+1 (each token's own decode) */
	struct sfw_buf a, b;
	sfw_buf_init(&a, 1 << 16);
	sfw_buf_init(&b, 1 << 16);
	char stop[64] = "";
	size_t stop_tok = 0;
	for (int64_t k = 5; k + 1 < r.n && !stop[0]; k++) {
		a.len = b.len = 0;
		if (sfw_tokenizer_decode(tok, &r.ids[k], 1, 1, &a, &err) != SFW_OK ||
		    sfw_tokenizer_decode(tok, &r.ids[k + 1], 1, 1, &b, &err) != SFW_OK)
			break;
		/* ASCII only at the seam, so the pieces' own decode equals the stream's */
		if (a.len < 2 || b.len < 2 || (a.data[a.len - 2] & 0x80) || (a.data[a.len - 1] & 0x80) ||
		    (b.data[0] & 0x80) || (b.data[1] & 0x80))
			continue;
		char cand[5] = {a.data[a.len - 2], a.data[a.len - 1], b.data[0], b.data[1], 0};
		const char *at = strstr(r.text.data, cand);
		if (at && at > r.text.data) {
			snprintf(stop, sizeof(stop), "%s", cand);
			stop_tok = (size_t)k;
		}
	}
	CHECK(stop[0], "tiny: found a stop string spanning tokens");
	if (stop[0]) {
		const char *stops[] = {"zzzz-never", stop};
		gp.stop = stops;
		gp.n_stop = 2;
		struct collect c;
		collect_init(&c, tok);
		s = gen(m, tok, &warm, 11, &gp, &c, &st, &err);
		size_t want = (size_t)(strstr(r.text.data, stop) - r.text.data);
		CHECK(s == SFW_OK && st.finish == SFW_FINISH_STOP && c.text.len == want &&
			  !memcmp(c.text.data ? c.text.data : "", r.text.data, want),
		      "tiny: stop '%s' (tokens %zu|%zu) ends the text where it starts (%zu bytes, got %zu, "
		      "finish %s): %s",
		      stop, stop_tok, stop_tok + 1, want, c.text.len, sfw_finish_name(st.finish), err.msg);
		CHECK(st.pending == c.ids[c.n - 1] && c.n <= (int64_t)stop_tok + 2,
		      "tiny: the run stopped at the token that completed the stop string (%lld tokens)",
		      (long long)c.n);
		/* the same tokens through a struct sfw_gen_stream on its own (what
		 * serve drives): the same text, the same finish at the same token */
		int32_t *pids = NULL;
		size_t np = 0;
		struct sfw_gen_stream gs;
		struct sfw_buf t;
		sfw_buf_init(&t, 1u << 20);
		enum sfw_finish fin = SFW_FINISH_NONE;
		int64_t k = 0;
		s = sfw_tokenizer_encode(tok, prompt, strlen(prompt), 1, &pids, &np, &err);
		if (s == SFW_OK)
			s = sfw_gen_stream_init(&gs, tok, cf, &gp, pids, np, &err);
		for (; s == SFW_OK && fin == SFW_FINISH_NONE && k < r.n; k++) {
			const char *x;
			size_t xl;
			s = sfw_gen_stream_push(&gs, r.ids[k], 0, (int64_t)np + k, &x, &xl, &fin, &err);
			if (s == SFW_OK && xl)
				s = sfw_buf_append(&t, x, xl);
		}
		CHECK(s == SFW_OK && fin == SFW_FINISH_STOP && k == c.n && t.len == c.text.len &&
			  !memcmp(t.data ? t.data : "", c.text.data ? c.text.data : "", t.len),
		      "tiny: a gen stream fed the same ids stops at token %lld with sfw_generate's text (%zu "
		      "bytes): %s",
		      (long long)k, t.len, err.msg);
		const char *x;
		size_t xl;
		CHECK(s == SFW_OK &&
			  sfw_gen_stream_push(&gs, r.ids[0], 0, 0, &x, &xl, &fin, &err) == SFW_E_INVAL &&
			  sfw_gen_stream_flush(&gs, &x, &xl, &err) == SFW_OK && xl == 0,
		      "tiny: a finished stream refuses tokens; after a stop nothing is left to flush");
		sfw_gen_stream_release(&gs);
		/* the context limit: ctx_pos reaching max_ctx finishes with LENGTH */
		struct sfw_gen_params lp = sfw_gen_default_params();
		lp.max_ctx = (int64_t)np + 3;
		lp.eos = &none;
		s = sfw_gen_stream_init(&gs, tok, cf, &lp, pids, np, &err);
		int64_t made = 0;
		for (fin = SFW_FINISH_NONE; s == SFW_OK && fin == SFW_FINISH_NONE; made++)
			s = sfw_gen_stream_push(&gs, r.ids[made], 0, (int64_t)np + made, &x, &xl, &fin, &err);
		CHECK(s == SFW_OK && fin == SFW_FINISH_LENGTH && made == 4 && gs.tokens == 4,
		      "tiny: a stream finishes with length when the context is full (%lld tokens)",
		      (long long)made);
		sfw_gen_stream_release(&gs);
		sfw_buf_release(&t);
		sfw_free(pids);
		sfw_buf_release(&c.text);
		gp.stop = NULL;
		gp.n_stop = 0;
	}
	sfw_buf_release(&a);
	sfw_buf_release(&b);

	/* UTF-8: hot sampling over many tokens brings byte-fallback pieces */
	struct sfw_op_sample_params hot = sfw_sampler_default_params();
	hot.temperature = 1.5f;
	struct collect u;
	collect_init(&u, tok);
	gp.max_tokens = 400;
	s = gen(m, tok, &hot, 5, &gp, &u, &st, &err);
	int bytes = 0;
	for (int64_t i = 0; i < u.n; i++)
		bytes += u.ids[i] >= 3 && u.ids[i] < 3 + 256; /* <0x00>..<0xFF> */
	CHECK(s == SFW_OK && u.bad_utf8 == 0 &&
		  sfw_utf8_valid((const unsigned char *)u.text.data, u.text.len),
	      "tiny: %d pieces, every one whole UTF-8: %s", u.pieces, err.msg);
	CHECK(bytes > 10 && u.held > 0, "tiny: %d byte-fallback tokens came, %d pieces held back", bytes,
	      u.held);
	sfw_buf_release(&u.text);
	sfw_buf_release(&r.text);

	/* appending to a context: turn 2 prefills only its own tokens, and the
	 * two turns equal one run over the same ids */
	{
		struct sfw_ctx *ctx = NULL;
		struct sfw_ctx_params xp = sfw_ctx_default_params();
		struct sfw_sampler smp;
		struct collect t1, t2;
		collect_init(&t1, tok);
		collect_init(&t2, tok);
		struct sfw_gen_stats s1, s2;
		struct sfw_gen_params g1 = sfw_gen_default_params();
		g1.text = "Hello";
		g1.text_len = 5;
		g1.max_tokens = 5;
		g1.eos = &none;
		int ok = sfw_ctx_new(m, &xp, &ctx, &err) == SFW_OK &&
			 sfw_sampler_init(&smp, &GREEDY, 0, cf->vocab_size, &err) == SFW_OK &&
			 sfw_generate(ctx, tok, &smp, &g1, on_tok, &t1, &s1, &err) == SFW_OK;
		int32_t more[3] = {s1.pending, 40, 41};
		struct sfw_gen_params g2 = g1;
		g2.text = NULL;
		g2.ids = more;
		g2.n_ids = 3;
		ok = ok && sfw_generate(ctx, tok, &smp, &g2, on_tok, &t2, &s2, &err) == SFW_OK;
		CHECK(ok && s2.prompt_tokens == 3 && s2.ctx_pos == s1.ctx_pos + 3 + s2.decode_steps,
		      "tiny: turn 2 prefills its 3 tokens onto a context of %lld (now %lld): %s",
		      (long long)s1.ctx_pos, (long long)s2.ctx_pos, err.msg);
		/* the same ids in one prompt give the same turn-2 tokens */
		int32_t all[64];
		size_t na = 0;
		int32_t *enc = NULL;
		size_t ne = 0;
		if (ok && sfw_tokenizer_encode(tok, "Hello", 5, 1, &enc, &ne, &err) == SFW_OK &&
		    ne + 8 < 64) {
			memcpy(all, enc, ne * 4);
			na = ne;
			for (int64_t i = 0; i + 1 < t1.n; i++)
				all[na++] = t1.ids[i];
			memcpy(all + na, more, sizeof(more));
			na += 3;
		}
		sfw_free(enc);
		struct collect t3;
		collect_init(&t3, NULL);
		struct sfw_gen_params g3 = g1;
		g3.text = NULL;
		g3.ids = all;
		g3.n_ids = na;
		struct sfw_gen_stats s3;
		s = gen(m, NULL, &GREEDY, 0, &g3, &t3, &s3, &err);
		CHECK(ok && na && s == SFW_OK && t3.n == t2.n && !memcmp(t3.ids, t2.ids, (size_t)t2.n * 4),
		      "tiny: turn 2 on the kept history equals one run over history + turn: %s", err.msg);
		sfw_sampler_release(&smp);
		sfw_ctx_free(ctx);
		sfw_buf_release(&t1.text);
		sfw_buf_release(&t2.text);
		sfw_buf_release(&t3.text);
	}

	/* EOS from generation_config.json: the id greedy makes as token 3 */
	{
		struct collect g0;
		collect_init(&g0, tok);
		struct sfw_gen_params ge = gp;
		ge.max_tokens = 8;
		s = gen(m, tok, &GREEDY, 0, &ge, &g0, &st, &err);
		int32_t x = g0.n > 3 ? g0.ids[3] : -1;
		int first = 0;
		while (first < 3 && g0.ids[first] != x)
			first++;
		char path[4200], json[256];
		snprintf(path, sizeof(path), "%s/generation_config.json", dir);
		snprintf(json, sizeof(json), "{\"bos_token_id\": 1, \"eos_token_id\": [%d, 2]}", x);
		struct sfw_eos_set eos;
		int ok = s == SFW_OK && x >= 0 && !sfw_sampler_is_stop(x, cf->eos_token_ids, cf->n_eos) &&
			 sfw_write_file_atomic(path, json, strlen(json), &err) == SFW_OK &&
			 sfw_eos_load(dir, cf, tok, &eos, &err) == SFW_OK;
		CHECK(ok && sfw_eos_has(&eos, x) && sfw_eos_has(&eos, 2) &&
			  sfw_eos_has(&eos, sfw_tokenizer_special_id(tok, "<|im_end|>")),
		      "tiny: EOS set = config.json + generation_config.json + tokenizer_config.json's "
		      "<|im_end|>: %s",
		      err.msg);
		struct collect c;
		collect_init(&c, tok);
		ge.eos = &eos;
		s = gen(m, tok, &GREEDY, 0, &ge, &c, &st, &err);
		CHECK(ok && s == SFW_OK && st.finish == SFW_FINISH_EOS && st.tokens == first &&
			  st.pending == x && c.n == first,
		      "tiny: generation_config.json's id %d stops the run after %d tokens, not shown (%lld, "
		      "finish %s)",
		      x, first, (long long)st.tokens, sfw_finish_name(st.finish));
		sfw_buf_release(&g0.text);
		sfw_buf_release(&c.text);
	}
	sfw_tokenizer_free(tok);
	sfw_model_free(m);
}

static void test_eos_parse(void)
{
	struct sfw_eos_set s = {0};
	struct sfw_err err = {0};
	const char *ok1 = "{\"eos_token_id\": 7}", *ok2 = "{\"eos_token_id\": [2, 9, 2]}",
		   *ok3 = "{\"x\": 1}";
	CHECK(sfw_eos_parse_generation_config(ok1, strlen(ok1), "g", 100, &s, &err) == SFW_OK && s.n == 1 &&
		  s.ids[0] == 7,
	      "generation_config: one id");
	CHECK(sfw_eos_parse_generation_config(ok2, strlen(ok2), "g", 100, &s, &err) == SFW_OK && s.n == 3 &&
		  sfw_eos_has(&s, 9) && sfw_eos_has(&s, 2),
	      "generation_config: a list, duplicates once");
	CHECK(sfw_eos_parse_generation_config(ok3, strlen(ok3), "g", 100, &s, &err) == SFW_OK && s.n == 3,
	      "generation_config without eos_token_id adds nothing");
	const char *bad[] = {"{\"eos_token_id\": 100}",
			     "{\"eos_token_id\": -1}",
			     "{\"eos_token_id\": 1.5}",
			     "{\"eos_token_id\": \"2\"}",
			     "{\"eos_token_id\": [1, \"x\"]}",
			     "[2]",
			     "{\"eos_token_id\": 1, \"eos_token_id\": 2}",
			     "{\"eos_token_id\": 1} x",
			     "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct sfw_eos_set t = {0};
		enum sfw_status r =
		    sfw_eos_parse_generation_config(bad[i], strlen(bad[i]), "g", 100, &t, &err);
		CHECK(r != SFW_OK && (r == SFW_E_FORMAT || r == SFW_E_RANGE),
		      "generation_config %zu refused: %s", i, err.msg);
	}
	char name[300];
	const char *t1 = "{\"eos_token\": \"<|im_end|>\"}",
		   *t2 = "{\"eos_token\": {\"content\": \"</s>\", \"lstrip\": false}}";
	CHECK(sfw_eos_parse_tokenizer_config(t1, strlen(t1), "t", name, sizeof(name), &err) == SFW_OK &&
		  !strcmp(name, "<|im_end|>"),
	      "tokenizer_config: eos_token as a string");
	CHECK(sfw_eos_parse_tokenizer_config(t2, strlen(t2), "t", name, sizeof(name), &err) == SFW_OK &&
		  !strcmp(name, "</s>"),
	      "tokenizer_config: eos_token as an AddedToken object");
	const char *tb[] = {"{\"eos_token\": 2}", "{\"eos_token\": \"\"}",
			    "{\"eos_token\": {\"content\": 3}}", "x"};
	for (size_t i = 0; i < sizeof(tb) / sizeof(tb[0]); i++)
		CHECK(sfw_eos_parse_tokenizer_config(tb[i], strlen(tb[i]), "t", name, sizeof(name), &err) !=
			  SFW_OK,
		      "tokenizer_config %zu refused: %s", i, err.msg);
}

int main(void)
{
	test_holdback();
	test_eos_parse();
	const char *gdir = check_golden_dir();
	if (gdir) {
		test_golden_chain(gdir, "tiny-dense");
		test_golden_chain(gdir, "tiny-sparse");
	}
	char tmp[4096], dir[4200];
	snprintf(tmp, sizeof(tmp), "%s/salafw-gen.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		CHECK(0, "mkdtemp");
		return CHECK_REPORT("test_generate");
	}
	snprintf(dir, sizeof(dir), "%s/tiny", tmp);
	struct sfw_err err = {0};
	struct sfw_mkmodel_params p = {.preset = SFW_MKMODEL_TINY, .seed = 3};
	CHECK(sfw_mkmodel(dir, &p, &err) == SFW_OK, "mkmodel tiny: %s", err.msg);
	test_text(dir);
	char cmd[8500];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", tmp);
	return CHECK_REPORT("test_generate");
}
