/* Decode attention over a bfloat16 or int8 KV pool, for x86-64 CPUs with AVX2 and FMA (native.py
 * builds and loads it).
 *
 * Why: a decode step's attention reads every cached key and value once and does two multiply-adds
 * per value, so it should run at memory speed. torch multiplies bfloat16 operands on a CPU without
 * bfloat16 units through a generic path (1.6 ms per layer and sequence at 2,336 positions of a
 * LightOnOCR-1B decoder, 2 threads, AMD EPYC Zen 3), slower than its float32 product over twice the
 * bytes (0.9 ms); int8 keys it first widens to bfloat16, slower still. Here each key and value is
 * widened to float32 in registers (a bfloat16 is the top half of a float32) and multiplied with
 * float32 queries and weights: 0.53 ms over bfloat16 keys; int8 keys read half the bytes.
 *
 * One work item is one (sequence, KV head): scores of its g query heads against the sequence's n
 * keys, a float32 softmax, then the weighted sum of its values. The order of every sum depends on
 * n, g and D only, never on the other sequences of the call or on the thread that runs the item,
 * so a sequence's output has the same bits alone or in any batch (tests/engine/test_native.py).
 *
 * Built with AVX-512 (native.py does where the CPU has it: -mavx512f ...), the scores and the
 * weighted values widen 16 stored values at a time instead of 8: half the instructions per value
 * (measured in docs/benchmarks.md). Sums then run in another order than the AVX2 build's, the same
 * for every sequence of one build.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
#include <pthread.h>
#endif

#define MAX_GROUP 16   /* query heads per KV head */
#define MAX_DIM 256    /* head dimension, a multiple of 8 */
#define MAX_THREADS 64

#define INLINE static inline __attribute__((always_inline))
enum { BF16 = 0, INT8 = 1 };  /* the pool kinds: bfloat16 bits, int8 with scales */

/* 8 stored values from element i of a row -> 8 float32; `kind` is a constant wherever this is
 * inlined, so each kind gets its own loops */
INLINE __m256 widen8(const void *row, size_t i, int kind) {
    if (kind == BF16) /* a bfloat16 is the top half of a float32 */
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
}

/* Rows a pass asks the cache for ahead of the one it reads: the hardware prefetcher stops at each
 * 4 KiB page, and the pool is in 4 KiB pages (cache._zeros), so each head's row restarted cold. */
#define AHEAD 16

/* the cache lines of n stored values from element i of a row, asked for ahead (never faults) */
INLINE void prefetch(const void *row, size_t i, size_t n, int kind) {
    size_t size = kind == BF16 ? 2 : 1;
    const char *a = (const char *)row + i * size;
    for (size_t b = 0; b < n * size; b += 64) _mm_prefetch(a + b, _MM_HINT_T0);
}

INLINE float bf16_float(uint16_t b) { /* bfloat16 bits -> float32, exactly */
    union { uint32_t u; float f; } x = {(uint32_t)b << 16};
    return x.f;
}

INLINE float sum8(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_hadd_ps(x, x);
    return _mm_cvtss_f32(_mm_hadd_ps(x, x));
}

/* lane i of the result = the sum of the lanes of a_i */
INLINE __m256 sum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#ifdef __AVX512F__
/* 16 stored values from element i of a row -> 16 float32 */
INLINE __m512 widen16(const void *row, size_t i, int kind) {
    if (kind == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))), 16));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)row + i))));
}

/* the two halves of a 16-lane sum added: lane i = a[i] + a[i + 8] */
INLINE __m256 fold16(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#endif

/* e^x for x <= 0 (scores minus their maximum): 2^(x log2 e) as 2^floor times a degree-6
 * polynomial of the fraction, relative error ~2e-7; below -87 it returns ~1e-38 instead of 0. */
INLINE __m256 exp8(__m256 x) {
    __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(1.44269504088896341f));
    __m256 whole = _mm256_floor_ps(t), f = _mm256_sub_ps(t, whole);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* s[j, p] = q[j] . K[p] for the g queries q [g, D] (already scaled) and keys K [n, D] */
INLINE void scores(const void *K, const float *q, int n, int D, int g, float *s, int kind) {
    int p = 0;
    for (; p + 8 <= n; p += 8) { /* 8 keys at once: 8 independent sums, one horizontal pass */
        size_t k = (size_t)p * D;
        if (p + AHEAD < n) prefetch(K, k + (size_t)AHEAD * D, (size_t)8 * D, kind);
        for (int j = 0; j < g; j++) {
            const float *qj = q + (size_t)j * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            int d = 0;
#ifdef __AVX512F__
            if (D >= 16) { /* 16 channels at a time, the halves folded before the tail of 8 */
                __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
                for (; d + 16 <= D; d += 16) {
                    __m512 x = _mm512_loadu_ps(qj + d);
                    c0 = _mm512_fmadd_ps(x, widen16(K, k + d, kind), c0);
                    c1 = _mm512_fmadd_ps(x, widen16(K, k + D + d, kind), c1);
                    c2 = _mm512_fmadd_ps(x, widen16(K, k + 2 * D + d, kind), c2);
                    c3 = _mm512_fmadd_ps(x, widen16(K, k + 3 * D + d, kind), c3);
                    c4 = _mm512_fmadd_ps(x, widen16(K, k + 4 * D + d, kind), c4);
                    c5 = _mm512_fmadd_ps(x, widen16(K, k + 5 * D + d, kind), c5);
                    c6 = _mm512_fmadd_ps(x, widen16(K, k + 6 * D + d, kind), c6);
                    c7 = _mm512_fmadd_ps(x, widen16(K, k + 7 * D + d, kind), c7);
                }
                a0 = fold16(c0); a1 = fold16(c1); a2 = fold16(c2); a3 = fold16(c3);
                a4 = fold16(c4); a5 = fold16(c5); a6 = fold16(c6); a7 = fold16(c7);
            }
#endif
            for (; d < D; d += 8) {
                __m256 x = _mm256_loadu_ps(qj + d);
                a0 = _mm256_fmadd_ps(x, widen8(K, k + d, kind), a0);
                a1 = _mm256_fmadd_ps(x, widen8(K, k + D + d, kind), a1);
                a2 = _mm256_fmadd_ps(x, widen8(K, k + 2 * D + d, kind), a2);
                a3 = _mm256_fmadd_ps(x, widen8(K, k + 3 * D + d, kind), a3);
                a4 = _mm256_fmadd_ps(x, widen8(K, k + 4 * D + d, kind), a4);
                a5 = _mm256_fmadd_ps(x, widen8(K, k + 5 * D + d, kind), a5);
                a6 = _mm256_fmadd_ps(x, widen8(K, k + 6 * D + d, kind), a6);
                a7 = _mm256_fmadd_ps(x, widen8(K, k + 7 * D + d, kind), a7);
            }
            _mm256_storeu_ps(s + (size_t)j * n + p, sum8x8(a0, a1, a2, a3, a4, a5, a6, a7));
        }
    }
    for (; p < n; p++) /* the last n % 8 keys one at a time */
        for (int j = 0; j < g; j++) {
            __m256 a = _mm256_setzero_ps();
            for (int d = 0; d < D; d += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)j * D + d), widen8(K, (size_t)p * D + d, kind), a);
            s[(size_t)j * n + p] = sum8(a);
        }
}

/* s [n] -> e^(s - max s) in place; returns 1 / their sum */
static float softmax_weights(float *s, int n) {
    __m256 m8 = _mm256_set1_ps(s[0]);
    int i = 0;
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + i));
    float lanes[8], m = s[0];
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    for (; i < n; i++) m = s[i] > m ? s[i] : m;
    __m256 mb = _mm256_set1_ps(m), total = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mb));
        _mm256_storeu_ps(s + i, e);
        total = _mm256_add_ps(total, e);
    }
    float sum = sum8(total);
    if (i < n) { /* the tail as one padded vector; its padding is not summed */
        float x[8] = {0}, e[8];
        for (int l = 0; l < n - i; l++) x[l] = s[i + l] - m;
        _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(x)));
        for (int l = 0; l < n - i; l++) { s[i + l] = e[l]; sum += e[l]; }
    }
    return 1.0f / sum;
}

/* out[j] = inv[j] * sum_p w[j, p] V[p] for values V [n, D], two queries at a time by 32 columns
 * (16 registers of accumulators and values), then by 8: each pass reads one cache line of every row. */
INLINE void weighted_values(const void *V, const float *w, const float *inv, int n, int D, int g, float *out,
                            int kind) {
    int d0 = 0;
#ifdef __AVX512F__
    for (; d0 + 64 <= D; d0 += 64) /* two queries by 64 columns: a cache line of int8 values per row */
        for (int j = 0; j < g; j += 2) {
            int pair = j + 1 < g;
            const float *w0 = w + (size_t)j * n, *w1 = w + (size_t)(j + pair) * n;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int p = 0; p < n; p++) {
                size_t v = (size_t)p * D + d0;
                if (p + AHEAD < n) prefetch(V, v + (size_t)AHEAD * D, 64, kind);
                __m512 v0 = widen16(V, v, kind), v1 = widen16(V, v + 16, kind), v2 = widen16(V, v + 32, kind),
                       v3 = widen16(V, v + 48, kind);
                __m512 x = _mm512_set1_ps(w0[p]), y = _mm512_set1_ps(w1[p]);
                a0 = _mm512_fmadd_ps(x, v0, a0); a1 = _mm512_fmadd_ps(x, v1, a1);
                a2 = _mm512_fmadd_ps(x, v2, a2); a3 = _mm512_fmadd_ps(x, v3, a3);
                b0 = _mm512_fmadd_ps(y, v0, b0); b1 = _mm512_fmadd_ps(y, v1, b1);
                b2 = _mm512_fmadd_ps(y, v2, b2); b3 = _mm512_fmadd_ps(y, v3, b3);
            }
            __m512 c = _mm512_set1_ps(inv[j]);
            float *o = out + (size_t)j * D + d0;
            _mm512_storeu_ps(o, _mm512_mul_ps(a0, c)); _mm512_storeu_ps(o + 16, _mm512_mul_ps(a1, c));
            _mm512_storeu_ps(o + 32, _mm512_mul_ps(a2, c)); _mm512_storeu_ps(o + 48, _mm512_mul_ps(a3, c));
            if (pair) {
                c = _mm512_set1_ps(inv[j + 1]);
                o += D;
                _mm512_storeu_ps(o, _mm512_mul_ps(b0, c)); _mm512_storeu_ps(o + 16, _mm512_mul_ps(b1, c));
                _mm512_storeu_ps(o + 32, _mm512_mul_ps(b2, c)); _mm512_storeu_ps(o + 48, _mm512_mul_ps(b3, c));
            }
        }
#endif
    for (; d0 + 32 <= D; d0 += 32)
        for (int j = 0; j < g; j += 2) {
            int pair = j + 1 < g;
            const float *w0 = w + (size_t)j * n, *w1 = w + (size_t)(j + pair) * n;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int p = 0; p < n; p++) {
                size_t v = (size_t)p * D + d0;
                if (p + AHEAD < n) prefetch(V, v + (size_t)AHEAD * D, 32, kind);
                __m256 v0 = widen8(V, v, kind), v1 = widen8(V, v + 8, kind), v2 = widen8(V, v + 16, kind),
                       v3 = widen8(V, v + 24, kind);
                __m256 x = _mm256_broadcast_ss(w0 + p), y = _mm256_broadcast_ss(w1 + p);
                a0 = _mm256_fmadd_ps(x, v0, a0); a1 = _mm256_fmadd_ps(x, v1, a1);
                a2 = _mm256_fmadd_ps(x, v2, a2); a3 = _mm256_fmadd_ps(x, v3, a3);
                b0 = _mm256_fmadd_ps(y, v0, b0); b1 = _mm256_fmadd_ps(y, v1, b1);
                b2 = _mm256_fmadd_ps(y, v2, b2); b3 = _mm256_fmadd_ps(y, v3, b3);
            }
            __m256 c = _mm256_set1_ps(inv[j]);
            float *o = out + (size_t)j * D + d0;
            _mm256_storeu_ps(o, _mm256_mul_ps(a0, c)); _mm256_storeu_ps(o + 8, _mm256_mul_ps(a1, c));
            _mm256_storeu_ps(o + 16, _mm256_mul_ps(a2, c)); _mm256_storeu_ps(o + 24, _mm256_mul_ps(a3, c));
            if (pair) {
                c = _mm256_set1_ps(inv[j + 1]);
                o += D;
                _mm256_storeu_ps(o, _mm256_mul_ps(b0, c)); _mm256_storeu_ps(o + 8, _mm256_mul_ps(b1, c));
                _mm256_storeu_ps(o + 16, _mm256_mul_ps(b2, c)); _mm256_storeu_ps(o + 24, _mm256_mul_ps(b3, c));
            }
        }
    for (; d0 < D; d0 += 8) /* a head dimension that is not a multiple of 32 */
        for (int j = 0; j < g; j++) {
            const float *wj = w + (size_t)j * n;
            __m256 a = _mm256_setzero_ps();
            for (int p = 0; p < n; p++)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(wj + p), widen8(V, (size_t)p * D + d0, kind), a);
            _mm256_storeu_ps(out + (size_t)j * D + d0, _mm256_mul_ps(a, _mm256_set1_ps(inv[j])));
        }
}

typedef struct {
    const void *k, *v;        /* one layer of the pool: [slots, Hkv, cap, D] */
    const uint16_t *ks, *vs;  /* int8: each position's scale [slots, Hkv, cap], bfloat16 bits */
    const float *kc;          /* int8: each key channel's scale [slots, Hkv, D] */
    const int64_t *slot, *n;
    const float *q;           /* [B, Hkv * g, D] */
    float *out;               /* [B, Hkv * g, D] */
    int64_t cap;
    int kind, n_seq, hkv, g, dim, first, step, max_n;
    float scale;
    int failed;
} work_t;

/* One (sequence, KV head). int8 keys are Kq[p, c] ks[p] kc[c]: kc goes onto the query, ks onto the
 * scores; values are Vq[p, c] vs[p]: vs goes onto the softmax weights. */
INLINE void head(const work_t *w, int b, int h, float *s, float *qs, int kind) {
    int g = w->g, D = w->dim, n = (int)w->n[b];
    size_t cell = (size_t)w->slot[b] * w->hkv + h, row = ((size_t)b * w->hkv + h) * g * D;
    size_t first = cell * (size_t)w->cap * D * (kind == BF16 ? 2 : 1); /* bytes to the head's first key */
    const void *K = (const char *)w->k + first, *V = (const char *)w->v + first;
    for (int j = 0; j < g; j++)
        for (int c = 0; c < D; c++)
            qs[j * D + c] = w->q[row + (size_t)j * D + c] * w->scale * (kind == INT8 ? w->kc[cell * D + c] : 1.0f);
    scores(K, qs, n, D, g, s, kind);
    float inv[MAX_GROUP];
    for (int j = 0; j < g; j++) {
        float *sj = s + (size_t)j * n;
        if (kind == INT8)
            for (int p = 0; p < n; p++) sj[p] *= bf16_float(w->ks[cell * w->cap + p]);
        inv[j] = softmax_weights(sj, n);
        if (kind == INT8)
            for (int p = 0; p < n; p++) sj[p] *= bf16_float(w->vs[cell * w->cap + p]);
    }
    weighted_values(V, s, inv, n, D, g, w->out + row, kind);
}

/* Subnormal floats flushed to zero (MXCSR FTZ and DAZ) while a thread runs its items, then the
 * caller's mode back: a peaked softmax leaves far-off weights near 1e-38, and their products with
 * small values are subnormal, which the FMA units take a microcode assist for each. Measured on a
 * Xeon, B = 16 x 2,336 positions of int8 keys with scores spread over ~100: 67 ms a call against 5.4
 * with the same data scaled to ordinary scores; flushed, both run at the ordinary speed. Every thread
 * flushes, so a sequence's bits still do not depend on the thread that runs it. */
#define FLUSH_SUBNORMALS 0x8040u

static void *run(void *arg) {
    work_t *w = (work_t *)arg;
    float *s = malloc(sizeof(float) * (size_t)w->g * (size_t)w->max_n), qs[MAX_GROUP * MAX_DIM];
    if (!s) { w->failed = 1; return NULL; }
    unsigned int mode = _mm_getcsr();
    _mm_setcsr(mode | FLUSH_SUBNORMALS);
    for (int item = w->first; item < w->n_seq * w->hkv; item += w->step) {
        if (w->kind == BF16) head(w, item / w->hkv, item % w->hkv, s, qs, BF16);
        else head(w, item / w->hkv, item % w->hkv, s, qs, INT8);
    }
    _mm_setcsr(mode);
    free(s);
    return NULL;
}

/* kind 0: k, v bfloat16 bits (ks, vs, kc unused); kind 1: int8 with their scales (ks, vs bfloat16 bits).
 * Returns 0, or -1 for shapes it does not take (native.py checks them first), -2 when out of memory. */
int decode_attention(int kind, const void *k, const void *v, const uint16_t *ks, const uint16_t *vs, const float *kc,
                     int64_t cap, const int64_t *slot, const int64_t *n, int n_seq, const float *q, float *out,
                     int hkv, int g, int dim, float scale, int threads) {
    if ((kind != BF16 && kind != INT8) || (kind == INT8 && !(ks && vs && kc)))
        return -1;
    if (g < 1 || g > MAX_GROUP || dim < 8 || dim > MAX_DIM || dim % 8 || hkv < 1 || n_seq < 1) return -1;
    int max_n = 1;
    for (int b = 0; b < n_seq; b++) {
        if (n[b] < 1 || n[b] > cap) return -1;
        max_n = n[b] > max_n ? (int)n[b] : max_n;
    }
    int items = n_seq * hkv, nt = threads < items ? threads : items;
    nt = nt < 1 ? 1 : (nt > MAX_THREADS ? MAX_THREADS : nt);
    int failed = 0;
#ifdef _OPENMP
    /* The threads of torch's own OpenMP pool (this library's libgomp is the one torch loaded): they
     * spin between torch's products, so a thread of our own would wait for its core (measured:
     * 0.35 ms per call at 2 threads with pthreads beside torch's pool, 0.03 ms at 1 thread). */
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        work_t w = {k, v, ks, vs, kc, slot, n, q, out, cap, kind, n_seq, hkv, g, dim,
                    omp_get_thread_num(), omp_get_num_threads(), max_n, scale, 0};
        run(&w);
        failed |= w.failed;
    }
#else
    work_t w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++)
        w[t] = (work_t){k, v, ks, vs, kc, slot, n, q, out, cap, kind, n_seq, hkv, g, dim, t, nt, max_n, scale, 0};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&tid[t], NULL, run, &w[t]) == 0;
    for (int t = 1; t < nt; t++)
        if (!started[t]) run(&w[t]); /* no thread to be had: this one does its items */
    run(&w[0]);
    failed = w[0].failed;
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        failed |= w[t].failed;
    }
#endif
    return failed ? -2 : 0;
}
