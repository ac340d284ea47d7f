"""Libraries built from csrc/ on first use into the user cache: the one outline that native.py
(the decode attention, C) and native_step.py (the decode step, C++ against torch) share.

    compiler = find_compiler("CC", "cc", given)       # a Compiler, or a line saying why not
    found = cached_build(compiler, "decode_attention", SOURCE, [args, fallback_args], cache_dir, 120)
    # -> (which args, the library's path), or a line saying why not

A library's file name hashes its source and the headers beside it, its arguments, the compiler's path
and version and anything else it is built against (`extra`: torch's version for the step), so another
compiler, release, source or header builds anew and an old file is never loaded for new code. It is
written under a temporary name and renamed, so processes building at once (a Ray cluster's workers)
never load half a file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

VERSION_TIMEOUT = 60  # seconds for `cc -v`


@dataclass(frozen=True)
class Compiler:
    name: str  # as asked for ($CC, "c++", a path)
    exe: str  # where it is
    version: str  # what `exe -v` says (gcc and clang both answer it)


def find_compiler(env: str, default: str, given: str | None = None) -> Compiler | str:
    """The compiler `given`, else $env, else `default`, with its version; or why there is none."""
    name = given or os.environ.get(env) or default
    exe = shutil.which(name)
    if exe is None:
        return f"no compiler: {name!r} not found; set {env} to build it"
    try:
        said = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=VERSION_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"asking {name} its version failed: {exc}"
    return Compiler(name, exe, said.stdout + said.stderr)


def cached_build(compiler: Compiler, stem: str, source: Path, candidates: Sequence[Sequence[str]], cache_dir: Path,
                 timeout: float, extra: str = "") -> tuple[int, Path] | str:
    """The library of `source` in cache_dir for the first of `candidates` (each the compiler's whole
    argument list, in order of preference) already built, else the first that builds:
    (its index, its path); or what went wrong with the last one tried. One built before is taken as
    it is: a compiler that refuses a preferred flag is not asked again at every start."""
    # the source and the headers beside it (csrc/*.h) that it may include: a change to either builds anew
    text = "\0".join([source.read_text(), *(h.read_text() for h in sorted(source.parent.glob("*.h")))])
    paths = []
    for args in candidates:
        key = hashlib.sha256("\0".join([text, " ".join(args), compiler.exe, compiler.version, extra])
                             .encode()).hexdigest()[:16]
        paths.append(cache_dir / f"{stem}-{key}.so")
    found = next((i for i, path in enumerate(paths) if path.exists()), None)
    if found is not None and intact(paths[found]):
        return found, paths[found]
    # none, or one cut short or changed (loading it could kill the process): built again, from
    # the arguments that built it before
    failed = "no arguments to build with"
    for i, (args, path) in enumerate(zip(candidates, paths)):
        if i < (found or 0):
            continue
        failed = compile_library(compiler.exe, list(args), path, timeout)
        if failed is None:
            return i, path
    return f"{compiler.name} could not build {source.name}: {failed}"


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # a library: a few MB at most


def intact(path: Path) -> bool:
    """Whether a cached library is the file its build wrote: its bytes hash to the digest written
    beside it. A library cut short (a full disk, a copy interrupted) or changed makes the process
    die of SIGBUS when loaded, before any error can be said, so it is never loaded: built again."""
    try:
        return _digest_path(path).read_text().strip() == _digest(path)
    except OSError:
        return False


def compile_library(exe: str, args: list[str], path: Path, timeout: float) -> str | None:
    """Build a library with compiler exe and args (flags and sources) into path (a temporary name,
    then renamed, its digest beside it first); None, or what went wrong."""
    tmp = tmp_digest = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        done = subprocess.run([exe, *args, "-o", tmp], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            return (done.stderr.strip().splitlines() or ["no message"])[-1]
        if os.path.getsize(tmp) == 0:
            return f"{exe} said it built the library but wrote nothing"
        fd, tmp_digest = tempfile.mkstemp(suffix=".sha256", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(_digest(Path(tmp)) + "\n")
        os.replace(tmp_digest, _digest_path(path))  # the digest first: a library there always has one
        tmp_digest = None
        os.replace(tmp, path)  # whole or absent: another process may be loading it
        tmp = None
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"building in {path.parent} failed: {exc}"
    finally:
        for left in (tmp, tmp_digest):
            if left is not None and os.path.exists(left):
                os.unlink(left)
