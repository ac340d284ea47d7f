"""bfloat16 weights multiplied by torch on the CPU (weights storage "bf16", see weights.py).

torch reaches the CPU's bfloat16 units (AMX tiles, AVX-512 BF16) through oneDNN; numpy has no
bfloat16 at all. Activations stay float32 numpy between projections: each matmul rounds its
input rows to bfloat16, multiplies with float32 accumulation, and hands back float32.
Imported only when a model is loaded with "bf16" weights (it imports torch).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..backends.common import require_torch

torch = require_torch()


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


def matmul_bf16(x: np.ndarray, w) -> np.ndarray:
    """x [M, in] float32 numpy @ w.T (w bfloat16 [out, in]) -> [M, out] float32 numpy."""
    with torch.inference_mode():
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
        return torch.nn.functional.linear(xt, w).float().numpy()


_ROWS_EXACT: bool | None = None


def rows_exact_for_any_m() -> bool:
    """Whether torch's bfloat16 matmul gives a row the same bits for every number of rows M >= 2
    on this machine (measured once per process on random matrices of a few shapes, both the
    GEMV-like and the GEMM-like ones). oneDNN on AVX-512 BF16 does (measured for M = 2..300 and
    1-2 threads, shapes of SmolLM2, Qwen and LightOnOCR), but picks another kernel at M = 1 for
    some shapes: so a decode step pads one row to two and runs any batch in one call, instead of
    blocks of 16 rows (weights.py), which costs a single stream up to 3x per projection."""
    global _ROWS_EXACT
    if _ROWS_EXACT is None:
        gen = torch.Generator().manual_seed(0)
        ok = True
        with torch.inference_mode():
            for out, inp in ((192, 576), (1024, 3072), (3072, 1024)):
                w = torch.randn(out, inp, generator=gen).to(torch.bfloat16)
                x = torch.randn(40, inp, generator=gen).to(torch.bfloat16)
                ref = torch.nn.functional.linear(x[:2], w)
                ok &= all(torch.equal(torch.nn.functional.linear(x[:m], w)[:2], ref) for m in (3, 16, 17, 40))
        _ROWS_EXACT = bool(ok)
    return _ROWS_EXACT


def rows_f32(w, ids: np.ndarray) -> np.ndarray:
    """Rows w[ids] as float32 numpy [len(ids), in]."""
    with torch.inference_mode():
        return w[torch.from_numpy(ids)].float().numpy()
