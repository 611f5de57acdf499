/* serve.h - an OpenAI-compatible HTTP server over the batched engine.
 *
 * HTTP is libmicrohttpd's (one thread per connection, so a streaming or
 * waiting request blocks only its own thread); one engine thread runs the
 * scheduler: continuous batching on runner/batch.h, where new requests join
 * the running batch between decode steps and a long prompt is prefilled in
 * chunks of at most prefill_chunk tokens per step, so running streams keep
 * flowing. Each request's sampling and stop handling is a struct
 * sfw_gen_stream (runner/generate.h), the same as `salafw run`'s. The n
 * choices of a request share one prefill: the first prefills the prompt,
 * the others fork its sequence (sfw_batch_seq_fork) and draw their first
 * token from its logits; a choice the batch has no sequence or blocks to
 * fork into prefills the prompt itself.
 *
 * Endpoints: GET /v1/models, GET /v1/models/{id}, POST /v1/completions,
 * POST /v1/chat/completions (stream: true as server-sent events ending in
 * "data: [DONE]"), POST /tokenize, POST /detokenize, GET /health, GET
 * /metrics (Prometheus text); HEAD wherever GET is, OPTIONS (CORS
 * preflights) everywhere. One log line per request on stderr unless quiet. Errors are OpenAI error objects
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

#include "formats/chat.h"
#include "formats/tokenizer.h"
#include "runner/batch.h"
#include "runner/generate.h"
#include "sfw.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#define SFW_SERVE_BODY_MAX (64u << 20) /* request body bytes, at most (a 1M-token prompt of ids is ~7 MB) */
#define SFW_SERVE_MSGS_MAX 4096	      /* chat messages per request */
#define SFW_SERVE_IDS_MAX (1u << 24)  /* prompt token ids per request */
#define SFW_SERVE_RECV_MAX 128	      /* connections waiting for (the rest of) a request */

/* ---- requests (serve/req.c) ------------------------------------------------ */

#define SFW_SERVE_N_MAX 8	    /* choices per request (n) */
#define SFW_SERVE_BIAS_MAX 1024	    /* logit_bias entries */
#define SFW_SERVE_UNKNOWN_MAX 16    /* ignored field names reported per request */
#define SFW_SERVE_NAMES_MAX 16	    /* model ids one server answers to */

enum sfw_serve_kind { SFW_SERVE_COMPLETION, SFW_SERVE_CHAT };

/* A request that cannot be served: its HTTP status (400, 404, 413) and the
 * OpenAI error object's fields. param is "" when the error names no field. */
struct sfw_serve_error {
	int http;
	const char *type; /* "invalid_request_error" */
	const char *code; /* NULL, or e.g. "model_not_found" */
	char param[64];
	char message[512];
};
/* Library-internal (req.c, api.c): fills e (type by status, the strings cut
 * at a whole UTF-8 character) and returns SFW_E_INVAL. */
enum sfw_status sfwi_serve_fail(struct sfw_serve_error *e, int http, const char *param, const char *fmt, ...)
    SFW_PRINTF(4, 5);

/* Which sampling fields the request set (the others take the server's
 * defaults: the model's generation_config.json). */
enum {
	SFW_SERVE_SET_TEMPERATURE = 1 << 0,
	SFW_SERVE_SET_TOP_P = 1 << 1,
	SFW_SERVE_SET_TOP_K = 1 << 2,
	SFW_SERVE_SET_MIN_P = 1 << 3,
	SFW_SERVE_SET_REPETITION = 1 << 4,
};

enum sfw_serve_tool_choice { SFW_TOOLS_NONE, SFW_TOOLS_AUTO, SFW_TOOLS_REQUIRED, SFW_TOOLS_NAMED };

/* A parsed, validated request. Strings point into root (the parsed body).
 * Fields salafw does not know are ignored: their names are in unknown[]
 * (the server logs each name once). Fields of features salafw lacks are
 * refused only when their value would change the answer. */
struct sfw_serve_req {
	enum sfw_serve_kind kind;
	cJSON *root;
	const char *model;
	const char *prompt;  /* completion: text, or NULL when prompt_ids */
	int32_t *prompt_ids; /* completion: token ids (sfw_malloc) */
	size_t n_prompt_ids;
	/* chat: the messages (root's "messages", validated) as role/content
	 * pairs; the template reads them through sfw_chat_messages_normalize */
	struct sfw_chat_msg *msgs; /* (sfw_malloc; content may be a joined copy in owned) */
	size_t n_msgs;
	char **owned; /* joined content parts, freed with the request */
	size_t n_owned;
	int has_tool_msgs;		   /* a tool message or an assistant's tool_calls */
	const cJSON *tools;		   /* chat: the tools list, or NULL */
	enum sfw_serve_tool_choice tool_choice; /* default: auto with tools, none without */
	const char *tool_name;		   /* SFW_TOOLS_NAMED: the function */
	const cJSON *template_kwargs;	   /* chat_template_kwargs, or NULL */
	int add_generation_prompt;	   /* default 1 */
	int64_t max_tokens; /* 0 = not given */
	unsigned set;	    /* SFW_SERVE_SET_* */
	double temperature; /* the request's values where set has their bit */
	double top_p;
	int top_k; /* 0 = off */
	double min_p, repetition_penalty, presence_penalty, frequency_penalty;
	struct sfw_sample_adj *bias; /* logit_bias: id and bias (sfw_malloc) */
	size_t n_bias;
	int logprobs;	  /* 1: the chosen tokens' logprobs asked for */
	int top_logprobs; /* 0 .. SFW_SAMPLE_TOP_MAX */
	int n;		  /* choices, 1 .. SFW_SERVE_N_MAX */
	int skip_special; /* special tokens show no text (default 1) */
	int have_seed;
	uint64_t seed;
	const char *stop[SFW_STOP_MAX];
	size_t n_stop;
	int stream;
	int include_usage; /* stream_options.include_usage */
	int ignore_eos;	   /* vLLM's extension: end-of-sequence ids do not stop it */
	int token_ids;	   /* vLLM's return_tokens_as_token_ids: the logprobs name tokens "token_id:N" */
	const char *unknown[SFW_SERVE_UNKNOWN_MAX];
	size_t n_unknown;
};

/* Parses body (len bytes, untrusted) as a request of kind for a server
 * answering to the model ids names[0 .. n_names) with vocab token ids:
 * strict JSON (core/json.h), known fields of the right types and ranges.
 * SFW_OK, or SFW_E_INVAL with e filled (404 model_not_found for a model not
 * served; names NULL: 'model' optional and not checked). Release r (also
 * after a failure). */
SFW_MUST_CHECK enum sfw_status sfw_serve_req_parse(const char *body, size_t len, enum sfw_serve_kind kind,
						   const char *const *names, size_t n_names, int vocab,
						   struct sfw_serve_req *r, struct sfw_serve_error *e);
void sfw_serve_req_release(struct sfw_serve_req *r);

/* ---- the other endpoints' bodies (serve/api.c) ------------------------------ */

/* The prompt text of a chat request: its messages (and tools unless
 * tool_choice is none) through the chat template, with the generation
 * prompt as asked; then, for tool_choice required or named, the start of a
 * call the reply is made to continue (*forced: that part, within out, which
 * the reply's parser reads first; empty otherwise). */
SFW_MUST_CHECK enum sfw_status sfw_serve_chat_prompt(const struct sfw_chat_template *t,
						     const struct sfw_serve_req *r, struct sfw_buf *out,
						     size_t *forced_at, struct sfw_err *err);
/* POST /tokenize (vLLM's shape): {"model"?, "prompt": S, "add_special_tokens"?}
 * or {"model"?, "messages": [...], "add_generation_prompt"?, ...} ->
 * {"count", "max_model_len", "tokens", "token_strs": null}. POST /detokenize:
 * {"model"?, "tokens": [ids]} -> {"prompt": S}. A named model must be one of
 * names. *out: JSON text (sfw_malloc'd). */
SFW_MUST_CHECK enum sfw_status sfw_serve_tokenize(const char *body, size_t len, const char *const *names,
						  size_t n_names, const struct sfw_tokenizer *tok,
						  const struct sfw_chat_template *chat, int64_t max_context,
						  char **out, struct sfw_serve_error *e);
SFW_MUST_CHECK enum sfw_status sfw_serve_detokenize(const char *body, size_t len, const char *const *names,
						    size_t n_names, const struct sfw_tokenizer *tok,
						    char **out, struct sfw_serve_error *e);
/* 1 when origin may read the answers under allowed (sfw_serve_params). */
int sfw_serve_origin_allowed(const char *allowed, const char *origin);
/* The OpenAI error object of e as JSON text (sfw_malloc'd, NUL-terminated). */
char *sfw_serve_error_json(const struct sfw_serve_error *e);

/* ---- the server (serve/server.c) -------------------------------------------- */

struct sfw_serve_params {
	const char *host;    /* address to bind; default "127.0.0.1" */
	int port;	     /* 0: any free port (sfw_serve_port says which) */
	const char *api_key; /* NULL: no key asked for */
	/* the model ids requests may name; the first n_listed are what
	 * /v1/models lists (the others are accepted aliases) */
	const char *model_names[SFW_SERVE_NAMES_MAX];
	int n_names, n_listed;
	/* CORS: NULL answers no origin (no Access-Control-Allow-Origin); "*" any;
	 * else a comma-separated list of origins (scheme://host[:port]) */
	const char *allowed_origins;
	int quiet;			      /* no request log lines on stderr */
	const struct sfw_chat_template *chat; /* the chat template (borrowed) */
	struct sfw_gen_defaults defaults;     /* sampling defaults of requests */
	int max_running;		      /* sequences in the batch at once (<= 64) */
	int max_queue;			      /* requests waiting beyond those; more get 429 */
	int64_t max_context;		      /* positions per sequence (prompt + reply) */
	int prefill_chunk;		      /* prompt tokens per engine step, over all sequences */
	int64_t pool_tokens;		      /* KV pool positions; 0 = max_running * max_context */
	/* the prefix cache (runner/prefix.h): every request's prompt state is
	 * kept after its prefill (prompts of at least prefix_min_tokens; long
	 * ones also each prefix_every tokens on the way), and a
	 * later prompt that starts with a kept one forks it and prefills only
	 * the rest. Its entries take up to prefix_entries sequences beside
	 * max_running (the batch's max_seqs, at most 64 in all) and KV blocks
	 * of the pool, given back when running sequences need them.
	 * prefix_cache_bytes: the entries' state together (sfw_batch_seq_bytes);
	 * 0 = off, < 0 = half the KV pool's bytes (sfw_serve_prefix_bytes) */
	int64_t prefix_cache_bytes;
	int prefix_entries;
	int64_t prefix_min_tokens;
	int64_t prefix_every; /* also keep a long prompt's state each time its prefill passes a multiple of this */
	double receive_timeout; /* seconds to receive a request's headers and body; 0 = no limit */
	int conns_per_ip;	/* open connections per client address; 0 = no limit */
};
struct sfw_serve_params sfw_serve_default_params(void);
/* The batch the server runs for p (runner/batch.h): max_running sequences of
 * max_context, the pool (every sequence to max_context in whole 64-token
 * blocks unless pool_tokens), a step of every decode row and the prefill
 * budget. The CLI plans device memory from it. */
struct sfw_batch_params sfw_serve_batch_params(const struct sfw_serve_params *p);
/* The prefix cache's entries beside max_running (0 when it is off). */
int sfw_serve_prefix_entries(const struct sfw_serve_params *p);

struct sfw_model;
/* The prefix cache's budget in bytes for p on model m: prefix_cache_bytes,
 * or (< 0) half of the KV pool's bytes; 0 when it is off. */
int64_t sfw_serve_prefix_bytes(const struct sfw_serve_params *p, const struct sfw_model *m);
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
