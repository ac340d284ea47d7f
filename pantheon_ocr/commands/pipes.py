"""Standard output and error whose readers go away: `pantheon-ocr archive status job.toml | head -1`,
`archive run job.toml 2>&1 | tee log` with tee killed, a closed journal socket.

- Standard output's reader gone: what was asked for is no longer read, so the command ends
  quietly with 141 (128 + SIGPIPE, what the shell shows for Unix tools ended by it); click alone
  would exit 1, which reads as "pages failed".
- Standard error's reader gone, or its file on a full disk: only diagnostics are lost, so they
  are dropped from then on and the command goes on to its own end and exit code (a night's job
  is not stopped by its log).
- Standard output that cannot be written (a full disk under `> file`, /dev/full): a WriteError
  naming it (exit 73), as for any output, not an internal error.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys

# a pipe's write end whose reader closed polls POLLERR on Linux, POLLHUP on the BSDs and macOS;
# a socket whose peer closed, POLLHUP
_GONE = select.POLLERR | select.POLLHUP if sys.platform != "win32" else 0


class ReaderGone(Exception):
    """Standard output's reader went away before the command was done."""


def reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket whose reader has closed it, so that a BrokenPipeError from
    anywhere else (a socket of ours) stays an error. Windows cannot poll pipes: a broken pipe there
    is taken as the reader's."""
    if sys.platform == "win32":
        return True
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & _GONE for _, events in poll.poll(0))


def to_devnull(fd: int) -> None:
    """Writes to `fd` go nowhere from now on (the interpreter's last flush included)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _silence(stream) -> None:
    """to_devnull for a stream's descriptor, where it has one (a test's capture has none)."""
    try:
        to_devnull(stream.fileno())
    except (OSError, ValueError):
        pass


class QuietWhenGone:
    """sys.stderr for the command line: the stream itself until its reader goes away, then nothing."""

    def __init__(self, stream):
        self.stream, self.gone = stream, False

    def write(self, text):
        if self.gone:
            return len(text)
        try:
            return self.stream.write(text)
        except OSError:  # a reader gone, or a log on a full disk: only diagnostics are lost
            self._went()
            return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except OSError:
                self._went()

    def _went(self) -> None:
        self.gone = True
        _silence(self.stream)

    def __getattr__(self, name):  # encoding, isatty, fileno, buffer: the stream's
        return getattr(self.stream, name)


def guarded_stderr():
    """A context in which sys.stderr is QuietWhenGone over the one before (contextlib's redirect);
    nothing where there is none (fd 2 closed: Python's sys.stderr is None, which click skips)."""
    return contextlib.nullcontext() if sys.stderr is None else contextlib.redirect_stderr(QuietWhenGone(sys.stderr))


class SaysWhenFull(QuietWhenGone):
    """sys.stdout for the command line: a write that fails for any reason but a gone reader (a
    broken pipe, see ReaderGone) is a WriteError naming standard output."""

    def write(self, text):
        if isinstance(text, str) and not text:  # click's probe of the stream: nothing to write, nothing to fail
            return 0
        return self._guard(lambda: self.stream.write(text))

    def flush(self) -> None:
        self._guard(self.stream.flush)

    def _guard(self, step):
        from ..errors import WriteError

        try:
            return step()
        except BrokenPipeError:
            raise
        except OSError as e:
            _silence(self.stream)  # what is still buffered would fail again at exit, with Python's own words
            raise WriteError(f"standard output: cannot write: {e.strerror or e}") from None


def guarded_stdout():
    """A context in which sys.stdout is SaysWhenFull over the one before; nothing where there is none."""
    return contextlib.nullcontext() if sys.stdout is None else contextlib.redirect_stdout(SaysWhenFull(sys.stdout))
