"""Seeded fuzzing of input documents: mutations of the sample PDFs and of small images (byte
flips, truncations, repeated or dropped chunks) run through the real render workers in one
batch. Every document ends written, partial or failed with a one-line reason; the run never
raises, never leaves a temp file, and exits with a documented code."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from fake_engine import SAMPLES, FakeEngine, marked_pdf
from pantheon_ocr.errors import ExitCode
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PipelineOptions

SEED = 20260413
N_MUTANTS = 36


def _image(fmt: str) -> bytes:
    rng = np.random.default_rng(1)
    img = Image.fromarray((rng.random((120, 160, 3)) * 255).astype(np.uint8))
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def mutate(data: bytes, rng: np.random.Generator, i: int) -> bytes:
    m = bytearray(data)
    how = i % 4
    if how == 0:  # byte flips, mostly near the start where the structure is
        for pos in rng.integers(0, min(len(m), 4096), size=int(rng.integers(1, 12))):
            m[pos] = int(rng.integers(0, 256))
    elif how == 1:  # truncation
        m = m[: int(rng.integers(1, len(m)))]
    elif how == 2:  # a chunk repeated
        a = int(rng.integers(0, len(m) - 1))
        b = min(len(m), a + int(rng.integers(1, 2048)))
        m = m[:b] + m[a:b] + m[b:]
    else:  # a chunk dropped
        a = int(rng.integers(0, len(m) - 1))
        m = m[:a] + m[a + int(rng.integers(1, 512)):]
    return bytes(m)


def test_mutated_pdfs_and_images_never_stop_the_batch(tmp_path):
    bases = {
        "pdf": [(SAMPLES / "docs" / n).read_bytes() for n in ("text-1page.pdf", "report-3pages.pdf", "scanned.pdf")]
        + [marked_pdf(2, 1)],
        "png": [_image("PNG")],
        "jpg": [_image("JPEG")],
        "tif": [_image("TIFF")],
    }
    rng = np.random.default_rng(SEED)
    folder = tmp_path / "in"
    folder.mkdir()
    names = []
    for i in range(N_MUTANTS):
        ext = ("pdf", "pdf", "png", "jpg", "pdf", "tif")[i % 6]
        choices = bases[ext]
        data = mutate(choices[int(rng.integers(0, len(choices)))], rng, i)
        (folder / f"m{i:02d}.{ext}").write_bytes(data)
        names.append(f"m{i:02d}.{ext}")
    docs = expand_inputs([str(folder)])
    options = PipelineOptions(out_dir=tmp_path / "out", formats=("md", "jsonl"), render_workers=2, render_timeout=30,
                              longest_edge=448, text_fallback=True)
    summary = run_pipeline(docs, FakeEngine(), options)
    assert len(summary.documents) == N_MUTANTS
    for d in summary.documents:
        assert d.status in ("written", "partial", "failed"), (d.doc.path.name, d.status, d.note)
        for f in d.failures:
            assert f.reason and "\n" not in f.reason and "Traceback" not in f.reason, (d.doc.path.name, f.reason)
        if d.status == "failed":
            assert d.failures, d.doc.path.name
    assert summary.exit_code in (ExitCode.OK, ExitCode.PAGES_FAILED, ExitCode.INPUT_UNREADABLE)
    statuses = {d.status for d in summary.documents}
    assert "failed" in statuses and statuses & {"written", "partial"}  # the mutations hit, and not everything
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.endswith(".tmp")]
