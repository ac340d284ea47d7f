/* The row passes around an int8 product of bfloat16 rows, for x86-64 CPUs with AVX-512 (int8_products.py
 * builds and loads them; torch's _int_mm multiplies in between): the vision tower's products under
 * --vision-dtype int8.
 *
 * Why: on a CPU with VNNI (vpdpbusd, 64 int8 pairs per instruction) torch's int8 GEMM runs ~0.8 TOPS on
 * 2 AVX-512 EPYC cores where its bfloat16 GEMM runs ~0.4 TFLOP/s, at a full page's [9,350, 1,024] x
 * [1,024, 4,096]. Done in torch, the quantization and the rescaling were 3 to 6 passes each and ate the
 * gain (0.43 s for a product that takes 0.24 s in bfloat16); here each is one pass.
 *
 * - colmax_bf16: the largest |x| of each column, for the smoothing scales (int8_products.py says why).
 * - int8_rows_bf16: each row of x times a per-column factor, times 127 / its largest |.|, rounded to nearest
 *   (ties to even) into int8; the row's scale (largest / 127) beside it. A zero row is zeros, scale 0; a
 *   row holding a NaN or an infinity gets scale NaN, so its products are NaN (as bfloat16's would be).
 * - dequant_i32: bfloat16 rows of int32 sums times their row's and column's scales, rounded once.
 * - swiglu_i32: the same for a [gate | up] product, then silu(gate) * up, rounded once.
 * Each pass's rows are their own: their bits depend neither on the other rows nor on the thread count.
 * (A product's rows are not: the smoothing is computed from all the rows of its call.) The rescaling is
 * float32 arithmetic (int32 sums past 2^24 round on conversion), rounded once to bfloat16.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"

/* Whether this build has the vector paths (AVX-512); without them every entry returns -1 */
int int8_rows_take(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* out [k] = the largest |x| of each column of x [m, k] (row stride ldx); -2 if out of memory */
int colmax_bf16(const uint16_t *x, int64_t m, int64_t k, int64_t ldx, float *out, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    float *part = calloc((size_t)nt * (size_t)k, sizeof(float)); /* each thread's maxima: max is exact in any order */
    if (!part) return -2;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num();
#else
        int t = 0;
#endif
        float *top = part + (int64_t)t * k;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < k; c += 16) {
                __mmask16 msk = tail(k, c);
                __m512 v = _mm512_abs_ps(load_bf16(x + i * ldx + c, msk));
                _mm512_mask_storeu_ps(top + c, msk, _mm512_max_ps(v, _mm512_maskz_loadu_ps(msk, top + c)));
            }
    }
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 msk = tail(k, c);
        __m512 v = _mm512_setzero_ps();
        for (int t = 0; t < nt; t++) v = _mm512_max_ps(v, _mm512_maskz_loadu_ps(msk, part + (int64_t)t * k + c));
        _mm512_mask_storeu_ps(out + c, msk, v);
    }
    free(part);
    return 0;
#else
    (void)x, (void)m, (void)k, (void)ldx, (void)out, (void)threads;
    return -1;
#endif
}

/* q [m, k] int8 (row stride k), scale [m]: each row v of x [m, k] (row stride ldx) times mul [k] (null: 1) as
 * round(v * (127 / max|v|)), scale = max|v| / 127; a zero row gives zeros and scale 0, a row with a NaN or
 * an infinity zeros and scale NaN */
int int8_rows_bf16(const uint16_t *x, int64_t m, int64_t k, int64_t ldx, const float *mul, int8_t *q, float *scale,
                   int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *row = x + i * ldx;
        __m512 top = _mm512_setzero_ps();
        __mmask16 bad = 0; /* lanes that met a NaN or an infinity (max would drop a NaN) */
        for (int64_t c = 0; c < k; c += 16) {
            __mmask16 msk = tail(k, c);
            __m512 v = load_bf16(row + c, msk);
            if (mul) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(msk, mul + c));
            __m512 a = _mm512_abs_ps(v);
            bad |= _mm512_mask_cmp_ps_mask(msk, a, _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
            top = _mm512_max_ps(top, a);
        }
        if (bad) {
            memset(q + i * k, 0, (size_t)k);
            scale[i] = __builtin_nanf("");
            continue;
        }
        float big = _mm512_reduce_max_ps(top);
        scale[i] = big / 127.0f;
        const __m512 inv = _mm512_set1_ps(big > 0 ? 127.0f / big : 0.0f);
        for (int64_t c = 0; c < k; c += 16) {
            __mmask16 msk = tail(k, c);
            __m512 v = load_bf16(row + c, msk);
            if (mul) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(msk, mul + c));
            __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv)); /* the current rounding: to nearest, ties even */
            _mm_mask_storeu_epi8(q + i * k + c, msk, _mm512_cvtsepi32_epi8(n));
        }
    }
    return 0;
#else
    (void)x, (void)m, (void)k, (void)ldx, (void)mul, (void)q, (void)scale, (void)threads;
    return -1;
#endif
}

#ifdef __AVX512F__
/* 16 int32 sums at y as floats times the row's scale and the columns' scales sw */
static inline __m512 scaled(const int32_t *y, __mmask16 msk, __m512 sx, const float *sw) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(msk, y));
    return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_maskz_loadu_ps(msk, sw)), sx);
}
#endif

/* out [m, n] bfloat16 (row stride ldo) = y [m, n] int32 (row stride ldy) * sx[row] * sw[column] */
int dequant_i32(const int32_t *y, int64_t m, int64_t n, int64_t ldy, const float *sx, const float *sw, uint16_t *out,
                int64_t ldo, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++) {
        __m512 s = _mm512_set1_ps(sx[i]);
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 msk = tail(n, c);
            store_bf16(out + i * ldo + c, msk, scaled(y + i * ldy + c, msk, s, sw + c));
        }
    }
    return 0;
#else
    (void)y, (void)m, (void)n, (void)ldy, (void)sx, (void)sw, (void)out, (void)ldo, (void)threads;
    return -1;
#endif
}

/* out [m, f] bfloat16 (row stride ldo) = silu(g) * u, where g = yg * sx[row] * sw[column] and u = yu * sx[row] *
 * sw[f + column] for the int32 sums yg, yu [m, f] (row stride ldy), sw [2f] */
int swiglu_i32(const int32_t *yg, const int32_t *yu, int64_t m, int64_t f, int64_t ldy, const float *sx, const float *sw,
               uint16_t *out, int64_t ldo, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++) {
        __m512 s = _mm512_set1_ps(sx[i]);
        for (int64_t c = 0; c < f; c += 16) {
            __mmask16 msk = tail(f, c);
            __m512 g = scaled(yg + i * ldy + c, msk, s, sw + c), u = scaled(yu + i * ldy + c, msk, s, sw + f + c);
            store_bf16(out + i * ldo + c, msk, _mm512_mul_ps(silu16(g), u));
        }
    }
    return 0;
#else
    (void)yg, (void)yu, (void)m, (void)f, (void)ldy, (void)sx, (void)sw, (void)out, (void)ldo, (void)threads;
    return -1;
#endif
}
