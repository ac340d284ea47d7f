"""B independent sequences advanced together, and the continuous-batching scheduler.

`forward_batch` runs every projection as one M=B matmul, so each weight is read once per step
for all B sequences; only attention is per sequence (each has its own cache and position).
"""

from __future__ import annotations

import numpy as np

from .attention import decode_attention
from .models.llama import Decoder, DecoderState


class BatchUnsupported(Exception):
    """This decoder path cannot be batched; nothing was changed, decode per sequence instead."""


def forward_batch(decoder: Decoder, states: list[DecoderState], tokens: list[int],
                  embd_rows: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Advance states[b] by tokens[b] (one token each); logits [B, n_vocab].

    embd_rows: optional {b: row [n_embd]} replacing the token embedding of sequence b.
    """
    c = decoder.cfg
    if c.n_expert:
        # Routing differs per row; batching it needs gathers per expert we have not written.
        raise BatchUnsupported("mixture-of-experts layers are decoded one sequence at a time")
    if len(states) != len(tokens) or not states:
        raise ValueError(f"{len(states)} states but {len(tokens)} tokens")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("the same sequence appears twice in one batch")
    for s in states:
        if not s.cache.ring and s.pos + 1 > s.cache.max_seq:
            raise ValueError(f"a sequence is full ({s.cache.max_seq} positions)")
    x = decoder.embed(tokens)  # [B, n_embd]
    for b, row in (embd_rows or {}).items():
        x[b] = row
    positions = np.array([s.pos for s in states])
    scale = c.head_dim ** -0.5

    def attend(i: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        out = np.empty_like(q)  # [B, Hq, D]
        for b, s in enumerate(states):
            s.cache.write(i, s.pos, k[b][:, None], v[b][:, None])  # [Hkv, 1, D]
            kk, vv = s.cache.slots(i, s.pos + 1)
            out[b] = decode_attention(q[b], kk, vv, scale=scale)
        return out

    x = decoder.run_layers(x, positions, attend)
    for s, t in zip(states, tokens):
        s.pos += 1
        s.tokens.append(t)
    return decoder.logits_of(x)


def batch_logits(decoder: Decoder, states: list[DecoderState], tokens: list[int]) -> np.ndarray:
    """forward_batch, or one forward per sequence where the decoder path cannot be batched."""
    try:
        return forward_batch(decoder, states, tokens)
    except BatchUnsupported:
        return np.concatenate([decoder.forward(s, [t]) for s, t in zip(states, tokens)])
