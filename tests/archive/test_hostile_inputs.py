"""Archive jobs over hostile inputs and job files: FIFOs (never a hang), link loops, names that
are not UTF-8 (state, outputs, reports), write failures (exit 73), the text-layer fallback after
the last attempt, the page timeout, absurd or non-UTF-8 job files."""

from __future__ import annotations

import errno
import json
import os

import pytest

from fake_engine import EngineFactory, md_body
from pantheon_ocr.archive.run import load_job, run_job
from pantheon_ocr.errors import ExitCode, JobError

from .harness import check_outputs, md_pages, pdf, run_cli, write_job

FF = os.fsdecode(b"\xff")


def test_fifo_and_link_loop_in_an_input_folder(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    os.mkfifo(tmp_path / "in" / "stuck.pdf")  # would block open() forever (and keep the lock fresh)
    os.symlink("loop.pdf", tmp_path / "in" / "loop.pdf")
    job = write_job(tmp_path)
    proc = run_cli(["archive", "run", str(job), "--no-progress"], timeout=120)
    assert proc.returncode == ExitCode.PAGES_FAILED and "Traceback" not in proc.stderr, proc.stderr
    assert "stuck.pdf: a FIFO (named pipe), not a regular file" in proc.stderr
    assert "loop.pdf: symbolic link loop" in proc.stderr
    check_outputs(tmp_path / "out", {"a.md": (1, 2)}, n_tokens=None)


def test_names_that_are_not_utf8(tmp_path):
    pdf(tmp_path / "in", f"{FF}.pdf", 2, 1)
    pdf(tmp_path / "in", "ok.pdf", 1, 2)
    job = write_job(tmp_path, ocr={"formats": ["md", "jsonl"]})
    first = run_job(load_job(job), EngineFactory())
    assert first.exit_code == ExitCode.OK
    check_outputs(tmp_path / "out", {f"{FF}.md": (1, 2), "ok.md": (2, 1)})
    record = json.loads((tmp_path / "out" / f"{FF}.jsonl").read_bytes().decode("utf-8").splitlines()[0])
    assert record["doc"].endswith("/in/\\xff.pdf")
    json.loads(first.report_json.read_bytes().decode("utf-8"))  # the report is valid UTF-8 JSON
    second = run_job(load_job(job), EngineFactory())  # the BLOB name finds its row again: nothing new
    assert second.summary["documents"] == {"unchanged": 2} and second.exit_code == ExitCode.OK
    proc = run_cli(["archive", "status", str(job)])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr


def test_write_failure_is_exit_73_and_is_retried(tmp_path, monkeypatch):
    from pantheon_ocr.pipeline import outputs

    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path)
    real = outputs._write_temp

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "_write_temp", full)
    result = run_job(load_job(job), EngineFactory())
    assert result.exit_code == ExitCode.CANNOT_WRITE
    assert any("No space left on device" in f["reason"] for f in result.summary["failures"])
    monkeypatch.setattr(outputs, "_write_temp", real)
    again = run_job(load_job(job), EngineFactory())  # pages are in the state: only the write is redone
    assert again.exit_code == ExitCode.OK and again.summary["pages"]["attempted"] == 0
    check_outputs(tmp_path / "out", {"a.md": (1, 2)})


def test_text_layer_after_the_last_attempt(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 2, 1)
    job = write_job(tmp_path, ocr={"text_fallback": True, "formats": ["md", "jsonl"]}, retry={"attempts": 2})
    result = run_job(load_job(job), EngineFactory(fail_vision=[[1, 2]]))
    assert result.exit_code == ExitCode.PAGES_FAILED
    (failure,) = result.summary["failures"]
    assert failure["page"] == 2 and failure["reason"].endswith("(the PDF's text layer stands in)")
    pages = md_pages(md_body(tmp_path / "out" / "a.md"))
    assert pages[1][1].startswith("<!-- page 2 text-layer: ") and pages[1][2] == "Document 1, page 2 of 2"
    records = [json.loads(x) for x in (tmp_path / "out" / "a.jsonl").read_text().splitlines()]
    assert [r["source"] for r in records] == ["model", "text-layer"]
    assert len([a for a in result.summary["retries"] if a["page"] == 2]) == 2  # both attempts OCR'd first


def test_page_timeout_key(tmp_path):
    pdf(tmp_path / "in", "a.pdf", 1, 1)
    job = write_job(tmp_path, ocr={"page_timeout": 0.5}, retry={"attempts": 1})
    spec = load_job(job)
    assert spec.pipeline_options().page_timeout == 0.5
    result = run_job(spec, EngineFactory(n_tokens=400, step_sleep=0.02))
    (failure,) = result.summary["failures"]
    assert failure["reason"].startswith("timeout: the page took longer than 0.5 s")


def test_a_job_file_with_a_byte_order_mark_and_contradicting_spellings(tmp_path):
    """A BOM (Windows editors write one) is read past; the old text_fallback and text_layer that
    say different things are one error naming both, not the old spelling silently winning."""
    from pantheon_ocr.archive.spec import load_job

    job = tmp_path / "job.toml"
    job.write_bytes(b'\xef\xbb\xbfinputs = ["in"]\noutput = "out"\n')
    assert load_job(job).output == tmp_path / "out"
    job.write_text('inputs = ["in"]\noutput = "out"\n[ocr]\ntext_fallback = true\ntext_layer = "prefer"\n')
    with pytest.raises(JobError) as caught:
        load_job(job).pipeline_options()
    assert str(caught.value) == ("job.toml: ocr.text_fallback: the old spelling of text_layer ('fallback' here) "
                                 "contradicts text_layer 'prefer': give text_layer alone")
    job.write_text('inputs = ["in"]\noutput = "out"\n[ocr]\ntext_fallback = false\ntext_layer = "ocr"\n')
    assert load_job(job).pipeline_options().text_layer == "ocr"  # saying the same twice is fine


def test_job_file_that_is_not_utf8_or_not_a_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_bytes(b'inputs = ["\xff"]\noutput = "out"\n')
    proc = run_cli(["archive", "run", str(job), "--no-progress"])
    assert proc.returncode == ExitCode.BAD_ARGUMENTS and "not a UTF-8 text file" in proc.stderr and "Traceback" not in proc.stderr
    os.mkfifo(tmp_path / "fifo.toml")
    proc = run_cli(["archive", "run", str(tmp_path / "fifo.toml"), "--no-progress"], timeout=60)
    assert proc.returncode == ExitCode.BAD_ARGUMENTS and "FIFO" in proc.stderr
