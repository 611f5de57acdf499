/* modules: tools quant runner formats kernels num fetch verify core */
/* test_quant.c - the int8 quantizer (quant/w8_ref.c), its on-disk layout
 * (num/w8_layout.h) and the quantized model writer (sfw_quant_run).
 *
 * Independent references:
 *   - tests/ref/awq_ref.py (stdlib python3) re-implements the quantizer and
 *     the I32 packing; its bytes must equal ours exactly, for every group
 *     size, with and without bf16 inputs, on matrices from a generator both
 *     sides implement (splitmix64, exact float32 values, special rows: all
 *     zeros, exact rounding ties, outliers, partial last groups, pad bytes).
 *   - mathematics: hand-derived codes for a tie row; per-element error
 *     <= 0.75 * scale (0.5 from rounding; up to 0.75 at +amax when the bf16
 *     scale rounds down by <= 2^-9 and 127.75 is clamped to 127); weight
 *     RMSE <= 1.15 x the uniform-rounding prediction sqrt(mean(scale^2)/12);
 *     dot products |W x - Q(W) x| <= sum_k |x_k| * 0.75 * scale_k
 *     (deterministic), and their relative RMS <= 1.25 x the weight relative
 *     RMSE (random x independent of the rounding errors).
 *   - the golden tiny models: the writer's output re-read byte by byte. */
#include "check.h"
#include "alloc.h"
#include "file.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "json.h"
#include "kernels/ops.h"
#include "quant/quant.h"
#include "quant/quant_int.h"
#include "runner/runner.h"
#include "tools/tools.h"
#include "verify/verify.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The AWQ statistics test asks for a 2 TiB buffer: ASan returns NULL, as
 * malloc does, instead of aborting. */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "allocator_may_return_null=1";
}
#endif

/* ---- the generator shared with tests/ref/awq_ref.py ------------------------ */
static uint64_t sm_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static float bf16_round(float f)
{
	return sfw_bf16_to_f32(sfw_f32_to_bf16(f));
}

static void gen_matrix(uint64_t seed, int rows, int cols, int bf16, float *w)
{
	uint64_t s = seed;
	for (int r = 0; r < rows; r++)
		for (int k = 0; k < cols; k++) {
			int64_t m = (int64_t)(sm_next(&s) >> 41) - (1 << 22);
			double v = (double)m * ldexp(1.0, -28);
			if (r % 7 == 6)
				v *= 64.0;
			if (k == r % cols)
				v *= 16.0;
			if (r == 0)
				v = 0.0;
			if (r == 1)
				v = k ? (((k % 21) - 10) + 0.5) * ldexp(1.0, -10) : 127.5 * ldexp(1.0, -10);
			if (r == 2) /* amax / 127.5 = 2^-15 (1 + 0.4 ulp) in every group: rounds down in bf16 */
				v = k % 3 == 0 ? 127.5 * 1.003125 * ldexp(1.0, -15) : ((k % 7) - 3) * ldexp(1.0, -17);
			float f = (float)v;
			w[(size_t)r * cols + k] = bf16 ? bf16_round(f) : f;
		}
}

static double gauss(uint64_t *s)
{
	double u1 = ((double)(sm_next(s) >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (double)(sm_next(s) >> 11) / 9007199254740992.0;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- A. layout helpers --------------------------------------------------- */
static void test_layout(void)
{
	CHECK(sfw_ql_words(10) == 3 && sfw_ql_row_bytes(10) == 12 && sfw_ql_words(4096) == 1024, "packed widths");
	CHECK(sfw_ql_ngroups(300, 128) == 3 && sfw_ql_ngroups(300, 0) == 1 && sfw_ql_ngroups(5376, 32) == 168,
	      "scale widths (cyankiwi q_proj: 5376 / 32 = 168)");
	size_t pl = 0;
	CHECK(sfw_ql_is_quantized("model.layers.12.self_attn.q_proj.weight", &pl) && pl == 32, "q_proj is quantized");
	CHECK(sfw_ql_is_quantized("model.layers.0.mlp.down_proj.weight", NULL), "down_proj is quantized");
	CHECK(sfw_ql_is_quantized("model.layers.3.self_attn.z_proj.weight", NULL) &&
		  sfw_ql_is_quantized("model.layers.3.self_attn.o_gate.weight", NULL),
	      "z_proj and o_gate are quantized");
	CHECK(!sfw_ql_is_quantized("lm_head.weight", NULL) && !sfw_ql_is_quantized("model.embed_tokens.weight", NULL) &&
		  !sfw_ql_is_quantized("model.layers.1.input_layernorm.weight", NULL) &&
		  !sfw_ql_is_quantized("model.layers.1.self_attn.o_norm.weight", NULL) &&
		  !sfw_ql_is_quantized("model.layers.x.mlp.up_proj.weight", NULL) &&
		  !sfw_ql_is_quantized("model.layers.1.mlp.up_proj.bias", NULL),
	      "embeddings, lm_head, norms and non-weights stay");
	CHECK(sfw_quant_group_parse("channel") == 0 && sfw_quant_group_parse("64") == 64 &&
		  sfw_quant_group_parse("16") == -1 && sfw_quant_group_parse("") == -1,
	      "group parsing");
	CHECK(sfw_quant_traits(32) && !strcmp(sfw_quant_traits(32)->name, "w8-g32") && sfw_quant_traits(0) &&
		  !sfw_quant_traits(16) && sfw_quant_traits(128)->bytes_per_group == 130,
	      "traits table");
}

/* ---- B. hand-derived bytes ------------------------------------------------- */
static void test_known_bytes(void)
{
	/* scale = amax/127.5 = 2^-10 exactly (bf16 0x3a80); w/scale = n + 0.5 ties */
	float w[10];
	w[0] = 127.5f / 1024.0f;
	for (int k = 1; k < 10; k++)
		w[k] = (float)(((k % 21) - 10) + 0.5) / 1024.0f;
	uint8_t c[12];
	uint16_t sc[1];
	memset(c, 0xee, sizeof(c));
	CHECK(sfw_quant_row_w8_ref(w, 10, 32, c, sc) == 0, "quantize the tie row");
	/* 127.5 -> 128 (even) -> clamp 127; -8.5 -> -8; -7.5 -> -8; -6.5 -> -6; -5.5 -> -6;
	 * -4.5 -> -4; -3.5 -> -4; -2.5 -> -2; -1.5 -> -2; -0.5 -> -0 */
	const uint8_t want[12] = {255, 120, 120, 122, 122, 124, 124, 126, 126, 128, 0, 0};
	CHECK(memcmp(c, want, 12) == 0, "tie row codes: half to even, +amax clamped to 127, pad bytes 0 "
					 "(got %d %d %d %d ... %d | %d %d)", c[0], c[1], c[2], c[3], c[9], c[10], c[11]);
	CHECK(sc[0] == 0x3a80, "scale bf16 0x3a80 (got 0x%04x)", sc[0]);
	/* -amax maps to -127.5 -> -128 (even) -> byte 0; zero -> 128 */
	float v[4] = {-1.0f, 1.0f, 0.0f, 0.5f};
	CHECK(sfw_quant_row_w8_ref(v, 4, 0, c, sc) == 0, "channel row");
	float s = sfw_bf16_to_f32(sc[0]);
	CHECK(sc[0] == sfw_f32_to_bf16(1.0f / 127.5f), "channel scale = bf16(amax / 127.5)");
	CHECK(c[0] == (uint8_t)(128 + (int)rintf(-1.0f / s)) && c[0] <= 1 && c[2] == 128 && c[1] == 255,
	      "-amax -> %d, 0 -> 128, +amax -> 255", c[0]);
	/* a float32 (AWQ-folded) amax whose scale bf16 rounds down: amax/127.5 =
	 * 2^-7 (1 + 0.4 ulp) -> 0x3c00 = 2^-7, which puts +amax at 127.9 steps,
	 * clamped to 127 (0.9 of a step off); the law bumps the scale one ulp to
	 * 0x3c01, where +amax is 126.9 steps */
	float am = (float)(127.5 * 1.003125 / 128.0), bv[4] = {-am, am, 0.0f, 0.5f}, dq[4];
	CHECK(sfw_f32_to_bf16(am / 127.5f) == 0x3c00 && am / sfw_bf16_to_f32(0x3c00) > 127.5f,
	      "the bad case: bf16(amax / 127.5) puts amax past 127.5 steps");
	CHECK(sfw_quant_row_w8_ref(bv, 4, 0, c, sc) == 0 && sc[0] == 0x3c01,
	      "its scale is bumped one bf16 ulp: 0x3c01 (got 0x%04x)", sc[0]);
	sfw_quant_dequant_row_w8(c, sc, 4, 0, dq);
	s = sfw_bf16_to_f32(sc[0]);
	CHECK(c[1] == 255 && c[0] == 1 && fabsf(dq[1] - am) <= 0.5f * s && fabsf(dq[0] + am) <= 0.5f * s,
	      "+-amax come back within half a step (codes %d %d, %.6f vs %.6f, step %.6f)", c[0], c[1], dq[1], am, s);
	/* the packed word view: element k in bits 8*(k%4) of word k/4 */
	uint32_t word;
	memcpy(&word, c, 4);
	CHECK((word & 0xff) == c[0] && ((word >> 8) & 0xff) == c[1] && ((word >> 24) & 0xff) == c[3],
	      "little-endian word packing");
	/* zeros: scale clamps at float32 eps (bf16 0x3400), codes 128 */
	float z[5] = {0};
	CHECK(sfw_quant_row_w8_ref(z, 5, 32, c, sc) == 0 && sc[0] == 0x3400 && c[0] == 128 && c[4] == 128 &&
		  c[5] == 0 && c[7] == 0,
	      "zero group: eps scale, code 128, zero padding");
	float bad[3] = {1.0f, NAN, 0.0f};
	CHECK(sfw_quant_row_w8_ref(bad, 3, 32, c, sc) == -1, "NaN refused");
	bad[1] = INFINITY;
	CHECK(sfw_quant_row_w8_ref(bad, 3, 32, c, sc) == -1, "infinity refused");
}

/* ---- C. bit-exact against the python reference ----------------------------- */
static int hexval(int ch)
{
	return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static void test_python(uint64_t seed, int rows, int cols, int group, int bf16)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "python3 tests/ref/awq_ref.py %llu %d %d %d %s", (unsigned long long)seed, rows,
		 cols, group, bf16 ? "bf16" : "");
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL, "run %s", cmd);
	if (!f)
		return;
	float *w = malloc((size_t)rows * cols * sizeof(float));
	int64_t rb = sfw_ql_row_bytes(cols), G = sfw_ql_ngroups(cols, group);
	uint8_t *codes = malloc((size_t)rb);
	uint16_t *sc = malloc((size_t)G * 2);
	size_t cap = (size_t)(rb + G * 2) * 2 + 16;
	char *line = malloc(cap);
	gen_matrix(seed, rows, cols, bf16, w);
	int rows_ok = 0, nlines = 0;
	for (int r = 0; r < rows && fgets(line, (int)cap, f); r++) {
		nlines++;
		if (sfw_quant_row_w8_ref(w + (size_t)r * cols, cols, group, codes, sc) != 0)
			continue;
		int ok = 1;
		const char *p = line;
		for (int64_t i = 0; i < rb && ok; i++, p += 2)
			ok = hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && (hexval(p[0]) << 4 | hexval(p[1])) == codes[i];
		ok = ok && *p++ == ' ';
		for (int64_t g = 0; g < G && ok; g++, p += 4) {
			int h = 0;
			for (int d = 0; d < 4; d++)
				h = h << 4 | (hexval(p[d]) & 15);
			ok = h == sc[g];
		}
		if (ok)
			rows_ok++;
		else if (rows_ok == r)
			printf("first mismatching row %d (seed %llu, group %d)\n", r, (unsigned long long)seed, group);
	}
	int rc = pclose(f);
	CHECK(rc == 0 && nlines == rows, "python reference ran (%s): %d lines", cmd, nlines);
	CHECK(rows_ok == rows, "bit-exact vs awq_ref.py: %d/%d rows, %dx%d group %d%s", rows_ok, rows, rows, cols,
	      group, bf16 ? " bf16" : "");
	free(w), free(codes), free(sc), free(line);
}

/* The fake quantizer (its vector path for groups of whole 8-float vectors,
 * the scalar one for the rest) against the reference quantizer followed by
 * the dequantizer, bit for bit: widths that are and are not multiples of 8
 * and of the group, every group size, and rows made to hit the edges (exact
 * half steps, zeros and negative zeros, subnormals, the amax = 1 scale bump,
 * a weight at the clamp), and NaN / infinity refused by both. */
static void test_fake_rows(void)
{
	static const int Ks[] = {8, 16, 40, 100, 129, 256, 4096, 16384};
	static const int gs[] = {32, 64, 128, 0};
	uint64_t st = 99;
	int rows = 0, same = 0, refused = 0;
	for (size_t ki = 0; ki < sizeof(Ks) / sizeof(Ks[0]); ki++)
		for (size_t gi = 0; gi < 4; gi++)
			for (int kind = 0; kind < 7; kind++) {
				int K = Ks[ki], g = gs[gi];
				float *w = malloc((size_t)K * 4), *fk = malloc((size_t)K * 4), *dq = malloc((size_t)K * 4);
				uint8_t *c = malloc((size_t)sfw_ql_row_bytes(K));
				uint16_t *sc = malloc((size_t)sfw_ql_ngroups(K, g) * 2);
				for (int k = 0; k < K; k++) {
					double v = 0.02 * gauss(&st);
					if (kind == 1) /* multiples of half a step of a 1/127.5 scale: ties */
						v = (double)((int)(gauss(&st) * 60) + 0.5) / 127.5;
					else if (kind == 2) /* zeros of both signs among values */
						v = k % 3 == 0 ? 0.0 : k % 3 == 1 ? -0.0 : v;
					else if (kind == 3) /* subnormal and tiny */
						v = gauss(&st) * 1e-39;
					else if (kind == 4) /* amax 1 in every group: the bf16 scale bump */
						v = k % 8 == 0 ? (k % 16 ? -1.0 : 1.0) : gauss(&st) * 0.3;
					else if (kind == 5) /* one weight far above the rest: codes at both ends */
						v = k % 13 == 0 ? 3.0 * (k % 2 ? -1 : 1) : v;
					w[k] = (float)v;
				}
				if (kind == 6) /* a bad value: both refuse */
					w[K / 2] = K % 2 ? NAN : -INFINITY;
				memcpy(fk, w, (size_t)K * 4);
				int rr = sfw_quant_row_w8_ref(w, K, g, c, sc), rf = sfw_quant_fake_row_w8(fk, K, g);
				rows++;
				if (kind == 6) {
					refused += rr == -1 && rf == -1;
				} else if (rr == 0 && rf == 0) {
					sfw_quant_dequant_row_w8(c, sc, K, g, dq);
					same += memcmp(fk, dq, (size_t)K * 4) == 0;
				}
				free(w), free(fk), free(dq), free(c), free(sc);
			}
	int bad_rows = rows / 7;
	CHECK(same == rows - bad_rows, "fake quantizer == dequant(reference) bit for bit: %d/%d rows", same,
	      rows - bad_rows);
	CHECK(refused == bad_rows, "NaN / infinity refused by both: %d/%d rows", refused, bad_rows);
}

/* ---- D/E/F. error bounds --------------------------------------------------- */
static void test_errors(int group)
{
	const int N = 96, K = 4096;
	uint64_t s = 1234 + (uint64_t)group;
	float *w = malloc((size_t)N * K * 4), *dq = malloc((size_t)N * K * 4), *x = malloc((size_t)K * 4);
	float *fk = malloc((size_t)K * 4);
	uint8_t *c = malloc((size_t)sfw_ql_row_bytes(K));
	uint16_t *sc = malloc((size_t)sfw_ql_ngroups(K, group) * 2);
	int64_t span = sfw_ql_group_span(K, group);
	double se = 0, sw = 0, pred = 0, worst = 0, dy2 = 0, y2 = 0;
	int bound_ok = 1, dot_ok = 1, fake_ok = 1;
	for (int k = 0; k < K; k++)
		x[k] = (float)gauss(&s);
	for (int r = 0; r < N; r++) {
		float *wr = w + (size_t)r * K, *dr = dq + (size_t)r * K;
		for (int k = 0; k < K; k++)
			wr[k] = bf16_round((float)(0.02 * gauss(&s) * (r % 5 == 0 && k % 97 == 0 ? 8.0 : 1.0)));
		if (sfw_quant_row_w8_ref(wr, K, group, c, sc) != 0) {
			bound_ok = 0;
			continue;
		}
		sfw_quant_dequant_row_w8(c, sc, K, group, dr);
		memcpy(fk, wr, (size_t)K * 4);
		fake_ok &= sfw_quant_fake_row_w8(fk, K, group) == 0 && memcmp(fk, dr, (size_t)K * 4) == 0;
		double y = 0, yq = 0, lim = 0;
		for (int k = 0; k < K; k++) {
			double sd = sfw_bf16_to_f32(sc[k / span]), e = fabs((double)wr[k] - dr[k]);
			if (e > 0.5 * sd * (1 + 1e-6))
				bound_ok = 0;
			worst = e / sd > worst ? e / sd : worst;
			se += e * e, sw += (double)wr[k] * wr[k], pred += sd * sd / 12.0;
			y += (double)x[k] * wr[k], yq += (double)x[k] * dr[k], lim += fabs(x[k]) * 0.5 * sd;
		}
		if (fabs(y - yq) > lim * (1 + 1e-6))
			dot_ok = 0;
		dy2 += (y - yq) * (y - yq), y2 += y * y;
	}
	double rel = sqrt(se / sw), rel_pred = sqrt(pred / sw), drel = sqrt(dy2 / y2);
	CHECK(bound_ok, "group %d: every |w - deq| <= 0.5 scale: no weight clamped by more than half a step (worst "
		  "%.3f scale)", group, worst);
	CHECK(rel <= 1.15 * rel_pred, "group %d: weight relative RMSE %.3e <= 1.15 x uniform prediction %.3e", group,
	      rel, rel_pred);
	CHECK(dot_ok, "group %d: |Wx - Q(W)x| within sum |x| * 0.5 scale for every row", group);
	CHECK(drel <= 1.25 * rel, "group %d: dot-product relative RMS error %.3e <= 1.25 x %.3e", group, drel, rel);
	CHECK(fake_ok, "group %d: fake quantizer == dequant(quant) bit for bit", group);
	printf("group %-7s: weight rel RMSE %.3e (uniform prediction %.3e), dot rel RMS %.3e, worst %.3f scale\n",
	       group ? (group == 32 ? "32" : group == 64 ? "64" : "128") : "channel", rel, rel_pred, drel, worst);
	free(w), free(dq), free(x), free(fk), free(c), free(sc);
}

/* ---- J. the W8A16 CPU op against a double-precision reference ---------------- */
/* |error| < 1e-5 of sum |x w| over the row: the fp32 sums of 300 terms in
 * two 8-lane chains (<= 19 additions deep, then 4 for the lanes and 4 for
 * the tail) stay below 30 ulp = 1.8e-6 of that sum; 1e-5 leaves margin. */
static void test_matmul_w8(void)
{
	static const int Ms[] = {1, 2, 4, 5, 17, 64}, groups[] = {32, 128, 0};
	const int N = 37, K = 300, MM = 64;
	uint64_t s = 99;
	int64_t rb = sfw_ql_row_bytes(K);
	uint8_t *codes = malloc((size_t)N * rb);
	float *x = malloc((size_t)MM * K * 4), *y = malloc((size_t)MM * N * 4), *sf = malloc((size_t)N * 10 * 4);
	uint16_t *sb = malloc((size_t)N * 10 * 2);
	for (size_t i = 0; i < (size_t)N * rb; i++)
		codes[i] = (uint8_t)(sm_next(&s) >> 56);
	for (int i = 0; i < MM * K; i++)
		x[i] = (float)gauss(&s);
	for (int gi = 0; gi < 3; gi++)
		for (int sdt = 0; sdt < 2; sdt++)
			for (int mi = 0; mi < (int)(sizeof(Ms) / sizeof(Ms[0])); mi++) {
				int g = groups[gi], M = Ms[mi], span = (int)sfw_ql_group_span(K, g);
				int64_t G = sfw_ql_ngroups(K, g);
				for (int64_t i = 0; i < N * G; i++) {
					sb[i] = sfw_f32_to_bf16((float)(0.001 * (1 + (sm_next(&s) >> 60))));
					sf[i] = sfw_bf16_to_f32(sb[i]);
				}
				struct sfw_w8 w8 = {codes, sdt ? (const void *)sf : (const void *)sb,
						    sdt ? SFW_DTYPE_F32 : SFW_DTYPE_BF16, span};
				struct sfw_gemm_shape gs = {M, N, K, 0, 0};
				sfw_op_matmul_w8_cpu(NULL, y, x, &w8, &gs);
				double worst = 0;
				for (int m = 0; m < M; m++)
					for (int n = 0; n < N; n++) {
						double ref = 0, mag = 0;
						for (int k = 0; k < K; k++) {
							double w = (double)((int)codes[(size_t)n * rb + k] - 128) * sf[n * G + k / span];
							ref += x[m * K + k] * w, mag += fabs(x[m * K + k] * w);
						}
						double e = fabs(y[m * N + n] - ref) / (mag + 1e-30);
						worst = e > worst ? e : worst;
					}
				CHECK(worst < 1e-5, "matmul_w8 M=%d group %d %s scales: worst error %.1e of sum |x w|", M, g,
				      sdt ? "f32" : "bf16", worst);
			}
	free(codes), free(x), free(y), free(sf), free(sb);
}

/* ---- J1. one row, the same bits in every call (batch invariance) ------------- */
/* Row r of x computed alone (M = 1) and inside calls of M = 2, 4, 5, 17, 64
 * rows starting at different offsets (so it sits at even and odd places of
 * the register blocks), on executors of 1, 2 and 3 threads, on the AVX2 and
 * the generic path: every output bit for bit. Shapes: K with a tail of 4,
 * groups 32 and 128 (the streaming schedule for M <= 4), per channel, and a
 * group of 24 (not a multiple of 16: the tile schedule for every M);
 * scales bf16, f16 (one case) and f32. */
static void test_matmul_w8_rows(void)
{
	static const int Ms[] = {1, 2, 4, 5, 17, 64}, offs[] = {0, 3, 8};
	static const struct {
		int K, group, sdt;
	} cases[] = {{300, 32, SFW_DTYPE_BF16}, {300, 128, SFW_DTYPE_F32}, {300, 0, SFW_DTYPE_BF16}, {256, 0, SFW_DTYPE_F16},
		     {1000, 128, SFW_DTYPE_BF16}, {300, 24, SFW_DTYPE_BF16}};
	const int N = 101, R = 72; /* 7 tiles of 16 rows, the last of 5 */
	uint64_t s = 4242;
	struct sfw_ops_cpu *ex[3] = {NULL, NULL, NULL};
	struct sfw_err err = {0};
	for (int t = 0; t < 3; t++)
		CHECK(sfw_ops_cpu_new(t + 1, &ex[t], &err) == SFW_OK, "an executor of %d threads: %s", t + 1, err.msg);
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		int K = cases[ci].K, g = cases[ci].group, span = (int)sfw_ql_group_span(K, g);
		enum sfw_dtype sdt = (enum sfw_dtype)cases[ci].sdt;
		int64_t rb = sfw_ql_row_bytes(K), G = g ? (K + g - 1) / g : 1;
		uint8_t *codes = malloc((size_t)N * rb);
		float *x = malloc((size_t)R * K * 4), *one = malloc((size_t)R * N * 4), *gen = malloc((size_t)R * N * 4),
		      *y = malloc((size_t)64 * N * 4), *sf = malloc((size_t)N * G * 4);
		uint16_t *sh = malloc((size_t)N * G * 2);
		for (size_t i = 0; i < (size_t)N * rb; i++)
			codes[i] = (uint8_t)(sm_next(&s) >> 56);
		for (int i = 0; i < R * K; i++)
			x[i] = (float)gauss(&s);
		for (int64_t i = 0; i < N * G; i++) {
			uint64_t u = sm_next(&s);
			if (sdt == SFW_DTYPE_F16) { /* f16 exponent 5 (about 1e-3), a random mantissa: exact in float */
				sh[i] = (uint16_t)(5 << 10 | (u >> 54));
				sf[i] = ldexpf(1.0f + (float)(sh[i] & 0x3ff) / 1024.0f, 5 - 15);
			} else {
				sh[i] = sfw_f32_to_bf16((float)(0.001 * (1 + (u >> 60))));
				sf[i] = sfw_bf16_to_f32(sh[i]);
			}
		}
		const void *sc = sdt == SFW_DTYPE_F32 ? (const void *)sf : (const void *)sh;
		struct sfw_w8 w8 = {codes, sc, sdt, span};
		struct sfw_gemm_shape row = {1, N, K, 0, 0};
		/* every row alone, one thread: the reference bits; then the generic path */
		for (int r = 0; r < R; r++)
			sfw_op_matmul_w8_cpu(NULL, one + (size_t)r * N, x + (size_t)r * K, &w8, &row);
		sfwi_op_matmul_w8_generic(ex[0], 1);
		for (int r = 0; r < R; r++)
			sfw_op_matmul_w8_cpu(ex[0], gen + (size_t)r * N, x + (size_t)r * K, &w8, &row);
		sfwi_op_matmul_w8_generic(ex[0], 0);
		CHECK(!memcmp(one, gen, (size_t)R * N * 4), "w8 K=%d group %d: the generic path gives the AVX2 path's bits",
		      K, g);
		int calls = 0, bad = 0;
		for (int path = 0; path < 2; path++) {
			for (int t = 0; t < 3; t++) {
				sfwi_op_matmul_w8_generic(ex[t], path);
				for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++)
					for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
						int M = Ms[mi], off = offs[oi];
						if (off + M > R)
							continue;
						struct sfw_gemm_shape gs = {M, N, K, 0, 0};
						sfw_op_matmul_w8_cpu(ex[t], y, x + (size_t)off * K, &w8, &gs);
						calls++;
						bad += memcmp(y, one + (size_t)off * N, (size_t)M * N * 4) != 0;
					}
				sfwi_op_matmul_w8_generic(ex[t], 0);
			}
		}
		CHECK(bad == 0, "w8 K=%d group %d: every row bit-identical to the row alone in %d calls (M = 1..64, 1-3 "
		      "threads, both paths): %d differ", K, g, calls, bad);
		/* and the bits are right: the double-precision reference, the bound of J */
		double worst = 0;
		for (int r = 0; r < R; r += 7)
			for (int n = 0; n < N; n++) {
				double ref = 0, mag = 0;
				for (int k = 0; k < K; k++) {
					double w = (double)((int)codes[(size_t)n * rb + k] - 128) * sf[n * G + k / span];
					ref += (double)x[(size_t)r * K + k] * w, mag += fabs(x[(size_t)r * K + k] * w);
				}
				double e = fabs(one[(size_t)r * N + n] - ref) / (mag + 1e-30);
				worst = e > worst ? e : worst;
			}
		CHECK(worst < 1e-5, "w8 K=%d group %d: worst error %.1e of sum |x w|", K, g, worst);
		free(codes), free(x), free(one), free(gen), free(y), free(sf), free(sh);
	}
	for (int t = 0; t < 3; t++)
		sfw_ops_cpu_free(ex[t]);
}

/* ---- J2. the SwiGLU twin (sfw_op_matmul_silu_w8_cpu) against double precision ---- */
static void test_matmul_silu_w8(void)
{
	const int I = 19, K = 300, N = 2 * I, span = 32;
	uint64_t s = 7;
	int64_t rb = sfw_ql_row_bytes(K), G = sfw_ql_ngroups(K, span);
	uint8_t *codes = malloc((size_t)N * rb);
	float *x = malloc((size_t)K * 4), *y = malloc((size_t)I * 4);
	uint16_t *sb = malloc((size_t)N * G * 2);
	for (size_t i = 0; i < (size_t)N * rb; i++)
		codes[i] = (uint8_t)(sm_next(&s) >> 56);
	for (int k = 0; k < K; k++)
		x[k] = (float)gauss(&s) * 0.3f;
	for (int64_t i = 0; i < N * G; i++)
		sb[i] = sfw_f32_to_bf16((float)(0.001 * (1 + (sm_next(&s) >> 60))));
	struct sfw_w8 w8 = {codes, sb, SFW_DTYPE_BF16, span};
	sfw_op_matmul_silu_w8_cpu(NULL, y, x, &w8, I, K);
	double worst = 0;
	for (int i = 0; i < I; i++) {
		double h[2], mag[2] = {0, 0};
		for (int r = 0; r < 2; r++) {
			int n = i + r * I;
			h[r] = 0;
			for (int k = 0; k < K; k++) {
				double w = (double)((int)codes[(size_t)n * rb + k] - 128) * sfw_bf16_to_f32(sb[n * G + k / span]);
				h[r] += x[k] * w, mag[r] += fabs(x[k] * w);
			}
		}
		double ref = h[0] / (1 + exp(-h[0])) * h[1];
		/* |d silu/dg| <= 1.1: a bound from the two dot products' errors */
		double e = fabs(y[i] - ref) / (1.1 * mag[0] * fabs(h[1]) + fabs(h[0]) * mag[1] + 1e-30);
		worst = e > worst ? e : worst;
	}
	CHECK(worst < 1e-5, "matmul_silu_w8 (merged gate|up [%d, %d], group %d): worst error %.1e", N, K, span, worst);
	free(codes), free(x), free(y), free(sb);
}

/* ---- G. the writer on a golden model --------------------------------------- */
static char tmpdir[256];
#define LOGIT_BOUND 1.5e-2

static void rm_rf(const char *d)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	if (system(cmd) != 0)
		printf("warning: could not remove %s\n", d);
}

static void test_writer(const char *golden, int group)
{
	char in[512], out[600];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	snprintf(out, sizeof(out), "%s/q%d", tmpdir, group);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	p.method = SFW_QUANT_RTN;
	p.group_size = group;
	p.stats = &st;
	p.threads = 2;
	p.shard_bytes = 1500000; /* several shards on a 7 MB model */
	struct sfw_err err = {0};
	enum sfw_status s = sfw_quant_run(in, out, &p, &err);
	CHECK(s == SFW_OK, "quantize tiny-dense group %d: %s", group, err.msg);
	if (s != SFW_OK)
		return;
	CHECK(st.n_quantized == 4 * 7 + 2 * 1 + 2 * 1 && st.n_shards >= 2,
	      "32 linears (4 layers x q,k,v,o,gate,up,down + o_gate x2 + z x2), %d shards", st.n_shards);
	struct sfw_st_set *qs = NULL, *is = NULL;
	CHECK(sfw_st_set_open(out, &qs, &err) == SFW_OK, "output opens as a sharded set: %s", err.msg);
	CHECK(sfw_st_set_open(in, &is, &err) == SFW_OK, "input opens");
	if (!qs || !is) {
		sfw_st_set_close(qs), sfw_st_set_close(is);
		return;
	}
	int lin = 0, lin_ok = 0, copies = 0, copies_ok = 0;
	for (size_t i = 0; i < sfw_st_set_count(is); i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(is, i);
		size_t plen;
		if (!sfw_ql_is_quantized(t->name, &plen)) {
			const struct sfw_tensor_info *o = sfw_st_set_find(qs, t->name);
			copies++;
			copies_ok += o && o->dtype == t->dtype && o->nbytes == t->nbytes && !memcmp(o->data, t->data, t->nbytes);
			continue;
		}
		lin++;
		char nm[256];
		int64_t N = (int64_t)t->shape[0], K = (int64_t)t->shape[1];
		snprintf(nm, sizeof(nm), "%.*s.weight_packed", (int)plen, t->name);
		const struct sfw_tensor_info *pk = sfw_st_set_find(qs, nm);
		snprintf(nm, sizeof(nm), "%.*s.weight_scale", (int)plen, t->name);
		const struct sfw_tensor_info *sc = sfw_st_set_find(qs, nm);
		snprintf(nm, sizeof(nm), "%.*s.weight_shape", (int)plen, t->name);
		const struct sfw_tensor_info *sh = sfw_st_set_find(qs, nm);
		int ok = pk && sc && sh && !sfw_st_set_find(qs, t->name) && pk->dtype == SFW_DTYPE_I32 && pk->ndim == 2 &&
			 (int64_t)pk->shape[0] == N && (int64_t)pk->shape[1] == sfw_ql_words(K) &&
			 sc->dtype == SFW_DTYPE_BF16 && sc->ndim == 2 && (int64_t)sc->shape[1] == sfw_ql_ngroups(K, group) &&
			 sh->dtype == SFW_DTYPE_I64 && sh->nelem == 2 && ((const int64_t *)sh->data)[0] == N &&
			 ((const int64_t *)sh->data)[1] == K;
		float *row = malloc((size_t)K * 4);
		uint8_t *c = malloc((size_t)sfw_ql_row_bytes(K));
		uint16_t *g = malloc((size_t)sfw_ql_ngroups(K, group) * 2);
		for (int64_t r = 0; ok && r < N; r++) {
			for (int64_t k = 0; k < K; k++)
				row[k] = sfw_bf16_to_f32(((const uint16_t *)t->data)[r * K + k]);
			ok = sfw_quant_row_w8_ref(row, K, group, c, g) == 0 &&
			     !memcmp((const uint8_t *)pk->data + r * sfw_ql_row_bytes(K), c, (size_t)sfw_ql_row_bytes(K)) &&
			     !memcmp((const uint16_t *)sc->data + r * sfw_ql_ngroups(K, group), g,
				     (size_t)sfw_ql_ngroups(K, group) * 2);
		}
		free(row), free(c), free(g);
		lin_ok += ok;
	}
	CHECK(lin == 32 && lin_ok == lin, "group %d: %d/%d linears: I32 [N, K/4] codes, bf16 [N, G] scales, I64 "
					  "shape, bytes = reference quantizer of the source rows", group, lin_ok, lin);
	CHECK(copies > 0 && copies_ok == copies, "group %d: %d/%d other tensors copied byte for byte", group,
	      copies_ok, copies);
	/* config.json and shard metadata */
	char path[700];
	snprintf(path, sizeof(path), "%s/config.json", out);
	struct sfw_buf b;
	sfw_buf_init(&b, 1 << 20);
	cJSON *root = NULL;
	int cfg_ok = sfw_read_file(path, 1 << 20, &b, &err) == SFW_OK &&
		     sfw_json_parse(b.data, b.len, path, &root, &err) == SFW_OK;
	const cJSON *q = cfg_ok ? cJSON_GetObjectItemCaseSensitive(root, "quantization_config") : NULL;
	const cJSON *w = q ? cJSON_GetObjectItemCaseSensitive(
				 cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(q, "config_groups"), "group_0"),
				 "weights")
			   : NULL;
	const cJSON *gs = w ? cJSON_GetObjectItemCaseSensitive(w, "group_size") : NULL;
	const cJSON *ig = q ? cJSON_GetObjectItemCaseSensitive(q, "ignore") : NULL;
	CHECK(q && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q, "quant_method")), "compressed-tensors") &&
		  !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q, "format")), "pack-quantized") &&
		  w && cJSON_GetObjectItemCaseSensitive(w, "num_bits")->valuedouble == 8 &&
		  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "symmetric")) &&
		  !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(w, "strategy")), group ? "group" : "channel") &&
		  (group ? cJSON_IsNumber(gs) && gs->valuedouble == group : cJSON_IsNull(gs)) &&
		  cJSON_GetArraySize(ig) == 1 && !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(ig, 0)), "lm_head") &&
		  cJSON_GetObjectItemCaseSensitive(root, "mixer_types"),
	      "group %d: config.json keeps the model config and adds quantization_config", group);
	cJSON_Delete(root);
	sfw_buf_release(&b);
	snprintf(path, sizeof(path), "%s/model-00001-of-%05d.safetensors", out, st.n_shards);
	struct sfw_st_file *f = NULL;
	CHECK(sfw_st_open(path, &f, &err) == SFW_OK && !strcmp(sfw_st_metadata(f, "salafw.format"), "awq-w8") &&
		  !strcmp(sfw_st_metadata(f, "salafw.version"), SFW_QL_VERSION) &&
		  !strcmp(sfw_st_metadata(f, "quant.group_size"), group ? (group == 32 ? "32" : group == 64 ? "64" : "128") : "channel") &&
		  !strcmp(sfw_st_metadata(f, "format"), "pt"),
	      "group %d: shard __metadata__ salafw.format, version, group size, format pt", group);
	sfw_st_close(f);
	sfw_st_set_close(qs);
	sfw_st_set_close(is);
}


/* ---- K. replacing an output directory; hostile inputs ------------------------ */
static int path_exists(const char *dir, const char *name)
{
	char path[900];
	struct stat st;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return stat(path, &st) == 0;
}

static cJSON *load_json(const char *dir, const char *name)
{
	char path[900];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	struct sfw_buf b;
	struct sfw_err err;
	cJSON *root = NULL;
	sfw_buf_init(&b, 1 << 20);
	if (sfw_read_file(path, 1 << 20, &b, &err) != SFW_OK || sfw_json_parse(b.data, b.len, path, &root, &err) != SFW_OK)
		root = NULL;
	sfw_buf_release(&b);
	return root;
}

/* Replaces (or adds) config.json's key; val is taken. */
static int set_config(const char *dir, const char *key, cJSON *val)
{
	cJSON *root = load_json(dir, "config.json");
	int ok = root != NULL;
	if (ok) {
		cJSON_DeleteItemFromObjectCaseSensitive(root, key);
		cJSON_AddItemToObject(root, key, val);
		char *text = cJSON_Print(root), path[900];
		snprintf(path, sizeof(path), "%s/config.json", dir);
		struct sfw_err err;
		ok = text && sfw_write_file_atomic(path, text, strlen(text), &err) == SFW_OK;
		cJSON_free(text);
	} else {
		cJSON_Delete(val);
	}
	cJSON_Delete(root);
	return ok;
}

/* Shard files in dir (model.safetensors, model-*-of-*.safetensors); *listed:
 * how many of them the index names. */
static int count_shards(const char *dir, int *listed)
{
	cJSON *idx = load_json(dir, "model.safetensors.index.json");
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), *e;
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;
	*listed = 0;
	while (d && (de = readdir(d))) {
		if (strcmp(de->d_name, "model.safetensors") != 0 &&
		    (strncmp(de->d_name, "model-", 6) != 0 || !strstr(de->d_name, "-of-") ||
		     strcmp(de->d_name + strlen(de->d_name) - 12, ".safetensors") != 0))
			continue;
		n++;
		int hit = 0;
		cJSON_ArrayForEach(e, wm) hit |= cJSON_IsString(e) && !strcmp(e->valuestring, de->d_name);
		*listed += hit;
	}
	if (d)
		closedir(d);
	cJSON_Delete(idx);
	return n;
}

/* The shard the index puts tensor name in ("" if none). */
static void shard_of(const char *dir, const char *name, char *out, size_t cap)
{
	cJSON *idx = load_json(dir, "model.safetensors.index.json");
	const char *v = cJSON_GetStringValue(
		cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), name));
	snprintf(out, cap, "%s", v ? v : "");
	cJSON_Delete(idx);
}

static int copy_dir(const char *src, const char *dst)
{
	char cmd[2000];
	snprintf(cmd, sizeof(cmd), "cp -rL '%s' '%s' && chmod -R u+w '%s'", src, dst, dst);
	return system(cmd) == 0;
}

/* Element i of bf16 tensor name, in place in the file (a copy). */
static int poke_bf16(const char *path, const char *name, uint64_t i, uint16_t v)
{
	struct sfw_map m;
	struct sfw_st_file *f = NULL;
	struct sfw_err err;
	long long off = -1;
	if (sfw_map_open(&m, path, &err) != SFW_OK)
		return 0;
	if (sfw_st_parse(m.data, m.size, path, &f, &err) == SFW_OK) {
		const struct sfw_tensor_info *t = sfw_st_find(f, name);
		if (t && t->dtype == SFW_DTYPE_BF16 && i < t->nelem)
			off = (long long)((const unsigned char *)t->data - m.data) + 2 * (long long)i;
	}
	sfw_st_close(f);
	sfw_map_close(&m);
	int fd = off >= 0 ? open(path, O_WRONLY) : -1;
	int ok = fd >= 0 && sfw_pwrite_all(fd, &v, 2, (uint64_t)off) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* dst: tiny-dense with its vocab cut to V (the first V rows of embed_tokens
 * and lm_head). */
static int cut_vocab(const char *src, const char *dst, int V)
{
	char path[900];
	struct sfw_err err = {0};
	struct sfw_st_set *in = NULL;
	struct sfw_st_writer *w = NULL;
	if (mkdir(dst, 0755) != 0 || sfw_st_set_open(src, &in, &err) != SFW_OK)
		return 0;
	snprintf(path, sizeof(path), "%s/model.safetensors", dst);
	enum sfw_status s = sfw_st_writer_new(path, &w, &err);
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; s == SFW_OK && i < sfw_st_set_count(in); i++) {
			const struct sfw_tensor_info *t = sfw_st_set_at(in, i);
			uint64_t sh[SFW_ST_MAX_DIMS], nb = t->nbytes;
			memcpy(sh, t->shape, sizeof(sh));
			if (strstr(t->name, "embed_tokens") || !strcmp(t->name, "lm_head.weight")) {
				sh[0] = (uint64_t)V;
				nb = t->nbytes / t->shape[0] * (uint64_t)V;
			}
			s = pass ? sfw_st_writer_write(w, t->data, nb, &err)
				 : sfw_st_writer_declare(w, t->name, t->dtype, t->ndim, sh, &err);
		}
	if (s == SFW_OK)
		s = sfw_st_writer_commit(w, &err);
	sfw_st_writer_free(w);
	sfw_st_set_close(in);
	snprintf(path, sizeof(path), "cp '%s/config.json' '%s/' && chmod u+w '%s/config.json'", src, dst, dst);
	return s == SFW_OK && system(path) == 0 && set_config(dst, "vocab_size", cJSON_CreateNumber(V));
}

/* A checkpoint that also ships model.embed_tokens as int8 (weight_packed,
 * weight_scale, weight_shape; index updated): the engine reads embeddings as
 * bf16/f32 rows, so it must refuse the model, never read the codes as floats
 * (4x past the end of the table). */
static void test_int8_embedding(const char *golden)
{
	char in[512], out[600], shard[64], path[800], tmp[820];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	snprintf(out, sizeof(out), "%s/q-embed", tmpdir);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_err err = {0};
	p.method = SFW_QUANT_RTN, p.group_size = 32;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "quantize tiny-dense: %s", err.msg);
	shard_of(out, "model.embed_tokens.weight", shard, sizeof(shard));
	snprintf(path, sizeof(path), "%s/%s", out, shard);
	snprintf(tmp, sizeof(tmp), "%s.new", path);
	struct sfw_st_file *f = NULL;
	struct sfw_st_writer *w = NULL;
	enum sfw_status s = shard[0] ? sfw_st_open(path, &f, &err) : SFW_E_MISSING;
	if (s == SFW_OK)
		s = sfw_st_writer_new(tmp, &w, &err);
	const struct sfw_tensor_info *E = f ? sfw_st_find(f, "model.embed_tokens.weight") : NULL;
	uint64_t V = E ? E->shape[0] : 0, D = E ? E->shape[1] : 0;
	int64_t wshape[2] = {(int64_t)V, (int64_t)D};
	for (int pass = 0; s == SFW_OK && E && pass < 2; pass++) {
		for (size_t i = 0; s == SFW_OK && i < sfw_st_count(f); i++) {
			const struct sfw_tensor_info *t = sfw_st_at(f, i);
			if (t == E)
				continue;
			uint64_t sh[SFW_ST_MAX_DIMS];
			memcpy(sh, t->shape, sizeof(sh));
			s = pass ? sfw_st_writer_write(w, t->data, t->nbytes, &err)
				 : sfw_st_writer_declare(w, t->name, t->dtype, t->ndim, sh, &err);
		}
		uint64_t ps[2] = {V, D / 4}, ss[2] = {V, D / 32}, ws[1] = {2};
		if (s == SFW_OK)
			s = pass ? sfw_st_writer_write(w, E->data, V * D, &err)
				 : sfw_st_writer_declare(w, "model.embed_tokens.weight_packed", SFW_DTYPE_I32, 2, ps, &err);
		if (s == SFW_OK)
			s = pass ? sfw_st_writer_write(w, E->data, V * (D / 32) * 2, &err)
				 : sfw_st_writer_declare(w, "model.embed_tokens.weight_scale", SFW_DTYPE_BF16, 2, ss, &err);
		if (s == SFW_OK)
			s = pass ? sfw_st_writer_write(w, wshape, sizeof(wshape), &err)
				 : sfw_st_writer_declare(w, "model.embed_tokens.weight_shape", SFW_DTYPE_I64, 1, ws, &err);
	}
	if (s == SFW_OK && E)
		s = sfw_st_writer_commit(w, &err);
	sfw_st_writer_free(w);
	sfw_st_close(f);
	int made = s == SFW_OK && E && rename(tmp, path) == 0;
	cJSON *idx = made ? load_json(out, "model.safetensors.index.json") : NULL;
	cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
	if (wm) {
		cJSON_DeleteItemFromObjectCaseSensitive(wm, "model.embed_tokens.weight");
		cJSON_AddStringToObject(wm, "model.embed_tokens.weight_packed", shard);
		cJSON_AddStringToObject(wm, "model.embed_tokens.weight_scale", shard);
		cJSON_AddStringToObject(wm, "model.embed_tokens.weight_shape", shard);
		char *text = cJSON_Print(idx), ip[900];
		snprintf(ip, sizeof(ip), "%s/model.safetensors.index.json", out);
		made = text && sfw_write_file_atomic(ip, text, strlen(text), &err) == SFW_OK;
		cJSON_free(text);
	} else {
		made = 0;
	}
	cJSON_Delete(idx);
	CHECK(made, "an int8 embedding variant of the quantized model: %s", err.msg);
	if (!made)
		return;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	struct sfw_model *m = NULL;
	s = sfw_model_load(out, &mp, &m, &err);
	CHECK(s == SFW_E_UNSUPPORTED && strstr(err.msg, "model.embed_tokens.weight") && strstr(err.msg, "lm_head"),
	      "int8 embedding refused (status %d): %s", s, err.msg);
	sfw_model_free(m);
}

/* Finding: --force over a model, and a run failing mid-write. */
static void test_outdir(const char *golden)
{
	char in[512], bad[600], out[600], shard[64];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	snprintf(bad, sizeof(bad), "%s/nan-in", tmpdir);
	snprintf(out, sizeof(out), "%s/redo", tmpdir);
	const char *nan_t = "model.layers.3.self_attn.k_proj.weight";
	char bad_st[700];
	snprintf(bad_st, sizeof(bad_st), "%s/model.safetensors", bad);
	CHECK(copy_dir(in, bad) && poke_bf16(bad_st, nan_t, 5, 0x7fc0), "a tiny-dense copy with a NaN in %s", nan_t);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	struct sfw_err err = {0};
	int listed, n;
	p.method = SFW_QUANT_RTN, p.group_size = 32, p.shard_bytes = 1500000, p.stats = &st;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK && st.n_shards >= 3, "%d shards: %s", st.n_shards, err.msg);
	shard_of(out, "model.layers.3.self_attn.k_proj.weight_packed", shard, sizeof(shard));
	CHECK(shard[0] && strcmp(shard, "model-00001-of-00001.safetensors") && strncmp(shard, "model-00001-", 12),
	      "the NaN tensor lands after shard 1 (%s): the failure comes after a commit", shard);
	/* a forced run that fails after its first shard: no config.json, no index */
	p.force = 1;
	enum sfw_status s = sfw_quant_run(bad, out, &p, &err);
	CHECK(s == SFW_E_FORMAT && strstr(err.msg, "k_proj") && strstr(err.msg, bad) && strstr(err.msg, "model '"),
	      "NaN refused, naming the model dir and the tensor: %s", err.msg);
	CHECK(!path_exists(out, "config.json") && !path_exists(out, "model.safetensors.index.json"),
	      "a failed --force run leaves no config.json or index (the old ones would load a mix of two models)");
	/* a plain rerun works and removes the leftovers of the failed run (ours) */
	p.force = 0, p.shard_bytes = 0;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "rerun without --force after a failed run: %s", err.msg);
	n = count_shards(out, &listed);
	CHECK(n == 1 && listed == 1, "leftover shards of the failed run removed: %d shard files, %d listed", n, listed);
	/* --force: a model with fewer shards replaces one with more */
	p.force = 1, p.shard_bytes = 1500000;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "--force, many shards: %s", err.msg);
	n = count_shards(out, &listed);
	CHECK(n == st.n_shards && listed == n, "%d shard files, all %d listed", n, listed);
	p.shard_bytes = 0;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "--force, one shard: %s", err.msg);
	n = count_shards(out, &listed);
	CHECK(n == 1 && listed == 1 && path_exists(out, "model-00001-of-00001.safetensors"),
	      "--force over a model with more shards leaves only the new shard (%d files, %d listed)", n, listed);
	/* AWQ: a non-finite weight is named by its own tensor, not its group's first */
	p.method = SFW_QUANT_AWQ, p.samples = 1, p.seq_len = 64, p.n_grid = 2, p.loss_rows = 16;
	snprintf(out, sizeof(out), "%s/nan-awq", tmpdir);
	s = sfw_quant_run(bad, out, &p, &err);
	CHECK(s == SFW_E_FORMAT && strstr(err.msg, "self_attn.k_proj") && strstr(err.msg, bad),
	      "AWQ names the tensor with the non-finite row: %s", err.msg);
}

/* Findings: null quantization_config, symlinked / oversized side files,
 * small vocab without a tokenizer, AWQ statistics out of memory. */
static void test_inputs(const char *golden)
{
	char in[512], src[600], out[600], path[800];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	snprintf(src, sizeof(src), "%s/side-in", tmpdir);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_err err = {0};
	p.method = SFW_QUANT_RTN, p.group_size = 32;
	/* "quantization_config": null is a plain checkpoint; a symlinked side
	 * file is copied (its target's bytes), a dangling one skipped */
	snprintf(path, sizeof(path), "%s/gen.json", tmpdir);
	FILE *f = fopen(path, "w");
	if (f)
		fputs("{\"bos_token_id\": 1}\n", f), fclose(f);
	char lnk[800];
	snprintf(lnk, sizeof(lnk), "%s/generation_config.json", src);
	int made = copy_dir(in, src) && set_config(src, "quantization_config", cJSON_CreateNull()) &&
		   symlink(path, lnk) == 0;
	snprintf(lnk, sizeof(lnk), "%s/tokenizer_config.json", src);
	made = made && symlink("/nonexistent/salafw", lnk) == 0;
	CHECK(made, "input with a null quantization_config and symlinked side files");
	snprintf(out, sizeof(out), "%s/side-out", tmpdir);
	CHECK(sfw_quant_run(src, out, &p, &err) == SFW_OK, "quantization_config null is accepted: %s", err.msg);
	cJSON *cfg = load_json(out, "config.json"), *e;
	int nq = 0, obj = 0;
	cJSON_ArrayForEach(e, cfg) if (e->string && !strcmp(e->string, "quantization_config")) nq++, obj = cJSON_IsObject(e);
	cJSON_Delete(cfg);
	CHECK(nq == 1 && obj, "the output has one quantization_config, an object (%d)", nq);
	struct sfw_model *m = NULL;
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	CHECK(sfw_model_load(out, &mp, &m, &err) == SFW_OK, "the output loads: %s", err.msg);
	sfw_model_free(m);
	struct stat sb;
	snprintf(path, sizeof(path), "%s/generation_config.json", out);
	struct sfw_buf b;
	sfw_buf_init(&b, 4096);
	CHECK(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sfw_read_file(path, 4096, &b, &err) == SFW_OK &&
		  !strcmp(b.data, "{\"bos_token_id\": 1}\n"),
	      "a symlinked side file is copied as a regular file with its target's bytes");
	sfw_buf_release(&b);
	CHECK(!path_exists(out, "tokenizer_config.json"), "a dangling side-file link is skipped");
	/* a side file that cannot be copied leaves no index (nor config.json) */
	snprintf(path, sizeof(path), "truncate -s 300M '%s/huge.txt'", src);
	CHECK(system(path) == 0, "a 300 MB (sparse) side file");
	snprintf(out, sizeof(out), "%s/side-fail", tmpdir);
	CHECK(sfw_quant_run(src, out, &p, &err) == SFW_E_RANGE && strstr(err.msg, "huge.txt"),
	      "an oversized side file is refused: %s", err.msg);
	CHECK(!path_exists(out, "model.safetensors.index.json") && !path_exists(out, "config.json"),
	      "a failed side-file copy leaves no index that would block a rerun");
	/* AWQ without tokenizer.model calibrates on bytes: ids 3..258 */
	p.method = SFW_QUANT_AWQ, p.samples = 1, p.seq_len = 64, p.n_grid = 2, p.loss_rows = 16;
	static const int vocabs[] = {3, 258, 259};
	for (int i = 0; i < 3; i++) {
		snprintf(src, sizeof(src), "%s/vocab%d", tmpdir, vocabs[i]);
		snprintf(out, sizeof(out), "%s/vocab%d-out", tmpdir, vocabs[i]);
		CHECK(cut_vocab(in, src, vocabs[i]), "tiny-dense with vocab %d", vocabs[i]);
		enum sfw_status s = sfw_quant_run(src, out, &p, &err);
		if (vocabs[i] < 259)
			CHECK(s == SFW_E_UNSUPPORTED && strstr(err.msg, "vocab_size") && strstr(err.msg, src),
			      "vocab %d without tokenizer.model is refused: %s", vocabs[i], err.msg);
		else
			CHECK(s == SFW_OK, "vocab 259 calibrates on bytes: %s", err.msg);
	}
	/* the AWQ statistics cannot be allocated (2 TiB of cached rows): a
	 * clean NOMEM, also when the prefill comes in several chunks */
	struct sfwi_fold fold;
	p.seq_len = 600, p.loss_rows = INT32_MAX;
	enum sfw_status s = sfwi_awq_search(in, &p, &fold, &err);
	if (s == SFW_OK) /* an overcommitting host gave the memory */
		sfwi_fold_free(&fold);
	CHECK(s == SFW_OK || (s == SFW_E_NOMEM && strstr(err.msg, "AWQ statistics")),
	      "AWQ statistics out of memory: %s", s == SFW_OK ? "(allocated)" : err.msg);
}

/* ---- H. the runner on quantized golden models -------------------------------- */
struct model_err {
	double max_prefill, max_decode, logit_scale, rms_prefill;
	int forced_agree, steps, greedy_prefix;
};

static const struct sfw_tensor_info *gfind(struct sfw_st_file *f, const char *n)
{
	const struct sfw_tensor_info *t = sfw_st_find(f, n);
	CHECK(t != NULL, "golden tensor %s", n);
	return t;
}

/* Logits of model_dir on the golden prompt (+ fed decode tokens) against
 * golden_f32; and the free-running greedy chain against decode.tokens. */
static int model_vs_golden(const char *model_dir, const char *golden_case, struct model_err *me)
{
	char gp[700];
	snprintf(gp, sizeof(gp), "%s/golden_f32.safetensors", golden_case);
	struct sfw_st_file *g = NULL;
	struct sfw_err err = {0};
	struct sfw_model *m = NULL;
	struct sfw_record *r = NULL, *r2 = NULL;
	memset(me, 0, sizeof(*me));
	if (sfw_st_open(gp, &g, &err) != SFW_OK) {
		CHECK(0, "open %s: %s", gp, err.msg);
		return -1;
	}
	const struct sfw_tensor_info *ids = gfind(g, "input_ids"), *din = gfind(g, "decode.input_ids"),
				     *pl = gfind(g, "prefill.logits"), *dl = gfind(g, "decode.logits"),
				     *tok = gfind(g, "decode.tokens");
	struct sfw_model_params mp = sfw_model_default_params();
	mp.device = SFW_DEVICE_CPU;
	int rc = -1;
	if (!ids || !din || !pl || !dl || !tok)
		goto out;
	if (sfw_model_load(model_dir, &mp, &m, &err) != SFW_OK) {
		CHECK(0, "load %s: %s", model_dir, err.msg);
		goto out;
	}
	struct sfw_score_params sp = {ids->data, (size_t)ids->nelem, (int)din->nelem, din->data, 0,
				      sfw_ctx_default_params()};
	if (sfw_score_run(m, &sp, &r, &err) != SFW_OK) {
		CHECK(0, "score %s: %s", model_dir, err.msg);
		goto out;
	}
	const struct sfw_record_tensor *rp = sfw_record_find(r, "prefill.logits"), *rd = sfw_record_find(r, "decode.logits"),
				       *rt = sfw_record_find(r, "decode.tokens");
	int64_t T = (int64_t)ids->nelem, V = (int64_t)pl->shape[1], Tl = (int64_t)pl->shape[0], S = (int64_t)din->nelem;
	const float *gl = pl->data, *gd = dl->data, *ql = rp->data, *qd = rd->data;
	for (int64_t i = 0; i < Tl * V; i++) {
		double d = fabs((double)gl[i] - ql[(T - Tl) * V + i]);
		me->max_prefill = d > me->max_prefill ? d : me->max_prefill;
		me->logit_scale = fabs(gl[i]) > me->logit_scale ? fabs(gl[i]) : me->logit_scale;
		me->rms_prefill += d * d;
	}
	me->rms_prefill = sqrt(me->rms_prefill / (double)(Tl * V));
	for (int64_t i = 0; i < S * V; i++) {
		double d = fabs((double)gd[i] - qd[i]);
		me->max_decode = d > me->max_decode ? d : me->max_decode;
	}
	const int32_t *gt = tok->data, *qt = rt->data;
	me->steps = (int)S + 1;
	for (int64_t i = 0; i <= S; i++)
		me->forced_agree += gt[i] == qt[i];
	sp.feed = NULL; /* free-running greedy chain */
	if (sfw_score_run(m, &sp, &r2, &err) != SFW_OK) {
		CHECK(0, "greedy %s: %s", model_dir, err.msg);
		goto out;
	}
	qt = sfw_record_find(r2, "decode.tokens")->data;
	while (me->greedy_prefix <= S && qt[me->greedy_prefix] == gt[me->greedy_prefix])
		me->greedy_prefix++;
	rc = 0;
out:
	sfw_record_free(r);
	sfw_record_free(r2);
	sfw_model_free(m);
	sfw_st_close(g);
	return rc;
}

static void test_models(const char *golden)
{
	static const char *cases[] = {"tiny-dense", "tiny-sparse"};
	static const int groups[] = {32, 128, 0};
	for (int c = 0; c < 2; c++) {
		char in[600];
		snprintf(in, sizeof(in), "%s/%s", golden, cases[c]);
		for (int gi = 0; gi < (c ? 1 : 3); gi++) { /* tiny-sparse (1500 tokens) costs more: g32 only */
			char out[700];
			snprintf(out, sizeof(out), "%s/m-%s-%d", tmpdir, cases[c], groups[gi]);
			struct sfw_quant_params p = sfw_quant_default_params();
			p.method = SFW_QUANT_RTN;
			p.group_size = groups[gi];
			struct sfw_err err = {0};
			if (sfw_quant_run(in, out, &p, &err) != SFW_OK) {
				CHECK(0, "quantize %s: %s", in, err.msg);
				continue;
			}
			struct model_err me;
			if (model_vs_golden(out, in, &me) != 0)
				continue;
			printf("%s rtn g%-3d: max |dlogit| prefill %.2e decode %.2e (%.1f%% of max |logit| %.3f); "
			       "teacher-forced argmax %d/%d; greedy prefix %d/%d\n",
			       cases[c], groups[gi], me.max_prefill, me.max_decode,
			       100 * (me.max_prefill > me.max_decode ? me.max_prefill : me.max_decode) / me.logit_scale,
			       me.logit_scale, me.forced_agree, me.steps, me.greedy_prefix, me.steps);
			CHECK(me.max_prefill <= LOGIT_BOUND && me.max_decode <= LOGIT_BOUND,
			      "%s int8 g%d logits within %.0e of golden_f32 (%.2e, %.2e)", cases[c], groups[gi], LOGIT_BOUND,
			      me.max_prefill, me.max_decode);
			CHECK(me.forced_agree >= me.steps - 2, "%s int8 g%d: teacher-forced argmax agrees %d/%d", cases[c],
			      groups[gi], me.forced_agree, me.steps);
		}
	}
}

/* ---- I. AWQ: the fold is an identity; the search does not lose to RTN -------- */
/* The AWQ output against the folded float32 weights it was quantized from
 * (the fold-only output of the same search): every weight within half a step
 * of its code, and the bf16 scales that rounded below amax / 127.5 (which
 * would clamp +-amax by almost a step) bumped; the bytes are the reference
 * quantizer's on the folded rows. */
static void awq_half_step(const char *fold_dir, const char *awq_dir, int group)
{
	struct sfw_st_set *fs = NULL, *qs = NULL;
	struct sfw_err err = {0};
	if (sfw_st_set_open(fold_dir, &fs, &err) != SFW_OK || sfw_st_set_open(awq_dir, &qs, &err) != SFW_OK) {
		CHECK(0, "open the fold-only and AWQ outputs: %s", err.msg);
		sfw_st_set_close(fs);
		return;
	}
	int lin = 0, folded = 0, same = 1, bound = 1;
	long long bumped = 0, groups = 0;
	double worst = 0;
	for (size_t i = 0; i < sfw_st_set_count(fs); i++) {
		const struct sfw_tensor_info *t = sfw_st_set_at(fs, i);
		size_t plen;
		if (!sfw_ql_is_quantized(t->name, &plen) || t->ndim != 2)
			continue;
		lin++;
		folded += t->dtype == SFW_DTYPE_F32;
		char nm[256];
		snprintf(nm, sizeof(nm), "%.*s.weight_packed", (int)plen, t->name);
		const struct sfw_tensor_info *pk = sfw_st_set_find(qs, nm);
		snprintf(nm, sizeof(nm), "%.*s.weight_scale", (int)plen, t->name);
		const struct sfw_tensor_info *sc = sfw_st_set_find(qs, nm);
		int64_t N = (int64_t)t->shape[0], K = (int64_t)t->shape[1], G = sfw_ql_ngroups(K, group);
		int64_t span = sfw_ql_group_span(K, group), rb = sfw_ql_row_bytes(K);
		if (!pk || !sc || (int64_t)sc->shape[1] != G) {
			same = 0;
			continue;
		}
		float *w = malloc((size_t)K * 4), *dq = malloc((size_t)K * 4);
		uint8_t *c = malloc((size_t)rb);
		uint16_t *g = malloc((size_t)G * 2);
		for (int64_t r = 0; r < N; r++) {
			for (int64_t k = 0; k < K; k++)
				w[k] = t->dtype == SFW_DTYPE_F32
					   ? ((const float *)t->data)[r * K + k]
					   : sfw_bf16_to_f32(((const uint16_t *)t->data)[r * K + k]);
			const uint8_t *codes = (const uint8_t *)pk->data + r * rb;
			const uint16_t *scales = (const uint16_t *)sc->data + r * G;
			same &= sfw_quant_row_w8_ref(w, K, group, c, g) == 0 &&
				!memcmp(c, codes, (size_t)rb) && !memcmp(g, scales, (size_t)G * 2);
			sfw_quant_dequant_row_w8(codes, scales, K, group, dq);
			for (int64_t j = 0; j < G; j++) {
				float amax = 0;
				for (int64_t k = j * span; k < K && k < (j + 1) * span; k++)
					amax = fabsf(w[k]) > amax ? fabsf(w[k]) : amax;
				groups++;
				bumped += amax / 127.5f > 1.1920929e-07f &&
					  scales[j] != sfw_f32_to_bf16(amax / 127.5f);
			}
			for (int64_t k = 0; k < K; k++) {
				double sd = sfw_bf16_to_f32(scales[k / span]),
				       e = fabs((double)w[k] - dq[k]) / sd;
				worst = e > worst ? e : worst;
				bound &= e <= 0.5 * (1 + 1e-6);
			}
		}
		free(w), free(dq), free(c), free(g);
	}
	CHECK(lin == 32 && folded > 0 && same,
	      "AWQ g%d: %d linears (%d folded in float32), codes and scales = the "
	      "reference quantizer of the folded rows",
	      group, lin, folded);
	CHECK(bound, "AWQ g%d: every weight within half a step of its code (worst %.4f step)", group, worst);
	CHECK(bumped > 0, "AWQ g%d: %lld of %lld scales bumped one bf16 ulp above bf16(amax / 127.5)", group,
	      bumped, groups);
	printf("awq g%d: worst |w - deq| %.4f step over the folded weights; %lld of %lld scales bumped\n",
	       group, worst, bumped, groups);
	sfw_st_set_close(fs);
	sfw_st_set_close(qs);
}

static void test_awq(const char *golden)
{
	char in[600], out[700];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	struct sfw_err err = {0};
	p.samples = 6, p.seq_len = 128, p.loss_rows = 256, p.stats = &st;
	/* fold only, float32: the logits of the folded model equal the original's */
	p.fold_only = 1;
	snprintf(out, sizeof(out), "%s/fold", tmpdir);
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "AWQ fold-only run: %s", err.msg);
	CHECK(st.awq_mappings == 4 * 3 + 2 && st.awq_identity < st.awq_mappings && st.calib_tokens == 6 * 128,
	      "14 smoothing groups searched (3 per sparse layer, 4 per lightning layer), %d non-identity, %lld tokens",
	      st.awq_mappings - st.awq_identity, (long long)st.calib_tokens);
	struct sfw_st_set *fs = NULL;
	const struct sfw_tensor_info *nw = NULL;
	if (sfw_st_set_open(out, &fs, &err) == SFW_OK) {
		nw = sfw_st_set_find(fs, "model.layers.1.post_attention_layernorm.weight");
		CHECK(nw && nw->dtype == SFW_DTYPE_F32, "folded norms are written in float32 (fold-only)");
	}
	struct model_err fe, re, ae;
	if (model_vs_golden(out, in, &fe) == 0) {
		printf("awq fold-only: max |dlogit| vs golden_f32 prefill %.2e decode %.2e\n", fe.max_prefill, fe.max_decode);
		CHECK(fe.max_prefill <= 1e-5 && fe.max_decode <= 1e-5 && fe.forced_agree == fe.steps,
		      "the AWQ fold is an identity: logits within 1e-5 (%.2e, %.2e)", fe.max_prefill, fe.max_decode);
	}
	sfw_st_set_close(fs);
	/* AWQ vs RTN, same group size: logit error against the bf16 model */
	static const int groups[] = {128, 32};
	for (int gi = 0; gi < 2; gi++) {
		p.fold_only = 0;
		p.group_size = groups[gi];
		p.method = SFW_QUANT_AWQ;
		snprintf(out, sizeof(out), "%s/awq%d", tmpdir, groups[gi]);
		CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "AWQ g%d: %s", groups[gi], err.msg);
		if (groups[gi] == SFW_QL_GROUP_DEFAULT) { /* the group the fold-only run searched with */
			char fold[700];
			snprintf(fold, sizeof(fold), "%s/fold", tmpdir);
			awq_half_step(fold, out, groups[gi]);
		}
		double alpha = st.awq_mean_alpha, gain = st.awq_loss_gain;
		int ok = model_vs_golden(out, in, &ae) == 0;
		p.method = SFW_QUANT_RTN;
		snprintf(out, sizeof(out), "%s/rtn%d", tmpdir, groups[gi]);
		CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "RTN g%d: %s", groups[gi], err.msg);
		ok = ok && model_vs_golden(out, in, &re) == 0;
		if (!ok)
			continue;
		printf("tiny-dense g%d: logit error vs bf16  RTN rms %.3e max %.3e | AWQ rms %.3e max %.3e "
		       "(mean alpha %.3f, proxy loss -%.1f%%)\n", groups[gi], re.rms_prefill, re.max_prefill,
		       ae.rms_prefill, ae.max_prefill, alpha, 100 * gain);
		/* The search never loses on its own objective (the identity is a
		 * candidate). On these random-weight models there are no salient
		 * channels and the proxy's gain does not carry to the logits: measured
		 * AWQ/RTN logit RMS 1.019 (g128) and 1.058 (g32). We hold it to 1.10
		 * and say so in the report, rather than claim AWQ <= RTN here. */
		CHECK(gain >= 0, "g%d: AWQ proxy loss never above RTN's (gain %.3f)", groups[gi], gain);
		CHECK(ae.rms_prefill <= 1.10 * re.rms_prefill, "g%d: AWQ logit RMS error %.3e <= 1.10 x RTN's %.3e",
		      groups[gi], ae.rms_prefill, re.rms_prefill);
		CHECK(ae.max_prefill <= LOGIT_BOUND && ae.forced_agree >= ae.steps - 2, "g%d: AWQ model runs within bounds",
		      groups[gi]);
	}
}

static void test_refusals(const char *golden)
{
	char in[512], out[600];
	snprintf(in, sizeof(in), "%s/tiny-dense", golden);
	struct sfw_quant_params p = sfw_quant_default_params();
	p.method = SFW_QUANT_RTN;
	struct sfw_err err = {0};
	snprintf(out, sizeof(out), "%s/q128", tmpdir);
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_E_EXISTS && strstr(err.msg, "already holds a model"),
	      "an existing output needs force: %s", err.msg);
	p.force = 1;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_OK, "force overwrites: %s", err.msg);
	p.force = 0;
	snprintf(out, sizeof(out), "%s/again", tmpdir);
	char q128[600];
	snprintf(q128, sizeof(q128), "%s/q128", tmpdir);
	CHECK(sfw_quant_run(q128, out, &p, &err) == SFW_E_UNSUPPORTED && strstr(err.msg, "already quantized"),
	      "a quantized input is refused: %s", err.msg);
	CHECK(sfw_quant_run(in, in, &p, &err) != SFW_OK, "output == input refused: %s", err.msg);
	p.group_size = 16;
	CHECK(sfw_quant_run(in, out, &p, &err) == SFW_E_INVAL && strstr(err.msg, "group size"), "group 16 refused: %s",
	      err.msg);
}

/* ---- K. the manifest's lineage object (verify/manifest.c) -------------------- */
static int parse_lineage(const char *lineage, struct sfw_manifest *m, struct sfw_err *err)
{
	char t[4096];
	snprintf(t, sizeof(t),
		 "{\"schema_version\": 1, \"generator\": \"salafw/0.1.0\", \"publisher\": {\"key_id\": "
		 "\"0123456789ABCDEF\"}, \"repo_type\": \"model\", \"repo_id\": \"local/m\", \"revision\": "
		 "\"%s\", %s%s%s\"manifest_version\": 1, \"created\": \"2026-01-01T00:00:00Z\", \"expires\": "
		 "\"2027-01-01T00:00:00Z\", \"total_size\": 3, \"files\": [{\"path\": \"a\", \"size\": 3, "
		 "\"sha256\": \"%s\"}]}",
		 "0123456789abcdef0123456789abcdef01234567", lineage ? "\"lineage\": " : "", lineage ? lineage : "",
		 lineage ? ", " : "", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
	return sfw_manifest_parse(t, strlen(t), "manifest", m, err);
}

static void test_lineage_parse(void)
{
	struct sfw_manifest m;
	struct sfw_err err = {0};
	static const char good[] =
	    "{\"derived_by\": \"salafw/0.1.0\", \"method\": \"awq\", \"params\": {\"group_size\": \"128\", "
	    "\"samples\": \"128\"}, \"parent\": {\"repo_id\": \"openbmb/MiniCPM-SALA\", \"revision\": "
	    "\"9180fe1db74f71fb81bc7105efe88f6b19c959b0\", \"manifest_sha256\": "
	    "\"2263a168d94c135114578ce8ca12f8d227cab567a5ba9b4e5cff929ed7247d87\", \"key_id\": \"2DC28CC7B26A283B\"}}";
	CHECK(parse_lineage(good, &m, &err) == SFW_OK && m.lineage.present && m.lineage.has_parent &&
		  !strcmp(m.lineage.method, "awq") && m.lineage.nparams == 2 && !strcmp(m.lineage.param_key[0], "group_size") &&
		  !strcmp(m.lineage.param_value[0], "128") && !strcmp(m.lineage.parent_repo_id, "openbmb/MiniCPM-SALA") &&
		  !strcmp(m.lineage.parent_key_id, "2DC28CC7B26A283B") && m.lineage.parent_manifest_sha256[0] == 0x22 &&
		  m.lineage.parent_manifest_sha256[31] == 0x87,
	      "a lineage parses: method, params, parent repo, revision, manifest sha256, key (%s)", err.msg);
	sfw_manifest_release(&m);
	CHECK(parse_lineage(NULL, &m, &err) == SFW_OK && !m.lineage.present, "no lineage: a publisher's manifest");
	sfw_manifest_release(&m);
	CHECK(parse_lineage("{\"derived_by\": \"x\", \"method\": \"rtn\"}", &m, &err) == SFW_OK && m.lineage.present &&
		  !m.lineage.has_parent && m.lineage.nparams == 0,
	      "a lineage without params or parent (an unverified input)");
	sfw_manifest_release(&m);
	char many[4096] = "{\"derived_by\": \"x\", \"method\": \"rtn\", \"params\": {";
	for (int i = 0; i <= SFW_LINEAGE_MAX_PARAMS; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s\"p%d\": \"v\"", i ? ", " : "", i);
	strcat(many, "}}");
	const struct {
		const char *lineage, *why;
	} bad[] = {
	    {"[]", "must be an object"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"extra\": 1}", "unknown member 'extra'"},
	    {"{\"method\": \"rtn\"}", "derived_by"},
	    {"{\"derived_by\": \"x\", \"method\": \"RTN\"}", "method must be"},
	    {"{\"derived_by\": \"x\\u0001\", \"method\": \"rtn\"}", "printable"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"params\": {\"g\": 128}}", "must be a string"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"params\": {\"G-S\": \"1\"}}", "param name"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"parent\": {\"repo_id\": \"a/b\", \"revision\": \"00\", "
	     "\"manifest_sha256\": \"00\", \"key_id\": \"00\"}}",
	     "revision must be"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"parent\": {\"repo_id\": \"a/b\", \"revision\": "
	     "\"0123456789abcdef0123456789abcdef01234567\", \"manifest_sha256\": \"00\", \"key_id\": \"00\"}}",
	     "manifest_sha256 must be"},
	    {"{\"derived_by\": \"x\", \"method\": \"rtn\", \"parent\": {\"repo_id\": \"../b\"}}", "ORG/NAME"},
	    {many, "more than 32 params"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&err, 0, sizeof(err));
		enum sfw_status s = parse_lineage(bad[i].lineage, &m, &err);
		CHECK(s == SFW_E_MANIFEST && strstr(err.msg, bad[i].why), "lineage refused (%s): %s", bad[i].why, err.msg);
		if (s == SFW_OK)
			sfw_manifest_release(&m);
	}
}

/* The AWQ search's pieces that kernels/awq.cu replays on the GPU
 * (quant_int.h: the C twins), against plain scalar loops written here:
 * the fake rows through the reference quantizer's quantize + dequantize
 * (a separate path from the vectorised fake quantizer), the duo sums and
 * row losses in the documented order, and sfw_op_matmul_cpu with F32 weights
 * in the lane order the GPU product reproduces (eight lane sums over
 * k = 8i + j, hsum8's tree, the tail): exact equality, so a change of that
 * order in kernels/matmul.c shows here before it shows on a GPU. */
static void test_awq_twins(void)
{
	static const int groups[] = {32, 64, 128, 0};
	uint64_t rs = 99;
	for (int gi = 0; gi < 4; gi++) {
		int N = 19, K = gi % 2 ? 300 : 256, group = groups[gi], span = group > 0 ? group : K;
		float *W = malloc((size_t)N * K * 4), *Wq = malloc((size_t)N * K * 4), *s = malloc((size_t)K * 4);
		float *row = malloc((size_t)K * 4), *deq = malloc((size_t)K * 4);
		uint8_t *codes = malloc((size_t)sfw_ql_row_bytes(K));
		uint16_t *sc = malloc((size_t)sfw_ql_ngroups(K, group) * 2);
		unsigned char *bad = malloc((size_t)N);
		gen_matrix(11 + (uint64_t)gi, N, K, 0, W);
		for (int k = 0; k < K; k++)
			s[k] = (float)exp(gauss(&rs) * 0.5);
		W[(size_t)4 * K + 7] = NAN; /* row 4: not finite */
		sfwi_awq_fake_rows(NULL, Wq, bad, W, s, N, K, group);
		int diff = 0, badok = 1;
		for (int r = 0; r < N; r++) {
			for (int k = 0; k < K; k++)
				row[k] = W[(size_t)r * K + k] * s[k];
			int rc = sfw_quant_row_w8_ref(row, K, group, codes, sc);
			badok = badok && (rc != 0) == (bad[r] != 0);
			if (rc != 0)
				continue;
			sfw_quant_dequant_row_w8(codes, sc, K, group, deq);
			for (int k = 0; k < K; k++)
				diff += deq[k] / s[k] != Wq[(size_t)r * K + k];
		}
		CHECK(diff == 0 && badok && bad[4], "awq twin fake_rows g%d K %d: %d values differ from quantize + "
		      "dequantize / s; non-finite rows %s", group, K, diff, badok ? "agree" : "differ");
		/* duo sums */
		float *wm = malloc((size_t)K * 4), *gm = malloc((size_t)N * ((K + span - 1) / span) * 4);
		for (int k = 0; k < K; k++)
			W[(size_t)4 * K + k] = (float)(gauss(&rs) * 0.01);
		sfwi_awq_duo_sums(NULL, wm, gm, W, N, K, span);
		int dd = 0;
		for (int k = 0; k < K; k++) {
			float acc = 0;
			for (int r = 0; r < N; r++) {
				float mx = 0;
				int g0 = k / span * span, g1 = g0 + span < K ? g0 + span : K;
				for (int q = g0; q < g1; q++)
					mx = fabsf(W[(size_t)r * K + q]) > mx ? fabsf(W[(size_t)r * K + q]) : mx;
				acc += mx > 0 ? fabsf(W[(size_t)r * K + k]) / mx : 0.0f;
			}
			dd += acc != wm[k];
		}
		CHECK(dd == 0, "awq twin duo_sums span %d: %d of %d column sums differ", span, dd, K);
		free(W), free(Wq), free(s), free(row), free(deq), free(codes), free(sc), free(bad), free(wm), free(gm);
	}
	/* the row losses and the product's lane order */
	static const int sh[][3] = {{1, 1, 1}, {3, 5, 8}, {7, 33, 200}, {64, 17, 333}, {5, 40, 4099}};
	for (size_t t = 0; t < sizeof(sh) / sizeof(sh[0]); t++) {
		int M = sh[t][0], N = sh[t][1], K = sh[t][2], K8 = K & ~7;
		float *X = malloc((size_t)M * K * 4), *W = malloc((size_t)N * K * 4), *Y = malloc((size_t)M * N * 4);
		float *Y2 = malloc((size_t)M * N * 4);
		double *part = malloc((size_t)M * 8);
		for (size_t i = 0; i < (size_t)M * K; i++)
			X[i] = (float)gauss(&rs);
		for (size_t i = 0; i < (size_t)N * K; i++)
			W[i] = (float)(gauss(&rs) * 0.02);
		sfw_op_matmul_cpu(NULL, Y, X, W, SFW_DTYPE_F32, M, N, K);
		int md = 0;
		for (int m = 0; m < M; m++)
			for (int n = 0; n < N; n++) {
				float l[8] = {0};
				for (int k = 0; k < K8; k++)
					l[k % 8] += X[(size_t)m * K + k] * W[(size_t)n * K + k];
				float v = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
				for (int k = K8; k < K; k++)
					v += X[(size_t)m * K + k] * W[(size_t)n * K + k];
				md += v != Y[(size_t)m * N + n];
				Y2[(size_t)m * N + n] = v + (float)(gauss(&rs) * 1e-3);
			}
		CHECK(md == 0, "sfw_op_matmul_cpu F32 %d x %d x %d sums in the lane order kernels/awq.cu replays (%d differ)",
		      M, N, K, md);
		sfwi_awq_sqerr_rows(NULL, part, Y2, Y, M, (size_t)N);
		int pd = 0;
		for (int m = 0; m < M; m++) {
			double acc = 0;
			for (int n = 0; n < N; n++) {
				double d = (double)Y2[(size_t)m * N + n] - Y[(size_t)m * N + n];
				acc += d * d;
			}
			pd += acc != part[m];
		}
		CHECK(pd == 0, "awq twin sqerr_rows %d x %d: %d rows differ", M, N, pd);
		free(X), free(W), free(Y), free(Y2), free(part);
	}
}

/* The default calibration (samples 0) on a model with a tokenizer: as many
 * sequences as the built-in text fills, the last one shorter, so each of the
 * tokens the model's tokenizer gives for the text runs once (no repeat,
 * nothing for the CLI to warn about); an explicit count beyond the text
 * goes through it again, as asked. */
static void test_default_calib(void)
{
	char dir[600], out[700];
	snprintf(dir, sizeof(dir), "%s/tiny-tok", tmpdir);
	struct sfw_mkmodel_params mp;
	memset(&mp, 0, sizeof(mp));
	mp.preset = SFW_MKMODEL_TINY;
	mp.seed = 3;
	struct sfw_err err = {0};
	if (sfw_mkmodel(dir, &mp, &err) != SFW_OK) {
		CHECK(0, "mkmodel tiny: %s", err.msg);
		return;
	}
	/* the tokens the model's tokenizer gives for the built-in text */
	struct sfw_tokenizer *tok = NULL;
	int32_t *ids = NULL;
	size_t n = 0;
	struct sfw_config cf;
	if (sfw_config_load(dir, &cf, &err) != SFW_OK || sfw_tokenizer_load(dir, cf.vocab_size, &tok, &err) != SFW_OK ||
	    sfw_tokenizer_encode(tok, sfw_default_corpus, sfw_default_corpus_len(), 0, &ids, &n, &err) != SFW_OK) {
		CHECK(0, "tokenizer of the tiny model: %s", err.msg);
		sfw_tokenizer_free(tok);
		return;
	}
	sfw_tokenizer_free(tok);
	sfw_free(ids);
	struct sfw_quant_params p = sfw_quant_default_params();
	struct sfw_quant_stats st;
	p.stats = &st;
	CHECK(p.samples == 0 && p.seq_len == 512, "default: samples 0 (as the text fills), seq_len 512");
	snprintf(out, sizeof(out), "%s/tiny-tok-q", tmpdir);
	CHECK(sfw_quant_run(dir, out, &p, &err) == SFW_OK, "default AWQ on tiny: %s", err.msg);
	int64_t per = 511, want_seq = ((int64_t)n + per - 1) / per;
	if (want_seq > SFW_QUANT_AUTO_SAMPLES)
		want_seq = SFW_QUANT_AUTO_SAMPLES;
	int64_t want_used = want_seq * per < (int64_t)n ? want_seq * per : (int64_t)n;
	printf("default calibration: the built-in text gives %zu tokens with the tiny model's tokenizer: %lld "
	       "sequences, %lld tokens run (BOS included), %lld text tokens used\n", n, (long long)st.calib_samples,
	       (long long)st.calib_tokens, (long long)st.calib_text_used);
	CHECK(st.calib_text_tokens == (int64_t)n, "calibration text tokens %lld == the tokenizer's %zu",
	      (long long)st.calib_text_tokens, n);
	CHECK(st.calib_samples == want_seq && st.calib_text_used == want_used &&
		      st.calib_tokens == want_used + want_seq,
	      "default: %lld sequences (want %lld), %lld text tokens used (want %lld), %lld run (want %lld)",
	      (long long)st.calib_samples, (long long)want_seq, (long long)st.calib_text_used, (long long)want_used,
	      (long long)st.calib_tokens, (long long)(want_used + want_seq));
	CHECK(st.calib_text_used <= st.calib_text_tokens, "default: no text token is used twice (the CLI's warning "
	      "condition is false)");
	/* an explicit count beyond the text: run whole, the text repeated */
	p.samples = (int)want_seq + 2;
	p.force = 1;
	CHECK(sfw_quant_run(dir, out, &p, &err) == SFW_OK, "AWQ --samples %d on tiny: %s", p.samples, err.msg);
	CHECK(st.calib_samples == p.samples && st.calib_text_used == (int64_t)p.samples * per &&
		      st.calib_text_used > st.calib_text_tokens,
	      "--samples %d: run whole, %lld text tokens taken from %lld (gone through again)", p.samples,
	      (long long)st.calib_text_used, (long long)st.calib_text_tokens);
	/* a text shorter than one sequence: one sequence of the whole text */
	char txt[700];
	snprintf(txt, sizeof(txt), "%s/short.txt", tmpdir);
	FILE *f = fopen(txt, "w");
	if (f) {
		fputs("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.\n", f);
		fclose(f);
	}
	p.samples = 0;
	p.calib_path = txt;
	CHECK(sfw_quant_run(dir, out, &p, &err) == SFW_OK, "AWQ on a short --calib text: %s", err.msg);
	CHECK(st.calib_samples == 1 && st.calib_text_used == st.calib_text_tokens &&
		      st.calib_tokens == st.calib_text_tokens + 1 && st.calib_text_tokens < per,
	      "a text of %lld tokens (< 511): 1 sequence of all of them (%lld sequences, %lld used, %lld run)",
	      (long long)st.calib_text_tokens, (long long)st.calib_samples, (long long)st.calib_text_used,
	      (long long)st.calib_tokens);
}

int main(void)
{
	test_layout();
	test_lineage_parse();
	test_known_bytes();
	test_matmul_w8();
	test_matmul_w8_rows();
	test_matmul_silu_w8();
	test_fake_rows();
	test_awq_twins();
	static const int groups[] = {32, 64, 128, 0};
	for (int i = 0; i < 4; i++) {
		test_python(42 + (uint64_t)i, 24, 301, groups[i], 0);
		test_python(7 + (uint64_t)i, 16, 256, groups[i], 1);
		test_errors(groups[i]);
	}
	const char *golden = check_golden_dir();
	snprintf(tmpdir, sizeof(tmpdir), "%s/salafw-quant.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (golden && mkdtemp(tmpdir)) {
		test_writer(golden, 32);
		test_writer(golden, 128);
		test_writer(golden, 0);
		test_refusals(golden);
		test_outdir(golden);
		test_int8_embedding(golden);
		test_inputs(golden);
		test_models(golden);
		test_awq(golden);
		test_default_calib();
		rm_rf(tmpdir);
	}
	return CHECK_REPORT("test_quant");
}
