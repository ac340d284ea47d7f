"""The progress display of `transcribe` and `archive run`, fed by the pipeline's Progress (sent at
least twice a second while pages are under way).

On a terminal: one live line, redrawn in place, with the pages through each stage (rendered,
encoded, prefilled, decoding, done) and the tokens generated so far:

    pages 12/40 · 1 failed · 5,210 tok 61 tok/s · 0:42 · ~1:38 left [docs 3/9 · render 20 · vision 17 · prefill 15 · decoding 3]

Elsewhere (a nightly job's log): one line per finished document, nothing redrawn, and a line of
pages when a minute went by without one (a long document):

    [3/12] written docs/report.pdf (12 pages, 0:41)
    ... pages 130/700, 2:41, ~11:15 left
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from ..errors import path_text
from .common import count

REDRAW_EVERY = 0.25  # seconds: a terminal line redrawn at most this often
LOG_EVERY = 60.0  # seconds: without a terminal, a line at least this often while pages run


def progress_bar(stream=None, written: str = "written"):
    """The on_progress callback for this stream (stderr by default): live on a terminal, a line
    per document otherwise. `written`: the word for a document done ("read" where the outputs go to
    standard output once every document is done: not yet delivered, they may never be)."""
    stream = stream or sys.stderr
    return LiveLine(stream) if getattr(stream, "isatty", lambda: False)() else DocumentLines(stream, written)


class ProgressDisplay:
    """What the commands call: the pipeline's on_progress, and end() once the run returns or stops."""

    def __call__(self, p) -> None: ...

    def end(self) -> None: ...


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _left(p) -> str:
    """The time left at the pace of the pages read so far, planning and the pages it did (from the
    text layer) left out (hashing a big folder is no page's time): rough while the first pages run,
    steady after."""
    read = p.pages_done - p.done_before_reading  # callers ask once a page was read (_paced)
    return _clock((p.elapsed - p.reading_since) / read * (p.pages_total - p.pages_done))


def _paced(p) -> bool:
    """Whether a time left can be said: a page was read since planning, and pages are left."""
    return p.done_before_reading < p.pages_done < p.pages_total


def _columns(stream) -> int:
    """The width of the terminal `stream` draws on: COLUMNS where set, else the stream's own
    terminal. shutil.get_terminal_size asks stdout's, which is a file or a pipe under `-o - > f`
    or `| less` while the line goes to stderr: lines as wide as 100 wrapped on a narrow
    terminal and left a trail of half lines."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size((100, 20)).columns


class LiveLine(ProgressDisplay):
    def __init__(self, stream):
        self.stream, self.last, self.width = stream, 0.0, 0

    def __call__(self, p) -> None:
        now = time.monotonic()
        done = p.pages_done >= p.pages_total and p.docs_done >= p.docs_total
        if not done and now - self.last < REDRAW_EVERY:
            return
        self.last = now
        rate = p.tokens / p.elapsed if p.elapsed > 0 else 0.0
        # what matters first (pages, failures, speed, time), then where the pages are: on a narrow
        # terminal the stages go, not the clock
        left = f" · ~{_left(p)} left" if _paced(p) else ""
        head = (f"pages {p.pages_done}/{p.pages_total}" + (f" · {p.pages_failed} failed" if p.pages_failed else "")
                + f" · {p.tokens:,} tok {rate:.0f} tok/s · {_clock(p.elapsed)}" + left)
        stages = (f" [docs {p.docs_done}/{p.docs_total} · render {p.rendered} · vision {p.encoded} · "
                  f"prefill {p.prefilled} · decoding {p.decoding}]")
        width = _columns(self.stream) - 1
        line = (head + stages if len(head) + len(stages) <= width else head)[:width]
        self.stream.write("\r" + line + " " * max(0, self.width - len(line)))
        self.width = len(line)
        if done:
            self.stream.write("\n")
            self.width = 0
        self.stream.flush()

    def end(self) -> None:
        """The live line ended where a run stopped before its last page (Ctrl-C), so that what
        is said next starts on a line of its own."""
        if self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0


class DocumentLines(ProgressDisplay):
    def __init__(self, stream, written: str = "written"):
        self.stream, self.last, self.written = stream, time.monotonic(), written

    def __call__(self, p) -> None:
        for i, outcome in enumerate(p.finished, p.docs_done - len(p.finished) + 1):
            status = self.written if outcome.status == "written" else outcome.status
            self.stream.write(f"[{i}/{p.docs_total}] {status} {path_text(outcome.doc.path)} "
                              f"({count(outcome.n_pages, 'page')}, {_clock(p.elapsed)})\n")
        now = time.monotonic()
        if p.finished:
            self.last = now
        elif now - self.last >= LOG_EVERY and p.pages_done < p.pages_total:
            # a long document says nothing until it is done: the log shows the run is alive
            self.stream.write(f"... pages {p.pages_done}/{p.pages_total}"
                              + (f", {p.pages_failed} failed" if p.pages_failed else "") + f", {_clock(p.elapsed)}"
                              + (f", ~{_left(p)} left" if _paced(p) else "") + "\n")
            self.last = now
        else:
            return
        self.stream.flush()

    def end(self) -> None:
        """Nothing to end: every line is whole."""
