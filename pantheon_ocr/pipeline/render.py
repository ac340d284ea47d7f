"""Documents -> page images, at the model's target size.

`open_pages` opens a document and counts its pages (`count_pages`: the count alone);
`render_page` produces one RGB page image whose longer side is the model's target. PDFs are
rasterised by PDFium straight at that size so the image is never resampled twice (pdf.py);
images go through PIL with the usual clean-ups (here).

PDFium is neither thread-safe nor crash-proof, and a huge image can take a process down, so the
pipeline calls these in worker processes (see `render_pool.py`).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from ..engine.image.images import to_rgb
from ..errors import InputError
from .inputs import Document
from .pagefile import MIN_SIDE, PageCount, fit, stat_regular, too_thin
from .pdf import pdf_pages, render_pdf_page

DEFAULT_LONGEST_EDGE = 1540  # LightOnOCR's mmproj image size

# Same threshold at which PIL itself refuses images (2 x its default MAX_IMAGE_PIXELS), but
# checked by us so that nobody changing PIL's global can switch the guard off. ~179 Mpx is a
# 600-dpi A1 sheet; an RGB copy of it already needs ~540 MB.
MAX_IMAGE_PIXELS = 2 * 89_478_485

def count_pages(doc: Document, password: str | None = None) -> int:
    """Pages of a PDF, frames of a multi-page TIFF, 1 for other images. InputError if the
    document cannot be opened or has no pages."""
    return open_pages(doc, password).n


def open_pages(doc: Document, password: str | None = None) -> PageCount:
    """count_pages, and a note where the file holds more than its pages: the frames of an animated
    GIF, WebP or PNG after the first are not read (they are an animation's, not pages: a spinner
    read frame by frame is its text over and over), and it is said, not left silent."""
    if doc.kind == "pdf":
        return pdf_pages(doc, password)
    with _open_image(doc, None) as img:
        n = _n_frames(img)
        frames = _animation_frames(img)
    return PageCount(n, f"an animated image: only its first frame of {frames} is read" if frames > 1 else "")


def _animation_frames(img: Image.Image) -> int:
    """Frames of an animated GIF, WebP or PNG (1 for anything else: a TIFF's frames are pages, an
    MPO's are one photograph's views)."""
    if img.format not in ("GIF", "WEBP", "PNG"):
        return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return max(1, int(img.n_frames))  # each of the three plugins counts its frames
        except Exception:  # noqa: BLE001 - a damaged animation: its first frame is still read
            return 1


def render_page(
    doc: Document, page_index: int, longest_edge: int = DEFAULT_LONGEST_EDGE, password: str | None = None
) -> Image.Image:
    """Page `page_index` (0-based) as an RGB image whose longer side is `longest_edge` pixels
    (PDFs) or at most that (images are downscaled, never upscaled). Raises InputError."""
    if doc.kind == "pdf":
        return render_pdf_page(doc, page_index, longest_edge, password)
    return _render_image(doc, page_index, longest_edge)


def _open_image(doc: Document, page: int | None) -> Image.Image:
    """Open lazily (header only) with clear errors and the pixel-count guard."""
    stat_regular(doc, page)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # we check ourselves
            img = Image.open(doc.path)
    except Image.DecompressionBombError:
        raise InputError(doc.path, "the image is too large (decompression bomb guard)", page=page) from None
    except UnidentifiedImageError:
        empty = stat_regular(doc, page).st_size == 0
        raise InputError(doc.path, "an empty file (0 bytes)" if empty else "not a readable image (unknown or damaged format)",
                         page=page) from None
    except OSError as e:
        raise _image_read_error(doc, e, page) from None
    w, h = img.size
    if w * h > MAX_IMAGE_PIXELS:
        img.close()
        raise InputError(
            doc.path, f"the image is {w}x{h} px, above the {MAX_IMAGE_PIXELS / 1e6:.0f} Mpx safety limit (decompression bomb guard)", page=page
        )
    return img


_ARITHMETIC_SOF = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # arithmetic-coded JPEGs: no bit-per-block bound


def _jpeg_too_short(path: Path, w: int, h: int) -> bool:
    """Whether a JPEG file is too small for the size its header declares. libjpeg decodes a
    truncated file without an error (the missing part comes out grey, silently wrong), so check
    a bound instead: a Huffman-coded JPEG spends at least one bit on each 8x8 block of its
    luminance (the DC code), so it holds at least w*h/64 bits."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    pos = 2  # after SOI: walk the marker segments to the frame header (SOFn)
    while pos + 4 <= len(head) and head[pos] == 0xFF:
        marker = head[pos + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # not DHT, JPG, DAC
            return marker not in _ARITHMETIC_SOF and size * 8 < w * h // 64
        pos += 2 + int.from_bytes(head[pos + 2:pos + 4], "big")
    return False


def _n_frames(img: Image.Image) -> int:
    """Frames of a TIFF (its pages), 1 for other images. A damaged chain of frames (a file cut
    short) counts the frames found and the one that breaks it, which then fails as its own page:
    the frames before it are still read."""
    if img.format != "TIFF":
        return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's "Corrupt EXIF data" and the like: the page's reason says it
        try:
            return img.n_frames
        except Exception:  # noqa: BLE001 - PIL raises TypeError, ValueError, OSError, ... for a broken IFD
            n = 0
            try:
                while True:
                    img.seek(n)
                    n += 1
            except EOFError:
                n = max(n, 1)
            except Exception:  # noqa: BLE001 - frame n is the broken one
                n += 1
            try:  # PIL took the broken frame for the current one: a seek to it would keep the frame before
                img.seek(0)
            except Exception:  # noqa: BLE001
                pass
            return n


def _image_read_error(doc: Document, e: OSError, page: int | None) -> InputError:
    """An OSError opening or decoding an image: PIL's decoders raise one without an errno for
    damaged data (truncated, bad tiles: the file's own, lasting); with an errno the system's read
    failed (EIO on a network disk: not lasting, read again next time)."""
    if e.errno is None:
        return InputError(doc.path, f"the image data is damaged ({e})", page=page)
    return InputError(doc.path, f"cannot read image: {e.strerror or e}", page=page, lasting=False)


def _render_image(doc: Document, page_index: int, longest_edge: int) -> Image.Image:
    page_no = page_index + 1
    with _open_image(doc, page_no) as img, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's "Corrupt EXIF data" and the like: a failed page says why
        n = _n_frames(img)
        if not 0 <= page_index < n:
            raise InputError(doc.path, f"page {page_no} does not exist (the image has {n} page{'s' * (n != 1)})", page=page_no)
        try:
            if n > 1:
                img.seek(page_index)
                if img.tell() != page_index:  # never another frame's pixels for this page
                    raise InputError(doc.path, f"the image data is damaged (frame {page_no} cannot be found)", page=page_no)
            w, h = img.size  # a TIFF frame has its own size: check it again
            if w * h > MAX_IMAGE_PIXELS:
                raise InputError(doc.path, f"the image is {w}x{h} px, above the safety limit", page=page_no)
            if min(w, h) < MIN_SIDE:
                raise InputError(doc.path, f"the image is too small to read ({w}x{h} px)", page=page_no)
            if img.format == "JPEG" and _jpeg_too_short(doc.path, w, h):
                raise InputError(doc.path, f"the JPEG header says {w}x{h} px but the file is too short to hold that "
                                           "many pixels (truncated or damaged)", page=page_no)
            if img.format == "JPEG" and max(w, h) >= 2 * longest_edge:
                # Let libjpeg decode at 1/2, 1/4 or 1/8 scale (still >= the target): a 20000-px
                # scan then never exists at full size in memory.
                img.draft(img.mode, (math.ceil(w * longest_edge / max(w, h)), math.ceil(h * longest_edge / max(w, h))))
            frame = ImageOps.exif_transpose(img)  # phone photos: honour the orientation tag
            if frame is img:
                frame = img.copy()  # must outlive the file, which closes below
            rgb = to_rgb(frame)
        except InputError:
            raise
        except OSError as e:
            raise _image_read_error(doc, e, page_no) from None
        except (ValueError, SyntaxError, TypeError, EOFError) as e:  # a broken IFD, bad tiles
            raise InputError(doc.path, f"the image data is damaged ({e})", page=page_no) from None
    w, h = rgb.size
    if max(w, h) > longest_edge:
        _, nw, nh = fit(w, h, longest_edge)
        if min(nw, nh) < MIN_SIDE:
            raise InputError(doc.path, too_thin("image", f"{w}x{h} px", nw, nh, longest_edge), page=page_no)
        rgb = rgb.resize((nw, nh), Image.LANCZOS)
    return rgb
