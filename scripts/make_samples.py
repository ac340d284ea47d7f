"""Regenerate the sample PDFs in samples/ (run: python scripts/make_samples.py [out_dir]).

The PDFs are written by hand with a tiny PDF writer below instead of a PDF library, so the
samples depend on nothing but the stdlib and Pillow (for the scanned page) and every byte is
explained here. The output is deterministic: running the script twice gives identical files.
Tests import the writer (via importlib) to build special cases such as rotated or many-page PDFs.
"""

from __future__ import annotations

import hashlib
import io
import random
import struct
import sys
import zlib
from pathlib import Path

PAGE_LETTER = (612, 792)  # points (1/72 inch)
PASSWORD = "pantheon"  # user password of samples/encrypted.pdf
OWNER_PASSWORD = "pantheon-owner"

# The 32-byte padding string of the PDF standard security handler (ISO 32000-1, 7.6.3.3).
_PAD = bytes.fromhex(
    "28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A"
)


def rc4(key: bytes, data: bytes) -> bytes:
    """RC4, the cipher of the PDF 1.4 (revision 3) security handler; slow but tiny inputs."""
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) & 0xFF
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) & 0xFF
        j = (j + s[i]) & 0xFF
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) & 0xFF])
    return bytes(out)


class Rc4Security:
    """Standard security handler, revision 3, 128-bit RC4 (algorithms 2, 3, 5 of ISO 32000-1)."""

    def __init__(self, user_password: str, owner_password: str, file_id: bytes) -> None:
        self.user_password = user_password
        self.owner_password = owner_password
        self.file_id = file_id
        self.permissions = -4  # every permission bit set
        self.key_len = 16  # 128-bit key
        pad = lambda pw: (pw.encode("latin-1") + _PAD)[:32]  # noqa: E731
        # Algorithm 3: the O entry (user password encrypted with a key from the owner password).
        digest = hashlib.md5(pad(self.owner_password)).digest()
        for _ in range(50):
            digest = hashlib.md5(digest[: self.key_len]).digest()
        okey = digest[: self.key_len]
        o = rc4(okey, pad(self.user_password))
        for i in range(1, 20):
            o = rc4(bytes(b ^ i for b in okey), o)
        self.o = o
        # Algorithm 2: the file encryption key.
        digest = hashlib.md5(
            pad(self.user_password) + o + struct.pack("<i", self.permissions) + self.file_id
        ).digest()
        for _ in range(50):
            digest = hashlib.md5(digest[: self.key_len]).digest()
        self.key = digest[: self.key_len]
        # Algorithm 5: the U entry.
        u = rc4(self.key, hashlib.md5(_PAD + self.file_id).digest())
        for i in range(1, 20):
            u = rc4(bytes(b ^ i for b in self.key), u)
        self.u = u + bytes(16)

    def encrypt(self, num: int, gen: int, data: bytes) -> bytes:
        # Algorithm 1: a per-object key from the file key, object number and generation.
        okey = hashlib.md5(self.key + struct.pack("<i", num)[:3] + struct.pack("<i", gen)[:2]).digest()
        return rc4(okey[: min(self.key_len + 5, 16)], data)

    def dictionary(self) -> bytes:
        return (
            b"<< /Filter /Standard /V 2 /R 3 /Length 128 /P %d /O <%s> /U <%s> >>"
            % (self.permissions, self.o.hex().encode(), self.u.hex().encode())
        )


class PdfWriter:
    """Collects indirect objects (dictionary text + optional stream) and serialises them."""

    def __init__(self) -> None:
        self.objects: list[tuple[bytes, bytes | None]] = []

    def add(self, body: str | bytes, stream: bytes | None = None, compress: bool = True) -> int:
        body = body.encode("latin-1") if isinstance(body, str) else body
        if stream is not None and compress:
            stream = zlib.compress(stream, 9)
            body = body.rstrip()[:-2] + b" /Filter /FlateDecode >>"
        self.objects.append((body, stream))
        return len(self.objects)

    def reserve(self) -> int:
        self.objects.append((b"null", None))
        return len(self.objects)

    def set(self, num: int, body: str | bytes) -> None:
        self.objects[num - 1] = (body.encode("latin-1") if isinstance(body, str) else body, None)

    def build(self, root: int, security: Rc4Security | None = None, file_id: bytes | None = None) -> bytes:
        file_id = security.file_id if security else (file_id or hashlib.md5(b"pantheon").digest())
        out = io.BytesIO()
        out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")  # binary comment marks the file as binary
        offsets = []
        for num, (body, stream) in enumerate(self.objects, start=1):
            offsets.append(out.tell())
            out.write(b"%d 0 obj\n" % num)
            if stream is None:
                out.write(body + b"\nendobj\n")
                continue
            if security is not None:
                stream = security.encrypt(num, 0, stream)
            out.write(body.rstrip()[:-2] + b" /Length %d >>\nstream\n" % len(stream))
            out.write(stream + b"\nendstream\nendobj\n")
        trailer_extra = b""
        if security is not None:
            offsets.append(out.tell())
            enc_num = len(offsets)
            out.write(b"%d 0 obj\n%s\nendobj\n" % (enc_num, security.dictionary()))
            trailer_extra = b" /Encrypt %d 0 R" % enc_num
        xref = out.tell()
        out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1))
        for off in offsets:
            out.write(b"%010d 00000 n \n" % off)
        ident = file_id.hex().encode()
        out.write(
            b"trailer\n<< /Size %d /Root %d 0 R /ID [<%s> <%s>]%s >>\nstartxref\n%d\n%%%%EOF\n"
            % (len(offsets) + 1, root, ident, ident, trailer_extra, xref)
        )
        return out.getvalue()


def pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


class Canvas:
    """A page content stream with just what the samples need: text, lines, boxes, images."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def text(self, x: float, y: float, text: str, size: float = 11, font: str = "F1") -> None:
        self.ops.append(f"BT /{font} {size} Tf {x} {y} Td {pdf_string(text)} Tj ET")

    def line(self, x0: float, y0: float, x1: float, y1: float, width: float = 0.8) -> None:
        self.ops.append(f"{width} w {x0} {y0} m {x1} {y1} l S")

    def rect(self, x: float, y: float, w: float, h: float, gray: float) -> None:
        self.ops.append(f"q {gray} g {x} {y} {w} {h} re f Q")

    def image(self, name: str, x: float, y: float, w: float, h: float) -> None:
        self.ops.append(f"q {w} 0 0 {h} {x} {y} cm /{name} Do Q")

    def data(self) -> bytes:
        return "\n".join(self.ops).encode("latin-1")


def build_pdf(
    pages: list[Canvas | None],
    size: tuple[float, float] = PAGE_LETTER,
    security: Rc4Security | None = None,
    images: dict[str, tuple[int, int, bytes]] | None = None,
    rotate: dict[int, int] | None = None,
) -> bytes:
    """A PDF with one page per canvas (None = blank page); Helvetica as F1, Helvetica-Bold as F2.

    images maps an XObject name to (width, height, grayscale JPEG bytes); rotate maps a 0-based
    page index to its /Rotate value.
    """
    w = PdfWriter()
    catalog = w.reserve()
    pages_num = w.reserve()
    font = w.add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    bold = w.add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>")
    xobjects = []
    for name, (iw, ih, jpeg) in (images or {}).items():
        num = w.add(
            f"<< /Type /XObject /Subtype /Image /Width {iw} /Height {ih} /ColorSpace /DeviceGray "
            "/BitsPerComponent 8 /Filter /DCTDecode >>",
            jpeg,
            compress=False,
        )
        xobjects.append(f"/{name} {num} 0 R")
    resources = f"<< /Font << /F1 {font} 0 R /F2 {bold} 0 R >> /XObject << {' '.join(xobjects)} >> >>"
    kids = []
    for index, canvas in enumerate(pages):
        content = w.add("<< >>", (canvas or Canvas()).data())
        extra = f" /Rotate {rotate[index]}" if rotate and index in rotate else ""
        kids.append(
            w.add(
                f"<< /Type /Page /Parent {pages_num} 0 R /MediaBox [0 0 {size[0]} {size[1]}]"
                f" /Resources {resources} /Contents {content} 0 R{extra} >>"
            )
        )
    w.set(pages_num, f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>")
    w.set(catalog, f"<< /Type /Catalog /Pages {pages_num} 0 R >>")
    return w.build(catalog, security=security)


def numbered_pages(n: int, size: tuple[float, float] = PAGE_LETTER) -> bytes:
    """n pages that each say which page they are (for order and memory tests)."""
    pages = []
    for i in range(n):
        c = Canvas()
        c.text(72, size[1] - 96, f"Page {i + 1} of {n}", size=28, font="F2")
        c.text(72, size[1] - 140, f"This is the body text of page number {i + 1}.")
        pages.append(c)
    return build_pdf(pages, size=size)


# ----------------------------------------------------------------------------------- samples


def text_1page() -> bytes:
    c = Canvas()
    c.text(72, 700, "Pantheon OCR sample document", size=20, font="F2")
    lines = [
        "This single page holds plain running text set in Helvetica.",
        "It is the smallest useful input for an OCR run: one page, one column,",
        "no images. The quick brown fox jumps over the lazy dog 0123456789.",
        "Accented letters: caf\xe9, na\xefve, \xe9l\xe8ve, Stra\xdfe.",
    ]
    for i, line in enumerate(lines):
        c.text(72, 660 - 18 * i, line)
    c.text(300, 40, "1", size=9)
    return build_pdf([c])


def report_3pages() -> bytes:
    p1 = Canvas()
    p1.text(72, 710, "Quarterly Report", size=24, font="F2")
    p1.text(72, 680, "1. Summary", size=14, font="F2")
    body = [
        "Revenue grew in every region during the quarter, led by the northern",
        "division. Costs stayed flat, so the operating margin improved by two",
        "points. The table on page 2 gives the figures per region.",
    ]
    for i, line in enumerate(body):
        p1.text(72, 655 - 16 * i, line)
    p1.text(72, 590, "2. Outlook", size=14, font="F2")
    p1.text(72, 565, "We expect similar growth next quarter.")
    p2 = Canvas()
    p2.text(72, 710, "Table 1: Revenue per region (kEUR)", size=14, font="F2")
    rows = [
        ("Region", "Q1", "Q2", "Change"),
        ("North", "1,200", "1,380", "+15%"),
        ("South", "950", "990", "+4%"),
        ("East", "720", "810", "+13%"),
        ("West", "1,040", "1,065", "+2%"),
        ("Total", "3,910", "4,245", "+9%"),
    ]
    x_cols = [72, 222, 322, 422, 522]
    top, row_h = 690, 24
    p2.rect(72, top - row_h, 450, row_h, 0.85)  # shaded header row
    for r, row in enumerate(rows):
        y = top - row_h * (r + 1) + 8
        for col, cell in enumerate(row):
            p2.text(x_cols[col] + 6, y, cell, font="F2" if r == 0 else "F1")
    for r in range(len(rows) + 1):
        p2.line(72, top - row_h * r, 522, top - row_h * r)
    for x in x_cols:
        p2.line(x, top, x, top - row_h * len(rows))
    p3 = Canvas()
    p3.text(72, 710, "3. Notes", size=14, font="F2")
    left = ["Figures are unaudited.", "Currency: euro.", "Rounded to kEUR."]
    right = ["Contact: finance team.", "Next report: July.", "Page 3 of 3."]
    for i, (a, b) in enumerate(zip(left, right)):
        p3.text(72, 680 - 16 * i, a)
        p3.text(320, 680 - 16 * i, b)
    for i, c in enumerate((p1, p2, p3)):
        c.text(290, 40, f"Page {i + 1} of 3", size=9)
    return build_pdf([p1, p2, p3])


SCANNED_TITLE = "INVOICE No. 2024-0117"
SCANNED_LINES = [
    "Date: 12 March 2024",
    "Customer: Acme Documents Ltd.",
    "",
    "1 x Archive scanning service      480.00",
    "2 x Storage box (large)            36.50",
    "1 x Delivery                       12.00",
    "",
    "Total due:                        565.00",
    "Payment within 30 days.",
]


def scanned_jpeg(width: int = 744, height: int = 963) -> bytes:
    """A grey page image that looks scanned: text, slight skew, blur, speckles, grey paper."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    img = Image.new("L", (width, height), 236)
    draw = ImageDraw.Draw(img)
    title = ImageFont.load_default(size=30)
    font = ImageFont.load_default(size=18)
    draw.text((70, 70), SCANNED_TITLE, font=title, fill=25)
    lines = SCANNED_LINES
    for i, line in enumerate(lines):
        draw.text((70, 140 + 30 * i), line, font=font, fill=35)
    img = img.rotate(0.8, resample=Image.BICUBIC, fillcolor=236)  # a slightly skewed scan
    img = img.filter(ImageFilter.GaussianBlur(0.7))
    rng = random.Random(7)
    px = img.load()
    for _ in range(1500):  # dust specks
        x, y = rng.randrange(width), rng.randrange(height)
        px[x, y] = rng.randrange(90, 200)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=40, optimize=True)
    return buf.getvalue()


def scanned() -> bytes:
    jpeg = scanned_jpeg()
    c = Canvas()
    c.image("Scan", 0, 0, PAGE_LETTER[0], PAGE_LETTER[1])
    return build_pdf([c], images={"Scan": (744, 963, jpeg)})


def scanned_truth() -> bytes:
    """What the scanned page says (it has no text layer): the reference for OCR accuracy."""
    return "\n".join([SCANNED_TITLE] + [line for line in SCANNED_LINES if line]).encode() + b"\n"


def encrypted() -> bytes:
    c = Canvas()
    c.text(72, 700, "Confidential", size=20, font="F2")
    c.text(72, 670, "This page can only be read with the password.")
    security = Rc4Security(PASSWORD, OWNER_PASSWORD, file_id=hashlib.md5(b"encrypted-sample").digest())
    return build_pdf([c], security=security)


def corrupt() -> bytes:
    # A real failure mode: a download cut off after the header and part of the first object.
    # PDFium repairs many broken files, so this keeps too little for any repair to find a page tree.
    full = text_1page()
    return full[:120]


def zero_pages() -> bytes:
    return build_pdf([])


SAMPLES = {
    "docs/text-1page.pdf": text_1page,
    "docs/report-3pages.pdf": report_3pages,
    "docs/scanned.pdf": scanned,
    "truth/scanned.txt": scanned_truth,
    "bad/encrypted.pdf": encrypted,
    "bad/corrupt.pdf": corrupt,
    "bad/zero-pages.pdf": zero_pages,
}


def main(out_dir: str | None = None) -> None:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent.parent / "samples"
    out.mkdir(parents=True, exist_ok=True)
    for name, make in SAMPLES.items():
        data = make()
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
        print(f"{out / name}  {len(data):,} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:2])
