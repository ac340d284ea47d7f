"""What the commands share: stop signals handled like Ctrl-C, the engine's notes, the run summary (counts in
words from archive/wording.py, which the reports use too)."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

import click

from ..archive.wording import count, count_by
from ..archive.signals import STOP_SIGNALS
from ..errors import path_text
from .options import flag_name


# A stop signal this soon after the first is a reflex (Ctrl-C pressed twice) or a supervisor's
# repeat: let pass while the run saves what it read; a later one quits at once.
GRACE_S = 5.0


class Stopping:
    """Whether the command is stopping (a stop signal came, or the run says it was stopped)."""

    def __init__(self) -> None:
        self.stopping = False
        self.since = 0.0  # time.monotonic() of the first

    def note(self) -> None:
        """The run ended stopped (a signal the library held back, say): from here on stop signals
        pass for GRACE_S."""
        if not self.stopping:
            self.stopping, self.since = True, time.monotonic()


@contextmanager
def stop_signals_as_interrupt():
    """Ctrl-C, a closed terminal (SIGHUP) and cron's, systemd's and `kill`'s SIGTERM all stop a
    run as Ctrl-C does, so finished documents stay written, unfinished ones keep their pages read
    (and a job's pages recorded, its report written, its lock released), and the run exits 130
    instead of dying by the signal. The first one stops the run; more within GRACE_S (Ctrl-C
    pressed twice, a reflex; a supervisor that sends several) are let pass while it winds down,
    here and after this block until the process ends: a second Ctrl-C during the wind-down once
    cut the saving of the pages read, and the summary is printed whole. One after that quits at
    once, should the wind-down hang. A signal the process was started ignoring stays ignored
    (`nohup` ignores SIGHUP, a shell without job control SIGINT for `cmd &`). Yields a Stopping:
    a command whose run ended stopped without this handler seeing the signal (the archive holds
    signals back while it takes or gives back its lock) notes it there."""
    state = Stopping()

    def handler(signum, frame):
        if not state.stopping or time.monotonic() - state.since > GRACE_S:
            state.note()
            raise KeyboardInterrupt

    try:
        previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s, h in previous.items():
            if h is not signal.SIG_IGN:
                signal.signal(s, handler)
    except ValueError:  # not the main thread
        yield state
        return
    try:
        yield state
    finally:
        if not state.stopping:
            for s, h in previous.items():
                if h is not signal.SIG_IGN:
                    signal.signal(s, h)


def show_progress(asked: bool | None, terminal_only: bool = False) -> bool:
    """Whether a command shows progress: as --progress/--no-progress say when given; else on
    (for `terminal_only` commands when standard error is a terminal) unless -q. One rule for
    transcribe, archive run and models pull, where each once wrote its own."""
    if asked is not None:
        return asked
    return not switch("quiet") and (not terminal_only or click.get_text_stream("stderr").isatty())


def switch(name: str) -> bool:
    """Whether the global switch -v ("verbose") or -q ("quiet") was given, before or after the command."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and (ctx.find_root().obj or {}).get(name))


def echo_notes(notes: list[str]) -> None:
    """The engine's notes: what `auto` chose in one line (with its reasons under -v), the rest as
    they are; nothing under -q."""
    from ..engine.loader import PLAN_NOTES

    if switch("quiet"):
        return
    verbose = switch("verbose")
    plan = [n for n in notes if n.startswith(PLAN_NOTES)]
    if plan:
        if verbose:
            for n in plan:
                click.echo(f"note: {n}", err=True)
        else:
            click.echo("engine: " + ", ".join(n.split(" (", 1)[0] for n in plan) + " (-v says why)", err=True)
    for n in notes:
        if not n.startswith(PLAN_NOTES):
            click.echo(f"note: {n}", err=True)


def summary_lines(summary, to_stdout: bool = False, quiet: bool = False) -> list[str]:
    """The end of a run, documents and pages counted apart: a line per document (its outputs,
    unless they went to standard output), the failures, then the totals. `quiet` (-q): only what
    went wrong (documents not written whole, the failures, pages cut short, an interruption)."""
    from ..pipeline.types import OUTPUTS_EXIST  # here: `models` and `archive` import this module, not the pipeline

    lines = []
    # A document sent to standard output was read, not written anywhere: said as the progress says it
    said = {"written": "read"} if to_stdout else {}
    for d in summary.documents:
        if quiet and d.status in ("written", "skipped"):
            continue
        outs = "" if to_stdout else _outputs_said(d.outputs)
        lines.append(f"{said.get(d.status, d.status):11} {path_text(d.doc.path)}" + (f" -> {outs}" if outs else "")
                     + (f" ({d.note})" if d.note else ""))
    page_failures = [f for d in summary.documents for f in d.failures if f.page is not None]
    doc_failures = [f for d in summary.documents for f in d.failures if f.page is None]
    if page_failures or doc_failures or summary.unreadable:
        failed = [count(len(page_failures), "page")] if page_failures else []
        failed += [count(len(doc_failures), "document")] if doc_failures else []
        parts = [" and ".join(failed) + " failed"] if failed else []
        parts += [count(len(summary.unreadable), "input path") + " unreadable"] if summary.unreadable else []
        lines.append(", ".join(parts) + ":")  # "2 pages and 1 document failed, 1 input path unreadable:"
        lines += [f"  {e}" for e in summary.unreadable]
        lines += [f"  {f.said(flag_name)}" for f in doc_failures + page_failures]  # "(--password)", say
    if summary.pages_cut:  # written, and marked in the Markdown, but a page cut short is easy to miss
        lines.append(f"note: {count(summary.pages_cut, 'page')} stopped at --max-tokens: "
                     f"{'its' if summary.pages_cut == 1 else 'their'} text is cut short (marked stopped at "
                     "max_tokens in the outputs); a higher --max-tokens reads on")
    if summary.interrupted:
        kept = any(d.status == "interrupted" and d.outputs for d in summary.documents)
        lines.append("interrupted: finished documents are complete" + (
            "; unfinished ones hold the pages read so far, and the next run reads only the rest" if kept
            else ", the rest was not written"))
    if quiet:
        return lines
    kept = sum(d.status == "skipped" and d.note == OUTPUTS_EXIST for d in summary.documents)
    if kept:  # a second run over the same folder reads nothing: say why, and how to read them again
        lines.append(f"note: {count(kept, 'document')} skipped: {'its' if kept == 1 else 'their'} outputs exist "
                     "(--overwrite reads them again)")
    by_status: dict[str, int] = {}
    for d in summary.documents:
        status = said.get(d.status, d.status)
        by_status[status] = by_status.get(status, 0) + 1
    # pages read by OCR; failed ones and those a text layer gave are said apart (they were not read)
    read = summary.pages_done - summary.pages_failed - summary.pages_from_text_layer
    pages = [f"{count(read, 'page')} read"] + [f"{summary.pages_failed} failed"] * bool(summary.pages_failed) \
        + [f"{summary.pages_from_text_layer} from the text layer"] * bool(summary.pages_from_text_layer) \
        + [f"{summary.pages_kept} kept from the outputs"] * bool(summary.pages_kept)
    lines.append(f"{count_by(by_status, 'document')}; {', '.join(pages)}, {count(summary.tokens, 'token')} "
                 f"in {summary.seconds:.1f} s")
    return lines


def _outputs_said(outputs) -> str:
    """A document's outputs in a line: its files by name, its page files (--page-files) counted,
    not named: a 3,000-page PDF's line named every one."""
    from ..pipeline.outputs import PAGE_FILE

    pages = [o for o in outputs if PAGE_FILE.fullmatch(o.name)]
    said = [path_text(o) for o in outputs if o not in pages]
    if pages:
        said.append(f"{count(len(pages), 'page file')} in {path_text(pages[0].parent)}")
    return ", ".join(said)


def echo_summary(summary, to_stdout: bool = False) -> None:
    for line in summary_lines(summary, to_stdout, quiet=switch("quiet")):
        click.echo(line, err=True)
