"""Export a trained reader to the GGUF pair llama.cpp's converter would write for LightOnOCR:
a `qwen3` text GGUF (with the tokenizer) and a `clip` mmproj GGUF (projector `lightonocr`).

    python -m training.export RUN_DIR/last.pt OUT_DIR [--name pantheon-reader]
    python -m training.export pantheon_ocr/bundled/reader OUT_DIR --line-width 280 --line-stretch 1.12
        # an exported pair again, the same tensors, with other pantheon.reader.* keys

Tensor names, layouts and metadata keys follow the converter: vision Q/K rows permuted so that
HF's split-half rotary pairs become adjacent pairs, 1-D tensors F32, matrices F16. Keys of our
own tell the pipeline how the reader wants its pages: `pantheon.reader.segment` (lines),
`pantheon.reader.line_height`, `pantheon.reader.page_edge` (the resolution pages are rendered at
before they are cut into lines), with --line-width `pantheon.reader.line_width` (the widest line
read in one piece) and with --line-stretch `pantheon.reader.line_stretch` (a line crop drawn that
much wider than the page shows it: measured per reader, dev set CER at 1.0 against 1.12). The
training-only CTC head is not exported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from pantheon_ocr.engine.format import names as N
from pantheon_ocr.engine.format import writer
from pantheon_ocr.engine.format.writer import permute_qk

from .model import Reader, ReaderConfig
from .tokenizer import PRE, Vocab

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image_pad|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PAGE_EDGE = 2200  # ~190 DPI for Letter: enough pixels to cut lines from, scaled down to 28 px
LICENSE = "apache-2.0"
permute_rows = permute_qk  # llama.cpp's LlamaModel.permute (format/writer.py)


def tensor_map(model: Reader) -> tuple[list, list]:
    """(text, mmproj) lists of (GGUF name, parameter, heads to permute by or 0), in file order.
    The one table both directions use: export writes it, gguf_import reads it back."""
    d, v, pr, c = model.decoder, model.vision, model.projector, model.c
    text = [(N.TOKEN_EMBD, d.embed_tokens.weight, 0)]
    for i, b in enumerate(d.layers):
        text += [(N.blk(i, name), p, 0) for name, p in (  # qwen3: NeoX rotary, Q/K never permuted
            (N.ATTN_NORM, b.input_layernorm.weight), (N.ATTN_Q, b.q_proj.weight), (N.ATTN_K, b.k_proj.weight),
            (N.ATTN_V, b.v_proj.weight), (N.ATTN_OUTPUT, b.o_proj.weight), (N.ATTN_Q_NORM, b.q_norm.weight),
            (N.ATTN_K_NORM, b.k_norm.weight), (N.FFN_NORM, b.post_attention_layernorm.weight),
            (N.FFN_GATE, b.mlp.gate_proj.weight), (N.FFN_UP, b.mlp.up_proj.weight),
            (N.FFN_DOWN, b.mlp.down_proj.weight))]
    text.append((N.OUTPUT_NORM, d.norm.weight, 0))
    vision = [(N.V_PATCH_EMBD, v.patch_conv.weight, 0), (N.V_PRE_LN, v.ln_pre.weight, 0)]
    for i, b in enumerate(v.layers):
        ffn = b.feed_forward
        vision += [(N.v_blk(i, name), p, heads) for name, p, heads in (
            (N.V_ATTN_Q, b.q_proj.weight, c.v_heads),  # permuted like the converter does
            (N.V_ATTN_K, b.k_proj.weight, c.v_heads), (N.V_ATTN_V, b.v_proj.weight, 0),
            (N.V_ATTN_OUT, b.o_proj.weight, 0), (N.V_LN1, b.attention_norm.weight, 0),
            (N.V_LN2, b.ffn_norm.weight, 0), (N.V_FFN_GATE, ffn.gate_proj.weight, 0),
            (N.V_FFN_UP, ffn.up_proj.weight, 0), (N.V_FFN_DOWN, ffn.down_proj.weight, 0))]
    vision += [
        (N.MM_INPUT_NORM, pr.norm.weight, 0),
        (N.MM_PATCH_MERGER, pr.merging_layer.weight, 0),
        (N.MM_1, pr.linear_1.weight, 0),
        (N.MM_2, pr.linear_2.weight, 0),
    ]
    return text, vision


def _tensors(entries, f16: bool) -> list[tuple[str, np.ndarray, Q]]:
    """(name, float32 values, type): matrices F16 (F32 with f16=False), 1-D tensors F32."""
    out = []
    for name, p, heads in entries:
        a = p.detach().float().cpu().numpy()
        out.append((name, permute_qk(a, heads) if heads else a, Q.F16 if f16 and a.ndim >= 2 else Q.F32))
    return out


def export(model: Reader, vocab: Vocab, out_dir: Path, name: str = "pantheon-reader", f16: bool = True,
           page_edge: int = PAGE_EDGE, line_width: int = 0, line_stretch: float = 1.0) -> tuple[Path, Path]:
    c = model.c
    out_dir.mkdir(parents=True, exist_ok=True)
    text_path, mmproj_path = out_dir / f"{name}.gguf", out_dir / f"mmproj-{name}.gguf"
    ft = writer.FILE_TYPES["F16" if f16 else "F32"]
    text_entries, vision_entries = tensor_map(model)
    n_text = sum(p.numel() for _, p, _ in text_entries)
    tokenizer = writer.tokenizer_metadata(vocab.tokens, vocab.token_types(), vocab.merges, eos=vocab.id("<|im_end|>"),
                                          pad=vocab.id("<|endoftext|>"), chat_template=CHAT_TEMPLATE, pre=PRE)
    text_meta = writer.text_metadata(
        writer.general_metadata(N.TYPE_MODEL, name, writer.size_label(n_text), LICENSE), ft, tokenizer,
        n_layer=c.layers, n_ctx=c.n_ctx, n_embd=c.dim, n_ff=c.ff, n_head=c.heads, n_head_kv=c.kv_heads,
        head_dim=c.head_dim, rope_base=c.rope_theta, eps=c.eps)
    n_vis = sum(p.numel() for _, p, _ in vision_entries)
    mmproj_meta = writer.mmproj_metadata(
        writer.general_metadata(N.TYPE_MMPROJ, name, writer.size_label(n_vis), LICENSE), ft,
        projection_dim=c.dim, image_size=c.max_width, patch_size=c.patch, n_embd=c.v_dim, n_ff=c.v_ff,
        n_layer=c.v_layers, n_head=c.v_heads, eps=c.v_eps, merge=c.merge,
        reader=writer.reader_metadata("lines", c.line_height, page_edge, line_width, line_stretch))
    writer.write_gguf(text_path, N.ARCH_QWEN3, text_meta, _tensors(text_entries, f16))
    writer.write_gguf(mmproj_path, N.ARCH_CLIP, mmproj_meta, _tensors(vision_entries, f16))
    return text_path, mmproj_path


def load_checkpoint(path: Path) -> tuple[Reader, Vocab]:
    """A training checkpoint (.pt), or a directory holding an exported pair (gguf_import)."""
    from tempfile import TemporaryDirectory

    from . import tokenizer as tok

    if path.is_dir():
        from .gguf_import import load_pair

        model, tokenizer_json = load_pair(path)
    else:
        state = torch.load(path, weights_only=False, map_location="cpu")
        model = Reader(ReaderConfig(**state["config"]))
        model.load_state_dict(state["model"])
        tokenizer_json = state["tokenizer"]
    model.eval()
    with TemporaryDirectory() as d:
        p = Path(d) / "tokenizer.json"
        p.write_text(tokenizer_json)
        vocab = tok.load(p)
    return model, vocab


def _pair_hints(directory: Path) -> tuple[int, int, float]:
    """(page_edge, line_width, line_stretch) as an exported pair's mmproj names them."""
    from pantheon_ocr.engine.format.gguf import meta, open_gguf

    from .gguf_import import _pair

    gf = open_gguf(_pair(directory)[1])
    return (meta(gf, N.READER_PAGE_EDGE, int, PAGE_EDGE), meta(gf, N.READER_LINE_WIDTH, int, 0),
            round(meta(gf, N.READER_LINE_STRETCH, float, 1.0), 6))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="a training checkpoint (.pt) or a directory holding an exported pair")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--name", default="pantheon-reader")
    ap.add_argument("--f32", action="store_true", help="float32 matrices (default F16)")
    ap.add_argument("--line-width", type=int, default=None,
                    help="pantheon.reader.line_width: lines wider than this (px) are read in pieces (0: any width; "
                         "default 0, or an exported pair's own)")
    ap.add_argument("--line-stretch", type=float, default=None,
                    help="pantheon.reader.line_stretch: a line crop is drawn this much wider than the page shows it "
                         "(default 1, or an exported pair's own)")
    a = ap.parse_args(argv)
    model, vocab = load_checkpoint(a.checkpoint)
    page_edge, line_width, line_stretch = PAGE_EDGE, 0, 1.0
    if a.checkpoint.is_dir():  # an exported pair keeps its own hints unless the flags change them
        page_edge, line_width, line_stretch = _pair_hints(a.checkpoint)
    for p in export(model, vocab, a.out_dir, a.name, f16=not a.f32, page_edge=page_edge,
                    line_width=line_width if a.line_width is None else a.line_width,
                    line_stretch=line_stretch if a.line_stretch is None else a.line_stretch):
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
