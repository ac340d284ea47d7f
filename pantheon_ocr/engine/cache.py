"""Sequence state: each sequence's KV cache and position, and the one place both move on.

A forward pass runs rows of activations through the layers. `Rows` says which sequence each row
belongs to and at which position: one sequence with T new tokens (a prompt, or one decode step)
is one segment of T rows; `forward_batch` is B segments of one row each. Every layer hands its
roped q/k/v to `rows.attend(layer, q, k, v)`, which writes k/v into the sequences' caches and
returns their attention; after the last layer `rows.advance(tokens)` moves the positions on.
Nothing else writes a cache or a position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .attention import cached_attention


class KVCache:
    """Per-layer K/V for one sequence, [Hkv, slots, D]. Grows on demand up to `max_seq`.

    With `ring` (sliding window), max_seq = the window: position p lives in slot p % max_seq and
    a query at p reads min(p + 1, max_seq) slots.
    """

    def __init__(self, n_layer: int, n_kv: int, head_dim: int, max_seq: int, ring: bool):
        self.n_kv, self.head_dim, self.max_seq, self.ring = n_kv, head_dim, max_seq, ring
        cap = min(max_seq, 256)
        self.k = [np.zeros((n_kv, cap, head_dim), np.float32) for _ in range(n_layer)]
        self.v = [np.zeros((n_kv, cap, head_dim), np.float32) for _ in range(n_layer)]

    def _reserve(self, layer: int, n: int) -> None:
        cap = self.k[layer].shape[1]
        if n <= cap:
            return
        new = min(self.max_seq, max(n, 2 * cap))
        for buf in (self.k, self.v):
            grown = np.zeros((self.n_kv, new, self.head_dim), np.float32)
            grown[:, :cap] = buf[layer]
            buf[layer] = grown

    def write(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k/v [Hkv, T, D] for positions pos0 .. pos0+T-1 (ring: only the last max_seq)."""
        t = k.shape[1]
        if not self.ring and pos0 + t > self.max_seq:
            raise ValueError(f"sequence of {pos0 + t} tokens exceeds the context of {self.max_seq}")
        if self.ring:
            keep = min(t, self.max_seq)
            self._reserve(layer, min(pos0 + t, self.max_seq))
            slots = np.arange(pos0 + t - keep, pos0 + t) % self.max_seq
            self.k[layer][:, slots] = k[:, t - keep :]
            self.v[layer][:, slots] = v[:, t - keep :]
        else:
            self._reserve(layer, pos0 + t)
            self.k[layer][:, pos0 : pos0 + t] = k
            self.v[layer][:, pos0 : pos0 + t] = v

    def read(self, layer: int, n_pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys/values of the positions before n_pos that are still held, with their positions,
        in ascending position order: (k [Hkv, L, D], v, positions [L])."""
        if self.ring and n_pos > self.max_seq:
            first = n_pos - self.max_seq
            pos = np.arange(first, n_pos)
            slots = pos % self.max_seq
            return self.k[layer][:, slots], self.v[layer][:, slots], pos
        return self.k[layer][:, :n_pos], self.v[layer][:, :n_pos], np.arange(n_pos)

    def slots(self, layer: int, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """All held keys/values in slot order (decode: order does not matter to softmax)."""
        n = min(n_pos, self.max_seq)
        return self.k[layer][:, :n], self.v[layer][:, :n]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)


@dataclass
class DecoderState:
    """One sequence: its KV cache, the positions already processed and their tokens."""

    cache: KVCache
    pos: int = 0
    tokens: list[int] = field(default_factory=list)


class Rows:
    """The rows of one forward pass, grouped by sequence: rows bounds[b]:bounds[b+1] are the next
    lengths[b] tokens of states[b], at positions states[b].pos onwards."""

    def __init__(self, states: Sequence[DecoderState], lengths: Sequence[int]):
        self.states = list(states)
        self.bounds = np.cumsum([0, *lengths])  # [B + 1] row offsets
        self.positions = np.concatenate([np.arange(s.pos, s.pos + n) for s, n in zip(self.states, lengths)])  # [N]

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, window: int = 0,
               flash: bool = True) -> np.ndarray:
        """q [N, Hq, D], k/v [N, Hkv, D] (roped) -> attention [N, Hq, D]: each sequence's rows
        against its cache plus themselves (causal). Stores their k/v in the caches."""
        out = np.empty_like(q)
        for s, r0, r1 in zip(self.states, self.bounds[:-1], self.bounds[1:]):
            a = cached_attention(s.cache, layer, s.pos, q[r0:r1].transpose(1, 0, 2), k[r0:r1].transpose(1, 0, 2),
                                 v[r0:r1].transpose(1, 0, 2), scale=scale, window=window, flash=flash)  # [Hq, T, D]
            out[r0:r1] = a.transpose(1, 0, 2)
        return out

    def advance(self, tokens: Sequence[int]) -> None:
        """After the last layer: each sequence has its new tokens' k/v cached, so it moves on."""
        for s, r0, r1 in zip(self.states, self.bounds[:-1], self.bounds[1:]):
            s.pos += int(r1 - r0)
            s.tokens.extend(tokens[r0:r1])
