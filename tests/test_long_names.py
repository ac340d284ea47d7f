"""Output names fit the file system: a document whose name (plus the writers' longest suffix,
`_images`) is over PC_NAME_MAX bytes is written under a cut name that keeps `-<doc id[:8]>`,
cut in bytes at a character boundary, unique and the same every run; through transcribe
(every format, page files) and an archive job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fake_engine import EngineFactory, FakeEngine, marked_pdf
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.errors import ExitCode
from pantheon_ocr.pipeline import naming, outputs
from pantheon_ocr.pipeline.figures import images_dir
from pantheon_ocr.pipeline.inputs import expand_inputs, make_document
from pantheon_ocr.pipeline.naming import fit_name, plan_output_paths
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PipelineOptions

from .archive.harness import write_job

FF = os.fsdecode(b"\xff")
LIMIT = 255 - naming.NAME_ROOM - naming.ID_SUFFIX  # 239: the bytes a cut name keeps before "-<id8>"


def write_pdf(path: Path, doc_no: int = 1, n_pages: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(marked_pdf(n_pages, doc_no))
    return path


def size(name: str) -> int:
    return len(os.fsencode(name))


def test_room_covers_every_suffix_the_writers_add():
    base = Path("/out/x")
    assert naming.NAME_ROOM >= max(size(f".{fmt}") for fmt in outputs._RENDERERS)
    assert naming.NAME_ROOM >= size(images_dir(base).name) - size(base.name)


def test_fit_name_cuts_bytes_at_character_boundaries():
    assert fit_name("abc", 3) == "abc" and fit_name("abcd", 3) == "abc"
    assert fit_name("文文文", 8) == "文文"  # never half of a 3-byte character
    assert fit_name("a😀b", 4) == "a" and fit_name("a😀b", 5) == "a😀"
    assert fit_name(FF * 4 + "é", 5) == FF * 4  # an undecodable byte is one byte; é is two


@pytest.mark.parametrize("name", ["y" * 251, "文" * 83 + "ab", FF * 248 + "é"])
def test_a_name_too_long_is_cut_and_keeps_its_id(tmp_path, name):
    d = make_document(write_pdf(tmp_path / "in" / f"{name}.pdf"), f"{name}.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    cut = paths.base.name
    assert cut == fit_name(name, LIMIT) + f"-{d.doc_id[:8]}" and size(cut) <= 255 - naming.NAME_ROOM
    assert size(cut) > 240  # cut no shorter than it must be
    assert os.fsencode(cut).startswith(os.fsencode(fit_name(name, LIMIT)))
    if FF not in name:
        os.fsencode(cut).decode("utf-8")  # still valid UTF-8: no character cut in half
    assert plan_output_paths([d], tmp_path / "out") == {d.doc_id: paths}  # the same every run


def test_cut_names_stay_unique_and_do_not_depend_on_order(tmp_path):
    common = "z" * 245
    a = make_document(write_pdf(tmp_path / "in" / f"{common}-one.pdf"), f"{common}-one.pdf")
    b = make_document(write_pdf(tmp_path / "in" / f"{common}-two.pdf"), f"{common}-two.pdf")
    plan = plan_output_paths([a, b], tmp_path / "out")
    assert plan[a.doc_id].base != plan[b.doc_id].base
    assert plan_output_paths([b, a], tmp_path / "out") == plan


def test_a_clash_suffix_that_would_not_fit_cuts_the_name(tmp_path):
    """247 bytes + .pdf = 251: the name itself fits, with `-<id8>` for a clash it would not."""
    stem = "x" * 247
    docs = [make_document(write_pdf(tmp_path / "in" / f"{stem}{ext}"), f"{stem}{ext}") for ext in (".pdf", ".png")]
    plan = plan_output_paths(docs, tmp_path / "out")
    first, second = sorted(docs, key=lambda d: os.fsencode(d.path))
    assert plan[first.doc_id].base.name == stem
    assert plan[second.doc_id].base.name == "x" * LIMIT + f"-{second.doc_id[:8]}"


def test_the_file_systems_own_limit_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(naming.os, "pathconf", lambda path, name: 100 if name == "PC_NAME_MAX" else os.pathconf(path, name))
    d = make_document(write_pdf(tmp_path / "in" / ("w" * 95 + ".pdf")), "w" * 95 + ".pdf")
    base = plan_output_paths([d], tmp_path / "out" / "not-yet")[d.doc_id].base  # a folder not made yet: its parent's
    assert base.name == "w" * (100 - naming.NAME_ROOM - naming.ID_SUFFIX) + f"-{d.doc_id[:8]}"


def test_transcribe_writes_long_names_in_every_format(tmp_path):
    names = ["y" * 251, "文" * 83, FF * 250]
    for i, name in enumerate(names, 1):
        write_pdf(tmp_path / "in" / f"{name}.pdf", i, 2)
    opts = PipelineOptions(out_dir=tmp_path / "out", render_workers=1, text_fallback=False, formats=("md", "jsonl", "txt"),
                           page_files=True)
    summary = run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(), opts)
    assert summary.exit_code == ExitCode.OK, summary.failed_pages
    assert [d.status for d in summary.documents] == ["written"] * 3
    for d in summary.documents:
        assert [p.suffix for p in d.outputs] == [".md", ".md", ".jsonl", ".txt", ".md"]
        assert all(p.is_file() and size(p.name) <= 255 for p in d.outputs)
        assert d.outputs[-1].stem.endswith(f"-{d.doc.doc_id[:8]}")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.endswith(".tmp")]
    again = run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(), opts)  # the same names: found, skipped
    assert [d.status for d in again.documents] == ["skipped"] * 3


def test_archive_job_writes_a_long_name(tmp_path):
    write_pdf(tmp_path / "in" / ("q" * 251 + ".pdf"), 1, 2)
    job = write_job(tmp_path, ocr={"formats": ["md", "jsonl"]})
    result = run_job(load_job(job), EngineFactory())
    assert result.exit_code == ExitCode.OK, result.summary["failures"]
    (md,) = (tmp_path / "out").glob("*.md")
    assert md.name.startswith("q" * LIMIT + "-") and size(md.name) == 251
