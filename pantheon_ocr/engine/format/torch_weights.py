"""Weights that torch multiplies on the CPU: storages "bf16" and "int8" (see weights.py).

torch reaches the CPU's bfloat16 units (AMX tiles, AVX-512 BF16) through oneDNN; numpy has no
bfloat16 at all. Either storage takes bfloat16 activations: each product rounds its input rows to
bfloat16, multiplies with float32 accumulation and rounds its output to bfloat16. On a CPU without
bfloat16 units (AVX2) a prompt's products (more than ROW_BLOCK rows) widen the matrix to float32
instead and multiply float32 rows: emulated bfloat16 GEMMs took 4x float32's time there.

- bf16: the matrix as bfloat16 [out, in] (a BF16 tensor is a view of the file's pages), torch's
  `linear`.
- int8: each row as int8 with one bfloat16 scale (its largest magnitude / 127), quantized at load
  from whatever the file holds; torch's int8-weight kernel (aten._weight_int8pack_mm) widens the
  weights as it multiplies, so a decode step reads one byte per weight instead of two.

`linear` is the one product of both, for the numpy loop (through `Weight.matmul`) and the torch
decode step (backends/torch_blocks.py). Imported only when a model is loaded with such weights.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..backends.common import cpu_has_bf16, require_torch

torch = require_torch()
F = torch.nn.functional
ROW_BLOCK = 16  # weights.ROW_BLOCK (not imported: weights.py imports this module)


def bf16_view(raw: np.ndarray, shape: tuple[int, int]):
    """A BF16 tensor's bytes as a torch bfloat16 tensor [out, in]: a view of the memory map (no
    copy; the file's pages are the weights)."""
    flat = np.ascontiguousarray(raw).reshape(-1)
    with warnings.catch_warnings():
        # Read-only map: torch warns that it cannot make the tensor read-only; we never write it.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(flat, dtype=torch.bfloat16).reshape(shape)


def from_f32(dense: np.ndarray):
    """float32 [out, in] -> a torch bfloat16 copy (round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)).to(torch.bfloat16)


def int8_rows(dense: np.ndarray):
    """float32 [out, in] -> (int8 [out, in], bfloat16 scales [out]): row r is q[r] * scale[r],
    scale = its largest magnitude / 127 (a zero row gets scale 1)."""
    w = torch.from_numpy(np.array(dense, dtype=np.float32))  # a copy: an F32 tensor is the read-only map
    scale = (w.abs().amax(dim=1) / 127).to(torch.bfloat16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


QUANTIZE_ROWS = 4096  # rows decoded and quantized at a time at load: a few MB of float32, not the whole matrix


def int8_rows_of(raw: np.ndarray, decode) -> tuple:
    """`int8_rows` of a matrix whose rows raw [out, row_bytes] `decode` turns into float32, block by
    block of QUANTIZE_ROWS rows (the same bits: each row is its own): a 151,936 x 1,024 embedding
    decoded whole was ~2 GB of float32 temporaries at load."""
    return stack([int8_rows(decode(raw[r:r + QUANTIZE_ROWS])) for r in range(0, raw.shape[0], QUANTIZE_ROWS)])


def product(data, m: int = 1):
    """The bfloat16 product x [m, in] -> x @ W.T [m, out] of a bf16 matrix or an int8 (q, scale)
    pair. int8 at more than ROW_BLOCK rows (a prompt; never a decode step, whose rows must not
    depend on M) widens the matrix to bfloat16 (exact: |q| <= 127) for oneDNN's GEMM: the int8
    kernel is 2.3x faster than bf16 at 1-2 rows but 2.7x slower at 512 (measured, LightOnOCR-1B
    layer shapes, 2 threads: 0.52 vs 1.21 ms per layer at one row, 51 vs 19 ms at 512)."""
    if not isinstance(data, tuple):
        return lambda xb: F.linear(xb, data)
    q, scale = data
    if m > ROW_BLOCK:
        return lambda xb: (F.linear(xb, q.to(torch.bfloat16)).float() * scale.float()).to(torch.bfloat16)
    return lambda xb: torch.ops.aten._weight_int8pack_mm(xb, q, scale)


def float32_product(data, x):
    """x [M, in] float32 @ W.T in float32: the matrix widened (exact), int8 rows' scales applied to
    the product's columns (fewer elements than the matrix at a prompt chunk's M = 512)."""
    if isinstance(data, tuple):
        q, scale = data
        return F.linear(x, q.float()) * scale.float()
    return F.linear(x, data.float())


def linear(data, x, exact_rows: bool = False):
    """x [M, in] torch float32 (or already bfloat16) @ W.T -> [M, out] torch float32, through
    bfloat16. exact_rows: each row's bits independent of M: one call for any M >= 2 where the
    kernel keeps rows apart (a lone row gets a zero partner: oneDNN picks another kernel at M = 1),
    else blocks of ROW_BLOCK rows.
    A prompt (not exact_rows, more than ROW_BLOCK rows) on a CPU without bfloat16 units: float32."""
    m = x.shape[0]
    if not exact_rows and m > ROW_BLOCK and not cpu_has_bf16():
        return float32_product(data, x)
    xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)  # rows already rounded: shared by projections
    op = product(data, 1 if exact_rows else m)
    if not exact_rows:
        y = op(xb)
    elif (exact := _exact_rows("int8" if isinstance(data, tuple) else "bf16"))[0]:
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


_ROWS_EXACT: dict[str, tuple[bool, bool]] = {}  # storage -> (rows exact for any M >= 2, a lone row too)


def rows_exact_for_any_m(storage: str) -> bool:
    """Whether a storage's product gives a row the same bits for every number of rows M >= 2 on
    this machine (measured once per process on random matrices of a few shapes, both the GEMV-like
    and the GEMM-like ones). oneDNN on AVX-512 BF16 does for bf16 (measured for M = 2..300 and 1-2
    threads, shapes of SmolLM2, Qwen and LightOnOCR) but picks another kernel at M = 1 for some
    shapes: so a decode step pads one row to two and runs any batch in one call, instead of blocks
    of 16 rows, which costs a single stream up to 3x per projection. int8's kernel is torch's own
    (no per-shape kernel choice as in oneDNN): where a lone row also gets the bits it has among
    others (measured on the same shapes), it is not padded, two torch calls fewer per projection."""
    return _exact_rows(storage)[0]


def _exact_rows(storage: str) -> tuple[bool, bool]:
    """(rows_exact_for_any_m, and a lone row's bits too: int8 only), measured once per process."""
    if storage not in _ROWS_EXACT:
        gen = torch.Generator().manual_seed(0)
        ok = lone = True
        with torch.inference_mode():
            for out, inp in ((192, 576), (1024, 3072), (3072, 1024)):
                w = torch.randn(out, inp, generator=gen)
                op = product(int8_rows(w.numpy()) if storage == "int8" else w.to(torch.bfloat16))
                x = torch.randn(40, inp, generator=gen).to(torch.bfloat16)
                ref = op(x[:2])
                ok &= all(torch.equal(op(x[:m])[:2], ref) for m in (3, 5, 16, 17, 33, 40))
                if storage == "int8":  # bf16 keeps the pad whatever these shapes say
                    lone &= all(torch.equal(op(x[i:i + 1]), ref[i:i + 1]) for i in range(2))
        _ROWS_EXACT[storage] = bool(ok), bool(ok and lone and storage == "int8")
    return _ROWS_EXACT[storage]


def rows_f32(data, ids: np.ndarray) -> np.ndarray:
    """Rows W[ids] as float32 numpy [len(ids), in]."""
    with torch.inference_mode():
        idx = torch.from_numpy(ids)
        if isinstance(data, tuple):
            q, scale = data
            return (q[idx].float() * scale[idx].float()[:, None]).numpy()
        return data[idx].float().numpy()


def stack(datas: list):
    """The rows of several matrices of one storage, in order, as one: bf16 tensors or int8 (q, scale) pairs."""
    if all(isinstance(d, tuple) for d in datas):
        return torch.cat([q for q, _ in datas]), torch.cat([s for _, s in datas])
    if any(isinstance(d, tuple) for d in datas):
        raise ValueError("cannot stack int8 rows with bf16 ones")
    return torch.cat(datas)


def row_views(data, sizes: list[int]) -> list:
    """`data`'s rows cut into consecutive pieces of `sizes` rows: views, nothing copied."""
    if isinstance(data, tuple):
        return list(zip(data[0].split(sizes), data[1].split(sizes)))
    return list(data.split(sizes))


def nbytes(data) -> int:
    parts = data if isinstance(data, tuple) else (data,)
    return sum(t.numel() * t.element_size() for t in parts)
