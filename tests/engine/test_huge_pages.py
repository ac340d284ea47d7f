"""The torch decoders' copied matrices in transparent huge pages (torch_weights.into_huge_pages):
the same bits in the new place, a stack's parts still views of the stack, the old copies freed,
and nothing moved where the platform has no huge pages."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pantheon_ocr.engine import load_model, memory  # noqa: E402
from pantheon_ocr.engine.format import torch_groups as G  # noqa: E402
from pantheon_ocr.engine.format import torch_weights as TW  # noqa: E402

from .conftest import LIGHTONOCR_TEXT, smollm2_or_skip  # noqa: E402
from .test_batch_exact import _prompts  # noqa: E402


def _logits(decoder, prompts):
    out = []
    for ids in prompts:
        state = decoder.new_state(max_seq=len(ids) + 4)
        out.append(decoder.forward(state, ids))
        out.append(decoder.forward(state, [ids[0]]))  # a decode step
        state.release()
    return out


@pytest.mark.parametrize("which", ["lightonocr-int8", "lightonocr-bf16", "smollm2-int4"])
def test_matrices_in_huge_pages_keep_their_bits_and_views(which, monkeypatch):
    path = smollm2_or_skip() if which.startswith("smollm2") else LIGHTONOCR_TEXT
    storage = "bf16" if which.endswith("bf16") else "int8"
    monkeypatch.setattr(memory, "huge_page_buffer", lambda n: None)  # the platform without huge pages
    plain = load_model(path, weights=storage).decoder
    monkeypatch.undo()
    moved = load_model(path, weights=storage).decoder
    prompts = _prompts(plain.cfg.n_vocab, 3, seed=5)
    for a, b in zip(_logits(plain, prompts), _logits(moved, prompts)):
        assert np.array_equal(a, b)
    layer = moved.torch_blocks.layers[0]
    if layer.attn_qkv is not None:  # the parts are still views of their stack's rows, held once
        stack = TW.tensors_of(layer.attn_qkv.torch_data())[0]
        part = TW.tensors_of(layer.attn_k.torch_data())[0]
        assert part.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
        tiles = getattr(layer.attn_qkv.torch_data(), "tiles", None) is not None
        per = G.TILE if tiles else 1  # a 4-bit tile holds 16 rows
        q, k = layer.attn_q.shape[0] // per, layer.attn_k.shape[0] // per
        assert torch.equal(part, stack[q:q + k])
    if storage == "int8" and memory.huge_page_buffer(1) is not None:  # Linux: one map holds them all
        ptrs = {t.untyped_storage().data_ptr() for w in (layer.attn_output, moved.output)
                for t in TW.tensors_of(w.torch_data())}
        plain_ptrs = {t.untyped_storage().data_ptr() for w in (plain.torch_blocks.layers[0].attn_output, plain.output)
                      for t in TW.tensors_of(w.torch_data())}
        assert ptrs.isdisjoint(plain_ptrs)


def test_nothing_moves_without_huge_pages_or_copies(monkeypatch):
    d = load_model(LIGHTONOCR_TEXT, weights="int8").decoder
    layer = d.torch_blocks.layers[0]
    before = TW.tensors_of(layer.ffn_down.torch_data())[0].data_ptr()
    monkeypatch.setattr(memory, "huge_page_buffer", lambda n: None)
    assert TW.into_huge_pages([layer.ffn_down]) == 0
    assert TW.tensors_of(layer.ffn_down.torch_data())[0].data_ptr() == before
    f32 = load_model(LIGHTONOCR_TEXT, weights="f32").decoder  # numpy's own arrays: not torch's to move
    monkeypatch.undo()
    assert TW.into_huge_pages([f32.layers[0].ffn_down]) == 0


def test_a_huge_page_buffer_is_zeroed_and_its_size():
    buf = memory.huge_page_buffer(3 << 20)
    if buf is None:
        pytest.skip("no transparent huge pages on this platform")
    assert buf.dtype == np.uint8 and buf.shape == (3 << 20,) and not buf.any()
    assert buf.ctypes.data % memory.HUGE_PAGE == 0
    buf[:] = 7  # writable
    assert memory.huge_page_buffer(0) is None
