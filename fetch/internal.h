/* internal.h - what the files of the downloader share (fetch/get.c and the
 * files it names): its limits, the state of a run, and the sfwi_ functions
 * one file calls in another. Not a public header: only the files of fetch/ include it. */
#ifndef SFW_FETCH_INTERNAL_H
#define SFW_FETCH_INTERNAL_H

#include "fetch/fetch.h"

#include "verify/verify.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stdint.h>

#define JOURNAL_MAX (256u << 10)
#define HASH_CHUNK (4u << 20)
#define WRITEBACK_KICK (8u << 20) /* bytes written before their writeback is started */
/* libcurl hands the body over in 16 KiB pieces: one pwrite per piece cost more
 * system time than the copy into this buffer (measured: 67652 pwrites per GiB
 * were half of the run's system time). Lost on SIGKILL: at most this per
 * transfer, never counted as durable (the journal flushes it first). */
#define WRITE_COALESCE (1u << 20)
#define DEFAULT_ENDPOINT "https://freeweights.allternit.com"
/* Scheduling by measured throughput (sfw_fetch_speed_verdict): every
 * MEASURE_MS each transfer's rate over its last WINDOW_MS is taken; a
 * transfer on a source several times slower (per connection) than another
 * source usable for the same file loses its remaining range to that source,
 * and the slow source is demoted (tried after the others from then on). A
 * source with no measurement yet is measured first by a probe: the tail of
 * the slow transfer's range, at most PROBE_MAX bytes. Below the factor the
 * order of sources decides, as before. */
#define MEASURE_MS 500
#define WINDOW_MS 1000
#define PROBE_MAX (8u << 20)
#define RATE_SAMPLE_MIN (64u << 10) /* a finished transfer this short says little about a source's speed */
/* A source whose transfers of one file end in a stall (the low-speed abort)
 * this many times with no completed range between is struck for that file,
 * even though each stall came after some progress, when another source is
 * left for it. */
#define STALL_STRIKES 3
/* Verified files wait for their fsync in batches: up to SYNC_BATCH files or
 * SYNC_WAIT_MS, then SYNC_THREADS fsyncs at once (a device flush each: run
 * one after another they cap a run at ~300 files/s on this disk, in
 * parallel the flushes coalesce), then the renames, then one fsync per
 * directory. A file counts as done (and the state record may name it) only
 * after all of that. */
#define SYNC_BATCH 128
#define SYNC_WAIT_MS 20
#define SYNC_THREADS 16

#define BURST_MS 50 /* the --limit-rate bucket holds at most this many ms of bytes */

/* ---- state ---------------------------------------------------------------- */

struct sfwi_src {
	struct sfw_source s;
	const char *label; /* as shown: its name, or its URL with the userinfo redacted (shown) */
	char *shown;
	int bearer;     /* a manifest hf source: gets p->hf_token */
	unsigned fails; /* consecutive failures */
	int demoted;
	double rate;    /* measured bytes/s per connection, 0 = not measured yet */
	int probing;    /* a probe transfer is measuring it */
	int down;       /* its host cannot be reached: struck for every file */
};

enum sfwi_reason { R_NONE, R_HTTP, R_RANGE, R_COMMIT, R_OVERFLOW, R_IO, R_CANCEL, R_RESTART, R_CUT };

struct sfwi_file;

struct sfwi_seg {
	struct sfwi_file *f;
	struct sfwi_run *run;       /* the get this transfer belongs to (the write callback's) */
	CURL *h;
	int src;
	uint64_t start, end, pos, launch_pos, synced;
	uint64_t req_end;      /* end of the range asked for; end may be lowered below it (cut) */
	uint64_t t_launch, win_t, win_pos; /* ms; the rate window's start */
	double rate;           /* bytes/s over the last window */
	int rate_ok;           /* a whole window measured */
	int probe;             /* measures its source for the scheduler */
	int cut;               /* end lowered: its tail went to another source */
	int paused;            /* held by the --limit-rate bucket (CURL_WRITEFUNC_PAUSE) */
	int held, held_win;    /* paused at some time in the current / last rate window */
	uint64_t kicked;       /* [kicked, pos - wlen) on disk, writeback not started */
	unsigned char *wbuf;   /* received bytes [pos - wlen, pos) not yet written */
	size_t wlen;
	int ranged, checked;
	enum sfwi_reason reason;
	int io_errno;
	long status;
	char content_range[128];
	char retry_after[80];
	char commit[64];
	char errbuf[CURL_ERROR_SIZE];
	struct sfwi_seg *next;
};

/* F_VERIFIED: every byte in and the sha256 matched; waiting for the batched
 * fsync + rename (finish_batch) before it is F_DONE. F_UNSELECTED: left out
 * by --include/--exclude. */
enum sfwi_fstate { F_PENDING, F_ACTIVE, F_VERIFIED, F_DONE, F_FAILED, F_SKIPPED, F_UNSELECTED };

struct sfwi_file {
	size_t idx;
	const struct sfw_manifest_file *mf;
	enum sfwi_fstate state;
	int fd;
	char *part, *journal, *final; /* as messages name them */
	char *pname, *jname;          /* the partial's and journal's names in partial/ */
	struct sfw_range *done;
	size_t ndone, capdone;
	struct sfw_range *todo;
	size_t ntodo, captodo;
	struct sfwi_seg *segs;
	int nactive;
	uint64_t not_before;
	unsigned attempts;
	int cur_src;
	size_t nstruck; /* sources struck for it (at most SFW_FETCH_MAX_SOURCES are tried) */
	unsigned char *src_failed, *contributed;
	unsigned char *norange; /* per source: answered a Range with 200 once already */
	unsigned char *stalls;  /* per source: stalls since its last completed range */
	unsigned char *probed;  /* per source: a probe for this file was started */
	struct sfw_sha256 h;
	int h_ok;
	uint64_t hash_pos;
	uint64_t have;      /* bytes of the file written (done + active progress) */
	uint64_t kept;      /* resumed from an earlier run */
	int prior;          /* holds bytes whose source is unknown (earlier run) */
	int locked;         /* its partial is held by another process */
	int exhausted;      /* mismatches that no source can be blamed for: fail it */
	struct sfw_file_id id; /* in place and verified: what the state record vouches for */
	int dirty;
	unsigned mismatches;
	long last_status;
	int last_curl;
	char last_err[200];
};

struct sfwi_run {
	const struct sfw_fetch_params *p;
	const struct sfw_manifest *m;
	const char *dest;
	int dfd, sfd, pfd; /* DEST, DEST/.salafw, DEST/.salafw/partial: every write goes through them */
	struct sfwi_src *srcs;
	size_t nsrcs;
	struct sfwi_file *files;
	size_t nfiles;
	CURLM *multi;
	int nhandles;
	uint64_t t0;
	uint64_t plan_total, plan_done_base;
	uint64_t received, discarded, resumed;
	uint64_t last_progress, last_journal, rate_bytes, last_measure;
	int rate_nhandles;      /* handles the --limit-rate share was last computed for */
	size_t nverified;       /* files in F_VERIFIED */
	uint64_t verified_since;/* when the oldest of them got there */
	int woke;               /* something finished: run the scheduler before waiting */
	double tokens;          /* --limit-rate bucket: bytes that may arrive now (< 0: owed) */
	uint64_t tokens_t;      /* when it was last refilled */
	int npaused;            /* transfers paused until it refills */
	double rate;
	uint32_t rng;
	unsigned char *hashbuf;
	int cancelled;
	enum sfw_status fatal;
	struct sfw_err fatal_err;
};

/* get.c */
uint64_t sfwi_now_ms(void);
uint32_t sfwi_rnd32(struct sfwi_run *r);
bool sfwi_emit(struct sfwi_run *r, enum sfw_fetch_event_kind kind, struct sfwi_file *f, int src, const char *msg);
bool sfwi_emit_delay(struct sfwi_run *r, struct sfwi_file *f, int src, const char *msg, uint64_t delay);

/* journal.c */
int sfwi_push_range(struct sfw_range **v, size_t *n, size_t *cap, uint64_t a, uint64_t b, int front);
int sfwi_hash_reset(struct sfwi_file *f);
enum sfw_status sfwi_journal_write(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err);
enum sfw_status sfwi_journal_flush(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err);
enum sfw_status sfwi_journal_format(struct sfw_buf *b, uint64_t size, const unsigned char sha[32],
				    const struct sfw_range *v, size_t k);
size_t sfwi_journal_parse(const char *data, size_t len, uint64_t want_size, const unsigned char want_sha[32],
			  struct sfw_range **out);
size_t sfwi_journal_read(struct sfwi_run *r, struct sfwi_file *f, struct sfw_range **out);

/* sources.c */
int sfwi_pick_source(struct sfwi_run *r, struct sfwi_file *f);
void sfwi_strike_source(struct sfwi_run *r, int src, struct sfwi_file *f, const char *why);
void sfwi_source_down(struct sfwi_run *r, int src, struct sfwi_file *f, const char *why);
int sfwi_other_source(struct sfwi_run *r, struct sfwi_file *f, int src);
int sfwi_src_usable(struct sfwi_run *r, struct sfwi_file *f, size_t src);
enum sfw_status sfwi_measure(struct sfwi_run *r, struct sfw_err *err);

/* transfer.c */
void sfwi_seg_free(struct sfwi_run *r, struct sfwi_seg *s);
int sfwi_seg_flush(struct sfwi_seg *s);
enum sfw_status sfwi_seg_start(struct sfwi_run *r, struct sfwi_file *f, int src, struct sfw_err *err);
enum sfw_status sfwi_seg_done(struct sfwi_run *r, struct sfwi_seg *s, CURLcode cc, struct sfw_err *err);
enum sfw_status sfwi_seg_requeue(struct sfwi_run *r, struct sfwi_seg *s, struct sfw_err *err);
int sfwi_bucket_refill(struct sfwi_run *r);
void sfwi_rate_share(struct sfwi_run *r);

/* files.c */
void sfwi_file_close(struct sfwi_file *f);
enum sfw_status sfwi_file_reset(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err);
enum sfw_status sfwi_file_activate(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err);
enum sfw_status sfwi_file_finish(struct sfwi_run *r, struct sfwi_file *f, struct sfw_err *err);
enum sfw_status sfwi_finish_batch(struct sfwi_run *r, struct sfw_err *err);
void sfwi_file_fail(struct sfwi_run *r, struct sfwi_file *f);

/* load.c */
enum sfw_status sfwi_load_manifest(const struct sfw_fetch_params *p, struct sfw_buf *man, struct sfw_buf *sig, char **what,
			      struct sfw_err *err);

#endif
