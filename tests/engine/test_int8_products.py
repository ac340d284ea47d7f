"""The vision tower's int8 products (engine/backends/int8_products.py, csrc/int8_rows.c) against naive
torch references: the column maxima, the smoothing and each row's int8 and scale to the bit, the
rescaled sums to the bit in any chunking, widths, strides and thread count, the SwiGLU within a bfloat16
ulp; the smoothing keeps an outlier channel from costing the rest of the row its precision; a NaN stays
a NaN; what they cannot take is refused. (The tower under --vision-dtype int8: test_backends_torch.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine.backends import int8_products as i8  # noqa: E402

from .test_native import compiled_or_skip  # noqa: E402

F = torch.nn.functional


def products_or_skip() -> i8.Int8Products:
    return compiled_or_skip(i8.INT8_ROWS)


def _bf16(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _quantized(x, mul=None):
    """The rows' int8 and scales written out in float32 as the kernel computes them."""
    v = x.float() if mul is None else x.float() * mul
    big = v.abs().amax(1)
    inv = torch.where(big > 0, torch.tensor(127.0) / big, torch.zeros_like(big))
    return torch.round(v * inv[:, None]).to(torch.int8), big / 127.0


def _rescaled(q, s, qw, sw):
    """bfloat16((float(int32 sums) * sw) * s), the dequantization's order of operations."""
    sums = (q.long() @ qw.long().t()).float()
    return ((sums * sw[None, :]) * s[:, None]).to(torch.bfloat16)


def test_column_maxima_and_row_quantization_are_the_naive_ones_to_the_bit():
    p = products_or_skip()
    x = _bf16(300, 200)
    x[7] = 0  # a zero row: zeros, scale 0
    assert torch.equal(p.colmax(x), x.float().abs().amax(0))
    mul = torch.rand(200) + 0.5
    for m in (None, mul):
        q, s = p.quantize(x, m)
        want_q, want_s = _quantized(x, m)
        assert torch.equal(q, want_q) and torch.equal(s, want_s)
    assert not q[7].any() and s[7] == 0
    assert q.abs().max() == 127


def _smoothing(x, ws):
    cx, cw = x.float().abs().amax(0), torch.cat(ws).float().abs().amax(0)
    return torch.where((cx > 0) & (cw > 0) & cx.isfinite() & cw.isfinite(), torch.sqrt(cx / cw), torch.ones_like(cx))


@pytest.mark.parametrize("m,k,widths", [(5, 96, [48]), (700, 97, [50, 33, 64]), (2600, 96, [4096]),
                                        (3000, 64, [2048, 2048])])
def test_products_are_the_rescaled_integer_sums_to_the_bit_in_any_chunking(m, k, widths):
    p = products_or_skip()
    x = _bf16(m, k + 7, seed=1)[:, 3:3 + k]  # rows at a stride of their own
    x[1] = 0
    x[:, 5] = 0  # a zero column: its smoothing factor is 1
    ws = [_bf16(n, k, seed=2 + i, scale=0.05) for i, n in enumerate(widths)]
    got = p(x, ws)
    s = p.smoothing(x, ws)
    assert torch.equal(s, _smoothing(x, ws)) and s[5] == 1
    q, sx = _quantized(x, torch.reciprocal(s))
    for w, out in zip(ws, got):
        qw, sw = _quantized(w, s)
        assert out.shape == (m, w.shape[0]) and out.dtype == torch.bfloat16
        assert torch.equal(out, _rescaled(q, sx, qw, sw))
    assert not got[0][1].any()
    # the int32 sums came in chunks (2,600 rows of 4,096: 1,024 at a time; 3,000 of 4,096): the same bits
    assert i8.chunk_rows(4096) < 2600
    torch.set_num_threads(1)
    try:
        assert all(torch.equal(a, b) for a, b in zip(p(x, ws), got))  # and on one thread
    finally:
        torch.set_num_threads(THREADS)


THREADS = torch.get_num_threads()


@pytest.mark.parametrize("rows,f", [(40, 80), (2100, 2048)])  # 2,100 rows of 2,048: chunks past the first
def test_the_swiglu_is_silu_gate_times_up_within_a_bfloat16_ulp(rows, f):
    p = products_or_skip()
    x = _bf16(1, rows, 64, seed=3)  # leading dimensions kept
    gate, up = _bf16(f, 64, seed=4, scale=0.1), _bf16(f, 64, seed=5, scale=0.1)
    (got,) = p(x, [gate, up], swiglu=True)
    g, u = p(x, [gate, up])  # the same quantization, each rescaled to bfloat16
    assert got.shape == (1, rows, f)
    assert rows == 40 or i8.chunk_rows(f) < rows
    s = p.smoothing(x, [gate, up])
    q, sx = _quantized(x.reshape(rows, 64), torch.reciprocal(s))
    qw, sw = _quantized(torch.cat([gate, up]), s)
    sums = (q.long() @ qw.long().t()).float() * sw * sx[:, None]
    want = F.silu(sums[:, :f]) * sums[:, f:]  # float32, rounded once below
    assert torch.allclose(got[0].float(), want, rtol=2 ** -8, atol=1e-6)
    assert torch.equal(g[0], sums[:, :f].to(torch.bfloat16)) and torch.equal(u[0], sums[:, f:].to(torch.bfloat16))


def test_smoothing_keeps_an_outlier_channel_from_costing_the_rest_of_the_row():
    """One input channel 60x the others (as large vision and language models grow): one scale per row
    would spend the row's 8 bits on it; the smoothing moves it into the weights' column."""
    p = products_or_skip()
    x = _bf16(512, 256, seed=6)
    x[:, 17] *= 60
    w = _bf16(384, 256, seed=7, scale=0.05)
    want = x.float() @ w.float().t()
    err = lambda y: float((y.float() - want).norm() / want.norm())  # noqa: E731
    q, sx = _quantized(x)
    qw, sw = _quantized(w)
    plain = err(_rescaled(q, sx, qw, sw))  # per-row int8 without smoothing
    smoothed = err(p(x, [w])[0])
    bf16 = err(F.linear(x, w))
    assert smoothed < 0.02 and smoothed < plain / 3, (smoothed, plain)
    assert bf16 < smoothed  # the price of int8 stays visible


def test_a_row_with_a_nan_or_an_infinity_gives_nans_not_numbers():
    p = products_or_skip()
    x, w = _bf16(6, 32, seed=11), _bf16(8, 32, seed=12)
    x[2, 7], x[4, 30] = float("nan"), float("inf")
    q, s = p.quantize(x)
    assert s[2].isnan() and s[4].isnan() and not q[2].any() and not q[4].any() and not s[[0, 1, 3, 5]].isnan().any()
    out = p(x, [w])[0]
    assert out[2].isnan().all() and out[4].isnan().all() and not out[[0, 1, 3, 5]].isnan().any()


def test_biases_are_added_after_the_products():
    p = products_or_skip()
    x, w, b = _bf16(20, 32, seed=8), _bf16(16, 32, seed=9), _bf16(16, seed=10)
    (plain,), (biased,) = p(x, [w]), p(x, [w], biases=[b])
    assert torch.equal(biased, plain + b)


def test_what_the_int8_products_cannot_take_is_refused():
    p = products_or_skip()
    x = _bf16(4, 32)
    with pytest.raises(ValueError, match="bfloat16"):
        p(x.float(), [_bf16(8, 32)])
    with pytest.raises(ValueError, match="weights must be"):
        p(x, [_bf16(8, 16)])
    with pytest.raises(ValueError, match="gate and up"):
        p(x, [_bf16(8, 32), _bf16(4, 32)], swiglu=True)
    with pytest.raises(ValueError, match="column factors"):
        p.quantize(x, torch.ones(31))


def test_a_build_without_avx512_says_so(tmp_path):
    products_or_skip()
    built = i8.build(tmp_path, isa="AVX2")
    assert isinstance(built, str) and "no AVX-512" in built
