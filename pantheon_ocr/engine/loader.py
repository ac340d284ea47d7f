"""Paths -> a ready engine: the one place that does it, for the command line, archive jobs,
benchmarks, scripts and Ray workers.

    engine, notes = load_page_engine(EngineOptions(text, mmproj, weights="f32"))
    model = load_model(path)                          # a decoder GGUF on its own (TextModel)
    vlm = load_vlm(text, mmproj)                      # the LightOnOCR model itself

Nothing here prints: what a person should know about the engine (a tiny test model, what `auto`
chose for the weights and the vision backend, and why) comes back as `notes`, one sentence each,
for the caller to show; the choices start with "weights:", "vision backend:", "KV cache:",
"decode attention:", "products:", "prompt attention:", "prompt rows:" and "threads:" (PLAN_NOTES).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OptionError, path_record
from ..options import TORCH_STORAGES, EngineOptions
from .attention import TowerOptions
from .threads import cores, cpu_count

if TYPE_CHECKING:  # importing the engine's face must stay cheap: weights.py loads gguf
    from .format.weights import Storage

# notes that say what auto chose (the CLI shows why under -v)
PLAN_NOTES = ("weights:", "vision backend:", "KV cache:", "decode attention:", "products:", "prompt attention:",
              "prompt rows:", "threads:")
TINY_BYTES = 50_000_000  # decoder weights below this cannot read whole pages
# Below this many parameters a tower's matmuls are too small for torch's per-call cost to pay:
# numpy float32 is the faster path (the bundled reader: 7.6 M; LightOnOCR's towers: 0.4 G, 0.6 G).
SMALL_PARAMS = 100_000_000


def model_identity(*paths) -> str:
    """The model files as outputs record them: their names and a digest of their sizes and of
    bytes sampled through each (its start, its end and 16 spans between: a retrained model of
    the same shapes differs in its weights, and hashing a whole 1 GB file would cost seconds):
    'reader.gguf + reader-mmproj.gguf #1f0c...'. A file that cannot be read adds its name only
    (loading it says why)."""
    import hashlib
    import os

    digest = hashlib.blake2b(digest_size=8)
    span = 1 << 16
    for path in paths:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                digest.update(size.to_bytes(8, "little"))
                for k in range(18):
                    f.seek(max(0, min(size - span, (size - span) * k // 17)))
                    digest.update(f.read(span))
        except OSError:
            pass
    return " + ".join(path_record(Path(p).name) for p in paths) + f" #{digest.hexdigest()}"  # valid UTF-8


def _params(path) -> int | None:
    """Parameters of a GGUF file, or None if it cannot be read (loading it will say why, in the
    order the pair is checked)."""
    from ..errors import ModelError
    from .format.gguf import open_gguf

    try:
        gf = open_gguf(path)
    except (ModelError, OSError):
        return None
    try:
        return tensor_params(gf)
    finally:
        gf.close()


def tensor_params(gf) -> int:
    """Parameters of an open GGUF file: the sum of its tensors' element counts."""
    return sum(math.prod(t.shape) for t in gf.tensors.values())


def overlap_pays(vision_device: str, vision_params: int | None) -> bool:
    """Whether a pipeline's vision stage pays running beside its CPU stage (what `--overlap` left at
    its default does): where the vision runs off the CPU (a GPU, Core ML) or its tower is small
    (the bundled reader: 146.9 vs 112.5 pages/min overlapped). A large tower on the CPU takes
    whole-core phases: overlapped, each stage ran on half the cores and the pages reached the
    decoder one vision apart (4 full pages x 1,000 tokens at the LightOnOCR-1B shapes, 2-core AVX2
    EPYC: 938 s overlapped at a mean batch of 1.0, 752 s in phases at 4.0; docs/benchmarks.md)."""
    return vision_device != "cpu" or (vision_params is not None and vision_params < SMALL_PARAMS)


def _millions(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n < 10e6 else f"{n / 1e6:.0f} M"


def auto_weights(model) -> tuple[str, str]:
    """The storage `auto` weights take for a text GGUF on this machine, and why (plan_auto)."""
    from .backends import cpu_has_bf16
    from .backends.common import FAST_EXTRA, has_module

    text_params = _params(model)
    if text_params is None:
        return "f32", "the text model cannot be read"
    if text_params < SMALL_PARAMS:
        return "f32", f"a small model ({_millions(text_params)} parameters): numpy float32 is fastest"
    if not has_module("torch"):
        return "f32", f"torch is not installed ({FAST_EXTRA} for bfloat16 weights)"
    if not cpu_has_bf16():
        return "int8", ("torch on a CPU without bfloat16 units: 8-bit tiles where the compiled products build (the "
                        "file's 4- and 5-bit groups as they are), else int8 rows, whose prompts multiply in float32; "
                        "a decode step reads about one byte per weight")
    return "int8", ("torch: 8-bit tiles where the compiled products build (the file's 4- and 5-bit groups as "
                    "they are), else int8 rows, whose prompts multiply in bfloat16; a decode step reads about one "
                    "byte per weight (twice bf16's speed at one sequence)")


def plan_auto(options: EngineOptions) -> tuple[EngineOptions, list[str]]:
    """`auto` weights and vision backend made concrete for this model on this machine, and why:
    for a large text model with torch installed, int8 (8-bit tiles where the compiled products build,
    else int8 rows). A decode step reads every weight once, so its speed is the bytes it reads: on an
    AVX-512 BF16 EPYC the LightOnOCR-1B decoder (2,336 cached positions, 2 threads) took 20.9 / 43.6 /
    50.2 tok/s at B = 1 / 4 / 16 with int8 rows against 9.6 / 25.5 / 44.2 with bf16, for a prompt 16%
    slower (10.9 against 9.4 s: each product widened the int8 matrix to bfloat16); as 8-bit tiles the
    BF16 file's page prompt took 6.2-7.0 s (products on int8 activation rows, the prompt's row
    operations in one pass each: backends/rows.py). Without bfloat16 units a bf16 product is
    emulated: on an AVX2 EPYC a batched decode step at B = 4 took 0.83 s with float32, 0.49 s with
    bf16 and 0.33 s with int8 rows, whose prompts multiply in float32 there, faster than f32's numpy
    loop. The torch (or Core ML) vision backend where installed, unless the vision tower is small (numpy runs
    a page's line pieces in one pass). Chosen once, before any weight is read. With torch weights,
    also the KV cache auto takes, which decode attention runs and which products multiply the
    decode steps' rows (the compiled kernels are built here if they can be)."""
    from .cache import kv_kind

    o, why = options, []
    if o.weights == "auto":
        weights, reason = auto_weights(o.model)
        o = replace(o, weights=weights)
        why.append(f"weights: {weights} ({reason})")
    if o.weights in TORCH_STORAGES:
        from .backends.native import decode_attention

        kv, built = kv_kind(o.kv_dtype, o.weights), decode_attention()
        if o.kv_dtype == "auto":
            why.append(f"KV cache: {kv} (" + ("a byte per value, which the compiled decode attention reads fastest"
                                               if kv == "int8" else "torch's decode products read bfloat16 fastest")
                       + ")")
        if kv in ("bfloat16", "int8"):
            from .backends.bf16_attention import prompt_attention_why

            why.append(f"decode attention: {built.why}")
            why.append(f"prompt attention: {prompt_attention_why()}")
        from .backends.products import products
        from .backends.rows import rows_why

        why.append(f"products: {products().why}")
        why.append(f"prompt rows: {rows_why()}")  # q/k norms and RoPE, SwiGLU, int8 KV store
    if o.vision_backend == "auto" and o.device is None and o.vision_dtype == "auto":
        vision_params = _params(o.mmproj)
        if vision_params is not None and vision_params < SMALL_PARAMS:
            o = replace(o, vision_backend="numpy")
            why.append(f"vision backend: numpy (a small vision tower, {_millions(vision_params)} parameters: "
                       "one numpy pass over a page's line pieces is fastest)")
    if o.threads is None:  # the run's total, which the stages share (threads.stage_threads)
        n, reason = cores()
        why.append(f"threads: {n} ({reason})")
    return o, why


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

    o, notes = plan_auto(options)
    cores = cpu_count()
    if o.threads and o.threads > cores:  # asked for, not chosen: said once, the run goes on as asked
        notes.append(f"threads {o.threads} is more than the {cores} cores this process may use: they take "
                     f"turns, which is slower than {cores}")
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
        if o.device is None and device == "cpu":  # they move work to an accelerator: without one they cost memory
            notes.append(f"{' and '.join(n for n, on in (('gpu-prefill', o.gpu_prefill), ('gpu-decode', o.gpu_decode)) if on)}: "
                         "no GPU here (torch finds no CUDA or MPS device), so the work runs through torch on the CPU, "
                         "with a second copy of the decoder's weights; leave it off on this machine")

    # Another vision backend keeps its own weights: the numpy tower then only maps the file.
    vlm = load_vlm(o.model, o.mmproj, weights=o.weights, vision_weights=None if planned == "numpy" else "quantized",
                   vision_tower=TowerOptions(n_layers=o.vision_layers, attention=o.attention),
                   text_tower=TowerOptions(n_layers=o.text_layers, attention=o.attention))
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
    vision_on = "cpu" if backend is None else backend.device
    engine = OCREngine(vlm, backend, gpu_prefill=o.gpu_prefill, gpu_decode=o.gpu_decode, device=device,
                       ignore_eos=o.ignore_eos, prefill_chunk=o.prefill_chunk, kv_dtype=o.kv_dtype,
                       overlaps=overlap_pays(vision_on, tensor_params(vlm.mmproj)),  # the file is open
                       model=model_identity(o.model, o.mmproj))
    return engine, notes
