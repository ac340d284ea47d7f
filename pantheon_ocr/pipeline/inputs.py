"""What the user typed -> documents and pages.

`expand_inputs` turns files, globs and folders into `Document`s (outputs mirror where each was
found); `parse_pages` / `validate_page_spec` read page selections such as '1-3,7'. Nothing here
opens a PDF: counting and rendering pages is `render.py`'s job, in worker processes.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

from PIL import Image, UnidentifiedImageError

from ..errors import InputError, UsageError
from .files import open_regular, special_kind

PDF_EXTENSIONS = (".pdf",)
# what this Pillow registers a reader for (PNG, JPEG, TIFF and BMP always), found in folders and
# globs as named files are (GIF and WebP: their first frame)
IMAGE_EXTENSIONS = tuple(e for e in (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp", ".gif", ".jp2", ".j2k",
                                     ".jpx", ".avif", ".pbm", ".pgm", ".ppm", ".pnm")
                         if e in Image.registered_extensions())


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


class NothingFound(InputError):
    """An empty folder or a glob matching nothing: an error on the command line, a quiet night
    for an archive job."""


def expand_inputs(items: list[str], problems: list[InputError] | None = None,
                  follow_links: bool = True) -> list[Document]:
    """Files, globs and folders -> documents, in the order given; folders and globs are
    expanded recursively and sorted. Hidden files/folders are skipped (macOS `._x.pdf` litter).
    A file reached twice is kept once. Linked folders inside a folder are walked unless not
    `follow_links` (archive jobs: a link planted in an upload folder must not lead them all over
    the disk).

    Every path is stat'ed before anything opens it, and only regular files become documents:
    a missing path, a dangling or looping link, a FIFO, socket or device, an unreadable file, an
    empty folder or glob is a problem. With `problems` (a list), each bad path is appended once
    and the others go ahead; without it the first one raises InputError."""
    docs: list[Document] = []
    seen: dict[tuple[int, int], list[int]] = {}  # a file (device, inode) -> its documents' places in docs
    named: set[str] = set()

    def bad(e: InputError) -> None:
        if problems is None:
            raise e
        if e.path not in named:
            named.add(e.path)
            problems.append(e)

    for item in items:
        for path, rel, st in _expand_one(item, bad, follow_links):
            # one file however it is spelled or linked to; a hard link (another name in the file
            # system for the same bytes) is a document of its own, as the user named it
            key = (st.st_dev, st.st_ino)
            i = next((i for i in seen.get(key, ()) if _same_name(path, docs[i].path)), None)
            if i is not None:
                # reached twice: the file's own name over a symbolic link's (`ok.pdf` beside
                # `link-to-ok.pdf`), then the outer of two inputs (`docs docs/sub`), whatever order
                # they came in
                if _preference(path, rel) > _preference(docs[i].path, docs[i].rel):
                    try:
                        docs[i] = make_document(path, rel)
                    except InputError:
                        pass
                continue
            try:
                doc = make_document(path, rel)
            except InputError as e:
                bad(e)
                continue
            seen.setdefault(key, []).append(len(docs))
            docs.append(doc)
    return docs


def _same_name(a: Path, b: Path) -> bool:
    """Whether two paths of one file (same device and inode) are one name of it, not two hard
    links: the same real path, or the same name (up to case: a case-insensitive disk) in the same
    folder (up to a bind mount or another spelling of it). os.path.realpath never raises on a
    link loop, unlike Path.resolve."""
    real_a, real_b = os.path.realpath(a), os.path.realpath(b)
    if real_a == real_b:
        return True
    try:
        pa, pb = os.stat(os.path.dirname(real_a)), os.stat(os.path.dirname(real_b))
    except OSError:
        return False
    return (pa.st_dev, pa.st_ino) == (pb.st_dev, pb.st_ino) and \
        os.path.basename(real_a).casefold() == os.path.basename(real_b).casefold()


def _preference(path: Path, rel: PurePath) -> tuple[bool, int]:
    return not os.path.islink(path), len(rel.parts)


def _stat(item: str | os.PathLike, bad) -> os.stat_result | None:
    """stat() following links, or None after naming the problem (missing, dangling, looping,
    permission denied)."""
    try:
        return os.stat(item)
    except ValueError:  # a NUL in the name (a path made in code): no file can have it
        bad(InputError(item, "not a path: it holds a NUL character"))
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            problem = "symbolic link loop"
        elif e.errno == errno.ENOENT and os.path.lexists(item):
            problem = "broken symbolic link (its target does not exist)"
        elif e.errno == errno.ENOENT:
            problem = "no such file or folder"
        else:
            problem = f"cannot read: {e.strerror or e}"
        bad(InputError(item, problem))
        return None


def _check_file(path: str | os.PathLike, st: os.stat_result, bad) -> bool:
    kind = special_kind(st.st_mode)
    if kind is not None:
        bad(InputError(path, f"{kind}, not a regular file: only regular files are read"))
        return False
    if not os.access(path, os.R_OK):
        bad(InputError(path, "permission denied"))
        return False
    return True


def empty_path(item: str) -> InputError | None:
    """The error for an input that is no path at all: "" (Path("") is ".", so an unset "$IN" would
    read the whole current folder) or blanks; None for any other."""
    if item.strip():
        return None
    return InputError(repr(item), "an empty path (an unset shell variable?): give a file, folder or pattern")


def _expand_one(item: str, bad, follow_links: bool = True) -> list[tuple[Path, PurePath, os.stat_result]]:
    problem = empty_path(item)
    if problem is not None:
        bad(problem)
        return []
    p = Path(item).expanduser()
    if glob.has_magic(item) and not os.path.lexists(p):
        base = _glob_base(item)
        found = []
        for match in sorted(glob.glob(os.path.expanduser(item), recursive=True)):
            m = Path(match)
            st = _stat(m, bad) if _kind_by_extension(m) is not None or os.path.isdir(m) else None
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                found += _walk(m, bad, base, follow_links)
            elif _check_file(m, st, bad):
                found.append((m, PurePath(os.path.relpath(m, base)), st))
        if not found:
            bad(NothingFound(item, "no PDF or image files match this pattern"))
        return found
    st = _stat(p, bad)
    if st is None:
        return []
    if stat.S_ISDIR(st.st_mode):
        found = _walk(p, bad, follow_links=follow_links)
        if not found:
            bad(NothingFound(item, "folder contains no PDF or image files"))
        return found
    if not _check_file(item, st, bad):
        return []
    if _kind_of(p) is None:
        bad(InputError(item, "not a PDF or a supported image (" + " ".join(PDF_EXTENSIONS + IMAGE_EXTENSIONS) + ")"))
        return []
    return [(p, PurePath(p.name), st)]


def _walk(root: Path, bad, base: Path | None = None, follow_links: bool = True
          ) -> list[tuple[Path, PurePath, os.stat_result]]:
    """Documents under a folder; hidden files and folders are passed over. A listed file with a
    document extension is stat'ed, and if it is not a regular file it is named as bad.

    Linked folders are followed when `follow_links` (a folder of scans linked in): those whose
    real folder is inside `root` are not, since that folder is walked under its own name (a link
    sorting first would otherwise rename its documents, and a loop back up ends there), and a
    folder outside reached twice (two links, a loop out there) is walked once."""
    base = root if base is None else base
    found = []
    inside, walked = os.path.realpath(root), set()

    def unlistable(e: OSError) -> None:
        bad(InputError(e.filename or root, f"cannot list folder: {e.strerror or e}"))

    def to_walk(folder: str) -> bool:
        if folder == str(root) or not os.path.islink(folder):
            return True
        real = os.path.realpath(folder)
        if os.path.commonpath([inside, real]) == inside:
            return False
        try:
            st = os.stat(real)
        except OSError:
            return False
        key = (st.st_dev, st.st_ino)
        if key in walked:
            return False
        walked.add(key)
        return True

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable, followlinks=follow_links):
        if not to_walk(dirpath):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # the first of two links is the same each run
        for name in filenames:
            f = Path(dirpath, name)
            if name.startswith(".") or _kind_by_extension(f) is None:
                continue
            st = _stat(f, bad)
            if st is not None and _check_file(f, st, bad):
                found.append((f, PurePath(os.path.relpath(f, base)), st))
    return sorted(found, key=lambda item: item[1].parts)


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
    """By extension, except that a file named as an image that begins with a PDF header is a PDF
    (a PDF saved as .png; an image whose metadata holds "%PDF-" further in stays an image), and
    one named .pdf with no PDF header that Pillow reads is an image; a file with another
    extension is sniffed (a PDF header in its first 1,024 bytes, where PDF readers
    look for it; else PIL). A file that cannot be opened keeps its extension's kind: reading it
    says why."""
    kind = _kind_by_extension(path)
    try:
        with open_regular(path) as f:
            head = f.read(1024)
            if kind == "image" or (kind == "pdf" and b"%PDF-" in head):
                return "pdf" if kind == "image" and head.startswith(b"%PDF-") else kind
            if b"%PDF-" in head:
                return "pdf"
            # named .pdf with no PDF header, or an unknown extension: an image if Pillow reads it
            # (a scan saved as .pdf by a careless tool); else the extension's kind, whose reading
            # says what is wrong
            f.seek(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(f):
                    return "image"
    except Image.DecompressionBombError:
        return "image"  # an image all right; rendering it reports the size problem
    except (OSError, UnidentifiedImageError):
        return kind


# -------------------------------------------------------------------------------- pages


_RANGE = re.compile(r"^\s*(\d*)\s*(-?)\s*(\d*)\s*$", re.ASCII)  # '٢' is no page number here


def page_ranges(spec: str) -> list[tuple[int, int | None]]:
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
        page_ranges(spec)


def pages_past_end(spec: str | None, n_pages: int) -> str:
    """The pages a spec names by number past a document's last page, as a spec ('501', '9-12');
    '' when none. An open range ('5-') never counts: it means to the end, however long."""
    if not spec or spec.strip().lower() == "all":
        return ""
    past = sorted({(max(first, n_pages + 1), last) for first, last in page_ranges(spec) if last is not None and last > n_pages})
    merged: list[list[int]] = []
    for first, last in past:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in merged)


def past_end_note(spec: str | None, n_pages: int) -> str:
    """What a document lacks of a selection, said with its outcome: 'selected page 501 past its
    end: it has 500 pages'; '' when it has them all (see pages_past_end)."""
    past = pages_past_end(spec, n_pages)
    if not past:
        return ""
    return (f"selected page{'s' if '-' in past or ',' in past else ''} {past} past its end: it has {n_pages} "
            f"page{'s' if n_pages != 1 else ''}")


def parse_pages(spec: str | None, n_pages: int, clip: bool = False) -> list[int]:
    """A 1-based page spec ('1-3,7', '5-', '-2', 'all' or None) -> sorted unique 0-based page
    indices. Pages beyond n_pages are a UsageError, or dropped when clip=True (one spec applied
    to many documents of different lengths)."""
    if not spec or spec.strip().lower() == "all":
        return list(range(n_pages))
    pages: set[int] = set()
    for first, last in page_ranges(spec):
        last = n_pages if last is None else last
        if not clip and max(first, last) > n_pages:
            raise UsageError(f"page {max(first, last)} is out of range: the document has {n_pages} pages")
        pages.update(range(first - 1, min(last, n_pages)))
    return sorted(pages)
