"""Nothing is written or deleted outside its place in the output tree: a symbolic link (or a
file) planted where the tree has a folder of its own (a mirrored sub-folder, a document's
page-file folder, its crops folder) or where a file goes fails that document with one reason
naming the link, the rest of the batch is written, and the link's target is left as it was.
Also through an archive job, for its state file and its reports, and on the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import EngineFactory, FakeEngine, marked_pdf
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.errors import ExitCode, JobError, WriteError
from pantheon_ocr.pipeline import outputs
from pantheon_ocr.pipeline.figures import Figure
from pantheon_ocr.pipeline.files import PlantedPath
from pantheon_ocr.pipeline.inputs import expand_inputs, make_document
from pantheon_ocr.pipeline.naming import OutputPaths, plan_output_paths
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PageResult, PipelineOptions

from ..archive.harness import write_job

ROOT = Path(__file__).resolve().parents[2]


def write_pdf(path: Path, n_pages: int = 1, doc_no: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(marked_pdf(n_pages, doc_no))
    return path


def elsewhere(tmp_path: Path, *names: str) -> Path:
    """A folder outside the output tree, holding `names` (each "precious")."""
    folder = tmp_path / "elsewhere"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text("precious\n")
    return folder


def untouched(folder: Path, *names: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(names), list(folder.iterdir())
    assert all((folder / n).read_text() == "precious\n" for n in names)


def transcribe(tmp_path: Path, **kw):
    opts = PipelineOptions(out_dir=tmp_path / "out", render_workers=1, text_fallback=False, **kw)
    return run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(), opts)


def failure_of(summary, name: str) -> str:
    (reason,) = [f.reason for f in summary.failed_pages if Path(f.path).name == name]
    return reason


# ------------------------------------------------------------------ transcribe


def test_a_linked_sub_folder_fails_its_documents_and_the_batch_goes_on(tmp_path):
    write_pdf(tmp_path / "in" / "sub" / "a.pdf", 2, 1)
    write_pdf(tmp_path / "in" / "b.pdf", 1, 2)
    target = elsewhere(tmp_path)
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "sub")
    summary = transcribe(tmp_path, formats=("md", "jsonl"))
    assert {d.doc.path.name: d.status for d in summary.documents} == {"a.pdf": "unwritten", "b.pdf": "written"}
    assert summary.exit_code == ExitCode.CANNOT_WRITE
    assert failure_of(summary, "a.pdf") == (f"cannot write the output: {tmp_path}/out/sub is a symbolic link (to {target}): "
                                            "refusing to write through it")
    untouched(target)
    assert (tmp_path / "out" / "b.md").is_file()


def test_a_file_in_place_of_a_sub_folder(tmp_path):
    write_pdf(tmp_path / "in" / "sub" / "deeper" / "a.pdf")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").write_text("not a folder\n")
    summary = transcribe(tmp_path)
    assert summary.documents[0].status == "unwritten"
    assert failure_of(summary, "a.pdf").endswith("out/sub is a file, not a folder: refusing to write there")


def test_a_linked_page_file_folder(tmp_path):
    write_pdf(tmp_path / "in" / "a.pdf", 2, 1)
    target = elsewhere(tmp_path, "page-0001.md", "page-0009.md")
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "a")
    summary = transcribe(tmp_path, page_files=True)
    assert summary.documents[0].status == "unwritten" and "out/a is a symbolic link" in failure_of(summary, "a.pdf")
    assert summary.pages_done == 0  # said before its pages were read
    untouched(target, "page-0001.md", "page-0009.md")
    assert list((tmp_path / "out").iterdir()) == [tmp_path / "out" / "a"]  # no temp, no primary
    # nor are stale page files removed through it (archive jobs remove them after a write)
    paths = plan_output_paths(expand_inputs([str(tmp_path / "in")]), tmp_path / "out")
    with pytest.raises(PlantedPath, match="out/a is a symbolic link"):
        outputs.remove_old_page_files(next(iter(paths.values())), {1})
    untouched(target, "page-0001.md", "page-0009.md")


def test_a_link_in_place_of_an_output_file(tmp_path):
    write_pdf(tmp_path / "in" / "a.pdf")
    target = elsewhere(tmp_path, "x.md")
    (tmp_path / "out").mkdir()
    os.symlink(target / "x.md", tmp_path / "out" / "a.md")
    summary = transcribe(tmp_path, formats=("jsonl", "md"))
    assert "out/a.md is a symbolic link" in failure_of(summary, "a.pdf")
    untouched(target, "x.md")
    assert not (tmp_path / "out" / "a.jsonl").exists()  # all or none
    # refused before its pages were read, not after reading them all
    assert summary.documents[0].status == "unwritten" and summary.pages_done == 0
    assert summary.exit_code == ExitCode.CANNOT_WRITE


def test_a_link_where_no_output_of_this_run_goes_is_no_obstacle(tmp_path):
    """A link where page files would go, in a run without --page-files, is left alone."""
    write_pdf(tmp_path / "in" / "a.pdf")
    target = elsewhere(tmp_path, "page-0001.md")
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "a")
    summary = transcribe(tmp_path)
    assert summary.documents[0].status == "written" and (tmp_path / "out" / "a.md").is_file()
    untouched(target, "page-0001.md")


def test_a_finished_document_whose_outputs_are_links_is_skipped(tmp_path):
    """Outputs the user moved elsewhere and linked back (another disk, git-annex): a document
    done is skipped, as before; the check before reading is for documents about to be written."""
    write_pdf(tmp_path / "in" / "a.pdf")
    assert transcribe(tmp_path).documents[0].status == "written"
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    os.replace(tmp_path / "out" / "a.md", moved / "a.md")
    os.symlink(moved / "a.md", tmp_path / "out" / "a.md")
    summary = transcribe(tmp_path)
    assert summary.documents[0].status == "skipped" and summary.exit_code == ExitCode.OK


def test_a_linked_output_root_is_the_users_choice(tmp_path):
    """The folder named with -o may itself be a link (to a bigger disk, say): written through."""
    write_pdf(tmp_path / "in" / "sub" / "a.pdf")
    disk = tmp_path / "disk"
    disk.mkdir()
    os.symlink(disk, tmp_path / "out")
    assert transcribe(tmp_path).documents[0].status == "written"
    assert (disk / "sub" / "a.md").is_file()


# ------------------------------------------------------------------ crops (write_document itself)


def results_with_crop(tmp_path: Path, crop: bool = True) -> tuple[OutputPaths, list[PageResult]]:
    d = make_document(write_pdf(tmp_path / "in" / "doc.pdf"), "doc.pdf")
    paths = plan_output_paths([d], tmp_path / "out")[d.doc_id]
    text = "![image](image_1.png)0,0,500,500"
    figure = Figure(1, "image_1.png", (0, 0, 500, 500), (0, len(text)), "doc_images/p1_1.png", b"\x89PNG fake")
    return paths, [PageResult(d, 1, text, 3, "eos", None, {}, (figure,) if crop else ())]


@pytest.mark.parametrize("crop", [True, False])
def test_a_linked_crops_folder(tmp_path, crop):
    paths, results = results_with_crop(tmp_path, crop)
    target = elsewhere(tmp_path, "p1_1.png", "p2_1.png")  # stale crops of an earlier run, it would seem
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "doc_images")
    with pytest.raises(PlantedPath) as e:
        outputs.write_document(paths, results, ("md",))
    assert isinstance(e.value, OSError) and isinstance(e.value, WriteError) and e.value.exit_code == ExitCode.CANNOT_WRITE
    assert str(e.value) == e.value.strerror == (f"{tmp_path}/out/doc_images is a symbolic link (to {target}): refusing to "
                                                "write or delete through it")
    untouched(target, "p1_1.png", "p2_1.png")
    assert not (tmp_path / "out" / "doc.md").exists()


def test_stale_crops_are_removed_in_a_real_folder(tmp_path):
    paths, results = results_with_crop(tmp_path)
    (tmp_path / "out" / "doc_images").mkdir(parents=True)
    (tmp_path / "out" / "doc_images" / "p7_1.png").write_bytes(b"old")
    outputs.write_document(paths, results, ("md",))
    assert sorted(p.name for p in (tmp_path / "out" / "doc_images").iterdir()) == ["p1_1.png"]


def test_a_folder_swapped_for_a_link_before_the_rename(tmp_path, monkeypatch):
    """The folders are checked again just before the renames: a swap after the temps were
    written is refused too, and the temps are removed."""
    write_pdf(tmp_path / "in" / "sub" / "a.pdf")
    target = elsewhere(tmp_path)
    real = outputs._write_temp

    def swap(place, data):
        tmp = real(place, data)
        sub = tmp_path / "out" / "sub"
        os.rename(sub, tmp_path / "moved")
        os.symlink(target, sub)
        return tmp

    monkeypatch.setattr(outputs, "_write_temp", swap)
    summary = transcribe(tmp_path)
    assert "out/sub is a symbolic link" in failure_of(summary, "a.pdf")
    untouched(target)
    assert list((tmp_path / "moved").iterdir()) == []  # the temp file removed from where it was made


# ------------------------------------------------------------------ archive jobs


def test_archive_job_refuses_a_linked_sub_folder_and_retries_next_night(tmp_path):
    write_pdf(tmp_path / "in" / "sub" / "a.pdf", 2, 1)
    write_pdf(tmp_path / "in" / "b.pdf", 1, 2)
    job = write_job(tmp_path, ocr={"page_files": True})
    target = elsewhere(tmp_path, "page-0001.md")
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "sub")
    result = run_job(load_job(job), EngineFactory())
    assert result.exit_code == ExitCode.CANNOT_WRITE
    (failure,) = result.summary["failures"]
    assert failure["path"].endswith("sub/a.pdf") and "out/sub is a symbolic link (to " in failure["reason"]
    untouched(target, "page-0001.md")
    assert (tmp_path / "out" / "b.md").is_file()
    os.unlink(tmp_path / "out" / "sub")  # the link removed: the next run writes from the state
    again = run_job(load_job(job), EngineFactory())
    assert again.exit_code == ExitCode.OK and again.summary["pages"]["attempted"] == 0
    assert (tmp_path / "out" / "sub" / "a.md").is_file() and (tmp_path / "out" / "sub" / "a" / "page-0002.md").is_file()


def test_archive_state_file_that_is_a_link_is_refused(tmp_path):
    write_pdf(tmp_path / "in" / "a.pdf")
    job = write_job(tmp_path, {"state": "state.db"})
    other = elsewhere(tmp_path, "other.db")
    os.symlink(other / "other.db", tmp_path / "state.db")
    with pytest.raises(JobError, match=r"state\.db is a symbolic link \(to .*other\.db\): refusing to open the job state"):
        run_job(load_job(job), EngineFactory())
    untouched(other, "other.db")


def test_archive_report_in_place_of_a_link_is_refused_not_written_through(tmp_path):
    write_pdf(tmp_path / "in" / "a.pdf")
    job = write_job(tmp_path, {"reports": "reports"})
    (tmp_path / "reports").mkdir()
    target = elsewhere(tmp_path, "page.html")
    os.symlink(target / "page.html", tmp_path / "reports" / "latest.html")
    said: list[str] = []
    result = run_job(load_job(job), EngineFactory(), log=said.append)
    # the outputs are written; the night's report is not: 73, as for any file that cannot be written
    assert result.exit_code == ExitCode.CANNOT_WRITE and (tmp_path / "out" / "a.md").is_file()
    assert any("reports/latest.html is a symbolic link" in line for line in said), said
    untouched(target, "page.html")


# ------------------------------------------------------------------ the command line


def test_transcribe_names_the_link_and_exits_73(tmp_path):
    write_pdf(tmp_path / "in" / "sub" / "a.pdf")
    write_pdf(tmp_path / "in" / "b.pdf", 1, 2)
    target = elsewhere(tmp_path)
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "sub")
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(tmp_path / "in"), "--model",
                           str(ROOT / "samples" / "tiny-model"), "-o", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == ExitCode.CANNOT_WRITE and "Traceback" not in proc.stderr, proc.stderr
    assert "out/sub is a symbolic link (to " in proc.stderr and "refusing to write through it" in proc.stderr
    untouched(target)
    assert (tmp_path / "out" / "b.md").is_file()
