"""The LightOnOCR vision encoder + projector as a torch module, built from the GGUF weights the
numpy engine loaded (dequantized with Weight.dense(); no other checkpoint), and the torch
vision backend on cpu / cuda / mps in float32, bfloat16 or float16.

Same maths as models/pixtral.py + models/lightonocr.py. Two choices differ
in form only:
- the converter's permuted vision Q/K rows (adjacent RoPE pairs) are un-permuted back to Hugging
  Face's order at build time, so RoPE is the split-half (NeoX) rotation, which needs no strided
  slices; attention scores are unchanged because Q and K get the same permutation;
- attention is torch's scaled_dot_product_attention (not causal), with an optional key mask for
  padded bucket grids (see buckets.py).
Norms run in float32 whatever the compute dtype (as transformers does); the output is float32.

Importing this module imports torch: only backends/__init__ and the tests import it, lazily.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..ops import rope_angles_2d
from .common import check_pixels

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASK_NEG = -30000.0  # additive attention bias for masked keys: exp() underflows to 0, fits float16


def _t(a: np.ndarray | None, dtype) -> torch.Tensor | None:
    """float32 numpy -> tensor of `dtype`; shares memory with resident float32 weights (no second
    copy of the model on a CPU device), copies read-only memory-mapped ones."""
    if a is None:
        return None
    arr = np.ascontiguousarray(a, dtype=np.float32)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr).to(dtype)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF vision Q/K rows (per head: adjacent RoPE pairs 2i, 2i+1) -> Hugging Face order (pairs
    i, i + d/2). Works on matrices [n_head*d, in] and biases [n_head*d]."""
    rest = w.shape[1:]
    d = w.shape[0] // n_head
    return np.ascontiguousarray(w.reshape(n_head, d // 2, 2, *rest).swapaxes(1, 2).reshape(n_head * d, *rest))


class _Matrix(nn.Module):
    """y = x @ W.T (+ b): W [out, in] in the compute dtype."""

    def __init__(self, w: np.ndarray, b: np.ndarray | None, dtype):
        super().__init__()
        self.register_buffer("weight", _t(w, dtype))
        self.register_buffer("bias", _t(b, dtype))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Split-half RoPE on x [1, H, N, 2*half] with cos/sin [N, 2*half] (angles duplicated)."""
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class _Layer(nn.Module):
    def __init__(self, layer, n_head: int, dtype):
        super().__init__()
        self.register_buffer("ln1", _t(layer.ln1, torch.float32))
        self.register_buffer("ln2", _t(layer.ln2, torch.float32))
        un = lambda a: None if a is None else unpermute_qk(a, n_head)  # noqa: E731
        self.wq = _Matrix(un(layer.attn_q.dense()), un(layer.attn_q_bias), dtype)
        self.wk = _Matrix(un(layer.attn_k.dense()), un(layer.attn_k_bias), dtype)
        self.wv = _Matrix(layer.attn_v.dense(), layer.attn_v_bias, dtype)
        self.wo = _Matrix(layer.attn_out.dense(), layer.attn_out_bias, dtype)
        self.gate = _Matrix(layer.ffn_gate.dense(), layer.ffn_gate_bias, dtype)
        self.up = _Matrix(layer.ffn_up.dense(), layer.ffn_up_bias, dtype)
        self.down = _Matrix(layer.ffn_down.dense(), layer.ffn_down_bias, dtype)


class LightOnOCRVision(nn.Module):
    """pixels [1, 3, H, W] (+ optional key mask [1, N]) -> features [(h//s)*(w//s), n_embd].

    With a mask (a padded bucket grid), the output holds every merged token of the padded grid;
    buckets.merged_rows picks the page's own."""

    def __init__(self, vision, projector, dtype: torch.dtype = torch.float32):
        super().__init__()
        c = vision.cfg
        self.cfg, self.dtype = c, dtype
        self.patch, self.n_head, self.head_dim = c.patch_size, c.n_head, c.head_dim
        self.eps, self.merge, self.proj_eps = float(c.eps), projector.merge, float(projector.eps)
        p = c.patch_size
        self.register_buffer("patch_embd", _t(vision.patch_embd.dense().reshape(c.n_embd, 3, p, p), dtype))
        self.register_buffer("patch_bias", _t(vision.patch_bias, dtype))
        self.register_buffer("pre_ln", _t(vision.pre_ln, torch.float32))
        self.layers = nn.ModuleList(_Layer(layer, c.n_head, dtype) for layer in vision.layers)
        self.register_buffer("proj_norm", _t(projector.norm, torch.float32))
        self.merger = _Matrix(projector.merger.dense(), None, dtype)
        self.linear_1 = _Matrix(projector.linear_1.dense(), projector.bias_1, dtype)
        self.linear_2 = _Matrix(projector.linear_2.dense(), projector.bias_2, dtype)
        self._rope: OrderedDict = OrderedDict()
        self._rope_lock = threading.Lock()

    def rope(self, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h*w, head_dim] for an h x w grid (cached per grid and device, a few grids)."""
        key = (h, w, str(device))
        with self._rope_lock:
            hit = self._rope.get(key)
            if hit is not None:
                self._rope.move_to_end(key)
                return hit
        rows, cols = np.divmod(np.arange(h * w), w)
        cos, sin = rope_angles_2d(rows, cols, self.head_dim, self.cfg.rope_base)  # [N, d/2] float32
        pair = tuple(torch.from_numpy(np.concatenate([a, a], axis=1)).to(device=device, dtype=self.dtype)
                     for a in (cos, sin))
        with self._rope_lock:
            self._rope[key] = pair
            while len(self._rope) > 8:
                self._rope.popitem(last=False)
        return pair

    def forward(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None = None) -> torch.Tensor:
        p = self.patch
        return self.run(pixels, patch_mask, int(pixels.shape[2]) // p, int(pixels.shape[3]) // p)

    def run(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None, h: int, w: int) -> torch.Tensor:
        """forward() on a known h x w patch grid (Python ints: a trace keeps them as constants)."""
        p, nh, hd = self.patch, self.n_head, self.head_dim
        n = h * w
        x = F.conv2d(pixels.to(self.dtype), self.patch_embd, self.patch_bias, stride=p)  # [1, D, h, w]
        x = x.flatten(2).transpose(1, 2)  # [1, N, D] row-major patches
        x = _rmsnorm(x, self.pre_ln, self.eps)
        cos, sin = self.rope(h, w, x.device)  # [N, hd]
        bias = None
        if patch_mask is not None:  # [1, N] 1 = real patch; padded keys get MASK_NEG
            bias = ((1.0 - patch_mask.to(self.dtype)) * MASK_NEG).reshape(1, 1, 1, n)
        for layer in self.layers:
            hn = _rmsnorm(x, layer.ln1, self.eps)
            q = layer.wq(hn).reshape(1, n, nh, hd).transpose(1, 2)  # [1, H, N, hd]
            k = layer.wk(hn).reshape(1, n, nh, hd).transpose(1, 2)
            v = layer.wv(hn).reshape(1, n, nh, hd).transpose(1, 2)
            q, k = _rotate(q, cos, sin, hd // 2), _rotate(k, cos, sin, hd // 2)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # [1, H, N, hd], scale hd^-0.5
            x = x + layer.wo(a.transpose(1, 2).reshape(1, n, nh * hd))
            hn = _rmsnorm(x, layer.ln2, self.eps)
            x = x + layer.down(F.silu(layer.gate(hn)) * layer.up(hn))
        # projector: RMSNorm (text eps) -> s x s merge (index channel*s*s + dy*s + dx) -> MLP
        s = self.merge
        hs, ws = h // s, w // s
        x = _rmsnorm(x, self.proj_norm, self.proj_eps)[0]  # [N, D]
        d = self.cfg.n_embd
        g = x.reshape(h, w, d)[: hs * s, : ws * s].reshape(hs, s, ws, s, d).permute(0, 2, 4, 1, 3)
        x = self.merger(g.reshape(hs * ws, d * s * s))  # [M, D]
        x = self.linear_2(F.gelu(self.linear_1(x)))  # exact erf GELU
        return x.float()


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
