"""Bad model files: one clear error line, exit code 3, no traceback, never a crash or hang."""

from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest

from pantheon_ocr.engine import load_model
from pantheon_ocr.errors import ExitCode, ModelError

from .tiny_models import make_tiny, write_gguf


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *args], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def assert_clean_failure(path, needle):
    with pytest.raises(ModelError) as exc:
        load_model(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)
    for args in (["inspect", str(path)], ["generate", "--model", str(path), "--prompt", "hi"]):
        code, out, err = cli(*args)
        assert code == ExitCode.BAD_MODEL, (args, code, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
        assert "Traceback" not in err


def write_edited(tmp_path, edit, arch="llama"):
    """The tiny model with `edit(tensors dict)` applied before writing with GGUFWriter."""
    cfg, sd = make_tiny(arch)
    good = write_gguf(tmp_path / "good.gguf", arch, cfg, sd)
    reader = gguf.GGUFReader(good)
    out = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(out, arch=str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, value, vtype)
    tensors = {t.name: (np.array(t.data), t.tensor_type) for t in reader.tensors}
    edit(tensors, w)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_wrong_magic(tmp_path):
    p = tmp_path / "notgguf.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    assert_clean_failure(p, "not a GGUF file")


def test_empty_and_missing_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    assert_clean_failure(p, "not a GGUF file")
    code, _, err = cli("inspect", str(tmp_path / "nope.gguf"))
    assert code == ExitCode.BAD_MODEL and "Traceback" not in err  # a model file that is not there is a bad model file


def test_truncated_header(tmp_path):
    cfg, sd = make_tiny("qwen3")
    good = write_gguf(tmp_path / "good.gguf", "qwen3", cfg, sd)
    p = tmp_path / "cut.gguf"
    p.write_bytes(good.read_bytes()[:300])
    assert_clean_failure(p, "truncated")


def test_truncated_tensor_data(tmp_path):
    cfg, sd = make_tiny("qwen3")
    good = write_gguf(tmp_path / "good.gguf", "qwen3", cfg, sd)
    p = tmp_path / "cut.gguf"
    data = good.read_bytes()
    p.write_bytes(data[: len(data) - 1000])
    assert_clean_failure(p, "truncated file")


def test_real_truncated_7b_from_pypi():
    from pypi_models import truncated_qwen7b_path

    try:
        path = truncated_qwen7b_path()
    except ModelError as exc:
        pytest.skip(str(exc))
    assert_clean_failure(path, "truncated file")


def test_missing_tensor(tmp_path):
    p = write_edited(tmp_path, lambda t, w: t.pop("blk.1.ffn_down.weight"))
    assert_clean_failure(p, "missing tensor 'blk.1.ffn_down.weight'")


def test_wrong_shape(tmp_path):
    def edit(t, w):
        data, qtype = t["blk.0.attn_v.weight"]
        t["blk.0.attn_v.weight"] = (data[:-1].copy(), qtype)

    p = write_edited(tmp_path, edit)
    assert_clean_failure(p, "tensor 'blk.0.attn_v.weight' has shape")


def test_unsupported_quant_type(tmp_path):
    def edit(t, w):
        # IQ4_NL: a real ggml type (32 values in 18 bytes) the engine does not run.
        data, _ = t["blk.0.ffn_up.weight"]
        raw = np.zeros((data.shape[0], data.shape[1] // 32 * 18), dtype=np.uint8)
        t["blk.0.ffn_up.weight"] = (raw, gguf.GGMLQuantizationType.IQ4_NL)

    p = write_edited(tmp_path, edit)
    assert_clean_failure(p, "unsupported type IQ4_NL")


def test_unknown_architecture(tmp_path):
    cfg, sd = make_tiny("qwen3")
    good = write_gguf(tmp_path / "good.gguf", "qwen3", cfg, sd)
    data = bytearray(good.read_bytes())
    i = data.index(b"qwen3")  # the general.architecture value comes first
    data[i : i + 5] = b"mamba"
    p = tmp_path / "mamba.gguf"
    p.write_bytes(bytes(data))
    assert_clean_failure(p, "unsupported architecture 'mamba'")


def test_missing_metadata_key(tmp_path):
    cfg, sd = make_tiny("llama")
    good = write_gguf(tmp_path / "good.gguf", "llama", cfg, sd)
    data = bytearray(good.read_bytes())
    i = data.index(b"llama.block_count")
    data[i : i + 17] = b"llama.blokk_count"
    p = tmp_path / "nokey.gguf"
    p.write_bytes(bytes(data))
    assert_clean_failure(p, "missing metadata key 'llama.block_count'")


def test_traceback_only_with_verbose(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"nonsense" * 10)
    code, _, err = cli("-v", "inspect", str(p))
    assert code != 0 and "Traceback" in err
