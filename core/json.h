/* json.h - strict JSON on top of cJSON for untrusted bytes.
 *
 * sfw_json_parse rejects: bytes that are not valid UTF-8 (shortest form, no
 * surrogates), a NUL inside the input, anything after the top-level value,
 * duplicate keys in any object, and nesting deeper than cJSON's limit. Lookups
 * are case-sensitive. Integers are read from valuedouble and must be integral
 * and within [0, 2^53-1] (cJSON's valueint saturates at INT_MAX). */
#ifndef SFW_JSON_H
#define SFW_JSON_H

#include "sfw.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#define SFW_JSON_MAX_SAFE_INT 9007199254740991ULL /* 2^53 - 1 */

/* what names the input in messages ("manifest 'x.json'"). */
SFW_MUST_CHECK enum sfw_status sfw_json_parse(const char *bytes, size_t len, const char *what, cJSON **out,
					      struct sfw_err *err);

/* sfw_json_parse of at most max bytes whose top-level value must be an
 * object: "WHAT: larger than MAX bytes" (SFW_E_RANGE) and "WHAT: not a JSON
 * object" (SFW_E_FORMAT) otherwise, one wording for every small JSON file. */
SFW_MUST_CHECK enum sfw_status sfw_json_parse_object(const char *bytes, size_t len, size_t max, const char *what,
						     cJSON **out, struct sfw_err *err);

int sfw_utf8_valid(const unsigned char *s, size_t n);

/* Typed member lookups; a missing key or wrong type is an error naming key. */
SFW_MUST_CHECK enum sfw_status sfw_json_string(const cJSON *obj, const char *key, const char *what,
					       const char **out, struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_json_u64(const cJSON *obj, const char *key, const char *what,
					    uint64_t *out, struct sfw_err *err);
/* For an item already in hand. */
SFW_MUST_CHECK enum sfw_status sfw_json_item_u64(const cJSON *item, const char *name, const char *what,
						 uint64_t *out, struct sfw_err *err);

#endif
