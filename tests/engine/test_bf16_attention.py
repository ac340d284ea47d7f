"""The attention kernels in bfloat16 (engine/backends/bf16_attention.py, csrc/bf16_attention.c).

The vision attention's softmax: torch's softmax of bfloat16 scores to within a bfloat16 rounding
(almost every value the same bits), over widths that are not whole vectors, masked keys and flat rows;
the attention by query blocks the same with it as with torch's.

The vision tower's attention (not causal, an optional key mask): SDPA in float64 to bfloat16's
rounding of the inputs and weights, closer than the products by query blocks; the same bits on 1 and
2 threads; shapes it cannot take refused.

A prompt chunk's causal attention over a bfloat16 or int8 pool: the reference attention over the
stored keys to bfloat16's rounding of queries and weights, closer than torch's products by query
blocks; a row's bits the same whatever the chunk it came in and the threads; shapes it cannot take
refused. Where neither can run, None (torch's then)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from pantheon_ocr.engine.attention import naive_attention  # noqa: E402
from pantheon_ocr.engine.backends import bf16_attention as S  # noqa: E402
from pantheon_ocr.engine.backends import torch_blocks  # noqa: E402
from pantheon_ocr.engine.cache import KVCache, KVPool  # noqa: E402
from pantheon_ocr.engine.backends.torch_pixtral import query_block_attention  # noqa: E402

from .test_native import compiled_or_skip  # noqa: E402

BF16_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_bf16"})  # what the kernels need of the CPU


def softmax_or_skip() -> S.CompiledSoftmax:
    return compiled_or_skip(S.SOFTMAX, BF16_FLAGS)


def full_or_skip() -> S.FullAttention:
    return compiled_or_skip(S.FULL, BF16_FLAGS)


def prompt_or_skip() -> S.PromptAttention:
    return compiled_or_skip(S.PROMPT, BF16_FLAGS)


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
    assert S.build_prompt_attention(tmp_path).startswith("torch's products by query blocks (no compiler")
    assert S.build_full_attention(tmp_path).startswith("torch's products by query blocks (no compiler")


def vision_inputs(b: int, h: int, n: int, d: int, seed: int):
    """q, k, v as the tower passes them: [B, H, N, D] views of [B, N, H, D] rows (not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, h, d, generator=gen).to(torch.bfloat16).transpose(1, 2) for _ in range(3))
    return q * 2, k, v


@pytest.mark.parametrize("n", [1, 2, 33, 700])
@pytest.mark.parametrize("d", [64, 128])
def test_vision_attention_is_sdpa_to_bfloat16s_rounding(n, d):
    """Two images, the second with its last keys masked as the tower masks a padded grid: SDPA over
    the same bfloat16 inputs in float64, to the rounding of the queries and weights; closer than the
    products by query blocks (which round the scores too); masked keys weigh nothing."""
    attend = full_or_skip()
    q, k, v = vision_inputs(2, 3, n, d, n + d)
    mask = torch.zeros(2, 1, 1, n, dtype=torch.bfloat16)  # in the compute dtype, as the backend makes it
    cut = max(1, n - n // 3)
    mask[1, ..., cut:] = -30000.0
    v[1, :, cut:] = 1000.0  # a masked key that leaked would show
    got = attend(q, k, v, attn_mask=mask)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=mask.double())
    blocks = query_block_attention(q, k, v, attn_mask=mask, softmax=S.compiled_softmax())
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    err, err_blocks = rel_err(got.double().numpy(), want.numpy()), rel_err(blocks.double().numpy(), want.numpy())
    assert err <= 1e-2  # measured <= 0.4e-2
    assert err <= err_blocks or n == 1  # one key: both are its value, rounded
    assert float(got[1].double().abs().max()) < 10  # the masked values (1000) are not in it


def test_vision_attention_rows_do_not_depend_on_the_threads():
    attend = full_or_skip()
    q, k, v = vision_inputs(1, 2, 300, 64, 5)
    both = attend(q, k, v)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend(q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, both)


def test_vision_shapes_it_cannot_take_are_refused():
    attend = full_or_skip()
    assert attend.takes(16, 64) and attend.takes(3, 128) and not attend.takes(3, 16) and not attend.takes(3, 320)
    q, k, v = vision_inputs(1, 2, 10, 32, 0)
    with pytest.raises(ValueError, match="does not take 2 heads of 32"):
        attend(q, k, v)
    q, k, v = vision_inputs(1, 2, 10, 64, 0)
    with pytest.raises(ValueError, match="bfloat16"):
        attend(q.float(), k, v)
    with pytest.raises(ValueError, match=r"mask must be additive \[B, 1, 1, N\]"):
        attend(q, k, v, attn_mask=torch.zeros(1, 1, 10, 10, dtype=torch.bfloat16))


def pool_with(kind: str, hkv: int, d: int, n: int, seed: int) -> tuple[KVPool, KVCache]:
    rng = np.random.default_rng(seed)
    pool = KVPool(1, hkv, d, kind)
    cache = KVCache(1, hkv, d, n + 5, False, pool=pool)
    k, v = (rng.standard_normal((hkv, n, d)).astype(np.float32) for _ in range(2))
    k[:, :, 3] *= 8  # an outlier channel, as Qwen's keys have (the int8 pool's channel scales)
    cache.write(0, 0, k, v)
    return pool, cache


@pytest.mark.parametrize("prefix,t", [(0, 1), (0, 300), (5, 31), (255, 257), (600, 7)])
@pytest.mark.parametrize("group,d", [(1, 64), (2, 128), (7, 64)])  # 7: Qwen2.5-0.5B's 14 over 2, rows not 32
@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_prompt_attention_is_naive_attention_in_bfloat16(prefix, t, group, d, kind):
    """A prompt chunk after its cached prefix: the reference attention over the same stored keys, to the
    rounding of the queries and the softmax weights to bfloat16; closer than the products by query
    blocks, which round the scores too."""
    attend = prompt_or_skip()
    hkv = 2
    pool, cache = pool_with(kind, hkv, d, prefix + t, prefix + 7 * t + group)
    q = torch.from_numpy(np.random.default_rng(t).standard_normal((t, hkv * group, d)).astype(np.float32) * 2)
    got = attend(pool, 0, cache.held_slot(), prefix, q, scale=d ** -0.5)
    kk, vv, _ = cache.read(0, prefix + t)  # the stored keys, widened
    ref = naive_attention(q.numpy().transpose(1, 0, 2), kk, vv, np.arange(prefix, prefix + t), np.arange(prefix + t),
                          scale=d ** -0.5, causal=True).transpose(1, 0, 2)
    blocks = torch_blocks.causal_block_attention(pool, 0, cache.held_slot(), prefix, q, scale=d ** -0.5)
    assert got.shape == (t, hkv * group, d) and got.dtype == torch.float32
    err, err_blocks = rel_err(got.numpy(), ref), rel_err(blocks.numpy(), ref)
    assert err <= 1e-2  # measured <= 0.5e-2
    assert err <= err_blocks or t == 1 and prefix == 0  # one key: both are its value, rounded
    assert rel_err(got.numpy()[:1], ref[:1]) <= 1e-2  # the mask is there: the first query sees its prefix only


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def test_a_rows_bits_do_not_depend_on_its_chunk_or_the_threads():
    """Every row's sums run in an order its own position fixes: the prompt in one call, in uneven
    chunks, or on one thread gives the same bits."""
    attend = prompt_or_skip()
    pool, cache = pool_with("bfloat16", 2, 128, 700, 3)
    q = torch.from_numpy(np.random.default_rng(1).standard_normal((700, 4, 128)).astype(np.float32))
    whole = attend(pool, 0, cache.held_slot(), 0, q, scale=0.1)
    cuts = [0, 1, 18, 512, 513, 700]
    parts = torch.cat([attend(pool, 0, cache.held_slot(), a, q[a:b], scale=0.1) for a, b in zip(cuts, cuts[1:])])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend(pool, 0, cache.held_slot(), 0, q, scale=0.1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(parts, whole) and torch.equal(alone, whole)


def test_prompt_shapes_it_cannot_take_are_refused():
    attend = prompt_or_skip()
    assert attend.takes(16, 8, 128) and attend.takes(14, 2, 64)
    assert not attend.takes(4, 2, 16) and not attend.takes(12, 8, 64) and not attend.takes(64, 1, 64)
    pool, cache = pool_with("bfloat16", 2, 64, 10, 0)
    with pytest.raises(ValueError, match="do not fit"):
        attend(pool, 0, cache.held_slot(), 0, torch.zeros(3, 4, 32), scale=0.1)
    with pytest.raises(ValueError, match="outside the pool"):
        attend(pool, 0, cache.held_slot(), pool.k[0].shape[2], torch.zeros(3, 4, 64), scale=0.1)
    with pytest.raises(ValueError, match="bfloat16 or int8 pool"):
        attend(KVPool(1, 2, 64, "float32"), 0, 0, 0, torch.zeros(3, 4, 64), scale=0.1)
