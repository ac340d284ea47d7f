"""What an archive job's state knows of its runs and its lock: the `runs` and `lock` tables.
A mixin of `state.JobState` (self.db is its connection), kept apart so each file stays readable;
lock.py takes and keeps the lock with these.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Callable

from .sqlite import Txn, db_name


@dataclass
class LockInfo:
    run: int
    pid: int
    host: str
    acquired: float
    heartbeat: float

    def describe(self, now: float | None = None) -> str:
        age = (now or time.time()) - self.heartbeat
        return f"run {self.run}, pid {self.pid} on {self.host}, heartbeat {age:.0f} s ago"


class RunsMixin:
    db: sqlite3.Connection  # set by JobState

    def read_lock(self) -> LockInfo | None:
        row = self.db.execute("SELECT run, pid, host, acquired, heartbeat FROM lock WHERE id=1").fetchone()
        return LockInfo(*row) if row else None

    def start_run(self, executor: str, free: Callable[[LockInfo | None, float], None],
                  after: int = 0) -> tuple[int, LockInfo | None]:
        """In one write transaction: `free(lock, now)` raises unless the lock may be taken; then
        the run row is inserted and the lock is ours. Returns (run id, the lock taken over).

        The run's number is above every run this state knows, the `runs_after` of a rebuilt
        state (`adopt`) and `after` (the reports already in the job's reports folder): a run
        number names its report files, and the report of an earlier run is never written over."""
        host, pid, now = socket.gethostname(), os.getpid(), time.time()
        with Txn(self.db) as db:
            held = self.read_lock()
            free(held, now)
            if held is not None:
                db.execute("UPDATE runs SET status='killed', finished=? WHERE id=? AND status='running'", (held.heartbeat, held.run))
            last = db.execute("SELECT max(coalesce((SELECT max(id) FROM runs), 0), "
                              "coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key='runs_after'), 0), ?)",
                              (after,)).fetchone()[0]
            run = db.execute("INSERT INTO runs (id, started, pid, host, executor, status) VALUES (?, ?, ?, ?, ?, 'running')",
                             (last + 1, now, pid, host, executor)).lastrowid
            db.execute("INSERT OR REPLACE INTO lock VALUES (1, ?, ?, ?, ?, ?)", (run, pid, host, now, now))
            # A run row still 'running' without the lock was killed before it could say so.
            db.execute("UPDATE runs SET status='killed' WHERE status='running' AND id<>?", (run,))
        return run, held

    def beat(self, run: int) -> bool:
        """Refresh the lock's heartbeat; False when the lock is no longer this run's."""
        with Txn(self.db) as db:
            return db.execute("UPDATE lock SET heartbeat=? WHERE id=1 AND run=?", (time.time(), run)).rowcount > 0

    def finish_run(self, run: int, status: str, exit_code: int, summary: dict, report_json: str | None,
                   report_html: str | None) -> None:
        with Txn(self.db) as db:
            db.execute("UPDATE runs SET finished=?, status=?, exit_code=?, summary=?, report_json=?, report_html=? WHERE id=?",
                       (time.time(), status, exit_code, json.dumps(summary), report_json and db_name(report_json),
                        report_html and db_name(report_html), run))

    def release(self, run: int) -> None:
        with Txn(self.db) as db:
            db.execute("DELETE FROM lock WHERE id=1 AND run=?", (run,))

    def run_summary(self, run_id: int | None = None) -> tuple[int, str | None] | None:
        """(run id, its summary JSON) of run `run_id` (None: the latest run), or None."""
        sql = "SELECT id, summary FROM runs " + ("WHERE id=?" if run_id is not None else "ORDER BY id DESC LIMIT 1")
        row = self.db.execute(sql, (run_id,) if run_id is not None else ()).fetchone()
        return None if row is None else (row["id"], row["summary"])

    def run_work(self, run: int) -> dict[str, float]:
        """What run `run` recorded page by page, for a run killed before its summary: the pages it
        finished ("done", "failed" for good: a page retried counts once, by its last outcome; one
        left to retry is not finished), the tokens of all its attempts, and when it recorded the
        last ("last", 0.0 if nothing)."""
        done, failed = (self.db.execute(
            "SELECT count(DISTINCT doc || '/' || page) FROM attempts WHERE run=? AND outcome=?", (run, o)).fetchone()[0]
            for o in ("done", "failed"))
        tokens, last = self.db.execute("SELECT coalesce(sum(n_tokens), 0), coalesce(max(finished_at), 0) FROM attempts "
                                       "WHERE run=?", (run,)).fetchone()
        return {"done": done, "failed": failed, "tokens": tokens, "last": last}

    def recent_runs(self, n: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT id, started, finished, host, pid, executor, status, exit_code, summary, report_html "
                               "FROM runs ORDER BY id DESC LIMIT ?", (n,)).fetchall()
