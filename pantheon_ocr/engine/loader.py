"""Paths -> a ready engine: the one place that does it, for the command line, archive jobs,
benchmarks, scripts and Ray workers.

    engine, notes = load_page_engine(EngineOptions(text, mmproj, weights="f32"))
    model = load_model(path)                          # a decoder GGUF on its own (TextModel)
    vlm = load_vlm(text, mmproj)                      # the LightOnOCR model itself

Nothing here prints: what a person should know about the engine (a tiny test model, what the
`auto` vision backend chose) comes back as `notes`, one sentence each, for the caller to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OptionError
from ..options import EngineOptions
from .attention import TowerOptions

if TYPE_CHECKING:  # importing the engine's face must stay cheap: weights.py loads gguf
    from .format.weights import Storage

TINY_BYTES = 50_000_000  # decoder weights below this cannot read whole pages


def load_model(path: str | Path, weights: Storage = "quantized", tower: TowerOptions = TowerOptions()):
    """A decoder GGUF ready to run (text_model.TextModel); weights: "quantized", "f32" or "bf16";
    tower: build options (benchmarks: fewer layers, naive attention, a timing hook)."""
    from .format.weights import STORAGE_MODES
    from .text_model import TextModel

    if weights not in STORAGE_MODES:
        raise ValueError(f"weights must be one of {STORAGE_MODES}, not {weights!r}")
    return TextModel(path, weights, tower)


def load_vlm(model_path: str | Path, mmproj_path: str | Path, weights: Storage = "quantized",
             vision_weights: Storage | None = None, *, vision_tower: TowerOptions = TowerOptions(),
             text_tower: TowerOptions = TowerOptions()):
    """A LightOnOCR text GGUF + mmproj GGUF pair (models.lightonocr.LightOnOCR). A pair that
    cannot be one model is one ModelError naming both files, before any weight is read.
    vision_weights: the vision tower's storage, if not `weights`; the towers' build options
    (benchmarks: fewer layers, naive attention, timing hooks)."""
    from .format.pairing import check_pair
    from .models.lightonocr import LightOnOCR

    check_pair(model_path, mmproj_path)
    return LightOnOCR(model_path, mmproj_path, weights, vision_weights, vision_tower=vision_tower, text_tower=text_tower)


def load_page_engine(options: EngineOptions):
    """The ready OCREngine for `options`, and notes for the user. A choice that cannot run here
    (a missing extra, no such device) fails before the model is loaded."""
    from .page_engine import OCREngine

    o = options
    switches = o.gpu_prefill or o.gpu_decode
    if o.device is not None and o.vision_backend == "numpy" and not switches:
        raise OptionError("device", "a torch device, for the torch or auto vision backend or the GPU prefill/decode "
                                    "switches; the numpy vision backend runs on the CPU", o.device)
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
    vlm = load_vlm(o.model, o.mmproj, weights=o.weights, vision_weights=None if planned == "numpy" else "quantized",
                   vision_tower=TowerOptions(n_layers=o.vision_layers, attention=o.attention),
                   text_tower=TowerOptions(n_layers=o.text_layers, attention=o.attention))
    notes = []
    n_bytes = sum(t.n_bytes for t in vlm.text.gguf.tensors.values())
    # Reading a whole page takes a big model; one this small that claims to is a test model.
    # (A reader of lines, like the bundled one, is small by design.)
    if n_bytes < TINY_BYTES and vlm.hints.segment == "page":
        notes.append(f"{Path(o.model).name} is a tiny test model ({n_bytes / 1e6:.0f} MB of weights): its text is "
                     "meaningless; use a LightOnOCR GGUF pair for real OCR")
    backend = None
    if not own_vision:
        from .backends import make_vision_backend

        backend = make_vision_backend(o.vision_backend, vlm, device=vision_device, dtype=o.vision_dtype)
        if o.vision_backend == "auto":
            notes.append(f"vision backend: {backend.name} on {backend.device} in {backend.dtype} ({backend.reason})")
        if backend.name == "numpy":
            backend = None  # the engine's own numpy path
    engine = OCREngine(vlm, backend, gpu_prefill=o.gpu_prefill, gpu_decode=o.gpu_decode, device=device,
                       ignore_eos=o.ignore_eos, prefill_chunk=o.prefill_chunk, kv_dtype=o.kv_dtype)
    return engine, notes
