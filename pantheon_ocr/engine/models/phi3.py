"""Phi-3: the shared decoder with fused projections.

`attn_qkv` holds Q, K, V rows in that order and `ffn_up` holds gate rows then up rows (HF
`qkv_proj` / `gate_up_proj` unchanged). RoPE is NeoX over `rope.dimension_count` dims, which
may be fewer than the head dim (partial rotary); the config already says so.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..weights import WeightLoader
from ..ops import add_bias, swiglu
from .llama import Decoder


class Phi3Decoder(Decoder):
    def _load_layer(self, w: WeightLoader, i: int) -> SimpleNamespace:
        c, p = self.cfg, f"blk.{i}."
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        return SimpleNamespace(
            attn_norm=w.tensor(p + "attn_norm.weight", (c.n_embd,)),
            wqkv=w.matrix(p + "attn_qkv.weight", (qd + 2 * kvd, c.n_embd)),
            bqkv=w.optional_tensor(p + "attn_qkv.bias", (qd + 2 * kvd,)),
            wo=w.matrix(p + "attn_output.weight", (c.n_embd, qd)),
            bo=w.optional_tensor(p + "attn_output.bias", (c.n_embd,)),
            ffn_norm=w.tensor(p + "ffn_norm.weight", (c.n_embd,)),
            gate_up=w.matrix(p + "ffn_up.weight", (2 * c.n_ff, c.n_embd)),
            down=w.matrix(p + "ffn_down.weight", (c.n_embd, c.n_ff)),
        )

    def _qkv(self, layer, h):
        c = self.cfg
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        qkv = add_bias(layer.wqkv.matmul(h), layer.bqkv)  # [T, qd + 2*kvd]
        return qkv[:, :qd], qkv[:, qd : qd + kvd], qkv[:, qd + kvd :]

    def _ffn(self, layer, h):
        gu = layer.gate_up.matmul(h)  # [T, 2*n_ff]
        return layer.down.matmul(swiglu(gu[:, : self.cfg.n_ff], gu[:, self.cfg.n_ff :]))
