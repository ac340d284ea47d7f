"""Image regions of bbox models: LightOnOCR-2's bbox variants write an embedded picture as
`![image](image_1.png)123,45,678,901`, its box on the page as x1,y1,x2,y2 normalised to 0-1000.

Each valid box is cropped from the page rendered at full resolution (PDFs at FIGURE_EDGE px on
the longer side, images at their own size) and written beside the Markdown as
`<doc>_images/p3_1.png` (page 3, first region), with the document's other outputs and like them
all or none (outputs.write_document). The Markdown links the crop instead (`![image](<doc>_images/p3_1.png)`);
the JSONL record keeps the model's text, coordinates included, and lists the crops ("images").

A malformed box (a number out of 0-1000, x2 <= x1 or y2 <= y1, not numbers, fewer than four) is
left as the model wrote it: text, never a crash. Rendering and cropping run in a crash-proof
render worker of their own, started only when some page has a box.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import quote

from .files import OutputFolder
from .naming import IMAGES_SUFFIX
from .render import render_page
from .render_pool import RenderPool
from .types import MAX_LONGEST_EDGE, PageResult

FIGURE_EDGE = 3080  # px, longer side of a PDF page rendered for cropping: twice LightOnOCR's 1540
# `![alt](image_N.png)` then x1,y1,x2,y2; a number run that goes on (a fifth number, a decimal)
# does not match, so it stays text.
BOX = re.compile(r"!\[(?P<alt>[^\]\n]*)\]\((?P<name>image_\d+\.png)\)[ \t]*"
                 r"(?P<x1>\d{1,4}),(?P<y1>\d{1,4}),(?P<x2>\d{1,4}),(?P<y2>\d{1,4})(?![\d.,])")
_CROP_FILE = re.compile(r"p\d+_\d+\.png")


@dataclass(frozen=True)
class Figure:
    """One image region of a page: its number on the page (1-based), the model's own link
    target, the box (0-1000), where it is in the page text, and the cropped PNG."""

    index: int
    name: str
    box: tuple[int, int, int, int]
    span: tuple[int, int]
    file: str = ""  # `<doc>_images/p3_1.png`, relative to the document's Markdown
    png: bytes = dataclasses.field(default=b"", repr=False)


def find_boxes(text: str) -> list[Figure]:
    """The valid boxes in a page's text, in order (no pixels yet)."""
    found = []
    for m in BOX.finditer(text):
        x1, y1, x2, y2 = (int(m[k]) for k in ("x1", "y1", "x2", "y2"))
        if max(x1, y1, x2, y2) <= 1000 and x1 < x2 and y1 < y2:
            found.append(Figure(len(found) + 1, m["name"], (x1, y1, x2, y2), m.span()))
    return found


def crop_boxes(doc, page_index: int, boxes: Sequence[tuple[int, int, int, int]], password: str | None = None) -> list[bytes]:
    """PNG bytes of each box of the page (runs in a render worker: PDFium, then PIL)."""
    image = render_page(doc, page_index, FIGURE_EDGE if doc.kind == "pdf" else MAX_LONGEST_EDGE, password)
    w, h = image.size
    out = []
    for x1, y1, x2, y2 in boxes:
        left, top = math.floor(x1 * w / 1000), math.floor(y1 * h / 1000)
        right, bottom = max(left + 1, math.ceil(x2 * w / 1000)), max(top + 1, math.ceil(y2 * h / 1000))
        buf = io.BytesIO()
        image.crop((left, top, min(right, w), min(bottom, h))).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


class FigureCropper:
    """Attaches the cropped regions to the page results that have boxes (see the module
    docstring); one worker process, started on first use."""

    def __init__(self, password: str | None, timeout: float | None, start_method: str | None = None):
        self.password, self.timeout, self.start_method = password, timeout, start_method
        self.pool: RenderPool | None = None

    def apply(self, results: Sequence[PageResult], base: Path, stop: threading.Event | None = None) -> list[PageResult]:
        """`results` (one document's, whose outputs are `base`.md etc.) with `figures` set on every
        OCR'd page that has valid boxes. A page whose crop fails (its render fails, the worker
        crashes) keeps its text and gets no figures."""
        wanted = [(r, boxes) for r in results if r.error is None and (boxes := find_boxes(r.text))]
        if not wanted:
            return list(results)
        if self.pool is None:
            self.pool = RenderPool(workers=1, timeout=self.timeout, start_method=self.start_method)
        items = [(r.doc, r.page - 1, [f.box for f in boxes], self.password) for r, boxes in wanted]
        found: dict[tuple[str, int], tuple[Figure, ...]] = {}
        for outcome in self.pool.imap(crop_boxes, items, stop or threading.Event()):
            if outcome.error is None:
                r, boxes = wanted[outcome.index]
                found[(r.doc.doc_id, r.page)] = tuple(
                    dataclasses.replace(f, file=f"{images_dir(base).name}/p{r.page}_{f.index}.png", png=png)
                    for f, png in zip(boxes, outcome.value))
        return [dataclasses.replace(r, figures=found[(r.doc.doc_id, r.page)]) if (r.doc.doc_id, r.page) in found else r
                for r in results]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


# -- what the writers need -------------------------------------------------------------------
def images_dir(base: Path) -> Path:
    """The folder of a document's crops, beside its outputs: `<out>/<doc>_images`."""
    return base.with_name(f"{base.name}{IMAGES_SUFFIX}")


def linked_text(result: PageResult, prefix: str = "") -> str:
    """The page's text with each cropped region's link pointing at its file (`prefix` leads
    from the Markdown file's folder to the document's: "../" for per-page files) and its
    coordinates dropped; everything else as the model wrote it."""
    text = result.text
    for f in sorted(result.figures, key=lambda f: f.span, reverse=True):
        text = text[: f.span[0]] + f"![image]({prefix}{quote(f.file)})" + text[f.span[1]:]
    return text


def figure_records(result: PageResult) -> list[dict]:
    """The JSONL record's "images": crop file (relative to the record's file), model link, box."""
    return [{"file": f.file, "name": f.name, "box": list(f.box)} for f in result.figures]


def figure_files(base: Path, results: Sequence[PageResult]) -> list[tuple[Path, bytes]]:
    return [(base.parent / f.file, f.png) for r in results for f in r.figures]


def remove_stale(folder: OutputFolder | None, kept: Sequence[Path]) -> None:
    """Crops an earlier run wrote for this document that this one did not (the page changed),
    from its crops folder as the writers opened it (`folder`, files.OutputTree: never through a
    link; None: there is none)."""
    keep = {p.name for p in kept}
    for name in folder.names() if folder is not None else ():
        if _CROP_FILE.fullmatch(name) and name not in keep:
            folder.unlink(name)
