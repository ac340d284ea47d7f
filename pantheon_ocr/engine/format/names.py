"""The names in the GGUF files we read and write: tensor names and metadata keys, one table.

Spelled as llama.cpp's converter writes them (shared/spec/gguf-layout.md): a LightOnOCR pair is a
`qwen3` text GGUF (`token_embd.weight`, `blk.N.attn_q.weight`, ...) and a `clip` mmproj GGUF
(`v.patch_embd.weight`, `v.blk.N.ln1.weight`, ..., `mm.patch_merger.weight`, `mm.1.weight`,
`clip.vision.*` keys). The other decoders the engine runs (llama, mistral, mixtral, qwen2, phi3)
use the same per-block names, some of them fused or merged. `pantheon.reader.*` are our own keys
(how a trained reader wants its pages). Plain data (the standard library only): nothing here
reads or writes a file.

    blk(3, ATTN_Q)              "blk.3.attn_q.weight"
    v_blk(0, V_ATTN_OUT_BIAS)   "v.blk.0.attn_out.bias"
    arch_key("qwen3", BLOCK_COUNT)  "qwen3.block_count"
"""

from __future__ import annotations

import re

# -- metadata: general.* --------------------------------------------------------------------------
ARCHITECTURE = "general.architecture"
ALIGNMENT = "general.alignment"
TYPE = "general.type"  # TYPE_MODEL or TYPE_MMPROJ
NAME = "general.name"
SIZE_LABEL = "general.size_label"
LICENSE = "general.license"
FILE_TYPE = "general.file_type"  # llama.cpp's LlamaFileType: a label, per-tensor types decide
QUANTIZATION_VERSION = "general.quantization_version"

TYPE_MODEL = "model"
TYPE_MMPROJ = "mmproj"
ARCH_QWEN3 = "qwen3"  # LightOnOCR's text decoder
ARCH_CLIP = "clip"  # every mmproj

# -- metadata: text decoder hyper-parameters, "<arch>.<key>" (arch_key) ---------------------------
BLOCK_COUNT = "block_count"
CONTEXT_LENGTH = "context_length"
EMBEDDING_LENGTH = "embedding_length"
FEED_FORWARD_LENGTH = "feed_forward_length"
HEAD_COUNT = "attention.head_count"
HEAD_COUNT_KV = "attention.head_count_kv"
KEY_LENGTH = "attention.key_length"  # head_dim, where it is not n_embd / n_head (qwen3)
VALUE_LENGTH = "attention.value_length"
RMS_EPS = "attention.layer_norm_rms_epsilon"
SLIDING_WINDOW = "attention.sliding_window"
ROPE_FREQ_BASE = "rope.freq_base"
ROPE_DIMENSION_COUNT = "rope.dimension_count"
ROPE_SCALING_TYPE = "rope.scaling.type"
ROPE_SCALING_FACTOR = "rope.scaling.factor"
ROPE_SCALING_ORIG_CTX = "rope.scaling.original_context_length"
EXPERT_COUNT = "expert_count"
EXPERT_USED_COUNT = "expert_used_count"
VOCAB_SIZE = "vocab_size"


def arch_key(arch: str, key: str) -> str:
    """A decoder key of architecture `arch`: arch_key("qwen3", BLOCK_COUNT) = "qwen3.block_count"."""
    return f"{arch}.{key}"


# -- metadata: tokenizer --------------------------------------------------------------------------
TOKENIZER_PREFIX = "tokenizer.ggml."
TOKENIZER_MODEL = "tokenizer.ggml.model"  # gpt2 (byte-level BPE) or llama (SentencePiece)
TOKENIZER_PRE = "tokenizer.ggml.pre"
TOKENS = "tokenizer.ggml.tokens"
TOKEN_TYPE = "tokenizer.ggml.token_type"
MERGES = "tokenizer.ggml.merges"
SCORES = "tokenizer.ggml.scores"
BOS_ID = "tokenizer.ggml.bos_token_id"
EOS_ID = "tokenizer.ggml.eos_token_id"
UNKNOWN_ID = "tokenizer.ggml.unknown_token_id"
PADDING_ID = "tokenizer.ggml.padding_token_id"
EOT_ID = "tokenizer.ggml.eot_token_id"
EOM_ID = "tokenizer.ggml.eom_token_id"
ADD_BOS = "tokenizer.ggml.add_bos_token"
ADD_EOS = "tokenizer.ggml.add_eos_token"
ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
CHAT_TEMPLATE = "tokenizer.chat_template"

# -- metadata: mmproj (clip) ----------------------------------------------------------------------
CLIP_HAS_VISION_ENCODER = "clip.has_vision_encoder"
CLIP_PROJECTOR_TYPE = "clip.projector_type"  # PROJECTOR_LIGHTONOCR
CLIP_USE_SILU = "clip.use_silu"
CLIP_USE_GELU = "clip.use_gelu"
PROJECTOR_LIGHTONOCR = "lightonocr"

CLIP_VISION = "clip.vision."  # prefix of the vision tower's keys (vision_key)
V_PROJECTION_DIM = "clip.vision.projection_dim"  # = the text model's embedding_length
V_IMAGE_SIZE = "clip.vision.image_size"  # also the longest-edge preprocessing target
V_PREPROC_IMAGE_SIZE = "clip.vision.preproc_image_size"  # optional override of that target
V_PATCH_SIZE = "clip.vision.patch_size"
V_EMBEDDING_LENGTH = "clip.vision.embedding_length"
V_FEED_FORWARD_LENGTH = "clip.vision.feed_forward_length"
V_BLOCK_COUNT = "clip.vision.block_count"
V_HEAD_COUNT = "clip.vision.attention.head_count"
V_EPS = "clip.vision.attention.layer_norm_epsilon"
V_ROPE_FREQ_BASE = "clip.vision.rope.freq_base"  # not written by the converter (10000 then)
V_SPATIAL_MERGE_SIZE = "clip.vision.spatial_merge_size"
V_IMAGE_MEAN = "clip.vision.image_mean"
V_IMAGE_STD = "clip.vision.image_std"


def vision_key(name: str) -> str:
    """vision_key("patch_size") = "clip.vision.patch_size"."""
    return CLIP_VISION + name


# -- metadata: ours (a trained reader's mmproj) ---------------------------------------------------
READER_SEGMENT = "pantheon.reader.segment"  # page, blocks or lines
READER_LINE_HEIGHT = "pantheon.reader.line_height"
READER_PAGE_EDGE = "pantheon.reader.page_edge"
READER_LINE_WIDTH = "pantheon.reader.line_width"
READER_LINE_STRETCH = "pantheon.reader.line_stretch"  # a line crop's width scale
READER_LINE_STRETCH_RANGE = (0.5, 2.0)

# -- tensors: text GGUF ---------------------------------------------------------------------------
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"  # absent when tied to token_embd (LightOnOCR)
OUTPUT_NORM = "output_norm.weight"
ROPE_FREQS = "rope_freqs.weight"  # llama-3 style per-frequency divisors (optional)

BLK = "blk.{i}.{name}"  # a decoder block's tensor (blk)
ATTN_NORM = "attn_norm.weight"
ATTN_Q = "attn_q.weight"
ATTN_K = "attn_k.weight"
ATTN_V = "attn_v.weight"
ATTN_OUTPUT = "attn_output.weight"
ATTN_Q_BIAS = "attn_q.bias"  # qwen2
ATTN_K_BIAS = "attn_k.bias"
ATTN_V_BIAS = "attn_v.bias"
ATTN_OUTPUT_BIAS = "attn_output.bias"
ATTN_Q_NORM = "attn_q_norm.weight"  # qwen3: per-head RMSNorm of Q and K
ATTN_K_NORM = "attn_k_norm.weight"
ATTN_QKV = "attn_qkv.weight"  # phi3: fused, rows Q then K then V
ATTN_QKV_BIAS = "attn_qkv.bias"
FFN_NORM = "ffn_norm.weight"
FFN_GATE = "ffn_gate.weight"
FFN_UP = "ffn_up.weight"  # phi3: fused, gate rows then up rows
FFN_DOWN = "ffn_down.weight"
FFN_GATE_INP = "ffn_gate_inp.weight"  # mixtral: the router
FFN_GATE_EXPS = "ffn_gate_exps.weight"  # mixtral: experts merged [E, out, in]
FFN_UP_EXPS = "ffn_up_exps.weight"
FFN_DOWN_EXPS = "ffn_down_exps.weight"

# A Qwen3 (LightOnOCR) block, in the order the converter writes it (sorted by Hugging Face name).
QWEN3_BLOCK = (ATTN_NORM, FFN_DOWN, FFN_GATE, FFN_UP, FFN_NORM, ATTN_K_NORM, ATTN_K, ATTN_OUTPUT, ATTN_Q_NORM,
               ATTN_Q, ATTN_V)


def blk(i: int, name: str) -> str:
    """blk(3, ATTN_Q) = "blk.3.attn_q.weight"."""
    return BLK.format(i=i, name=name)


def expert(name: str, e: int) -> str:
    """The legacy per-expert name of a block tensor: expert(FFN_GATE, 2) = "ffn_gate.2.weight"."""
    base, suffix = name.rsplit(".", 1)
    return f"{base}.{e}.{suffix}"


# -- tensors: mmproj GGUF (Pixtral vision tower + LightOnOCR projector) ---------------------------
V_PATCH_EMBD = "v.patch_embd.weight"  # the patch convolution [D, 3, p, p]
V_PATCH_EMBD_BIAS = "v.patch_embd.bias"
V_PRE_LN = "v.pre_ln.weight"

V_BLK = "v.blk.{i}.{name}"  # a vision block's tensor (v_blk)
V_LN1 = "ln1.weight"  # attention RMSNorm
V_ATTN_Q = "attn_q.weight"  # rows permuted by the converter (adjacent RoPE pairs)
V_ATTN_K = "attn_k.weight"
V_ATTN_V = "attn_v.weight"
V_ATTN_OUT = "attn_out.weight"
V_ATTN_Q_BIAS = "attn_q.bias"
V_ATTN_K_BIAS = "attn_k.bias"
V_ATTN_V_BIAS = "attn_v.bias"
V_ATTN_OUT_BIAS = "attn_out.bias"
V_LN2 = "ln2.weight"  # FFN RMSNorm
V_FFN_GATE = "ffn_gate.weight"
V_FFN_UP = "ffn_up.weight"
V_FFN_DOWN = "ffn_down.weight"
V_FFN_GATE_BIAS = "ffn_gate.bias"
V_FFN_UP_BIAS = "ffn_up.bias"
V_FFN_DOWN_BIAS = "ffn_down.bias"

# A vision block, in the order the converter writes it.
PIXTRAL_BLOCK = (V_ATTN_K, V_ATTN_OUT, V_ATTN_Q, V_ATTN_V, V_LN1, V_FFN_DOWN, V_FFN_GATE, V_FFN_UP, V_LN2)

MM_INPUT_NORM = "mm.input_norm.weight"  # projector RMSNorm (text eps)
MM_PATCH_MERGER = "mm.patch_merger.weight"  # [D, D*s*s], input index channel*s*s + dy*s + dx
MM_1 = "mm.1.weight"  # linear_1
MM_1_BIAS = "mm.1.bias"
MM_2 = "mm.2.weight"  # linear_2
MM_2_BIAS = "mm.2.bias"

# The converter keeps these two F32 (F16 in an F16 file) whatever the file's type.
FULL_PRECISION = (V_PATCH_EMBD, MM_PATCH_MERGER)


def v_blk(i: int, name: str) -> str:
    """v_blk(0, V_LN1) = "v.blk.0.ln1.weight"."""
    return V_BLK.format(i=i, name=name)


_BLOCK = re.compile(r"(?:v\.)?blk\.(\d+)\.")


def block_index(name: str) -> int | None:
    """The block a tensor belongs to (`blk.N.` or `v.blk.N.`), None for the others."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None
