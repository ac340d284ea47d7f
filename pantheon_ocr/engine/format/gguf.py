"""Open a GGUF file: header and metadata parsed eagerly, tensor data memory-mapped.

We parse the header ourselves instead of using `gguf.GGUFReader`: the reader builds a numpy
view per string (about 6 s for a 151k-token vocabulary) and fails on truncated files with
low-level errors. Type constants and block sizes still come from the `gguf` package.

Everything in the header is untrusted: only a regular file is opened (a FIFO would block
`open()` forever), counts and sizes are checked against the file's size before anything is
allocated, tensor dims are multiplied as Python ints (no silent int64 overflow), the alignment
must be a power of two, and a file that cannot be mapped (larger than the address space) is a
ModelError like any other bad model file.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...errors import ModelError

GGUF_MAGIC = b"GGUF"
_SCALARS = {  # GGUF value type id -> struct format
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_NUMPY_OF = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
             6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 4  # arrays of arrays of ...: real files use none; deeper is a corrupt or hostile header
MAX_ALIGNMENT = 1 << 16


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
        self._file = _open_regular(self.path)
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size < 24:
                raise ModelError(self.path, f"not a GGUF file (only {size} bytes)")
            try:
                self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError, OverflowError) as exc:
                raise ModelError(self.path, f"cannot map the model file ({size / 2**30:.1f} GiB) into memory: "
                                            f"{(exc.strerror if isinstance(exc, OSError) else None) or exc} (is the address space limited, "
                                            "e.g. by ulimit -v, or the file larger than this system can map?)") from None
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
        # Every key/value and tensor entry takes at least 12 bytes: larger counts cannot be true.
        if n_kv > size // 12 or n_tensors > size // 12:
            raise ModelError(self.path, f"corrupt GGUF header: it claims {n_kv:,} metadata keys and {n_tensors:,} tensors "
                                        f"in a {size:,}-byte file")
        self._pos = 24
        try:
            for _ in range(n_kv):
                key = self._string()
                if key in self.metadata:
                    raise ModelError(self.path, f"corrupt GGUF header: metadata key {key!r} appears twice")
                self.metadata[key] = self._value(struct.unpack_from("<I", buf, self._pos)[0], skip=4)
            infos = [self._tensor_info() for _ in range(n_tensors)]
        except (struct.error, IndexError, ValueError, UnicodeDecodeError, RecursionError):
            raise ModelError(self.path, f"truncated or corrupt GGUF header ({size} bytes)") from None
        align = meta(self, "general.alignment", int, 32)
        if not 0 < align <= MAX_ALIGNMENT or align & (align - 1):
            raise ModelError(self.path, f"metadata key 'general.alignment' is {align}: it must be a power of two "
                                        f"up to {MAX_ALIGNMENT}")
        data_start = -(-self._pos // align) * align
        for name, qtype, shape, rel in infos:
            if name in self.tensors:
                raise ModelError(self.path, f"corrupt GGUF header: tensor {name!r} appears twice")
            info = TensorInfo(name, qtype, shape, data_start + rel, _byte_size(self.path, name, qtype, shape, size))
            if rel % align:
                raise ModelError(self.path, f"corrupt GGUF header: tensor {name!r} data offset {rel} is not a "
                                            f"multiple of the alignment {align}")
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

    def _value(self, vtype: int, skip: int = 0, depth: int = 0) -> Any:
        self._pos += skip
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", self._map, self._pos)
            self._pos += 12
            if depth >= _MAX_NESTING or count > len(self._map) - self._pos:  # every element takes >= 1 byte
                raise ValueError("array nested too deep or longer than the file")
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
            return [self._value(etype, depth=depth + 1) for _ in range(count)]
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
            *rows, info.n_bytes // max(1, math.prod(rows))
        )

    def release(self, name: str) -> None:
        """The tensor's data was copied out of the map (resident weights): let the kernel drop its
        pages from this process's resident set. The map is read-only and backed by the file, so a
        later read faults them back in from it; only whole pages inside the tensor are dropped.
        Why: an int8 or dequantized copy would otherwise count twice, beside the pages it was read from."""
        info = self.tensors[name]
        lo = -(-info.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = (info.offset + info.n_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):  # Linux, macOS; elsewhere the pages stay
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        # Views into the map may still be alive (4-bit groups keep one, for row lookups); let GC unmap then.
        if getattr(self, "_file", None) is not None:
            self._file.close()

    # An engine's weights live as long as the engine, which has no close of its own: its files go
    # with it, closed rather than left to the collector (ResourceWarning after every Reader).
    __del__ = close

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {len(self.tensors)} tensors)"


def _byte_size(path: Path, name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...], file_size: int) -> int:
    if qtype not in GGML_QUANT_SIZES:
        raise ModelError(path, f"tensor {name!r} has unsupported type {qtype.name}")
    if not shape or min(shape) < 1:
        raise ModelError(path, f"tensor {name!r} has shape {list(shape)}: every dimension must be at least 1")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ModelError(path, f"tensor {name!r}: row of {shape[-1]} is not a multiple of the {qtype.name} block {block}")
    n_bytes = math.prod(shape) // block * type_size  # Python ints: a dim of 2**63 cannot wrap around
    if n_bytes > file_size:
        raise ModelError(path, f"truncated file (or a corrupt header): tensor {name!r} of shape {list(shape)} needs "
                               f"{n_bytes:,} bytes, more than the whole {file_size:,}-byte file")
    return n_bytes


def _open_regular(path: Path):
    """The model file, opened only if it is a regular file (O_NONBLOCK: a FIFO cannot block)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelError(path, f"cannot open model file: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a special file"
        raise ModelError(path, f"not a model file: {what}, not a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_gguf(path: str | Path) -> GGUFFile:
    return GGUFFile(path)


# -- typed metadata access: every miss names the key and the file ------------------------------
# Every key the engine reads goes through `meta` (a single value) or `meta_array` (an array, its
# element type checked too): a value of another type is one ModelError naming the key and the
# file, never a TypeError further on. Values as GGUFFile parses them: Python int / float / bool /
# str for single values, numpy arrays for arrays of numbers or booleans, lists for arrays of
# strings and nested arrays.
_MISSING = object()
_KINDS = {  # kind -> (what it is called, accepts)
    int: ("an integer", lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))),
    float: ("a number", lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))),
    str: ("a string", lambda v: isinstance(v, str)),
    bool: ("a boolean", lambda v: isinstance(v, (bool, np.bool_))),
}
_ELEMENT_KINDS = {  # array element kind -> (what they are called, numpy dtype kinds accepted)
    str: ("strings", ""),
    int: ("integers", "iu"),
    float: ("numbers", "iuf"),
    bool: ("booleans", "b"),
}
_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _held(value: Any) -> str:
    """What a metadata value holds, for messages: "uint32 values [0, 1, ...]", "a single
    integer (5)", "string values ['a', ...]", "nested arrays"."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name} values {_short(value.tolist())}"
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        if kinds and kinds <= {list, np.ndarray}:
            return "nested arrays"
        if kinds == {str}:
            return f"string values {_short(value)}"
        return "an empty array" if not value else "values of mixed types"
    return f"a single {_NAMES.get(type(value), type(value).__name__)} ({_short(value)})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _lookup(gf: GGUFFile, key: str, default: Any) -> Any:
    value = gf.metadata.get(key, _MISSING)
    if value is _MISSING and default is _MISSING:
        raise ModelError(gf.path, f"missing metadata key {key!r}")
    return value


def meta(gf: GGUFFile, key: str, kind: type, default: Any = _MISSING) -> Any:
    """metadata[key], a single value of `kind` (int, float, str, bool), as that Python type;
    `default` when the key is absent (else a ModelError), a ModelError naming the key when it
    holds anything else (an array included). Arrays: `meta_array`."""
    what, accepts = _KINDS[kind]
    value = _lookup(gf, key, default)
    if value is _MISSING:
        return default
    if not accepts(value):
        raise ModelError(gf.path, f"metadata key {key!r} must be {what}, but it holds {_held(value)}")
    return kind(value)


def meta_array(gf: GGUFFile, key: str, of: type, default: Any = _MISSING, *, length: int | None = None,
               finite: bool = False) -> Any:
    """metadata[key], an array whose elements are all of kind `of` (str, int, float, bool): a
    list of str, or a numpy array of numbers (any integer dtype for int, any integer or float
    dtype for float) or booleans; with `length`, exactly that many; with `finite`, no inf or
    nan. `default` when the key is absent (else a ModelError); anything else (a single value, a
    string array for numbers, numbers for strings, nested arrays) is a ModelError naming the key."""
    words, kinds = _ELEMENT_KINDS[of]
    value = _lookup(gf, key, default)
    if value is _MISSING:
        return default
    if of is str:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, np.ndarray) and value.dtype.kind in kinds
    ok = ok and (length is None or len(value) == length) and (not finite or bool(np.all(np.isfinite(value))))
    if not ok:
        things = ("finite " if finite else "") + words
        want = f"be an array of {things}" if length is None else f"hold {length} {things}"
        raise ModelError(gf.path, f"metadata key {key!r} must {want}, but it holds {_held(value)}")
    return list(value) if of is str else value
