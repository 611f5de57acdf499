/* tokenizer.h - the MiniCPM tokenizer (SentencePiece BPE + added special
 * tokens) and fixed ChatML prompts (chat templates: formats/chat.h).
 * Implemented by formats/tokenizer.cpp (a C++ shim over libsentencepiece; no
 * exception crosses this interface) and formats/chat.c. Training a tokenizer is tools/tools.h's sfw_tokenizer_train
 * (libsentencepiece_train is linked only with tools/).
 *
 * Id layout (docs/model-spec.md §4): ids [0, n_pieces) are SentencePiece pieces
 * (0 <unk>, 1 <s>, 2 </s>, byte pieces <0x00>..<0xFF>, BPE pieces); the added
 * special tokens come from tokenizer_config.json's "added_tokens_decoder"
 * when that file exists, else they are the MiniCPM defaults computed from the
 * model's vocab size V:
 *     0 <unk>, 1 <s>, 2 </s>,
 *     V-8 <|im_end|>, V-7 <|im_start|>, V-6 <|tool_call|>, V-5 <|execute_start|>,
 *     V-4 <|execute_end|>, V-3 <|fim_prefix|>, V-2 <|fim_middle|>, V-1 <|fim_suffix|>
 * (V = 73448 gives the real model's 73440..73447).
 *
 * Encoding: the text is split on every special token's literal text (longest
 * match first); special tokens map to their ids and each text segment between
 * them is encoded by SentencePiece on its own. tokenizer_config.json's
 * "legacy" (default true, as in HF and MiniCPM3's config) decides the dummy
 * prefix "▁": legacy gives every segment one (HF's legacy Llama tokenizers);
 * "legacy": false gives it only to a segment preceded by nothing but
 * SentencePiece's own <s> </s> <unk> (HF's prepend_scheme "first").
 * Decoding is the exact inverse: one leading "▁" is dropped from the first text
 * piece wherever encoding added a prefix, so decode(encode(x)) == x for any
 * valid UTF-8 x (given an identity-normalising model, as the ones
 * sfw_tokenizer_train makes and LLaMA/MiniCPM ship). Decoding never adds BOS
 * handling of its own: <s> renders as "<s>" unless skip_special.
 *
 * Thread safety: a loaded tokenizer is immutable; encode/decode may run
 * concurrently on it. A decoder (struct sfw_tokdec) belongs to one thread. */
#ifndef SFW_TOKENIZER_H
#define SFW_TOKENIZER_H

#include "buf.h"
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest vocab (model or SentencePiece pieces) a tokenizer may have. */
#define SFW_TOKENIZER_VOCAB_MAX (1 << 24)

struct sfw_tokenizer;

/* Loads DIR/tokenizer.model and, if present, DIR/tokenizer_config.json.
 * model_vocab is the model's vocab_size (config.json; the logits' width), or
 * 0 for "SentencePiece pieces + 8". Every token id the tokenizer can produce
 * must be < model_vocab, else SFW_E_FORMAT. Free with sfw_tokenizer_free. */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_load(const char *model_dir, int model_vocab,
						  struct sfw_tokenizer **out, struct sfw_err *err);
/* Same with explicit paths; config_json may be NULL (then the defaults). */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_load_files(const char *model_path, const char *config_json,
							int model_vocab, struct sfw_tokenizer **out,
							struct sfw_err *err);
void sfw_tokenizer_free(struct sfw_tokenizer *t); /* NULL is a no-op */

/* The model vocab (model_vocab, or pieces + 8 when 0 was given). */
int sfw_tokenizer_vocab(const struct sfw_tokenizer *t);
/* SentencePiece's piece count (ids below it are SentencePiece pieces). */
int sfw_tokenizer_n_pieces(const struct sfw_tokenizer *t);
int32_t sfw_tokenizer_bos(const struct sfw_tokenizer *t); /* <s>: 1 */
int32_t sfw_tokenizer_eos(const struct sfw_tokenizer *t); /* </s>: 2 */
/* The id of a special token by its text ("<|im_end|>"), or -1. */
int32_t sfw_tokenizer_special_id(const struct sfw_tokenizer *t, const char *text);
/* 1 if id is one of the added special tokens (incl. <unk>, <s>, </s>). */
int sfw_tokenizer_is_special(const struct sfw_tokenizer *t, int32_t id);

/* Encodes len bytes of UTF-8 text (NUL bytes allowed; invalid UTF-8 is
 * SFW_E_INVAL). add_bos prepends <s>. *ids is allocated with sfw_malloc (the
 * caller frees it with sfw_free), *n_ids its length; on error *ids is NULL. */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_encode(const struct sfw_tokenizer *t, const char *text,
						    size_t len, int add_bos, int32_t **ids, size_t *n_ids,
						    struct sfw_err *err);

/* Streaming decoder: feed ids one at a time; each push appends only complete,
 * valid UTF-8 to out. Byte-fallback pieces (<0xE2> <0x82> <0xAC>) are held
 * back until they form a character; bytes that can never form one become
 * U+FFFD (one per byte, as SentencePiece does). Special tokens are rendered as
 * their text unless skip_special. Caller-owned: init, push..., flush. */
struct sfw_tokdec {
	const struct sfw_tokenizer *tok; /* borrowed; must outlive the decoder */
	int skip_special;
	int at_start;             /* drop one leading "▁" from the next text piece */
	unsigned char pending[4]; /* held-back bytes of an incomplete character */
	int n_pending;
};
void sfw_tokdec_init(struct sfw_tokdec *d, const struct sfw_tokenizer *t, int skip_special);
/* SFW_E_RANGE for an id outside [0, vocab); SFW_E_NOMEM/E_RANGE from out. */
SFW_MUST_CHECK enum sfw_status sfw_tokdec_push(struct sfw_tokdec *d, int32_t id, struct sfw_buf *out,
					       struct sfw_err *err);
/* Continuing a prompt: feeds the prompt's ids without output, so the first
 * generated piece keeps its space ("is" + "▁Paris" streams " Paris"; a fresh
 * decoder would drop it, as HF's decode of the new ids alone does). Call
 * after init, before the first push. SFW_E_RANGE for a bad id. */
SFW_MUST_CHECK enum sfw_status sfw_tokdec_prime(struct sfw_tokdec *d, const int32_t *ids, size_t n,
						struct sfw_err *err);
/* Emits U+FFFD for held-back bytes of an unfinished character; resets state. */
SFW_MUST_CHECK enum sfw_status sfw_tokdec_flush(struct sfw_tokdec *d, struct sfw_buf *out,
						struct sfw_err *err);
/* Whole-sequence decode = init + push each + flush (appends to out). */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_decode(const struct sfw_tokenizer *t, const int32_t *ids,
						    size_t n, int skip_special, struct sfw_buf *out,
						    struct sfw_err *err);

/* Writes DIR/tokenizer_config.json (add_bos_token true, legacy true,
 * added_tokens_decoder with the default specials for model_vocab, bos <s>,
 * eos <|im_end|>, unk <unk>, the ChatML chat_template) and
 * DIR/special_tokens_map.json, both atomically. mkmodel calls this after
 * sfw_tokenizer_train(NULL, model_vocab - 8, "DIR/tokenizer.model", err). */
SFW_MUST_CHECK enum sfw_status sfw_tokenizer_write_config(const char *dir, int model_vocab,
							  struct sfw_err *err);

/* The embedded default text (formats/corpus.c), NUL-terminated: the corpus
 * sfw_tokenizer_train trains on by default and quant's default calibration text. */
extern const char sfw_default_corpus[];
size_t sfw_default_corpus_len(void);

/* ---- fixed ChatML (formats/chat.c) ----
 * The chat format is formats/chat.h (the model's own template, tool calls);
 * this fixed ChatML prompt stays for callers that take no template.
 * Each message renders as "<|im_start|>{role}\n{content}<|im_end|>\n"; with
 * add_generation_prompt the text ends with "<|im_start|>assistant\n". Encode
 * the result with sfw_tokenizer_encode(..., add_bos = 1, ...) (docs/model-spec.md §4:
 * the tokenizer prepends <s>). role must be non-empty without '\n'. */
struct sfw_chat_msg {
	const char *role; /* "system", "user", "assistant" */
	const char *content;
};
SFW_MUST_CHECK enum sfw_status sfw_chat_format(const struct sfw_chat_msg *msgs, size_t n,
					       int add_generation_prompt, struct sfw_buf *out,
					       struct sfw_err *err);

#ifdef __cplusplus
}
#endif

#endif
