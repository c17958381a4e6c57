"""The report's named findings: one module per family of known causes of low acceptance
(../shared/reference/failure-modes.md), each a ``check(facts) -> list[finding]``, collected here in a
fixed order so that a report lists them the same way every run.

A finding is a ``Finding`` record (finding.py: id, severity, text, evidence, fix; docs/drafter.md
§ Findings); report.py turns each into report.json's dict at its edge. A check may still return the
dict form (one written before the record): ``collect`` reads it through ``Finding.of``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .algorithm import check as algorithm_check
from .config_keys import check as config_keys_check
from .engine_version import check as engine_version_check
from .facts import Facts
from .finding import SEVERITIES, Finding
from .head import check as head_check
from .kv import check as kv_check
from .layer_ids import check as layer_ids_check
from .policy import check as policy_check
from .positions import check as positions_check
from .rotation import check as rotation_check
from .sampling import check as sampling_check
from .states import check as states_check
from .training import check as training_check
from .usage import check as usage_check
from .vocab import check as vocab_check
from .vocab_size import check as vocab_size_check

Check = Callable[[Facts], list[Finding]]
#: what ``collect`` accepts from a check: the record, or its dict form (converted, checked once)
Found = Finding | Mapping[str, Any]

#: every cause family, in report order; a new family adds its module's ``check`` (a ``Check``) here
CHECKS: tuple[Callable[[Facts], Sequence[Found]], ...] = (
    vocab_check,
    vocab_size_check,
    algorithm_check,
    layer_ids_check,
    config_keys_check,
    positions_check,
    engine_version_check,
    usage_check,
    training_check,
    states_check,
    policy_check,
    rotation_check,
    head_check,
    kv_check,
    sampling_check,
)
#: causes reported only when no other finding explains the draft (low accuracy is what the others cause too)
RESIDUAL = frozenset({"undertrained"})


def collect(facts: Facts) -> list[Finding]:
    """Every check's findings, bad ones first (stable within a severity); a residual cause only when
    nothing else was found."""
    found = [Finding.of(f) for check in CHECKS for f in check(facts)]
    if any(f.id not in RESIDUAL for f in found):
        found = [f for f in found if f.id not in RESIDUAL]
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


__all__ = ["CHECKS", "SEVERITIES", "Check", "Facts", "Finding", "collect"]
