"""The contract between the pipeline, the engine and the CLI: protocols and plain data.

The engine implements `PageEngine` / `Seq`; the CLI builds `PipelineOptions` and reads
`RunSummary`. Nothing here does work, so every module can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from PIL import Image

from ..engine.sampling import SamplingOptions
from ..errors import ExitCode, UsageError, path_text, run_exit_code
from .inputs import Document

FORMATS = ("md", "jsonl", "txt")
STAGES = ("render", "vision", "prefill", "decode")  # keys of PageResult.seconds
MAX_LONGEST_EDGE = 10000  # px: a page rendered larger is hundreds of MB and tens of thousands of image tokens
TEXT_LAYER = "text-layer"  # finish_reason of a failed page whose text is the PDF's own text layer


@runtime_checkable
class Seq(Protocol):
    """One page being decoded; owns its KV cache and position."""

    finished: bool
    finish_reason: str | None  # "eos" | "max_tokens" | "repetition"
    n_tokens: int  # generated tokens so far

    def text(self) -> str: ...


@runtime_checkable
class PageEngine(Protocol):
    longest_edge: int  # render target, 1540 for LightOnOCR

    def vision(self, image: Image.Image) -> Any:
        """Vision stage: preprocess + encoder + projector. Runs on its own thread, concurrently
        with prefill/decode_step (which always run on one other thread)."""
        ...

    def prefill(self, features: Any, sampling: SamplingOptions) -> Seq:
        """CPU stage: prompt + image features -> a new sequence (may already be finished)."""
        ...

    def decode_step(self, seqs: list[Seq]) -> None:
        """CPU stage: advance every unfinished seq by one token with one batched forward."""
        ...


@dataclass(frozen=True)
class PageTask:
    doc: Document
    page_index: int  # 0-based
    n_pages: int  # pages in the document (not only the selected ones)
    # None: the run's PipelineOptions.sampling. Archive jobs retry a looping page with a
    # changed setting (higher temperature, new seed), so sampling can differ per page.
    sampling: SamplingOptions | None = None

    @property
    def page(self) -> int:  # 1-based, for people and files
        return self.page_index + 1


@dataclass(frozen=True)
class PageResult:
    doc: Document
    page: int  # 1-based page number
    text: str
    n_tokens: int
    finish_reason: str | None  # None when the page failed
    error: str | None  # why the page failed; None on success
    seconds: dict[str, float] = field(default_factory=dict)  # STAGES -> wall seconds
    figures: tuple = ()  # figures.Figure: image regions a bbox model found, cropped (set when writing)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def from_text_layer(self) -> bool:
        """The OCR failed (`error` says why) and `text` is the PDF's own text layer instead."""
        return self.finish_reason == TEXT_LAYER


SEGMENT_MODES = ("page", "blocks", "lines")


@dataclass(frozen=True)
class PipelineOptions:
    out_dir: Path
    formats: tuple[str, ...] = ("md",)  # the first one is written last: its presence = done
    page_files: bool = False  # also <stem>/page-0001.md per page
    overwrite: bool = False  # else documents whose outputs exist are skipped
    pages: str | None = None  # '1-3,7' applied to every document (clipped to its length)
    password: str | None = None  # for encrypted PDFs; ignored by others
    sampling: SamplingOptions = SamplingOptions()
    batch_size: int = 4  # sequences decoded together
    overlap: bool = True  # vision on its own thread; False = vision then CPU, per page
    render_workers: int = 2
    render_timeout: float | None = 120.0  # seconds before a stuck render is killed
    page_timeout: float | None = None  # engine seconds per page (vision + prefill + decode), then it fails: "timeout"
    text_fallback: bool = True  # a PDF page whose OCR failed takes the PDF's own text layer, if it has one
    render_queue: int = 4  # rendered pages waiting for the vision stage
    features_queue: int = 2  # encoded pages waiting for a decode slot
    longest_edge: int | None = None  # None: the engine's
    # page: the model reads whole pages; blocks / lines: pages are cut into text regions, each
    # read as its own sequence (regions.py). None: what the model's GGUF asks for.
    segment: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "formats", tuple(self.formats))
        bad = [f for f in self.formats if f not in FORMATS]
        if bad or not self.formats or len(set(self.formats)) != len(self.formats):
            raise UsageError(f"output formats must be distinct values of {', '.join(FORMATS)} (got {', '.join(self.formats)})")
        for name in ("batch_size", "render_workers", "render_queue", "features_queue"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.page_timeout is not None and not 0 < self.page_timeout < float("inf"):
            raise UsageError(f"page_timeout must be a positive number of seconds (got {self.page_timeout})")
        if self.longest_edge is not None and self.longest_edge > MAX_LONGEST_EDGE:
            raise UsageError(f"longest_edge must be at most {MAX_LONGEST_EDGE} px (got {self.longest_edge})")
        if self.longest_edge is not None and self.longest_edge < 64:
            raise UsageError(f"longest_edge must be at least 64 px (got {self.longest_edge})")
        if self.segment is not None and self.segment not in SEGMENT_MODES:
            raise UsageError(f"segment must be one of {', '.join(SEGMENT_MODES)} (got {self.segment})")


@dataclass(frozen=True)
class PageFailure:
    path: str
    page: int | None  # 1-based; None = the whole document (cannot be opened, cannot be written)
    reason: str

    def __str__(self) -> str:
        return f"{path_text(self.path)}{'' if self.page is None else f' page {self.page}'}: {self.reason}"


# unwritten = its pages were read but its outputs could not be written (exit code 73)
DocStatus = Literal["written", "partial", "skipped", "failed", "interrupted", "unwritten"]


@dataclass(frozen=True)
class DocumentOutcome:
    doc: Document
    status: DocStatus  # partial = written, with some pages marked failed
    outputs: tuple[Path, ...] = ()  # written (or, when skipped, already present) files
    n_pages: int = 0  # pages selected for OCR
    failures: tuple[PageFailure, ...] = ()
    note: str = ""  # e.g. why it was skipped


@dataclass(frozen=True)
class Progress:
    pages_done: int  # finished pages, failed ones included
    pages_total: int
    pages_failed: int
    tokens: int  # generated so far
    docs_done: int
    docs_total: int
    elapsed: float  # seconds since the run started


@dataclass(frozen=True)
class RunSummary:
    documents: tuple[DocumentOutcome, ...]  # in input order
    interrupted: bool = False
    pages_done: int = 0
    tokens: int = 0
    seconds: float = 0.0
    unreadable: tuple[PageFailure, ...] = ()  # input paths that never became documents (missing, FIFO, ...)

    @property
    def failed_pages(self) -> list[PageFailure]:
        return list(self.unreadable) + [f for d in self.documents for f in d.failures]

    @property
    def exit_code(self) -> ExitCode:
        wrote = any(d.status in ("written", "partial") for d in self.documents)
        unwritten = any(d.status == "unwritten" for d in self.documents)
        return run_exit_code(self.interrupted, bool(self.failed_pages), wrote, unwritten)
