/* Attention kernels in bfloat16 for x86-64 CPUs with AVX-512 BF16 (bf16_attention.py builds and loads
 * them): the vision tower's softmax over bfloat16 scores, and a prompt chunk's causal attention over
 * a decoder's KV pool.
 *
 * The softmax (torch_pixtral.query_block_attention calls it). Why: on a CPU with bfloat16 units but no
 * AMX tiles, a full page's vision attention is q k^T, a softmax and p v per block of 256 queries
 * against 9,350 keys, and torch's softmax of the bfloat16 scores took 0.031 s per head and layer
 * (2.8 G values/s, 2 threads, AVX-512 BF16 EPYC), a third of the attention. Here each row is read
 * once to find its largest value, its exponentials are computed once into a float32 row of the
 * thread's own, summed, then scaled by 1 / sum and rounded to bfloat16 over the scores: the
 * arithmetic of torch's softmax (float32 inside, one rounding at the end), with a polynomial
 * exponential of its own (within 2 float32 ulps of expf).
 *
 * The prompt attention (torch_blocks.TorchBlocks.prompt_attention calls it): see prompt_attention.
 * The vision tower's attention (bf16_attention.FullAttention, in place of the products by query blocks
 * and this softmax where the heads fit): the prompt attention's items, not causal; see full_attention.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_COLS 65536
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

#include "exp16.h"

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


/* ---- a prompt chunk's causal attention over a KV pool -------------------------------------------
 *
 * Why: a page's prompt (2,322 tokens of a LightOnOCR-1B decoder in 512-token chunks) spent 3.3 of
 * its 8.9 s in attention by query blocks in torch (torch_blocks.causal_block_attention: bfloat16
 * products of 256 queries against every key up to the block's last, a masked bfloat16 score matrix
 * written, masked, soft-maxed and read again, per KV head). Here one work item is 32 query rows of
 * one KV head (a run of positions times the head's g query heads), and its scores never leave the
 * thread's cache:
 *   A. scores S[j][r] = q_r . k_j as bfloat16 pair products (vdpbf16ps) with float32 sums, the 32
 *      rows in two vectors, so each key's pair is one broadcast and the row maximum a vector max;
 *      keys past a row's position masked;
 *   B. e = exp(S - max) in float32 (within 2.6e-6: exp16_weights), summed per row, rounded to
 *      bfloat16 in key pairs;
 *   C. out_r = sum_j e_rj v_j / sum_j e_rj, the values in key pairs (vdpbf16ps), 4 rows x 64
 *      channels per pass, blocks of PAIR_BLOCK key pairs.
 * Over an int8 pool (cache.KVPool: K = Kq ks[p] kc[c], V = Vq vs[p]) the stored integers are the
 * bfloat16 operands (exact: |Kq| <= 127), kc goes onto the query, ks onto the scores and vs onto
 * e before its rounding: no widened copy of the keys with their scales. The queries are rounded
 * to bfloat16 after their scale, as the products by query blocks round them.
 * A row's sums run in an order its own position fixes (keys it does not see add exact zeros), so its
 * bits depend neither on the threads nor on the chunk it came in (tests/engine/test_bf16_attention.py).
 * Measured (2 threads, AVX-512 BF16 EPYC): a page's last 512-query chunk over 2,336 int8 keys 28 ms
 * against 41; the page's prefill (`bench ocr --stage prefill`, Q8_0) 8.09 s against 9.65
 * (docs/benchmarks.md); a third of the products by query blocks' error against float64 attention over
 * the same stored keys (the scores are no longer rounded to bfloat16). */
#define ITEM_ROWS 32  /* query rows per work item: two 16-lane vectors */
#define KEYS_STEP 8   /* keys per pass of the score products */
/* key pairs per block of the weighted values: the rows' float32 sums are stored and reloaded between
 * blocks (the same bits for any block); 512 pairs (256 KiB of 128-channel values, in L2) against 32 (in
 * L1): a full page's vision attention 1.02 against 1.12 s, a page's prefill 5.8-5.9 against 6.0-6.3 s */
#define PAIR_BLOCK 512
#define PV_ROWS 4
#define MAX_HEAD_DIM 256
/* the vision attention's heads per call of the items: their keys and value pairs copied, ~2.4 MB a head
 * of a full page, not the tower's 16 at once: 38 MB less at the peak of a page's vision, and a full
 * page's attention 1.12 against 1.25 s (1 and 4 heads: the same within noise) */
#define VISION_HEADS 2
enum { POOL_BF16 = 0, POOL_INT8 = 1 };

/* a float rounded to bfloat16 bits, to nearest even (as torch's .to(torch.bfloat16) and vcvtneps2bf16) */
static inline uint32_t bf16_bits(float x) {
    union { float f; uint32_t u; } c = {x};
    return (c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16;
}

/* bfloat16 bits -> float32, exactly */
static inline float bf16_float(uint16_t b) {
    union { uint32_t u; float f; } c = {(uint32_t)b << 16};
    return c.f;
}

/* 16 int8 values -> their bfloat16 bits (exact) */
TARGET static inline __m256i int8_to_bf16(const int8_t *p) {
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
}

/* one KV head's keys and values, rows `row` apart: the keys as bfloat16 bits [n][d] into kb where
 * kb is given (int8 keys; bfloat16 rows not one after another: the score loop's 8 keys a step would
 * touch a page each, 1.2 against 2.0 s a full page's layer), the values as key pairs into vp:
 * vp[m][c] = (v[2m][c], v[2m+1][c]), a zero value past n */
TARGET static void prepare_head(int kind, const void *k, const void *v, int64_t n, int d, int64_t row, uint16_t *kb,
                                uint32_t *vp) {
    if (kind == POOL_INT8)
        for (int64_t i = 0; i < n * d; i += 16)
            _mm256_storeu_si256((__m256i *)(kb + i), int8_to_bf16((const int8_t *)k + i));
    else if (kb)
        for (int64_t j = 0; j < n; j++) memcpy(kb + j * d, (const uint16_t *)k + j * row, sizeof(uint16_t) * d);
    for (int64_t m = 0; m < (n + 1) / 2; m++)
        for (int c = 0; c < d; c += 16) {
            __m512i a, b = _mm512_setzero_si512();
            if (kind == POOL_INT8) {
                const int8_t *v0 = (const int8_t *)v + 2 * m * row + c;
                a = _mm512_cvtepu16_epi32(int8_to_bf16(v0));
                if (2 * m + 1 < n) b = _mm512_cvtepu16_epi32(int8_to_bf16(v0 + row));
            } else {
                const uint16_t *v0 = (const uint16_t *)v + 2 * m * row + c;
                a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)v0));
                if (2 * m + 1 < n) b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v0 + row)));
            }
            _mm512_storeu_si512(vp + m * d + c, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
}

/* two 16-row vectors of float32 -> 16 key pairs of bfloat16 bits: lane r = (a[r], b[r]), each rounded
 * to nearest even; one conversion of both and one interleave */
TARGET static inline __m512i pair16(__m512 a, __m512 b) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a)); /* a low, b high */
}

/* e^x of 16 floats for the attention weights, which are rounded to bfloat16 (2^-9 relative): within
 * 2.6e-6 of e^x (x log2 e = n + f, |f| <= 1/2, 2^f by a degree-4 minimax polynomial, times 2^n), 0
 * below -87.3 as exp16. Why not exp16 (within 2 float32 ulps): its 14 operations were ~0.11 s of a
 * full page's 1.02 s vision attention layer; these 10 save ~0.025 s of it (and pair16's one conversion
 * ~0.015 s more against two conversions, widenings and an or). */
TARGET static inline __m512 exp16_weights(__m512 x) {
    const __m512 floor = _mm512_set1_ps(-87.3f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, floor, _CMP_GE_OQ);
    __m512 t = _mm512_mul_ps(_mm512_max_ps(x, floor), _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.009570100344717503f), f, _mm512_set1_ps(0.05591786652803421f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240247443318367f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931217908859253f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999992847442627f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* the scores of 32 query rows (qt: [d / 2][32] bfloat16 pairs) against 8 consecutive keys k [8][d]:
 * s[2i], s[2i + 1] = rows 0-15, 16-31 against key i. Named accumulators: as an array GCC kept the
 * queries' two vectors on the stack and reloaded them for every key. */
TARGET static inline void scores8(const uint16_t *k, int64_t d, const uint32_t *qt, __m512 *s) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    const int32_t *k0 = (const int32_t *)k, *k4 = (const int32_t *)(k + 4 * d);
    const int64_t e = d / 2; /* pairs per key */
    for (int64_t p = 0; p < e; p++) {
        __m512bh q0 = (__m512bh)_mm512_loadu_si512(qt + p * ITEM_ROWS);
        __m512bh q1 = (__m512bh)_mm512_loadu_si512(qt + p * ITEM_ROWS + 16);
#define KEY(i, base, off, a, b)                                                      \
        {                                                                            \
            __m512bh kw = (__m512bh)_mm512_set1_epi32(base[(off) * e + p]);        \
            a = _mm512_dpbf16_ps(a, kw, q0);                                         \
            b = _mm512_dpbf16_ps(b, kw, q1);                                         \
        }
        KEY(0, k0, 0, a0, b0) KEY(1, k0, 1, a1, b1) KEY(2, k0, 2, a2, b2) KEY(3, k0, 3, a3, b3)
        KEY(4, k4, 0, a4, b4) KEY(5, k4, 1, a5, b5) KEY(6, k4, 2, a6, b6) KEY(7, k4, 3, a7, b7)
#undef KEY
    }
    s[0] = a0, s[1] = b0, s[2] = a1, s[3] = b1, s[4] = a2, s[5] = b2, s[6] = a3, s[7] = b3;
    s[8] = a4, s[9] = b4, s[10] = a5, s[11] = b5, s[12] = a6, s[13] = b6, s[14] = a7, s[15] = b7;
}

/* the same for one key: s[0], s[1] */
TARGET static inline void scores1(const uint16_t *k, int64_t d, const uint32_t *qt, __m512 *s) {
    __m512 a = _mm512_setzero_ps(), b = a;
    for (int64_t p = 0; p < d / 2; p++) {
        __m512bh kw = (__m512bh)_mm512_set1_epi32(((const int32_t *)k)[p]);
        a = _mm512_dpbf16_ps(a, kw, (__m512bh)_mm512_loadu_si512(qt + p * ITEM_ROWS));
        b = _mm512_dpbf16_ps(b, kw, (__m512bh)_mm512_loadu_si512(qt + p * ITEM_ROWS + 16));
    }
    s[0] = a, s[1] = b;
}

typedef struct {
    int kind, hkv, g, d;
    int causal;          /* 0: every row sees all pos0 + t keys (the vision tower) */
    int64_t pos0, t;
    const uint16_t *kb;  /* [hkv][n][d] keys as bfloat16 bits */
    int64_t k_stride;    /* elements between heads' keys */
    const uint32_t *vp;  /* [hkv][(n + 1) / 2][d] value pairs */
    const uint16_t *ks, *vs; /* int8: the slot's [hkv][cap] position scales, bfloat16 bits */
    const float *kc;         /* int8: the slot's [hkv][d] channel scales */
    const float *bias;       /* or NULL: [pos0 + t] added to every row's scores (masked keys) */
    int64_t cap;
    const float *q;      /* [t][hkv * g][d], positions q_row values apart (and out's) */
    int64_t q_row;
    float *out;
    const uint16_t *q16; /* or NULL: the queries as bfloat16 bits, in q's place (the vision tower) */
    uint16_t *out16;     /* or NULL: out as bfloat16 bits (rounded to nearest even) */
    float scale;
} Prompt;

/* scratch of one thread: scores [n][32], value weights [n / 2 + 1][32], transposed query pairs
 * [d / 2][32], output sums [32][d] */
typedef struct { float *s; uint32_t *p, *qt; float *o; } Scratch;

/* one work item: KV head h, query positions t0 .. t0 + np - 1 (np * g <= ITEM_ROWS rows) */
TARGET static void prompt_item(const Prompt *a, int h, int64_t t0, int64_t np, Scratch *w) {
    const int g = a->g, d = a->d, rows = (int)np * g;
    const int64_t n = a->causal ? a->pos0 + t0 + np : a->pos0 + a->t; /* keys the item's last row sees */
    const uint16_t *kb = a->kb + h * a->k_stride;
    const uint32_t *vp = a->vp + h * ((a->pos0 + a->t + 1) / 2) * (int64_t)d;
    const uint16_t *ks = a->kind == POOL_INT8 ? a->ks + h * a->cap : NULL;
    const uint16_t *vs = a->kind == POOL_INT8 ? a->vs + h * a->cap : NULL;
    const float *kc = a->kind == POOL_INT8 ? a->kc + h * (int64_t)d : NULL;
    int32_t last[ITEM_ROWS]; /* each row's last visible key; rows past `rows` repeat row 0 */
    for (int r = 0; r < ITEM_ROWS; r++) {
        int rr = r < rows ? r : 0;
        int64_t t = t0 + rr / g;
        last[r] = (int32_t)(a->causal ? a->pos0 + t : n - 1);
        const int64_t at = t * a->q_row + (h * g + rr % g) * (int64_t)d;
        for (int p = 0; p < d / 2; p++) {
            float x0 = a->q16 ? bf16_float(a->q16[at + 2 * p]) : a->q[at + 2 * p];
            float x1 = a->q16 ? bf16_float(a->q16[at + 2 * p + 1]) : a->q[at + 2 * p + 1];
            x0 *= a->scale, x1 *= a->scale;
            if (kc) x0 *= kc[2 * p], x1 *= kc[2 * p + 1];
            w->qt[p * ITEM_ROWS + r] = bf16_bits(x0) | (bf16_bits(x1) << 16);
        }
    }
    const __m512i last0 = _mm512_loadu_si512(last), last1 = _mm512_loadu_si512(last + 16);
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());

    /* A: scores, masked, and each row's maximum */
    __m512 top0 = ninf, top1 = ninf;
    for (int64_t j0 = 0; j0 < n; j0 += KEYS_STEP) {
        __m512 s[2 * KEYS_STEP];
        int keys = n - j0 < KEYS_STEP ? (int)(n - j0) : KEYS_STEP;
        if (keys == KEYS_STEP)
            scores8(kb + j0 * d, d, w->qt, s);
        else
            for (int i = 0; i < keys; i++) scores1(kb + (j0 + i) * d, d, w->qt, s + 2 * i);
        for (int i = 0; i < keys; i++) {
            int64_t j = j0 + i;
            __m512 s0 = s[2 * i], s1 = s[2 * i + 1];
            if (ks) {
                __m512 f = _mm512_set1_ps(bf16_float(ks[j]));
                s0 = _mm512_mul_ps(s0, f), s1 = _mm512_mul_ps(s1, f);
            }
            if (a->bias) {
                __m512 b = _mm512_set1_ps(a->bias[j]);
                s0 = _mm512_add_ps(s0, b), s1 = _mm512_add_ps(s1, b);
            }
            if (a->causal) { /* a row sees key j where j <= its last */
                __m512i jj = _mm512_set1_epi32((int32_t)j);
                s0 = _mm512_mask_mov_ps(ninf, _mm512_cmp_epi32_mask(jj, last0, _MM_CMPINT_LE), s0);
                s1 = _mm512_mask_mov_ps(ninf, _mm512_cmp_epi32_mask(jj, last1, _MM_CMPINT_LE), s1);
            }
            _mm512_storeu_ps(w->s + j * ITEM_ROWS, s0);
            _mm512_storeu_ps(w->s + j * ITEM_ROWS + 16, s1);
            top0 = _mm512_max_ps(top0, s0), top1 = _mm512_max_ps(top1, s1);
        }
    }
    /* B: exponentials summed in float32, the weights in key pairs of bfloat16 */
    const int64_t pairs = (n + 1) / 2;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (int64_t m = 0; m < pairs; m++) {
        const float *sa = w->s + 2 * m * ITEM_ROWS;
        int odd = 2 * m + 1 < n;
        __m512 a0 = exp16_weights(_mm512_sub_ps(_mm512_loadu_ps(sa), top0));
        __m512 a1 = exp16_weights(_mm512_sub_ps(_mm512_loadu_ps(sa + 16), top1));
        __m512 b0 = odd ? exp16_weights(_mm512_sub_ps(_mm512_loadu_ps(sa + ITEM_ROWS), top0)) : _mm512_setzero_ps();
        __m512 b1 = odd ? exp16_weights(_mm512_sub_ps(_mm512_loadu_ps(sa + ITEM_ROWS + 16), top1)) : _mm512_setzero_ps();
        sum0 = _mm512_add_ps(sum0, _mm512_add_ps(a0, b0)), sum1 = _mm512_add_ps(sum1, _mm512_add_ps(a1, b1));
        if (vs) { /* p . (V vs) = (p vs) . V */
            __m512 fa = _mm512_set1_ps(bf16_float(vs[2 * m])), fb = _mm512_set1_ps(odd ? bf16_float(vs[2 * m + 1]) : 0.0f);
            a0 = _mm512_mul_ps(a0, fa), a1 = _mm512_mul_ps(a1, fa), b0 = _mm512_mul_ps(b0, fb), b1 = _mm512_mul_ps(b1, fb);
        }
        _mm512_storeu_si512(w->p + m * ITEM_ROWS, pair16(a0, b0));
        _mm512_storeu_si512(w->p + m * ITEM_ROWS + 16, pair16(a1, b1));
    }
    float inv[ITEM_ROWS];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sum0));
    _mm512_storeu_ps(inv + 16, _mm512_div_ps(_mm512_set1_ps(1.0f), sum1));

    /* C: the weighted values, PV_ROWS rows x 64 channels at a time, by blocks of key pairs */
    memset(w->o, 0, sizeof(float) * ITEM_ROWS * d);
    for (int64_t m0 = 0; m0 < pairs; m0 += PAIR_BLOCK)
        for (int r0 = 0; r0 < rows; r0 += PV_ROWS) {
            int top = r0 + PV_ROWS - 1 < rows ? r0 + PV_ROWS - 1 : rows - 1;
            int64_t seen = (last[top] + 2) / 2; /* pairs the group's last row sees (rows go up in position) */
            int64_t m1 = m0 + PAIR_BLOCK < seen ? m0 + PAIR_BLOCK : seen;
            if (m1 <= m0) continue;
            for (int c = 0; c < d; c += 64) {
                __m512 acc[PV_ROWS][4];
                for (int i = 0; i < PV_ROWS; i++)
                    for (int u = 0; u < 4; u++) acc[i][u] = _mm512_loadu_ps(w->o + (r0 + i) * d + c + 16 * u);
                for (int64_t m = m0; m < m1; m++) {
                    const uint32_t *vr = vp + m * d + c;
                    __m512bh v0 = (__m512bh)_mm512_loadu_si512(vr), v1 = (__m512bh)_mm512_loadu_si512(vr + 16);
                    __m512bh v2 = (__m512bh)_mm512_loadu_si512(vr + 32), v3 = (__m512bh)_mm512_loadu_si512(vr + 48);
#pragma GCC unroll 4
                    for (int i = 0; i < PV_ROWS; i++) {
                        __m512bh pw = (__m512bh)_mm512_set1_epi32((int32_t)w->p[m * ITEM_ROWS + r0 + i]);
                        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], pw, v0);
                        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], pw, v1);
                        acc[i][2] = _mm512_dpbf16_ps(acc[i][2], pw, v2);
                        acc[i][3] = _mm512_dpbf16_ps(acc[i][3], pw, v3);
                    }
                }
                for (int i = 0; i < PV_ROWS; i++)
                    for (int u = 0; u < 4; u++) _mm512_storeu_ps(w->o + (r0 + i) * d + c + 16 * u, acc[i][u]);
            }
        }
    for (int r = 0; r < rows; r++) {
        int64_t t = t0 + r / g;
        const int64_t at = t * a->q_row + (h * g + r % g) * (int64_t)d;
        __m512 f = _mm512_set1_ps(inv[r]);
        for (int c = 0; c < d; c += 16) {
            __m512 y = _mm512_mul_ps(_mm512_loadu_ps(w->o + r * d + c), f);
            if (a->out16)
                _mm256_storeu_si256((__m256i *)(a->out16 + at + c), (__m256i)_mm512_cvtneps_pbh(y));
            else
                _mm512_storeu_ps(a->out + at + c, y);
        }
    }
}

/* Whether the prompt attention takes these shapes (and the CPU runs it). */
int prompt_attention_takes(int hkv, int g, int d) {
    return softmax_takes() && hkv >= 1 && g >= 1 && g <= ITEM_ROWS && d % 64 == 0 && d >= 64 && d <= MAX_HEAD_DIM;
}

/* The work of one call: each KV head's keys and value pairs prepared, then the items (ITEM_ROWS query
 * rows of one KV head), the latest positions first; k0, v0: values of `size` bytes, a head's rows
 * `row` values apart and the heads `head` values apart. */
static int run_items(Prompt *a, const char *k0, const char *v0, int64_t head, int64_t row, int size, int threads) {
    const int kind = a->kind, hkv = a->hkv, g = a->g, d = a->d;
    const int64_t t = a->t, n = a->pos0 + t, pairs = (n + 1) / 2;
    uint16_t *kb = NULL;
    uint32_t *vp = (uint32_t *)malloc(sizeof(uint32_t) * hkv * pairs * d);
    const int own_keys = kind == POOL_INT8 || row != d; /* keys copied into kb, one after another (see prepare_head) */
    if (own_keys) kb = (uint16_t *)malloc(sizeof(uint16_t) * hkv * n * d);
    if (!vp || (own_keys && !kb)) {
        free(vp), free(kb);
        return -2;
    }
    a->kb = own_keys ? kb : (const uint16_t *)k0;
    a->k_stride = own_keys ? n * d : head;
    a->vp = vp;
    const int per = ITEM_ROWS / g; /* positions per item */
    const int64_t blocks = (t + per - 1) / per, items = hkv * blocks;
    int nt = threads < 1 ? 1 : threads > 64 ? 64 : threads, failed = 0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int h = 0; h < hkv; h++)
        prepare_head(kind, k0 + h * head * size, v0 + h * head * size, n, d, row, kb ? kb + h * n * d : NULL,
                     vp + h * pairs * d);
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        Scratch w = {(float *)malloc(sizeof(float) * n * ITEM_ROWS),
                     (uint32_t *)malloc(sizeof(uint32_t) * (pairs + 1) * ITEM_ROWS),
                     (uint32_t *)malloc(sizeof(uint32_t) * d / 2 * ITEM_ROWS),
                     (float *)malloc(sizeof(float) * ITEM_ROWS * d)};
        int ok = w.s && w.p && w.qt && w.o;
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t i = items - 1; i >= 0; i--) { /* the latest positions, with the most keys, first */
            if (!ok) continue;
            int64_t b = i / hkv, t0 = b * per;
            prompt_item(a, (int)(i % hkv), t0, t0 + per <= t ? per : t - t0, &w);
        }
        free(w.s), free(w.p), free(w.qt), free(w.o);
    }
    free(vp), free(kb);
    return failed ? -2 : 0;
}

/* A prompt chunk's causal attention at one layer of a KV pool: queries q [t][hkv * g][d] float32 at
 * positions pos0 .. pos0 + t - 1 (their keys already stored) over positions 0 .. pos0 + t - 1 of
 * pool slot `slot` -> out [t][hkv * g][d] float32. k, v: the layer [slots][hkv][cap][d], bfloat16
 * bits (kind 0) or int8 (kind 1) with ks, vs [slots][hkv][cap] (bfloat16 bits) and kc [slots][hkv][d].
 * 0, or -1 for shapes it does not take, -2 when out of memory. */
int prompt_attention(int kind, const void *k, const void *v, const uint16_t *ks, const uint16_t *vs, const float *kc,
                     int64_t cap, int64_t slot, int64_t pos0, int64_t t, const float *q, float *out, int hkv, int g,
                     int d, float scale, int threads) {
    if (!prompt_attention_takes(hkv, g, d) || t < 1 || pos0 < 0 || pos0 + t > cap || (kind != POOL_BF16 && kind != POOL_INT8))
        return -1;
    const int size = kind == POOL_INT8 ? 1 : 2;
    const char *k0 = (const char *)k + slot * hkv * cap * d * size, *v0 = (const char *)v + slot * hkv * cap * d * size;
    Prompt a = {.kind = kind, .hkv = hkv, .g = g, .d = d, .causal = 1, .pos0 = pos0, .t = t, .cap = cap, .q = q,
                .q_row = (int64_t)hkv * g * d, .out = out, .scale = scale};
    if (kind == POOL_INT8)
        a.ks = ks + slot * hkv * cap, a.vs = vs + slot * hkv * cap, a.kc = kc + slot * hkv * (int64_t)d;
    return run_items(&a, k0, v0, cap * d, d, size, threads);
}

/* The vision tower's attention, not causal: queries, keys and values q, k, v [n][heads][d] bfloat16
 * bits (the rows of the projections, as they come), bias [n] float32 added to every row's scores (or
 * NULL) -> out [n][heads][d] bfloat16 bits. Why: torch's products by query blocks write, soft-max and
 * read again 16 x 9,350 x 9,350 bfloat16 scores a layer of a full page, and a product of 64-deep rows
 * runs well below the bfloat16 units' rate; here as a prompt's items (one position a query row, so 32
 * rows an item), the scores in float32 in the thread's cache (docs/benchmarks.md).
 * 0, or -1 for shapes it does not take, -2 when out of memory. */
int full_attention(const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *bias, int64_t n,
                   uint16_t *out, int heads, int d, float scale, int threads) {
    if (!prompt_attention_takes(heads, 1, d) || n < 1 || n > INT32_MAX - 2) return -1;
    const int64_t row = (int64_t)heads * d;
    for (int h0 = 0; h0 < heads; h0 += VISION_HEADS) { /* the keys and value pairs of a few heads at a time */
        int hn = heads - h0 < VISION_HEADS ? heads - h0 : VISION_HEADS;
        Prompt a = {.kind = POOL_BF16, .hkv = hn, .g = 1, .d = d, .causal = 0, .pos0 = 0, .t = n, .bias = bias,
                    .cap = n, .q16 = q + h0 * d, .q_row = row, .out16 = out + h0 * d, .scale = scale};
        int rc = run_items(&a, (const char *)(k + h0 * d), (const char *)(v + h0 * d), d, row, 2, threads);
        if (rc) return rc;
    }
    return 0;
}
