"""The package's shape, checked: imports only point down, and nothing imports in a circle.

    commands/, cli.py      may import anything (they are the top)
    pipeline/, archive/, bench/   the library: never click, never commands/ or cli
    engine/                only engine/ and errors.py (and third-party libraries)

Every module is parsed with `ast`, function-level imports included, so a lazy import that runs
the wrong way (or closes a circle) fails here as surely as one at the top of a file.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pantheon_ocr"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports, anywhere in its body: absolute names as written, relative
    ones resolved; `from pkg import x` counts as importing pkg.x when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _library(name: str) -> bool:
    return not (name == "pantheon_ocr.cli" or name.startswith("pantheon_ocr.commands"))


def _uses(imported: str, target: str) -> bool:
    return imported == target or imported.startswith(target + ".")


def test_the_walk_sees_the_modules_and_their_lazy_imports():
    assert "pantheon_ocr.engine.models.llama" in MODULES and "pantheon_ocr.pipeline.run" in MODULES
    # a function-level import (the render workers' clean-up) and a relative `from . import x`
    assert "pantheon_ocr.pipeline.render" in GRAPH["pantheon_ocr.pipeline.render_pool"]
    assert "click" in GRAPH["pantheon_ocr.cli"]


@pytest.mark.parametrize("name", [n for n in MODULES if _library(n)])
def test_the_library_knows_no_command_line(name):
    bad = {i for i in GRAPH[name] if _uses(i, "click") or _uses(i, "pantheon_ocr.commands") or _uses(i, "pantheon_ocr.cli")}
    assert not bad, f"{name} imports {sorted(bad)}: the library must not know the command line"


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("pantheon_ocr.engine")])
def test_the_engine_imports_only_itself_and_errors(name):
    ours = {i for i in GRAPH[name] if i == "pantheon_ocr" or i.startswith("pantheon_ocr.")}
    bad = {i for i in ours if not (_uses(i, "pantheon_ocr.engine") or i == "pantheon_ocr.errors")}
    assert not bad, f"{name} imports {sorted(bad)}: the engine may import only engine/ and errors.py"


def test_no_import_cycles():
    internal = {name: {i for i in deps if i in MODULES and i != name} for name, deps in GRAPH.items()}
    try:
        tuple(TopologicalSorter(internal).static_order())
    except CycleError as exc:
        # graphlib lists each node before the ones that import it; reversed it reads "imports"
        pytest.fail(f"import cycle: {' imports '.join(reversed(exc.args[1]))}")
