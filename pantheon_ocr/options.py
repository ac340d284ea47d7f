"""The one table of options: engine, pipeline and sampling settings as frozen dataclasses, each
field with its default, its choices or range and its help, written once.

The command line (commands/options.py turns fields into click options), the archive job file
(archive/spec.py turns them into the [model] and [ocr] schema) and the benchmarks all read these
declarations, so `transcribe`, a nightly job and `bench pages` default to the same thing. Like
errors.py this is a leaf: it imports nothing from the package but errors.py, so the engine may
import it.

    EngineOptions(model, mmproj, weights="auto")     # how to build a page engine (engine/loader.py)
    PipelineOptions(out_dir, batch_size=8, ...)      # how to run pages (pipeline/run.py)
    SamplingOptions(max_tokens=4096, ...)            # how a page's tokens are chosen (engine/sampling.py)
    spec(EngineOptions, "weights")                   # an Option: default, choices, range, help
"""

from __future__ import annotations

import math
from dataclasses import MISSING, InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import UsageError

# ------------------------------------------------------------------------------------ choices
STORAGE_MODES = ("f32", "bf16", "int8", "quantized")  # weights: resident float32, bfloat16, int8 rows; kept quantized
TORCH_STORAGES = ("bf16", "int8")  # the storages torch multiplies (engine/format/torch_weights.py)
WEIGHT_CHOICES = ("auto",) + STORAGE_MODES  # auto: the engine's plan for this model and CPU (engine/loader.py)
VISION_BACKENDS = ("numpy", "torch", "coreml", "auto")
VISION_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")  # int8: bfloat16, the tower's products in int8
KV_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")  # auto: engine/cache.py kv_kind
ATTENTION_KINDS = ("flash", "naive")  # prefill / vision attention: blocked, or the naive reference
SEGMENT_MODES = ("page", "blocks", "lines")  # read whole pages, or cut them into blocks or lines first
FORMATS = ("md", "jsonl", "txt")
TEXT_LAYER_MODES = ("ocr", "prefer", "fallback")  # what a PDF's own text layer is used for
MAX_THREADS = 512  # threads or render processes: more is a typo, and each costs a start and memory
THREADS_DEFAULT = "every core this process may use, within a container's CPU quota"  # engine/threads.cpu_count
OVERLAP_WORDS = {None: "auto", True: "on", False: "off"}  # PipelineOptions.overlap as the benchmarks spell it
MAX_LONGEST_EDGE = 10000  # px: a page rendered larger is hundreds of MB and tens of thousands of image tokens
PREFILL_CHUNK = 512  # prompt tokens per prefill step: a Letter page's ~2,330-token prompt is 5 chunks


@dataclass(frozen=True)
class Option:
    """What the table says about one setting (a dataclass field's metadata)."""

    name: str
    default: Any
    help: str
    kind: str  # int, float, str, bool, choice, list (of choices)
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    cli: bool = True  # a flag of transcribe (and where it applies, bench)
    job: bool = True  # a key of the job file
    metavar: str | None = None
    cli_name: str | None = None  # the flag's word when it is not the field's name (--format)

    @property
    def flag(self) -> str:
        return "--" + (self.cli_name or self.name).replace("_", "-")

    def check(self, value: Any) -> Any:
        """The value if it fits, else UsageError saying what it must be (job files, the API)."""
        if value is None and self.default is None:
            return None
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise UsageError("must be true or false")
        elif self.kind in ("int", "float"):
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if self.kind == "int" and not isinstance(value, int):
                number = False
            if not number or (self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)) \
                    or (self.hi is not None and value > self.hi):
                raise UsageError(f"must be {'an integer' if self.kind == 'int' else 'a finite number'}{self.range_text()}")
            return float(value) if self.kind == "float" else value
        elif self.kind == "choice":
            if value not in self.choices:
                raise UsageError("must be one of " + ", ".join(repr(c) for c in self.choices))
        elif self.kind == "list":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
                raise UsageError("must be a list of non-empty strings")
            if any(v not in self.choices for v in value):
                raise UsageError("values must be among " + ", ".join(repr(c) for c in self.choices))
            if len(set(value)) != len(value):
                raise UsageError("has a value twice")
            return tuple(value)
        elif not isinstance(value, str) or not value.strip():
            raise UsageError("must be a non-empty string")
        return value

    def range_text(self) -> str:
        lo = "" if self.lo is None else f" {'>' if self.lo_open else '>='} {self.lo:g}"
        hi = "" if self.hi is None else f"{' and' if lo else ''} <= {self.hi:g}"
        return lo + hi


def option(default: Any, help: str, *, kind: str | None = None, choices: tuple[str, ...] = (), lo=None, hi=None,
           lo_open: bool = False, cli: bool = True, job: bool = True, metavar: str | None = None,
           cli_name: str | None = None):
    """A dataclass field carrying its Option (kind inferred from the default or the choices)."""
    if kind is None:
        if choices:
            kind = "list" if isinstance(default, tuple) else "choice"
        elif isinstance(default, bool):
            kind = "bool"
        else:
            kind = {int: "int", float: "float", str: "str"}.get(type(default), "str")
    meta = dict(help=help, kind=kind, choices=tuple(choices), lo=lo, hi=hi, lo_open=lo_open, cli=cli, job=job,
                metavar=metavar, cli_name=cli_name)
    return field(default=default, metadata={"option": meta})


def spec(cls, name: str) -> Option:
    """The Option of field `name` of options class `cls`."""
    for f in fields(cls):
        if f.name == name:
            if "option" not in f.metadata:
                raise KeyError(f"{cls.__name__}.{name} is not a declared option")
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            return Option(name, default, **f.metadata["option"])
    raise KeyError(f"{cls.__name__} has no option {name!r}")


def specs(cls) -> list[Option]:
    """Every declared option of `cls`, in field order."""
    return [spec(cls, f.name) for f in fields(cls) if "option" in f.metadata]


def _validate(obj, skip: tuple[str, ...] = ()) -> None:
    for o in specs(type(obj)):
        if o.name in skip:
            continue
        value = getattr(obj, o.name)
        try:
            checked = o.check(value)
        except UsageError as e:
            raise UsageError(f"{o.name}: {e} (got {value!r})") from None
        if checked is not value and checked != value:
            object.__setattr__(obj, o.name, checked)
        elif o.kind == "list":
            object.__setattr__(obj, o.name, tuple(value))


# ----------------------------------------------------------------------------------- sampling
@dataclass(frozen=True)
class SamplingOptions:
    """How a page's tokens are chosen. The one sampling type of the project: the pipeline, archive
    jobs (which retry a page hotter) and the engine all pass it; validated when it is made."""

    max_tokens: int = option(4096, "Tokens per page at most (a dense page of LightOnOCR output is ~1-2k); per "
                                   "region where pages are read in regions (--segment lines or blocks).", lo=1)
    temperature: float = option(0.0, "0 = greedy: OCR wants the most likely reading, reproducibly.", lo=0)
    top_p: float = option(1.0, "Nucleus sampling mass (with --temperature > 0).", lo=0, hi=1, lo_open=True)
    seed: int | None = option(0, "Sampling seed.", kind="int", lo=0)  # None: a fresh random seed

    def __post_init__(self) -> None:
        # the table's types and ranges ('8' for max_tokens is no number); seed None is a fresh
        # random seed, the one value outside them
        _validate(self, skip=("seed",) if self.seed is None else ())


# ------------------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class EngineOptions:
    """How to build a page engine (engine/loader.py); picklable, so a Ray worker can build its own."""

    model: Path  # the text GGUF (modelfiles.resolve.resolve_model gives it)
    mmproj: Path
    weights: str = option("auto", "Weight storage: resident float32 (numpy, the reference), bfloat16 (torch: half "
                                   "the memory), int8 rows (torch: a quarter of the memory, the fastest decode; "
                                   "Q4_0 / Q4_1 matrices stay 4-bit, Q5_0 / Q5_1 5-bit and Q8_0 its blocks where the compiled products "
                                   "build), kept quantized (least memory), or auto: int8 "
                                   "for a large model with torch installed, else float32.", choices=WEIGHT_CHOICES)
    vision_backend: str = option("auto", "Where the vision stage runs: numpy (the reference), torch, Core ML, or auto: "
                                         "the fastest installed for this model (numpy for small towers).",
                                 choices=VISION_BACKENDS)
    device: str | None = option(None, "torch device for --vision-backend torch/auto and the --gpu-* switches "
                                      "(cpu, cuda, cuda:N, mps).", kind="str")
    vision_dtype: str = option("auto", "Vision compute type: torch (float32/bfloat16/float16), Core ML "
                                       "(float32/float16); int8: torch on the CPU in bfloat16 with the tower's "
                                       "products in int8 (faster, less exact); auto: bfloat16 for torch on CPUs with "
                                       "bfloat16 units and CUDA GPUs with bfloat16 tensor cores, else float32.",
                               choices=VISION_DTYPES)
    kv_dtype: str = option("auto", "KV cache type: bfloat16 or float16 halves float32's memory, int8 (a scale per "
                                   "position and head) quarters it; auto: with bf16 or int8 weights int8 where the "
                                   "compiled decode attention builds, else bfloat16; float32 with other weights.",
                           choices=KV_DTYPES)
    prefill_chunk: int = option(PREFILL_CHUNK, "Prompt tokens prefilled between two decode steps: pages already "
                                               "decoding never wait for a whole page's prompt.", lo=1)
    gpu_prefill: bool = option(False, "Run the prefill projections on the torch --device (weights uploaded once).")
    gpu_decode: bool = option(False, "Run the batched decode matmuls on the torch --device.")
    threads: int | None = option(None, f"Math threads in all (default: {THREADS_DEFAULT}).", kind="int", lo=1,
                                 hi=MAX_THREADS)
    # Benchmarks only (figures quoted from these must say so): the first N layers of a tower, the
    # naive attention reference, and pages that always run to max_tokens.
    vision_layers: int | None = option(None, "Run only the first N vision layers.", kind="int", lo=1, cli=False, job=False)
    text_layers: int | None = option(None, "Run only the first N decoder layers.", kind="int", lo=1, cli=False, job=False)
    attention: str = option("flash", "Prefill and vision attention.", choices=ATTENTION_KINDS, cli=False, job=False)
    ignore_eos: bool = option(False, "Generate exactly max_tokens per page.", cli=False, job=False)

    def __post_init__(self) -> None:
        _validate(self)


# ----------------------------------------------------------------------------------- pipeline
@dataclass(frozen=True)
class PipelineOptions:
    """How to run pages (pipeline/run.py)."""

    out_dir: Path
    formats: tuple[str, ...] = option(("md",), "Output format: repeat it, or give several with commas (md,jsonl); "
                                               "the first is the primary.", choices=FORMATS,
                                      cli_name="format")
    page_files: bool = option(False, "Also write one file per page.")
    overwrite: bool = False  # else documents whose outputs exist (from the same source) are skipped
    # A document the run does not finish is written with the pages read so far (pipeline/run.py);
    # off where the outputs go to a scratch folder that does not outlive the run (transcribe -o -).
    keep_unfinished: bool = True
    pages: str | None = option(None, "Pages to read in every document, counted from 1: e.g. 1-3,7; 5- is page 5 to "
                                     "the last, -3 is pages 1 to 3.", kind="str")
    password: str | None = option(None, "Password for encrypted PDFs.", kind="str")
    sampling: SamplingOptions = SamplingOptions()
    batch_size: int = option(8, "Pages decoded together.", lo=1, hi=256)
    overlap: bool | None = option(None, "Run the vision stage on its own thread, overlapped with prefill and decode "
                                        "(default: where it pays: vision on a GPU or Core ML, or a small vision tower; "
                                        "a large tower on the CPU runs in whole-core phases instead).", kind="bool")
    render_workers: int = option(2, "Processes rendering PDF pages (started as pages wait for them).", lo=1,
                                 hi=MAX_THREADS)
    render_timeout: float = option(120.0, "Seconds before a stuck render is killed.", lo=0, lo_open=True, cli=False)
    page_timeout: float | None = option(None, "Fail a page whose vision + prefill + decode take longer (reason: "
                                              "timeout); the batch goes on.", kind="float", lo=0, hi=86400,
                                        lo_open=True, metavar="SECONDS")
    text_layer: str = option("fallback", "A PDF's own text layer: ocr = never used; fallback = a page whose OCR "
                                         "failed takes it, marked as such; prefer = a page whose text layer holds real "
                                         "text keeps it and only the other pages are read by OCR.",
                             choices=TEXT_LAYER_MODES)
    # The old spelling: text_fallback=False is text_layer="ocr", True is "fallback".
    text_fallback: InitVar[bool | None] = None
    # Archive jobs fall back themselves, after a page's last attempt: their pipeline does not.
    fallback_in_pipeline: bool = True
    render_queue: int = 4  # rendered pages waiting for the vision stage
    features_queue: int = 2  # encoded pages waiting for a decode slot
    longest_edge: int | None = option(None, "Render pages at this longest edge (default: the model's).", kind="int",
                                      lo=64, hi=MAX_LONGEST_EDGE, cli=False)
    segment: str | None = option(None, "Read whole pages, or cut them into text blocks or lines first, each read as "
                                       "its own sequence (default: what the model's GGUF asks for; LightOnOCR reads "
                                       "pages).", kind="choice", choices=SEGMENT_MODES)

    def __post_init__(self, text_fallback: bool | None) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if text_fallback is not None:
            old = "fallback" if text_fallback else "ocr"
            # text_layer away from its default was given: the old spelling saying otherwise is a contradiction
            if self.text_layer not in ("fallback", old):
                from .errors import OptionError

                raise OptionError("text_fallback", f"the old spelling of text_layer ({old!r} here) contradicts "
                                                   f"text_layer {self.text_layer!r}: give text_layer alone")
            object.__setattr__(self, "text_layer", old)
        _validate(self)
        for name in ("render_queue", "features_queue"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name}: must be at least 1 (got {getattr(self, name)})")
