"""The Python API: the same pipeline as `pantheon-ocr transcribe` (render workers, the vision
thread overlapped with batched decoding), called from Python.

    import pantheon_ocr

    reader = pantheon_ocr.Reader()                      # the bundled reader; or model="lightonocr-2"
    for page in reader.read("scan.pdf", pages="1-3"):
        print(page.page, page.text)
    for page in reader.read_many(["docs/", "more/*.pdf"]):  # files, folders, globs, images
        print(page.document, page.page, page.finish_reason, page.seconds)
    summary = reader.transcribe(["docs/"], "out/")      # write Markdown files as the CLI does

Options are the options table's (pantheon_ocr/options.py), by their field names:
`Reader(weights="bf16", batch_size=16, max_tokens=2048, text_layer="prefer")`. `read` and
`read_many` also take a PIL image, a uint8 array or the bytes of an image or PDF file (named
"image N" / "document N" in their pages, N their place in the list).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import queue
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import DocumentNote, InputError, UsageError, path_text, with_setting
from .options import EngineOptions, PipelineOptions, SamplingOptions, specs

__all__ = ["Page", "Reader"]

_ENGINE = {o.name for o in specs(EngineOptions)}
_PIPELINE = {o.name for o in specs(PipelineOptions)}
_SAMPLING = {o.name for o in specs(SamplingOptions)}
_LISTS = {o.name for cls in (EngineOptions, PipelineOptions, SamplingOptions) for o in specs(cls) if o.kind == "list"}


@dataclass(frozen=True)
class Page:
    """One page read."""

    document: str  # the file's path (or the name given to an in-memory image)
    page: int  # 1-based
    text: str  # Markdown; "" when the page failed
    tokens: int  # generated
    finish_reason: str | None  # eos, max_tokens, repetition, blank, text-layer; None when it failed
    error: str | None  # why it failed, None when it did not
    seconds: dict = field(default_factory=dict, hash=False)  # render, vision, prefill, decode (a Page hashes without it)
    source: str = "model"  # or "text-layer": the PDF's own text (--text-layer prefer, or a failed page); as the JSONL

    @property
    def ok(self) -> bool:
        return self.error is None


class Reader:
    """A loaded model and the run settings; `read`, `read_many` and `transcribe` run pages.

    model / mmproj: what `--model` / `--mmproj` take (files, a folder, a pulled model's name; None:
    the bundled reader). **options: fields of EngineOptions, PipelineOptions and SamplingOptions
    (weights, vision_backend, threads, batch_size, max_tokens, segment, text_layer, ...). Setting
    `threads` (the math threads of the whole process) applies process-wide."""

    def __init__(self, model: str | os.PathLike | None = None, mmproj: str | os.PathLike | None = None, **options):
        from .engine.loader import load_page_engine
        from .engine.threads import set_threads, stage_threads
        from .modelfiles.resolve import resolve_model
        from .pipeline.inputs import validate_page_spec

        unknown = sorted(set(options) - _ENGINE - _PIPELINE - _SAMPLING)
        if unknown:
            near = [m for u in unknown for m in difflib.get_close_matches(u, sorted(_ENGINE | _PIPELINE | _SAMPLING), 1)]
            raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
                             + (f" (did you mean {', '.join(near)}?)" if near else "") + " (the options are the fields "
                             "of EngineOptions, PipelineOptions and SamplingOptions)")
        options = _as_lists(options)
        engine_kw = {k: v for k, v in options.items() if k in _ENGINE}
        self._pipeline_kw = {k: v for k, v in options.items() if k in _PIPELINE}
        self.sampling = SamplingOptions(**{k: v for k, v in options.items() if k in _SAMPLING})
        PipelineOptions(out_dir=".", sampling=self.sampling, **self._pipeline_kw)  # every value checked now
        validate_page_spec(self._pipeline_kw.get("pages"))  # and the page selection, before the model loads
        text, proj = resolve_model(model, mmproj)
        self.engine_options = EngineOptions(text, proj, **engine_kw)
        threads = stage_threads(self.engine_options.threads, self._pipeline_kw.get("overlap"))
        if threads:
            set_threads(threads)
        self.engine, self.notes = load_page_engine(self.engine_options)

    def options(self, out_dir: str | bytes | os.PathLike, **overrides) -> PipelineOptions:
        """The PipelineOptions of a run writing to `out_dir`."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(PipelineOptions)})
        if unknown:
            raise UsageError(f"unknown run option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (a run takes "
                             f"the fields of PipelineOptions; engine and sampling options go to Reader())")
        return PipelineOptions(out_dir=Path(os.fsdecode(out_dir)), sampling=self.sampling,
                               **{**self._pipeline_kw, **_as_lists(overrides)})

    def _engine(self):
        if self.engine is None:
            raise UsageError("this Reader is closed: make a new one")
        return self.engine

    # -- reading -------------------------------------------------------------------------------
    def read(self, source: Any, pages: str | None = None) -> Iterator[Page]:
        """The pages of one source (a document's path, a PIL image, a uint8 array, image or PDF
        bytes; a folder or a glob: its documents), in order. `pages`: as read_many."""
        return self.read_many([source], pages)

    def read_many(self, sources: Iterable[Any], pages: str | None = None) -> Iterator[Page]:
        """The pages of every document (files, folders, globs; in-memory images), each document's
        pages in order. A document that cannot be read at all is one Page with page 0 and its
        error. Stopping the iteration early stops the run. `pages` ("1-3,7"): the pages of each
        document; None: the Reader's `pages`, every page unless it was given one."""
        from .pipeline.inputs import expand_inputs

        with tempfile.TemporaryDirectory(prefix="pantheon-ocr-api-") as scratch:
            options = self.options(Path(scratch) / "out", overwrite=True, **({} if pages is None else {"pages": pages}))
            self._engine()
            problems: list = []
            paths = []
            names: dict[str, str] = {}  # a scratch file -> the name of the in-memory image it holds
            for i, source in enumerate(_sources(sources)):
                try:
                    path = _as_path(source, Path(scratch), i)
                except InputError as e:  # one bad in-memory image is that document's failure, not the run's
                    yield Page(e.path, 0, "", 0, None, e.problem)
                    continue
                paths.append(path)
                if path.parent == Path(scratch):
                    names[str(path)] = f"{'document' if path.suffix == '.pdf' else 'image'} {i + 1}"
            documents = expand_inputs([str(p) for p in paths], problems)
            for e in problems:
                yield Page(str(e.path), 0, "", 0, None, e.problem)
            for page in self._stream(documents, options, names) if documents else ():
                yield dataclasses.replace(page, document=names.get(page.document, page.document))

    def transcribe(self, inputs: Iterable[str | bytes | os.PathLike], out_dir: str | bytes | os.PathLike,
                   on_progress: Callable | None = None, **overrides):
        """Write every document's outputs under `out_dir`, as `pantheon-ocr transcribe` does;
        the RunSummary (documents and their status, failures, unreadable inputs). Ctrl-C stops it
        with RunInterrupted (a KeyboardInterrupt carrying the summary) once the documents already
        finished are written."""
        from .pipeline.inputs import expand_inputs
        from .pipeline.run import run_pipeline
        from .pipeline.types import PageFailure, RunInterrupted, RunSummary

        from .pipeline.outputs import check_output_folder

        if not isinstance(out_dir, (str, bytes, os.PathLike)) or not os.fsdecode(out_dir).strip():
            raise UsageError(f"out_dir: {'an empty path' if isinstance(out_dir, (str, bytes)) else repr(out_dir)}: "
                             "give the folder the outputs go to")

        options = self.options(out_dir, **overrides)
        self._engine()
        sources = _sources(inputs)
        images = [f"a {type(s).__name__}" if not isinstance(s, bytes) else "the bytes of a file"
                  for s in sources if not (isinstance(s, (str, os.PathLike)) or _path_bytes(s))]
        if images:
            raise UsageError(f"transcribe writes files named after its inputs, so it takes paths (got {images[0]}); "
                             "read() and read_many() take images and the bytes of files")
        check_output_folder(options.out_dir)  # before any page is read: a run that cannot keep its outputs stops now
        problems: list = []
        documents = expand_inputs([os.fsdecode(i) for i in sources], problems)
        unreadable = tuple(PageFailure(e.path, None, e.problem) for e in problems)
        if not documents:
            return RunSummary((), unreadable=unreadable)
        summary = dataclasses.replace(run_pipeline(documents, self._engine(), options, on_progress=on_progress),
                                      unreadable=unreadable)
        if summary.interrupted:  # the pipeline stopped cleanly; the caller's Ctrl-C goes on to the caller
            raise RunInterrupted(summary)
        return summary

    def _stream(self, documents, options: PipelineOptions, names: dict[str, str]) -> Iterator[Page]:
        """Run the pipeline on a thread of its own and hand its pages over, each document's in
        page order: a page as soon as the ones before it are out, the rest when its document ends."""
        from .pipeline.run import run_pipeline
        from .pipeline.types import NO_SELECTED_PAGE

        engine = self._engine()
        events: queue.Queue = queue.Queue()
        stop = threading.Event()

        def run() -> None:
            try:
                run_pipeline(documents, engine, options, write_outputs=False, stop=stop,
                             on_page=lambda r: events.put(("page", r)),
                             on_progress=lambda p: [events.put(("doc", o)) for o in p.finished])
                events.put(("end", None))
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                events.put(("end", e))

        worker = threading.Thread(target=run, name="pantheon-api", daemon=True)
        worker.start()
        order = _PageOrder()
        try:
            while True:
                kind, item = events.get()
                if kind == "end":
                    if item is not None:
                        raise item
                    yield from order.rest()
                    return
                if kind == "page":
                    yield from order.add(_page(item))
                else:
                    # the CLI says a note beside the document's line, a caller gets a warning; a failed
                    # document's note is its failed Page's error already
                    if item.note and item.note != NO_SELECTED_PAGE:
                        warnings.warn(DocumentNote(names.get(str(item.doc.path), item.doc.path), item.note),
                                      stacklevel=3)  # the caller's loop over read()
                    yield from order.finished(item)
        finally:
            stop.set()
            worker.join(timeout=10)

    def __reduce__(self):
        # a loaded model (mapped files, threads) does not travel: each process makes its own
        raise TypeError("a Reader holds a loaded model and cannot be pickled: make one in each process "
                        "(Reader(model, **options)), or send the paths and options")

    def close(self) -> None:
        """Release the engine (its weights and KV pool)."""
        self.engine = None

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_lists(options: dict) -> dict:
    """List options also as the command line writes them: formats="md,jsonl"."""
    return {k: tuple(x.strip() for x in v.split(",")) if k in _LISTS and isinstance(v, str) else v
            for k, v in options.items()}


class _PageOrder:
    """Each document's pages in order: page n as soon as pages 1..n-1 are out (a whole document
    streams); pages after a gap in the selection wait for their document's end."""

    def __init__(self):
        self.waiting: dict[str, dict[int, Page]] = {}
        self.next: dict[str, int] = {}

    def add(self, page: Page) -> Iterator[Page]:
        pending = self.waiting.setdefault(page.document, {})
        pending[page.page] = page
        n = self.next.get(page.document, 1)
        while n in pending:
            yield pending.pop(n)
            n += 1
        self.next[page.document] = n

    def finished(self, outcome) -> Iterator[Page]:
        key = str(outcome.doc.path)
        pending = self.waiting.pop(key, {})
        yield from (pending[k] for k in sorted(pending))
        for f in outcome.failures:  # the document itself could not be read or written
            if f.page is None:
                yield Page(key, 0, "", 0, None, with_setting(f.reason, f.option, lambda o: f"{o}="))

    def rest(self) -> Iterator[Page]:
        for pending in self.waiting.values():
            yield from (pending[k] for k in sorted(pending))
        self.waiting.clear()


def _page(result) -> Page:
    return Page(str(result.doc.path), result.page, result.text if result.error is None or result.from_text_layer else "",
                result.n_tokens, result.finish_reason, result.error, dict(result.seconds), result.source)


def _sources(sources: Any) -> list:
    """The sources of read_many / transcribe as a list. One path, image or bytes is one source:
    iterated, a string would be its characters (and "/" among them the whole file system)."""
    if isinstance(sources, (str, os.PathLike, bytes, bytearray)) or _is_image(sources):
        return [sources]
    try:
        return list(sources)
    except TypeError:
        raise UsageError(f"expected paths or images (a list of them, or one), got a {type(sources).__name__}") from None


def _is_image(source: Any) -> bool:
    """A PIL image or a numpy array; neither is imported for a path (an image of theirs means the
    caller imported them already)."""
    pil, numpy = sys.modules.get("PIL.Image"), sys.modules.get("numpy")
    return (pil is not None and isinstance(source, pil.Image)) or (numpy is not None and isinstance(source, numpy.ndarray))


_ARRAY_SHAPES = "[H, W] (grey), [H, W, 3] (RGB) or [H, W, 4] (RGBA)"


def _path_bytes(source: Any) -> bool:
    """Bytes that can be a path (as os.fsencode and os.listdir(b".") give them), not a file's bytes:
    short, no NUL, no PDF header."""
    return isinstance(source, bytes) and len(source) < 4096 and b"\0" not in source and source[:5] != b"%PDF-"


def _as_path(source: Any, scratch: Path, i: int) -> Path:
    """A path for a source: paths as they are; images and image bytes saved as PNG in `scratch`.
    UsageError for what is no image at all (a number, None); InputError, naming the image by its
    place in the list, for an image that cannot be read (undecodable bytes, an odd array)."""
    if isinstance(source, (str, os.PathLike)):
        from .pipeline.inputs import empty_path

        problem = empty_path(os.fsdecode(source))  # checked here: as a Path it would be "."
        if problem is not None:
            raise problem
        return Path(source)
    if _path_bytes(source) and os.path.exists(source):
        return Path(os.fsdecode(source))  # a path as bytes (as os.listdir(b".") gives them), not an image's bytes
    from PIL import Image, UnidentifiedImageError

    name = f"image {i + 1}"
    if isinstance(source, (bytes, bytearray)) and bytes(source[:5]) == b"%PDF-":
        path = scratch / f"document-{i + 1}.pdf"  # a PDF's bytes: read as the PDF they are
        path.write_bytes(source)
        return path
    if isinstance(source, (bytes, bytearray)):
        import io

        data = source
        try:
            source = Image.open(io.BytesIO(data))
            source.load()  # a truncated file fails here, not later in a worker
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            why = "unknown or damaged format" if isinstance(e, UnidentifiedImageError) else str(e)  # not PIL's BytesIO repr
            problem = "no bytes" if not data else f"not a readable image ({len(data):,} bytes): {why}"
            if data and _path_bytes(bytes(data)) and (b"/" in data or b"." in data):  # bytes that read as a path
                problem += f", nor the name of a file that exists ({path_text(bytes(data))})"
            raise InputError(name, problem) from None
    elif not isinstance(source, Image.Image):
        import numpy as np

        if not isinstance(source, np.ndarray):
            raise UsageError(f"cannot read a {type(source).__name__}: give a path, a PIL image, a uint8 array or image bytes")
        if source.dtype != np.uint8 or not (source.ndim == 2 or (source.ndim == 3 and source.shape[2] in (3, 4))) \
                or 0 in source.shape:
            raise InputError(name, f"an image array must be uint8 {_ARRAY_SHAPES}, not {source.dtype} "
                                   f"{list(source.shape)}")
        source = Image.fromarray(source)
    if source.width < 1 or source.height < 1:
        raise InputError(name, f"an empty image ({source.width} x {source.height})")
    if source.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):  # what PNG keeps; others read as RGB
        from .engine.image.images import to_rgb

        source = to_rgb(source)  # as a file of that mode is read: 32-bit and float data scaled, not clipped
    path = scratch / f"image-{i + 1}.png"
    try:
        source.save(path)
    except (OSError, ValueError) as e:
        raise InputError(name, f"cannot be stored as PNG: {e}") from None
    return path
