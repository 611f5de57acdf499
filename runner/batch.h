/* batch.h - the batched engine: many sequences in one forward per step. */
#ifndef SFW_BATCH_H
#define SFW_BATCH_H

#include "runner/runner.h"
#include "sfw.h"

#include <stdint.h>

struct sfw_batch;
struct sfw_batch_params {
	int max_seqs; /* <= 64 */
	int64_t pool_tokens;
	int64_t max_ctx;
};
struct sfw_batch_params sfw_batch_default_params(void);
SFW_MUST_CHECK enum sfw_status sfw_batch_new(struct sfw_model *m, const struct sfw_batch_params *p,
					     struct sfw_batch **out, struct sfw_err *err);
void sfw_batch_free(struct sfw_batch *b);
/* SFW_E_RANGE when full */
SFW_MUST_CHECK enum sfw_status sfw_batch_seq_open(struct sfw_batch *b, int *seq, struct sfw_err *err);
void sfw_batch_seq_close(struct sfw_batch *b, int seq); /* frees its KV blocks at once */
int64_t sfw_batch_seq_pos(const struct sfw_batch *b, int seq);
struct sfw_batch_item {
	int seq;
	const int32_t *ids;
	int n; /* 1 when decoding, a prompt chunk when prefilling */
	int want_logits;
};
/* one forward over all items; all or nothing; fails with a clear error when the KV pool is full */
SFW_MUST_CHECK enum sfw_status sfw_batch_step(struct sfw_batch *b, const struct sfw_batch_item *it, int n,
					      struct sfw_err *err);
const float *sfw_batch_logits(const struct sfw_batch *b, int item); /* [vocab], until the next step */

#endif
