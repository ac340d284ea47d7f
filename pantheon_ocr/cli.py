"""The `pantheon-ocr` command: a click group whose subcommands are imported only when run,
so `pantheon-ocr --help` stays instant (no numpy, no engine)."""

from __future__ import annotations

import errno
import logging
import sys
import traceback
from importlib import import_module

import click

# name -> (module under pantheon_ocr.commands, attribute, one-line help)
COMMANDS = {
    "transcribe": ("transcribe", "transcribe", "Transcribe PDFs and images to Markdown."),
    "archive": ("archive", "archive", "Nightly archive jobs: run (and resume), status, report."),
    "bench": ("bench", "bench", "Per-page throughput benchmark, configurations side by side."),
    "models": ("models", "models", "Get LightOnOCR models: pull from the Hugging Face Hub, list the ones here."),
    "inspect": ("engine", "inspect", "Describe a GGUF model: architecture, shapes, quant types, memory."),
    "generate": ("engine", "generate", "Generate text with a GGUF decoder model (streams)."),
}


class _Unexpected(Exception):
    """An OSError click would swallow (a broken pipe not our output's): said as the bug it is."""


def _pipes(step):
    """step() with a broken pipe said as what it is (see commands/pipes.py), not as click's silent 1."""
    from .commands.pipes import ReaderGone, reader_gone

    try:
        return step()
    except BrokenPipeError as exc:
        raise (ReaderGone() if reader_gone(1) else _Unexpected(exc)) from None


class LazyGroup(click.Group):
    def make_context(self, info_name, args, parent=None, **extra):  # --help and --version print here
        return _pipes(lambda: super(LazyGroup, self).make_context(info_name, args, parent, **extra))

    def invoke(self, ctx):
        return _pipes(lambda: super(LazyGroup, self).invoke(ctx))

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return _with_verbose(getattr(import_module(f"pantheon_ocr.commands.{module}"), attr))

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


VERBOSE = ("-v", "--verbose")
VERBOSE_HELP = "Show tracebacks and debug detail (before or after the command)."
QUIET = ("-q", "--quiet")
QUIET_HELP = ("Say only what went wrong: no progress, engine line, notes or line per document done "
              "(before or after the command).")


def _switch(key: str):
    def callback(ctx: click.Context, param, value: bool) -> None:
        if value:
            ctx.find_root().ensure_object(dict)[key] = True
    return callback


def _with_verbose(command: click.Command) -> click.Command:
    """-v and -q after the command too (`transcribe docs -v`, as the notes' "-v says why" invites):
    the same switches as before it, on every command and subcommand."""
    for name, flags, help_ in (("verbose", VERBOSE, VERBOSE_HELP), ("quiet", QUIET, QUIET_HELP)):
        if not any(p.name == name for p in command.params):
            command.params.append(click.Option(list(flags), is_flag=True, expose_value=False, callback=_switch(name),
                                               help=help_))
    for sub in command.commands.values() if isinstance(command, click.Group) else ():
        _with_verbose(sub)
    return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(*VERBOSE, is_flag=True, help=VERBOSE_HELP)
@click.option(*QUIET, is_flag=True, help=QUIET_HELP)
@click.version_option(package_name="pantheon-ocr")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, quiet: bool) -> None:
    """pantheon-ocr: bulk OCR of PDFs and page images with LightOnOCR GGUF models."""
    ctx.obj = {"verbose": verbose, "quiet": quiet}


def main(argv: list[str] | None = None) -> int:
    """Entry point: typed errors become one clear line and their exit code."""
    from .commands.pipes import guarded_stderr, guarded_stdout

    args = sys.argv[1:] if argv is None else argv
    verbose = any(a in VERBOSE for a in args)
    with guarded_stderr(), guarded_stdout():  # a log reader gone stops nothing; a full disk is named
        return _main(args, verbose)


def _debug_log() -> None:
    """The library's debug log (a failed page's traceback, what Core ML converts) on stderr, once."""
    root = logging.getLogger("pantheon_ocr")
    if not any(isinstance(h, _Stderr) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("debug: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG)


class _Stderr(logging.Handler):
    """To whatever sys.stderr is when a record comes (guarded_stderr, a test's capture)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - a log line is never worth the run
            self.handleError(record)


def _main(args: list[str], verbose: bool) -> int:
    from .commands.pipes import ReaderGone, to_devnull
    from .errors import ExitCode, PantheonError, open_files_limit

    _more_open_files()
    if verbose:
        _debug_log()
    try:
        code = cli.main(args=args, prog_name="pantheon-ocr", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except PantheonError as exc:
        if verbose:  # the traceback, then the same line and exit code as without -v
            traceback.print_exc()
        from .commands.options import shown

        click.echo(f"error: {shown(exc)}", err=True)
        return int(exc.exit_code)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except ReaderGone:  # what was asked for stopped being read: end quietly, as `git log | head` does
        to_devnull(1)
        return ExitCode.READER_GONE
    except click.ClickException as exc:
        exc.show()
        return ExitCode.BAD_ARGUMENTS
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return ExitCode.INTERRUPTED
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return ExitCode.INTERRUPTED
    except MemoryError:  # its message is empty: say what it is and what to try
        return _out_of_resources("out of memory (a limit such as ulimit -v, or too much at once: try a smaller "
                                 "--batch-size or fewer --render-workers)", verbose)
    except RuntimeError as exc:
        if str(exc) != "can't start new thread":  # Python's word for pthread_create's EAGAIN
            return _internal(exc, verbose)
        return _out_of_resources("cannot start a thread: out of memory (a limit such as ulimit -v), or at the limit "
                                 "of processes and threads (ulimit -u); try fewer render workers", verbose)
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            return _internal(exc, verbose)
        return _out_of_resources(f"too many open files: {open_files_limit(exc.errno)}", verbose)
    except Exception as exc:  # a bug: say so in one line unless -v
        return _internal(exc, verbose)


def _out_of_resources(said: str, verbose: bool) -> int:
    """A limit of the machine's (memory, threads, open files): one line (-v: the traceback), exit 71."""
    from .errors import ExitCode

    if verbose:
        traceback.print_exc()
    click.echo(f"error: {said}", err=True)
    return ExitCode.OUT_OF_RESOURCES


def _internal(exc: Exception, verbose: bool) -> int:
    """A bug: said in one line (-v: the traceback), exit 70 (never 1, which says pages failed)."""
    from .errors import ExitCode

    exc = exc.args[0] if isinstance(exc, _Unexpected) else exc
    if verbose:
        traceback.print_exception(exc)
    click.echo(f"internal error: {type(exc).__name__}: {exc}" + ("" if verbose else " (-v shows the traceback)"),
               err=True)
    return ExitCode.INTERNAL


def _more_open_files() -> None:
    """The soft limit of open files raised to the hard one (at most 65,536), as servers do: the
    render workers, the output tree's folders and the model's files each hold some, and a soft
    limit of 1,024 (or less, from a login shell) is a limit no one chose for this run."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, OSError, ValueError):
        pass  # not on this system, or not allowed: the limit stays as it is


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
