"""`pantheon-ocr models pull|list`: real LightOnOCR models from the Hugging Face Hub."""

from __future__ import annotations

import sys

import click


@click.group()
def models() -> None:
    """Get LightOnOCR models from the Hugging Face Hub and list the ones here."""


@models.command()
@click.argument("name")
@click.option("--quant", metavar="Q", help="Text model quantization, e.g. Q8_0, Q4_K_M, Q6_K, F16 "
                                           "(default: the publisher's recommended one that the repo has).")
@click.option("--revision", metavar="R", help="Branch, tag or commit of the repo (default: main).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
def pull(name, quant, revision, progress) -> None:
    """Download model NAME (a known name or owner/repo) into the Hugging Face cache.

    Known names: see `pantheon-ocr models list --known`. Any owner/repo holding a text GGUF and
    an mmproj GGUF works too. Then use it with `--model NAME`."""
    from ..modelfiles.hub import pull as pull_model

    show = sys.stderr.isatty() if progress is None else progress
    got = pull_model(name, quant, revision, progress=show, log=lambda line: click.echo(line, err=True))
    for path in (got.text, got.mmproj):
        click.echo(f"{path} ({path.stat().st_size / 1e6:,.1f} MB)")
    click.echo(f"ready: pantheon-ocr transcribe DOCS --model {name}" + (f":{quant.upper()}" if quant else ""), err=True)


@models.command(name="list")
@click.option("--known", is_flag=True, help="List the known short names and their repos instead.")
def list_(known) -> None:
    """Models in the Hugging Face cache (HF_HOME): name, files, sizes, paths."""
    if known:
        from ..modelfiles.catalog import KNOWN

        for name, v in KNOWN.items():
            click.echo(f"{name:20} {v.repo:45} {v.about}")
        return
    from ..modelfiles.catalog import hub_cache
    from ..modelfiles.hub import local_models

    found = local_models()
    if not found:
        click.echo(f"no models in {hub_cache()}: get one with `pantheon-ocr models pull lightonocr-2`", err=True)
        return
    for m in found:
        total = sum(f.size for f in m.files)
        click.echo(f"{m.name}  ({m.repo}, revision {m.revision[:12]}, {total / 1e6:,.1f} MB)")
        for f in m.files:
            kind = "mmproj" if f.mmproj else "text  "
            click.echo(f"  {kind} {f.quant or '?':7} {f.size / 1e6:10,.1f} MB  {f.path}")
