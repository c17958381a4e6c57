"""speculators 0.9.0's own ``Eagle3DraftModel``, importable without its data-pipeline extras.

speculators imports openai/datasets/hs_connectors at module level for its data pipeline; its model
uses none of them, so when they are not installed they are replaced by empty modules.  Shared by
the parity test (tests/test_drafter_parity.py) and the peer in benchmarks/drafter_eval.py.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

UNUSED_BY_THE_MODEL = ("openai", "datasets", "hs_connectors")


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules (any attribute is a dummy class) for speculators' unused heavy imports."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001
        if name.split(".")[0] in UNUSED_BY_THE_MODEL:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: type(attr, (), {})  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:  # noqa: ANN001
        pass


def available() -> bool:
    return importlib.util.find_spec("speculators") is not None and importlib.util.find_spec("transformers") is not None


def import_eagle3() -> tuple[Any, Any]:
    """(Eagle3DraftModel, Eagle3SpeculatorConfig); call only when ``available()``."""
    if any(importlib.util.find_spec(m) is None for m in UNUSED_BY_THE_MODEL) and \
            not any(isinstance(f, _EmptyModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _EmptyModules())
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    return Eagle3DraftModel, Eagle3SpeculatorConfig
