"""How many threads the math libraries use: the one place that sets it.

`set_threads(n)` limits, at run time, every thread pool the process has loaded: the BLAS behind
numpy (OpenBLAS, MKL, BLIS) and OpenMP runtimes through threadpoolctl, and torch's intra-op pool
through torch.set_num_threads when torch is loaded (`torch_threads` again for a torch imported
later). Nothing here writes environment variables: a limit set before numpy loads would be read
once and then stick, and child processes would inherit it silently; a child that wants a count
calls set_threads itself (bench/isolation.py passes it along).

Why it matters: two stage threads (vision and the CPU stage) that each drive a BLAS using every
core oversubscribe the machine; on 2 cores that measured 94 s instead of 33 s for the same pages.
With the stages overlapping, each gets its share of the cores (`stage_threads`), and a stage
that runs while the other holds no work takes them all (`stage_share`).

torch's count is per OS thread (each thread keeps the count it had when it first used torch, and
set_num_threads changes the caller's only), so each stage thread sets its own; the BLAS count is
process-wide and follows the stage that started a unit of work last.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path

_chosen: int | None = None  # the last set_threads count: the process-wide BLAS count, torch's when it loads later
_shared = False  # that count is a stage's share of the run's threads (the stages overlap)
_total = 0  # the run's math threads in all (stage_threads)
_local = threading.local()  # .count: the calling thread's own (torch) count, as set_threads set it


def cpu_count() -> int:
    """Cores this process may use: the affinity mask (`taskset`, a cpuset), lowered to the CPU time
    its control groups allow (a container's `--cpus`), never the machine's total. A container given
    2 CPUs on a 64-core host sees 64 in its mask: 64 BLAS threads on 2 CPUs' time spin and take
    turns, the tenfold slowdown of oversubscription (docs/benchmarks.md)."""
    return cores()[0]


def cores(root: str = "/") -> tuple[int, str]:
    """cpu_count() and why, in words for `-v`; `root` stands for / (tests)."""
    try:
        mask = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mask = os.cpu_count() or 1
    quota = cgroup_cpus(root)
    if quota is not None and math.ceil(quota) < mask:
        return max(1, math.ceil(quota)), f"the CPU time its control group allows: {quota:g} of the {mask} cores it sees"
    return mask, "the cores this process may run on"


def cgroup_cpus(root: str = "/") -> float | None:
    """The CPUs' worth of time the process's control groups allow (quota / period), the lowest
    along its cgroup's path up to the hierarchy's root, or None where none is set or none can be
    read. cgroup v2 (`cpu.max`, "max 100000" when unlimited) and v1 (`cpu.cfs_quota_us`, -1 when
    unlimited, over `cpu.cfs_period_us`). In a container the hierarchy is mounted at its own group
    while /proc/self/cgroup may still name the host's path: each level that exists counts."""
    try:
        lines = Path(root, "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy id, controllers, path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: the unified hierarchy
            limits += _levels(Path(root, "sys/fs/cgroup"), path, _v2_limit)
        elif "cpu" in controllers.split(","):
            for mount in ("cpu,cpuacct", "cpuacct,cpu", "cpu"):
                limits += _levels(Path(root, "sys/fs/cgroup", mount), path, _v1_limit)
    return min(limits, default=None)


def _levels(mount: Path, path: str, limit) -> list[float]:
    """The limits set on the cgroup `path` and each group above it, as far as they exist under `mount`."""
    parts = [p for p in path.strip().split("/") if p]
    found = []
    for depth in range(len(parts), -1, -1):
        value = limit(mount.joinpath(*parts[:depth]))
        if value is not None:
            found.append(value)
    return found


def _v2_limit(group: Path) -> float | None:
    try:
        quota, period = (group / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(group: Path) -> float | None:
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None


def set_threads(threads: int) -> None:
    """Every loaded BLAS / OpenMP pool, and torch's if loaded, uses `threads` threads from now on."""
    from threadpoolctl import threadpool_limits

    global _chosen
    _chosen = _local.count = threads
    threadpool_limits(limits=threads)  # BLAS and OpenMP pools of every library loaded so far
    torch_threads()


def adopt_threads() -> None:
    """A new thread (a pipeline stage) takes the count set_threads last chose: OpenMP's and torch's
    counts are per thread, and a thread that never set one runs with every core whatever the plan."""
    if _chosen:
        set_threads(_chosen)


def current() -> int | None:
    """The count set_threads last set from the calling thread (None: never from this thread)."""
    return getattr(_local, "count", None)


def torch_threads() -> None:
    """Give torch, if loaded, the count set_threads chose (backends call it after importing
    torch; it never imports torch itself). Always set, never compared first: torch.get_num_threads()
    reads OpenMP's count, which threadpool_limits has just set, while torch's MKL keeps its own
    (per thread) that only torch.set_num_threads changes; skipped when OpenMP's matched, a process
    that once ran at 1 thread kept float32 GEMMs at 1 (a page's prefill 34.7 s instead of 19.8)."""
    torch = sys.modules.get("torch")
    if _chosen and torch is not None:
        torch.set_num_threads(_chosen)


def blas_env(threads: int) -> dict[str, str]:
    """Environment variables that start a separate program (a command a script runs, not this
    process or its Python children) with `threads` BLAS / OpenMP threads."""
    return {var: str(threads) for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def stage_threads(threads: int | None, overlap: bool | None, vision_on_cpu: bool = True) -> int:
    """Math threads per pipeline stage. `threads` is the run's total (default: every core this
    process may use): with the vision stage overlapping the CPU stage, each gets half, so the two
    busy at once never want more threads than the machine has (oversubscribed BLAS threads spin
    against each other: 94 s instead of 33 s for the same pages on 2 cores); one stage at a time
    gets them all, and so does the CPU stage beside a vision stage that computes elsewhere
    (`vision_on_cpu` False: a GPU; on an H100 machine's 16 cores, half of them made a page's prefill
    3.62 s against 3.00 with all, docs/benchmarks.md). A stage running while the other holds no work
    takes them all (stage_share). overlap None (left to the engine, not built yet) plans as
    overlapping on the CPU until `restage`."""
    global _shared, _total
    _total = threads or cpu_count()
    _shared = _shares(overlap, vision_on_cpu)
    return _half() if _shared else _total


def restage(overlap: bool, vision_on_cpu: bool = True) -> None:
    """The run's plan again once its stages know whether they overlap and where the vision
    computes (the pipeline, after the engine chose): every thread for the one stage at a time when
    they do not share the cores. A no-op when nothing changes or no plan was made (stage_threads
    never called)."""
    if _total and _shares(overlap, vision_on_cpu) != _shared:
        set_threads(stage_threads(_total, overlap, vision_on_cpu))


def _shares(overlap: bool | None, vision_on_cpu: bool) -> bool:
    """Whether the stages split the run's threads: they overlap (or may: None) and both compute here."""
    return overlap is not False and vision_on_cpu and _total > 1


def _half() -> int:
    return max(1, _total // 2)


def stage_share(alone: bool) -> None:
    """Called by an overlapping stage's thread before each unit of work (a page's vision, a decode
    step): the run's total when the other stage holds no work (`alone`), else half. The vision
    stage is alone when the CPU stage holds no page, which stays true for the whole page since
    the CPU stage gets pages only from it (one page on a CPU: vision with every core); the CPU
    stage is alone once the vision stage has finished its last page. A no-op unless the stages
    overlap, and cheap when nothing changes."""
    if not _shared:
        return
    want = _total if alone else _half()
    if current() != want or _chosen != want:
        set_threads(want)
