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


class LazyGroup(click.Group):
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
        if verbose:
            raise
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
