"""A prompt chunk's compiled row operations (engine/backends/rows.py, csrc/rows.c): the rotary
embedding torch_blocks.Rope's to the bit and the q/k norm torch's up to float32 rounding; the SwiGLU
torch's within a few float32 ulps; the int8 KV store cache._int8_of's to the bit; every row's bits the
same alone, in any batch and on any thread count; a prompt through them as close to float32 as the
torch operations'; what they cannot take refused. The vision tower's bfloat16 rows (norm, rotary
embedding, SwiGLU): float64's result rounded once, never further from it than torch's bfloat16 passes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model  # noqa: E402
from pantheon_ocr.engine.backends import rows  # noqa: E402
from pantheon_ocr.engine.backends.torch_blocks import Rope  # noqa: E402
from pantheon_ocr.engine.cache import _int8_of  # noqa: E402

from .conftest import LIGHTONOCR_TEXT  # noqa: E402
from .test_batch_exact import _prompts  # noqa: E402
from .test_native import compiled_or_skip  # noqa: E402

F = torch.nn.functional


def rows_or_skip() -> rows.Rows:
    return compiled_or_skip(rows.ROWS)


def _torch_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("neox", [True, False])
def test_rope_is_torch_blocks_rope_to_the_bit_and_the_norm_torchs_up_to_rounding(neox):
    kernel = rows_or_skip()
    t, hq, hkv, d = 77, 16, 8, 128
    freqs = (1.0 / 1e6 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    rope = Rope.of(np.arange(2000, 2000 + t), freqs, d, neox)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen) * 3  # the stacked product: strided rows
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    w = torch.rand(d, generator=gen) + 0.5
    assert torch.equal(kernel.norm_rope(k, hkv, d, None, 1e-6, rope.cos, rope.sin, neox), rope(k.reshape(t, hkv, d)))
    got = kernel.norm_rope(q, hq, d, w, 1e-6, rope.cos, rope.sin, neox)
    want = rope(_torch_norm(q.reshape(t, hq, d).double(), w.double(), 1e-6).float())
    assert (got - want).abs().max() <= 4e-7 * want.abs().max()


def test_swiglu_is_torchs_within_a_few_ulps():
    kernel = rows_or_skip()
    gen = torch.Generator().manual_seed(2)
    gu = torch.randn(40, 2 * 300, generator=gen) * 4  # 300: not whole vectors of 16
    gu[0, :4] = torch.tensor([0.0, 120.0, -120.0, -90.0])  # e^-g past float32's range either way
    got = kernel.swiglu(gu)
    g, u = gu[:, :300].double(), gu[:, 300:].double()
    want = (g / (1 + torch.exp(-g)) * u).float()
    assert torch.all((got - want).abs() <= 4 * torch.finfo(torch.float32).eps * want.abs() + 1e-30)
    assert got[0, 1] == 120 * gu[0, 301] and got[0, 2] == 0 and got[0, 3].abs() < 1e-30


def test_the_int8_store_is_the_numpy_stores_bits():
    kernel = rows_or_skip()
    rng = np.random.default_rng(3)
    k = (rng.standard_normal((300, 8, 128)) * rng.uniform(1e-3, 30, (300, 8, 1))).astype(np.float32)
    k[3, 2] = 0  # a zero row: scale 1
    k[5, 1] = 1e-40  # a row past float32's normals
    k[6, 0, :64] = np.arange(64) - 31.5  # halves: rounded to even
    kn = k.transpose(1, 0, 2)[:, 20:280]  # [Hkv, T, D]: a chunk's keys as the pool takes them, strided
    kc = np.abs(kn).max(axis=1, keepdims=True)
    kc = np.where(kc > 0, kc, 1).astype(np.float32)
    for divisor in (None, kc):
        q, bits = kernel.int8_of(kn, divisor)
        want_q, want_bits = _int8_of(kn if divisor is None else kn / divisor)
        assert np.array_equal(q, want_q.astype(np.int8)) and np.array_equal(bits, want_bits)
        assert np.abs(q.astype(np.int16)).max() == 127


def test_a_rows_bits_are_the_same_alone_in_any_batch_and_on_any_thread_count():
    kernel = rows_or_skip()
    t, h, d = 70, 4, 64  # past the rows that take a second thread
    gen = torch.Generator().manual_seed(4)
    x, gu = torch.randn(t, h * d, generator=gen), torch.randn(t, 2 * 96, generator=gen)
    rope = Rope.of(np.arange(t), (1.0 / 1e4 ** (np.arange(0, d, 2) / d)).astype(np.float32), d, True)
    w = torch.rand(d, generator=gen) + 0.5
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append((kernel.norm_rope(x, h, d, w, 1e-6, rope.cos, rope.sin, True), kernel.swiglu(gu),
                         kernel.int8_of(x.numpy().reshape(t, h, d).transpose(1, 0, 2))))
    finally:
        torch.set_num_threads(before)
    for (a, b, (q, s)), (a2, b2, (q2, s2)) in zip(runs, runs[1:]):
        assert torch.equal(a, a2) and torch.equal(b, b2) and np.array_equal(q, q2) and np.array_equal(s, s2)
    alone = kernel.norm_rope(x[9:10], h, d, w, 1e-6, rope.cos[9:10], rope.sin[9:10], True)
    assert torch.equal(alone, runs[0][0][9:10]) and torch.equal(kernel.swiglu(gu[9:10]), runs[0][1][9:10])


def test_what_the_row_operations_cannot_take_is_refused():
    kernel = rows_or_skip()
    cos = sin = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="float32 rows of 16"):
        kernel.norm_rope(torch.zeros(3, 12), 2, 8, None, 1e-6, cos, sin, True)
    with pytest.raises(ValueError, match="rotary angles"):
        kernel.norm_rope(torch.zeros(4, 16), 2, 8, None, 1e-6, cos, sin, True)
    with pytest.raises(ValueError, match="contiguous columns"):
        kernel.swiglu(torch.zeros(8, 3).t())
    with pytest.raises(ValueError, match="channel scales"):
        kernel.int8_of(np.zeros((2, 3, 8), np.float32), np.ones((2, 1, 4), np.float32))


def test_a_build_without_avx512_says_so(tmp_path):
    rows_or_skip()
    built = rows.build(tmp_path, isa="AVX2")
    assert isinstance(built, str) and "no AVX-512" in built


def test_a_prompt_through_the_row_operations_is_as_close_to_float32_as_through_torchs():
    """The tiny LightOnOCR text (Qwen3: q/k norms) with int8 weights over an int8 pool, its prompt in
    chunks: the logits against float32's (f32 weights and keys) as close with the compiled row
    operations as with torch's and numpy's, and the int8 pool holds the same keys."""
    kernel = rows_or_skip()
    models = {"rows": load_model(LIGHTONOCR_TEXT, weights="int8"), "torch": load_model(LIGHTONOCR_TEXT, weights="int8"),
              "float32": load_model(LIGHTONOCR_TEXT, weights="f32")}
    assert models["rows"].decoder.torch_blocks.rows is kernel
    models["torch"].decoder.torch_blocks.rows = None
    prompt = _prompts(models["rows"].config.n_vocab, 1, seed=8)[0] * 12
    logits, pools = {}, {}
    for name, m in models.items():
        d = m.decoder
        pools[name] = d.new_pool("float32" if name == "float32" else "int8")
        state = d.new_state(len(prompt) + 1, pools[name])
        logits[name] = np.concatenate([d.forward(state, prompt[a:b], all_logits=True)
                                       for a, b in ((0, 50), (50, 51), (51, len(prompt)))])
    err = {n: np.abs(logits[n] - logits["float32"]).max() / np.abs(logits["float32"]).max() for n in ("rows", "torch")}
    print(f"logits against float32: {err}")
    assert err["rows"] <= 1.5 * err["torch"], err
    last = len(models["rows"].decoder.layers) - 1
    k_rows, k_torch = (pools[n].load(last, 0, slice(0, len(prompt)))[0] for n in ("rows", "torch"))
    assert np.abs(k_rows - k_torch).max() <= 0.02 * np.abs(k_torch).max()


BF16_ULP = 2.0 ** -7  # a bfloat16 ulp relative to the value (8 significant bits): rounding once is within half


def _within_half_ulp(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got (bfloat16) is float64's want rounded once: within half a bfloat16 ulp of it (plus float32's
    arithmetic, far below)."""
    return bool(torch.all((got.double() - want).abs() <= 0.5001 * BF16_ULP * want.abs() + 1e-30))


def test_the_bf16_rows_are_float64s_rounded_once_and_closer_than_torchs():
    from pantheon_ocr.engine.backends.torch_pixtral import RMSNorm, rope

    kernel = rows_or_skip()
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(1, 70, 200, generator=gen) * 5).bfloat16()  # 200: not whole vectors of 16
    w = torch.rand(200, generator=gen) + 0.5
    norm = RMSNorm(200, 1e-5)
    norm.weight.data = w
    xd = x.double()
    want = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-5) * w.double()
    got = kernel.rms_norm_bf16(x, w, 1e-5)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape and _within_half_ulp(got, want)
    assert (got == norm(x)).float().mean() > 0.99  # torch rounds its float32 result once too

    h, d = 4, 64
    q = (torch.randn(2, 70, h * d, generator=gen) * 3).bfloat16()  # a projection's rows
    ang = torch.rand(70, d // 2, generator=gen, dtype=torch.float64) * 40
    cos, sin = (torch.cat([f(ang), f(ang)], -1) for f in (torch.cos, torch.sin))  # [N, d] float64
    heads = q.unflatten(-1, (h, d)).transpose(1, 2)  # [B, H, N, d] over the rows, as a block's q
    qd = heads.double()
    want = qd * cos + torch.cat([-qd[..., d // 2:], qd[..., : d // 2]], -1) * sin
    by_torch = rope(heads, cos.bfloat16(), sin.bfloat16())  # the bfloat16 tables and three roundings
    got = kernel.rope_bf16_(heads.clone().transpose(1, 2).contiguous().transpose(1, 2), cos.float(), sin.float())
    assert got.stride() == heads.stride() and _within_half_ulp(got, want)
    assert (got.double() - want).abs().mean() < 0.75 * (by_torch.double() - want).abs().mean()  # measured 0.61
    assert kernel.rope_bf16_(heads, cos.float(), sin.float()) is heads and torch.equal(heads, got)  # in place
    cb, sb = cos.bfloat16(), sin.bfloat16()  # other tables are converted: the same as converted beforehand
    assert torch.equal(kernel.rope_bf16_(q.clone().unflatten(-1, (h, d)).transpose(1, 2), cb, sb),
                       kernel.rope_bf16_(q.clone().unflatten(-1, (h, d)).transpose(1, 2), cb.float(), sb.float()))

    g, u = ((torch.randn(70, 300, generator=gen) * 4).bfloat16() for _ in range(2))
    gd = g.double()
    want = gd / (1 + torch.exp(-gd)) * u.double()
    by_torch = F.silu(g) * u
    got = kernel.swiglu_bf16_(g.clone(), u)
    assert _within_half_ulp(got, want)
    assert (got.double() - want).abs().mean() < (by_torch.double() - want).abs().mean()


def test_the_bf16_rows_round_ties_to_even_keep_nans_and_are_the_same_on_any_thread_count():
    kernel = rows_or_skip()
    u = torch.arange(-2048, 2048, dtype=torch.float32).bfloat16().unique()[None]  # every 8-bit mantissa
    g = torch.full_like(u, 120.0)  # silu(120) is 120: 120 u is exact in float32, its rounding torch's
    got = kernel.swiglu_bf16_(g.clone(), u)
    assert torch.equal(got, (120.0 * u.float()).bfloat16())
    nan = kernel.swiglu_bf16_(torch.tensor([[float("nan"), 1.0]]).bfloat16(), torch.ones(1, 2).bfloat16())
    assert nan[0, 0].isnan() and nan[0, 1] == torch.tensor(1 / (1 + np.exp(-1.0))).bfloat16()
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(100, 3 * 64, generator=gen).bfloat16()  # past the rows that take a second thread
    w = torch.rand(3 * 64, generator=gen) + 0.5
    cs = torch.rand(100, 64, generator=gen)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            heads = x.clone().unflatten(-1, (3, 64))[None].transpose(1, 2)
            runs.append((kernel.rms_norm_bf16(x, w, 1e-6), kernel.rope_bf16_(heads, cs, cs.flip(1)),
                         kernel.swiglu_bf16_(x.clone(), x.flip(0))))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert torch.equal(kernel.rms_norm_bf16(x[9:10], w, 1e-6), runs[0][0][9:10])


def test_what_the_bf16_rows_cannot_take_is_refused():
    kernel = rows_or_skip()
    with pytest.raises(ValueError, match="bfloat16 CPU rows"):
        kernel.rms_norm_bf16(torch.zeros(3, 16), torch.ones(16), 1e-6)
    with pytest.raises(ValueError, match="norm weights"):
        kernel.rms_norm_bf16(torch.zeros(3, 16).bfloat16(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="laid out as"):
        kernel.rope_bf16_(torch.zeros(1, 2, 5, 8).bfloat16(), torch.zeros(5, 8), torch.zeros(5, 8))  # [B, H, N, d]
    heads = torch.zeros(1, 5, 2, 8).bfloat16().transpose(1, 2)
    with pytest.raises(ValueError, match="rotary tables"):
        kernel.rope_bf16_(heads, torch.zeros(4, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="differ"):
        kernel.swiglu_bf16_(torch.zeros(3, 16).bfloat16(), torch.zeros(3, 8).bfloat16())
    with pytest.raises(ValueError, match="one stride"):
        kernel.swiglu_bf16_(torch.zeros(4, 6, 16).bfloat16()[:, ::2].transpose(0, 1), torch.zeros(3, 4, 16).bfloat16())
