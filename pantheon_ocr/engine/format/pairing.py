"""Do a text GGUF and an mmproj GGUF make one LightOnOCR model? Checked from their metadata
alone, before any weight is read, so that a wrong pair is one line naming both files (exit 3)
instead of minutes of loading or a shape error deep in the first page.

A LightOnOCR pair (llama.cpp's converter, every publisher since): the text file is a Qwen3
decoder (`general.architecture = qwen3`), the mmproj a `clip` file whose projector type is
`lightonocr` and whose projection width is the text model's embedding width.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ModelError, path_text
from .gguf import GGUFFile, meta, open_gguf

TEXT_ARCHS = ("qwen3",)  # LightOnOCR-1 and -2 (and the bundled reader) decode with Qwen3
PROJECTORS = ("lightonocr",)


def check_pair(text_path: str | Path, mmproj_path: str | Path) -> None:
    """ModelError naming both files if they cannot be one LightOnOCR model: two text files, two
    mmprojs (or the two swapped), an mmproj of another projector, a text model of another
    architecture, or a projection width that is not the text width."""
    mm_gf = open_gguf(mmproj_path)  # the mmproj first, as loading does: its problems are named first
    try:
        text_gf = open_gguf(text_path)
    except ModelError:
        mm_gf.close()
        raise
    try:
        _check(text_gf, mm_gf)
    finally:
        text_gf.close()
        mm_gf.close()


def _check(text: GGUFFile, mm: GGUFFile) -> None:
    t_arch = meta(text, "general.architecture", str)
    m_arch = meta(mm, "general.architecture", str)
    t_name, m_name = path_text(text.path), path_text(mm.path)
    if t_arch == "clip" and m_arch == "clip":
        raise ModelError(text.path, f"this is a vision projector (mmproj) file, and so is {m_name}: the text model is "
                                    "missing (are the model and mmproj paths swapped?)")
    if t_arch == "clip":
        raise ModelError(text.path, f"this is a vision projector (mmproj) file, not the text model: are the model and "
                                    f"mmproj paths swapped? ({m_name} is a {m_arch} text model)")
    if m_arch != "clip":
        raise ModelError(mm.path, f"not a vision projector (mmproj) file: 'general.architecture' is {m_arch!r}, "
                                  f"expected 'clip'; {t_name} is a text model too (two text files given)")
    projector = meta(mm, "clip.projector_type", str, "")
    if projector not in PROJECTORS:
        raise ModelError(mm.path, f"its 'clip.projector_type' is {projector!r}, not {PROJECTORS[0]!r}: this mmproj belongs "
                                  f"to another kind of model than LightOnOCR, so it does not fit {t_name}")
    if t_arch not in TEXT_ARCHS:
        raise ModelError(text.path, f"'general.architecture' is {t_arch!r}, but the LightOnOCR mmproj {m_name} feeds a "
                                    f"{'/'.join(TEXT_ARCHS)} decoder: this text model belongs to another model")
    width = meta(text, f"{t_arch}.embedding_length", int)
    proj = meta(mm, "clip.vision.projection_dim", int)
    if proj != width:
        raise ModelError(mm.path, f"this mmproj does not fit the text model {t_name}: its 'clip.vision.projection_dim' "
                                  f"is {proj} but the text model's '{t_arch}.embedding_length' is {width}")


__all__ = ["check_pair"]
