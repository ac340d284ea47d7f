"""Test doubles for the pipeline: a FakeEngine implementing the PageEngine protocol (and an
archive engine factory over it), marked test PDFs it can "read", and picklable render hooks
that crash or hang a render worker.

The fake engine reads two grey squares that `marked_pdf` draws in the top-left corner of each
page (grey level = 8 x page number, 8 x document number), so its text names the page it saw:
"doc 2 page 3: t0 t1 ...". Any other image reads as doc 0 page 0.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from pantheon_ocr.engine.models.reader import page_hints

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def make_samples_module():
    """scripts/make_samples.py (not a package) loaded as a module, for its PDF writer."""
    name = "pantheon_make_samples"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "make_samples.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def lines_pdf(path: Path, pages: list[list[str]], x: float = 72, top: float = 700, step: float = 16,
              size: float = 11, canvas=None) -> Path:
    """A PDF (made there, folders too) whose page i shows pages[i]'s lines, one under the other,
    in Helvetica with a text layer; `canvas(i)` gives page i's Canvas to draw on first."""
    ms = make_samples_module()
    canvases = []
    for i, lines in enumerate(pages):
        c = canvas(i) if canvas is not None else ms.Canvas()
        for k, line in enumerate(lines):
            c.text(x, top - step * k, line, size=size)
        canvases.append(c)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ms.build_pdf(canvases))
    return path


def marked_pdf(n_pages: int, doc_no: int = 1, size: tuple[float, float] = (612, 792)) -> bytes:
    ms = make_samples_module()
    pages = []
    for i in range(1, n_pages + 1):
        c = ms.Canvas()
        c.rect(0, size[1] - 40, 40, 40, round(8 * i / 255, 4))
        c.rect(40, size[1] - 40, 40, 40, round(8 * doc_no / 255, 4))
        c.text(100, size[1] - 30, f"Document {doc_no}, page {i} of {n_pages}", size=14)
        pages.append(c)
    return ms.build_pdf(pages, size=size)


def read_marks(image: Image.Image) -> tuple[int, int]:
    """(doc, page) from the grey squares; (0, 0) if the image has none."""
    w, h = image.size
    s = max(w, h) / 792  # squares are 40 pt; sample well inside them
    a, b = image.getpixel((int(10 * s), int(10 * s))), image.getpixel((int(50 * s), int(10 * s)))
    if not (a[0] == a[1] == a[2] and b[0] == b[1] == b[2]) or a[0] > 250 or b[0] > 250:
        return 0, 0
    return round(b[0] / 8), round(a[0] / 8)


@dataclass(frozen=True)
class FakeFeatures:
    doc: int
    page: int
    key: str  # digest of the image


class WholePrompt:
    """The prefill half of the PageEngine protocol for test engines that make a finished prompt
    at once with `prefill(features, sampling)`: start_prefill is prefill, and nothing is left to
    prefill in steps."""

    def start_prefill(self, features, sampling):
        return self.prefill(features, sampling)

    def vision_many(self, images):
        return [self.vision(im) for im in images]

    def prefill_steps(self, seqs) -> None:
        assert not any(s.prefilling for s in seqs)


class FakeSeq:
    prefilling = False
    closed = False
    logprob = 0.0  # not scored (Seq.logprob)

    def close(self) -> None:
        self.closed = True

    def __init__(self, features: FakeFeatures, n_target: int, max_tokens: int, loops: bool, loop_limit: int | None):
        self.features = features
        self.n_target = n_target
        self.max_tokens = max_tokens
        self.loops = loops
        self.loop_limit = loop_limit
        self.n_tokens = 0
        self.finished = False
        self.finish_reason: str | None = None
        self._check()

    def _check(self) -> None:
        if self.loops:
            if self.loop_limit is not None and self.n_tokens >= self.loop_limit:
                self.finished, self.finish_reason = True, "repetition"
        elif self.n_tokens >= self.n_target:
            self.finished, self.finish_reason = True, "eos"
        if not self.finished and self.n_tokens >= self.max_tokens:
            self.finished, self.finish_reason = True, "max_tokens"

    def step(self) -> None:
        self.n_tokens += 1
        self._check()

    def text(self) -> str:
        f = self.features
        words = ("loop" if self.loops else f"t{i}" for i in range(self.n_tokens))
        return f"doc {f.doc} page {f.page}: " + " ".join(words)


def _never(f: FakeFeatures) -> bool:
    return False


class FakeEngine(WholePrompt):
    """Deterministic PageEngine. Predicates on FakeFeatures select failing or looping pages;
    `loop_limit` plays the engine's repetition guard (None: loop until max_tokens).
    It records what happened for the tests: batch sizes, per-page threads, time spans."""

    def __init__(
        self,
        longest_edge: int = 1540,
        n_tokens: Callable[[FakeFeatures], int] = lambda f: 3 + f.page % 5,
        fail_vision: Callable[[FakeFeatures], bool] = _never,
        fail_prefill: Callable[[FakeFeatures], bool] = _never,
        loops: Callable[[FakeFeatures], bool] = _never,
        loop_limit: int | None = 12,
        vision_sleep: float = 0.0,
        step_sleep: float = 0.0,
        on_step: Callable[[int], None] | None = None,
        overlaps: bool = True,
        vision_device: str = "cpu",
        model: str = "fake.gguf + fake-mmproj.gguf #0",
    ):
        self.longest_edge = longest_edge
        self.hints = page_hints(longest_edge, 14)
        self.overlaps = overlaps  # what the engine says of overlap (PipelineOptions.overlap None)
        self.vision_device = vision_device  # "cpu": the overlapping stages share the cores
        self.model = model  # as outputs record it
        self.n_tokens = n_tokens
        self.fail_vision, self.fail_prefill, self.loops = fail_vision, fail_prefill, loops
        self.loop_limit = loop_limit
        self.vision_sleep, self.step_sleep = vision_sleep, step_sleep
        self.on_step = on_step
        self.lock = threading.Lock()
        self.batches: list[list[tuple[int, int]]] = []  # (doc, page) of each decode step
        self.vision_spans: list[tuple[float, float, str]] = []
        self.decode_spans: list[tuple[float, float, str]] = []
        self.prefills: list[tuple[int, int]] = []

    def vision(self, image: Image.Image) -> FakeFeatures:
        t0 = time.perf_counter()
        assert image.mode == "RGB" and max(image.size) <= self.longest_edge
        doc, page = read_marks(image)
        f = FakeFeatures(doc, page, hashlib.sha1(image.tobytes()).hexdigest()[:12])
        if self.vision_sleep:
            time.sleep(self.vision_sleep)
        with self.lock:
            self.vision_spans.append((t0, time.perf_counter(), threading.current_thread().name))
        if self.fail_vision(f):
            raise RuntimeError(f"fake vision failure on doc {doc} page {page}")
        return f

    def prefill(self, features: FakeFeatures, sampling) -> FakeSeq:
        if self.fail_prefill(features):
            raise ValueError(f"fake prefill failure on doc {features.doc} page {features.page}")
        with self.lock:
            self.prefills.append((features.doc, features.page))
        return FakeSeq(features, self.n_tokens(features), sampling.max_tokens, self.loops(features), self.loop_limit)

    def decode_step(self, seqs: list[FakeSeq]) -> None:
        t0 = time.perf_counter()
        assert seqs and not any(s.finished for s in seqs)
        if self.step_sleep:
            time.sleep(self.step_sleep)
        for s in seqs:
            s.step()
        with self.lock:
            self.batches.append([(s.features.doc, s.features.page) for s in seqs])
            self.decode_spans.append((t0, time.perf_counter(), threading.current_thread().name))
            n = len(self.batches)
        if self.on_step is not None:
            self.on_step(n)


class WritingSeq(FakeSeq):
    def __init__(self, text: str, *args):
        self._text = text
        super().__init__(*args)

    def text(self) -> str:
        return self._text


class WritingEngine(FakeEngine):
    """FakeEngine whose pages read as `write(features)`: a bbox model's image links, say."""

    def __init__(self, write: Callable[[FakeFeatures], str], **kw):
        super().__init__(**kw)
        self.write = write

    def prefill(self, features: FakeFeatures, sampling) -> FakeSeq:
        return WritingSeq(self.write(features), features, self.n_tokens(features), sampling.max_tokens, False, None)


class SamplingEngine(FakeEngine):
    """FakeEngine whose chosen pages loop while the temperature is below a threshold, so a
    retry with a hotter setting gets out of the loop (or never, without a threshold).
    `loops`: [doc, page] (always loops) or [doc, page, below]."""

    def __init__(self, loops=(), fail_vision=(), **kw):
        failing = {tuple(p) for p in fail_vision}
        super().__init__(fail_vision=lambda f: (f.doc, f.page) in failing, **kw)
        self.loop_below = {(x[0], x[1]): (x[2] if len(x) > 2 else float("inf")) for x in loops}
        self.samplings: list[tuple[int, int, float, int]] = []

    def prefill(self, features, sampling):
        if self.fail_prefill(features):
            raise ValueError(f"fake prefill failure on doc {features.doc} page {features.page}")
        with self.lock:
            self.prefills.append((features.doc, features.page))
            self.samplings.append((features.doc, features.page, sampling.temperature, sampling.seed))
        loops = sampling.temperature < self.loop_below.get((features.doc, features.page), -1.0)
        return FakeSeq(features, self.n_tokens(features), sampling.max_tokens, loops, self.loop_limit)


class EngineFactory:
    """An archive engine factory, () -> (engine, notes), over a SamplingEngine. Picklable by
    reference (module `fake_engine`), so Ray workers build their own."""

    def __init__(self, n_tokens: int | None = None, step_sleep: float = 0.0, loops=(), fail_vision=(), on_step=None,
                 slow_restart: float = 0.0, kills=()):
        self.n_tokens, self.step_sleep, self.loops = n_tokens, step_sleep, loops
        self.fail_vision, self.on_step = fail_vision, on_step
        self.slow_restart = slow_restart  # seconds a worker started after DieOnce's death takes to build
        self.kills = {tuple(p) for p in kills}  # (doc, page): its vision kills the process, every time

    def __call__(self) -> tuple[SamplingEngine, list[str]]:
        if self.slow_restart and isinstance(self.on_step, DieOnce) and os.path.exists(self.on_step.marker):
            time.sleep(self.slow_restart)  # a busy node: Ray says "restarting" meanwhile
        kw = {} if self.n_tokens is None else {"n_tokens": lambda f, n=self.n_tokens: n}
        engine = SamplingEngine(loops=self.loops, fail_vision=self.fail_vision, step_sleep=self.step_sleep,
                                on_step=self.on_step, **kw)
        if self.kills:
            fails = engine.fail_vision
            engine.fail_vision = lambda f: os._exit(9) if (f.doc, f.page) in self.kills else fails(f)
        return engine, []


class DieOnce:
    """An on_step hook that kills the process it runs in (a Ray worker: what the OOM killer or a
    kill -9 does) at its `step`-th decode step, once per marker file; picklable by reference."""

    def __init__(self, marker: str, step: int = 2):
        self.marker, self.step = marker, step

    def __call__(self, n: int) -> None:
        if n == self.step:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
            os._exit(9)


def expected_text(doc: int, page: int, n_tokens: int | None = None) -> str:
    n = 3 + page % 5 if n_tokens is None else n_tokens
    return f"doc {doc} page {page}: " + " ".join(f"t{i}" for i in range(n))


def md_body(path: Path) -> str:
    """An output Markdown file without its first line, the `<!-- pantheon-ocr: {source...} -->`
    record (and the blank line after it); asserts the record is there."""
    text = path.read_text(encoding="utf-8")
    head, sep, rest = text.partition("\n\n")
    assert head.startswith("<!-- pantheon-ocr: {") and head.endswith("} -->") and sep, text[:200]
    return rest


# ----------------------------------------------------------------- render hooks (picklable)


class CrashingRender:
    """render_page, except on the chosen (file name, 0-based page) pairs, where the worker
    dies: "exit" = os._exit, "segv" = SIGSEGV (what a PDFium bug does), "hang" = sleeps."""

    def __init__(self, pages: set[tuple[str, int]], mode: str = "segv"):
        self.pages = set(pages)
        self.mode = mode

    def __call__(self, doc, page_index, longest_edge=1540, password=None):
        if (doc.path.name, page_index) in self.pages:
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.mode == "hang":
                time.sleep(3600)
        from pantheon_ocr.pipeline.render import render_page

        return render_page(doc, page_index, longest_edge, password)


class SlowRender:
    """render_page after a pause (to interrupt a run while workers are busy)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, doc, page_index, longest_edge=1540, password=None):
        time.sleep(self.seconds)
        from pantheon_ocr.pipeline.render import render_page

        return render_page(doc, page_index, longest_edge, password)


def square(x: int) -> int:
    return x * x


def allocate(n):
    """A render task that runs out of memory in its worker when n is odd (a page too big to render)."""
    if n % 2:
        raise MemoryError(f"Unable to allocate {n} GiB")
    return n


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def vm_rss_kb() -> int:
    """Resident set size of this process from /proc (no psutil)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def die_leaving_a_temp_file(signal: int) -> dict:
    """A benchmark child killed mid-run (bench/isolation.py): a temp file made, then the signal."""
    import tempfile

    tempfile.mkstemp(prefix="pantheon-bench-out-")
    os.kill(os.getpid(), signal)
    return {}
