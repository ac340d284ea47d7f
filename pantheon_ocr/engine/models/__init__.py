"""Explicit registry: general.architecture -> decoder class (imported on demand)."""

from __future__ import annotations

from importlib import import_module

_DECODERS = {
    "llama": ("llama", "Decoder"),  # also mistral and mixtral: the converter writes "llama"
    "qwen2": ("llama", "Decoder"),
    "qwen3": ("llama", "Decoder"),
    "phi3": ("phi3", "Phi3Decoder"),
}


def decoder_class(arch: str):
    module, name = _DECODERS[arch]
    return getattr(import_module(f"{__name__}.{module}"), name)
