"""The contract between the pipeline, the engine and the CLI: protocols and plain data.

The engine implements `PageEngine` / `Seq`; the CLI builds `PipelineOptions` (declared in the
options table, options.py) and reads `RunSummary`. Nothing here does work, so every module can
import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, runtime_checkable

from PIL import Image

from ..engine.models.reader import ReadingHints
from ..errors import ExitCode, path_text, run_exit_code, with_setting
from ..options import FORMATS, MAX_LONGEST_EDGE, SEGMENT_MODES, PipelineOptions, SamplingOptions
from .inputs import Document

STAGES = ("render", "vision", "prefill", "decode")  # keys of PageResult.seconds
TEXT_LAYER = "text-layer"  # finish_reason of a failed page whose text is the PDF's own text layer
MODEL = "model"  # a page's source when the model read it; TEXT_LAYER when its text is the PDF's own
NOT_READ = "not read: the run did not get to this page"  # a page of a document the run left unfinished


@runtime_checkable
class Seq(Protocol):
    """One page being decoded; owns its decode state (KV cache and position) until it finishes
    or is closed."""

    finished: bool
    finish_reason: str | None  # "eos" | "max_tokens" | "repetition" (| "blank": a page with no text regions)
    n_tokens: int  # generated so far
    prefilling: bool  # part of its prompt is still to be prefilled (start_prefill / prefill_steps)
    # The log-probability of the tokens it chose, the end's included, where its engine scores them
    # (readers of lines: regions.py leaves out blocks read as noise); 0.0 where it does not.
    logprob: float

    def text(self) -> str: ...

    def close(self) -> None:
        """Free its decode state now (idempotent): the page failed, timed out or was abandoned.
        A finished sequence has freed it already."""
        ...


@runtime_checkable
class PageEngine(Protocol):
    """What the pipeline (stages.py) and the benchmarks call, all of it: engines and their wrappers
    (regions.SegmentedEngine, bench.pages.TimedEngine) implement every member."""

    longest_edge: int  # pages are rendered at this longest edge (px)
    hints: ReadingHints  # how the model wants its pages cut (segment mode, line height, ...)
    overlaps: bool  # whether its vision stage pays running beside the CPU stage (PipelineOptions.overlap None)
    # Where its vision stage computes: "cpu" shares the cores with the CPU stage when the two
    # overlap; anything else (a GPU, Core ML) takes none of them (engine/threads.stage_threads).
    vision_device: str
    # The model that reads the pages, as outputs record it (loader.model_identity): pages an
    # unfinished document's outputs hold from another model are read again, not kept beside its own.
    model: str

    def vision(self, image: Image.Image) -> Any:
        """Vision stage: preprocess + encoder + projector. Runs on its own thread, concurrently
        with the CPU stage's calls (which always run on one other thread)."""
        ...

    def vision_many(self, images: list[Image.Image]) -> list[Any]:
        """The vision stage of several images at once (a page's line pieces): their features in
        order. Engines that cannot batch images run them one by one."""
        ...

    def start_prefill(self, features: Any, sampling: SamplingOptions) -> Seq:
        """CPU stage: a new sequence for a page's features, its prompt not yet prefilled; cheap."""
        ...

    def prefill_steps(self, seqs: list[Seq]) -> None:
        """CPU stage: the next chunk of each sequence's prompt; a sequence whose prompt is done
        has chosen its first token (and may be finished already)."""
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
    # the failure is the input's own (a damaged or too small page): reading it again gives the
    # same, so outputs do not record it as one to read again
    lasting: bool = False
    # the failure was for lack of memory (a MemoryError in a stage, a rendered page too big to take
    # in): the run exits 71 (out of resources), not as if its inputs were unreadable
    short_of_memory: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def from_text_layer(self) -> bool:
        """The OCR failed (`error` says why) and `text` is the PDF's own text layer instead."""
        return self.finish_reason == TEXT_LAYER

    @property
    def source(self) -> str:
        """Where the text came from, as the JSONL and the API's Page say it: MODEL or TEXT_LAYER."""
        return TEXT_LAYER if self.from_text_layer else MODEL


@dataclass(frozen=True)
class PageFailure:
    path: str
    page: int | None  # 1-based; None = the whole document (cannot be opened, cannot be written)
    reason: str
    short_of_memory: bool = False  # PageResult.short_of_memory
    option: str | None = None  # the setting that would mend it (InputError.option), named by said()

    def __str__(self) -> str:
        return self.said()

    def said(self, name_of: Callable[[str], str] | None = None) -> str:
        """`path page N: reason`, with the setting that would mend it as `name_of` names it (the
        CLI: its flag) or as the options table does."""
        return f"{path_text(self.path)}{'' if self.page is None else f' page {self.page}'}: " \
               f"{with_setting(self.reason, self.option, name_of)}"


# The note of a document none of whose selected pages exists: it was readable, so the run's exit
# code is 1 (some failed), not 4 (nothing could be read).
NO_SELECTED_PAGE = "none of the selected pages exists"
# The note of a document skipped because its outputs are there from an earlier run
OUTPUTS_EXIST = "outputs exist"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, where the command line maps it) stopped a run: raised after the
    documents finished before it are written; `summary` is the RunSummary of what was done. A
    KeyboardInterrupt, so a caller that does not care stops as on any other Ctrl-C."""

    def __init__(self, summary: "RunSummary"):
        super().__init__("interrupted")
        self.summary = summary


# unwritten = its outputs could not be written (exit code 73): its pages were read, or were not read
# because a link or a file stood where its outputs go (pipeline/run.py: _planted)
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
    """Where a run is, sent at least twice a second while it works and after every page."""

    pages_done: int  # finished pages, failed ones included
    pages_total: int
    pages_failed: int
    tokens: int  # generated so far, the pages still decoding included
    docs_done: int
    docs_total: int
    elapsed: float  # seconds since the run started
    rendered: int = 0  # pages through each stage so far
    encoded: int = 0
    prefilled: int = 0
    decoding: int = 0  # pages decoding now
    finished: tuple = ()  # DocumentOutcomes finished since the previous Progress
    reading_since: float = 0.0  # of elapsed: when planning ended (files hashed, pages counted) and pages began
    done_before_reading: int = 0  # of pages_done: those done by then (--text-layer prefer's), no part of the pace


@dataclass(frozen=True)
class RunSummary:
    documents: tuple[DocumentOutcome, ...]  # in input order
    interrupted: bool = False
    pages_done: int = 0
    tokens: int = 0
    seconds: float = 0.0
    unreadable: tuple[PageFailure, ...] = ()  # input paths that never became documents (missing, FIFO, ...)
    pages_cut: int = 0  # pages (or a line of them) that stopped at max_tokens: their text is cut short
    pages_failed: int = 0  # of pages_done: failed in the pipeline (before any text layer stood in)
    pages_from_text_layer: int = 0  # of pages_done: kept from the PDF's text layer (--text-layer prefer)
    pages_kept: int = 0  # not in pages_done: pages of documents written again for their failed pages, kept as they were

    @property
    def failed_pages(self) -> list[PageFailure]:
        return list(self.unreadable) + [f for d in self.documents for f in d.failures]

    @property
    def exit_code(self) -> ExitCode:
        # a document skipped for its outputs already there was read before: with it, something is fine
        wrote = any(d.status in ("written", "partial", "skipped") or d.note == NO_SELECTED_PAGE for d in self.documents)
        unwritten = any(d.status == "unwritten" for d in self.documents)
        memory = any(f.short_of_memory for d in self.documents for f in d.failures)
        return run_exit_code(self.interrupted, bool(self.failed_pages), wrote, unwritten, memory)


__all__ = ["FORMATS", "MAX_LONGEST_EDGE", "NO_SELECTED_PAGE", "SEGMENT_MODES", "STAGES", "TEXT_LAYER", "DocStatus", "DocumentOutcome",
           "PageEngine", "PageFailure", "PageResult", "PageTask", "PipelineOptions", "Progress", "RunSummary", "Seq"]
