"""Any decoded PIL image -> the 8-bit RGB picture of a page that the model reads.

Rendering (pipeline/render.py) and preprocessing (preprocess.py) both go through `to_rgb`, so a
page image means the same thing whichever way it came in: transparency over white paper, wide
or float grey data scaled to 8 bits without saturating or vanishing."""

from __future__ import annotations

import numpy as np
from PIL import Image

# Modes with an alpha band (PIL's lower-case ones are premultiplied).
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB: transparency over white paper, wide/float data scaled down."""
    mode = img.mode
    if mode.startswith("I") or mode == "F":
        return Image.fromarray(to_uint8(np.asarray(img), mode), "L").convert("RGB")
    if mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")  # also resolves palettes, tRNS colour keys, premultiplied alpha
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        page.alpha_composite(rgba)
        return page.convert("RGB")
    # CMYK, YCbCr, LAB, P, 1, L: PIL's conversions (Adobe-inverted CMYK JPEGs are handled by
    # the decoder). Colour accuracy does not matter for reading text; contrast does.
    return img if mode == "RGB" else img.convert("RGB")


def to_uint8(a: np.ndarray, mode: str) -> np.ndarray:
    """Wide or float grey data -> uint8. 16-bit data maps 0..65535 linearly, as viewers show
    it; 32-bit integer or float data already in 0..255 (or 0..1 for float) keeps its scale;
    anything else is stretched min..max so it neither saturates to white nor vanishes."""
    if mode.startswith("I;16"):
        return np.rint(a.astype(np.float32) / 257.0).astype(np.uint8)
    a = np.nan_to_num(a.astype(np.float64))
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if mode == "F" and lo >= 0 and hi <= 1.0:
        a = a * 255.0
    elif lo >= 0 and hi <= 255:
        pass
    elif mode == "I" and lo >= 0 and hi <= 65535:
        a = a / 257.0  # 16-bit data that PIL widened to 32-bit
    else:
        a = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)
