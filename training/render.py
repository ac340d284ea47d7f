"""One training sample: a text line drawn in a face, cropped as the page segmenter crops lines,
degraded like a print or a scan, and scaled to the reader's line height.

The crop follows `pantheon_ocr.pipeline.pieces` (a line the segmenter found): the ink box of the line, padded, scaled so its
height is the line height, width rounded up to a multiple of the patch size. Padding, scale,
neighbouring-line fragments, blur, noise, JPEG and resampling are drawn at random so the reader
sees every crop the segmenter can make from real pages.
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
import pypdfium2 as pdfium
from PIL import Image, ImageDraw, ImageFilter

from .fonts import Face, missing_chars
from .texts import SUP

PATCH = 14


# The TeX logos as (La)TeX sets them, written as their text layer has them ("LATEX", "TEX"): an A
# in small type raised to the cap height after the L, an E lowered half an x-height between T and
# X, the letters kerned together. Each piece: (letters, size factor, raise in em, kern before in em).
LOGO_PIECES = {
    "TEX": (("T", 1, 0, 0), ("E", 1, -0.22, -0.1667), ("X", 1, 0, -0.125)),
    # the A's raise: its top at the L's, (1 - 0.72) of a cap height of ~0.7 em
    "LATEX": (("L", 1, 0, 0), ("A", 0.72, 0.2, -0.36), ("T", 1, 0, -0.15), ("E", 1, -0.22, -0.1667), ("X", 1, 0, -0.125)),
}
LOGO_PREFIXES = ("", "pdf", "Lua")  # XeTeX's logo mirrors its E: not drawn


def _logo(word: str) -> tuple[str, str, str] | None:
    """(prefix, logo, trailing punctuation) if the word is a TeX logo (pdfLATEX, LuaTEX, "TEX,")."""
    core = word.rstrip(".,;:)")
    for logo in ("LATEX", "TEX"):
        head = core[: len(core) - len(logo)]
        if core.endswith(logo) and head.lstrip("(") in LOGO_PREFIXES:
            return head, logo, word[len(core):]
    return None


def _draw_word(draw: ImageDraw.ImageDraw | None, x: float, baseline: float, word: str, face: Face, size: int,
               logos: bool, features: list[str] | None = None) -> float:
    """Draw a word with its left end at x on the baseline (or only measure it: draw None): a TeX
    logo set as TeX sets it where `logos`, a footnote mark (after texts.SUP) small and raised, the
    OpenType `features` (old-style figures) applied. Returns its advance."""
    font = face.pil(size)
    if SUP in word:  # a footnote mark: "word", then the mark raised in small type, then the rest
        base, rest = word.split(SUP, 1)
        n = len(rest) - len(rest.lstrip("0123456789*†"))
        small = face.pil(max(4, round(size * 0.62)))
        start = x
        x += _draw_word(draw, x, baseline, base, face, size, logos, features) if base else 0.0
        if draw is not None:
            draw.text((x, baseline - 0.36 * size), rest[:n], font=small, fill=255, anchor="ls")
        x += small.getlength(rest[:n])
        x += _draw_word(draw, x, baseline, rest[n:], face, size, logos, features) if rest[n:] else 0.0
        return x - start
    parts = _logo(word) if logos else None
    if parts is None:
        if draw is not None:
            draw.text((x, baseline), word, font=font, fill=255, anchor="ls", features=features)
        return font.getlength(word, features=features)
    head, logo, tail = parts
    start = x
    if draw is not None and head:
        draw.text((x, baseline), head, font=font, fill=255, anchor="ls")
    x += font.getlength(head)
    for letter, scale, rise, kern in LOGO_PIECES[logo]:
        piece = face.pil(max(4, round(size * scale)))
        x += kern * size
        if draw is not None:
            draw.text((x, baseline - rise * size), letter, font=piece, fill=255, anchor="ls")
        x += piece.getlength(letter)
    if draw is not None and tail:
        draw.text((x, baseline), tail, font=font, fill=255, anchor="ls")
    return x + font.getlength(tail) - start


def _draw_pil(text: str, face: Face, size: int, gaps: list[float], logos: bool = False,
              features: list[str] | None = None) -> np.ndarray:
    """Ink coverage [h, w] float32 in 0..1 for text in a TrueType face at `size` px; the TeX logos
    set as TeX sets them where `logos`, the OpenType `features` applied."""
    font = face.pil(size)
    words = text.split(" ")
    space = font.getlength(" ")
    widths = [_draw_word(None, 0.0, 0.0, w, face, size, logos, features) for w in words]
    total = sum(widths) + sum(space * g for g in gaps)
    margin = size
    img = Image.new("L", (int(total + 2 * margin) + 1, int(size * 2.2)), 0)
    draw = ImageDraw.Draw(img)
    x, baseline = float(margin), size * 0.5 + font.getmetrics()[0]
    for i, (w, width) in enumerate(zip(words, widths)):
        _draw_word(draw, x, baseline, w, face, size, logos, features)
        x += width + (space * gaps[i] if i < len(gaps) else 0)
    return np.asarray(img, dtype=np.float32) / 255


def _pdf_string(text: str) -> bytes:
    raw = text.encode("cp1252", errors="ignore")  # a neighbour line may hold what WinAnsi lacks
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def pdf_line(text: str, base_font: str, word_spacing: float = 0.0, size: float = 12.0) -> tuple[bytes, float, float]:
    """A one-page PDF showing `text` in a standard-14 font; returns (bytes, width pt, height pt)."""
    width = 0.7 * size * len(text) + word_spacing * text.count(" ") + 3 * size
    height = 3 * size
    content = b"BT /F1 %.2f Tf %.2f Tw %.2f %.2f Td %s Tj ET" % (size, word_spacing, 1.5 * size, 1.1 * size, _pdf_string(text))
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %.2f %.2f] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>"
        % (width, height),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /%s /Encoding /WinAnsiEncoding >>" % base_font.encode(),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (i, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref))
    return out.getvalue(), width, height


def _draw_pdf(text: str, face: Face, size: int, word_spacing: float) -> np.ndarray:
    data, _, _ = pdf_line(text, face.source, word_spacing)
    doc = pdfium.PdfDocument(data)
    try:
        page = doc[0]
        bitmap = page.render(scale=size / 12.0, grayscale=True)
        grey = bitmap.to_numpy()[..., 0] if bitmap.to_numpy().ndim == 3 else bitmap.to_numpy()
        ink = (255 - grey.astype(np.float32)) / 255
        page.close()
    finally:
        doc.close()
    return ink


def draw_ink(text: str, face: Face, size: int, rng: np.random.Generator) -> np.ndarray:
    """Ink [h, w] of one line; sometimes with wide gaps between words (table cells, justified text).
    A spaced dot leader's dots stand one drawn distance apart (LaTeX's are ~0.8 em apart, wider
    than a space and a dot)."""
    words = text.split(" ")
    wide = rng.random() < 0.15
    gaps = [float(rng.uniform(1, 6)) if wide and rng.random() < 0.5 else 1.0 for _ in range(len(words) - 1)]
    if ". ." in text:  # a draw only for a line with a spaced leader
        leader = float(rng.uniform(1, 3))
        gaps = [leader if words[i] == "." and (words[i + 1] == "." or i and words[i - 1] == ".") else g
                for i, g in enumerate(gaps)]
    if face.kind == "pdf":
        return _draw_pdf(text, face, size, word_spacing=float(rng.uniform(2, 20)) if wide else 0.0)
    # Old-style figures (a 1 like a small i, a 3 hanging like a y), as Palatino or Libertine set
    # them in LaTeX documents, in a third of the lines with digits in a face that has them.
    oldstyle = face.kind == "ttf" and any(c.isdigit() for c in text) and old_style_figures(face) and rng.random() < 0.3
    return _draw_pil(text, face, size, gaps, logos=True, features=["onum"] if oldstyle else None)


@lru_cache(maxsize=None)
def old_style_figures(face: Face) -> bool:
    """Whether the face draws other digits with its OpenType feature "onum" (217 of 399 here); never
    without Raqm (Pillow's basic layout applies no features: it raises KeyError)."""
    from PIL import features as pil_features

    if not pil_features.check("raqm"):
        return False
    font = face.pil(30)
    drawn = []
    for features in (None, ["onum"]):
        img = Image.new("L", (400, 60), 0)
        ImageDraw.Draw(img).text((5, 5), "1234567890", font=font, fill=255, features=features)
        drawn.append(np.asarray(img))
    return not np.array_equal(*drawn)


def _ink_box(ink: np.ndarray, threshold: float = 0.25) -> tuple[int, int, int, int] | None:
    rows = np.flatnonzero(ink.max(axis=1) > threshold)
    cols = np.flatnonzero(ink.max(axis=0) > threshold)
    if not len(rows) or not len(cols):
        return None
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def line_sample(text: str, face: Face, rng: np.random.Generator, line_height: int, max_width: int,
                neighbour: str | None = None) -> np.ndarray | None:
    """uint8 grey [line_height, W] (W a multiple of 14, <= max_width), or None if it does not fit."""
    if missing_chars(face) & (set(text) - {SUP}):
        return None
    size = int(rng.integers(14, 56))  # font size in px at the drawing resolution
    ink = draw_ink(text, face, size, rng)
    if rng.random() < 0.25:  # slight skew, as in a scan
        angle = float(rng.normal(0, 0.5))
        ink = np.asarray(Image.fromarray(ink).rotate(angle, resample=Image.BICUBIC, expand=True), dtype=np.float32)
    box = _ink_box(ink)
    if box is None:
        return None
    top, bottom, left, right = box
    h = bottom - top
    # The segmenter's padding, varied: vertical 5-30% of the ink height, horizontal a bit more.
    pt, pb = (int(round(h * rng.uniform(0.04, 0.3))) for _ in range(2))
    pl, pr = (int(round(h * rng.uniform(0.05, 0.8))) for _ in range(2))
    canvas = np.zeros((h + pt + pb, right - left + pl + pr), np.float32)
    src = ink[max(0, top - pt): bottom + pb, max(0, left - pl): right + pr]
    oy, ox = max(0, pt - top), max(0, pl - left)
    canvas[oy: oy + src.shape[0], ox: ox + src.shape[1]] = src[: canvas.shape[0] - oy, : canvas.shape[1] - ox]
    if neighbour and rng.random() < 0.2:  # bits of the lines above or below reach into the crop
        other = draw_ink(neighbour, face, size, rng)
        obox = _ink_box(other)
        if obox is not None:
            o = other[obox[0]: obox[1], obox[2]: obox[3]]
            peek = min(int(rng.integers(1, max(2, int(0.2 * canvas.shape[0])))), o.shape[0])
            w = min(o.shape[1], canvas.shape[1])
            if rng.random() < 0.5:
                canvas[:peek, :w] = np.maximum(canvas[:peek, :w], o[-peek:, :w])
            else:
                canvas[-peek:, :w] = np.maximum(canvas[-peek:, :w], o[:peek, :w])
    img = _paper(canvas, rng)
    # Widths drawn around 1.1 of the ink's own: the reader reads a page's crops stretched by its
    # line_stretch hint (1.12 on the dev set's real pages), where letters stand wider apart.
    out_w = int(round(img.width * line_height / img.height * rng.uniform(0.9, 1.3)))
    out_w = max(2 * PATCH, -(-out_w // PATCH) * PATCH)
    if out_w > max_width:
        return None
    img = _degrade(img, rng, (out_w, line_height))
    return np.asarray(img, dtype=np.uint8)


def _paper(ink: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """Ink coverage -> a grey image: paper and ink tones, uneven paper."""
    if rng.random() < 0.1:  # grey or coloured paper, as a slide's block comes out once made grey
        bg = rng.uniform(110, 210)
        fg = rng.uniform(0, bg - 50)
    else:
        bg = rng.uniform(175, 255)
        fg = rng.uniform(0, min(100, bg - 70))
    grey = bg - (bg - fg) * ink
    if rng.random() < 0.3:  # uneven lighting
        grey += np.linspace(0, rng.normal(0, 20), grey.shape[1])[None, :]
    return Image.fromarray(np.clip(grey, 0, 255).astype(np.uint8))


def _degrade(img: Image.Image, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """Print and scan defects at the drawing resolution, then the final resize to (W, line height)."""
    if rng.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    if rng.random() < 0.2:  # dust specks
        a = np.asarray(img).copy()
        n = int(rng.integers(1, 2 + a.size // 400))
        ys, xs = rng.integers(0, a.shape[0], n), rng.integers(0, a.shape[1], n)
        a[ys, xs] = rng.integers(0, 200, n)
        img = Image.fromarray(a)
    if rng.random() < 0.2:  # a low-resolution scan: down, then up again
        f = rng.uniform(1.5, 3.0)
        small = (max(8, int(img.width / f)), max(8, int(img.height / f)))
        img = img.resize(small, Image.BILINEAR).resize(img.size, Image.BICUBIC)
    if rng.random() < 0.25:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=int(rng.integers(20, 90)))
        img = Image.open(io.BytesIO(buf.getvalue())).convert("L")
    img = img.resize(size, Image.BICUBIC if rng.random() < 0.7 else Image.LANCZOS)
    if rng.random() < 0.3:
        a = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(2, 10), (size[1], size[0]))
        img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return img
