"""Batched decode: every greedy stream equals its sequential run, sequences joining late."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pantheon_ocr.engine import load_model
from pantheon_ocr.engine.batch import BatchUnsupported, batch_logits, forward_batch

from .conftest import LIGHTONOCR_TEXT, smollm2_or_skip
from .kv import keys


def sequential(decoder, prompt, n):
    st = decoder.new_state(len(prompt) + n)
    logits = decoder.forward(st, prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = decoder.forward(st, [out[-1]])
    return out, logits


def batched(decoder, prompts, n, joins):
    """Greedy decode with continuous batching: prompt b joins at step joins[b]."""
    active, results, step = {}, {b: [] for b in range(len(prompts))}, 0
    while any(len(r) < n for r in results.values()):
        for b, j in enumerate(joins):
            if j == step:
                st = decoder.new_state(len(prompts[b]) + n)
                tok = int(np.argmax(decoder.forward(st, prompts[b])[-1]))
                results[b].append(tok)
                active[b] = st
        live = [b for b in active if len(results[b]) < n]
        if live:
            logits = forward_batch(decoder, [active[b] for b in live], [results[b][-1] for b in live])
            for b, row in zip(live, logits):
                results[b].append(int(np.argmax(row)))
        step += 1
    return [results[b][:n] for b in range(len(prompts))]


def _prompts(n_vocab, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, size=L).tolist() for L in lengths]


@pytest.mark.parametrize("B", [1, 2, 5])
def test_batched_equals_sequential_lightonocr_text(B):
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    prompts = _prompts(model.config.n_vocab, [7, 19, 3, 30, 11][:B], seed=B)
    joins = [0, 2, 3, 5, 1][:B]
    want = [sequential(model.decoder, p, 12)[0] for p in prompts]
    assert batched(model.decoder, prompts, 12, joins) == want


@pytest.mark.parametrize("B", [1, 2, 5])
def test_batched_equals_sequential_smollm2(B):
    model = load_model(smollm2_or_skip(), weights="f32")
    prompts = _prompts(model.config.n_vocab, [9, 4, 17, 6, 12][:B], seed=10 + B)
    joins = [0, 1, 4, 2, 0][:B]
    want = [sequential(model.decoder, p, 8)[0] for p in prompts]
    assert batched(model.decoder, prompts, 8, joins) == want


def test_batch_logits_match_sequential_logits():
    model = load_model(LIGHTONOCR_TEXT, weights="f32")
    d = model.decoder
    prompts = _prompts(model.config.n_vocab, [5, 9, 2], seed=3)
    states = [d.new_state(20) for _ in prompts]
    for s, p in zip(states, prompts):
        d.forward(s, p)
    got = forward_batch(d, states, [1, 2, 3])
    for p, tok, row in zip(prompts, [1, 2, 3], got):
        s = d.new_state(20)
        d.forward(s, p)
        assert np.array_equal(row, d.forward(s, [tok])[0])  # bit for bit (test_batch_exact.py: every B)


def test_moe_refuses_without_changing_state(tmp_path):
    from .tiny_models import make_tiny, write_gguf

    cfg, sd = make_tiny("mixtral")
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, "mixtral", cfg, sd)
    model = load_model(path, weights="f32")
    d = model.decoder
    states = [d.new_state(16), d.new_state(16)]
    d.forward(states[0], [1, 2, 3])
    d.forward(states[1], [4, 5])
    before = [(s.pos, [k.copy() for k in keys(s.cache)]) for s in states]
    with pytest.raises(BatchUnsupported):
        forward_batch(d, states, [6, 7])
    for s, (pos, ks) in zip(states, before):
        assert s.pos == pos
        assert all(np.array_equal(a, b) for a, b in zip(keys(s.cache), ks))
    # The fallback gives the per-sequence result.
    ref = [d.forward(_replay(d, [1, 2, 3]), [6])[0], d.forward(_replay(d, [4, 5]), [7])[0]]
    np.testing.assert_allclose(batch_logits(d, states, [6, 7]), np.stack(ref), atol=1e-5)


def _replay(d, prompt):
    s = d.new_state(16)
    d.forward(s, prompt)
    return s


@pytest.mark.parametrize("kind", ["float32", "float16", "bfloat16", "int8"])
def test_a_decode_steps_kv_is_written_in_one_store_with_the_bits_of_one_write_each(kind):
    """write_step stores a step's B rows at once (KVPool.store_step): every buffer (values, int8
    scales) holds what B separate writes leave, bit for bit, at each sequence's own position."""
    from pantheon_ocr.engine.cache import KVCache, KVPool, write_step

    rng = np.random.default_rng(7)
    pools = [KVPool(2, 3, 8, kind) for _ in range(2)]
    caches = [[KVCache(2, 3, 8, 64, False, pool) for _ in range(4)] for pool in pools]
    lengths = [5, 1, 12, 7]
    for layer in range(2):
        for b, n in enumerate(lengths):  # the prompts: the same writes in both pools
            k, v = rng.standard_normal((2, 3, n, 8)).astype(np.float32) * 3
            for group in caches:
                group[b].write(layer, 0, k, v)
    for layer in range(2):
        k, v = rng.standard_normal((2, 3, 4, 8)).astype(np.float32) * 3  # [Hkv, B, D]
        k[:, 1] = 0  # a zero row: int8's scale 1
        for b, n in enumerate(lengths):
            caches[0][b].write(layer, n, k[:, b:b + 1], v[:, b:b + 1])
        write_step(caches[1], layer, lengths, k, v)
    for one, many in zip(pools[0].buffers(), pools[1].buffers()):
        for a, b in zip(one, many):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert pools[0].used == pools[1].used == [n + 1 for n in lengths]
    with pytest.raises(ValueError, match="does not fit a context"):
        write_step(caches[1], 0, [64, 1, 1, 1], k, v)


def _resident_kb(arrays) -> int:
    """Resident kB of the memory maps holding `arrays` (/proc/self/smaps; each pool buffer is a map of its own)."""
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays if a.nbytes]
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = any(s < hi and e > lo for s, e in spans)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
@pytest.mark.parametrize("kind", ["int8", "bfloat16"])
def test_a_slot_holds_memory_for_the_positions_written_not_its_capacity(kind):
    """Slots whose capacity is far above what they hold (a page's prompt + max_tokens against the
    tokens decoded so far) cost about what is written: no 2 MB huge page around each head's row."""
    from pantheon_ocr.engine.cache import KVCache, KVPool

    n_layer, n_kv, d, cap, n = 2, 8, 128, 8192, 256
    pool = KVPool(n_layer, n_kv, d, kind)
    rng = np.random.default_rng(3)
    caches = [KVCache(n_layer, n_kv, d, cap, False, pool) for _ in range(8)]
    for layer in range(n_layer):
        for c in caches:
            c.write(layer, 0, *rng.standard_normal((2, n_kv, 16, d)).astype(np.float32))  # small: the cap grows later
        for c in caches:
            c.write(layer, 16, *rng.standard_normal((2, n_kv, n - 16, d)).astype(np.float32))
            pool.reserve(layer, c.held_slot(), cap, cap)  # room for the whole capacity, as a long page reaches it
    assert all(b.shape[2] >= cap for b in pool.k)
    bufs = [b for group in pool.buffers() for b in group]
    written_kb = sum(b.nbytes * n // b.shape[2] for b in bufs) // 1024
    allocated_kb = sum(b.nbytes for b in bufs) // 1024
    assert allocated_kb > 20 * written_kb
    # each head's row rounds up to whole 4 KiB pages: at most a page more per row and buffer
    rows = sum(b.shape[0] * b.shape[1] for b in bufs)
    assert _resident_kb(bufs) <= written_kb + 4 * rows
