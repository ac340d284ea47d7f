"""The stage threads of one pipeline run, connected by bounded queues:

    feeder thread    RenderPool.imap(render_fn) in page order              -> render_q (bounded)
    vision thread    engine.vision(image)                                  -> features_q (bounded)
                     (with overlap; else the cpu thread runs each page's vision, every core in turn)
    cpu thread       prefill + batched decode_step, continuous batching    -> results

Every task ends as exactly one PageResult in `results` (failed pages included); a bug in a stage
thread itself arrives there as StageCrashed. Each blocked stage looks at `stop` every POLL
seconds, and engine calls run under `cancel_on(stop)`: a stop takes effect between two layers of
the current call (engine/cancel.py), and the interrupted pages are abandoned, never written.
`counts` says how many pages each stage has passed, for the progress display.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..engine.cancel import Cancelled, cancel_on
from ..engine.threads import adopt_threads, restage, stage_share
from ..errors import InputError
from .render_pool import RenderPool, WorkerError
from .types import STAGES, PageEngine, PageResult, PageTask, PipelineOptions, Seq

log = logging.getLogger("pantheon_ocr.pipeline")
END = object()  # end of a stage's stream
POLL = 0.1  # seconds: how often a blocked stage looks at `stop`


@dataclass
class _Page:
    """A page on its way through the stages; `payload` is the image, then the features."""

    task: PageTask
    payload: Any
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    held: bool = False  # handed to the CPU stage and not yet ended there (Stages._held counts these)


@dataclass
class _Active:
    page: _Page
    seq: Seq | None
    steps: int = 0


class StageCrashed(Exception):
    """A bug in a stage thread itself (not a page failure): re-raised in the main thread."""


class Stages:
    """Feeder, vision and CPU threads over `tasks`; see the module docstring."""

    def __init__(self, engine: PageEngine, options: PipelineOptions, pool: RenderPool, render_fn: Callable[..., Any],
                 edge: int, tasks: Sequence[PageTask], stop: threading.Event):
        self.engine, self.options, self.pool, self.render_fn = engine, options, pool, render_fn
        self.edge, self.tasks, self.stop = edge, tasks, stop
        # the vision stage on its own thread: as asked, else where the engine says it pays
        self.overlap = engine.overlaps if options.overlap is None else options.overlap
        self.render_q: queue.Queue = queue.Queue(maxsize=options.render_queue)
        self.features_q: queue.Queue = queue.Queue(maxsize=options.features_queue)
        self.results: queue.Queue = queue.Queue()  # small items (text); drained continuously
        self.threads: list[threading.Thread] = []
        # pages past each stage, and the pages decoding now with the tokens they hold (read by the
        # main thread for progress; each written by one stage thread)
        self.counts = {"rendered": 0, "encoded": 0, "prefilled": 0, "decoding": 0, "live_tokens": 0}
        # pages the CPU stage holds (queued for it, prefilling or decoding): with none, the vision
        # stage may take every core for its next page (engine/threads.stage_share)
        self._held = 0
        self._held_lock = threading.Lock()
        self._vision_done = False  # the vision stage has passed its last page: the CPU stage may take every core

    def start(self) -> None:
        restage(self.overlap, self.engine.vision_device == "cpu")  # a plan made before the engine chose, made again
        stages = [("feeder", self._feed), ("cpu", self._cpu_loop)]
        if self.overlap:
            stages.insert(1, ("vision", self._vision_loop))
        for name, fn in stages:
            t = threading.Thread(target=self._guard, args=(fn,), name=f"pantheon-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout: float = 10.0) -> None:
        """After `stop` is set: stages notice it within POLL, or at the next layer of the engine
        call under way; the threads are daemons, so a call that never returns cannot block exit."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _guard(self, fn: Callable[[], None]) -> None:
        adopt_threads()  # a new thread: torch's and OpenMP's counts are per thread
        try:
            with cancel_on(self.stop):
                fn()
        except Cancelled:
            return  # the run was stopped during an engine call: that page is abandoned
        except BaseException as e:  # noqa: BLE001 - report to the main thread, never vanish
            self.stop.set()
            crash = StageCrashed(f"{threading.current_thread().name}: {type(e).__name__}: {e}")
            crash.__cause__ = e
            self.results.put(crash)

    def _put(self, q: queue.Queue, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=POLL)
                return True
            except queue.Full:
                pass
        return False

    def _get(self, q: queue.Queue, block: bool = True) -> Any:
        """The next item; None when `stop` is set, or at once when not blocking and empty."""
        while not self.stop.is_set():
            try:
                return q.get(timeout=POLL) if block else q.get_nowait()
            except queue.Empty:
                if not block:
                    return None
        return None

    def _late(self, page: _Page) -> bool:
        """Past the page timeout (engine seconds: vision + prefill + decode)? Then fail it with
        reason "timeout". Checked after each engine call returns: a call is never interrupted,
        so a page can overrun by one vision or prefill call, or by one decode step."""
        limit = self.options.page_timeout
        s = page.seconds
        if limit is None or s["vision"] + s["prefill"] + s["decode"] <= limit:
            return False
        # the stages it went through (a page stopped after vision never ran prefill or decode)
        spent = ", ".join(f"{stage} {s[stage]:.{1 if s[stage] >= 1 else 2}f} s"
                          for stage in ("vision", "prefill", "decode") if s[stage] > 0)
        self._fail(page, f"timeout: the page took longer than {limit:g} s ({spent})")
        return True

    def _hand_over(self, page: _Page) -> bool:
        """Vision thread: the page goes to the CPU stage."""
        with self._held_lock:
            self._held += 1
        page.held = True
        return self._put(self.features_q, page)

    def _ended(self, page: _Page) -> None:
        if page.held:
            page.held = False
            with self._held_lock:
                self._held -= 1

    def _fail(self, page: _Page, reason: str, lasting: bool = False, short_of_memory: bool = False) -> None:
        self._ended(page)
        page.payload = None
        self.results.put(PageResult(page.task.doc, page.task.page, "", 0, None, reason, page.seconds, lasting=lasting,
                                    short_of_memory=short_of_memory))

    def _failed_with(self, page: _Page, what: str, e: Exception) -> None:
        """A page failed by an exception of the engine: its reason names it; the traceback goes to
        the log (`-v` shows it), since such a failure is most often a bug to report. Running out
        of memory is no bug: said as that, and the run exits 71."""
        log.debug("page %s of %s: %s", page.task.page, page.task.doc.path, what, exc_info=e)
        # torch's OutOfMemoryError (CUDA, MPS) is a RuntimeError: known by name, torch not imported here
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
            self._fail(page, f"{what}: not enough memory ({str(e) or 'MemoryError'}): read fewer pages at once "
                             "(a smaller batch), or give the run more memory", short_of_memory=True)
            return
        self._fail(page, f"{what}: {type(e).__name__}: {e}")

    def _feed(self) -> None:
        items = ((t.doc, t.page_index, self.edge, self.options.password) for t in self.tasks)
        for outcome in self.pool.imap(self.render_fn, items, self.stop):
            page = _Page(self.tasks[outcome.index], outcome.value)
            page.seconds["render"] = outcome.seconds
            if outcome.error is not None:
                # InputError and WorkerError both say it there; the page's own damage lasts
                self._fail(page, outcome.error.problem, lasting=isinstance(outcome.error, InputError) and outcome.error.lasting,
                           short_of_memory=isinstance(outcome.error, WorkerError) and outcome.error.short_of_memory)
                continue
            self.counts["rendered"] += 1
            if not self._put(self.render_q, page):
                return
        self._put(self.render_q, END)

    def _vision(self, page: _Page) -> bool:
        t0 = time.perf_counter()
        try:
            page.payload = self.engine.vision(page.payload)
        except Exception as e:  # noqa: BLE001 - one page's failure
            page.seconds["vision"] = time.perf_counter() - t0
            self._failed_with(page, "vision stage failed", e)
            return False
        page.seconds["vision"] = time.perf_counter() - t0
        self.counts["encoded"] += 1
        return not self._late(page)

    def _vision_loop(self) -> None:
        while True:
            page = self._get(self.render_q)
            if page is None:
                return
            if page is END:
                self._vision_done = True
                self._put(self.features_q, END)
                return
            stage_share(alone=self._held == 0)
            if self._vision(page) and not self._hand_over(page):
                return

    def _cpu_loop(self) -> None:
        """Continuous batching: keep up to batch_size sequences; a page joins as soon as its
        prefill is done and a slot is free, and leaves as soon as it is finished. A joining page's
        prompt goes one chunk (prefill_steps) per decode step, so the pages already decoding never
        wait for a whole prompt."""
        source = self.features_q if self.overlap else self.render_q
        self._active: list[_Active] = []
        self._joining: _Active | None = None  # the page whose prompt is being prefilled
        try:
            self._batching(source)
        finally:  # stopped, cancelled or done: nothing will decode these again
            for a in self._active + ([self._joining] if self._joining is not None else []):
                if a.seq is not None:
                    a.seq.close()
            self.counts["decoding"] = self.counts["live_tokens"] = 0

    def _batching(self, source: queue.Queue) -> None:
        upstream_done = False
        while not self.stop.is_set():
            while len(self._active) < self.options.batch_size and not (upstream_done and self._joining is None):
                if self._joining is None:
                    page = self._get(source, block=not self._active)
                    if page is None:
                        break
                    if page is END:
                        upstream_done = True
                        break
                    if not self.overlap and not self._vision(page):
                        continue
                    self._joining = self._join(page)
                    if self._joining is None:
                        continue
                if not self._prefill_chunk(self._joining):
                    break  # more of its prompt to go: a decode step first
                if self._joining.seq is not None:
                    self.counts["prefilled"] += 1
                    if self._joining.seq.finished:
                        self._emit(self._joining)
                    else:
                        self._active.append(self._joining)
                self._joining = None
            if not self._active:
                if upstream_done and self._joining is None:
                    return
                continue
            self._cpu_share()
            t0 = time.perf_counter()
            try:
                self.engine.decode_step([a.seq for a in self._active])
            except Exception as e:  # noqa: BLE001 - cannot tell which page: fail this batch
                log.debug("a decode step of %d pages failed", len(self._active), exc_info=e)  # once for all
                for a in self._active:
                    a.seq.close()
                    self._fail(a.page, f"decode step failed: {type(e).__name__}: {e}")
                self._active = []
                continue
            dt = time.perf_counter() - t0
            still = []
            for a in self._active:
                a.page.seconds["decode"] += dt  # wall time of the steps it took part in
                a.steps += 1
                if a.seq.finished:
                    self._emit(a)
                elif self._late(a.page):
                    a.seq.close()  # leaves the batch; its KV cache goes with it
                elif a.steps > (a.page.task.sampling or self.options.sampling).max_tokens + 8:
                    a.seq.close()
                    self._fail(a.page, f"the engine did not stop the sequence after {a.steps} steps")
                else:
                    still.append(a)
            self._active = still
            self.counts["decoding"] = len(still)
            self.counts["live_tokens"] = sum(a.seq.n_tokens for a in still)

    def _cpu_share(self) -> None:
        """Before each prefill chunk and decode step: every core once the vision stage is done
        (a page that waited for its features starts its prompt with them, not with half)."""
        if self.overlap:
            stage_share(alone=self._vision_done)

    def _join(self, page: _Page) -> _Active | None:
        """A page's new sequence, its prompt still to prefill."""
        sampling = page.task.sampling or self.options.sampling
        t0 = time.perf_counter()
        try:
            seq = self.engine.start_prefill(page.payload, sampling)
        except Exception as e:  # noqa: BLE001
            page.seconds["prefill"] += time.perf_counter() - t0
            self._failed_with(page, "prefill failed", e)
            return None
        page.seconds["prefill"] += time.perf_counter() - t0
        return _Active(page, seq)

    def _prefill_chunk(self, j: _Active) -> bool:
        """One prefill chunk of a joining page; False while more of its prompt remains. Done
        with j.seq None: the page failed (prefill error or timeout)."""
        page = j.page
        if j.seq.prefilling:
            self._cpu_share()
            t0 = time.perf_counter()
            try:
                self.engine.prefill_steps([j.seq])
            except Exception as e:  # noqa: BLE001
                page.seconds["prefill"] += time.perf_counter() - t0
                j.seq.close()
                self._failed_with(page, "prefill failed", e)
                j.seq = None
                return True
            page.seconds["prefill"] += time.perf_counter() - t0
            if j.seq.prefilling:
                if self._late(page):
                    j.seq.close()
                    j.seq = None
                    return True
                return False
        page.payload = None  # the features live on in the KV cache only
        if not j.seq.finished and self._late(page):
            j.seq.close()
            j.seq = None
        return True

    def _emit(self, a: _Active) -> None:
        self._ended(a.page)
        try:
            text = a.seq.text()
        except Exception as e:  # noqa: BLE001
            self._failed_with(a.page, "detokenizing failed", e)
            return
        task = a.page.task
        self.results.put(PageResult(task.doc, task.page, text, a.seq.n_tokens, a.seq.finish_reason, None, a.page.seconds))
