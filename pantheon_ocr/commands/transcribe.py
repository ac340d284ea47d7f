"""`pantheon-ocr transcribe`: PDFs, images, folders and globs in; Markdown (or txt/jsonl) out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..errors import ExitCode, path_text


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
              help="Math threads per stage (default: half the cores each with --overlap, else all).")
@click.option("--weights", type=click.Choice(["quantized", "f32", "bf16"]), default="f32", show_default=True,
              help="Weight storage: resident float32 (numpy), bfloat16 (torch: half the memory, fastest on "
                   "CPUs with bfloat16 units) or kept quantized (least memory).")
@click.option("--kv-dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="KV cache type: float16 halves its memory (numpy attention gets slower).")
@click.option("--prefill-chunk", type=click.IntRange(1), default=None,
              help="Prompt tokens prefilled between two decode steps (default 512): pages already "
                   "decoding never wait for a whole page's prompt.")
@click.option("--vision-backend", type=click.Choice(["numpy", "torch", "coreml", "auto"]), default="numpy",
              show_default=True)
@click.option("--device", default=None,
              help="torch device for --vision-backend torch/auto and the --gpu-* switches (cpu, cuda, cuda:N, mps).")
@click.option("--vision-dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Vision compute type: torch (float32/bfloat16/float16), Core ML (float32/float16); "
                                      "auto: bfloat16 for torch on CPUs with bfloat16 units, else float32.")
@click.option("--gpu-prefill", is_flag=True,
              help="Run the prefill projections on the torch --device (weights uploaded once); decode stays on the CPU.")
@click.option("--gpu-decode", is_flag=True, help="Run the batched decode matmuls on the torch --device.")
@click.option("--overlap/--no-overlap", default=True, show_default=True,
              help="Run the vision stage on its own thread, overlapped with prefill and decode.")
@click.option("--skip-existing/--overwrite", default=True, show_default=True,
              help="Skip documents whose output already exists, or redo them.")
@click.option("--segment", type=click.Choice(["page", "blocks", "lines"]), default=None,
              help="Read whole pages, or cut them into text blocks or lines first, each read as its own "
                   "sequence (default: what the model's GGUF asks for; LightOnOCR reads pages).")
@click.option("--render-workers", default=2, show_default=True, type=click.IntRange(1))
@click.option("--page-timeout", type=click.FloatRange(0, 86400, min_open=True), metavar="SECONDS",
              help="Fail a page whose vision + prefill + decode take longer (reason: timeout); the batch goes on.")
@click.option("--text-fallback/--no-text-fallback", default=True, show_default=True,
              help="A PDF page whose OCR failed takes the PDF's own text layer, marked as such, if it has one.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def transcribe(inputs, model, mmproj, output, pages, formats, page_files, password, batch_size, max_tokens,
               temperature, top_p, seed, threads, weights, kv_dtype, prefill_chunk, vision_backend, device, vision_dtype, gpu_prefill,
               gpu_decode, overlap, skip_existing, segment, render_workers, page_timeout, text_fallback, progress) -> None:
    """Transcribe PDFs and images (files, folders, globs) to Markdown, one file per document."""
    from ..engine.threads import set_threads, stage_threads

    threads = stage_threads(threads, overlap)
    if threads:  # numpy's BLAS, OpenMP, and torch whenever it loads
        set_threads(threads)
    from ..engine.loader import EngineOptions, load_page_engine, resolve_model
    from ..engine.sampling import SamplingOptions
    from ..pipeline.inputs import expand_inputs
    from ..pipeline.naming import HEADER_PREFIX
    from ..pipeline.run import run_pipeline
    from ..pipeline.types import PageFailure, PipelineOptions, RunSummary
    from .progress import progress_bar

    text_path, mmproj_path = resolve_model(model, mmproj)
    to_stdout = output == "-"
    if to_stdout:  # the same atomic outputs, in a scratch folder, then printed in input order
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="pantheon-ocr-")
        output, skip_existing = scratch.name, False
    options = PipelineOptions(
        out_dir=Path(output), formats=tuple(formats), page_files=page_files, overwrite=not skip_existing,
        pages=pages, password=password, batch_size=batch_size, overlap=overlap, render_workers=render_workers,
        segment=segment, sampling=SamplingOptions(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed),
        page_timeout=page_timeout, text_fallback=text_fallback,
    )
    problems: list = []  # every bad path is named and skipped; the rest of the batch runs
    documents = expand_inputs(list(inputs), problems)
    unreadable = tuple(PageFailure(e.path, None, e.problem) for e in problems)
    if not documents:  # nothing to read: say why, without loading the model
        report(RunSummary((), unreadable=unreadable))
        click.get_current_context().exit(int(ExitCode.INPUT_UNREADABLE))
    engine, notes = load_page_engine(EngineOptions(
        text_path, mmproj_path, weights, vision_backend, device, vision_dtype=vision_dtype, gpu_prefill=gpu_prefill,
        gpu_decode=gpu_decode, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk))
    for note in notes:
        click.echo(f"note: {note}", err=True)
    summary = run_pipeline(documents, engine, options, on_progress=progress_bar() if progress else None)
    summary = dataclasses.replace(summary, unreadable=unreadable)
    if to_stdout:
        for d in summary.documents:
            for out in d.outputs:
                if out.suffix == f".{formats[0]}":
                    text = out.read_text(encoding="utf-8")
                    if text.startswith(HEADER_PREFIX):  # the source record is for files on disk: stdout gets the transcript
                        text = text.split("\n\n", 1)[-1]
                    click.echo(text, nl=False)
        scratch.cleanup()
    report(summary)
    click.get_current_context().exit(int(summary.exit_code))


def report(summary) -> None:
    """One line per document written, then every failed page with its reason."""
    for d in summary.documents:
        outs = ", ".join(path_text(o) for o in d.outputs)
        click.echo(f"{d.status:11} {path_text(d.doc.path)}" + (f" -> {outs}" if outs else "") + (f" ({d.note})" if d.note else ""),
                   err=True)
    failed = summary.failed_pages
    if failed:
        n_paths = len(summary.unreadable)
        click.echo(f"{len(failed) - n_paths} page(s) failed" + (f", {n_paths} input path(s) unreadable" if n_paths else "") + ":",
                   err=True)
        for f in failed:
            click.echo(f"  {f}", err=True)
    if summary.interrupted:
        click.echo("interrupted: finished documents are complete, the rest was not written", err=True)
    click.echo(f"{summary.pages_done} pages, {summary.tokens} tokens in {summary.seconds:.1f} s", err=True)
