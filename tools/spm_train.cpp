/* spm_train.cpp - sfw_tokenizer_train (tools/tools.h) over libsentencepiece's
 * trainer: the one file that needs libsentencepiece_train, so only binaries
 * that link tools/ link that library. Every exception (std::bad_alloc from
 * the STL, whatever the trainer throws) becomes a status. */
#include <sentencepiece_trainer.h>

#include <cstring>
#include <new>
#include <string>

extern "C" {
#include "alloc.h"
#include "file.h"
#include "json.h" /* sfw_utf8_valid */
#include "formats/tokenizer.h"
#include "tools/tools.h"
}

/* Exported by libsentencepiece (0.1.9x and later) but absent from its
 * installed headers; the trainer logs at INFO level by default. */
namespace sentencepiece {
namespace logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
} // namespace logging
} // namespace sentencepiece

namespace {

constexpr size_t kMaxCorpusBytes = 512u << 20;
constexpr int kMaxVocab = SFW_TOKENIZER_VOCAB_MAX;
constexpr int kMinTrainPieces = 300;

/* Sentence iterator over the lines of a buffer. */
class line_iterator : public sentencepiece::SentenceIterator {
      public:
	line_iterator(const char *p, size_t n) : p_(p), end_(p + n) { Next(); }
	bool done() const override { return done_; }
	void Next() override
	{
		while (p_ < end_) {
			const char *nl = static_cast<const char *>(memchr(p_, '\n', (size_t)(end_ - p_)));
			const char *e = nl ? nl : end_;
			cur_.assign(p_, (size_t)(e - p_));
			if (!cur_.empty() && cur_.back() == '\r')
				cur_.pop_back();
			p_ = nl ? nl + 1 : end_;
			if (!cur_.empty())
				return;
		}
		done_ = true;
	}
	const std::string &value() const override { return cur_; }
	sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

      private:
	const char *p_, *end_;
	std::string cur_;
	bool done_ = false;
};

enum sfw_status train_impl(const char *corpus_path, int n_pieces, const char *out_model_path, struct sfw_err *err)
{
	if (n_pieces < kMinTrainPieces || n_pieces > kMaxVocab)
		return sfw_fail(err, SFW_E_INVAL, "tokenizer vocab size %d out of range [%d, %d]", n_pieces,
				kMinTrainPieces, kMaxVocab);
	struct sfw_buf b;
	sfw_buf_init(&b, kMaxCorpusBytes);
	const char *text = sfw_default_corpus;
	size_t len = sfw_default_corpus_len();
	if (corpus_path) {
		enum sfw_status st = sfw_read_file(corpus_path, kMaxCorpusBytes, &b, err);
		if (st != SFW_OK) {
			sfw_buf_release(&b);
			return st;
		}
		text = b.data ? b.data : "";
		len = b.len;
		if (!sfw_utf8_valid((const unsigned char *)text, len)) {
			sfw_buf_release(&b);
			return sfw_fail(err, SFW_E_FORMAT, "corpus '%s' is not valid UTF-8", corpus_path);
		}
	}
	/* LLaMA-style BPE: identity normalisation keeps decode(encode(x)) == x;
	 * one thread and no sentence sampling make the model a function of the
	 * corpus. hard_vocab_limit=false lets a small corpus give fewer pieces. */
	std::string args = "--model_type=bpe --vocab_size=" + std::to_string(n_pieces) +
			   " --byte_fallback=true --character_coverage=0.9995"
			   " --normalization_rule_name=identity --remove_extra_whitespaces=false"
			   " --add_dummy_prefix=true --split_digits=true --allow_whitespace_only_pieces=true"
			   " --hard_vocab_limit=false --num_threads=1 --input_sentence_size=0"
			   " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1";
	line_iterator it(text, len);
	std::string model;
	int level = sentencepiece::logging::GetMinLogLevel();
	sentencepiece::logging::SetMinLogLevel(2); /* errors only */
	auto s = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
	sentencepiece::logging::SetMinLogLevel(level);
	sfw_buf_release(&b);
	if (!s.ok())
		return sfw_fail(err, SFW_E_FORMAT, "cannot train a tokenizer on %s%s%s: %s",
				corpus_path ? "'" : "", corpus_path ? corpus_path : "the default corpus",
				corpus_path ? "'" : "", s.ToString().c_str());
	return sfw_write_file_atomic(out_model_path, model.data(), model.size(), err);
}

} // namespace

extern "C" enum sfw_status sfw_tokenizer_train(const char *corpus_path, int n_pieces, const char *out_model_path,
					       struct sfw_err *err)
{
	try {
		return train_impl(corpus_path, n_pieces, out_model_path, err);
	} catch (const std::bad_alloc &) {
		return sfw_fail(err, SFW_E_NOMEM, "out of memory in the tokenizer");
	} catch (const std::exception &e) {
		return sfw_fail(err, SFW_E_FORMAT, "tokenizer: %s", e.what());
	} catch (...) {
		return sfw_fail(err, SFW_E_FORMAT, "tokenizer: unexpected exception");
	}
}
