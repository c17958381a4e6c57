"""What the evaluation's two passes measured: read by the report builder and by the cause checks
(remote/drafter/causes), kept apart from both so neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..scoring.score import LayoutScore
from .layouts import Interpretation, Verdict


@dataclass
class Results:
    """What the two passes measured."""

    samples: int
    tokens: int
    norms: list[float]
    scan: dict[tuple[int, ...], LayoutScore]
    scan_samples: int
    interps: list[Interpretation]
    verdict: Verdict
    basis: str
    full: dict[str, LayoutScore]
    dtype: str
    seconds: float
    skipped: dict[str, str] = field(default_factory=dict)  # dump file -> why it was not scored
    coverage: dict[str, Any] | None = None  # vocabmap.Coverage.to_dict() of the metrics pass
    extra: dict[str, Any] = field(default_factory=dict)  # measurements for the cause checks (causes/facts.py)
    engine_states: dict[str, Any] | None = None  # the report's engine_states (evaluation._on_engine_states)
    total: int | None = None  # samples there were to evaluate (``samples`` of them scored)
    sequential: dict[str, Any] | None = None  # the sequential verdict's record (None: the full pass)
    read: dict[str, int] | None = None  # what the dump loads read: samples and bytes of tensors
