"""The numpy GGUF inference engine. Importing it loads nothing heavy; loading a model does
(engine/loader.py is where paths become models and engines):

    load_model(path, weights)            a decoder GGUF -> TextModel (.decoder, .tokenizer, .generate)
    load_vlm(text, mmproj, weights)      a LightOnOCR pair -> the model (vision tower, projector, decoder)
    loader.load_page_engine(options)     the ready page engine (page_engine.OCREngine) for the pipeline

It imports nothing from the rest of pantheon_ocr but `errors`.
"""

from __future__ import annotations

from .loader import load_model, load_vlm

__all__ = ["TextModel", "load_model", "load_vlm"]


def __getattr__(name: str):
    if name == "TextModel":  # `from pantheon_ocr.engine import TextModel`, loaded on first use
        from .text_model import TextModel

        return TextModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
