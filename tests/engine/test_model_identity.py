"""The model as outputs record it (loader.model_identity): the same files say the same, a
retrained model of the same size and shapes says another, and it costs no read of a whole file."""

from __future__ import annotations

import numpy as np

from pantheon_ocr.engine.loader import load_page_engine, model_identity
from pantheon_ocr.modelfiles.resolve import bundled_reader
from pantheon_ocr.options import EngineOptions


def test_model_identity_tells_retrained_weights_apart(tmp_path):
    rng = np.random.default_rng(0)
    a, b = tmp_path / "text.gguf", tmp_path / "mmproj.gguf"
    a.write_bytes(rng.bytes(3 << 20))
    b.write_bytes(rng.bytes(1 << 20))
    first = model_identity(a, b)
    assert first.startswith("text.gguf + mmproj.gguf #") and model_identity(a, b) == first
    data = bytearray(a.read_bytes())
    data[1 << 20::4096] = bytes(x ^ 1 for x in data[1 << 20::4096])  # weights retrained past the header, size kept
    a.write_bytes(bytes(data))
    assert model_identity(a, b) != first
    small = tmp_path / "small.gguf"
    small.write_bytes(b"GGUF")  # shorter than the spans it samples
    assert model_identity(small) == model_identity(small)
    assert model_identity(tmp_path / "missing.gguf").startswith("missing.gguf #")  # loading it says why
    odd = tmp_path / "mod\udce8le.gguf"  # a name that is no UTF-8: recorded as outputs record names
    odd.write_bytes(b"GGUF")
    assert model_identity(odd).startswith("mod\\xe8le.gguf #")


def test_the_loaded_engine_says_its_model():
    text, mmproj = bundled_reader()
    engine, _ = load_page_engine(EngineOptions(text, mmproj))
    assert engine.model == model_identity(text, mmproj) and engine.model.startswith("pantheon-reader.gguf + mmproj-pantheon-reader.gguf #")


def test_loading_leaves_no_file_open(monkeypatch):
    """Counting a GGUF's parameters (to choose the overlap) opened it and left it to the garbage
    collector: `-W always::ResourceWarning` showed the mmproj unclosed after every Reader. The
    count closes its file, and an engine's files close with it."""
    import gc
    import warnings

    from pantheon_ocr.engine import loader
    from pantheon_ocr.engine.format.gguf import GGUFFile

    text, mmproj = bundled_reader()
    real_close, closed = GGUFFile.close, []
    monkeypatch.setattr(GGUFFile, "close", lambda self: (closed.append(self), real_close(self)))
    assert loader._params(mmproj) > 0 and len(closed) == 1
    monkeypatch.undo()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        engine = load_page_engine(EngineOptions(text, mmproj))
        del engine
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
