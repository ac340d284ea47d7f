"""The archive tests' harness: the real `pantheon-ocr` CLI over a FakeEngine with kill -9
injection (run as a script), and helpers that write job files and check outputs.

    python tests/archive/harness.py archive run JOB.toml --no-progress

Configured by environment variables so that argv stays exactly the CLI's:
    PANTHEON_TEST_ENGINE  JSON for EngineFactory: n_tokens, step_sleep, loops ([[doc, page(, below)]...]:
                          those pages loop while temperature < below, default always), fail_vision
    PANTHEON_TEST_KILL    "POINT:N": SIGKILL this process (what `kill -9` does) at the N-th
                          page   - after a page result is committed (and its document written if last)
                          assemble - after a document's last page is committed, before its files
                          write  - inside an output write: temp file written, not yet renamed
                          mark   - after a document's files are written, before it is marked done
                          step   - in the middle of a decode step (pages in flight)
    PANTHEON_TEST_READY   a file touched once the first page is committed (tests wait for it)
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))  # fake_engine, also as a script and in Ray workers


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _Counter:
    def __init__(self, point: str, n: int):
        self.point, self.n, self.seen = point, n, 0

    def hit(self, point: str) -> None:
        if point == self.point:
            self.seen += 1
            if self.seen == self.n:
                _die()


def _install(kill: _Counter | None, ready: str | None) -> None:
    import pantheon_ocr.archive.run as jobs

    record, assemble, write_document, replace = jobs._JobRun._record, jobs._JobRun._assemble, jobs.write_document, os.replace
    n_recorded = [0]

    def _record(self, result):
        before = len(self.log.attempts)
        record(self, result)
        if len(self.log.attempts) > before:
            n_recorded[0] += 1
            if ready and n_recorded[0] == 1:
                Path(ready).touch()
            if kill:
                kill.hit("page")

    def _assemble(self, row_id, only_if_needed=False):
        if kill and not only_if_needed:
            kill.hit("assemble")
        return assemble(self, row_id, only_if_needed)

    def _write_document(*a, **kw):
        written = write_document(*a, **kw)
        if kill:
            kill.hit("mark")
        return written

    def _replace(src, dst, *a, **kw):
        if kill and str(src).endswith(".tmp") and not str(dst).endswith((".json", ".html")):
            kill.hit("write")
        return replace(src, dst, *a, **kw)

    jobs._JobRun._record, jobs._JobRun._assemble, jobs.write_document = _record, _assemble, _write_document
    os.replace = _replace


def main(argv: list[str]) -> int:
    from fake_engine import EngineFactory  # by reference, so Ray workers can import it

    import pantheon_ocr.archive.run as job_run
    from pantheon_ocr.cli import main as cli_main

    config = json.loads(os.environ.get("PANTHEON_TEST_ENGINE", "{}"))
    kill = None
    if os.environ.get("PANTHEON_TEST_KILL"):
        point, n = os.environ["PANTHEON_TEST_KILL"].split(":")
        kill = _Counter(point, int(n))
        if point == "step":
            config["on_step"] = _StepKill(int(n))
    _install(kill, os.environ.get("PANTHEON_TEST_READY"))
    job_run.model_engine_factory = lambda spec: EngineFactory(**config)
    return cli_main(argv)


class _StepKill:
    def __init__(self, n: int):
        self.n = n

    def __call__(self, step: int) -> None:
        if step == self.n:
            _die()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ------------------------------------------------------------------- helpers for the tests

ROOT = TESTS.parent
HARNESS = Path(__file__).resolve()


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def write_job(folder: Path, top: dict | None = None, **sections: dict) -> Path:
    """job.toml in `folder`: inputs "in", output "out" unless given; sections as tables."""
    top = {"inputs": ["in"], "output": "out", **(top or {})}
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    sections.setdefault("ocr", {}).setdefault("render_workers", 1)
    if "text_layer" not in sections["ocr"]:  # the marked PDFs have a text layer; tested on its own
        sections["ocr"].setdefault("text_fallback", False)
    sections.setdefault("lock", {}).setdefault("stale_after", 10)
    for name, table in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path = folder / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def pdf(folder: Path, name: str, n_pages: int, doc_no: int) -> Path:
    from fake_engine import marked_pdf

    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(marked_pdf(n_pages, doc_no))
    return folder / name


def md_pages(text: str) -> list[tuple[int, str, str]]:
    """(page, marker, text) per `<!-- page N ... -->` block of an output Markdown file."""
    import re

    parts = re.split(r"^(<!-- page (\d+)[^\n]*-->)\n", text, flags=re.M)
    return [(int(parts[i + 1]), parts[i], parts[i + 2].strip("\n")) for i in range(1, len(parts) - 1, 3)]


def check_outputs(out: Path, expected: dict[str, tuple[int, int]], n_tokens: int | None = None) -> None:
    """Every page of every document exactly once, in order, with the text the engine gave."""
    from fake_engine import expected_text, md_body

    for name, (doc_no, n_pages) in expected.items():
        pages = md_pages(md_body(out / name))
        assert [p for p, _, _ in pages] == list(range(1, n_pages + 1)), f"{name}: pages {[p for p, _, _ in pages]}"
        for page, marker, text in pages:
            assert marker == f"<!-- page {page} -->" and text == expected_text(doc_no, page, n_tokens), (name, page, marker, text)


def temp_litter(*folders: Path) -> list[Path]:
    return [p for f in folders if f.exists() for p in f.rglob("*") if p.name.endswith(".tmp")]


def run_cli(args: list[str], env: dict | None = None, cwd: Path | None = None, timeout: float = 120):
    """The harness in a subprocess; returns the CompletedProcess."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(HARNESS), *args], env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


class Counting:
    """An engine factory (fake_engine.EngineFactory's, with its keywords) that counts the pages
    the engine was asked to read: what a resumed or rebuilt run did not read again."""

    def __init__(self, **kw):
        from fake_engine import EngineFactory

        self.factory, self.pages = EngineFactory(**kw), 0

    def __call__(self):
        engine, notes = self.factory()
        real = engine.prefill

        def prefill(features, sampling):
            self.pages += 1
            return real(features, sampling)

        engine.prefill = prefill
        return engine, notes
