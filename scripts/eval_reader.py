"""Measure how well a model reads: CER and WER on held-out synthetic lines and pages, and on the
sample documents against the PDFs' own text layer (PDFium's text extraction).

    python scripts/eval_reader.py                                   # the bundled reader
    python scripts/eval_reader.py --model DIR [--lines 300] [--pages 10] [--json out.json]
    python scripts/eval_reader.py --devset ../shared/devset --out devset-pred/   # real documents

--devset reads the dev set's listed pages of real PDFs by OCR only (the PDF's own text layer is
the truth, never an input: no text-layer fallback), writes OUT/<doc>/<page>.txt, scores them
with the dev set's own score.py (per-document CER / WER / BoW-F1) and prints the CPU seconds per
page (this process and its render workers). `--lines 0 --pages 0` skips the synthetic sets.

Sets (greedy decoding, so every run gives the same text):
- lines, seen faces: held-out text in the faces the reader was trained on;
- lines, held-out faces: held-out text in faces it never saw;
- pages: synthetic Letter PDFs (title, headings, paragraphs, lists, ruled tables) from held-out
  text, read through the whole pipeline (render, segment, read, join);
- samples/docs: every PDF against its text layer; a document without one (the scanned page) is
  scored against samples/truth/<name>.txt.
Scores compare whitespace-normalised text (layout is not scored). Needs the `train` extra (the
faces ship in matplotlib's wheel).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pantheon_ocr.engine.loader import EngineOptions, load_page_engine  # noqa: E402
from pantheon_ocr.options import VISION_BACKENDS, VISION_DTYPES, spec  # noqa: E402
from pantheon_ocr.modelfiles.resolve import resolve_model  # noqa: E402
from pantheon_ocr.engine.sampling import SamplingOptions  # noqa: E402
from pantheon_ocr.pipeline.inputs import make_document  # noqa: E402
from pantheon_ocr.pipeline.run import run_pipeline  # noqa: E402
from pantheon_ocr.pipeline.pieces import join_pieces, line_pieces, piece_joins  # noqa: E402
from pantheon_ocr.pipeline.types import PipelineOptions  # noqa: E402
from training.lines import fixed_set  # noqa: E402
from training.metrics import error_rates  # noqa: E402
from training.pages import make_page  # noqa: E402


def read_lines(engine, lines, batch: int = 64) -> list[str]:
    """Each line image read as the pipeline reads a line: cut into pieces no wider than the
    reader's line_width (pipeline/pieces.line_pieces), each piece one sequence, the pieces'
    texts joined as the pipeline joins them (piece_joins); lines decoded together in batches."""
    out = []
    sampling = SamplingOptions(max_tokens=256)
    for i in range(0, len(lines), batch):
        pieces = [pieces_of(engine, ln.image) for ln in lines[i: i + batch]]
        seqs = [[engine.prefill(engine.vision(im), sampling) for _, im in parts] for parts in pieces]
        flat = [s for parts in seqs for s in parts]
        while not all(s.finished for s in flat):
            engine.decode_step([s for s in flat if not s.finished])
        out += [join_pieces([s.text().strip() for s in parts], piece_joins([b for b, _ in boxes]))
                for parts, boxes in zip(seqs, pieces)]
    return out


def pieces_of(engine, image: np.ndarray) -> list:
    """A line image as the pipeline feeds it (pieces.line_pieces over the whole image): drawn wider
    by the reader's line_stretch, whole if it then fits its line_width, else cut; (box, image) each."""
    hints = engine.hints
    h, w = image.shape
    return line_pieces(image, (0, 0, w, h), h, hints.patch_size, hints.line_width, hints.line_stretch)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the render workers)."""
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def eval_devset(engine, devset: Path, out: Path, segment: str | None, batch_size: int) -> dict:
    """The dev set's pages read by OCR only, written as OUT/<doc>/<page>.txt and scored by its score.py."""
    import subprocess

    from pantheon_ocr.pipeline.render import count_pages
    from pantheon_ocr.pipeline.types import PageTask

    manifest = json.loads((devset / "pages.json").read_text())
    docs, tasks, ids = [], [], {}
    for d in manifest["docs"]:
        doc = make_document(devset / d["pdf"])
        n = count_pages(doc)
        docs.append(doc)
        ids[str(doc.path)] = d["id"]
        tasks += [PageTask(doc, p - 1, n) for p in d["pages"]]
    texts: dict[tuple[str, int], str] = {}
    c0, t0 = cpu_seconds(), time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        options = PipelineOptions(out_dir=Path(scratch), segment=segment, batch_size=batch_size, text_fallback=False,
                                  overwrite=True)
        summary = run_pipeline(docs, engine, options, tasks=tasks, write_outputs=False,
                               on_page=lambda r: texts.__setitem__((ids[str(r.doc.path)], r.page), r.text))
    cpu, wall = cpu_seconds() - c0, time.perf_counter() - t0
    for f in summary.failed_pages:
        print(f"failed: {f}", file=sys.stderr)
    for (doc_id, page), text in texts.items():
        (out / doc_id).mkdir(parents=True, exist_ok=True)
        (out / doc_id / f"{page:04d}.txt").write_text(text + "\n", encoding="utf-8")
    scores = out / "scores.json"
    subprocess.run([sys.executable, str(devset / "score.py"), str(out), "--truth", str(devset / "truth"),
                    "--manifest", str(devset / "pages.json"), "--no-pages", "--json", str(scores)], check=True)
    n = len(tasks)
    print(f"\n{n} pages: {cpu / n:.2f} CPU-s/page, {wall / n:.2f} s/page wall ({cpu:.0f} CPU-s, {wall:.0f} s)")
    return {"pages": n, "cpu_s_per_page": cpu / n, "wall_s_per_page": wall / n, "scores": json.loads(scores.read_text())}


def read_documents(engine, paths: list[Path], segment: str | None) -> dict[Path, list[str]]:
    """Page texts of each document through the whole pipeline (nothing written)."""
    texts: dict[str, dict[int, str]] = {}
    with tempfile.TemporaryDirectory() as out:
        options = PipelineOptions(out_dir=Path(out), segment=segment, batch_size=8)
        summary = run_pipeline([make_document(p) for p in paths], engine, options,
                               on_page=lambda r: texts.setdefault(str(r.doc.path), {}).__setitem__(r.page, r.text),
                               write_outputs=False)
    failed = [str(f) for f in summary.failed_pages]
    if failed:
        print("failed pages: " + "; ".join(failed), file=sys.stderr)
    return {p: [text for _, text in sorted(texts.get(str(p), {}).items())] for p in paths}


def text_layer(path: Path) -> list[str]:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        return [pdf[i].get_textpage().get_text_range() for i in range(len(pdf))]
    finally:
        pdf.close()


def row(name: str, pairs: list[tuple[str, str]], seconds: float) -> dict:
    r = error_rates(pairs)
    r.update(set=name, seconds=round(seconds, 1), items=len(pairs))
    print(f"| {name} | {len(pairs)} | {r['chars']} | {r['cer']:.4f} | {r['wer']:.4f} | {seconds:.0f} |", flush=True)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="text GGUF or folder (default: the bundled reader)")
    ap.add_argument("--mmproj")
    ap.add_argument("--lines", type=int, default=300, help="held-out lines per face set")
    ap.add_argument("--pages", type=int, default=10, help="synthetic held-out pages")
    ap.add_argument("--samples", type=Path, default=ROOT / "samples" / "docs")
    ap.add_argument("--segment", choices=["page", "blocks", "lines"], default=None)
    ap.add_argument("--show", action="store_true", help="print each sample document's text")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--devset", type=Path, help="the real-document dev set (../shared/devset): read, score, time")
    ap.add_argument("--out", type=Path, default=Path("devset-pred"), help="--devset: where the page texts go")
    ap.add_argument("--batch-size", type=int, default=8, help="--devset: pages decoded together")
    ap.add_argument("--vision-backend", default=spec(EngineOptions, "vision_backend").default,
                    choices=VISION_BACKENDS, help="the vision stage's backend (as transcribe's flag)")
    ap.add_argument("--vision-dtype", default=spec(EngineOptions, "vision_dtype").default, choices=VISION_DTYPES,
                    help="the vision stage's compute type (as transcribe's flag)")
    a = ap.parse_args(argv)
    text, mmproj = resolve_model(a.model, a.mmproj)
    engine, notes = load_page_engine(EngineOptions(text, mmproj, vision_backend=a.vision_backend,
                                                   vision_dtype=a.vision_dtype))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"model: {text.name} + {mmproj.name}\n")
    if a.devset:
        result = eval_devset(engine, a.devset.resolve(), a.out, a.segment, a.batch_size)
        if a.json:
            a.json.write_text(json.dumps({"model": [str(text), str(mmproj)], "devset": result}, indent=1))
        if not (a.lines or a.pages):
            return 0
    print("| set | items | characters | CER | WER | seconds |\n|---|---|---|---|---|---|")
    results = []
    h, w = engine.hints.line_height or 28, engine.longest_edge
    sets = [("lines, seen faces, held-out text", "train", None), ("lines, held-out faces and text", "heldout", None),
            # the language prior, measured: text a language model cannot predict should read about as well as prose
            ("lines of prose in nine languages", "train", "prose"), ("lines of shuffled words", "train", "shuffled"),
            ("lines of random strings", "train", "random")]
    for label, faces, kind in sets:
        if a.lines:
            lines = fixed_set(a.lines, "heldout", 4321, h, w, face_split=faces, kind=kind)
            t0 = time.perf_counter()
            hyps = read_lines(engine, lines)
            results.append(row(label, [(ln.text, hyp) for ln, hyp in zip(lines, hyps)], time.perf_counter() - t0))
    if a.pages:
        with tempfile.TemporaryDirectory() as d:
            paths, truths = [], []
            for i in range(a.pages):
                pdf, truth = make_page(np.random.default_rng([77, i]))
                paths.append(Path(d) / f"page-{i:02d}.pdf")
                paths[-1].write_bytes(pdf)
                truths.append(truth)
            t0 = time.perf_counter()
            got = read_documents(engine, paths, a.segment)
            pairs = [(truth, (got[p] or [""])[0]) for p, truth in zip(paths, truths)]
            results.append(row("pages, held-out text (synthetic PDFs)", pairs, time.perf_counter() - t0))
    docs = sorted(a.samples.glob("*.pdf"))
    t0 = time.perf_counter()
    got = read_documents(engine, docs, a.segment)
    seconds = time.perf_counter() - t0
    all_pairs = []
    for p in docs:
        truth_file = a.samples.parent / "truth" / f"{p.stem}.txt"
        refs = text_layer(p)
        if truth_file.exists():
            refs = truth_file.read_text(encoding="utf-8").split("\f")
        pairs = list(zip(refs, got[p] + [""] * (len(refs) - len(got[p]))))
        all_pairs += pairs
        results.append(row(f"samples/docs/{p.name}", pairs, seconds * len(pairs) / max(1, sum(len(text_layer(q)) for q in docs))))
        if a.show:
            for i, (ref, hyp) in enumerate(pairs, 1):
                print(f"\n--- {p.name} page {i}\n{hyp}\n", file=sys.stderr)
    results.append(row("samples/docs, all", all_pairs, seconds))
    if a.json:
        a.json.write_text(json.dumps({"model": [str(text), str(mmproj)], "results": results}, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
