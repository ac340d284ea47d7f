"""Sampling and the repetition guard."""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine.sampling import RepetitionGuard, Sampler, SamplingOptions
from pantheon_ocr.errors import UsageError

PIECES = {1: ".", 2: " ", 3: "Average", 4: "|", 5: "---", 6: "\n", 7: " the", 8: " cat", 9: "_", 10: "-"}


def decode(ids):
    return "".join(PIECES.get(i, f"<{i}>") for i in ids)


guard = RepetitionGuard(decode)


@pytest.mark.parametrize("tokens", [
    [3] * 100,  # one token forever
    [7, 8] * 60,  # a bigram loop
    list(range(20, 40)) + [11, 12, 13, 14, 15, 16, 17] * 12,  # a 7-gram loop after real text
    [3, 6] * 50,  # a line repeated
])
def test_loops_are_caught(tokens):
    assert guard.looping(tokens)


@pytest.mark.parametrize("tokens", [
    [1] * 200,  # dot leaders: "Chapter 1 ........ 7"
    [4, 5] * 80,  # table rule |---|---|
    [4, 2, 5, 2] * 40,  # | --- | --- |
    [9] * 100 + [10] * 100,  # underscores and dashes
    list(range(20, 220)),  # ordinary text
    [3] * 40,  # too short to call a loop
])
def test_layout_and_text_are_spared(tokens):
    assert not guard.looping(tokens)


def test_whitespace_loop_is_a_loop():
    assert guard.looping([6] * 100)


def test_greedy_is_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert Sampler()(logits) == 1


def test_seeded_sampling_is_reproducible_and_respects_top_p():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32) * 3
    params = SamplingOptions(temperature=0.8, top_p=0.5, seed=42)
    a = [Sampler(params)(logits) for _ in range(3)]
    s1, s2 = Sampler(params), Sampler(params)
    seq1 = [s1(logits) for _ in range(50)]
    seq2 = [s2(logits) for _ in range(50)]
    assert seq1 == seq2 and len(set(a)) == 1
    probs = np.exp(logits / 0.8 - (logits / 0.8).max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = set(order[: np.searchsorted(np.cumsum(probs[order]), 0.5) + 1].tolist())
    assert set(seq1) <= nucleus


def test_top_p_tiny_keeps_the_top_token():
    logits = np.array([1.0, 5.0, 2.0], dtype=np.float32)
    assert all(Sampler(SamplingOptions(temperature=1.0, top_p=1e-6, seed=s))(logits) == 1 for s in range(20))


@pytest.mark.parametrize("t, p", [(-0.1, 1.0), (0.5, 0.0), (0.5, 1.5)])
def test_bad_parameters(t, p):
    with pytest.raises(UsageError):
        SamplingOptions(temperature=t, top_p=p)
