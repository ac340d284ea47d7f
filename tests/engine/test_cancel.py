"""A stopped run stops inside a vision layer, not only between layers: a full page's layer takes
seconds on a CPU, and Ctrl-C must not wait for it (engine/cancel.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pantheon_ocr.engine import load_vlm
from pantheon_ocr.engine.attention import TowerOptions
from pantheon_ocr.engine.cancel import Cancelled, cancel_on

from .conftest import LIGHTONOCR_DIR, LIGHTONOCR_MMPROJ, LIGHTONOCR_TEXT

IMAGE = LIGHTONOCR_DIR / "images" / "d_text_300x120.png"


class SetOnCall(threading.Event):
    """Reads as set from its n-th look on: a stop that arrives while the tower is under way."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


def test_numpy_vision_stops_halfway_through_its_first_layer():
    done = []
    vlm = load_vlm(LIGHTONOCR_TEXT, LIGHTONOCR_MMPROJ, weights="f32",
                   vision_tower=TowerOptions(on_layer=lambda i, s: done.append(i)))
    pixels = vlm.preprocess(IMAGE)
    stop = SetOnCall(2)  # the look before layer 0 passes; the next one is inside layer 0
    with cancel_on(stop), pytest.raises(Cancelled):
        vlm.encode_image(pixels)
    assert stop.looks == 2 and done == []  # stopped before layer 0 finished
    assert vlm.encode_image(pixels).shape[0] > 0  # outside cancel_on nothing stops it


def test_torch_vision_block_looks_again_halfway():
    torch = pytest.importorskip("torch")
    from pantheon_ocr.engine.backends.torch_pixtral import PixtralBlock

    block = PixtralBlock(dim=32, heads=2, ff=64, eps=1e-5)
    x = torch.zeros(1, 4, 32)
    cos, sin = torch.ones(4, 16), torch.zeros(4, 16)
    stop = SetOnCall(1)
    with cancel_on(stop), pytest.raises(Cancelled):
        block(x, cos, sin, None)
    assert stop.looks == 1
    assert np.isfinite(block(x, cos, sin, None).detach().numpy()).all()
