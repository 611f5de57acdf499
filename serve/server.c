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
#include "log.h"
#include "runner/batch.h"
#include "runner/runner.h"
#include "runner/sampler.h"

#include <errno.h>
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

enum route { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_COMPLETIONS, R_CHAT, R__COUNT };
static const char *const route_path[R__COUNT] = {"other",      "/health",	  "/metrics",
						 "/v1/models", "/v1/completions", "/v1/chat/completions"};
static const int codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 501, 503};
#define N_CODES (sizeof(codes) / sizeof(codes[0]))

struct metrics {
	uint64_t requests[R__COUNT][N_CODES];
	uint64_t prompt_tokens, gen_tokens, cancelled, failed, steps;
	double step_s; /* inside sfw_batch_step */
	double host_s; /* the engine thread's own work around the steps (not its waits for requests) */
	/* the steps of decode rows only (no prompt chunk): how many, their rows,
	 * and their time, the engine thread's own work around them included */
	uint64_t dsteps, drows;
	double dstep_s;
	struct hist ttft, itl;
};

/* ---- requests ------------------------------------------------------------------ */

struct req {
	struct sfw_server *srv;
	int refs; /* the connection and the engine */
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
	int32_t next_id; /* the token to feed next */
	struct sfw_gen_stream gs;
	int gs_ok;
	int64_t made;
	/* shared (srv->mu) */
	pthread_cond_t cv;
	struct sfw_buf out; /* text made, not yet taken by the connection */
	size_t *cuts;	    /* stream: where each piece in out ends */
	size_t ncuts, capcuts;
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
	int sent_role, sent_final, sent_done;
};

/* A step's sampled token of one request, pushed through its stream. */
struct took {
	struct req *r;
	int32_t id;
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
	char model_name[256];
	int vocab;
	int have_key;
	unsigned char key_hash[crypto_hash_sha256_BYTES];
	struct MHD_Daemon *d;
	struct sfw_batch *b;
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
	pthread_cond_destroy(&r->cv);
	sfw_free(r);
}

/* ---- the engine ------------------------------------------------------------------- */

/* The engine is through with r (srv->mu held): its sequence is closed, the
 * connection is told, the engine's reference dropped. */
static void retire_locked(struct sfw_server *s, struct req *r, enum sfw_finish fin, const char *error)
{
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
	pthread_cond_broadcast(&r->cv);
	req_unref_locked(r);
}

/* Appends text made for r (srv->mu held); a failure to keep it fails r. */
static int put_text_locked(struct req *r, const char *t, size_t n)
{
	if (n && sfw_buf_append(&r->out, t, n) != SFW_OK) {
		snprintf(r->error, sizeof(r->error), "the reply is longer than %u MiB", OUT_MAX >> 20);
		return 0;
	}
	if (n && r->p.stream) { /* where the piece ends: one event per piece */
		if (r->ncuts == r->capcuts) {
			size_t cap = r->capcuts ? 2 * r->capcuts : 16;
			size_t *c = sfw_realloc(r->cuts, cap * sizeof(*c));
			if (!c) {
				snprintf(r->error, sizeof(r->error), "out of memory for the stream");
				return 0;
			}
			r->cuts = c;
			r->capcuts = cap;
		}
		r->cuts[r->ncuts++] = r->out.len;
	}
	if (n)
		pthread_cond_broadcast(&r->cv);
	return 1;
}

/* The step's tokens, part 1 (engine thread, no lock): pushed through their
 * streams, the texts copied out (the next push or flush reuses a stream's
 * buffer). Part 2, hand_tokens_locked, hands them over in the engine's one
 * locked pass of the step, so the connections' threads wait for the lock
 * once a step, not once a token, and the engine takes it once. Returns the
 * number of tokens taken. */
static int take_tokens(struct sfw_server *s, struct req **ir, const struct sfw_batch_item *it, int n)
{
	struct took *tk = s->took;
	struct sfw_buf *tb = &s->step_text;
	int k = 0;
	tb->len = 0;
	for (int i = 0; i < n; i++) {
		if (!it[i].sample)
			continue;
		struct took *x = &tk[k++];
		struct req *r = ir[i];
		const char *t = "";
		size_t len = 0;
		memset(x, 0, sizeof(*x));
		x->r = r;
		x->id = sfw_batch_next(s->b, i);
		x->fin = SFW_FINISH_NONE;
		x->st = x->id < 0 || x->id >= s->vocab
				? sfw_fail(&x->err, SFW_E_INVAL, "the engine step chose no token")
				: sfw_gen_stream_push(&r->gs, x->id, 0, sfw_batch_seq_pos(s->b, r->seq), &t, &len,
						      &x->fin, &x->err);
		x->a = tb->len, x->n = len;
		if (x->st == SFW_OK && len && sfw_buf_append(tb, t, len) != SFW_OK)
			x->st = sfw_fail(&x->err, SFW_E_NOMEM, "out of memory for the step's text");
		if (x->st == SFW_OK && x->fin != SFW_FINISH_NONE) {
			t = "", len = 0;
			x->st2 = sfw_gen_stream_flush(&r->gs, &t, &len, &x->err);
			x->a2 = tb->len, x->n2 = len;
			if (x->st2 == SFW_OK && len && sfw_buf_append(tb, t, len) != SFW_OK)
				x->st2 = sfw_fail(&x->err, SFW_E_NOMEM, "out of memory for the step's text");
		}
	}
	return k;
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
		if (x->st == SFW_OK && x->fin != SFW_FINISH_EOS) {
			if (r->made++ == 0)
				hist_add(&s->mt.ttft, ttft_bounds, NB_TTFT, now - r->t_arrive);
			else
				hist_add(&s->mt.itl, itl_bounds, NB_ITL, now - r->t_last);
			r->t_last = now;
			s->mt.gen_tokens++;
		}
		int ok = x->st == SFW_OK && put_text_locked(r, tb->data + x->a, x->n);
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

static void *engine_main(void *arg)
{
	struct sfw_server *s = arg;
	struct sfw_batch_item it[MAX_SEQS];
	struct req *ir[MAX_SEQS];
	struct sfw_sampler rng_keep[MAX_SEQS];
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
		while (s->qhead && s->nrun < s->p.max_running) {
			struct req *r = s->qhead;
			if (r->cancelled) {
				s->qhead = r->next;
				s->nqueue--;
				retire_locked(s, r, SFW_FINISH_CANCEL, NULL);
				continue;
			}
			struct sfw_err err = {0};
			int seq;
			if (sfw_batch_seq_open(s->b, &seq, &err) != SFW_OK)
				break; /* full: it waits for a sequence to close */
			s->qhead = r->next;
			if (!s->qhead)
				s->qtail = NULL;
			s->nqueue--;
			r->seq = seq;
			s->run[s->nrun++] = r;
		}
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
				it[n].sample = &r->smp.p;
				it[n].u = sfw_sampler_uniform(&r->smp);
			}
			ir[n++] = r;
		}
		if (n == 0)
			continue;
		pthread_mutex_unlock(&s->mu);
		struct sfw_err err = {0};
		double t0 = sfw_now_s();
		enum sfw_status st = sfw_batch_step(s->b, it, n, &err);
		double t1 = sfw_now_s();
		int k = 0, decode_only = 1;
		if (st == SFW_OK) { /* the tokens through their streams before the lock */
			for (int i = 0; i < n; i++) {
				decode_only &= it[i].n == 1 && ir[i]->prefilled >= ir[i]->n_ids;
				if (ir[i]->prefilled < ir[i]->n_ids)
					ir[i]->prefilled += (size_t)it[i].n;
			}
			k = take_tokens(s, ir, it, n);
		}
		pthread_mutex_lock(&s->mu);
		s->mt.step_s += t1 - t0;
		if (st != SFW_OK) {
			/* all or nothing: the newest sequence of the step fails, the
			 * others go on with the next step, their uniforms given back */
			for (int i = 0; i < n; i++)
				if (it[i].sample)
					ir[i]->smp = rng_keep[i];
			struct req *r = ir[n - 1];
			sfw_log(SFW_LOG_WARN, "serve: request %llu failed: %s", (unsigned long long)r->id,
				err.msg);
			retire_locked(s, r, SFW_FINISH_NONE, err.msg[0] ? err.msg : "the engine step failed");
			continue;
		}
		s->mt.steps++;
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

static void count_locked(struct sfw_server *s, enum route rt, int code)
{
	for (size_t i = 0; i < N_CODES; i++)
		if (codes[i] == code)
			s->mt.requests[rt][i]++;
}

static enum MHD_Result send_body(struct sfw_server *s, struct MHD_Connection *c, enum route rt, int code,
				 const char *type, const char *body, size_t len, const char *retry_after)
{
	pthread_mutex_lock(&s->mu);
	count_locked(s, rt, code);
	int drain = s->draining;
	pthread_mutex_unlock(&s->mu);
	struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", type);
	if (drain) /* no next request on this connection */
		MHD_add_response_header(resp, "Connection", "close");
	if (retry_after)
		MHD_add_response_header(resp, "Retry-After", retry_after);
	if (code == 401)
		MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
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

/* Waits (srv->mu held) until r is done or (any_text) has text. Returns 1
 * then; 0 when the client went away meanwhile (r is then marked cancelled,
 * the engine woken); 2 (a stream's wait only) when the client has sent FIN:
 * the caller sends an SSE comment, which a closed socket answers with a
 * reset and a half-closed client ignores. A waiting HTTP/1.1 request is
 * sent an interim "102 Processing" for the same (RFC 9110 §15.2: a client
 * accepts a 1xx it did not ask for); an HTTP/1.0 one has none, so its FIN
 * counts as gone. */
static int wait_output_locked(struct sfw_server *s, struct req *r, int any_text)
{
	static const char processing[] = "HTTP/1.1 102 Processing\r\n\r\n";
	while (!r->done && (!any_text || r->out.len == 0)) {
		timed_wait(&r->cv, &s->mu, WAIT_SLICE_MS * 1e-3);
		if (r->done || (any_text && r->out.len))
			break;
		int fd = -1;
		enum peer ps = peer_state(r->conn, &fd);
		if (ps == PEER_FIN && !r->probed) {
			r->probed = 1;
			if (r->p.stream)
				return 2;
			/* the connection's own thread is here, in the request handler:
			 * nothing else writes to the socket now */
			if (r->http11 && send(fd, processing, sizeof(processing) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) ==
					     (ssize_t)(sizeof(processing) - 1))
				continue;
			ps = PEER_GONE;
		}
		if (ps == PEER_GONE) {
			r->cancelled = 1;
			pthread_cond_signal(&s->engine_cv);
			return 0;
		}
	}
	return 1;
}

static const char *finish_reason(enum sfw_finish f)
{
	return f == SFW_FINISH_LENGTH ? "length" : "stop";
}

static cJSON *usage_json(const struct req *r)
{
	cJSON *u = cJSON_CreateObject();
	cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->n_ids);
	cJSON_AddNumberToObject(u, "completion_tokens", (double)r->completion_tokens);
	cJSON_AddNumberToObject(u, "total_tokens", (double)(r->n_ids + (size_t)r->completion_tokens));
	return u;
}

/* The response object's head: id, object, created, model. */
static cJSON *head_json(const struct sfw_server *s, const struct req *r, const char *object)
{
	char id[64];
	snprintf(id, sizeof(id), "%s-%llu", r->p.kind == SFW_SERVE_CHAT ? "chatcmpl" : "cmpl",
		 (unsigned long long)r->id);
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "id", id);
	cJSON_AddStringToObject(o, "object", object);
	cJSON_AddNumberToObject(o, "created", (double)r->created);
	cJSON_AddStringToObject(o, "model", s->model_name);
	return o;
}

/* One choice: text (len bytes; NULL for none) and finish (NULL: null). */
static cJSON *choice_json(const struct req *r, int stream, const char *text, size_t len, const char *finish)
{
	cJSON *ch = cJSON_CreateObject();
	cJSON_AddNumberToObject(ch, "index", 0);
	char *t = sfw_malloc(len + 1);
	if (!t) {
		cJSON_Delete(ch);
		return NULL;
	}
	memcpy(t, text ? text : "", len);
	t[len] = 0;
	if (r->p.kind == SFW_SERVE_CHAT) {
		cJSON *m = cJSON_AddObjectToObject(ch, stream ? "delta" : "message");
		if (!stream || !r->sent_role)
			cJSON_AddStringToObject(m, "role", "assistant");
		if (!stream || text)
			cJSON_AddStringToObject(m, "content", t);
	} else {
		cJSON_AddStringToObject(ch, "text", t);
		cJSON_AddNullToObject(ch, "logprobs");
	}
	sfw_free(t);
	if (finish)
		cJSON_AddStringToObject(ch, "finish_reason", finish);
	else
		cJSON_AddNullToObject(ch, "finish_reason");
	return ch;
}

/* ---- streaming ------------------------------------------------------------------- */

static int sse_put(struct req *r, cJSON *o)
{
	char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	if (!txt)
		return 0;
	int ok = sfw_buf_append(&r->sse, "data: ", 6) == SFW_OK &&
		 sfw_buf_append(&r->sse, txt, strlen(txt)) == SFW_OK &&
		 sfw_buf_append(&r->sse, "\n\n", 2) == SFW_OK;
	cJSON_free(txt);
	return ok;
}

static cJSON *chunk_json(const struct sfw_server *s, struct req *r, const char *text, size_t len,
			 const char *fin)
{
	cJSON *o = head_json(s, r, r->p.kind == SFW_SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
	cJSON *arr = cJSON_AddArrayToObject(o, "choices");
	cJSON *ch = choice_json(r, 1, text, len, fin);
	if (!arr || !ch) {
		cJSON_Delete(ch);
		cJSON_Delete(o);
		return NULL;
	}
	cJSON_AddItemToArray(arr, ch);
	r->sent_role = 1;
	return o;
}

/* MHD's content reader: the next SSE bytes of the stream. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct req *r = cls;
	struct sfw_server *s = r->srv;
	pthread_mutex_lock(&s->mu);
	while (r->sse.len == 0) {
		if (r->sent_done) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		int w = wait_output_locked(s, r, 1);
		if (w == 0) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		int ok = 1;
		if (w == 2) { /* FIN: a comment line, which SSE readers skip */
			ok = sfw_buf_append(&r->sse, ":\n\n", 3) == SFW_OK;
		} else if (r->out.len) {
			/* the pieces made since the last read, one event each: taken
			 * out under the lock (the engine appends to the emptied pair
			 * meanwhile), made into events outside it, as only this
			 * connection's thread touches sse, taken and sent_role */
			struct sfw_buf t = r->taken;
			size_t *tc = r->taken_cuts, tcap = r->taken_cap, nc = r->ncuts;
			r->taken = r->out, r->taken_cuts = r->cuts, r->taken_cap = r->capcuts;
			r->out = t, r->cuts = tc, r->capcuts = tcap;
			r->out.len = 0, r->ncuts = 0;
			pthread_mutex_unlock(&s->mu);
			size_t a = 0;
			for (size_t i = 0; ok && i < nc; i++) {
				ok = sse_put(r, chunk_json(s, r, r->taken.data + a, r->taken_cuts[i] - a, NULL));
				a = r->taken_cuts[i];
			}
			pthread_mutex_lock(&s->mu);
		} else if (r->done && r->error[0]) {
			struct sfw_serve_error e;
			memset(&e, 0, sizeof(e));
			e.http = 500;
			e.type = "server_error";
			snprintf(e.message, sizeof(e.message), "%s", r->error);
			char *t = sfw_serve_error_json(&e);
			ok = t && sfw_buf_append(&r->sse, "data: ", 6) == SFW_OK &&
			     sfw_buf_append(&r->sse, t, strlen(t)) == SFW_OK &&
			     sfw_buf_append(&r->sse, "\n\ndata: [DONE]\n\n", 16) == SFW_OK;
			sfw_free(t);
			r->sent_done = 1;
		} else if (r->done) {
			ok = sse_put(r, chunk_json(s, r, NULL, 0, finish_reason(r->finish)));
			if (ok && r->p.include_usage) {
				cJSON *o = head_json(s, r,
						     r->p.kind == SFW_SERVE_CHAT ? "chat.completion.chunk"
										 : "text_completion");
				cJSON_AddArrayToObject(o, "choices");
				cJSON_AddItemToObject(o, "usage", usage_json(r));
				ok = sse_put(r, o);
			}
			ok = ok && sfw_buf_append(&r->sse, "data: [DONE]\n\n", 14) == SFW_OK;
			r->sent_done = 1;
		}
		if (!ok) {
			r->cancelled = 1;
			pthread_cond_signal(&s->engine_cv);
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
	size_t n = r->sse.len < max ? r->sse.len : max;
	memcpy(buf, r->sse.data, n);
	memmove(r->sse.data, r->sse.data + n, r->sse.len - n);
	r->sse.len -= n;
	pthread_mutex_unlock(&s->mu);
	return (ssize_t)n;
}

/* MHD is through with the stream (finished, or the client went away). */
static void stream_free(void *cls)
{
	struct req *r = cls;
	struct sfw_server *s = r->srv;
	pthread_mutex_lock(&s->mu);
	if (!r->done) {
		r->cancelled = 1;
		pthread_cond_signal(&s->engine_cv);
	}
	req_unref_locked(r); /* s->active drops in on_completed, once the stream's end is sent */
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

struct conn {
	enum route rt;
	int method_ok, checked, too_big;
	int counted; /* an accepted request: s->active drops when its reply is sent */
	int refuse;  /* 503 or 429 decided before the body (which is dropped) */
	int http11;
	struct sfw_buf body;
};

static enum MHD_Result handle_models(struct sfw_server *s, struct MHD_Connection *c)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "list");
	cJSON *arr = cJSON_AddArrayToObject(o, "data");
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "id", s->model_name);
	cJSON_AddStringToObject(m, "object", "model");
	cJSON_AddNumberToObject(m, "created", (double)time(NULL));
	cJSON_AddStringToObject(m, "owned_by", "salafw");
	cJSON_AddNumberToObject(m, "max_model_len", (double)s->p.max_context);
	cJSON_AddItemToArray(arr, m);
	return send_json(s, c, R_MODELS, 200, o);
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

/* A validated request becomes a struct req: prompt ids, sampler, stream
 * parameters. Returns 0 with e filled when it cannot be served. */
static struct req *make_req(struct sfw_server *s, struct sfw_serve_req *p, struct sfw_serve_error *e)
{
	struct req *r = sfw_calloc(1, sizeof(*r));
	struct sfw_err err = {0};
	enum sfw_status st = SFW_OK;
	memset(e, 0, sizeof(*e));
	e->http = 500;
	e->type = "server_error";
	if (!r) {
		snprintf(e->message, sizeof(e->message), "out of memory");
		sfw_serve_req_release(p);
		return NULL;
	}
	r->p = *p;
	memset(p, 0, sizeof(*p));
	r->srv = s;
	r->seq = -1;
	pthread_cond_init(&r->cv, NULL);
	sfw_buf_init(&r->out, OUT_MAX);
	sfw_buf_init(&r->taken, OUT_MAX);
	sfw_buf_init(&r->sse, OUT_MAX + (1u << 20));
	r->refs = 1;
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
	if (r->p.kind == SFW_SERVE_CHAT) {
		struct sfw_buf t;
		sfw_buf_init(&t, 2 * SFW_SERVE_BODY_MAX);
		st = sfw_chat_format(r->p.msgs, r->p.n_msgs, 1, &t, &err);
		if (st == SFW_OK)
			st = sfw_tokenizer_encode(s->tok, t.data ? t.data : "", t.len, 1, &r->ids, &r->n_ids,
						  &err);
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
		snprintf(e->param, sizeof(e->param), "%s",
			 r->p.kind == SFW_SERVE_CHAT ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message), "%s", err.msg);
		goto fail;
	}
	if ((int64_t)r->n_ids > s->p.max_context || r->n_ids == 0) {
		e->http = 400;
		e->type = "invalid_request_error";
		e->code = "context_length_exceeded";
		snprintf(e->param, sizeof(e->param), "%s",
			 r->p.kind == SFW_SERVE_CHAT ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message),
			 "the prompt has %zu tokens; this server's context is %lld tokens", r->n_ids,
			 (long long)s->p.max_context);
		goto fail;
	}
	struct sfw_op_sample_params sp = sfw_sampler_default_params();
	sp.top_p = (float)r->p.top_p;
	sp.top_k = r->p.top_k;
	if (r->p.temperature < 1e-6) { /* 0, or too small to divide by: greedy */
		sp.greedy = 1;
		sp.temperature = 1;
	} else {
		sp.temperature = (float)r->p.temperature;
	}
	uint64_t seed = r->p.seed;
	if (!r->p.have_seed && getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
		seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)r << 16);
	if ((st = sfw_sampler_init(&r->smp, &sp, seed, s->vocab, &err)) != SFW_OK) {
		snprintf(e->message, sizeof(e->message), "%s", err.msg);
		goto fail;
	}
	r->smp_ok = 1;
	r->gp = sfw_gen_default_params();
	r->gp.max_tokens = r->p.max_tokens ? r->p.max_tokens : r->p.kind == SFW_SERVE_COMPLETION ? 16 : 0;
	r->gp.max_ctx = s->p.max_context;
	r->gp.eos = r->p.ignore_eos ? &s->no_eos : &s->eos;
	r->gp.stop = r->p.stop;
	r->gp.n_stop = r->p.n_stop;
	if ((st = sfw_gen_stream_init(&r->gs, s->tok, sfw_model_config(s->m), &r->gp, r->ids, r->n_ids,
				      &err)) != SFW_OK) {
		r->gs_ok = 1;
		e->http = st == SFW_E_INVAL ? 400 : 500;
		if (e->http == 400) { /* the stop strings are the client's values it checks */
			e->type = "invalid_request_error";
			snprintf(e->param, sizeof(e->param), "stop");
		}
		snprintf(e->message, sizeof(e->message), "%s", err.msg);
		goto fail;
	}
	r->gs_ok = 1;
	r->created = (long long)time(NULL);
	return r;
fail:
	pthread_mutex_lock(&s->mu);
	req_unref_locked(r);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* Whether a completion request can be taken now (srv->mu held): 0, 503
 * while draining, 429 when the queue is full. Checked before the body is
 * kept or tokenized, and again when the request joins the queue. */
static int cannot_take_locked(const struct sfw_server *s)
{
	return s->draining ? 503 : s->nqueue + s->nrun >= s->p.max_queue + s->p.max_running ? 429 : 0;
}

static int cannot_take(struct sfw_server *s)
{
	pthread_mutex_lock(&s->mu);
	int code = cannot_take_locked(s);
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
				rt == R_CHAT ? SFW_SERVE_CHAT : SFW_SERVE_COMPLETION, s->model_name, s->vocab,
				&p, &e) != SFW_OK) {
		sfw_serve_req_release(&p);
		return send_error(s, c, rt, &e, NULL);
	}
	struct req *r = make_req(s, &p, &e);
	if (!r)
		return send_error(s, c, rt, &e, NULL);
	r->conn = c;
	r->http11 = cs->http11;
	pthread_mutex_lock(&s->mu);
	if ((code = cannot_take_locked(s)) != 0) {
		req_unref_locked(r);
		pthread_mutex_unlock(&s->mu);
		return refuse(s, c, rt, code);
	}
	r->id = ++s->next_id;
	r->t_arrive = sfw_now_s();
	r->refs = 2; /* the connection and the engine */
	if (s->qtail)
		s->qtail->next = r;
	else
		s->qhead = r;
	s->qtail = r;
	s->nqueue++;
	s->active++; /* until on_completed: the reply has been sent */
	cs->counted = 1;
	s->mt.prompt_tokens += r->n_ids;
	pthread_cond_signal(&s->engine_cv);
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
		enum MHD_Result ret = MHD_queue_response(c, 200, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	/* not streamed: the whole reply, then one response */
	wait_output_locked(s, r, 0);
	enum MHD_Result ret = MHD_NO;
	if (!r->done) { /* the client went away */
	} else if (r->aborted) {
		pthread_mutex_unlock(&s->mu);
		ret = fail_with(s, c, rt, 503, "server_error", NULL, ABORT_MSG, NULL);
		pthread_mutex_lock(&s->mu);
	} else if (r->error[0]) {
		pthread_mutex_unlock(&s->mu);
		ret = fail_with(s, c, rt, 500, "server_error", NULL, r->error, NULL);
		pthread_mutex_lock(&s->mu);
	} else {
		cJSON *o = head_json(s, r, rt == R_CHAT ? "chat.completion" : "text_completion");
		cJSON *arr = cJSON_AddArrayToObject(o, "choices");
		cJSON *ch = choice_json(r, 0, r->out.data, r->out.len, finish_reason(r->finish));
		if (arr && ch) {
			cJSON_AddItemToArray(arr, ch);
			cJSON_AddItemToObject(o, "usage", usage_json(r));
		} else {
			cJSON_Delete(ch);
			cJSON_Delete(o);
			o = NULL;
		}
		pthread_mutex_unlock(&s->mu);
		ret = send_json(s, c, rt, 200, o);
		pthread_mutex_lock(&s->mu);
	}
	req_unref_locked(r); /* s->active drops in on_completed, once the reply is sent */
	pthread_mutex_unlock(&s->mu);
	return ret;
}

static enum route route_of(const char *url)
{
	for (int r = R_HEALTH; r < R__COUNT; r++)
		if (!strcmp(url, route_path[r]))
			return (enum route)r;
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
		cs->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
		*con_cls = cs;
		int post = cs->rt == R_COMPLETIONS || cs->rt == R_CHAT;
		/* a coding other than chunked hides where the body ends (RFC 9112 §6.1: 501) */
		const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
		if (te && !is_chunked(te))
			return fail_with(s, c, cs->rt, 501, "invalid_request_error", NULL,
					 "the Transfer-Encoding is not supported (only chunked is)", NULL);
		if (cs->rt == R_NONE)
			return fail_with(s, c, R_NONE, 404, "invalid_request_error", NULL, "no such endpoint",
					 NULL);
		if (strcmp(method, post ? "POST" : "GET"))
			return fail_with(s, c, cs->rt, 405, "invalid_request_error", NULL,
					 post ? "this endpoint takes POST" : "this endpoint takes GET", NULL);
		if (cs->rt == R_MODELS || post) {
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
	p.model_name = "salafw";
	p.max_running = 16;
	p.max_queue = 256;
	p.max_context = 4096;
	p.prefill_chunk = 256;
	p.receive_timeout = 60;
	p.conns_per_ip = 128;
	return p;
}

int sfw_serve_port(const struct sfw_server *s)
{
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	return di ? di->port : s->p.port;
}

struct sfw_batch_params sfw_serve_batch_params(const struct sfw_serve_params *p)
{
	struct sfw_batch_params bp = sfw_batch_default_params();
	bp.max_seqs = p->max_running;
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
	snprintf(s->model_name, sizeof(s->model_name), "%s", p->model_name ? p->model_name : "salafw");
	s->p.model_name = s->model_name;
	if (p->api_key) {
		s->have_key = 1;
		crypto_hash_sha256(s->key_hash, (const unsigned char *)p->api_key, strlen(p->api_key));
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->engine_cv, NULL);
	pthread_cond_init(&s->idle_cv, NULL);
	pthread_cond_init(&s->watch_cv, NULL);
	pthread_cond_init(&s->tok_cv, NULL);
	/* the cheap bounds: prompt text a context can hold, and the body that can carry it */
	uint64_t tm = 0, bm = 0;
	if (!sfw_mul_ok((uint64_t)p->max_context, token_bytes_max(tok), &tm) || tm > SFW_SERVE_BODY_MAX)
		tm = SFW_SERVE_BODY_MAX;
	bm = tm * BODY_TEXT_X + BODY_FRAME;
	s->text_max = (size_t)tm;
	s->body_max = bm < SFW_SERVE_BODY_MAX ? (size_t)bm : SFW_SERVE_BODY_MAX;
	struct sfw_batch_params bp = sfw_serve_batch_params(p);
	enum sfw_status st = sfw_batch_new(m, &bp, &s->b, err);
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
