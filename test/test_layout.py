"""The package's structure, checked from its source: no import circle, no arrow from a lower layer
to a higher one (the order is :data:`spkflow.LAYERS`), no private name taken from another module,
no library module importing a tooling package (:data:`spkflow.TOOLING`), no module over 700 lines
(no command of ``spkflow.bin`` over 160: argument parsing and one call), a docstring on every
subpackage saying what it holds, and test/helpers' list of its modules complete.

Imports are read with :mod:`ast`, every one of them: at module level, inside functions and under
``TYPE_CHECKING``, so a circle cannot hide behind a lazy import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spkflow

PKG = Path(spkflow.__file__).resolve().parent
MAX_LINES = 700
MAX_BIN_LINES = 160  # a command parses its arguments and makes one call; its policy lives in the layers


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of spkflow code in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "spkflow"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "spkflow":
                continue
            for a in node.names:  # `from spkflow.core import procs` imports the module spkflow.core.procs
                sub = f"{mod}.{a.name}"
                if sub in MODULES:
                    out.append((sub, [], node.lineno))
                else:
                    out.append((mod, [a.name], node.lineno))
    return out


def _closest_module(mod: str) -> str:
    while mod not in MODULES and "." in mod:
        mod = mod.rpartition(".")[0]
    return mod


EDGES = {
    name: [(_closest_module(mod), names, line) for mod, names, line in _imports(name, path)]
    for name, path in MODULES.items()
}


def _layer(module: str) -> int:
    """Index of ``module`` in :data:`spkflow.LAYERS` (``spkflow.bin.x`` -> "bin"; the package's own
    ``__init__`` is above every layer: it is the facade)."""
    if module == "spkflow":
        return len(spkflow.LAYERS)
    first = module.split(".")[1]
    assert first in spkflow.LAYERS, f"{module}: its package {first!r} is not in spkflow.LAYERS"
    return spkflow.LAYERS.index(first)


def test_every_module_belongs_to_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_circle():
    # Tarjan's strongly connected components over the module graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _, _ in EDGES[v]:
            if w == v or w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def _layer_name(module: str) -> str:
    return "facade" if module == "spkflow" else spkflow.LAYERS[_layer(module)]


def test_no_arrow_points_up():
    bad = [
        f"{MODULES[src].relative_to(PKG.parent)}:{line}: {src} ({_layer_name(src)}) imports {dst} ({_layer_name(dst)})"
        for src, edges in EDGES.items()
        for dst, _, line in edges
        if dst in MODULES and _layer(dst) > _layer(src)
    ]
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_only_the_commands_import_tooling():
    """A tooling package (:data:`spkflow.TOOLING`: test data such as simulated conversations) is
    imported by ``spkflow.bin`` only: no library layer depends on how its test data is made."""
    tooling = {spkflow.LAYERS.index(t) for t in spkflow.TOOLING}
    bad = [
        f"{MODULES[src].relative_to(PKG.parent)}:{line}: {src} imports {dst} (tooling)"
        for src, edges in EDGES.items()
        for dst, _, line in edges
        if dst in MODULES and _layer(dst) in tooling and _layer(src) != _layer(dst) and _layer_name(src) != "bin"
    ]
    assert not bad, "library modules importing tooling:\n" + "\n".join(bad)


def test_no_private_name_crosses_modules():
    bad = [
        f"{MODULES[src].relative_to(PKG.parent)}:{line}: takes {n} from {dst}"
        for src, edges in EDGES.items()
        for dst, names, line in edges
        for n in names
        if n.startswith("_") and not n.startswith("__") and dst != src
    ]
    assert not bad, "private names used across modules (make them public):\n" + "\n".join(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name):
    n = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{MODULES[name]}: {n} lines (at most {MAX_LINES}: split it by concern)"
    if name.startswith("spkflow.bin."):
        assert n <= MAX_BIN_LINES, f"{MODULES[name]}: {n} lines (a command: at most {MAX_BIN_LINES}; move policy out)"


def test_subpackages_say_what_they_hold():
    packages = [p.parent for p in PKG.glob("*/__init__.py")]
    assert len(packages) >= 6
    for p in packages:
        doc = ast.get_docstring(ast.parse((p / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 10, f"{p}/__init__.py: no docstring saying what the package holds"
        if p.name in spkflow.LAYERS and p.name not in ("core", "bin"):
            assert "May import" in doc, f"{p}/__init__.py: the docstring does not say what it may import"


def test_the_graph_is_read():
    """The checks above see real arrows: the trainer's setup imports the models, the embedder run imports the jobs."""
    assert any(d == "spkflow.nnet.models" for d, _, _ in EDGES["spkflow.train.build"])
    assert any(d == "spkflow.data.jobs" for d, _, _ in EDGES["spkflow.embed.run"])


def test_the_test_helpers_are_all_listed():
    """test/helpers/__init__.py's docstring names every helper module (the first word of a line)."""
    helpers = Path(__file__).resolve().parent / "helpers"
    listed = {
        line.split()[0]
        for line in (ast.get_docstring(ast.parse((helpers / "__init__.py").read_text())) or "").splitlines()[2:]
        if line.strip()
    }
    missing = sorted(p.stem for p in helpers.glob("*.py") if p.stem != "__init__" and p.stem not in listed)
    assert not missing, f"{helpers / '__init__.py'} does not list: {', '.join(missing)}"
