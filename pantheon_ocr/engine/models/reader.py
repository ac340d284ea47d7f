"""How a model wants its pages: the reading hints, one typed value.

A LightOnOCR file reads whole pages at its image size and names nothing. A reader trained to read
lines (the bundled one, training/) names how the pipeline should cut pages for it, in
`pantheon.reader.*` keys of its mmproj: the segment mode, the height of a line crop, the
resolution pages are rendered at before they are cut, the widest piece of a line it reads at
once, and how much wider than the page shows it a line crop is drawn. `reading_hints` checks
them and fills in what a file leaves out, once; the pipeline reads `engine.hints` and nothing
else.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ModelError
from ...options import MAX_LONGEST_EDGE as MAX_IMAGE_SIDE
from ...options import SEGMENT_MODES
from ..format import names as N
from ..format.gguf import GGUFFile, meta



@dataclass(frozen=True)
class ReadingHints:
    segment: str  # the default segment mode: page, blocks or lines
    line_height: int  # lines: each line crop is scaled to this height (px); 0: cropped at page resolution
    line_width: int  # the widest piece of a line read at once (px); wider lines are cut (pipeline/pieces.line_pieces)
    page_edge: int  # pages are rendered at this longest edge (px) before they are cut or read
    patch_size: int  # every image side is rounded up to a multiple of this (px)
    # A line crop is scaled to line_height and its width then by this: a reader whose tokens each
    # cover two or three letters of a line tells doubled letters apart better a little wider.
    line_stretch: float = 1.0

    @property
    def reads_lines(self) -> bool:
        """A reader of line crops at a fixed height (not a page model reading cut-out regions)."""
        return self.line_height > 0


def page_hints(longest_edge: int, patch_size: int) -> ReadingHints:
    """The hints of a model that reads whole pages at `longest_edge`."""
    return ReadingHints("page", 0, longest_edge, longest_edge, patch_size)


def reading_hints(gf: GGUFFile, longest_edge: int, patch_size: int, merge: int) -> ReadingHints:
    """The `pantheon.reader.*` keys of an mmproj, checked; each problem names the key and the file."""
    segment = meta(gf, N.READER_SEGMENT, str, "page")
    line_height = meta(gf, N.READER_LINE_HEIGHT, int, 0)
    page_edge = meta(gf, N.READER_PAGE_EDGE, int, 0)
    line_width = meta(gf, N.READER_LINE_WIDTH, int, 0)
    line_stretch = meta(gf, N.READER_LINE_STRETCH, float, 1.0)
    if segment not in SEGMENT_MODES:
        raise ModelError(gf.path, f"'pantheon.reader.segment' is {segment!r}, expected one of {', '.join(SEGMENT_MODES)}")
    unit = patch_size * merge
    if segment == "lines" and (line_height < unit or line_height % unit or line_height > 16 * unit):
        raise ModelError(gf.path, f"'pantheon.reader.line_height' ({line_height}) must be a multiple of {unit} "
                                  f"(patch size x merge) between {unit} and {16 * unit}")
    if page_edge and not 256 <= page_edge <= MAX_IMAGE_SIDE:
        raise ModelError(gf.path, f"'pantheon.reader.page_edge' ({page_edge}) must be between 256 and {MAX_IMAGE_SIDE} px")
    if line_width and not 4 * unit <= line_width <= longest_edge:
        raise ModelError(gf.path, f"'pantheon.reader.line_width' ({line_width}) must be between {4 * unit} px "
                                  f"and the image size ({longest_edge} px)")
    lo, hi = N.READER_LINE_STRETCH_RANGE
    if not lo <= line_stretch <= hi:
        raise ModelError(gf.path, f"'{N.READER_LINE_STRETCH}' ({line_stretch:.4g}) must be between {lo:g} and {hi:g}")
    return ReadingHints(segment, line_height if segment == "lines" else 0, line_width or longest_edge,
                        page_edge or longest_edge, patch_size, line_stretch)
