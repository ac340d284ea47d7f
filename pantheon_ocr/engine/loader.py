"""Paths -> a ready engine: the one place that does it, for the command line, archive jobs,
benchmarks, scripts and Ray workers.

    text, mmproj = resolve_model(model, mmproj)       # --model/--mmproj (files, a folder or a pulled
                                                      # model's name) -> the two GGUF files
    engine, notes = load_page_engine(EngineOptions(text, mmproj, weights="f32"))
    model = load_model(path)                          # a decoder GGUF on its own (TextModel)
    vlm = load_vlm(text, mmproj)                      # the LightOnOCR model itself

Nothing here prints: what a person should know about the engine (a tiny test model, what the
`auto` vision backend chose) comes back as `notes`, one sentence each, for the caller to show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ModelError, UsageError
from .catalog import local_pair, parse_name

if TYPE_CHECKING:  # importing the engine's face must stay cheap: weights.py loads gguf
    from .weights import Storage

NO_MODEL = ("no model given and this install has no bundled reader: pull one (`pantheon-ocr models pull lightonocr-2`, "
            "then --model lightonocr-2), or pass --model TEXT.gguf --mmproj MMPROJ.gguf (a LightOnOCR GGUF pair) "
            "or --model DIR holding both")
TINY_BYTES = 50_000_000  # decoder weights below this cannot read whole pages
# The reader that ships inside the package (trained by training/, see its MODEL_CARD.md): what
# runs when no model is named.
BUNDLED = Path(__file__).resolve().parent.parent / "bundled" / "reader"


def bundled_reader() -> tuple[Path, Path] | None:
    """(text GGUF, mmproj GGUF) of the bundled reader, or None if this install lacks it."""
    text, mmproj = BUNDLED / "pantheon-reader.gguf", BUNDLED / "mmproj-pantheon-reader.gguf"
    return (text, mmproj) if text.is_file() and mmproj.is_file() else None


def resolve_model(model: str | Path | None, mmproj: str | Path | None, *,
                  names: tuple[str, str] = ("--model", "--mmproj"), where: str | None = None) -> tuple[Path, Path]:
    """The text GGUF and the mmproj GGUF a user named: two files, a folder holding one text
    GGUF and one *mmproj*.gguf, or the name of a pulled model (`lightonocr-2`, `owner/repo`,
    with `:QUANT` to choose among pulled text files; engine/catalog.py); an explicit mmproj wins
    over the folder's or the pulled one. No model: the bundled reader if this install has it.
    `names` are the option or key names the messages use, `where` the file they were read from
    (a job file). UsageError when the pair is incomplete or ambiguous; ModelError (exit 3) for a
    model name that is not pulled, naming the pull command (nothing is ever downloaded here).
    Whether named files exist and are models is for loading to say (callers that must know
    early check themselves)."""
    model_name, mmproj_name = names

    def bad(problem: str) -> UsageError:
        return UsageError(f"{where}: {problem}" if where else problem)

    if model is None:
        if mmproj is None and bundled_reader() is not None:
            return bundled_reader()
        if names == ("--model", "--mmproj"):
            raise bad(NO_MODEL)
        raise bad(f"{model_name}: required to run pages (a text GGUF, or a folder with the text and mmproj GGUFs)")
    text, proj = Path(model), Path(mmproj) if mmproj is not None else None
    if not text.exists() and parse_name(str(model)) is not None:
        try:
            pulled = local_pair(str(model))
        except ModelError as e:
            raise ModelError(e.path, f"{e.problem} ({model_name}{f' in {where}' if where else ''})") from None
        return pulled[0], proj or pulled[1]
    if text.is_dir():
        ggufs = sorted(text.glob("*.gguf"))
        projs = [p for p in ggufs if "mmproj" in p.name.lower()]
        plain = [p for p in ggufs if p not in projs]
        if len(plain) != 1 or (proj is None and len(projs) != 1):
            raise bad(f"{model_name}: {text} should hold one text GGUF and one *mmproj*.gguf, found "
                      f"{[p.name for p in ggufs]}; name the files with {model_name} and {mmproj_name}")
        text, proj = plain[0], proj or projs[0]
    if proj is None:
        raise bad(f"{mmproj_name}: required with {model_name} {text} (the vision half of the pair)")
    return text, proj


@dataclass(frozen=True)
class EngineOptions:
    """How to build a page engine; picklable, so a Ray worker can build its own."""

    model: Path  # the text GGUF (resolve_model gives it)
    mmproj: Path
    weights: Storage = "f32"  # resident float32 (numpy), "bf16" (torch, half the memory) or "quantized"
    vision_backend: str = "numpy"  # numpy, torch, coreml or auto (engine/backends)
    device: str | None = None  # torch device for the vision backend and the GPU switches
    vision_dtype: str = "auto"  # auto: bfloat16 for torch on a CPU with bfloat16 units, else float32
    kv_dtype: str = "float32"  # the KV cache: float32, or float16 (half the memory, slower numpy attention)
    prefill_chunk: int | None = None  # prompt tokens per prefill step (None: page_engine.PREFILL_CHUNK)
    gpu_prefill: bool = False  # prefill projections on the torch device
    gpu_decode: bool = False  # batched decode projections on the torch device
    # Benchmarks only (figures quoted from these must say so): the first N layers of a tower,
    # naive instead of blocked prefill attention, and pages that always run to max_tokens.
    vision_layers: int | None = None
    text_layers: int | None = None
    flash: bool = True
    ignore_eos: bool = False


def load_model(path: str | Path, weights: Storage = "quantized"):
    """A decoder GGUF ready to run (text_model.TextModel); weights: "quantized", "f32" or "bf16"."""
    from .text_model import TextModel
    from .weights import STORAGE_MODES

    if weights not in STORAGE_MODES:
        raise ValueError(f"weights must be one of {STORAGE_MODES}, not {weights!r}")
    return TextModel(path, weights)


def load_vlm(model_path: str | Path, mmproj_path: str | Path, weights: Storage = "quantized",
             vision_weights: Storage | None = None):
    """A LightOnOCR text GGUF + mmproj GGUF pair (models.lightonocr.LightOnOCR). A pair that
    cannot be one model is one ModelError naming both files, before any weight is read.
    vision_weights: the vision tower's storage, if not `weights`."""
    from .models.lightonocr import LightOnOCR
    from .pairing import check_pair

    check_pair(model_path, mmproj_path)
    return LightOnOCR(model_path, mmproj_path, weights, vision_weights)


def load_page_engine(options: EngineOptions):
    """The ready OCREngine for `options`, and notes for the user. A choice that cannot run here
    (a missing extra, no such device) fails before the model is loaded."""
    from .page_engine import OCREngine

    o = options
    switches = o.gpu_prefill or o.gpu_decode
    if o.device is not None and o.vision_backend == "numpy" and not switches:
        raise UsageError(f"--device {o.device} is for --vision-backend torch/auto or --gpu-prefill/--gpu-decode; "
                         "the numpy vision backend runs on the CPU")
    own_vision = o.vision_backend == "numpy" and o.vision_dtype in ("float32", "auto")
    vision_device = None if o.vision_backend == "numpy" else o.device
    device = o.device
    planned = "numpy"
    if not own_vision:
        from .backends import plan_vision_backend

        planned = plan_vision_backend(o.vision_backend, vision_device, o.vision_dtype)[0]
    if switches:
        from .backends import resolve_device

        device = resolve_device(device)

    # Another vision backend keeps its own weights: the numpy tower then only maps the file.
    vlm = load_vlm(o.model, o.mmproj, weights=o.weights, vision_weights=None if planned == "numpy" else "quantized")
    vlm.decoder.set_kv_dtype(o.kv_dtype)
    notes = []
    n_bytes = sum(t.n_bytes for t in vlm.text.gguf.tensors.values())
    # Reading a whole page takes a big model; one this small that claims to is a test model.
    # (A reader of lines, like the bundled one, is small by design.)
    if n_bytes < TINY_BYTES and vlm.vision_config.segment == "page":
        notes.append(f"{Path(o.model).name} is a tiny test model ({n_bytes / 1e6:.0f} MB of weights): its text is "
                     "meaningless; point --model/--mmproj at LightOnOCR GGUF files for real OCR")
    if o.vision_layers:
        vlm.vision.layers = vlm.vision.layers[: o.vision_layers]
    if o.text_layers:
        vlm.decoder.layers = vlm.decoder.layers[: o.text_layers]
    vlm.decoder.flash = o.flash
    backend = None
    if not own_vision:
        from .backends import make_vision_backend

        backend = make_vision_backend(o.vision_backend, vlm, device=vision_device, dtype=o.vision_dtype)
        if o.vision_backend == "auto":
            notes.append(f"vision backend: {backend.name} on {backend.device} in {backend.dtype} ({backend.reason})")
        if backend.name == "numpy":
            backend = None  # the engine's own numpy path
    chunk = {} if o.prefill_chunk is None else {"prefill_chunk": o.prefill_chunk}
    engine = OCREngine(vlm, backend, gpu_prefill=o.gpu_prefill, gpu_decode=o.gpu_decode, device=device,
                       ignore_eos=o.ignore_eos, **chunk)
    return engine, notes
