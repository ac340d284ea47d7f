"""PDFs through PDFium: the one open document of a process, opened with or without the password
given (a failure told from the file's bytes: damaged, encrypted, not a PDF, the system's read),
the pages of its page tree, a page rendered straight at the target size, and its text layer.

PDFium is neither thread-safe nor crash-proof: every call holds `_PDFIUM_LOCK`, and the pipeline
calls these in worker processes (render_pool.py) through render.py.
"""

from __future__ import annotations

import math
import os
import re
import threading
from pathlib import Path

from PIL import Image

from ..errors import InputError
from .inputs import Document
from .pagefile import MIN_SIDE, PageCount, fit, stat_regular, too_thin

# PDFium error codes (fpdfview.h). FPDF_GetLastError is NOT reset by a successful call, so a
# code can be stale (left over from an earlier failure in the same process); see _pdf_problem.
_FPDF_ERR_PASSWORD = 4
_FPDF_ERR_SECURITY = 6

_PDFIUM_LOCK = threading.Lock()
# One open PDF per process: workers render consecutive pages of the same document, and
# re-opening a big PDF for every page would re-parse its cross-reference table each time.
# "pdf": (key, the open document); "read through": the key of one whose file _page_failure read whole
_pdf_cache: dict[str, tuple] = {}


def pdf_pages(doc: Document, password: str | None) -> PageCount:
    """The pages of the PDF's page tree (_pdf_pages), the document opened (or kept open)."""
    with _PDFIUM_LOCK:
        return _pdf_pages(doc, _cached_pdf(doc, password))


def render_pdf_page(doc: Document, page_index: int, longest_edge: int, password: str | None) -> Image.Image:
    with _PDFIUM_LOCK:
        return _render_pdf_page(doc, page_index, longest_edge, password)


MISSING_RUN = 256  # pages in a row not found in a PDF's page tree: it ends before them (_pdf_pages)


def _pdf_pages(doc: Document, pdf) -> PageCount:
    """The pages of the PDF's page tree. The count a PDF declares (/Count, what PDFium's page
    count says) can be more than its tree holds: a damaged or hostile 1-page file declaring a
    million pages was read as a million failed pages (a night's archive job, a 75 MB Markdown).
    Where the last declared page is not there, the pages are counted from the first: the tree
    ends after the last page found before MISSING_RUN pages in a row are not; a page not found
    before that is still a page (it fails as one, damaged), and a note says what was declared.
    Finding a page reads its dictionary, not its contents: a page found is a lookup in PDFium's
    list, a page not there a walk of the tree, so the count costs MISSING_RUN walks, not one per
    page declared. A file that cannot be read through is the system's failure (PDFium reads
    lazily): then nothing is decided about its pages."""
    import pypdfium2.raw as pdfium_c

    declared, size = len(pdf), pdfium_c.FS_SIZEF()

    def there(index: int) -> bool:
        return bool(pdfium_c.FPDF_GetPageSizeByIndexF(pdf.raw, index, size))

    if there(declared - 1):
        return PageCount(declared)
    found = index = 0
    while index < declared and index - found < MISSING_RUN:
        found, index = (index + 1 if there(index) else found), index + 1
    while found < declared and there(found):  # PDFium finds some pages at the second asking only
        found += 1
    if found == declared:
        return PageCount(declared)
    error = _read_error(doc)
    if error is not None:
        raise InputError(doc.path, f"cannot read file: {error.strerror or error}", lasting=False)
    pages = f"{declared} page{'s' * (declared > 1)}"
    if found == 0:
        raise InputError(doc.path, f"the PDF declares {pages}, but its page tree holds no page")
    missing = f"page {declared} is" if found + 1 == declared else f"pages {found + 1}-{declared} are"
    return PageCount(found, f"the PDF declares {pages}, but its page tree ends after page {found}: {missing} not there")


def text_layer(doc: Document, page_index: int, password: str | None = None) -> str:
    """The PDF page's own text layer (what a text-selecting PDF viewer would copy): the fallback
    for a page whose OCR failed. "" for images and pages without text. Raises InputError."""
    return text_layer_and_cover(doc, page_index, password, cover=False)[0]


def text_layer_and_cover(doc: Document, page_index: int, password: str | None = None,
                         cover: bool = True) -> tuple[str, float, float, float]:
    """(text layer, share of the page its images cover, share its text objects cover, share of
    its characters that run sideways): a page that is a scan with a line of real text on it (a
    download stamp, a page number) has a text layer that is no transcript of it, and sideways text
    comes out with its lines glued or reversed. Shares of the page's area are capped at 1.

    The text is read with the page's /Rotate set aside: PDFium orders the lines of a page turned
    by 90 degrees bottom to top and the words of one turned by 180 right to left, where the page's
    own upright text reads in order. Text that runs sideways on the page (SIDEWAYS of it: a
    landscape table set on a portrait page, shown upright by /Rotate) reads in order only with
    the page's /Rotate, so it is read again with it."""
    if doc.kind != "pdf":
        return "", 0.0, 0.0, 0.0
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    images = texts = sideways = 0.0
    with _PDFIUM_LOCK:
        pdf = _cached_pdf(doc, password)
        if not 0 <= page_index < len(pdf):
            return "", 0.0, 0.0, 0.0
        try:
            page = pdf[page_index]
            try:
                rotation = page.get_rotation()
                page.set_rotation(0)  # in memory only, and put back: the cached document also renders
                try:
                    text, sideways = _read_text(page, pdfium_c)
                finally:
                    page.set_rotation(rotation)
                if sideways >= SIDEWAYS and rotation:
                    text = _read_text(page, pdfium_c)[0]
                if cover:
                    width, height = page.get_size()
                    area = max(width * height, 1e-9)
                    for obj in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE, pdfium_c.FPDF_PAGEOBJ_TEXT]):
                        left, bottom, right, top = obj.get_bounds()
                        share = max(0.0, right - left) * max(0.0, top - bottom) / area
                        if obj.type == pdfium_c.FPDF_PAGEOBJ_IMAGE:
                            images += share
                        else:
                            texts += share
            finally:
                page.close()
        except pdfium.PdfiumError as e:
            raise InputError(doc.path, f"PDFium cannot read the page's text layer ({e})", page=page_index + 1) from None
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")).strip()
    return text, min(images, 1.0), min(texts, 1.0), sideways


SIDEWAYS = 0.5  # a page whose characters run sideways at least this much: its text is sideways


def _read_text(page, pdfium_c) -> tuple[str, float]:
    """(the page's text as it is turned now, the share of its characters that run sideways)."""
    textpage = page.get_textpage()
    try:
        return textpage.get_text_bounded(), _sideways_share(pdfium_c, textpage)
    finally:
        textpage.close()


def _sideways_share(pdfium_c, textpage, most: int = 2000) -> float:
    """The share of a text page's characters (up to `most`, spread over the page) whose baseline
    is more than 10 degrees off the horizontal, upright or upside down."""
    n = textpage.count_chars()
    if n <= 0:
        return 0.0
    angles = [pdfium_c.FPDFText_GetCharAngle(textpage.raw, i) for i in range(0, n, max(1, n // most))]
    angles = [a % math.pi for a in angles if a >= 0]  # radians; -1 for a character without one
    return sum(min(a, math.pi - a) > math.radians(10) for a in angles) / max(len(angles), 1)


def clear_pdf_cache() -> None:
    """Close the cached open PDF (workers call this before exiting)."""
    with _PDFIUM_LOCK:
        entry = _pdf_cache.pop("pdf", None)
        if entry is not None:
            entry[1].close()


def _cached_pdf(doc: Document, password: str | None):
    import pypdfium2 as pdfium  # lazy: importing this module must stay cheap

    st = stat_regular(doc, None)
    key = (str(doc.path), password, st.st_mtime_ns, st.st_size)
    entry = _pdf_cache.get("pdf")
    if entry is not None and entry[0] == key:
        return entry[1]
    if entry is not None:
        _pdf_cache.pop("pdf")[1].close()
    try:
        pdf = _open_pdf(pdfium, doc.path, password)
    except pdfium.PdfiumError as e:
        problem, lasting = _pdf_problem(doc.path, e.err_code, password)
        raise InputError(doc.path, problem, option="password" if problem in PASSWORD_PROBLEMS else None,
                         lasting=lasting) from None
    except OSError as e:
        raise InputError(doc.path, f"cannot read file: {e.strerror or e}", lasting=False) from None
    if len(pdf) == 0:
        pdf.close()
        raise InputError(doc.path, "the PDF has no pages")
    try:
        pdf.init_forms()  # so filled-in form fields are drawn: their values are text to read
    except pdfium.PdfiumError:
        pass  # a broken form layer should not cost the page content
    _pdf_cache["pdf"] = (key, pdf)
    return pdf


def _open_pdf(pdfium, path: Path, password: str | None):
    """The PDF, opened with the password given, or without one where it fails: one password is
    given for a whole batch, and a PDF with only an owner password (it may be printed, not
    edited) opens without any, whatever that password was meant for."""
    try:
        return pdfium.PdfDocument(path, password=password)
    except pdfium.PdfiumError as e:
        if password is None or e.err_code != _FPDF_ERR_PASSWORD:
            raise
        try:
            return pdfium.PdfDocument(path, password=None)
        except pdfium.PdfiumError:
            raise e from None  # the given password's failure is the one to say


# An encrypted PDF opened without its password, or with a wrong one: the password setting mends it
PASSWORD_PROBLEMS = ("the PDF is encrypted: a password is needed", "wrong password for this encrypted PDF")


def _pdf_problem(path: Path, err_code: int | None, password: str | None) -> tuple[str, bool]:
    """Turn a PDFium load failure into a clear problem text, and whether it is the file's own
    (InputError.lasting). The error code can be stale (a zero-page PDF fails without setting
    one), so look at the bytes before trusting it. PDFium reads the file itself: a read the
    system failed (EIO) reaches us as its load failure, told apart by reading the bytes here."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
            f.seek(max(0, os.fstat(f.fileno()).st_size - (1 << 20)))
            tail = f.read()
    except OSError as e:
        return f"cannot read file: {e.strerror or e}", False
    return _pdf_bytes_problem(head, tail, err_code, password), True


def _pdf_bytes_problem(head: bytes, tail: bytes, err_code: int | None, password: str | None) -> str:
    if not head:
        return "an empty file (0 bytes)"
    if b"%PDF-" not in head[:1024]:
        return "not a PDF file (no %PDF header)"
    encrypted = b"/Encrypt" in head or b"/Encrypt" in tail
    if encrypted and err_code == _FPDF_ERR_PASSWORD:
        return PASSWORD_PROBLEMS[password is not None]
    if encrypted and err_code == _FPDF_ERR_SECURITY:
        return "the PDF uses an unsupported encryption (security handler)"
    if re.search(rb"/Count\s+0\b", head + tail) and not re.search(rb"/Type\s*/Page\b(?!s)", head + tail):
        return "the PDF has no pages"
    return "the PDF is damaged or truncated and cannot be opened"


def _render_pdf_page(doc: Document, page_index: int, longest_edge: int, password: str | None) -> Image.Image:
    import pypdfium2 as pdfium

    page_no = page_index + 1
    pdf = _cached_pdf(doc, password)
    n = len(pdf)
    if not 0 <= page_index < n:
        raise InputError(doc.path, f"page {page_no} does not exist (the PDF has {n} pages)", page=page_no)
    try:
        page = pdf[page_index]
    except pdfium.PdfiumError:
        raise _page_failure(doc, page_no, "the page cannot be loaded (damaged page object)") from None
    try:
        width, height = page.get_size()  # points, already swapped for /Rotate 90/270
        if not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
            raise InputError(doc.path, f"the page has an invalid size ({width}x{height} pt)", page=page_no)
        scale, w, h = fit(width, height, longest_edge)
        if min(w, h) < MIN_SIDE:
            raise InputError(doc.path, too_thin("page", f"{width:g}x{height:g} pt", w, h, longest_edge), page=page_no)
        bitmap = page.render(scale=scale, rev_byteorder=True, fill_color=(255, 255, 255, 255), may_draw_forms=True)
        img = bitmap.to_pil()  # RGB; PIL copies 3-byte formats, so the bitmap can be freed
        return img if img.mode == "RGB" else img.convert("RGB")
    except pdfium.PdfiumError as e:
        raise _page_failure(doc, page_no, f"PDFium cannot render the page ({e})") from None
    finally:
        page.close()


def _page_failure(doc: Document, page_no: int, problem: str) -> InputError:
    """A page PDFium could not load or render: the page's own damage (lasting), unless the file
    cannot be read through now. PDFium reads the file as pages need it, so a read the system
    failed (EIO on a network disk) reaches us as the page's failure; then it is the system's
    (not lasting), and the open document is marked stale so that the next try opens the file again.
    Read through only here, on a failure, and once for the open document: the other damaged pages
    of a file read through whole are the pages' own."""
    error = _read_error(doc)
    if error is not None:
        return InputError(doc.path, f"cannot read file: {error.strerror or error}", page=page_no, lasting=False)
    return InputError(doc.path, problem, page=page_no)


def _read_error(doc: Document) -> OSError | None:
    """Why the open PDF's file cannot be read through now (None: it can). Read once for the open
    document; where it fails, the document is marked stale, so that the next page closes it and
    opens the file again (_cached_pdf)."""
    opened = (_pdf_cache.get("pdf") or (None,))[0]
    if opened is not None and _pdf_cache.get("read through") == opened:
        return None
    try:
        with open(doc.path, "rb") as f:
            while f.read(1 << 24):
                pass
    except OSError as e:
        entry = _pdf_cache.get("pdf")
        if entry is not None:
            _pdf_cache["pdf"] = (None, entry[1])
        return e
    _pdf_cache["read through"] = opened
    return None
