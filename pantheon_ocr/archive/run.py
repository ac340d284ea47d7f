"""Nightly archive jobs: run a job file to completion across any number of stops.

    run_job(spec, engine_factory)     lock -> plan -> rounds of pages -> report -> unlock

Plan (plan.py): every input document is stat'ed; size+mtime unchanged means unchanged (the
sha256 is only recomputed when they differ, or always with `rehash = true`); a new or changed
document has its pages counted in a crash-proof worker and gets fresh `pages` rows.
Rounds: all pending pages of the current documents go to an executor (local pipeline or Ray)
as explicit PageTasks, each with the sampling for its next attempt. Each result is committed
on arrival (state.py explains why that survives kill -9); a page that looped or failed goes
back to pending with attempts+1, so the next round retries it hotter, until retry.attempts.
Write: when a document has no pending page left, its outputs are assembled from the texts in
the state and written atomically (outputs.write_document), then the document is marked done.
A stop between any two of these steps is repaired by the next run: finished documents whose
files are missing are assembled again, temp files left by a killed write are removed.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any, Callable, Protocol, Sequence

from ..errors import (ExitCode, JobError, ModelError, OptionError, PantheonError, UsageError, path_record, path_text,
                      run_exit_code)
from ..modelfiles.resolve import resolve_model
from ..options import EngineOptions
from ..pipeline.inputs import Document
from ..pipeline.fallback import TextLayerFallback
from ..pipeline.figures import FigureCropper
from ..pipeline.naming import OutputPaths, Source, page_selection, plan_output_paths
from ..pipeline.files import changed_since, file_stamp
from ..pipeline.outputs import check_output_folder, write_document, write_problem
from ..pipeline.types import STAGES, TEXT_LAYER, PageResult, PageTask, PipelineOptions, Progress
from . import rebuild
from .lock import Heartbeat, JobLocked, acquire
from .owner import held_by_another, own_name
from .plan import Planner
from .reading import changes, reading_settings
from .signals import HeldSignals
from .sqlite import translate
from .report import REPORTS_HINT, RunLog, build_summary, killed_run_said, last_report_run, write_reports
from .spec import JobSpec, load_job
from .state import JobState
from .wording import NO_SELECTED_PAGE

__all__ = ["Executor", "JobResult", "JobSpec", "LocalExecutor", "ModelEngineFactory", "load_job", "model_engine_factory", "run_job"]


@dataclass(frozen=True)
class ModelEngineFactory:
    """Builds the real engine: () -> (engine, notes). Picklable, so a Ray worker can build its own."""

    options: EngineOptions

    def __call__(self):
        from ..engine.loader import load_page_engine

        return load_page_engine(self.options)


def model_engine_factory(spec: JobSpec) -> ModelEngineFactory:
    """The engine factory for the model files a job names. They are checked now, so that a
    missing file fails the run before it takes the lock (exit 3)."""
    m = spec.model
    keys = {"model": "model.name" if m.name else "model.text", "mmproj": "model.mmproj"}
    try:
        text, mmproj = resolve_model(m.name or m.text, m.mmproj)
    except OptionError as e:
        raise JobError(f"{spec.path.name}: {e.named(keys.get(e.option, e.option))}") from None
    except UsageError as e:
        raise JobError(f"{spec.path.name}: {keys['model']}: {e}") from None
    except ModelError as e:
        raise ModelError(e.path, f"{e.problem} ({keys.get(e.option, keys['model'])} in {spec.path.name})") from None
    for name, path in zip(keys.values(), (text, mmproj)):
        if not path.exists():
            raise ModelError(path, f"no such model file ({name} in {spec.path.name})")
        if not path.is_file():
            raise ModelError(path, f"not a regular file ({name} in {spec.path.name})")
    return ModelEngineFactory(replace(m.engine, model=text, mmproj=mmproj))


class Executor(Protocol):
    """Where a round's pages run: this process (LocalExecutor) or a Ray cluster (ray.RayExecutor)."""

    name: str  # recorded with the run: "local", "ray"
    notes: list[str]  # what building the engines said (the plan `auto` chose), for the report

    def run(self, tasks: Sequence[PageTask], options: PipelineOptions, on_page: Callable[[PageResult], None],
            on_progress: Callable[[Progress], None] | None = None) -> bool:
        """Run the tasks, each finished page handed to on_page in this thread; True if interrupted."""

    def close(self) -> None:
        """Let the engines go (the run is over, or failed)."""


class LocalExecutor:
    """Runs a round in this process with the page pipeline (one engine, built on first use so
    a night with nothing new never loads the model). `engine_factory() -> (engine, notes)`;
    the notes end up in the run's summary."""

    name = "local"

    def __init__(self, engine_factory: Callable[[], Any], **pipeline_kw):
        self.engine_factory, self.engine, self.pipeline_kw = engine_factory, None, pipeline_kw
        self.notes: list[str] = []

    def run(self, tasks: Sequence[PageTask], options: PipelineOptions, on_page, on_progress=None) -> bool:
        from ..pipeline.run import run_pipeline

        if self.engine is None:
            self.engine, notes = self.engine_factory()
            self.notes += notes
        summary = run_pipeline([], self.engine, options, on_progress, tasks=tasks, on_page=on_page,
                               write_outputs=False, **self.pipeline_kw)
        return summary.interrupted

    def close(self) -> None:
        self.engine = None


@dataclass
class JobResult:
    run: int
    exit_code: ExitCode
    summary: dict  # the JSON report's content
    report_json: Path | None
    report_html: Path | None


def run_job(spec: JobSpec, engine_factory: Callable[[], Any] | None = None, *, executor: Executor | None = None,
            retry_failed: bool = False, on_progress: Callable[[Progress], None] | None = None, log: Callable[[str], None] = lambda s: None,
            rebuild_state: bool = False, reread: bool = False) -> JobResult:
    """Run the job once (see the module docstring). Raises JobLocked when another run holds the
    lock, StateDamaged / WriteError / StateBusy when the state cannot be used; returns a JobResult
    whose exit_code follows errors.ExitCode otherwise. rebuild_state: set a damaged state aside
    and start a new one from what the outputs hold (rebuild.py). reread: read every document
    again (after the model or the reading settings changed: reading.py)."""
    check_output_folder(spec.output)  # before any page: a night that cannot keep its outputs stops now
    check_output_folder(spec.reports, "reports folder", REPORTS_HINT)  # nor its report
    if executor is None:
        executor = LocalExecutor(engine_factory or (lambda: model_engine_factory(spec)()))
    return _JobRun(spec, executor, retry_failed, on_progress, log, rebuild_state, reread).execute()


class _JobRun:
    def __init__(self, spec: JobSpec, executor: Executor, retry_failed: bool, on_progress, say: Callable[[str], None],
                 rebuild: bool = False, reread: bool = False) -> None:
        self.spec, self.executor, self.retry_failed, self.rebuild = spec, executor, retry_failed, rebuild
        self.reread = reread
        self.on_progress, self.say = on_progress, say
        # the text-layer fallback of pages that failed every attempt (a worker started on first use)
        self.stamps: dict = {}  # doc_id -> files.file_stamp at planning
        self.changed: dict[str, str] = {}  # doc_id -> how its file changed during this run
        self.fallback = TextLayerFallback(spec.ocr.password, spec.ocr.render_timeout)
        self.figures = FigureCropper(spec.ocr.password, spec.ocr.render_timeout)  # bbox models' image regions
        self.options = spec.pipeline_options()
        self.log = RunLog()  # what this run did, for its report
        self.docs: dict[str, tuple[int, Document]] = {}  # doc_id -> (row id, document) of this run

    # ------------------------------------------------------------------ the run

    def execute(self) -> JobResult:
        spec = self.spec
        with HeldSignals() as held:  # until the finally below owns the release of the lock
            if self.rebuild:
                self.state, note = rebuild.fresh_state(spec)
                self.log.notes += [note] if note else []
            else:
                self.state = JobState.open(spec.state, spec.path)
            try:
                self.state.claim(spec.name, spec.path)
                # numbered past the reports already there, even if the state was lost meanwhile
                self.run_id, stale = acquire(self.state, spec.lock.stale_after, self.executor.name, spec.name,
                                             after=last_report_run(spec.reports))
            except sqlite3.Error as e:
                self.state.close()
                raise translate(spec.state, e, spec.path) from None
            except BaseException:
                self.state.close()
                raise
            if stale is not None:  # printed with the run's summary, and in the report
                self.log.notes.append(f"took over a stale lock ({stale.describe()})" + killed_run_said(self.state, stale.run))
            interval = min(15.0, max(0.2, spec.lock.stale_after / 4))
            self.heartbeat = Heartbeat(spec.state, self.run_id, interval)
            self.heartbeat.start()
        status, code, interrupted, failure = "crashed", ExitCode.PAGES_FAILED, held.pending, None
        recovered = 0  # pages --rebuild-state took from the outputs: done and on disk, like pages written
        try:
            try:
                if interrupted:
                    raise KeyboardInterrupt
                self._reading_changed()
                self.docs = Planner(spec, self.state, self.run_id, self.options, self.retry_failed, self.log,
                                    self.reread).plan()
                # each document's file as planned (and hashed): one that changes while this run
                # reads it keeps its pages pending, and the next run reads the new version
                self.stamps = {doc_id: file_stamp(doc) for doc_id, (_, doc) in self.docs.items()}
                if self.state.must_recover():  # a new state, or a rebuild a kill stopped half-way
                    if not self.reread:  # --reread: what the outputs hold is what is to be read again
                        recovered = rebuild.recover_pages(self.state, self.run_id, self.docs, self.options, self.log)
                    self.state.recovered()
                for row_id, _ in list(self.docs.values()):  # documents a stop left unwritten
                    self._assemble(row_id, only_if_needed=True)
                self._rounds()
            except KeyboardInterrupt:
                interrupted = True
            # what counts as written for the exit code: as transcribe, a document with no selected
            # page was read (1, not 4), pages recovered by --rebuild-state are on disk, and so are
            # the documents earlier runs read (4 says the whole archive is unreadable; an unchanged
            # document all of whose pages failed before is no readable one)
            kept = sum(self.log.events[k] for k in ("written", "partial", NO_SELECTED_PAGE))
            wrote = kept > 0 or recovered > 0 or any(a["outcome"] == "done" for a in self.log.attempts) or any(
                self.state.document(row_id)["status"] in ("done", "partial") for row_id, _ in self.docs.values())
            status = "interrupted" if interrupted else "finished"
            code = run_exit_code(interrupted, bool(self.log.failures), wrote, self.log.events["write failed"] > 0,
                                 any(f.get("short_of_memory") for f in self.log.failures))
        except PantheonError as e:
            failure, code = e, e.exit_code
        except sqlite3.Error as e:
            failure = translate(spec.state, e, spec.path)
            code = failure.exit_code
        except KeyboardInterrupt:  # in the moment between the work and the bookkeeping
            status, code, interrupted = "interrupted", ExitCode.INTERRUPTED, True
        finally:
            with HeldSignals() as late:
                result, problem = self._bookkeeping(status, code)
        if failure is not None:
            raise failure
        if problem is not None:
            raise problem
        if late.pending and status != "interrupted":  # stopped already: its result says so (130), with its lines
            raise KeyboardInterrupt
        return result

    def _reading_changed(self) -> None:
        """Say it when the model or the reading settings changed since the last run: what was
        read before keeps the old text unless --reread (reading.py)."""
        now, before = reading_settings(self.spec), self.state.reading()
        if before is not None and not self.reread and self.state.any_page_done():
            changed = changes(before, now)
            if changed:
                self.log.notes.append(f"the reading changed since the last run ({'; '.join(changed)}): pages read "
                                      "before keep their text; `archive run --reread` reads every document again")
        self.state.set_reading(now)

    def _bookkeeping(self, status: str, code: ExitCode) -> tuple[JobResult, PantheonError | None]:
        """Stop the heartbeat and the executor, write the report, record the run, release the
        lock: each step even if an earlier one failed (a full disk, a damaged state); the
        first state error is returned to be raised after."""
        problem = None
        self.heartbeat.stop()
        try:
            self.executor.close()
        except Exception as e:  # noqa: BLE001 - the run's record matters more
            self.say(f"warning: closing the executor failed: {type(e).__name__}: {e}")
        self.fallback.close()
        self.figures.close()
        self.log.notes += [n for n in self.executor.notes if n not in self.log.notes]
        try:
            counts = self.state.counts()
        except sqlite3.Error:
            counts = {}
        summary = build_summary(self.spec, self.run_id, self.executor.name, self.log, counts, status, code)
        paths = (None, None)
        try:
            paths = write_reports(summary, self.spec.reports, self.run_id)
        except Exception as e:  # noqa: BLE001 - a report is not worth a lock left behind
            # our errors name the file or folder; any other gets the reports folder named
            why = e if isinstance(e, PantheonError) else (
                f"{path_text(self.spec.reports)}: cannot write the report: "
                f"{(e.strerror if isinstance(e, OSError) else None) or e}")
            self.say(f"error: {why}")
            if code != ExitCode.INTERRUPTED:  # the night's record is not on disk: as an output that is not
                code = ExitCode.CANNOT_WRITE
                summary["exit_code"] = int(code)
        for step in (lambda: self.state.finish_run(self.run_id, status, int(code), summary, *(str(p) if p else None for p in paths)),
                     lambda: self.state.release(self.run_id)):
            try:
                step()
            except sqlite3.Error as e:
                problem = problem or translate(self.spec.state, e, self.spec.path)
        self.state.close()
        return JobResult(self.run_id, code, summary, *paths), problem

    # ------------------------------------------------------------------ rounds

    def _rounds(self) -> None:
        by_row = {row_id: doc for row_id, doc in self.docs.values()}
        while True:  # the pages of a document that changed meanwhile wait for the next run
            pending = [r for r in self.state.pending_pages() if r["doc"] in by_row and by_row[r["doc"]].doc_id not in self.changed]
            if not pending:
                return
            tasks, self.expect = [], {}
            for r in pending:
                attempt = r["attempts"] + 1
                sampling = self.spec.sampling(attempt)
                doc = by_row[r["doc"]]
                tasks.append(PageTask(doc, r["page"] - 1, r["n_pages"], sampling=sampling))
                self.expect[(doc.doc_id, r["page"])] = (r["doc"], attempt, sampling)
            n_before = len(self.log.attempts) + len(self.changed)
            self.say(f"{len(tasks):,} page{'s' if len(tasks) != 1 else ''} to run" + ("" if n_before == 0 else " (retries)"))
            if self.executor.run(tasks, self.options, self._record, self.on_progress):
                raise KeyboardInterrupt
            if len(self.log.attempts) + len(self.changed) == n_before:  # nothing came back: do not loop forever
                raise JobError("the executor returned no page results")

    def _record(self, result: PageResult) -> None:
        """One page result -> the state (conditional on the attempt we sent), then the document's
        outputs if that was its last pending page. Called in the main thread as pages finish."""
        if self.heartbeat.lost.is_set():
            raise JobLocked("another run took over this job's lock (this run was stalled past lock.stale_after); stopping")
        key = (result.doc.doc_id, result.page)
        if key not in self.expect:
            return
        doc_id = result.doc.doc_id
        why = self.changed.get(doc_id) or changed_since(result.doc, self.stamps.get(doc_id))
        if why:  # a page of another version must not join the pages of the one we hashed
            self.expect.pop(key)
            if doc_id not in self.changed:
                self.changed[doc_id] = why
                self.log.fail(str(result.doc.path), None, f"changed while it was being read ({why}): its pages stay "
                                                          "pending, the next run reads the new version")
            return
        row_id, attempt, sampling = self.expect.pop(key)
        retry_on = self.spec.retry.on
        problem = "error" if result.error is not None else result.finish_reason if result.finish_reason in ("repetition", "max_tokens") else None
        error = None
        if problem is None or (problem != "error" and problem not in retry_on):
            outcome = "done"
        elif problem in retry_on and attempt < self.spec.attempts and not result.lasting:
            outcome = "retry"  # a page the file itself damaged (lasting) fails the same at any temperature
        else:
            outcome = "failed"
            if result.lasting and problem in retry_on and attempt < self.spec.attempts:
                error = f"{result.error} (the file's own fault: not tried again)"
            elif problem == "error":
                error = result.error
            else:
                error = ("the model kept repeating itself" if problem == "repetition" else
                         f"no end of page within max_tokens ({sampling.max_tokens})") + \
                    f" ({attempt} attempt{'s' * (attempt > 1)}, last temperature {sampling.temperature:g})"
            if self.spec.ocr.text_layer != "ocr":  # every attempt failed: the PDF's own text, if it has some
                result = self.fallback.apply([dataclasses.replace(result, error=error)])[0]
        now = time.time()
        secs = [result.seconds.get(s, 0.0) for s in STAGES]
        left = self.state.record_attempt(self.run_id, row_id, result.page, attempt, "pending" if outcome == "retry" else outcome,
                                         result, error if outcome == "failed" else result.error, outcome, sampling, secs, now)
        if left is None:
            return  # already recorded (cannot happen with one lock holder; never write twice)
        self.log.attempts.append({"path": path_text(result.doc.path), "page": result.page, "attempt": attempt, "outcome": outcome,
                                  "temperature": sampling.temperature, "seed": sampling.seed, "n_tokens": result.n_tokens,
                                  "finish_reason": result.finish_reason, "error": result.error,
                                  "seconds": dict(zip(STAGES, secs)), "t": now - self.log.t0})
        if outcome == "failed":
            self.log.fail(str(result.doc.path), result.page, error + (" (the PDF's text layer stands in)" if result.from_text_layer else ""),
                          attempt, short_of_memory=result.short_of_memory)
        if left == 0:
            self._assemble(row_id)

    # ------------------------------------------------------------------ writing

    def _assemble(self, row_id: int, only_if_needed: bool = False) -> None:
        """Write a document's outputs from its final pages, atomically, then mark it. With
        only_if_needed: only if an earlier run stopped before writing, or files went missing."""
        row, pages = self.state.document(row_id), self.state.pages(row_id)
        if not pages or any(p["status"] == "pending" for p in pages):
            return
        if only_if_needed and row["status"] not in ("done", "partial", "pending"):
            return
        doc = Document(Path(row["path"]), row["kind"], row["doc_id"], PurePath(row["rel"]))
        # Another source's outputs where ours were (a job or `transcribe` sharing the output
        # folder wrote over them): ours go under a name of our own, the other's stay.
        other = held_by_another(Path(row["output"]), path_record(row["path"]))
        if other is not None:
            row = self._rename(row, doc, other)
        paths, formats = OutputPaths(Path(row["output"]), root=self.spec.output), self.options.formats
        if only_if_needed and other is None and row["status"] in ("done", "partial"):
            complete = paths.exist(formats) and (not self.options.page_files or all(paths.page_file(p["page"]).is_file() for p in pages))
            if complete:
                return
            self.log.notes.append(f"{path_text(row['path'])}: outputs missing, written again from the job state")
        results = [
            PageResult(doc, p["page"], p["text"] or "", p["n_tokens"] or 0,
                       p["finish_reason"] if p["status"] == "done" or p["finish_reason"] == TEXT_LAYER else None,
                       p["error"] if p["status"] == "failed" else None, self.state.seconds(p))
            for p in pages
        ]
        error = None
        if all(r.error is not None and not r.from_text_layer for r in results):
            status, error = "failed", "no page could be read"  # like transcribe: write nothing
        else:
            try:
                results = self.figures.apply(results, paths.base)
                # (with page files, write_document also removes those of pages the set no longer has)
                # the page selection too: `transcribe` in a shared output folder took a job's
                # `pages = "2"` outputs for the whole document, done
                write_document(paths, results, formats, self.options.page_files,
                               Source(path_record(row["path"]), row["sha256"], size=row["size"], mtime_ns=row["mtime_ns"],
                                      pages=page_selection(self.options.pages)))
                status = "partial" if any(r.error is not None for r in results) else "done"
            except OSError as e:
                status, error = "pending", write_problem(e)  # retried next run
                self.log.fail(row["path"], None, error)
        self.state.set_document_status(row_id, status, error)
        self.log.document({"done": "written", "partial": "partial", "failed": "failed (no page)", "pending": "write failed"}[status],
                          row["path"])

    def _rename(self, row, doc: Document, other: str):
        """Give the document a new output name, its own (see owner.own_name); the row after."""
        taken = {str(r["output"]).casefold() for r in self.state.documents_by_path().values() if r["output"] and r["id"] != row["id"]}
        base = own_name(plan_output_paths([doc], self.spec.output)[doc.doc_id], path_record(row["path"]), doc.doc_id, taken)
        self.state.set_output(row["id"], str(base))
        self.log.notes.append(f"{path_text(row['path'])}: {path_text(row['output'])} now holds the outputs of {path_text(other)} "
                              f"(another job or transcribe writes there too); its outputs are written again from the job "
                              f"state as {path_text(base)}")
        return self.state.document(row["id"])
