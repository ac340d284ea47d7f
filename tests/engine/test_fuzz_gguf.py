"""Seeded fuzzing of GGUF headers: mutations of a tiny decoder and of the tiny LightOnOCR mmproj
(byte flips, truncations, huge counts and lengths, wrong value types). Every mutant either loads
or fails with one ModelError naming the file: no other exception, no numpy warning, no hang; and
on the command line (`inspect`) exit 3 with one `error:` line. A few seconds in all."""

from __future__ import annotations

import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.loader import load_model
from pantheon_ocr.engine.models.lightonocr import check_mmproj
from pantheon_ocr.errors import ExitCode, ModelError

from .tiny_models import write_tiny

SEED = 20260412
N_MUTANTS = 250  # per base file
MMPROJ = Path(__file__).resolve().parents[1] / "fixtures" / "lightonocr-tiny" / "mmproj.gguf"
HUGE = (2**63 - 1, 2**64 - 1, 2**32, 2**31, 2**40 + 3, 0)


def header_fields(data: bytes) -> list[tuple[str, int]]:
    """(kind, offset) of every count, length and type field of a well-formed GGUF header:
    the targets of the 'huge' and 'type' mutations."""
    fields = [("count", 8), ("count", 16)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(pos):
        fields.append(("count", pos))
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n

    def value(pos, vtype):
        if vtype == 8:
            return string(pos)
        if vtype == 9:
            fields.append(("type", pos))
            fields.append(("count", pos + 4))
            etype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if etype == 8:
                for _ in range(count):
                    pos = string(pos)
                return pos
            return pos + count * {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[etype]
        return pos + {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[vtype]

    for _ in range(n_kv):
        pos = string(pos)
        fields.append(("type", pos))
        pos = value(pos + 4, struct.unpack_from("<I", data, pos)[0])
    for _ in range(n_tensors):
        pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        fields += [("dims", pos)] + [("count", pos + 4 + 8 * i) for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        fields += [("type", pos), ("count", pos + 4)]  # tensor type, data offset
        pos += 12
    return fields


def mutants(data: bytes, rng: np.random.Generator, n: int):
    fields = header_fields(data)
    header_end = max(off for _, off in fields) + 12
    for i in range(n):
        m = bytearray(data)
        how = ("flip", "truncate", "huge", "type")[i % 4]
        if how == "flip":
            for pos in rng.integers(0, header_end, size=int(rng.integers(1, 5))):
                m[pos] = int(rng.integers(0, 256))
        elif how == "truncate":
            m = m[: int(rng.integers(0, len(data)))]
        else:
            kind = "count" if how == "huge" else ("type", "dims")[int(rng.integers(0, 2))]
            offsets = [off for k, off in fields if k == kind]
            off = offsets[int(rng.integers(0, len(offsets)))]
            if how == "huge":
                struct.pack_into("<Q", m, off, HUGE[int(rng.integers(0, len(HUGE)))])
            else:
                struct.pack_into("<I", m, off, int(rng.integers(0, 40)))
        yield f"{how} #{i}", bytes(m)


def load_text(path: Path) -> None:
    load_model(path, "quantized").tokenizer  # the tokenizer is built on first use: build it


def load_mmproj(path: Path) -> None:
    check_mmproj(open_gguf(path))


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, tuple[bytes, object]]:
    folder = tmp_path_factory.mktemp("fuzz-bases")
    write_tiny(folder / "qwen3.gguf", "qwen3")
    return {"qwen3": ((folder / "qwen3.gguf").read_bytes(), load_text), "mmproj": (MMPROJ.read_bytes(), load_mmproj)}


@pytest.mark.parametrize("base", ["qwen3", "mmproj"])
def test_mutated_headers_load_or_fail_cleanly(tmp_path, bases, base):
    data, load = bases[base]
    load(_write(tmp_path / "good.gguf", data))  # the base itself loads
    rng = np.random.default_rng(SEED + (base == "mmproj"))
    problems, failed = [], []
    for name, blob in mutants(data, rng, N_MUTANTS):
        path = _write(tmp_path / f"m{len(failed) % 2}.gguf", blob)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                load(path)
            except ModelError as e:
                if str(path) not in str(e):
                    problems.append(f"{name}: error does not name the file: {e}")
                failed.append((name, blob))
            except Exception as e:  # noqa: BLE001 - exactly what this test looks for
                problems.append(f"{name}: {type(e).__name__}: {e}")
        # (a file left to the garbage collector after an error is not the user's concern)
        problems += [f"{name}: warning {w.category.__name__}: {w.message}" for w in caught
                     if not issubclass(w.category, ResourceWarning)]
    assert not problems, "\n".join(problems[:20])
    assert len(failed) > N_MUTANTS // 4  # the mutations do hit: most damaged headers are refused
    # The same on the command line, for a sample: exit 3, one line, no traceback, no warnings.
    for name, blob in failed[:: max(1, len(failed) // 6)][:6]:
        path = _write(tmp_path / "cli.gguf", blob)
        proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "inspect", str(path)], capture_output=True,
                              text=True, timeout=120)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == ExitCode.BAD_MODEL and len(lines) == 1 and lines[0].startswith("error: "), (name, proc.stderr)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
