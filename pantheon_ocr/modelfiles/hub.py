"""`models pull` and `models list`: LightOnOCR GGUFs from the Hugging Face Hub into its cache.

huggingface_hub does the talking, so its settings hold: HF_ENDPOINT (a mirror), HF_HOME /
HF_HUB_CACHE (where files go), HF_HUB_OFFLINE, HF_TOKEN or `hf auth login` (private and gated
repos), HF_HUB_DISABLE_PROGRESS_BARS. It downloads to a temp file and renames it into place (a
killed pull leaves no partial model behind), resumes with a Range request when a connection
breaks mid-file, and checks sizes. The checksum is ours: the Hub's ETag of an LFS file (every
GGUF is one) is its SHA-256, and huggingface_hub names the blob after it; a blob whose bytes do
not hash to its name is removed and the pull fails, so a corrupted transfer is never used.

Only `models pull` reaches the network. Running a model (engine/loader.py, engine/catalog.py)
reads the cache and never downloads: a nightly job with a model that is not there fails with
the pull command to run.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import catalog
from ..engine.format.pairing import check_pair
from ..errors import ModelError, UsageError

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Pulled:
    name: str  # as the user gave it (use it with --model)
    repo: str
    revision: str  # the commit the files came from
    text: Path
    mmproj: Path
    offline: bool = False  # taken from the cache without asking the Hub (HF_HUB_OFFLINE)


def pull(name: str, quant: str | None = None, revision: str | None = None, *, progress: bool = True,
         endpoint: str | None = None, cache_dir: str | os.PathLike | None = None,
         log: Callable[[str], None] | None = None) -> Pulled:
    """Download (or find up to date in the cache) the text GGUF and the mmproj GGUF of `name`
    and verify both. ModelError (exit 3) for an unknown repo, a repo without a GGUF pair, a
    corrupted transfer, or no connection (the message says why, in one line)."""
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    ref = catalog.parse_name(name, quant)
    if ref is None:
        raise UsageError(f"{name}: not a model name: use a known name ({', '.join(catalog.KNOWN)}) or owner/repo")
    say = log or (lambda line: None)
    if constants.HF_HUB_OFFLINE:
        try:
            text, mmproj = catalog.local_pair(ref.label, cache_dir, revision)
        except ModelError as e:
            raise ModelError(e.path, f"offline (HF_HUB_OFFLINE is set) and not in the cache {catalog.hub_cache(cache_dir)} "
                                     "as asked: unset HF_HUB_OFFLINE to download it") from None
        say(f"offline (HF_HUB_OFFLINE): {ref.label} is in the cache; not checked against the Hub")
        return Pulled(name, ref.repo, text.parent.name, _verified(text), _verified(mmproj), offline=True)
    api = HfApi(endpoint=endpoint)
    try:
        files = api.list_repo_files(ref.repo, revision=revision)
    except Exception as e:  # noqa: BLE001 - every way the Hub can say no becomes one line
        raise _hub_error(ref, revision, e) from None
    text_name, mmproj_name = catalog.pick_pair(files, ref, f"{ref.repo}{f'@{revision}' if revision else ''}")
    (disable_progress_bars if not progress else enable_progress_bars)()
    paths = []
    for filename in (text_name, mmproj_name):
        say(f"{ref.repo}: {filename}")
        try:
            path = hf_hub_download(ref.repo, filename, revision=revision, endpoint=endpoint, cache_dir=cache_dir)
        except Exception as e:  # noqa: BLE001
            raise _hub_error(ref, revision, e, filename) from None
        paths.append(_verified(Path(path), f"{ref.repo}/{filename}"))
    check_pair(paths[0], paths[1])  # a repo whose two files are not one LightOnOCR model says so now
    return Pulled(name, ref.repo, paths[0].parent.name, paths[0], paths[1])


def _verified(path: Path, what: str | None = None) -> Path:
    """`path` (a snapshot link to its blob) after checking the blob's bytes against its name,
    which is the Hub's ETag: SHA-256 for LFS files, git's SHA-1 for small ones. A mismatch
    removes the blob and the link and raises."""
    blob = Path(os.path.realpath(path))
    expected = blob.name
    if _SHA256.fullmatch(expected):
        h, got = hashlib.sha256(), None
    elif _SHA1.fullmatch(expected):
        h = hashlib.sha1(b"blob %d\0" % blob.stat().st_size)
        got = None
    else:  # not named after a checksum (symlinks unsupported: the file was copied): size was checked
        return path
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    got = h.hexdigest()
    if got != expected:
        for p in (path, blob):
            try:
                p.unlink()
            except OSError:
                pass
        raise ModelError(what or path, f"corrupted transfer: the file's checksum is {got[:16]}... but the Hub's is "
                                       f"{expected[:16]}...; the bad file was removed, run the pull again")
    return path


def _hub_error(ref: catalog.ModelRef, revision: str | None, e: Exception, filename: str | None = None) -> ModelError:
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    where = ref.repo + (f"/{filename}" if filename else "")
    if isinstance(e, GatedRepoError):
        problem = "the repo is gated: accept its terms on the Hub, then log in (`hf auth login`) or set HF_TOKEN"
    elif isinstance(e, RepositoryNotFoundError):
        problem = ("no such model repo on the Hub (or it is private: log in or set HF_TOKEN)"
                   + (f"; known names: {', '.join(catalog.KNOWN)}" if ref.short is None else ""))
    elif isinstance(e, RevisionNotFoundError):
        problem = f"the repo has no revision {revision!r}"
    elif isinstance(e, EntryNotFoundError):
        problem = "the file is listed but cannot be downloaded (removed meanwhile?)"
    elif isinstance(e, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
        problem = f"cannot reach the Hub and the file is not in the cache ({_one_line(e)})"
    elif isinstance(e, OSError):
        problem = f"download failed: {_one_line(e)}"
    else:
        problem = f"cannot reach the Hub: {type(e).__name__}: {_one_line(e)}"
    return ModelError(where, problem)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


# -- what is in the cache -----------------------------------------------------------------------
@dataclass(frozen=True)
class LocalFile:
    name: str
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


def local_models(cache_dir: str | os.PathLike | None = None) -> list[LocalModel]:
    """Every repo in the Hugging Face cache with GGUF files: the newest snapshot of each (the
    one `--model NAME` uses), its GGUF files with sizes and paths."""
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
        if files:
            found.append(LocalModel(short.get(repo.lower(), repo), repo, snap.name, tuple(files)))
    return found


__all__ = ["LocalModel", "Pulled", "local_models", "pull"]
