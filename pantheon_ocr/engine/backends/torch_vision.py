"""The torch vision backend on cpu / cuda / mps in float32, bfloat16 or float16: the LightOnOCR
vision encoder + projector of torch_pixtral.py (the one torch definition, which training uses
too), loaded with the GGUF weights the numpy engine loaded (no other checkpoint): on the CPU the
matrices the file stores as floats are used from its memory map, a block's pages dropped from the
resident set once it has run (MappedLinear); other matrices, and every weight on a device, are
copies (Weight.dense() in the compute dtype).

Same maths as models/pixtral.py + models/lightonocr.py. Choices that differ in form only:
- the converter's permuted vision Q/K rows (adjacent RoPE pairs) are un-permuted back to Hugging
  Face's order (at build time for a copy, at each call for a mapped matrix), so RoPE is the
  split-half (NeoX) rotation, which needs no strided slices; attention scores are unchanged
  because Q and K get the same permutation;
- the RoPE tables are the numpy engine's (ops.rope_angles_2d), cached per grid;
- attention is torch's scaled_dot_product_attention (not causal), with an optional key mask for
  padded bucket grids (see buckets.py); in bfloat16 on a CPU without AMX tiles, the compiled
  attention of bf16_attention.py where it builds and takes the heads (scores in float32 per 32 query
  rows, ~0.3 s of a full page's 2.5 s layer faster than the products by query blocks), else
  query_block_attention (plain bfloat16 products, 2.4x faster than SDPA there; with tiles SDPA is
  1.9x faster), its softmax the compiled one where it builds;
- in bfloat16 on the CPU the norms, the rotary embedding and the SwiGLU are the compiled row
  operations of rows.py where they build (PixtralVision.use_rows; the rope tables float32 then);
- "int8" (CPU only) is bfloat16 with the blocks' products in int8 (int8_products.py,
  PixtralVision.use_int8).
Norms run in float32 whatever the compute dtype (as transformers does); the output is float32.

Importing this module imports torch: only backends/__init__ and the tests import it, lazily.
"""

from __future__ import annotations

import functools

import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..format.gguf import GGUFFile
from ..format.torch_weights import map_view
from ..format.weights import Weight
from ..format.writer import unpermute_qk
from ..memory import release_free_memory
from ..ops import rope_angles_2d
from .common import check_pixels, cpu_has_amx
from .int8_products import check_int8, compiled_int8_products
from .rows import compiled_rows, rows_why
from .bf16_attention import BY_QUERY_BLOCKS, compiled_full_attention, compiled_softmax
from .torch_pixtral import PixtralVision, Projector, query_block_attention

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int8": torch.bfloat16}  # int8: bfloat16 with the blocks' products in int8 (use_int8)
MASK_NEG = -30000.0  # additive attention bias for masked keys: exp() underflows to 0, fits float16

__all__ = ["FixedGrid", "LightOnOCRVision", "MappedLinear", "TorchVisionBackend", "unpermute_qk"]


def _t(a: np.ndarray, dtype) -> nn.Parameter:
    """float32 numpy -> a frozen parameter of `dtype`; shares memory with resident float32 weights
    (no second copy of the model on a CPU device), copies read-only memory-mapped ones."""
    arr = np.ascontiguousarray(a, dtype=np.float32)
    if not arr.flags.writeable:
        arr = arr.copy()
    return nn.Parameter(torch.from_numpy(arr).to(dtype), requires_grad=False)


def _load(module: nn.Module, dtype, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
    """Give a Linear / Conv2d / RMSNorm of the (meta) module tree its weight and optional bias."""
    module.weight = _t(weight, dtype)
    if bias is not None:
        module.bias = _t(bias, dtype)


_TORCH_OF = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
             np.dtype(np.uint16): torch.bfloat16}  # Weight.stored_floats' dtypes (BF16 as its bits)


def _stored(w: Weight) -> torch.Tensor | None:
    """A matrix the file stores as floats, as a torch tensor over the map's bytes (no copy), or None."""
    a = w.stored_floats()
    return None if a is None else map_view(a, _TORCH_OF[a.dtype], a.shape)


class MappedLinear(nn.Module):
    """nn.Linear's product over a matrix as the GGUF file stores it (F32, F16 or BF16, a view of the
    memory map), taken to the compute dtype at each call, its rows put in `rows` order first (the
    vision Q/K, un-permuted as unpermute_qk does). Same bits as a copy converted once: the same
    rounding, done later. Why: resident copies held the tower's 0.8 GB (LightOnOCR-1B, bfloat16)
    for the whole run beside the decoder and every page's KV cache; as views the weights are the
    file's pages, which LightOnOCRVision drops from the resident set after each block has run (the
    page cache keeps them for the next page). The cost is the conversion per call: BF16 to
    bfloat16 none, F16 to bfloat16 ~0.2 s a full page against ~30 s of products (2 threads)."""

    def __init__(self, stored: torch.Tensor, dtype: torch.dtype, rows: torch.Tensor | None = None,
                 bias: nn.Parameter | None = None):
        super().__init__()
        self.stored, self.dtype, self.rows = stored, dtype, rows  # not parameters: the file's bytes
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:
        """The matrix in the compute dtype, its rows in order (a view of the map where nothing changes)."""
        w = self.stored if self.rows is None else self.stored.index_select(0, self.rows)
        return w.to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LightOnOCRVision(PixtralVision):
    """pixels [1, 3, H, W] (+ optional key mask [1, N]) -> features [(h//s)*(w//s), n_embd].

    With a mask (a padded bucket grid), the output holds every merged token of the padded grid;
    buckets.merged_rows picks the page's own.

    mapped_from: the mmproj file the towers' weights are read from. Given, the matrices it stores as
    floats are used from its memory map (MappedLinear) and each block's pages leave the resident
    set once the block has run, so a page's vision holds about one layer's weights at a time (the
    CPU backend). Not given, every weight is a copy in the compute dtype (the module a device or a
    Core ML trace takes)."""

    def __init__(self, vision, projector, dtype: torch.dtype = torch.float32, mapped_from: GGUFFile | None = None):
        c = vision.cfg
        with torch.device("meta"):  # shapes only: every weight comes from the GGUF below
            # the numpy tower's own layers: all of them, or the first N a benchmark asked for
            super().__init__(c.n_embd, len(vision.layers), c.n_head, c.n_ff, c.patch_size, float(c.eps), c.rope_base)
            self.projector = Projector(c.n_embd, c.projection_dim, projector.merge, float(projector.eps))
        self.cfg, self.dtype, self.gguf = c, dtype, mapped_from
        self.table_dtype = dtype  # the rope tables': float32 under use_rows
        f32, p = torch.float32, c.patch_size
        qk_rows = torch.from_numpy(unpermute_qk(np.arange(c.n_embd)[:, None], c.n_head)[:, 0].copy())

        def linear(parent: nn.Module, attr: str, w: Weight, bias: np.ndarray | None, permuted: bool = False) -> str:
            """Set parent.attr to the product with w (a view where the file stores floats and
            mapped_from is given, else a copy); the tensor's name, for the pages to drop."""
            stored = _stored(w) if mapped_from is not None else None
            if permuted and bias is not None:
                bias = unpermute_qk(bias, c.n_head)
            if stored is None:
                _load(getattr(parent, attr), dtype, unpermute_qk(w.dense(), c.n_head) if permuted else w.dense(), bias)
            else:
                setattr(parent, attr, MappedLinear(stored, dtype, qk_rows if permuted else None,
                                                   None if bias is None else _t(bias, dtype)))
            return w.name

        _load(self.patch_conv, dtype, vision.patch_embd.dense().reshape(c.n_embd, 3, p, p), vision.patch_bias)
        _load(self.ln_pre, f32, vision.pre_ln)
        for block, layer in zip(self.layers, vision.layers):
            _load(block.attention_norm, f32, layer.ln1)
            ffn = block.feed_forward
            names = [linear(block, "q_proj", layer.attn_q, layer.attn_q_bias, permuted=True),
                     linear(block, "k_proj", layer.attn_k, layer.attn_k_bias, permuted=True),
                     linear(block, "v_proj", layer.attn_v, layer.attn_v_bias),
                     linear(block, "o_proj", layer.attn_out, layer.attn_out_bias),
                     linear(ffn, "gate_proj", layer.ffn_gate, layer.ffn_gate_bias),
                     linear(ffn, "up_proj", layer.ffn_up, layer.ffn_up_bias),
                     linear(ffn, "down_proj", layer.ffn_down, layer.ffn_down_bias)]
            _load(block.ffn_norm, f32, layer.ln2)
            self._drop_after(block, names)
        pr = self.projector
        _load(pr.norm, f32, projector.norm)
        self._drop_after(pr, [linear(pr, "merging_layer", projector.merger, None),
                              linear(pr, "linear_1", projector.linear_1, projector.bias_1),
                              linear(pr, "linear_2", projector.linear_2, projector.bias_2)])
        release_free_memory()  # the float32 copies dense() made for every matrix
        self._rope: OrderedDict = OrderedDict()
        self._rope_lock = threading.Lock()

    def _drop_after(self, module: nn.Module, names: list[str]) -> None:
        """With mapped_from: after each run of `module`, its tensors' pages leave the resident set
        (a later run faults them back in from the page cache, or the file)."""
        if self.gguf is None:
            return
        gf = self.gguf

        def drop(*_) -> None:  # a forward hook: None keeps the module's output
            for name in names:
                gf.release(name)

        module.register_forward_hook(drop)

    def use_rows(self, rows) -> None:
        super().use_rows(rows)
        with self._rope_lock:  # the rotation reads float32 tables: build them so from now on
            self.table_dtype = torch.float32
            self._rope.clear()

    def rope(self, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h*w, head_dim] for an h x w grid in the compute dtype (float32 under use_rows):
        the numpy engine's tables (cached per grid and device, a few grids)."""
        key = (h, w, str(device))
        with self._rope_lock:
            hit = self._rope.get(key)
            if hit is not None:
                self._rope.move_to_end(key)
                return hit
        rows, cols = np.divmod(np.arange(h * w), w)
        cos, sin = rope_angles_2d(rows, cols, self.cfg.head_dim, self.cfg.rope_base)  # [N, d/2] float32
        pair = tuple(torch.from_numpy(np.concatenate([a, a], axis=1)).to(device=device, dtype=self.table_dtype)
                     for a in (cos, sin))
        with self._rope_lock:
            self._rope[key] = pair
            while len(self._rope) > 8:
                self._rope.popitem(last=False)
        return pair

    def forward(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.run(pixels, patch_mask, *self.grid(pixels))

    def run(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None, h: int, w: int) -> torch.Tensor:
        """forward() on a known h x w patch grid (Python ints: a trace keeps them as constants)."""
        x = self.embed(pixels.to(self.dtype))  # [1, N, D] row-major patches
        mask = None
        if patch_mask is not None:  # [1, N] 1 = real patch; padded keys get MASK_NEG
            mask = ((1.0 - patch_mask.to(self.dtype)) * MASK_NEG).reshape(1, 1, 1, h * w)
        x = self.encode(x, *self.rope(h, w, x.device), mask)  # [1, N, D]
        return self.projector(x, h, w).flatten(0, 2).float()  # [M, n_embd]


class FixedGrid(nn.Module):
    """The module on one fixed bucket grid, for torch.jit.trace: (pixels [1, 3, hb*p, wb*p],
    patch_mask [1, hb*wb]) -> features [(hb//s)*(wb//s), n_embd]."""

    def __init__(self, module: LightOnOCRVision, hb: int, wb: int):
        super().__init__()
        self.module, self.hb, self.wb = module, hb, wb

    def forward(self, pixels: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
        return self.module.run(pixels, patch_mask, self.hb, self.wb)


def cpu_bf16_attention(heads: int, head_dim: int) -> tuple:
    """(attend, which) for the tower in bfloat16 on a CPU without AMX tiles: the compiled attention
    where it builds and takes these heads (bf16_attention.FullAttention: scores and sums in float32,
    never written out), else torch's products by query blocks with the compiled softmax where that
    builds; `which` says which, in one line."""
    full = compiled_full_attention()
    if full is not None and full.takes(heads, head_dim):
        return full, full.why
    return functools.partial(query_block_attention, softmax=compiled_softmax()), BY_QUERY_BLOCKS


class TorchVisionBackend:
    """VisionBackend on a torch device: weights uploaded once at construction."""

    name = "torch"

    def __init__(self, vlm, device: str = "cpu", dtype: str = "float32"):
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {list(TORCH_DTYPES)}, not {dtype!r}")
        if dtype == "int8":  # refused before the tower is built: the CPU, where its row passes build
            check_int8(device)
        self.vlm, self.device, self.dtype = vlm, device, dtype
        self.reason = "chosen"
        # on the CPU the weights the file stores as floats are used from its map (LightOnOCRVision)
        mapped = vlm.mmproj if device == "cpu" else None
        self.module = LightOnOCRVision(vlm.vision, vlm.projector, TORCH_DTYPES[dtype], mapped).to(device).eval()
        # the build read every tensor: copies need those pages no more, views fault theirs back per block
        for name in vlm.mmproj.tensors:
            vlm.mmproj.release(name)
        self.kernels = "attention: torch's fused kernel (scaled_dot_product_attention)"  # the -v line's part
        if device == "cpu" and TORCH_DTYPES[dtype] == torch.bfloat16:
            if not cpu_has_amx():  # SDPA's kernel uses AMX tiles only
                attend, which = cpu_bf16_attention(self.module.heads, self.module.dim // self.module.heads)
                self.module.use_attention(attend)
                self.kernels = f"attention: {which}"
            rows = compiled_rows()
            self.kernels += f"; norms, rotary embedding and SwiGLU: {rows_why()}"
            if rows is not None:
                self.module.use_rows(rows)
        if dtype == "int8":
            products = compiled_int8_products()  # built: check_int8 above
            self.module.use_int8(products)
            self.kernels += f"; products: int8 ({products.why})"

    @torch.inference_mode()
    def encode(self, pixels: np.ndarray) -> np.ndarray:
        px = check_pixels(pixels)
        p = self.module.patch
        if px.shape[1] % p or px.shape[2] % p or not px.shape[1] or not px.shape[2]:
            raise ValueError(f"pixels must be [3, H, W] with H, W positive multiples of {p}, got {list(px.shape)}")
        x = torch.from_numpy(px)[None].to(self.device)
        out = self.module(x)
        if out.device.type != "cpu":
            out = out.cpu()
        else:  # a full page's activations (~0.9 GB at the 1B shapes) went back to the heap, ~0.5 GB
            release_free_memory()  # of it in pieces glibc keeps: back to the system (~20 ms)
        return out.numpy()

    def __repr__(self) -> str:
        return f"TorchVisionBackend(device={self.device!r}, dtype={self.dtype!r})"
