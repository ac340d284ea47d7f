"""Nightly archive jobs: a job file, resumable state, a report per run.

    spec.py     the job file (TOML) -> a validated, frozen JobSpec
    state.py    the job's SQLite state: the only module that knows the schema
    plan.py     which documents are new, changed or unchanged; repairs after a stop
    run.py      run_job: lock -> plan -> rounds of pages -> write -> report -> unlock
    report.py   the JSON summary and the self-contained HTML page of a run
    ray.py      the same rounds on Ray actors (the driver keeps state and writes)
"""
