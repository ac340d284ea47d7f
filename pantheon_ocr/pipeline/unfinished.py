"""Documents under way (run.py's DocState), and their unfinished outputs: a document the run does
not finish is written with the pages read so far, the others marked failed (NOT_READ), when the
run stops and every CHECKPOINT_EVERY seconds while it reads it, so that the next run reads only
those (readback.py keeps the rest).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .files import changed_since
from .figures import find_boxes
from .inputs import Document
from .naming import OutputPaths, Source
from .outputs import write_document
from .types import NOT_READ, PageResult, PipelineOptions

CHECKPOINT_EVERY = 300.0  # seconds between two writes of a document under way (a kill loses at most this)


@dataclass
class DocState:
    """A document the run reads: its pages so far, and what of them its outputs hold."""

    doc: Document
    paths: OutputPaths
    expected: int
    results: list[PageResult] = field(default_factory=list)
    stamp: tuple | None = None  # the file as planned (file_stamp): a change while reading fails the document
    changed: str | None = None  # how it changed, once seen
    note: str = ""  # said with its outcome: selected pages it does not have
    kept: int = 0  # of results: pages kept from its outputs (readback.py), counted once they are written again
    pages: list[int] = field(default_factory=list)  # the selected pages, 1-based
    saved_at: float | None = None  # its outputs' last partial write, or its first page's arrival
    saved: int = 0  # results when they were last written partially
    saved_ok: int = 0  # of those, pages with text (the others are read again)
    outputs: tuple = ()  # written partially, so far
    save_error: str = ""  # why its last partial write failed
    # Its outputs are a finished reading (--overwrite reads it again, or another page selection
    # replaces it): a stop or a kill leaves them as they are rather than put a part of the new
    # reading in their place.
    keeps_earlier: bool = False


def save_unfinished(state: DocState, opts: PipelineOptions, source: Source | None, write_outputs: bool = True) -> None:
    """Write a document the run has not finished (module docstring): the pages read so far, the
    others marked NOT_READ. Left as it is on disk when nothing new was read since its last
    write, nothing was read at all, it changed meanwhile, the caller writes (archive jobs
    record every page in their state), the outputs are a scratch folder (keep_unfinished), they
    are a finished earlier reading that this run replaces only once whole (keeps_earlier: --overwrite,
    another page selection), or
    none of them can be read back (txt alone records no page: the next run reads it all). A
    page with image regions counts as not read: its crops are made as the document is
    finished, and a stopped run does not wait for them. No page files: the next run needs
    the Markdown or the JSONL only, and a long document's page files took seconds a write."""
    state.saved_at = time.perf_counter()
    doc = state.doc
    read = [r for r in state.results if r.error is not None or not find_boxes(r.text)]
    ok = sum(r.error is None or r.from_text_layer for r in read)
    if not (write_outputs and opts.keep_unfinished and {"md", "jsonl"} & set(opts.formats)) or state.keeps_earlier \
            or len(read) <= state.saved or not ok or changed_since(doc, state.stamp):
        return
    have = {r.page for r in read}
    stand_ins = [PageResult(doc, page, "", 0, None, NOT_READ) for page in state.pages if page not in have]
    try:
        state.outputs = tuple(write_document(state.paths, read + stand_ins, opts.formats, False, source))
    except OSError as e:  # said with its outcome; a later write may still succeed
        state.save_error = e.strerror or str(e)
        return
    state.saved, state.saved_ok, state.save_error = len(read), ok, ""
