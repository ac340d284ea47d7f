"""A decoder GGUF ready to run on its own: `generate` and `inspect` use it, and LightOnOCR holds
one for its text half.

    model = TextModel(path, weights="quantized")
    model.generate(ids, max_new_tokens)         # new ids, greedy by default
    for tok in model.stream(ids, 64, temperature=0.7, seed=1): ...
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .attention import TowerOptions
from .format.config import decoder_config
from .format.gguf import open_gguf
from .models import decoder_class
from .sampling import Sampler, SamplingOptions
from .format.weights import Storage


class TextModel:
    """`.config`, `.decoder`, `.tokenizer`, `.logits(ids)`, `.stream(ids, ...)`, `.generate(ids, ...)`."""

    def __init__(self, path: str | Path, weights: Storage = "quantized", tower: TowerOptions = TowerOptions()):
        self.path = Path(path)
        self.gguf = open_gguf(self.path)
        self.config = decoder_config(self.gguf)
        self.decoder = decoder_class(self.config.arch)(self.gguf, self.config, weights, tower)

    @cached_property
    def tokenizer(self):
        from .text.tokenizer import load_tokenizer

        return load_tokenizer(self.gguf)

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), n_vocab] for a fresh sequence."""
        state = self.decoder.new_state(max_seq=len(ids))
        return self.decoder.forward(state, list(ids), all_logits=True)

    def stream(self, ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, stop: bool = True) -> Iterator[int]:
        """New token ids as they come; an end-of-generation id (if stop) is yielded, then it ends."""
        sampling = SamplingOptions(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        return generate_tokens(self.decoder, list(ids), sampling, self.tokenizer.eos_ids if stop else ())

    def generate(self, ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, stop: bool = True) -> list[int]:
        """New token ids (greedy by default), ending at an end-of-generation token if stop."""
        return list(self.stream(ids, max_new_tokens, temperature, top_p, seed, stop))


def generate_tokens(decoder, prompt: list[int], sampling: SamplingOptions, stop_ids: Iterable[int] = ()) -> Iterator[int]:
    """One sequence: prefill the prompt, then decode token by token with the KV cache. Yields new
    ids; stops after a stop id (yielded) or sampling.max_tokens."""
    if not prompt:
        raise ValueError("the prompt is empty")
    sampler, stop = Sampler(sampling), frozenset(stop_ids)
    state = decoder.new_state(max_seq=len(prompt) + sampling.max_tokens)
    logits = decoder.forward(state, prompt)  # [1, n_vocab]
    for _ in range(sampling.max_tokens):
        tok = sampler(logits[-1])
        yield tok
        if tok in stop:
            return
        logits = decoder.forward(state, [tok])
