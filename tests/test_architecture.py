"""The package's shape, checked: imports only point down, nothing imports in a circle, and the
seams are contracts rather than probes and patches.

    commands/, cli.py      may import anything (they are the top)
    pipeline/, archive/, bench/, modelfiles/   the library: never click, never commands/ or cli
    engine/                only engine/, errors.py and options.py (and third-party libraries)
    errors.py, options.py  leaves: the options table imports only errors.py
    engine ops/attention   pure array kernels: no cache object, no model, no file format
    pipeline/, bench/      call what the page-engine protocol declares: no hasattr/getattr on engines
    the package            patches no module and no model's internals (tests may)
    engine/                speaks its own words: no command-line flag in its messages

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
    assert "pantheon_ocr.pipeline.pdf" in GRAPH["pantheon_ocr.pipeline.render_pool"]
    assert "click" in GRAPH["pantheon_ocr.cli"]


@pytest.mark.parametrize("name", [n for n in MODULES if _library(n)])
def test_the_library_knows_no_command_line(name):
    bad = {i for i in GRAPH[name] if _uses(i, "click") or _uses(i, "pantheon_ocr.commands") or _uses(i, "pantheon_ocr.cli")}
    assert not bad, f"{name} imports {sorted(bad)}: the library must not know the command line"


LEAVES = ("pantheon_ocr.errors", "pantheon_ocr.options")


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("pantheon_ocr.engine")])
def test_the_engine_imports_only_itself_errors_and_the_options_table(name):
    ours = {i for i in GRAPH[name] if i == "pantheon_ocr" or i.startswith("pantheon_ocr.")}
    bad = {i for i in ours if not (_uses(i, "pantheon_ocr.engine") or i in LEAVES)}
    assert not bad, f"{name} imports {sorted(bad)}: the engine may import only engine/, errors.py and options.py"


@pytest.mark.parametrize("name", LEAVES)
def test_the_leaves_import_nothing_of_the_package_but_errors(name):
    ours = {i for i in GRAPH[name] if i.startswith("pantheon_ocr")}
    assert ours <= {"pantheon_ocr.errors"}, f"{name} imports {sorted(ours)}"


KERNELS = ("pantheon_ocr.engine.ops", "pantheon_ocr.engine.attention")


@pytest.mark.parametrize("name", KERNELS)
def test_kernels_are_pure_array_code(name):
    ours = {i for i in GRAPH[name] if i.startswith("pantheon_ocr")}
    assert ours <= set(KERNELS) | {"pantheon_ocr.options"}, f"{name} imports {sorted(ours)}: kernels take arrays"
    tree = ast.parse(MODULES[name].read_text())
    words = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
    assert not [w for w in words if "cache" in w.lower()], f"{name} reaches into a cache object"


def _calls(tree, names):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names and node.args:
            yield node


PROBED = ("engine", "seq", "inner", "group")  # names that hold engines or their sequences


@pytest.mark.parametrize("name", [n for n in MODULES if _uses(n, "pantheon_ocr.pipeline") or _uses(n, "pantheon_ocr.bench")])
def test_the_pipeline_and_bench_never_probe_an_engine(name):
    tree = ast.parse(MODULES[name].read_text())
    probes = [ast.unparse(c) for c in _calls(tree, ("hasattr", "getattr"))
              if any(word in ast.unparse(c.args[0]).lower() for word in PROBED)]
    assert not probes, f"{name} probes engines ({probes}): declare the member in pipeline/types.py's protocol"


INTERNALS = ("block", "layers", "forward", "flash", "blocked", "attention", "kv_pool", "run")


@pytest.mark.parametrize("name", list(MODULES))
def test_nothing_patches_a_module_or_a_model(name):
    tree = ast.parse(MODULES[name].read_text())
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names}
    bad = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute):
                    root = el.value
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    direct = isinstance(el.value, ast.Name)
                    if isinstance(root, ast.Name) and ((direct and root.id in modules)
                                                       or (el.attr in INTERNALS and not (direct and root.id == "self"))):
                        bad.append(ast.unparse(el))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr",) and node.args \
                and isinstance(node.args[0], ast.Name) and node.args[0].id in modules:
            bad.append(ast.unparse(node))
    assert not bad, f"{name} patches {bad}: make it a constructor option or a hook"


FLAG = __import__("re").compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("pantheon_ocr.engine")])
def test_the_engine_speaks_its_own_words(name):
    tree = ast.parse(MODULES[name].read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    flags = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings and FLAG.search(n.value)]
    assert not flags, f"{name} names command-line flags in {flags}: raise OptionError(setting, ...) instead"


def test_no_import_cycles():
    internal = {name: {i for i in deps if i in MODULES and i != name} for name, deps in GRAPH.items()}
    try:
        tuple(TopologicalSorter(internal).static_order())
    except CycleError as exc:
        # graphlib lists each node before the ones that import it; reversed it reads "imports"
        pytest.fail(f"import cycle: {' imports '.join(reversed(exc.args[1]))}")
