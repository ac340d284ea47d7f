"""What a job's text depends on, kept with its state: the model files and the settings that
change what is read (sampling, segmentation, the text layer, the render size). A run that finds
them changed since the last run says so (pages read before keep their text, the old model's);
`archive run --reread` reads every document again.

The engine's speed settings (threads, weights, backends) are left out: they change no more than
rounding, and a note on every such tweak would teach people to skip the notes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import PantheonError, path_text
from ..modelfiles.resolve import resolve_model

_HEAD = 1 << 20  # a GGUF's first MiB: its metadata and the first tensors


def _model_file(path: Path | None) -> dict | None:
    """A model file as its size and the digest of its head: the same model copied or pulled
    again is the same, whatever its mtime; another quantization or version is not."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            head = hashlib.sha256(f.read(_HEAD)).hexdigest()[:16]
        return {"file": path_text(path), "size": os.path.getsize(path), "head": head}
    except OSError:
        return {"file": path_text(path)}


def reading_settings(spec) -> dict:
    """The job's reading as a JSON-able dict (see the module docstring)."""
    m = spec.model
    try:
        text, mmproj = resolve_model(m.name or m.text, m.mmproj)
    except PantheonError:  # said by the run's own model check; here only compared
        text, mmproj = m.text, m.mmproj
    s, o = spec.ocr.sampling, spec.ocr
    return {"model": _model_file(text), "mmproj": _model_file(mmproj), "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed, "segment": o.segment,
            "text_layer": o.text_layer, "longest_edge": o.longest_edge}


def changes(old: dict, new: dict) -> list[str]:
    """`max_tokens 1000 -> 5`, `model /m/a.gguf -> /m/b.gguf`: each setting that differs. A model
    file is compared by its size and head, not its name (a copy elsewhere is the same model), and
    not at all where either side could not be read."""
    out = []
    for key in new:
        a, b = old.get(key), new[key]
        if isinstance(a, dict) and isinstance(b, dict):
            if "head" not in a or "head" not in b or (a["size"], a["head"]) == (b["size"], b["head"]):
                continue
            out.append(f"{key} {a['file']} -> {b['file']}" if a["file"] != b["file"] else f"{key} {b['file']} (another file)")
        elif a != b:
            shown = [v.get("file") if isinstance(v, dict) else v for v in (a, b)]
            out.append(f"{key} {shown[0]} -> {shown[1]}")
    return out
