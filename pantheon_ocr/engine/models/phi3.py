"""Phi-3: the shared decoder with fused projections.

`attn_qkv` holds Q, K, V rows in that order and `ffn_up` holds gate rows then up rows (HF
`qkv_proj` / `gate_up_proj` unchanged). RoPE is NeoX over `rope.dimension_count` dims, which
may be fewer than the head dim (partial rotary); the config already says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import add_bias, swiglu
from ..format import names as N
from ..format.names import blk
from ..format.weights import Weight, WeightLoader
from .llama import Decoder


@dataclass(frozen=True)
class Phi3Layer:
    """One block's tensors, named as in the GGUF file; qd = n_head * head_dim, kvd = n_head_kv * head_dim."""

    attn_norm: np.ndarray  # [n_embd]
    attn_qkv: Weight  # [qd + 2 * kvd, n_embd]: Q rows, then K, then V
    attn_qkv_bias: np.ndarray | None  # [qd + 2 * kvd]
    attn_output: Weight  # [n_embd, qd]
    attn_output_bias: np.ndarray | None  # [n_embd]
    ffn_norm: np.ndarray  # [n_embd]
    ffn_up: Weight  # [2 * n_ff, n_embd]: gate rows, then up rows
    ffn_down: Weight  # [n_embd, n_ff]


class Phi3Decoder(Decoder):
    TORCH_BLOCKS = False  # fused projections: its decode steps take the numpy loop

    def load_layer(self, w: WeightLoader, i: int) -> Phi3Layer:
        c = self.cfg
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        return Phi3Layer(
            attn_norm=w.tensor(blk(i, N.ATTN_NORM), (c.n_embd,)),
            attn_qkv=w.matrix(blk(i, N.ATTN_QKV), (qd + 2 * kvd, c.n_embd)),
            attn_qkv_bias=w.optional_tensor(blk(i, N.ATTN_QKV_BIAS), (qd + 2 * kvd,)),
            attn_output=w.matrix(blk(i, N.ATTN_OUTPUT), (c.n_embd, qd)),
            attn_output_bias=w.optional_tensor(blk(i, N.ATTN_OUTPUT_BIAS), (c.n_embd,)),
            ffn_norm=w.tensor(blk(i, N.FFN_NORM), (c.n_embd,)),
            ffn_up=w.matrix(blk(i, N.FFN_UP), (2 * c.n_ff, c.n_embd)),
            ffn_down=w.matrix(blk(i, N.FFN_DOWN), (c.n_embd, c.n_ff)),
        )

    def qkv(self, layer: Phi3Layer, h: np.ndarray, exact: bool = False):
        c = self.cfg
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        qkv = add_bias(layer.attn_qkv.matmul(h, exact), layer.attn_qkv_bias)  # [N, qd + 2*kvd]
        return qkv[:, :qd], qkv[:, qd : qd + kvd], qkv[:, qd + kvd :]

    def ffn(self, layer: Phi3Layer, h: np.ndarray, exact: bool = False) -> np.ndarray:
        gu = layer.ffn_up.matmul(h, exact)  # [N, 2*n_ff]
        return layer.ffn_down.matmul(swiglu(gu[:, : self.cfg.n_ff], gu[:, self.cfg.n_ff :]), exact)
