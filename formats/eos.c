/* eos.c - end-of-sequence id sets and the two strict parsers behind
 * sfw_eos_load (runner/generate.h), declared in formats/config.h:
 * generation_config.json's eos_token_id and tokenizer_config.json's
 * eos_token. Needs only core/ (fuzzed alone: tests/fuzz/fuzz_gencfg.c). */
#include "formats/config.h"
#include "json.h"

#include <string.h>

#define GEN_CONFIG_MAX (1u << 20) /* generation_config.json bytes */
#define TOKCFG_MAX (16u << 20)	  /* tokenizer_config.json may carry a long chat template */

enum sfw_status sfw_eos_add(struct sfw_eos_set *s, int32_t id, struct sfw_err *err)
{
	if (sfw_eos_has(s, id))
		return SFW_OK;
	if (s->n >= SFW_EOS_MAX)
		return sfw_fail(err, SFW_E_RANGE, "more than %d end-of-sequence ids", SFW_EOS_MAX);
	s->ids[s->n++] = id;
	return SFW_OK;
}

int sfw_eos_has(const struct sfw_eos_set *s, int32_t id)
{
	for (int i = 0; i < s->n; i++)
		if (s->ids[i] == id)
			return 1;
	return 0;
}

enum sfw_status sfw_eos_parse_generation_config(const char *bytes, size_t len, const char *what, int vocab,
						struct sfw_eos_set *s, struct sfw_err *err)
{
	cJSON *root = NULL;
	enum sfw_status st = sfw_json_parse_object(bytes, len, GEN_CONFIG_MAX, what, &root, err);
	if (st != SFW_OK)
		return st;
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
	if (e && !cJSON_IsNull(e)) {
		const cJSON *one = cJSON_IsNumber(e) ? e : NULL;
		if (!one && !cJSON_IsArray(e))
			st = sfw_fail(err, SFW_E_FORMAT,
				      "%s: field 'eos_token_id' must be an integer or a list", what);
		else if (!one && cJSON_GetArraySize(e) > SFW_EOS_MAX)
			st = sfw_fail(err, SFW_E_RANGE, "%s: eos_token_id has more than %d ids", what,
				      SFW_EOS_MAX);
		for (const cJSON *v = one ? one : e->child; st == SFW_OK && v; v = one ? NULL : v->next) {
			uint64_t id;
			if ((st = sfw_json_item_u64(v, "eos_token_id", what, &id, err)) != SFW_OK)
				break;
			if (id >= (uint64_t)vocab)
				st = sfw_fail(err, SFW_E_RANGE,
					      "%s: eos_token_id %llu is not below the vocab size %d", what,
					      (unsigned long long)id, vocab);
			else
				st = sfw_eos_add(s, (int32_t)id, err);
		}
	}
	cJSON_Delete(root);
	return st;
}

enum sfw_status sfw_eos_parse_tokenizer_config(const char *bytes, size_t len, const char *what, char *name,
					       size_t cap, struct sfw_err *err)
{
	if (cap)
		name[0] = 0;
	if (len > TOKCFG_MAX)
		return sfw_fail(err, SFW_E_RANGE, "%s: larger than %u bytes", what, TOKCFG_MAX);
	cJSON *root = NULL;
	enum sfw_status st = sfw_json_parse(bytes, len, what, &root, err);
	if (st != SFW_OK)
		return st;
	const cJSON *e = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "eos_token") : NULL;
	if (!cJSON_IsObject(root))
		st = sfw_fail(err, SFW_E_FORMAT, "%s: not a JSON object", what);
	else if (e && cJSON_IsObject(e)) /* {"content": "<|im_end|>", "lstrip": false, ...} */
		e = cJSON_GetObjectItemCaseSensitive(e, "content");
	if (st == SFW_OK && e && !cJSON_IsNull(e)) {
		size_t n = cJSON_IsString(e) ? strlen(e->valuestring) : 0;
		if (!cJSON_IsString(e))
			st = sfw_fail(err, SFW_E_FORMAT,
				      "%s: eos_token must be a string or {\"content\": string}", what);
		else if (n == 0 || n > SFW_STOP_MAX_LEN || n >= cap)
			st = sfw_fail(err, SFW_E_RANGE, "%s: eos_token of %zu bytes (1 to %d allowed)", what,
				      n, SFW_STOP_MAX_LEN);
		else
			memcpy(name, e->valuestring, n + 1);
	}
	cJSON_Delete(root);
	return st;
}
