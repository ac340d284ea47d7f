"""The one weight type: every projection is `W.matmul(x)`, whatever the storage.

Storage modes:
- "quantized": blocks stay in the memory map; `matmul` dequantizes panels of rows and multiplies
  each panel against all M activation rows (least memory; each weight read once per call).
- "f32": dequantized once at load into resident float32 (fastest with numpy's BLAS; the numerical
  reference).
- "bf16": resident bfloat16 torch tensors (a BF16 file is used straight from the memory map),
  multiplied by torch in bfloat16 (AMX / AVX-512 BF16 where the CPU has them): half the memory
  of f32 and the fastest on such CPUs; needs torch. Activations are rounded to bfloat16 at each
  projection; tests/engine/test_bf16.py states the error against f32.
- "int8": each row int8 with a bfloat16 scale, quantized at load, multiplied by torch's int8-weight
  kernel with bfloat16 activations: a quarter of f32's memory and bytes per decode step; needs
  torch; tests/engine/test_int8_weights.py states the error against f32. A matrix the file holds
  as 4-bit groups (Q4_0, Q4_1) keeps them (torch's int4-weight kernel, half a byte per weight;
  tests/engine/test_int4_weights.py).

Exact rows (`matmul(x, exact_rows=True)`, the decode path): a BLAS picks its kernel by shape
(OpenBLAS: GEMV for M = 1, a small-matrix kernel below some size, GEMM above), so row r of
x @ W.T may differ in the last bits with the number of rows beside it. With exact_rows every
row goes through the same call: x is cut into blocks of ROW_BLOCK rows, the last one padded
with zeros, each block one GEMM of the same shape. A row's result then depends on that row
alone, so a sequence decoded in a batch of B gets the very logits it gets decoded alone.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from ...errors import ModelError
from ...options import STORAGE_MODES, TORCH_STORAGES
from .gguf import GGUFFile

Storage = Literal["quantized", "f32", "bf16", "int8"]
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
PANEL_BYTES = 4 << 20  # float32 bytes of one dequantized panel: big enough for BLAS, small for cache
# Rows per exact-rows GEMM: one AMX tile's rows, and a block BLAS runs through its GEMM kernel
# (measured with OpenBLAS: M = 2..16 cost about the same, M = 1 is GEMV).
ROW_BLOCK = 16
# int8 storage keeps a matrix as int8 rows only where a row is whole groups of 32 weights: torch's
# int8 kernel (aten._weight_int8pack_mm, torch 2.13 CPU) crashed the process on rows of 588 or 600.
INT8_ROW_ALIGN = 32  # torch_groups.INT4_GROUP (not imported: that module imports torch)


def dequantize(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """Raw bytes [..., row_bytes] -> float32 [..., row_elems]."""
    if qtype == Q.F32:
        return raw.view(np.float32)
    if qtype == Q.F16:
        return raw.view(np.float16).astype(np.float32)
    if qtype == Q.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return quants.dequantize(raw, qtype).astype(np.float32, copy=False)


class Weight:
    """A matrix [out, in] stored quantized (raw bytes), as resident float32 or as bfloat16."""

    __slots__ = ("name", "qtype", "shape", "storage", "copied", "_data", "_panel_rows")

    def __init__(self, name: str, qtype: Q, shape: tuple[int, int], raw: np.ndarray, storage: Storage):
        self.name, self.qtype, self.shape, self.storage = name, qtype, shape, storage
        # copied: the data is a copy, nothing of it a view of the file's map (WeightLoader then
        # releases the tensor's pages); each branch below says whether it copies
        if storage == "bf16":  # torch bfloat16 [out, in]; a BF16 tensor is used from the map as is
            from .torch_weights import bf16_view, from_f32

            self.copied = qtype != Q.BF16
            self._data = from_f32(dequantize(raw, qtype).reshape(shape)) if self.copied else bf16_view(raw, shape)
        elif storage == "int8":  # torch: the file's 4-, 5- or 8-bit groups as they are (torch_groups.Groups),
            # else quantized here: 8-bit tiles where the compiled products build, else int8 [out, in] with
            # a bfloat16 scale per row; a matrix of rows that are not whole groups of 32 (the vision
            # tower's patch embedding: 3 x 14 x 14 = 588) stays bfloat16
            from .torch_groups import groups_fit, groups_of, int8_rows_of, q8_0_tiles_of, tiles_fit

            self.copied = True
            self._data = None
            rows = raw.reshape(shape[0], -1)
            decode = lambda part: dequantize(part, qtype).reshape(-1, shape[1])  # noqa: E731
            if groups_fit(qtype, shape):
                try:
                    self._data = groups_of(rows, qtype)
                except ValueError:  # a minimum -8 d / -16 d past float16's range: quantized here then
                    pass
            if self._data is None and tiles_fit(shape):
                try:
                    self._data = q8_0_tiles_of(rows, decode)
                except ValueError:  # a weight past float16 scales' range: int8 rows then
                    pass
            if self._data is None and shape[1] % INT8_ROW_ALIGN:  # torch's int8 kernel crashes on such rows
                from .torch_weights import from_f32

                self._data = from_f32(decode(rows))
            if self._data is None:
                self._data = int8_rows_of(rows, decode)
        elif storage == "f32" or qtype == Q.F32:
            # F32 in "quantized" mode is used straight from the memory map: nothing to decode.
            self.copied = qtype != Q.F32
            self._data = np.ascontiguousarray(dequantize(raw, qtype).reshape(shape))
        else:
            self.copied = False
            self._data = raw  # [out, row_bytes] view into the memory map
        self._panel_rows = max(16, PANEL_BYTES // (4 * shape[1]))

    @property
    def resident(self) -> bool:
        """The whole matrix is held ready to multiply (f32, bf16 or int8), nothing decoded per call."""
        return self.storage in TORCH_STORAGES or self._data.dtype == np.float32

    def matmul(self, x: np.ndarray, exact_rows: bool = False) -> np.ndarray:
        """x [M, in] float32 -> x @ W.T [M, out] float32. exact_rows: each row's result does
        not depend on M (the module docstring)."""
        if self.storage in TORCH_STORAGES:
            from .torch_weights import matmul

            return matmul(self._data, x, exact_rows)
        if exact_rows:
            return _by_row_blocks(self._matmul_block, x)
        return self._matmul(x)

    def linear(self, x, exact_rows: bool = False):
        """The torch storages' product on torch float32 rows: x [M, in] -> [M, out] (the torch
        decode step's projections; matmul is the same for numpy arrays)."""
        from .torch_weights import linear

        if self.storage not in TORCH_STORAGES:
            raise ValueError(f"{self.name} is stored as {self.storage}: torch multiplies only {TORCH_STORAGES}")
        return linear(self._data, x, exact_rows)

    def torch_data(self):
        """The torch storages' matrix as torch_weights keeps it (a bfloat16 tensor, int8 (q, scale)
        rows or Groups): what a compiled caller multiplies (backends/native_step.py)."""
        if self.storage not in TORCH_STORAGES:
            raise ValueError(f"{self.name} is stored as {self.storage}: torch multiplies only {TORCH_STORAGES}")
        return self._data

    def set_torch_data(self, data) -> None:
        """Replace the torch storages' matrix by one with the same bits held elsewhere
        (torch_weights.into_huge_pages)."""
        if self.storage not in TORCH_STORAGES:
            raise ValueError(f"{self.name} is stored as {self.storage}: torch multiplies only {TORCH_STORAGES}")
        self._data = data

    def _matmul_block(self, xb: np.ndarray) -> np.ndarray:
        """One exact-rows block xb [ROW_BLOCK, in] -> [ROW_BLOCK, out] as W @ xb.T: with the weight
        as the GEMM's left operand OpenBLAS runs these thin products ~1.6x faster than xb @ W.T
        (measured, one thread, 1024 x 3072); each output column still depends on its row only."""
        if self.resident:
            return (self._data @ xb.T).T
        out = np.empty((self.shape[0], xb.shape[0]), dtype=np.float32)  # [out, rows]
        step = self._panel_rows
        for r in range(0, self.shape[0], step):
            panel = dequantize(self._data[r : r + step], self.qtype)  # [rows, in]
            np.matmul(panel, xb.T, out=out[r : r + step])
        return out.T

    def _matmul(self, x: np.ndarray) -> np.ndarray:
        if self.resident:
            return x @ self._data.T
        out = np.empty((x.shape[0], self.shape[0]), dtype=np.float32)
        step = self._panel_rows
        for r in range(0, self.shape[0], step):
            panel = dequantize(self._data[r : r + step], self.qtype)  # [rows, in]
            np.matmul(x, panel.T, out=out[:, r : r + step])
        return out

    def rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows W[ids] as float32 [len(ids), in] (embedding lookup; only those rows decoded)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.storage in TORCH_STORAGES:
            from .torch_weights import rows_f32

            return rows_f32(self._data, ids)
        if self.resident:
            return self._data[ids]
        return dequantize(self._data[ids], self.qtype)

    def dense(self) -> np.ndarray:
        """The whole matrix as float32 [out, in]."""
        if self.storage in TORCH_STORAGES:
            return self.rows(np.arange(self.shape[0]))
        return self._data if self.resident else dequantize(self._data, self.qtype)

    def stored_floats(self) -> np.ndarray | None:
        """The matrix as the file stores it, where that is floats: a read-only view of the map
        [out, in] (F32 as float32, F16 as float16, BF16 as its uint16 bits), nothing decoded or
        copied. None for a quantized type or a weight held as a copy (f32, bf16, int8 storage)."""
        if self.copied or self.storage in TORCH_STORAGES:
            return None
        if self.qtype == Q.F32:
            return self._data
        if self.qtype in (Q.F16, Q.BF16):
            return self._data.view(np.float16 if self.qtype == Q.F16 else np.uint16)
        return None

    def nbytes(self) -> int:
        if self.storage in TORCH_STORAGES:
            from .torch_weights import nbytes

            return nbytes(self._data)
        return self._data.nbytes

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, {self.qtype.name}, {self.shape}, {self.storage})"


def stack_rows(name: str, parts: Sequence[Weight]) -> Weight:
    """Matrices that multiply the same input rows (q, k and v; gate and up), int8 or copied bf16,
    as one Weight of their rows in order [sum of outs, in]: one product instead of len(parts), each
    product a fixed cost of its own. Small where measured (decode steps, stacked vs not taking turns
    in one process, 2 threads): SmolLM2 18.0 vs 18.3 ms at B = 1, 23.5 vs 24.9 ms at B = 4; the
    LightOnOCR-1B decoder within 1%. Each part's data becomes a view of its rows of the stack, so
    the rows are held once; a part keeps multiplying as before."""
    from .torch_weights import row_views, stack

    if not can_stack(parts):
        raise ValueError(f"{name}: only copied bf16 or int8 matrices of one input width and kind stack, got {list(parts)}")
    first = parts[0]
    data = stack([p._data for p in parts])
    for p, view in zip(parts, row_views(data, [p._data for p in parts])):
        p._data = view
    w = object.__new__(Weight)
    w.name, w.qtype, w.storage, w.copied = name, first.qtype, first.storage, True
    w.shape = (sum(p.shape[0] for p in parts), first.shape[1])
    w._data, w._panel_rows = data, first._panel_rows
    return w


def can_stack(parts: Sequence[Weight]) -> bool:
    """Whether `stack_rows` takes these: copies (not views of the file's map: a stack of those would
    copy them, more memory, not less) of one torch storage, input width and kind (int8 storage
    holds int8 rows and 4-, 5- and 8-bit groups: a layer of a Q4_K_M file mixes them)."""
    first = parts[0]
    if first.storage not in TORCH_STORAGES or any(
            p.storage != first.storage or p.shape[1] != first.shape[1] or not p.copied for p in parts):
        return False
    from .torch_weights import layout_of

    return len({layout_of(p._data) for p in parts}) == 1


def _by_row_blocks(matmul, x: np.ndarray) -> np.ndarray:
    """matmul over x [M, in] in blocks of ROW_BLOCK rows, each call the same shape (zero-padded).
    The result is C-contiguous whatever layout a block comes back in: the norms and sums that
    follow must see a row laid out the same way in a batch of one and in a batch of B."""
    m = x.shape[0]
    blocks = -(-m // ROW_BLOCK)
    xp = np.zeros((blocks * ROW_BLOCK, x.shape[1]), np.float32)
    xp[:m] = x
    out = None
    for i in range(blocks):
        y = matmul(xp[i * ROW_BLOCK : (i + 1) * ROW_BLOCK])
        if out is None:
            out = np.empty((blocks * ROW_BLOCK, y.shape[1]), np.float32)
        out[i * ROW_BLOCK : (i + 1) * ROW_BLOCK] = y
    return out[:m]


class WeightLoader:
    """Looks tensors up by their GGUF name and checks type and shape before wrapping them."""

    def __init__(self, gf: GGUFFile, storage: Storage):
        if storage not in STORAGE_MODES:
            raise ValueError(f"storage must be one of {STORAGE_MODES}, not {storage!r}")
        self.gf, self.storage = gf, storage

    def has(self, name: str) -> bool:
        return name in self.gf.tensors

    def _info(self, name: str, shape: tuple[int, ...]):
        info = self.gf.tensors.get(name)
        if info is None:
            raise ModelError(self.gf.path, f"missing tensor {name!r}")
        if info.shape != tuple(shape):
            raise ModelError(self.gf.path, f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
        if info.qtype not in SUPPORTED_TYPES:
            raise ModelError(self.gf.path, f"tensor {name!r} has unsupported type {info.qtype.name}")
        return info

    def matrix(self, name: str, shape: tuple[int, int]) -> Weight:
        self._info(name, shape)
        w = Weight(name, self.gf.tensors[name].qtype, shape, self.gf.raw(name), self.storage)
        if w.copied:
            self.gf.release(name)  # its pages of the map, out of the resident set
        return w

    def experts(self, name: str, shape: tuple[int, int, int]) -> list[Weight]:
        """A merged 3-D expert tensor [E, out, in] as E per-expert views (no copies when quantized)."""
        info = self._info(name, shape)
        raw = self.gf.raw(name)  # [E, out, row_bytes]
        experts = [Weight(f"{name}[{e}]", info.qtype, shape[1:], raw[e], self.storage) for e in range(shape[0])]
        if experts and experts[0].copied:
            self.gf.release(name)
        return experts

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A small tensor (norms, biases, router, conv kernels) always as resident float32."""
        info = self._info(name, shape)
        raw = self.gf.raw(name)
        return np.ascontiguousarray(dequantize(raw, info.qtype).reshape(shape))

    def optional_tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        return self.tensor(name, shape) if self.has(name) else None
