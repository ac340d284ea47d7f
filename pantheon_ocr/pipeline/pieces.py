"""A line too wide for a reader of lines, cut into pieces it reads one at a time, and the
pieces' texts joined again. A cut falls on blank columns (a word gap, else a gap between two
letters), and each piece is cropped, padded and scaled as the reader's training crops were
(training/typeset.py cuts its lines with the same line_pieces).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .ink import gaps, otsu


WORD_GAP = 0.25  # a blank run of columns at least this share of a line's height is a word space


def line_pieces(grey: np.ndarray, box: tuple[int, int, int, int], height: int, patch: int, max_width: int,
                stretch: float = 1.0) -> list[tuple[tuple[int, int, int, int], Image.Image]]:
    """(box, image) for each piece of a region: the crop, padded like the reader's training crops,
    scaled to `height` and its width then by `stretch` (the reader's line_stretch), with the page
    box it was cut from (training/typeset.py gives each piece the text of the characters inside
    its box; piece_joins tells how their texts join).

    A line too wide is cut at its widest word gap in its middle half, else at the word gap
    nearest its middle, else (a URL, a path, a long identifier: no word gap at all) between two
    letters, not through one (only a line without a blank column is cut at its middle): a cut
    through a letter, each side padded into the other, gave both pieces a part of it
    ("debian-priv vate@"). A piece's padding at a cut is paper, not the neighbour's ink."""
    boxes = _split(grey, box, height, patch, max_width, stretch)
    return [(b, _crop(grey, b, height, patch, max_width, stretch, cut=(i > 0, i < len(boxes) - 1)))
            for i, b in enumerate(boxes)]


def piece_joins(boxes: list[tuple[int, int, int, int]]) -> list[str]:
    """What goes between the texts of a line's consecutive pieces: a space where they were cut
    at a word gap, nothing where they were cut between two letters."""
    return [" " if b[0] - a[2] >= max(2, WORD_GAP * (a[3] - a[1])) else "" for a, b in zip(boxes, boxes[1:])]


def join_pieces(texts: list[str], joins: list[str]) -> str:
    """A line's pieces' texts, each followed by what joins it to the next (piece_joins)."""
    return "".join(t + j for t, j in zip(texts, joins)) + texts[-1] if texts else ""


def _pads(box: tuple[int, int, int, int]) -> tuple[int, int]:
    h = box[3] - box[1]
    return max(1, round(0.15 * h)), max(2, round(0.3 * h))  # (y, x): as the training crops are padded


def _scaled_width(grey: np.ndarray, box, height: int, patch: int, stretch: float) -> tuple[np.ndarray, int]:
    """The padded crop of `box` and its width once scaled to `height` and by `stretch`, in whole patches."""
    x0, y0, x1, y1 = box
    pad_y, pad_x = _pads(box)
    H, W = grey.shape
    crop = grey[max(0, y0 - pad_y): min(H, y1 + pad_y), max(0, x0 - pad_x): min(W, x1 + pad_x)]
    scale = height / crop.shape[0]
    return crop, -(-max(2 * patch, round(crop.shape[1] * scale * stretch)) // patch) * patch


def _split(grey: np.ndarray, box, height: int, patch: int, max_width: int, stretch: float) -> list[tuple[int, int, int, int]]:
    x0, y0, x1, y1 = box
    h = y1 - y0
    if _scaled_width(grey, box, height, patch, stretch)[1] <= max_width or x1 - x0 <= 2 * h:
        return [box]
    cols = (grey[y0:y1, x0:x1] < otsu(grey[y0:y1, x0:x1])).any(axis=0)
    gs, ge = _cut(cols, h)
    return (_split(grey, (x0, y0, x0 + gs, y1), height, patch, max_width, stretch)
            + _split(grey, (x0 + ge, y0, x1, y1), height, patch, max_width, stretch))


def _cut(cols: np.ndarray, h: int) -> tuple[int, int]:
    """Where to cut a line whose ink columns are `cols`: (start, end) of a blank run (see line_pieces)."""
    n = cols.size

    def off(g):
        return abs((g[0] + g[1]) / 2 - n / 2)

    words = gaps(cols, max(2, WORD_GAP * h))
    middle = [g for g in words if off(g) <= n / 4]
    if middle:
        return max(middle, key=lambda g: (g[1] - g[0], -off(g)))
    return min(words or gaps(cols, 1) or [(n // 2, n // 2)], key=off)


def _crop(grey: np.ndarray, box, height: int, patch: int, max_width: int, stretch: float,
          cut: tuple[bool, bool]) -> Image.Image:
    crop, width = _scaled_width(grey, box, height, patch, stretch)
    _, pad_x = _pads(box)
    left = box[0] - max(0, box[0] - pad_x)  # the box's first column in the crop
    if cut[0] or cut[1]:
        # the paper's own tone: white on a page the segmenter normalised, maybe not on a line image
        paper = np.percentile(crop, 90)
        crop = crop.copy()
        if cut[0]:
            crop[:, :left] = paper
        if cut[1]:
            crop[:, left + box[2] - box[0]:] = paper
    return Image.fromarray(np.ascontiguousarray(crop)).resize((min(width, max_width), height), Image.BICUBIC)
