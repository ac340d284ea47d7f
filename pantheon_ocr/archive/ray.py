"""Scale-out on Ray: the same archive job, its pages OCR'd by Ray actors, one engine each.

The driver (the `archive run` process) keeps everything that must have a single writer: the
SQLite state, the lock, the output files and the report, exactly as on one machine. Actors
only turn pages into results: each builds one engine when it starts, receives chunks of page
tasks, runs the ordinary page pipeline on them (render workers, vision thread, continuous
batching) with write_outputs=False, and returns plain dicts; the driver records each chunk's
pages as they come back. So a killed driver loses only the chunks in flight, and resume works
as it does locally.

Input documents travel through Ray's object store (the driver reads each once), so workers
need no shared file system for inputs; the model files must exist at the same path on every
node (they are gigabytes: shipping them per run would cost more than the OCR of a night).
When joining a remote cluster the pantheon_ocr package itself is shipped with the job
(runtime_env py_modules); its dependencies (numpy, pillow, pypdfium2, ...) must be installed
on the nodes.

Importing this module does not import ray; RayExecutor does when it first runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections import Counter, deque
from pathlib import Path, PurePath
from typing import Any, Callable, Sequence

from ..errors import JobError, NetworkError, PantheonError
from ..pipeline.types import STAGES, DocumentOutcome, PageFailure, PageResult, PageTask, PipelineOptions, Progress

RAY_MISSING = "--ray needs Ray: pip install 'pantheon-ocr[ray]' (or pip install 'ray[data]>=2.40')"


def import_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise JobError(RAY_MISSING) from None
    return ray


class PageWorker:
    """The actor (wrapped with ray.remote at run time, so this module imports without Ray)."""

    def __init__(self, engine_factory: Callable[[], Any]):
        self.engine, self.notes = engine_factory()
        _sweep_caches()
        self.cache = Path(tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{os.getpid()}-"))
        self.files: dict[str, Path] = {}  # doc_id -> local copy of the input

    def where(self) -> tuple[str, int, list[str]]:
        return socket.gethostname(), os.getpid(), self.notes

    def run(self, chunk: list[tuple], blobs: dict[str, Any], options: PipelineOptions) -> list[dict]:
        import ray

        from ..pipeline.inputs import Document
        from ..pipeline.run import run_pipeline

        wanted = {item[0] for item in chunk}
        for doc_id in list(self.files):
            if doc_id not in wanted:  # keep the disk use to about one chunk's documents
                self.files.pop(doc_id).unlink(missing_ok=True)
        tasks = []
        for doc_id, kind, rel, name, page_index, n_pages, sampling in chunk:
            if doc_id not in self.files:
                local = self.cache / f"{doc_id}-{name}"
                local.write_bytes(ray.get(blobs[doc_id]))
                self.files[doc_id] = local
            doc = Document(self.files[doc_id], kind, doc_id, PurePath(rel))
            tasks.append(PageTask(doc, page_index, n_pages, sampling))
        results: list[PageResult] = []
        run_pipeline([], self.engine, options, tasks=tasks, on_page=results.append, write_outputs=False)
        return [{"doc_id": r.doc.doc_id, "page": r.page, "text": r.text, "n_tokens": r.n_tokens,
                 "finish_reason": r.finish_reason, "error": r.error, "seconds": dict(r.seconds)} for r in results]

    def shutdown(self) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)


class RayExecutor:
    """Runs a job's rounds on Ray actors. `address`: 'local' starts a Ray instance here,
    anything else (auto, HOST:PORT, ray://...) joins one; if Ray is already initialised in
    this process (a test, a notebook) that instance is used as it is."""

    name = "ray"

    def __init__(self, engine_factory: Callable[[], Any], address: str = "local", workers: int | None = None,
                 cpus_per_worker: float = 1.0, chunk_pages: int = 16, in_flight: int = 2):
        self.engine_factory, self.address, self.workers = engine_factory, address, workers
        self.cpus_per_worker, self.chunk_pages, self.in_flight = cpus_per_worker, chunk_pages, in_flight
        self.actors: list[Any] = []
        self.placement: list[tuple[str, int]] = []
        self.notes: list[str] = []  # what the workers' engine factories said, once each
        self.started_ray = False

    def _start(self, ray) -> None:
        if not ray.is_initialized():
            _reachable(self.address)
            term = signal.getsignal(signal.SIGTERM)
            try:
                if self.address == "local":
                    ray.init(include_dashboard=False)
                else:
                    import pantheon_ocr

                    ray.init(address=self.address, runtime_env={"py_modules": [str(Path(pantheon_ocr.__file__).parent)]})
            except ConnectionError as e:  # refused, a token it wants, no cluster at all
                raise NetworkError(f"the Ray cluster at {self.address}", f"cannot connect: {_said(e)}") from None
            finally:
                # ray.init takes SIGTERM over (its handler exits at once, its core worker aborts):
                # a stopped run must still record itself and let go of its lock
                if term is not None:
                    signal.signal(signal.SIGTERM, term)
            self.started_ray = True
        if self.actors:
            return
        n = self._how_many(ray)
        actor_cls = ray.remote(num_cpus=self.cpus_per_worker, max_restarts=MAX_RESTARTS, max_task_retries=0)(PageWorker)
        self.actors = [actor_cls.remote(self.engine_factory) for _ in range(n)]
        try:
            placed = ray.get([a.where.remote() for a in self.actors])  # once the engines are built
        except ray.exceptions.RayError as e:
            self.close()
            cause = getattr(e, "cause", None)
            if isinstance(cause, PantheonError):  # a missing model on the nodes is a model error (3), as here
                raise cause from None
            raise JobError(f"Ray workers could not start the engine: {_said(e)}") from None
        self.placement = [(host, pid) for host, pid, _ in placed]
        self.notes = list(dict.fromkeys(self.notes + [n for _, _, notes in placed for n in notes]))

    def _how_many(self, ray) -> int:
        """Workers the cluster can place: as many as asked (or one per cpus_per_worker of the
        cluster's CPUs), no more than fit, since an actor no node can take waits for ever."""
        cpus = [float(node.get("Resources", {}).get("CPU", 0)) for node in ray.nodes() if node.get("Alive")]
        fit = sum(int(c // self.cpus_per_worker) for c in cpus)
        if fit < 1:
            raise JobError(f"no node of the Ray cluster has {self.cpus_per_worker:g} CPUs for a worker (ray.cpus_per_worker; "
                           f"the nodes have {', '.join(f'{c:g}' for c in cpus) or 'none'})")
        n = self.workers or fit
        if n > fit:
            self.notes.append(f"{n} Ray workers asked for, {fit} fit the cluster's CPUs "
                              f"({sum(cpus):g} at {self.cpus_per_worker:g} a worker): {fit} started")
            n = fit
        return n

    def run(self, tasks: Sequence[PageTask], options: PipelineOptions, on_page, on_progress=None) -> bool:
        """Run the tasks; on_page gets each PageResult in this (the driver's) thread. Returns
        True when interrupted (Ctrl-C / SIGTERM in the driver)."""
        ray = import_ray()
        self._start(ray)
        docs = {t.doc.doc_id: t.doc for t in tasks}
        pages = Counter(t.doc.doc_id for t in tasks)  # each document's pages in this round
        left = dict(pages)  # still to come back
        failures: dict[str, list[PageFailure]] = {d: [] for d in docs}
        t0, done, failed, tokens, docs_done = time.perf_counter(), 0, 0, 0, 0

        def emit(result: PageResult) -> None:
            nonlocal done, failed, tokens, docs_done
            done, failed, tokens = done + 1, failed + (result.error is not None), tokens + result.n_tokens
            on_page(result)
            d = result.doc.doc_id
            left[d] -= 1
            if result.error is not None:
                failures[d].append(PageFailure(str(result.doc.path), result.page, result.error))
            finished = ()
            if left[d] == 0:  # its pages are all back: a line for it, as the local pipeline says
                docs_done += 1
                status = "written" if not failures[d] else "failed" if len(failures[d]) == pages[d] else "partial"
                finished = (DocumentOutcome(result.doc, status, (), pages[d], tuple(failures[d])),)
            if on_progress is not None:
                on_progress(Progress(done, len(tasks), failed, tokens, docs_done, len(docs), time.perf_counter() - t0,
                                     finished=finished))

        blobs, unreadable, runnable = {}, {}, []
        for t in tasks:
            if t.doc.doc_id not in blobs and t.doc.doc_id not in unreadable:
                try:
                    blobs[t.doc.doc_id] = ray.put(t.doc.path.read_bytes())
                except OSError as e:
                    unreadable[t.doc.doc_id] = f"cannot read file: {e.strerror or e}"
            if t.doc.doc_id in unreadable:
                emit(PageResult(t.doc, t.page, "", 0, None, unreadable[t.doc.doc_id]))
            else:
                runnable.append(t)
        chunks = deque((runnable[i:i + self.chunk_pages], 0) for i in range(0, len(runnable), self.chunk_pages))
        inflight: dict[Any, tuple[int, list[PageTask], int, int]] = {}  # ref -> (worker, chunk, tries, sent)
        workers, sent, last = _Workers(self.actors), 0, ""
        try:
            while chunks or inflight:
                if not workers.live():  # the cluster went (ray stop, its nodes down): try again later
                    raise NetworkError("the Ray cluster", f"every worker died ({len(self.actors)}; the last said: {last}); "
                                                          "the pages not read stay pending for the next run")
                workers.probe_the_lost()
                up = workers.up()
                while chunks and up and min(workers.load[i] for i in up) < self.in_flight:
                    i = min(up, key=lambda j: workers.load[j])
                    chunk, tries = chunks.popleft()
                    items = [(t.doc.doc_id, t.doc.kind, str(t.doc.rel), t.doc.path.name, t.page_index, t.n_pages, t.sampling)
                             for t in chunk]
                    ref = self.actors[i].run.remote(items, {d: blobs[d] for d in {t.doc.doc_id for t in chunk}}, options)
                    inflight[ref], sent = (i, chunk, tries, sent), sent + 1
                    workers.load[i] += 1
                waiting = [*inflight, *workers.probes]
                if not waiting:  # every worker down, each probe due later: wait for the first
                    time.sleep(workers.next_probe_in())
                    continue
                ready, _ = ray.wait(waiting, num_returns=1, timeout=0.5)  # short: Ctrl-C stays prompt
                for ref in ready:
                    if ref in workers.probes:
                        workers.probed(ray, ref)
                        continue
                    i, chunk, tries, when = inflight.pop(ref)
                    workers.load[i] -= 1
                    try:
                        results = self._results(ray, ref, chunk, docs)
                    except _WorkerLost as e:
                        # the worker, not the pages: the chunk goes again, its attempt and sampling
                        # unchanged (same text as if nothing happened). The call the worker was
                        # running is charged a try (a chunk that keeps killing its worker fails as
                        # pages do), not one only queued behind it
                        last = str(e)
                        charged = workers.lost_call(i, when, [w for j, _, _, w in inflight.values() if j == i])
                        if not charged or tries + 1 < CHUNK_TRIES:
                            chunks.appendleft((chunk, tries + 1 if charged else tries))
                            continue
                        results = [PageResult(t.doc, t.page, "", 0, None, f"Ray worker failed {CHUNK_TRIES} times "
                                                                          f"on it: {e}") for t in chunk]
                    for result in results:
                        emit(result)
        except KeyboardInterrupt:
            self.close()  # kills the actors: their pages stay pending in the state
            return True
        finally:
            blobs.clear()
        return False

    def _results(self, ray, ref, chunk: list[PageTask], docs: dict) -> list[PageResult]:
        """The chunk's page results; _WorkerLost when the worker (not the pages) failed."""
        try:
            rows = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the call raised in the worker: a bug, the chunk's pages fail
            reason = f"Ray worker failed: {_said(e)}"
            return [PageResult(t.doc, t.page, "", 0, None, reason) for t in chunk]
        except ray.exceptions.RayError as e:  # died, restarting, its node or the object gone
            raise _WorkerLost(_said(e)) from None
        got = {(r["doc_id"], r["page"]): r for r in rows}
        out = []
        for t in chunk:
            r = got.get((t.doc.doc_id, t.page))
            if r is None:
                out.append(PageResult(t.doc, t.page, "", 0, None, "the Ray worker returned no result for this page"))
            else:
                secs = {s: float(r["seconds"].get(s, 0.0)) for s in STAGES}
                out.append(PageResult(docs[r["doc_id"]], r["page"], r["text"], r["n_tokens"], r["finish_reason"], r["error"], secs))
        return out

    def close(self) -> None:
        if not self.actors and not self.started_ray:
            return
        ray = import_ray()
        if self.actors:
            shut = True
            try:
                ray.get([a.shutdown.remote() for a in self.actors], timeout=10)
            except Exception:  # noqa: BLE001 - best effort: temp copies of inputs
                shut = False
            for a in self.actors:
                ray.kill(a)
            self.actors = []
            # a worker dead for good (its restarts spent) left its copies on this node, and so does
            # one killed before its shutdown (restarting still): it exits a moment after ray.kill
            deadline = time.monotonic() + (0.0 if shut else 3.0)
            while True:
                _sweep_caches()
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


CACHE_PREFIX = "pantheon-ray-"  # + the worker's pid: the copies of its inputs


def _sweep_caches() -> None:
    """Input copies of workers that died without their shutdown (killed, OOM): removed by the
    next worker on the node, so that a bad night does not fill /tmp."""
    from .sqlite import pid_alive

    for folder in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*-*"):
        pid = folder.name[len(CACHE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


MAX_RESTARTS = 2  # Ray restarts a worker that died this many times (max_restarts)
MAX_LOST = 3  # times a worker may be lost (its restarts, and one more) before it counts as dead
CHUNK_TRIES = 3  # times a chunk is sent again after losing its worker before its pages fail
PROBE_PAUSE = 1.0  # seconds between asking a lost worker whether it is back
PROBE_TRIES = 120  # answers of "restarting" (about 2 minutes) before a lost worker counts as dead


class _WorkerLost(Exception):
    """A chunk's worker died (or was restarting, or its node went): not the pages' failure."""


class _Workers:
    """What the driver knows of its workers: the calls each has in flight (`load`), and the ones
    lost. A worker that loses a call is down: Ray restarts it, and it is sent nothing until a probe
    (`where`) answers. Chunks sent back at once to a worker still restarting met "restarting"
    until their tries were spent, their pages failed as an attempt each and read again hotter
    (on a busy node a restart takes seconds)."""

    def __init__(self, actors: list):
        n = len(actors)
        self.actors, self.load, self.lost = actors, [0] * n, [0] * n
        self.down = [False] * n
        self.culprit: list[int | None] = [None] * n  # the call it was running when it went (sent order)
        self.probes: dict[Any, int] = {}  # probe ref -> worker
        self.next_probe, self.probe_answers = [0.0] * n, [0] * n

    def live(self) -> list[int]:
        return [i for i in range(len(self.actors)) if self.lost[i] <= MAX_LOST]

    def up(self) -> list[int]:
        return [i for i in self.live() if not self.down[i]]

    def lost_call(self, i: int, sent: int, others: list[int]) -> bool:
        """Worker i lost the call sent `sent`-th (`others`: its calls still in flight); whether the
        call is charged a try: the one it was running (its oldest: an actor runs calls in order),
        not those queued behind it."""
        if not self.down[i]:
            self.down[i], self.lost[i], self.probe_answers[i] = True, self.lost[i] + 1, 0
            self.culprit[i], self.next_probe[i] = min([sent, *others]), 0.0
        return sent == self.culprit[i]

    def _unprobed(self) -> list[int]:
        """The live workers that are down with no probe out."""
        probing = set(self.probes.values())
        return [i for i in self.live() if self.down[i] and i not in probing]

    def probe_the_lost(self) -> None:
        now = time.monotonic()
        for i in self._unprobed():
            if self.next_probe[i] <= now:
                self.probes[self.actors[i].where.remote()] = i

    def next_probe_in(self) -> float:
        due = [self.next_probe[i] for i in self._unprobed()]
        return max(0.0, min(due, default=time.monotonic() + PROBE_PAUSE) - time.monotonic())

    def probed(self, ray, ref) -> None:
        i = self.probes.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            # restarting still (a probe sent as it went may say "died" too): ask again in a while;
            # past its restarts, or after PROBE_TRIES answers, it is dead for good
            self.probe_answers[i] += 1
            self.next_probe[i] = time.monotonic() + PROBE_PAUSE
            if self.lost[i] > MAX_RESTARTS or self.probe_answers[i] >= PROBE_TRIES:
                self.lost[i] = MAX_LOST + 1
            return
        self.down[i], self.culprit[i] = False, None


def _said(e: BaseException) -> str:
    """What a Ray error says, in a line: a worker's own exception as it was raised; else the first
    sentence of Ray's message (its advice on the OOM killer and the like left out)."""
    cause = getattr(e, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    first = lines[0]
    return (first.split(". ")[0] if len(first) > 300 else first)[:300]


def _reachable(address: str) -> None:
    """A HOST:PORT address answers on TCP within seconds, and as a gRPC server does, or
    NetworkError (69): ray.init would retry for minutes, the lock held, printing C++ lines (a
    web server's port, the dashboard's 8265 say, hung it as a dead address did)."""
    if address in ("local", "auto") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT) as conn:
            reply = _first_reply(conn)
    except ValueError:
        raise JobError(f"{address}: not a Ray address (HOST:PORT, auto, local or ray://HOST:PORT)") from None
    except OSError as e:
        raise NetworkError(f"the Ray cluster at {address}", f"cannot be reached: {e.strerror or e}") from None
    # The GCS is a gRPC server: it sends HTTP/2's SETTINGS frame (type 4, the 4th byte) as soon as
    # a connection opens; a TLS-guarded one answers the preface with a TLS record (first byte
    # 20-23). A closed connection (a proxy, a firewall) is left to Ray; silence is no GCS, nor is
    # a server that plainly speaks something else (ray.init waited minutes on either).
    if reply is None:
        raise NetworkError(f"the Ray cluster at {address}", f"accepts connections but said nothing in {REPLY_TIMEOUT:g} s, "
                                                         "where a Ray head answers at once: is this the head's --port "
                                                         "(6379 unless set), and is the head alive?")
    if reply and not (len(reply) >= 4 and reply[3] == 4) and not 20 <= reply[0] <= 23:
        said = reply.split(b"\n")[0].rstrip(b"\r").decode("latin-1")[:60]
        said = f"it said {said!r}" if said.isprintable() else "it is no gRPC server"
        raise NetworkError(f"the Ray cluster at {address}", f"answers, but not as a Ray cluster does ({said}): "
                                                             "is this the head's --port (6379 unless set)?")


def _first_reply(conn: socket.socket) -> bytes | None:
    """The first bytes a server sends back to HTTP/2's client preface and an empty SETTINGS frame
    (b"": it closed or reset the connection; None: nothing within REPLY_TIMEOUT)."""
    conn.settimeout(REPLY_TIMEOUT)
    try:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        return conn.recv(64)
    except socket.timeout:
        return None
    except OSError:  # a reset: nothing said
        return b""


REACH_TIMEOUT = 10.0  # seconds for a cluster's address to answer
REPLY_TIMEOUT = 10.0  # seconds for it to answer HTTP/2's opening (a GCS sends its SETTINGS as it accepts)
