"""Synthetic pages to benchmark on: page-like images (PIL) and text PDFs (real PDFium work).
Deterministic for a given seed, so configurations compared side by side read the same pages."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

LETTER_IN = (8.5, 11.0)  # page size in inches (width, height)
A4_IN = (8.27, 11.69)
PAGE_SIZES = {"letter": LETTER_IN, "a4": A4_IN}


def page_pixels(page: str = "letter", longest_edge: int = 1540) -> tuple[int, int]:
    """(width, height) in pixels of a portrait page rendered with its long side at longest_edge."""
    w_in, h_in = PAGE_SIZES[page]
    return round(longest_edge * w_in / h_in), longest_edge


def synthetic_page(width: int, height: int, seed: int = 0):
    """A page-like RGB image: white paper, a title, lines of text, a ruled table (PIL only)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    margin = max(4, width // 12)
    line_h = max(6, height // 70)
    words = ["the", "archive", "ledger", "of", "1897", "page", "total", "river", "north", "account",
             "received", "paid", "office", "committee", "report", "annual", "—", "§", "12.5", "and"]
    y = margin
    draw.text((margin, y), "ANNUAL REPORT " + str(seed), fill="black")
    y += 2 * line_h
    while y < height - margin:
        if rng.random() < 0.08:  # a small table
            rows, cols = int(rng.integers(3, 6)), int(rng.integers(2, 5))
            cw = (width - 2 * margin) // cols
            for r in range(rows + 1):
                draw.line([(margin, y + r * line_h), (margin + cols * cw, y + r * line_h)], fill="black")
            for c in range(cols + 1):
                draw.line([(margin + c * cw, y), (margin + c * cw, y + rows * line_h)], fill="black")
            y += (rows + 1) * line_h
            continue
        text = " ".join(rng.choice(words, size=int(rng.integers(6, 14))))
        draw.text((margin, y), text, fill="black")
        y += line_h
    return img


def synthetic_pdf(path: str | os.PathLike, n_pages: int, seed: int = 0) -> Path:
    """A text PDF of n_pages Letter pages (Helvetica lines, a ruled table), written by hand so
    that rendering it is real PDFium work. Deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    words = ("the archive ledger of 1897 page total river north account received paid office committee "
             "report annual section amount balance carried forward and to by from").split()
    objects: list[bytes] = []  # object i+1

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below
    pages_obj = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    for p in range(n_pages):
        lines = [b"BT /F1 16 Tf 72 740 Td (ANNUAL REPORT - PAGE %d) Tj ET" % (p + 1)]
        y = 712
        while y > 72:
            if rng.random() < 0.06 and y > 160:  # a ruled table
                rows, cols = int(rng.integers(3, 6)), int(rng.integers(2, 5))
                cw = 468 // cols
                for r in range(rows + 1):
                    lines.append(b"72 %d m %d %d l S" % (y - r * 14, 72 + cols * cw, y - r * 14))
                for c in range(cols + 1):
                    lines.append(b"%d %d m %d %d l S" % (72 + c * cw, y, 72 + c * cw, y - rows * 14))
                y -= (rows + 1) * 14
                continue
            text = " ".join(rng.choice(words, size=int(rng.integers(8, 15)))).encode()
            lines.append(b"BT /F1 10 Tf 72 %d Td (%s) Tj ET" % (y, text))
            y -= 13
        stream = b"\n".join(lines)
        content = add(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R >> >> "
                        b"/Contents %d 0 R >>" % (pages_obj, font, content)))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % pages_obj
    objects[pages_obj - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids), n_pages)
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, catalog, xref)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path
