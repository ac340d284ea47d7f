"""An archive job's state: one SQLite file (WAL) with documents, pages, attempts, runs and
the run lock.

Why SQLite: every page result is committed in its own transaction, so a `kill -9` at any
moment loses at most the pages still in flight, and a page is recorded at most once (the
update is conditional on the page still being pending with the attempt count we expect).
WAL lets `archive status` read while a run writes; synchronous=NORMAL is durable against a
killed process (only an OS crash can lose the last commits, which are then simply redone).

The lock is a row (pid, host, heartbeat) rather than a lock file: it lives and dies with the
state it protects, is taken inside a write transaction (two starting runs cannot both win),
and a thread refreshes the heartbeat. A lock is stale when its process is gone (same host)
or its heartbeat is older than `stale_after` (any host, or a reused pid); a stale lock is
taken over and the dead run is marked "killed".
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExitCode, JobError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,       -- absolute path of the input
    doc_id TEXT NOT NULL,            -- render.Document.doc_id
    kind TEXT NOT NULL,
    rel TEXT NOT NULL,               -- path under its input folder; outputs mirror it
    output TEXT,                     -- output base (formats append .md, .jsonl, ...)
    sha256 TEXT, size INTEGER, mtime_ns INTEGER,
    n_pages INTEGER,                 -- pages in the file; NULL when it could not be opened
    pages_spec TEXT,                 -- the job's page selection the pages rows were made for
    status TEXT NOT NULL,            -- pending | done | partial | failed
    error TEXT,
    version INTEGER NOT NULL DEFAULT 1,  -- +1 each time the content changed
    seen_run INTEGER, updated_at REAL
);
CREATE TABLE IF NOT EXISTS pages (
    doc INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    page INTEGER NOT NULL,           -- 1-based
    status TEXT NOT NULL,            -- pending | done | failed
    attempts INTEGER NOT NULL DEFAULT 0,
    text TEXT, n_tokens INTEGER, finish_reason TEXT, error TEXT,
    render_s REAL, vision_s REAL, prefill_s REAL, decode_s REAL,
    temperature REAL, seed INTEGER, run INTEGER, finished_at REAL,
    PRIMARY KEY (doc, page)
);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY,
    run INTEGER NOT NULL, doc INTEGER NOT NULL, version INTEGER NOT NULL, page INTEGER NOT NULL,
    attempt INTEGER NOT NULL, outcome TEXT NOT NULL,  -- done | retry | failed
    temperature REAL, seed INTEGER, n_tokens INTEGER, finish_reason TEXT, error TEXT,
    render_s REAL, vision_s REAL, prefill_s REAL, decode_s REAL, finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started REAL NOT NULL, finished REAL,
    pid INTEGER NOT NULL, host TEXT NOT NULL, executor TEXT,
    status TEXT NOT NULL,            -- running | finished | interrupted | killed | crashed
    exit_code INTEGER, summary TEXT, report_json TEXT, report_html TEXT
);
CREATE TABLE IF NOT EXISTS lock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    run INTEGER NOT NULL, pid INTEGER NOT NULL, host TEXT NOT NULL,
    acquired REAL NOT NULL, heartbeat REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pages_pending ON pages (status, doc);
"""

STAGE_COLUMNS = {"render": "render_s", "vision": "vision_s", "prefill": "prefill_s", "decode": "decode_s"}


class JobLocked(JobError):
    """Another run of the same job holds the lock."""

    exit_code = ExitCode.JOB_LOCKED


def connect(path: Path, create: bool = True) -> sqlite3.Connection:
    if not create and not path.is_file():
        raise FileNotFoundError(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so no
        # statement silently starts one and holds the write lock.
        db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=True)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=30000")
    except sqlite3.DatabaseError as e:
        raise JobError(f"{path}: cannot open the job state (SQLite): {e}") from None
    return db


class Txn:
    """`with Txn(db):` = BEGIN IMMEDIATE ... COMMIT, ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")


def open_state(path: Path) -> sqlite3.Connection:
    db = connect(path)
    try:
        db.executescript(_SCHEMA)  # idempotent (IF NOT EXISTS); runs outside our transactions
        with Txn(db):
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise JobError(f"{path}: job state has schema version {row[0]}, this pantheon-ocr reads {SCHEMA_VERSION}")
    except sqlite3.DatabaseError as e:
        db.close()
        raise JobError(f"{path}: not a usable job state file: {e}") from None
    return db


# ------------------------------------------------------------------------------- lock


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a zombie counts as dead)."""
    if os.name == "nt":
        return True  # os.kill would terminate it there: rely on the heartbeat's age instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, belongs to someone else
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we know


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


def read_lock(db: sqlite3.Connection) -> LockInfo | None:
    row = db.execute("SELECT run, pid, host, acquired, heartbeat FROM lock WHERE id=1").fetchone()
    return LockInfo(*row) if row else None


def lock_is_stale(lock: LockInfo, stale_after: float, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    if now - lock.heartbeat > stale_after:
        return True
    return lock.host == socket.gethostname() and not pid_alive(lock.pid)


def acquire(db: sqlite3.Connection, stale_after: float, executor: str, job_name: str) -> tuple[int, LockInfo | None]:
    """Start a run: take the lock (or refuse with JobLocked) and insert the run row.
    Returns (run id, the stale lock taken over or None)."""
    host, pid, now = socket.gethostname(), os.getpid(), time.time()
    with Txn(db):
        held = read_lock(db)
        if held is not None and not lock_is_stale(held, stale_after, now):
            raise JobLocked(
                f"job {job_name!r} is already running ({held.describe(now)}); "
                f"wait for it to finish, or if that process is gone, the lock is taken over "
                f"{stale_after:.0f} s after its last heartbeat"
            )
        if held is not None:
            db.execute("UPDATE runs SET status='killed', finished=? WHERE id=? AND status='running'", (held.heartbeat, held.run))
        run = db.execute(
            "INSERT INTO runs (started, pid, host, executor, status) VALUES (?, ?, ?, ?, 'running')", (now, pid, host, executor)
        ).lastrowid
        db.execute("INSERT OR REPLACE INTO lock VALUES (1, ?, ?, ?, ?, ?)", (run, pid, host, now, now))
        # A run row still 'running' without the lock was killed before it could say so.
        db.execute("UPDATE runs SET status='killed' WHERE status='running' AND id<>?", (run,))
    return run, held


def release(db: sqlite3.Connection, run: int) -> None:
    with Txn(db):
        db.execute("DELETE FROM lock WHERE id=1 AND run=?", (run,))


class Heartbeat(threading.Thread):
    """Refreshes the lock's heartbeat every `interval` seconds on its own connection (SQLite
    connections belong to one thread). `lost` is set if the lock row stopped being ours,
    i.e. another run judged us dead (we were suspended past stale_after) and took over."""

    def __init__(self, path: Path, run: int, interval: float):
        super().__init__(name="pantheon-heartbeat", daemon=True)
        self.path, self.run_id, self.interval = path, run, interval
        self.stopping = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:  # noqa: D401 - Thread API
        db = connect(self.path)
        try:
            while not self.stopping.wait(self.interval):
                try:
                    with Txn(db):
                        n = db.execute("UPDATE lock SET heartbeat=? WHERE id=1 AND run=?", (time.time(), self.run_id)).rowcount
                except sqlite3.OperationalError:
                    continue  # busy for 30 s: try again at the next beat
                if n == 0:
                    self.lost.set()
                    return
        finally:
            db.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5.0)


def finish_run(db: sqlite3.Connection, run: int, status: str, exit_code: int, summary: dict,
               report_json: str | None, report_html: str | None) -> None:
    with Txn(db):
        db.execute(
            "UPDATE runs SET finished=?, status=?, exit_code=?, summary=?, report_json=?, report_html=? WHERE id=?",
            (time.time(), status, exit_code, json.dumps(summary), report_json, report_html, run),
        )


# --------------------------------------------------------------------------- status


def job_status(spec) -> dict:
    """Documents and pages by status, the last runs, current lock holder, final failures, for
    a jobs_spec.JobSpec; read-only, no lock taken (works while a run is going)."""
    out: dict[str, Any] = {"job": spec.name, "job_file": str(spec.path), "state": str(spec.state), "documents": {}, "pages": {},
                           "runs": [], "running": None, "failures": []}
    if not spec.state.is_file():
        return out
    db = connect(spec.state)
    try:
        db.execute("SELECT 1 FROM runs LIMIT 1")
    except Exception:  # noqa: BLE001 - an empty or foreign file
        db.close()
        return out
    try:
        out["documents"] = dict(db.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall())
        out["pages"] = dict(db.execute("SELECT status, count(*) FROM pages GROUP BY status").fetchall())
        last = db.execute("SELECT max(id) FROM runs").fetchone()[0] or 0
        out["not_in_last_run"] = db.execute("SELECT count(*) FROM documents WHERE seen_run IS NOT ? ", (last,)).fetchone()[0]
        for r in db.execute("SELECT id, started, finished, host, pid, executor, status, exit_code, summary, report_html FROM runs "
                            "ORDER BY id DESC LIMIT 5"):
            run = {k: r[k] for k in r.keys() if k != "summary"}
            run["totals"] = _run_totals(r["summary"])
            out["runs"].append(run)
        lock = read_lock(db)
        if lock is not None:
            out["running"] = {**lock.__dict__, "stale": lock_is_stale(lock, spec.lock["stale_after"])}
        out["failures"] = [dict(r) for r in db.execute(
            "SELECT d.path, NULL AS page, d.error AS reason FROM documents d WHERE d.status='failed' UNION ALL "
            "SELECT d.path, p.page, p.error FROM pages p JOIN documents d ON d.id=p.doc WHERE p.status='failed' ORDER BY 1, 2 LIMIT 200")]
    finally:
        db.close()
    return out


def _run_totals(summary: str | None) -> dict:
    import json

    if not summary:
        return {}
    s = json.loads(summary)
    return {"pages": s.get("pages", {}).get("attempted", 0), "tokens": s.get("pages", {}).get("tokens", 0), "seconds": s.get("seconds", 0)}
