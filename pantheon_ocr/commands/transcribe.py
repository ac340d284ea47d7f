"""`pantheon-ocr transcribe`: PDFs, images, folders and globs in; Markdown (or txt/jsonl) out."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import UsageError

NO_MODEL = ("no model given: pass --model TEXT.gguf --mmproj MMPROJ.gguf (a LightOnOCR GGUF pair, "
            "e.g. made by llama.cpp's convert_hf_to_gguf.py) or --model DIR holding both; "
            "samples/tiny-model/ is a random-weight demo whose text is meaningless")
TINY_PARAMS = 50_000_000  # below this the decoder cannot be a real OCR model


def resolve_model(model: str | None, mmproj: str | None) -> tuple[Path, Path]:
    """--model FILE --mmproj FILE, or --model DIR with one text GGUF and one mmproj GGUF."""
    if model is None:
        raise UsageError(NO_MODEL)
    path = Path(model)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        proj = [p for p in ggufs if "mmproj" in p.name.lower()]
        text = [p for p in ggufs if p not in proj]
        if mmproj is None and (len(proj) != 1 or len(text) != 1):
            raise UsageError(f"{path}: expected one text GGUF and one *mmproj*.gguf, found "
                             f"{[p.name for p in ggufs]}; pass --model FILE --mmproj FILE")
        return (text[0] if len(text) == 1 else path), Path(mmproj) if mmproj else proj[0]
    if mmproj is None:
        raise UsageError(f"--mmproj is required with --model {path} (the vision part of the pair)")
    return path, Path(mmproj)


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--model", help="Text GGUF (qwen3), or a directory holding the text and mmproj GGUFs.")
@click.option("--mmproj", help="Vision GGUF (clip, projector lightonocr).")
@click.option("-o", "--output", default="out", show_default=True, type=click.Path(file_okay=False, allow_dash=True),
              help="Output directory; '-' prints the text to standard output instead.")
@click.option("--pages", help="Pages to transcribe in every document, e.g. 1-3,7.")
@click.option("--format", "formats", multiple=True, type=click.Choice(["md", "txt", "jsonl"]), default=("md",),
              show_default=True, help="Output format (repeat for several).")
@click.option("--page-files", is_flag=True, help="Also write one file per page.")
@click.option("--password", help="Password for encrypted PDFs.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Pages decoded together.")
@click.option("--max-tokens", default=4096, show_default=True, type=click.IntRange(1), help="Per page.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", type=click.IntRange(1),
              help="BLAS threads per stage (default: half the cores with --overlap, else all).")
@click.option("--weights", type=click.Choice(["quantized", "f32"]), default="f32", show_default=True,
              help="Weight storage: resident float32 (fast) or kept quantized (least memory).")
@click.option("--vision-backend", type=click.Choice(["numpy", "torch", "coreml", "auto"]), default="numpy",
              show_default=True)
@click.option("--device", default=None,
              help="torch device for --vision-backend torch/auto and the --gpu-* switches (cpu, cuda, cuda:N, mps).")
@click.option("--vision-dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Vision compute type: torch (float32/bfloat16/float16), Core ML (float32/float16).")
@click.option("--gpu-prefill", is_flag=True,
              help="Run the prefill projections on the torch --device (weights uploaded once); decode stays on the CPU.")
@click.option("--gpu-decode", is_flag=True, help="Run the batched decode matmuls on the torch --device.")
@click.option("--overlap/--no-overlap", default=True, show_default=True,
              help="Run the vision stage on its own thread, overlapped with prefill and decode.")
@click.option("--skip-existing/--overwrite", default=True, show_default=True,
              help="Skip documents whose output already exists, or redo them.")
@click.option("--render-workers", default=2, show_default=True, type=click.IntRange(1))
@click.option("--progress/--no-progress", default=True, show_default=True)
def transcribe(inputs, model, mmproj, output, pages, formats, page_files, password, batch_size, max_tokens,
               temperature, top_p, seed, threads, weights, vision_backend, device, vision_dtype, gpu_prefill,
               gpu_decode, overlap, skip_existing, render_workers, progress) -> None:
    """Transcribe PDFs and images (files, folders, globs) to Markdown, one file per document."""
    user_env = any(v in os.environ for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    if threads is None and overlap and not user_env:
        # Two stage threads each driving an all-core OpenBLAS oversubscribe the machine (measured
        # on 2 cores: 94 s vs 33 s for the same pages); give each stage its share instead.
        threads = max(1, (os.cpu_count() or 2) // 2)
    if threads:  # before numpy starts its BLAS threads
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    from ..pipeline import run_pipeline
    from ..pipeline_types import PipelineOptions, SamplingOptions
    from ..render import expand_inputs

    text_path, mmproj_path = resolve_model(model, mmproj)
    to_stdout = output == "-"
    if to_stdout:  # the same atomic outputs, in a scratch folder, then printed in input order
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="pantheon-ocr-")
        output, skip_existing = scratch.name, False
    options = PipelineOptions(
        out_dir=Path(output), formats=tuple(formats), page_files=page_files, overwrite=not skip_existing,
        pages=pages, password=password, batch_size=batch_size, overlap=overlap, render_workers=render_workers,
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed),
    )
    documents = expand_inputs(list(inputs))
    engine = build_engine(text_path, mmproj_path, weights, vision_backend, device, vision_dtype=vision_dtype,
                          gpu_prefill=gpu_prefill, gpu_decode=gpu_decode)
    summary = run_pipeline(documents, engine, options, on_progress=_bar() if progress else None)
    if to_stdout:
        for d in summary.documents:
            for out in d.outputs:
                if out.suffix == f".{formats[0]}":
                    click.echo(out.read_text(encoding="utf-8"), nl=False)
        scratch.cleanup()
    report(summary)
    click.get_current_context().exit(int(summary.exit_code))


def build_engine(text_path: Path, mmproj_path: Path, weights: str, vision_backend: str, device: str | None,
                 *, vision_dtype: str = "float32", gpu_prefill: bool = False, gpu_decode: bool = False):
    from ..engine import load_vlm
    from ..engine.page_engine import OCREngine

    switches = gpu_prefill or gpu_decode
    if device is not None and vision_backend == "numpy" and not switches:
        raise UsageError(f"--device {device} is for --vision-backend torch/auto or --gpu-prefill/--gpu-decode; "
                         "the numpy vision backend runs on the CPU")
    # Fail on a missing extra or device before loading the model.
    if vision_backend != "numpy" or vision_dtype != "float32":
        from ..engine.backends import plan_vision_backend

        plan_vision_backend(vision_backend, None if vision_backend == "numpy" else device, vision_dtype)
    if switches:
        from ..engine.backends import resolve_device

        device = resolve_device(device)

    vlm = load_vlm(text_path, mmproj_path, weights=weights)
    n_params = sum(t.n_bytes for t in vlm.text.gguf.tensors.values())
    if n_params < TINY_PARAMS:
        click.echo(f"note: {text_path.name} is a tiny test model ({n_params / 1e6:.0f} MB of weights): "
                   "its text is meaningless; point --model/--mmproj at LightOnOCR GGUF files for real OCR",
                   err=True)
    backend = None
    if vision_backend != "numpy" or vision_dtype != "float32":
        from ..engine.backends import make_vision_backend

        vision_device = None if vision_backend == "numpy" else device
        backend = make_vision_backend(vision_backend, vlm, device=vision_device, dtype=vision_dtype)
        if vision_backend == "auto":
            click.echo(f"vision backend: {backend.name} on {backend.device} ({backend.reason})", err=True)
        if backend.name == "numpy":
            backend = None  # the engine's own numpy path
    return OCREngine(vlm, backend, gpu_prefill=gpu_prefill, gpu_decode=gpu_decode, device=device)


def _bar():
    from tqdm import tqdm

    bar = None

    def update(p) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=p.pages_total, unit="page", dynamic_ncols=True)
        bar.total = p.pages_total
        bar.n = p.pages_done
        minutes = max(p.elapsed, 1e-9) / 60
        bar.set_postfix_str(f"{p.pages_done / minutes:.1f} pages/min, {p.tokens / max(p.elapsed, 1e-9):.1f} tok/s, "
                            f"{p.pages_failed} failed", refresh=False)
        bar.refresh()
        if p.pages_done >= p.pages_total and p.docs_done >= p.docs_total:
            bar.close()

    return update


def report(summary) -> None:
    """One line per document written, then every failed page with its reason."""
    for d in summary.documents:
        outs = ", ".join(str(o) for o in d.outputs)
        click.echo(f"{d.status:11} {d.doc.path}" + (f" -> {outs}" if outs else "") + (f" ({d.note})" if d.note else ""),
                   err=True)
    failed = summary.failed_pages
    if failed:
        click.echo(f"{len(failed)} page(s) failed:", err=True)
        for f in failed:
            click.echo(f"  {f}", err=True)
    if summary.interrupted:
        click.echo("interrupted: finished documents are complete, the rest was not written", err=True)
    click.echo(f"{summary.pages_done} pages, {summary.tokens} tokens in {summary.seconds:.1f} s", err=True)
