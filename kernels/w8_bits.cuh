/* w8_bits.cuh - int8 codes (W8A16, num/w8_layout.h: w = (b - 128) * scale)
 * into bf16 registers for the tensor cores (tc_mma, kernels/attn_tc.cuh,
 * takes them), shared by the int8 GEMM
 * (kernels/linear_w8_mma.cu) and the tensor-core decode GEMV
 * (kernels/linear_w8.cu). */
#ifndef SFW_W8_BITS_CUH
#define SFW_W8_BITS_CUH

#include "attn_tc.cuh" /* tc_mma */

#include <cuda_bf16.h>
#include <stdint.h>

/* (a & b) | c and (a & b) ^ c in one LOP3 each: with the constants in
 * registers (the "r" operands), not as immediates, of which an instruction
 * takes one (written in C, each is two LOP3s). */
static __device__ __forceinline__ uint32_t w8_and_or(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t d;
	asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}
static __device__ __forceinline__ uint32_t w8_and_xor(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t d;
	asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}

/* The constants of w8_codes4_bf, once in registers. */
struct w8_bfk {
	uint32_t m7f, c43, m80, c4380;
};
static __device__ __forceinline__ w8_bfk w8_bfk_make(void)
{
	w8_bfk k;
	/* through a volatile move, so that the compiler keeps them in registers */
	asm volatile("mov.b32 %0, 0x007f007f;\n" : "=r"(k.m7f));
	asm volatile("mov.b32 %0, 0x43004300;\n" : "=r"(k.c43));
	asm volatile("mov.b32 %0, 0x00800080;\n" : "=r"(k.m80));
	asm volatile("mov.b32 %0, 0x43804380;\n" : "=r"(k.c4380));
	return k;
}

/* Four codes (bytes of w, k ascending) as the exact bf16 values b - 128,
 * two bf16x2 registers: lo = codes 0, 1; hi = codes 2, 3. The low 7 bits
 * under the exponent of 2^7 give 128 + (b & 127); minus 128 where bit 7 is
 * set, else minus 256: small integers, so the subtraction is exact. Eight
 * instructions (two byte permutes, four LOP3, two HSUB2). */
static __device__ __forceinline__ void w8_codes4_bf(uint32_t w, const w8_bfk &k, uint32_t &lo, uint32_t &hi)
{
	uint32_t v0 = __byte_perm(w, 0, 0x4140), v1 = __byte_perm(w, 0, 0x4342); /* bytes to 16-bit lanes */
	uint32_t x0 = w8_and_or(v0, k.m7f, k.c43), c0 = w8_and_xor(v0, k.m80, k.c4380);
	uint32_t x1 = w8_and_or(v1, k.m7f, k.c43), c1 = w8_and_xor(v1, k.m80, k.c4380);
	__nv_bfloat162 q0 = __hsub2(*(__nv_bfloat162 *)&x0, *(__nv_bfloat162 *)&c0);
	__nv_bfloat162 q1 = __hsub2(*(__nv_bfloat162 *)&x1, *(__nv_bfloat162 *)&c1);
	lo = *(uint32_t *)&q0;
	hi = *(uint32_t *)&q1;
}

#endif
