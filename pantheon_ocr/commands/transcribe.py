"""`pantheon-ocr transcribe`: PDFs, images, folders and globs in; Markdown (or txt/jsonl) out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..errors import ExitCode, path_text
from ..options import EngineOptions, PipelineOptions, SamplingOptions
from .options import table_options


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--model", help="Text GGUF (qwen3), a directory holding the text and mmproj GGUFs, or the name of a "
                              "pulled model (models list). Default: the reader bundled with pantheon-ocr.")
@click.option("--mmproj", help="Vision GGUF (clip, projector lightonocr), if --model names only the text GGUF.")
@click.option("-o", "--output", default="out", show_default=True, type=click.Path(file_okay=False, allow_dash=True),
              help="Output directory; '-' prints the text to standard output instead.")
@table_options(PipelineOptions, "pages", "formats", "page_files", "password", "batch_size")
@table_options(SamplingOptions, "max_tokens", "temperature", "top_p", "seed")
@table_options(EngineOptions, "threads", "weights", "kv_dtype", "prefill_chunk", "vision_backend", "device",
               "vision_dtype", "gpu_prefill", "gpu_decode")
@table_options(PipelineOptions, "overlap")
@click.option("--skip-existing/--overwrite", default=True, show_default=True,
              help="Skip documents whose output already exists, or redo them.")
@table_options(PipelineOptions, "segment", "render_workers", "page_timeout", "text_fallback")
@click.option("--progress/--no-progress", default=True, show_default=True)
def transcribe(inputs, model, mmproj, output, pages, formats, page_files, password, batch_size, max_tokens,
               temperature, top_p, seed, threads, weights, kv_dtype, prefill_chunk, vision_backend, device, vision_dtype, gpu_prefill,
               gpu_decode, overlap, skip_existing, segment, render_workers, page_timeout, text_fallback, progress) -> None:
    """Transcribe PDFs and images (files, folders, globs) to Markdown, one file per document."""
    from ..engine.threads import set_threads, stage_threads

    threads = stage_threads(threads, overlap)
    if threads:  # numpy's BLAS, OpenMP, and torch whenever it loads
        set_threads(threads)
    from ..engine.loader import load_page_engine
    from ..modelfiles.resolve import resolve_model
    from ..pipeline.inputs import expand_inputs
    from ..pipeline.naming import HEADER_PREFIX
    from ..pipeline.run import run_pipeline
    from ..pipeline.types import PageFailure, RunSummary
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
        gpu_decode=gpu_decode, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk, threads=threads))
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
