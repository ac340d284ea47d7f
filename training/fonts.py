"""The faces text is rendered in: TrueType fonts that PyPI packages ship, and the PDF standard-14
fonts as PDFium draws them.

- matplotlib's wheel: DejaVu Sans, Sans Mono, Serif and STIX General, 4 styles each (DejaVu: a
  Bitstream Vera derivative, free licence; STIX: SIL Open Font License);
- Pillow's wheel: its built-in default face (Aileron, CC0), what `ImageFont.load_default` draws;
- PDFium (in pypdfium2): Helvetica, Times and Courier, 4 styles each, rendered from generated PDFs.

Some faces are held out of training to measure how the reader does on type it never saw.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from PIL import ImageFont

from .charset import CHARS


@dataclass(frozen=True)
class Face:
    name: str
    kind: str  # "ttf" (PIL), "pil-default" (Pillow's own face) or "pdf" (a standard-14 BaseFont)
    source: str = ""  # the TTF path, or the BaseFont name

    def pil(self, size: int) -> ImageFont.FreeTypeFont:
        if self.kind == "pil-default":
            return ImageFont.load_default(size=size)
        return _ttf(self.source, size)


@lru_cache(maxsize=512)
def _ttf(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def _mpl_dir() -> str:
    import matplotlib

    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf")


MPL_FACES = (
    "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique", "DejaVuSans-BoldOblique",
    "DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSansMono-Oblique", "DejaVuSansMono-BoldOblique",
    "DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "DejaVuSerif-BoldItalic",
    "STIXGeneral", "STIXGeneralBol", "STIXGeneralItalic", "STIXGeneralBolIta",
)
PDF_FACES = (
    "Helvetica", "Helvetica-Bold", "Helvetica-Oblique", "Helvetica-BoldOblique",
    "Times-Roman", "Times-Bold", "Times-Italic", "Times-BoldItalic",
    "Courier", "Courier-Bold", "Courier-Oblique", "Courier-BoldOblique",
)
HELDOUT = ("DejaVuSansMono-BoldOblique", "STIXGeneralBolIta", "Times-BoldItalic", "Courier-BoldOblique")


@lru_cache(maxsize=None)
def all_faces() -> tuple[Face, ...]:
    d = _mpl_dir()
    faces = [Face(n, "ttf", os.path.join(d, n + ".ttf")) for n in MPL_FACES]
    faces.append(Face("Aileron", "pil-default"))
    faces += [Face(n, "pdf", n) for n in PDF_FACES]
    return tuple(faces)


def faces(split: str) -> tuple[Face, ...]:
    held = split == "heldout"
    return tuple(f for f in all_faces() if (f.name in HELDOUT) == held)


@lru_cache(maxsize=None)
def missing_chars(face: Face) -> frozenset[str]:
    """Characters the face draws as its missing-glyph box (PDF faces cover the whole charset)."""
    if face.kind == "pdf":
        return frozenset()
    font = face.pil(32)

    def shape(c: str) -> bytes:
        mask = font.getmask(c)
        return bytes(mask) + bytes(str(mask.size), "ascii")

    tofu = shape("\ue000")
    return frozenset(c for c in CHARS if c != " " and shape(c) == tofu)
