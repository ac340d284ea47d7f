"""What an archive run did and what a job's state says: the JSON summary and HTML page of each
run (report_html.py draws it), the lines a run prints when it ends, and `job_status`."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import JobError, WriteError, path_text
from ..pipeline.outputs import atomic_write_text, make_folder
from ..pipeline.types import STAGES
from .lock import JobLocked, lock_is_stale
from .report_html import render_html
from .sqlite import translate
from .wording import count as _count
from .wording import UNREADABLE_PATH, documents_line, failures_heading
from .state import JobState


@dataclass
class RunLog:
    """What a run did, as its report tells it."""

    t0: float = field(default_factory=time.time)
    events: Counter = field(default_factory=Counter)  # documents: new, changed, unchanged, written, ...
    lists: dict = field(default_factory=dict)  # the same events: which documents (paths)
    failures: list[dict] = field(default_factory=list)  # final failures of this run
    attempts: list[dict] = field(default_factory=list)  # every page attempt of this run, in order
    notes: list[str] = field(default_factory=list)

    def document(self, event: str, path) -> None:
        """A document was planned (new, changed, unchanged, skipped (unreadable)) or came out of the
        run (written, partial, failed (no page), write failed)."""
        self.events[event] += 1
        self.lists.setdefault(event, []).append(path_text(path))

    def fail(self, path: str, page: int | None, reason: str, attempts: int = 0, input_path: bool = False,
             short_of_memory: bool = False) -> None:
        """A failure of this run; input_path: a path the job's inputs name that is no document at
        all (missing, a FIFO, a link loop), counted apart from the documents; short_of_memory: a
        page that failed for lack of memory (the run exits 71)."""
        self.failures.append({"path": path_text(path), "page": page, "reason": reason, "attempts": attempts,
                              **({"input_path": True} if input_path else {}),
                              **({"short_of_memory": True} if short_of_memory else {})})
        if input_path:
            self.document(UNREADABLE_PATH, path)


def build_summary(spec, run_id: int, executor: str, log: RunLog, state_counts: dict, status: str, exit_code: int) -> dict:
    """The report's content for a finished (or stopped) run; state_counts: documents and pages
    by status after it (state.JobState.counts)."""
    now = time.time()
    attempts = log.attempts
    stages = {s: round(sum(a["seconds"][s] for a in attempts), 3) for s in STAGES}
    final = [a for a in attempts if a["outcome"] != "retry"]
    tokens = sum(a["n_tokens"] for a in attempts)
    return {
        "job": spec.name,
        "job_file": path_text(spec.path),
        "run": run_id,
        "host": socket.gethostname(),
        "executor": executor,
        "status": status,
        "exit_code": int(exit_code),
        "started": log.t0,
        "finished": now,
        "seconds": round(now - log.t0, 3),
        "documents": dict(log.events),
        "document_lists": {k: sorted(v) for k, v in log.lists.items()},
        "pages": {
            "attempted": len(attempts),
            "done": sum(a["outcome"] == "done" for a in attempts),
            "retried": sum(a["outcome"] == "retry" for a in attempts),
            "failed": sum(a["outcome"] == "failed" for a in attempts),
            "tokens": tokens,
            "pages_per_minute": round(len(final) / max(now - log.t0, 1e-9) * 60, 3),
            "tokens_per_second": round(tokens / max(now - log.t0, 1e-9), 3),
        },
        "stage_seconds": stages,
        "state": state_counts,
        "timeline": [[round(a["t"], 3), i + 1, a["outcome"]] for i, a in enumerate(attempts)],
        "failures": log.failures,
        "retries": [{k: a[k] for k in ("path", "page", "attempt", "temperature", "seed", "finish_reason", "error", "outcome")}
                    for a in attempts if a["attempt"] > 1 or a["outcome"] == "retry"],
        "notes": log.notes,
    }


_REPORT_NAME = re.compile(r"^run-(\d+)\.(?:json|html)$")


class ReportTaken(WriteError):
    """A run's report name already holds the report of another run: it is never written over."""


def last_report_run(folder: Path) -> int:
    """The highest N of the run-N.json/.html reports in `folder` (0 if none, or unreadable): the
    floor of the next run's number, since a new or rebuilt state may know fewer runs than these."""
    try:
        with os.scandir(folder) as entries:
            return max((int(m.group(1)) for e in entries if (m := _REPORT_NAME.match(e.name))), default=0)
    except OSError:
        return 0


REPORTS_HINT = "; remove it or point `reports =` in the job file elsewhere"


def write_reports(summary: dict, folder: Path, run_id: int, latest: bool = True) -> tuple[Path, Path]:
    """run-0007.json + run-0007.html, and latest.json/latest.html for bookmarks (latest=False: not
    those, for the report of a run that is not the newest); atomic. The folder is the job's to
    name (links on the way are followed); a symbolic link planted in the place of a report is
    refused, never written through (outputs.atomic_write_files). Raises ReportTaken, writing
    nothing, where run-0007 is the report of another run; WriteError naming the folder or file
    that cannot be written."""
    js = json.dumps(summary, indent=2, ensure_ascii=False)
    page = render_html(summary)
    paths = folder / f"run-{run_id:04d}.json", folder / f"run-{run_id:04d}.html"
    make_folder(folder, "reports folder", REPORTS_HINT)
    _refuse_another_run(paths, summary)
    files = [(paths[0], js + "\n"), (paths[1], page)] + ([(folder / "latest.json", js + "\n"), (folder / "latest.html", page)]
                                                        if latest else [])
    for path, text in files:
        try:
            atomic_write_text(path, text)
        except WriteError:
            raise  # a planted link: named already
        except OSError as e:
            raise WriteError(f"{path_text(path)}: cannot write the report: {e.strerror or e}") from None
    return paths


def _refuse_another_run(paths: tuple[Path, Path], summary: dict) -> None:
    """The run numbers of a state go on past every report (state.start_run): this is the last
    guard, for whatever still brings two runs to one number (two jobs sharing a reports folder,
    a state restored from an old backup). The same run's report may be written again (`archive
    report`): it is recognised by its job, run and start time."""
    js, html = paths
    if not os.path.lexists(js) and not os.path.lexists(html):
        return
    try:
        old = json.loads(js.read_text(encoding="utf-8"))
        same = [old.get(k) for k in ("job", "run", "started")] == [summary.get(k) for k in ("job", "run", "started")]
    except (OSError, ValueError, AttributeError):
        same = False  # a report we cannot read (or an HTML page alone) may be another run's
    if not same:
        raise ReportTaken(f"{path_text(js if os.path.lexists(js) else html)} is the report of another run (not this run {summary.get('run')} of job "
                          f"{summary.get('job')!r}); not writing over it")


def run_lines(result) -> list[str]:
    """What a finished run says to the person who started it: totals, notes, every failure
    and where the report is (one line each)."""
    s = result.summary
    p = s["pages"]
    lines = [f"run {s['run']} of job {s['job']!r} {s['status']}: {documents_line(s['documents'])}",
             f"pages: {p['done']:,} done, {p['retried']:,} retried, {p['failed']:,} failed; "
             f"{_count(p['tokens'], 'token')} in {s['seconds']:.1f} s"]
    lines += [f"note: {note}" for note in s["notes"]]
    if s["failures"]:
        lines.append(failures_heading(s["failures"]) + ":")
        lines += [f"  {failure_line(f)}" for f in s["failures"]]
    if result.report_html:
        lines.append(f"report: {result.report_html}")
    return lines


def failure_line(f: dict) -> str:
    """`path page N: reason` (or `path: reason` for a whole document)."""
    return f"{f['path']}{'' if f['page'] is None else ' page ' + str(f['page'])}: {f['reason']}"


def job_status(spec) -> dict:
    """Documents and pages by status, the last runs, current lock holder, final failures, for
    a spec.JobSpec; read-only, no lock taken (works while a run is going)."""
    out: dict[str, Any] = {"job": spec.name, "job_file": path_text(spec.path), "state": path_text(spec.state), "documents": {}, "pages": {},
                           "runs": [], "running": None, "failures": []}
    # Checked like a run checks it (a folder, a foreign or damaged file is an error); no file
    # yet means no runs yet. Nothing is written.
    state = JobState.open(spec.state, spec.path, create_new=False)
    if state is None:
        return out
    try:
        state.claim(spec.name, spec.path, write=False)
        out.update(state.counts())
        out["not_in_last_run"] = state.not_in_last_run()
        lock = state.read_lock()
        if lock is not None:
            out["running"] = {**lock.__dict__, "stale": lock_is_stale(lock, spec.lock.stale_after)}
        for r in state.recent_runs(5):
            run = {k: path_text(r[k]) if k.startswith("report_") and r[k] else r[k] for k in r.keys() if k != "summary"}
            # a run still "running" without a live lock was killed: the next run records it so
            if run["status"] == "running" and (lock is None or lock.run != run["id"] or out["running"]["stale"]):
                run["status"] = "killed"
            # a killed run wrote no summary: its totals come from the pages it recorded
            run["totals"] = _run_totals(r["summary"]) if r["summary"] else _recorded_totals(state, run)
            out["runs"].append(run)
        out["failures"] = [{**f, "path": path_text(f["path"])} for f in state.final_failures()]
        # input paths that are no document have no row in the state: the last run's report says them
        out["failures"] += _input_path_failures(state.run_summary(None))
    except sqlite3.Error as e:
        raise translate(spec.state, e, spec.path, "read") from None
    finally:
        state.close()
    return out


def rewrite_report(spec, run_id: int | None = None) -> tuple[Path, Path]:
    """Render a run's report again from the job state (run_id None: the latest run): its JSON
    and HTML files into the job's reports folder, as the run wrote them, and latest.* only if it is
    the newest run. JobError if there is no such run, or it stopped before its summary was
    recorded; WriteError naming what cannot be written."""
    state = JobState.open(spec.state, spec.path, create_new=False)
    if state is None:
        raise JobError(f"{path_text(spec.path)}: no runs yet (no job state at {path_text(spec.state)})")
    try:
        state.claim(spec.name, spec.path, write=False)
        found = state.run_summary(run_id)
        newest = state.run_summary(None)
        lock = state.read_lock()
    except sqlite3.Error as e:
        raise translate(spec.state, e, spec.path, "read") from None
    finally:
        state.close()
    if found is None:
        raise JobError(f"{path_text(spec.path)}: no run {run_id} in the job state" if run_id is not None
                       else f"{path_text(spec.path)}: no runs yet")
    rid, summary = found
    if not summary and lock is not None and lock.run == rid and not lock_is_stale(lock, spec.lock.stale_after):
        raise JobLocked(f"{path_text(spec.path)}: run {rid} is still running ({lock.describe()}): it writes its "
                        "report when it ends")
    if not summary:  # killed (kill -9, a power cut): what it recorded page by page is in the state
        raise JobError(f"{path_text(spec.path)}: run {rid} stopped before its report was recorded (killed?); "
                       f"`pantheon-ocr archive status {path_text(spec.path)}` shows the pages it recorded")
    # latest.* are the newest run's: an older run's report written again must not take them
    latest = rid >= max(newest[0] if newest else 0, last_report_run(spec.reports))
    return write_reports(json.loads(summary), spec.reports, rid, latest=latest)


def killed_run_said(state: JobState, run: int) -> str:
    """`; run 7 ended without a report, after 120 pages (3 failed): recorded, not read again, and
    counted in no report`: what a run that was killed (its lock found stale) had recorded, which no
    report counts; "" if nothing."""
    work = state.run_work(run)
    pages = work["done"] + work["failed"]
    if not pages:
        return ""
    return (f"; run {run} ended without a report, after {_count(pages, 'page')}"
            + (f" ({work['failed']:,} failed)" if work["failed"] else "") + ": recorded, not read again, and counted "
            "in no report")


def _input_path_failures(last: tuple[int, str | None] | None) -> list[dict]:
    """The last run's failures of input paths that are no document (they have no row in the state)."""
    try:
        failures = json.loads(last[1]).get("failures", []) if last and last[1] else []
        return [f for f in failures if isinstance(f, dict) and f.get("input_path")]
    except (ValueError, AttributeError):  # a summary that does not read: the rows' failures stand alone
        return []


def _recorded_totals(state: JobState, run: dict) -> dict:
    """A run without a summary: its totals from the attempts it recorded; a killed one ends at
    the last of them (`finished` set so: its time must not grow with the clock)."""
    work = state.run_work(run["id"])
    if run["status"] == "killed" and not run["finished"]:
        run["finished"] = work["last"] or run["started"]
    pages = work["done"] + work["failed"]
    return {"pages": pages, "tokens": work["tokens"], "seconds": (run["finished"] or time.time()) - run["started"]} if pages else {}


def _run_totals(summary: str | None) -> dict:
    if not summary:
        return {}
    s = json.loads(summary)
    return {"pages": s.get("pages", {}).get("attempted", 0), "tokens": s.get("pages", {}).get("tokens", 0), "seconds": s.get("seconds", 0)}
