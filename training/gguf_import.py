"""Read an exported GGUF pair back into a torch Reader (the inverse of export.py), so training can
continue from the shipped weights: the committed checkpoint is the pair itself."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models

from .export import tensor_map
from .model import Reader, ReaderConfig
from .tokenizer import SPECIALS, _pre_tokenizer


def _pair(directory: Path) -> tuple[Path, Path]:
    ggufs = sorted(Path(directory).glob("*.gguf"))
    mmproj = [p for p in ggufs if p.name.startswith("mmproj")]
    text = [p for p in ggufs if p not in mmproj]
    if len(mmproj) != 1 or len(text) != 1:
        raise SystemExit(f"{directory}: expected one text GGUF and one mmproj-*.gguf, found {[p.name for p in ggufs]}")
    return text[0], mmproj[0]


def _fields(r: gguf.GGUFReader) -> dict:
    out = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = f.contents()
        except Exception:  # noqa: BLE001 - keys we do not need
            pass
    return out


def _tensors(r: gguf.GGUFReader) -> dict[str, np.ndarray]:
    out = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_pair(directory: Path) -> tuple[Reader, str]:
    """(model, tokenizer JSON) from a directory holding the exported text + mmproj GGUFs."""
    text_path, mmproj_path = _pair(directory)
    tr, vr = gguf.GGUFReader(text_path), gguf.GGUFReader(mmproj_path)
    t, v = _fields(tr), _fields(vr)
    for fields in (t, v):  # float32 in the file: back to the decimal the config was written with
        fields.update({k: float(f"{x:.7g}") for k, x in fields.items() if isinstance(x, float)})
    tokens = list(t["tokenizer.ggml.tokens"])
    cfg = ReaderConfig(
        v_dim=v["clip.vision.embedding_length"], v_layers=v["clip.vision.block_count"],
        v_heads=v["clip.vision.attention.head_count"], v_ff=v["clip.vision.feed_forward_length"],
        patch=v["clip.vision.patch_size"], v_eps=v["clip.vision.attention.layer_norm_epsilon"],
        merge=v["clip.vision.spatial_merge_size"],
        dim=t["qwen3.embedding_length"], layers=t["qwen3.block_count"], heads=t["qwen3.attention.head_count"],
        kv_heads=t["qwen3.attention.head_count_kv"], head_dim=t["qwen3.attention.key_length"],
        ff=t["qwen3.feed_forward_length"], eps=t["qwen3.attention.layer_norm_rms_epsilon"],
        rope_theta=t["qwen3.rope.freq_base"], vocab=len(tokens), n_ctx=t["qwen3.context_length"],
        line_height=v["pantheon.reader.line_height"], max_width=v["clip.vision.image_size"],
    )
    model = Reader(cfg)
    weights = {**_tensors(tr), **_tensors(vr)}
    text_entries, vision_entries = tensor_map(model)
    with torch.no_grad():
        for name, p, heads in text_entries + vision_entries:
            w = unpermute_rows(weights[name], heads) if heads else weights[name]
            p.copy_(torch.from_numpy(w).reshape(p.shape))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in t["tokenizer.ggml.merges"]]
    hf = Tokenizer(models.BPE(vocab={k: i for k, i in vocab.items() if k not in SPECIALS}, merges=merges))
    hf.pre_tokenizer = _pre_tokenizer()
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(SPECIALS))
    if [hf.token_to_id(s) for s in SPECIALS] != [vocab[s] for s in SPECIALS]:
        raise SystemExit(f"{text_path}: special tokens are not at the end of the vocabulary")
    return model, hf.to_str()


__all__ = ["load_pair", "unpermute_rows"]
