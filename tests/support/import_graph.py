"""The project's import graph, read from the source (no module is imported): for the no-circle test
and for anything that must know which files a module runs (the demo cache's key)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("draftops", "remote")


def modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    found = {}
    for top in PACKAGES:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, under TYPE_CHECKING too (a circle hidden there is still
    a circle in the design)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in known:
                    deps.add(full)
                elif target in known:
                    deps.add(target)
    deps.discard(name)
    return deps


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    return _Tarjan(graph).components()


class _Tarjan:
    def __init__(self, graph: dict[str, set[str]]) -> None:
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.work: list[tuple[str, Iterator[str]]] = []
        self.found: list[list[str]] = []

    def components(self) -> list[list[str]]:
        for start in sorted(self.graph):
            if start not in self.index:
                self._visit(start)
        return self.found

    def _enter(self, node: str) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)
        self.work.append((node, iter(sorted(self.graph.get(node, ())))))

    def _visit(self, start: str) -> None:
        self._enter(start)
        while self.work:
            node, children = self.work[-1]
            child = next(children, None)
            if child is None:
                self._leave()
            elif child not in self.index:
                self._enter(child)
            elif child in self.on_stack:
                self.low[node] = min(self.low[node], self.index[child])

    def _leave(self) -> None:
        node = self.work.pop()[0]
        if self.work:
            parent = self.work[-1][0]
            self.low[parent] = min(self.low[parent], self.low[node])
        if self.low[node] != self.index[node]:
            return
        component = []
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            component.append(member)
            if member == node:
                break
        if len(component) > 1:
            self.found.append(sorted(component))


def project_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def import_closure(name: str, root: Path = REPO) -> dict[str, Path]:
    """``name`` and every project module it imports, directly or through others: {name: file}."""
    known = modules(root)
    found: dict[str, Path] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current not in found:
            found[current] = known[current]
            todo.extend(imports_of(current, known[current], known))
    return found
