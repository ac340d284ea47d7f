"""Token choice: greedy, or temperature + top-p with a seeded generator; and the repetition guard.

`SamplingOptions` (declared in the options table, options.py) is the one sampling type of the
project: the pipeline, archive jobs (which retry a page hotter) and the engine all pass it."""

from __future__ import annotations

import numpy as np

from ..options import SamplingOptions

__all__ = ["LAYOUT_CHARS", "RepetitionGuard", "Sampler", "SamplingOptions"]


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
