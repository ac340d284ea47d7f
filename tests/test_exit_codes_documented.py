"""The exit codes are documented where people look for them, and agree: the README table,
pipelines/nightly.sh (what cron mails) and errors.ExitCode."""

from __future__ import annotations

import re
from pathlib import Path

from pantheon_ocr.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent


def test_readme_table_lists_every_exit_code():
    table = re.findall(r"^\| (\d+) \| (.+) \|$", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.M)
    assert sorted(int(code) for code, _ in table) == sorted(int(c) for c in ExitCode)
    meaning = {int(code): text for code, text in table}
    assert "lock" in meaning[ExitCode.JOB_LOCKED] and "cannot be written" in meaning[ExitCode.CANNOT_WRITE]


def test_nightly_script_names_the_same_codes():
    header = "".join(line for line in (ROOT / "pipelines" / "nightly.sh").read_text().splitlines(True)
                     if line.startswith("#"))
    for code in ExitCode:
        assert re.search(rf"\b{int(code)} ", header), f"nightly.sh does not mention exit code {int(code)}"
    assert re.search(r"\b75 still running", header) and not re.search(r"\b2 [^,]*running", header)
