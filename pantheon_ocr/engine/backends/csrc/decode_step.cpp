/* A decode step's whole layer chain in one call: the torch decode step (torch_blocks.py) without a
 * Python operation per tensor (native_step.py builds it against torch's headers and loads it).
 *
 * Why: a SmolLM2-135M step at one sequence is 30 layers of ~70 small torch operations, each a few
 * microseconds of Python and dispatch: 17.5 ms a step, of which the products are ~7 ms (Xeon, 2
 * threads). Here the products are torch_weights.linear's exact-rows paths (the same kernels, so the
 * same bits per row): int8 rows and 4-, 5- and 8-bit tiles through csrc/products.c (handed over by address,
 * each input's rows quantized once for the matrices that share them) where it builds, else the same
 * ATen calls; everything between them is a plain loop over a few thousand floats: norms, biases,
 * RoPE, the KV pool's store, SwiGLU and the residual sums.
 *
 * Exact rows: every loop below treats each row (sequence) alone, in an order that depends on the
 * shapes only, the products are exact-rows for any M (`Matrix.mode`), and attention is
 * csrc/decode_attention.c (a sequence's sums never depend on the others), so a sequence's bits are
 * the same alone and in any batch.
 *
 * Built without -march and with -ffp-contract=off: no multiply-add is fused behind the code's back,
 * so RoPE's and the norms' roundings are the ones written here on every x86-64 machine.
 */
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <vector>

namespace {

enum Kind { BF16 = 0, INT8 = 1, INT4 = 2, TILES4 = 3, TILES5 = 4, TILES8 = 5 }; /* torch_weights.kind_of; tiles */
bool is_tiles(int kind) { return kind == TILES4 || kind == TILES5 || kind == TILES8; }
int tile_bits(int kind) { return kind == TILES8 ? 8 : kind == TILES5 ? 5 : 4; }
enum Mode { ONE_CALL = 0, PAD_LONE = 1, BLOCKS = 2 }; /* torch_weights.linear's exact-rows paths */
enum Role { QKV = 0, OUTPUT = 1, GATE_UP = 2, DOWN = 3 };
enum Pool { POOL_BF16 = 0, POOL_INT8 = 1 };          /* decode_attention.c's kinds */
constexpr int64_t ROW_BLOCK = 16, INT4_GROUP = 32;

/* decode_attention.c's entry point, handed over by address (native.py loaded it) */
using Attention = int (*)(int, const void *, const void *, const uint16_t *, const uint16_t *, const float *, int64_t,
                          const int64_t *, const int64_t *, int, const float *, float *, int, int, int, float, int);

/* csrc/products.c's entry points, handed over by address (products.py loaded it), or all null */
struct Products {
    int64_t (*size)(int64_t, int64_t) = nullptr;
    int (*quantize)(const float *, int64_t, int64_t, int64_t, void *) = nullptr;
    int (*int8)(const int8_t *, const uint16_t *, int64_t, int64_t, const void *, int64_t, float *, int64_t,
                int) = nullptr;
    int (*tiles)(const uint8_t *, int, int64_t, int64_t, const void *, int64_t, float *, int64_t, int) = nullptr;
    int (*bf16)(const uint16_t *, int64_t, int64_t, const uint16_t *, int64_t, float *, int64_t, int) = nullptr;
};

struct Matrix {
    int kind = BF16, mode = ONE_CALL;
    int64_t out = 0, in = 0;
    at::Tensor w, s; /* bf16 [out, in] | int8 [out, in] and bf16 scales [out] | int4 pack and scales_zeros | tiles */
};

struct Layer {
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
    std::vector<Matrix> qkv, gate_up; /* one stacked matrix, or its parts in order */
    Matrix output, down;
};

struct Step {
    int64_t n_embd, n_head, n_kv, head_dim, n_ff;
    float eps;
    int neox;
    Attention attention;
    Products products;
    std::vector<Layer> layers;
};

/* One product input x [m, k] float32 in the forms its matrices take, each made once: bfloat16 rows
 * (torch's kernels) or int8 blocks (the compiled products) */
struct Rows {
    const float *x;
    int64_t m, k;
    at::Tensor bf16;
    std::vector<uint8_t> acts;
};

/* float32 -> bfloat16 bits, rounded to nearest even (ops.to_bf16_bits, torch's rounding) */
inline uint16_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

/* y [n] = x / sqrt(mean(x^2) + eps) * w */
void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / std::sqrt(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* rows x [m, in] float32 -> a bfloat16 tensor [m, in]: each product's input rounding */
at::Tensor rows_bf16(const float *x, int64_t m, int64_t in) {
    at::Tensor t = at::empty({m, in}, at::TensorOptions().dtype(at::kBFloat16));
    uint16_t *p = reinterpret_cast<uint16_t *>(t.data_ptr());
    for (int64_t i = 0; i < m * in; i++) p[i] = bf16_bits(x[i]);
    return t;
}

at::Tensor product(const Matrix &a, const at::Tensor &xb) {
    if (a.kind == INT8) return at::_weight_int8pack_mm(xb, a.w, a.s);
    if (a.kind == INT4) return at::_weight_int4pack_mm_for_cpu(xb, a.w, INT4_GROUP, a.s);
    return at::linear(xb, a.w);
}

at::Tensor &bf16_of(Rows &r) {
    if (!r.bf16.defined()) r.bf16 = rows_bf16(r.x, r.m, r.k);
    return r.bf16;
}

const void *acts_of(Rows &r, const Products &p) {
    if (r.acts.empty()) {
        r.acts.resize(p.size(r.m, r.k));
        if (p.quantize(r.x, r.m, r.k, r.k, r.acts.data()) != 0) throw std::runtime_error("rows not whole blocks of 32");
    }
    return r.acts.data();
}

/* y [m, a.out] (row stride ldy) = x [m, in] @ W.T as torch_weights.linear(exact_rows=True) computes it */
void linear(const Matrix &a, Rows &x, float *y, int64_t ldy, const Products &p, int threads) {
    int64_t m = x.m;
    if (a.kind == BF16 && p.bf16) {
        if (p.bf16(static_cast<const uint16_t *>(a.w.data_ptr()), a.out, a.in,
                   static_cast<const uint16_t *>(bf16_of(x).data_ptr()), m, y, ldy, threads) != 0)
            throw std::runtime_error("the compiled products refused a matrix");
        return;
    }
    if (is_tiles(a.kind) || (a.kind == INT8 && p.int8)) {
        int rc = a.kind != INT8
                     ? p.tiles(static_cast<const uint8_t *>(a.w.data_ptr()), tile_bits(a.kind), a.out, a.in,
                               acts_of(x, p), m, y, ldy, threads)
                     : p.int8(static_cast<const int8_t *>(a.w.data_ptr()), static_cast<const uint16_t *>(a.s.data_ptr()),
                              a.out, a.in, acts_of(x, p), m, y, ldy, threads);
        if (rc != 0) throw std::runtime_error("the compiled products refused a matrix");
        return;
    }
    at::Tensor &xb = bf16_of(x);
    at::Tensor out;
    if (a.mode == ONE_CALL || (a.mode == PAD_LONE && m > 1)) {
        out = product(a, xb);
    } else if (a.mode == PAD_LONE) { /* a lone row gets a zero partner: oneDNN picks another kernel at M = 1 */
        out = product(a, at::cat({xb, at::zeros_like(xb)})).narrow(0, 0, 1);
    } else { /* blocks of ROW_BLOCK rows, the last one padded with zeros */
        int64_t pad = (m + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK - m;
        at::Tensor xp = pad ? at::cat({xb, at::zeros({pad, xb.size(1)}, xb.options())}) : xb;
        std::vector<at::Tensor> parts;
        for (int64_t r = 0; r < m + pad; r += ROW_BLOCK) parts.push_back(product(a, xp.narrow(0, r, ROW_BLOCK)));
        out = at::cat(parts).narrow(0, 0, m);
    }
    out = out.contiguous();
    const uint16_t *o = reinterpret_cast<const uint16_t *>(out.data_ptr());
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < a.out; c++) y[r * ldy + c] = from_bf16(o[r * a.out + c]);
}

/* the matrices of one role side by side: y [m, sum of outs] */
void linear_parts(const std::vector<Matrix> &parts, Rows &x, float *y, int64_t ldy, const Products &p, int threads) {
    int64_t col = 0;
    for (const Matrix &a : parts) {
        linear(a, x, y + col, ldy, p, threads);
        col += a.out;
    }
}

/* x [D] rotated at one position by its full-width angle rows c, s [D] (torch_blocks.Rope): x c + turned s,
 * turned = (-x1, x0) over the halves (neox) or the pairs (2i, 2i + 1) */
void rope(float *x, const float *c, const float *s, int64_t d, int neox) {
    float t[512];
    int64_t r = d / 2;
    for (int64_t i = 0; i < r; i++) {
        if (neox) {
            t[i] = -x[i + r];
            t[i + r] = x[i];
        } else {
            t[2 * i] = -x[2 * i + 1];
            t[2 * i + 1] = x[2 * i];
        }
    }
    for (int64_t i = 0; i < d; i++) x[i] = x[i] * c[i] + t[i] * s[i];
}

/* One head's new key or value x [D] into its pool row: bfloat16 bits, or int8 times a scale
 * (cache.KVPool.store: keys first divided by their channel scales; scale = largest magnitude / 127
 * rounded up to bfloat16, 1 where that is 0; values rint(x / scale); the scale stored as its bits). */
void store_row(const float *x, int64_t d, int kind, void *row, uint16_t *scale, const float *channels) {
    if (kind == POOL_BF16) {
        uint16_t *p = static_cast<uint16_t *>(row);
        for (int64_t c = 0; c < d; c++) p[c] = bf16_bits(x[c]);
        return;
    }
    float y[512], top = 0.0f;
    for (int64_t c = 0; c < d; c++) {
        y[c] = channels ? x[c] / channels[c] : x[c];
        top = std::fabs(y[c]) > top ? std::fabs(y[c]) : top;
    }
    const float top_s = top / 127.0f;
    uint32_t u;
    std::memcpy(&u, &top_s, 4);
    uint16_t bits = (uint16_t)((u >> 16) + ((u & 0xFFFFu) != 0)); /* rounded up to bfloat16 */
    if (bits == 0) bits = 0x3F80; /* 1.0 */
    const float sc = from_bf16(bits);
    int8_t *p = static_cast<int8_t *>(row);
    for (int64_t c = 0; c < d; c++) p[c] = (int8_t)std::nearbyint(y[c] / sc);
    *scale = bits;
}

int run(Step &st, int64_t B, float *h, const float *cos, const float *sin, int kind, int64_t cap, void **kbuf,
        void **vbuf, uint16_t **ks, uint16_t **vs, float **kc, const uint8_t *kc_unset, const int64_t *slot,
        const int64_t *pos, int threads) {
    c10::InferenceMode guard;
    const int64_t E = st.n_embd, D = st.head_dim, Hq = st.n_head, Hkv = st.n_kv;
    const int64_t qd = Hq * D, kvd = Hkv * D, qkv_w = qd + 2 * kvd;
    const size_t esize = kind == POOL_BF16 ? 2 : 1;
    std::vector<float> xn(B * E), qkv(B * qkv_w), qs(B * qd), att(B * qd), o(B * E), gu(B * 2 * st.n_ff), act(B * st.n_ff);
    std::vector<int64_t> lengths(B);
    for (int64_t b = 0; b < B; b++) lengths[b] = pos[b] + 1;
    for (size_t i = 0; i < st.layers.size(); i++) {
        const Layer &L = st.layers[i];
        for (int64_t b = 0; b < B; b++) rmsnorm(h + b * E, L.attn_norm, E, st.eps, xn.data() + b * E);
        Rows attn_in{xn.data(), B, E, {}, {}};
        linear_parts(L.qkv, attn_in, qkv.data(), qkv_w, st.products, threads);
        for (int64_t b = 0; b < B; b++) {
            float *q = qkv.data() + b * qkv_w, *k = q + qd, *v = k + kvd;
            const float *bias[3] = {L.bq, L.bk, L.bv};
            const int64_t width[3] = {qd, kvd, kvd};
            float *part[3] = {q, k, v};
            for (int j = 0; j < 3; j++)
                if (bias[j])
                    for (int64_t c = 0; c < width[j]; c++) part[j][c] += bias[j][c];
            if (L.q_norm) { /* qwen3: each head normed over its D channels */
                for (int64_t hd = 0; hd < Hq; hd++) rmsnorm(q + hd * D, L.q_norm, D, st.eps, q + hd * D);
                for (int64_t hd = 0; hd < Hkv; hd++) rmsnorm(k + hd * D, L.k_norm, D, st.eps, k + hd * D);
            }
            for (int64_t hd = 0; hd < Hq; hd++) rope(q + hd * D, cos + b * D, sin + b * D, D, st.neox);
            for (int64_t hd = 0; hd < Hkv; hd++) rope(k + hd * D, cos + b * D, sin + b * D, D, st.neox);
            for (int64_t hd = 0; hd < Hkv; hd++) { /* the new k/v into position pos[b] of slot slot[b] */
                size_t cell = (size_t)slot[b] * Hkv + hd, at = cell * cap + pos[b];
                if (kind == POOL_INT8 && kc_unset[i * B + b]) /* the slot's first write sets its channel scales */
                    for (int64_t c = 0; c < D; c++) {
                        float a = std::fabs(k[hd * D + c]);
                        kc[i][cell * D + c] = a > 0.0f ? a : 1.0f;
                    }
                const float *channels = kind == POOL_INT8 ? kc[i] + cell * D : nullptr;
                store_row(k + hd * D, D, kind, static_cast<char *>(kbuf[i]) + at * D * esize,
                          kind == POOL_INT8 ? ks[i] + at : nullptr, channels);
                store_row(v + hd * D, D, kind, static_cast<char *>(vbuf[i]) + at * D * esize,
                          kind == POOL_INT8 ? vs[i] + at : nullptr, nullptr);
            }
            std::memcpy(qs.data() + b * qd, q, sizeof(float) * qd); /* the queries, [B, Hq, D] */
        }
        int rc = st.attention(kind, kbuf[i], vbuf[i], kind == POOL_INT8 ? ks[i] : nullptr,
                              kind == POOL_INT8 ? vs[i] : nullptr, kind == POOL_INT8 ? kc[i] : nullptr, cap, slot,
                              lengths.data(), (int)B, qs.data(), att.data(), (int)Hkv, (int)(Hq / Hkv), (int)D,
                              1.0f / std::sqrt((float)D), threads);
        if (rc != 0) return rc;
        Rows att_rows{att.data(), B, qd, {}, {}};
        linear(L.output, att_rows, o.data(), E, st.products, threads);
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < E; c++) h[b * E + c] += L.bo ? o[b * E + c] + L.bo[c] : o[b * E + c];
        for (int64_t b = 0; b < B; b++) rmsnorm(h + b * E, L.ffn_norm, E, st.eps, xn.data() + b * E);
        const int64_t F = st.n_ff;
        Rows ffn_in{xn.data(), B, E, {}, {}};
        linear_parts(L.gate_up, ffn_in, gu.data(), 2 * F, st.products, threads);
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < F; c++) {
                float g = gu[b * 2 * F + c];
                act[b * F + c] = g / (1.0f + std::exp(-g)) * gu[b * 2 * F + F + c]; /* silu(gate) * up */
            }
        Rows down_in{act.data(), B, F, {}, {}};
        linear(L.down, down_in, o.data(), E, st.products, threads);
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < E; c++) h[b * E + c] += o[b * E + c];
    }
    return 0;
}

at::ScalarType dtype_of(int code) {
    switch (code) {
        case 0: return at::kBFloat16;
        case 1: return at::kChar;
        case 2: return at::kByte;
        case 3: return at::kInt;
        default: return at::kFloat;
    }
}

}  // namespace

extern "C" {

/* Every entry returns 0 (or a handle), else -1 / null with the reason in step_error(). */
static thread_local char last_error[512];

const char *step_error() { return last_error; }

/* products: csrc/products.c's acts_size, quantize_rows, product_int8, product_tiles and product_bf16 by
 * address, or null (int8 and bfloat16 rows then multiply through torch's kernels, and no matrix may be
 * tiles) */
void *step_new(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t n_kv, int64_t head_dim, int64_t n_ff,
               float eps, int neox, void *attention, void *const *products) {
    if (head_dim > 512 || head_dim % 2 || n_kv < 1 || n_head % n_kv) {
        std::snprintf(last_error, sizeof last_error, "shapes not taken: %lld heads over %lld, head_dim %lld",
                      (long long)n_head, (long long)n_kv, (long long)head_dim);
        return nullptr;
    }
    Step *st = new Step{n_embd, n_head, n_kv, head_dim, n_ff, eps, neox, reinterpret_cast<Attention>(attention), {}, {}};
    if (products) {
        st->products.size = reinterpret_cast<int64_t (*)(int64_t, int64_t)>(products[0]);
        st->products.quantize = reinterpret_cast<decltype(st->products.quantize)>(products[1]);
        st->products.int8 = reinterpret_cast<decltype(st->products.int8)>(products[2]);
        st->products.tiles = reinterpret_cast<decltype(st->products.tiles)>(products[3]);
        st->products.bf16 = reinterpret_cast<decltype(st->products.bf16)>(products[4]);
    }
    st->layers.resize(n_layer);
    return st;
}

void step_free(void *st) { delete static_cast<Step *>(st); }

/* store_row on its own, for the tests: one head's row x [d] (d <= 512) into row (bfloat16 bits or int8)
 * and scale, keys divided by channels (or not: null), as a step stores it */
void step_store_row(const float *x, int64_t d, int kind, void *row, uint16_t *scale, const float *channels) {
    store_row(x, d, kind, row, scale, channels);
}

int step_vectors(void *sp, int64_t layer, const float *attn_norm, const float *ffn_norm, const float *q_norm,
                 const float *k_norm, const float *bq, const float *bk, const float *bv, const float *bo) {
    Layer &L = static_cast<Step *>(sp)->layers.at(layer);
    L.attn_norm = attn_norm, L.ffn_norm = ffn_norm, L.q_norm = q_norm, L.k_norm = k_norm;
    L.bq = bq, L.bk = bk, L.bv = bv, L.bo = bo;
    return 0;
}

/* A matrix of a layer's role (appended to qkv / gate_up, set for output / down): its tensors as
 * (pointer, dtype code, 2 or 3 sizes), views of torch tensors that Python keeps alive. */
int step_matrix(void *sp, int64_t layer, int role, int kind, int mode, int64_t out, int64_t in, void *w, int w_dtype,
                const int64_t *w_size, int w_dim, void *s, int s_dtype, const int64_t *s_size, int s_dim) {
    try {
        Step &st = *static_cast<Step *>(sp);
        Layer &L = st.layers.at(layer);
        if (is_tiles(kind) && !st.products.tiles)
            throw std::runtime_error("tiles need the compiled products");
        Matrix a;
        a.kind = kind, a.mode = mode, a.out = out, a.in = in;
        auto opts = [](int code) { return at::TensorOptions().dtype(dtype_of(code)); };
        a.w = at::from_blob(w, at::IntArrayRef(w_size, w_dim), opts(w_dtype));
        if (s) a.s = at::from_blob(s, at::IntArrayRef(s_size, s_dim), opts(s_dtype));
        if (role == QKV) L.qkv.push_back(a);
        else if (role == GATE_UP) L.gate_up.push_back(a);
        else if (role == OUTPUT) L.output = a;
        else L.down = a;
        return 0;
    } catch (const std::exception &e) {
        std::snprintf(last_error, sizeof last_error, "%s", e.what());
        return -1;
    }
}

/* One decode step of B sequences: h [B, n_embd] float32 in (embeddings) and out (the last layer's
 * output); cos, sin [B, head_dim] full-width angle rows; the pool's per-layer buffers (kind 0
 * bfloat16 bits, 1 int8 with ks, vs, kc); kc_unset [n_layer, B]: 1 where the slot's channel scales
 * are still to be set. Returns 0, or decode_attention's code, or -3 on an error (step_error). */
int step_run(void *sp, int64_t B, float *h, const float *cos, const float *sin, int kind, int64_t cap, void **kbuf,
             void **vbuf, uint16_t **ks, uint16_t **vs, float **kc, const uint8_t *kc_unset, const int64_t *slot,
             const int64_t *pos, int threads) {
    try {
        return run(*static_cast<Step *>(sp), B, h, cos, sin, kind, cap, kbuf, vbuf, ks, vs, kc, kc_unset, slot, pos,
                   threads);
    } catch (const std::exception &e) {
        std::snprintf(last_error, sizeof last_error, "%s", e.what());
        return -3;
    }
}

}  // extern "C"
