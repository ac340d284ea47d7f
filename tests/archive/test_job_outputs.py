"""Archive jobs and what they leave on disk: a page selection that matches nothing, the
reports folder (latest.*, a file in its place), and output folders shared between jobs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from fake_engine import EngineFactory, md_body
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.errors import ExitCode

from .harness import check_outputs, md_pages, pdf, run_cli, write_job


def run(job: Path, **kw):
    return run_job(load_job(job), EngineFactory(), **kw)


def doc_rows(job: Path) -> list[tuple]:
    db = sqlite3.connect(job.parent / "job.sqlite")
    try:
        return db.execute("SELECT status, error FROM documents ORDER BY path").fetchall()
    finally:
        db.close()


# ------------------------------------------------------------------ no page selected

NONE_SELECTED = "none of the selected pages (5) exists: the document has 3 pages"


def test_a_selection_that_matches_nothing_fails_the_document_like_transcribe(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 1, 2)
    job = write_job(tmp_path, ocr={"pages": "5"})
    result = run(job)
    a, b = str(tmp_path / "in" / "a.pdf"), str(tmp_path / "in" / "b.pdf")
    assert result.exit_code == ExitCode.PAGES_FAILED  # as transcribe --pages 5: 1, not a silent 0
    assert result.summary["documents"] == {"new": 2, "failed (no selected page)": 2}
    assert result.summary["failures"] == [
        {"path": a, "page": None, "reason": NONE_SELECTED, "attempts": 0},
        {"path": b, "page": None, "reason": "none of the selected pages (5) exists: the document has 1 page", "attempts": 0}]
    assert list((tmp_path / "out").iterdir()) == []  # made (checked before the run), nothing in it
    assert doc_rows(job) == [("failed", NONE_SELECTED), ("failed", "none of the selected pages (5) exists: the document has 1 page")]
    r = run_cli(["archive", "status", str(job)])
    assert "documents: 2 documents (2 failed)" in r.stdout and f"{a}: {NONE_SELECTED}" in r.stdout
    # the next night, same selection and file: known, not a failure of that night
    result = run(job)
    assert result.exit_code == ExitCode.OK and result.summary["documents"] == {"unchanged": 2}
    # --retry-failed tries it again: it fails again, for the same reason
    result = run(job, retry_failed=True)
    assert result.exit_code == ExitCode.PAGES_FAILED and [f["reason"] for f in result.summary["failures"]][0] == NONE_SELECTED


def test_pages_a_selection_names_past_a_documents_end_are_noted_once(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 5, 2)
    job = write_job(tmp_path, ocr={"pages": "2-4"})
    result = run(job)
    assert result.exit_code == ExitCode.OK
    assert [[p for p, _, _ in md_pages(md_body(tmp_path / "out" / n))] for n in ("a.md", "b.md")] == [[2, 3], [2, 3, 4]]
    a = tmp_path / "in" / "a.pdf"
    assert [n for n in result.summary["notes"] if "past its end" in n] == [
        f"{a}: selected page 4 past its end: it has 3 pages"]
    assert not [n for n in run(job).summary["notes"] if "past its end" in n]  # unchanged: said once


def test_a_selection_that_matches_nothing_removes_the_outputs_of_a_wider_one(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    job = write_job(tmp_path, ocr={"pages": "1-2", "formats": ["md", "jsonl"], "page_files": True})
    run(job)
    out = tmp_path / "out"
    check_outputs(out, {"a.md": (1, 2)})
    (out / "other.md").write_text("not ours\n")
    job = write_job(tmp_path, ocr={"pages": "5", "formats": ["md", "jsonl"], "page_files": True})
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED
    assert result.summary["documents"] == {"unchanged": 1, "failed (no selected page)": 1}
    assert result.summary["failures"] == [{"path": str(tmp_path / "in" / "a.pdf"), "page": None, "reason": NONE_SELECTED,
                                           "attempts": 0}]
    assert result.summary["notes"] == [f"{tmp_path / 'in' / 'a.pdf'}: removed its outputs of an earlier page selection "
                                       f"({out / 'a.md'}, {out / 'a.jsonl'}): no page is selected now"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["a", "other.md"]
    assert doc_rows(job) == [("failed", NONE_SELECTED)]
    # a selection with pages again: those pages are read and written
    job = write_job(tmp_path, ocr={"pages": "1-", "formats": ["md", "jsonl"], "page_files": True})
    result = run(job)
    assert result.exit_code == ExitCode.OK and result.summary["documents"] == {"unchanged": 1, "written": 1}
    check_outputs(out, {"a.md": (1, 3)})


def test_a_state_that_marked_such_a_document_empty_fails_it_now(tmp_path):
    """States written before this fix hold "empty" rows: the next run fails them, not passes them."""
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    job = write_job(tmp_path, ocr={"pages": "5"})
    run(job)
    db = sqlite3.connect(tmp_path / "job.sqlite")
    with db:
        db.execute("UPDATE documents SET status='empty', error=NULL")
    db.close()
    result = run(job)
    assert result.exit_code == ExitCode.PAGES_FAILED and doc_rows(job) == [("failed", NONE_SELECTED)]


# ------------------------------------------------------------------ reports


def test_an_older_runs_report_written_again_leaves_latest_to_the_newest_run(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path)
    run(job)
    run(job)
    reports = tmp_path / "job-reports"
    newest = (reports / "latest.json").read_text(), (reports / "latest.html").read_text()
    assert json.loads(newest[0])["run"] == 2
    r = run_cli(["archive", "report", str(job), "--run", "1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"wrote {reports / 'run-0001.json'}\nwrote {reports / 'run-0001.html'}\n"
    assert ((reports / "latest.json").read_text(), (reports / "latest.html").read_text()) == newest
    # the newest run's own report still writes them
    (reports / "latest.json").unlink()
    assert run_cli(["archive", "report", str(job), "--run", "2"]).returncode == 0
    assert (reports / "latest.json").read_text() == newest[0]


def test_a_file_in_place_of_the_reports_folder_is_named(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    reports = tmp_path / "job-reports"
    reports.write_text("in the way\n")
    job = write_job(tmp_path)
    problem = f"{reports}: the reports folder is a file, not a folder; remove it or point `reports =` in the job file elsewhere"
    r = run_cli(["archive", "run", str(job), "--no-progress"])  # said before any page, not after the night
    assert r.returncode == ExitCode.CANNOT_WRITE and r.stderr == f"error: {problem}\n"
    assert not (tmp_path / "out" / "a.md").exists() and reports.read_text() == "in the way\n"


def test_a_report_that_cannot_be_written_at_the_end_is_exit_73(tmp_path, monkeypatch):
    """The reports folder fills up (or goes read-only) during the night: the outputs are written,
    and the exit code says the run's record is not (73, as for any output), not 0."""
    import errno

    import pantheon_ocr.archive.run as job_run

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path)
    monkeypatch.setattr(job_run, "write_reports", full)
    said: list[str] = []
    result = run_job(load_job(job), EngineFactory(n_tokens=4), log=said.append)
    assert result.exit_code == ExitCode.CANNOT_WRITE and result.summary["exit_code"] == 73
    assert said[-1] == f"error: {tmp_path / 'job-reports'}: cannot write the report: No space left on device"
    check_outputs(tmp_path / "out", {"a.md": (1, 1)}, n_tokens=4)
    db = sqlite3.connect(tmp_path / "job.sqlite")
    assert db.execute("SELECT status, exit_code FROM runs").fetchall() == [("finished", 73)]
    db.close()


# ------------------------------------------------------------------ a shared output folder


def two_jobs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Job 1 reads in/a.pdf, job 2 in2/a.pdf (other content), both into out/."""
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    pdf(tmp_path / "in2", "a.pdf", 1, 2)
    out = tmp_path / "out"
    jobs = []
    for n, folder in ((1, "in"), (2, "in2")):
        (tmp_path / f"j{n}").mkdir()
        jobs.append(write_job(tmp_path / f"j{n}", {"inputs": [str(tmp_path / folder)], "output": str(out)}))
    return jobs[0], jobs[1], out


def output_of(job: Path) -> Path:
    db = sqlite3.connect(job.parent / "job.sqlite")
    try:
        return Path(db.execute("SELECT output FROM documents").fetchone()[0])
    finally:
        db.close()


def source_of(md: Path) -> str:
    return json.loads(md.read_text().splitlines()[0][len("<!-- pantheon-ocr: "):-4])["source"]


def test_a_new_document_does_not_take_the_name_of_another_sources_output(tmp_path):
    job1, job2, out = two_jobs(tmp_path)
    run(job1)
    result = run(job2)
    assert result.exit_code == ExitCode.OK and result.summary["notes"] == []
    own = output_of(job2)
    assert own.parent == out and own.name.startswith("a-") and len(own.name) == len("a-") + 8
    check_outputs(out, {"a.md": (1, 2), own.name + ".md": (2, 1)})
    assert source_of(out / "a.md") == str(tmp_path / "in" / "a.pdf")
    assert source_of(out / (own.name + ".md")) == str(tmp_path / "in2" / "a.pdf")
    # neither job touches the other's outputs on later nights
    for job in (job1, job2, job1):
        result = run(job)
        assert result.summary["documents"] == {"unchanged": 1} and result.summary["notes"] == []
    check_outputs(out, {"a.md": (1, 2), own.name + ".md": (2, 1)})


def test_a_file_of_the_users_at_an_output_name_is_left_as_it_is(tmp_path):
    """A Markdown that records no source (the user's own notes in the output folder) was written
    over by a job's first night; it is left as it is, the document takes its name with its id,
    and the run says so."""
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.md").write_text("# my notes\n")
    job = write_job(tmp_path)
    result = run(job)
    own = output_of(job)
    assert result.exit_code == ExitCode.OK and own.name.startswith("a-") and len(own.name) == len("a-") + 8
    assert result.summary["notes"] == [f"{out / 'a.md'} records no source, so it is no output of pantheon-ocr: left as "
                                       f"it is, {tmp_path / 'in' / 'a.pdf'} written as {own}.*"]
    assert (out / "a.md").read_text() == "# my notes\n"
    check_outputs(out, {own.name + ".md": (1, 2)})
    result = run(job)
    assert result.summary["documents"] == {"unchanged": 1} and result.summary["notes"] == []


def test_an_output_taken_over_by_another_source_is_written_again_under_an_own_name(tmp_path):
    job1, job2, out = two_jobs(tmp_path)
    run(job1)
    # what versions before this fix did: job 2 placed its document on out/a and wrote over it
    run(job2)
    theirs = output_of(job2)
    for fmt in ("md",):
        (out / f"a.{fmt}").write_bytes((out / f"{theirs.name}.{fmt}").read_bytes())
    (out / f"{theirs.name}.md").unlink()
    db = sqlite3.connect(job2.parent / "job.sqlite")
    with db:
        db.execute("UPDATE documents SET output=?", (str(out / "a"),))
    db.close()
    result = run(job1)  # its own outputs gone: noticed, not "unchanged" and silent
    ours = output_of(job1)
    assert ours.name.startswith("a-") and ours != theirs
    assert result.exit_code == ExitCode.OK and result.summary["documents"] == {"unchanged": 1, "written": 1}
    assert result.summary["notes"] == [
        f"{tmp_path / 'in' / 'a.pdf'}: {out / 'a'} now holds the outputs of {tmp_path / 'in2' / 'a.pdf'} (another job or "
        f"transcribe writes there too); its outputs are written again from the job state as {ours}"]
    check_outputs(out, {"a.md": (2, 1), ours.name + ".md": (1, 2)})
    assert source_of(out / "a.md") == str(tmp_path / "in2" / "a.pdf")
    # no ping-pong: each job keeps its own name from now on
    for job in (job2, job1, job2):
        result = run(job)
        assert result.summary["documents"] == {"unchanged": 1} and result.summary["notes"] == []
    check_outputs(out, {"a.md": (2, 1), ours.name + ".md": (1, 2)})


def test_a_jsonl_only_job_s_outputs_are_another_source_s_too(tmp_path):
    """Job 2 writes only JSONL: its a.jsonl records its source, so job 1 (Markdown) passes over
    the name, not taking a missing a.md for a free one."""
    job1, job2, out = two_jobs(tmp_path)
    write_job(tmp_path / "j2", {"inputs": [str(tmp_path / "in2")], "output": str(out)}, ocr={"formats": ["jsonl"]})
    run(job2)
    assert sorted(p.name for p in out.iterdir()) == ["a.jsonl"]
    result = run(job1)
    ours = output_of(job1)
    assert result.exit_code == ExitCode.OK and ours.name.startswith("a-") and (out / f"{ours.name}.md").is_file()
    assert json.loads((out / "a.jsonl").read_text().splitlines()[0])["doc"] == str(tmp_path / "in2" / "a.pdf")


def test_a_first_night_with_no_selected_page_keeps_a_transcribe_output_of_the_same_file(tmp_path):
    """Outputs of an earlier selection are removed only where the job itself read pages before:
    on its first night, outputs recording the same file are a `transcribe` run's, and stay."""
    from pantheon_ocr.pipeline.inputs import make_document
    from pantheon_ocr.pipeline.run import run_pipeline
    from pantheon_ocr.pipeline.types import PipelineOptions

    pdf(tmp_path / "in", "a.pdf", 3, 1)
    engine, _ = EngineFactory()()
    run_pipeline([make_document(tmp_path / "in" / "a.pdf")], engine,
                 PipelineOptions(out_dir=tmp_path / "out", render_workers=1, text_fallback=False))
    before = (tmp_path / "out" / "a.md").read_bytes()
    result = run(write_job(tmp_path, ocr={"pages": "5"}))
    assert result.exit_code == ExitCode.PAGES_FAILED and result.summary["notes"] == []
    assert (tmp_path / "out" / "a.md").read_bytes() == before


def test_a_jobs_page_selection_is_recorded_so_transcribe_reads_the_rest(tmp_path):
    """A job's outputs recorded no page selection: `transcribe` in the same output folder took a
    job's `pages = "2"` outputs for the whole document and skipped it ("outputs exist")."""
    from pantheon_ocr.pipeline.inputs import make_document
    from pantheon_ocr.pipeline.naming import header_record
    from pantheon_ocr.pipeline.run import run_pipeline
    from pantheon_ocr.pipeline.types import PipelineOptions

    pdf(tmp_path / "in", "a.pdf", 3, 1)
    assert run(write_job(tmp_path, ocr={"pages": "2"})).exit_code == ExitCode.OK
    md = tmp_path / "out" / "a.md"
    assert header_record(md.read_text().splitlines()[0])["pages"] == "2"
    assert [p for p, _, _ in md_pages(md_body(md))] == [2]
    engine, _ = EngineFactory()()
    summary = run_pipeline([make_document(tmp_path / "in" / "a.pdf")], engine,
                           PipelineOptions(out_dir=tmp_path / "out", render_workers=1, text_fallback=False))
    assert summary.documents[0].status == "written"
    assert [p for p, _, _ in md_pages(md_body(md))] == [1, 2, 3]
    assert "pages" not in header_record(md.read_text().splitlines()[0])
