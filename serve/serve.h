/* serve.h - an OpenAI-compatible HTTP server over the batched engine.
 *
 * HTTP is libmicrohttpd's (one thread per connection, so a streaming or
 * waiting request blocks only its own thread); one engine thread runs the
 * scheduler: continuous batching on runner/batch.h, where new requests join
 * the running batch between decode steps and a long prompt is prefilled in
 * chunks of at most prefill_chunk tokens per step, so running streams keep
 * flowing. Each request's sampling and stop handling is a struct
 * sfw_gen_stream (runner/generate.h), the same as `salafw run`'s.
 *
 * Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions
 * (stream: true as server-sent events ending in "data: [DONE]"), GET /health,
 * GET /metrics (Prometheus text). Errors are OpenAI error objects
 * {"error": {"message", "type", "param", "code"}}: 400 bad request, 401 bad
 * or missing API key (SHA-256 of both sides compared in constant time), 404,
 * 405, 413 body over SFW_SERVE_BODY_MAX or over what max_context can use,
 * 429 queue full (Retry-After), 501 a transfer coding other than chunked, 503
 * while shutting down. A client that goes away frees its sequence at once; one
 * that only half-closes (sends its last byte and keeps reading) gets its reply.
 *
 * Connections: a request's headers and body must arrive within
 * receive_timeout seconds (from the connection's start, or the end of its
 * last request); at most conns_per_ip connections per client address; and at
 * most SFW_SERVE_RECV_MAX connections waiting for a request at once (a new
 * one closes the one that has waited longest), so that connections beyond
 * those and the accepted requests stay free for /health and /metrics.
 *
 * The request parser (sfw_serve_req_parse) uses no engine: the fuzz target
 * tests/fuzz/fuzz_serve_req.c links it alone. */
#ifndef SFW_SERVE_H
#define SFW_SERVE_H

#include "formats/tokenizer.h"
#include "runner/batch.h"
#include "runner/generate.h"
#include "sfw.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#define SFW_SERVE_BODY_MAX (4u << 20) /* request body bytes */
#define SFW_SERVE_MSGS_MAX 4096	      /* chat messages per request */
#define SFW_SERVE_IDS_MAX (1u << 24)  /* prompt token ids per request */
#define SFW_SERVE_RECV_MAX 128	      /* connections waiting for (the rest of) a request */

/* ---- requests (serve/req.c) ------------------------------------------------ */

enum sfw_serve_kind { SFW_SERVE_COMPLETION, SFW_SERVE_CHAT };

/* A request that cannot be served: its HTTP status (400) and the OpenAI
 * error object's fields. param is "" when the error names no field. */
struct sfw_serve_error {
	int http;
	const char *type; /* "invalid_request_error" */
	const char *code; /* NULL, or e.g. "model_not_found" */
	char param[64];
	char message[512];
};

/* A parsed, validated request. Strings point into root (the parsed body). */
struct sfw_serve_req {
	enum sfw_serve_kind kind;
	cJSON *root;
	const char *model;
	const char *prompt;  /* completion: text, or NULL when prompt_ids */
	int32_t *prompt_ids; /* completion: token ids (sfw_malloc) */
	size_t n_prompt_ids;
	struct sfw_chat_msg *msgs; /* chat (sfw_malloc; content may be a joined copy in text) */
	size_t n_msgs;
	char **owned; /* joined content parts, freed with the request */
	size_t n_owned;
	int64_t max_tokens; /* 0 = not given */
	double temperature; /* default 1 */
	double top_p;	    /* default 1 */
	int top_k;	    /* 0 = off */
	int have_seed;
	uint64_t seed;
	const char *stop[SFW_STOP_MAX];
	size_t n_stop;
	int stream;
	int include_usage; /* stream_options.include_usage */
	int ignore_eos;	   /* vLLM's extension: end-of-sequence ids do not stop it */
};

/* Parses body (len bytes, untrusted) as a request of kind for the model
 * named served_model with vocab token ids: strict JSON (core/json.h), known
 * fields of the right types and ranges, n = 1, no feature salafw does not
 * have (logprobs, echo, suffix, penalties, logit_bias, tools) asked for.
 * SFW_OK, or SFW_E_INVAL with e filled. Release r (also after a failure). */
SFW_MUST_CHECK enum sfw_status sfw_serve_req_parse(const char *body, size_t len, enum sfw_serve_kind kind,
						   const char *served_model, int vocab,
						   struct sfw_serve_req *r, struct sfw_serve_error *e);
void sfw_serve_req_release(struct sfw_serve_req *r);
/* The OpenAI error object of e as JSON text (sfw_malloc'd, NUL-terminated). */
char *sfw_serve_error_json(const struct sfw_serve_error *e);

/* ---- the server (serve/server.c) -------------------------------------------- */

struct sfw_serve_params {
	const char *host;	/* address to bind; default "127.0.0.1" */
	int port;		/* 0: any free port (sfw_serve_port says which) */
	const char *api_key;	/* NULL: no key asked for */
	const char *model_name; /* the one model id served */
	int max_running;	/* sequences in the batch at once (<= 64) */
	int max_queue;		/* requests waiting beyond those; more get 429 */
	int64_t max_context;	/* positions per sequence (prompt + reply) */
	int prefill_chunk;	/* prompt tokens per engine step, over all sequences */
	int64_t pool_tokens;	/* KV pool positions; 0 = max_running * max_context */
	double receive_timeout; /* seconds to receive a request's headers and body; 0 = no limit */
	int conns_per_ip;	/* open connections per client address; 0 = no limit */
};
struct sfw_serve_params sfw_serve_default_params(void);
/* The batch the server runs for p (runner/batch.h): max_running sequences of
 * max_context, the pool (every sequence to max_context in whole 64-token
 * blocks unless pool_tokens), a step of every decode row and the prefill
 * budget. The CLI plans device memory from it. */
struct sfw_batch_params sfw_serve_batch_params(const struct sfw_serve_params *p);

struct sfw_model;
struct sfw_server;
/* Starts the engine thread and the HTTP daemon on a loaded model. tok and eos
 * are borrowed and must outlive the server. */
SFW_MUST_CHECK enum sfw_status sfw_serve_start(struct sfw_model *m, const struct sfw_tokenizer *tok,
					       const struct sfw_eos_set *eos,
					       const struct sfw_serve_params *p, struct sfw_server **out,
					       struct sfw_err *err);
int sfw_serve_port(const struct sfw_server *s);
/* The drain: from here on a new request gets 503 (the listener stays open,
 * so a load balancer sees a draining server, not a dead one) and /health
 * says "shutting down"; the accepted requests go on. Idempotent. */
void sfw_serve_drain(struct sfw_server *s);
/* Waits up to timeout_s seconds until every accepted request's reply has
 * been sent (libmicrohttpd's completion callback, not the queueing of the
 * response); 1 when none is left. */
int sfw_serve_idle(struct sfw_server *s, double timeout_s);
/* Ends the accepted requests now: a waiting client gets 503, a stream an
 * error event and "data: [DONE]"; waits (a few seconds at most) for those
 * answers to be sent. Returns how many requests it ended. */
int sfw_serve_abort(struct sfw_server *s);
/* The drain, then waits until every accepted request's reply has been sent
 * (or sfw_serve_abort ended them), then stops the daemon and the engine and
 * frees the server. */
void sfw_serve_stop(struct sfw_server *s);

#endif
