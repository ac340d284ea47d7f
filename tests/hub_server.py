"""A small Hugging Face Hub on 127.0.0.1 for `models pull` tests: enough of the protocol that
huggingface_hub (read from its source: file_download.py, hf_api.py, utils/_http.py) downloads
from it as from the real one.

    HEAD /{repo}/resolve/{rev}/{file}       302 to the "CDN" (another origin) with X-Repo-Commit,
                                            ETag (git sha1), X-Linked-Etag (sha256), X-Linked-Size
    GET  {cdn}/blobs/{sha256}                the bytes; Range requests answered with 206
    GET  /api/models/{repo}/tree/{rev}       the file listing (list_repo_files)
    GET  /api/models/{repo}/revision/{rev}   model_info (older huggingface_hub list with it)

Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which is
how huggingface_hub tells them apart. Faults, per file sha256: `cut_once` closes the
connection halfway through the first full GET; `corrupt` sends other bytes of the right length;
`trickle` sends the first half, then one byte every `gap` seconds; `endless` sends no
Content-Length and the file's bytes followed by zeros without end (`sent` counts what went).
Per route ("api", "resolve", "cdn"): `headers` are set on every answer (a hostile ETag, say),
`answer` = (status, headers) is answered instead. `SilentServer` accepts connections and never
answers; `closed_port()` is a port where nothing listens.
Every request is recorded (`requests`: method, path, headers with lower-case names).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = COMMIT
    token: str | None = None  # private: only this Bearer token sees it


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_once: set[str] = field(default_factory=set)  # sha256 of files whose first transfer breaks
    corrupt: set[str] = field(default_factory=set)  # sha256 of files always sent wrong
    trickle: set[str] = field(default_factory=set)  # sha256 of files sent half, then a byte every `gap` s
    endless: set[str] = field(default_factory=set)  # sha256 of files sent without Content-Length, never ending
    gap: float = 2.0
    sent: dict[str, int] = field(default_factory=dict)  # sha256 -> bytes the CDN wrote of it
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # route -> headers set on each answer
    answer: dict[str, tuple[int, dict]] = field(default_factory=dict)  # route -> (status, headers) instead
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    stopping: bool = False
    endpoint: str = ""
    cdn: str = ""

    def add(self, repo: str, files: dict[str, bytes], token: str | None = None) -> None:
        self.repos[repo] = Repo(files, token=token)

    def blob(self, sha: str) -> bytes | None:
        for repo in self.repos.values():
            for data in repo.files.values():
                if hashlib.sha256(data).hexdigest() == sha:
                    return data
        return None

    def gets(self, prefix: str) -> list[tuple[str, str, dict]]:
        return [r for r in self.requests if r[0] == "GET" and r[1].startswith(prefix)]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: Hub, role: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        # -- helpers ---------------------------------------------------------------------
        def _send(self, code: int, headers: dict | None = None, body: bytes = b"", head: bool = False) -> None:
            self.send_response(code)
            headers = {**(headers or {}), **hub.headers.get(self.route, {})}
            for k, v in headers.items():
                self.send_header(k, str(v))
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self.wfile.write(body)

        def _error(self, code: int, error_code: str, head: bool, commit: str | None = None) -> None:
            headers = {"X-Error-Code": error_code, "X-Error-Message": error_code, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(code, headers, json.dumps({"error": error_code}).encode(), head)

        def _repo(self, name: str, rev: str, head: bool) -> Repo | None:
            """The repo at revision `rev`, or None once the error is sent (unknown or private repo,
            unknown revision)."""
            repo = hub.repos.get(name)
            auth = self.headers.get("Authorization", "")
            if repo is None or (repo.token is not None and auth != f"Bearer {repo.token}"):
                self._error(401 if repo is not None else 404, "RepoNotFound", head)
                return None
            if rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", head)
                return None
            return repo

        def _serve(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(("HEAD" if head else "GET", path, {k.lower(): v for k, v in self.headers.items()}))
            parts = path.strip("/").split("/")
            self.route = "cdn" if role == "cdn" else "api" if parts[:2] == ["api", "models"] else "resolve"
            if self.route in hub.answer:
                code, headers = hub.answer[self.route]
                return self._send(code, headers, b"", head)
            if role == "cdn":
                return self._cdn(path, head)
            if self.route == "api" and len(parts) == 4:  # model_info without a revision: main
                return self._api(f"{parts[2]}/{parts[3]}", "revision", "main", head)
            if self.route == "api" and len(parts) >= 6 and parts[4] in ("tree", "revision"):
                return self._api(f"{parts[2]}/{parts[3]}", parts[4], parts[5], head)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
            self._error(404, "RepoNotFound", head)

        def _api(self, name: str, kind: str, rev: str, head: bool) -> None:
            repo = self._repo(name, rev, head)
            if repo is None:
                return
            if kind == "tree":
                body = [{"type": "file", "path": f, "size": len(d), "oid": git_sha1(d),
                         "lfs": {"oid": sha256(d), "size": len(d), "pointerSize": 134}} for f, d in repo.files.items()]
            else:
                body = {"id": name, "modelId": name, "sha": repo.commit, "private": repo.token is not None,
                        "siblings": [{"rfilename": f, "size": len(d), "blobId": git_sha1(d),
                                      "lfs": {"sha256": sha256(d), "size": len(d), "pointerSize": 134}}
                                     for f, d in repo.files.items()]}
            self._send(200, {"Content-Type": "application/json"}, json.dumps(body).encode(), head)

        def _resolve(self, name: str, rev: str, filename: str, head: bool) -> None:
            repo = self._repo(name, rev, head)
            if repo is None:
                return
            data = repo.files.get(filename)
            if data is None:
                return self._error(404, "EntryNotFound", head, repo.commit)
            # As the Hub does for LFS files: a redirect to the CDN; the metadata is on this response.
            self._send(302, {"Location": f"{hub.cdn}/blobs/{sha256(data)}", "X-Repo-Commit": repo.commit,
                             "ETag": f'"{git_sha1(data)}"', "X-Linked-Etag": f'"{sha256(data)}"',
                             "X-Linked-Size": len(data)}, b"", head)

        def _cdn(self, path: str, head: bool) -> None:
            sha = path.rsplit("/", 1)[-1]
            data = hub.blob(sha)
            if data is None:
                return self._send(404, {}, b"no such blob", head)
            if sha in hub.corrupt:
                data = bytes(b ^ 0x5A for b in data)
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[len("bytes="):].split("-")[0])
            body = data[start:]
            headers = {"Content-Length": len(body), "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            if sha in hub.endless:
                del headers["Content-Length"]
                self.close_connection = True
            self.send_response(206 if start else 200)
            for k, v in {**headers, **hub.headers.get("cdn", {})}.items():
                self.send_header(k, str(v))
            self.end_headers()
            if head:
                return
            if sha in hub.endless:
                return self._write_all(sha, body + bytes(1 << 20), forever=True)
            if sha in hub.trickle:
                self._write_all(sha, body[: len(body) // 2])
                for i in range(len(body) // 2, len(body)):
                    if not self._slowly(sha, body[i:i + 1]):
                        return
                return
            if not start and sha in hub.cut_once:
                hub.cut_once.discard(sha)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _write_all(self, sha: str, data: bytes, forever: bool = False) -> None:
            """Write `data` (again and again if `forever`) until the client goes or the hub stops."""
            try:
                while not hub.stopping:
                    self.wfile.write(data)
                    hub.sent[sha] = hub.sent.get(sha, 0) + len(data)
                    if not forever:
                        return
                    data = bytes(len(data))  # then zeros
            except OSError:
                pass

        def _slowly(self, sha: str, byte: bytes) -> bool:
            deadline = time.monotonic() + hub.gap
            while time.monotonic() < deadline:
                if hub.stopping:
                    return False
                time.sleep(0.05)
            try:
                self.wfile.write(byte)
                self.wfile.flush()
            except OSError:
                return False
            hub.sent[sha] = hub.sent.get(sha, 0) + 1
            return True

    return Handler


class HubServer:
    """The hub and its CDN, each a threaded server on 127.0.0.1 (two origins, as on the Hub)."""

    def __init__(self) -> None:
        self.hub = Hub()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.hub, role)) for role in ("hub", "cdn")]
        self.hub.endpoint = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.hub.cdn = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                         for s in self._servers]

    def __enter__(self) -> Hub:
        for t in self._threads:
            t.start()
        return self.hub

    def __exit__(self, *exc) -> None:
        self.hub.stopping = True
        for s in self._servers:
            s.shutdown()
            s.server_close()


class SilentServer:
    """A server on 127.0.0.1 that accepts every connection and never sends a byte (a hung Hub)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self.accepted.append(self._sock.accept()[0])  # held open, never answered
            except OSError:
                continue

    def __enter__(self) -> "SilentServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for c in self.accepted:
            c.close()
        self._sock.close()


def closed_port() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens (a connection is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
