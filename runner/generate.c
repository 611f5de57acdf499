/* generate.c - end-of-sequence sets and the generation loop (generate.h). */
#include "runner/generate.h"
#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "json.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define GEN_CONFIG_MAX (1u << 20) /* generation_config.json bytes */
#define TOKCFG_MAX (16u << 20)	  /* tokenizer_config.json may carry a long chat template */

/* ---- end-of-sequence ids (the parsers: runner/eos.c) ----------------------- */

/* Reads DIR/NAME into b; *found = 0 when it does not exist. */
static enum sfw_status read_opt(const char *dir, const char *name, size_t max, struct sfw_buf *b, int *found,
				char *path, size_t path_cap, struct sfw_err *err)
{
	snprintf(path, path_cap, "%s/%s", dir, name);
	*found = 0;
	struct sfw_err e = {0};
	enum sfw_status s = sfw_read_file(path, max, b, &e);
	if (s == SFW_E_MISSING)
		return SFW_OK;
	if (s != SFW_OK)
		return sfw_fail(err, s, "%s", e.msg);
	*found = 1;
	return SFW_OK;
}

enum sfw_status sfw_eos_load(const char *dir, const struct sfw_config *cf, const struct sfw_tokenizer *tok,
			     struct sfw_eos_set *out, struct sfw_err *err)
{
	memset(out, 0, sizeof(*out));
	enum sfw_status s = SFW_OK;
	for (int i = 0; s == SFW_OK && i < cf->n_eos; i++)
		s = sfw_eos_add(out, cf->eos_token_ids[i], err);
	char path[4200], name[SFW_STOP_MAX_LEN + 1];
	struct sfw_buf b;
	int found;
	sfw_buf_init(&b, TOKCFG_MAX);
	if (s == SFW_OK)
		s = read_opt(dir, "generation_config.json", GEN_CONFIG_MAX, &b, &found, path, sizeof(path),
			     err);
	if (s == SFW_OK && found)
		s = sfw_eos_parse_generation_config(b.data ? b.data : "", b.len, path, cf->vocab_size, out,
						    err);
	sfw_buf_release(&b); /* sfw_read_file starts a fresh buffer */
	if (s == SFW_OK && tok)
		s = read_opt(dir, "tokenizer_config.json", TOKCFG_MAX, &b, &found, path, sizeof(path), err);
	if (s == SFW_OK && tok && found &&
	    (s = sfw_eos_parse_tokenizer_config(b.data ? b.data : "", b.len, path, name, sizeof(name),
						err)) == SFW_OK &&
	    name[0]) {
		int32_t id = sfw_tokenizer_special_id(tok, name);
		if (id < 0)
			s = sfw_fail(err, SFW_E_FORMAT,
				     "%s: eos_token is not one of the tokenizer's special tokens", path);
		else
			s = sfw_eos_add(out, id, err);
	}
	sfw_buf_release(&b);
	return s;
}

/* ---- generation ------------------------------------------------------------ */

const char *sfw_finish_name(enum sfw_finish f)
{
	switch (f) {
	case SFW_FINISH_EOS:
		return "eos";
	case SFW_FINISH_STOP:
		return "stop";
	case SFW_FINISH_LENGTH:
		return "length";
	case SFW_FINISH_CANCEL:
		return "cancel";
	case SFW_FINISH_NONE:
		break;
	}
	return "none";
}

struct sfw_gen_params sfw_gen_default_params(void)
{
	struct sfw_gen_params p;
	memset(&p, 0, sizeof(p));
	return p;
}

size_t sfw_stop_holdback(const char *text, size_t n, const char *const *stop, size_t n_stop)
{
	size_t best = 0;
	for (size_t i = 0; i < n_stop; i++) {
		size_t sl = strlen(stop[i]);
		for (size_t k = sl - 1 < n ? sl - 1 : n; k > best; k--)
			if (memcmp(text + n - k, stop[i], k) == 0) {
				best = k;
				break;
			}
	}
	return best;
}

/* The earliest start of any stop string in text[0..n), or n. */
static size_t stop_find(const char *text, size_t n, const char *const *stop, size_t n_stop)
{
	size_t at = n;
	for (size_t i = 0; i < n_stop; i++) {
		const char *f = memmem(text, n, stop[i], strlen(stop[i]));
		if (f && (size_t)(f - text) < at)
			at = (size_t)(f - text);
	}
	return at;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static enum sfw_status check_params(const struct sfw_gen_params *p, const struct sfw_tokenizer *tok,
				    struct sfw_err *err)
{
	if (p->max_tokens < 0 || p->max_ctx < 0)
		return sfw_fail(err, SFW_E_INVAL, "negative token limit");
	if (!p->ids && !p->text)
		return sfw_fail(err, SFW_E_INVAL, "no prompt (ids or text)");
	if (!p->ids && !tok)
		return sfw_fail(err, SFW_E_INVAL, "a text prompt needs a tokenizer");
	if (p->n_stop > SFW_STOP_MAX)
		return sfw_fail(err, SFW_E_INVAL, "%zu stop strings (at most %d)", p->n_stop, SFW_STOP_MAX);
	if (p->n_stop && !tok)
		return sfw_fail(err, SFW_E_INVAL, "stop strings need a tokenizer");
	for (size_t i = 0; i < p->n_stop; i++) {
		size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
		if (n == 0 || n > SFW_STOP_MAX_LEN)
			return sfw_fail(err, SFW_E_INVAL, "stop string %zu has %zu bytes (1 to %d allowed)",
					i + 1, n, SFW_STOP_MAX_LEN);
		if (!sfw_utf8_valid((const unsigned char *)p->stop[i], n))
			return sfw_fail(err, SFW_E_INVAL, "stop string %zu is not valid UTF-8", i + 1);
	}
	return SFW_OK;
}

struct gen {
	const struct sfw_gen_params *p;
	sfw_gen_fn cb;
	void *user;
	struct sfw_buf hold;  /* decoded text not shown yet */
	struct sfw_buf piece; /* one push's bytes */
	struct sfw_tokdec dec;
	int text;
};

/* Shows hold[0..n) with the token's callback and drops it; returns the
 * callback's answer. */
static int show(struct gen *g, int32_t id, int64_t index, size_t n)
{
	struct sfw_gen_token t = {id, index, g->hold.data ? g->hold.data : "", n};
	int r = g->cb ? g->cb(g->user, &t) : 0;
	if (g->hold.data) {
		memmove(g->hold.data, g->hold.data + n, g->hold.len - n);
		g->hold.len -= n;
		g->hold.data[g->hold.len] = 0;
	}
	return r;
}

/* Decodes one made token into hold; *stop_at = where a stop string starts
 * (hold.len when none). */
static enum sfw_status take_text(struct gen *g, int32_t id, size_t *stop_at, struct sfw_err *err)
{
	enum sfw_status s = SFW_OK;
	*stop_at = 0;
	if (!g->text)
		return SFW_OK;
	g->piece.len = 0;
	if ((s = sfw_tokdec_push(&g->dec, id, &g->piece, err)) != SFW_OK)
		return s;
	if (g->piece.len && (s = sfw_buf_append(&g->hold, g->piece.data, g->piece.len)) != SFW_OK)
		return sfw_fail(err, s, "generated text longer than %zu bytes held back", g->hold.max);
	*stop_at = stop_find(g->hold.data ? g->hold.data : "", g->hold.len, g->p->stop, g->p->n_stop);
	return SFW_OK;
}

enum sfw_status sfw_generate(struct sfw_ctx *ctx, const struct sfw_tokenizer *tok, struct sfw_sampler *smp,
			     const struct sfw_gen_params *p, sfw_gen_fn cb, void *user,
			     struct sfw_gen_stats *st, struct sfw_err *err)
{
	memset(st, 0, sizeof(*st));
	st->pending = -1;
	const struct sfw_config *cf = sfw_model_config(sfw_ctx_model(ctx));
	int V = cf->vocab_size;
	enum sfw_status s = check_params(p, tok, err);
	if (s != SFW_OK)
		return s;
	if (smp->vocab != V)
		return sfw_fail(err, SFW_E_INVAL, "sampler made for vocab %d, the model has %d", smp->vocab,
				V);
	struct sfw_eos_set eos = {0};
	if (p->eos)
		eos = *p->eos;
	else
		for (int i = 0; i < cf->n_eos && i < SFW_EOS_MAX; i++)
			eos.ids[eos.n++] = cf->eos_token_ids[i];

	int32_t *enc = NULL;
	const int32_t *ids = p->ids;
	size_t n = p->n_ids;
	if (!ids) {
		if ((s = sfw_tokenizer_encode(tok, p->text, p->text_len, sfw_ctx_pos(ctx) == 0, &enc, &n,
					      err)) != SFW_OK)
			return s;
		ids = enc;
	}
	struct gen g = {.p = p, .cb = cb, .user = user, .text = tok != NULL};
	sfw_buf_init(&g.hold, 1u << 20);
	sfw_buf_init(&g.piece, 1u << 16);
	float *logits = NULL;
	int64_t pos0 = sfw_ctx_pos(ctx);
	if (n == 0) {
		s = sfw_fail(err, SFW_E_INVAL, "empty prompt");
		goto done;
	}
	if (p->max_ctx && pos0 + (int64_t)n > p->max_ctx) {
		s = sfw_fail(err, SFW_E_RANGE,
			     "a prompt of %zu tokens does not fit the context of %lld (%lld in use)", n,
			     (long long)p->max_ctx, (long long)pos0);
		goto done;
	}
	if (!(logits = sfw_malloc((size_t)V * sizeof(float)))) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the logits");
		goto done;
	}
	if (g.text) {
		sfw_tokdec_init(&g.dec, tok, p->skip_special);
		/* primed with the prompt: the first piece keeps its leading space */
		if ((s = sfw_tokdec_prime(&g.dec, ids, n, err)) != SFW_OK)
			goto done;
	}
	double t0 = now_s();
	if ((s = sfw_ctx_prefill(ctx, ids, n, logits, err)) != SFW_OK)
		goto done;
	double t1 = now_s();
	st->prompt_tokens = (int64_t)n;
	st->prefill_s = t1 - t0;

	int32_t id = sfw_sampler_sample(smp, logits, V);
	if (p->n_force)
		id = p->force[0];
	if (id < 0) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the sampler's scratch");
		goto done;
	}
	enum sfw_finish fin = SFW_FINISH_NONE;
	for (int64_t i = 0;; i++) {
		if ((size_t)i >= p->n_force && sfw_eos_has(&eos, id)) {
			fin = SFW_FINISH_EOS;
			break;
		}
		st->tokens++;
		size_t stop_at;
		if ((s = take_text(&g, id, &stop_at, err)) != SFW_OK)
			goto done;
		if (g.text && stop_at < g.hold.len) {
			show(&g, id, i, stop_at);
			g.hold.len = 0; /* the stop string and what followed it are not shown */
			fin = SFW_FINISH_STOP;
			break;
		}
		size_t keep =
		    g.text ? sfw_stop_holdback(g.hold.data ? g.hold.data : "", g.hold.len, p->stop, p->n_stop)
			   : 0;
		if (show(&g, id, i, g.hold.len - keep)) {
			fin = SFW_FINISH_CANCEL;
			break;
		}
		if ((p->max_tokens && st->tokens >= p->max_tokens) ||
		    (p->max_ctx && sfw_ctx_pos(ctx) >= p->max_ctx)) {
			fin = SFW_FINISH_LENGTH;
			break;
		}
		int32_t next = -1;
		double u = sfw_sampler_uniform(smp);
		double a = now_s();
		if ((s = sfw_ctx_decode_next(ctx, id, &smp->p, u, &next, err)) != SFW_OK)
			goto done;
		st->decode_s += now_s() - a;
		st->decode_steps++;
		id = (size_t)(i + 1) < p->n_force ? p->force[i + 1] : next;
	}
	st->finish = fin;
	st->pending = id;
	if (g.text && fin != SFW_FINISH_STOP) {
		g.piece.len = 0;
		if ((s = sfw_tokdec_flush(&g.dec, &g.piece, err)) != SFW_OK)
			goto done;
		if (g.piece.len && (s = sfw_buf_append(&g.hold, g.piece.data, g.piece.len)) != SFW_OK) {
			s = sfw_fail(err, s, "generated text longer than %zu bytes held back", g.hold.max);
			goto done;
		}
	}
	if (g.hold.len || fin != SFW_FINISH_STOP)
		show(&g, -1, -1, g.hold.len);
done:
	st->ctx_pos = sfw_ctx_pos(ctx);
	sfw_free(logits);
	sfw_free(enc);
	sfw_buf_release(&g.hold);
	sfw_buf_release(&g.piece);
	return s;
}
