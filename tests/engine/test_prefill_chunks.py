"""Chunked prefill: a page's prompt prefilled a chunk at a time (the CPU stage interleaves the
chunks with decode steps of the pages already running) gives the whole prompt's result, and the
pages decoding meanwhile are not disturbed."""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine import load_vlm
from pantheon_ocr.engine.page_engine import OCREngine
from pantheon_ocr.engine.sampling import SamplingOptions

from .conftest import LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT
from .kv import keys


@pytest.fixture(scope="module")
def vlm():
    return load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights="f32")


def _features(vlm, seed, h=84, w=112):
    img = (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)
    return vlm.encode_image(img)


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_prefill_equals_whole_prompt(vlm, chunk):
    feats = _features(vlm, 0)
    sampling = SamplingOptions(max_tokens=6)
    whole = OCREngine(vlm, ignore_eos=True, prefill_chunk=None)
    ref = whole.prefill(feats, sampling)
    eng = OCREngine(vlm, ignore_eos=True, prefill_chunk=chunk)
    seq = eng.start_prefill(feats, sampling)
    n_prompt = len(seq.pending[0])
    steps = 1
    while not eng.prefill_step(seq):
        steps += 1
    assert steps == -(-n_prompt // chunk) and not seq.prefilling
    assert seq.state.pos == ref.state.pos == n_prompt
    for layer in range(len(vlm.decoder.layers)):  # the same K/V, up to float rounding
        np.testing.assert_allclose(keys(seq.state.cache)[layer][:, :n_prompt], keys(ref.state.cache)[layer][:, :n_prompt],
                                   rtol=0, atol=2e-5)
    while not ref.finished:
        whole.decode_step([ref])
        eng.decode_step([seq])
    assert seq.generated == ref.generated


def test_pages_keep_decoding_while_another_prefills(vlm):
    """Decode steps between the chunks of a joining page: the running pages' tokens are those
    they get with no page joining, and the joining page's are its own alone."""
    sampling = SamplingOptions(max_tokens=12)
    eng = OCREngine(vlm, ignore_eos=True, prefill_chunk=8)
    alone = [OCREngine(vlm, ignore_eos=True).run_page(features=_features(vlm, s), sampling=sampling).generated
             for s in (1, 2)]
    running = eng.prefill(_features(vlm, 1), sampling)
    joining = eng.start_prefill(_features(vlm, 2), sampling)
    interleaved = 0
    while not eng.prefill_step(joining):
        eng.decode_step([running])
        interleaved += 1
    assert interleaved >= 2  # the join really was spread over several decode steps
    while not (running.finished and joining.finished):
        eng.decode_step([running, joining])
    assert running.generated == alone[0]
    assert joining.generated == alone[1]
