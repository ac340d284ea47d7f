"""One process per benchmark configuration: its own peak RSS (ru_maxrss) and its own thread
count (the child sets it with engine.threads.set_threads before it runs the benchmark).

    run_isolated("pantheon_ocr.bench.stages:bench_vision", {...}, threads=1)

runs `python -m pantheon_ocr.bench.isolation PAYLOAD` and reads back the function's dict.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..engine.threads import cpu_count, set_threads
from ..errors import ExitCode, PantheonError

_RESULT_MARK = "@@bench-result@@ "
_ERROR_MARK = "@@bench-error@@ "


def rss_now_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def run_isolated(func: str, kwargs: dict[str, Any], threads: int | None = None, isolate: bool = True) -> dict:
    """Call `module:function(**kwargs)` in a fresh Python process (own peak RSS, own BLAS thread
    count) and return its dict, with peak_rss_mb, load average and wall seconds added. With
    isolate=False it runs in this process (tests; peak RSS is then this process's)."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    if not isolate:
        result = _call(func, kwargs)
        result["peak_rss_mb"] = peak_rss_mb()
    else:
        payload = json.dumps({"func": func, "kwargs": kwargs, "threads": threads})
        # the child's temp files go in a folder of ours, removed even when the child was killed
        with tempfile.TemporaryDirectory(prefix="pantheon-bench-child-") as scratch:
            proc = _run_child([sys.executable, "-m", "pantheon_ocr.bench.isolation", payload], {"TMPDIR": scratch})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_MARK)]
        errors = [ln for ln in proc.stdout.splitlines() if ln.startswith(_ERROR_MARK)]
        if errors:  # a typed error (a bad model file, a setting that cannot work): said as in-process
            raise _rebuilt(errors[-1][len(_ERROR_MARK):])
        if proc.returncode != 0 or not lines:
            raise ChildFailed(_why(proc), proc.returncode == -signal.SIGKILL)
        result = json.loads(lines[-1][len(_RESULT_MARK):])
    result["threads"] = threads or "default"
    result["load_avg_before"] = round(load0, 2)
    result["load_avg_after"] = round(os.getloadavg()[0], 2)
    result["wall_s"] = time.perf_counter() - t0
    return result


class ChildFailed(PantheonError):
    """A benchmark child ended without its result: killed (the OOM killer's SIGKILL, say: 71) or
    crashed (70). `bench pages` reports that configuration as failed and runs the others."""

    def __init__(self, why: str, killed: bool):
        super().__init__(why)
        self.exit_code = ExitCode.OUT_OF_RESOURCES if killed else ExitCode.INTERNAL


def _why(proc: subprocess.CompletedProcess) -> str:
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else str(-proc.returncode)
        return f"killed by {name}" + (" (out of memory? `dmesg` says)" if proc.returncode == -signal.SIGKILL else "")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return f"the benchmark process failed (exit {proc.returncode})" + (": " + " | ".join(tail) if tail else "")


def _run_child(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """subprocess.run, but stopped as this process is: the child runs in a session of its own
    (Ctrl-C at the terminal reaches this process only) and a Ctrl-C or SIGTERM here is passed on
    as one SIGINT, so it stops its run and removes its temp files; killed if it takes over 10 s or
    a second Ctrl-C comes. On Linux it gets SIGINT too when this process dies any other way (a
    SIGKILL, a hang-up), so that it never runs on alone."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, **env}, preexec_fn=_stop_with_parent)
    try:
        out, err = child.communicate()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        raise
    finally:
        if child.poll() is None:  # a second Ctrl-C, or the wait ran out: it goes now, before its folder does
            child.kill()
            child.wait()
        for stream in (child.stdout, child.stderr):
            stream.close()
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGINT when its parent dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGINT))  # 1: PR_SET_PDEATHSIG


def _call(func: str, kwargs: dict[str, Any]) -> dict:
    from importlib import import_module

    module, name = func.split(":")
    return getattr(import_module(module), name)(**kwargs)


def _child(payload: str) -> int:
    spec = json.loads(payload)
    if spec.get("threads"):
        import numpy  # noqa: F401 - load the BLAS first, so that its pool is there to limit

        set_threads(spec["threads"])
    try:
        result = _call(spec["func"], spec["kwargs"])
    except PantheonError as e:  # handed to the parent whole, not as the last lines of a traceback
        print(_ERROR_MARK + _carried(e), flush=True)
        return int(e.exit_code)
    result["peak_rss_mb"] = peak_rss_mb()
    print(_RESULT_MARK + json.dumps(result), flush=True)
    return 0


def _carried(e: PantheonError) -> str:
    """The error itself, pickled (PantheonError's contract) as one line of base64."""
    return base64.b64encode(pickle.dumps(e)).decode("ascii")


def _rebuilt(carried: str) -> PantheonError:
    """The child's error again, of its own class, with its message and attributes."""
    return pickle.loads(base64.b64decode(carried))


def cpu_info() -> str:
    """A one-line machine description for benchmark headers."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    la = os.getloadavg()
    usable = cpu_count()  # a mask or a container's quota: what the default thread total is
    cores = f"{os.cpu_count()} cores" + (f" ({usable} usable)" if usable != os.cpu_count() else "")
    return f"{cores} {model}; load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}"


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
