"""engine/threads.py: the one place that sizes the math libraries' pools."""

from __future__ import annotations

import pytest

from pantheon_ocr.engine import threads


def test_torch_gets_the_count_even_when_openmp_already_reads_it(monkeypatch):
    """set_threads always hands torch its count: torch.get_num_threads() reads OpenMP's count, which
    threadpool_limits has just set, while torch's MKL keeps the count torch last gave it, so a check
    against get_num_threads left float32 GEMMs at 1 thread after a stage went from 1 to 2."""
    torch = pytest.importorskip("torch")
    before = threads.current() or threads.cpu_count()
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # what OpenMP says after threadpool_limits(2)
    try:
        threads.set_threads(1)
        threads.set_threads(2)
        assert calls == [1, 2]
    finally:
        monkeypatch.undo()
        threads.set_threads(before)


def test_overlap_pays_off_the_cpu_or_with_a_small_tower():
    """`--overlap` at its default: the vision stage overlaps where it runs on a GPU or Core ML, or
    its tower is small; a large tower on the CPU runs in whole-core phases (loader.overlap_pays)."""
    from pantheon_ocr.engine.loader import SMALL_PARAMS, overlap_pays

    large, small = 400_000_000, 7_600_000
    assert not overlap_pays("cpu", large)
    assert overlap_pays("cpu", small) and overlap_pays("cuda:0", large) and overlap_pays("coreml:ALL", large)
    assert not overlap_pays("cpu", None) and not overlap_pays("cpu", SMALL_PARAMS)


def _tree(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


@pytest.fixture
def sixty_four_cores(monkeypatch):
    """A big host's affinity mask, as a container sees it."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)


def test_a_cgroup_v2_quota_limits_the_cores_to_the_lowest_level(tmp_path, sixty_four_cores):
    """A container given 1.5 CPUs on a 64-core host sees 64 in its mask; 64 BLAS threads on 1.5 CPUs'
    time take turns. The lowest quota along the group's path counts, rounded up."""
    root = _tree(tmp_path, {"proc/self/cgroup": "0::/user.slice/job\n",
                            "sys/fs/cgroup/user.slice/cpu.max": "150000 100000\n",
                            "sys/fs/cgroup/user.slice/job/cpu.max": "max 100000\n"})
    assert threads.cgroup_cpus(root) == 1.5
    assert threads.cores(root) == (2, "the CPU time its control group allows: 1.5 of the 64 cores it sees")


def test_a_cgroup_v1_quota_at_the_container_s_own_mount_counts(tmp_path, sixty_four_cores):
    """Docker on cgroup v1: /proc/self/cgroup names the host's path, which does not exist inside the
    container, whose own group is mounted at the hierarchy's root."""
    root = _tree(tmp_path, {"proc/self/cgroup": "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
                            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
                            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_cpus(root) == 0.5
    assert threads.cores(root)[0] == 1  # never 0


@pytest.mark.parametrize("files", [
    {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "max 100000\n"},  # v2, no limit
    {"proc/self/cgroup": "4:cpu,cpuacct:/\n", "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
     "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},  # v1, no limit
    {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "garbage\n"},
    {"proc/self/cgroup": "not a cgroup line\n"},
    {},  # no /proc at all (another OS)
])
def test_no_quota_or_an_unreadable_one_leaves_the_affinity_mask(tmp_path, sixty_four_cores, files):
    root = _tree(tmp_path, files)
    assert threads.cgroup_cpus(root) is None
    assert threads.cores(root) == (64, "the cores this process may run on")


def test_a_quota_above_the_mask_leaves_the_mask(tmp_path, sixty_four_cores):
    root = _tree(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "10000000 100000\n"})
    assert threads.cgroup_cpus(root) == 100 and threads.cores(root)[0] == 64


def test_the_run_s_threads_default_to_the_quota_and_the_plan_says_so(monkeypatch, sixty_four_cores, tmp_path):
    """The default thread total (no --threads) is the quota's, and `auto`'s plan says it and why."""
    from pantheon_ocr.engine.loader import plan_auto
    from pantheon_ocr.options import EngineOptions

    monkeypatch.setattr(threads, "cgroup_cpus", lambda root="/": 2.0)
    monkeypatch.setattr(threads, "_total", threads._total)
    monkeypatch.setattr(threads, "_shared", threads._shared)
    assert threads.stage_threads(None, False) == 2 and threads.stage_threads(None, True) == 1
    model = tmp_path / "m.gguf"
    _, why = plan_auto(EngineOptions(model=str(model), mmproj=str(model), weights="f32", vision_backend="numpy"))
    assert why == ["threads: 2 (the CPU time its control group allows: 2 of the 64 cores it sees)"]
    _, why = plan_auto(EngineOptions(model=str(model), mmproj=str(model), weights="f32", vision_backend="numpy",
                                     threads=3))
    assert why == []  # asked for: nothing chosen
