/* awq.c - the AWQ scale search (docs/awq.md §1) with MiniCPM-SALA's mappings
 * (docs/awq.md §1.8), run before the writer folds the scales.
 *
 * 1. Calibration: the model's tokenizer on the calibration text (--calib, or
 *    the built-in sfw_default_corpus); the tokens are cut into sequences of
 *    `seq_len` (BOS first): by default (samples 0) as many as the text fills,
 *    at most SFW_QUANT_AUTO_SAMPLES, the last one shorter, each token used
 *    once; an explicit `samples` is run whole, going through the text again
 *    from its start when it is shorter than that. A directory without tokenizer.model
 *    (the golden test models) uses the text's bytes as ids (3 + byte), with
 *    a warning; a vocab below 259 cannot hold them and is refused. Each sequence is one prefill through the
 *    bf16 model on the runner (fp32 on the CPU) with the linear-input taps
 *    (runner.h): every row updates the per-channel mean |x| (double sums);
 *    an evenly spaced subset of loss_rows rows per layer is kept for the loss.
 *    The inputs are the full-precision model's (AutoAWQ's choice; at 8 bits
 *    the difference to re-propagating the quantized model is negligible).
 * 2. Per smoothing group (smooth -> balance):
 *      input_layernorm -> q,k,v + o_gate (sparse) or z_proj (lightning)
 *      o_norm -> o_proj (lightning, when use_output_norm)
 *      post_attention_layernorm -> gate, up
 *      up_proj -> down_proj
 *    never v_proj -> o_proj (GQA in sparse layers, o_norm in lightning).
 *    Candidates: the identity (s = 1: plain RTN, the llm-compressor baseline)
 *    and alpha = k/n_grid, k = 1..n_grid-1 (AutoAWQ's grid without its
 *    alpha = 0 point, which with duo scaling is not the identity), with duo
 *    scaling by default: s = max(x^a / (w^(1-a) + 1e-4), 1e-4), w = mean over
 *    balance rows of |w| / group max |w|; plain: s = max(x^a, 1e-4); then
 *    s /= sqrt(max s * min s); non-finite -> 1.
 *    Loss (the cheaper proxy of docs/awq.md §1.8, documented): the mean squared
 *    error, in fp32 with double sums, of the balance linears' outputs on the
 *    cached input rows, Q(W diag s) diag(s)^-1 x against W x, with the final
 *    quantizer (sfw_quant_fake_row_w8: same group size, same rounding). The
 *    attention / MLP nonlinearity is not in the loop. Strictly lower loss
 *    wins; the identity wins ties, so the search never loses to RTN on its
 *    own loss.
 *    When the model runs on CUDA, the search runs there (quant/awq_cuda.c,
 *    kernels/awq.cu) on the weights' device copies: every product, quotient
 *    and sum in the order the CPU takes it (a lane-for-lane replay of
 *    sfw_op_matmul_cpu, double row sums), so every candidate's loss, and
 *    with it the chosen alpha and scales, equal the CPU search's bit for bit.
 * 3. The winning s (NULL for the identity) goes to the writer's fold
 *    (quant_int.h), which is exact in real arithmetic. */
#include "quant/quant_int.h"
#include "alloc.h"
#include "file.h"
#include "formats/tokenizer.h"
#include "kernels/ops.h"
#include "log.h"
#include "simd.h"
#include "thread.h"
#include "runner/model.h"
#include "runner/runner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

enum { T_ATTN, T_O, T_MLP, T_DOWN, T_N };
static const char *const tap_names[T_N] = {"attn_in", "o_in", "mlp_in", "down_in"};

struct tapstat {
	int cols;
	double *sum; /* per channel sum |x| */
	int64_t count;
	float *rows; /* [loss_rows, cols] kept inputs */
	int nrows;
};

struct calib {
	const struct sfw_model *m; /* its weights' pages are released layer by layer */
	int last_layer;            /* the layer whose taps came last */
	int L, loss_rows;
	int64_t stride; /* keep token rows whose index % stride == 0 */
	int64_t seen[SFW_MAX_LAYERS][T_N];
	struct tapstat *st; /* [L][T_N] */
	int nomem;
	struct sfw_ops_cpu *ex; /* the statistics' and the search's executor (sfwi_awq_search) */
};

/* Drops the resident pages of layer li's weights (all of them: the CPU
 * engine reads the map in place, the CUDA one read it for the upload). */
static void release_layer(const struct sfw_model *m, int li)
{
	char pre[48];
	int n = snprintf(pre, sizeof(pre), "model.layers.%d.", li);
	for (size_t i = 0; i < sfw_st_set_count(m->st); i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(m->st, i);
		if (strncmp(t->name, pre, (size_t)n) == 0)
			sfw_map_release(t->data, t->nbytes);
	}
}

#define ABSUM_COLS 256
struct absum_job {
	const float *x;
	double *sum;
	int rows, cols;
};

/* sum[j] += |x[r, j]| for the channels of blocks [b, e), rows in order. */
static void absum_cols(void *ctx, size_t b, size_t e, int tid)
{
	const struct absum_job *j = ctx;
	(void)tid;
	int j0 = (int)b * ABSUM_COLS, j1 = (int)e * ABSUM_COLS < j->cols ? (int)e * ABSUM_COLS : j->cols;
	for (int r = 0; r < j->rows; r++) {
		const float *xr = j->x + (size_t)r * j->cols;
		for (int q = j0; q < j1; q++)
			j->sum[q] += fabsf(xr[q]);
	}
}

static void on_tap(void *user, const struct sfw_tap *t)
{
	struct calib *c = user;
	if (c->nomem) /* the run stops after this prefill; later chunks must not touch a half-made tapstat */
		return;
	int li;
	char what[16];
	if (sscanf(t->name, "prefill.layer.%d.%15s", &li, what) != 2 || li < 0 || li >= c->L)
		return;
	int k = 0;
	while (k < T_N && strcmp(what, tap_names[k]) != 0)
		k++;
	if (k == T_N)
		return;
	if (li != c->last_layer) { /* the forward moved on: the layer before is done with for this sequence */
		if (c->last_layer >= 0)
			release_layer(c->m, c->last_layer);
		c->last_layer = li;
	}
	struct tapstat *s = &c->st[li * T_N + k];
	if (!s->sum) {
		s->cols = t->cols;
		s->sum = sfw_calloc((size_t)t->cols, sizeof(double));
		s->rows = sfw_malloc((size_t)c->loss_rows * t->cols * sizeof(float));
		if (!s->sum || !s->rows) {
			sfw_free(s->sum), sfw_free(s->rows);
			s->sum = NULL, s->rows = NULL;
			c->nomem = 1;
			return;
		}
	}
	if (t->cols != s->cols)
		return;
	const float *x = t->data;
	/* the per-channel sums, a range of channels per thread: each channel
	 * still adds its rows in order, so the sums do not depend on threads */
	struct absum_job aj = {x, s->sum, t->rows, t->cols};
	size_t nb = ((size_t)t->cols + ABSUM_COLS - 1) / ABSUM_COLS;
	sfwi_ops_cpu_for(c->ex, (double)t->rows * t->cols < 1 << 16 ? 1 : sfw_ops_cpu_threads(c->ex), nb, 1,
			 absum_cols, &aj);
	for (int r = 0; r < t->rows; r++) {
		const float *xr = x + (size_t)r * t->cols;
		int64_t idx = c->seen[li][k]++;
		if (idx % c->stride == 0 && s->nrows < c->loss_rows)
			memcpy(s->rows + (size_t)s->nrows++ * t->cols, xr, (size_t)t->cols * sizeof(float));
	}
	s->count += t->rows;
}

/* ---- calibration tokens ------------------------------------------------------- */
static enum sfw_status calib_ids(const char *dir, const struct sfw_quant_params *p, int vocab, int32_t **ids,
				 size_t *n, struct sfw_err *err)
{
	struct sfw_buf text;
	sfw_buf_init(&text, 256u << 20);
	const char *t = sfw_default_corpus;
	size_t len = sfw_default_corpus_len();
	enum sfw_status s = SFW_OK;
	if (p->calib_path) {
		if ((s = sfw_read_file(p->calib_path, 256u << 20, &text, err)) != SFW_OK) {
			if (s == SFW_E_MISSING && err) /* a local input problem: exit 5, not 1 */
				err->code = SFW_E_IO;
			return s == SFW_E_MISSING ? SFW_E_IO : s;
		}
		t = text.data, len = text.len;
	}
	char *tp = sfw_path_join(dir, "tokenizer.model");
	struct stat st;
	int have = tp && stat(tp, &st) == 0;
	sfw_free(tp);
	if (have) {
		struct sfw_tokenizer *tok = NULL;
		if ((s = sfw_tokenizer_load(dir, vocab, &tok, err)) == SFW_OK)
			s = sfw_tokenizer_encode(tok, t, len, 0, ids, n, err);
		sfw_tokenizer_free(tok);
	} else if (vocab < 259) { /* ids 3 + byte must stay below the vocab */
		s = sfw_fail(err, SFW_E_UNSUPPORTED,
			     "model '%s': no tokenizer.model, and vocab_size %d is too small to calibrate on bytes "
			     "(259 needed); use --method rtn", dir, vocab);
	} else {
		sfw_log(SFW_LOG_WARN, "'%s' has no tokenizer.model: AWQ calibrates on the text's bytes as token ids",
			dir);
		*ids = sfw_malloc((len ? len : 1) * sizeof(int32_t));
		if (!*ids)
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		for (size_t i = 0; s == SFW_OK && i < len; i++)
			(*ids)[i] = 3 + (int32_t)(unsigned char)t[i];
		*n = len;
	}
	sfw_buf_release(&text);
	if (s == SFW_OK && *n < 16) {
		sfw_free(*ids);
		*ids = NULL;
		s = sfw_fail(err, SFW_E_INVAL, "the calibration text gives only %zu tokens", *n);
	}
	return s;
}

/* ---- the search ---------------------------------------------------------------- */

/* The search's CPU work runs on the executor made by sfwi_awq_search (the
 * products through sfw_op_matmul_cpu, the rest below): rows are independent,
 * and every sum is taken in a fixed order over fixed items, so the scales
 * chosen do not depend on the thread count. The same sums in the same order
 * are what kernels/awq.cu computes on the GPU (the functions below marked
 * "twin" are its kernels' C twins). */
struct wq_job {
	const float *W;
	float *Wq;
	const float *s;
	int K, group;
	unsigned char *bad; /* [N]: 1 where a row had non-finite weights */
};

typedef float awq_v8 __attribute__((vector_size(32)));

/* q = w * s (div 0) or q = q / s (div 1), 8 at a time: the same IEEE
 * products and quotients as the scalar loop. */
SFW_CLONES
static void scale_row(float *q, const float *w, const float *s, int K, int div)
{
	int k = 0;
	for (; k + 8 <= K; k += 8) {
		awq_v8 a, b;
		memcpy(&a, div ? q + k : w + k, 32);
		memcpy(&b, s + k, 32);
		a = div ? a / b : a * b;
		memcpy(q + k, &a, 32);
	}
	for (; k < K; k++)
		q[k] = div ? q[k] / s[k] : w[k] * s[k];
}

/* Rows [b, e) of Q(W diag s) diag(s)^-1 into Wq. */
static void wq_rows(void *ctx, size_t b, size_t e, int tid)
{
	const struct wq_job *j = ctx;
	(void)tid;
	for (size_t r = b; r < e; r++) {
		float *q = j->Wq + r * (size_t)j->K;
		scale_row(q, j->W + r * (size_t)j->K, j->s, j->K, 0);
		j->bad[r] = sfw_quant_fake_row_w8(q, j->K, j->group) != 0;
		scale_row(q, q, j->s, j->K, 1);
	}
}

void sfwi_awq_fake_rows(struct sfw_ops_cpu *ex, float *Wq, unsigned char *bad, const float *W, const float *s,
			int64_t N, int K, int group)
{
	int nt = sfw_ops_cpu_threads(ex);
	size_t grain = (size_t)N / ((size_t)nt * 8) > 0 ? (size_t)N / ((size_t)nt * 8) : 1;
	struct wq_job qj = {W, Wq, s, K, group, bad};
	sfwi_ops_cpu_for(ex, nt, (size_t)N, grain, wq_rows, &qj);
}

struct loss_job {
	const float *a, *b;
	size_t N;
	double *part; /* [R]: each cached input row's sum of squares, in n order */
};

static void loss_rows(void *ctx, size_t b, size_t e, int tid)
{
	const struct loss_job *j = ctx;
	(void)tid;
	for (size_t r = b; r < e; r++) {
		const float *x = j->a + r * j->N, *y = j->b + r * j->N;
		double t = 0;
		for (size_t n = 0; n < j->N; n++) {
			double d = (double)x[n] - y[n];
			t += d * d;
		}
		j->part[r] = t;
	}
}

void sfwi_awq_sqerr_rows(struct sfw_ops_cpu *ex, double *part, const float *A, const float *B, int R,
			 size_t N)
{
	struct loss_job j = {A, B, N, part};
	sfwi_ops_cpu_for(ex, sfw_ops_cpu_threads(ex), (size_t)R, 1, loss_rows, &j);
}

/* The mean squared error from the rows' sums: added in row order. */
static double loss_of(const double *part, int R, size_t N)
{
	double t = 0;
	for (int r = 0; r < R; r++)
		t += part[r];
	size_t n = (size_t)R * N;
	return t / (double)(n ? n : 1);
}

struct wconv_job {
	const struct sfwi_awq_group *g;
	float *W;
	int K;
};

/* The balance weights' rows [b, e) (over all of them in order) as float. */
static void wconv_rows(void *ctx, size_t b, size_t e, int tid)
{
	const struct wconv_job *j = ctx;
	(void)tid;
	size_t r0 = 0;
	for (int i = 0; i < j->g->n; i++) {
		const struct sfw_bweight *w = j->g->w[i];
		size_t r1 = r0 + (size_t)w->rows, lo = b > r0 ? b : r0, hi = e < r1 ? e : r1;
		for (size_t r = lo; r < hi; r++)
			for (size_t k = 0; k < (size_t)j->K; k++)
				j->W[r * (size_t)j->K + k] = sfw_op_wget(w->host, w->dtype, (r - r0) * (size_t)j->K + k);
		r0 = r1;
	}
}

#define DUO_COLS 256
struct duo_job {
	const float *W;
	float *gmax; /* [N, groups] */
	float *wm;   /* [K] */
	int N, K, span;
};

/* Rows [b, e): the max |w| of each group of each row. */
static void duo_max_rows(void *ctx, size_t b, size_t e, int tid)
{
	const struct duo_job *j = ctx;
	(void)tid;
	int ng = (j->K + j->span - 1) / j->span;
	for (size_t r = b; r < e; r++) {
		const float *wr = j->W + r * (size_t)j->K;
		for (int g = 0; g < ng; g++) {
			int g0 = g * j->span, g1 = g0 + j->span < j->K ? g0 + j->span : j->K;
			float mx = 0;
			for (int k = g0; k < g1; k++)
				mx = fabsf(wr[k]) > mx ? fabsf(wr[k]) : mx;
			j->gmax[r * (size_t)ng + g] = mx;
		}
	}
}

/* Channel blocks [b, e): wm[k] += |w[r, k]| / its group's max, rows in
 * order (so the sums do not depend on threads). */
static void duo_sum_cols(void *ctx, size_t b, size_t e, int tid)
{
	const struct duo_job *j = ctx;
	(void)tid;
	int ng = (j->K + j->span - 1) / j->span;
	int k0 = (int)b * DUO_COLS, k1 = (int)e * DUO_COLS < j->K ? (int)e * DUO_COLS : j->K;
	for (int r = 0; r < j->N; r++) {
		const float *wr = j->W + (size_t)r * j->K;
		const float *gm = j->gmax + (size_t)r * ng;
		for (int k = k0; k < k1; k++) {
			float mx = gm[k / j->span];
			j->wm[k] += mx > 0 ? fabsf(wr[k]) / mx : 0.0f;
		}
	}
}

void sfwi_awq_duo_sums(struct sfw_ops_cpu *ex, float *wm, float *gmax, const float *W, int N, int K, int span)
{
	int nt = sfw_ops_cpu_threads(ex);
	size_t grain = (size_t)N / ((size_t)nt * 8) > 0 ? (size_t)N / ((size_t)nt * 8) : 1;
	memset(wm, 0, (size_t)K * sizeof(float));
	struct duo_job dj = {W, gmax, wm, N, K, span};
	sfwi_ops_cpu_for(ex, nt, (size_t)N, grain, duo_max_rows, &dj);
	sfwi_ops_cpu_for(ex, nt, ((size_t)K + DUO_COLS - 1) / DUO_COLS, 1, duo_sum_cols, &dj);
}

void sfwi_awq_scales(const float *xm, const float *wm, int K, int gk, int n_grid, int duo, float *s)
{
	if (gk == 0) {
		for (int k = 0; k < K; k++)
			s[k] = 1.0f;
		return;
	}
	double a = (double)gk / n_grid;
	float mx = 0, mn = INFINITY;
	for (int k = 0; k < K; k++) {
		double v = pow(xm[k], a);
		if (duo)
			v /= pow(wm[k], 1.0 - a) + 1e-4;
		s[k] = (float)(v > 1e-4 ? v : 1e-4);
		mx = s[k] > mx ? s[k] : mx;
		mn = s[k] < mn ? s[k] : mn;
	}
	float nrm = sqrtf(mx * mn);
	for (int k = 0; k < K; k++) {
		s[k] /= nrm;
		if (!isfinite(s[k]) || s[k] == 0)
			s[k] = 1.0f;
	}
}

/* The CPU side of one group: the buffers the candidates reuse. */
struct cpu_side {
	float *W, *Wq, *Y, *Yq, *gmax;
	unsigned char *bad;
};

static void cpu_side_free(struct cpu_side *c)
{
	sfw_free(c->W), sfw_free(c->Wq), sfw_free(c->Y), sfw_free(c->Yq), sfw_free(c->gmax), sfw_free(c->bad);
	memset(c, 0, sizeof(*c));
}

/* W as float, the duo sums and Y = X W^T. */
static enum sfw_status cpu_begin(struct sfw_ops_cpu *ex, struct cpu_side *c, const struct sfwi_awq_group *g,
				 int64_t N, int span, float *wm, struct sfw_err *err)
{
	int K = g->K, R = g->R;
	size_t NK = (size_t)N * K;
	c->W = sfw_malloc(NK * sizeof(float)), c->Wq = sfw_malloc(NK * sizeof(float));
	c->Y = sfw_malloc((size_t)R * N * sizeof(float)), c->Yq = sfw_malloc((size_t)R * N * sizeof(float));
	c->gmax = sfw_malloc((size_t)N * (size_t)((K + span - 1) / span) * sizeof(float)); /* row group maxima */
	c->bad = sfw_malloc((size_t)N);
	if (!c->W || !c->Wq || !c->Y || !c->Yq || !c->gmax || !c->bad)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory for the AWQ search");
	int nt = sfw_ops_cpu_threads(ex);
	size_t grain = (size_t)N / ((size_t)nt * 8) > 0 ? (size_t)N / ((size_t)nt * 8) : 1;
	struct wconv_job cj = {g, c->W, K};
	sfwi_ops_cpu_for(ex, nt, (size_t)N, grain, wconv_rows, &cj);
	/* duo statistic: |w| / group max |w|, summed over the rows (each row's
	 * group maxima, then each channel's sum over the rows in order) */
	sfwi_awq_duo_sums(ex, wm, c->gmax, c->W, (int)N, K, span);
	sfw_op_matmul_cpu(ex, c->Y, g->X, c->W, SFW_DTYPE_F32, R, (int)N, K);
	return SFW_OK;
}

/* One candidate: the rows' squared errors and the first row with a
 * non-finite value (-1: none). */
static void cpu_loss(struct sfw_ops_cpu *ex, struct cpu_side *c, const struct sfwi_awq_group *g, int64_t N,
		     const float *s, int group, double *part, int64_t *bad_row)
{
	sfwi_awq_fake_rows(ex, c->Wq, c->bad, c->W, s, N, g->K, group);
	*bad_row = -1;
	for (int64_t r = 0; r < N; r++)
		if (c->bad[r]) {
			*bad_row = r;
			return;
		}
	sfw_op_matmul_cpu(ex, c->Yq, g->X, c->Wq, SFW_DTYPE_F32, g->R, (int)N, g->K);
	sfwi_awq_sqerr_rows(ex, part, c->Yq, c->Y, g->R, (size_t)N);
}

enum sfw_status sfwi_awq_search_group(struct sfw_ops_cpu *ex, const char *dir, const struct sfwi_awq_group *g,
				      const struct sfw_quant_params *p, struct sfwi_awq_dev *dev,
				      double *losses, int *best_k_out, float **out, struct sfw_err *err)
{
	*out = NULL;
	*best_k_out = 0;
	int K = g->K, R = g->R;
	if (!g->sum || R == 0 || g->count == 0)
		return SFW_OK;
	int64_t N = 0;
	for (int i = 0; i < g->n; i++) {
		if (g->w[i]->cols != K || (g->w[i]->dtype != SFW_DTYPE_BF16 && g->w[i]->dtype != SFW_DTYPE_F32))
			return sfw_fail(err, SFW_E_FORMAT,
					"model '%s': AWQ: balance weight '%s' does not match its input width %d", dir,
					g->w[i]->name, K);
		if (dev && !g->w[i]->dev)
			dev = NULL; /* not on the device: the CPU computes the same */
		N += g->w[i]->rows;
	}
	float *xm = sfw_malloc((size_t)K * sizeof(float)), *wm = sfw_calloc((size_t)K, sizeof(float));
	float *s = sfw_malloc((size_t)K * sizeof(float)), *best = sfw_malloc((size_t)K * sizeof(float));
	double *part = sfw_malloc((size_t)R * sizeof(double));
	int span = (int)sfw_ql_group_span(K, p->group_size);
	struct cpu_side cs = {0};
	enum sfw_status rc = SFW_OK;
	if (!xm || !wm || !s || !best || !part) {
		rc = sfw_fail(err, SFW_E_NOMEM, "out of memory for the AWQ search");
		goto done;
	}
	for (int k = 0; k < K; k++)
		xm[k] = (float)(g->sum[k] / (double)g->count);
#if SFW_HAVE_CUDA
	if (dev)
		rc = sfwi_awq_dev_begin(dev, g, span, wm, err);
	else
#endif
		rc = cpu_begin(ex, &cs, g, N, span, wm, err);
	if (rc != SFW_OK)
		goto done;
	for (int k = 0; k < K; k++)
		wm[k] /= (float)N;
	double best_loss = -1;
	int best_k = 0;
	for (int gk = 0; gk < p->n_grid; gk++) {
		sfwi_awq_scales(xm, wm, K, gk, p->n_grid, p->duo_scaling, s);
		int64_t bad_row = -1;
#if SFW_HAVE_CUDA
		if (dev)
			rc = sfwi_awq_dev_loss(dev, s, p->group_size, part, &bad_row, err);
		else
#endif
			cpu_loss(ex, &cs, g, N, s, p->group_size, part, &bad_row);
		if (rc != SFW_OK)
			goto done;
		if (bad_row >= 0) {
			int i = 0; /* name the tensor that the first such row belongs to */
			for (int64_t r0 = 0; i + 1 < g->n && bad_row >= r0 + g->w[i]->rows; i++)
				r0 += g->w[i]->rows;
			rc = sfw_fail(err, SFW_E_FORMAT, "model '%s': AWQ: non-finite weights in '%s'", dir,
				      g->w[i]->name);
			goto done;
		}
		double loss = loss_of(part, R, (size_t)N);
		if (losses)
			losses[gk] = loss;
		/* strictly lower wins: the identity (gk 0) and then the smaller
		 * alpha keep ties */
		if (best_loss < 0 || loss < best_loss) {
			best_loss = loss;
			best_k = gk;
			memcpy(best, s, (size_t)K * sizeof(float));
		}
	}
	*best_k_out = best_k;
	if (best_k != 0) {
		*out = best;
		best = NULL;
	}
done:
	cpu_side_free(&cs);
	sfw_free(xm), sfw_free(wm), sfw_free(s), sfw_free(best), sfw_free(part);
	return rc;
}

/* Searches one layer's group and counts it in the stats; with p->awq_check
 * and a GPU, the CPU search too, counting the groups whose losses differ. */
static enum sfw_status search(struct sfw_ops_cpu *ex, const char *dir, const struct tapstat *ts,
			      const struct sfw_bweight *const *w, int n, const struct sfw_quant_params *p,
			      struct sfwi_awq_dev *dev, float **out, struct sfw_quant_stats *st,
			      struct sfw_err *err)
{
	struct sfwi_awq_group g = {{NULL}, n, ts->cols, ts->sum, ts->count, ts->rows, ts->nrows};
	for (int i = 0; i < n; i++)
		g.w[i] = w[i];
	*out = NULL;
	if (!ts->sum || ts->nrows == 0 || ts->count == 0)
		return SFW_OK;
	double *loss = sfw_calloc((size_t)p->n_grid * 2, sizeof(double));
	if (!loss)
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	int best_k = 0;
	enum sfw_status s = sfwi_awq_search_group(ex, dir, &g, p, dev, loss, &best_k, out, err);
	if (s == SFW_OK && dev) {
		int on_dev = 1;
		for (int i = 0; i < n; i++)
			on_dev = on_dev && w[i]->dev;
		st->awq_gpu_groups += on_dev;
		if (on_dev && p->awq_check) {
			float *s2 = NULL;
			int k2 = 0;
			s = sfwi_awq_search_group(ex, dir, &g, p, NULL, loss + p->n_grid, &k2, &s2, err);
			sfw_free(s2);
			if (s == SFW_OK && (k2 != best_k || memcmp(loss, loss + p->n_grid, (size_t)p->n_grid * sizeof(double))))
				st->awq_check_diff++;
		}
	}
	if (s == SFW_OK) {
		st->awq_mappings++;
		st->awq_mean_alpha += (double)best_k / p->n_grid;
		st->awq_loss_gain += loss[0] > 0 ? 1.0 - loss[best_k] / loss[0] : 0.0;
		st->awq_identity += best_k == 0;
	}
	sfw_free(loss);
	return s;
}

/* Text tokens in calibration sequence q (of per at most; the text gave n). */
static size_t seq_tokens(const struct sfw_quant_params *p, size_t n, size_t per, size_t q)
{
	if (p->samples > 0 || (q + 1) * per <= n)
		return per;
	return n - q * per; /* the default's last sequence: the rest of the text */
}

/* Runs the calibration sequences through m, its taps gathering each layer's
 * statistics into c (set up here); *ctx is the caller's to free. */
static enum sfw_status calibrate(const struct sfw_quant_params *p, struct sfw_model *m, const int32_t *ids,
				 size_t n, struct calib *c, struct sfw_ctx **ctx, struct sfw_quant_stats *st,
				 struct sfw_err *err)
{
	const struct sfw_config *cf = sfw_model_config(m);
	/* sequences: BOS + up to seq_len - 1 tokens each, cut from the text's
	 * tokens in order. samples 0 (the default): as many as the text fills,
	 * at most SFW_QUANT_AUTO_SAMPLES, the last one shorter, so every token
	 * of the text is used once and never again. An explicit count is run
	 * whole: a text shorter than that is gone through again from its start
	 * (the CLI says so). */
	size_t per = (size_t)p->seq_len - 1;
	size_t nseq = (size_t)p->samples;
	if (p->samples == 0) {
		nseq = (n + per - 1) / per;
		if (nseq > SFW_QUANT_AUTO_SAMPLES)
			nseq = SFW_QUANT_AUTO_SAMPLES;
	}
	int64_t total = 0, used = 0;
	for (size_t q = 0; q < nseq; q++) {
		size_t len = seq_tokens(p, n, per, q);
		total += (int64_t)len + 1;
		used += (int64_t)len;
	}
	c->m = m;
	c->last_layer = -1;
	c->L = cf->num_hidden_layers;
	c->loss_rows = p->loss_rows;
	c->stride = total / p->loss_rows > 1 ? total / p->loss_rows : 1;
	c->st = sfw_calloc((size_t)c->L * T_N, sizeof(*c->st));
	int32_t *seq = sfw_malloc((per + 1) * sizeof(int32_t));
	if (!c->st || !seq) {
		sfw_free(seq);
		return sfw_fail(err, SFW_E_NOMEM, "out of memory");
	}
	enum sfw_status s;
	struct sfw_ctx_params cp = sfw_ctx_default_params();
	if ((s = sfw_ctx_new(m, &cp, ctx, err)) != SFW_OK) {
		sfw_free(seq);
		return s;
	}
	sfw_ctx_set_tap(*ctx, on_tap, c);
	sfw_ctx_set_tap_linear_inputs(*ctx, 1);
	double t0 = sfw_now_s();
	for (size_t q = 0; q < nseq && s == SFW_OK; q++) {
		size_t len = seq_tokens(p, n, per, q);
		seq[0] = cf->bos_token_id >= 0 && cf->bos_token_id < cf->vocab_size ? cf->bos_token_id : 1;
		for (size_t j = 0; j < len; j++)
			seq[1 + j] = ids[(q * per + j) % n];
		sfw_ctx_reset(*ctx);
		s = sfw_ctx_prefill(*ctx, seq, len + 1, NULL, err);
		if (s == SFW_OK && c->nomem)
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory for AWQ statistics");
		if (s == SFW_OK)
			sfwi_phase(p, SFW_QP_CALIB, (int64_t)q + 1, (int64_t)nseq, t0);
	}
	if (c->last_layer >= 0)
		release_layer(m, c->last_layer);
	sfw_free(seq);
	st->calib_tokens = total;
	st->calib_text_tokens = (int64_t)n;
	st->calib_text_used = used;
	st->calib_samples = (int64_t)nseq;
	return s;
}

/* Searches layer li's groups into F, then drops the layer's statistics and
 * weight pages: what is held stays one layer's search, not the model's. */
static enum sfw_status search_layer(const char *in_dir, const struct sfw_model *m, struct calib *c, int li,
				    const struct sfw_quant_params *p, struct sfwi_awq_dev *dev,
				    struct sfwi_fold_layer *F, struct sfw_quant_stats *st,
				    struct sfw_err *err)
{
	const struct sfwi_layer *L = &m->layers[li];
	const struct sfw_bweight *attn[5] = {&L->q, &L->k, &L->v};
	int na = 3;
	if (L->kind == SFW_MIXER_SPARSE && L->o_gate.host)
		attn[na++] = &L->o_gate;
	if (L->kind == SFW_MIXER_LIGHTNING && L->z.host)
		attn[na++] = &L->z;
	const struct sfw_bweight *o[1] = {&L->o}, *mlp[2] = {&L->gate, &L->up}, *down[1] = {&L->down};
	enum sfw_status s =
	    search(c->ex, in_dir, &c->st[li * T_N + T_ATTN], attn, na, p, dev, &F->s_attn, st, err);
	if (s == SFW_OK && L->kind == SFW_MIXER_LIGHTNING && L->o_norm.host)
		s = search(c->ex, in_dir, &c->st[li * T_N + T_O], o, 1, p, dev, &F->s_o, st, err);
	if (s == SFW_OK)
		s = search(c->ex, in_dir, &c->st[li * T_N + T_MLP], mlp, 2, p, dev, &F->s_mlp, st, err);
	if (s == SFW_OK)
		s = search(c->ex, in_dir, &c->st[li * T_N + T_DOWN], down, 1, p, dev, &F->s_down, st, err);
	for (int k = 0; k < T_N; k++) {
		struct tapstat *ts = &c->st[li * T_N + k];
		sfw_free(ts->rows);
		ts->rows = NULL;
	}
	release_layer(m, li);
	return s;
}

enum sfw_status sfwi_awq_search(const char *in_dir, const struct sfw_quant_params *p, struct sfwi_fold *out,
				struct sfw_err *err)
{
	struct sfw_quant_stats local = {0}, *st = p->stats ? p->stats : &local;
	out->n_layers = 0;
	out->L = NULL;
	if (p->samples < 0 || p->seq_len < 2 || p->loss_rows < 1 || p->n_grid < 1)
		return sfw_fail(err, SFW_E_INVAL, "AWQ: seq_len, loss_rows and n_grid must be positive, samples not negative");
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = (enum sfw_device)p->device;
	mp.threads = p->threads;
	struct sfw_model *m = NULL;
	struct sfw_ctx *ctx = NULL;
	int32_t *ids = NULL;
	size_t n = 0;
	struct calib c = {0};
	struct sfwi_awq_dev *dev = NULL;
	enum sfw_status s;
	double t0 = sfw_now_s();
	sfwi_phase(p, SFW_QP_LOAD, 0, 1, t0);
	if ((s = sfw_model_load(in_dir, &mp, &m, err)) != SFW_OK)
		return s;
	sfwi_phase(p, SFW_QP_LOAD, 1, 1, t0);
	/* threads of our own for the statistics and the search (the model's
	 * backend may be a GPU's), passed down in c until the end */
	struct sfw_ops_cpu *ex = NULL;
	if ((s = sfw_ops_cpu_new(p->threads > 0 ? p->threads : sfw_default_threads(), &ex, err)) != SFW_OK) {
		sfw_model_free(m);
		return s;
	}
	c.ex = ex;
	const struct sfw_config *cf = sfw_model_config(m);
	/* host memory is what is held, not the model: a device backend drops
	 * the map's pages as it uploads them (struct sfw_bweight.host_mapped),
	 * and below each layer's pages go once the forward is past it */
	if ((s = calib_ids(in_dir, p, cf->vocab_size, &ids, &n, err)) != SFW_OK)
		goto done;
	if ((s = calibrate(p, m, ids, n, &c, &ctx, st, err)) != SFW_OK)
		goto done;

	out->L = sfw_calloc((size_t)c.L, sizeof(*out->L));
	if (!out->L) {
		s = sfw_fail(err, SFW_E_NOMEM, "out of memory");
		goto done;
	}
	out->n_layers = c.L;
#if SFW_HAVE_CUDA
	/* the model runs on a GPU: the search runs there too (awq_cuda.c),
	 * reading the weights' device copies; the same sums as the CPU's */
	if (strcmp(m->be->name, "cuda") == 0) {
		if ((s = m->be->sync(m->be, 1, err)) != SFW_OK || (s = sfwi_awq_dev_new(&dev, err)) != SFW_OK)
			goto done;
	}
#endif
	t0 = sfw_now_s();
	for (int li = 0; li < c.L && s == SFW_OK; li++) {
		s = search_layer(in_dir, m, &c, li, p, dev, &out->L[li], st, err);
		if (s == SFW_OK && sfw_ops_cpu_take_failure(ex))
			s = sfw_fail(err, SFW_E_NOMEM, "out of memory for the AWQ search");
		if (s == SFW_OK)
			sfwi_phase(p, SFW_QP_SEARCH, li + 1, c.L, t0);
	}
	if (st->awq_mappings) {
		st->awq_mean_alpha /= st->awq_mappings;
		st->awq_loss_gain /= st->awq_mappings;
	}
done:
#if SFW_HAVE_CUDA
	sfwi_awq_dev_free(dev);
#endif
	if (c.st)
		for (int i = 0; i < c.L * T_N; i++)
			sfw_free(c.st[i].sum), sfw_free(c.st[i].rows);
	sfw_free(c.st);
	sfw_free(ids);
	sfw_ctx_free(ctx);
	sfw_model_free(m);
	sfw_ops_cpu_free(ex);
	if (s != SFW_OK)
		sfwi_fold_free(out);
	return s;
}
