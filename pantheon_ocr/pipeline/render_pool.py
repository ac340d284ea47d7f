"""Crash-proof worker processes for rendering (and page counting).

PDFium is C++ reading untrusted files: it can segfault, abort or hang. So PDF work runs in
worker processes and the pool supervises them itself. `concurrent.futures.ProcessPoolExecutor`
is not enough: one dead worker marks the whole executor broken and fails every pending page,
and `multiprocessing.Pool` simply hangs. Here each worker has its own pipe and the pool knows
which task each worker holds, so a crash costs exactly that task (reported as a `WorkerError`)
plus the start of a replacement worker; a task running longer than `timeout` is killed the same way.

`imap` yields outcomes **in submission order** and keeps at most `max_in_flight` tasks
submitted but not yet yielded (running, queued or finished and waiting for an earlier one).
That bound is the back-pressure: a 2,000-page PDF never has more than `max_in_flight`
rendered pages inside the pool, however slow the consumer is. In-order delivery also lets the
pipeline finish documents one after the other. The price: a slow page holds back the pages
after it for its render time (at most `timeout`), which is usually small next to OCR time.

Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent decides how
to stop (it closes the pool, which terminates busy workers).
"""

from __future__ import annotations

import errno
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..errors import RESOURCE_ERRNOS, InputError, ResourceError, open_files_limit

# Open files a worker's start needs for a moment (its pipe, the forkserver's socket and two pipes)
# and a margin for the pages' own files. Too few, and the start fails half-way through telling
# the forkserver what to fork, which then prints a traceback of its own and dies.
FDS_FOR_A_WORKER = 12


class WorkerError(Exception):
    """The task did not produce a value: its worker crashed or timed out (`crashed`), or the
    function raised an exception other than InputError (whose text is `problem`)."""

    def __init__(self, problem: str, crashed: bool, short_of_memory: bool = False):
        self.problem = problem
        self.crashed = crashed
        self.short_of_memory = short_of_memory  # the page did not fit in memory (types.PageResult's)
        super().__init__(problem)


@dataclass
class Outcome:
    index: int  # position in the submitted sequence
    args: tuple
    value: Any = None
    error: InputError | WorkerError | None = None
    seconds: float = 0.0  # wall time of the call inside the worker


def default_start_method() -> str:
    # forkserver forks cheap replacements from a small single-threaded server (safe with our
    # threads, unlike fork); spawn where forkserver does not exist (Windows) or is fragile (macOS).
    if sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn"


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from . import pdf  # for clear_pdf_cache; the task functions import what they need

    # C libraries print to stderr of their own accord (libtiff's "TIFFAdvanceDirectory: ...
    # tempfile.tif: Error fetching directory count." for a TIFF cut short): the page's reason says
    # it in our words, so during a task fd 2 goes to /dev/null; the worker's own errors keep it.
    quiet, stderr = os.open(os.devnull, os.O_WRONLY), os.dup(2)
    try:
        conn.send(("ready", None, 0.0))  # tells the parent that start-up worked
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if msg is None:
                break
            fn, args = msg
            t0 = time.perf_counter()
            os.dup2(quiet, 2)
            try:
                reply = ("ok", fn(*args))
            except InputError as e:  # pickled whole (PantheonError's contract)
                reply = ("input", e)
            except MemoryError as e:  # the page's image does not fit: the run is short of memory
                reply = ("memory", f"not enough memory to render the page ({str(e) or 'MemoryError'})")
            except Exception as e:  # noqa: BLE001 - any failure belongs to this task only
                reply = ("exc", f"{type(e).__name__}: {e}")
            finally:
                os.dup2(stderr, 2)
            try:
                conn.send((*reply, time.perf_counter() - t0))
            except OSError:
                raise
            except Exception as e:  # noqa: BLE001 - e.g. an unpicklable result
                conn.send(("exc", f"cannot return the result: {type(e).__name__}: {e}", 0.0))
    except OSError:
        pass  # the parent is gone (killed: BrokenPipeError): end quietly, no traceback in the cron mail
    finally:
        pdf.clear_pdf_cache()


class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="pantheon-render")
        try:
            self.process.start()
        except BaseException:  # no room for it (open files, processes): its pipe goes with it
            self.conn.close()
            raise
        finally:
            child.close()  # so a dead worker shows up as EOF on our end
        self.task: tuple[int, tuple] | None = None
        self.deadline = 0.0
        self.ready = False  # set by the worker's first message

    def stop(self, grace: float) -> None:
        if self.task is None and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(grace)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)
        self.conn.close()


def _fds_free() -> int | None:
    """How many more files this process may open (None: unknown, or no limit)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return None
        return soft - len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class RenderPool:
    """Supervised worker processes. Use from one thread at a time; close() (or `with`) ends
    the workers. Workers start lazily, one while a task waits and all the others are busy."""

    def __init__(
        self,
        workers: int = 2,
        max_in_flight: int | None = None,
        timeout: float | None = 120.0,
        start_method: str | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.n_workers = workers
        self.max_in_flight = max(workers, max_in_flight or 2 * workers)
        self.timeout = timeout
        self._ctx = multiprocessing.get_context(start_method or default_start_method())
        self._workers: list[_Worker] = []
        self.restarts = 0  # replacement workers started (crashes + timeouts)
        self._closed = False
        self._start_failures = 0  # consecutive workers that died before saying "ready"
        self._waiting: deque[tuple[int, tuple]] = deque()  # taken from `items`, not yet sent

    def __enter__(self) -> "RenderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start_worker(self) -> bool:
        """One more worker; False where the system has no room for it (open files, processes)
        and others run: the pool goes on with those. ResourceError where it has none at all."""
        try:
            self._workers.append(self._new_worker())
            return True
        except OSError as e:
            self._no_room(e)
            return False

    def _new_worker(self) -> _Worker:
        """A started worker, or an OSError where the system has no room for one."""
        free = _fds_free()
        if free is not None and free < FDS_FOR_A_WORKER:
            raise OSError(errno.EMFILE, "Too many open files")
        return _Worker(self._ctx)

    def _no_room(self, e: OSError) -> None:
        """A worker that could not start: the pool goes on with those there are (as many as fit),
        ResourceError when there are none; an error that is no want of room is raised as it is."""
        if e.errno not in RESOURCE_ERRNOS:
            raise e
        if self._workers:
            self.n_workers = len(self._workers)
            return
        why = (f"too many open files: {open_files_limit(e.errno)}" if e.errno in (errno.EMFILE, errno.ENFILE) else
               f"{e.strerror} (a limit such as ulimit -u or ulimit -v)")
        raise ResourceError(f"cannot start a render worker: {why}") from None

    def _respawn(self, i: int) -> bool:
        """A new worker in slot i, in place of one stopped; where there is no room for it now (the
        files or processes another part of the run took meanwhile) the slot goes and the pool runs
        on the others. False then."""
        try:
            self._workers[i] = self._new_worker()
            self.restarts += 1
            return True
        except OSError as e:
            self._workers.pop(i)
            self._no_room(e)
            return False

    def close(self) -> None:
        self._closed = True
        workers, self._workers = self._workers, []
        for w in workers:
            w.stop(grace=2.0)

    def imap(
        self, fn: Callable[..., Any], items: Iterable[tuple], stop: threading.Event | None = None
    ) -> Iterator[Outcome]:
        """Run fn(*args) for each args tuple in a worker; yield Outcomes in submission order.
        `fn` must be picklable (a module-level function or an instance of a module-level
        class). Returns early, without yielding the rest, once `stop` is set."""
        if self._closed:
            raise RuntimeError("the render pool is closed")
        try:
            yield from self._run(fn, iter(items), stop)
        finally:
            # Abandoned early (stop, error, consumer gone): results still being computed would
            # be mistaken for the next imap's, so end those workers; new ones start lazily.
            busy = [w for w in self._workers if w.task is not None]
            self._workers = [w for w in self._workers if w.task is None]
            for w in busy:
                w.stop(grace=0.0)

    def _run(self, fn: Callable, source: Iterator[tuple], stop: threading.Event | None) -> Iterator[Outcome]:
        waiting = self._waiting = deque()
        done: dict[int, Outcome] = {}
        submitted = yielded = 0
        exhausted = False
        while True:
            while not exhausted and submitted - yielded < self.max_in_flight:
                try:
                    waiting.append((submitted, tuple(next(source))))
                    submitted += 1
                except StopIteration:
                    exhausted = True
            # a worker more while tasks wait for one, up to n_workers: an image or a short PDF starts
            # one or two processes, not all that were asked for (each is a Python start, ~0.1 s)
            idle = sum(w.task is None for w in self._workers)
            while len(waiting) > idle and len(self._workers) < self.n_workers and self._start_worker():
                idle += 1
            for i, w in enumerate(self._workers):
                if w.task is None and waiting:
                    self._send(i, fn, waiting.popleft(), done)
            while yielded in done:
                if stop is not None and stop.is_set():
                    return
                yield done.pop(yielded)
                yielded += 1
            if exhausted and yielded == submitted:
                return
            if stop is not None and stop.is_set():
                return
            if any(w.task is not None for w in self._workers):
                self._wait(done)

    def _send(self, i: int, fn: Callable, task: tuple[int, tuple], done: dict[int, Outcome]) -> None:
        w = self._workers[i]
        if not w.process.is_alive():  # died while idle (OOM killer, ...): not this task's fault
            w.stop(grace=0.0)
            if not self._respawn(i):
                self._waiting.appendleft(task)  # for another worker
                return
            w = self._workers[i]
        w.task = task
        w.deadline = time.monotonic() + self.timeout if self.timeout else float("inf")
        try:
            w.conn.send((fn, task[1]))
        except (OSError, ValueError):  # the worker died while idle (BrokenPipe)
            self._replace(i, done, WorkerError(f"the render worker died ({_describe_exit(w.process.exitcode)})", True))

    def _wait(self, done: dict[int, Outcome]) -> None:
        busy = [w for w in self._workers if w.task is not None]
        deadline = min(w.deadline for w in busy)
        timeout = min(0.1, max(0.0, deadline - time.monotonic()))  # 0.1 s: notice `stop` soon
        multiprocessing.connection.wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout)
        for i, w in enumerate(self._workers):
            if w.task is None:
                continue
            index, args = w.task
            if w.conn.poll():
                try:
                    status, payload, seconds = w.conn.recv()
                except (EOFError, OSError):
                    w.process.join(1.0)  # died while sending
                    self._replace(i, done, WorkerError(f"the render worker crashed ({_describe_exit(w.process.exitcode)})", True))
                    continue
                except MemoryError:  # this page's image does not fit now; the message is half read: a new worker
                    self._replace(i, done, WorkerError("not enough memory to take the rendered page in", True, True))
                    continue
                if status == "ready":
                    w.ready = True
                    self._start_failures = 0
                    continue
                if status == "ok":
                    done[index] = Outcome(index, args, value=payload, seconds=seconds)
                elif status == "input":
                    done[index] = Outcome(index, args, error=payload, seconds=seconds)
                elif status == "memory":
                    done[index] = Outcome(index, args, error=WorkerError(payload, False, True), seconds=seconds)
                else:
                    done[index] = Outcome(index, args, error=WorkerError(payload, False), seconds=seconds)
                w.task = None
            elif not w.process.is_alive():
                self._replace(i, done, WorkerError(f"the render worker crashed ({_describe_exit(w.process.exitcode)})", True))
            elif time.monotonic() > w.deadline:
                self._replace(i, done, WorkerError(f"rendering took longer than {self.timeout:g} s and was stopped", True))

    def _replace(self, i: int, done: dict[int, Outcome], error: WorkerError) -> None:
        """Worker i died or hung: its task fails with it, a new worker takes its place. A worker
        that died before its "ready" message failed to start, which is not the task's fault:
        the task is queued again, and repeated start failures end the run with a clear error."""
        old = self._workers[i]
        if old.task is not None:
            index, args = old.task
            if old.ready or not error.crashed:
                done[index] = Outcome(index, args, error=error)
            else:
                self._waiting.appendleft(old.task)
            old.task = None
        if not old.ready:
            self._start_failures += 1
        old.stop(grace=0.0)
        if self._start_failures >= 3:
            self._workers.pop(i)
            # The library's error, so that a caller catching PantheonError catches it: out of
            # processes or memory, or (the usual case from Python) a script with no main guard
            raise ResourceError(
                f"render worker processes fail to start ({_describe_exit(old.process.exitcode)}); "
                "see the messages above. A script that reads with pantheon_ocr must do it under "
                "`if __name__ == \"__main__\":` (each worker process imports the script again, which then "
                "starts a run of its own)"
            )
        self._respawn(i)
