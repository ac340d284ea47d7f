"""One run of a job at a time: the lock row in the job's state, and the heartbeat that keeps it.

A lock is stale when its process is gone (same host) or its heartbeat is older than
`stale_after` (any host, or a reused pid); a stale lock is taken over and the dead run is marked
"killed". While a run holds the lock a thread refreshes the heartbeat; if the lock stops being
ours (another run judged us dead, because we were suspended past stale_after, and took over),
the heartbeat says so and the run stops instead of writing beside the new owner.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

from ..errors import ExitCode, JobError
from .sqlite import pid_alive
from .runs import LockInfo
from .state import JobState, connect


class JobLocked(JobError):
    """Another run of the same job holds the lock."""

    exit_code = ExitCode.JOB_LOCKED


def lock_is_stale(lock: LockInfo, stale_after: float, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    if now - lock.heartbeat > stale_after:
        return True
    return lock.host == socket.gethostname() and not pid_alive(lock.pid)


def acquire(state: JobState, stale_after: float, executor: str, job_name: str,
            after: int = 0) -> tuple[int, LockInfo | None]:
    """Start a run: take the lock (or refuse with JobLocked) and insert the run row, numbered
    above `after` too (state.start_run). Returns (run id, the stale lock taken over or None)."""

    def free(held: LockInfo | None, now: float) -> None:
        if held is not None and not lock_is_stale(held, stale_after, now):
            raise JobLocked(
                f"job {job_name!r} is already running ({held.describe(now)}); "
                f"wait for it to finish, or if that process is gone, the lock is taken over "
                f"{stale_after:.0f} s after its last heartbeat"
            )

    return state.start_run(executor, free, after)


class Heartbeat(threading.Thread):
    """Refreshes the lock's heartbeat every `interval` seconds on its own connection (SQLite
    connections belong to one thread). `lost` is set if the lock row stopped being ours."""

    def __init__(self, path: Path, run: int, interval: float):
        super().__init__(name="pantheon-heartbeat", daemon=True)
        self.path, self.run_id, self.interval = path, run, interval
        self.stopping = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:  # noqa: D401 - Thread API
        try:
            state = JobState(connect(self.path))
        except sqlite3.Error:
            return  # the run itself meets the same problem and says so; a thread prints nothing
        try:
            while not self.stopping.wait(self.interval):
                try:
                    ours = state.beat(self.run_id)
                except sqlite3.Error:
                    continue  # busy for 30 s, a full disk: try again at the next beat
                if not ours:
                    self.lost.set()
                    return
        finally:
            state.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5.0)
