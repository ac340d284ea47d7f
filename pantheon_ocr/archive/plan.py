"""Planning an archive run (a mixin of jobs._JobRun): which documents are new, changed or
unchanged, their pages rows, and the repairs after a stop (temp files of a killed write).

size+mtime unchanged means unchanged; otherwise the sha256 decides (a touched file with the same
bytes is not redone). size/mtime are stored only together with the hash they vouch for.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import threading
import time
from pathlib import Path

from ..errors import InputError
from .state import Txn
from ..pipeline.outputs import OutputPaths, plan_output_paths
from ..pipeline.types import FORMATS
from ..pipeline.inputs import Document, expand_inputs, parse_pages
from ..pipeline.render import count_pages

_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # outputs.atomic_write_bytes' temp files


class PlanMixin:
    """Uses the run's spec, options, db, run_id, retry_failed, pages_spec and fills its docs,
    events, notes (and failures through _fail); see jobs._JobRun."""

    def _inputs(self) -> list[Document]:
        """Each input on its own: an empty folder or glob is a quiet night, not an error; a
        missing path is a failure of this run, and the other inputs still go ahead."""
        docs, seen = [], set()
        for item in self.spec.inputs:
            try:
                found = expand_inputs([item])
            except InputError as e:
                if Path(item).is_dir() or glob.has_magic(item):
                    self.notes.append(f"{item}: {e.problem}")
                else:
                    self._fail(e.path, None, e.problem)
                continue
            for doc in found:
                if doc.path not in seen:
                    seen.add(doc.path)
                    docs.append(doc)
        return docs

    def _plan(self) -> None:
        db, spec = self.db, self.spec
        docs = self._inputs()
        rows = {r["path"]: r for r in db.execute("SELECT * FROM documents")}
        taken = {r["output"].casefold() for r in rows.values() if r["output"]}
        planned = plan_output_paths(docs, spec.output)
        to_count: list[tuple[Document, int, tuple, bool]] = []
        seen: list[tuple] = []  # written in one transaction: one per document would be slow at 100k
        for doc in docs:
            row = rows.get(str(doc.path))
            try:
                st = os.stat(doc.path)
                quick = row is not None and row["sha256"] and not spec.rehash and (row["size"], row["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
                sha = row["sha256"] if quick else _sha256(doc.path)
            except OSError as e:
                self._fail(str(doc.path), None, f"cannot read file: {e.strerror or e}")
                continue
            if row is None or not Path(row["output"]).is_relative_to(spec.output):
                # Output names are fixed once per document (input order may change between
                # nights); planned again only when the job's output folder changed, after
                # which the outputs are missing there and get written from the state.
                output = str(planned[doc.doc_id].base)
                if output.casefold() in taken:  # a name another (older) document already has
                    output = f"{output}-{doc.doc_id[:8]}"
                taken.add(output.casefold())
                with Txn(db):
                    if row is None:
                        row_id = db.execute(
                            "INSERT INTO documents (path, doc_id, kind, rel, output, status) VALUES (?, ?, ?, ?, ?, 'pending')",
                            (str(doc.path), doc.doc_id, doc.kind, str(doc.rel), output),
                        ).lastrowid
                    else:
                        row_id = row["id"]
                        db.execute("UPDATE documents SET output=? WHERE id=?", (output, row_id))
                row = db.execute("SELECT * FROM documents WHERE id=?", (row_id,)).fetchone()
            self.docs[doc.doc_id] = (row["id"], doc)
            # size/mtime are stored only together with the hash they vouch for: a run killed
            # between the two would otherwise make a changed file look unchanged forever.
            stamp = (sha, st.st_size, st.st_mtime_ns)
            seen.append((self.run_id, *(stamp[1:] if row["sha256"] == sha else (row["size"], row["mtime_ns"])), row["id"]))
            if row["sha256"] != sha:
                self.events["new" if row["sha256"] is None else "changed"] += 1
                to_count.append((doc, row["id"], stamp, row["sha256"] is not None))
            elif row["n_pages"] is None:
                if self.retry_failed:
                    to_count.append((doc, row["id"], stamp, False))
                else:
                    self.events["skipped (unreadable)"] += 1
            else:
                self.events["unchanged"] += 1
                if row["pages_spec"] != self.pages_spec:
                    self._set_pages(row["id"], stamp, row["n_pages"], keep_done=True)
                if self.retry_failed:
                    with Txn(db):
                        db.execute("UPDATE pages SET status='pending', attempts=0 WHERE doc=? AND status='failed'", (row["id"],))
                        db.execute("UPDATE documents SET status='pending' WHERE id=? AND status IN ('failed', 'partial')", (row["id"],))
        with Txn(db):
            db.executemany("UPDATE documents SET seen_run=?, size=?, mtime_ns=? WHERE id=?", seen)
        self._count(to_count)
        with Txn(db):  # pages left pending with no attempt left (retry.attempts was lowered)
            db.execute("UPDATE pages SET status='failed', error=coalesce(error, 'no attempts left') WHERE status='pending' AND attempts>=?",
                       (spec.attempts,))
        self._clean_temp_files()
        for row_id, _ in list(self.docs.values()):
            self._assemble(row_id, only_if_needed=True)

    def _count(self, items: list[tuple[Document, int, tuple, bool]]) -> None:
        """Open new/changed documents in crash-proof workers (PDFium runs there)."""
        if not items:
            return
        from ..pipeline.render_pool import RenderPool

        pool = RenderPool(workers=self.options.render_workers, timeout=self.options.render_timeout)
        try:
            for outcome in pool.imap(count_pages, [(d, self.options.password) for d, *_ in items], threading.Event()):
                doc, row_id, stamp, changed = items[outcome.index]
                if outcome.error is None:
                    self._set_pages(row_id, stamp, outcome.value, keep_done=False, bump=changed)
                    continue
                reason = getattr(outcome.error, "problem", str(outcome.error))
                with Txn(self.db):
                    self.db.execute("DELETE FROM pages WHERE doc=?", (row_id,))
                    self.db.execute("UPDATE documents SET sha256=?, size=?, mtime_ns=?, n_pages=NULL, pages_spec=NULL, status='failed', "
                                    "error=?, version=version+?, updated_at=? WHERE id=?", (*stamp, reason, int(changed), time.time(), row_id))
                self._fail(str(doc.path), None, reason)
        finally:
            pool.close()

    def _set_pages(self, row_id: int, stamp: tuple, n_pages: int, keep_done: bool, bump: bool = False) -> None:
        """(Re)make the pages rows for the job's page selection; keep_done keeps the texts of
        pages still selected (the selection changed, the content did not)."""
        selected = [i + 1 for i in parse_pages(self.spec.ocr["pages"], n_pages, clip=True)]
        with Txn(self.db) as db:
            if keep_done:
                db.execute(f"DELETE FROM pages WHERE doc=? AND page NOT IN ({','.join('?' * len(selected)) or 'NULL'})", (row_id, *selected))
            else:
                db.execute("DELETE FROM pages WHERE doc=?", (row_id,))
            db.executemany("INSERT OR IGNORE INTO pages (doc, page, status) VALUES (?, ?, 'pending')", [(row_id, p) for p in selected])
            db.execute("UPDATE documents SET sha256=?, size=?, mtime_ns=?, n_pages=?, pages_spec=?, status=?, error=NULL, "
                       "version=version+?, updated_at=? WHERE id=?",
                       (*stamp, n_pages, self.pages_spec, "pending" if selected else "empty", int(bump), time.time(), row_id))

    def _clean_temp_files(self) -> None:
        """Remove temp files a killed write left next to our outputs (only ours: the temp name
        embeds the target's name, and the targets are this job's output files)."""
        targets: list[Path] = []
        for row_id, _ in self.docs.values():
            row = self.db.execute("SELECT output, n_pages FROM documents WHERE id=?", (row_id,)).fetchone()
            paths = OutputPaths(Path(row["output"]))
            targets += paths.documents(FORMATS)
            targets += [paths.page_file(p) for p in range(1, (row["n_pages"] or 0) + 1)]
        targets += [self.spec.reports / n for n in ("latest.json", "latest.html")]
        by_dir: dict[Path, set[str]] = {}
        for t in targets:
            by_dir.setdefault(t.parent, set()).add(t.name)
        for folder, names in by_dir.items():
            try:
                entries = os.listdir(folder)
            except OSError:
                continue
            for entry in entries:
                m = _TMP_NAME.match(entry)
                if m and (m.group("name") in names or folder == self.spec.reports):
                    try:
                        os.unlink(folder / entry)
                        self.notes.append(f"removed {folder / entry} (left by a stopped write)")
                    except OSError:
                        pass



def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
