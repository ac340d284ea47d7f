"""The run lock while a run holds it: the heartbeat keeps it fresh, and a run whose lock was taken
over (it stalled past lock.stale_after and another run judged it dead) stops without recording
another page."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from fake_engine import EngineFactory
from pantheon_ocr.archive.lock import Heartbeat, acquire
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.archive.state import JobState
from pantheon_ocr.errors import ExitCode, JobError

from .harness import pdf, write_job


def _wait_for(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _steal_lock(state_file: Path) -> None:
    """What a second run does when it takes over a stale lock: the lock row becomes its own."""
    db = sqlite3.connect(state_file, timeout=30)
    try:
        db.execute("UPDATE lock SET run=999, pid=1, host='elsewhere', heartbeat=? WHERE id=1", (time.time(),))
        db.commit()
    finally:
        db.close()


def test_heartbeat_refreshes_the_lock_and_notices_a_takeover(tmp_path):
    path = tmp_path / "job.sqlite"
    state = JobState.open(path)
    try:
        run, stale = acquire(state, stale_after=60, executor="local", job_name="job")
        assert stale is None
        first = state.read_lock().heartbeat
        beat = Heartbeat(path, run, interval=0.05)
        beat.start()
        try:
            _wait_for(lambda: state.read_lock().heartbeat > first)
            assert state.read_lock().run == run and not beat.lost.is_set()
            _steal_lock(path)
            _wait_for(beat.lost.is_set)
            assert state.read_lock().run == 999  # the heartbeat never writes over another run's lock
        finally:
            beat.stop()
        assert not beat.is_alive()
    finally:
        state.close()


def test_a_run_that_lost_its_lock_stops_recording(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 3, 1)
    job = write_job(tmp_path, lock={"stale_after": 1}, ocr={"batch_size": 1, "render_workers": 1})
    state_file = tmp_path / "job.sqlite"
    stolen = []

    def steal(step: int) -> None:  # in the pipeline's CPU thread, while the first page decodes
        if step == 1:
            _steal_lock(state_file)
            stolen.append(time.monotonic())

    factory = EngineFactory(n_tokens=12, step_sleep=0.1, on_step=steal)
    with pytest.raises(JobError, match="another run took over this job's lock") as caught:
        run_job(load_job(job), factory)
    assert caught.value.exit_code == ExitCode.JOB_LOCKED  # 75: another run has it; not 2, a bad job file
    assert stolen
    db = sqlite3.connect(state_file)
    try:
        assert db.execute("SELECT count(*) FROM pages WHERE status != 'pending'").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
        assert db.execute("SELECT run FROM lock").fetchall() == [(999,)]  # the new owner keeps it
        assert db.execute("SELECT status FROM runs WHERE id=1").fetchone()[0] == "crashed"
    finally:
        db.close()
