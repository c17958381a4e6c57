"""The report's named findings: one module per family of known causes of low acceptance
(../shared/reference/failure-modes.md), each a ``check(facts) -> list[finding]``, collected here in a
fixed order so that a report lists them the same way every run.

A finding is a dict ``{"id", "severity", "text", "evidence", "fix"}`` (docs/drafter.md § Findings):
``id`` is stable (tests, serve's refusals and nightly comparisons key on it), ``severity`` is
``bad`` (serving is pointless: ``invoke serve`` refuses unless forced) or ``warn``, ``text`` says
what is wrong in this draft in one sentence, ``evidence`` holds the numbers, ``fix`` a command or
what to change in training.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .algorithm import check as algorithm_check
from .config_keys import check as config_keys_check
from .facts import Facts
from .layer_ids import check as layer_ids_check
from .sampling import check as sampling_check
from .states import check as states_check
from .training import check as training_check
from .usage import check as usage_check
from .vocab import check as vocab_check

Finding = dict[str, Any]
Check = Callable[[Facts], list[Finding]]

#: every cause family, in report order; a new family adds its module's ``check`` here
CHECKS: tuple[Check, ...] = (
    vocab_check,
    algorithm_check,
    layer_ids_check,
    config_keys_check,
    usage_check,
    training_check,
    states_check,
    sampling_check,
)
SEVERITIES = ("bad", "warn")
#: causes reported only when no other finding explains the draft (low accuracy is what the others cause too)
RESIDUAL = frozenset({"undertrained"})


def collect(facts: Facts) -> list[Finding]:
    """Every check's findings, bad ones first (stable within a severity); a residual cause only when
    nothing else was found."""
    found = [f for check in CHECKS for f in check(facts)]
    if any(f["id"] not in RESIDUAL for f in found):
        found = [f for f in found if f["id"] not in RESIDUAL]
    for f in found:
        assert f["severity"] in SEVERITIES and f["id"] and f["text"] and f["fix"], f
    return sorted(found, key=lambda f: SEVERITIES.index(f["severity"]))


__all__ = ["CHECKS", "Facts", "Finding", "collect"]
