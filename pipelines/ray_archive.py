#!/usr/bin/env python3
"""Run an archive job on a Ray cluster from a script (the library API behind
`pantheon-ocr archive run JOB.toml --ray ADDRESS`).

    python pipelines/ray_archive.py JOB.toml --address auto --workers 8 --cpus-per-worker 4

The driver (this process) owns the job's SQLite state, the lock, the outputs and the report;
Ray actors, one engine each, only OCR pages (see pantheon_ocr/archive/ray.py). Run it on a node
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

    from pantheon_ocr.archive import run as job_run
    from pantheon_ocr.archive.ray import RayExecutor
    from pantheon_ocr.archive.report import run_lines
    from pantheon_ocr.errors import ExitCode, PantheonError

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        spec = job_run.load_job(args.job)
        executor = RayExecutor(
            job_run.model_engine_factory(spec), address=args.address, workers=args.workers or spec.ray.workers,
            cpus_per_worker=args.cpus_per_worker or spec.ray.cpus_per_worker,
            chunk_pages=args.chunk_pages or spec.ray.chunk_pages,
        )
        result = job_run.run_job(spec, executor=executor, retry_failed=args.retry_failed, log=log)
    except PantheonError as e:
        log(f"error: {e}")
        return int(e.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    for line in run_lines(result):
        log(line)
    return int(result.exit_code)


if __name__ == "__main__":
    sys.exit(main())
