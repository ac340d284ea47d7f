"""Lines to train and evaluate on: a text, a face and a rendered crop, drawn from one generator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fonts import families
from .render import line_sample
from .texts import SUP, sample_text
from .typeset import TypesetLines

_TYPESET = TypesetLines()  # one per process: a page's pieces are handed out one by one


@dataclass
class Line:
    image: np.ndarray  # uint8 [H, W], W a multiple of 14
    text: str
    face: str


def draw_line(rng: np.random.Generator, split: str, line_height: int, max_width: int, face_split: str | None = None,
              shuffle: float = 0.0, max_chars: int = 100, kind: str | None = None, typeset: bool = False,
              stretch: float = 1.0) -> Line:
    """A line of `split` text (at most max_chars; of one `kind` of texts.sample_text if given) in a
    face of `face_split` (default: the same split); with probability `shuffle` its words in random
    order, which no language model can guess. With `typeset` instead a piece of a page groff
    typeset, cut as the pipeline cuts pages (typeset.py: max_width is then the reader's line_width,
    `stretch` its line_stretch), when groff is installed and gives one short enough (else a drawn
    line). The share of typeset pieces is the caller's (data.LineStream)."""
    if typeset and kind is None:
        got = _TYPESET.draw(rng, split, line_height, max_width, stretch)
        if got is not None and len(got[1]) <= max_chars + max_chars // 4:
            return Line(got[0], got[1], "groff")
    fams = families(face_split or split)
    while True:
        fam = fams[rng.integers(len(fams))]
        face = fam[rng.integers(len(fam))]
        text = sample_text(rng, split, max_chars, kind)
        if shuffle and rng.random() < shuffle:
            words = text.split(" ")
            rng.shuffle(words)
            text = " ".join(words)
        img = line_sample(text, face, rng, line_height, max_width, neighbour=sample_text(rng, split))
        if img is not None:
            return Line(img, text.replace(SUP, ""), face.name)  # a footnote mark's text is its digits


def fixed_set(n: int, split: str, seed: int, line_height: int, max_width: int, face_split: str | None = None,
              max_chars: int = 100, kind: str | None = None) -> list[Line]:
    """The same n lines on every machine: an evaluation set."""
    return [draw_line(np.random.default_rng([seed, i]), split, line_height, max_width, face_split, max_chars=max_chars,
                      kind=kind) for i in range(n)]


