"""The recipe: plan -> render -> vision stage -> CPU stage -> write.

    main thread      plan (skip done documents, count pages in a worker), then collect + write
    feeder thread    RenderPool.imap(render_page) in page order           -> render_q (bounded)
    vision thread    engine.vision(image)                                -> features_q (bounded)
    cpu thread       prefill + batched decode_step, continuous batching  -> result_q
    main thread      assembles documents; writes each atomically as soon as all its pages are in

Memory is bounded by the queue sizes, not by document length: at most `2 * render_workers`
pages inside the render pool, `render_queue` rendered pages, one image in the vision stage,
`features_queue` encoded pages and `batch_size` live sequences. Only the page texts of
unfinished documents accumulate.

Failures are per page: a render error, a crashed render worker, or an exception in vision,
prefill or a decode step turns the page(s) concerned into failed PageResults; the run goes on.
Ctrl-C (KeyboardInterrupt, delivered to the main thread) sets `stop`: every stage returns
within ~0.1 s of its current engine call, render workers are ended, documents already written
stay written, unfinished ones write nothing; run_pipeline then returns with `interrupted=True`
(exit code 130) rather than raising, so the caller can still report what was done.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .outputs import OutputPaths, plan_output_paths, write_document
from .types import (
    STAGES,
    DocumentOutcome,
    PageEngine,
    PageFailure,
    PageResult,
    PageTask,
    PipelineOptions,
    Progress,
    RunSummary,
)
from .inputs import Document, parse_pages, validate_page_spec
from .render import DEFAULT_LONGEST_EDGE, count_pages, render_page
from .render_pool import RenderPool

_END = object()  # end of a stage's stream
_POLL = 0.1  # seconds: how often a blocked stage looks at `stop`


@dataclass
class _Page:
    """A page on its way through the stages; `payload` is the image, then the features."""

    task: PageTask
    payload: Any
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))


@dataclass
class _Active:
    page: _Page
    seq: Any
    steps: int = 0


class _StageCrashed(Exception):
    """A bug in a stage thread itself (not a page failure): re-raised in the main thread."""


@dataclass
class _DocState:
    doc: Document
    paths: OutputPaths
    expected: int
    results: list[PageResult] = field(default_factory=list)


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
) -> RunSummary:
    """OCR `documents` with `engine` and write the outputs; see the module docstring.
    `on_progress` is called from the calling thread after planning and after every page.
    `render_fn` (same signature as render_page, picklable) is a fault-injection hook for tests.

    For callers that keep their own state (archive jobs): `tasks` runs exactly these pages
    (no skipping of existing outputs, no page counting; `documents` without a task are reported
    skipped); `on_page` is called from the calling thread with each PageResult as it arrives,
    before its document is finished; `write_outputs=False` writes no files (statuses still say
    whether each document came out complete, partial or failed)."""
    validate_page_spec(options.pages)  # a bad spec fails before any work
    return _Run(documents, engine, options, on_progress, render_fn, start_method, tasks, on_page, write_outputs).execute()


class _Run:
    def __init__(
        self, documents, engine, options, on_progress, render_fn, start_method, tasks=None, on_page=None, write_outputs=True
    ) -> None:
        unique: dict[str, Document] = {}
        for doc in documents:
            unique.setdefault(doc.doc_id, doc)
        self.documents = list(unique.values())
        self.engine = engine
        self.options = options
        self.on_progress = on_progress
        self.render_fn = render_fn
        self.explicit_tasks = None if tasks is None else list(tasks)
        self.on_page = on_page
        self.write_outputs = write_outputs
        self.edge = options.longest_edge or getattr(engine, "longest_edge", None) or DEFAULT_LONGEST_EDGE
        self.paths = plan_output_paths(self.documents, options.out_dir)
        self.pool = RenderPool(
            workers=options.render_workers, timeout=options.render_timeout, start_method=start_method
        )
        self.stop = threading.Event()
        self.render_q: queue.Queue = queue.Queue(maxsize=options.render_queue)
        self.features_q: queue.Queue = queue.Queue(maxsize=options.features_queue)
        self.result_q: queue.Queue = queue.Queue()  # small items (text); drained continuously
        self.outcomes: dict[str, DocumentOutcome] = {}
        self.states: dict[str, _DocState] = {}
        self.tasks: list[PageTask] = []
        self.pages_done = self.pages_failed = self.tokens = 0
        self.t0 = time.perf_counter()
        self.threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- main thread

    def execute(self) -> RunSummary:
        interrupted = False
        try:
            self._plan()
            self._progress()
            if self.tasks:
                self._start_threads()
                self._collect()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self._shutdown()
        for doc in self.documents:
            if doc.doc_id not in self.outcomes:
                state = self.states.get(doc.doc_id)
                self.outcomes[doc.doc_id] = DocumentOutcome(
                    doc, "interrupted", n_pages=state.expected if state else 0, note="stopped before it was complete"
                )
        return RunSummary(
            documents=tuple(self.outcomes[d.doc_id] for d in self.documents),
            interrupted=interrupted,
            pages_done=self.pages_done,
            tokens=self.tokens,
            seconds=time.perf_counter() - self.t0,
        )

    def _plan(self) -> None:
        if self.explicit_tasks is not None:
            self._plan_tasks(self.explicit_tasks)
            return
        opts = self.options
        to_open = []
        for doc in self.documents:
            paths = self.paths[doc.doc_id]
            if not opts.overwrite and paths.exist(opts.formats):
                self.outcomes[doc.doc_id] = DocumentOutcome(
                    doc, "skipped", outputs=tuple(paths.documents(opts.formats)), note="outputs exist"
                )
            else:
                to_open.append(doc)
        # Opening a PDF runs PDFium, so it happens in a worker too.
        counts = self.pool.imap(count_pages, [(doc, opts.password) for doc in to_open], self.stop) if to_open else ()
        for outcome in counts:
            doc = to_open[outcome.index]
            if outcome.error is not None:
                reason = getattr(outcome.error, "problem", str(outcome.error))
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", failures=(PageFailure(str(doc.path), None, reason),))
                continue
            n_pages = outcome.value
            pages = parse_pages(opts.pages, n_pages, clip=True)
            if not pages:
                self.outcomes[doc.doc_id] = DocumentOutcome(
                    doc, "skipped", note=f"no selected pages (the document has {n_pages})"
                )
                continue
            self.states[doc.doc_id] = _DocState(doc, self.paths[doc.doc_id], expected=len(pages))
            self.tasks += [PageTask(doc, i, n_pages) for i in pages]

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
                state = self.states[task.doc.doc_id] = _DocState(task.doc, self.paths[task.doc.doc_id], 0)
            state.expected += 1
            self.tasks.append(task)
        for doc in self.documents:
            if doc.doc_id not in self.states:
                self.outcomes[doc.doc_id] = DocumentOutcome(doc, "skipped", note="no pages to run")

    def _start_threads(self) -> None:
        stages = [("feeder", self._feed), ("cpu", self._cpu_loop)]
        if self.options.overlap:
            stages.insert(1, ("vision", self._vision_loop))
        for name, fn in stages:
            t = threading.Thread(target=self._guard, args=(fn,), name=f"pantheon-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def _collect(self) -> None:
        while self.pages_done < len(self.tasks):
            try:
                item = self.result_q.get(timeout=_POLL)
            except queue.Empty:
                continue
            if isinstance(item, _StageCrashed):
                raise item.__cause__ or item
            self._record(item)

    def _record(self, result: PageResult) -> None:
        self.pages_done += 1
        self.tokens += result.n_tokens
        self.pages_failed += result.error is not None
        if self.on_page is not None:
            self.on_page(result)
        state = self.states[result.doc.doc_id]
        state.results.append(result)
        if len(state.results) == state.expected:
            self._finish(state)
            del self.states[result.doc.doc_id]
        self._progress()

    def _finish(self, state: _DocState) -> None:
        doc, results = state.doc, sorted(state.results, key=lambda r: r.page)
        failures = tuple(PageFailure(str(doc.path), r.page, r.error) for r in results if r.error is not None)
        if len(failures) == len(results):
            # Nothing readable: write nothing, so that the next run tries the document again.
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", n_pages=len(results), failures=failures)
            return
        if not self.write_outputs:  # the caller writes (see run_pipeline)
            status = "partial" if failures else "written"
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, status, (), len(results), failures)
            return
        try:
            written = write_document(state.paths, results, self.options.formats, self.options.page_files)
        except OSError as e:
            failure = PageFailure(str(doc.path), None, f"cannot write the output: {e.strerror or e}")
            self.outcomes[doc.doc_id] = DocumentOutcome(doc, "failed", n_pages=len(results), failures=failures + (failure,))
            return
        status = "partial" if failures else "written"
        self.outcomes[doc.doc_id] = DocumentOutcome(doc, status, tuple(written), len(results), failures)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(
                Progress(
                    pages_done=self.pages_done,
                    pages_total=len(self.tasks),
                    pages_failed=self.pages_failed,
                    tokens=self.tokens,
                    docs_done=len(self.outcomes),
                    docs_total=len(self.documents),
                    elapsed=time.perf_counter() - self.t0,
                )
            )

    def _shutdown(self) -> None:
        self.stop.set()
        for t in self.threads:
            # Stages notice `stop` within _POLL once their current engine call returns; the
            # threads are daemons, so an engine call that never returns cannot block exit.
            t.join(timeout=10.0)
        self.pool.close()

    # --------------------------------------------------------------- stage threads

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - report to the main thread, never vanish
            self.stop.set()
            crash = _StageCrashed(f"{threading.current_thread().name}: {type(e).__name__}: {e}")
            crash.__cause__ = e
            self.result_q.put(crash)

    def _put(self, q: queue.Queue, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                pass
        return False

    def _get(self, q: queue.Queue, block: bool = True) -> Any:
        """The next item; None when `stop` is set, or at once when not blocking and empty."""
        while not self.stop.is_set():
            try:
                return q.get(timeout=_POLL) if block else q.get_nowait()
            except queue.Empty:
                if not block:
                    return None
        return None

    def _fail(self, page: _Page, reason: str) -> None:
        page.payload = None
        self.result_q.put(PageResult(page.task.doc, page.task.page, "", 0, None, reason, page.seconds))

    def _feed(self) -> None:
        items = ((t.doc, t.page_index, self.edge, self.options.password) for t in self.tasks)
        for outcome in self.pool.imap(self.render_fn, items, self.stop):
            page = _Page(self.tasks[outcome.index], outcome.value)
            page.seconds["render"] = outcome.seconds
            if outcome.error is not None:
                self._fail(page, getattr(outcome.error, "problem", str(outcome.error)))
            elif not self._put(self.render_q, page):
                return
        self._put(self.render_q, _END)

    def _vision(self, page: _Page) -> bool:
        t0 = time.perf_counter()
        try:
            page.payload = self.engine.vision(page.payload)
        except Exception as e:  # noqa: BLE001 - one page's failure
            page.seconds["vision"] = time.perf_counter() - t0
            self._fail(page, f"vision stage failed: {type(e).__name__}: {e}")
            return False
        page.seconds["vision"] = time.perf_counter() - t0
        return True

    def _vision_loop(self) -> None:
        while True:
            page = self._get(self.render_q)
            if page is None:
                return
            if page is _END:
                self._put(self.features_q, _END)
                return
            if self._vision(page) and not self._put(self.features_q, page):
                return

    def _cpu_loop(self) -> None:
        """Continuous batching: keep up to batch_size sequences; a page joins as soon as its
        prefill is done and a slot is free, and leaves as soon as it is finished."""
        source = self.features_q if self.options.overlap else self.render_q
        active: list[_Active] = []
        upstream_done = False
        while not self.stop.is_set():
            while len(active) < self.options.batch_size and not upstream_done:
                page = self._get(source, block=not active)
                if page is None:
                    break
                if page is _END:
                    upstream_done = True
                    break
                if not self.options.overlap and not self._vision(page):
                    continue
                sampling = page.task.sampling or self.options.sampling
                t0 = time.perf_counter()
                try:
                    seq = self.engine.prefill(page.payload, sampling)
                except Exception as e:  # noqa: BLE001
                    page.seconds["prefill"] = time.perf_counter() - t0
                    self._fail(page, f"prefill failed: {type(e).__name__}: {e}")
                    continue
                page.seconds["prefill"] = time.perf_counter() - t0
                page.payload = None  # the features live on in the KV cache only
                slot = _Active(page, seq)
                if seq.finished:
                    self._emit(slot)
                else:
                    active.append(slot)
            if not active:
                if upstream_done:
                    return
                continue
            t0 = time.perf_counter()
            try:
                self.engine.decode_step([a.seq for a in active])
            except Exception as e:  # noqa: BLE001 - cannot tell which page: fail this batch
                for a in active:
                    self._fail(a.page, f"decode step failed: {type(e).__name__}: {e}")
                active = []
                continue
            dt = time.perf_counter() - t0
            still = []
            for a in active:
                a.page.seconds["decode"] += dt  # wall time of the steps it took part in
                a.steps += 1
                if a.seq.finished:
                    self._emit(a)
                elif a.steps > (a.page.task.sampling or self.options.sampling).max_tokens + 8:
                    self._fail(a.page, f"the engine did not stop the sequence after {a.steps} steps")
                else:
                    still.append(a)
            active = still

    def _emit(self, a: _Active) -> None:
        try:
            text = a.seq.text()
        except Exception as e:  # noqa: BLE001
            self._fail(a.page, f"detokenizing failed: {type(e).__name__}: {e}")
            return
        task = a.page.task
        self.result_q.put(PageResult(task.doc, task.page, text, a.seq.n_tokens, a.seq.finish_reason, None, a.page.seconds))
