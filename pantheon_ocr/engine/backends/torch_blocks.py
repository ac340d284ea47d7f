"""The layer chain of a decoder whose weights torch multiplies (bf16, int8), in torch: decode steps and prompts.

The same block as models/llama.py (`Decoder.block`): norms, q/k/v, q/k norms, RoPE, attention over
the sequence's cached keys, output projection and SwiGLU, with the activations torch float32
tensors from the embedding to the last layer. The numpy loop converted every projection's input
and output between numpy and torch and ran attention as ~50 blocked numpy products per (layer,
sequence), with its element-wise passes on one core; in torch a decode step measured 2x its speed
at B = 1 and 3x at B = 16 for a LightOnOCR-1B decoder at 3,322 cached positions, and a page's
prompt (2,336 tokens in 512-token chunks) 5.0 s against 8.4 (docs/benchmarks.md). The numpy float32
path stays the reference.

Decode steps are exact whatever the batch (tests/engine/test_torch_blocks.py): projections are
exact-rows (`Weight.linear`, format/torch_weights.py: one call for any M, or blocks of 16 rows),
norms, RoPE and SwiGLU act on each row alone, and attention runs per sequence over exactly its own
positions of its pool slot (no padding, no neighbour), so a row's bits depend on its own sequence only.

Prompts (chunks of T rows per sequence) take plain bf16 GEMMs. Their causal attention, where the CPU
has AMX tiles: torch's fused kernel in bfloat16 over the slot's keys widened to bfloat16, whatever the
pool (`fused_causal_attention`); elsewhere, over a bfloat16 or int8 pool, the compiled kernel where the
CPU has AVX-512 BF16 (bf16_attention.py: scores, softmax and weighted values per 32 query rows in the
thread's cache, the pool's int8 keys and values as bfloat16 operands with their scales on the query,
the scores and the weights); else over a bfloat16 pool, or an int8 one where the CPU has bfloat16
units, by blocks of queries as bfloat16 products (`causal_block_attention`); over other pools the
numpy cache's own chunk attention (KVCache.attend_chunk, torch's fused kernel in float32). Where the
compiled row operations build (rows.py, AVX-512), a prompt chunk's q/k norms and RoPE, its SwiGLU and
its int8 KV store run one pass each instead of torch's and numpy's several (a LightOnOCR-1B page's
prefill ~0.6 s less); decode rows keep torch's operations, the reference of the compiled step.

K/V stay in the engine's numpy pool (cache.KVPool, written through `KVCache.write` as on the numpy
path). A decode step over a bfloat16 or int8 pool (auto's: int8 where the kernel builds) runs its
attention for every sequence in one call of the compiled kernel (native.py, csrc/decode_attention.c:
keys widened in registers, float32 queries and weights; over bfloat16 keys 0.53 against 1.6 ms per
layer and sequence at 2,336 positions on an AVX2 EPYC);
where it does not build, and over other pools, attention reads the slot as torch views: float32 as
is, bfloat16 (stored as its bits) as bfloat16 products with float32 accumulation, float16 widened to
float32, int8 widened to bfloat16 (exact: |q| <= 127) with its channel scales on the query and its
position scales on the scores and weights (as attention.padded_decode_attention does).

Where it builds (native_step.py), a decode step over a bfloat16 or int8 pool runs the whole chain in
one compiled call instead: the same products and attention kernel, everything between them plain
loops, no Python per tensor (SmolLM2 at one sequence: 24 -> 10 ms a step). This file's chain stays
the path where it does not build, for prompts, and for a tower with a per-layer timing hook.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from time import perf_counter as _now

import numpy as np

from ..cache import KVPool, Rows, write_step
from ..cancel import check as check_cancelled
from ..format.torch_weights import float_rows, into_huge_pages
from ..format.weights import Weight, can_stack, stack_rows
from ..memory import TRIM_EVERY, release_free_memory
from ..ops import apply_rope, rope_angles
from .common import cpu_has_amx, cpu_has_bf16, require_torch
from .native import DecodeAttention, decode_attention
from .rows import compiled_rows

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
    attn_qkv: Weight | None  # q, k, v rows stacked (weights.stack_rows) where the matrices are copies
    ffn_gate_up: Weight | None  # gate, up rows stacked


def _vec(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.array(a, dtype=np.float32))  # a copy: the map is read-only


class TorchBlocks:
    """The layer chain of a dense, full-attention decoder with bf16 or int8 weights (Decoder.torch_blocks):
    every decode step, and prompts unless a benchmark asks for the numpy kernels (`prefills`)."""

    def __init__(self, decoder):
        self.cfg, self.freqs, self.tower = decoder.cfg, decoder.freqs, decoder.tower
        t = decoder.tower  # naive attention or tile sizes: a reference or a benchmark of the numpy kernels
        self.prefills = t.attention == "flash" and t.q_block is None and t.kv_block is None
        self.layers = [_layer(layer) for layer in decoder.layers]
        # the matrices a decode step streams, in huge pages (memory.huge_page_buffer says why)
        matrices = [getattr(layer, f) for layer in self.layers for f in _Layer.__dataclass_fields__]
        into_huge_pages([decoder.token_embd, decoder.output, *(m for m in matrices if isinstance(m, Weight))])
        self.tiles = cpu_has_amx()  # prompts attend with torch's fused kernel (fused_causal_attention)
        c = self.cfg
        # else over a bfloat16 or int8 pool the compiled one where the CPU has AVX-512 BF16 (prompt_attend)
        self.prompt_kernel = None if self.tiles else prompt_kernel(c.n_head, c.n_head_kv, c.head_dim)
        self.steps = 0
        self.rows = compiled_rows()  # a prompt's q/k norms and RoPE, SwiGLU and int8 KV store in one pass each
        if not t.decode_kernel:
            self.kernel, self.why = None, "torch's products (the tower's options ask for them)"
        elif not DecodeAttention.takes(c.n_head, c.n_head_kv, c.head_dim):
            self.kernel, self.why = None, (f"torch's products (the kernel does not take {c.n_head} query heads over "
                                           f"{c.n_head_kv} KV heads of {c.head_dim})")
        else:  # decode attention over bfloat16 and int8 pools, every sequence at once
            built = decode_attention()
            self.kernel, self.why = built.kernel, built.why
        self.step, self.step_why = self._compiled_step()

    def _compiled_step(self):
        """The compiled decode step (native_step.py) over these layers, or None, and why."""
        if not self.tower.decode_step:
            return None, "the Python chain (the tower's options ask for it)"
        if self.kernel is None:
            return None, "the Python chain (the compiled step needs the compiled decode attention)"
        if self.tower.on_layer is not None:
            return None, "the Python chain (a per-layer timing hook is set)"
        from .native_step import DecodeStep, decode_step

        built = decode_step()
        if built.lib is None:
            return None, built.why
        address = ctypes.cast(self.kernel.lib.decode_attention, ctypes.c_void_p).value
        try:
            return DecodeStep(built.lib, self, address), built.why
        except ValueError as exc:
            return None, f"the Python chain ({exc})"

    def run(self, rows: Rows, x: np.ndarray) -> np.ndarray:
        """x [N, n_embd] float32, the rows of `rows` (one per sequence in a decode step, a chunk of
        each sequence's prompt otherwise) through every layer; stores each layer's k/v in the
        sequences' caches. Returns the last layer's output [N, n_embd]."""
        rope = Rope.of(rows.positions / self.cfg.rope_linear_scale, self.freqs, self.cfg.head_dim, self.cfg.rope_neox)
        if rows.decode and self.step is not None and self.step.takes(rows, rope):
            h = self.step.run(rows, x, rope)  # the whole chain in one compiled call
            self._stepped()
            return h
        hook = self.tower.on_layer
        with torch.inference_mode():
            h = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # [B, n_embd]
            for i, layer in enumerate(self.layers):
                if not rows.decode:
                    check_cancelled()  # a stopped run does not wait for the rest of a long prompt
                t0 = _now() if hook else 0.0
                h = h + self.attention(i, layer, self.norm(h, layer.attn_norm), rope, rows)
                h = h + self.ffn(layer, self.norm(h, layer.ffn_norm), rows.decode)
                if hook:
                    hook(i, _now() - t0)
        self._stepped()
        return h.numpy()

    def _stepped(self) -> None:
        self.steps += 1  # decode steps and prompt chunks alike
        if self.steps % TRIM_EVERY == 0:
            release_free_memory()  # the step's freed tensors, back to the system (memory.py)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """ops.rmsnorm in torch: x / sqrt(mean(x^2) + eps) * weight over the last axis."""
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.cfg.eps) * weight

    @staticmethod
    def rows_in(h: torch.Tensor, exact: bool, w: Weight) -> torch.Tensor:
        """A decode step's input rows to the projections that share them (q, k, v; gate, up), rounded
        to bfloat16 once: each exact-rows product rounds its rows so (torch_weights.linear), unless
        it quantizes float32 rows itself (the compiled products)."""
        return h.to(torch.bfloat16) if exact and not float_rows(w.torch_data(), exact) else h

    def linear(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None, exact: bool) -> torch.Tensor:
        """x [M, in] float32 @ w.T as Weight.matmul computes it; exact: each row's bits independent of M."""
        y = w.linear(x, exact_rows=exact)
        return y if bias is None else y + bias

    def attention(self, i: int, layer: _Layer, h: torch.Tensor, rope: Rope, rows: Rows) -> torch.Tensor:
        c, n, exact = self.cfg, h.shape[0], rows.decode
        q, k, v = self.qkv(layer, self.rows_in(h, exact, layer.attn_q), exact)
        v = v.view(n, c.n_head_kv, c.head_dim)  # [N, Hkv, D]
        if not exact and self.rows is not None and rope.full is not None:  # a prompt's: one pass per tensor
            q_norm, k_norm = (layer.attn_q_norm, layer.attn_k_norm) if c.qk_norm else (None, None)
            turn = (c.eps, rope.cos, rope.sin, rope.neox)
            q = self.rows.norm_rope(q, c.n_head, c.head_dim, q_norm, *turn)  # [N, Hq, D]
            k = self.rows.norm_rope(k, c.n_head_kv, c.head_dim, k_norm, *turn)  # [N, Hkv, D]
        else:
            q = q.view(n, c.n_head, c.head_dim)  # [N, Hq, D]
            k = k.view(n, c.n_head_kv, c.head_dim)  # [N, Hkv, D]
            if c.qk_norm:
                q = self.norm(q, layer.attn_q_norm)
                k = self.norm(k, layer.attn_k_norm)
            q, k = rope(q), rope(k)
        kn, vn = k.numpy().transpose(1, 0, 2), v.numpy().transpose(1, 0, 2)  # [Hkv, N, D] views
        scale = c.head_dim ** -0.5
        attend = self.decode_attention if rows.decode else self.prompt_attention
        out = attend(i, rows, q, kn, vn, scale)  # [N, Hq, D]
        return self.linear(out.view(n, c.n_head * c.head_dim), layer.attn_output, layer.attn_output_bias, exact)

    def qkv(self, layer: _Layer, h: torch.Tensor, exact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [N, qd], k and v [N, kvd] of the rows h: one product where the layer's matrices are stacked."""
        biases = (layer.attn_q_bias, layer.attn_k_bias, layer.attn_v_bias)
        if layer.attn_qkv is None:
            return tuple(self.linear(h, w, b, exact) for w, b in zip((layer.attn_q, layer.attn_k, layer.attn_v), biases))
        parts = self.linear(h, layer.attn_qkv, None, exact).split([layer.attn_q.shape[0], layer.attn_k.shape[0],
                                                                   layer.attn_v.shape[0]], dim=1)
        return tuple(y if b is None else y + b for y, b in zip(parts, biases))

    def prompt_attention(self, i: int, rows: Rows, q: torch.Tensor, kn: np.ndarray, vn: np.ndarray,
                         scale: float) -> torch.Tensor:
        """Prompt chunks' attention at layer i: each sequence's rows (its new k/v written) over its
        cache and themselves, causal -> [N, Hq, D]."""
        out = torch.empty(q.shape)  # [N, Hq, D]
        for s, r0, r1 in zip(rows.states, rows.bounds[:-1], rows.bounds[1:]):  # each sequence's rows alone
            cache, r0, r1 = s.cache, int(r0), int(r1)
            attend = self.prompt_attend(cache.pool)
            if attend is not None:
                cache.write(i, s.pos, kn[:, r0:r1], vn[:, r0:r1], None if self.rows is None else self.rows.int8_of)
                out[r0:r1] = attend(cache.pool, i, cache.held_slot(), s.pos, q[r0:r1], scale=scale)
            else:  # other keys: the numpy cache's chunk attention (torch's fused kernel in float32)
                a = cache.attend_chunk(i, s.pos, q[r0:r1].numpy().transpose(1, 0, 2), kn[:, r0:r1], vn[:, r0:r1],
                                       scale=scale, tower=self.tower)  # [Hq, T, D]
                out[r0:r1] = torch.from_numpy(a.transpose(1, 0, 2))
        return out

    def prompt_attend(self, pool: KVPool):
        """Which causal attention a prompt chunk over this pool takes, (pool, layer, slot, pos0, q, scale=)
        -> [T, Hq, D]: torch's fused kernel in bfloat16 where the CPU has AMX tiles; the compiled kernel
        over a bfloat16 or int8 pool where it runs; torch's products by query blocks where they take the
        pool; else None (the numpy cache's own)."""
        if self.tiles:
            return fused_causal_attention
        if self.prompt_kernel is not None and pool.kind in self.prompt_kernel.KINDS:
            return self.prompt_kernel
        return causal_block_attention if blocks_take(pool) else None

    def decode_attention(self, i: int, rows: Rows, q: torch.Tensor, kn: np.ndarray, vn: np.ndarray,
                         scale: float) -> torch.Tensor:
        """A decode step's attention at layer i: each sequence's new k/v (kn, vn [Hkv, B, D]) written
        as the numpy path writes them, then its query q[b] [Hq, D] over its own positions -> [B, Hq, D].
        Over one bfloat16 or int8 pool the compiled kernel takes every sequence in one call; else
        torch, one sequence at a time."""
        states = rows.states
        write_step([s.cache for s in states], i, [s.pos for s in states], kn, vn)
        pool = states[0].cache.pool
        if self.kernel is not None and pool.kind in DecodeAttention.KINDS and all(s.cache.pool is pool for s in states):
            slots = [s.cache.held_slot() for s in states]
            lengths = [s.pos + 1 for s in states]
            scales = (pool.ks[i], pool.vs[i], pool.kc[i]) if pool.quantized else None
            return torch.from_numpy(self.kernel(pool.k[i], pool.v[i], slots, lengths, q.numpy(), scale=scale,
                                                threads=torch.get_num_threads(), scales=scales))
        return torch.stack([sequence_attention(s.cache.pool, i, s.cache.held_slot(), s.pos + 1, q[b], scale=scale)
                            for b, s in enumerate(states)])

    def ffn(self, layer: _Layer, h: torch.Tensor, exact: bool) -> torch.Tensor:
        h = self.rows_in(h, exact, layer.ffn_gate)
        if layer.ffn_gate_up is None:
            gate, up = self.linear(h, layer.ffn_gate, None, exact), self.linear(h, layer.ffn_up, None, exact)
        else:
            gate_up = self.linear(h, layer.ffn_gate_up, None, exact)
            if not exact and self.rows is not None:  # a prompt's: one pass
                return self.linear(self.rows.swiglu(gate_up), layer.ffn_down, None, exact)
            gate, up = gate_up.split(layer.ffn_gate.shape[0], dim=1)
        return self.linear(F.silu(gate) * up, layer.ffn_down, None, exact)


@dataclass(frozen=True)
class Rope:
    """RoPE at one step's positions. Where it turns the whole head (the decoders here), as
    x * cos + rotate(x) * sin over full-width angle rows: 5 torch operations per tensor instead of
    ops.apply_rope's 12 (its halves written into a copy), with the same bits: x0 c + (-x1) s is
    x0 c - x1 s exactly, and x1 c + x0 s is x0 s + x1 c."""

    cos: torch.Tensor  # [T, R] float32, R = rotated pairs
    sin: torch.Tensor
    neox: bool
    full: tuple[torch.Tensor, torch.Tensor] | None  # [T, 1, D] angle rows when 2R = D, else None

    @classmethod
    def of(cls, positions: np.ndarray, freqs: np.ndarray, head_dim: int, neox: bool) -> Rope:
        cos, sin = (torch.from_numpy(a) for a in rope_angles(positions, freqs))
        full = None
        if 2 * cos.shape[-1] == head_dim:  # pairs (i, i + R) or (2i, 2i + 1) -> one angle per element
            widen = (lambda a: torch.cat([a, a], -1)) if neox else (lambda a: a.repeat_interleave(2, -1))
            full = (widen(cos)[:, None, :], widen(sin)[:, None, :])
        return cls(cos, sin, neox, full)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] rotated -> a new tensor."""
        if self.full is None:  # part of the head turns: the reference code
            return apply_rope(x, self.cos, self.sin, self.neox)
        c, s = self.full
        r = x.shape[-1] // 2
        if self.neox:
            turned = torch.cat([-x[..., r:], x[..., :r]], -1)  # (-x1, x0)
        else:
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)  # (-x[2i+1], x[2i]) pairs
        return x * c + turned * s


_MATRICES = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
_STACKS = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}


def _layer(layer) -> _Layer:
    """A decoder layer's tensors for the torch chain; its q/k/v and gate/up stacked into one matrix
    each where they are copies (int8, or bf16 from another type), not views of the file's map (a
    stack of those would copy them: more memory, not less)."""
    fields = {name: (getattr(layer, name) if name in _MATRICES else _vec(getattr(layer, name)))
              for name in _Layer.__dataclass_fields__ if name not in _STACKS}
    for name, parts in _STACKS.items():
        ws = [getattr(layer, p) for p in parts]
        fields[name] = stack_rows(ws[0].name.replace(parts[0], name), ws) if can_stack(ws) else None
    return _Layer(**fields)


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
        s = s * position_scales(pool.ks[layer][slot, :, :n])  # [Hkv, n, 1]
    p = torch.softmax(s, dim=1)  # over the n keys
    if pool.kind == "int8":  # p . (V vs) = (p vs) . V
        p = p * position_scales(pool.vs[layer][slot, :, :n])
    out = torch.matmul(p.transpose(1, 2).to(v.dtype), v)  # [Hkv, g, D]
    return out.float().reshape(hq, d)


def position_scales(bits: np.ndarray) -> torch.Tensor:
    """An int8 pool's position scales (bfloat16 bits, uint16: cache.KVPool) as float32, exactly."""
    return torch.from_numpy(bits).view(torch.bfloat16).float()


def prompt_kernel(n_head: int, n_kv: int, head_dim: int):
    """The compiled prompt attention (bf16_attention.py) where it builds, the CPU has AVX-512 BF16 and it
    takes these heads; else None. A page's last 512-query chunk over 2,336 int8 keys (LightOnOCR-1B
    layer shapes, AVX-512 BF16 EPYC, 2 threads): 28 ms against 41 ms by query blocks in torch
    (causal_block_attention), with a third of their error against float64 attention (docs/benchmarks.md)."""
    from .bf16_attention import compiled_prompt_attention

    kernel = compiled_prompt_attention()
    return kernel if kernel is not None and kernel.takes(n_head, n_kv, head_dim) else None


QUERY_BLOCK = 256  # prompt rows per score block: [g * 256, L] bf16 scores, a few MB for a page's prompt


def blocks_take(pool: KVPool) -> bool:
    """Whether a prompt chunk's attention over this pool runs by query blocks (causal_block_attention)
    where the CPU has no AMX tiles: a bfloat16 pool always; an int8 one where the CPU has bfloat16 units,
    its keys widened to bfloat16 with their scales. A page's last 512-query chunk over 2,336 int8 keys
    (LightOnOCR-1B layer shapes, AVX-512 BF16 EPYC, 2 threads): 38 ms + 3 ms of widening, against 69 ms
    in torch's fused kernel in float32 (the numpy cache's path), which was half of a page's prefill."""
    return pool.kind == "bfloat16" or (pool.kind == "int8" and cpu_has_bf16())


def causal_block_attention(pool: KVPool, layer: int, slot: int, pos0: int, q: torch.Tensor, *,
                           scale: float) -> torch.Tensor:
    """A prompt chunk's causal attention over a bfloat16 or int8 pool: its queries q [T, Hq, D] at positions
    pos0 .. pos0+T-1, whose keys are already written, over the first pos0 + T positions of the slot
    -> [T, Hq, D] float32. Per KV head and block of QUERY_BLOCK queries: scores = q K^T as one
    bfloat16 product for the head's g query heads, the block's own upper triangle masked, softmax
    (float32 inside), scores @ V.

    Why: torch's fused causal kernel (torch_attention.py) runs in float32 here and was half of a
    page's prefill (4.4 of 8.3 s); as bfloat16 products a page's attention takes 1.7 s. The scores
    are rounded to bfloat16 before the softmax, as in the vision tower's query_block_attention (whose
    compiled softmax saved 1 of a last chunk's 41 ms here: not used).
    On a CPU without bfloat16 units (emulated bfloat16 products) keys, values and products are float32."""
    t, hq, d = q.shape
    hkv = pool.n_kv
    g = hq // hkv
    dt = torch.bfloat16 if cpu_has_bf16() else torch.float32
    k, v = slot_keys(pool, layer, slot, pos0 + t, dt)  # [Hkv, L, D]; int8 widened with its scales
    qg = (q * scale).to(dt).view(t, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, g, T, D]
    out = torch.empty(t, hkv, g, d)  # [T, Hkv, g, D]
    for s in range(0, t, QUERY_BLOCK):
        e = min(s + QUERY_BLOCK, t)
        n, keys = e - s, pos0 + e  # the block's queries see keys 0 .. pos0 + e - 1, each up to its own
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # [n, n] query r must not see block key > r
        for h in range(hkv):
            scores = torch.matmul(qg[h, :, s:e], k[h, :keys].transpose(0, 1))  # [g, n, keys]
            scores[:, :, keys - n:].masked_fill_(future, float("-inf"))
            p = torch.softmax(scores, -1)
            out[s:e, h] = torch.matmul(p, v[h, :keys]).transpose(0, 1).float()  # [n, g, D]
    return out.view(t, hq, d)


def slot_keys(pool: KVPool, layer: int, slot: int, n: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n keys and values of a pool slot as torch tensors [Hkv, n, D] of `dtype`, whatever the
    pool stores (KVPool.load's values: int8 times its position and channel scales, in float32)."""
    k = torch.from_numpy(pool.k[layer][slot, :, :n])  # [Hkv, n, D] views of the slot
    v = torch.from_numpy(pool.v[layer][slot, :, :n])
    if pool.kind == "bfloat16":
        k, v = k.view(torch.bfloat16), v.view(torch.bfloat16)
    elif pool.quantized:  # widened in place: the same bits as k.float() * ks * kc, two passes fewer (2.3 -> 1.1 ms
        # for a page's 2,336 keys of one layer, 2 threads)
        k = k.to(torch.float32).mul_(position_scales(pool.ks[layer][slot, :, :n])).mul_(torch.from_numpy(pool.kc[layer][slot]))
        v = v.to(torch.float32).mul_(position_scales(pool.vs[layer][slot, :, :n]))
    return k.to(dtype), v.to(dtype)


def fused_causal_attention(pool: KVPool, layer: int, slot: int, pos0: int, q: torch.Tensor, *,
                           scale: float) -> torch.Tensor:
    """causal_block_attention's result through torch's fused kernel (scaled_dot_product_attention, a
    boolean lower-right causal mask, the KV heads shared by their query heads) in bfloat16, over a
    pool of any kind: q [T, Hq, D] at positions pos0 .. pos0+T-1 -> [T, Hq, D] float32. Scores stay
    float32 inside the kernel.

    Why: where the CPU has AMX tiles the kernel multiplies with them (common.cpu_has_amx): a page's
    prompt chunks (512 queries over up to 2,336 keys) took 32 ms a layer against 83 ms by query blocks
    and 123 ms in float32, the pool's int8 keys widened (2 threads, Xeon with AMX)."""
    t, hq, d = q.shape
    n = pos0 + t
    k, v = slot_keys(pool, layer, slot, n, torch.bfloat16)
    visible = torch.ones(t, n, dtype=torch.bool).tril(pos0)  # [T, n]: query r sees keys 0 .. pos0 + r
    out = F.scaled_dot_product_attention(q.transpose(0, 1).to(torch.bfloat16)[None], k[None], v[None],
                                         attn_mask=visible, scale=scale, enable_gqa=hq != pool.n_kv)  # [1, Hq, T, D]
    return out[0].transpose(0, 1).float()
