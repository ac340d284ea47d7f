"""What a new user meets first, end to end: the Python API, `-o -`, a page range a document does
not have, SIGTERM, the text-layer choice on the command line, `archive report`."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pantheon_ocr
from fake_engine import make_samples_module
from pantheon_ocr.errors import ExitCode, UsageError

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "samples" / "docs"
MODEL = ROOT / "samples" / "tiny-model"


def cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


def text_pdf(path: Path, n_pages: int = 2) -> Path:
    ms = make_samples_module()
    pages = []
    for i in range(1, n_pages + 1):
        c = ms.Canvas()
        for k, line in enumerate(("A page of real text for the text layer,", "long enough to be a page of text",
                                  f"and not a stray label: page {i}.")):
            c.text(72, 700 - 20 * k, line, size=12)
        pages.append(c)
    path.write_bytes(ms.build_pdf(pages))
    return path


# -------------------------------------------------------------------------- the Python API


@pytest.fixture(scope="module")
def reader():
    return pantheon_ocr.Reader(MODEL, max_tokens=6, text_layer="ocr", render_workers=1)


def test_read_gives_each_page_in_order(reader):
    pages = list(reader.read(DOCS / "report-3pages.pdf"))
    assert [p.page for p in pages] == [1, 2, 3] and all(p.ok and p.source == "model" for p in pages)
    assert all(p.tokens <= 6 and p.finish_reason in ("eos", "max_tokens", "repetition") for p in pages)
    assert all(set(p.seconds) >= {"render", "vision", "prefill", "decode"} for p in pages)
    assert {p.document for p in pages} == {str(DOCS / "report-3pages.pdf")}


def test_read_many_files_images_and_bad_paths(reader, tmp_path):
    img = np.full((120, 300, 3), 255, np.uint8)
    pages = list(reader.read_many([DOCS / "text-1page.pdf", img, Image.fromarray(img), tmp_path / "missing.pdf"]))
    by_doc = {p.document: p for p in pages}
    assert str(DOCS / "text-1page.pdf") in by_doc and by_doc[str(DOCS / "text-1page.pdf")].ok
    assert [p.document for p in pages if p.document.startswith("image ")] == ["image 2", "image 3"]  # not a temp path
    bad = by_doc[str(tmp_path / "missing.pdf")]
    assert not bad.ok and bad.page == 0 and "no such file" in bad.error
    # a document that needs a setting names it as the API takes it
    (locked,) = reader.read(DOCS.parent / "bad" / "encrypted.pdf")
    assert locked.page == 0 and locked.error == "the PDF is encrypted: a password is needed (password=)"


def test_one_path_string_is_one_document_not_its_characters(reader, tmp_path):
    """read_many / transcribe given a single path (a str, not a list) read that one document: as an
    iterable, "a/b.pdf" would be its characters, "/" among them (the whole file system)."""
    one = str(DOCS / "text-1page.pdf")
    assert [(p.document, p.page, p.ok) for p in reader.read_many(one)] == [(one, 1, True)]
    summary = reader.transcribe(one, tmp_path / "out")
    assert [d.status for d in summary.documents] == ["written"] and summary.unreadable == ()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["text-1page.md"]


def test_unreadable_in_memory_images_are_their_own_failures(reader):
    good = np.full((60, 200, 3), 255, np.uint8)
    import io

    png = io.BytesIO()
    Image.fromarray(good).save(png, format="PNG")
    bad = [b"garbage", b"", png.getvalue()[:80], np.zeros((0, 0), np.uint8), np.zeros((40, 80), np.float32),
           np.zeros((2, 3, 4, 5), np.uint8)]
    pages = list(reader.read_many([*bad, good]))
    failed = [p for p in pages if not p.ok]
    assert [p.document for p in failed] == [f"image {i}" for i in range(1, 7)] and all(p.page == 0 for p in failed)
    assert "not a readable image (7 bytes)" in failed[0].error and failed[1].error == "no bytes"
    assert failed[2].error.startswith("not a readable image (80 bytes): ")  # a truncated PNG
    assert all("must be uint8" in p.error for p in failed[3:])
    assert [p.ok for p in pages if p.ok] == [True]  # the good image after them was read
    with pytest.raises(pantheon_ocr.api.UsageError, match="cannot read a int"):
        list(reader.read_many([42]))


def test_pdf_bytes_and_bytes_paths_are_documents(reader, tmp_path):
    data = (DOCS / "report-3pages.pdf").read_bytes()
    assert [(p.document, p.page, p.ok) for p in reader.read(data)] == [("document 1", n, True) for n in (1, 2, 3)]
    path = bytes(DOCS / "text-1page.pdf")  # as os.listdir(b"...") and os.fsencode give paths
    assert [(p.document, p.ok) for p in reader.read(path)] == [(str(DOCS / "text-1page.pdf"), True)]
    (bad,) = reader.read(b"garbage")
    assert bad.error == "not a readable image (7 bytes): unknown or damaged format"  # no BytesIO repr
    (gone,) = reader.read(b"/no/such/scan.pdf")  # a path as bytes, to a file that is not there
    assert gone.error == ("not a readable image (17 bytes): unknown or damaged format, nor the name of a file that "
                          "exists (/no/such/scan.pdf)")
    summary = reader.transcribe([path], bytes(tmp_path / "out"))
    assert [d.status for d in summary.documents] == ["written"] and (tmp_path / "out" / "text-1page.md").is_file()


def test_wide_and_float_images_are_scaled_not_clipped(tmp_path):
    """A 16/32-bit or float image given in memory reads as the same data in a file does: scaled to
    8 bits (PIL's convert("RGB") clipped 32-bit values above 255 to white: a blank page)."""
    from pantheon_ocr.api import _as_path

    grey = np.full((200, 400), 60000, np.int32)
    grey[80:120, 50:350] = 10000  # the "ink": well above 255, far below the paper
    for img in (Image.fromarray(grey, "I"), Image.fromarray((grey / 65535).astype(np.float32), "F")):
        stored = np.asarray(Image.open(_as_path(img, tmp_path, 0)).convert("L"))
        assert stored[100, 200] < 64 and stored[10, 10] > 200, img.mode


def test_runs_are_checked_like_the_reader(reader, tmp_path):
    with pytest.raises(pantheon_ocr.api.UsageError, match="unknown run option bogus"):
        reader.transcribe([DOCS / "text-1page.pdf"], tmp_path / "out", bogus=1)
    with pytest.raises(pantheon_ocr.api.UsageError, match=r"takes paths \(got a ndarray\); read\(\) and read_many"):
        reader.transcribe([np.full((60, 200, 3), 255, np.uint8)], tmp_path / "out")
    with pytest.raises(pantheon_ocr.api.UsageError, match=r"takes paths \(got the bytes of a file\)"):
        reader.transcribe([(DOCS / "text-1page.pdf").read_bytes()], tmp_path / "out")
    with pytest.raises(pantheon_ocr.api.UsageError, match=r"max_tokens: must be an integer >= 1 \(got '8'\)"):
        pantheon_ocr.Reader(MODEL, max_tokens="8")
    assert not (tmp_path / "out").exists()  # refused before the folder was made


def test_a_closed_reader_says_so():
    closed = pantheon_ocr.Reader(MODEL, max_tokens=2, render_workers=1)
    closed.close()
    with pytest.raises(pantheon_ocr.api.UsageError, match="this Reader is closed"):
        list(closed.read(DOCS / "text-1page.pdf"))
    with pytest.raises(pantheon_ocr.api.UsageError, match="this Reader is closed"):
        closed.transcribe([DOCS / "text-1page.pdf"], "never-made")
    assert not Path("never-made").exists()


def test_an_output_folder_that_cannot_be_written_stops_before_any_page(reader, tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(pantheon_ocr.errors.WriteError, match="afile/sub: cannot make the output folder"):
        reader.transcribe([DOCS / "text-1page.pdf"], tmp_path / "afile" / "sub")
    r = cli("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path / "afile" / "sub")
    assert r.returncode == 73  # said before the model loaded: the one line, no engine line before it
    assert r.stderr == f"error: {tmp_path / 'afile' / 'sub'}: cannot make the output folder: Not a directory\n"


def test_stopping_early_stops_the_run(reader):
    t0 = time.perf_counter()
    for page in reader.read(DOCS / "report-3pages.pdf"):
        break
    assert page.page == 1 and time.perf_counter() - t0 < 60


def test_a_readers_page_selection_holds_for_every_read(tmp_path):
    """Reader(pages="2") was honoured by transcribe() and ignored by read() and read_many(): every
    page was read. A read's own `pages` still wins."""
    two = pantheon_ocr.Reader(MODEL, max_tokens=2, text_layer="ocr", render_workers=1, pages="2")
    assert [p.page for p in two.read(DOCS / "report-3pages.pdf")] == [2]
    assert [p.page for p in two.read_many([DOCS / "report-3pages.pdf"])] == [2]
    assert [p.page for p in two.read(DOCS / "report-3pages.pdf", pages="1,3")] == [1, 3]
    pages = list(two.read(DOCS / "report-3pages.pdf"))
    assert len(set(pages)) == 1  # a Page hashes (its seconds are left out)
    summary = two.transcribe([DOCS / "report-3pages.pdf"], tmp_path, formats="md,jsonl")  # the command line's form
    assert isinstance(summary, pantheon_ocr.RunSummary) and (tmp_path / "report-3pages.jsonl").is_file()


def test_the_errors_a_caller_catches_are_the_packages():
    with pytest.raises(pantheon_ocr.PantheonError, match=r"unknown option format \(did you mean formats\?\)"):
        pantheon_ocr.Reader(MODEL, format="jsonl")
    assert issubclass(pantheon_ocr.ModelError, pantheon_ocr.PantheonError)
    assert pantheon_ocr.Reader(MODEL, formats="md,jsonl", max_tokens=2)._pipeline_kw["formats"] == ("md", "jsonl")


def test_options_are_the_tables_and_are_checked():
    with pytest.raises(pantheon_ocr.api.UsageError, match="unknown option batchsize"):
        pantheon_ocr.Reader(MODEL, batchsize=4)
    with pytest.raises(pantheon_ocr.api.UsageError, match="batch_size"):
        pantheon_ocr.Reader(MODEL, batch_size=0)


def test_transcribe_writes_what_the_cli_writes(reader, tmp_path):
    summary = reader.transcribe([DOCS / "text-1page.pdf"], tmp_path)
    assert summary.exit_code == 0 and (tmp_path / "text-1page.md").is_file()


# ------------------------------------------------------------------------- the command line


def test_stdout_gets_the_text_and_no_temp_path(tmp_path):
    proc = cli("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", "-", "--max-tokens", "4", "--no-progress")
    assert proc.returncode == 0 and proc.stdout.startswith("<!-- page 1")
    assert "pantheon-ocr-" not in proc.stderr and "->" not in proc.stderr  # the scratch folder is nobody's business


def test_stdout_with_several_documents_names_each(tmp_path):
    """Several documents on one stream: each starts with its source record, in input order."""
    docs = [DOCS / "text-1page.pdf", DOCS / "scanned.pdf"]
    proc = cli("transcribe", *docs, "--model", MODEL, "-o", "-", "--max-tokens", "4", "--no-progress")
    heads = [line for line in proc.stdout.splitlines() if line.startswith("<!-- pantheon-ocr: ")]
    assert proc.returncode == 0 and proc.stdout.startswith("<!-- pantheon-ocr: ")
    assert [json.loads(h[len("<!-- pantheon-ocr: "):-4])["source"] for h in heads] == [str(d) for d in docs]


def test_read_gives_a_failed_page_its_text_layer_as_transcribe_writes_it(tmp_path):
    """A page that failed takes the PDF's text layer (the default --text-layer fallback): transcribe
    wrote it so, but read() gave the failed page with no text, as the failure came before the
    fallback (found by a probe)."""
    src = text_pdf(tmp_path / "t.pdf")
    failing = pantheon_ocr.Reader(MODEL, max_tokens=6, render_workers=1, page_timeout=1e-6)
    pages = list(failing.read(src))
    assert [p.source for p in pages] == ["text-layer", "text-layer"] and all(p.error for p in pages)
    assert "page 2." in pages[1].text
    failing.transcribe([src], tmp_path / "out", formats=("jsonl",))
    written = [json.loads(x) for x in (tmp_path / "out" / "t.jsonl").read_text().splitlines()]
    assert [r["text"] for r in written] == [p.text for p in pages]


def test_a_page_range_the_document_does_not_have_fails(tmp_path):
    proc = cli("transcribe", DOCS / "text-1page.pdf", "--pages", "5", "--model", MODEL, "-o", tmp_path, "--no-progress")
    assert proc.returncode == 1, proc.stderr
    assert "none of the selected pages (5) exists: the document has 1 page" in proc.stderr
    assert "1 document failed:" in proc.stderr and not list(tmp_path.glob("*.md"))


def test_text_layer_prefer_on_the_command_line(tmp_path):
    src = text_pdf(tmp_path / "t.pdf")
    proc = cli("transcribe", src, "--text-layer", "prefer", "--model", MODEL, "-o", tmp_path / "out", "--format", "jsonl",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (tmp_path / "out" / "t.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["text-layer", "text-layer"] and "page 2." in records[1]["text"]
    old = cli("transcribe", src, "--no-text-fallback", "--model", MODEL, "-o", tmp_path / "o2", "--format", "jsonl",
              "--no-progress", "--max-tokens", "2")  # the old spelling still works: never the text layer
    assert old.returncode == 0 and '"source": "model"' in (tmp_path / "o2" / "t.jsonl").read_text()


_API_CTRL_C = """
import os, signal, sys, threading
import pantheon_ocr
from pantheon_ocr.pipeline.types import RunInterrupted
reader = pantheon_ocr.Reader(sys.argv[1], max_tokens=200, render_workers=1, batch_size=1)
threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    reader.transcribe([sys.argv[2]], sys.argv[3])
except RunInterrupted as e:
    print("stopped", e.summary.interrupted, isinstance(e, KeyboardInterrupt))
    sys.exit(0)
print("carried on")
"""


def test_ctrl_c_in_the_apis_transcribe_reaches_the_caller(tmp_path):
    """A script's Ctrl-C stops it: transcribe raises RunInterrupted (a KeyboardInterrupt holding
    the summary) once the finished documents are written, never returns as if all went well."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        (src / f"d{i}.pdf").write_bytes((DOCS / "report-3pages.pdf").read_bytes())
    proc = subprocess.run([sys.executable, "-c", _API_CTRL_C, str(MODEL), str(src), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout == "stopped True True\n", proc.stdout + proc.stderr


def test_empty_paths_are_refused_not_read_as_the_current_folder(reader, tmp_path, monkeypatch):
    """An unset "$IN" or "$OUT" is an empty string, and Path("") is ".": never the current folder."""
    (tmp_path / "here.pdf").write_bytes((DOCS / "text-1page.pdf").read_bytes())
    monkeypatch.chdir(tmp_path)
    proc = cli("transcribe", "", "-o", tmp_path / "out", "--model", MODEL, "--no-progress")
    assert proc.returncode == ExitCode.INPUT_UNREADABLE and "'': an empty path (an unset shell variable?)" in proc.stderr
    proc = cli("transcribe", DOCS / "text-1page.pdf", "-o", "", "--model", MODEL, "--no-progress")
    assert proc.returncode == 2 and "error: -o/--output: an empty path" in proc.stderr
    assert not (ROOT / "text-1page.md").exists() and not (tmp_path / "out").exists()
    assert [p.page for p in reader.read("")] == [0]
    with pytest.raises(UsageError, match="out_dir: an empty path"):
        reader.transcribe([str(DOCS / "text-1page.pdf")], "")
    with pytest.raises(UsageError, match="model: an empty path"):
        pantheon_ocr.Reader("")
    with pytest.raises(UsageError, match="model: must be a path or a model's name, not int"):
        pantheon_ocr.Reader(5)
    import pickle

    with pytest.raises(TypeError, match="a Reader holds a loaded model and cannot be pickled"):
        pickle.dumps(reader)
    assert pantheon_ocr.Reader(os.fsencode(MODEL), max_tokens=2).engine is not None  # a path as bytes


def test_sigterm_stops_transcribe_with_130_and_writes_nothing_half(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        (src / f"d{i}.pdf").write_bytes((DOCS / "report-3pages.pdf").read_bytes())
    proc = subprocess.Popen([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(src), "--model", str(MODEL),
                             "-o", str(tmp_path / "out"), "--max-tokens", "200", "--no-progress", "--batch-size", "1"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    for md in (tmp_path / "out").glob("*.md"):  # what was written is whole
        assert md.read_text().count("<!-- page ") == 3


def test_archive_report_writes_a_runs_report_again(tmp_path):
    (tmp_path / "in").mkdir()
    text_pdf(tmp_path / "in" / "a.pdf")
    job = tmp_path / "job.toml"
    job.write_text(f'inputs = ["in"]\noutput = "out"\n[model]\ntext = "{MODEL}"\n[ocr]\nmax_tokens = 3\n')
    assert cli("archive", "run", job, "--no-progress").returncode == 0
    html = tmp_path / "job-reports" / "run-0001.html"
    html.unlink()
    proc = cli("archive", "report", job)
    assert proc.returncode == 0 and html.is_file() and "wrote" in proc.stdout
    status = cli("archive", "status", job).stdout
    assert "documents: 1 document (1 done)" in status and "pages: 2 pages (2 done)" in status, status
    missing = cli("archive", "report", job, "--run", "9")
    assert missing.returncode == 2 and "no run 9" in missing.stderr
    assert "report" in cli("archive", "--help").stdout


def test_a_script_without_the_main_guard_is_told_what_to_add(tmp_path):
    """Without `if __name__ == "__main__":` each render worker imports the script and starts a run
    of its own; the error ended 'Is the main module importable by worker processes?', which points
    away from the fix. It is the library's error (a ResourceError: a caller catching PantheonError
    catches it), not a bare RuntimeError."""
    script = tmp_path / "noguard.py"
    script.write_text(f"import pantheon_ocr\nr = pantheon_ocr.Reader({str(MODEL)!r}, max_tokens=2)\n"
                      f"print([p.page for p in r.read({str(DOCS / 'text-1page.pdf')!r})])\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.splitlines()[-1]
    assert 'must do it under `if __name__ == "__main__":`' in last and last.startswith("pantheon_ocr.errors.ResourceError"), \
        proc.stderr[-2000:]


def test_read_warns_of_selected_pages_past_a_documents_end(reader):
    """read(pages="2-5") of a 3-page document gave pages 2 and 3 and said nothing of 4 and 5,
    which `transcribe` notes beside the document: now a DocumentNote warning says it."""
    with pytest.warns(pantheon_ocr.DocumentNote, match=r"report-3pages\.pdf: selected pages 4-5 past its end: "
                                                        r"it has 3 pages") as caught:
        pages = list(reader.read(DOCS / "report-3pages.pdf", pages="2-5"))
    assert [p.page for p in pages] == [2, 3] and all(p.ok for p in pages)
    assert caught[0].message.note == "selected pages 4-5 past its end: it has 3 pages"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a selection the document has: no warning
        assert [p.page for p in reader.read(DOCS / "report-3pages.pdf", pages="1-3")] == [1, 2, 3]
    # none of the selection there: the failed Page says it; a warning would say it twice
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (page,) = reader.read(DOCS / "text-1page.pdf", pages="5")
    assert page.page == 0 and "none of the selected pages (5) exists" in page.error


def _signals_by_default() -> None:
    """In the child: Ctrl-C and SIGHUP as a terminal's process has them. A run under nohup (CI's)
    ignores SIGHUP, and its children inherit that; the command keeps what it inherits ignored."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("signals", [(signal.SIGINT, signal.SIGINT), (signal.SIGHUP,)], ids=["ctrl-c-twice", "sighup"])
def test_ctrl_c_twice_or_a_closed_terminal_keeps_the_pages_read(tmp_path, signals):
    """A second Ctrl-C tens of milliseconds after the first (a reflex) came while the run waited
    for its stages to stop: it cut the saving, and every page read of the unfinished document was
    lost, with no summary. SIGHUP (the terminal closed, ssh dropped) killed the run outright. Both
    now stop it as one Ctrl-C does: exit 130, the summary, the pages read kept."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.pdf").write_bytes((DOCS / "text-1page.pdf").read_bytes())
    text_pdf(src / "b.pdf", n_pages=60)
    proc = subprocess.Popen([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(src), "--model", str(MODEL),
                             "-o", str(tmp_path / "out"), "--max-tokens", "8", "--batch-size", "1", "--text-layer", "ocr",
                             "--format", "md,jsonl"], cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_signals_by_default)  # as from a terminal, not as this test runs (nohup, &)
    seen, t0 = "", time.perf_counter()
    while "[1/2]" not in seen:  # a.pdf is written: b.pdf's pages are being read
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    time.sleep(max(3.0, time.perf_counter() - t0))  # a page of b's or more, however busy the machine
    for i, sig in enumerate(signals):
        time.sleep(0.05 * i)
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    assert "unfinished ones hold the pages read so far" in err and "Traceback" not in err, err
    records = [json.loads(r) for r in (tmp_path / "out" / "b.jsonl").read_text().splitlines()]
    assert [r["page"] for r in records] == list(range(1, 61))
    read = [r for r in records if r["error"] is None]
    assert read and all(r["error"].startswith("not read") for r in records if r not in read)


@pytest.mark.parametrize("out", ["folder", "stdout"])
def test_a_terminal_that_hangs_up_still_exits_130_with_the_pages_read_kept(tmp_path, out):
    """The terminal itself gone (its window closed, ssh dropped): every write to it fails with
    EIO. With the transcript on standard output (-o -), the next page's text after the SIGHUP
    ended the run with 73 (standard output: cannot write), not 130. Standard output and error on
    a terminal that hung up now write nowhere; with an output folder the pages read are kept."""
    import pty

    src = tmp_path / "in"
    src.mkdir()
    text_pdf(src / "b.pdf", n_pages=60)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(src), "--model", str(MODEL),
                             "-o", "-" if out == "stdout" else str(tmp_path / "out"), "--max-tokens", "8",
                             "--batch-size", "1", "--text-layer", "ocr", "--format", "md,jsonl"],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=_signals_by_default)
    os.close(slave)
    seen, t0 = b"", time.perf_counter()
    while not re.search(rb"pages [1-9]\d*/60", seen):  # its progress bar: pages are being read
        assert time.perf_counter() - t0 < 300 and proc.poll() is None, seen
        if select.select([master], [], [], 1.0)[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:  # EIO: the child closed its end (it ended)
                pytest.fail(f"the run ended before it was stopped: {seen!r}")
    time.sleep(max(3.0, time.perf_counter() - t0))  # a page or more, however busy the machine
    os.close(master)  # the terminal goes: writes to it fail from now on
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 130
    if out == "folder":
        records = [json.loads(r) for r in (tmp_path / "out" / "b.jsonl").read_text().splitlines()]
        assert [r["page"] for r in records] == list(range(1, 61)) and any(r["error"] is None for r in records)


def test_nohup_keeps_a_run_going_when_the_terminal_closes():
    """stop_signals_as_interrupt took SIGHUP over even where the process was started ignoring it
    (`nohup`, which exists for that): a run under nohup stopped at logout. An ignored signal stays
    ignored; the others stop the run, and a second within the grace is let pass."""
    from pantheon_ocr.commands.common import stop_signals_as_interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)  # ignored: nothing raised
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C at once: let pass
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for s, h in before.items():
            signal.signal(s, h)
