/* journal.c - range lists and the resume journal of a partial: which byte
 * ranges are on disk and synced (fetch/fetch.h describes the format). */

#include "fetch/internal.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "json.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int sfwi_push_range(struct sfw_range **v, size_t *n, size_t *cap, uint64_t a, uint64_t b, int front)
{
	if (a >= b)
		return 0;
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 8;
		struct sfw_range *nv = sfw_realloc(*v, nc * sizeof(**v));
		if (!nv)
			return -1;
		*v = nv;
		*cap = nc;
	}
	if (front) {
		memmove(*v + 1, *v, *n * sizeof(**v));
		(*v)[0] = (struct sfw_range){a, b};
	} else {
		(*v)[*n] = (struct sfw_range){a, b};
	}
	(*n)++;
	return 0;
}

int sfwi_hash_reset(struct sfwi_file *f)
{
	if (f->h_ok)
		sfw_sha256_release(&f->h);
	f->h_ok = sfw_sha256_init(&f->h) == SFW_OK;
	f->hash_pos = 0;
	return f->h_ok ? 0 : -1;
}

/* The journal's bytes for ranges v[0..k) of a file of this size and sha256
 * (the ranges normalized: sorted, merged, within size), into b. */
enum sfw_status sfwi_journal_format(struct sfw_buf *b, uint64_t size, const unsigned char sha[32],
				    const struct sfw_range *v, size_t k)
{
	char hex[65];
	sfw_hex_encode(sha, 32, hex);
	enum sfw_status st = sfw_buf_printf(b, "{\"v\":1,\"size\":%llu,\"sha256\":\"%s\",\"done\":[",
					    (unsigned long long)size, hex);
	for (size_t i = 0; i < k && st == SFW_OK; i++)
		st = sfw_buf_printf(b, "%s[%llu,%llu]", i ? "," : "", (unsigned long long)v[i].start,
				    (unsigned long long)v[i].end);
	if (st == SFW_OK)
		st = sfw_buf_printf(b, "]}\n");
	return st;
}

enum sfw_status sfwi_journal_write(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	size_t n = f->ndone;
	for (struct sfwi_seg *s = f->segs; s; s = s->next)
		n++;
	struct sfw_range *v = sfw_malloc((n + 1) * sizeof(*v));
	if (!v)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < f->ndone; i++)
		v[k++] = f->done[i];
	for (struct sfwi_seg *s = f->segs; s; s = s->next)
		if (s->synced > s->start)
			v[k++] = (struct sfw_range){s->start, s->synced};
	k = sfw_fetch_normalize_ranges(v, k, UINT64_MAX, f->mf->size, NULL);
	struct sfw_buf b;
	sfw_buf_init(&b, JOURNAL_MAX);
	enum sfw_status st = sfwi_journal_format(&b, f->mf->size, f->mf->sha256, v, k);
	sfw_free(v);
	if (st != SFW_OK) {
		sfw_buf_release(&b);
		return sfw_fail(err, st, "journal for '%s' too large", f->mf->path);
	}
	st = sfw_write_file_atomicat(r->pfd, f->jname, f->journal, b.data, b.len, err);
	sfw_buf_release(&b);
	return st;
}

/* fdatasync the data, then record what is now durable. */
enum sfw_status sfwi_journal_flush(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err)
{
	if (f->fd < 0 || !f->dirty)
		return SFW_OK;
	for (struct sfwi_seg *s = f->segs; s; s = s->next) {
		int e = sfwi_seg_flush(s);
		if (e)
			return sfw_fail(err, e == ENOSPC ? SFW_E_NOSPACE : SFW_E_IO, "cannot write '%s': %s", f->part,
					strerror(e));
	}
	if (fdatasync(f->fd) != 0)
		return sfw_fail(err, SFW_E_IO, "cannot sync '%s': %s", f->part, strerror(errno));
	for (struct sfwi_seg *s = f->segs; s; s = s->next)
		s->synced = s->pos;
	f->dirty = 0;
	return sfwi_journal_write(r, f, err);
}

/* The journal's done ranges from its bytes: {"v":1,"size":N,"sha256":HEX,
 * "done":[[a,b],...]} for exactly this size and sha256, at most 100000
 * ranges, each a <= b. Returns how many (*out: sfw_malloc'ed), or 0 with
 * *out NULL for anything else (the partial is then started over). */
size_t sfwi_journal_parse(const char *data, size_t len, uint64_t want_size, const unsigned char want_sha[32],
			  struct sfw_range **out)
{
	cJSON *j = NULL;
	size_t n = 0;
	*out = NULL;
	if (sfw_json_parse(data, len, "journal", &j, NULL) != SFW_OK)
		goto out;
	uint64_t v = 0, size = 0;
	const char *hex = NULL;
	unsigned char sha[32];
	if (sfw_json_u64(j, "v", "journal", &v, NULL) != SFW_OK || v != 1 ||
	    sfw_json_u64(j, "size", "journal", &size, NULL) != SFW_OK || size != want_size ||
	    sfw_json_string(j, "sha256", "journal", &hex, NULL) != SFW_OK || sfw_hex_decode(hex, sha, 32) != 0 ||
	    memcmp(sha, want_sha, 32) != 0)
		goto out;
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "done");
	if (!cJSON_IsArray(d))
		goto out;
	int cnt = cJSON_GetArraySize(d);
	if (cnt <= 0 || cnt > 100000)
		goto out;
	*out = sfw_calloc((size_t)cnt, sizeof(**out));
	if (!*out)
		goto out;
	const cJSON *e;
	cJSON_ArrayForEach(e, d)
	{
		uint64_t a, bb;
		if (n >= (size_t)cnt || !cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 ||
		    sfw_json_item_u64(cJSON_GetArrayItem(e, 0), "start", "journal", &a, NULL) != SFW_OK ||
		    sfw_json_item_u64(cJSON_GetArrayItem(e, 1), "end", "journal", &bb, NULL) != SFW_OK || a > bb) {
			n = 0;
			goto out;
		}
		(*out)[n++] = (struct sfw_range){a, bb};
	}
out:
	if (j)
		cJSON_Delete(j);
	if (n == 0) {
		sfw_free(*out);
		*out = NULL;
	}
	return n;
}

/* Reads f's journal (sfwi_journal_parse); an unreadable one counts as none. */
size_t sfwi_journal_read(struct sfwi_run *r, struct sfwi_file *f, struct sfw_range **out)
{
	struct sfw_buf b;
	*out = NULL;
	if (sfw_read_fileat(r->pfd, f->jname, f->journal, JOURNAL_MAX, &b, NULL) != SFW_OK)
		return 0;
	size_t n = sfwi_journal_parse(b.data, b.len, f->mf->size, f->mf->sha256, out);
	sfw_buf_release(&b);
	return n;
}
