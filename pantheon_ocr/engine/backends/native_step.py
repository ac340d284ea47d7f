"""The torch decode step compiled: csrc/decode_step.cpp built against torch's own headers and
libraries on first use, loaded through ctypes, one call per decode step (torch_blocks.TorchBlocks
takes it where it builds).

Why: at small widths a decode step was Python and dispatch, not arithmetic: SmolLM2-135M at one
sequence took 17.5 ms a step in ~2,000 torch operations, its products ~7 ms of it (docs/benchmarks.md).
The compiled step makes the same product calls (torch_weights.linear's exact-rows paths, so each
product's rows are the ones torch_blocks computes) and runs everything between them as plain loops.
A sequence's bits are the same alone and in any batch (tests/engine/test_native_step.py); they are
not the Python chain's bits, whose norms and RoPE are torch operations summing in their own order.

Built like native.py's kernel (compiled.py): once per source, flags, compiler and torch into the
user cache. Where no C++ compiler is found ($CXX, else c++), torch's
headers are missing or the build fails, `decode_step()` says why and TorchBlocks keeps its Python
chain: the compiled step is a speed-up, never a requirement.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import require_torch, user_cache_dir
from .compiled import cached_build, find_compiler

torch = require_torch()

SOURCE = Path(__file__).parent / "csrc" / "decode_step.cpp"
BUILD_TIMEOUT = 300  # seconds; torch's headers take ~10 s to compile on 2 cores
KINDS = {"bf16": 0, "int8": 1, "groups": 2, "tiles4": 3, "tiles5": 4, "tiles8": 5}  # torch_weights.kind_of (tiles apart) -> Kind
MODES = {(True, True): 0, (True, False): 1, (False, False): 2, (False, True): 2}  # (rows exact, lone too) -> Mode
ROLES = {"qkv": 0, "output": 1, "gate_up": 2, "down": 3}
DTYPES = {torch.bfloat16: 0, torch.int8: 1, torch.uint8: 2, torch.int32: 3, torch.float32: 4}
POOLS = {"bfloat16": 0, "int8": 1}  # the pool kinds of decode_attention.c


@dataclass(frozen=True)
class Built:
    """The outcome of a build: the loaded library (None if none) and one line saying why."""

    lib: ctypes.CDLL | None
    why: str


def _args(source: Path) -> list[str]:
    """The compiler's arguments: flags, the source, then torch's libraries (after the source that
    needs them: a linker that drops unneeded libraries drops the ones named before it)."""
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = cpp_extension.library_paths()
    return ["-O2", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-w", *includes, str(source), *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
            "-ltorch_cpu", "-lc10"]


def build(cache_dir: Path, cxx: str | None = None) -> Built:
    """The step built (or found built) under cache_dir with compiler cxx ($CXX, else c++), or why not."""
    compiler = find_compiler("CXX", "c++", cxx)
    if isinstance(compiler, str):
        return Built(None, f"the Python chain ({compiler})")
    try:
        args = _args(SOURCE)
    except ImportError as exc:
        return Built(None, f"the Python chain (torch has no headers to build against: {exc})")
    found = cached_build(compiler, "decode_step", SOURCE, [args], cache_dir, BUILD_TIMEOUT, extra=torch.__version__)
    if isinstance(found, str):
        return Built(None, f"the Python chain ({found})")
    path = found[1]
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return Built(None, f"the Python chain ({path} does not load: {exc})")
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.step_error.restype = ctypes.c_char_p
    lib.step_new.argtypes = [i64, i64, i64, i64, i64, i64, ctypes.c_float, i32, p, p]
    lib.step_new.restype = p
    lib.step_free.argtypes = [p]
    lib.step_vectors.argtypes = [p, i64, *([p] * 8)]
    lib.step_matrix.argtypes = [p, i64, i32, i32, i32, i64, i64, p, i32, p, i32, p, i32, p, i32]
    lib.step_run.argtypes = [p, i64, p, p, p, i32, i64, p, p, p, p, p, p, p, p, i32]
    lib.step_store_row.argtypes = [p, i64, i32, p, p, p]
    return Built(lib, f"compiled ({path})")


@functools.cache
def decode_step() -> Built:
    """This process's compiled step, built on first use in the user cache."""
    return build(user_cache_dir() / "kernels")


def _ptr(t) -> int | None:
    return None if t is None else t.data_ptr()


class DecodeStep:
    """A TorchBlocks' layers handed to the compiled step once (views of its tensors, which the
    blocks keep alive), then `run` per decode step."""

    def __init__(self, lib: ctypes.CDLL, blocks, attention_address: int):
        from ..format.torch_groups import compiled_products
        from ..format.torch_weights import _exact_rows, kind_of

        c = blocks.cfg
        self.lib, self.blocks, self.cfg = lib, blocks, c
        kernel = compiled_products()  # int8 rows and 4-bit tiles multiplied as torch_weights.linear does
        self._products = None if kernel is None else (ctypes.c_void_p * 5)(
            *(kernel.address(f) for f in ("acts_size", "quantize_rows", "product_int8", "product_tiles", "product_bf16")))
        self.handle = lib.step_new(len(blocks.layers), c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.eps,
                                   int(c.rope_neox), attention_address, self._products)
        if not self.handle:
            raise ValueError(lib.step_error().decode())
        self._keep = []  # the contiguous tensors handed over by address
        for i, layer in enumerate(blocks.layers):
            vec = [layer.attn_norm, layer.ffn_norm, layer.attn_q_norm, layer.attn_k_norm, layer.attn_q_bias,
                   layer.attn_k_bias, layer.attn_v_bias, layer.attn_output_bias]
            vec = [None if v is None else v.contiguous() for v in vec]
            self._keep += vec
            lib.step_vectors(self.handle, i, *map(_ptr, vec))
            roles = {"qkv": [layer.attn_qkv] if layer.attn_qkv is not None else
                     [layer.attn_q, layer.attn_k, layer.attn_v],
                     "output": [layer.attn_output], "down": [layer.ffn_down],
                     "gate_up": [layer.ffn_gate_up] if layer.ffn_gate_up is not None else [layer.ffn_gate, layer.ffn_up]}
            for role, weights in roles.items():
                for w in weights:
                    data = w.torch_data()
                    kind = kind_of(data)
                    if kind == "groups" and data.tiles is not None:
                        kind, tensors = f"tiles{data.bits}", (data.tiles, None)
                    else:
                        tensors = (data.packed, data.scales_zeros) if kind == "groups" else data if kind == "int8" \
                            else (data, None)
                    tensors = [None if t is None else t.contiguous() for t in tensors]
                    self._keep += tensors
                    (wt, st) = tensors
                    size = lambda t: (ctypes.c_int64 * t.dim())(*t.shape)  # noqa: E731
                    mode = 0 if kind.startswith("tiles") else MODES[_exact_rows(kind)]
                    rc = lib.step_matrix(self.handle, i, ROLES[role], KINDS[kind], mode,
                                         w.shape[0], w.shape[1], wt.data_ptr(), DTYPES[wt.dtype], size(wt), wt.dim(),
                                         _ptr(st), DTYPES[st.dtype] if st is not None else 0,
                                         size(st) if st is not None else None, st.dim() if st is not None else 0)
                    if rc != 0:
                        raise ValueError(lib.step_error().decode())
        self._arrays: list = []
        self._pointers: tuple = ()

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.step_free(handle)

    def takes(self, rows, rope) -> bool:
        """Whether this step runs these rows: sequences of one bfloat16 or int8 pool, none a ring, the
        RoPE turning whole heads. The same for every batch of one engine, so no row's path depends
        on who else is in its batch."""
        pool = rows.states[0].cache.pool
        return rope.full is not None and pool.kind in POOLS and all(
            s.cache.pool is pool and not s.cache.ring for s in rows.states)

    def _buffers(self, pool):
        """The pool's per-layer buffer addresses, looked up again only when a buffer was replaced
        (the pool grew)."""
        arrays = [*pool.k, *pool.v, *pool.ks, *pool.vs, *pool.kc]
        if len(arrays) != len(self._arrays) or any(a is not b for a, b in zip(arrays, self._arrays)):
            n = len(pool.k)
            table = lambda group: (ctypes.c_void_p * n)(*[a.ctypes.data for a in group])  # noqa: E731
            quantized = pool.quantized
            self._pointers = (table(pool.k), table(pool.v), table(pool.ks) if quantized else None,
                              table(pool.vs) if quantized else None, table(pool.kc) if quantized else None)
            self._arrays = arrays
        return self._pointers

    def run(self, rows, x: np.ndarray, rope) -> np.ndarray:
        """x [B, n_embd] float32 (one row per sequence) through every layer; stores each layer's k/v in
        the sequences' pool slots. Returns the last layer's output [B, n_embd]."""
        states = rows.states
        pool = states[0].cache.pool
        n_layer, b = len(self.blocks.layers), len(states)
        slots = np.array([s.cache.held_slot() for s in states], np.int64)
        pos = np.array([s.pos for s in states], np.int64)
        shapes = {a.shape[:3] for a in pool.k}  # [slots, Hkv, cap] of every layer
        if len(shapes) != 1 or any(p + 1 > shape[2] or slot >= shape[0]
                                   for shape in shapes for p, slot in zip(pos, slots)):
            for s in states:  # room for the new position in every layer (the pool grows: new buffers)
                for i in range(n_layer):
                    s.cache.room(i, s.pos, 1)
            shapes = {a.shape[:3] for a in pool.k}
        if len(shapes) != 1:
            raise RuntimeError(f"the pool's layers hold different shapes {sorted(shapes)}")
        cap = shapes.pop()[2]
        unset = np.zeros((n_layer, b), np.uint8)
        if pool.quantized:
            for i in range(n_layer):
                for j, slot in enumerate(slots):
                    unset[i, j] = (i, int(slot)) not in pool.kc_set
        k, v, ks, vs, kc = self._buffers(pool)
        h = np.array(x, dtype=np.float32, order="C")  # [B, n_embd], the step writes its output over it
        cos, sin = (np.ascontiguousarray(t[:, 0, :].numpy()) for t in rope.full)  # [B, D]
        rc = self.lib.step_run(self.handle, b, h.ctypes.data, cos.ctypes.data, sin.ctypes.data, POOLS[pool.kind],
                               cap, k, v, ks, vs, kc, unset.ctypes.data, slots.ctypes.data, pos.ctypes.data,
                               torch.get_num_threads())
        if rc == -2:
            raise MemoryError("decode step: out of memory")
        if rc != 0:
            raise RuntimeError(f"decode step failed (code {rc}): {self.lib.step_error().decode()}")
        if unset.any():
            pool.kc_set.update((i, int(slot)) for i in range(n_layer) for j, slot in enumerate(slots) if unset[i, j])
        for slot, p in zip(slots, pos):
            pool.used[slot] = max(pool.used[slot], int(p) + 1)
        return h
