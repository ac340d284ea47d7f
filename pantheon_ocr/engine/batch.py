"""B independent sequences advanced together by one token each.

`forward_batch` runs the decoder's own layer loop over B rows, one per sequence, so every
projection is one M=B matmul (each weight read once per step for all B sequences), and attention
one padded computation over the sequences' KV pool slots (cache.decode_attend).

Bit-identical to one sequence at a time: a decode step's matmuls are exact-rows (weights.py,
blocks of ROW_BLOCK rows, each block the same GEMM shape) and its attention is computed per
fixed-size KV block (attention.padded_decode_attention), so row b's logits are exactly the ones
`decoder.forward(states[b], [tokens[b]])` gives, whatever B and whoever else is in the batch.
"""

from __future__ import annotations

import numpy as np

from ..errors import ContextFull
from .cache import DecoderState, Rows
from .models.llama import Decoder


class BatchUnsupported(Exception):
    """This decoder path cannot be batched; nothing was changed, decode per sequence instead."""


def forward_batch(decoder: Decoder, states: list[DecoderState], tokens: list[int]) -> np.ndarray:
    """Advance states[b] by tokens[b] (one token each); logits [B, n_vocab]."""
    if decoder.cfg.n_expert:
        # Routing differs per row; batching it needs gathers per expert we have not written.
        raise BatchUnsupported("mixture-of-experts layers are decoded one sequence at a time")
    if len(states) != len(tokens) or not states:
        raise ValueError(f"{len(states)} states but {len(tokens)} tokens")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("the same sequence appears twice in one batch")
    for s in states:  # checked before any cache is written: a refused batch changes nothing
        if not s.cache.ring and s.pos + 1 > s.cache.max_seq:
            raise ContextFull(s.pos + 1, s.cache.max_seq)
    x = decoder.embed(tokens)  # [B, n_embd]
    x = decoder.run(Rows(states, [1] * len(states)), x, tokens)
    return decoder.logits_of(x, exact=True)


def batch_logits(decoder: Decoder, states: list[DecoderState], tokens: list[int]) -> np.ndarray:
    """forward_batch, or one forward per sequence where the decoder path cannot be batched."""
    try:
        return forward_batch(decoder, states, tokens)
    except BatchUnsupported:
        return np.concatenate([decoder.forward(s, [t]) for s, t in zip(states, tokens)])
