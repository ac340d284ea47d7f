"""A PDF's own text layer, as `--text-layer` asks:

- fallback (the default): a PDF page whose OCR failed (every attempt) takes the PDF's own text
  layer, when it has one that is no glyph soup (`text_layer_problem`, however short and whatever
  the order of its letters), instead of leaving a hole. The page stays counted as failed (its error
  is kept, so the run still says what went wrong); the Markdown marks it
  `<!-- page N text-layer: reason -->`, JSONL `"source": "text-layer"`.
- prefer: before any OCR, every selected PDF page whose text layer holds real text
  (`text_layer_problem`: enough printable characters, mostly words, no runs of garbage glyphs,
  letters in the order of a written language; not a stamp on a scan, not sideways; a scan with
  an OCR layer of its own counts as text) keeps it and is not read by OCR; the others are. Such
  a page is not a failure; it is marked `<!-- page N text-layer -->` and `"source": "text-layer"`
  in JSONL.
- ocr: the text layer is never looked at.

The text is read by PDFium, so in a crash-proof render worker of its own (started on first use:
a night where every page reads well never starts it).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

import re
import unicodedata

from .letter_pairs import MOST_CHARS, gibberish
from .pdf import SIDEWAYS, text_layer, text_layer_and_cover
from .render_pool import RenderPool
from .types import TEXT_LAYER, PageResult, PageTask

MIN_CHARS = 40  # fewer printed characters than this: no real text layer (a scan's stray label)
# A run of this many symbols with no letter or digit is garbage glyphs (a font without a Unicode
# map); leaders and rules are taken out first.
GARBAGE_RUN = re.compile(r"[^\w\s]{8,}")
# Shares of a page's characters that make it garbage. Real pages hold some of each: a slide's
# bullets mapped to a control character (5 of 330 characters), a regular expression in a manual
# (\\/\\(.*\\/\\)). A font without a map turns nearly all of them.
ODD_SHARE, GARBAGE_RUN_SHARE = 0.05, 0.03

# Dot leaders and rules: one or two symbols repeated, spaced or not (". . . . 35" in a table of
# contents, "=-=-=-", an X font name's "-*-*-*-*")
LEADERS = re.compile(r"([^\w\s]{1,2})(?: ?\1){2,}")


def text_layer_problem(text: str, min_chars: int = MIN_CHARS, letter_order: bool = True) -> str | None:
    """Why a page's text layer is not real text, or None when it is. Judged on its first
    MOST_CHARS characters. `letter_order`: refuse letters in an order no language has too (a
    list of part numbers scores so, and is better than nothing where the OCR failed)."""
    text = LEADERS.sub(" ", text[:MOST_CHARS])
    chars = [c for c in text if not c.isspace()]
    if len(chars) < max(min_chars, 1):
        return f"{len(chars)} characters of text"
    odd = sum(unicodedata.category(c) in ("Co", "Cn", "Cs", "Cc") or c == "\ufffd" for c in chars)
    if odd > ODD_SHARE * len(chars):
        return f"{odd} unprintable or private-use characters"
    if sum(c.isalnum() for c in chars) < 0.6 * len(chars):
        return "mostly symbols"
    words = text.split()  # words and numbers (a table's cells), not glyph soup
    if sum(sum(ch.isalnum() for ch in w) >= 0.5 * len(w) for w in words) < 0.6 * len(words):
        return "few words"
    runs = [m.group() for m in GARBAGE_RUN.finditer(text) if len(set(m.group())) > 2]
    if sum(map(len, runs)) > GARBAGE_RUN_SHARE * len(chars):
        return f"runs of garbage glyphs ({runs[0][:12]!r})"
    score = gibberish(text) if letter_order else None
    if score is not None:  # a font without a true character map: words, in the wrong letters
        return f"letters in an order no language has (score {score:.2f})"
    return None


# A page images cover almost wholly, whose text objects cover a sliver of it (under 2%: a line or
# two): a scan with a line of real text put on it (a download stamp, a page number). Its text
# layer is not its transcript, so `prefer` reads the page (the layer still stands in if reading
# fails). Measured: a stamp on a Letter scan 0.4%; an OCR layer of four lines 2.9%; a slide of
# the dev set on a background picture 7.5%; pages of text 2.5-35%.
SCAN_IMAGES, STAMP_TEXT = 0.8, 0.02


def stamp_on_a_scan(images: float, texts: float) -> bool:
    """Whether a page with these shares of images and of text objects is a stamped scan."""
    return images >= SCAN_IMAGES and texts < STAMP_TEXT


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
            # Any text stands in for a failed page, however short and whatever its letters, but
            # not glyph soup
            if outcome.error is None and outcome.value and \
                    text_layer_problem(outcome.value, min_chars=1, letter_order=False) is None:
                r = wanted[outcome.index]
                found[(r.doc.doc_id, r.page)] = outcome.value
        return [dataclasses.replace(r, text=found[(r.doc.doc_id, r.page)], finish_reason=TEXT_LAYER)
                if (r.doc.doc_id, r.page) in found else r for r in results]

    def prefer(self, tasks: Sequence[PageTask], stop: threading.Event | None = None) -> dict[tuple[str, int], str]:
        """{(doc_id, page): text} of the PDF pages among `tasks` whose text layer is real text."""
        wanted = [t for t in tasks if t.doc.kind == "pdf"]
        if not wanted:
            return {}
        if self.pool is None:
            self.pool = RenderPool(workers=1, timeout=self.timeout, start_method=self.start_method)
        found = {}
        items = [(t.doc, t.page_index, self.password) for t in wanted]
        for outcome in self.pool.imap(text_layer_and_cover, items, stop or threading.Event()):
            if outcome.error is not None:
                continue
            text, images, texts, sideways = outcome.value
            # text running sideways on the page (a landscape table on a portrait page, turned
            # upright by /Rotate) comes out with lines glued and columns reversed: read as shown
            if text and text_layer_problem(text) is None and not stamp_on_a_scan(images, texts) \
                    and sideways < SIDEWAYS:
                t = wanted[outcome.index]
                found[(t.doc.doc_id, t.page)] = text
        return found

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
