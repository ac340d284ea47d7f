"""pipeline/run.py with the FakeEngine: order, failures, batching, overlap, memory, Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from fake_engine import (SAMPLES, CrashingRender, FakeEngine, expected_text, make_samples_module, marked_pdf, md_body,
                         vm_rss_kb)
from pantheon_ocr.commands.options import flag_name
from pantheon_ocr.errors import ExitCode, UsageError
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.engine.sampling import SamplingOptions
from pantheon_ocr.pipeline.types import NOT_READ, PageEngine, PipelineOptions, Seq
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.naming import header_record

ms = make_samples_module()


def write_pdf(folder: Path, name: str, n_pages: int, doc_no: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(marked_pdf(n_pages, doc_no))
    return path


def options(tmp_path: Path, **kw) -> PipelineOptions:
    kw.setdefault("render_workers", 2)
    kw.setdefault("text_fallback", False)  # the marked PDFs have a text layer; test_robustness tests the fallback
    return PipelineOptions(out_dir=tmp_path / "out", **kw)


def md_expected(pages: list[tuple[int, int]], n_tokens=None) -> str:
    blocks = [f"<!-- page {p} -->\n\n{expected_text(d, p, n_tokens)}\n" for d, p in pages]
    return "\n".join(blocks)


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def render_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name == "pantheon-render"]


def test_fake_engine_implements_the_protocol():
    engine = FakeEngine()
    assert isinstance(engine, PageEngine)
    seq = engine.prefill(engine.vision(Image.new("RGB", (100, 100), "white")), SamplingOptions())
    assert isinstance(seq, Seq)


def md_header(path: Path) -> dict:
    """The record a Markdown output's first line holds."""
    return header_record(path.read_text().splitlines()[0])


def test_outputs_in_page_order_with_continuous_batching(tmp_path):
    write_pdf(tmp_path / "in", "a.pdf", 7, doc_no=1)
    write_pdf(tmp_path / "in" / "sub", "b.pdf", 3, doc_no=2)
    Image.new("RGB", (120, 90), "white").save(tmp_path / "in" / "c.png")
    docs = expand_inputs([str(tmp_path / "in")])
    # Page 1 of a.pdf is long: later pages must overtake it and still be written in order.
    # Decoding (20 ms a step) is slower than rendering, so pages queue up for slots.
    engine = FakeEngine(n_tokens=lambda f: 40 if (f.doc, f.page) == (1, 1) else 3 + f.page % 5, step_sleep=0.02)
    progress = []
    summary = run_pipeline(
        docs, engine, options(tmp_path, formats=("md", "jsonl", "txt"), page_files=True, batch_size=3), progress.append
    )
    out = tmp_path / "out"
    assert summary.exit_code == ExitCode.OK and not summary.failed_pages and not summary.interrupted
    assert [d.status for d in summary.documents] == ["written", "written", "written"]
    assert [d.doc.path.name for d in summary.documents] == ["a.pdf", "c.png", "b.pdf"]
    md_a = md_body(out / "a.md")
    assert md_a == "<!-- page 1 -->\n\n" + expected_text(1, 1, 40) + "\n\n" + md_expected([(1, p) for p in range(2, 8)])
    assert md_body(out / "sub" / "b.md") == md_expected([(2, p) for p in range(1, 4)])
    assert md_body(out / "c.md") == "<!-- page 1 -->\n\n" + expected_text(0, 0, 3) + "\n"  # no marks
    assert md_body(out / "a" / "page-0007.md") == md_expected([(1, 7)])
    assert (out / "sub" / "b.txt").read_text().count("\f") == 2
    records = [json.loads(line) for line in (out / "a.jsonl").read_text().splitlines()]
    assert [r["page"] for r in records] == list(range(1, 8))
    assert records[0]["n_tokens"] == 40 and records[0]["finish_reason"] == "eos"
    assert all(r["seconds"]["render"] > 0 and r["seconds"]["decode"] > 0 for r in records)
    assert {p.name for p in summary.documents[0].outputs} >= {"a.md", "a.jsonl", "a.txt", "page-0001.md"}
    # continuous batching: never more than 3 together; page 1 shared batches with pages 4+
    assert max(len(b) for b in engine.batches) == 3
    assert any((1, 1) in b and (1, 5) in b for b in engine.batches)
    # progress: a first call with the totals, then one per page (and, on a slow machine, reports
    # every PROGRESS_EVERY while a page is under way, which count no page), tokens add up
    assert progress[0].pages_done == 0 and progress[0].pages_total == 11
    done = [p.pages_done for p in progress[1:]]
    assert done == sorted(done) and [d for d, before in zip(done, [0] + done) if d != before] == list(range(1, 12))
    assert progress[-1].tokens == summary.tokens == sum(len(b) for b in engine.batches)
    assert summary.pages_done == 11 and no_temp_files(out) and not render_children()


def test_corrupt_encrypted_and_empty_pdfs_among_good_ones(tmp_path):
    good1 = write_pdf(tmp_path / "in", "good1.pdf", 2, doc_no=1)
    bad = [shutil.copy(SAMPLES / "bad" / n, tmp_path / "in" / n) for n in ("corrupt.pdf", "encrypted.pdf", "zero-pages.pdf")]
    good2 = write_pdf(tmp_path / "in", "good2.pdf", 2, doc_no=2)
    docs = expand_inputs([str(good1), *map(str, bad), str(good2)])
    summary = run_pipeline(docs, FakeEngine(), options(tmp_path))
    status = {d.doc.path.name: d.status for d in summary.documents}
    assert status == {"good1.pdf": "written", "corrupt.pdf": "failed", "encrypted.pdf": "failed",
                      "zero-pages.pdf": "failed", "good2.pdf": "written"}
    reasons = {Path(f.path).name: (f.page, f.reason, f.option) for f in summary.failed_pages}
    assert reasons == {
        "corrupt.pdf": (None, "the PDF is damaged or truncated and cannot be opened", None),
        "encrypted.pdf": (None, "the PDF is encrypted: a password is needed", "password"),
        "zero-pages.pdf": (None, "the PDF has no pages", None),
    }
    # the library names the setting as the options table does; the command line says its flag
    (encrypted,) = [f for f in summary.failed_pages if f.option]
    assert str(encrypted).endswith("encrypted.pdf: the PDF is encrypted: a password is needed (the password setting)")
    assert encrypted.said(flag_name).endswith(": the PDF is encrypted: a password is needed (--password)")
    assert summary.exit_code == ExitCode.PAGES_FAILED
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good1.md", "good2.md"]
    # with the password the encrypted one is read too
    summary = run_pipeline(docs, FakeEngine(), options(tmp_path, password=ms.PASSWORD))
    assert {d.doc.path.name: d.status for d in summary.documents}["encrypted.pdf"] == "written"
    assert "Confidential" not in md_body(tmp_path / "out" / "encrypted.md")  # fake engine text
    assert md_body(tmp_path / "out" / "encrypted.md").startswith("<!-- page 1 -->")


def test_crashing_render_worker_costs_one_page(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 5, doc_no=1)
    b = write_pdf(tmp_path / "in", "b.pdf", 2, doc_no=2)
    hook = CrashingRender({("a.pdf", 2)}, mode="segv")
    summary = run_pipeline(expand_inputs([str(a), str(b)]), FakeEngine(), options(tmp_path), render_fn=hook)
    assert [d.status for d in summary.documents] == ["partial", "written"]
    (failure,) = summary.failed_pages
    assert (Path(failure.path).name, failure.page) == ("a.pdf", 3)
    assert failure.reason == "the render worker crashed (killed by SIGSEGV)"
    assert str(failure).endswith("a.pdf page 3: the render worker crashed (killed by SIGSEGV)")
    md = md_body(tmp_path / "out" / "a.md")
    assert md == (
        md_expected([(1, 1), (1, 2)]) + "\n<!-- page 3 failed: the render worker crashed (killed by SIGSEGV) -->\n\n"
        + md_expected([(1, 4), (1, 5)])
    )
    assert summary.exit_code == ExitCode.PAGES_FAILED


def test_engine_failures_and_looping_pages_do_not_stop_the_batch(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 8, doc_no=1)
    engine = FakeEngine(
        fail_vision=lambda f: f.page == 2,
        fail_prefill=lambda f: f.page == 4,
        loops=lambda f: f.page in (5, 6),
        loop_limit=None,  # page 5 and 6 run into max_tokens
    )
    summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, batch_size=2, sampling=SamplingOptions(max_tokens=30)))
    (outcome,) = summary.documents
    assert outcome.status == "partial"
    assert [(f.page, f.reason) for f in summary.failed_pages] == [
        (2, "vision stage failed: RuntimeError: fake vision failure on doc 1 page 2"),
        (4, "prefill failed: ValueError: fake prefill failure on doc 1 page 4"),
    ]
    md = md_body(tmp_path / "out" / "a.md")
    assert "<!-- page 5 stopped: max_tokens -->\n\ndoc 1 page 5: " + " ".join(["loop"] * 30) in md
    assert "<!-- page 8 -->\n\n" + expected_text(1, 8) in md
    # the engine's repetition guard
    engine = FakeEngine(loops=lambda f: f.page == 1, loop_limit=12)
    summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, overwrite=True, pages="1-2"))
    md = md_body(tmp_path / "out" / "a.md")
    assert md.startswith("<!-- page 1 stopped: repetition -->") and summary.exit_code == ExitCode.OK


class DecodeFailsOnce(FakeEngine):
    def decode_step(self, seqs):
        if any(s.features.page == 3 for s in seqs) and not getattr(self, "failed", False):
            self.failed = {s.features.page for s in seqs}
            raise MemoryError("fake out of memory")
        super().decode_step(seqs)


def test_failing_decode_step_fails_only_that_batch(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 6, doc_no=1)
    engine = DecodeFailsOnce(n_tokens=lambda f: 4, step_sleep=0.02)
    summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, batch_size=2))
    failed = {f.page for f in summary.failed_pages}
    assert failed == engine.failed and len(failed) == 2  # page 3 and its batch mate
    assert all(f.reason == "decode step failed: MemoryError: fake out of memory" for f in summary.failed_pages)
    assert summary.documents[0].status == "partial"


def test_document_with_no_readable_page_writes_nothing(tmp_path):
    write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    Image.new("RGB", (3, 3)).save(tmp_path / "in" / "speck.png")
    summary = run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(fail_vision=lambda f: True), options(tmp_path))
    assert [d.status for d in summary.documents] == ["failed", "failed"]
    assert [(Path(f.path).name, f.page) for f in summary.failed_pages] == [("a.pdf", 1), ("a.pdf", 2), ("a.pdf", 3), ("speck.png", 1)]
    assert "too small to read (3x3 px)" in summary.failed_pages[-1].reason
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    assert summary.exit_code == ExitCode.INPUT_UNREADABLE


def test_skip_existing_and_overwrite(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 2, doc_no=1)
    docs = expand_inputs([str(a)])
    run_pipeline(docs, FakeEngine(), options(tmp_path, formats=("md", "jsonl")))
    engine = FakeEngine()
    summary = run_pipeline(docs, engine, options(tmp_path, formats=("md", "jsonl")))
    (outcome,) = summary.documents
    assert outcome.status == "skipped" and outcome.note == "outputs exist" and engine.prefills == []
    assert summary.exit_code == ExitCode.OK
    # a bad document beside one read before: some failed (1), not "nothing could be read" (4)
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", tmp_path / "in" / "b.pdf")
    mixed = run_pipeline(expand_inputs([str(a), str(tmp_path / "in" / "b.pdf")]), FakeEngine(),
                         options(tmp_path, formats=("md", "jsonl")))
    assert [d.status for d in mixed.documents] == ["skipped", "failed"]
    assert mixed.exit_code == ExitCode.PAGES_FAILED
    # a missing secondary output means the set is incomplete: redo it
    (tmp_path / "out" / "a.jsonl").unlink()
    assert run_pipeline(docs, FakeEngine(), options(tmp_path, formats=("md", "jsonl"))).documents[0].status == "written"
    (tmp_path / "out" / "a.md").write_text("stale")
    engine = FakeEngine()
    summary = run_pipeline(docs, engine, options(tmp_path, overwrite=True))
    assert summary.documents[0].status == "written" and len(engine.prefills) == 2
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(1, 1), (1, 2)])


def test_a_file_of_the_users_where_outputs_go_is_not_written_over(tmp_path):
    """A Markdown of the user's own (no source recorded: not ours) where a document's outputs go
    was replaced without --overwrite, exit 0, no word of it; outputs of other documents were kept
    and outputs of ours were never removed unless they recorded the document. It is left as it is,
    the outputs go to the document's other name, and the run says so; the next run finds them
    there. --overwrite is the user's word: it writes over such a file."""
    a = write_pdf(tmp_path / "in", "a.pdf", 2, doc_no=1)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.md").write_text("# my notes on a.pdf\n")
    summary = run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(tmp_path, formats=("md", "jsonl")))
    (outcome,) = summary.documents
    written = [p for p in out.iterdir() if p.name.startswith("a-") and p.suffix == ".md"]
    assert outcome.status == "written" and summary.exit_code == ExitCode.OK and len(written) == 1
    assert outcome.note == (f"{out / 'a.md'} records no source, so it is no output of pantheon-ocr: left as it is, "
                            f"the outputs written as {written[0]}")
    assert (out / "a.md").read_text() == "# my notes on a.pdf\n" and not (out / "a.jsonl").exists()
    assert md_body(written[0]) == md_expected([(1, 1), (1, 2)])
    engine = FakeEngine()
    again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, formats=("md", "jsonl")))
    assert again.documents[0].status == "skipped" and engine.prefills == []
    (out / "b.jsonl").write_text("not a record\n")  # a JSONL of no source is no output of ours either
    b = write_pdf(tmp_path / "in", "b.pdf", 1, doc_no=2)
    run_pipeline(expand_inputs([str(b)]), FakeEngine(), options(tmp_path, formats=("md", "jsonl")))
    assert (out / "b.jsonl").read_text() == "not a record\n" and not (out / "b.md").exists()
    c = write_pdf(tmp_path / "in", "c.pdf", 1, doc_no=3)
    (out / "c.md").write_text("# mine too\n")
    overwritten = run_pipeline(expand_inputs([str(c)]), FakeEngine(), options(tmp_path, overwrite=True))
    assert overwritten.documents[0].note == "" and md_body(out / "c.md") == md_expected([(3, 1)])


def test_a_document_with_failed_pages_is_read_again_by_the_next_run(tmp_path):
    """Outputs with a hole (a page timed out) are no document's last word: they record the failed
    pages, and the next run reads those again (it once skipped the document, "outputs exist", exit
    0, the hole kept for good), and only those: the pages that were read stay as written (a
    700-page document with one failed page was read whole again). The outputs come out equal to
    a run that never failed. Once whole, the document is skipped."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    clean = tmp_path / "clean"
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(clean, formats=("md", "jsonl")))
    for formats in (("md", "jsonl"), ("jsonl",), ("md",), ("md", "txt")):
        folder = tmp_path / "-".join(formats)
        out = dict(formats=formats)
        first = run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(folder, **out))
        assert first.documents[0].status == "partial" and first.exit_code == ExitCode.PAGES_FAILED
        before = json.loads((folder / "out" / "a.jsonl").read_text().splitlines()[0]) if "jsonl" in formats else None
        engine = FakeEngine()
        again = run_pipeline(expand_inputs([str(a)]), engine, options(folder, **out))
        (outcome,) = again.documents
        assert outcome.status == "written" and outcome.note == "page 2 not finished last time: read again, 2 pages kept from the outputs"
        assert engine.prefills == [(1, 2)] and again.exit_code == ExitCode.OK
        assert (again.pages_done, again.pages_kept) == (1, 2)
        if "md" in formats:
            written = md_header(folder / "out" / "a.md")
            assert {k: v for k, v in written.items() if k != "txt_sha256"} == md_header(clean / "out" / "a.md") | {
                "formats": ",".join(formats)}
            assert md_body(folder / "out" / "a.md") == md_expected([(1, 1), (1, 2), (1, 3)])
        if "txt" in formats:
            assert (folder / "out" / "a.txt").read_text().split("\f") == [expected_text(1, p) + "\n" for p in (1, 2, 3)]
            assert written["txt_sha256"] == hashlib.sha256((folder / "out" / "a.txt").read_bytes()).hexdigest()
        if "jsonl" in formats:
            records = [json.loads(r) for r in (folder / "out" / "a.jsonl").read_text().splitlines()]
            fresh = [json.loads(r) for r in (clean / "out" / "a.jsonl").read_text().splitlines()]
            assert records[0] == {k: v for k, v in before.items() if k != "doc_failed"}  # its tokens and seconds too
            assert [{k: v for k, v in r.items() if k not in ("seconds", "doc_formats", "doc_txt_sha256")} for r in records] == \
                   [{k: v for k, v in r.items() if k not in ("seconds", "doc_formats", "doc_txt_sha256")} for r in fresh]
            assert all(r["error"] is None and "doc_failed" not in r for r in records)
        engine = FakeEngine()
        third = run_pipeline(expand_inputs([str(a)]), engine, options(folder, **out))
        assert third.documents[0].status == "skipped" and engine.prefills == []


def test_a_failed_page_is_read_with_the_whole_document_when_its_outputs_cannot_be_read_back(tmp_path):
    """Kept pages come from the outputs; where those are damaged (a hand-edited JSONL) nothing is
    kept from them and the whole document is read again, never a half-parsed page kept."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    out = dict(formats=("md", "jsonl"))
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(tmp_path, **out))
    jsonl = tmp_path / "out" / "a.jsonl"
    jsonl.write_text(jsonl.read_text().replace('"page": 3', '"page": 3,,'))
    engine = FakeEngine()
    again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, **out))
    assert again.documents[0].note == "read again, all of it: page 2 not finished last time" and again.pages_kept == 0
    assert sorted(engine.prefills) == [(1, 1), (1, 2), (1, 3)]
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(1, 1), (1, 2), (1, 3)])


def test_pages_are_kept_only_from_outputs_of_this_very_file(tmp_path):
    """A JSONL of an older version of the file, left beside this version's Markdown (the formats
    changed between runs), gave its pages to the new version: they were kept under its record
    and the document passed for done."""
    a = tmp_path / "in" / "a.pdf"
    write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(tmp_path, formats=("md", "jsonl")))
    write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=2)  # a new version, read to Markdown only, page 2 failing
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(tmp_path, formats=("md",)))
    engine = FakeEngine()
    again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, formats=("md", "jsonl")))
    assert again.documents[0].note == "read again, all of it: page 2 not finished last time" and again.pages_kept == 0
    assert sorted(engine.prefills) == [(2, 1), (2, 2), (2, 3)]
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(2, 1), (2, 2), (2, 3)])


def test_pages_are_kept_only_from_a_jsonl_that_records_the_markdowns_reading(tmp_path):
    """Kept pages come from the JSONL, which a run with --format md leaves as it was: its pages,
    of another reading of this very file (another model's, or with another page failed), were
    kept under the Markdown's record, and the document came out read by two models."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    out = dict(formats=("md", "jsonl"))
    old, new = "old.gguf + old-mmproj.gguf #1", "new.gguf + new-mmproj.gguf #2"
    for failing in (2, 3):  # the Markdown's failed page is the JSONL's, or another
        folder = tmp_path / str(failing)
        run_pipeline(expand_inputs([str(a)]), FakeEngine(model=old, fail_vision=lambda f: f.page == 2), options(folder, **out))
        run_pipeline(expand_inputs([str(a)]), FakeEngine(model=new, fail_vision=lambda f: f.page == failing),
                     options(folder, formats=("md",), overwrite=True))
        assert all(json.loads(r)["model"] == old for r in (folder / "out" / "a.jsonl").read_text().splitlines())
        engine = FakeEngine(model=new)
        again = run_pipeline(expand_inputs([str(a)]), engine, options(folder, **out))
        assert again.documents[0].status == "written" and again.pages_kept == 0
        assert again.documents[0].note == f"read again, all of it: page {failing} not finished last time"
        assert sorted(engine.prefills) == [(1, 1), (1, 2), (1, 3)]
        records = [json.loads(r) for r in (folder / "out" / "a.jsonl").read_text().splitlines()]
        assert [r["model"] for r in records] == [new] * 3 and all(r["error"] is None for r in records)
        assert md_body(folder / "out" / "a.md") == md_expected([(1, 1), (1, 2), (1, 3)])


def test_pages_are_kept_only_from_outputs_of_the_same_model(tmp_path):
    """Unfinished outputs kept their pages whatever model had read them: a run with a new model
    (or the next version's bundled reader) read the rest, and the document came out read by two.
    The outputs record the model; pages of another's are read again, with the document, and so
    are those of outputs that record none."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    out = dict(formats=("md", "jsonl"))
    old, new = "old.gguf + old-mmproj.gguf #1", "new.gguf + new-mmproj.gguf #2"
    run_pipeline(expand_inputs([str(a)]), FakeEngine(model=old, fail_vision=lambda f: f.page == 2), options(tmp_path, **out))
    md, jsonl = tmp_path / "out" / "a.md", tmp_path / "out" / "a.jsonl"
    assert f'"model": "{old}"' in md.read_text().splitlines()[0]
    assert all(json.loads(r)["model"] == old for r in jsonl.read_text().splitlines())
    engine = FakeEngine(model=new)
    again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, **out))
    assert again.documents[0].note == f"read again, all of it: page 2 not finished last time, and the pages read then were another model's ({old})"
    assert sorted(engine.prefills) == [(1, 1), (1, 2), (1, 3)] and again.pages_kept == 0
    assert all(json.loads(r)["model"] == new for r in jsonl.read_text().splitlines())
    # --overwrite with another model records that model, so its pages are never kept for the first
    run_pipeline(expand_inputs([str(a)]), FakeEngine(model=old, fail_vision=lambda f: f.page == 2),
                 options(tmp_path, overwrite=True, **out))
    assert all(json.loads(r)["model"] == old for r in jsonl.read_text().splitlines())
    # the same model keeps its pages; outputs that record none (an archive job's, an older
    # version's) may be another's: they kept theirs, and a job's reading came out as this model's
    for recorded in (new, None):
        run_pipeline(expand_inputs([str(a)]), FakeEngine(model=new, fail_vision=lambda f: f.page == 2),
                     options(tmp_path, overwrite=True, **out))
        if recorded is None:
            md.write_text(md.read_text().replace(f', "model": "{new}"', ""))
            jsonl.write_text(jsonl.read_text().replace(f', "model": "{new}"', ""))
        engine = FakeEngine(model=new)
        again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, **out))
        if recorded is None:
            assert sorted(engine.prefills) == [(1, 1), (1, 2), (1, 3)] and again.pages_kept == 0
            assert again.documents[0].note == ("read again, all of it: page 2 not finished last time, "
                                               "and the outputs do not say which model read the pages then")
        else:
            assert engine.prefills == [(1, 2)] and again.pages_kept == 2


def test_a_stale_or_unfinished_jsonl_beside_a_finished_markdown_is_not_done(tmp_path):
    """Only the Markdown's record was checked when both formats were asked for: a JSONL of an
    earlier version of the file, or one an unfinished run left (pages marked not read), beside a
    Markdown finished since with --format md, was kept for good and the document skipped, exit 0."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    both, md = options(tmp_path, formats=("md", "jsonl")), options(tmp_path, formats=("md",))
    jsonl = tmp_path / "out" / "a.jsonl"

    def jsonl_texts():
        return [json.loads(r)["text"] if json.loads(r)["error"] is None else None for r in jsonl.read_text().splitlines()]

    run_pipeline(expand_inputs([str(a)]), FakeEngine(), both)
    write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=2)  # a new version, read to Markdown only
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), md)
    again = run_pipeline(expand_inputs([str(a)]), FakeEngine(), both)
    assert again.documents[0].status == "written"
    assert jsonl_texts() == [expected_text(2, p) for p in (1, 2, 3)]
    # unfinished in both formats, then finished in Markdown alone
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(tmp_path, overwrite=True,
                                                                                                  formats=("md", "jsonl")))
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), md)
    assert jsonl_texts()[1] is None
    again = run_pipeline(expand_inputs([str(a)]), FakeEngine(), both)
    assert again.documents[0].status == "written" and jsonl_texts() == [expected_text(2, p) for p in (1, 2, 3)]
    assert run_pipeline(expand_inputs([str(a)]), FakeEngine(), both).documents[0].status == "skipped"


def test_a_fifo_planted_at_an_output_s_name_does_not_hang_the_run(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    out = dict(formats=("md", "jsonl"))
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(tmp_path, **out))
    (tmp_path / "out" / "a.jsonl").unlink()
    os.mkfifo(tmp_path / "out" / "a.jsonl")
    done = []
    worker = threading.Thread(target=lambda: done.append(run_pipeline(expand_inputs([str(a)]), FakeEngine(),
                                                                      options(tmp_path, **out))), daemon=True)
    worker.start()
    worker.join(60)
    assert done and done[0].pages_kept == 0  # nothing read back from it; the run went on


def test_pages_newly_selected_are_read_beside_the_failed_ones(tmp_path):
    """`--pages 1-2` with page 2 failed, then every page: page 1 is kept, 2 and 3 are read."""
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), options(tmp_path, pages="1-2"))
    engine = FakeEngine()
    again = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path))
    assert sorted(engine.prefills) == [(1, 2), (1, 3)] and again.pages_kept == 1
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(1, 1), (1, 2), (1, 3)])
    # page 1 failed, then only page 2 asked for: nothing read, and said so
    run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 1), options(tmp_path, overwrite=True))
    engine = FakeEngine()
    third = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, pages="2"))
    assert engine.prefills == [] and third.documents[0].status == "written"
    assert third.documents[0].note == "page 1 not finished last time and is not selected now: 1 page kept from the outputs"


def test_a_page_damaged_in_the_file_is_not_read_again_and_again(tmp_path):
    """A failure the input itself makes (a TIFF whose last frame is cut short) is the same on every
    run: its outputs do not record it, and the next run skips the document (a 700-page document
    with one damaged page was read whole every night, exit 1 each time)."""
    from PIL import ImageDraw

    frames = [Image.new("L", (600, 800), 255) for _ in range(4)]
    for i, frame in enumerate(frames):
        ImageDraw.Draw(frame).text((50, 50), f"page {i + 1}", fill=0)
    (tmp_path / "in").mkdir()
    frames[0].save(tmp_path / "full.tif", save_all=True, append_images=frames[1:], compression="tiff_lzw")
    data = (tmp_path / "full.tif").read_bytes()
    (tmp_path / "in" / "cut.tif").write_bytes(data[: len(data) * 9 // 10])
    first = run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(), options(tmp_path))
    assert first.documents[0].status == "partial" and [f.page for f in first.failed_pages] == [4]
    assert '"failed"' not in (tmp_path / "out" / "cut.md").read_text().splitlines()[0]
    engine = FakeEngine()
    again = run_pipeline(expand_inputs([str(tmp_path / "in")]), engine, options(tmp_path))
    assert again.documents[0].status == "skipped" and engine.prefills == []


def test_a_stale_txt_beside_a_markdown_of_a_later_version_is_not_taken_as_done(tmp_path):
    """A txt file records nothing. Read with --format md,txt, changed, read again with --format md:
    the txt of the old version stayed, and a run with --format md,txt took it as done (the
    Markdown's record matched). The Markdown and JSONL now record the formats written with them."""
    src = tmp_path / "in" / "a.pdf"
    src.parent.mkdir()
    src.write_bytes(marked_pdf(2, 1))
    run_pipeline(expand_inputs([str(src)]), FakeEngine(), options(tmp_path, formats=("md", "txt")))
    assert md_header(tmp_path / "out" / "a.md")["formats"] == "md,txt"
    src.write_bytes(marked_pdf(3, 2))  # a new version
    run_pipeline(expand_inputs([str(src)]), FakeEngine(), options(tmp_path, formats=("md",)))
    assert md_header(tmp_path / "out" / "a.md")["formats"] == "md"
    engine = FakeEngine()
    summary = run_pipeline(expand_inputs([str(src)]), engine, options(tmp_path, formats=("md", "txt")))
    assert summary.documents[0].status == "written" and summary.pages_done == 3
    assert (tmp_path / "out" / "a.txt").read_text().split("\f") == [expected_text(2, p) + "\n" for p in (1, 2, 3)]
    # written together, the next run skips them; a run asking for fewer formats than were written too
    for formats in (("md", "txt"), ("md",), ("txt", "md")):
        again = run_pipeline(expand_inputs([str(src)]), FakeEngine(), options(tmp_path, formats=formats))
        assert again.documents[0].status == "skipped", formats
    # a txt-only run (which records nothing) rewrote the txt: the Markdown no longer vouches for it
    run_pipeline(expand_inputs([str(src)]), FakeEngine(), options(tmp_path, formats=("txt",), pages="1"))
    assert (tmp_path / "out" / "a.txt").read_text().count("\f") == 0
    again = run_pipeline(expand_inputs([str(src)]), FakeEngine(), options(tmp_path, formats=("md", "txt")))
    assert again.documents[0].status == "written"
    assert (tmp_path / "out" / "a.txt").read_text().split("\f") == [expected_text(2, p) + "\n" for p in (1, 2, 3)]


def test_the_same_file_by_another_path_is_not_read_twice(tmp_path):
    """in/../in/a.pdf, or a.pdf reached through a linked folder, is the file whose outputs are
    there: skipped, not read again and written beside them as a-<id>.md."""
    a = write_pdf(tmp_path / "in", "a.pdf", 2, doc_no=1)
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(tmp_path))
    (tmp_path / "link").symlink_to(tmp_path / "in")
    for spelling in (tmp_path / "in" / ".." / "in" / "a.pdf", tmp_path / "link" / "a.pdf"):
        engine = FakeEngine()
        summary = run_pipeline(expand_inputs([str(spelling)]), engine, options(tmp_path))
        assert summary.documents[0].status == "skipped" and engine.prefills == []
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.md"]


def test_a_shared_name_stays_with_the_document_whose_outputs_hold_it(tmp_path):
    """b/x.pdf alone, then a/x.pdf with it: a sorts first and would take x.md, but x.md is b's.
    b keeps it (skipped: nothing read twice, no second copy) and a takes its own suffixed name;
    the next run skips both."""
    a = write_pdf(tmp_path / "a", "x.pdf", 2, doc_no=1)
    b = write_pdf(tmp_path / "b", "x.pdf", 1, doc_no=2)
    run_pipeline(expand_inputs([str(b)]), FakeEngine(), options(tmp_path))
    engine = FakeEngine()
    summary = run_pipeline(expand_inputs([str(a), str(b)]), engine, options(tmp_path))
    by_path = {str(d.doc.path): d for d in summary.documents}
    assert by_path[str(b)].status == "skipped" and by_path[str(b)].outputs[0].name == "x.md"
    a_out = by_path[str(a)].outputs[0]
    assert by_path[str(a)].status == "written" and a_out.name.startswith("x-") and len(engine.prefills) == 2
    assert md_body(a_out) == md_expected([(1, 1), (1, 2)]) and md_body(tmp_path / "out" / "x.md") == md_expected([(2, 1)])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["x.md", a_out.name])
    again = FakeEngine()
    assert [d.status for d in run_pipeline(expand_inputs([str(b), str(a)]), again, options(tmp_path)).documents] \
        == ["skipped", "skipped"] and again.prefills == []
    # x.md goes (deleted by hand): a keeps its own outputs where they are, not moved to the free
    # x.md (read again, its old copy left behind); only b, whose outputs are gone, is read
    (tmp_path / "out" / "x.md").unlink()
    third = FakeEngine()
    summary = run_pipeline(expand_inputs([str(a), str(b)]), third, options(tmp_path))
    by_path = {str(d.doc.path): d for d in summary.documents}
    assert by_path[str(a)].status == "skipped" and by_path[str(a)].outputs[0] == a_out
    assert by_path[str(b)].status == "written" and third.prefills == [(2, 1)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([a_out.name, by_path[str(b)].outputs[0].name])


def test_page_spec_is_clipped_per_document(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 10, doc_no=1)
    b = write_pdf(tmp_path / "in", "b.pdf", 3, doc_no=2)
    c = write_pdf(tmp_path / "in", "c.pdf", 1, doc_no=3)
    summary = run_pipeline(expand_inputs([str(a), str(b), str(c)]), FakeEngine(), options(tmp_path, pages="2-3,9"))
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(1, 2), (1, 3), (1, 9)])
    assert md_body(tmp_path / "out" / "b.md") == md_expected([(2, 2), (2, 3)])
    # what a document lacks of the selection is said with it, not dropped in silence
    assert [d.note for d in summary.documents[:2]] == ["", "selected page 9 past its end: it has 3 pages"]
    # c has none of the selected pages: nothing of it is read, so it is a failure (exit 1), named
    c_out = summary.documents[2]
    assert c_out.status == "failed" and "none of the selected pages (2-3,9) exists: the document has 1 page" in c_out.failures[0].reason
    assert summary.exit_code == 1 and not (tmp_path / "out" / "c.md").exists()
    with pytest.raises(UsageError, match="bad page range"):
        run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(tmp_path, pages="3-1"))


def overlapping(spans_a, spans_b) -> bool:
    return any(a0 < b1 and b0 < a1 for a0, a1, _ in spans_a for b0, b1, _ in spans_b)


@pytest.mark.parametrize("overlap,engine_says,overlapped", [(True, False, True), (False, True, False),
                                                            (None, True, True), (None, False, False)])
def test_overlap_switch(tmp_path, overlap, engine_says, overlapped):
    """overlap on or off as asked; left to the engine (None, the default), as the engine says."""
    a = write_pdf(tmp_path / "in", "a.pdf", 6, doc_no=1)
    engine = FakeEngine(vision_sleep=0.05, step_sleep=0.01, n_tokens=lambda f: 8, overlaps=engine_says)
    summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, overlap=overlap, batch_size=2))
    assert summary.documents[0].status == "written"
    assert md_body(tmp_path / "out" / "a.md") == md_expected([(1, p) for p in range(1, 7)], n_tokens=8)
    vision_threads = {t for _, _, t in engine.vision_spans}
    decode_threads = {t for _, _, t in engine.decode_spans}
    if overlapped:
        assert vision_threads == {"pantheon-vision"} and decode_threads == {"pantheon-cpu"}
        assert overlapping(engine.vision_spans, engine.decode_spans)
    else:
        assert vision_threads == decode_threads == {"pantheon-cpu"}
        assert not overlapping(engine.vision_spans, engine.decode_spans)


def test_a_run_left_to_the_engine_plans_its_threads_again(tmp_path):
    """Planned before the engine exists (overlap None: as if overlapping, half each), the run
    gives the one stage at a time every thread once the engine says the stages do not overlap."""
    from pantheon_ocr.engine import threads

    seen = []

    class Counting(FakeEngine):
        def vision(self, image):
            seen.append(threads.current())
            return super().vision(image)

    a = write_pdf(tmp_path / "in", "a.pdf", 2, doc_no=1)
    try:
        assert threads.stage_threads(2, overlap=None) == 1
        threads.set_threads(1)
        summary = run_pipeline(expand_inputs([str(a)]), Counting(overlaps=False), options(tmp_path))
    finally:
        threads.set_threads(threads.stage_threads(None, overlap=False))
    assert summary.documents[0].status == "written"
    assert seen == [2, 2]


def test_a_stage_with_the_other_idle_takes_every_core(tmp_path):
    """Overlapping stages on 2 threads: the first page's vision runs with both (the CPU stage holds
    no page and can get none before it), later pages' with one while pages decode, and the decode
    steps (and prefill) from the end of the last vision on with both again."""
    from pantheon_ocr.engine import threads

    seen: dict[str, list] = {"vision": [], "decode": []}

    class Counting(FakeEngine):
        def vision(self, image):
            seen["vision"].append(threads.current())
            return super().vision(image)

        def decode_step(self, seqs):
            seen["decode"].append(threads.current())
            return super().decode_step(seqs)

    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    threads.set_threads(threads.stage_threads(2, overlap=True))
    try:
        # a page decodes for 16 x 50 ms: the next pages are rendered and encoded meanwhile
        engine = Counting(vision_sleep=0.1, step_sleep=0.05, n_tokens=lambda f: 16)
        summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, batch_size=2))
    finally:
        threads.set_threads(threads.stage_threads(None, overlap=False))
    assert summary.documents[0].status == "written"
    assert seen["vision"] == [2, 1, 1]
    assert 1 in seen["decode"] and seen["decode"][-1] == 2
    assert seen["decode"][seen["decode"].index(2):] == [2] * (len(seen["decode"]) - seen["decode"].index(2))


def test_beside_a_vision_stage_off_the_cpu_the_cpu_stage_keeps_every_core(tmp_path):
    """The vision on a GPU overlapping the CPU stage takes none of the cores: planned before the
    engine exists (half each), every prefill chunk and decode step runs with the run's total
    (with half, an H100 machine's prefill took 3.62 s a page against 3.00)."""
    from pantheon_ocr.engine import threads

    seen = []

    class Counting(FakeEngine):
        def decode_step(self, seqs):
            seen.append(threads.current())
            return super().decode_step(seqs)

    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    threads.set_threads(threads.stage_threads(2, overlap=None))
    try:
        engine = Counting(vision_sleep=0.1, step_sleep=0.05, n_tokens=lambda f: 16, vision_device="cuda")
        summary = run_pipeline(expand_inputs([str(a)]), engine, options(tmp_path, batch_size=2))
    finally:
        threads.set_threads(threads.stage_threads(None, overlap=False))
    assert summary.documents[0].status == "written"
    assert overlapping(engine.vision_spans, engine.decode_spans)  # the stages did overlap
    assert seen and set(seen) == {2}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_memory_stays_bounded_on_a_long_pdf(tmp_path):
    n = 100
    path = tmp_path / "long.pdf"
    path.write_bytes(ms.numbered_pages(n))
    # Rendering (2 workers) is faster than this vision stage, so without back-pressure
    # rendered pages (1190 x 1540 RGB = 5.5 MB each) would pile up: ~550 MB for 100 pages.
    engine = FakeEngine(vision_sleep=0.02, n_tokens=lambda f: 2)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], vm_rss_kb())
            time.sleep(0.005)

    base = vm_rss_kb()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        summary = run_pipeline(expand_inputs([str(path)]), engine, options(tmp_path, render_queue=4))
    finally:
        done.set()
        sampler.join()
    assert summary.documents[0].status == "written" and summary.pages_done == n
    growth_mb = (peak[0] - base) / 1024
    assert growth_mb < 150, f"RSS grew by {growth_mb:.0f} MB"


def test_ctrl_c_keeps_finished_documents_and_the_pages_read_of_the_others(tmp_path):
    """A stopped run wrote nothing of a document it had not finished: a 3,000-page PDF stopped at
    page 1,901 lost 11 minutes of reading. Its pages read so far are written, the others marked
    not read; the next run reads only those, and the outputs come out as a run never stopped
    writes them."""
    first = write_pdf(tmp_path / "in", "first.pdf", 2, doc_no=1)
    second = write_pdf(tmp_path / "in", "second.pdf", 25, doc_no=2)
    docs = [str(first), str(second)]
    fired = []

    def on_step(n):
        # Ctrl-C from the terminal: SIGINT to the process, KeyboardInterrupt in the main thread.
        if n == 30 and not fired:
            fired.append(n)
            os.kill(os.getpid(), signal.SIGINT)

    engine = FakeEngine(step_sleep=0.005, on_step=on_step, n_tokens=lambda f: 5)
    t0 = time.monotonic()
    out_opts = dict(formats=("md", "jsonl"), page_files=True, batch_size=2)
    summary = run_pipeline(expand_inputs(docs), engine, options(tmp_path, **out_opts))
    assert time.monotonic() - t0 < 10
    assert fired and summary.interrupted and summary.exit_code == ExitCode.INTERRUPTED
    assert [d.status for d in summary.documents] == ["written", "interrupted"]
    out = tmp_path / "out"
    assert md_body(out / "first.md") == md_expected([(1, 1), (1, 2)], n_tokens=5)
    read = [r["page"] for r in map(json.loads, (out / "second.jsonl").read_text().splitlines()) if r["error"] is None]
    unread = [p for p in range(1, 26) if p not in read]
    assert 0 < len(read) < 25 and summary.documents[1].note == (
        f"stopped before it was complete: {len(read)} of 25 pages written, the next run reads the other {len(unread)}")
    assert summary.documents[1].outputs == (out / "second.jsonl", out / "second.md")  # no page files: not needed
    markers = re.findall(rf"^<!-- page (\d+)( failed: {NOT_READ})? -->$", (out / "second.md").read_text(), re.M)
    assert [(int(p), bool(f)) for p, f in markers] == [(p, p in unread) for p in range(1, 26)]
    assert sorted(p.name for p in out.iterdir()) == ["first", "first.jsonl", "first.md", "second.jsonl", "second.md"]
    assert no_temp_files(out) and not render_children()
    # the next run skips the finished document and reads only the pages the other lacks
    engine = FakeEngine(n_tokens=lambda f: 5)
    summary = run_pipeline(expand_inputs(docs), engine, options(tmp_path, **out_opts))
    assert [d.status for d in summary.documents] == ["skipped", "written"]
    assert sorted(p for _, p in engine.prefills) == unread and summary.pages_kept == len(read)
    clean = tmp_path / "clean"
    run_pipeline(expand_inputs(docs), FakeEngine(n_tokens=lambda f: 5), options(clean, **out_opts))
    assert (out / "second.md").read_text() == (clean / "out" / "second.md").read_text()
    assert sorted(os.listdir(out / "second")) == sorted(os.listdir(clean / "out" / "second"))


def test_a_document_under_way_is_written_every_checkpoint_against_a_kill(tmp_path, monkeypatch):
    """kill -9 (the OOM killer, a reboot) gives the run no time to write anything: a document
    under way has its pages so far written every CHECKPOINT_EVERY seconds, so a kill loses at
    most that much reading; the clock starts with its first page, not with the run. Without
    page files (the next run reads the Markdown or the JSONL), and never for txt alone."""
    from pantheon_ocr.pipeline import run as pipeline_run

    monkeypatch.setattr(pipeline_run, "CHECKPOINT_EVERY", 0.0)
    doc = write_pdf(tmp_path / "in", "a.pdf", 6, doc_no=1)
    md, seen = tmp_path / "out" / "a.md", []

    def on_progress(p):  # what a kill after this page would leave on disk (called after each page)
        if md.exists() and (not seen or seen[-1][0] != p.pages_done):
            seen.append((p.pages_done, md.read_text().count("failed: not read"), (tmp_path / "out" / "a").exists()))

    summary = run_pipeline(expand_inputs([str(doc)]), FakeEngine(n_tokens=lambda f: 3),
                           options(tmp_path, batch_size=1, page_files=True), on_progress=on_progress)
    assert summary.documents[0].status == "written" and md_body(md) == md_expected([(1, p) for p in range(1, 7)], n_tokens=3)
    # page 1 starts the clock; from page 2 each page is written as it comes, without page files
    assert seen == [(2, 4, False), (3, 3, False), (4, 2, False), (5, 1, False), (6, 0, True)]
    txt = tmp_path / "txt"
    run_pipeline(expand_inputs([str(doc)]), FakeEngine(n_tokens=lambda f: 3), options(txt, formats=("txt",)),
                 on_progress=lambda p: seen.append((txt / "out" / "a.txt").exists() and p.pages_done < 6))
    assert not any(seen[5:])  # txt records no page: the next run reads it all, so nothing is kept early


class BrokenEngine(FakeEngine):
    def prefill(self, features, sampling):
        return object()  # not a Seq: a bug in the engine, not a page failure


def test_engine_bug_is_raised_not_hidden(tmp_path):
    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    with pytest.raises(AttributeError):
        run_pipeline(expand_inputs([str(a)]), BrokenEngine(), options(tmp_path))
    assert not render_children()


def test_options_are_validated():
    with pytest.raises(UsageError, match="formats"):
        PipelineOptions(out_dir="x", formats=("md", "html"))
    with pytest.raises(UsageError, match="batch_size"):
        PipelineOptions(out_dir="x", batch_size=0)
    with pytest.raises(UsageError, match="top_p"):
        SamplingOptions(top_p=0)
    assert PipelineOptions(out_dir="x").out_dir == Path("x")


def test_an_animated_image_s_outcome_says_its_other_frames_are_not_read(tmp_path):
    frames = [Image.new("RGB", (640, 480), (60 * i, 90, 90)) for i in range(3)]
    path = tmp_path / "in" / "anim.gif"
    path.parent.mkdir()
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    summary = run_pipeline(expand_inputs([str(path)]), FakeEngine(), options(tmp_path))
    assert [(d.status, d.note) for d in summary.documents] == [
        ("written", "an animated image: only its first frame of 3 is read")]
    second = run_pipeline(expand_inputs([str(path)]), FakeEngine(), options(tmp_path, pages="2"))
    assert second.documents[0].failures[0].reason == ("none of the selected pages (2) exists: the document has 1 page "
                                                      "(an animated image: only its first frame of 3 is read)")


@pytest.mark.parametrize("how", ["scratch", "overwrite"])
def test_an_unfinished_document_is_not_kept_in_a_scratch_folder_and_said_so_when_overwriting(tmp_path, how):
    """transcribe -o - writes to a scratch folder that goes with the run: the pages read of a
    document it did not finish are not kept there (they were printed, "not read" marks and all,
    and the summary promised a next run that reads only the rest). A run that overwrites keeps
    them, and says that a next run that overwrites again reads it all."""
    second = write_pdf(tmp_path / "in", "second.pdf", 25, doc_no=2)
    fired = []

    def on_step(n):
        if n == 20 and not fired:
            fired.append(n)
            os.kill(os.getpid(), signal.SIGINT)

    opts = dict(keep_unfinished=False) if how == "scratch" else dict(overwrite=True)
    summary = run_pipeline(expand_inputs([str(second)]), FakeEngine(step_sleep=0.005, on_step=on_step,
                                                                   n_tokens=lambda f: 5), options(tmp_path, **opts))
    (outcome,) = summary.documents
    assert summary.interrupted and outcome.status == "interrupted"
    if how == "scratch":
        assert outcome.outputs == () and outcome.note == "stopped before it was complete"
        assert not (tmp_path / "out" / "second.md").exists()
    else:
        assert outcome.outputs == (tmp_path / "out" / "second.md",)
        assert outcome.note.endswith(" pages written, the next run reads the other "
                                     f"{25 - summary.pages_done} unless it overwrites again")


@pytest.mark.parametrize("how", ["overwrite", "pages"])
def test_a_stopped_run_keeps_the_finished_reading_it_was_replacing(tmp_path, how):
    """--overwrite over a document whose outputs were a finished reading, stopped (or killed after
    a checkpoint), put the part read so far in their place: 8 pages of 20 and the rest "not read",
    the whole earlier text gone. So did a run over other pages (--pages 2-25 over a whole
    reading). The finished outputs now stay until the new reading is whole."""
    second = write_pdf(tmp_path / "in", "second.pdf", 25, doc_no=2)
    run_pipeline(expand_inputs([str(second)]), FakeEngine(n_tokens=lambda f: 5), options(tmp_path, formats=("md", "jsonl")))
    md, jsonl = tmp_path / "out" / "second.md", tmp_path / "out" / "second.jsonl"
    before = md.read_bytes(), jsonl.read_bytes()
    fired = []

    def on_step(n):
        if n == 20 and not fired:
            fired.append(n)
            os.kill(os.getpid(), signal.SIGINT)

    again = dict(overwrite=True) if how == "overwrite" else dict(pages="2-25")
    summary = run_pipeline(expand_inputs([str(second)]), FakeEngine(step_sleep=0.005, on_step=on_step, n_tokens=lambda f: 4),
                           options(tmp_path, formats=("md", "jsonl"), **again))
    (outcome,) = summary.documents
    assert summary.interrupted and outcome.status == "interrupted" and 0 < summary.pages_done < 24
    assert outcome.note == "stopped before it was complete: its earlier outputs, a finished reading, are kept as they were"
    assert (md.read_bytes(), jsonl.read_bytes()) == before and no_temp_files(tmp_path / "out")
    # finished, the new reading replaces it
    run_pipeline(expand_inputs([str(second)]), FakeEngine(n_tokens=lambda f: 4), options(tmp_path, formats=("md", "jsonl"),
                                                                                         **again))
    first = 1 if how == "overwrite" else 2
    assert md_body(md) == md_expected([(2, p) for p in range(first, 26)], n_tokens=4)


@pytest.mark.parametrize("before", ["fewer pages", "no txt"])
def test_a_stopped_run_over_more_pages_than_a_finished_reading_keeps_what_it_read(tmp_path, before):
    """A finished reading of fewer pages (--pages 1-3) does not hold the new selection: a run over
    all pages, stopped, writes the pages it read in their place (the next run reads only the
    rest) rather than throw its reading away to keep three pages. So does a run that reads a
    document again because the txt asked for now is not there."""
    second = write_pdf(tmp_path / "in", "second.pdf", 25, doc_no=2)
    first = dict(pages="1-3") if before == "fewer pages" else dict(formats=("md",))
    run_pipeline(expand_inputs([str(second)]), FakeEngine(n_tokens=lambda f: 5), options(tmp_path, **first))
    fired = []

    def on_step(n):
        if n == 20 and not fired:
            fired.append(n)
            os.kill(os.getpid(), signal.SIGINT)

    now = dict(formats=("md", "txt")) if before == "no txt" else {}
    summary = run_pipeline(expand_inputs([str(second)]), FakeEngine(step_sleep=0.005, on_step=on_step, n_tokens=lambda f: 4),
                           options(tmp_path, **now))
    (outcome,) = summary.documents
    assert summary.interrupted and 0 < summary.pages_done < 25
    assert f"{summary.pages_done} of 25 pages written" in outcome.note, outcome.note
    engine = FakeEngine(n_tokens=lambda f: 4)
    run_pipeline(expand_inputs([str(second)]), engine, options(tmp_path, **now))
    assert len(engine.prefills) == 25 - summary.pages_done
    assert md_body(tmp_path / "out" / "second.md") == md_expected([(2, p) for p in range(1, 26)], n_tokens=4)


def test_a_resumed_run_stopped_before_a_new_page_says_its_outputs_hold_the_pages_of_last_time(tmp_path):
    """Stopped before any new page, a resumed document wrote nothing new (nothing to add), and the
    summary said "the rest was not written" of pages still on disk. It now says how many pages its
    outputs keep and what the next run reads."""
    from pantheon_ocr.commands.common import summary_lines

    second = write_pdf(tmp_path / "in", "second.pdf", 25, doc_no=2)

    def stop_at(step):
        fired = []

        def on_step(n):
            if n == step and not fired:
                fired.append(n)
                os.kill(os.getpid(), signal.SIGINT)
        return on_step

    first = run_pipeline(expand_inputs([str(second)]), FakeEngine(step_sleep=0.005, on_step=stop_at(20), n_tokens=lambda f: 4),
                         options(tmp_path))
    assert first.interrupted and 0 < first.pages_done < 25
    summary = run_pipeline(expand_inputs([str(second)]), FakeEngine(step_sleep=0.005, on_step=stop_at(1), n_tokens=lambda f: 4),
                           options(tmp_path))
    (outcome,) = summary.documents
    assert summary.interrupted and summary.pages_done == 0
    assert outcome.note.endswith(f"{first.pages_done} of 25 pages kept from its outputs, the next run reads the other "
                                 f"{25 - first.pages_done}"), outcome.note
    assert outcome.outputs == (tmp_path / "out" / "second.md",)
    said = summary_lines(summary)
    assert any("unfinished ones hold the pages read so far, and the next run reads only the rest" in line for line in said)
    assert not any("the rest was not written" in line for line in said), said


def test_a_write_that_fails_names_the_output_not_only_the_input(tmp_path):
    """'a.pdf: cannot write the output: Is a directory' did not say which of its outputs."""
    a = write_pdf(tmp_path / "in", "a.pdf", 1, doc_no=1)
    (tmp_path / "out" / "a.jsonl").mkdir(parents=True)
    summary = run_pipeline(expand_inputs([str(a)]), FakeEngine(), options(tmp_path, formats=("md", "jsonl")))
    (failure,) = summary.documents[0].failures
    assert summary.documents[0].status == "unwritten" and summary.exit_code == ExitCode.CANNOT_WRITE
    assert failure.reason == f"cannot write the output {tmp_path / 'out' / 'a.jsonl'}: Is a directory"
    assert not (tmp_path / "out" / "a.md").exists() and no_temp_files(tmp_path / "out")


def test_pages_that_run_out_of_memory_exit_71_not_as_unreadable_inputs(tmp_path):
    """Under `ulimit -v` every page failed with 'vision stage failed: MemoryError: Unable to
    allocate ...' and the run exited 4 (inputs unreadable) or 1: a cron script was told its inputs
    were bad. Pages short of memory say so, and the run exits 71 (out of resources)."""

    class ShortOfMemory(FakeEngine):
        def vision(self, image):
            f = super().vision(image)
            if f.page == 2:
                raise MemoryError("Unable to allocate 14.4 MiB for an array with shape (2208, 1712)")
            return f

    a = write_pdf(tmp_path / "in", "a.pdf", 3, doc_no=1)
    summary = run_pipeline(expand_inputs([str(a)]), ShortOfMemory(), options(tmp_path))
    (failure,) = summary.documents[0].failures
    assert summary.exit_code == ExitCode.OUT_OF_RESOURCES and failure.short_of_memory
    assert failure.reason.startswith("vision stage failed: not enough memory (Unable to allocate 14.4 MiB")
    assert summary.documents[0].status == "partial"  # the other pages are written
    plain = run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2),
                         options(tmp_path, overwrite=True))
    assert plain.exit_code == ExitCode.PAGES_FAILED  # a bug's failure stays 1
