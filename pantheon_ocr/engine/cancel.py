"""Stopping an engine call in the middle: a run that is interrupted (Ctrl-C, SIGTERM) must not
wait for a page's whole vision or prefill pass, which takes minutes at LightOnOCR's full size.

The caller runs engine calls inside `cancel_on(event)` (per thread); the layer loops of the
towers call `check()` between layers, which raises `Cancelled` once the event is set. Nothing
is left half-done that matters: the interrupted page's sequence is abandoned (its KV slot freed
by its owner) and never written.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_local = threading.local()


class Cancelled(BaseException):
    """The run was stopped while this engine call was under way. A BaseException, like
    KeyboardInterrupt: no `except Exception` that turns a page's error into a failed page
    catches it."""


@contextmanager
def cancel_on(event: threading.Event):
    """Engine calls on this thread stop at the next layer once `event` is set."""
    previous = getattr(_local, "event", None)
    _local.event = event
    try:
        yield
    finally:
        _local.event = previous


def check() -> None:
    """Between layers: raise Cancelled if this thread's run was stopped."""
    event = getattr(_local, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("stopped")
