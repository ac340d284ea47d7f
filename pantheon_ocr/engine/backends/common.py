"""What the vision backends and GPU switches need from the machine: whether an extra is installed,
torch (imported once, quietly), a torch device that works here, and the one-line error when not.

Imported by the backends package and by each backend module (never the other way round)."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from ...errors import OptionError

GPU_EXTRA = "pip install 'pantheon-ocr[gpu]'"
FAST_EXTRA = "pip install 'pantheon-ocr[fast]'"  # torch for the CPU: bfloat16 weights, the torch vision backend
COREML_EXTRA = "pip install 'pantheon-ocr[coreml]'"
TORCH_SPIN = 10_000  # rounds torch's OpenMP workers spin before they sleep (require_torch)


class BackendUnavailable(OptionError):
    """The chosen backend or device cannot run here; the message says what to install or pick."""


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), []))
    except OSError:
        return frozenset()


def cpu_has_bf16() -> bool:
    """The CPU multiplies bfloat16 natively (x86 AVX-512 BF16 or AMX-BF16), as /proc/cpuinfo says.
    Without such units torch's bfloat16 products are emulated: on an AVX2 CPU (AMD EPYC, Zen 3)
    a prompt's bf16 GEMMs took 4x float32's time and the vision tower in bfloat16 100x."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cuda_has_bf16(device: str) -> bool:
    """The CUDA GPU `device` multiplies bfloat16 on its tensor cores (compute capability 8.0 and
    later: Ampere, Hopper). A full page's vision on an H100 took 0.06 s in bfloat16 against 0.46 s
    in float32 (docs/benchmarks.md), within the same error bound as on a CPU."""
    torch = require_torch()
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8


def cpu_has_amx() -> bool:
    """The CPU has AMX tiles for bfloat16 (Intel Sapphire Rapids and later), as /proc/cpuinfo says.
    torch's fused attention kernel (scaled_dot_product_attention's flash kernel) multiplies bfloat16
    with them there: a full page's vision attention (16 heads x 9,350 patches) took 0.49 s against
    0.95 s as bfloat16 products by query blocks, and a prompt chunk of 512 over 2,048 keys 10.7 ms
    against 24.5 (2 threads, Xeon with AMX). Without tiles the same kernel ran no faster in bfloat16
    than in float32 (2.13 s a page's layer on an AVX-512 BF16 EPYC), and the products by query blocks
    are the faster path (docs/benchmarks.md)."""
    return "amx_bf16" in cpu_flags()


def user_cache_dir() -> Path:
    """Where built things live when not next to a model: $PANTHEON_OCR_CACHE, else
    $XDG_CACHE_HOME/pantheon-ocr or ~/.cache/pantheon-ocr."""
    root = os.environ.get("PANTHEON_OCR_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pantheon-ocr"


def openmp_env() -> None:
    """torch's OpenMP spin (require_torch says why), unless the user set it; read when torch loads."""
    os.environ.setdefault("GOMP_SPINCOUNT", str(TORCH_SPIN))
    os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # bounded by the count


def require_torch():
    """torch, or BackendUnavailable saying to install the gpu extra.

    Before torch's first import this sets GOMP_SPINCOUNT=10000 and OMP_WAIT_POLICY=ACTIVE unless
    the user set them: with libgomp's default spin (300,000 rounds, about a millisecond) torch's
    OpenMP workers steal the cores that numpy's BLAS needs in the other pipeline stage (measured
    here: --gpu-decode on device cpu 30x slower at B=4, the numpy CPU stage 7x slower after torch
    vision calls); with no spin at all every small op of a decode step pays the workers' wake-up
    (SmolLM2 bf16 decode at B = 1: 25 tok/s passive, 47 with 10,000 rounds; docs/benchmarks.md).
    The policy matters once a second thread (a pipeline stage) runs torch: libgomp then counts more
    threads than cores and spins only its "throttled" count, 1,000 rounds under ACTIVE but none under
    PASSIVE, so under PASSIVE a decode step from the pipeline's stage thread took 1.3-1.5x the
    main thread's (docs/benchmarks.md); the explicit count bounds ACTIVE's spin as it did PASSIVE's."""
    if not has_module("torch"):
        raise BackendUnavailable(None, f"this needs torch, which is not installed: {GPU_EXTRA}")
    if "torch" not in sys.modules:
        openmp_env()
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install is still one line
        raise BackendUnavailable(None, f"torch is installed but cannot be imported ({type(exc).__name__}: {exc}); "
                                 f"reinstall it with {GPU_EXTRA}") from exc
    from ..threads import torch_threads

    torch_threads()  # the thread count chosen before torch loaded, if any
    return torch


def resolve_device(device: str | None) -> str:
    """A torch device string that works here: None -> cuda, else mps, else cpu. An explicit device
    that torch cannot use raises BackendUnavailable naming what is missing."""
    torch = require_torch()
    if device is None:
        if torch.cuda.is_available():
            return "cuda"
        if mps_available(torch):
            return "mps"
        return "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise BackendUnavailable("device", "not a torch device (use cpu, cuda, cuda:N or mps)", repr(device)) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise BackendUnavailable("device", f"{why} (torch {torch.__version__}); install a CUDA build of torch on "
                                               "a machine with an NVIDIA GPU, or use the cpu device", device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BackendUnavailable("device", f"only {torch.cuda.device_count()} CUDA device(s) visible", device)
    elif dev.type == "mps":
        if not mps_available(torch):
            raise BackendUnavailable("device", "the Apple MPS backend is not available here (it needs macOS on "
                                               "Apple silicon); use the cpu device", device)
    elif dev.type != "cpu":
        raise BackendUnavailable("device", f"unsupported device type {dev.type!r} (use cpu, cuda or mps)", device)
    return "cpu" if dev.type == "cpu" else str(dev)  # one spelling: "cpu:0" is the CPU the thread plan shares


def mps_available(torch) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def check_pixels(pixels: np.ndarray) -> np.ndarray:
    if not isinstance(pixels, np.ndarray) or pixels.ndim != 3 or pixels.shape[0] != 3:
        raise ValueError(f"pixels must be a float array [3, H, W], got {getattr(pixels, 'shape', type(pixels))}")
    return np.ascontiguousarray(pixels, dtype=np.float32)
