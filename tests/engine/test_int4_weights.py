"""Groups under int8 storage: a matrix the file holds as Q4_0 / Q4_1 stays 4-bit (Q5_0 / Q5_1 5-bit and
Q8_0 its blocks where the compiled products build)
(format/torch_groups.Groups: the compiled products' tiles where they build, else torch's
int4-weight kernel's layout; both are tested here): the file's values, exact rows whatever the batch,
a stack the same bits as its parts, and the error against float32 stated."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

from pantheon_ocr.engine import load_model  # noqa: E402
from pantheon_ocr.engine.format import torch_groups as G  # noqa: E402
from pantheon_ocr.engine.format import torch_weights as TW  # noqa: E402

from .test_batch_exact import _joins, _prompts, assert_varied, run_exact  # noqa: E402
from .test_products import products_or_skip  # noqa: E402
from .test_kv_int8 import greedy  # noqa: E402
from .tiny_models import write_tiny  # noqa: E402


def _blocks(qtype: Q, shape=(64, 96), seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.1, 3, size=(shape[0], 1)).astype(np.float32)
    w[:, 32:64] += 0.7  # a group off zero: Q4_1's minimum is not -8 d there
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype).astype(np.float32)


@pytest.fixture(params=["tiles", "torch"])
def layout(request, monkeypatch) -> str:
    """Groups as the compiled products' tiles (skipped where they do not build), or in torch's
    layout (the compiled products hidden, as where they do not build)."""
    if request.param == "tiles":
        products_or_skip()
    else:
        monkeypatch.setattr(G, "compiled_products", lambda: None)
    return request.param


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_4bit_groups_multiply_as_the_files_values(qtype, layout):
    """The product is x @ W.T of the file's own dequantized values, up to the rounding of the rows
    (int8 blocks of 32 for tiles; bfloat16 in torch's layout, whose scales and output are rounded
    to it too): not a second quantization of the weights."""
    raw, dense = _blocks(qtype)
    data = G.groups_of(raw, qtype)
    assert data.shape == dense.shape and TW.kind_of(data) == "groups"
    assert (data.tiles is not None) == (layout == "tiles")
    assert TW.nbytes(data) == dense.size // 2 + 2 * 2 * dense.size // 32  # half a byte + 2 16-bit values per group
    x = torch.randn(5, dense.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = TW.linear(data, x).numpy()
    ref = x.to(torch.bfloat16).float().numpy() @ dense.T
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert np.array_equal(TW.rows_f32(data, np.array([3, 0, 63])), dense[[3, 0, 63]])  # lookups: the file's rows
    assert not G.groups_fit(qtype, (40, 96))  # int8 rows then
    assert G.groups_fit(Q.Q8_0, dense.shape) == (layout == "tiles")  # torch has no int8-group kernel


def test_torch_layout_packed_block_by_block_and_a_stack_keep_the_bits(monkeypatch):
    """Packing QUANTIZE_ROWS rows at a time, and stacking matrices (q/k/v), change no bit: torch packs
    int4_pack_rows() rows at a time (measured here) and each output column reads its own row."""
    monkeypatch.setattr(G, "compiled_products", lambda: None)
    b = G.int4_pack_rows()
    raw, _ = _blocks(Q.Q4_1, shape=(4 * b, 64))
    whole = G.groups_of(raw, Q.Q4_1)
    monkeypatch.setattr(G, "QUANTIZE_ROWS", b)
    pieces = G.groups_of(raw, Q.Q4_1)
    assert torch.equal(whole.packed, pieces.packed) and torch.equal(whole.scales_zeros, pieces.scales_zeros)
    if b >= 32:  # pieces of half a block are another pack (torch packs no fewer than 16 rows)
        monkeypatch.setattr(G, "QUANTIZE_ROWS", b // 2)
        assert not torch.equal(whole.packed, G.groups_of(raw, Q.Q4_1).packed)
    parts = [G.groups_of(raw[r0:r1], Q.Q4_1) for r0, r1 in ((0, 2 * b), (2 * b, 3 * b), (3 * b, 4 * b))]
    assert all(G.groups_fit(Q.Q4_1, p.shape) for p in parts) and not G.groups_fit(Q.Q4_1, (b + b // 2, 64))
    stacked = TW.stack(parts)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.inference_mode():
        y = TW.product(stacked)(x)
        assert torch.equal(y, torch.cat([TW.product(p)(x) for p in parts], dim=1))
        views = TW.row_views(stacked, parts)
        assert all(torch.equal(TW.product(v)(x), TW.product(p)(x)) for v, p in zip(views, parts))
    assert views[1].packed.data_ptr() == stacked.packed[2 * b:].data_ptr()  # the stack's rows, not a copy
    with pytest.raises(ValueError, match="kinds"):
        TW.stack([parts[0], TW.int8_rows(np.ones((32, 64), np.float32))])


def test_tiles_of_a_stack_are_its_parts_tiles():
    """Stacking tiled matrices (q/k/v) concatenates whole tiles: the stack multiplies as its parts,
    bit for bit, and its views are the stack's own tiles, not copies."""
    products_or_skip()
    raw, _ = _blocks(Q.Q4_1, shape=(80, 64))
    parts = [G.groups_of(raw[r0:r1], Q.Q4_1) for r0, r1 in ((0, 48), (48, 64), (64, 80))]
    assert all(p.tiles is not None for p in parts) and G.groups_fit(Q.Q4_1, (16, 64))
    stacked = TW.stack(parts)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(TW.linear(stacked, x), torch.cat([TW.linear(p, x) for p in parts], dim=1))
        views = TW.row_views(stacked, parts)
        assert all(torch.equal(TW.linear(v, x), TW.linear(p, x)) for v, p in zip(views, parts))
    assert views[1].tiles.data_ptr() == stacked.tiles[3:].data_ptr()


@pytest.mark.parametrize("dtype", ["Q4_0", "Q4_1"])
def test_4bit_file_loads_as_groups_and_batch_rows_are_exact(tmp_path, dtype, layout):
    path = tmp_path / "m.gguf"
    write_tiny(path, "qwen3", dtype=dtype)
    model = load_model(path, weights="int8")
    layer = model.decoder.layers[0]
    assert all(TW.kind_of(getattr(layer, n)._data) == "groups" for n in ("attn_q", "attn_output", "ffn_down"))
    blocks = model.decoder.torch_blocks
    assert blocks is not None and TW.kind_of(blocks.layers[0].attn_qkv._data) == "groups"
    for B in (1, 3, 16):
        prompts = _prompts(model.config.n_vocab, B, seed=B)
        for kind in ("bfloat16", "int8"):
            assert_varied(run_exact(model.decoder, prompts, _joins(B, B), steps=4, no_repeat=True,
                                    pool=model.decoder.new_pool(kind)))


@pytest.mark.parametrize("dtype,bits", [("Q5_0", 5), ("Q5_1", 5), ("Q8_0", 8)])
def test_5_and_8bit_files_keep_their_groups_as_tiles(tmp_path, dtype, bits, monkeypatch):
    """Q5_0 / Q5_1 / Q8_0 matrices are tiles of the file's values where the compiled products build
    (5-bit: 0.75 bytes a weight, not int8 rows' 1; 8-bit: the file's blocks, not a second quantization
    to a scale per row): exact rows in any batch, the greedy stream of the file's float32 values;
    without the products, int8 rows (torch has no 5-bit or int8-group kernel)."""
    products_or_skip()
    path = tmp_path / "m.gguf"
    write_tiny(path, "llama", dtype=dtype)  # (qwen3's tiny stream meets a near-tie: margin 0.029 at step 2)
    model = load_model(path, weights="int8")
    data = model.decoder.layers[0].attn_q._data
    assert TW.kind_of(data) == "groups" and data.bits == bits and data.tiles.shape[2] == {5: 384, 8: 544}[bits]
    for B in (1, 3, 16):
        prompts = _prompts(model.config.n_vocab, B, seed=B)
        assert_varied(run_exact(model.decoder, prompts, _joins(B, B), steps=4, no_repeat=True,
                                pool=model.decoder.new_pool("int8")))
    f32 = load_model(path, weights="f32")
    prompt = _prompts(f32.config.n_vocab, 1, seed=4)[0]
    ref_toks, ref = greedy(f32.decoder, prompt, "float32", n=12)
    toks, got = greedy(model.decoder, prompt, "float32", n=12)
    assert toks == ref_toks
    assert 1e-5 < np.abs(got - ref).max() / np.abs(ref).max() <= 3e-2
    monkeypatch.setattr(G, "compiled_products", lambda: None)
    assert TW.kind_of(load_model(path, weights="int8").decoder.layers[0].attn_q._data) == "int8"


def test_4bit_file_greedy_stream_is_its_float32_stream(tmp_path, layout):
    """Against the numpy float32 reference of the same Q4_1 file (its values dequantized): the
    greedy streams are equal; the error is bfloat16's (measured 2.0e-2 of the largest logit on
    SmolLM2-135M Q4_1, where its int8 rows measured 3.4e-2: test_int8_weights.py)."""
    path = tmp_path / "m.gguf"
    write_tiny(path, "llama", dtype="Q4_1")
    f32, q = load_model(path, weights="f32"), load_model(path, weights="int8")
    prompt = _prompts(f32.config.n_vocab, 1, seed=4)[0]
    ref_toks, ref = greedy(f32.decoder, prompt, "float32", n=12)
    toks, got = greedy(q.decoder, prompt, "float32", n=12)
    assert toks == ref_toks
    assert 1e-5 < np.abs(got - ref).max() / np.abs(ref).max() <= 3e-2


def test_groups_of_other_bits_are_not_stacked():
    """A Q4_K_M layer's q / k may be 5-bit tiles and its v 8-bit ones: their records differ, so they stay
    apart (weights.can_stack says no, stack refuses)."""
    products_or_skip()
    five, eight = (G.groups_of(_blocks(q, shape=(16, 64))[0], q) for q in (Q.Q5_0, Q.Q8_0))
    assert TW.kind_of(five) == TW.kind_of(eight) == "groups" and TW.layout_of(five) != TW.layout_of(eight)
    with pytest.raises(ValueError, match="kinds"):
        TW.stack([five, eight])


def test_8bit_tiles_look_up_their_rows_without_the_files_pages():
    """A Q8_0 embedding's lookups decode the resident tiles (the file's pages were released after
    packing): the file's values to the bit, with no file blocks at hand."""
    products_or_skip()
    from dataclasses import replace

    raw, dense = _blocks(Q.Q8_0, shape=(48, 96))
    data = replace(G.groups_of(raw, Q.Q8_0), raw=None)
    ids = np.array([47, 0, 16, 15, 16, 31])
    assert np.array_equal(TW.rows_f32(data, ids), dense[ids])
