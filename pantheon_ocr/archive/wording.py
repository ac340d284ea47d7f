"""Counts in words for the run line, `archive status` and the reports: documents and pages apart,
each with its right plural."""

from __future__ import annotations

PLANNED = ("new", "changed", "unchanged", "skipped (unreadable)")  # what the plan found, one per document
# what came of a document none of whose pages the job's `pages` selects: failed, as transcribe
# fails it, yet counted as done work for the exit code (1, not 4), as transcribe counts it
NO_SELECTED_PAGE = "failed (no selected page)"


def count(n: int, word: str, plural: str | None = None) -> str:
    """`1 page`, `3 pages`, `1 document`, `2 input paths`."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def count_by(parts: dict[str, int], word: str) -> str:
    """`3 documents (1 new, 2 unchanged)`: the total, then each part in the dict's order."""
    return count(sum(parts.values()), word) + (" (" + ", ".join(f"{n:,} {k}" for k, n in parts.items()) + ")"
                                               if parts else "")


def documents_line(events: dict) -> str:
    """`3 documents (1 new, 2 unchanged); 1 written`: the documents the run saw, by what the plan
    found, then what came out of it (a document is counted once in each part)."""
    seen = {k: n for k, n in events.items() if k in PLANNED}
    out = {k: n for k, n in events.items() if k not in PLANNED}
    if not seen and not out:
        return "no documents"
    text = count_by(seen, "document")
    return text + ("; " + ", ".join(f"{n:,} {k}" for k, n in out.items()) if out else "")


def failures_heading(failures: list[dict]) -> str:
    """`2 pages and 1 document failed`: page failures and whole-document failures apart."""
    pages = sum(f["page"] is not None for f in failures)
    docs = len(failures) - pages
    return " and ".join(([count(pages, "page")] if pages else []) + ([count(docs, "document")] if docs else [])) + " failed"
