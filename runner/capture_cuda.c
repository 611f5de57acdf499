/* capture_cuda.c - decode steps as CUDA graphs (runner/backend_cuda.h): a
 * step is recorded once while its ops run with positions, block tables and
 * cache pointers read from device memory, then replayed. */
#include "runner/backend_cuda.h"
#include "alloc.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Starts recording one decode step of c whose position the ops read from
 * pos (device) when they run, for cache lengths up to bound. */
static enum sfw_status rec_begin(struct sfw_backend *be, struct sfw_bcache *c, const int64_t *pos, int64_t bound,
				 struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	int any_sparse = 0;
	for (int i = 0; i < c->d.n_layers; i++)
		any_sparse |= c->L[i].sparse;
	if (any_sparse) {
		/* everything a recorded step touches is in place before the
		 * recording starts: no allocation (and no host wait) inside it */
		size_t sc, po;
		if (bound < 1 || bound > sfwi_cu_cache_room(c))
			return sfw_fail(err, SFW_E_INVAL, "decode graph bound %lld outside the cache room",
					(long long)bound);
		enum sfw_status s = sfwi_cu_sel_room(be, sfwi_cu_sel_plan_row(&c->d, bound, c->d.sel_k, &sc, &po), err);
		if (s != SFW_OK)
			return s;
	}
	b->rec = 1, b->rec_pos = pos, b->rec_bound = bound;
	sfw_cuda_graph_begin(IMPL(be)->stream);
	return SFW_OK;
}

static void *rec_end(struct sfw_backend *be)
{
	void *g = NULL;
	struct sfw_err e = {0};
	IMPL(be)->rec = 0;
	if (sfw_cuda_graph_end(IMPL(be)->stream, &g, &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "cuda: %s; decoding without graphs", e.msg);
		return NULL;
	}
	return g;
}

/* o: the switches that bring back an older path without a rebuild. */
/* ---- decode steps as graphs ---- */

/* Positions one recording serves: re-recorded every STEP_SPAN tokens, so
 * launches planned for its bound stay close to the real lengths. */
#define STEP_SPAN 4096

/* A context's recording of its decode step (be->step's *rec): valid for
 * positions below bound, in one mode (sparse or dense selection) and while
 * the backend's memory epoch stays epoch. */
struct cu_step {
	int many;     /* 0 (struct cu_bstep: 1) */
	void *graph;
	int64_t bound;
	int sparse;
	uint64_t epoch;
	int64_t *pos; /* device: the position the replay reads */
	int off;      /* a recording failed: steps run directly from now on */
};

static void cu_bstep_free(struct sfw_backend *be, void *rec);

static void cu_step_free(struct sfw_backend *be, void *rec)
{
	struct cu_step *r = rec;
	if (!r)
		return;
	if (r->many) {
		cu_bstep_free(be, rec);
		return;
	}
	if (r->graph) {
		sfw_cuda_sync(IMPL(be)->stream);
		sfw_cuda_graph_free(r->graph);
	}
	if (r->pos)
		be->free(be, r->pos);
	sfw_free(r);
}

/* Makes *recp's recording valid for pos and sparse (recorded now when
 * there is none or it is stale); 0 when the step has to run directly:
 * graphs are off (SALAFW_CUDA_NOGRAPH=1 or PROFILE=1) or a
 * recording could not be made, then or before (r->off). */
static int step_ready(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos, int sparse,
		      sfw_rows_fn fn, void *arg, enum sfw_status *st, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	struct cu_step *r = *recp;
	*st = SFW_OK;
	if (!b->graphs || (r && r->off))
		return 0;
	if (!r) {
		if (!(r = sfw_calloc(1, sizeof(*r))) || !(r->pos = be->alloc(be, sizeof(int64_t)))) {
			sfw_free(r);
			*st = sfw_fail(err, SFW_E_NOMEM, "out of memory for a decode graph");
			return 0;
		}
		*recp = r;
	}
	if (r->graph && (r->sparse != sparse || pos + 1 > r->bound || r->epoch != b->epoch)) {
		sfw_cuda_sync(b->stream);
		sfw_cuda_graph_free(r->graph);
		r->graph = NULL;
	}
	if (r->graph)
		return 1;
	int64_t bound = (pos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN, room = sfwi_cu_cache_room(c);
	struct sfw_err e = {0};
	if (bound > room)
		bound = room;
	if (rec_begin(be, c, r->pos, bound, &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "cuda: %s; decoding without graphs", e.msg);
		r->off = 1;
		return 0;
	}
	enum sfw_status s = fn(arg, 1, &e);
	void *g = rec_end(be);
	if (s != SFW_OK || !g) { /* nothing ran: the step runs directly, from now on */
		if (g)
			sfw_cuda_graph_free(g);
		if (s != SFW_OK)
			sfw_log(SFW_LOG_WARN, "cuda: recording a decode step: %s; decoding without graphs", e.msg);
		r->off = 1;
		return 0;
	}
	r->graph = g;
	r->bound = bound;
	r->sparse = sparse;
	r->epoch = b->epoch;
	b->recordings++;
	return 1;
}

int64_t sfwi_cuda_recordings(const struct sfw_backend *be)
{
	return ((const struct cu_be *)be->impl)->recordings;
}

int64_t sfwi_cuda_seqs_replays(const struct sfw_backend *be)
{
	return ((const struct cu_be *)be->impl)->seqs_replays;
}

/* ---- decode steps of several sequences as graphs (be->step, n >= 2) ----
 * One recording per batch-size bucket (2, 4, 8, 16, 32, 64 rows) in the
 * batch's *rec. The *_seqs ops recorded over the bucket's rows read each
 * replay's sequences from device memory written just before the launch:
 * positions and block tables (struct sfw_cuda_steptab), and every row's
 * cache pointers per layer (sfw_cuda_seqs.sp: one flat table, so a block
 * loads its pointer in one step, not through a chain). Rows past
 * the step's n are padding: the linears run over them (their cost is the
 * weights', not the rows'), the *_seqs kernels skip them. So a recording
 * of dense-mode rows serves any sequences: they join and leave between
 * steps and the bucket's recording still serves. A sequence in selection
 * mode runs its own selection and sparse attention launches, which read
 * the row's position, cache pointers and block table from the same tables
 * (struct sfw_cuda_rowref): a recording serves any sequences whose rows
 * select blocks where its rows did, so sequences in selection mode join
 * and leave too. Only paged caches (a batch's on this backend): a cache
 * of its own may move its buffers. */
#define STEP_SEQS_STABLE 2 /* steps a key runs directly before it is recorded */

#define STEP_BUCKETS 6     /* 2 .. SFW_CUDA_SEQS_MAX rows */

/* What a recording was made for: its rows and which of them select blocks
 * (bit i: row i, whatever sequence sits there). */
struct cu_bkey {
	int rows;
	uint64_t sel;
};

struct cu_bucket {
	void *graph;
	struct cu_bkey key, pend; /* the recording's key; the key of the steps run directly */
	int same;                 /* steps run directly with key pend */
	int64_t bound;
	uint64_t epoch;
};

struct cu_bstep {
	int many; /* 1 */
	struct cu_bucket bk[STEP_BUCKETS];
	struct sfw_cuda_steptab *tab; /* device: the replay's sequences */
	struct sfw_cuda_steptab host;
	void **ptr, **hptr; /* device, host: [layers][SFW_CUDA_LN][rows] (sfw_cuda_seqs.sp) */
	int layers;
	int off;
};

static void cu_bstep_free(struct sfw_backend *be, void *rec)
{
	struct cu_bstep *r = rec;
	for (int i = 0; i < STEP_BUCKETS; i++)
		if (r->bk[i].graph) {
			sfw_cuda_sync(IMPL(be)->stream);
			sfw_cuda_graph_free(r->bk[i].graph);
		}
	if (r->tab)
		be->free(be, r->tab);
	if (r->ptr)
		be->free(be, r->ptr);
	sfw_free(r->hptr);
	sfw_free(r);
}

/* Every sequence's caches as a recorded step expects them before its
 * token: paged, pos[i] tokens in, the compressed keys made up to them, and
 * room for the token. */
static int bstep_current(struct sfw_bcache *const *caches, const int64_t *pos, int n)
{
	for (int i = 0; i < n; i++) {
		const struct sfw_bcache *c = caches[i];
		const struct sfw_cache_desc *d = &c->d;
		if (!c->table || c->pg.shift != caches[0]->pg.shift)
			return 0;
		for (int li = 0; li < d->n_layers; li++) {
			const struct cu_layer *l = &c->L[li];
			if (l->sparse && (l->len != pos[i] || l->len + 1 > l->cap || l->n1 != sfwi_cu_nchunks(l->len, d->ksize, d->stride) ||
					  l->n2 != sfwi_cu_nchunks(l->len, 4 * d->ksize, 4 * d->stride)))
				return 0;
		}
	}
	return 1;
}

/* The bucket of n rows: the smallest power of two >= n, at most max_rows
 * (then max_rows itself, >= n). */
static int bucket_of(int n, int max_rows, int *idx)
{
	int rows = 2, i = 0;
	while (rows < n)
		rows *= 2, i++;
	if (rows > max_rows)
		rows = max_rows;
	*idx = i;
	return rows;
}

static void bkey_make(struct cu_bkey *k, int rows, const int *sparse, int n)
{
	memset(k, 0, sizeof(*k));
	k->rows = rows;
	for (int i = 0; i < n; i++)
		if (sparse[i])
			k->sel |= (uint64_t)1 << i;
}

static int bkey_eq(const struct cu_bkey *a, const struct cu_bkey *b)
{
	return a->rows == b->rows && a->sel == b->sel;
}

static enum sfw_status cu_step_seqs(struct sfw_backend *be, void **recp, struct sfw_bcache *const *caches,
				    const int64_t *pos, const int *sparse, int n, int max_rows, sfw_rows_fn fn,
				    void *arg, int *replayed, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	struct cu_bstep *r = *recp;
	*replayed = 0;
	if (!b->graphs || n < 2 || n > SFW_CUDA_SEQS_MAX || max_rows < n || (r && r->off))
		return fn(arg, n, err);
	if (!r) {
		int L = caches[0]->d.n_layers;
		size_t pb = (size_t)L * SFW_CUDA_LN * SFW_CUDA_SEQS_MAX * sizeof(void *);
		if (!(r = sfw_calloc(1, sizeof(*r))))
			return fn(arg, n, err); /* no recording, the step all the same */
		r->many = 1, r->layers = L;
		*recp = r;
		if (!(r->tab = be->alloc(be, sizeof(*r->tab))) || !(r->ptr = be->alloc(be, pb)) || !(r->hptr = sfw_malloc(pb))) {
			r->off = 1;
			return fn(arg, n, err);
		}
	}
	if (!bstep_current(caches, pos, n))
		return fn(arg, n, err);
	int64_t maxpos = 0, room = INT64_MAX;
	for (int i = 0; i < n; i++) {
		maxpos = pos[i] > maxpos ? pos[i] : maxpos;
		int64_t rm = sfwi_cu_cache_room(caches[i]);
		room = rm < room ? rm : room;
	}
	int bi;
	int rows = bucket_of(n, max_rows, &bi);
	struct cu_bucket *k = &r->bk[bi];
	struct cu_bkey key;
	bkey_make(&key, rows, sparse, n);
	int match = k->graph && bkey_eq(&k->key, &key);
	if (!match || maxpos + 1 > k->bound || k->epoch != b->epoch) {
		/* a new key runs directly until it has held for STEP_SEQS_STABLE
		 * steps; the recording's own key past its bound (or after the
		 * memory moved) is recorded again at once */
		if (!match) {
			if (!bkey_eq(&k->pend, &key))
				k->pend = key, k->same = 0;
			if (++k->same <= STEP_SEQS_STABLE)
				return fn(arg, n, err);
		}
		int64_t bound = (maxpos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN;
		if (bound > room)
			bound = room;
		if (bound < maxpos + 1)
			return fn(arg, n, err);
		if (k->graph) {
			sfw_cuda_sync(b->stream);
			sfw_cuda_graph_free(k->graph);
			k->graph = NULL;
		}
		struct sfw_err e = {0};
		enum sfw_status s = SFW_OK;
		if (key.sel) { /* the selection scratch in place before the recording */
			size_t sc, po;
			s = sfwi_cu_sel_room(be, sfwi_cu_sel_plan_row(&caches[0]->d, bound, caches[0]->d.sel_k, &sc, &po), &e);
		}
		void *g = NULL;
		struct sfw_err ge = {0};
		enum sfw_status gs = SFW_OK;
		if (s == SFW_OK) {
			b->rec_seqs = 1, b->rec_tab = r->tab, b->rec_ptr = r->ptr, b->rec_rows = rows, b->rec_bound = bound;
			b->rec_fail = 0, b->rec_caches = caches, b->rec_n = n;
			sfw_cuda_graph_begin(IMPL(be)->stream);
			s = fn(arg, rows, &e);
			b->rec_seqs = 0, b->rec_tab = NULL, b->rec_ptr = NULL, b->rec_caches = NULL, b->rec_n = 0;
			gs = sfw_cuda_graph_end(IMPL(be)->stream, &g, &ge);
		}
		if (s != SFW_OK || gs != SFW_OK || b->rec_fail) {
			/* nothing ran: the step runs directly, and so do the next ones */
			if (g)
				sfw_cuda_graph_free(g);
			if (s != SFW_OK || gs != SFW_OK)
				sfw_log(SFW_LOG_WARN, "cuda: recording a step of %d rows: %s; batched steps without graphs",
					rows, s != SFW_OK ? e.msg : ge.msg);
			else /* a model whose q/k norms and RoPE have no batched kernel */
				sfw_log(SFW_LOG_DEBUG, "cuda: a step of %d rows cannot be recorded here", rows);
			r->off = 1;
			return fn(arg, n, err);
		}
		k->graph = g, k->key = key, k->bound = bound, k->epoch = b->epoch;
		b->recordings++;
	}
	struct sfw_cuda_steptab *t = &r->host;
	t->n = n, t->shift = caches[0]->pg.shift;
	for (int i = 0; i < rows; i++) {
		t->pos[i] = i < n ? pos[i] : 0;
		t->tab[i] = i < n ? caches[i]->pg.tab : NULL;
	}
	size_t np = (size_t)r->layers * SFW_CUDA_LN * (size_t)rows;
	memset(r->hptr, 0, np * sizeof(void *)); /* padding rows: NULL */
	for (int li = 0; li < r->layers; li++)
		for (int i = 0; i < n; i++) {
			const struct cu_layer *l = &caches[i]->L[li];
			void **e = r->hptr + (size_t)li * SFW_CUDA_LN * rows + i;
			if (!l->sparse) {
				e[SFW_CUDA_LSTATE * rows] = l->state;
				continue;
			}
			e[SFW_CUDA_LK * rows] = l->k, e[SFW_CUDA_LV * rows] = l->v;
			e[SFW_CUDA_LC1 * rows] = l->c1, e[SFW_CUDA_LC2 * rows] = l->c2;
			if (!sparse[i])
				e[SFW_CUDA_LAK * rows] = l->k, e[SFW_CUDA_LAV * rows] = l->v;
		}
	/* staged before they return, ordered after the replay before (which reads them) */
	sfw_be_from_host(be, r->tab, t, sizeof(*t));
	sfw_be_from_host(be, r->ptr, r->hptr, np * sizeof(void *));
	sfw_cuda_graph_launch(k->graph, IMPL(be)->stream);
	for (int i = 0; i < n; i++)
		sfwi_cu_cache_advance(caches[i], 1);
	b->seqs_replays++;
	*replayed = 1;
	return SFW_OK;
}

/* Replays the step's recording (step_ready), or runs fn directly. */
static enum sfw_status cu_step(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos, int sparse,
			       sfw_rows_fn fn, void *arg, int *replayed, struct sfw_err *err)
{
	enum sfw_status s;
	*replayed = 0;
	if (!step_ready(be, recp, c, pos, sparse, fn, arg, &s, err))
		return s != SFW_OK ? s : fn(arg, 1, err);
	struct cu_step *r = *recp;
	/* a paged cache's recording reaches its whole table: the block of pos must be taken */
	SFW_ASSERT(!c->table || pos < c->nblk * c->d.block);
	sfw_be_from_host(be, r->pos, &pos, sizeof(pos));
	sfw_cuda_graph_launch(r->graph, IMPL(be)->stream);
	sfwi_cu_cache_advance(c, 1);
	*replayed = 1;
	return SFW_OK;
}

/* The recording only; the replay's position is written by the step. */
static enum sfw_status cu_step_record(struct sfw_backend *be, void **recp, struct sfw_bcache *c, int64_t pos,
				      int sparse, sfw_rows_fn fn, void *arg, struct sfw_err *err)
{
	enum sfw_status s;
	step_ready(be, recp, c, pos, sparse, fn, arg, &s, err);
	return s;
}

/* be->step: a context's step (one sequence), its recording made ahead,
 * or a step of several sequences. */
static enum sfw_status cu_step_any(struct sfw_backend *be, struct sfw_step *st, struct sfw_err *err)
{
	st->replayed = 0;
	if (st->record_only) {
		SFW_ASSERT(st->n == 1);
		return cu_step_record(be, st->rec, st->caches[0], st->pos[0], st->sparse[0], st->fn, st->arg, err);
	}
	if (st->n == 1)
		return cu_step(be, st->rec, st->caches[0], st->pos[0], st->sparse[0], st->fn, st->arg, &st->replayed, err);
	return cu_step_seqs(be, st->rec, st->caches, st->pos, st->sparse, st->n, st->max_rows, st->fn, st->arg,
			    &st->replayed, err);
}

void sfwi_cu_capture(struct sfw_backend *be)
{
	be->step = cu_step_any;
	be->step_free = cu_step_free;
}
