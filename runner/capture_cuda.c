/* capture_cuda.c - decode steps as CUDA graphs (runner/backend_cuda.h),
 * the backend's business: runner/forward.c brackets each step's ops
 * (be->step, begin and end) and knows nothing of this. At a decode step's
 * begin the backend decides how its ops are taken: run as they come,
 * recorded (with positions, block tables and cache pointers read from
 * device memory, so the recording serves later steps) and launched at its
 * end, or skipped because a recording of the same step exists, which is
 * launched at once (the device runs it while the host walks the skipped
 * ops). */
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

/* ---- a context's decode step: one sequence ---- */

static void one_launch(struct sfw_backend *be, struct cu_step *r, struct sfw_bcache *c, int64_t pos)
{
	/* a paged cache's recording reaches its whole table: the block of pos must be taken */
	SFW_ASSERT(!c->table || pos < c->nblk * c->d.block);
	sfw_be_from_host(be, r->pos, &pos, sizeof(pos));
	sfw_cuda_graph_launch(r->graph, IMPL(be)->stream);
}

/* A context's decode step (one sequence): replayed when its recording is
 * valid for pos and sparse, else recorded now (graphs off:
 * SALAFW_CUDA_NOGRAPH=1 or PROFILE=1, or a recording that could not be
 * made, then or before: r->off, run as it comes). */
static enum sfw_status one_begin(struct sfw_backend *be, struct sfw_step *st, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	struct cu_step *r = *st->state;
	struct sfw_bcache *c = st->caches[0];
	int64_t pos = st->pos[0];
	if (r && r->many) /* the state of steps of several sequences: not this kind */
		return SFW_OK;
	if (!r) {
		if (!(r = sfw_calloc(1, sizeof(*r))) || !(r->pos = be->alloc(be, sizeof(int64_t)))) {
			sfw_free(r);
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for a decode graph");
		}
		*st->state = r;
	}
	if (r->off)
		return SFW_OK;
	if (r->graph && (r->sparse != st->sparse[0] || pos + 1 > r->bound || r->epoch != b->epoch)) {
		sfw_cuda_sync(b->stream);
		sfw_cuda_graph_free(r->graph);
		r->graph = NULL;
	}
	b->cap_rec = r;
	if (r->graph) { /* launched now: the device runs it while the host skips the step's ops */
		one_launch(be, r, c, pos);
		b->cap = CAP_REPLAY, b->skip = 1;
		return SFW_OK;
	}
	int64_t bound = (pos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN, room = sfwi_cu_cache_room(c);
	struct sfw_err e = {0};
	if (bound > room)
		bound = room;
	if (rec_begin(be, c, r->pos, bound, &e) != SFW_OK) {
		sfw_log(SFW_LOG_WARN, "cuda: %s; decoding without graphs", e.msg);
		r->off = 1;
		return SFW_OK;
	}
	r->bound = bound, r->sparse = st->sparse[0];
	b->cap = CAP_RECORD;
	return SFW_OK;
}

static void one_end(struct sfw_backend *be, struct sfw_step *st)
{
	struct cu_be *b = IMPL(be);
	struct cu_step *r = b->cap_rec;
	if (b->cap == CAP_RECORD) {
		void *g = rec_end(be);
		if (st->failed || !g) { /* nothing ran: the step runs as it comes, from now on */
			if (g)
				sfw_cuda_graph_free(g);
			r->off = 1;
			st->again = !st->failed;
			return;
		}
		r->graph = g, r->epoch = b->epoch;
		b->recordings++;
		one_launch(be, r, st->caches[0], st->pos[0]);
	}
	sfwi_cu_cache_advance(st->caches[0], 1);
	st->replayed = 1;
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
			if (l->sparse && (l->len != pos[i] || l->len + 1 > l->cap || l->n1 != sfw_nchunks(l->len, d->ksize, d->stride) ||
					  l->n2 != sfw_nchunks(l->len, 4 * d->ksize, 4 * d->stride)))
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


/* The device tables a recording of several sequences reads (struct
 * sfw_cuda_steptab and the pointer table), written for this step's
 * sequences; padding rows: position 0, NULL pointers. Staged before they
 * return, ordered after the launch before (which reads them). */
static void seqs_tables(struct sfw_backend *be, struct cu_bstep *r, const struct sfw_step *st, int rows)
{
	struct sfw_cuda_steptab *t = &r->host;
	int n = st->n;
	t->n = n, t->shift = st->caches[0]->pg.shift;
	for (int i = 0; i < rows; i++) {
		t->pos[i] = i < n ? st->pos[i] : 0;
		t->row[i] = i;
		t->tab[i] = i < n ? st->caches[i]->pg.tab : NULL;
	}
	size_t np = (size_t)r->layers * SFW_CUDA_LN * (size_t)rows;
	memset(r->hptr, 0, np * sizeof(void *));
	for (int li = 0; li < r->layers; li++)
		for (int i = 0; i < n; i++) {
			const struct cu_layer *l = &st->caches[i]->L[li];
			void **e = r->hptr + (size_t)li * SFW_CUDA_LN * rows + i;
			if (!l->sparse) {
				e[SFW_CUDA_LSTATE * rows] = l->state;
				continue;
			}
			e[SFW_CUDA_LK * rows] = l->k, e[SFW_CUDA_LV * rows] = l->v;
			e[SFW_CUDA_LC1 * rows] = l->c1, e[SFW_CUDA_LC2 * rows] = l->c2;
			if (!st->sparse[i])
				e[SFW_CUDA_LAK * rows] = l->k, e[SFW_CUDA_LAV * rows] = l->v;
		}
	sfw_be_from_host(be, r->tab, t, sizeof(*t));
	sfw_be_from_host(be, r->ptr, r->hptr, np * sizeof(void *));
}

/* The batch's state for steps of several sequences, made on first use;
 * NULL when it cannot be (the step runs as it comes). */
static struct cu_bstep *seqs_state(struct sfw_backend *be, struct sfw_step *st)
{
	struct cu_bstep *r = *st->state;
	if (r)
		return r->many && !r->off ? r : NULL;
	int L = st->caches[0]->d.n_layers;
	size_t pb = (size_t)L * SFW_CUDA_LN * SFW_CUDA_SEQS_MAX * sizeof(void *);
	if (!(r = sfw_calloc(1, sizeof(*r))))
		return NULL;
	r->many = 1, r->layers = L;
	*st->state = r;
	if (!(r->tab = be->alloc(be, sizeof(*r->tab))) || !(r->ptr = be->alloc(be, pb)) || !(r->hptr = sfw_malloc(pb))) {
		r->off = 1;
		return NULL;
	}
	return r;
}

/* A step of n >= 2 decode rows: replayed from its bucket's recording when
 * that holds for the step's key and lengths; recorded when the key has held
 * for STEP_SEQS_STABLE steps run as they came (at once when the bucket's
 * own key went past its bound or the memory moved); else run as it comes. */
static enum sfw_status seqs_begin(struct sfw_backend *be, struct sfw_step *st, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	int n = st->n;
	if (n > SFW_CUDA_SEQS_MAX || st->max_rows < n)
		return SFW_OK;
	struct cu_bstep *r = seqs_state(be, st);
	if (!r || !bstep_current(st->caches, st->pos, n))
		return SFW_OK;
	int64_t maxpos = 0, room = INT64_MAX;
	for (int i = 0; i < n; i++) {
		maxpos = st->pos[i] > maxpos ? st->pos[i] : maxpos;
		int64_t rm = sfwi_cu_cache_room(st->caches[i]);
		room = rm < room ? rm : room;
	}
	int bi;
	int rows = bucket_of(n, st->max_rows, &bi);
	struct cu_bucket *k = &r->bk[bi];
	struct cu_bkey key;
	bkey_make(&key, rows, st->sparse, n);
	int match = k->graph && bkey_eq(&k->key, &key);
	b->cap_rec = r, b->cap_bk = bi;
	if (match && maxpos + 1 <= k->bound && k->epoch == b->epoch) {
		/* launched now: the device runs it while the host skips the step's ops */
		seqs_tables(be, r, st, rows);
		sfw_cuda_graph_launch(k->graph, b->stream);
		b->cap = CAP_REPLAY, b->skip = 1, st->rows = rows;
		return SFW_OK;
	}
	if (!match) {
		if (!bkey_eq(&k->pend, &key))
			k->pend = key, k->same = 0;
		if (++k->same <= STEP_SEQS_STABLE)
			return SFW_OK;
	}
	int64_t bound = (maxpos + 1 + STEP_SPAN - 1) / STEP_SPAN * STEP_SPAN;
	if (bound > room)
		bound = room;
	if (bound < maxpos + 1)
		return SFW_OK;
	if (k->graph) {
		sfw_cuda_sync(b->stream);
		sfw_cuda_graph_free(k->graph);
		k->graph = NULL;
	}
	if (key.sel) { /* the selection scratch in place before the recording */
		size_t sc, po;
		enum sfw_status s =
			sfwi_cu_sel_room(be, sfwi_cu_sel_plan_row(&st->caches[0]->d, bound, st->caches[0]->d.sel_k, &sc, &po), err);
		if (s != SFW_OK)
			return s;
	}
	b->rec_seqs = 1, b->rec_tab = r->tab, b->rec_ptr = r->ptr, b->rec_rows = rows, b->rec_bound = bound;
	b->rec_fail = 0, b->rec_caches = st->caches, b->rec_n = n;
	k->key = key, k->bound = bound;
	b->cap = CAP_RECORD, st->rows = rows;
	sfw_cuda_graph_begin(b->stream);
	return SFW_OK;
}

static void seqs_end(struct sfw_backend *be, struct sfw_step *st)
{
	struct cu_be *b = IMPL(be);
	struct cu_bstep *r = b->cap_rec;
	struct cu_bucket *k = &r->bk[b->cap_bk];
	if (b->cap == CAP_RECORD) {
		void *g = NULL;
		struct sfw_err ge = {0};
		enum sfw_status gs = sfw_cuda_graph_end(b->stream, &g, &ge);
		int fail = b->rec_fail;
		b->rec_seqs = 0, b->rec_tab = NULL, b->rec_ptr = NULL, b->rec_caches = NULL, b->rec_n = 0;
		if (st->failed || gs != SFW_OK || fail) {
			/* nothing ran: the step runs as it comes, and so do the next ones */
			if (g)
				sfw_cuda_graph_free(g);
			if (gs != SFW_OK)
				sfw_log(SFW_LOG_WARN, "cuda: recording a step of %d rows: %s; batched steps without graphs",
					k->key.rows, ge.msg);
			else if (fail) /* a model whose q/k norms and RoPE have no batched kernel */
				sfw_log(SFW_LOG_DEBUG, "cuda: a step of %d rows cannot be recorded here", k->key.rows);
			r->off = 1;
			st->again = !st->failed;
			return;
		}
		k->graph = g, k->epoch = b->epoch;
		b->recordings++;
		seqs_tables(be, r, st, k->key.rows);
		sfw_cuda_graph_launch(k->graph, b->stream);
	}
	for (int i = 0; i < st->n; i++)
		sfwi_cu_cache_advance(st->caches[i], 1);
	b->seqs_replays++;
	st->replayed = 1;
}

/* be->step */
static enum sfw_status cu_step(struct sfw_backend *be, struct sfw_step *st, int end, struct sfw_err *err)
{
	struct cu_be *b = IMPL(be);
	if (!end) {
		b->cap = CAP_DIRECT, b->skip = 0, b->cap_rec = NULL;
		if (!st->decode || !b->graphs || !st->state)
			return SFW_OK;
		return st->n == 1 ? one_begin(be, st, err) : seqs_begin(be, st, err);
	}
	b->skip = 0;
	if (b->cap != CAP_DIRECT && st->n == 1)
		one_end(be, st);
	else if (b->cap != CAP_DIRECT)
		seqs_end(be, st);
	b->cap = CAP_DIRECT, b->cap_rec = NULL;
	return SFW_OK;
}

void sfwi_cu_capture(struct sfw_backend *be)
{
	be->step = cu_step;
	be->step_free = cu_step_free;
}
