"""Writers: one Markdown / JSONL / text file per document, optional per-page files.

Naming: a document found as `<rel>` (its path relative to the folder or glob base it came
from, or just its name when given directly) is written to `<out>/<rel without suffix>.<fmt>`,
so folder structure is mirrored and `a/report.pdf`, `b/report.pdf` do not meet. When two
documents of one run still map to the same name (`scan.pdf` + `scan.png`, or two files given
directly from different folders), the later one in input order gets `-<doc id[:8]>` appended.
Per-page files go to `<out>/<rel without suffix>/page-0003.md`.

Every file is written atomically (temp file in the same folder, fsync, rename), and the
primary format (the first in `formats`) is written last: if it exists, the document is done.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Iterable, Sequence

from .types import STAGES, PageResult
from .inputs import Document


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Readers see the old file or the new one, never a half-written one, even after a crash
    or Ctrl-C; a temp file is removed if writing fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


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


# ------------------------------------------------------------------------------ naming


@dataclass(frozen=True)
class OutputPaths:
    base: Path  # <out>/<rel without suffix>; formats append ".<fmt>"

    def file(self, fmt: str) -> Path:
        return self.base.with_name(f"{self.base.name}.{fmt}")

    def page_file(self, page: int) -> Path:
        return self.base / f"page-{page:04d}.md"

    def documents(self, formats: Sequence[str]) -> list[Path]:
        return [self.file(f) for f in formats]

    def exist(self, formats: Sequence[str]) -> bool:
        return all(p.is_file() for p in self.documents(formats))


def plan_output_paths(documents: Iterable[Document], out_dir: str | os.PathLike) -> dict[str, OutputPaths]:
    """doc_id -> OutputPaths for one run (see the module docstring for the rule)."""
    out = Path(out_dir)
    taken: set[str] = set()
    plan: dict[str, OutputPaths] = {}
    for doc in documents:
        if doc.doc_id in plan:
            continue
        rel = PurePath(doc.rel)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            rel = PurePath(doc.path.name)  # never write outside the output folder
        stem = rel.with_suffix("") if rel.suffix else rel
        key = str(stem).casefold()  # case-insensitive file systems (macOS, Windows)
        if key in taken:
            stem = stem.with_name(f"{stem.name}-{doc.doc_id[:8]}")
            key = str(stem).casefold()
        taken.add(key)
        plan[doc.doc_id] = OutputPaths(out / stem)
    return plan


# ----------------------------------------------------------------------------- formats


def _comment_safe(text: str) -> str:
    return " ".join(text.replace("--", "- -").split())  # one line, cannot close the comment


def page_marker(result: PageResult) -> str:
    """`<!-- page 3 -->`, `<!-- page 3 failed: reason -->` or `<!-- page 3 stopped: max_tokens -->`."""
    if result.error is not None:
        return f"<!-- page {result.page} failed: {_comment_safe(result.error)} -->"
    if result.finish_reason not in (None, "eos"):
        return f"<!-- page {result.page} stopped: {_comment_safe(result.finish_reason)} -->"
    return f"<!-- page {result.page} -->"


def _page_block(result: PageResult) -> str:
    text = result.text.strip("\n") if result.error is None else ""
    return page_marker(result) + "\n\n" + (text + "\n\n" if text else "")


def render_markdown(results: Sequence[PageResult]) -> str:
    return "".join(_page_block(r) for r in sorted(results, key=lambda r: r.page)).rstrip("\n") + "\n"


def render_txt(results: Sequence[PageResult]) -> str:
    """Plain text, pages separated by form feeds (the pdftotext convention)."""
    pages = []
    for r in sorted(results, key=lambda r: r.page):
        pages.append(f"[page {r.page} failed: {r.error}]\n" if r.error is not None else r.text.strip("\n") + "\n")
    return "\f".join(pages)


def jsonl_record(result: PageResult) -> dict:
    return {
        "doc": str(result.doc.path),
        "doc_id": result.doc.doc_id,
        "page": result.page,
        "text": result.text if result.error is None else "",
        "n_tokens": result.n_tokens,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "seconds": {stage: round(result.seconds.get(stage, 0.0), 6) for stage in STAGES},
    }


def render_jsonl(results: Sequence[PageResult]) -> str:
    lines = (json.dumps(jsonl_record(r), ensure_ascii=False) for r in sorted(results, key=lambda r: r.page))
    return "".join(line + "\n" for line in lines)


_RENDERERS = {"md": render_markdown, "jsonl": render_jsonl, "txt": render_txt}


def write_document(
    paths: OutputPaths, results: Sequence[PageResult], formats: Sequence[str], page_files: bool = False
) -> list[Path]:
    """Write every output of one document; returns the files written. The primary format
    (formats[0]) goes last so that its presence means the whole set is complete."""
    written = []
    if page_files:
        for r in sorted(results, key=lambda r: r.page):
            atomic_write_text(paths.page_file(r.page), _page_block(r).rstrip("\n") + "\n")
            written.append(paths.page_file(r.page))
    for fmt in list(formats[1:]) + [formats[0]]:
        atomic_write_text(paths.file(fmt), _RENDERERS[fmt](results))
        written.append(paths.file(fmt))
    return written
