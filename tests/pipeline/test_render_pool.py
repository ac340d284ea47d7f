"""render_pool.py: supervised render workers (crash isolation, timeouts, back-pressure)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fake_engine import CrashingRender, SAMPLES, SlowRender, allocate, marked_pdf, pid_after, read_marks, square
from pantheon_ocr.errors import InputError
from pantheon_ocr.pipeline.inputs import make_document
from pantheon_ocr.pipeline.render import count_pages, render_page
from pantheon_ocr.pipeline.render_pool import RenderPool, WorkerError


@pytest.fixture
def pdf10(tmp_path):
    path = tmp_path / "ten.pdf"
    path.write_bytes(marked_pdf(10, doc_no=2))
    return make_document(path)


@pytest.mark.parametrize("mode", ["segv", "exit"])
def test_crash_costs_only_that_page(pdf10, mode):
    hook = CrashingRender({("ten.pdf", 3), ("ten.pdf", 7)}, mode=mode)
    with RenderPool(workers=2) as pool:
        outcomes = list(pool.imap(hook, [(pdf10, i, 400) for i in range(10)]))
        assert [o.index for o in outcomes] == list(range(10))  # in submission order
        for o in outcomes:
            if o.index in (3, 7):
                assert isinstance(o.error, WorkerError) and o.error.crashed and o.value is None
                assert "render worker crashed" in o.error.problem
                assert ("SIGSEGV" if mode == "segv" else "exit code 3") in o.error.problem
            else:
                assert o.error is None and read_marks(o.value) == (2, o.index + 1)
                assert o.value.size == (310, 400) and o.seconds > 0
        assert pool.restarts == 2
        # the replacement workers keep working
        assert [o.value for o in pool.imap(square, [(3,), (4,)])] == [9, 16]


def test_input_errors_and_exceptions_come_back_as_data(tmp_path):
    with RenderPool(workers=1) as pool:
        out = list(
            pool.imap(
                count_pages,
                [(make_document(SAMPLES / "bad/encrypted.pdf"), None), (make_document(SAMPLES / "docs/report-3pages.pdf"), None)],
            )
        )
        assert isinstance(out[0].error, InputError) and "password" in out[0].error.problem
        assert out[0].error.path == str(SAMPLES / "bad/encrypted.pdf")
        assert out[1].value == 3
        bad = list(pool.imap(square, [("x",)]))[0]
        assert isinstance(bad.error, WorkerError) and not bad.error.crashed
        assert bad.error.problem.startswith("TypeError")
        assert pool.restarts == 0


def test_render_errors_name_the_page():
    doc = make_document(SAMPLES / "docs/report-3pages.pdf")
    with RenderPool(workers=1) as pool:
        (o,) = pool.imap(render_page, [(doc, 5, 200, None)])
    assert isinstance(o.error, InputError) and o.error.page == 6 and "does not exist" in o.error.problem


def test_hung_worker_is_killed_after_timeout(pdf10):
    hook = CrashingRender({("ten.pdf", 1)}, mode="hang")
    t0 = time.monotonic()
    with RenderPool(workers=2, timeout=1.5) as pool:
        outcomes = list(pool.imap(hook, [(pdf10, i, 200) for i in range(4)]))
    assert time.monotonic() - t0 < 10
    assert "longer than 1.5 s" in outcomes[1].error.problem
    assert [o.error for o in outcomes if o.index != 1] == [None, None, None]


def test_back_pressure_bounds_work_in_flight():
    pulled = 0
    lock = threading.Lock()

    def items():
        nonlocal pulled
        for i in range(40):
            with lock:
                pulled += 1
            yield (i,)

    with RenderPool(workers=2, max_in_flight=3) as pool:
        consumed = 0
        for o in pool.imap(square, items()):
            assert o.value == o.index**2
            consumed += 1
            assert pulled - consumed <= 3 - 1  # at most 3 outstanding, this one just left
            time.sleep(0.005)  # a slow consumer
    assert consumed == 40


def test_stop_event_and_abandoned_imap_leave_no_stale_results(pdf10):
    stop = threading.Event()
    with RenderPool(workers=2) as pool:
        got = []
        for o in pool.imap(SlowRender(0.3), [(pdf10, i, 100) for i in range(10)], stop):
            got.append(o.index)
            stop.set()
        assert got == [0]
        # the slow tasks still running were abandoned with their workers
        assert [o.value for o in pool.imap(square, [(i,) for i in range(5)])] == [0, 1, 4, 9, 16]


def test_workers_ignore_sigint_and_close_ends_them():
    pool = RenderPool(workers=2)
    assert [o.value for o in pool.imap(square, [(1,), (2,)])] == [1, 4]  # workers are up
    pids = {w.process.pid for w in pool._workers}
    # Ctrl-C in a terminal sends SIGINT to the whole process group, workers included.
    timer = threading.Timer(0.2, lambda: [os.kill(pid, signal.SIGINT) for pid in pids])
    timer.start()
    outcomes = list(pool.imap(pid_after, [(0.6,), (0.6,)]))
    timer.join()
    assert [o.error for o in outcomes] == [None, None]
    assert {o.value for o in outcomes} == pids and pool.restarts == 0
    processes = [w.process for w in pool._workers]
    pool.close()
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(RuntimeError, match="closed"):
        next(pool.imap(square, [(1,)]))


def test_workers_start_as_tasks_wait_for_them():
    """Asked for 8, one task starts one process; two slow tasks at once, two (never all eight)."""
    with RenderPool(workers=8) as pool:
        assert pool._workers == []  # nothing starts before there is work
        assert [o.value for o in pool.imap(square, [(3,)])] == [9]
        assert len(pool._workers) == 1
        assert [o.error for o in pool.imap(pid_after, [(0.3,), (0.3,)])] == [None, None]
        assert len(pool._workers) == 2
        assert [o.error for o in pool.imap(pid_after, [(0.3,)] * 16)] == [None] * 16
        assert len(pool._workers) == 8  # the rest waited for them


def test_a_page_too_big_for_memory_now_fails_alone(monkeypatch):
    """MemoryError while a rendered page comes back (a low ulimit -v, a huge page) ended the whole
    batch as an internal error with an empty message; it is that page's failure, the rest goes on."""
    import multiprocessing.connection

    real, raised = multiprocessing.connection.Connection.recv, []

    def recv(self):
        message = real(self)
        if message[0] == "ok" and not raised:
            raised.append(message)
            raise MemoryError
        return message

    monkeypatch.setattr(multiprocessing.connection.Connection, "recv", recv)
    with RenderPool(workers=1) as pool:
        out = list(pool.imap(square, [(2,), (3,), (4,)]))
    assert isinstance(out[0].error, WorkerError) and out[0].error.problem == "not enough memory to take the rendered page in"
    assert out[0].error.short_of_memory and [o.value for o in out[1:]] == [9, 16]
    with RenderPool(workers=1) as pool:  # out of memory in the worker, as it renders: that page alone, said so
        out = list(pool.imap(allocate, [(3,), (4,)]))
    assert out[0].error.problem == "not enough memory to render the page (Unable to allocate 3 GiB)"
    assert out[0].error.short_of_memory and not out[0].error.crashed and out[1].value == 4


def test_no_room_for_more_workers_runs_on_those_there_are(monkeypatch):
    """Out of open files (a low ulimit -n) for a second worker: the pool goes on with one; for the
    first, one ResourceError naming the limit (exit 71), never a worker started half-way, whose
    forkserver then prints a traceback of its own."""
    from pantheon_ocr.errors import ExitCode, ResourceError
    from pantheon_ocr.pipeline import render_pool

    room = iter([64, 0])  # room for one worker, then none
    monkeypatch.setattr(render_pool, "_fds_free", lambda: next(room, 0))
    with RenderPool(workers=4) as pool:
        outcomes = list(pool.imap(pid_after, [(0.2,)] * 4))
        assert [o.error for o in outcomes] == [None] * 4 and len({o.value for o in outcomes}) == 1  # all on one
        assert len(pool._workers) == 1
        assert pool.n_workers == 1
    monkeypatch.setattr(render_pool, "_fds_free", lambda: 3)
    with RenderPool(workers=2) as pool, pytest.raises(ResourceError) as caught:
        list(pool.imap(square, [(2,)]))
    assert caught.value.exit_code == ExitCode.OUT_OF_RESOURCES
    assert str(caught.value).startswith("cannot start a render worker: too many open files: the limit of open files")


def test_no_room_to_replace_a_crashed_worker_runs_on_the_others(monkeypatch, pdf10):
    """A worker crashed, and the files it held went meanwhile to another part of the run: its
    replacement has no room. The pool goes on with the worker left (the replacement once raised
    a bare OSError out of the run); with none left, one ResourceError (exit 71)."""
    from pantheon_ocr.errors import ResourceError
    from pantheon_ocr.pipeline import render_pool

    room = iter([64, 64])  # room for the two workers, then none
    monkeypatch.setattr(render_pool, "_fds_free", lambda: next(room, 0))
    hook = CrashingRender({("ten.pdf", 3)}, mode="exit")
    with RenderPool(workers=2) as pool:
        outcomes = list(pool.imap(hook, [(pdf10, i, 200) for i in range(10)]))
        assert [o.index for o in outcomes if o.error is not None] == [3]
        assert all(read_marks(o.value) == (2, o.index + 1) for o in outcomes if o.index != 3)
        assert len(pool._workers) == 1 and pool.n_workers == 1 and pool.restarts == 0
    room = iter([64])
    with RenderPool(workers=1) as pool, pytest.raises(ResourceError, match="^cannot start a render worker: too many"):
        list(pool.imap(hook, [(pdf10, i, 200) for i in range(10)]))


def test_a_c_library_says_nothing_on_stderr_of_its_own(tmp_path):
    """libtiff prints "TIFFAdvanceDirectory: ... tempfile.tif: Error fetching directory count."
    for a TIFF cut short, a name the user never gave; the page's failure says it in our words."""
    import subprocess
    import sys

    from PIL import Image, ImageDraw

    frames = [Image.new("L", (600, 800), 255) for _ in range(4)]
    for i, frame in enumerate(frames):
        ImageDraw.Draw(frame).text((50, 50 + 30 * i), f"page {i + 1}", fill=0)
    frames[0].save(tmp_path / "full.tif", save_all=True, append_images=frames[1:], compression="tiff_lzw")
    data = (tmp_path / "full.tif").read_bytes()
    (tmp_path / "cut.tif").write_bytes(data[: len(data) * 9 // 10])  # LZW strips are libtiff's: it speaks
    script = (
        "import sys\n"
        "from pantheon_ocr.pipeline.inputs import make_document\n"
        "from pantheon_ocr.pipeline.render import count_pages, render_page\n"
        "from pantheon_ocr.pipeline.render_pool import RenderPool\n"
        f"doc = make_document({str(tmp_path / 'cut.tif')!r})\n"
        "with RenderPool(workers=1) as pool:\n"
        "    (n,) = [o.value for o in pool.imap(count_pages, [(doc,)])]\n"
        "    out = list(pool.imap(render_page, [(doc, i, 300) for i in range(n)]))\n"
        "print(n, [o.error is None for o in out])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "4" and "False" in proc.stdout  # the cut frame fails as its page
    assert proc.stderr == ""
