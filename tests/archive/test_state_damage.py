"""A job state that is damaged, foreign, empty, read-only or full; simultaneous starts; signals in
the bookkeeping; `archive run --rebuild-state`. Every case: one clear line, the documented exit
code, no traceback, no page lost, and a foreign file never touched."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_engine import md_body
from pantheon_ocr.archive import sqlite as state_sqlite
from pantheon_ocr.archive.report import job_status
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.archive.sqlite import StateBusy, StateDamaged
from pantheon_ocr.errors import ExitCode, WriteError

from .harness import Counting, HARNESS, check_outputs, md_pages, pdf, run_cli, write_job


def done_job(tmp_path: Path, **ocr) -> Path:
    """A job with two documents, run once to the end."""
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    pdf(tmp_path / "in", "b.pdf", 2, 2)
    job = write_job(tmp_path, ocr=ocr)
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK
    return job


def sql(job: Path, statement: str, *args) -> list:
    db = sqlite3.connect(job.parent / "job.sqlite")
    try:
        rows = db.execute(statement, args).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


def cli(*args, env=None):
    proc = run_cli(list(args), env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, lines


def one_error(job: Path, command: str, code: int, *needles: str) -> str:
    rc, lines = cli("archive", command, str(job), *(["--no-progress"] if command == "run" else []))
    errors = [line for line in lines if line.startswith("error: ")]
    assert rc == code and len(errors) == 1, (rc, lines)
    assert all(n in errors[0] for n in needles), errors[0]
    return errors[0]


# ------------------------------------------------------------------ damage is one clear error


def test_empty_state_is_an_error_not_a_new_job(tmp_path):
    job = done_job(tmp_path)
    state = tmp_path / "job.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    state.write_bytes(b"")
    for command in ("run", "status"):
        one_error(job, command, ExitCode.BAD_ARGUMENTS, str(state), "empty (0 bytes)", "--rebuild-state")
    assert state.stat().st_size == 0  # left as it was: nothing was OCR'd again over it


def test_a_foreign_database_is_never_modified(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path)
    state = tmp_path / "job.sqlite"
    db = sqlite3.connect(state)
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO photos (name) VALUES ('holiday.jpg')")
    db.commit()
    db.close()
    before = state.read_bytes()
    for command in ("run", "status"):
        one_error(job, command, ExitCode.BAD_ARGUMENTS, "not a pantheon-ocr job state", "photos", "left untouched")
    assert state.read_bytes() == before
    rc, lines = cli("archive", "run", str(job), "--no-progress", "--rebuild-state")  # not even moved aside
    assert rc == ExitCode.BAD_ARGUMENTS and state.read_bytes() == before, lines


@pytest.mark.parametrize("what", ["the job file", "an input", "a text file"])
def test_a_file_that_is_no_database_is_never_called_damaged_nor_set_aside(tmp_path, what):
    """`state =` naming the job file itself (or an input, or any file that is not SQLite) was
    'damaged' with --rebuild-state as the way out, which set the file aside and put a database
    in its place: the job file gone, an input replaced. It is refused and left as it is."""
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    (tmp_path / "notes.txt").write_text("my notes\n")
    state = {"the job file": tmp_path / "job.toml", "an input": tmp_path / "in" / "a.pdf",
             "a text file": tmp_path / "notes.txt"}[what]
    job = write_job(tmp_path, {"state": str(state)})
    before = {p: p.read_bytes() for p in (job, tmp_path / "in" / "a.pdf", tmp_path / "notes.txt")}
    said = {"the job file": "names the job file itself", "an input": "it begins '%PDF-", "a text file": "it begins 'my notes'"}
    for command in ("run", "status"):
        one_error(job, command, ExitCode.BAD_ARGUMENTS, str(state), said[what])
    if what != "the job file":
        one_error(job, "run", ExitCode.BAD_ARGUMENTS, "not an SQLite database", "left untouched")
    rc, lines = cli("archive", "run", str(job), "--no-progress", "--rebuild-state")
    assert rc == ExitCode.BAD_ARGUMENTS, lines
    assert {p: p.read_bytes() for p in before} == before
    assert not [p for p in tmp_path.rglob("*") if ".damaged-" in p.name or ".old-" in p.name]  # nothing set aside
    assert [p.name for p in (tmp_path / "in").iterdir()] == ["a.pdf"]


def test_a_state_whose_first_page_was_zeroed_is_damaged_and_rebuilt(tmp_path):
    """Zeroed blocks are what a disk's damage leaves: such a state is damaged (rebuilt), not
    refused as another format's file."""
    job = done_job(tmp_path)
    sql(job, "PRAGMA wal_checkpoint(TRUNCATE)")
    state = tmp_path / "job.sqlite"
    data = bytearray(state.read_bytes())
    data[:4096] = bytes(4096)
    state.write_bytes(bytes(data))
    one_error(job, "status", ExitCode.BAD_ARGUMENTS, str(state), "damaged", "--rebuild-state")
    rc, lines = cli("archive", "run", str(job), "--no-progress", "--rebuild-state")
    assert rc == ExitCode.OK and any("set aside as" in line for line in lines), lines


def test_undecodable_text_is_damage_naming_the_file_and_the_way_out(tmp_path):
    job = done_job(tmp_path)
    sql(job, "UPDATE documents SET rel = CAST(x'ff41' AS TEXT) WHERE id = 1")  # what a flipped byte does
    for command in ("run", "status"):
        one_error(job, command, ExitCode.BAD_ARGUMENTS, str(tmp_path / "job.sqlite"), "damaged", "--rebuild-state")


def test_corrupt_pages_are_damage(tmp_path):
    job = done_job(tmp_path)
    sql(job, "PRAGMA wal_checkpoint(TRUNCATE)")
    state = tmp_path / "job.sqlite"
    data = bytearray(state.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page: 3 * page] = bytes(range(256)) * (page // 256)  # a whole b-tree page of garbage
    state.write_bytes(bytes(data))
    for command in ("run", "status"):
        one_error(job, command, ExitCode.BAD_ARGUMENTS, str(state), "damaged", "--rebuild-state")


def test_documents_done_without_pages_are_damage_not_silent_loss(tmp_path):
    job = done_job(tmp_path)
    sql(job, "DELETE FROM pages WHERE doc = 1")
    (tmp_path / "out" / "a.md").unlink()
    one_error(job, "run", ExitCode.BAD_ARGUMENTS, "1 document(s) marked done have no page rows", "--rebuild-state")


def test_status_of_a_folder_or_a_missing_state(tmp_path):
    job = write_job(tmp_path, {"state": "statedir"})
    (tmp_path / "statedir").mkdir()
    one_error(job, "status", ExitCode.BAD_ARGUMENTS, "a folder, not a job state file")
    one_error(job, "run", ExitCode.BAD_ARGUMENTS, "a folder, not a job state file")
    (tmp_path / "fresh").mkdir()
    job2 = write_job(tmp_path / "fresh")
    assert job_status(load_job(job2))["runs"] == []  # no file yet: no runs yet, and none made
    assert not (tmp_path / "fresh" / "job.sqlite").exists()


# ------------------------------------------------------------------ rebuilding from the outputs


def test_rebuild_state_never_reocrs_an_intact_page(tmp_path):
    job = done_job(tmp_path, formats=["md"])
    state = tmp_path / "job.sqlite"
    before = md_body(tmp_path / "out" / "a.md")
    (tmp_path / "out" / "b.md").unlink()  # b's output is gone: its pages must be read again
    for suffix in ("", "-wal", "-shm"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    state.write_bytes(b"SQLite format 3\x00" + bytes(200))  # a header and nothing else
    one_error(job, "run", ExitCode.BAD_ARGUMENTS, "damaged", "--rebuild-state")
    counting = Counting()
    result = run_job(load_job(job), counting, rebuild_state=True)
    assert result.exit_code == ExitCode.OK
    assert counting.pages == 2  # b.pdf's two pages; a.pdf's three came back from a.md
    assert md_body(tmp_path / "out" / "a.md") == before
    check_outputs(tmp_path / "out", {"a.md": (1, 3), "b.md": (2, 2)})
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("job.sqlite.damaged-")]
    assert len(aside) == 1 and any("set aside" in n for n in result.summary["notes"])
    again = Counting()
    assert run_job(load_job(job), again).exit_code == ExitCode.OK and again.pages == 0  # a healthy state again


def test_rebuild_uses_jsonl_and_skips_failed_pages(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    job = write_job(tmp_path, ocr={"formats": ["md", "jsonl"]}, retry={"attempts": 1})
    assert run_job(load_job(job), Counting(fail_vision=[[1, 2]])).exit_code == ExitCode.PAGES_FAILED
    (tmp_path / "job.sqlite").unlink()
    counting = Counting()
    assert run_job(load_job(job), counting, rebuild_state=True).exit_code == ExitCode.OK
    assert counting.pages == 1  # only the page that had failed
    assert [p for p, marker, _ in md_pages(md_body(tmp_path / "out" / "a.md")) if "failed" in marker] == []


# ------------------------------------------------------------------ read-only, full, busy


@pytest.mark.parametrize("how, needle", [("ro", "readonly"), ("full", "full")])
def test_read_only_or_full_state_is_a_clear_write_error(tmp_path, monkeypatch, how, needle):
    job = done_job(tmp_path)
    pdf(tmp_path / "in", "c.pdf", 40, 3)  # more pages to record than a full disk can take
    real = state_sqlite.connect

    def connect(path, mode="rw"):
        db = real(path, "ro" if how == "ro" else mode)
        if how == "full":
            db.execute(f"PRAGMA max_page_count={db.execute('PRAGMA page_count').fetchone()[0]}")
        return db

    monkeypatch.setattr("pantheon_ocr.archive.state.connect", connect)
    monkeypatch.setattr("pantheon_ocr.archive.lock.connect", connect, raising=False)
    with pytest.raises(WriteError) as e:
        run_job(load_job(job), Counting())
    assert e.value.exit_code == ExitCode.CANNOT_WRITE and str(tmp_path / "job.sqlite") in str(e.value)
    assert needle in str(e.value).lower()


def test_a_read_only_state_leaves_nothing_read_only_behind(tmp_path, monkeypatch):
    """chmod 444 job.sqlite: exit 73 naming it, said before SQLite opens it (which left -wal and
    -shm as read-only as the file: the run still failed after the operator made the state
    writable again); once it is writable the next run goes on."""
    job = done_job(tmp_path)
    state = tmp_path / "job.sqlite"
    for suffix in ("-wal", "-shm"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == state and mode == os.W_OK else
                        real(p, mode, **kw))  # root may write a 0444 file: as a user would see it
    with pytest.raises(WriteError) as e:
        run_job(load_job(job), Counting())
    assert e.value.exit_code == ExitCode.CANNOT_WRITE and str(e.value).startswith(f"{state}: the job state cannot be "
                                                                                  "written")
    assert not Path(f"{state}-wal").exists() and not Path(f"{state}-shm").exists()
    monkeypatch.setattr(os, "access", real)
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK


def test_a_state_made_by_a_killed_run_leaves_no_temp_files(tmp_path):
    """kill -9 while a run made the state: its `.job.sqlite.new-PID` files are removed by the next
    run (a live process's are left alone)."""
    job = done_job(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    left = [tmp_path / f".job.sqlite.new-{dead}{suffix}" for suffix in ("", "-journal", "-wal")]
    live = tmp_path / f".job.sqlite.new-{os.getppid()}"
    for p in (*left, live):
        p.write_bytes(b"x")
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK
    assert not any(p.exists() for p in left) and live.exists()


def test_simultaneous_starts_end_in_75_not_database_is_locked(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path)
    env = {**os.environ, "PANTHEON_TEST_ENGINE": '{"n_tokens": 4, "step_sleep": 0.05}'}
    start = time.time() + 2.0
    code = (f"import sys, time, runpy\nwhile time.time() < {start}: pass\n"
            f"sys.argv = [{str(HARNESS)!r}, 'archive', 'run', {str(job)!r}, '--no-progress']\n"
            f"runpy.run_path({str(HARNESS)!r}, run_name='__main__')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert set(codes) <= {ExitCode.OK, ExitCode.JOB_LOCKED} and ExitCode.OK in codes, results
    assert not any("Traceback" in err or "database is locked" in err and "error: " not in err for _, err in results)
    check_outputs(tmp_path / "out", {"a.md": (1, 2)}, n_tokens=4)


def test_busy_state_is_75():
    err = state_sqlite.translate(Path("/x/job.sqlite"), sqlite3.OperationalError("database is locked"))
    assert isinstance(err, StateBusy) and err.exit_code == ExitCode.JOB_LOCKED
    err = state_sqlite.translate(Path("/x/job.sqlite"), sqlite3.DatabaseError("database disk image is malformed"), "j.toml")
    assert isinstance(err, StateDamaged) and err.exit_code == ExitCode.BAD_ARGUMENTS and "j.toml --rebuild-state" in str(err)


# ------------------------------------------------------------------ signals at any point


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
@pytest.mark.parametrize("where", ["report", "finish", "start"])
def test_sigterm_in_bookkeeping_releases_the_lock(tmp_path, monkeypatch, where, sig):
    """SIGHUP (a dropped ssh session) is held back in the bookkeeping as SIGTERM is."""
    from pantheon_ocr.commands.common import stop_signals_as_interrupt as _stop_signals_as_interrupt
    import pantheon_ocr.archive.run as job_run

    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path)

    def sigterm_then(fn):
        def wrapped(*a, **kw):
            os.kill(os.getpid(), sig)
            time.sleep(0.05)  # the signal is delivered here, in the middle of the step
            return fn(*a, **kw)
        return wrapped

    if where == "report":
        monkeypatch.setattr(job_run, "write_reports", sigterm_then(job_run.write_reports))
    elif where == "finish":
        monkeypatch.setattr(job_run.JobState, "finish_run", sigterm_then(job_run.JobState.finish_run))
    else:
        monkeypatch.setattr(job_run.Heartbeat, "start", sigterm_then(job_run.Heartbeat.start))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with _stop_signals_as_interrupt():
            try:  # a stop during the work ends the run with 130; after it, the bookkeeping finishes first
                stopped = run_job(load_job(job), Counting()).exit_code == ExitCode.INTERRUPTED
            except KeyboardInterrupt:  # (pytest.raises lets KeyboardInterrupt through)
                stopped = True
    finally:
        for s, h in before.items():  # once stopped, the command keeps its handlers until it ends
            signal.signal(s, h)
    assert stopped
    assert sql(job, "SELECT count(*) FROM lock") == [(0,)]
    assert sql(job, "SELECT count(*) FROM runs WHERE status = 'running'") == [(0,)]
    monkeypatch.undo()
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK  # the next night runs, no 75


# ------------------------------------------------------------------ one state, one job


def test_a_state_of_another_job_is_refused_and_left_as_it_was(tmp_path):
    """A job file copied with its `state =` left: the second job mixed its documents, runs and
    reports into the first's state, and each counted the other's documents as gone. It is refused
    by run, --rebuild-state (which would set the other job's state aside), status and report, and
    the state is left as it was; the job of that name still runs."""
    job = done_job(tmp_path)
    (tmp_path / "other").mkdir()
    pdf(tmp_path / "other" / "in", "c.pdf", 1, 3)
    other = write_job(tmp_path / "other", {"name": "copied", "state": str(tmp_path / "job.sqlite")})
    before = sql(job, "SELECT * FROM documents"), sql(job, "SELECT * FROM runs")
    for command in ("run", "status", "report"):
        one_error(other, command, ExitCode.BAD_ARGUMENTS, f"{tmp_path / 'job.sqlite'}: this is the state of job 'job' "
                  f"({job}), not of job 'copied' ({other}): two jobs sharing a state",
                  "give this job a `state =` of its own, or, if it is job 'job' renamed, set name = \"job\"")
    rc, lines = cli("archive", "run", str(other), "--rebuild-state", "--no-progress")
    assert rc == ExitCode.BAD_ARGUMENTS and any("this is the state of job 'job'" in line for line in lines), lines
    assert (sql(job, "SELECT * FROM documents"), sql(job, "SELECT * FROM runs")) == before
    assert list(tmp_path.glob("job.sqlite.*")) == [] and not any((tmp_path / "other" / "out").rglob("*"))
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK  # its own job runs on


def test_a_state_from_before_the_name_was_kept_is_claimed_by_its_next_run(tmp_path):
    """A state an older version made has no job name: its next run writes it; status reads it
    without writing."""
    job = done_job(tmp_path)
    sql(job, "DELETE FROM meta WHERE key IN ('job', 'job_file')")
    assert job_status(load_job(job))["runs"] and sql(job, "SELECT value FROM meta WHERE key='job'") == []
    assert run_job(load_job(job), Counting()).exit_code == ExitCode.OK
    assert sql(job, "SELECT value FROM meta WHERE key IN ('job', 'job_file') ORDER BY key") == [("job",), (str(job),)]


def test_a_job_file_copied_with_its_name_is_refused_and_a_moved_one_runs_on(tmp_path):
    """The name alone let a copy of the job file (its `name` and `state` kept, other inputs) share
    the state; the job file the state records tells a copy (still there) from a move (gone), and
    a moved job's state records its new place."""
    import shutil

    job = done_job(tmp_path)
    (tmp_path / "copy").mkdir()
    copied = write_job(tmp_path / "copy", {"name": "job", "state": str(tmp_path / "job.sqlite")})
    one_error(copied, "run", ExitCode.BAD_ARGUMENTS, f"this is the state of job 'job' of {job}, which is still there, "
              f"and {copied} names it too")
    moved = tmp_path / "moved.toml"
    text = job.read_text().replace('inputs = ["in"]', f'inputs = ["{tmp_path / "in"}"]')
    moved.write_text(f'name = "job"\nstate = "{tmp_path / "job.sqlite"}"\n'
                     + text.replace('output = "out"', f'output = "{tmp_path / "out"}"'))
    job.unlink()
    assert run_job(load_job(moved), Counting()).exit_code == ExitCode.OK
    assert sql(moved, "SELECT value FROM meta WHERE key='job_file'") == [(str(moved),)]


def test_pages_short_of_memory_exit_71(tmp_path):
    """A night whose pages failed for lack of memory exited 1 or 4 (inputs unreadable), as
    transcribe did: 71, out of resources, says to give it more memory or fewer pages at once."""
    from fake_engine import EngineFactory

    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path)
    base = EngineFactory()

    def factory():
        engine, notes = base()
        real = engine.vision

        def vision(image):
            features = real(image)
            if features.page == 2:
                raise MemoryError("Unable to allocate 1.2 GiB")
            return features

        engine.vision = vision
        return engine, notes

    result = run_job(load_job(job), factory)
    assert result.exit_code == ExitCode.OUT_OF_RESOURCES
    (failure,) = result.summary["failures"]
    assert failure["page"] == 2 and "not enough memory (Unable to allocate 1.2 GiB)" in failure["reason"]
