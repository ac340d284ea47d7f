"""Pixtral vision encoder (the LightOnOCR vision tower) from an mmproj GGUF, in numpy.

    pixels [3, H, W] -> patch conv (one matmul) -> ln_pre -> n_layer x {attention with 2-D RoPE,
    gated SiLU FFN} -> [N, D] patch features (row-major: index = row * w + col). No final norm.

Facts (transformers' Pixtral model and llama.cpp's converter): every norm is RMSNorm; no biases in the
released models (optional biases are honoured, as clip.cpp does); attention is not causal; the
converter permuted the Q/K rows so that HF's split-half RoPE pairs (i, i + d/2) are adjacent pairs
(2i, 2i+1) in the GGUF, hence `apply_rope(neox=False)` with angles [row f_{2k} | col f_{2k+1}].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ...errors import ModelError
from ..cancel import check as check_cancelled
from ..attention import TowerOptions
from ..format.config import in_range, positive_finite
from ..format.gguf import GGUFFile, meta, meta_array
from ..ops import add_bias, apply_rope, rmsnorm, rope_angles_2d, swiglu
from ..format import names as N
from ..format.names import v_blk
from ..format.weights import Storage, Weight, WeightLoader
from .reader import MAX_IMAGE_SIDE, ReadingHints, reading_hints

SUPPORTED_PROJECTORS = ("lightonocr",)
DEFAULT_ROPE_THETA = 10000.0  # not written by the converter; clip.cpp hard-codes it for lightonocr


@dataclass(frozen=True)
class VisionConfig:
    projector_type: str
    n_embd: int  # vision hidden size D
    n_ff: int
    n_layer: int
    n_head: int
    head_dim: int
    patch_size: int
    longest_edge: int  # preprocessing target for the longest image side
    eps: float  # vision RMSNorm eps
    rope_base: float
    merge: int  # spatial merge size of the projector (2: 2x2 patches -> one token)
    projection_dim: int  # projector output size = the text model's n_embd
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    # How the model wants its pages (`pantheon.reader.*` keys, reader.py); a LightOnOCR file names
    # none: it reads whole pages at longest_edge.
    hints: ReadingHints | None = None


def vision_config(gf: GGUFFile) -> VisionConfig:
    """Build the vision config from an mmproj GGUF's metadata; every problem names key and file."""
    arch = meta(gf, "general.architecture", str)
    if arch != "clip":
        raise ModelError(gf.path, f"not a vision projector (mmproj) file: 'general.architecture' is {arch!r}, expected 'clip'")
    if not meta(gf, "clip.has_vision_encoder", bool, True):
        raise ModelError(gf.path, "'clip.has_vision_encoder' is false: this mmproj has no vision encoder")
    projector = meta(gf, "clip.projector_type", str)
    if projector not in SUPPORTED_PROJECTORS:
        raise ModelError(gf.path, f"unsupported 'clip.projector_type' {projector!r} (supported: {', '.join(SUPPORTED_PROJECTORS)})")
    if meta(gf, "clip.use_gelu", bool, False) or not meta(gf, "clip.use_silu", bool, False):
        raise ModelError(gf.path, "unsupported vision FFN activation: expected 'clip.use_silu' = true (gated SiLU)")

    def key(name, kind, default=...):
        k = f"clip.vision.{name}"
        return meta(gf, k, kind) if default is ... else meta(gf, k, kind, default)

    n_embd = key("embedding_length", int)
    n_head = key("attention.head_count", int)
    if n_head <= 0 or n_embd % n_head:
        raise ModelError(gf.path, f"'clip.vision.embedding_length' ({n_embd}) is not a multiple of "
                                  f"'clip.vision.attention.head_count' ({n_head})")
    head_dim = n_embd // n_head
    if head_dim % 4:
        raise ModelError(gf.path, f"vision head size {head_dim} is not a multiple of 4 (needed by the 2-D RoPE)")
    stats = {name: tuple(float(np.float32(x)) for x in meta_array(gf, f"clip.vision.{name}", float, length=3, finite=True))
             for name in ("image_mean", "image_std")}
    if min(stats["image_std"]) <= 0:
        raise ModelError(gf.path, f"'clip.vision.image_std' must be positive, got {list(stats['image_std'])}")
    cfg = VisionConfig(
        projector_type=projector,
        n_embd=n_embd,
        n_ff=key("feed_forward_length", int),
        n_layer=key("block_count", int),
        n_head=n_head,
        head_dim=head_dim,
        patch_size=key("patch_size", int),
        longest_edge=key("preproc_image_size", int, key("image_size", int)),
        eps=key("attention.layer_norm_epsilon", float),
        rope_base=key("rope.freq_base", float, DEFAULT_ROPE_THETA),
        merge=key("spatial_merge_size", int, 2),
        projection_dim=key("projection_dim", int),
        image_mean=stats["image_mean"],
        image_std=stats["image_std"],
    )
    # Bounds well beyond any real tower (LightOnOCR: 1540 px, patch 14, 24 layers x 1024, FFN 4096):
    # an image size of 2^31 would make every page a MemoryError instead of one clear error here.
    for name, value, hi in (("patch_size", cfg.patch_size, 64), ("image_size", cfg.longest_edge, MAX_IMAGE_SIDE),
                            ("block_count", cfg.n_layer, 1024), ("feed_forward_length", cfg.n_ff, 1 << 20),
                            ("spatial_merge_size", cfg.merge, 8), ("projection_dim", cfg.projection_dim, 1 << 16),
                            ("embedding_length", cfg.n_embd, 1 << 16), ("attention.head_count", cfg.n_head, 1024)):
        in_range(gf, f"clip.vision.{name}", value, 1, hi)
    positive_finite(gf, "clip.vision.attention.layer_norm_epsilon", cfg.eps, 1.0)
    positive_finite(gf, "clip.vision.rope.freq_base", cfg.rope_base)
    if cfg.longest_edge < cfg.patch_size * cfg.merge:
        raise ModelError(gf.path, f"'clip.vision.image_size' ({cfg.longest_edge}) is smaller than one merged patch")
    return replace(cfg, hints=reading_hints(gf, cfg.longest_edge, cfg.patch_size, cfg.merge))


@dataclass(frozen=True)
class PixtralLayer:
    """One vision block's tensors, named as in the GGUF file (`v.blk.N.<name>.weight`, `<name>_bias`
    for `v.blk.N.<name>.bias`; the released models have no biases). D = n_embd, ff = n_ff."""

    ln1: np.ndarray  # [D] attention RMSNorm
    attn_q: Weight  # [D, D], rows permuted for adjacent-pair RoPE
    attn_k: Weight  # [D, D], rows permuted likewise
    attn_v: Weight  # [D, D]
    attn_out: Weight  # [D, D]
    attn_q_bias: np.ndarray | None  # [D]
    attn_k_bias: np.ndarray | None  # [D]
    attn_v_bias: np.ndarray | None  # [D]
    attn_out_bias: np.ndarray | None  # [D]
    ln2: np.ndarray  # [D] FFN RMSNorm
    ffn_gate: Weight  # [ff, D]
    ffn_up: Weight  # [ff, D]
    ffn_down: Weight  # [D, ff]
    ffn_gate_bias: np.ndarray | None  # [ff]
    ffn_up_bias: np.ndarray | None  # [ff]
    ffn_down_bias: np.ndarray | None  # [D]


def conv_weight(w: WeightLoader, name: str, shape: tuple[int, ...]) -> Weight:
    """A conv kernel [out, c, kh, kw] as one Weight [out, c*kh*kw] (input flattened (c, dy, dx))."""
    info = w.gf.tensors.get(name)
    if info is None:
        raise ModelError(w.gf.path, f"missing tensor {name!r}")
    if info.shape != tuple(shape):
        raise ModelError(w.gf.path, f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
    out, n_in = shape[0], int(np.prod(shape[1:]))
    raw = w.gf.raw(name).reshape(out, -1)  # [out, bytes of c*kh*kw values]: rows are contiguous
    return Weight(name, info.qtype, (out, n_in), raw, w.storage)


class PixtralVision:
    """The vision tower. `forward(pixels)` -> (features [N, D], (h, w) patch grid). `tower`
    (benchmarks, tests): the first N layers only, naive attention, tile sizes, a timing hook."""

    # Non-causal attention over ~9,400 patches: big tiles amortise numpy's per-call overhead
    # while each [heads, q_block, kv_block] score tile stays a few tens of MB.
    q_block = 1024
    kv_block = 1024

    def __init__(self, gf: GGUFFile, cfg: VisionConfig, storage: Storage, tower: TowerOptions = TowerOptions()):
        self.cfg, self.path, self.tower = cfg, gf.path, tower
        w = WeightLoader(gf, storage)
        c, p = cfg, cfg.patch_size
        self.patch_embd = conv_weight(w, N.V_PATCH_EMBD, (c.n_embd, 3, p, p))
        self.patch_bias = w.optional_tensor(N.V_PATCH_EMBD_BIAS, (c.n_embd,))
        self.pre_ln = w.tensor(N.V_PRE_LN, (c.n_embd,))
        self.layers = [self.load_layer(w, i) for i in range(tower.layers(c.n_layer))]

    def load_layer(self, w: WeightLoader, i: int) -> PixtralLayer:
        c = self.cfg
        d, ff = c.n_embd, c.n_ff
        # matrix [out, in] of each projection; every one may have a bias [out]
        shapes = {"attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_out": (d, d),
                  "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
        return PixtralLayer(
            ln1=w.tensor(v_blk(i, N.V_LN1), (d,)),
            ln2=w.tensor(v_blk(i, N.V_LN2), (d,)),
            **{name: w.matrix(v_blk(i, f"{name}.weight"), shape) for name, shape in shapes.items()},
            **{f"{name}_bias": w.optional_tensor(v_blk(i, f"{name}.bias"), shape[:1]) for name, shape in shapes.items()},
        )

    # -- forward -----------------------------------------------------------------------------
    def forward(self, pixels: np.ndarray, capture: dict | None = None) -> tuple[np.ndarray, tuple[int, int]]:
        """pixels float32 [3, H, W] (H, W multiples of the patch size) -> ([N, D], (h, w)).
        capture: optional dict that receives every intermediate stage."""
        (x,), (grid,) = self.forward_many([pixels], capture)
        return x, grid

    def forward_many(self, images: list[np.ndarray], capture: dict | None = None
                     ) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
        """Several images at once: their patches go through every matmul together (one weight
        read for all: the line pieces of a page are tens of patches each), attention stays within
        each image. -> (features [N_i, D] per image, (h_i, w_i) per image)."""
        c, p = self.cfg, self.cfg.patch_size
        patches, rows, cols, spans, grids = [], [], [], [], []
        for pixels in images:
            ch, hh, ww = pixels.shape
            if ch != 3 or hh % p or ww % p or hh == 0 or ww == 0:
                raise ValueError(f"pixels must be [3, H, W] with H, W positive multiples of {p}, got {list(pixels.shape)}")
            h, w = hh // p, ww // p
            x = pixels.reshape(3, h, p, w, p)  # [3, h, p, w, p]
            patches.append(x.transpose(1, 3, 0, 2, 4).reshape(h * w, 3 * p * p))  # [N_i, 3*p*p] (channel, dy, dx)
            r, cc = np.divmod(np.arange(h * w), w)  # [N_i] each: patch (row, col)
            rows.append(r)
            cols.append(cc)
            start = spans[-1][1] if spans else 0
            spans.append((start, start + h * w))
            grids.append((h, w))
        x = np.ascontiguousarray(np.concatenate(patches), dtype=np.float32)  # [N, 3*p*p]
        x = add_bias(self.patch_embd.matmul(x), self.patch_bias)  # [N, D]
        keep(capture, "vision_patch_embeds", x)
        x = rmsnorm(x, self.pre_ln, c.eps)  # [N, D]
        keep(capture, "vision_ln_pre", x)
        cos, sin = rope_angles_2d(np.concatenate(rows), np.concatenate(cols), c.head_dim, c.rope_base)  # [N, head_dim/2]
        hook = self.tower.on_layer
        for i, layer in enumerate(self.layers):
            check_cancelled()  # a stopped run does not wait for the rest of a page's vision
            t0 = time.perf_counter() if hook else 0.0
            x = self.block(layer, x, cos, sin, spans)  # [N, D]
            if hook:
                hook(i, time.perf_counter() - t0)
            keep(capture, f"vision_layer_{i}", x)
        return [x[a:b] for a, b in spans], grids

    def block(self, layer: PixtralLayer, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
              spans: list[tuple[int, int]]) -> np.ndarray:
        c = self.cfg
        n = x.shape[0]
        hn = rmsnorm(x, layer.ln1, c.eps)  # [N, D]
        q = add_bias(layer.attn_q.matmul(hn), layer.attn_q_bias).reshape(n, c.n_head, c.head_dim)  # [N, H, d]
        k = add_bias(layer.attn_k.matmul(hn), layer.attn_k_bias).reshape(n, c.n_head, c.head_dim)  # [N, H, d]
        v = add_bias(layer.attn_v.matmul(hn), layer.attn_v_bias).reshape(n, c.n_head, c.head_dim)  # [N, H, d]
        q = apply_rope(q, cos, sin, neox=False).transpose(1, 0, 2)  # [H, N, d] adjacent pairs (permuted GGUF rows)
        k = apply_rope(k, cos, sin, neox=False).transpose(1, 0, 2)  # [H, N, d]
        v = v.transpose(1, 0, 2)  # [H, N, d]
        a = np.empty_like(q)
        for s, e in spans:  # each image attends to its own patches only
            a[:, s:e] = self.attention(q[:, s:e], k[:, s:e], v[:, s:e])  # [H, N_i, d]
        a = a.transpose(1, 0, 2).reshape(n, c.n_embd)  # [N, D]
        x = x + add_bias(layer.attn_out.matmul(a), layer.attn_out_bias)  # [N, D]
        check_cancelled()  # a full page's layer is seconds in numpy: look again halfway
        hn = rmsnorm(x, layer.ln2, c.eps)  # [N, D]
        g = add_bias(layer.ffn_gate.matmul(hn), layer.ffn_gate_bias)  # [N, ff]
        u = add_bias(layer.ffn_up.matmul(hn), layer.ffn_up_bias)  # [N, ff]
        return x + add_bias(layer.ffn_down.matmul(swiglu(g, u)), layer.ffn_down_bias)  # [N, D]

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Non-causal attention of one image's patches: q, k, v [H, N, d] -> [H, N, d]."""
        pos = np.arange(q.shape[1])
        return self.tower.attend(q, k, v, pos, pos, scale=self.cfg.head_dim ** -0.5, causal=False,
                                 q_block=self.q_block, kv_block=self.kv_block)


def keep(capture: dict | None, name: str, x: np.ndarray) -> None:
    """Record an intermediate stage in `capture` (a dict the caller passes to see inside the
    tower: tests compare every stage with the reference)."""
    if capture is not None:
        capture[name] = x
