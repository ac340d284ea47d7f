"""GGUF metadata -> a frozen decoder config. One function builds it; every check names key and file.

Architecture names matter only here: the shared decoder reads capability flags (what the file
holds and how to use it), each computed once below with the reason beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ModelError
from .gguf import GGUFFile, meta, meta_array

# general.architecture values the engine runs; mistral and mixtral files say "llama".
DECODER_ARCHS = ("llama", "qwen2", "qwen3", "phi3")


@dataclass(frozen=True)
class DecoderConfig:
    arch: str  # for messages and the decoder registry; the decoder itself reads the flags
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int  # rotary dims (< head_dim for Phi-3's partial rotary)
    rope_base: float
    rope_neox: bool  # flag: split-half pairs; False = adjacent pairs (llama.cpp's permuted llama Q/K)
    rope_linear_scale: float  # positions are divided by this (rope.scaling.type = linear)
    eps: float
    n_vocab: int
    n_ctx: int
    sliding_window: int  # flag: 0 = full causal attention; else keys this far back are not seen
    n_expert: int  # flag: 0 = dense FFN; else a mixture of this many experts
    n_expert_used: int
    qkv_bias: bool  # flag: the Q/K/V projections carry biases
    qk_norm: bool  # flag: RMSNorm on every Q and K head before RoPE
    tied_embeddings: bool  # flag: the output head is the token embedding table

    @property
    def max_seq(self) -> int:
        """KV slots one sequence needs: the window for a ring buffer, else the context."""
        return min(self.sliding_window, self.n_ctx) if self.sliding_window else self.n_ctx


def decoder_config(gf: GGUFFile) -> DecoderConfig:
    arch = meta(gf, "general.architecture", str)
    if arch not in DECODER_ARCHS:
        raise ModelError(gf.path, f"unsupported architecture {arch!r} (supported: {', '.join(DECODER_ARCHS)})")

    def key(name, kind, default=...):
        return meta(gf, f"{arch}.{name}", kind) if default is ... else meta(gf, f"{arch}.{name}", kind, default)

    n_embd = key("embedding_length", int)
    n_head = key("attention.head_count", int)
    n_head_kv = key("attention.head_count_kv", int, n_head)
    head_dim = key("attention.key_length", int, n_embd // n_head if n_head else 0)
    n_rot = key("rope.dimension_count", int, head_dim)
    n_expert = key("expert_count", int, 0)
    tokens = meta_array(gf, "tokenizer.ggml.tokens", str, None)
    embd = gf.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelError(gf.path, "missing tensor 'token_embd.weight'")
    n_vocab = len(tokens) if tokens is not None else key("vocab_size", int, embd.shape[0])

    scaling = key("rope.scaling.type", str, "none")
    if scaling not in ("none", "linear"):
        raise ModelError(gf.path, f"unsupported rope scaling {scaling!r} in key '{arch}.rope.scaling.type'")
    cfg = DecoderConfig(
        arch=arch,
        n_layer=key("block_count", int),
        n_embd=n_embd,
        n_ff=key("feed_forward_length", int),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_base=key("rope.freq_base", float, 10000.0),
        # llama.cpp's converter permutes the Q/K rows of llama-arch files (mistral and mixtral
        # too) so that rotary pairs are adjacent; qwen2, qwen3 and phi3 files keep Hugging
        # Face's split-half pairs. Nothing in the file says which, so the architecture decides.
        rope_neox=arch != "llama",
        rope_linear_scale=key("rope.scaling.factor", float, 1.0) if scaling == "linear" else 1.0,
        eps=key("attention.layer_norm_rms_epsilon", float),
        n_vocab=n_vocab,
        n_ctx=key("context_length", int),
        # Phi-3 files carry a window that llama.cpp ignores (the model runs full attention);
        # only llama-arch files (mistral) opt in.
        sliding_window=key("attention.sliding_window", int, 0) if arch == "llama" else 0,
        # The rest is what the file holds: an expert count makes every FFN a mixture (mixtral);
        # Q/K/V biases (qwen2; phi3's fused ones), per-head Q/K norms (qwen3) and a separate
        # output head (none: tied to the token embeddings) are there or not.
        n_expert=n_expert,
        n_expert_used=key("expert_used_count", int) if n_expert else 0,
        qkv_bias="blk.0.attn_q.bias" in gf.tensors or "blk.0.attn_qkv.bias" in gf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gf.tensors,
        tied_embeddings="output.weight" not in gf.tensors,
    )
    _check(gf, cfg)
    return cfg


# Bounds on what a file may claim, generous next to any real model (LightOnOCR's decoder: 1024
# wide, 28 layers, heads of 128, 151,936 tokens, 40,960 positions). They stop a corrupt or hostile
# header before it sizes an allocation (a head of 2^31 dims is 8 GiB of rotary tables).
LIMITS = {"embedding_length": 1 << 16, "feed_forward_length": 1 << 20, "block_count": 1024, "attention.head_count": 1024,
          "attention.key_length": 1024, "context_length": 1 << 24, "vocabulary": 1 << 24, "expert_count": 1024,
          "attention.sliding_window": 1 << 24}


def in_range(gf: GGUFFile, key: str, value: int, lo: int, hi: int) -> None:
    """ModelError naming the key unless lo <= value <= hi."""
    if not lo <= value <= hi:
        raise ModelError(gf.path, f"metadata key {key!r} is {value}: it must be between {lo} and {hi:,}")


def positive_finite(gf: GGUFFile, key: str, value: float, hi: float = math.inf) -> None:
    if not (math.isfinite(value) and 0 < value < hi):
        raise ModelError(gf.path, f"metadata key {key!r} is {value}: it must be a finite number > 0"
                                  + ("" if hi == math.inf else f" and < {hi:g}"))


def _check_ranges(gf: GGUFFile, c: DecoderConfig) -> None:
    a = c.arch
    for name, value, lo in (("embedding_length", c.n_embd, 1), ("feed_forward_length", c.n_ff, 1), ("block_count", c.n_layer, 1),
                            ("attention.head_count", c.n_head, 1), ("attention.head_count_kv", c.n_head_kv, 1),
                            ("attention.key_length", c.head_dim, 1), ("context_length", c.n_ctx, 1),
                            ("attention.sliding_window", c.sliding_window, 0), ("expert_count", c.n_expert, 0)):
        in_range(gf, f"{a}.{name}", value, lo, LIMITS.get(name, LIMITS["attention.head_count"]))
    in_range(gf, "tokenizer.ggml.tokens (vocabulary size)", c.n_vocab, 1, LIMITS["vocabulary"])
    positive_finite(gf, f"{a}.rope.freq_base", c.rope_base)
    positive_finite(gf, f"{a}.attention.layer_norm_rms_epsilon", c.eps, 1.0)
    positive_finite(gf, f"{a}.rope.scaling.factor", c.rope_linear_scale)


def _check(gf: GGUFFile, c: DecoderConfig) -> None:
    _check_ranges(gf, c)
    a = c.arch
    problems = [  # the ranges are checked: counts are positive
        (c.n_head % c.n_head_kv, f"'{a}.attention.head_count' ({c.n_head}) is not a multiple of "
                                 f"'{a}.attention.head_count_kv' ({c.n_head_kv})"),
        (c.n_rot > c.head_dim or c.n_rot % 2, f"'{a}.rope.dimension_count' ({c.n_rot}) must be even and <= head dim {c.head_dim}"),
        (c.n_expert and not 0 < c.n_expert_used <= c.n_expert,
         f"'{a}.expert_used_count' ({c.n_expert_used}) must be in 1..'{a}.expert_count' ({c.n_expert})"),
        (gf.tensors["token_embd.weight"].shape != (c.n_vocab, c.n_embd),
         f"tensor 'token_embd.weight' has shape {list(gf.tensors['token_embd.weight'].shape)}, expected "
         f"[{c.n_vocab}, {c.n_embd}] from the vocabulary and '{a}.embedding_length'"),
    ]
    for bad, text in problems:
        if bad:
            raise ModelError(gf.path, text)
