"""Products of int8 rows, 4-, 5- and 8-bit tiles and bfloat16 rows with activation rows (csrc/products.c,
which says how),
built by native.py's outline into the user cache and called through ctypes; the compiled decode
step (native_step.py) calls the same functions by address.

Why: a decode step reads every weight once for a few rows, and torch's int8 and int4 kernels widen
each weight to float before multiplying bfloat16 rows. Quantizing the rows to int8 (blocks of 32,
as llama.cpp does) lets weights and activations multiply as integers, 64 pairs per instruction with
VNNI, so the products run at memory speed (docs/benchmarks.md). A row's bits never depend on the
other rows of the call: decode steps stay exact for any batch.

    kernel = products().kernel            # None where it does not build (the reason in .why)
    tiles = pack_tiles(raw, Q.Q4_1)       # a file's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks [out, row bytes]
    y = kernel.tiles(tiles, 4, out, x)    # x [M, in] float32 torch -> [M, out] float32
    y = kernel.int8(q, scale, x)          # int8 rows (torch_weights.int8_rows)
    y = kernel.bf16(w, x)                 # bfloat16 rows: bfloat16 activations, float32 sums
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from .common import require_torch, user_cache_dir
from .native import PRODUCTS_SOURCE, load

torch = require_torch()

QK = 32  # a block of activations, and a 4-bit group
TILE = 16  # rows of a 4-bit tile
# bytes per tile and block of 32 columns: 256 of nibbles [and 64 of fifth bits], 32 of d, 32 of m; or 512 of
# bytes and 32 of d
RECORDS = {4: 320, 5: 384, 8: 544}
# a block's bytes before its weights (d, [m,] [the 32 fifth bits]), its bits, and m as a multiple of d
# (None: the file's own m; Q8_0 has none, the kernel makes -128 d)
TILE_TYPES = {Q.Q4_0: (2, 4, -8), Q.Q4_1: (4, 4, None), Q.Q5_0: (6, 5, -16), Q.Q5_1: (8, 5, None), Q.Q8_0: (2, 8, None)}
WEIGHT_BYTES = {4: 16, 5: 16, 8: 32}  # a block's bytes of weights after its head


@dataclass(frozen=True)
class BuiltProducts:
    """The outcome of a build: the kernel (None if none) and one line saying which path runs and why."""

    kernel: Products | None
    why: str


class Products:
    """csrc/products.c loaded: quantize activation rows once, multiply them by int8 rows or 4-bit tiles."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.acts_size.argtypes, lib.acts_size.restype = [i64, i64], i64
        lib.quantize_rows.argtypes, lib.quantize_rows.restype = [p, i64, i64, i64, p], i32
        lib.quantize_rows_mt.argtypes, lib.quantize_rows_mt.restype = [p, i64, i64, i64, p, i32], i32
        lib.product_int8.argtypes, lib.product_int8.restype = [p, p, i64, i64, p, i64, p, i64, i32], i32
        lib.product_tiles.argtypes, lib.product_tiles.restype = [p, i32, i64, i64, p, i64, p, i64, i32], i32
        lib.product_bf16.argtypes, lib.product_bf16.restype = [p, i64, i64, p, i64, p, i64, i32], i32
        lib.products_vnni.restype = lib.products_bf16_units.restype = i32
        self.vnni = bool(lib.products_vnni())
        self.bf16_units = bool(lib.products_bf16_units())

    def address(self, name: str) -> int:
        """A function's address, for the compiled step."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def _acts(self, x, threads: int | None = None) -> tuple[np.ndarray, int, int]:
        """x [M, in] float32 (torch or numpy) quantized, a prompt's many rows on `threads` threads (torch's
        count if None): (the buffer, M, in)."""
        x = np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
        m, k = x.shape
        if k % QK:
            raise ValueError(f"rows of {k} are not whole blocks of {QK}")
        buf = np.empty(self.lib.acts_size(m, k), np.uint8)
        self.lib.quantize_rows_mt(x.ctypes.data, m, k, k, buf.ctypes.data, threads or torch.get_num_threads())
        return buf, m, k

    def int8(self, q, scale, x, threads: int | None = None):
        """x [M, in] float32 @ (q [out, in] int8 * scale [out] bfloat16).T -> [M, out] float32 torch."""
        buf, m, k = self._acts(x, threads)
        n = q.shape[0]
        if q.shape[1] != k or not q.is_contiguous() or not scale.is_contiguous():
            raise ValueError(f"int8 rows {tuple(q.shape)} do not take rows of {k}")
        y = torch.empty(m, n)
        self.lib.product_int8(q.data_ptr(), scale.data_ptr(), n, k, buf.ctypes.data, m, y.data_ptr(), n,
                              threads or torch.get_num_threads())
        return y

    def bf16(self, w, x, threads: int | None = None):
        """x [M, in] (rounded to bfloat16 here, unless it is) @ w.T for bfloat16 rows w [out, in] ->
        [M, out] float32 torch, float32 sums."""
        xb = (x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)).contiguous()
        m, k = xb.shape
        n = w.shape[0]
        if w.shape[1] != k or k % 2 or not w.is_contiguous():
            raise ValueError(f"bfloat16 rows {tuple(w.shape)} do not take rows of {k}")
        y = torch.empty(m, n)
        self.lib.product_bf16(w.data_ptr(), n, k, xb.data_ptr(), m, y.data_ptr(), n, threads or torch.get_num_threads())
        return y

    def tiles(self, tiles, bits: int, n: int, x, threads: int | None = None):
        """x [M, in] float32 @ W.T for tiles (pack_tiles) of `bits`-bit weights, n rows -> [M, out]
        float32 torch."""
        buf, m, k = self._acts(x, threads)
        if tiles.shape[1] * QK != k or tiles.shape[2] != RECORDS.get(bits) or not tiles.is_contiguous():
            raise ValueError(f"{bits}-bit tiles {tuple(tiles.shape)} do not take rows of {k}")
        y = torch.empty(m, n)
        self.lib.product_tiles(tiles.data_ptr(), bits, n, k, buf.ctypes.data, m, y.data_ptr(), n,
                               threads or torch.get_num_threads())
        return y


PACK_ROWS = 4096  # rows packed at a time: a 151,936-row embedding's temporaries whole were ~0.5 GB


def pack_tiles(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """A file's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks raw [out, row bytes] (out a multiple of TILE) as
    tiles uint8 [out / 16, in / 32, RECORDS[bits]] (csrc/products.c): per tile and block the 4-byte groups
    of the 16 rows' nibbles, part by part; for 5-bit the fifth bits (byte i of a row: weight 4p + i's at
    bit 2p, 16 + 4p + i's at bit 2p + 1); then their float16 d and m (Q4_0: m = -8 d, Q5_0: m = -16 d,
    exact in float16 unless it overflows, which is refused). Q8_0: per tile every block's 4-byte groups
    of bytes w + 128, then every block's d (m = -128 d is made by the kernel). PACK_ROWS rows at a time
    (each tile is its own rows')."""
    head, bits, _ = TILE_TYPES[qtype]
    out = raw.shape[0]
    if out % TILE:
        raise ValueError(f"{out} rows are not whole tiles of {TILE}")
    kb = raw.reshape(out, -1, head + WEIGHT_BYTES[bits]).shape[1]
    tiles = np.empty((out // TILE, kb, RECORDS[bits]), np.uint8)
    for r in range(0, out, PACK_ROWS):
        tiles[r // TILE:(r + PACK_ROWS) // TILE] = _pack(raw[r:r + PACK_ROWS], qtype)
    return tiles


def rows_of_8bit_tiles(tiles: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows W[ids] float32 [len(ids), in] of 8-bit tiles (pack_tiles of a Q8_0 matrix): d times w, the
    file's dequantized values to the bit. Why: a Q8_0 embedding's lookups (the tied head of LightOnOCR's
    Q8_0 files) read the tiles already resident, not the file's pages released after packing; read
    from the map, a run's random tokens faulted ~60 MB of them back (16 pages x 1,000 tokens)."""
    n, (t, kb, _) = len(ids), tiles.shape
    flat = tiles.reshape(t, kb * RECORDS[8])[ids // TILE]  # [n, tile bytes]: each row's tile
    lane, at = ids % TILE, np.arange(n)
    q = flat[:, :kb * 512].reshape(n, kb, 8, TILE, 4)[at, :, :, lane]  # [n, kb, 8, 4]: weights 4p + i
    d = flat[:, kb * 512:].reshape(n, kb, TILE, 2)[at, :, lane].copy().view(np.float16)  # [n, kb, 1]
    w = (q.reshape(n, kb, QK).astype(np.int16) - 128).astype(np.float32)
    return (w * d.astype(np.float32)).reshape(n, kb * QK)


def _pack(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """pack_tiles of a few whole tiles' rows."""
    head, bits, zero = TILE_TYPES[qtype]
    b = raw.reshape(raw.shape[0], -1, head + WEIGHT_BYTES[bits])  # [rows, blocks, bytes]
    t, kb = b.shape[0] // TILE, b.shape[1]
    d = b[..., 0:2]
    per_row = lambda a: np.ascontiguousarray(a).reshape(t, TILE, kb, -1).transpose(0, 2, 1, 3).reshape(t, kb, -1)  # noqa: E731
    if bits == 8:  # int8 weights as unsigned bytes (vpdpbusd takes them so; m = -128 d takes the 128 off), then the d
        q = (b[..., head:] ^ 0x80).reshape(t, TILE, kb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(t, kb * 512)
        return np.concatenate([q, per_row(d).reshape(t, kb * 32)], axis=-1).reshape(t, kb, RECORDS[8])
    if zero is None:  # the file's own m
        m = b[..., 2:4]
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # refused below
            m = np.float16(zero) * d.copy().view(np.float16)
        if not np.isfinite(m).all():
            raise ValueError(f"{qtype.name} scales too large for float16 minimums")
        m = m.view(np.uint8)
    parts = [b[..., head:].reshape(t, TILE, kb, 4, 4).transpose(0, 2, 3, 1, 4).reshape(t, kb, 256)]
    if bits == 5:
        qh = b[..., head - 4:head].copy().view("<u4")[..., 0]  # [rows, blocks]: bit j = weight j's fifth bit
        fifth = np.zeros((*qh.shape, 4), np.uint8)  # byte i of a row's 4
        for p in range(4):
            for i in range(4):
                fifth[..., i] |= (((qh >> (4 * p + i)) & 1) << (2 * p) | ((qh >> (16 + 4 * p + i)) & 1) << (2 * p + 1)
                                  ).astype(np.uint8)
        parts.append(per_row(fifth))
    return np.concatenate([*parts, per_row(d), per_row(m)], axis=-1)


def build(cache_dir: Path, cc: str | None = None, isa: str | None = None) -> BuiltProducts:
    """The products built (or found built) under cache_dir with compiler cc ($CC, else cc) for one of
    native.ISAS (the best this CPU has if None), or why not."""
    return BuiltProducts(*load("products", PRODUCTS_SOURCE, Products, "products", "torch's int8 and int4 kernels",
                               cache_dir, cc, isa))


@functools.cache
def products() -> BuiltProducts:
    """This process's products, built on first use in the user cache."""
    return build(user_cache_dir() / "kernels")
