"""Hostile inputs and a bad night for transcribe: special files, link loops, odd names, outputs
keyed to their source, all-or-nothing writes, the page timeout and the text-layer fallback."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PIL import Image

from fake_engine import SAMPLES, FakeEngine, expected_text, marked_pdf, md_body
from pantheon_ocr.errors import ExitCode, InputError
from pantheon_ocr.pipeline import outputs
from pantheon_ocr.pipeline.files import open_regular
from pantheon_ocr.pipeline.inputs import expand_inputs
from pantheon_ocr.pipeline.run import run_pipeline
from pantheon_ocr.pipeline.types import PipelineOptions

ROOT = Path(__file__).resolve().parents[2]
FF = os.fsdecode(b"\xff")  # a name byte that is not UTF-8


def write_pdf(path: Path, n_pages: int, doc_no: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(marked_pdf(n_pages, doc_no))
    return path


def opts(tmp_path: Path, **kw) -> PipelineOptions:
    kw.setdefault("render_workers", 1)
    kw.setdefault("text_fallback", False)
    return PipelineOptions(out_dir=tmp_path / "out", **kw)


def finishes(fn, timeout: float = 60.0):
    """fn() in a daemon thread: its result, or a failed test (never a hung one) if it blocks."""
    box: list = []

    def target():
        try:
            box.append((True, fn()))
        except Exception as e:  # noqa: BLE001 - handed to the test
            box.append((False, e))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not return within {timeout} s (blocked?)"
    ok, value = box[0]
    if not ok:
        raise value
    return value


def cli(*args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


# ------------------------------------------------------------------ special files and bad paths


@pytest.fixture
def hostile(tmp_path):
    """A folder of good documents among a FIFO, a link loop, a dangling link and a folder
    named like a PDF; plus the same kinds given on the command line."""
    d = tmp_path / "in"
    write_pdf(d / "a.pdf", 2, 1)
    write_pdf(d / "z.pdf", 1, 2)
    os.mkfifo(d / "stuck.pdf")
    os.symlink("loop.pdf", d / "loop.pdf")
    os.symlink("nowhere.pdf", d / "dangling.pdf")
    (d / "empty.pdf").mkdir()  # a folder named like a document, inside a folder: walked, empty
    (tmp_path / "dir.pdf").mkdir()
    os.mkfifo(tmp_path / "cmdline.pdf")
    os.symlink("self.pdf", tmp_path / "self.pdf")
    return tmp_path


def test_bad_paths_are_named_once_and_the_rest_runs(hostile):
    t = hostile
    items = [str(t / "in"), str(t / "missing.pdf"), str(t / "dir.pdf"), str(t / "cmdline.pdf"), str(t / "self.pdf"),
             str(t / "in" / "stuck.pdf")]
    problems: list[InputError] = []
    docs = finishes(lambda: expand_inputs(items, problems))
    assert [d.path.name for d in docs] == ["a.pdf", "z.pdf"]
    named = {Path(p.path).name: p.problem for p in problems}
    assert len(named) == len(problems) == 7  # stuck.pdf found twice, named once
    assert "FIFO" in named["stuck.pdf"] and "FIFO" in named["cmdline.pdf"]
    assert named["loop.pdf"] == named["self.pdf"] == "symbolic link loop"
    assert "broken symbolic link" in named["dangling.pdf"]
    assert named["missing.pdf"] == "no such file or folder"
    assert "folder contains no PDF" in named["dir.pdf"]
    with pytest.raises(InputError):  # without a problems list the first bad path still raises
        expand_inputs(items)
    summary = finishes(lambda: run_pipeline(docs, FakeEngine(), opts(t)))
    assert [d.status for d in summary.documents] == ["written", "written"]


def test_open_regular_never_blocks_on_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "p")
    with pytest.raises(OSError, match="FIFO"):
        finishes(lambda: open_regular(tmp_path / "p"))
    with pytest.raises(OSError, match="folder"):
        open_regular(tmp_path)


def test_transcribe_names_every_bad_path_and_exits_4_when_nothing_is_left(hostile):
    t = hostile
    code, err = cli("transcribe", t / "missing.pdf", t / "dir.pdf", t / "cmdline.pdf", t / "self.pdf",
                    "--model", ROOT / "samples" / "tiny-model", "-o", t / "out", "--no-progress", timeout=60)
    assert code == ExitCode.INPUT_UNREADABLE, err
    for name in ("missing.pdf", "dir.pdf", "cmdline.pdf", "self.pdf"):
        assert sum(name in line for line in err.splitlines()) == 1, err
    assert not (t / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway")
def test_unreadable_file_is_named(tmp_path):
    p = write_pdf(tmp_path / "secret.pdf", 1, 1)
    p.chmod(0)
    problems: list[InputError] = []
    assert expand_inputs([str(p)], problems) == [] and problems[0].problem == "permission denied"


# ------------------------------------------------------------------ names: bytes, lengths


def test_non_utf8_and_long_names_are_written_everywhere(tmp_path):
    src = tmp_path / "in"
    ff = write_pdf(src / f"{FF}scan.pdf", 2, 1)
    cjk = write_pdf(src / ("文" * 80 + ".pdf"), 1, 2)  # 240 bytes + .pdf: legal, its temp names too
    ascii_long = write_pdf(src / ("x" * 240 + ".pdf"), 1, 3)
    docs = expand_inputs([str(src)])
    summary = run_pipeline(docs, FakeEngine(), opts(tmp_path, formats=("md", "jsonl", "txt"), page_files=True))
    assert summary.exit_code == ExitCode.OK, summary.failed_pages
    out = tmp_path / "out"
    assert md_body(out / f"{FF}scan.md").startswith("<!-- page 1 -->")
    record = json.loads((out / f"{FF}scan.jsonl").read_bytes().decode("utf-8").splitlines()[0])
    assert record["doc"] == str(ff).replace(FF, "\\xff")  # the documented text form of the byte
    header = (out / f"{FF}scan.md").read_bytes().split(b"\n")[0].decode("utf-8")
    assert "\\\\xff" in header  # JSON in the header: the backslash escaped once more
    assert (out / f"{FF}scan" / "page-0002.md").is_file()
    assert md_body(out / ("文" * 80 + ".md")) == f"<!-- page 1 -->\n\n{expected_text(2, 1)}\n"
    assert (out / ("x" * 240 + ".jsonl")).is_file() and ascii_long.is_file() and cjk.is_file()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_control_characters_in_names_are_shown_escaped(tmp_path):
    """A name holding a newline, an escape sequence or a right-to-left override is read and
    written like any other, and every line a person reads shows it escaped: one record a line in
    a log, nothing a terminal acts on."""
    from pantheon_ocr.errors import path_record, path_text

    assert path_text("a\nb\tc\r.pdf") == "a\\nb\\tc\\r.pdf"
    assert path_text("\x1b[31mred\x7f\x85.pdf") == "\\x1b[31mred\\x7f\\x85.pdf"
    assert path_text("invoice\u202efdp.exe") == "invoice\\u202efdp.exe"
    assert path_text(os.fsencode(f"{FF}\n.pdf")) == "\\xff\\n.pdf"
    assert path_text("été 文.pdf") == "été 文.pdf"  # printable text as it is
    src = tmp_path / "in"
    odd = write_pdf(src / "two\nlines\x1b[2J.pdf", 1, 1)
    code, _, err = _cli("transcribe", odd, "--model", ROOT / "samples" / "tiny-model", "-o", tmp_path / "out",
                        "--no-progress", "--max-tokens", 2)
    assert code == ExitCode.OK, err
    assert "\x1b" not in err and "two\\nlines\\x1b[2J.pdf" in err
    assert [line for line in err.splitlines() if "two" in line and "lines" not in line] == []
    made = [p for p in (tmp_path / "out").iterdir() if p.suffix == ".md"]
    # recorded as it is (JSON escapes it), so that the next run knows the outputs as this file's
    assert len(made) == 1 and json.loads(made[0].read_text(encoding="utf-8").split(" -->")[0].split(": ", 1)[1])[
        "source"] == str(odd)
    code, _, err = _cli("transcribe", odd, "--model", ROOT / "samples" / "tiny-model", "-o", tmp_path / "out",
                        "--no-progress", "--max-tokens", 2)
    assert code == ExitCode.OK and "skipped" in err and len(list((tmp_path / "out").iterdir())) == 1
    # shown alike, recorded apart: a tab and a backslash-t are two names
    assert path_text("a\tb") == path_text("a\\tb") and path_record("a\tb") != path_record("a\\tb")


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def test_temp_names_fit_any_legal_output_name(tmp_path):
    target = tmp_path / ("y" * 252 + ".md")  # 255 bytes: the longest legal name
    outputs.atomic_write_text(target, "ok\n")
    assert target.read_text() == "ok\n" and [p.name for p in tmp_path.iterdir()] == [target.name]


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from pantheon_ocr.pipeline import outputs
from pantheon_ocr.pipeline.files import OutputTree
with OutputTree(Path(sys.argv[1])) as tree:
    place = outputs._Place(Path(sys.argv[1]) / "a.md", tree.folder(Path(sys.argv[1])))
    fd = place.folder.create(".pantheon-" + outputs.temp_tag("a.md") + "-killed00.tmp")
    place.folder.hold(fd)
    os.write(fd, b"half a docu")
    os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 mid-write
"""


@pytest.mark.skipif(sys.platform == "win32", reason="advisory locks (flock) are POSIX")
def test_a_killed_writers_temps_are_swept_a_live_writers_kept(tmp_path, monkeypatch):
    """kill -9 (or a power cut) in the middle of a write leaves a hidden temp; the next run that
    writes in that folder removes it, whatever document it was for. A temp a live writer holds
    (another transcribe into the same folder) is never touched, however old, nor are fresh ones
    and names not ours."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out)], cwd=ROOT, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed = out / f".pantheon-{outputs.temp_tag('a.md')}-killed00.tmp"
    assert killed.read_bytes() == b"half a docu"
    live = out / f".pantheon-{outputs.temp_tag('b.md')}-livewrit.tmp"
    fresh = out / f".pantheon-{outputs.temp_tag('c.md')}-justmade.tmp"
    theirs = out / ".pantheon-notours.tmp"
    for p in (live, fresh, theirs):
        p.write_bytes(b"x")
    old = killed.stat().st_mtime - 2 * outputs.STALE_TEMP_S
    for p in (killed, live, theirs):
        os.utime(p, (old, old))
    holder = os.open(live, os.O_RDONLY)  # another process writing b.md: its own open file, locked
    import fcntl

    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(outputs, "_swept", set())
    try:
        src = write_pdf(tmp_path / "in" / "z.pdf", 1, 1)
        summary = run_pipeline(expand_inputs([str(src)]), FakeEngine(), opts(tmp_path))
    finally:
        os.close(holder)
    assert summary.exit_code == ExitCode.OK
    assert not killed.exists()
    assert live.exists() and fresh.exists() and theirs.exists() and (out / "z.md").is_file()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the temp by its descriptor in /proc")
def test_a_writer_holds_its_temp_while_it_writes(tmp_path, monkeypatch):
    """What tells a live writer's temp from a killed one's: the lock _write_temp takes, held while
    the bytes go to disk (seen from another open of the same file, as another process sees it)."""
    import fcntl

    held = []
    real = os.fsync

    def fsync(fd):
        other = os.open(os.readlink(f"/proc/self/fd/{fd}"), os.O_RDONLY)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(other)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    outputs.atomic_write_text(tmp_path / "a.md", "text\n")
    assert held[:1] == [True] and (tmp_path / "a.md").read_text() == "text\n"


# ------------------------------------------------------------------ outputs keyed to their source


def test_output_names_do_not_depend_on_input_order(tmp_path):
    a = write_pdf(tmp_path / "a" / "x.pdf", 1, 1)
    b = write_pdf(tmp_path / "b" / "x.pdf", 1, 2)
    first = run_pipeline(expand_inputs([str(a), str(b)]), FakeEngine(), opts(tmp_path))
    second = run_pipeline(expand_inputs([str(b), str(a)]), FakeEngine(), opts(tmp_path))
    names = {d.doc.path: d.outputs[0].name for d in first.documents}
    assert names[a] == "x.md" and names[b].startswith("x-")
    assert [d.status for d in second.documents] == ["skipped", "skipped"]
    assert {d.doc.path: d.outputs[0].name for d in second.documents} == names
    assert md_body(tmp_path / "out" / names[a]) == f"<!-- page 1 -->\n\n{expected_text(1, 1)}\n"
    assert md_body(tmp_path / "out" / names[b]) == f"<!-- page 1 -->\n\n{expected_text(2, 1)}\n"


def test_skip_existing_checks_the_source(tmp_path):
    a = write_pdf(tmp_path / "a" / "x.pdf", 1, 1)
    b = write_pdf(tmp_path / "b" / "x.pdf", 1, 2)
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path))
    # another file of the same name: a's transcript is neither taken for it nor overwritten
    other = run_pipeline(expand_inputs([str(b)]), FakeEngine(), opts(tmp_path))
    (d,) = other.documents
    assert d.status == "written" and d.outputs[0].name == f"x-{d.doc.doc_id[:8]}.md"
    assert md_body(tmp_path / "out" / "x.md") == f"<!-- page 1 -->\n\n{expected_text(1, 1)}\n"
    # the same file, changed: done again in place; unchanged: skipped
    write_pdf(a, 2, 1)
    again = run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path))
    assert again.documents[0].status == "written" and again.documents[0].outputs[0].name == "x.md"
    assert run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path)).documents[0].status == "skipped"


def test_an_unchanged_file_is_skipped_without_reading_it(tmp_path, monkeypatch):
    from pantheon_ocr.pipeline import naming

    a = write_pdf(tmp_path / "a.pdf", 1, 1)
    run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path))
    monkeypatch.setattr(naming, "sha256_of", lambda path: pytest.fail(f"{path} was hashed again"))
    assert run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path)).documents[0].status == "skipped"
    os.utime(a, ns=(0, 0))  # touched: now it is read, found the same, and still skipped
    monkeypatch.undo()
    assert run_pipeline(expand_inputs([str(a)]), FakeEngine(), opts(tmp_path)).documents[0].status == "skipped"


def test_page_files_never_collide_with_a_document(tmp_path):
    a = write_pdf(tmp_path / "in" / "a.pdf", 2, 1)
    page_doc = write_pdf(tmp_path / "in" / "a" / "page-0001.pdf", 1, 2)  # its output would be a's page file
    summary = run_pipeline(expand_inputs([str(tmp_path / "in")]), FakeEngine(), opts(tmp_path, page_files=True))
    assert summary.exit_code == ExitCode.OK and a.is_file()
    out = tmp_path / "out"
    assert md_body(out / "a" / "page-0001.md") == f"<!-- page 1 -->\n\n{expected_text(1, 1)}\n"  # a.pdf's page 1
    (d,) = [d for d in summary.documents if d.doc.path == page_doc]
    own = d.outputs[-1]  # the primary format, written last
    assert own == out / "a" / f"page-0001-{d.doc.doc_id[:8]}.md"
    assert md_body(own) == f"<!-- page 1 -->\n\n{expected_text(2, 1)}\n"
    # without page files the rule is the same, so a later run with them cannot meet it either
    plain = run_pipeline(expand_inputs([str(page_doc)]), FakeEngine(), opts(tmp_path / "plain"))
    assert plain.documents[0].outputs[-1].name == own.name


# ------------------------------------------------------------------ all or nothing, exit 73


@pytest.mark.parametrize("when", ["temp", "rename"])
def test_outputs_are_all_written_or_none(tmp_path, monkeypatch, when):
    a = write_pdf(tmp_path / "in" / "a.pdf", 2, 1)
    b = write_pdf(tmp_path / "in" / "b.pdf", 1, 2)
    calls = {"n": 0}
    real_temp, real_replace = outputs._write_temp, os.replace

    def full_disk(*args):
        calls["n"] += 1
        if calls["n"] == 3:  # a.pdf: its second page file or its third output
            raise OSError(errno.ENOSPC, "No space left on device")
        return (real_temp if when == "temp" else real_replace)(*args)

    monkeypatch.setattr(outputs, "_write_temp" if when == "temp" else "os", full_disk if when == "temp" else
                        type("os", (), {"replace": staticmethod(full_disk), "unlink": os.unlink, "fsync": os.fsync,
                                        "open": os.open, "close": os.close, "O_RDONLY": os.O_RDONLY,
                                        "fdopen": os.fdopen, "chmod": os.chmod, "fsencode": os.fsencode}))
    summary = run_pipeline(expand_inputs([str(a), str(b)]), FakeEngine(),
                           opts(tmp_path, formats=("md", "jsonl", "txt"), page_files=True))
    assert [d.status for d in summary.documents] == ["unwritten", "written"]
    assert summary.exit_code == ExitCode.CANNOT_WRITE
    assert "No space left on device" in summary.failed_pages[-1].reason
    out = tmp_path / "out"
    assert not (out / "a.md").exists()  # the primary is never there without the rest
    if when == "temp":
        assert not (out / "a.jsonl").exists() and not (out / "a" / "page-0001.md").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    monkeypatch.undo()
    redo = run_pipeline(expand_inputs([str(a), str(b)]), FakeEngine(), opts(tmp_path, formats=("md", "jsonl", "txt")))
    assert [d.status for d in redo.documents] == ["written", "skipped"]


# ------------------------------------------------------------------ page timeout, text layer


def test_page_timeout_fails_the_page_and_the_batch_goes_on(tmp_path):
    a = write_pdf(tmp_path / "a.pdf", 3, 1)
    # page 2 would need 100 decode steps of 50 ms; a limit of 1 s stops it after about 20
    engine = FakeEngine(n_tokens=lambda f: 100 if f.page == 2 else 3, step_sleep=0.05)
    summary = run_pipeline(expand_inputs([str(a)]), engine, opts(tmp_path, page_timeout=1.0, batch_size=3))
    (failure,) = summary.failed_pages
    assert failure.page == 2 and failure.reason.startswith("timeout: the page took longer than 1 s")
    assert summary.documents[0].status == "partial" and summary.exit_code == ExitCode.PAGES_FAILED
    slow_vision = FakeEngine(fail_vision=lambda f: False, vision_sleep=0.0)
    slow_vision.vision = _slow_on_page(slow_vision.vision, page=1, seconds=1.5)
    summary = run_pipeline(expand_inputs([str(a)]), slow_vision, opts(tmp_path, page_timeout=1.0, overwrite=True))
    assert [(f.page, f.reason.split(":")[0]) for f in summary.failed_pages] == [(1, "timeout")]
    # the reason names the stages the page went through, not a prefill and decode of "0.0 s"
    assert re.search(r"\(vision 1\.\d s\)$", summary.failed_pages[0].reason), summary.failed_pages[0].reason
    assert re.search(r"\(vision [\d.]+ s, prefill [\d.]+ s, decode [\d.]+ s\)$", failure.reason), failure.reason


def _slow_on_page(vision, page: int, seconds: float):
    import time

    from fake_engine import read_marks

    def slow(image):
        if read_marks(image)[1] == page:
            time.sleep(seconds)
        return vision(image)

    return slow


def test_text_layer_fallback(tmp_path):
    a = write_pdf(tmp_path / "a.pdf", 3, 1)  # a text layer: "Document 1, page N of 3"
    scan = tmp_path / "scanned.pdf"
    scan.write_bytes((SAMPLES / "docs" / "scanned.pdf").read_bytes())  # no text layer
    engine = FakeEngine(fail_vision=lambda f: f.page == 2 or f.doc != 1)
    summary = run_pipeline(expand_inputs([str(a), str(scan)]), engine,
                           opts(tmp_path, text_fallback=True, formats=("md", "jsonl")))
    assert summary.exit_code == ExitCode.PAGES_FAILED  # the OCR still failed: said so
    reasons = {(Path(f.path).name, f.page): f.reason for f in summary.failed_pages}
    assert reasons[("a.pdf", 2)].endswith("(the PDF's text layer stands in)")
    assert not reasons[("scanned.pdf", 1)].endswith("stands in)")
    md = md_body(tmp_path / "out" / "a.md")
    assert "<!-- page 2 text-layer: vision stage failed: RuntimeError: fake vision failure on doc 1 page 2 -->\n\n" \
           "Document 1, page 2 of 3\n" in md
    records = [json.loads(x) for x in (tmp_path / "out" / "a.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["model", "text-layer", "model"]
    assert records[1]["text"] == "Document 1, page 2 of 3" and records[1]["error"].startswith("vision stage failed")
    assert [d.status for d in summary.documents] == ["partial", "failed"]


# ------------------------------------------------------------------ smaller items


def test_orphaned_render_workers_print_no_traceback_after_kill_9(tmp_path):
    script = (
        "import sys, threading\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from fake_engine import SlowRender, marked_pdf\n"
        "from pantheon_ocr.pipeline.inputs import make_document\n"
        "from pantheon_ocr.pipeline.render_pool import RenderPool\n"
        f"open({str(tmp_path / 'a.pdf')!r}, 'wb').write(marked_pdf(4, 1))\n"
        f"doc = make_document({str(tmp_path / 'a.pdf')!r})\n"
        "pool = RenderPool(workers=2)\n"
        "for o in pool.imap(SlowRender(1.0), [(doc, i) for i in range(4)], threading.Event()):\n"
        "    print('page', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "page\n"  # workers are busy with the next pages now
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)  # EOF once the orphaned workers are gone too
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_jpeg_whose_header_lies_about_its_size_fails_its_page(tmp_path):
    import io
    import struct

    buf = io.BytesIO()
    Image.new("RGB", (300, 200), "white").save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, 14000, 12000)  # height, width
    (tmp_path / "liar.jpg").write_bytes(bytes(data))
    summary = run_pipeline(expand_inputs([str(tmp_path / "liar.jpg")]), FakeEngine(), opts(tmp_path))
    (failure,) = summary.failed_pages
    assert "says 12000x14000 px but the file is too short" in failure.reason
    assert summary.documents[0].status == "failed"


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_temperature_must_be_finite(tmp_path, value):
    write_pdf(tmp_path / "a.pdf", 1, 1)
    code, err = cli("transcribe", tmp_path / "a.pdf", "--temperature", value, "--model", ROOT / "samples" / "tiny-model",
                    "-o", tmp_path / "out", "--no-progress")
    assert code == ExitCode.BAD_ARGUMENTS and "temperature" in err, err


def test_a_page_an_engine_error_failed_logs_its_traceback(tmp_path, caplog):
    """Its reason names the exception; the traceback, most often a bug's, goes to the debug log
    that `-v` shows (it was nowhere)."""
    import logging

    a = write_pdf(tmp_path / "a.pdf", 2, 1)
    with caplog.at_level(logging.DEBUG, logger="pantheon_ocr"):
        summary = run_pipeline(expand_inputs([str(a)]), FakeEngine(fail_vision=lambda f: f.page == 2), opts(tmp_path))
    assert [f.reason for f in summary.failed_pages] == ["vision stage failed: RuntimeError: fake vision failure on doc 1 page 2"]
    (record,) = [r for r in caplog.records if r.name == "pantheon_ocr.pipeline"]
    assert record.getMessage() == f"page 2 of {a}: vision stage failed" and record.exc_info[0] is RuntimeError


def test_verbose_cli_shows_the_debug_log(capfd):
    import logging

    from pantheon_ocr import cli

    root = logging.getLogger("pantheon_ocr")
    level, handlers = root.level, list(root.handlers)
    try:
        assert cli.main(["-v", "--help"]) == 0
        logging.getLogger("pantheon_ocr.pipeline").debug("seen under -v")
        assert "debug: seen under -v" in capfd.readouterr().err
        cli.main(["-v", "--help"])  # again: still one handler
        assert sum(isinstance(h, cli._Stderr) for h in root.handlers) == 1
    finally:  # the rest of the tests without it
        root.handlers[:] = handlers
        root.setLevel(level)
