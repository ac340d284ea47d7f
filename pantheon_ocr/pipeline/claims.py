"""Whose outputs a file already in the output folder holds, and which documents of a run are
done: the names naming.plan_output_paths planned are settled against the output folder, in the
same priority order, so that a document never takes another's outputs, a file of the user's
(a Markdown or JSONL that records no source) is never written over without --overwrite, and a
document whose outputs came from this very file, unchanged, is not read again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import path_record, path_text
from .inputs import Document
from .naming import RECORDING, OutputPaths, Source, covers, page_selection, same_input, source_of


def foreign_output(paths: OutputPaths, formats: Sequence[str]) -> Path | None:
    """A Markdown or JSONL at `paths` among `formats` that records no source: not an output of
    ours (every one records its source in its first line), a file of the user's, not to be written
    over. None where there is none (txt files record nothing, so they cannot be told apart). A
    symbolic link is no such file: a link where outputs go is refused (files.PlantedPath)."""
    for fmt in sorted(RECORDING & set(formats)):
        path = paths.file(fmt)
        if path.is_file() and not path.is_symlink() and paths.recorded_source((fmt,)) is None:
            return path
    return None


def foreign_note(foreign: Path, written_as: str) -> str:
    """What a run says of a file of the user's it left where a document's outputs would go."""
    return f"{path_text(foreign)} records no source, so it is no output of pantheon-ocr: left as it is, {written_as}"


def claim_outputs(planned: OutputPaths, formats: Sequence[str], source_path: str,
                  claimed: set[str], overwrite: bool = False) -> tuple[OutputPaths, Source | None]:
    """The document's output paths after looking at the output folder, and the Source its
    existing outputs there record (None: no outputs, or they record nothing). A candidate name
    is passed over when another document of this run claimed it (`claimed`: casefolded bases,
    updated here), when its existing output records another source, or (unless `overwrite`:
    the user's word) when a Markdown or JSONL there records none (foreign_output). Call in the
    order of plan_output_paths' priority (absolute paths sorted as bytes) so that names stay stable."""
    candidates = planned.candidates or (planned.base,)
    found = {}  # candidate -> the Source its outputs record (None: none there, or they record none)
    taken = set()  # candidates holding outputs of others, or files not ours
    for base in candidates:
        paths = OutputPaths(base, root=planned.root)
        found[base] = paths.recorded_source(formats) if any(p.exists() for p in paths.documents(formats)) else None
        if found[base] is not None or (not overwrite and foreign_output(paths, formats) is not None):
            taken.add(base)
    # A name whose outputs are this document's already keeps them, whichever candidate it is: not
    # made again elsewhere, no copy left behind (its shared name freed, say, it stays suffixed).
    for base in candidates:
        recorded = found[base]
        if str(base).casefold() not in claimed and recorded is not None and same_input(recorded.path, source_path):
            claimed.add(str(base).casefold())
            return OutputPaths(base, root=planned.root), recorded
    # Else the first free name by priority (outputs there are another document's now: kept, unless
    # it is the last name); names before the planned base are another document's by priority (a
    # shared name), never taken without this document's outputs.
    ours_only = candidates.index(planned.base) if planned.base in candidates else 0
    for base in candidates[ours_only:]:
        key = str(base).casefold()
        if key not in claimed and (base not in taken or base == candidates[-1]):
            claimed.add(key)
            return OutputPaths(base, root=planned.root), None
    claimed.add(str(candidates[-1]).casefold())
    return OutputPaths(candidates[-1], root=planned.root), None


@dataclass(frozen=True)
class Claim:
    paths: OutputPaths
    source: Source | None  # None when the input could not be read (`error` says why)
    done: bool  # its outputs exist, complete, from this very file and page selection: skip unless overwriting
    error: str | None = None
    failed_before: str | None = None  # pages its outputs of this very file record as failed: read again, the rest kept
    model_before: str | None = None  # the model its outputs record, with failed_before (Source.model)
    # with failed_before: the other pages can be kept, its outputs recording one reading (its JSONL,
    # where kept pages come from, not one a later run with --format md left behind: records_agree)
    keeps: bool = False
    note: str = ""  # a file of the user's where its outputs would go, left as it is (foreign_output)
    # its outputs are a finished reading of this very file, of another page selection that holds
    # every page this run selects: a stopped run keeps them (as it keeps a done document's under
    # --overwrite) rather than put a part of its own reading in their place. Outputs of fewer
    # pages give way to the new reading's checkpoints (a run over all pages after --pages 1-3
    # keeps what it read), and so do outputs read again for a missing txt or page files.
    finished: bool = False


def claim_all(documents: Sequence[Document], planned: dict[str, OutputPaths], formats: Sequence[str],
              pages: str | None = None, page_files: bool = False, overwrite: bool = False) -> dict[str, Claim]:
    """doc_id -> Claim for a run's documents: settles the names against the output folder, in
    the stable priority order, and decides which documents are done. Only outputs made with the
    page selection `pages` (PipelineOptions.pages; None: every page) can make a document done.
    A document whose outputs record its path, size and mtime is done without reading it; any
    other is hashed (the record its outputs will carry) and is done only if the recorded sha256
    matches. A document whose outputs record failed pages is never done: those pages are read again
    (pipeline/run.py keeps the others, readback.py). With `page_files` a document without them (a
    run without --page-files made its outputs) is not done either: it was skipped, and never got them."""
    wanted = page_selection(pages)
    claims: dict[str, Claim] = {}
    claimed: set[str] = set()
    for doc in sorted(documents, key=lambda d: os.fsencode(d.path)):
        paths, recorded = claim_outputs(planned[doc.doc_id], formats, path_record(doc.path), claimed, overwrite)
        mine = foreign_output(planned[doc.doc_id], formats) if paths.base != planned[doc.doc_id].base and not overwrite else None
        note = foreign_note(mine, f"the outputs written as {path_text(paths.file(formats[0]))}") if mine is not None else ""
        same_pages = recorded is not None and recorded.pages == wanted and not recorded.failed
        try:
            if same_pages and recorded.unchanged(os.stat(doc.path)) and _complete(paths, recorded, formats, page_files):
                claims[doc.doc_id] = Claim(paths, recorded, True, finished=True)
                continue
            source = source_of(doc, wanted)
        except OSError as e:
            claims[doc.doc_id] = Claim(paths, None, False, f"cannot read file: {e.strerror or e}")
            continue
        same = source.same_file(recorded)
        agree = same and paths.records_agree(formats, recorded)
        whole = agree and not recorded.failed and paths.exist(RECORDING & set(formats))
        done = same and same_pages and _complete(paths, recorded, formats, page_files)
        claims[doc.doc_id] = Claim(paths, source, done,
                                   failed_before=recorded.failed if same else None,
                                   model_before=recorded.model if same else None, keeps=agree, note=note,
                                   finished=whole and recorded.pages != wanted and covers(recorded.pages, wanted))
    return claims


def _complete(paths: OutputPaths, recorded: Source, formats: Sequence[str], page_files: bool) -> bool:
    """Whether the outputs at `paths` that record `recorded` are all there and one reading: every
    format asked for (with `page_files`, the page files), the JSONL's record the Markdown's, each
    written with them. With an unchanged file, or one hashed the same, and the page selection
    asked for, that is a done document."""
    return paths.exist(formats, page_files) and paths.records_agree(formats, recorded) \
        and paths.written_with(formats, recorded)
