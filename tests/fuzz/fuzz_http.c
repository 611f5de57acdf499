/* fuzz_http - libFuzzer target for the parsers of HTTP response headers that
 * the fetcher trusts: Content-Range, Retry-After, and the response check built
 * on them. Each accepted value must satisfy what its parser promises. */
#include "fetch/fetch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char s[512];
	size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;
	memcpy(s, data, n);
	s[n] = '\0';

	uint64_t first, last, total;
	if (sfw_fetch_parse_content_range(s, &first, &last, &total) == 0) {
		int unsatisfied = first == UINT64_MAX && last == UINT64_MAX;
		if (!unsatisfied && (first > last || last >= total))
			abort();
	}
	int64_t ms = sfw_fetch_retry_after_ms(s, 1700000000);
	if (ms < -1 || ms > 86400000)
		abort();
	/* The verdict for a ranged request [1000, 5000) of an 8000-byte file. */
	enum sfw_fetch_verdict v = sfw_fetch_check_response(1, 1000, 5000, 8000, 206, s, 4000);
	if (v == SFW_RESP_ACCEPT) {
		if (sfw_fetch_parse_content_range(s, &first, &last, &total) != 0 || first != 1000 || last != 4999 ||
		    total != 8000)
			abort();
	}
	return 0;
}
