"""One sequence: prefill the prompt, then decode token by token with the KV cache."""

from __future__ import annotations

from typing import Iterable, Iterator

from .sampling import Sampler


def generate_tokens(decoder, prompt: list[int], max_new_tokens: int, sampler: Sampler,
                    stop_ids: Iterable[int] = (), embd_rows=None, state=None) -> Iterator[int]:
    """Yield new token ids; stops after a stop id (yielded) or max_new_tokens."""
    if not prompt:
        raise ValueError("the prompt is empty")
    stop = frozenset(stop_ids)
    state = state if state is not None else decoder.new_state(max_seq=len(prompt) + max_new_tokens)
    logits = decoder.forward(state, prompt, embd_rows=embd_rows)  # [1, n_vocab]
    for _ in range(max_new_tokens):
        tok = sampler(logits[-1])
        yield tok
        if tok in stop:
            return
        logits = decoder.forward(state, [tok])
