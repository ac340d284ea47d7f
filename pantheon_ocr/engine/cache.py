"""Sequence state: each sequence's KV cache and position, and the one place both move on.

A forward pass runs rows of activations through the layers. `Rows` says which sequence each row
belongs to and at which position: one sequence with T new tokens (a prompt, or one decode step)
is one segment of T rows; `forward_batch` is B segments of one row each. Every layer hands its
roped q/k/v to `rows.attend(layer, q, k, v)`, which writes k/v into the sequences' caches and
returns their attention; after the last layer `rows.advance(tokens)` moves the positions on.
Nothing else writes a cache or a position.

The caches of a page engine's sequences live in one `KVPool` that the page engine creates and
owns (page_engine.OCREngine): per layer one padded buffer [slots, Hkv, cap, D] for K and one for V,
a sequence owning a slot from `KVCache(...)` until `release()`. A decode step of B sequences is
then one padded attention over their slots (attention.padded_decode_attention), and a single
sequence's decode step is the same computation over its one slot, bit for bit. The attention
kernels take arrays; this module hands them its buffers.
"""

from __future__ import annotations

import heapq
import mmap
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import ContextFull
from ..options import TORCH_STORAGES
from .attention import DECODE_BLOCK, KV_BLOCK, TowerOptions, padded_decode_attention
from .ops import from_bf16_bits, to_bf16_bits

FIRST_CAP = 256  # positions a new slot starts with; caps grow by doubling, in whole KV blocks
# KV storage kinds -> the numpy dtype of the buffers (numpy has no bfloat16: its bits, as uint16)
KV_STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "int8": np.int8}
BF16_ONE = 0x3F80  # 1.0 as bfloat16 bits: an all-zero row's scale


def _blocks(n: int) -> int:
    return -(-n // KV_BLOCK) * KV_BLOCK


def _zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros on an anonymous map of its own, whose pages are committed as they are written and
    never as 2 MB huge pages. Why: numpy asks the kernel for transparent huge pages on large arrays,
    and one head's row of a slot is ~0.4 MB (int8, 3,400 positions), so the first write to each row
    committed the 2 MB around it: the pool held every slot's whole capacity (its prompt plus
    max_tokens) from its first token on, not its real length (docs/benchmarks.md)."""
    n_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n_bytes == 0:
        return np.zeros(shape, dtype)
    # anonymous and zero-filled, private to this process where the platform says so; unmapped when
    # the array is collected
    private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_ANONYMOUS") else {}
    m = mmap.mmap(-1, n_bytes, **private)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux; elsewhere there are no transparent huge pages to refuse
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype).reshape(shape)


def kv_kind(choice: str, weights: str) -> str:
    """The KV storage for a `kv_dtype` choice (options.KV_DTYPES) and the decoder's weight storage.
    auto, with bf16 or int8 weights (the torch decode step): int8 where the compiled decode attention
    builds (backends/native.py; it reads a byte per value: at 2,336 positions on an AVX2 EPYC B = 16
    decoded 36.9 tok/s over int8 keys, 30.4 over bfloat16, at half the memory; greedy streams as
    float32's on the reference models, docs/benchmarks.md), else bfloat16 (torch's products are
    fastest over bfloat16 keys); with other weights float32 (the numpy reference)."""
    if choice != "auto":
        return choice
    if weights not in TORCH_STORAGES:
        return "float32"
    from .backends.native import decode_attention

    return "int8" if decode_attention().kernel is not None else "bfloat16"


def _int8_of(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., D] float32 -> (its int8 values, still float32: rint(x / s), and s [..., 1] as bfloat16
    bits): an int8 pool's store of a row. s is its largest magnitude / 127 rounded up to bfloat16
    (1 where that is 0), and x is divided by that s: the pool holds the scale its integers were made
    with, and |rint(x / s)| <= 127 by construction. Why bfloat16: as float32 the position scales
    were 90 of the 4,097 MiB a B = 16 page run peaked at. Why up: rounded to nearest, Qwen2.5-0.5B's
    greedy stream left float32's at its 22nd token, a near-tie (test_kv_int8.py)."""
    u = (np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)).view(np.uint32)  # >= 0: its bits grow with it
    bits = ((u >> np.uint32(16)) + ((u & np.uint32(0xFFFF)) != 0)).astype(np.uint16)  # the next bfloat16 up
    bits[bits == 0] = BF16_ONE
    return np.rint(x / from_bf16_bits(bits)), bits


def _int8_divided(x: np.ndarray, divisor: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """_int8_of(x / divisor) (divisor None: of x): the store of keys through their channel scales."""
    return _int8_of(x if divisor is None else x / divisor)


class KVPool:
    """The K/V of every live sequence of one decoder: per layer k[layer], v[layer] of shape
    [slots, Hkv, cap, D]. Slots and cap grow geometrically (copying only what is written);
    cap is a whole number of KV blocks. The buffers' pages are committed as they are written, in
    4 KiB pages (`_zeros`), so a slot costs memory for the positions it holds. `kind` float16 or
    bfloat16 halves the memory (and the bytes each decode step reads; bfloat16 is stored as its
    bits, uint16); int8 about quarters it: each position's key (value) of each head stored as int8
    times one bfloat16 scale (its largest magnitude / 127, as bits, uint16: `_int8_of`) in
    ks[layer] / vs[layer] [slots, Hkv, cap, 1]. Keys have outlier channels (Qwen's reach 12x their median), so a key
    is first divided by its sequence's channel scales kc[layer] [slots, Hkv, 1, D] (each
    channel's largest magnitude in the sequence's first write, its prompt), then quantized.
    Attention widens either to float32 a block at a time."""

    def __init__(self, n_layer: int, n_kv: int, head_dim: int, kind: str = "float32"):
        if kind not in KV_STORAGE:
            raise ValueError(f"KV storage must be one of {', '.join(KV_STORAGE)}, not {kind!r}")
        self.n_kv, self.head_dim, self.kind, self.dtype = n_kv, head_dim, kind, np.dtype(KV_STORAGE[kind])
        self.quantized = kind == "int8"
        self.k = [np.zeros((0, n_kv, 0, head_dim), self.dtype) for _ in range(n_layer)]
        self.v = [np.zeros((0, n_kv, 0, head_dim), self.dtype) for _ in range(n_layer)]
        scales = (lambda d: [np.zeros((0, n_kv, 0, d), np.uint16) for _ in range(n_layer)]) if self.quantized \
            else (lambda d: [])
        self.ks, self.vs = scales(1), scales(1)  # int8 only: per position and head
        self.kc = [np.ones((0, n_kv, 1, head_dim), np.float32) for _ in range(n_layer)] if self.quantized else []
        self.kc_set: set[tuple[int, int]] = set()  # (layer, slot) whose channel scales are set
        self.used: list[int] = []  # per slot: positions written (the part a copy must keep)
        self._free: list[int] = []

    def buffers(self) -> tuple[list[np.ndarray], ...]:
        """Every per-layer array list a slot's positions live in: k, v (and ks, vs for int8)."""
        return (self.k, self.v, self.ks, self.vs) if self.quantized else (self.k, self.v)

    def store(self, layer: int, slot: int, at, k: np.ndarray, v: np.ndarray, int8_of=None) -> None:
        """k/v [Hkv, T, D] float32 into positions `at` (a slice or indices) of the slot. int8_of: a
        function (x, divisor) -> _int8_of(x / divisor)'s bits, for a prompt chunk's many rows (the
        compiled one, backends/rows.py); None: _int8_of."""
        if self.kind == "bfloat16":
            self.k[layer][slot][:, at] = to_bf16_bits(k)
            self.v[layer][slot][:, at] = to_bf16_bits(v)
            return
        if not self.quantized:
            self.k[layer][slot][:, at] = k
            self.v[layer][slot][:, at] = v
            return
        if (layer, slot) not in self.kc_set:  # the slot's first write (its prompt) sets the channel scales
            c = np.abs(k).max(axis=1, keepdims=True)  # [Hkv, 1, D]
            self.kc[layer][slot] = np.where(c > 0, c, 1)
            self.kc_set.add((layer, slot))
        int8_of = int8_of or _int8_divided
        for x, div, q, s in ((k, self.kc[layer][slot], self.k, self.ks), (v, None, self.v, self.vs)):
            q[layer][slot][:, at], s[layer][slot][:, at] = int8_of(x, div)

    def store_step(self, layer: int, slots: np.ndarray, at: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """A decode step's k/v [Hkv, B, D] float32: row b into position at[b] of slot slots[b], every
        row in one go, element by element as `store` computes it (the same bits): a step over B
        sequences was 30 x B `store` calls of ~12 numpy operations each, a sixth of SmolLM2's step at
        B = 16. int8: every slot's channel scales are set (its prompt came first)."""
        kt, vt = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [B, Hkv, D]: buf[layer][slots, :, at]'s layout
        if self.kind == "bfloat16":
            kt, vt = to_bf16_bits(kt), to_bf16_bits(vt)
        if not self.quantized:
            self.k[layer][slots, :, at] = kt
            self.v[layer][slots, :, at] = vt
            return
        for x, div, q, sc in ((kt, self.kc[layer][slots, :, 0], self.k, self.ks), (vt, None, self.v, self.vs)):
            q[layer][slots, :, at], sc[layer][slots, :, at] = _int8_divided(x, div)

    def load(self, layer: int, slot: int, at) -> tuple[np.ndarray, np.ndarray]:
        """The float32 keys/values of positions `at` of the slot: [Hkv, L, D] each."""
        k, v = self.k[layer][slot][:, at], self.v[layer][slot][:, at]
        if self.kind == "bfloat16":
            return from_bf16_bits(k), from_bf16_bits(v)
        if self.quantized:
            ks, vs = from_bf16_bits(self.ks[layer][slot][:, at]), from_bf16_bits(self.vs[layer][slot][:, at])
            return k * ks * self.kc[layer][slot], v * vs
        return k, v

    def acquire(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self.used.append(0)
        return len(self.used) - 1

    def release(self, slot: int) -> None:
        """The slot's sequence is gone: zero what it wrote (padded attention multiplies the
        weight-0 keys of its neighbours by these values, which must stay finite) and reuse it."""
        n = self.used[slot]
        for buf in (b for group in self.buffers() for b in group):
            if slot < buf.shape[0]:
                buf[slot, :, : min(n, buf.shape[2])] = 0
        self.used[slot] = 0
        self.kc_set = {ls for ls in self.kc_set if ls[1] != slot}
        heapq.heappush(self._free, slot)

    def reserve(self, layer: int, slot: int, n: int, limit: int) -> None:
        """Make room in `layer` for `slot` to hold n positions; doubling stops at `limit`
        (the sequence's max_seq)."""
        slots, cap = self.k[layer].shape[0], self.k[layer].shape[2]
        if slot < slots and n <= cap:
            return
        new_slots = max(slot + 1, slots, 2 * slots if slot >= slots else 0)
        new_cap = _blocks(max(n, cap, min(2 * cap, limit) if n > cap else 0))
        if self.quantized and new_slots > self.kc[layer].shape[0]:  # channel scales: one per slot
            kc = np.ones((new_slots, self.n_kv, 1, self.head_dim), np.float32)
            kc[: self.kc[layer].shape[0]] = self.kc[layer]
            self.kc[layer] = kc
        for buf in self.buffers():
            grown = _zeros((new_slots, self.n_kv, new_cap, buf[layer].shape[3]), buf[layer].dtype)
            for s in range(min(slots, len(self.used))):  # slots past `used` were never acquired
                n_s = min(self.used[s], cap)  # `used` counts every layer; this one may hold fewer
                grown[s, :, :n_s] = buf[layer][s, :, :n_s]
            buf[layer] = grown

    def nbytes(self) -> int:
        return sum(a.nbytes for group in self.buffers() for a in group)


class KVCache:
    """One sequence's K/V: a slot of a KVPool (a pool of its own if none is given), held until
    `release()`. Per layer the slot holds [Hkv, cap, D]; `max_seq` bounds the positions.

    With `ring` (sliding window), max_seq = the window: position p lives in slot p % max_seq and
    a query at p reads min(p + 1, max_seq) slots.
    """

    def __init__(self, n_layer: int, n_kv: int, head_dim: int, max_seq: int, ring: bool,
                 pool: KVPool | None = None):
        self.max_seq, self.ring = max_seq, ring
        self.pool = pool if pool is not None else KVPool(n_layer, n_kv, head_dim)
        self.slot: int | None = self.pool.acquire()
        for layer in range(n_layer):
            self.pool.reserve(layer, self.slot, min(max_seq, FIRST_CAP), max_seq)

    def release(self) -> None:
        """Give the slot back to the pool (idempotent): the sequence is done or abandoned."""
        if self.slot is not None:
            self.pool.release(self.slot)
            self.slot = None

    def held_slot(self) -> int:
        if self.slot is None:
            raise RuntimeError("this sequence's KV cache was released")
        return self.slot

    def write(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray, int8_of=None) -> None:
        """Store k/v [Hkv, T, D] for positions pos0 .. pos0+T-1 (ring: only the last max_seq);
        int8_of as KVPool.store takes it."""
        t = k.shape[1]
        pool = self.pool
        if self.ring:
            slot, keep = self.held_slot(), min(t, self.max_seq)
            pool.reserve(layer, slot, min(pos0 + t, self.max_seq), self.max_seq)
            slots = np.arange(pos0 + t - keep, pos0 + t) % self.max_seq
            pool.store(layer, slot, slots, k[:, t - keep :], v[:, t - keep :], int8_of)
            end = min(pos0 + t, self.max_seq)
        else:
            slot = self.room(layer, pos0, t)
            pool.store(layer, slot, slice(pos0, pos0 + t), k, v, int8_of)
            end = pos0 + t
        pool.used[slot] = max(pool.used[slot], end)

    def room(self, layer: int, pos0: int, t: int) -> int:
        """Make room in `layer` for positions pos0 .. pos0+t-1 (not a ring); the slot."""
        if pos0 + t > self.max_seq:
            raise ContextFull(pos0 + t, self.max_seq)
        slot = self.held_slot()
        self.pool.reserve(layer, slot, pos0 + t, self.max_seq)
        return slot

    def read(self, layer: int, n_pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys/values of the positions before n_pos that are still held, with their positions,
        in ascending position order: (k [Hkv, L, D], v, positions [L])."""
        slot = self.held_slot()
        if self.ring and n_pos > self.max_seq:
            pos = np.arange(n_pos - self.max_seq, n_pos)
            return (*self.pool.load(layer, slot, pos % self.max_seq), pos)
        return (*self.pool.load(layer, slot, slice(0, n_pos)), np.arange(n_pos))

    def held(self, n_pos: int) -> int:
        """Keys a query at position n_pos - 1 attends to."""
        return min(n_pos, self.max_seq)

    def attend_chunk(self, layer: int, pos0: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float,
                     window: int = 0, tower: TowerOptions = TowerOptions()) -> np.ndarray:
        """Attention of a chunk (q [Hq, T, D], new k/v [Hkv, T, D] at positions pos0..) over the
        cache plus itself; stores the new k/v. Returns [Hq, T, D]."""
        t = q.shape[1]
        if self.ring and pos0 + t > self.max_seq:
            # The chunk would overwrite keys its own early queries still need: attend over the
            # held prefix + the chunk with the window mask, then store.
            pk, pv, ppos = self.read(layer, pos0)
            kk, vv = np.concatenate([pk, k], axis=1), np.concatenate([pv, v], axis=1)
            kpos = np.concatenate([ppos, np.arange(pos0, pos0 + t)])
            self.write(layer, pos0, k, v)
        else:
            self.write(layer, pos0, k, v)
            kk, vv, kpos = self.read(layer, pos0 + t)
        return tower.attend(q, kk, vv, np.arange(pos0, pos0 + t), kpos, scale=scale, causal=True, window=window)

    def nbytes(self) -> int:
        """Bytes of this sequence's slot (its share of the pool)."""
        slot = self.held_slot()
        return sum(buf[slot].nbytes for buf in (*self.pool.k, *self.pool.v))


def write_step(caches: Sequence[KVCache], layer: int, positions: Sequence[int], k: np.ndarray, v: np.ndarray) -> None:
    """A decode step's new k/v [Hkv, B, D]: row b at positions[b] of caches[b]. Caches of one pool
    (not rings; int8 ones with their channel scales set) in one store (KVPool.store_step), else each
    cache's own write (and a lone row, which fancy indexing only slows): the same bits either way."""
    pool = caches[0].pool
    if len(caches) == 1 or any(c.pool is not pool or c.ring for c in caches) or (
            pool.quantized and any((layer, c.held_slot()) not in pool.kc_set for c in caches)):
        for b, (c, p) in enumerate(zip(caches, positions)):
            c.write(layer, p, k[:, b:b + 1], v[:, b:b + 1])
        return
    slots = np.array([c.room(layer, p, 1) for c, p in zip(caches, positions)])
    pool.store_step(layer, slots, np.asarray(positions), k, v)
    for slot, p in zip(slots, positions):
        pool.used[slot] = max(pool.used[slot], p + 1)


def decode_attend(caches: Sequence[KVCache], layer: int, n_pos: Sequence[int], q: np.ndarray, *,
                  scale: float) -> np.ndarray:
    """One decode step's attention for sequences whose new k/v are already written: q [B, Hq, D],
    caches[b] holding n_pos[b] positions -> [B, Hq, D]. Sequences of one pool go through one padded
    attention over the pool's slots lo..hi (slots between them that are not in the batch get
    length 0 and are dropped), so a row never depends on which other rows share its batch."""
    out = np.empty_like(q)
    groups: dict[int, list[int]] = {}
    for b, c in enumerate(caches):
        groups.setdefault(id(c.pool), []).append(b)
    for members in groups.values():
        pool = caches[members[0]].pool
        slots = np.array([caches[b].held_slot() for b in members])
        lengths = np.array([caches[b].held(n_pos[b]) for b in members], np.int64)
        lo, hi = int(slots.min()), int(slots.max()) + 1
        keys = -(-int(lengths.max()) // DECODE_BLOCK) * DECODE_BLOCK  # the blocks any row needs
        bufs = pool.buffers()
        channels = pool.kc[layer][slots] if pool.quantized else None  # [n, Hkv, 1, D] of the members
        if len(members) >= 0.75 * (hi - lo):  # nearly every slot of the range is live: a view
            kv = [b[layer][lo:hi, :, :keys] for b in bufs]
            rows = slots - lo
            qs = np.zeros((hi - lo, *q.shape[1:]), np.float32)
            lens = np.zeros(hi - lo, np.int64)
            qs[rows], lens[rows] = q[members], lengths
            if channels is not None:  # the range's other slots take no part: any scale does
                full = np.ones((hi - lo, *channels.shape[1:]), np.float32)
                full[rows] = channels
                channels = full
        else:  # a sparse range (many finished neighbours): copy the live slots' needed keys only
            kv = [b[layer][slots, :, :keys] for b in bufs]
            rows, qs, lens = np.arange(len(members)), q[members], lengths
        out[members] = padded_decode_attention(qs, kv[0], kv[1], lens, scale=scale, block=DECODE_BLOCK,
                                               widen=from_bf16_bits if pool.kind == "bfloat16" else None,
                                               k_scale=from_bf16_bits(kv[2]) if pool.quantized else None,
                                               v_scale=from_bf16_bits(kv[3]) if pool.quantized else None,
                                               k_channels=channels)[rows]
    return out


@dataclass
class DecoderState:
    """One sequence: its KV cache, the positions already processed and their tokens."""

    cache: KVCache
    pos: int = 0
    tokens: list[int] = field(default_factory=list)

    def release(self) -> None:
        """The sequence is done: its KV slot goes back to the pool."""
        self.cache.release()


class Rows:
    """The rows of one forward pass, grouped by sequence: rows bounds[b]:bounds[b+1] are the next
    lengths[b] tokens of states[b], at positions states[b].pos onwards."""

    def __init__(self, states: Sequence[DecoderState], lengths: Sequence[int]):
        self.states = list(states)
        self.bounds = np.cumsum([0, *lengths])  # [B + 1] row offsets
        self.positions = np.concatenate([np.arange(s.pos, s.pos + n) for s, n in zip(self.states, lengths)])  # [N]
        # Decode: one new token per sequence. Its projections go through exact-rows matmuls and
        # its attention through the padded path, so a row does not depend on the batch around it.
        self.decode = all(n == 1 for n in lengths)

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, window: int = 0,
               tower: TowerOptions = TowerOptions()) -> np.ndarray:
        """q [N, Hq, D], k/v [N, Hkv, D] (roped) -> attention [N, Hq, D]: each sequence's rows
        against its cache plus themselves (causal). Stores their k/v in the caches."""
        if self.decode:  # one new token per sequence: one padded attention for all of them
            write_step([s.cache for s in self.states], layer, [s.pos for s in self.states],
                       k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            return decode_attend([s.cache for s in self.states], layer, [s.pos + 1 for s in self.states], q,
                                 scale=scale)
        out = np.empty_like(q)
        for s, r0, r1 in zip(self.states, self.bounds[:-1], self.bounds[1:]):
            a = s.cache.attend_chunk(layer, s.pos, q[r0:r1].transpose(1, 0, 2), k[r0:r1].transpose(1, 0, 2),
                                     v[r0:r1].transpose(1, 0, 2), scale=scale, window=window, tower=tower)  # [Hq, T, D]
            out[r0:r1] = a.transpose(1, 0, 2)
        return out

    def advance(self, tokens: Sequence[int]) -> None:
        """After the last layer: each sequence has its new tokens' k/v cached, so it moves on."""
        for s, r0, r1 in zip(self.states, self.bounds[:-1], self.bounds[1:]):
            s.pos += int(r1 - r0)
            s.tokens.extend(tokens[r0:r1])
