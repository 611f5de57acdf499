/* bench_w8gemm.c - the int8 tensor-core GEMM (sfw_cuda_gemm_w8_mma,
 * kernels/linear_w8_mma.cu) against the bf16 cuBLASLt GEMM on the same shape
 * (sfw_cuda_gemm) and the int8 path it replaces (dequantize slabs to bf16,
 * then cuBLASLt: sfw_cuda_gemm_w8), and, for M <= 8, the int8 decode GEMV:
 *   bench_w8gemm [--m 1,2,4,...] [--group G] [--shape o_proj|kv|gate_up|down] [--sweep]
 * Shapes: MiniCPM-SALA's o_proj (4096 x 4096), K/V of one layer (256 x
 * 4096), gate|up (32768 x 4096; the int8 GEMM with its fused SiLU, the
 * others the plain GEMM: the SiLU kernel they would add is not timed),
 * down (4096 x 16384). Weights rotate over copies totalling >= 256 MiB so
 * each call reads them from memory; each figure is the median of 7 rounds of
 * 10 calls (3 warm-ups). TFLOP/s counts 2 M N K; GB/s the weight bytes
 * (int8 codes + scales, or bf16) plus X and Y. Ratios: bf16 time / int8
 * time and old time / int8 time (> 1: the new GEMM is faster).
 * --slab: the dequantize path's slab in MiB (default the engine's,
 * SFW_CUDA_W8_SLAB_BYTES).
 * --sweep: instead, every tile configuration of the int8 GEMM
 * (sfw_cuda_w8mma_cfg_name) at each M beside the kernel's own choice and
 * bf16, and the fastest (how w8m_cfg_for in kernels/linear_w8_mma.cu is
 * chosen).
 * Built in every build; without CUDA=1 it says so and exits 0. */
#include "sfw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SFW_HAVE_CUDA
int main(void)
{
	printf("bench_w8gemm: built without CUDA (make CUDA=1); nothing to measure\n");
	return 0;
}
#else
#include "kernels/linear_w8_mma.h"
#include "kernels/ops_cuda.h"

enum path { P_MMA, P_BF16, P_OLD, P_GEMV };

static int g_cfg = -1; /* P_MMA's tile configuration (-1: the kernel's choice for M) */

struct bufs {
	int ncopy;
	uint8_t *codes[64];
	void *scales[64];
	uint16_t *wbf[64];
	int nbf;
	uint16_t *x, *y;
	void *ws, *scr;
	size_t ws_bytes, scr_bytes;
};

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

static void call(enum path p, struct bufs *b, struct sfw_cuda_blas *blas, int i, int M, int N, int K, int group,
		 int silu, void *s)
{
	int c = i % b->ncopy, rows = silu ? 2 * N : N;
	switch (p) {
	case P_MMA:
		sfw_cuda_gemm_w8_mma_cfg(b->x, &(struct sfw_w8){b->codes[c], b->scales[c], SFW_DTYPE_BF16, group},
					 b->y, &(struct sfw_gemm_shape){M, N, K, K, N}, silu, b->ws, b->ws_bytes, s,
					 g_cfg);
		break;
	case P_BF16:
		sfw_cuda_gemm(blas, b->x, b->wbf[i % b->nbf], b->y,
			      &(struct sfw_gemm_shape){M, rows, K, K, rows}, s);
		break;
	case P_OLD:
		sfw_cuda_gemm_w8(blas, b->x,
				 &(struct sfw_w8){b->codes[c], b->scales[c], SFW_DTYPE_BF16, group}, b->y,
				 &(struct sfw_gemm_shape){M, rows, K, K, rows}, b->scr, b->scr_bytes, s);
		break;
	case P_GEMV:
		sfw_cuda_gemv_w8_variant(b->x,
					 &(struct sfw_w8){b->codes[c], b->scales[c], SFW_DTYPE_BF16, group},
					 b->y, &(struct sfw_gemm_shape){M, rows, K, K, rows}, 0, 0, s);
		break;
	}
}

static float time_path(enum path p, struct bufs *b, struct sfw_cuda_blas *blas, int M, int N, int K, int group,
		       int silu, void *s, void *e0, void *e1)
{
	float t[7];
	for (int i = 0; i < 3; i++)
		call(p, b, blas, i, M, N, K, group, silu, s);
	for (int r = 0; r < 7; r++) {
		sfw_cuda_event_record(e0, s);
		for (int i = 0; i < 10; i++)
			call(p, b, blas, r * 10 + i, M, N, K, group, silu, s);
		sfw_cuda_event_record(e1, s);
		t[r] = sfw_cuda_event_ms(e0, e1) / 10;
	}
	qsort(t, 7, sizeof(float), cmp_f);
	return t[3];
}

/* One shape's buffers: weight copies rotating over >= 256 MiB (int8 codes
 * and scales, bf16), X and Y for the largest M, the dequantize path's slab
 * of slab_mib MiB (at least 64 rows), and the int8 GEMM's workspace for
 * every configuration at every M. 0 with err set when out of memory. */
static int bufs_make(struct bufs *b, int N, int K, int silu, int group, const int *Ms, int nm, int slab_mib, void *s,
		     struct sfw_err *err)
{
	int rows = silu ? 2 * N : N, span = group > 0 ? group : K, maxM = 1;
	size_t cb = (size_t)rows * K, sb = (size_t)rows * ((K + span - 1) / span) * 2, wb = cb * 2;
	memset(b, 0, sizeof(*b));
	b->ncopy = (int)(((size_t)256 << 20) / cb) + 1;
	b->nbf = (int)(((size_t)256 << 20) / wb) + 1;
	b->ncopy = b->ncopy > 64 ? 64 : b->ncopy;
	b->nbf = b->nbf > 64 ? 64 : b->nbf;
	int ok = 1;
	for (int c = 0; c < b->ncopy && ok; c++) {
		ok = sfw_cuda_malloc((void **)&b->codes[c], cb, "codes", err) == SFW_OK &&
		     sfw_cuda_malloc(&b->scales[c], sb, "scales", err) == SFW_OK;
		if (ok) {
			sfw_cuda_memset(b->codes[c], 0x85 + c, cb, s);
			sfw_cuda_memset(b->scales[c], 0x3a, sb, s); /* bf16 0x3a3a ~ 7e-4 */
		}
	}
	for (int c = 0; c < b->nbf && ok; c++) {
		ok = sfw_cuda_malloc((void **)&b->wbf[c], wb, "bf16 weight", err) == SFW_OK;
		if (ok)
			sfw_cuda_memset(b->wbf[c], 0x3b, wb, s);
	}
	for (int i = 0; i < nm; i++)
		maxM = Ms[i] > maxM ? Ms[i] : maxM;
	size_t xb = (size_t)maxM * K * 2, yb = (size_t)maxM * rows * 2;
	b->scr_bytes = (size_t)slab_mib << 20;
	if (b->scr_bytes < (size_t)64 * K * 2)
		b->scr_bytes = (size_t)64 * K * 2;
	for (int i = 0; i < nm; i++)
		for (int c = -1; c < sfw_cuda_w8mma_ncfg(); c++) {
			size_t w = sfw_cuda_w8mma_ws_bytes_cfg(Ms[i], N, K, silu, 0, c);
			b->ws_bytes = w > b->ws_bytes ? w : b->ws_bytes;
		}
	ok = ok && sfw_cuda_malloc((void **)&b->x, xb, "x", err) == SFW_OK &&
	     sfw_cuda_malloc((void **)&b->y, yb, "y", err) == SFW_OK &&
	     sfw_cuda_malloc(&b->scr, b->scr_bytes, "scratch", err) == SFW_OK &&
	     (!b->ws_bytes || sfw_cuda_malloc(&b->ws, b->ws_bytes, "ws", err) == SFW_OK);
	if (!ok)
		return 0;
	sfw_cuda_memset(b->x, 0x3c, xb, s);
	if (b->ws)
		sfw_cuda_memset(b->ws, 0, b->ws_bytes, s);
	return 1;
}

static void bufs_free(struct bufs *b)
{
	for (int c = 0; c < b->ncopy; c++)
		sfw_cuda_free(b->codes[c]), sfw_cuda_free(b->scales[c]);
	for (int c = 0; c < b->nbf; c++)
		sfw_cuda_free(b->wbf[c]);
	sfw_cuda_free(b->x), sfw_cuda_free(b->y), sfw_cuda_free(b->scr);
	if (b->ws)
		sfw_cuda_free(b->ws);
}

/* One line of the sweep: bf16, the kernel's choice, every configuration
 * (µs), then the three fastest. */
static void sweep_row(struct bufs *b, struct sfw_cuda_blas *blas, const char *what, int M, int N, int K, int group,
		      int silu, void *s, void *e0, void *e1)
{
	float tb = time_path(P_BF16, b, blas, M, N, K, group, silu, s, e0, e1);
	g_cfg = -1;
	float tc = time_path(P_MMA, b, blas, M, N, K, group, silu, s, e0, e1);
	printf("%-13s %5d | %7.1f %7.1f |", what, M, tb * 1e3, tc * 1e3);
	int nc = sfw_cuda_w8mma_ncfg(), top[3] = {-1, -1, -1};
	float t[128];
	for (int c = 0; c < nc && c < 128; c++) {
		t[c] = -1;
		g_cfg = c;
		if (!sfw_cuda_gemm_w8_mma_cfg(b->x, &(struct sfw_w8){b->codes[0], b->scales[0], SFW_DTYPE_BF16, group},
					      b->y, &(struct sfw_gemm_shape){M, N, K, K, N}, silu, b->ws, b->ws_bytes,
					      s, c)) {
			printf(" %6s", "-");
			continue;
		}
		t[c] = time_path(P_MMA, b, blas, M, N, K, group, silu, s, e0, e1);
		printf(" %6.1f", t[c] * 1e3);
		for (int k = 0; k < 3; k++)
			if (top[k] < 0 || t[c] < t[top[k]]) {
				for (int m = 2; m > k; m--)
					top[m] = top[m - 1];
				top[k] = c;
				break;
			}
	}
	g_cfg = -1;
	printf(" |");
	for (int k = 0; k < 3 && top[k] >= 0; k++)
		printf(" c%d (%s) %.1f bf16/%.2f;", top[k], sfw_cuda_w8mma_cfg_name(top[k]), t[top[k]] * 1e3,
		       tb / t[top[k]]);
	printf(" choice/best %.2f\n", top[0] >= 0 ? tc / t[top[0]] : 0.0);
	fflush(stdout);
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 1 || v > 65536)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	int Ms[32] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192}, nm = 13, group = 128;
	const char *only = NULL;
	int sweep = 0, slab_mib = (int)(SFW_CUDA_W8_SLAB_BYTES >> 20);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--m") && i + 1 < argc) {
			nm = parse_list(argv[++i], Ms, 32);
			if (nm <= 0) {
				fprintf(stderr, "bench_w8gemm: --m: a comma list of row counts 1..65536\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--group") && i + 1 < argc) {
			group = atoi(argv[++i]);
			if (group != 0 && group != 32 && group != 64 && group != 128) {
				fprintf(stderr, "bench_w8gemm: --group: 32, 64, 128 or 0 (per channel)\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
			only = argv[++i];
		} else if (!strcmp(argv[i], "--sweep")) {
			sweep = 1;
		} else if (!strcmp(argv[i], "--slab") && i + 1 < argc) {
			slab_mib = atoi(argv[++i]);
			if (slab_mib < 1 || slab_mib > 64) {
				fprintf(stderr, "bench_w8gemm: --slab: MiB of the dequantize path's slab, 1..64\n");
				return 2;
			}
		} else {
			fprintf(stderr, "usage: bench_w8gemm [--m 1,2,4,...] [--group 32|64|128|0] [--shape NAME] "
					"[--sweep] [--slab MiB]\n");
			return 2;
		}
	}
	struct sfw_cuda_info info;
	struct sfw_err err = {0};
	if (sfw_cuda_init(0, &info, &err) != SFW_OK) {
		fprintf(stderr, "bench_w8gemm: %s\n", err.msg);
		return 1;
	}
	void *s;
	struct sfw_cuda_blas *blas;
	if (sfw_cuda_stream_new(&s, &err) != SFW_OK || sfw_cuda_blas_new(&blas, 32u << 20, &err) != SFW_OK) {
		fprintf(stderr, "bench_w8gemm: %s\n", err.msg);
		return 1;
	}
	void *e0 = sfw_cuda_event_new(), *e1 = sfw_cuda_event_new();
	printf("device: %s, %d SMs; int8 group %d, BF16 scales\n", info.name, info.sm_count, group);
	static const struct {
		const char *what;
		int N, K, silu; /* N: output columns (silu: weight rows 2N) */
	} shapes[] = {
		{"o_proj", 4096, 4096, 0},
		{"kv", 256, 4096, 0},
		{"gate_up+silu", 16384, 4096, 1},
		{"down", 4096, 16384, 0},
	};
	if (sweep) {
		printf("configurations:");
		for (int c = 0; c < sfw_cuda_w8mma_ncfg(); c++)
			printf(" c%d = %s;", c, sfw_cuda_w8mma_cfg_name(c));
		printf("\n%-13s %5s | %7s %7s |", "shape", "M", "bf16", "choice");
		for (int c = 0; c < sfw_cuda_w8mma_ncfg(); c++) {
			char hd[16];
			snprintf(hd, sizeof(hd), "c%d", c);
			printf(" %6s", hd);
		}
		printf(" | the three fastest (bf16 time / theirs); choice time / the fastest\n");
	} else {
		printf("%-13s %5s | %9s %6s %6s | %9s %6s | %9s %6s | %9s | %6s %6s\n", "shape", "M", "int8 mma",
		       "TF/s", "GB/s", "bf16", "TF/s", "old w8", "TF/s", "gemv", "/bf16", "/old");
	}
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		if (only && strncmp(shapes[si].what, only, strlen(only)))
			continue;
		int N = shapes[si].N, K = shapes[si].K, silu = shapes[si].silu, rows = silu ? 2 * N : N;
		int span = group > 0 ? group : K;
		size_t cb = (size_t)rows * K, sb = (size_t)rows * ((K + span - 1) / span) * 2;
		struct bufs b;
		if (!bufs_make(&b, N, K, silu, group, Ms, nm, slab_mib, s, &err)) {
			fprintf(stderr, "bench_w8gemm: %s\n", err.msg);
			return 1;
		}
		for (int i = 0; sweep && i < nm; i++)
			sweep_row(&b, blas, shapes[si].what, Ms[i], N, K, group, silu, s, e0, e1);
		for (int i = 0; !sweep && i < nm; i++) {
			int M = Ms[i];
			double fl = 2.0 * M * rows * K;
			float tm = time_path(P_MMA, &b, blas, M, N, K, group, silu, s, e0, e1);
			float tb = time_path(P_BF16, &b, blas, M, N, K, group, silu, s, e0, e1);
			float to = M > 8 ? time_path(P_OLD, &b, blas, M, N, K, group, silu, s, e0, e1) : 0;
			float tg = M <= 8 ? time_path(P_GEMV, &b, blas, M, N, K, group, silu, s, e0, e1) : 0;
			double bytes = (double)cb + sb + (double)M * K * 2 + (double)M * N * 2;
			char old[32] = "-", oldtf[16] = "-", gemv[32] = "-", rold[16] = "-";
			if (to > 0) {
				snprintf(old, sizeof(old), "%.4f", to);
				snprintf(oldtf, sizeof(oldtf), "%.0f", fl / (to * 1e-3) / 1e12);
				snprintf(rold, sizeof(rold), "%.2f", to / tm);
			}
			if (tg > 0) {
				snprintf(gemv, sizeof(gemv), "%.4f", tg);
				snprintf(rold, sizeof(rold), "g%.2f", tg / tm);
			}
			printf("%-13s %5d | %9.4f %6.0f %6.0f | %9.4f %6.0f | %9s %6s | %9s | %6.2f %6s\n", shapes[si].what,
			       M, tm, fl / (tm * 1e-3) / 1e12, bytes / (tm * 1e-3) / 1e9, tb, fl / (tb * 1e-3) / 1e12,
			       old, oldtf, gemv, tb / tm, rold);
			fflush(stdout);
		}
		bufs_free(&b);
	}
	if (sweep)
		printf("times in µs (median of 7 x 10 calls); choice: the kernel's own configuration for M; - : the "
		       "configuration cannot do the call\n");
	else
		printf("times in ms (median of 7 x 10 calls); /bf16 = bf16 time / int8 mma time; /old = old dequant path "
	       "time / int8 mma time, or g = the int8 GEMV's (M <= 8)\n");
	sfw_cuda_event_free(e0), sfw_cuda_event_free(e1);
	sfw_cuda_blas_free(blas);
	sfw_cuda_stream_free(s);
	return 0;
}
#endif
