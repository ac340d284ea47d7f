"""Outputs record the page selection they were made with, and "skip existing" skips only outputs
of the selection asked for now: outputs of `--pages 1` are not a whole document's transcript.

Layered: the record itself (page_selection, Source), then the pipeline with the fake engine
(exact texts), then the probe that found the bug, through the CLI with the bundled reader.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import FakeEngine, expected_text, marked_pdf, md_body
from pantheon_ocr.modelfiles.resolve import bundled_reader
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.naming import HEADER_PREFIX, OutputPaths, Source, page_selection
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PipelineOptions

ROOT = Path(__file__).resolve().parents[2]


def options(tmp_path: Path, **kw) -> PipelineOptions:
    kw.setdefault("render_workers", 2)
    kw.setdefault("text_fallback", False)
    return PipelineOptions(out_dir=tmp_path / "out", **kw)


def three_pages(tmp_path: Path) -> list:
    path = tmp_path / "in" / "a.pdf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(marked_pdf(3, doc_no=1))
    return expand_inputs([str(path)])


def md_expected(pages: list[int]) -> str:
    """The Markdown body of document 1's `pages`, as the fake engine reads them."""
    return "\n".join(f"<!-- page {p} -->\n\n{expected_text(1, p)}\n" for p in pages)


def header(path: Path) -> dict:
    line = path.read_text(encoding="utf-8").split("\n", 1)[0]
    assert line.startswith(HEADER_PREFIX) and line.endswith(" -->"), line
    return json.loads(line[len(HEADER_PREFIX):-4])


def run(docs, tmp_path, **kw):
    """(status, pages OCR'd) of the one document."""
    engine = FakeEngine()
    (outcome,) = run_pipeline(docs, engine, options(tmp_path, **kw)).documents
    return outcome.status, len(engine.prefills)


# ------------------------------------------------------------------------------- the record


@pytest.mark.parametrize("spec, recorded", [
    (None, None), ("", None), ("all", None), (" All ", None), ("1-", None), ("1-2,3-", None),
    ("1", "1"), (" 1 - 3 ", "1-3"), ("1,2,3", "1-3"), ("3, 1-2", "1-3"), ("-2", "1-2"),
    ("2-", "2-"), ("7,5-6,9-", "5-7,9-"), ("2-5,3-4", "2-5"), ("1-3,5", "1-3,5"), ("9-,2", "2,9-"),
])
def test_a_selection_is_recorded_in_one_form(spec, recorded):
    assert page_selection(spec) == recorded


def test_the_header_names_pages_only_for_a_selection():
    whole = Source("/in/a.pdf", "ab", size=3, mtime_ns=4)
    assert whole.header() == '<!-- pantheon-ocr: {"source": "/in/a.pdf", "sha256": "ab", "size": 3, "mtime_ns": 4} -->'
    part = Source("/in/a.pdf", "ab", page=2, size=3, mtime_ns=4, pages="1-3")
    assert part.header() == ('<!-- pantheon-ocr: {"source": "/in/a.pdf", "sha256": "ab", "size": 3, "mtime_ns": 4, '
                             '"page": 2, "pages": "1-3"} -->')
    # the fields stay in their order: archive/rebuild.py builds Source(path, sha256)
    assert Source("/in/a.pdf", "ab") == Source(path="/in/a.pdf", sha256="ab", page=None, size=None, mtime_ns=None, pages=None)


def test_recorded_source_reads_the_selection_back(tmp_path):
    paths = OutputPaths(tmp_path / "a")
    (tmp_path / "a.md").write_text(Source("/in/a.pdf", "ab", size=3, mtime_ns=4, pages="2").header() + "\n\n")
    (tmp_path / "a.jsonl").write_text(json.dumps({"doc": "/in/a.pdf", "doc_sha256": "ab", "doc_pages": "5-"}) + "\n")
    assert paths.recorded_source(["md"]) == Source("/in/a.pdf", "ab", size=3, mtime_ns=4, pages="2")
    assert paths.recorded_source(["jsonl"]) == Source("/in/a.pdf", "ab", pages="5-")
    # outputs older than the field say nothing: every page, as they were always taken
    (tmp_path / "a.md").write_text(Source("/in/a.pdf", "ab", size=3, mtime_ns=4).header() + "\n\n")
    assert paths.recorded_source(["md"]).pages is None


# ------------------------------------------------------------------------------ the pipeline


def test_a_run_over_all_pages_does_not_skip_the_outputs_of_one(tmp_path):
    docs = three_pages(tmp_path)
    out = tmp_path / "out"
    assert run(docs, tmp_path, pages="1", formats=("md", "jsonl")) == ("written", 1)
    assert header(out / "a.md")["pages"] == "1"
    assert [(r["page"], r["doc_pages"]) for r in map(json.loads, (out / "a.jsonl").read_text().splitlines())] == [(1, "1")]
    assert run(docs, tmp_path, formats=("md", "jsonl")) == ("written", 3)
    assert md_body(out / "a.md") == md_expected([1, 2, 3])  # each page once
    assert "pages" not in header(out / "a.md")
    records = [json.loads(line) for line in (out / "a.jsonl").read_text().splitlines()]
    assert [r["page"] for r in records] == [1, 2, 3] and not any("doc_pages" in r for r in records)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert run(docs, tmp_path, formats=("md", "jsonl")) == ("skipped", 0)


def test_the_same_selection_is_skipped_and_another_is_not(tmp_path):
    docs = three_pages(tmp_path)
    out = tmp_path / "out"
    assert run(docs, tmp_path, pages="2-3") == ("written", 2)
    assert run(docs, tmp_path, pages="2-3") == ("skipped", 0)
    assert run(docs, tmp_path, pages=" 3, 2 ") == ("skipped", 0)  # the same pages, written another way
    assert run(docs, tmp_path, pages="1") == ("written", 1)  # replaced: the outputs hold what was asked
    assert md_body(out / "a.md") == md_expected([1]) and header(out / "a.md")["pages"] == "1"
    assert run(docs, tmp_path, pages="2-3", overwrite=True) == ("written", 2)


def test_a_selection_after_a_whole_run_replaces_it(tmp_path):
    docs = three_pages(tmp_path)
    out = tmp_path / "out"
    assert run(docs, tmp_path) == ("written", 3)
    assert set(header(out / "a.md")) == {"source", "sha256", "size", "mtime_ns", "model", "formats"}  # no "pages", as before the field
    assert run(docs, tmp_path, pages="all") == ("skipped", 0)
    assert run(docs, tmp_path, pages="1-") == ("skipped", 0)
    # the page count is not known when deciding: "1-3" of a 3-page document is read again
    assert run(docs, tmp_path, pages="1-3") == ("written", 3)
    assert header(out / "a.md")["pages"] == "1-3"
    assert run(docs, tmp_path, pages="2") == ("written", 1)
    assert md_body(out / "a.md") == md_expected([2])


def test_jsonl_alone_records_the_selection(tmp_path):
    docs = three_pages(tmp_path)
    assert run(docs, tmp_path, pages="1", formats=("jsonl",)) == ("written", 1)
    assert run(docs, tmp_path, pages="1", formats=("jsonl",)) == ("skipped", 0)
    assert run(docs, tmp_path, formats=("jsonl",)) == ("written", 3)
    assert [json.loads(line)["page"] for line in (tmp_path / "out" / "a.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert run(docs, tmp_path, formats=("jsonl",)) == ("skipped", 0)


def test_page_files_record_the_selection_too(tmp_path):
    docs = three_pages(tmp_path)
    folder = tmp_path / "out" / "a"
    assert run(docs, tmp_path, pages="2", page_files=True) == ("written", 1)
    assert sorted(p.name for p in folder.iterdir()) == ["page-0002.md"]
    h = header(folder / "page-0002.md")
    assert (h["source"], h["page"], h["pages"]) == (str(docs[0].path), 2, "2")
    assert run(docs, tmp_path, page_files=True) == ("written", 3)
    assert sorted(p.name for p in folder.iterdir()) == ["page-0001.md", "page-0002.md", "page-0003.md"]
    assert [set(header(p)) - {"source", "sha256", "size", "mtime_ns", "model", "formats"} for p in sorted(folder.iterdir())] \
        == [{"page"}] * 3


def test_txt_alone_records_nothing_so_it_is_always_written_again(tmp_path):
    # as before the field: a txt file cannot say whose text it holds, so it is never skipped
    docs = three_pages(tmp_path)
    assert run(docs, tmp_path, pages="1", formats=("txt",)) == ("written", 1)
    assert run(docs, tmp_path, pages="1", formats=("txt",)) == ("written", 1)
    assert run(docs, tmp_path, formats=("txt",)) == ("written", 3)
    assert (tmp_path / "out" / "a.txt").read_text().count("\f") == 2


# ------------------------------------------------------------------------- the probe, end to end


@pytest.mark.skipif(bundled_reader() is None, reason="this install has no bundled reader")
def test_transcribe_all_pages_after_one(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "dense3.pdf").write_bytes(marked_pdf(3, doc_no=1))

    def transcribe(*args):
        proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(tmp_path / "in" / "dense3.pdf"),
                               "-o", str(tmp_path / "pg"), "--max-tokens", "4", "--no-progress", *args],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    transcribe("--pages", "1")
    assert "skipped" in transcribe("--pages", "1")
    assert "skipped" not in transcribe()
    md = (tmp_path / "pg" / "dense3.md").read_text(encoding="utf-8")
    # `<!-- page 2 -->` or `<!-- page 2 stopped: max_tokens -->`: each page once, in order
    assert [int(line.split()[2]) for line in md.splitlines() if line.startswith("<!-- page ")] == [1, 2, 3]
    assert "pages" not in header(tmp_path / "pg" / "dense3.md")


def test_page_files_asked_for_after_a_run_without_them_are_written(tmp_path):
    """A finished document was skipped ("outputs exist") when the next run asked for --page-files,
    which it never got."""
    docs = three_pages(tmp_path)
    folder = tmp_path / "out" / "a"
    assert run(docs, tmp_path) == ("written", 3) and not folder.exists()
    assert run(docs, tmp_path, page_files=True) == ("written", 3)
    assert sorted(p.name for p in folder.iterdir()) == ["page-0001.md", "page-0002.md", "page-0003.md"]
    assert run(docs, tmp_path, page_files=True) == ("skipped", 0)
    assert run(docs, tmp_path) == ("skipped", 0)  # without --page-files they are not needed
