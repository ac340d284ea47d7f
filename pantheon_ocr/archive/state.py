"""An archive job's state: one SQLite file (WAL) with documents, pages, attempts, runs and
the run lock. This is the only module that knows the schema: every SQL statement of the
archive is a method of `JobState` (those of the `meta` table in meta.py, of the runs and the
lock in runs.py).

Why SQLite: every page result is committed in its own transaction, so a `kill -9` at any
moment loses at most the pages still in flight, and a page is recorded at most once (the
update is conditional on the page still being pending with the attempt count we expect).
WAL lets `archive status` read while a run writes; synchronous=NORMAL is durable against a
killed process (only an OS crash can lose the last commits, which are then simply redone).

The lock is a row (pid, host, heartbeat) rather than a lock file: it lives and dies with the
state it protects and is taken inside a write transaction (two starting runs cannot both win);
lock.py decides when a lock is stale and keeps the heartbeat fresh.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JobError, WriteError, path_text
from ..pipeline.files import open_regular, special_kind
from ..pipeline.types import STAGES
from .meta import MetaMixin
from .runs import RunsMixin
from .sqlite import (APPLICATION_ID, StateDamaged, Txn, advice, connect, create, db_name, remove_stale_temps,
                     translate)

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,       -- absolute path of the input
    doc_id TEXT NOT NULL,            -- pipeline.inputs.Document.doc_id
    kind TEXT NOT NULL,
    rel TEXT NOT NULL,               -- path under its input folder; outputs mirror it
    output TEXT,                     -- output base (formats append .md, .jsonl, ...)
    sha256 TEXT, size INTEGER, mtime_ns INTEGER,
    n_pages INTEGER,                 -- pages in the file; NULL when it could not be opened
    pages_spec TEXT,                 -- the job's page selection the pages rows were made for
    status TEXT NOT NULL,            -- pending | done | partial | failed (| empty: older versions)
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
_TABLES = frozenset({"meta", "documents", "pages", "attempts", "runs", "lock"})

STAGE_COLUMNS = {s: f"{s}_s" for s in STAGES}  # pipeline stage -> its seconds column
_SECONDS = ", ".join(STAGE_COLUMNS.values())


@dataclass
class Salvage:
    """What a rebuilt state keeps of the old one (rebuild.py), read as far as it still can be:
    the highest run number, so that numbering goes on and no report of an old run is written
    over; and the inputs it had found unreadable, so that a known-bad file stays known (skipped
    while its sha256 is the same, as a normal night skips it) instead of failing the run anew."""

    last_run: int = 0
    unreadable: list[tuple] = field(default_factory=list)  # (path, doc_id, kind, rel, output, sha256, error)


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def _check_sqlite(path: Path, job: object | None) -> None:
    """A file in the state's place that is no SQLite database at all (`state =` naming the job
    file itself, an input, a typo) is refused and never modified: called damaged, it was set
    aside by --rebuild-state as the error advised, a new database put in its place (the job
    file gone, or an input replaced by a database)."""
    if job is not None and os.path.exists(job) and os.path.samefile(path, job):
        raise JobError(f"{path_text(path)}: `state =` names the job file itself; point it at another file "
                       "(the job's state is a database of its own)")
    try:
        with open_regular(path) as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:  # permission, EIO: the system's, as SQLite's own are (sqlite.translate)
        raise WriteError(f"{path_text(path)}: cannot read the job state: {e.strerror or e}") from None
    if not head.strip(b"\x00") or SQLITE_HEADER.startswith(head.rstrip(b"\x00")[:6]):
        return  # ours, or zeroed or half a header: a damaged state, which SQLite's open says as such
    raise JobError(f"{path_text(path)}: not a job state: not an SQLite database ({_said_head(head)}); it was "
                   "left untouched: point `state =` in the job file at another file (a job state whose first "
                   "bytes were damaged: move it aside, and --rebuild-state makes a new one)")


def _said_head(head: bytes) -> str:
    shown = head.splitlines()[0][:12].decode("ascii", "replace") if head.strip() else ""
    return f"it begins {shown!r}" if shown.isprintable() and shown.strip() else "its first bytes are another format's"


class JobState(MetaMixin, RunsMixin):
    """One connection to a job's state. Rows come back as sqlite3.Row (by column name); what the
    state knows of the job as a whole (the last reading, marks) is meta.py's."""

    def __init__(self, db: sqlite3.Connection, path: Path | None = None):
        self.db, self.path = db, path

    @classmethod
    def open(cls, path: Path, job: object | None = None, create_new: bool = True) -> JobState | None:
        """Open the state file, after checking it (see `check`); a new one is made only where
        no file exists at all (create_new=False: None then). `job` (the job file) goes into
        the advice of an error. Raises StateDamaged (exit 2), StateBusy (75), WriteError (73).

        The job file names the state, so it may be anywhere, through linked folders too; but the
        file itself (or its -wal, -shm, -journal) being a symbolic link is refused (JobError):
        SQLite would write through it, into whatever it points at."""
        path = Path(path)
        for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
            if p.is_symlink():
                raise JobError(f"{path_text(p)} is a symbolic link (to {path_text(os.readlink(p))}): refusing to open the "
                               "job state through it; name the file itself in `state =` of the job file")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise JobError(f"{path_text(path)}: cannot read the job state: {e.strerror or e}") from None
        if st is not None and special_kind(st.st_mode) is not None:
            raise JobError(f"{path_text(path)}: {special_kind(st.st_mode)}, not a job state file; "
                           "point `state =` in the job file at a file")
        if st is not None and st.st_size == 0:
            raise StateDamaged(f"{path_text(path)}: the job state is empty (0 bytes); {advice(job)}")
        if st is not None and create_new:  # a run: said before SQLite opens it, which would leave
            # -wal and -shm beside it as read-only as the file, failing the run after it is fixed
            for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
                if os.path.exists(p) and not os.access(p, os.W_OK):
                    raise WriteError(f"{path_text(p)}: the job state cannot be written (permission denied or a "
                                     "read-only file system): a run records every page in it; make it writable")
        if st is not None:
            _check_sqlite(path, job)
        if create_new:
            remove_stale_temps(path)
        try:
            if st is None:
                if not create_new:
                    return None
                create(path, _init_schema)
            state = cls(connect(path), path)
        except sqlite3.Error as e:
            raise translate(path, e, job, "create" if st is None else "open") from None
        except OSError as e:
            raise WriteError(f"{path_text(path)}: cannot create the job state: {e.strerror or e}") from None
        try:
            state.check(job, upgrade=create_new)
        except BaseException:
            state.close()
            raise
        return state

    def check(self, job: object | None = None, upgrade: bool = True) -> None:
        """The self-check before a run: it is our file (application id; an older state without
        one gets it), its schema version, SQLite's quick_check, every document row readable,
        and no document marked done whose pages are gone."""
        db, where = self.db, path_text(self.path)
        try:
            app = db.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if app != APPLICATION_ID and not (app == 0 and _TABLES <= tables):
                shown = ", ".join(sorted(tables)[:8]) or "none"
                raise JobError(f"{where}: not a pantheon-ocr job state but another SQLite database (tables: {shown}); "
                               "it was left untouched: point `state =` in the job file at another file")
            if _TABLES - tables:
                raise StateDamaged(f"{where}: the job state is damaged (tables missing: "
                                   f"{', '.join(sorted(_TABLES - tables))}); {advice(job)}")
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None or row[0] != str(SCHEMA_VERSION):
                raise JobError(f"{where}: job state schema version {row[0] if row else 'missing'}; this pantheon-ocr "
                               f"reads version {SCHEMA_VERSION}")
            problems = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                raise StateDamaged(f"{where}: the job state is damaged (SQLite: {'; '.join(problems)}); {advice(job)}")
            db.execute("SELECT * FROM documents").fetchall()  # undecodable text fails here, not mid-run
            orphans = db.execute("SELECT count(*) FROM documents d WHERE status IN ('done', 'partial') "
                                 "AND NOT EXISTS (SELECT 1 FROM pages p WHERE p.doc = d.id)").fetchone()[0]
            if orphans:
                raise StateDamaged(f"{where}: the job state is damaged ({orphans} document(s) marked done have no "
                                   f"page rows left); {advice(job)}")
            if app == 0 and upgrade:  # made by a version that did not stamp the header
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        except sqlite3.Error as e:
            raise translate(self.path, e, job, "read") from None

    def close(self) -> None:
        self.db.close()

    # ----------------------------------------------------------------------- rebuilding

    def salvage(self) -> Salvage:
        """What this (possibly damaged) state can still tell a rebuilt one; each part on its own,
        since damage may spare the runs but not the documents. Never raises for damage."""
        found = Salvage()
        for sql in ("SELECT max(id) FROM runs",  # and where a rebuilt state that never ran was to start
                    "SELECT CAST(value AS INTEGER) FROM meta WHERE key='runs_after'"):
            try:
                last = (self.db.execute(sql).fetchone() or (None,))[0]
            except (sqlite3.Error, ValueError):
                continue
            if isinstance(last, int) and last > found.last_run:
                found.last_run = last
        try:
            rows = self.db.execute("SELECT path, doc_id, kind, rel, output, sha256, error FROM documents "
                                   "WHERE status='failed' AND n_pages IS NULL").fetchall()
            # a damaged file may hand back anything: only rows that look whole; the sha256 is
            # checked against the file by the plan before the verdict is believed
            found.unreadable = [tuple(r) for r in rows if all(isinstance(v, str) for v in tuple(r)[:6])
                                and len(r["sha256"]) == 64]
        except (sqlite3.Error, ValueError):
            pass
        return found

    @classmethod
    def salvage_file(cls, path: Path) -> Salvage:
        """`salvage` of a state file that does not pass `check`, opened read-only (nothing in it
        is changed; SQLite may add -wal/-shm beside it). Nothing salvaged if it cannot be opened."""
        try:
            db = connect(path, "ro")
        except sqlite3.Error:
            return Salvage()
        try:
            return cls(db, path).salvage()
        finally:
            db.close()

    def adopt(self, salvage: Salvage, runs_after: int) -> None:
        """In a new state: number runs after `runs_after` (kept in meta, so the runs table holds
        real runs only), and know the salvaged unreadable inputs."""
        with Txn(self.db) as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('runs_after', ?)", (str(runs_after),))
            db.executemany("INSERT OR IGNORE INTO documents (path, doc_id, kind, rel, output, sha256, error, status, updated_at) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, 'failed', ?)",
                           [(db_name(path), doc_id, kind, db_name(rel), db_name(output), sha, error, time.time())
                            for path, doc_id, kind, rel, output, sha, error in salvage.unreadable])

    def reread(self, row_id: int) -> None:
        """Every page of the document pending again, with all its attempts (`--reread`)."""
        with Txn(self.db) as db:
            db.execute("UPDATE pages SET status='pending', attempts=0 WHERE doc=? AND status!='pending'", (row_id,))
            db.execute("UPDATE documents SET status='pending' WHERE id=?", (row_id,))

    # ------------------------------------------------------------------------- documents

    def documents_by_path(self) -> dict[str, sqlite3.Row]:
        return {r["path"]: r for r in self.db.execute("SELECT * FROM documents")}

    def document(self, row_id: int) -> sqlite3.Row:
        return self.db.execute("SELECT * FROM documents WHERE id=?", (row_id,)).fetchone()

    def place_document(self, row: sqlite3.Row | None, doc, output: str) -> sqlite3.Row:
        """A new document row (pending) with its output base, or a known one's output moved."""
        with Txn(self.db) as db:
            if row is None:
                row_id = db.execute("INSERT INTO documents (path, doc_id, kind, rel, output, status) VALUES (?, ?, ?, ?, ?, 'pending')",
                                    (db_name(str(doc.path)), doc.doc_id, doc.kind, db_name(str(doc.rel)), db_name(output))).lastrowid
            else:
                row_id = row["id"]
                db.execute("UPDATE documents SET output=? WHERE id=?", (db_name(output), row_id))
        return self.document(row_id)

    def set_output(self, row_id: int, output: str) -> None:
        with Txn(self.db) as db:
            db.execute("UPDATE documents SET output=? WHERE id=?", (db_name(output), row_id))

    def recover_page(self, run: int, row_id: int, page: int, text: str, n_tokens: int, finish_reason: str | None) -> bool:
        """A pending page whose text was read back from intact outputs (--rebuild-state): done,
        as attempt 1 of this run, without OCR. False if the page was not pending."""
        now = time.time()
        with Txn(self.db) as db:
            if db.execute("UPDATE pages SET status='done', attempts=1, text=?, n_tokens=?, finish_reason=?, run=?, finished_at=? "
                          "WHERE doc=? AND page=? AND status='pending'",
                          (text, n_tokens, finish_reason, run, now, row_id, page)).rowcount == 0:
                return False
            version = db.execute("SELECT version FROM documents WHERE id=?", (row_id,)).fetchone()[0]
            db.execute("INSERT INTO attempts (run, doc, version, page, attempt, outcome, n_tokens, finish_reason, error, "
                       "finished_at) VALUES (?, ?, ?, ?, 1, 'done', ?, ?, 'recovered from the outputs', ?)",
                       (run, row_id, version, page, n_tokens, finish_reason, now))
        return True

    def mark_seen(self, seen: list[tuple]) -> None:
        """(run, size, mtime_ns, row id) per document: one transaction, not one per document."""
        with Txn(self.db) as db:
            db.executemany("UPDATE documents SET seen_run=?, size=?, mtime_ns=? WHERE id=?", seen)

    def set_pages(self, row_id: int, stamp: tuple, n_pages: int, pages_spec: str, selected: list[int],
                  keep_done: bool, bump: bool, error: str | None = None) -> None:
        """(Re)make a document's pages rows for `selected` (1-based); keep_done keeps the rows of
        pages still selected. stamp = (sha256, size, mtime_ns); bump: the content changed. No
        page selected: the document is failed, with `error`."""
        with Txn(self.db) as db:
            if keep_done and selected:  # (`NOT IN (NULL)` would keep every row)
                db.execute(f"DELETE FROM pages WHERE doc=? AND page NOT IN ({','.join('?' * len(selected)) or 'NULL'})",
                           (row_id, *selected))
            else:
                db.execute("DELETE FROM pages WHERE doc=?", (row_id,))
            db.executemany("INSERT OR IGNORE INTO pages (doc, page, status) VALUES (?, ?, 'pending')", [(row_id, p) for p in selected])
            db.execute("UPDATE documents SET sha256=?, size=?, mtime_ns=?, n_pages=?, pages_spec=?, status=?, error=?, "
                       "version=version+?, updated_at=? WHERE id=?",
                       (*stamp, n_pages, pages_spec, "pending" if selected else "failed", None if selected else error,
                        int(bump), time.time(), row_id))

    def set_unreadable(self, row_id: int, stamp: tuple, reason: str, bump: bool) -> None:
        with Txn(self.db) as db:
            db.execute("DELETE FROM pages WHERE doc=?", (row_id,))
            db.execute("UPDATE documents SET sha256=?, size=?, mtime_ns=?, n_pages=NULL, pages_spec=NULL, status='failed', "
                       "error=?, version=version+?, updated_at=? WHERE id=?", (*stamp, reason, int(bump), time.time(), row_id))

    def retry_failed(self, row_id: int) -> None:
        with Txn(self.db) as db:
            db.execute("UPDATE pages SET status='pending', attempts=0 WHERE doc=? AND status='failed'", (row_id,))
            db.execute("UPDATE documents SET status='pending' WHERE id=? AND status IN ('failed', 'partial')", (row_id,))

    def fail_exhausted(self, attempts: int) -> None:
        """Pages left pending with no attempt left (retry.attempts was lowered) become failed."""
        with Txn(self.db) as db:
            db.execute("UPDATE pages SET status='failed', error=coalesce(error, 'no attempts left') "
                       "WHERE status='pending' AND attempts>=?", (attempts,))

    def set_document_status(self, row_id: int, status: str, error: str | None) -> None:
        with Txn(self.db) as db:
            db.execute("UPDATE documents SET status=?, error=?, updated_at=? WHERE id=?", (status, error, time.time(), row_id))

    # ----------------------------------------------------------------------------- pages

    def pending_pages(self) -> list[sqlite3.Row]:
        """(doc, page, attempts, n_pages) of every pending page, by document path and page."""
        return self.db.execute("SELECT p.doc, p.page, p.attempts, d.n_pages FROM pages p JOIN documents d ON d.id = p.doc "
                               "WHERE p.status='pending' ORDER BY d.path, p.page").fetchall()

    def pages(self, row_id: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM pages WHERE doc=? ORDER BY page", (row_id,)).fetchall()

    @staticmethod
    def seconds(page: sqlite3.Row) -> dict[str, float]:
        """A page row's seconds per pipeline stage."""
        return {s: page[c] or 0.0 for s, c in STAGE_COLUMNS.items()}

    def record_attempt(self, run: int, row_id: int, page: int, attempt: int, status: str, result, error: str | None,
                       outcome: str, sampling, seconds: list[float], now: float) -> int | None:
        """One page attempt, in one transaction: the page row (only if it is still pending at
        attempt - 1, so nothing is recorded twice) and its attempts row. Returns how many pages of
        the document are still pending, or None if the page had been recorded already."""
        with Txn(self.db) as db:
            n = db.execute(
                f"UPDATE pages SET status=?, attempts=?, text=?, n_tokens=?, finish_reason=?, error=?, "
                f"{', '.join(f'{c}=?' for c in STAGE_COLUMNS.values())}, temperature=?, seed=?, run=?, finished_at=? "
                "WHERE doc=? AND page=? AND status='pending' AND attempts=?",
                (status, attempt, result.text, result.n_tokens, result.finish_reason, error, *seconds, sampling.temperature,
                 sampling.seed, run, now, row_id, page, attempt - 1),
            ).rowcount
            if n == 0:
                return None
            version = db.execute("SELECT version FROM documents WHERE id=?", (row_id,)).fetchone()[0]
            db.execute(f"INSERT INTO attempts (run, doc, version, page, attempt, outcome, temperature, seed, n_tokens, "
                       f"finish_reason, error, {_SECONDS}, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (run, row_id, version, page, attempt, outcome, sampling.temperature, sampling.seed, result.n_tokens,
                        result.finish_reason, result.error, *seconds, now))
            return db.execute("SELECT count(*) FROM pages WHERE doc=? AND status='pending'", (row_id,)).fetchone()[0]

    # ---------------------------------------------------------------------------- counts

    def counts(self) -> dict[str, dict[str, int]]:
        """Documents and pages by status."""
        return {"documents": dict(self.db.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall()),
                "pages": dict(self.db.execute("SELECT status, count(*) FROM pages GROUP BY status").fetchall())}

    def any_page_done(self) -> bool:
        return self.db.execute("SELECT 1 FROM pages WHERE status='done' LIMIT 1").fetchone() is not None

    def not_in_last_run(self) -> int:
        last = self.db.execute("SELECT max(id) FROM runs").fetchone()[0] or 0
        return self.db.execute("SELECT count(*) FROM documents WHERE seen_run IS NOT ? ", (last,)).fetchone()[0]

    def final_failures(self, limit: int = 200) -> list[dict]:
        """Failed documents (page None) and failed pages: path, page, reason."""
        return [dict(r) for r in self.db.execute(
            "SELECT d.path, NULL AS page, d.error AS reason FROM documents d WHERE d.status='failed' UNION ALL "
            "SELECT d.path, p.page, p.error FROM pages p JOIN documents d ON d.id=p.doc WHERE p.status='failed' "
            "ORDER BY 1, 2 LIMIT ?", (limit,))]


def _init_schema(db: sqlite3.Connection) -> None:
    db.executescript(_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    # a new state knows nothing yet of the outputs already on disk (a state lost or deleted, a
    # rebuild, outputs transcribe made): its first run takes their pages back before any OCR
    db.execute("INSERT INTO meta VALUES ('recover_outputs', '1')")
