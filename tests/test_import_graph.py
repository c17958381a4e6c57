"""The project's modules import each other without a circle (issue 8): a circle is where a change
in one module silently needs the other, and where import order starts to matter."""
from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import circles, imports_of, modules, project_graph


def test_the_project_has_no_import_circle() -> None:
    assert circles(project_graph()) == []


def test_the_graph_sees_the_imports_it_must_see() -> None:
    graph = project_graph()
    assert "remote.drafter.report" in graph["remote.drafter.evaluation"]          # from . import report
    assert "remote.drafter.options" in graph["remote.drafter.report"]           # from .options import ...
    assert "draftops.errors" in graph["draftops.inventory"]                      # absolute import


def test_a_circle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "remote" / "loop"
    pkg.mkdir(parents=True)
    (tmp_path / "draftops").mkdir()
    (tmp_path / "remote" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    (pkg / "c.py").write_text("from remote.loop import a\n")
    known = modules(tmp_path)
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert circles(graph) == [["remote.loop.a", "remote.loop.b"]]
