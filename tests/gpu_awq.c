/* The AWQ search on the GPU against the CPU search (quant/awq.c), which is
 * the reference. The GPU side is built to compute the same numbers bit for
 * bit (kernels/awq.cu: every product, quotient and sum in the CPU's order,
 * no FMA), so every comparison here is exact equality:
 *   1. each kernel against its C twin (kernels/awq_cuda.h names them) on
 *      random and structured data of several shapes, groups 32, 64, 128 and
 *      per channel: float copies, duo sums, fake quantizer (with rounding
 *      ties and a non-finite row), the lane-ordered product, row losses;
 *   2. whole group searches, CPU vs GPU (sfwi_awq_search_group): every
 *      candidate's loss, the chosen alpha and the scales, on random and
 *      structured groups (salient channels, outlier weights, constant
 *      activations where every candidate ties, the real model's 4096 x
 *      4096 and 16384-wide shapes);
 *   3. a whole `quant` run on a golden model with the calibration on CUDA:
 *      every group searched on the GPU and, searched again on the CPU from
 *      the same statistics (awq_check), the same losses.
 * A difference prints what differs (the element, both values in hex,
 * the loss table of the group). */
#include "check.h"
#include "lib/rng.h"

#include "kernels/awq_cuda.h"
#include "kernels/ops_cuda.h"
#include "num/num.h"
#include "quant/quant_int.h"
#include "runner/backend.h"
#include "thread.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x5eed0a3c;
static void *stream;
static struct sfw_ops_cpu *cpu_ex; /* the CPU twins' executor (main) */

static float gauss(void)
{
	float u = sfwt_unit(&rng) * 0.999f + 0.0005f, v = sfwt_unit(&rng);
	return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void *up(const void *h, size_t bytes)
{
	void *d = NULL;
	struct sfw_err err = {0};
	if (sfw_cuda_malloc(&d, bytes ? bytes : 16, "gpu_awq", &err) != SFW_OK) {
		printf("FAIL device allocation of %zu bytes: %s\n", bytes, err.msg);
		exit(1);
	}
	if (h && bytes)
		sfw_cuda_h2d(d, h, bytes, stream);
	return d;
}

static void down(void *h, const void *d, size_t bytes)
{
	sfw_cuda_d2h(h, d, bytes, stream);
	sfw_cuda_sync(stream);
}

/* Exact float comparison; prints the first differences. Returns mismatches. */
static size_t same_f32(const char *what, const float *gpu, const float *cpu, size_t n, size_t cols)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		if (!(gpu[i] == cpu[i]) && !(isnan(gpu[i]) && isnan(cpu[i]))) {
			if (bad < 3)
				printf("  %s: [%zu, %zu] gpu %a cpu %a (diff %.3e)\n", what, i / cols, i % cols, gpu[i], cpu[i],
				       (double)gpu[i] - cpu[i]);
			bad++;
		}
	return bad;
}

/* ---- 1. the kernels against their C twins ------------------------------------ */

static void twin_to_f32(size_t n)
{
	uint16_t *hb = malloc(n * 2);
	float *hf = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		hb[i] = sfw_f32_to_bf16(gauss());
		hf[i] = gauss();
	}
	void *db = up(hb, n * 2), *dfs = up(hf, n * 4);
	float *dy = up(NULL, n * 4);
	for (int f32 = 0; f32 < 2; f32++) {
		sfw_cuda_awq_to_f32(dy, f32 ? dfs : db, f32 ? SFW_DTYPE_F32 : SFW_DTYPE_BF16, n, stream);
		down(got, dy, n * 4);
		for (size_t i = 0; i < n; i++)
			ref[i] = sfw_op_wget(f32 ? (const void *)hf : (const void *)hb, f32 ? SFW_DTYPE_F32 : SFW_DTYPE_BF16, i);
		size_t b = same_f32("to_f32", got, ref, n, n);
		CHECK(b == 0, "to_f32 %s, %zu values: %zu differ from sfw_op_wget", f32 ? "f32" : "bf16", n, b);
	}
	sfw_cuda_free(db), sfw_cuda_free(dfs), sfw_cuda_free(dy);
	free(hb), free(hf), free(ref), free(got);
}

static void twin_matmul(int M, int N, int K)
{
	float *x = malloc((size_t)M * K * 4), *w = malloc((size_t)N * K * 4);
	float *ref = malloc((size_t)M * N * 4), *got = malloc((size_t)M * N * 4);
	for (size_t i = 0; i < (size_t)M * K; i++)
		x[i] = gauss() * (i % 7 == 0 ? 8.0f : 1.0f);
	for (size_t i = 0; i < (size_t)N * K; i++)
		w[i] = gauss() * 0.02f;
	float *dx = up(x, (size_t)M * K * 4), *dw = up(w, (size_t)N * K * 4), *dy = up(NULL, (size_t)M * N * 4);
	sfw_op_matmul_cpu(cpu_ex, ref, x, w, SFW_DTYPE_F32, M, N, K);
	sfw_cuda_awq_matmul(dy, dx, dw, M, N, K, stream);
	down(got, dy, (size_t)M * N * 4);
	size_t b = same_f32("matmul", got, ref, (size_t)M * N, (size_t)N);
	CHECK(b == 0, "matmul %d x %d x %d: %zu of %zu outputs differ from sfw_op_matmul_cpu (F32)", M, N, K, b,
	      (size_t)M * N);
	sfw_cuda_free(dx), sfw_cuda_free(dw), sfw_cuda_free(dy);
	free(x), free(w), free(ref), free(got);
}

/* kind 0: gaussian weights and scales; 1: rounding ties (s = 1, each group
 * with max 127.5 * 2^-4 and the rest odd multiples of 2^-5, so x / sd lands
 * on k + 0.5); 2: gaussian with a non-finite product in row 5 */
static void twin_fake(int N, int K, int group, int kind)
{
	size_t n = (size_t)N * K;
	float *w = malloc(n * 4), *s = malloc((size_t)K * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
	unsigned char *bad = malloc((size_t)N);
	int span = group > 0 ? group : K;
	for (int k = 0; k < K; k++)
		s[k] = kind == 1 ? 1.0f : expf(gauss() * 0.5f);
	for (size_t i = 0; i < n; i++) {
		int k = (int)(i % (size_t)K);
		if (kind == 1)
			w[i] = k % span == 0 ? 127.5f / 16 : (float)(2 * (int)(sfwt_next(&rng) % 255) - 254 + 1) / 32;
		else
			w[i] = gauss() * 0.05f * (k % 17 == 3 ? 10.0f : 1.0f);
	}
	if (kind == 2 && N > 5)
		w[(size_t)5 * K + K / 2] = INFINITY;
	float *dw = up(w, n * 4), *ds = up(s, (size_t)K * 4), *dq = up(NULL, n * 4);
	int *dbad = up(NULL, sizeof(int));
	sfw_cuda_memset(dq, 0, n * 4, stream);
	sfwi_awq_fake_rows(cpu_ex, ref, bad, w, s, N, K, group);
	sfw_cuda_awq_fake(dq, dbad, dw, ds, N, K, group, stream);
	int gbad = 0;
	down(got, dq, n * 4);
	down(&gbad, dbad, sizeof(int));
	int cbad = -1;
	for (int r = 0; r < N && cbad < 0; r++)
		if (bad[r])
			cbad = r;
	int gb = gbad == SFW_CUDA_AWQ_NO_BAD ? -1 : gbad;
	size_t b = 0;
	for (int r = 0; r < N; r++) /* rows the CPU found finite */
		if (!bad[r])
			b += same_f32("fake", got + (size_t)r * K, ref + (size_t)r * K, (size_t)K, (size_t)K);
	static const char *const kinds[] = {"random", "half-step ties", "a non-finite row"};
	char gs[16];
	snprintf(gs, sizeof(gs), group > 0 ? "g%d" : "channel", group);
	CHECK(b == 0 && gb == cbad, "fake quantizer %s, %d x %d %s: %zu values differ from sfwi_awq_fake_rows; first "
	      "non-finite row gpu %d cpu %d", kinds[kind], N, K, gs, b, gb, cbad);
	sfw_cuda_free(dw), sfw_cuda_free(ds), sfw_cuda_free(dq), sfw_cuda_free(dbad);
	free(w), free(s), free(ref), free(got), free(bad);
}

static void twin_duo(int N, int K, int group)
{
	int span = group > 0 ? group : K, G = (K + span - 1) / span;
	float *w = malloc((size_t)N * K * 4), *wm = malloc((size_t)K * 4), *gm = malloc((size_t)N * G * 4);
	float *gwm = malloc((size_t)K * 4), *ggm = malloc((size_t)N * G * 4);
	for (size_t i = 0; i < (size_t)N * K; i++)
		w[i] = (i % 97 == 0) ? 0.0f : gauss() * 0.03f;
	for (int k = 0; k < (K < span ? K : span); k++) /* row 1's first group all zero: max 0 */
		w[(size_t)(N > 1) * K + k] = 0.0f;
	float *dw = up(w, (size_t)N * K * 4), *dwm = up(NULL, (size_t)K * 4), *dgm = up(NULL, (size_t)N * G * 4);
	sfwi_awq_duo_sums(cpu_ex, wm, gm, w, N, K, span);
	sfw_cuda_awq_duo(dwm, dgm, dw, N, K, span, stream);
	down(gwm, dwm, (size_t)K * 4);
	down(ggm, dgm, (size_t)N * G * 4);
	size_t b1 = same_f32("duo gmax", ggm, gm, (size_t)N * G, (size_t)G), b2 = same_f32("duo wm", gwm, wm, (size_t)K, (size_t)K);
	CHECK(b1 == 0 && b2 == 0, "duo sums %d x %d span %d: %zu group maxima and %zu column sums differ", N, K, span, b1, b2);
	sfw_cuda_free(dw), sfw_cuda_free(dwm), sfw_cuda_free(dgm);
	free(w), free(wm), free(gm), free(gwm), free(ggm);
}

static void twin_sqerr(int R, int N)
{
	float *a = malloc((size_t)R * N * 4), *b = malloc((size_t)R * N * 4);
	double *ref = malloc((size_t)R * 8), *got = malloc((size_t)R * 8);
	for (size_t i = 0; i < (size_t)R * N; i++) {
		b[i] = gauss();
		a[i] = b[i] + gauss() * 1e-3f;
	}
	float *da = up(a, (size_t)R * N * 4), *db = up(b, (size_t)R * N * 4);
	double *dp = up(NULL, (size_t)R * 8);
	sfwi_awq_sqerr_rows(cpu_ex, ref, a, b, R, (size_t)N);
	sfw_cuda_awq_sqerr_rows(dp, da, db, R, N, stream);
	down(got, dp, (size_t)R * 8);
	int bad = 0;
	for (int r = 0; r < R; r++)
		if (got[r] != ref[r]) {
			if (bad < 3)
				printf("  sqerr row %d: gpu %a cpu %a\n", r, got[r], ref[r]);
			bad++;
		}
	CHECK(bad == 0, "row losses %d x %d: %d of %d rows differ from sfwi_awq_sqerr_rows", R, N, bad, R);
	sfw_cuda_free(da), sfw_cuda_free(db), sfw_cuda_free(dp);
	free(a), free(b), free(ref), free(got);
}

/* ---- 2. group searches, CPU vs GPU --------------------------------------------- */

struct part {
	uint16_t *host;
	void *dev;
	struct sfw_bweight w;
};

/* kind 0: random; 1: salient input channels and outlier weight columns (the
 * case AWQ is for); 2: constant activations, no duo: every alpha gives
 * s = 1, so every candidate ties and both must keep the identity */
static void group_search(const char *name, const int *rows, int nparts, int K, int R, int group, int kind, int duo)
{
	struct part pt[5];
	struct sfwi_awq_group g = {{NULL}, nparts, K, NULL, R, NULL, R};
	float *X = malloc((size_t)R * K * 4);
	double *sum = calloc((size_t)K, sizeof(double));
	float *chan = malloc((size_t)K * 4);
	for (int k = 0; k < K; k++)
		chan[k] = kind == 2 ? 1.0f : expf(gauss() * 0.7f) * (kind == 1 && k % 61 == 7 ? 25.0f : 1.0f);
	for (int r = 0; r < R; r++)
		for (int k = 0; k < K; k++) {
			float v = kind == 2 ? 1.0f : gauss() * chan[k];
			X[(size_t)r * K + k] = v;
			sum[k] += fabs((double)v);
		}
	for (int i = 0; i < nparts; i++) {
		size_t n = (size_t)rows[i] * K;
		pt[i].host = malloc(n * 2);
		for (size_t e = 0; e < n; e++) {
			int k = (int)(e % (size_t)K);
			float v = gauss() * 0.02f * (kind == 1 && k % 37 == 11 ? 12.0f : 1.0f);
			pt[i].host[e] = sfw_f32_to_bf16(v);
		}
		pt[i].dev = up(pt[i].host, n * 2);
		memset(&pt[i].w, 0, sizeof(pt[i].w));
		pt[i].w.name = "gpu_awq.part";
		pt[i].w.host = pt[i].host;
		pt[i].w.dev = pt[i].dev;
		pt[i].w.dtype = SFW_DTYPE_BF16;
		pt[i].w.rows = rows[i];
		pt[i].w.cols = K;
		g.w[i] = &pt[i].w;
	}
	g.sum = sum;
	g.X = X;
	struct sfw_quant_params p = sfw_quant_default_params();
	p.group_size = group;
	p.duo_scaling = duo;
	int ng = p.n_grid;
	double lc[64], lg[64];
	int kc = -1, kg = -1;
	float *sc = NULL, *sg = NULL;
	struct sfw_err err = {0};
	struct sfwi_awq_dev *dev = NULL;
	enum sfw_status s1 = sfwi_awq_search_group(cpu_ex, "gpu_awq", &g, &p, NULL, lc, &kc, &sc, &err);
	enum sfw_status s2 = s1 == SFW_OK ? sfwi_awq_dev_new(&dev, &err) : s1;
	if (s2 == SFW_OK)
		s2 = sfwi_awq_search_group(cpu_ex, "gpu_awq", &g, &p, dev, lg, &kg, &sg, &err);
	sfwi_awq_dev_free(dev);
	char gs[16];
	snprintf(gs, sizeof(gs), group > 0 ? "g%d" : "channel", group);
	if (s1 != SFW_OK || s2 != SFW_OK) {
		CHECK(0, "%s %s: search failed: %s", name, gs, err.msg);
	} else {
		int nl = 0;
		for (int k = 0; k < ng; k++)
			nl += lc[k] != lg[k];
		int same_s = (sc == NULL) == (sg == NULL) && (!sc || memcmp(sc, sg, (size_t)K * 4) == 0);
		int ties = 0;
		for (int k = 1; k < ng; k++)
			ties += lc[k] == lc[0];
		int N = 0;
		for (int i = 0; i < nparts; i++)
			N += rows[i];
		printf("%-34s %-7s N %5d K %5d R %3d: alpha cpu %.2f gpu %.2f, loss %.4e (identity %.4e), %d/%d "
		       "candidates tie the identity\n", name, gs, N, K, R, (double)kc / ng, (double)kg / ng, lc[kc], lc[0],
		       ties, ng - 1);
		if (nl || kc != kg || !same_s)
			for (int k = 0; k < ng; k++)
				printf("  candidate %2d (alpha %.2f): cpu %.17g gpu %.17g%s\n", k, (double)k / ng, lc[k], lg[k],
				       lc[k] != lg[k] ? "  <- differs" : "");
		CHECK(nl == 0, "%s %s: %d of %d candidate losses differ between the GPU and the CPU search", name, gs, nl,
		      ng);
		CHECK(kc == kg && same_s, "%s %s: chosen alpha gpu %.2f cpu %.2f, scales %s", name, gs, (double)kg / ng,
		      (double)kc / ng, same_s ? "equal" : "differ");
		if (kind == 2)
			CHECK(kc == 0 && kg == 0 && ties == ng - 1,
			      "%s: all candidates tie (%d of %d), both keep the identity", name, ties, ng - 1);
	}
	free(sc), free(sg);
	for (int i = 0; i < nparts; i++) {
		sfw_cuda_free(pt[i].dev);
		free(pt[i].host);
	}
	free(X), free(sum), free(chan);
}

/* ---- 3. a whole run ---------------------------------------------------------------- */

static void whole_run(const char *golden, const char *name, int group)
{
	char in[600], out[700], tmp[256];
	snprintf(in, sizeof(in), "%s/%s", golden, name);
	snprintf(tmp, sizeof(tmp), "%s/salafw-gpu-awq.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp)) {
		CHECK(0, "mkdtemp");
		return;
	}
	snprintf(out, sizeof(out), "%s/out", tmp);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	struct sfw_err err = {0};
	p.device = SFW_DEVICE_CUDA;
	p.group_size = group;
	p.awq_check = 1;
	p.stats = &st;
	enum sfw_status s = sfw_quant_run(in, out, &p, &err);
	CHECK(s == SFW_OK, "quant --device cuda %s: %s", name, s == SFW_OK ? "ok" : err.msg);
	if (s == SFW_OK) {
		printf("%s g%d on CUDA: %d groups, %d searched on the GPU, %d differ from the CPU search; %lld sequences, "
		       "%lld tokens, the text gave %lld and %lld were used; mean alpha %.3f\n", name, group,
		       st.awq_mappings, st.awq_gpu_groups, st.awq_check_diff, (long long)st.calib_samples,
		       (long long)st.calib_tokens, (long long)st.calib_text_tokens, (long long)st.calib_text_used,
		       st.awq_mean_alpha);
		CHECK(st.awq_mappings > 0 && st.awq_gpu_groups == st.awq_mappings,
		      "%s: every group searched on the GPU (%d of %d)", name, st.awq_gpu_groups, st.awq_mappings);
		CHECK(st.awq_check_diff == 0, "%s: the CPU search of the same statistics gives the same losses in every "
		      "group (%d differ)", name, st.awq_check_diff);
		CHECK(st.calib_text_used == st.calib_text_tokens,
		      "%s: the default calibration takes each text token once (%lld of %lld)", name,
		      (long long)st.calib_text_used, (long long)st.calib_text_tokens);
	}
	char cmd[800];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", tmp);
}

int main(void)
{
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		printf("FAIL no usable GPU: %s\n", err.msg);
		printf("gpu_awq: 0 passed, 1 failed\n");
		return 1;
	}
	printf("device: %s (sm_%d%d)\n", info.name, info.cc_major, info.cc_minor);
	if (sfw_cuda_stream_new(&stream, &err) != SFW_OK) {
		printf("FAIL stream: %s\n", err.msg);
		return 1;
	}
	/* the CPU twins run on a pool of this machine's threads (their results
	 * do not depend on the count) */
	if (sfw_ops_cpu_new(sfw_default_threads(), &cpu_ex, &err) != SFW_OK) {
		printf("FAIL threads: %s\n", err.msg);
		return 1;
	}

	twin_to_f32(100003);
	static const int mm[][3] = {{1, 1, 1},     {3, 70, 200},   {64, 64, 64},    {100, 130, 333},
				    {2, 257, 4099}, {256, 512, 4096}, {256, 256, 16384}, {17, 1000, 4104}};
	for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++)
		twin_matmul(mm[i][0], mm[i][1], mm[i][2]);
	static const int groups[] = {32, 64, 128, 0};
	for (int gi = 0; gi < 4; gi++) {
		twin_fake(48, 512, groups[gi], 0);
		twin_fake(33, 300, groups[gi], 0); /* a short last group (K % group != 0) */
		twin_fake(16, 256, groups[gi], 1);
		twin_fake(12, 384, groups[gi], 2);
		twin_duo(40, 512, groups[gi] > 0 ? groups[gi] : 512);
		twin_duo(9, 300, groups[gi] > 0 ? groups[gi] : 300);
	}
	twin_sqerr(256, 4096);
	twin_sqerr(7, 33);

	static const int r3[] = {128, 64, 64}, r1[] = {256}, r2[] = {512, 512}, rq[] = {4096},
			 rattn[] = {4096, 4096, 4096, 4096}, rdown[] = {4096};
	for (int gi = 0; gi < 4; gi++) {
		int gsz = groups[gi];
		group_search("random q|k|v 128+64+64", r3, 3, 256, 64, gsz, 0, 1);
		group_search("random, K 200 (tail), R 37", r1, 1, 200, 37, gsz, 0, 1);
		group_search("salient channels, gate|up", r2, 2, 1024, 256, gsz, 1, 1);
		group_search("salient channels, plain scales", r2, 2, 1024, 256, gsz, 1, 0);
		group_search("constant activations (all tie)", r1, 1, 256, 32, gsz, 2, 0);
	}
	group_search("full width o_proj 4096 x 4096", rq, 1, 4096, 256, 128, 1, 1);
	group_search("full width lightning q|k|v|z", rattn, 4, 4096, 256, 32, 1, 1);
	group_search("full width down_proj K 16384", rdown, 1, 16384, 256, 0, 1, 1);

	const char *golden = check_golden_dir();
	if (golden) {
		whole_run(golden, "tiny-dense", 128);
		whole_run(golden, "tiny-sparse", 32);
	}
	sfw_ops_cpu_free(cpu_ex);
	sfw_cuda_stream_free(stream);
	return CHECK_REPORT("gpu_awq");
}
