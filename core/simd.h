/* simd.h - the one way this project builds wider loops: SFW_CLONES before a
 * function makes GCC build it twice, for AVX2 and for the x86-64 baseline,
 * and pick one at load time by the CPU's features (target_clones "avx2";
 * "arch=haswell" left the build machine's AMD EPYC, which has AVX2, on the
 * baseline: it picks by CPU model). The clones run the same operations in
 * the same order (-std=c11 contracts nothing into FMA, and AVX2 alone
 * enables none), so they give the same bits. Nothing elsewhere (clang, sanitizers, other
 * architectures). Include it in .c files only. */
#ifndef SFW_SIMD_H
#define SFW_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SFW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SFW_CLONES
#endif

/* 8-wide vectors of GCC's vector extension never cross a non-inlined call
 * boundary in this project: no ABI concern. */
#pragma GCC diagnostic ignored "-Wpsabi"

#endif
