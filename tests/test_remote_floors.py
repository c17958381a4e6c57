"""remote/'s folders import one another one way only, and so do remote/drafter's sub-packages
(issue 37): the module graph can be free of circles while two folders still lean on each other (the
demo build wrote its bench prompts through remote.bench, which imported the drafter), and then
neither can be read or changed without the other."""
from __future__ import annotations

from collections.abc import Callable

from tests.support.import_graph import circles, project_graph

SUBPACKAGES = {"store", "model", "load", "data", "scoring", "verdict", "launch", "demo", "causes"}


def folder(name: str) -> str | None:
    """remote.<folder> for a module of remote/ (a top-level module is its own folder)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "remote" and len(parts) > 1 else None


def drafter_floor(name: str) -> str | None:
    """remote.drafter.<sub-package> for a module in one, the module itself for those at the top."""
    parts = name.split(".")
    if parts[:2] != ["remote", "drafter"]:
        return None
    return ".".join(parts[:3])


def collapsed(key: Callable[[str], str | None]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, imported in project_graph().items():
        here = key(name)
        if here is None:
            continue
        graph.setdefault(here, set()).update(k for k in map(key, imported) if k is not None and k != here)
    return graph


def test_remote_folders_import_each_other_one_way() -> None:
    assert circles(collapsed(folder)) == []


def test_the_drafters_sub_packages_are_floors() -> None:
    graph = collapsed(drafter_floor)
    assert {f"remote.drafter.{sub}" for sub in SUBPACKAGES} <= set(graph)
    assert circles(graph) == []
    assert "remote.bench" not in {folder(m) for m in project_graph()["remote.drafter.demo.build"]}


def test_a_two_way_lean_between_folders_is_found() -> None:
    graph = {"remote.a.x": {"remote.b.y"}, "remote.b.y": set(), "remote.b.z": {"remote.a.w"}, "remote.a.w": set()}
    folded: dict[str, set[str]] = {}
    for name, imported in graph.items():
        folded.setdefault(folder(name) or name, set()).update(folder(m) or m for m in imported)
    assert circles({k: v - {k} for k, v in folded.items()}) == [["remote.a", "remote.b"]]
