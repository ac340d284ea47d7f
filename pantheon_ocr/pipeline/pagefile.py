"""What every kind of page file shares, PDF or image: the count of a document's pages, a check
that the file is still a regular one, the scale that fits a page to the longest edge, and the
narrowest page that can be read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..errors import InputError
from .files import special_kind
from .inputs import Document

# Below this many pixels on the short side there is nothing to read; it is also far below one
# vision patch row after resizing, so the encoder would get an empty or degenerate grid.
MIN_SIDE = 16


@dataclass(frozen=True)
class PageCount:
    n: int  # render.count_pages
    note: str = ""  # what of the file is not read, said with the document's outcome


def stat_regular(doc: Document, page: int | None) -> os.stat_result:
    """The document's stat, if it is still a regular file (it may have been replaced by a FIFO
    since it was planned, which PDFium or PIL would wait on forever)."""
    try:
        st = os.stat(doc.path)
    except OSError as e:
        raise InputError(doc.path, f"cannot read file: {e.strerror or e}", page=page, lasting=False) from None
    kind = special_kind(st.st_mode)
    if kind is not None:
        raise InputError(doc.path, f"{kind}, not a regular file", page=page)
    return st


def fit(width: float, height: float, longest_edge: int) -> tuple[float, int, int]:
    """Scale so that ceil(longer side * scale) == longest_edge exactly (PDFium rounds up)."""
    scale = longest_edge / max(width, height)
    while math.ceil(max(width, height) * scale) > longest_edge:
        scale = math.nextafter(scale, 0.0)
    return scale, math.ceil(width * scale), math.ceil(height * scale)


def too_thin(what: str, size: str, w: int, h: int, longest_edge: int) -> str:
    """A page or image so long for its width that, fitted to the longest edge, it is a sliver."""
    return (f"the {what} is too thin to read: {size} becomes {w}x{h} px at the longest edge of {longest_edge} px "
            f"(under {MIN_SIDE} px across); cut it into shorter pieces")
