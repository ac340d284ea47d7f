"""Where a document's outputs go, and the record of their source that they carry.

A document found as `<rel>` (its path relative to the folder or glob base it came from, or just
its name when given directly) is written to `<out>/<rel without suffix>.<fmt>`, so folder
structure is mirrored and `a/report.pdf`, `b/report.pdf` do not meet. Per-page files go to
`<out>/<rel without suffix>/page-0003.md`.

Names never depend on the order of the inputs:
- When documents of one run map to the same name (`scan.pdf` + `scan.png`, or two files named
  directly from different folders; compared case-insensitively), the one whose absolute path
  sorts first (as bytes) keeps it and the others get `-<doc id[:8]>` appended; except that a
  document whose outputs already hold that name (an earlier run had it alone) keeps them there,
  and the first takes its suffixed name: nothing is read twice or written twice.
- A document whose own name looks like a per-page file (`page-0003`) always gets the suffix, so
  no document's output can ever be another document's page file.
- Every output records its source (`Source`: the input's path and sha256; see outputs.py for
  where). A name whose existing output came from another source is not reused: the document
  takes its suffixed name instead, and "skip existing" skips only a document whose outputs came
  from the same file, unchanged (the same size and mtime, else the same sha256), and made with
  the page selection asked for now (`Source.pages`, recorded only when it is not every page):
  outputs of `--pages 1` are not the document's transcript, so a run over other pages or all
  of them transcribes it again and replaces them.
- Names fit the file system: a document's name plus the longest suffix a writer adds to it
  (NAME_ROOM: `_images`, longer than `.jsonl`, `.md`, `.txt`; page files and temp files have
  short names of their own) must fit in PC_NAME_MAX bytes of the output folder (255 almost
  everywhere). A name that does not is cut (in bytes of its file name, never inside a UTF-8
  character; a byte that is not UTF-8 counts as one) and always gets `-<doc id[:8]>`, so cut
  names stay unique and the same every run. With 255: a 251-byte name (+ `.pdf`) is written
  as its first 239 bytes + `-1a2b3c4d` (.md, .jsonl, ...; 248 bytes + `_images` = 255). A
  name that fits but whose `-<doc id[:8]>` for a clash would not (a 247-byte name: 247 +
  `_images` fits, 247 + 9 + 7 does not) is cut the same way when it takes the suffix.

claims.py settles these names against what the output folder holds, and decides which documents
are done.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Iterable, Sequence

from ..errors import path_record
from ..options import FORMATS
from .files import open_regular, sha256_of
from .inputs import Document, page_ranges

PAGE_FILE = re.compile(r"page-(\d{4,})\.md")  # OutputPaths.page_file's names, as written
# A document's stem that could meet a page file: `<out>/a/page-0003.md` of a document `a/page-0003.pdf`
# is `a.pdf`'s page 3. Matched without case (a case-insensitive file system makes Page-0003 the
# same file) and without `.md` (it is a stem); such a document always takes the `-<doc id>` suffix.
PAGE_STEM = re.compile(r"page-\d{4,}", re.IGNORECASE)

HEADER_PREFIX = "<!-- pantheon-ocr: "  # the first line of every Markdown output
RECORDING = {"md", "jsonl"}  # the formats that record their source (a txt records nothing)
IMAGES_SUFFIX = "_images"  # a document's crops folder: `<out>/<doc>_images` (figures.py)
NAME_ROOM = len(IMAGES_SUFFIX)  # the longest suffix the writers add to a document's name
ID_SUFFIX = 9  # bytes of "-<doc id[:8]>"
DEFAULT_NAME_MAX = 255


@dataclass(frozen=True)
class Source:
    """Where an output came from: the input's path (as `errors.path_record` records it), the sha256
    of its bytes and the size and mtime it had then; `page` for a per-page file; `pages`: the
    page selection the outputs were made with (`page_selection`), None for every page (and for
    outputs older than the field, which were always taken as the whole document)."""

    path: str
    sha256: str
    page: int | None = None
    size: int | None = None
    mtime_ns: int | None = None
    pages: str | None = None  # after these: callers build Source(path, sha256) positionally (archive/rebuild.py)
    # The pages that failed (text-layer stand-ins included, not the input's own damage) when the
    # outputs were written, in page_selection's form ("2-5,9"): such outputs are no document's
    # last word, and the next run reads those pages again.
    failed: str | None = None
    # The model that read its pages (PageEngine.model; None for outputs older than the field):
    # the pages kept from unfinished outputs must be this run's model's.
    model: str | None = None
    # The formats written together with it ("md,txt"; None for outputs older than the field): a
    # txt file carries no record, so a stale one (of a run over an earlier version, written with
    # --format md,txt, the Markdown rewritten since with --format md alone) is told by this list.
    formats: str | None = None
    txt_sha256: str | None = None  # of the txt written with it: one rewritten since (a txt-only run) is no part of it

    def header(self) -> str:
        """`<!-- pantheon-ocr: {"source": ..., "sha256": ..., ...} -->`: JSON, with `>` escaped
        so that no file name can end the comment. "pages" only for a page selection, so that the
        outputs of whole documents stay as they were before the field."""
        fields = {"source": self.path, "sha256": self.sha256, "size": self.size, "mtime_ns": self.mtime_ns}
        fields = {k: v for k, v in fields.items() if v is not None} | ({} if self.page is None else {"page": self.page})
        fields |= {} if self.pages is None else {"pages": self.pages}
        fields |= {"failed": self.failed} if self.failed else {}
        fields |= {"model": self.model} if self.model else {}
        fields |= {"formats": self.formats} if self.formats else {}
        fields |= {"txt_sha256": self.txt_sha256} if self.txt_sha256 else {}
        return HEADER_PREFIX + json.dumps(fields, ensure_ascii=False).replace(">", "\\u003e") + " -->"

    def same_file(self, other: "Source | None") -> bool:
        return other is not None and same_input(other.path, self.path) and other.sha256 == self.sha256

    def unchanged(self, st: os.stat_result) -> bool:
        """Whether a file with this stat is still the one recorded, by size and mtime alone (as
        archive jobs decide it): then it need not be read and hashed again."""
        return self.size == st.st_size and self.mtime_ns == st.st_mtime_ns


def same_input(recorded: str, path: str) -> bool:
    """Whether an input path recorded in outputs names the file at `path`: the same path, or the
    same file reached by another spelling (`a/../a/x.pdf`, a linked folder), which must not be
    read and written a second time beside its outputs."""
    if recorded == path:
        return True
    try:
        return os.path.realpath(recorded) == os.path.realpath(path)
    except (OSError, ValueError):  # a name the system cannot take: only the same string is the same
        return False


_PAGE = r"[1-9]\d{0,8}"
_PAGE_LIST = re.compile(rf"{_PAGE}(-{_PAGE})?(,{_PAGE}(-{_PAGE})?)*")  # failed pages: closed ranges
_SELECTION = re.compile(rf"{_PAGE}(-({_PAGE})?)?(,{_PAGE}(-({_PAGE})?)?)*")  # page_selection's form: "5-" too


def failed_pages(pages) -> str | None:
    """Failed page numbers as outputs record them: "2-5,9"; None for none."""
    pages = sorted(set(pages))
    return page_selection(",".join(map(str, pages))) if pages else None


def _failed(value) -> str | None:
    """A recorded list of failed pages; None for none or for a value that is no list of pages."""
    return value if isinstance(value, str) and _PAGE_LIST.fullmatch(value) else None


def _formats(value) -> str | None:
    """Recorded formats ("md,txt"); None for none or for what is no list of formats."""
    return value if isinstance(value, str) and value and set(value.split(",")) <= set(FORMATS) else None


def _text(value) -> str | None:
    """A recorded text (a model's identity); None for none or for what is no text."""
    return value if isinstance(value, str) and value else None


def page_selection(spec: str | None) -> str | None:
    """A page spec (PipelineOptions.pages, already validated) in the one form outputs record it
    in: ranges sorted and merged, so that "3, 1-2" and "1-3" are the same selection; None for
    every page ("all", "1-" or no spec). The page count is not known here, so "1-3" is not every
    page of a 3-page document: outputs of `--pages 1-3` are transcribed again by a run over all
    pages (wasted work, never a missing page)."""
    if not spec or spec.strip().lower() == "all":
        return None
    merged: list[list] = []  # [first, last or None]
    for first, last in sorted(page_ranges(spec), key=lambda r: r[0]):
        prev = merged[-1] if merged else None
        if prev is not None and (prev[1] is None or first <= prev[1] + 1):
            prev[1] = None if prev[1] is None or last is None else max(prev[1], last)
        else:
            merged.append([first, last])
    if merged == [[1, None]]:
        return None
    return ",".join(f"{a}-" if b is None else str(a) if a == b else f"{a}-{b}" for a, b in merged)


def covers(earlier: str | None, wanted: str | None) -> bool:
    """Whether outputs made with the page selection `earlier` hold every page of `wanted` (both in
    page_selection's form: merged ranges, None for every page; a recorded selection that is no
    such thing holds nothing)."""
    if earlier is None:
        return True
    if wanted is None or not isinstance(earlier, str) or not _SELECTION.fullmatch(earlier):
        return False
    have = page_ranges(earlier)  # merged: a range of `wanted` inside their union is inside one of them
    return all(any(b <= a and (y is None or (z is not None and z <= y)) for b, y in have) for a, z in page_ranges(wanted))


def source_of(doc: Document, pages: str | None = None) -> Source:
    """The document's Source (reads the whole file once; OSError if it cannot be read), for
    outputs of the page selection `pages` (page_selection's form)."""
    sha256, st = sha256_of(doc.path)
    return Source(path_record(doc.path), sha256, size=st.st_size, mtime_ns=st.st_mtime_ns, pages=pages)


@dataclass(frozen=True)
class OutputPaths:
    base: Path  # <out>/<rel without suffix>; formats append ".<fmt>"
    candidates: tuple[Path, ...] = field(default=(), compare=False)  # other names this document may take
    # <out>, the output tree nothing is written outside of (outputs.py); None: found from the
    # document's relative name when written (output_root)
    root: Path | None = field(default=None, compare=False)

    def file(self, fmt: str) -> Path:
        return self.base.with_name(f"{self.base.name}.{fmt}")

    def page_file(self, page: int) -> Path:
        return self.base / f"page-{page:04d}.md"

    def documents(self, formats: Sequence[str]) -> list[Path]:
        return [self.file(f) for f in formats]

    def exist(self, formats: Sequence[str], page_files: bool = False) -> bool:
        """Whether its outputs in `formats` are there (and with `page_files`, its first page file)."""
        if not all(p.is_file() for p in self.documents(formats)):
            return False
        if not page_files:
            return True
        try:
            with os.scandir(self.base) as names:
                return any(PAGE_FILE.fullmatch(e.name) for e in names)
        except OSError:  # no folder of page files (or none that can be read)
            return False

    def recorded_source(self, formats: Sequence[str]) -> Source | None:
        """The Source recorded in the existing Markdown (its first line) or, without Markdown,
        the first JSONL record; None when neither is there or neither says (a file written by
        someone else or by an older version; txt files carry no record, so txt-only outputs are
        never taken as done: they are always written again)."""
        if "md" in formats and (self.file("md").exists() or "jsonl" not in formats):
            return self._record("md")
        return self._record("jsonl") if "jsonl" in formats else None

    def records_agree(self, formats: Sequence[str], recorded: Source) -> bool:
        """Whether, with both Markdown and JSONL in `formats`, the JSONL records the file, page
        selection, failed pages and model that `recorded` (recorded_source's: the Markdown's record,
        read once there) does: a JSONL left by a run over an earlier version, or by an unfinished
        run, beside a Markdown finished since with `--format md` is no finished output (it was kept
        for good, and the document skipped), nor a reading to keep pages from (claims.Claim.keeps).
        Without Markdown there is one record, and it agrees."""
        if "md" not in formats or "jsonl" not in formats:
            return True
        other = self._record("jsonl")
        return other is not None and (other.sha256, other.pages, other.failed, other.model) == \
            (recorded.sha256, recorded.pages, recorded.failed, recorded.model)

    def written_with(self, formats: Sequence[str], recorded: Source) -> bool:
        """Whether every one of `formats` was written with the outputs that record `recorded`,
        the txt the very one (its sha256 as they record it). Outputs older than the record are
        taken as they are."""
        if recorded.formats is None:
            return True
        if not set(formats) <= set(recorded.formats.split(",")):
            return False
        if "txt" not in formats or recorded.txt_sha256 is None:
            return True
        try:
            return sha256_of(self.file("txt"))[0] == recorded.txt_sha256
        except OSError:
            return False

    def _record(self, fmt: str) -> Source | None:
        try:
            if fmt == "md":
                with open_regular(self.file("md")) as f:
                    line = f.readline(65536).decode("utf-8", "replace").rstrip("\n")
                rec = header_record(line)
                if rec is not None:
                    return Source(rec["source"], rec["sha256"], rec.get("page"), rec.get("size"), rec.get("mtime_ns"),
                                  rec.get("pages"), _failed(rec.get("failed")), _text(rec.get("model")),
                                  _formats(rec.get("formats")), _text(rec.get("txt_sha256")))
            else:
                with open_regular(self.file("jsonl")) as f:
                    rec = json.loads(f.readline(1 << 24))
                return Source(rec["doc"], rec["doc_sha256"], None, rec.get("doc_size"), rec.get("doc_mtime_ns"),
                              rec.get("doc_pages"), _failed(rec.get("doc_failed")), _text(rec.get("model")),
                              _formats(rec.get("doc_formats")), _text(rec.get("doc_txt_sha256")))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None


def header_record(line: str) -> dict | None:
    """The record a Markdown output's first line holds (Source.header), or None if the line is no
    such header. ValueError if it is one whose JSON does not parse."""
    if line.startswith(HEADER_PREFIX) and line.endswith(" -->"):
        return json.loads(line[len(HEADER_PREFIX):-4])
    return None


def output_stem(doc: Document) -> PurePath:
    """The document's relative name without its suffix: where under the output folder its
    outputs go (just its file name when `rel` would leave the folder)."""
    rel = PurePath(doc.rel)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        rel = PurePath(doc.path.name)  # never write outside the output folder
    return rel.with_suffix("") if rel.suffix else rel


def output_root(base: Path, doc: Document | None) -> Path:
    """The output folder `base` was planned under: as many folders up as the document's
    relative name is deep (for OutputPaths made from a stored base, as archive jobs do)."""
    depth = len(output_stem(doc).parts) if doc is not None else 1
    return base.parents[min(depth, len(base.parents)) - 1]


def name_max(folder: str | os.PathLike) -> int:
    """The longest file name, in bytes, the file system of `folder` (or of the nearest folder
    above it that exists) takes."""
    at = Path(os.path.abspath(folder))
    while True:
        try:
            limit = os.pathconf(at, "PC_NAME_MAX")
            return limit if limit > 0 else DEFAULT_NAME_MAX
        except (FileNotFoundError, NotADirectoryError):
            if at.parent == at:
                return DEFAULT_NAME_MAX
            at = at.parent
        except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no such limit
            return DEFAULT_NAME_MAX


def _size(name: str) -> int:
    return len(os.fsencode(name))


def fit_name(name: str, limit: int) -> str:
    """`name` cut to at most `limit` bytes of file name, at a character boundary: a UTF-8
    character is kept whole or dropped, an undecodable byte (kept as a lone surrogate) is one."""
    if _size(name) <= limit:
        return name
    kept, used = [], 0
    for ch in name:
        n = 1 if "\udc80" <= ch <= "\udcff" else len(ch.encode("utf-8", "surrogatepass"))
        if used + n > limit:
            break
        kept.append(ch)
        used += n
    return "".join(kept)


def with_id(base: Path, doc_id: str, name_limit: int | None = None) -> Path:
    """`base` with `-<doc id[:8]>` appended, its name cut so that the result still fits
    (`name_limit`: the file system's, name_max, unless given)."""
    room = (name_max(base.parent) if name_limit is None else name_limit) - NAME_ROOM - ID_SUFFIX
    return base.with_name(f"{fit_name(base.name, max(0, room))}-{doc_id[:8]}")


def plan_output_paths(documents: Iterable[Document], out_dir: str | os.PathLike) -> dict[str, OutputPaths]:
    """doc_id -> OutputPaths for one run (see the module docstring for the rule). `base` is the
    name planned from the inputs alone; `candidates` are the names to try, in order, once the
    output folder has been looked at (`claims.claim_outputs`)."""
    out = Path(out_dir)
    name_limit = name_max(out)
    unique = {doc.doc_id: doc for doc in documents}
    first_of: dict[str, str] = {}  # casefolded stem -> doc_id of the document that keeps it
    stems: dict[str, PurePath] = {}
    for doc in sorted(unique.values(), key=lambda d: os.fsencode(d.path)):
        stem = stems[doc.doc_id] = output_stem(doc)
        if not PAGE_STEM.fullmatch(stem.name) and _size(stem.name) <= name_limit - NAME_ROOM:
            first_of.setdefault(str(stem).casefold(), doc.doc_id)
    plan: dict[str, OutputPaths] = {}
    for doc_id, stem in stems.items():
        suffixed = with_id(out / stem, doc_id, name_limit)
        if first_of.get(str(stem).casefold()) == doc_id:
            plan[doc_id] = OutputPaths(out / stem, (out / stem, suffixed), out)
        elif str(stem).casefold() in first_of:  # the shared name too, where its outputs are this document's
            plan[doc_id] = OutputPaths(suffixed, (out / stem, suffixed), out)
        else:
            plan[doc_id] = OutputPaths(suffixed, (suffixed,), out)
    return {doc_id: plan[doc_id] for doc_id in unique}
