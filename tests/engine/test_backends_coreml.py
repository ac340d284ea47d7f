"""Core ML backend: conversion to an ML program works (anywhere coremltools installs) and the
package has the expected inputs and outputs; its padding/selection logic is checked through the
same traced graph run by torch. Core ML numerics run only on macOS."""

from __future__ import annotations

import platform
import warnings

import numpy as np
import pytest

# as the engine does before importing torch (backends.require_torch): its OpenMP spin
from pantheon_ocr.engine.backends.common import openmp_env  # noqa: E402

openmp_env()

pytest.importorskip("torch")
ct = pytest.importorskip("coremltools")

from pantheon_ocr.engine import load_vlm  # noqa: E402
from pantheon_ocr.engine.backends import coreml as C  # noqa: E402

from .conftest import LIGHTONOCR_DIR, LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT  # noqa: E402

MACOS = platform.system() == "Darwin"


@pytest.fixture(scope="module")
def vlm():
    return load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights="f32")


@pytest.fixture(scope="module")
def converted(vlm, tmp_path_factory):
    """One conversion shared by the tests: the 8x16 bucket (image a: 8x11 patches)."""
    be = C.CoreMLVisionBackend(vlm, cache_dir=tmp_path_factory.mktemp("coreml"), runtime=False)
    return be, be.ensure_package((8, 16))


def _shape(feature):
    return list(feature.type.multiArrayType.shape)


def test_conversion_writes_a_cached_ml_program(converted, vlm):
    be, path = converted
    sha = C.file_sha256(LIGHTONOCR_MMPROJ)
    assert path.name == f"vision-{C.FORMAT}-{sha[:16]}-8x16-fp32.mlpackage" and path.is_dir()
    spec = ct.utils.load_spec(str(path))
    assert spec.WhichOneof("Type") == "mlProgram"
    ins = {f.name: f for f in spec.description.input}
    outs = {f.name: f for f in spec.description.output}
    assert list(ins) == ["pixels", "patch_mask"] and list(outs) == ["features"]
    assert _shape(ins["pixels"]) == [1, 3, 8 * 14, 16 * 14]
    assert _shape(ins["patch_mask"]) == [1, 8 * 16]
    assert _shape(outs["features"]) == [4 * 8, vlm.config.n_embd]
    f32 = ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    assert all(f.type.multiArrayType.dataType == f32 for f in (*ins.values(), *outs.values()))
    main = spec.mlProgram.functions["main"]
    ops = {op.type for block in main.block_specializations.values() for op in block.operations}
    assert "scaled_dot_product_attention" in ops  # fused attention (macOS 15 opset), not [H, N, N] scores
    meta = dict(spec.description.metadata.userDefined)
    assert meta["pantheon_ocr.mmproj_sha256"] == sha and meta["pantheon_ocr.bucket"] == "8x16"
    # cached: same bucket (another page size inside it) -> no new conversion
    assert be.bucket(8, 11) == be.bucket(7, 9) == (8, 16)
    assert be.ensure_package(be.bucket(7, 9)) == path and be.conversions == 1
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_float16_package_is_keyed_apart(vlm, tmp_path):
    be = C.CoreMLVisionBackend(vlm, dtype="float16", cache_dir=tmp_path, runtime=False)
    path = be.ensure_package((8, 8))
    assert path.name.endswith("-8x8-fp16.mlpackage")
    spec = ct.utils.load_spec(str(path))
    assert [f.name for f in spec.description.output] == ["features"]


def test_encode_pads_and_selects_exactly(vlm, converted, monkeypatch):
    """encode() with the bucket's traced torch graph standing in for the Core ML runtime."""
    import torch

    from pantheon_ocr.engine.backends.torch_vision import FixedGrid

    be, _ = converted
    graphs = {}

    def predict(bucket, px, mask):
        if bucket not in graphs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graphs[bucket] = torch.jit.trace(FixedGrid(be._module, *bucket).eval(),
                                                 (torch.from_numpy(px), torch.from_numpy(mask)), check_trace=False)
        with torch.inference_mode():
            return graphs[bucket](torch.from_numpy(px), torch.from_numpy(mask)).numpy()

    monkeypatch.setattr(be, "predict", predict)
    for name in ("a_rgb_150x110", "c_rgba_90x60", "d_text_300x120"):
        px = vlm.preprocess(LIGHTONOCR_DIR / "images" / f"{name}.png")
        want = vlm.encode_image(px)
        got = be.encode(px)
        assert got.shape == want.shape
        assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def test_cache_dir_next_to_the_model_or_user_cache(tmp_path, monkeypatch):
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    mmproj = model_dir / "mmproj.gguf"
    assert C.default_cache_dir(mmproj) == model_dir.resolve() / ".pantheon-ocr-cache" / "coreml"
    monkeypatch.setattr(C.os, "access", lambda path, mode: False)  # a read-only model directory
    monkeypatch.setenv("PANTHEON_OCR_CACHE", str(tmp_path / "cache"))
    assert C.default_cache_dir(mmproj) == tmp_path / "cache" / "coreml"


def test_runtime_needs_macos(vlm):
    if MACOS:
        pytest.skip("this is macOS: Core ML can run here")
    from pantheon_ocr.engine.backends import BackendUnavailable, make_vision_backend

    with pytest.raises(BackendUnavailable, match="only on macOS"):
        make_vision_backend("coreml", vlm)


@pytest.mark.skipif(C.macos_major() < C.MIN_MACOS, reason=f"Core ML executes these programs only on macOS "
                    f"{C.MIN_MACOS}+; conversion and I/O are tested above")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float16", 5e-2)])
def test_coreml_numerics_on_macos(vlm, tmp_path, dtype, tol):
    from pantheon_ocr.engine.backends import make_vision_backend

    be = make_vision_backend("coreml", vlm, dtype=dtype, cache_dir=tmp_path)
    for name in ("a_rgb_150x110", "b_wide_2000x437", "c_rgba_90x60", "d_text_300x120"):
        px = vlm.preprocess(LIGHTONOCR_DIR / "images" / f"{name}.png")
        want = vlm.encode_image(px)
        got = be.encode(px)
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), name
