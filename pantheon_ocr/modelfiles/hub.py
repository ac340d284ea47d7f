"""`models pull` and `models list`: LightOnOCR GGUFs from the Hugging Face Hub into its cache.

huggingface_hub's settings hold: HF_ENDPOINT (a mirror), HF_HOME / HF_HUB_CACHE (where files
go), HF_HUB_OFFLINE, HF_TOKEN or `hf auth login` (private and gated repos),
HF_HUB_DISABLE_PROGRESS_BARS. The cache is huggingface_hub's own layout
(`models--owner--repo/blobs/<sha256>`, `snapshots/<commit>/<path>` linking to the blob,
`refs/<branch>`), so its tools and ours see the same files.

How a pull goes, and why it does not hand the download to `hf_hub_download`: that function
builds cache paths from what the server says (the ETag names the blob, X-Repo-Commit the
snapshot, even a `.no_exist` marker on a 404) and reads a body for as long as it comes. Here
huggingface_hub asks, and this module decides what becomes a path:

1. `HfApi.model_info(files_metadata=True)`: the commit, and each file's size and SHA-256 (LFS)
   or git SHA-1. The commit must be 40 hex digits, the chosen files' names relative paths of
   plain components (no `..`, no separator tricks), the checksums hex digests; anything else is
   refused in one line before a byte is written.
2. `get_hf_file_metadata` (one HEAD, pinned to that commit) for a file not yet in the cache: its
   X-Repo-Commit, ETag / X-Linked-Etag and size must agree with the listing; it only gives the
   download location. The blob is named after the listing's checksum, never after a header.
3. transfer.py downloads into `blobs/<sha256>.incomplete` under the limits it documents (timeout
   20 s, minimum rate 16000 B/s, Retry-After cap 60 s, deadline 7200 s per pull; the
   PANTHEON_HUB_* variables or `Limits` change them), never past the listed size, resuming a
   partial file. The bytes are hashed and must match the listing, whatever the ETag looks
   like, or the file is removed (a file already in the cache is hashed again on every pull).
4. Both files are opened as GGUF and checked to be one LightOnOCR pair (engine/format/pairing.py);
   if not, what this pull downloaded is removed.
5. Only then the snapshot links and the ref are written, each by an atomic rename: `models list`
   and `--model NAME` (catalog.local_pair) never see half a model.

Failures: NetworkError (exit 69) when the Hub cannot be reached or answers unusably (each cause
worded in transfer.py), ModelError (exit 3) for no such repo / revision / file, a gated repo, a
repo without a pair, a corrupted or invalid file; WriteError (73) when the cache cannot be written.

Only `models pull` reaches the network. Running a model (engine/loader.py, catalog.py) reads the
cache and never downloads: a nightly job with a model that is not there fails with the pull
command to run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import catalog, transfer
from .transfer import Clock, Limits, mb, origin
from ..engine.format.pairing import check_pair
from ..errors import ModelError, NetworkError, UsageError, WriteError, path_text

_ETAG = re.compile(r"[0-9a-f]{32,64}")


@dataclass(frozen=True)
class Pulled:
    name: str  # as the user gave it (use it with --model)
    repo: str
    revision: str  # the commit the files came from
    text: Path
    mmproj: Path
    offline: bool = False  # taken from the cache without asking the Hub (HF_HUB_OFFLINE)


@dataclass(frozen=True)
class _Entry:
    """A file as the Hub's listing gives it."""

    path: str
    size: int
    digest: str  # SHA-256 (LFS) or git's SHA-1: the blob's name, and what its bytes must hash to


def pull(name: str, quant: str | None = None, revision: str | None = None, *, progress: bool = True,
         endpoint: str | None = None, cache_dir: str | os.PathLike | None = None,
         log: Callable[[str], None] | None = None, limits: Limits | None = None) -> Pulled:
    """Download (or find up to date in the cache) the text GGUF and the mmproj GGUF of `name`,
    verify both, and only then make them visible in the cache. `limits`: transfer.Limits (None:
    the defaults and PANTHEON_HUB_*). Errors: see the module docstring."""
    constants = catalog.hf_constants()

    ref = catalog.parse_name(name, quant)
    if ref is None:
        raise UsageError(f"{name}: not a model name: use a known name ({', '.join(catalog.KNOWN)}) or owner/repo")
    if revision is not None and not catalog.safe_revision(revision):
        raise UsageError(f"{revision!r}: not a branch, tag or commit name")
    say = log or (lambda line: None)
    if constants.HF_HUB_OFFLINE:
        return _offline(name, ref, revision, cache_dir, say)
    clock = (limits or Limits.from_env()).start()
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    commit, files = _listing(ref, revision, endpoint, clock, say)
    text_name, mmproj_name = catalog.pick_pair(files, ref, f"{ref.repo}{f'@{revision}' if revision else ''}")
    root = catalog.repo_dir(ref.repo, cache_dir)
    blobs: dict[str, Path] = {}
    new: list[Path] = []
    for entry in [_safe(files[f], ref, endpoint) for f in (text_name, mmproj_name)]:  # both, before a byte comes
        filename, blob = entry.path, root / "blobs" / entry.digest
        if blob not in blobs.values() and _bring(ref, commit, entry, blob, endpoint, clock, progress, say):
            new.append(blob)
        blobs[filename] = blob
    _check_pair(ref, blobs, new)
    snap = root / "snapshots" / commit
    try:
        for filename, blob in blobs.items():
            _link(blob, snap / filename)
        if (revision or "main") != commit:
            _replace_text(root / "refs" / (revision or "main"), commit)
    except OSError as e:
        raise WriteError(f"{ref.repo}: cannot write the Hugging Face cache {root}: {e.strerror or e}") from None
    return Pulled(name, ref.repo, commit, snap / text_name, snap / mmproj_name)


def _offline(name: str, ref: catalog.ModelRef, revision: str | None, cache_dir, say) -> Pulled:
    try:
        text, mmproj = catalog.local_pair(ref.label, cache_dir, revision)
    except ModelError as e:
        raise ModelError(e.path, f"offline (HF_HUB_OFFLINE is set) and not in the cache {catalog.hub_cache(cache_dir)} "
                                 "as asked: unset HF_HUB_OFFLINE to download it") from None
    say(f"offline (HF_HUB_OFFLINE): {ref.label} is in the cache; not checked against the Hub")
    snap = catalog.snapshot_dir(ref.repo, revision, cache_dir)
    for path in (text, mmproj):
        blob = Path(os.path.realpath(path))
        if catalog.is_digest(blob.name) and _hash(blob, blob.name) != blob.name:
            raise ModelError(path, "damaged in the cache: its bytes do not hash to its checksum; pull it again online")
    return Pulled(name, ref.repo, snap.name, text, mmproj, offline=True)


def _listing(ref: catalog.ModelRef, revision: str | None, endpoint: str, clock: Clock, say) -> tuple[str, dict]:
    """(commit, {path: _Entry}) of the repo at `revision`, from one model_info call."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    try:
        info = transfer.ask(clock, ref.repo, f"{endpoint}/api/models/{ref.repo}", _local(
            ref.repo, lambda: api.model_info(ref.repo, revision=revision or "main", files_metadata=True,
                                             timeout=clock.left(ref.repo))), say)
    except (NetworkError, WriteError):
        raise
    except Exception as e:  # noqa: BLE001 - every other way the Hub can say no becomes one line
        raise _hub_error(ref, revision, e, endpoint=endpoint) from None
    commit = info.sha
    if not (isinstance(commit, str) and len(commit) == 40 and catalog.is_digest(commit)):
        raise NetworkError(ref.repo, f"{endpoint} named the commit {str(commit)[:60]!r}, not 40 hex digits: refused")
    if revision is not None and len(revision) == 40 and catalog.is_digest(revision) and revision != commit:
        raise NetworkError(ref.repo, f"{endpoint} answered commit {commit} for commit {revision}: refused")
    files = {}
    for s in info.siblings or []:
        if not isinstance(s.rfilename, str):
            raise NetworkError(ref.repo, f"{endpoint} listed a file name that is not text ({s.rfilename!r}): refused")
        lfs = s.lfs
        size, digest = (lfs.size, lfs.sha256) if lfs else (s.size, s.blob_id)
        files[s.rfilename] = _Entry(s.rfilename, size, digest)
    return commit, files


def _safe(entry: _Entry, ref: catalog.ModelRef, endpoint: str) -> _Entry:
    """The entry, once its name, size and checksum are fit to become paths and limits."""
    if not catalog.safe_repo_path(entry.path):
        problem = f"listed a file named {entry.path[:80]!r}, which would lead out of the cache: refused"
    elif not catalog.is_digest(entry.digest):
        problem = f"listed {entry.path} with the checksum {str(entry.digest)[:80]!r}, not a hex digest: refused"
    elif not isinstance(entry.size, int) or entry.size < 0:
        problem = f"listed {entry.path} with the size {entry.size!r}: refused"
    else:
        return entry
    raise NetworkError(ref.repo, f"{endpoint} {problem}")


def _bring(ref, commit: str, entry: _Entry, blob: Path, endpoint: str, clock: Clock, progress: bool, say) -> bool:
    """Make `blob` hold the entry's verified bytes; True if they were downloaded now."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import tqdm

    where = f"{ref.repo}/{entry.path}"
    if blob.is_file():
        if _hash(blob, entry.digest) == entry.digest:
            say(f"{where}: in the cache, checksum verified")
            return False
        say(f"{where}: the cached copy does not match the Hub's checksum; downloading it again")
        _remove(blob)
    url = hf_hub_url(ref.repo, entry.path, revision=commit, endpoint=endpoint)
    try:
        meta = transfer.ask(clock, where, url, _local(where, lambda: get_hf_file_metadata(
            url, timeout=clock.left(where), endpoint=endpoint)), say)
    except (NetworkError, WriteError):
        raise
    except Exception as e:  # noqa: BLE001
        raise _hub_error(ref, commit, e, entry.path, endpoint) from None
    location = _location(meta, entry, commit, where, url)
    part = blob.with_name(blob.name + ".incomplete")
    lock = blob.parents[2] / ".locks" / blob.parents[1].name / f"{entry.digest}.lock"  # huggingface_hub's
    say(f"{where} ({mb(entry.size)})")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with _waiting_for(lock, clock, lambda: say(f"{where}: another pull is downloading it ({lock}); waiting")):
            if blob.is_file() and _hash(blob, entry.digest) == entry.digest:  # that pull brought it
                say(f"{where}: brought by the other pull, checksum verified")
                return False
            _room_for(part, entry.size, where)
            with tqdm(total=entry.size, unit="B", unit_scale=True, desc=entry.path.rsplit("/", 1)[-1],
                      disable=not progress) as bar:
                transfer.fetch(location, part, entry.size, auth=origin(location) == origin(endpoint), clock=clock,
                               where=where, bar=bar, say=say)
            got = _hash(part, entry.digest)
            if got != entry.digest:
                _remove(part)
                raise ModelError(where, f"corrupted transfer: the file's checksum is {got[:16]}... but the Hub's is "
                                        f"{entry.digest[:16]}...; the bad file was removed, run the pull again")
            os.replace(part, blob)
    except TimeoutError:  # filelock.Timeout: another pull held the file all along
        raise NetworkError(where, f"another pull was downloading this file ({lock}) until the deadline",
                           "deadline") from None
    except OSError as e:
        raise WriteError(f"{where}: cannot write the Hugging Face cache {blob.parent}: {e.strerror or e}") from None
    return True


def _room_for(part: Path, size: int, where: str) -> None:
    """WriteError (73) before a byte comes when the disk cannot hold what is left to download: a
    full disk found at 90% of a 2 GB file is an hour lost, and the partial file fills it."""
    part.parent.mkdir(parents=True, exist_ok=True)
    left = size - (part.stat().st_size if part.exists() else 0)
    free = shutil.disk_usage(part.parent).free
    if left > free:
        raise WriteError(f"{where}: {mb(left)} to download but {mb(free)} free in {part.parent}: make room, or set "
                         "HF_HOME to a disk that has it, and pull again")


@contextmanager
def _waiting_for(lock: Path, clock: Clock, waiting: Callable[[], None]):
    """huggingface_hub's lock of a file, held while it is downloaded: a pull that has to wait for
    another one says so (`waiting`) instead of going silent for up to the deadline."""
    from huggingface_hub.utils import WeakFileLock

    held = False
    try:
        with WeakFileLock(lock, timeout=min(1.0, max(clock.ends - time.monotonic(), 0.1))):
            held = True
            yield
        return
    except TimeoutError:
        if held or time.monotonic() >= clock.ends:  # the download's own, or the deadline passed
            raise
    waiting()
    with WeakFileLock(lock, timeout=max(clock.ends - time.monotonic(), 0.1)):
        yield


def _location(meta, entry: _Entry, commit: str, where: str, url: str) -> str:
    """Where to download from, once the HEAD's metadata agrees with the listing."""
    from urllib.parse import urljoin

    host = origin(url)
    etag = meta.etag
    if meta.commit_hash is not None and meta.commit_hash != commit:
        shown = meta.commit_hash if catalog.is_digest(meta.commit_hash) else f"{meta.commit_hash[:60]!r} (not a commit)"
        problem = f"its X-Repo-Commit is {shown}, the listing's commit {commit}"
    elif etag is not None and not _ETAG.fullmatch(etag):
        problem = f"its ETag {etag[:60]!r} is not a hex digest"
    elif etag is not None and len(etag) == len(entry.digest) and etag != entry.digest:
        problem = f"its ETag {etag} is not the listing's checksum {entry.digest}"
    elif meta.size is not None and meta.size != entry.size:
        problem = f"its size {meta.size} is not the listing's {entry.size}"
    else:
        location = urljoin(url, meta.location or url)
        if location.split(":", 1)[0] in ("http", "https"):
            return location
        problem = f"its download location {location[:80]!r} is not an http(s) URL"
    raise NetworkError(where, f"{host} answered file metadata that does not fit: {problem}: refused")


def _check_pair(ref: catalog.ModelRef, blobs: dict[str, Path], new: list[Path]) -> None:
    """Both files are GGUF and one LightOnOCR pair, else what this pull downloaded is removed."""
    text, mmproj = blobs.values()
    try:
        check_pair(text, mmproj)
    except ModelError as e:
        for blob in set(new):
            _remove(blob)
        problem, which = e.problem, ref.repo
        for filename, blob in blobs.items():
            problem = problem.replace(str(blob), filename)
            which = f"{ref.repo}/{filename}" if e.path == str(blob) else which
        raise ModelError(which, problem + ("; the downloaded files were removed from the cache" if new else "")) from None


def _hash(path: Path, digest: str) -> str:
    """The SHA-256 of the file, or its git SHA-1 when `digest` is one (40 hex digits)."""
    h = hashlib.sha256() if len(digest) == 64 else hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _link(blob: Path, dst: Path) -> None:
    """`dst` (a snapshot entry) -> `blob`, relative as huggingface_hub links it; a copy where
    links cannot be made. Atomic: the entry is the old one or the new one, never missing."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    _remove(tmp)
    try:
        os.symlink(os.path.relpath(blob, dst.parent), tmp)
    except OSError:
        shutil.copyfile(blob, tmp)
    os.replace(tmp, dst)


def _replace_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _local(where: str, call: Callable) -> Callable:
    """`call`, with an OSError about a local path raised as the WriteError it is. huggingface_hub
    reads its token file (HF_HOME/token, under HOME by default) on every request: with HOME a
    regular file that read fails with NotADirectoryError, an OSError that transfer.ask would
    otherwise take for a broken connection (exit 69) and send the user looking at the network.
    Network errors carry no file name; a local file's do."""
    constants = catalog.hf_constants()

    def run():
        try:
            return call()
        except OSError as e:
            if e.filename is None:  # a network error (requests' are OSErrors too) names no local file
                raise
            raise WriteError(f"{where}: cannot use the local file {path_text(e.filename)} (huggingface_hub's token "
                             f"or cache; HF_HOME is {path_text(constants.HF_HOME)}): {e.strerror or e}") from None
    return run


def _hub_error(ref: catalog.ModelRef, revision: str | None, e: Exception, filename: str | None = None,
               endpoint: str | None = None) -> ModelError | NetworkError:
    """The Hub's answer (not a network failure) as one line: no such repo, revision or file, gated."""
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = ref.repo + (f"/{filename}" if filename else "")
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError):
        problem = "the repo is gated: accept its terms on the Hub, then log in (`hf auth login`) or set HF_TOKEN"
    elif isinstance(e, RepositoryNotFoundError):
        problem = ("no such model repo on the Hub (or it is private: log in or set HF_TOKEN)"
                   + (f"; known names: {', '.join(catalog.KNOWN)}" if ref.short is None else ""))
    elif isinstance(e, RevisionNotFoundError):
        problem = f"the repo has no revision {revision!r}"
    elif filename is None and (isinstance(e, EntryNotFoundError) or status == 404):
        # A bare 404 on the listing (no X-Error-Code saying which thing is missing, as a proxy or
        # a server that is no Hub answers): the repo, or the Hub itself, is not there. Said as a
        # missing repo is (exit 3), naming where it was asked; there is no commit to name yet.
        what = "model repo" + (f" or revision {revision!r}" if revision else "")
        problem = (f"no such {what} at {endpoint or 'the Hub'}: it answered 404 (not found) for the repo's "
                   "listing (a private repo? log in or set HF_TOKEN; is HF_ENDPOINT a Hugging Face Hub?)"
                   + (f"; known names: {', '.join(catalog.KNOWN)}" if ref.short is None else ""))
    elif isinstance(e, EntryNotFoundError) or status == 404:
        problem = f"listed at commit {str(revision)[:12]}, but the Hub answered 404 (not found) for it"
    elif isinstance(e, (AttributeError, TypeError, KeyError, IndexError, ValueError)) and status is None:
        # no answer of the Hub's: huggingface_hub tripped over one it could not use, or over one of its
        # own cache files (a JSON of another shape): a passing fault, not a bad model (exit 69)
        return NetworkError(where, f"the Hub's answer (or huggingface_hub's cache of one, under HF_HOME) could not "
                                   f"be used: {type(e).__name__}: {transfer.one_line(e)}; try again later")
    else:
        problem = f"the Hub refused: {type(e).__name__}{f' (HTTP {status})' if status else ''}: {transfer.one_line(e)}"
    return ModelError(where, problem)


# -- what is in the cache -----------------------------------------------------------------------
@dataclass(frozen=True)
class LocalFile:
    name: str  # the path in the repo (`gguf/model.gguf` for a pair kept in a folder)
    path: Path
    size: int
    quant: str | None
    mmproj: bool


@dataclass(frozen=True)
class LocalModel:
    name: str  # the short name if it is a known repo, else owner/repo
    repo: str
    revision: str
    files: tuple[LocalFile, ...]
    missing: tuple[str, ...] = ()  # GGUF files whose blob is gone: the model is not usable until pulled again


def local_models(cache_dir: str | os.PathLike | None = None) -> list[LocalModel]:
    """Every repo in the Hugging Face cache with a GGUF pair (a text GGUF and an mmproj), or a part of
    one whose other files were deleted (`missing`): the newest snapshot of each (the one `--model
    NAME` uses), its GGUF files with sizes and paths."""
    root = catalog.hub_cache(cache_dir)
    short = {v.repo.lower(): k for k, v in catalog.KNOWN.items()}
    found = []
    for folder in sorted(root.glob("models--*")) if root.is_dir() else []:
        repo = folder.name[len("models--"):].replace("--", "/", 1)
        snap = catalog.snapshot_dir(repo, None, root)
        if snap is None:
            continue
        files = []
        for name in catalog.local_files(snap):
            p = snap / name
            files.append(LocalFile(name, p, p.stat().st_size, catalog.quant_of(name), catalog.is_mmproj(name)))
        gone = tuple(catalog.missing_files(snap))
        if {f.mmproj for f in files} == {True, False} or gone:  # half a model is listed only if half was deleted
            found.append(LocalModel(short.get(repo.lower(), repo), repo, snap.name, tuple(files), gone))
    return found


__all__ = ["LocalModel", "Pulled", "local_models", "pull"]
