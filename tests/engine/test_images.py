"""images.to_rgb: the one conversion from any decoded image to the 8-bit RGB page the model reads,
used by page rendering and by preprocessing alike."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pantheon_ocr.engine.image.images import to_rgb
from pantheon_ocr.engine.image.preprocess import load_image
from pantheon_ocr.pipeline.inputs import make_document
from pantheon_ocr.pipeline.render import render_page


def grey(img: Image.Image) -> np.ndarray:
    out = np.asarray(to_rgb(img))
    assert out.dtype == np.uint8 and out.shape[-1] == 3
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])
    return out[..., 0].astype(int)


RAMP = np.linspace(0, 1, 64 * 64).reshape(64, 64)


@pytest.mark.parametrize("data, mode", [
    (RAMP * 1000, "F"),  # float data beyond 0..255
    (RAMP * 2 - 1, "F"),  # float data below zero
    (RAMP * 200_000, "I"),  # 32-bit data beyond the 16-bit range
    (RAMP * 1000 - 500, "I"),  # negative integers
])
def test_out_of_range_data_is_stretched_not_saturated(data, mode):
    """Neither white nor black all over: the darkest pixel maps to 0, the brightest to 255 and
    the ramp keeps its order (clipping at 0 or 255 would flatten most of it)."""
    img = Image.fromarray(data.astype(np.float32 if mode == "F" else np.int32), mode)
    out = grey(img)
    assert out.min() == 0 and out.max() == 255
    assert len(np.unique(out)) > 200 and np.all(np.diff(out.ravel()) >= 0)


@pytest.mark.parametrize("data, mode, want", [
    (RAMP, "F", RAMP * 255),  # float 0..1: scaled by 255
    (RAMP * 255, "F", RAMP * 255),  # float already 0..255: kept
    (RAMP * 65535, "I", RAMP * 65535 / 257),  # 16-bit data widened to 32 bits
    (RAMP * 200, "I", RAMP * 200),  # 8-bit data in 32 bits: kept
])
def test_in_range_data_keeps_its_scale(data, mode, want):
    img = Image.fromarray(data.astype(np.float32 if mode == "F" else np.int32), mode)
    assert np.max(np.abs(grey(img) - want)) <= 1


def test_sixteen_bit_and_alpha():
    img = Image.fromarray((RAMP * 65535).astype(np.uint16))
    assert img.mode.startswith("I;16")
    assert np.max(np.abs(grey(img) - RAMP * 255)) <= 1
    for mode in ("RGBA", "LA", "RGBa", "PA"):  # transparent pixels are white paper
        clear = Image.new("RGBA", (8, 8), (10, 20, 30, 0)).convert(mode)
        assert to_rgb(clear).getpixel((2, 2)) == (255, 255, 255), mode


def test_rendering_and_preprocessing_read_an_image_alike(tmp_path):
    """A float TIFF out of range, read as a page (render) and as a model input (preprocess)."""
    path = tmp_path / "f.tif"
    Image.fromarray((RAMP * 1000).astype(np.float32), "F").save(path)
    rendered = np.asarray(render_page(make_document(path), 0))
    loaded = np.asarray(load_image(path))
    assert np.array_equal(rendered, loaded) and rendered.max() == 255 and rendered.min() == 0
