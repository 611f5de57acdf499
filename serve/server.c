/* server.c - the HTTP side (libmicrohttpd, a thread per connection) and the
 * engine thread (continuous batching over runner/batch.h) of serve.h.
 *
 * A request is shared by its connection thread and the engine: one lock
 * (srv->mu) guards the queue, every request's output and flags and the
 * metrics; a request is freed when both have dropped it (refs). The engine
 * alone touches the batch, the samplers and the output streams.
 *
 * An accepted request counts (srv->active) from its admission until
 * libmicrohttpd's completion callback says its reply has been sent, so the
 * drain stops the daemon only after the last reply went out. Every open
 * connection has a slot (MHD_OPTION_NOTIFY_CONNECTION) saying whether it is
 * waiting for a request or being answered; a watchdog thread closes the
 * ones that take longer than receive_timeout to send their request. */
#include "serve/serve.h"
#include "alloc.h"
#include "buf.h"
#include "checked.h"
#include "json.h"
#include "log.h"
#include "runner/batch.h"
#include "runner/prefix.h"
#include "runner/runner.h"
#include "runner/sampler.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#define OUT_MAX (64u << 20) /* generated text bytes per request */
#define WAIT_SLICE_MS 50    /* a waiting connection looks for a hang-up this often */
#define MAX_SEQS SFW_BATCH_MAX_SEQS
#define CONN_RESERVE 32	      /* connections beyond the accepted requests and the waiting ones */
#define ABORT_SEND_S 5.0      /* sfw_serve_abort waits this long for the ended requests' answers */
#define TOK_BUDGET (1u << 20) /* prompt text bytes tokenized at once, over all requests */
/* A JSON body holds a text byte in at most 6 bytes (\u0001), and besides the
 * texts at most this much (the fields, 4096 messages' framing). */
#define BODY_TEXT_X 6
#define BODY_FRAME (512u << 10)
#define ABORT_MSG "the server is shutting down: the request was ended before it finished"

/* ---- metrics ------------------------------------------------------------------ */

static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define NB_TTFT (sizeof(ttft_bounds) / sizeof(ttft_bounds[0]))
#define NB_ITL (sizeof(itl_bounds) / sizeof(itl_bounds[0]))

struct hist {
	uint64_t count, bucket[16]; /* bucket[i]: observations <= bound i (cumulative when printed) */
	double sum;
};

static void hist_add(struct hist *h, const double *bounds, size_t nb, double v)
{
	size_t i = 0;
	while (i < nb && v > bounds[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum += v;
}

enum route {
	R_NONE,
	R_HEALTH,
	R_METRICS,
	R_MODELS,
	R_COMPLETIONS,
	R_CHAT,
	R_MODEL, /* /v1/models/{id} */
	R_TOKENIZE,
	R_DETOKENIZE,
	R__COUNT
};
static const char *const route_path[R__COUNT] = {"other",	    "/health",	       "/metrics",
						 "/v1/models",	    "/v1/completions", "/v1/chat/completions",
						 "/v1/models/{id}", "/tokenize",       "/detokenize"};
static const int codes[] = {200, 204, 400, 401, 404, 405, 413, 429, 500, 501, 503};
#define N_CODES (sizeof(codes) / sizeof(codes[0]))

struct metrics {
	uint64_t requests[R__COUNT][N_CODES];
	uint64_t prompt_tokens, gen_tokens, cancelled, failed, steps;
	uint64_t prefilled, forks; /* prompt tokens the steps prefilled; choices that took a fork instead */
	double step_s; /* inside sfw_batch_step */
	double host_s; /* the engine thread's own work around the steps (not its waits for requests) */
	/* the steps of decode rows only (no prompt chunk): how many, their rows,
	 * and their time, the engine thread's own work around them included */
	uint64_t dsteps, drows;
	double dstep_s;
	struct hist ttft, itl;
	struct sfw_prefix_stats pcs; /* the prefix cache's, copied under the lock (engine thread) */
};

/* ---- requests ------------------------------------------------------------------ */

/* One token's logprobs, as the sampler reported them. */
struct lprec {
	struct sfw_sample_lp lp;
	int32_t id;
};

struct req {
	struct sfw_server *srv;
	int refs; /* the connection and the engine */
	/* the request's choices (n): one struct req each, one sequence each
	 * (the others' forks of the lead's after its prompt: wait_fork);
	 * choice 0 (the lead) holds the connection, the others point to it */
	struct req *lead;
	struct req *ch[SFW_SERVE_N_MAX];
	int n_ch, index;
	char idstr[48]; /* the response's id, random */
	char *forced;	/* the reply's forced start (tool_choice), the prompt's end */
	size_t n_forced;
	int tools; /* the reply is parsed for tool calls */
	/* penalties (engine side): entries of the ids seen, slot[id] its entry */
	struct sfw_sample_adj *adj;
	int n_adj, cap_adj;
	int32_t *slot;
	struct sfw_sample_lp lp; /* the step's logprobs (when asked) */
	struct sfw_serve_req p;
	int32_t *ids; /* the prompt */
	size_t n_ids;
	struct sfw_gen_params gp;
	struct sfw_sampler smp;
	int smp_ok;
	uint64_t id; /* for the response's "id" */
	long long created;
	double t_arrive, t_last;
	struct req *next; /* in the queue */
	/* engine side */
	int seq; /* -1: none */
	size_t prefilled;
	size_t cached; /* prompt tokens the prefix cache gave (runner/prefix.h) */
	/* a choice after the first (n > 1) waiting in the queue for a fork of
	 * the lead's sequence once the lead has prefilled the prompt (the
	 * choices share one prefill); meanwhile the lead holds a reference to
	 * it, in wait[] (the lead's: the choices waiting, n_wait of them), dropped
	 * when the wait ends (fork_wait_end_locked). The lead reads its choices
	 * through wait[] only: one whose wait has ended may be freed. */
	int wait_fork;
	struct req *wait[SFW_SERVE_N_MAX];
	int n_wait;
	int32_t next_id; /* the token to feed next */
	/* the tokens chosen so far, for the prefix cache's state at the end of
	 * the generation (keep_reply); lost: one could not be kept */
	int32_t *gen;
	size_t n_gen, cap_gen;
	int gen_lost;
	struct sfw_gen_stream gs;
	int gs_ok;
	int64_t made;
	/* shared (srv->mu) */
	pthread_cond_t cv;
	struct sfw_buf out; /* text made, not yet taken by the connection */
	size_t *cuts;	    /* stream: where each piece in out ends */
	size_t ncuts, capcuts;
	size_t *cut_lps;   /* stream: the logprob records made up to each cut */
	struct lprec *lps; /* logprobs of the tokens made, not yet taken */
	size_t nlps, caplps;
	double t_first; /* the first token's time (0: none yet) */
	int done;      /* the engine is through with it */
	int cancelled; /* the client went away */
	int aborted;   /* sfw_serve_abort ended it */
	int http11;    /* the request came as HTTP/1.1 (an interim 1xx may be sent) */
	int probed;    /* the client sent FIN: a 1xx or an SSE comment went out to tell a close */
	enum sfw_finish finish;
	int64_t completion_tokens;
	char error[256]; /* set when it failed on the engine side */
	/* connection side (stream) */
	struct MHD_Connection *conn;
	struct sfw_buf sse; /* bytes formatted, not yet handed to MHD */
	/* the reader's own: the text and cuts it took out of out/cuts under the
	 * lock, made into events outside it (swapped back, emptied, next time) */
	struct sfw_buf taken;
	size_t *taken_cuts, taken_cap;
	size_t *taken_cut_lps;
	struct lprec *taken_lps;
	size_t taken_caplps;
	int sent_role, sent_final, sent_done;
	/* the connection's: tool calls parsed from the reply */
	struct sfw_toolparse *tp;
	int n_calls;
	int64_t text_offset; /* completions' logprobs: bytes of text before the next token */
};

/* A step's sampled token of one request, pushed through its stream. */
struct took {
	struct req *r;
	int32_t id;
	struct sfw_sample_lp lp;
	enum sfw_status st, st2; /* the push; the flush at the end (SFW_OK when none) */
	enum sfw_finish fin;
	size_t a, n, a2, n2; /* the texts, in the step's text buffer */
	struct sfw_err err;
};

struct sfw_server {
	struct sfw_model *m;
	const struct sfw_tokenizer *tok;
	struct sfw_eos_set eos, no_eos; /* the model's; none (ignore_eos) */
	struct sfw_serve_params p;
	char names[SFW_SERVE_NAMES_MAX][256];
	const char *name_ptr[SFW_SERVE_NAMES_MAX];
	char origins[4096];
	long long created;
	uint64_t unknown_hash[64]; /* ignored field names already logged (hashes) */
	int n_unknown;
	int vocab;
	int have_key;
	unsigned char key_hash[crypto_hash_sha256_BYTES];
	struct MHD_Daemon *d;
	struct sfw_batch *b;
	struct sfw_prefix *pc; /* the prefix cache; NULL: off */
	pthread_t engine;
	int engine_started;
	pthread_mutex_t mu;
	pthread_cond_t engine_cv, idle_cv;
	struct req *qhead, *qtail;
	int nqueue, nrun;
	int active; /* accepted requests whose reply has not been sent yet */
	int draining, aborting, quit;
	/* connections (struct slot): waiting for a request, being answered */
	struct slot *slots;
	int n_recv, n_busy;
	pthread_t watch;
	int watch_started, watch_quit;
	pthread_cond_t watch_cv;
	/* the cheap bounds of a request: body bytes, prompt text bytes */
	size_t body_max, text_max;
	size_t tok_bytes; /* text bytes being tokenized now (TOK_BUDGET) */
	pthread_cond_t tok_cv;
	uint64_t next_id;
	struct metrics mt;
	struct req *run[MAX_SEQS];
	/* the engine thread's: a step's tokens and their texts (take_tokens) */
	struct took took[MAX_SEQS];
	struct sfw_buf step_text;
};


/* Drops one reference under srv->mu; frees the request at zero. */
static void req_unref_locked(struct req *r)
{
	if (--r->refs > 0)
		return;
	if (r->lead && r->lead != r) /* a choice holds its lead (the request's strings) */
		req_unref_locked(r->lead);
	sfw_serve_req_release(&r->p);
	sfw_free(r->ids);
	if (r->smp_ok)
		sfw_sampler_release(&r->smp);
	if (r->gs_ok)
		sfw_gen_stream_release(&r->gs);
	sfw_buf_release(&r->out);
	sfw_free(r->cuts);
	sfw_buf_release(&r->taken);
	sfw_free(r->taken_cuts);
	sfw_buf_release(&r->sse);
	sfw_free(r->adj);
	sfw_free(r->gen);
	sfw_free(r->slot);
	sfw_free(r->cut_lps);
	sfw_free(r->lps);
	sfw_free(r->taken_cut_lps);
	sfw_free(r->taken_lps);
	sfw_toolparse_free(r->tp);
	sfw_free(r->forced);
	pthread_cond_destroy(&r->cv);
	sfw_free(r);
}

/* ---- the engine ------------------------------------------------------------------- */

/* Takes *pp (after prev; NULL: at the head) out of the queue (srv->mu held). */
static void queue_take_locked(struct sfw_server *s, struct req **pp, struct req *prev)
{
	struct req *r = *pp;
	*pp = r->next;
	if (s->qtail == r)
		s->qtail = prev;
	r->next = NULL;
	s->nqueue--;
}

/* Takes r out of the queue, wherever it is (srv->mu held). */
static void queue_remove_locked(struct sfw_server *s, struct req *r)
{
	struct req **pp = &s->qhead, *prev = NULL;
	while (*pp && *pp != r)
		prev = *pp, pp = &(*pp)->next;
	if (*pp)
		queue_take_locked(s, pp, prev);
}

/* Choice c waits for a fork no longer (srv->mu held): the lead's reference
 * to it dropped. */
static void fork_wait_end_locked(struct req *c)
{
	c->wait_fork = 0;
	req_unref_locked(c);
}

static void retire_locked(struct sfw_server *s, struct req *r, enum sfw_finish fin, const char *error);

/* Lead l leaves before its prompt was prefilled (srv->mu held): its choices
 * still waiting for a fork prefill the prompt themselves (as without
 * forks), or, when l failed, fail with it. */
static void end_fork_waits_locked(struct sfw_server *s, struct req *l, const char *error)
{
	int n = l->n_wait;
	l->n_wait = 0;
	for (int i = 0; i < n; i++) {
		struct req *c = l->wait[i];
		if (error && !c->done) {
			queue_remove_locked(s, c);
			c->aborted = l->aborted; /* sfw_serve_abort's, as the lead's */
			retire_locked(s, c, SFW_FINISH_NONE, error);
		}
		fork_wait_end_locked(c);
	}
}

/* The engine is through with r (srv->mu held): its sequence is closed, the
 * connection is told, the engine's reference dropped. */
static void retire_locked(struct sfw_server *s, struct req *r, enum sfw_finish fin, const char *error)
{
	end_fork_waits_locked(s, r, error);
	if (r->seq >= 0) {
		sfw_batch_seq_close(s->b, r->seq);
		r->seq = -1;
	}
	for (int i = 0; i < s->nrun; i++)
		if (s->run[i] == r) {
			memmove(s->run + i, s->run + i + 1, (size_t)(s->nrun - i - 1) * sizeof(s->run[0]));
			s->nrun--;
			break;
		}
	r->finish = fin;
	r->completion_tokens = r->gs_ok ? r->gs.tokens : 0;
	if (error && !r->error[0])
		snprintf(r->error, sizeof(r->error), "%s", error);
	if (error)
		s->mt.failed++;
	if (fin == SFW_FINISH_CANCEL && r->cancelled)
		s->mt.cancelled++;
	r->done = 1;
	pthread_cond_broadcast(&r->lead->cv);
	req_unref_locked(r);
}

/* Appends text made for r (srv->mu held); a failure to keep it fails r. */
static int put_text_locked(struct req *r, const char *t, size_t n)
{
	if (n && sfw_buf_append(&r->out, t, n) != SFW_OK) {
		snprintf(r->error, sizeof(r->error), "the reply is longer than %u MiB", OUT_MAX >> 20);
		return 0;
	}
	if (n && r->lead->p.stream) { /* where the piece ends: one event per piece */
		if (r->ncuts == r->capcuts) {
			size_t cap = r->capcuts ? 2 * r->capcuts : 16;
			size_t *c = sfw_realloc(r->cuts, cap * sizeof(*c));
			size_t *cl = c ? sfw_realloc(r->cut_lps, cap * sizeof(*cl)) : NULL;
			if (c)
				r->cuts = c;
			if (cl)
				r->cut_lps = cl;
			if (!c || !cl) {
				snprintf(r->error, sizeof(r->error), "out of memory for the stream");
				return 0;
			}
			r->capcuts = cap;
		}
		r->cut_lps[r->ncuts] = r->nlps;
		r->cuts[r->ncuts++] = r->out.len;
	}
	if (n)
		pthread_cond_broadcast(&r->lead->cv);
	return 1;
}

/* Keeps a token's logprobs for the connection (srv->mu held). */
static int put_lp_locked(struct req *r, int32_t id, const struct sfw_sample_lp *lp)
{
	if (r->nlps == r->caplps) {
		size_t cap = r->caplps ? 2 * r->caplps : 16;
		struct lprec *l = sfw_realloc(r->lps, cap * sizeof(*l));
		if (!l) {
			snprintf(r->error, sizeof(r->error), "out of memory for the logprobs");
			return 0;
		}
		r->lps = l;
		r->caplps = cap;
	}
	r->lps[r->nlps].lp = *lp;
	r->lps[r->nlps++].id = id;
	return 1;
}

/* The penalties' entry of id (engine thread): found through slot, or added. */
static struct sfw_sample_adj *adj_of(struct req *r, int32_t id)
{
	if (r->slot[id] >= 0)
		return &r->adj[r->slot[id]];
	if (r->n_adj == r->cap_adj) {
		int cap = r->cap_adj ? 2 * r->cap_adj : 64;
		struct sfw_sample_adj *a = sfw_realloc(r->adj, (size_t)cap * sizeof(*a));
		if (!a)
			return NULL;
		r->adj = a;
		r->cap_adj = cap;
	}
	r->slot[id] = r->n_adj;
	r->adj[r->n_adj] = (struct sfw_sample_adj){id, 0, 0, 0};
	return &r->adj[r->n_adj++];
}

/* The prefix cache keeps the state of r's sequence at the end of its
 * generation: the prompt and the tokens fed after it (the last one chosen
 * is not: r->next_id never reached the sequence). Engine thread, no lock;
 * a state it cannot keep is let go, the request is not affected. */
static void keep_reply(struct sfw_server *s, struct req *r)
{
	int64_t pos = sfw_batch_seq_pos(s->b, r->seq), fed = pos - (int64_t)r->n_ids;
	if (!s->pc || r->gen_lost || fed <= 0 || (size_t)fed > r->n_gen || pos < s->p.prefix_min_tokens)
		return;
	int32_t *ids = sfw_malloc((size_t)pos * sizeof(int32_t));
	struct sfw_err err = {0};
	if (!ids)
		return;
	memcpy(ids, r->ids, r->n_ids * sizeof(int32_t));
	memcpy(ids + r->n_ids, r->gen, (size_t)fed * sizeof(int32_t));
	if (sfw_prefix_put(s->pc, r->seq, ids, pos, &err) != SFW_OK)
		sfw_log(SFW_LOG_DEBUG, "serve: request %llu: the reply's state is not kept: %s", (unsigned long long)r->id,
			err.msg);
	sfw_free(ids);
}

/* id chosen for r, kept for keep_reply (engine thread). */
static void note_gen(struct req *r, int32_t id)
{
	if (r->gen_lost)
		return;
	if (r->n_gen == r->cap_gen) {
		size_t cap = r->cap_gen ? 2 * r->cap_gen : 64;
		int32_t *g = sfw_realloc(r->gen, cap * sizeof(*g));
		if (!g) {
			r->gen_lost = 1;
			return;
		}
		r->gen = g, r->cap_gen = cap;
	}
	r->gen[r->n_gen++] = id;
}

/* One token chosen for r, taken into x: pushed through r's stream, the
 * texts copied out to the step's text buffer (engine thread, no lock). */
static void take_one(struct sfw_server *s, struct took *x, struct req *r, int32_t id)
{
	struct sfw_buf *tb = &s->step_text;
	const char *t = "";
	size_t len = 0;
	memset(x, 0, sizeof(*x));
	x->r = r;
	x->id = id;
	x->fin = SFW_FINISH_NONE;
	if (r->smp.p.logprobs)
		x->lp = r->lp;
	if (r->slot && x->id >= 0 && x->id < s->vocab) { /* the penalties see the token */
		struct sfw_sample_adj *a = adj_of(r, x->id);
		if (a)
			a->count++, a->seen = 1;
		else
			x->st = sfw_fail(&x->err, SFW_E_NOMEM, "out of memory for the penalties");
	}
	x->st = x->st != SFW_OK ? x->st
		: x->id < 0 || x->id >= s->vocab
		    ? sfw_fail(&x->err, SFW_E_INVAL, "the engine step chose no token")
		    : sfw_gen_stream_push(&r->gs, x->id, 0, sfw_batch_seq_pos(s->b, r->seq), &t, &len,
					  &x->fin, &x->err);
	x->a = tb->len, x->n = len;
	if (x->st == SFW_OK && len && sfw_buf_append(tb, t, len) != SFW_OK)
		x->st = sfw_fail(&x->err, SFW_E_NOMEM, "out of memory for the step's text");
	if (x->st == SFW_OK && s->pc)
		note_gen(r, x->id);
	if (x->st == SFW_OK && x->fin != SFW_FINISH_NONE)
		keep_reply(s, r);
	if (x->st == SFW_OK && x->fin != SFW_FINISH_NONE) {
		t = "", len = 0;
		x->st2 = sfw_gen_stream_flush(&r->gs, &t, &len, &x->err);
		x->a2 = tb->len, x->n2 = len;
		if (x->st2 == SFW_OK && len && sfw_buf_append(tb, t, len) != SFW_OK)
			x->st2 = sfw_fail(&x->err, SFW_E_NOMEM, "out of memory for the step's text");
	}
}

/* The step's tokens, part 1 (engine thread, no lock): pushed through their
 * streams, the texts copied out (the next push or flush reuses a stream's
 * buffer). Part 2, hand_tokens_locked, hands them over in the engine's one
 * locked pass of the step, so the connections' threads wait for the lock
 * once a step, not once a token, and the engine takes it once. Returns the
 * number of tokens taken. */
static int take_tokens(struct sfw_server *s, struct req **ir, const struct sfw_batch_item *it, int n)
{
	int k = 0;
	s->step_text.len = 0;
	for (int i = 0; i < n; i++)
		if (it[i].sample)
			take_one(s, &s->took[k++], ir[i], sfw_batch_next(s->b, i));
	return k;
}

/* 1 when lead l has choices waiting for a fork of its sequence (engine
 * thread: the waits' references keep them). */
static int fork_waiting(const struct req *l)
{
	for (int i = 0; i < l->n_wait; i++)
		if (!l->wait[i]->done)
			return 1;
	return 0;
}

/* The choices share one prefill (engine thread, no lock, after a step
 * taken with take_tokens): a lead whose prompt the step completed (its item
 * asked for the logits: it has choices waiting) forks its sequence for each
 * waiting choice, whose first token is then drawn on the host from the
 * lead's logits with its own sampler (its first uniform, as when it
 * prefilled the prompt itself) and taken as the step's tokens are, from
 * took[k]. A fork refused (no free sequence, too few KV blocks, or room
 * sequences running already: max_running counts the forks; the batch's
 * other sequences are the prefix cache's) leaves the choice to prefill the
 * prompt itself (its sequence stays -1). The choices handled go to
 * fk[*nfk] (fork_done_locked). Returns the tokens taken in all. */
static int fork_choices(struct sfw_server *s, struct req **ir, const struct sfw_batch_item *it, int n, int k,
			int room, struct req **fk, int *nfk)
{
	for (int i = 0; i < n; i++) {
		struct req *l = ir[i];
		const float *lg = it[i].want_logits ? sfw_batch_logits(s->b, i) : NULL;
		int nw = it[i].want_logits ? l->n_wait : 0;
		if (nw)
			l->n_wait = 0; /* every wait ends here (fork_done_locked) */
		for (int j = 0; j < nw; j++) {
			struct req *c = l->wait[j];
			fk[(*nfk)++] = c;
			if (c->done) /* gone meanwhile: its wait ends all the same */
				continue;
			struct sfw_err err = {0};
			int seq = -1;
			if (!lg || room <= 0 || sfw_batch_seq_fork(s->b, l->seq, &seq, &err) != SFW_OK) {
				sfw_log(SFW_LOG_DEBUG, "serve: request %llu, choice %d prefills the prompt itself: %s",
					(unsigned long long)l->id, c->index,
					!lg ? "no logits" : room <= 0 ? "max-running sequences run" : err.msg);
				continue;
			}
			room--;
			c->seq = seq;
			c->prefilled = c->n_ids;
			c->smp.p.adj = c->adj; /* the penalties' entries may have moved */
			c->smp.p.n_adj = c->n_adj;
			take_one(s, &s->took[k++], c, sfw_sampler_sample(&c->smp, lg, s->vocab));
		}
	}
	return k;
}

/* The choices fork_choices handled (srv->mu held, before their tokens are
 * handed over): a fork joins the running batch, out of the queue; a refused
 * one stays queued, to prefill the prompt itself. Their waits end. */
static void fork_done_locked(struct sfw_server *s, struct req **fk, int nfk)
{
	for (int j = 0; j < nfk; j++) {
		struct req *c = fk[j];
		if (c->seq >= 0) {
			queue_remove_locked(s, c);
			s->run[s->nrun++] = c;
			s->mt.forks++;
		}
		fork_wait_end_locked(c);
	}
}

/* The step's k taken tokens to their requests (srv->mu held). */
static void hand_tokens_locked(struct sfw_server *s, int k)
{
	struct took *tk = s->took;
	struct sfw_buf *tb = &s->step_text;
	double now = sfw_now_s();
	for (int q = 0; q < k; q++) {
		struct took *x = &tk[q];
		struct req *r = x->r;
		int ok = 1;
		if (x->st == SFW_OK && x->fin != SFW_FINISH_EOS) {
			if (r->made++ == 0) {
				hist_add(&s->mt.ttft, ttft_bounds, NB_TTFT, now - r->t_arrive);
				r->t_first = now;
			} else
				hist_add(&s->mt.itl, itl_bounds, NB_ITL, now - r->t_last);
			r->t_last = now;
			s->mt.gen_tokens++;
			if (r->smp.p.logprobs)
				ok = put_lp_locked(r, x->id, &x->lp);
		}
		ok = ok && x->st == SFW_OK && put_text_locked(r, tb->data + x->a, x->n);
		if (ok && x->fin == SFW_FINISH_NONE) {
			r->next_id = x->id;
			continue;
		}
		if (ok)
			ok = x->st2 == SFW_OK && put_text_locked(r, tb->data + x->a2, x->n2);
		retire_locked(s, r, ok ? x->fin : SFW_FINISH_NONE,
			      ok		 ? NULL
			      : x->err.msg[0] ? x->err.msg
			      : r->error[0]   ? r->error
					      : "generation failed");
	}
}

/* The queue joins the batch, oldest first, as far as the limits allow
 * (srv->mu held); a choice waiting for a fork of its lead's sequence stays
 * queued, and those behind it may join. */
static void admit_locked(struct sfw_server *s)
{
	struct req **pp = &s->qhead, *prev = NULL;
	while (*pp && s->nrun < s->p.max_running) {
		struct req *r = *pp;
		if (r->cancelled) {
			queue_take_locked(s, pp, prev);
			retire_locked(s, r, SFW_FINISH_CANCEL, NULL);
			continue;
		}
		if (r->wait_fork) {
			prev = r, pp = &r->next;
			continue;
		}
		struct sfw_err err = {0};
		int seq;
		int64_t hit = 0;
		if (s->pc ? sfw_prefix_open(s->pc, r->ids, (int64_t)r->n_ids, &seq, &hit, &err) != SFW_OK
			  : sfw_batch_seq_open(s->b, &seq, &err) != SFW_OK)
			break; /* full: it waits for a sequence to close */
		queue_take_locked(s, pp, prev);
		r->seq = seq;
		r->prefilled = (size_t)hit, r->cached = (size_t)hit; /* the rest is prefilled */
		s->run[s->nrun++] = r;
	}
}

/* The prefix cache keeps the state of every prompt the step finished, and
 * of a long prompt whose prefill the step took past a multiple of
 * prefix_every (engine thread, no lock, after the step's forks: the
 * choices waiting for one come first). A state it cannot keep is let go:
 * the request is not affected. */
static void keep_prompts(struct sfw_server *s, struct req **ir, const struct sfw_batch_item *it, int n)
{
	int64_t every = s->p.prefix_every > 0 ? s->p.prefix_every : INT64_MAX;
	for (int i = 0; s->pc && i < n; i++) {
		struct req *r = ir[i];
		if (it[i].ids == &r->next_id) /* a decode row */
			continue;
		int64_t at = (int64_t)r->prefilled, before = at - it[i].n;
		if (at != (int64_t)r->n_ids && at / every == before / every)
			continue;
		struct sfw_err err = {0};
		if (sfw_prefix_put(s->pc, r->seq, r->ids, at, &err) != SFW_OK)
			sfw_log(SFW_LOG_DEBUG, "serve: request %llu: the prompt's state is not kept: %s",
				(unsigned long long)r->id, err.msg);
	}
}

static void *engine_main(void *arg)
{
	struct sfw_server *s = arg;
	struct sfw_batch_item it[MAX_SEQS];
	struct req *ir[MAX_SEQS];
	struct sfw_sampler rng_keep[MAX_SEQS];
	/* the choices a step's forks handled (SFW_SERVE_N_MAX - 1 a lead; the
	 * forks made, like the step's items, fit the batch's MAX_SEQS) */
	struct req *fk[MAX_SEQS * SFW_SERVE_N_MAX];
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->quit && !s->qhead && s->nrun == 0)
			pthread_cond_wait(&s->engine_cv, &s->mu);
		if (s->quit && !s->qhead && s->nrun == 0)
			break;
		if (s->aborting) { /* sfw_serve_abort: every accepted request ends now */
			while (s->nrun > 0) {
				s->run[s->nrun - 1]->aborted = 1;
				retire_locked(s, s->run[s->nrun - 1], SFW_FINISH_NONE, ABORT_MSG);
			}
			while (s->qhead) {
				struct req *r = s->qhead;
				s->qhead = r->next;
				s->nqueue--;
				r->aborted = 1;
				retire_locked(s, r, SFW_FINISH_NONE, ABORT_MSG);
			}
			s->qtail = NULL;
			pthread_cond_broadcast(&s->idle_cv);
			continue;
		}
		double ti = sfw_now_s();
		/* the clients that went away free their sequences first */
		for (int i = s->nrun - 1; i >= 0; i--)
			if (s->run[i]->cancelled)
				retire_locked(s, s->run[i], SFW_FINISH_CANCEL, NULL);
		/* then the queue joins the batch, as far as the limits allow */
		admit_locked(s);
		if (s->pc)
			sfw_prefix_stats(s->pc, &s->mt.pcs);
		if (!s->qhead)
			s->qtail = NULL;
		/* one step: every decoding sequence one token, prompts a chunk each
		 * while the step's prefill budget lasts, oldest first */
		int n = 0;
		int64_t budget = s->p.prefill_chunk;
		for (int i = 0; i < s->nrun; i++) {
			struct req *r = s->run[i];
			if (r->prefilled < r->n_ids) {
				if (budget <= 0)
					continue;
				size_t k = r->n_ids - r->prefilled;
				if ((int64_t)k > budget)
					k = (size_t)budget;
				budget -= (int64_t)k;
				it[n] = (struct sfw_batch_item){r->seq, r->ids + r->prefilled, (int)k, 0, NULL, 0};
			} else {
				it[n] = (struct sfw_batch_item){r->seq, &r->next_id, 1, 0, NULL, 0};
			}
			/* the step chooses the next token (on the device where it
			 * can): the sampler's uniform is drawn now, and given back
			 * if the step fails */
			if (r->prefilled >= r->n_ids || r->prefilled + (size_t)it[n].n == r->n_ids) {
				rng_keep[n] = r->smp;
				r->smp.p.adj = r->adj; /* the penalties' entries may have moved */
				r->smp.p.n_adj = r->n_adj;
				it[n].sample = &r->smp.p;
				it[n].u = sfw_sampler_uniform(&r->smp);
				/* the prompt's end: its logits for the waiting choices' forks */
				it[n].want_logits = r->prefilled < r->n_ids && fork_waiting(r);
			}
			ir[n++] = r;
		}
		if (n == 0)
			continue;
		int room = s->p.max_running - s->nrun; /* for the forks of waiting choices */
		pthread_mutex_unlock(&s->mu);
		struct sfw_err err = {0};
		double t0 = sfw_now_s();
		enum sfw_status st = sfw_batch_step(s->b, it, n, &err);
		double t1 = sfw_now_s();
		int k = 0, decode_only = 1, nfk = 0;
		uint64_t pre = 0;
		if (st == SFW_OK) { /* the tokens through their streams before the lock */
			for (int i = 0; i < n; i++) {
				decode_only &= it[i].n == 1 && ir[i]->prefilled >= ir[i]->n_ids;
				if (ir[i]->prefilled < ir[i]->n_ids)
					ir[i]->prefilled += (size_t)it[i].n, pre += (uint64_t)it[i].n;
			}
			k = take_tokens(s, ir, it, n);
			k = fork_choices(s, ir, it, n, k, room, fk, &nfk);
			keep_prompts(s, ir, it, n);
		}
		pthread_mutex_lock(&s->mu);
		s->mt.step_s += t1 - t0;
		if (st != SFW_OK) {
			/* all or nothing: the uniforms given back; a pool the prefix
			 * cache's entries hold blocks of gets them back, and the step
			 * runs again; else the newest sequence of the step fails and
			 * the others go on with the next step */
			for (int i = 0; i < n; i++)
				if (it[i].sample)
					ir[i]->smp = rng_keep[i];
			if (st == SFW_E_NOSPACE && s->pc && sfw_prefix_evict(s->pc))
				continue;
			struct req *r = ir[n - 1];
			sfw_log(SFW_LOG_WARN, "serve: request %llu failed: %s", (unsigned long long)r->id,
				err.msg);
			retire_locked(s, r, SFW_FINISH_NONE, err.msg[0] ? err.msg : "the engine step failed");
			continue;
		}
		s->mt.steps++;
		s->mt.prefilled += pre;
		if (s->pc)
			sfw_prefix_stats(s->pc, &s->mt.pcs);
		fork_done_locked(s, fk, nfk);
		hand_tokens_locked(s, k);
		double host = (t0 - ti) + (sfw_now_s() - t1);
		s->mt.host_s += host;
		if (decode_only) {
			s->mt.dsteps++;
			s->mt.drows += (uint64_t)n;
			s->mt.dstep_s += (t1 - t0) + host;
		}
		pthread_cond_broadcast(&s->idle_cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- HTTP helpers ------------------------------------------------------------------- */

/* A connection's request: its route, body and what its log line says. */
struct conn {
	enum route rt;
	int method_ok, checked, too_big;
	struct sfw_buf body;
	int counted; /* an accepted request: s->active drops when its reply is sent */
	int refuse;  /* 503 or 429 decided before the body (which is dropped) */
	int http11;
	double t0;
	char method[8];
	int code;    /* the status answered (0: none yet) */
	int logged;  /* the request logs its own line (finish_request_locked) */
	char id[48]; /* the response id, "-" for none */
	int64_t prompt, output;
	double ttft; /* < 0: none */
};

/* The request the connection's thread is answering (thread per connection):
 * send_body notes the status there for the log line. */
static _Thread_local struct conn *cur_conn;

/* One line per request on stderr (the server's quiet turns it off). */
static void log_request(const struct sfw_server *s, const char *id, const char *method, enum route rt,
			int code, int64_t prompt, int64_t cached, int64_t output, double ttft, double dur)
{
	if (s->p.quiet)
		return;
	char t[32] = "-", em[40]; /* the method as the client sent it: escaped */
	if (ttft >= 0)
		snprintf(t, sizeof(t), "%.3fs", ttft);
	method = sfw_esc(method, em, sizeof(em));
	sfw_log(SFW_LOG_INFO,
		"serve: %s %s %s %d prompt_tokens=%lld output_tokens=%lld cached_tokens=%lld ttft=%s time=%.3fs",
		id[0] ? id : "-", method, route_path[rt], code, (long long)prompt, (long long)output, (long long)cached,
		t, dur);
}

static void count_locked(struct sfw_server *s, enum route rt, int code)
{
	for (size_t i = 0; i < N_CODES; i++)
		if (codes[i] == code)
			s->mt.requests[rt][i]++;
}

/* CORS: the origin may read the answer (--allowed-origins). */
static void add_cors(const struct sfw_server *s, struct MHD_Connection *c, struct MHD_Response *resp)
{
	if (!s->origins[0])
		return;
	const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
	MHD_add_response_header(resp, "Vary", "Origin");
	if (!sfw_serve_origin_allowed(s->origins, o))
		return;
	MHD_add_response_header(resp, "Access-Control-Allow-Origin", o);
}

static enum MHD_Result send_body(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int code,
				 const char *type, const char *body, size_t len, const char *retry_after)
{
	pthread_mutex_lock(&s->mu);
	count_locked(s, rt, code);
	int drain = s->draining;
	pthread_mutex_unlock(&s->mu);
	if (cur_conn)
		cur_conn->code = code;
	struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!resp)
		return MHD_NO;
	if (type)
		MHD_add_response_header(resp, "Content-Type", type);
	if (drain) /* no next request on this connection */
		MHD_add_response_header(resp, "Connection", "close");
	if (retry_after)
		MHD_add_response_header(resp, "Retry-After", retry_after);
	if (code == 401)
		MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
	add_cors(s, c, resp);
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result send_json(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int code,
				 cJSON *o)
{
	char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	if (!txt)
		return MHD_NO;
	enum MHD_Result r = send_body(s, c, rt, code, "application/json", txt, strlen(txt), NULL);
	cJSON_free(txt);
	return r;
}

static enum MHD_Result send_error(struct sfw_server *s, struct MHD_Connection *c, enum route rt,
				  const struct sfw_serve_error *e, const char *retry_after)
{
	char *txt = sfw_serve_error_json(e);
	if (!txt)
		return MHD_NO;
	enum MHD_Result r = send_body(s, c, rt, e->http, "application/json", txt, strlen(txt), retry_after);
	sfw_free(txt);
	return r;
}

static enum MHD_Result fail_with(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int http,
				 const char *type, const char *param, const char *msg,
				 const char *retry_after)
{
	struct sfw_serve_error e;
	memset(&e, 0, sizeof(e));
	e.http = http;
	e.type = type;
	snprintf(e.param, sizeof(e.param), "%s", param ? param : "");
	snprintf(e.message, sizeof(e.message), "%s", msg);
	return send_error(s, c, rt, &e, retry_after);
}

/* A CORS preflight (OPTIONS): 204 with what may be sent; the allowing
 * headers only for an allowed origin. */
static enum MHD_Result send_preflight(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int post)
{
	pthread_mutex_lock(&s->mu);
	count_locked(s, rt, 204);
	pthread_mutex_unlock(&s->mu);
	if (cur_conn)
		cur_conn->code = 204;
	struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	const char *allow = post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
	MHD_add_response_header(resp, "Allow", allow);
	const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
	add_cors(s, c, resp);
	if (sfw_serve_origin_allowed(s->origins, o)) {
		MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
		MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type");
		MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
	}
	enum MHD_Result ret = MHD_queue_response(c, 204, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* Waits on cv (mu held) for at most secs seconds. */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double secs)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long long ns = (long long)ts.tv_nsec + (secs > 0 ? (long long)(secs * 1e9) : 0);
	ts.tv_sec += (time_t)(ns / 1000000000LL);
	ts.tv_nsec = (long)(ns % 1000000000LL);
	pthread_cond_timedwait(cv, mu, &ts);
}

enum peer {
	PEER_HERE, /* connected; silent, or sending its next request */
	PEER_FIN,  /* it sent its last byte: a half-close, or a close only a write can tell from one */
	PEER_GONE  /* reset, or the socket failed */
};

static enum peer peer_state(struct MHD_Connection *c, int *fd)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return PEER_HERE;
	*fd = ci->connect_fd;
	struct pollfd pf = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
	if (poll(&pf, 1, 0) <= 0)
		return PEER_HERE;
	if (pf.revents & (POLLHUP | POLLERR | POLLNVAL))
		return PEER_GONE;
	/* readable: the end of the stream (0) or a reset, unless it is the next
	 * pipelined request's bytes */
	char b;
	ssize_t k = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (k > 0)
		return PEER_HERE;
	if (k == 0)
		return PEER_FIN;
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? PEER_HERE : PEER_GONE;
}

/* ---- a request's choices --------------------------------------------------------------- */

static int all_done(const struct req *l)
{
	for (int i = 0; i < l->n_ch; i++)
		if (!l->ch[i]->done)
			return 0;
	return 1;
}

/* a choice has text, or has finished and not said so yet, or all are done */
static int any_ready(const struct req *l)
{
	for (int i = 0; i < l->n_ch; i++)
		if (l->ch[i]->out.len || (l->ch[i]->done && !l->ch[i]->sent_final))
			return 1;
	return all_done(l);
}

static void cancel_all_locked(struct sfw_server *s, struct req *l)
{
	for (int i = 0; i < l->n_ch; i++)
		if (!l->ch[i]->done)
			l->ch[i]->cancelled = 1;
	pthread_cond_signal(&s->engine_cv);
}

/* Waits (srv->mu held) until every choice of lead l is done or (any_text)
 * one is ready. Returns 1 then; 0 when the client went away meanwhile (the
 * choices are then cancelled, the engine woken); 2 (a stream's wait only)
 * when the client has sent FIN: the caller sends an SSE comment, which a
 * closed socket answers with a reset and a half-closed client ignores. A
 * waiting HTTP/1.1 request is sent an interim "102 Processing" for the same
 * (RFC 9110 §15.2: a client accepts a 1xx it did not ask for); an HTTP/1.0
 * one has none, so its FIN counts as gone. */
static int wait_output_locked(struct sfw_server *s, struct req *l, int any_text)
{
	static const char processing[] = "HTTP/1.1 102 Processing\r\n\r\n";
	while (!(any_text ? any_ready(l) : all_done(l))) {
		timed_wait(&l->cv, &s->mu, WAIT_SLICE_MS * 1e-3);
		if (any_text ? any_ready(l) : all_done(l))
			break;
		int fd = -1;
		enum peer ps = peer_state(l->conn, &fd);
		if (ps == PEER_FIN && !l->probed) {
			l->probed = 1;
			if (l->p.stream)
				return 2;
			/* the connection's own thread is here, in the request handler:
			 * nothing else writes to the socket now */
			if (l->http11 && send(fd, processing, sizeof(processing) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) ==
					     (ssize_t)(sizeof(processing) - 1))
				continue;
			ps = PEER_GONE;
		}
		if (ps == PEER_GONE) {
			cancel_all_locked(s, l);
			return 0;
		}
	}
	return 1;
}

static const char *finish_reason(const struct req *r)
{
	return r->n_calls ? "tool_calls" : r->finish == SFW_FINISH_LENGTH ? "length" : "stop";
}

static cJSON *usage_json(const struct req *l)
{
	int64_t out = 0;
	for (int i = 0; i < l->n_ch; i++)
		out += l->ch[i]->completion_tokens;
	cJSON *u = cJSON_CreateObject();
	cJSON_AddNumberToObject(u, "prompt_tokens", (double)l->n_ids);
	cJSON_AddNumberToObject(u, "completion_tokens", (double)out);
	cJSON_AddNumberToObject(u, "total_tokens", (double)((int64_t)l->n_ids + out));
	cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
	if (d) /* OpenAI's: the prompt tokens that came from the cache */
		cJSON_AddNumberToObject(d, "cached_tokens", (double)l->cached);
	return u;
}

/* The response object's head: id, object, created, model (the id the
 * request named). */
static cJSON *head_json(const struct req *l, const char *object)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "id", l->idstr);
	cJSON_AddStringToObject(o, "object", object);
	cJSON_AddNumberToObject(o, "created", (double)l->created);
	cJSON_AddStringToObject(o, "model", l->p.model);
	return o;
}

/* A string of len bytes as a JSON string (cJSON wants it NUL-terminated). */
static cJSON *str_json(const char *t, size_t len)
{
	char *c = sfw_malloc(len + 1);
	if (!c)
		return NULL;
	memcpy(c, t ? t : "", len);
	c[len] = 0;
	cJSON *j = cJSON_CreateString(c);
	sfw_free(c);
	return j;
}

/* A token's text as the logprobs show it: its piece with special tokens
 * as written (as vLLM shows them), or with return_tokens_as_token_ids
 * "token_id:N" (vLLM's form). */
static void piece_text(const struct sfw_server *s, int32_t id, struct sfw_buf *b)
{
	struct sfw_err err = {0};
	b->len = 0;
	if (sfw_tokenizer_decode(s->tok, &id, 1, 0, b, &err) != SFW_OK)
		b->len = 0;
}

static void token_text(const struct sfw_server *s, const struct req *r, int32_t id, struct sfw_buf *b)
{
	if (!r->lead->p.token_ids) {
		piece_text(s, id, b);
		return;
	}
	char t[32];
	int n = snprintf(t, sizeof(t), "token_id:%d", (int)id);
	b->len = 0;
	if (sfw_buf_append(b, t, (size_t)n) != SFW_OK)
		b->len = 0;
}

static double lp_value(float v)
{
	return isfinite(v) ? (double)v : -9999.0; /* OpenAI's "impossible" */
}

static cJSON *token_lp_json(const struct sfw_server *s, const struct req *r, int32_t id, float lp,
			    struct sfw_buf *tb)
{
	token_text(s, r, id, tb);
	cJSON *o = cJSON_CreateObject(), *bytes;
	cJSON_AddItemToObject(o, "token", str_json(tb->data, tb->len));
	cJSON_AddNumberToObject(o, "logprob", lp_value(lp));
	if ((bytes = cJSON_AddArrayToObject(o, "bytes")))
		for (size_t i = 0; i < tb->len; i++)
			cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)tb->data[i]));
	return o;
}

/* The logprobs of n tokens: chat's {"content": [...]} or completions'
 * {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static cJSON *logprobs_json(const struct sfw_server *s, struct req *r, const struct lprec *l, size_t n)
{
	struct sfw_buf tb;
	sfw_buf_init(&tb, 1u << 16);
	cJSON *o = cJSON_CreateObject();
	if (r->lead->p.kind == SFW_SERVE_CHAT) {
		cJSON *arr = cJSON_AddArrayToObject(o, "content");
		for (size_t i = 0; arr && i < n; i++) {
			cJSON *t = token_lp_json(s, r, l[i].id, l[i].lp.logprob, &tb);
			cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
			for (int k = 0; top && k < l[i].lp.n_top; k++)
				cJSON_AddItemToArray(
				    top, token_lp_json(s, r, l[i].lp.top_id[k], l[i].lp.top_logprob[k], &tb));
			cJSON_AddItemToArray(arr, t);
		}
		cJSON_AddNullToObject(o, "refusal");
	} else {
		cJSON *toks = cJSON_AddArrayToObject(o, "tokens"),
		      *lps = cJSON_AddArrayToObject(o, "token_logprobs");
		cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"),
		      *offs = cJSON_AddArrayToObject(o, "text_offset");
		for (size_t i = 0; toks && lps && tops && offs && i < n; i++) {
			token_text(s, r, l[i].id, &tb);
			cJSON_AddItemToArray(toks, str_json(tb.data, tb.len));
			cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(l[i].lp.logprob)));
			cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)r->text_offset));
			if (r->lead->p.token_ids) /* the offsets count the text, not the names */
				piece_text(s, l[i].id, &tb);
			r->text_offset += (int64_t)tb.len;
			cJSON *m = cJSON_CreateObject();
			for (int k = 0; m && k < l[i].lp.n_top; k++) {
				token_text(s, r, l[i].lp.top_id[k], &tb);
				char *key = sfw_malloc(tb.len + 1);
				if (key) {
					memcpy(key, tb.data ? tb.data : "", tb.len);
					key[tb.len] = 0;
					if (!cJSON_GetObjectItemCaseSensitive(
						m, key)) /* two ids, one text: the first */
						cJSON_AddNumberToObject(m, key,
									lp_value(l[i].lp.top_logprob[k]));
					sfw_free(key);
				}
			}
			cJSON_AddItemToArray(tops, m);
		}
	}
	sfw_buf_release(&tb);
	return o;
}

/* ---- tool calls in a reply (formats/chat.h's parser) --------------------------------------- */

struct tool_out {
	struct req *r;
	struct sfw_buf content; /* text outside calls */
	cJSON *calls;		/* tool_calls made (NULL: none) */
	int stream;
};

static int tool_content(void *user, const char *text, size_t len)
{
	struct tool_out *t = user;
	return sfw_buf_append(&t->content, text, len) != SFW_OK;
}

static int tool_call(void *user, const struct sfw_toolcall *call)
{
	struct tool_out *t = user;
	if (!t->calls && !(t->calls = cJSON_CreateArray()))
		return 1;
	unsigned char rnd[12];
	char id[40];
	randombytes_buf(rnd, sizeof(rnd));
	memcpy(id, "call_", 5);
	sodium_bin2hex(id + 5, sizeof(id) - 5, rnd, sizeof(rnd));
	cJSON *c = cJSON_CreateObject(), *f;
	if (t->stream)
		cJSON_AddNumberToObject(c, "index", t->r->n_calls);
	cJSON_AddStringToObject(c, "id", id);
	cJSON_AddStringToObject(c, "type", "function");
	if ((f = cJSON_AddObjectToObject(c, "function"))) {
		cJSON_AddStringToObject(f, "name", call->name);
		cJSON_AddStringToObject(f, "arguments", call->arguments);
	}
	cJSON_AddItemToArray(t->calls, c);
	t->r->n_calls++;
	return 0;
}

/* Text of choice r through its tool-call parser (the forced start first);
 * fin: the reply has ended. 0 on a parser failure (r->error set). */
static int tool_feed(struct req *r, const char *text, size_t len, int fin, struct tool_out *t)
{
	struct sfw_toolparse_cb cb = {tool_content, tool_call, t};
	struct sfw_err err = {0};
	enum sfw_status st = SFW_OK;
	if (!r->tp) {
		if ((st = sfw_toolparse_new(&r->tp, &err)) == SFW_OK && r->lead->n_forced)
			st = sfw_toolparse_feed(r->tp, r->lead->forced, r->lead->n_forced, &cb, &err);
	}
	if (st == SFW_OK && len)
		st = sfw_toolparse_feed(r->tp, text, len, &cb, &err);
	if (st == SFW_OK && fin)
		st = sfw_toolparse_finish(r->tp, &cb, &err);
	if (st != SFW_OK)
		snprintf(r->error, sizeof(r->error), "%s",
			 err.msg[0] ? err.msg : "the tool-call parser failed");
	return st == SFW_OK;
}

/* One choice: text (len bytes; NULL for none), its logprobs, tool calls
 * (taken), finish (NULL: null). */
static cJSON *choice_json(const struct sfw_server *s, struct req *r, int stream, const char *text, size_t len,
			  const struct lprec *lps, size_t nlps, cJSON *calls, const char *finish)
{
	const struct req *l = r->lead;
	cJSON *ch = cJSON_CreateObject();
	cJSON_AddNumberToObject(ch, "index", r->index);
	if (l->p.kind == SFW_SERVE_CHAT) {
		cJSON *m = cJSON_AddObjectToObject(ch, stream ? "delta" : "message");
		if (!stream || !r->sent_role)
			cJSON_AddStringToObject(m, "role", "assistant");
		if (!stream && calls && len == 0)
			cJSON_AddNullToObject(m, "content");
		else if (!stream || text)
			cJSON_AddItemToObject(m, "content", str_json(text, len));
		if (calls)
			cJSON_AddItemToObject(m, "tool_calls", calls);
		else if (!stream)
			cJSON_AddArrayToObject(m, "tool_calls");
	} else {
		cJSON_AddItemToObject(ch, "text", str_json(text, len));
		cJSON_Delete(calls);
	}
	if (l->p.logprobs && (!stream || nlps))
		cJSON_AddItemToObject(ch, "logprobs", logprobs_json(s, r, lps, nlps));
	else
		cJSON_AddNullToObject(ch, "logprobs");
	if (finish)
		cJSON_AddStringToObject(ch, "finish_reason", finish);
	else
		cJSON_AddNullToObject(ch, "finish_reason");
	return ch;
}

/* ---- streaming ------------------------------------------------------------------- */

static int sse_put(struct req *l, cJSON *o)
{
	char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	if (!txt)
		return 0;
	int ok = sfw_buf_append(&l->sse, "data: ", 6) == SFW_OK &&
		 sfw_buf_append(&l->sse, txt, strlen(txt)) == SFW_OK &&
		 sfw_buf_append(&l->sse, "\n\n", 2) == SFW_OK;
	cJSON_free(txt);
	return ok;
}

static cJSON *chunk_json(const struct sfw_server *s, struct req *r, const char *text, size_t len,
			 const struct lprec *lps, size_t nlps, cJSON *calls, const char *fin)
{
	struct req *l = r->lead;
	cJSON *o = head_json(l, l->p.kind == SFW_SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
	cJSON *arr = cJSON_AddArrayToObject(o, "choices");
	cJSON *ch = choice_json(s, r, 1, text, len, lps, nlps, calls, fin);
	if (!arr || !ch) {
		cJSON_Delete(ch);
		cJSON_Delete(o);
		return NULL;
	}
	cJSON_AddItemToArray(arr, ch);
	r->sent_role = 1;
	return o;
}

/* A piece of choice r's text (and its tokens' logprobs) as events: through
 * the tool-call parser when the reply is parsed for calls. */
static int emit_piece(const struct sfw_server *s, struct req *r, const char *text, size_t len,
		      const struct lprec *lps, size_t nlps, int fin)
{
	struct req *l = r->lead;
	if (!r->tools) {
		int ok = 1;
		if (len || nlps)
			ok = sse_put(l, chunk_json(s, r, text, len, lps, nlps, NULL, NULL));
		return ok && (!fin || sse_put(l, chunk_json(s, r, NULL, 0, NULL, 0, NULL, finish_reason(r))));
	}
	struct tool_out t = {r, {0}, NULL, 1};
	sfw_buf_init(&t.content, OUT_MAX);
	int ok = tool_feed(r, text, len, fin, &t);
	if (ok && (t.content.len || t.calls || nlps)) {
		ok = sse_put(l, chunk_json(s, r, t.content.data, t.content.len, lps, nlps, t.calls, NULL));
		t.calls = NULL;
	}
	cJSON_Delete(t.calls);
	sfw_buf_release(&t.content);
	return ok && (!fin || sse_put(l, chunk_json(s, r, NULL, 0, NULL, 0, NULL, finish_reason(r))));
}

/* Takes choice r's text, cuts and logprob records under the lock (the
 * engine appends to the emptied ones meanwhile); *done: it had finished. */
static int take_locked(struct req *r, size_t *nc, size_t *nl, int *done)
{
	struct sfw_buf t = r->taken;
	size_t *tc = r->taken_cuts, *tcl = r->taken_cut_lps, tcap = r->taken_cap;
	*nc = r->ncuts;
	*done = r->done;
	r->taken = r->out, r->taken_cuts = r->cuts, r->taken_cut_lps = r->cut_lps, r->taken_cap = r->capcuts;
	r->out = t, r->cuts = tc, r->cut_lps = tcl, r->capcuts = tcap;
	r->out.len = 0, r->ncuts = 0;
	/* the records up to the last cut (all once done); the rest stay */
	size_t n = *done ? r->nlps : *nc ? r->taken_cut_lps[*nc - 1] : 0;
	if (n > r->taken_caplps) {
		struct lprec *x = sfw_realloc(r->taken_lps, n * sizeof(*x));
		if (!x)
			return 0;
		r->taken_lps = x;
		r->taken_caplps = n;
	}
	if (n) {
		memcpy(r->taken_lps, r->lps, n * sizeof(*r->lps));
		memmove(r->lps, r->lps + n, (r->nlps - n) * sizeof(*r->lps));
		r->nlps -= n;
	}
	*nl = n;
	return 1;
}

/* MHD's content reader: the next SSE bytes of the stream (the lead's). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct req *l = cls;
	struct sfw_server *s = l->srv;
	pthread_mutex_lock(&s->mu);
	while (l->sse.len == 0) {
		if (l->sent_done) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		int w = wait_output_locked(s, l, 1);
		if (w == 0) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		int ok = 1;
		struct req *failed = NULL;
		int fin = w == 2;
		if (fin) /* FIN: a comment line, which SSE readers skip (no events this time) */
			ok = sfw_buf_append(&l->sse, ":\n\n", 3) == SFW_OK;
		for (int i = 0; !fin && i < l->n_ch; i++)
			if (l->ch[i]->done && l->ch[i]->error[0])
				failed = l->ch[i];
		if (failed) {
			struct sfw_serve_error e;
			memset(&e, 0, sizeof(e));
			e.http = 500;
			e.type = "server_error";
			snprintf(e.message, sizeof(e.message), "%s", failed->error);
			char *t = sfw_serve_error_json(&e);
			ok = t && sfw_buf_append(&l->sse, "data: ", 6) == SFW_OK &&
			     sfw_buf_append(&l->sse, t, strlen(t)) == SFW_OK &&
			     sfw_buf_append(&l->sse, "\n\ndata: [DONE]\n\n", 16) == SFW_OK;
			sfw_free(t);
			l->sent_done = 1;
			cancel_all_locked(s, l);
		}
		for (int i = 0; ok && !failed && !fin && i < l->n_ch; i++) {
			struct req *r = l->ch[i];
			if (!r->out.len && !(r->done && !r->sent_final))
				continue;
			/* the pieces made since the last read, one event each: taken
			 * out under the lock, made into events outside it, as only
			 * this connection's thread touches sse, taken and sent_* */
			size_t nc, nl;
			int done;
			ok = take_locked(r, &nc, &nl, &done);
			pthread_mutex_unlock(&s->mu);
			size_t a = 0, la = 0;
			for (size_t k = 0; ok && k < nc; k++) {
				size_t lb = r->taken_cut_lps[k];
				ok = emit_piece(s, r, r->taken.data + a, r->taken_cuts[k] - a,
						r->taken_lps + la, lb - la, 0);
				a = r->taken_cuts[k], la = lb;
			}
			if (ok && done) {
				ok = emit_piece(s, r, NULL, 0, r->taken_lps + la, nl - la, 1);
				r->sent_final = 1;
			}
			pthread_mutex_lock(&s->mu);
			if (!ok && r->error[0]) { /* the parser's failure: an error event next */
				r->done = 1;
				ok = 1;
			}
		}
		if (ok && !fin && !l->sent_done && all_done(l)) {
			int finals = 1;
			for (int i = 0; i < l->n_ch; i++)
				finals &= l->ch[i]->sent_final;
			if (finals) {
				if (l->p.include_usage) {
					cJSON *o =
					    head_json(l, l->p.kind == SFW_SERVE_CHAT ? "chat.completion.chunk"
										     : "text_completion");
					cJSON_AddArrayToObject(o, "choices");
					cJSON_AddItemToObject(o, "usage", usage_json(l));
					ok = sse_put(l, o);
				}
				ok = ok && sfw_buf_append(&l->sse, "data: [DONE]\n\n", 14) == SFW_OK;
				l->sent_done = 1;
			}
		}
		if (!ok) {
			cancel_all_locked(s, l);
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
	size_t n = l->sse.len < max ? l->sse.len : max;
	memcpy(buf, l->sse.data, n);
	memmove(l->sse.data, l->sse.data + n, l->sse.len - n);
	l->sse.len -= n;
	pthread_mutex_unlock(&s->mu);
	return (ssize_t)n;
}

/* The connection drops its references to the request's choices (srv->mu
 * held), after its log line. */
static void finish_request_locked(struct sfw_server *s, struct req *l, enum route rt, const char *method,
				  int code)
{
	int64_t out = 0;
	for (int i = 0; i < l->n_ch; i++) /* made: under the lock, unlike the stream's count */
		out += l->ch[i]->made;
	double now = sfw_now_s(), t1 = 0;
	for (int i = 0; i < l->n_ch; i++)
		if (l->ch[i]->t_first > 0 && (t1 == 0 || l->ch[i]->t_first < t1))
			t1 = l->ch[i]->t_first;
	log_request(s, l->idstr, method, rt, code, (int64_t)l->n_ids, (int64_t)l->cached, out,
		    t1 > 0 ? t1 - l->t_arrive : -1, now - l->t_arrive);
	int n = l->n_ch; /* s->active drops in on_completed, once the reply is sent */
	struct req *ch[SFW_SERVE_N_MAX];
	memcpy(ch, l->ch, sizeof(ch));
	for (int i = n - 1; i >= 0; i--) /* the lead last: the others hold it */
		req_unref_locked(ch[i]);
}

/* MHD is through with the stream (finished, or the client went away). */
static void stream_free(void *cls)
{
	struct req *l = cls;
	struct sfw_server *s = l->srv;
	pthread_mutex_lock(&s->mu);
	if (!all_done(l))
		cancel_all_locked(s, l);
	finish_request_locked(s, l, l->p.kind == SFW_SERVE_CHAT ? R_CHAT : R_COMPLETIONS, "POST", 200);
	pthread_mutex_unlock(&s->mu);
}

/* ---- connections ---------------------------------------------------------------------- */

/* An open connection (MHD_OPTION_NOTIFY_CONNECTION), under srv->mu. */
enum phase {
	PH_RECV, /* waiting for a request, or for the rest of one; since t0 */
	PH_BUSY, /* its request is in and being answered */
	PH_CUT	 /* closed by the server (too slow, or the longest waiting of too many) */
};
struct slot {
	struct slot *prev, *next;
	int fd;
	enum phase ph;
	double t0;
};

/* Moves sl to ph (srv->mu held); PH_CUT shuts its socket down, which
 * libmicrohttpd's thread of the connection sees as the client's close. The
 * socket is still open here: MHD closes it only after NOTIFY_CLOSED, which
 * takes the lock. */
static void set_phase_locked(struct sfw_server *s, struct slot *sl, enum phase ph)
{
	if (!sl || sl->ph == PH_CUT || sl->ph == ph)
		return;
	if (sl->ph == PH_RECV)
		s->n_recv--;
	else
		s->n_busy--;
	sl->ph = ph;
	if (ph == PH_RECV) {
		s->n_recv++;
		sl->t0 = sfw_now_s();
	} else if (ph == PH_BUSY) {
		s->n_busy++;
	} else {
		shutdown(sl->fd, SHUT_RDWR);
	}
	if (s->n_busy == 0)
		pthread_cond_broadcast(&s->idle_cv);
}

static void set_phase(struct sfw_server *s, struct MHD_Connection *c, enum phase ph)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	pthread_mutex_lock(&s->mu);
	if (ci)
		set_phase_locked(s, ci->socket_context, ph);
	pthread_mutex_unlock(&s->mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct sfw_server *s = cls;
	pthread_mutex_lock(&s->mu);
	struct slot *sl = *socket_context;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (ci && (sl = sfw_calloc(1, sizeof(*sl)))) {
			sl->fd = ci->connect_fd;
			sl->ph = PH_RECV;
			sl->t0 = sfw_now_s();
			sl->next = s->slots;
			if (s->slots)
				s->slots->prev = sl;
			s->slots = sl;
			s->n_recv++;
			/* too many waiting for a request: the one that has waited
			 * longest goes, so a new client (a health check) gets in */
			while (s->n_recv > SFW_SERVE_RECV_MAX) {
				struct slot *old = NULL;
				for (struct slot *x = s->slots; x; x = x->next)
					if (x != sl && x->ph == PH_RECV && (!old || x->t0 < old->t0))
						old = x;
				if (!old)
					break;
				set_phase_locked(s, old, PH_CUT);
			}
		} else if (ci) { /* out of memory: not served */
			shutdown(ci->connect_fd, SHUT_RDWR);
		}
		*socket_context = sl;
	} else if (sl) { /* MHD_CONNECTION_NOTIFY_CLOSED */
		if (sl->ph == PH_RECV)
			s->n_recv--;
		else if (sl->ph == PH_BUSY)
			s->n_busy--;
		if (sl->prev)
			sl->prev->next = sl->next;
		else
			s->slots = sl->next;
		if (sl->next)
			sl->next->prev = sl->prev;
		sfw_free(sl);
		*socket_context = NULL;
		if (s->n_busy == 0)
			pthread_cond_broadcast(&s->idle_cv);
	}
	pthread_mutex_unlock(&s->mu);
}

/* The watchdog: a connection that has not sent its whole request within
 * receive_timeout seconds is closed (libmicrohttpd's own timeout is for
 * silence only, which a byte every few seconds resets). */
static void *watch_main(void *arg)
{
	struct sfw_server *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->watch_quit) {
		timed_wait(&s->watch_cv, &s->mu, 0.1);
		double now = sfw_now_s();
		if (s->p.receive_timeout > 0)
			for (struct slot *x = s->slots; x; x = x->next)
				if (x->ph == PH_RECV && now - x->t0 > s->p.receive_timeout)
					set_phase_locked(s, x, PH_CUT);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* 1 when a Transfer-Encoding value is "chunked" alone (spaces around it allowed). */
static int is_chunked(const char *te)
{
	while (*te == ' ' || *te == '\t')
		te++;
	size_t n = strlen(te);
	while (n && (te[n - 1] == ' ' || te[n - 1] == '\t'))
		n--;
	return n == 7 && !strncasecmp(te, "chunked", 7);
}

static enum MHD_Result too_big(struct sfw_server *s, struct MHD_Connection *c, enum route rt)
{
	char m[160];
	snprintf(m, sizeof(m), "the request body is larger than %zu bytes (what a context of %lld tokens can use)",
		 s->body_max, (long long)s->p.max_context);
	return fail_with(s, c, rt, 413, "invalid_request_error", NULL, m, NULL);
}

/* ---- the endpoints -------------------------------------------------------------------- */

static cJSON *model_json(const struct sfw_server *s, const char *id)
{
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "id", id);
	cJSON_AddStringToObject(m, "object", "model");
	cJSON_AddNumberToObject(m, "created", (double)s->created);
	cJSON_AddStringToObject(m, "owned_by", "salafw");
	cJSON_AddStringToObject(m, "root", s->name_ptr[0]);
	cJSON_AddNumberToObject(m, "max_model_len", (double)s->p.max_context);
	return m;
}

static enum MHD_Result handle_models(struct sfw_server *s, struct MHD_Connection *c)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "list");
	cJSON *arr = cJSON_AddArrayToObject(o, "data");
	for (int i = 0; arr && i < s->p.n_listed; i++)
		cJSON_AddItemToArray(arr, model_json(s, s->name_ptr[i]));
	return send_json(s, c, R_MODELS, 200, o);
}

/* GET /v1/models/{id}: any id the server answers to */
static enum MHD_Result handle_model(struct sfw_server *s, struct MHD_Connection *c, const char *id)
{
	for (int i = 0; i < s->p.n_names; i++)
		if (!strcmp(id, s->name_ptr[i]))
			return send_json(s, c, R_MODEL, 200, model_json(s, id));
	struct sfw_serve_error e;
	memset(&e, 0, sizeof(e));
	e.http = 404;
	e.type = "invalid_request_error";
	e.code = "model_not_found";
	snprintf(e.param, sizeof(e.param), "model");
	snprintf(e.message, sizeof(e.message), "the model '%.200s' does not exist (this server has '%.200s')",
		 id, s->name_ptr[0]);
	size_t L = strlen(e.message);
	while (L && !sfw_utf8_valid((const unsigned char *)e.message, L))
		e.message[--L] = 0;
	return send_error(s, c, R_MODEL, &e, NULL);
}

static enum MHD_Result handle_tokens(struct sfw_server *s, struct MHD_Connection *c, struct conn *cs)
{
	struct sfw_serve_error e;
	char *out = NULL;
	const char *b = cs->body.data ? cs->body.data : "";
	enum sfw_status st =
	    cs->rt == R_TOKENIZE
		? sfw_serve_tokenize(b, cs->body.len, s->name_ptr, (size_t)s->p.n_names, s->tok, s->p.chat,
				     s->p.max_context, &out, &e)
		: sfw_serve_detokenize(b, cs->body.len, s->name_ptr, (size_t)s->p.n_names, s->tok, &out, &e);
	if (st != SFW_OK)
		return send_error(s, c, cs->rt, &e, NULL);
	enum MHD_Result r = send_body(s, c, cs->rt, 200, "application/json", out, strlen(out), NULL);
	sfw_free(out);
	return r;
}

static enum MHD_Result handle_metrics(struct sfw_server *s, struct MHD_Connection *c)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 1u << 20);
	char line[512];
#define PUT(...)                                                                                             \
	do {                                                                                                 \
		int k_ = snprintf(line, sizeof(line), __VA_ARGS__);                                          \
		if (sfw_buf_append(&b, line, (size_t)k_) != SFW_OK)                                          \
			goto oom;                                                                            \
	} while (0)
	pthread_mutex_lock(&s->mu);
	count_locked(s, R_METRICS, 200);
	struct metrics mt = s->mt;
	int nq = s->nqueue, nr = s->nrun;
	pthread_mutex_unlock(&s->mu);
	PUT("# HELP salafw_requests_total HTTP requests answered, by endpoint and status.\n"
	    "# TYPE salafw_requests_total counter\n");
	for (int r = 0; r < R__COUNT; r++)
		for (size_t i = 0; i < N_CODES; i++)
			if (mt.requests[r][i])
				PUT("salafw_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n",
				    route_path[r], codes[i], (unsigned long long)mt.requests[r][i]);
	/* the scalar series: counters (integers or seconds) and gauges */
	const struct {
		const char *name, *type, *help;
		double v;
		int seconds;
	} sc[] = {
	    {"salafw_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", (double)mt.prompt_tokens, 0},
	    {"salafw_prompt_tokens_prefilled_total", "counter",
	     "Prompt tokens the engine prefilled (the n choices of a request share one prefill).", (double)mt.prefilled,
	     0},
	    {"salafw_choice_forks_total", "counter",
	     "Choices after a request's first that took a fork of its prefilled sequence instead of a prefill.",
	     (double)mt.forks, 0},
	    {"salafw_prefix_cache_lookups_total", "counter", "Prompts the prefix cache looked up.",
	     (double)mt.pcs.lookups, 0},
	    {"salafw_prefix_cache_hits_total", "counter", "Prompts that started from a kept prefix.",
	     (double)mt.pcs.hits, 0},
	    {"salafw_prefix_cache_cached_tokens_total", "counter", "Prompt tokens the prefix cache gave (not prefilled).",
	     (double)mt.pcs.cached_tokens, 0},
	    {"salafw_prefix_cache_entries", "gauge", "Prompt states the prefix cache holds.", (double)mt.pcs.entries, 0},
	    {"salafw_prefix_cache_bytes", "gauge", "Their bytes in backend memory (KV blocks, compressed keys, states).",
	     (double)mt.pcs.bytes, 0},
	    {"salafw_prefix_cache_evictions_total", "counter", "Kept states let go (budget, count, or the pool's need).",
	     (double)mt.pcs.evictions, 0},
	    {"salafw_generation_tokens_total", "counter", "Tokens generated.", (double)mt.gen_tokens, 0},
	    {"salafw_requests_cancelled_total", "counter", "Requests whose client went away before the end.",
	     (double)mt.cancelled, 0},
	    {"salafw_requests_failed_total", "counter", "Requests that failed in the engine.", (double)mt.failed, 0},
	    {"salafw_engine_steps_total", "counter", "Batched forward steps.", (double)mt.steps, 0},
	    {"salafw_engine_step_seconds_total", "counter", "Time inside the batched forward steps.", mt.step_s, 1},
	    {"salafw_engine_host_seconds_total", "counter",
	     "The engine thread's work between steps (scheduling, streaming the tokens out), its waits for "
	     "requests apart.",
	     mt.host_s, 1},
	    {"salafw_engine_decode_steps_total", "counter", "Steps of decode rows only (no prompt chunk).",
	     (double)mt.dsteps, 0},
	    {"salafw_engine_decode_rows_total", "counter", "Tokens those steps decoded.", (double)mt.drows, 0},
	    {"salafw_engine_decode_seconds_total", "counter",
	     "Those steps' time, the engine thread's work around them included.", mt.dstep_s, 1},
	    {"salafw_queue_depth", "gauge", "Requests waiting for a place in the batch.", (double)nq, 0},
	    {"salafw_running", "gauge", "Sequences in the running batch.", (double)nr, 0},
	};
	for (size_t k = 0; k < sizeof(sc) / sizeof(sc[0]); k++) {
		PUT("# HELP %s %s\n# TYPE %s %s\n", sc[k].name, sc[k].help, sc[k].name, sc[k].type);
		if (sc[k].seconds)
			PUT("%s %.6f\n", sc[k].name, sc[k].v);
		else
			PUT("%s %.0f\n", sc[k].name, sc[k].v);
	}
	const struct {
		const char *name, *help;
		const struct hist *h;
		const double *bounds;
		size_t nb;
	} hs[] = {{"salafw_time_to_first_token_seconds", "From the request's arrival to its first token.",
		   &mt.ttft, ttft_bounds, NB_TTFT},
		  {"salafw_inter_token_latency_seconds", "Between successive tokens of one request.", &mt.itl,
		   itl_bounds, NB_ITL}};
	for (size_t k = 0; k < 2; k++) {
		PUT("# HELP %s %s\n# TYPE %s histogram\n", hs[k].name, hs[k].help, hs[k].name);
		uint64_t cum = 0;
		for (size_t i = 0; i < hs[k].nb; i++) {
			cum += hs[k].h->bucket[i];
			PUT("%s_bucket{le=\"%g\"} %llu\n", hs[k].name, hs[k].bounds[i],
			    (unsigned long long)cum);
		}
		PUT("%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", hs[k].name,
		    (unsigned long long)hs[k].h->count, hs[k].name, hs[k].h->sum, hs[k].name,
		    (unsigned long long)hs[k].h->count);
	}
#undef PUT
	enum MHD_Result ret;
	struct MHD_Response *resp = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
	sfw_buf_release(&b);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(c, 200, resp);
	MHD_destroy_response(resp);
	return ret;
oom:
	sfw_buf_release(&b);
	return MHD_NO;
}

/* 1 when the request carries the key (or none is asked for). */
static int authorized(const struct sfw_server *s, struct MHD_Connection *c)
{
	if (!s->have_key)
		return 1;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return 0;
	unsigned char got[crypto_hash_sha256_BYTES];
	crypto_hash_sha256(got, (const unsigned char *)h + 7, strlen(h + 7));
	return sodium_memcmp(got, s->key_hash, sizeof(got)) == 0;
}

static struct req *new_req(struct sfw_server *s)
{
	struct req *r = sfw_calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->srv = s;
	r->seq = -1;
	r->lead = r;
	pthread_cond_init(&r->cv, NULL);
	sfw_buf_init(&r->out, OUT_MAX);
	sfw_buf_init(&r->taken, OUT_MAX);
	sfw_buf_init(&r->sse, OUT_MAX + (1u << 20));
	r->refs = 1; /* the connection */
	return r;
}

/* Choice c of lead l: its sampler (the request's values over the server's
 * defaults), penalties and output stream. */
static enum sfw_status init_choice(struct sfw_server *s, struct req *l, struct req *c, struct sfw_err *err)
{
	const struct sfw_serve_req *p = &l->p;
	const struct sfw_gen_defaults *d = &s->p.defaults;
	struct sfw_op_sample_params sp = sfw_sampler_default_params();
	double T = p->set & SFW_SERVE_SET_TEMPERATURE ? p->temperature : d->temperature;
	sp.top_p = (float)(p->set & SFW_SERVE_SET_TOP_P ? p->top_p : d->top_p);
	sp.top_k = p->set & SFW_SERVE_SET_TOP_K ? p->top_k : d->top_k;
	sp.min_p = (float)(p->set & SFW_SERVE_SET_MIN_P ? p->min_p : d->min_p);
	double rep = p->set & SFW_SERVE_SET_REPETITION ? p->repetition_penalty : d->repetition_penalty;
	sp.repetition_penalty = rep == 1 ? 0.0f : (float)rep;
	sp.presence_penalty = (float)p->presence_penalty;
	sp.frequency_penalty = (float)p->frequency_penalty;
	if (T < 1e-6) { /* 0, or too small to divide by: greedy */
		sp.greedy = 1;
		sp.temperature = 1;
	} else {
		sp.temperature = (float)T;
	}
	sp.logprobs = p->logprobs ? &c->lp : NULL;
	sp.top_logprobs = p->top_logprobs;
	if (sp.repetition_penalty != 0 || sp.presence_penalty != 0 || sp.frequency_penalty != 0 ||
	    p->n_bias) {
		if (!(c->slot = sfw_malloc((size_t)s->vocab * sizeof(int32_t))))
			return sfw_fail(err, SFW_E_NOMEM, "out of memory for the penalties");
		memset(c->slot, 0xff, (size_t)s->vocab * sizeof(int32_t)); /* -1: no entry */
		for (size_t i = 0; i < p->n_bias; i++) {
			struct sfw_sample_adj *a = adj_of(c, p->bias[i].id);
			if (!a)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory for the penalties");
			a->bias = p->bias[i].bias;
		}
		for (size_t i = 0; sp.repetition_penalty != 0 && i < c->n_ids; i++) { /* the prompt's ids */
			struct sfw_sample_adj *a = adj_of(c, c->ids[i]);
			if (!a)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory for the penalties");
			a->seen = 1;
		}
	}
	uint64_t seed = p->seed + (uint64_t)c->index;
	if (!p->have_seed)
		randombytes_buf(&seed, sizeof(seed));
	enum sfw_status st = sfw_sampler_init(&c->smp, &sp, seed, s->vocab, err);
	if (st != SFW_OK)
		return st;
	c->smp_ok = 1;
	c->gp = sfw_gen_default_params();
	c->gp.max_tokens = p->max_tokens ? p->max_tokens : p->kind == SFW_SERVE_COMPLETION ? 16 : 0;
	c->gp.max_ctx = s->p.max_context;
	c->gp.eos = p->ignore_eos ? &s->no_eos : &s->eos;
	c->gp.stop = p->stop;
	c->gp.n_stop = p->n_stop;
	/* a reply parsed for tool calls keeps the special tokens a call may be
	 * written with (as vLLM's tool parsers do) */
	c->gp.skip_special = l->tools ? 0 : p->skip_special;
	c->tools = l->tools;
	st = sfw_gen_stream_init(&c->gs, s->tok, sfw_model_config(s->m), &c->gp, c->ids, c->n_ids, err);
	c->gs_ok = 1;
	return st;
}

/* Drops every choice of l (srv->mu held), the lead last. */
static void drop_all_locked(struct req *l)
{
	int n = l->n_ch;
	struct req *ch[SFW_SERVE_N_MAX];
	memcpy(ch, l->ch, sizeof(ch));
	for (int i = n - 1; i >= 0; i--)
		req_unref_locked(ch[i]);
}

/* A validated request becomes a struct req and its choices: prompt ids,
 * samplers, stream parameters. Returns NULL with e filled when it cannot be
 * served. */
static struct req *make_req(struct sfw_server *s, struct sfw_serve_req *p, struct sfw_serve_error *e)
{
	struct req *r = new_req(s);
	struct sfw_err err = {0};
	enum sfw_status st = SFW_OK;
	memset(e, 0, sizeof(e[0]));
	e->http = 500;
	e->type = "server_error";
	if (!r) {
		snprintf(e->message, sizeof(e->message), "out of memory");
		sfw_serve_req_release(p);
		return NULL;
	}
	r->p = *p;
	memset(p, 0, sizeof(*p));
	r->ch[0] = r;
	r->n_ch = 1;
	unsigned char rnd[12];
	randombytes_buf(rnd, sizeof(rnd));
	int chat = r->p.kind == SFW_SERVE_CHAT;
	snprintf(r->idstr, sizeof(r->idstr), "%s", chat ? "chatcmpl-" : "cmpl-");
	sodium_bin2hex(r->idstr + strlen(r->idstr), sizeof(r->idstr) - strlen(r->idstr), rnd, sizeof(rnd));
	/* the text's bytes first: a token covers at most the longest token's
	 * bytes, so a longer text cannot fit the context, and is not tokenized */
	size_t text = 0;
	if (r->p.kind == SFW_SERVE_CHAT)
		for (size_t i = 0; i < r->p.n_msgs; i++)
			text += strlen(r->p.msgs[i].content);
	else if (r->p.prompt)
		text = strlen(r->p.prompt);
	if (text > s->text_max) {
		e->http = 400;
		e->type = "invalid_request_error";
		e->code = "context_length_exceeded";
		snprintf(e->param, sizeof(e->param), "%s", r->p.kind == SFW_SERVE_CHAT ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message),
			 "the prompt has %zu bytes, more than this server's context of %lld tokens can hold "
			 "(%zu bytes)",
			 text, (long long)s->p.max_context, s->text_max);
		goto fail;
	}
	if (r->p.kind == SFW_SERVE_CHAT || r->p.prompt) {
		/* SentencePiece's memory grows with the text: TOK_BUDGET bytes at
		 * once over all requests (a longer one alone) */
		pthread_mutex_lock(&s->mu);
		while (s->tok_bytes > 0 && s->tok_bytes + text > TOK_BUDGET)
			pthread_cond_wait(&s->tok_cv, &s->mu);
		s->tok_bytes += text;
		pthread_mutex_unlock(&s->mu);
	}
	if (chat) {
		struct sfw_buf t;
		size_t fa = 0;
		sfw_buf_init(&t, 2 * SFW_SERVE_BODY_MAX);
		r->tools = r->p.tools && r->p.tool_choice != SFW_TOOLS_NONE;
		st = s->p.chat ? sfw_serve_chat_prompt(s->p.chat, &r->p, &t, &fa, &err)
			       : sfw_fail(&err, SFW_E_INVAL, "this server has no chat template");
		const char *txt = t.data ? t.data : "";
		if (st == SFW_OK && t.len > fa) { /* the reply's forced start */
			if (!(r->forced = sfw_malloc(t.len - fa)))
				st = sfw_fail(&err, SFW_E_NOMEM, "out of memory");
			else
				memcpy(r->forced, txt + fa, t.len - fa), r->n_forced = t.len - fa;
		}
		if (st == SFW_OK)
			st = sfw_tokenizer_encode(s->tok, txt, t.len,
						  sfw_chat_needs_bos(s->p.chat, txt, t.len), &r->ids,
						  &r->n_ids, &err);
		sfw_buf_release(&t);
	} else if (r->p.prompt) {
		st = sfw_tokenizer_encode(s->tok, r->p.prompt, text, 1, &r->ids, &r->n_ids, &err);
	} else {
		r->ids = r->p.prompt_ids;
		r->n_ids = r->p.n_prompt_ids;
		r->p.prompt_ids = NULL;
	}
	if (r->p.kind == SFW_SERVE_CHAT || r->p.prompt) {
		pthread_mutex_lock(&s->mu);
		s->tok_bytes -= text;
		pthread_cond_broadcast(&s->tok_cv);
		pthread_mutex_unlock(&s->mu);
	}
	if (st != SFW_OK) {
		e->http = st == SFW_E_NOMEM ? 500 : 400;
		e->type = e->http == 400 ? "invalid_request_error" : "server_error";
		snprintf(e->param, sizeof(e->param), "%s", chat ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message), "%s", err.msg);
		goto fail;
	}
	if ((int64_t)r->n_ids > s->p.max_context || r->n_ids == 0) {
		e->http = 400;
		e->type = "invalid_request_error";
		e->code = "context_length_exceeded";
		snprintf(e->param, sizeof(e->param), "%s", chat ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message),
			 "the prompt has %zu tokens; this server's context is %lld tokens", r->n_ids,
			 (long long)s->p.max_context);
		goto fail;
	}
	/* the other choices: the same prompt, each in a fork of the lead's
	 * sequence once the lead has prefilled it (wait_fork, set as they are
	 * queued), or prefilled in a sequence of its own when a fork is refused */
	for (int i = 1; i < r->p.n; i++) {
		struct req *c = new_req(s);
		if (c && (c->ids = sfw_malloc(r->n_ids * sizeof(int32_t))))
			memcpy(c->ids, r->ids, r->n_ids * sizeof(int32_t));
		if (!c || !c->ids) {
			if (c)
				req_unref_locked(c); /* not yet holding the lead */
			snprintf(e->message, sizeof(e->message), "out of memory");
			goto fail;
		}
		c->n_ids = r->n_ids;
		c->lead = r;
		c->index = i;
		r->refs++; /* c holds the lead */
		r->ch[r->n_ch++] = c;
	}
	for (int i = 0; i < r->n_ch; i++)
		if ((st = init_choice(s, r, r->ch[i], &err)) != SFW_OK) {
			e->http = st == SFW_E_INVAL ? 400 : 500;
			e->type = e->http == 400 ? "invalid_request_error" : "server_error";
			if (e->http == 400) /* the stop strings are the client's values it checks */
				snprintf(e->param, sizeof(e->param), "stop");
			snprintf(e->message, sizeof(e->message), "%s", err.msg);
			goto fail;
		}
	r->created = (long long)time(NULL);
	return r;
fail:
	pthread_mutex_lock(&s->mu);
	drop_all_locked(r);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* The ignored fields' names, each logged once (at most 64 names). */
static void note_unknown(struct sfw_server *s, const struct sfw_serve_req *p)
{
	for (size_t i = 0; i < p->n_unknown; i++) {
		uint64_t h = 1469598103934665603ull;
		for (const unsigned char *c = (const unsigned char *)p->unknown[i]; *c; c++)
			h = (h ^ *c) * 1099511628211ull;
		pthread_mutex_lock(&s->mu);
		int seen = 0;
		for (int k = 0; k < s->n_unknown; k++)
			seen |= s->unknown_hash[k] == h;
		int fresh =
		    !seen && s->n_unknown < (int)(sizeof(s->unknown_hash) / sizeof(s->unknown_hash[0]));
		if (fresh)
			s->unknown_hash[s->n_unknown++] = h;
		pthread_mutex_unlock(&s->mu);
		if (fresh) {
			char b[160];
			sfw_log(SFW_LOG_WARN,
				"serve: ignoring the request field '%s' (not one salafw reads; said once)",
				sfw_esc(p->unknown[i], b, sizeof(b)));
		}
	}
}

/* Whether a completion request can be taken now (srv->mu held): 0, 503
 * while draining, 429 when the queue is full. Checked before the body is
 * kept or tokenized, and again when the request joins the queue with its
 * seqs choices. */
static int cannot_take_locked(const struct sfw_server *s, int seqs)
{
	return s->draining ? 503 : s->nqueue + s->nrun + seqs > s->p.max_queue + s->p.max_running ? 429 : 0;
}

static int cannot_take(struct sfw_server *s)
{
	pthread_mutex_lock(&s->mu);
	int code = cannot_take_locked(s, 1);
	pthread_mutex_unlock(&s->mu);
	return code;
}

static enum MHD_Result refuse(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int code)
{
	if (code == 503)
		return fail_with(s, c, rt, 503, "server_error", NULL, "the server is shutting down", NULL);
	return fail_with(s, c, rt, 429, "rate_limit_error", NULL, "too many requests are waiting; try again later",
			 "1");
}

static enum MHD_Result handle_generate(struct sfw_server *s, struct MHD_Connection *c, struct conn *cs)
{
	enum route rt = cs->rt;
	struct sfw_serve_req p;
	struct sfw_serve_error e;
	int code = cannot_take(s);
	if (code)
		return refuse(s, c, rt, code);
	if (sfw_serve_req_parse(cs->body.data ? cs->body.data : "", cs->body.len,
				rt == R_CHAT ? SFW_SERVE_CHAT : SFW_SERVE_COMPLETION, s->name_ptr,
				(size_t)s->p.n_names, s->vocab, &p, &e) != SFW_OK) {
		sfw_serve_req_release(&p);
		return send_error(s, c, rt, &e, NULL);
	}
	note_unknown(s, &p);
	struct req *r = make_req(s, &p, &e);
	if (!r)
		return send_error(s, c, rt, &e, NULL);
	snprintf(cs->id, sizeof(cs->id), "%s", r->idstr);
	r->conn = c;
	r->http11 = cs->http11;
	pthread_mutex_lock(&s->mu);
	if ((code = cannot_take_locked(s, r->n_ch)) != 0) {
		drop_all_locked(r);
		pthread_mutex_unlock(&s->mu);
		return refuse(s, c, rt, code);
	}
	r->id = ++s->next_id;
	r->t_arrive = sfw_now_s();
	for (int i = 0; i < r->n_ch; i++) {
		struct req *x = r->ch[i];
		x->id = r->id;
		x->t_arrive = r->t_arrive;
		x->refs++; /* the engine's */
		if (i > 0) { /* a fork of the lead's sequence after the prompt (one prefill) */
			x->wait_fork = 1;
			x->refs++; /* the lead's, while it waits */
			r->wait[r->n_wait++] = x;
		}
		if (s->qtail)
			s->qtail->next = x;
		else
			s->qhead = x;
		s->qtail = x;
		s->nqueue++;
	}
	s->active++; /* until on_completed: the reply has been sent */
	cs->counted = 1;
	s->mt.prompt_tokens += r->n_ids;
	pthread_cond_signal(&s->engine_cv);
	cs->logged = 1; /* the request's own line, at its end */
	if (r->p.stream) {
		count_locked(s, rt, 200);
		pthread_mutex_unlock(&s->mu);
		struct MHD_Response *resp =
		    MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, r, stream_free);
		if (!resp) {
			stream_free(r);
			return MHD_NO;
		}
		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		add_cors(s, c, resp);
		enum MHD_Result ret = MHD_queue_response(c, 200, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	/* not streamed: the whole reply, then one response */
	wait_output_locked(s, r, 0);
	enum MHD_Result ret = MHD_NO;
	int status = 499; /* the client went away */
	const char *error = NULL;
	for (int i = 0; i < r->n_ch; i++)
		if (r->ch[i]->done && r->ch[i]->error[0])
			error = r->ch[i]->error;
	int aborted = 0;
	for (int i = 0; i < r->n_ch; i++)
		aborted |= r->ch[i]->aborted;
	if (!all_done(r)) {
	} else if (aborted) {
		pthread_mutex_unlock(&s->mu);
		ret = fail_with(s, c, rt, 503, "server_error", NULL, ABORT_MSG, NULL);
		pthread_mutex_lock(&s->mu);
		status = 503;
	} else if (error) {
		pthread_mutex_unlock(&s->mu);
		ret = fail_with(s, c, rt, 500, "server_error", NULL, error, NULL);
		pthread_mutex_lock(&s->mu);
		status = 500;
	} else {
		pthread_mutex_unlock(&s->mu); /* the choices are done: the engine has let go of them */
		cJSON *o = head_json(r, rt == R_CHAT ? "chat.completion" : "text_completion");
		cJSON *arr = cJSON_AddArrayToObject(o, "choices");
		int ok = arr != NULL;
		for (int i = 0; ok && i < r->n_ch; i++) {
			struct req *x = r->ch[i];
			cJSON *ch;
			if (x->tools) {
				struct tool_out t = {x, {0}, NULL, 0};
				sfw_buf_init(&t.content, OUT_MAX);
				ok = tool_feed(x, x->out.data, x->out.len, 1, &t);
				ch = ok ? choice_json(s, x, 0, t.content.data, t.content.len, x->lps, x->nlps,
						      t.calls, finish_reason(x))
					: NULL;
				if (!ok)
					cJSON_Delete(t.calls);
				sfw_buf_release(&t.content);
			} else {
				ch = choice_json(s, x, 0, x->out.data, x->out.len, x->lps, x->nlps, NULL,
						 finish_reason(x));
			}
			ok = ch && cJSON_AddItemToArray(arr, ch);
		}
		if (ok)
			cJSON_AddItemToObject(o, "usage", usage_json(r));
		if (ok) {
			ret = send_json(s, c, rt, 200, o);
			status = 200;
		} else {
			cJSON_Delete(o);
			const char *m = "out of memory for the response";
			for (int i = 0; i < r->n_ch; i++)
				if (r->ch[i]->error[0])
					m = r->ch[i]->error;
			ret = fail_with(s, c, rt, 500, "server_error", NULL, m, NULL);
			status = 500;
		}
		pthread_mutex_lock(&s->mu);
	}
	finish_request_locked(s, r, rt, cs->method, status);
	pthread_mutex_unlock(&s->mu);
	return ret;
}

static enum route route_of(const char *url)
{
	for (int r = R_HEALTH; r < R__COUNT; r++)
		if (!strcmp(url, route_path[r]))
			return (enum route)r;
	if (!strncmp(url, "/v1/models/", 11) && url[11])
		return R_MODEL;
	return R_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				  const char *version, const char *upload, size_t *upload_size,
				  void **con_cls)
{
	struct sfw_server *s = cls;
	struct conn *cs = *con_cls;
	if (!cs) {
		if (!(cs = sfw_calloc(1, sizeof(*cs))))
			return MHD_NO;
		sfw_buf_init(&cs->body, s->body_max);
		cs->rt = route_of(url);
		cs->t0 = sfw_now_s();
		snprintf(cs->method, sizeof(cs->method), "%s", method);
		cs->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
		*con_cls = cs;
		cur_conn = cs;
		int post = cs->rt == R_COMPLETIONS || cs->rt == R_CHAT || cs->rt == R_TOKENIZE ||
			   cs->rt == R_DETOKENIZE;
		/* a coding other than chunked hides where the body ends (RFC 9112 §6.1: 501) */
		const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
		if (te && !is_chunked(te))
			return fail_with(s, c, cs->rt, 501, "invalid_request_error", NULL,
					 "the Transfer-Encoding is not supported (only chunked is)", NULL);
		if (cs->rt == R_NONE)
			return fail_with(s, c, R_NONE, 404, "invalid_request_error", NULL, "no such endpoint",
					 NULL);
		if (!strcmp(method, "OPTIONS"))
			return send_preflight(s, c, cs->rt, post);
		if (post ? strcmp(method, "POST") : strcmp(method, "GET") && strcmp(method, "HEAD"))
			return fail_with(s, c, cs->rt, 405, "invalid_request_error", NULL,
					 post ? "this endpoint takes POST" : "this endpoint takes GET", NULL);
		if (cs->rt == R_MODELS || cs->rt == R_MODEL || post) {
			if (!authorized(s, c))
				return fail_with(
				    s, c, cs->rt, 401, "invalid_request_error", NULL,
				    "a missing or wrong API key (send Authorization: Bearer KEY)", NULL);
		}
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl && strtoull(cl, NULL, 10) > s->body_max)
			return too_big(s, c, cs->rt);
		/* draining, or the queue full: the body is not worth keeping. A
		 * client waiting for "100 Continue" is answered now; one already
		 * sending it is answered once it is in (and dropped): closing on
		 * unread bytes would reset the connection under the answer */
		if (post && (cs->refuse = cannot_take(s)) != 0) {
			const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
			if (ex && !strcasecmp(ex, "100-continue"))
				return refuse(s, c, cs->rt, cs->refuse);
		}
		return MHD_YES;
	}
	cur_conn = cs;
	if (*upload_size) {
		if (!cs->too_big && !cs->refuse && sfw_buf_append(&cs->body, upload, *upload_size) != SFW_OK)
			cs->too_big = 1;
		*upload_size = 0;
		return MHD_YES;
	}
	set_phase(s, c, PH_BUSY); /* the whole request is in */
	if (cs->too_big)
		return too_big(s, c, cs->rt);
	if (cs->refuse)
		return refuse(s, c, cs->rt, cs->refuse);
	switch (cs->rt) {
	case R_HEALTH: {
		pthread_mutex_lock(&s->mu);
		int d = s->draining;
		pthread_mutex_unlock(&s->mu);
		const char *b = d ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}";
		return send_body(s, c, R_HEALTH, d ? 503 : 200, "application/json", b, strlen(b), NULL);
	}
	case R_METRICS:
		return handle_metrics(s, c);
	case R_MODELS:
		return handle_models(s, c);
	case R_MODEL:
		return handle_model(s, c, url + 11);
	case R_TOKENIZE:
	case R_DETOKENIZE:
		return handle_tokens(s, c, cs);
	default:
		return handle_generate(s, c, cs);
	}
}

/* MHD is through with a request: its reply sent, or the connection closed.
 * An accepted request stops counting here; the connection waits for its next. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)toe;
	struct sfw_server *s = cls;
	struct conn *cs = *con_cls;
	if (cs && cs->counted) {
		pthread_mutex_lock(&s->mu);
		s->active--;
		pthread_cond_broadcast(&s->idle_cv);
		pthread_mutex_unlock(&s->mu);
	}
	set_phase(s, c, PH_RECV);
	if (cs) {
		if (!cs->logged && cs->code)
			log_request(s, cs->id, cs->method, cs->rt, cs->code, 0, 0, 0, -1, sfw_now_s() - cs->t0);
		if (cur_conn == cs)
			cur_conn = NULL;
		sfw_buf_release(&cs->body);
		sfw_free(cs);
		*con_cls = NULL;
	}
}

/* ---- start and stop -------------------------------------------------------------------- */

struct sfw_serve_params sfw_serve_default_params(void)
{
	struct sfw_serve_params p;
	memset(&p, 0, sizeof(p));
	p.host = "127.0.0.1";
	p.port = 8080;
	p.model_names[0] = "salafw";
	p.n_names = p.n_listed = 1;
	sfw_gen_defaults_init(&p.defaults);
	p.max_running = 16;
	p.max_queue = 256;
	p.max_context = 4096;
	p.prefill_chunk = 256;
	p.prefix_cache_bytes = -1; /* half the KV pool */
	p.prefix_entries = 8;
	p.prefix_min_tokens = 256;
	p.prefix_every = 32768;
	p.receive_timeout = 60;
	p.conns_per_ip = 128;
	return p;
}

int sfw_serve_port(const struct sfw_server *s)
{
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	return di ? di->port : s->p.port;
}

int sfw_serve_prefix_entries(const struct sfw_serve_params *p)
{
	if (p->prefix_cache_bytes == 0 || p->prefix_entries <= 0)
		return 0;
	return p->prefix_entries < SFW_BATCH_MAX_SEQS - p->max_running ? p->prefix_entries
									  : SFW_BATCH_MAX_SEQS - p->max_running;
}

int64_t sfw_serve_prefix_bytes(const struct sfw_serve_params *p, const struct sfw_model *m)
{
	if (p->prefix_cache_bytes >= 0 || !sfw_serve_prefix_entries(p))
		return sfw_serve_prefix_entries(p) ? p->prefix_cache_bytes : 0;
	/* the pool's bytes (KV and compressed keys), counted as the cache counts its entries */
	struct sfw_batch_params bp = sfw_serve_batch_params(p);
	return (sfw_seq_state_bytes(m, bp.max_ctx, bp.pool_tokens, 1) - sfw_seq_state_bytes(m, bp.max_ctx, 0, 1)) / 2;
}

struct sfw_batch_params sfw_serve_batch_params(const struct sfw_serve_params *p)
{
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = p->max_running + sfw_serve_prefix_entries(p);
	bp.max_ctx = p->max_context;
	/* every sequence can reach max_context: whole 64-token blocks each (runner/batch.h) */
	bp.pool_tokens =
	    p->pool_tokens ? p->pool_tokens : (int64_t)p->max_running * ((p->max_context + 63) / 64 * 64);
	bp.max_step_rows = p->max_running + p->prefill_chunk; /* a step: every decode row and the prefill budget */
	return bp;
}

static void server_free(struct sfw_server *s)
{
	if (s->watch_started) {
		pthread_mutex_lock(&s->mu);
		s->watch_quit = 1;
		pthread_cond_signal(&s->watch_cv);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->watch, NULL);
	}
	if (s->engine_started) {
		pthread_mutex_lock(&s->mu);
		s->quit = 1;
		pthread_cond_signal(&s->engine_cv);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->engine, NULL);
	}
	sfw_prefix_free(s->pc);
	sfw_batch_free(s->b);
	sfw_buf_release(&s->step_text);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->engine_cv);
	pthread_cond_destroy(&s->idle_cv);
	pthread_cond_destroy(&s->watch_cv);
	pthread_cond_destroy(&s->tok_cv);
	sfw_free(s);
}

/* The most text bytes one token stands for: its piece's bytes (the "▁" a
 * piece's first decode drops counted), a special token's text, 3 for a
 * byte piece alone (U+FFFD; it stands for 1). Text of more bytes than
 * max_context times this cannot fit the context, for a tokenizer without
 * normalization (every MiniCPM and LLaMA one). */
static size_t token_bytes_max(const struct sfw_tokenizer *tok)
{
	struct sfw_buf b;
	sfw_buf_init(&b, 1u << 16);
	size_t most = 1;
	int v = sfw_tokenizer_vocab(tok);
	for (int32_t id = 0; id < v; id++) {
		struct sfw_err e = {0};
		b.len = 0;
		if (sfw_tokenizer_decode(tok, &id, 1, 0, &b, &e) == SFW_OK && b.len > most)
			most = b.len;
	}
	sfw_buf_release(&b);
	return most + 1;
}

enum sfw_status sfw_serve_start(struct sfw_model *m, const struct sfw_tokenizer *tok,
				const struct sfw_eos_set *eos, const struct sfw_serve_params *p,
				struct sfw_server **out, struct sfw_err *err)
{
	*out = NULL;
	if (!tok)
		return sfw_fail(err, SFW_E_INVAL, "serving needs the model's tokenizer");
	if (p->max_running < 1 || p->max_running > MAX_SEQS)
		return sfw_fail(err, SFW_E_INVAL, "--max-running must be 1 to %d", MAX_SEQS);
	if (p->max_queue < 0 || p->max_context < 1 || p->prefill_chunk < 1 || p->port < 0 || p->port > 65535)
		return sfw_fail(err, SFW_E_INVAL, "bad server limits");
	if (sodium_init() < 0)
		return sfw_fail(err, SFW_E_INVAL, "libsodium failed to initialise");
	struct sfw_server *s = sfw_calloc(1, sizeof(*s));
	if (!s)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	s->m = m;
	sfw_buf_init(&s->step_text, (size_t)MAX_SEQS * 2 * OUT_MAX); /* a step's texts: short pieces in practice */
	s->tok = tok;
	s->eos = *eos;
	s->p = *p;
	s->vocab = sfw_model_config(m)->vocab_size;
	if (p->n_names < 1 || p->n_names > SFW_SERVE_NAMES_MAX || p->n_listed < 1 ||
	    p->n_listed > p->n_names) {
		sfw_free(s);
		return sfw_fail(err, SFW_E_INVAL, "1 to %d model names, at least one listed",
				SFW_SERVE_NAMES_MAX);
	}
	for (int i = 0; i < p->n_names; i++) {
		snprintf(s->names[i], sizeof(s->names[i]), "%s", p->model_names[i] ? p->model_names[i] : "");
		s->name_ptr[i] = s->p.model_names[i] = s->names[i];
	}
	snprintf(s->origins, sizeof(s->origins), "%s", p->allowed_origins ? p->allowed_origins : "");
	s->p.allowed_origins = s->origins[0] ? s->origins : NULL;
	s->created = (long long)time(NULL);
	if (p->api_key) {
		s->have_key = 1;
		crypto_hash_sha256(s->key_hash, (const unsigned char *)p->api_key, strlen(p->api_key));
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->engine_cv, NULL);
	pthread_cond_init(&s->idle_cv, NULL);
	pthread_cond_init(&s->watch_cv, NULL);
	pthread_cond_init(&s->tok_cv, NULL);
	/* the cheap bounds: prompt text a context can hold, and the body that
	 * can carry it, as text (escaped) or as a list of token ids ("73447, ") */
	uint64_t tm = 0, bm = 0, idb = 2;
	if (!sfw_mul_ok((uint64_t)p->max_context, token_bytes_max(tok), &tm) || tm > SFW_SERVE_BODY_MAX)
		tm = SFW_SERVE_BODY_MAX;
	for (int v = sfw_tokenizer_vocab(tok) - 1; v > 0; v /= 10)
		idb++;
	bm = tm * BODY_TEXT_X + BODY_FRAME;
	if ((uint64_t)p->max_context * idb + BODY_FRAME > bm) /* (max_context is bounded: no overflow) */
		bm = (uint64_t)p->max_context * idb + BODY_FRAME;
	s->text_max = (size_t)tm;
	s->body_max = bm < SFW_SERVE_BODY_MAX ? (size_t)bm : SFW_SERVE_BODY_MAX;
	struct sfw_batch_params bp = sfw_serve_batch_params(p);
	enum sfw_status st = sfw_batch_new(m, &bp, &s->b, err);
	struct sfw_prefix_params pp = {sfw_serve_prefix_bytes(p, m), sfw_serve_prefix_entries(p), p->prefix_min_tokens};
	if (st == SFW_OK && pp.budget_bytes > 0 && pp.max_entries > 0)
		st = sfw_prefix_new(s->b, &pp, &s->pc, err);
	if (st != SFW_OK) {
		server_free(s);
		return st;
	}
	if (pthread_create(&s->engine, NULL, engine_main, s) != 0) {
		server_free(s);
		return sfw_fail(err, SFW_E_NOMEM, "cannot start the engine thread");
	}
	s->engine_started = 1;

	/* the address to bind: numeric or a name, the first answer */
	struct addrinfo hints, *ai = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	char port[16];
	snprintf(port, sizeof(port), "%d", p->port);
	int gai = getaddrinfo(p->host ? p->host : "127.0.0.1", port, &hints, &ai);
	if (gai != 0 || !ai) {
		server_free(s);
		return sfw_fail(err, SFW_E_NET, "cannot resolve the address '%s': %s", p->host,
				gai_strerror(gai));
	}
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
			 (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
	/* the accepted requests, the connections waiting for a request, and a
	 * reserve for the rest (/health, /metrics, answers under way) */
	unsigned limit = (unsigned)(p->max_queue + p->max_running + SFW_SERVE_RECV_MAX + CONN_RESERVE);
	s->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
				ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_LIMIT, limit,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(p->conns_per_ip > 0 ? p->conns_per_ip : 0),
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
	int e = errno;
	freeaddrinfo(ai);
	if (!s->d) {
		server_free(s);
		return sfw_fail(err, SFW_E_NET, "cannot listen on %s:%d: %s", p->host, p->port,
				e ? strerror(e) : "libmicrohttpd refused");
	}
	if (pthread_create(&s->watch, NULL, watch_main, s) != 0) {
		MHD_stop_daemon(s->d);
		server_free(s);
		return sfw_fail(err, SFW_E_NOMEM, "cannot start the connection watchdog thread");
	}
	s->watch_started = 1;
	*out = s;
	return SFW_OK;
}

void sfw_serve_drain(struct sfw_server *s)
{
	pthread_mutex_lock(&s->mu);
	s->draining = 1;
	pthread_mutex_unlock(&s->mu);
}

int sfw_serve_idle(struct sfw_server *s, double timeout_s)
{
	double end = sfw_now_s() + timeout_s;
	pthread_mutex_lock(&s->mu);
	while (s->active > 0 && sfw_now_s() < end)
		timed_wait(&s->idle_cv, &s->mu, end - sfw_now_s());
	int idle = s->active == 0;
	pthread_mutex_unlock(&s->mu);
	return idle;
}

int sfw_serve_abort(struct sfw_server *s)
{
	pthread_mutex_lock(&s->mu);
	s->draining = 1;
	s->aborting = 1;
	int n = s->nqueue + s->nrun;
	pthread_cond_signal(&s->engine_cv);
	/* the engine ends them after its step under way; their answers go out */
	double end = sfw_now_s() + ABORT_SEND_S;
	while ((s->nqueue + s->nrun > 0 || s->active > 0) && sfw_now_s() < end)
		timed_wait(&s->idle_cv, &s->mu, 0.05);
	pthread_mutex_unlock(&s->mu);
	return n;
}

void sfw_serve_stop(struct sfw_server *s)
{
	if (!s)
		return;
	sfw_serve_drain(s); /* the listener stays open: new requests get 503 */
	pthread_mutex_lock(&s->mu);
	while (s->active > 0 && !s->aborting)
		pthread_cond_wait(&s->idle_cv, &s->mu);
	/* the answers under way that are not accepted requests (503s, /health)
	 * get a moment to go out */
	double end = sfw_now_s() + 1;
	while (s->n_busy > 0 && sfw_now_s() < end)
		timed_wait(&s->idle_cv, &s->mu, 0.05);
	pthread_mutex_unlock(&s->mu);
	MHD_stop_daemon(s->d);
	server_free(s);
}
