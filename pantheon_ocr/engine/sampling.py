"""Token choice: greedy, or temperature + top-p with a seeded generator; and the repetition guard.

`SamplingOptions` is the one sampling type of the project: the pipeline, archive jobs (which
retry a page hotter) and the engine all pass it, and it is validated once, when it is made."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int = 4096  # a dense page of LightOnOCR output is ~1-2k tokens
    temperature: float = 0.0  # 0 = greedy: OCR wants the most likely reading, reproducibly
    top_p: float = 1.0
    seed: int | None = 0  # None: a fresh random seed

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be at least 1 (got {self.max_tokens})")
        if not 0 <= self.temperature < float("inf"):  # also refuses nan: sampling at inf/nan is noise
            raise UsageError(f"temperature must be a finite number >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1] (got {self.top_p})")


class Sampler:
    def __init__(self, params: SamplingOptions = SamplingOptions()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """One token id from logits [n_vocab]."""
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / p.temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            keep = np.cumsum(probs[order]) - probs[order] < p.top_p  # always keeps the top token
            idx = order[keep]
            return int(idx[self.rng.choice(idx.size, p=probs[idx] / probs[idx].sum())])
        return int(self.rng.choice(probs.size, p=probs))


# Characters of dot leaders ("Chapter 1 ........ 7") and table rules ("|---|---|"): long runs
# of these are legitimate layout, not a loop.
LAYOUT_CHARS = frozenset(".-_=|:·…*~+ \u2014\u2013")


class RepetitionGuard:
    """Detects a page stuck in a loop: the last tokens repeat one n-gram (n <= max_ngram) over
    at least `min_span` tokens. A unit made only of layout characters is spared."""

    def __init__(self, decode, min_span: int = 64, max_ngram: int = 32, min_repeats: int = 4):
        self.decode, self.min_span, self.max_ngram, self.min_repeats = decode, min_span, max_ngram, min_repeats

    def looping(self, tokens: list[int]) -> bool:
        if len(tokens) < self.min_span:
            return False
        arr = np.asarray(tokens[-(self.min_span + self.max_ngram * self.min_repeats * 2):])
        for n in range(1, self.max_ngram + 1):
            span = max(self.min_span, n * self.min_repeats) - n  # the tail is (span + n) long
            if span + n > arr.size:
                break
            if np.array_equal(arr[-span:], arr[-span - n : -n]):
                unit = self.decode([int(t) for t in arr[-n:]])
                return not (unit.strip() and set(unit) <= LAYOUT_CHARS)
        return False
