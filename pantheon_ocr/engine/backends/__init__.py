"""Vision backends (numpy, torch, Core ML) and the torch-backed GPU switches for prefill/decode.

    backend = make_vision_backend("numpy" | "torch" | "coreml" | "auto", vlm, device=None, dtype="float32")
    features = backend.encode(pixels)        # pixels [3, H, W] float32 -> features [M, n_embd] float32

Importing this package imports neither torch nor coremltools: each backend imports its library
when it is built, and a missing extra or device raises `BackendUnavailable` (a UsageError, exit
code 2) whose message is one line saying what to install or choose instead.

`auto` picks Core ML on macOS (when coremltools is installed), else torch on CUDA (or MPS) when
torch sees such a device, else torch on the CPU when torch is installed (oneDNN matmuls and fused
attention: faster than numpy's BLAS, and far faster in bfloat16 on CPUs with bfloat16 units),
else numpy; it never fails for want of an extra, and `backend.reason` says why it chose what it
chose. The dtype `auto` is bfloat16 where torch runs on a CPU with AVX-512 BF16 or AMX units or on
a CUDA GPU with bfloat16 tensor cores (compute capability 8.0 and later), else float32
(tests/engine/test_backends_torch.py states bfloat16's error against float32).
"""

from __future__ import annotations

import platform
from typing import Protocol, runtime_checkable

import numpy as np

from ...errors import OptionError
from ...options import VISION_BACKENDS, VISION_DTYPES
from .common import (COREML_EXTRA, GPU_EXTRA, BackendUnavailable, check_pixels, cpu_has_bf16, cuda_has_bf16,
                     has_module, mps_available, require_torch, resolve_device)

BACKENDS = VISION_BACKENDS  # the one declaration, options.py's
DTYPES = VISION_DTYPES  # the one declaration, options.py's

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
        return self.vlm.encode_image(check_pixels(pixels))

    def __repr__(self) -> str:
        return "NumpyVisionBackend()"


def plan_vision_backend(name: str, device: str | None = None, dtype: str = "float32") -> tuple[str, str | None, str]:
    """Check a backend choice without a model: (backend, device, reason), with `auto` resolved
    and the torch device resolved. Raises UsageError / BackendUnavailable (one line) when the
    choice cannot run here, so the CLI can fail before loading a model."""
    if name not in BACKENDS:
        raise OptionError("vision_backend", f"unknown (choose one of {', '.join(BACKENDS)})", repr(name))
    if dtype not in DTYPES:
        raise OptionError("vision_dtype", f"unknown (choose one of {', '.join(DTYPES)})", repr(dtype))
    reason = "chosen"
    if name == "auto" and dtype == "int8":  # the one place its products run
        name, device, reason = "torch", device or "cpu", "int8 products run in torch on the CPU"
    elif name == "auto":
        name, device, reason = _auto(device)
    if name == "numpy":
        if device not in (None, "cpu"):
            raise OptionError("device", "the numpy vision backend runs on the CPU only; the torch vision backend "
                                        "runs on torch devices", device)
        if dtype not in ("float32", "auto"):
            raise OptionError("vision_dtype", "the numpy vision backend computes in float32 only"
                              + (" (int8 runs on the torch or auto vision backend)" if dtype == "int8" else "")
                              + ("" if reason == "chosen" else f" (auto chose numpy: {reason})"), dtype)
        return name, "cpu", reason
    if name == "torch":
        device = resolve_device(device)
        if dtype == "int8":
            from .int8_products import check_int8  # imports torch: only an int8 choice does

            check_int8(device)
        return name, device, reason
    # coreml
    if device not in (None, "cpu"):
        raise OptionError("device", "a torch device; Core ML picks its own compute units (CPU, GPU, Neural Engine)",
                          device)
    if dtype in ("bfloat16", "int8"):
        raise OptionError("vision_dtype", f"Core ML computes in float32 or float16, not {dtype} (float16 runs on "
                                          "the Neural Engine)", dtype)
    from .coreml import require_coreml

    require_coreml(run=True)
    return name, None, reason


def make_vision_backend(name: str, vlm, device: str | None = None, dtype: str = "float32", *,
                        cache_dir=None, compute_units: str = "ALL") -> VisionBackend:
    """The vision backend `name` for a LightOnOCR model `vlm` (anything with `.vision`,
    `.projector`, `.vision_config`, `.encode_image`, `.mmproj`).

    device: torch device for "torch" ("cpu", "cuda", "cuda:1", "mps"; default: the best one torch
    sees). dtype: "float32" (default), "bfloat16" (torch), "float16" (torch, Core ML), "int8" (torch on
    the CPU: bfloat16 with the blocks' products in int8).
    cache_dir / compute_units: Core ML only (see backends.coreml)."""
    name, device, reason = plan_vision_backend(name, device, dtype)
    dtype = resolve_dtype(name, device, dtype)
    if name == "numpy":
        return NumpyVisionBackend(vlm, reason)
    if name == "torch":
        from .torch_vision import TorchVisionBackend

        backend = TorchVisionBackend(vlm, device=device, dtype=dtype)
        reason = f"{reason}; {backend.kernels}"
    else:
        from .coreml import CoreMLVisionBackend

        backend = CoreMLVisionBackend(vlm, dtype=dtype, cache_dir=cache_dir, compute_units=compute_units)
    backend.reason = reason
    return backend


def resolve_dtype(name: str, device: str | None, dtype: str) -> str:
    """The compute dtype for a planned backend: `auto` is bfloat16 for torch on a CPU with
    bfloat16 units or a CUDA GPU with bfloat16 tensor cores, else float32."""
    if dtype != "auto" or name != "torch":
        return "float32" if dtype == "auto" else dtype
    device = device or "cpu"
    if device == "cpu":
        return "bfloat16" if cpu_has_bf16() else "float32"
    if device.startswith("cuda") and cuda_has_bf16(device):
        return "bfloat16"
    return "float32"


def _auto(device: str | None) -> tuple[str, str | None, str]:
    """(backend, device, reason) for --vision-backend auto."""
    if device == "cpu":
        return "numpy", None, "device cpu: the engine's own numpy encoder"
    if device is not None:  # an explicit accelerator: torch or a one-line reason why not
        return "torch", resolve_device(device), f"torch on the requested device {device}"
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
        if mps_available(torch):
            return "torch", "mps", "torch sees an Apple MPS GPU"
        units = "bfloat16 units" if cpu_has_bf16() else "no bfloat16 units"
        return "torch", "cpu", f"torch on the CPU (oneDNN matmuls; the CPU has {units})"
    return "numpy", None, f"no accelerator library installed ({GPU_EXTRA} for torch, {COREML_EXTRA} on macOS)"


__all__ = ["BACKENDS", "DTYPES", "BackendUnavailable", "NumpyVisionBackend", "VisionBackend", "cpu_has_bf16",
           "make_vision_backend", "plan_vision_backend", "require_torch", "resolve_device", "resolve_dtype"]
