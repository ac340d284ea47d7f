"""Batched decode is bit-identical to decoding each sequence alone (np.array_equal on logits).

Every step, every row of `forward_batch` is compared with the logits the same sequence gets from
`decoder.forward(state, [tok])` on a twin state that decodes alone, for many batch sizes,
sequences joining at different steps (continuous batching) and leaving, both storage modes and
every decoder architecture that batches. The fed tokens are each sequence's own greedy choice,
and the streams are checked to vary (a model stuck on one token would prove little). Random
tiny models with tied embeddings fall into repeating their last token under plain greedy, so
their streams take the greedy choice among the tokens not generated yet (`no_repeat`).
"""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine import load_model
from pantheon_ocr.engine.batch import forward_batch

from .conftest import LIGHTONOCR_TEXT, qwen05b_or_skip, smollm2_or_skip
from .tiny_models import write_tiny


def pick(logits, stream, no_repeat):
    if no_repeat and stream:
        logits = logits.copy()
        logits[stream] = -np.inf
    return int(np.argmax(logits))


def run_exact(decoder, prompts, joins, steps, leaves=None, no_repeat=False, check=None, pool=None):
    """Continuous batching with a solo twin per sequence; returns the greedy streams. Sequence b
    is prefilled at step joins[b], decodes `steps` tokens, and leaves early at leaves[b] if given.
    Asserts every batched logits row of the sequences in `check` (default: all) equals its twin's,
    bit for bit; the others ride along in the batch (real models: twins cost a forward each).
    Every state is a slot of one KV pool (`pool`, default a new float32 one), as in a page engine:
    the batch's padded decode attention runs over slots its twins share."""
    leaves = leaves or [steps] * len(prompts)
    pool = decoder.new_pool() if pool is None else pool
    check = set(range(len(prompts)) if check is None else check)
    batch_st, solo_st, streams = {}, {}, {b: [] for b in range(len(prompts))}
    step = 0
    while step <= max(joins) or batch_st:
        for b, j in enumerate(joins):
            if j == step:
                n = len(prompts[b]) + steps + 1
                batch_st[b] = decoder.new_state(n, pool)
                first = decoder.forward(batch_st[b], prompts[b])[-1]
                if b in check:
                    solo_st[b] = decoder.new_state(n, pool)
                    assert np.array_equal(first, decoder.forward(solo_st[b], prompts[b])[-1])
                streams[b].append(pick(first, streams[b], no_repeat))
        live = sorted(batch_st)
        if live:
            toks = [streams[b][-1] for b in live]
            got = forward_batch(decoder, [batch_st[b] for b in live], toks)
            assert got.shape == (len(live), decoder.cfg.n_vocab)
            for row, b, t in zip(got, live, toks):
                if b in check:
                    want = decoder.forward(solo_st[b], [t])[0]
                    assert np.array_equal(row, want), (
                        f"sequence {b} step {step} (batch of {len(live)}): max diff {np.abs(row - want).max()}")
                streams[b].append(pick(row, streams[b], no_repeat))
            for b in live:
                if len(streams[b]) > min(steps, leaves[b]):
                    batch_st.pop(b).release()
                    if b in solo_st:
                        solo_st.pop(b).release()
        step += 1
    return [streams[b] for b in range(len(prompts))]


def _prompts(n_vocab, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, size=int(rng.integers(2, 40))).tolist() for _ in range(n)]


def _joins(n, seed):
    rng = np.random.default_rng(seed + 1)
    return [0] + sorted(rng.integers(0, 5, size=n - 1).tolist())


def assert_varied(streams):
    """Non-degenerate: the streams hold several different tokens, and not all the same stream."""
    assert len({t for s in streams for t in s}) >= 4, streams
    assert all(len(set(s)) >= min(2, len(s)) for s in streams), streams


@pytest.mark.parametrize("weights", ["f32", "quantized"])
@pytest.mark.parametrize("B", [1, 2, 3, 7, 16, 33])
def test_lightonocr_text_batch_rows_are_exact(B, weights):
    model = load_model(LIGHTONOCR_TEXT, weights=weights)
    prompts = _prompts(model.config.n_vocab, B, seed=B)
    leaves = [5 if b % 4 == 3 else 8 for b in range(B)]  # some leave early, the rest carry on
    streams = run_exact(model.decoder, prompts, _joins(B, B), steps=8, leaves=leaves, no_repeat=True)
    assert_varied(streams)


def test_rows_are_exact_when_most_slots_of_the_range_have_left():
    """Most sequences leave early, so the survivors sit far apart in the pool: decode attention
    then gathers their slots (cache.decode_attend's sparse path) instead of viewing the range;
    the rows still equal their solo twins bit for bit."""
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    prompts = _prompts(model.config.n_vocab, 12, seed=21)
    leaves = [8 if b in (0, 11) else 2 for b in range(12)]  # 2 of 12 carry on: a sparse range
    assert_varied(run_exact(model.decoder, prompts, [0] * 12, steps=8, leaves=leaves, no_repeat=True))


# Sequences join one schedule so that the batch holds 1, 2, 3, 7, 16 and then 33 of them on
# consecutive steps: one model load walks every batch size. Twins are decoded for the first
# sequence and the last to join (each twin costs one forward per step).
GROWING_JOINS = [0, 1, 2, 3, 3, 3, 3] + [4] * 9 + [5] * 17


@pytest.mark.slow
def test_smollm2_batch_rows_are_exact_as_the_batch_grows():
    model = load_model(smollm2_or_skip(), weights="f32")
    n = len(GROWING_JOINS)
    prompts = _prompts(model.config.n_vocab, n, seed=101)
    streams = run_exact(model.decoder, prompts, GROWING_JOINS, steps=6, check={0, n - 1})
    assert_varied(streams)


@pytest.mark.slow
def test_smollm2_quantized_batch_rows_are_exact():
    model = load_model(smollm2_or_skip(), weights="quantized")
    prompts = _prompts(model.config.n_vocab, 4, seed=303)
    run_exact(model.decoder, prompts, [0, 1, 1, 2], steps=2, check={0, 3})


@pytest.mark.slow
def test_qwen05b_batch_rows_are_exact():
    model = load_model(qwen05b_or_skip(), weights="f32")
    prompts = _prompts(model.config.n_vocab, 4, seed=205)
    assert_varied(run_exact(model.decoder, prompts, [0, 1, 1, 2], steps=3, check={0, 3}))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3"])
@pytest.mark.parametrize("weights", ["f32", "quantized"])
def test_tiny_archs_batch_rows_are_exact(tmp_path, arch, weights):
    path = tmp_path / f"{arch}.gguf"
    write_tiny(path, arch, dtype="Q8_0" if weights == "quantized" else "F32")
    model = load_model(path, weights=weights)
    for B in (1, 2, 3, 7, 16, 33):
        prompts = _prompts(model.config.n_vocab, B, seed=B)
        assert_varied(run_exact(model.decoder, prompts, _joins(B, B), steps=5, no_repeat=True))


def test_kv_float16_batch_rows_are_exact():
    """The float16 KV pool keeps the promise too (its rows differ from float32's, not from each other)."""
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    prompts = _prompts(model.config.n_vocab, 7, seed=5)
    assert_varied(run_exact(model.decoder, prompts, _joins(7, 5), steps=6, no_repeat=True,
                            pool=model.decoder.new_pool("float16")))


def test_long_prompts_grow_the_pool_while_others_decode():
    """Prompts longer than a slot's first capacity (256) join a batch that is decoding: every
    layer's buffer grows (slots and positions) and keeps what the others hold."""
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, model.config.n_vocab, size=n).tolist() for n in (5, 300, 40, 700, 9)]
    assert_varied(run_exact(model.decoder, prompts, [0, 1, 1, 3, 4], steps=6, no_repeat=True))


def test_slot_reuse_after_a_sequence_leaves():
    """A slot freed by a finished sequence is zeroed and reused; its neighbours are unaffected."""
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    d = model.decoder
    pool = d.new_pool()
    prompts = _prompts(model.config.n_vocab, 6, seed=9)
    run_exact(d, prompts[:3], [0, 0, 0], steps=3, pool=pool)  # their states are released: slots free again
    assert pool._free  # noqa: SLF001 - the released slots wait for reuse
    run_exact(d, prompts[3:], [0, 1, 1], steps=4, pool=pool)
