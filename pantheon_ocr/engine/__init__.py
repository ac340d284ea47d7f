"""The numpy GGUF inference engine. Importing it loads nothing heavy; these do:

    load_model(path, weights)            a decoder GGUF -> TextModel (.decoder, .tokenizer, .generate)
    load_vlm(text, mmproj, weights)      a LightOnOCR pair -> the model (vision tower, projector, decoder)
    loader.load_page_engine(options)     the ready page engine (page_engine.OCREngine) for the pipeline

It imports nothing from the rest of pantheon_ocr but `errors`.
"""

from __future__ import annotations

from pathlib import Path


def load_model(path: str | Path, weights: str = "quantized"):
    """A decoder GGUF ready to run (text_model.TextModel); weights: "quantized" or "f32"."""
    from .text_model import TextModel
    from .weights import STORAGE_MODES

    if weights not in STORAGE_MODES:
        raise ValueError(f"weights must be one of {STORAGE_MODES}, not {weights!r}")
    return TextModel(path, weights)


def load_vlm(model_path: str | Path, mmproj_path: str | Path, weights: str = "quantized"):
    """A LightOnOCR text GGUF + mmproj GGUF pair (models.lightonocr.LightOnOCR)."""
    from .models.lightonocr import LightOnOCR

    return LightOnOCR(model_path, mmproj_path, weights)


def __getattr__(name: str):
    if name == "TextModel":  # `from pantheon_ocr.engine import TextModel`, loaded on first use
        from .text_model import TextModel

        return TextModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
