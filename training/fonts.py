"""The faces text is rendered in: TrueType/OpenType fonts from PyPI wheels and Debian font packages,
and the PDF standard-14 fonts as PDFium draws them.

- matplotlib's wheel: DejaVu Sans, Sans Mono, Serif and STIX General, 4 styles each (DejaVu: a
  Bitstream Vera derivative, free licence; STIX: SIL Open Font License);
- Pillow's wheel: its built-in default face (Aileron, CC0), what `ImageFont.load_default` draws;
- PDFium (in pypdfium2): Helvetica, Times and Courier, 4 styles each, rendered from generated PDFs;
- Debian's font packages, where installed (`SYSTEM_FAMILIES` names each package and its licence):
  the faces of real documents: Computer Modern (CMU) and Latin Modern, the TeX Gyre and URW clones
  of Times, Palatino, Helvetica, Courier, Bookman, Century; Liberation, Libertine, Noto, Gentium,
  Charis, Open Sans, Lato, Roboto, Carlito... in roman, italic, bold, small caps and monospace.

A sample draws a family first, then one of its faces, so a family with 30 files weighs no more
than one with 4. Whole families are held out of training to measure type the reader never saw.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from functools import lru_cache

from PIL import ImageFont

from .charset import CHARS, CP1252


@dataclass(frozen=True)
class Face:
    name: str
    kind: str  # "ttf" (PIL), "pil-default" (Pillow's own face) or "pdf" (a standard-14 BaseFont)
    source: str = ""  # the font file, or the BaseFont name
    family: str = ""
    weight: int = 0  # a variable font's weight axis (0: the file's default instance)

    def pil(self, size: int) -> ImageFont.FreeTypeFont:
        if self.kind == "pil-default":
            return ImageFont.load_default(size=size)
        return _ttf(self.source, size, self.weight)


@lru_cache(maxsize=512)
def _ttf(path: str, size: int, weight: int = 0) -> ImageFont.FreeTypeFont:
    font = ImageFont.truetype(path, size)  # Raqm layout where Pillow has it: kerning and ligatures
    if weight:
        axes = font.get_variation_axes()
        def is_weight(name) -> bool:
            return (name.decode() if isinstance(name, bytes) else str(name)).lower() in ("weight", "wght")

        font.set_variation_by_axes([weight if is_weight(a.get("name", "")) else a["default"] for a in axes])
    return font


def _mpl_dir() -> str:
    import matplotlib

    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf")


MPL_FACES = (
    "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique", "DejaVuSans-BoldOblique",
    "DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSansMono-Oblique", "DejaVuSansMono-BoldOblique",
    "DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "DejaVuSerif-BoldItalic",
    "STIXGeneral", "STIXGeneralBol", "STIXGeneralItalic", "STIXGeneralBolIta",
)
PDF_FACES = (
    "Helvetica", "Helvetica-Bold", "Helvetica-Oblique", "Helvetica-BoldOblique",
    "Times-Roman", "Times-Bold", "Times-Italic", "Times-BoldItalic",
    "Courier", "Courier-Bold", "Courier-Oblique", "Courier-BoldOblique",
)
FONT_ROOTS = ("/usr/share/fonts", "/usr/share/texmf/fonts/opentype/public")
# family: (Debian package, licence, file globs under FONT_ROOTS)
SYSTEM_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "CMU Serif": ("fonts-cmu", "SIL OFL", ("truetype/cmu/cmun[rb][mxi]*.ttf", "truetype/cmu/cmunti.ttf", "truetype/cmu/cmunsl.ttf",
                                            "truetype/cmu/cmunbx.ttf", "truetype/cmu/cmunbi.ttf")),
    "CMU Sans": ("fonts-cmu", "SIL OFL", ("truetype/cmu/cmuns[sxio].ttf",)),
    "CMU Typewriter": ("fonts-cmu", "SIL OFL", ("truetype/cmu/cmunt[tbxi].ttf",)),
    "CMU Concrete/Bright": ("fonts-cmu", "SIL OFL", ("truetype/cmu/cmuno*.ttf", "truetype/cmu/cmunb[mst]*.ttf")),
    "Latin Modern Roman": ("fonts-lmodern", "GUST Font License", ("lm/lmroman1[027]-*.otf", "lm/lmroman[5-9]-*.otf",
                                                                   "lm/lmromanslant*.otf", "lm/lmromandemi*.otf")),
    "Latin Modern Caps": ("fonts-lmodern", "GUST Font License", ("lm/lmromancaps*.otf", "lm/lmmonocaps*.otf")),
    "Latin Modern Sans": ("fonts-lmodern", "GUST Font License", ("lm/lmsans*.otf",)),
    "Latin Modern Mono": ("fonts-lmodern", "GUST Font License", ("lm/lmmono1*.otf", "lm/lmmonolt*.otf", "lm/lmmonoprop*.otf")),
    "TeX Gyre Termes": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyretermes-*.otf",)),
    "TeX Gyre Pagella": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyrepagella-*.otf",)),
    "TeX Gyre Heros": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyreheros*.otf",)),
    "TeX Gyre Cursor": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyrecursor-*.otf",)),
    "TeX Gyre Schola": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyreschola-*.otf",)),
    "TeX Gyre Bonum": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyrebonum-*.otf",)),
    "TeX Gyre Adventor": ("fonts-texgyre", "GUST Font License", ("tex-gyre/texgyreadventor-*.otf",)),
    "URW Nimbus": ("fonts-urw-base35", "AGPL with font exception", ("opentype/urw-base35/Nimbus*.otf",)),
    "URW P052/C059": ("fonts-urw-base35", "AGPL with font exception", ("opentype/urw-base35/[PC]05*.otf",)),
    "URW Bookman/Gothic": ("fonts-urw-base35", "AGPL with font exception", ("opentype/urw-base35/URW*.otf",)),
    "Liberation Serif": ("fonts-liberation2", "SIL OFL", ("truetype/liberation2/LiberationSerif-*.ttf",)),
    "Liberation Sans": ("fonts-liberation2", "SIL OFL", ("truetype/liberation2/LiberationSans-*.ttf",)),
    "Liberation Mono": ("fonts-liberation2", "SIL OFL", ("truetype/liberation2/LiberationMono-*.ttf",)),
    "Linux Libertine/Biolinum": ("fonts-linuxlibertine", "GPL with font exception / SIL OFL",
                                 ("opentype/linux-libertine/LinLibertine_[RIM]*.otf", "opentype/linux-libertine/LinBiolinum_*.otf",
                                  "opentype/linux-libertine/LinLibertine_D*.otf")),
    "Noto Serif": ("fonts-noto-core", "SIL OFL", ("truetype/noto/NotoSerif-*.ttf",)),
    "Noto Sans": ("fonts-noto-core", "SIL OFL", ("truetype/noto/NotoSans-*.ttf", "truetype/noto/NotoSansMono-*.ttf")),
    "Gentium Plus": ("fonts-sil-gentiumplus", "SIL OFL", ("truetype/gentiumplus/*.ttf",)),
    "Charis SIL": ("fonts-sil-charis", "SIL OFL", ("truetype/charis/*.ttf",)),
    "DejaVu Condensed": ("fonts-dejavu-extra", "Bitstream Vera licence", ("truetype/dejavu/DejaVu*Condensed*.ttf",)),
    "Open Sans": ("fonts-open-sans", "Apache 2.0", ("truetype/open-sans/OpenSans-*.ttf",)),
    "Lato": ("fonts-lato", "SIL OFL", ("truetype/lato/Lato-[RBIMSL]*.ttf",)),
    "Roboto": ("fonts-roboto-unhinted", "Apache 2.0", ("truetype/roboto/unhinted/RobotoTTF/Roboto-*.ttf",
                                                      "truetype/roboto/unhinted/RobotoCondensed-*.ttf")),
    "Carlito/Caladea": ("fonts-crosextra-carlito/-caladea", "SIL OFL / Apache 2.0", ("truetype/crosextra/*.ttf",)),
    "Croscore": ("fonts-croscore", "Apache 2.0", ("truetype/croscore/*.ttf",)),
    "FreeFont": ("fonts-freefont-ttf", "GPL with font exception", ("truetype/freefont/*.ttf",)),
    "Go": ("fonts-go", "BSD-3-Clause", ("truetype/go/*.ttf", "fonts-go/*.ttf")),
    "Cantarell": ("fonts-cantarell", "SIL OFL", ("opentype/cantarell/*.otf",)),
    "EB Garamond": ("fonts-ebgaramond", "SIL OFL", ("opentype/ebgaramond/EBGaramond12-*.otf",)),
    "Inconsolata": ("fonts-inconsolata", "SIL OFL", ("truetype/inconsolata/*.ttf", "opentype/inconsolata/*.otf")),
    "Quattrocento": ("fonts-quattrocento", "SIL OFL", ("opentype/quattrocento/*.otf", "truetype/quattrocento/*.ttf")),
}
# Font families from PyPI wheels (the fontpkg-* packages: Google Fonts, SIL OFL unless said), used
# when installed: `pip install fontpkg-fira-sans ...` (training/README.md lists the command).
PYPI_FAMILIES = ("fira-sans", "fira-code", "ibm-plex-sans", "ibm-plex-serif", "ibm-plex-mono", "source-sans-3",
                 "source-serif-4", "source-code-pro", "pt-sans", "pt-serif", "merriweather", "crimson-text",
                 "libre-baskerville", "inter", "roboto-mono", "jetbrains-mono", "literata", "spectral", "vollkorn",
                 "lora", "work-sans", "montserrat")
# Held out of training: single faces of trained families (as before), and whole families.
HELDOUT = ("DejaVuSansMono-BoldOblique", "STIXGeneralBolIta", "Times-BoldItalic", "Courier-BoldOblique")
HELDOUT_FAMILIES = ("TeX Gyre Bonum", "Charis SIL", "EB Garamond", "Go", "Cantarell", "spectral", "vollkorn", "work-sans",
                    "jetbrains-mono")


def _system_faces() -> list[Face]:
    faces = []
    for family, (_, _, patterns) in SYSTEM_FAMILIES.items():
        files = sorted({f for p in patterns for root in FONT_ROOTS for f in glob.glob(os.path.join(root, p))})
        faces += [Face(os.path.splitext(os.path.basename(f))[0], "ttf", f, family) for f in files]
    return faces


def _pypi_faces() -> list[Face]:
    """The installed fontpkg-* families: static files as they are, a variable file (`[wght]` in
    its name) at a regular and a bold weight."""
    import importlib.util

    faces = []
    for family in PYPI_FAMILIES:
        spec = importlib.util.find_spec("fontpkg_" + family.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = os.path.join(list(spec.submodule_search_locations)[0], "files")
        for f in sorted(glob.glob(os.path.join(folder, "*.[ot]tf"))):
            name = os.path.splitext(os.path.basename(f))[0]
            weights = (400, 700) if "wght" in name else (0,)
            faces += [Face(name + (f"@{w}" if w else ""), "ttf", f, family, w) for w in weights]
    return faces


@lru_cache(maxsize=None)
def all_faces() -> tuple[Face, ...]:
    d = _mpl_dir()
    faces = [Face(n, "ttf", os.path.join(d, n + ".ttf"), "STIX General" if n.startswith("STIX") else n.split("-")[0])
             for n in MPL_FACES]
    faces.append(Face("Aileron", "pil-default", family="Aileron"))
    faces += [Face(n, "pdf", n, n.split("-")[0]) for n in PDF_FACES]
    return tuple(faces + _system_faces() + _pypi_faces())


def is_heldout(face: Face) -> bool:
    return face.name in HELDOUT or face.family in HELDOUT_FAMILIES


def faces(split: str) -> tuple[Face, ...]:
    held = split == "heldout"
    return tuple(f for f in all_faces() if is_heldout(f) == held)


@lru_cache(maxsize=None)
def families(split: str) -> tuple[tuple[Face, ...], ...]:
    """The faces of `split` grouped by family, in a fixed order."""
    groups: dict[str, list[Face]] = {}
    for f in faces(split):
        groups.setdefault(f.family, []).append(f)
    return tuple(tuple(g) for _, g in sorted(groups.items()))


@lru_cache(maxsize=None)
def missing_chars(face: Face) -> frozenset[str]:
    """Characters the face cannot draw: its missing-glyph box, or outside WinAnsi for PDF faces."""
    if face.kind == "pdf":
        return frozenset(CHARS) - frozenset(CP1252)
    font = face.pil(32)

    def shape(c: str) -> bytes:
        mask = font.getmask(c)
        return bytes(mask) + bytes(str(mask.size), "ascii")

    tofu = shape("\ue000")
    return frozenset(c for c in CHARS if c != " " and shape(c) == tofu)
