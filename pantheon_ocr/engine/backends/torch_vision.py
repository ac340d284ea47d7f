"""The torch vision backend on cpu / cuda / mps in float32, bfloat16 or float16: the LightOnOCR
vision encoder + projector of torch_pixtral.py (the one torch definition, which training uses
too), loaded with the GGUF weights the numpy engine loaded (dequantized with Weight.dense(); no
other checkpoint).

Same maths as models/pixtral.py + models/lightonocr.py. Choices that differ in form only:
- the converter's permuted vision Q/K rows (adjacent RoPE pairs) are un-permuted back to Hugging
  Face's order at build time, so RoPE is the split-half (NeoX) rotation, which needs no strided
  slices; attention scores are unchanged because Q and K get the same permutation;
- the RoPE tables are the numpy engine's (ops.rope_angles_2d), cached per grid;
- attention is torch's scaled_dot_product_attention (not causal), with an optional key mask for
  padded bucket grids (see buckets.py); in bfloat16 on a CPU without AMX tiles, query_block_attention
  (the same maths as plain bfloat16 products, 2.4x faster there; with tiles SDPA is 1.9x faster).
Norms run in float32 whatever the compute dtype (as transformers does); the output is float32.

Importing this module imports torch: only backends/__init__ and the tests import it, lazily.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from ..format.writer import unpermute_qk
from ..ops import rope_angles_2d
from .common import check_pixels, cpu_has_amx
from .torch_pixtral import PixtralVision, Projector, query_block_attention

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASK_NEG = -30000.0  # additive attention bias for masked keys: exp() underflows to 0, fits float16

__all__ = ["FixedGrid", "LightOnOCRVision", "TorchVisionBackend", "unpermute_qk"]


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


class LightOnOCRVision(PixtralVision):
    """pixels [1, 3, H, W] (+ optional key mask [1, N]) -> features [(h//s)*(w//s), n_embd].

    With a mask (a padded bucket grid), the output holds every merged token of the padded grid;
    buckets.merged_rows picks the page's own."""

    def __init__(self, vision, projector, dtype: torch.dtype = torch.float32):
        c = vision.cfg
        with torch.device("meta"):  # shapes only: every weight comes from the GGUF below
            # the numpy tower's own layers: all of them, or the first N a benchmark asked for
            super().__init__(c.n_embd, len(vision.layers), c.n_head, c.n_ff, c.patch_size, float(c.eps), c.rope_base)
            self.projector = Projector(c.n_embd, c.projection_dim, projector.merge, float(projector.eps))
        self.cfg, self.dtype = c, dtype
        f32, p = torch.float32, c.patch_size
        _load(self.patch_conv, dtype, vision.patch_embd.dense().reshape(c.n_embd, 3, p, p), vision.patch_bias)
        _load(self.ln_pre, f32, vision.pre_ln)
        un = lambda a: None if a is None else unpermute_qk(a, c.n_head)  # noqa: E731
        for block, layer in zip(self.layers, vision.layers):
            _load(block.attention_norm, f32, layer.ln1)
            _load(block.q_proj, dtype, un(layer.attn_q.dense()), un(layer.attn_q_bias))
            _load(block.k_proj, dtype, un(layer.attn_k.dense()), un(layer.attn_k_bias))
            _load(block.v_proj, dtype, layer.attn_v.dense(), layer.attn_v_bias)
            _load(block.o_proj, dtype, layer.attn_out.dense(), layer.attn_out_bias)
            _load(block.ffn_norm, f32, layer.ln2)
            ffn = block.feed_forward
            _load(ffn.gate_proj, dtype, layer.ffn_gate.dense(), layer.ffn_gate_bias)
            _load(ffn.up_proj, dtype, layer.ffn_up.dense(), layer.ffn_up_bias)
            _load(ffn.down_proj, dtype, layer.ffn_down.dense(), layer.ffn_down_bias)
        pr = self.projector
        _load(pr.norm, f32, projector.norm)
        _load(pr.merging_layer, dtype, projector.merger.dense())
        _load(pr.linear_1, dtype, projector.linear_1.dense(), projector.bias_1)
        _load(pr.linear_2, dtype, projector.linear_2.dense(), projector.bias_2)
        self._rope: OrderedDict = OrderedDict()
        self._rope_lock = threading.Lock()

    def rope(self, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h*w, head_dim] for an h x w grid in the compute dtype: the numpy engine's
        tables (cached per grid and device, a few grids)."""
        key = (h, w, str(device))
        with self._rope_lock:
            hit = self._rope.get(key)
            if hit is not None:
                self._rope.move_to_end(key)
                return hit
        rows, cols = np.divmod(np.arange(h * w), w)
        cos, sin = rope_angles_2d(rows, cols, self.cfg.head_dim, self.cfg.rope_base)  # [N, d/2] float32
        pair = tuple(torch.from_numpy(np.concatenate([a, a], axis=1)).to(device=device, dtype=self.dtype)
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


class TorchVisionBackend:
    """VisionBackend on a torch device: weights uploaded once at construction."""

    name = "torch"

    def __init__(self, vlm, device: str = "cpu", dtype: str = "float32"):
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {list(TORCH_DTYPES)}, not {dtype!r}")
        self.vlm, self.device, self.dtype = vlm, device, dtype
        self.reason = "chosen"
        self.module = LightOnOCRVision(vlm.vision, vlm.projector, TORCH_DTYPES[dtype]).to(device).eval()
        if device == "cpu" and dtype == "bfloat16" and not cpu_has_amx():  # SDPA's kernel uses AMX tiles only
            self.module.use_attention(query_block_attention)

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
        return out.numpy()

    def __repr__(self) -> str:
        return f"TorchVisionBackend(device={self.device!r}, dtype={self.dtype!r})"
