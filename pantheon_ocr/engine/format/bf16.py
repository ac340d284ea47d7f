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


def rows_f32(w, ids: np.ndarray) -> np.ndarray:
    """Rows w[ids] as float32 numpy [len(ids), in]."""
    with torch.inference_mode():
        return w[torch.from_numpy(ids)].float().numpy()
