"""The Pixtral vision encoder and the LightOnOCR projector as torch modules: the one torch
definition, used by the torch vision backend (torch_vision.py, weights from the GGUF) and by
training (training/model.py, nn.Parameters that are learnt and exported to the GGUF).

Hugging Face semantics and parameter names (transformers' Pixtral / Mistral3 projector), the same
maths as models/pixtral.py + models/lightonocr.py:

    pixels [B, 3, H, W] -> patch_conv -> ln_pre -> n x PixtralBlock -> [B, h*w, D]
    Projector: norm (text eps) -> s x s patch merge -> merging_layer -> linear_1 -> GELU -> linear_2

- Q/K rows are in Hugging Face's order (split-half RoPE pairs i, i + d/2): the backend un-permutes
  the GGUF's rows (format/writer.unpermute_qk), the export permutes them back.
- Norms are RMSNorm with float32 statistics whatever the compute or autocast dtype; the output
  has the input's dtype.
- Attention is torch's scaled_dot_product_attention, not causal, with an optional additive mask
  [B, 1, 1, N] on the keys (padded patches: right-padded training batches, padded bucket grids);
  `use_attention` swaps in another kernel of the same signature (in bfloat16 on a CPU without AMX
  tiles, where SDPA's fused kernel runs no faster than in float32: torch_vision.cpu_bf16_attention's
  choice, the compiled bf16_attention.FullAttention or query_block_attention below).
- `use_rows` swaps the norms, the rotary embedding and the SwiGLU for compiled bfloat16 row operations
  (backends/rows.py: float32 arithmetic rounded once, one pass each) in bfloat16 on a CPU, where torch's
  took 0.18 s of a full page's 2.2 s layer; training never sets them.
- `use_int8` swaps every block's q/k/v, output and feed-forward products for int8 products
  (backends/int8_products.py: rows and weights quantized per call, smoothed): `--vision-dtype int8`,
  a choice that trades a few percent of the features' precision for ~15% of a page's time on a CPU
  without AMX tiles; training never sets it.
- The patch convolution is one product over the unfolded patches (same sums; torch's bfloat16 CPU
  convolution was 6x slower than the product).
- Shapes are taken from the module's config and from the h x w grid the caller passes (Python
  ints), never read off a tensor: a torch.jit trace of a fixed grid keeps them as constants.
- Biases are absent (the released models have none) unless the weights loaded have them.

Importing this module imports torch: only torch users import it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cancel import check as check_cancelled


class RMSNorm(nn.Module):
    rows = None  # the compiled row operations (PixtralVision.use_rows: bfloat16 on a CPU), else torch's

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            return self.rows.rms_norm_bf16(x, self.weight, self.eps)
        # float32 statistics whatever the autocast type (a bf16 variance loses the small values)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half (NeoX) rotary embedding; cos, sin [..., d] with the angles duplicated."""
    return x * cos + rotate_half(x) * sin


QUERY_BLOCK = 256  # queries per score block: [256, 9,350] bf16 scores stay in L2 + L3 (512 measured the same, 768 1.3x slower)


def query_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          attn_mask: torch.Tensor | None = None, softmax=None) -> torch.Tensor:
    """scaled_dot_product_attention (not causal) as three plain ops per block of QUERY_BLOCK queries
    of one head: scores = q k^T in the compute dtype, softmax (float32 inside), scores @ v. q, k, v
    [B, H, N, d], attn_mask additive [B, 1, 1, N] or None -> [B, H, N, d] in q's dtype.

    Why: on a CPU with bfloat16 units the two products run as bfloat16 GEMMs (~0.6-0.9 TFLOP/s on
    2 cores), where SDPA's fused kernel does not use them: a full page's layer (16 heads x 9,350
    patches) took 0.89 s against SDPA's 2.13 s in bfloat16 (2.07 s in float32) on an AVX-512 BF16
    EPYC. Where the CPU has AMX tiles, SDPA's kernel multiplies with them and is the faster one
    (0.49 against 0.95 s, common.cpu_has_amx). The cost is
    precision: the scores are rounded to bfloat16 before the softmax (SDPA keeps them in float32),
    about twice SDPA-bfloat16's error against float32 (docs/benchmarks.md). softmax: a function that
    overwrites a contiguous [rows, N] block of bfloat16 scores with their softmax (the compiled one,
    backends/bf16_attention.py), else torch's."""
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        bias = None if attn_mask is None else attn_mask[b, 0]  # [1, N]
        for head in range(q.shape[1]):
            qs, kt, vh = q[b, head] * scale, k[b, head].transpose(0, 1), v[b, head]  # [N, d], [d, N], [N, d]
            for s in range(0, q.shape[2], QUERY_BLOCK):
                scores = torch.matmul(qs[s:s + QUERY_BLOCK], kt)  # [q_block, N]
                if bias is not None:
                    scores = scores + bias
                p = softmax(scores) if softmax is not None and scores.dtype == torch.bfloat16 else torch.softmax(scores, -1)
                torch.matmul(p, vh, out=out[b, head, s:s + QUERY_BLOCK])
    return out


FFN_ROWS = 2048  # rows per pass of the feed-forward under use_rows (1,024-2,048 measured the same)


class SwiGLU(nn.Module):
    rows = None  # as RMSNorm's
    products = None  # the int8 products (PixtralVision.use_int8), else torch's

    def __init__(self, dim: int, ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ff, bias=False)
        self.up_proj = nn.Linear(dim, ff, bias=False)
        self.down_proj = nn.Linear(ff, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.products is not None and self.gate_proj.bias is None and self.up_proj.bias is None:
            # the int8 products: gate and up quantized once for all rows, silu(gate) * up made as their sums
            # are rescaled; the down product's weights quantized for each piece's own columns (~1 ms each)
            gate_up = self.products.prepare(x, [self.gate_proj.weight, self.up_proj.weight])
            down, bias = self.down_proj.weight, self.down_proj.bias
            return self._by_rows(x, lambda part: self.products(gate_up.apply(part, swiglu=True)[0], [down],
                                                               biases=[bias])[0])
        if self.rows is not None:
            return self._by_rows(x, lambda part: self.down_proj(self.rows.swiglu_bf16_(self.gate_proj(part),
                                                                                       self.up_proj(part))))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    @staticmethod
    def _by_rows(x: torch.Tensor, piece) -> torch.Tensor:
        """forward() FFN_ROWS rows at a time, piece(rows) -> their output, under use_rows (silu(gate) * up in
        one pass into the gate's rows) and use_int8. Why: the [rows, ff] products stay in the cache for the
        down product, where a full page's [9,350, 4,096] went out to memory and back: its FFN 0.56-0.58
        against 0.61-0.64 s a layer (2 threads, AVX-512 BF16 EPYC); a page's vision peaks ~270 MB lower
        (in int8, ~120 MB)."""
        rows = x.reshape(-1, x.shape[-1])  # [M, D]
        out = torch.empty_like(rows)  # down_proj maps back to D
        for s in range(0, rows.shape[0], FFN_ROWS):
            out[s:s + FFN_ROWS] = piece(rows[s:s + FFN_ROWS])
        return out.view(x.shape)


def pixtral_rope(rows: torch.Tensor, cols: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, head_dim] for patches at (rows, cols): HF Pixtral's 2-D rotary, even base
    frequencies to rows, odd to columns, duplicated for rotate_half."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [d/2]
    ang = torch.cat([rows[:, None].float() * freqs[None, ::2], cols[:, None].float() * freqs[None, 1::2]], dim=-1)
    ang = torch.cat([ang, ang], dim=-1)  # [N, d]
    return ang.cos(), ang.sin()


class PixtralBlock(nn.Module):
    """Pre-norm: x += o_proj(attention(attention_norm(x))); x += feed_forward(ffn_norm(x))."""

    attend = staticmethod(F.scaled_dot_product_attention)  # (q, k, v, attn_mask=) -> out; see use_attention
    rotate = staticmethod(rope)  # (x, cos, sin) -> x turned; see use_rows
    products = None  # the int8 products (see use_int8), else each projection's own

    def __init__(self, dim: int, heads: int, ff: int, eps: float):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.attention_norm = RMSNorm(dim, eps)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim, eps)
        self.feed_forward = SwiGLU(dim, ff)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, N, D], cos/sin [N, hd], mask: additive [B, 1, 1, N] or None -> [B, N, D]."""
        h = self.attention_norm(x)
        q, k, v = (t.unflatten(-1, (self.heads, self.hd)).transpose(1, 2)  # [B, H, N, hd] each
                   for t in self.project(h, self.q_proj, self.k_proj, self.v_proj))
        a = self.attend(self.rotate(q, cos, sin), self.rotate(k, cos, sin), v, attn_mask=mask)  # [B, H, N, hd]
        x = x + self.project(a.transpose(1, 2).flatten(2), self.o_proj)[0]
        check_cancelled()  # a full page's layer is seconds on a CPU: look again halfway
        return x + self.feed_forward(self.ffn_norm(x))

    def project(self, h: torch.Tensor, *projections: nn.Module) -> list[torch.Tensor]:
        """Each projection of h: its own product, or one call of the int8 products for all (use_int8)."""
        if self.products is None:
            return [proj(h) for proj in projections]
        return self.products(h, [p.weight for p in projections], biases=[p.bias for p in projections])


class PixtralVision(nn.Module):
    """The vision tower: `forward(pixels)` = `encode(embed(pixels), *rope(h, w))`. Callers that
    mask padded patches (training's right-padded batches, the backend's bucket grids) call the
    three around their own key mask."""

    def __init__(self, dim: int, layers: int, heads: int, ff: int, patch: int, eps: float, rope_theta: float):
        super().__init__()
        self.dim, self.heads, self.patch, self.rope_theta = dim, heads, patch, rope_theta
        self.patch_conv = nn.Conv2d(3, dim, patch, stride=patch, bias=False)
        self.ln_pre = RMSNorm(dim, eps)
        self.layers = nn.ModuleList(PixtralBlock(dim, heads, ff, eps) for _ in range(layers))

    def use_attention(self, attend) -> None:
        """Every block's attention kernel: a function of SDPA's (q, k, v, attn_mask=) form."""
        for layer in self.layers:
            layer.attend = attend

    def use_rows(self, rows) -> None:
        """ln_pre and every block's norms, rotary embedding and SwiGLU as one pass each of the compiled
        bfloat16 row operations `rows` (rows.Rows: float32 arithmetic rounded once, where torch rounds
        each of its 3 to 6 passes); the rotation is in place and reads its tables in float32
        (LightOnOCRVision then makes them float32, not the compute dtype)."""
        self.ln_pre.rows = rows
        for layer in self.layers:
            layer.attention_norm.rows = layer.ffn_norm.rows = layer.feed_forward.rows = rows
            layer.rotate = rows.rope_bf16_

    def use_int8(self, products) -> None:
        """Every block's q/k/v, output and feed-forward products as int8 products `products`
        (int8_products.Int8Products: bfloat16 rows and weights quantized per call, smoothed; the
        compute dtype must be bfloat16). The patch embedding and the projector keep theirs."""
        for layer in self.layers:
            layer.products = layer.feed_forward.products = products

    def grid(self, pixels: torch.Tensor) -> tuple[int, int]:
        """(h, w): the patch grid of pixels [B, 3, H, W]."""
        return int(pixels.shape[2]) // self.patch, int(pixels.shape[3]) // self.patch

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, h*p, w*p] -> normed patch embeddings [B, h*w, D], row-major patches."""
        patches = F.unfold(pixels, self.patch, stride=self.patch).transpose(1, 2)  # [B, N, 3 p p], weight order
        # patch_conv as one product over the patches: in bfloat16 on a CPU, torch's convolution took
        # 0.24-0.28 s of a full page against 0.04 s (2 threads, AVX-512 BF16 EPYC)
        return self.ln_pre(F.linear(patches, self.patch_conv.weight.flatten(1), self.patch_conv.bias))

    def rope(self, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h*w, head_dim] (float32) of an h x w patch grid."""
        n = torch.arange(h * w)
        cos, sin = pixtral_rope(torch.div(n, w, rounding_mode="floor"), n % w, self.dim // self.heads, self.rope_theta)
        return cos.to(device), sin.to(device)

    def encode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks: x [B, N, D], mask additive [B, 1, 1, N] on the keys or None -> [B, N, D]."""
        for layer in self.layers:
            check_cancelled()  # a stopped run does not wait for the rest of the page (no-op elsewhere)
            x = layer(x, cos, sin, mask)
        return x

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, H, W], every patch real -> features [B, h*w, D]."""
        h, w = self.grid(pixels)
        x = self.embed(pixels)
        return self.encode(x, *self.rope(h, w, x.device))


class Projector(nn.Module):
    """RMSNorm (text eps) -> s x s merge -> merging_layer -> linear_1 -> exact GELU -> linear_2."""

    def __init__(self, dim: int, text_dim: int, merge: int, eps: float):
        super().__init__()
        self.merge = merge
        self.norm = RMSNorm(dim, eps)
        self.merging_layer = nn.Linear(dim * merge ** 2, dim, bias=False)
        self.linear_1 = nn.Linear(dim, text_dim, bias=False)
        self.linear_2 = nn.Linear(text_dim, text_dim, bias=False)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Features [B, h*w, D] of an h x w grid -> image tokens [B, h//s, w//s, text_dim]. Each
        s x s block of patches (row-major over blocks) becomes one vector with index
        channel*s*s + dy*s + dx (torch unfold order); an incomplete last row or column is dropped."""
        s = self.merge
        hs, ws = h // s, w // s
        g = self.norm(x.unflatten(1, (h, w))).permute(0, 3, 1, 2)[:, :, : hs * s, : ws * s]  # [B, D, hs*s, ws*s]
        g = g.unflatten(2, (hs, s)).unflatten(4, (ws, s)).permute(0, 2, 4, 1, 3, 5)  # [B, hs, ws, D, dy, dx]
        return self.linear_2(F.gelu(self.linear_1(self.merging_layer(g.flatten(3)))))
