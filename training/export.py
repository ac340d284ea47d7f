"""Export a trained reader to the GGUF pair llama.cpp's converter would write for LightOnOCR:
a `qwen3` text GGUF (with the tokenizer) and a `clip` mmproj GGUF (projector `lightonocr`).

    python -m training.export RUN_DIR/last.pt OUT_DIR [--name pantheon-reader]

Tensor names, layouts and metadata keys follow the converter: vision Q/K rows permuted so that
HF's split-half rotary pairs become adjacent pairs, 1-D tensors F32, matrices F16. Keys of our
own tell the pipeline how the reader wants its pages: `pantheon.reader.segment` (lines),
`pantheon.reader.line_height`, `pantheon.reader.page_edge` (the resolution pages are rendered at
before they are cut into lines) and, with --line-width, `pantheon.reader.line_width` (the widest
line read in one piece). The training-only CTC head is not exported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGUFValueType as V

from .model import Reader, ReaderConfig
from .tokenizer import PRE, Vocab

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image_pad|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PAGE_EDGE = 2200  # ~190 DPI for Letter: enough pixels to cut lines from, scaled down to 28 px


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: per head, split-half pairs (i, i+d/2) -> adjacent (2i, 2i+1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_map(model: Reader) -> tuple[list, list]:
    """(text, mmproj) lists of (GGUF name, parameter, heads to permute by or 0), in file order.
    The one table both directions use: export writes it, gguf_import reads it back."""
    d, v, pr, c = model.decoder, model.vision, model.projector, model.c
    text = [("token_embd.weight", d.embed_tokens.weight, 0)]
    for i, b in enumerate(d.layers):
        p = f"blk.{i}."
        text += [
            (p + "attn_norm.weight", b.input_layernorm.weight, 0),
            (p + "attn_q.weight", b.q_proj.weight, 0),  # qwen3: NeoX rotary, never permuted
            (p + "attn_k.weight", b.k_proj.weight, 0),
            (p + "attn_v.weight", b.v_proj.weight, 0),
            (p + "attn_output.weight", b.o_proj.weight, 0),
            (p + "attn_q_norm.weight", b.q_norm.weight, 0),
            (p + "attn_k_norm.weight", b.k_norm.weight, 0),
            (p + "ffn_norm.weight", b.post_attention_layernorm.weight, 0),
            (p + "ffn_gate.weight", b.mlp.gate_proj.weight, 0),
            (p + "ffn_up.weight", b.mlp.up_proj.weight, 0),
            (p + "ffn_down.weight", b.mlp.down_proj.weight, 0),
        ]
    text.append(("output_norm.weight", d.norm.weight, 0))
    vision = [("v.patch_embd.weight", v.patch_conv.weight, 0), ("v.pre_ln.weight", v.ln_pre.weight, 0)]
    for i, b in enumerate(v.layers):
        p = f"v.blk.{i}."
        vision += [
            (p + "attn_q.weight", b.q_proj.weight, c.v_heads),  # permuted like the converter does
            (p + "attn_k.weight", b.k_proj.weight, c.v_heads),
            (p + "attn_v.weight", b.v_proj.weight, 0),
            (p + "attn_out.weight", b.o_proj.weight, 0),
            (p + "ln1.weight", b.attention_norm.weight, 0),
            (p + "ln2.weight", b.ffn_norm.weight, 0),
            (p + "ffn_gate.weight", b.feed_forward.gate_proj.weight, 0),
            (p + "ffn_up.weight", b.feed_forward.up_proj.weight, 0),
            (p + "ffn_down.weight", b.feed_forward.down_proj.weight, 0),
        ]
    vision += [
        ("mm.input_norm.weight", pr.norm.weight, 0),
        ("mm.patch_merger.weight", pr.merging_layer.weight, 0),
        ("mm.1.weight", pr.linear_1.weight, 0),
        ("mm.2.weight", pr.linear_2.weight, 0),
    ]
    return text, vision


def _arrays(entries) -> list[tuple[str, np.ndarray]]:
    out = []
    for name, p, heads in entries:
        a = p.detach().float().cpu().numpy()
        out.append((name, permute_rows(a, heads) if heads else a))
    return out


def _write(path: Path, arch: str, kv: list, tensors: list[tuple[str, np.ndarray]], f16: bool) -> None:
    w = gguf.GGUFWriter(path, arch)
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, arr in tensors:
        store = arr.astype(np.float16) if f16 and arr.ndim >= 2 else arr.astype(np.float32)
        w.add_tensor(name, store)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export(model: Reader, vocab: Vocab, out_dir: Path, name: str = "pantheon-reader", f16: bool = True,
           page_edge: int = PAGE_EDGE, line_width: int = 0) -> tuple[Path, Path]:
    c = model.c
    out_dir.mkdir(parents=True, exist_ok=True)
    text_path, mmproj_path = out_dir / f"{name}.gguf", out_dir / f"mmproj-{name}.gguf"
    ft = 1 if f16 else 0  # LlamaFileType: ALL_F32 0, MOSTLY_F16 1
    text_entries, vision_entries = tensor_map(model)
    n_text = sum(p.numel() for _, p, _ in text_entries)
    text_kv = [
        ("general.type", "model", V.STRING, None),
        ("general.name", name, V.STRING, None),
        ("general.size_label", f"{n_text / 1e6:.0f}M", V.STRING, None),
        ("general.license", "apache-2.0", V.STRING, None),
        ("qwen3.block_count", c.layers, V.UINT32, None),
        ("qwen3.context_length", c.n_ctx, V.UINT32, None),
        ("qwen3.embedding_length", c.dim, V.UINT32, None),
        ("qwen3.feed_forward_length", c.ff, V.UINT32, None),
        ("qwen3.attention.head_count", c.heads, V.UINT32, None),
        ("qwen3.attention.head_count_kv", c.kv_heads, V.UINT32, None),
        ("qwen3.rope.freq_base", c.rope_theta, V.FLOAT32, None),
        ("qwen3.attention.layer_norm_rms_epsilon", c.eps, V.FLOAT32, None),
        ("qwen3.attention.key_length", c.head_dim, V.UINT32, None),
        ("qwen3.attention.value_length", c.head_dim, V.UINT32, None),
        ("general.file_type", ft, V.UINT32, None),
        ("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32, None),
        ("tokenizer.ggml.model", "gpt2", V.STRING, None),
        ("tokenizer.ggml.pre", PRE, V.STRING, None),
        ("tokenizer.ggml.tokens", vocab.tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", vocab.token_types(), V.ARRAY, V.INT32),
        ("tokenizer.ggml.merges", vocab.merges, V.ARRAY, V.STRING),
        ("tokenizer.ggml.eos_token_id", vocab.id("<|im_end|>"), V.UINT32, None),
        ("tokenizer.ggml.padding_token_id", vocab.id("<|endoftext|>"), V.UINT32, None),
        ("tokenizer.ggml.add_bos_token", False, V.BOOL, None),
        ("tokenizer.ggml.add_eos_token", False, V.BOOL, None),
        ("tokenizer.chat_template", CHAT_TEMPLATE, V.STRING, None),
    ]
    n_vis = sum(p.numel() for _, p, _ in vision_entries)
    mmproj_kv = [
        ("general.type", "mmproj", V.STRING, None),
        ("general.name", name, V.STRING, None),
        ("general.size_label", f"{n_vis / 1e6:.0f}M", V.STRING, None),
        ("general.license", "apache-2.0", V.STRING, None),
        ("general.file_type", ft, V.UINT32, None),
        ("clip.has_vision_encoder", True, V.BOOL, None),
        ("clip.vision.projection_dim", c.dim, V.UINT32, None),
        ("clip.vision.image_size", c.max_width, V.UINT32, None),
        ("clip.vision.patch_size", c.patch, V.UINT32, None),
        ("clip.vision.embedding_length", c.v_dim, V.UINT32, None),
        ("clip.vision.feed_forward_length", c.v_ff, V.UINT32, None),
        ("clip.vision.block_count", c.v_layers, V.UINT32, None),
        ("clip.vision.attention.head_count", c.v_heads, V.UINT32, None),
        ("clip.vision.image_mean", list(CLIP_MEAN), V.ARRAY, V.FLOAT32),
        ("clip.vision.image_std", list(CLIP_STD), V.ARRAY, V.FLOAT32),
        ("clip.projector_type", "lightonocr", V.STRING, None),
        ("clip.vision.attention.layer_norm_epsilon", c.v_eps, V.FLOAT32, None),
        ("clip.use_silu", True, V.BOOL, None),
        ("clip.vision.spatial_merge_size", c.merge, V.UINT32, None),
        ("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32, None),
        ("pantheon.reader.segment", "lines", V.STRING, None),
        ("pantheon.reader.line_height", c.line_height, V.UINT32, None),
        ("pantheon.reader.page_edge", page_edge, V.UINT32, None),
    ] + ([("pantheon.reader.line_width", line_width, V.UINT32, None)] if line_width else [])
    _write(text_path, "qwen3", text_kv, _arrays(text_entries), f16)
    _write(mmproj_path, "clip", mmproj_kv, _arrays(vision_entries), f16)
    return text_path, mmproj_path


def load_checkpoint(path: Path) -> tuple[Reader, Vocab]:
    from tempfile import TemporaryDirectory

    from . import tokenizer as tok

    state = torch.load(path, weights_only=False, map_location="cpu")
    model = Reader(ReaderConfig(**state["config"]))
    model.load_state_dict(state["model"])
    model.eval()
    with TemporaryDirectory() as d:
        p = Path(d) / "tokenizer.json"
        p.write_text(state["tokenizer"])
        vocab = tok.load(p)
    return model, vocab


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--name", default="pantheon-reader")
    ap.add_argument("--f32", action="store_true", help="float32 matrices (default F16)")
    ap.add_argument("--line-width", type=int, default=0,
                    help="pantheon.reader.line_width: lines wider than this (px) are read in pieces (0: any width)")
    a = ap.parse_args(argv)
    model, vocab = load_checkpoint(a.checkpoint)
    for p in export(model, vocab, a.out_dir, a.name, f16=not a.f32, line_width=a.line_width):
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
