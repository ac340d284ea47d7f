"""Writers: one Markdown / JSONL / text file per document, optional per-page files.

Where the files go (and why names never depend on input order) is naming.py's job. Each output
records its source (naming.Source: the input's path, sha256, size and mtime): the Markdown starts
with `<!-- pantheon-ocr: {"source": "/in/a.pdf", "sha256": "...", "size": ..., "mtime_ns": ...} -->`
(per-page files add "page"), every JSONL record carries `doc`, `doc_sha256`, `doc_size` and
`doc_mtime_ns`; txt files are plain text and record nothing.
File names are written as `errors.path_text` shows them (undecodable bytes as `\\xNN`).

A document's outputs are all written or none are: every file is first written to a temp file
in its folder (fsync), then all are renamed into place, the primary format (the first in
`formats`) last, so that its presence means the set is complete; if anything fails, the temp
files are removed. Temp names are short (`.pantheon-<hash of the name>-<random>.tmp`), so any
output name the file system accepts also has a temp name it accepts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

from ..errors import path_text
from .figures import figure_files, figure_records, linked_text, remove_stale
from .naming import OutputPaths, Source
from .types import STAGES, TEXT_LAYER, PageResult

TEMP_PREFIX = ".pantheon-"
TEMP_NAME = re.compile(r"^\.pantheon-(?P<hash>[0-9a-f]{12})-[a-z0-9_]{8}\.tmp$")


def temp_tag(name: str) -> str:
    """The 12 hex digits a temp file of output `name` carries (so stale temps can be matched to
    their targets: archive/plan.py cleans them up)."""
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:12]


def _write_temp(path: Path, data: bytes) -> str:
    """`data` in a new temp file beside `path`, flushed to disk; returns the temp's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{temp_tag(path.name)}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_files(files: Sequence[tuple[Path, bytes]]) -> None:
    """Write all files or none: temps first, then renames in the given order (put the file whose
    presence means "complete" last). On any failure the temps not yet renamed are removed."""
    temps: list[str] = []
    try:
        for path, data in files:
            temps.append(_write_temp(Path(path), data))
        for i, (path, _) in enumerate(files):
            os.replace(temps[i], path)
            temps[i] = ""
    except BaseException:
        for tmp in temps:
            if tmp:
                _unlink_quietly(tmp)
        raise
    for folder in dict.fromkeys(Path(path).parent for path, _ in files):
        _fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Readers see the old file or the new one, never a half-written one, even after a crash
    or Ctrl-C; a temp file is removed if writing fails."""
    atomic_write_files([(Path(path), data)])


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _umask() -> int:
    # os.umask() can only be read by setting it, which races with other threads creating
    # files; Linux reports it in /proc instead. Elsewhere assume the common 022.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable on POSIX; not possible (nor needed) on Windows.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- formats


def _comment_safe(text: str) -> str:
    return " ".join(text.replace("--", "- -").split())  # one line, cannot close the comment


def page_marker(result: PageResult) -> str:
    """`<!-- page 3 -->`, `<!-- page 3 failed: reason -->`, `<!-- page 3 stopped: max_tokens -->`,
    or `<!-- page 3 text-layer: reason -->` when the OCR failed and the PDF's own text stands in."""
    if result.from_text_layer:
        return f"<!-- page {result.page} {TEXT_LAYER}: {_comment_safe(result.error or '')} -->"
    if result.error is not None:
        return f"<!-- page {result.page} failed: {_comment_safe(result.error)} -->"
    if result.finish_reason not in (None, "eos"):
        return f"<!-- page {result.page} stopped: {_comment_safe(result.finish_reason)} -->"
    return f"<!-- page {result.page} -->"


def _has_text(result: PageResult) -> bool:
    return result.error is None or result.from_text_layer


def _page_block(result: PageResult, figures_prefix: str = "") -> str:
    text = linked_text(result, figures_prefix).strip("\n") if _has_text(result) else ""
    return page_marker(result) + "\n\n" + (text + "\n\n" if text else "")


def render_markdown(results: Sequence[PageResult], source: Source | None = None) -> str:
    head = source.header() + "\n\n" if source is not None else ""
    return head + "".join(_page_block(r) for r in sorted(results, key=lambda r: r.page)).rstrip("\n") + "\n"


def render_txt(results: Sequence[PageResult], source: Source | None = None) -> str:
    """Plain text, pages separated by form feeds (the pdftotext convention); `source` unused."""
    pages = []
    for r in sorted(results, key=lambda r: r.page):
        pages.append(r.text.strip("\n") + "\n" if _has_text(r) else f"[page {r.page} failed: {r.error}]\n")
    return "\f".join(pages)


def jsonl_record(result: PageResult, source: Source | None = None) -> dict:
    """One page. `source` is "model" (OCR) or "text-layer" (the OCR failed, `error` says why,
    and the text is the PDF's own text layer)."""
    return {
        "doc": source.path if source is not None else path_text(result.doc.path),
        "doc_sha256": source.sha256 if source is not None else None,
        "doc_size": source.size if source is not None else None,
        "doc_mtime_ns": source.mtime_ns if source is not None else None,
        "doc_id": result.doc.doc_id,
        "page": result.page,
        "text": result.text if _has_text(result) else "",
        "source": TEXT_LAYER if result.from_text_layer else "model",
        "n_tokens": result.n_tokens,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "seconds": {stage: round(result.seconds.get(stage, 0.0), 6) for stage in STAGES},
    } | ({"images": figure_records(result)} if result.figures else {})  # crops of a bbox model's regions


def render_jsonl(results: Sequence[PageResult], source: Source | None = None) -> str:
    lines = (json.dumps(jsonl_record(r, source), ensure_ascii=False) for r in sorted(results, key=lambda r: r.page))
    return "".join(line + "\n" for line in lines)


_RENDERERS = {"md": render_markdown, "jsonl": render_jsonl, "txt": render_txt}


def write_document(paths: OutputPaths, results: Sequence[PageResult], formats: Sequence[str], page_files: bool = False,
                   source: Source | None = None) -> list[Path]:
    """Write every output of one document, all or none (see the module docstring); returns the
    files written, the primary format (formats[0]) last. The crops of image regions
    (figures.py), if any, are written first, with the rest, and not listed."""
    files: list[tuple[Path, bytes]] = figure_files(paths.base, results)
    n_crops = len(files)
    if page_files:
        for r in sorted(results, key=lambda r: r.page):
            head = dataclasses.replace(source, page=r.page).header() + "\n\n" if source is not None else ""
            files.append((paths.page_file(r.page), (head + _page_block(r, "../").rstrip("\n") + "\n").encode("utf-8")))
    for fmt in list(formats[1:]) + [formats[0]]:
        files.append((paths.file(fmt), _RENDERERS[fmt](results, source).encode("utf-8")))
    atomic_write_files(files)
    remove_stale(paths.base, [path for path, _ in files[:n_crops]])
    return [path for path, _ in files[n_crops:]]
