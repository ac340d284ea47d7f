"""The text-layer fallback: a PDF page whose OCR failed (every attempt) takes the PDF's own text
layer, when it has one, instead of leaving a hole. The page stays counted as failed (its error is
kept, so the run still says what went wrong); its result gets finish_reason "text-layer", which
the Markdown marks `<!-- page N text-layer: reason -->` and JSONL as `"source": "text-layer"`.

The text is read by PDFium, so in a crash-proof render worker of its own (started on first use:
a night where every page reads well never starts it).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

from .render import text_layer
from .render_pool import RenderPool
from .types import TEXT_LAYER, PageResult


class TextLayerFallback:
    def __init__(self, password: str | None, timeout: float | None, start_method: str | None = None):
        self.password, self.timeout, self.start_method = password, timeout, start_method
        self.pool: RenderPool | None = None

    def apply(self, results: Sequence[PageResult], stop: threading.Event | None = None) -> list[PageResult]:
        """`results` with every failed PDF page that has a text layer replaced by it."""
        wanted = [r for r in results if r.error is not None and not r.from_text_layer and r.doc.kind == "pdf"]
        if not wanted:
            return list(results)
        if self.pool is None:
            self.pool = RenderPool(workers=1, timeout=self.timeout, start_method=self.start_method)
        found: dict[tuple[str, int], str] = {}
        items = [(r.doc, r.page - 1, self.password) for r in wanted]
        for outcome in self.pool.imap(text_layer, items, stop or threading.Event()):
            if outcome.error is None and outcome.value:
                r = wanted[outcome.index]
                found[(r.doc.doc_id, r.page)] = outcome.value
        return [dataclasses.replace(r, text=found[(r.doc.doc_id, r.page)], finish_reason=TEXT_LAYER)
                if (r.doc.doc_id, r.page) in found else r for r in results]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
