#include "json.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sfw_utf8_valid(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		unsigned min;
		if ((c & 0xE0) == 0xC0) {
			len = 2;
			min = 0x80;
			c &= 0x1F;
		} else if ((c & 0xF0) == 0xE0) {
			len = 3;
			min = 0x800;
			c &= 0x0F;
		} else if ((c & 0xF8) == 0xF0) {
			len = 4;
			min = 0x10000;
			c &= 0x07;
		} else {
			return 0;
		}
		if (n - i < len)
			return 0;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return 0;
			c = (c << 6) | (s[i + k] & 0x3F);
		}
		if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
			return 0;
		i += len;
	}
	return 1;
}

static int cmp_key(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* 1 with *dup set when an object repeats a key, -1 when out of memory.
 * Keys are sorted per object, so a header of a million tensors costs
 * n log n, not n^2 (a crafted 100 MiB safetensors header would otherwise
 * take hours to parse). */
static int has_duplicate_keys(const cJSON *node, const char **dup)
{
	if (cJSON_IsObject(node)) {
		size_t n = 0, k = 0;
		for (const cJSON *c = node->child; c; c = c->next)
			n++;
		if (n > 1) {
			const char **keys = sfw_malloc(n * sizeof(*keys));
			if (!keys)
				return -1;
			for (const cJSON *c = node->child; c; c = c->next)
				keys[k++] = c->string ? c->string : "";
			qsort(keys, n, sizeof(*keys), cmp_key);
			for (size_t i = 1; i < n; i++)
				if (strcmp(keys[i - 1], keys[i]) == 0) {
					*dup = keys[i];
					sfw_free(keys);
					return 1;
				}
			sfw_free(keys);
		}
	}
	for (const cJSON *c = node ? node->child : NULL; c; c = c->next) {
		int r = has_duplicate_keys(c, dup);
		if (r)
			return r;
	}
	return 0;
}

enum sfw_status sfw_json_parse_object(const char *bytes, size_t len, size_t max, const char *what, cJSON **out,
				      struct sfw_err *err)
{
	*out = NULL;
	if (len > max)
		return sfw_fail(err, SFW_E_RANGE, "%s: larger than %zu bytes", what, max);
	enum sfw_status st = sfw_json_parse(bytes, len, what, out, err);
	if (st == SFW_OK && !cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		return sfw_fail(err, SFW_E_FORMAT, "%s: not a JSON object", what);
	}
	return st;
}

enum sfw_status sfw_json_parse(const char *bytes, size_t len, const char *what, cJSON **out, struct sfw_err *err)
{
	*out = NULL;
	if (memchr(bytes, '\0', len))
		return sfw_fail(err, SFW_E_FORMAT, "%s: contains a NUL byte", what);
	if (!sfw_utf8_valid((const unsigned char *)bytes, len))
		return sfw_fail(err, SFW_E_FORMAT, "%s: not valid UTF-8", what);
	const char *end = NULL;
	/* bytes need not be NUL-terminated: cJSON takes the length. */
	cJSON *root = cJSON_ParseWithLengthOpts(bytes, len, &end, 0);
	if (!root) {
		size_t at = end && end >= bytes ? (size_t)(end - bytes) : 0;
		return sfw_fail(err, SFW_E_FORMAT, "%s: invalid JSON near byte %zu", what, at);
	}
	/* Only whitespace may follow the value. */
	for (const char *p = end; p < bytes + len; p++) {
		if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
			cJSON_Delete(root);
			return sfw_fail(err, SFW_E_FORMAT, "%s: trailing bytes after the JSON value at byte %zu", what,
					(size_t)(p - bytes));
		}
	}
	const char *dup = NULL;
	int dk = has_duplicate_keys(root, &dup);
	if (dk) {
		enum sfw_status s = dk < 0 ? sfw_fail(err, SFW_E_NOMEM, "%s: out of memory", what)
					   : sfw_fail(err, SFW_E_FORMAT, "%s: duplicate key '%.64s'", what, dup);
		cJSON_Delete(root);
		return s;
	}
	*out = root;
	return SFW_OK;
}

enum sfw_status sfw_json_string(const cJSON *obj, const char *key, const char *what, const char **out,
				struct sfw_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
	if (!it)
		return sfw_fail(err, SFW_E_FORMAT, "%s: missing field '%s'", what, key);
	if (!cJSON_IsString(it) || !it->valuestring)
		return sfw_fail(err, SFW_E_FORMAT, "%s: field '%s' must be a string", what, key);
	*out = it->valuestring;
	return SFW_OK;
}

enum sfw_status sfw_json_item_u64(const cJSON *it, const char *name, const char *what, uint64_t *out,
				  struct sfw_err *err)
{
	if (!cJSON_IsNumber(it))
		return sfw_fail(err, SFW_E_FORMAT, "%s: '%s' must be an integer", what, name);
	double d = it->valuedouble;
	if (!isfinite(d) || d < 0 || d != floor(d) || d > (double)SFW_JSON_MAX_SAFE_INT)
		return sfw_fail(err, SFW_E_RANGE, "%s: '%s' must be an integer in [0, 2^53-1]", what, name);
	*out = (uint64_t)d;
	return SFW_OK;
}

enum sfw_status sfw_json_u64(const cJSON *obj, const char *key, const char *what, uint64_t *out,
			     struct sfw_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
	if (!it)
		return sfw_fail(err, SFW_E_FORMAT, "%s: missing field '%s'", what, key);
	return sfw_json_item_u64(it, key, what, out, err);
}

