"""The real Invoke collection, as tasks.py builds it."""
from __future__ import annotations

from tests.conftest import REPO


def collection():
    import importlib.util
    spec = importlib.util.spec_from_file_location("draftops_tasks_for_help_test", REPO / "tasks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ns
