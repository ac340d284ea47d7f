"""The shared decoder: llama, mistral, mixtral (all `llama` in GGUF), qwen2, qwen3.

Differences are capability flags from the config (biases, q/k norm, sliding window, experts,
tied embeddings, rope style), never architecture names. Phi-3 subclasses this in phi3.py and
overrides only how projections are stored (`_load_layer`, `_qkv`, `_ffn`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ...errors import ModelError
from ..attention import KVCache, cached_attention
from ..config import DecoderConfig
from ..gguf import GGUFFile
from ..ops import add_bias, apply_rope, rmsnorm, rope_angles, rope_freqs, softmax, swiglu
from ..weights import Storage, Weight, WeightLoader


@dataclass
class DecoderState:
    """One sequence: its KV cache and the number of positions already processed."""

    cache: KVCache
    pos: int = 0
    tokens: list[int] = field(default_factory=list)


class Decoder:
    def __init__(self, gf: GGUFFile, cfg: DecoderConfig, storage: Storage):
        self.cfg, self.storage, self.path = cfg, storage, gf.path
        w = WeightLoader(gf, storage)
        c = cfg
        self.token_embd = w.matrix("token_embd.weight", (c.n_vocab, c.n_embd))
        self.output = self.token_embd if c.tied_embeddings else w.matrix("output.weight", (c.n_vocab, c.n_embd))
        self.output_norm = w.tensor("output_norm.weight", (c.n_embd,))
        factors = w.optional_tensor("rope_freqs.weight", (c.n_rot // 2,))
        self.freqs = rope_freqs(c.n_rot, c.rope_base, factors)
        self.layers = [self._load_layer(w, i) for i in range(c.n_layer)]
        self.flash = True  # blocked prefill attention; False = naive (benchmark comparison)

    # -- loading -----------------------------------------------------------------------------
    def _load_layer(self, w: WeightLoader, i: int) -> SimpleNamespace:
        c, p = self.cfg, f"blk.{i}."
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        layer = SimpleNamespace(
            attn_norm=w.tensor(p + "attn_norm.weight", (c.n_embd,)),
            wq=w.matrix(p + "attn_q.weight", (qd, c.n_embd)),
            wk=w.matrix(p + "attn_k.weight", (kvd, c.n_embd)),
            wv=w.matrix(p + "attn_v.weight", (kvd, c.n_embd)),
            wo=w.matrix(p + "attn_output.weight", (c.n_embd, qd)),
            bq=w.optional_tensor(p + "attn_q.bias", (qd,)),
            bk=w.optional_tensor(p + "attn_k.bias", (kvd,)),
            bv=w.optional_tensor(p + "attn_v.bias", (kvd,)),
            bo=w.optional_tensor(p + "attn_output.bias", (c.n_embd,)),
            q_norm=w.tensor(p + "attn_q_norm.weight", (c.head_dim,)) if c.qk_norm else None,
            k_norm=w.tensor(p + "attn_k_norm.weight", (c.head_dim,)) if c.qk_norm else None,
            ffn_norm=w.tensor(p + "ffn_norm.weight", (c.n_embd,)),
        )
        if c.n_expert:
            layer.router = w.tensor(p + "ffn_gate_inp.weight", (c.n_expert, c.n_embd))
            layer.experts = self._load_experts(w, p)
        else:
            layer.gate = w.matrix(p + "ffn_gate.weight", (c.n_ff, c.n_embd))
            layer.up = w.matrix(p + "ffn_up.weight", (c.n_ff, c.n_embd))
            layer.down = w.matrix(p + "ffn_down.weight", (c.n_embd, c.n_ff))
        return layer

    def _load_experts(self, w: WeightLoader, p: str) -> list[tuple[Weight, Weight, Weight]]:
        c = self.cfg
        e, ff, d = c.n_expert, c.n_ff, c.n_embd
        if w.has(p + "ffn_gate_exps.weight"):
            gates = w.experts(p + "ffn_gate_exps.weight", (e, ff, d))
            ups = w.experts(p + "ffn_up_exps.weight", (e, ff, d))
            downs = w.experts(p + "ffn_down_exps.weight", (e, d, ff))
            return list(zip(gates, ups, downs))
        if not w.has(p + "ffn_gate.0.weight"):
            raise ModelError(self.path, f"missing tensor {p + 'ffn_gate_exps.weight'!r} (or split {p + 'ffn_gate.0.weight'!r})")
        return [
            (w.matrix(f"{p}ffn_gate.{j}.weight", (ff, d)), w.matrix(f"{p}ffn_up.{j}.weight", (ff, d)),
             w.matrix(f"{p}ffn_down.{j}.weight", (d, ff)))
            for j in range(e)
        ]

    # -- state -------------------------------------------------------------------------------
    def new_state(self, max_seq: int | None = None) -> DecoderState:
        c = self.cfg
        ring = bool(c.sliding_window)
        slots = c.max_seq if ring else min(max_seq or c.n_ctx, c.n_ctx)
        return DecoderState(KVCache(c.n_layer, c.n_head_kv, c.head_dim, slots, ring))

    # -- forward -----------------------------------------------------------------------------
    def embed(self, tokens, embd_rows=None) -> np.ndarray:
        """Token embeddings [T, n_embd]; embd_rows = (row indices, rows [k, n_embd]) overrides
        those rows (image features), so the table itself is never copied."""
        x = np.array(self.token_embd.rows(tokens), dtype=np.float32)
        if embd_rows is not None:
            idx, rows = embd_rows
            x[np.asarray(idx)] = rows
        return x

    def forward(self, state: DecoderState, tokens, embd_rows=None, all_logits: bool = False) -> np.ndarray:
        """Advance one sequence by len(tokens); logits [T, n_vocab] or, by default, [1, n_vocab]."""
        tokens = list(tokens)
        x = self.embed(tokens, embd_rows)  # [T, n_embd]
        x = self.hidden(state, x)
        state.tokens.extend(tokens)
        return self.logits_of(x if all_logits else x[-1:])

    def hidden(self, state: DecoderState, x: np.ndarray) -> np.ndarray:
        """Run every layer over x [T, n_embd] at positions state.pos.. and advance state.pos."""
        c, pos0 = self.cfg, state.pos

        def attend(i: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            a = cached_attention(
                state.cache, i, pos0, q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                scale=c.head_dim ** -0.5, window=c.sliding_window, flash=self.flash,
            )  # [Hq, T, D]
            return a.transpose(1, 0, 2)  # [T, Hq, D]

        x = self.run_layers(x, np.arange(pos0, pos0 + x.shape[0]), attend)
        state.pos += x.shape[0]
        return x

    def run_layers(self, x: np.ndarray, positions: np.ndarray, attend) -> np.ndarray:
        """x [T, n_embd] through every layer; row t sits at positions[t]. `attend(i, q, k, v)`
        (q [T, Hq, D], k/v [T, Hkv, D], roped) owns the KV caches and returns [T, Hq, D]."""
        cos, sin = rope_angles(positions / self.cfg.rope_linear_scale, self.freqs)  # [T, n_rot/2]
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, attend)
        return x

    def logits_of(self, x: np.ndarray) -> np.ndarray:
        return self.output.matmul(rmsnorm(x, self.output_norm, self.cfg.eps))

    def _layer(self, i, layer, x, cos, sin, attend) -> np.ndarray:
        c = self.cfg
        t = x.shape[0]
        h = rmsnorm(x, layer.attn_norm, c.eps)
        q, k, v = self._qkv(layer, h)
        q = q.reshape(t, c.n_head, c.head_dim)  # [T, Hq, D]
        k = k.reshape(t, c.n_head_kv, c.head_dim)  # [T, Hkv, D]
        v = v.reshape(t, c.n_head_kv, c.head_dim)  # [T, Hkv, D]
        if c.qk_norm:
            q = rmsnorm(q, layer.q_norm, c.eps)
            k = rmsnorm(k, layer.k_norm, c.eps)
        q = apply_rope(q, cos, sin, c.rope_neox)
        k = apply_rope(k, cos, sin, c.rope_neox)
        a = attend(i, q, k, v).reshape(t, c.n_head * c.head_dim)  # [T, Hq*D]
        x = x + add_bias(layer.wo.matmul(a), layer.bo)
        h = rmsnorm(x, layer.ffn_norm, c.eps)
        return x + self._ffn(layer, h)

    def _qkv(self, layer, h):
        return (add_bias(layer.wq.matmul(h), layer.bq), add_bias(layer.wk.matmul(h), layer.bk),
                add_bias(layer.wv.matmul(h), layer.bv))

    def _ffn(self, layer, h: np.ndarray) -> np.ndarray:
        if not self.cfg.n_expert:
            return layer.down.matmul(swiglu(layer.gate.matmul(h), layer.up.matmul(h)))
        return self._moe(layer, h)

    def _moe(self, layer, h: np.ndarray) -> np.ndarray:
        """Router softmax -> top-k -> renormalise -> weighted sum of the chosen SwiGLU experts."""
        k = self.cfg.n_expert_used
        probs = softmax(h @ layer.router.T)  # [T, E]
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [T, k]
        weights = np.take_along_axis(probs, top, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)
        for e, (gate, up, down) in enumerate(layer.experts):
            rows, slot = np.nonzero(top == e)
            if rows.size:
                he = h[rows]
                out[rows] += weights[rows, slot, None] * down.matmul(swiglu(gate.matmul(he), up.matmul(he)))
        return out

