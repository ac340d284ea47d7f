"""The vision attention's compiled softmax (engine/backends/softmax.py, csrc/softmax.c): torch's
softmax of bfloat16 scores to within a bfloat16 rounding (almost every value the same bits), over
widths that are not whole vectors, masked keys and flat rows; the attention by query blocks the same
with it as with torch's; and where it cannot run, None (torch's then)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine.backends import softmax as S  # noqa: E402
from pantheon_ocr.engine.backends.common import cpu_flags  # noqa: E402
from pantheon_ocr.engine.backends.torch_pixtral import query_block_attention  # noqa: E402

from .test_native import can_build_here  # noqa: E402


def softmax_or_skip() -> S.CompiledSoftmax:
    kernel = S.compiled_softmax()
    if kernel is None:
        assert not (can_build_here() and {"avx512f", "avx512bw", "avx512_bf16"} <= cpu_flags()), \
            "the softmax should run on this machine"
        pytest.skip("no compiled softmax here (no compiler or no AVX-512 BF16)")
    return kernel


@pytest.mark.parametrize("cols", [1, 15, 17, 300, 9350])
def test_it_is_torchs_softmax_to_a_bfloat16_rounding(cols):
    softmax = softmax_or_skip()
    gen = torch.Generator().manual_seed(cols)
    s = (torch.randn(37, cols, generator=gen) * 4).to(torch.bfloat16)
    s[3] = 1.5  # a flat row
    s[5, : cols // 2] = -1e4  # masked keys (the padded patches' bias)
    want = torch.softmax(s, -1)
    got = softmax(s.clone())
    assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-37).all()  # a bfloat16 step
    assert (got == want).float().mean() >= 0.999
    assert torch.equal(got[3], want[3]) and (got[5, : cols // 2] == 0).all() if cols > 1 else True


def test_the_attention_by_query_blocks_is_the_same_with_it():
    softmax = softmax_or_skip()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 700, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    mask = torch.zeros(1, 1, 1, 700, dtype=torch.bfloat16)  # in the compute dtype, as the backend makes it
    mask[..., 650:] = -1e4
    want = query_block_attention(q, k, v, attn_mask=mask)
    got = query_block_attention(q, k, v, attn_mask=mask, softmax=softmax)
    assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()


def test_shapes_it_cannot_take_are_refused():
    softmax = softmax_or_skip()
    with pytest.raises(ValueError, match="contiguous 2-D bfloat16"):
        softmax(torch.zeros(4, 8))
    with pytest.raises(ValueError, match="refused rows"):
        softmax(torch.zeros(1, 70000, dtype=torch.bfloat16))


def test_without_a_compiler_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    assert S.build(tmp_path).startswith("torch's softmax (no compiler")
