"""Weights that torch multiplies on the CPU: storages "bf16" and "int8" (see weights.py).

torch reaches the CPU's bfloat16 units (AMX tiles, AVX-512 BF16) through oneDNN; numpy has no
bfloat16 at all. Either storage takes bfloat16 activations: each product rounds its input rows to
bfloat16, multiplies with float32 accumulation and rounds its output to bfloat16. On a CPU without
bfloat16 units (AVX2) a prompt's products (more than ROW_BLOCK rows) widen the matrix to float32
instead and multiply float32 rows: emulated bfloat16 GEMMs took 4x float32's time there.

- bf16: the matrix as bfloat16 [out, in] (a BF16 tensor is a view of the file's pages), torch's
  `linear`.
- int8: each row as int8 with one bfloat16 scale (its largest magnitude / 127), quantized at load
  from whatever the file holds, so a decode step reads one byte per weight instead of two. A matrix
  the file holds as 4-bit groups (Q4_0, Q4_1) stays 4-bit instead (`Groups`): half a byte per
  weight, and the file's own values rather than a second quantization. torch_groups.py makes these
  at load.

Where the compiled products build (backends/products.py, csrc/products.c), every matrix under int8
storage is held as its tiles: the file's 4-, 5- and 8-bit groups as they are, any other type quantized
to Q8_0 at load (`q8_0_tiles_of`); each product quantizes its rows to int8 in blocks of 32 and multiplies
them as integers. Int8 rows remain where a matrix is not whole tiles, multiplied by the compiled int8
product in a decode step (exact_rows); elsewhere torch's int8-weight kernel (aten._weight_int8pack_mm)
and int4-weight kernel multiply bfloat16 rows, widening the weights.

`linear` is the one product of both, for the numpy loop (through `Weight.matmul`) and the torch
decode step (backends/torch_blocks.py). Imported only when a model is loaded with such weights.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from ..backends.common import cpu_has_bf16, require_torch
from . import torch_groups as G
from .torch_groups import INT4_GROUP, TILE, Groups, groups_of, int8_rows

torch = require_torch()
F = torch.nn.functional
ROW_BLOCK = 16  # weights.ROW_BLOCK (not imported: weights.py imports this module)


def map_view(raw: np.ndarray, dtype, shape: tuple[int, ...]):
    """A tensor's bytes in the memory map as a torch tensor of `dtype` and `shape`: a view (no copy;
    the file's pages are the weights)."""
    flat = np.ascontiguousarray(raw).reshape(-1)
    with warnings.catch_warnings():
        # Read-only map: torch warns that it cannot make the tensor read-only; we never write it.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(flat, dtype=dtype).reshape(shape)


def bf16_view(raw: np.ndarray, shape: tuple[int, int]):
    """A BF16 tensor's bytes as a torch bfloat16 tensor [out, in], a view of the memory map."""
    return map_view(raw, torch.bfloat16, shape)


def from_f32(dense: np.ndarray):
    """float32 [out, in] -> a torch bfloat16 copy (round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)).to(torch.bfloat16)


def product(data, m: int = 1):
    """The bfloat16 product x [m, in] -> x @ W.T [m, out] of a bf16 matrix or an int8 (q, scale)
    pair. int8 at more than ROW_BLOCK rows (a prompt; never a decode step, whose rows must not
    depend on M) widens the matrix to bfloat16 (exact: |q| <= 127) for oneDNN's GEMM: the int8
    kernel is 2.3x faster than bf16 at 1-2 rows but 2.7x slower at 512 (measured, LightOnOCR-1B
    layer shapes, 2 threads: 0.52 vs 1.21 ms per layer at one row, 51 vs 19 ms at 512)."""
    if isinstance(data, Groups) and data.tiles is not None:  # float32 results, rows quantized to int8
        return lambda xb: G.compiled_products().tiles(data.tiles, data.bits, data.shape[0], xb.float())
    if isinstance(data, Groups):  # any m, prompts too: 40 ms for 512 rows of 3,072 x 576 on AVX2, float32's
        # GEMM 28 ms on a matrix already widened (widening per product, from the file's blocks, was not tried)
        return lambda xb: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, data.packed, INT4_GROUP, data.scales_zeros)
    if not isinstance(data, tuple):
        return lambda xb: F.linear(xb, data)
    q, scale = data
    if m > ROW_BLOCK:  # the scales on bfloat16 columns: bfloat16 x bfloat16 rounds its float32 product once, the
        # bits of widening both, multiplying and rounding, in one pass instead of three (a page's prompt: ~0.4 s less)
        return lambda xb: F.linear(xb, q.to(torch.bfloat16)) * scale
    return lambda xb: torch.ops.aten._weight_int8pack_mm(xb, q, scale)


def float32_product(data, x):
    """x [M, in] float32 @ W.T in float32: the matrix widened (exact), int8 rows' scales applied to
    the product's columns (fewer elements than the matrix at a prompt chunk's M = 512)."""
    if isinstance(data, tuple):
        q, scale = data
        return F.linear(x, q.float()) * scale.float()
    return F.linear(x, data.float())


def compiled_kind(data, exact_rows: bool) -> str | None:
    """Which compiled product (backends/products.py) multiplies `data`, or None for torch's: 4-bit
    tiles always; int8 and bfloat16 rows in exact-rows products (decode steps), where it builds."""
    if isinstance(data, Groups):
        return "tiles" if data.tiles is not None else None
    if not exact_rows or G.compiled_products() is None:
        return None
    return "int8" if isinstance(data, tuple) else "bf16"


def float_rows(data, exact_rows: bool) -> bool:
    """Whether `linear` quantizes float32 rows itself (the compiled int8 and 4-bit products) rather
    than multiplying bfloat16 ones."""
    return compiled_kind(data, exact_rows) in ("tiles", "int8")


def linear(data, x, exact_rows: bool = False):
    """x [M, in] torch float32 (or already bfloat16) @ W.T -> [M, out] torch float32, through
    bfloat16. exact_rows: each row's bits independent of M: one call for any M >= 2 where the
    kernel keeps rows apart (a lone row gets a zero partner: oneDNN picks another kernel at M = 1),
    else blocks of ROW_BLOCK rows.
    A prompt (not exact_rows, more than ROW_BLOCK rows) on a CPU without bfloat16 units: float32.
    Through the compiled products instead (compiled_kind): exact for any M by construction, int8 and
    4-bit products on rows quantized to int8, bfloat16 ones with float32 sums."""
    m = x.shape[0]
    compiled = compiled_kind(data, exact_rows)
    if compiled == "tiles":
        return G.compiled_products().tiles(data.tiles, data.bits, data.shape[0], x.float())
    if compiled == "int8":
        return G.compiled_products().int8(data[0], data[1], x.float())
    if compiled == "bf16":
        return G.compiled_products().bf16(data, x)
    if not exact_rows and m > ROW_BLOCK and not cpu_has_bf16() and not isinstance(data, Groups):
        return float32_product(data, x)
    xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)  # rows already rounded: shared by projections
    op = product(data, 1 if exact_rows else m)
    if not exact_rows:
        y = op(xb)
    elif (exact := _exact_rows(kind_of(data)))[0]:
        pad_lone = m == 1 and not exact[1]
        y = op(torch.cat([xb, torch.zeros_like(xb)]))[:1] if pad_lone else op(xb)
    else:
        pad = -(-m // ROW_BLOCK) * ROW_BLOCK - m
        xp = torch.cat([xb, xb.new_zeros(pad, xb.shape[1])]) if pad else xb
        y = torch.cat([op(block) for block in xp.split(ROW_BLOCK)])[:m]
    return y.float()


def matmul(data, x: np.ndarray, exact_rows: bool = False) -> np.ndarray:
    """`linear` for numpy: x [M, in] float32 -> [M, out] float32."""
    with torch.inference_mode():
        return linear(data, torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), exact_rows).numpy()


_ROWS_EXACT: dict[str, tuple[bool, bool]] = {}  # kind -> (rows exact for any M >= 2, a lone row too)


def kind_of(data) -> str:
    """What a matrix's data is: "bf16" (a tensor), "int8" ((q, scale) rows) or "groups" (Groups)."""
    return "groups" if isinstance(data, Groups) else "int8" if isinstance(data, tuple) else "bf16"


def layout_of(data) -> str:
    """kind_of, a Groups' bits added: what `stack` takes together (a Q4_K_M layer's q / k may be 5-bit
    tiles and its v 8-bit ones)."""
    return f"groups{data.bits}" if isinstance(data, Groups) else kind_of(data)


def rows_exact_for_any_m(kind: str) -> bool:
    """Whether a kind's torch product (kind_of) gives a row the same bits for every number of rows
    M >= 2 on this machine (measured once per process on random matrices of a few shapes, both the
    GEMV-like and the GEMM-like ones); where it does, a decode step runs any batch in one call instead
    of blocks of 16 rows (a single stream's product up to 3x faster). The int8 and int4 kernels are
    torch's own (no per-shape kernel choice as in oneDNN): where a lone row also gets the bits it has
    among others (measured on the same shapes), it is not padded either. bfloat16 (oneDNN) is never
    taken as exact (`_exact_rows`). Where the compiled products build, none of these decide:
    `compiled_kind`'s products are exact by construction."""
    return _exact_rows(kind)[0]


def _random_matrix(kind: str, out: int, inp: int, gen):
    if kind == "groups":  # Q4_1 blocks of random bytes with small positive float16 d and m
        raw = torch.randint(0, 256, (out, inp // INT4_GROUP, 20), dtype=torch.uint8, generator=gen).numpy()
        raw[..., :4] = np.full((out, inp // INT4_GROUP, 2), 0.01, np.float16).view(np.uint8)
        return groups_of(raw.reshape(out, -1), Q.Q4_1)
    w = torch.randn(out, inp, generator=gen)
    return int8_rows(w.numpy()) if kind == "int8" else w.to(torch.bfloat16)


def _exact_rows(kind: str) -> tuple[bool, bool]:
    """(rows_exact_for_any_m, and a lone row's bits too), measured once per process for torch's int8 and
    int4 kernels. bfloat16 is never trusted: oneDNN measured exact on these shapes but gave a row of
    LightOnOCR's tiny decoder one bfloat16 step more among 7 to 14 rows than alone (AVX-512 BF16 EPYC;
    the input's own values decide), so its rows go in fixed blocks of ROW_BLOCK."""
    if kind == "bf16":
        return False, False
    if kind not in _ROWS_EXACT:
        gen = torch.Generator().manual_seed(0)
        ok = lone = True
        with torch.inference_mode():
            for out, inp in ((192, 576), (1024, 3072), (3072, 1024)):
                op = product(_random_matrix(kind, out, inp, gen))
                x = torch.randn(40, inp, generator=gen).to(torch.bfloat16)
                ref = op(x[:2])
                ok &= all(torch.equal(op(x[:m])[:2], ref) for m in (3, 5, 16, 17, 33, 40))
                lone &= all(torch.equal(op(x[i:i + 1]), ref[i:i + 1]) for i in range(2))
        _ROWS_EXACT[kind] = bool(ok), bool(ok and lone)
    return _ROWS_EXACT[kind]


def rows_f32(data, ids: np.ndarray) -> np.ndarray:
    """Rows W[ids] as float32 numpy [len(ids), in] (groups: decoded from the file's blocks; 8-bit tiles:
    from the tiles, the same values, products.rows_of_8bit_tiles says why)."""
    if isinstance(data, Groups) and data.tiles is not None and data.bits == 8:
        from ..backends.products import rows_of_8bit_tiles

        return rows_of_8bit_tiles(data.tiles.numpy(), np.asarray(ids))
    if isinstance(data, Groups):
        if data.raw is None:
            raise ValueError("a stack of 4-bit matrices has no rows of its own to look up")
        return quants.dequantize(data.raw[ids], data.qtype).astype(np.float32, copy=False)
    with torch.inference_mode():
        idx = torch.from_numpy(ids)
        if isinstance(data, tuple):
            q, scale = data
            return (q[idx].float() * scale[idx].float()[:, None]).numpy()
        return data[idx].float().numpy()


def stack(datas: list):
    """The rows of several matrices of one kind (kind_of), in order, as one: bf16 tensors, int8
    (q, scale) pairs, or Groups of whole int4_pack_rows() blocks (the pack of a stack is the stack of
    the packs)."""
    if len({layout_of(d) for d in datas}) != 1:
        raise ValueError(f"cannot stack matrices of kinds {sorted({layout_of(d) for d in datas})}")
    kinds = {kind_of(d) for d in datas}
    if kinds == {"groups"} and datas[0].tiles is not None:  # whole tiles: the stack's tiles are its parts'
        return Groups(None, None, None, datas[0].qtype, torch.cat([d.tiles for d in datas]))
    if kinds == {"groups"}:
        return Groups(torch.cat([d.packed for d in datas]), torch.cat([d.scales_zeros for d in datas], dim=1),
                          None, datas[0].qtype)
    if kinds == {"int8"}:
        return torch.cat([q for q, _ in datas]), torch.cat([s for _, s in datas])
    return torch.cat(datas)


def row_views(data, parts: list) -> list:
    """A stack's rows (stack(parts)) cut back into its parts: views of the stack, nothing copied
    (4-bit groups: the packed rows are views, the few scales copies: the kernel takes them whole)."""
    sizes = [shape_of(p)[0] for p in parts]
    if isinstance(data, Groups) and data.tiles is not None:
        return [replace(p, tiles=t) for p, t in zip(parts, data.tiles.split([n // TILE for n in sizes]))]
    if isinstance(data, Groups):
        return [replace(p, packed=w, scales_zeros=sz.contiguous())
                for p, w, sz in zip(parts, data.packed.split(sizes), data.scales_zeros.split(sizes, dim=1))]
    if isinstance(data, tuple):
        return list(zip(data[0].split(sizes), data[1].split(sizes)))
    return list(data.split(sizes))


def tensors_of(data) -> tuple:
    """The torch tensors a matrix's data holds (kind_of)."""
    if isinstance(data, Groups):
        return (data.tiles,) if data.tiles is not None else (data.packed, data.scales_zeros)
    return data if isinstance(data, tuple) else (data,)


def with_tensors(data, tensors: tuple):
    """The matrix `data` holding `tensors` (tensors_of's, in its order) instead of its own."""
    if isinstance(data, Groups):
        if data.tiles is not None:
            return replace(data, tiles=tensors[0])
        return replace(data, packed=tensors[0], scales_zeros=tensors[1])
    return tuple(tensors) if isinstance(data, tuple) else tensors[0]


def into_huge_pages(weights: list) -> int:
    """Move the copied torch matrices of `weights` (Weight objects; views of the file's map stay
    where they are) into one buffer of transparent huge pages (memory.huge_page_buffer, which says
    why), each storage copied whole so that views of it (a stack's parts) stay views of its copy,
    and the old one freed before the next is copied (the load's peak grows by one matrix, not by
    all of them). The bits are the same. Returns the bytes moved (0 where the platform has no huge
    pages)."""
    from ..memory import huge_page_buffer

    storages: dict[int, list] = {}  # the storages' addresses -> [(weight, index of its tensor), ...]
    for w in dict.fromkeys(w for w in weights if w.copied and w.storage in ("bf16", "int8")):
        for i, t in enumerate(tensors_of(w.torch_data())):
            storages.setdefault(t.untyped_storage().data_ptr(), []).append((w, i))
    def storage_of(ref):
        w, i = ref
        return tensors_of(w.torch_data())[i].untyped_storage()

    sizes = {ptr: storage_of(refs[0]).nbytes() for ptr, refs in storages.items()}
    place, total = {}, 0
    for ptr, n in sizes.items():
        place[ptr] = total
        total += -(-n // 64) * 64  # each storage on a cache line of its own
    buf = huge_page_buffer(total)
    if buf is None:
        return 0
    for ptr, refs in storages.items():
        new = torch.from_numpy(buf[place[ptr]:place[ptr] + sizes[ptr]]).untyped_storage()
        new.copy_(storage_of(refs[0]))
        for w, i in refs:  # every tensor over the old storage, the same view of the new one
            _rehome(w, i, new)
        # no reference to the old storage is left: its pages went back before the next is copied
    return total


def _rehome(w, i: int, storage) -> None:
    """Weight w's i-th tensor (tensors_of) as the same view of `storage`."""
    ts = list(tensors_of(w.torch_data()))
    t = ts[i]
    ts[i] = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    w.set_torch_data(with_tensors(w.torch_data(), tuple(ts)))


def shape_of(data) -> tuple[int, int]:
    if isinstance(data, Groups):
        return data.shape
    return tuple((data[0] if isinstance(data, tuple) else data).shape)


def nbytes(data) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(data))
