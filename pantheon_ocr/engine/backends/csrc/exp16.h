/* e^x for 16 floats, for the AVX-512 kernels of bf16_attention.c and rows.c (compiled.py hashes the
 * headers beside a source into its library's name, so a change here builds both anew).
 *
 * x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by a degree-6 Taylor polynomial, times 2^n
 * (vscalefps: infinite past float32's range, as expf), within 2 float32 ulps of expf; 0 below -87.3
 * (where expf's results are subnormal: a masked key's weight is exactly 0, as torch's). Its own
 * target, so that a file built without AVX-512 flags can still call it from functions that have them. */
#ifndef PANTHEON_EXP16_H
#define PANTHEON_EXP16_H
#include <immintrin.h>

__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), hi = _mm512_set1_ps(0.693359375f),
                 lo = _mm512_set1_ps(-2.12194440e-4f), floor = _mm512_set1_ps(-87.3f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, floor, _CMP_GE_OQ);
    x = _mm512_max_ps(x, floor);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, hi, x);
    r = _mm512_fnmadd_ps(n, lo, r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

#endif
