"""Attention kernels in bfloat16 for CPUs with AVX-512 BF16 (csrc/bf16_attention.c, which says why),
built by native.Library into the user cache and called through ctypes: the vision tower's
attention (in SDPA's form, torch_vision's choice on a CPU without AMX tiles), a softmax over bfloat16
scores in place (torch_pixtral.query_block_attention), and a prompt chunk's causal attention over a
decoder's bfloat16 or int8 KV pool (torch_blocks.TorchBlocks.prompt_attention). Where the library does
not build or the CPU has no AVX-512 BF16, each is None and torch's runs.

    attend = compiled_full_attention()    # None, or a FullAttention
    out = attend(q, k, v, attn_mask=m)    # bfloat16 [B, H, N, D], m additive [B, 1, 1, N] or None
    softmax = compiled_softmax()          # None, or a function of a 2-D bfloat16 tensor
    p = softmax(scores)                   # scores [rows, cols] bfloat16, overwritten with their softmax
    attend = compiled_prompt_attention()  # None, or a PromptAttention
    out = attend(pool, layer, slot, pos0, q, scale=s)  # q [T, Hq, D] float32 at pos0.. -> [T, Hq, D]
"""

from __future__ import annotations

import ctypes

import numpy as np

from .common import cpu_has_amx, require_torch
from .native import BF16_SOURCE, Library

torch = require_torch()

NO_BF16 = "the CPU has no AVX-512 BF16"


def _check(rc: int, what: str, refused: str) -> None:
    """A kernel's return code: 0 fine, -2 out of memory, else it refused its arguments."""
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise ValueError(refused)


class CompiledSoftmax:
    """The library's softmax: `softmax(scores)` over the last axis of a contiguous 2-D bfloat16 tensor."""

    why = ""  # Library.build's line: "the compiled <ISA> softmax (path; threads)"

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        lib.softmax_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        lib.softmax_bf16.restype = lib.softmax_takes.restype = ctypes.c_int

    def __call__(self, scores):
        if scores.dtype != torch.bfloat16 or scores.dim() != 2 or not scores.is_contiguous():
            raise ValueError(f"scores must be a contiguous 2-D bfloat16 tensor, got {scores.dtype} {tuple(scores.shape)}")
        rc = self.lib.softmax_bf16(scores.data_ptr(), scores.shape[0], scores.shape[1], scores.shape[1],
                                   torch.get_num_threads())
        _check(rc, "softmax", f"softmax refused rows of {scores.shape[1]}")
        return scores


class FullAttention:
    """The library's vision attention: scaled_dot_product_attention (not causal) of bfloat16 q, k, v
    [B, H, N, D], with an optional additive key mask [B, 1, 1, N]; each row's scores, exponentials
    and sums in float32, its weights rounded to bfloat16 for the weighted values."""

    why = ""  # Library.build's line: "the compiled <ISA> vision attention (path; threads)"

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.full_attention.argtypes = [p, p, p, p, i64, p, i32, i32, ctypes.c_float, i32]
        lib.full_attention.restype = lib.prompt_attention_takes.restype = lib.softmax_takes.restype = i32
        lib.prompt_attention_takes.argtypes = [i32, i32, i32]

    def takes(self, heads: int, head_dim: int) -> bool:
        """Whether the kernel covers heads of this size on this CPU."""
        return bool(self.lib.prompt_attention_takes(heads, 1, head_dim))

    def __call__(self, q, k, v, attn_mask=None):
        if not (q.dtype == k.dtype == v.dtype == torch.bfloat16) or q.dim() != 4 or not q.shape == k.shape == v.shape:
            raise ValueError(f"q, k, v must be bfloat16 [B, H, N, D] of one shape, got {q.dtype} {tuple(q.shape)}, "
                             f"{k.dtype} {tuple(k.shape)}, {v.dtype} {tuple(v.shape)}")
        b, h, n, d = q.shape
        if not self.takes(h, d):
            raise ValueError(f"the vision attention does not take {h} heads of {d}")
        if attn_mask is not None and tuple(attn_mask.shape) != (b, 1, 1, n):
            raise ValueError(f"the mask must be additive [B, 1, 1, N] = {[b, 1, 1, n]}, got {list(attn_mask.shape)}")
        out = torch.empty(b, n, h, d, dtype=torch.bfloat16)  # the kernel's rows [N, H, D]: what o_proj reads
        for i in range(b):
            # [N, H, D]: the projections' rows as they are (a view; copied only if laid out otherwise)
            qi, ki, vi = (t[i].transpose(0, 1).contiguous() for t in (q, k, v))
            bias = None if attn_mask is None else attn_mask[i].reshape(n).float().contiguous()
            rc = self.lib.full_attention(qi.data_ptr(), ki.data_ptr(), vi.data_ptr(),
                                         None if bias is None else bias.data_ptr(), n, out[i].data_ptr(), h, d,
                                         d ** -0.5, torch.get_num_threads())
            _check(rc, "vision attention", f"the vision attention refused {n} rows of {h} x {d}")
        return out.transpose(1, 2)  # [B, H, N, D], as SDPA returns it


class PromptAttention:
    """The library's prompt attention: a chunk of one sequence's queries over its pool slot, causal."""

    KINDS = {"bfloat16": 0, "int8": 1}  # pool kind -> the kernel's code
    why = ""  # Library.build's line: "the compiled <ISA> prompt attention (path; threads)"

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.prompt_attention.argtypes = [i32, p, p, p, p, p, i64, i64, i64, i64, p, p, i32, i32, i32, ctypes.c_float, i32]
        lib.prompt_attention.restype = lib.prompt_attention_takes.restype = lib.softmax_takes.restype = i32
        lib.prompt_attention_takes.argtypes = [i32, i32, i32]

    def takes(self, n_head: int, n_kv: int, head_dim: int) -> bool:
        """Whether the kernel covers a decoder of these shapes on this CPU."""
        g = n_head // n_kv if n_kv else 0
        return g * n_kv == n_head and bool(self.lib.prompt_attention_takes(n_kv, g, head_dim))

    def __call__(self, pool, layer: int, slot: int, pos0: int, q, *, scale: float):
        """q [T, Hq, D] float32 at positions pos0 .. pos0+T-1, whose keys are already stored, over the
        first pos0 + T positions of `slot` in `layer` of `pool` (cache.KVPool, bfloat16 or int8)
        -> [T, Hq, D] float32, each query seeing the keys up to its own position."""
        if pool.kind not in self.KINDS:
            raise ValueError(f"the prompt attention takes a bfloat16 or int8 pool, not {pool.kind}")
        k, v = pool.k[layer], pool.v[layer]  # [slots, Hkv, cap, D]
        n_slots, hkv, cap, d = k.shape
        q = q.contiguous().float()
        if q.dim() != 3 or q.shape[2] != d or not self.takes(q.shape[1], hkv, d):
            raise ValueError(f"queries {tuple(q.shape)} do not fit {hkv} KV heads of {d}")
        t, hq = q.shape[:2]
        if not 0 <= slot < n_slots or pos0 < 0 or pos0 + t > cap:
            raise ValueError(f"positions {pos0}..{pos0 + t - 1} of slot {slot} are outside the pool's "
                             f"{n_slots} slots x {cap} positions")
        arrays = (k, v, *((pool.ks[layer], pool.vs[layer], pool.kc[layer]) if pool.quantized else ()))
        if not all(a.flags.c_contiguous for a in arrays):
            raise ValueError("the pool's layer must be C-contiguous")
        if pool.quantized and not (arrays[2].dtype == arrays[3].dtype == np.uint16 and arrays[4].dtype == np.float32):
            raise ValueError("an int8 pool's position scales must be bfloat16 bits (uint16), "
                             "its channel scales float32")
        ks, vs, kc = (a.ctypes.data for a in arrays[2:]) if pool.quantized else (None, None, None)
        out = torch.empty(q.shape)
        rc = self.lib.prompt_attention(self.KINDS[pool.kind], k.ctypes.data, v.ctypes.data, ks, vs, kc, cap, slot,
                                       pos0, t, q.data_ptr(), out.data_ptr(), hkv, hq // hkv, d, scale,
                                       torch.get_num_threads())
        _check(rc, "prompt attention", f"the prompt attention refused {t} queries at {pos0} (code {rc})")
        return out


BY_QUERY_BLOCKS = "torch's products by query blocks"
# the library's kernels, one source: what each is called, and what runs where it does not build
SOFTMAX = Library("bf16_attention", BF16_SOURCE, CompiledSoftmax, "softmax", "torch's softmax", "softmax_takes", NO_BF16)
FULL = Library("bf16_attention", BF16_SOURCE, FullAttention, "vision attention", BY_QUERY_BLOCKS, "softmax_takes",
               NO_BF16)
PROMPT = Library("bf16_attention", BF16_SOURCE, PromptAttention, "prompt attention", BY_QUERY_BLOCKS, "softmax_takes",
                 NO_BF16)
build, build_full_attention, build_prompt_attention = SOFTMAX.build, FULL.build, PROMPT.build  # (cache_dir, cc=None)
compiled_softmax = SOFTMAX.compiled  # this process's softmax, or None (torch's then runs)
# this process's vision attention, or None (torch's products by query blocks then run,
# torch_pixtral.query_block_attention)
compiled_full_attention = FULL.compiled
# this process's prompt attention, or None (torch's products by query blocks then run,
# torch_blocks.causal_block_attention)
compiled_prompt_attention = PROMPT.compiled


def prompt_attention_why() -> str:
    """One line: which attention a prompt chunk over a bfloat16 or int8 pool takes here, and why
    (torch_blocks.TorchBlocks.prompt_attend's choice before the decoder's heads are known)."""
    if cpu_has_amx():
        return "torch's fused kernel in bfloat16 (the CPU has AMX tiles)"
    built = PROMPT.compiled()
    return PROMPT.why() if built is None else f"{built.why}, where it takes the decoder's heads"
