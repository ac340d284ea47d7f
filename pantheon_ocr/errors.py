"""Exit codes and typed errors: the library raises these, the CLI maps them to exit codes."""

from __future__ import annotations

import errno
import os
import re
from enum import IntEnum
from typing import Callable


class ExitCode(IntEnum):
    OK = 0
    PAGES_FAILED = 1  # some pages failed, the others were written
    BAD_ARGUMENTS = 2
    BAD_MODEL = 3  # bad or unsupported model file
    INPUT_UNREADABLE = 4  # input not found or unreadable
    NETWORK = 69  # `models pull`: the Hub cannot be reached or did not answer usably; try again later (EX_UNAVAILABLE)
    INTERNAL = 70  # a bug of ours, said in one line (-v: the traceback) (EX_SOFTWARE)
    OUT_OF_RESOURCES = 71  # out of memory or of open files (a ulimit, or too much at once) (EX_OSERR)
    CANNOT_WRITE = 73  # an output (or the job state) cannot be written: permissions, read-only, disk full (EX_CANTCREAT)
    JOB_LOCKED = 75  # another run holds the job's lock: try again later (sysexits EX_TEMPFAIL)
    INTERRUPTED = 130
    READER_GONE = 141  # standard output's reader closed early (`| head`): 128 + SIGPIPE, as Unix tools end


def run_exit_code(interrupted: bool, failed: bool, wrote: bool, write_failed: bool = False,
                  short_of_memory: bool = False) -> ExitCode:
    """The exit code of a run over many pages (transcribe, an archive job): 130 when interrupted,
    73 when some document's outputs could not be written (the night's work is not on disk: that
    outranks a failed page), 71 when pages failed for lack of memory (the inputs are fine: fewer
    pages at once or more memory reads them), 0 when nothing failed, 1 when something failed but
    something was written, 4 when everything attempted failed (nothing readable)."""
    if interrupted:
        return ExitCode.INTERRUPTED
    if write_failed:
        return ExitCode.CANNOT_WRITE
    if short_of_memory:
        return ExitCode.OUT_OF_RESOURCES
    if not failed:
        return ExitCode.OK
    return ExitCode.PAGES_FAILED if wrote else ExitCode.INPUT_UNREADABLE


# C0 and C1 controls, DEL, the line and paragraph separators, and the bidirectional marks,
# overrides and isolates (a name that reorders the line it is printed on: "Trojan source");
# each shown as an escape, never acted on by a terminal
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def path_record(path: object) -> str:
    """A file name as the outputs and the job state record it, and compare it: always valid UTF-8,
    every character kept. Names are bytes on POSIX and Python keeps undecodable bytes as lone
    surrogates, which cannot be written as UTF-8; each such byte is written `\\xNN` (e.g.
    b'\\xff.pdf' -> '\\xff.pdf'). JSON and the reports escape what they need themselves."""
    raw = os.fsencode(path if isinstance(path, (str, bytes, os.PathLike)) else str(path))
    return raw.decode("utf-8", "backslashreplace")


def path_text(path: object) -> str:
    """A file name as people read it, in messages and summary lines: path_record's text with each
    control character escaped (`\\n`, `\\x1b`, `\\u202e`), so that a name never breaks a line of a
    log in two or drives the terminal. For showing only: two names can show alike (a tab and a
    backslash-t), so what is recorded and compared is path_record's."""
    text = path_record(path)
    return _CONTROLS.sub(_escaped, text) if _CONTROLS.search(text) else text


def _escaped(m: re.Match) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


class PantheonError(Exception):
    """Base class: every error the library raises on purpose carries its exit code.

    Pickled whole, whatever a subclass's __init__ takes: its class, its message (args) and the
    attributes its words come from (a path, a page, a setting), so that a worker process can
    raise it and its parent say it as its own (Exception's default pickling calls cls(*args),
    which a ModelError(path, problem) cannot take)."""

    exit_code: ExitCode = ExitCode.BAD_ARGUMENTS

    def __reduce__(self):
        if isinstance(self, OSError):  # errno, strerror, filename live outside vars(): OSError's own way
            return OSError.__reduce__(self)
        return _unpickled, (type(self), self.args, {k: _picklable(v) for k, v in vars(self).items()})


def _picklable(value: object) -> object:
    """An attribute as it pickles, or its text where it cannot (a lock, an open file): the words
    an error is said in come through either way."""
    import pickle

    try:
        pickle.dumps(value)
        return value
    except Exception:  # noqa: BLE001 - pickling may fail in any way the object likes
        return str(value)


def _unpickled(cls: type, args: tuple, state: dict) -> PantheonError:
    error = cls.__new__(cls)  # its __init__ already ran in the process that raised it
    error.args = args
    vars(error).update(state)
    return error


class UsageError(PantheonError):
    exit_code = ExitCode.BAD_ARGUMENTS


class OptionError(UsageError):
    """A setting has a value that cannot work. The library names the setting as the options table
    does (`device`, `vision_backend`); the CLI and the job-file loader show it as their flag
    (`--device`) or key (`model.device`)."""

    def __init__(self, option: str | None, problem: str, value: object = None):
        self.option, self.problem, self.value = option, problem, value
        super().__init__(self.named(option))

    def named(self, name: str | None) -> str:
        """The message with the setting called `name` (a flag, a job-file key; None: no setting)."""
        if name is None:
            return self.problem
        return f"{name}{'' if self.value is None else f' {self.value}'}: {self.problem}"


class ModelError(PantheonError):
    """A model file is missing, corrupt, inconsistent or unsupported."""

    exit_code = ExitCode.BAD_MODEL

    def __init__(self, path: object, problem: str, option: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.option = option  # the setting that named the file (`model`, `mmproj`), where one did
        super().__init__(f"{path_text(self.path)}: {problem}")


class InputError(PantheonError):
    """An input document or image cannot be read."""

    exit_code = ExitCode.INPUT_UNREADABLE

    def __init__(self, path: object, problem: str, page: int | None = None, option: str | None = None,
                 lasting: bool = True):
        self.path = str(path)
        self.page = page
        self.problem = problem
        # the file's own fault (damaged data, a wrong kind of file): the same on every try. False
        # for a read the system failed (EIO, a stale NFS handle, too many open files), which a
        # later try may get through
        self.lasting = lasting
        # the setting that would let it be read (`password`), named as the options table does:
        # the CLI says its flag, an archive job its key (with_setting)
        self.option = option
        where = path_text(self.path) + ("" if page is None else f" page {page}")
        super().__init__(f"{where}: {with_setting(problem, option)}")


def with_setting(problem: str, option: str | None, name_of: Callable[[str], str] | None = None) -> str:
    """`problem`, and the setting that would mend it: as `name_of` names it (a flag, a job-file key)
    or, without one, as the options table does ("the password setting")."""
    if option is None:
        return problem
    return f"{problem} ({name_of(option) if name_of is not None else f'the {option} setting'})"


class JobError(PantheonError):
    """An archive job cannot run (bad job file, locked by another run, ...)."""

    exit_code = ExitCode.BAD_ARGUMENTS


class WriteError(PantheonError):
    """An output or the job state cannot be written (permissions, read-only file system, disk full)."""

    exit_code = ExitCode.CANNOT_WRITE


class ContextFull(PantheonError, ValueError):
    """A sequence longer than the model's context (its KV cache holds n_ctx positions): a prompt
    too long, or a benchmark asking for more tokens than the model takes. A ValueError too."""

    exit_code = ExitCode.BAD_ARGUMENTS

    def __init__(self, n_tokens: int, n_ctx: int):
        self.n_tokens, self.n_ctx = n_tokens, n_ctx
        super().__init__(f"a sequence of {n_tokens:,} tokens does not fit a context of {n_ctx:,} (the model's, or its "
                         "cache's): fewer tokens, or a model with a longer context")


class ResourceError(PantheonError):
    """The process ran out of something the system rations: memory, open files, processes."""

    exit_code = ExitCode.OUT_OF_RESOURCES


# What running out of open files or processes looks like as an OSError's errno
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def open_files_limit(err: int = errno.EMFILE) -> str:
    """`the limit of open files (ulimit -n) is N`, for messages about running out of them; for
    ENFILE (the whole system's table is full) the system's limit."""
    if err == errno.ENFILE:
        return "the system's limit of open files (fs.file-max) is reached: close programs, or raise it"
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return "the limit of open files was reached"
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return f"the limit of open files (ulimit -n) is {shown}: raise it"


class NetworkError(PantheonError):
    """The Hub (or its download servers) cannot be reached or answers in a way that cannot be used:
    down, refused, timed out or stalled, rate-limited, a server error, a malformed answer. Not a
    bad model: trying again later (or another HF_ENDPOINT) may work. `setting` names the limit
    that ended it (`timeout`, `deadline`, `min_rate`, `max_wait`), if one did."""

    exit_code = ExitCode.NETWORK

    def __init__(self, where: object, problem: str, setting: str | None = None):
        self.where, self.problem, self.setting = str(where), problem, setting
        super().__init__(f"{path_text(self.where)}: {problem}")


class DocumentNote(UserWarning):
    """Not an error: what a run noticed about a document it read (a page selection past its end,
    the frames of an animated image not read), which the command line says beside the document's
    line. `Reader.read` warns it (Python's warnings module): a list of pages would not say it."""

    def __init__(self, path: object, note: str):
        self.path, self.note = str(path), note
        super().__init__(f"{path_text(self.path)}: {note}")

