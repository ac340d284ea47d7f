"""Planning an archive run: which documents are new, changed or unchanged, their pages rows, and
the repairs after a stop (temp files of a killed write).

size+mtime unchanged means unchanged; otherwise the sha256 decides (a touched file with the same
bytes is not redone). size/mtime are stored only together with the hash they vouch for.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from ..errors import InputError, path_record, path_text, with_setting
from ..pipeline.inputs import Document, NothingFound, expand_inputs, parse_pages, past_end_note
from ..pipeline.files import OutputTree, sha256_of
from ..pipeline.claims import foreign_note, foreign_output
from ..pipeline.naming import OutputPaths, plan_output_paths
from ..pipeline.outputs import TEMP_NAME, temp_tag
from ..pipeline.render import open_pages
from ..pipeline.types import FORMATS, PipelineOptions
from .owner import own_name, remove_own_outputs
from .report import RunLog
from .spec import JobSpec, key_of
from .state import JobState
from .wording import NO_SELECTED_PAGE, OPENED_AGAIN, UNREADABLE

_OLD_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # temp files of versions before outputs.TEMP_NAME


class Planner:
    """Plans one run of `spec` against its `state`: `plan()` returns {doc_id: (row id, Document)}
    for this run's documents, with their pages rows ready; what it saw goes to `log`."""

    def __init__(self, spec: JobSpec, state: JobState, run_id: int, options: PipelineOptions, retry_failed: bool,
                 log: RunLog, reread: bool = False):
        self.spec, self.state, self.run_id, self.options = spec, state, run_id, options
        # --reread: every document read again (failed ones included); --retry-failed: the failed ones
        self.retry_failed, self.reread, self.log = retry_failed or reread, reread, log
        self.pages_spec = spec.ocr.pages or "all"
        self.docs: dict[str, tuple[int, Document]] = {}

    def plan(self) -> dict[str, tuple[int, Document]]:
        spec, state = self.spec, self.state
        docs = self._inputs()
        rows = state.documents_by_path()
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
                self.log.fail(str(doc.path), None, f"cannot read file: {e.strerror or e}")
                self.log.document(UNREADABLE, doc.path)
                continue
            if row is None or not Path(row["output"]).is_relative_to(spec.output):
                # Output names are fixed once per document (input order may change between
                # nights); planned again only when the job's output folder changed, after
                # which the outputs are missing there and get written from the state.
                # Not a name another document of the job has, nor one whose outputs record
                # another source (another job or `transcribe` sharing the output folder).
                output = str(own_name(planned[doc.doc_id], path_record(doc.path), doc.doc_id, taken))
                mine = foreign_output(planned[doc.doc_id], FORMATS) if output != str(planned[doc.doc_id].base) else None
                if mine is not None:
                    self.log.notes.append(foreign_note(mine, f"{path_text(doc.path)} written as {path_text(output)}.*"))
                row = state.place_document(row, doc, output)
            self.docs[doc.doc_id] = (row["id"], doc)
            # size/mtime are stored only together with the hash they vouch for: a run killed
            # between the two would otherwise make a changed file look unchanged forever.
            stamp = (sha, st.st_size, st.st_mtime_ns)
            seen.append((self.run_id, *(stamp[1:] if row["sha256"] == sha else (row["size"], row["mtime_ns"])), row["id"]))
            if row["sha256"] != sha:
                self.log.document("changed" if row["sha256"] is not None else "new" if row["error"] is None else
                                  OPENED_AGAIN, doc.path)
                to_count.append((doc, row["id"], stamp, row["sha256"] is not None))
            elif row["n_pages"] is None:
                if self.retry_failed:
                    to_count.append((doc, row["id"], stamp, False))
                else:
                    self.log.document("skipped (unreadable)", doc.path)
            else:
                self.log.document("unchanged", doc.path)
                # "empty": what versions before NO_SELECTED_PAGE made of such a document, silently;
                # --retry-failed re-decides a document failed for its selection (said again)
                new_pages = row["pages_spec"] != self.pages_spec or row["status"] == "empty" or (
                    self.retry_failed and not self._selected(row["n_pages"]))
                if new_pages:
                    self._set_pages(row["id"], stamp, row["n_pages"], keep_done=True)
                if self.reread:
                    state.reread(row["id"])
                elif self.retry_failed and not new_pages:
                    state.retry_failed(row["id"])
        state.mark_seen(seen)
        self._count(to_count)
        state.fail_exhausted(spec.attempts)
        self._clean_temp_files()
        return self.docs

    def _inputs(self) -> list[Document]:
        """An empty folder or glob is a quiet night, not an error; a missing path, a FIFO, a
        link loop, ... is a failure of this run (named once), and the other inputs go ahead."""
        problems: list[InputError] = []
        docs = expand_inputs(list(self.spec.inputs), problems, follow_links=False)
        for e in problems:
            if isinstance(e, NothingFound):
                self.log.notes.append(f"{path_text(e.path)}: {e.problem}")
            else:
                self.log.fail(e.path, None, e.problem, input_path=True)
        return docs

    def _count(self, items: list[tuple[Document, int, tuple, bool]]) -> None:
        """Open new/changed documents in crash-proof workers (PDFium runs there)."""
        if not items:
            return
        from ..pipeline.render_pool import RenderPool

        pool = RenderPool(workers=self.options.render_workers, timeout=self.options.render_timeout)
        try:
            for outcome in pool.imap(open_pages, [(d, self.options.password) for d, *_ in items], threading.Event()):
                doc, row_id, stamp, changed = items[outcome.index]
                if outcome.error is None:
                    self._set_pages(row_id, stamp, outcome.value.n, keep_done=False, bump=changed)
                    if outcome.value.note:
                        self.log.notes.append(f"{path_text(doc.path)}: {outcome.value.note}")
                    continue
                reason = outcome.error.problem  # InputError and WorkerError both say it there
                passing = isinstance(outcome.error, InputError) and not outcome.error.lasting
                if isinstance(outcome.error, InputError):  # "(ocr.password in the job file)", say
                    reason = with_setting(reason, outcome.error.option, lambda o: f"{key_of(o)} in the job file")
                if passing:
                    # a read the system failed (EIO on a network disk), not the file's own fault:
                    # stored without the hash, so that the next run opens it again rather than
                    # skipping it as unreadable and unchanged until someone passes --retry-failed
                    reason += " (a failed read, not the file's fault: tried again next run)"
                    stamp = (None, None, None)
                self.state.set_unreadable(row_id, stamp, reason, bump=changed)
                self.log.fail(str(doc.path), None, reason)
                self.log.document(UNREADABLE, doc.path)
        finally:
            pool.close()

    def _selected(self, n_pages: int) -> list[int]:
        return [i + 1 for i in parse_pages(self.spec.ocr.pages, n_pages, clip=True)]

    def _set_pages(self, row_id: int, stamp: tuple, n_pages: int, keep_done: bool, bump: bool = False) -> None:
        """(Re)make the pages rows for the job's page selection; keep_done keeps the texts of
        pages still selected (the selection changed, the content did not).

        A selection that leaves no page of the document fails it, as `transcribe` fails it, and
        its outputs of an earlier selection go: the outputs follow the job's selection (a
        narrower one rewrites them with fewer pages), and this one has no page at all."""
        selected = self._selected(n_pages)
        # outputs of an earlier selection exist only where the job read pages of it before; on a
        # first night, outputs recording this file are someone else's (a `transcribe` run): kept
        had_pages = bool(self.state.pages(row_id))
        error = None if selected else (f"none of the selected pages ({self.spec.ocr.pages}) exists: "
                                       f"the document has {n_pages} page{'s' if n_pages != 1 else ''}")
        self.state.set_pages(row_id, stamp, n_pages, self.pages_spec, selected, keep_done=keep_done, bump=bump, error=error)
        if error is None:
            past = past_end_note(self.spec.ocr.pages, n_pages)  # said once: when the document or selection is new
            if past:
                self.log.notes.append(f"{path_text(self.state.document(row_id)['path'])}: {past}")
            return
        row = self.state.document(row_id)
        self.log.fail(row["path"], None, error)
        self.log.document(NO_SELECTED_PAGE, row["path"])
        if not had_pages:
            return
        try:
            removed = remove_own_outputs(OutputPaths(Path(row["output"]), root=self.spec.output), path_record(row["path"]))
        except OSError as e:  # a planted link, a folder that cannot be listed: said, and left
            self.log.notes.append(f"{path_text(row['path'])}: cannot remove its outputs of an earlier page selection: "
                                  f"{e.strerror or e}")
            return
        if removed:
            self.log.notes.append(f"{path_text(row['path'])}: removed its outputs of an earlier page selection "
                                  f"({', '.join(path_text(p) for p in removed)}): no page is selected now")

    def _clean_temp_files(self) -> None:
        """Remove temp files a killed write left next to our outputs (only ours: the temp name
        embeds the target's name, and the targets are this job's output files)."""
        targets: list[Path] = []
        for row_id, _ in self.docs.values():
            row = self.state.document(row_id)
            paths = OutputPaths(Path(row["output"]))
            targets += paths.documents(FORMATS)
            targets += [paths.page_file(p) for p in range(1, (row["n_pages"] or 0) + 1)]
        targets += [self.spec.reports / n for n in ("latest.json", "latest.html")]
        by_dir: dict[Path, set[str]] = {}
        for t in targets:
            by_dir.setdefault(t.parent, set()).update((t.name, temp_tag(t.name)))
        # never through a planted link: our output folders are opened from the output root
        with OutputTree(self.spec.output) as tree, OutputTree(None) as elsewhere:
            for folder, names in by_dir.items():
                try:
                    opened = (tree if folder.is_relative_to(self.spec.output) else elsewhere).folder(folder, create=False)
                except OSError:
                    continue
                for entry in opened.names() if opened is not None else ():
                    m = TEMP_NAME.match(entry)
                    old = _OLD_TMP_NAME.match(entry)
                    if ((m and m.group("hash") in names) or (old and old.group("name") in names) or
                            ((m or old) and folder == self.spec.reports)) and opened.unlink(entry):
                        self.log.notes.append(f"removed {path_text(folder / entry)} (left by a stopped write)")


def _sha256(path: Path) -> str:
    return sha256_of(path)[0]  # never blocks: a FIFO put in place of a document is an error
