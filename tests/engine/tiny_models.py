"""Tiny random decoder models and a GGUF writer that mirrors llama.cpp's converter.

Used by the engine tests (which read the GGUF files) and by
``scripts/make_reference_fixtures.py`` (which runs the same weights through transformers' own
model classes). Needs numpy and gguf; the file is written by the engine's one GGUF writer
(pantheon_ocr/engine/format/writer.py) with the names of format/names.py.

    hf_config, state_dict = make_tiny("mistral")
    write_gguf(tmp_path / "m.gguf", "mistral", hf_config, state_dict, dtype="Q8_0")

``state_dict`` uses the names of an HF checkpoint on the hub (what ``convert_hf_to_gguf.py``
reads), e.g. ``model.layers.0.self_attn.q_proj.weight`` and, for Mixtral,
``model.layers.0.block_sparse_moe.experts.3.w1.weight``. All values are float32.

Exactly representable weights: every matrix that may be stored in a non-F32 type (all 2-D
weights except the MoE router, plus the 3-D expert stacks) is built so that each block of 32
values along the input dimension is ``2**e * q`` with integer ``|q| <= 127`` and one ``|q| == 127``.
Such values survive F16, BF16 and Q8_0 storage bit-exactly (Q8_0: d = amax/127 = 2**e exactly,
q = x/d exactly), so the transformers reference logits computed from ``state_dict`` hold for a
GGUF written with any ``dtype``. Norm weights and biases are rounded to bf16 (they stay F32 in
the file, like the converter does).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q

from pantheon_ocr.engine.format import names as N
from pantheon_ocr.engine.format import writer
from pantheon_ocr.engine.format.writer import permute_qk, unpermute_qk  # noqa: F401  (tests use them from here)

ARCHS = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3")

# HF architecture -> general.architecture written by llama.cpp's converter.
GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",  # there is no "mistral" arch in llama.cpp
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
}

HF_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}

SEEDS = {"llama": 1001, "mistral": 1002, "mixtral": 1003, "qwen2": 1004, "qwen3": 1005, "phi3": 1006}

DTYPES = ("F32", "F16", "BF16", "Q8_0")  # the weights are exactly representable in each
LOSSY_DTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")  # not: for tests of 4- and 5-bit storage (test_int4_weights.py)

# ---------------------------------------------------------------------------------------------
# Tokenizer: minimal byte-level BPE (tokenizer.ggml.model = gpt2, pre = qwen2)
# ---------------------------------------------------------------------------------------------

N_VOCAB = 320

# Merges in GPT-2 byte-unicode spelling ("Ġ" = space, "Ċ" = newline); rank = index.
TINY_MERGES = (
    "Ġ t", "h e", "i n", "e r", "a n", "o n", "Ġ a", "r e", "Ġt he", "i s",
    "e n", "o r", "Ġ s", "Ġ w", "a t", "i t", "e s", "Ġ o", "Ġ c", "n d",
    "Ġ i", "in g", "Ġ b", "Ġt h", "l l", "Ċ Ċ",
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# gguf TokenType values (constants.py): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tiny_vocab(n_vocab: int = N_VOCAB) -> dict[str, Any]:
    """tokens / token types / merges / special ids of the tiny byte-level BPE vocabulary.

    Ids 0..255 are the 256 bytes (id == byte value), then one token per merge, then the special
    tokens (CONTROL), then ``[PAD{i}]`` (UNUSED) up to ``n_vocab`` -- as the converter pads.
    """
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [TOKEN_NORMAL] * 256
    for merge in TINY_MERGES:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens, merge
        tokens.append(left + right)
        types.append(TOKEN_NORMAL)
    assert len(set(tokens)) == len(tokens)
    special_ids = {}
    for tok in SPECIAL_TOKENS:
        special_ids[tok] = len(tokens)
        tokens.append(tok)
        types.append(TOKEN_CONTROL)
    if len(tokens) > n_vocab:
        raise ValueError(f"n_vocab {n_vocab} < {len(tokens)} real tokens")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(TOKEN_UNUSED)
    return {
        "tokens": tokens,
        "token_type": types,
        "merges": list(TINY_MERGES),
        "bos_token_id": special_ids["<|endoftext|>"],
        "eos_token_id": special_ids["<|im_end|>"],
        "padding_token_id": special_ids["<|endoftext|>"],
        "special_ids": special_ids,
        "n_real": 256 + len(TINY_MERGES) + len(SPECIAL_TOKENS),
    }


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------


def _base_config(arch: str) -> dict[str, Any]:
    voc = tiny_vocab()
    return {
        "architectures": [HF_ARCHITECTURE[arch]],
        "model_type": arch,
        "vocab_size": N_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": voc["bos_token_id"],
        "eos_token_id": voc["eos_token_id"],
        "pad_token_id": voc["padding_token_id"],
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }


def tiny_config(arch: str) -> dict[str, Any]:
    """The HF ``config.json`` dict of the tiny model for ``arch``."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    c = _base_config(arch)
    if arch == "llama":
        # GQA 8 -> 2 (4 query heads per KV head), head_dim 8, 3 layers, tied output head (no output.weight)
        c.update(num_attention_heads=8, num_key_value_heads=2, head_dim=8, num_hidden_layers=3,
                 tie_word_embeddings=True, attention_bias=False, mlp_bias=False)
    elif arch == "mistral":
        # sliding window 8: a 24-token test sequence wraps the KV ring several times
        c.update(num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                 rope_theta=1_000_000.0)
    elif arch == "mixtral":
        c.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, rope_theta=1_000_000.0,
                 sliding_window=None, router_jitter_noise=0.0, output_router_logits=False)
    elif arch == "qwen2":
        # Q/K/V biases (always on in Qwen2), no sliding window
        c.update(rms_norm_eps=1e-6, rope_theta=1_000_000.0, use_sliding_window=False, sliding_window=None,
                 max_window_layers=2)
    elif arch == "qwen3":
        # q/k RMSNorm per head; head_dim 32 != hidden_size / num_heads = 16
        c.update(head_dim=32, rms_norm_eps=1e-6, rope_theta=1_000_000.0, attention_bias=False,
                 use_sliding_window=False, sliding_window=None, max_window_layers=2)
    elif arch == "phi3":
        # partial rotary: rope.dimension_count = 0.5 * 16 = 8 < head_dim 16; fused qkv and gate_up
        c.update(partial_rotary_factor=0.5, original_max_position_embeddings=2048, sliding_window=None,
                 resid_pdrop=0.0, embd_pdrop=0.0)
    return c


def head_dim_of(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    n = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    n = ((n + 0x7FFF + ((n >> 16) & 1)) >> 16) << 16
    return n.astype(np.uint32).view(np.float32)


def exact_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """Round ``x`` so every 32-block along the last axis is ``2**e * q`` (int |q| <= 127, max |q| == 127).

    Exact in F16, BF16 and Q8_0 (see the module docstring).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of {block}")
    b = x.reshape(-1, block)
    amax = np.abs(b).max(axis=1, keepdims=True)
    amax = np.where(amax == 0, 1.0, amax)
    e = np.ceil(np.log2(amax / 127.0))
    scale = np.exp2(e)
    q = np.clip(np.round(b / scale), -127, 127)
    # force the largest element of each block to exactly +-127 so Q8_0's d = amax/127 = 2**e
    idx = np.abs(b).argmax(axis=1)
    rows = np.arange(b.shape[0])
    q[rows, idx] = np.where(b[rows, idx] < 0, -127.0, 127.0)
    out = (q * scale).astype(np.float32).reshape(x.shape)
    if np.any(np.abs(out[out != 0]) < 2.0**-24):
        raise ValueError("value below the float16 subnormal range")
    return out


def make_tiny(arch: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(hf_config, state_dict)`` of a seeded random tiny model (fresh copies on every call)."""
    cfg = tiny_config(arch)
    rng = np.random.default_rng(SEEDS[arch])
    n_embd = cfg["hidden_size"]
    n_ff = cfg["intermediate_size"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)
    n_vocab = cfg["vocab_size"]

    def mat(n_out: int, n_in: int, std: float | None = None) -> np.ndarray:
        std = (1.0 / np.sqrt(n_in)) if std is None else std
        return exact_blocks(rng.normal(0.0, std, size=(n_out, n_in)))

    def norm(n: int) -> np.ndarray:
        return round_bf16(1.0 + 0.1 * rng.normal(size=n))

    def bias(n: int) -> np.ndarray:
        return round_bf16(0.1 * rng.normal(size=n))

    sd: dict[str, np.ndarray] = {}
    sd["model.embed_tokens.weight"] = mat(n_vocab, n_embd, std=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(n_embd)
        sd[p + "post_attention_layernorm.weight"] = norm(n_embd)
        if arch == "phi3":
            sd[p + "self_attn.qkv_proj.weight"] = mat(n_head * hd + 2 * n_kv * hd, n_embd)
        else:
            sd[p + "self_attn.q_proj.weight"] = mat(n_head * hd, n_embd)
            sd[p + "self_attn.k_proj.weight"] = mat(n_kv * hd, n_embd)
            sd[p + "self_attn.v_proj.weight"] = mat(n_kv * hd, n_embd)
        if arch == "qwen2":
            sd[p + "self_attn.q_proj.bias"] = bias(n_head * hd)
            sd[p + "self_attn.k_proj.bias"] = bias(n_kv * hd)
            sd[p + "self_attn.v_proj.bias"] = bias(n_kv * hd)
        if arch == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = norm(hd)
            sd[p + "self_attn.k_norm.weight"] = norm(hd)
        sd[p + "self_attn.o_proj.weight"] = mat(n_embd, n_head * hd)
        if arch == "mixtral":
            n_exp = cfg["num_local_experts"]
            sd[p + "block_sparse_moe.gate.weight"] = mat(n_exp, n_embd)
            for e in range(n_exp):
                q = p + f"block_sparse_moe.experts.{e}."
                sd[q + "w1.weight"] = mat(n_ff, n_embd)  # gate
                sd[q + "w2.weight"] = mat(n_embd, n_ff)  # down
                sd[q + "w3.weight"] = mat(n_ff, n_embd)  # up
        elif arch == "phi3":
            sd[p + "mlp.gate_up_proj.weight"] = mat(2 * n_ff, n_embd)  # gate rows, then up rows
            sd[p + "mlp.down_proj.weight"] = mat(n_embd, n_ff)
        else:
            sd[p + "mlp.gate_proj.weight"] = mat(n_ff, n_embd)
            sd[p + "mlp.up_proj.weight"] = mat(n_ff, n_embd)
            sd[p + "mlp.down_proj.weight"] = mat(n_embd, n_ff)
    sd["model.norm.weight"] = norm(n_embd)
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = mat(n_vocab, n_embd)
    return copy.deepcopy(cfg), sd


def make_input_ids(arch: str, n_tokens: int = 24, seed: int = 7) -> np.ndarray:
    """Deterministic test prompt ids (int64) for the tiny models (avoids the [PAD] rows)."""
    rng = np.random.default_rng(seed + SEEDS[arch])
    return rng.integers(0, tiny_vocab()["n_real"], size=n_tokens).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# HF -> GGUF tensors (as llama.cpp's converter does it)
# ---------------------------------------------------------------------------------------------


_LAYER_MAP = {
    "input_layernorm.weight": N.ATTN_NORM,
    "post_attention_layernorm.weight": N.FFN_NORM,
    "self_attn.q_proj.weight": N.ATTN_Q,
    "self_attn.q_proj.bias": N.ATTN_Q_BIAS,
    "self_attn.k_proj.weight": N.ATTN_K,
    "self_attn.k_proj.bias": N.ATTN_K_BIAS,
    "self_attn.v_proj.weight": N.ATTN_V,
    "self_attn.v_proj.bias": N.ATTN_V_BIAS,
    "self_attn.o_proj.weight": N.ATTN_OUTPUT,
    "self_attn.q_norm.weight": N.ATTN_Q_NORM,
    "self_attn.k_norm.weight": N.ATTN_K_NORM,
    "self_attn.qkv_proj.weight": N.ATTN_QKV,  # phi3: fused, rows Q then K then V
    "mlp.gate_proj.weight": N.FFN_GATE,
    "mlp.up_proj.weight": N.FFN_UP,
    "mlp.gate_up_proj.weight": N.FFN_UP,  # phi3: fused, gate rows then up rows
    "mlp.down_proj.weight": N.FFN_DOWN,
    "block_sparse_moe.gate.weight": N.FFN_GATE_INP,
}
_TOP_MAP = {
    "model.embed_tokens.weight": N.TOKEN_EMBD,
    "model.norm.weight": N.OUTPUT_NORM,
    "lm_head.weight": N.OUTPUT,
}
_EXPERT_MERGED = {"w1": N.FFN_GATE_EXPS, "w2": N.FFN_DOWN_EXPS, "w3": N.FFN_UP_EXPS}
_EXPERT_SPLIT = {"w1": N.FFN_GATE, "w2": N.FFN_DOWN, "w3": N.FFN_UP}


def gguf_tensors(
    arch: str, hf_config: dict[str, Any], state_dict: dict[str, np.ndarray], *, experts: str = "merged"
) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array in numpy (row-major) layout, before storage conversion.

    Q/K weights and biases are row-permuted for the ``llama`` GGUF arch (llama, mistral,
    mixtral), as the converter does. Mixtral experts are stacked into 3-D ``ffn_*_exps``
    ``(n_expert, out, in)`` with ``experts="merged"`` (current converter) or written per
    expert as ``blk.N.ffn_gate.E.weight`` etc. with ``experts="split"`` (legacy files).
    """
    if experts not in ("merged", "split"):
        raise ValueError(f"experts must be 'merged' or 'split', not {experts!r}")
    permute = GGUF_ARCH[arch] == "llama"
    n_head = hf_config["num_attention_heads"]
    n_kv = hf_config.get("num_key_value_heads") or n_head
    out: dict[str, np.ndarray] = {}
    pending: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name in sorted(state_dict):
        arr = np.asarray(state_dict[name], dtype=np.float32)
        if name in _TOP_MAP:
            out[_TOP_MAP[name]] = arr
            continue
        if not name.startswith("model.layers."):
            raise ValueError(f"unexpected tensor {name!r}")
        rest = name[len("model.layers."):]
        bid_s, local = rest.split(".", 1)
        bid = int(bid_s)
        if local.startswith("block_sparse_moe.experts."):
            _, _, xid_s, wid, _ = local.split(".")
            pending.setdefault((bid, wid), {})[int(xid_s)] = arr
            continue
        if permute and local.startswith("self_attn.q_proj."):
            arr = permute_qk(arr, n_head)
        elif permute and local.startswith("self_attn.k_proj."):
            arr = permute_qk(arr, n_kv)
        if local not in _LAYER_MAP:
            raise ValueError(f"no GGUF name for {name!r}")
        out[N.blk(bid, _LAYER_MAP[local])] = arr
    n_exp = hf_config.get("num_local_experts")
    for (bid, wid), per in sorted(pending.items()):
        if sorted(per) != list(range(n_exp)):
            raise ValueError(f"layer {bid} {wid}: experts {sorted(per)} != 0..{n_exp - 1}")
        if experts == "merged":
            out[N.blk(bid, _EXPERT_MERGED[wid])] = np.stack([per[e] for e in range(n_exp)])
        else:
            for e in range(n_exp):
                out[N.blk(bid, N.expert(_EXPERT_SPLIT[wid], e))] = per[e]
    return out


def storage_type(name: str, ndim: int, dtype: str) -> str:
    """The converter's per-tensor type rule for ``--outtype dtype`` (conversion/base.py)."""
    if ndim <= 1 or name.endswith("_norm.weight"):
        return "F32"
    if name.endswith("." + N.FFN_GATE_INP) or not name.endswith(".weight"):
        return "F32"  # MoE router and biases stay F32
    return dtype


def _has_head_dim(arch: str, cfg: dict[str, Any]) -> bool:
    # The converter reads AutoConfig(...).to_dict(): LlamaConfig/MistralConfig always fill head_dim,
    # Qwen3Config has a default; MixtralConfig keeps None and Qwen2Config has no such field.
    return arch in ("llama", "mistral", "qwen3") or cfg.get("head_dim") is not None


def write_gguf(
    path: str | Path,
    arch: str,
    hf_config: dict[str, Any],
    state_dict: dict[str, np.ndarray],
    *,
    dtype: str = "F32",
    experts: str = "merged",
) -> Path:
    """Write the tiny model as llama.cpp's converter would (``--outtype`` = dtype).

    Differences from the converter, on purpose:
    - mistral: the converter drops ``sliding_window``; we write it as ``llama.attention.sliding_window``
      (u32), which is our engine's convention for Mistral-style SWA on the llama arch.
    - ``experts="split"`` writes the legacy per-expert names the current converter no longer emits.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}")
    if dtype not in DTYPES + LOSSY_DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES + LOSSY_DTYPES}")
    garch = GGUF_ARCH[arch]
    cfg = hf_config
    n_embd = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    hd = head_dim_of(cfg)
    key = lambda name: N.arch_key(garch, name)  # noqa: E731
    meta = writer.general_metadata(N.TYPE_MODEL, f"tiny-{arch}")
    if garch == "phi3":
        # conversion/phi.py Phi3MiniModel.set_gguf_parameters (no call to the common writer)
        rot_pct = cfg.get("partial_rotary_factor", 1.0)
        meta |= {
            key(N.CONTEXT_LENGTH): cfg["max_position_embeddings"],
            key(N.ROPE_SCALING_ORIG_CTX): cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"]),
            key(N.EMBEDDING_LENGTH): n_embd, key(N.FEED_FORWARD_LENGTH): cfg["intermediate_size"],
            key(N.BLOCK_COUNT): cfg["num_hidden_layers"], key(N.HEAD_COUNT): n_head, key(N.HEAD_COUNT_KV): n_kv,
            key(N.RMS_EPS): float(cfg["rms_norm_eps"]), key(N.ROPE_DIMENSION_COUNT): int(rot_pct * n_embd) // n_head,
            key(N.ROPE_FREQ_BASE): float(cfg["rope_theta"]), N.FILE_TYPE: writer.FILE_TYPES[dtype],
            # 0 when config has none: llama.cpp then runs Phi-3 with full causal attention
            key(N.SLIDING_WINDOW): cfg.get("sliding_window") or 0,
        }
    else:
        # conversion/base.py TextModel.set_gguf_parameters
        meta |= writer.decoder_metadata(
            garch, n_layer=cfg["num_hidden_layers"], n_ctx=cfg["max_position_embeddings"], n_embd=n_embd,
            n_ff=cfg["intermediate_size"], n_head=n_head, n_head_kv=n_kv, rope_base=cfg["rope_theta"],
            eps=cfg["rms_norm_eps"], n_expert=cfg.get("num_local_experts"),
            n_expert_used=cfg.get("num_experts_per_tok"), head_dim=hd if _has_head_dim(arch, cfg) else None)
        meta[N.FILE_TYPE] = writer.FILE_TYPES[dtype]
        if garch == "llama":
            # conversion/llama.py LlamaModel.set_gguf_parameters
            meta[key(N.VOCAB_SIZE)] = cfg["vocab_size"]
            meta[key(N.ROPE_DIMENSION_COUNT)] = hd
        if arch == "mistral" and cfg.get("sliding_window"):
            # NOT written by llama.cpp's converter (it drops Mistral's sliding_window). Our engine's
            # convention: llama.attention.sliding_window (u32) = HF sliding_window, i.e. a query at
            # position p attends to keys p-W+1 .. p (W keys including itself).
            meta[key(N.SLIDING_WINDOW)] = int(cfg["sliding_window"])
    meta[N.QUANTIZATION_VERSION] = writer.QUANT_VERSION

    # tokenizer (conversion/base.py _set_vocab_gpt2 + gguf.SpecialVocab)
    voc = tiny_vocab(cfg["vocab_size"])
    meta |= writer.tokenizer_metadata(voc["tokens"], voc["token_type"], voc["merges"], bos=voc["bos_token_id"],
                                      eos=voc["eos_token_id"], pad=voc["padding_token_id"],
                                      chat_template=TINY_CHAT_TEMPLATE)
    tensors = [(name, arr, Q[storage_type(name, arr.ndim, dtype)])
               for name, arr in gguf_tensors(arch, cfg, state_dict, experts=experts).items()]
    return writer.write_gguf(path, garch, meta, tensors)


def write_tiny(path: str | Path, arch: str, **kwargs: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``make_tiny(arch)`` + ``write_gguf(path, ...)``; returns ``(hf_config, state_dict)``."""
    cfg, sd = make_tiny(arch)
    write_gguf(path, arch, cfg, sd, **kwargs)
    return cfg, sd


def state_dict_digest(state_dict: dict[str, np.ndarray]) -> str:
    """SHA-256 over sorted names, shapes and float32 bytes: ties a fixture to the weights it was made from."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state_dict):
        arr = np.ascontiguousarray(state_dict[name], dtype=np.float32)
        h.update(name.encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()
