"""Handing freed heap memory back to the system (glibc's malloc_trim).

A decode step in torch allocates and frees a few hundred tensors of ~100-200 KB whose sizes grow
by one position every step. Made from a pipeline's stage thread (a glibc arena of its own), the
freed chunks did not come back: RSS grew by ~15 MB per step of four LightOnOCR-1B pages (50 MB/s,
to 13 GB over four pages of 1,000 tokens), and the main thread showed a tenth of that. malloc_trim
returns every arena's free pages; called every TRIM_EVERY steps it held RSS flat for ~20 ms per
call (docs/benchmarks.md). Elsewhere than glibc (macOS, musl) there is nothing to call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

TRIM_EVERY = 16  # decode steps between two trims: ~3 s of steps at B = 4, ~1% of their time

_trim = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):  # not glibc
        _trim = None


def release_free_memory() -> None:
    """Give the free pages of every malloc arena back to the system (a no-op where unsupported)."""
    if _trim is not None:
        _trim(0)
