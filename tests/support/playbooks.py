"""The task names a playbook may use (the real Invoke collection's)."""
from __future__ import annotations

from tests.conftest import REPO


def _tasks_config() -> dict:
    import importlib.util
    spec = importlib.util.spec_from_file_location("draftops_tasks_for_test", REPO / "tasks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.ns.configuration()["draftops"])


def task_names() -> set[str]:
    """The tasks of the repo's real tasks.py collection (what `invoke --list` shows)."""
    return set(_tasks_config()["task_names"])
