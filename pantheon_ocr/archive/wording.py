"""Counts in words for the run line, `archive status` and the reports: documents and pages apart,
each with its right plural."""

from __future__ import annotations

# what the plan found, one per document; "opened again": its open failed last run, not for its
# own fault (a read the system failed), so it is not skipped as unreadable
PLANNED = ("new", "changed", "opened again", "unchanged", "skipped (unreadable)")
OPENED_AGAIN = "opened again"
# what came of a document none of whose pages the job's `pages` selects: failed, as transcribe
# fails it, yet counted as done work for the exit code (1, not 4), as transcribe counts it
NO_SELECTED_PAGE = "failed (no selected page)"
UNREADABLE = "failed (unreadable)"  # a document that could not be opened or read: no pages
# an input path that is no document at all (missing, a FIFO, a link loop): said apart from them
UNREADABLE_PATH = "unreadable input path"


def count(n: int, word: str, plural: str | None = None) -> str:
    """`1 page`, `3 pages`, `1 document`, `2 input paths`."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def count_by(parts: dict[str, int], word: str) -> str:
    """`3 documents (1 new, 2 unchanged)`: the total, then each part in the dict's order."""
    return count(sum(parts.values()), word) + (" (" + ", ".join(f"{n:,} {k}" for k, n in parts.items()) + ")"
                                               if parts else "")


def documents_line(events: dict) -> str:
    """`3 documents (1 new, 2 unchanged), 1 unreadable input path; 1 written`: the documents the
    run saw, by what the plan found, the input paths that were no readable document, then what
    came out of it (a document is counted once in each part)."""
    seen = {k: n for k, n in events.items() if k in PLANNED}
    paths = events.get(UNREADABLE_PATH, 0)
    out = {k: n for k, n in events.items() if k not in PLANNED and k != UNREADABLE_PATH}
    if not seen and not out and not paths:
        return "no documents"
    text = count_by(seen, "document") + (f", {count(paths, UNREADABLE_PATH)}" if paths else "")
    return text + ("; " + ", ".join(f"{n:,} {k}" for k, n in out.items()) if out else "")


def failures_heading(failures: list[dict]) -> str:
    """`2 pages, 1 document and 1 input path failed`: page failures, whole-document failures and
    input paths that are no document (`input_path` in the record) apart."""
    pages = sum(f["page"] is not None for f in failures)
    paths = sum(bool(f.get("input_path")) for f in failures)
    parts = [count(n, word) for n, word in ((pages, "page"), (len(failures) - pages - paths, "document"),
                                            (paths, "input path")) if n]
    if not parts:
        return "nothing failed"
    return (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]) + " failed"
