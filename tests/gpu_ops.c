/* modules: kernels num core */
/* Every CUDA twin of kernels/ops.h against its CPU twin (the law) on fresh
 * random inputs, in both activation dtypes. Table-driven: each row names the
 * op, the shapes, and the tolerance per dtype (NMSE and max |diff| relative
 * to max |ref|). In bf16 mode the inputs are rounded to bf16 first, so the CPU
 * sees the same values; the tolerance covers the reference's bf16 rounding
 * points that the CUDA twin applies and the CPU twin (fp32) does not.
 * Outputs are poisoned before each run so unwritten elements fail. */
#include "check.h"
#include "lib/compare.h"
#include "lib/gpu_mem.h"
#include "lib/rng.h"

#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void *g_s; /* stream */
static struct sfw_cuda_ctx *g_cx; /* on g_s: what the ops run with */
static enum sfw_dtype g_dt;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void)
{
	return sfwt_urand(&rng);
}

static float bfr(float x)
{
	return sfw_bf16_to_f32(sfw_f32_to_bf16(x));
}

/* Random activations, rounded to bf16 in bf16 mode. */
static float *randv(size_t n, float scale)
{
	float *p = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		p[i] = urand() * scale;
		if (g_dt == SFW_DTYPE_BF16)
			p[i] = bfr(p[i]);
	}
	return p;
}

/* Random bf16 weights (bits) and their float values. */
static uint16_t *randw(size_t n, float scale, float offset)
{
	uint16_t *w = malloc(n * 2);
	for (size_t i = 0; i < n; i++)
		w[i] = sfw_f32_to_bf16(offset + urand() * scale);
	return w;
}

static size_t asz(void)
{
	return g_dt == SFW_DTYPE_BF16 ? 2 : 4;
}

static void *dalloc(size_t bytes)
{
	return sfwt_dalloc(bytes, g_s);
}

static void *up_raw(const void *h, size_t bytes)
{
	void *d = dalloc(bytes);
	sfw_cuda_h2d(d, h, bytes, g_s);
	return d;
}

/* Host floats -> device activations (dtype g_dt). */
static void *up(const float *h, size_t n)
{
	if (g_dt == SFW_DTYPE_F32)
		return up_raw(h, n * 4);
	uint16_t *b = malloc((n ? n : 1) * 2);
	for (size_t i = 0; i < n; i++)
		b[i] = sfw_f32_to_bf16(h[i]);
	void *d = up_raw(b, n * 2);
	sfw_cuda_sync(g_s);
	free(b);
	return d;
}

static float *down(const void *d, size_t n)
{
	float *h = malloc((n ? n : 1) * 4);
	if (g_dt == SFW_DTYPE_F32) {
		sfw_cuda_d2h(h, d, n * 4, g_s);
		sfw_cuda_sync(g_s);
		return h;
	}
	uint16_t *b = malloc((n ? n : 1) * 2);
	sfw_cuda_d2h(b, d, n * 2, g_s);
	sfw_cuda_sync(g_s);
	for (size_t i = 0; i < n; i++)
		h[i] = sfw_bf16_to_f32(b[i]);
	free(b);
	return h;
}

static float *down_f32(const void *d, size_t n)
{
	float *h = malloc((n ? n : 1) * 4);
	sfw_cuda_d2h(h, d, n * 4, g_s);
	sfw_cuda_sync(g_s);
	return h;
}

struct tol {
	double nmse, maxrel;
};
static struct tol g_tol;

static void cmp(const char *what, const float *got, const float *ref, size_t n)
{
	struct cmp_stats c = cmp_stats(got, ref, n);
	double nmse = c.nmse, maxd = c.maxd, maxr = c.maxr;
	size_t bad = c.bad, first_bad = c.first_bad;
	printf("  %-4s %-46s NMSE %.2e  max|diff| %.2e  max|ref| %.2e\n", g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", what,
	       nmse, maxd, maxr);
	CHECK(bad == 0, "%s [%s]: %zu non-finite mismatches (first at %zu: got %g, ref %g)", what,
	      g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", bad, first_bad, bad ? got[first_bad] : 0.0, bad ? ref[first_bad] : 0.0);
	CHECK(nmse <= g_tol.nmse, "%s [%s]: NMSE %.3e > %.1e", what, g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", nmse,
	      g_tol.nmse);
	CHECK(maxd <= g_tol.maxrel * (maxr > 0 ? maxr : 1), "%s [%s]: max|diff| %.3e > %.1e x %.3e", what,
	      g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", maxd, g_tol.maxrel, maxr);
}

/* ---- the ops ---- */

static void t_embed(void)
{
	int V = 1000, D = 512, T = 37;
	uint16_t *E = randw((size_t)V * D, 0.05f, 0);
	int32_t ids[37];
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)((urand() * 0.5f + 0.5f) * (V - 1));
	float *ref = malloc((size_t)T * D * 4);
	sfw_op_embed_cpu(ref, E, SFW_DTYPE_BF16, ids, T, D, 12.0f);
	void *dE = up_raw(E, (size_t)V * D * 2), *di = up_raw(ids, sizeof(ids)), *dx = dalloc((size_t)T * D * asz());
	sfw_op_embed_cuda(dx, dE, SFW_DTYPE_BF16, di, T, D, 12.0f, g_dt, g_cx);
	float *got = down(dx, (size_t)T * D);
	cmp("embed V=1000 D=512 T=37 x12", got, ref, (size_t)T * D);
	free(E), free(ref), free(got);
	sfw_cuda_free(dE), sfw_cuda_free(di), sfw_cuda_free(dx);
}

static void t_rmsnorm_shape(int rows, int n, int alias)
{
	float *x = randv((size_t)rows * n, 3.0f);
	uint16_t *w = randw(n, 0.1f, 1.0f);
	float *ref = malloc((size_t)rows * n * 4);
	sfw_op_rmsnorm_cpu(NULL, ref, x, w, SFW_DTYPE_BF16, rows, n, 1e-6f);
	void *dx = up(x, (size_t)rows * n), *dw = up_raw(w, (size_t)n * 2);
	void *dy = alias ? dx : dalloc((size_t)rows * n * asz());
	sfw_op_rmsnorm_cuda(dy, dx, dw, SFW_DTYPE_BF16, rows, n, 1e-6f, g_dt, g_cx);
	float *got = down(dy, (size_t)rows * n);
	char name[64];
	snprintf(name, sizeof(name), "rmsnorm rows=%d n=%d%s", rows, n, alias ? " in place" : "");
	cmp(name, got, ref, (size_t)rows * n);
	free(x), free(w), free(ref), free(got);
	sfw_cuda_free(dx), sfw_cuda_free(dw);
	if (!alias)
		sfw_cuda_free(dy);
}

static void t_rmsnorm(void)
{
	t_rmsnorm_shape(1, 4096, 1);
	t_rmsnorm_shape(5, 4096, 0);
	t_rmsnorm_shape(2000, 1024, 0);
	t_rmsnorm_shape(3 * 32, 128, 1);
	t_rmsnorm_shape(64, 256, 0);
}

enum ew { EW_ADD, EW_SILU, EW_SIG };
/* n = 100003: the scalar kernels; n = 131072 (a multiple of 8, aligned):
 * the bf16 8-wide form; in place: y = the first input, as forward.c calls
 * sigmoid_mul */
static void t_ew_n(enum ew kind, size_t n, int inplace)
{
	float *a = randv(n, 4.0f), *b = randv(n, 4.0f), *c = randv(n, 2.0f);
	float *ref = malloc(n * 4);
	memcpy(ref, a, n * 4);
	void *da = up(a, n), *db = up(b, n), *dc = up(c, n), *dy = dalloc(n * asz());
	if (inplace || kind == EW_ADD)
		dy = (sfw_cuda_free(dy), da);
	char name[96];
	if (kind == EW_ADD) {
		sfw_op_add_scaled_cpu(ref, b, n, 0.2474873734f);
		sfw_op_add_scaled_cuda(da, db, n, 0.2474873734f, g_dt, g_cx);
		snprintf(name, sizeof(name), "add_scaled n=%zu c=0.2475", n);
	} else if (kind == EW_SILU) {
		sfw_op_silu_mul_cpu(ref, a, b, n);
		sfw_op_silu_mul_cuda(dy, da, db, n, g_dt, g_cx);
		snprintf(name, sizeof(name), "silu_mul n=%zu%s", n, inplace ? " in place" : "");
	} else {
		sfw_op_sigmoid_mul_cpu(ref, a, c, n);
		sfw_op_sigmoid_mul_cuda(dy, da, dc, n, g_dt, g_cx);
		snprintf(name, sizeof(name), "sigmoid_mul n=%zu%s", n, inplace ? " in place" : "");
	}
	float *got = down(dy, n);
	cmp(name, got, ref, n);
	free(a), free(b), free(c), free(ref), free(got);
	if (dy != da)
		sfw_cuda_free(dy);
	sfw_cuda_free(da), sfw_cuda_free(db), sfw_cuda_free(dc);
}
static void t_ew(enum ew kind)
{
	t_ew_n(kind, 100003, 0);
	t_ew_n(kind, 131072, 0);
	if (kind != EW_ADD)
		t_ew_n(kind, 131072, 1);
}
static void t_add(void)
{
	t_ew(EW_ADD);
}
static void t_silu(void)
{
	t_ew(EW_SILU);
}
static void t_sig(void)
{
	t_ew(EW_SIG);
}

static void t_rope(void)
{
	int T = 9, nh = 32, hd = 128;
	int64_t pos[] = {0, 100003, 1048000};
	for (int i = 0; i < 3; i++) {
		size_t n = (size_t)T * nh * hd;
		float *x = randv(n, 2.0f), *ref = malloc(n * 4);
		memcpy(ref, x, n * 4);
		sfw_op_rope_neox_cpu(ref, T, nh, hd, pos[i], 10000.0f);
		void *dx = up(x, n);
		sfw_op_rope_neox_cuda(dx, T, nh, hd, pos[i], 10000.0f, g_dt, g_cx);
		float *got = down(dx, n);
		char name[64];
		snprintf(name, sizeof(name), "rope_neox T=9 nh=32 hd=128 pos0=%lld", (long long)pos[i]);
		cmp(name, got, ref, n);
		free(x), free(ref), free(got);
		sfw_cuda_free(dx);
	}
}

/* Downloads both buffers' raw bytes and counts the elements that differ. */
static void same_bits(const char *what, const void *da, const void *db, size_t n)
{
	size_t es = asz(), diff = 0;
	unsigned char *a = malloc(n * es), *b = malloc(n * es);
	sfw_cuda_d2h(a, da, n * es, g_s);
	sfw_cuda_d2h(b, db, n * es, g_s);
	sfw_cuda_sync(g_s);
	for (size_t i = 0; i < n; i++)
		diff += memcmp(a + i * es, b + i * es, es) != 0;
	printf("  %-4s %-46s %zu of %zu differ\n", g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", what, diff, n);
	CHECK(diff == 0, "%s [%s]: %zu of %zu elements differ", what, g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", diff, n);
	free(a), free(b);
}

/* The fused lightning q/k norm + RoPE: against the CPU twin (NMSE), and
 * against the unfused CUDA launches it replaces (rmsnorm q, rmsnorm k, rope
 * q, rope k) with equal bits. devpos: the position comes from device memory
 * and the host pos0 passed beside it is wrong on purpose. hd 96 takes the
 * unfused fallback inside the op. Calls of fewer than 4 x SMs tokens split
 * a token's rows over CTAs, longer ones take a CTA a token. */
static const struct {
	int T, nhq, nhk, hd, rope, devpos;
	int64_t pos;
} qkn_cases[] = {
	{1, 32, 32, 128, 1, 0, 100003}, /* the model's decode step */
	{1, 32, 32, 128, 1, 1, 1048000},
	{9, 4, 2, 128, 1, 0, 0},
	{9, 4, 2, 128, 0, 0, 0},
	{300, 32, 32, 128, 1, 0, 5},
	{1, 8, 8, 64, 1, 1, 4097},
	{70, 3, 5, 64, 1, 0, 31},
	{6, 5, 3, 64, 0, 1, 0},
	{1, 8, 4, 32, 1, 0, 77},
	{17, 8, 4, 32, 1, 1, 100003},
	{5, 2, 2, 32, 0, 0, 0},
	{3, 4, 4, 96, 1, 1, 500},
	/* past 4 x SMs tokens (132 SMs: 528): a CTA a token */
	{600, 32, 32, 128, 1, 0, 1040000},
	{1100, 4, 2, 128, 1, 1, 70001},
	{700, 8, 4, 32, 1, 0, 99},
	{640, 5, 3, 64, 0, 0, 0},
};

static void t_qknorm(void)
{
	const float eps = 1e-6f, theta = 10000.0f;
	for (size_t ci = 0; ci < sizeof(qkn_cases) / sizeof(qkn_cases[0]); ci++) {
		int T = qkn_cases[ci].T, nhq = qkn_cases[ci].nhq, nhk = qkn_cases[ci].nhk, hd = qkn_cases[ci].hd;
		int rope = qkn_cases[ci].rope, devpos = qkn_cases[ci].devpos;
		int64_t pos = qkn_cases[ci].pos;
		size_t nq = (size_t)T * nhq * hd, nk = (size_t)T * nhk * hd;
		float *q = randv(nq, 3.0f), *k = randv(nk, 3.0f);
		uint16_t *qw = randw((size_t)hd, 0.1f, 1.0f), *kw = randw((size_t)hd, 0.1f, 1.0f);
		float *rq = malloc(nq * 4), *rk = malloc(nk * 4);
		memcpy(rq, q, nq * 4), memcpy(rk, k, nk * 4);
		struct sfw_qk_shape sh = {T, nhq, nhk, hd, eps, rope, pos, theta, SFW_DTYPE_BF16,
					  SFW_DTYPE_BF16};
		sfw_op_qk_norm_rope_cpu(NULL, rq, rk, qw, kw, &sh);
		void *dqw = up_raw(qw, (size_t)hd * 2), *dkw = up_raw(kw, (size_t)hd * 2);
		void *dq = up(q, nq), *dk = up(k, nk), *uq = up(q, nq), *uk = up(k, nk);
		void *dpos = up_raw(&pos, sizeof(pos));
		if (devpos) { /* the host position is ignored: the device's is read */
			struct sfw_qk_shape wrong = sh;
			wrong.pos0 = pos + 12345;
			const struct sfw_cuda_rowref rr = {.pos = dpos};
			sfw_cuda_qk_norm_rope(dq, dk, dqw, dkw, &wrong, &rr, g_dt, g_cx);
		} else {
			sfw_op_qk_norm_rope_cuda(dq, dk, dqw, dkw, &sh, g_dt, g_cx);
		}
		/* the unfused sequence forward.c runs without the fused op */
		sfw_op_rmsnorm_cuda(uq, uq, dqw, SFW_DTYPE_BF16, T * nhq, hd, eps, g_dt, g_cx);
		sfw_op_rmsnorm_cuda(uk, uk, dkw, SFW_DTYPE_BF16, T * nhk, hd, eps, g_dt, g_cx);
		if (rope) {
			sfw_op_rope_neox_cuda(uq, T, nhq, hd, pos, theta, g_dt, g_cx);
			sfw_op_rope_neox_cuda(uk, T, nhk, hd, pos, theta, g_dt, g_cx);
		}
		float *gq = down(dq, nq), *gk = down(dk, nk);
		char name[96], where[32];
		if (rope)
			snprintf(where, sizeof(where), "pos=%lld%s", (long long)pos, devpos ? " devpos" : "");
		else
			snprintf(where, sizeof(where), "no rope");
		snprintf(name, sizeof(name), "qk_norm_rope T=%d nh=%d/%d hd=%d %s: q", T, nhq, nhk, hd, where);
		cmp(name, gq, rq, nq);
		name[strlen(name) - 1] = 'k';
		cmp(name, gk, rk, nk);
		snprintf(name, sizeof(name), "qk_norm_rope T=%d hd=%d%s%s vs unfused: q", T, hd, rope ? "" : " no rope",
			 devpos ? " devpos" : "");
		same_bits(name, dq, uq, nq);
		name[strlen(name) - 1] = 'k';
		same_bits(name, dk, uk, nk);
		free(q), free(k), free(qw), free(kw), free(rq), free(rk), free(gq), free(gk);
		sfw_cuda_free(dqw), sfw_cuda_free(dkw), sfw_cuda_free(dq), sfw_cuda_free(dk);
		sfw_cuda_free(uq), sfw_cuda_free(uk), sfw_cuda_free(dpos);
	}
}

static void t_matmul_shape(int M, int N, int K, int f32w, int logits)
{
	float *x = randv((size_t)M * K, 1.0f);
	uint16_t *wb = randw((size_t)N * K, 0.05f, 0);
	float *wf = malloc((size_t)N * K * 4);
	for (size_t i = 0; i < (size_t)N * K; i++)
		wf[i] = sfw_bf16_to_f32(wb[i]);
	const void *w = f32w ? (const void *)wf : (const void *)wb;
	enum sfw_dtype wdt = f32w ? SFW_DTYPE_F32 : SFW_DTYPE_BF16;
	float *ref = malloc((size_t)M * N * 4);
	void *dx = up(x, (size_t)M * K), *dw = up_raw(w, (size_t)N * K * (f32w ? 4 : 2));
	float *got;
	if (logits) {
		struct sfw_gemm_shape gs = {M, N, K, 0, 0};
		sfw_op_logits_cpu(NULL, ref, x, w, wdt, &gs, 0.0625f);
		void *dy = dalloc((size_t)M * N * 4);
		sfw_op_logits_cuda(dy, dx, dw, wdt, &gs, 0.0625f, g_dt, g_cx);
		got = down_f32(dy, (size_t)M * N);
		sfw_cuda_free(dy);
	} else {
		sfw_op_matmul_cpu(NULL, ref, x, w, wdt, M, N, K);
		void *dy = dalloc((size_t)M * N * asz());
		sfw_op_matmul_cuda(dy, dx, dw, wdt, M, N, K, g_dt, g_cx);
		got = down(dy, (size_t)M * N);
		sfw_cuda_free(dy);
	}
	char name[64];
	snprintf(name, sizeof(name), "%s M=%d N=%d K=%d W=%s", logits ? "logits/16" : "matmul", M, N, K,
		 f32w ? "f32" : "bf16");
	cmp(name, got, ref, (size_t)M * N);
	free(x), free(wb), free(wf), free(ref), free(got);
	sfw_cuda_free(dx), sfw_cuda_free(dw);
}

static void t_matmul(void)
{
	t_matmul_shape(1, 4096, 4096, 0, 0);
	t_matmul_shape(3, 640, 256, 0, 0);
	t_matmul_shape(77, 1000, 512, 0, 0);
	t_matmul_shape(5, 300, 264, 1, 0);
}

static void t_logits(void)
{
	t_matmul_shape(1, 73448, 4096, 0, 1);
	t_matmul_shape(20, 1024, 256, 0, 1);
}

/* sms > 0: the op sees that many multiprocessors (bf16 chunked only), which
 * moves its choice of slice width (kernels/lightning.cu, gla_fused_launch) */
static void t_gla_shape(int chunked, int T, int nh, int hd, int sms)
{
	if (sms && (!chunked || g_dt != SFW_DTYPE_BF16))
		return;
	size_t n = (size_t)T * nh * hd, ns = (size_t)nh * hd * hd;
	float *q = randv(n, 1.0f), *k = randv(n, 1.0f), *v = randv(n, 1.0f);
	float *st = malloc(ns * 4), *st_ref = malloc(ns * 4), decay[64];
	for (size_t i = 0; i < ns; i++)
		st[i] = urand() * 0.5f;
	memcpy(st_ref, st, ns * 4);
	for (int h = 0; h < nh; h++)
		decay[h] = powf(2.0f, -8.0f * (h + 1) / nh);
	float *ref = malloc(n * 4), scale = 1.0f / sqrtf((float)hd);
	struct sfw_gla_shape sh = {T, nh, hd, scale, 64};
	if (chunked)
		sfw_op_gla_chunked_cpu(NULL, ref, q, k, v, st_ref, decay, &sh);
	else
		sfw_op_gla_recurrent_cpu(NULL, ref, q, k, v, st_ref, decay, &sh);
	void *dq = up(q, n), *dk = up(k, n), *dv = up(v, n), *dst = up_raw(st, ns * 4);
	void *dd = up_raw(decay, (size_t)nh * 4), *dout = dalloc(n * asz());
	int keep_sms = g_cx->sms;
	if (sms)
		g_cx->sms = sms;
	if (chunked)
		sfw_op_gla_chunked_cuda(dout, dq, dk, dv, dst, dd, &sh, g_dt, g_cx);
	else
		sfw_op_gla_recurrent_cuda(dout, dq, dk, dv, dst, dd, &sh, g_dt, g_cx);
	g_cx->sms = keep_sms;
	float *got = down(dout, n), *gst = down_f32(dst, ns);
	const char *form = !chunked ? "recurrent" : g_dt != SFW_DTYPE_BF16 ? "chunked (serial)" : "chunked (fused)";
	char name[128], at[24] = "";
	if (sms)
		snprintf(at, sizeof(at), " sms=%d", sms);
	snprintf(name, sizeof(name), "gla_%s T=%d nh=%d hd=%d%s: o", form, T, nh, hd, at);
	cmp(name, got, ref, n);
	snprintf(name, sizeof(name), "gla_%s T=%d nh=%d hd=%d%s: state", form, T, nh, hd, at);
	struct tol keep = g_tol;
	g_tol.nmse = 1e-9, g_tol.maxrel = 1e-4; /* the state is fp32 in both dtypes */
	/* bf16 (the fused form on tensor cores, kernels/lightning.cu): the
	 * fp32 operands of the MMAs, split hi + lo, keep 16 bits, so the state
	 * stays near fp32 (an emulation on the CPU, tensor-core accumulation
	 * taken as fp32 rounding toward zero: NMSE ~7e-12, max|diff|/max|ref|
	 * ~2.4e-6; an H100 gave 5.5e-12 and 2.5e-6 at T = 8192); a plain
	 * bf16 rounding of them gives ~2.4e-6 and ~1.5e-3,
	 * which these bounds reject. The outputs are bf16 and hold the bf16
	 * tolerance either way (their rounding, 2^-9, dwarfs the split's 2^-16). */
	if (g_dt == SFW_DTYPE_BF16)
		g_tol.nmse = 1e-8, g_tol.maxrel = 3e-4;
	if (g_dt == SFW_DTYPE_BF16 && !chunked)
		g_tol = keep;
	cmp(name, gst, st_ref, ns);
	g_tol = keep;
	free(q), free(k), free(v), free(st), free(st_ref), free(ref), free(got), free(gst);
	sfw_cuda_free(dq), sfw_cuda_free(dk), sfw_cuda_free(dv), sfw_cuda_free(dst), sfw_cuda_free(dd),
		sfw_cuda_free(dout);
}

static void t_gla(void)
{
	t_gla_shape(0, 1, 32, 128, 0);
	t_gla_shape(0, 7, 8, 32, 0);
	/* chunked: the fused tensor-core form on bf16, the serial one on fp32;
	 * 2100 rows = 33 chunks of 64, the last partial (52 rows), at the
	 * model's shape */
	t_gla_shape(1, 300, 32, 128, 0);
	t_gla_shape(1, 130, 8, 32, 0);
	t_gla_shape(1, 64, 4, 64, 0);
	t_gla_shape(1, 2100, 32, 128, 0);
	t_gla_shape(1, 1, 8, 32, 0);
	/* the tensor-core kernel's edges: 8192 rows at the model's shape (128
	 * chunks through the two cp.async stages, the op's size in a long
	 * prefill); partial last chunks at every head dim (rows past c zero in
	 * the tiles, masked in the output); chunks shorter than one 16-row
	 * k-step */
	t_gla_shape(1, 8192, 32, 128, 0);
	t_gla_shape(1, 1000, 4, 64, 0);
	t_gla_shape(1, 77, 2, 128, 0);
	t_gla_shape(1, 45, 4, 32, 0);
	t_gla_shape(1, 12, 3, 64, 0);
	/* several chunks whose last one has 1 row and 63 rows; grids of 7 x 8,
	 * 5 x 4 and 3 x 2 blocks, no multiple of any device's SM count */
	t_gla_shape(1, 193, 7, 128, 0);
	t_gla_shape(1, 255, 5, 64, 0);
	t_gla_shape(1, 641, 3, 32, 0);
	/* the other slice width: seen as a device of one SM, the op takes
	 * BV = 32 (HD / 32 blocks a head, one at hd 32) where the shapes above
	 * take BV = 16 on a GPU of more than 64 SMs (an H100 has 132) */
	t_gla_shape(1, 2100, 32, 128, 1);
	t_gla_shape(1, 1000, 4, 64, 1);
	t_gla_shape(1, 193, 7, 128, 1);
	t_gla_shape(1, 77, 3, 32, 1);
	t_gla_shape(1, 12, 3, 64, 1);
}

/* A valid selection: the CPU pool + top-k on random scores. */
static int32_t *make_idx(int nkv, int T, int64_t pos0, int k, int block, int64_t *nblocks_out)
{
	int64_t L = pos0 + T, nblocks = (L + block - 1) / block;
	int64_t n1 = L >= 32 ? (L - 32) / 16 + 1 : 0;
	float *sc = malloc(((size_t)nkv * T * (n1 ? n1 : 1)) * 4);
	for (size_t i = 0; i < (size_t)nkv * T * n1; i++)
		sc[i] = urand() + 1.0f;
	float *pooled = malloc((size_t)nkv * T * nblocks * 4);
	struct sfw_sel_shape sh = {.T = T, .nkv = nkv, .pos0 = pos0, .ksize = 32, .stride = 16,
				   .block = block, .init_blocks = 1, .local_blocks = 32, .n1 = n1,
				   .nblocks = nblocks, .topk = k};
	sfw_op_pool_blocks_cpu(pooled, sc, &sh);
	int32_t *idx = malloc((size_t)nkv * T * k * 4);
	sfw_op_topk_blocks_cpu(NULL, idx, pooled, &sh);
	free(sc), free(pooled);
	*nblocks_out = nblocks;
	return idx;
}

static void t_attn_shape(int sparse, int T, int64_t L, int nh, int nkv, int hd)
{
	int64_t pos0 = L - T;
	size_t nq = (size_t)T * nh * hd, nc = (size_t)L * nkv * hd;
	float *q = randv(nq, 1.0f), *kc = randv(nc, 1.0f), *vc = randv(nc, 1.0f);
	float *ref = malloc(nq * 4), scale = 1.0f / sqrtf((float)hd);
	int k = 96, block = 64;
	int64_t nb = 0;
	int32_t *idx = sparse ? make_idx(nkv, T, pos0, k, block, &nb) : NULL;
	struct sfw_attn_shape sh = {T, nh, nkv, hd, pos0, scale, k, block};
	if (sparse)
		sfw_op_attn_sparse_cpu(NULL, ref, q, kc, vc, idx, &sh);
	else
		sfw_op_attn_dense_cpu(NULL, ref, q, kc, vc, &sh);
	void *dq = up(q, nq), *dk = up(kc, nc), *dv = up(vc, nc), *dout = dalloc(nq * asz());
	void *didx = sparse ? up_raw(idx, (size_t)nkv * T * k * 4) : NULL;
	if (sparse)
		sfw_op_attn_sparse_cuda(dout, dq, dk, dv, didx, &sh, g_dt, g_cx);
	else
		sfw_op_attn_dense_cuda(dout, dq, dk, dv, &sh, g_dt, g_cx);
	float *got = down(dout, nq);
	char name[96];
	snprintf(name, sizeof(name), "attn_%s T=%d L=%lld nh=%d nkv=%d hd=%d", sparse ? "sparse" : "dense", T,
		 (long long)L, nh, nkv, hd);
	cmp(name, got, ref, nq);
	free(q), free(kc), free(vc), free(ref), free(got), free(idx);
	sfw_cuda_free(dq), sfw_cuda_free(dk), sfw_cuda_free(dv), sfw_cuda_free(dout), sfw_cuda_free(didx);
}

static void t_attn(void)
{
	t_attn_shape(0, 1, 7000, 32, 2, 128);
	t_attn_shape(0, 45, 300, 32, 2, 128);
	t_attn_shape(0, 200, 200, 8, 2, 32);
	t_attn_shape(1, 1, 20000, 32, 2, 128);
	t_attn_shape(1, 24, 13000, 32, 2, 128);
	t_attn_shape(1, 100, 1500, 8, 2, 32);
	t_attn_shape(0, 1, 777, 8, 2, 32);
	t_attn_shape(0, 1, 100, 32, 2, 128);
	/* one head per group (G = 1) at hd 64; a sparse decode row whose
	 * selection is mostly -1 (47 blocks < k), one unit per split */
	t_attn_shape(1, 1, 3000, 2, 2, 64);
	t_attn_shape(0, 1, 5000, 4, 4, 64);
}

static void t_compress(void)
{
	int nkv = 2, hd = 128;
	int64_t L = 1000;
	float *k = randv((size_t)L * nkv * hd, 1.0f);
	int64_t n1 = (L - 32) / 16 + 1, n2 = (L - 128) / 64 + 1;
	float *r1 = malloc((size_t)n1 * nkv * hd * 4), *r2 = malloc((size_t)n2 * nkv * hd * 4);
	struct sfw_sel_shape sh = {.nkv = nkv, .hd = hd, .ksize = 32, .stride = 16};
	sfw_op_compress_cpu(r1, k, 1, 0, n1, &sh, NULL);
	sfw_op_compress_cpu(r2, k, 2, 0, n2, &sh, NULL);
	void *dk = up(k, (size_t)L * nkv * hd), *d1 = dalloc((size_t)n1 * nkv * hd * asz());
	void *d2 = dalloc((size_t)n2 * nkv * hd * asz());
	/* incrementally, as decode does: two pieces */
	sfw_op_compress_cuda(d1, dk, 1, 0, 20, &sh, NULL, g_dt, g_cx);
	sfw_op_compress_cuda(d1, dk, 1, 20, n1, &sh, NULL, g_dt, g_cx);
	sfw_op_compress_cuda(d2, dk, 2, 0, n2, &sh, NULL, g_dt, g_cx);
	float *g1 = down(d1, (size_t)n1 * nkv * hd), *g2 = down(d2, (size_t)n2 * nkv * hd);
	cmp("compress level 1 (32/16), L=1000, in 2 pieces", g1, r1, (size_t)n1 * nkv * hd);
	cmp("compress level 2 (128/64), L=1000", g2, r2, (size_t)n2 * nkv * hd);
	free(k), free(r1), free(r2), free(g1), free(g2);
	sfw_cuda_free(dk), sfw_cuda_free(d1), sfw_cuda_free(d2);
}

/* Compressed keys written into KV blocks through a permuted table (the CPU
 * twin with the same table is the reference; contiguous keys). */
static void t_compress_paged(void)
{
	int nkv = 2, hd = 128, shift = 6;
	int64_t L = 1000, nb = (L + 63) / 64, P;
	int32_t *tab = sfwt_block_table(nb, &rng);
	P = 2 * nb;
	int64_t per = sfw_ckey_rows_per_block(shift, 16), rows = P * per, row = (int64_t)nkv * hd;
	float *k = randv((size_t)L * row, 1.0f), *ref = calloc((size_t)(rows * row), 4);
	int64_t n1 = (L - 32) / 16 + 1, n2 = (L - 128) / 64 + 1;
	struct sfw_sel_shape sh = {.nkv = nkv, .hd = hd, .ksize = 32, .stride = 16};
	struct sfw_pages hpg = {tab, shift};
	sfw_op_compress_cpu(ref, k, 1, 0, n1, &sh, &hpg);
	sfw_op_compress_cpu(ref + (64 / 16) * row, k, 2, 0, n2, &sh, &hpg);
	void *dk = up(k, (size_t)L * row), *dc = dalloc((size_t)(rows * row) * asz());
	sfw_cuda_memset(dc, 0, (size_t)(rows * row) * asz(), g_s); /* rows no chunk owns: 0, as the twin's */
	int32_t *dtab = up_raw(tab, (size_t)nb * sizeof(int32_t));
	struct sfw_pages dpg = {dtab, shift};
	sfw_op_compress_cuda(dc, dk, 1, 0, 20, &sh, &dpg, g_dt, g_cx);
	sfw_op_compress_cuda(dc, dk, 1, 20, n1, &sh, &dpg, g_dt, g_cx);
	sfw_op_compress_cuda((char *)dc + (size_t)(64 / 16) * row * asz(), dk, 2, 0, n2, &sh, &dpg, g_dt, g_cx);
	float *got = down(dc, (size_t)(rows * row));
	cmp("compress paged (both levels in permuted blocks), L=1000", got, ref, (size_t)(rows * row));
	free(tab), free(k), free(ref), free(got);
	sfw_cuda_free(dk), sfw_cuda_free(dc), sfw_cuda_free(dtab);
}

static void t_stage1_paged(int T, int64_t L, int nh, int nkv, int hd)
{
	int shift = 6;
	int64_t pos0 = L - T, nb = (L + 63) / 64, P, row = (int64_t)nkv * hd;
	int64_t n1 = (L - 32) / 16 + 1, n2 = L >= 128 ? (L - 128) / 64 + 1 : 0;
	int32_t *tab = sfwt_block_table(nb, &rng);
	P = 2 * nb;
	int64_t per = sfw_ckey_rows_per_block(shift, 16);
	size_t nq = (size_t)T * nh * hd, np = (size_t)(P * per * row);
	float *q = randv(nq, 1.0f), *c1 = randv((size_t)n1 * row, 1.0f), *c2 = randv((size_t)(n2 ? n2 : 1) * row, 1.0f);
	float *pool = calloc(np, 4), *ref = malloc((size_t)nkv * T * n1 * 4), scale = 1.0f / sqrtf((float)hd);
	for (int lv = 1; lv <= 2; lv++) /* the contiguous keys laid out in the blocks */
		for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++)
			memcpy(pool + (sfw_ckey_row(tab, shift, 32, 16, lv, j) + (lv == 2 ? 64 / 16 : 0)) * row,
			       (lv == 1 ? c1 : c2) + j * row, (size_t)row * 4);
	struct sfw_sel_shape sh = {.T = T, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = pos0, .ksize = 32,
				   .stride = 16, .scale = scale, .n1 = n1, .n2 = n2};
	sfw_op_stage1_cpu(NULL, ref, q, c1, c2, &sh, NULL);
	void *dq = up(q, nq), *dp = up(pool, np), *ds = dalloc((size_t)nkv * T * n1 * 4);
	int32_t *dtab = up_raw(tab, (size_t)nb * sizeof(int32_t));
	struct sfw_pages dpg = {dtab, shift};
	sfw_op_stage1_cuda(ds, dq, dp, (char *)dp + (size_t)(64 / 16) * row * asz(), &sh, &dpg, g_dt, g_cx);
	float *got = down_f32(ds, (size_t)nkv * T * n1);
	char name[96];
	snprintf(name, sizeof(name), "stage1 paged keys T=%d L=%lld nh=%d nkv=%d hd=%d", T, (long long)L, nh, nkv, hd);
	cmp(name, got, ref, (size_t)nkv * T * n1);
	free(tab), free(q), free(c1), free(c2), free(pool), free(ref), free(got);
	sfw_cuda_free(dq), sfw_cuda_free(dp), sfw_cuda_free(ds), sfw_cuda_free(dtab);
}

static void t_stage1_shape(int T, int64_t L, int nh, int nkv, int hd)
{
	int64_t pos0 = L - T;
	int64_t n1 = (L - 32) / 16 + 1, n2 = L >= 128 ? (L - 128) / 64 + 1 : 0;
	size_t nq = (size_t)T * nh * hd;
	float *q = randv(nq, 1.0f), *c1 = randv((size_t)n1 * nkv * hd, 1.0f);
	float *c2 = randv((size_t)(n2 ? n2 : 1) * nkv * hd, 1.0f);
	float *ref = malloc((size_t)nkv * T * n1 * 4), scale = 1.0f / sqrtf((float)hd);
	struct sfw_sel_shape sh = {.T = T, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = pos0, .ksize = 32,
				   .stride = 16, .scale = scale, .n1 = n1, .n2 = n2};
	sfw_op_stage1_cpu(NULL, ref, q, c1, c2, &sh, NULL);
	void *dq = up(q, nq), *d1 = up(c1, (size_t)n1 * nkv * hd), *d2 = up(c2, (size_t)(n2 ? n2 : 1) * nkv * hd);
	void *ds = dalloc((size_t)nkv * T * n1 * 4);
	sfw_op_stage1_cuda(ds, dq, d1, d2, &sh, NULL, g_dt, g_cx);
	float *got = down_f32(ds, (size_t)nkv * T * n1);
	char name[96];
	snprintf(name, sizeof(name), "stage1 T=%d L=%lld nh=%d nkv=%d hd=%d", T, (long long)L, nh, nkv, hd);
	cmp(name, got, ref, (size_t)nkv * T * n1);
	free(q), free(c1), free(c2), free(ref), free(got);
	sfw_cuda_free(dq), sfw_cuda_free(d1), sfw_cuda_free(d2), sfw_cuda_free(ds);
}

static void t_stage1(void)
{
	t_stage1_shape(1, 100000, 32, 2, 128);
	t_stage1_shape(40, 9000, 32, 2, 128);
	t_stage1_shape(150, 1500, 8, 2, 32);
	t_stage1_shape(1, 3000, 8, 2, 32);
	/* decode rows whose warps take several steps of keys in both passes
	 * (1M: pass A's 128 splits, pass B's CTAs striding) */
	t_stage1_shape(1, 1048576, 32, 2, 128);
	t_stage1_shape(16, 300000, 32, 2, 128);
	t_stage1_shape(3, 40000, 16, 2, 64);
	/* paged compressed keys: decode rows, the CUDA-core kernel, prefill */
	t_stage1_paged(1, 100000, 32, 2, 128);
	t_stage1_paged(1, 400000, 32, 2, 128);
	t_stage1_paged(40, 9000, 32, 2, 128);
	t_stage1_paged(150, 1500, 8, 2, 32);
	t_stage1_paged(200, 5000, 32, 2, 128);
}

/* Stage 1 with the pooling in its kernel (sfw_cuda_stage1_pool), T rows
 * at the end of a cache of L tokens, its compressed keys contiguous or in
 * the permuted blocks of a paged cache: bit for bit the GPU's stage 1 then
 * its pooling (the same scores, pooled), and within stage 1's tolerance the
 * CPU twins' stage 1 then pooling. Only bf16 takes it (tensor cores): f32
 * must decline. */
static void t_stage1_pool_case(int T, int64_t L, int nh, int nkv, int hd, int init, int local, int paged)
{
	int shift = 6, block = 64;
	int64_t pos0 = L - T, nb = (L + block - 1) / block, row = (int64_t)nkv * hd;
	int64_t n1 = (L - 32) / 16 + 1, n2 = L >= 128 ? (L - 128) / 64 + 1 : 0;
	size_t nq = (size_t)T * nh * hd, ns = (size_t)nkv * T * n1, np = (size_t)nkv * T * nb;
	float *q = randv(nq, 1.0f), *c1 = randv((size_t)n1 * row, 1.0f), *c2 = randv((size_t)(n2 ? n2 : 1) * row, 1.0f);
	struct sfw_sel_shape sh = {.T = T, .nh = nh, .nkv = nkv, .hd = hd, .pos0 = pos0, .ksize = 32, .stride = 16,
				   .block = block, .init_blocks = init, .local_blocks = local,
				   .scale = 1.0f / sqrtf((float)hd), .n1 = n1, .n2 = n2, .nblocks = nb};
	float *sc = malloc(ns * 4), *ref = malloc(np * 4);
	sfw_op_stage1_cpu(NULL, sc, q, c1, c2, &sh, NULL);
	sfw_op_pool_blocks_cpu(ref, sc, &sh);
	void *dq = up(q, nq), *d1, *d2, *dpool = NULL;
	int32_t *tab = NULL, *dtab = NULL;
	struct sfw_pages dpg = {NULL, shift};
	if (paged) { /* the keys laid out in the blocks, as t_stage1_paged */
		tab = sfwt_block_table(nb, &rng);
		int64_t per = sfw_ckey_rows_per_block(shift, 16);
		size_t npool = (size_t)(2 * nb * per * row);
		float *pool = calloc(npool, 4);
		for (int lv = 1; lv <= 2; lv++)
			for (int64_t j = 0; j < (lv == 1 ? n1 : n2); j++)
				memcpy(pool + (sfw_ckey_row(tab, shift, 32, 16, lv, j) + (lv == 2 ? 64 / 16 : 0)) * row,
				       (lv == 1 ? c1 : c2) + j * row, (size_t)row * 4);
		dpool = up(pool, npool);
		free(pool);
		dtab = up_raw(tab, (size_t)nb * sizeof(int32_t));
		dpg.tab = dtab;
		d1 = dpool, d2 = (char *)dpool + (size_t)(64 / 16) * row * asz();
	} else {
		d1 = up(c1, (size_t)n1 * row), d2 = up(c2, (size_t)(n2 ? n2 : 1) * row);
	}
	void *ds = dalloc(ns * 4), *dp0 = dalloc(np * 4), *dp1 = dalloc(np * 4);
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, pos0), .len = T};
	const struct sfw_pages *pg = paged ? &dpg : NULL;
	int ran = sfw_cuda_stage1_pool(dp1, dq, d1, d2, &sh, pg, &rr, g_dt, g_cx);
	char name[112];
	snprintf(name, sizeof(name), "stage1+pool%s T=%d L=%lld nh=%d hd=%d init %d local %d", paged ? " paged" : "", T,
		 (long long)L, nh, hd, init, local);
	if (g_dt != SFW_DTYPE_BF16) {
		CHECK(!ran, "%s: f32 activations taken by the bf16 tensor-core kernel", name);
	} else {
		CHECK(ran, "%s: the pooling stage 1 declined a bf16 prefill call", name);
		/* the same scoring kernel: below 64 rows auto mode would score
		 * with the CUDA-core kernel, whose sums may round to other bf16
		 * values (both are held to the CPU twin by the stage1 cases) */
		const int keep = g_cx->stage1;
		g_cx->stage1 = 2;
		sfw_cuda_stage1(ds, dq, d1, d2, &sh, pg, &rr, g_dt, g_cx);
		g_cx->stage1 = keep;
		sfw_cuda_pool_blocks(dp0, ds, &sh, &rr, g_dt, g_cx);
		float *g0 = down_f32(dp0, np), *g1 = down_f32(dp1, np);
		size_t diff = 0;
		for (size_t i = 0; i < np; i++)
			diff += memcmp(&g0[i], &g1[i], 4) != 0;
		printf("  bf16 %-46s %zu of %zu differ from stage1 + pool\n", name, diff, np);
		CHECK(diff == 0, "%s: %zu of %zu pooled values differ from stage 1 then pooling", name, diff, np);
		cmp(name, g1, ref, np);
		free(g0), free(g1);
	}
	free(q), free(c1), free(c2), free(sc), free(ref), free(tab);
	sfw_cuda_free(dq), sfw_cuda_free(d1), sfw_cuda_free(ds), sfw_cuda_free(dp0), sfw_cuda_free(dp1);
	sfw_cuda_free(dtab);
	if (!paged)
		sfw_cuda_free(d2);
}

static void t_stage1_pool(void)
{
	/* the model's shape (init 1, local 32) near a tile's edges and far past
	 * the local blocks; a call just past the decode rows (17) and odd
	 * counts (a last warp with one token); fewer chunks than a tile, no
	 * level-2 chunk for the first rows; other initial and local counts */
	t_stage1_pool_case(40, 9000, 32, 2, 128, 1, 32, 0);
	t_stage1_pool_case(17, 20000, 32, 2, 128, 1, 32, 0);
	t_stage1_pool_case(301, 70001, 32, 2, 128, 1, 32, 0);
	t_stage1_pool_case(150, 1500, 8, 2, 32, 1, 32, 0);
	t_stage1_pool_case(100, 100, 16, 2, 64, 1, 32, 0);
	t_stage1_pool_case(64, 4159, 32, 2, 128, 2, 3, 0);
	t_stage1_pool_case(33, 12310, 16, 1, 64, 0, 0, 0); /* a block past the last tile */
	t_stage1_pool_case(40, 9000, 32, 2, 128, 1, 32, 1);
	t_stage1_pool_case(200, 5000, 32, 2, 128, 3, 5, 1);
}

/* Top-k's forms against the CPU's pooling and top-k, bit for bit: rows
 * T of level-1 scores sc ([nkv, T, n1] of a cache of L tokens, the rows the
 * last T), through pooling + top-k or the fused pool_topk, with the keys in
 * shared memory (the context's limit) or read from global memory (limit
 * 0); the launches bounded by `bound` tokens (>= L: a recorded step's bound
 * is its bucket's, its rows shorter). Returns the indices that differ. */
static size_t topk_forms(const float *sc, int nkv, int T, int64_t L, int64_t bound, int fused, int in_smem)
{
	int k = 96, block = 64;
	int64_t pos0 = L - T, n1 = (L - 32) / 16 + 1, nb = (L + block - 1) / block;
	struct sfw_sel_shape sh = {.T = T, .nkv = nkv, .pos0 = pos0, .ksize = 32, .stride = 16, .block = block,
				   .init_blocks = 1, .local_blocks = 32, .n1 = n1, .nblocks = nb, .topk = k};
	float *pr = malloc((size_t)nkv * T * nb * 4);
	int32_t *ir = malloc((size_t)nkv * T * k * 4), *ig = malloc((size_t)nkv * T * k * 4);
	sfw_op_pool_blocks_cpu(pr, sc, &sh);
	sfw_op_topk_blocks_cpu(NULL, ir, pr, &sh);
	void *dsc = up_raw(sc, (size_t)nkv * T * n1 * 4), *di = dalloc((size_t)nkv * T * k * 4);
	void *dp = dalloc((size_t)nkv * T * nb * 4);
	sh.n1 = (bound - 32) / 16 + 1, sh.nblocks = (bound + block - 1) / block; /* the launches' bounds */
	struct sfw_cuda_rowref rr = {.pos = sfw_cuda_ctx_pos(g_cx, pos0), .len = T};
	size_t lim = g_cx->topk_smem;
	if (!in_smem)
		g_cx->topk_smem = 0;
	if (fused) {
		sfw_cuda_pool_topk(di, dsc, &sh, &rr, g_cx);
	} else {
		sfw_cuda_pool_blocks(dp, dsc, &sh, &rr, g_dt, g_cx);
		sfw_cuda_topk_blocks(di, dp, &sh, &rr, g_dt, g_cx);
	}
	g_cx->topk_smem = lim;
	sfw_cuda_d2h(ig, di, (size_t)nkv * T * k * 4, g_s);
	sfw_cuda_sync(g_s);
	size_t d = 0;
	for (size_t i = 0; i < (size_t)nkv * T * k; i++)
		d += ig[i] != ir[i];
	free(pr), free(ir), free(ig);
	sfw_cuda_free(dsc), sfw_cuda_free(di), sfw_cuda_free(dp);
	return d;
}

/* Level-1 scores for topk_forms: 8 levels (ties everywhere), some -inf and
 * NaN; tight: most values equal 0.5 (one top byte for every key). */
static float *tie_scores(size_t n, int tight)
{
	float *sc = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		float u = urand();
		sc[i] = tight ? (u > 0.9f ? 0.5f + 0.25f * u : 0.5f) : floorf((u + 1.0f) * 4.0f) * 0.125f;
		if (i % 997 == 0)
			sc[i] = -INFINITY;
		if (i % 1999 == 0)
			sc[i] = NAN;
	}
	return sc;
}

/* Every form: prefill rows (256 threads per row), a decode row in one
 * block (up to 4 parts of 1,024 blocks: 3,125 and 4,096 blocks here) and
 * split (4,097 blocks and more: the parts and the merge), in shared and in
 * global memory, launches bounded at the rows' length and far past it. */
static void t_topk_forms(void)
{
	/* the limit sfw_cuda_ctx_new raised: a 1M-token row's 16K blocks
	 * (64 KiB) fit on every sm_80+ card (99 KiB and more) */
	printf("  top-k keys in shared memory: up to %zu bytes\n", g_cx->topk_smem);
	CHECK(g_cx->topk_smem >= 16384 * 4, "top-k's shared memory holds %zu bytes, not a 1M-token row",
	      g_cx->topk_smem);
	struct {
		int nkv, T, tight;
		int64_t L, bound;
	} cs[] = {{2, 50, 0, 40000, 40000},	  {2, 1, 0, 1048576, 1048576}, {2, 1, 1, 1048576, 1048576},
		  {2, 20, 1, 200000, 200000},	  {2, 3, 0, 100, 100},	       {2, 1, 0, 65536, 65536},
		  {2, 1, 0, 65600, 1048576},	  {2, 1, 1, 300000, 2000000},  {2, 1, 0, 1000, 1048576},
		  {2, 50, 0, 40000, 100000},	  {2, 1, 0, 200000, 200000},   {2, 1, 1, 262144, 262144},
		  {2, 1, 0, 262145, 262145},	  {2, 1, 0, 200000, 1048576}};
	for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
		int64_t n1 = (cs[c].L - 32) / 16 + 1;
		float *sc = tie_scores((size_t)cs[c].nkv * cs[c].T * n1, cs[c].tight);
		for (int form = 0; form < 4; form++) {
			int fused = form & 1, in_smem = !(form & 2);
			size_t d = topk_forms(sc, cs[c].nkv, cs[c].T, cs[c].L, cs[c].bound, fused, in_smem);
			printf("  %-4s %-11s %-6s T=%-3d L=%-8lld bound %-8lld%s %zu indices differ\n",
			       g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", fused ? "pool_topk" : "pool + topk",
			       in_smem ? "shared" : "global", cs[c].T, (long long)cs[c].L, (long long)cs[c].bound,
			       cs[c].tight ? " (one top byte)" : "", d);
			CHECK(d == 0, "top-k %s %s T=%d L=%lld bound %lld: %zu indices differ", fused ? "fused" : "pooled",
			      in_smem ? "shared" : "global", cs[c].T, (long long)cs[c].L, (long long)cs[c].bound, d);
		}
		free(sc);
	}
}

/* Pooling and top-k are exact (max and comparisons): compared bit for bit,
 * on scores with many exact ties, NaN and -inf. */
static void t_pool_topk(void)
{
	int nkv = 2, T = 50, k = 96, block = 64;
	int64_t L = 40000, pos0 = L - T, n1 = (L - 32) / 16 + 1, nb = (L + block - 1) / block;
	size_t ns = (size_t)nkv * T * n1;
	float *sc = malloc(ns * 4);
	for (size_t i = 0; i < ns; i++) {
		float u = urand();
		sc[i] = floorf((u + 1.0f) * 4.0f) * 0.125f; /* 8 levels: ties everywhere */
		if (i % 997 == 0)
			sc[i] = -INFINITY;
		if (i % 1999 == 0)
			sc[i] = NAN;
	}
	float *pr = malloc((size_t)nkv * T * nb * 4);
	struct sfw_sel_shape sh = {.T = T, .nkv = nkv, .pos0 = pos0, .ksize = 32, .stride = 16,
				   .block = block, .init_blocks = 1, .local_blocks = 32, .n1 = n1,
				   .nblocks = nb};
	sfw_op_pool_blocks_cpu(pr, sc, &sh);
	void *dsc = up_raw(sc, ns * 4), *dp = dalloc((size_t)nkv * T * nb * 4);
	sfw_op_pool_blocks_cuda(dp, dsc, &sh, g_dt, g_cx);
	float *pg = down_f32(dp, (size_t)nkv * T * nb);
	size_t diff = 0;
	for (size_t i = 0; i < (size_t)nkv * T * nb; i++)
		if (memcmp(&pg[i], &pr[i], 4) != 0 && !(isnan(pg[i]) && isnan(pr[i])))
			diff++;
	printf("  %-4s %-46s %zu of %zu differ\n", g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", "pool_blocks L=40000 T=50",
	       diff, (size_t)nkv * T * nb);
	CHECK(diff == 0, "pool_blocks: %zu values differ", diff);
	/* top-k on the CPU's pooled values, and on a short row set (nblocks < k) */
	for (int pass = 0; pass < 2; pass++) {
		int64_t nbx = pass ? 40 : nb;
		int64_t p0 = pass ? 40 * 64 - T : pos0;
		int32_t *ir = malloc((size_t)nkv * T * k * 4);
		struct sfw_sel_shape ts = {.T = T, .nkv = nkv, .pos0 = p0, .block = block, .nblocks = nbx,
					   .topk = k};
		sfw_op_topk_blocks_cpu(NULL, ir, pr, &ts);
		void *dpr = up_raw(pr, (size_t)nkv * T * nbx * 4), *di = dalloc((size_t)nkv * T * k * 4);
		sfw_op_topk_blocks_cuda(di, dpr, &ts, g_dt, g_cx);
		int32_t *ig = malloc((size_t)nkv * T * k * 4);
		sfw_cuda_d2h(ig, di, (size_t)nkv * T * k * 4, g_s);
		sfw_cuda_sync(g_s);
		size_t d = 0;
		for (size_t i = 0; i < (size_t)nkv * T * k; i++)
			d += ig[i] != ir[i];
		printf("  %-4s topk_blocks nblocks=%-6lld k=96 (ties, NaN, -inf)       %zu of %zu indices differ\n",
		       g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", (long long)nbx, d, (size_t)nkv * T * k);
		CHECK(d == 0, "topk_blocks nblocks=%lld: %zu indices differ", (long long)nbx, d);
		free(ir), free(ig);
		sfw_cuda_free(dpr), sfw_cuda_free(di);
	}
	/* one row per KV group (a decode step: the 1024-thread form), up to
	 * the 16K blocks of a 1M-token context */
	int64_t nbs[] = {nb, 16384};
	for (int pass = 0; pass < 2; pass++) {
		int64_t nbx = nbs[pass], p0 = nbx * block - 1;
		float *po = malloc((size_t)nkv * nbx * 4);
		for (int64_t i = 0; i < nkv * nbx; i++) {
			po[i] = floorf((urand() + 1.0f) * 8.0f) * 0.0625f;
			if (i % 389 == 0)
				po[i] = i % 2 ? -INFINITY : NAN;
		}
		int32_t *ir = malloc((size_t)nkv * k * 4), *ig = malloc((size_t)nkv * k * 4);
		struct sfw_sel_shape ts = {.T = 1, .nkv = nkv, .pos0 = p0, .block = block, .nblocks = nbx,
					   .topk = k};
		sfw_op_topk_blocks_cpu(NULL, ir, po, &ts);
		void *dpo = up_raw(po, (size_t)nkv * nbx * 4), *di = dalloc((size_t)nkv * k * 4);
		sfw_op_topk_blocks_cuda(di, dpo, &ts, g_dt, g_cx);
		sfw_cuda_d2h(ig, di, (size_t)nkv * k * 4, g_s);
		sfw_cuda_sync(g_s);
		size_t d = 0;
		for (size_t i = 0; i < (size_t)nkv * k; i++)
			d += ig[i] != ir[i];
		printf("  %-4s topk_blocks T=1 nblocks=%-6lld k=96 (ties, NaN, -inf)   %zu of %zu indices differ\n",
		       g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", (long long)nbx, d, (size_t)nkv * k);
		CHECK(d == 0, "topk_blocks T=1 nblocks=%lld: %zu indices differ", (long long)nbx, d);
		free(po), free(ir), free(ig);
		sfw_cuda_free(dpo), sfw_cuda_free(di);
	}
	/* several rows on the 1024-thread form (nkv * T < 64), the query
	 * blocks well inside the row: blocks past a row's own come back -1 */
	{
		int Tr = 20;
		int64_t nbx = 3000, p0 = 1200 * (int64_t)block + 7;
		size_t np = (size_t)nkv * Tr * nbx;
		float *po = malloc(np * 4);
		for (size_t i = 0; i < np; i++)
			po[i] = floorf((urand() + 1.0f) * 8.0f) * 0.0625f;
		int32_t *ir = malloc((size_t)nkv * Tr * k * 4), *ig = malloc((size_t)nkv * Tr * k * 4);
		struct sfw_sel_shape ts = {.T = Tr, .nkv = nkv, .pos0 = p0, .block = block, .nblocks = nbx,
					   .topk = k};
		sfw_op_topk_blocks_cpu(NULL, ir, po, &ts);
		void *dpo = up_raw(po, np * 4), *di = dalloc((size_t)nkv * Tr * k * 4);
		sfw_op_topk_blocks_cuda(di, dpo, &ts, g_dt, g_cx);
		sfw_cuda_d2h(ig, di, (size_t)nkv * Tr * k * 4, g_s);
		sfw_cuda_sync(g_s);
		size_t d = 0, past = 0;
		for (size_t i = 0; i < (size_t)nkv * Tr * k; i++)
			d += ig[i] != ir[i], past += ir[i] == -1;
		printf("  %-4s topk_blocks T=20 nblocks=3000 k=96 (query block 1200)    %zu of %zu indices differ\n",
		       g_dt == SFW_DTYPE_BF16 ? "bf16" : "f32", d, (size_t)nkv * Tr * k);
		CHECK(d == 0, "topk_blocks T=20 query block 1200: %zu indices differ", d);
		CHECK(past > 0, "topk_blocks T=20: the case selects blocks past the query block (%zu)", past);
		free(po), free(ir), free(ig);
		sfw_cuda_free(dpo), sfw_cuda_free(di);
	}
	free(sc), free(pr), free(pg);
	sfw_cuda_free(dsc), sfw_cuda_free(dp);
}

struct op_test {
	const char *op;
	void (*fn)(void);
	struct tol tol[2]; /* [SFW_DTYPE_F32], [SFW_DTYPE_BF16] */
};

/* f32: only the summation order differs from the CPU (and libm vs CUDA
 * expf/sinf/powf ulps); bf16: one or two bf16 roundings per element
 * (relative 2^-9 each) on top, NMSE ~1e-5 at most. */
static const struct op_test tests[] = {
	{"embed", t_embed, {{1e-12, 1e-6}, {1e-5, 8e-3}}},
	{"rmsnorm", t_rmsnorm, {{1e-11, 1e-5}, {3e-5, 1.6e-2}}},
	{"add_scaled", t_add, {{1e-12, 1e-6}, {3e-5, 1.6e-2}}},
	{"silu_mul", t_silu, {{1e-11, 1e-5}, {3e-5, 1.6e-2}}},
	{"sigmoid_mul", t_sig, {{1e-11, 1e-5}, {3e-5, 1.6e-2}}},
	{"rope_neox", t_rope, {{1e-9, 1e-4}, {3e-5, 1.6e-2}}},
	{"qk_norm_rope", t_qknorm, {{1e-9, 1e-4}, {3e-5, 1.6e-2}}},
	{"matmul", t_matmul, {{1e-10, 1e-4}, {3e-5, 1.6e-2}}},
	{"logits", t_logits, {{1e-10, 1e-4}, {3e-5, 1.6e-2}}},
	{"gla", t_gla, {{1e-9, 1e-4}, {1e-4, 3e-2}}},
	{"attn", t_attn, {{1e-10, 1e-4}, {3e-5, 1.6e-2}}},
	{"compress", t_compress, {{1e-12, 1e-5}, {1e-5, 8e-3}}},
	{"compress-paged", t_compress_paged, {{1e-12, 1e-5}, {1e-5, 8e-3}}},
	{"stage1", t_stage1, {{1e-9, 1e-4}, {3e-5, 1.6e-2}}},
	{"stage1_pool", t_stage1_pool, {{1e-9, 1e-4}, {3e-5, 1.6e-2}}},
	{"pool_topk", t_pool_topk, {{0, 0}, {0, 0}}},
	{"topk_forms", t_topk_forms, {{0, 0}, {0, 0}}},
};

int main(int argc, char **argv)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_ops");
	}
	if (sfw_cuda_stream_new(&g_s, &err) != SFW_OK || sfw_cuda_ctx_new(g_s, &g_cx, &err) != SFW_OK) {
		CHECK(0, "%s", err.msg);
		return CHECK_REPORT("gpu_ops");
	}
	printf("CUDA twins vs CPU twins on %s (NMSE and max|diff| per op and dtype)\n", info.name);
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (argc > 1 && strcmp(argv[1], tests[i].op) != 0)
			continue;
		for (int d = 0; d < 2; d++) {
			g_dt = d ? SFW_DTYPE_BF16 : SFW_DTYPE_F32;
			g_tol = tests[i].tol[d];
			tests[i].fn();
		}
	}
	sfw_cuda_ctx_free(g_cx);
	size_t live;
	sfw_cuda_mem_stats(&live, NULL, NULL);
	CHECK(live == 0, "device bytes still allocated after the tests: %zu", live);
	sfw_cuda_stream_free(g_s);
	return CHECK_REPORT("gpu_ops");
}
