"""Errors of `bench` and `models pull` that a probe found worded wrongly or said too late:

- `bench decode|ocr|pages --json PATH` with PATH unwritable: a WriteError naming PATH (exit 73)
  before any model is read or any configuration runs, not an internal error after the run;
- `bench pages` names each failed document or page and its reason, as transcribe does;
- `models pull` against an endpoint that answers 404 to everything: no such repo there (exit 3),
  not "listed at commit None"; a cache/token path that cannot be used (HOME a regular file) is a
  local problem (exit 73), not a failed connection (69);
- `bench` with a missing or bad model file: exit 3 naming the path, as `inspect` and `bench
  generate` say it (not click's exit 2, nor an internal error from the benchmark's child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import pantheon_ocr
from pantheon_ocr.bench.isolation import run_isolated
from pantheon_ocr.bench.pages import failure_lines
from pantheon_ocr.cli import main
from pantheon_ocr.engine.format import gguf
from pantheon_ocr.errors import ExitCode, ModelError
from pantheon_ocr.modelfiles.hub import pull
from pantheon_ocr.modelfiles.transfer import Limits

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = Path(pantheon_ocr.__file__).resolve().parents[1]  # what the subprocesses import
TINY = ROOT / "samples" / "tiny-model"
TEXT, MMPROJ = str(TINY / "text.gguf"), str(TINY / "mmproj.gguf")
CORRUPT, GOOD = ROOT / "samples" / "bad" / "corrupt.pdf", ROOT / "samples" / "docs" / "text-1page.pdf"


# -- bench --json: checked up front ------------------------------------------------------------
@pytest.fixture
def nothing_may_run(monkeypatch):
    """Any model file opened or any configuration run fails the test: the --json check must come
    first (an AssertionError would surface as `internal error`, exit 1)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was opened or a benchmark ran before --json was checked")

    monkeypatch.setattr(gguf.GGUFFile, "__init__", refuse)
    monkeypatch.setattr("pantheon_ocr.bench.isolation.run_isolated", refuse)
    monkeypatch.setattr("pantheon_ocr.bench.pages.bench_pages", refuse)


BENCHES = {
    "generate": ["bench", "generate", "--model", TEXT, "--prefill-tokens", "4", "--decode-tokens", "1"],
    "decode": ["bench", "decode", "--model", TEXT, "--batch-size", "1", "--context", "4", "--steps", "1",
               "--in-process"],
    "ocr": ["bench", "ocr", "--model", TEXT, "--mmproj", MMPROJ, "--stage", "vision", "--vision-layers", "1",
            "--longest-edge", "112", "--in-process"],
    "pages": ["bench", "pages", "--model", TEXT, "--mmproj", MMPROJ, "--synthetic", "1", "--max-tokens", "2",
              "--ignore-eos", "--longest-edge", "112", "--render-workers", "1", "--in-process"],
}


@pytest.mark.parametrize("command", list(BENCHES))
def test_bench_json_under_a_file_is_refused_before_anything_runs(command, tmp_path, capsys, nothing_may_run):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder\n")
    target = blocker / "d" / "x.json"
    assert main([*BENCHES[command], "--json", str(target)]) == ExitCode.CANNOT_WRITE == 73
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"error: --json {target}: {blocker / 'd'}: cannot make the output folder: Not a directory\n"


@pytest.mark.parametrize("command", list(BENCHES))
def test_bench_json_that_is_a_folder_is_refused_before_anything_runs(command, tmp_path, capsys, nothing_may_run):
    assert main([*BENCHES[command], "--json", str(tmp_path)]) == 73
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: --json {tmp_path}: a folder, not a file\n"


@pytest.mark.parametrize("command", list(BENCHES))
def test_bench_json_that_is_empty_is_refused_before_anything_runs(command, capsys, nothing_may_run):
    """--json "$OUT" with OUT unset: the figures would be lost without a word."""
    assert main([*BENCHES[command], "--json", ""]) == ExitCode.BAD_ARGUMENTS
    assert capsys.readouterr().err == ("error: --json: an empty path (an unset shell variable?): give the file the "
                                       "figures go to\n")


def test_bench_json_relative_path_is_named_as_given(tmp_path, capsys, monkeypatch, nothing_may_run):
    monkeypatch.chdir(tmp_path)
    Path("results").write_text("a file where the folder should be\n")
    assert main([*BENCHES["decode"], "--json", "results/decode.json"]) == 73
    assert capsys.readouterr().err == ("error: --json results/decode.json: results: the output folder is a file, "
                                       "not a folder\n")


def test_bench_json_through_a_link_is_refused_before_anything_runs(tmp_path, capsys, nothing_may_run):
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert main([*BENCHES["decode"], "--json", str(link)]) == 73
    assert capsys.readouterr().err == (f"error: --json {link}: a symbolic link: the file is not written "
                                       "through a link\n")
    assert not (tmp_path / "elsewhere.json").exists()


def test_bench_json_folder_is_made_and_the_file_written_whole(tmp_path, capsys):
    target = tmp_path / "new" / "decode.json"
    assert main([*BENCHES["decode"], "--json", str(target)]) == 0
    (row,) = json.loads(target.read_text())
    assert row["storage"] and [r["batch"] for r in row["rows"]] == [1]
    assert os.listdir(target.parent) == ["decode.json"]  # no temp file left beside it
    assert capsys.readouterr().err.endswith(f"wrote {target}\n")


def test_bench_generate_writes_its_json_as_the_other_benches_do(tmp_path, capsys):
    """`bench generate --json` was a flag that printed JSON instead of the table; it now takes the
    file's path, as `bench ocr|decode|pages` do, and the table is printed too."""
    target = tmp_path / "generate.json"
    assert main([*BENCHES["generate"], "--json", str(target)]) == 0
    (row,) = json.loads(target.read_text())
    assert row["decode_tok_s"] > 0
    out, err = capsys.readouterr()
    assert "prefill tok/s" in out and err.endswith(f"wrote {target}\n")


# -- bench pages: which document failed, and why -------------------------------------------------
def test_bench_pages_names_the_failed_document_and_its_reason(tmp_path, capsys):
    out = tmp_path / "pages.json"
    code = main(["bench", "pages", str(CORRUPT), str(GOOD), "--model", str(TINY), "--batch-size", "1",
                 "--weights", "quantized", "--max-tokens", "2", "--ignore-eos", "--longest-edge", "112",
                 "--render-workers", "1", "--in-process", "--json", str(out)])
    assert code == ExitCode.PAGES_FAILED  # the figures are printed and written, and the failure is in the exit code
    err = capsys.readouterr().err
    assert (f"\n1 document failed:\n  {CORRUPT}: the PDF is damaged or truncated and cannot be opened\n"
            f"wrote {out}\n") in err
    (r,) = json.loads(out.read_text())
    assert [(p["doc"], p["page"], p["error"]) for p in r["pages"] if p["error"]] == [
        (str(CORRUPT), None, "the PDF is damaged or truncated and cannot be opened")]


def _result(name: str, pages: list[tuple[str, int | None, str | None]]) -> dict:
    return {"config": {"name": name}, "pages": [{"doc": d, "page": p, "error": e} for d, p, e in pages]}


def test_failure_lines_list_each_failure_once_and_where_only_some_configurations_had_it():
    results = [
        _result("B=1 f32", [("a.pdf", 1, None), ("a.pdf", 2, "decode failed:\nout of memory"),
                            ("bad.pdf", None, "damaged")]),
        _result("B=8 f32", [("a.pdf", 1, None), ("a.pdf", 2, None), ("bad.pdf", None, "damaged")]),
    ]
    assert failure_lines(results) == [
        "1 page and 1 document failed:",
        "  a.pdf page 2: decode failed: out of memory (in B=1 f32)",
        "  bad.pdf: damaged",
    ]
    assert failure_lines([_result("B=1 f32", [("a.pdf", 1, None)])]) == []
    assert failure_lines([_result("B=1", [("a.pdf", 1, "x"), ("a.pdf", 3, "y")])]) == [
        "2 pages failed:", "  a.pdf page 1: x", "  a.pdf page 3: y"]


# -- bench: a missing or bad model file is exit 3, naming it --------------------------------------
@pytest.mark.parametrize("args, path, problem", [
    (["bench", "decode", "--model", "/nonexist"], "/nonexist", "no such model file"),  # as transcribe says it
    (["bench", "ocr", "--model", TEXT, "--mmproj", "/nonexist"], "/nonexist",
     "cannot open model file: No such file or directory"),
    (["bench", "ocr", "--model", "/nonexist", "--mmproj", MMPROJ], "/nonexist",
     "cannot open model file: No such file or directory"),
])
def test_bench_with_a_missing_model_file_is_exit_3_naming_it(args, path, problem, capsys):
    assert main(args) == ExitCode.BAD_MODEL == 3
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {path}: {problem}\n"


@pytest.mark.parametrize("bench", ["decode", "generate"])
def test_bench_with_a_folder_without_a_model_says_it_as_transcribe_does(bench, capsys):
    folder = str(ROOT / "samples")
    assert main(["bench", bench, "--model", folder]) == ExitCode.BAD_ARGUMENTS
    said = capsys.readouterr().err
    assert main(["transcribe", str(GOOD), "--model", folder]) == ExitCode.BAD_ARGUMENTS
    assert capsys.readouterr().err == said == (f"error: --model {folder}: the folder should hold one text GGUF and one "
                                               "*mmproj*.gguf, found []; name the two files instead\n")


def test_bench_pages_with_a_missing_model_file_is_exit_3_before_any_child_runs(capsys):
    assert main(["bench", "pages", "--model", "/nonexist.gguf", "--mmproj", MMPROJ, "--synthetic", "1"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err == "error: /nonexist.gguf: cannot open model file: No such file or directory\n"


def test_a_typed_error_in_a_benchmark_child_comes_back_typed(tmp_path):
    """A model that fails only once loaded (in the child): its ModelError, not `benchmark child
    failed` (an internal error, exit 1)."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(ModelError) as exc:
        run_isolated("pantheon_ocr.bench.stages:bench_decode", {"model": str(bad), "batch_sizes": [1]})
    assert type(exc.value) is ModelError and exc.value.exit_code == 3 and exc.value.path == str(bad)
    assert str(exc.value) == f"{bad}: {exc.value.problem}" and exc.value.problem.startswith("not a GGUF file")


# -- models pull: a 404 for everything; a cache path that is no folder ----------------------------
class _NotFound(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


@pytest.fixture
def not_found():
    """An HTTP server on 127.0.0.1 answering a bare 404 (no X-Error-Code) to every request, as a
    proxy or a server that is no Hub does; yields its URL and the paths it was asked for."""
    handler = type("Handler", (_NotFound,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def test_pull_from_an_endpoint_that_answers_404_to_everything_is_no_such_repo(not_found, tmp_path):
    url, requests = not_found
    with pytest.raises(ModelError) as exc:
        pull("acme/tiny-GGUF", endpoint=url, cache_dir=tmp_path, progress=False, limits=Limits(timeout=5, deadline=20))
    assert exc.value.exit_code == ExitCode.BAD_MODEL == 3 and exc.value.path == "acme/tiny-GGUF"
    assert str(exc.value) == (
        f"acme/tiny-GGUF: no such model repo at {url}: it answered 404 (not found) for the repo's listing "
        "(a private repo? log in or set HF_TOKEN; is HF_ENDPOINT a Hugging Face Hub?); "
        "known names: lightonocr-1, lightonocr-2, lightonocr-2-bbox")
    assert [r.split("?")[0] for r in requests] == ["/api/models/acme/tiny-GGUF/revision/main"]  # one question
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_pull_a_known_name_at_a_revision_from_a_404_endpoint(not_found, tmp_path):
    url, _ = not_found
    with pytest.raises(ModelError) as exc:
        pull("lightonocr-2", revision="v1", endpoint=url, cache_dir=tmp_path, progress=False,
             limits=Limits(timeout=5, deadline=20))
    assert exc.value.exit_code == 3
    assert exc.value.problem == (f"no such model repo or revision 'v1' at {url}: it answered 404 (not found) for "
                                 "the repo's listing (a private repo? log in or set HF_TOKEN; is HF_ENDPOINT a "
                                 "Hugging Face Hub?)")


def _cli(*args: str, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "HUGGING_FACE_HUB_TOKEN"}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(PACKAGE_ROOT), **env_extra)
    return subprocess.run([sys.executable, "-m", "pantheon_ocr.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=cwd)  # not ROOT: `-m` puts the cwd first on sys.path


@pytest.mark.parametrize("endpoint", ["closed", "404"])
def test_pull_with_home_a_regular_file_names_the_local_path_not_the_network(endpoint, not_found, tmp_path):
    home = tmp_path / "home"
    home.write_text("a file, not a folder\n")
    url = not_found[0] if endpoint == "404" else "http://127.0.0.1:9"
    r = _cli("models", "pull", "acme/tiny-GGUF", env_extra={"HOME": str(home), "HF_ENDPOINT": url}, cwd=tmp_path)
    assert r.returncode == ExitCode.CANNOT_WRITE == 73, r.stderr
    hf_home = home / ".cache" / "huggingface"
    assert r.stderr == (f"error: acme/tiny-GGUF: cannot use the local file {hf_home / 'token'} (huggingface_hub's "
                        f"token or cache; HF_HOME is {hf_home}): Not a directory\n")
    assert not_found[1] == []  # said before asking anything


# -- bench configuration lists: a typo is said, not read as something else -------------------------
@pytest.mark.parametrize("flag,value,problem", [
    ("--batch-size", "1,,2", "Invalid value for '--batch-size': '' is not a valid integer range. (in the list '1,,2')"),
    ("--batch-size", "4,", "'' is not a valid integer range. (in the list '4,')"),
    ("--batch-size", "+-1", "'+-1' is not a valid integer range."),  # not an internal error (StopIteration)
    ("--batch-size", "257", "Invalid value for '--batch-size': 257 is not in the range 1<=x<=256."),  # transcribe's bound
    ("--threads", "2,x", "Invalid value for '--threads': 'x' is not a valid integer range. (in the list '2,x')"),
    ("--threads", "513", "Invalid value for '--threads': 513 is not in the range 1<=x<=512."),
    ("--weights", "f32,,bf16", "Invalid value for '--weights': '' is not one of"),
])
def test_bench_lists_refuse_empty_and_out_of_range_items(flag, value, problem, capsys, nothing_may_run):
    args = BENCHES["pages"] if flag != "--weights" else BENCHES["decode"]
    assert main(args + [flag, value]) == ExitCode.BAD_ARGUMENTS
    assert problem in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--batch-size", "0"), ("--weights", "fp16"), ("--threads", "0")])
def test_bench_says_a_bad_value_as_transcribe_says_it(flag, value, capsys, nothing_may_run):
    """The same bad value read `Error: Invalid value for '--batch-size': 0 is not in the range
    1<=x<=256.` from transcribe and `error: --batch-size: values must be from 1 to 256, got '0'`
    from bench."""
    assert main(["transcribe", str(GOOD), flag, value]) == ExitCode.BAD_ARGUMENTS
    said = capsys.readouterr().err.splitlines()[-1]
    assert main(BENCHES["pages"] + [flag, value]) == ExitCode.BAD_ARGUMENTS
    assert capsys.readouterr().err.splitlines()[-1] == said and said.startswith("Error: Invalid value for ")


def test_bench_lists_run_a_repeated_value_once():
    from pantheon_ocr.commands.bench import _batch_sizes, _choices

    assert _batch_sizes("1, 4,1,4 ") == [1, 4]
    assert _choices("f32,bf16,f32", "--weights", ("f32", "bf16")) == ["f32", "bf16"]


# -- bench pages: a configuration that dies, a stop, bad inputs -------------------------------------
PAGES = ["bench", "pages", "--model", str(TINY), "--weights", "quantized", "--max-tokens", "2", "--ignore-eos",
         "--longest-edge", "112", "--render-workers", "1"]


def _dying(monkeypatch, batch_size: int, what: BaseException):
    """run_isolated that runs every configuration here, but the one of `batch_size` raises `what`."""
    from pantheon_ocr.bench import isolation

    real = isolation.run_isolated

    def fake(func, kwargs, threads=None, isolate=True):
        if kwargs["config"]["batch_size"] == batch_size:
            raise what
        return real(func, kwargs, threads, isolate=False)

    monkeypatch.setattr(isolation, "run_isolated", fake)


def test_a_configuration_whose_process_dies_is_reported_and_the_others_run(tmp_path, capsys, monkeypatch):
    """The OOM killer's SIGKILL of one configuration's process lost every figure, the finished
    ones too, as 'internal error' (70): now that one is reported failed and the others stand."""
    from pantheon_ocr.bench.isolation import ChildFailed

    _dying(monkeypatch, 1, ChildFailed("killed by SIGKILL (out of memory? `dmesg` says)", True))
    out = tmp_path / "b.json"
    code = main([*PAGES, str(GOOD), "--batch-size", "1,2", "--json", str(out)])
    stdout, err = capsys.readouterr()
    assert code == ExitCode.PAGES_FAILED, err
    assert "B=1" in stdout and "failed: killed by SIGKILL (out of memory? `dmesg` says)" in stdout
    assert "1 configuration failed (no figures):\n  " in err
    first, second = json.loads(out.read_text())
    assert first["summary"] is None and first["exit_code"] == 71 and second["summary"]["pages"] == 1


def test_a_stopped_benchmark_reports_what_finished_and_exits_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the second configuration: exit 0 and a 'complete' row of the stopped one once;
    now the first one's figures, the JSON, and 130."""
    _dying(monkeypatch, 2, KeyboardInterrupt())
    out = tmp_path / "b.json"
    code = main([*PAGES, str(GOOD), "--batch-size", "1,2", "--json", str(out)])
    stdout, err = capsys.readouterr()
    assert code == ExitCode.INTERRUPTED
    assert "interrupted: 1 of 2 configurations finished (the one under way is not reported)" in err
    (only,) = json.loads(out.read_text())
    assert only["config"]["batch_size"] == 1 and only["summary"]["pages"] == 1


def test_a_stop_the_pipeline_took_in_process_ends_the_benchmark(tmp_path, capsys, monkeypatch):
    """In-process the pipeline takes the Ctrl-C and returns a summary marked interrupted: the
    benchmark went on to the next configuration and exited 0, the stopped one's partial row
    passing for complete."""
    from pantheon_ocr.bench import isolation

    real = isolation.run_isolated

    def stopped_in_the_second(func, kwargs, threads=None, isolate=True):
        r = real(func, kwargs, threads, isolate=False)
        r["summary"]["interrupted"] = kwargs["config"]["batch_size"] == 2
        return r

    monkeypatch.setattr(isolation, "run_isolated", stopped_in_the_second)
    code = main([*PAGES, str(GOOD), "--batch-size", "1,2,4", "--in-process", "--json", str(tmp_path / "b.json")])
    assert code == ExitCode.INTERRUPTED
    assert "interrupted: 1 of 3 configurations finished" in capsys.readouterr().err
    assert [r["config"]["batch_size"] for r in json.loads((tmp_path / "b.json").read_text())] == [1]


def test_a_configuration_that_died_is_not_run_again_and_stays_failed(tmp_path, capsys, monkeypatch):
    """--repeats 2: a configuration killed in the first round ran again (inviting the OOM killer
    again) and, coming through the second time, was reported as a whole median, exit 0."""
    from pantheon_ocr.bench import isolation
    from pantheon_ocr.bench.isolation import ChildFailed

    real, calls = isolation.run_isolated, []

    def killed_once(func, kwargs, threads=None, isolate=True):
        calls.append(kwargs["config"]["batch_size"])
        if kwargs["config"]["batch_size"] == 2 and calls.count(2) == 1:
            raise ChildFailed("killed by SIGKILL (out of memory? `dmesg` says)", True)
        return real(func, kwargs, threads, isolate=False)

    monkeypatch.setattr(isolation, "run_isolated", killed_once)
    code = main([*PAGES, str(GOOD), "--batch-size", "1,2", "--repeats", "2", "--json", str(tmp_path / "b.json")])
    assert code == ExitCode.PAGES_FAILED and calls == [1, 2, 1]
    first, second = json.loads((tmp_path / "b.json").read_text())
    assert first["summary"]["runs_wall_s"] and second["error"].startswith("killed by SIGKILL")
    assert capsys.readouterr().err.count("failed: killed by SIGKILL") == 1  # its row, printed once


def test_a_killed_benchmark_child_is_said_and_leaves_no_temp_files(tmp_path, monkeypatch):
    from pantheon_ocr.bench.isolation import ChildFailed, run_isolated

    import tempfile

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the parent makes the child's scratch folder
    with pytest.raises(ChildFailed, match=r"^killed by SIGKILL \(out of memory\? `dmesg` says\)$") as caught:
        run_isolated("fake_engine:die_leaving_a_temp_file", {"signal": 9})
    assert caught.value.exit_code == ExitCode.OUT_OF_RESOURCES
    assert os.listdir(tmp_path) == []  # its scratch folder went with it


def test_pages_per_config_is_one_number(capsys, nothing_may_run):
    assert main([*PAGES, str(GOOD), "--pages-per-config", "2,3"]) == ExitCode.BAD_ARGUMENTS
    assert capsys.readouterr().err == ("error: --pages-per-config: 'all', 'auto' or one whole number of pages from 1, "
                                       "got '2,3'\n")


def test_a_missing_input_is_said_and_the_others_measured(tmp_path, capsys):
    """One missing path stopped the benchmark (exit 4, nothing measured)."""
    code = main([*PAGES, str(tmp_path / "missing.pdf"), str(GOOD), "--in-process"])
    stdout, err = capsys.readouterr()
    assert code == ExitCode.PAGES_FAILED and f"error: {tmp_path / 'missing.pdf'}: no such file" in err
    assert len(stdout.splitlines()) == 3  # the machine, the header and the one configuration's row
    assert main([*PAGES, str(tmp_path / "missing.pdf"), "--in-process"]) == ExitCode.INPUT_UNREADABLE
    assert main([*PAGES, str(CORRUPT), "--in-process"]) == ExitCode.INPUT_UNREADABLE  # nothing was read


def test_sigterm_stops_an_isolated_benchmark_with_its_child_and_temp_files(tmp_path):
    """SIGTERM killed `bench pages` by the signal: its child ran on as an orphan and the temp
    folders stayed in /tmp. Now the child is stopped with it, the finished configuration is
    reported, and nothing is left."""
    import signal
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(PACKAGE_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "from pantheon_ocr.cli import run; run()", *PAGES, "--synthetic", "2", "--batch-size", "1,2",
                             "--json", str(tmp_path / "b.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    first = proc.stderr.readline()  # the first configuration's row, as it finishes
    assert first.startswith("B=1"), first + proc.stderr.read()
    time.sleep(1.0)  # the second configuration's process is under way
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "interrupted: 1 of 2 configurations finished" in err and "B=1" in out
    assert [r["config"]["batch_size"] for r in json.loads((tmp_path / "b.json").read_text())] == [1]
    deadline = time.time() + 15
    while os.listdir(scratch) and time.time() < deadline:  # the child is gone, its files with it
        time.sleep(0.2)
    assert os.listdir(scratch) == []
    orphans = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(scratch).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                orphans.append(pid)
        except OSError:
            pass
    assert orphans == []


def test_every_bench_takes_a_folder_or_a_pulled_name_as_transcribe_does(capsys):
    """bench generate|ocr|decode opened --model as a file: a folder was 'not a model file', a
    pulled model's name 'no such file', without the pull command."""
    assert main(["bench", "decode", "--model", str(TINY), "--batch-size", "1", "--context", "4", "--steps", "1",
                 "--in-process"]) == 0
    assert main(["bench", "ocr", "--model", str(TINY), "--stage", "vision", "--vision-layers", "1",
                 "--longest-edge", "112", "--in-process"]) == 0
    capsys.readouterr()
    assert main(["bench", "generate", "--model", "acme/not-pulled-GGUF", "--decode-tokens", "1"]) == ExitCode.BAD_MODEL
    assert "run `pantheon-ocr models pull acme/not-pulled-GGUF`" in capsys.readouterr().err
