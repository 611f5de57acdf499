/* ops.h - every op of the MiniCPM-SALA forward pass, as plain C twins.
 *
 * sfw_op_<op>_cpu (kernels/<family>.c, always built) is the reference: fp32
 * activations, fp32 accumulation, weights read as bf16 or f32 and converted on
 * the fly. sfw_op_<op>_cuda (kernels/<family>.cu, CUDA=1) has the same
 * arguments in the same order with four changes:
 *   - the CPU twin's leading executor `struct sfw_ops_cpu *ex` (below) is
 *     not there;
 *   - activation pointers (float * here) become void * in the activation dtype
 *     `act` (SFW_DTYPE_BF16 normally: rounded where the reference rounds,
 *     docs/model-spec.md §2; SFW_DTYPE_F32 allowed for twin tests);
 *   - `enum sfw_dtype act` and `struct sfw_cuda_ctx *cx` (kernels/ops_cuda.h:
 *     the stream, cuBLASLt handle, scratch and kernel choices) are appended;
 *   - every pointer is in the twin's memory space (host for _cpu, device for
 *     _cuda), including small parameter arrays such as `decay`.
 * Buffers that the reference keeps in float32 (the lightning state, stage-1
 * scores, pooled scores) stay float * in both twins. Integers (ids, top-k
 * indices) are int32. A test (tests/test_ops.c, CUDA) compares each pair on
 * random inputs.
 *
 * Layouts (row-major, token-major, head-major inside a row, docs/model-spec.md §3):
 *   activations x [T, n]; q [T, nh, hd]; sparse-layer KV cache [len, nkv, hd];
 *   compressed keys [n_chunks, nkv, hd]; lightning state [nh, hd(k), hd(v)];
 *   weights W [N, K] = [out, in] as stored by nn.Linear.
 * Positions are absolute (0-based); row r of a call sits at pos0 + r.
 * `y` may alias `x` only where the comment says so.
 *
 * Threads: a CPU twin that parallelizes or can fail takes its executor as
 * its first argument (struct sfw_ops_cpu below; the CPU backend passes its
 * own to every op); the others run on the calling thread. No process-wide
 * or per-thread state. */
#ifndef SFW_OPS_H
#define SFW_OPS_H

#include "num/num.h" /* enum sfw_dtype, sfw_bf16_to_f32 */
#include "sfw.h"

#include <stddef.h>
#include <stdint.h>

/* Element i of a weight stored as bf16 or f32. */
static inline float sfw_op_wget(const void *w, enum sfw_dtype dt, size_t i)
{
	return dt == SFW_DTYPE_BF16 ? sfw_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* The CPU ops' executor: a persistent thread pool (core/thread.h), a
 * failure flag and the ops' options. One per CPU backend; ex may be shared
 * by several threads (their jobs take turns on the pool).
 *
 * Every CPU op that parallelizes or can fail takes it explicitly, as its
 * first argument `struct sfw_ops_cpu *ex`: its work runs on ex's threads
 * and its failure raises ex's flag. ex NULL: the op runs serially on the
 * calling thread, with the default options, and has no flag to raise:
 * sfw_op_sample_cpu then says a failure by its -1 alone, and any other op
 * that cannot get its scratch memory aborts (sfwi_ops_cpu_fail). NULL is a
 * convenience for tests and tools; the library always passes an executor
 * where an op can fail. */
struct sfw_ops_cpu;
struct sfw_cuda_ctx; /* kernels/ops_cuda.h: what a CUDA twin runs with */

/* A block-selection call's shape (docs/model-spec.md §2.6.4): T rows at
 * positions pos0 .. pos0 + T - 1, nh query heads over nkv key heads of hd;
 * level-1 chunks of ksize tokens every stride (level 2: 4 ksize every 4
 * stride); blocks of `block` tokens, the first init_blocks and the
 * local_blocks up to a row's own always kept; stage 1's scale 1/sqrt(hd). */
struct sfw_sel_shape {
	int T, nh, nkv, hd;
	int64_t pos0;
	int ksize, stride;
	int block, init_blocks, local_blocks;
	float scale;
	int64_t n1, n2;	 /* the level-1 and level-2 chunks scored (stage 1, pooling) */
	int64_t nblocks; /* the blocks pooled and ranked */
	int topk;	 /* the blocks kept per (group, row) */
};

/* A paged cache's block table: block i of the cache (tokens [i 2^shift,
 * (i + 1) 2^shift)) is block tab[i] of its pool; tab NULL (or the struct
 * pointer NULL) is a contiguous cache. */
struct sfw_pages {
	const int32_t *tab;
	int shift;
};

#ifdef __CUDACC__
#define SFW_HOSTDEV __host__ __device__
#else
#define SFW_HOSTDEV
#endif

/* log2 of a power of two. */
static inline SFW_HOSTDEV int sfw_log2i(int x)
{
#ifdef __CUDA_ARCH__
	return __ffs(x) - 1;
#else
	return __builtin_ctz((unsigned)x);
#endif
}

/* Level-1 chunks of a cache of len tokens (sfw_ckey_row's chunking: ksize
 * tokens every stride; level 2 is 4 ksize every 4 stride). */
static inline SFW_HOSTDEV int64_t sfw_nchunks(int64_t len, int ksize, int stride)
{
	return len < ksize ? 0 : (len - ksize) / stride + 1;
}

/* The inverse: the least cache length whose level-1 chunk count is n1
 * (levels >= 1), whose level-2 count is n2 (levels == 2) and, with blocks,
 * whose count of `block`-token blocks is nblocks; -1 when no length gives
 * them all (the counts are not those of one cache). */
static inline int64_t sfw_len_of_counts(int64_t n1, int64_t n2, int64_t nblocks, int ksize, int stride, int block,
					int levels, int blocks)
{
	int64_t lo = 0, hi = INT64_MAX;
	for (int lv = 1; lv <= levels; lv++) {
		int64_t n = lv == 1 ? n1 : n2;
		int64_t ks = lv == 1 ? ksize : 4 * (int64_t)ksize, st = lv == 1 ? stride : 4 * (int64_t)stride;
		if (n < 0)
			return -1;
		/* nchunks(len) == n: len in [ks + (n - 1) st, ks + n st - 1], or [0, ks - 1] for n = 0 */
		int64_t a = n ? ks + (n - 1) * st : 0, b = ks + n * st - 1;
		lo = a > lo ? a : lo, hi = b < hi ? b : hi;
	}
	if (blocks) {
		if (nblocks < 0)
			return -1;
		int64_t a = nblocks ? (nblocks - 1) * block + 1 : 0, b = nblocks * (int64_t)block;
		lo = a > lo ? a : lo, hi = b < hi ? b : hi;
	}
	return lo <= hi ? lo : -1;
}

/* Compressed keys in a paged cache. A paged cache keeps each compressed key
 * in the KV block that holds its chunk's last token, so whoever holds the
 * block shares the key with it (runner/backend.h, the block pool). Per
 * block of B = 2^shift tokens: B / stride level-1 rows, then B / (4 stride)
 * level-2 rows (the pool needs stride a power of two and B a multiple of 4
 * stride: sfw_ckey_rows_per_block); level 1's array starts at block row 0,
 * level 2's at row B / stride of the same array. Chunk j of level `level`
 * (1: ksize, stride; 2: 4 times both), whose last token is e = j * stride +
 * ksize - 1, is then row
 *   tab[e >> shift] * (B / stride + B / (4 stride)) + (e mod B) / stride
 * of its level's array, [rows, nkv, hd] as a contiguous one; tab NULL is a
 * contiguous array (row j). ksize and stride are level 1's. Shifts only:
 * the kernels' loaders call this per key row. */
/* Its pieces (kernels that fetch tab[e >> shift] ahead use them apart):
 * the chunk's last token e, its row within the block, the rows per block. */
static inline SFW_HOSTDEV int64_t sfw_ckey_last(int ksize, int stride, int level, int64_t j)
{
	int lv = level == 2 ? 2 : 0;
	return (j << (sfw_log2i(stride) + lv)) + ((int64_t)ksize << lv) - 1;
}

static inline SFW_HOSTDEV int sfw_ckey_slot(int shift, int stride, int level, int64_t e)
{
	return (int)(e & (((int64_t)1 << shift) - 1)) >> (sfw_log2i(stride) + (level == 2 ? 2 : 0));
}

static inline SFW_HOSTDEV int64_t sfw_ckey_per(int shift, int stride)
{
	int ls = sfw_log2i(stride);
	return ((int64_t)1 << (shift - ls)) + ((int64_t)1 << (shift - ls - 2));
}

static inline SFW_HOSTDEV int64_t sfw_ckey_row(const int32_t *tab, int shift, int ksize, int stride, int level,
					       int64_t j)
{
	if (!tab)
		return j;
	int64_t e = sfw_ckey_last(ksize, stride, level, j);
	return (int64_t)tab[e >> shift] * sfw_ckey_per(shift, stride) + sfw_ckey_slot(shift, stride, level, e);
}

/* Rows per block of a paged cache's compressed keys (both levels), 0 when
 * blocks of 2^shift tokens cannot hold them (stride not a power of two, or
 * the block not a multiple of 4 strides). */
static inline int64_t sfw_ckey_rows_per_block(int shift, int stride)
{
	int64_t B = (int64_t)1 << shift;
	if (stride < 1 || (stride & (stride - 1)) || B % (4 * stride))
		return 0;
	return B / stride + B / (4 * stride);
}

/* ---- the fp8 KV cache (--kv-cache fp8) ----------------------------------
 * A sparse layer's K and V may be stored as OCP FP8 E4M3 ("e4m3fn": bias 7,
 * no infinities, 0x7f/0xff NaN, largest finite 448) with one float32 scale
 * per (token, KV head): a head's hd values x become codes e4m3(x / s),
 * s = amax|x| / 448 (rounded to nearest even; a head whose amax is below
 * 2^-100 stores zeros and s = 0), and read back as e4m3_value(code) * s.
 *
 * Layout: the cache's rows (the token t of a contiguous cache, or the pool
 * row of a paged one: (tab[t >> shift] << shift) + (t mod 2^shift), as for
 * a bf16 cache) are grouped 32 to a group; group G = row >> 5 is
 *   codes [32, nkv, hd] bytes, then scales [32, nkv] float32,
 * SFW_KV8_GROUP_BYTES(nkv, hd) bytes, group after group from the array's
 * start. A 32-row attention tile is then one group; a paged block (2^shift
 * rows, shift >= 5) is 2^(shift - 5) whole groups, so blocks still move as
 * one copy each. Row r's head g: codes at sfw_kv8_codes, scale at
 * sfw_kv8_scale. */
#define SFW_KV8_GROUP 32
static inline SFW_HOSTDEV size_t sfw_kv8_group_bytes(int nkv, int hd)
{
	return (size_t)SFW_KV8_GROUP * (size_t)nkv * ((size_t)hd + 4);
}
/* Bytes of an fp8 cache array holding rows rows (whole groups). */
static inline SFW_HOSTDEV size_t sfw_kv8_bytes(int64_t rows, int nkv, int hd)
{
	return (size_t)((rows + SFW_KV8_GROUP - 1) / SFW_KV8_GROUP) * sfw_kv8_group_bytes(nkv, hd);
}
static inline SFW_HOSTDEV size_t sfw_kv8_codes_off(int64_t row, int g, int nkv, int hd)
{
	return (size_t)(row >> 5) * sfw_kv8_group_bytes(nkv, hd) + ((size_t)(row & 31) * nkv + g) * (size_t)hd;
}
static inline SFW_HOSTDEV size_t sfw_kv8_scale_off(int64_t row, int g, int nkv, int hd)
{
	return (size_t)(row >> 5) * sfw_kv8_group_bytes(nkv, hd) + (size_t)SFW_KV8_GROUP * nkv * hd +
	       ((size_t)(row & 31) * nkv + g) * 4;
}

/* float -> e4m3 code: round to nearest even, |x| >= 448 saturates to 448,
 * NaN stays NaN (0x7f with x's sign). */
static inline SFW_HOSTDEV uint8_t sfw_e4m3_from_f32(float x)
{
	union {
		float f;
		uint32_t u;
	} v = {.f = x};
	uint8_t sign = (uint8_t)((v.u >> 24) & 0x80);
	uint32_t a = v.u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7f;
	if (a >= 0x43e00000u) /* 448 and up (infinity too) */
		return sign | 0x7e;
	if (a < 0x3c800000u) { /* below 2^-6: multiples of 2^-9; 2^23 + y rounds y to an integer, ties to even */
		union {
			uint32_t u;
			float f;
		} m = {.u = a};
		float r = (m.f * 512.0f + 8388608.0f) - 8388608.0f;
		return sign | (uint8_t)r; /* 8 is 2^-6, the least normal: the codes run on */
	}
	/* normal: keep 3 mantissa bits, to nearest even; the exponent rebiased
	 * from 127 to 7 (a carry into the exponent is the right next code) */
	uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1)) >> 20;
	r -= 120u << 3;
	return sign | (uint8_t)(r > 0x7eu ? 0x7eu : r);
}

/* e4m3 code -> float (exact). */
static inline SFW_HOSTDEV float sfw_e4m3_to_f32(uint8_t c)
{
	union {
		uint32_t u;
		float f;
	} v;
	uint32_t e = (c >> 3) & 15, m = c & 7;
	if ((c & 0x7f) == 0x7f)
		v.u = 0x7fc00000u;
	else if (e)
		v.u = ((e + 120) << 23) | (m << 20);
	else
		v.f = (float)m * 0x1p-9f; /* subnormal codes: normal floats */
	v.u |= (uint32_t)(c & 0x80) << 24;
	return v.f;
}

/* Two codes (c2's bits 0-7 and 8-15) as the bits of two IEEE halves (low
 * and high 16 bits) valued code * 2^-8, exactly: a code's 7 magnitude bits
 * under the half's exponent and mantissa fields (e4m3's bias is 7, the
 * half's 15; subnormal codes land on subnormal halves), its sign on bit 15,
 * and a NaN code (0x7f, 0xff) given an all-ones exponent. The CUDA kernels'
 * fp8 decode on devices without the e4m3 conversion instruction (below
 * sm_89: kernels/cuda_common.cuh). */
static inline SFW_HOSTDEV uint32_t sfw_e4m3x2_half_bits(uint32_t c2)
{
	uint32_t w = (c2 & 0xffu) | ((c2 & 0xff00u) << 8); /* one code per 16-bit half */
	uint32_t mag = w & 0x007f007fu;
	uint32_t nan = ((mag + 0x00010001u) & 0x00800080u) >> 7; /* 1 in a half whose code is 0x7f */
	return ((w & 0x00800080u) << 8) | (mag << 7) | nan * 0x7e00u;
}

/* The scale of one head's values (amax = max |x|) and its reciprocal, as
 * the CUDA kernels compute them (IEEE division both). */
static inline SFW_HOSTDEV void sfw_kv8_scale_of(float amax, float *s, float *inv)
{
	if (!(amax >= 0x1p-100f)) { /* zero, tiny or NaN: a zero head */
		*s = 0.0f, *inv = 0.0f;
		return;
	}
	*s = amax / 448.0f;
	*inv = 448.0f / amax;
}

/* T rows of k and v ([T, nkv, hd] float) into an fp8 cache pair at the
 * tokens pos0 .. pos0 + T - 1 (pg: its pages, NULL contiguous): the twin of
 * the CUDA append kernels. */
void sfw_op_kv8_write_cpu(uint8_t *kc, uint8_t *vc, const float *k, const float *v, int T, int nkv, int hd,
			  int64_t pos0, const struct sfw_pages *pg);
/* Tokens t0 .. t1 - 1 of an fp8 cache array, read back as float [t1 - t0,
 * nkv, hd] (the values every fp8 kernel computes with). */
void sfw_op_kv8_read_cpu(float *x, const uint8_t *c, int64_t t0, int64_t t1, int nkv, int hd,
			 const struct sfw_pages *pg);
/* One head's hd values through the cache (quantized and read back), in
 * place: what the CPU backend's fp8 cache keeps (its caches stay float). */
void sfw_op_kv8_round_cpu(float *x, int hd);

/* The lightning layers' q/k norms and RoPE (sfw_op_qk_norm_rope_*): T rows
 * of nhq query and nhk key heads of hd at positions pos0 .., rmsnorm eps,
 * RoPE when rope != 0 with base theta; the norm weights stored as qwdt and
 * kwdt. */
struct sfw_qk_shape {
	int T, nhq, nhk, hd;
	float eps;
	int rope;
	int64_t pos0;
	float theta;
	enum sfw_dtype qwdt, kwdt;
};

/* The fused norms (sfw_op_add_rmsnorm_*, sfw_op_rmsnorm_gate_*): rows rows
 * of n, rmsnorm eps, the weight w [n] stored as wdt. */
struct sfw_norm_shape {
	int rows, n;
	float eps;
	enum sfw_dtype wdt;
};

/* A matrix product y [M, N] = x [M, K] . W[N, K]^T; rows of x and y ldx and
 * ldy elements apart, 0 meaning dense (K, N). The sfw_op_* twins take dense
 * rows (they read M, N, K); the CUDA linears of kernels/ops_cuda.h take
 * strides. */
struct sfw_gemm_shape {
	int M, N, K;
	int ldx, ldy;
};
static inline int sfw_gemm_ldx(const struct sfw_gemm_shape *sh)
{
	return sh->ldx ? sh->ldx : sh->K;
}
static inline int sfw_gemm_ldy(const struct sfw_gemm_shape *sh)
{
	return sh->ldy ? sh->ldy : sh->N;
}

/* An int8 weight W [N, K] (W8A16, num/w8_layout.h), in the twin's memory:
 * W[n, k] = (codes[n * ceil(K/4)*4 + k] - 128) * scales[n, k / group],
 * scales [N, ceil(K/group)] in sdt (BF16, F16 or F32), group = K (or <= 0)
 * for per-channel scales. */
struct sfw_w8 {
	const uint8_t *codes;
	const void *scales;
	enum sfw_dtype sdt;
	int group;
};

/* An attention call (sfw_op_attn_dense_*, sfw_op_attn_sparse_*): T rows at
 * positions pos0 .. pos0 + T - 1 of nh query heads over nkv key heads of
 * hd, scores scaled by scale; sparse: topk selected blocks of `block`
 * tokens per (group, row). */
struct sfw_attn_shape {
	int T, nh, nkv, hd;
	int64_t pos0;
	float scale;
	int topk, block;
};

/* A lightning (simple GLA) call: T rows of nh heads of hd, the output
 * scaled by scale; the chunked form's chunk length (the recurrent form
 * reads no chunk). */
struct sfw_gla_shape {
	int T, nh, hd;
	float scale;
	int chunk;
};
/* nthreads in [1, 256]. */
SFW_MUST_CHECK enum sfw_status sfw_ops_cpu_new(int nthreads, struct sfw_ops_cpu **out, struct sfw_err *err);
void sfw_ops_cpu_free(struct sfw_ops_cpu *ex); /* NULL is a no-op */
/* The threads ex's ops may use; 1 for NULL and for a job view (below). */
int sfw_ops_cpu_threads(const struct sfw_ops_cpu *ex);
/* A CPU op that cannot get its scratch memory leaves its output undefined
 * and raises ex's flag instead of aborting (the ops return void):
 * take_failure returns 1 when some op on ex failed since the last take, and
 * clears it; 0 for NULL. sfwi_ops_cpu_fail raises it (the ops); ex NULL:
 * there is no flag, and it aborts (above). */
int sfw_ops_cpu_take_failure(struct sfw_ops_cpu *ex);
void sfwi_ops_cpu_fail(struct sfw_ops_cpu *ex);
/* The ops' parallel-for: fn over [0, n) in chunks of grain on at most
 * nthreads threads of ex, the calling thread included; inline on the
 * calling thread (tid 0) when ex is NULL or a job view, or nthreads <= 1.
 * What the ranges of a job need of the executor (an op, a nested
 * parallel-for, sfwi_ops_cpu_fail) they are given in the job's own struct
 * as sfwi_ops_cpu_job(ex), never ex itself: the job view, with ex's flag
 * and options and no threads, so a parallel-for inside a job runs inline
 * (ex's pool is busy with the job: waiting for it would never end). */
void sfwi_ops_cpu_for(struct sfw_ops_cpu *ex, int nthreads, size_t n, size_t grain,
		      void (*fn)(void *, size_t, size_t, int), void *ctx);
struct sfw_ops_cpu *sfwi_ops_cpu_job(struct sfw_ops_cpu *ex); /* NULL for NULL */
/* Tests: on = 1 makes ex's int8 matmuls (kernels/matmul_w8.c; its job view
 * too) take the generic path where the AVX2 one would run (the same bits,
 * by design); ex not NULL. sfwi_ops_cpu_w8_generic reads it (0 for NULL). */
void sfwi_op_matmul_w8_generic(struct sfw_ops_cpu *ex, int on);
int sfwi_ops_cpu_w8_generic(const struct sfw_ops_cpu *ex);

/* ---- elementwise and norms (kernels/elementwise.c) ------------------------ */

/* x[t, :] = E[ids[t], :] * scale  (E [vocab, D]; ids already range-checked). */
void sfw_op_embed_cpu(float *x, const void *E, enum sfw_dtype edt, const int32_t *ids, int T, int D,
		      float scale);
/* y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w  for r < rows; w [n]
 * shared by all rows, so per-head q/k norm is rows = T*nh, n = hd and the
 * lightning o_norm is rows = T, n = nh*hd. y may alias x. */
void sfw_op_rmsnorm_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
			int rows, int n, float eps);
/* x[i] += scale * b[i]  (the scaled residual branch, docs/model-spec.md §2.3). */
void sfw_op_add_scaled_cpu(float *x, const float *b, size_t n, float scale);
/* y[i] = silu(gate[i]) * up[i]  (SwiGLU). y may alias gate or up. */
void sfw_op_silu_mul_cpu(float *y, const float *gate, const float *up, size_t n);
/* y[i] = x[i] * sigmoid(gate[i])  (sparse o_gate, lightning z gate). y may alias x. */
void sfw_op_sigmoid_mul_cpu(float *y, const float *x, const float *gate, size_t n);
/* In place NeoX ("rotate half") RoPE on x [T, nh, hd], row t at position
 * pos0 + t: inv_freq_m = 1 / theta^(2m/hd) (float32), angle = float(p) * inv_freq_m,
 * x' = x*cos + rotate_half(x)*sin, rotate_half(x) = [-x[hd/2:], x[:hd/2]]. */
void sfw_op_rope_neox_cpu(float *x, int T, int nh, int hd, int64_t pos0, float theta);
/* Fused (kernels/fused.c): x[r, :] += scale * b[r, :], then y = rmsnorm(x)
 * with w, exactly add_scaled followed by rmsnorm. y must not alias x or b. */
void sfw_op_add_rmsnorm_cpu(struct sfw_ops_cpu *ex, float *y, float *x, const float *b, float scale, const void *w,
			    const struct sfw_norm_shape *sh);
/* Fused (kernels/fused.c): y = rmsnorm(x) with w, then y *= sigmoid(z)
 * (the Lightning output norm and gate, docs/model-spec.md §2.7 step 5),
 * exactly rmsnorm followed by sigmoid_mul. y may alias x, not z. */
void sfw_op_rmsnorm_gate_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, const float *z,
			     const struct sfw_norm_shape *sh);
/* Fused (kernels/fused.c): the lightning layers' per-head q/k norm and RoPE
 * (docs/model-spec.md §2.7 steps 2-3) in place on q [T, nhq, hd] and k [T, nhk, hd]:
 * q = rmsnorm(q) with qw [hd] and k = rmsnorm(k) with kw [hd] per head
 * (rows T*nhq and T*nhk, n = hd; qw or kw NULL: that norm is left out),
 * then, when rope != 0, NeoX RoPE on both from pos0: exactly
 * sfw_op_rmsnorm_cpu then sfw_op_rope_neox_cpu. */
void sfw_op_qk_norm_rope_cpu(struct sfw_ops_cpu *ex, float *q, float *k, const void *qw, const void *kw,
			     const struct sfw_qk_shape *sh);

/* ---- matrix products (kernels/matmul.c) ----------------------------------- */

/* y[M, N] = x[M, K] . W[N, K]^T ; W bf16 or f32. M == 1 is the decode GEMV. */
void sfw_op_matmul_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
		       int M, int N, int K);
/* logits[M, N] = (x[M, K] * in_scale) . W^T ; in_scale = 1/(hidden/dim_model_base). */
void sfw_op_logits_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const void *w, enum sfw_dtype wdt,
		       const struct sfw_gemm_shape *sh, float in_scale);

/* y[M, N] = x[M, K] . W^T with W int8 (W8A16, kernels/matmul_w8.c; the
 * layout of struct sfw_w8). Dequantized on the fly, fp32 accumulation. */
void sfw_op_matmul_w8_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh);
/* The decode MLP's SwiGLU over an int8 merged gate|up [2N, K] (one token):
 * y[N] = silu(g)·u with g, u the halves of x·Wᵀ, as sfw_op_matmul_w8_cpu
 * followed by sfw_op_silu_mul_cpu (the C twin of sfw_op_matmul_silu_w8_cuda). */
void sfw_op_matmul_silu_w8_cpu(struct sfw_ops_cpu *ex, float *y, const float *x, const struct sfw_w8 *w, int N, int K);

/* ---- lightning attention: simple GLA, fp32 state (kernels/lightning.c) ---- */

/* Per head h: S_h <- exp(-decay[h]) * S_h + k_t^T v_t ; o_t = scale * q_t S_h
 * (current token included), for t = 0..T-1 in order. q, k, v, o [T, nh, hd]
 * (struct sfw_gla_shape); state [nh, hd, hd] is updated in place.
 * decay[h] = slope_h > 0. */
void sfw_op_gla_recurrent_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *k, const float *v, float *state,
			      const float *decay, const struct sfw_gla_shape *sh);
/* The same result computed in chunks of sh->chunk tokens (64 as fla): intra-chunk
 * causal (q.k) with decay weights plus the inter-chunk state term. */
void sfw_op_gla_chunked_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *k, const float *v, float *state,
			    const float *decay, const struct sfw_gla_shape *sh);

/* ---- attention (kernels/attention.c) -------------------------------------- */

/* Dense causal GQA (struct sfw_attn_shape): o[r, h] = softmax_j(scale *
 * q[r,h].K[j,g]) V[j,g] over j <= pos0 + r, g = h / (nh/nkv).
 * kc, vc [>= pos0+T, nkv, hd]. */
void sfw_op_attn_dense_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *kc, const float *vc,
			   const struct sfw_attn_shape *sh);
/* Block-sparse causal GQA: as dense, but row r / head h (group g) sees only
 * the keys of blocks idx[g, r, 0..k-1] (k = topk; block b = tokens
 * [b*block, b*block+block-1], -1 = skipped; any other entry is a block of
 * the cache, b*block < pos0 + T) with key position <= pos0 + r.
 * idx [nkv, T, k]. */
void sfw_op_attn_sparse_cpu(struct sfw_ops_cpu *ex, float *o, const float *q, const float *kc, const float *vc, const int32_t *idx,
			    const struct sfw_attn_shape *sh);

/* ---- InfLLM-v2 block selection (kernels/infllm.c) ------------------------- */

/* Mean-pooled key compression: c[j] = mean(k[j*stride .. j*stride+ksize-1])
 * for chunks j in [j0, j1) (the caller guarantees j1*stride+ksize-1 < len(k)).
 * k [len, nkv, hd] -> c [n, nkv, hd]. Level 1: sh's ksize and stride (32,
 * 16); level 2: 4 times both (128, 64; 4x level 1, hard-coded in the
 * reference). Reads sh's nkv, hd, ksize, stride. Incremental decode passes
 * j0 = the chunks already made. pg (NULL: contiguous) pages c, the level's
 * base (sfw_ckey_row); k stays [len, nkv, hd]. */
void sfw_op_compress_cpu(float *c, const float *k, int level, int64_t j0, int64_t j1,
			 const struct sfw_sel_shape *sh, const struct sfw_pages *pg);
/* Stage-1 scores, docs/model-spec.md §2.6.4 steps 1-3. For row r (position p = pos0+r)
 * and KV group g:
 *   LSE_h = log sum_{j2 : j2*4*stride + 4*ksize - 1 <= p} exp(scale * q[r,h].c2[j2,g])
 *   s[g, r, j] = sum_{h in group g} exp(scale * q[r,h].c1[j,g] - LSE_h)
 *                for j*stride + ksize - 1 <= p, else 0 (NaN -> 0).
 * c1 [n1, nkv, hd], c2 [n2, nkv, hd] (sh's n1, n2), or paged by pg
 * (sfw_ckey_row; NULL: contiguous); scores [nkv, T, n1].
 * The reference kernel's causal-offset quirk for call
 * lengths = 15 (mod 16) / 63 (mod 64) (docs/model-spec.md §2.6.6, derived by reading,
 * not run) is not reproduced: every row sees exactly the chunks above. */
void sfw_op_stage1_cpu(struct sfw_ops_cpu *ex, float *scores, const float *q, const float *c1, const float *c2,
		       const struct sfw_sel_shape *sh, const struct sfw_pages *pg);
/* Max-pool to blocks, §2.6.4 step 4: pooled[g, r, b] for b < nblocks =
 * +inf if b < init_blocks or qb - local_blocks <= b <= qb (qb = p / block);
 * else the max of scores[g, r, j] over the level-1 chunks j < n1 that overlap
 * block b; -inf if there are none. pooled [nkv, T, nblocks]. */
void sfw_op_pool_blocks_cpu(float *pooled, const float *scores, const struct sfw_sel_shape *sh);
/* Top-k, §2.6.4 step 5: per (g, r), the indices of the min(k, nblocks) largest
 * pooled values (k = topk; ties -> lower index), sorted ascending, then every
 * index > qb replaced by -1 in place; slots past min(k, nblocks) are -1.
 * idx [nkv, T, k]. Reads sh's T, nkv, pos0, block, nblocks, topk. */
void sfw_op_topk_blocks_cpu(struct sfw_ops_cpu *ex, int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh);

/* ---- sampling (kernels/sample.c, kernels/sample.cu) ----------------------- */

/* The meaning of runner/sampler.h (top-k, then top-p at temperature 1
 * renormalised over the survivors, then a draw at the temperature; greedy or
 * temperature 0 = argmax, lowest id on ties; NaN never chosen; the first
 * +inf wins) with the uniform u in [0, 1) as an input, so the CPU and CUDA
 * twins can be compared exactly; the host sampler (runner/sampler.c) is
 * this CPU twin fed its own uniform stream. The draw walks the survivors in
 * id order when nothing was cut (top_k off or >= candidates, top_p 1), else
 * best first; sums are in double over SFWS_THREADS contiguous chunks
 * (kernels/sample_twin.h), as the CUDA kernel makes them. */
struct sfw_sample_adj;
struct sfw_sample_lp;
struct sfw_op_sample_params {
	float temperature; /* >= 0; 0 means greedy */
	int top_k;         /* 0 = off */
	float top_p;       /* (0, 1]; 1 = off */
	int greedy;        /* 1 = argmax, ignores the rest */
	/* The additions below are off when zero (a struct written {T, k, p, g}
	 * means what it meant). min_p: after top-k and top-p, the survivors
	 * whose weight at temperature 1 relative to the best, sfws_exp(l - max),
	 * is below min_p are cut (llama.cpp's order). */
	float min_p; /* [0, 1]; 0 = off */
	/* Penalties and biases, applied to the logits before everything else,
	 * for the n_adj entries (distinct ids; host memory): l' = (seen ? (l > 0
	 * ? l / rep : l * rep) : l) - count * frequency - (count > 0) * presence
	 * + bias, rep = repetition_penalty (0 or 1 = off). vLLM's meaning:
	 * `seen` = in the prompt or the output, `count` = times in the output. */
	float repetition_penalty, presence_penalty, frequency_penalty;
	const struct sfw_sample_adj *adj;
	int n_adj;
	/* logprobs: non-NULL asks for the chosen token's log-probability and the
	 * top_logprobs (0 .. SFW_SAMPLE_TOP_MAX) most probable tokens' under the
	 * distribution the draw is made from (struct sfw_sample_lp, written by
	 * the choice; host memory). */
	struct sfw_sample_lp *logprobs;
	int top_logprobs;
};
struct sfw_sample_adj {
	int32_t id;
	int32_t count; /* times in the output */
	int32_t seen;  /* 1: in the prompt or the output */
	float bias;    /* added (logit_bias) */
};
#define SFW_SAMPLE_TOP_MAX 20
/* The distribution a choice is drawn from: the candidates that survive the
 * penalties, top-k, top-p and min-p, weighted sfws_exp((l - max) / T) and
 * renormalised; a greedy choice (or temperature 0) reports the same
 * survivors at temperature 1. logprob: the chosen token's; top: the n_top
 * best survivors (larger logit first, lower id on ties). */
struct sfw_sample_lp {
	float logprob;
	int n_top;
	int32_t top_id[SFW_SAMPLE_TOP_MAX];
	float top_logprob[SFW_SAMPLE_TOP_MAX];
};
/* The chosen id, or -1 when the op's scratch cannot be had (ex's flag raised
 * too; ex NULL is allowed: the -1 is the whole report). */
int32_t sfw_op_sample_cpu(struct sfw_ops_cpu *ex, const float *logits, int V,
			  const struct sfw_op_sample_params *p, double u);
/* The sampler's uniform stream, the one xoshiro256**: the next 53-bit
 * uniform of state rng[4] (struct sfw_sampler's rng). */
double sfw_op_sample_uniform(uint64_t rng[4]);

#ifdef SFW_HAVE_CUDA
/* CUDA twins (kernels/<family>.cu), same meaning; see the top comment. */
void sfw_op_embed_cuda(void *x, const void *E, enum sfw_dtype edt, const int32_t *ids, int T, int D,
		       float scale, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_rmsnorm_cuda(void *y, const void *x, const void *w, enum sfw_dtype wdt, int rows, int n,
			 float eps, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_add_scaled_cuda(void *x, const void *b, size_t n, float scale, enum sfw_dtype act,
			    struct sfw_cuda_ctx *cx);
void sfw_op_silu_mul_cuda(void *y, const void *gate, const void *up, size_t n, enum sfw_dtype act,
			  struct sfw_cuda_ctx *cx);
void sfw_op_sigmoid_mul_cuda(void *y, const void *x, const void *gate, size_t n, enum sfw_dtype act,
			     struct sfw_cuda_ctx *cx);
void sfw_op_rope_neox_cuda(void *x, int T, int nh, int hd, int64_t pos0, float theta, enum sfw_dtype act,
			   struct sfw_cuda_ctx *cx);
/* kernels/fused.cu: one kernel for few wide rows (decode), bit-identical to
 * sfw_op_add_scaled_cuda + sfw_op_rmsnorm_cuda (the two launches otherwise). */
/* kernels/sample.cu: one block; writes the id to *out (device), or -1 when
 * the host must finish (top_k > SFWS_MAX_SORT, or a nucleus wider than
 * that): then sfw_op_sample_cpu on the same logits gives the answer. */
void sfw_op_sample_cuda(int32_t *out, const float *logits, int V, const struct sfw_op_sample_params *p, double u,
			struct sfw_cuda_ctx *cx);
void sfw_op_add_rmsnorm_cuda(void *y, void *x, const void *b, float scale, const void *w,
			     const struct sfw_norm_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* kernels/fused.cu: one kernel for few wide rows (decode), bit-identical to
 * sfw_op_rmsnorm_cuda + sfw_op_sigmoid_mul_cuda (the two launches otherwise). */
void sfw_op_rmsnorm_gate_cuda(void *y, const void *x, const void *w, const void *z,
			      const struct sfw_norm_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* kernels/fused.cu: one launch for q and k, bit-identical to
 * sfw_op_rmsnorm_cuda on each followed by sfw_op_rope_neox_cuda on each
 * (hd 32, 64, 128; other head dims take those unfused launches). */
void sfw_op_qk_norm_rope_cuda(void *q, void *k, const void *qw, const void *kw, const struct sfw_qk_shape *sh,
			      enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* w must not be written by the kernel just before (the GEMV streams it
 * before the programmatic-launch wait: kernels/ops_cuda.h, sfw_cuda_gemv). */
void sfw_op_matmul_cuda(void *y, const void *x, const void *w, enum sfw_dtype wdt, int M, int N, int K,
			enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_logits_cuda(float *y, const void *x, const void *w, enum sfw_dtype wdt,
			const struct sfw_gemm_shape *sh, float in_scale, enum sfw_dtype act,
			struct sfw_cuda_ctx *cx);
/* sfw_op_matmul_w8_cpu with bf16 activations (kernels/linear_w8.cu; act F32
 * runs a plain warp-per-output kernel): M <= 8 a GEMV over the codes and
 * scales, M > 8 dequantization to bf16 slabs in the op scratch + cuBLASLt.
 * codes and scales are device copies in the layout of num/w8_layout.h. */
void sfw_op_matmul_w8_cuda(void *y, const void *x, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh,
			   enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* The decode MLP's SwiGLU in the int8 GEMV (M = 1, bf16 activations, BF16
 * scales, K and the group multiples of 16, 16-byte aligned codes and x):
 * codes/scales hold the merged gate|up [2N, K]; y[N] = silu(g)·u with g, u
 * the two halves of x·Wᵀ, each rounded to bf16 first: bit-equal to
 * sfw_op_matmul_w8_cuda into [2N] followed by sfw_op_silu_mul_cuda (the
 * default gate|up variant), twin sfw_op_matmul_silu_w8_cpu. Returns 0 (nothing
 * launched) for shapes it does not take. */
int sfw_op_matmul_silu_w8_cuda(void *y, const void *x, const struct sfw_w8 *w, int N, int K,
			       struct sfw_cuda_ctx *cx);
/* The same SwiGLU over M rows, y[M, N], on tensor cores (kernels/linear_w8_mma.h,
 * fused epilogue), for the row counts where that kernel wins (3 to 64); twin:
 * sfw_op_matmul_silu_w8_cpu per row. Returns 0 (nothing launched) otherwise. */
int sfw_op_swiglu_w8_cuda(void *y, const void *x, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh,
			  struct sfw_cuda_ctx *cx);
/* Logits with an int8 lm_head (third-party checkpoints): y = bf16-rounded
 * in_scale * x . W^T as float, like sfw_op_logits_cuda (act BF16 only). */
void sfw_op_logits_w8_cuda(float *y, const void *x, const struct sfw_w8 *w, const struct sfw_gemm_shape *sh,
			   float in_scale, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_gla_recurrent_cuda(void *o, const void *q, const void *k, const void *v, float *state,
			       const float *decay, const struct sfw_gla_shape *sh, enum sfw_dtype act,
			       struct sfw_cuda_ctx *cx);
void sfw_op_gla_chunked_cuda(void *o, const void *q, const void *k, const void *v, float *state,
			     const float *decay, const struct sfw_gla_shape *sh, enum sfw_dtype act,
			     struct sfw_cuda_ctx *cx);
void sfw_op_attn_dense_cuda(void *o, const void *q, const void *kc, const void *vc,
			    const struct sfw_attn_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_attn_sparse_cuda(void *o, const void *q, const void *kc, const void *vc, const int32_t *idx,
			     const struct sfw_attn_shape *sh, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_compress_cuda(void *c, const void *k, int level, int64_t j0, int64_t j1,
			  const struct sfw_sel_shape *sh, const struct sfw_pages *pg, enum sfw_dtype act,
			  struct sfw_cuda_ctx *cx);
/* The selection twins take counts (n1, n2, nblocks) that one cache length
 * gives, as the engine's always are: their kernels derive the counts from a
 * length (kernels/ops_cuda.h, struct sfw_cuda_rowref); other counts abort
 * with a message. */
void sfw_op_stage1_cuda(float *scores, const void *q, const void *c1, const void *c2,
			const struct sfw_sel_shape *sh, const struct sfw_pages *pg, enum sfw_dtype act,
			struct sfw_cuda_ctx *cx);
void sfw_op_pool_blocks_cuda(float *pooled, const float *scores, const struct sfw_sel_shape *sh,
			     enum sfw_dtype act, struct sfw_cuda_ctx *cx);
void sfw_op_topk_blocks_cuda(int32_t *idx, const float *pooled, const struct sfw_sel_shape *sh,
			     enum sfw_dtype act, struct sfw_cuda_ctx *cx);
#endif

#endif
