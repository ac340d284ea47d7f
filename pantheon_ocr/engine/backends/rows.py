"""A prompt chunk's row operations in one pass each (csrc/rows.c, which says why and how), built by
native.Library into the user cache and called through ctypes by torch_blocks.TorchBlocks for
prompt rows: the per-head norm and rotary embedding of its queries and keys, the SwiGLU of its gate
and up products, and an int8 KV pool's store of its keys and values; and by the vision tower's blocks
in bfloat16 on the CPU (torch_pixtral.PixtralVision.use_rows): their norms, rotary embedding and
SwiGLU on bfloat16 rows, float32 arithmetic rounded once. Where the library does not build or has no
AVX-512, `compiled_rows()` is None and torch's and numpy's operations run.

    rows = compiled_rows()                                   # None, or a Rows
    q = rows.norm_rope(x, heads, d, w, eps, cos, sin, neox)  # x [T, heads * d] float32 torch -> [T, heads, d]
    y = rows.swiglu(gate_up)                                 # [M, 2F] -> silu(gate) * up [M, F]
    q, bits = rows.int8_of(x, divisor)                       # cache._int8_of(x / divisor), numpy [H, T, D]
    y = rows.rms_norm_bf16(x, w, eps)                        # bfloat16 rows [..., n] -> [..., n]
    q = rows.rope_bf16_(q, cos, sin)                         # in place: [B, H, N, d] over [B, N, H, d] rows
    g = rows.swiglu_bf16_(g, u)                              # in place: g = silu(g) * u
"""

from __future__ import annotations

import ctypes

import numpy as np

from .common import require_torch
from .native import ROWS_SOURCE, Library

torch = require_torch()


class Rows:
    """csrc/rows.c loaded."""

    why = ""  # Library.build's line: "the compiled <ISA> row operations (path; threads)"

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        lib.rows_take.restype = i32
        lib.norm_rope_heads.argtypes = [p, i64, i64, i64, i64, p, f32, p, p, i32, p, i32]
        lib.norm_rope_heads.restype = i32
        lib.swiglu_rows.argtypes, lib.swiglu_rows.restype = [p, i64, i64, i64, p, i32], i32
        lib.int8_rows.argtypes, lib.int8_rows.restype = [p, i64, i64, i64, i64, i64, p, p, p, i32], i32
        lib.rms_norm_bf16.argtypes, lib.rms_norm_bf16.restype = [p, i64, i64, i64, p, f32, p, i64, i32], i32
        lib.rope_bf16.argtypes, lib.rope_bf16.restype = [p, i64, i64, i64, i64, p, p, i64, i32], i32
        lib.swiglu_bf16.argtypes, lib.swiglu_bf16.restype = [p, p, i64, i64, i64, i64, i32], i32

    @staticmethod
    def _rows(x, width: int, what: str) -> None:
        """Refuses x unless it is [M, width] float32 with contiguous columns (a view of a wider product's
        columns is)."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != width or x.stride(1) != 1:
            raise ValueError(f"{what} takes float32 rows of {width} with contiguous columns, "
                             f"got {x.dtype} {tuple(x.shape)} strides {x.stride()}")

    def norm_rope(self, x, heads: int, d: int, w, eps: float, cos, sin, neox: bool):
        """The heads of x [T, heads * d] (rows may be strided) each RMS-normed with w [d] (None: not
        normed) and turned by cos, sin [T, d / 2] -> [T, heads, d] float32 torch."""
        self._rows(x, heads * d, "norm_rope")
        t = x.shape[0]
        cos, sin = cos.contiguous().float(), sin.contiguous().float()
        if cos.shape != (t, d // 2) or sin.shape != cos.shape:
            raise ValueError(f"rotary angles {tuple(cos.shape)} do not fit {t} rows of heads of {d}")
        w = None if w is None else w.contiguous().float()
        out = torch.empty(t, heads, d)
        rc = self.lib.norm_rope_heads(x.data_ptr(), t, heads, d, x.stride(0), None if w is None else w.data_ptr(),
                                      eps, cos.data_ptr(), sin.data_ptr(), int(neox), out.data_ptr(),
                                      torch.get_num_threads())
        return _checked(rc, out, "norm_rope")

    def swiglu(self, gate_up):
        """gate_up [M, 2F] float32 (rows may be strided) -> silu(gate) * up [M, F] float32 torch."""
        f = gate_up.shape[1] // 2
        self._rows(gate_up, 2 * f, "swiglu")
        y = torch.empty(gate_up.shape[0], f)
        rc = self.lib.swiglu_rows(gate_up.data_ptr(), gate_up.shape[0], f, gate_up.stride(0), y.data_ptr(),
                                  torch.get_num_threads())
        return _checked(rc, y, "swiglu")

    @staticmethod
    def _bf16_rows(x, what: str):
        """x [..., n] bfloat16 with contiguous columns on the CPU as [rows, n] (a view), or a ValueError."""
        if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.stride(-1) != 1:
            raise ValueError(f"{what} takes bfloat16 CPU rows with contiguous columns, got {x.dtype} on {x.device} "
                             f"strides {x.stride()}")
        try:
            return x.view(-1, x.shape[-1])  # the leading dimensions as one row stride
        except RuntimeError:
            raise ValueError(f"{what} takes rows at one stride, got strides {x.stride()}") from None

    def rms_norm_bf16(self, x, w, eps: float):
        """RMSNorm of bfloat16 rows x [..., n] with w [n]: float32 statistics and arithmetic, rounded once
        -> bfloat16 [..., n] (torch_pixtral.RMSNorm's maths)."""
        rows = self._bf16_rows(x, "rms_norm_bf16")
        w = w.detach().contiguous().float()
        if w.shape != (rows.shape[1],):
            raise ValueError(f"norm weights {tuple(w.shape)} do not fit rows of {rows.shape[1]}")
        y = torch.empty(rows.shape, dtype=torch.bfloat16)
        rc = self.lib.rms_norm_bf16(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0), w.data_ptr(),
                                    float(eps), y.data_ptr(), y.stride(0), torch.get_num_threads())
        return _checked(rc, y.view(x.shape), "rms_norm_bf16")

    def rope_bf16_(self, x, cos, sin):
        """In place: x [B, H, N, d] bfloat16, laid out as rows of the heads ([B, N, H, d], the projection's
        output viewed by head), turned by the split-half rotation of cos, sin [N, d] (torch_pixtral.rope's
        tables: the d / 2 angles twice) in float32, rounded once; returns x."""
        b, h, n, d = x.shape
        if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.stride(3) != 1 or x.stride(1) != d
                or x.stride(2) != h * d):
            raise ValueError(f"rope_bf16_ takes bfloat16 CPU heads laid out as [B, N, H, d], got {x.dtype} "
                             f"{tuple(x.shape)} strides {x.stride()}")
        if cos.shape != (n, d) or sin.shape != (n, d):
            raise ValueError(f"rotary tables {tuple(cos.shape)} do not fit {n} rows of heads of {d}")
        # read in place (the first d / 2 of each row) where both are float32 rows at one stride, as
        # LightOnOCRVision's are under use_rows for every layer's q and k; else converted once a call
        if not (cos.dtype == sin.dtype == torch.float32 and cos.stride() == sin.stride() and cos.stride(1) == 1):
            cos, sin = cos.float().contiguous(), sin.float().contiguous()
        for i in range(b):
            rc = self.lib.rope_bf16(x[i].data_ptr(), n, h, d, h * d, cos.data_ptr(), sin.data_ptr(), cos.stride(0),
                                    torch.get_num_threads())
            _checked(rc, None, "rope_bf16_")
        return x

    def swiglu_bf16_(self, g, u):
        """In place: g = silu(g) * u for bfloat16 rows g, u [..., F] (float32 arithmetic, rounded once);
        returns g."""
        gr, ur = self._bf16_rows(g, "swiglu_bf16_"), self._bf16_rows(u, "swiglu_bf16_")
        if gr.shape != ur.shape:
            raise ValueError(f"gate {tuple(g.shape)} and up {tuple(u.shape)} differ")
        rc = self.lib.swiglu_bf16(gr.data_ptr(), ur.data_ptr(), gr.shape[0], gr.shape[1], gr.stride(0), ur.stride(0),
                                  torch.get_num_threads())
        return _checked(rc, g, "swiglu_bf16_")

    def int8_of(self, x: np.ndarray, divisor: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """cache._int8_of(x / divisor) to the bit: x [H, T, D] float32 (any strides but contiguous
        columns: a chunk's keys as the pool takes them), divisor [H, 1, D] or None -> (q [H, T, D] int8,
        scales [H, T, 1] as bfloat16 bits)."""
        if x.dtype != np.float32 or x.ndim != 3 or x.strides[2] != 4 or any(s % 4 for s in x.strides):
            raise ValueError(f"int8_of takes float32 [H, T, D] with contiguous columns, got {x.dtype} {x.shape}")
        h, t, d = x.shape
        if divisor is not None:
            divisor = np.ascontiguousarray(divisor, dtype=np.float32)
            if divisor.shape != (h, 1, d):
                raise ValueError(f"channel scales {divisor.shape} do not fit rows {x.shape}")
        q, bits = np.empty((h, t, d), np.int8), np.empty((h, t, 1), np.uint16)
        rc = self.lib.int8_rows(x.ctypes.data, h, t, d, x.strides[0] // 4, x.strides[1] // 4,
                                None if divisor is None else divisor.ctypes.data, q.ctypes.data, bits.ctypes.data,
                                torch.get_num_threads())
        return _checked(rc, (q, bits), "int8_of")


def _checked(rc: int, y, what: str):
    if rc != 0:
        raise ValueError(f"{what} refused its arguments (code {rc})")
    return y


ROWS = Library("rows", ROWS_SOURCE, Rows, "row operations", "torch's row operations", "rows_take",
               "the build has no AVX-512")
build = ROWS.build  # (cache_dir, cc=None, isa=None) -> Rows, or why there are none
compiled_rows = ROWS.compiled  # this process's row operations, built on first use in the user cache, or None
rows_why = ROWS.why  # one line: which row operations a prompt takes here, and why
