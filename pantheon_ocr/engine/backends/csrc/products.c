/* Products of int8 rows, 4-, 5- and 8-bit tiles and bfloat16 rows with activation rows, for x86-64 CPUs with
 * AVX2, FMA and F16C; with AVX-512 VNNI where the build has it (products.py builds and loads it).
 *
 * Why: a decode step streams every weight once for a handful of rows, so it runs at memory speed
 * only if the arithmetic per weight byte is small. torch's int8 and int4 kernels widen each weight
 * to float and multiply bfloat16 rows: SmolLM2-135M's 120 products took ~4.9 ms a step at ~13 GB/s
 * (docs/benchmarks.md). Here, as in llama.cpp, each activation row is quantized to int8 in blocks
 * of 32 (a float scale per block) and weights and activations are multiplied as integers, 64 pairs
 * per instruction (vpdpbusd), exactly; floats enter once per block.
 *
 * Exact rows: an output (row m, column n) is one fixed sequence of operations on row m of the
 * activations and row n of the matrix, whatever the number of rows, their grouping into register
 * blocks or the thread that computes it, so a sequence's bits are the same alone and in any batch.
 *
 * Three layouts:
 * - int8 rows: q [n, k] int8 with a bfloat16 scale per row (torch_weights.int8_rows), read as they
 *   are. With VNNI each weight is offset to unsigned (w + 128 = w ^ 0x80) and the offset's share,
 *   128 * sum(x), is taken off once per output row; AVX2 multiplies |w| by x with w's sign.
 * - bfloat16 rows: w [n, k] as stored (a BF16 file's own pages), times bfloat16 activation rows,
 *   float32 sums: vdpbf16ps where the CPU has AVX-512 BF16 (chosen at run time), else each value
 *   widened to float32 and multiplied-added. oneDNN's bfloat16 GEMM gave a row other bits among 7 or
 *   more rows than alone on an AVX-512 BF16 EPYC (one bfloat16 step in 14 rows' logits), so exact
 *   rows cannot rest on it.
 * - 4-, 5- and 8-bit tiles (pack_tiles): the file's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks regrouped
 *   16 rows at a time so that one 32-bit lane holds one row: per (16 rows, 32 columns) a record
 *   (RECORD) of 64-byte parts, part p holding for each of the 16 rows the 4 bytes 4p..4p+3 of its
 *   block: 4-bit, four parts whose low nibbles are the weights 4p..4p+3 and high nibbles 16+4p..19+4p;
 *   5-bit, those and 64 bytes of their fifth bits (tile_rows says where); 8-bit, eight parts of the
 *   weights 4p..4p+3 as unsigned bytes q = w + 128. Then the 16 rows' float16 scales d and minimums m
 *   (Q4_0: m = -8 d, Q5_0: m = -16 d). Weight = d q + m. An 8-bit tile keeps its blocks' 512 bytes of
 *   weights one after another, then their 16 float16 d each (m = -128 d, exact, made as it is used):
 *   1.0625 bytes a weight as in the file, and each block's weights on whole cache lines. A lane's row needs no
 *   horizontal sum, and the AVX2 and VNNI paths sum the same integers and make the same float
 *   operations per lane: the same bits.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
#include <pthread.h>
#endif

#define QK 32         /* activation block, and a 4-bit group */
#define TILE 16       /* rows of a 4-bit tile */
/* a tile's bytes per block: 256 of nibbles [and 64 of fifth bits], 32 of d, 32 of m; or 512 of bytes and 32 of d */
#define RECORD(bits) ((bits) == 8 ? 544 : (bits) == 5 ? 384 : 320)
#define WEIGHTS(bits) ((bits) == 8 ? 512 : RECORD(bits)) /* a block's weights step */
/* a block's d: after its weights (4-, 5-bit: m follows), or after all the tile's weights (8-bit) */
#define SCALES(tile, bits, b, kb) ((bits) == 8 ? (tile) + 512 * (kb) + 32 * (b) : (tile) + RECORD(bits) * (b) + RECORD(bits) - 64)
#define ROWS 8        /* activation rows per register block */
#define MAX_THREADS 64
/* How far ahead the weights are asked for: the hardware prefetcher stops at each 4 KiB page. Measured
 * on SmolLM2-135M's 120 matrices and head (AVX-512 EPYC, 2 threads): 30 layers 3.1 -> 2.8 ms, the
 * int8 head 1.5 -> 1.0 ms. */
#define AHEAD_ROWS 16    /* int8 rows */
#define AHEAD_BYTES 4096 /* tiles */
#define INLINE static inline __attribute__((always_inline))

/* A register block's number of rows r as a constant in each case: its loops unroll and the
 * accumulators stay in registers (indexed by a run-time row they lived on the stack) */
#define BY_ROWS(r, CALL)                                                                               \
    switch (r) {                                                                                       \
        case 1: CALL(1); break;                                                                        \
        case 2: CALL(2); break;                                                                        \
        case 3: CALL(3); break;                                                                        \
        case 4: CALL(4); break;                                                                        \
        case 5: CALL(5); break;                                                                        \
        case 6: CALL(6); break;                                                                        \
        case 7: CALL(7); break;                                                                        \
        default: CALL(8); break;                                                                       \
    }

/* Quantized activation rows, in one buffer (acts_size): q [m, k] int8, then per row and block the
 * scale d and s = d * sum(q) [m, k / 32] float32, each block's d repeated over 8 lanes [m, k / 4],
 * and per row 128 * the sum of its s (the int8 rows' offset, VNNI). */
typedef struct {
    int64_t m, k, kb;
    const int8_t *q;
    const float *d, *s, *lanes, *offset;
} acts_t;

static int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }

static acts_t acts_of(const void *buf, int64_t m, int64_t k) {
    const char *p = (const char *)buf;
    int64_t kb = k / QK;
    acts_t a = {m, k, kb, (const int8_t *)p, 0, 0, 0, 0};
    p += up64(m * k);
    a.d = (const float *)p, p += up64(4 * m * kb);
    a.s = (const float *)p, p += up64(4 * m * kb);
    a.lanes = (const float *)p, p += up64(4 * m * kb * 8);
    a.offset = (const float *)p;
    return a;
}

int64_t acts_size(int64_t m, int64_t k) {
    int64_t kb = k / QK;
    return up64(m * k) + 2 * up64(4 * m * kb) + up64(4 * m * kb * 8) + up64(4 * m);
}

/* Row r of x quantized into a: each block of 32 as d = its largest magnitude / 127 and q = x / d rounded
 * to nearest even (all zero where the block is). The AVX-512 path makes the scalar path's bits: the
 * same float multiply and rounding per value, the largest magnitude taken as the scalar loop takes it
 * (a NaN never wins), the integer sum exact, the row's total summed block after block. */
static void quantize_row(const float *x, int64_t r, int64_t ldx, const acts_t *a) {
    const int64_t k = a->k;
    int8_t *q = (int8_t *)a->q + r * k;
    float *d = (float *)a->d + r * a->kb, *s = (float *)a->s + r * a->kb;
    float *lanes = (float *)a->lanes + r * a->kb * 8;
    float total = 0.0f;
    for (int64_t b = 0; b < a->kb; b++) {
        const float *xb = x + r * ldx + b * QK;
        int8_t *qb = q + b * QK;
        int sum = 0;
#if defined(__AVX512F__)
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        __m512 top16 = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps()); /* a NaN lane gives 0 */
        top16 = _mm512_max_ps(_mm512_abs_ps(x1), top16);
        float top = _mm512_reduce_max_ps(top16);
        float db = top / 127.0f, inv = top > 0.0f ? 127.0f / top : 0.0f;
        const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(inv))); /* nearest even, as nearbyintf */
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(inv)));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), lo);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), lo);
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtepi32_epi8(q1));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
        float top = 0.0f;
        for (int i = 0; i < QK; i++) {
            float v = xb[i] < 0 ? -xb[i] : xb[i];
            top = v > top ? v : top;
        }
        float db = top / 127.0f, inv = top > 0.0f ? 127.0f / top : 0.0f;
        for (int i = 0; i < QK; i++) {
            int v = (int)__builtin_nearbyintf(xb[i] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            qb[i] = (int8_t)v;
            sum += v;
        }
#endif
        d[b] = db;
        s[b] = db * (float)sum;
        for (int j = 0; j < 8; j++) lanes[b * 8 + j] = db;
        total += s[b];
    }
    ((float *)a->offset)[r] = 128.0f * total;
}

/* Rows worth a second thread: a page's prompt chunk is 512 rows; a decode step's few rows are not */
#define QUANTIZE_SHARE 64

/* x [m, k] float32 (row stride ldx) -> buf (acts_size), on up to `threads` threads; every row is
 * its own, so the bits do not depend on them. 0, or -1 for a width that is not whole blocks. */
int quantize_rows_mt(const float *x, int64_t m, int64_t k, int64_t ldx, void *buf, int threads) {
    if (k % QK) return -1;
    acts_t a = acts_of(buf, m, k);
    int nt = m < 2 * QUANTIZE_SHARE || threads < 2 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t r = 0; r < m; r++) quantize_row(x, r, ldx, &a);
#else
    (void)nt;
    for (int64_t r = 0; r < m; r++) quantize_row(x, r, ldx, &a);
#endif
    return 0;
}

/* The same on the calling thread (the compiled decode step's few rows). */
int quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, void *buf) {
    return quantize_rows_mt(x, m, k, ldx, buf, 1);
}

INLINE float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE float sum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VNNI 1

/* int8 rows n and n + 1 (if two) against activation rows m0 .. m0 + r - 1: lane j of a 64-column
 * chunk c sums 4 products of block 2c + j / 8 */
INLINE void int8_rows_block(const int8_t *w, const uint16_t *scale, int64_t n, int two, const acts_t *a,
                            int64_t m0, int r, float *y, int64_t ldy) {
    const int64_t k = a->k;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[2][ROWS];
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 64) {
        __mmask64 mask = k - c >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - c)) - 1);
        __m512i w0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w + n * k + c), flip);
        __m512i w1 = two ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w + (n + 1) * k + c), flip) : w0;
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS) * k + c), _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS + 1) * k + c), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m512i x = _mm512_maskz_loadu_epi8(mask, a->q + (m0 + j) * k + c);
            __m512 l = _mm512_maskz_loadu_ps((__mmask16)(mask == ~(__mmask64)0 ? 0xFFFF : 0x00FF),
                                             a->lanes + (m0 + j) * a->kb * 8 + c / 4);
            acc[0][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, x)), l,
                                        acc[0][j]);
            if (two)
                acc[1][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, x)),
                                            l, acc[1][j]);
        }
    }
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 1 + two; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m512 v = acc[i][j];
            float t = sum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
            y[(m0 + j) * ldy + n + i] = bf16_to_f32(scale[n + i]) * (t - a->offset[m0 + j]);
        }
}
#else
#define VNNI 0

/* int8 rows n..n+two against activation rows m0..m0+r, 32 columns (one block) at a time: |w| times x
 * with w's sign, pairs summed in 16 bits (at most 2 * 127 * 127: no saturation) */
INLINE void int8_rows_block(const int8_t *w, const uint16_t *scale, int64_t n, int two, const acts_t *a,
                            int64_t m0, int r, float *y, int64_t ldy) {
    const int64_t k = a->k;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][ROWS];
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += QK) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + n * k + c));
        __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)(w + (n + 1) * k + c)) : w0;
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS) * k + c), _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS + 1) * k + c), _MM_HINT_T0);
        __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + (m0 + j) * k + c));
            __m256 db = _mm256_set1_ps(a->d[(m0 + j) * a->kb + c / QK]);
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones);
            acc[0][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), db, acc[0][j]);
            if (two) {
                __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones);
                acc[1][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), db, acc[1][j]);
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 1 + two; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) y[(m0 + j) * ldy + n + i] = bf16_to_f32(scale[n + i]) * sum8(acc[i][j]);
}
#endif

/* Bit k (0..7) of each byte of h moved to bit 4, the rest 0 (16-bit shifts: bit 4 of a byte never takes
 * a bit of its neighbour for shifts of 4 left to 3 right) */
#define FIFTH512(h, k) _mm512_and_si512((k) <= 4 ? _mm512_slli_epi16(h, 4 - (k)) : _mm512_srli_epi16(h, (k) - 4), \
                                        _mm512_set1_epi8(0x10))
#define FIFTH256(h, k) _mm256_and_si256((k) <= 4 ? _mm256_slli_epi16(h, 4 - (k)) : _mm256_srli_epi16(h, (k) - 4), \
                                        _mm256_set1_epi8(0x10))

/* One tile (16 rows) of 4-, 5- or 8-bit weights (bits, a constant at each call) against activation rows
 * m0..m0+r; writes the tile's `live` columns. The operations per lane: for each block, the integer
 * isum = sum of q x, acc = fma(float(isum), d * xd, acc), then acc = fma(m, xs, acc). A 5-bit record's
 * 64 bytes of fifth bits hold, in byte i of a row's lane, the fifth bit of weight 4p + i at bit 2p and
 * of weight 16 + 4p + i at bit 2p + 1. */
#if VNNI
INLINE void tile_rows(const uint8_t *tile, const acts_t *a, int64_t m0, int r, float *y, int64_t ldy, int64_t n0,
                    int live, int bits) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[ROWS];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < ROWS; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->kb; b++) {
        const uint8_t *rec = tile + b * WEIGHTS(bits);
        for (int l = 0; l < WEIGHTS(bits); l += 64) _mm_prefetch((const char *)rec + AHEAD_BYTES + l, _MM_HINT_T0);
        __m512i lo[4], hi[4]; /* the parts paired with x[p] and x[4 + p] */
        _Pragma("GCC unroll 4")
        for (int p = 0; p < 4; p++) {
            if (bits == 8) {
                lo[p] = _mm512_loadu_si512((const void *)(rec + 64 * p));
                hi[p] = _mm512_loadu_si512((const void *)(rec + 64 * (4 + p)));
                continue;
            }
            __m512i v = _mm512_loadu_si512((const void *)(rec + 64 * p));
            lo[p] = _mm512_and_si512(v, low);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        if (bits == 5) {
            __m512i h = _mm512_loadu_si512((const void *)(rec + 256));
            lo[0] = _mm512_or_si512(lo[0], FIFTH512(h, 0)), hi[0] = _mm512_or_si512(hi[0], FIFTH512(h, 1));
            lo[1] = _mm512_or_si512(lo[1], FIFTH512(h, 2)), hi[1] = _mm512_or_si512(hi[1], FIFTH512(h, 3));
            lo[2] = _mm512_or_si512(lo[2], FIFTH512(h, 4)), hi[2] = _mm512_or_si512(hi[2], FIFTH512(h, 5));
            lo[3] = _mm512_or_si512(lo[3], FIFTH512(h, 6)), hi[3] = _mm512_or_si512(hi[3], FIFTH512(h, 7));
        }
        const uint8_t *scales = SCALES(tile, bits, b, a->kb);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)scales));
        __m512 mn = bits == 8 ? _mm512_mul_ps(d, _mm512_set1_ps(-128.0f))
                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + 32)));
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            const int32_t *x = (const int32_t *)(a->q + (m0 + j) * a->k + b * QK);
            __m512i s = _mm512_setzero_si512(), t = _mm512_setzero_si512(); /* two chains: half the latency */
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++) {
                s = _mm512_dpbusd_epi32(s, lo[p], _mm512_set1_epi32(x[p]));
                t = _mm512_dpbusd_epi32(t, hi[p], _mm512_set1_epi32(x[4 + p]));
            }
            s = _mm512_add_epi32(s, t);
            int64_t at = (m0 + j) * a->kb + b;
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(a->d[at])), acc[j]);
            acc[j] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a->s[at]), acc[j]);
        }
    }
    __mmask16 keep = (__mmask16)((1u << live) - 1);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < r; j++) _mm512_mask_storeu_ps(y + (m0 + j) * ldy + n0, keep, acc[j]);
}
#else
INLINE void tile_rows(const uint8_t *tile, const acts_t *a, int64_t m0, int r, float *y, int64_t ldy, int64_t n0,
                    int live, int bits) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 of the tile */
        if (8 * h >= live) break;
        __m256 acc[ROWS];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < a->kb; b++) {
            const uint8_t *rec = tile + b * WEIGHTS(bits);
            for (int l = 0; l < WEIGHTS(bits); l += 64) _mm_prefetch((const char *)rec + AHEAD_BYTES + l, _MM_HINT_T0);
            __m256i lo[8], hi[8]; /* 4-, 5-bit: the parts paired with x[p] (lo) and x[4 + p] (hi); 8-bit: part p's
                                   * low and high nibbles, both paired with x[p] */
            _Pragma("GCC unroll 8")
            for (int p = 0; p < (bits == 8 ? 8 : 4); p++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * p + 32 * h));
                lo[p] = _mm256_and_si256(v, low);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
            if (bits == 5) { /* q <= 31: pairs of q x still fit 16 bits (2 * 31 * 127) */
                __m256i f = _mm256_loadu_si256((const __m256i *)(rec + 256 + 32 * h));
                lo[0] = _mm256_or_si256(lo[0], FIFTH256(f, 0)), hi[0] = _mm256_or_si256(hi[0], FIFTH256(f, 1));
                lo[1] = _mm256_or_si256(lo[1], FIFTH256(f, 2)), hi[1] = _mm256_or_si256(hi[1], FIFTH256(f, 3));
                lo[2] = _mm256_or_si256(lo[2], FIFTH256(f, 4)), hi[2] = _mm256_or_si256(hi[2], FIFTH256(f, 5));
                lo[3] = _mm256_or_si256(lo[3], FIFTH256(f, 6)), hi[3] = _mm256_or_si256(hi[3], FIFTH256(f, 7));
            }
            const uint8_t *scales = SCALES(tile, bits, b, a->kb);
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + 16 * h)));
            __m256 mn = bits == 8 ? _mm256_mul_ps(d, _mm256_set1_ps(-128.0f))
                                  : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + 32 + 16 * h)));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < r; j++) {
                const int32_t *x = (const int32_t *)(a->q + (m0 + j) * a->k + b * QK);
                __m256i s = _mm256_setzero_si256();
                if (bits == 8) { /* q = 16 hi + lo: pairs of q x would pass 16 bits, pairs of a nibble times x do not */
                    __m256i t = _mm256_setzero_si256();
                    _Pragma("GCC unroll 8")
                    for (int p = 0; p < 8; p++) {
                        __m256i xp = _mm256_set1_epi32(x[p]);
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[p], xp), ones));
                        t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[p], xp), ones));
                    }
                    s = _mm256_add_epi32(s, _mm256_slli_epi32(t, 4));
                } else {
                    _Pragma("GCC unroll 4")
                    for (int p = 0; p < 4; p++) { /* q <= 31: pairs of q x fit 16 bits */
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[p], _mm256_set1_epi32(x[p])), ones));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[p], _mm256_set1_epi32(x[4 + p])), ones));
                    }
                }
                int64_t at = (m0 + j) * a->kb + b;
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(a->d[at])), acc[j]);
                acc[j] = _mm256_fmadd_ps(mn, _mm256_set1_ps(a->s[at]), acc[j]);
            }
        }
        int n = live - 8 * h < 8 ? live - 8 * h : 8;
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            float out[8];
            _mm256_storeu_ps(out, acc[j]);
            memcpy(y + (m0 + j) * ldy + n0 + 8 * h, out, sizeof(float) * n);
        }
    }
}
#endif


/* ---- bfloat16 rows: lane j of a 32-column chunk sums columns 2j and 2j + 1 (AVX-512), or 8 lanes
 * of one column each (AVX2 without AVX-512) ---- */

#if defined(__AVX512F__) && defined(__AVX512BW__)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) INLINE void bf16_rows_dp(const uint16_t *w, int64_t n, int two, const uint16_t *x, int64_t k, int64_t m0, int r,
                         float *y, int64_t ldy) {
    __m512 acc[2][ROWS];
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        __mmask32 mask = k - c >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (k - c)) - 1);
        __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + n * k + c);
        __m512bh w1 = two ? (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (n + 1) * k + c) : w0;
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS) * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS + 1) * k + c), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (m0 + j) * k + c);
            acc[0][j] = _mm512_dpbf16_ps(acc[0][j], xv, w0);
            if (two) acc[1][j] = _mm512_dpbf16_ps(acc[1][j], xv, w1);
        }
    }
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 1 + two; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) y[(m0 + j) * ldy + n + i] = _mm512_reduce_add_ps(acc[i][j]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void bf16_rows_dp_any(
    const uint16_t *w, int64_t n, int two, const uint16_t *x, int64_t k, int64_t m0, int r, float *y, int64_t ldy) {
#define DP(R) bf16_rows_dp(w, n, two, x, k, m0, R, y, ldy)
    BY_ROWS(r, DP)
#undef DP
}

INLINE void bf16_rows_fma(const uint16_t *w, int64_t n, int two, const uint16_t *x, int64_t k, int64_t m0, int r,
                          float *y, int64_t ldy) {
    __m512 acc[2][ROWS];
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[i][j] = _mm512_setzero_ps();
#define WIDEN16(p, mask) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16))
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 mask = k - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - c)) - 1);
        __m512 w0 = WIDEN16(w + n * k + c, mask), w1 = two ? WIDEN16(w + (n + 1) * k + c, mask) : w0;
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS) * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS + 1) * k + c), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m512 xv = WIDEN16(x + (m0 + j) * k + c, mask);
            acc[0][j] = _mm512_fmadd_ps(xv, w0, acc[0][j]);
            if (two) acc[1][j] = _mm512_fmadd_ps(xv, w1, acc[1][j]);
        }
    }
#undef WIDEN16
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 1 + two; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) y[(m0 + j) * ldy + n + i] = _mm512_reduce_add_ps(acc[i][j]);
}
#else
INLINE void bf16_rows_fma(const uint16_t *w, int64_t n, int two, const uint16_t *x, int64_t k, int64_t m0, int r,
                          float *y, int64_t ldy) {
    __m256 acc[2][ROWS];
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < ROWS; j++) acc[i][j] = _mm256_setzero_ps();
#define WIDEN8(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
        __m256 w0 = WIDEN8(w + n * k + c), w1 = two ? WIDEN8(w + (n + 1) * k + c) : w0;
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS) * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (n + AHEAD_ROWS + 1) * k + c), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            __m256 xv = WIDEN8(x + (m0 + j) * k + c);
            acc[0][j] = _mm256_fmadd_ps(xv, w0, acc[0][j]);
            if (two) acc[1][j] = _mm256_fmadd_ps(xv, w1, acc[1][j]);
        }
    }
#undef WIDEN8
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 1 + two; i++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < r; j++) {
            float t = sum8(acc[i][j]);
            for (int64_t e = c; e < k; e++) /* k is a multiple of 2 at least; the rest one by one */
                t += bf16_to_f32(x[(m0 + j) * k + e]) * bf16_to_f32(w[(n + i) * k + e]);
            y[(m0 + j) * ldy + n + i] = t;
        }
}
#endif

static int bf16_units(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* ---- the work split: items (pairs of int8 rows, or tiles) in equal static shares ---- */

typedef struct {
    int kind; /* 0 int8 rows, 1 4-bit tiles, 2 bfloat16 rows, 3 5-bit tiles, 4 8-bit tiles */
    const void *w;
    const uint16_t *scale;
    const uint16_t *x; /* bfloat16 rows [m, k] */
    int dp;            /* bfloat16 rows through vdpbf16ps */
    int64_t n;
    acts_t a;
    float *y;
    int64_t ldy;
} job_t;

static void run_items(const job_t *j, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
        for (int64_t m0 = 0; m0 < j->a.m; m0 += ROWS) {
            int r = j->a.m - m0 < ROWS ? (int)(j->a.m - m0) : ROWS;
            int64_t n = 2 * i, n0 = TILE * i;
            int two = n + 1 < j->n, live = j->n - n0 < TILE ? (int)(j->n - n0) : TILE;
            if (j->kind == 2) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
                if (j->dp) {
                    bf16_rows_dp_any((const uint16_t *)j->w, n, two, j->x, j->a.k, m0, r, j->y, j->ldy);
                    continue;
                }
#endif
#define FMA(R) bf16_rows_fma((const uint16_t *)j->w, n, two, j->x, j->a.k, m0, R, j->y, j->ldy)
                BY_ROWS(r, FMA)
            } else if (j->kind == 0) {
#define INT8(R) int8_rows_block((const int8_t *)j->w, j->scale, n, two, &j->a, m0, R, j->y, j->ldy)
                BY_ROWS(r, INT8)
            } else {
#define TILES(R, BITS) tile_rows((const uint8_t *)j->w + i * j->a.kb * RECORD(BITS), &j->a, m0, R, j->y, j->ldy, n0, \
                                  live, BITS)
#define Q4(R) TILES(R, 4)
#define Q5(R) TILES(R, 5)
#define Q8(R) TILES(R, 8)
                if (j->kind == 3) {
                    BY_ROWS(r, Q5)
                } else if (j->kind == 4) {
                    BY_ROWS(r, Q8)
                } else {
                    BY_ROWS(r, Q4)
                }
            }
        }
}

#ifndef _OPENMP
typedef struct {
    const job_t *job;
    int64_t i0, i1;
} share_t;

static void *run_share(void *arg) {
    const share_t *s = (const share_t *)arg;
    run_items(s->job, s->i0, s->i1);
    return NULL;
}
#endif

static void run_job(const job_t *j, int64_t items, int threads) {
    int nt = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (nt > items) nt = (int)items;
    if (nt <= 1) {
        run_items(j, 0, items);
        return;
    }
#ifdef _OPENMP
    /* torch's own pool (its libgomp is the one loaded): see decode_attention.c */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        run_items(j, items * t / n, items * (t + 1) / n);
    }
#else
    pthread_t tid[MAX_THREADS];
    share_t share[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++) share[t] = (share_t){j, items * t / nt, items * (t + 1) / nt};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&tid[t], NULL, run_share, &share[t]) == 0;
    run_share(&share[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else run_share(&share[t]);
    }
#endif
}

/* y [m, n] (row stride ldy) = the activations (quantize_rows' buffer of m rows of k) @ W.T for int8
 * rows w [n, k] with bfloat16 scales [n]. 0, or -1 for a width that is not whole blocks. */
int product_int8(const int8_t *w, const uint16_t *scale, int64_t n, int64_t k, const void *acts, int64_t m, float *y,
                 int64_t ldy, int threads) {
    if (k % QK || m < 1) return -1;
    job_t j = {0, w, scale, 0, 0, n, acts_of(acts, m, k), y, ldy};
    run_job(&j, (n + 1) / 2, threads);
    return 0;
}

/* The same for tiles (pack_tiles) of 4-, 5- or 8-bit weights (bits) of n rows (the last tile padded). */
int product_tiles(const uint8_t *tiles, int bits, int64_t n, int64_t k, const void *acts, int64_t m, float *y,
                  int64_t ldy, int threads) {
    if (k % QK || m < 1 || (bits != 4 && bits != 5 && bits != 8)) return -1;
    job_t j = {bits == 8 ? 4 : bits == 5 ? 3 : 1, tiles, 0, 0, 0, n, acts_of(acts, m, k), y, ldy};
    run_job(&j, (n + TILE - 1) / TILE, threads);
    return 0;
}

/* y [m, n] (row stride ldy) = x [m, k] bfloat16 bits @ w.T for bfloat16 rows w [n, k] (k even), in
 * float32. */
int product_bf16(const uint16_t *w, int64_t n, int64_t k, const uint16_t *x, int64_t m, float *y, int64_t ldy,
                 int threads) {
    static int dp = -1;
    if (dp < 0) dp = bf16_units();
    if (k % 2 || m < 1) return -1;
    acts_t a = {m, k, 0, 0, 0, 0, 0, 0};
    job_t j = {2, w, 0, x, dp, n, a, y, ldy};
    run_job(&j, (n + 1) / 2, threads);
    return 0;
}

/* Whether bfloat16 rows multiply with the CPU's bfloat16 units (vdpbf16ps). */
int products_bf16_units(void) { return bf16_units(); }

/* Whether this build multiplies with VNNI (1) or AVX2 (0). */
int products_vnni(void) { return VNNI; }
