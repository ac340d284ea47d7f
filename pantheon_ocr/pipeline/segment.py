"""Page segmentation: a page image -> text regions in reading order (columns first, then lines).

For readers that read lines or blocks rather than whole pages. Printed documents only: text on a
grey, dark or coloured ground (slide title bars, table headers, inverted boxes) is normalised so ink
is always darker than its ground (the ground of each area made white), the page is binarised (Otsu),
table rules and other long strokes are removed (ink.py), and the ink is cut recursively (an X-Y
cut): a block splits into columns where a vertical gap runs through all of it and both sides hold
running text; otherwise into sections at full-width blank bands at least a line high (a title over
two columns, a footer under them), each cut again; what cannot be cut is a run of lines, and a line
splits into cells at wide gaps (table rows are read cell by cell, left to right; a cell holding
lines of its own, each of them), with an inline picture standing on it cut off (_beside). Each
leaf is a line: its crop is taken from the normalised grey page, padded, and scaled to the
reader's line height (pieces.py: a line too wide for the reader is cut into pieces). A blank page
has no regions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .ink import gaps, ink_mask, normalise_ground, runs


@dataclass(frozen=True)
class Region:
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 on the page image
    block: int  # regions of one block (paragraph, column, table) share a number, in reading order
    row: int  # regions on one line of a block share a number; cells of a line are joined with a space
    picture: bool = False  # a piece beside a line and taller than it (an icon, an image bullet): see _beside


@dataclass
class _Ctx:
    ink: np.ndarray
    specks: np.ndarray  # the dust ink_mask took out of ink: a dot leader's dots are there
    line_h: float  # median line height on the page
    min_gap: float  # narrowest vertical gap that separates columns or cells


def _bands(ink: np.ndarray, y0: int, y1: int, x0: int, x1: int, min_h: int) -> list[tuple[int, int]]:
    """Rows with ink in the block, merged across gaps smaller than min_h (i-dots, accents)."""
    rows = ink[y0:y1, x0:x1].any(axis=1)
    starts, ends = runs(rows)
    bands: list[list[int]] = []
    for s, e in zip(starts, ends):
        if bands and s - bands[-1][1] < min_h:
            bands[-1][1] = e
        else:
            bands.append([s, e])
    return [(y0 + s, y0 + e) for s, e in bands]


def _line_height(ink: np.ndarray, strips: int = 6) -> float:
    """The ink-weighted median height of the page's row bands (specks and rules weigh nothing),
    measured in vertical strips narrower than a column: the lines of two columns whose baselines do
    not line up would merge into tall bands across the page.

    Pictures are left out: a dithered photo or a halftone comes out of Otsu as tall bands heavy
    with ink that outweighed the lines, so the body text was taken for specks and its lines were
    merged several at a time. A picture's band is inked in nearly every column of its width and
    is taller than TALL times the median band (most bands of a page are lines, a picture makes
    one or a few per strip); a line of text leaves gaps between letters and words."""
    bands = list(_strip_bands(ink, strips))
    if not bands:
        return 0.0
    heights = np.array([b[1] - b[0] for b in bands])
    typical = float(np.median(heights))
    keep = np.array([h <= TALL * typical or _column_cover(ink, *b[:4]) < PICTURE_COVER
                     for h, b in zip(heights, bands)])
    return _weighted_median(heights[keep], np.array([b[4] for b in bands], np.float64)[keep])


# Measured: the dev set's 35 pages keep their line heights; lines of text cover 0.70-0.76 of their
# columns within a strip, dithered pictures 0.84-1.0.
TALL, PICTURE_COVER = 2.5, 0.8


def _column_cover(ink: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> float:
    """The share of the columns between a band's first and last inked column that hold ink."""
    cols = np.flatnonzero(ink[y0:y1, x0:x1].any(axis=0))
    return cols.size / (cols[-1] - cols[0] + 1) if cols.size else 0.0


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


def _strip_bands(ink: np.ndarray, strips: int = 6):
    """(y0, y1, x0, x1, ink) of each row band of each vertical strip of the page."""
    w = ink.shape[1]
    for x in np.linspace(0, w, strips + 1).astype(int)[:-1]:
        strip = ink[:, x: x + max(1, w // strips)]
        starts, ends = runs(strip.any(axis=1))
        for s, e in zip(starts, ends):
            yield int(s), int(e), int(x), int(x) + strip.shape[1], int(strip[s:e].sum())


def segment(grey: np.ndarray) -> tuple[list[Region], np.ndarray]:
    """Text regions of a grey page [H, W] uint8 in reading order, and the page as lines are cut
    from it: light-on-dark areas turned over, rules painted over in the paper's tone."""
    if grey.size and int(grey.max()) - int(grey.min()) >= 40:
        grey = normalise_ground(grey)
    ink, rules, specks = ink_mask(grey)
    clean = grey.copy()
    if rules.any():
        clean[rules] = int(np.median(grey[~ink & ~rules])) if (~ink & ~rules).any() else 255
    if not ink.any():
        return [], clean
    line_h = _line_height(ink)
    ctx = _Ctx(ink, specks, line_h, max(3.0, 1.2 * line_h))
    ys, xs = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    out: list[Region] = []
    _block(ctx, int(ys[0]), int(ys[-1]) + 1, int(xs[0]), int(xs[-1]) + 1, out)
    return out, clean


def _block(ctx: _Ctx, y0: int, y1: int, x0: int, x1: int, out: list[Region]) -> None:
    ink = ctx.ink
    # Columns first: a gap running through the whole block, with running text either side. A gap
    # about a line wide is a column gutter only where at least 3 lines stand on both sides (word
    # spaces do not line up over several lines of running text); a wider one needs 2.
    cols = ink[y0:y1, x0:x1].any(axis=0)
    for gs, ge in sorted(gaps(cols, ctx.min_gap), key=lambda g: g[0] - g[1]):
        left, right = (x0, x0 + gs), (x0 + ge, x1)
        lines = 2 if ge - gs >= 2 * ctx.min_gap else 3
        if all(_is_text_column(ctx, y0, y1, a, b, lines) for a, b in (left, right)):
            for a, b in (left, right):
                _shrink_and_recurse(ctx, y0, y1, a, b, out)
            return
    # Then sections: full-width blank bands at least a line high, each section cut again (two
    # columns under a title, a footer under them).
    sections = _sections(ctx, y0, y1, x0, x1)
    if len(sections) > 1:
        for s0, s1 in sections:
            _shrink_and_recurse(ctx, s0, s1, x0, x1, out)
        return
    # What is left is a run of lines: paragraphs where the gap is clearly wider than the spacing.
    lines = []  # (b0, b1, c0, c1, picture beside it or None)
    for band in _bands(ink, y0, y1, x0, x1, max(2, int(0.25 * ctx.line_h))):
        beside = _beside(ctx, band, x0, x1)
        if beside is None:
            lines += [(b0, b1, x0, x1, None) for b0, b1 in _split_tall(ctx, band, x0, x1)]
            continue
        picture, (t0, t1, c0, c1) = beside
        split = _split_tall(ctx, (t0, t1), c0, c1)
        at = next((i for i, (s0, s1) in enumerate(split) if s1 >= picture[3] - 0.5 * ctx.line_h), 0)  # the line it rests on
        lines += [(b0, b1, c0, c1, picture if i == at else None) for i, (b0, b1) in enumerate(split)]
    block = out[-1].block + 1 if out else 0
    row = out[-1].row + 1 if out else 0
    prev_end = None
    for b0, b1, lx0, lx1, picture in lines:
        if prev_end is not None and b0 - prev_end > 1.2 * ctx.line_h:
            block += 1
        prev_end = b1
        if picture is not None and picture[0] < lx0:
            out.append(Region(picture, block, row, picture=True))
        cells = _cells(ctx, b0, b1, lx0, lx1)
        stacked = [_cell_lines(ctx, b0, b1, c0, c1) for c0, c1 in cells] \
            if len(cells) > 1 and b1 - b0 >= 1.7 * ctx.line_h else []
        if any(len(s) > 1 for s in stacked) and all(_like_lines(ctx, s) for s in stacked if len(s) > 1):
            # A tall band whose cells hold lines of their own (a letterhead's name beside its
            # address, a table row with a cell of two lines): the lines of one cell were read as
            # one tall line. Read cell by cell, each of its lines a row.
            for (c0, c1), lines_of_cell in zip(cells, stacked):
                for s0, s1 in lines_of_cell:
                    box = _tight(ctx, s0, s1, c0, c1)
                    if box is not None:
                        out.append(Region(box, block, row))
                        row += 1
            row -= 1  # the last cell's last line is the row a picture after it joins
        else:
            for c0, c1 in cells:
                box = _tight(ctx, b0, b1, c0, c1)
                if box is not None:
                    out.append(Region(box, block, row))
        if picture is not None and picture[0] >= lx1:
            out.append(Region(picture, block, row, picture=True))
        row += 1


def _cell_lines(ctx: _Ctx, b0: int, b1: int, c0: int, c1: int) -> list[tuple[int, int]]:
    """The lines of one cell of a band: its own row bands, apart where blank rows part them (not
    cut at a valley as _split_tall cuts: a word in big type would lose its descenders)."""
    return _bands(ctx.ink, b0, b1, c0, c1, max(2, int(0.25 * ctx.line_h)))


def _like_lines(ctx: _Ctx, bands: list[tuple[int, int]]) -> bool:
    """Bands each about a line high: a cell's lines, not a picture's pieces between blank rows (a
    photograph's cell cut so read as lines of symbols and letters, which the noise filter kept)."""
    return all(0.4 * ctx.line_h <= b1 - b0 <= 1.6 * ctx.line_h for b0, b1 in bands)


def _sections(ctx: _Ctx, y0: int, y1: int, x0: int, x1: int) -> list[tuple[int, int]]:
    """The block cut at blank bands across its whole width clearly taller than line spacing (1.5
    lines: more than a paragraph's gap, less than what sets a title or a footer apart)."""
    rows = ctx.ink[y0:y1, x0:x1].any(axis=1)
    starts, ends = runs(~rows)
    cuts = [(s, e) for s, e in zip(starts, ends) if e - s >= max(3.0, 1.5 * ctx.line_h) and s > 0 and e < rows.size]
    edges, start = [], 0
    for s, e in cuts:
        edges.append((y0 + start, y0 + s))
        start = e
    edges.append((y0 + start, y1))
    return edges


def _shrink_and_recurse(ctx, y0, y1, x0, x1, out) -> None:
    sub = ctx.ink[y0:y1, x0:x1]
    ys, xs = np.flatnonzero(sub.any(axis=1)), np.flatnonzero(sub.any(axis=0))
    if ys.size:
        _block(ctx, y0 + int(ys[0]), y0 + int(ys[-1]) + 1, x0 + int(xs[0]), x0 + int(xs[-1]) + 1, out)


def _is_text_column(ctx: _Ctx, y0, y1, x0, x1, min_lines: int = 2) -> bool:
    """At least `min_lines` lines, most of them long (running text, not table cells)."""
    bands = _bands(ctx.ink, y0, y1, x0, x1, max(2, int(0.25 * ctx.line_h)))
    if len(bands) < min_lines:
        return False
    widths = []  # of each line's widest cell: a table row is cells, running text is one run
    for b0, b1 in bands:
        widths.append(max((c1 - c0 for c0, c1 in _cells(ctx, b0, b1, x0, x1)), default=0))
    return float(np.median(widths)) >= 6 * ctx.line_h


def _beside(ctx: _Ctx, band: tuple[int, int], x0: int, x1: int):
    """A band that is text beside a picture at its left or right end (an icon or an image bullet
    before a caption, as HTML manuals print them): (the picture's box, the text's (y0, y1, x0, x1)),
    or None. The picture is a piece set apart by a gap (a word space will do), at least two lines
    tall, inked in every row and not cut into lines by _split_tall (the ends of lines, footnote
    marks, words of lines set tight are not), resting on the baseline of the text beside it and
    standing a line or more above it, as an inline image does. Cut as one line, the two read as
    symbols over the whole line, the caption lost ("self.__........" for "Glue selected objects
    and make them a COMPOUND object."). A big letter or digit standing on the line (a raised cap,
    a chapter's number) is cut off too, and read on its own; a drop cap hangs below its line and
    stays with it."""
    b0, b1 = band
    if b1 - b0 < 2 * ctx.line_h:
        return None
    cols = ctx.ink[b0:b1, x0:x1].any(axis=0)
    edges, start = [], 0
    for gs, ge in gaps(cols, max(2.0, 0.3 * ctx.line_h)):
        edges.append((start, gs))
        start = ge
    edges.append((start, cols.size))
    pieces = [(x0 + a, x0 + b) for a, b in edges if cols[a:b].any()]
    if len(pieces) < 2:
        return None
    for pic, text in ((pieces[0], pieces[1:]), (pieces[-1], pieces[:-1])):
        p0, p1 = _rows(ctx, b0, b1, *pic)
        t0, t1 = _rows(ctx, b0, b1, text[0][0], text[-1][1])
        # An inline picture rests on the text's baseline and stands above it. One that hangs below
        # the text beside it holds that line's first words over something else (a line merged
        # into the band of a picture under it).
        if p1 - p0 < 2 * ctx.line_h or t0 - p0 < ctx.line_h or p1 > t1 + 0.5 * ctx.line_h:
            continue
        # Lines' ends or footnote marks have blank rows between them; words of lines set tight,
        # or a line just above the picture merged into its band, have valleys _split_tall finds.
        solid = ctx.ink[p0:p1, pic[0]:pic[1]].any(axis=1).all()
        if solid and len(_split_tall(ctx, (p0, p1), *pic)) == 1:
            return (pic[0], p0, pic[1], p1), (t0, t1, text[0][0], text[-1][1])
    return None


def _rows(ctx: _Ctx, b0: int, b1: int, c0: int, c1: int) -> tuple[int, int]:
    """The first and last (exclusive) inked rows of an area of a band."""
    ys = np.flatnonzero(ctx.ink[b0:b1, c0:c1].any(axis=1))
    return b0 + int(ys[0]), b0 + int(ys[-1]) + 1


def _split_tall(ctx: _Ctx, band: tuple[int, int], x0: int, x1: int) -> list[tuple[int, int]]:
    """A band taller than ~1.7 lines is two touching lines: cut at the emptiest row near a valley,
    and the halves again (a loop, not recursion: a page of tiny print holds thousands)."""
    out, todo = [], [band]
    whole = ctx.ink[band[0]:band[1], x0:x1].sum(axis=1).astype(np.float64)  # once: halves slice it
    while todo:
        b0, b1 = todo.pop()
        h = b1 - b0
        if ctx.line_h <= 0 or h < 1.7 * ctx.line_h:
            out.append((b0, b1))
            continue
        profile = whole[b0 - band[0]: b1 - band[0]]
        margin = max(1, int(0.6 * ctx.line_h))  # each half keeps at least a row
        lo, hi = margin, h - margin
        cut = lo + int(np.argmin(profile[lo:hi])) if hi > lo else 0
        if hi <= lo or profile[cut] > 0.15 * np.median(profile[profile > 0]):
            out.append((b0, b1))  # no valley: one tall line (a heading)
            continue
        todo += [(b0 + cut, b1), (b0, b0 + cut)]  # the upper half is popped, and so cut, first
    return out


def _cells(ctx: _Ctx, b0: int, b1: int, x0: int, x1: int) -> list[tuple[int, int]]:
    """A band's ink cut at gaps wider than ~1.2 line heights (table cells, separated items), but
    not where a dot leader fills the gap (a table of contents' title and its page number)."""
    cols = ctx.ink[b0:b1, x0:x1].any(axis=0)
    height = b1 - b0
    edges, start = [], 0
    for gs, ge in gaps(cols, max(ctx.min_gap, 1.2 * height)):
        if _leader(ctx, b0, b1, x0 + gs, x0 + ge):
            continue
        edges.append((start, gs))
        start = ge
    edges.append((start, cols.size))
    return [(x0 + a, x0 + b) for a, b in edges if cols[a:b].any()]


def _leader(ctx: _Ctx, b0: int, b1: int, g0: int, g1: int) -> bool:
    """Whether a dot leader fills the gap [g0, g1) of a band: three or more specks, each narrower
    than a third of a line, on one level below the band's top 40% (a baseline's dots, or a
    centred dot's), evenly spaced at most 1.5 lines apart and running from near one side of the
    gap to near the other. The dust filter takes LaTeX's
    leader dots out of the ink (they stand ~0.8 em apart), and the entries of a table of contents
    were cut at the leader: their page numbers read as cells of their own and the dots lost."""
    edge = int(0.25 * ctx.line_h)  # specks next to the letters either side: their anti-aliased edges
    g0, g1 = g0 + edge, g1 - edge
    if g1 <= g0:
        return False
    dots = ctx.specks[b0:b1, g0:g1]
    rows = np.flatnonzero(dots.any(axis=1))
    if rows.size == 0 or rows[0] < 0.4 * (b1 - b0) or rows[-1] - rows[0] > 0.3 * ctx.line_h:
        return False
    starts, ends = runs(dots.any(axis=0))
    if starts.size < 3 or (ends - starts).max() > ctx.line_h / 3:
        return False
    steps = np.diff((starts + ends) / 2)
    step = float(np.median(steps))
    return bool(step <= 1.5 * ctx.line_h and steps.min() > 0.75 * step and steps.max() < 1.25 * step
                and starts[0] <= 2.5 * step and (g1 - g0) - ends[-1] <= 2.5 * step)


def _tight(ctx: _Ctx, b0, b1, c0, c1):
    sub = ctx.ink[b0:b1, c0:c1]
    n = int(sub.sum())
    ys, xs = np.flatnonzero(sub.any(axis=1)), np.flatnonzero(sub.any(axis=0))
    h = int(ys[-1] - ys[0] + 1) if ys.size else 0
    if h < max(3, 0.3 * ctx.line_h) or n < 0.5 * h:  # specks and dust
        return None
    return c0 + int(xs[0]), b0 + int(ys[0]), c0 + int(xs[-1]) + 1, b0 + int(ys[-1]) + 1


def blocks(regions: list[Region]) -> list[Region]:
    """One region per block: the union of its lines' boxes, in the same reading order."""
    out: dict[int, list[int]] = {}
    for r in regions:
        b = out.setdefault(r.block, list(r.box))
        b[:] = [min(b[0], r.box[0]), min(b[1], r.box[1]), max(b[2], r.box[2]), max(b[3], r.box[3])]
    return [Region(tuple(box), block, 0) for block, box in out.items()]


def block_image(page: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    """A block's crop of the page, padded by a little paper, for readers of whole blocks."""
    x0, y0, x1, y1 = box
    pad = max(4, round(0.02 * max(page.size)))
    return page.crop((max(0, x0 - pad), max(0, y0 - pad), min(page.width, x1 + pad), min(page.height, y1 + pad)))
