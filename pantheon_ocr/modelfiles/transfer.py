"""The network half of `models pull`: the limits every Hub request runs under, what a failure is
called, and the download of one file's bytes.

Limits (`Limits`; defaults, and the environment variables that change them):

    timeout   20 s        PANTHEON_HUB_TIMEOUT   to connect; the longest silence while reading; the
                                                 whole of each API or metadata answer; the window of
                                                 the minimum rate
    min_rate  16000 B/s   PANTHEON_HUB_MIN_RATE  a download slower than this over `timeout` seconds
                                                 is stalled (a CDN sending 1 byte every 2 s fails)
    max_wait  60 s        PANTHEON_HUB_MAX_WAIT  the longest Retry-After (429/503) waited for, once;
                                                 a longer one fails at once, saying how long
    deadline  7200 s      PANTHEON_HUB_DEADLINE  the whole pull; the time left bounds every request

huggingface_hub's own HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT do not apply: every call
is given these limits explicitly. Retries only where they help: a transfer that breaks after
bytes came is resumed with a Range request (up to `resumes` times, each said in a line), one
Retry-After up to `max_wait` is waited for; nothing else is retried (a refused, silent or
failing server is one line at once). A stalled or unfinished transfer keeps its partial file
(`blobs/<sha256>.incomplete`, as huggingface_hub names it), and the next pull resumes it.

A body is never read past the listed size: the reading stops there whatever the server sends.
"""

from __future__ import annotations

import errno
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..errors import NetworkError, OptionError, UsageError, WriteError

ENV = {"timeout": "PANTHEON_HUB_TIMEOUT", "min_rate": "PANTHEON_HUB_MIN_RATE", "max_wait": "PANTHEON_HUB_MAX_WAIT",
       "deadline": "PANTHEON_HUB_DEADLINE"}


@dataclass(frozen=True)
class Limits:
    timeout: float = 20.0
    min_rate: float = 16_000.0
    max_wait: float = 60.0
    deadline: float = 7200.0
    resumes: int = 3

    @classmethod
    def from_env(cls, environ=None, **given: float | None) -> "Limits":
        """The defaults, then the PANTHEON_HUB_* variables, then `given` (None: not given)."""
        environ = os.environ if environ is None else environ
        values = {}
        for name, var in ENV.items():
            if given.get(name) is not None:
                value = float(given[name])
                if not _positive(name, value):
                    raise OptionError(name, "must be a positive number of seconds" if name != "min_rate"
                                      else "must be a positive number of bytes per second", given[name])
            elif environ.get(var, "").strip():
                try:
                    value = float(environ[var])
                except ValueError:
                    value = float("nan")
                if not _positive(name, value):
                    raise UsageError(f"{var}={environ[var]!r}: not a positive number")
            else:
                continue
            values[name] = value
        return replace(cls(), **values)

    def start(self) -> "Clock":
        return Clock(self, time.monotonic() + self.deadline)


def _positive(name: str, value: float) -> bool:
    return math.isfinite(value) and (value > 0 or (name == "max_wait" and value == 0))


@dataclass
class Clock:
    """The pull's deadline, running."""

    limits: Limits
    ends: float

    def left(self, where: str) -> float:
        """Seconds left (at most `timeout`, for one request); NetworkError once it has passed."""
        left = self.ends - time.monotonic()
        if left <= 0:
            raise NetworkError(where, f"the pull's deadline of {self.limits.deadline:g} s passed; run the pull again "
                                      "(a partial file is resumed)", "deadline")
        return min(left, self.limits.timeout)

    def timeout(self, where: str):
        import httpx2

        t = self.left(where)
        return httpx2.Timeout(t, connect=t, read=t, write=t, pool=t)

    def within(self, where: str, endpoint: str, call: Callable, cleanup: Callable | None = None):
        """`call()` in a worker thread, given `left()` seconds of wall time: a server that trickles
        its headers one byte at a time cannot hold a request past its limit. `cleanup(result)`
        runs on a result that came too late."""
        limit = self.left(where)
        box: dict = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["ok"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["err"] = e
            done.set()
            if box.get("late") and "ok" in box and cleanup is not None:
                cleanup(box["ok"])

        threading.Thread(target=work, daemon=True, name="pantheon-hub").start()
        if not done.wait(limit + min(1.0, limit / 4)):  # httpx's own timeouts first: they say which phase
            box["late"] = True
            if done.is_set() and "ok" in box and cleanup is not None:
                cleanup(box["ok"])
            raise _silent(where, endpoint, self, limit)
        if "err" in box:
            raise box["err"]
        return box["ok"]


def _silent(where: str, url: str, clock: Clock, waited: float) -> NetworkError:
    if clock.ends - time.monotonic() <= 0:
        return NetworkError(where, f"the pull's deadline of {clock.limits.deadline:g} s passed while waiting for "
                                   f"{origin(url)}; run the pull again", "deadline")
    return NetworkError(where, f"{origin(url)} did not answer within {waited:g} s (timed out)", "timeout")


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def retry_after(response) -> float | None:
    """The Retry-After (seconds) of a 429 or 503 answer, else None."""
    if response is None or getattr(response, "status_code", None) not in (429, 503):
        return None
    raw = response.headers.get("Retry-After", "").strip()
    return float(raw) if raw.isdigit() else None


def ask(clock: Clock, where: str, url: str, call: Callable, say: Callable[[str], None]):
    """One API or metadata request, bounded by `clock`; a Retry-After up to `max_wait` is waited for
    once. Network failures become NetworkError; the Hub's other answers (no such repo, ...) are
    raised as they came, for the caller to word."""
    for attempt in (1, 2):
        try:
            return clock.within(where, url, call)
        except Exception as e:  # noqa: BLE001 - sorted just below
            wait = retry_after(getattr(e, "response", None))
            if attempt == 1 and _may_wait(clock, wait):
                say(f"{where}: {origin(url)} asks to wait {wait:g} s (HTTP {e.response.status_code}); waiting once")
                time.sleep(wait)
                continue
            err = network_error(e, where, url, clock)
            if err is None:
                raise
            raise err from None


def _may_wait(clock: Clock, wait: float | None) -> bool:
    return wait is not None and wait <= clock.limits.max_wait and wait < clock.ends - time.monotonic()


def network_error(e: BaseException, where: str, url: str, clock: Clock) -> NetworkError | None:
    """What went wrong on the way to `url`, in one line; None when `e` is an answer of the Hub that
    is not about the network (no such repo, gated, ...: the caller words those)."""
    import httpx2

    host, limits = origin(url), clock.limits
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(e, NetworkError):
        return e
    if status == 429:
        wait = retry_after(response)
        asks = ("it gives no Retry-After" if wait is None else
                f"it asks to wait {wait:g} s, more than the {limits.max_wait:g} s a pull waits" if wait > limits.max_wait
                else f"it asks to wait {wait:g} s (a pull waits once, within its deadline)")
        return NetworkError(where, f"rate-limited by {host} (HTTP 429): {asks}; try again later", "max_wait")
    if status is not None and status >= 500:
        return NetworkError(where, f"cannot reach the Hub: {host} answered HTTP {status} (a server error); "
                                   "try again later")
    if status is not None:
        return None
    if isinstance(e, httpx2.TimeoutException) and time.monotonic() >= clock.ends - 0.05:
        return _silent(where, url, clock, limits.deadline)
    if isinstance(e, httpx2.ConnectTimeout):
        return NetworkError(where, f"cannot reach the Hub: no connection to {host} within {limits.timeout:g} s "
                                   "(timed out; a firewall or no network?)", "timeout")
    if isinstance(e, (httpx2.ReadTimeout, httpx2.WriteTimeout, httpx2.PoolTimeout)):
        return NetworkError(where, f"{host} accepted the connection but sent nothing for {limits.timeout:g} s "
                                   "(timed out)", "timeout")
    if isinstance(e, httpx2.ConnectError):
        return NetworkError(where, f"cannot reach the Hub at {host}: {_connect_cause(e, url)}")
    if isinstance(e, (httpx2.TransportError, httpx2.TooManyRedirects, OSError)):
        return NetworkError(where, f"the connection to {host} failed: {type(e).__name__}: {one_line(e)}")
    if isinstance(e, (ValueError, KeyError, TypeError)):  # an answer that does not parse
        return NetworkError(where, f"{host} gave an answer that is not the Hub's ({type(e).__name__}: {one_line(e)})")
    return None


def _connect_cause(e: BaseException, url: str) -> str:
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    host = urlsplit(url).hostname or url
    if isinstance(cause, socket.gaierror):
        return f"host {host} not found (no network or no DNS?; HF_HUB_OFFLINE=1 uses what is in the cache)"
    code = cause.errno if cause is not None else None  # the loop stops at an OSError or at nothing
    if code == errno.ECONNREFUSED:
        return "connection refused (nothing listens there: is HF_ENDPOINT right?)"
    if code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN):
        return "network unreachable (no network?)"
    return f"the Hub is down or unreachable ({one_line(cause or e)})"


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- one file's bytes ---------------------------------------------------------------------------------
class _Broken(Exception):
    """The connection broke while the body came (`progress` bytes came first)."""

    def __init__(self, cause: BaseException, progress: int):
        super().__init__(str(cause))
        self.cause, self.progress = cause, progress


def fetch(url: str, part: Path, size: int, *, auth: bool, clock: Clock, where: str,
          bar=None, say: Callable[[str], None] = lambda line: None) -> None:
    """Bring `part` (the partial file) to `size` bytes from `url`, resuming from what it holds.
    `auth`: send the Hub token (only to the Hub's own host, never to a CDN)."""
    import httpx2

    resumes = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            _write(part, "wb", where).close()
            have = 0
        if have == size:
            return
        try:
            _get(url, part, have, size, auth=auth, clock=clock, where=where, bar=bar)
            return
        except _Broken as broke:
            resumes += 1
            got = part.stat().st_size if part.exists() else 0
            if broke.progress == 0 or resumes > clock.limits.resumes:
                tries = f" {resumes} times" if resumes > 1 else ""
                raise NetworkError(where, f"the connection to {origin(url)} broke{tries} ({type(broke.cause).__name__}) "
                                          f"at {mb(got)} of {mb(size)}; run the pull again to resume") from None
            say(f"{where}: the connection broke at {mb(got)} of {mb(size)}; resuming "
                f"({resumes}/{clock.limits.resumes})")
        except httpx2.HTTPError as e:
            raise (network_error(e, where, url, clock) or NetworkError(where, one_line(e))) from None


def _get(url: str, part: Path, have: int, size: int, *, auth: bool, clock: Clock, where: str, bar) -> None:
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = build_hf_headers(token=None if auth else False)
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
    for attempt in (1, 2):
        client = get_session()
        request = client.build_request("GET", url, headers=headers, timeout=clock.timeout(where))
        response = clock.within(where, url, lambda: client.send(request, stream=True, follow_redirects=True),
                                cleanup=lambda r: r.close())
        wait = retry_after(response)
        if attempt == 1 and _may_wait(clock, wait):
            response.close()
            time.sleep(wait)
            continue
        break
    try:
        if response.status_code >= 400:
            raise _status(response, where, url, clock)
        if have and response.status_code == 206 and not response.headers.get("Content-Range", "").startswith(
                f"bytes {have}-"):
            raise NetworkError(where, f"{origin(str(response.request.url))} sent another part of the file than asked "
                                      f"(Content-Range {response.headers.get('Content-Range')!r}, asked from {have})")
        if response.status_code != 206:
            have = 0  # the whole file (the server ignored the Range): start over
        _body(response, part, "ab" if have else "wb", have, size, clock=clock, where=where, bar=bar)
    finally:
        response.close()


def _status(response, where: str, url: str, clock: Clock) -> NetworkError:
    import httpx2

    err = network_error(httpx2.HTTPStatusError("", request=response.request, response=response), where, url, clock)
    if err is not None:
        return err
    return NetworkError(where, f"the download server {origin(str(response.request.url))} answered HTTP "
                               f"{response.status_code} for a listed file; try again later")


def _body(response, part: Path, mode: str, have: int, size: int, *, clock: Clock, where: str, bar) -> None:
    import httpx2

    limits = clock.limits
    written = have
    win_start, win_bytes = time.monotonic(), written
    f = _write(part, mode, where)
    if bar is not None:
        bar.reset(total=size)
        bar.update(have)
    try:
        for chunk in response.iter_raw():  # as it comes: no buffering that would hide a trickle
            take = chunk[: size - written]
            try:
                f.write(take)
            except OSError as e:
                raise WriteError(f"{where}: cannot write {part}: {e.strerror or e}") from None
            written += len(take)
            if bar is not None:
                bar.update(len(take))
            if written >= size:
                return  # never past the listed size, whatever else the server would send
            now = time.monotonic()
            clock.left(where)
            if now - win_start >= limits.timeout:
                if written - win_bytes < limits.min_rate * (now - win_start):
                    raise NetworkError(where, f"the download from {origin(str(response.request.url))} stalled at "
                                              f"{mb(written)} of {mb(size)} (under {limits.min_rate:g} bytes/s for "
                                              f"{now - win_start:.0f} s); run the pull again to resume", "min_rate")
                win_start, win_bytes = now, written
    except (httpx2.ReadTimeout, httpx2.WriteTimeout) as e:
        clock.left(where)  # the deadline, if that is what cut the read short
        raise NetworkError(where, f"the download from {origin(str(response.request.url))} stalled at {mb(written)} of "
                                  f"{mb(size)} (nothing for {limits.timeout:g} s); run the pull again to resume",
                           "timeout") from e
    except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.NetworkError) as e:
        raise _Broken(e, written - have) from None
    finally:
        f.close()
    if written < size:
        raise _Broken(EOFError("the body ended early"), written - have)


def _write(part: Path, mode: str, where: str):
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        return open(part, mode)
    except OSError as e:
        raise WriteError(f"{where}: cannot write {part}: {e.strerror or e}") from None


__all__ = ["ENV", "Clock", "Limits", "ask", "fetch", "network_error", "retry_after"]
