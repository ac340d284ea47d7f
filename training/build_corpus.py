"""Build the reader's text corpus from text this machine already ships, once, into training/corpus/.

    python -m training.build_corpus          # rewrites training/corpus/*.txt.xz

Sources (all redistributable; see training/README.md):
- prose: the Python documentation topics (`pydoc_data.topics`) and the docstrings of the Python
  standard library (PSF License 2.0); the licence texts in /usr/share/common-licenses where present
  (each licence permits verbatim copies).
- code: source lines of the standard library (PSF License 2.0).

The corpus is committed (a few MB of xz), so training data is the same on every machine whatever
its Python version. Documents are split into train and held-out by a hash of their name: held-out
text is never rendered for training.
"""

from __future__ import annotations

import ast
import lzma
import re
import sys
import sysconfig
import zlib
from pathlib import Path

from .charset import clean_text

OUT = Path(__file__).resolve().parent / "corpus"
HELDOUT_BUCKETS = 10  # 1 document in 10 is held out
LICENCES = Path("/usr/share/common-licenses")


def is_heldout(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELDOUT_BUCKETS == 0


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, whitespace collapsed; rst markup lines dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if not re.fullmatch(r"\s*[*=\-~^`#+]{3,}\s*", ln)]
        para = clean_text(" ".join(lines))
        if len(para) >= 20:
            out.append(para)
    return out


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
    return sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))


def docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                out.extend(paragraphs(doc))
    return out


def code_lines(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = clean_text(line)
        if 8 <= len(line) <= 120:
            out.append(line)
    return out


def build() -> dict[str, list[str]]:
    corpus: dict[str, list[str]] = {k: [] for k in ("prose-train", "prose-heldout", "code-train", "code-heldout")}

    def add(kind: str, name: str, items: list[str]) -> None:
        corpus[f"{kind}-{'heldout' if is_heldout(name) else 'train'}"].extend(items)

    import pydoc_data.topics as topics

    for name, text in sorted(topics.topics.items()):
        add("prose", f"topic:{name}", paragraphs(text))
    root = Path(sysconfig.get_paths()["stdlib"])
    for f in stdlib_files():
        rel = str(f.relative_to(root))
        add("prose", f"doc:{rel}", docstrings(f))
        if zlib.crc32(rel.encode()) % 4 == 0:  # a quarter of the modules is plenty of code
            add("code", f"code:{rel}", code_lines(f))
    if LICENCES.is_dir():
        for f in sorted(LICENCES.iterdir()):
            if f.is_file():
                add("prose", f"licence:{f.name}", paragraphs(f.read_text(encoding="utf-8", errors="replace")))
    return corpus


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, items in build().items():
        seen, unique = set(), []
        for item in items:  # docstrings repeat across modules
            if item not in seen:
                seen.add(item)
                unique.append(item)
        data = ("\n".join(unique) + "\n").encode("utf-8")
        (OUT / f"{name}.txt.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        print(f"{name}: {len(unique)} items, {len(data) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
