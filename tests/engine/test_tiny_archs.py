"""Tiny random GGUFs per architecture, written as llama.cpp writes them, against transformers'
own model classes on the same weights (references in tests/fixtures/ref_tiny_<arch>.npz)."""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine import load_model

from .conftest import FIXTURES
from .tiny_models import make_tiny, write_gguf

ARCHS = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3"]


def _model(tmp_path, arch, storage="f32", dtype="F32", experts="merged"):
    cfg, sd = make_tiny(arch)
    path = write_gguf(tmp_path / f"{arch}-{dtype}-{experts}.gguf", arch, cfg, sd, dtype=dtype, experts=experts)
    return load_model(path, weights=storage)


@pytest.mark.parametrize("storage", ["f32", "quantized"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tmp_path, arch, storage):
    ref = np.load(FIXTURES / f"ref_tiny_{arch}.npz")
    model = _model(tmp_path, arch, storage)
    got = model.logits(ref["input_ids"].tolist())
    np.testing.assert_allclose(got, ref["logits"], atol=1e-4, rtol=0)


def test_mistral_window_is_really_used(tmp_path):
    """The reference with and without the window differ, and we match the windowed one."""
    ref = np.load(FIXTURES / "ref_tiny_mistral.npz")
    model = _model(tmp_path, "mistral")
    assert model.config.sliding_window and model.config.sliding_window < len(ref["input_ids"])
    assert np.abs(ref["logits"] - ref["logits_nowindow"]).max() > 1e-2
    np.testing.assert_allclose(model.logits(ref["input_ids"].tolist()), ref["logits"], atol=1e-4, rtol=0)


def test_mixtral_split_experts_equal_merged(tmp_path):
    ref = np.load(FIXTURES / "ref_tiny_mixtral.npz")
    model = _model(tmp_path, "mixtral", experts="split")
    np.testing.assert_allclose(model.logits(ref["input_ids"].tolist()), ref["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_continuation_matches_transformers(tmp_path, arch):
    ref = np.load(FIXTURES / f"ref_tiny_{arch}.npz")
    model = _model(tmp_path, arch)
    got = model.generate(ref["input_ids"].tolist(), len(ref["gen_ids"]), stop=False)
    assert got == ref["gen_ids"].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cached_decode_equals_full_recompute(tmp_path, arch):
    """Prefill + one token at a time (through the ring for mistral) equals a full forward."""
    model = _model(tmp_path, arch)
    ids = np.load(FIXTURES / f"ref_tiny_{arch}.npz")["input_ids"].tolist()
    full = model.logits(ids)
    d = model.decoder
    state = d.new_state(len(ids))
    rows = [d.forward(state, ids[:5], all_logits=True)]
    rows += [d.forward(state, [t]) for t in ids[5:13]]
    rows.append(d.forward(state, ids[13:], all_logits=True))  # a second chunk over the cache
    np.testing.assert_allclose(np.concatenate(rows), full, atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["F16", "BF16", "Q8_0"])
def test_quantized_files_both_storage_modes_agree(tmp_path, dtype):
    ids = np.load(FIXTURES / "ref_tiny_qwen2.npz")["input_ids"].tolist()
    a = _model(tmp_path, "qwen2", "quantized", dtype).logits(ids)
    b = _model(tmp_path, "qwen2", "f32", dtype).logits(ids)
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
