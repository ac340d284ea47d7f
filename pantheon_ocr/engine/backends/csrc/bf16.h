/* Helpers of the row kernels (rows.c, int8_rows.c): how many threads a call's rows take and, with
 * AVX-512, a tail mask, bfloat16 loads and stores through float32 lanes, and the SwiGLU's silu
 * (compiled.py hashes the headers beside a source into its library's name, so a change here builds
 * them anew). */
#ifndef PANTHEON_BF16_H
#define PANTHEON_BF16_H
#include <stdint.h>

#define MAX_THREADS 64
#define SHARE 16 /* rows worth a second thread: a chunk's rows are, a decode step's few are not */

static inline int threads_for(int64_t rows, int threads) {
    if (threads < 2 || rows < 2 * SHARE) return 1;
    return threads > MAX_THREADS ? MAX_THREADS : threads;
}

#ifdef __AVX512F__
#include <immintrin.h>
#include "exp16.h"

static inline __mmask16 tail(int64_t n, int64_t i) {
    return n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
}

/* bfloat16 [16] at p (its first n) as float32 lanes: the bits shifted up */
static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* float32 lanes rounded to bfloat16 (to nearest, ties to even, as torch's .to(torch.bfloat16); a NaN
 * stays a quiet NaN) and stored to the lanes of m */
static inline void store_bf16(uint16_t *p, __mmask16 m, __m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    u = _mm512_mask_mov_epi32(u, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(u));
}

/* silu(g) = g / (1 + e^-g) of 16 floats (the SwiGLUs' gate) */
static inline __m512 silu16(__m512 g) {
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

#endif /* __AVX512F__ */
#endif
