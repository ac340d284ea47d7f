"""The characters the reader is trained on: the printable part of Windows-1252 (WinAnsiEncoding),
then the rest of Latin-1 and Latin Extended-A (U+0100-U+017F).

Windows-1252 is what a PDF's standard-14 fonts can show and covers English and the Western European
languages; Latin Extended-A adds the Central European letters (Polish, Czech, Hungarian, Turkish...).
The CTC head (training only) has one class per character plus the blank; the newer characters come
after the first 216 so a checkpoint made with the smaller set keeps its class numbers.
"""

from __future__ import annotations

import re
import unicodedata

CP1252: tuple[str, ...] = tuple(
    sorted({bytes([b]).decode("cp1252") for b in range(0x20, 0x100)
            if b not in (0x7F, 0x81, 0x8D, 0x8F, 0x90, 0x9D, 0xA0, 0xAD)})
)
EXTENDED: tuple[str, ...] = tuple(sorted(
    {chr(c) for c in range(0x100, 0x180)} - set(CP1252)
))
CHARS: tuple[str, ...] = CP1252 + EXTENDED
CHARSET = frozenset(CHARS)
CTC_BLANK = 0  # class 0; character i is class i + 1
CTC_INDEX = {c: i + 1 for i, c in enumerate(CHARS)}

# Unicode look-alikes that appear in the sources, mapped onto the charset.
_MAP = str.maketrans({
    "\t": " ", "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2212": "-", "\u00ad": "",
    "\u2032": "'", "\u2033": '"', "\u2192": "->", "\u2190": "<-", "\u2264": "<=", "\u2265": ">=",
    "\u2260": "!=", "\u2500": "-", "\u2502": "|", "\u2022": "\u2022",
})


def clean_text(text: str) -> str:
    """NFC, look-alikes mapped, characters outside the charset dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text).translate(_MAP)
    text = "".join(c if c in CHARSET else " " if c.isspace() else "" for c in text)
    return re.sub(r" +", " ", text).strip()


def ctc_targets(text: str) -> list[int]:
    return [CTC_INDEX[c] for c in text if c in CTC_INDEX]
