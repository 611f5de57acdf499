/* tokenizer.cpp - the C interface of formats/tokenizer.h over libsentencepiece.
 * Every entry point catches all exceptions (std::bad_alloc from the STL and
 * whatever libsentencepiece may throw) and turns them into a status. */
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

extern "C" {
#include "alloc.h"
#include "file.h"
#include "formats/tokenizer.h"
#include "json.h"
}

namespace {

/* Caps on untrusted inputs. The real tokenizer.model is ~1.5 MB and its
 * tokenizer_config.json ~10 kB. */
constexpr size_t kMaxModelBytes = 64u << 20;
constexpr size_t kMaxConfigBytes = 16u << 20;
constexpr size_t kMaxSpecialLen = 256;
constexpr int kMaxVocab = SFW_TOKENIZER_VOCAB_MAX;

const char *const kDefaultSpecials[8] = {"<|im_end|>",      "<|im_start|>",  "<|tool_call|>",
					 "<|execute_start|>", "<|execute_end|>", "<|fim_prefix|>",
					 "<|fim_middle|>",  "<|fim_suffix|>"};

enum piece_kind : unsigned char { PK_TEXT, PK_BYTE, PK_NONE, PK_UNK };

struct special {
	std::string text;
	int32_t id;
};

} // namespace

struct sfw_tokenizer {
	sentencepiece::SentencePieceProcessor sp;
	/* tokenizer_config.json "legacy": false (HF's newer Llama behaviour):
	 * only a segment that no text precedes gets the dummy prefix; the others
	 * are encoded by sp_noprefix, the same model with add_dummy_prefix off. */
	bool legacy = true;
	sentencepiece::SentencePieceProcessor sp_noprefix;
	int n_pieces = 0;
	int vocab = 0;
	int32_t bos = 1, eos = 2;
	std::vector<special> specials;     /* longest text first */
	std::vector<int32_t> special_of;   /* id -> index into specials, or -1 */
	std::vector<std::string> surface;  /* SentencePiece id -> text with "▁" as ' ' */
	std::vector<unsigned char> kind;   /* piece_kind per SentencePiece id */
	std::vector<unsigned char> lead_ws; /* piece starts with "▁" */
	std::vector<unsigned char> byte_val;
};

namespace {

const char kSpace[] = "\xE2\x96\x81"; /* U+2581 "▁" */
const char kReplacement[] = "\xEF\xBF\xBD";

enum sfw_status fail_nomem(struct sfw_err *err, const char *what)
{
	return sfw_fail(err, SFW_E_NOMEM, "out of memory %s", what);
}

/* Parses a decimal id "0".."2147483647" without sign, spaces or leading zeros. */
bool parse_id(const char *s, int32_t *out)
{
	size_t n = strlen(s);
	if (n == 0 || n > 10 || (n > 1 && s[0] == '0'))
		return false;
	long long v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	if (v > INT32_MAX)
		return false;
	*out = (int32_t)v;
	return true;
}

enum sfw_status add_special(sfw_tokenizer *t, const std::string &text, int32_t id, const char *what,
			    struct sfw_err *err)
{
	if (text.empty() || text.size() > kMaxSpecialLen)
		return sfw_fail(err, SFW_E_FORMAT, "%s: special token %d has an empty or over-long text", what,
				(int)id);
	if (id < 0 || id >= t->vocab)
		return sfw_fail(err, SFW_E_FORMAT, "%s: special token '%s' has id %d outside the vocab of %d",
				what, text.c_str(), (int)id, t->vocab);
	if (id < t->n_pieces && t->sp.IdToPiece(id) != text)
		return sfw_fail(err, SFW_E_FORMAT,
				"%s: special token '%s' has id %d, which is SentencePiece piece '%s'", what,
				text.c_str(), (int)id, t->sp.IdToPiece(id).c_str());
	for (const special &s : t->specials) {
		if (s.id == id || s.text == text)
			return sfw_fail(err, SFW_E_FORMAT, "%s: special token '%s' (id %d) defined twice", what,
					text.c_str(), (int)id);
	}
	t->specials.push_back(special{text, id});
	return SFW_OK;
}

/* Protobuf wire format, just enough to flip one field of ModelProto:
 * normalizer_spec is field 3 (a message) and its add_dummy_prefix field 3
 * (a bool). A scalar that appears twice takes the last value, so appending
 * "field 3 = 0" to the submessage turns the prefix off. */
bool pb_varint(const std::string &b, size_t *at, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (*at >= b.size())
			return false;
		unsigned char c = (unsigned char)b[(*at)++];
		*v |= (uint64_t)(c & 0x7F) << shift;
		if (!(c & 0x80))
			return true;
	}
	return false;
}

void pb_put_varint(std::string &o, uint64_t v)
{
	do {
		unsigned char c = v & 0x7F;
		v >>= 7;
		o.push_back((char)(v ? c | 0x80 : c));
	} while (v);
}

bool model_without_dummy_prefix(const std::string &in, std::string *out)
{
	static const char off[2] = {0x18, 0x00}; /* field 3, varint, 0 */
	std::string o;
	size_t at = 0;
	bool done = false;
	while (at < in.size()) {
		size_t start = at;
		uint64_t tag, v;
		if (!pb_varint(in, &at, &tag))
			return false;
		switch (tag & 7) {
		case 0:
			if (!pb_varint(in, &at, &v))
				return false;
			break;
		case 1:
			at += 8;
			break;
		case 5:
			at += 4;
			break;
		case 2:
			if (!pb_varint(in, &at, &v) || v > in.size() - std::min(at, in.size()))
				return false;
			if (tag >> 3 == 3 && !done) {
				pb_put_varint(o, tag);
				pb_put_varint(o, v + 2);
				o.append(in, at, (size_t)v);
				o.append(off, 2);
				at += (size_t)v;
				done = true;
				continue;
			}
			at += (size_t)v;
			break;
		default:
			return false;
		}
		if (at > in.size())
			return false;
		o.append(in, start, at - start);
	}
	if (!done) {
		o.push_back(0x1A); /* field 3, length-delimited */
		o.push_back(0x02);
		o.append(off, 2);
	}
	*out = std::move(o);
	return true;
}

enum sfw_status load_config_specials(sfw_tokenizer *t, const char *path, struct sfw_err *err)
{
	struct sfw_buf b;
	sfw_buf_init(&b, kMaxConfigBytes);
	enum sfw_status st = sfw_read_file(path, kMaxConfigBytes, &b, err);
	if (st != SFW_OK) {
		sfw_buf_release(&b);
		return st;
	}
	std::string what = std::string("'") + path + "'";
	cJSON *root = nullptr;
	st = sfw_json_parse(b.data ? b.data : "", b.len, what.c_str(), &root, err);
	sfw_buf_release(&b);
	if (st != SFW_OK)
		return st;
	std::unique_ptr<cJSON, void (*)(cJSON *)> guard(root, cJSON_Delete);
	if (!cJSON_IsObject(root))
		return sfw_fail(err, SFW_E_FORMAT, "%s: not a JSON object", what.c_str());
	const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(root, "legacy");
	if (legacy && !cJSON_IsBool(legacy) && !cJSON_IsNull(legacy))
		return sfw_fail(err, SFW_E_FORMAT, "%s: legacy is not a boolean", what.c_str());
	t->legacy = !cJSON_IsFalse(legacy); /* HF's default is legacy */
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
	if (!added) /* no table: the defaults apply */
		return SFW_OK;
	if (!cJSON_IsObject(added))
		return sfw_fail(err, SFW_E_FORMAT, "%s: added_tokens_decoder is not an object", what.c_str());
	for (const cJSON *e = added->child; e; e = e->next) {
		int32_t id;
		if (!parse_id(e->string, &id))
			return sfw_fail(err, SFW_E_FORMAT, "%s: added_tokens_decoder key '%.40s' is not an id",
					what.c_str(), e->string);
		const char *content = nullptr;
		if (!cJSON_IsObject(e))
			return sfw_fail(err, SFW_E_FORMAT, "%s: added_tokens_decoder[%d] is not an object",
					what.c_str(), (int)id);
		st = sfw_json_string(e, "content", what.c_str(), &content, err);
		if (st != SFW_OK)
			return st;
		st = add_special(t, content, id, what.c_str(), err);
		if (st != SFW_OK)
			return st;
	}
	return SFW_OK;
}

enum sfw_status load_impl(const char *model_path, const char *config_json, int model_vocab, sfw_tokenizer **out,
			  struct sfw_err *err)
{
	if (model_vocab < 0 || model_vocab > kMaxVocab)
		return sfw_fail(err, SFW_E_INVAL, "model vocab %d out of range", model_vocab);
	struct sfw_buf b;
	sfw_buf_init(&b, kMaxModelBytes);
	enum sfw_status st = sfw_read_file(model_path, kMaxModelBytes, &b, err);
	if (st != SFW_OK) {
		sfw_buf_release(&b);
		return st;
	}
	std::string bytes;
	bytes.assign(b.data ? b.data : "", b.len);
	sfw_buf_release(&b);
	std::unique_ptr<sfw_tokenizer> t(new (std::nothrow) sfw_tokenizer());
	if (!t)
		return fail_nomem(err, "loading the tokenizer");
	auto s = t->sp.LoadFromSerializedProto(bytes);
	if (!s.ok())
		return sfw_fail(err, SFW_E_FORMAT, "cannot load SentencePiece model '%s': %s", model_path,
				s.ToString().c_str());
	int np = t->sp.GetPieceSize();
	if (np < 1 || np > kMaxVocab)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': %d pieces", model_path, np);
	t->n_pieces = np;
	if (model_vocab == 0)
		model_vocab = np + 8;
	if (model_vocab < np)
		return sfw_fail(err, SFW_E_FORMAT, "'%s' has %d pieces but the model vocab is %d", model_path, np,
				model_vocab);
	t->vocab = model_vocab;

	if (config_json) {
		st = load_config_specials(t.get(), config_json, err);
		if (st != SFW_OK)
			return st;
	}
	if (!t->legacy) {
		std::string patched;
		if (!model_without_dummy_prefix(bytes, &patched) ||
		    !t->sp_noprefix.LoadFromSerializedProto(patched).ok() ||
		    t->sp_noprefix.GetPieceSize() != np)
			return sfw_fail(err, SFW_E_FORMAT, "'%s': cannot derive the no-prefix model", model_path);
	}
	if (t->specials.empty()) {
		const char *what = "default special tokens";
		if (model_vocab < 8 || model_vocab - 8 < np || np < 3)
			return sfw_fail(err, SFW_E_FORMAT,
					"'%s': %d pieces leave no room for the 8 special tokens below vocab %d",
					model_path, np, model_vocab);
		const char *base[3] = {"<unk>", "<s>", "</s>"};
		for (int i = 0; i < 3; i++)
			if ((st = add_special(t.get(), base[i], i, what, err)) != SFW_OK)
				return st;
		for (int i = 0; i < 8; i++)
			if ((st = add_special(t.get(), kDefaultSpecials[i], model_vocab - 8 + i, what, err)) != SFW_OK)
				return st;
	}
	std::stable_sort(t->specials.begin(), t->specials.end(),
			 [](const special &a, const special &b) { return a.text.size() > b.text.size(); });
	t->special_of.assign((size_t)model_vocab, -1);
	for (size_t i = 0; i < t->specials.size(); i++)
		t->special_of[(size_t)t->specials[i].id] = (int32_t)i;

	t->bos = -1;
	t->eos = -1;
	for (const special &sp : t->specials) {
		if (sp.text == "<s>")
			t->bos = sp.id;
		if (sp.text == "</s>")
			t->eos = sp.id;
	}
	if (t->bos < 0)
		t->bos = t->sp.bos_id();
	if (t->eos < 0)
		t->eos = t->sp.eos_id();
	if (t->bos < 0 || t->eos < 0)
		return sfw_fail(err, SFW_E_FORMAT, "'%s': no <s> or </s> token", model_path);

	t->surface.resize((size_t)np);
	t->kind.resize((size_t)np);
	t->lead_ws.resize((size_t)np);
	t->byte_val.resize((size_t)np);
	for (int id = 0; id < np; id++) {
		const std::string &p = t->sp.IdToPiece(id);
		if (t->sp.IsByte(id)) {
			unsigned v = 0;
			if (p.size() != 6 || sscanf(p.c_str(), "<0x%2X>", &v) != 1)
				return sfw_fail(err, SFW_E_FORMAT, "'%s': byte piece %d is '%s'", model_path, id,
						p.c_str());
			t->kind[(size_t)id] = PK_BYTE;
			t->byte_val[(size_t)id] = (unsigned char)v;
		} else if (t->sp.IsControl(id) || t->sp.IsUnused(id)) {
			t->kind[(size_t)id] = PK_NONE;
		} else if (t->sp.IsUnknown(id)) {
			t->kind[(size_t)id] = PK_UNK;
		} else {
			std::string s;
			size_t at = 0;
			bool lead = p.compare(0, 3, kSpace) == 0;
			while (at < p.size()) {
				size_t f = p.find(kSpace, at);
				if (f == std::string::npos) {
					s.append(p, at, std::string::npos);
					break;
				}
				s.append(p, at, f - at);
				s.push_back(' ');
				at = f + 3;
			}
			t->kind[(size_t)id] = PK_TEXT;
			t->lead_ws[(size_t)id] = lead;
			t->surface[(size_t)id] = std::move(s);
		}
	}
	*out = t.release();
	return SFW_OK;
}

/* Encodes one text segment (no special tokens in it) with SentencePiece. */
enum sfw_status encode_segment(const sfw_tokenizer *t, const char *p, size_t n, bool *lead,
			       std::vector<int32_t> &ids, struct sfw_err *err)
{
	if (n == 0)
		return SFW_OK;
	std::vector<int> v;
	const sentencepiece::SentencePieceProcessor &sp = t->legacy || *lead ? t->sp : t->sp_noprefix;
	*lead = false;
	auto s = sp.Encode(absl::string_view(p, n), &v);
	if (!s.ok())
		return sfw_fail(err, SFW_E_FORMAT, "SentencePiece cannot encode the text: %s", s.ToString().c_str());
	for (int id : v) {
		SFW_ASSERT(id >= 0 && id < t->n_pieces);
		ids.push_back((int32_t)id);
	}
	return SFW_OK;
}

/* out == NULL discards the text (sfw_tokdec_prime). */
enum sfw_status append(struct sfw_buf *out, const char *p, size_t n, struct sfw_err *err)
{
	if (n == 0 || !out)
		return SFW_OK;
	enum sfw_status st = sfw_buf_append(out, p, n);
	if (st != SFW_OK)
		return sfw_fail(err, st, "decoded text does not fit the output buffer");
	return SFW_OK;
}

/* Expected length of a UTF-8 sequence from its lead byte, 0 if no lead byte. */
int utf8_len(unsigned char c)
{
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		return 2;
	if (c >= 0xE0 && c <= 0xEF)
		return 3;
	if (c >= 0xF0 && c <= 0xF4)
		return 4;
	return 0;
}

/* Is b valid as byte k (1-based position >= 1) after lead c? */
bool utf8_cont_ok(unsigned char c, int k, unsigned char b)
{
	if ((b & 0xC0) != 0x80)
		return false;
	if (k != 1)
		return true;
	if (c == 0xE0)
		return b >= 0xA0;
	if (c == 0xED)
		return b <= 0x9F; /* no surrogates */
	if (c == 0xF0)
		return b >= 0x90;
	if (c == 0xF4)
		return b <= 0x8F;
	return true;
}

void drop_pending(struct sfw_tokdec *d, int k)
{
	memmove(d->pending, d->pending + k, (size_t)(d->n_pending - k));
	d->n_pending -= k;
}

/* Emits every complete character of the pending bytes; a byte that cannot
 * start or continue a valid sequence becomes U+FFFD. */
enum sfw_status drain_pending(struct sfw_tokdec *d, struct sfw_buf *out, struct sfw_err *err)
{
	enum sfw_status st;
	while (d->n_pending > 0) {
		unsigned char c = d->pending[0];
		int need = utf8_len(c);
		bool bad = need == 0;
		for (int k = 1; !bad && k < d->n_pending && k < need; k++)
			bad = !utf8_cont_ok(c, k, d->pending[k]);
		if (bad) {
			if ((st = append(out, kReplacement, 3, err)) != SFW_OK)
				return st;
			drop_pending(d, 1);
			continue;
		}
		if (d->n_pending < need)
			return SFW_OK; /* wait for the rest */
		if ((st = append(out, (const char *)d->pending, (size_t)need, err)) != SFW_OK)
			return st;
		drop_pending(d, need);
	}
	return SFW_OK;
}

enum sfw_status flush_pending(struct sfw_tokdec *d, struct sfw_buf *out, struct sfw_err *err)
{
	for (; d->n_pending > 0; d->n_pending--) {
		enum sfw_status st = append(out, kReplacement, 3, err);
		if (st != SFW_OK)
			return st;
	}
	return SFW_OK;
}

const char kChatTemplate[] =
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
	"'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
	"{% endif %}";

cJSON *added_entry(const char *content)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return nullptr;
	bool ok = cJSON_AddStringToObject(o, "content", content) && cJSON_AddFalseToObject(o, "lstrip") &&
		  cJSON_AddFalseToObject(o, "normalized") && cJSON_AddFalseToObject(o, "rstrip") &&
		  cJSON_AddFalseToObject(o, "single_word") && cJSON_AddTrueToObject(o, "special");
	if (!ok) {
		cJSON_Delete(o);
		return nullptr;
	}
	return o;
}

enum sfw_status write_json(const char *dir, const char *name, cJSON *root, struct sfw_err *err)
{
	char *text = cJSON_Print(root);
	if (!text)
		return fail_nomem(err, "formatting JSON");
	std::string s(text);
	cJSON_free(text);
	s.push_back('\n');
	char *path = sfw_path_join(dir, name);
	if (!path)
		return fail_nomem(err, "joining a path");
	enum sfw_status st = sfw_write_file_atomic(path, s.data(), s.size(), err);
	sfw_free(path);
	return st;
}

enum sfw_status write_config_impl(const char *dir, int model_vocab, struct sfw_err *err)
{
	if (model_vocab < 11 || model_vocab > kMaxVocab)
		return sfw_fail(err, SFW_E_INVAL, "model vocab %d out of range", model_vocab);
	/* If the directory already holds tokenizer.model, the specials must sit
	 * above its pieces; loading checks exactly that. */
	char *model = sfw_path_join(dir, "tokenizer.model");
	if (!model)
		return fail_nomem(err, "joining a path");
	FILE *probe = fopen(model, "rb");
	if (probe) {
		fclose(probe);
		sfw_tokenizer *t = nullptr;
		enum sfw_status st = load_impl(model, nullptr, model_vocab, &t, err);
		delete t;
		if (st != SFW_OK) {
			sfw_free(model);
			return st;
		}
	}
	sfw_free(model);

	std::unique_ptr<cJSON, void (*)(cJSON *)> cfg(cJSON_CreateObject(), cJSON_Delete);
	std::unique_ptr<cJSON, void (*)(cJSON *)> map(cJSON_CreateObject(), cJSON_Delete);
	if (!cfg || !map)
		return fail_nomem(err, "building tokenizer_config.json");
	cJSON *added = cJSON_CreateObject();
	cJSON *extra = cJSON_CreateStringArray(kDefaultSpecials, 8);
	cJSON *extra2 = cJSON_CreateStringArray(kDefaultSpecials, 8);
	bool ok = added && extra && extra2;
	const char *base[3] = {"<unk>", "<s>", "</s>"};
	for (int i = 0; ok && i < 11; i++) {
		char key[16];
		snprintf(key, sizeof(key), "%d", i < 3 ? i : model_vocab - 11 + i);
		cJSON *e = added_entry(i < 3 ? base[i] : kDefaultSpecials[i - 3]);
		ok = e && cJSON_AddItemToObject(added, key, e);
		if (e && !ok)
			cJSON_Delete(e);
	}
	if (!ok) {
		cJSON_Delete(added);
		cJSON_Delete(extra);
		cJSON_Delete(extra2);
		return fail_nomem(err, "building tokenizer_config.json");
	}
	cJSON *c = cfg.get();
	ok = cJSON_AddTrueToObject(c, "add_bos_token") && cJSON_AddFalseToObject(c, "add_eos_token") &&
	     cJSON_AddItemToObject(c, "added_tokens_decoder", added);
	if (!ok)
		cJSON_Delete(added);
	ok = ok && cJSON_AddItemToObject(c, "additional_special_tokens", extra);
	if (!ok)
		cJSON_Delete(extra);
	ok = ok && cJSON_AddStringToObject(c, "bos_token", "<s>") &&
	     cJSON_AddStringToObject(c, "chat_template", kChatTemplate) &&
	     cJSON_AddFalseToObject(c, "clean_up_tokenization_spaces") &&
	     cJSON_AddStringToObject(c, "eos_token", "<|im_end|>") && cJSON_AddTrueToObject(c, "legacy") &&
	     cJSON_AddNullToObject(c, "pad_token") && cJSON_AddFalseToObject(c, "spaces_between_special_tokens") &&
	     cJSON_AddStringToObject(c, "tokenizer_class", "LlamaTokenizer") &&
	     cJSON_AddStringToObject(c, "unk_token", "<unk>");
	cJSON *m = map.get();
	bool ok2 = cJSON_AddItemToObject(m, "additional_special_tokens", extra2);
	if (!ok2)
		cJSON_Delete(extra2);
	ok2 = ok2 && cJSON_AddStringToObject(m, "bos_token", "<s>") &&
	      cJSON_AddStringToObject(m, "eos_token", "<|im_end|>") &&
	      cJSON_AddStringToObject(m, "unk_token", "<unk>");
	if (!ok || !ok2)
		return fail_nomem(err, "building tokenizer_config.json");
	enum sfw_status st = write_json(dir, "tokenizer_config.json", c, err);
	if (st == SFW_OK)
		st = write_json(dir, "special_tokens_map.json", m, err);
	return st;
}

} // namespace

#define SFW_CATCH(err)                                                                                    \
	catch (const std::bad_alloc &)                                                                    \
	{                                                                                                 \
		return sfw_fail(err, SFW_E_NOMEM, "out of memory in the tokenizer");                      \
	}                                                                                                 \
	catch (const std::exception &e)                                                                   \
	{                                                                                                 \
		return sfw_fail(err, SFW_E_FORMAT, "tokenizer: %s", e.what());                            \
	}                                                                                                 \
	catch (...)                                                                                       \
	{                                                                                                 \
		return sfw_fail(err, SFW_E_FORMAT, "tokenizer: unexpected exception");                   \
	}

extern "C" {

enum sfw_status sfw_tokenizer_load_files(const char *model_path, const char *config_json, int model_vocab,
					 struct sfw_tokenizer **out, struct sfw_err *err)
{
	*out = nullptr;
	try {
		return load_impl(model_path, config_json, model_vocab, out, err);
	}
	SFW_CATCH(err)
}

enum sfw_status sfw_tokenizer_load(const char *model_dir, int model_vocab, struct sfw_tokenizer **out,
				   struct sfw_err *err)
{
	*out = nullptr;
	char *model = sfw_path_join(model_dir, "tokenizer.model");
	char *cfg = sfw_path_join(model_dir, "tokenizer_config.json");
	enum sfw_status st;
	if (!model || !cfg) {
		st = fail_nomem(err, "joining a path");
	} else {
		FILE *f = fopen(cfg, "rb");
		int e = f ? 0 : errno;
		if (f)
			fclose(f);
		if (e && e != ENOENT)
			st = sfw_fail(err, SFW_E_IO, "cannot open '%s': %s", cfg, strerror(e));
		else
			st = sfw_tokenizer_load_files(model, e ? nullptr : cfg, model_vocab, out, err);
	}
	sfw_free(model);
	sfw_free(cfg);
	return st;
}

void sfw_tokenizer_free(struct sfw_tokenizer *t)
{
	delete t;
}

int sfw_tokenizer_vocab(const struct sfw_tokenizer *t)
{
	return t->vocab;
}

int sfw_tokenizer_n_pieces(const struct sfw_tokenizer *t)
{
	return t->n_pieces;
}

int32_t sfw_tokenizer_bos(const struct sfw_tokenizer *t)
{
	return t->bos;
}

int32_t sfw_tokenizer_eos(const struct sfw_tokenizer *t)
{
	return t->eos;
}

int32_t sfw_tokenizer_special_id(const struct sfw_tokenizer *t, const char *text)
{
	for (const special &s : t->specials)
		if (s.text == text)
			return s.id;
	return -1;
}

int sfw_tokenizer_is_special(const struct sfw_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->vocab && t->special_of[(size_t)id] >= 0;
}

enum sfw_status sfw_tokenizer_encode(const struct sfw_tokenizer *t, const char *text, size_t len, int add_bos,
				     int32_t **ids, size_t *n_ids, struct sfw_err *err)
{
	*ids = nullptr;
	*n_ids = 0;
	if (len > 0 && !text)
		return sfw_fail(err, SFW_E_INVAL, "no text to encode");
	if (!sfw_utf8_valid((const unsigned char *)text, len))
		return sfw_fail(err, SFW_E_INVAL, "text to encode is not valid UTF-8");
	try {
		std::vector<int32_t> v;
		if (add_bos)
			v.push_back(t->bos);
		size_t seg = 0, i = 0;
		bool lead = true; /* no text and no added token before this point */
		while (i < len) {
			const special *hit = nullptr;
			for (const special &s : t->specials) { /* longest first */
				if (s.text.size() <= len - i && memcmp(text + i, s.text.data(), s.text.size()) == 0) {
					hit = &s;
					break;
				}
			}
			if (!hit) {
				i++;
				continue;
			}
			enum sfw_status st = encode_segment(t, text + seg, i - seg, &lead, v, err);
			if (st != SFW_OK)
				return st;
			v.push_back(hit->id);
			if (hit->id >= t->n_pieces)
				lead = false;
			i += hit->text.size();
			seg = i;
		}
		enum sfw_status st = encode_segment(t, text + seg, len - seg, &lead, v, err);
		if (st != SFW_OK)
			return st;
		int32_t *p = (int32_t *)sfw_malloc(v.empty() ? 1 : v.size() * sizeof(int32_t));
		if (!p)
			return fail_nomem(err, "encoding text");
		if (!v.empty())
			memcpy(p, v.data(), v.size() * sizeof(int32_t));
		*ids = p;
		*n_ids = v.size();
		return SFW_OK;
	}
	SFW_CATCH(err)
}

void sfw_tokdec_init(struct sfw_tokdec *d, const struct sfw_tokenizer *t, int skip_special)
{
	memset(d, 0, sizeof(*d));
	d->tok = t;
	d->skip_special = skip_special;
	d->at_start = 1;
}

enum sfw_status sfw_tokdec_push(struct sfw_tokdec *d, int32_t id, struct sfw_buf *out, struct sfw_err *err)
{
	const sfw_tokenizer *t = d->tok;
	if (id < 0 || id >= t->vocab)
		return sfw_fail(err, SFW_E_RANGE, "token id %d outside the vocab of %d", (int)id, t->vocab);
	enum sfw_status st;
	int32_t si = t->special_of[(size_t)id];
	if (si >= 0) {
		if ((st = flush_pending(d, out, err)) != SFW_OK)
			return st;
		/* Legacy: the next segment was encoded with its own dummy prefix.
		 * Otherwise only SentencePiece's own <s> </s> <unk> keep it. */
		if (t->legacy)
			d->at_start = 1;
		else if (id >= t->n_pieces)
			d->at_start = 0;
		if (d->skip_special)
			return SFW_OK;
		const std::string &s = t->specials[(size_t)si].text;
		return append(out, s.data(), s.size(), err);
	}
	if (id >= t->n_pieces)
		return SFW_OK; /* a padding id of the model vocab: no text */
	switch (t->kind[(size_t)id]) {
	case PK_BYTE:
		d->at_start = 0;
		SFW_ASSERT(d->n_pending < 4);
		d->pending[d->n_pending++] = t->byte_val[(size_t)id];
		return drain_pending(d, out, err);
	case PK_NONE:
		return SFW_OK;
	case PK_UNK:
		if ((st = flush_pending(d, out, err)) != SFW_OK)
			return st;
		d->at_start = 0;
		return append(out, " \xE2\x81\x87 ", 5, err); /* SentencePiece's " ⁇ " */
	default: {
		if ((st = flush_pending(d, out, err)) != SFW_OK)
			return st;
		const std::string &s = t->surface[(size_t)id];
		size_t skip = d->at_start && t->lead_ws[(size_t)id] ? 1 : 0;
		d->at_start = 0;
		return append(out, s.data() + skip, s.size() - skip, err);
	}
	}
}

enum sfw_status sfw_tokdec_prime(struct sfw_tokdec *d, const int32_t *ids, size_t n, struct sfw_err *err)
{
	for (size_t i = 0; i < n; i++) {
		enum sfw_status st = sfw_tokdec_push(d, ids[i], NULL, err);
		if (st != SFW_OK)
			return st;
	}
	d->n_pending = 0; /* the prompt was shown already */
	return SFW_OK;
}

enum sfw_status sfw_tokdec_flush(struct sfw_tokdec *d, struct sfw_buf *out, struct sfw_err *err)
{
	enum sfw_status st = flush_pending(d, out, err);
	d->at_start = 1;
	return st;
}

enum sfw_status sfw_tokenizer_decode(const struct sfw_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
				     struct sfw_buf *out, struct sfw_err *err)
{
	struct sfw_tokdec d;
	sfw_tokdec_init(&d, t, skip_special);
	for (size_t i = 0; i < n; i++) {
		enum sfw_status st = sfw_tokdec_push(&d, ids[i], out, err);
		if (st != SFW_OK)
			return st;
	}
	return sfw_tokdec_flush(&d, out, err);
}

enum sfw_status sfw_tokenizer_write_config(const char *dir, int model_vocab, struct sfw_err *err)
{
	try {
		return write_config_impl(dir, model_vocab, err);
	}
	SFW_CATCH(err)
}

} // extern "C"
