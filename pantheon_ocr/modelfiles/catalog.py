"""Model names -> the GGUF pair in the Hugging Face cache. Nothing here touches the network:
`models pull` (modelfiles/hub.py) downloads, this finds what was downloaded.

A name is a short name of a published LightOnOCR GGUF (`lightonocr-2`, see KNOWN) or any Hub
repo `owner/repo` holding a text GGUF and an mmproj GGUF, optionally with `:QUANT` to choose the
text file (`lightonocr-2:Q4_K_M`). The files live where huggingface_hub keeps them (HF_HOME,
HF_HUB_CACHE): `<cache>/models--owner--repo/snapshots/<commit>/<file>`. Which file of a repo is
the text model and which the mmproj, and which quantization is the default, is decided here
(`pick_pair`), the same way for a repo's listing on the Hub and for what is on disk.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, UsageError


@dataclass(frozen=True)
class Variant:
    repo: str  # owner/repo on the Hub
    quants: tuple[str, ...]  # text quantizations in order of preference: the first one present is the default
    about: str


# Where each fact comes from (the repos were not reachable from here: file names are never
# assumed, they are read from the repo's listing at pull time):
KNOWN: dict[str, Variant] = {
    # LightOnOCR-1B-1025 as converted by llama.cpp's maintainers with llama.cpp's support for the
    # model: ggml-org/llama.cpp pull request 16764 ("model : add LightOnOCR-1B model") says "GGUF
    # model: https://huggingface.co/ggml-org/LightOnOCR-1B-1025-GGUF" and runs it with
    # `llama-server -hf ggml-org/LightOnOCR-1B-1025-GGUF`, which takes the text GGUF and the mmproj
    # from that one repo. Which quantizations it holds is not confirmed: Q8_0 first, as ggml-org
    # publishes, else F16/BF16, else the only text file.
    "lightonocr-1": Variant("ggml-org/LightOnOCR-1B-1025-GGUF", ("Q8_0", "F16", "BF16"),
                            "LightOnOCR-1B-1025 (GGUF by ggml-org)"),
    # LightOnOCR-2-1B (lightonai/LightOnOCR-2-1B, January 2026). The repo's model card lists
    # LightOnOCR-2-1B-f16.gguf, LightOnOCR-2-1B-Q8_0.gguf ("near-lossless"), LightOnOCR-2-1B-Q4_K_M.gguf
    # and LightOnOCR-2-1B-mmproj-f16.gguf, and says the mmproj should not be quantized. Others
    # publish it too (noctrex/LightOnOCR-2-1B-GGUF with Q4_K_M, Q6_K and mmproj-F32.gguf, per
    # mistral.rs issue 2009 and its model page; staghado/LightOnOCR-2-1B-{Q8_0,Q4_K_M,Q4_K_S}-GGUF,
    # per llama.cpp issue 18943): pull those by their owner/repo.
    "lightonocr-2": Variant("wangjazz/LightOnOCR-2-1B-gguf", ("Q8_0", "Q4_K_M", "F16"),
                            "LightOnOCR-2-1B (GGUF by wangjazz)"),
    # LightOnOCR-2-1B-bbox, which also writes `![image](image_N.png)x1,y1,x2,y2` for embedded images
    # (lightonai/LightOnOCR-2-1B-bbox-soup's model card gives the format). NOT CONFIRMED: no GGUF
    # repo of the bbox variant could be looked up from here. mradermacher publishes GGUFs of nearly
    # every model, with the mmproj in the same repo, under this naming; if the repo is absent,
    # `models pull` says so in one line, and any owner/repo holding a bbox GGUF pair works instead.
    "lightonocr-2-bbox": Variant("mradermacher/LightOnOCR-2-1B-bbox-GGUF", ("Q8_0", "Q4_K_M", "Q6_K", "F16"),
                                 "LightOnOCR-2-1B-bbox (image boxes; GGUF by mradermacher, unconfirmed)"),
}
# An owner/repo that is not a known name: a good quality first, then the smaller files.
DEFAULT_QUANTS = ("Q8_0", "Q6_K", "Q4_K_M", "Q5_K_M", "Q4_K_S", "F16", "BF16", "F32")
# Publishers advise against quantizing the mmproj: the float files first.
MMPROJ_QUANTS = ("F16", "BF16", "F32", "Q8_0")

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
_QUANT = re.compile(r"(?:BF16|F16|F32|I?Q[1-8](?:_[A-Z0-9]{1,3}){0,2})")
_NAME_QUANT = re.compile(r"(?P<name>[^:]+?)(?::(?P<quant>[A-Za-z0-9_]+))?")


@dataclass(frozen=True)
class ModelRef:
    """A parsed model name: the Hub repo, the text quantization asked for (None: the default),
    and the short name it was given by, if any."""

    repo: str
    quant: str | None = None
    short: str | None = None

    @property
    def label(self) -> str:
        return (self.short or self.repo) + (f":{self.quant}" if self.quant else "")

    @property
    def preferred(self) -> tuple[str, ...]:
        return KNOWN[self.short].quants if self.short else DEFAULT_QUANTS


def parse_name(name: str, quant: str | None = None) -> ModelRef | None:
    """`lightonocr-2`, `lightonocr-2:Q4_K_M`, `owner/repo`, `owner/repo:Q8_0` -> ModelRef; None
    when `name` is not a model name (a file path, say). `quant` and a `:QUANT` suffix, where both
    are given, must agree."""
    m = _NAME_QUANT.fullmatch(name.strip())
    if m is None:
        return None
    if quant and m["quant"] and quant.upper() != m["quant"].upper():
        raise UsageError(f"{name}: names the quantization {m['quant'].upper()} and quant says {quant.upper()}: give one")
    base, q = m["name"], (quant or m["quant"])
    q = q.upper() if q else None
    if q is not None and not _QUANT.fullmatch(q):
        raise UsageError(f"{name}: {q!r} is not a GGUF quantization (e.g. Q8_0, Q4_K_M, F16)")
    if base.lower() in KNOWN:
        return ModelRef(KNOWN[base.lower()].repo, q, base.lower())
    if _REPO.fullmatch(base) and not base.lower().endswith(".gguf") and ".." not in base:
        return ModelRef(base, q)
    return None


def quant_of(filename: str) -> str | None:
    """The quantization a GGUF file name states (`LightOnOCR-2-1B-Q4_K_M.gguf` -> Q4_K_M,
    `X.mmproj-f16.gguf` -> F16), the last such part of the name; None if it states none."""
    stem = filename.rsplit("/", 1)[-1]
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    found = [p.upper() for p in re.split(r"[-.]", stem) if _QUANT.fullmatch(p.upper())]
    return found[-1] if found else None


def is_mmproj(filename: str) -> bool:
    return "mmproj" in filename.rsplit("/", 1)[-1].lower()


def pick_pair(files, ref: ModelRef, where: str) -> tuple[str, str]:
    """The (text, mmproj) file names to use among `files` (a repo's listing or what is on disk).
    The text file: the asked-for quantization, else the first of the preferred ones present,
    else the only one. The mmproj: F16 before BF16, F32, Q8_0. ModelError naming `where` and
    what it holds when there is no such pair."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    projs = [f for f in ggufs if is_mmproj(f)]
    texts = [f for f in ggufs if not is_mmproj(f)]
    if not texts:
        raise ModelError(where, f"holds no text GGUF (files: {_show(files)})")
    if not projs:
        raise ModelError(where, f"holds no mmproj GGUF, the vision half a LightOnOCR model needs to read images "
                                f"(GGUF files: {_show(ggufs)})")
    return _choose_text(texts, ref, where), _choose(projs, MMPROJ_QUANTS)


def _choose_text(texts: list[str], ref: ModelRef, where: str) -> str:
    quants = {f: quant_of(f) for f in texts}
    if ref.quant is not None:
        hits = [f for f in texts if quants[f] == ref.quant]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ModelError(where, f"holds several {ref.quant} text GGUFs ({_show(hits)}): pull the one you want by its path "
                                    "and name the text and mmproj files themselves")
        have = sorted({q for q in quants.values() if q})
        raise ModelError(where, f"has no {ref.quant} text GGUF (quantizations here: {', '.join(have) or 'none stated'})")
    for q in ref.preferred:
        hits = [f for f in texts if quants[f] == q]
        if hits:
            return hits[0]
    if len(texts) == 1:
        return texts[0]
    have = sorted({q for q in quants.values() if q})
    raise ModelError(where, f"holds several text GGUFs ({_show(texts)}): choose one with :QUANT or --quant "
                            f"({', '.join(have)})")


def _choose(files: list[str], order: tuple[str, ...]) -> str:
    rank = {q: i for i, q in enumerate(order)}
    return min(files, key=lambda f: (rank.get(quant_of(f) or "", len(order)), f))


def _show(names, limit: int = 6) -> str:
    names = [str(n).rsplit("/", 1)[-1] for n in names]
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


# -- the Hugging Face cache (its layout is huggingface_hub's; HF_HOME and HF_HUB_CACHE say where) --
def hf_constants():
    """huggingface_hub's settings, read from the environment on import; UsageError naming
    HF_ENDPOINT where it is no http(s) URL (its import raises a bare ValueError then)."""
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    if endpoint:
        try:
            parts = urlsplit(endpoint)
            parts.port  # noqa: B018 - a port that is no number raises here
        except ValueError as e:
            raise UsageError(f"HF_ENDPOINT {endpoint!r}: not a URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"HF_ENDPOINT {endpoint!r}: not an http(s) URL of a Hub (like https://huggingface.co)")
    from huggingface_hub import constants  # cheap: only the settings read from the environment

    return constants


def hub_cache(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(hf_constants().HF_HUB_CACHE)


def repo_dir(repo: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return hub_cache(cache_dir) / ("models--" + repo.replace("/", "--"))


def snapshot_dir(repo: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The snapshot folder of `revision` (a branch, tag or commit; None: main, else the newest one
    there is), or None if the repo has none in the cache."""
    root = repo_dir(repo, cache_dir)
    for rev in ([revision] if revision and safe_revision(revision) else [] if revision else ["main"]):
        commit = rev
        ref = root / "refs" / rev
        if ref.is_file():
            try:
                commit = ref.read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError):  # damaged: no commit of ours; the newest snapshot stands in
                commit = ""
        snap = root / "snapshots" / commit
        if _PART.fullmatch(commit) and snap.is_dir():  # a ref holding `..` or a path does not lead out
            return snap
    if revision:
        return None
    snaps = [p for p in (root / "snapshots").glob("*") if p.is_dir()] if (root / "snapshots").is_dir() else []
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def local_files(snapshot: Path) -> list[str]:
    """GGUF files of a snapshot whose data is there (a link to a missing blob does not count), as
    paths relative to it (`gguf/model.gguf` for a repo that keeps its pair in a folder)."""
    return [rel for rel, path in _snapshot_ggufs(snapshot) if path.is_file()]


def missing_files(snapshot: Path) -> list[str]:
    """GGUF files of a snapshot whose blob is gone (a dangling link: the cache cleaned by hand, a
    blob deleted), as local_files names them."""
    return [rel for rel, path in _snapshot_ggufs(snapshot) if not path.exists()]


def _snapshot_ggufs(snapshot: Path) -> list[tuple[str, Path]]:
    """(name relative to the snapshot, path) of every GGUF name in it, hidden folders left out, sorted."""
    found = []
    for folder, dirs, files in os.walk(snapshot):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(folder).relative_to(snapshot)
        found += [((rel / f).as_posix(), Path(folder) / f) for f in files if f.lower().endswith(".gguf")]
    return sorted(found)


def pull_command(name: str, quant: str | None = None, file: str | None = None) -> str:
    """`pantheon-ocr models pull NAME [--quant Q]`: with `file`, the pull that fetches that file
    again (a text GGUF by its quantization, an mmproj with any pull)."""
    if quant is None and file is not None and not is_mmproj(file):
        quant = quant_of(file)
    return f"pantheon-ocr models pull {name}" + (f" --quant {quant}" if quant else "")


def cached_repo(path: str | os.PathLike) -> str | None:
    """owner/repo when `path` is a file of the Hugging Face cache (`.../models--owner--repo/snapshots/...`)."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots" and "--" in part[len("models--"):]:
            return part[len("models--"):].replace("--", "/", 1)
    return None


# -- names from the Hub become paths only when they cannot lead out of the cache ------------------
_PART = re.compile(r"(?!\.\.?$)[A-Za-z0-9._+=@,~-]{1,200}")  # one path component: not `.`, `..`, no separator
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def is_digest(value: object) -> bool:
    """A git SHA-1 or a SHA-256 in lower-case hex: what a commit or a blob may be named."""
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def safe_repo_path(path: object) -> bool:
    """A file path inside a repo that is safe below a snapshot folder: relative, `/`-separated
    components of ordinary characters, none empty, `.` or `..`."""
    return isinstance(path, str) and len(path) <= 1000 and all(_PART.fullmatch(p) for p in path.split("/"))


def safe_revision(revision: str) -> bool:
    """A branch, tag or commit name that is safe as a file below refs/ (`main`, `v1.0`, `refs/pr/3`)."""
    return safe_repo_path(revision)


def local_pair(name: str, cache_dir: str | os.PathLike | None = None, revision: str | None = None) -> tuple[Path, Path]:
    """The pulled (text GGUF, mmproj GGUF) of a model name. ModelError (exit 3) naming the pull
    command when it is not pulled: a run never downloads on its own."""
    ref = parse_name(name)
    if ref is None:
        raise UsageError(f"{name}: not a model name (a short name such as lightonocr-2, or owner/repo)")
    pull = pull_command(ref.short or ref.repo, ref.quant)
    snap = snapshot_dir(ref.repo, revision, cache_dir)
    files = local_files(snap) if snap is not None else []
    gone = missing_files(snap) if snap is not None else []
    if gone:  # the pair is chosen as if all were there: one of its files deleted is said as such
        try:
            chosen = pick_pair(files + gone, ref, name)
        except ModelError:
            chosen = ()
        lost = [f for f in chosen if f in gone]
        if lost:  # the pair's text file is fetched again as it was, by its quantization
            raise ModelError(name, f"{', '.join(lost)} missing from the Hugging Face cache ({snap}: its file was "
                                   f"deleted): run `{pull_command(ref.short or ref.repo, file=chosen[0])}`")
    if not files:
        raise ModelError(name, f"not pulled (nothing of {ref.repo} in the Hugging Face cache {hub_cache(cache_dir)}): "
                               f"run `{pull}`")
    try:
        text, mmproj = pick_pair(files, ref, f"{name} (pulled, {snap})")
    except ModelError as e:
        raise ModelError(name, f"{e.problem}; run `{pull}`") from None
    return snap / text, snap / mmproj


__all__ = ["KNOWN", "ModelRef", "Variant", "cached_repo", "is_digest", "local_pair", "missing_files", "parse_name",
           "pick_pair", "pull_command", "quant_of", "safe_repo_path", "safe_revision"]
