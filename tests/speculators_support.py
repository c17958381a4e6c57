"""Import speculators 0.9.0's own Eagle3DraftModel for tests (parity, and drafts trained with its loss).

speculators imports openai/datasets/hs_connectors at module level for its data pipeline; none of
that is used by the model, so those three are stubbed (only when they are not installed).  In CI
(``CI`` set) a missing speculators is a failure, not a skip: these tests are the check that the
evaluator computes what training computed.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
from typing import Any

import pytest

_STUBBED = ("openai", "datasets", "hs_connectors")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules (any attribute is a dummy class) for speculators' unused heavy imports."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: type(attr, (), {})
        return module

    def exec_module(self, module) -> None:
        pass


def load_speculators() -> tuple[Any, Any]:
    """(Eagle3DraftModel, Eagle3SpeculatorConfig) of speculators 0.9.0, or skip (fail in CI)."""
    if importlib.util.find_spec("speculators") is None or importlib.util.find_spec("transformers") is None:
        if os.environ.get("CI"):
            pytest.fail("speculators==0.9.0 and transformers are not installed (see docs/drafter.md)")
        pytest.skip("speculators==0.9.0 not installed")
    if any(importlib.util.find_spec(m) is None for m in _STUBBED) and not any(
            isinstance(f, _Stubs) for f in sys.meta_path):
        sys.meta_path.insert(0, _Stubs())
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    assert importlib.metadata.version("speculators") == "0.9.0"
    return Eagle3DraftModel, Eagle3SpeculatorConfig
