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
row chunks of a few tens of MB (the engine's one GGUF writer, pantheon_ocr/engine/format/writer.py,
streams them; the largest tensor, the 151936 x 1024 embedding, is never whole in memory). Dtypes
follow the converter's rules: 1-D tensors and norms F32; v.patch_embd and mm.patch_merger F32 (F16
when --dtype F16); every other matrix --dtype.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from functools import partial
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
import quantize_gguf  # noqa: E402  (scripts/: the K-quant encoders and llama-quantize's type rules)

from pantheon_ocr.engine.format import names as N  # noqa: E402
from pantheon_ocr.engine.format import writer  # noqa: E402

FIXTURE_TEXT = ROOT / "tests" / "fixtures" / "lightonocr-tiny" / "text.gguf"

# LightOnOCR-1B's shapes
VISION = dict(n_embd=1024, n_ff=4096, n_layer=24, n_head=16, patch=14, image_size=1540, eps=1e-5, merge=2)
TEXT = dict(n_embd=1024, n_ff=3072, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_vocab=151936,
            n_ctx=40960, rope_base=1e6, eps=1e-6)

DTYPES = {"BF16": Q.BF16, "F16": Q.F16, "Q8_0": Q.Q8_0, "F32": Q.F32, "Q6_K": Q.Q6_K, "Q4_K_M": Q.Q4_K,
          "Q4_K_S": Q.Q4_K}
QWEN_ADDED = (151643, 151669)  # Qwen's added tokens <|endoftext|> .. </think>: kept by a pruned vocabulary
PROMPT_WORDS = ("system", "user", "assistant", "Ċ")  # and the chat prompt's words
CHUNK_BYTES = 32 << 20  # float32 bytes generated per chunk
NAME = "LightOnOCR 1B Random"


class Spec:
    """One tensor: numpy shape (rows, ..., cols), stored type, and how its values are drawn: 1-D
    (norms) 1 + 0.02 N(0, 1), the token embedding 0.5 N(0, 1), matrices N(0, 1/fan_in)."""

    def __init__(self, name: str, shape: tuple[int, ...], qtype: Q):
        self.name, self.shape, self.qtype = name, shape, qtype
        self.kind = "norm" if len(shape) == 1 else "embd" if name == N.TOKEN_EMBD else "matrix"
        self.fan_in = int(np.prod(shape[1:]))

    @property
    def n_bytes(self) -> int:
        return writer.tensor_nbytes(self.shape, self.qtype)

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
            yield quantize_gguf.quantize(x.astype(np.float32), self.qtype)

    def streamed(self, seed: int) -> writer.Streamed:
        return writer.Streamed(self.name, self.shape, self.qtype, partial(self.chunks, seed))


def _specs(shapes: list[tuple[str, tuple[int, ...]]], ftype: str, n_layer: int, mmproj: bool) -> list[Spec]:
    """Each tensor with the type llama.cpp gives it in a file of `ftype` (quantize_gguf.tensor_type)."""
    return [Spec(name, shape, quantize_gguf.tensor_type(name, shape, ftype, n_layer, tied=True, mmproj=mmproj))
            for name, shape in shapes]


def text_specs(n_layer: int, dtype: str | Q, t: dict = TEXT) -> list[Spec]:
    """`dtype`: a file type (BF16, ..., Q4_K_M) or the one type of every matrix."""
    dtype = dtype.name if isinstance(dtype, Q) else dtype
    d, ff, hd = t["n_embd"], t["n_ff"], t["head_dim"]
    qd, kvd = t["n_head"] * hd, t["n_head_kv"] * hd
    block = {N.ATTN_NORM: (d,), N.FFN_DOWN: (d, ff), N.FFN_GATE: (ff, d), N.FFN_UP: (ff, d), N.FFN_NORM: (d,),
             N.ATTN_K_NORM: (hd,), N.ATTN_K: (kvd, d), N.ATTN_OUTPUT: (d, qd), N.ATTN_Q_NORM: (hd,),
             N.ATTN_Q: (qd, d), N.ATTN_V: (kvd, d)}
    shapes = [(N.TOKEN_EMBD, (t["n_vocab"], d))]
    shapes += [(N.blk(i, name), block[name]) for i in range(n_layer) for name in N.QWEN3_BLOCK]
    return _specs(shapes + [(N.OUTPUT_NORM, (d,))], dtype, n_layer, mmproj=False)


def vision_specs(n_layer: int, qtype: Q, v: dict = VISION, d_text: int = TEXT["n_embd"]) -> list[Spec]:
    d, ff, p, s = v["n_embd"], v["n_ff"], v["patch"], v["merge"]
    block = {N.V_ATTN_K: (d, d), N.V_ATTN_OUT: (d, d), N.V_ATTN_Q: (d, d), N.V_ATTN_V: (d, d), N.V_LN1: (d,),
             N.V_FFN_DOWN: (d, ff), N.V_FFN_GATE: (ff, d), N.V_FFN_UP: (ff, d), N.V_LN2: (d,)}
    shapes = [(N.V_PRE_LN, (d,)), (N.V_PATCH_EMBD, (d, 3, p, p))]
    shapes += [(N.v_blk(i, name), block[name]) for i in range(n_layer) for name in N.PIXTRAL_BLOCK]
    shapes += [(N.MM_1, (d_text, d)), (N.MM_2, (d_text, d_text)), (N.MM_INPUT_NORM, (d,)),
               (N.MM_PATCH_MERGER, (d, d * s * s))]
    return _specs(shapes, qtype.name, n_layer, mmproj=True)  # patch conv and merger F32 unless F16


def size_label(n_params: int) -> str:
    return writer.size_label(n_params)


def tokenizer_kv(n_vocab: int = TEXT["n_vocab"]) -> dict:
    """The fixture's tokenizer metadata (the converter's keys and value types); below its 151,936
    entries a pruned vocabulary (see the module docstring) whose token list, types, merges and
    special ids agree with each other."""
    from pantheon_ocr.engine.format.gguf import open_gguf

    meta = open_gguf(FIXTURE_TEXT).metadata
    if n_vocab < len(meta[N.TOKENS]):
        meta = _pruned(meta, n_vocab)
    return writer.tokenizer_metadata(meta[N.TOKENS], meta[N.TOKEN_TYPE], meta[N.MERGES], eos=meta[N.EOS_ID],
                                     pad=meta[N.PADDING_ID], chat_template=meta[N.CHAT_TEMPLATE],
                                     pre=meta[N.TOKENIZER_PRE], model=meta[N.TOKENIZER_MODEL],
                                     add_bos=meta[N.ADD_BOS], add_eos=meta[N.ADD_EOS])


def _pruned(meta: dict, n_vocab: int) -> dict:
    tokens, types = meta[N.TOKENS], np.asarray(meta[N.TOKEN_TYPE])
    added = list(range(*QWEN_ADDED))
    named = [i for i, tok in enumerate(tokens) if tok in PROMPT_WORDS]  # the prompt's own pieces
    first = [i for i in range(n_vocab) if i not in named][: n_vocab - len(added) - len(named)]
    keep = sorted(first + named) + added  # old ids, in their new order
    new_id = {old: new for new, old in enumerate(keep)}
    kept = {tokens[i] for i in keep}
    merges = [m for m in meta[N.MERGES]
              if (parts := m.split(" ")) and len(parts) == 2 and {parts[0], parts[1], parts[0] + parts[1]} <= kept]
    return meta | {
        N.TOKENS: [tokens[i] for i in keep],
        N.TOKEN_TYPE: types[keep],
        N.MERGES: merges,
        N.EOS_ID: new_id[meta[N.EOS_ID]],
        N.PADDING_ID: new_id[meta[N.PADDING_ID]],
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
    text_meta = writer.text_metadata(
        writer.general_metadata(N.TYPE_MODEL, NAME, size_label(n_text)), writer.FILE_TYPES[dtype],
        tokenizer_kv(t["n_vocab"]), n_layer=text_layers, n_ctx=t["n_ctx"], n_embd=t["n_embd"], n_ff=t["n_ff"],
        n_head=t["n_head"], n_head_kv=t["n_head_kv"], head_dim=t["head_dim"], rope_base=t["rope_base"], eps=t["eps"])

    vspecs = vision_specs(vision_layers, qtype, v, t["n_embd"])
    n_vis = sum(int(np.prod(s.shape)) for s in vspecs)
    mmproj_meta = writer.mmproj_metadata(
        writer.general_metadata(N.TYPE_MMPROJ, NAME, size_label(n_vis)), writer.FILE_TYPES[mmproj_dtype],
        projection_dim=t["n_embd"], image_size=v["image_size"], patch_size=v["patch"], n_embd=v["n_embd"],
        n_ff=v["n_ff"], n_layer=vision_layers, n_head=v["n_head"], eps=v["eps"], merge=v["merge"])
    if log:
        log(f"text: {text_layers} layers, {n_text / 1e6:.0f}M params; vision+projector: {vision_layers} layers, "
            f"{n_vis / 1e6:.0f}M params; matrices {dtype} (mmproj {mmproj_dtype})")
    writer.write_gguf(text_path, N.ARCH_QWEN3, text_meta, [s.streamed(seed) for s in tspecs], log=log)
    writer.write_gguf(mmproj_path, N.ARCH_CLIP, mmproj_meta, [s.streamed(seed) for s in vspecs], log=log)
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
