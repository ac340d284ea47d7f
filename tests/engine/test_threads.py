"""engine/threads.py: the one place that sizes the math libraries' pools."""

from __future__ import annotations

import pytest

from pantheon_ocr.engine import threads


def test_torch_gets_the_count_even_when_openmp_already_reads_it(monkeypatch):
    """set_threads always hands torch its count: torch.get_num_threads() reads OpenMP's count, which
    threadpool_limits has just set, while torch's MKL keeps the count torch last gave it, so a check
    against get_num_threads left float32 GEMMs at 1 thread after a stage went from 1 to 2."""
    torch = pytest.importorskip("torch")
    before = threads.current() or threads.cpu_count()
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # what OpenMP says after threadpool_limits(2)
    try:
        threads.set_threads(1)
        threads.set_threads(2)
        assert calls == [1, 2]
    finally:
        monkeypatch.undo()
        threads.set_threads(before)


def test_overlap_pays_off_the_cpu_or_with_a_small_tower():
    """`--overlap` at its default: the vision stage overlaps where it runs on a GPU or Core ML, or
    its tower is small; a large tower on the CPU runs in whole-core phases (loader.overlap_pays)."""
    from pantheon_ocr.engine.loader import SMALL_PARAMS, overlap_pays

    large, small = 400_000_000, 7_600_000
    assert not overlap_pays("cpu", large)
    assert overlap_pays("cpu", small) and overlap_pays("cuda:0", large) and overlap_pays("coreml:ALL", large)
    assert not overlap_pays("cpu", None) and not overlap_pays("cpu", SMALL_PARAMS)
