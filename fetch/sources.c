/* sources.c - which source a file takes next, striking a failed source,
 * and scheduling by measured throughput: a source several times slower than
 * another usable one is demoted and its transfers give their rest away; an
 * unmeasured one is measured by a probe (sfw_fetch_speed_verdict). */

#include "fetch/internal.h"

#include "alloc.h"

#include <stdio.h>
#include <string.h>

int sfwi_pick_source(struct sfwi_run *r, struct sfwi_file *f)
{
	if (f->nstruck >= SFW_FETCH_MAX_SOURCES)
		return -1; /* the sources after them stay untried (file_fail says so) */
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < r->nsrcs; i++)
			if (!f->src_failed[i] && r->srcs[i].demoted == pass)
				return (int)i;
	return -1;
}

void sfwi_strike_source(struct sfwi_run *r, int src, struct sfwi_file *f, const char *why)
{
	struct sfwi_src *s = &r->srcs[src];
	if (!f->src_failed[src])
		f->nstruck++;
	f->src_failed[src] = 1;
	sfwi_emit(r, SFW_EV_SOURCE_FAILED, f, src, why);
	if (++s->fails >= r->p->demote_after && !s->demoted) {
		s->demoted = 1;
		sfwi_emit(r, SFW_EV_SOURCE_DEMOTED, NULL, src, "kept failing; tried last from now on");
	}
	if (f->cur_src == src)
		f->cur_src = sfwi_pick_source(r, f);
	f->attempts = 0;
}

/* src's host could not be reached (f's transfer met it): strike it for every
 * file at once, with one event, instead of trying it again file by file. */
void sfwi_source_down(struct sfwi_run *r, int src, struct sfwi_file *f, const char *why)
{
	struct sfwi_src *s = &r->srcs[src];
	if (!s->down) {
		s->down = 1;
		char msg[300];
		snprintf(msg, sizeof(msg), "%s: not tried again for any file", why);
		sfwi_emit(r, SFW_EV_SOURCE_FAILED, NULL, src, msg);
	}
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *g = &r->files[i];
		if (g->src_failed[src])
			continue;
		g->src_failed[src] = 1;
		g->nstruck++;
		if (g != f && (g->state == F_PENDING || g->state == F_ACTIVE))
			snprintf(g->last_err, sizeof(g->last_err), "%s: %s", s->label, why);
		if (g->cur_src == src)
			g->cur_src = sfwi_pick_source(r, g);
	}
	f->attempts = 0;
}

/* Another source not yet struck for this file? */
int sfwi_other_source(struct sfwi_run *r, struct sfwi_file *f, int src)
{
	for (size_t i = 0; i < r->nsrcs; i++)
		if ((int)i != src && !f->src_failed[i])
			return 1;
	return 0;
}

/* Can src take a part of f now? (not struck for it, not demoted, and able to
 * answer a Range) */
int sfwi_src_usable(struct sfwi_run *r, struct sfwi_file *f, size_t src)
{
	return !f->src_failed[src] && !f->norange[src] && !r->srcs[src].demoted;
}

static void human_rate(char *out, size_t n, double b)
{
	if (b >= 1e6)
		snprintf(out, n, "%.1f MB/s", b / 1e6);
	else
		snprintf(out, n, "%.0f KB/s", b / 1e3);
}

/* slow is several times slower than fast: demote it, and every transfer on
 * it whose file can go to a faster source gives its rest back. */
static enum sfw_status demote_slow(struct sfwi_run *r, int slow, int fast, double slow_rate, struct sfw_err *err)
{
	struct sfwi_src *s = &r->srcs[slow];
	char a[32], b[32], msg[300];
	human_rate(a, sizeof(a), slow_rate);
	human_rate(b, sizeof(b), r->srcs[fast].rate);
	snprintf(msg, sizeof(msg), "%s per connection against %s from %s: its remaining ranges go to the faster source",
		 a, b, r->srcs[fast].label);
	s->demoted = 1;
	sfwi_emit(r, SFW_EV_SOURCE_DEMOTED, NULL, slow, msg);
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		if (f->state != F_ACTIVE)
			continue;
		int alt = 0;
		for (size_t k = 0; k < r->nsrcs; k++)
			alt |= (int)k != slow && sfwi_src_usable(r, f, k);
		if (!alt)
			continue;
		for (struct sfwi_seg *g = f->segs, *next; g; g = next) {
			next = g->next;
			if (g->src == slow) {
				enum sfw_status st = sfwi_seg_requeue(r, g, err);
				if (st != SFW_OK)
					return st;
			}
		}
		if (f->cur_src == slow)
			f->cur_src = sfwi_pick_source(r, f);
	}
	return SFW_OK;
}

/* Every MEASURE_MS: each transfer's rate over its last window, each source's
 * best per-connection rate, then at most one decision: demote a source
 * several times slower than another usable one, or probe an unmeasured one
 * with the tail of a transfer that still has a while to go. */
enum sfw_status sfwi_measure(struct sfwi_run *r, struct sfw_err *err)
{
	uint64_t now = sfwi_now_ms();
	if (now - r->last_measure < MEASURE_MS)
		return SFW_OK;
	r->last_measure = now;
	double *best = sfw_calloc(r->nsrcs ? r->nsrcs : 1, sizeof(*best));
	if (!best)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	for (size_t i = 0; i < r->nfiles; i++)
		for (struct sfwi_seg *s = r->files[i].segs; s; s = s->next) {
			if (now - s->win_t < WINDOW_MS)
				continue;
			s->rate = (double)(s->pos - s->win_pos) * 1000.0 / (double)(now - s->win_t);
			s->rate_ok = 1;
			s->win_t = now;
			s->win_pos = s->pos;
			s->held_win = s->held;
			s->held = s->paused;
			if (s->rate > best[s->src])
				best[s->src] = s->rate;
		}
	for (size_t i = 0; i < r->nsrcs; i++)
		if (best[i] > 0)
			r->srcs[i].rate = best[i];
	sfw_free(best);
	for (size_t i = 0; i < r->nfiles; i++) {
		struct sfwi_file *f = &r->files[i];
		if (f->state != F_ACTIVE)
			continue;
		for (struct sfwi_seg *s = f->segs; s; s = s->next) {
			/* judged once it has sent something (before its first byte
			 * the connect and stall timeouts are the judges), and not when
			 * the --limit-rate cap held it back (the cap set its pace) */
			if (!s->rate_ok || s->pos >= s->end || s->pos == s->launch_pos || s->held_win)
				continue;
			uint64_t rem = s->end - s->pos;
			int fast = -1, unknown = -1;
			for (size_t k = 0; k < r->nsrcs; k++) {
				if ((int)k == s->src || !sfwi_src_usable(r, f, k))
					continue;
				double rk = r->srcs[k].rate;
				switch (sfw_fetch_speed_verdict(s->rate, rem, rk)) {
				case SFW_SPEED_MOVE:
					if (fast < 0 || rk > r->srcs[fast].rate)
						fast = (int)k;
					break;
				case SFW_SPEED_PROBE:
					if (unknown < 0 && !r->srcs[k].probing && !f->probed[k])
						unknown = (int)k;
					break;
				case SFW_SPEED_KEEP:
					break;
				}
			}
			if (fast >= 0)
				return demote_slow(r, s->src, fast, s->rate, err);
			if (unknown < 0)
				continue;
			/* probe: the tail of this range goes to the unmeasured source */
			uint64_t len = rem / 2 < PROBE_MAX ? rem / 2 : PROBE_MAX;
			uint64_t mid = s->end - len;
			if (sfwi_push_range(&f->todo, &f->ntodo, &f->captodo, mid, s->end, 1) != 0)
				return sfw_fail(err, SFW_E_NOMEM, "out of memory");
			s->end = mid;
			s->cut = 1;
			enum sfw_status st = sfwi_seg_start(r, f, unknown, err);
			if (st != SFW_OK)
				return st;
			f->segs->probe = 1; /* seg_start puts the new one first */
			r->srcs[unknown].probing = 1;
			f->probed[unknown] = 1;
			return SFW_OK;
		}
	}
	return SFW_OK;
}
