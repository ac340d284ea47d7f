"""Synthetic document pages for end-to-end evaluation: a PDF page (standard-14 fonts, drawn by
PDFium) with a title, headings, paragraphs, a list, a table with rules and a page number, laid out
from held-out text, and the text it shows in reading order.

    python -m training.pages OUT_DIR [--n 20] [--seed 7]   # writes page-NN.pdf + page-NN.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .render import _pdf_string
from .texts import _number, _span, corpus

FAMILIES = {  # regular, bold; average advance per character in em, used to wrap lines
    "Helvetica": ("Helvetica", "Helvetica-Bold", 0.52),
    "Times": ("Times-Roman", "Times-Bold", 0.47),
    "Courier": ("Courier", "Courier-Bold", 0.6),
}
PAGE = (612.0, 792.0)


def _paragraph(rng: np.random.Generator, prose: tuple[str, ...], length: int) -> str:
    """Consecutive corpus items from a random start, cut at a word near `length` characters."""
    i = int(rng.integers(len(prose)))
    text = ""
    while len(text) < length:
        text = f"{text} {prose[i % len(prose)]}".strip()
        i += 1
    cut = text.rfind(" ", 0, length)
    return text[: cut if cut > 0 else length]


def _wrap(text: str, width_pt: float, size: float, em: float) -> list[str]:
    per_line = max(10, int(width_pt / (size * em)))
    lines, cur = [], ""
    for w in text.split(" "):
        if cur and len(cur) + 1 + len(w) > per_line:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + ([cur] if cur else [])


def make_page(rng: np.random.Generator, split: str = "heldout", family: str | None = None) -> tuple[bytes, str]:
    """(PDF bytes, the page's text with one line per printed line) for one synthetic page."""
    family = family or str(rng.choice(list(FAMILIES)))
    regular, bold, em = FAMILIES[family]
    prose = corpus(f"prose-{split}")
    ops: list[bytes] = []
    truth: list[str] = []
    x0, width = 72.0, PAGE[0] - 144
    y = PAGE[1] - 80

    def text(x, y, s, font="F1", size=11.0):
        ops.append(b"BT /%s %.1f Tf %.2f %.2f Td %s Tj ET" % (font.encode(), size, x, y, _pdf_string(s)))

    title = _span(rng, prose, int(rng.integers(15, 45))).title()
    text(x0, y, title, "F2", float(rng.choice([16, 18, 20])))
    truth.append(title)
    y -= 34
    size = float(rng.choice([10, 10.5, 11, 12]))
    lead = size * 1.35
    section = 1
    while y > 200:
        kind = rng.random()
        if kind < 0.2:  # heading
            head = f"{section}. {_span(rng, prose, int(rng.integers(8, 30))).title()}"
            section += 1
            text(x0, y, head, "F2", size + 2)
            truth.append(head)
            y -= lead * 1.6
        elif kind < 0.75:  # paragraph
            for line in _wrap(_paragraph(rng, prose, int(rng.integers(150, 600))), width, size, em):
                text(x0, y, line, "F1", size)
                truth.append(line)
                y -= lead
            y -= lead * 0.6
        elif kind < 0.9:  # list
            for _ in range(int(rng.integers(2, 5))):
                item = _span(rng, prose, int(rng.integers(15, 60)))
                text(x0 + 10, y, "-", "F1", size)
                text(x0 + 24, y, item, "F1", size)
                truth.append(f"- {item}")
                y -= lead
            y -= lead * 0.6
        else:  # table with rules
            cols = int(rng.integers(3, 5))
            cw = width / cols
            rows = int(rng.integers(3, 6))
            rh = size * 2.0
            top = y + size
            for r in range(rows):
                cells = [_span(rng, prose, int(rng.integers(4, 12))).split(" ")[0] if c == 0 else _number(rng)
                         for c in range(cols)]
                cells = [c[: int(cw / (size * em)) - 1] for c in cells]
                for c, cell in enumerate(cells):
                    text(x0 + c * cw + 5, y, cell, "F2" if r == 0 else "F1", size)
                truth.append(" ".join(cells))
                y -= rh
            bottom = top - rows * rh
            for r in range(rows + 1):
                ops.append(b"0.8 w %.2f %.2f m %.2f %.2f l S" % (x0, top - r * rh, x0 + width, top - r * rh))
            for c in range(cols + 1):
                ops.append(b"0.8 w %.2f %.2f m %.2f %.2f l S" % (x0 + c * cw, top, x0 + c * cw, bottom))
            y = bottom - lead * 1.5
    number = str(int(rng.integers(1, 300)))
    text(PAGE[0] / 2, 40, number, "F1", 9)
    truth.append(number)
    return _pdf(b"\n".join(ops), regular, bold), "\n".join(truth)


def _pdf(content: bytes, regular: str, bold: str) -> bytes:
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /Font << /F1 4 0 R /F2 5 0 R >> >> "
        b"/Contents 6 0 R >>" % (int(PAGE[0]), int(PAGE[1])),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /%s /Encoding /WinAnsiEncoding >>" % regular.encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /%s /Encoding /WinAnsiEncoding >>" % bold.encode(),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--split", default="heldout")
    a = ap.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(a.n):
        pdf, truth = make_page(np.random.default_rng([a.seed, i]), a.split)
        (a.out_dir / f"page-{i:02d}.pdf").write_bytes(pdf)
        (a.out_dir / f"page-{i:02d}.txt").write_text(truth + "\n", encoding="utf-8")
    print(f"wrote {a.n} pages to {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
