"""The `pantheon-ocr` command: a click group whose subcommands are imported only when run,
so `pantheon-ocr --help` stays instant (no numpy, no engine)."""

from __future__ import annotations

import sys
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


class ReaderGone(Exception):
    """Standard output's (or error's) reader went away before we were done (`| head -1`)."""


def _gone_readers() -> list[int]:
    """Standard output and error where each is a pipe whose reader has closed it (POLLERR on its
    write end), so that a BrokenPipeError from anywhere else (a socket) stays an error of ours."""
    import select

    if sys.platform == "win32":  # no poll of pipes; a broken pipe there is the reader's
        return [1]
    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    return [fd for fd, events in poll.poll(0) if events & select.POLLERR]


class LazyGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # click would say nothing and exit 1, which reads as `pages failed`
            gone = _gone_readers()
            raise (ReaderGone(gone) if gone else _Unexpected(exc)) from None

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(import_module(f"pantheon_ocr.commands.{module}"), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and debug detail.")
@click.version_option(package_name="pantheon-ocr")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """pantheon-ocr: bulk OCR of PDFs and page images with LightOnOCR GGUF models."""
    ctx.obj = {"verbose": verbose}


def main(argv: list[str] | None = None) -> int:
    """Entry point: typed errors become one clear line and their exit code."""
    from .errors import ExitCode, PantheonError

    args = sys.argv[1:] if argv is None else argv
    verbose = "-v" in args or "--verbose" in args
    try:
        code = cli.main(args=args, prog_name="pantheon-ocr", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except PantheonError as exc:
        if verbose:
            raise
        click.echo(f"error: {shown(exc)}", err=True)
        return int(exc.exit_code)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except ReaderGone as exc:  # what was asked for stopped being read: end quietly, as `git log | head` does
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in exc.args[0]:  # so that the interpreter's last flush has nowhere to fail
            os.dup2(devnull, fd)
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
    except Exception as exc:  # a bug: say so in one line unless -v
        exc = exc.args[0] if isinstance(exc, _Unexpected) else exc
        if verbose:
            raise exc
        click.echo(f"internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)", err=True)
        return 1


def shown(exc) -> str:
    """An error as the command line says it: a setting the library names is shown as its flag."""
    from .errors import OptionError

    if isinstance(exc, OptionError) and exc.option:
        from .commands.options import flag_name

        return exc.named(flag_name(exc.option))
    return str(exc)


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
