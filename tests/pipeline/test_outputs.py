"""outputs.py and naming.py: atomic writes, naming, Markdown / JSONL / text formats."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePath

import pytest

from pantheon_ocr.pipeline import outputs
from pantheon_ocr.pipeline.naming import plan_output_paths
from pantheon_ocr.pipeline.outputs import (
    atomic_write_bytes,
    atomic_write_text,
    render_jsonl,
    render_markdown,
    render_txt,
    write_document,
)
from pantheon_ocr.pipeline.types import PageResult
from pantheon_ocr.pipeline.inputs import Document, make_document


def doc(tmp_path: Path, rel: str) -> Document:
    path = tmp_path / "in" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return make_document(path, rel)


def result(d: Document, page: int, text: str = "", error: str | None = None, finish: str | None = "eos") -> PageResult:
    secs = {"render": 0.01, "vision": 0.5, "prefill": 0.25, "decode": 1.5}
    if error is not None:
        return PageResult(d, page, "", 0, None, error, secs)
    return PageResult(d, page, text, len(text.split()), finish, None, secs)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "out.md"
    atomic_write_text(target, "first\n")
    atomic_write_text(target, "zweite Fassung\n")
    assert target.read_text(encoding="utf-8") == "zweite Fassung\n"
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["b.bin", "out.md", "sub"]
    assert stat.S_IMODE(target.stat().st_mode) & 0o044  # readable like an ordinary file, not 0600


def test_failed_write_keeps_old_file_and_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "out.md"
    atomic_write_text(target, "old\n")

    def boom(src, dst):
        raise KeyboardInterrupt  # Ctrl-C at the worst moment

    monkeypatch.setattr(outputs.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]


def test_output_naming_mirrors_folders_and_avoids_collisions(tmp_path):
    docs = [
        doc(tmp_path, "report.pdf"),
        doc(tmp_path, "a/report.pdf"),
        doc(tmp_path, "b/report.pdf"),
        doc(tmp_path, "scan.pdf"),
        doc(tmp_path, "scan.png"),
        doc(tmp_path, "Scan.tif"),
        doc(tmp_path, "v1.2.final.pdf"),
    ]
    other = tmp_path / "zzz" / "report.pdf"
    other.parent.mkdir()
    other.touch()
    same_name = make_document(other)  # named directly: rel is just "report.pdf"
    plan = plan_output_paths(docs + [same_name], tmp_path / "out")
    # a collision goes to the document whose absolute path sorts first (as bytes), whatever the order
    assert plan[same_name.doc_id].file("md") == tmp_path / "out" / f"report-{same_name.doc_id[:8]}.md"
    rel = {d.rel: plan[d.doc_id].file("md").relative_to(tmp_path / "out") for d in docs}
    assert rel[PurePath("report.pdf")] == Path("report.md")
    assert rel[PurePath("a/report.pdf")] == Path("a/report.md")
    assert rel[PurePath("Scan.tif")] == Path("Scan.md")  # b"S" < b"s"
    assert rel[PurePath("scan.pdf")] == Path(f"scan-{docs[3].doc_id[:8]}.md")  # case-insensitive disks
    assert rel[PurePath("scan.png")] == Path(f"scan-{docs[4].doc_id[:8]}.md")
    assert rel[PurePath("v1.2.final.pdf")] == Path("v1.2.final.md")
    assert len({p.base for p in plan.values()}) == len(plan)
    # the same documents always get the same names
    assert plan_output_paths(docs, tmp_path / "out") == {k: v for k, v in plan.items() if k != same_name.doc_id}
    assert plan[docs[1].doc_id].page_file(3) == tmp_path / "out" / "a" / "report" / "page-0003.md"


def test_naming_never_leaves_the_output_folder(tmp_path):
    d = make_document(tmp_path / "x.pdf", "../../etc/x.pdf")
    assert plan_output_paths([d], tmp_path / "out")[d.doc_id].file("md") == tmp_path / "out" / "x.md"


def test_markdown_pages_in_order_with_markers(tmp_path):
    d = doc(tmp_path, "r.pdf")
    results = [
        result(d, 3, "Third page.\n"),
        result(d, 1, "# Title\n\nFirst page."),
        result(d, 2, error="the render worker crashed (killed by SIGSEGV) --> oops"),
        result(d, 4, "half a page", finish="max_tokens"),
    ]
    assert render_markdown(results) == (
        "<!-- page 1 -->\n\n# Title\n\nFirst page.\n\n"
        "<!-- page 2 failed: the render worker crashed (killed by SIGSEGV) - -> oops -->\n\n"
        "<!-- page 3 -->\n\nThird page.\n\n"
        "<!-- page 4 stopped: max_tokens -->\n\nhalf a page\n"
    )


def test_a_page_line_that_reads_like_a_marker_stays_that_page_s_text(tmp_path):
    """A page whose own text has a line `<!-- page 2 -->` (a text layer, a model's output) must
    not cut the Markdown into a false page 2: the line is escaped (shown as written), and the
    rebuild of an archive job's state reads every page's text back exactly."""
    from pantheon_ocr.pipeline.readback import KeptPage, from_markdown

    d = doc(tmp_path, "r.pdf")
    first = "<!-- page 2 -->\nFAKE SECOND PAGE\n\\<!-- page 3 -->\nnot <!-- page 4 --> at a line start"
    results = [result(d, 1, first), result(d, 2, "The genuine second page.")]
    md = render_markdown(results)
    assert md == ("<!-- page 1 -->\n\n\\<!-- page 2 -->\nFAKE SECOND PAGE\n\\\\<!-- page 3 -->\n"
                  "not <!-- page 4 --> at a line start\n\n<!-- page 2 -->\n\nThe genuine second page.\n")
    assert from_markdown("<!-- pantheon-ocr: {} -->\n\n" + md) == {
        1: KeptPage(first, 0, "eos"), 2: KeptPage("The genuine second page.", 0, "eos")}


def test_txt_uses_form_feeds(tmp_path):
    d = doc(tmp_path, "r.pdf")
    txt = render_txt([result(d, 2, "two"), result(d, 1, "one\n"), result(d, 3, error="bad page")])
    assert txt == "one\n\ftwo\n\f[page 3 failed: bad page]\n"


def test_jsonl_records(tmp_path):
    d = doc(tmp_path, "r.pdf")
    lines = render_jsonl([result(d, 2, error="vision stage failed: boom"), result(d, 1, "héllo wörld")]).splitlines()
    first, second = map(json.loads, lines)
    assert first == {
        "doc": str(d.path),
        "doc_sha256": None,
        "doc_size": None,
        "doc_mtime_ns": None,
        "doc_id": d.doc_id,
        "page": 1,
        "text": "héllo wörld",
        "source": "model",
        "n_tokens": 2,
        "finish_reason": "eos",
        "error": None,
        "seconds": {"render": 0.01, "vision": 0.5, "prefill": 0.25, "decode": 1.5},
    }
    assert second["page"] == 2 and second["error"] == "vision stage failed: boom" and second["finish_reason"] is None
    assert "héllo" in lines[0]  # UTF-8, not \\u escapes


def test_write_document_all_formats_primary_last(tmp_path, monkeypatch):
    d = doc(tmp_path, "sub/r.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    order = []
    real = os.replace
    monkeypatch.setattr(outputs.os, "replace", lambda a, b: (order.append(Path(b).name), real(a, b)))
    written = write_document(paths, [result(d, 2, "b"), result(d, 1, "a")], ("md", "jsonl", "txt"), page_files=True)
    assert order == ["page-0001.md", "page-0002.md", "r.jsonl", "r.txt", "r.md"]
    assert [p.name for p in written] == order
    assert (tmp_path / "out/sub/r/page-0002.md").read_text() == "<!-- page 2 -->\n\nb\n"
    assert (tmp_path / "out/sub/r.md").read_text() == "<!-- page 1 -->\n\na\n\n<!-- page 2 -->\n\nb\n"
    assert paths.exist(("md", "jsonl", "txt"))
    os.unlink(paths.file("txt"))
    assert not paths.exist(("md", "jsonl", "txt")) and paths.exist(("md",))


def test_a_kill_between_the_renames_of_a_rewrite_leaves_no_primary(tmp_path, monkeypatch):
    """Rewriting a whole set (--overwrite, a changed input): killed after the JSONL's rename, the
    old Markdown must not stay beside the new JSONL, passing for a whole set that skip-existing
    would keep for good."""
    d = doc(tmp_path, "r.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    write_document(paths, [result(d, 1, "old")], ("md", "jsonl"))
    assert paths.exist(("md", "jsonl"))
    real, renamed = os.replace, []

    def killed_after_one(a, b):
        if renamed:
            raise KeyboardInterrupt  # a kill: nothing after this rename happens
        renamed.append(b)
        real(a, b)

    monkeypatch.setattr(outputs.os, "replace", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        write_document(paths, [result(d, 1, "new")], ("md", "jsonl"))
    assert [Path(b).name for b in renamed] == ["r.jsonl"] and "new" in paths.file("jsonl").read_text()
    assert not paths.file("md").exists() and not paths.exist(("md", "jsonl"))  # incomplete: written again next run
    monkeypatch.setattr(outputs.os, "replace", real)
    write_document(paths, [result(d, 1, "new")], ("md", "jsonl"))
    assert paths.exist(("md", "jsonl")) and "new" in paths.file("md").read_text()


def test_a_set_whose_old_primary_cannot_go_is_not_written_at_all(tmp_path):
    """All or none: where the old Markdown cannot be removed (a folder in its place, an immutable
    file), the new JSONL was put in place anyway and the document reported unwritten; a later
    `--format jsonl` run then skipped it as done, with the new version's JSONL beside the old
    version's Markdown. Nothing is replaced now, and the error names the Markdown."""
    d = doc(tmp_path, "r.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    write_document(paths, [result(d, 1, "old")], ("md", "jsonl"))
    old_jsonl = paths.file("jsonl").read_bytes()
    paths.file("md").unlink()
    (paths.file("md") / "kept").mkdir(parents=True)  # a folder where the Markdown goes
    with pytest.raises(OSError) as failed:
        write_document(paths, [result(d, 1, "new")], ("md", "jsonl"))
    assert outputs.write_problem(failed.value).startswith(f"cannot write the output {paths.file('md')}: ")  # EISDIR, EPERM, ...
    assert paths.file("jsonl").read_bytes() == old_jsonl
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.jsonl", "r.md"]  # no temp left


def test_page_files_of_an_earlier_version_go_with_the_new_set(tmp_path):
    """3 pages written with --page-files, then the file becomes 1 page (or --pages 1): pages 2 and 3
    of the old version must not stay beside the new set, a glob over page-*.md mixing the two."""
    d = doc(tmp_path, "r.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    write_document(paths, [result(d, p, f"old {p}") for p in (1, 2, 3)], ("md",), page_files=True)
    assert sorted(p.name for p in (tmp_path / "out" / "r").iterdir()) == ["page-0001.md", "page-0002.md", "page-0003.md"]
    write_document(paths, [result(d, 1, "new 1")], ("md",), page_files=True)
    assert sorted(p.name for p in (tmp_path / "out" / "r").iterdir()) == ["page-0001.md"]
    assert "new 1" in (tmp_path / "out" / "r" / "page-0001.md").read_text()


def test_control_characters_never_reach_the_markdown_or_the_text_file(tmp_path):
    """A text layer (or a model) may hold ESC, BEL, NUL, form feeds: in a file for people, and in a
    terminal with -o -, they recolour, ring or move the cursor. Tab and newline stay; JSONL keeps
    the text as it came (JSON escapes it)."""
    d = doc(tmp_path, "r.pdf")
    raw = "red \x1b[31mtext\x1b[0m\x07 and\ttab\r\nline two\x00\x0cthree\x85"
    md, txt = render_markdown([result(d, 1, raw)]), render_txt([result(d, 1, raw), result(d, 2, "next")])
    assert "red [31mtext[0m and\ttab\nline twothree" in md
    assert not any(c in md + txt.replace("\f", "") for c in "\x1b\x07\x00\r\x85")
    assert txt.count("\f") == 1  # the page break, and no other
    assert json.loads(render_jsonl([result(d, 1, raw)]).split("\n")[0])["text"] == raw


def test_a_full_disk_names_the_output_it_was_writing(tmp_path, monkeypatch):
    """ENOSPC from a write names no file: the failure said 'cannot write the output: No space left
    on device' with nothing to go on. The output being written is named."""
    import errno

    from pantheon_ocr.pipeline import outputs

    def full(place, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "_write_temp", full)
    with pytest.raises(OSError) as e:
        outputs.atomic_write_bytes(tmp_path / "a.md", b"x")
    assert outputs.write_problem(e.value) == f"cannot write the output {tmp_path / 'a.md'}: No space left on device"
