"""No import cycle anywhere in src/: the graph of every import statement (module level,
inside functions and under ``TYPE_CHECKING`` alike) between the package's modules has
no strongly connected component of more than one module."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "pipeoffload"


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_of(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module ``name`` names (itself, or the closest enclosing package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            # ``from pkg import sub`` imports the submodule when there is one
            names = [f"{root}.{a.name}" if f"{root}.{a.name}" in MODULES else root for a in node.names]
        else:
            continue
        for n in names:
            target = _resolve(n) if n.startswith("pipeoffload") else None
            if target and target != module:
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_reads_relative_and_submodule_imports():
    assert "pipeoffload.runtime.p2p" in imports("pipeoffload.runtime.executor")
    assert "pipeoffload.runtime.boundary" in imports("pipeoffload.runtime.executor")  # from . import boundary
    assert "pipeoffload.ir" in imports("pipeoffload.runtime.executor")


def test_no_import_cycle_in_src():
    graph = {m: imports(m) for m in MODULES}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " -> ".join(c) + "  (" + "; ".join(f"{a} imports {sorted(graph[a] & set(c))}" for a in c) + ")"
        for c in found)
