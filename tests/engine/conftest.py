"""Shared locations and skips for engine tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LIGHTONOCR_DIR = FIXTURES / "lightonocr-tiny"
LIGHTONOCR_TEXT = LIGHTONOCR_DIR / "text.gguf"
LIGHTONOCR_MMPROJ = LIGHTONOCR_DIR / "mmproj.gguf"

# The torch device of the tests that hold for any device (the torch vision backend, the GPU
# switches): the CPU here and in CI; on a machine with a GPU, PANTHEON_OCR_TEST_DEVICE=cuda (or mps)
# runs the same assertions there (README.md, "Run the tests"; scripts/gpu_check.sh).
TEST_DEVICE = os.environ.get("PANTHEON_OCR_TEST_DEVICE", "cpu")


def smollm2_or_skip() -> Path:
    from pantheon_ocr.errors import ModelError
    from pypi_models import smollm2_path

    try:
        return smollm2_path()
    except ModelError as exc:
        pytest.skip(str(exc))


def qwen05b_or_skip() -> Path:
    from pantheon_ocr.errors import ModelError
    from pypi_models import qwen05b_path

    try:
        return qwen05b_path()
    except ModelError as exc:
        pytest.skip(str(exc))
