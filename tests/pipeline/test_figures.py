"""Image regions of bbox models (pipeline/figures.py): boxes found or left as text, crops cut from
the page at full resolution and written beside the Markdown, links rewritten, coordinates kept
in the JSONL; through the pipeline and an archive job with a fake engine that writes such text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fake_engine import WritingEngine, marked_pdf, md_body
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.pipeline.figures import FIGURE_EDGE, FigureCropper, find_boxes
from pantheon_ocr.pipeline.inputs import Document, expand_inputs
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PageResult, PipelineOptions

# The marked PDFs (612 x 792 pt) carry two grey 40 pt squares in the top-left corner: page
# square at x 0-40, document square at x 40-80 (grey level 8 x number). As 0-1000 boxes:
PAGE_SQUARE = "0,0,65,50"  # x 0-39.8 pt, y 0-39.6 pt
DOC_SQUARE = "66,0,130,50"
MALFORMED = [
    "![image](image_3.png)0,0,1001,50",  # out of range
    "![image](image_4.png)500,10,400,50",  # inverted
    "![image](image_5.png)10,20,30,20",  # empty
    "![image](image_6.png)10,abc,30,40",  # not numbers
    "![image](image_7.png)10,20,30",  # truncated
    "![image](image_8.png)10,20,30,40,50",  # a fifth number
    "![image](image_9.png)10,20,30,40.5",  # a decimal
    "![image](image_10.png)",  # no box at all
]


def test_find_boxes_keeps_only_valid_ones():
    text = f"Title\n![image](image_1.png){PAGE_SQUARE}\n" + "\n".join(MALFORMED) + "\n![image](image_2.png) 0,0,1000,1000 end"
    boxes = find_boxes(text)
    assert [(f.index, f.name, f.box) for f in boxes] == [(1, "image_1.png", (0, 0, 65, 50)),
                                                         (2, "image_2.png", (0, 0, 1000, 1000))]
    assert text[slice(*boxes[1].span)] == "![image](image_2.png) 0,0,1000,1000"
    for line in MALFORMED + ["![image](image_1.png)", "image_1.png 1,2,3,4", "", "![x](a.png)1,2,3,4"]:
        assert find_boxes(line) == [], line


def page_text(features) -> str:
    if features.page == 1:
        return (f"# Page one\n\n![image](image_1.png){PAGE_SQUARE}\n\nBetween.\n\n![image](image_2.png) {DOC_SQUARE}\n\n"
                + MALFORMED[0] + "\n\nEnd.")
    return "Page two has no picture."


def expected_crop_size(box: tuple[int, ...], w: int, h: int) -> tuple[int, int]:
    x1, y1, x2, y2 = box
    return math.ceil(x2 * w / 1000) - math.floor(x1 * w / 1000), math.ceil(y2 * h / 1000) - math.floor(y1 * h / 1000)


def test_pipeline_writes_crops_beside_the_markdown(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "report.pdf").write_bytes(marked_pdf(2, doc_no=3))
    out = tmp_path / "out"
    opts = PipelineOptions(out_dir=out, formats=("md", "jsonl"), page_files=True, render_workers=1, text_fallback=False)
    summary = run_pipeline(expand_inputs([str(src)]), WritingEngine(page_text), opts)
    assert summary.exit_code == 0 and summary.documents[0].status == "written"
    crops = sorted(p.name for p in (out / "report_images").iterdir())
    assert crops == ["p1_1.png", "p1_2.png"]  # the malformed box made no file
    # cut from the page rendered at full resolution: FIGURE_EDGE px high for a portrait page
    w, h = math.ceil(612 * FIGURE_EDGE / 792), FIGURE_EDGE
    for name, box, grey in (("p1_1.png", (0, 0, 65, 50), 8), ("p1_2.png", (66, 0, 130, 50), 24)):
        with Image.open(out / "report_images" / name) as im:
            assert im.size == expected_crop_size(box, w, h)
            px = np.asarray(im.convert("L"), dtype=float)
        inner = px[px.shape[0] // 4: 3 * px.shape[0] // 4, px.shape[1] // 4: 3 * px.shape[1] // 4]
        assert abs(inner.mean() - grey) < 2  # the page square (grey 8), the document square (grey 24)
    md = md_body(out / "report.md")
    assert "![image](report_images/p1_1.png)\n\nBetween.\n\n![image](report_images/p1_2.png)\n\n" + MALFORMED[0] in md
    assert PAGE_SQUARE not in md and DOC_SQUARE not in md  # the coordinates live in the JSONL
    page1 = md_body(out / "report" / "page-0001.md")
    assert "![image](../report_images/p1_1.png)" in page1  # per-page files are one folder down
    rec1, rec2 = (json.loads(x) for x in (out / "report.jsonl").read_text().splitlines())
    assert rec1["text"] == page_text(type("F", (), {"page": 1})())  # the model's own text, coordinates and all
    assert rec1["images"] == [{"file": "report_images/p1_1.png", "name": "image_1.png", "box": [0, 0, 65, 50]},
                              {"file": "report_images/p1_2.png", "name": "image_2.png", "box": [66, 0, 130, 50]}]
    assert "images" not in rec2
    assert summary.documents[0].outputs == (out / "report" / "page-0001.md", out / "report" / "page-0002.md",
                                            out / "report.jsonl", out / "report.md")
    # run again with a page that has one region fewer: the stale crop goes
    summary = run_pipeline(expand_inputs([str(src)]), WritingEngine(lambda f: page_text(f).split("Between")[0]),
                           PipelineOptions(out_dir=out, overwrite=True, render_workers=1, text_fallback=False))
    assert summary.exit_code == 0 and sorted(p.name for p in (out / "report_images").iterdir()) == ["p1_1.png"]


def test_reading_a_failed_page_again_keeps_the_other_pages_crops(tmp_path):
    """A document whose page 2 failed is read again for that page only: page 1 comes back from the
    JSONL (the model's text, boxes and all) and its crops are cut again, never taken for stale
    ones; from a Markdown alone (no boxes left in it) the page linking crops is read again."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "report.pdf").write_bytes(marked_pdf(2, doc_no=3))
    for formats, read in ((("md", "jsonl"), [2]), (("md",), [1, 2])):
        out = tmp_path / "-".join(formats)
        opts = PipelineOptions(out_dir=out, formats=formats, render_workers=1, text_fallback=False)
        first = run_pipeline(expand_inputs([str(src)]), WritingEngine(page_text, fail_vision=lambda f: f.page == 2), opts)
        assert first.documents[0].status == "partial"
        seen: list = []  # the pages the engine was shown
        again = run_pipeline(expand_inputs([str(src)]), WritingEngine(page_text, fail_vision=lambda f: seen.append(f.page)), opts)
        assert again.documents[0].status == "written" and sorted(seen) == read, formats
        assert sorted(p.name for p in (out / "report_images").iterdir()) == ["p1_1.png", "p1_2.png"]
        md = md_body(out / "report.md")
        assert "![image](report_images/p1_1.png)\n\nBetween.\n\n![image](report_images/p1_2.png)" in md
        assert "Page two has no picture." in md and "failed" not in md


def test_an_image_input_is_cropped_at_its_own_size(tmp_path):
    img = np.full((900, 2400, 3), 255, np.uint8)
    img[90:450, 240:1200] = (200, 30, 30)  # a red block: x 100-500, y 100-500 of 1000
    Image.fromarray(img).save(tmp_path / "scan.png")
    engine = WritingEngine(lambda f: "Look: ![image](image_1.png)100,100,500,500")
    summary = run_pipeline(expand_inputs([str(tmp_path / "scan.png")]), engine,
                           PipelineOptions(out_dir=tmp_path / "out", render_workers=1))
    assert summary.exit_code == 0
    with Image.open(tmp_path / "out" / "scan_images" / "p1_1.png") as im:
        assert im.size == (960, 360)  # from the 2400 x 900 original, not the 1540 px the model saw
        assert np.asarray(im)[180, 480].tolist() == [200, 30, 30]
    assert md_body(tmp_path / "out" / "scan.md").rstrip("\n").endswith("Look: ![image](scan_images/p1_1.png)")


def test_a_page_whose_crop_fails_keeps_its_text(tmp_path):
    gone = Document(tmp_path / "gone.pdf", "pdf", "0" * 16, Path("gone.pdf"))  # deleted since it was read
    r = PageResult(gone, 1, "![image](image_1.png)0,0,500,500", 3, "eos", None)
    cropper = FigureCropper(None, 30)
    try:
        assert cropper.apply([r], tmp_path / "out" / "gone") == [r]
    finally:
        cropper.close()


def test_an_archive_job_writes_the_crops(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(marked_pdf(2, doc_no=1))
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["in"]\noutput = "out"\n[ocr]\nformats = ["md", "jsonl"]\ntext_fallback = false\n')
    result = run_job(load_job(job), lambda: (WritingEngine(page_text), []))
    assert int(result.exit_code) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "a_images").iterdir()) == ["p1_1.png", "p1_2.png"]
    assert "![image](a_images/p1_2.png)" in md_body(tmp_path / "out" / "a.md")
    assert json.loads((tmp_path / "out" / "a.jsonl").read_text().splitlines()[0])["images"][1]["box"] == [66, 0, 130, 50]
