"""Shared locations and skips for engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LIGHTONOCR_DIR = FIXTURES / "lightonocr-tiny"
LIGHTONOCR_TEXT = LIGHTONOCR_DIR / "text.gguf"
LIGHTONOCR_MMPROJ = LIGHTONOCR_DIR / "mmproj.gguf"


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
