/* generate.h - text generation on a context: append a prompt, sample until a
 * stop condition, stream the tokens with UTF-8-safe text pieces.
 *
 * sfw_generate appends its prompt to whatever the context already holds (a
 * fresh context: the whole prompt; a chat: only the new turn, the history
 * stays in the caches), then samples with the caller's sampler (one uniform
 * per token, so a seed fixes the output) until
 *   - an end-of-sequence id comes (finish EOS; the id is neither fed nor
 *     shown),
 *   - the text ends in a stop string (finish STOP; the text before it is
 *     shown, the stop string is not),
 *   - max_tokens tokens were made, or the context reached max_ctx (LENGTH),
 *   - the callback asked to stop (CANCEL).
 * The last token made is never fed to the context (nobody would read its
 * logits): stats.pending names it, and a chat feeds it first on the next
 * turn. Text pieces hold only complete UTF-8 characters (the tokenizer's
 * streaming decoder holds back partial byte-fallback sequences) and never a
 * tail that may still grow into a stop string: that tail is held back and
 * shown once it cannot, or at the end. */
#ifndef SFW_GENERATE_H
#define SFW_GENERATE_H

#include "formats/config.h"
#include "formats/tokenizer.h"
#include "runner/runner.h"
#include "runner/sampler.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

#define SFW_STOP_MAX 16 /* stop strings per call (each at most SFW_STOP_MAX_LEN bytes) */

/* ---- end-of-sequence ids (the set and its parsers: formats/config.h) -------- */

/* The model directory's set: config.json's eos_token_id (cf), then
 * DIR/generation_config.json's, then DIR/tokenizer_config.json's eos_token
 * mapped through tok (a special token it must know; skipped when tok is
 * NULL). Missing files add nothing; unreadable or bad ones are errors. */
SFW_MUST_CHECK enum sfw_status sfw_eos_load(const char *dir, const struct sfw_config *cf,
					    const struct sfw_tokenizer *tok, struct sfw_eos_set *out,
					    struct sfw_err *err);

/* ---- generation ------------------------------------------------------------ */

enum sfw_finish { SFW_FINISH_NONE, SFW_FINISH_EOS, SFW_FINISH_STOP, SFW_FINISH_LENGTH, SFW_FINISH_CANCEL };
const char *sfw_finish_name(enum sfw_finish f); /* "eos", "stop", "length", "cancel", "none" */

struct sfw_gen_params {
	/* the prompt to append: ids, or (ids NULL) text encoded with the tokenizer
	 * (BOS first when the context is empty) */
	const int32_t *ids;
	size_t n_ids;
	const char *text;
	size_t text_len;
	int64_t max_tokens;	       /* tokens to make at most; 0 = no limit but max_ctx */
	int64_t max_ctx;	       /* context positions at most (prompt included); 0 = none */
	const struct sfw_eos_set *eos; /* NULL: config.json's eos_token_id; n = 0: never */
	const char *const *stop;       /* stop strings (UTF-8, 1..SFW_STOP_MAX_LEN bytes) */
	size_t n_stop;
	const int32_t *force; /* [n_force]: token i is force[i] instead of a sample (scoring) */
	size_t n_force;
	int skip_special; /* special tokens show no text */
	/* The first n_cached ids of the prompt are in the context already (a
	 * state loaded with sfw_ctx_state_load, the context's last n_cached
	 * positions): only the rest is prefilled, as one call; when they are
	 * all of it, the first token is chosen from the logits the state
	 * brought (sfw_ctx_next_from_last). The whole prompt still primes the
	 * text decoder, and max_ctx counts it. 0: all of it is new. */
	size_t n_cached;
	/* Called once when the prompt is in the context and the first token
	 * chosen (not yet fed): ids[0..n) the prompt of this call (a prompt
	 * cache saves the state here; the callback reports its own problems). */
	void (*on_prompt)(void *user, struct sfw_ctx *ctx, const int32_t *ids, size_t n);
	void *prompt_user;
};
struct sfw_gen_params sfw_gen_default_params(void);

/* One token made: its id and the text that became showable with it (may be
 * empty, held back). At the end one more call with id -1 flushes what was
 * held. Return nonzero to stop (finish CANCEL). */
struct sfw_gen_token {
	int32_t id;
	int64_t index;	  /* 0-based among the tokens made; -1 for the flush */
	const char *text; /* len bytes of complete UTF-8, not NUL-terminated */
	size_t len;
};
typedef int (*sfw_gen_fn)(void *user, const struct sfw_gen_token *t);

struct sfw_gen_stats {
	int64_t prompt_tokens; /* tokens prefilled by this call (n_cached not counted) */
	int64_t tokens;	       /* tokens made (the EOS id, when it came, not counted) */
	int64_t decode_steps;  /* one-token forward passes */
	double prefill_s, decode_s;
	enum sfw_finish finish;
	int32_t pending; /* the last token made (or the EOS id), not fed; -1 if none */
	int64_t ctx_pos; /* the context's position after the call */
};

/* tok may be NULL for ids-only generation (then no text pieces, and stop
 * strings are SFW_E_INVAL). On error the context may hold part of the prompt
 * or of the reply (sfw_ctx_pos says how much) or refuse calls until reset. */
SFW_MUST_CHECK enum sfw_status sfw_generate(struct sfw_ctx *ctx, const struct sfw_tokenizer *tok,
					    struct sfw_sampler *smp, const struct sfw_gen_params *p,
					    sfw_gen_fn cb, void *user, struct sfw_gen_stats *st,
					    struct sfw_err *err);

/* ---- one sequence's output stream ------------------------------------------
 * The per-sequence half of sfw_generate, for callers that run the forward
 * themselves (the server's batch): push each token made, get the text that
 * became showable with it and whether the sequence has finished. The same
 * rules as sfw_generate: an EOS id (unless forced) finishes with EOS and is
 * neither counted nor shown; a stop string finishes with STOP (the text
 * before it shown); max_tokens tokens, or ctx_pos (the positions the context
 * holds, the token pushed not fed) reaching max_ctx, finish with LENGTH.
 * After any finish but STOP, sfw_gen_stream_flush gives the held tail. */
struct sfw_gen_stream {
	const struct sfw_gen_params *p; /* borrowed: stop strings, limits */
	struct sfw_eos_set eos;
	int64_t tokens; /* tokens made (EOS not counted) */
	int text;	/* a tokenizer: text pieces */
	enum sfw_finish finish;
	struct sfw_buf hold, piece, out;
	struct sfw_tokdec dec;
};
/* Checks p (stop strings, limits; not the prompt fields), takes its EOS set
 * (NULL: cf's eos_token_id) and primes the decoder with the prompt ids (the
 * first piece keeps its leading space). tok may be NULL (ids only). Release
 * with sfw_gen_stream_release, also after a failed init. */
SFW_MUST_CHECK enum sfw_status sfw_gen_stream_init(struct sfw_gen_stream *g, const struct sfw_tokenizer *tok,
						   const struct sfw_config *cf,
						   const struct sfw_gen_params *p, const int32_t *prompt,
						   size_t n, struct sfw_err *err);
/* One token made; forced: a scoring token (never EOS). *text / *len: the
 * showable piece (valid until the next call); *fin: SFW_FINISH_NONE while
 * the sequence goes on. */
SFW_MUST_CHECK enum sfw_status sfw_gen_stream_push(struct sfw_gen_stream *g, int32_t id, int forced,
						   int64_t ctx_pos, const char **text, size_t *len,
						   enum sfw_finish *fin, struct sfw_err *err);
/* Ends the stream (finish CANCEL unless it has finished): the text still
 * held back (empty after STOP). */
SFW_MUST_CHECK enum sfw_status sfw_gen_stream_flush(struct sfw_gen_stream *g, const char **text, size_t *len,
						    struct sfw_err *err);
void sfw_gen_stream_release(struct sfw_gen_stream *g);

/* The longest suffix of text[0..n) that is a proper prefix of one of the
 * stop strings (the part a stream must hold back). */
size_t sfw_stop_holdback(const char *text, size_t n, const char *const *stop, size_t n_stop);

#endif
