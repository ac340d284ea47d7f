"""Vision backends (numpy, torch, Core ML) and the torch-backed GPU switches for prefill/decode.

    backend = make_vision_backend("numpy" | "torch" | "coreml" | "auto", vlm, device=None, dtype="float32")
    features = backend.encode(pixels)        # pixels [3, H, W] float32 -> features [M, n_embd] float32

Importing this package imports neither torch nor coremltools: each backend imports its library
when it is built, and a missing extra or device raises `BackendUnavailable` (a UsageError, exit
code 2) whose message is one line saying what to install or choose instead.

`auto` picks Core ML on macOS (when coremltools is installed), else torch on CUDA (or MPS) when
torch sees such a device, else numpy; it never fails for want of an extra, and `backend.reason`
says why it chose what it chose.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Protocol, runtime_checkable

import numpy as np

from ...errors import UsageError

BACKENDS = ("numpy", "torch", "coreml", "auto")
DTYPES = ("float32", "bfloat16", "float16")
GPU_EXTRA = "pip install 'pantheon-ocr[gpu]'"
COREML_EXTRA = "pip install 'pantheon-ocr[coreml]'"


class BackendUnavailable(UsageError):
    """The chosen backend or device cannot run here; the message says what to install or pick."""


@runtime_checkable
class VisionBackend(Protocol):
    name: str  # "numpy", "torch", "coreml"
    device: str  # "cpu", "cuda:0", "mps", "coreml:ALL", ...
    dtype: str

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """pixels float32 [3, H, W] (preprocessed) -> image features float32 [M, n_embd]."""
        ...


class NumpyVisionBackend:
    """The engine's own numpy vision encoder + projector (the default; needs nothing extra)."""

    name, device, dtype = "numpy", "cpu", "float32"

    def __init__(self, vlm, reason: str = "chosen"):
        self.vlm, self.reason = vlm, reason

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        return self.vlm.encode_image(_check_pixels(pixels))

    def __repr__(self) -> str:
        return "NumpyVisionBackend()"


def plan_vision_backend(name: str, device: str | None = None, dtype: str = "float32") -> tuple[str, str | None, str]:
    """Check a backend choice without a model: (backend, device, reason), with `auto` resolved
    and the torch device resolved. Raises UsageError / BackendUnavailable (one line) when the
    choice cannot run here, so the CLI can fail before loading a model."""
    if name not in BACKENDS:
        raise UsageError(f"unknown vision backend {name!r} (choose one of {', '.join(BACKENDS)})")
    if dtype not in DTYPES:
        raise UsageError(f"unknown vision dtype {dtype!r} (choose one of {', '.join(DTYPES)})")
    reason = "chosen"
    if name == "auto":
        name, device, reason = _auto(device)
    if name == "numpy":
        if device not in (None, "cpu"):
            raise UsageError(f"the numpy vision backend runs on the CPU only (got --device {device}); "
                             "use --vision-backend torch for a torch device")
        if dtype != "float32":
            raise UsageError(f"the numpy vision backend computes in float32 only (got --vision-dtype {dtype}"
                             + ("" if reason == "chosen" else f"; auto chose numpy: {reason}") + ")")
        return name, "cpu", reason
    if name == "torch":
        return name, resolve_device(device), reason
    # coreml
    if device not in (None, "cpu"):
        raise UsageError(f"--device {device} is a torch device; Core ML picks its own compute units "
                         "(CPU, GPU, Neural Engine)")
    if dtype == "bfloat16":
        raise UsageError("Core ML computes in float32 or float16, not bfloat16 "
                         "(--vision-dtype float16 runs on the Neural Engine)")
    from .coreml import require_coreml

    require_coreml(run=True)
    return name, None, reason


def make_vision_backend(name: str, vlm, device: str | None = None, dtype: str = "float32", *,
                        cache_dir=None, compute_units: str = "ALL") -> VisionBackend:
    """The vision backend `name` for a LightOnOCR model `vlm` (anything with `.vision`,
    `.projector`, `.vision_config`, `.encode_image`, `.mmproj`).

    device: torch device for "torch" ("cpu", "cuda", "cuda:1", "mps"; default: the best one torch
    sees). dtype: "float32" (default), "bfloat16" (torch), "float16" (torch, Core ML).
    cache_dir / compute_units: Core ML only (see backends.coreml)."""
    name, device, reason = plan_vision_backend(name, device, dtype)
    if name == "numpy":
        return NumpyVisionBackend(vlm, reason)
    if name == "torch":
        from .torch_vision import TorchVisionBackend

        backend = TorchVisionBackend(vlm, device=device, dtype=dtype)
    else:
        from .coreml import CoreMLVisionBackend

        backend = CoreMLVisionBackend(vlm, dtype=dtype, cache_dir=cache_dir, compute_units=compute_units)
    backend.reason = reason
    return backend


# -- availability --------------------------------------------------------------------------------
def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_torch():
    """torch, or BackendUnavailable saying to install the gpu extra.

    Before torch's first import this sets OMP_WAIT_POLICY=PASSIVE unless the user set it: torch's
    OpenMP workers otherwise spin after every op and steal the cores that numpy's BLAS needs in the
    other pipeline stage (measured here: --gpu-decode on device cpu 30x slower at B=4, the numpy
    CPU stage 7x slower after torch vision calls)."""
    if not has_module("torch"):
        raise BackendUnavailable(f"this needs torch, which is not installed: {GPU_EXTRA}")
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install is still one line
        raise BackendUnavailable(f"torch is installed but cannot be imported ({type(exc).__name__}: {exc}); "
                                 f"reinstall it with {GPU_EXTRA}") from exc
    return torch


def resolve_device(device: str | None) -> str:
    """A torch device string that works here: None -> cuda, else mps, else cpu. An explicit device
    that torch cannot use raises BackendUnavailable naming what is missing."""
    torch = require_torch()
    if device is None:
        if torch.cuda.is_available():
            return "cuda"
        if _mps_available(torch):
            return "mps"
        return "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise BackendUnavailable(f"--device {device!r} is not a torch device (use cpu, cuda, cuda:N or mps)") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise BackendUnavailable(f"--device {device}: {why} (torch {torch.__version__}); install a CUDA build "
                                     f"of torch on a machine with an NVIDIA GPU, or use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BackendUnavailable(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type == "mps":
        if not _mps_available(torch):
            raise BackendUnavailable(f"--device {device}: the Apple MPS backend is not available here "
                                     "(it needs macOS on Apple silicon); use --device cpu")
    elif dev.type != "cpu":
        raise BackendUnavailable(f"--device {device}: unsupported device type {dev.type!r} (use cpu, cuda or mps)")
    return str(dev)


def _mps_available(torch) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _auto(device: str | None) -> tuple[str, str | None, str]:
    """(backend, device, reason) for --vision-backend auto."""
    if device == "cpu":
        return "numpy", None, "--device cpu: the engine's own numpy encoder"
    if device is not None:  # an explicit accelerator: torch or a one-line reason why not
        return "torch", resolve_device(device), f"torch on the requested --device {device}"
    if platform.system() == "Darwin" and has_module("coremltools") and has_module("torch"):
        from .coreml import MIN_MACOS, macos_major

        if macos_major() >= MIN_MACOS:
            return "coreml", None, "macOS with coremltools"
    if has_module("torch"):
        try:
            torch = require_torch()
        except BackendUnavailable as exc:
            return "numpy", None, str(exc)
        if torch.cuda.is_available():
            return "torch", "cuda", "torch sees a CUDA GPU"
        if _mps_available(torch):
            return "torch", "mps", "torch sees an Apple MPS GPU"
        return "numpy", None, "torch sees no GPU"
    return "numpy", None, f"no accelerator library installed ({GPU_EXTRA} for CUDA/MPS, {COREML_EXTRA} on macOS)"


def _check_pixels(pixels: np.ndarray) -> np.ndarray:
    if not isinstance(pixels, np.ndarray) or pixels.ndim != 3 or pixels.shape[0] != 3:
        raise ValueError(f"pixels must be a float array [3, H, W], got {getattr(pixels, 'shape', type(pixels))}")
    return np.ascontiguousarray(pixels, dtype=np.float32)


__all__ = ["BACKENDS", "DTYPES", "BackendUnavailable", "NumpyVisionBackend", "VisionBackend",
           "make_vision_backend", "plan_vision_backend", "require_torch", "resolve_device"]
