"""Names and paths -> the two GGUF files of a model: files, a folder, a pulled model's name, or the
reader bundled in the package. Finding files is not inference, so it lives outside engine/.

    text, mmproj = resolve_model(model, mmproj)   # --model/--mmproj, a job file's [model]
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError, OptionError, UsageError
from ..engine.format.gguf import GGUF_MAGIC
from .catalog import local_pair, parse_name

NO_MODEL = ("no model given and this install has no bundled reader: pull one (`pantheon-ocr models pull lightonocr-2`) "
            "and name it, or name a LightOnOCR GGUF pair (the text GGUF and its mmproj) or a folder holding both")
# The reader that ships inside the package (trained by training/, see its MODEL_CARD.md): what
# runs when no model is named.
BUNDLED = Path(__file__).resolve().parent.parent / "bundled" / "reader"


def bundled_reader() -> tuple[Path, Path] | None:
    """(text GGUF, mmproj GGUF) of the bundled reader, or None if this install lacks it."""
    text, mmproj = BUNDLED / "pantheon-reader.gguf", BUNDLED / "mmproj-pantheon-reader.gguf"
    return (text, mmproj) if text.is_file() and mmproj.is_file() else None


def resolve_model(model: str | Path | None, mmproj: str | Path | None) -> tuple[Path, Path]:
    """The text GGUF and the mmproj GGUF a user named: two files, a folder holding one text
    GGUF and one *mmproj*.gguf, or the name of a pulled model (`lightonocr-2`, `owner/repo`,
    with `:QUANT` to choose among pulled text files; catalog.py); an explicit mmproj wins over the
    folder's or the pulled one. No model: the bundled reader if this install has it.
    OptionError (naming `model` or `mmproj`; the CLI shows --model, a job file model.text) when the
    pair is incomplete or ambiguous; ModelError (exit 3) for a model name that is not pulled,
    naming the pull command (nothing is ever downloaded here), or for a lone --model path that is
    not there. Whether named files exist (with both named) and are models is for loading to say,
    after the backend checks (a missing extra is said before any file is read)."""
    if model is None:
        if mmproj is None and bundled_reader() is not None:
            return bundled_reader()
        raise UsageError(NO_MODEL) if mmproj is None else OptionError(
            "model", "required with an mmproj (a text GGUF, or a folder with the text and mmproj GGUFs)")
    model, mmproj = (os.fsdecode(v) if isinstance(v, bytes) else v for v in (model, mmproj))  # paths as bytes
    for name, value in (("model", model), ("mmproj", mmproj)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise OptionError(name, f"must be a path or a model's name, not {type(value).__name__}")
        if value is not None and not os.fspath(value).strip():  # Path("") is "."
            raise OptionError(name, "an empty path (an unset shell variable?): give a file, folder or model name")
    text, proj = Path(model), Path(mmproj) if mmproj is not None else None
    if not text.exists() and parse_name(str(model)) is not None:
        try:
            pulled = local_pair(str(model))
        except ModelError as e:
            if ("/" not in str(model) and os.sep not in str(model)) or not e.problem.startswith("not pulled"):
                raise
            # owner/repo is also how a relative path is written: a mistyped folder is said as one too
            head, sep, pull = e.problem.partition("): run ")
            raise ModelError(e.path, f"{head}), and no file or folder of that name here{sep and ': run '}{pull}",
                             e.option) from None
        return pulled[0], proj or pulled[1]
    if text.is_dir():
        ggufs = sorted(text.glob("*.gguf"))
        projs = [p for p in ggufs if "mmproj" in p.name.lower()]
        plain = [p for p in ggufs if p not in projs]
        if len(plain) != 1 or (proj is None and len(projs) != 1):
            raise OptionError("model", f"the folder should hold one text GGUF and one *mmproj*.gguf, found "
                                       f"{[p.name for p in ggufs]}; name the two files instead", text)
        text, proj = plain[0], proj or projs[0]
    if proj is None:
        if not text.exists():  # a typo in the path is that, not a missing --mmproj
            raise ModelError(text, "no such model file", "model")
        if text.is_file() and not _starts_as_gguf(text):  # nor is a file that is no model at all
            raise ModelError(text, "not a GGUF file (it does not start with b'GGUF')", "model")
        raise OptionError("mmproj", f"required with the text model {text} (the vision half of the pair)")
    return text, proj


def _starts_as_gguf(path: Path) -> bool:
    """Whether the file starts with GGUF's magic (unreadable: said so by loading later)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return True
