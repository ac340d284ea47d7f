"""The int8 KV cache (a bfloat16 scale per position and head): batched rows stay bit-identical to
sequential ones, and greedy streams match the float32 cache on real models.

Measured (this file's greedy checks, 24 tokens after the prompt; largest logit difference against
the float32 cache, and the largest logit): SmolLM2-135M identical stream, 0.26 of 33.7 (float32
position scales: 0.28; float16 KV: 0.013); Qwen2.5-0.5B identical stream, 0.19 of 20.0 (float32
scales: 0.18; float16: 0.012); the tiny LightOnOCR identical stream, 0.10 of 20.7. Without the
per-sequence key channel scales Qwen's stream left the float32 one at its 7th token (logit error
25): its keys have outlier channels.
"""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine import load_model

from .conftest import LIGHTONOCR_TEXT, qwen05b_or_skip, smollm2_or_skip
from .test_batch_exact import _joins, _prompts, assert_varied, run_exact


def test_int8_pool_rows_are_exact_in_a_batch():
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    prompts = _prompts(model.config.n_vocab, 9, seed=31)
    assert_varied(run_exact(model.decoder, prompts, _joins(9, 31), steps=6, no_repeat=True,
                            pool=model.decoder.new_pool("int8")))


def greedy(decoder, prompt, dtype, n=24):
    state = decoder.new_state(len(prompt) + n + 1, decoder.new_pool(dtype))
    logits, toks, rows = decoder.forward(state, prompt)[-1], [], []
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        rows.append(logits)
        logits = decoder.forward(state, [toks[-1]])[-1]
    return toks, np.array(rows)


@pytest.mark.parametrize("which", ["lightonocr", "smollm2", "qwen05b"])
def test_int8_greedy_stream_equals_float32(which):
    path = {"lightonocr": lambda: LIGHTONOCR_TEXT, "smollm2": smollm2_or_skip, "qwen05b": qwen05b_or_skip}[which]()
    model = load_model(path, weights="f32")
    prompt = (model.tokenizer.encode("The quick brown fox jumps over the lazy dog. Once upon a time")
              if which != "lightonocr" else _prompts(model.config.n_vocab, 1, seed=3)[0])
    ref_toks, ref = greedy(model.decoder, prompt, "float32")
    toks, got = greedy(model.decoder, prompt, "int8")
    assert toks == ref_toks
    assert np.abs(got - ref).max() <= 0.03 * np.abs(ref).max()  # measured at most 0.9% (SmolLM2)


def test_int8_pool_is_a_quarter_of_float32():
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    sizes = {}
    for dtype in ("float32", "int8"):
        pool = model.decoder.new_pool(dtype)
        state = model.decoder.new_state(300, pool)
        model.decoder.forward(state, list(range(1, 200)))
        sizes[dtype] = pool.nbytes()
    head_dim = model.config.head_dim
    # int8 values and a bfloat16 scale per position (the channel scales are per sequence: tiny)
    assert sizes["int8"] == sizes["float32"] * (head_dim + 2) / (4 * head_dim)


def test_a_row_is_stored_with_the_bfloat16_scale_it_was_quantized_with():
    """_int8_of: the scale is the largest magnitude / 127 rounded up to bfloat16 (as bits), the
    integers are made with that scale, so none passes 127 and each is within half a step of x; a
    zero row gets scale 1, and a row too small for a normal scale still quantizes finitely."""
    from pantheon_ocr.engine.cache import _int8_of
    from pantheon_ocr.engine.ops import from_bf16_bits

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((300, 64)) * rng.uniform(1e-3, 1e3, (300, 1))).astype(np.float32)
    x[7] = 0
    x[8] = np.float32(1e-42)  # max / 127 is below bfloat16's smallest subnormal
    x[9, 3] = -np.float32(127 * 1.00390625 + 0.1)  # a maximum whose scale is not a bfloat16
    q, bits = _int8_of(x)
    assert bits.dtype == np.uint16 and bits.shape == (300, 1)
    s = from_bf16_bits(bits)
    exact = np.abs(x).max(-1, keepdims=True) / np.float32(127)
    assert np.all(s >= exact) and np.all(s[exact > 1e-30] < exact[exact > 1e-30] * (1 + 2 ** -7))
    assert np.abs(q).max() <= 127 and np.array_equal(q, np.rint(x / s))
    assert np.all(np.abs(q * s - x) <= s / 2 + 1e-45)
    assert s[7] == 1 and not q[7].any() and np.isfinite(s[8]) and s[8] > 0
