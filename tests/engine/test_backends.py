"""Vision backend selection and errors, and the bucket maths; no torch or coremltools needed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pantheon_ocr.engine import backends as B
from pantheon_ocr.engine.backends.buckets import bucket_grid, max_grid_side, merged_rows, pad_pixels, patch_mask
from pantheon_ocr.errors import ExitCode, UsageError

from .conftest import LIGHTONOCR_DIR, LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT

SAMPLE_PDF = str(LIGHTONOCR_DIR.parent.parent.parent / "samples" / "docs" / "text-1page.pdf")


def test_importing_the_package_imports_no_accelerator_library():
    code = ("import sys, pantheon_ocr.engine.backends, pantheon_ocr.engine.backends.buckets, "
            "pantheon_ocr.engine.backends.device, pantheon_ocr.engine.page_engine, pantheon_ocr.engine.loader, "
            "pantheon_ocr.commands.transcribe; "
            "bad = [m for m in ('torch', 'coremltools') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def no_extras(monkeypatch):
    """Pretend neither torch nor coremltools is installed."""
    import pantheon_ocr.engine.backends.common as common_mod
    import pantheon_ocr.engine.backends.coreml as coreml_mod

    real = common_mod.has_module
    fake = lambda name: False if name in ("torch", "coremltools") else real(name)  # noqa: E731
    for module in (B, common_mod, coreml_mod):  # each holds its own reference to has_module
        monkeypatch.setattr(module, "has_module", fake)


def test_missing_torch_says_what_to_install(no_extras):
    with pytest.raises(B.BackendUnavailable) as exc:
        B.plan_vision_backend("torch")
    assert "pip install 'pantheon-ocr[gpu]'" in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.exit_code == ExitCode.BAD_ARGUMENTS and isinstance(exc.value, UsageError)
    with pytest.raises(B.BackendUnavailable, match=r"pantheon-ocr\[gpu\]"):
        B.resolve_device("cuda")


def test_missing_coremltools_says_what_to_install(no_extras):
    with pytest.raises(B.BackendUnavailable) as exc:
        B.plan_vision_backend("coreml")
    assert "pip install 'pantheon-ocr[coreml]'" in str(exc.value) and "\n" not in str(exc.value)


def test_auto_without_extras_is_numpy(no_extras):
    name, device, reason = B.plan_vision_backend("auto")
    assert (name, device) == ("numpy", "cpu") and "pantheon-ocr[gpu]" in reason


def test_auto_on_macos_prefers_coreml(monkeypatch):
    import pantheon_ocr.engine.backends.coreml as coreml_mod

    monkeypatch.setattr(B.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(B, "has_module", lambda name: True)
    monkeypatch.setattr(coreml_mod, "macos_major", lambda: 15)
    assert B._auto(None)[0] == "coreml"
    assert B._auto("cpu")[0] == "numpy"


@pytest.mark.parametrize("args,error,match", [
    (("bogus",), UsageError, "vision_backend 'bogus': unknown"),
    (("numpy", None, "int4"), UsageError, "vision_dtype 'int4': unknown"),
    (("coreml", None, "int8"), UsageError, "not int8"),
    (("numpy", None, "int8"), UsageError, "int8 runs on the torch or auto vision backend"),
    (("torch", "cpu:0", "int8"), None, None),  # the one place int8 runs (where its row passes build)
    (("auto", None, "int8"), None, None),  # auto takes it there, whatever accelerator the machine has
    (("numpy", "cuda"), UsageError, "CPU only"),
    (("numpy", None, "bfloat16"), UsageError, "float32 only"),
    (("coreml", None, "bfloat16"), UsageError, "not bfloat16"),
    (("coreml", "cuda"), UsageError, "Core ML picks its own"),
])
def test_bad_choices_are_one_line_usage_errors(args, error, match):
    if error is None:
        pytest.importorskip("torch")
        from pantheon_ocr.engine.backends.int8_products import compiled_int8_products

        if compiled_int8_products() is None:
            pytest.skip("the int8 row passes do not build here")
        assert B.plan_vision_backend(*args)[:2] == ("torch", "cpu")
        return
    with pytest.raises(error, match=match) as exc:
        B.plan_vision_backend(*args)
    assert "\n" not in str(exc.value)


def test_int8_products_are_refused_off_the_cpu():
    pytest.importorskip("torch")
    from pantheon_ocr.engine.backends.int8_products import check_int8

    with pytest.raises(UsageError, match=r"vision_dtype int8: the int8 products run on the CPU \(device cpu\), "
                                         "not cuda:0"):
        check_int8("cuda:0")


def test_numpy_backend_is_the_engine_path():
    from pantheon_ocr.engine import load_vlm

    vlm = load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights="f32")
    be = B.make_vision_backend("numpy", vlm)
    assert isinstance(be, B.VisionBackend)
    px = vlm.preprocess(LIGHTONOCR_DIR / "images" / "c_rgba_90x60.png")
    assert np.array_equal(be.encode(px), vlm.encode_image(px))
    with pytest.raises(ValueError, match=r"\[3, H, W\]"):
        be.encode(px[0])


@pytest.mark.parametrize("grid,bucket", [((110, 85), (110, 88)), ((85, 110), (88, 110)), ((110, 110), (110, 110)),
                                         ((8, 11), (8, 16)), ((5, 7), (8, 8)), ((105, 78), (110, 80)),
                                         ((1, 2), (8, 8))])
def test_bucket_grid(grid, bucket):
    assert max_grid_side(1540, 14) == 110
    assert bucket_grid(*grid, max_side=110) == bucket
    assert bucket_grid(120, 3, max_side=110) == (120, 8)  # beyond the page size: rounded, never smaller


def test_pad_mask_and_merged_rows():
    px = np.arange(3 * 28 * 42, dtype=np.float32).reshape(3, 28, 42)
    padded = pad_pixels(px, 4, 6, 14)
    assert padded.shape == (3, 56, 84) and np.array_equal(padded[:, :28, :42], px) and not padded[:, 28:].any()
    m = patch_mask(2, 3, 4, 6).reshape(4, 6)
    assert m[:2, :3].all() and m.sum() == 6
    # a 5x7 grid in an 8x8 bucket: merged tokens (2x3 of the page) among the bucket's 4x4
    assert merged_rows(5, 7, 8, 8).tolist() == [0, 1, 2, 4, 5, 6]


def _run_cli(args, capsys):
    from pantheon_ocr.cli import main

    code = main(args)
    return code, capsys.readouterr().err


def test_cli_missing_extra_is_one_line_before_loading(no_extras, capsys, tmp_path):
    # a model path that does not exist: the backend check must come first
    code, err = _run_cli(["transcribe", SAMPLE_PDF, "--model", str(tmp_path / "nope.gguf"), "--mmproj",
                          str(tmp_path / "nope-mmproj.gguf"), "--vision-backend", "torch", "-o", str(tmp_path / "o")],
                         capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "pip install 'pantheon-ocr[gpu]'" in err and "Traceback" not in err
    code, err = _run_cli(["transcribe", SAMPLE_PDF, "--model", str(LIGHTONOCR_DIR), "--gpu-decode",
                          "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "pantheon-ocr[gpu]" in err and "Traceback" not in err


def test_cli_device_without_a_torch_user_is_refused(capsys, tmp_path):
    code, err = _run_cli(["transcribe", SAMPLE_PDF, "--model", str(LIGHTONOCR_DIR), "--device", "cuda",
                          "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "--device cuda" in err
