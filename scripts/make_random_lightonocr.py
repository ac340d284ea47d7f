"""Write a LightOnOCR GGUF pair with RANDOM weights at the real LightOnOCR-1B shapes (benchmarks).

    python scripts/make_random_lightonocr.py OUT_DIR [--vision-layers 24] [--text-layers 28]
        [--dtype BF16|F16|Q8_0|F32|Q6_K|Q4_K_M|Q4_K_S] [--n-vocab 151936] [--seed 0]

writes OUT_DIR/lightonocr-1b-random-<dtype>.gguf (general.architecture = qwen3) and
OUT_DIR/mmproj-lightonocr-1b-random-<dtype>.gguf (clip, projector lightonocr), with exactly the
tensor names, ne orders, dtypes and metadata keys (and key value types) that llama.cpp's
converter writes for LightOnOCR-1B (checked against tests/fixtures/lightonocr-tiny/, which that
converter wrote). The tokenizer metadata (the real
151,936-entry Qwen vocabulary, merges, chat template) is copied from the tiny fixture's text.gguf.

Shapes (LightOnOCR-1B's config): vision 24 layers, hidden 1024, 16 heads, FFN 4096, patch 14, image
size 1540; projector merge 2 (4096 -> 1024 -> 1024 -> 1024); text Qwen3 28 layers, hidden 1024,
16 query / 8 KV heads, head_dim 128, FFN 3072, vocab 151936, tied embeddings (no output.weight).

Weights: matrices N(0, 1/fan_in) so activations keep their scale through the layers; norm
weights 1 + 0.02 N(0, 1); token embeddings 0.5 N(0, 1) as in the tiny fixture. Each tensor has its
own seed derived from its name, so files with fewer layers hold the same first layers.

Tests write tiny pairs with the same code: `make_pair(..., text={"n_embd": 256, ...}, vision={...})`
overrides the shapes (K-quants need rows that are multiples of 256), `n_vocab` below 151936 writes a
pruned vocabulary as LightOnOCR's 32k/16k variants have: the first regular tokens, the chat
prompt's words and the Qwen added tokens (renumbered), the merges among them, eos/padding ids
renumbered. K-quant types
(Q6_K, Q4_K_M, Q4_K_S) mix tensor types as llama-quantize does (scripts/quantize_gguf.py); their
mmproj is F16, as publishers ship it.

Memory stays low: tensor infos are declared first, then each tensor is generated and written in
row chunks of a few tens of MB (gguf.GGUFWriter streaming; the largest tensor, the 151936 x 1024
embedding, is never whole in memory). Dtypes follow the converter's rules: 1-D tensors and norms
F32; v.patch_embd and mm.patch_merger F32 (F16 when --dtype F16); every other matrix --dtype.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quantize_gguf  # noqa: E402  (scripts/: the K-quant encoders and llama-quantize's type rules)

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_TEXT = ROOT / "tests" / "fixtures" / "lightonocr-tiny" / "text.gguf"

# LightOnOCR-1B's shapes
VISION = dict(n_embd=1024, n_ff=4096, n_layer=24, n_head=16, patch=14, image_size=1540, eps=1e-5, merge=2)
TEXT = dict(n_embd=1024, n_ff=3072, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_vocab=151936,
            n_ctx=40960, rope_base=1e6, eps=1e-6)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

DTYPES = {"BF16": Q.BF16, "F16": Q.F16, "Q8_0": Q.Q8_0, "F32": Q.F32, "Q6_K": Q.Q6_K, "Q4_K_M": Q.Q4_K,
          "Q4_K_S": Q.Q4_K}
QWEN_ADDED = (151643, 151669)  # Qwen's added tokens <|endoftext|> .. </think>: kept by a pruned vocabulary
PROMPT_WORDS = ("system", "user", "assistant", "Ċ")  # and the chat prompt's words
TOKENIZER_KEYS = (  # copied from the fixture, with the value types the converter writes
    ("tokenizer.ggml.model", V.STRING, None),
    ("tokenizer.ggml.pre", V.STRING, None),
    ("tokenizer.ggml.tokens", V.ARRAY, V.STRING),
    ("tokenizer.ggml.token_type", V.ARRAY, V.INT32),
    ("tokenizer.ggml.merges", V.ARRAY, V.STRING),
    ("tokenizer.ggml.eos_token_id", V.UINT32, None),
    ("tokenizer.ggml.padding_token_id", V.UINT32, None),
    ("tokenizer.ggml.add_bos_token", V.BOOL, None),
    ("tokenizer.ggml.add_eos_token", V.BOOL, None),
    ("tokenizer.chat_template", V.STRING, None),
)
CHUNK_BYTES = 32 << 20  # float32 bytes generated per chunk


class Spec:
    """One tensor: numpy shape (rows, ..., cols), stored type, and how its values are drawn."""

    def __init__(self, name: str, shape: tuple[int, ...], qtype: Q, kind: str, fan_in: int = 1):
        self.name, self.shape, self.qtype, self.kind, self.fan_in = name, shape, qtype, kind, fan_in

    @property
    def n_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape[:-1])) * (self.shape[-1] // block) * size

    def chunks(self, seed: int):
        """Stored bytes of the tensor, a block of rows at a time."""
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        cols = self.shape[-1]
        rows = int(np.prod(self.shape[:-1]))
        step = max(1, CHUNK_BYTES // (4 * cols))
        for r in range(0, rows, step):
            n = min(step, rows - r)
            x = rng.standard_normal((n, cols), dtype=np.float32)
            if self.kind == "norm":
                x = 1.0 + 0.02 * x
            elif self.kind == "embd":
                x *= np.float32(0.5)
            else:  # matrix: N(0, 1/fan_in)
                x *= np.float32(self.fan_in ** -0.5)
            yield encode(x.astype(np.float32), self.qtype)


def encode(x: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [rows, cols] -> stored bytes/values of one chunk."""
    if qtype == Q.BF16:  # round to nearest even, as gguf.quants / the converter do
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return quantize_gguf.quantize(x, qtype)


def text_specs(n_layer: int, dtype: str | Q, t: dict = TEXT) -> list[Spec]:
    """`dtype`: a file type (BF16, ..., Q4_K_M) or the one type of every matrix."""
    dtype = dtype.name if isinstance(dtype, Q) else dtype
    d, ff, hd = t["n_embd"], t["n_ff"], t["head_dim"]
    qd, kvd = t["n_head"] * hd, t["n_head_kv"] * hd

    def spec(name: str, shape: tuple[int, ...], kind: str, fan_in: int = 1) -> Spec:
        qtype = quantize_gguf.tensor_type(name, shape, dtype, n_layer, tied=True, mmproj=False)
        return Spec(name, shape, qtype, kind, fan_in)

    specs = [spec("token_embd.weight", (t["n_vocab"], d), "embd")]
    for i in range(n_layer):  # the converter's order within a block
        p = f"blk.{i}."
        specs += [
            spec(p + "attn_norm.weight", (d,), "norm"),
            spec(p + "ffn_down.weight", (d, ff), "matrix", ff),
            spec(p + "ffn_gate.weight", (ff, d), "matrix", d),
            spec(p + "ffn_up.weight", (ff, d), "matrix", d),
            spec(p + "ffn_norm.weight", (d,), "norm"),
            spec(p + "attn_k_norm.weight", (hd,), "norm"),
            spec(p + "attn_k.weight", (kvd, d), "matrix", d),
            spec(p + "attn_output.weight", (d, qd), "matrix", qd),
            spec(p + "attn_q_norm.weight", (hd,), "norm"),
            spec(p + "attn_q.weight", (qd, d), "matrix", d),
            spec(p + "attn_v.weight", (kvd, d), "matrix", d),
        ]
    specs.append(spec("output_norm.weight", (d,), "norm"))
    return specs


def vision_specs(n_layer: int, qtype: Q, v: dict = VISION, d_text: int = TEXT["n_embd"]) -> list[Spec]:
    d, ff, p, s = v["n_embd"], v["n_ff"], v["patch"], v["merge"]
    special = Q.F16 if qtype == Q.F16 else Q.F32  # patch conv and merger: F32 unless outtype f16
    specs = [
        Spec("v.pre_ln.weight", (d,), Q.F32, "norm"),
        Spec("v.patch_embd.weight", (d, 3, p, p), special, "matrix", 3 * p * p),
    ]
    for i in range(n_layer):
        b = f"v.blk.{i}."
        specs += [
            Spec(b + "attn_k.weight", (d, d), qtype, "matrix", d),
            Spec(b + "attn_out.weight", (d, d), qtype, "matrix", d),
            Spec(b + "attn_q.weight", (d, d), qtype, "matrix", d),
            Spec(b + "attn_v.weight", (d, d), qtype, "matrix", d),
            Spec(b + "ln1.weight", (d,), Q.F32, "norm"),
            Spec(b + "ffn_down.weight", (d, ff), qtype, "matrix", ff),
            Spec(b + "ffn_gate.weight", (ff, d), qtype, "matrix", d),
            Spec(b + "ffn_up.weight", (ff, d), qtype, "matrix", d),
            Spec(b + "ln2.weight", (d,), Q.F32, "norm"),
        ]
    specs += [
        Spec("mm.1.weight", (d_text, d), qtype, "matrix", d),
        Spec("mm.2.weight", (d_text, d_text), qtype, "matrix", d_text),
        Spec("mm.input_norm.weight", (d,), Q.F32, "norm"),
        Spec("mm.patch_merger.weight", (d, d * s * s), special, "matrix", d * s * s),
    ]
    return specs


def size_label(n_params: int) -> str:
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{round(n_params / 1e6)}M"


def write_gguf(path: Path, arch: str, kv: list[tuple[str, object, V, V | None]], specs: list[Spec], seed: int,
               log=print) -> None:
    """Declare every tensor, write header + metadata + tensor infos, then stream tensor data."""
    w = gguf.GGUFWriter(path, arch)  # writes general.architecture
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for s in specs:
        w.add_tensor_info(s.name, s.shape, np.dtype(np.float32), s.n_bytes, raw_dtype=s.qtype)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.perf_counter()
    for i, s in enumerate(specs):
        _write_streamed(w, s, s.chunks(seed))
        if log and (s.n_bytes > 64 << 20 or i == len(specs) - 1):
            log(f"  {path.name}: {i + 1}/{len(specs)} tensors, {time.perf_counter() - t0:.0f} s")
    w.close()


def _write_streamed(w: gguf.GGUFWriter, spec: Spec, chunks) -> None:
    """GGUFWriter.write_tensor_data for a tensor given as row chunks (same padding and checks)."""
    fout = w.fout[0]
    name = next(iter(w.tensors[0]))
    if name != spec.name:
        raise RuntimeError(f"tensor order mismatch: writer expects {name!r}, got {spec.name!r}")
    ti = w.tensors[0].pop(name)
    w.write_padding(fout, fout.tell())
    n = 0
    for chunk in chunks:
        chunk.tofile(fout)
        n += chunk.nbytes
    if n != ti.nbytes:
        raise RuntimeError(f"{spec.name}: wrote {n} bytes, declared {ti.nbytes}")
    w.write_padding(fout, n)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS


def tokenizer_kv(n_vocab: int = TEXT["n_vocab"]) -> list[tuple[str, object, V, V | None]]:
    """The fixture's tokenizer metadata; below its 151,936 entries a pruned vocabulary (see the
    module docstring) whose token list, types, merges and special ids agree with each other."""
    sys.path.insert(0, str(ROOT))
    from pantheon_ocr.engine.gguf import open_gguf

    gf = open_gguf(FIXTURE_TEXT)
    meta = {key: gf.metadata[key] for key, _, _ in TOKENIZER_KEYS}
    if n_vocab < len(meta["tokenizer.ggml.tokens"]):
        meta = _pruned(meta, n_vocab)
    out = []
    for key, vtype, sub in TOKENIZER_KEYS:
        value = meta[key]
        out.append((key, value.tolist() if isinstance(value, np.ndarray) else value, vtype, sub))
    return out


def _pruned(meta: dict, n_vocab: int) -> dict:
    tokens, types = meta["tokenizer.ggml.tokens"], np.asarray(meta["tokenizer.ggml.token_type"])
    added = list(range(*QWEN_ADDED))
    named = [i for i, tok in enumerate(tokens) if tok in PROMPT_WORDS]  # the prompt's own pieces
    first = [i for i in range(n_vocab) if i not in named][: n_vocab - len(added) - len(named)]
    keep = sorted(first + named) + added  # old ids, in their new order
    new_id = {old: new for new, old in enumerate(keep)}
    kept = {tokens[i] for i in keep}
    merges = [m for m in meta["tokenizer.ggml.merges"]
              if (parts := m.split(" ")) and len(parts) == 2 and {parts[0], parts[1], parts[0] + parts[1]} <= kept]
    return meta | {
        "tokenizer.ggml.tokens": [tokens[i] for i in keep],
        "tokenizer.ggml.token_type": types[keep],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": new_id[meta["tokenizer.ggml.eos_token_id"]],
        "tokenizer.ggml.padding_token_id": new_id[meta["tokenizer.ggml.padding_token_id"]],
    }


def make_pair(out_dir: Path, vision_layers: int = VISION["n_layer"], text_layers: int = TEXT["n_layer"],
              dtype: str = "BF16", seed: int = 0, log=print, *, text: dict | None = None, vision: dict | None = None,
              n_vocab: int | None = None, mmproj_dtype: str | None = None, tag: str | None = None) -> tuple[Path, Path]:
    """Write the pair; returns (text path, mmproj path). `text` / `vision` override shapes of
    TEXT / VISION, `n_vocab` prunes the vocabulary, `mmproj_dtype` sets the mmproj's matrix
    type (default: `dtype`, F16 for K-quants), `tag` the file names' suffix."""
    mmproj_dtype = mmproj_dtype or (dtype if dtype in ("BF16", "F16", "Q8_0", "F32") else "F16")
    qtype = DTYPES[mmproj_dtype]
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = tag or f"{dtype.lower()}" + ("" if (vision_layers, text_layers) == (24, 28) else f"-v{vision_layers}-t{text_layers}")
    text_path = out_dir / f"lightonocr-1b-random-{tag}.gguf"
    mmproj_path = out_dir / f"mmproj-lightonocr-1b-random-{tag}.gguf"
    t = TEXT | (text or {}) | ({"n_vocab": n_vocab} if n_vocab else {})
    v = VISION | (vision or {})

    tspecs = text_specs(text_layers, dtype, t)
    n_text = sum(int(np.prod(s.shape)) for s in tspecs)
    text_kv = [
        ("general.type", "model", V.STRING, None),
        ("general.name", "LightOnOCR 1B Random", V.STRING, None),
        ("general.size_label", size_label(n_text), V.STRING, None),
        ("qwen3.block_count", text_layers, V.UINT32, None),
        ("qwen3.context_length", t["n_ctx"], V.UINT32, None),
        ("qwen3.embedding_length", t["n_embd"], V.UINT32, None),
        ("qwen3.feed_forward_length", t["n_ff"], V.UINT32, None),
        ("qwen3.attention.head_count", t["n_head"], V.UINT32, None),
        ("qwen3.attention.head_count_kv", t["n_head_kv"], V.UINT32, None),
        ("qwen3.rope.freq_base", t["rope_base"], V.FLOAT32, None),
        ("qwen3.attention.layer_norm_rms_epsilon", t["eps"], V.FLOAT32, None),
        ("qwen3.attention.key_length", t["head_dim"], V.UINT32, None),
        ("qwen3.attention.value_length", t["head_dim"], V.UINT32, None),
        ("general.file_type", quantize_gguf.FTYPES[dtype], V.UINT32, None),
        ("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32, None),
    ] + tokenizer_kv(t["n_vocab"])

    vspecs = vision_specs(vision_layers, qtype, v, t["n_embd"])
    n_vis = sum(int(np.prod(s.shape)) for s in vspecs)
    mmproj_kv = [
        ("general.type", "mmproj", V.STRING, None),
        ("general.name", "LightOnOCR 1B Random", V.STRING, None),
        ("general.size_label", size_label(n_vis), V.STRING, None),
        ("general.file_type", quantize_gguf.FTYPES[mmproj_dtype], V.UINT32, None),
        ("clip.has_vision_encoder", True, V.BOOL, None),
        ("clip.vision.projection_dim", t["n_embd"], V.UINT32, None),
        ("clip.vision.image_size", v["image_size"], V.UINT32, None),
        ("clip.vision.patch_size", v["patch"], V.UINT32, None),
        ("clip.vision.embedding_length", v["n_embd"], V.UINT32, None),
        ("clip.vision.feed_forward_length", v["n_ff"], V.UINT32, None),
        ("clip.vision.block_count", vision_layers, V.UINT32, None),
        ("clip.vision.attention.head_count", v["n_head"], V.UINT32, None),
        ("clip.vision.image_mean", list(CLIP_MEAN), V.ARRAY, V.FLOAT32),
        ("clip.vision.image_std", list(CLIP_STD), V.ARRAY, V.FLOAT32),
        ("clip.projector_type", "lightonocr", V.STRING, None),
        ("clip.vision.attention.layer_norm_epsilon", v["eps"], V.FLOAT32, None),
        ("clip.use_silu", True, V.BOOL, None),
        ("clip.vision.spatial_merge_size", v["merge"], V.UINT32, None),
        ("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32, None),
    ]
    if log:
        log(f"text: {text_layers} layers, {n_text / 1e6:.0f}M params; vision+projector: {vision_layers} layers, "
            f"{n_vis / 1e6:.0f}M params; matrices {dtype} (mmproj {mmproj_dtype})")
    write_gguf(text_path, "qwen3", text_kv, tspecs, seed, log)
    write_gguf(mmproj_path, "clip", mmproj_kv, vspecs, seed, log)
    return text_path, mmproj_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--vision-layers", type=int, default=VISION["n_layer"])
    ap.add_argument("--text-layers", type=int, default=TEXT["n_layer"])
    ap.add_argument("--dtype", choices=list(DTYPES), default="BF16", help="type of the weight matrices")
    ap.add_argument("--n-vocab", type=int, default=TEXT["n_vocab"], help="below 151936: a pruned vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.vision_layers < 1 or a.text_layers < 1:
        ap.error("layer counts must be at least 1")
    if not 1024 <= a.n_vocab <= TEXT["n_vocab"]:
        ap.error(f"--n-vocab must be between 1024 and {TEXT['n_vocab']}")
    t0 = time.perf_counter()
    text, mmproj = make_pair(a.out_dir, a.vision_layers, a.text_layers, a.dtype, a.seed, n_vocab=a.n_vocab)
    print(f"wrote {text} ({text.stat().st_size / 1e6:.0f} MB) and {mmproj} ({mmproj.stat().st_size / 1e6:.0f} MB) "
          f"in {time.perf_counter() - t0:.0f} s")
    print(f"  pantheon-ocr transcribe PAGE.pdf --model {text} --mmproj {mmproj}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
