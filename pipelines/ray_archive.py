#!/usr/bin/env python3
"""Run an archive job on a Ray cluster from a script (the library API behind
`pantheon-ocr archive run JOB.toml --ray ADDRESS`).

    python pipelines/ray_archive.py JOB.toml --address auto --workers 8 --cpus-per-worker 4

The driver (this process) owns the job's SQLite state, the lock, the outputs and the report;
Ray actors, one engine each, only OCR pages (see pantheon_ocr/jobs_ray.py). Run it on a node
that sees the job's inputs and output folder; the model files must be at the same path on
every node. Exit codes are the CLI's (pantheon_ocr.errors.ExitCode).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", help="the job file (TOML)")
    ap.add_argument("--address", default="auto", help="Ray address: auto, HOST:PORT, ray://HOST:10001, or 'local' (default: auto)")
    ap.add_argument("--workers", type=int, help="Ray actors, one engine each (default: cluster CPUs / cpus-per-worker)")
    ap.add_argument("--cpus-per-worker", type=float, help="CPUs reserved per actor (default: [ray] cpus_per_worker, 1)")
    ap.add_argument("--chunk-pages", type=int, help="pages per call to an actor (default: [ray] chunk_pages, 16)")
    ap.add_argument("--retry-failed", action="store_true", help="also redo pages and documents recorded as failed")
    args = ap.parse_args(argv)

    import click

    from pantheon_ocr.commands.archive import make_engine, print_run
    from pantheon_ocr.errors import ExitCode, PantheonError
    from pantheon_ocr.jobs import load_job, run_job
    from pantheon_ocr.jobs_ray import RayExecutor

    try:
        spec = load_job(args.job)
        executor = RayExecutor(
            make_engine(spec), address=args.address, workers=args.workers or spec.ray["workers"],
            cpus_per_worker=args.cpus_per_worker or spec.ray["cpus_per_worker"],
            chunk_pages=args.chunk_pages or spec.ray["chunk_pages"],
        )
        result = run_job(spec, executor=executor, retry_failed=args.retry_failed, log=lambda s: click.echo(s, err=True))
    except PantheonError as e:
        click.echo(f"error: {e}", err=True)
        return int(e.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    print_run(result)
    return int(result.exit_code)


if __name__ == "__main__":
    sys.exit(main())
