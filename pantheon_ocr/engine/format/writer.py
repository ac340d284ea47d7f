"""Write a GGUF file: the one writer behind every file this project makes (the tiny test models,
re-quantized files, random-weight LightOnOCR pairs, the trained reader's export), on the `gguf`
package's GGUFWriter, with the names of names.py.

    write_gguf(path, arch, metadata, tensors)

`metadata` maps key -> value in file order (`general.architecture` comes from `arch`, first, as
GGUFWriter writes it). A value's GGUF type follows from the value, as the converter types them:
bool -> BOOL, int -> UINT32 (INT64 outside 0..2^32-1), float -> FLOAT32, str -> STRING, a list of
str / int / float -> an ARRAY of STRING / INT32 / FLOAT32, a numpy array -> an ARRAY of its dtype;
`Typed(value, type, sub_type)` spells out any other.

`tensors` holds, in file order, `(name, array, qtype)` entries or `Streamed` ones. The array is
either the values (float32, encoded here: F16, BF16, Q8_0, Q4_0 ... through gguf.quants; not the
K-quants) or already the stored form: float32 for F32, float16 for F16, or the raw bytes
[..., bytes per row] (uint8) of any type. A `Streamed` tensor hands its stored bytes over in
chunks, so a tensor larger than memory never exists whole. Data is aligned to 32 bytes
(GGUFWriter's default, no `general.alignment` key), as llama.cpp's files are.

The LightOnOCR pair's standard metadata, in the converter's key order: `text_metadata` (qwen3) and
`mmproj_metadata` (clip, projector lightonocr), built from `general_metadata`, `decoder_metadata`,
`tokenizer_metadata` and `reader_metadata` (our `pantheon.reader.*` keys). `permute_qk` is the
converter's row permutation of the vision (and llama) Q/K weights; `unpermute_qk` undoes it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from . import names as N

QUANT_VERSION = gguf.GGML_QUANT_VERSION
# llama.cpp's LlamaFileType of a file whose matrices are mostly of that type (general.file_type)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q6_K": 18, "Q4_K_S": 14, "Q4_K_M": 15, "BF16": 32}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # LightOnOCR's image normalisation (CLIP's)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
LOG_BYTES = 64 << 20  # write_gguf(log=...) reports after each tensor larger than this, and at the end


@dataclass(frozen=True)
class Typed:
    """A metadata value with its GGUF type given (where the value alone would say another)."""

    value: Any
    type: V
    sub_type: V | None = None


@dataclass(frozen=True)
class Streamed:
    """A tensor written from chunks: `chunks()` yields its stored bytes in order (any numpy
    arrays; their bytes must add up to the tensor's size, `tensor_nbytes(shape, qtype)`)."""

    name: str
    shape: tuple[int, ...]  # numpy shape of the values: (out, in) for a matrix
    qtype: Q
    chunks: Callable[[], Iterable[np.ndarray]]


_ARRAY_TYPES = {np.dtype(np.int32): V.INT32, np.dtype(np.uint32): V.UINT32, np.dtype(np.float32): V.FLOAT32,
                np.dtype(np.int64): V.INT64, np.dtype(np.uint8): V.UINT8, np.dtype(np.bool_): V.BOOL,
                np.dtype(np.float64): V.FLOAT64, np.dtype(np.int8): V.INT8, np.dtype(np.uint16): V.UINT16,
                np.dtype(np.int16): V.INT16, np.dtype(np.uint64): V.UINT64}


def value_type(value: Any) -> tuple[V, V | None]:
    """The GGUF (type, array element type) a metadata value is written with (module docstring)."""
    if isinstance(value, Typed):
        return value.type, value.sub_type
    if isinstance(value, (bool, np.bool_)):
        return V.BOOL, None
    if isinstance(value, (int, np.integer)):
        return (V.UINT32 if 0 <= value < 2**32 else V.INT64), None
    if isinstance(value, (float, np.floating)):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    if isinstance(value, np.ndarray):
        return V.ARRAY, _ARRAY_TYPES[value.dtype]
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (bool, np.bool_)) for v in value):
            return V.ARRAY, V.BOOL
        if value and all(isinstance(v, (int, np.integer)) for v in value):
            return V.ARRAY, V.INT32
        if value and all(isinstance(v, (int, float, np.number)) for v in value):
            return V.ARRAY, V.FLOAT32
        return V.ARRAY, V.STRING
    raise TypeError(f"no GGUF type for a metadata value of type {type(value).__name__}")


def _plain(value: Any) -> Any:
    value = value.value if isinstance(value, Typed) else value
    return value.tolist() if isinstance(value, np.ndarray) else list(value) if isinstance(value, tuple) else value


def tensor_nbytes(shape: Sequence[int], qtype: Q) -> int:
    """Stored bytes of a tensor of `shape` (values) in `qtype`."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


def stored(array: np.ndarray, qtype: Q) -> tuple[np.ndarray, tuple[int, ...]]:
    """(stored array, value shape) of an entry's array: values are encoded, stored forms kept."""
    array = np.asarray(array)
    if array.dtype == np.uint8:  # raw blocks [..., bytes per row]
        return array, gguf.quants.quant_shape_from_byte_shape(array.shape, qtype)
    if qtype == Q.F16 and array.dtype == np.float16 or qtype == Q.F32 and array.dtype == np.float32:
        return array, array.shape
    if array.dtype == np.uint16 and qtype == Q.BF16:  # bfloat16 bit patterns
        return array, array.shape
    if array.dtype not in (np.float32, np.float64):
        raise TypeError(f"cannot store a {array.dtype} array as {qtype.name}")
    return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), array.shape


def _entries(tensors) -> list[Streamed]:
    out = []
    for t in tensors:
        if isinstance(t, Streamed):
            out.append(t)
            continue
        name, array, qtype = t
        data, shape = stored(array, qtype)
        out.append(Streamed(name, tuple(int(n) for n in shape), qtype, lambda data=data: (data,)))
    return out


def write_gguf(path: str | Path, arch: str, metadata: Mapping[str, Any],
               tensors: Iterable[tuple[str, np.ndarray, Q] | Streamed], *,
               log: Callable[[str], Any] | None = None) -> Path:
    """Write the GGUF file (module docstring): header, metadata, tensor infos, then each tensor's
    data, aligned. `log`: progress lines for big files (after each tensor over 64 MiB)."""
    path = Path(path)
    entries = _entries(tensors)
    w = gguf.GGUFWriter(path, arch)  # writes general.architecture
    for key, value in metadata.items():
        if key == N.ARCHITECTURE or key.startswith("GGUF."):
            continue
        vtype, sub = value_type(value)
        w.add_key_value(key, _plain(value), vtype, sub_type=sub)
    for t in entries:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), tensor_nbytes(t.shape, t.qtype), raw_dtype=t.qtype)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.perf_counter()
    for i, t in enumerate(entries):
        n = _write_data(w, t)
        if log and (n > LOG_BYTES or i == len(entries) - 1):
            log(f"  {path.name}: {i + 1}/{len(entries)} tensors, {time.perf_counter() - t0:.0f} s")
    w.close()
    return path


def _write_data(w: gguf.GGUFWriter, t: Streamed) -> int:
    """GGUFWriter.write_tensor_data for a tensor given as chunks (the same padding and checks)."""
    fout = w.fout[0]
    name = next(iter(w.tensors[0]))
    if name != t.name:
        raise RuntimeError(f"tensor order mismatch: writer expects {name!r}, got {t.name!r}")
    ti = w.tensors[0].pop(name)
    w.write_padding(fout, fout.tell())
    n = 0
    for chunk in t.chunks():
        chunk.tofile(fout)
        n += chunk.nbytes
    if n != ti.nbytes:
        raise RuntimeError(f"{t.name}: wrote {n} bytes, declared {ti.nbytes}")
    w.write_padding(fout, n)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS
    return n


# -- the converter's layout of Q/K rows ------------------------------------------------------------
def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: per head, Hugging Face's split-half rotary pairs (i, i + d/2)
    -> adjacent pairs (2i, 2i + 1). Weights [n_head*d, in] or biases [n_head*d]; K: pass n_kv."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_qk: GGUF rows -> Hugging Face rows."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- metadata of the LightOnOCR pair, in the converter's key order ------------------------------
def size_label(n_params: int) -> str:
    """general.size_label as the converter spells it: 1.0B, 640M."""
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{round(n_params / 1e6)}M"


def general_metadata(kind: str, name: str, size: str | None = None, license: str | None = None) -> dict[str, Any]:
    """general.type (N.TYPE_MODEL / N.TYPE_MMPROJ), name, size_label and license (where given)."""
    meta = {N.TYPE: kind, N.NAME: name}
    if size is not None:
        meta[N.SIZE_LABEL] = size
    if license is not None:
        meta[N.LICENSE] = license
    return meta


def decoder_metadata(arch: str, *, n_layer: int, n_ctx: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                     rope_base: float, eps: float, n_expert: int | None = None, n_expert_used: int | None = None,
                     head_dim: int | None = None) -> dict[str, Any]:
    """The hyper-parameters the converter's common text writer (conversion/base.py) records, in its
    order; head_dim gives key_length / value_length (qwen3 writes them)."""
    k = lambda key: N.arch_key(arch, key)  # noqa: E731
    meta = {k(N.BLOCK_COUNT): n_layer, k(N.CONTEXT_LENGTH): n_ctx, k(N.EMBEDDING_LENGTH): n_embd,
            k(N.FEED_FORWARD_LENGTH): n_ff, k(N.HEAD_COUNT): n_head, k(N.HEAD_COUNT_KV): n_head_kv,
            k(N.ROPE_FREQ_BASE): float(rope_base), k(N.RMS_EPS): float(eps)}
    if n_expert is not None:
        meta[k(N.EXPERT_COUNT)] = n_expert
    if n_expert_used is not None:
        meta[k(N.EXPERT_USED_COUNT)] = n_expert_used
    if head_dim is not None:
        meta[k(N.KEY_LENGTH)] = meta[k(N.VALUE_LENGTH)] = head_dim
    return meta


def tokenizer_metadata(tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], *, eos: int, pad: int,
                       chat_template: str, bos: int | None = None, pre: str = "qwen2", model: str = "gpt2",
                       add_bos: bool = False, add_eos: bool = False) -> dict[str, Any]:
    """A byte-level BPE vocabulary's keys, in the order the converter writes them."""
    meta = {N.TOKENIZER_MODEL: model, N.TOKENIZER_PRE: pre, N.TOKENS: Typed(list(tokens), V.ARRAY, V.STRING),
            N.TOKEN_TYPE: Typed([int(t) for t in token_types], V.ARRAY, V.INT32),
            N.MERGES: Typed(list(merges), V.ARRAY, V.STRING)}
    if bos is not None:
        meta[N.BOS_ID] = bos
    meta |= {N.EOS_ID: eos, N.PADDING_ID: pad, N.ADD_BOS: add_bos, N.ADD_EOS: add_eos, N.CHAT_TEMPLATE: chat_template}
    return meta


def text_metadata(general: Mapping[str, Any], file_type: int, tokenizer: Mapping[str, Any], *, n_layer: int,
                  n_ctx: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, head_dim: int, rope_base: float,
                  eps: float, arch: str = N.ARCH_QWEN3) -> dict[str, Any]:
    """A LightOnOCR text GGUF's metadata (qwen3): general keys, hyper-parameters, file type,
    quantization version, tokenizer."""
    return {**general, **decoder_metadata(arch, n_layer=n_layer, n_ctx=n_ctx, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                          n_head_kv=n_head_kv, rope_base=rope_base, eps=eps, head_dim=head_dim),
            N.FILE_TYPE: file_type, N.QUANTIZATION_VERSION: QUANT_VERSION, **tokenizer}


def mmproj_metadata(general: Mapping[str, Any], file_type: int, *, projection_dim: int, image_size: int,
                    patch_size: int, n_embd: int, n_ff: int, n_layer: int, n_head: int, eps: float, merge: int,
                    mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD,
                    reader: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A LightOnOCR mmproj's metadata (clip, projector lightonocr), in the converter's order;
    `reader`: our pantheon.reader.* keys (reader_metadata), last."""
    return {**general, N.FILE_TYPE: file_type, N.CLIP_HAS_VISION_ENCODER: True, N.V_PROJECTION_DIM: projection_dim,
            N.V_IMAGE_SIZE: image_size, N.V_PATCH_SIZE: patch_size, N.V_EMBEDDING_LENGTH: n_embd,
            N.V_FEED_FORWARD_LENGTH: n_ff, N.V_BLOCK_COUNT: n_layer, N.V_HEAD_COUNT: n_head,
            N.V_IMAGE_MEAN: [float(x) for x in mean], N.V_IMAGE_STD: [float(x) for x in std],
            N.CLIP_PROJECTOR_TYPE: N.PROJECTOR_LIGHTONOCR, N.V_EPS: float(eps), N.CLIP_USE_SILU: True,
            N.V_SPATIAL_MERGE_SIZE: merge, N.QUANTIZATION_VERSION: QUANT_VERSION, **(reader or {})}


def reader_metadata(segment: str, line_height: int, page_edge: int, line_width: int = 0,
                    line_stretch: float = 1.0) -> dict[str, Any]:
    """How a trained reader wants its pages (pantheon.reader.*); line_width 0 and line_stretch 1:
    not written."""
    meta = {N.READER_SEGMENT: segment, N.READER_LINE_HEIGHT: line_height, N.READER_PAGE_EDGE: page_edge}
    if line_width:
        meta[N.READER_LINE_WIDTH] = line_width
    lo, hi = N.READER_LINE_STRETCH_RANGE
    if not lo <= line_stretch <= hi:
        raise ValueError(f"line_stretch must be between {lo} and {hi}, not {line_stretch}")
    if line_stretch != 1.0:
        meta[N.READER_LINE_STRETCH] = float(line_stretch)
    return meta
