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

from .files import open_regular
from .naming import IMAGES_SUFFIX, OutputPaths, header_record
from .outputs import unescape_markers
from .types import MODEL

_MARKER = re.compile(r"^<!-- page (\d+)(?: (stopped|failed|text-layer)(?:: (.*))?)? -->$")
_CROP_LINK = re.compile(r"!\[image\]\([^)\n]*" + re.escape(IMAGES_SUFFIX) + r"/p\d+_\d+\.png\)")  # figures.linked_text's


@dataclass(frozen=True)
class KeptPage:
    """A page as its outputs hold it."""

    text: str
    n_tokens: int  # 0 from the Markdown, which does not record them
    finish_reason: str | None
    seconds: dict = field(default_factory=dict)  # per stage, from the JSONL


MAX_OUTPUT_BYTES = 1 << 30  # a document's outputs larger than this are not read back (a planted file, say)


def read_pages(paths: OutputPaths, formats: Sequence[str], sha256: str) -> dict[int, KeptPage]:
    """page -> KeptPage for the intact pages of a document's outputs, if the file read back records
    the input of sha256 `sha256` (a JSONL left by an earlier run over an older version, beside a
    Markdown of this one, is not this document's); {} when it does not, or the file cannot be read
    or parsed (then every page is read again). Opened as a regular file only (a FIFO planted at
    the name would hang the run)."""
    fmt = "jsonl" if "jsonl" in formats else "md" if "md" in formats else None
    if fmt is None:
        return {}
    try:
        with open_regular(paths.file(fmt)) as f:
            data = f.read(MAX_OUTPUT_BYTES + 1)
        if len(data) > MAX_OUTPUT_BYTES:
            return {}
        text = data.decode("utf-8")
        return from_jsonl(text, sha256) if fmt == "jsonl" else from_markdown(text, sha256)
    except Exception:  # noqa: BLE001 - a damaged or hand-edited file, whatever it holds: nothing is kept
        return {}


def from_jsonl(text: str, sha256: str | None = None) -> dict[int, KeptPage]:
    """The intact pages of a JSONL; {} if any record names another input than sha256 `sha256`."""
    pages = {}
    for line in text.splitlines():
        rec = json.loads(line)
        if sha256 is not None and rec.get("doc_sha256") != sha256:
            return {}
        if rec.get("error") is None and rec.get("source", MODEL) == MODEL and isinstance(rec.get("page"), int):
            seconds = rec.get("seconds")
            pages[rec["page"]] = KeptPage(str(rec.get("text", "")), int(rec.get("n_tokens") or 0), rec.get("finish_reason"),
                                          dict(seconds) if isinstance(seconds, dict) else {})
    return pages


def from_markdown(text: str, sha256: str | None = None) -> dict[int, KeptPage]:
    """The intact pages of a Markdown; {} if its first line records another input than sha256."""
    if sha256 is not None and (header_record(text.split("\n", 1)[0]) or {}).get("sha256") != sha256:
        return {}
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
