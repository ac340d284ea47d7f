"""`pantheon-ocr models pull|list`: real LightOnOCR models from the Hugging Face Hub."""

from __future__ import annotations


import click

from ..errors import path_text
from .common import show_progress

# The limits of modelfiles/transfer.py, as this command shows them: flag (if any), variable.
LIMIT_FLAGS = {"timeout": "--timeout or PANTHEON_HUB_TIMEOUT", "deadline": "--deadline or PANTHEON_HUB_DEADLINE",
               "min_rate": "PANTHEON_HUB_MIN_RATE", "max_wait": "PANTHEON_HUB_MAX_WAIT"}


@click.group()
def models() -> None:
    """Get LightOnOCR models from the Hugging Face Hub and list the ones here."""


@models.command()
@click.argument("name")
@click.option("--quant", metavar="Q", help="Text model quantization, e.g. Q8_0, Q4_K_M, Q6_K, F16 "
                                           "(default: the publisher's recommended one that the repo has).")
@click.option("--revision", metavar="R", help="Branch, tag or commit of the repo (default: main).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal, not under -q).")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="Seconds to connect, the longest silence while downloading, the most each Hub answer may take, "
                   "and the window of the minimum rate [default: 20, or PANTHEON_HUB_TIMEOUT].")
@click.option("--deadline", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="Seconds the whole pull may take [default: 7200, or PANTHEON_HUB_DEADLINE].")
def pull(name, quant, revision, progress, timeout, deadline) -> None:
    """Download model NAME (a known name or owner/repo) into the Hugging Face cache.

    Known names: see `pantheon-ocr models list --known`. Any owner/repo holding a text GGUF and
    an mmproj GGUF works too. Then use it with `--model NAME`.

    \b
    Every file is checked against the Hub's SHA-256 and the pair opened before it is kept. Limits:
      --timeout      20 s      PANTHEON_HUB_TIMEOUT
      --deadline     7200 s    PANTHEON_HUB_DEADLINE
      minimum rate   16000 B/s PANTHEON_HUB_MIN_RATE (slower over --timeout s: stalled)
      Retry-After    60 s      PANTHEON_HUB_MAX_WAIT (the longest wait a 429/503 gets, once)
    A broken transfer is resumed (3 times); a stalled or timed-out one is resumed by the next pull.
    Exit 69 when the Hub cannot be reached or answers unusably, 3 for a missing or bad model."""
    from ..errors import NetworkError
    from ..modelfiles.hub import pull as pull_model
    from ..modelfiles.transfer import Limits

    show = show_progress(progress, terminal_only=True)
    limits = Limits.from_env(timeout=timeout, deadline=deadline)
    try:
        got = pull_model(name, quant, revision, progress=show, log=lambda line: click.echo(line, err=True),
                         limits=limits)
    except NetworkError as e:
        if e.setting in LIMIT_FLAGS:
            raise NetworkError(e.where, f"{e.problem} (limit: {LIMIT_FLAGS[e.setting]})", e.setting) from None
        raise
    for path in (got.text, got.mmproj):
        click.echo(f"{path_text(path)} ({path.stat().st_size / 1e6:,.1f} MB)")
    base, _, suffix = name.strip().partition(":")  # the quantization said once, whichever way it was given
    chosen = (quant or suffix).upper()
    click.echo(f"ready: pantheon-ocr transcribe DOCS --model {base}" + (f":{chosen}" if chosen else ""), err=True)


@models.command(name="list")
@click.option("--known", is_flag=True, help="List the known short names and their repos instead.")
def list_(known) -> None:
    """Models here: the reader bundled with pantheon-ocr (used when no --model is given) and the
    ones pulled into the Hugging Face cache (HF_HOME): name, files, sizes, paths."""
    if known:
        from ..modelfiles.catalog import KNOWN

        for name, v in KNOWN.items():
            click.echo(f"{name:20} {v.repo:45} {v.about}")
        return
    from ..modelfiles.catalog import hub_cache, pull_command, quant_of
    from ..modelfiles.hub import local_models
    from ..modelfiles.resolve import bundled_reader

    bundled = bundled_reader()
    if bundled is not None:
        sizes = [p.stat().st_size for p in bundled]
        click.echo(f"pantheon-reader (bundled)  (the default when no --model is given, {sum(sizes) / 1e6:,.1f} MB)")
        for kind, path, size in zip(("text  ", "mmproj"), bundled, sizes):
            _file_line(kind, quant_of(path.name) or "-", size, path)
    found = local_models()
    if not found:
        click.echo(f"no pulled models in {hub_cache()}: get one with `pantheon-ocr models pull lightonocr-2`", err=True)
        return
    for m in found:
        total = sum(f.size for f in m.files)
        click.echo(f"{path_text(m.name)}  ({path_text(m.repo)}, revision {path_text(m.revision[:12])}, "
                   f"{total / 1e6:,.1f} MB)")
        for f in m.files:
            _file_line("mmproj" if f.mmproj else "text  ", f.quant or "?", f.size, f.path)
        for gone in m.missing:
            click.echo(f"  deleted from the cache: {path_text(gone)}; `{pull_command(m.name, file=gone)}` fetches it again")


def _file_line(kind: str, quant: str, size: int, path) -> None:
    click.echo(f"  {kind} {quant:7} {size / 1e6:10,.1f} MB  {path_text(path)}")
