"""kill -9 at many points of `pantheon-ocr archive run`, then resume: every page exactly once
in the outputs, no truncated file, no temp litter, nothing recorded twice; and a second
concurrent run is refused, then takes over once the first is dead.

The command runs in a subprocess (tests/archive/harness.py: the real CLI over a FakeEngine)
which SIGKILLs itself at a chosen point, or is SIGKILLed by the test."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pantheon_ocr.errors import ExitCode

from fake_engine import md_body

from .harness import HARNESS, check_outputs, pdf, run_cli, temp_litter, write_job

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

DOCS = {"a.md": (1, 5), "b.md": (2, 3), "c.md": (3, 4)}  # output -> (doc number, pages)
N_PAGES = sum(n for _, n in DOCS.values())
ENGINE = {"n_tokens": 4}


def setup_job(tmp_path: Path) -> Path:
    for name, (doc_no, n) in DOCS.items():
        pdf(tmp_path / "in", name.replace(".md", ".pdf"), n, doc_no)
    return write_job(tmp_path, ocr={"batch_size": 2, "formats": ["md", "jsonl"], "page_files": True})


def archive_run(job: Path, kill: str | None = None, engine: dict = ENGINE):
    env = {"PANTHEON_TEST_ENGINE": json.dumps(engine)}
    if kill:
        env["PANTHEON_TEST_KILL"] = kill
    return run_cli(["archive", "run", str(job), "--no-progress"], env=env)


def query(job: Path, sql: str) -> list[tuple]:
    # read-only URI: a plain connect() would create an empty file before the job makes its
    # state, and an empty state file is an error (it would otherwise hide a truncated one)
    db = sqlite3.connect((job.parent / "job.sqlite").as_uri() + "?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def assert_no_partial_files(out: Path) -> None:
    """Whatever exists after a kill is complete: a Markdown file has all its pages, a JSONL
    file parses line by line, a per-page file is whole."""
    for name, (doc_no, n) in DOCS.items():
        md = out / name
        if md.exists():
            check_outputs(out, {name: (doc_no, n)}, n_tokens=4)
        jl = md.with_suffix(".jsonl")
        if jl.exists():
            assert [json.loads(x)["page"] for x in jl.read_text().splitlines()] == list(range(1, n + 1))
        for f in (out / name[:-3]).glob("page-*.md") if (out / name[:-3]).is_dir() else ():
            assert f.read_text().endswith("\n") and md_body(f).startswith("<!-- page ")


def assert_complete(job: Path) -> None:
    tmp = job.parent
    out = tmp / "out"
    check_outputs(out, DOCS, n_tokens=4)
    for name, (_, n) in DOCS.items():
        assert [json.loads(x)["page"] for x in (out / name).with_suffix(".jsonl").read_text().splitlines()] == list(range(1, n + 1))
        assert sorted(p.name for p in (out / name[:-3]).iterdir()) == [f"page-{i:04d}.md" for i in range(1, n + 1)]
    assert not temp_litter(out, tmp / "job-reports")
    # every page recorded exactly once, over all runs: nothing was done twice
    assert query(job, "SELECT count(*), count(DISTINCT doc || '/' || page) FROM attempts") == [(N_PAGES, N_PAGES)]
    assert query(job, "SELECT status, count(*) FROM pages GROUP BY status") == [("done", N_PAGES)]
    assert query(job, "SELECT status, count(*) FROM documents GROUP BY status") == [("done", 3)]
    assert query(job, "SELECT count(*) FROM lock") == [(0,)]


@pytest.mark.parametrize("kill", ["page:1", "page:7", "assemble:1", "assemble:3", "write:1", "write:6", "mark:2", "step:3"])
def test_kill_9_then_resume(tmp_path, kill):
    job = setup_job(tmp_path)
    r = archive_run(job, kill)
    assert r.returncode == -signal.SIGKILL, r.stderr
    out = tmp_path / "out"
    assert_no_partial_files(out)
    if kill.startswith("write"):
        assert temp_litter(out), "the kill should have left a temp file behind"
    done_before = set(query(job, "SELECT doc, page FROM pages WHERE status='done'"))
    point, n = kill.split(":")
    if point == "page":
        assert len(done_before) == int(n)
    recorded = query(job, "SELECT count(*) FROM attempts WHERE run=1")[0][0]
    if recorded:  # the pages the killed run recorded are in no report: `status` and the takeover say them
        status = run_cli(["archive", "status", str(job)])
        assert f"run 1: " in status.stdout and f" killed, {recorded} page{'s' * (recorded > 1)}, " in status.stdout
        (killed,) = json.loads(run_cli(["archive", "status", str(job), "--json"]).stdout)["runs"]
        assert killed["finished"] is not None  # its time ends at its last page, never grows with the clock
    r = archive_run(job)
    assert r.returncode == 0, r.stderr
    assert "took over a stale lock" in r.stderr
    assert (f"run 1 ended without a report, after {recorded} page" in r.stderr) == bool(recorded), r.stderr
    assert ("left by a stopped write" in r.stderr) == (point == "write")
    assert_complete(job)
    # pages finished before the kill were not run again
    second = set(query(job, "SELECT doc, page FROM attempts WHERE run=2"))
    assert not second & done_before
    assert query(job, "SELECT id, status FROM runs ORDER BY id") == [(1, "killed"), (2, "finished")]


def test_killed_again_and_again(tmp_path):
    job = setup_job(tmp_path)
    for kill in ("page:2", "step:2", "write:2", "page:3"):
        assert archive_run(job, kill).returncode == -signal.SIGKILL
        assert_no_partial_files(tmp_path / "out")
    assert archive_run(job).returncode == 0
    assert_complete(job)
    assert [s for _, s in query(job, "SELECT id, status FROM runs ORDER BY id")] == ["killed"] * 4 + ["finished"]


def _start(job: Path, engine: dict, ready: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PANTHEON_TEST_ENGINE": json.dumps(engine)}
    if ready:
        env["PANTHEON_TEST_READY"] = str(ready)
    return subprocess.Popen([sys.executable, str(HARNESS), "archive", "run", str(job), "--no-progress"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout: float = 180.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def _done_pages(job: Path) -> int:
    try:
        return query(job, "SELECT count(*) FROM pages WHERE status='done'")[0][0]
    except sqlite3.OperationalError:  # not created yet
        return 0


@pytest.mark.parametrize("k", [3, 8])
def test_external_kill_9_after_k_pages(tmp_path, k):
    job = setup_job(tmp_path)
    proc = _start(job, {"n_tokens": 4, "step_sleep": 0.1})  # slow enough to be killed mid-run
    try:
        _wait_for(lambda: _done_pages(job) >= k)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert_no_partial_files(tmp_path / "out")
    assert archive_run(job).returncode == 0
    assert_complete(job)


def test_second_concurrent_run_is_refused_then_takes_over(tmp_path):
    job = setup_job(tmp_path)
    ready = tmp_path / "ready"
    first = _start(job, {"n_tokens": 4, "step_sleep": 0.5}, ready)  # still running when the second starts
    try:
        _wait_for(ready.exists)
        r = archive_run(job)
        assert r.returncode == ExitCode.JOB_LOCKED
        assert f"error: job 'job' is already running (run 1, pid {first.pid} on " in r.stderr
        r = run_cli(["archive", "status", str(job)])
        assert "running now: run 1, pid" in r.stdout
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    r = archive_run(job)
    assert r.returncode == 0 and "took over a stale lock" in r.stderr
    assert_complete(job)
    assert query(job, "SELECT id, status FROM runs ORDER BY id") == [(1, "killed"), (2, "finished")]


def test_a_volley_of_sigterms_still_ends_in_130_with_its_summary(tmp_path):
    """A supervisor that sends SIGTERM three times in 0.1 s: the first stops the run, the others
    pass while it winds down; exit 130 (not 143, death by the signal) and the summary printed."""
    job = setup_job(tmp_path)
    ready = tmp_path / "ready"
    proc = _start(job, {"n_tokens": 4, "step_sleep": 0.3}, ready)
    _wait_for(ready.exists)
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.04)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "run 1 of job" in err and "Traceback" not in err
    assert query(job, "SELECT status, exit_code FROM runs") == [("interrupted", 130)]
    assert query(job, "SELECT count(*) FROM lock") == [(0,)]


def test_the_report_of_a_run_still_going_says_so(tmp_path):
    """`archive report` while the night's run works: 75, 'still running', not 'stopped before its
    report was recorded' (2), which sends an operator looking for a crash."""
    job = setup_job(tmp_path)
    ready = tmp_path / "ready"
    proc = _start(job, {"n_tokens": 4, "step_sleep": 0.3}, ready)
    try:
        _wait_for(ready.exists)
        r = run_cli(["archive", "report", str(job)])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert r.returncode == ExitCode.JOB_LOCKED, r.stderr
    assert r.stderr.startswith(f"error: {job}: run 1 is still running (run 1, pid {proc.pid} on ")
    assert r.stderr.endswith("): it writes its report when it ends\n")


_WIND_DOWN = """
import os, signal, sys, time
from pantheon_ocr.commands.common import stop_signals_as_interrupt
try:
    with stop_signals_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
except KeyboardInterrupt:
    pass
os.kill(os.getpid(), signal.SIGTERM)  # while the summary is printed: the default handler died of it
time.sleep(0.2)
print("summary")
sys.exit(130)
"""


def test_sigterms_after_the_first_pass_while_the_command_winds_down():
    proc = subprocess.run([sys.executable, "-c", _WIND_DOWN], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (130, "summary\n"), proc.stderr


def test_sigterm_stops_cleanly(tmp_path):
    """cron/systemd stop: SIGTERM = Ctrl-C: finished pages kept, report written, lock released."""
    job = setup_job(tmp_path)
    ready = tmp_path / "ready"
    proc = _start(job, {"n_tokens": 4, "step_sleep": 0.3}, ready)
    _wait_for(ready.exists)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert query(job, "SELECT status, exit_code FROM runs") == [("interrupted", 130)]
    assert query(job, "SELECT count(*) FROM lock") == [(0,)]
    assert (tmp_path / "job-reports" / "run-0001.html").exists()
    assert_no_partial_files(tmp_path / "out")
    assert archive_run(job).returncode == 0
    assert_complete(job)
