"""Open a GGUF file: header and metadata parsed eagerly, tensor data memory-mapped.

We parse the header ourselves instead of using `gguf.GGUFReader`: the reader builds a numpy
view per string (about 6 s for a 151k-token vocabulary) and fails on truncated files with
low-level errors. Type constants and block sizes still come from the `gguf` package.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelError

GGUF_MAGIC = b"GGUF"
_SCALARS = {  # GGUF value type id -> struct format
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_NUMPY_OF = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
             6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: reversed ggml ne, so 2-D weights are (out, in)
    offset: int  # absolute byte offset in the file
    n_bytes: int


class GGUFFile:
    """A parsed GGUF: `.metadata` (key -> python value; arrays of numbers as numpy), `.tensors`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise ModelError(self.path, f"cannot open model file: {exc.strerror or exc}") from None
        try:
            size = self.path.stat().st_size
            if size < 24:
                raise ModelError(self.path, f"not a GGUF file (only {size} bytes)")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.metadata: dict[str, Any] = {}
            self.tensors: dict[str, TensorInfo] = {}
            self._parse(size)
        except ModelError:
            self.close()
            raise

    # -- parsing -----------------------------------------------------------------------------
    def _parse(self, size: int) -> None:
        buf = self._map
        if buf[:4] != GGUF_MAGIC:
            raise ModelError(self.path, f"not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ModelError(self.path, f"unsupported GGUF version {version} (expected 3)")
        self._pos = 24
        try:
            for _ in range(n_kv):
                key = self._string()
                self.metadata[key] = self._value(struct.unpack_from("<I", buf, self._pos)[0], skip=4)
            infos = [self._tensor_info() for _ in range(n_tensors)]
        except (struct.error, IndexError, ValueError, UnicodeDecodeError):
            raise ModelError(self.path, f"truncated or corrupt GGUF header ({size} bytes)") from None
        align = int(self.metadata.get("general.alignment", 32))
        data_start = -(-self._pos // align) * align
        for name, qtype, shape, rel in infos:
            info = TensorInfo(name, qtype, shape, data_start + rel, _byte_size(self.path, name, qtype, shape))
            if info.offset + info.n_bytes > size:
                raise ModelError(
                    self.path,
                    f"truncated file: tensor {name!r} ends at byte {info.offset + info.n_bytes:,} "
                    f"but the file has {size:,} bytes",
                )
            self.tensors[name] = info

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._map, self._pos)
        start = self._pos + 8
        if start + n > len(self._map):
            raise ValueError("string past end")
        self._pos = start + n
        return self._map[start:self._pos].decode("utf-8")

    def _value(self, vtype: int, skip: int = 0) -> Any:
        self._pos += skip
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", self._map, self._pos)
            self._pos += 12
            if etype == _STRING:
                return [self._string() for _ in range(count)]
            if etype in _NUMPY_OF:
                dtype = np.dtype(_NUMPY_OF[etype])
                end = self._pos + count * dtype.itemsize
                if end > len(self._map):
                    raise ValueError("array past end")
                arr = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos).copy()
                self._pos = end
                return arr
            return [self._value(etype) for _ in range(count)]
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown value type {vtype}")
        (val,) = struct.unpack_from("<" + fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return val

    def _tensor_info(self) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
        name = self._string()
        (n_dims,) = struct.unpack_from("<I", self._map, self._pos)
        if n_dims > 4:
            raise ValueError("too many dims")
        ne = struct.unpack_from(f"<{n_dims}Q", self._map, self._pos + 4)
        self._pos += 4 + 8 * n_dims
        raw_type, rel = struct.unpack_from("<IQ", self._map, self._pos)
        self._pos += 12
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ModelError(self.path, f"tensor {name!r} has unknown type id {raw_type}") from None
        return name, qtype, tuple(int(n) for n in reversed(ne)), rel

    # -- access ------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only view into the memory map: [..., bytes per row]."""
        info = self.tensors[name]
        rows = info.shape[:-1]
        return np.frombuffer(self._map, dtype=np.uint8, count=info.n_bytes, offset=info.offset).reshape(
            *rows, info.n_bytes // max(1, int(np.prod(rows, dtype=np.int64)))
        )

    def close(self) -> None:
        # Views into the map may still be alive (resident weights keep none); let GC unmap then.
        self._file.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {len(self.tensors)} tensors)"


def _byte_size(path: Path, name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    if qtype not in GGML_QUANT_SIZES:
        raise ModelError(path, f"tensor {name!r} has unsupported type {qtype.name}")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[-1] % block:
        raise ModelError(path, f"tensor {name!r}: row of {shape[-1]} is not a multiple of the {qtype.name} block {block}")
    n = int(np.prod(shape, dtype=np.int64))
    return n // block * type_size


def open_gguf(path: str | Path) -> GGUFFile:
    return GGUFFile(path)


# -- typed metadata access: every miss names the key and the file ------------------------------
_MISSING = object()


def meta(gf: GGUFFile, key: str, kind: type, default: Any = _MISSING) -> Any:
    """metadata[key] checked to be of `kind` (int, float, str, bool, list); clear error otherwise."""
    value = gf.metadata.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelError(gf.path, f"missing metadata key {key!r}")
        return default
    ok = {
        int: lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float, np.number)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        bool: lambda v: isinstance(v, (bool, np.bool_)),
        list: lambda v: isinstance(v, (list, np.ndarray)),
    }[kind](value)
    if not ok:
        raise ModelError(gf.path, f"metadata key {key!r} has {type(value).__name__} value {value!r:.60}, expected {kind.__name__}")
    return kind(value) if kind in (int, float, str, bool) else value
