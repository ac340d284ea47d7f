"""How much a text's letters follow one another as a written language's do.

A PDF font without a true character map can give a text layer of well-formed words in the wrong
letters ("Wkh txduwhuo|" for "The quarterly": a constant offset or a subset's own order). Such
text passes every test of glyphs, words and symbols, but its letter pairs are ones no language
uses. The score is the mean log-probability of each letter given the one before (word edges
included), under a table of letter pairs counted in prose of nine European languages and in code
(`training/letter_pairs.py` builds `letter_pairs.txt` from `training/corpus/`, each corpus
weighing the same). Letters are case-folded and stripped of accents; words with letters of other
scripts are passed over.

Measured (per page, mean log-probability): real text -2.28 to -3.14 (the dev set's text layers,
the held-out corpus pages of nine languages and code, and Finnish, Hungarian, Turkish,
Vietnamese, Indonesian, Swahili, Swedish and Latin paragraphs: -2.62 to -2.97; Welsh -3.21 to
-3.28, a bibliography of Polish and Chinese names -3.13 to -3.26); the same pages with letters
shifted by 1, 3 or 13 places, by a glyph-order offset, or under a random substitution: -3.31 to
-5.43, medians -3.86 to -4.61, 4 of 5,150 above -3.5. Text that is no language scores low too:
an abbreviation table -3.46, URL lists and part numbers -3.8, base64 -4.3; `prefer` reads such a
page by OCR, which costs time but loses nothing.
"""

from __future__ import annotations

import math
import unicodedata
from functools import lru_cache
from pathlib import Path

ALPHABET = " abcdefghijklmnopqrstuvwxyz"  # " " is a word's edge
TABLE = Path(__file__).with_name("letter_pairs.txt")
MIN_PAIRS = 150  # fewer pairs than this (a short page, another script): no judgement
GIBBERISH = -3.5  # below this mean log-probability the letters are in no language's order
MOST_CHARS = 200_000  # a page's text judged on its first characters (a 10 MB layer took seconds)
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


@lru_cache(maxsize=1)
def _log_probs() -> list[list[float]]:
    rows = [line.split() for line in TABLE.read_text(encoding="ascii").splitlines()
            if line.strip() and not line.startswith("#")]
    if len(rows) != len(ALPHABET) or any(len(r) != len(ALPHABET) for r in rows):
        raise ValueError(f"{TABLE}: expected {len(ALPHABET)} rows of {len(ALPHABET)} numbers")
    return [[int(v) / 100 for v in r] for r in rows]


def fold(text: str) -> list[str]:
    """The words of `text` in the letters a-z (case-folded, so ß is ss; accents dropped); words
    holding a letter of another script are left out, and anything between letters that is not one
    splits a word."""
    words, word, foreign = [], [], False
    for c in unicodedata.normalize("NFKD", text.casefold()):
        if "a" <= c <= "z":
            word.append(c)
        elif unicodedata.combining(c):
            continue
        elif c.isalpha():
            foreign = True
        else:
            if word and not foreign:
                words.append("".join(word))
            word, foreign = [], False
    if word and not foreign:
        words.append("".join(word))
    return words


def letter_pairs(text: str):
    """(row, column) in ALPHABET of each letter after the one before in `text`'s words, a word's
    edges (0) included: what the table counts and what a text is scored by."""
    for word in fold(text):
        prev = 0
        for c in word:
            i = _INDEX[c]
            yield prev, i
            prev = i
        yield prev, 0


def letter_pair_score(text: str) -> tuple[float, int]:
    """(mean log-probability of each letter after the one before, number of pairs): the mean is
    nan when there are no pairs."""
    table = _log_probs()
    total, n = 0.0, 0
    for a, b in letter_pairs(text):
        total += table[a][b]
        n += 1
    return (total / n if n else math.nan), n


def gibberish(text: str) -> float | None:
    """The score of `text` when it is long enough to judge and its letters follow no language's
    order; else None."""
    score, n = letter_pair_score(text[:MOST_CHARS])
    return score if n >= MIN_PAIRS and score < GIBBERISH else None
