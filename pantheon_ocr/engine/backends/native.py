"""Compiled kernels of the torch decode step, built from csrc/ with the system C compiler on first
use and called through ctypes: decode attention over a bfloat16 or int8 KV pool
(csrc/decode_attention.c says why it beats torch's products), and the products of int8 rows and
4-bit tiles with int8 activation rows (csrc/products.c).

Each library is built once per source, flags and compiler into the user cache
(`$PANTHEON_OCR_CACHE/kernels` or `~/.cache/pantheon-ocr/kernels`; compiled.py). It is
built for AVX-512 with VNNI, AVX-512 or AVX2, the best the CPU has (ISAS). Where the CPU is not
x86-64 with AVX2 and FMA, no compiler is found ($CC, else cc) or the build fails,
`decode_attention()` and `products()` say why and the engine keeps torch's products: the kernels
are a speed-up, never a requirement.

Its threads are torch's: built with OpenMP, the library takes the libgomp that torch loaded, so a
call runs on the pool whose threads still spin from torch's last product. Threads of its own, one
started per call, waited for the core such a spinning thread held: SmolLM2's decode step took 33.4
ms with them against 11.2 ms on torch's pool (2 threads, AVX-512 EPYC, the two builds taking turns in
one process). A compiler without OpenMP (Apple's clang) builds the threads-of-its-own version.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import cpu_flags, require_torch, user_cache_dir
from .compiled import cached_build, find_compiler

SOURCE = Path(__file__).parent / "csrc" / "decode_attention.c"
PRODUCTS_SOURCE = Path(__file__).parent / "csrc" / "products.c"
BF16_SOURCE = Path(__file__).parent / "csrc" / "bf16_attention.c"
ROWS_SOURCE = Path(__file__).parent / "csrc" / "rows.c"
INT8_ROWS_SOURCE = Path(__file__).parent / "csrc" / "int8_rows.c"
FLAGS = ("-O2", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fPIC", "-shared")
# Instruction sets a build may target, best first: the flags each adds to FLAGS and the CPU flags it
# needs (FLAGS' AVX2, FMA and F16C included). AVX-512 widens 16 stored values at a time (B = 16
# LightOnOCR-1B decode attention, 2,336 positions, int8 keys, Xeon with AVX-512: docs/benchmarks.md);
# VNNI multiplies 64 int8 pairs per instruction in the products.
BASE_NEEDS = frozenset({"avx2", "fma", "f16c"})
AVX512 = (("-mavx512f", "-mavx512bw", "-mavx512vl"), BASE_NEEDS | {"avx512f", "avx512bw", "avx512vl"})
ISAS = {"AVX-512 VNNI": ((*AVX512[0], "-mavx512vnni"), AVX512[1] | {"avx512_vnni"}),
        "AVX-512": AVX512,
        "AVX2": ((), BASE_NEEDS)}
# Threads: OpenMP first, so that the kernel's threads are torch's own pool (its libgomp is the one
# loaded; torch is imported before the library); threads of its own where the compiler has no OpenMP
THREADING = (("-fopenmp",), ("-pthread",))
MAX_GROUP, MAX_DIM = 16, 256  # as in the source
BUILD_TIMEOUT = 120  # seconds; the file builds in under a second


@dataclass(frozen=True)
class Built:
    """The outcome of a build: the kernel (None if none) and one line saying which path runs and why."""

    kernel: DecodeAttention | None
    why: str


class DecodeAttention:
    """csrc/decode_attention.c loaded: one call per layer of a decode step, every sequence at once,
    over a bfloat16 pool or an int8 one with its scales."""

    KINDS = {"bfloat16": (0, np.uint16), "int8": (1, np.int8)}  # pool kind -> (the kernel's code, stored dtype)

    def __init__(self, path: Path):
        self.path = path
        require_torch()  # its OpenMP runtime first: the library's libgomp then resolves to torch's pool
        self.lib = ctypes.CDLL(str(path))
        f = self.lib.decode_attention
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        f.argtypes = [i32, p, p, p, p, p, i64, p, p, i32, p, p, i32, i32, i32, ctypes.c_float, i32]
        f.restype = i32
        self._fn = f

    @staticmethod
    def takes(n_head: int, n_kv: int, head_dim: int) -> bool:
        """Whether the kernel covers a decoder of these shapes."""
        g = n_head // n_kv if n_kv else 0
        return g * n_kv == n_head and 1 <= g <= MAX_GROUP and head_dim % 8 == 0 and 8 <= head_dim <= MAX_DIM

    def __call__(self, k: np.ndarray, v: np.ndarray, slots, lengths, q: np.ndarray, *, scale: float, threads: int,
                 scales: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """k, v: one layer of a pool [slots, Hkv, cap, D], bfloat16 bits (uint16) or int8 with
        `scales` = (ks, vs [slots, Hkv, cap, 1] bfloat16 bits, kc [slots, Hkv, 1, D] float32) as
        cache.KVPool keeps them;
        sequence b's query q[b] [Hq, D] float32 attends to the first lengths[b] positions of slot
        slots[b] -> [B, Hq, D] float32."""
        kind = next((c for c, dt in self.KINDS.values() if k.dtype == dt), None)
        if kind is None or v.dtype != k.dtype or k.shape != v.shape or k.ndim != 4:
            raise ValueError(f"keys and values must be one pool layer [slots, Hkv, cap, D] of bfloat16 bits or int8, "
                             f"got {k.dtype} {k.shape} and {v.dtype} {v.shape}")
        n_slots, hkv, cap, d = k.shape
        ks = vs = kc = None
        if kind == 1:
            if scales is None:
                raise ValueError("int8 keys and values need their scales (ks, vs, kc)")
            ks, vs, kc = scales
            want = {"ks": (np.uint16, (n_slots, hkv, cap, 1)), "vs": (np.uint16, (n_slots, hkv, cap, 1)),
                    "kc": (np.float32, (n_slots, hkv, 1, d))}
            for name, a in zip(want, scales):
                dtype, shape = want[name]
                if a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                    raise ValueError(f"{name} must be C-contiguous {np.dtype(dtype).name} {shape}, "
                                     f"got {a.dtype} {a.shape}")
        if not (k.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("the pool layer must be C-contiguous")
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        q = np.ascontiguousarray(q, dtype=np.float32)
        b = len(slots)
        if q.ndim != 3 or q.shape[0] != b or q.shape[2] != d or not self.takes(q.shape[1], hkv, d):
            raise ValueError(f"queries {q.shape} do not fit {b} sequences over {hkv} KV heads of {d}")
        if lengths.shape != (b,) or b == 0 or slots.min() < 0 or slots.max() >= n_slots \
                or lengths.min() < 1 or lengths.max() > cap:
            raise ValueError(f"slots {slots.tolist()} / lengths {lengths.tolist()} out of the pool's "
                             f"{n_slots} slots x {cap} positions")
        out = np.empty_like(q)
        ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
        rc = self._fn(kind, ptr(k), ptr(v), ptr(ks), ptr(vs), ptr(kc), cap, ptr(slots), ptr(lengths), b, ptr(q),
                      ptr(out), hkv, q.shape[1] // hkv, d, scale, max(1, threads))
        if rc != 0:
            raise MemoryError("decode attention: out of memory") if rc == -2 else \
                RuntimeError(f"decode attention refused its shapes (code {rc})")
        return out


def isas_here() -> list[str]:
    """The instruction sets of ISAS this CPU has, best first (none off x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    flags = cpu_flags()  # /proc/cpuinfo read once
    return [name for name, (_, needs) in ISAS.items() if needs <= flags]


def _build(stem: str, source: Path, cache_dir: Path, cc: str | None, isa: str | None) -> tuple[Path, str, str] | str:
    """A library of `source` built (or found built) under cache_dir with compiler cc ($CC, else cc)
    for one of ISAS (the best this CPU has if None): (its path, the ISA, its threads), or why not."""
    here = isas_here()
    if not here:
        return "the compiled kernel needs an x86-64 CPU with AVX2, FMA and F16C"
    isa = isa or here[0]
    if isa not in here:
        return f"this CPU has no {isa}"
    compiler = find_compiler("CC", "cc", cc)
    if isinstance(compiler, str):
        return compiler
    # in order of preference: OpenMP, then threads of its own
    candidates = [[*FLAGS, *ISAS[isa][0], *threading, str(source)] for threading in THREADING]
    found = cached_build(compiler, stem, source, candidates, cache_dir, BUILD_TIMEOUT)
    if isinstance(found, str):
        return found
    which, path = found
    pool = "torch's OpenMP threads" if "-fopenmp" in THREADING[which] else "threads of its own (no OpenMP in the compiler)"
    return path, isa, pool


def load(stem: str, source: Path, make, what: str, otherwise: str, cache_dir: Path, cc: str | None = None,
         isa: str | None = None) -> tuple[object | None, str]:
    """A library of `source` built (or found built) as _build does and loaded by make(path): (the
    kernel, "the compiled <ISA> <what> (path; threads)"), or (None, "<otherwise> (why not)")."""
    found = _build(stem, source, cache_dir, cc, isa)
    if isinstance(found, str):
        return None, f"{otherwise} ({found})"
    path, isa, pool = found
    try:
        return make(path), f"the compiled {isa} {what} ({path}; {pool})"
    except OSError as exc:
        return None, f"{otherwise} ({path} does not load: {exc})"


class Library:
    """One library of csrc/ as one kind of kernel: `build(cache_dir)` builds it (or finds it built) as
    load() does, `compiled()` is this process's (built on first use in the user cache) or None, `why()`
    the line saying which path runs. `takes`: the library's function that says whether the build and
    the CPU run it (False where the build lacks what it needs: `lacks` says what). Several kinds may
    share one source (bf16_attention.py: softmax, vision and prompt attention): each loads it itself."""

    def __init__(self, stem: str, source: Path, make, what: str, otherwise: str, takes: str, lacks: str):
        self.stem, self.source, self.make, self.what, self.otherwise = stem, source, make, what, otherwise
        self.takes, self.lacks = takes, lacks

    def build(self, cache_dir, cc: str | None = None, isa: str | None = None):
        """The kernel built (or found built) under cache_dir with compiler cc ($CC, else cc) for one of
        ISAS (the best this CPU has if None), its `why` set; or why there is none."""
        kernel, why = load(self.stem, self.source, self.make, self.what, self.otherwise, cache_dir, cc, isa)
        if kernel is None:
            return why
        if not getattr(kernel.lib, self.takes)():
            return f"{self.otherwise} ({self.lacks})"
        kernel.why = why
        return kernel

    @functools.cached_property
    def _here(self):
        return self.build(user_cache_dir() / "kernels")

    def compiled(self):
        """This process's kernel, or None."""
        return None if isinstance(self._here, str) else self._here

    def why(self) -> str:
        """One line: this process's kernel, or what runs in its place and why."""
        return self._here if isinstance(self._here, str) else self._here.why


def build(cache_dir: Path, cc: str | None = None, isa: str | None = None) -> Built:
    """The decode attention built (or found built) under cache_dir with compiler cc ($CC, else cc)
    for one of ISAS (the best this CPU has if None), or why not."""
    return Built(*load("decode_attention", SOURCE, DecodeAttention, "kernel", "torch's products", cache_dir, cc, isa))


@functools.cache
def decode_attention() -> Built:
    """This process's kernel, built on first use in the user cache."""
    return build(user_cache_dir() / "kernels")
