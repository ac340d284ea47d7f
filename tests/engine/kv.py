"""Test views of a KV cache (the library keeps none: only tests read a sequence's keys)."""

from __future__ import annotations

import numpy as np


def keys(cache) -> list[np.ndarray]:
    """Per layer the sequence's keys [Hkv, cap, D] (views into its pool slot)."""
    return [buf[cache.slot] for buf in cache.pool.k]


def held(cache, layer: int, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """All held keys/values in slot order (a ring's wrap included)."""
    n = min(n_pos, cache.max_seq)
    return cache.pool.k[layer][cache.slot][:, :n], cache.pool.v[layer][cache.slot][:, :n]


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float) -> np.ndarray:
    """Reference for one sequence: one query per head against every cached key:
    q [Hq, D], k/v [Hkv, L, D] -> [Hq, D]."""
    hq, d = q.shape
    hkv = k.shape[0]
    qg = q.reshape(hkv, hq // hkv, d) * np.float32(scale)  # [Hkv, g, D]
    s = qg @ k.transpose(0, 2, 1)  # [Hkv, g, L]
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).reshape(hq, d)
