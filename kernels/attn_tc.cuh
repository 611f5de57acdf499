/* attn_tc.cuh - tensor-core (sm_80+ mma.sync m16n8k16 bf16, fp32 accumulate)
 * building blocks shared by the tensor-core attention (kernels/attn_tc.cu),
 * stage-1 scoring (kernels/attn_tc_stage1.cu, attn_tc_stage1_dec.cu), the
 * Lightning prefill (kernels/lightning.cu) and the int8 linears (tc_mma,
 * through kernels/w8_bits.cuh), and the run-time switch between the
 * attention kernels and the CUDA-core ones.
 *
 * Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 * (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
 * with gid = lane >> 2 (groupID) and tq = lane & 3 (threadID_in_group); a
 * .b32 register holding two bf16 keeps the lower column/row index in its low
 * 16 bits:
 *   A (16x16, row-major, 4 regs):  a[0] = A[gid  ][2tq, 2tq+1]
 *                                  a[1] = A[gid+8][2tq, 2tq+1]
 *                                  a[2] = A[gid  ][2tq+8, 2tq+9]
 *                                  a[3] = A[gid+8][2tq+8, 2tq+9]
 *   B (16x8, "col" = K-major, 2 regs): b[0] = B[2tq, 2tq+1][gid]
 *                                      b[1] = B[2tq+8, 2tq+9][gid]
 *   C/D (16x8 f32, 4 regs): c[0], c[1] = C[gid  ][2tq], C[gid  ][2tq+1]
 *                           c[2], c[3] = C[gid+8][2tq], C[gid+8][2tq+1]
 * ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the 8 row addresses (16 bytes
 * each) of matrix i; every lane gets register i = matrix i [lane>>2][2(lane&3),
 * +1] (a row pair of two consecutive elements); with .trans it gets
 * matrix i [2(lane&3), +1][lane>>2] (two consecutive rows of one column).
 * So for a row-major tile X[row][col] in shared memory:
 *   - an A fragment of rows R..R+15, cols C..C+15 is ldmatrix.x4 with lane l
 *     pointing at X[R + (l&7) + ((l>>3)&1)*8][C + (l>>4)*8];
 *   - B = Xᵀ (X stored [n][k], e.g. K [key][dim] for Q·Kᵀ): for keys N..N+15,
 *     dims C..C+15, lane l points at X[N + (l&7) + (l>>4)*8][C + ((l>>3)&1)*8]
 *     and gets {b[0], b[1]} of n-tile N..N+7 in r[0], r[1] and of n-tile
 *     N+8..N+15 in r[2], r[3];
 *   - B = X (X stored [k][n], e.g. V [key][dim] for P·V) via .trans: for keys
 *     K..K+15, dims D..D+15, lane l points at X[K + (l&7) + ((l>>3)&1)*8][D +
 *     (l>>4)*8] and gets {b[0], b[1]} of n-tile D..D+7 in r[0], r[1] and of
 *     D+8..D+15 in r[2], r[3].
 * The accumulator C of Q·Kᵀ (rows = heads, cols = keys) becomes the A operand
 * of P·V without moving data: for keys 16s..16s+15, a[0] = pack(c(2s)[0..1]),
 * a[1] = pack(c(2s)[2..3]), a[2] = pack(c(2s+1)[0..1]), a[3] = pack(c(2s+1)[2..3]). */
#ifndef SFW_ATTN_TC_CUH
#define SFW_ATTN_TC_CUH

#include "cuda_act.cuh"

#include <string.h>

static __device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	asm volatile(
	    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x in one MUFU instruction (exp2f adds a range fix-up for results
 * below 2^-126: four more instructions per element); such results flush to
 * 0, which a score or probability of 1e-38 or less is taken to be. */
static __device__ __forceinline__ float tc_ex2(float x)
{
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

static __device__ __forceinline__ uint32_t tc_smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void tc_ldsm_x4(uint32_t r[4], const void *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(tc_smem_addr(p))
		     : "memory");
}

static __device__ __forceinline__ void tc_ldsm_x4_trans(uint32_t r[4], const void *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(tc_smem_addr(p))
		     : "memory");
}

/* 16-byte global -> shared copy; bytes = 0 writes zeros (no global read). */
static __device__ __forceinline__ void tc_cp16(void *dst, const void *src, int bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(tc_smem_addr(dst)), "l"(src),
		     "r"(bytes)
		     : "memory");
}
/* 4-byte global -> shared copy (through L1: .cg takes 16 bytes only);
 * bytes = 0 writes zeros. */
static __device__ __forceinline__ void tc_cp4(void *dst, const void *src, int bytes)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(tc_smem_addr(dst)), "l"(src), "r"(bytes)
		     : "memory");
}
static __device__ __forceinline__ void tc_cp_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void tc_cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Two floats -> bf16x2 (round to nearest even, as sfwc_tobf), lo in the low half. */
static __device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *reinterpret_cast<uint32_t *>(&v);
}

/* Two fp32 values as a sum of two bf16x2 words (lo in the low halves, as
 * tc_pack): *hi = bf16(x), *lo = bf16(x - hi), x - hi being exact. hi + lo
 * keeps 16 significant bits: |x - hi - lo| <= 2^-16 |x|, against 2^-8 for hi
 * alone, so two MMAs (hi y + lo y, y an exact bf16 operand) give an fp32
 * operand's product to about 2^-16 relative (kernels/lightning.cu). */
static __device__ __forceinline__ void tc_split(float x, float y, uint32_t *hi, uint32_t *lo)
{
	uint32_t h = tc_pack(x, y);
	*hi = h;
	*lo = tc_pack(x - __uint_as_float(h << 16), y - __uint_as_float(h & 0xffff0000u));
}

/* Q of warp row r as A fragments (zeros when the row is inactive): rows =
 * the G heads g*G + m of one KV group (rows >= G zero), cols = head dims. */
template <int HD>
static __device__ __forceinline__ void tc_load_q(uint32_t (&qa)[HD / 16][4], const uint16_t *q, bool active,
						 int r, int nh, int g, int G, int lane)
{
	const int gid = lane >> 2, tq = lane & 3;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int row = gid + (i & 1) * 8, col = kk * 16 + tq * 2 + (i >> 1) * 8;
			qa[kk][i] =
			    active && row < G
				? *(const uint32_t *)(q + ((size_t)r * nh + (size_t)g * G + row) * HD + col)
				: 0u;
		}
}

/* s += Q Kᵀ over one 64-key tile Ks [64][HD + 8] in shared memory: 8
 * n-tiles of 8 keys, the m16 A fragments qa (tc_load_q). */
template <int HD>
static __device__ __forceinline__ void tc_qk_tile(float (&s)[8][4], const uint32_t (&qa)[HD / 16][4],
						  const uint16_t *Ks, int lane)
{
	constexpr int LD = HD + 8;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
		for (int np = 0; np < 4; np++) {
			uint32_t bf[4];
			tc_ldsm_x4(bf, Ks + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
					   ((lane >> 3) & 1) * 8);
			tc_mma(s[2 * np], qa[kk], bf[0], bf[1]);
			tc_mma(s[2 * np + 1], qa[kk], bf[2], bf[3]);
		}
}

/* Run-time choice between the tensor-core kernels and the CUDA-core ones,
 * from the op's struct sfw_cuda_ctx (ops_cuda.h): its attn (dense +
 * block-sparse attention) or stage1 member, 1 = always the CUDA-core
 * kernels, 2 = tensor cores for every shape they support (tests), 0 = auto
 * (tensor cores for supported prefill-sized calls, and stage 1 of decode
 * rows). */
enum tc_mode { TC_SIMT = 0, TC_AUTO = 1, TC_FORCE = 2 };
static inline enum tc_mode tc_mode_of(int cfg_mode)
{
	return cfg_mode == 1 ? TC_SIMT : cfg_mode == 2 ? TC_FORCE : TC_AUTO;
}

/* The compressed keys (chunks of ksize tokens, stride apart, n made) that
 * position p sees: those whose chunk ends at or before p. */
static __device__ __forceinline__ int64_t tc_visible(int64_t p, int64_t n, int ksize, int stride)
{
	if (p < ksize - 1)
		return 0;
	int64_t v = (p - (ksize - 1)) / stride + 1;
	return v < n ? v : n;
}

/* Where stage 1 finds paged compressed keys (sfw_ckey_row, kernels/ops.h):
 * the block table, or (ptab non-NULL) *ptab read when the kernel runs (a
 * recorded row's slot); both NULL: contiguous. */
struct sfwi_ckpages {
	const int32_t *tab;
	const int32_t *const *ptab;
	int shift;
};
/* Tensor-core twins (bf16 activations only). Each returns 1 when it took the
 * call, 0 when the shape or the mode says the CUDA-core kernel should run. */
/* Attention (sfw_cuda_attn_dense / _sparse: idx NULL is dense) over the
 * caches kv as given (paged by kv->pg; bf16, or fp8 with kv->kv8); row 0 at
 * position *dpos, sh->pos0 + T bounding the positions. */
int sfwi_attn_tc(void *o, const void *q, const struct sfw_cuda_kv *kv, const int32_t *idx,
		 const struct sfw_attn_shape *sh, const int64_t *dpos, enum sfw_dtype act, struct sfw_cuda_ctx *cx);
/* Stage 1 (sfw_cuda_stage1) on tensor cores; rr (required: the rows and
 * counts, struct sfwc_selpos) and ck say where the rows and the compressed
 * keys are; sh's n1 and n2 bound the counts. */
int sfwi_stage1_tc(float *scores, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
		   const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, enum sfw_dtype act,
		   struct sfw_cuda_ctx *cx);
/* Stage 1 of T <= S1D_MAXT decode rows (kernels/attn_tc_stage1_dec.cu):
 * sfwi_stage1_tc's form for them, with its checks and arguments. */
#define S1D_MAXT 16
int sfwi_stage1_tc_rows(float *scores, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
			const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, struct sfw_cuda_ctx *cx);
/* Stage 1 with the max-pool to blocks in the prefill kernel
 * (sfw_cuda_stage1_pool): sfwi_stage1_tc_pools says whether it takes sh
 * (0: no; else the rows one wave of its CTAs holds on this device). */
int sfwi_stage1_tc_pools(const struct sfw_sel_shape *sh, enum sfw_dtype act, const struct sfw_cuda_ctx *cx);
int sfwi_stage1_tc_pool(float *pooled, const void *q, const void *c1, const void *c2, const struct sfw_sel_shape *sh,
			const struct sfw_cuda_rowref *rr, const struct sfwi_ckpages *ck, enum sfw_dtype act,
			struct sfw_cuda_ctx *cx);

#endif
