"""Matrices as torch_weights holds them under int8 storage, made at load from the file's blocks:
int8 rows with a bfloat16 scale each (`int8_rows`), the file's 4-, 5- and 8-bit groups as they are
(`Groups`: the compiled products' tiles where they build, else torch's int4 layout), and Q8_0 tiles
of a matrix the file holds in another type (`q8_0_tiles_of`). Each decodes and quantizes
QUANTIZE_ROWS rows at a time: a few MB of float32, not the whole matrix.

Where the compiled products build is one question, `compiled_products()`, asked here for the load
and by torch_weights for the products (tests answer it for both by patching this module's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from ..backends.common import require_torch

torch = require_torch()


def int8_rows(dense: np.ndarray):
    """float32 [out, in] -> (int8 [out, in], bfloat16 scales [out]): row r is q[r] * scale[r],
    scale = its largest magnitude / 127 (a zero row gets scale 1)."""
    w = torch.from_numpy(np.array(dense, dtype=np.float32))  # a copy: an F32 tensor is the read-only map
    scale = (w.abs().amax(dim=1) / 127).to(torch.bfloat16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


F16_MAX = 65504.0  # float16's largest finite value
QUANTIZE_ROWS = 4096  # rows decoded and quantized at a time at load: a few MB of float32, not the whole matrix


def tiles_fit(shape: tuple[int, int]) -> bool:
    """Whether a matrix the file holds in another type becomes 8-bit tiles under int8 storage
    (`q8_0_tiles_of`): where the compiled products build, whole tiles of 16 rows and groups of 32."""
    return compiled_products() is not None and shape[0] % TILE == 0 and shape[1] % INT4_GROUP == 0


def q8_0_tiles_of(raw: np.ndarray, decode) -> Groups:
    """A matrix whose rows raw [out, row_bytes] `decode` turns into float32 (BF16, F16, F32, K-quant
    files), QUANTIZE_ROWS rows at a time, quantized to Q8_0 (per group of 32 weights d = its largest
    magnitude / 127 in float16, q = round(w / d); gguf's quantizer, as llama.cpp's) and held as the
    8-bit tiles a Q8_0 file's matrix becomes (tiles_fit). Why: as int8 rows a BF16 file's prompt
    products widened each matrix to bfloat16 for oneDNN's GEMM; the tiles multiply int8 activation
    rows as integers, per 32 weights a scale instead of one per row (docs/benchmarks.md). The groups
    are not kept: rows are looked up from the tiles (rows_f32). ValueError where a group's scale would
    pass float16's range (a weight beyond 127 x 65,504)."""
    from ..backends.products import pack_tiles

    out, tiles = raw.shape[0], None
    for r in range(0, out, QUANTIZE_ROWS):
        dense = decode(raw[r:r + QUANTIZE_ROWS])
        if not np.abs(dense).max() <= 127 * F16_MAX:  # NaN too
            raise ValueError("a weight past what Q8_0's float16 scales hold")
        part = pack_tiles(quants.quantize(dense, Q.Q8_0), Q.Q8_0)
        if tiles is None:
            tiles = np.empty((out // TILE, *part.shape[1:]), np.uint8)  # [out / 16, in / 32, record]
        tiles[r // TILE:r // TILE + len(part)] = part
    return Groups(None, None, None, Q.Q8_0, torch.from_numpy(tiles))


def int8_rows_of(raw: np.ndarray, decode) -> tuple:
    """`int8_rows` of a matrix whose rows raw [out, row_bytes] `decode` turns into float32, block by
    block of QUANTIZE_ROWS rows (the same bits: each row is its own): a 151,936 x 1,024 embedding
    decoded whole was ~2 GB of float32 temporaries at load."""
    parts = [int8_rows(decode(raw[r:r + QUANTIZE_ROWS])) for r in range(0, raw.shape[0], QUANTIZE_ROWS)]
    return torch.cat([q for q, _ in parts]), torch.cat([scale for _, scale in parts])


INT4_TYPES = frozenset({Q.Q4_0, Q.Q4_1})  # 4-bit groups of 32 that torch's int4 kernel takes as they are
# groups of 32 the compiled products' tiles take as they are, and their bits (backends/products.py)
TILE_BITS = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8}
INT4_GROUP = 32  # weights per scale (and zero) in all of them
TILE = 16  # rows of a tile (backends/products.py; not imported: it builds a library)
_PACK_ROWS: list[int] = []  # int4_pack_rows, measured once per process


def int4_pack_rows() -> int:
    """How many rows torch packs together for its int4 kernel on this CPU, measured once per process:
    the smallest block whose pieces, packed one by one, are the pack of the whole. Only matrices of
    whole blocks stack and split (a stack's pack is then the stack of its parts' packs). Measured: 32
    rows on an AVX2 EPYC, 64 on an AVX-512 Xeon (there, pieces of 32 rows packed apart are not the
    pack of the whole: a 4-bit stack cut at 32 rows multiplied with wrong columns)."""
    if not _PACK_ROWS:
        gen = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (512, 2 * INT4_GROUP), dtype=torch.int32, generator=gen)
        pack = torch.ops.aten._convert_weight_to_int4pack_for_cpu
        whole = pack(q, 1)
        _PACK_ROWS.append(next((b for b in (16, 32, 64, 128, 256)  # torch packs multiples of 16 rows only
                                if torch.equal(torch.cat([pack(p, 1) for p in q.split(b)]), whole)), 512))
    return _PACK_ROWS[0]


@dataclass(frozen=True, eq=False)
class Groups:
    """A matrix the file holds as 4-, 5- or 8-bit groups, weight = d q + m per group of 32 along a row, q
    in 0..15, 0..31 or 0..255 (Q4_0: m = -8 d, Q5_0: m = -16 d; Q8_0's int8 w as q = w + 128, m = -128 d),
    held one of two ways:
    - tiles, where the compiled products build (backends/products.py; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
      the file's bits, d and m regrouped 16 rows at a time, the same values; every product quantizes its
      rows to int8. A decode step reads 0.625 (4-bit), 0.75 (5-bit) or 1.0625 (8-bit, as the file) bytes per weight.
    - else torch's int4-weight kernel's layout (Q4_0, Q4_1; aten._weight_int4pack_mm_for_cpu): weight
      = (q - 8) * scale + zero, scale d and zero m + 8d rounded to bfloat16, the kernel's type (2^-9
      of a step at most); bfloat16 rows, one call for any number of rows and a row's bits the same for
      every M (measured, `rows_exact_for_any_m`)."""

    packed: "torch.Tensor | None"  # q [out, in] in torch's int4 layout (uint8 [out, in / 2], 32 rows a block)
    scales_zeros: "torch.Tensor | None"  # [in / 32, out, 2] bfloat16
    raw: np.ndarray | None  # the file's blocks [out, row_bytes] (a view of its map): rows decode from it
    qtype: Q
    tiles: "torch.Tensor | None" = None  # uint8 [out / 16, in / 32, RECORDS[bits]] (products.pack_tiles), not packed

    @property
    def bits(self) -> int:
        return TILE_BITS[self.qtype]

    @property
    def shape(self) -> tuple[int, int]:
        if self.tiles is not None:
            return self.tiles.shape[0] * TILE, self.tiles.shape[1] * INT4_GROUP
        return self.packed.shape[0], self.scales_zeros.shape[0] * INT4_GROUP


def compiled_products():
    """The compiled products (backends/products.Products), or None where they do not build."""
    from ..backends.products import products

    return products().kernel


def groups_fit(qtype: Q, shape: tuple[int, int]) -> bool:
    """Whether a matrix keeps the file's groups under int8 storage: a Q4_0 / Q4_1 / Q5_0 / Q5_1 one of
    whole tiles of 16 rows where the compiled products build, else a Q4_0 / Q4_1 one of whole
    int4_pack_rows blocks for torch's kernel (the others become int8 rows)."""
    if shape[1] % INT4_GROUP:
        return False
    if compiled_products() is not None:
        return qtype in TILE_BITS and shape[0] % TILE == 0
    return qtype in INT4_TYPES and shape[0] % int4_pack_rows() == 0


def groups_of(raw: np.ndarray, qtype: Q) -> Groups:
    """The file's blocks raw [out, row_bytes] (groups_fit) as `Groups`: tiles where the compiled
    products build, else torch's layout QUANTIZE_ROWS rows at a time (q widened to int32 for torch's
    packing is 4 bytes a weight). A Q4 block is float16 d (and m for Q4_1), then 16 bytes: the low
    nibbles are weights 0..15, the high ones 16..31 (Q5: d, [m,] 32 fifth bits, then the same)."""
    if compiled_products() is not None and raw.shape[0] % TILE == 0:
        from ..backends.products import pack_tiles

        return Groups(None, None, raw, qtype, torch.from_numpy(pack_tiles(raw, qtype)))
    return torch_int4_groups(raw, qtype)


def torch_int4_groups(raw: np.ndarray, qtype: Q) -> Groups:
    """groups_of in torch's int4-weight layout, whether the compiled products build or not."""
    out, head = raw.shape[0], 2 if qtype == Q.Q4_0 else 4
    packs, sz = [], []
    for r in range(0, out, QUANTIZE_ROWS):
        b = raw[r:r + QUANTIZE_ROWS].reshape(min(QUANTIZE_ROWS, out - r), -1, head + 16)  # [rows, groups, bytes]
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, groups]
        zero = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d if head == 4 else np.zeros_like(d)
        qs = b[..., head:]  # [rows, groups, 16]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(b.shape[0], -1)  # [rows, in]
        packs.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1))
        sz.append(torch.from_numpy(np.stack([d, zero], axis=-1)).to(torch.bfloat16).transpose(0, 1))  # [groups, rows, 2]
    return Groups(torch.cat(packs), torch.cat(sz, dim=1).contiguous(), raw, qtype)
