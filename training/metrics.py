"""Character and word error rates: edit distance over the reference length, summed over a set."""

from __future__ import annotations

import re
from typing import Sequence


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (insertions, deletions, substitutions cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def normalise(text: str) -> str:
    """Whitespace runs (line breaks included) become one space: layout is not scored, text is."""
    return re.sub(r"\s+", " ", text).strip()


def error_rates(pairs: list[tuple[str, str]]) -> dict[str, float]:
    """{cer, wer, chars, words} over (reference, hypothesis) pairs, both normalised first."""
    ce = cn = we = wn = 0
    for ref, hyp in pairs:
        ref, hyp = normalise(ref), normalise(hyp)
        ce += edit_distance(ref, hyp)
        cn += len(ref)
        we += edit_distance(ref.split(), hyp.split())
        wn += len(ref.split())
    return {"cer": ce / max(cn, 1), "wer": we / max(wn, 1), "chars": cn, "words": wn}
