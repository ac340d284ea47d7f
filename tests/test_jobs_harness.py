"""Test entry point: the real `pantheon-ocr` CLI over a FakeEngine, with kill -9 injection.
(No tests here; pytest collects nothing from this file.)

    python tests/test_jobs_harness.py archive run JOB.toml --no-progress

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_engine import FakeEngine, FakeSeq  # noqa: E402


class SamplingEngine(FakeEngine):
    """FakeEngine whose chosen pages loop while the temperature is below a threshold, so a
    retry with a hotter setting gets out of the loop (or never, without a threshold).
    `loops`: [doc, page] (always loops) or [doc, page, below]."""

    def __init__(self, loops=(), fail_vision=(), **kw):
        failing = {tuple(p) for p in fail_vision}
        super().__init__(fail_vision=lambda f: (f.doc, f.page) in failing, **kw)
        self.loop_below = {(x[0], x[1]): (x[2] if len(x) > 2 else float("inf")) for x in loops}
        self.samplings: list[tuple[int, int, float, int]] = []

    def prefill(self, features, sampling):
        if self.fail_prefill(features):
            raise ValueError(f"fake prefill failure on doc {features.doc} page {features.page}")
        with self.lock:
            self.prefills.append((features.doc, features.page))
            self.samplings.append((features.doc, features.page, sampling.temperature, sampling.seed))
        loops = sampling.temperature < self.loop_below.get((features.doc, features.page), -1.0)
        return FakeSeq(features, self.n_tokens(features), sampling.max_tokens, loops, self.loop_limit)


class EngineFactory:
    """Picklable (Ray workers build their own engine from it)."""

    def __init__(self, n_tokens: int | None = None, step_sleep: float = 0.0, loops=(), fail_vision=(), on_step=None):
        self.n_tokens, self.step_sleep, self.loops = n_tokens, step_sleep, loops
        self.fail_vision, self.on_step = fail_vision, on_step

    def __call__(self) -> SamplingEngine:
        kw = {} if self.n_tokens is None else {"n_tokens": lambda f, n=self.n_tokens: n}
        return SamplingEngine(loops=self.loops, fail_vision=self.fail_vision, step_sleep=self.step_sleep,
                              on_step=self.on_step, **kw)


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
    import pantheon_ocr.jobs as jobs

    record, assemble, write_document, replace = jobs._JobRun._record, jobs._JobRun._assemble, jobs.write_document, os.replace
    n_recorded = [0]

    def _record(self, result):
        before = len(self.attempts)
        record(self, result)
        if len(self.attempts) > before:
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
    from test_jobs_harness import EngineFactory as Factory  # by reference, so Ray workers can import it

    import pantheon_ocr.commands.archive as archive
    from pantheon_ocr.cli import main as cli_main

    config = json.loads(os.environ.get("PANTHEON_TEST_ENGINE", "{}"))
    kill = None
    if os.environ.get("PANTHEON_TEST_KILL"):
        point, n = os.environ["PANTHEON_TEST_KILL"].split(":")
        kill = _Counter(point, int(n))
        if point == "step":
            config["on_step"] = _StepKill(int(n))
    _install(kill, os.environ.get("PANTHEON_TEST_READY"))
    archive.make_engine = lambda spec: Factory(**config)
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

ROOT = Path(__file__).resolve().parent.parent
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
    from fake_engine import expected_text

    for name, (doc_no, n_pages) in expected.items():
        pages = md_pages((out / name).read_text())
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
