"""`pantheon-ocr transcribe`: PDFs, images, folders and globs in; Markdown (or txt/jsonl) out."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import ExitCode, PantheonError, UsageError, path_text
from ..options import EngineOptions, PipelineOptions, SamplingOptions
from .options import shown, table_options


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--model", help="Text GGUF (qwen3), a directory holding the text and mmproj GGUFs, or the name of a "
                              "pulled model (models list). Default: the reader bundled with pantheon-ocr.")
@click.option("--mmproj", help="Vision GGUF (clip, projector lightonocr), if --model names only the text GGUF.")
@click.option("-o", "--output", default="out", show_default=True, type=click.Path(allow_dash=True),
              help="Output directory; '-' prints the text to standard output instead.")
@table_options(PipelineOptions, "pages", "formats", "page_files", "password", "batch_size")
@table_options(SamplingOptions, "max_tokens", "temperature", "top_p", "seed")
@table_options(EngineOptions, "threads", "weights", "kv_dtype", "prefill_chunk", "vision_backend", "device",
               "vision_dtype", "gpu_prefill", "gpu_decode")
@table_options(PipelineOptions, "overlap")
@click.option("--skip-existing/--overwrite", default=True, show_default=True,
              help="Skip documents whose output already exists, or redo them.")
@table_options(PipelineOptions, "segment", "render_workers", "page_timeout", "text_layer")
@click.option("--text-fallback/--no-text-fallback", default=None, hidden=True,
              help="The old spelling of --text-layer fallback / --text-layer ocr.")
@click.option("--progress/--no-progress", default=None,
              help="Show progress on standard error: a live line on a terminal, a line per document otherwise "
                   "(default: on, off under -q).")
def transcribe(inputs, model, mmproj, output, pages, formats, page_files, password, batch_size, max_tokens,
               temperature, top_p, seed, threads, weights, kv_dtype, prefill_chunk, vision_backend, device, vision_dtype,
               gpu_prefill, gpu_decode, overlap, skip_existing, segment, render_workers, page_timeout, text_layer,
               text_fallback, progress) -> None:
    """Transcribe PDFs and images (files, folders, globs) to Markdown, one file per document."""
    from ..api import Reader
    from ..pipeline.inputs import expand_inputs
    from ..pipeline.naming import HEADER_PREFIX
    from ..pipeline.outputs import check_output_folder
    from ..pipeline.types import RunInterrupted
    from .common import echo_notes, echo_summary, show_progress, stop_signals_as_interrupt
    from .progress import progress_bar

    if text_fallback is not None:
        text_layer = "fallback" if text_fallback else "ocr"
    if not output.strip():  # Path("") is ".": an unset "$OUT" would write into the current folder
        raise UsageError("-o/--output: an empty path (an unset shell variable?): give a folder, or - for standard output")
    to_stdout = output == "-"
    scratch = None
    if to_stdout and page_files:  # they would be written to the scratch folder and lost with it
        raise UsageError("--page-files writes a file per page: give an output folder (-o), not -")
    if to_stdout:  # the same atomic outputs, in a scratch folder, then printed in input order
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="pantheon-ocr-")
        output, skip_existing = scratch.name, False
    problems: list = []  # every bad path is named and skipped; the rest of the batch runs
    if not expand_inputs(list(inputs), problems):  # nothing to read: say why, without loading the model
        from ..modelfiles.resolve import resolve_model
        from ..pipeline.types import PageFailure, RunSummary

        echo_summary(RunSummary((), unreadable=tuple(PageFailure(e.path, None, e.problem) for e in problems)))
        try:  # a model that would not have loaded either is said now, not on the next try
            resolve_model(model, mmproj)
        except PantheonError as e:
            click.echo(f"error: {shown(e)}", err=True)
        click.get_current_context().exit(int(ExitCode.INPUT_UNREADABLE))
    # here before the model loads (Reader.transcribe checks again, for callers of the API)
    check_output_folder(output)
    with stop_signals_as_interrupt() as stopping:
        reader = Reader(model, mmproj, weights=weights, vision_backend=vision_backend, device=device,
                        vision_dtype=vision_dtype, gpu_prefill=gpu_prefill, gpu_decode=gpu_decode, kv_dtype=kv_dtype,
                        prefill_chunk=prefill_chunk, threads=threads, formats=tuple(formats), page_files=page_files,
                        pages=pages, password=password, batch_size=batch_size, overlap=overlap,
                        render_workers=render_workers, segment=segment, page_timeout=page_timeout,
                        text_layer=text_layer, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
        echo_notes(reader.notes)
        bar = progress_bar(written="read" if to_stdout else "written") if show_progress(progress) else None
        try:
            summary = reader.transcribe(inputs, Path(output), on_progress=bar, overwrite=not skip_existing,
                                        keep_unfinished=not to_stdout)
        except RunInterrupted as stopped:  # said with what was done, exit 130
            summary = stopped.summary
            stopping.note()
        finally:
            if bar is not None:  # a line cut short by Ctrl-C ends before the summary
                bar.end()
    if to_stdout:
        printed = [(d, out) for d in summary.documents for out in d.outputs if out.suffix == f".{formats[0]}"]
        for d, out in printed:
            text = out.read_text(encoding="utf-8")
            # one document: its transcript alone; several: each keeps its first line, the source record
            # (`<!-- pantheon-ocr: {"source": ...} -->`), so that a reader of the stream can tell them apart;
            # plain text has none, so each is headed as head(1) heads files: `==> a.pdf <==`
            if text.startswith(HEADER_PREFIX) and len(printed) == 1:
                text = text.split("\n\n", 1)[-1]
            elif formats[0] == "txt" and len(printed) > 1:
                text = ("" if out is printed[0][1] else "\n") + f"==> {path_text(d.doc.path)} <==\n" + text
            # a document's last line never runs into the next one's first (txt ends without a newline)
            click.echo(text if text.endswith("\n") or out is printed[-1][1] else text + "\n", nl=False)
        scratch.cleanup()
    echo_summary(summary, to_stdout)
    click.get_current_context().exit(int(summary.exit_code))
