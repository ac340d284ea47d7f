"""The numpy GGUF inference engine. Importing it loads nothing; `load_model` does."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np

from .weights import STORAGE_MODES, Storage


class TextModel:
    """A decoder GGUF ready to run: `.config`, `.tokenizer`, `.logits(ids)`, `.generate(ids, ...)`."""

    def __init__(self, path: str | Path, weights: Storage = "quantized"):
        from .config import decoder_config
        from .gguf import open_gguf
        from .models import decoder_class

        self.path = Path(path)
        self.gguf = open_gguf(self.path)
        self.config = decoder_config(self.gguf)
        self.decoder = decoder_class(self.config.arch)(self.gguf, self.config, weights)

    @cached_property
    def tokenizer(self):
        from .tokenizer import load_tokenizer

        return load_tokenizer(self.gguf)

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), n_vocab] for a fresh sequence."""
        state = self.decoder.new_state(max_seq=len(ids))
        return self.decoder.forward(state, list(ids), all_logits=True)

    def stream(self, ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, stop: bool = True) -> Iterator[int]:
        from .generate import generate_tokens
        from .sampling import Sampler, SamplingParams

        sampler = Sampler(SamplingParams(temperature, top_p, seed))
        stop_ids = self.tokenizer.eos_ids if stop else ()
        return generate_tokens(self.decoder, list(ids), max_new_tokens, sampler, stop_ids)

    def generate(self, ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, stop: bool = True) -> list[int]:
        """New token ids (greedy by default), ending at an end-of-generation token if stop."""
        return list(self.stream(ids, max_new_tokens, temperature, top_p, seed, stop))


def load_model(path: str | Path, weights: Storage = "quantized") -> TextModel:
    if weights not in STORAGE_MODES:
        raise ValueError(f"weights must be one of {STORAGE_MODES}, not {weights!r}")
    return TextModel(path, weights)


def load_vlm(model_path: str | Path, mmproj_path: str | Path, weights: Storage = "quantized"):
    from .models.lightonocr import LightOnOCR

    return LightOnOCR(model_path, mmproj_path, weights)
