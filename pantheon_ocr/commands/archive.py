"""`pantheon-ocr archive run|status JOB.toml`: nightly archive jobs (the library: pantheon_ocr/archive)."""

from __future__ import annotations

import json
import time

import click

from ..errors import ExitCode, UsageError
from .common import count, count_by, show_progress, stop_signals_as_interrupt


@click.group()
def archive() -> None:
    """Nightly archive jobs: a TOML job file, resumable state in SQLite, a report per run."""


def make_executor(spec, engine_factory, ray_address: str | None, ray_workers: int | None):
    if ray_address is None:
        from ..archive.run import LocalExecutor

        return LocalExecutor(engine_factory)
    from ..archive.ray import RayExecutor

    r = spec.ray
    return RayExecutor(engine_factory, address=ray_address, workers=ray_workers or r.workers,
                       cpus_per_worker=r.cpus_per_worker, chunk_pages=r.chunk_pages)


@archive.command("run")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="Run the pages on a Ray cluster: 'local' starts one here, 'auto' or HOST:PORT joins one "
                   "(default: [ray] address in the job file, else this machine without Ray).")
@click.option("--ray-workers", type=click.IntRange(1), help="Ray workers (one engine each); default: all CPUs / cpus_per_worker.")
@click.option("--no-ray", is_flag=True, help="Ignore [ray] address in the job file and run here.")
@click.option("--retry-failed", is_flag=True, help="Also redo pages and documents recorded as failed.")
@click.option("--reread", is_flag=True, help="Read every document again, done ones too (after the model or the reading "
                                             "settings changed: a run says so).")
@click.option("--rebuild-state", is_flag=True,
              help="Set a damaged job state aside and rebuild it from the outputs (pages whose output is intact are not OCR'd again).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal, not under -q).")
def run(job, ray_address, ray_workers, no_ray, retry_failed, reread, rebuild_state, progress) -> None:
    """Run JOB.toml: new and changed documents are OCR'd, unfinished pages resumed."""
    if no_ray and (ray_address or ray_workers):  # which one was meant is not ours to guess
        raise UsageError(f"--no-ray contradicts {'--ray' if ray_address else '--ray-workers'}: give one of them")
    from ..archive import run as job_run
    from ..archive.report import run_lines
    from .progress import progress_bar

    spec = job_run.load_job(job)
    from ..engine.threads import set_threads, stage_threads

    # numpy's BLAS, OpenMP, and torch whenever it loads: the job's total, shared by the stages
    set_threads(stage_threads(spec.model.engine.threads, spec.ocr.overlap))
    address = None if no_ray else ray_address or spec.ray.address
    if ray_workers and address is None:
        raise UsageError("--ray-workers runs on Ray: give --ray ADDRESS, or [ray] address in the job file")
    executor = make_executor(spec, job_run.model_engine_factory(spec), address, ray_workers)
    show = show_progress(progress, terminal_only=True)

    bar = progress_bar() if show else None

    def log(line: str) -> None:
        if bar is not None:  # a line of its own, not glued to the live line (redrawn at the next progress)
            bar.end()
        click.echo(line, err=True)

    with stop_signals_as_interrupt() as stopping:
        try:
            result = job_run.run_job(spec, executor=executor, retry_failed=retry_failed, on_progress=bar, log=log,
                                     rebuild_state=rebuild_state, reread=reread)
        finally:
            if bar is not None:
                bar.end()
        if result.exit_code == ExitCode.INTERRUPTED:
            stopping.note()  # more SIGTERMs while its lines are printed pass, whoever saw the first
        for line in run_lines(result):
            click.echo(line, err=True)
    click.get_current_context().exit(int(result.exit_code))


@archive.command("status")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def status(job, as_json) -> None:
    """Summarise JOB.toml's state: documents and pages by status, last runs, failures."""
    from ..archive.report import failure_line, job_status
    from ..archive.wording import failures_heading
    from ..archive.spec import load_job

    info = job_status(load_job(job))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"job {info['job']} ({info['job_file']})\nstate: {info['state']}")
    if not info["runs"]:
        click.echo("no runs yet")
        return

    click.echo(f"documents: {count_by(dict(sorted(info['documents'].items())), 'document')}"
               + (f" ({info['not_in_last_run']} not among the last run's inputs)" if info.get("not_in_last_run") else ""))
    click.echo(f"pages: {count_by(dict(sorted(info['pages'].items())), 'page')}")
    if info["running"]:
        r = info["running"]
        state = "stale lock (that run is gone; the next run takes over)" if r["stale"] else "running now"
        click.echo(f"{state}: run {r['run']}, pid {r['pid']} on {r['host']}, heartbeat {time.time() - r['heartbeat']:.0f} s ago")
    for r in info["runs"][:3]:
        t = r["totals"]
        took = f"{(r['finished'] or time.time()) - r['started']:.0f} s"
        click.echo(f"run {r['id']}: {time.strftime('%Y-%m-%d %H:%M', time.localtime(r['started']))} {r['status']}"
                   + ("" if r["exit_code"] is None else f" (exit {r['exit_code']})")
                   + (f", {count(t.get('pages', 0), 'page')}, {count(t.get('tokens', 0), 'token')} in {took}" if t else "")
                   + (f"; report {r['report_html']}" if r["report_html"] else ""))
    if info["failures"]:
        click.echo(f"{failures_heading(info['failures'])}:")
        for f in info["failures"]:
            click.echo(f"  {failure_line(f)}")


@archive.command("report")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--run", "run_id", type=click.IntRange(1), help="The run (default: the latest).")
def report(job, run_id) -> None:
    """Write a run's JSON and HTML report again from the job's state (into its reports folder)."""
    from ..archive.report import rewrite_report
    from ..archive.spec import load_job

    for path in rewrite_report(load_job(job), run_id):
        click.echo(f"wrote {path}")
