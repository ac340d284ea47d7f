"""Pages read back from a document's own outputs, so that they are not read again.

Two callers: `transcribe` reads again only the pages a document's outputs record as failed, and
keeps the others as they are (run.py); `archive run --rebuild-state` records as done every page
the outputs still hold (archive/rebuild.py). The JSONL is read when there is one (the model's
exact text, tokens, finish reason and seconds), else the Markdown (the text as written, between
its page markers). Only pages OCR'd whole come back: not failed ones, not those from the text
layer (judged again by the run's own --text-layer), and from the Markdown not those linking
image crops (figures.py): their coordinates are gone, and a rewrite would take the crops for
stale ones; they are read again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Sequence

from .naming import OutputPaths
from .outputs import unescape_markers

_MARKER = re.compile(r"^<!-- page (\d+)(?: (stopped|failed|text-layer)(?:: (.*))?)? -->$")
_CROP_LINK = re.compile(r"!\[image\]\([^)\n]*_images/p\d+_\d+\.png\)")


@dataclass(frozen=True)
class KeptPage:
    """A page as its outputs hold it."""

    text: str
    n_tokens: int  # 0 from the Markdown, which does not record them
    finish_reason: str | None
    seconds: dict = field(default_factory=dict)  # per stage, from the JSONL


def read_pages(paths: OutputPaths, formats: Sequence[str]) -> dict[int, KeptPage]:
    """page -> KeptPage for the intact pages of a document's outputs; {} when they cannot be
    read or parsed (then every page is read again)."""
    try:
        if "jsonl" in formats:
            return from_jsonl(paths.file("jsonl").read_text(encoding="utf-8"))
        if "md" in formats:
            return from_markdown(paths.file("md").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # a damaged or hand-edited file: nothing is kept from it
    return {}


def from_jsonl(text: str) -> dict[int, KeptPage]:
    pages = {}
    for line in text.splitlines():
        rec = json.loads(line)
        if rec.get("error") is None and rec.get("source", "model") == "model" and isinstance(rec.get("page"), int):
            seconds = rec.get("seconds")
            pages[rec["page"]] = KeptPage(str(rec.get("text", "")), int(rec.get("n_tokens") or 0), rec.get("finish_reason"),
                                          dict(seconds) if isinstance(seconds, dict) else {})
    return pages


def from_markdown(text: str) -> dict[int, KeptPage]:
    pages: dict[int, KeptPage] = {}
    current: tuple[int, str | None] | None = None
    lines: list[str] = []

    def close() -> None:
        if current is not None:
            # outputs written before the escape (2026-12) had no backslashes to undo: a page line of
            # theirs that began with "\<!-- page " loses one, a line no reader of OCR text will meet
            page_text = unescape_markers("\n".join(lines).strip("\n"))
            if not _CROP_LINK.search(page_text):
                pages[current[0]] = KeptPage(page_text, 0, current[1])

    for line in text.split("\n")[1:]:  # the first line is the source record
        m = _MARKER.match(line)
        if m is None:
            lines.append(line)
            continue
        close()
        kind = m.group(2)
        current = None if kind in ("failed", "text-layer") else (int(m.group(1)), m.group(3) if kind == "stopped" else "eos")
        lines = []
    close()
    return pages
