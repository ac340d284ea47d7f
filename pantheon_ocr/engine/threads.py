"""How many threads the BLAS library (numpy's matmuls) may use: the one place that sets it.

Set before numpy loads its BLAS (the environment variables are read once, at load time, and
child processes inherit them) and, through threadpoolctl, for a BLAS that is already loaded.
"""

from __future__ import annotations

import os

BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_env(threads: int) -> dict[str, str]:
    """The environment that gives a new process `threads` BLAS threads."""
    return {var: str(threads) for var in BLAS_ENV}


def set_blas_threads(threads: int) -> None:
    """This process (and the processes it starts) use `threads` BLAS threads from now on."""
    os.environ.update(blas_env(threads))
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


def stage_threads(threads: int | None, overlap: bool) -> int | None:
    """BLAS threads per pipeline stage: the user's choice, else, when the vision stage overlaps
    the CPU stage and the environment names no count, half the cores each. Two stage threads
    each driving an all-core BLAS oversubscribe the machine (measured on 2 cores: 94 s instead
    of 33 s for the same pages). None: leave the library's default."""
    if threads is None and overlap and not any(v in os.environ for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")):
        return max(1, (os.cpu_count() or 2) // 2)
    return threads
