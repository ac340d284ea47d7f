"""Writers: one Markdown / JSONL / text file per document, optional per-page files.

Where the files go (and why names never depend on input order) is naming.py's job. Each output
records its source (naming.Source: the input's path, sha256, size and mtime, and the model that
read it): the Markdown starts with `<!-- pantheon-ocr: {"source": "/in/a.pdf", "sha256": "...",
"size": ..., "mtime_ns": ..., "model": "...", "formats": "md,txt", "txt_sha256": "..."} -->` (per-page
files add "page"), every JSONL record carries `doc`, `doc_sha256`, `doc_size`, `doc_mtime_ns`, `model`,
`doc_formats` and `doc_txt_sha256`; txt files are plain text and record nothing: the formats written
with them, and the txt's sha256, say whether a txt beside them is theirs.
File names are written as `errors.path_record` records them (undecodable bytes as `\\xNN`).

A document's outputs are all written or none are: every file is first written to a temp file
in its folder (fsync), then all are renamed into place, the primary format (the first in
`formats`) last, so that its presence means the set is complete (an old primary is removed
before the first rename, so a kill between the renames never leaves it beside new files: for
the moment of the renames a reader sees no primary, and a set whose renames fail is written
again by the next run); if anything fails, the temp files are removed. Temp names are short
(`.pantheon-<hash of the name>-<random>.tmp`), so any output name the file system accepts also
has a temp name it accepts. A writer holds its temp (an advisory lock) while it writes, so the
temps a kill -9 left are told from a live writer's: a later run's first write in their folder
sweeps those older than STALE_TEMP_S.

Nothing is written or deleted outside the output tree: every folder below its root is opened
from the root one name at a time without following links (files.OutputTree: O_NOFOLLOW and
dir_fd), temps are made in it with O_EXCL | O_NOFOLLOW, the folders are checked again (lstat,
and the same inode as opened) just before the renames, and stale crops and page files are
listed and removed through the opened folder. A symbolic link or a file planted where the tree
needs a folder, or a link where a file goes, is a files.PlantedPath naming it (an OSError and a
WriteError): that document is not written and the batch goes on (transcribe: `unwritten`; archive
jobs: retried next run; exit 73 either way).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
from os import fsdecode  # not through `os`: tests stand a fake `os` in for this module's writes
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import WriteError, path_record, path_text
from .figures import figure_files, figure_records, images_dir, linked_text, remove_stale
from .files import OutputFolder, OutputTree, PlantedPath
from .naming import PAGE_FILE, OutputPaths, Source, failed_pages, output_root
from .types import STAGES, TEXT_LAYER, PageResult

TEMP_PREFIX = ".pantheon-"
TEMP_NAME = re.compile(r"^\.pantheon-(?P<hash>[0-9a-f]{12})-[a-z0-9_]{8}\.tmp$")
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"


def temp_tag(name: str) -> str:
    """The 12 hex digits a temp file of output `name` carries (so stale temps can be matched to
    their targets: archive/plan.py cleans them up)."""
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:12]


@dataclass(frozen=True)
class _Place:
    """Where a file goes: its path, and the folder of the output tree it goes in."""

    path: Path
    folder: OutputFolder


def _write_temp(place: _Place, data: bytes) -> str:
    """`data` in a new temp file beside `place.path`, flushed to disk; returns the temp's path.
    Made with O_EXCL | O_NOFOLLOW in the folder opened from the output root (files.py), mode
    0666 less the umask like any ordinary file."""
    prefix = f"{TEMP_PREFIX}{temp_tag(place.path.name)}-"
    for _ in range(100):
        name = prefix + "".join(secrets.choice(_TEMP_CHARS) for _ in range(8)) + ".tmp"
        try:
            fd = place.folder.create(name)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temp file name", str(place.path.parent))
    try:
        place.folder.hold(fd)  # held until closed: a temp no one holds was left by a killed writer
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        place.folder.unlink(name)
        raise
    return str(place.path.with_name(name))


# A writer lets go of a temp (closes it) before the set's renames, which wait for the set's other
# files and their fsyncs: seconds on a slow disk. One older than this that no one holds was left
# by a killed run, never one a live writer is about to rename.
STALE_TEMP_S = 600.0
_swept: set[tuple[int, int]] = set()  # folders (device, inode) this process has swept


def _sweep_stale_temps(folder: OutputFolder) -> None:
    """Remove the temps a killed writer (kill -9, a power cut) left in `folder`, once a process
    per folder: only our own names (TEMP_NAME), only those no live writer holds (files.hold) and
    older than STALE_TEMP_S."""
    ident = folder.identity()
    if ident is None or ident in _swept:
        return
    _swept.add(ident)
    for entry in folder.names():
        if TEMP_NAME.match(entry) and folder.abandoned(entry, STALE_TEMP_S):
            folder.unlink(entry)


def make_folder(folder: str | os.PathLike, what: str = "output folder", hint: str = "") -> Path:
    """`folder`, made if it is not there yet; WriteError naming it and `what` it is for (`hint`:
    what to do, after a file in its place) where a file stands in its place or it cannot be made:
    mkdir's own words for a file in the way are a bare "File exists"."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise WriteError(f"{path_text(path)}: the {what} is a file, not a folder{hint}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(f"{path_text(path)}: cannot make the {what}: {e.strerror or e}") from None
    return path


def check_output_folder(folder: str | os.PathLike, what: str = "output folder", hint: str = "") -> None:
    """WriteError naming `folder` unless it is a folder this process can write in (made if it is
    not there yet). Called before any page is read: a run that cannot keep its outputs says so at
    once, not after hours of OCR."""
    path = make_folder(folder, what, hint)
    try:
        fd, probe = tempfile.mkstemp(prefix=".pantheon-ocr-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        # ENOENT for a folder that is there: a file system that makes no files (/proc, /sys)
        why = ("files cannot be made in it (a virtual file system such as /proc?)" if e.errno == errno.ENOENT
               and path.is_dir() else e.strerror or e)
        raise WriteError(f"{path_text(path)}: cannot write in the {what}: {why}") from None


def atomic_write_files(files: Sequence[tuple[Path, bytes]], root: str | os.PathLike | None = None) -> None:
    """Write all files or none: temps first, then renames in the given order (put the file whose
    presence means "complete" last). On any failure the temps not yet renamed are removed.

    Nothing is written through a link: every folder below `root` (None: each file's own
    folder is its root) is opened without following links, made if missing, and checked again
    just before the renames; a file whose place holds a symbolic link is refused too. Either is
    a PlantedPath naming it, raised before anything is written."""
    with OutputTree(None if root is None else Path(root)) as tree:
        _write_all(tree, files)


def _write_all(tree: OutputTree, files: Sequence[tuple[Path, bytes]], last_marks_complete: bool = False) -> None:
    """files written to temps, then renamed into place in order. last_marks_complete: the last
    file's presence says the set is whole (a document's primary format), so an old one goes
    before the first rename: a kill between the renames leaves a set without it, which the next
    run writes again, never an old primary beside new secondary files that passes for whole."""
    folders = list(dict.fromkeys(Path(path).parent for path, _ in files))
    for folder in folders:  # every planted link named before any folder is made
        tree.folder(folder, create=False)
    places = [_Place(Path(path), tree.folder(Path(path).parent)) for path, _ in files]
    for place in places:
        place.folder.check_target(place.path.name)
    for folder in dict.fromkeys(place.folder for place in places):
        _sweep_stale_temps(folder)
    temps: list[str] = []
    place = places[0] if places else None
    try:
        for place, (_, data) in zip(places, files):
            temps.append(_write_temp(place, data))
        for folder in dict.fromkeys(place.folder for place in places):
            folder.verify()
        for place in places:
            place.folder.check_target(place.path.name)
        if last_marks_complete and len(places) > 1:  # one that cannot go fails the set before any rename
            places[-1].folder.remove(places[-1].path.name)
        for i, place in enumerate(places):
            os.replace(temps[i], place.path)
            temps[i] = ""
    except BaseException as e:
        if isinstance(e, OSError) and not isinstance(e, PlantedPath) and place is not None \
                and (e.filename is None or TEMP_NAME.match(Path(fsdecode(e.filename)).name)):
            e.filename, e.filename2 = str(place.path), None  # a full disk names no file: say the output's
        for p, tmp in zip(places, temps):
            if tmp:
                p.folder.unlink(Path(tmp).name)
        raise
    for folder in folders:
        tree.folder(folder).fsync()


def write_problem(e: OSError) -> str:
    """'cannot write the output out/a.jsonl: Is a directory': the output a failed write names
    (a rename's target, not its hidden temp), where the error names one; a PlantedPath says its own."""
    if isinstance(e, PlantedPath):  # its reason names the path
        return f"cannot write the output: {e.strerror}"
    names = [n for n in (e.filename2, e.filename) if n is not None and not TEMP_NAME.match(Path(fsdecode(n)).name)]
    return f"cannot write the output{' ' + path_text(names[0]) if names else ''}: {e.strerror or e}"


def atomic_write_bytes(path: str | os.PathLike, data: bytes, root: str | os.PathLike | None = None) -> None:
    """Readers see the old file or the new one, never a half-written one, even after a crash
    or Ctrl-C; a temp file is removed if writing fails. `root`: see atomic_write_files."""
    atomic_write_files([(Path(path), data)], root)


def atomic_write_text(path: str | os.PathLike, text: str, root: str | os.PathLike | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), root)


# ----------------------------------------------------------------------------- formats


# A line of a page's own text that begins like a page marker would cut the page in two for any
# reader of the Markdown (archive --rebuild-state recovers pages by their markers). A backslash
# before it (CommonMark's escape: shown as written) keeps it text; one more backslash in front of
# any already there keeps the escape reversible (unescape_markers).
_MARKER_LIKE = re.compile(r"^(\\*<!-- page )", re.MULTILINE)
_ESCAPED_MARKER = re.compile(r"^\\(\\*<!-- page )", re.MULTILINE)


# C0 and C1 control characters but tab and newline (and DEL): a text layer or a model may hold
# them; in a file for people or in a terminal (`-o -`) they move the cursor, ring, or recolour.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """A page's text as the Markdown and text files hold it: line ends as \\n, no control
    characters (a form feed would also read as a page break in the text file)."""
    return _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def escape_markers(text: str) -> str:
    """A page's text as the Markdown holds it: lines that read like page markers escaped."""
    return _MARKER_LIKE.sub(r"\\\1", text)


def unescape_markers(text: str) -> str:
    """The page's text back from the Markdown's (escape_markers undone)."""
    return _ESCAPED_MARKER.sub(r"\1", text)


def _comment_safe(text: str) -> str:
    return " ".join(text.replace("--", "- -").split())  # one line, cannot close the comment


def page_marker(result: PageResult) -> str:
    """`<!-- page 3 -->`, `<!-- page 3 failed: reason -->`, `<!-- page 3 stopped: max_tokens -->`,
    or `<!-- page 3 text-layer: reason -->` when the OCR failed and the PDF's own text stands in."""
    if result.from_text_layer:  # the OCR failed (error says why), or --text-layer prefer kept it
        why = f": {_comment_safe(result.error)}" if result.error else ""
        return f"<!-- page {result.page} {TEXT_LAYER}{why} -->"
    if result.error is not None:
        return f"<!-- page {result.page} failed: {_comment_safe(result.error)} -->"
    if result.finish_reason not in (None, "eos"):
        return f"<!-- page {result.page} stopped: {_comment_safe(result.finish_reason)} -->"
    return f"<!-- page {result.page} -->"


def _has_text(result: PageResult) -> bool:
    return result.error is None or result.from_text_layer


def _page_block(result: PageResult, figures_prefix: str = "") -> str:
    text = escape_markers(printable(linked_text(result, figures_prefix)).strip("\n")) if _has_text(result) else ""
    return page_marker(result) + "\n\n" + (text + "\n\n" if text else "")


def render_markdown(results: Sequence[PageResult], source: Source | None = None) -> str:
    head = source.header() + "\n\n" if source is not None else ""
    return head + "".join(_page_block(r) for r in sorted(results, key=lambda r: r.page)).rstrip("\n") + "\n"


def render_txt(results: Sequence[PageResult], source: Source | None = None) -> str:
    """Plain text, pages separated by form feeds (the pdftotext convention); `source` unused."""
    pages = []
    for r in sorted(results, key=lambda r: r.page):
        pages.append(printable(r.text).strip("\n") + "\n" if _has_text(r) else f"[page {r.page} failed: {printable(r.error or '')}]\n")
    return "\f".join(pages)


def jsonl_record(result: PageResult, source: Source | None = None) -> dict:
    """One page. `source` is "model" (OCR) or "text-layer" (the OCR failed, `error` says why,
    and the text is the PDF's own text layer). `doc_pages`: the page selection the document's
    outputs were made with (naming.Source.pages), only when it is not every page; `doc_failed`:
    the document's failed pages (naming.Source.failed), only when there are some; `doc_formats`:
    the formats written with it, `doc_txt_sha256` the txt's (naming.Source)."""
    return {
        "doc": source.path if source is not None else path_record(result.doc.path),
        "doc_sha256": source.sha256 if source is not None else None,
        "doc_size": source.size if source is not None else None,
        "doc_mtime_ns": source.mtime_ns if source is not None else None,
    } | ({"doc_pages": source.pages} if source is not None and source.pages is not None else {}) | (
        {"doc_failed": source.failed} if source is not None and source.failed else {}) | (
        {"doc_formats": source.formats} if source is not None and source.formats else {}) | (
        {"doc_txt_sha256": source.txt_sha256} if source is not None and source.txt_sha256 else {}) | {
        "doc_id": result.doc.doc_id,
        "page": result.page,
        "text": result.text if _has_text(result) else "",
        "source": result.source,
    } | ({"model": source.model} if source is not None and source.model else {}) | {
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
    (figures.py), if any, are written first, with the rest, and not listed; crops an earlier run
    left that this one did not write are removed after.

    Everything stays inside the output tree (`paths.root`; OutputPaths made without one, as
    archive jobs make them, have it from the document's relative name: naming.output_root): a
    symbolic link or a file planted in it where a folder of this document's goes fails the
    document with a PlantedPath (an OSError) naming it, before anything is written or removed."""
    # rendered first: the records beside it carry its sha256 (the txt records nothing itself)
    txt = render_txt(results).encode("utf-8") if "txt" in formats else None
    if source is not None:  # what failed is recorded, so that the next run reads the document again
        source = dataclasses.replace(source, failed=failed_pages(r.page for r in results if r.error is not None and not r.lasting),
                                     formats=",".join(formats), txt_sha256=None if txt is None else hashlib.sha256(txt).hexdigest())
    files: list[tuple[Path, bytes]] = figure_files(paths.base, results)
    n_crops = len(files)
    if page_files:
        for r in sorted(results, key=lambda r: r.page):
            head = dataclasses.replace(source, page=r.page).header() + "\n\n" if source is not None else ""
            files.append((paths.page_file(r.page), (head + _page_block(r, "../").rstrip("\n") + "\n").encode("utf-8")))
    for fmt in list(formats[1:]) + [formats[0]]:
        files.append((paths.file(fmt), txt if fmt == "txt" else _RENDERERS[fmt](results, source).encode("utf-8")))
    crops = images_dir(paths.base)
    with OutputTree(paths.root or output_root(paths.base, results[0].doc if results else None)) as tree:
        tree.folder(crops, create=False)  # the stale crops' folder: a link there fails the document now
        _write_all(tree, files, last_marks_complete=True)
        remove_stale(tree.folder(crops, create=False), [path for path, _ in files[:n_crops]])
    if page_files:  # a page file of an earlier version or selection is not part of this set
        remove_old_page_files(paths, {r.page for r in results}, results[0].doc if results else None)
    return [path for path, _ in files[n_crops:]]


def check_targets(paths: OutputPaths, formats: Sequence[str], page_files: bool = False, doc=None) -> None:
    """PlantedPath if a symbolic link stands where one of the document's outputs goes (or a link or
    a file where one of its folders does): found before the document is read, so that its pages
    are not read to be refused at the end. write_document checks again as it writes (the tree
    can change meanwhile); a folder not there yet is no problem (it is made then)."""
    with OutputTree(paths.root or output_root(paths.base, doc)) as tree:
        folder = tree.folder(paths.base.parent, create=False, doing="write")
        if folder is None:
            return
        for fmt in formats:
            folder.check_target(paths.file(fmt).name)
        if page_files:
            tree.folder(paths.base, create=False, doing="write")  # their folder
        tree.folder(images_dir(paths.base), create=False)  # stale crops are removed from it


def remove_old_page_files(paths: OutputPaths, pages: set[int], doc=None) -> None:
    """Per-page files of pages a changed document no longer has (they would otherwise pass for
    part of the new version), removed from its folder as the writers reach it: never through a
    link (a planted one is a PlantedPath, as in write_document)."""
    with OutputTree(paths.root or output_root(paths.base, doc)) as tree:
        folder = tree.folder(paths.base, create=False)
        for name in folder.names() if folder is not None else ():
            m = PAGE_FILE.fullmatch(name)
            if m and int(m.group(1)) not in pages:
                folder.unlink(name)
