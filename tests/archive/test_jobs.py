"""Archive jobs in-process with the FakeEngine: plan, skip/redo by hash, retries with changed
sampling, locks, corrupt inputs, status, reports; plus one run of the real tiny engine.
(Kill -9 and concurrent runs are in test_jobs_kill.py: they need subprocesses.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_engine import SAMPLES, EngineFactory, expected_text, md_body
from pantheon_ocr.archive.lock import JobLocked
from pantheon_ocr.archive.report import job_status
from pantheon_ocr.archive.wording import failures_heading
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.archive.state import connect
from pantheon_ocr.errors import ExitCode, JobError

from .harness import check_outputs, md_pages, pdf, run_cli, temp_litter, write_job

ROOT = Path(__file__).resolve().parents[2]


class Counting:
    """An engine factory that counts how often an engine was built."""

    def __init__(self, **kw):
        self.factory, self.built = EngineFactory(**kw), 0
        self.engines = []

    def __call__(self):
        self.built += 1
        engine, notes = self.factory()
        self.engines.append(engine)
        return engine, notes


def run(job: Path, factory=None, **kw):
    return run_job(load_job(job), factory or Counting(), **kw)


def rows(job: Path, sql: str, *args) -> list[tuple]:
    db = sqlite3.connect(job.parent / "job.sqlite")
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def test_a_page_damaged_in_the_file_is_not_retried(tmp_path):
    """A page the file itself damages (a TIFF's last frame cut short) fails the same at any
    temperature: it was read retry.attempts times in each run. It fails at its first attempt,
    saying why; the other pages are written."""
    from PIL import Image, ImageDraw

    frames = [Image.new("L", (600, 800), 255) for _ in range(4)]
    for i, frame in enumerate(frames):
        ImageDraw.Draw(frame).text((50, 50), f"page {i + 1}", fill=0)
    frames[0].save(tmp_path / "full.tif", save_all=True, append_images=frames[1:], compression="tiff_lzw")
    data = (tmp_path / "full.tif").read_bytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "cut.tif").write_bytes(data[: len(data) * 9 // 10])
    result = run(write_job(tmp_path, retry={"attempts": 3, "on": ["error"]}))
    assert result.exit_code == ExitCode.PAGES_FAILED
    assert result.summary["pages"]["retried"] == 0 and result.summary["retries"] == []
    (failure,) = result.summary["failures"]
    assert failure["page"] == 4 and failure["attempts"] == 1 and failure["reason"].endswith(
        "(the file's own fault: not tried again)"), failure
    assert [p for p, _, _ in md_pages((tmp_path / "out" / "cut.md").read_text())] == [1, 2, 3, 4]


# ------------------------------------------------------------------------ job file


@pytest.mark.parametrize("text, message", [
    ('output = "out"\n', "inputs: required key is missing"),
    ('inputs = ["in"]\noutput = "out"\nouptut = "x"\n', "unknown key 'ouptut' (did you mean 'output'?)"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\nbatch_size = "8"\n', 'ocr.batch_size: must be an integer >= 1 and <= 256 (got "8")'),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\nbach_size = 8\n', "unknown key 'ocr.bach_size' (did you mean 'ocr.batch_size'?)"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\nformats = ["md", "html"]\n', "ocr.formats: values must be among 'md', 'jsonl', 'txt'"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\npages = "3-1"\n', "ocr.pages: bad page range '3-1'"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\ntop_p = 0\n', "ocr.top_p: must be a finite number > 0 and <= 1 (got 0)"),
    ('inputs = ["in"]\noutput = "out"\n[retry]\nattempts = 0\n', "retry.attempts: must be an integer >= 1 (got 0)"),
    ('inputs = ["in"]\noutput = "out"\n[retry]\non = ["loops"]\n', "retry.on: values must be among 'repetition', 'max_tokens', 'error'"),
    ('inputs = ["in"]\noutput = "out"\nmodel = "x"\n', "model: must be a table ([model])"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\nsegment = "words"\n', "ocr.segment: "),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\nlongest_edge = 100000000\n', "ocr.longest_edge: must be an integer >= 64 and <= 10000"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\ntemperature = inf\n', "ocr.temperature: must be a finite number >= 0"),
    ('inputs = ["in"]\noutput = "out"\n[ocr]\npage_timeout = 0\n', "ocr.page_timeout: must be a finite number > 0"),
    ('inputs = ["in"]\noutput = "out"\n[retry]\ntemperatures = [0.2, nan]\n', "retry.temperatures: must be a non-empty list of finite numbers"),
    ('inputs = ["in"\n', "not valid TOML"),
])
def test_job_file_errors_name_the_key(tmp_path, text, message):
    """Missing, unknown, mistyped and absurd values: one error naming the file and the key, exit 2."""
    job = tmp_path / "nightly.toml"
    job.write_text(text)
    with pytest.raises(JobError) as e:
        load_job(job)
    assert str(e.value).startswith("nightly.toml: " if "TOML" not in message else str(job)) and message in str(e.value)
    assert e.value.exit_code == ExitCode.BAD_ARGUMENTS


def test_job_file_defaults_and_relative_paths(tmp_path):
    job = tmp_path / "jobs" / "scans.toml"
    job.parent.mkdir()
    job.write_text('inputs = "../in"\noutput = "../out"\n[model]\ntext = "m/t.gguf"\n[retry]\ntemperatures = [0.3]\n')
    spec = load_job(job)
    assert spec.name == "scans" and spec.inputs == (str(tmp_path / "jobs" / ".." / "in"),)
    assert spec.state == job.parent / "scans.sqlite" and spec.reports == job.parent / "scans-reports"
    assert spec.model.text == job.parent / "m" / "t.gguf"
    assert [(s.temperature, s.seed) for s in map(spec.sampling, (1, 2, 3, 4))] == [(0.0, 0), (0.3, 1), (0.3, 2), (0.3, 3)]
    assert spec.pipeline_options().segment is None  # the model's own default
    job.write_text('inputs = "../in"\noutput = "../out"\n[ocr]\nsegment = "lines"\n')
    assert load_job(job).pipeline_options().segment == "lines"
    r = run_cli(["archive", "run", str(tmp_path / "missing.toml")])
    assert r.returncode == ExitCode.BAD_ARGUMENTS and "no such job file" in r.stderr


# ------------------------------------------------------------------------ runs


def test_run_skip_unchanged_redo_changed(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in" / "sub", "b.pdf", 2, 2)
    job = write_job(tmp_path, ocr={"formats": ["md", "jsonl"], "page_files": True})
    result = run(job)
    out = tmp_path / "out"
    assert result.exit_code == ExitCode.OK and result.summary["documents"] == {"new": 2, "written": 2}
    check_outputs(out, {"a.md": (1, 3), "sub/b.md": (2, 2)})
    assert [json.loads(x)["page"] for x in (out / "a.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert md_body(out / "a" / "page-0002.md") == f"<!-- page 2 -->\n\n{expected_text(1, 2)}\n"
    # unchanged: nothing runs, the model is not even loaded
    factory = Counting()
    result = run(job, factory)
    assert result.summary["documents"] == {"unchanged": 2} and factory.built == 0 and result.exit_code == ExitCode.OK
    # touched (new mtime) but the same bytes: the hash says unchanged
    os.utime(tmp_path / "in" / "a.pdf", (time.time() + 5, time.time() + 5))
    assert run(job, factory).summary["documents"] == {"unchanged": 2} and factory.built == 0
    # changed content: only that document runs again, its outputs are replaced
    pdf(tmp_path / "in" / "sub", "b.pdf", 4, 3)
    result = run(job, factory)
    assert result.summary["documents"] == {"unchanged": 1, "changed": 1, "written": 1}
    assert sorted(factory.engines[0].prefills) == [(3, p) for p in range(1, 5)]
    check_outputs(out, {"a.md": (1, 3), "sub/b.md": (3, 4)})
    # ... also when it shrinks: no per-page file of the old version is left
    pdf(tmp_path / "in", "a.pdf", 1, 4)
    run(job, factory)
    check_outputs(out, {"a.md": (4, 1), "sub/b.md": (3, 4)})
    assert sorted(p.name for p in (out / "a").iterdir()) == ["page-0001.md"]
    assert rows(job, "SELECT path, version FROM documents ORDER BY path") == [
        (str(tmp_path / "in" / "a.pdf"), 2), (str(tmp_path / "in" / "sub" / "b.pdf"), 2)]
    assert not temp_litter(out, tmp_path / "job-reports")


def test_corrupt_inputs_are_isolated(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    for name in ("corrupt.pdf", "encrypted.pdf", "zero-pages.pdf"):
        shutil.copy(SAMPLES / "bad" / name, tmp_path / "in" / name)
    pdf(tmp_path / "in", "z.pdf", 2, 2)
    job = write_job(tmp_path)
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED
    check_outputs(tmp_path / "out", {"a.md": (1, 2), "z.md": (2, 2)})
    reasons = {Path(f["path"]).name: f["reason"] for f in result.summary["failures"]}
    assert reasons == {"corrupt.pdf": "the PDF is damaged or truncated and cannot be opened",
                       "encrypted.pdf": "the PDF is encrypted: a password is needed (ocr.password in the job file)",
                       "zero-pages.pdf": "the PDF has no pages"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.md", "z.md"]
    # next night: unreadable and unchanged is not tried again (and is no failure of that run)
    result = run(job)
    assert result.summary["documents"] == {"unchanged": 2, "skipped (unreadable)": 3} and result.exit_code == ExitCode.OK
    # --retry-failed tries them again; a job password opens the encrypted one
    from fake_engine import make_samples_module

    job = write_job(tmp_path, ocr={"password": make_samples_module().PASSWORD})
    result = run(job, retry_failed=True)
    assert {Path(f["path"]).name for f in result.summary["failures"]} == {"corrupt.pdf", "zero-pages.pdf"}
    assert md_body(tmp_path / "out" / "encrypted.md").startswith("<!-- page 1 -->")


def test_a_document_whose_read_failed_is_opened_again_next_night(tmp_path, monkeypatch):
    """A document the render worker could not read (EIO on a network disk: not the file's fault)
    failed its night and was then skipped as unreadable and unchanged every night after, until
    someone passed --retry-failed. It is opened again the next night; a damaged one is not."""
    import errno

    from pantheon_ocr.pipeline import pdf as pipeline_pdf, render_pool

    pdf(tmp_path / "in", "a.pdf", 2, 1)
    pdf(tmp_path / "in", "b.pdf", 3, 2)
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", tmp_path / "in" / "corrupt.pdf")
    real_open = pipeline_pdf._open_pdf

    def failing_open(pdfium, path, password):
        if path.name == "b.pdf":
            raise OSError(errno.EIO, "Input/output error")
        return real_open(pdfium, path, password)

    # forked workers inherit the failing open (a forkserver's would start from the real module)
    monkeypatch.setattr(render_pool, "default_start_method", lambda: "fork")
    monkeypatch.setattr(pipeline_pdf, "_open_pdf", failing_open)
    job = write_job(tmp_path)
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED
    reasons = {Path(f["path"]).name: f["reason"] for f in result.summary["failures"]}
    assert reasons == {"b.pdf": "cannot read file: Input/output error (a failed read, not the file's fault: "
                                "tried again next run)",
                       "corrupt.pdf": "the PDF is damaged or truncated and cannot be opened"}
    check_outputs(tmp_path / "out", {"a.md": (1, 2)})
    monkeypatch.setattr(pipeline_pdf, "_open_pdf", real_open)  # the disk is back
    result = run(job)
    assert result.summary["documents"] == {"unchanged": 1, "opened again": 1, "written": 1, "skipped (unreadable)": 1}
    assert result.exit_code == ExitCode.OK
    check_outputs(tmp_path / "out", {"a.md": (1, 2), "b.md": (2, 3)})
    assert rows(job, "SELECT status, error FROM documents WHERE path LIKE '%b.pdf'") == [("done", None)]


def test_only_unreadable_inputs_exit_4(tmp_path):
    (tmp_path / "in").mkdir()
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", tmp_path / "in" / "corrupt.pdf")
    assert run(write_job(tmp_path)).exit_code == ExitCode.INPUT_UNREADABLE


def test_a_bad_document_beside_ones_done_before_is_exit_1_not_4(tmp_path):
    """A night where the good documents are unchanged and a new (or replaced) one is unreadable:
    1, some failed; 4 says nothing of the archive can be read, and a monitor would believe it."""
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path)
    assert run(job).exit_code == ExitCode.OK
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", tmp_path / "in" / "b.pdf")
    result = run(job)
    assert result.summary["documents"] == {"unchanged": 1, "new": 1, "failed (unreadable)": 1}
    assert result.exit_code == ExitCode.PAGES_FAILED
    (tmp_path / "in" / "gone.pdf").symlink_to(tmp_path / "nowhere.pdf")  # an input path that is no document
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED
    assert result.summary["documents"] == {"unchanged": 1, "skipped (unreadable)": 1, "unreadable input path": 1}
    assert [f.get("input_path") for f in result.summary["failures"]] == [True]
    status = job_status(load_job(job))  # the state has no row for it: status says it from the last run
    assert [(Path(f["path"]).name, f["page"]) for f in status["failures"]] == [("b.pdf", None), ("gone.pdf", None)]
    assert failures_heading(status["failures"]) == "1 document and 1 input path failed"
    page = {"path": "x", "page": 2, "reason": "r"}
    assert failures_heading([page, page, *status["failures"]]) == "2 pages, 1 document and 1 input path failed"
    assert failures_heading([]) == "nothing failed"  # a run stopped before anything failed: its report


def test_a_changed_model_or_reading_is_said_and_reread_reads_everything_again(tmp_path):
    """The night after [ocr] max_tokens (or the model) changed: nothing is read again by itself,
    but the run says so, once; --reread reads every document again and writes it."""
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    pdf(tmp_path / "in", "b.pdf", 1, 2)
    job = write_job(tmp_path)
    assert run(job).exit_code == ExitCode.OK
    quiet = run(job)
    assert not [n for n in quiet.summary["notes"] if "reading changed" in n]
    job = write_job(tmp_path, ocr={"max_tokens": 7})
    factory = Counting()
    said = run(job, factory)
    assert factory.built == 0 and said.summary["documents"] == {"unchanged": 2}
    assert [n for n in said.summary["notes"] if "reading changed" in n] == [
        "the reading changed since the last run (max_tokens 4096 -> 7): pages read before keep their text; "
        "`archive run --reread` reads every document again"]
    assert not [n for n in run(job).summary["notes"] if "reading changed" in n]  # said once
    from pantheon_ocr.archive.reading import changes

    m = {"file": "/m/a.gguf", "size": 9, "head": "ab"}
    assert changes({"model": m}, {"model": {**m, "file": "/copy/a.gguf"}}) == []  # the same model, copied
    assert changes({"model": m}, {"model": {"file": "/m/a.gguf"}}) == []  # unreadable now: not said as changed
    assert changes({"model": m}, {"model": {**m, "head": "cd"}}) == ["model /m/a.gguf (another file)"]
    before = (tmp_path / "out" / "a.md").read_text()
    factory = Counting()
    again = run(job, factory, reread=True)
    assert again.exit_code == ExitCode.OK and again.summary["documents"] == {"unchanged": 2, "written": 2}
    assert sorted(factory.engines[0].prefills) == [(1, 1), (1, 2), (2, 1)]
    assert rows(job, "SELECT status, count(*) FROM pages GROUP BY status") == [("done", 3)]
    check_outputs(tmp_path / "out", {"a.md": (1, 2), "b.md": (2, 1)})
    assert before  # (the fake engine reads the same text again: the prefills above say it was read)
    # a lost state and --reread: nothing is taken back from the outputs, everything is read
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'job.sqlite'}{suffix}").unlink(missing_ok=True)
    factory = Counting()
    fresh = run(job, factory, reread=True)
    assert fresh.summary["documents"] == {"new": 2, "written": 2} and len(factory.engines[0].prefills) == 3


def test_looping_page_retried_with_changed_sampling_then_failed(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 4, 1)
    job = write_job(tmp_path, ocr={"temperature": 0.0, "seed": 7, "batch_size": 2},
                    retry={"attempts": 3, "temperatures": [0.2, 0.4]})
    # page 2 loops below temperature 0.4, so its third attempt is clean; page 3 always loops
    factory = Counting(loops=[[1, 2, 0.4], [1, 3]])
    result = run(job, factory)
    samplings = factory.engines[0].samplings
    for page in (2, 3):
        assert [(t, s) for _, p, t, s in samplings if p == page] == [(0.0, 7), (0.2, 8), (0.4, 9)]
    assert [(p, t, s) for _, p, t, s in samplings if p in (1, 4)] == [(1, 0.0, 7), (4, 0.0, 7)]
    assert result.exit_code == ExitCode.PAGES_FAILED
    (failure,) = result.summary["failures"]
    assert failure == {"path": str(tmp_path / "in" / "a.pdf"), "page": 3, "attempts": 3,
                       "reason": "the model kept repeating itself (3 attempts, last temperature 0.4)"}
    pages = md_pages(md_body(tmp_path / "out" / "a.md"))
    assert [m for _, m, _ in pages] == ["<!-- page 1 -->", "<!-- page 2 -->",
                                        "<!-- page 3 failed: the model kept repeating itself (3 attempts, last temperature 0.4) -->",
                                        "<!-- page 4 -->"]
    assert pages[1][2] == expected_text(1, 2) and pages[2][2] == ""
    assert rows(job, "SELECT page, attempt, outcome, temperature, seed, finish_reason FROM attempts WHERE page IN (2, 3) "
                     "ORDER BY page, attempt") == [
        (2, 1, "retry", 0.0, 7, "repetition"), (2, 2, "retry", 0.2, 8, "repetition"), (2, 3, "done", 0.4, 9, "eos"),
        (3, 1, "retry", 0.0, 7, "repetition"), (3, 2, "retry", 0.2, 8, "repetition"), (3, 3, "failed", 0.4, 9, "repetition")]
    assert [(r["page"], r["attempt"], r["outcome"]) for r in result.summary["retries"]] == [
        (2, 1, "retry"), (3, 1, "retry"), (2, 2, "retry"), (3, 2, "retry"), (2, 3, "done"), (3, 3, "failed")]
    # a failed page is final: the next run leaves it, --retry-failed starts it over
    factory = Counting(loops=[[1, 3, 0.2]])
    assert run(job, factory).summary["documents"] == {"unchanged": 1} and factory.built == 0
    result = run(job, factory, retry_failed=True)
    assert result.exit_code == ExitCode.OK and factory.engines[0].prefills == [(1, 3), (1, 3)]
    check_outputs(tmp_path / "out", {"a.md": (1, 4)})


def test_failing_page_retried_and_max_tokens_policy(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    # vision fails for page 1 on every attempt; page 2 runs into max_tokens (not retried by default)
    job = write_job(tmp_path, ocr={"max_tokens": 6}, retry={"attempts": 2})
    result = run(job, Counting(fail_vision=[[1, 1]], loops=[[1, 2]]))
    assert [(f["page"], f["reason"], f["attempts"]) for f in result.summary["failures"]] == [
        (1, "vision stage failed: RuntimeError: fake vision failure on doc 1 page 1", 2)]
    pages = md_pages(md_body(tmp_path / "out" / "a.md"))
    assert pages[1][1] == "<!-- page 2 stopped: max_tokens -->" and pages[0][1].startswith("<!-- page 1 failed: vision stage")
    # retry.on = ["max_tokens"] retries such pages too, and errors are then final at once
    shutil.rmtree(tmp_path / "out")
    (tmp_path / "job.sqlite").unlink()
    job = write_job(tmp_path, ocr={"max_tokens": 6}, retry={"attempts": 2, "on": ["max_tokens"]})
    factory = Counting(fail_vision=[[1, 1]], loops=[[1, 2]])
    result = run(job, factory)
    assert [(f["page"], f["attempts"]) for f in result.summary["failures"]] == [(1, 1), (2, 2)]
    assert result.summary["failures"][1]["reason"] == "no end of page within max_tokens (6) (2 attempts, last temperature 0.2)"


def test_missing_outputs_and_page_selection_changes(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 5, 1)
    job = write_job(tmp_path, ocr={"pages": "1-2"})
    run(job)
    check_outputs(tmp_path / "out", {"a.md": (1, 2)})
    # outputs deleted: written again from the state, without the model
    (tmp_path / "out" / "a.md").unlink()
    factory = Counting()
    result = run(job, factory)
    assert factory.built == 0 and "outputs missing, written again" in " ".join(result.summary["notes"])
    check_outputs(tmp_path / "out", {"a.md": (1, 2)})
    # a wider page selection runs only the new pages
    job = write_job(tmp_path, ocr={"pages": "all"})
    result = run(job, factory)
    assert sorted(factory.engines[0].prefills) == [(1, 3), (1, 4), (1, 5)]
    check_outputs(tmp_path / "out", {"a.md": (1, 5)})


def test_output_folder_or_formats_changed_are_written_from_the_state(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    run(write_job(tmp_path))
    factory = Counting()
    job = write_job(tmp_path, {"output": "elsewhere"}, ocr={"formats": ["md", "txt"]})
    assert run(job, factory).exit_code == ExitCode.OK and factory.built == 0
    check_outputs(tmp_path / "elsewhere", {"a.md": (1, 2)})
    assert (tmp_path / "elsewhere" / "a.txt").read_text().count("\f") == 1


def test_missing_model_file_exits_3(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path, model={"text": "nope.gguf", "mmproj": "nope-mmproj.gguf"})
    r = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "archive", "run", str(job)], capture_output=True, text=True)
    assert r.returncode == ExitCode.BAD_MODEL and "nope.gguf: no such model file (model.text in job.toml)" in r.stderr


def test_an_output_folder_that_cannot_be_written_stops_the_night_before_any_page(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    (tmp_path / "taken").write_text("")
    job = write_job(tmp_path, {"output": "taken/out"})
    r = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "archive", "run", str(job)], capture_output=True, text=True)
    assert r.returncode == ExitCode.CANNOT_WRITE and "taken/out: cannot make the output folder: Not a directory" in r.stderr
    assert not (tmp_path / "job.sqlite").exists()  # no run was started


def test_pipeline_runs_explicit_tasks_with_their_own_sampling(tmp_path):
    """The pipeline hooks jobs use: explicit tasks, per-task sampling, on_page, no writing."""
    from pantheon_ocr.pipeline.inputs import make_document
    from pantheon_ocr.pipeline.run import run_pipeline
    from pantheon_ocr.engine.sampling import SamplingOptions
    from pantheon_ocr.pipeline.types import PageTask, PipelineOptions

    doc = make_document(pdf(tmp_path / "in", "a.pdf", 4, 1))
    engine, _ = EngineFactory()()
    hot = SamplingOptions(temperature=0.7, seed=5)
    tasks = [PageTask(doc, 3, 4), PageTask(doc, 1, 4, sampling=hot)]
    seen = []
    summary = run_pipeline([], engine, PipelineOptions(out_dir=tmp_path / "out", render_workers=1), tasks=tasks,
                           on_page=seen.append, write_outputs=False)
    assert sorted((r.page, r.text) for r in seen) == [(2, expected_text(1, 2)), (4, expected_text(1, 4))]
    assert sorted((p, t, s) for _, p, t, s in engine.samplings) == [(2, 0.7, 5), (4, 0.0, 0)]
    (outcome,) = summary.documents
    assert outcome.status == "written" and outcome.outputs == () and not (tmp_path / "out").exists()


def test_inputs_empty_glob_is_quiet_missing_path_fails(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path, {"inputs": ["in", "inbox/*.pdf", "gone.pdf"]})
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED
    assert [(Path(f["path"]).name, f["reason"]) for f in result.summary["failures"]] == [("gone.pdf", "no such file or folder")]
    assert any("no PDF or image files match" in n for n in result.summary["notes"])
    check_outputs(tmp_path / "out", {"a.md": (1, 1)})


# ------------------------------------------------------------------------ locks


def _insert_lock(job: Path, pid: int, host: str, heartbeat_age: float) -> int:
    db = connect(job.parent / "job.sqlite")
    now = time.time()
    run_id = db.execute("INSERT INTO runs (started, pid, host, status) VALUES (?, ?, ?, 'running')", (now - 100, pid, host)).lastrowid
    db.execute("INSERT OR REPLACE INTO lock VALUES (1, ?, ?, ?, ?, ?)", (run_id, pid, host, now - 100, now - heartbeat_age))
    db.close()
    return run_id


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_lock_refuses_live_run_and_takes_over_stale_ones(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path, lock={"stale_after": 30})
    run(job)
    # a live process on this host with a fresh heartbeat: refused, nothing touched
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead_run = _insert_lock(job, sleeper.pid, socket.gethostname(), 1.0)
        with pytest.raises(JobLocked, match=rf"job 'job' is already running \(run {dead_run}, pid {sleeper.pid} on "):
            run(job)
        r = run_cli(["archive", "run", str(job), "--no-progress"])
        assert r.returncode == ExitCode.JOB_LOCKED and "is already running" in r.stderr
        status = job_status(load_job(job))
        assert status["running"]["pid"] == sleeper.pid and not status["running"]["stale"]
    finally:
        sleeper.kill()
        sleeper.wait()
    # the same lock once that process is dead: taken over, the dead run marked killed
    result = run(job)
    assert result.exit_code == ExitCode.OK and any("took over a stale lock" in n for n in result.summary["notes"])
    assert rows(job, "SELECT status FROM runs WHERE id=?", dead_run) == [("killed",)]
    assert rows(job, "SELECT count(*) FROM lock") == [(0,)]
    # another host's lock: stale only when its heartbeat is older than lock.stale_after
    _insert_lock(job, 1, "other-host", 5.0)
    with pytest.raises(JobLocked):
        run(job)
    _insert_lock(job, 1, "other-host", 31.0)
    assert run(job).exit_code == ExitCode.OK
    _insert_lock(job, _dead_pid(), socket.gethostname(), 0.0)
    assert run(job).exit_code == ExitCode.OK


# ------------------------------------------------------------------------ status, report


def test_status_and_report(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", tmp_path / "in" / "corrupt.pdf")
    job = write_job(tmp_path)
    r = run_cli(["archive", "status", str(job)])
    assert r.returncode == 0 and "no runs yet" in r.stdout and not (tmp_path / "job.sqlite").exists()
    r = run_cli(["archive", "run", str(job), "--no-progress"],
                env={"PANTHEON_TEST_ENGINE": json.dumps({"loops": [[1, 2]]})})
    assert r.returncode == ExitCode.PAGES_FAILED, r.stderr
    assert "run 1 of job 'job' finished" in r.stderr and "corrupt.pdf: the PDF is damaged" in r.stderr
    r = run_cli(["archive", "status", str(job)])
    assert r.returncode == 0
    assert "documents: 2 documents (1 failed, 1 partial)" in r.stdout and "pages: 3 pages (2 done, 1 failed)" in r.stdout
    assert re.search(r"run 1: .* finished \(exit 1\), 5 pages", r.stdout)
    assert "a.pdf page 2: the model kept repeating itself (3 attempts, last temperature 0.4)" in r.stdout
    info = json.loads(run_cli(["archive", "status", str(job), "--json"]).stdout)
    assert info["pages"] == {"done": 2, "failed": 1} and info["running"] is None
    # the report: JSON + one self-contained HTML page
    reports = tmp_path / "job-reports"
    assert sorted(p.name for p in reports.iterdir()) == ["latest.html", "latest.json", "run-0001.html", "run-0001.json"]
    data = json.loads((reports / "run-0001.json").read_text())
    assert data["exit_code"] == 1 and data["pages"]["attempted"] == 5 and data["pages"]["retried"] == 2
    assert set(data["stage_seconds"]) == {"render", "vision", "prefill", "decode"} and data["stage_seconds"]["render"] > 0
    assert len(data["timeline"]) == 5 and len(data["failures"]) == 2
    page = (reports / "run-0001.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2 and "<style>" in page
    assert not re.search(r"https?:|<script|<link|<img|src=|url\(|@import", page, re.I)  # nothing to fetch
    assert "the PDF is damaged or truncated" in page and "the model kept repeating itself" in page


# ------------------------------------------------------------------------ the real engine


def test_real_tiny_engine_run_and_resume(tmp_path):
    """The real engine (random-weight tiny LightOnOCR) on the sample PDFs, through the CLI."""
    model = SAMPLES / "tiny-model"
    job = write_job(tmp_path, {"inputs": [str(SAMPLES / "docs" / "*.pdf")]},
                    model={"text": str(model / "text.gguf"), "mmproj": str(model / "mmproj.gguf")},
                    ocr={"max_tokens": 3, "longest_edge": 224, "formats": ["md", "jsonl"]})
    r = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "archive", "run", str(job), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["report-3pages.jsonl", "report-3pages.md", "scanned.jsonl", "scanned.md",
                                                     "text-1page.jsonl", "text-1page.md"]
    pages = md_pages(md_body(out / "report-3pages.md"))
    assert [p for p, _, _ in pages] == [1, 2, 3] and all(m.startswith(f"<!-- page {p}") and t for p, m, t in pages)
    records = [json.loads(x) for x in (out / "report-3pages.jsonl").read_text().splitlines()]
    assert all(0 < r["n_tokens"] <= 3 and r["seconds"]["vision"] > 0 for r in records)
    # nothing new: skipped without loading the model (no "tiny test model" note)
    r = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "archive", "run", str(job), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "3 unchanged" in r.stderr and "tiny test model" not in r.stderr


# ------------------------------------------------------------------------ pipelines/


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_nightly_script(tmp_path):
    (tmp_path / "inbox").mkdir()
    model = SAMPLES / "tiny-model"
    job = write_job(tmp_path, {"inputs": ["inbox/*.pdf"]}, model={"text": str(model)})  # a folder with both GGUFs
    env = {**os.environ, "PANTHEON_OCR": f"{sys.executable} -m pantheon_ocr.cli"}
    r = subprocess.run(["bash", str(ROOT / "pipelines" / "nightly.sh"), str(job)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    (log,) = (tmp_path / "logs").iterdir()
    assert "run 1 of job 'job' finished: no documents" in log.read_text()
    r = subprocess.run(["bash", str(ROOT / "pipelines" / "nightly.sh"), str(tmp_path / "nope.toml")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == ExitCode.BAD_ARGUMENTS and "exit 2: error: " in r.stderr and "no such job file" in r.stderr


@pytest.mark.parametrize("args,problem", [
    (["--ray", "local", "--no-ray"], "--no-ray contradicts --ray: give one of them"),
    (["--ray-workers", "2", "--no-ray"], "--no-ray contradicts --ray-workers: give one of them"),
    (["--ray-workers", "2"], "--ray-workers runs on Ray: give --ray ADDRESS, or [ray] address in the job file"),
])
def test_contradicting_ray_flags_are_refused_before_anything_runs(tmp_path, args, problem, capsys):
    from pantheon_ocr.cli import main

    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path)
    assert main(["archive", "run", str(job), "--no-progress", *args]) == ExitCode.BAD_ARGUMENTS
    assert capsys.readouterr().err == f"error: {problem}\n"  # one line, as every other command says it
    assert not (tmp_path / "job.sqlite").exists() and not (tmp_path / "out").exists()  # nothing ran
