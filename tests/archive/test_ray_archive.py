"""The archive job on Ray (a local instance the test starts): same outputs and state as on one
machine, retries with changed sampling through the workers, a changed document redone, and the
CLI's `--ray local`. Skipped when Ray is not installed."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'pantheon-ocr[ray]' runs the scale-out tests")

from fake_engine import SAMPLES, DieOnce, EngineFactory, md_body  # noqa: E402
from pantheon_ocr.archive.ray import RayExecutor  # noqa: E402
from pantheon_ocr.archive.run import load_job, run_job  # noqa: E402
from pantheon_ocr.errors import ExitCode, NetworkError  # noqa: E402

from .harness import check_outputs, md_pages, pdf, run_cli, temp_litter, write_job  # noqa: E402

TESTS = str(Path(__file__).resolve().parent.parent)
# Ray workers import the FakeEngine factory from tests/ (and pantheon_ocr, installed)
WORKER_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
LOOPS = [[1, 2, 0.4], [2, 3]]  # doc 1 page 2 comes good on the third attempt, doc 2 page 3 never


def make_inputs(folder: Path) -> Path:
    pdf(folder / "in", "a.pdf", 5, 1)
    pdf(folder / "in", "b.pdf", 3, 2)
    pdf(folder / "in", "c.pdf", 2, 3)
    shutil.copy(SAMPLES / "bad" / "corrupt.pdf", folder / "in" / "corrupt.pdf")
    return write_job(folder, ocr={"batch_size": 2, "formats": ["md", "jsonl"]})


def test_cli_ray_local(tmp_path):
    """`archive run --ray local` starts its own Ray instance (before the fixture below starts one here)."""
    job = make_inputs(tmp_path)
    env = {**WORKER_ENV, "PANTHEON_TEST_ENGINE": json.dumps({"loops": LOOPS})}
    r = run_cli(["archive", "run", str(job), "--ray", "local", "--ray-workers", "2", "--no-progress"], env=env, timeout=300)
    assert r.returncode == ExitCode.PAGES_FAILED, r.stderr
    assert "run 1 of job 'job' finished" in r.stderr
    check_outputs(tmp_path / "out", {"a.md": (1, 5), "c.md": (3, 2)})
    assert json.loads((tmp_path / "job-reports" / "run-0001.json").read_text())["executor"] == "ray"


def test_sigterm_stops_a_run_on_ray_cleanly(tmp_path):
    """ray.init took SIGTERM over: the driver aborted (134), no report, the run left 'running'
    with its lock. Now as on one machine: 130, the run recorded, the lock released."""
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    make_inputs(tmp_path)
    # pages come back one at a time (a chunk's pages all come at once): the signal lands mid-run
    job = write_job(tmp_path, ocr={"batch_size": 2}, ray={"chunk_pages": 1})
    ready = tmp_path / "ready"
    env = {**os.environ, **WORKER_ENV, "PANTHEON_TEST_ENGINE": json.dumps({"n_tokens": 6, "step_sleep": 0.2}),
           "PANTHEON_TEST_READY": str(ready)}
    harness = Path(__file__).resolve().parent / "harness.py"
    proc = subprocess.Popen([sys.executable, str(harness), "archive", "run", str(job), "--ray", "local", "--ray-workers",
                             "1", "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not ready.exists() and proc.poll() is None:
        assert time.monotonic() - t0 < 240, "no page recorded"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    db = sqlite3.connect((tmp_path / "job.sqlite").as_uri() + "?mode=ro", uri=True)
    try:
        assert db.execute("SELECT status, exit_code FROM runs").fetchall() == [("interrupted", 130)]
        assert db.execute("SELECT count(*) FROM lock").fetchall() == [(0,)]
    finally:
        db.close()
    assert (tmp_path / "job-reports" / "run-0001.json").exists()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": WORKER_ENV})
    yield ray
    ray.shutdown()


def test_same_job_on_ray_as_on_one_machine(tmp_path, local_ray):
    local_job, ray_job = make_inputs(tmp_path / "local"), make_inputs(tmp_path / "ray")
    local = run_job(load_job(local_job), EngineFactory(loops=LOOPS))
    executor = RayExecutor(EngineFactory(loops=LOOPS), workers=2, chunk_pages=2)
    on_ray = run_job(load_job(ray_job), executor=executor)
    assert len({pid for _, pid in executor.placement}) == 2 and os.getpid() not in {pid for _, pid in executor.placement}
    assert on_ray.exit_code == local.exit_code == ExitCode.PAGES_FAILED
    for name in ("a.md", "b.md", "c.md"):
        assert md_body(tmp_path / "ray" / "out" / name) == md_body(tmp_path / "local" / "out" / name)  # (sources differ)
    check_outputs(tmp_path / "ray" / "out", {"a.md": (1, 5), "c.md": (3, 2)})
    assert md_pages(md_body(tmp_path / "ray" / "out" / "b.md"))[2][1].startswith("<!-- page 3 failed: the model kept repeating")
    strip = [{k: v for k, v in f.items() if k != "path"} for f in local.summary["failures"]]
    assert [{k: v for k, v in f.items() if k != "path"} for f in on_ray.summary["failures"]] == strip
    retries = sorted((r["page"], r["attempt"], r["temperature"], r["seed"], r["outcome"]) for r in on_ray.summary["retries"])
    assert retries == sorted((r["page"], r["attempt"], r["temperature"], r["seed"], r["outcome"]) for r in local.summary["retries"])
    assert on_ray.summary["pages"]["attempted"] == local.summary["pages"]["attempted"] == 10 + 2 * 2
    assert not temp_litter(tmp_path / "ray")
    # next night on Ray: unchanged documents skipped, a changed one redone
    pdf(tmp_path / "ray" / "in", "c.pdf", 3, 4)
    executor = RayExecutor(EngineFactory(), workers=2, chunk_pages=2)
    again = run_job(load_job(ray_job), executor=executor)
    assert again.summary["documents"] == {"unchanged": 2, "skipped (unreadable)": 1, "changed": 1, "written": 1}
    assert again.summary["pages"]["attempted"] == 3 and again.exit_code == ExitCode.OK
    check_outputs(tmp_path / "ray" / "out", {"a.md": (1, 5), "c.md": (4, 3)})


def test_a_page_that_kills_its_worker_every_time_fails_and_the_night_goes_on(tmp_path, local_ray):
    """A page whose reading kills the worker each time (the OOM killer on one huge scan) is
    charged a try per death, the chunk behind it in the worker's queue none: after three its
    pages fail, as a page does, and the other documents are read. A worker Ray is restarting is
    sent nothing until it answers, so no try goes on 'restarting'."""
    make_inputs(tmp_path)
    job = write_job(tmp_path, ocr={"batch_size": 2, "formats": ["md", "jsonl"]}, retry={"attempts": 1})
    executor = RayExecutor(EngineFactory(kills=[(2, 2)]), workers=2, chunk_pages=1)
    result = run_job(load_job(job), executor=executor)
    poisoned = [f for f in result.summary["failures"] if f.get("page") == 2 and f["path"].endswith("b.pdf")]
    assert len(poisoned) == 1 and "Ray worker failed 3 times on it" in poisoned[0]["reason"], result.summary["failures"]
    check_outputs(tmp_path / "out", {"a.md": (1, 5), "c.md": (3, 2)})
    assert md_pages(md_body(tmp_path / "out" / "b.md"))[1][1].startswith("<!-- page 2 failed: Ray worker failed 3 times")
    # a worker killed at the end (restarting then, its shutdown not heard) leaves its copies to the
    # next worker on the node, as one dead for good does: not to the next test's count
    import tempfile

    from pantheon_ocr.archive.ray import CACHE_PREFIX, _sweep_caches
    from pantheon_ocr.archive.sqlite import pid_alive

    for _ in range(100):
        left = [p.name for p in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*-*")]
        if not any(pid_alive(int(name[len(CACHE_PREFIX):].split("-")[0])) for name in left):
            break
        time.sleep(0.1)
    _sweep_caches()


def test_pipeline_script(tmp_path, local_ray, monkeypatch, capsys):
    """pipelines/ray_archive.py over the Ray instance already running in this process."""
    import importlib.util

    import pantheon_ocr.archive.run as job_run

    spec = importlib.util.spec_from_file_location("ray_archive", Path(__file__).resolve().parents[2] / "pipelines" / "ray_archive.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(job_run, "model_engine_factory", lambda job_spec: EngineFactory())
    job = make_inputs(tmp_path)
    assert script.main([str(job), "--workers", "2", "--chunk-pages", "3"]) == ExitCode.PAGES_FAILED
    assert "run 1 of job 'job' finished: 4 documents (4 new); 1 failed (unreadable), 3 written" in capsys.readouterr().err
    check_outputs(tmp_path / "out", {"a.md": (1, 5), "b.md": (2, 3), "c.md": (3, 2)})
    assert script.main([str(tmp_path / "missing.toml")]) == ExitCode.BAD_ARGUMENTS


@pytest.mark.parametrize("restart", [0.0, 4.0])
def test_a_worker_that_dies_costs_no_attempt_and_changes_no_text(tmp_path, local_ray, restart):
    """A worker killed mid-chunk (the OOM killer, kill -9): its chunk goes again, the same attempt
    with the same sampling, so the night ends as on one machine. It used to fail the chunk's pages
    as an attempt each (three such nights: failed for good) and read them again hotter. A worker
    slow to come back (`restart` s: a busy node) says "restarting" meanwhile, and that is no lost
    call: the chunk sent back at once spent its tries on it, its pages failed as an attempt each."""
    local_job, ray_job = make_inputs(tmp_path / "local"), make_inputs(tmp_path / "ray")
    local = run_job(load_job(local_job), EngineFactory(loops=LOOPS))
    factory = EngineFactory(loops=LOOPS, on_step=DieOnce(str(tmp_path / "died")), slow_restart=restart)
    executor = RayExecutor(factory, workers=2, chunk_pages=2)
    seen = []
    on_ray = run_job(load_job(ray_job), executor=executor, on_progress=seen.append)
    assert (tmp_path / "died").exists()  # a worker did die
    # progress as on one machine: documents finish (a line each round in a log), the last says all done
    assert {o.doc.path.name for p in seen for o in p.finished} == {"a.pdf", "b.pdf", "c.pdf"}
    assert (seen[-1].pages_done, seen[-1].docs_done) == (seen[-1].pages_total, seen[-1].docs_total)
    assert on_ray.exit_code == local.exit_code
    assert on_ray.summary["pages"]["attempted"] == local.summary["pages"]["attempted"]
    for name in ("a.md", "b.md", "c.md"):
        assert md_body(tmp_path / "ray" / "out" / name) == md_body(tmp_path / "local" / "out" / name)
    # the dead worker's copies of its inputs went with the worker that took its place
    import tempfile

    from pantheon_ocr.archive.ray import CACHE_PREFIX
    from pantheon_ocr.archive.sqlite import pid_alive

    left = [p.name for p in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*-*")]
    assert all(pid_alive(int(name[len(CACHE_PREFIX):].split("-")[0])) for name in left), left


def test_more_workers_than_fit_start_those_that_fit(local_ray):
    """--ray-workers 5 on 2 CPUs waited for ever for actors no node could take."""
    executor = RayExecutor(EngineFactory(), workers=5)
    try:
        executor._start(local_ray)
        assert len(executor.actors) == 2 and "5 Ray workers asked for, 2 fit" in executor.notes[0]
    finally:
        executor.close()


def test_an_address_that_does_not_answer_is_said_at_once():
    """ray.init retried for five minutes, the lock held, printing C++ lines."""
    from pantheon_ocr.archive.ray import _reachable

    with pytest.raises(NetworkError, match=r"^the Ray cluster at 127.0.0.1:1: cannot be reached: ") as caught:
        _reachable("127.0.0.1:1")
    assert caught.value.exit_code == ExitCode.NETWORK
    _reachable("auto")  # left to Ray


def test_an_address_that_accepts_but_stays_silent_is_said(monkeypatch):
    """A port that accepts and says nothing (a stopped head's forwarded port, a listener of
    another kind) hung ray.init for minutes: a Ray head's GCS sends HTTP/2's SETTINGS at once."""
    import socket

    from pantheon_ocr.archive import ray as ray_jobs

    monkeypatch.setattr(ray_jobs, "REPLY_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as server:  # the kernel accepts; nobody answers
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(NetworkError, match=rf"^the Ray cluster at {address}: accepts connections but said "
                                               r"nothing in 0.3 s, where a Ray head answers at once") as caught:
            ray_jobs._reachable(address)
    assert caught.value.exit_code == ExitCode.NETWORK


def test_an_address_where_another_server_answers_is_said_at_once(local_ray):
    """A web server's port (the dashboard's, say) hung ray.init as a dead address did: the address
    is asked HTTP/2's opening first, which Ray's GCS (gRPC) answers and a web server does not."""
    import http.server
    import threading

    from pantheon_ocr.archive.ray import _reachable

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{web.server_address[1]}"
        with pytest.raises(NetworkError, match=rf"^the Ray cluster at {address}: answers, but not as a Ray cluster does "
                                               r"\(it said '<!DOCTYPE HTML>'\): is this the head's --port") as caught:
            _reachable(address)
        assert caught.value.exit_code == ExitCode.NETWORK
    finally:
        web.shutdown()
        web.server_close()
    _reachable(local_ray.get_runtime_context().gcs_address)  # the cluster's own address passes
