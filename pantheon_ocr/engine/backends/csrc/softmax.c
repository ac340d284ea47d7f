/* Softmax over the rows of a bfloat16 matrix, in place, for x86-64 CPUs with AVX-512 BF16 (softmax.py
 * builds and loads it; the vision tower's attention by query blocks calls it, torch_pixtral.py).
 *
 * Why: on a CPU with bfloat16 units but no AMX tiles, a full page's vision attention is q k^T, a
 * softmax and p v per block of 256 queries against 9,350 keys, and torch's softmax of the bfloat16
 * scores took 0.031 s per head and layer (2.8 G values/s, 2 threads, AVX-512 BF16 EPYC), a third of
 * the attention. Here each row is read once to find its largest value, its exponentials are computed
 * once into a float32 row of the thread's own, summed, then scaled by 1 / sum and rounded to bfloat16
 * over the scores: the arithmetic of torch's softmax (float32 inside, one rounding at the end), with
 * a polynomial exponential of its own (within 2 float32 ulps of expf).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_COLS 65536
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* e^x for 16 floats: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by a degree-6 Taylor
 * polynomial, times 2^n (vscalefps); 0 below -87.3 (where expf's results are subnormal: a masked key's
 * weight is exactly 0, as torch's) */
TARGET static inline __m512 exp16(__m512 x) {
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

TARGET static inline __m512 widen(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* one row of n bfloat16 values in place; e: n floats of scratch */
TARGET static void softmax_row(uint16_t *row, int64_t n, float *e) {
    __m512 top = _mm512_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        top = _mm512_mask_max_ps(top, m, top, widen(row + i, m));
    }
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top)), sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(widen(row + i, m), mx)));
        _mm512_mask_storeu_ps(e + i, m, v);
        sum = _mm512_add_ps(sum, v);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, e + i), inv));
        _mm256_mask_storeu_epi16(row + i, m, (__m256i)b);
    }
}

/* Whether this CPU runs the kernel (AVX-512 BF16). */
int softmax_takes(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}

/* x [rows, cols] bfloat16 bits (row stride ld) -> softmax of each row, in place. 0, or -1 for a row
 * wider than MAX_COLS or a CPU without AVX-512 BF16, -2 when out of memory. */
int softmax_bf16(uint16_t *x, int64_t rows, int64_t cols, int64_t ld, int threads) {
    if (cols < 1 || cols > MAX_COLS || !softmax_takes()) return -1;
    int nt = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    float *scratch = (float *)malloc(sizeof(float) * cols * nt); /* a float32 row per thread */
    if (!scratch) return -2;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * ld, cols, scratch + omp_get_thread_num() * cols);
#else
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * ld, cols, scratch);
#endif
    free(scratch);
    return 0;
}
