"""Lines typeset by groff and cut as the pipeline cuts a page: real typesetting (groff's own
fonts, kerning, ligatures, justified spacing, hyphenation, bullets, code in Courier), found by
the pipeline's segmenter (pipeline/segment.py) and cut by line_pieces (pipeline/pieces.py) at
the reader's width, each piece's text the characters PDFium places inside its box. The drawn lines of render.py
are one face and one line at a time; these are the crops the reader meets on a real page.

    lines = TypesetLines()
    piece, text = lines.draw(rng, "train", 28, 280, stretch=1.12)   # None if groff is missing

groff (`-ms`, with preconv for UTF-8) makes the PDF; it is installed with Debian's groff
package. Pages are made one at a time and their pieces handed out in random order.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata

import numpy as np

from pantheon_ocr.pipeline.pieces import line_pieces
from pantheon_ocr.pipeline.segment import segment

from .charset import CHARSET, clean_text
from .texts import _identifier, _lang, _markup, _number, _span, prose

# groff's PostScript families (gropdf embeds the URW fonts): Times, Helvetica, Palatino, New
# Century Schoolbook, Bookman, Avant Garde; Courier for code
FAMILIES = ("T", "H", "P", "N", "B", "A")
PAGE_EDGE = 2200  # the pipeline renders PDF pages at the bundled reader's page_edge


def _escaped(text: str) -> str:
    """A line of text as groff input: backslashes written \\e, a leading dot or quote guarded."""
    text = text.replace("\\", "\\e")
    return "\\&" + text if text[:1] in (".", "'") else text


def groff_source(rng: np.random.Generator, split: str) -> str:
    """An -ms document of one page or so: headings, justified paragraphs (groff hyphenates them),
    bulleted and numbered items, bold and italic words, code in Courier, numbers and amounts."""
    lang = _lang(rng)
    items = prose(lang, split)
    size = int(rng.integers(9, 14))
    out = [f".fam {rng.choice(FAMILIES)}", f".nr PS {size}", f".nr VS {size + int(rng.integers(1, 5))}",
           f".nr LL {rng.uniform(4.0, 6.5):.2f}i", ".nr HY 1" if rng.random() < 0.7 else ".nr HY 0"]
    if rng.random() < 0.5:
        out.append(".ad l")  # ragged right, as many manuals are set
    for _ in range(int(rng.integers(4, 9))):
        kind = rng.random()
        if kind < 0.15:
            out += [f".NH {int(rng.integers(1, 3))}", _escaped(_span(rng, items, int(rng.integers(10, 40))))]
        elif kind < 0.3:
            mark = str(rng.choice(["\\(bu", "\\(em", "\\-", f"{int(rng.integers(1, 9))}."]))
            for _ in range(int(rng.integers(2, 5))):
                out += [f".IP {mark} 3", _escaped(_span(rng, items, int(rng.integers(20, 120))))]
        elif kind < 0.4:
            out += [".DS I", ".ft CR"] + [_escaped(_markup(rng, split) if rng.random() < 0.7 else _identifier(rng, split))
                                          for _ in range(int(rng.integers(2, 6)))] + [".ft", ".DE"]
        else:
            words = [w.replace("\\", "\\e") for w in _span(rng, items, int(rng.integers(150, 500))).split(" ")]
            for i in rng.choice(len(words), size=min(len(words), int(rng.integers(0, 4))), replace=False):
                words[i] = f"\\f{rng.choice(['B', 'I'])}{words[i]}\\fP" if rng.random() < 0.7 else _number(rng)
            line = " ".join(words)
            out += [".PP" if rng.random() < 0.7 else ".LP", "\\&" + line if line[:1] in (".", "'") else line]
    return "\n".join(out) + "\n"


def typeset_pdf(source: str) -> bytes | None:
    """groff's PDF of an -ms source; None if groff cannot make one here."""
    groff = shutil.which("groff")
    if groff is None:
        return None
    done = subprocess.run([groff, "-k", "-Tpdf", "-ms"], input=source.encode("utf-8"), capture_output=True, timeout=60)
    return done.stdout if done.returncode == 0 and done.stdout.startswith(b"%PDF") else None


def page_pieces(pdf: bytes, line_height: int, patch: int, max_width: int, stretch: float,
                edge: int = PAGE_EDGE) -> list[tuple[np.ndarray, str]]:
    """(uint8 grey piece [line_height, W], its text) for each piece the pipeline cuts from the
    PDF's first page rendered at `edge` px. A piece is left out when its characters stand on
    more than one line (the segmenter joined two), or it holds ink but no character (a rule), or
    a character outside the reader's charset."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(pdf)
    try:
        page = doc[0]
        w_pt, h_pt = page.get_size()
        scale = edge / max(w_pt, h_pt)
        grey = np.asarray(page.render(scale=scale, grayscale=True).to_pil().convert("L"))
        text = page.get_textpage()
        chars = []  # (x centre, y centre, height, character) in pixels
        for i in range(text.count_chars()):
            c = text.get_text_range(i, 1)
            left, bottom, right, top = text.get_charbox(i)
            if c.strip() and top > bottom:
                chars.append(((left + right) / 2 * scale, (h_pt - (top + bottom) / 2) * scale, (top - bottom) * scale, c))
            elif c == " ":
                chars.append(((left + right) / 2 * scale, (h_pt - bottom) * scale - 1, 0.0, " "))
    finally:
        doc.close()
    regions, clean = segment(grey)
    out = []
    for region in regions:
        pieces = line_pieces(clean, region.box, line_height, patch, max_width, stretch)
        rx0, ry0, rx1, ry1 = region.box
        # The crop pads the box (line_pieces), so a character the box left out (a final dot the
        # dust filter took) still shows: each character near the region goes to its nearest piece.
        pad_x, pad_y = max(2, round(0.3 * (ry1 - ry0))), max(1, round(0.15 * (ry1 - ry0)))
        near = [ch for ch in chars if rx0 - pad_x <= ch[0] < rx1 + pad_x and ry0 - pad_y <= ch[1] < ry1 + pad_y]
        held: list[list] = [[] for _ in pieces]
        for ch in near:
            gaps = [max(box[0] - ch[0], ch[0] - box[2], 0) for box, _ in pieces]
            held[gaps.index(min(gaps))].append(ch)
        for (_, img), inside in zip(pieces, held):
            letters = [(y, h) for x, y, h, c in inside if c != " "]
            if not letters:
                continue
            ys = [y for y, _ in letters]
            if max(ys) - min(ys) > 0.8 * max(h for _, h in letters):  # two lines in one crop
                continue
            said = unicodedata.normalize("NFKC", "".join(c for _, _, _, c in sorted(inside)))
            said = re.sub(r"\s+", " ", said.replace("\x02", "-")).strip()
            if not said or clean_text(said) != said or not set(said) <= CHARSET:
                continue
            out.append((np.asarray(img, dtype=np.uint8), said))
    return out


class TypesetLines:
    """Pieces of typeset pages, a page made when the last one's pieces are handed out."""

    def __init__(self) -> None:
        self.pieces: list[tuple[np.ndarray, str]] = []
        self.made_for: tuple = ()  # the (split, line_height, max_width, stretch, patch) the pieces were cut for
        self.available = shutil.which("groff") is not None

    def draw(self, rng: np.random.Generator, split: str, line_height: int, max_width: int, stretch: float = 1.0,
             patch: int = 14, tries: int = 3):
        """A (grey piece, text) of a typeset page; None where groff is missing or makes nothing."""
        if self.made_for != (split, line_height, max_width, stretch, patch):
            self.pieces, self.made_for = [], (split, line_height, max_width, stretch, patch)
        for _ in range(tries if self.available else 0):
            if self.pieces:
                return self.pieces.pop(int(rng.integers(len(self.pieces))))
            pdf = typeset_pdf(groff_source(rng, split))
            if pdf is not None:
                edge = int(PAGE_EDGE * rng.uniform(0.85, 1.1))
                self.pieces = page_pieces(pdf, line_height, patch, max_width, stretch * rng.uniform(0.95, 1.08), edge)
        return self.pieces.pop(int(rng.integers(len(self.pieces)))) if self.pieces else None
