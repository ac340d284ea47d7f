"""Exit codes and typed errors: the library raises these, the CLI maps them to exit codes."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    PAGES_FAILED = 1  # some pages failed, the others were written
    BAD_ARGUMENTS = 2
    BAD_MODEL = 3  # bad or unsupported model file
    INPUT_UNREADABLE = 4  # input not found or unreadable
    JOB_LOCKED = 75  # another run holds the job's lock: try again later (sysexits EX_TEMPFAIL)
    INTERRUPTED = 130


def run_exit_code(interrupted: bool, failed: bool, wrote: bool) -> ExitCode:
    """The exit code of a run over many pages (transcribe, an archive job): 130 when interrupted,
    0 when nothing failed, 1 when something failed but something was written, 4 when everything
    attempted failed (nothing readable)."""
    if interrupted:
        return ExitCode.INTERRUPTED
    if not failed:
        return ExitCode.OK
    return ExitCode.PAGES_FAILED if wrote else ExitCode.INPUT_UNREADABLE


class PantheonError(Exception):
    """Base class: every error the library raises on purpose carries its exit code."""

    exit_code: ExitCode = ExitCode.BAD_ARGUMENTS


class UsageError(PantheonError):
    exit_code = ExitCode.BAD_ARGUMENTS


class ModelError(PantheonError):
    """A model file is missing, corrupt, inconsistent or unsupported."""

    exit_code = ExitCode.BAD_MODEL

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class InputError(PantheonError):
    """An input document or image cannot be read."""

    exit_code = ExitCode.INPUT_UNREADABLE

    def __init__(self, path: object, problem: str, page: int | None = None):
        self.path = str(path)
        self.page = page
        self.problem = problem
        where = self.path if page is None else f"{self.path} page {page}"
        super().__init__(f"{where}: {problem}")


class JobError(PantheonError):
    """An archive job cannot run (bad job file, locked by another run, ...)."""

    exit_code = ExitCode.BAD_ARGUMENTS
