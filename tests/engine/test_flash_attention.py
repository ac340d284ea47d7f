"""Blocked ("flash") attention, decode attention and the KV cache against the naive reference."""

from __future__ import annotations

import numpy as np
import pytest

from pantheon_ocr.engine.attention import TowerOptions, flash_attention, naive_attention, padded_decode_attention
from pantheon_ocr.engine.cache import KVCache

from .kv import decode_attention, held, keys

TOL = 1e-5


def _qkv(rng, hkv: int, group: int, tq: int, tk: int, d: int):
    q = rng.standard_normal((hkv * group, tq, d), dtype=np.float32)
    k = rng.standard_normal((hkv, tk, d), dtype=np.float32)
    v = rng.standard_normal((hkv, tk, d), dtype=np.float32)
    return q, k, v


def _close(a: np.ndarray, b: np.ndarray, tol: float = TOL) -> None:
    assert a.shape == b.shape
    assert a.dtype == np.float32
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert err <= tol, f"max abs error {err:.3g} > {tol}"


@pytest.mark.parametrize("t", [1, 31, 33, 255, 257, 600])
@pytest.mark.parametrize("group", [1, 2, 7])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_equals_naive(t, group, causal):
    rng = np.random.default_rng(1000 * t + 10 * group + causal)
    hkv, d = (1 if group == 7 else 2), 16
    q, k, v = _qkv(rng, hkv, group, t, t, d)
    pos = np.arange(t)
    ref = naive_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=causal)
    _close(flash_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=causal), ref)


@pytest.mark.parametrize("prefix,t", [(1, 1), (5, 31), (31, 33), (256, 1), (255, 257), (300, 300), (600, 7)])
@pytest.mark.parametrize("group", [1, 2, 7])
def test_causal_after_cached_prefix(prefix, t, group):
    """Queries at positions prefix..prefix+t-1 against every key 0..prefix+t-1."""
    rng = np.random.default_rng(prefix * 7 + t + group)
    hkv, d = 1, 32
    q, k, v = _qkv(rng, hkv, group, t, prefix + t, d)
    qpos, kpos = np.arange(prefix, prefix + t), np.arange(prefix + t)
    ref = naive_attention(q, k, v, qpos, kpos, scale=d ** -0.5, causal=True)
    _close(flash_attention(q, k, v, qpos, kpos, scale=d ** -0.5, causal=True), ref)


@pytest.mark.parametrize("prefix,t", [(0, 1), (0, 300), (5, 31), (255, 257), (600, 7)])
@pytest.mark.parametrize("group", [1, 2, 7])
def test_torch_causal_chunk_equals_naive(prefix, t, group):
    """The torch kernel that bf16 decoders prefill with, on a chunk after its cached prefix."""
    pytest.importorskip("torch")
    from pantheon_ocr.engine.backends.torch_attention import causal_chunk_attention

    rng = np.random.default_rng(prefix * 11 + t + group)
    hkv, d = (1 if group == 7 else 2), 32
    q, k, v = _qkv(rng, hkv, group, t, prefix + t, d)
    ref = naive_attention(q, k, v, np.arange(prefix, prefix + t), np.arange(prefix + t), scale=d ** -0.5, causal=True)
    _close(causal_chunk_attention(q, k, v, scale=d ** -0.5), ref)


def test_the_causal_chunk_kernel_serves_only_a_chunk_at_the_end_of_its_keys():
    calls = []

    def spy(q, k, v, *, scale):
        calls.append(q.shape[1])
        return np.zeros_like(q)

    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 2, 8, 20, 16)
    tower = TowerOptions(causal_chunk=spy)
    at_end, kpos = np.arange(12, 20), np.arange(20)
    tower.attend(q, k, v, at_end, kpos, scale=0.25)
    assert calls == [8]
    ref = naive_attention(q, k, v, at_end, kpos, scale=0.25, causal=True, window=4)
    _close(tower.attend(q, k, v, at_end, kpos, scale=0.25, window=4), ref)  # a window: the blocked kernel
    ref = naive_attention(q, k, v, at_end, kpos, scale=0.25, causal=False)
    _close(tower.attend(q, k, v, at_end, kpos, scale=0.25, causal=False), ref)  # not causal (vision)
    ring = np.arange(4, 24)  # a ring cache's held keys do not start at 0
    ref = naive_attention(q, k, v, np.arange(16, 24), ring, scale=0.25, causal=True)
    _close(tower.attend(q, k, v, np.arange(16, 24), ring, scale=0.25), ref)
    assert calls == [8]
    TowerOptions(attention="naive", causal_chunk=spy).attend(q, k, v, at_end, kpos, scale=0.25)
    TowerOptions(q_block=4, causal_chunk=spy).attend(q, k, v, at_end, kpos, scale=0.25)
    assert calls == [8]  # the naive reference stays the reference; asked-for tiles get the blocked kernel


@pytest.mark.parametrize("window", [1, 5, 32, 100, 256, 1000])
@pytest.mark.parametrize("prefix,t", [(0, 600), (300, 257), (40, 1)])
def test_sliding_window(window, prefix, t):
    rng = np.random.default_rng(window + prefix + t)
    hkv, group, d = 2, 2, 16
    q, k, v = _qkv(rng, hkv, group, t, prefix + t, d)
    qpos, kpos = np.arange(prefix, prefix + t), np.arange(prefix + t)
    ref = naive_attention(q, k, v, qpos, kpos, scale=d ** -0.5, causal=True, window=window)
    _close(flash_attention(q, k, v, qpos, kpos, scale=d ** -0.5, causal=True, window=window), ref)


@pytest.mark.parametrize("q_block,kv_block", [(1, 1), (7, 16), (32, 256), (64, 33), (1024, 1024)])
def test_block_sizes(q_block, kv_block):
    rng = np.random.default_rng(q_block * 31 + kv_block + 1)
    hkv, group, t, d = 3, 2, 129, 8
    q, k, v = _qkv(rng, hkv, group, t, t, d)
    pos = np.arange(t)
    for causal, window in ((True, 0), (False, 0), (True, 20)):
        ref = naive_attention(q, k, v, pos, pos, scale=0.3, causal=causal, window=window)
        out = flash_attention(q, k, v, pos, pos, scale=0.3, causal=causal, window=window,
                              q_block=q_block, kv_block=kv_block)
        _close(out, ref)


def test_large_scores_do_not_overflow():
    """Online softmax must subtract the running max: scores of ~1e3 stay finite."""
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 1, 1, 300, 300, 16)
    q *= 40
    pos = np.arange(300)
    for causal in (True, False):
        out = flash_attention(q, k, v, pos, pos, scale=1.0, causal=causal)
        assert np.all(np.isfinite(out))
        _close(out, naive_attention(q, k, v, pos, pos, scale=1.0, causal=causal), 1e-4)


@pytest.mark.parametrize("group", [1, 2, 7])
@pytest.mark.parametrize("n", [1, 2, 255, 257])
def test_decode_attention_equals_naive_last_row(group, n):
    rng = np.random.default_rng(group * 1000 + n)
    hkv, d = 2, 16
    q, k, v = _qkv(rng, hkv, group, 1, n, d)
    ref = naive_attention(q, k, v, [n - 1], np.arange(n), scale=d ** -0.5, causal=True)
    _close(decode_attention(q[:, 0], k, v, scale=d ** -0.5)[:, None], ref)


def _run_chunks(cache: KVCache, chunks, q, k, v, window: int, flash: bool = True) -> np.ndarray:
    """Feed the sequence through the cache's attention chunk by chunk; return [Hq, L, D]."""
    out, pos = [], 0
    tower = TowerOptions(attention="flash" if flash else "naive")
    for n in chunks:
        out.append(cache.attend_chunk(0, pos, q[:, pos:pos + n], k[:, pos:pos + n], v[:, pos:pos + n],
                                      scale=q.shape[-1] ** -0.5, window=window, tower=tower))
        pos += n
    return np.concatenate(out, axis=1)


CHUNKS = [
    [1] * 40,  # pure decode
    [37, 1, 1, 100, 5, 64, 1, 1, 300, 1, 90],  # prefill, decode, big chunk after the window wrapped
    [600],  # one prefill longer than the window
    [20, 250, 3, 1, 200, 126],
]


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("window", [16, 64, 257])
@pytest.mark.parametrize("flash", [True, False])
def test_ring_cache_equals_full_window_mask(chunks, window, flash):
    """A ring KV cache of `window` slots, fed in chunks, equals naive attention over the whole
    sequence with the sliding-window mask (the wrap-around path of KVCache.attend_chunk)."""
    rng = np.random.default_rng(len(chunks) * 1000 + window)
    hkv, group, d = 2, 2, 16
    total = sum(chunks)
    q, k, v = _qkv(rng, hkv, group, total, total, d)
    pos = np.arange(total)
    ref = naive_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=True, window=window)
    cache = KVCache(n_layer=1, n_kv=hkv, head_dim=d, max_seq=window, ring=True)
    _close(_run_chunks(cache, chunks, q, k, v, window, flash), ref)
    assert cache.pool.used[cache.slot] <= window  # never holds more than the window


@pytest.mark.parametrize("chunks", CHUNKS)
def test_growing_cache_equals_full_causal(chunks):
    rng = np.random.default_rng(len(chunks))
    hkv, group, d = 1, 7, 8
    total = sum(chunks)
    q, k, v = _qkv(rng, hkv, group, total, total, d)
    pos = np.arange(total)
    ref = naive_attention(q, k, v, pos, pos, scale=d ** -0.5, causal=True)
    cache = KVCache(n_layer=1, n_kv=hkv, head_dim=d, max_seq=4096, ring=False)
    _close(_run_chunks(cache, chunks, q, k, v, 0), ref)


def test_kv_cache_growth_keeps_contents():
    rng = np.random.default_rng(3)
    hkv, d, max_seq = 2, 4, 1000
    cache = KVCache(n_layer=2, n_kv=hkv, head_dim=d, max_seq=max_seq, ring=False)
    assert keys(cache)[0].shape[1] == 256  # starts small
    k = rng.standard_normal((hkv, max_seq, d), dtype=np.float32)
    v = rng.standard_normal((hkv, max_seq, d), dtype=np.float32)
    caps, pos = [], 0
    for n in (100, 156, 1, 300, 43, 400):  # crosses 256 and 512, ends exactly at max_seq
        cache.write(1, pos, k[:, pos:pos + n], v[:, pos:pos + n])
        pos += n
        caps.append(keys(cache)[1].shape[1])
        kk, vv, p = cache.read(1, pos)
        np.testing.assert_array_equal(kk, k[:, :pos])
        np.testing.assert_array_equal(vv, v[:, :pos])
        np.testing.assert_array_equal(p, np.arange(pos))
    assert caps == sorted(caps) and caps[-1] == 1024  # grows in whole KV blocks, never past max_seq's
    assert keys(cache)[0].shape[1] == 256  # layers grow independently
    with pytest.raises(ValueError, match="does not fit a context"):
        cache.write(1, pos, k[:, :1], v[:, :1])


def test_ring_cache_slots_and_read_order():
    hkv, d, w = 1, 2, 8
    cache = KVCache(n_layer=1, n_kv=hkv, head_dim=d, max_seq=w, ring=True)
    vals = np.arange(20, dtype=np.float32)
    for p in range(20):
        x = np.full((hkv, 1, d), vals[p], np.float32)
        cache.write(0, p, x, x)
        kk, _, pos = cache.read(0, p + 1)
        np.testing.assert_array_equal(pos, np.arange(max(0, p + 1 - w), p + 1))
        np.testing.assert_array_equal(kk[0, :, 0], vals[pos])  # ascending positions
        slot_keys, _ = held(cache, 0, p + 1)
        assert sorted(slot_keys[0, :, 0].tolist()) == vals[pos].tolist()
    # a chunk longer than the window keeps only its last `w` positions
    big = np.arange(100, 130, dtype=np.float32)[None, :, None].repeat(d, axis=2)
    cache.write(0, 20, big, big)
    kk, _, pos = cache.read(0, 50)
    np.testing.assert_array_equal(pos, np.arange(42, 50))
    np.testing.assert_array_equal(kk[0, :, 0], big[0, -w:, 0])


@pytest.mark.parametrize("group", [1, 2, 7])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_padded_decode_attention_rows_equal_naive_and_each_alone(group, kv_dtype):
    """Each row of the padded decode attention equals naive attention over its own keys, and is
    bit for bit the row it gets alone (n = 1, its own length), whatever its neighbours hold."""
    rng = np.random.default_rng(group)
    n, hkv, d, cap = 6, 2, 16, 768
    lengths = np.array([1, 255, 256, 257, 700, 0])
    q = rng.standard_normal((n, hkv * group, d), dtype=np.float32)
    k = rng.standard_normal((n, hkv, cap, d), dtype=np.float32).astype(kv_dtype)
    v = rng.standard_normal((n, hkv, cap, d), dtype=np.float32).astype(kv_dtype)
    out = padded_decode_attention(q, k, v, lengths, scale=d ** -0.5)
    for i, L in enumerate(lengths):
        if not L:
            assert not out[i].any()  # a row that takes no part gets zeros, not NaN
            continue
        kk, vv = k[i, :, :L].astype(np.float32), v[i, :, :L].astype(np.float32)
        ref = naive_attention(q[i][:, None], kk, vv, [L - 1], np.arange(L), scale=d ** -0.5)[:, 0]
        _close(out[i], ref)
        alone = padded_decode_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], [L], scale=d ** -0.5)
        assert np.array_equal(alone[0], out[i])
