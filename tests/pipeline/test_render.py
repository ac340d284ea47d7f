"""pipeline/inputs.py and render.py: inputs -> documents, page counting, page specs, rendering of PDFs and images."""

from __future__ import annotations

import io
import os
import re
import struct
import zlib
from pathlib import Path, PurePath

import numpy as np
import pytest
from PIL import Image

from fake_engine import SAMPLES, make_samples_module
from pantheon_ocr.errors import ExitCode, InputError, UsageError
from pantheon_ocr.pipeline.inputs import Document, expand_inputs, make_document, pages_past_end, parse_pages, validate_page_spec
from pantheon_ocr.pipeline.render import MAX_IMAGE_PIXELS, PageCount, count_pages, open_pages, render_page

ms = make_samples_module()


def touch(path: Path, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------ inputs


def test_expand_folder_recursive_sorted_filtered(tmp_path):
    for rel in ["b.pdf", "a.PNG", "sub/c.jpg", "sub/deep/d.tiff", "notes.txt", ".hidden.pdf", ".git/x.pdf", "sub/._e.pdf"]:
        touch(tmp_path / "in" / rel)
    docs = expand_inputs([str(tmp_path / "in")])
    assert [str(d.rel) for d in docs] == ["a.PNG", "b.pdf", "sub/c.jpg", "sub/deep/d.tiff"]
    assert [d.kind for d in docs] == ["image", "pdf", "image", "image"]
    assert all(d.path.is_absolute() for d in docs)


def test_linked_folders_are_read_once_and_loops_end(tmp_path):
    """A folder of scans linked into the input folder is read (it was passed over in silence);
    a link back up (a loop), a second link to the same folder and a link to a folder inside the
    input folder add nothing."""
    touch(tmp_path / "in" / "a.pdf")
    touch(tmp_path / "elsewhere" / "scan1.png")
    touch(tmp_path / "elsewhere" / "deep" / "scan2.png")
    (tmp_path / "in" / "scans").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "in" / "scans-again").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "deep" / "up").symlink_to(tmp_path / "in")  # a loop through the link
    (tmp_path / "in" / "gone").symlink_to(tmp_path / "nowhere")  # a dangling link: no document name
    docs = expand_inputs([str(tmp_path / "in")])
    assert [str(d.rel) for d in docs] == ["a.pdf", "scans/deep/scan2.png", "scans/scan1.png"]
    # a link to a folder inside the input folder, sorting before it: its documents keep their names
    touch(tmp_path / "in" / "b" / "x.pdf")
    (tmp_path / "in" / "a-link").symlink_to(tmp_path / "in" / "b")
    (tmp_path / "in" / "b" / "loop").symlink_to(tmp_path / "in")
    docs = expand_inputs([str(tmp_path / "in")])
    assert [str(d.rel) for d in docs] == ["a.pdf", "b/x.pdf", "scans/deep/scan2.png", "scans/scan1.png"]
    # archive jobs follow no linked folder
    assert [str(d.rel) for d in expand_inputs([str(tmp_path / "in")], follow_links=False)] == ["a.pdf", "b/x.pdf"]


def test_expand_files_globs_order_and_dedupe(tmp_path):
    a = touch(tmp_path / "x" / "a.pdf")
    touch(tmp_path / "x" / "b.webp")
    touch(tmp_path / "x" / "y" / "c.bmp")
    touch(tmp_path / "x" / "z.txt")
    docs = expand_inputs([str(tmp_path / "x" / "b.webp"), str(tmp_path / "x" / "**" / "*"), str(a)])
    assert [d.path.name for d in docs] == ["b.webp", "a.pdf", "c.bmp"]  # given order, then sorted, no repeats
    assert docs[0].rel == PurePath("b.webp")
    assert docs[2].rel == PurePath("y/c.bmp")  # relative to the glob's base folder


def test_doc_id_is_stable_and_distinct(tmp_path):
    a, b = touch(tmp_path / "1" / "r.pdf"), touch(tmp_path / "2" / "r.pdf")
    d1, d2 = expand_inputs([str(a), str(b)])
    assert d1.doc_id == make_document(a).doc_id == expand_inputs([str(a)])[0].doc_id
    assert d1.doc_id != d2.doc_id and len(d1.doc_id) == 16
    with pytest.raises(Exception):
        d1.kind = "image"  # frozen


@pytest.mark.parametrize(
    "item, problem",
    [
        ("missing.pdf", "no such file or folder"),
        ("*.nothing", "no PDF or image files match this pattern"),
        ("empty", "folder contains no PDF or image files"),
        ("notes.txt", "not a PDF or a supported image"),
    ],
)
def test_expand_errors_name_the_input(tmp_path, monkeypatch, item, problem):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    touch(tmp_path / "empty" / "readme.txt")
    touch(tmp_path / "notes.txt", b"hello")
    with pytest.raises(InputError) as e:
        expand_inputs([item])
    assert e.value.path == item and problem in e.value.problem
    assert e.value.exit_code == ExitCode.INPUT_UNREADABLE


def test_named_file_with_odd_extension_is_sniffed(tmp_path):
    pdf = touch(tmp_path / "download.bin", (SAMPLES / "docs/text-1page.pdf").read_bytes())
    png = tmp_path / "picture"
    Image.new("RGB", (40, 40)).save(png, "PNG")
    assert [d.kind for d in expand_inputs([str(pdf), str(png)])] == ["pdf", "image"]


# ------------------------------------------------------------------------------- pages


def test_count_pages(tmp_path):
    assert count_pages(make_document(SAMPLES / "docs/text-1page.pdf")) == 1
    assert count_pages(make_document(SAMPLES / "docs/report-3pages.pdf")) == 3
    assert count_pages(make_document(SAMPLES / "bad/encrypted.pdf"), password=ms.PASSWORD) == 1
    frames = [Image.new("L", (64, 48), 40 * i) for i in range(3)]
    frames[0].save(tmp_path / "multi.tif", save_all=True, append_images=frames[1:])
    Image.new("RGB", (30, 30)).save(tmp_path / "one.png")
    assert count_pages(make_document(tmp_path / "multi.tif")) == 3
    assert count_pages(make_document(tmp_path / "one.png")) == 1


def declaring(pdf: bytes, count: int) -> bytes:
    """`pdf` with its page tree's /Count replaced (one digit for one: the offsets stay right)."""
    (old,) = re.findall(rb"/Count (\d)\b", pdf)
    assert len(str(count)) == len(old)
    return pdf.replace(b"/Count " + old, b"/Count %d" % count)


def test_a_pdf_declaring_more_pages_than_its_page_tree_holds_is_the_pages_it_holds(tmp_path):
    """PDFium's page count is the /Count a PDF declares: a 1-page file declaring 100,000 was read
    as 99,999 failed pages, and one declaring a million ran for minutes on end. The pages are
    those of the page tree, and a note says what was declared; a damaged page among them is
    still a page."""
    from fake_engine import marked_pdf

    (tmp_path / "two.pdf").write_bytes(declaring(marked_pdf(2), 7))
    assert open_pages(make_document(tmp_path / "two.pdf")) == PageCount(
        2, "the PDF declares 7 pages, but its page tree ends after page 2: pages 3-7 are not there")
    (tmp_path / "one.pdf").write_bytes(declaring(marked_pdf(1), 2))
    assert open_pages(make_document(tmp_path / "one.pdf")).note.endswith("ends after page 1: page 2 is not there")
    assert render_page(make_document(tmp_path / "one.pdf"), 0, 200).size == (155, 200)
    # a million declared (PDFium's most), rewritten by hand: PDFium mends the offsets
    (tmp_path / "many.pdf").write_bytes(marked_pdf(1).replace(b"/Count 1", b"/Count 1000000"))
    assert open_pages(make_document(tmp_path / "many.pdf")) == PageCount(
        1, "the PDF declares 1000000 pages, but its page tree ends after page 1: pages 2-1000000 are not there")
    # the tree's second of three pages is a font, not a page: damaged, and still page 2 of 3
    three = marked_pdf(3)
    kids = re.search(rb"/Kids \[(\d+) 0 R (\d+) 0 R", three)
    font = re.search(rb"(\d+) 0 obj\s*<<\s*/Type\s*/Font", three).group(1)
    (tmp_path / "three.pdf").write_bytes(three.replace(kids.group(0), kids.group(0).replace(
        b"%s 0 R" % kids.group(2), (b"%s 0 R" % font).rjust(len(kids.group(2)) + 4))))
    assert open_pages(make_document(tmp_path / "three.pdf")) == PageCount(3)
    with pytest.raises(InputError, match="page 2: the page cannot be loaded"):
        render_page(make_document(tmp_path / "three.pdf"), 1, 200)
    # the first two are fonts: two damaged pages, and the third found
    (tmp_path / "front.pdf").write_bytes(three.replace(kids.group(0), kids.group(0).replace(
        b"%s 0 R" % kids.group(1), (b"%s 0 R" % font).rjust(len(kids.group(1)) + 4)).replace(
        b"%s 0 R" % kids.group(2), (b"%s 0 R" % font).rjust(len(kids.group(2)) + 4))))
    assert open_pages(make_document(tmp_path / "front.pdf")) == PageCount(3)
    (tmp_path / "none.pdf").write_bytes(declaring(marked_pdf(1), 1).replace(
        b"/Kids [", b"/Kids [%s 0 R " % re.search(rb"(\d+) 0 obj\s*<<\s*/Type\s*/Font", marked_pdf(1)).group(1), 1))
    with pytest.raises(InputError, match="the PDF declares 1 page, but its page tree holds no page") as none:
        open_pages(make_document(tmp_path / "none.pdf"))
    assert none.value.lasting
    # a damaged page among them, and more declared: the tree's pages all the same
    (tmp_path / "mid.pdf").write_bytes(declaring((tmp_path / "three.pdf").read_bytes(), 9))
    assert open_pages(make_document(tmp_path / "mid.pdf")).note.endswith("ends after page 3: pages 4-9 are not there")
    # a last page that PDFium finds at the second asking only (its /Kids not an array) is not dropped
    last = re.search(rb"\n%s 0 obj\s*<<" % re.search(rb"/Kids \[\d+ 0 R \d+ 0 R (\d+) 0 R", three).group(1), three)
    quirk = three[:last.end()] + b" /Kids null" + three[last.end():]
    for count, note in ((3, ""), (5, "the PDF declares 5 pages, but its page tree ends after page 3: pages 4-5 are not there")):
        (tmp_path / f"quirk{count}.pdf").write_bytes(declaring(quirk, count))
        assert open_pages(make_document(tmp_path / f"quirk{count}.pdf")) == PageCount(3, note)
    from pantheon_ocr.pipeline import pdf as pipeline_pdf

    pipeline_pdf.clear_pdf_cache()


def test_a_pdf_whose_pages_cannot_be_found_while_its_file_cannot_be_read_is_not_cut_short(tmp_path, monkeypatch):
    """PDFium reads lazily: pages it cannot find while the file cannot be read through are the
    system's failure (not lasting), never a shorter document (a kept reading of fewer pages)."""
    import builtins
    import errno

    from fake_engine import marked_pdf
    from pantheon_ocr.pipeline import pdf as pipeline_pdf

    path = tmp_path / "a.pdf"
    path.write_bytes(declaring(marked_pdf(2), 5))
    real_open = builtins.open

    def failing_open(file, *a, **kw):
        if str(file) == str(path):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", failing_open)  # PDFium's own reads are not Python's
    with pytest.raises(InputError, match="cannot read file: Input/output error$") as failed:
        open_pages(make_document(path))
    assert not failed.value.lasting and failed.value.page is None
    monkeypatch.undo()
    assert open_pages(make_document(path)).n == 2
    pipeline_pdf.clear_pdf_cache()


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_an_animated_image_is_its_first_frame_and_says_so(tmp_path, fmt):
    """An animated GIF, WebP or PNG was read as its first frame without a word (probe: three frames
    of text, one read, exit 0), and `--pages 2` said the file had 1 page. Its frames are an
    animation's, not pages (a TIFF's are pages): the first is read, and the note says so."""
    frames = [Image.new("RGB", (64, 48), (60 * i, 0, 0)) for i in range(3)]
    path = tmp_path / f"anim.{fmt.lower()}"
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert open_pages(make_document(path)) == PageCount(1, "an animated image: only its first frame of 3 is read")
    assert render_page(make_document(path), 0).getpixel((5, 5))[0] < 10  # the first frame's pixels
    frames[0].save(tmp_path / "still.gif")
    tif = tmp_path / "multi.tif"
    frames[0].save(tif, save_all=True, append_images=frames[1:])
    assert open_pages(make_document(tmp_path / "still.gif")) == PageCount(1)
    assert open_pages(make_document(tif)) == PageCount(3)


@pytest.mark.parametrize(
    "spec, n, expected",
    [
        ("1-3,7", 10, [0, 1, 2, 6]),
        (" 2 , 2-3 ", 5, [1, 2]),
        ("4-", 6, [3, 4, 5]),
        ("-2", 6, [0, 1]),
        ("7,1", 7, [0, 6]),
        (None, 3, [0, 1, 2]),
        ("all", 2, [0, 1]),
        ("", 2, [0, 1]),
    ],
)
def test_parse_pages(spec, n, expected):
    assert parse_pages(spec, n) == expected


@pytest.mark.parametrize("spec", ["0", "3-1", "a", "1-2-3", "1,,2", "-", "1.5", "2-0", "\u0662", "1-\uff13"])  # Arabic-Indic, fullwidth digits
def test_parse_pages_rejects_bad_specs(spec):
    with pytest.raises(UsageError) as e:
        parse_pages(spec, 10)
    assert repr(spec) in str(e.value) and "pages start at 1" in str(e.value)
    with pytest.raises(UsageError):
        validate_page_spec(spec)


def test_parse_pages_range_check_and_clip():
    with pytest.raises(UsageError, match="page 9 is out of range: the document has 7 pages"):
        parse_pages("1-9", 7)
    assert parse_pages("1-9", 7, clip=True) == list(range(7))
    assert parse_pages("8-9", 7, clip=True) == []


@pytest.mark.parametrize("spec,n,past", [("499-501", 500, "501"), ("1-3,7", 5, "7"), ("9-12,10-14,20", 5, "9-14,20"),
                                         ("5-", 3, ""), ("1-3", 3, ""), ("all", 2, ""), (None, 2, ""), ("3,4", 3, "4")])
def test_pages_past_end_names_what_a_clip_drops(spec, n, past):
    assert pages_past_end(spec, n) == past
    if spec and spec != "all" and not spec.endswith("-"):  # exactly the pages the clip drops
        dropped = {i + 1 for i in parse_pages(spec, 600)} - {i + 1 for i in parse_pages(spec, n, clip=True)}
        assert dropped == ({i + 1 for i in parse_pages(past, 600)} if past else set())


# ----------------------------------------------------------------------------- PDFs


def test_render_pdf_straight_at_target_size():
    doc = make_document(SAMPLES / "docs/report-3pages.pdf")
    img = render_page(doc, 1)
    assert img.mode == "RGB" and img.size == (1190, 1540)  # 612x792 pt, longer side exactly 1540
    assert render_page(doc, 0, longest_edge=1000).size == (773, 1000)
    a = np.asarray(img)
    assert a.min() < 50 and np.median(a) == 255  # black text and lines on white paper


def test_render_pdf_landscape_and_rotated_pages(tmp_path):
    path = tmp_path / "rot.pdf"
    path.write_bytes(ms.build_pdf([ms.Canvas(), ms.Canvas(), ms.Canvas()], size=(842, 595), rotate={1: 90}))
    doc = make_document(path)
    assert render_page(doc, 0).size == (1540, 1089)  # 595 * 1540 / 842 = 1088.3, rounded up
    assert render_page(doc, 1).size == (1089, 1540)  # /Rotate 90 swaps the sides


def test_render_pdf_odd_sizes_are_exact(tmp_path):
    path = tmp_path / "odd.pdf"
    sizes = [(595.28, 841.89), (100.3, 7000.7), (1.5, 1.2)]
    path.write_bytes(b"")
    for w, h in sizes:
        path.write_bytes(ms.build_pdf([ms.Canvas()], size=(w, h)))
        img = render_page(make_document(path), 0, longest_edge=1540)
        assert max(img.size) == 1540


def test_render_pdf_too_narrow_page(tmp_path):
    path = tmp_path / "strip.pdf"
    path.write_bytes(ms.build_pdf([ms.Canvas()], size=(5000, 10)))
    with pytest.raises(InputError) as e:
        render_page(make_document(path), 0)
    assert e.value.page == 1 and e.value.problem == (
        "the page is too thin to read: 5000x10 pt becomes 1540x4 px at the longest edge of 1540 px (under 16 px "
        "across); cut it into shorter pieces")


def test_encrypted_pdf():
    doc = make_document(SAMPLES / "bad/encrypted.pdf")
    with pytest.raises(InputError, match=r"encrypted: a password is needed \(the password setting\)") as e:
        count_pages(doc)
    assert e.value.option == "password" and e.value.problem == "the PDF is encrypted: a password is needed"
    with pytest.raises(InputError, match="wrong password"):
        render_page(doc, 0, password="nope")
    img = render_page(doc, 0, password=ms.PASSWORD)
    assert np.asarray(img).min() < 50
    # a password given for a PDF that has none does no harm
    assert render_page(make_document(SAMPLES / "docs/text-1page.pdf"), 0, 200, password="x").size[1] == 200


@pytest.mark.parametrize(
    "name, problem",
    [("corrupt.pdf", "damaged or truncated"), ("zero-pages.pdf", "the PDF has no pages")],
)
def test_broken_pdfs(name, problem):
    doc = make_document(SAMPLES / "bad" / name)
    for call in (lambda: count_pages(doc), lambda: render_page(doc, 0)):
        with pytest.raises(InputError) as e:
            call()
        assert problem in e.value.problem and e.value.path == str(doc.path)


def test_pdf_error_text_is_not_stale():
    # PDFium keeps its last error code across calls: a zero-page PDF opened after an
    # encrypted one must not be reported as a password problem.
    with pytest.raises(InputError, match="password"):
        count_pages(make_document(SAMPLES / "bad/encrypted.pdf"))
    with pytest.raises(InputError, match="no pages"):
        count_pages(make_document(SAMPLES / "bad/zero-pages.pdf"))
    with pytest.raises(InputError, match="damaged"):
        count_pages(make_document(SAMPLES / "bad/corrupt.pdf"))


def test_not_a_pdf_and_missing_page(tmp_path):
    fake = touch(tmp_path / "fake.pdf", b"this is not a pdf at all")
    with pytest.raises(InputError, match="not a PDF file"):
        count_pages(make_document(fake))
    with pytest.raises(InputError, match="page 4 does not exist") as e:
        render_page(make_document(SAMPLES / "docs/report-3pages.pdf"), 3)
    assert e.value.page == 4
    gone = make_document(touch(tmp_path / "gone.pdf"))
    os.unlink(gone.path)
    with pytest.raises(InputError, match="cannot read file"):
        render_page(gone, 0)


def test_changed_pdf_is_reopened(tmp_path):
    path = tmp_path / "grow.pdf"
    path.write_bytes(ms.numbered_pages(1))
    doc = make_document(path)
    assert count_pages(doc) == 1
    path.write_bytes(ms.numbered_pages(4))
    os.utime(path, ns=(1, 10**18))  # a different mtime even on coarse clocks
    assert count_pages(doc) == 4


def test_scanned_sample_renders():
    img = render_page(make_document(SAMPLES / "docs/scanned.pdf"), 0)
    assert img.size == (1190, 1540)
    assert 150 < np.asarray(img).mean() < 245  # grey paper with dark text


def test_samples_are_small():
    sizes = {name: (SAMPLES / name).stat().st_size for name in ms.SAMPLES}  # every sample the maker writes is there
    assert max(sizes.values()) < 100_000


def test_make_samples_is_deterministic(tmp_path):
    ms.main(str(tmp_path))
    for name in ms.SAMPLES:
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name


# ---------------------------------------------------------------------------- images


def save(img: Image.Image, path: Path, **kw) -> Document:
    img.save(path, **kw)
    return make_document(path)


def test_image_passthrough_and_downscale(tmp_path):
    small = save(Image.new("RGB", (300, 200), (10, 20, 30)), tmp_path / "s.png")
    assert render_page(small, 0).size == (300, 200)  # never upscaled
    big = save(Image.new("RGB", (20000, 1000), "white"), tmp_path / "wide.png")
    assert render_page(big, 0).size == (1540, 77)


def test_huge_jpeg_uses_draft_and_lands_on_target(tmp_path):
    doc = save(Image.new("RGB", (6400, 4800), (200, 200, 200)), tmp_path / "big.jpg", quality=50)
    img = render_page(doc, 0)
    assert img.size == (1540, 1155) and img.mode == "RGB"


def test_exif_orientation(tmp_path):
    img = Image.new("RGB", (120, 60), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 cw when displayed
    doc = save(img, tmp_path / "phone.jpg", exif=exif.tobytes())
    assert render_page(doc, 0).size == (60, 120)


def test_alpha_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    rgba.paste((0, 0, 0, 255), (0, 0, 20, 40))
    out = np.asarray(render_page(save(rgba, tmp_path / "a.png"), 0))
    assert out[:, :20].max() == 0 and out[:, 20:].min() == 255
    la = Image.new("LA", (40, 40), (0, 0))
    assert np.asarray(render_page(save(la, tmp_path / "la.png"), 0)).min() == 255
    pal = Image.new("P", (40, 40), 0)
    pal.putpalette([0, 0, 0, 255, 0, 0])
    pal.info["transparency"] = 0
    assert np.asarray(render_page(save(pal, tmp_path / "p.png", transparency=0), 0)).min() == 255


def test_palette_cmyk_bilevel_and_16_bit(tmp_path):
    pal = Image.new("P", (32, 32), 1)
    pal.putpalette([0, 0, 0, 255, 0, 0])
    assert render_page(save(pal, tmp_path / "p.bmp"), 0).getpixel((3, 3)) == (255, 0, 0)
    cmyk = Image.new("CMYK", (32, 32), (0, 0, 0, 255))
    assert render_page(save(cmyk, tmp_path / "c.tif"), 0).getpixel((3, 3)) == (0, 0, 0)
    assert render_page(save(Image.new("1", (32, 32), 1), tmp_path / "b.tif"), 0).getpixel((0, 0)) == (255, 255, 255)
    ramp = (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16)
    doc = save(Image.fromarray(ramp), tmp_path / "g16.png")
    out = np.asarray(render_page(doc, 0))[..., 0]
    assert out.min() == 0 and out.max() == 255  # 65520 / 257 = 254.9
    assert abs(int(out[32, 0]) - round(ramp[32, 0] / 257)) <= 1


def test_float_and_int32_data_are_scaled(tmp_path):
    f = Image.fromarray(np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32), "F")
    out = np.asarray(render_page(save(f, tmp_path / "f.tif"), 0))
    assert out.min() == 0 and out.max() == 255
    i = Image.fromarray((np.arange(32 * 32, dtype=np.int32).reshape(32, 32) - 500) * 1000, "I")
    out = np.asarray(render_page(save(i, tmp_path / "i.tif"), 0))
    assert out.min() == 0 and out.max() == 255


def test_multipage_tiff_frames(tmp_path):
    frames = [Image.new("L", (64, 48), v) for v in (0, 128, 255)]
    frames[0].save(tmp_path / "m.tif", save_all=True, append_images=frames[1:])
    doc = make_document(tmp_path / "m.tif")
    assert [render_page(doc, i).getpixel((1, 1))[0] for i in range(3)] == [0, 128, 255]
    with pytest.raises(InputError, match="page 4 does not exist"):
        render_page(doc, 3)


def png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


def test_tiny_and_bomb_images(tmp_path):
    with pytest.raises(InputError, match=r"too small to read \(1x1 px\)") as e:
        render_page(save(Image.new("RGB", (1, 1)), tmp_path / "dot.png"), 0)
    assert e.value.page == 1
    with pytest.raises(InputError) as e:  # wide, not narrow: "too narrow" said of a 40000 px strip puzzled
        render_page(save(Image.new("L", (40000, 20), 255), tmp_path / "line.png"), 0)
    assert e.value.problem == ("the image is too thin to read: 40000x20 px becomes 1540x1 px at the longest edge of "
                               "1540 px (under 16 px across); cut it into shorter pieces")
    # A PNG whose header claims 20000 x 20000 px: refused before any pixel is decoded.
    assert 20000 * 20000 > MAX_IMAGE_PIXELS
    doc = make_document(touch(tmp_path / "bomb.png", png_header_only(20000, 20000)))
    with pytest.raises(InputError, match="decompression bomb"):
        render_page(doc, 0)
    with pytest.raises(InputError, match="decompression bomb"):
        count_pages(doc)


def test_damaged_images(tmp_path):
    buf = io.BytesIO()
    Image.effect_noise((300, 300), 60).convert("RGB").save(buf, "PNG")
    truncated = touch(tmp_path / "cut.png", buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(InputError, match="damaged"):
        render_page(make_document(truncated), 0)
    junk = touch(tmp_path / "junk.jpg", b"\xff\xd8 not really a jpeg")
    with pytest.raises(InputError, match="not a readable image"):
        render_page(make_document(junk), 0)


def test_a_password_for_another_pdf_does_not_stop_one_that_needs_none(tmp_path):
    """One --password for a batch: a PDF with only an owner password (printable, not editable)
    opens without any, so the password given for another file must not fail it."""
    import hashlib

    c = ms.Canvas()
    c.text(72, 700, "Owner locked text")
    security = ms.Rc4Security("", "owner-secret", file_id=hashlib.md5(b"owner-only").digest())
    owner_only = touch(tmp_path / "owner-only.pdf", ms.build_pdf([c], security=security))
    assert count_pages(make_document(owner_only), password="for-another-file") == 1
    assert render_page(make_document(owner_only), 0, password="for-another-file").size == (1190, 1540)
    user = make_document(SAMPLES / "bad" / "encrypted.pdf")
    with pytest.raises(InputError, match="wrong password for this encrypted PDF"):
        count_pages(user, password="not-it")
    assert count_pages(user, password=ms.PASSWORD) == 1


def test_a_multi_page_tiff_cut_short_keeps_the_pages_before_the_cut(tmp_path):
    """A 4-frame TIFF whose last fifth is gone: its first frames are pages as ever; the document is
    not lost to the broken chain of frames (once 'TypeError: Missing dimensions' for all of it)."""
    from PIL import Image

    frames = [Image.new("L", (600, 800), 255 - 40 * i) for i in range(4)]
    whole = tmp_path / "whole.tif"
    frames[0].save(whole, save_all=True, append_images=frames[1:], compression="tiff_lzw")
    data = whole.read_bytes()
    cut = make_document(touch(tmp_path / "cut.tif", data[: len(data) * 4 // 5]))
    assert count_pages(cut) == 4  # three frames found and the broken fourth, which fails as its own page
    assert [render_page(cut, i).getpixel((5, 5)) for i in range(3)] == [(255,) * 3, (215,) * 3, (175,) * 3]
    with pytest.raises(InputError) as e:  # not frame 3's pixels again (PIL kept them for the broken frame)
        render_page(cut, 3)
    assert e.value.page == 4 and e.value.problem.startswith("the image data is damaged")


def test_folders_find_every_image_kind_a_named_file_may_be(tmp_path):
    from PIL import Image

    img = Image.new("RGB", (64, 64), "white")
    for ext in (".gif", ".png", ".ppm"):
        img.save(tmp_path / f"page{ext}")
    (tmp_path / "notes.txt").write_text("not a page")
    assert sorted(d.name for d in expand_inputs([str(tmp_path)])) == ["page.gif", "page.png", "page.ppm"]


def test_an_image_saved_as_pdf_is_read_as_the_image_it_is(tmp_path):
    from PIL import Image

    Image.new("RGB", (300, 200), "white").save(tmp_path / "scan.pdf", format="PNG")
    (doc,) = expand_inputs([str(tmp_path / "scan.pdf")])
    assert doc.kind == "image" and render_page(doc, 0).size == (300, 200)
    touch(tmp_path / "junk.pdf", b"neither a PDF nor an image")
    with pytest.raises(InputError, match="not a PDF file"):
        count_pages(make_document(tmp_path / "junk.pdf"))


@pytest.mark.parametrize("name", ["empty.pdf", "empty.png"])
def test_an_empty_file_is_called_empty(tmp_path, name):
    with pytest.raises(InputError, match=r": an empty file \(0 bytes\)$"):
        count_pages(make_document(touch(tmp_path / name)))


def test_a_hard_link_is_a_document_of_its_own_and_spellings_are_one(tmp_path):
    a = touch(tmp_path / "docs" / "a.pdf", (SAMPLES / "docs" / "text-1page.pdf").read_bytes())
    os.link(a, tmp_path / "docs" / "b.pdf")  # another name: the user expects its output
    os.symlink(a, tmp_path / "docs" / "c.pdf")  # the same file: one document
    os.symlink(a, tmp_path / "docs" / "0-link.pdf")  # sorts before a.pdf: the file's own name still wins
    found = expand_inputs([str(tmp_path / "docs"), str(a), str(tmp_path / "docs" / ".." / "docs" / "a.pdf")])
    assert sorted(d.name for d in found) == ["a.pdf", "b.pdf"]
    assert expand_inputs([str(tmp_path / "docs" / "0-link.pdf")])[0].name == "0-link.pdf"  # named alone: itself


def test_a_file_reached_from_two_inputs_mirrors_the_outer_one_in_any_order(tmp_path):
    touch(tmp_path / "nest" / "sub" / "inner.pdf", (SAMPLES / "docs" / "text-1page.pdf").read_bytes())
    outer, inner = str(tmp_path / "nest"), str(tmp_path / "nest" / "sub")
    assert [d.rel for d in expand_inputs([outer, inner])] == [PurePath("sub/inner.pdf")]
    assert [d.rel for d in expand_inputs([inner, outer])] == [PurePath("sub/inner.pdf")]


def test_a_read_the_system_failed_is_not_the_files_lasting_fault(tmp_path, monkeypatch):
    """A page whose data is damaged fails the same on every try (lasting: not read again, not
    retried); a read the system failed (EIO on a network disk) may get through later. Both were
    lasting, so an archive job never retried a page that hit one EIO."""
    import errno

    from PIL import ImageDraw

    frames = [Image.new("L", (600, 800), 255) for _ in range(3)]
    for i, frame in enumerate(frames):
        ImageDraw.Draw(frame).text((50, 50), f"page {i + 1}", fill=0)
    frames[0].save(tmp_path / "full.tif", save_all=True, append_images=frames[1:], compression="tiff_lzw")
    data = (tmp_path / "full.tif").read_bytes()
    (tmp_path / "cut.tif").write_bytes(data[: len(data) * 9 // 10])
    with pytest.raises(InputError, match="damaged") as damaged:
        render_page(make_document(tmp_path / "cut.tif"), 2)
    assert damaged.value.lasting
    real_open = Image.open

    def failing_open(fp, *a, **kw):
        if str(fp).endswith("full.tif"):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(fp, *a, **kw)

    monkeypatch.setattr(Image, "open", failing_open)
    with pytest.raises(InputError, match="cannot read image: Input/output error") as failed:
        render_page(make_document(tmp_path / "full.tif"), 0)
    assert not failed.value.lasting


def test_a_pdf_page_that_fails_while_the_file_cannot_be_read_is_not_the_files_lasting_fault(tmp_path, monkeypatch):
    """PDFium reads a PDF as its pages need it, so an EIO on a network disk reached us as a page
    that could not be loaded, counted the file's own fault for good (never read again by the next
    transcribe, never retried by archive jobs). A page that fails while the file cannot be read
    through is the system's; one that fails while it can is the page's, and the file is read
    through once for the open document, not once for each of its damaged pages."""
    import builtins
    import errno

    import pypdfium2 as pdfium

    from pantheon_ocr.pipeline import pdf as pipeline_pdf

    path = tmp_path / "a.pdf"
    path.write_bytes((SAMPLES / "docs" / "report-3pages.pdf").read_bytes())
    doc = make_document(path)
    render_page(doc, 0)  # opened: PDFium holds the file from now on

    def no_page(self, index):
        raise pdfium.PdfiumError("Failed to load page.")

    real_open, opened = builtins.open, []

    def failing_open(file, *a, **kw):
        if str(file) == str(path):
            opened.append(file)
            raise OSError(errno.EIO, "Input/output error")
        return real_open(file, *a, **kw)

    monkeypatch.setattr(pdfium.PdfDocument, "__getitem__", no_page)
    monkeypatch.setattr(builtins, "open", failing_open)
    with pytest.raises(InputError, match="page 1: cannot read file: Input/output error$") as failed:
        render_page(doc, 0)
    assert not failed.value.lasting and failed.value.page == 1
    assert pipeline_pdf._pdf_cache["pdf"][0] is None  # stale: the next try closes it and opens the file again
    monkeypatch.setattr(builtins, "open", real_open)  # the disk is back: the pages' own damage
    for page in (0, 1, 2):
        with pytest.raises(InputError, match="damaged page object") as damaged:
            render_page(doc, page)
        assert damaged.value.lasting

    def counting_open(file, *a, **kw):
        if str(file) == str(path):
            opened.append(file)
        return real_open(file, *a, **kw)

    opened.clear()
    monkeypatch.setattr(builtins, "open", counting_open)
    with pytest.raises(InputError, match="damaged page object"):
        render_page(doc, 1)
    assert opened == []  # read through once already
    monkeypatch.undo()
    assert render_page(doc, 0).size[0] > 0
    # Close the cached document here: left open, pypdfium2 closes it at the test process's exit
    # and says so on stderr, at the end of every CI run.
    pipeline_pdf.clear_pdf_cache()


def test_a_pdf_that_pdfium_cannot_load_is_the_files_fault_only_when_its_bytes_say_so(tmp_path):
    """PDFium reads the file itself, so a read the system failed reaches us as a load failure:
    the bytes read here tell a damaged PDF (lasting) from a read that failed (not lasting)."""
    from pantheon_ocr.pipeline import pdf as pipeline_pdf

    assert pipeline_pdf._pdf_problem(SAMPLES / "bad" / "corrupt.pdf", None, None) == (
        "the PDF is damaged or truncated and cannot be opened", True)
    problem, lasting = pipeline_pdf._pdf_problem(tmp_path / "gone.pdf", None, None)
    assert problem.startswith("cannot read file: ") and not lasting
