"""GGUF metadata checked with bounds and types at load: each bad value is one `error:` line naming
the key, exit 3, before anything is allocated from it; in `inspect` too (mmproj tensors
included). Special files and a model larger than the address space are clear errors as well."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from pantheon_ocr.engine.format.gguf import open_gguf
from pantheon_ocr.engine.loader import load_model
from pantheon_ocr.engine.models.lightonocr import check_mmproj
from pantheon_ocr.errors import ExitCode, ModelError

from .tiny_models import write_tiny

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lightonocr-tiny"
T = gguf.GGUFValueType


def rewrite(src: Path, dst: Path, changes: dict, drop_tensor: str | None = None) -> Path:
    """`src` written again with metadata `changes` {key: (value, type[, sub_type])} applied."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in changes:
            value, vtype, *sub = changes.pop(name)
            w.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
        elif field.types[0] == T.ARRAY:
            w.add_key_value(name, field.contents(), T.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), field.types[0])
    for name, (value, vtype, *sub) in changes.items():
        w.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
    for t in reader.tensors:
        if t.name != drop_tensor:
            w.add_tensor(t.name, np.array(t.data), raw_shape=None, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def inspect(path: Path, timeout: float = 120) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "inspect", str(path)], capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def assert_refused(path: Path, load, needle: str) -> None:
    with pytest.raises(ModelError) as e:
        load(path)
    assert str(path) in str(e.value) and needle in str(e.value), str(e.value)
    code, lines = inspect(path)
    assert code == ExitCode.BAD_MODEL and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def load_text(path: Path) -> None:
    load_model(path, "quantized").tokenizer


def load_mmproj(path: Path) -> None:
    check_mmproj(open_gguf(path))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "qwen3.gguf"
    write_tiny(path, "qwen3")
    return path


@pytest.mark.parametrize("changes, needle", [
    ({"general.alignment": (0, T.UINT32)}, "'general.alignment' is 0: it must be a power of two"),
    ({"general.alignment": (48, T.UINT32)}, "must be a power of two"),
    ({"qwen3.attention.key_length": (2**31, T.UINT32)}, "'qwen3.attention.key_length' is 2147483648"),
    ({"qwen3.context_length": (0, T.UINT32)}, "'qwen3.context_length' is 0: it must be between 1"),
    ({"qwen3.context_length": (-1, T.INT32)}, "'qwen3.context_length' is -1"),
    ({"qwen3.block_count": (100000, T.UINT32)}, "'qwen3.block_count' is 100000"),
    ({"qwen3.attention.layer_norm_rms_epsilon": (float("nan"), T.FLOAT32)}, "must be a finite number > 0"),
    ({"qwen3.rope.freq_base": (-1.0, T.FLOAT32)}, "'qwen3.rope.freq_base' is -1.0"),
    ({"tokenizer.ggml.tokens": (list(range(320)), T.ARRAY, T.UINT32)}, "must be an array of strings, but it holds uint32"),
    ({"tokenizer.ggml.merges": ([["a", "b"]] * 4, T.ARRAY, T.ARRAY)}, "'tokenizer.ggml.merges' must be an array of strings"),
    ({"tokenizer.ggml.token_type": (["1"] * 320, T.ARRAY, T.STRING)}, "'tokenizer.ggml.token_type' must be an array of integers"),
])
def test_bad_decoder_metadata(tmp_path, qwen3, changes, needle):
    assert_refused(rewrite(qwen3, tmp_path / "bad.gguf", dict(changes)), load_text, needle)


@pytest.mark.parametrize("changes, needle", [
    ({"clip.vision.image_size": (2**31, T.UINT32)}, "'clip.vision.image_size' is 2147483648: it must be between 1 and 10,000"),
    ({"clip.vision.image_mean": (["0.5", "0.5", "0.5"], T.ARRAY, T.STRING)}, "'clip.vision.image_mean' must hold 3 finite numbers"),
    ({"clip.vision.image_std": ([0.5, float("inf"), 0.5], T.ARRAY, T.FLOAT32)}, "'clip.vision.image_std' must hold 3 finite"),
    ({"clip.vision.patch_size": (100000, T.UINT32)}, "'clip.vision.patch_size' is 100000"),
])
def test_bad_mmproj_metadata(tmp_path, changes, needle):
    assert_refused(rewrite(FIXTURE / "mmproj.gguf", tmp_path / "bad.gguf", dict(changes)), load_mmproj, needle)


def test_inspect_validates_mmproj_tensors(tmp_path):
    bad = rewrite(FIXTURE / "mmproj.gguf", tmp_path / "bad.gguf", {}, drop_tensor="mm.2.weight")
    assert_refused(bad, load_mmproj, "missing tensor 'mm.2.weight'")
    code, lines = inspect(FIXTURE / "mmproj.gguf")
    assert code == 0, lines


def test_tensor_dims_that_overflow_int64_give_no_numpy_warning(tmp_path, qwen3):
    data = bytearray(qwen3.read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # its tensor info: n_dims, ne[0], ne[1]
    struct.pack_into("<QQ", data, at + 4, 2**63 + 32, 2**62)
    (tmp_path / "huge.gguf").write_bytes(bytes(data))
    assert_refused(tmp_path / "huge.gguf", load_text, "truncated file (or a corrupt header)")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_model_that_is_not_a_regular_file(tmp_path, kind):
    path = tmp_path / "model.gguf"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    needle = "FIFO" if kind == "fifo" else "folder"
    with pytest.raises(ModelError, match=needle):
        open_gguf(path)
    code, lines = inspect(path, timeout=60)  # never blocks in open(); a folder is read as a model folder
    assert code == (ExitCode.BAD_MODEL if kind == "fifo" else ExitCode.BAD_ARGUMENTS) and (
        needle if kind == "fifo" else "should hold one text GGUF") in lines[-1], lines
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(tmp_path), "--model", str(path),
                           "--mmproj", str(FIXTURE / "mmproj.gguf"), "-o", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and proc.returncode != 0


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and sparse files as on Linux")
def test_model_larger_than_the_address_space(tmp_path, qwen3):
    path = tmp_path / "big.gguf"
    path.write_bytes(qwen3.read_bytes())
    os.truncate(path, 64 << 30)  # sparse: 64 GiB that take no disk

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "inspect", str(path)], capture_output=True,
                          text=True, timeout=120, preexec_fn=limit, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == ExitCode.BAD_MODEL and len(lines) == 1, proc.stderr
    assert "cannot map the model file (64.0 GiB) into memory" in lines[0]


BUNDLED_MMPROJ = Path(__file__).resolve().parents[2] / "pantheon_ocr" / "bundled" / "reader" / "mmproj-pantheon-reader.gguf"


@pytest.mark.parametrize("value, vtype, needle", [
    (3.0, T.FLOAT32, "'pantheon.reader.line_stretch' (3) must be between 0.5 and 2"),
    (0.0, T.FLOAT32, "'pantheon.reader.line_stretch' (0) must be between 0.5 and 2"),
    (float("nan"), T.FLOAT32, "'pantheon.reader.line_stretch' (nan) must be between 0.5 and 2"),
    ("wide", T.STRING, "'pantheon.reader.line_stretch' must be"),
])
def test_a_readers_line_stretch_is_checked(tmp_path, value, vtype, needle):
    """pantheon.reader.line_stretch (how much wider than the page shows it a line crop is drawn)
    is read as a number in a sane range, or the file is refused naming the key."""
    from pantheon_ocr.engine.models.reader import reading_hints

    bad = rewrite(BUNDLED_MMPROJ, tmp_path / "bad.gguf", {"pantheon.reader.line_stretch": (value, vtype)})
    with pytest.raises(ModelError) as e:
        reading_hints(open_gguf(bad), 1400, 14, 2)
    assert str(bad) in str(e.value) and needle in str(e.value), str(e.value)
    good = rewrite(BUNDLED_MMPROJ, tmp_path / "good.gguf", {"pantheon.reader.line_stretch": (1.25, T.FLOAT32)})
    assert reading_hints(open_gguf(good), 1400, 14, 2).line_stretch == 1.25
    assert reading_hints(open_gguf(FIXTURE / "mmproj.gguf"), 1400, 14, 2).line_stretch == 1.0  # names none
