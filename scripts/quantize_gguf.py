"""Re-quantize a GGUF the way published LightOnOCR files are quantized (test files, not a
llama-quantize replacement):

    python scripts/quantize_gguf.py IN.gguf OUT.gguf TYPE
        TYPE: F32 F16 BF16 Q8_0 (every matrix) | Q6_K Q4_K_M Q4_K_S (llama-quantize's mixes)

`gguf.quants.quantize` writes F16/BF16/Q8_0 (and Q4_0..Q5_1) but not the K-quants, so Q4_K,
Q5_K and Q6_K blocks are encoded here with numpy: plain min/max (Q4_K, Q5_K) and max-abs (Q6_K)
scales per sub-block, 6- or 8-bit scales per super-block, in ggml's block layouts. The values
are not llama.cpp's (its encoder searches for better scales) but the blocks are the same format,
checked by decoding them with `gguf.quants.dequantize`. Which tensor gets which type follows
llama.cpp's llama_tensor_get_type (src/llama-quant.cpp): 1-D tensors stay F32; the tied token
embedding (no output.weight) is Q6_K; Q4_K_M makes attn_v and ffn_down Q6_K in the layers
`use_more_bits` picks; Q4_K_S makes attn_v Q5_K in the first 4 layers and ffn_down Q5_K in the
first n_layer/8; rows that are not a multiple of 256 fall back to Q5_0 / Q5_1 / Q8_0. An mmproj
(general.architecture = clip) is never K-quantized: its matrices take F32/F16/BF16/Q8_0 and its
patch convolution and patch merger stay F32 (F16 for an F16 file), as the converter writes them.
The file is written by the engine's one GGUF writer (pantheon_ocr/engine/format/writer.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pantheon_ocr.engine.format import names as N  # noqa: E402
from pantheon_ocr.engine.format.writer import FILE_TYPES as FTYPES  # noqa: E402  (LlamaFileType by name)
from pantheon_ocr.engine.format.writer import write_gguf  # noqa: E402, F401  (the one GGUF writer; tests call it here)

QK_K = 256
BASE = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16, "Q8_0": Q.Q8_0, "Q6_K": Q.Q6_K, "Q4_K_S": Q.Q4_K, "Q4_K_M": Q.Q4_K}
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}  # llama.cpp's tensor_type_fallback


# -- K-quant encoders: float32 [rows, n*256] -> block bytes [rows, n*block_bytes] -----------------
def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _min_max_blocks(x: np.ndarray, levels: int):
    """Per 32-value sub-block: 6-bit scale and min codes, fp16 super-block d and dmin, and the
    codes q in 0..levels with x ~ d*sc*q - dmin*m."""
    sub = x.reshape(-1, 8, 32)  # [blocks, 8, 32]
    lo = np.minimum(sub.min(axis=-1), 0.0)
    hi = sub.max(axis=-1)
    scale, mins = (hi - lo) / levels, -lo
    d, dmin = _fp16(scale.max(axis=-1) / 63), _fp16(mins.max(axis=-1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.clip(np.rint(scale / np.where(df > 0, df, 1)), 0, 63), 0).astype(np.uint8)
    m = np.where(dminf > 0, np.clip(np.rint(mins / np.where(dminf > 0, dminf, 1)), 0, 63), 0).astype(np.uint8)
    step, off = (df * sc)[..., None], (dminf * m)[..., None]
    q = np.where(step > 0, np.clip(np.rint((sub + off) / np.where(step > 0, step, 1)), 0, levels), 0).astype(np.uint8)
    return d, dmin, _pack_scales(sc, m), q  # q: [blocks, 8, 32]


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """ggml's 12-byte packing of eight 6-bit scales and mins (get_scale_min_k4 reads it back)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _min_max_blocks(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # 64 values per byte row: low nibble, high nibble
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _min_max_blocks(x, 31)
    low = q & 15
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    hi = (q >> 4).astype(np.uint8)  # [blocks, 8, 32]: bit j of qh[l] is sub-block j's fifth bit
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= hi[:, j] << j
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qh, qs], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)  # [blocks, 16, 16]
    scale = np.abs(sub).max(axis=-1) / 31  # codes -32..31: use +-31 so both signs fit
    d = _fp16(scale.max(axis=-1) / 127)
    df = d.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.clip(np.rint(scale / np.where(df > 0, df, 1)), -128, 127), 0).astype(np.int8)
    step = (df * sc)[..., None]
    q = np.where(step != 0, np.clip(np.rint(sub / np.where(step != 0, step, 1)), -32, 31), 0)
    v = (q + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128 values
    a, b, c, e = v[..., 0:32], v[..., 32:64], v[..., 64:96], v[..., 96:128]
    ql = np.concatenate([(a & 15) | ((c & 15) << 4), (b & 15) | ((e & 15) << 4)], axis=-1)  # [blocks, 2, 64]
    qh = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)  # [blocks, 2, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
                          axis=1)


_K = {Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k}


def quantize(x: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [..., cols] -> the stored array of that type (bytes for block types)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    if qtype in _K:
        rows = x.reshape(-1, x.shape[-1])
        blocks = _K[qtype](rows.reshape(-1, QK_K))  # [rows * cols/256, block bytes]
        return blocks.reshape(*x.shape[:-1], -1)
    return gguf.quants.quantize(x, qtype)


# -- which type for which tensor ------------------------------------------------------------------
def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, shape: tuple[int, ...], ftype: str, n_layer: int, tied: bool, mmproj: bool) -> Q:
    """The type llama.cpp gives tensor `name` (numpy shape) in a file of `ftype`."""
    if len(shape) < 2 or name.endswith("norm.weight"):
        return Q.F32
    if mmproj:
        if name in N.FULL_PRECISION:  # the patch convolution and the patch merger
            return Q.F16 if ftype == "F16" else Q.F32
        return {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16, "Q8_0": Q.Q8_0}[ftype]
    qtype = BASE[ftype]
    if qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0):
        return qtype
    layer = N.block_index(name)
    layer = -1 if layer is None else layer
    if name == N.OUTPUT or (tied and name == N.TOKEN_EMBD):
        qtype = Q.Q6_K if shape[-1] % QK_K == 0 else Q.Q8_0
    elif name.endswith("." + N.ATTN_V):
        if ftype == "Q4_K_M" and use_more_bits(layer, n_layer):
            qtype = Q.Q6_K
        elif ftype == "Q4_K_S" and layer < 4:
            qtype = Q.Q5_K
    elif name.endswith("." + N.FFN_DOWN):
        if ftype == "Q4_K_M" and use_more_bits(layer, n_layer):
            qtype = Q.Q6_K
        elif ftype == "Q4_K_S" and layer < n_layer // 8:
            qtype = Q.Q5_K
    if qtype in FALLBACK and shape[-1] % QK_K:
        qtype = FALLBACK[qtype]
    return qtype


# -- copying a GGUF -------------------------------------------------------------------------------
def requantize(src: str | Path, dst: str | Path, ftype: str) -> dict[str, str]:
    """Write `src` again with its matrices in `ftype`; returns tensor name -> type name."""
    from pantheon_ocr.engine.format.gguf import open_gguf
    from pantheon_ocr.engine.format.weights import dequantize

    if ftype not in FTYPES:
        raise ValueError(f"type must be one of {', '.join(FTYPES)}, not {ftype!r}")
    gf = open_gguf(src)
    arch = gf.metadata[N.ARCHITECTURE]
    mmproj = arch == N.ARCH_CLIP
    if mmproj and ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"{src}: an mmproj takes F32, F16, BF16 or Q8_0, not {ftype}")
    n_layer = int(gf.metadata.get(N.arch_key(arch, N.BLOCK_COUNT), 0))
    tied = N.OUTPUT not in gf.tensors
    meta = dict(gf.metadata)  # general.architecture is written from `arch`
    meta[N.FILE_TYPE] = FTYPES[ftype]
    meta.setdefault(N.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION)
    tensors, types = [], {}
    for name, info in gf.tensors.items():
        values = dequantize(gf.raw(name), info.qtype).reshape(info.shape)
        qtype = tensor_type(name, info.shape, ftype, n_layer, tied, mmproj)
        types[name] = qtype.name
        tensors.append((name, quantize(values, qtype), qtype))
    write_gguf(Path(dst), arch, meta, tensors)
    gf.close()
    return types


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("type", choices=list(FTYPES))
    a = ap.parse_args(argv)
    types = requantize(a.src, a.dst, a.type)
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    print(f"wrote {a.dst} ({a.dst.stat().st_size / 1e6:.1f} MB): " + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
