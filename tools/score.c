/* score.c - gathers the forward pass's taps into whole, golden-named tensors
 * (struct sfw_record) and runs the scoring sequence behind `salafw score`. */
#include "alloc.h"
#include "formats/safetensors.h"
#include "runner/generate.h"
#include "runner/runner.h"
#include "tools/tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REC_MAX 4096

struct sfw_record {
	struct sfw_record_tensor t[REC_MAX];
	size_t n;
	int64_t T;
	int S, nkv, k;
	int64_t max_blocks; /* decode block_score width */
	int keep_hidden;
	enum sfw_status status;
	char msg[256];
};

enum sfw_status sfw_record_new(const struct sfw_config *cf, int64_t prompt_len, int decode_steps,
			       struct sfw_record **out, struct sfw_err *err)
{
	struct sfw_record *r = sfw_calloc(1, sizeof(*r));
	if (!r)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	r->T = prompt_len;
	r->S = decode_steps;
	r->nkv = cf->num_key_value_heads;
	r->k = cf->sparse_k;
	r->max_blocks = (prompt_len + decode_steps + cf->sparse_block_size - 1) / cf->sparse_block_size;
	r->keep_hidden = 1;
	*out = r;
	return SFW_OK;
}

void sfw_record_free(struct sfw_record *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++) {
		sfw_free((void *)r->t[i].name);
		sfw_free(r->t[i].data);
	}
	sfw_free(r);
}

size_t sfw_record_count(const struct sfw_record *r)
{
	return r->n;
}

const struct sfw_record_tensor *sfw_record_at(const struct sfw_record *r, size_t i)
{
	return i < r->n ? &r->t[i] : NULL;
}

const struct sfw_record_tensor *sfw_record_find(const struct sfw_record *r, const char *name)
{
	for (size_t i = 0; i < r->n; i++)
		if (strcmp(r->t[i].name, name) == 0)
			return &r->t[i];
	return NULL;
}

enum sfw_status sfw_record_status(const struct sfw_record *r, struct sfw_err *err)
{
	if (r->status != SFW_OK)
		return sfw_fail(err, r->status, "%s", r->msg);
	return SFW_OK;
}

/* Finds or creates a tensor; new ones are filled with `fill` (-1 / NaN / 0). */
static struct sfw_record_tensor *get(struct sfw_record *r, const char *name, int is_int, int ndim, int64_t d0,
				     int64_t d1, int64_t d2, double fill)
{
	struct sfw_record_tensor *t = (struct sfw_record_tensor *)sfw_record_find(r, name);
	if (t)
		return t;
	if (r->status != SFW_OK)
		return NULL;
	if (r->n == REC_MAX) {
		r->status = SFW_E_RANGE;
		snprintf(r->msg, sizeof(r->msg), "too many recorded tensors");
		return NULL;
	}
	int64_t shape[3] = {d0, d1, d2};
	size_t n = 1;
	for (int i = 0; i < ndim; i++)
		n *= (size_t)shape[i];
	t = &r->t[r->n];
	t->data = sfw_malloc(n * 4 + 4);
	t->name = sfw_strdup(name);
	if (!t->data || !t->name) {
		sfw_free(t->data);
		sfw_free((void *)t->name);
		r->status = SFW_E_NOMEM;
		snprintf(r->msg, sizeof(r->msg), "out of memory recording '%s'", name);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		if (is_int)
			((int32_t *)t->data)[i] = (int32_t)fill;
		else
			((float *)t->data)[i] = (float)fill;
	}
	t->is_int = is_int;
	t->ndim = ndim;
	memcpy(t->shape, shape, sizeof(shape));
	r->n++;
	return t;
}

void sfw_record_tap(void *user, const struct sfw_tap *tp)
{
	struct sfw_record *r = user;
	const char *nm = tp->name;
	int decode = strncmp(nm, "decode.", 7) == 0 || strstr(nm, ".decode.") != NULL;
	int64_t row = decode ? tp->row0 - r->T : tp->row0; /* step or position */
	struct sfw_record_tensor *t;
	if (strncmp(nm, "sparse.", 7) != 0) {
		int is_logits = strstr(nm, ".logits") != NULL;
		if (!is_logits && !r->keep_hidden)
			return;
		int64_t total = decode ? r->S : r->T;
		if (row < 0 || row + tp->rows > total)
			return; /* outside the recorded sequence */
		if (!(t = get(r, nm, 0, 2, total, tp->cols, 0, 0)))
			return;
		memcpy((float *)t->data + row * tp->cols, tp->data, (size_t)tp->rows * tp->cols * sizeof(float));
		return;
	}
	char name[128];
	const char *suffix = strrchr(nm, '.') + 1;
	if (strcmp(suffix, "topk_idx") == 0) {
		const int32_t *src = tp->data;
		if (!decode) {
			if (!(t = get(r, nm, 1, 3, tp->nkv, r->T, tp->cols, -1)) || row + tp->rows > r->T)
				return;
			for (int g = 0; g < tp->nkv; g++)
				memcpy((int32_t *)t->data + ((size_t)g * r->T + row) * tp->cols,
				       src + (size_t)g * tp->rows * tp->cols, (size_t)tp->rows * tp->cols * 4);
		} else {
			if (row < 0 || row >= r->S || !(t = get(r, nm, 1, 3, r->S, tp->nkv, tp->cols, -1)))
				return;
			memcpy((int32_t *)t->data + (size_t)row * tp->nkv * tp->cols, src, (size_t)tp->nkv * tp->cols * 4);
		}
	} else if (strcmp(suffix, "block_score") == 0) {
		if (!decode) {
			snprintf(name, sizeof(name), "%s_last", nm);
			if (!(t = get(r, name, 0, 2, tp->nkv, tp->cols, 0, 0)) || t->shape[1] != tp->cols)
				return;
			memcpy(t->data, tp->data, (size_t)tp->nkv * tp->cols * 4);
		} else {
			if (row < 0 || row >= r->S || tp->cols > r->max_blocks ||
			    !(t = get(r, nm, 0, 3, r->S, tp->nkv, r->max_blocks, NAN)))
				return;
			for (int g = 0; g < tp->nkv; g++)
				memcpy((float *)t->data + ((size_t)row * tp->nkv + g) * r->max_blocks,
				       (const float *)tp->data + (size_t)g * tp->cols, (size_t)tp->cols * 4);
		}
	} else if (strcmp(suffix, "n_compressed") == 0 && decode) {
		if (row < 0 || row >= r->S || !(t = get(r, nm, 1, 2, r->S, 2, 0, 0)))
			return;
		memcpy((int32_t *)t->data + (size_t)row * 2, tp->data, 8);
	}
}

enum sfw_status sfw_record_put_i32(struct sfw_record *r, const char *name, const int32_t *v, int64_t n,
				   struct sfw_err *err)
{
	struct sfw_record_tensor *t = (struct sfw_record_tensor *)sfw_record_find(r, name);
	if (t && (t->ndim != 1 || t->shape[0] != n || !t->is_int))
		return sfw_fail(err, SFW_E_INVAL, "record: '%s' exists with another shape", name);
	if (!t && !(t = get(r, name, 1, 1, n, 0, 0, 0)))
		return sfw_record_status(r, err);
	memcpy(t->data, v, (size_t)n * sizeof(int32_t));
	return SFW_OK;
}

static int cmp_tensor(const void *a, const void *b)
{
	const struct sfw_record_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

enum sfw_status sfw_record_write(const struct sfw_record *r, const char *path, const char *meta_key,
				 const char *meta_value, struct sfw_err *err)
{
	const struct sfw_record_tensor **order = sfw_malloc((r->n + 1) * sizeof(*order));
	if (!order)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < r->n; i++)
		order[i] = &r->t[i];
	qsort(order, r->n, sizeof(*order), cmp_tensor);
	struct sfw_st_writer *w = NULL;
	enum sfw_status s = sfw_st_writer_new(path, &w, err);
	if (s == SFW_OK && meta_key)
		s = sfw_st_writer_meta(w, meta_key, meta_value, err);
	for (size_t i = 0; s == SFW_OK && i < r->n; i++) {
		uint64_t shape[3];
		for (int d = 0; d < order[i]->ndim; d++)
			shape[d] = (uint64_t)order[i]->shape[d];
		s = sfw_st_writer_declare(w, order[i]->name, order[i]->is_int ? SFW_DTYPE_I32 : SFW_DTYPE_F32,
					  order[i]->ndim, shape, err);
	}
	for (size_t i = 0; s == SFW_OK && i < r->n; i++) {
		size_t n = 4;
		for (int d = 0; d < order[i]->ndim; d++)
			n *= (size_t)order[i]->shape[d];
		s = sfw_st_writer_write(w, order[i]->data, n, err);
	}
	if (s == SFW_OK)
		s = sfw_st_writer_commit(w, err);
	sfw_st_writer_free(w);
	sfw_free(order);
	return s;
}

/* The tokens made, in order (the generation callback). */
struct made {
	int32_t *ids;
	int64_t n, cap;
};

static int on_made(void *user, const struct sfw_gen_token *t)
{
	struct made *m = user;
	if (t->id >= 0 && m->n < m->cap)
		m->ids[m->n++] = t->id;
	return 0;
}

enum sfw_status sfw_score_run(struct sfw_model *m, const struct sfw_score_params *p, struct sfw_record **out,
			      struct sfw_err *err)
{
	const struct sfw_config *cf = sfw_model_config(m);
	struct sfw_ctx_params cp = p->ctx;
	if (cp.n_ctx == 0)
		cp.n_ctx = (int64_t)p->n + p->decode_steps;
	struct sfw_ctx *c = NULL;
	struct sfw_record *r = NULL;
	int32_t *toks = NULL;
	struct made made = {0};
	enum sfw_status s;
	*out = NULL;
	if (p->decode_steps < 0)
		return sfw_fail(err, SFW_E_INVAL, "negative decode step count");
	if ((s = sfw_record_new(cf, (int64_t)p->n, p->decode_steps, &r, err)) != SFW_OK)
		return s;
	r->keep_hidden = p->taps;
	int S = p->decode_steps, V = cf->vocab_size;
	toks = sfw_malloc(((size_t)S + 1) * sizeof(int32_t));
	made.ids = sfw_malloc(((size_t)S + 1) * sizeof(int32_t));
	made.cap = S + 1;
	if (!toks || !made.ids) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto done;
	}
	if ((s = sfw_ctx_new(m, &cp, &c, err)) != SFW_OK)
		goto done;
	sfw_ctx_set_tap(c, sfw_record_tap, r);
	/* The prompt, then S one-token calls: S + 1 tokens made greedily (or
	 * fed from p->feed), the last one never fed. */
	struct sfw_op_sample_params greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .greedy = 1};
	struct sfw_sampler smp;
	if ((s = sfw_sampler_init(&smp, &greedy, 0, V, err)) != SFW_OK)
		goto done;
	struct sfw_eos_set none = {0};
	struct sfw_gen_params g = sfw_gen_default_params();
	g.ids = p->ids;
	g.n_ids = p->n;
	g.max_tokens = S + 1;
	g.eos = &none;
	g.force = p->feed;
	g.n_force = p->feed ? (size_t)S : 0;
	struct sfw_gen_stats st;
	s = sfw_generate(c, NULL, &smp, &g, on_made, &made, &st, err);
	sfw_sampler_release(&smp);
	if (s != SFW_OK)
		goto done;
	if ((s = sfw_record_status(r, err)) != SFW_OK)
		goto done;
	/* decode.tokens: the argmax of the last prefill row, then of each step */
	const struct sfw_record_tensor *pl = sfw_record_find(r, "prefill.logits");
	const struct sfw_record_tensor *dl = sfw_record_find(r, "decode.logits");
	if (!pl || (S > 0 && !dl) || made.n != S + 1) {
		s = sfw_fail(err, SFW_E_INVAL, "the scoring run recorded no logits");
		goto done;
	}
	toks[0] = sfw_sampler_argmax((const float *)pl->data + (size_t)(p->n - 1) * V, V);
	for (int i = 0; i < S; i++)
		toks[i + 1] = sfw_sampler_argmax((const float *)dl->data + (size_t)i * V, V);
	if ((s = sfw_record_put_i32(r, "input_ids", p->ids, (int64_t)p->n, err)) != SFW_OK ||
	    (s = sfw_record_put_i32(r, "decode.tokens", toks, S + 1, err)) != SFW_OK)
		goto done;
	if (S > 0 && (s = sfw_record_put_i32(r, "decode.input_ids", made.ids, S, err)) != SFW_OK)
		goto done;
	*out = r;
	r = NULL;
done:
	sfw_ctx_free(c);
	sfw_record_free(r);
	sfw_free(toks);
	sfw_free(made.ids);
	return s;
}
