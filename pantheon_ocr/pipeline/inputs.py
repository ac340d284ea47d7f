"""What the user typed -> documents and pages.

`expand_inputs` turns files, globs and folders into `Document`s (outputs mirror where each was
found); `parse_pages` / `validate_page_spec` read page selections such as '1-3,7'. Nothing here
opens a PDF: counting and rendering pages is `render.py`'s job, in worker processes.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

from PIL import Image, UnidentifiedImageError

from ..errors import InputError, UsageError

PDF_EXTENSIONS = (".pdf",)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp")


@dataclass(frozen=True)
class Document:
    """One input file. `rel` is its path relative to the folder or glob base it was found
    under (just the file name for a file named directly); outputs mirror it."""

    path: Path  # absolute
    kind: Literal["pdf", "image"]
    doc_id: str  # hash of the absolute path: stable across runs while the file stays put
    rel: PurePath

    @property
    def name(self) -> str:
        return self.path.name


def make_document(path: str | os.PathLike, rel: str | PurePath | None = None) -> Document:
    p = Path(path).expanduser().absolute()
    kind = _kind_of(p)
    if kind is None:
        raise InputError(p, "not a PDF or a supported image (" + " ".join(PDF_EXTENSIONS + IMAGE_EXTENSIONS) + ")")
    doc_id = hashlib.sha256(os.fsencode(p)).hexdigest()[:16]
    return Document(path=p, kind=kind, doc_id=doc_id, rel=PurePath(rel) if rel is not None else PurePath(p.name))


# ------------------------------------------------------------------------------- inputs


def expand_inputs(items: list[str]) -> list[Document]:
    """Files, globs and folders -> documents, in the order given; folders and globs are
    expanded recursively and sorted. Hidden files/folders are skipped (macOS `._x.pdf` litter).
    A file reached twice is kept once. Missing paths and empty globs/folders raise InputError."""
    docs: list[Document] = []
    seen: set[Path] = set()
    for item in items:
        for path, rel in _expand_one(item):
            key = path.resolve()
            if key not in seen:
                seen.add(key)
                docs.append(make_document(path, rel))
    return docs


def _expand_one(item: str) -> list[tuple[Path, PurePath]]:
    p = Path(item).expanduser()
    if p.is_file():
        if not os.access(p, os.R_OK):
            raise InputError(item, "permission denied")
        if _kind_of(p) is None:
            raise InputError(item, "not a PDF or a supported image (" + " ".join(PDF_EXTENSIONS + IMAGE_EXTENSIONS) + ")")
        return [(p, PurePath(p.name))]
    if p.is_dir():
        found = _walk(p)
        if not found:
            raise InputError(item, "folder contains no PDF or image files")
        return found
    if p.exists():
        raise InputError(item, "not a regular file or folder")
    if glob.has_magic(item):
        base = _glob_base(item)
        found = []
        for match in sorted(glob.glob(os.path.expanduser(item), recursive=True)):
            m = Path(match)
            if m.is_dir():
                found += _walk(m, base)
            elif m.is_file() and _kind_by_extension(m) is not None:
                found.append((m, PurePath(os.path.relpath(m, base))))
        if not found:
            raise InputError(item, "no PDF or image files match this pattern")
        return found
    raise InputError(item, "no such file or folder")


def _walk(root: Path, base: Path | None = None) -> list[tuple[Path, PurePath]]:
    base = root if base is None else base
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            f = Path(dirpath, name)
            if not name.startswith(".") and _kind_by_extension(f) is not None:
                found.append((f, PurePath(os.path.relpath(f, base))))
    return sorted(found, key=lambda pr: pr[1].parts)


def _glob_base(pattern: str) -> Path:
    """The folder part of a glob before its first wildcard: 'scans/**/*.pdf' -> scans."""
    parts = []
    for part in Path(os.path.expanduser(pattern)).parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _kind_by_extension(path: Path) -> Literal["pdf", "image"] | None:
    ext = path.suffix.lower()
    return "pdf" if ext in PDF_EXTENSIONS else "image" if ext in IMAGE_EXTENSIONS else None


def _kind_of(path: Path) -> Literal["pdf", "image"] | None:
    """By extension; a named file with another extension is sniffed (PDF header, PIL)."""
    kind = _kind_by_extension(path)
    if kind is not None or not path.is_file():
        return kind
    try:
        with open(path, "rb") as f:
            if b"%PDF-" in f.read(1024):
                return "pdf"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path):
                return "image"
    except Image.DecompressionBombError:
        return "image"  # an image all right; rendering it reports the size problem
    except (OSError, UnidentifiedImageError):
        return None


# -------------------------------------------------------------------------------- pages


_RANGE = re.compile(r"^\s*(\d*)\s*(-?)\s*(\d*)\s*$")


def _parse_spec(spec: str) -> list[tuple[int, int | None]]:
    """'1-3,7,9-' -> [(1, 3), (7, 7), (9, None)]: 1-based inclusive ranges, None = to the end."""
    hint = "use e.g. '1-3,7' or '5-' (pages start at 1)"
    ranges = []
    for part in spec.split(","):
        m = _RANGE.match(part)
        if not m or (not m.group(1) and not m.group(3)):
            raise UsageError(f"bad page range {spec!r}: cannot read {part.strip()!r}; {hint}")
        first = int(m.group(1)) if m.group(1) else 1
        last = int(m.group(3)) if m.group(3) else (None if m.group(2) else first)
        if first < 1 or (last is not None and last < 1):
            raise UsageError(f"bad page range {spec!r}: page 0 does not exist; {hint}")
        if last is not None and last < first:
            raise UsageError(f"bad page range {spec!r}: {part.strip()!r} runs backwards; {hint}")
        ranges.append((first, last))
    return ranges


def validate_page_spec(spec: str | None) -> None:
    """Check the syntax before any work starts (the page count is not known yet)."""
    if spec and spec.strip().lower() != "all":
        _parse_spec(spec)


def parse_pages(spec: str | None, n_pages: int, clip: bool = False) -> list[int]:
    """A 1-based page spec ('1-3,7', '5-', '-2', 'all' or None) -> sorted unique 0-based page
    indices. Pages beyond n_pages are a UsageError, or dropped when clip=True (one spec applied
    to many documents of different lengths)."""
    if not spec or spec.strip().lower() == "all":
        return list(range(n_pages))
    pages: set[int] = set()
    for first, last in _parse_spec(spec):
        last = n_pages if last is None else last
        if not clip and max(first, last) > n_pages:
            raise UsageError(f"page {max(first, last)} is out of range: the document has {n_pages} pages")
        pages.update(range(first - 1, min(last, n_pages)))
    return sorted(pages)
