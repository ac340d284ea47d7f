"""Whose outputs an output name holds. Jobs (and `transcribe`) may share an output folder, and
every output records its source in its first line (pipeline/naming.py: Source), so a job takes
a name only where no other source's outputs are, notices when another source's outputs took
the place of its own, and removes only outputs that record its own document."""

from __future__ import annotations

from pathlib import Path

from ..pipeline.figures import images_dir, remove_stale
from ..pipeline.files import OutputTree
from ..pipeline.claims import claim_outputs
from ..pipeline.naming import OutputPaths, with_id
from ..pipeline.outputs import remove_old_page_files
from ..pipeline.types import FORMATS

_RECORDING = ("md", "jsonl")  # the formats whose files record their source (txt records none)


def recorded_path(base: Path) -> str | None:
    """The source path the outputs at `base` record (Markdown first, else JSONL); None when
    there are none, or they record nothing (foreign files, txt only)."""
    paths = OutputPaths(base)
    for fmt in _RECORDING:
        source = paths.recorded_source((fmt,))
        if source is not None:
            return source.path
    return None


def held_by_another(base: Path, source_path: str) -> str | None:
    """The other source whose outputs are at `base` now, or None (none there, ours, unknown)."""
    found = recorded_path(base)
    return found if found is not None and found != source_path else None


def own_name(planned: OutputPaths, source_path: str, doc_id: str, taken: set[str]) -> Path:
    """A document's output base: the first of its planned names that no document of the job has
    (`taken`: casefolded bases, updated here) and whose existing outputs record no other source;
    else its last name (the one with its id) with its id once more."""
    last = (planned.candidates or (planned.base,))[-1]
    last_taken = str(last).casefold() in taken
    base = claim_outputs(planned, FORMATS, source_path, taken)[0].base
    if base == last and (last_taken or held_by_another(base, source_path)):
        base = with_id(base, doc_id)
        taken.add(str(base).casefold())
    return base


def remove_own_outputs(paths: OutputPaths, source_path: str) -> list[Path]:
    """Remove the outputs at `paths` (every format, per-page files, crops) if they record
    `source_path`; returns the document files removed. Outputs of another source, or that
    record none, are left alone (not ours to remove)."""
    if recorded_path(paths.base) != source_path:
        return []
    removed = []
    with OutputTree(paths.root) as tree:
        folder = tree.folder(paths.base.parent, create=False)
        for path in paths.documents(FORMATS):
            if folder is not None and path.is_file() and folder.unlink(path.name):
                removed.append(path)
        remove_stale(tree.folder(images_dir(paths.base), create=False), [])
    remove_old_page_files(paths, set())
    return removed
