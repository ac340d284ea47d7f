"""The archive job on Ray (a local instance the test starts): same outputs and state as on one
machine, retries with changed sampling through the workers, a changed document redone, and the
CLI's `--ray local`. Skipped when Ray is not installed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'pantheon-ocr[ray]' runs the scale-out tests")

from fake_engine import SAMPLES, EngineFactory, md_body  # noqa: E402
from pantheon_ocr.archive.ray import RayExecutor  # noqa: E402
from pantheon_ocr.archive.run import load_job, run_job  # noqa: E402
from pantheon_ocr.errors import ExitCode  # noqa: E402

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
