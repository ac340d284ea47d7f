"""SQLite plumbing for a job's state, knowing nothing of its schema (state.py does):

- `connect` opens an existing file read-write and never creates one by accident (a typo in
  `state =`, a deleted file or a folder would otherwise silently start a new job);
- `create` makes a new state atomically: built under a temp name, then linked into place, so
  two runs starting at once agree on one file and a kill never leaves a half-made one;
- `translate` turns SQLite's errors into ours: busy -> exit 75 (try again later), read-only or
  full disk -> exit 73, anything else (a damaged file) -> exit 2 with what to do;
- file names go in as text when they are UTF-8 and as BLOBs of their bytes when not (`db_name`),
  and come back as the same `str` (os.fsdecode) through `row_factory`.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Callable

from ..errors import ExitCode, JobError, PantheonError, WriteError, path_text

APPLICATION_ID = 0x504F4352  # "POCR" in the file header (PRAGMA application_id): this is a job state
BUSY_TIMEOUT_MS = 30000
NAME_COLUMNS = frozenset({"path", "rel", "output", "report_json", "report_html"})  # columns holding file names


class StateDamaged(JobError):
    """The state file is unreadable, inconsistent, empty or not ours."""


class StateBusy(JobError):
    """Another process holds the state (a run starting or running): try again later."""

    exit_code = ExitCode.JOB_LOCKED


def advice(job: object | None) -> str:
    how = f"pantheon-ocr archive run {path_text(job)} --rebuild-state" if job else "archive run JOB.toml --rebuild-state"
    return f"restore it from a backup, or rebuild it from the outputs ({how})"


def translate(path: Path, exc: sqlite3.Error, job: object | None = None, doing: str = "") -> PantheonError:
    """One of our errors for an SQLite error on the state file `path`."""
    text = str(exc)
    low = text.lower()
    where = path_text(path)
    if "locked" in low or "busy" in low:
        return StateBusy(f"{where}: the job state is busy (another run is starting or running: {text}); try again later")
    if "readonly" in low or "read-only" in low or "full" in low or "unable to open" in low or "disk i/o" in low:
        return WriteError(f"{where}: cannot {doing or 'write'} the job state: {text}")
    return StateDamaged(f"{where}: the job state is damaged ({text}); {advice(job)}")


def db_name(name: str) -> str | bytes:
    """A file name as an SQLite value: text when it is valid UTF-8, else its bytes (a BLOB), so
    a name that is not UTF-8 round-trips exactly instead of failing to encode."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name)


def row_factory(cursor: sqlite3.Cursor, values: tuple) -> sqlite3.Row:
    names = [d[0] for d in cursor.description]
    if any(isinstance(v, bytes) for v in values):
        values = tuple(os.fsdecode(v) if isinstance(v, bytes) and n in NAME_COLUMNS else v for n, v in zip(names, values))
    return sqlite3.Row(cursor, values)


def _uri(path: Path, mode: str) -> str:
    return Path(os.path.abspath(path)).as_uri() + f"?mode={mode}"


def connect(path: Path, mode: str = "rw") -> sqlite3.Connection:
    """An existing state file, never a new one (sqlite3.OperationalError if it is not there)."""
    # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so no statement
    # silently starts one and holds the write lock.
    db = sqlite3.connect(_uri(path, mode), uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                         check_same_thread=True)
    try:
        db.row_factory = row_factory
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


def create(path: Path, init: Callable[[sqlite3.Connection], None]) -> None:
    """Make a new state at `path` unless one appears there first: `init` fills a temp file,
    which is then hard-linked into place (atomic, and never replaces a state another run made
    meanwhile). Raises sqlite3.Error or OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}")
    _remove(tmp)
    try:
        db = sqlite3.connect(_uri(tmp, "rwc"), uri=True, isolation_level=None)
        try:
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            init(db)
            db.execute("PRAGMA journal_mode=WAL")  # persistent: every later connection is in WAL
        finally:
            db.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another run created it first: use theirs
        except OSError:  # no hard links on this file system
            if not path.exists():
                os.replace(tmp, path)
    finally:
        _remove(tmp)


def remove_stale_temps(path: Path) -> None:
    """The `.<state>.new-<pid>` files (and their -journal, -wal, -shm) a run killed while it made
    the state left beside it: those of processes no longer alive on this machine."""
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    prefix = f".{path.name}.new-"
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


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


def _remove(tmp: Path) -> None:
    for p in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm"), tmp.with_name(tmp.name + "-journal")):
        try:
            os.unlink(p)
        except OSError:
            pass


class Txn:
    """`with Txn(db):` = BEGIN IMMEDIATE ... COMMIT, ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error says more
