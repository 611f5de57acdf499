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

/* ---- end-of-sequence ids (the parsers: formats/eos.c) ----------------------- */

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


/* The parameters a stream uses (the prompt fields are sfw_generate's). */
static enum sfw_status check_stream_params(const struct sfw_gen_params *p, const struct sfw_tokenizer *tok,
					   struct sfw_err *err)
{
	if (p->max_tokens < 0 || p->max_ctx < 0)
		return sfw_fail(err, SFW_E_INVAL, "negative token limit");
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

/* ---- one sequence's output stream ----------------------------------------- */

enum sfw_status sfw_gen_stream_init(struct sfw_gen_stream *g, const struct sfw_tokenizer *tok,
				    const struct sfw_config *cf, const struct sfw_gen_params *p,
				    const int32_t *prompt, size_t n, struct sfw_err *err)
{
	memset(g, 0, sizeof(*g));
	g->p = p;
	g->text = tok != NULL;
	sfw_buf_init(&g->hold, 1u << 20);
	sfw_buf_init(&g->piece, 1u << 16);
	sfw_buf_init(&g->out, 1u << 20);
	enum sfw_status s = check_stream_params(p, tok, err);
	if (s != SFW_OK)
		return s;
	if (p->eos)
		g->eos = *p->eos;
	else
		for (int i = 0; i < cf->n_eos && i < SFW_EOS_MAX; i++)
			g->eos.ids[g->eos.n++] = cf->eos_token_ids[i];
	if (g->text) {
		sfw_tokdec_init(&g->dec, tok, p->skip_special);
		if ((s = sfw_tokdec_prime(&g->dec, prompt, n, err)) != SFW_OK)
			return s;
	}
	return SFW_OK;
}

void sfw_gen_stream_release(struct sfw_gen_stream *g)
{
	sfw_buf_release(&g->hold);
	sfw_buf_release(&g->piece);
	sfw_buf_release(&g->out);
}

/* Moves hold[0..n) to out (the piece shown) and drops it from hold. */
static enum sfw_status show(struct sfw_gen_stream *g, size_t n, const char **text, size_t *len,
			    struct sfw_err *err)
{
	g->out.len = 0;
	if (n && sfw_buf_append(&g->out, g->hold.data, n) != SFW_OK)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for a text piece");
	if (g->hold.data) {
		memmove(g->hold.data, g->hold.data + n, g->hold.len - n);
		g->hold.len -= n;
		g->hold.data[g->hold.len] = 0;
	}
	*text = g->out.data ? g->out.data : "";
	*len = n;
	return SFW_OK;
}

/* Appends the decoder's bytes in piece to hold. */
static enum sfw_status hold_piece(struct sfw_gen_stream *g, struct sfw_err *err)
{
	enum sfw_status s;
	if (g->piece.len && (s = sfw_buf_append(&g->hold, g->piece.data, g->piece.len)) != SFW_OK)
		return sfw_fail(err, s, "generated text longer than %zu bytes held back", g->hold.max);
	return SFW_OK;
}

enum sfw_status sfw_gen_stream_push(struct sfw_gen_stream *g, int32_t id, int forced, int64_t ctx_pos,
				    const char **text, size_t *len, enum sfw_finish *fin, struct sfw_err *err)
{
	const struct sfw_gen_params *p = g->p;
	enum sfw_status s;
	*text = "";
	*len = 0;
	*fin = g->finish;
	if (g->finish != SFW_FINISH_NONE)
		return sfw_fail(err, SFW_E_INVAL, "a token pushed to a finished stream");
	if (!forced && sfw_eos_has(&g->eos, id)) {
		*fin = g->finish = SFW_FINISH_EOS;
		return SFW_OK;
	}
	g->tokens++;
	size_t keep = 0;
	if (g->text) {
		g->piece.len = 0;
		if ((s = sfw_tokdec_push(&g->dec, id, &g->piece, err)) != SFW_OK ||
		    (s = hold_piece(g, err)) != SFW_OK)
			return s;
		const char *h = g->hold.data ? g->hold.data : "";
		size_t stop_at = stop_find(h, g->hold.len, p->stop, p->n_stop);
		if (stop_at < g->hold.len) {
			s = show(g, stop_at, text, len, err);
			g->hold.len = 0; /* the stop string and what followed it are not shown */
			*fin = g->finish = SFW_FINISH_STOP;
			return s;
		}
		keep = sfw_stop_holdback(h, g->hold.len, p->stop, p->n_stop);
	}
	if ((s = show(g, g->hold.len - keep, text, len, err)) != SFW_OK)
		return s;
	if ((p->max_tokens && g->tokens >= p->max_tokens) || (p->max_ctx && ctx_pos >= p->max_ctx))
		*fin = g->finish = SFW_FINISH_LENGTH;
	return SFW_OK;
}

enum sfw_status sfw_gen_stream_flush(struct sfw_gen_stream *g, const char **text, size_t *len,
				     struct sfw_err *err)
{
	enum sfw_status s;
	*text = "";
	*len = 0;
	if (g->finish == SFW_FINISH_NONE)
		g->finish = SFW_FINISH_CANCEL;
	if (g->text && g->finish != SFW_FINISH_STOP) {
		g->piece.len = 0;
		if ((s = sfw_tokdec_flush(&g->dec, &g->piece, err)) != SFW_OK ||
		    (s = hold_piece(g, err)) != SFW_OK)
			return s;
	}
	return show(g, g->hold.len, text, len, err);
}

/* ---- the generation loop ---------------------------------------------------- */

/* The callback's answer for one piece (nonzero: stop). */
static int emit(sfw_gen_fn cb, void *user, int32_t id, int64_t index, const char *text, size_t len)
{
	struct sfw_gen_token t = {id, index, text, len};
	return cb ? cb(user, &t) : 0;
}

enum sfw_status sfw_generate(struct sfw_ctx *ctx, const struct sfw_tokenizer *tok, struct sfw_sampler *smp,
			     const struct sfw_gen_params *p, sfw_gen_fn cb, void *user,
			     struct sfw_gen_stats *st, struct sfw_err *err)
{
	memset(st, 0, sizeof(*st));
	st->pending = -1;
	const struct sfw_config *cf = sfw_model_config(sfw_ctx_model(ctx));
	int V = cf->vocab_size;
	if (!p->ids && !p->text)
		return sfw_fail(err, SFW_E_INVAL, "no prompt (ids or text)");
	if (!p->ids && !tok)
		return sfw_fail(err, SFW_E_INVAL, "a text prompt needs a tokenizer");
	enum sfw_status s = check_stream_params(p, tok, err);
	if (s != SFW_OK)
		return s;
	if (smp->vocab != V)
		return sfw_fail(err, SFW_E_INVAL, "sampler made for vocab %d, the model has %d", smp->vocab,
				V);

	int32_t *enc = NULL;
	const int32_t *ids = p->ids;
	size_t n = p->n_ids;
	if (!ids) {
		if ((s = sfw_tokenizer_encode(tok, p->text, p->text_len, sfw_ctx_pos(ctx) == 0, &enc, &n,
					      err)) != SFW_OK)
			return s;
		ids = enc;
	}
	struct sfw_gen_stream g;
	int64_t pos0 = sfw_ctx_pos(ctx);
	if ((s = sfw_gen_stream_init(&g, tok, cf, p, ids, n, err)) != SFW_OK)
		goto done;
	if (n == 0) {
		s = sfw_fail(err, SFW_E_INVAL, "empty prompt");
		goto done;
	}
	if (p->n_cached > n || (int64_t)p->n_cached > pos0) {
		s = sfw_fail(err, SFW_E_INVAL, "%zu cached prompt tokens for a prompt of %zu in a context holding %lld",
			     p->n_cached, n, (long long)pos0);
		goto done;
	}
	pos0 -= (int64_t)p->n_cached; /* where the prompt starts */
	if (p->max_ctx && pos0 + (int64_t)n > p->max_ctx) {
		s = sfw_fail(err, SFW_E_RANGE,
			     "a prompt of %zu tokens does not fit the context of %lld (%lld in use)", n,
			     (long long)p->max_ctx, (long long)pos0);
		goto done;
	}
	/* the prompt and the first choice, made like every later one (where
	 * the logits are: on the GPU for the CUDA backend) */
	double t0 = sfw_now_s();
	int32_t id = -1;
	size_t nc = p->n_cached;
	if (nc < n)
		s = sfw_ctx_prefill_next(ctx, ids + nc, n - nc, &smp->p, sfw_sampler_uniform(smp), &id, err);
	else /* the whole prompt came with a loaded state: its last logits too */
		s = sfw_ctx_next_from_last(ctx, &smp->p, sfw_sampler_uniform(smp), &id, err);
	if (s != SFW_OK)
		goto done;
	double t1 = sfw_now_s();
	st->prompt_tokens = (int64_t)(n - nc);
	st->prefill_s = t1 - t0;
	if (p->on_prompt)
		p->on_prompt(p->prompt_user, ctx, ids, n);
	if (p->n_force)
		id = p->force[0];
	enum sfw_finish fin = SFW_FINISH_NONE;
	const char *text;
	size_t len;
	for (int64_t i = 0;; i++) {
		if ((s = sfw_gen_stream_push(&g, id, (size_t)i < p->n_force, sfw_ctx_pos(ctx), &text, &len,
					     &fin, err)) != SFW_OK)
			goto done;
		if (fin == SFW_FINISH_EOS)
			break;
		if (emit(cb, user, id, i, text, len) && fin != SFW_FINISH_STOP)
			fin = SFW_FINISH_CANCEL;
		if (fin != SFW_FINISH_NONE)
			break;
		int32_t next = -1;
		double u = sfw_sampler_uniform(smp);
		double a = sfw_now_s();
		if ((s = sfw_ctx_decode_next(ctx, id, &smp->p, u, &next, err)) != SFW_OK)
			goto done;
		st->decode_s += sfw_now_s() - a;
		st->decode_steps++;
		id = (size_t)(i + 1) < p->n_force ? p->force[i + 1] : next;
	}
	st->tokens = g.tokens;
	st->finish = fin;
	st->pending = id;
	if ((s = sfw_gen_stream_flush(&g, &text, &len, err)) != SFW_OK)
		goto done;
	if (len || fin != SFW_FINISH_STOP)
		emit(cb, user, -1, -1, text, len);
done:
	st->ctx_pos = sfw_ctx_pos(ctx);
	sfw_free(enc);
	sfw_gen_stream_release(&g);
	return s;
}
