"""Ctrl-C, SIGTERM and SIGHUP held back while a run takes or gives back its lock.

A run stopped between "the lock is ours" and "our run row says so", or in the middle of its
final bookkeeping (report, run row, lock), would leave the lock row and a run marked running
(the next night refuses with 75 until the lock goes stale). Inside `HeldSignals` the stop signals
are only noted; `pending` says whether one came, and the caller stops right after the block.
"""

from __future__ import annotations

import signal
import threading

# What stops a run as Ctrl-C does (SIGHUP: the terminal closed, an ssh session dropped); the
# commands handle the same ones (commands/common.stop_signals_as_interrupt)
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class HeldSignals:
    def __init__(self) -> None:
        self.pending = False
        self._previous: dict = {}

    def __enter__(self) -> "HeldSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self.pending = True

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
