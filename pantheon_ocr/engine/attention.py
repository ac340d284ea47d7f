"""Attention kernels: naive reference, blocked ("flash") prefill and padded decode. Pure array
code: they take arrays and know no cache object (cache.py calls them with its buffers).

Layouts: q [Hq, Tq, D], k/v [Hkv, Tk, D]; query head h reads KV head h // (Hq // Hkv).
Positions are explicit (q_pos [Tq], k_pos [Tk], ascending) so one kernel covers causal prefill
after a cached prefix, the sliding window (key visible when q_pos - k_pos < window) and
non-causal vision attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..options import ATTENTION_KINDS

# Query blocks of 256 rows (not 32): numpy pays per call, and OpenBLAS pays a thread hand-off per
# GEMM. At 2,322 prompt tokens (one Letter page) 32-row blocks make ~6k tiny GEMMs per layer:
# as fast as 256 with one BLAS thread (0.66 s vs 0.67 s), but 8.3 s vs 1.7 s with two BLAS
# threads on a loaded 2-core machine (`pantheon-ocr bench ocr`, docs/benchmarks.md).
Q_BLOCK, KV_BLOCK = 256, 256
# Keys per block of the padded decode attention: every row computes whole blocks up to the
# longest row's length, so short sequences (a reader's line pieces: ~50 positions) waste less
# with 64 than with 256 (measured: a step of 180 line sequences, 4 layers, 1.8 s -> see
# docs/benchmarks.md); a long page (3,000 positions) pays ~50 block iterations per layer.
DECODE_BLOCK = 64


@dataclass(frozen=True)
class TowerOptions:
    """How a tower (decoder or vision encoder) is built, beyond its weights: constructor options
    benchmarks set instead of patching a built model. Figures quoted from anything but the
    defaults must say so."""

    n_layers: int | None = None  # build only the first N layers (full depth estimated from them)
    attention: str = "flash"  # prefill / vision attention: flash (blocked) or naive (the reference)
    q_block: int | None = None  # flash tile rows (None: the tower's own)
    kv_block: int | None = None  # flash tile keys (None: the tower's own)
    on_layer: Callable[[int, float], None] | None = None  # timing hook: called (layer index, seconds)
    # a faster kernel for causal attention of a chunk at the end of its keys (no window, no tile
    # sizes asked), called with attend's arguments minus the positions: the decoder sets torch's
    # when its matmuls run in torch
    causal_chunk: Callable[..., np.ndarray] | None = None
    # decode attention over a bfloat16 or int8 pool in the compiled kernel where it builds (backends/native.py);
    # False keeps torch's products (a benchmark or test of that path)
    decode_kernel: bool = True
    # a decode step's whole layer chain in one compiled call where it builds (backends/native_step.py;
    # it needs the compiled decode attention); False keeps the chain in Python (a benchmark or test)
    decode_step: bool = True

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, not {self.attention!r}")
        if self.n_layers is not None and self.n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, not {self.n_layers}")

    def layers(self, n: int) -> int:
        """How many of a tower's n layers to build."""
        return n if self.n_layers is None else min(n, self.n_layers)

    def attend(self, q, k, v, q_pos, k_pos, *, scale: float, causal: bool = True, window: int = 0,
               q_block: int = Q_BLOCK, kv_block: int = KV_BLOCK):
        """The chosen kernel on q [Hq, Tq, D], k/v [Hkv, Tk, D]."""
        if self.attention == "naive":
            return naive_attention(q, k, v, q_pos, k_pos, scale=scale, causal=causal, window=window)
        tiles_asked = self.q_block is not None or self.kv_block is not None  # a benchmark of the blocked kernel
        if self.causal_chunk is not None and causal and not window and not tiles_asked:
            if _chunk_at_the_end(q_pos, k_pos):
                return self.causal_chunk(q, k, v, scale=scale)
        return flash_attention(q, k, v, q_pos, k_pos, scale=scale, causal=causal, window=window,
                               q_block=self.q_block or q_block, kv_block=self.kv_block or kv_block)


def _chunk_at_the_end(q_pos, k_pos) -> bool:
    """Keys at positions 0..Tk-1 and queries at the last Tq of them (both ascending)."""
    tq, tk = len(q_pos), len(k_pos)
    return 0 < tq <= tk and k_pos[0] == 0 and k_pos[-1] == tk - 1 and q_pos[0] == tk - tq and q_pos[-1] == tk - 1


def _visible(q_pos: np.ndarray, k_pos: np.ndarray, causal: bool, window: int) -> np.ndarray | None:
    """Boolean mask [Tq, Tk] of visible keys, or None when every key is visible."""
    mask = None
    if causal:
        mask = k_pos[None, :] <= q_pos[:, None]
    if window:
        near = (q_pos[:, None] - k_pos[None, :]) < window
        mask = near if mask is None else mask & near
    return mask


def naive_attention(q, k, v, q_pos, k_pos, *, scale: float, causal=True, window=0) -> np.ndarray:
    """Reference: the full score matrix at once (tests and tiny shapes only)."""
    hq, hkv = q.shape[0], k.shape[0]
    kk = np.repeat(k, hq // hkv, axis=0)
    vv = np.repeat(v, hq // hkv, axis=0)
    s = (q @ kk.transpose(0, 2, 1)) * np.float32(scale)  # [Hq, Tq, Tk]
    mask = _visible(np.asarray(q_pos), np.asarray(k_pos), causal, window)
    if mask is not None:
        s = np.where(mask[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ vv).astype(np.float32)


def flash_attention(q, k, v, q_pos, k_pos, *, scale: float, causal=True, window=0,
                    q_block=Q_BLOCK, kv_block=KV_BLOCK) -> np.ndarray:
    """Blocked attention with an online softmax in float32; never holds more than one
    [group*q_block, kv_block] score tile per KV head. All heads go through each tile as one
    batched matmul."""
    hq, tq, d = q.shape
    hkv = k.shape[0]
    q_pos = np.asarray(q_pos, dtype=np.int64)
    k_pos = np.asarray(k_pos, dtype=np.int64)
    out = np.empty_like(q, dtype=np.float32)
    g = hq // hkv
    qh = q.reshape(hkv, g, tq, d)  # [Hkv, g, Tq, D]: a KV head's query heads share each tile
    for qs in range(0, tq, q_block):
        qe = min(qs + q_block, tq)
        nb = qe - qs
        qb = qh[:, :, qs:qe].reshape(hkv, g * nb, d) * np.float32(scale)  # [Hkv, g*nb, D]
        m = np.full((hkv, g * nb, 1), -np.inf, dtype=np.float32)
        l = np.zeros((hkv, g * nb, 1), dtype=np.float32)
        acc = np.zeros((hkv, g * nb, d), dtype=np.float32)
        qp = np.tile(q_pos[qs:qe], g)
        for ks in range(0, k.shape[1], kv_block):
            ke = min(ks + kv_block, k.shape[1])
            if causal and k_pos[ks] > q_pos[qe - 1]:
                break  # keys ascend: every later block is in the future
            if window and q_pos[qs] - k_pos[ke - 1] >= window:
                continue  # the whole block slid out of every query's window
            s = qb @ k[:, ks:ke].transpose(0, 2, 1)  # [Hkv, g*nb, kb]
            mask = _visible(qp, k_pos[ks:ke], causal, window)
            if mask is not None and not mask.all():
                s = np.where(mask[None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            # A row with no visible key yet keeps m = -inf; shift by 0 there to avoid NaN.
            shift = np.where(np.isfinite(m_new), m_new, 0).astype(np.float32)
            p = np.exp(s - shift)
            corr = np.exp(m - shift)
            l = l * corr + p.sum(axis=-1, keepdims=True)
            acc = acc * corr + p @ v[:, ks:ke]
            m = m_new
        out[:, qs:qe] = (acc / l).reshape(hkv, g, nb, d).reshape(hq, nb, d)
    return out


def padded_decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: np.ndarray, *,
                            scale: float, block: int = DECODE_BLOCK, k_scale: np.ndarray | None = None,
                            v_scale: np.ndarray | None = None, k_channels: np.ndarray | None = None,
                            widen: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """One decode step of n sequences at once: q [n, Hq, D] (one query each), k/v [n, Hkv, cap, D]
    (one padded buffer, cap a multiple of `block`), lengths [n] keys each row holds (0: the row
    takes no part; its output is 0) -> [n, Hq, D] float32.

    Exact whatever n and the lengths beside a row: keys go in blocks of `block`, every matmul is
    a stack of per-(sequence, head) products of one fixed shape, scores past a row's length are
    -inf (weight exactly 0), and the per-block sums are added one block after the other, so the
    blocks a longer neighbour adds contribute exact zeros. A sequence decoded alone (n = 1) gets
    the very same bits. K/V stored in float16 are widened one block at a time (bfloat16, stored as
    bits, by `widen`); int8 K/V are
    multiplied by their scales k_scale / v_scale [n, Hkv, cap, 1] a block at a time, and int8 keys
    by their channel scales k_channels [n, Hkv, 1, D]."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    widen = widen or (lambda a: a.astype(np.float32, copy=False))
    lengths = np.asarray(lengths, dtype=np.int64)
    n_blk = max(1, -(-int(lengths.max()) // block))
    # Scores are kept transposed, [n, Hkv, keys, g]: K_block [blk, D] @ q^T [D, g] is the GEMM
    # OpenBLAS runs ~2x faster than q [g, D] @ K_block^T (measured, B = 16, 3,000 keys).
    qt = np.ascontiguousarray((q.reshape(n, hkv, g, d) * np.float32(scale)).swapaxes(-1, -2))  # [n, Hkv, D, g]
    if k_channels is not None:
        # int8 keys: K[p, c] * ks[p] * kc[c] . q[c] = ks[p] * (K[p, c] . (kc[c] q[c])): the channel
        # scales go on the query and the position scales on the scores, both small, so the only
        # pass over a block of keys is its widening (the keys are the step's memory traffic)
        qt = np.ascontiguousarray(qt * k_channels.swapaxes(-1, -2))  # [n, Hkv, D, g]
    s = np.empty((n, hkv, n_blk * block, g), np.float32)
    for j in range(n_blk):
        kb = widen(k[:, :, j * block : (j + 1) * block])  # [n, Hkv, blk, D]
        sb = s[:, :, j * block : (j + 1) * block]
        np.matmul(kb, qt, out=sb)
        if k_scale is not None:
            sb *= k_scale[:, :, j * block : (j + 1) * block]
    hidden = np.arange(n_blk * block)[None, :] >= lengths[:, None]  # [n, padded L]
    np.copyto(s, np.float32(-np.inf), where=hidden[:, None, :, None])
    m = s.max(axis=-2, keepdims=True)  # [n, Hkv, 1, g]
    m[~np.isfinite(m)] = 0  # a row with no key (length 0): exp(-inf) = 0 everywhere, no NaN
    np.subtract(s, m, out=s)
    np.exp(s, out=s)  # p
    acc = np.zeros((n, hkv, g, d), np.float32)
    total = np.zeros((n, hkv, 1, g), np.float32)
    for j in range(n_blk):
        p = s[:, :, j * block : (j + 1) * block]  # [n, Hkv, blk, g]
        total += p.sum(axis=-2, keepdims=True)
        vb = widen(v[:, :, j * block : (j + 1) * block])  # [n, Hkv, blk, D]
        if v_scale is not None:  # p . (V vs) = (p vs) . V: the position scales on the weights
            p = p * v_scale[:, :, j * block : (j + 1) * block]
        acc += p.swapaxes(-1, -2) @ vb
    total[total == 0] = 1  # rows with no key: 0 / 1
    return (acc / total.swapaxes(-1, -2)).reshape(n, hq, d)
