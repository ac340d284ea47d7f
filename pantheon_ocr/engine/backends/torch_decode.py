"""The decode step of a decoder whose weights torch multiplies (bf16, int8), the whole layer chain in torch.

The same block as models/llama.py (`Decoder.block`) for one new token per sequence: norms, q/k/v,
q/k norms, RoPE, attention over the sequence's cached keys, output projection and SwiGLU, with the
activations torch float32 tensors from the embedding to the last layer. The numpy loop converted
every projection's input and output between numpy and torch and ran attention as ~50 blocked
numpy products per (layer, sequence); this step measured 2x its speed at B = 1 and 3x at B = 16
for a LightOnOCR-1B decoder at 3,322 cached positions (docs/benchmarks.md). The numpy float32
path stays the reference.

Exact whatever the batch (tests/engine/test_torch_decode.py): projections are exact-rows
(`Weight.linear`, format/torch_weights.py: one call for any M, or blocks of 16 rows), norms, RoPE and
SwiGLU act on each row alone, and attention runs per sequence over exactly its own positions of
its pool slot (no padding, no neighbour), so a row's bits depend on its own sequence only.

K/V stay in the engine's numpy pool (cache.KVPool, written through `KVCache.write` as on the numpy
path); attention reads them as torch views of the slot: float32 as is, bfloat16 (stored as its
bits) as bfloat16 products with float32 accumulation, float16 widened to float32, int8 widened to
bfloat16 (exact: |q| <= 127) with its channel scales on the query and its position scales on the
scores and weights (as attention.padded_decode_attention does).
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter as _now

import numpy as np

from ..cache import KVPool, Rows
from ..format.weights import Weight
from ..memory import TRIM_EVERY, release_free_memory
from ..ops import apply_rope, rope_angles
from .common import require_torch

torch = require_torch()
F = torch.nn.functional


@dataclass(frozen=True)
class _Layer:
    """One block's tensors: the decoder's own Weights (multiplied by `Weight.linear`) and its
    vectors as torch float32 copies; names as in LlamaLayer."""

    attn_norm: torch.Tensor
    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    attn_q_bias: torch.Tensor | None
    attn_k_bias: torch.Tensor | None
    attn_v_bias: torch.Tensor | None
    attn_output_bias: torch.Tensor | None
    attn_q_norm: torch.Tensor | None
    attn_k_norm: torch.Tensor | None
    ffn_norm: torch.Tensor
    ffn_gate: Weight
    ffn_up: Weight
    ffn_down: Weight


def _vec(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.array(a, dtype=np.float32))  # a copy: the map is read-only


class TorchDecode:
    """The decode step of a dense, full-attention decoder with bf16 or int8 weights (Decoder.torch_decode)."""

    def __init__(self, decoder):
        self.cfg, self.freqs, self.tower = decoder.cfg, decoder.freqs, decoder.tower
        self.layers = [_Layer(**{name: (getattr(layer, name) if name in _MATRICES else _vec(getattr(layer, name)))
                                 for name in _Layer.__dataclass_fields__}) for layer in decoder.layers]
        self.steps = 0

    def run(self, rows: Rows, x: np.ndarray) -> np.ndarray:
        """x [B, n_embd] float32, one row per sequence (rows.decode) through every layer; stores each
        layer's k/v in the sequences' caches. Returns the last layer's output [B, n_embd]."""
        cos, sin = (torch.from_numpy(a) for a in rope_angles(rows.positions / self.cfg.rope_linear_scale, self.freqs))
        hook = self.tower.on_layer
        with torch.inference_mode():
            h = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # [B, n_embd]
            for i, layer in enumerate(self.layers):
                t0 = _now() if hook else 0.0
                h = h + self.attention(i, layer, self.norm(h, layer.attn_norm), cos, sin, rows)
                h = h + self.ffn(layer, self.norm(h, layer.ffn_norm))
                if hook:
                    hook(i, _now() - t0)
        self.steps += 1
        if self.steps % TRIM_EVERY == 0:
            release_free_memory()  # the step's freed tensors, back to the system (memory.py)
        return h.numpy()

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """ops.rmsnorm in torch: x / sqrt(mean(x^2) + eps) * weight over the last axis."""
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.cfg.eps) * weight

    def linear(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] float32 @ w.T as Weight.matmul computes it, each row's bits independent of M."""
        y = w.linear(x, exact_rows=True)
        return y if bias is None else y + bias

    def attention(self, i: int, layer: _Layer, h: torch.Tensor, cos, sin, rows: Rows) -> torch.Tensor:
        c, b = self.cfg, h.shape[0]
        q = self.linear(h, layer.attn_q, layer.attn_q_bias).view(b, c.n_head, c.head_dim)  # [B, Hq, D]
        k = self.linear(h, layer.attn_k, layer.attn_k_bias).view(b, c.n_head_kv, c.head_dim)  # [B, Hkv, D]
        v = self.linear(h, layer.attn_v, layer.attn_v_bias).view(b, c.n_head_kv, c.head_dim)  # [B, Hkv, D]
        if c.qk_norm:
            q = self.norm(q, layer.attn_q_norm)
            k = self.norm(k, layer.attn_k_norm)
        q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
        kn, vn = k.numpy(), v.contiguous().numpy()
        out = torch.empty(b, c.n_head, c.head_dim)  # [B, Hq, D]
        for r, s in enumerate(rows.states):  # the cache write of the numpy path, then its attention alone
            s.cache.write(i, s.pos, kn[r, :, None], vn[r, :, None])
            out[r] = sequence_attention(s.cache.pool, i, s.cache.held_slot(), s.pos + 1, q[r],
                                        scale=c.head_dim ** -0.5)
        return self.linear(out.view(b, c.n_head * c.head_dim), layer.attn_output, layer.attn_output_bias)

    def ffn(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        return self.linear(F.silu(self.linear(h, layer.ffn_gate)) * self.linear(h, layer.ffn_up), layer.ffn_down)


_MATRICES = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})


def sequence_attention(pool: KVPool, layer: int, slot: int, n: int, q: torch.Tensor, *, scale: float) -> torch.Tensor:
    """One sequence's decode attention: its query q [Hq, D] over the first n positions of its pool
    slot -> [Hq, D] float32. Scores are K [Hkv, n, D] @ q^T [Hkv, D, g] (the keys as the product's
    long left operand: 2x faster than q @ K^T here), softmax in float32."""
    hq, d = q.shape
    hkv = pool.n_kv
    g = hq // hkv
    k = torch.from_numpy(pool.k[layer][slot, :, :n])  # [Hkv, n, D] view of the slot
    v = torch.from_numpy(pool.v[layer][slot, :, :n])
    qg = q.reshape(hkv, g, d) * scale  # [Hkv, g, D]
    if pool.kind == "bfloat16":
        k, v = k.view(torch.bfloat16), v.view(torch.bfloat16)
    elif pool.kind == "float16":
        k, v = k.float(), v.float()
    elif pool.kind == "int8":  # K = Kq * ks[p] * kc[c]: kc onto the query, ks onto the scores
        qg = qg * torch.from_numpy(pool.kc[layer][slot]).reshape(hkv, 1, d)
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    s = torch.matmul(k, qg.to(k.dtype).transpose(1, 2)).float()  # [Hkv, n, g]
    if pool.kind == "int8":
        s = s * torch.from_numpy(pool.ks[layer][slot, :, :n])  # [Hkv, n, 1]
    p = torch.softmax(s, dim=1)  # over the n keys
    if pool.kind == "int8":  # p . (V vs) = (p vs) . V
        p = p * torch.from_numpy(pool.vs[layer][slot, :, :n])
    out = torch.matmul(p.transpose(1, 2).to(v.dtype), v)  # [Hkv, g, D]
    return out.float().reshape(hq, d)
