"""The first hour of a user: progress that moves, honest counts, --text-layer, a document that
changes while it is read, and a stop that does not wait for a long engine call."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fake_engine import FakeEngine, expected_text, lines_pdf, make_samples_module, marked_pdf, md_body
from pantheon_ocr.commands.common import summary_lines
from pantheon_ocr.commands.progress import DocumentLines, LiveLine
from pantheon_ocr.engine.cancel import check as check_cancelled
from pantheon_ocr.pipeline.fallback import stamp_on_a_scan, text_layer_problem
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PageFailure, PipelineOptions


def pdf(folder: Path, name: str, n: int, doc_no: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(marked_pdf(n, doc_no))
    return folder / name


def opts(tmp_path: Path, **kw) -> PipelineOptions:
    kw.setdefault("render_workers", 1)
    kw.setdefault("text_layer", "ocr")
    return PipelineOptions(out_dir=tmp_path / "out", formats=kw.pop("formats", ("md", "jsonl")), **kw)


def test_progress_moves_through_the_stages_before_pages_finish(tmp_path):
    """All pages decode in one batch, so none finishes until the end: the display still moves
    (stages, tokens), at least twice a second."""
    pdf(tmp_path / "in", "a.pdf", 4, 1)
    seen = []
    engine = FakeEngine(n_tokens=lambda f: 30, step_sleep=0.05)
    summary = run_pipeline(expand_inputs([str(tmp_path / "in")]), engine, opts(tmp_path, batch_size=8),
                           on_progress=seen.append)
    assert summary.exit_code == 0
    before_done = [p for p in seen if p.pages_done == 0 and p.elapsed > 0]
    assert any(p.rendered == 4 and p.encoded == 4 for p in before_done)  # stages counted before any page is out
    assert any(p.decoding > 0 and p.tokens > 0 for p in before_done)  # live tokens while decoding
    gaps = np.diff([p.elapsed for p in seen])
    assert len(seen) >= 4 and gaps.max() < 1.0
    assert [o.doc.path.name for p in seen for o in p.finished] == ["a.pdf"]  # each document reported once


def test_live_line_on_a_terminal_and_a_line_per_document_elsewhere(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    pdf(tmp_path / "in", "b.pdf", 1, 2)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, log = Tty(), io.StringIO()
    live, lines = LiveLine(tty), DocumentLines(log)
    run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(step_sleep=0.02), opts(tmp_path),
                 on_progress=lambda p: (live(p), lines(p)))
    assert "\r" in tty.getvalue() and "pages 3/3" in tty.getvalue() and "vision" in tty.getvalue()
    got = log.getvalue().splitlines()  # in the order they finish (b, one page, may come first)
    # the clock is whatever a loaded machine took: 0:00 alone, a second or two beside other work
    assert [g[:6] for g in got] == ["[1/2] ", "[2/2] "] and sorted(re.sub(r"\d+:\d\d\)$", "M:SS)", g[6:])
                                                                 for g in got) == [
        f"written {tmp_path / 'in' / 'a.pdf'} (2 pages, M:SS)", f"written {tmp_path / 'in' / 'b.pdf'} (1 page, M:SS)"]


@pytest.mark.parametrize("columns", [80, 200])
def test_the_live_line_keeps_failures_speed_and_clock_on_a_narrow_terminal(monkeypatch, columns):
    """At 80 columns the line was cut before its clock and in the middle of '2 failed'."""
    import os as _os

    from pantheon_ocr.pipeline.types import Progress

    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: _os.terminal_size((columns, 24)))
    monkeypatch.delenv("COLUMNS", raising=False)
    tty = io.StringIO()
    LiveLine(tty)(Progress(1234, 5678, 2, 1_234_567, 12, 40, 3725.0, 1240, 1238, 1236, 8))
    line = tty.getvalue().strip("\r\n")
    assert line.startswith("pages 1234/5678 · 2 failed · 1,234,567 tok 331 tok/s · 1:02:05") and len(line) < columns
    assert ("[docs 12/40 · render 1240 · vision 1238 · prefill 1236 · decoding 8]" in line) == (columns == 200)
    assert "1:02:05 · ~3:43:34 left" in line  # 3725 s for 1234 pages, 4444 to go


def test_the_live_line_fits_the_terminal_it_is_drawn_on_not_stdouts(monkeypatch):
    """The line goes to stderr; its width came from stdout's terminal (shutil), 100 columns where
    stdout is a file (`-o - > f`, `| less`), so on a 60-column terminal every redraw wrapped."""
    import fcntl
    import pty
    import struct
    import termios

    from pantheon_ocr.pipeline.types import Progress

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: os.terminal_size((100, 24)))  # stdout's
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
        with os.fdopen(slave, "w", closefd=False) as stderr:
            LiveLine(stderr)(Progress(1234, 5678, 2, 1_234_567, 12, 40, 3725.0, 1240, 1238, 1236, 8))
        drawn = os.read(master, 4096).decode().strip("\r\n")
        assert drawn.startswith("pages 1234/5678") and len(drawn) < 60, drawn
        monkeypatch.setenv("COLUMNS", "90")  # said by the user: it wins
        with os.fdopen(slave, "w", closefd=False) as stderr:
            LiveLine(stderr)(Progress(1234, 5678, 2, 1_234_567, 12, 40, 3725.0, 1240, 1238, 1236, 8))
        drawn = os.read(master, 4096).decode().strip("\r\n")
        assert 60 <= len(drawn) < 90, drawn
    finally:
        os.close(master)
        os.close(slave)


def test_a_live_line_cut_short_ends_before_what_follows():
    """Ctrl-C mid-run: the summary once began on the live line (`...decoding 1]^Cwritten ...`)."""
    from pantheon_ocr.pipeline.types import Progress

    tty = io.StringIO()
    bar = LiveLine(tty)
    bar(Progress(3, 10, 0, 300, 1, 4, 12.0))
    bar.end()
    bar.end()  # once only
    assert tty.getvalue().startswith("\rpages 3/10 · 300 tok 25 tok/s · 0:12 · ~0:28 left")
    assert tty.getvalue().count("\n") == 1 and tty.getvalue().endswith("\n")
    paced = io.StringIO()  # planning took 10 of the 12 s (a big folder hashed): 3 pages in 2 s, 7 to go
    LiveLine(paced)(Progress(3, 10, 0, 300, 1, 4, 12.0, reading_since=10.0))
    assert "· 0:12 · ~0:04 left" in paced.getvalue()
    prefer = io.StringIO()  # 600 pages from the text layer in 10 s, then one read in 2 s: 99 to go
    LiveLine(prefer)(Progress(601, 700, 0, 300, 1, 4, 12.0, reading_since=10.0, done_before_reading=600))
    assert "~3:18 left" in prefer.getvalue()
    only_text_layer = io.StringIO()
    LiveLine(only_text_layer)(Progress(600, 700, 0, 0, 1, 4, 10.0, reading_since=10.0, done_before_reading=600))
    assert "left" not in only_text_layer.getvalue()
    lines = io.StringIO()
    DocumentLines(lines).end()
    assert lines.getvalue() == ""


def test_a_log_hears_from_a_long_document_every_minute(monkeypatch):
    """Without a terminal a line came only as a document finished: a 700-page PDF left the
    nightly log silent for an hour."""
    from pantheon_ocr.commands import progress
    from pantheon_ocr.pipeline.types import Progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    lines = DocumentLines(log)
    for t, done in ((30, 60), (61, 130), (90, 190), (125, 260)):
        clock[0] = 1000.0 + t
        lines(Progress(done, 700, 0, 0, 0, 1, float(t)))
    assert log.getvalue() == "... pages 130/700, 1:01, ~4:27 left\n... pages 260/700, 2:05, ~3:31 left\n"


def test_counts_keep_documents_and_pages_apart(tmp_path):
    good = pdf(tmp_path / "in", "good.pdf", 2, 1)
    short = pdf(tmp_path / "in", "short.pdf", 1, 2)
    (tmp_path / "in" / "bad.pdf").write_bytes(b"%PDF-1.4 not really")
    summary = run_pipeline(expand_inputs([str(good), str(short), str(tmp_path / "in" / "bad.pdf")]), FakeEngine(),
                           opts(tmp_path, pages="2"))
    text = "\n".join(summary_lines(summary))
    assert "2 documents failed:" in text and "page(s)" not in text  # short.pdf has no page 2; bad.pdf no pages
    assert "short.pdf: none of the selected pages (2) exists: the document has 1 page" in text
    assert text.splitlines()[-1].startswith("3 documents (1 written, 2 failed); 1 page read, ")
    assert summary.exit_code == 1
    # a page that failed was not read: counted apart
    summary = run_pipeline(expand_inputs([str(good)]), FakeEngine(fail_vision=lambda f: f.page == 1),
                           opts(tmp_path, overwrite=True))
    assert summary_lines(summary)[-1].startswith("1 document (1 partial); 1 page read, 1 failed, ")


def test_a_second_run_says_why_it_read_nothing_and_how_to_read_again(tmp_path):
    """A run over a folder already done printed '3 documents (3 skipped); 0 pages read' and no hint."""
    docs = [pdf(tmp_path / "in", f"d{i}.pdf", 1, i) for i in (1, 2)]
    run_pipeline(expand_inputs([str(d) for d in docs]), FakeEngine(), opts(tmp_path))
    again = run_pipeline(expand_inputs([str(d) for d in docs]), FakeEngine(), opts(tmp_path))
    lines = summary_lines(again)
    assert "note: 2 documents skipped: their outputs exist (--overwrite reads them again)" in lines
    assert lines[-1].startswith("2 documents (2 skipped); 0 pages read")
    assert not any("skipped" in line for line in summary_lines(again, quiet=True))  # -q: nothing went wrong
    first = summary_lines(run_pipeline(expand_inputs([str(docs[0])]), FakeEngine(), opts(tmp_path, overwrite=True)))
    assert not any(line.startswith("note:") for line in first)


def test_documents_sent_to_standard_output_are_read_not_written(tmp_path):
    """With -o - the progress said 'read' and the summary 'written', though no file was."""
    doc = pdf(tmp_path / "in", "d.pdf", 1, 1)
    summary = run_pipeline(expand_inputs([str(doc)]), FakeEngine(), opts(tmp_path))
    assert summary_lines(summary)[0].startswith("written     ")
    lines = summary_lines(summary, to_stdout=True)
    assert lines[0] == f"read        {doc}"
    assert lines[-1].startswith("1 document (1 read); 1 page read, ")


def test_page_files_are_counted_not_named_in_the_summary(tmp_path):
    """--page-files: a 3,000-page PDF's summary line named every page file."""
    doc = pdf(tmp_path / "in", "d.pdf", 3, 1)
    summary = run_pipeline(expand_inputs([str(doc)]), FakeEngine(), opts(tmp_path, page_files=True, formats=("md",)))
    out = tmp_path / "out"
    assert summary_lines(summary)[0] == f"written     {doc} -> {out / 'd.md'}, 3 page files in {out / 'd'}"


def test_the_failure_heading_reads_as_english(tmp_path):
    """'1 document and 1 input path unreadable failed:' once; now what failed, then what was unreadable."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.pdf").write_bytes(b"%PDF-1.4 not really")
    problems: list = []
    docs = expand_inputs([str(tmp_path / "in" / "bad.pdf"), str(tmp_path / "missing.pdf")], problems)
    summary = run_pipeline(docs, FakeEngine(), opts(tmp_path))
    summary = dataclasses.replace(summary, unreadable=tuple(PageFailure(e.path, None, e.problem) for e in problems))
    assert "1 document failed, 1 input path unreadable:" in summary_lines(summary)


def text_and_scan_pdf(path: Path) -> Path:
    """Page 1 and 3: marked squares and a paragraph of real text; page 2: the squares only (a scan)."""
    ms = make_samples_module()

    def squares(i: int):
        c = ms.Canvas()
        c.rect(0, 752, 40, 40, round(8 * (i + 1) / 255, 4))
        c.rect(40, 752, 40, 40, round(8 / 255, 4))
        return c

    text = ["The quarterly report of the second page range,", "with 1,200 units sold in the"]
    return lines_pdf(path, [text + [f"northern region and a summary on page {i}."] if i != 2 else [] for i in (1, 2, 3)],
                     x=100, step=20, size=12, canvas=squares)


def test_text_layer_prefer_keeps_real_text_and_reads_the_rest(tmp_path):
    a = text_and_scan_pdf(tmp_path / "in" / "a.pdf")
    engine = FakeEngine()
    summary = run_pipeline(expand_inputs([str(a)]), engine, opts(tmp_path, text_layer="prefer"))
    assert engine.prefills == [(1, 2)] and summary.exit_code == 0  # only the scanned page is read by OCR
    md = md_body(tmp_path / "out" / "a.md")
    assert "<!-- page 1 text-layer -->" in md and "northern region and a summary on page 3." in md
    assert "<!-- page 2 -->\n\n" + expected_text(1, 2) in md
    records = [json.loads(r) for r in (tmp_path / "out" / "a.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["text-layer", "model", "text-layer"]
    assert all(r["error"] is None for r in records)
    assert summary_lines(summary)[-1].startswith("1 document (1 written); 1 page read, 2 from the text layer, ")
    # ocr: the text layer is never looked at
    engine = FakeEngine()
    run_pipeline(expand_inputs([str(a)]), engine, opts(tmp_path, text_layer="ocr", overwrite=True))
    assert len(engine.prefills) == 3 and "northern region" not in md_body(tmp_path / "out" / "a.md")


def test_prefer_reads_a_scan_whose_only_text_is_a_stamp(tmp_path):
    """A scan with one line of real text put on it (a download stamp): that line is no transcript
    of the page, whose body is in the image; prefer reads the page. Pages of text keep theirs."""
    ms = make_samples_module()
    stamped = ms.Canvas()
    stamped.image("Scan", 0, 0, *ms.PAGE_LETTER)
    stamped.text(72, 20, "Downloaded from the county archive portal on 12 May 2024 by user 88812.", size=8)
    path = tmp_path / "in" / "stamped.pdf"
    path.parent.mkdir(parents=True)
    path.write_bytes(ms.build_pdf([stamped], images={"Scan": (744, 963, ms.scanned_jpeg())}))
    text = text_and_scan_pdf(tmp_path / "in" / "text.pdf")
    engine = FakeEngine()
    run_pipeline(expand_inputs([str(path), str(text)]), engine, opts(tmp_path, text_layer="prefer"))
    assert len(engine.prefills) == 2 and (1, 2) in engine.prefills  # the stamped scan, and text.pdf's page 2
    stamped_md = md_body(tmp_path / "out" / "stamped.md")
    assert stamped_md.startswith("<!-- page 1 -->\n") and "Downloaded from" not in stamped_md  # read, not the stamp
    assert stamp_on_a_scan(1.0, 0.004) and not stamp_on_a_scan(1.0, 0.029) and not stamp_on_a_scan(0.86, 0.075)


def test_text_layer_quality():
    assert text_layer_problem("Quarterly Report\n1. Summary\nRevenue grew in every region, 1,200 units.") is None
    assert text_layer_problem("Region Q1 Q2\nNorth 1,200 1,380\nSouth 950 990\nWest 12 17 totals 2,162 2,387") is None
    assert "characters" in text_layer_problem("12")  # a scan's stray label is no text layer
    assert "garbage" in text_layer_problem("Introduction to the system of units and measures in use "
                                           "in every region of the country " + "!\"#$%&'()*+")
    assert "mostly symbols" in text_layer_problem("Intro " + "!\"#$%&'()*+" * 6)
    assert "private-use" in text_layer_problem("\ue000\ue001\ue002" * 30 + " text here and there")
    toc = "Introduction ................................ 7\nInstallation and first steps .......... 12\nIndex ....... 40"
    assert text_layer_problem(toc) is None  # dot leaders are layout, not garbage
    spaced = "\n".join(f"Section {i} on the handling of units . . . . . . . . . . . . . . {i * 3}" for i in range(20))
    assert text_layer_problem(spaced) is None  # LaTeX and groff space theirs
    # A manual's X font names and a slide's bullets mapped to a control character are a few
    # characters of a page of text; a font without a map turns nearly all of them.
    manual = ("By default, the fonts used on the display are loosely specified so that they are found "
              "on any system:\n Fig.normalFontSet: -*-times-medium-r-normal--16-*-*-*-*-*-*-*,\\\n"
              " -*-*-medium-r-normal--16-*-*-*-*-*-*-*\n") * 3
    assert text_layer_problem(manual) is None
    slide = "Ce que ce n'est pas\n" + "".join(f"\x90 priorité {i} accordée à la qualité de la mise en page\n"
                                               for i in range(4))
    assert text_layer_problem(slide) is None
    assert "unprintable" in text_layer_problem("\x90\x03\x11\x07 \x05\x03 " * 10 + slide)


def test_a_document_replaced_while_it_is_read_is_failed_not_mixed(tmp_path):
    a = pdf(tmp_path / "in", "a.pdf", 6, 1)
    swapped = threading.Event()

    def on_step(n):  # after the first decode step: another version is renamed over it
        if not swapped.is_set():
            (tmp_path / "new.pdf").write_bytes(marked_pdf(6, 2))
            os.replace(tmp_path / "new.pdf", a)
            swapped.set()

    summary = run_pipeline(expand_inputs([str(a)]), FakeEngine(on_step=on_step, step_sleep=0.01),
                           opts(tmp_path, batch_size=1))
    (d,) = summary.documents
    assert swapped.is_set() and d.status == "failed" and "changed while it was being read" in d.failures[0].reason
    assert "replaced" in d.failures[0].reason and not (tmp_path / "out" / "a.md").exists()
    assert summary.exit_code != 0


class SlowVision(FakeEngine):
    """A vision stage of many long layers, as a full LightOnOCR page is on a CPU."""

    def vision(self, image):
        for _ in range(300):  # 30 s unless stopped between "layers"
            check_cancelled()
            time.sleep(0.1)
        return super().vision(image)


def test_a_stop_ends_the_run_between_layers_not_after_the_page(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.perf_counter()
    summary = run_pipeline(expand_inputs([str(tmp_path / "in")]), SlowVision(), opts(tmp_path), stop=stop)
    took = time.perf_counter() - t0
    assert summary.interrupted and took < 10  # not the 30 s the page's vision would take
    assert not (tmp_path / "out" / "a.md").exists() and summary.exit_code == 130


def test_an_archive_job_does_not_mix_two_versions_either(tmp_path):
    """A job reading a document that is renamed over mid-run keeps its pages pending (nothing
    written from two versions); the next run sees the new file and reads it whole."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "archive"))
    from harness import write_job

    from fake_engine import EngineFactory
    from pantheon_ocr.archive.run import run_job
    from pantheon_ocr.archive.spec import load_job

    a = pdf(tmp_path / "in", "a.pdf", 6, 1)
    swapped = threading.Event()

    def on_step(n):
        if not swapped.is_set():
            (tmp_path / "new.pdf").write_bytes(marked_pdf(6, 2))
            os.replace(tmp_path / "new.pdf", a)
            swapped.set()

    job = write_job(tmp_path, ocr={"batch_size": 1})
    first = run_job(load_job(job), EngineFactory(on_step=on_step, step_sleep=0.01))
    assert swapped.is_set() and first.exit_code != 0  # a failure of this run, named below
    assert any("changed while it was being read" in f["reason"] for f in first.summary["failures"])
    assert not (tmp_path / "out" / "a.md").exists()
    second = run_job(load_job(job), EngineFactory())
    assert second.exit_code == 0 and second.summary["documents"] == {"changed": 1, "written": 1}
    assert "doc 2 page 6" in md_body(tmp_path / "out" / "a.md")


def test_prefer_reads_turned_pages_in_order_and_sideways_text_by_ocr(tmp_path):
    """/Rotate 90, 180, 270 over upright text: the text layer in reading order (PDFium, left to
    the page's rotation, gave the lines bottom to top at 90 and the words right to left at 180).
    Text set sideways on the page and shown upright by /Rotate: its layer comes out glued, so the
    page is read by OCR."""
    import pypdfium2 as pdfium

    src = text_and_scan_pdf(tmp_path / "src" / "a.pdf")
    pdf = pdfium.PdfDocument(str(src))
    for i, rotation in enumerate((90, 180, 270)):
        pdf[i].set_rotation(rotation)
    (tmp_path / "in").mkdir()
    pdf.save(str(tmp_path / "in" / "turned.pdf"))
    pdf.close()
    ms = make_samples_module()
    c = ms.Canvas()
    for k, line in enumerate(("Region North South West", "Units sold 1,200 950 12", "Change since last year",
                              "Notes on the quarterly figures of every region")):
        c.ops.append(f"BT /F1 12 Tf 0 1 -1 0 {500 - 20 * k} 100 Tm {ms.pdf_string(line)} Tj ET")  # sideways
    (tmp_path / "src" / "side.pdf").write_bytes(ms.build_pdf([c]))
    pdf = pdfium.PdfDocument(str(tmp_path / "src" / "side.pdf"))
    pdf[0].set_rotation(90)
    pdf.save(str(tmp_path / "in" / "sideways.pdf"))
    pdf.close()
    engine = FakeEngine()
    run_pipeline(expand_inputs([str(tmp_path / "in")]), engine, opts(tmp_path, text_layer="prefer"))
    assert len(engine.prefills) == 2  # turned.pdf's scan page and sideways.pdf
    records = [json.loads(r) for r in (tmp_path / "out" / "turned.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["text-layer", "model", "text-layer"]
    for r in (records[0], records[2]):
        assert r["text"] == ("The quarterly report of the second page range,\nwith 1,200 units sold in the\n"
                             f"northern region and a summary on page {r['page']}.")
    side = [json.loads(r) for r in (tmp_path / "out" / "sideways.jsonl").read_text().splitlines()]
    assert [r["source"] for r in side] == ["model"]
    # as a failed page's stand-in it is read with the page's own /Rotate: its lines in order
    # (PDFium glues some of them, as it does for any sideways text), not bottom to top
    from pantheon_ocr.pipeline.inputs import make_document
    from pantheon_ocr.pipeline.pdf import text_layer

    stand_in = text_layer(make_document(tmp_path / "in" / "sideways.pdf"), 0)
    assert [stand_in.index(w) for w in ("Region", "Units", "Change", "Notes")] == sorted(
        stand_in.index(w) for w in ("Region", "Units", "Change", "Notes"))
