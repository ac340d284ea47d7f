"""Kernels against naive references: norms, RoPE, dequantization, the weight type."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pantheon_ocr.engine.ops import apply_rope, erf, gelu_erf, rmsnorm, rope_angles, rope_freqs, silu
from pantheon_ocr.engine.format.weights import Weight, dequantize

RNG = np.random.default_rng(0)


def test_rmsnorm_matches_definition():
    x = RNG.standard_normal((5, 7, 48)).astype(np.float32)
    w = RNG.standard_normal(48).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(rmsnorm(x, w, 1e-6), want, rtol=1e-5, atol=1e-6)


def test_silu_and_gelu():
    x = np.linspace(-100, 100, 2001).astype(np.float32)
    np.testing.assert_allclose(silu(x), x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-30)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(gelu_erf(x), want, rtol=1e-6, atol=1e-6)
    assert np.abs(erf(np.linspace(-5, 5, 1001)) - [math.erf(v) for v in np.linspace(-5, 5, 1001)]).max() < 2e-7


def naive_rope(x, positions, n_rot, base, neox):
    """One (position, head, pair) at a time, straight from the definitions."""
    out = x.astype(np.float64).copy()
    for t, p in enumerate(positions):
        for h in range(x.shape[1]):
            for i in range(n_rot // 2):
                theta = p * base ** (-2 * i / n_rot)
                a, b = (i, i + n_rot // 2) if neox else (2 * i, 2 * i + 1)
                x0, x1 = x[t, h, a], x[t, h, b]
                out[t, h, a] = x0 * math.cos(theta) - x1 * math.sin(theta)
                out[t, h, b] = x0 * math.sin(theta) + x1 * math.cos(theta)
    return out


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("n_rot", [16, 8])  # 8 < head dim 16: partial rotary (Phi-3)
def test_rope_against_naive(neox, n_rot):
    x = RNG.standard_normal((6, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 5, 17, 300, 4095])
    cos, sin = rope_angles(pos, rope_freqs(n_rot, 10000.0))
    np.testing.assert_allclose(apply_rope(x, cos, sin, neox), naive_rope(x, pos, n_rot, 10000.0, neox), atol=2e-5)


def test_rope_permuted_rows_equal_neox():
    """llama.cpp permutes llama Q rows so adjacent-pair RoPE on them equals NeoX on the originals."""
    d, n_head = 16, 2
    x = RNG.standard_normal((4, n_head, d)).astype(np.float32)
    perm = x.reshape(4, n_head, 2, d // 2).swapaxes(2, 3).reshape(4, n_head, d)
    cos, sin = rope_angles(np.arange(4), rope_freqs(d, 10000.0))
    a = apply_rope(x, cos, sin, neox=True)
    b = apply_rope(perm, cos, sin, neox=False).reshape(4, n_head, d // 2, 2).swapaxes(2, 3).reshape(4, n_head, d)
    np.testing.assert_allclose(a, b, atol=1e-6)


QUANTIZABLE = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]


@pytest.mark.parametrize("qtype", QUANTIZABLE)
def test_dequantize_matches_gguf(qtype):
    w = RNG.standard_normal((8, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype) if qtype != Q.F16 else w.astype(np.float16).view(np.uint8)
    np.testing.assert_array_equal(dequantize(raw, qtype), gguf.quants.dequantize(raw, qtype).astype(np.float32))


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_dequantize_k_quants_matches_gguf(qtype):
    """gguf cannot quantize K-quants; random block bytes with sane fp16 scales exercise the decoder."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = RNG.integers(0, 256, size=(3, size * 2), dtype=np.uint8)
    ref = gguf.quants.dequantize(raw, qtype)
    ok = np.isfinite(ref).all(axis=-1)
    np.testing.assert_array_equal(dequantize(raw[ok], qtype), ref[ok].astype(np.float32))


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q4_1, Q.Q8_0])
def test_weight_storage_modes_agree(qtype, monkeypatch):
    import pantheon_ocr.engine.format.weights as weights

    monkeypatch.setattr(weights, "PANEL_BYTES", 64 * 4 * 5)  # panels of 16 rows: several per matmul
    w = RNG.standard_normal((70, 64)).astype(np.float32)
    raw = w.view(np.uint8) if qtype == Q.F32 else (
        w.astype(np.float16).view(np.uint8) if qtype == Q.F16 else gguf.quants.quantize(w, qtype))
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    quant = Weight("w", qtype, (70, 64), raw, "quantized")
    f32 = Weight("w", qtype, (70, 64), raw, "f32")
    dense = dequantize(raw, qtype).reshape(70, 64)
    np.testing.assert_allclose(quant.matmul(x), x @ dense.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f32.matmul(x), x @ dense.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(quant.rows([3, 0, 69]), dense[[3, 0, 69]])
    np.testing.assert_array_equal(f32.rows([3, 0, 69]), dense[[3, 0, 69]])
