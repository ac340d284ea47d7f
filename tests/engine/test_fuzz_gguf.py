"""Seeded fuzzing of GGUF headers: mutations of a tiny decoder and of the tiny LightOnOCR mmproj
(byte flips, truncations, huge counts and lengths, wrong value types). Every mutant either loads
or fails with one ModelError naming the file: no other exception, no numpy warning, no hang; and
on the command line (`inspect`) exit 3 with one `error:` line. A few seconds in all.

And every metadata key the engine reads, retyped: arrays of strings as arrays of u32 / f32 /
bool, as one number or as nested arrays; arrays of numbers as strings or booleans; single
values as arrays and as another type (keys a base file leaves out, added so). Each is one
ModelError naming the key and the file, never another exception."""

from __future__ import annotations

import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from gguf import GGUFValueType as V

from pantheon_ocr.engine.format import gguf as gguf_module
from pantheon_ocr.engine.format.config import decoder_config
from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.format.writer import Typed, write_gguf
from pantheon_ocr.engine.loader import load_model
from pantheon_ocr.engine.models.lightonocr import check_mmproj
from pantheon_ocr.errors import ExitCode, ModelError

from .tiny_models import N_VOCAB, write_tiny

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


# ------------------------------------------------------------------ every key the engine reads, retyped

# The array keys and what their elements must be; every other key the engine reads is one value.
ARRAYS = {"tokenizer.ggml.tokens": str, "tokenizer.ggml.merges": str, "tokenizer.ggml.token_type": int,
          "tokenizer.ggml.scores": float, "clip.vision.image_mean": float, "clip.vision.image_std": float}


def rewritten(src: Path, dst: Path, changes: dict) -> Path:
    """`src` written again by the engine's writer with metadata `changes` (writer.Typed values
    for types the value alone does not say) applied; tensors copied as stored."""
    gf = open_gguf(src)
    try:
        tensors = [(t.name, np.array(gf.raw(t.name)), t.qtype) for t in gf.tensors.values()]
        return write_gguf(dst, gf.metadata["general.architecture"], gf.metadata | changes, tensors)
    finally:
        gf.close()


@pytest.fixture(scope="module")
def typed_bases(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """A file for every branch that reads keys of its own: gpt2 and SentencePiece tokenizers
    (scores, unknown id), linear rope scaling, llama's sliding window, experts, the mmproj."""
    folder = tmp_path_factory.mktemp("typed-bases")
    for arch in ("qwen3", "mistral", "mixtral"):
        write_tiny(folder / f"{arch}.gguf", arch)
    rewritten(folder / "qwen3.gguf", folder / "spm.gguf", {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": np.zeros(N_VOCAB, np.float32),
        "qwen3.rope.scaling.type": "linear", "qwen3.rope.scaling.factor": 2.0})
    return {name: (folder / f"{name}.gguf", load_text) for name in ("qwen3", "spm", "mistral", "mixtral")} | \
        {"mmproj": (MMPROJ, load_mmproj)}


def keys_read(path: Path, load, monkeypatch) -> dict[str, object]:
    """key -> value (None: absent, read for its default) of every key loading `path` reads."""
    seen: dict[str, object] = {}
    lookup = gguf_module._lookup

    def recording(gf, key, default):
        seen.setdefault(key, gf.metadata.get(key))
        return lookup(gf, key, default)

    with monkeypatch.context() as m:
        m.setattr(gguf_module, "_lookup", recording)
        load(path)
    return seen


def retypes(key: str, value) -> list:
    """Values of the wrong type for `key` (currently `value`; None when absent)."""
    n = len(value) if key in ARRAYS else 4
    arrays = [np.arange(n, dtype=np.uint32), np.linspace(0.5, 1.0, n, dtype=np.float32), np.ones(n, dtype=np.bool_),
              [f"s{i}" for i in range(n)], Typed([["a", "b"]] * 2, V.ARRAY, V.ARRAY), Typed(7, V.UINT32)]
    if key in ARRAYS:  # the element types it takes left out
        ok = {str: (3,), int: (0,), float: (0, 1)}[ARRAYS[key]]
        return [a for i, a in enumerate(arrays) if i not in ok]
    wrong_single = {bool: "yes", int: "12", float: "1.5", str: Typed(7, V.UINT32)}.get(type(value), [])
    return arrays[:5] + ([wrong_single] if value is not None else [])


def test_every_metadata_key_retyped_is_one_clean_error(tmp_path, typed_bases, monkeypatch):
    problems, n = [], 0
    for base, (path, load) in typed_bases.items():
        read = keys_read(path, load, monkeypatch)
        assert {k for k, v in read.items() if isinstance(v, (list, np.ndarray))} <= ARRAYS.keys(), read.keys()
        for key, value in read.items():
            if key == "general.architecture":
                continue  # the writer always writes it as a string: retyped in memory below
            for bad in retypes(key, value):
                n += 1
                bad_path = rewritten(path, tmp_path / f"{base}-{n % 2}.gguf", {key: bad})
                try:
                    load(bad_path)
                    problems.append(f"{base} {key} = {bad!r:.40}: loaded")
                except ModelError as e:
                    if f"'{key}'" not in str(e) or str(bad_path) not in str(e):
                        problems.append(f"{base} {key} = {bad!r:.40}: does not name the key and the file: {e}")
                except Exception as e:  # noqa: BLE001 - exactly what this test looks for
                    problems.append(f"{base} {key} = {bad!r:.40}: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems[:20])
    assert n > 150  # every base's keys were retyped (about 40 keys each)


@pytest.mark.parametrize("value", [np.arange(3, dtype=np.uint32), ["qwen3"], 7, True])
def test_architecture_retyped(typed_bases, value):
    for base, check in (("qwen3", decoder_config), ("mmproj", check_mmproj)):
        gf = open_gguf(typed_bases[base][0])
        gf.metadata["general.architecture"] = value  # as the parser would give a file of that type
        with pytest.raises(ModelError, match="metadata key 'general.architecture' must be a string, but it holds"):
            check(gf)


def test_tokens_as_one_number_on_the_command_line(tmp_path, typed_bases):
    bad = rewritten(typed_bases["qwen3"][0], tmp_path / "bad.gguf", {"tokenizer.ggml.tokens": Typed(320, V.UINT32)})
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "inspect", str(bad)], capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == ExitCode.BAD_MODEL and lines == [
        f"error: {bad}: metadata key 'tokenizer.ggml.tokens' must be an array of strings, but it holds a single integer (320)"]
