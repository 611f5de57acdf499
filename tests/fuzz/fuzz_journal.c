/* fuzz_journal - libFuzzer target for the resume journal of `get`
 * (fetch/journal.c): the parser never accepts a range with start > end or
 * more than 100000 of them, and what it accepts, normalized and written back
 * by the journal's own writer, reads back as the same ranges (a round trip),
 * as a resume after a crash relies on. The file's size comes from the first
 * 8 input bytes, its sha256 is fixed (the seeds name it). */
#include "fetch/internal.h"

#include "alloc.h"
#include "buf.h"
#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	sfw_log_set(NULL, NULL, SFW_LOG_WARN + 1);
	if (size < 8)
		return 0;
	uint64_t fsize;
	memcpy(&fsize, data, 8);
	fsize %= 1u << 30; /* sizes a seed can name in decimal */
	static const unsigned char sha[32] = {0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
					      0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
					      0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
					      0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab};
	struct sfw_range *r = NULL;
	size_t n = sfwi_journal_parse((const char *)data + 8, size - 8, fsize, sha, &r);
	if (n == 0) {
		if (r)
			abort();
		return 0;
	}
	if (!r || n > 100000)
		abort();
	for (size_t i = 0; i < n; i++)
		if (r[i].start > r[i].end)
			abort();
	uint64_t have = 0;
	size_t k = sfw_fetch_normalize_ranges(r, n, UINT64_MAX, fsize, &have);
	for (size_t i = 0; i < k; i++)
		if (r[i].start >= r[i].end || r[i].end > fsize || (i && r[i].start <= r[i - 1].end))
			abort(); /* normalized: sorted, disjoint, not touching, within the file */
	if (k == 0) {
		sfw_free(r);
		return 0;
	}
	struct sfw_buf b;
	sfw_buf_init(&b, JOURNAL_MAX);
	enum sfw_status st = sfwi_journal_format(&b, fsize, sha, r, k);
	if (st != SFW_OK && st != SFW_E_RANGE)
		abort(); /* SFW_E_RANGE: over JOURNAL_MAX, refused as "journal too large" */
	if (st != SFW_OK || have > fsize)
		abort();
	struct sfw_range *r2 = NULL;
	size_t n2 = sfwi_journal_parse(b.data, b.len, fsize, sha, &r2);
	if (n2 != k || memcmp(r, r2, k * sizeof(*r)) != 0)
		abort();
	sfw_buf_release(&b);
	sfw_free(r);
	sfw_free(r2);
	return 0;
}
