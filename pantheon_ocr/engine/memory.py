"""Handing freed heap memory back to the system (glibc's malloc_trim), and buffers in huge pages.

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
import mmap
import sys

import numpy as np

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


HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page


def huge_page_buffer(n_bytes: int) -> np.ndarray | None:
    """n_bytes of zeroed memory (uint8) in an anonymous map of its own, its 2 MB-aligned part asked of
    the kernel as transparent huge pages (MADV_HUGEPAGE); None where the platform has no such advice.
    Unmapped when the array is collected.

    Why: a decode step streams every weight once, and the CPU's prefetchers stop at each 4 KiB page;
    torch's allocator hands out 4 KiB pages. The LightOnOCR-1B decoder's int8 matrices moved into huge
    pages (one process, both forms taking turns, 128 cached positions, 2 threads, Xeon): 47.9 against
    36.9 ms a step at B = 1, 232.5 against 188.9 at B = 16 (docs/benchmarks.md)."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS") or n_bytes <= 0:
        return None
    m = mmap.mmap(-1, n_bytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(m, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE  # the first huge page boundary inside the map
    try:
        m.madvise(mmap.MADV_HUGEPAGE, start, (len(whole) - start) // HUGE_PAGE * HUGE_PAGE)
    except OSError:  # a kernel without transparent huge pages
        return None
    return whole[start:start + n_bytes]
