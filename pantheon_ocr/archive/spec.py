"""The archive job file (TOML) -> a validated, frozen `JobSpec`.

Every problem is a JobError (exit code 2) naming the file and the key, e.g.
`nightly.toml: ocr.batch_size: must be an integer >= 1 (got "8")`. Relative paths are
relative to the job file's folder, so a cron entry works from any working directory.
docs/archive.md describes the format.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..errors import JobError, OptionError, UsageError, path_text
from ..modelfiles.catalog import parse_name
from ..options import EngineOptions, Option, PipelineOptions, SamplingOptions, specs
from ..pipeline.files import open_regular

RETRYABLE = ("repetition", "max_tokens", "error")  # outcomes `retry.on` may name


class _Bad(Exception):
    """A value failed its check; the message says what it must be."""


# ---------------------------------------------------------------- value checks


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _Bad(f"must be an integer{'' if lo is None else f' >= {lo}'}{'' if hi is None else f' and <= {hi}'}")
        return v

    return check


def _float(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # TOML has inf and nan
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v <= hi
        if not ok:
            rng = "" if lo is None else f" {'>' if lo_open else '>='} {lo}" + ("" if hi is None else f" and <= {hi}")
            raise _Bad(f"must be a finite number{rng}")
        return float(v)

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("must be true or false")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise _Bad("must be a non-empty string")
    return v


def _str_list(allowed: tuple[str, ...] | None = None, empty_ok: bool = False) -> Callable[[Any], tuple[str, ...]]:
    def check(v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            v = [v]  # inputs = "scans/" is as clear as a one-item list
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v) or (not v and not empty_ok):
            raise _Bad("must be a list of non-empty strings")
        if allowed is not None and any(x not in allowed for x in v):
            raise _Bad("values must be among " + ", ".join(repr(a) for a in allowed))
        if len(set(v)) != len(v):
            raise _Bad("has a value twice")
        return tuple(v)

    return check


def _float_list(v: Any) -> tuple[float, ...]:
    if not isinstance(v, list) or not v or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v):
        raise _Bad("must be a non-empty list of finite numbers >= 0")
    return tuple(float(x) for x in v)


def _pages(v: Any) -> str:
    from ..pipeline.inputs import validate_page_spec

    v = _str(v)
    try:
        validate_page_spec(v)
    except UsageError as e:
        raise _Bad(str(e)) from None
    return v


def _table(o: Option) -> tuple[Callable[[Any], Any], Any]:
    """A job-file key declared in the options table: its check and its default."""
    def check(v: Any) -> Any:
        try:
            return o.check(v)
        except UsageError as e:
            raise _Bad(str(e)) from None

    return check, o.default


def _section(*classes, skip: tuple[str, ...] = ()) -> dict[str, tuple[Callable[[Any], Any], Any]]:
    return {o.name: _table(o) for cls in classes for o in specs(cls) if o.job and o.name not in skip}


# key -> (check, default). A missing default (`...`) means required. The [model] and [ocr] keys
# are the options table's (options.py): the same defaults and choices as the command line.
SCHEMA: dict[str, dict[str, tuple[Callable[[Any], Any], Any]]] = {
    "": {
        "name": (_str, None),
        "inputs": (_str_list(), ...),
        "output": (_str, ...),
        "state": (_str, None),
        "reports": (_str, None),
        "rehash": (_bool, False),  # hash every document each run, not only when size/mtime changed
    },
    "model": {
        "name": (_str, None),  # a pulled model (`pantheon-ocr models pull NAME`), instead of text/mmproj files
        "text": (_str, None),
        "mmproj": (_str, None),
        **_section(EngineOptions),
    },
    "ocr": {
        **_section(SamplingOptions),
        **_section(PipelineOptions, skip=("pages",)),
        "pages": (_pages, None),
        "text_fallback": (_bool, None),  # the old spelling of text_layer: false = "ocr", true = "fallback"
    },
    "retry": {
        "attempts": (_int(1), 3),
        "temperatures": (_float_list, (0.2, 0.4)),
        "on": (_str_list(RETRYABLE, empty_ok=True), ("repetition", "error")),
    },
    "lock": {
        "stale_after": (_float(1), 60.0),  # seconds without a heartbeat before a lock is stale
    },
    "ray": {
        "address": (_str, None),
        "workers": (_int(1), None),
        "cpus_per_worker": (_float(0, lo_open=True), 1.0),
        "chunk_pages": (_int(1), 16),
    },
}


@dataclass(frozen=True)
class ModelSection:
    """[model]: which model (a pulled name, or the text and mmproj files) and how to run it."""

    name: str | None  # a pulled model (`pantheon-ocr models pull NAME`)
    text: Path | None
    mmproj: Path | None
    engine: EngineOptions  # the table's engine settings; its model/mmproj are filled once resolved


@dataclass(frozen=True)
class RetrySection:
    attempts: int  # tries per page, the first included
    temperatures: tuple[float, ...]  # of the retries, the last one repeated
    on: tuple[str, ...]  # outcomes that are retried (RETRYABLE)


@dataclass(frozen=True)
class LockSection:
    stale_after: float  # seconds without a heartbeat before a lock is stale


@dataclass(frozen=True)
class RaySection:
    address: str | None
    workers: int | None
    cpus_per_worker: float
    chunk_pages: int


@dataclass(frozen=True)
class JobSpec:
    path: Path  # the job file
    name: str
    inputs: tuple[str, ...]  # absolute (globs kept as globs)
    output: Path
    state: Path
    reports: Path
    model: ModelSection
    ocr: PipelineOptions  # [ocr], as the job file says (its sampling is the first attempt's)
    retry: RetrySection
    lock: LockSection
    ray: RaySection
    rehash: bool = False

    @property
    def attempts(self) -> int:
        return self.retry.attempts

    def sampling(self, attempt: int) -> SamplingOptions:
        """Sampling for the 1-based `attempt` of a page: the [ocr] setting first, then each
        retry hotter (retry.temperatures, the last one repeated) with a new seed, so a page that
        looped under one setting gets a different continuation rather than the same loop."""
        first = self.ocr.sampling
        if attempt == 1:
            return first
        temps = self.retry.temperatures
        return replace(first, temperature=temps[min(attempt - 2, len(temps) - 1)], seed=first.seed + attempt - 1)

    def pipeline_options(self) -> PipelineOptions:
        return replace(self.ocr, fallback_in_pipeline=False)  # the job falls back itself, after the last attempt


def _toml_module():
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise JobError("archive jobs need Python 3.11+ (tomllib) or the 'tomli' package on 3.10") from None
    return tomllib


def load_job(path: str | os.PathLike) -> JobSpec:
    """Read and validate a job file; JobError names the file and the key of any problem."""
    path = Path(path).expanduser().absolute()
    tomllib = _toml_module()
    try:
        with open_regular(path) as f:  # a FIFO or folder is an error, never a hang
            raw = f.read()
        # a byte-order mark (Windows editors write one) is no TOML, but no reason to refuse the file
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except FileNotFoundError:
        raise JobError(f"{path_text(path)}: no such job file") from None
    except OSError as e:
        raise JobError(f"{path_text(path)}: cannot read the job file: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"{path_text(path)}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise JobError(f"{path_text(path)}: not a UTF-8 text file (byte {e.start}): TOML job files are UTF-8") from None
    return parse_job(data, path)


def parse_job(data: dict, path: Path) -> JobSpec:
    where = path.name
    values: dict[str, dict[str, Any]] = {}
    top_keys = list(SCHEMA[""]) + [s for s in SCHEMA if s]
    for key in data:
        if key not in top_keys:
            raise JobError(f"{where}: unknown key {key!r}{_did_you_mean(key, top_keys)}")
    for section, keys in SCHEMA.items():
        table = data if section == "" else data.get(section, {})
        if not isinstance(table, dict):
            raise JobError(f"{where}: {section}: must be a table ([{section}])")
        if section:
            for key in table:
                if key not in keys:
                    raise JobError(f"{where}: unknown key '{section}.{key}'{_did_you_mean(key, list(keys), section + '.')}")
        values[section] = {}
        for key, (check, default) in keys.items():
            full = f"{section}.{key}" if section else key
            if key in table:
                try:
                    values[section][key] = check(table[key])
                except _Bad as e:
                    raise JobError(f"{where}: {full}: {e} (got {_show(table[key])})") from None
            elif default is ...:
                raise JobError(f"{where}: {full}: required key is missing")
            else:
                values[section][key] = default
    top, base = values[""], path.parent

    def resolve(p: str) -> Path:
        return (base / Path(p).expanduser()).absolute()

    model = dict(values["model"])
    if model["name"] and model["text"]:
        raise JobError(f"{where}: model.name and model.text: give one (a pulled model's name, or the text GGUF)")
    if model["text"] and not resolve(model["text"]).exists() and _model_name(model["text"], where):
        model["name"], model["text"] = model["text"], None  # `text = "lightonocr-2"`: a name, not a file here
    if model["name"]:
        _model_name(model["name"], where, required=True)
    for key in ("text", "mmproj"):
        model[key] = resolve(model[key]) if model[key] else None
    stem = path.stem
    output = resolve(top["output"])
    settings = {k: v for k, v in model.items() if k not in ("name", "text", "mmproj")}
    ocr = values["ocr"]
    sampling = {k: ocr.pop(k) for k in [o.name for o in specs(SamplingOptions)]}
    try:
        engine = EngineOptions(model["text"], model["mmproj"], **settings)
        pipeline = PipelineOptions(out_dir=output, overwrite=True, sampling=SamplingOptions(**sampling), **ocr)
    except OptionError as e:  # a combination the checks of single keys cannot see
        raise JobError(f"{where}: {e.named(e.option and key_of(e.option))}") from None
    except UsageError as e:
        raise JobError(f"{where}: {e}") from None
    return JobSpec(
        path=path,
        name=top["name"] or path_text(stem),
        inputs=tuple(str(resolve(i)) for i in top["inputs"]),
        output=output,
        state=resolve(top["state"]) if top["state"] else base / f"{stem}.sqlite",
        reports=resolve(top["reports"]) if top["reports"] else base / f"{stem}-reports",
        rehash=top["rehash"],
        model=ModelSection(model["name"], model["text"], model["mmproj"], engine),
        ocr=pipeline,
        retry=RetrySection(**values["retry"]),
        lock=LockSection(**values["lock"]),
        ray=RaySection(**values["ray"]),
    )


def key_of(option: str) -> str:
    """The job-file key of a setting the library names (OptionError.option)."""
    for section, keys in SCHEMA.items():
        if option in keys:
            return f"{section}.{option}" if section else option
    return option


def _model_name(value: str, where: str, required: bool = False) -> bool:
    """Whether `value` is a model name (modelfiles/catalog.py); JobError for a malformed one."""

    try:
        ok = parse_name(value) is not None
    except UsageError as e:
        raise JobError(f"{where}: model: {e}") from None
    if required and not ok:
        raise JobError(f"{where}: model.name: {value!r} is not a model name (a short name such as lightonocr-2, or owner/repo)")
    return ok


def _did_you_mean(key: str, known: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else f" (known: {', '.join(known)})"


def _show(v: Any) -> str:
    text = repr(v) if not isinstance(v, str) else '"' + v + '"'
    return text if len(text) <= 60 else text[:57] + "..."
