"""The shared decoder: llama, mistral, mixtral (all `llama` in GGUF), qwen2, qwen3.

Differences are capability flags from the config (biases, q/k norm, sliding window, experts,
tied embeddings, rope style), never architecture names. Phi-3 (phi3.py) stores its projections
fused and overrides only how a layer is loaded and projected (`load_layer`, `qkv`, `ffn`).

    forward(state, tokens)          one sequence, T new tokens -> logits
    run(rows, x, tokens)            the layer loop, shared with batch.forward_batch
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import numpy as np

from ...errors import ModelError
from ..cancel import check as check_cancelled
from ..attention import TowerOptions
from ..cache import DecoderState, KVCache, KVPool, Rows
from ..format.config import DecoderConfig
from ..format.gguf import GGUFFile
from ..ops import add_bias, apply_rope, rmsnorm, rope_angles, rope_freqs, softmax, swiglu
from ..format import names as N
from ..format.names import blk
from ...options import TORCH_STORAGES
from ..format.weights import Storage, Weight, WeightLoader
from ..memory import release_free_memory

__all__ = ["Decoder", "DecoderState", "LlamaLayer"]


@dataclass(frozen=True)
class LlamaLayer:
    """One block's tensors, named as in the GGUF file (`blk.N.<name>.weight`, `<name>_bias` for
    `blk.N.<name>.bias`). Shapes use the config's names; qd = n_head * head_dim,
    kvd = n_head_kv * head_dim. Optional tensors are None where the file has none."""

    attn_norm: np.ndarray  # [n_embd]
    attn_q: Weight  # [qd, n_embd]
    attn_k: Weight  # [kvd, n_embd]
    attn_v: Weight  # [kvd, n_embd]
    attn_output: Weight  # [n_embd, qd]
    attn_q_bias: np.ndarray | None  # [qd] (qwen2)
    attn_k_bias: np.ndarray | None  # [kvd]
    attn_v_bias: np.ndarray | None  # [kvd]
    attn_output_bias: np.ndarray | None  # [n_embd]
    attn_q_norm: np.ndarray | None  # [head_dim] (qwen3)
    attn_k_norm: np.ndarray | None  # [head_dim]
    ffn_norm: np.ndarray  # [n_embd]
    ffn_gate: Weight | None  # [n_ff, n_embd]; None in a mixture-of-experts layer
    ffn_up: Weight | None  # [n_ff, n_embd]
    ffn_down: Weight | None  # [n_embd, n_ff]
    ffn_gate_inp: np.ndarray | None  # [n_expert, n_embd] the router (mixtral)
    ffn_experts: tuple[tuple[Weight, Weight, Weight], ...] = ()  # per expert (gate, up, down), as the dense ones


class Decoder:
    """The weights and the forward pass; holds no sequence state (a page engine owns the KV pool).
    `tower` (benchmarks): the first N layers only, naive attention, flash tile sizes, a per-layer
    timing hook. With bf16 or int8 weights decode steps and prompts run the same block in torch
    (`torch_blocks`, backends/torch_blocks.py), where this loop's numpy round trips per
    projection cost more than the projections."""

    TORCH_BLOCKS = True  # the block is this class's own (a subclass that fuses projections says False)

    def __init__(self, gf: GGUFFile, cfg: DecoderConfig, storage: Storage, tower: TowerOptions = TowerOptions()):
        if storage in TORCH_STORAGES and tower.attention == "flash" and tower.causal_chunk is None:
            # the projections run in torch already: so does causal prefill attention (1.4x numpy's)
            from ..backends.torch_attention import causal_chunk_attention
            tower = replace(tower, causal_chunk=causal_chunk_attention)
        self.cfg, self.storage, self.path, self.tower = cfg, storage, gf.path, tower
        w = WeightLoader(gf, storage)
        c = cfg
        self.token_embd = w.matrix(N.TOKEN_EMBD, (c.n_vocab, c.n_embd))  # [n_vocab, n_embd]
        self.output = self.token_embd if c.tied_embeddings else w.matrix(N.OUTPUT, (c.n_vocab, c.n_embd))
        self.output_norm = w.tensor(N.OUTPUT_NORM, (c.n_embd,))  # [n_embd]
        factors = w.optional_tensor(N.ROPE_FREQS, (c.n_rot // 2,))
        self.freqs = rope_freqs(c.n_rot, c.rope_base, factors)  # [n_rot / 2]
        self.layers = [self.load_layer(w, i) for i in range(tower.layers(c.n_layer))]
        self.torch_blocks = None
        if storage in TORCH_STORAGES and self.TORCH_BLOCKS and not c.n_expert and not c.sliding_window:
            from ..backends.torch_blocks import TorchBlocks
            self.torch_blocks = TorchBlocks(self)
        # decoding or quantizing at load freed float32 copies of every matrix, and stacking q/k/v and
        # gate/up (TorchBlocks) the separate copies: 220 MB of the LightOnOCR-1B decoder's int8 load
        # stayed in the heap when the trim came before the stacking
        release_free_memory()

    # -- loading -----------------------------------------------------------------------------
    def load_layer(self, w: WeightLoader, i: int) -> LlamaLayer:
        c = self.cfg
        qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        dense = not c.n_expert
        return LlamaLayer(
            attn_norm=w.tensor(blk(i, N.ATTN_NORM), (c.n_embd,)),
            attn_q=w.matrix(blk(i, N.ATTN_Q), (qd, c.n_embd)),
            attn_k=w.matrix(blk(i, N.ATTN_K), (kvd, c.n_embd)),
            attn_v=w.matrix(blk(i, N.ATTN_V), (kvd, c.n_embd)),
            attn_output=w.matrix(blk(i, N.ATTN_OUTPUT), (c.n_embd, qd)),
            attn_q_bias=w.optional_tensor(blk(i, N.ATTN_Q_BIAS), (qd,)),
            attn_k_bias=w.optional_tensor(blk(i, N.ATTN_K_BIAS), (kvd,)),
            attn_v_bias=w.optional_tensor(blk(i, N.ATTN_V_BIAS), (kvd,)),
            attn_output_bias=w.optional_tensor(blk(i, N.ATTN_OUTPUT_BIAS), (c.n_embd,)),
            attn_q_norm=w.tensor(blk(i, N.ATTN_Q_NORM), (c.head_dim,)) if c.qk_norm else None,
            attn_k_norm=w.tensor(blk(i, N.ATTN_K_NORM), (c.head_dim,)) if c.qk_norm else None,
            ffn_norm=w.tensor(blk(i, N.FFN_NORM), (c.n_embd,)),
            ffn_gate=w.matrix(blk(i, N.FFN_GATE), (c.n_ff, c.n_embd)) if dense else None,
            ffn_up=w.matrix(blk(i, N.FFN_UP), (c.n_ff, c.n_embd)) if dense else None,
            ffn_down=w.matrix(blk(i, N.FFN_DOWN), (c.n_embd, c.n_ff)) if dense else None,
            ffn_gate_inp=None if dense else w.tensor(blk(i, N.FFN_GATE_INP), (c.n_expert, c.n_embd)),
            ffn_experts=() if dense else self._load_experts(w, i),
        )

    def _load_experts(self, w: WeightLoader, i: int) -> tuple[tuple[Weight, Weight, Weight], ...]:
        c = self.cfg
        e, ff, d = c.n_expert, c.n_ff, c.n_embd
        if w.has(blk(i, N.FFN_GATE_EXPS)):  # merged [E, out, in] tensors, as llama.cpp writes them now
            gates = w.experts(blk(i, N.FFN_GATE_EXPS), (e, ff, d))
            ups = w.experts(blk(i, N.FFN_UP_EXPS), (e, ff, d))
            downs = w.experts(blk(i, N.FFN_DOWN_EXPS), (e, d, ff))
            return tuple(zip(gates, ups, downs))
        split = blk(i, N.expert(N.FFN_GATE, 0))
        if not w.has(split):
            raise ModelError(self.path, f"missing tensor {blk(i, N.FFN_GATE_EXPS)!r} (or split {split!r})")
        return tuple(
            (w.matrix(blk(i, N.expert(N.FFN_GATE, j)), (ff, d)), w.matrix(blk(i, N.expert(N.FFN_UP, j)), (ff, d)),
             w.matrix(blk(i, N.expert(N.FFN_DOWN, j)), (d, ff)))
            for j in range(e)
        )

    def new_pool(self, kind: str = "float32") -> KVPool:
        """A KV pool for this decoder's sequences: K/V stored as `kind` (cache.KV_STORAGE: float32,
        float16 or bfloat16 for half the memory and bytes read per step, int8 for a quarter). Its
        owner decodes them together."""
        c = self.cfg
        return KVPool(len(self.layers), c.n_head_kv, c.head_dim, kind)

    def new_state(self, max_seq: int | None = None, pool: KVPool | None = None) -> DecoderState:
        """A new sequence whose KV cache is a slot of `pool` (a pool of its own if None), held
        until `state.release()`."""
        c = self.cfg
        ring = bool(c.sliding_window)
        slots = c.max_seq if ring else min(max_seq or c.n_ctx, c.n_ctx)
        return DecoderState(KVCache(len(self.layers), c.n_head_kv, c.head_dim, slots, ring, pool=pool))

    def mirror(self, layers: list, output=None) -> "Decoder":
        """The same decoder over other weights of the same shapes (the GPU switches' device
        copies): one forward pass, whichever weights it multiplies."""
        twin = copy.copy(self)
        # its own weights: the torch decode step holds this decoder's, so the twin runs the numpy loop
        twin.__dict__.update(layers=list(layers), output=self.output if output is None else output, torch_blocks=None)
        return twin

    # -- forward -----------------------------------------------------------------------------
    def forward(self, state: DecoderState, tokens, embd_rows=None, all_logits: bool = False) -> np.ndarray:
        """Advance one sequence by len(tokens); logits [T, n_vocab] or, by default, [1, n_vocab]."""
        x = self.hidden(state, tokens, embd_rows)  # [T, n_embd]
        # One token is a decode step: its logits go through the exact-rows path, as in a batch.
        return self.logits_of(x if all_logits else x[-1:], exact=x.shape[0] == 1)

    def hidden(self, state: DecoderState, tokens, embd_rows=None) -> np.ndarray:
        """Advance one sequence by len(tokens); the last layer's output [T, n_embd]."""
        tokens = list(tokens)
        return self.run(Rows([state], [len(tokens)]), self.embed(tokens, embd_rows), tokens)

    def embed(self, tokens, embd_rows=None) -> np.ndarray:
        """Token embeddings [T, n_embd]; embd_rows = (row indices, rows [k, n_embd]) overrides
        those rows (image features), so the table itself is never copied."""
        x = np.array(self.token_embd.rows(tokens), dtype=np.float32)
        if embd_rows is not None:
            idx, rows = embd_rows
            x[np.asarray(idx)] = rows
        return x

    def run(self, rows: Rows, x: np.ndarray, tokens) -> np.ndarray:
        """x [N, n_embd] through every layer at rows.positions, then the sequences move on."""
        if self.torch_blocks is not None and (rows.decode or self.torch_blocks.prefills):
            x = self.torch_blocks.run(rows, x)  # these layers' blocks in torch
            rows.advance(tokens)
            return x
        cos, sin = rope_angles(rows.positions / self.cfg.rope_linear_scale, self.freqs)  # [N, n_rot/2]
        hook = self.tower.on_layer
        for i, layer in enumerate(self.layers):
            check_cancelled()  # a stopped run does not wait for the rest of a long prompt
            t0 = time.perf_counter() if hook else 0.0
            x = self.block(i, layer, x, cos, sin, rows)
            if hook:
                hook(i, time.perf_counter() - t0)
        rows.advance(tokens)
        return x

    def logits_of(self, x: np.ndarray, exact: bool = False) -> np.ndarray:
        """Logits [N, n_vocab] of the last layer's rows x; exact: per-row exact matmul (decode)."""
        return self.output.matmul(rmsnorm(x, self.output_norm, self.cfg.eps), exact)  # [N, n_vocab]

    def block(self, i: int, layer, x: np.ndarray, cos, sin, rows: Rows) -> np.ndarray:
        """One pre-norm block: x + attention(norm(x)), then + ffn(norm(x)). A decode step's
        matmuls are exact-rows (weights.py): a row's result does not depend on its batch."""
        x = x + self.attention(i, layer, rmsnorm(x, layer.attn_norm, self.cfg.eps), cos, sin, rows)
        return x + self.ffn(layer, rmsnorm(x, layer.ffn_norm, self.cfg.eps), rows.decode)

    def attention(self, i: int, layer, h: np.ndarray, cos, sin, rows: Rows) -> np.ndarray:
        c, t = self.cfg, h.shape[0]
        q, k, v = self.qkv(layer, h, rows.decode)
        q = q.reshape(t, c.n_head, c.head_dim)  # [N, Hq, D]
        k = k.reshape(t, c.n_head_kv, c.head_dim)  # [N, Hkv, D]
        v = v.reshape(t, c.n_head_kv, c.head_dim)  # [N, Hkv, D]
        if c.qk_norm:
            q = rmsnorm(q, layer.attn_q_norm, c.eps)
            k = rmsnorm(k, layer.attn_k_norm, c.eps)
        q = apply_rope(q, cos, sin, c.rope_neox)
        k = apply_rope(k, cos, sin, c.rope_neox)
        a = rows.attend(i, q, k, v, scale=c.head_dim ** -0.5, window=c.sliding_window, tower=self.tower)  # [N, Hq, D]
        return add_bias(layer.attn_output.matmul(a.reshape(t, c.n_head * c.head_dim), rows.decode),
                        layer.attn_output_bias)

    def qkv(self, layer: LlamaLayer, h: np.ndarray, exact: bool = False):
        return (add_bias(layer.attn_q.matmul(h, exact), layer.attn_q_bias),
                add_bias(layer.attn_k.matmul(h, exact), layer.attn_k_bias),
                add_bias(layer.attn_v.matmul(h, exact), layer.attn_v_bias))

    def ffn(self, layer: LlamaLayer, h: np.ndarray, exact: bool = False) -> np.ndarray:
        if self.cfg.n_expert:
            return self._moe(layer, h)
        return layer.ffn_down.matmul(swiglu(layer.ffn_gate.matmul(h, exact), layer.ffn_up.matmul(h, exact)), exact)

    def _moe(self, layer: LlamaLayer, h: np.ndarray) -> np.ndarray:
        """Router softmax -> top-k -> renormalise -> weighted sum of the chosen SwiGLU experts."""
        k = self.cfg.n_expert_used
        probs = softmax(h @ layer.ffn_gate_inp.T)  # [N, E]
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [N, k]
        weights = np.take_along_axis(probs, top, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)
        for e, (gate, up, down) in enumerate(layer.ffn_experts):
            rows, slot = np.nonzero(top == e)
            if rows.size:
                he = h[rows]
                out[rows] += weights[rows, slot, None] * down.matmul(swiglu(gate.matmul(he), up.matmul(he)))
        return out
