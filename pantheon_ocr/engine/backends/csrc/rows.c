/* A prompt chunk's row operations, one pass each, for x86-64 CPUs with AVX-512 (rows.py builds and loads
 * them; torch_blocks.TorchBlocks calls them for prompt rows): the per-head RMS norm and rotary embedding of
 * the chunk's queries and keys, the SwiGLU of its gate and up products, and an int8 KV pool's store of
 * its keys and values. And the vision tower's bfloat16 rows (torch_pixtral's blocks in bfloat16 on the
 * CPU): its RMS norms, rotary embedding and SwiGLU, which torch ran as 0.18 s of a full page's 2.2 s
 * layer (norms 54 ms each over float32 copies of the rows, SwiGLU 60 ms in two passes) and take 0.016 s
 * here (2 threads, AVX-512 EPYC).
 *
 * Why: torch runs each of the first two as 3 to 6 passes over the chunk, each with a temporary of its
 * own, and the store was ~10 numpy passes on one core. A LightOnOCR-1B page's prefill (2,322 tokens in
 * chunks of 512, 28 layers, 2 threads, AVX-512 EPYC) spent ~0.22 s in the rotary embedding, ~0.13 s in
 * the q/k norms, ~0.12 s in the SwiGLU and 0.27 s in the store that way (docs/benchmarks.md).
 *
 * Arithmetic: the rotary embedding is torch_blocks.Rope's to the bit (x0 c - x1 s and x1 c + x0 s, each
 * product rounded, then their sum; the build has -ffp-contract=off). The norm is x * (1 / sqrt(mean(x^2)
 * + eps)) * w with the squares summed in 16 float32 lanes: its bits differ from torch's sum order by
 * float32 rounding. The SwiGLU is g / (1 + e^-g) * u with e^x within 2 float32 ulps of expf. The int8
 * store makes cache._int8_of's bits: the same IEEE divisions, the same round-up of the scale to
 * bfloat16, rounding half to even. Every row is its own: its bits do not depend on the other rows or
 * the thread count.
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"

#ifdef __AVX512F__

/* 1 / sqrt(mean(x^2) + eps) of a row of n */
static inline float inv_rms(const float *x, int64_t n, float eps) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(tail(n, i), x + i);
        s = _mm512_add_ps(s, _mm512_mul_ps(v, v));
    }
    return 1.0f / sqrtf(_mm512_reduce_add_ps(s) / (float)n + eps);
}

/* y = x * r * w over a row of n (w null: x * r) */
static inline void scale_row(const float *x, int64_t n, float r, const float *w, float *y) {
    __m512 rv = _mm512_set1_ps(r);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail(n, i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* One head of d in place: pairs (i, i + d / 2) (neox) or (2i, 2i + 1) turned by the angles c, s [d / 2] */
static inline void rope_head(float *x, int64_t d, const float *c, const float *s, int neox) {
    int64_t r = d / 2;
    if (neox) {
        for (int64_t i = 0; i < r; i += 16) {
            __mmask16 m = tail(r, i);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + i), x1 = _mm512_maskz_loadu_ps(m, x + r + i);
            __m512 cv = _mm512_maskz_loadu_ps(m, c + i), sv = _mm512_maskz_loadu_ps(m, s + i);
            _mm512_mask_storeu_ps(x + i, m, _mm512_sub_ps(_mm512_mul_ps(x0, cv), _mm512_mul_ps(x1, sv)));
            _mm512_mask_storeu_ps(x + r + i, m, _mm512_add_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x0, sv)));
        }
        return;
    }
    for (int64_t i = 0; i < r; i++) { /* interleaved pairs: few models, scalar */
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * c[i] - x1 * s[i];
        x[2 * i + 1] = x1 * c[i] + x0 * s[i];
    }
}

#endif

/* Whether this build has the vector paths (AVX-512); without them every entry returns -1 */
int rows_take(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* out [t, h, d] = the heads of x [t, h * d] (row stride ldx), each RMS-normed with w [d] (unless w is
 * null) and turned by the rotary angles cos, sin [t, d / 2] of its row */
int norm_rope_heads(const float *x, int64_t t, int64_t h, int64_t d, int64_t ldx, const float *w, float eps,
                    const float *cos, const float *sin, int neox, float *out, int threads) {
#ifdef __AVX512F__
    if (d % 2) return -1;
    int nt = threads_for(t, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < h; j++) {
            const float *src = x + i * ldx + j * d;
            float *dst = out + (i * h + j) * d;
            scale_row(src, d, w ? inv_rms(src, d, eps) : 1.0f, w, dst); /* without a norm: a copy (x * 1) */
            rope_head(dst, d, cos + i * (d / 2), sin + i * (d / 2), neox);
        }
    return 0;
#else
    (void)x, (void)t, (void)h, (void)d, (void)ldx, (void)w, (void)eps, (void)cos, (void)sin, (void)neox;
    (void)out, (void)threads;
    return -1;
#endif
}

/* y [m, n] = silu(g) * u for the gate g = gu[:, :n] and up u = gu[:, n:2n] (row stride ld) */
int swiglu_rows(const float *gu, int64_t m, int64_t n, int64_t ld, float *y, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++) {
        const float *g = gu + i * ld, *u = g + n;
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 k = tail(n, c);
            __m512 silu = silu16(_mm512_maskz_loadu_ps(k, g + c));
            _mm512_mask_storeu_ps(y + i * n + c, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, u + c)));
        }
    }
    return 0;
#else
    (void)gu, (void)m, (void)n, (void)ld, (void)y, (void)threads;
    return -1;
#endif
}

/* cache._int8_of(x / div) to the bit: x [h, t, d] (strides sh, st in floats; columns contiguous), each row
 * divided by div [h, d] (an int8 pool's key channel scales; null: not divided) -> q [h, t, d] int8 and the
 * row's scale as bfloat16 bits [h, t]: its largest magnitude / 127 rounded up to bfloat16 (1 where that is
 * 0), q = x / scale rounded half to even (|q| <= 127 by construction) */
int int8_rows(const float *x, int64_t h, int64_t t, int64_t d, int64_t sh, int64_t st, const float *div,
              int8_t *q, uint16_t *bits, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(h * t, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t r = 0; r < h * t; r++) {
        int64_t hi = r / t, ti = r % t;
        const float *row = x + hi * sh + ti * st, *dv = div ? div + hi * d : 0;
        __m512 top = _mm512_setzero_ps();
        for (int64_t i = 0; i < d; i += 16) {
            __mmask16 m = tail(d, i);
            __m512 v = _mm512_maskz_loadu_ps(m, row + i);
            if (dv) v = _mm512_maskz_div_ps(m, v, _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, dv + i));
            top = _mm512_max_ps(_mm512_abs_ps(v), top);
        }
        float s = _mm512_reduce_max_ps(top) / 127.0f;
        uint32_t u;
        __builtin_memcpy(&u, &s, 4);
        uint16_t b = (uint16_t)((u >> 16) + ((u & 0xFFFF) != 0)); /* the next bfloat16 up */
        if (b == 0) b = 0x3F80;
        bits[r] = b;
        uint32_t wide = (uint32_t)b << 16;
        float scale;
        __builtin_memcpy(&scale, &wide, 4);
        const __m512 sv = _mm512_set1_ps(scale);
        for (int64_t i = 0; i < d; i += 16) {
            __mmask16 m = tail(d, i);
            __m512 v = _mm512_maskz_loadu_ps(m, row + i);
            if (dv) v = _mm512_maskz_div_ps(m, v, _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, dv + i));
            __m512 k = _mm512_roundscale_ps(_mm512_div_ps(v, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_mask_storeu_epi8(q + r * d + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(k)));
        }
    }
    return 0;
#else
    (void)x, (void)h, (void)t, (void)d, (void)sh, (void)st, (void)div, (void)q, (void)bits, (void)threads;
    return -1;
#endif
}

/* The vision tower's bfloat16 rows (torch_vision's blocks in bfloat16 on the CPU): each reads bfloat16,
 * computes in float32 and rounds once to bfloat16, where torch rounds after each of its 3 to 6 passes. */

/* y [m, n] = x * (1 / sqrt(mean(x^2) + eps)) * w for the rows of x [m, n] (row strides ldx, ldy) */
int rms_norm_bf16(const uint16_t *x, int64_t m, int64_t n, int64_t ldx, const float *w, float eps, uint16_t *y,
                  int64_t ldy, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *row = x + i * ldx;
        __m512 s = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16) {
            __m512 v = load_bf16(row + c, tail(n, c));
            s = _mm512_add_ps(s, _mm512_mul_ps(v, v));
        }
        __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(s) / (float)n + eps));
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 k = tail(n, c);
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(load_bf16(row + c, k), r), _mm512_maskz_loadu_ps(k, w + c));
            store_bf16(y + i * ldy + c, k, v);
        }
    }
    return 0;
#else
    (void)x, (void)m, (void)n, (void)ldx, (void)w, (void)eps, (void)y, (void)ldy, (void)threads;
    return -1;
#endif
}

/* In place: the h heads of d of each row of x [t, h * d] (row stride ldx) turned by that row's rotary
 * angles: the first d / 2 of cos, sin [t] rows (float32, row stride ldc), split-half pairs (i, i + d / 2) */
int rope_bf16(uint16_t *x, int64_t t, int64_t h, int64_t d, int64_t ldx, const float *cos, const float *sin,
              int64_t ldc, int threads) {
#ifdef __AVX512F__
    if (d % 2) return -1;
    int64_t r = d / 2;
    int nt = threads_for(t, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < h; j++) {
            uint16_t *head = x + i * ldx + j * d;
            for (int64_t c = 0; c < r; c += 16) {
                __mmask16 k = tail(r, c);
                __m512 x0 = load_bf16(head + c, k), x1 = load_bf16(head + r + c, k);
                __m512 cv = _mm512_maskz_loadu_ps(k, cos + i * ldc + c), sv = _mm512_maskz_loadu_ps(k, sin + i * ldc + c);
                store_bf16(head + c, k, _mm512_sub_ps(_mm512_mul_ps(x0, cv), _mm512_mul_ps(x1, sv)));
                store_bf16(head + r + c, k, _mm512_add_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x0, sv)));
            }
        }
    return 0;
#else
    (void)x, (void)t, (void)h, (void)d, (void)ldx, (void)cos, (void)sin, (void)ldc, (void)threads;
    return -1;
#endif
}

/* In place: g [m, n] = silu(g) * u (row strides ldg, ldu), SwiGLU's product as swiglu_rows computes it */
int swiglu_bf16(uint16_t *g, const uint16_t *u, int64_t m, int64_t n, int64_t ldg, int64_t ldu, int threads) {
#ifdef __AVX512F__
    int nt = threads_for(m, threads);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 k = tail(n, c);
            __m512 silu = silu16(load_bf16(g + i * ldg + c, k));
            store_bf16(g + i * ldg + c, k, _mm512_mul_ps(silu, load_bf16(u + i * ldu + c, k)));
        }
    return 0;
#else
    (void)g, (void)u, (void)m, (void)n, (void)ldg, (void)ldu, (void)threads;
    return -1;
#endif
}
