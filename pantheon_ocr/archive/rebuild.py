"""`archive run --rebuild-state`: a new job state re-derived from the outputs, for a state file
that is damaged (or lost).

The old file is never deleted: it is renamed (with its -wal/-shm) to `<state>.damaged-<time>`
when SQLite or our checks could not read it, and to `<state>.old-<time>` when it was whole (a
rebuild asked for anyway: after outputs were restored from a backup, say).
A foreign SQLite database, or a state whose lock a live run holds, is refused. What the old file
can still tell is kept (state.Salvage): run numbers go on after its last run and after every
run-N report in the reports folder (which stand when the file is unreadable), so no report of
an earlier run is written over; and an input it knew to be unreadable stays known while its
bytes are the same, so the rebuild run's exit code is a normal night's. The new state is
planned like a first night, and then, as in every new state's first run (state.must_recover:
until it is done, so a kill half-way leaves it to the next run), every page whose text the
existing outputs still hold is recorded as done without OCR, if the output records this very input (its path and sha256, see
pipeline/naming.py), as pipeline/readback.py reads them back. Pages it does not give back (failed,
from the text layer, linking image crops) and pages whose output is missing or belongs to a changed
input are OCR'd as usual.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from ..errors import JobError, path_record, path_text
from ..pipeline.inputs import Document
from ..pipeline.naming import OutputPaths, Source
from ..pipeline.readback import read_pages
from ..pipeline.types import PipelineOptions
from .lock import JobLocked, lock_is_stale
from .report import RunLog, last_report_run
from .sqlite import StateDamaged, translate
from .state import JobState, Salvage
from .wording import count

def fresh_state(spec) -> tuple[JobState, str | None]:
    """Set the job's state file aside (if there is one) and open a new one, with what the old
    one could still tell (module docstring); returns it and a note saying where the old one went."""
    path = Path(spec.state)
    salvage = Salvage()
    try:
        old = JobState.open(path, spec.path, create_new=False)
    except StateDamaged:
        old = None  # unreadable: nothing can hold a lock in it that we could see
        salvage = JobState.salvage_file(path)  # but its runs or documents may still be legible
    if old is not None:
        try:
            old.claim(spec.name, spec.path)  # another job's state is not this job's to set aside
            lock = old.read_lock()
            salvage = old.salvage()
        finally:
            old.close()
        if lock is not None and not lock_is_stale(lock, spec.lock.stale_after):
            raise JobLocked(f"job {spec.name!r} is running ({lock.describe()}): not rebuilding its state under it")
    note = None
    if os.path.lexists(path):
        kind = "damaged" if old is None else "old"  # a whole file is not called damaged
        stamp = time.strftime('%Y%m%d-%H%M%S')
        aside = path.with_name(f"{path.name}.{kind}-{stamp}")
        n = 1
        while any(os.path.lexists(f"{aside}{suffix}") for suffix in ("", "-wal", "-shm")):
            n += 1  # two rebuilds in one second: the first one's file is kept, never replaced
            aside = path.with_name(f"{path.name}.{kind}-{stamp}-{n}")
        try:
            for suffix in ("", "-wal", "-shm"):
                if os.path.lexists(f"{path}{suffix}"):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
        except OSError as e:
            raise JobError(f"{path_text(path)}: cannot set the {kind} job state aside: {e.strerror or e}") from None
        note = (f"the {'damaged' if old is None else 'old (readable)'} job state was set aside as {path_text(aside)}; "
                "this one is rebuilt from the outputs")
    runs_after = max(salvage.last_run, last_report_run(spec.reports))
    if runs_after:
        note = (note + "; " if note else "") + f"run numbers go on after run {runs_after}"
    state = JobState.open(path, spec.path)
    try:
        state.adopt(salvage, runs_after)
    except sqlite3.Error as e:
        state.close()
        raise translate(path, e, spec.path) from None
    except BaseException:
        state.close()
        raise
    return state, note


def recover_pages(state: JobState, run_id: int, docs: dict[str, tuple[int, Document]], options: PipelineOptions,
                  log: RunLog) -> int:
    """Record as done every pending page whose text an intact output of the same input holds;
    returns how many. A document whose every page came back counts as `recovered`: its outputs
    are on disk, the same as a document this run wrote."""
    recovered = 0
    for row_id, doc in docs.values():
        row = state.document(row_id)
        if row["n_pages"] is None or not row["sha256"]:
            continue
        source = Source(path_record(doc.path), row["sha256"])
        found = _find_outputs(Path(row["output"]), doc, source, options)
        if found is None:
            continue
        paths, pages = found
        if str(paths.base) != row["output"]:
            state.set_output(row_id, str(paths.base))
        wanted = {p["page"] for p in state.pages(row_id) if p["status"] == "pending"}
        n = sum(state.recover_page(run_id, row_id, page, pages[page].text, pages[page].n_tokens, pages[page].finish_reason)
                for page in sorted(wanted & pages.keys()))
        recovered += n
        if n and n == len(wanted):  # every page back: the outputs are the document's, as they are
            state.set_document_status(row_id, "done", None)
            log.document("recovered", doc.path)
    if recovered:
        log.notes.append(f"{count(recovered, 'page')} recovered from the existing outputs, not OCR'd again")
    return recovered


def _find_outputs(base: Path, doc: Document, source: Source, options: PipelineOptions):
    """(paths, {page: readback.KeptPage}) from the outputs recording `source`,
    under the planned name or the other name a document may have (with or without -<id>)."""
    tag = f"-{doc.doc_id[:8]}"
    other = base.with_name(base.name[: -len(tag)]) if base.name.endswith(tag) else base.with_name(base.name + tag)
    for candidate in (base, other):
        paths = OutputPaths(candidate)
        recorded = paths.recorded_source(options.formats)
        # pages come from the JSONL: not one that another reading left beside the Markdown
        if source.same_file(recorded) and paths.records_agree(options.formats, recorded):
            pages = read_pages(paths, options.formats, source.sha256)
            if pages:
                return paths, pages
    return None
