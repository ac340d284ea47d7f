"""The vision attention's softmax over bfloat16 scores, in place (csrc/softmax.c, which says why),
built by native.py's outline into the user cache and called through ctypes by the torch vision
backend's attention by query blocks (torch_pixtral.query_block_attention). Where it does not build or
the CPU has no AVX-512 BF16, `compiled_softmax()` is None and torch's softmax runs.

    softmax = compiled_softmax()          # None, or a function of a 2-D bfloat16 tensor
    p = softmax(scores)                   # scores [rows, cols] bfloat16, overwritten with their softmax
"""

from __future__ import annotations

import ctypes
import functools

from .common import require_torch, user_cache_dir
from .native import SOFTMAX_SOURCE, load

torch = require_torch()


class CompiledSoftmax:
    """csrc/softmax.c loaded: `softmax(scores)` over the last axis of a contiguous 2-D bfloat16 tensor."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        lib.softmax_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        lib.softmax_bf16.restype = lib.softmax_takes.restype = ctypes.c_int

    def __call__(self, scores):
        if scores.dtype != torch.bfloat16 or scores.dim() != 2 or not scores.is_contiguous():
            raise ValueError(f"scores must be a contiguous 2-D bfloat16 tensor, got {scores.dtype} {tuple(scores.shape)}")
        rc = self.lib.softmax_bf16(scores.data_ptr(), scores.shape[0], scores.shape[1], scores.shape[1],
                                   torch.get_num_threads())
        if rc == -2:
            raise MemoryError("softmax: out of memory")
        if rc != 0:
            raise ValueError(f"softmax refused rows of {scores.shape[1]}")
        return scores


def build(cache_dir, cc: str | None = None) -> CompiledSoftmax | str:
    """The softmax built (or found built) under cache_dir, or why there is none."""
    kernel, why = load("softmax", SOFTMAX_SOURCE, CompiledSoftmax, "softmax", "torch's softmax", cache_dir, cc)
    if kernel is not None and not kernel.lib.softmax_takes():
        return "torch's softmax (the CPU has no AVX-512 BF16)"
    return why if kernel is None else kernel


@functools.cache
def compiled_softmax() -> CompiledSoftmax | None:
    """This process's softmax, built on first use in the user cache, or None (torch's then runs)."""
    built = build(user_cache_dir() / "kernels")
    return None if isinstance(built, str) else built
