"""One broken case per known cause of low acceptance, and a healthy one, on the drafter lab's small
target (tests/support/drafter_lab.py), each in the three dump formats (speculators' safetensors, SpecForge's,
ModelOpt's): tests/test_cause_cases.py evaluates every case in every format and asserts it gets
exactly its findings, each with a fix, and the same verdict status in all three.

Adding a case (see README.md): write one builder ``def my_cause(base: Healthy, out: Path) -> Variant``
that makes the healthy case wrong in one way (a helper in healthy.py does most of it), then add one
line ``Case("my-cause", ("finding-id",), my_cause)`` to CASES in registry.py.
"""
from __future__ import annotations

from .healthy import FORMATS, Healthy, Variant, healthy
from .registry import CASES, Case, by_name

__all__ = ["CASES", "FORMATS", "Case", "Healthy", "Variant", "by_name", "healthy"]
