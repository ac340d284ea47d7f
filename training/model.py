"""The reader in torch: LightOnOCR's architecture at a small size, written to match what the engine
runs from the exported GGUF pair (Hugging Face semantics: Pixtral vision, Mistral3-style projector,
Qwen3 decoder), plus a CTC head on the projector output that exists only in training. The vision
tower and the projector are the engine's own torch modules (pantheon_ocr/engine/backends/
torch_pixtral.py, which the torch vision backend runs too); the decoder is written here.

Batches hold lines of one height and different widths: images are right-padded, padded patches
are masked out of vision attention and their merged tokens never reach the decoder, so a line's
outputs do not depend on what it was batched with (the engine runs each line alone).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pantheon_ocr.engine.backends.torch_pixtral import PixtralVision, Projector, RMSNorm, SwiGLU, rope


@dataclass(frozen=True)
class ReaderConfig:
    # vision (Pixtral)
    v_dim: int = 256
    v_layers: int = 4
    v_heads: int = 4
    v_ff: int = 768
    patch: int = 14
    v_eps: float = 1e-5
    v_rope_theta: float = 10000.0
    merge: int = 2
    # text (Qwen3)
    dim: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ff: int = 768
    eps: float = 1e-6
    rope_theta: float = 10000.0
    vocab: int = 2048
    n_ctx: int = 512
    # reader
    line_height: int = 28
    max_width: int = 1400
    ctc_classes: int = 338  # charset (training/charset.py) + blank
    ctc_frames: int = 4  # CTC frames per merged image token

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------- vision
class Vision(PixtralVision):
    """The engine's torch Pixtral tower (pantheon_ocr/engine/backends/torch_pixtral.py) on batches of
    right-padded lines: padded patches are masked out of attention and zeroed in the output."""

    def __init__(self, c: ReaderConfig):
        super().__init__(c.v_dim, c.v_layers, c.v_heads, c.v_ff, c.patch, c.v_eps, c.v_rope_theta)
        self.c = c

    def forward(self, pixels: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, H, Wmax], widths [B] in patches -> features [B, h*w, D] (padding zeroed)."""
        h, w = self.grid(pixels)
        x = self.embed(pixels)  # [B, h*w, D]
        cos, sin = self.rope(h, w, x.device)
        valid = (torch.arange(h * w) % w).to(x.device)[None, :] < widths[:, None]  # [B, N] real patches
        mask = torch.where(valid[:, None, None, :], 0.0, float("-inf")).to(x.dtype)  # [B, 1, 1, N]
        return self.encode(x, cos, sin, mask) * valid[..., None]


# --------------------------------------------------------------------------------------- text
class DecoderBlock(nn.Module):
    def __init__(self, c: ReaderConfig):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.dim, c.eps)
        self.q_proj = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.eps)
        self.k_norm = RMSNorm(c.head_dim, c.eps)
        self.post_attention_layernorm = RMSNorm(c.dim, c.eps)
        self.mlp = SwiGLU(c.dim, c.ff)

    def forward(self, x, cos, sin, mask):
        c = self.c
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(b, t, c.heads, c.head_dim)).transpose(1, 2)  # [B, Hq, T, hd]
        k = self.k_norm(self.k_proj(h).view(b, t, c.kv_heads, c.head_dim)).transpose(1, 2)  # [B, Hkv, T, hd]
        v = self.v_proj(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)  # [B, Hkv, T, hd]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = c.heads // c.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, Hq, T, hd]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, Hq, T, hd]
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c: ReaderConfig):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(DecoderBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps)

    def forward(self, embeds: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """embeds [B, T, dim] (right-padded to T), lengths [B] -> logits [B, T, vocab] (tied head)."""
        c = self.c
        b, t, _ = embeds.shape
        pos = torch.arange(t, device=embeds.device)
        freqs = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=embeds.device) / c.head_dim)
        ang = pos[:, None].float() * freqs[None]
        ang = torch.cat([ang, ang], dim=-1)  # [T, hd] NeoX (split-half) pairs
        cos, sin = ang.cos().to(embeds.dtype), ang.sin().to(embeds.dtype)
        causal = torch.ones(t, t, dtype=torch.bool, device=embeds.device).tril()
        keep = causal[None] & (pos[None, None, :] < lengths[:, None, None])  # [B, T, T]
        mask = torch.where(keep[:, None], 0.0, float("-inf")).to(embeds.dtype)
        x = embeds
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.T


class Reader(nn.Module):
    def __init__(self, c: ReaderConfig):
        super().__init__()
        self.c = c
        self.vision = Vision(c)
        self.projector = Projector(c.v_dim, c.dim, c.merge, c.eps)  # RMSNorm with the text eps
        self.decoder = Decoder(c)
        self.ctc_head = nn.Linear(c.dim, c.ctc_frames * c.ctc_classes)  # training only
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def image_tokens(self, pixels: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, H, W], widths [B] (patches) -> merged tokens [B, h//2, w//2, dim]."""
        return self.projector(self.vision(pixels, widths), *self.vision.grid(pixels))

    def ctc_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Merged tokens [B, hm, wm, dim] -> CTC log-probs [B, wm * frames, classes]: rows pooled."""
        c = self.c
        b, hm, wm, _ = tokens.shape
        x = self.ctc_head(tokens.mean(dim=1))  # [B, wm, frames * classes]
        return x.view(b, wm * c.ctc_frames, c.ctc_classes).float().log_softmax(-1)
