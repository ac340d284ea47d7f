"""Products of bfloat16 rows in int8 (csrc/int8_rows.c's passes around torch's _int_mm), built by
native.Library into the user cache and called through ctypes: the vision tower's q/k/v, output and
feed-forward products under `--vision-dtype int8` (torch_pixtral.PixtralVision.use_int8).

    products = compiled_int8_products()             # None where the kernels do not build (int8_products_why())
    q, k, v = products(h, [wq, wk, wv])              # h [..., K] bfloat16, w [N_i, K] bfloat16 -> [..., N_i] each
    (a,) = products(h, [gate, up], swiglu=True)      # silu(h gate^T) * (h up^T) -> [..., F]

How: per call, every row of the activations and of the weights is quantized to int8 with its own scale
(largest |.| / 127), torch multiplies the integers exactly (int32 sums, VNNI where the CPU has it), and
each sum is scaled back and rounded once to bfloat16. Before that both sides are smoothed (SmoothQuant's
migration, computed from this call's own rows): column j of the activations is divided and column j of
the weights multiplied by s_j = sqrt(max|x_j| / max|w_j|), which leaves the product as it is but evens
out a channel far larger than the others, the case where one scale per row loses the rest of the row.
Weights are quantized at each call from the file's bfloat16 (~2% of a full page's product time): no
second copy of the tower stays resident.

Why: on a CPU without AMX tiles a full page's tower is bfloat16-GEMM-bound, and torch's int8 GEMM runs
about twice as fast (docs/benchmarks.md). The cost is precision: a product's error is ~5x bfloat16's
(int8 keeps ~7 bits of each row where bfloat16 keeps 8 of each value), the tower's features off by a few
percent where bfloat16's are off by about one; so it is a choice (`--vision-dtype int8`), not the
default.
"""

from __future__ import annotations

import ctypes
import functools

from ...errors import OptionError
from .common import BackendUnavailable, require_torch
from .native import INT8_ROWS_SOURCE, Library

torch = require_torch()

CHUNK_SUMS = 1 << 22  # int32 sums per product call (16 MB): torch's int8 GEMM over a full page's 9,350 rows at once
# ran 0.57 TOPS at N = 4,096 (the sums leave the cache), by 1,024 rows 0.81-0.85; N = 8,192 by 512 rows 0.69, by 1,024
# 0.51; N = 1,024 by 1,024 or 2,048 rows 0.74 (2 threads, AVX-512 EPYC)


def chunk_rows(n: int) -> int:
    """Rows per product call for products n wide: CHUNK_SUMS of them, 256 to 2,048 rows."""
    return max(256, min(2048, CHUNK_SUMS // max(n, 1)))


class Int8Products:
    """csrc/int8_rows.c loaded: `products(x, weights, swiglu=False)`."""

    why = ""  # Library.build's line: "the compiled <ISA> int8 row passes (path; threads)"

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.int8_rows_take.restype = i32
        lib.colmax_bf16.argtypes, lib.colmax_bf16.restype = [p, i64, i64, i64, p, i32], i32
        lib.int8_rows_bf16.argtypes, lib.int8_rows_bf16.restype = [p, i64, i64, i64, p, p, p, i32], i32
        lib.dequant_i32.argtypes, lib.dequant_i32.restype = [p, i64, i64, i64, p, p, p, i64, i32], i32
        lib.swiglu_i32.argtypes, lib.swiglu_i32.restype = [p, p, i64, i64, i64, p, p, p, i64, i32], i32

    @staticmethod
    def _rows(x, what: str):
        """x [..., k] bfloat16 on the CPU as rows [m, k] with contiguous columns (a view where it can be)."""
        if x.dtype != torch.bfloat16 or x.device.type != "cpu":
            raise ValueError(f"{what} takes bfloat16 CPU rows, got {x.dtype} on {x.device}")
        rows = x.reshape(-1, x.shape[-1])
        return rows if rows.stride(-1) == 1 else rows.contiguous()

    def colmax(self, x):
        """The largest |x| of each column of bfloat16 rows x [..., k] -> float32 [k]."""
        rows = self._rows(x, "colmax")
        out = torch.empty(rows.shape[1])
        _check(self.lib.colmax_bf16(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0), out.data_ptr(),
                                    torch.get_num_threads()), "colmax")
        return out

    def quantize(self, x, mul=None, out=None, scale=None):
        """Each row of bfloat16 x [..., k], times mul [k] float32 if given, as int8 over its own scale ->
        (q [m, k] int8, scale [m] float32), into out / scale where given."""
        rows = self._rows(x, "quantize")
        m, k = rows.shape
        q = torch.empty(m, k, dtype=torch.int8) if out is None else out
        s = torch.empty(m) if scale is None else scale
        if q.shape != (m, k) or not q.is_contiguous() or s.shape != (m,) or not s.is_contiguous():
            raise ValueError(f"quantize's outputs {tuple(q.shape)}, {tuple(s.shape)} do not fit rows {(m, k)}")
        if mul is not None and (mul.dtype != torch.float32 or mul.shape != (k,) or not mul.is_contiguous()):
            raise ValueError(f"the column factors must be float32 [{k}], got {mul.dtype} {tuple(mul.shape)}")
        _check(self.lib.int8_rows_bf16(rows.data_ptr(), m, k, rows.stride(0), None if mul is None else mul.data_ptr(),
                                       q.data_ptr(), s.data_ptr(), torch.get_num_threads()), "quantize")
        return q, s

    def smoothing(self, x, weights):
        """s [k] float32: sqrt(max|x_j| / max_i max|w_i j|), 1 where either is 0 or not finite (a NaN or
        an infinity then spoils only its own rows, as in bfloat16)."""
        cx = self.colmax(x)
        cw = functools.reduce(torch.maximum, (self.colmax(w) for w in weights))
        s = torch.sqrt(cx / cw)
        usable = (cx > 0) & (cw > 0) & cx.isfinite() & cw.isfinite()
        return torch.where(usable, s, torch.ones_like(s))

    def prepare(self, x, weights, biases=None) -> Int8Weights:
        """weights [n_i, k] bfloat16 (as F.linear's), smoothed for the columns of x [..., k] and quantized:
        their product with x's rows, or any of them (Int8Weights.apply)."""
        k = x.shape[-1]
        if any(w.dim() != 2 or w.shape[1] != k or w.dtype != torch.bfloat16 for w in weights):
            raise ValueError(f"weights must be bfloat16 [n, {k}], got {[(w.dtype, tuple(w.shape)) for w in weights]}")
        s = self.smoothing(x, weights)
        sizes = [w.shape[0] for w in weights]
        qw, sw = torch.empty(sum(sizes), k, dtype=torch.int8), torch.empty(sum(sizes))
        at = 0
        for w, n in zip(weights, sizes):  # every weight's rows into one matrix: one product for all
            self.quantize(w, s, qw[at:at + n], sw[at:at + n])
            at += n
        return Int8Weights(self, torch.reciprocal(s), qw, sw, sizes, biases)

    def __call__(self, x, weights, *, swiglu: bool = False, biases=None):
        """x [..., k] bfloat16 times each of weights [n_i, k] bfloat16 (transposed, as F.linear), plus
        biases[i] where given (added to the bfloat16 product: a second rounding; Pixtral's towers have
        none) -> a list of bfloat16 [..., n_i]; swiglu: weights = [gate, up] of one
        shape -> [silu(x gate^T) * (x up^T)] [..., f]."""
        return self.prepare(x, weights, biases).apply(x, swiglu=swiglu)


class Int8Weights:
    """Weights quantized for one input's columns (Int8Products.prepare): `apply(rows)`."""

    def __init__(self, products: Int8Products, unsmooth, qw, sw, sizes: list[int], biases):
        self.products, self.unsmooth, self.qw, self.sw, self.sizes, self.biases = products, unsmooth, qw, sw, sizes, biases

    def apply(self, x, *, swiglu: bool = False):
        """x [..., k] bfloat16 (the prepared input, or some of its rows) -> a list of bfloat16 [..., n_i];
        swiglu (two weights of one shape, gate and up, no biases) -> [silu(gate) * up [..., f]]."""
        p, qw, sw, sizes = self.products, self.qw, self.sw, self.sizes
        if swiglu and (len(sizes) != 2 or sizes[0] != sizes[1] or self.biases is not None):
            raise ValueError("swiglu takes two weights of one shape, gate and up, without biases")
        rows = p._rows(x, "int8 products")
        qx, sx = p.quantize(rows, self.unsmooth)
        m = rows.shape[0]
        outs = [torch.empty(m, n, dtype=torch.bfloat16) for n in (sizes[:1] if swiglu else sizes)]  # swiglu: [m, f]
        threads = torch.get_num_threads()
        if swiglu:  # gate and up as two products a chunk: [rows, 4,096] ran faster than one [rows, 8,192]
            f = sizes[0]
            step = chunk_rows(f)
            for r in range(0, m, step):
                g, u = (torch._int_mm(qx[r:r + step], half.t()) for half in (qw[:f], qw[f:]))  # int32, exact
                _check(p.lib.swiglu_i32(g.data_ptr(), u.data_ptr(), g.shape[0], f, g.stride(0), sx[r:].data_ptr(),
                                        sw.data_ptr(), outs[0][r:].data_ptr(), outs[0].stride(0), threads), "swiglu")
            return [outs[0].view(*x.shape[:-1], f)]
        step = chunk_rows(qw.shape[0])
        for r in range(0, m, step):
            y = torch._int_mm(qx[r:r + step], qw.t())  # [rows, sum n] int32, exact
            at = 0
            for out, n in zip(outs, sizes):
                _check(p.lib.dequant_i32(y[:, at:].data_ptr(), y.shape[0], n, y.stride(0), sx[r:].data_ptr(),
                                         sw[at:].data_ptr(), out[r:].data_ptr(), out.stride(0), threads), "dequant")
                at += n
        for out, b in zip(outs, self.biases or ()):
            if b is not None:
                out += b.to(torch.bfloat16)
        return [out.view(*x.shape[:-1], out.shape[1]) for out in outs]


def _check(rc: int, what: str) -> None:
    if rc == -2:
        raise MemoryError(f"int8 {what}: out of memory")
    if rc != 0:
        raise ValueError(f"int8 {what} refused its arguments (code {rc})")


INT8_ROWS = Library("int8_rows", INT8_ROWS_SOURCE, Int8Products, "int8 row passes", "no int8 products",
                    "int8_rows_take", "the build has no AVX-512")
build = INT8_ROWS.build  # (cache_dir, cc=None, isa=None) -> Int8Products, or why there are none
compiled_int8_products = INT8_ROWS.compiled  # this process's int8 products, built on first use, or None
int8_products_why = INT8_ROWS.why  # one line: the int8 products here, or why there are none


def check_int8(device: str) -> None:
    """The vision dtype int8 runs the torch tower on the CPU with the compiled row passes, or is refused."""
    if device != "cpu":
        raise OptionError("vision_dtype", f"the int8 products run on the CPU (device cpu), not {device}; "
                                          "bfloat16 is the fast choice on a GPU", "int8")
    if compiled_int8_products() is None:
        raise BackendUnavailable("vision_dtype", f"needs the compiled int8 row passes: {int8_products_why()}", "int8")

