"""Click options made from the options table (pantheon_ocr/options.py): each flag's default,
choices, range and help come from the dataclass field that declares the setting, so the command
line cannot drift from the job file and the benchmarks.

    @table_options(EngineOptions, "weights", "vision_backend")   # --weights, --vision-backend
    def cmd(weights, vision_backend): ...

The library names a setting as the table does (`OptionError("device", ...)`); `flag_name` is how
the command line shows it.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..options import Option, spec


def flag_name(option: str) -> str:
    """The flag of a setting the library names (OptionError.option) as the table does."""
    from ..options import EngineOptions, PipelineOptions, SamplingOptions, specs

    for cls in (EngineOptions, PipelineOptions, SamplingOptions):
        for o in specs(cls):
            if o.name == option:
                return o.flag
    return "--" + option.replace("_", "-")


def shown(exc) -> str:
    """An error as the command line says it: a setting the library names is shown as its flag."""
    from ..errors import ModelError, OptionError

    if isinstance(exc, OptionError) and exc.option:
        return exc.named(flag_name(exc.option))
    if isinstance(exc, ModelError) and "models pull" not in str(exc):
        from ..modelfiles.catalog import cached_repo, pull_command

        repo = cached_repo(exc.path) if exc.path else None
        if repo:  # a pulled file that does not load: the cache's copy is damaged, a pull of it mends it
            return (f"{exc}; the Hugging Face cache's copy is damaged: `{pull_command(repo, file=Path(exc.path).name)}` "
                    "fetches it again")
    return str(exc)


class ChoiceList(click.Choice):
    """A list option's value: one choice, or several with commas (`--format md,jsonl`), as
    `--pages 1-3,7` and the bench lists take them; each checked against the choices."""

    name = "choice-list"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        return tuple(super(ChoiceList, self).convert(v.strip(), param, ctx) for v in str(value).split(","))


def _flatten(ctx, param, value) -> tuple:
    """--format md,jsonl --format txt -> ('md', 'jsonl', 'txt'); a repeat is kept once, in order."""
    return tuple(dict.fromkeys(v for item in value for v in (item if isinstance(item, tuple) else (item,))))


def click_option(o: Option, **override):
    """One click option for an Option of the table."""
    kw: dict = {"help": o.help, "show_default": o.default is not None}
    if o.kind == "bool":
        decl = f"{o.flag}/--no-{o.flag[2:]}"
        kw["default"] = o.default
    else:
        decl = o.flag
        kw["default"] = o.default
        if o.kind == "choice":
            kw["type"] = click.Choice(list(o.choices))
        elif o.kind == "list":
            kw.update(type=ChoiceList(list(o.choices)), multiple=True, callback=_flatten)
        elif o.kind in ("int", "float"):
            rng = click.IntRange if o.kind == "int" else click.FloatRange
            kw["type"] = rng(o.lo, o.hi, min_open=o.lo_open) if (o.lo is not None or o.hi is not None) else \
                (int if o.kind == "int" else float)
        if o.metavar:
            kw["metavar"] = o.metavar
    kw.update(override)
    return click.option(decl, o.name, **kw)


def table_options(cls, *names: str, **overrides):
    """Decorator: the click options for fields `names` of options class `cls` (overrides: a dict
    of click keywords per name)."""
    def decorate(fn):
        for name in reversed(names):
            fn = click_option(spec(cls, name), **overrides.get(name, {}))(fn)
        return fn

    return decorate
