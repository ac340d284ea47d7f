"""The recipe: plan -> render -> vision stage -> CPU stage -> write.

    main thread      plan (skip done documents, count pages in a worker)
    stage threads    render -> vision -> prefill + batched decode (stages.py)
    main thread      collects page results, writes each document atomically as soon as all
                     its pages are in (and one under way at checkpoints, below)

Memory is bounded by the queue sizes, not by document length: at most `2 * render_workers`
pages inside the render pool, `render_queue` rendered pages, one image in the vision stage,
`features_queue` encoded pages and `batch_size` live sequences. Only the page texts of
unfinished documents accumulate.

Failures are per page: a render error, a crashed render worker, or an exception in vision,
prefill or a decode step turns the page(s) concerned into failed PageResults; the run goes on.
Ctrl-C (KeyboardInterrupt, delivered to the main thread) sets `stop`: every stage returns
within ~0.1 s of its current engine call, render workers are ended, documents already written
stay written; run_pipeline then returns with `interrupted=True` (exit code 130) rather than
raising, so the caller can still report what was done.

An unfinished document keeps the pages read so far: when the run stops (Ctrl-C, SIGTERM, a
crash), and every CHECKPOINT_EVERY seconds while it is read (against `kill -9` and the OOM
killer), its outputs are written with the pages not yet read marked failed (unfinished.py). The next
run reads only those and keeps the rest (readback.py), as for pages that failed: a 3,000-page PDF
stopped at page 1,901 lost all 1,901 before.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from ..errors import InputError
from .files import PlantedPath, changed_since, file_stamp
from .inputs import Document, parse_pages, past_end_note, validate_page_spec
from .fallback import TextLayerFallback
from .figures import FigureCropper
from .claims import claim_all
from .naming import plan_output_paths
from .outputs import check_targets, write_document, write_problem
from .readback import read_pages
from .regions import for_options
from .render import open_pages, render_page
from .render_pool import RenderPool
from .stages import POLL, StageCrashed, Stages
from .unfinished import CHECKPOINT_EVERY, DocState, save_unfinished
from .types import (NO_SELECTED_PAGE, OUTPUTS_EXIST, TEXT_LAYER, DocumentOutcome, PageEngine, PageFailure, PageResult, PageTask, PipelineOptions, Progress,
                    RunSummary)


log = logging.getLogger(__name__)

PROGRESS_EVERY = 0.5  # seconds between two progress reports while pages are under way


def iter_queue(q: queue.Queue):
    """What is in a queue now, without waiting."""
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


def run_pipeline(
    documents: Sequence[Document],
    engine: PageEngine,
    options: PipelineOptions,
    on_progress: Callable[[Progress], None] | None = None,
    *,
    render_fn: Callable[..., Any] = render_page,
    start_method: str | None = None,
    tasks: Sequence[PageTask] | None = None,
    on_page: Callable[[PageResult], None] | None = None,
    write_outputs: bool = True,
    stop: threading.Event | None = None,
) -> RunSummary:
    """OCR `documents` with `engine` and write the outputs; see the module docstring.
    `on_progress` is called from the calling thread after planning and after every page.
    `render_fn` (same signature as render_page, picklable) is a fault-injection hook for tests.

    For callers that keep their own state (archive jobs): `tasks` runs exactly these pages
    (no skipping of existing outputs, no page counting; `documents` without a task are reported
    skipped); `on_page` is called from the calling thread with each PageResult as it arrives,
    before its document is finished; `write_outputs=False` writes no files (statuses still say
    whether each document came out complete, partial or failed). `stop`: setting it from another
    thread ends the run as Ctrl-C does (the Python API's readers stop this way)."""
    validate_page_spec(options.pages)  # a bad spec fails before any work
    return _Run(documents, engine, options, on_progress, render_fn, start_method, tasks, on_page, write_outputs,
                stop).execute()


class _Run:
    def __init__(
        self, documents, engine, options, on_progress, render_fn, start_method, tasks=None, on_page=None, write_outputs=True,
        stop=None,
    ) -> None:
        unique: dict[str, Document] = {}
        for doc in documents:
            unique.setdefault(doc.doc_id, doc)
        self.documents = list(unique.values())
        self.engine = for_options(engine, options.segment)
        self.options = options
        self.on_progress = on_progress
        self.render_fn = render_fn
        self.explicit_tasks = None if tasks is None else list(tasks)
        self.on_page = on_page
        self.write_outputs = write_outputs
        self.edge = options.longest_edge or self.engine.longest_edge
        self.paths = plan_output_paths(self.documents, options.out_dir)
        self.pool = RenderPool(
            workers=options.render_workers, timeout=options.render_timeout, start_method=start_method
        )
        self.stop = stop if stop is not None else threading.Event()
        self.sources: dict = {}  # doc_id -> naming.Source, recorded in its outputs
        self.finished_before: set[str] = set()  # doc_ids whose finished outputs this run replaces (Claim.finished)
        self.fallback = TextLayerFallback(options.password, options.render_timeout, start_method) \
            if options.text_layer != "ocr" else None
        self.figures = FigureCropper(options.password, options.render_timeout, start_method)  # bbox models' image regions
        self.stages: Stages | None = None
        self.outcomes: dict[str, DocumentOutcome] = {}
        self.states: dict[str, DocState] = {}
        self.tasks: list[PageTask] = []
        self.pages_done = self.pages_failed = self.tokens = self.pages_cut = self.pages_from_text_layer = 0
        self.pages_kept = 0  # pages kept from the outputs of documents written again (readback.py)
        self.t0 = self.last_progress = time.perf_counter()
        self.reading_since = 0.0  # seconds from t0 to the end of planning: the time left is paced from there
        self.done_before_reading = 0  # pages done by then (from the text layer), not paced
        self.reported: set[str] = set()  # documents whose outcome a Progress has carried

    def execute(self) -> RunSummary:
        interrupted = False
        try:
            self._plan()
            ocr_tasks = self._prefer_text_layers() if self.options.text_layer == "prefer" else self.tasks
            self.reading_since, self.done_before_reading = time.perf_counter() - self.t0, self.pages_done
            self._progress()
            if ocr_tasks:
                self.stages = Stages(self.engine, self.options, self.pool, self.render_fn, self.edge, ocr_tasks, self.stop)
                self.stages.start()
                self._collect()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            # What was read is saved before the stages and workers are waited for (up to seconds):
            # a second Ctrl-C in that wait once cut the saving and lost every unfinished page.
            self.stop.set()
            for state in self.states.values():  # a crash too: what was read is kept, then it is raised
                try:
                    self._save_unfinished(state)
                except KeyboardInterrupt:  # stopped again: the others stay as they are on disk
                    interrupted = True
                    break
                except Exception:  # noqa: BLE001 - never in place of what ended the run
                    log.exception("%s: its pages read could not be written", state.doc.path)
            self._shutdown()
        for doc in self.documents:
            if doc.doc_id not in self.outcomes:
                state = self.states.get(doc.doc_id)
                note = "stopped before it was complete"
                outputs = state.outputs if state else ()
                if state is not None and state.keeps_earlier:
                    note += ": its earlier outputs, a finished reading, are kept as they were"
                elif state is not None and state.outputs:
                    left = state.expected - state.saved_ok
                    note += (f": {state.saved_ok} of {state.expected} pages written, the next run reads the other "
                             f"{left}" + (" unless it overwrites again" if self.options.overwrite else ""))
                elif state is not None and state.kept and not state.changed:  # stopped before a new page: its outputs hold those of last time
                    outputs = tuple(p for p in state.paths.documents(self.options.formats) if p.is_file())
                    note += (f": {state.kept} of {state.expected} pages kept from its outputs, the next run reads the "
                             f"other {state.expected - state.kept}")
                if state is not None and state.save_error:
                    note += f"; its pages read could not be written: {state.save_error}"
                self.outcomes[doc.doc_id] = DocumentOutcome(
                    doc, "interrupted", outputs, n_pages=state.expected if state else 0, note=note
                )
        return RunSummary(
            documents=tuple(self.outcomes[d.doc_id] for d in self.documents),
            interrupted=interrupted,
            pages_done=self.pages_done,
            tokens=self.tokens,
            seconds=time.perf_counter() - self.t0,
            pages_cut=self.pages_cut,
            pages_failed=self.pages_failed,
            pages_from_text_layer=self.pages_from_text_layer,
            pages_kept=self.pages_kept,
        )

    def _planted(self, paths, doc: Document) -> str | None:
        """Why the document's outputs could not be written, when a link or a file is planted
        where they go: said before its pages are read, not after (None: nothing in the way)."""
        if not self.write_outputs:
            return None
        try:
            check_targets(paths, self.options.formats, self.options.page_files, doc)
        except PlantedPath as e:
            return write_problem(e)
        except OSError:  # anything else is the writers' to meet, and to report
            pass
        return None

    def _plan(self) -> None:
        if self.explicit_tasks is not None:
            self._plan_tasks(self.explicit_tasks)
            return
        opts = self.options
        to_open, again, kept, other_model = [], {}, {}, {}
        # outputs of other pages are not done; --overwrite writes over a file that is not ours too
        claims = claim_all(self.documents, self.paths, opts.formats, opts.pages, opts.page_files, opts.overwrite)
        model = self.engine.model or None  # "": an engine that does not say (none of the run's outputs record one)
        for doc in self.documents:
            claim = claims[doc.doc_id]
            # the model of this run: with --overwrite a finished document's record is written anew
            source = replace(claim.source, model=model) if claim.source is not None else None
            self.paths[doc.doc_id], self.sources[doc.doc_id] = claim.paths, source
            if claim.error is not None:
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", failures=(PageFailure(str(doc.path), None, claim.error),))
            elif claim.done and not opts.overwrite:  # a link among its outputs is the user's: nothing is written
                self.outcomes[doc.doc_id] = DocumentOutcome(
                    doc, "skipped", outputs=tuple(claim.paths.documents(opts.formats)), note=OUTPUTS_EXIST
                )
            elif (planted := self._planted(claim.paths, doc)) is not None:
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "unwritten", failures=(PageFailure(str(doc.path), None, planted),))
            else:
                to_open.append(doc)
                if claim.done or claim.finished:  # --overwrite, or other pages: its finished outputs stay till the new reading is whole
                    self.finished_before.add(doc.doc_id)
                if claim.failed_before and not opts.overwrite:
                    again[doc.doc_id] = claim.failed_before
                    # a document is read by one model, not two; outputs that name none (an archive
                    # job's, an older version's) may be another's, and are read again whole too,
                    # where this engine names its model (an engine that names none keeps them)
                    if claim.model_before != model:
                        other_model[doc.doc_id] = claim.model_before
                    elif self.write_outputs and claim.keeps:  # the pages that did not fail stay as they were written
                        kept[doc.doc_id] = read_pages(claim.paths, opts.formats, claim.source.sha256)
        # Opening a PDF runs PDFium, so it happens in a worker too.
        counts = self.pool.imap(open_pages, [(doc, opts.password) for doc in to_open], self.stop) if to_open else ()
        for outcome in counts:
            doc = to_open[outcome.index]
            if outcome.error is not None:
                reason = outcome.error.problem  # InputError and WorkerError both say it there
                option = outcome.error.option if isinstance(outcome.error, InputError) else None
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", failures=(
                    PageFailure(str(doc.path), None, reason, option=option),))
                continue
            n_pages, opened_note = outcome.value.n, outcome.value.note
            pages = parse_pages(opts.pages, n_pages, clip=True)
            if not pages:  # nothing of it is read: a failure of this document, not a success
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", note=NO_SELECTED_PAGE, failures=(PageFailure(
                    str(doc.path), None, f"none of the selected pages ({opts.pages}) exists: "
                                         f"the document has {n_pages} page{'s' if n_pages != 1 else ''}"
                                         + (f" ({opened_note})" if opened_note else "")),))
                continue
            back = kept.get(doc.doc_id, {})  # by 1-based page; `pages` are 0-based indices
            keep = {i + 1: back[i + 1] for i in pages if i + 1 in back}
            again_note = ""
            if doc.doc_id in again:  # only the pages not kept are read: the whole document when none are
                said, n = _pages_said(again[doc.doc_id]), len(keep)
                kept_said = f"{n} page{'s' * (n != 1)} kept from the outputs"
                again_note = (f"{said} not finished last time: read again, {kept_said}" if keep and len(keep) < len(pages)
                              else f"{said} not finished last time and is not selected now: {kept_said}" if keep
                              else f"read again{', all of it' if len(pages) == n_pages else ''}: {said} not finished last time"
                              + (_other_model(other_model[doc.doc_id]) if doc.doc_id in other_model else ""))
            state = self.states[doc.doc_id] = DocState(
                doc, self.paths[doc.doc_id], expected=len(pages), stamp=file_stamp(doc), kept=len(keep),
                keeps_earlier=doc.doc_id in self.finished_before,
                pages=[i + 1 for i in pages], saved=len(keep),
                results=[PageResult(doc, page, k.text, k.n_tokens, k.finish_reason, None, k.seconds) for page, k in keep.items()],
                note="; ".join(filter(None, (again_note, past_end_note(opts.pages, n_pages), opened_note,
                                             claims[doc.doc_id].note))))
            self.tasks += [PageTask(doc, i, n_pages) for i in pages if i + 1 not in keep]
            if len(keep) == len(pages):  # nothing left to read (the failed pages are no longer selected)
                self._finish(state)
                del self.states[doc.doc_id]

    def _plan_tasks(self, tasks: list[PageTask]) -> None:
        known = {doc.doc_id for doc in self.documents}
        for task in tasks:
            if task.doc.doc_id not in known:  # a task's document is part of the run
                known.add(task.doc.doc_id)
                self.documents.append(task.doc)
        self.paths = plan_output_paths(self.documents, self.options.out_dir)
        for task in tasks:
            state = self.states.get(task.doc.doc_id)
            if state is None:
                state = self.states[task.doc.doc_id] = DocState(task.doc, self.paths[task.doc.doc_id], 0,
                                                                 stamp=file_stamp(task.doc))
            state.expected += 1
            state.pages.append(task.page_index + 1)
            self.tasks.append(task)
        for doc in self.documents:
            if doc.doc_id not in self.states:
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "skipped", note="no pages to run")

    def _prefer_text_layers(self) -> list[PageTask]:
        """--text-layer prefer: pages whose text layer is real text are done now, from it; the
        tasks left for OCR."""
        found = self.fallback.prefer(self.tasks, self.stop)
        left = []
        for task in self.tasks:
            text = found.get((task.doc.doc_id, task.page))
            if text is None:
                left.append(task)
            else:
                self._record(PageResult(task.doc, task.page, text, 0, TEXT_LAYER, None))
        return left

    def _collect(self) -> None:
        while self.pages_done < len(self.tasks):
            try:
                item = self.stages.results.get(timeout=POLL)
            except queue.Empty:
                if self.stop.is_set():  # stopped from outside (the API), or a stage crashed
                    time.sleep(POLL)  # a crashing stage sets stop, then queues its error
                    crashed = [i for i in iter_queue(self.stages.results) if isinstance(i, StageCrashed)]
                    if crashed:
                        raise crashed[0].__cause__ or crashed[0]
                    raise KeyboardInterrupt
                if time.perf_counter() - self.last_progress >= PROGRESS_EVERY:
                    self._progress()
                continue
            if isinstance(item, StageCrashed):
                raise item.__cause__ or item
            self._record(item)

    def _record(self, result: PageResult) -> None:
        if result.error is not None and self.fallback is not None and self.options.fallback_in_pipeline:
            # Here, the one place, not when the document is done: on_page (the API's read) sees the
            # page as the outputs will hold it, its text layer standing in
            result = self.fallback.apply([result], self.stop)[0]
        self.pages_done += 1
        self.tokens += result.n_tokens
        self.pages_failed += result.error is not None
        self.pages_cut += result.error is None and result.finish_reason == "max_tokens"
        self.pages_from_text_layer += result.error is None and result.from_text_layer
        if self.on_page is not None:
            self.on_page(result)
        state = self.states[result.doc.doc_id]
        if state.changed is None:
            state.changed = changed_since(result.doc, state.stamp)
        state.results.append(result)
        if len(state.results) == state.expected:
            self._finish(state)
            del self.states[result.doc.doc_id]
        elif state.saved_at is None:  # the clock starts with its first page, not with the run
            state.saved_at = time.perf_counter()
        elif time.perf_counter() - state.saved_at >= CHECKPOINT_EVERY:
            self._save_unfinished(state)
        self._progress()

    def _save_unfinished(self, state: DocState) -> None:
        save_unfinished(state, self.options, self.sources.get(state.doc.doc_id), self.write_outputs)

    def _finish(self, state: DocState) -> None:
        doc, results = state.doc, sorted(state.results, key=lambda r: r.page)
        state.changed = state.changed or changed_since(doc, state.stamp)
        if state.changed:  # pages of two versions, or of one no longer there: none of them is written
            written = ("its outputs hold the pages read before, of the earlier version" if state.outputs
                       else "nothing written")
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", n_pages=len(results), failures=(
                PageFailure(str(doc.path), None, f"changed while it was being read ({state.changed}): "
                                                 f"{written}; run again to read the new version"),), note=state.note)
            return
        failures = tuple(PageFailure(str(doc.path), r.page, r.error + (" (the PDF's text layer stands in)" if r.from_text_layer else ""),
                                     r.short_of_memory) for r in results if r.error is not None)
        if all(r.error is not None and not r.from_text_layer for r in results):
            # Nothing readable: write nothing, so that the next run tries the document again.
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", n_pages=len(results), failures=failures, note=state.note)
            return
        if not self.write_outputs:  # the caller writes (see run_pipeline)
            status = "partial" if failures else "written"
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, status, (), len(results), failures, state.note)
            return
        try:
            results = self.figures.apply(results, state.paths.base, self.stop)
            written = write_document(state.paths, results, self.options.formats, self.options.page_files,
                                     self.sources.get(doc.doc_id))
        except OSError as e:
            failure = PageFailure(str(doc.path), None, write_problem(e))
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, "unwritten", n_pages=len(results), failures=failures + (failure,),
                                                        note=state.note)
            return
        status = "partial" if failures else "written"
        self.pages_kept += state.kept
        self.outcomes[doc.doc_id] = DocumentOutcome(doc, status, tuple(written), len(results), failures, state.note)

    def _progress(self) -> None:
        self.last_progress = time.perf_counter()
        if self.on_progress is None:
            return
        counts = self.stages.counts if self.stages is not None else {}
        finished = tuple(o for d, o in self.outcomes.items() if d not in self.reported)
        self.reported.update(o.doc.doc_id for o in finished)
        self.on_progress(
            Progress(
                pages_done=self.pages_done,
                pages_total=len(self.tasks),
                pages_failed=self.pages_failed,
                tokens=self.tokens + counts.get("live_tokens", 0),
                docs_done=len(self.outcomes),
                docs_total=len(self.documents),
                elapsed=time.perf_counter() - self.t0,
                reading_since=self.reading_since,
                done_before_reading=self.done_before_reading,
                rendered=counts.get("rendered", 0),
                encoded=counts.get("encoded", 0),
                prefilled=counts.get("prefilled", 0),
                decoding=counts.get("decoding", 0),
                finished=finished,
            )
        )

    def _shutdown(self) -> None:
        self.stop.set()
        if self.stages is not None:
            self.stages.join(timeout=2.0)  # engine calls stop at their next layer (engine/cancel.py)
        self.pool.close()
        if self.fallback is not None:
            self.fallback.close()
        self.figures.close()


def _other_model(model: str | None) -> str:
    return (f", and the pages read then were another model's ({model})" if model
            else ", and the outputs do not say which model read the pages then")


def _pages_said(pages: str) -> str:
    """'page 3', 'pages 2-5, 9' (failed pages as outputs record them)."""
    return f"page {pages}" if pages.isdigit() else f"pages {pages.replace(',', ', ')}"
