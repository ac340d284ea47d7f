"""`archive run --rebuild-state` and what the rebuilt state must keep of the old one: run numbers
go on (no report of an earlier run is ever written over), and a known-bad input stays out of the
exit code as on a normal night; plus the last guard in write_reports."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from pantheon_ocr.archive.report import ReportTaken, job_status, last_report_run, rewrite_report, write_reports
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.errors import ExitCode, JobError

from .harness import Counting, check_outputs, pdf, write_job


def run(job: Path, **kw):
    counting = Counting()
    result = run_job(load_job(job), counting, **kw)
    return result, counting.pages


def reports(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "job-reports").glob("run-*"))}


def run_ids(job: Path) -> list[int]:
    return [r["id"] for r in job_status(load_job(job))["runs"]]


def legibly_damaged(tmp_path: Path) -> None:
    """Damage `check` refuses (documents done without pages) in a file SQLite still reads."""
    db = sqlite3.connect(tmp_path / "job.sqlite")
    try:
        db.execute("DELETE FROM pages WHERE doc = (SELECT min(id) FROM documents WHERE status = 'done')")
        db.commit()
    finally:
        db.close()


def garbage(tmp_path: Path) -> None:
    """A state file nothing can be read from."""
    state = tmp_path / "job.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    state.write_bytes(b"SQLite format 3\x00" + bytes(200))


def three_runs(tmp_path: Path) -> Path:
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 2, 2)
    job = write_job(tmp_path)
    assert [int(run(job)[0].exit_code) for _ in range(3)] == [0, 0, 0]
    assert run_ids(job) == [3, 2, 1]
    return job


NAMES = [f"run-000{i}.{ext}" for i in (1, 2, 3) for ext in ("html", "json")]


# ------------------------------------------------------------------ run numbers go on


def test_rebuild_of_a_legible_state_numbers_after_its_runs(tmp_path):
    job = three_runs(tmp_path)
    before = reports(tmp_path)
    assert sorted(before) == NAMES
    legibly_damaged(tmp_path)
    result, pages = run(job, rebuild_state=True)
    assert (result.run, result.exit_code, pages) == (4, ExitCode.OK, 0)
    assert result.summary["run"] == 4 and result.report_json == tmp_path / "job-reports" / "run-0004.json"
    assert any(n.endswith("; run numbers go on after run 3") for n in result.summary["notes"])
    after = reports(tmp_path)
    assert sorted(after) == sorted(NAMES + ["run-0004.html", "run-0004.json"])
    assert {k: after[k] for k in NAMES} == before  # byte for byte
    assert json.loads((tmp_path / "job-reports" / "latest.json").read_text())["run"] == 4
    # status lists real runs only: the rebuilt state's first is 4, then 5
    assert run_ids(job) == [4]
    assert run(job)[0].run == 5 and run_ids(job) == [5, 4]
    assert reports(tmp_path)["run-0001.json"] == before["run-0001.json"]
    with pytest.raises(JobError, match="no run 2 in the job state"):
        rewrite_report(load_job(job), 2)  # the old runs are in the old file, set aside
    assert rewrite_report(load_job(job))[0].name == "run-0005.json"  # the same run: written again


def aside(tmp_path: Path) -> list[str]:
    return sorted({p.name.split("-")[0] for p in tmp_path.iterdir() if p.name.startswith("job.sqlite.")})  # -wal, -shm too


def test_a_whole_state_rebuilt_anyway_is_set_aside_as_old_not_damaged(tmp_path):
    job = three_runs(tmp_path)
    result, pages = run(job, rebuild_state=True)
    assert (result.run, result.exit_code, pages) == (4, ExitCode.OK, 0)
    assert aside(tmp_path) == ["job.sqlite.old"]
    assert any(n.startswith("the old (readable) job state was set aside as ") for n in result.summary["notes"])
    legibly_damaged(tmp_path)  # refused by the checks, though SQLite reads it: damaged
    result, _ = run(job, rebuild_state=True)
    assert aside(tmp_path) == ["job.sqlite.damaged", "job.sqlite.old"]
    assert any(n.startswith("the damaged job state was set aside as ") for n in result.summary["notes"])


def test_two_rebuilds_in_one_second_keep_both_old_states(tmp_path, monkeypatch):
    import time

    job = three_runs(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261206-120000")  # the same second, twice
    run(job, rebuild_state=True)
    first = (tmp_path / "job.sqlite.old-20261206-120000").read_bytes()
    run(job, rebuild_state=True)
    assert (tmp_path / "job.sqlite.old-20261206-120000").read_bytes() == first  # not replaced
    assert (tmp_path / "job.sqlite.old-20261206-120000-2").exists()


def test_the_old_states_runs_count_without_their_reports(tmp_path):
    job = three_runs(tmp_path)
    for p in (tmp_path / "job-reports").iterdir():
        p.unlink()
    legibly_damaged(tmp_path)
    assert run(job, rebuild_state=True)[0].run == 4


def test_rebuild_of_an_unreadable_state_numbers_after_the_reports(tmp_path):
    job = three_runs(tmp_path)
    before = reports(tmp_path)
    garbage(tmp_path)
    result, pages = run(job, rebuild_state=True)
    assert (result.run, result.exit_code, pages) == (4, ExitCode.OK, 0)
    after = reports(tmp_path)
    assert sorted(after) == sorted(NAMES + ["run-0004.html", "run-0004.json"])
    assert {k: after[k] for k in NAMES} == before
    assert run_ids(job) == [4]
    assert run(job)[0].run == 5 and run_ids(job) == [5, 4]


def test_a_lost_state_file_numbers_after_the_reports(tmp_path):
    job = three_runs(tmp_path)
    before = reports(tmp_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'job.sqlite'}{suffix}").unlink(missing_ok=True)
    result, pages = run(job)  # a new state: the pages the outputs hold are taken back, none read again
    assert (result.run, result.exit_code, pages) == (4, ExitCode.OK, 0)
    assert result.summary["documents"] == {"new": 2, "recovered": 2}
    assert {k: reports(tmp_path)[k] for k in NAMES} == before
    check_outputs(tmp_path / "out", {"a.md": (1, 3), "b.md": (2, 2)})
    assert run(job)[1] == 0  # and the state now knows them: a normal night


def test_pages_are_not_recovered_from_a_jsonl_of_another_reading(tmp_path):
    """A lost state takes the pages back from the outputs' JSONL: not from one that records
    another reading than the Markdown beside it (left by a run with formats = ["md"] since, say,
    of another model), whose pages came back under the Markdown's record. Such a document is
    read again; one whose outputs agree is recovered."""
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 2, 2)
    job = write_job(tmp_path, ocr={"formats": ["md", "jsonl"]})
    assert run(job)[0].exit_code == ExitCode.OK
    jsonl = tmp_path / "out" / "a.jsonl"
    records = [json.loads(r) | {"model": "another.gguf + another-mmproj.gguf #1"} for r in jsonl.read_text().splitlines()]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'job.sqlite'}{suffix}").unlink(missing_ok=True)
    result, pages = run(job)
    assert (result.exit_code, pages) == (ExitCode.OK, 3)
    assert result.summary["documents"] == {"new": 2, "recovered": 1, "written": 1}
    check_outputs(tmp_path / "out", {"a.md": (1, 3), "b.md": (2, 2)})
    assert all(json.loads(r).get("model") != records[0]["model"] for r in jsonl.read_text().splitlines())


def test_a_rebuild_stopped_half_way_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """kill -9 after --rebuild-state set the damaged state aside and made the new one, before it
    took the pages back from the outputs: the next run (a plain one, from cron) takes them back,
    it does not read the whole archive again."""
    from pantheon_ocr.archive import rebuild

    job = three_runs(tmp_path)
    (tmp_path / "in" / "a.pdf").unlink()
    pdf(tmp_path / "in", "c.pdf", 1, 3)  # new since: the only page to read
    garbage(tmp_path)
    real = rebuild.recover_pages

    def killed(*args, **kwargs):
        raise SystemExit(-9)  # dies here; the finally blocks of a real kill -9 do not even run

    monkeypatch.setattr(rebuild, "recover_pages", killed)
    with pytest.raises(SystemExit):
        run(job, rebuild_state=True)
    monkeypatch.setattr(rebuild, "recover_pages", real)
    result, pages = run(job)
    assert (result.exit_code, pages) == (ExitCode.OK, 1)
    assert result.summary["documents"]["recovered"] == 1
    assert "2 pages recovered from the existing outputs, not OCR'd again" in result.summary["notes"]
    check_outputs(tmp_path / "out", {"b.md": (2, 2), "c.md": (3, 1)})
    assert run(job)[1] == 0


def test_last_report_run(tmp_path):
    assert last_report_run(tmp_path / "missing") == 0
    for name in ("run-0002.json", "run-0012.html", "run-12345.json", "latest.json", "run-0099.json.tmp", "run-x.json"):
        (tmp_path / name).write_text("{}")
    assert last_report_run(tmp_path) == 12345


# ------------------------------------------------------------------ the exit code of a rebuild


def known_bad_job(tmp_path: Path) -> tuple[Path, ExitCode]:
    """Two good PDFs and a zero-byte one: the first night fails it (exit 1); a normal night
    after knows it and leaves it out (exit 0). Returns the job and that normal night's code."""
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 2, 2)
    (tmp_path / "in" / "zero.pdf").write_bytes(b"")
    job = write_job(tmp_path)
    first, _ = run(job)
    assert first.exit_code == ExitCode.PAGES_FAILED and [f["page"] for f in first.summary["failures"]] == [None]
    normal, pages = run(job)
    assert (normal.exit_code, pages, normal.summary["failures"]) == (ExitCode.OK, 0, [])
    assert normal.summary["documents"] == {"unchanged": 2, "skipped (unreadable)": 1}
    return job, normal.exit_code


def test_rebuild_exit_code_is_a_normal_nights_with_a_known_bad_input(tmp_path):
    job, normal = known_bad_job(tmp_path)
    legibly_damaged(tmp_path)
    result, pages = run(job, rebuild_state=True)
    assert (result.exit_code, pages, result.summary["failures"]) == (normal, 0, [])
    assert result.summary["documents"] == {"new": 2, "skipped (unreadable)": 1, "recovered": 2}
    check_outputs(tmp_path / "out", {"a.md": (1, 3), "b.md": (2, 2)})
    assert job_status(load_job(job))["failures"] == [
        {"path": str(tmp_path / "in" / "zero.pdf"), "page": None, "reason": "an empty file (0 bytes)"}]
    assert run(job)[0].exit_code == ExitCode.OK


def test_rebuild_from_nothing_legible_is_a_first_night_not_nothing_readable(tmp_path):
    """With no legible state the bad input is news again, as on a first night (exit 1), but the
    recovered documents count as written: never 4, `nothing could be read`."""
    job, _ = known_bad_job(tmp_path)
    garbage(tmp_path)
    result, pages = run(job, rebuild_state=True)
    assert (result.exit_code, pages) == (ExitCode.PAGES_FAILED, 0)
    assert [(Path(f["path"]).name, f["page"]) for f in result.summary["failures"]] == [("zero.pdf", None)]
    assert result.summary["documents"] == {"new": 3, "failed (unreadable)": 1, "recovered": 2}
    assert run(job)[0].exit_code == ExitCode.OK  # known from now on


def test_a_changed_known_bad_input_is_read_again(tmp_path):
    job, _ = known_bad_job(tmp_path)
    legibly_damaged(tmp_path)
    pdf(tmp_path / "in", "zero.pdf", 1, 3)  # fixed meanwhile: its verdict no longer holds
    result, pages = run(job, rebuild_state=True)
    assert (result.exit_code, pages, result.summary["failures"]) == (ExitCode.OK, 1, [])
    check_outputs(tmp_path / "out", {"a.md": (1, 3), "b.md": (2, 2), "zero.md": (3, 1)})


# ------------------------------------------------------------------ the last guard


def summary(run_id: int, started: float) -> dict:
    return {"job": "job", "run": run_id, "started": started, "status": "finished", "exit_code": 0, "documents": {},
            "pages": {"attempted": 0, "done": 0, "retried": 0, "failed": 0, "tokens": 0}, "seconds": 0, "notes": []}


def test_write_reports_never_writes_over_another_runs_report(tmp_path, monkeypatch):
    import pantheon_ocr.archive.report as report

    monkeypatch.setattr(report, "render_html", lambda s: f"<p>run {s['run']} at {s['started']}</p>")
    first = summary(1, 100.0)
    write_reports(first, tmp_path, 1)
    write_reports(first, tmp_path, 1)  # the same run again (`archive report`): allowed
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ReportTaken, match=r"run-0001\.json is the report of another run .*not writing over it") as e:
        write_reports(summary(1, 200.0), tmp_path, 1)
    assert e.value.exit_code == ExitCode.CANNOT_WRITE
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # latest.* untouched too
    (tmp_path / "run-0001.json").unlink()  # an HTML page alone cannot say whose it is
    with pytest.raises(ReportTaken, match=r"run-0001\.html is the report of another run"):
        write_reports(first, tmp_path, 1)


def test_a_rebuild_that_never_ran_still_passes_its_numbering_on(tmp_path):
    from pantheon_ocr.archive.rebuild import fresh_state

    job = three_runs(tmp_path)
    for p in (tmp_path / "job-reports").iterdir():
        p.unlink()
    legibly_damaged(tmp_path)
    state, note = fresh_state(load_job(job))  # stopped before its first run
    state.close()
    assert note.endswith("; run numbers go on after run 3")
    assert run(job, rebuild_state=True)[0].run == 4
