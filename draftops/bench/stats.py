"""Median and spread over benchmark repeats.

Spread is ``(max - min) / median``: one number that says how far the repeats disagree, so a
difference between two runs smaller than their spread reads as noise.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel


class Stat(BaseModel):
    """One metric over R repeats (values keep None for a repeat that did not report it)."""

    median: float | None = None
    min: float | None = None
    max: float | None = None
    spread: float | None = None
    values: list[float | None] = []

    @property
    def n(self) -> int:
        return sum(1 for v in self.values if v is not None)


def summarize(values: Iterable[float | None]) -> Stat:
    """The Stat of ``values``; NaN and inf count as not reported."""
    kept: list[float | None] = [float(v) if v is not None and math.isfinite(v) else None for v in values]
    good = sorted(v for v in kept if v is not None)
    if not good:
        return Stat(values=kept)
    mid = len(good) // 2
    median = good[mid] if len(good) % 2 else (good[mid - 1] + good[mid]) / 2
    spread = (good[-1] - good[0]) / abs(median) if median else None
    return Stat(median=median, min=good[0], max=good[-1], spread=spread, values=kept)
