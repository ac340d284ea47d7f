"""Real text in seven languages besides English, from Debian's translated manual pages, once, into
training/corpus/lang-<code>-{train,heldout}.txt.xz.

    apt-get install manpages-de manpages-fr manpages-es manpages-it manpages-nl manpages-pt-br \
        manpages-pl manpages-cs groff
    python -m training.build_manpages          # rewrites training/corpus/lang-*.txt.xz

Each page is typeset by groff (`-mandoc -Tutf8`, lines 300 characters wide so a paragraph stays
one line), then split into paragraphs; headers, footers and option tags are dropped. Licences: the
translations are the manpages-l10n project's (GPL-3+), over man pages under their own free
licences (GPL, BSD-style, the Linux man-pages licence), all of which allow verbatim copies; the
corpus keeps short paragraphs of them for training only. A page is held out by a hash of its
name, like the English corpus (training/build_corpus.py).
"""

from __future__ import annotations

import gzip
import lzma
import re
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .build_corpus import OUT, is_heldout
from .charset import clean_text

MAN = Path("/usr/share/man")
LANGS = {"de": "de", "fr": "fr", "es": "es", "it": "it", "nl": "nl", "pt": "pt_BR", "pl": "pl", "cs": "cs"}
MAX_BYTES = 900_000  # per language and split before compression: about 250 kB of xz


def typeset(page: Path) -> str:
    src = gzip.decompress(page.read_bytes()) if page.suffix == ".gz" else page.read_bytes()
    pre = subprocess.run(["preconv", "-e", "utf-8"], input=src, capture_output=True, timeout=30).stdout
    out = subprocess.run(["groff", "-mandoc", "-Tutf8", "-P-cbu", "-rLL=300n", "-rHY=0"], input=pre,
                         capture_output=True, timeout=60).stdout
    return out.decode("utf-8", errors="replace")


def paragraphs(text: str) -> list[str]:
    lines = text.splitlines()[1:-1]  # the running header and footer
    out = []
    for block in re.split(r"\n\s*\n", "\n".join(lines)):
        para = clean_text(" ".join(ln.strip() for ln in block.splitlines()))
        words = para.split(" ")
        # prose, not option tags or synopses: enough words, mostly letters
        if len(words) >= 6 and sum(w.isalpha() for w in words) >= 0.6 * len(words):
            out.append(para)
    return out


def build(lang: str, folder: str) -> dict[str, list[str]]:
    pages = sorted(p for p in (MAN / folder).rglob("*") if p.is_file() and not p.is_symlink())
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda p: (p, typeset(p)), pages))
    split: dict[str, list[str]] = {"train": [], "heldout": []}
    seen: set[str] = set()
    for page, text in texts:
        key = "heldout" if is_heldout(f"man:{lang}:{page.name}") else "train"
        for para in paragraphs(text):
            if para not in seen:
                seen.add(para)
                split[key].append(para)
    return split


def main() -> int:
    for lang, folder in LANGS.items():
        if not (MAN / folder).is_dir():
            print(f"{lang}: {MAN / folder} missing (apt-get install manpages-{folder.lower().replace('_', '-')})")
            continue
        for split, items in build(lang, folder).items():
            data, n = b"", 0
            items.sort(key=lambda t: zlib.crc32(t.encode()))  # a fair sample of every page, the same on every machine
            for item in items:  # whole paragraphs, up to the cap, spread over all pages
                if len(data) > MAX_BYTES * (1 if split == "train" else 0.2):
                    break
                data += item.encode() + b"\n"
                n += 1
            (OUT / f"lang-{lang}-{split}.txt.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
            print(f"{lang} {split}: {n} of {len(items)} paragraphs, {len(data) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
