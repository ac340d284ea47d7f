"""The CLI end to end on the real sample PDFs with the real engine (the tiny random LightOnOCR)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_engine import md_body
from pantheon_ocr.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "samples" / "docs"
BAD = ROOT / "samples" / "bad"
MODEL = ROOT / "samples" / "tiny-model"


def run(*args, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def transcribe(*args, out, max_tokens=8):
    return run("transcribe", *args, "--model", MODEL, "-o", out, "--max-tokens", max_tokens, "--no-progress")


def markers(md: str) -> list[int]:
    return [int(line.split()[2]) for line in md.splitlines() if line.startswith("<!-- page ")]


def test_help_is_instant_and_lists_commands():
    code, out, _ = run("--help")
    assert code == 0 and all(c in out for c in ("transcribe", "archive", "bench", "inspect", "generate"))
    # --help must not import the engine or numpy
    probe = "import sys, pantheon_ocr.cli as c; c.main(['--help']); print('numpy' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip().endswith("False")


def test_transcribe_sample_docs(tmp_path):
    code, _, err = transcribe(DOCS, "--format", "md", "--format", "jsonl", out=tmp_path)
    assert code == 0, err
    assert "meaningless" in err  # the tiny random model says so
    for name, n_pages in [("text-1page", 1), ("report-3pages", 3), ("scanned", 1)]:
        md = md_body(tmp_path / f"{name}.md")
        assert markers(md) == list(range(1, n_pages + 1))
        records = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert [r["page"] for r in records] == list(range(1, n_pages + 1))
        for r in records:
            assert r["finish_reason"] in ("eos", "max_tokens", "repetition") and r["n_tokens"] <= 8
            assert set(r["seconds"]) >= {"render", "vision", "prefill", "decode"}
    assert not list(tmp_path.rglob("*.tmp*"))


def test_pages_option_and_skip_existing(tmp_path):
    code, _, err = transcribe(DOCS / "report-3pages.pdf", "--pages", "2-3", out=tmp_path)
    assert code == 0, err
    assert markers(md_body(tmp_path / "report-3pages.md")) == [2, 3]
    before = (tmp_path / "report-3pages.md").stat().st_mtime_ns
    code, _, err = transcribe(DOCS / "report-3pages.pdf", "--pages", "2-3", out=tmp_path)
    assert code == 0 and "skipped" in err
    assert (tmp_path / "report-3pages.md").stat().st_mtime_ns == before


def test_bad_documents_do_not_stop_the_batch(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for p in [DOCS / "text-1page.pdf", BAD / "corrupt.pdf", BAD / "encrypted.pdf", BAD / "zero-pages.pdf"]:
        shutil.copy(p, inputs / p.name)
    code, _, err = transcribe(inputs, out=tmp_path / "out")
    assert code == 1, err  # some pages failed, the others were written
    assert (tmp_path / "out" / "text-1page.md").exists()
    for name in ("corrupt.pdf", "encrypted.pdf", "zero-pages.pdf"):
        assert name in err
    assert "encrypted.pdf: the PDF is encrypted: a password is needed (--password)" in err  # the flag, on the command line


def test_encrypted_pdf_with_password(tmp_path):
    code, _, err = transcribe(BAD / "encrypted.pdf", "--password", "pantheon", out=tmp_path)
    assert code == 0, err
    assert markers(md_body(tmp_path / "encrypted.md")) == [1]


def test_looping_page_is_stopped_by_the_repetition_guard(tmp_path):
    """The random tiny model repeats one token forever: the guard stops it before max tokens."""
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path,
                       "--max-tokens", 500, "--format", "jsonl", "--no-progress")
    assert code == 0, err
    record = json.loads((tmp_path / "text-1page.jsonl").read_text())
    assert record["finish_reason"] == "repetition" and record["n_tokens"] < 500


@pytest.mark.parametrize("args, code, needle", [
    (["transcribe", "nothing-here.pdf", "--model", "samples/tiny-model"], 4, "nothing-here.pdf"),
    (["transcribe", "samples/docs", "--model", "samples/tiny-model", "--pages", "3-1"], 2, "3-1"),
    (["transcribe", "samples/docs", "--model", "samples/docs/text-1page.pdf", "--mmproj", "x.gguf"], 3, "x.gguf"),
    (["transcribe", "samples/docs", "--model", "samples/tiny-model", "--batch-size", "0"], 2, "batch-size"),
])
def test_clear_errors_and_exit_codes(args, code, needle):
    got, out, err = run(*args)
    assert got == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(needle in line for line in lines) and "Traceback" not in err


def test_ctrl_c_stops_cleanly(tmp_path):
    """SIGINT mid-run: exit 130, no half-written file; finished documents stay complete."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(6):
        shutil.copy(DOCS / "report-3pages.pdf", inputs / f"doc{i}.pdf")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(inputs), "--model",
                             str(MODEL), "-o", str(out), "--max-tokens", "30", "--no-progress", "--batch-size", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("*.md")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not [p for p in out.rglob("*") if p.is_file() and p.suffix != ".md"]
    for md in out.glob("*.md"):
        assert markers(md.read_text()) == [1, 2, 3]
    assert len(list(out.glob("*.md"))) < 6


def _smollm2():
    from pantheon_ocr.errors import ModelError
    from pypi_models import smollm2_path

    try:
        return smollm2_path()
    except ModelError as exc:
        pytest.skip(str(exc))


def test_generate_streams_a_chat_answer():
    code, out, err = run("generate", "--model", _smollm2(), "--prompt", "What is the capital of France?",
                         "--chat", "--max-tokens", "20")
    assert code == 0, err
    assert "Paris" in out


def test_inspect_json():
    code, out, err = run("inspect", _smollm2(), "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["architecture"] == "llama" and info["config"]["n_layer"] == 30
    assert info["types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert info["memory_bytes"]["quantized"] < info["memory_bytes"]["f32"]
    code, out, _ = run("inspect", MODEL / "mmproj.gguf", "--json")
    assert code == 0 and json.loads(out)["architecture"] == "clip"


def test_inspect_describes_a_pair_that_does_not_fit_before_saying_so(tmp_path):
    """The bundled reader's text GGUF beside the tiny model's mmproj: both described (what each is
    tells why they do not fit), then the one-line error, exit 3; before, only the error."""
    folder = tmp_path / "mismatched"
    folder.mkdir()
    (folder / "text.gguf").symlink_to(ROOT / "pantheon_ocr" / "bundled" / "reader" / "pantheon-reader.gguf")
    (folder / "mmproj.gguf").symlink_to(MODEL / "mmproj.gguf")
    code, out, err = run("inspect", folder)
    assert code == 3 and "projection_dim" in err
    assert out.count("  architecture: ") == 2 and "fit together" not in out
    code, out, err = run("inspect", folder, "--json")
    info = json.loads(out)
    assert code == 3 and set(info) == {"text", "mmproj", "pair"} and info["pair"].startswith("does not fit: ")


def test_inspect_names_its_argument_not_a_flag_it_does_not_take(tmp_path):
    (tmp_path / "text.gguf").symlink_to(MODEL / "text.gguf")
    code, _, err = run("inspect", tmp_path)
    assert code == 2 and err == (f"error: {tmp_path}: the folder should hold one text GGUF and one *mmproj*.gguf, "
                                 "found ['text.gguf']; name the two files instead\n")


def test_image_page_printed_to_stdout(tmp_path):
    png = ROOT / "tests" / "fixtures" / "lightonocr-tiny" / "images" / "d_text_300x120.png"
    code, out, err = run("transcribe", png, "--model", MODEL / "text.gguf", "--mmproj", MODEL / "mmproj.gguf",
                         "-o", "-", "--max-tokens", "4", "--no-progress")
    assert code == 0, err
    assert out.startswith("<!-- page 1") and len(out.split()) >= 4


def test_no_model_means_the_bundled_reader_and_without_it_one_clear_error(monkeypatch, tmp_path):
    """No --model: the reader inside the package; an install without it says what to do."""
    from pantheon_ocr.errors import UsageError
    from pantheon_ocr.modelfiles import resolve as loader

    (tmp_path / "pantheon-reader.gguf").write_bytes(b"")
    (tmp_path / "mmproj-pantheon-reader.gguf").write_bytes(b"")
    monkeypatch.setattr(loader, "BUNDLED", tmp_path)
    assert loader.resolve_model(None, None) == (tmp_path / "pantheon-reader.gguf", tmp_path / "mmproj-pantheon-reader.gguf")
    monkeypatch.setattr(loader, "BUNDLED", tmp_path / "absent")
    with pytest.raises(UsageError, match="no model given and this install has no bundled reader: pull one"):
        loader.resolve_model(None, None)


def test_a_model_path_that_is_not_there_is_exit_3_naming_it(tmp_path):
    """A typo in a lone --model path: the path and "no such model file", exit 3 (a model problem),
    not a demand for --mmproj."""
    from pantheon_ocr.errors import ModelError
    from pantheon_ocr.modelfiles import resolve as loader

    with pytest.raises(ModelError, match="nope.gguf: no such model file") as e:
        loader.resolve_model(tmp_path / "nope.gguf", None)
    assert e.value.option == "model"
    code, _, err = transcribe(DOCS / "text-1page.pdf", out=tmp_path / "out")  # the good path still loads
    assert code == 0, err
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", tmp_path / "nope.gguf", "-o", tmp_path / "o2")
    assert code == 3 and "nope.gguf: no such model file" in err and "--mmproj" not in err


def test_quiet_says_only_what_went_wrong(tmp_path):
    """-q (before or after the command) for cron jobs and scripts: a run that went well says nothing
    on stderr (no engine line, notes, progress or summary), one with a failure says the failure and
    nothing else, and the exit codes stay (there was no -q: only 2>/dev/null, which hid errors too)."""
    for args in (("-q", "transcribe"), ("transcribe", "-q")):  # the bundled reader: its page ends by itself
        code, out, err = run(*args, DOCS / "text-1page.pdf", "-o", tmp_path / args[0])
        assert code == 0 and out == "" and err == "", err
        assert (tmp_path / args[0] / "text-1page.md").exists()
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", tmp_path / "nope.pdf", "--model", MODEL, "-o", tmp_path / "b",
                       "--max-tokens", 4, "-q")  # the tiny model's page is cut at 4 tokens: a problem, said too
    assert code == 1 and err.splitlines() == [
        "1 input path unreadable:", f"  {tmp_path / 'nope.pdf'}: no such file or folder",
        "note: 1 page stopped at --max-tokens: its text is cut short (marked stopped at max_tokens in the outputs); "
        "a higher --max-tokens reads on"], err
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path / "c", "--max-tokens", 4)
    assert code == 0 and "engine:" in err and "1 document (1 written)" in err  # without -q, as before
    # an explicit --progress wins over -q, as it does for archive run and models pull (one rule)
    code, _, err = run("-q", "transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path / "d", "--max-tokens", 4,
                       "--progress")
    assert code == 0 and err.startswith("[1/1] written ") and "engine:" not in err, err


def test_a_lone_model_file_that_is_no_gguf_is_exit_3_naming_it(tmp_path):
    """A lone --model that is some other file (a PDF, a text) was told to add --mmproj (exit 2), and
    only then said to be no GGUF (found by a probe). It is a model problem, said at once; a real
    GGUF alone still asks for its mmproj."""
    from pantheon_ocr.errors import ModelError, OptionError
    from pantheon_ocr.modelfiles import resolve as loader

    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(ModelError, match="fake.gguf: not a GGUF file") as e:
        loader.resolve_model(fake, None)
    assert e.value.option == "model"
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", fake, "-o", tmp_path / "o")
    assert code == 3 and "not a GGUF file" in err and "--mmproj" not in err
    text = ROOT / "pantheon_ocr" / "bundled" / "reader" / "pantheon-reader.gguf"
    with pytest.raises(OptionError, match="required with the text model"):
        loader.resolve_model(text, None)


@pytest.mark.parametrize("flag, value, says", [("--seed", "-1", "x>=0"), ("--threads", "100000", "1<=x<=512"),
                                               ("--render-workers", "10000", "1<=x<=512")])
def test_counts_past_their_range_are_refused_naming_the_flag(tmp_path, flag, value, says):
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path, flag, value)
    assert code == 2 and f"Invalid value for '{flag}'" in err and says in err and not list(tmp_path.iterdir())


def test_a_pdf_saved_with_an_image_name_is_read_as_a_pdf(tmp_path):
    """The PDF header decides (as PDF readers look for it), not the name: a PDF saved as .png."""
    shutil.copy(DOCS / "report-3pages.pdf", tmp_path / "report.png")
    code, _, err = transcribe(tmp_path / "report.png", out=tmp_path / "out")
    assert code == 0, err
    assert markers(md_body(tmp_path / "out" / "report.md")) == [1, 2, 3]


def test_an_image_whose_metadata_holds_a_pdf_header_stays_an_image(tmp_path):
    """Only a file that begins with %PDF- is a PDF in spite of an image name: a PNG whose text
    chunk mentions "%PDF-1.7" is read as the image it is."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "converted from %PDF-1.7 by a scanner")
    Image.new("RGB", (300, 120), "white").save(tmp_path / "scan.png", pnginfo=info)
    assert b"%PDF-" in (tmp_path / "scan.png").read_bytes()[:1024]
    code, _, err = transcribe(tmp_path / "scan.png", out=tmp_path / "out")
    assert code == 0, err
    assert markers(md_body(tmp_path / "out" / "scan.md")) == [1]


def gone(kind: str):
    """A write end whose reader is gone: a pipe's (`| head -1` done reading) or a socket's (a
    journal, an ssh session that closed)."""
    if kind == "pipe":
        r, w = os.pipe()
        os.close(r)
        return w, lambda: os.close(w)
    a, b = socket.socketpair()
    b.close()
    return a.fileno(), a.close


def run_into(args, stdout=None, stderr=None) -> tuple[int, bytes]:
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *map(str, args)], cwd=ROOT, timeout=300,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=stderr if stderr is not None else subprocess.PIPE)
    return proc.returncode, proc.stderr or b""


@pytest.mark.parametrize("kind", ["pipe", "socket"])
@pytest.mark.parametrize("args", [["inspect", MODEL / "mmproj.gguf"], ["--help"], ["--version"]])
def test_a_reader_that_stops_reading_is_exit_141_without_a_word(args, kind):
    """`pantheon-ocr inspect M | head -1`: the reader is gone before we are done. Unix tools end by
    SIGPIPE (141 in the shell); not 1, which says pages failed, nor a traceback."""
    fd, close = gone(kind)
    try:
        assert run_into(args, stdout=fd) == (141, b"")
    finally:
        close()


def test_a_log_reader_gone_stops_nothing(tmp_path):
    """Standard error's reader gone (`2>&1 | tee log`, tee killed): the diagnostics are lost, the
    command is not: it does its work and exits with its own code."""
    fd, close = gone("pipe")
    try:
        assert run_into(["transcribe", DOCS, "--model", MODEL, "-o", tmp_path / "out", "--max-tokens", 4],
                        stderr=fd)[0] == 0
        assert run_into(["transcribe", tmp_path / "missing.pdf", "-o", tmp_path / "out"], stderr=fd)[0] == 4
        assert run_into(["inspect", tmp_path / "missing.gguf"], stderr=fd)[0] == 3
    finally:
        close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report-3pages.md", "scanned.md", "text-1page.md"]


def test_a_broken_pipe_that_is_not_our_output_stays_an_error(monkeypatch, capsys):
    from pantheon_ocr import cli

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")  # a socket's, say: stdout and stderr are fine

    monkeypatch.setattr(cli.LazyGroup, "get_command", lambda self, ctx, name: __import__("click").Command(
        name, callback=broken))
    assert cli.main(["inspect"]) == ExitCode.INTERNAL == 70  # a bug, never "some pages failed" (1)
    assert "internal error: BrokenPipeError" in capsys.readouterr().err


def test_out_of_memory_is_its_own_exit_code(monkeypatch, capsys):
    """A MemoryError outside any page (a model's load under ulimit -v) is one line and exit 71, not
    the 1 that says 'some pages failed, the others were written'."""
    from pantheon_ocr import cli

    def too_big(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli.LazyGroup, "get_command", lambda self, ctx, name: __import__("click").Command(
        name, callback=too_big))
    assert cli.main(["inspect"]) == ExitCode.OUT_OF_RESOURCES == 71
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory") and len(err.splitlines()) == 1


def test_a_thread_that_cannot_start_is_out_of_resources_not_a_bug(monkeypatch, capsys, tmp_path):
    """Under ulimit -v (or -u) a stage thread cannot start: Python says RuntimeError, which was an
    'internal error' (70); it is the machine's limit, exit 71 like a MemoryError."""
    import threading

    from pantheon_ocr import cli

    start = threading.Thread.start

    def no_stage_thread(self):
        if self.name.startswith("pantheon-"):
            raise RuntimeError("can't start new thread")
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", no_stage_thread)
    code = cli.main(["transcribe", str(DOCS / "text-1page.pdf"), "--model", str(MODEL), "-o", str(tmp_path),
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == ExitCode.OUT_OF_RESOURCES == 71, err
    assert err.splitlines()[-1].startswith("error: cannot start a thread: out of memory") and "internal" not in err


def test_v_after_the_command_is_the_same_switch(tmp_path):
    """The engine line says "(-v says why)": `transcribe docs -v` must then say why, not 'No such option'."""
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path, "--max-tokens", 2,
                       "--no-progress", "-v")
    assert code == 0 and "note: weights: " in err and "(-v says why)" not in err
    code, _, err = run("archive", "status", tmp_path / "missing.toml", "--verbose")
    assert code == 2 and "Traceback" in err  # -v's traceback, from a subcommand's place too, and the exit code
    assert err.endswith(f"error: {tmp_path / 'missing.toml'}: no such job file\n")


def test_formats_take_commas_like_the_other_lists(tmp_path):
    code, _, err = transcribe(DOCS / "text-1page.pdf", "--format", "jsonl,md", "--format", "txt,jsonl", out=tmp_path,
                              max_tokens=2)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text-1page.jsonl", "text-1page.md", "text-1page.txt"]
    code, _, err = transcribe(DOCS / "text-1page.pdf", "--format", "md,docx", out=tmp_path / "x")
    assert code == 2 and "'docx' is not one of 'md', 'jsonl', 'txt'" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["--help"], ["inspect", MODEL / "mmproj.gguf"]])
def test_standard_output_on_a_full_disk_is_exit_73_naming_it(args):
    with open("/dev/full", "w") as full:
        code, err = run_into(args, stdout=full)
    assert code == 73 and err == b"error: standard output: cannot write: No space left on device\n"


def test_progress_to_stdout_says_read_not_written():
    """With -o - the transcripts are printed once every document is read: a progress line saying
    "written" was wrong where the reader then went away (`| head -1`: nothing delivered)."""
    code, out, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", "-", "--max-tokens", 3)
    assert code == 0 and out and f"[1/1] read {DOCS / 'text-1page.pdf'} (1 page, " in err and "] written" not in err


def test_stdout_refuses_page_files_and_keeps_documents_apart_in_txt(tmp_path):
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", "-", "--page-files")
    assert code == 2 and "error: --page-files writes a file per page: give an output folder (-o), not -" in err
    code, out, err = run("transcribe", DOCS / "text-1page.pdf", DOCS / "scanned.pdf", "--model", MODEL, "-o", "-",
                         "--format", "txt", "--max-tokens", 3, "--no-progress")
    assert code == 0, err
    one = (tmp_path / "one").mkdir() or run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o",
                                            tmp_path / "one", "--format", "txt", "--max-tokens", 3, "--no-progress")
    first = (tmp_path / "one" / "text-1page.txt").read_text()
    # each document headed as head(1) heads files, the next one on a line of its own after a blank line
    head_1, head_2 = f"==> {DOCS / 'text-1page.pdf'} <==\n", f"\n\n==> {DOCS / 'scanned.pdf'} <==\n"
    assert out.startswith(head_1 + (first if first.endswith("\n") else first + "\n") + head_2[1:]), out
    code, out, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", "-", "--format", "txt",
                         "--max-tokens", 3, "--no-progress")
    assert code == 0 and out == first and "==>" not in out  # one document: its text alone


def test_what_auto_chose_is_one_line_without_v(capsys):
    """Every choice of the plan is in the one 'engine:' line, its reasons under -v; none is a note
    of its own (the prompt attention and prompt rows once were, on every torch run)."""
    from pantheon_ocr.commands.common import echo_notes
    from pantheon_ocr.engine.loader import PLAN_NOTES

    notes = [f"{p} chosen (because)" for p in PLAN_NOTES] + ["a tiny test model"]
    echo_notes(notes)
    err = capsys.readouterr().err.splitlines()
    assert err == ["engine: " + ", ".join(f"{p} chosen" for p in PLAN_NOTES) + " (-v says why)", "note: a tiny test model"]
    assert {"prompt attention:", "prompt rows:"} <= set(PLAN_NOTES)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE as Linux counts it")
def test_a_low_limit_of_open_files(tmp_path):
    """ulimit -n 16 (hard): one line naming the limit, exit 71, no traceback from multiprocessing's
    forkserver; a low soft limit alone is raised to the hard one and the run goes on."""
    import resource

    def limit(soft, hard):
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    args = [sys.executable, "-m", "pantheon_ocr.cli", "transcribe", str(DOCS / "text-1page.pdf"), "--model", str(MODEL),
            "-o", str(tmp_path / "out"), "--no-progress", "--max-tokens", "2"]
    hard = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, preexec_fn=limit(16, 16))
    assert hard.returncode == ExitCode.OUT_OF_RESOURCES, hard.stderr
    assert hard.stderr.splitlines()[-1] == ("error: cannot start a render worker: too many open files: the limit of "
                                            "open files (ulimit -n) is 16: raise it")
    assert "Traceback" not in hard.stderr
    soft = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          preexec_fn=limit(16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    assert soft.returncode == 0, soft.stderr


def test_generate_says_what_does_not_fit_and_what_is_no_text(tmp_path):
    """A prompt longer than the model's context, or one that ends past it, and bytes that are no
    UTF-8: one line each, never an internal error (a ValueError, a TypeError from the tokenizer)."""
    model = ROOT / "pantheon_ocr" / "bundled" / "reader" / "pantheon-reader.gguf"
    code, _, err = run("generate", "--model", model, "--prompt", "word " * 600)
    assert code == 2 and err == ("error: --prompt is 1,200 tokens: the model's context holds 512, and at least one new "
                                 "token must fit\n")
    code, out, err = run("generate", "--model", model, "--prompt", "word " * 253, "--max-tokens", 100,
                         "--temperature", 2, "--seed", 2)
    assert code == 0 and err == "note: at most 6 new tokens fit the model's context of 512 after the prompt's 506\n"
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "generate", "--model", str(model), "--prompt", "-"],
                          input=b"ab\xff", capture_output=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr == b"error: --prompt is not UTF-8 text (byte 2): give it as UTF-8\n"
    proc = subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", "generate", "--model", str(model), "--prompt",
                           b"\xff\xfe x"], capture_output=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and b"--prompt is not UTF-8 text (byte 0)" in proc.stderr


def test_pages_cut_at_max_tokens_and_too_many_threads_are_said(tmp_path):
    """A --max-tokens too low cuts every page: written and marked in the Markdown, and now said
    where the person looks, on standard error; as is --threads above the cores."""
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", DOCS / "scanned.pdf", "--model", MODEL, "-o", tmp_path,
                       "--max-tokens", 1, "--no-progress", "--threads", os.cpu_count() + 3)
    assert code == 0, err
    assert ("note: 2 pages stopped at --max-tokens: their text is cut short (marked stopped at max_tokens in the "
            "outputs); a higher --max-tokens reads on") in err.splitlines()
    assert f"note: threads {os.cpu_count() + 3} is more than the " in err
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path / "b", "--no-progress")
    assert code == 0 and "stopped at --max-tokens" not in err and "more than the" not in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a /proc file system")
def test_an_output_folder_that_makes_no_files_is_said_so():
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", "/proc", "--no-progress")
    assert code == 73 and err == ("error: /proc: cannot write in the output folder: files cannot be made in it (a virtual "
                                  "file system such as /proc?)\n")


def test_an_output_folder_that_cannot_be_made_is_exit_73_either_way(tmp_path):
    """-o naming a file was click's usage error (exit 2, "Directory ... is a file."), -o below a
    file exit 73: both are an output that cannot be written, said in our words."""
    (tmp_path / "afile").write_text("mine")
    for out, problem in ((tmp_path / "afile", "the output folder is a file, not a folder"),
                         (tmp_path / "afile" / "sub", "cannot make the output folder: Not a directory")):
        code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", out, "--no-progress")
        assert code == 73 and err == f"error: {out}: {problem}\n"
    assert (tmp_path / "afile").read_text() == "mine"


def test_the_gpu_switches_without_a_gpu_are_said(tmp_path):
    """--gpu-prefill on a machine with no GPU was taken in silence: the prefill ran through torch on
    the CPU with a second copy of the weights (406 MB against 218 in the probe)."""
    torch = pytest.importorskip("torch", reason="the GPU switches need torch (pip install 'pantheon-ocr[gpu]')")
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run("transcribe", DOCS / "text-1page.pdf", "--model", MODEL, "-o", tmp_path, "--no-progress",
                       "--gpu-prefill", "--max-tokens", 2)
    assert code == 0 and "note: gpu-prefill: no GPU here (torch finds no CUDA or MPS device)" in err, err


def test_nothing_to_read_and_a_bad_model_are_both_said(tmp_path):
    """With every input missing the run stops before the model loads (exit 4); a --model that would
    not have loaded either was not said, and came as a surprise on the next try."""
    code, _, err = run("transcribe", tmp_path / "missing.pdf", "--model", tmp_path / "nosuch.gguf", "-o", tmp_path / "o")
    assert code == ExitCode.INPUT_UNREADABLE
    assert f"  {tmp_path / 'missing.pdf'}: no such file or folder" in err.splitlines()
    assert err.splitlines()[-1] == f"error: {tmp_path / 'nosuch.gguf'}: no such model file"
