"""The package's Python modules import each other without a circle, and its sources patch no
CPython type slot.

A circle between modules makes the import order matter (a name used before its module finished
running) and ties their jobs together. What counts is what runs at import: module-level imports,
including those under an ``if`` or ``try``; imports inside functions and under
``if TYPE_CHECKING:`` do not run then and are left out. Compiled modules (``.pyx``) are leaves
here: they cimport through ``.pxd`` files, which run nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

# the source tree (checkout or unpacked sdist)
PACKAGE = Path(__file__).resolve().parents[1] / "vyre_cuda"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_time_nodes(body):
    """The statements that run when the module is imported."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from import_time_nodes(node.body)
            yield from import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            yield from import_time_nodes(node.body)
            for handler in node.handlers:
                yield from import_time_nodes(handler.body)
            yield from import_time_nodes(node.orelse)
            yield from import_time_nodes(node.finalbody)
        else:
            yield node


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths) | {module_name(p) for p in PACKAGE.rglob("*.pyx")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in import_time_nodes(ast.parse(path.read_text()).body):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    # `from pkg import submodule` imports the submodule; `from mod import name` the module
                    target = f"{source}.{alias.name}"
                    deps.add(target if target in known else source)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = (deps & known) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_the_packages_imports():
    graph = import_graph()
    assert len(graph) > 40
    # a few edges the package is known to have: the graph is read, not empty
    assert "vyre_cuda.errors" in graph["vyre_cuda.backend"]
    assert {"vyre_cuda._driver", "vyre_cuda._hostreg"} <= graph["vyre_cuda.backend"]


def test_no_import_circle_in_the_package():
    assert circles(import_graph()) == []


def test_no_type_slot_is_patched():
    offenders = [
        p.name
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in {".py", ".pyx", ".pxd", ".hpp", ".h"}
        and ("tp_vectorcall" in p.read_text() or "PyType_Type" in p.read_text())
    ]
    assert offenders == []


def test_modules_stay_small():
    """No source file of the package passes 600 lines, but for at most two of up to 800 (a module
    that grows past that is doing two jobs)."""
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
        for p in PACKAGE.rglob("*")
        if p.suffix in {".py", ".pyx", ".pxd", ".hpp", ".h", ".cuh"}
    }
    over = sorted((n, name) for name, n in sizes.items() if n > 600)
    assert len(sizes) > 40 and max(sizes.values()) > 300, sizes  # (the tree was read)
    assert all(n <= 800 for n, _ in over) and len(over) <= 2, over
